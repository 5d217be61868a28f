// Package session is the text side of the engine: it turns conversations
// and prompts into the token ids the engine takes, and the engine's tokens
// and text back into what clients read.
//
// On the way in, a conversation is rendered with the model's chat template
// (forcing the answer to start with a tool call when asked) and tokenized.
// On the way out, each stream splits the engine's text into reasoning,
// content and tool calls (chat.Parser), in the reader's goroutine, so that
// the engine's scheduler only detokenizes. When an answer ends, the
// conversation is rendered as its next turn will render it and prefilled
// into the engine's caches (Options.PrepareNextTurn).
//
// Constrained decoding plugs in at Generate: a grammar the session builds
// from a request (a Format's JSON schema, a forced tool call's name and
// arguments in the template's call form; package grammar) becomes the
// engine.Request's Mask (engine.TokenMask), which the engine asks for the
// tokens allowed after those generated so far; the constrained text comes
// back through the same parser. A reasoning block the prompt opens stays
// free: the constraint starts after it.
package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/tokenizer"
)

// Options configure a Session.
type Options struct {
	// PrepareNextTurn: when a chat answer ends, the conversation is rendered
	// as its next turn will render it (templates drop an earlier answer's
	// reasoning, so the answer's own tokens do not match) and prefilled,
	// unless requests are waiting, so that the next turn finds it cached.
	// For servers and interactive chats; a one-shot command would only wait
	// for it.
	PrepareNextTurn bool
	Logger          *slog.Logger // nil: slog.Default()
}

// Session serves text requests on an engine. It is safe for use by many
// goroutines.
type Session struct {
	eng     *engine.Engine
	tok     *tokenizer.Tokenizer
	tmpl    *chat.Template
	prompts *prompts
	opts    Options
	log     *slog.Logger
	mu      sync.Mutex
	closed  bool
	// turns counts the goroutines preparing a conversation's next turn;
	// none starts after Close.
	turns    sync.WaitGroup
	grammars grammars
}

// New returns a session on eng, which it owns (Close closes it). tok
// encodes prompts and tmpl renders conversations; either may be nil, and
// then only the requests that do not need it are served.
func New(eng *engine.Engine, tok *tokenizer.Tokenizer, tmpl *chat.Template, opts Options) *Session {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Session{eng: eng, tok: tok, tmpl: tmpl, prompts: newPrompts(tok, promptCacheBytes), opts: opts, log: opts.Logger}
}

// Engine returns the session's engine (for its Stats and Options).
func (s *Session) Engine() *engine.Engine { return s.eng }

// Tokenizer returns the session's tokenizer (nil: token id prompts only).
func (s *Session) Tokenizer() *tokenizer.Tokenizer { return s.tok }

// Request is one generation. Exactly one of Messages, Prompt and PromptIDs
// is set: Messages are rendered with the model's chat template (with the
// generation prompt), Prompt is tokenized as is (completions), PromptIDs
// are used as given.
type Request struct {
	Messages       []chat.Message
	Tools          []chat.Tool
	TemplateKwargs map[string]any // extra template variables, e.g. enable_thinking
	// ForceToolCall makes a Messages request's answer a tool call (OpenAI's
	// tool_choice "required" or a named function): "*" for any of Tools,
	// else the function's name. The prompt is extended with the start of a
	// call in the template's format (after closing an opened <think>), which
	// the output parser reads as if generated; the rest of the call is
	// constrained to a tool's name and to arguments its parameter schema
	// allows.
	ForceToolCall string
	// Format, when set, constrains the answer (after its reasoning) to
	// JSON. A forced tool call takes precedence.
	Format *Format

	Prompt    string
	PromptIDs []int32
	// Suffix makes a Prompt request a fill-in-the-middle: the model writes
	// what goes between Prompt and Suffix, prompted in its FIM format
	// (Qwen's <|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>). A model
	// whose vocabulary lacks those tokens fails with ErrNoFIM.
	Suffix string

	Sampling engine.Sampling
	// Context and ClampMaxTokens are engine.Request's: a context below
	// the engine's (Ollama's num_ctx), and a MaxTokens cut to the room
	// the prompt leaves (Ollama's num_predict).
	Context        int
	ClampMaxTokens bool
}

// ErrNoFIM: a fill-in-the-middle request (Request.Suffix) for a model
// whose vocabulary has no FIM tokens.
var ErrNoFIM = errors.New("session: the model's vocabulary has no fill-in-the-middle tokens (" + strings.Join(fimTokens[:], ", ") + ")")

// fimTokens are the prefix, suffix and middle tokens of Qwen's
// fill-in-the-middle format (Qwen2.5-Coder's, in every Qwen3 vocabulary).
var fimTokens = [3]string{"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"}

