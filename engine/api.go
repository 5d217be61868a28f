package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/kiln-llm/kiln/backend"
)

// Request is one generation: the prompt's token ids and how to sample what
// follows. Text, chat templates and tool calls are the session's (package
// session); the engine gives back token ids, their text and why they ended.
type Request struct {
	Prompt []int32
	// Checkpoints are prompt positions, ascending, where requests that share
	// this prompt's beginning tend to go another way: the session gives the
	// start of each message (an edited or re-rendered answer, a changed
	// message, a regenerated reply diverge there). Hybrid models keep their
	// state at those the prefill crosses (see Reuse in the package doc).
	Checkpoints []int
	Sampling    Sampling
	// Mask, when set, constrains which tokens the request may generate.
	Mask TokenMask

	// Embed computes the prompt and ends (FinishStop, no tokens) with its
	// embedding in the final event: the only request an embedding model
	// (model.Config.Embedding) serves, and one a generative model refuses.
	Embed bool

	// PrefillOnly computes the prompt into the caches and ends (FinishLength,
	// no tokens), for a prompt that a later request will start with. Such a
	// request defers to every other: Generate refuses it with ErrBusy while
	// requests wait, and while it waits for admission, the arrival of a
	// request that starts with its prompt ends it (FinishCancelled).
	PrefillOnly bool

	// Context bounds this sequence below the engine's context (Ollama's
	// num_ctx); 0 or more than the engine's: the engine's.
	Context int
	// ClampMaxTokens cuts a Sampling.MaxTokens that the prompt leaves no
	// room for to the room there is (Ollama's num_predict); without it,
	// such a request is refused with a *ContextError, as OpenAI's and
	// vLLM's max_tokens are.
	ClampMaxTokens bool
}

// TokenMask constrains a request's tokens: the hook of constrained decoding
// (a JSON schema, a tool call's grammar), which the session builds from a
// request and hands the engine. The engine samples each token from the
// allowed ones only, after penalties and bias, as if the others had no
// probability (their log-probabilities too: see backend.SampleParams.Mask).
type TokenMask interface {
	// Allow sets in allowed the tokens that may follow generated, the
	// tokens the request has generated so far: allowed is a bitset of the
	// vocabulary (token t is bit t%64 of word t/64, backend.MaskWords
	// words), clear when Allow is called. The result says what else may
	// follow. It is called before each token sampled for the request (on
	// an asynchronous backend, while the device runs the pass whose logits
	// it masks), at the same time as other requests' masks, never twice at
	// once for one request; it must be quick and must not keep generated
	// or allowed. After a preemption the same prefixes may be asked again.
	Allow(generated []int32, allowed []uint64) Allowance
}

// Allowance is what a TokenMask allows besides the tokens it set.
type Allowance uint8

const (
	// AllowSet: only the tokens set. None set ends the request with
	// ErrMaskEmpty.
	AllowSet Allowance = iota
	// AllowSetOrEnd: those and the end of the output, that is the
	// request's stop tokens (the model's end-of-sequence tokens unless
	// IgnoreEOS, and StopTokenIDs). With none of either, the output is
	// complete: the request ends with FinishStop.
	AllowSetOrEnd
	// AllowAny: any token (allowed is not read), as without a mask.
	AllowAny
)

// Sampling holds a request's decoding parameters. The zero value is greedy
// decoding up to the context length. Validate holds their bounds; Generate
// refuses a request outside them.
type Sampling struct {
	Temperature       float32 // 0: greedy
	TopK              int     // 0: no limit
	TopP              float32 // 0 or 1: no limit
	MinP              float32
	Seed              *uint64 // nil: a random seed
	PresencePenalty   float32
	FrequencyPenalty  float32
	RepetitionPenalty float32 // 0 or 1: none
	LogitBias         map[int32]float32
	MaxTokens         int      // 0: until the context is full; prompt + MaxTokens must fit the context (Request.ClampMaxTokens)
	Stop              []string // stop strings, matched across token boundaries and not emitted
	StopTokenIDs      []int32  // in addition to the model's end-of-sequence tokens
	IgnoreEOS         bool
	Logprobs          bool
	TopLogprobs       int
}

// MaxStops is the most stop strings a request may set.
const MaxStops = 16

