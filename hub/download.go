package hub

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// fileMeta is what the hub says of one file at a commit (a HEAD of its
// resolve URL), or what the cache holds of it.
type fileMeta struct {
	Name string
	ETag string // the blob's name: sha256 of an LFS file, else its git blob id
	Size int64
	URL  string // where to GET it: the CDN location of an LFS file
}

// safeETag is an ETag usable as a blob's file name.
var safeETag = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$`)

// normalizeETag strips an ETag's quotes and weak marker, as huggingface_hub
// does.
func normalizeETag(s string) string {
	return strings.Trim(strings.TrimPrefix(s, "W/"), `"`)
}

// head asks the hub for a file's blob name, size and download location
// (HEAD /ID/resolve/COMMIT/FILE). It follows redirects within the hub
// (renamed repositories) and stops at one to another host (the CDN), whose
// location it keeps: the hub's headers describe the file, the CDN's do not.
func (c *Client) head(ctx context.Context, ref Ref, commit, name string) (*fileMeta, error) {
	u := c.Endpoint + "/" + ref.Repo + "/resolve/" + commit + "/" + escapePath(name)
	hc := *c.http()
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	var m *fileMeta
	err := c.retry(ctx, nil, func() error {
		at := u
		for hops := 0; ; hops++ {
			req, err := c.request(ctx, http.MethodHead, at)
			if err != nil {
				return err
			}
			resp, err := hc.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			redirect := resp.StatusCode >= 300 && resp.StatusCode < 400
			if resp.StatusCode >= 400 || redirect && resp.Header.Get("Location") == "" {
				return httpError(resp)
			}
			var loc *url.URL
			if redirect {
				raw, err := url.Parse(resp.Header.Get("Location"))
				if err != nil {
					return fmt.Errorf("%s: bad redirect: %w", at, err)
				}
				loc = resp.Request.URL.ResolveReference(raw)
				if raw.Host == "" { // within the hub: a renamed repository
					if hops == 5 {
						return fmt.Errorf("%s: too many redirects", u)
					}
					at = loc.String()
					continue
				}
			}
			if got := resp.Header.Get("X-Repo-Commit"); got != commit {
				return fmt.Errorf("%s: the answer is of commit %q, not %s: is %s a Hugging Face hub?", at, got, commit, c.Endpoint)
			}
			m = &fileMeta{Name: name, ETag: normalizeETag(resp.Header.Get("X-Linked-Etag")), URL: at}
			if m.ETag == "" {
				m.ETag = normalizeETag(resp.Header.Get("ETag"))
			}
			size := resp.Header.Get("X-Linked-Size")
			if size == "" && !redirect {
				size = resp.Header.Get("Content-Length")
			}
			if m.Size, err = strconv.ParseInt(size, 10, 64); err != nil || m.Size < 0 {
				return fmt.Errorf("%s: the hub gave no size for %s", at, name)
			}
			if !safeETag.MatchString(m.ETag) || strings.HasSuffix(m.ETag, ".incomplete") {
				return fmt.Errorf("%s: the hub gave %s an ETag kiln cannot store (%q)", at, name, m.ETag)
			}
			if loc != nil {
				m.URL = loc.String()
			}
			return nil
		}
	})
	if err != nil {
		return nil, c.explain(ref, name, err)
	}
	return m, nil
}

// escapePath escapes each segment of a repository path for a URL.
func escapePath(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return strings.Join(parts, "/")
}

// validName reports whether a repository file name can be a path inside a
// snapshot: relative, clean, nothing that climbs out.
func validName(name string) bool {
	return name != "" && !strings.HasPrefix(name, "/") && !strings.ContainsAny(name, "\\\x00") &&
		path.Clean(name) == name && name != "." && !strings.HasPrefix(name, "../") && name != ".."
}

// DigestError is a file whose bytes do not hash to the digest the hub gave.
type DigestError struct {
	File      string
	Want, Got string
}

func (e *DigestError) Error() string {
	return fmt.Sprintf("%s: the downloaded bytes hash to %s, the hub says %s", e.File, e.Got, e.Want)
}

// newDigest returns the hash an ETag is of: sha256 for LFS files (64 hex
// digits), the git blob id (sha1 of "blob SIZE\0" and the bytes) for the
// rest; nil for an ETag of neither form, which only the size can check.
func newDigest(etag string, size int64) hash.Hash {
	switch {
	case len(etag) == 64 && isHex(etag):
		return sha256.New()
	case len(etag) == 40 && isHex(etag):
		h := sha1.New()
		fmt.Fprintf(h, "blob %d\x00", size)
		return h
	}
	return nil
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}

// stallTimeout ends a download that received nothing for this long, so
// that it is retried instead of hanging.
const stallTimeout = time.Minute

