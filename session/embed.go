package session

import (
	"context"
	"errors"
	"fmt"

	"github.com/kiln-llm/kiln/engine"
)

// EmbedRequest is one embeddings call: its inputs are embedded together
// (the engine batches them). Exactly one of Inputs and InputIDs is set.
type EmbedRequest struct {
	Inputs   []string  // texts, tokenized as sentence-transformers does (with the tokenizer's special tokens)
	InputIDs [][]int32 // token ids, used as they are
	// Dimensions, when set, keeps the first Dimensions components of each
	// embedding (Matryoshka truncation), normalised again when the model's
	// are.
	Dimensions int
	// Truncate cuts inputs longer than the model takes (keeping the
	// special tokens), as Ollama does by default; otherwise they are an
	// error (engine.ErrContextOverflow).
	Truncate bool
}

// Embeddings are the result of an EmbedRequest.
type Embeddings struct {
	Vectors      [][]float32 // one per input, in order
	PromptTokens int
}

// DimensionsError is an EmbedRequest's Dimensions outside 1..the model's.
type DimensionsError struct{ Asked, Max int }

func (e *DimensionsError) Error() string {
	return fmt.Sprintf("dimensions must be between 1 and %d, not %d", e.Max, e.Asked)
}

// Embed computes the embeddings of a request's inputs: each input's last
// token's final normed hidden state, as the model's sentence-transformers
// modules pool and normalise it. Its errors are engine.ErrNotEmbedding (a
// generative model), engine.ErrContextOverflow (an input too long, not
// truncated), *DimensionsError, and the engine's.
func (s *Session) Embed(ctx context.Context, req *EmbedRequest) (*Embeddings, error) {
	info, ok := s.eng.Embedding()
	switch {
	case !ok:
		return nil, engine.ErrNotEmbedding
	case (len(req.Inputs) > 0) == (len(req.InputIDs) > 0):
		return nil, errors.New("session: an embedding request sets exactly one of Inputs and InputIDs")
	case req.Dimensions < 0 || req.Dimensions > info.Dims:
		return nil, &DimensionsError{req.Dimensions, info.Dims}
	case len(req.Inputs) > 0 && s.tok == nil:
		return nil, errors.New("session: no tokenizer: only token id inputs are served")
	}
	prompts := req.InputIDs
	if len(req.Inputs) > 0 {
		prefix, suffix := s.tok.SpecialTokens()
		for i, text := range req.Inputs {
			ids := s.tok.Encode(text)
			if n := len(prefix) + len(ids) + len(suffix); n > info.MaxTokens && req.Truncate {
				ids = ids[:max(info.MaxTokens-len(prefix)-len(suffix), 0)]
			}
			prompts = append(prompts, append(append(append(make([]int32, 0, len(prefix)+len(ids)+len(suffix)), prefix...), ids...), suffix...))
			if len(prompts[i]) == 0 {
				return nil, fmt.Errorf("session: input %d is empty", i)
			}
		}
	}
	for i, p := range prompts {
		if len(p) > info.MaxTokens {
			return nil, fmt.Errorf("%w: input %d has %d tokens, the model embeds at most %d", engine.ErrContextOverflow, i, len(p), info.MaxTokens)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the others, when one fails
	streams := make([]*engine.Stream, len(prompts))
	for i, p := range prompts {
		st, err := s.eng.Generate(ctx, &engine.Request{Prompt: p, Embed: true})
		if err != nil {
			return nil, err
		}
		streams[i] = st
	}
	out := &Embeddings{Vectors: make([][]float32, len(prompts))}
	for i, st := range streams {
		var final engine.Event
		for ev := range st.Events() {
			final = ev
		}
		switch {
		case final.Finish == engine.FinishCancelled || !final.Done:
			if err := context.Cause(ctx); err != nil {
				return nil, err
			}
			return nil, context.Canceled
		case final.Finish != engine.FinishStop:
			return nil, fmt.Errorf("session: embedding input %d: %w", i, final.Err)
		}
		v := final.Embedding
		if req.Dimensions > 0 && req.Dimensions < len(v) {
			v = v[:req.Dimensions]
			if info.Normalized {
				engine.Normalize(v)
			}
		}
		out.Vectors[i] = v
		out.PromptTokens += final.Usage.PromptTokens
	}
	return out, nil
}
