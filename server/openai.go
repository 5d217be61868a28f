package server

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"slices"
	"time"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/session"
)

// chatRequest is the body of POST /v1/chat/completions.
type chatRequest struct {
	Model    string        `json:"model"`
	Messages []wireMessage `json:"messages"`
	Stream   bool          `json:"stream"`
	// StreamOptions.IncludeUsage adds a last chunk with usage and no choices.
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Tools      []json.RawMessage `json:"tools"`
	ToolChoice json.RawMessage   `json:"tool_choice"`
	samplingFields
	MaxTokens           *int           `json:"max_tokens"`
	MaxCompletionTokens *int           `json:"max_completion_tokens"`
	Logprobs            bool           `json:"logprobs"`
	TopLogprobs         *int           `json:"top_logprobs"`
	ChatTemplateKwargs  map[string]any `json:"chat_template_kwargs"`
	ResponseFormat      *wireFormat    `json:"response_format"`
}

// wireMessage is a message as OpenAI clients send it.
type wireMessage struct {
	Role             string          `json:"role"`
	Content          messageContent  `json:"content"`
	ReasoningContent string          `json:"reasoning_content"`
	ToolCalls        []chat.ToolCall `json:"tool_calls"`
	ToolCallID       string          `json:"tool_call_id"`
	Name             string          `json:"name"`
}

func convertMessages(in []wireMessage) ([]chat.Message, error) {
	if len(in) == 0 {
		return nil, badRequest("messages", "messages must not be empty")
	}
	out := make([]chat.Message, len(in))
	for i, m := range in {
		role := m.Role
		switch role {
		case "developer": // OpenAI's newer name for system
			role = "system"
		case "system", "user", "assistant", "tool":
		default:
			return nil, badRequest("messages", "messages[%d].role must be system, developer, user, assistant or tool, not %q", i, m.Role)
		}
		calls := m.ToolCalls // the request's, perhaps another's too (resumable): not written
		for j, tc := range m.ToolCalls {
			if tc.Function.Name == "" {
				return nil, badRequest("messages", "messages[%d].tool_calls[%d].function.name is empty", i, j)
			}
			if len(tc.Function.Arguments) == 0 {
				if &calls[0] == &m.ToolCalls[0] {
					calls = slices.Clone(calls)
				}
				calls[j].Function.Arguments = json.RawMessage(`{}`)
			}
		}
		out[i] = chat.Message{Role: role, Content: string(m.Content), ReasoningContent: m.ReasoningContent,
			ToolCalls: calls, ToolCallID: m.ToolCallID, Name: m.Name}
	}
	return out, nil
}

