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
// in free KV blocks (blocks the caches could give back count as free),
// leaving one block per running sequence. Each step runs
// one forward pass of at most MaxBatchTokens tokens: every decoding sequence
// advances by one token, and prompts being prefilled share the rest in
// chunks, oldest first, so a long prompt never stalls running streams. When a
// decoding sequence needs a block and none is left, even after the caches
// gave theirs back, the youngest running sequence is preempted: its blocks
// and slot are freed and it goes back to the head of the queue, to be
// recomputed (prompt and generated tokens, from whatever the caches still
// hold) when admitted again. The context a request may fill (Context) is
// at most what the cache holds for one sequence, so every sequence fits
// alone and runs to its end.
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
// StateCache), read in the background while the other requests go on.
//
// An Engine is safe for use by many goroutines.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
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
	BlockSize int // tokens per KV block; 16
	KVBlocks  int // KV blocks; 0: as many as KVMemory holds
	// KVMemory is the device memory for the KV cache and hybrid models'
	// state slots (running sequences', snapshots' and captures'), when
	// KVBlocks is 0; 1 GiB.
	KVMemory int64
	// Context bounds one sequence, prompt and answer; 0: the model's
	// context length. Either way the engine's context (Engine.Context) is
	// at most what the KV cache holds for one sequence, so that a request
	// it accepts can always run to its end; New refuses a Context the
	// model or the cache cannot give.
	Context int
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
	// WarmUp runs a prompt of this many tokens (at most MaxBatchTokens),
	// a decode step and passes of follow-up turns' sizes after it (warmUp),
	// through the model before New returns: a GPU loads its kernels, plans
	// its products and sizes its buffers then, not in the first requests'
	// time to first token. 0: none.
	WarmUp int
	Logger *slog.Logger // nil: slog.Default()

	checkAccounting bool          // tests: verify block accounting after every step
	overlap         bool          // tests: hold tokens over the next pass on any backend
	noAhead         bool          // tests: no decode pass issued before the last one's tokens reach the host
	beyondCache     bool          // tests: a context beyond the KV cache, so that a lone sequence can outgrow it
	spillAfter      time.Duration // tests: the idle time before spilling to the state cache (0: spillAfter)
	beforeRead      func()        // tests: runs before each read of the state cache, on the reading goroutine
	prefillRate     float64       // tests: the prefill rate worthRestoring assumes, tokens a second (0: measured)
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
	case o.BlockSize < 1 || o.MaxBatchTokens < 1 || o.MaxRunning < 1 || o.MaxQueue < 1 || o.KVBlocks < 0 || o.KVMemory < 0 || o.StateMemory < 0 || o.Context < 0:
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
	// ctx is the most tokens of one sequence, and ctxLimit what bounds it.
	ctx      int
	ctxLimit ContextLimit
	// captures is how many state slots, after the sequences' and the
	// snapshots', a pass may leave states in (captureSlots; none where the
	// model cannot capture states).
	captures int
	slots    int // every state slot: the sequences', the snapshots' and the captures'

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
	// warmRate is the warm-up's prompt rate, tokens a second (0: none).
	warmRate float64

	// Owned by the scheduler goroutine.
	sched *scheduler
}

// stateSlots sets opts.SnapshotSlots to none where m keeps no snapshots,
// and returns the capture slots m takes.
func stateSlots(m *model.Model, opts *Options) (captures int) {
	if !m.Hybrid() || opts.NoCache {
		opts.SnapshotSlots = 0
	}
	if m.CapturesStates() && !opts.NoCache {
		captures = captureSlots
	}
	return captures
}

// MemoryFor is the KVMemory with which New gives opts.Context (the model's
// context length when 0) to one sequence: its KV blocks, the spare block
// and every state slot New would take (snapshot slots counted as the
// option asks, before New bounds them by the memory).
func MemoryFor(m *model.Model, opts Options) (int64, error) {
	if err := opts.setDefaults(); err != nil {
		return 0, err
	}
	ctx := opts.Context
	if ctx == 0 {
		ctx = m.Config().ContextLength
	}
	captures := stateSlots(m, &opts)
	blocks := int64((ctx+opts.BlockSize-1)/opts.BlockSize + 1)
	return blocks*int64(opts.BlockSize)*m.KVBytesPerToken() + int64(opts.MaxRunning+opts.SnapshotSlots+captures)*int64(m.SlotBytes()), nil
}

