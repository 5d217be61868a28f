// Package hubtest is a Hugging Face hub on a local port, for tests and for
// trying `kiln pull` without the internet: it speaks the endpoints
// huggingface_hub and kiln use (/api/models/ID/revision/REV,
// /ID/resolve/REV/FILE with ETag, X-Repo-Commit, X-Linked-Etag and
// X-Linked-Size; LFS files redirected to a second server, the CDN, which
// honours Range), answers 401, 404 and 429 as the hub does, and can cut a
// download short or corrupt a byte of it on request.
package hubtest

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
)

// File is one file of a repository.
type File struct {
	Name string // path in the repository, "/"-separated
	Data []byte
	// LFS files are stored by sha256 and served through a redirect to the
	// CDN, as the hub serves weights; the rest are served by the hub itself
	// under their git blob id.
	LFS bool
}

// Repo is a model repository at one commit.
type Repo struct {
	ID    string // "Org/Name"
	Files []File
	// Gated repositories answer file requests without the hub's token with
	// 401 GatedRepo.
	Gated bool
}

// Commit is the repository's commit id: a digest of its files.
func (r *Repo) Commit() string {
	h := sha1.New()
	h.Write([]byte(r.ID))
	for _, f := range r.Files {
		fmt.Fprintf(h, "\x00%s\x00%s", f.Name, GitBlobID(f.Data))
	}
	return hex.EncodeToString(h.Sum(nil))
}

// GitBlobID is the git object id of data: the ETag the hub gives files not
// stored with LFS.
func GitBlobID(data []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(data))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

// SHA256 is the hex sha256 of data: the ETag of an LFS file.
func SHA256(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// Request is a request either server received.
type Request struct {
	Server string // "hub" or "cdn"
	Method string
	Path   string
	Range  string
	Auth   string // the Authorization header
}

// Hub is the test hub: Server answers the API and the resolve URLs, CDN
// serves LFS files.
type Hub struct {
	Server *httptest.Server
	CDN    *httptest.Server
	// Token is what gated repositories want as "Authorization: Bearer ...".
	Token string
	// Rate, when set, limits each download to that many bytes a second.
	Rate int64

	mu       sync.Mutex
	repos    map[string]*Repo
	renamed  map[string]string
	blobs    map[string][]byte // sha256 -> data, for the CDN
	cuts     map[string][]int64
	corrupt  map[string][]int64
	holds    map[string]*hold
	limited  int
	requests []Request
}

// hold is a download paused after its first bytes.
type hold struct {
	started, release chan struct{}
	once             sync.Once
}

func (h *hold) free() { h.once.Do(func() { close(h.release) }) }

// New starts a hub serving repos on local ports.
func New(repos ...*Repo) *Hub { return NewOn(nil, nil, repos...) }

// NewOn starts a hub serving repos on the given listeners (nil: a local
// port).
func NewOn(hub, cdn net.Listener, repos ...*Repo) *Hub {
	h := &Hub{Token: "hf_testtoken", repos: map[string]*Repo{}, renamed: map[string]string{}, blobs: map[string][]byte{},
		cuts: map[string][]int64{}, corrupt: map[string][]int64{}, holds: map[string]*hold{}}
	for _, r := range repos {
		h.Add(r)
	}
	start := func(l net.Listener, handler http.HandlerFunc) *httptest.Server {
		s := httptest.NewUnstartedServer(handler)
		if l != nil {
			s.Listener.Close()
			s.Listener = l
		}
		s.Start()
		return s
	}
	h.CDN = start(cdn, h.serveCDN)
	h.Server = start(hub, h.serveHub)
	return h
}

// URL is the hub's endpoint, for HF_ENDPOINT.
func (h *Hub) URL() string { return h.Server.URL }

// Close stops both servers.
func (h *Hub) Close() {
	h.mu.Lock()
	for _, hd := range h.holds {
		hd.free()
	}
	h.mu.Unlock()
	h.Server.Close()
	h.CDN.Close()
}

// Add publishes a repository (replacing one of the same id: a new commit).
func (h *Hub) Add(r *Repo) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.repos[r.ID] = r
	for _, f := range r.Files {
		if f.LFS {
			h.blobs[SHA256(f.Data)] = f.Data
		}
	}
}

// Rename makes old redirect to new, as the hub does for renamed repositories.
func (h *Hub) Rename(old, new string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.renamed[old] = new
}

// Cut makes the next downloads of file (one per entry of after) end
// abruptly after that many bytes of the response body.
func (h *Hub) Cut(file string, after ...int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cuts[file] = append(h.cuts[file], after...)
}

// Corrupt flips one byte, at that offset of the file, in each of the next
// downloads of file that cover it.
func (h *Hub) Corrupt(file string, at ...int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.corrupt[file] = append(h.corrupt[file], at...)
}

// RateLimit answers the next n requests to the hub with 429 and
// Retry-After: 0 (0 ends it).
func (h *Hub) RateLimit(n int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.limited = n
}

