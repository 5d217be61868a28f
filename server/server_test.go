package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/shared"

	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/internal/schematest"
)

func greedy(msg string, maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:       testModel,
		Messages:    []openai.ChatCompletionMessageParamUnion{openai.UserMessage(msg)},
		MaxTokens:   openai.Int(maxTokens),
		Temperature: openai.Float(0),
	}
}

// A streamed answer is the same as the whole one (greedy), with the usage
// chunk, and both report usage that adds up.
func TestChatStreamingMatchesNonStreaming(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	c := ts.client()
	ctx := context.Background()
	params := greedy("Write a Go function.", 24)
	params.Seed = openai.Int(7)

	whole, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if len(whole.Choices) != 1 || whole.Object != "chat.completion" || whole.Model != testModel {
		t.Fatalf("response %+v", whole)
	}
	ch := whole.Choices[0]
	if ch.Message.Role != "assistant" || ch.Message.Content == "" {
		t.Fatalf("message %+v", ch.Message)
	}
	u := whole.Usage
	if u.PromptTokens < 5 || u.CompletionTokens < 1 || u.CompletionTokens > 24 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Fatalf("usage %+v", u)
	}
	if (ch.FinishReason == "length") != (u.CompletionTokens == 24) {
		t.Errorf("finish %q with %d of 24 tokens", ch.FinishReason, u.CompletionTokens)
	}

	params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
	s := c.Chat.Completions.NewStreaming(ctx, params)
	var acc openai.ChatCompletionAccumulator
	chunks, usageChunks := 0, 0
	for s.Next() {
		chunk := s.Current()
		if !acc.AddChunk(chunk) {
			t.Fatalf("accumulator rejected chunk %d: %s", chunks, chunk.RawJSON())
		}
		if chunk.Object != "chat.completion.chunk" || chunk.ID == "" {
			t.Fatalf("chunk %s", chunk.RawJSON())
		}
		if len(chunk.Choices) == 0 {
			usageChunks++
		}
		chunks++
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if usageChunks != 1 {
		t.Errorf("%d usage chunks, want 1", usageChunks)
	}
	got := acc.Choices[0]
	if got.Message.Content != ch.Message.Content || got.FinishReason != ch.FinishReason {
		t.Errorf("streamed %q (%s), whole %q (%s)", got.Message.Content, got.FinishReason, ch.Message.Content, ch.FinishReason)
	}
	if acc.Usage.CompletionTokens != u.CompletionTokens || acc.Usage.PromptTokens != u.PromptTokens {
		t.Errorf("streamed usage %+v, whole %+v", acc.Usage, u)
	}
	// The second identical prompt is served from the prefix cache.
	if acc.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Errorf("no cached tokens on a repeated prompt: %+v", acc.Usage)
	}
}

// Chunks are flushed as they are generated, not all at the end.
func TestStreamingIsIncremental(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	body := `{"model":"kiln-test","stream":true,"max_tokens":40,"ignore_eos":true,"temperature":0,"messages":[{"role":"user","content":"hi"}]}`
	resp, err := http.Post(ts.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	var times []time.Time
	var lines []string
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			break
		}
		if strings.HasPrefix(line, "data: ") {
			times = append(times, time.Now())
			lines = append(lines, strings.TrimSpace(line))
		}
	}
	if len(lines) < 10 || lines[len(lines)-1] != "data: [DONE]" {
		t.Fatalf("%d events, last %q", len(lines), lines[len(lines)-1])
	}
	if !times[len(times)-1].After(times[1]) {
		t.Error("every event arrived at once")
	}
	var first struct {
		Choices []struct {
			Delta map[string]any `json:"delta"`
		} `json:"choices"`
	}
	json.Unmarshal([]byte(strings.TrimPrefix(lines[0], "data: ")), &first)
	if first.Choices[0].Delta["role"] != "assistant" {
		t.Errorf("first chunk %s has no role", lines[0])
	}
}

