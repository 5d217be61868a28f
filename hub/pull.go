package hub

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// State is where one file of a pull stands.
type State int

const (
	Queued      State = iota
	Waiting           // for another download of the same blob to finish
	Downloading       // Done bytes in hand
	Verifying         // hashing it against the hub's digest
	Retrying          // the last try failed (Err); trying again
	Downloaded        // downloaded, verified and linked into the snapshot
	Cached            // already in the cache
	Failed            // given up (Err)
)

func (s State) String() string {
	return [...]string{"queued", "waiting", "downloading", "verifying", "retrying", "downloaded", "cached", "failed"}[s]
}

// Event is the progress of one file of a pull.
type Event struct {
	File   string
	Digest string // the blob's name: its sha256, or its git blob id
	Size   int64
	Done   int64 // bytes in hand
	State  State
	Err    error // why a Retrying or Failed file failed
}

// PullOptions configures a pull.
type PullOptions struct {
	// Progress receives every file's events: first one Queued event per
	// file (in download order), then each file's events in order. It is
	// called from several goroutines at once.
	Progress func(Event)
	// Check, when set, is called with the snapshot directory once a
	// checkpoint's text files (config, tokenizer, template) are in it and
	// before its weights are fetched; an error ends the pull there.
	Check func(snapshot string) error
	// Verify hashes the files already in the cache again and fetches any
	// whose bytes changed.
	Verify bool
}

// Pulled is a model in the cache after a pull.
type Pulled struct {
	Ref    Ref
	Commit string
	Path   string // what kiln loads: the snapshot directory, or its GGUF file
	Files  []Event
	// Fetched is the bytes this pull downloaded; Resumed those of them
	// that continued an earlier, interrupted download.
	Fetched, Resumed int64
	// Unverified lists files whose hub ETag is no digest kiln can check
	// (a mirror's), so only their sizes were checked.
	Unverified []string
	// Offline says the hub was not asked (HF_HUB_OFFLINE, or unreachable)
	// and Path is what the cache already held.
	Offline error
}

// Pull brings what ref names into the cache, unless it is there already,
// and returns where it is. An interrupted pull (a cancelled ctx, a lost
// connection after the retries) leaves each file's bytes in
// blobs/ETAG.incomplete, and the next pull resumes them.
func (c *Client) Pull(ctx context.Context, ref Ref, opts PullOptions) (*Pulled, error) {
	emit := opts.Progress
	if emit == nil {
		emit = func(Event) {}
	}
	if c.Offline {
		path, err := c.Cache.Find(ref)
		if err != nil {
			return nil, fmt.Errorf("%w, and %w", ErrOffline, err)
		}
		return &Pulled{Ref: ref, Path: path, Offline: ErrOffline}, nil
	}
	info, err := c.Info(ctx, ref.Repo, ref.rev())
	if err != nil {
		if unreachable(err) {
			if path, ferr := c.Cache.Find(ref); ferr == nil {
				return &Pulled{Ref: ref, Path: path, Offline: err}, nil
			}
		}
		return nil, err
	}
	var names []string
	for _, s := range info.Siblings {
		if validName(s.Name) {
			names = append(names, s.Name)
		}
	}
	need, gguf, err := selectFiles(ref, names)
	if err != nil {
		return nil, err
	}
	p := &pull{c: c, ref: ref, commit: info.SHA, emit: emit, verify: opts.Verify,
		repoDir: c.Cache.RepoDir(ref.Repo), lockDir: c.Cache.lockDir(ref.Repo)}
	p.snap = filepath.Join(p.repoDir, "snapshots", p.commit)
	metas, err := p.plan(ctx, need)
	if err != nil {
		return nil, err
	}
	for _, m := range metas {
		emit(Event{File: m.Name, Digest: m.ETag, Size: m.Size, State: Queued})
	}
	if err := p.checkSpace(metas); err != nil {
		return nil, err
	}
	if err := writeRef(p.repoDir, ref.rev(), p.commit); err != nil {
		return nil, err
	}
	// Text files first: a checkpoint the caller cannot load fails before
	// its weights are fetched, and an interrupted pull leaves an index
	// that says which shards are missing.
	text, weights := metas, []*fileMeta(nil)
	if gguf == "" {
		i := sort.Search(len(metas), func(i int) bool { return isWeight(metas[i].Name) })
		text, weights = metas[:i], metas[i:]
	}
	if err := p.fetchAll(ctx, text); err != nil {
		return nil, err
	}
	if opts.Check != nil && gguf == "" {
		if err := opts.Check(p.snap); err != nil {
			return nil, err
		}
	}
	if err := p.fetchAll(ctx, weights); err != nil {
		return nil, err
	}
	out := &Pulled{Ref: ref, Commit: p.commit, Path: p.snap, Fetched: p.fetched, Resumed: p.resumed, Unverified: p.unverified}
	if gguf != "" {
		out.Path = filepath.Join(p.snap, filepath.FromSlash(gguf))
	}
	for _, m := range metas {
		out.Files = append(out.Files, Event{File: m.Name, Digest: m.ETag, Size: m.Size, Done: m.Size, State: p.final[m.Name]})
	}
	return out, nil
}

func isWeight(name string) bool { return strings.HasSuffix(strings.ToLower(name), ".safetensors") }

// unreachable reports whether err says the hub could not be reached at all.
func unreachable(err error) bool {
	var dns *net.DNSError
	var op *net.OpError
	return errors.As(err, &dns) || errors.As(err, &op) && op.Op == "dial"
}