// Hold makes the next download of file pause after its first bytes until
// release is called; started is closed once it has paused.
func (h *Hub) Hold(file string) (started <-chan struct{}, release func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	hd := &hold{started: make(chan struct{}), release: make(chan struct{})}
	h.holds[file] = hd
	return hd.started, hd.free
}

// Requests returns the requests both servers received, in order.
func (h *Hub) Requests() []Request {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Request(nil), h.requests...)
}

// Downloads returns the GET requests for file's content, on the hub or
// the CDN.
func (h *Hub) Downloads(file string) []Request {
	var out []Request
	for _, r := range h.Requests() {
		if r.Method == http.MethodGet && (strings.HasSuffix(r.Path, "/"+file) || r.Server == "cdn" && h.cdnName(r.Path) == file) {
			out = append(out, r)
		}
	}
	return out
}

// cdnName is the file name a CDN path serves.
func (h *Hub) cdnName(p string) string {
	sum := path.Base(p)
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, r := range h.repos {
		for _, f := range r.Files {
			if f.LFS && SHA256(f.Data) == sum {
				return f.Name
			}
		}
	}
	return ""
}

func (h *Hub) record(server string, r *http.Request) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.requests = append(h.requests, Request{Server: server, Method: r.Method, Path: r.URL.Path, Range: r.Header.Get("Range"), Auth: r.Header.Get("Authorization")})
	if h.limited > 0 {
		h.limited--
		return true
	}
	return false
}

