package engine

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kiln-llm/kiln/kvcache"
	"github.com/kiln-llm/kiln/model"
)

// StateCache configures the state cache: the computed past of conversations
// that the device lets go (evicted for room, idle, or when the engine
// closes) is kept in host memory and then in a bounded directory, and
// restored for requests that continue them, across restarts too (see
// kvcache.Store). A hybrid model keeps the last state of each conversation
// (its answers' ends), its other snapshots while the engine idles, and any
// snapshot evicted for room; a dense model the KV blocks of each cached
// prefix.
type StateCache struct {
	Dir       string // cache directory; "" keeps it in host memory only
	DiskBytes int64  // most bytes in Dir
	RAMBytes  int64  // most bytes in host memory; 1 GiB
	// Model identifies the model's weights (its name and a digest): the
	// engine adds the model's shape and KV layout, and never loads what
	// another identity saved.
	Model string
}

// enabled reports whether the state cache is on.
func (c *StateCache) enabled() bool { return c.Dir != "" || c.RAMBytes > 0 }

// spillAfter is how long the engine idles before it copies the latest
// state of its conversations to the state cache (a user reading an answer).
const spillAfter = 2 * time.Second

// openStore opens the state cache of m. A directory another process holds
// leaves it in host memory only, with a warning.
func openStore(m *model.Model, opts *Options) (*kvcache.Store, error) {
	c := opts.StateCache
	if c.RAMBytes == 0 {
		c.RAMBytes = 1 << 30
	}
	cfg := m.Config()
	so := kvcache.StoreOptions{
		Dir: c.Dir, DiskBytes: c.DiskBytes, RAMBytes: c.RAMBytes, BlockSize: opts.BlockSize, BlockBytes: m.BlockBytes(),
		Model: fmt.Sprintf("%s|%s|layers %d|block %d x %d bytes|state %d bytes", c.Model, cfg.Name, cfg.Layers,
			opts.BlockSize, m.BlockBytes(), m.SlotBytes()),
		Logger: opts.Logger,
	}
	if m.Hybrid() {
		so.StateBytes = m.SlotBytes()
	}
	st, err := kvcache.OpenStore(so)
	if err != nil && c.Dir != "" && errors.Is(err, kvcache.ErrStoreBusy) {
		opts.Logger.Warn("state cache: the directory is in use; keeping conversations in host memory only", "err", err)
		so.Dir = ""
		st, err = kvcache.OpenStore(so)
	}
	return st, err
}

// storedPrefix is a prompt prefix loaded from the state cache: n tokens,
// the KV blocks from block from on, and a hybrid model's state after them.
type storedPrefix struct {
	n, from   int
	kv, state []byte
	staged    bool          // kv and state are in the scheduler's stage
	took      time.Duration // reading it
}

// fromStore returns the longest prefix of q's prompt that the state cache
// holds, when it is at least a block longer than the dev tokens the
// device's caches hold (whose whole blocks it keeps), once it is read:
// until then reading is true. The files are read in the background (read):
// a dense 8B model's conversation of 2K tokens is 302 MB of them, which
// took the loop 199-256 ms on an H200's host while every other request
// waited. A request that waits for blocks keeps what it read for its next
// try.
func (s *scheduler) fromStore(q *seq, dev int) (st *storedPrefix, reading bool) {
	if s.store == nil || q.noStore {
		return nil, false
	}
	if q.reading {
		return nil, true
	}
	bs := s.e.opts.BlockSize
	if len(q.tokens)-1 < dev+bs {
		return nil, false // the device holds all it could give
	}
	if st := q.stored; st != nil {
		if st.from == dev/bs {
			return st, false
		}
		s.unstage(st)
		q.stored = nil
	}
	n := s.store.Match(q.tokens, len(q.tokens)-1, s.hybrid)
	if n < dev+bs {
		return nil, false
	}
	bytes := int64(((n+bs-1)/bs - dev/bs) * s.m.BlockBytes())
	if s.hybrid {
		bytes += int64(s.m.SlotBytes())
	}
	if restore, compute, ok := s.worthRestoring(n-dev, bytes); !ok {
		s.e.log.Info("state cache: computing rather than restoring", "seq", q.id, "tokens", n-dev, "bytes", bytes,
			"restore_est", restore.Round(time.Microsecond), "compute_est", compute.Round(time.Microsecond))
		q.noStore = true
		return nil, false
	}
	s.read(q, n, dev/bs)
	return nil, true
}