var errStalled = errors.New("no data for a minute")

// download brings the file into inc, resuming from the bytes already
// there, and checks its digest. On a digest mismatch inc is emptied, so
// that the next try starts over.
func (c *Client) download(ctx context.Context, m *fileMeta, inc string, emit func(State, int64)) error {
	f, err := os.OpenFile(inc, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	off, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	restart := func() error {
		off = 0
		return f.Truncate(0)
	}
	if off > m.Size {
		if err := restart(); err != nil {
			return err
		}
	}
	if off < m.Size {
		if err := c.get(ctx, m, f, &off, restart, emit); err != nil {
			return err
		}
	}
	emit(Verifying, off)
	if h := newDigest(m.ETag, m.Size); h != nil {
		if _, err := io.Copy(h, io.NewSectionReader(f, 0, off)); err != nil {
			return err
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != m.ETag {
			if err := restart(); err != nil {
				return err
			}
			return &DigestError{File: m.Name, Want: m.ETag, Got: got}
		}
	}
	return f.Sync()
}

// get appends the file's bytes from *off to f with a Range request.
func (c *Client) get(ctx context.Context, m *fileMeta, f *os.File, off *int64, restart func() error, emit func(State, int64)) error {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	req, err := c.request(rctx, http.MethodGet, m.URL)
	if err != nil {
		return err
	}
	if *off > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", *off))
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusPartialContent:
		var start int64
		if _, err := fmt.Sscanf(resp.Header.Get("Content-Range"), "bytes %d-", &start); err != nil || start != *off {
			if err := restart(); err != nil {
				return err
			}
			return &transferError{fmt.Errorf("%s: asked for bytes from %d, got %q", m.Name, *off, resp.Header.Get("Content-Range"))}
		}
	case http.StatusOK:
		if err := restart(); err != nil { // the server ignored the Range
			return err
		}
	case http.StatusRequestedRangeNotSatisfiable:
		if err := restart(); err != nil {
			return err
		}
		return &transferError{fmt.Errorf("%s: the server refused to resume at byte %d", m.Name, *off)}
	default:
		return httpError(resp)
	}
	emit(Downloading, *off)
	stall := time.AfterFunc(stallTimeout, func() { cancel(errStalled) })
	defer stall.Stop()
	buf := make([]byte, 1<<20)
	last := time.Now()
	for *off < m.Size {
		n, rerr := resp.Body.Read(buf)
		stall.Reset(stallTimeout)
		if n > 0 {
			n = int(min(int64(n), m.Size-*off))
			if _, err := f.WriteAt(buf[:n], *off); err != nil {
				return err
			}
			*off += int64(n)
			if time.Since(last) >= 100*time.Millisecond || *off == m.Size {
				emit(Downloading, *off)
				last = time.Now()
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if context.Cause(rctx) == errStalled {
				rerr = errStalled
			} else if ctx.Err() != nil {
				return ctx.Err()
			}
			return &transferError{fmt.Errorf("%s: %w after %d of %d bytes", m.Name, rerr, *off, m.Size)}
		}
	}
	if *off < m.Size {
		return &transferError{fmt.Errorf("%s: the connection ended after %d of %d bytes", m.Name, *off, m.Size)}
	}
	return nil
}

// lock takes the blob's lock file (an exclusive flock, as huggingface_hub's
// filelock takes it), calling waiting once if another holder makes it wait.
func lock(ctx context.Context, p string, waiting func()) (unlock func(), err error) {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for waited := false; ; {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() {
				syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
				f.Close()
			}, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", p, err)
		}
		if !waited {
			waiting()
			waited = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// linkBlob makes a snapshot's entry for name a relative link to blob,
// replacing whatever was there in one rename.
func linkBlob(snap, name, blob string) error {
	ptr := filepath.Join(snap, filepath.FromSlash(name))
	if err := os.MkdirAll(filepath.Dir(ptr), 0o755); err != nil {
		return err
	}
	rel, err := filepath.Rel(filepath.Dir(ptr), blob)
	if err != nil {
		return err
	}
	if cur, err := os.Readlink(ptr); err == nil && cur == rel {
		return nil
	}
	tmp := ptr + "." + randomSuffix() + ".tmp"
	if err := os.Symlink(rel, tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, ptr); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// writeRef records that rev resolves to commit (refs/REV), atomically.
func writeRef(repoDir, rev, commit string) error {
	if rev == commit {
		return nil
	}
	p := filepath.Join(repoDir, "refs", filepath.FromSlash(rev))
	if b, err := os.ReadFile(p); err == nil && string(b) == commit {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp := p + "." + randomSuffix() + ".tmp"
	if err := os.WriteFile(tmp, []byte(commit), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

func randomSuffix() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}