// New starts an engine on m. tok detokenizes the streams; without it
// (nil) they carry tokens without text, and stop strings are refused. New
// allocates the model's KV cache (and state slots for hybrid models).
func New(m *model.Model, tok *tokenizer.Tokenizer, opts Options) (*Engine, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	cfg := m.Config()
	ctx, limit := cfg.ContextLength, LimitModel
	if opts.Context > 0 {
		if opts.Context > ctx {
			return nil, fmt.Errorf("engine: Context %d exceeds the model's context length of %d tokens", opts.Context, ctx)
		}
		ctx, limit = opts.Context, LimitOption
	}
	captures := stateSlots(m, &opts)
	if sb := int64(m.SlotBytes()); sb > 0 {
		opts.SnapshotSlots = int(min(int64(opts.SnapshotSlots), opts.KVMemory/4/sb))
	}
	slots := opts.MaxRunning + opts.SnapshotSlots + captures
	if opts.KVBlocks == 0 {
		per := m.KVBytesPerToken() * int64(opts.BlockSize)
		if per <= 0 {
			return nil, fmt.Errorf("engine: model reports %d KV bytes per token", m.KVBytesPerToken())
		}
		// More than every running sequence at full context (twice over,
		// for the caches) would never be used.
		ctxBlocks := (ctx + opts.BlockSize - 1) / opts.BlockSize
		// The state slots come out of the same memory: a hybrid model's
		// running sequences hold theirs at any context (Qwen3-Next's is
		// ~75 MB), as the KV blocks are held by tokens.
		state := int64(slots) * int64(m.SlotBytes())
		opts.KVBlocks = int(min((opts.KVMemory-state)/per, int64(2*opts.MaxRunning*ctxBlocks)))
		if opts.KVBlocks < 1 {
			if state > 0 {
				return nil, fmt.Errorf("engine: KVMemory %d bytes holds %d sequences' recurrent state (%d bytes each) and no KV block of %d bytes besides", opts.KVMemory, slots, m.SlotBytes(), per)
			}
			return nil, fmt.Errorf("engine: KVMemory %d bytes holds no block of %d bytes", opts.KVMemory, per)
		}
	}
	// One sequence may take every block but one: the spare lets it copy a
	// block it shares with the prefix cache before writing it.
	if pool := (opts.KVBlocks - 1) * opts.BlockSize; pool < ctx && !opts.beyondCache {
		if limit == LimitOption {
			return nil, fmt.Errorf("engine: the KV cache holds a sequence of %d tokens, fewer than Context %d: give it more memory or ask for less context", max(pool, 0), ctx)
		}
		ctx, limit = pool, LimitKVCache
	}
	if ctx < 2 {
		return nil, fmt.Errorf("engine: a KV cache of %d blocks of %d tokens leaves no context", opts.KVBlocks, opts.BlockSize)
	}
	if err := m.AllocCache(model.CacheSpec{Blocks: opts.KVBlocks, BlockSize: opts.BlockSize, Slots: slots}); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	e := &Engine{
		m: m, tok: tok, opts: opts, cfg: cfg, log: opts.Logger, ctx: ctx, ctxLimit: limit, captures: captures, slots: slots,
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}), inspect: make(chan func()),
	}
	if opts.StateCache.enabled() && !opts.NoCache {
		st, err := openStore(m, &e.opts)
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		e.store = st
	}
	if opts.WarmUp > 0 {
		start := time.Now()
		var err error
		if e.warmRate, err = warmUp(m, &opts, ctx); err != nil {
			if e.store != nil {
				e.store.Close() // its directory's lock
			}
			return nil, fmt.Errorf("engine: warming up: %w", err)
		}
		opts.Logger.Info("engine warmed up", "prompt_tokens", min(opts.WarmUp, opts.MaxBatchTokens), "prefill_tok_s", math.Round(e.warmRate),
			"took", time.Since(start).Round(time.Millisecond))
	}
	e.sched = newScheduler(e)
	e.stats.KVBlocksTotal = opts.KVBlocks
	opts.Logger.Info("engine started", "model", cfg.Name, "kv_blocks", opts.KVBlocks, "block_size", opts.BlockSize,
		"max_batch_tokens", opts.MaxBatchTokens, "max_running", opts.MaxRunning, "context", ctx, "context_limit", limit, "hybrid", m.Hybrid())
	go e.sched.loop()
	return e, nil
}

