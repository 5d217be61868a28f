package engine

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/kvcache"
	"github.com/kiln-llm/kiln/model"
	"github.com/kiln-llm/kiln/tokenizer"
)

// seq is one request inside the scheduler.
type seq struct {
	id        uint64 // submission order: a larger id is younger
	ctx       context.Context
	stopWatch func() bool
	out       *Stream
	submitted time.Time
	started   time.Time // first admitted into the running batch, its cached prefix in place
	firstTok  time.Time
	lastTok   time.Time

	tokens  []int32 // prompt, then generated tokens
	nPrompt int
	maxLen  int // generation stops at this many tokens
	pos     int // tokens whose KV (and state) is computed

	table *kvcache.Table
	chain kvcache.Chain
	slot  int

	// Snapshots (hybrid models): the request's group of snapshots, the
	// group it resumed from, whether it saved one (parent eviction),
	// Request.Checkpoints, and the positions still ahead where its state is
	// saved (snapshotPoints).
	group, parent uint64
	saved         bool
	checkpoints   []int
	points        []int

	admitted bool
	done     bool          // finished: its final event is sent
	noStore  bool          // the state cache failed it: recompute instead
	stored   *storedPrefix // loaded from the state cache, until admitted
	reading  bool          // its prefix is being read from the state cache
	cached   int           // prompt tokens served from cache at first admission

	params backend.SampleParams
	counts map[int32]int32 // generated tokens, for the penalties
	// inPrompt is the prompt's tokens when a repetition penalty is set.
	inPrompt map[int32]bool
	stopIDs  map[int32]bool
	rng      *rand.Rand
	mask     TokenMask // Request.Mask
	maskBits []uint64  // the sampler's mask, filled by mask for each token
	maskEnd  maskEnd   // the mask's verdict when it allowed no token

	dec  *tokenizer.Decoder
	stop stopMatcher

	prefillOnly bool // Request.PrefillOnly
}

func (s *seq) pending() int { return len(s.tokens) - s.pos }

// maskEnd is what a TokenMask that allows no token means for its sequence.
type maskEnd uint8

const (
	maskGoes     maskEnd = iota // it allowed some token
	maskEmpty                   // nothing: ErrMaskEmpty
	maskComplete                // only the end, and the request has no stop token: FinishStop
)

// scheduler is the state of the engine's loop goroutine.
type scheduler struct {
	e      *Engine
	m      *model.Model
	hybrid bool
	alloc  *kvcache.Allocator
	prefix *kvcache.PrefixCache
	snaps  *kvcache.Snapshots
	store  *kvcache.Store // the state cache; nil: none
	// stage is the buffer prefixes from the state cache are read into (up
	// to stageMax bytes): page-locked from the start where the backend has
	// such memory (stageLocked: through pageable memory a restored 21.6K-token
	// conversation's 153 MB crossed to an H200 at 2.6 GB/s), else the last
	// one restored (a fresh buffer cost its page faults, a third of a 150
	// MB restore's reading).
	stage       []byte
	stageLocked bool
	// reads are the state cache's reads in flight (fromStore), landed the
	// finished ones that land has not yet given to their requests.
	reads  sync.WaitGroup
	readMu sync.Mutex
	landed []landed
	// prefillRate (tokens a second) and restoreRate (bytes a second, read
	// and copied to the device) are running estimates that weigh restoring
	// a prefix from the state cache against computing it (worthRestoring).
	prefillRate, restoreRate float64

	slots []int // free state slots
	// captures are the state slots a pass leaves states at its points in
	// (see chunk); freeCaptures is a pass's list of those not yet taken.
	captures, freeCaptures []int
	waiting                []*seq
	running                []*seq // oldest first
	groups                 uint64

	// overlap: the tokens of a pass that do not end their sequence are
	// emitted (detokenized, matched against stop strings, streamed) while
	// the next pass runs on the device. held keeps them until then. A stop
	// string then ends its sequence one pass late, whose extra token is
	// dropped. A hybrid model's sequence with stop strings does not
	// overlap: its state snapshot when it ends must not include the next
	// pass (without stop strings, what ends a sequence is known when its
	// token is accepted, and it is emitted at once).
	overlap bool
	held    []heldToken
	// feeds: decode passes may be issued ahead (see ahead).
	feeds bool

	preemptions, completed, hitTokens int64
	recomputed, generated             int64

	steps, stepTokens, decodeSteps, decodeTokens int64
	aheadSteps                                   int64
	stepTime, decodeTime, hostTime               time.Duration
	lastStep                                     time.Time // end of the last pass; zero after the loop idled
	idleSince                                    time.Time // when the loop last found nothing to do; zero while busy
}

// heldToken is a sampled token accepted into its sequence but not emitted.
type heldToken struct {
	q   *seq
	smp backend.Sampled
}

