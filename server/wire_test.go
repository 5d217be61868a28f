package server

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/session"
)

// The tiny test models do not write tool calls, so the encoding of the
// session's tool-call and reasoning events is checked here on a fixed event
// sequence, decoded by openai-go as a client would.
func toolCallEvents() []session.Event {
	return []session.Event{
		{Tokens: []int32{1, 2}, Reasoning: "The user wants weather."},
		{Tokens: []int32{3}, Text: "Let me check."},
		{Tokens: []int32{4, 5, 6}, ToolCalls: []chat.ToolCall{{Function: chat.FunctionCall{Name: "get_weather", Arguments: json.RawMessage(`{"city": "Paris"}`)}}}},
		{Tokens: []int32{7}, ToolCalls: []chat.ToolCall{{ID: "call_x", Function: chat.FunctionCall{Name: "get_time", Arguments: json.RawMessage(`"{\"tz\": \"CET\"}"`)}}}},
		{Done: true, Finish: session.FinishToolCalls, Usage: &engine.Usage{PromptTokens: 30, CachedTokens: 16, CompletionTokens: 7}},
	}
}

// replay is a generation whose stream gives events.
func replay(events []session.Event) *generation {
	ctx, cancel := context.WithCancel(context.Background())
	return &generation{ctx: ctx, cancel: cancel, read: func() session.Event {
		ev := events[0]
		if !ev.Done {
			events = events[1:]
		}
		return ev
	}}
}

func TestToolCallStreamEncoding(t *testing.T) {
	s := &Server{opts: Options{ModelName: testModel}} // the encoders alone
	rec := httptest.NewRecorder()
	if err := s.streamChat(rec, replay(toolCallEvents()), completionMeta{ID: "chatcmpl-1", Model: testModel}, true, false); err != nil {
		t.Fatal(err)
	}
	var acc openai.ChatCompletionAccumulator
	var finished []openai.FinishedChatCompletionToolCall
	var reasoning strings.Builder
	for _, line := range strings.Split(rec.Body.String(), "\n\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk openai.ChatCompletionChunk
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		if !acc.AddChunk(chunk) {
			t.Fatalf("accumulator rejected %s", data)
		}
		if tc, ok := acc.JustFinishedToolCall(); ok {
			finished = append(finished, tc)
		}
		for _, c := range chunk.Choices {
			if r, ok := c.Delta.JSON.ExtraFields["reasoning_content"]; ok {
				var s string
				json.Unmarshal([]byte(r.Raw()), &s)
				reasoning.WriteString(s)
			}
		}
	}
	if !strings.HasSuffix(rec.Body.String(), "data: [DONE]\n\n") {
		t.Error("no [DONE]")
	}
	msg := acc.Choices[0].Message
	if msg.Content != "Let me check." || reasoning.String() != "The user wants weather." || acc.Choices[0].FinishReason != "tool_calls" {
		t.Errorf("content %q, reasoning %q, finish %q", msg.Content, reasoning.String(), acc.Choices[0].FinishReason)
	}
	if len(msg.ToolCalls) != 2 {
		t.Fatalf("tool calls %+v", msg.ToolCalls)
	}
	want := [][2]string{{"get_weather", `{"city": "Paris"}`}, {"get_time", `{"tz": "CET"}`}}
	for i, tc := range msg.ToolCalls {
		if tc.Function.Name != want[i][0] || tc.Function.Arguments != want[i][1] || tc.ID == "" || tc.Type != "function" {
			t.Errorf("tool call %d: %+v", i, tc)
		}
	}
	if msg.ToolCalls[1].ID != "call_x" {
		t.Errorf("the engine's call id was not kept: %q", msg.ToolCalls[1].ID)
	}
	if len(finished) < 1 {
		t.Error("the accumulator saw no finished tool call")
	}
	if acc.Usage.PromptTokensDetails.CachedTokens != 16 || acc.Usage.TotalTokens != 37 {
		t.Errorf("usage %+v", acc.Usage)
	}
}

func TestToolCallResponseEncoding(t *testing.T) {
	s := &Server{opts: Options{ModelName: testModel}} // the encoders alone
	res, err := replay(toolCallEvents()).collect()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(s.chatResponse(res, completionMeta{ID: "chatcmpl-1", Model: testModel}, false))
	var cc openai.ChatCompletion
	if err := json.Unmarshal(b, &cc); err != nil {
		t.Fatal(err)
	}
	m := cc.Choices[0].Message
	if len(m.ToolCalls) != 2 || m.ToolCalls[0].Function.Name != "get_weather" || m.ToolCalls[0].Function.Arguments != `{"city": "Paris"}` ||
		cc.Choices[0].FinishReason != "tool_calls" || m.Content != "Let me check." {
		t.Errorf("%s", b)
	}
	if !strings.Contains(string(b), `"reasoning_content":"The user wants weather."`) {
		t.Errorf("no reasoning_content in %s", b)
	}
}

// Ollama sends tool-call arguments as an object.
func TestOllamaToolCallEncoding(t *testing.T) {
	s := &Server{opts: Options{ModelName: testModel}} // the encoders alone
	rec := httptest.NewRecorder()
	err := s.respondOllama(rec, replay(toolCallEvents()), false, renderOllamaChat)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Message struct {
			Thinking  string `json:"thinking"`
			ToolCalls []struct {
				Function struct {
					Name      string         `json:"name"`
					Arguments map[string]any `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
		Done bool `json:"done"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatalf("%s: %v", rec.Body, err)
	}
	if len(got.Message.ToolCalls) != 2 || got.Message.ToolCalls[1].Function.Arguments["tz"] != "CET" || !got.Done || got.Message.Thinking == "" {
		t.Errorf("%s", rec.Body)
	}
}
