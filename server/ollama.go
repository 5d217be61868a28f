package server

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/session"
)

// ollamaOptions are the "options" of an Ollama request that kiln honours;
// the rest (num_gpu, num_thread, ...) are about loading and are ignored,
// since the model is already loaded. num_ctx bounds the request's context
// below the server's (a larger one is the server's).
type ollamaOptions struct {
	NumCtx           *int       `json:"num_ctx"`
	Temperature      *float32   `json:"temperature"`
	TopP             *float32   `json:"top_p"`
	TopK             *int       `json:"top_k"`
	MinP             *float32   `json:"min_p"`
	Seed             *int64     `json:"seed"`
	NumPredict       *int       `json:"num_predict"`
	Stop             stringList `json:"stop"`
	RepeatPenalty    *float32   `json:"repeat_penalty"`
	PresencePenalty  *float32   `json:"presence_penalty"`
	FrequencyPenalty *float32   `json:"frequency_penalty"`
}

// ollamaCommon are the fields /api/chat and /api/generate share.
type ollamaCommon struct {
	Model   string          `json:"model"`
	Stream  *bool           `json:"stream"` // Ollama streams unless told not to
	Options ollamaOptions   `json:"options"`
	Format  json.RawMessage `json:"format"`
	Think   json.RawMessage `json:"think"`
	// KeepAlive is how long Ollama keeps the model loaded after the
	// request. kiln's server is its one model's life: the model stays
	// until the server stops, so keep_alive is checked (keepAlive) and has
	// no other effect.
	KeepAlive json.RawMessage `json:"keep_alive"`
}

// keepAlive checks a keep_alive as Ollama reads it: a duration string
// ("5m", "1h30m", "-1"), or a number of seconds (negative: forever).
func keepAlive(raw json.RawMessage) error {
	if v := strings.TrimSpace(string(raw)); v == "" || v == "null" {
		return nil
	}
	var secs float64
	if json.Unmarshal(raw, &secs) == nil {
		return nil
	}
	var str string
	if json.Unmarshal(raw, &str) == nil {
		if _, err := time.ParseDuration(str); err == nil {
			return nil
		}
		if _, err := strconv.ParseFloat(str, 64); err == nil {
			return nil
		}
	}
	return badRequest("keep_alive", "keep_alive must be a duration such as \"5m\" or a number of seconds, not %s", raw)
}

type ollamaMessage struct {
	Role      string           `json:"role"`
	Content   string           `json:"content"`
	Thinking  string           `json:"thinking,omitempty"`
	Images    []string         `json:"images,omitempty"`
	ToolCalls []ollamaToolCall `json:"tool_calls,omitempty"`
	ToolName  string           `json:"tool_name,omitempty"`
}

