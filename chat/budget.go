package chat

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// Limits bound one rendering of a chat template. A template is code from
// the model's files: these keep a hostile or broken one from running
// forever, recursing until the stack overflows or building strings until
// the process runs out of memory. A zero field takes its DefaultLimits
// value.
type Limits struct {
	// Steps counts statements run, calls made, filters, values printed
	// and loop items (two each: gonja sets up a scope per item). Zero is
	// DefaultLimits.Steps and StepsPerMessage for every message and tool.
	Steps int
	// Depth bounds nested statements and calls (a macro that calls itself).
	Depth int
	// Output bounds the rendered prompt, and any one value the template
	// builds (a string, or a list counted as it would print).
	Output int
	// Memory bounds the bytes the template's own operations build in all:
	// strings, lists, the text of macros and blocks, the prompt.
	Memory int
	// Range bounds the items of one range(), as Jinja's sandbox does
	// (MAX_RANGE).
	Range int
	// Time bounds the wall time of one rendering.
	Time time.Duration
}

// DefaultLimits are far above what real templates need (the Qwen3
// templates take 30 to 50 steps and a nesting of 10 per message) and keep
// a hostile one to well under a second.
var DefaultLimits = Limits{
	Steps:  250_000,
	Depth:  500,
	Output: 32 << 20,
	Memory: 256 << 20,
	Range:  100_000,
	Time:   10 * time.Second,
}

// StepsPerMessage is the steps a rendering gets for each message and tool
// on top of DefaultLimits.Steps.
const StepsPerMessage = 100

func (l Limits) withDefaults() Limits {
	d := DefaultLimits
	return Limits{
		Steps:  orDefault(l.Steps, d.Steps),
		Depth:  orDefault(l.Depth, d.Depth),
		Output: orDefault(l.Output, d.Output),
		Memory: orDefault(l.Memory, d.Memory),
		Range:  orDefault(l.Range, d.Range),
		Time:   orDefault(l.Time, d.Time),
	}
}

func orDefault[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// ErrLimit is matched (errors.Is) by every error that stopped a rendering
// at one of its Limits.
var ErrLimit = errors.New("chat template limit")

// ErrOutputLimit is matched (errors.Is) by a rendering stopped at
// Limits.Output: the prompt, or a value the template built, would have
// been longer. A caller that sets Output from a context (the most bytes
// its tokens can stand for) reads it as a prompt over the context.
var ErrOutputLimit = errors.New("chat template output limit")

// LimitError is a rendering stopped at one of its Limits.
type LimitError struct {
	msg    string
	output bool // at Limits.Output
}

func (e *LimitError) Error() string { return "chat template: " + e.msg }
func (e *LimitError) Is(target error) bool {
	return target == ErrLimit || target == ErrOutputLimit && e.output
}

// budget is one rendering's account against its Limits. Its checks panic
// with *abort, which Render recovers: that unwinds gonja at once, whatever
// it would have done with an error value.
type budget struct {
	lim      Limits
	steps    int
	depth    int
	memory   int
	line     int         // of the template, last reached
	canceled atomic.Bool // the context is done
	ctx      context.Context
	plain    bool // Template.plain
}

// abort carries the error that stops a rendering through gonja's frames.
type abort struct{ err error }

func newBudget(ctx context.Context, lim Limits) (*budget, context.CancelFunc) {
	b := &budget{lim: lim.withDefaults()}
	ctx, cancel := context.WithTimeoutCause(ctx, b.lim.Time,
		&LimitError{msg: fmt.Sprintf("rendering took more than %v", b.lim.Time)})
	b.ctx = ctx
	stop := context.AfterFunc(ctx, func() { b.canceled.Store(true) })
	return b, func() { stop(); cancel() }
}

func (b *budget) fail(format string, a ...any) {
	panic(&abort{b.limitError(false, format, a...)})
}

// failOutput stops the rendering at Limits.Output.
func (b *budget) failOutput(format string, a ...any) {
	panic(&abort{b.limitError(true, format, a...)})
}

func (b *budget) limitError(output bool, format string, a ...any) *LimitError {
	msg := fmt.Sprintf(format, a...)
	if b.line > 0 {
		msg = fmt.Sprintf("line %d: %s", b.line, msg)
	}
	return &LimitError{msg, output}
}

// step charges n steps and stops a rendering whose context is done.
func (b *budget) step(n int) {
	if b.canceled.Load() {
		err := context.Cause(b.ctx)
		if !errors.Is(err, ErrLimit) {
			// The caller's: a client gone, a request timeout.
			err = fmt.Errorf("chat template: rendering stopped: %w", err)
		}
		panic(&abort{err})
	}
	if b.steps += n; b.steps > b.lim.Steps {
		b.fail("rendering took more than %d steps (a loop that does not end?)", b.lim.Steps)
	}
}

// enter is one nested statement or call.
func (b *budget) enter() {
	b.step(1)
	if b.depth++; b.depth > b.lim.Depth {
		b.fail("statements and calls nested more than %d deep (a macro that calls itself without end?)", b.lim.Depth)
	}
}

func (b *budget) leave() { b.depth-- }

// build charges n bytes about to be built; what the template builds
// counts whether or not it is kept.
func (b *budget) build(n int) {
	if n > b.lim.Output {
		b.failOutput("an operation would build %d bytes, over the limit of %d", n, b.lim.Output)
	}
	if b.memory += n; b.memory > b.lim.Memory {
		b.fail("rendering built more than %d bytes", b.lim.Memory)
	}
}

// limitWriter is the rendered prompt, bounded by Limits.Output.
type limitWriter struct {
	b   *budget
	buf strings.Builder
}

func (w *limitWriter) Write(p []byte) (int, error) {
	w.room(len(p))
	return w.buf.Write(p)
}

func (w *limitWriter) WriteString(s string) (int, error) {
	w.room(len(s))
	return w.buf.WriteString(s)
}

// room checks that n more bytes fit in the prompt and makes room for them.
func (w *limitWriter) room(n int) {
	if w.buf.Len()+n > w.b.lim.Output {
		w.b.failOutput("the rendered prompt is over %d bytes", w.b.lim.Output)
	}
	if w.buf.Cap()-w.buf.Len() < n {
		w.buf.Grow(n) // doubles, where append would grow by a quarter
	}
}