func newScheduler(e *Engine) *scheduler {
	s := &scheduler{e: e, m: e.m, hybrid: e.m.Hybrid(), alloc: kvcache.NewAllocator(e.opts.KVBlocks), store: e.store}
	s.overlap = e.m.Backend().Asynchronous() || e.opts.overlap
	s.feeds = s.overlap && !s.hybrid && e.cfg.Embedding == nil && e.m.Feeds() && !e.opts.noAhead
	s.prefillRate = cmp.Or(e.opts.prefillRate, e.warmRate)
	if s.store != nil {
		var err error
		if s.stage, err = e.m.HostBuffer(stageMax); err != nil {
			e.log.Warn("state cache: no page-locked restore buffer; restores copy through pageable memory", "bytes", stageMax, "err", err)
		}
		s.stageLocked = s.stage != nil
	}
	// Hybrid models resume only where a state snapshot exists: their
	// snapshots hold the KV blocks they need, and full blocks alone (the
	// prefix cache) are of no use to them.
	if s.hybrid {
		var spare []int
		for i := range e.opts.SnapshotSlots {
			spare = append(spare, e.opts.MaxRunning+i)
		}
		s.snaps = kvcache.NewSnapshots(s.alloc, e.opts.BlockSize, e.m, spare, e.opts.StateMemory)
		s.snaps.Evicted = s.spillSnapshot
	} else {
		s.prefix = kvcache.NewPrefixCache(s.alloc, e.opts.BlockSize)
		if s.store != nil {
			s.prefix.Evicted = s.spillPrefix
		}
	}
	for i := e.opts.MaxRunning - 1; i >= 0; i-- {
		s.slots = append(s.slots, i)
	}
	for i := range e.captures {
		s.captures = append(s.captures, e.opts.MaxRunning+e.opts.SnapshotSlots+i)
	}
	return s
}

func (s *scheduler) loop() {
	e := s.e
	defer close(e.done)
	for {
		select {
		case <-e.quit:
			s.shutdown()
			return
		default:
		}
		s.inspect()
		s.land()
		s.intake()
		s.reap()
		if len(s.running) == 0 && len(s.waiting) == 0 {
			s.flush()
			s.lastStep = time.Time{}
			if s.idleSince.IsZero() {
				s.idleSince = time.Now()
			}
			worked, wait := s.idleWork()
			s.publish()
			if worked {
				continue // and look for requests again
			}
			var timer <-chan time.Time
			if wait > 0 {
				timer = time.After(wait)
			}
			select {
			case <-e.wake:
			case <-e.quit:
			case f := <-e.inspect:
				f()
			case <-timer:
			}
			continue
		}
		s.idleSince = time.Time{}
		s.admit()
		if len(s.running) > 0 {
			s.step()
		} else {
			s.flush()
			if len(s.waiting) > 0 {
				// Every waiting request's prefix is being read from the
				// state cache (admit fails what can never fit): its
				// landing pokes.
				select {
				case <-e.wake:
				case <-e.quit:
				case f := <-e.inspect:
					f()
				}
			}
		}
		if s.e.opts.checkAccounting {
			if err := s.checkAccounting(); err != nil {
				panic(err)
			}
		}
		s.publish()
	}
}

// inspect runs the engine's requests to look at the scheduler's state
// (Conversations).
func (s *scheduler) inspect() {
	for {
		select {
		case f := <-s.e.inspect:
			f()
		default:
			return
		}
	}
}

// intake moves submitted requests to the waiting queue.
func (s *scheduler) intake() {
	e := s.e
	e.mu.Lock()
	in := e.incoming
	e.incoming = nil
	e.mu.Unlock()
	s.waiting = append(s.waiting, in...)
	// A waiting prefill-only request is of no use once the request it
	// prepares arrives: that one computes the same tokens itself.
	var drop []*seq
	for _, w := range s.waiting {
		if !w.prefillOnly {
			continue
		}
		for _, r := range in {
			if !r.prefillOnly && len(w.tokens) <= len(r.tokens) && slices.Equal(w.tokens, r.tokens[:len(w.tokens)]) {
				drop = append(drop, w)
				break
			}
		}
	}
	for _, w := range drop {
		s.finish(w, FinishCancelled, nil)
	}
}

// reap ends cancelled requests.
func (s *scheduler) reap() {
	for _, q := range slices.Clone(s.waiting) {
		if q.ctx.Err() != nil {
			s.finish(q, FinishCancelled, context.Cause(q.ctx))
		}
	}
	for _, q := range slices.Clone(s.running) {
		if q.ctx.Err() != nil {
			s.finish(q, FinishCancelled, context.Cause(q.ctx))
		}
	}
}

// admit moves waiting sequences, first come first served, into the running
// batch while there is room: a free slot and KV blocks for the whole
// remaining prompt (so a prefill never waits for blocks midway). Those
// whose prefix is being read from the state cache let the next ones go
// first.
func (s *scheduler) admit() {
	for i := 0; i < len(s.waiting) && len(s.running) < s.e.opts.MaxRunning; {
		q := s.waiting[i]
		switch s.start(q) {
		case startReading:
			i++
			continue
		case startNoRoom:
			if len(s.running) == 0 {
				s.waiting = slices.Delete(s.waiting, i, i+1)
				s.outgrown(q, fmt.Errorf("%w: %d tokens need %d blocks of %d tokens, the cache has %d",
					ErrKVFull, len(q.tokens), (len(q.tokens)+s.e.opts.BlockSize-1)/s.e.opts.BlockSize, s.e.opts.BlockSize, s.alloc.Blocks()))
				continue
			}
			return
		}
		s.waiting = slices.Delete(s.waiting, i, i+1)
		s.running = append(s.running, q)
		slices.SortFunc(s.running, func(a, b *seq) int { return cmp.Compare(a.id, b.id) })
		if !q.admitted {
			q.admitted = true
			s.e.mu.Lock()
			s.e.queued--
			s.e.mu.Unlock()
		}
	}
}

// startResult is what start did with a waiting sequence.
type startResult int

const (
	started      startResult = iota
	startNoRoom              // its blocks are not available
	startReading             // its prefix is being read from the state cache
)