// The same API works over the Unix socket, which is 0600 and needs no key.
func TestUnixSocket(t *testing.T) {
	ts := startServer(t, Options{APIKey: "secret"}, engine.Options{})
	fi, err := os.Stat(ts.sock)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Errorf("socket mode %o, want 600", perm)
	}
	c := openai.NewClient(option.WithBaseURL("http://kiln/v1/"), option.WithHTTPClient(unixHTTP(ts.sock)), option.WithMaxRetries(0))
	r, err := c.Chat.Completions.New(context.Background(), greedy("hello", 4))
	if err != nil {
		t.Fatal(err)
	}
	if r.Usage.CompletionTokens < 1 {
		t.Errorf("usage %+v", r.Usage)
	}
	// TCP needs the key.
	if _, err := ts.client().Chat.Completions.New(context.Background(), greedy("hello", 4)); apiStatus(err) != 401 {
		t.Errorf("TCP without the key: %v", err)
	}
	if _, err := ts.client(option.WithAPIKey("secret")).Chat.Completions.New(context.Background(), greedy("hello", 4)); err != nil {
		t.Errorf("TCP with the key: %v", err)
	}
}

// A connection from a uid other than the owner's is closed unanswered.
func TestUnixSocketRefusesOtherUsers(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	// Pretend the server belongs to someone else: this process's own
	// connection then comes from a foreign uid.
	dir, _ := os.MkdirTemp("", "kiln")
	defer os.RemoveAll(dir)
	l, err := ListenUnix(dir+"/other.sock", nil)
	if err != nil {
		t.Fatal(err)
	}
	l.(*ownerListener).uid = uint32(os.Getuid()) + 1
	go ts.srv.Serve(l)
	resp, err := unixHTTP(dir + "/other.sock").Get("http://kiln/health")
	if err == nil {
		resp.Body.Close()
		t.Fatalf("a foreign uid got an answer: %s", resp.Status)
	}
	// The owner's socket still answers.
	resp, err = unixHTTP(ts.sock).Get("http://kiln/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// A second server cannot take over a live socket; a stale one is replaced.
func TestUnixSocketInUse(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	if _, err := ListenUnix(ts.sock, nil); err == nil || !strings.Contains(err.Error(), "already listening") {
		t.Errorf("listening on a live socket: %v", err)
	}
	dir, _ := os.MkdirTemp("", "kiln")
	defer os.RemoveAll(dir)
	l, err := ListenUnix(dir+"/s.sock", nil)
	if err != nil {
		t.Fatal(err)
	}
	l.(*ownerListener).Listener.Close() // leaves the file, as a crashed server does
	l, err = ListenUnix(dir+"/s.sock", nil)
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	l.Close()
}

// A server closing its socket removes the file only while it is its own:
// a draining server used to remove its successor's socket at exit, and
// kiln status/chat/stop lost a server that was running.
func TestUnixSocketRemovedOnlyByItsServer(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "kiln.sock")
	draining, err := ListenUnix(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The successor finds the socket unanswered (the old server stopped
	// accepting) and takes the path over.
	draining.(*ownerListener).Listener.Close()
	successor, err := ListenUnix(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer successor.Close()
	draining.Close() // the old server exits
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("the old server removed its successor's socket: %v", err)
	}
	go http.Serve(successor, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	resp, err := unixHTTP(sock).Get("http://kiln/health")
	if err != nil {
		t.Fatalf("the successor no longer answers: %v", err)
	}
	resp.Body.Close()
	successor.Close()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("the successor left its socket behind: %v", err)
	}
}

func apiStatus(err error) int {
	var ae *openai.Error
	if errors.As(err, &ae) {
		return ae.StatusCode
	}
	return 0
}

// Cancelling a stream mid-way cancels its request: the engine frees the
// sequence and its KV blocks.
func TestCancelMidStreamFreesSequence(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{NoCache: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	params := greedy("count to a thousand", 2000)
	params.SetExtraFields(map[string]any{"ignore_eos": true})
	s := ts.client().Chat.Completions.NewStreaming(ctx, params)
	n := 0
	for s.Next() {
		if n++; n == 3 {
			if st := ts.eng.Stats(); st.Running != 1 || st.KVBlocksUsed == 0 {
				t.Errorf("while streaming: %+v", st)
			}
			cancel()
		}
	}
	if n < 3 {
		t.Fatalf("stream ended after %d chunks: %v", n, s.Err())
	}
	st := waitIdle(t, ts.eng, 0)
	if st.RequestsCompleted > 1 {
		t.Errorf("stats %+v", st)
	}
	// The server still serves.
	if _, err := ts.client().Chat.Completions.New(context.Background(), greedy("hi", 2)); err != nil {
		t.Fatal(err)
	}
}

// 64 clients at once are all answered.
func TestConcurrentClients(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	c := ts.client()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := greedy(fmt.Sprintf("request %d", i), 8)
			if i%2 == 0 {
				s := c.Chat.Completions.NewStreaming(context.Background(), p)
				var acc openai.ChatCompletionAccumulator
				for s.Next() {
					acc.AddChunk(s.Current())
				}
				if err := s.Err(); err != nil || len(acc.Choices) == 0 || acc.Choices[0].FinishReason == "" {
					errs <- fmt.Errorf("stream %d: %v %+v", i, err, acc.Choices)
				}
				return
			}
			r, err := c.Chat.Completions.New(context.Background(), p)
			if err != nil || r.Usage.CompletionTokens < 1 {
				errs <- fmt.Errorf("request %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	waitIdle(t, ts.eng, -1)
}

// rawPost sends body and decodes an OpenAI error.
func rawPost(t *testing.T, url, path, contentType string, body []byte) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url+path, contentType, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: status %d, body %q is not JSON", path, resp.StatusCode, b)
	}
	return resp.StatusCode, v
}

// Client mistakes get OpenAI-shaped errors with the right status, and the
// server keeps serving after each.
func TestBadRequests(t *testing.T) {
	ts := startServer(t, Options{MaxBodyBytes: 1 << 16}, engine.Options{})
	huge := `{"model":"kiln-test","messages":[{"role":"user","content":"` + strings.Repeat("x", 1<<17) + `"}]}`
	long := `{"model":"kiln-test","messages":[{"role":"user","content":"` + strings.Repeat("go func ", 3000) + `"}]}`
	cases := []struct {
		name, path, body string
		status           int
		param            string
	}{
		{"malformed JSON", "/v1/chat/completions", `{"model": "kiln-test", "messages": [`, 400, ""},
		{"not an object", "/v1/chat/completions", `[1, 2]`, 400, ""},
		{"empty body", "/v1/chat/completions", ``, 400, ""},
		{"messages not an array", "/v1/chat/completions", `{"messages": "hi"}`, 400, "messages"},
		{"temperature a string", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"temperature":"hot"}`, 400, "temperature"},
		{"max_tokens a float", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1.5}`, 400, "max_tokens"},
		{"content a number", "/v1/chat/completions", `{"messages":[{"role":"user","content":5}]}`, 400, "content"},
		{"image part", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "content"},
		{"bad role", "/v1/chat/completions", `{"messages":[{"role":"wizard","content":"hi"}]}`, 400, "messages"},
		{"no messages", "/v1/chat/completions", `{"messages":[]}`, 400, "messages"},
		{"temperature out of range", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"temperature":5}`, 400, "temperature"},
		{"penalty out of range", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"frequency_penalty":-2.5}`, 400, "frequency_penalty"},
		{"too many top_logprobs", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21}`, 400, "top_logprobs"},
		{"logit_bias out of range", "/v1/completions", `{"prompt":"hi","logit_bias":{"5":101}}`, 400, "logit_bias"},
		{"too many stops", "/v1/completions", `{"prompt":"hi","stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]}`, 400, "stop"},
		{"zero max_tokens", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}`, 400, "max_tokens"},
		{"n=2", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"n":2}`, 400, "n"},
		{"bad tool_choice", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"tool_choice":"always"}`, 400, "tool_choice"},
		{"bad logit_bias", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"logit_bias":{"the":5}}`, 400, "logit_bias"},
		{"stop a number", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"stop":3}`, 400, "stop"},
		{"unknown response_format", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"xml"}}`, 400, "response_format"},
		{"unsupported schema", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema",` +
			`"json_schema":{"name":"x","schema":{"type":"object","properties":{"e":{"type":"string","pattern":"^a"}}}}}}`, 400, "response_format"},
		{"unsupported tool schema", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"tool_choice":"required",` +
			`"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"u":{"type":"string","format":"uri"}}}}}]}`, 400, "tools"},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}`, 404, ""},
		{"huge body", "/v1/chat/completions", huge, 413, ""},
		{"context overflow", "/v1/chat/completions", long, 400, "messages"},
		{"prompt ids out of vocabulary", "/v1/completions", `{"prompt":[1,2,99999]}`, 400, ""},
		{"two prompts", "/v1/completions", `{"prompt":["a","b"]}`, 400, "prompt"},
		{"empty prompt", "/v1/completions", `{"prompt":""}`, 400, "prompt"},
		{"null prompt", "/v1/completions", `{"prompt":null}`, 400, "prompt"},
		{"prompt overflow", "/v1/completions", `{"prompt":"` + strings.Repeat("go func ", 3000) + `"}`, 400, "prompt"},
		{"unknown route", "/v1/audio/speech", `{}`, 404, ""},
		{"suffix without FIM tokens", "/v1/completions", `{"prompt":"func f(","suffix":"}"}`, 400, "suffix"},
		{"suffix with token ids", "/v1/completions", `{"prompt":[1,2],"suffix":"}"}`, 400, "suffix"},
	}
	for _, tc := range cases {
		status, v := rawPost(t, ts.url, tc.path, "application/json", []byte(tc.body))
		e, _ := v["error"].(map[string]any)
		if status != tc.status || e == nil || e["message"] == "" || e["type"] == "" {
			t.Errorf("%s: status %d, body %v; want %d", tc.name, status, v, tc.status)
			continue
		}
		if msg := fmt.Sprint(e["message"]); strings.HasPrefix(msg, "engine:") || strings.HasPrefix(msg, "server:") {
			t.Errorf("%s: message names a Go package: %q", tc.name, msg)
		}
		if tc.param != "" && e["param"] != tc.param {
			t.Errorf("%s: param %v, want %s (%v)", tc.name, e["param"], tc.param, e["message"])
		}
	}
	if status, v := rawPost(t, ts.url, "/v1/chat/completions", "application/json",
		[]byte("{\"messages\":[{\"role\":\"user\",\"content\":\"caf\xe9\"}]}")); status != 400 || !strings.Contains(fmt.Sprint(v), "UTF-8") {
		t.Errorf("invalid UTF-8: %d %v", status, v)
	}
	resp, err := http.Get(ts.url + "/v1/chat/completions")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("GET on a POST route: %d", resp.StatusCode)
	}
	if _, err := ts.client().Chat.Completions.New(context.Background(), greedy("still there?", 3)); err != nil {
		t.Errorf("after the bad requests: %v", err)
	}
}