// worthRestoring weighs restoring bytes from the state cache against
// computing their tokens, at the rates measured so far (a restore's at
// defaultRestoreRate until one is measured): where a GPU prefills fast and
// the KV of a token is large, computing wins. A dense 8B model's
// 2,048-token prefix is 302 MB, restored in 280-300 ms on an H200's host
// and device, computed in ~50 ms; a 20K-token conversation of a 12-layer
// Qwen3-Next is 153 MB, restored in 13 ms, computed in ~370 ms. Without a
// prefill rate (no warm-up, no long pass yet: a CPU engine after its
// start) it restores.
func (s *scheduler) worthRestoring(tokens int, bytes int64) (restore, compute time.Duration, ok bool) {
	if s.prefillRate <= 0 {
		return 0, 0, true
	}
	rate := s.restoreRate
	if rate <= 0 {
		rate = defaultRestoreRate
	}
	restore = time.Duration(float64(bytes) / rate * float64(time.Second))
	compute = time.Duration(float64(tokens) / s.prefillRate * float64(time.Second))
	return restore, compute, restore < compute
}

// defaultRestoreRate is the bytes a second a restore is assumed to take
// before one is measured: between a 302 MB prefix read from disk and
// copied through pageable memory (~1 GB/s on an H200's host) and a 153 MB
// one from the page cache through page-locked memory (~11 GB/s).
const defaultRestoreRate = 2e9

// rateTokens is the fewest tokens of a pass that measures the prefill rate.
const rateTokens = 256

// ewma moves a running estimate a third of the way to a new measurement
// (or takes it, as the first).
func ewma(est, x float64) float64 {
	if est <= 0 {
		return x
	}
	return est + (x-est)/3
}

// read loads tokens[:n] of q from the state cache into the stage, from
// block from on, in a goroutine of its own; land hands the result to q.
func (s *scheduler) read(q *seq, n, from int) {
	q.reading = true
	buf, tokens := s.stage, slices.Clone(q.tokens[:n])
	s.stage = nil // the read's until it lands
	s.reads.Add(1)
	go func() {
		defer s.reads.Done()
		if s.e.opts.beforeRead != nil {
			s.e.opts.beforeRead()
		}
		start := time.Now()
		kv, state, err := s.store.Load(tokens, n, from, buf)
		r := landed{q: q, buf: buf, err: err}
		if err == nil {
			staged := cap(buf) > 0 && cap(kv) > 0 && &buf[:1][0] == &kv[:1][0]
			r.st = &storedPrefix{n: n, from: from, kv: kv, state: state, staged: staged, took: time.Since(start)}
		}
		s.readMu.Lock()
		s.landed = append(s.landed, r)
		s.readMu.Unlock()
		s.e.poke()
	}()
}

// landed is a finished read of the state cache: its prefix, or its error;
// buf is the stage it took (nil: none).
type landed struct {
	q   *seq
	st  *storedPrefix
	buf []byte
	err error
}

// land gives the finished reads to their requests, which start at the next
// admission; a request that ended meanwhile drops its prefix, and one whose
// read failed computes its prompt instead.
func (s *scheduler) land() {
	s.readMu.Lock()
	rs := s.landed
	s.landed = nil
	s.readMu.Unlock()
	for _, r := range rs {
		q := r.q
		q.reading = false
		if r.buf != nil && (r.st == nil || !r.st.staged) {
			s.stage = r.buf // the stage was not used
		}
		switch {
		case r.err != nil:
			s.e.log.Warn("state cache: not restored", "seq", q.id, "tokens", len(q.tokens), "err", r.err)
			q.noStore = true
		case q.done:
			s.unstage(r.st)
		default:
			q.stored = r.st
		}
	}
}

// unstage keeps st's buffer as the stage once its copy to the device is
// done or st is dropped: the stage itself, or (where it is not page-locked)
// the latest buffer up to stageMax.
func (s *scheduler) unstage(st *storedPrefix) {
	if st.staged || !s.stageLocked && cap(st.kv) <= stageMax {
		s.stage = st.kv
	}
}

// stageMax bounds the restore buffer a scheduler keeps between restores:
// a 20K-token conversation of a 12-layer Qwen3-Next is 133 MB of KV and
// 19.8 MB of state.
const stageMax = 256 << 20

// restore writes a stored prefix into q's blocks (reserved) and slot.
func (s *scheduler) restore(q *seq, st *storedPrefix) error {
	bs := s.e.opts.BlockSize
	var ids []int
	for _, b := range q.table.Blocks()[st.from : (st.n+bs-1)/bs] {
		ids = append(ids, int(b))
	}
	start := time.Now()
	if err := s.m.RestoreBlocks(ids, st.kv); err != nil {
		return err
	}
	if s.hybrid {
		s.m.RestoreSlot(q.slot, st.state)
	}
	copied := time.Since(start)
	s.restoreRate = ewma(s.restoreRate, float64(len(st.kv)+len(st.state))/(st.took+copied).Seconds())
	s.e.log.Info("state cache: restored", "seq", q.id, "tokens", st.n, "kv_bytes", len(st.kv), "state_bytes", len(st.state),
		"read", st.took.Round(time.Microsecond), "copied", copied.Round(time.Microsecond))
	return nil
}