// start gives q its slot and blocks, resuming from the longest cached
// prefix.
func (s *scheduler) start(q *seq) startResult {
	q.table = kvcache.NewTable(s.e.opts.BlockSize)
	q.chain = kvcache.Chain{}
	q.pos = 0
	n := len(q.tokens)
	bs := s.e.opts.BlockSize
	var snap *kvcache.Snapshot
	var stored *storedPrefix // a longer prefix from the state cache
	if !s.e.opts.NoCache {
		if s.hybrid {
			// The last prompt token is always computed: its logits give the
			// first new token.
			dev := 0
			if snap = s.snaps.Find(q.tokens, n-1); snap != nil {
				dev = len(snap.Tokens)
			}
			var reading bool
			if stored, reading = s.fromStore(q, dev); reading {
				q.table = nil
				return startReading
			}
			if stored != nil {
				if snap != nil {
					q.table.Adopt(s.alloc, snap.Blocks[:stored.from])
				}
				q.pos = stored.n
			} else if snap != nil {
				q.table.Adopt(s.alloc, snap.Blocks)
				q.pos = len(snap.Tokens)
			}
		} else {
			blocks, ch := s.prefix.Match(q.tokens)
			q.table.Adopt(s.alloc, blocks)
			q.chain = ch
			q.pos = min(len(blocks)*bs, n-1)
			var reading bool
			if stored, reading = s.fromStore(q, len(blocks)*bs); reading {
				q.table.Release(s.alloc)
				q.table = nil
				return startReading
			}
			if stored != nil {
				q.pos = stored.n
			}
		}
	}
	if snap != nil {
		// Held until its state and blocks are copied: the blocks found for
		// q below may reclaim snapshots, and Reserve's copy on write gives
		// the snapshot back the only reference to its last block.
		held := slices.Clone(snap.Blocks)
		for _, b := range held {
			s.alloc.Retain(b)
		}
		defer func() {
			for _, b := range held {
				s.alloc.Release(b)
			}
		}()
	}
	copies, err := q.table.Reserve(s.alloc, q.pos, n-q.pos)
	if err == nil {
		// Leave a block for each running sequence's next one: admitting
		// into the last free blocks would only preempt the newcomer again.
		err = s.headroom(len(s.running))
	}
	if err != nil {
		q.table.Release(s.alloc)
		q.table = nil
		return startNoRoom
	}
	for _, c := range copies {
		s.m.CopyBlock(int(c.Dst), int(c.Src))
	}
	if s.hybrid {
		q.slot = s.slots[len(s.slots)-1]
		s.slots = s.slots[:len(s.slots)-1]
		switch {
		case q.group != 0: // one group per request, also across preemptions
		case q.prefillOnly && snap != nil && stored == nil:
			// A next turn's prepared start goes on with the turn it
			// resumes from: its snapshots are that turn's, so that parent
			// eviction counts turns, not passes. (As a group of its own it
			// made the previous answer's message start the next turn's
			// grandparent: a restarted server whose client re-rendered
			// that answer to other ids than generated recomputed it all.)
			q.group, q.saved = snap.Group, true
		default:
			s.groups++
			q.group = s.groups
		}
		if snap != nil && stored == nil {
			s.snaps.Restore(snap, q.slot)
			if snap.Group != q.group && !q.saved {
				q.parent = snap.Group
			}
			// Resumed inside its last message (the prepared start of a
			// next turn holds that message's header): the one message
			// start after it is the reply's, past the message's text, so
			// q keeps no state before where a request that changes that
			// text diverges but the one it resumed from. That is q's to
			// keep, not its parent's to lose as the conversation moves on
			// (parent eviction).
			if c := q.checkpoints; len(c) > 0 {
				if i, _ := slices.BinarySearch(c, len(snap.Tokens)+1); len(c)-i <= 1 {
					s.snaps.Adopt(snap, q.group, q.parent)
				}
			}
		}
		q.points = snapshotPoints(q.checkpoints, q.pos, n, bs)
	}
	if stored != nil {
		err := s.restore(q, stored)
		s.unstage(stored) // the copy to the device is done with it
		if err != nil {
			s.e.log.Error("state cache: restore failed; recomputing", "seq", q.id, "err", err)
			q.noStore = true
			s.release(q)
			return s.start(q)
		}
		if s.hybrid {
			// On the device from now on: a regenerated answer or another
			// branch resumes here without the state cache.
			if sn := s.snapshot(q, kvcache.Point); sn != nil {
				sn.Stored = true
			}
		}
	}
	q.stored = nil
	if !q.admitted {
		q.started = time.Now()
		q.cached = q.pos
		if !q.prefillOnly {
			s.hitTokens += int64(q.pos)
		}
	} else {
		s.recomputed += int64(n - q.pos)
	}
	return started
}

// headroom makes n blocks free, taking them from the caches if need be
// (blocks the caches could give back count as free when they do).
func (s *scheduler) headroom(n int) error {
	if s.alloc.Free() >= n {
		return nil
	}
	taken := make([]int32, 0, n)
	defer func() {
		for _, b := range taken {
			s.alloc.Release(b)
		}
	}()
	for range n {
		b, err := s.alloc.Alloc()
		if err != nil {
			return err
		}
		taken = append(taken, b)
	}
	return nil
}

// release gives back what a sequence holds in the scheduler.
func (s *scheduler) release(q *seq) {
	if q.table != nil {
		q.table.Release(s.alloc)
		q.table = nil
	}
	if q.slot >= 0 {
		s.slots = append(s.slots, q.slot)
		q.slot = -1
	}
}