// pull is one Pull in progress.
type pull struct {
	c                      *Client
	ref                    Ref
	commit                 string
	repoDir, snap, lockDir string
	verify                 bool
	emit                   func(Event)

	mu               sync.Mutex
	fetched, resumed int64
	unverified       []string
	final            map[string]State
}

// plan returns each needed file's blob name, size and location: from the
// snapshot for files it holds already (unless verifying), from the hub
// (a HEAD each, several at once) for the rest; text files first, then the
// weights, largest first.
func (p *pull) plan(ctx context.Context, need []string) ([]*fileMeta, error) {
	metas := make([]*fileMeta, len(need))
	errs := make([]error, len(need))
	sem := make(chan struct{}, p.c.parallel())
	var wg sync.WaitGroup
	for i, name := range need {
		ptr := filepath.Join(p.snap, filepath.FromSlash(name))
		if target, err := os.Readlink(ptr); err == nil && !p.verify {
			if fi, err := os.Stat(ptr); err == nil {
				metas[i] = &fileMeta{Name: name, ETag: filepath.Base(target), Size: fi.Size()}
				continue
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			metas[i], errs[i] = p.c.head(ctx, p.ref, p.commit, name)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err // the first: the others most often say the same
		}
	}
	sort.SliceStable(metas, func(i, j int) bool {
		wi, wj := isWeight(metas[i].Name), isWeight(metas[j].Name)
		if wi != wj {
			return !wi
		}
		return wi && metas[i].Size > metas[j].Size
	})
	return metas, nil
}

func (c *Client) parallel() int {
	if c.Parallel > 0 {
		return c.Parallel
	}
	return 8
}

// checkSpace refuses a pull the disk cannot hold.
func (p *pull) checkSpace(metas []*fileMeta) error {
	var need int64
	for _, m := range metas {
		blob := filepath.Join(p.repoDir, "blobs", m.ETag)
		if _, err := os.Stat(blob); err == nil {
			continue
		}
		have := int64(0)
		if fi, err := os.Stat(blob + ".incomplete"); err == nil {
			have = fi.Size()
		}
		need += max(m.Size-have, 0)
	}
	dir := p.c.Cache.Dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var st syscall.Statfs_t
	if syscall.Statfs(dir, &st) != nil {
		return nil // unknown: let the writes say
	}
	if free := int64(st.Bavail) * int64(st.Bsize); free < need {
		return fmt.Errorf("%s needs %.1f GB more in %s, which has %.1f GB free", p.ref, float64(need)/1e9, dir, float64(free)/1e9)
	}
	return nil
}

// fetchAll fetches files, several at once; the first failure stops the
// rest (their bytes so far stay for the next pull).
func (p *pull) fetchAll(ctx context.Context, metas []*fileMeta) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		once  sync.Once
		first error
		wg    sync.WaitGroup
	)
	sem := make(chan struct{}, p.c.parallel())
	for _, m := range metas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-sem }()
			if err := p.fetch(ctx, m); err != nil {
				once.Do(func() { first = err; cancel() })
			}
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

// fetch brings one file into the snapshot: from the cache when its blob is
// there, else by download, under the blob's lock.
func (p *pull) fetch(ctx context.Context, m *fileMeta) error {
	ev := Event{File: m.Name, Digest: m.ETag, Size: m.Size}
	emit := func(s State, done int64) {
		ev.State, ev.Done = s, done
		p.emit(ev)
	}
	blob := filepath.Join(p.repoDir, "blobs", m.ETag)
	if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
		return err
	}
	unlock, err := lock(ctx, filepath.Join(p.lockDir, m.ETag+".lock"), func() { emit(Waiting, 0) })
	if err != nil {
		return err
	}
	defer unlock()
	state := Cached
	if ok, err := p.have(blob, m, emit); err != nil {
		return err
	} else if !ok {
		inc := blob + ".incomplete"
		var start int64
		if fi, err := os.Stat(inc); err == nil {
			start = min(fi.Size(), m.Size)
		}
		err := p.c.retry(ctx, func(err error, _ time.Duration) {
			ev.Err = err
			emit(Retrying, ev.Done)
			ev.Err = nil
		}, func() error { return p.c.download(ctx, m, inc, emit) })
		if err != nil {
			ev.Err = p.c.explain(p.ref, m.Name, err)
			if !errors.Is(err, context.Canceled) {
				emit(Failed, ev.Done)
			}
			return ev.Err
		}
		if err := os.Rename(inc, blob); err != nil {
			return err
		}
		state = Downloaded
		p.mu.Lock()
		p.fetched += m.Size - start
		p.resumed += start
		if newDigest(m.ETag, m.Size) == nil {
			p.unverified = append(p.unverified, m.Name)
		}
		p.mu.Unlock()
	}
	if err := linkBlob(p.snap, m.Name, blob); err != nil {
		return err
	}
	p.mu.Lock()
	if p.final == nil {
		p.final = map[string]State{}
	}
	p.final[m.Name] = state
	p.mu.Unlock()
	emit(state, m.Size)
	return nil
}

// have reports whether the blob is in the cache with the file's size (and,
// when verifying, its digest); a blob that is not is removed.
func (p *pull) have(blob string, m *fileMeta, emit func(State, int64)) (bool, error) {
	fi, err := os.Stat(blob)
	if err != nil {
		return false, nil
	}
	ok := fi.Size() == m.Size
	if ok && p.verify {
		emit(Verifying, m.Size)
		if h := newDigest(m.ETag, m.Size); h != nil {
			f, err := os.Open(blob)
			if err != nil {
				return false, err
			}
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return false, err
			}
			ok = fmt.Sprintf("%x", h.Sum(nil)) == m.ETag
		}
	}
	if !ok {
		return false, os.Remove(blob)
	}
	return true, nil
}
