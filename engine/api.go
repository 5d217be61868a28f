package engine

import (
	"errors"
	"time"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/chat"
)

// Request is one generation. Exactly one of Messages, Prompt and PromptIDs is
// set: Messages are rendered with the model's chat template, Prompt is
// tokenized as is (completions), PromptIDs are used as given.
type Request struct {
	Messages            []chat.Message
	Tools               []chat.Tool
	TemplateKwargs      map[string]any // extra template variables, e.g. enable_thinking
	AddGenerationPrompt *bool          // nil: true for Messages
	Prompt              string
	PromptIDs           []int32

	// ForceToolCall makes a Messages request's answer a tool call (OpenAI's
	// tool_choice "required" or a named function): "*" for any of Tools,
	// else the function's name. The prompt is extended with the start of a
	// call in the template's format (after closing an opened <think>), which
	// the output parser reads as if generated.
	ForceToolCall string

	// PrefillOnly computes the prompt into the caches and ends (FinishLength,
	// no tokens), for a prompt that a later request will start with. While
	// it waits for admission, the arrival of a request that starts with its
	// prompt ends it (FinishCancelled).
	PrefillOnly bool

	Sampling Sampling
}

// Sampling holds a request's decoding parameters. The zero value is greedy
// decoding up to the context length.
type Sampling struct {
	Temperature       float32
	TopK              int
	TopP              float32
	MinP              float32
	Seed              *uint64 // nil: a random seed
	PresencePenalty   float32
	FrequencyPenalty  float32
	RepetitionPenalty float32
	LogitBias         map[int32]float32
	MaxTokens         int      // 0: until the context is full
	Stop              []string // stop strings, matched across token boundaries and not emitted
	StopTokenIDs      []int32  // in addition to the model's end-of-sequence tokens
	IgnoreEOS         bool
	Logprobs          bool
	TopLogprobs       int
}

// Event is one step of a Stream. A stream ends with one event whose Done is
// set; it carries FinishReason and Usage (and Err when FinishReason is
// FinishError).
type Event struct {
	Tokens    []int32           // the tokens this event covers
	Text      string            // content delta
	Reasoning string            // reasoning delta (inside <think>...</think>)
	ToolCalls []chat.ToolCall   // tool calls completed in this delta
	Logprobs  []backend.Sampled // per token in Tokens, when asked for
	Done      bool              //
	Finish    FinishReason      //
	Usage     *Usage            // on the final event
	Err       error             // on the final event, with FinishError
}

// FinishReason says why a stream ended.
type FinishReason string

const (
	FinishStop      FinishReason = "stop"       // end-of-sequence token or stop string
	FinishLength    FinishReason = "length"     // MaxTokens or the context length reached
	FinishToolCalls FinishReason = "tool_calls" // stopped after emitting tool calls
	FinishCancelled FinishReason = "cancelled"  // the request's context was cancelled
	FinishError     FinishReason = "error"
)

// Usage reports what a request cost.
type Usage struct {
	PromptTokens     int
	CachedTokens     int // prompt tokens served from the prefix / state cache
	CompletionTokens int
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
	StateSnapshots    int // hybrid-model state snapshots held
	StateBytes        int64

	// Forward passes, all time: how many, the tokens they computed and the
	// time they took (model and sampling, and on an asynchronous backend
	// the previous pass's token emission, done while the device runs); the
	// same for the passes in which every sequence advanced by one token
	// (decode-only).
	Steps, StepTokens         int64
	StepTime                  time.Duration
	DecodeSteps, DecodeTokens int64
	DecodeStepTime            time.Duration
	// HostTime is the time between consecutive passes while sequences
	// were running (admission, planning, and on a synchronous backend
	// emitting tokens): the device waits for it.
	HostTime time.Duration
}

var (
	// ErrContextOverflow: the prompt (plus at least one generated token)
	// does not fit in the model's context.
	ErrContextOverflow = errors.New("prompt exceeds the context length")
	// ErrQueueFull: too many requests are waiting.
	ErrQueueFull = errors.New("request queue is full")
	// ErrClosed: the engine is shutting down.
	ErrClosed = errors.New("engine is closed")
	// ErrKVFull (a stream's Err): the sequence needs more KV blocks than
	// the whole cache has, even running alone.
	ErrKVFull = errors.New("the sequence does not fit in the KV cache")
)
