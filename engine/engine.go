// Package engine serves generation requests on one model: token ids in,
// token ids, their text and finish reasons out. A scheduler goroutine runs
// continuous batching over a paged KV cache (package kvcache), reuses
// computed prefixes and hybrid models' saved state across requests, samples
// per request, detokenizes and matches stop strings. Templates, tool calls
// and reasoning are the session's (package session).
//
// # Scheduling
//
// Requests wait in a FCFS queue and join the running batch (at most
// MaxRunning sequences) as soon as a sequence's whole remaining prompt fits
// in free KV blocks, leaving one block per running sequence. Each step runs
// one forward pass of at most MaxBatchTokens tokens: every decoding sequence
// advances by one token, and prompts being prefilled share the rest in
// chunks, oldest first, so a long prompt never stalls running streams. When a
// decoding sequence needs a block and none is left, even after the caches
// gave theirs back, the youngest running sequence is preempted: its blocks
// and slot are freed and it goes back to the head of the queue, to be
// recomputed (prompt and generated tokens, from whatever the caches still
// hold) when admitted again. A sequence that does not fit alone fails with
// ErrKVFull.
//
// # Reuse
//
// Dense and MoE models keep every full KV block in a prefix cache keyed by a
// hash chain of its tokens; a request starts after the longest cached prefix
// (its last prompt token is always computed, for its logits; a shared block
// it writes is copied first), so a request that diverges from an earlier one
// recomputes at most the block it diverges in. Hybrid models cannot truncate
// their DeltaNet state, so they resume only from a state snapshot taken at
// exactly the prefix. Snapshots are taken where requests go different ways
// (Points): at each of the prompt's checkpoints (the session gives the start
// of each message) and at the last block boundary before the prompt's end,
// when the last checkpoint is a block or more before it, so that an edited
// or re-rendered answer, a regenerated reply or an edited message resumes at
// most a block before the change, or at the start of the changed message;
// and every SnapshotInterval tokens of a long prompt or answer. A request's
// end (Tip) is snapshotted too, for its next turn. Saving and restoring is a
// copy between device state slots (SnapshotSlots), queued with the passes;
// the least recently used snapshots move to host memory (within
// StateMemory, LRU) when the slots run out and when the engine idles.
// Parent eviction keeps a conversation to the snapshots of its last two
// turns: a request's first snapshot drops those of the turn before the one
// it resumed from (unless another request branched from that one).
//
// With a state cache (Options.StateCache), what the caches let go is kept in
// host memory and on disk, and admission restores the longest prefix stored
// there when it is a block or more beyond what the device holds (see
// StateCache).
//
// An Engine is safe for use by many goroutines.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/kvcache"
	"github.com/kiln-llm/kiln/model"
	"github.com/kiln-llm/kiln/tokenizer"
)

// Options configure an Engine. Zero fields take the defaults named.
type Options struct {
	BlockSize int   // tokens per KV block; 16
	KVBlocks  int   // KV blocks; 0: as many as KVMemory holds
	KVMemory  int64 // bytes for the KV cache when KVBlocks is 0; 1 GiB
	// MaxBatchTokens is the token budget of one step: decoding sequences
	// take one token each, prompts being prefilled share the rest in chunks.
	// 256.
	MaxBatchTokens int
	MaxRunning     int // sequences in the running batch; 16, or MaxBatchTokens when smaller
	MaxQueue       int // requests waiting for admission before Generate fails with ErrQueueFull; 1024
	// StateMemory bounds the host memory of hybrid models' state snapshots;
	// 1 GiB.
	StateMemory int64
	// SnapshotSlots are device state slots for hybrid models' latest
	// snapshots, beside the running sequences' (saving and restoring one
	// is then a copy on the device, queued with the passes); they move to
	// host memory when these run out, and when the engine idles beyond
	// the last four. MaxRunning, at most a quarter of KVMemory; -1: none.
	SnapshotSlots int
	// SnapshotInterval: hybrid models also snapshot their state each time a
	// prompt's prefill crosses a multiple of this many tokens (rounded up
	// to whole blocks); 1024. -1: only
	// at the ends of prompts and answers.
	SnapshotInterval int
	// NoCache turns prefix and state reuse off: every request computes its
	// whole prompt (for measurements and debugging).
	NoCache bool
	// StateCache keeps conversations the device lets go in host memory and
	// on disk (off when neither Dir nor RAMBytes is set, or with NoCache).
	StateCache StateCache
	Logger     *slog.Logger // nil: slog.Default()

	checkAccounting bool          // tests: verify block accounting after every step
	overlap         bool          // tests: hold tokens over the next pass on any backend
	spillAfter      time.Duration // tests: the idle time before spilling to the state cache (0: spillAfter)
}