// preempt frees the youngest running sequence's blocks and slot and puts it
// back at the head of the queue; it is recomputed (from what the caches still
// hold) when admitted again.
func (s *scheduler) preempt() *seq {
	q := s.running[len(s.running)-1]
	s.running = s.running[:len(s.running)-1]
	s.release(q)
	s.waiting = slices.Insert(s.waiting, 0, q)
	s.preemptions++
	s.e.log.Debug("preempted", "seq", q.id, "tokens", len(q.tokens))
	return q
}

type planned struct {
	q    *seq
	n    int
	caps []backend.Capture // states the pass leaves at q's points inside it
}

// captureSlots is how many states a pass may leave at points inside its
// chunks (backend.Capture): a follow-up chat turn has two (its user
// message's start and the last block boundary), which would otherwise
// cost a pass each.
const captureSlots = 4

// step runs one forward pass: every decoding sequence advances by one
// token, prompts being prefilled by chunks that share the rest of the token
// budget, oldest first.
func (s *scheduler) step() {
	opts := &s.e.opts
	budget := opts.MaxBatchTokens
	var plan []planned
	// Decoding sequences first, oldest first: each needs at most one new
	// block, taken from the youngest sequences when there is none.
	for i := 0; i < len(s.running); i++ {
		q := s.running[i]
		if q.pending() != 1 {
			continue
		}
		if !s.ensure(q, 1) {
			break // q was the youngest: nothing after it is running
		}
		plan = append(plan, planned{q: q, n: 1})
		budget--
	}
	free := append(s.freeCaptures[:0], s.captures...)
	for i := 0; i < len(s.running) && budget > 0; i++ {
		q := s.running[i]
		if q.pending() <= 1 {
			continue
		}
		n := min(q.pending(), budget)
		var caps []backend.Capture
		if s.hybrid && !opts.NoCache {
			n, caps = s.chunk(q, n, &free)
		}
		// The prompt's blocks were reserved at admission; this only copies
		// a block shared since (none, with block-aligned snapshots).
		if !s.ensure(q, n) {
			break
		}
		plan = append(plan, planned{q: q, n: n, caps: caps})
		budget -= n
	}
	s.freeCaptures = free
	// A prefill's reservation may have preempted a younger decoding sequence.
	plan = slices.DeleteFunc(plan, func(p planned) bool { return p.q.table == nil })
	if len(plan) == 0 {
		s.flush()
		return
	}
	seqs := make([]model.Seq, len(plan))
	var rows []*seq
	for i, p := range plan {
		q := p.q
		nb := (q.pos + p.n + opts.BlockSize - 1) / opts.BlockSize
		seqs[i] = model.Seq{Tokens: q.tokens[q.pos : q.pos+p.n], Pos: q.pos, Blocks: q.table.Blocks()[:nb], Slot: q.slot, Logits: model.NoLogits, Captures: p.caps}
		if q.pos+p.n == len(q.tokens) && !q.prefillOnly {
			seqs[i].Logits = model.LastLogits
			rows = append(rows, q)
		}
	}
	ps := s.issue(plan, seqs, rows)
	for n := 0; ps != nil; n++ {
		var next *pass
		if n < aheadPasses {
			next = s.ahead(ps)
		}
		s.receive(ps, next != nil)
		ps = next
	}
}

// pass is a forward pass issued: its plan, the sequences whose rows it
// samples, and the wait for those tokens (or an embedding model's rows).
type pass struct {
	plan       []planned
	rows       []*seq
	start      time.Time
	wait       func() ([]backend.Sampled, error)
	embeddings [][]float32
	err        error
}

// aheadPasses bounds a run of passes issued ahead (see ahead), after
// which the loop looks at its queues again: a cancelled or new request
// waits at most that long.
const aheadPasses = 32

// issue runs the model on seqs and starts sampling a token for each
// sequence of rows.
func (s *scheduler) issue(plan []planned, seqs []model.Seq, rows []*seq) *pass {
	ps := &pass{plan: plan, rows: rows, start: time.Now()}
	ps.wait, ps.embeddings, ps.err = s.forward(seqs, rows)
	return ps
}

// ahead issues the decode pass that follows ps before ps's tokens reach
// the host: each sequence's new token is fed on the device from ps's
// sampling (model.Seq.Fed), so the device goes from one pass to the next
// without waiting for the host between them. It does so only where that
// pass is certain to be the next one unless a sequence ends: ps decoded
// one token of every sequence it ran, none of them with a token mask or
// penalties (which need the token first), none near its length limit, and
// no request waits to join. A dense model only: a hybrid sequence that
// ends would have its state advanced past its end, and its last state is
// what the next turn of its conversation resumes from. The tokens of a
// sequence that ends are computed for nothing and dropped.
func (s *scheduler) ahead(ps *pass) *pass {
	if !s.feeds || ps.err != nil || ps.wait == nil || len(ps.rows) != len(ps.plan) || len(s.waiting) > 0 || s.arrived() {
		return nil
	}
	for i, p := range ps.plan {
		q := p.q
		if p.n != 1 || ps.rows[i] != q || q.done || q.ctx.Err() != nil || q.mask != nil || len(q.tokens)+1 >= q.maxLen || q.params.Penalized() {
			return nil
		}
	}
	bs := s.e.opts.BlockSize
	seqs := make([]model.Seq, len(ps.plan))
	for i, p := range ps.plan {
		q := p.q
		copies, err := q.table.Reserve(s.alloc, q.pos+1, 1)
		if err != nil {
			return nil // the blocks of the sequences before q stay theirs: their next token needs them
		}
		for _, c := range copies {
			s.m.CopyBlock(int(c.Dst), int(c.Src))
		}
		nb := (q.pos + 2 + bs - 1) / bs
		seqs[i] = model.Seq{Tokens: []int32{0}, Pos: q.pos + 1, Blocks: q.table.Blocks()[:nb], Slot: q.slot, Logits: model.LastLogits, Fed: true, FedRow: i}
	}
	next := s.issue(ps.plan, seqs, ps.rows)
	if next.err != nil {
		// Issued again after ps's tokens, the pass fails or succeeds on
		// its own: its sequences do not end for this one.
		s.e.log.Warn("a decode pass issued ahead failed; it runs again after the last one's tokens", "err", next.err)
		return nil
	}
	s.aheadSteps++
	return next
}