// Validate checks the parameters against their bounds: OpenAI's API ranges
// (vLLM's for top_k, min_p and repetition_penalty). These are the only
// bounds on the way from a client to the sampler; an error is a
// *SamplingError naming the parameter as the API spells it. Token ids are
// checked against the model's vocabulary by Generate.
func (sp *Sampling) Validate() error {
	for _, f := range []struct {
		name      string
		v, lo, hi float32
	}{
		{"temperature", sp.Temperature, 0, 2},
		{"top_p", sp.TopP, 0, 1},
		{"min_p", sp.MinP, 0, 1},
		{"presence_penalty", sp.PresencePenalty, -2, 2},
		{"frequency_penalty", sp.FrequencyPenalty, -2, 2},
		{"repetition_penalty", sp.RepetitionPenalty, 0, 10},
	} {
		if !(f.v >= f.lo && f.v <= f.hi) { // NaN too
			return &SamplingError{f.name, fmt.Sprintf("must be between %g and %g, not %g", f.lo, f.hi, f.v)}
		}
	}
	for t, b := range sp.LogitBias {
		if !(b >= -100 && b <= 100) {
			return &SamplingError{"logit_bias", fmt.Sprintf("values must be between -100 and 100, not %g (token %d)", b, t)}
		}
	}
	switch {
	case sp.TopK < 0:
		return &SamplingError{"top_k", fmt.Sprintf("must be at least 0, not %d", sp.TopK)}
	case sp.MaxTokens < 0:
		return &SamplingError{"max_tokens", fmt.Sprintf("must be at least 0, not %d", sp.MaxTokens)}
	case sp.TopLogprobs < 0 || sp.TopLogprobs > 20:
		return &SamplingError{"top_logprobs", fmt.Sprintf("must be between 0 and 20, not %d", sp.TopLogprobs)}
	case len(sp.Stop) > MaxStops:
		return &SamplingError{"stop", fmt.Sprintf("takes at most %d strings, not %d", MaxStops, len(sp.Stop))}
	}
	for _, s := range sp.Stop {
		if s == "" {
			return &SamplingError{"stop", "must not hold an empty string"}
		}
	}
	return nil
}

// SamplingError is a sampling parameter outside its bounds.
type SamplingError struct {
	Param  string // as the OpenAI API spells it: temperature, top_p, ...
	Reason string // "must be between 0 and 2, not 5"
}

func (e *SamplingError) Error() string { return e.Param + " " + e.Reason }

// Event is one step of a Stream. A stream ends with one event whose Done is
// set; it carries FinishReason and Usage (and Err when FinishReason is
// FinishError).
type Event struct {
	Tokens   []int32   // the tokens this event covers
	Text     string    // their text, less what may still be a stop string's start
	Logprobs []Logprob // per token in Tokens, when asked for
	Done     bool
	Finish   FinishReason
	Usage    *Usage // on the final event
	Err      error  // on the final event, with FinishError
	// Embedding is an Embed request's embedding (final event): the final
	// normed hidden state of the prompt's last token, L2-normalised when
	// the model's sentence-transformers modules say so.
	Embedding []float32
}

// Logprob is a generated token's log-probability under the model's
// distribution after penalties and bias, before temperature, with the most
// likely alternatives when asked for.
type Logprob struct {
	Token   int32
	Logprob float32
	Top     []TokenLogprob
}

// TokenLogprob pairs a token with its log-probability.
type TokenLogprob = backend.TokenLogprob

// FinishReason says why a stream ended.
type FinishReason string

const (
	FinishStop      FinishReason = "stop"      // end-of-sequence token or stop string
	FinishLength    FinishReason = "length"    // MaxTokens or the context length reached
	FinishCancelled FinishReason = "cancelled" // the request's context was cancelled
	FinishError     FinishReason = "error"
)

// Usage reports what a request cost.
type Usage struct {
	PromptTokens     int
	CachedTokens     int // prompt tokens served from the prefix / state cache
	CompletionTokens int
	// Queued is submission to admission into the running batch: the wait
	// for a slot and blocks, and the restore of its cached prefix. TTFT
	// less Queued is the passes over its prompt.
	Queued           time.Duration
	TTFT             time.Duration // submission to first token
	Duration         time.Duration // submission to last token
	DecodeTokensPerS float64       // completion tokens after the first / time after the first
}

