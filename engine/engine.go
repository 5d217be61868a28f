// Package engine serves generation requests on one model: a scheduler
// goroutine runs continuous batching over a paged KV cache (package
// kvcache), reuses computed prefixes and hybrid models' saved state across
// requests, samples per request and streams text, reasoning and tool calls.
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
// it writes is copied first). Hybrid models cannot truncate their DeltaNet
// state, so they resume only from a state snapshot taken at exactly the
// prefix: snapshots (host memory, LRU within StateMemory, each holding the KV
// blocks of its prefix) are taken at every SnapshotInterval of a long
// prompt, one token short of a prompt's end (which serves the same prompt
// again as well as any longer one) and at the end of an answer (which the
// next chat turn extends). A conversation holds one turn's snapshots: the
// first snapshot of a request drops those of the turn it resumed from, and
// each drops the request's earlier ones, except that the answer's keeps the
// prompt's as a fallback for templates that re-render the answer otherwise
// (without its reasoning, say).
//
// An Engine is safe for use by many goroutines.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/chat"
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
	// SnapshotInterval: hybrid models also snapshot their state each time a
	// prompt's prefill crosses a multiple of this many tokens (rounded up
	// to whole blocks); 1024. -1: only
	// at the ends of prompts and answers.
	SnapshotInterval int
	// NoCache turns prefix and state reuse off: every request computes its
	// whole prompt (for measurements and debugging).
	NoCache bool
	// PrepareNextTurn: when a chat request ends, the conversation is
	// rendered as its next turn will render it (templates drop an earlier
	// answer's reasoning, so the answer's own tokens do not match) and
	// prefilled, unless requests are waiting, so that the next turn finds
	// it cached.
	PrepareNextTurn bool
	Logger          *slog.Logger // nil: slog.Default()

	checkAccounting bool // tests: verify block accounting after every step
	overlap         bool // tests: hold tokens over the next pass on any backend
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
	tmpl *chat.Template
	opts Options
	cfg  *model.Config
	log  *slog.Logger

	mu       sync.Mutex
	closed   bool
	incoming []*seq
	queued   int // requests submitted and not yet admitted
	stats    Stats
	nextID   uint64

	wake chan struct{}
	quit chan struct{}
	done chan struct{}
	// nextTurns counts the goroutines preparing a conversation's next turn.
	nextTurns sync.WaitGroup

	// Owned by the scheduler goroutine.
	sched *scheduler
}