// arrived reports whether requests were submitted since the last intake.
func (s *scheduler) arrived() bool {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return len(s.e.incoming) > 0
}

// receive waits for a pass's tokens and gives them to their sequences;
// with the next pass already running (running), each is emitted at once.
func (s *scheduler) receive(ps *pass, running bool) {
	plan, rows, embeddings, err := ps.plan, ps.rows, ps.embeddings, ps.err
	var sampled []backend.Sampled
	if err == nil && ps.wait != nil {
		sampled, err = ps.wait()
	}
	// A pass issued ahead counts from the end of the one before it.
	start := ps.start
	if start.Before(s.lastStep) {
		start = s.lastStep
	}
	s.account(plan, start)
	if err != nil {
		s.e.log.Error("forward step failed", "err", err)
		for _, p := range plan {
			s.finish(p.q, FinishError, err)
		}
		return
	}
	for _, p := range plan {
		q := p.q
		if q.done {
			continue // ended by a stop string while this pass ran
		}
		for _, c := range p.caps {
			s.snapshotOf(q, q.pos+c.Offset, c.Slot, q.pointKind(q.pos+c.Offset))
		}
		q.pos += p.n
		if s.e.opts.NoCache {
			continue
		}
		if !s.hybrid {
			s.prefix.Insert(&q.chain, q.tokens[:q.pos], q.table.Blocks())
		} else if at, kind := s.atPoint(q); at {
			s.snapshot(q, kind)
		}
	}
	for i, q := range rows {
		if q.done {
			continue
		}
		if embeddings != nil {
			s.finishWith(q, FinishStop, nil, Event{Embedding: embeddings[i]})
			continue
		}
		switch q.maskEnd {
		case maskEmpty:
			s.finish(q, FinishError, ErrMaskEmpty)
			continue
		case maskComplete:
			var ev Event
			s.finishWith(q, q.flushText(&ev, FinishStop), nil, ev)
			continue
		}
		s.generated++
		if ends := q.accept(sampled[i].Token); ends || running || !s.overlap || s.hybrid && q.stop.any() {
			// Emitted now: an ending sequence's slot and blocks are free for
			// the next pass, and its client hears of it at once.
			s.emit(q, sampled[i])
		} else {
			s.held = append(s.held, heldToken{q, sampled[i]})
		}
	}
	for _, p := range plan {
		if q := p.q; q.prefillOnly && q.pos == len(q.tokens) && !q.done {
			s.finish(q, FinishLength, nil)
		}
	}
}

// account adds a pass that started at start to the step counters.
func (s *scheduler) account(plan []planned, start time.Time) {
	end := time.Now()
	if !s.lastStep.IsZero() {
		s.hostTime += start.Sub(s.lastStep)
	}
	s.lastStep = end
	tokens := 0
	for _, p := range plan {
		tokens += p.n
	}
	s.steps++
	s.stepTokens += int64(tokens)
	s.stepTime += end.Sub(start)
	if tokens >= rateTokens && s.e.opts.prefillRate == 0 {
		s.prefillRate = ewma(s.prefillRate, float64(tokens)/end.Sub(start).Seconds())
	}
	if tokens == len(plan) {
		s.decodeSteps++
		s.decodeTokens += int64(tokens)
		s.decodeTime += end.Sub(start)
	}
}

// ensure reserves q's blocks for its next n tokens, preempting the youngest
// running sequences while blocks are missing. It returns false when q itself
// was preempted, or failed because it cannot fit even alone.
func (s *scheduler) ensure(q *seq, n int) bool {
	for {
		copies, err := q.table.Reserve(s.alloc, q.pos, n)
		if err == nil {
			for _, c := range copies {
				s.m.CopyBlock(int(c.Dst), int(c.Src))
			}
			return true
		}
		if len(s.running) == 1 {
			s.outgrown(q, fmt.Errorf("%w: %d tokens, the cache has %d blocks of %d tokens",
				ErrKVFull, q.pos+n, s.alloc.Blocks(), s.e.opts.BlockSize))
			return false
		}
		if s.preempt() == q {
			return false
		}
	}
}

// outgrown ends a sequence that does not fit in the KV cache even alone
// (possible only with a context beyond the cache, see Options.Context): a
// prompt fails with err, an answer ends as if it had reached the context
// length, with every token it generated emitted.
func (s *scheduler) outgrown(q *seq, err error) {
	if len(q.tokens) == q.nPrompt {
		s.finish(q, FinishError, err)
		return
	}
	s.e.log.Warn("an answer outgrew the KV cache; it ends here", "seq", q.id, "tokens", len(q.tokens), "err", err)
	for _, h := range s.held {
		if h.q == q && !q.done {
			s.emit(q, h.smp)
		}
	}
	if q.done { // its held token ended it
		return
	}
	s.complete(q, FinishLength, Event{})
}

