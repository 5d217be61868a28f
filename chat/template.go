package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"

	"github.com/kiln-llm/kiln/internal/mapfile"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// Template is a model's chat template, compiled once and safe for concurrent
// use. It renders like transformers' apply_chat_template(..., tokenize=False):
// a sandboxed Jinja environment with trim_blocks and lstrip_blocks, Python's
// json.dumps behind tojson, raise_exception and strftime_now.
type Template struct {
	tpl    *exec.Template
	cfg    *config.Config
	loader loaders.Loader
	vars   map[string]any // the tokenizer's special tokens
	// plain: every output takes gonja's path (tests compare it with
	// outputNode's parts)
	plain bool

	// The template's tool call form, found once (see ToolCallStart).
	callOnce sync.Once
	callXML  bool
	callErr  error
}

// RenderInput is one rendering: the conversation, the tools offered,
// whether to open the assistant's turn, and extra template variables
// (chat_template_kwargs: enable_thinking, reasoning_effort, ...).
type RenderInput struct {
	Messages            []Message
	Tools               []Tool
	AddGenerationPrompt bool
	Kwargs              map[string]any
	// Limits bound the rendering; zero fields take DefaultLimits.
	Limits Limits
}

// TemplateError is an error the template raised itself with
// raise_exception; Error returns the template's message unchanged.
type TemplateError struct{ Message string }

func (e *TemplateError) Error() string { return e.Message }

// Limits on the files a template comes from, far above real ones (Qwen's
// templates are under 10 KB, their tokenizer_config.json under 1 MB).
const (
	maxTemplateSize = 1 << 20
	maxConfigSize   = 64 << 20
)