type ollamaToolCall struct {
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// prepareOllama checks the shared fields and returns the request they make:
// its sampling parameters, context and template variables.
func (s *Server) prepareOllama(c *ollamaCommon) (*session.Request, error) {
	if err := s.checkModel(c.Model); err != nil {
		return nil, err
	}
	format, err := ollamaFormat(c.Format)
	if err != nil {
		return nil, err
	}
	if err := keepAlive(c.KeepAlive); err != nil {
		return nil, err
	}
	o := c.Options
	f := samplingFields{Temperature: o.Temperature, TopP: o.TopP, TopK: o.TopK, MinP: o.MinP, Seed: o.Seed, Stop: o.Stop,
		RepetitionPenalty: o.RepeatPenalty, PresencePenalty: o.PresencePenalty, FrequencyPenalty: o.FrequencyPenalty}
	maxTokens := o.NumPredict
	if maxTokens != nil && *maxTokens < 0 { // -1: unlimited, -2: fill the context
		maxTokens = nil
	}
	sp, err := s.sampling(&f, maxTokens)
	if err != nil {
		return nil, err
	}
	req := &session.Request{Sampling: sp, ClampMaxTokens: true, Format: format}
	if n := o.NumCtx; n != nil {
		if *n < 1 {
			return nil, badRequest("num_ctx", "num_ctx must be at least 1, not %d", *n)
		}
		req.Context = *n
	}
	if t := strings.TrimSpace(string(c.Think)); t != "" && t != "null" {
		var on bool
		var level string
		switch {
		case json.Unmarshal(c.Think, &on) == nil:
		case json.Unmarshal(c.Think, &level) == nil:
			on = level != "" && level != "none"
		default:
			return nil, badRequest("think", "think must be a boolean or a level")
		}
		req.TemplateKwargs = thinkingKwargs(nil, on)
	}
	return req, nil
}

func streaming(c *ollamaCommon) bool { return c.Stream == nil || *c.Stream }

// ollamaDone is the last object of an Ollama response: why it stopped and
// the timings, in nanoseconds.
type ollamaDone struct {
	DoneReason         string `json:"done_reason,omitempty"`
	TotalDuration      int64  `json:"total_duration,omitempty"`
	LoadDuration       int64  `json:"load_duration,omitempty"`
	PromptEvalCount    int    `json:"prompt_eval_count,omitempty"`
	PromptEvalDuration int64  `json:"prompt_eval_duration,omitempty"`
	EvalCount          int    `json:"eval_count,omitempty"`
	EvalDuration       int64  `json:"eval_duration,omitempty"`
}

func ollamaDoneOf(ev session.Event, start time.Time) ollamaDone {
	u := usageOf(ev)
	reason := string(ev.Finish)
	if ev.Finish == session.FinishToolCalls {
		reason = "stop" // Ollama reports tool calls in the message, not here
	}
	return ollamaDone{DoneReason: reason, TotalDuration: int64(time.Since(start)), PromptEvalCount: u.PromptTokens,
		PromptEvalDuration: int64(u.TTFT), EvalCount: u.CompletionTokens, EvalDuration: int64(u.Duration - u.TTFT)}
}

// ollamaChunk is one object of an Ollama response; Message is set for
// /api/chat, Response and Thinking for /api/generate.
type ollamaChunk struct {
	Model     string         `json:"model"`
	CreatedAt string         `json:"created_at"`
	Message   *ollamaMessage `json:"message,omitempty"`
	Response  *string        `json:"response,omitempty"`
	Thinking  string         `json:"thinking,omitempty"`
	Done      bool           `json:"done"`
	ollamaDone
}

// respondOllama streams g as NDJSON, or collects it into one object.
// render fills a chunk with an event's (or the whole result's) output.
func (s *Server) respondOllama(w http.ResponseWriter, g *generation, stream bool, render func(ch *ollamaChunk, text, thinking string, calls []chat.ToolCall)) error {
	start := time.Now()
	newChunk := func() ollamaChunk {
		return ollamaChunk{Model: s.opts.ModelName, CreatedAt: time.Now().UTC().Format(time.RFC3339Nano)}
	}
	if !stream {
		res, err := g.collect()
		if err != nil {
			return err
		}
		ch := newChunk()
		render(&ch, res.text.String(), res.reasoning.String(), res.toolCalls)
		ch.Done, ch.ollamaDone = true, ollamaDoneOf(res.final, start)
		writeJSON(w, http.StatusOK, ch)
		return nil
	}
	sw := s.newStreamWriter(w, g, "application/x-ndjson")
	for {
		ev := g.next()
		if ev.Done {
			if err := g.failure(ev); err != nil {
				sw.line(map[string]string{"error": asAPIError(err).Message})
				return err
			}
		}
		if ev.Text != "" || ev.Reasoning != "" || len(ev.ToolCalls) > 0 || ev.Done {
			ch := newChunk()
			render(&ch, ev.Text, ev.Reasoning, ev.ToolCalls)
			if ev.Done {
				ch.Done, ch.ollamaDone = true, ollamaDoneOf(ev, start)
			}
			if err := sw.line(ch); err != nil {
				return err
			}
		}
		if ev.Done {
			return nil
		}
	}
}

type ollamaChatRequest struct {
	ollamaCommon
	Messages []ollamaMessage   `json:"messages"`
	Tools    []json.RawMessage `json:"tools"`
}

func (s *Server) ollamaChat(w http.ResponseWriter, r *http.Request) error {
	var req ollamaChatRequest
	keep, err := decodeChat(s, w, r, s.ollamaChats, &req)
	if err != nil {
		return err
	}
	sr, err := s.prepareOllama(&req.ollamaCommon)
	if err != nil {
		return err
	}
	if len(req.Messages) == 0 {
		// Ollama answers an empty chat by loading the model.
		writeJSON(w, http.StatusOK, ollamaChunk{Model: s.opts.ModelName, CreatedAt: time.Now().UTC().Format(time.RFC3339Nano),
			Message: &ollamaMessage{Role: "assistant"}, Done: true, ollamaDone: ollamaDone{DoneReason: "load"}})
		return nil
	}
	msgs := make([]chat.Message, len(req.Messages))
	for i, m := range req.Messages {
		switch m.Role {
		case "system", "user", "assistant", "tool":
		default:
			return badRequest("messages", "messages[%d].role must be system, user, assistant or tool, not %q", i, m.Role)
		}
		if len(m.Images) > 0 {
			return badRequest("messages", "messages[%d] has images; this model accepts only text", i)
		}
		msg := chat.Message{Role: m.Role, Content: m.Content, ReasoningContent: m.Thinking, Name: m.ToolName}
		for _, tc := range m.ToolCalls {
			args := tc.Function.Arguments
			if len(args) == 0 {
				args = json.RawMessage(`{}`)
			}
			msg.ToolCalls = append(msg.ToolCalls, chat.ToolCall{Type: "function", Function: chat.FunctionCall{Name: tc.Function.Name, Arguments: args}})
		}
		msgs[i] = msg
	}
	tools, _, err := selectTools(req.Tools, nil)
	if err != nil {
		return err
	}
	sr.Messages, sr.Tools = msgs, tools
	g, err := s.start(r, sr)
	if err != nil {
		return err
	}
	defer g.close()
	if keep != nil {
		keep() // the engine took it: its follow-up may resume from it
	}
	return s.respondOllama(w, g, streaming(&req.ollamaCommon), renderOllamaChat)
}

// renderOllamaChat puts output into an /api/chat chunk's message.
func renderOllamaChat(ch *ollamaChunk, text, thinking string, calls []chat.ToolCall) {
	m := &ollamaMessage{Role: "assistant", Content: text, Thinking: thinking}
	for _, tc := range calls {
		var oc ollamaToolCall
		oc.Function.Name, oc.Function.Arguments = tc.Function.Name, argumentsObject(tc.Function.Arguments)
		m.ToolCalls = append(m.ToolCalls, oc)
	}
	ch.Message = m
}

type ollamaGenerateRequest struct {
	ollamaCommon
	Prompt string   `json:"prompt"`
	System string   `json:"system"`
	Raw    bool     `json:"raw"`
	Images []string `json:"images"`
	Suffix string   `json:"suffix"`
}

func (s *Server) ollamaGenerate(w http.ResponseWriter, r *http.Request) error {
	var req ollamaGenerateRequest
	if err := s.decodeRequest(w, r, &req); err != nil {
		return err
	}
	er, err := s.prepareOllama(&req.ollamaCommon)
	if err != nil {
		return err
	}
	if len(req.Images) > 0 {
		return badRequest("images", "images are not supported; this model accepts only text")
	}
	if req.Prompt == "" {
		empty := ""
		writeJSON(w, http.StatusOK, ollamaChunk{Model: s.opts.ModelName, CreatedAt: time.Now().UTC().Format(time.RFC3339Nano),
			Response: &empty, Done: true, ollamaDone: ollamaDone{DoneReason: "load"}})
		return nil
	}
	er.Prompt = req.Prompt
	switch {
	case req.Suffix != "":
		// Fill-in-the-middle, as Ollama's FIM templates write it: the
		// prompt and the suffix alone, without the chat template.
		er.Suffix, er.TemplateKwargs = req.Suffix, nil
	case !req.Raw:
		er.Prompt = ""
		if req.System != "" {
			er.Messages = append(er.Messages, chat.Message{Role: "system", Content: req.System})
		}
		er.Messages = append(er.Messages, chat.Message{Role: "user", Content: req.Prompt})
	}
	g, err := s.start(r, er)
	if err != nil {
		return err
	}
	defer g.close()
	return s.respondOllama(w, g, streaming(&req.ollamaCommon), func(ch *ollamaChunk, text, thinking string, _ []chat.ToolCall) {
		if req.Raw {
			text, thinking = thinking+text, ""
		}
		ch.Response, ch.Thinking = &text, thinking
	})
}

// ollamaPs lists the loaded model, as Ollama's /api/ps does. kiln keeps it
// loaded for the server's life, so it never expires; size is its files'
// (size_vram is not tracked).
func (s *Server) ollamaPs(w http.ResponseWriter, r *http.Request) {
	name := ollamaName(s.opts.ModelName)
	m := map[string]any{
		"name": name, "model": name, "size": 0, "size_vram": 0, "digest": "",
		"details": ollamaDetails(s.opts.Served, s.describe(s.opts.Served)), "expires_at": "9999-12-31T23:59:59Z",
	}
	if sv := s.opts.Served; sv != nil {
		m["size"], m["digest"] = sv.Size, sv.Digest
	}
	m["context_length"] = s.contextLength()
	writeJSON(w, http.StatusOK, map[string]any{"models": []any{m}})
}

func (s *Server) ollamaVersion(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"version": "0.12.0"})
}
