package session

import (
	"context"
	"slices"
	"strings"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/engine"
)

// turn is what a conversation's next turn is rendered from.
type turn struct {
	messages []chat.Message
	tools    []chat.Tool
	kwargs   map[string]any
	// The answer as the client will send it back: its content and tool
	// calls, collected as they stream.
	content   strings.Builder
	toolCalls []chat.ToolCall
}

// prepareNextTurn prefills, in the background, the conversation of a
// finished answer as its next turn will start: the template is rendered
// with two different user messages after the answer, and the text they
// share is what any next turn begins with. The engine refuses it while
// requests wait (they come first) and drops it when the next turn arrives
// before it started.
func (s *Session) prepareNextTurn(c *turn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.turns.Go(func() {
		req, err := s.nextTurn(c)
		if err != nil {
			s.log.Debug("next turn not prepared", "err", err)
			return
		}
		if len(req.Prompt) < s.eng.Options().BlockSize {
			return // too short to cache
		}
		st, err := s.eng.Generate(context.Background(), req)
		if err != nil {
			return // requests waiting, a full queue, a closed engine, a conversation at the context's end
		}
		for range st.Events() {
		}
	})
}

// nextTurn returns the prefill-only request of the text that any next turn
// of c's conversation begins with: the template rendered with two different
// user messages after the answer, up to where they differ; an error when
// that text is over the context.
func (s *Session) nextTurn(c *turn) (*engine.Request, error) {
	limit, over := s.promptLimit(&Request{})
	var texts [2]string
	for i, probe := range []string{"a", "b"} {
		reply := chat.Message{Role: "assistant", Content: c.content.String(), ToolCalls: c.toolCalls}
		msgs := append(slices.Clone(c.messages), reply, chat.Message{Role: "user", Content: probe})
		t, err := s.render(context.Background(), &chat.RenderInput{Messages: msgs, Tools: c.tools, AddGenerationPrompt: true, Kwargs: c.kwargs}, limit, over)
		if err != nil {
			return nil, err
		}
		texts[i] = t
	}
	n := 0
	for n < len(texts[0]) && n < len(texts[1]) && texts[0][n] == texts[1][n] {
		n++
	}
	ids, marks, err := s.encodePrompt(texts[0][:n], limit, over)
	if err != nil {
		return nil, err
	}
	return &engine.Request{Prompt: ids, Checkpoints: marks, PrefillOnly: true}, nil
}
