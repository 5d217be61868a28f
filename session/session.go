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
// from a request (a JSON schema, the tools' call format) becomes the
// engine.Request's Mask (engine.TokenMask), which the engine asks for the
// tokens allowed after those generated so far; the constrained text comes
// back through the same parser.
package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
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
	turns sync.WaitGroup
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
	// the output parser reads as if generated.
	ForceToolCall string

	Prompt    string
	PromptIDs []int32

	Sampling engine.Sampling
}

// Generate renders and tokenizes req, submits it to the engine and returns
// its stream. Its errors are those of the template and of engine.Generate
// (sampling parameters out of bounds, context overflow, a full queue, a
// closed engine). Cancelling ctx ends the stream with FinishCancelled.
func (s *Session) Generate(ctx context.Context, req *Request) (*Stream, error) {
	er, parser, err := s.prompt(req)
	if err != nil {
		return nil, err
	}
	er.Sampling = req.Sampling
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

// prompt returns a request's prompt as the engine takes it (its ids and
// message starts) and, for a conversation, the parser of its answer.
func (s *Session) prompt(req *Request) (engine.Request, *chat.Parser, error) {
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
	if len(req.PromptIDs) > 0 {
		er.Prompt = req.PromptIDs
		return er, nil, nil
	}
	if s.tok == nil {
		return er, nil, errors.New("session: no tokenizer: only token id prompts are served")
	}
	if req.Prompt != "" {
		er.Prompt, er.Checkpoints, _ = s.prompts.encode(req.Prompt)
		return er, nil, nil
	}
	if s.tmpl == nil {
		return er, nil, errors.New("session: the model has no chat template")
	}
	text, err := s.tmpl.Render(&chat.RenderInput{Messages: req.Messages, Tools: req.Tools, AddGenerationPrompt: true, Kwargs: req.TemplateKwargs})
	if err != nil {
		return er, nil, fmt.Errorf("session: render chat template: %w", err)
	}
	thinking := chat.OpensThinking(text)
	var start string
	if req.ForceToolCall != "" {
		if len(req.Tools) == 0 {
			return er, nil, errors.New("session: ForceToolCall needs tools")
		}
		name := req.ForceToolCall
		if name == "*" {
			name = ""
		}
		if start, err = s.tmpl.ToolCallStart(name); err != nil {
			return er, nil, fmt.Errorf("session: %w", err)
		}
		if thinking {
			start = "\n</think>\n\n" + start // an empty reasoning, as Qwen writes one
		}
	}
	parser := chat.NewParser(chat.ParserOptions{Tools: req.Tools, InThinking: thinking})
	parser.Push(start) // the parser reads the forced start as generated: an open call
	er.Prompt, er.Checkpoints, _ = s.prompts.encode(text + start)
	return er, parser, nil
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