// hubError answers as the hub does: a status, X-Error-Code and
// X-Error-Message headers and a JSON body.
func hubError(w http.ResponseWriter, status int, code, msg string) {
	if code != "" {
		w.Header().Set("X-Error-Code", code)
	}
	w.Header().Set("X-Error-Message", msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

func (h *Hub) serveHub(w http.ResponseWriter, r *http.Request) {
	if h.record("hub", r) {
		w.Header().Set("Retry-After", "0")
		hubError(w, http.StatusTooManyRequests, "", "You have been rate-limited; you can retry this action in a moment.")
		return
	}
	p := strings.TrimPrefix(r.URL.Path, "/")
	if rest, ok := strings.CutPrefix(p, "api/models/"); ok {
		h.serveInfo(w, r, rest)
		return
	}
	parts := strings.SplitN(p, "/", 5) // org, name, "resolve", rev, file
	if len(parts) == 5 && parts[2] == "resolve" {
		h.serveResolve(w, r, parts[0]+"/"+parts[1], parts[3], parts[4])
		return
	}
	hubError(w, http.StatusNotFound, "", "Not Found")
}

// repo finds a repository at a revision (main or its commit), or answers
// the request: a redirect for a renamed one, 401 RepoNotFound (as the hub
// answers anonymous requests for missing or private repositories), 404
// RevisionNotFound.
func (h *Hub) repo(w http.ResponseWriter, r *http.Request, id, rev string) *Repo {
	h.mu.Lock()
	repo, newID := h.repos[id], h.renamed[id]
	h.mu.Unlock()
	switch {
	case repo == nil && newID != "":
		http.Redirect(w, r, strings.Replace(r.URL.Path, "/"+id+"/", "/"+newID+"/", 1), http.StatusTemporaryRedirect)
	case repo == nil:
		hubError(w, http.StatusUnauthorized, "RepoNotFound", "Repository not found")
	case rev != "main" && rev != repo.Commit():
		hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
	default:
		return repo
	}
	return nil
}

type sibling struct {
	Name   string `json:"rfilename"`
	Size   int64  `json:"size,omitempty"`
	BlobID string `json:"blobId,omitempty"`
	LFS    *struct {
		SHA256      string `json:"sha256"`
		Size        int64  `json:"size"`
		PointerSize int    `json:"pointerSize"`
	} `json:"lfs,omitempty"`
}

func (h *Hub) serveInfo(w http.ResponseWriter, r *http.Request, rest string) {
	id, rev, ok := strings.Cut(rest, "/revision/")
	if !ok {
		id, rev = rest, "main"
	}
	repo := h.repo(w, r, id, rev)
	if repo == nil {
		return
	}
	commit := repo.Commit()
	blobs := r.URL.Query().Get("blobs") == "true" || r.URL.Query().Get("blobs") == "True"
	var sibs []sibling
	for _, f := range repo.Files {
		s := sibling{Name: f.Name}
		if blobs {
			s.Size, s.BlobID = int64(len(f.Data)), GitBlobID(f.Data)
			if f.LFS {
				s.LFS = &struct {
					SHA256      string `json:"sha256"`
					Size        int64  `json:"size"`
					PointerSize int    `json:"pointerSize"`
				}{SHA256(f.Data), int64(len(f.Data)), 134}
			}
		}
		sibs = append(sibs, s)
	}
	gated := any(false)
	if repo.Gated {
		gated = "manual"
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"_id": commit[:24], "id": repo.ID, "modelId": repo.ID, "sha": commit,
		"private": false, "gated": gated, "lastModified": "2026-11-24T00:00:00.000Z", "siblings": sibs})
}

func (h *Hub) serveResolve(w http.ResponseWriter, r *http.Request, id, rev, name string) {
	repo := h.repo(w, r, id, rev)
	if repo == nil {
		return
	}
	commit := repo.Commit()
	w.Header().Set("X-Repo-Commit", commit)
	if repo.Gated && r.Header.Get("Authorization") != "Bearer "+h.Token {
		hubError(w, http.StatusUnauthorized, "GatedRepo", "Access to model "+id+" is restricted. You must have access to it and be authenticated to access it. Please log in.")
		return
	}
	var file *File
	for i := range repo.Files {
		if repo.Files[i].Name == name {
			file = &repo.Files[i]
		}
	}
	if file == nil {
		hubError(w, http.StatusNotFound, "EntryNotFound", name+" does not exist on \""+rev+"\"")
		return
	}
	if file.LFS {
		sum := SHA256(file.Data)
		w.Header().Set("X-Linked-Etag", `"`+sum+`"`)
		w.Header().Set("X-Linked-Size", strconv.Itoa(len(file.Data)))
		w.Header().Set("ETag", `"`+GitBlobID([]byte("version https://git-lfs.github.com/spec/v1\noid sha256:"+sum))+`"`)
		http.Redirect(w, r, h.CDN.URL+"/repos/"+sum[:2]+"/"+sum[2:4]+"/"+sum+"?X-Amz-Signature=test", http.StatusFound)
		return
	}
	w.Header().Set("ETag", `"`+GitBlobID(file.Data)+`"`)
	h.serveContent(w, r, file.Name, file.Data)
}

func (h *Hub) serveCDN(w http.ResponseWriter, r *http.Request) {
	h.record("cdn", r)
	sum := path.Base(r.URL.Path)
	h.mu.Lock()
	data, ok := h.blobs[sum]
	h.mu.Unlock()
	if !ok {
		http.Error(w, "NoSuchKey", http.StatusNotFound)
		return
	}
	w.Header().Set("ETag", `"`+sum+`"`)
	h.serveContent(w, r, h.cdnName(r.URL.Path), data)
}

// serveContent serves data with Range support, applying the faults asked
// for name.
func (h *Hub) serveContent(w http.ResponseWriter, r *http.Request, name string, data []byte) {
	fw := &faultWriter{ResponseWriter: w, cut: -1, corrupt: -1, rate: h.Rate}
	if r.Method == http.MethodGet {
		h.mu.Lock()
		if c := h.cuts[name]; len(c) > 0 {
			fw.cut, h.cuts[name] = c[0], c[1:]
		}
		if c := h.corrupt[name]; len(c) > 0 {
			fw.corrupt, h.corrupt[name] = c[0], c[1:]
		}
		if hd, ok := h.holds[name]; ok {
			fw.hold = hd
			delete(h.holds, name)
		}
		h.mu.Unlock()
	}
	http.ServeContent(fw, r, "", time.Time{}, bytes.NewReader(data))
	if fw.aborted {
		panic(http.ErrAbortHandler) // closes the connection mid-body
	}
}

// faultWriter passes a response body through, flipping the byte at file
// offset corrupt and stopping after cut bytes.
type faultWriter struct {
	http.ResponseWriter
	off, sent    int64 // file offset of the next byte; body bytes sent
	began        bool
	cut, corrupt int64
	aborted      bool
	hold         *hold
	rate         int64
}

func (f *faultWriter) Write(b []byte) (int, error) {
	if !f.began {
		f.began = true
		if cr := f.Header().Get("Content-Range"); cr != "" {
			fmt.Sscanf(cr, "bytes %d-", &f.off)
		}
	}
	if f.aborted {
		return 0, http.ErrAbortHandler
	}
	n := len(b)
	if f.cut >= 0 && f.sent+int64(n) > f.cut {
		b = b[:f.cut-f.sent]
		f.aborted = true
	}
	if f.corrupt >= f.off && f.corrupt < f.off+int64(len(b)) {
		b = append([]byte(nil), b...)
		b[f.corrupt-f.off] ^= 0xff
		f.corrupt = -1
	}
	if _, err := f.ResponseWriter.Write(b); err != nil {
		return 0, err
	}
	f.off += int64(len(b))
	f.sent += int64(len(b))
	if f.rate > 0 {
		time.Sleep(time.Duration(int64(len(b)) * int64(time.Second) / f.rate))
	}
	if f.hold != nil {
		http.NewResponseController(f.ResponseWriter).Flush()
		close(f.hold.started)
		<-f.hold.release
		f.hold = nil
	}
	if f.aborted {
		http.NewResponseController(f.ResponseWriter).Flush()
		return 0, http.ErrAbortHandler
	}
	return n, nil
}