// spillSnapshot copies a snapshot to the state cache, once (a failure is
// logged and not tried again).
func (s *scheduler) spillSnapshot(sn *kvcache.Snapshot) {
	if s.store == nil || sn.Stored {
		return
	}
	sn.Stored = true
	state, err := s.snaps.State(sn)
	if err == nil {
		_, err = s.store.Put(sn.Tokens, sn.Blocks, state, s.m.SaveBlocks)
	}
	if err != nil {
		s.e.log.Warn("state cache: snapshot not kept", "tokens", len(sn.Tokens), "err", err)
	}
}

// spillPrefix copies a dense model's cached prefix to the state cache (a
// failure is logged).
func (s *scheduler) spillPrefix(tokens, blocks []int32) {
	if _, err := s.store.Put(tokens, blocks, nil, s.m.SaveBlocks); err != nil {
		s.e.log.Warn("state cache: prefix not kept", "tokens", len(tokens), "err", err)
	}
}

// spillOne copies the most recently used conversation end that the state
// cache lacks (a hybrid model's answer end, a dense model's prefix-cache
// leaf), or with points, when every end is stored, a hybrid model's most
// recently used other snapshot (where its conversation may be edited), and
// reports whether there was one.
func (s *scheduler) spillOne(points bool) bool {
	if s.store == nil {
		return false
	}
	if s.hybrid {
		var tip, point *kvcache.Snapshot
		s.snaps.Each(func(sn *kvcache.Snapshot) {
			switch {
			case sn.Stored:
			case sn.Kind == kvcache.Tip && tip == nil:
				tip = sn
			case sn.Kind == kvcache.Point && point == nil && points:
				point = sn
			}
		})
		if tip == nil {
			tip = point
		}
		if tip == nil {
			return false
		}
		s.spillSnapshot(tip)
		return true
	}
	leaves := s.prefix.Leaves(1, true)
	if len(leaves) == 0 {
		return false
	}
	s.spillPrefix(leaves[0].Tokens, leaves[0].Blocks)
	s.prefix.MarkStored(leaves[0])
	return true
}

// Conversation is a conversation's latest computed past that the engine
// keeps: a hybrid model's answer end, or a dense model's cached prefix that
// no longer one extends.
type Conversation struct {
	Tokens      int
	DeviceBytes int64 // its KV blocks (those it shares with others too) and its device state slot
	HostBytes   int64 // its state in host memory
	Stored      bool  // the state cache holds it
	Idle        time.Duration
}

// conversations lists at most max conversations the device's caches keep,
// most recently used first.
func (s *scheduler) conversations(max int) []Conversation {
	var out []Conversation
	bb := int64(s.m.BlockBytes())
	now := time.Now()
	if s.hybrid {
		s.snaps.Each(func(sn *kvcache.Snapshot) {
			if sn.Kind != kvcache.Tip || len(out) >= max {
				return
			}
			c := Conversation{Tokens: len(sn.Tokens), DeviceBytes: int64(len(sn.Blocks)) * bb, HostBytes: int64(sn.Bytes()),
				Stored: sn.Stored, Idle: now.Sub(sn.Used)}
			if sn.OnDevice() {
				c.DeviceBytes += int64(s.m.SlotBytes())
			}
			out = append(out, c)
		})
		return out
	}
	for _, l := range s.prefix.Leaves(max, false) {
		out = append(out, Conversation{Tokens: len(l.Tokens), DeviceBytes: int64(len(l.Blocks)) * bb, Stored: l.Stored, Idle: now.Sub(l.Used)})
	}
	return out
}

// Conversations returns the conversations the engine's caches keep, most
// recently used first (at most 100), and the prefixes its state cache holds
// (at most 100, most recently used first; nil without a state cache).
func (e *Engine) Conversations() ([]Conversation, []kvcache.StoredPrefix) {
	type result struct {
		convs  []Conversation
		stored []kvcache.StoredPrefix
	}
	ch := make(chan result, 1)
	f := func() {
		r := result{convs: e.sched.conversations(100)}
		if e.sched.store != nil {
			r.stored = e.sched.store.Prefixes(100)
		}
		ch <- r
	}
	select {
	case e.inspect <- f:
	case <-e.done:
		return nil, nil
	}
	r := <-ch // the scheduler runs what it took
	return r.convs, r.stored
}