// New starts an engine on m. tok and tmpl may be nil: then only PromptIDs
// requests are served and streams carry tokens without text. New allocates
// the model's KV cache (and state slots for hybrid models).
func New(m *model.Model, tok *tokenizer.Tokenizer, tmpl *chat.Template, opts Options) (*Engine, error) {
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	cfg := m.Config()
	if opts.KVBlocks == 0 {
		per := m.KVBytesPerToken() * int64(opts.BlockSize)
		if per <= 0 {
			return nil, fmt.Errorf("engine: model reports %d KV bytes per token", m.KVBytesPerToken())
		}
		// More than every running sequence at full context (twice over,
		// for the caches) would never be used.
		ctxBlocks := (cfg.ContextLength + opts.BlockSize - 1) / opts.BlockSize
		opts.KVBlocks = int(min(opts.KVMemory/per, int64(2*opts.MaxRunning*ctxBlocks)))
		if opts.KVBlocks < 1 {
			return nil, fmt.Errorf("engine: KVMemory %d bytes holds no block of %d bytes", opts.KVMemory, per)
		}
	}
	if err := m.AllocCache(model.CacheSpec{Blocks: opts.KVBlocks, BlockSize: opts.BlockSize, Slots: opts.MaxRunning}); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	e := &Engine{
		m: m, tok: tok, tmpl: tmpl, opts: opts, cfg: cfg, log: opts.Logger,
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{}),
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
// invalid requests, prompts that do not fit the context (ErrContextOverflow),
// a full queue (ErrQueueFull) and a closed engine (ErrClosed). Cancelling ctx
// ends the stream with FinishCancelled and frees what the request held.
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
	var ids []int32
	var parser *chat.Parser
	var turn *chatTurn
	set := 0
	if len(req.Messages) > 0 {
		set++
	}
	if req.Prompt != "" {
		set++
	}
	if len(req.PromptIDs) > 0 {
		set++
	}
	if set != 1 {
		return nil, errors.New("engine: a request sets exactly one of Messages, Prompt and PromptIDs")
	}
	sp := &req.Sampling
	if err := sp.Validate(); err != nil {
		return nil, err
	}
	if e.tok == nil && (req.PromptIDs == nil || len(sp.Stop) > 0) {
		return nil, errors.New("engine: no tokenizer: only PromptIDs requests without stop strings are served")
	}
	switch {
	case len(req.Messages) > 0:
		if e.tmpl == nil {
			return nil, errors.New("engine: the model has no chat template")
		}
		agp := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
		text, err := e.tmpl.Render(&chat.RenderInput{Messages: req.Messages, Tools: req.Tools, AddGenerationPrompt: agp, Kwargs: req.TemplateKwargs})
		if err != nil {
			return nil, fmt.Errorf("engine: render chat template: %w", err)
		}
		thinking := agp && chat.OpensThinking(text)
		var start string
		if req.ForceToolCall != "" {
			if !agp || len(req.Tools) == 0 {
				return nil, errors.New("engine: ForceToolCall needs tools and the generation prompt")
			}
			name := req.ForceToolCall
			if name == "*" {
				name = ""
			}
			if start, err = e.tmpl.ToolCallStart(name); err != nil {
				return nil, fmt.Errorf("engine: %w", err)
			}
			if thinking {
				start = "\n</think>\n\n" + start // an empty reasoning, as Qwen writes one
			}
		}
		ids = e.tok.Encode(text + start)
		parser = chat.NewParser(chat.ParserOptions{Tools: req.Tools, InThinking: thinking})
		parser.Push(start) // the parser reads the forced start as generated: an open call
	case req.Prompt != "":
		ids = e.tok.Encode(req.Prompt)
	default:
		ids = req.PromptIDs
	}
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
	if e.opts.PrepareNextTurn && !e.opts.NoCache && len(req.Messages) > 0 {
		turn = &chatTurn{messages: slices.Clone(req.Messages), tools: req.Tools, kwargs: req.TemplateKwargs}
	}
	s := &seq{
		turn:        turn,
		prefillOnly: req.PrefillOnly,
		tokens:      append(make([]int32, 0, len(ids)+64), ids...),
		nPrompt:     len(ids),
		parser:      parser,
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
	e.nextTurns.Wait()
	return nil
}

// chatTurn is what a chat request's next turn is rendered from.
type chatTurn struct {
	messages []chat.Message
	tools    []chat.Tool
	kwargs   map[string]any
	// The answer as the client will send it back: its content and tool
	// calls, collected as they stream.
	content   strings.Builder
	toolCalls []chat.ToolCall
}

// prepareNextTurn prefills the conversation of a finished chat request as
// its next turn will start: the template is rendered with two different
// user messages after the answer, and the text they share is what any next
// turn begins with.
func (e *Engine) prepareNextTurn(c *chatTurn) {
	defer e.nextTurns.Done()
	var texts [2]string
	for i, probe := range []string{"a", "b"} {
		reply := chat.Message{Role: "assistant", Content: c.content.String(), ToolCalls: c.toolCalls}
		msgs := append(slices.Clone(c.messages), reply, chat.Message{Role: "user", Content: probe})
		t, err := e.tmpl.Render(&chat.RenderInput{Messages: msgs, Tools: c.tools, AddGenerationPrompt: true, Kwargs: c.kwargs})
		if err != nil {
			e.log.Debug("next turn not prepared", "err", err)
			return
		}
		texts[i] = t
	}
	n := 0
	for n < len(texts[0]) && n < len(texts[1]) && texts[0][n] == texts[1][n] {
		n++
	}
	ids := e.tok.Encode(texts[0][:n])
	e.mu.Lock()
	busy := e.queued > 0
	e.mu.Unlock()
	if len(ids) < e.opts.BlockSize || busy {
		return // too short to cache, or requests are waiting: they come first
	}
	st, err := e.Generate(context.Background(), &Request{PromptIDs: ids, PrefillOnly: true})
	if err != nil {
		return // a full queue, a closed engine, a conversation at the context's end
	}
	for range st.Events() {
	}
}