// selectTools applies tool_choice. "none" drops the tools; "auto" keeps them
// all; "required" keeps them and forces a call ("*"); a named function keeps
// only that tool and forces a call of it (session.Request.ForceToolCall). The
// answer is then a call, its arguments constrained to the tool's schema.
func selectTools(tools []json.RawMessage, choice json.RawMessage) ([]chat.Tool, string, error) {
	for i, t := range tools {
		var def struct {
			Type     string `json:"type"`
			Function *struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		if err := json.Unmarshal(t, &def); err != nil || def.Function == nil || def.Function.Name == "" {
			return nil, "", badRequest("tools", "tools[%d] must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i)
		}
	}
	if len(choice) == 0 || string(choice) == "null" {
		return tools, "", nil
	}
	var mode string
	if json.Unmarshal(choice, &mode) == nil {
		switch mode {
		case "none":
			return nil, "", nil
		case "auto":
			return tools, "", nil
		case "required":
			if len(tools) == 0 {
				return nil, "", badRequest("tool_choice", "tool_choice is \"required\" but no tools were given")
			}
			return tools, "*", nil
		}
		return nil, "", badRequest("tool_choice", "tool_choice must be \"none\", \"auto\", \"required\" or a function, not %q", mode)
	}
	var named struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(choice, &named); err != nil || named.Function.Name == "" {
		return nil, "", badRequest("tool_choice", "tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}")
	}
	for _, t := range tools {
		var def struct {
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		json.Unmarshal(t, &def)
		if def.Function.Name == named.Function.Name {
			return []chat.Tool{t}, named.Function.Name, nil
		}
	}
	return nil, "", badRequest("tool_choice", "tool_choice names %q, which is not among the tools", named.Function.Name)
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) error {
	var req chatRequest
	keep, err := decodeChat(s, w, r, s.chats, &req)
	if err != nil {
		return err
	}
	if err := s.checkModel(req.Model); err != nil {
		return err
	}
	format, err := req.ResponseFormat.format()
	if err != nil {
		return err
	}
	msgs, err := convertMessages(req.Messages)
	if err != nil {
		return err
	}
	tools, force, err := selectTools(req.Tools, req.ToolChoice)
	if err != nil {
		return err
	}
	maxTokens := req.MaxTokens
	if req.MaxCompletionTokens != nil {
		maxTokens = req.MaxCompletionTokens
	}
	sp, err := s.sampling(&req.samplingFields, maxTokens)
	if err != nil {
		return err
	}
	top := 0
	if req.TopLogprobs != nil {
		top = *req.TopLogprobs
	}
	if err := s.setLogprobs(&sp, req.Logprobs, top); err != nil {
		return err
	}
	g, err := s.start(r, &session.Request{Messages: msgs, Tools: tools, ForceToolCall: force, Format: format,
		TemplateKwargs: req.ChatTemplateKwargs, Sampling: sp})
	if err != nil {
		return err
	}
	defer g.close()
	if keep != nil {
		keep() // the engine took it: its follow-up may resume from it
	}
	c := completionMeta{ID: "chatcmpl-" + randomID(), Created: time.Now().Unix(), Model: s.opts.ModelName}
	if req.Stream {
		includeUsage := req.StreamOptions != nil && req.StreamOptions.IncludeUsage
		return s.streamChat(w, g, c, includeUsage, req.Logprobs)
	}
	res, err := g.collect()
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.chatResponse(res, c, req.Logprobs))
	return nil
}

// chatResponse is the non-streamed chat.completion of a whole result.
func (s *Server) chatResponse(res *result, c completionMeta, logprobs bool) chatCompletion {
	msg := assistantMessage{Role: "assistant", Content: res.text.String(), ReasoningContent: res.reasoning.String()}
	for i, tc := range res.toolCalls {
		msg.ToolCalls = append(msg.ToolCalls, wireToolCall(i, tc, false))
	}
	choice := chatChoice{Message: msg, FinishReason: string(res.final.Finish)}
	if logprobs {
		choice.Logprobs = s.chatLogprobs(res.logprobs)
	}
	u := wireUsageOf(res.final)
	return chatCompletion{completionMeta: c, Object: "chat.completion", Choices: []chatChoice{choice}, Usage: &u}
}

// streamChat writes the stream as chat.completion.chunk events: a role
// chunk, content / reasoning_content / tool_calls deltas, a finish chunk,
// the usage chunk when asked for, then [DONE]. An engine failure after the
// response started is sent as an {"error": ...} event.
func (s *Server) streamChat(w http.ResponseWriter, g *generation, c completionMeta, includeUsage, logprobs bool) error {
	sw := s.newStreamWriter(w, g, "text/event-stream")
	chunk := func(d chunkDelta, finish string, lp []engine.Logprob) chatChunk {
		ch := chunkChoice{Delta: d}
		if finish != "" {
			ch.FinishReason = &finish
		}
		if logprobs && len(lp) > 0 {
			ch.Logprobs = s.chatLogprobs(lp)
		}
		return chatChunk{completionMeta: c, Object: "chat.completion.chunk", Choices: []chunkChoice{ch}}
	}
	empty := ""
	if err := sw.event(chunk(chunkDelta{Role: "assistant", Content: &empty}, "", nil)); err != nil {
		return err
	}
	ntools := 0
	for {
		ev := g.next()
		if ev.Text != "" || ev.Reasoning != "" || len(ev.ToolCalls) > 0 || len(ev.Logprobs) > 0 {
			d := chunkDelta{ReasoningContent: ev.Reasoning}
			if ev.Text != "" {
				d.Content = &ev.Text
			}
			for _, tc := range ev.ToolCalls {
				d.ToolCalls = append(d.ToolCalls, wireToolCall(ntools, tc, true))
				ntools++
			}
			if err := sw.event(chunk(d, "", ev.Logprobs)); err != nil {
				return err
			}
		}
		if !ev.Done {
			continue
		}
		if err := g.failure(ev); err != nil {
			ae := asAPIError(err)
			sw.event(map[string]any{"error": ae})
			sw.write([]byte("data: [DONE]\n\n"))
			return err
		}
		if err := sw.event(chunk(chunkDelta{}, string(ev.Finish), nil)); err != nil {
			return err
		}
		if includeUsage {
			u := wireUsageOf(ev)
			if err := sw.event(chatChunk{completionMeta: c, Object: "chat.completion.chunk", Choices: []chunkChoice{}, Usage: &u}); err != nil {
				return err
			}
		}
		return sw.write([]byte("data: [DONE]\n\n"))
	}
}

// completionRequest is the body of POST /v1/completions.
type completionRequest struct {
	Model  string          `json:"model"`
	Prompt json.RawMessage `json:"prompt"`
	Stream bool            `json:"stream"`
	// StreamOptions.IncludeUsage adds a last chunk with usage and no choices.
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	samplingFields
	MaxTokens *int   `json:"max_tokens"`
	Logprobs  *int   `json:"logprobs"`
	Echo      bool   `json:"echo"`
	Suffix    string `json:"suffix"`
	BestOf    *int   `json:"best_of"`
}

// parsePrompt accepts a string, an array of token ids, or a one-element
// array of either (OpenAI allows batches; kiln serves one prompt per request).
func parsePrompt(raw json.RawMessage) (string, []int32, error) {
	var text string
	if json.Unmarshal(raw, &text) == nil {
		if text == "" { // also null, which leaves text as it was
			return "", nil, badRequest("prompt", "prompt must not be empty")
		}
		return text, nil, nil
	}
	var ids []int32
	if json.Unmarshal(raw, &ids) == nil {
		if len(ids) == 0 {
			return "", nil, badRequest("prompt", "prompt must not be empty")
		}
		return "", ids, nil
	}
	var batch []json.RawMessage
	if json.Unmarshal(raw, &batch) == nil && len(batch) == 1 {
		return parsePrompt(batch[0])
	}
	if len(batch) > 1 {
		return "", nil, badRequest("prompt", "kiln takes one prompt per request, not %d", len(batch))
	}
	return "", nil, badRequest("prompt", "prompt must be a string or an array of token ids")
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) error {
	var req completionRequest
	if err := s.decodeRequest(w, r, &req); err != nil {
		return err
	}
	if err := s.checkModel(req.Model); err != nil {
		return err
	}
	switch {
	case req.Echo:
		return badRequest("echo", "echo is not supported")
	case req.BestOf != nil && *req.BestOf != 1:
		return badRequest("best_of", "best_of must be 1")
	}
	if len(req.Prompt) == 0 {
		return badRequest("prompt", "prompt is required")
	}
	text, ids, err := parsePrompt(req.Prompt)
	if err != nil {
		return err
	}
	if maxTokens := req.MaxTokens; maxTokens == nil {
		// OpenAI's default for completions is 16 tokens.
		n := 16
		req.MaxTokens = &n
	}
	sp, err := s.sampling(&req.samplingFields, req.MaxTokens)
	if err != nil {
		return err
	}
	top := 0
	if req.Logprobs != nil {
		top = *req.Logprobs
		if top > 5 {
			return badRequest("logprobs", "logprobs must be between 0 and 5, not %d", top)
		}
	}
	if err := s.setLogprobs(&sp, req.Logprobs != nil, top); err != nil {
		return err
	}
	if req.Suffix != "" && ids != nil {
		return badRequest("suffix", "suffix (fill-in-the-middle) needs a text prompt, not token ids")
	}
	g, err := s.start(r, &session.Request{Prompt: text, PromptIDs: ids, Suffix: req.Suffix, Sampling: sp})
	if err != nil {
		ae := asAPIError(err)
		if ae.Code != nil && *ae.Code == "context_length_exceeded" {
			param := "prompt" // not the chat route's messages
			ae.Param = &param
		}
		return ae
	}
	defer g.close()
	c := completionMeta{ID: "cmpl-" + randomID(), Created: time.Now().Unix(), Model: s.opts.ModelName}
	if req.Stream {
		sw := s.newStreamWriter(w, g, "text/event-stream")
		for {
			ev := g.next()
			if text := ev.Reasoning + ev.Text; text != "" || ev.Done {
				ch := textChoice{Text: text}
				if req.Logprobs != nil && len(ev.Logprobs) > 0 {
					ch.Logprobs = s.textLogprobs(ev.Logprobs)
				}
				if ev.Done {
					if err := g.failure(ev); err != nil {
						sw.event(map[string]any{"error": asAPIError(err)})
						sw.write([]byte("data: [DONE]\n\n"))
						return err
					}
					f := string(ev.Finish)
					ch.FinishReason = &f
				}
				if err := sw.event(textCompletion{completionMeta: c, Object: "text_completion", Choices: []textChoice{ch}}); err != nil {
					return err
				}
			}
			if ev.Done {
				if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
					u := wireUsageOf(ev)
					if err := sw.event(textCompletion{completionMeta: c, Object: "text_completion", Choices: []textChoice{}, Usage: &u}); err != nil {
						return err
					}
				}
				return sw.write([]byte("data: [DONE]\n\n"))
			}
		}
	}
	res, err := g.collect()
	if err != nil {
		return err
	}
	f := string(res.final.Finish)
	ch := textChoice{Text: res.reasoning.String() + res.text.String(), FinishReason: &f}
	if req.Logprobs != nil {
		ch.Logprobs = s.textLogprobs(res.logprobs)
	}
	u := wireUsageOf(res.final)
	writeJSON(w, http.StatusOK, textCompletion{completionMeta: c, Object: "text_completion", Choices: []textChoice{ch}, Usage: &u})
	return nil
}

func (s *Server) modelObject() map[string]any {
	m := map[string]any{"id": s.opts.ModelName, "object": "model", "created": s.started.Unix(), "owned_by": "kiln"}
	m["max_model_len"] = s.contextLength()
	return m
}

func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{s.modelObject()}})
}