// Stats is an engine-wide snapshot.
type Stats struct {
	Running, Waiting  int
	KVBlocksUsed      int // blocks referenced by running sequences or by the prefix cache
	KVBlocksCached    int // blocks the prefix cache or the state snapshots hold for reuse (evicted when blocks run out; some may also be in use)
	KVBlocksTotal     int
	CacheHitTokens    int64 // prompt tokens served from cache, all time
	PromptTokens      int64 // prompt tokens submitted, all time
	Preemptions       int64
	RecomputedTokens  int64 // tokens computed again after preemptions (their cost)
	RequestsCompleted int64
	GeneratedTokens   int64 // tokens sampled for requests, all time
	StateSnapshots    int   // hybrid-model state snapshots held
	StateOnDevice     int   // of those, the ones in device slots (Options.SnapshotSlots)
	StateBytes        int64 // the host memory of the others' state

	// The state cache (Options.StateCache): its entries, their bytes in
	// host memory and on disk, the prefixes restored from it and their
	// tokens.
	StateCacheEntries                       int
	StateCacheRAMBytes, StateCacheDiskBytes int64
	StateCacheRestores                      int64
	StateCacheRestoredTokens                int64

	// Forward passes, all time: how many, the tokens they computed and the
	// time they took (model and sampling, and on an asynchronous backend
	// the previous pass's token emission, done while the device runs); the
	// same for the passes in which every sequence advanced by one token
	// (decode-only).
	Steps, StepTokens         int64
	StepTime                  time.Duration
	DecodeSteps, DecodeTokens int64
	DecodeStepTime            time.Duration
	// AheadSteps are the decode passes issued before the last one's tokens
	// reached the host, their tokens taken on the device (a dense model on
	// a GPU; see the scheduler's ahead); those of sequences that ended
	// meanwhile were computed for nothing.
	AheadSteps int64
	// HostTime is the time between consecutive passes while sequences
	// were running (admission, planning, and on a synchronous backend
	// emitting tokens): the device waits for it.
	HostTime time.Duration
}

// ContextLimit says what bounds a context length.
type ContextLimit string

const (
	LimitModel   ContextLimit = "model"    // the model's context length
	LimitOption  ContextLimit = "option"   // Options.Context
	LimitKVCache ContextLimit = "kv_cache" // what the KV cache holds for one sequence
	LimitRequest ContextLimit = "request"  // Request.Context
)

// ContextError is a request that does not fit its context: the prompt
// leaves no room for a token, or no room for MaxTokens. It is an
// ErrContextOverflow.
type ContextError struct {
	Prompt    int // prompt tokens
	MaxTokens int // tokens asked for; 0: none
	Context   int // the sequence's context length
	Limit     ContextLimit
	// AtLeast: Prompt is a lower bound, the session having stopped
	// tokenizing once the prompt passed the context.
	AtLeast bool
}

func (e *ContextError) Error() string {
	if e.MaxTokens > 0 && e.Prompt < e.Context {
		return fmt.Sprintf("%d prompt tokens and max_tokens %d (%d in all) exceed the context of %d tokens",
			e.Prompt, e.MaxTokens, e.Requested(), e.Context)
	}
	return fmt.Sprintf("%s prompt tokens leave no room for an answer in the context of %d tokens", e.Count(uint64(e.Prompt)), e.Context)
}

// Count writes n, a count that includes the prompt, as "at least n" when
// the prompt's is a lower bound.
func (e *ContextError) Count(n uint64) string {
	if e.AtLeast {
		return fmt.Sprintf("at least %d", n)
	}
	return fmt.Sprint(n)
}

func (e *ContextError) Unwrap() error { return ErrContextOverflow }

// Requested is the tokens the request asked for, its prompt and at least
// one more: a uint64, which a max_tokens near 2^63 cannot wrap around.
func (e *ContextError) Requested() uint64 { return uint64(e.Prompt) + uint64(max(e.MaxTokens, 1)) }

var (
	// ErrContextOverflow: the prompt (plus at least one generated token,
	// or plus MaxTokens) does not fit in the context; see ContextError.
	ErrContextOverflow = errors.New("prompt exceeds the context length")
	// ErrQueueFull: too many requests are waiting.
	ErrQueueFull = errors.New("request queue is full")
	// ErrClosed: the engine is shutting down.
	ErrClosed = errors.New("engine is closed")
	// ErrBusy: a PrefillOnly request was submitted while others wait.
	ErrBusy = errors.New("requests are waiting")
	// ErrMaskEmpty (a stream's Err): the request's TokenMask allowed no
	// token and not the end.
	ErrMaskEmpty = errors.New("the token mask allows no token")
	// ErrEmbeddingModel: a generation request to an embedding model.
	ErrEmbeddingModel = errors.New("the model is an embedding model: it computes embeddings, not text")
	// ErrNotEmbedding: an Embed request to a generative model.
	ErrNotEmbedding = errors.New("the model is not an embedding model (its directory has no sentence-transformers pooling)")
	// ErrKVFull (a stream's Err): the prompt needs more KV blocks than the
	// whole cache has, even running alone (only with a context beyond the
	// cache: see Options.Context).
	ErrKVFull = errors.New("the sequence does not fit in the KV cache")
)
