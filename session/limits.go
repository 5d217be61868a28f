package session

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/engine"
)

// A prompt is bounded before it is built: its tokens by the context, and
// its text by the most bytes those tokens can stand for
// (tokenizer.MaxTokenBytes), so that a request far over the context costs
// about as much as one that fills it, whatever its size.

// promptLimit returns the most tokens req's prompt may have: its context
// (the engine's, or the request's when smaller) less one token for the
// answer; and the error of a prompt over it, which the engine would give
// had it the whole prompt. No limit without an engine (tests of the text
// side).
func (s *Session) promptLimit(req *Request) (int, error) {
	if s.eng == nil {
		return math.MaxInt, nil
	}
	ctx, kind := s.eng.Context()
	if req.Context > 0 && req.Context < ctx {
		ctx, kind = req.Context, engine.LimitRequest
	}
	return ctx - 1, &engine.ContextError{Prompt: ctx, AtLeast: true, MaxTokens: req.Sampling.MaxTokens, Context: ctx, Limit: kind}
}

// render renders a conversation under ctx (a client gone, a request
// timeout) with its output bounded by what limit tokens can spell; over
// it, the error is over.
func (s *Session) render(ctx context.Context, in *chat.RenderInput, limit int, over error) (string, error) {
	if per := s.tok.MaxTokenBytes(nil); per > 0 && limit <= math.MaxInt/per {
		in.Limits.Output = per * limit
	}
	text, err := s.tmpl.RenderContext(ctx, in)
	if in.Limits.Output > 0 && errors.Is(err, chat.ErrOutputLimit) {
		return "", over
	}
	if err != nil {
		return "", fmt.Errorf("session: render chat template: %w", err)
	}
	return text, nil
}

// encode tokenizes a prompt, refusing one of more than limit tokens with
// over, without tokenizing the rest.
func (s *Session) encode(text string, limit int, over error) ([]int32, error) {
	ids, ok := s.tok.EncodeLimit(text, limit)
	if !ok {
		return nil, over
	}
	return ids, nil
}

// encodePrompt is encode through the reuse of earlier prompts' ids
// (prompts), also giving the prompt's message starts.
func (s *Session) encodePrompt(text string, limit int, over error) ([]int32, []int, error) {
	ids, marks, _, ok := s.prompts.encode(text, limit)
	if !ok {
		return nil, nil, over
	}
	return ids, marks, nil
}