func (s *Server) getModel(w http.ResponseWriter, r *http.Request) {
	if err := s.checkModel(r.PathValue("id")); err != nil || r.PathValue("id") == "" {
		writeOpenAIError(w, notFound("model_not_found", "the model %q does not exist; this server serves %q", r.PathValue("id"), s.opts.ModelName))
		return
	}
	writeJSON(w, http.StatusOK, s.modelObject())
}

// Wire types of responses.

type completionMeta struct {
	ID      string `json:"id"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
}

type wireUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func wireUsageOf(ev session.Event) wireUsage {
	u := usageOf(ev)
	w := wireUsage{PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, TotalTokens: u.PromptTokens + u.CompletionTokens}
	w.PromptTokensDetails.CachedTokens = u.CachedTokens
	return w
}

type chatCompletion struct {
	completionMeta
	Object  string       `json:"object"`
	Choices []chatChoice `json:"choices"`
	Usage   *wireUsage   `json:"usage,omitempty"`
}

type chatChoice struct {
	Index        int              `json:"index"`
	Message      assistantMessage `json:"message"`
	Logprobs     *chatLogprobList `json:"logprobs"`
	FinishReason string           `json:"finish_reason"`
}

type assistantMessage struct {
	Role             string         `json:"role"`
	Content          string         `json:"content"`
	ReasoningContent string         `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCallWire `json:"tool_calls,omitempty"`
}