func (o *Options) setDefaults() error {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.BlockSize, 16)
	def(&o.MaxBatchTokens, 256)
	def(&o.MaxRunning, min(16, o.MaxBatchTokens)) // every running sequence needs a token per step
	def(&o.MaxQueue, 1024)
	def(&o.SnapshotInterval, 1024)
	if o.SnapshotInterval > 0 {
		// Whole blocks: a boundary snapshot then shares only full blocks
		// with the prefill that goes on.
		o.SnapshotInterval = (o.SnapshotInterval + o.BlockSize - 1) / o.BlockSize * o.BlockSize
	}
	if o.KVMemory == 0 {
		o.KVMemory = 1 << 30
	}
	if o.StateMemory == 0 {
		o.StateMemory = 1 << 30
	}
	def(&o.SnapshotSlots, o.MaxRunning)
	if o.spillAfter == 0 {
		o.spillAfter = spillAfter
	}
	o.SnapshotSlots = max(o.SnapshotSlots, 0)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	switch {
	case o.BlockSize < 1 || o.MaxBatchTokens < 1 || o.MaxRunning < 1 || o.MaxQueue < 1 || o.KVBlocks < 0 || o.KVMemory < 0 || o.StateMemory < 0:
		return fmt.Errorf("engine: invalid options %+v", *o)
	case o.MaxRunning > o.MaxBatchTokens:
		return fmt.Errorf("engine: MaxRunning %d exceeds MaxBatchTokens %d: every running sequence needs a token per step", o.MaxRunning, o.MaxBatchTokens)
	}
	return nil
}

// Engine runs requests on one model. See Generate.
type Engine struct {
	m    *model.Model
	tok  *tokenizer.Tokenizer
	opts Options
	cfg  *model.Config
	log  *slog.Logger

	mu       sync.Mutex
	closed   bool
	incoming []*seq
	queued   int // requests submitted and not yet admitted
	stats    Stats
	nextID   uint64

	wake    chan struct{}
	quit    chan struct{}
	done    chan struct{}
	inspect chan func() // run by the scheduler (Conversations)
	store   *kvcache.Store

	// Owned by the scheduler goroutine.
	sched *scheduler
}

// New starts an engine on m. tok detokenizes the streams; without it
// (nil) they carry tokens without text, and stop strings are refused. New
// allocates the model's KV cache (and state slots for hybrid models).
func New(m *model.Model, tok *tokenizer.Tokenizer, opts Options) (*Engine, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	cfg := m.Config()
	if !m.Hybrid() || opts.NoCache {
		opts.SnapshotSlots = 0
	} else if sb := int64(m.SlotBytes()); sb > 0 {
		opts.SnapshotSlots = int(min(int64(opts.SnapshotSlots), opts.KVMemory/4/sb))
	}
	if opts.KVBlocks == 0 {
		per := m.KVBytesPerToken() * int64(opts.BlockSize)
		if per <= 0 {
			return nil, fmt.Errorf("engine: model reports %d KV bytes per token", m.KVBytesPerToken())
		}
		// More than every running sequence at full context (twice over,
		// for the caches) would never be used.
		ctxBlocks := (cfg.ContextLength + opts.BlockSize - 1) / opts.BlockSize
		kvMem := opts.KVMemory - int64(opts.SnapshotSlots)*int64(m.SlotBytes())
		opts.KVBlocks = int(min(kvMem/per, int64(2*opts.MaxRunning*ctxBlocks)))
		if opts.KVBlocks < 1 {
			return nil, fmt.Errorf("engine: KVMemory %d bytes holds no block of %d bytes", opts.KVMemory, per)
		}
	}
	if err := m.AllocCache(model.CacheSpec{Blocks: opts.KVBlocks, BlockSize: opts.BlockSize, Slots: opts.MaxRunning + opts.SnapshotSlots}); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	e := &Engine{
		m: m, tok: tok, opts: opts, cfg: cfg, log: opts.Logger,
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}), inspect: make(chan func()),
	}
	if opts.StateCache.enabled() && !opts.NoCache {
		st, err := openStore(m, &e.opts)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		e.store = st
	}
	e.sched = newScheduler(e)
	e.stats.KVBlocksTotal = opts.KVBlocks
	opts.Logger.Info("engine started", "model", cfg.Name, "kv_blocks", opts.KVBlocks, "block_size", opts.BlockSize,
		"max_batch_tokens", opts.MaxBatchTokens, "max_running", opts.MaxRunning, "hybrid", m.Hybrid())
	go e.sched.loop()
	return e, nil
}

// Options returns the options in effect (defaults filled in).
func (e *Engine) Options() Options { return e.opts }