// A full queue is 429; the rejected request leaves nothing behind.
func TestQueueFull(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{MaxRunning: 1, MaxQueue: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	got429 := false
	var mu sync.Mutex
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := greedy(fmt.Sprintf("long %d", i), 300)
			p.SetExtraFields(map[string]any{"ignore_eos": true})
			_, err := ts.client().Chat.Completions.New(ctx, p)
			if apiStatus(err) == 429 {
				mu.Lock()
				got429 = true
				mu.Unlock()
				cancel()
			}
		}()
	}
	wg.Wait()
	if !got429 {
		t.Error("six requests on a queue of one: no 429")
	}
	waitIdle(t, ts.eng, -1)
}

// A tool-call round trip: tools and tool_choice reach the template, and an
// assistant message with tool calls plus the tool's result render and are
// answered.
func TestToolCallRoundTrip(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	c := ts.client()
	ctx := context.Background()
	tool := openai.ChatCompletionFunctionTool(shared.FunctionDefinitionParam{
		Name:        "get_weather",
		Description: openai.String("Weather of a city"),
		Parameters: shared.FunctionParameters{"type": "object", "properties": map[string]any{
			"city": map[string]any{"type": "string", "maxLength": 20}}, "required": []string{"city"}},
	})
	ask := openai.UserMessage("What is the weather in Paris?")
	plain, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, MaxTokens: openai.Int(4),
		Messages: []openai.ChatCompletionMessageParamUnion{ask}})
	if err != nil {
		t.Fatal(err)
	}
	withTools, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, MaxTokens: openai.Int(4),
		Messages: []openai.ChatCompletionMessageParamUnion{ask}, Tools: []openai.ChatCompletionToolUnionParam{tool}})
	if err != nil {
		t.Fatal(err)
	}
	if withTools.Usage.PromptTokens <= plain.Usage.PromptTokens+20 {
		t.Errorf("the tool definition did not reach the prompt: %d tokens with tools, %d without", withTools.Usage.PromptTokens, plain.Usage.PromptTokens)
	}
	none, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, MaxTokens: openai.Int(4),
		Messages: []openai.ChatCompletionMessageParamUnion{ask}, Tools: []openai.ChatCompletionToolUnionParam{tool},
		ToolChoice: openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("none")}})
	if err != nil {
		t.Fatal(err)
	}
	if none.Usage.PromptTokens != plain.Usage.PromptTokens {
		t.Errorf("tool_choice none: %d prompt tokens, want %d", none.Usage.PromptTokens, plain.Usage.PromptTokens)
	}
	// tool_choice required or a named function: the answer is a call of the
	// tool, its arguments following the tool's schema, and the call's start
	// is in the prompt.
	for _, choice := range []openai.ChatCompletionToolChoiceOptionUnionParam{
		{OfAuto: openai.String("required")},
		openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "get_weather"}),
	} {
		forced, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, MaxTokens: openai.Int(200),
			Messages: []openai.ChatCompletionMessageParamUnion{ask}, Tools: []openai.ChatCompletionToolUnionParam{tool}, ToolChoice: choice})
		if err != nil {
			t.Fatal(err)
		}
		m := forced.Choices[0].Message
		if len(m.ToolCalls) != 1 || m.ToolCalls[0].Function.Name != "get_weather" || m.Content != "" || forced.Choices[0].FinishReason != "tool_calls" {
			t.Fatalf("tool_choice %v: answer %q, calls %+v, finish %s", choice, m.Content, m.ToolCalls, forced.Choices[0].FinishReason)
		}
		if err := schematest.Validate([]byte(`{"type":"object","properties":{"city":{"type":"string","maxLength":20}},"required":["city"]}`),
			[]byte(m.ToolCalls[0].Function.Arguments)); err != nil {
			t.Errorf("tool_choice %v: arguments %s: %v", choice, m.ToolCalls[0].Function.Arguments, err)
		}
		if forced.Usage.PromptTokens <= withTools.Usage.PromptTokens {
			t.Errorf("tool_choice %v: %d prompt tokens, %d without forcing", choice, forced.Usage.PromptTokens, withTools.Usage.PromptTokens)
		}
	}
	// The client sends back the call and its result.
	call := openai.ChatCompletionMessageParamUnion{OfAssistant: &openai.ChatCompletionAssistantMessageParam{
		ToolCalls: []openai.ChatCompletionMessageToolCallUnionParam{{OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
			ID: "call_1", Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: "get_weather", Arguments: `{"city": "Paris"}`},
		}}},
	}}
	result := openai.ToolMessage(`{"temperature_c": 21, "sky": "clear"}`, "call_1")
	final, err := c.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, MaxTokens: openai.Int(8),
		Messages: []openai.ChatCompletionMessageParamUnion{ask, call, result}, Tools: []openai.ChatCompletionToolUnionParam{tool}})
	if err != nil {
		t.Fatal(err)
	}
	// The call (name and arguments) and the result are in the prompt.
	if final.Usage.PromptTokens <= withTools.Usage.PromptTokens+15 {
		t.Errorf("the tool call and result did not reach the prompt: %d tokens, %d before", final.Usage.PromptTokens, withTools.Usage.PromptTokens)
	}
	if final.Usage.CompletionTokens < 1 {
		t.Errorf("no answer after the tool result: %+v", final)
	}
}