// toolCallWire is a tool call as OpenAI sends it; Index is set only in
// stream deltas.
type toolCallWire struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

func wireToolCall(i int, tc chat.ToolCall, delta bool) toolCallWire {
	w := toolCallWire{ID: tc.ID, Type: "function"}
	if w.ID == "" {
		w.ID = "call_" + randomID()[:24]
	}
	if delta {
		w.Index = &i
	}
	w.Function.Name = tc.Function.Name
	w.Function.Arguments = argumentsString(tc.Function.Arguments)
	return w
}

type chatChunk struct {
	completionMeta
	Object  string        `json:"object"`
	Choices []chunkChoice `json:"choices"`
	Usage   *wireUsage    `json:"usage,omitempty"`
}

type chunkChoice struct {
	Index        int              `json:"index"`
	Delta        chunkDelta       `json:"delta"`
	Logprobs     *chatLogprobList `json:"logprobs,omitempty"`
	FinishReason *string          `json:"finish_reason"`
}

type chunkDelta struct {
	Role             string         `json:"role,omitempty"`
	Content          *string        `json:"content,omitempty"`
	ReasoningContent string         `json:"reasoning_content,omitempty"`
	ToolCalls        []toolCallWire `json:"tool_calls,omitempty"`
}

type chatLogprobList struct {
	Content []chatLogprob `json:"content"`
}