// forward runs the model and starts sampling a token for each sequence of
// rows (wait gives them), or reads an embedding model's rows.
func (s *scheduler) forward(seqs []model.Seq, rows []*seq) (wait func() ([]backend.Sampled, error), emb [][]float32, err error) {
	logits, err := s.m.Forward(seqs)
	s.flush() // while the device runs this pass
	if err != nil {
		return nil, nil, err
	}
	if len(rows) == 0 {
		return nil, nil, nil
	}
	if s.e.cfg.Embedding != nil {
		emb, err := s.embeddings(logits)
		return nil, emb, err
	}
	params := make([]backend.SampleParams, len(rows))
	for i, q := range rows {
		p := q.params
		// One draw per sampled token, whatever else is in the batch: the
		// same seed gives the same tokens.
		p.Uniform = q.rng.Float32()
		if !p.Penalized() {
			params[i] = p
			continue // the counts would change nothing, and cost the sampler a copy of the row
		}
		for t, c := range q.counts {
			p.Counts = append(p.Counts, backend.TokenCount{Token: t, Count: c, Prompt: q.inPrompt[t]})
		}
		for t := range q.inPrompt {
			if q.counts[t] == 0 {
				p.Counts = append(p.Counts, backend.TokenCount{Token: t, Prompt: true})
			}
		}
		params[i] = p
	}
	s.masks(rows, params)
	wait, err = s.m.SampleStart(logits, params)
	return wait, nil, err
}

// embeddings reads an embedding model's output rows (final normed hidden
// states of the prompts' last tokens) and L2-normalises them when the
// model's Normalize module says so, as torch's F.normalize does.
func (s *scheduler) embeddings(out backend.Tensor) ([][]float32, error) {
	R, H := out.Shape()[0], out.Shape()[1]
	buf := make([]byte, 4*R*H)
	if err := s.m.Backend().Read(out, buf); err != nil {
		return nil, err
	}
	rows := make([][]float32, R)
	for r := range rows {
		v := make([]float32, H)
		for i := range v {
			v[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*(r*H+i):]))
		}
		if s.e.cfg.Embedding.Normalize {
			Normalize(v)
		}
		rows[r] = v
	}
	return rows, nil
}

// Normalize scales v to unit length (a zero vector stays zero), summing in
// float64.
func Normalize(v []float32) {
	var ss float64
	for _, x := range v {
		ss += float64(x) * float64(x)
	}
	n := max(math.Sqrt(ss), 1e-12)
	for i := range v {
		v[i] = float32(float64(v[i]) / n)
	}
}

// masks sets the token masks of the rows that have one, computing them at
// the same time when there are several (a mask that meets new states of
// its grammar walks the vocabulary, which takes a millisecond or two).
func (s *scheduler) masks(rows []*seq, params []backend.SampleParams) {
	var masked []int
	for i, q := range rows {
		if q.mask != nil {
			masked = append(masked, i)
		}
	}
	if len(masked) == 1 {
		params[masked[0]].Mask = s.allowed(rows[masked[0]])
		return
	}
	var wg sync.WaitGroup
	for _, i := range masked {
		wg.Go(func() { params[i].Mask = s.allowed(rows[i]) })
	}
	wg.Wait()
}

// allowed asks q's mask which tokens may follow its generated ones and
// returns them as the sampler's mask (nil: any). When it allows none, the
// verdict is left in q.maskEnd, the row is sampled unmasked and its token
// dropped.
func (s *scheduler) allowed(q *seq) []uint64 {
	if q.maskBits == nil {
		q.maskBits = make([]uint64, backend.MaskWords(s.e.cfg.VocabSize))
	} else {
		clear(q.maskBits)
	}
	q.maskEnd = maskGoes
	a := q.mask.Allow(q.tokens[q.nPrompt:], q.maskBits)
	if a == AllowAny {
		return nil
	}
	if a == AllowSetOrEnd {
		for t := range q.stopIDs {
			q.maskBits[t>>6] |= 1 << (t & 63)
		}
	}
	if V := s.e.cfg.VocabSize; V%64 != 0 {
		q.maskBits[len(q.maskBits)-1] &= 1<<(V%64) - 1 // no token past the vocabulary
	}
	for _, w := range q.maskBits {
		if w != 0 {
			return q.maskBits
		}
	}
	q.maskEnd = maskEmpty
	if a == AllowSetOrEnd {
		q.maskEnd = maskComplete
	}
	return nil
}

// flush emits the held tokens of the last pass.
func (s *scheduler) flush() {
	for _, h := range s.held {
		if !h.q.done {
			s.emit(h.q, h.smp)
		}
	}
	clear(s.held)
	s.held = s.held[:0]
}

// snapshotPoints are the positions in (pos, n) of an n-token prompt where a
// hybrid sequence's state is saved: the checkpoints (the start of each
// message), and the last block boundary before the prompt's end when the
// last of those is a block or more before it, so that a request that goes
// another way anywhere in the prompt recomputes at most a block beyond the
// place it diverged (plus the message start, for a changed message). A
// pass leaves the state at each point inside it where the model can
// capture states (see chunk), and ends at a point elsewhere (an extra pass
// per point: a follow-up chat turn adds two, its user message's start and
// the last block boundary).
func snapshotPoints(checkpoints []int, pos, n, blockSize int) []int {
	var pts []int
	last := pos
	for _, c := range checkpoints {
		if c > last && c < n {
			pts = append(pts, c)
			last = c
		}
	}
	if n-1-last >= blockSize {
		pts = append(pts, (n-1)/blockSize*blockSize)
	}
	return pts
}