// /v1/completions takes token ids, honours max_tokens exactly with
// ignore_eos, streams, and returns logprobs.
func TestCompletions(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	c := ts.client()
	ctx := context.Background()
	ids := openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{10, 20, 30, 40, 50}}
	r, err := c.Completions.New(ctx, openai.CompletionNewParams{Model: testModel, Prompt: ids, MaxTokens: openai.Int(12),
		Temperature: openai.Float(0), Logprobs: openai.Int(2)}, option.WithJSONSet("ignore_eos", true))
	if err != nil {
		t.Fatal(err)
	}
	if r.Usage.PromptTokens != 5 || r.Usage.CompletionTokens != 12 || r.Choices[0].FinishReason != "length" {
		t.Errorf("usage %+v, finish %s", r.Usage, r.Choices[0].FinishReason)
	}
	lp := r.Choices[0].Logprobs
	if len(lp.Tokens) != 12 || len(lp.TokenLogprobs) != 12 || len(lp.TopLogprobs[0]) != 2 {
		t.Fatalf("logprobs %+v", lp)
	}
	if strings.Join(lp.Tokens, "") != r.Choices[0].Text {
		t.Errorf("logprob tokens %q do not spell the text %q", lp.Tokens, r.Choices[0].Text)
	}
	for i, v := range lp.TokenLogprobs {
		if v > 0 {
			t.Errorf("logprob %d is %g", i, v)
		}
	}
	s := c.Completions.NewStreaming(ctx, openai.CompletionNewParams{Model: testModel, Prompt: ids, MaxTokens: openai.Int(12),
		Temperature: openai.Float(0)}, option.WithJSONSet("ignore_eos", true))
	var text strings.Builder
	for s.Next() {
		for _, ch := range s.Current().Choices {
			text.WriteString(ch.Text)
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != r.Choices[0].Text {
		t.Errorf("streamed %q, whole %q", text.String(), r.Choices[0].Text)
	}
}

// Chat logprobs come with the top alternatives; stop strings end the answer.
func TestChatLogprobsAndStop(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	c := ts.client()
	p := greedy("Write a Go function.", 16)
	p.Logprobs = openai.Bool(true)
	p.TopLogprobs = openai.Int(3)
	r, err := c.Chat.Completions.New(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	lp := r.Choices[0].Logprobs.Content
	if len(lp) != int(r.Usage.CompletionTokens) || len(lp[0].TopLogprobs) != 3 || lp[0].TopLogprobs[0].Logprob < lp[0].TopLogprobs[1].Logprob {
		t.Fatalf("logprobs %+v for %d tokens", lp, r.Usage.CompletionTokens)
	}
	text := r.Choices[0].Message.Content
	if len(text) < 4 {
		t.Skipf("answer %q too short to cut", text)
	}
	stop := text[len(text)/2 : len(text)/2+2]
	p2 := greedy("Write a Go function.", 16)
	p2.Stop = openai.ChatCompletionNewParamsStopUnion{OfString: openai.String(stop)}
	r2, err := c.Chat.Completions.New(context.Background(), p2)
	if err != nil {
		t.Fatal(err)
	}
	want := text[:strings.Index(text, stop)]
	if got := r2.Choices[0].Message.Content; got != want || r2.Choices[0].FinishReason != "stop" {
		t.Errorf("stop %q: got %q (%s), want %q", stop, got, r2.Choices[0].FinishReason, want)
	}
}

func TestModelsAndHealth(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	c := ts.client()
	page, err := c.Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].ID != testModel {
		t.Fatalf("models %+v", page.Data)
	}
	m, err := c.Models.Get(context.Background(), testModel)
	if err != nil || m.ID != testModel {
		t.Fatalf("model %+v, %v", m, err)
	}
	if _, err := c.Models.Get(context.Background(), "other"); apiStatus(err) != 404 {
		t.Errorf("unknown model: %v", err)
	}
	resp, err := http.Get(ts.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("health %d", resp.StatusCode)
	}
	resp, err = unixHTTP(ts.sock).Get("http://kiln/status")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var st Status
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatal(err)
	}
	if st.Model != testModel || st.PID != os.Getpid() || st.Stats.KVBlocksTotal == 0 {
		t.Errorf("status %+v", st)
	}
	// The wire keys are snake_case like the rest of the API; the
	// conversations are a list, empty or not.
	var raw struct {
		Stats         map[string]any   `json:"stats"`
		Conversations []map[string]any `json:"conversations"`
	}
	json.Unmarshal(body, &raw)
	if raw.Conversations == nil {
		t.Errorf("status has no conversations list: %s", body)
	}
	for _, c := range raw.Conversations {
		if _, ok := c["device_bytes"]; !ok {
			t.Errorf("a conversation without its device bytes: %s", body)
		}
	}
	for _, key := range []string{"running", "waiting", "kv_blocks_used", "kv_blocks_total", "cache_hit_tokens", "requests_completed", "state_bytes", "steps", "step_time_s", "host_time_s"} {
		if _, ok := raw.Stats[key]; !ok {
			t.Errorf("status stats lack %q: %s", key, body)
		}
	}
	// Durations go in seconds and come back whole.
	in := EngineStats{StepTime: 1500 * time.Millisecond, Steps: 3}
	b, _ := json.Marshal(in)
	var out EngineStats
	if err := json.Unmarshal(b, &out); err != nil || out != in || !strings.Contains(string(b), `"step_time_s":1.5`) {
		t.Errorf("%s read back as %+v (%v)", b, out, err)
	}
}