type chatLogprob struct {
	Token       string           `json:"token"`
	Logprob     float32          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

type chatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

func tokenBytes(s string) []int {
	b := make([]int, len(s))
	for i := 0; i < len(s); i++ {
		b[i] = int(s[i])
	}
	return b
}

func (s *Server) chatLogprobs(lp []engine.Logprob) *chatLogprobList {
	out := &chatLogprobList{Content: make([]chatLogprob, len(lp))}
	for i, t := range lp {
		text := s.tokenText(t.Token)
		c := chatLogprob{Token: text, Logprob: t.Logprob, Bytes: tokenBytes(text), TopLogprobs: make([]chatTopLogprob, len(t.Top))}
		for j, alt := range t.Top {
			at := s.tokenText(alt.Token)
			c.TopLogprobs[j] = chatTopLogprob{Token: at, Logprob: alt.Logprob, Bytes: tokenBytes(at)}
		}
		out.Content[i] = c
	}
	return out
}

type textCompletion struct {
	completionMeta
	Object  string       `json:"object"`
	Choices []textChoice `json:"choices"`
	Usage   *wireUsage   `json:"usage,omitempty"`
}

type textChoice struct {
	Index        int              `json:"index"`
	Text         string           `json:"text"`
	Logprobs     *textLogprobList `json:"logprobs"`
	FinishReason *string          `json:"finish_reason"`
}

// textLogprobList is the legacy completions logprobs shape.
type textLogprobList struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float32            `json:"token_logprobs"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

func (s *Server) textLogprobs(lp []engine.Logprob) *textLogprobList {
	out := &textLogprobList{}
	off := 0
	for _, t := range lp {
		text := s.tokenText(t.Token)
		out.Tokens = append(out.Tokens, text)
		out.TokenLogprobs = append(out.TokenLogprobs, t.Logprob)
		top := make(map[string]float32, len(t.Top))
		for _, alt := range t.Top {
			top[s.tokenText(alt.Token)] = alt.Logprob
		}
		out.TopLogprobs = append(out.TopLogprobs, top)
		out.TextOffset = append(out.TextOffset, off)
		off += len(text)
	}
	return out
}

func randomID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
