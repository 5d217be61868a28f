package session

import (
	"context"
	"errors"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/engine"
)

// FinishToolCalls is the finish reason of an answer that ended after
// calling tools (the engine saw a stop).
const FinishToolCalls engine.FinishReason = "tool_calls"

// Event is one step of a Stream: the engine's event with its text split,
// for a conversation, into reasoning, content and tool calls. A stream ends
// with one event whose Done is set; it carries Finish and Usage (and Err
// when Finish is engine.FinishError).
type Event struct {
	Tokens    []int32          // the tokens this event covers
	Text      string           // content delta
	Reasoning string           // reasoning delta (inside <think>...</think>)
	ToolCalls []chat.ToolCall  // tool calls completed in this delta
	Logprobs  []engine.Logprob // per token in Tokens, when asked for
	Done      bool
	Finish    engine.FinishReason // engine's, or FinishToolCalls
	Usage     *engine.Usage       // on the final event
	Err       error               // on the final event, with engine.FinishError
}

// Stream is the output of one request. Call Next until the event whose Done
// is set, or cancel the request's context: a stream that is neither read to
// its end nor cancelled keeps the engine's stream waiting for its reader.
type Stream struct {
	s      *Session
	ctx    context.Context
	events <-chan engine.Event
	parser *chat.Parser // nil: not a conversation
	called bool         // the answer has called tools
	turn   *turn        // the conversation, when its next turn is prepared
	final  *Event
}

// Next waits for the stream's next event and returns it; after the final
// event it returns that again. The output parser runs here, in the
// reader's goroutine.
func (st *Stream) Next() Event {
	if st.final != nil {
		return *st.final
	}
	ev, ok := <-st.events
	switch {
	case !ok && st.ctx.Err() != nil:
		// Once cancelled, the engine may drop the final event.
		ev = engine.Event{Done: true, Finish: engine.FinishCancelled}
	case !ok:
		ev = engine.Event{Done: true, Finish: engine.FinishError, Err: errors.New("the engine ended the stream without a final event")}
	}
	out := Event{Tokens: ev.Tokens, Text: ev.Text, Logprobs: ev.Logprobs, Done: ev.Done, Finish: ev.Finish, Usage: ev.Usage, Err: ev.Err}
	if st.parser != nil {
		d := st.parser.Push(ev.Text)
		if ev.Finish == engine.FinishStop || ev.Finish == engine.FinishLength {
			// The answer is complete: what the parser held back is text.
			f := st.parser.Finish()
			d.Reasoning += f.Reasoning
			d.Content += f.Content
			d.ToolCalls = append(d.ToolCalls, f.ToolCalls...)
		}
		out.Text, out.Reasoning, out.ToolCalls = d.Content, d.Reasoning, d.ToolCalls
		st.called = st.called || len(d.ToolCalls) > 0
		if st.turn != nil {
			st.turn.content.WriteString(d.Content)
			st.turn.toolCalls = append(st.turn.toolCalls, d.ToolCalls...)
		}
	}
	if !out.Done {
		return out
	}
	if out.Finish == engine.FinishStop && st.called {
		out.Finish = FinishToolCalls
	}
	if st.turn != nil && (out.Finish == engine.FinishStop || out.Finish == engine.FinishLength || out.Finish == FinishToolCalls) {
		st.s.prepareNextTurn(st.turn)
	}
	st.final = &out
	return out
}