// Generate submits a request and returns its stream. It fails at once for
// invalid requests (a *SamplingError for sampling parameters out of
// bounds), prompts that do not fit the context (ErrContextOverflow), a full
// queue (ErrQueueFull), a closed engine (ErrClosed) and a prefill-only
// request while others wait (ErrBusy). Cancelling ctx ends the stream with
// FinishCancelled and frees what the request held.
func (e *Engine) Generate(ctx context.Context, req *Request) (*Stream, error) {
	s, err := e.prepare(req)
	if err != nil {
		return nil, err
	}
	s.ctx = ctx
	s.submitted = time.Now()
	e.mu.Lock()
	switch {
	case e.closed:
		e.mu.Unlock()
		return nil, ErrClosed
	case e.queued >= e.opts.MaxQueue:
		e.mu.Unlock()
		return nil, ErrQueueFull
	case s.prefillOnly && e.queued > 0:
		e.mu.Unlock()
		return nil, ErrBusy
	}
	// Wake the scheduler when the request is cancelled, to free it at once.
	s.stopWatch = context.AfterFunc(ctx, e.poke)
	e.nextID++
	s.id = e.nextID
	e.queued++
	if !s.prefillOnly {
		e.stats.PromptTokens += int64(s.nPrompt)
	}
	s.out = newStream(ctx)
	e.incoming = append(e.incoming, s)
	e.mu.Unlock()
	e.poke()
	return s.out, nil
}

// poke wakes the scheduler.
func (e *Engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// prepare validates a request and turns it into a sequence (without its
// stream and context).
func (e *Engine) prepare(req *Request) (*seq, error) {
	sp := &req.Sampling
	if err := sp.Validate(); err != nil {
		return nil, err
	}
	if e.tok == nil && len(sp.Stop) > 0 {
		return nil, errors.New("engine: stop strings need a tokenizer")
	}
	ids := req.Prompt
	V := e.cfg.VocabSize
	inVocab := func(what string, t int32) error {
		if t < 0 || int(t) >= V {
			return fmt.Errorf("engine: %s token %d outside the vocabulary of %d", what, t, V)
		}
		return nil
	}
	for _, t := range ids {
		if err := inVocab("prompt", t); err != nil {
			return nil, err
		}
	}
	if len(ids) == 0 {
		return nil, errors.New("engine: empty prompt")
	}
	if len(ids)+1 > e.cfg.ContextLength {
		return nil, fmt.Errorf("%w: %d prompt tokens, context %d", ErrContextOverflow, len(ids), e.cfg.ContextLength)
	}
	for i, c := range req.Checkpoints {
		if c < 0 || c >= len(ids) || (i > 0 && c <= req.Checkpoints[i-1]) {
			return nil, fmt.Errorf("engine: checkpoints %v: not ascending positions inside the %d-token prompt", req.Checkpoints, len(ids))
		}
	}
	s := &seq{
		checkpoints: req.Checkpoints,
		mask:        req.Mask,
		prefillOnly: req.PrefillOnly,
		tokens:      append(make([]int32, 0, len(ids)+64), ids...),
		nPrompt:     len(ids),
		slot:        -1,
		stopIDs:     map[int32]bool{},
		counts:      map[int32]int32{},
		stop:        stopMatcher{stops: sp.Stop},
	}
	if !sp.IgnoreEOS {
		for _, t := range e.cfg.EOS {
			s.stopIDs[t] = true
		}
	}
	for _, t := range sp.StopTokenIDs {
		if err := inVocab("stop", t); err != nil {
			return nil, err
		}
		s.stopIDs[t] = true
	}
	s.maxLen = e.cfg.ContextLength
	if sp.MaxTokens > 0 {
		s.maxLen = min(s.maxLen, len(ids)+sp.MaxTokens)
	}
	s.params = backend.SampleParams{
		Temperature: sp.Temperature, TopK: sp.TopK, TopP: sp.TopP, MinP: sp.MinP,
		PresencePenalty: sp.PresencePenalty, FrequencyPenalty: sp.FrequencyPenalty, RepetitionPenalty: sp.RepetitionPenalty,
		Logprob: sp.Logprobs, TopLogprobs: sp.TopLogprobs,
	}
	for t, b := range sp.LogitBias {
		if err := inVocab("logit bias", t); err != nil {
			return nil, err
		}
		s.params.Bias = append(s.params.Bias, backend.TokenBias{Token: t, Bias: b})
	}
	if rp := sp.RepetitionPenalty; rp != 0 && rp != 1 {
		// The repetition penalty covers the prompt as well (as in vLLM and
		// Hugging Face); presence and frequency only what is generated.
		s.inPrompt = map[int32]bool{}
		for _, t := range ids {
			s.inPrompt[t] = true
		}
	}
	seed := rand.Uint64()
	if sp.Seed != nil {
		seed = *sp.Seed
	}
	s.rng = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	if e.tok != nil {
		s.dec = e.tok.NewDecoder()
	}
	return s, nil
}

// Stats returns the engine's counters as of its last scheduling step or
// finished request.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats
}

// Close cancels every request (their streams end with FinishCancelled and
// ErrClosed), waits for the scheduler to stop and frees the caches. Later
// Generate calls fail with ErrClosed.
func (e *Engine) Close() error {
	e.mu.Lock()
	if !e.closed {
		e.closed = true
		close(e.quit)
	}
	e.mu.Unlock()
	<-e.done
	return nil
}