// pointAfter returns the first position after pos where q's state is
// saved: one of its points or a multiple of SnapshotInterval; MaxInt when
// none.
func (s *scheduler) pointAfter(q *seq, pos int) int {
	next := math.MaxInt
	if i, _ := slices.BinarySearch(q.points, pos+1); i < len(q.points) {
		next = q.points[i]
	}
	if iv := s.e.opts.SnapshotInterval; iv > 0 {
		next = min(next, (pos/iv+1)*iv)
	}
	return next
}

// chunk returns how many of q's next n tokens its pass takes, and where in
// them the pass leaves q's state: each point inside the chunk takes a
// capture slot from free, and the chunk ends at the first point that finds
// none (at every point, where the model cannot capture), so that the state
// there is saved after the pass.
func (s *scheduler) chunk(q *seq, n int, free *[]int) (int, []backend.Capture) {
	var caps []backend.Capture
	for p := s.pointAfter(q, q.pos); p < q.pos+n; p = s.pointAfter(q, p) {
		if len(*free) == 0 {
			return p - q.pos, caps
		}
		slot := (*free)[len(*free)-1]
		*free = (*free)[:len(*free)-1]
		caps = append(caps, backend.Capture{Offset: p - q.pos, Slot: slot})
	}
	return n, caps
}

// atPoint reports whether q's state is to be saved after its computed
// tokens, and as what kind of snapshot (and moves past the point).
func (s *scheduler) atPoint(q *seq) (bool, kvcache.SnapshotKind) {
	kind := q.pointKind(q.pos)
	for len(q.points) > 0 && q.points[0] <= q.pos {
		q.points = q.points[1:]
	}
	iv := s.e.opts.SnapshotInterval
	return kind == kvcache.Point || (iv > 0 && q.pos%iv == 0), kind
}

// pointKind is the kind of snapshot q's state after pos tokens is: a
// Point at one of its points (a message start, the last block boundary
// before the prompt's end), else an Interval.
func (q *seq) pointKind(pos int) kvcache.SnapshotKind {
	if _, found := slices.BinarySearch(q.points, pos); found {
		return kvcache.Point
	}
	return kvcache.Interval
}

// snapshot saves a hybrid sequence's state after its computed tokens.
func (s *scheduler) snapshot(q *seq, kind kvcache.SnapshotKind) *kvcache.Snapshot {
	return s.snapshotOf(q, q.pos, q.slot, kind)
}

// snapshotOf saves q's state after its first n tokens, which state slot
// from holds (q's own, or a capture's).
func (s *scheduler) snapshotOf(q *seq, n, from int, kind kvcache.SnapshotKind) *kvcache.Snapshot {
	if !q.saved {
		// Parent eviction, at a request's first snapshot: the turn before
		// the one it resumed from (unless another request branched from
		// that one too) is no longer needed. A conversation holds its last
		// two turns: the places where they may be edited, and their ends.
		q.saved = true
		if gp, _ := s.snaps.Parent(q.parent); gp != 0 {
			if _, children := s.snaps.Parent(gp); children <= 1 {
				s.snaps.DropGroup(gp)
			}
		}
	}
	sn, err := s.snaps.Save(q.tokens[:n], from, q.table.Blocks(), q.group, q.parent, kind)
	if err != nil {
		s.e.log.Warn("state snapshot not kept", "seq", q.id, "bytes", s.m.SlotBytes(), "err", err)
	}
	return sn
}

// idleWork does one piece of the work kept for when no request runs or
// waits, and reports whether there was any, or else how long until there
// may be: a snapshot moves from a device slot to host memory while fewer
// than idleFreeSlots are free (so that the next prefill's snapshots are
// copies on the device, not waits for it), and once the engine has idled
// for spillAfter, the latest state of a conversation goes to the state
// cache, then the other places it may be edited.
func (s *scheduler) idleWork() (bool, time.Duration) {
	if s.snaps != nil {
		if free := s.snaps.FreeSlots(); free < min(idleFreeSlots, s.e.opts.SnapshotSlots) {
			s.snaps.Offload(free + 1)
			if s.snaps.FreeSlots() > free {
				return true, 0
			}
		}
	}
	if s.store == nil {
		return false, 0
	}
	if wait := s.e.opts.spillAfter - time.Since(s.idleSince); wait > 0 {
		return false, wait
	}
	return s.spillOne(true), 0
}

// idleFreeSlots is how many spare state slots the scheduler frees when idle:
// a chat turn saves two or three snapshots.
const idleFreeSlots = 4

// finish ends a sequence: it leaves the queues, gives back its blocks and
// slot (after a last snapshot when it completed), and its stream gets the
// final event.
func (s *scheduler) finish(q *seq, reason FinishReason, err error) {
	s.finishWith(q, reason, err, Event{})
}

