package hub

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-llm/kiln/internal/hubtest"
)

// randomBytes returns n bytes that no other call returns.
func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

const bigShard = "model-00001-of-00002.safetensors"

// checkpointRepo is a sharded checkpoint with files kiln must leave alone.
func checkpointRepo(id string) *hubtest.Repo {
	return &hubtest.Repo{ID: id, Files: []hubtest.File{
		{Name: "config.json", Data: []byte(`{"architectures":["Qwen3ForCausalLM"]}`)},
		{Name: "generation_config.json", Data: []byte(`{"temperature":0.6}`)},
		{Name: "tokenizer.json", Data: randomBytes(1, 3000)},
		{Name: "tokenizer_config.json", Data: []byte(`{}`)},
		{Name: "model.safetensors.index.json", Data: []byte(`{"weight_map":{"a":"` + bigShard + `","b":"model-00002-of-00002.safetensors"}}`)},
		{Name: bigShard, Data: randomBytes(2, 3<<20+123), LFS: true},
		{Name: "model-00002-of-00002.safetensors", Data: randomBytes(3, 1<<20), LFS: true},
		{Name: "README.md", Data: []byte("# a model\n")},
		{Name: "onnx/model.onnx", Data: randomBytes(4, 5000), LFS: true},
		{Name: "original/consolidated.safetensors", Data: randomBytes(5, 4000), LFS: true},
	}}
}

// ggufRepo is a repository of GGUF files, as quantizers publish them.
func ggufRepo(id string) *hubtest.Repo {
	return &hubtest.Repo{ID: id, Files: []hubtest.File{
		{Name: "README.md", Data: []byte("# GGUF\n")},
		{Name: "Tiny-Q4_K_M.gguf", Data: randomBytes(10, 200_000), LFS: true},
		{Name: "Tiny-Q4_K_S.gguf", Data: randomBytes(11, 190_000), LFS: true},
		{Name: "Tiny-Q8_0.gguf", Data: randomBytes(12, 300_000), LFS: true},
		{Name: "mmproj-Tiny-f16.gguf", Data: randomBytes(13, 1000), LFS: true},
		{Name: "Q6_K/Tiny-Q6_K-00001-of-00002.gguf", Data: randomBytes(14, 1000), LFS: true},
		{Name: "Q6_K/Tiny-Q6_K-00002-of-00002.gguf", Data: randomBytes(15, 1000), LFS: true},
	}}
}

func newClient(t *testing.T, h *hubtest.Hub, cache string) *Client {
	t.Helper()
	return &Client{Endpoint: h.URL(), Cache: Cache{Dir: cache}, Token: h.Token, RetryWait: time.Millisecond}
}

func startHub(t *testing.T, repos ...*hubtest.Repo) *hubtest.Hub {
	h := hubtest.New(repos...)
	t.Cleanup(h.Close)
	return h
}

func fileOf(r *hubtest.Repo, name string) []byte {
	for _, f := range r.Files {
		if f.Name == name {
			return f.Data
		}
	}
	panic(name)
}

// checkSnapshot checks that the snapshot holds exactly want, each a
// relative link to ../../blobs/ETAG whose bytes are the repository's.
func checkSnapshot(t *testing.T, c *Client, r *hubtest.Repo, want ...string) {
	t.Helper()
	dir := c.Cache.RepoDir(r.ID)
	snap := filepath.Join(dir, "snapshots", r.Commit())
	files, err := snapshotFiles(snap)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range files {
		got = append(got, f.Name)
		data := fileOf(r, f.Name)
		etag := hubtest.GitBlobID(data)
		for _, rf := range r.Files {
			if rf.Name == f.Name && rf.LFS {
				etag = hubtest.SHA256(data)
			}
		}
		link, err := os.Readlink(f.Path)
		wantLink := strings.Repeat("../", strings.Count(f.Name, "/")+2) + "blobs/" + etag
		if err != nil || link != wantLink {
			t.Errorf("%s links to %q (%v), want %q", f.Name, link, err, wantLink)
		}
		if b, err := os.ReadFile(f.Path); err != nil || !bytes.Equal(b, data) {
			t.Errorf("%s: the cached bytes differ from the hub's (%v)", f.Name, err)
		}
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("snapshot holds %q, want %q", got, want)
	}
	if ref, err := os.ReadFile(filepath.Join(dir, "refs", "main")); err != nil || string(ref) != r.Commit() {
		t.Errorf("refs/main = %q (%v), want %s", ref, err, r.Commit())
	}
	if inc, _ := filepath.Glob(filepath.Join(dir, "blobs", "*.incomplete")); len(inc) > 0 {
		t.Errorf("left behind: %q", inc)
	}
}