// LoadTemplate reads the chat template of a model directory:
// chat_template.jinja, else the "chat_template" of tokenizer_config.json (a
// string, or a list of {"name", "template"} of which "default" is used).
// The special tokens of tokenizer_config.json (bos_token, eos_token, ...)
// become template variables.
func LoadTemplate(fsys fs.FS) (*Template, error) {
	var cfg map[string]json.RawMessage
	raw, err := mapfile.ReadFS(fsys, "tokenizer_config.json", maxConfigSize)
	switch {
	case err == nil:
		if err := json.Unmarshal(raw, &cfg); err != nil {
			return nil, fmt.Errorf("tokenizer_config.json: %w", err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	src, err := mapfile.ReadFS(fsys, "chat_template.jinja", maxTemplateSize)
	if errors.Is(err, fs.ErrNotExist) {
		src, err = configTemplate(cfg["chat_template"])
	}
	if err != nil {
		return nil, err
	}
	t, err := ParseTemplate(string(src))
	if err != nil {
		return nil, err
	}
	for name, v := range cfg {
		if !strings.HasSuffix(name, "_token") {
			continue
		}
		if tok, ok := specialToken(v); ok {
			t.vars[name] = tok
		}
	}
	return t, nil
}

func configTemplate(raw json.RawMessage) ([]byte, error) {
	if raw == nil {
		return nil, errors.New("no chat template: neither chat_template.jinja nor a chat_template in tokenizer_config.json")
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []byte(s), nil
	}
	var named []struct{ Name, Template string }
	if err := json.Unmarshal(raw, &named); err != nil {
		return nil, fmt.Errorf("tokenizer_config.json: chat_template is neither a string nor a list of named templates: %w", err)
	}
	for _, n := range named {
		if n.Name == "default" {
			return []byte(n.Template), nil
		}
	}
	return nil, errors.New(`tokenizer_config.json: chat_template lists no "default" template`)
}

// specialToken reads a special token as tokenizer_config.json spells it: a
// string, or an added-token object with its "content"; null is no token.
func specialToken(raw json.RawMessage) (string, bool) {
	var s *string
	if json.Unmarshal(raw, &s) == nil && s != nil {
		return *s, true
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != nil {
		return *obj.Content, true
	}
	return "", false
}

// ParseTemplate compiles a chat template's Jinja source and renders a
// sample conversation with it under DefaultLimits, so that a template that
// loops, recurses or builds without end is refused when the model loads
// rather than on its first request.
func ParseTemplate(src string) (*Template, error) {
	t, err := compile(src)
	if err != nil {
		return nil, err
	}
	if err := t.probe(); err != nil {
		return nil, err
	}
	return t, nil
}

// compile parses and rewrites a template (sandbox.go).
func compile(src string) (t *Template, err error) {
	// gonja's parser dereferences nil on some malformed sources.
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("chat template: cannot parse it: %v", r)
		}
	}()
	if len(src) > maxTemplateSize {
		return nil, fmt.Errorf("chat template: %d bytes, more than the %d allowed", len(src), maxTemplateSize)
	}
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	// Jinja's lexer turns every line break of the source into "\n" (and,
	// like gonja, drops one at the end: keep_trailing_newline is off).
	src = strings.NewReplacer("\r\n", "\n", "\r", "\n").Replace(src)
	if err := checkSource(src); err != nil {
		return nil, err
	}
	src = rewriteConditionals(src)
	// A memory loader holding only the template; the statements that would
	// read it again are refused anyway.
	loader, err := loaders.NewMemoryLoader(map[string]string{"/chat_template": src})
	if err != nil {
		return nil, err
	}
	tpl, err := exec.NewTemplate("/chat_template", cfg, loader, parseEnvironment)
	if err != nil {
		// gonja's message quotes the whole source; keep only its cause.
		if cause := errors.Unwrap(err); cause != nil {
			err = cause
		}
		return nil, fmt.Errorf("chat template: %w", err)
	}
	if err := rewrite(tpl.Root()); err != nil {
		return nil, err
	}
	return &Template{tpl: tpl, cfg: cfg, loader: loader, vars: map[string]any{}}, nil
}

// probe renders sample conversations (with tools, reasoning, a tool call
// and its answer; and a lone question). Only a limit fails it: a template
// may well raise, or fail on what kiln sends, for conversations it does
// not take, and those requests get the same error.
func (t *Template) probe() error {
	args := json.RawMessage(`{"city": "Paris"}`)
	for _, in := range []*RenderInput{
		{Messages: []Message{{Role: "user", Content: "Hello"}}, AddGenerationPrompt: true},
		{
			Messages: []Message{
				{Role: "system", Content: "You are helpful."},
				{Role: "user", Content: "What is the weather in Paris?"},
				{Role: "assistant", ReasoningContent: "Look it up.", ToolCalls: []ToolCall{{ID: "call_0", Type: "function", Function: FunctionCall{Name: "get_weather", Arguments: args}}}},
				{Role: "tool", ToolCallID: "call_0", Content: "sunny"},
				{Role: "assistant", Content: "It is sunny."},
				{Role: "user", Content: "Thanks"},
			},
			Tools:               []Tool{Tool(`{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}`)},
			AddGenerationPrompt: true,
		},
	} {
		if _, err := t.Render(in); errors.Is(err, ErrLimit) {
			return fmt.Errorf("%w (refused at load, rendering a sample conversation)", err)
		}
	}
	return nil
}

// reserved are the variables transformers passes itself; a kwarg may not
// replace them.
var reserved = map[string]bool{"messages": true, "tools": true, "documents": true, "add_generation_prompt": true}

// Render renders a conversation into the prompt text. An error the template
// raises comes back as a *TemplateError with the template's message.
func (t *Template) Render(in *RenderInput) (string, error) {
	return t.RenderContext(context.Background(), in)
}

// RenderContext is Render stopped when ctx is done (a client gone, a
// request timeout). A rendering stopped at one of in.Limits returns an
// error matching ErrLimit.
func (t *Template) RenderContext(ctx context.Context, in *RenderInput) (out string, err error) {
	lim := in.Limits
	if lim.Steps == 0 {
		lim.Steps = DefaultLimits.Steps + StepsPerMessage*(len(in.Messages)+len(in.Tools))
	}
	b, done := newBudget(ctx, lim)
	b.plain = t.plain
	defer done()
	// A template is code from the model's files: a fault in it, or in
	// gonja, fails this request only.
	defer func() {
		if r := recover(); r != nil {
			if a, ok := r.(*abort); ok {
				out, err = "", a.err
				return
			}
			out, err = "", fmt.Errorf("chat template: %v", r)
		}
	}()
	messages, err := messageValues(in.Messages)
	if err != nil {
		return "", err
	}
	var tools any = none
	if in.Tools != nil {
		list := make(pyList, len(in.Tools))
		for i, tool := range in.Tools {
			if list[i], err = decodeJSON(tool); err != nil {
				return "", fmt.Errorf("tool %d: %w", i, err)
			}
		}
		tools = list
	}
	data := map[string]any{}
	for k, v := range t.vars {
		data[k] = v
	}
	for k, v := range in.Kwargs {
		if reserved[k] {
			return "", fmt.Errorf("chat template kwarg %q would replace a variable the template is given", k)
		}
		raw, err := json.Marshal(v)
		if err != nil {
			return "", fmt.Errorf("chat template kwarg %q: %w", k, err)
		}
		if data[k], err = decodeJSON(raw); err != nil {
			return "", fmt.Errorf("chat template kwarg %q: %w", k, err)
		}
	}
	data["messages"] = messages
	data["tools"] = tools
	data["documents"] = none
	data["add_generation_prompt"] = in.AddGenerationPrompt

	// raise_exception's message is kept aside: gonja wraps errors in values
	// that do not unwrap, so it could not be recovered from the error chain.
	var raised *TemplateError
	data["raise_exception"] = func(args *exec.VarArgs) *exec.Value {
		raised = &TemplateError{Message: pyStr(args.First())}
		return exec.AsValue(raised)
	}
	w := &limitWriter{b: b}
	env := &exec.Environment{
		Filters:           filterSet,
		Tests:             testSet,
		ControlStructures: controlStructureSet,
		Context:           b.context(data),
		Methods:           noMethods,
	}
	err = exec.NewRenderer(env, w, t.cfg, t.loader, t.tpl).Execute()
	if raised != nil {
		return "", raised
	}
	if err != nil {
		return "", fmt.Errorf("chat template: %w", err)
	}
	return w.buf.String(), nil
}

// messageValues gives messages to the template as Python dicts, keys in
// chat.Message's JSON order, empty optional fields absent (undefined).
func messageValues(msgs []Message) (pyList, error) {
	out := make(pyList, len(msgs))
	for i, m := range msgs {
		d := exec.NewDict()
		setKey(d, "role", m.Role)
		setKey(d, "content", m.Content)
		if m.ReasoningContent != "" {
			setKey(d, "reasoning_content", m.ReasoningContent)
		}
		if len(m.ToolCalls) > 0 {
			calls := make(pyList, len(m.ToolCalls))
			for j, c := range m.ToolCalls {
				cd := exec.NewDict()
				if c.ID != "" {
					setKey(cd, "id", c.ID)
				}
				if c.Type != "" {
					setKey(cd, "type", c.Type)
				}
				fn := exec.NewDict()
				setKey(fn, "name", c.Function.Name)
				var args any = none
				if len(c.Function.Arguments) > 0 {
					var err error
					if args, err = decodeJSON(c.Function.Arguments); err != nil {
						return nil, fmt.Errorf("message %d, tool call %d: arguments: %w", i, j, err)
					}
				}
				setKey(fn, "arguments", args)
				setKey(cd, "function", fn)
				calls[j] = cd
			}
			setKey(d, "tool_calls", calls)
		}
		if m.ToolCallID != "" {
			setKey(d, "tool_call_id", m.ToolCallID)
		}
		if m.Name != "" {
			setKey(d, "name", m.Name)
		}
		out[i] = d
	}
	return out, nil
}

// OpensThinking reports whether a rendered prompt leaves the model inside an
// open <think> block (the template wrote "<think>" for the assistant's turn
// and no "</think>" after it), so that generation starts with reasoning.
// Only the last turn (from the last "<|im_start|>") counts, so a "<think>"
// quoted in an earlier message does not.
func OpensThinking(prompt string) bool {
	if i := strings.LastIndex(prompt, "<|im_start|>"); i >= 0 {
		prompt = prompt[i:]
	}
	open := strings.LastIndex(prompt, thinkOpen)
	return open >= 0 && strings.LastIndex(prompt, thinkClose) < open
}

// parseEnvironment is what the parser reads: the statements a template may
// use. Rendering builds its own (RenderContext).
var parseEnvironment = &exec.Environment{
	Context:           exec.EmptyContext(),
	Filters:           filterSet,
	Tests:             testSet,
	ControlStructures: controlStructureSet,
}

// ToolCallStart returns the text that begins a tool call in this template's
// format, for making an answer start with one: through the function's name
// and up to its arguments when name is set, up to the name when it is
// empty. The format is the template's own (Qwen3's JSON object, or the
// <function=...> form of Qwen3-Coder and Qwen3.5), found by rendering a
// call; a template that renders no <tool_call> is an error.
func (t *Template) ToolCallStart(name string) (string, error) {
	xml, err := t.callForm()
	switch {
	case err != nil:
		return "", err
	case xml && name == "":
		return "<tool_call>\n<function=", nil
	case xml:
		return "<tool_call>\n<function=" + name + ">\n", nil
	case name == "":
		return "<tool_call>\n{\"name\": \"", nil
	}
	return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": ", nil
}

// callForm finds, once, the template's tool call form: XML (<function=...>)
// or JSON.
func (t *Template) callForm() (xml bool, err error) {
	t.callOnce.Do(func() {
		const probe = "kiln_probe_function"
		out, err := t.Render(&RenderInput{Messages: []Message{{Role: "user", Content: "x"},
			{Role: "assistant", ToolCalls: []ToolCall{{Type: "function", Function: FunctionCall{Name: probe, Arguments: json.RawMessage(`{}`)}}}}}})
		switch {
		case err != nil:
			t.callErr = err
		case !strings.Contains(out, "<tool_call>") || !strings.Contains(out, probe):
			t.callErr = errors.New("the chat template writes no tool calls")
		}
		t.callXML = strings.Contains(out, "<function="+probe)
	})
	return t.callXML, t.callErr
}