func (s *scheduler) finishWith(q *seq, reason FinishReason, err error, ev Event) {
	if q.done {
		return
	}
	q.done = true
	if q.stored != nil { // it waited for blocks to restore a prefix into
		s.unstage(q.stored)
		q.stored = nil
	}
	s.running = slices.DeleteFunc(s.running, func(x *seq) bool { return x == q })
	if i := slices.Index(s.waiting, q); i >= 0 {
		s.waiting = slices.Delete(s.waiting, i, i+1)
		if !q.admitted {
			s.e.mu.Lock()
			s.e.queued--
			s.e.mu.Unlock()
			q.admitted = true
		}
	}
	if q.table != nil && !s.e.opts.NoCache && (reason == FinishStop || reason == FinishLength) {
		if s.hybrid {
			s.snapshot(q, kvcache.Tip)
		} else {
			s.prefix.Insert(&q.chain, q.tokens[:q.pos], q.table.Blocks())
		}
	}
	s.release(q)
	q.stopWatch()
	now := time.Now()
	if q.lastTok.IsZero() {
		q.lastTok = now
	}
	u := &Usage{
		PromptTokens:     q.nPrompt,
		CachedTokens:     q.cached,
		CompletionTokens: len(q.tokens) - q.nPrompt,
		Duration:         q.lastTok.Sub(q.submitted),
	}
	if !q.started.IsZero() {
		u.Queued = q.started.Sub(q.submitted)
	}
	if !q.firstTok.IsZero() {
		u.TTFT = q.firstTok.Sub(q.submitted)
		if d := q.lastTok.Sub(q.firstTok); u.CompletionTokens > 1 && d > 0 {
			u.DecodeTokensPerS = float64(u.CompletionTokens-1) / d.Seconds()
		}
	}
	ev.Done, ev.Finish, ev.Usage, ev.Err = true, reason, u, err
	if !q.prefillOnly {
		s.completed++
	}
	// A caller that has seen the final event sees its effect in Stats.
	s.publish()
	q.out.push(ev)
}

// shutdown ends every request when the engine closes.
func (s *scheduler) shutdown() {
	s.flush()
	s.intake()
	for len(s.running) > 0 {
		s.finish(s.running[0], FinishCancelled, ErrClosed)
	}
	for len(s.waiting) > 0 {
		s.finish(s.waiting[0], FinishCancelled, ErrClosed)
	}
	s.reads.Wait() // no read outlives the store
	s.land()
	// What the state cache lacks of each conversation goes there before
	// the caches are let go: the latest past, then the places where it may
	// be edited, as an idle engine copies them. A restarted server knows
	// the answers by their text only: where one re-tokenizes to other ids
	// than those generated, the conversation resumes from the start of
	// that message.
	for s.spillOne(true) {
	}
	if s.prefix != nil {
		s.prefix.Clear()
	}
	if s.snaps != nil {
		s.snaps.Clear()
	}
	if s.store != nil {
		s.store.Close()
	}
	s.publish()
}

// publish copies the scheduler's counters to the engine's Stats.
func (s *scheduler) publish() {
	e := s.e
	e.mu.Lock()
	st := &e.stats
	st.Running, st.Waiting = len(s.running), len(s.waiting)+len(e.incoming)
	st.KVBlocksUsed = s.alloc.Used()
	if s.prefix != nil {
		st.KVBlocksCached = s.prefix.Len()
	}
	st.CacheHitTokens = s.hitTokens
	st.Preemptions = s.preemptions
	st.RecomputedTokens = s.recomputed
	st.RequestsCompleted = s.completed
	st.GeneratedTokens = s.generated
	st.Steps, st.StepTokens, st.StepTime = s.steps, s.stepTokens, s.stepTime
	st.DecodeSteps, st.DecodeTokens, st.DecodeStepTime = s.decodeSteps, s.decodeTokens, s.decodeTime
	st.AheadSteps = s.aheadSteps
	st.HostTime = s.hostTime
	if s.snaps != nil {
		st.StateSnapshots, st.StateOnDevice, st.StateBytes = s.snaps.Len(), s.snaps.DeviceSlots(), s.snaps.Bytes()
		st.KVBlocksCached = s.snaps.Blocks()
	}
	if s.store != nil {
		cs := s.store.Stats()
		st.StateCacheEntries, st.StateCacheRAMBytes, st.StateCacheDiskBytes = cs.Entries, cs.RAMBytes, cs.DiskBytes
		st.StateCacheRestores, st.StateCacheRestoredTokens = cs.Restores, cs.RestoredTokens
	}
	e.mu.Unlock()
}

// checkAccounting verifies that every block's reference count equals the
// references the running sequences and the caches hold, and that the
// snapshots are within their budget. Tests run it after every step.
func (s *scheduler) checkAccounting() error {
	want := make([]int, s.alloc.Blocks())
	count := func(b int32) { want[b]++ }
	for _, q := range s.running {
		for _, b := range q.table.Blocks() {
			count(b)
		}
	}
	for _, q := range s.waiting {
		if q.table != nil {
			return fmt.Errorf("waiting sequence %d holds blocks", q.id)
		}
	}
	if s.prefix != nil {
		s.prefix.Holders(count)
	}
	if s.snaps != nil {
		s.snaps.Holders(count)
		if s.snaps.Bytes() > s.snaps.Budget() {
			return fmt.Errorf("snapshots hold %d bytes, over their budget of %d", s.snaps.Bytes(), s.snaps.Budget())
		}
	}
	for b, n := range want {
		if got := s.alloc.Refs(int32(b)); got != n {
			return fmt.Errorf("block %d: %d references counted, %d holders", b, got, n)
		}
	}
	if free := len(s.slots) + len(s.running); s.hybrid && free != s.e.opts.MaxRunning {
		return fmt.Errorf("%d free slots + %d running != %d slots", len(s.slots), len(s.running), s.e.opts.MaxRunning)
	}
	return nil
}
