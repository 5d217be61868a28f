package session

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/engine"
)

// A prompt is bounded before it is built: its tokens by the engine's
// context, and its text by the most bytes those tokens can stand for
// (tokenizer.MaxTokenBytes), so that a request far over the context costs
// about as much as one that fills it, whatever its size.

// promptLimit is the most tokens a prompt may have: the context less one
// token for the answer (none without an engine: tests of the text side).
func (s *Session) promptLimit() int {
	if s.eng == nil {
		return math.MaxInt
	}
	return s.eng.ContextLength() - 1
}

// render renders a conversation under ctx (a client gone, a request
// timeout) with its output bounded by what promptLimit tokens can spell.
func (s *Session) render(ctx context.Context, in *chat.RenderInput) (string, error) {
	per := s.tok.MaxTokenBytes(nil)
	if limit := s.promptLimit(); per > 0 && limit <= math.MaxInt/per {
		in.Limits.Output = per * limit
	} else {
		per = 0
	}
	text, err := s.tmpl.RenderContext(ctx, in)
	if per > 0 && errors.Is(err, chat.ErrOutputLimit) {
		return "", fmt.Errorf("%w: the rendered conversation is over %d bytes, more than %d tokens can spell (%v)",
			engine.ErrContextOverflow, in.Limits.Output, s.promptLimit(), err)
	}
	if err != nil {
		return "", fmt.Errorf("session: render chat template: %w", err)
	}
	return text, nil
}

// encode tokenizes a prompt, refusing one of more than promptLimit tokens
// without tokenizing the rest.
func (s *Session) encode(text string) ([]int32, error) {
	limit := s.promptLimit()
	ids, ok := s.tok.EncodeLimit(text, limit)
	if !ok {
		return nil, fmt.Errorf("%w: the prompt has more than %d tokens, the context %d", engine.ErrContextOverflow, limit, limit+1)
	}
	return ids, nil
}