// Generate renders and tokenizes req, submits it to the engine and returns
// its stream. Its errors are those of the template, of the constraint
// (*ConstraintError) and of engine.Generate (sampling parameters out of
// bounds, context overflow, a full queue, a closed engine,
// engine.ErrEmbeddingModel). Cancelling ctx ends the stream with
// FinishCancelled.
func (s *Session) Generate(ctx context.Context, req *Request) (*Stream, error) {
	if _, ok := s.eng.Embedding(); ok {
		return nil, engine.ErrEmbeddingModel // before a chat template it has no need of
	}
	er, parser, err := s.prompt(ctx, req)
	if err != nil {
		return nil, err
	}
	er.Sampling, er.Context, er.ClampMaxTokens = req.Sampling, req.Context, req.ClampMaxTokens
	es, err := s.eng.Generate(ctx, &er)
	if err != nil {
		return nil, err
	}
	st := &Stream{s: s, ctx: ctx, events: es.Events(), parser: parser}
	if parser != nil && s.opts.PrepareNextTurn && !s.eng.Options().NoCache {
		st.turn = &turn{messages: slices.Clone(req.Messages), tools: req.Tools, kwargs: req.TemplateKwargs}
	}
	return st, nil
}

// prompt returns a request's prompt as the engine takes it (its ids, its
// message starts, the mask of its constrained output; nil: free) and, for
// a conversation, the parser of its answer. Rendering and tokenizing stop
// once the prompt cannot fit the request's context.
func (s *Session) prompt(ctx context.Context, req *Request) (engine.Request, *chat.Parser, error) {
	var er engine.Request
	set := 0
	for _, ok := range []bool{len(req.Messages) > 0, req.Prompt != "", len(req.PromptIDs) > 0} {
		if ok {
			set++
		}
	}
	if set != 1 {
		return er, nil, errors.New("session: a request sets exactly one of Messages, Prompt and PromptIDs")
	}
	if req.Suffix != "" && req.Prompt == "" {
		return er, nil, errors.New("session: a Suffix (fill-in-the-middle) needs a text Prompt")
	}
	if req.ForceToolCall != "" && len(req.Messages) == 0 {
		return er, nil, errors.New("session: ForceToolCall needs Messages")
	}
	if len(req.PromptIDs) > 0 || req.Prompt != "" {
		er.Prompt = req.PromptIDs
		if er.Prompt == nil {
			if s.tok == nil {
				return er, nil, errors.New("session: no tokenizer: only token id prompts are served")
			}
			limit, over := s.promptLimit(req)
			var err error
			if req.Suffix != "" {
				er.Prompt, err = s.fim(req.Prompt, req.Suffix, limit, over)
			} else {
				er.Prompt, er.Checkpoints, err = s.encodePrompt(req.Prompt, limit, over)
			}
			if err != nil {
				return er, nil, err
			}
		}
		var err error
		er.Mask, err = s.constraint(req, "", false)
		return er, nil, err
	}
	if s.tok == nil {
		return er, nil, errors.New("session: no tokenizer: only token id prompts are served")
	}
	if s.tmpl == nil {
		return er, nil, errors.New("session: the model has no chat template")
	}
	limit, over := s.promptLimit(req)
	text, err := s.render(ctx, &chat.RenderInput{Messages: req.Messages, Tools: req.Tools, AddGenerationPrompt: true, Kwargs: req.TemplateKwargs}, limit, over)
	if err != nil {
		return er, nil, err
	}
	thinking := chat.OpensThinking(text)
	var start, call string
	if req.ForceToolCall != "" {
		if len(req.Tools) == 0 {
			return er, nil, errors.New("session: ForceToolCall needs tools")
		}
		if call = req.ForceToolCall; call == "*" {
			call = ""
		}
		if start, err = s.tmpl.ToolCallStart(call); err != nil {
			return er, nil, fmt.Errorf("session: %w", err)
		}
		if thinking {
			start = "\n</think>\n\n" + start // an empty reasoning, as Qwen writes one
		}
	}
	if er.Mask, err = s.constraint(req, call, thinking && req.ForceToolCall == ""); err != nil {
		return er, nil, err
	}
	parser := chat.NewParser(chat.ParserOptions{Tools: req.Tools, InThinking: thinking, NoToolCalls: req.ForceToolCall == "" && req.Format != nil})
	parser.Push(start) // the parser reads the forced start as generated: an open call
	er.Prompt, er.Checkpoints, err = s.encodePrompt(text+start, limit, over)
	return er, parser, err
}

// fim returns the fill-in-the-middle prompt of prefix and suffix: the
// vocabulary's FIM tokens around the texts, each encoded as a Prompt is,
// in limit tokens at most (over them, the error is over).
func (s *Session) fim(prefix, suffix string, limit int, over error) ([]int32, error) {
	var ids [3]int32
	for i, name := range fimTokens {
		id, ok := s.tok.TokenID(name)
		if !ok || !s.tok.IsSpecial(id) {
			return nil, ErrNoFIM
		}
		ids[i] = id
	}
	pre, err := s.encode(prefix, limit-3, over)
	if err != nil {
		return nil, err
	}
	suf, err := s.encode(suffix, limit-3-len(pre), over)
	if err != nil {
		return nil, err
	}
	return slices.Concat([]int32{ids[0]}, pre, []int32{ids[1]}, suf, []int32{ids[2]}), nil
}

// Close closes the engine, which ends every stream (FinishCancelled), and
// waits for the next turns being prepared to give up.
func (s *Session) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	err := s.eng.Close()
	s.turns.Wait()
	return err
}