// warmUp runs Options.WarmUp's prompt (twice) and one decode step, greedy,
// and returns the second prompt pass's tokens a second. It runs them in the
// first KV blocks and state slot, which the requests then overwrite (a
// sequence at position 0 starts from a fresh state), then passes of 32,
// 64, ... 256 tokens after them where the context and the cache allow: the
// sizes of follow-up turns, whose products a GPU runs with kernels chosen
// by token count and loaded at their first launch (on an H200 the first
// turns of each size paid 3-6 ms a product for them). The tokens spread
// over the vocabulary, so that an MoE model routes them to many experts.
func warmUp(m *model.Model, o *Options, ctx int) (rate float64, err error) {
	n := min(o.WarmUp, o.MaxBatchTokens, ctx-1, (o.KVBlocks-1)*o.BlockSize-1)
	if n < 1 {
		return 0, nil
	}
	last := n + 1 // the prompt and the decode step's token
	var turns []int
	for s := turnWarmUpStep; s <= min(turnWarmUpMax, o.MaxBatchTokens) && last+s <= min(ctx-1, (o.KVBlocks-1)*o.BlockSize-1); s += turnWarmUpStep {
		turns = append(turns, s)
		last += s
	}
	vocab := m.Config().VocabSize
	tokens := make([]int32, max(n, turnWarmUpMax))
	for i := range tokens {
		tokens[i] = int32(i * 7919 % vocab)
	}
	blocks := make([]int32, (last+o.BlockSize-1)/o.BlockSize)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	// The prompt twice, the second timed (the first loads the kernels):
	// the prefill rate that weighs restoring a conversation from the state
	// cache against computing it (worthRestoring). Then a decode step.
	seq := model.Seq{Tokens: tokens[:n], Blocks: blocks, Logits: model.LastLogits}
	for i := range 3 {
		start := time.Now()
		logits, err := m.Forward([]model.Seq{seq})
		if err != nil || m.Config().Embedding != nil {
			return 0, err // an embedding model has no decode step
		}
		next, err := m.Sample(logits, []backend.SampleParams{{}})
		if err != nil {
			return 0, err
		}
		switch i {
		case 1:
			rate = float64(n) / time.Since(start).Seconds()
			seq.Pos += len(seq.Tokens)
			seq.Tokens = []int32{next[0].Token}
		case 2:
			seq.Pos++
		}
	}
	for _, s := range turns {
		seq.Tokens = tokens[:s]
		if _, err := m.Forward([]model.Seq{seq}); err != nil {
			return 0, err
		}
		seq.Pos += s
	}
	return rate, nil
}

// The follow-up turns' sizes warmUp runs: cuda's cuBLASLt buckets.
const turnWarmUpStep, turnWarmUpMax = 32, 256

// Options returns the options in effect (defaults filled in).
func (e *Engine) Options() Options { return e.opts }

// StateBytes is the memory of the state slots New allocated beside the KV
// cache (hybrid models; 0 for others).
func (e *Engine) StateBytes() int64 { return int64(e.slots) * int64(e.m.SlotBytes()) }

// Context returns the most tokens one sequence may hold, prompt and
// answer, and what bounds it: the model's context length, Options.Context
// or the KV cache.
func (e *Engine) Context() (int, ContextLimit) { return e.ctx, e.ctxLimit }

// VocabSize is the model's vocabulary: the tokens a TokenMask covers.
func (e *Engine) VocabSize() int { return e.cfg.VocabSize }

// EmbeddingInfo describes the embeddings of an embedding model.
type EmbeddingInfo struct {
	Dims       int  // components of an embedding
	MaxTokens  int  // the most tokens of an input
	Normalized bool // embeddings have unit length
}

// Embedding describes the model's embeddings; false for a generative model.
func (e *Engine) Embedding() (EmbeddingInfo, bool) {
	c := e.cfg.Embedding
	if c == nil {
		return EmbeddingInfo{}, false
	}
	info := EmbeddingInfo{Dims: e.cfg.Hidden, MaxTokens: e.cfg.ContextLength, Normalized: c.Normalize}
	if c.MaxTokens > 0 {
		info.MaxTokens = min(info.MaxTokens, c.MaxTokens)
	}
	return info, true
}

// Generate submits a request and returns its stream. It fails at once for
// invalid requests (a *SamplingError for sampling parameters out of
// bounds), prompts that do not fit the context (a *ContextError), a full
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
	switch embeds := e.cfg.Embedding != nil; {
	case embeds && !req.Embed && !req.PrefillOnly:
		return nil, ErrEmbeddingModel
	case req.Embed && !embeds:
		return nil, ErrNotEmbedding
	case req.Embed && req.Mask != nil:
		return nil, errors.New("engine: an embedding request has no token mask")
	}
	ctx, limit := e.ctx, e.ctxLimit
	switch {
	case req.Context < 0:
		return nil, fmt.Errorf("engine: a request's context must be positive, not %d", req.Context)
	case req.Context > 0 && req.Context < ctx:
		ctx, limit = req.Context, LimitRequest
	}
	n := len(ids)
	if req.Embed {
		// An embedding is the last position's hidden state: no token follows.
		if n > ctx {
			return nil, &ContextError{Prompt: n, Context: ctx, Limit: limit}
		}
	} else if n+1 > ctx || sp.MaxTokens > ctx-n && !req.ClampMaxTokens {
		return nil, &ContextError{Prompt: n, MaxTokens: sp.MaxTokens, Context: ctx, Limit: limit}
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
	s.maxLen = ctx
	if sp.MaxTokens > 0 && sp.MaxTokens < ctx-n {
		// Compared with the room left: n+MaxTokens would wrap around for
		// a max_tokens near 2^63.
		s.maxLen = n + sp.MaxTokens
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