// Seeds make sampling reproducible; chat_template_kwargs reach the template;
// max_completion_tokens wins over max_tokens.
func TestSamplingParameters(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	c := ts.client()
	ctx := context.Background()
	sample := func(seed int64) string {
		p := greedy("Write a Go function.", 24)
		p.Temperature, p.Seed, p.TopP = openai.Float(1.5), openai.Int(seed), openai.Float(1)
		r, err := c.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		return r.Choices[0].Message.Content
	}
	if a, b := sample(5), sample(5); a != b {
		t.Errorf("seed 5 twice: %q and %q", a, b)
	}
	if a, b := sample(5), sample(6); a == b {
		t.Errorf("seeds 5 and 6 gave the same %q", a)
	}
	plain, err := c.Chat.Completions.New(ctx, greedy("hi", 2))
	if err != nil {
		t.Fatal(err)
	}
	p := greedy("hi", 2)
	p.SetExtraFields(map[string]any{"chat_template_kwargs": map[string]any{"enable_thinking": false}})
	noThink, err := c.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	// Qwen3's template closes an empty think block when thinking is off.
	if noThink.Usage.PromptTokens <= plain.Usage.PromptTokens {
		t.Errorf("enable_thinking=false: %d prompt tokens, default %d", noThink.Usage.PromptTokens, plain.Usage.PromptTokens)
	}
	p = greedy("hi", 50)
	p.MaxCompletionTokens = openai.Int(5)
	p.SetExtraFields(map[string]any{"ignore_eos": true})
	r, err := c.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if r.Usage.CompletionTokens != 5 || r.Choices[0].FinishReason != "length" {
		t.Errorf("max_completion_tokens 5: %d tokens, %s", r.Usage.CompletionTokens, r.Choices[0].FinishReason)
	}
}

// A generation that outlasts the request timeout ends: 504 before the
// response starts, an error event after, and its sequence is freed.
func TestRequestTimeout(t *testing.T) {
	ts := startServer(t, Options{RequestTimeout: 100 * time.Millisecond}, engine.Options{NoCache: true})
	p := greedy("go on forever", 3500)
	p.SetExtraFields(map[string]any{"ignore_eos": true})
	if _, err := ts.client().Chat.Completions.New(context.Background(), p); apiStatus(err) != 504 {
		t.Errorf("non-streaming: %v", err)
	}
	s := ts.client().Chat.Completions.NewStreaming(context.Background(), p)
	for s.Next() {
	}
	if err := s.Err(); err == nil || !strings.Contains(err.Error(), "time limit") {
		t.Errorf("streaming: %v", err)
	}
	waitIdle(t, ts.eng, 0)
}
