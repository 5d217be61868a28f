package session

import (
	"container/list"
	"encoding/json"
	"errors"
	"sync"

	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/grammar"
)

// Format constrains an answer's content (what follows its reasoning) to
// JSON.
type Format struct {
	// Schema is the JSON schema the answer follows (see grammar.Schema for
	// what is supported); nil: any JSON object.
	Schema json.RawMessage
}

// ConstraintError is a request whose output cannot be constrained: its
// Format's schema, or the parameter schema of a tool it must call, is
// malformed or uses what grammar does not support (Err says which; a
// *grammar.SchemaError names the feature).
type ConstraintError struct {
	Tools bool // the tools' schemas, not the Format's
	Err   error
}

func (e *ConstraintError) Error() string {
	if e.Tools {
		return "tools: " + e.Err.Error()
	}
	return "response format: " + e.Err.Error()
}

func (e *ConstraintError) Unwrap() error { return e.Err }

// maxGrammars is how many compiled grammars a session keeps: a grammar
// remembers the masks of the states its requests reached, which the next
// request with the same schema reuses.
const maxGrammars = 32

// grammars holds a session's vocabulary index and its compiled grammars,
// the most recently used first.
type grammars struct {
	once  sync.Once
	vocab *grammar.Vocab
	mu    sync.Mutex
	byKey map[string]*list.Element
	lru   list.List // of *cached
}

type cached struct {
	key string
	g   *grammar.Grammar
}

// constraint returns the token mask of a request's constrained output (nil
// when it has none): a forced tool call's rest after the start the prompt
// holds (call is the function's name, "" for any of the tools), or a
// Format. thinking says the prompt opened a reasoning block, which stays
// free up to its end.
func (s *Session) constraint(req *Request, call string, thinking bool) (engine.TokenMask, error) {
	var key string
	var build func() (grammar.Expr, error)
	switch {
	case req.ForceToolCall != "":
		key = "tool\x00" + call
		for _, t := range req.Tools {
			key += "\x00" + string(t)
		}
		build = func() (grammar.Expr, error) {
			e, err := s.tmpl.ToolCallGrammar(req.Tools, call)
			var se *grammar.SchemaError
			if errors.As(err, &se) {
				err = &ConstraintError{Tools: true, Err: err}
			}
			return e, err
		}
	case req.Format != nil:
		key = "format\x00" + string(req.Format.Schema)
		if thinking {
			key = "think\x00" + key
		}
		build = func() (grammar.Expr, error) {
			e := grammar.JSONObject()
			if req.Format.Schema != nil {
				var err error
				if e, err = grammar.Schema(req.Format.Schema); err != nil {
					return e, &ConstraintError{Err: err}
				}
			}
			if thinking {
				e = grammar.Seq(grammar.Until("</think>"), grammar.Space(), e)
			}
			return e, nil
		}
	default:
		return nil, nil
	}
	if s.tok == nil {
		return nil, errors.New("session: no tokenizer: output cannot be constrained")
	}
	g, err := s.grammar(key, build)
	if err != nil {
		return nil, err
	}
	return grammarMask{g.Matcher()}, nil
}

// grammar returns the compiled grammar of key, building it when it is not
// cached.
func (s *Session) grammar(key string, build func() (grammar.Expr, error)) (*grammar.Grammar, error) {
	c := &s.grammars
	c.mu.Lock()
	if el, ok := c.byKey[key]; ok {
		c.lru.MoveToFront(el)
		c.mu.Unlock()
		return el.Value.(*cached).g, nil
	}
	c.mu.Unlock()
	e, err := build()
	if err != nil {
		return nil, err
	}
	c.once.Do(func() {
		toks := make([][]byte, s.tok.VocabSize())
		for id := range toks {
			if !s.tok.IsSpecial(int32(id)) {
				toks[id] = s.tok.TokenBytes(int32(id))
			}
		}
		c.vocab = grammar.NewVocab(toks, s.eng.VocabSize())
	})
	g := grammar.Compile(e, c.vocab)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byKey == nil {
		c.byKey = map[string]*list.Element{}
	}
	if el, ok := c.byKey[key]; ok { // compiled meanwhile by another request
		return el.Value.(*cached).g, nil
	}
	c.byKey[key] = c.lru.PushFront(&cached{key, g})
	if c.lru.Len() > maxGrammars {
		old := c.lru.Remove(c.lru.Back()).(*cached)
		delete(c.byKey, old.key)
	}
	return g, nil
}

// grammarMask is a grammar's matcher as the engine's token mask.
type grammarMask struct{ m *grammar.Matcher }

func (g grammarMask) Allow(generated []int32, allowed []uint64) engine.Allowance {
	if g.m.Allow(generated, allowed) {
		return engine.AllowSetOrEnd
	}
	return engine.AllowSet
}