var checkpointFiles = []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
	"model.safetensors.index.json", bigShard, "model-00002-of-00002.safetensors"}

func TestPullLayout(t *testing.T) {
	repo := checkpointRepo("kiln-test/Tiny")
	h := startHub(t, repo)
	c := newClient(t, h, t.TempDir())
	var mu sync.Mutex
	states := map[string][]State{}
	p, err := c.Pull(context.Background(), Ref{Repo: repo.ID}, PullOptions{Progress: func(e Event) {
		mu.Lock()
		defer mu.Unlock()
		if s := states[e.File]; len(s) == 0 || s[len(s)-1] != e.State {
			states[e.File] = append(s, e.State)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(c.Cache.RepoDir(repo.ID), "snapshots", repo.Commit())
	if p.Path != snap || p.Commit != repo.Commit() {
		t.Errorf("pulled to %s at %s, want %s", p.Path, p.Commit, snap)
	}
	checkSnapshot(t, c, repo, checkpointFiles...)
	if want := int64(len(fileOf(repo, bigShard)) + 1<<20 + 3000); p.Fetched < want {
		t.Errorf("fetched %d bytes, want at least %d", p.Fetched, want)
	}
	if s := states[bigShard]; s[0] != Queued || s[len(s)-1] != Downloaded || !slices.Contains(s, Verifying) {
		t.Errorf("%s went through %v", bigShard, s)
	}
	// The token goes to the hub, never to the CDN its redirects name.
	for _, r := range h.Requests() {
		if (r.Server == "cdn") != (r.Auth == "") {
			t.Errorf("%s %s on the %s carried Authorization %q", r.Method, r.Path, r.Server, r.Auth)
		}
	}
	if _, err := os.Stat(filepath.Join(c.Cache.Dir, ".locks", "models--kiln-test--Tiny", hubtest.SHA256(fileOf(repo, bigShard))+".lock")); err != nil {
		t.Errorf("no lock file where huggingface_hub keeps it: %v", err)
	}

	// Again: nothing is fetched, every file is cached.
	n := len(h.Requests())
	p, err = c.Pull(context.Background(), Ref{Repo: repo.ID}, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range h.Requests()[n:] {
		if r.Method != http.MethodGet || !strings.HasPrefix(r.Path, "/api/models/") {
			t.Errorf("a second pull asked for %s %s", r.Method, r.Path)
		}
	}
	for _, f := range p.Files {
		if f.State != Cached {
			t.Errorf("second pull: %s %s", f.File, f.State)
		}
	}
	if path, err := c.Cache.Find(Ref{Repo: repo.ID}); err != nil || path != snap {
		t.Errorf("Find = %s, %v", path, err)
	}
}

func TestPullGGUF(t *testing.T) {
	repo := ggufRepo("kiln-test/Tiny-GGUF")
	h := startHub(t, repo)
	c := newClient(t, h, t.TempDir())
	snap := filepath.Join(c.Cache.RepoDir(repo.ID), "snapshots", repo.Commit())
	for _, tc := range []struct{ quant, file string }{{"", "Tiny-Q4_K_M.gguf"}, {"q8_0", "Tiny-Q8_0.gguf"}} {
		p, err := c.Pull(context.Background(), Ref{Repo: repo.ID, Quant: tc.quant}, PullOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Path != filepath.Join(snap, tc.file) {
			t.Errorf(":%s pulled %s, want %s", tc.quant, p.Path, tc.file)
		}
		if got, err := c.Cache.Find(Ref{Repo: repo.ID, Quant: tc.quant}); err != nil || got != p.Path {
			t.Errorf("Find(:%s) = %s, %v", tc.quant, got, err)
		}
	}
	checkSnapshot(t, c, repo, "Tiny-Q4_K_M.gguf", "Tiny-Q8_0.gguf")
	for quant, want := range map[string]string{
		"Q6_K":   "split into 2 parts",
		"Q4_K":   "no GGUF file for Q4_K; it has Q4_K_M, Q4_K_S, Q6_K, Q8_0",
		"IQ2_XS": "no GGUF file for IQ2_XS",
	} {
		if _, err := c.Pull(context.Background(), Ref{Repo: repo.ID, Quant: quant}, PullOptions{}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf(":%s: %v, want %q", quant, err, want)
		}
	}
	if _, err := c.Pull(context.Background(), Ref{Repo: repo.ID, Quant: "Q4_K_M"}, PullOptions{}); err != nil {
		t.Fatal(err)
	}
	freed, err := c.Cache.Remove(Ref{Repo: repo.ID, Quant: "Q8_0"})
	if err != nil || freed != 300_000 {
		t.Errorf("removing :Q8_0 freed %d, %v", freed, err)
	}
	checkSnapshot(t, c, repo, "Tiny-Q4_K_M.gguf")
	if _, err := c.Cache.Remove(Ref{Repo: repo.ID, Quant: "Q4_K_M"}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{c.Cache.RepoDir(repo.ID), c.Cache.lockDir(repo.ID)} {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there after its last model went: %v", d, err)
		}
	}
}

// TestResume cuts a download short twice: within one pull (the retry asks
// for the rest with a Range) and across pulls (a cancelled pull's
// .incomplete file is resumed by the next).
func TestResume(t *testing.T) {
	repo := checkpointRepo("kiln-test/Tiny")
	big := fileOf(repo, bigShard)
	h := startHub(t, repo)
	c := newClient(t, h, t.TempDir())

	h.Cut(bigShard, 1<<20)
	var retried []error
	var mu sync.Mutex
	p, err := c.Pull(context.Background(), Ref{Repo: repo.ID}, PullOptions{Progress: func(e Event) {
		if e.State == Retrying {
			mu.Lock()
			retried = append(retried, e.Err)
			mu.Unlock()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, c, repo, checkpointFiles...)
	gets := h.Downloads(bigShard)
	if len(retried) != 1 || len(gets) != 2 || gets[0].Range != "" || gets[1].Range != "bytes=1048576-" {
		t.Errorf("retries %v, downloads %+v: want one retry asking for bytes=1048576-", retried, gets)
	}
	if p.Resumed != 0 {
		t.Errorf("a retry within one pull counts as resumed: %d", p.Resumed)
	}

	// A pull cancelled midway (Ctrl-C) leaves the bytes it has.
	c2 := newClient(t, h, t.TempDir())
	started, release := h.Hold(bigShard)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		_, err := c2.Pull(ctx, Ref{Repo: repo.ID}, PullOptions{})
		done <- err
	}()
	<-started
	inc := filepath.Join(c2.Cache.RepoDir(repo.ID), "blobs", hubtest.SHA256(big)+".incomplete")
	waitFor(t, func() bool { fi, err := os.Stat(inc); return err == nil && fi.Size() > 0 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled pull: %v", err)
	}
	release()
	fi, err := os.Stat(inc)
	if err != nil {
		t.Fatal(err)
	}
	kept := fi.Size()
	var keptAll int64 // the other files' downloads were cut short too
	incs, _ := filepath.Glob(filepath.Join(c2.Cache.RepoDir(repo.ID), "blobs", "*.incomplete"))
	for _, f := range incs {
		if fi, err := os.Stat(f); err == nil {
			keptAll += fi.Size()
		}
	}
	if _, err := c2.Cache.Find(Ref{Repo: repo.ID}); !errors.Is(err, ErrNotCached) || !strings.Contains(err.Error(), "incomplete") {
		t.Errorf("Find of an interrupted pull: %v", err)
	}
	n := len(h.Downloads(bigShard))
	p, err = c2.Pull(context.Background(), Ref{Repo: repo.ID}, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, c2, repo, checkpointFiles...)
	gets = h.Downloads(bigShard)[n:]
	if len(gets) != 1 || gets[0].Range != "bytes="+strconv.FormatInt(kept, 10)+"-" || p.Resumed != keptAll {
		t.Errorf("resumed %d of %d kept bytes (%d of %s) with %+v", p.Resumed, keptAll, kept, bigShard, gets)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

// TestCorruption flips a byte three ways: on the wire (caught by the
// digest and fetched again), in a kept .incomplete file (caught after the
// resume, fetched from the start), and in a cached blob (found by
// --verify).
func TestCorruption(t *testing.T) {
	repo := checkpointRepo("kiln-test/Tiny")
	big := fileOf(repo, bigShard)
	h := startHub(t, repo)
	c := newClient(t, h, t.TempDir())

	h.Corrupt(bigShard, 2_000_001)
	h.Corrupt("tokenizer.json", 17)
	var digestErrs []string
	var mu sync.Mutex
	progress := func(e Event) {
		var de *DigestError
		if e.State == Retrying && errors.As(e.Err, &de) {
			mu.Lock()
			digestErrs = append(digestErrs, de.File)
			mu.Unlock()
		}
	}
	if _, err := c.Pull(context.Background(), Ref{Repo: repo.ID}, PullOptions{Progress: progress}); err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, c, repo, checkpointFiles...)
	slices.Sort(digestErrs)
	if !slices.Equal(digestErrs, []string{bigShard, "tokenizer.json"}) {
		t.Errorf("digest mismatches caught: %q", digestErrs)
	}

	// A corrupt byte in the part kept on disk: the resumed file's digest
	// fails, and the retry starts over.
	c2 := newClient(t, h, t.TempDir())
	c2.Attempts = 1
	h.Cut(bigShard, 1<<20)
	if _, err := c2.Pull(context.Background(), Ref{Repo: repo.ID}, PullOptions{}); err == nil {
		t.Fatal("a cut download with one attempt succeeded")
	}
	inc := filepath.Join(c2.Cache.RepoDir(repo.ID), "blobs", hubtest.SHA256(big)+".incomplete")
	flipByte(t, inc, 1000)
	c2.Attempts = 0
	n := len(h.Downloads(bigShard))
	digestErrs = nil
	if _, err := c2.Pull(context.Background(), Ref{Repo: repo.ID}, PullOptions{Progress: progress}); err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, c2, repo, checkpointFiles...)
	gets := h.Downloads(bigShard)[n:]
	if len(gets) != 2 || gets[0].Range != "bytes=1048576-" || gets[1].Range != "" || !slices.Equal(digestErrs, []string{bigShard}) {
		t.Errorf("after corrupting the kept part: downloads %+v, digest errors %q", gets, digestErrs)
	}

	// A blob damaged in the cache: a plain pull trusts it (sizes match),
	// a verifying pull fetches it again.
	blob := filepath.Join(c2.Cache.RepoDir(repo.ID), "blobs", hubtest.SHA256(big))
	flipByte(t, blob, 5)
	if _, err := c2.Pull(context.Background(), Ref{Repo: repo.ID}, PullOptions{Verify: true}); err != nil {
		t.Fatal(err)
	}
	checkSnapshot(t, c2, repo, checkpointFiles...)
}

func flipByte(t *testing.T, path string, at int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, at); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b, at); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentPulls runs two pulls of one model into one cache at once:
// the second waits on the first's blob lock and links the blob it wrote,
// so the file is fetched once and never torn.
func TestConcurrentPulls(t *testing.T) {
	repo := checkpointRepo("kiln-test/Tiny")
	h := startHub(t, repo)
	cache := t.TempDir()
	started, release := h.Hold(bigShard)
	var waited sync.Once
	sawWait := make(chan struct{})
	errs := make(chan error, 2)
	pull := func(progress func(Event)) {
		_, err := newClient(t, h, cache).Pull(context.Background(), Ref{Repo: repo.ID}, PullOptions{Progress: progress})
		errs <- err
	}
	go pull(nil)
	<-started
	go pull(func(e Event) {
		if e.File == bigShard && e.State == Waiting {
			waited.Do(func() { close(sawWait) })
		}
	})
	select {
	case <-sawWait:
	case <-time.After(10 * time.Second):
		t.Fatal("the second pull did not wait for the first")
	}
	release()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	checkSnapshot(t, newClient(t, h, cache), repo, checkpointFiles...)
	if gets := h.Downloads(bigShard); len(gets) != 1 {
		t.Errorf("%s was downloaded %d times", bigShard, len(gets))
	}
}

func TestPullErrors(t *testing.T) {
	repo := checkpointRepo("kiln-test/Tiny")
	gated := checkpointRepo("kiln-test/Gated")
	gated.Gated = true
	h := startHub(t, repo, gated, &hubtest.Repo{ID: "kiln-test/Docs", Files: []hubtest.File{{Name: "README.md", Data: []byte("hi")}}})
	c := newClient(t, h, t.TempDir())
	c.Token = ""
	for _, tc := range []struct {
		ref  Ref
		want string
	}{
		{Ref{Repo: "kiln-test/Missing"}, "kiln-test/Missing was not found on " + h.URL() + " (a private repository needs HF_TOKEN)"},
		{Ref{Repo: gated.ID}, "kiln-test/Gated is gated: accept its terms at " + h.URL() + "/kiln-test/Gated, then set HF_TOKEN"},
		{Ref{Repo: repo.ID, Revision: "v9"}, `kiln-test/Tiny has no revision "v9"`},
		{Ref{Repo: repo.ID, Quant: "Q4_K_M"}, "kiln-test/Tiny has no GGUF files to pick Q4_K_M from"},
		{Ref{Repo: "kiln-test/Docs"}, "holds neither a checkpoint"},
	} {
		_, err := c.Pull(context.Background(), tc.ref, PullOptions{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v\nwant %q", tc.ref, err, tc.want)
		}
	}
	if _, err := os.Stat(c.Cache.RepoDir(gated.ID)); err == nil {
		t.Error("a refused pull left a repository folder")
	}
	c.Token = h.Token
	if _, err := c.Pull(context.Background(), Ref{Repo: gated.ID}, PullOptions{}); err != nil {
		t.Errorf("gated with the token: %v", err)
	}

	// 429s are waited out; too many of them are reported as such.
	h.RateLimit(2)
	if _, err := c.Pull(context.Background(), Ref{Repo: repo.ID, Revision: repo.Commit()}, PullOptions{}); err != nil {
		t.Errorf("after two 429s: %v", err)
	}
	h.RateLimit(100)
	c.Attempts = 2
	if _, err := c.Pull(context.Background(), Ref{Repo: repo.ID}, PullOptions{}); err == nil || !strings.Contains(err.Error(), "rate-limiting") {
		t.Errorf("rate-limited: %v", err)
	}
	h.RateLimit(0)

	// A checkpoint the caller cannot load stops before its weights.
	c3 := newClient(t, h, t.TempDir())
	n := len(h.Downloads(bigShard))
	_, err := c3.Pull(context.Background(), Ref{Repo: repo.ID}, PullOptions{Check: func(snap string) error {
		if _, err := os.Stat(filepath.Join(snap, "config.json")); err != nil {
			t.Errorf("Check ran before config.json was there: %v", err)
		}
		return errors.New("unsupported architecture")
	}})
	if err == nil || err.Error() != "unsupported architecture" || len(h.Downloads(bigShard)) != n {
		t.Errorf("refused checkpoint: %v, %d weight downloads", err, len(h.Downloads(bigShard))-n)
	}
}

func TestPullOffline(t *testing.T) {
	repo := checkpointRepo("kiln-test/Tiny")
	h := startHub(t, repo)
	cache := t.TempDir()
	if _, err := newClient(t, h, cache).Pull(context.Background(), Ref{Repo: repo.ID}, PullOptions{}); err != nil {
		t.Fatal(err)
	}
	c := newClient(t, h, cache)
	c.Offline = true
	n := len(h.Requests())
	p, err := c.Pull(context.Background(), Ref{Repo: repo.ID}, PullOptions{})
	if err != nil || p.Offline == nil || len(h.Requests()) != n {
		t.Errorf("offline pull of a cached model: %+v, %v, %d requests", p, err, len(h.Requests())-n)
	}
	if _, err := c.Pull(context.Background(), Ref{Repo: "kiln-test/Other"}, PullOptions{}); !errors.Is(err, ErrOffline) || !errors.Is(err, ErrNotCached) {
		t.Errorf("offline pull of a missing model: %v", err)
	}
	// A hub that cannot be reached: the cached copy does.
	c.Offline = false
	c.Endpoint = "http://127.0.0.1:1"
	if p, err := c.Pull(context.Background(), Ref{Repo: repo.ID}, PullOptions{}); err != nil || p.Offline == nil {
		t.Errorf("unreachable hub, cached model: %+v, %v", p, err)
	}
}

func TestRenamedRepo(t *testing.T) {
	repo := checkpointRepo("kiln-test/Tiny")
	h := startHub(t, repo)
	h.Rename("kiln-test/OldName", repo.ID)
	c := newClient(t, h, t.TempDir())
	p, err := c.Pull(context.Background(), Ref{Repo: "kiln-test/OldName"}, PullOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(c.Cache.RepoDir("kiln-test/OldName"), "snapshots", repo.Commit()); p.Path != want {
		t.Errorf("pulled to %s, want %s (huggingface_hub stores by the requested id)", p.Path, want)
	}
}

// TestLeaveCache pulls the test hub's models into $KILN_HF_CACHE_OUT and
// leaves them there, for scripts/check_hf_cache.py to read with
// huggingface_hub (on a machine that has it).
func TestLeaveCache(t *testing.T) {
	dir := os.Getenv("KILN_HF_CACHE_OUT")
	if dir == "" {
		t.Skip("set KILN_HF_CACHE_OUT to a directory to leave a cache there")
	}
	c := newClient(t, hubtest.StartModels(t), dir)
	for _, ref := range []Ref{{Repo: "kiln-test/demo"}, {Repo: "kiln-test/qwen3-w256-GGUF"}, {Repo: "kiln-test/qwen3-w256-GGUF", Quant: "Q8_0"}} {
		p, err := c.Pull(context.Background(), ref, PullOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s", ref, p.Path)
	}
}
