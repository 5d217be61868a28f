package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kiln-llm/kiln/engine"
)

// ollamaPost posts body and returns the response's JSON objects (one, or
// one per NDJSON line).
func ollamaPost(t *testing.T, url, path, body string) (int, string, []map[string]any) {
	t.Helper()
	resp, err := http.Post(url+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []map[string]any
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var v map[string]any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s: line %q: %v", path, sc.Text(), err)
		}
		out = append(out, v)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), out
}

func TestOllamaChat(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	req := `{"model":"kiln-test:latest","messages":[{"role":"user","content":"Write a Go function."}],"options":{"temperature":0,"num_predict":12}`
	status, ct, lines := ollamaPost(t, ts.url, "/api/chat", req+`}`)
	if status != 200 || ct != "application/x-ndjson" || len(lines) < 2 {
		t.Fatalf("stream: %d %s, %d lines", status, ct, len(lines))
	}
	var text strings.Builder
	for i, l := range lines {
		msg, _ := l["message"].(map[string]any)
		if msg["role"] != "assistant" || l["model"] != testModel || l["created_at"] == "" {
			t.Fatalf("line %d: %v", i, l)
		}
		text.WriteString(msg["content"].(string))
		if done := l["done"].(bool); done != (i == len(lines)-1) {
			t.Fatalf("line %d done=%v of %d", i, done, len(lines))
		}
	}
	last := lines[len(lines)-1]
	if last["eval_count"].(float64) < 1 || last["prompt_eval_count"].(float64) < 5 || last["done_reason"] == "" {
		t.Errorf("final line %v", last)
	}
	status, ct, whole := ollamaPost(t, ts.url, "/api/chat", req+`,"stream":false}`)
	if status != 200 || ct != "application/json" || len(whole) != 1 {
		t.Fatalf("non-stream: %d %s %v", status, ct, whole)
	}
	if got := whole[0]["message"].(map[string]any)["content"]; got != text.String() || whole[0]["done"] != true {
		t.Errorf("non-stream %q, stream %q", got, text.String())
	}
	// Tools, a tool call with object arguments and the tool's answer reach
	// the template.
	tools := `,"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`
	history := `{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"Paris"}}}]},{"role":"tool","content":"sunny","tool_name":"get_weather"}`
	_, _, withTools := ollamaPost(t, ts.url, "/api/chat", req+tools+`,"stream":false}`)
	_, _, withCall := ollamaPost(t, ts.url, "/api/chat", strings.Replace(req, `}]`, `},`+history+`]`, 1)+tools+`,"stream":false}`)
	n0, n1, n2 := whole[0]["prompt_eval_count"].(float64), withTools[0]["prompt_eval_count"].(float64), withCall[0]["prompt_eval_count"].(float64)
	if n1 <= n0+20 || n2 <= n1+10 {
		t.Errorf("prompt tokens: %v plain, %v with tools, %v with the tool call and result", n0, n1, n2)
	}
}

func TestOllamaGenerateAndTags(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	status, _, lines := ollamaPost(t, ts.url, "/api/generate", `{"model":"kiln-test","prompt":"package main","raw":true,"stream":false,"options":{"temperature":0,"num_predict":8}}`)
	if status != 200 || len(lines) != 1 || lines[0]["response"] == "" || lines[0]["eval_count"].(float64) < 1 {
		t.Fatalf("generate: %d %v", status, lines)
	}
	status, _, lines = ollamaPost(t, ts.url, "/api/generate", `{"model":"kiln-test","prompt":"hello","system":"be brief","options":{"num_predict":4}}`)
	if status != 200 || len(lines) < 2 || lines[len(lines)-1]["done"] != true {
		t.Fatalf("templated generate: %d %v", status, lines)
	}
	status, _, lines = ollamaPost(t, ts.url, "/api/generate", `{"model":"llama3","prompt":"hi"}`)
	if status != 404 || len(lines) != 1 || !strings.Contains(lines[0]["error"].(string), "llama3") {
		t.Errorf("unknown model: %d %v", status, lines)
	}
	status, _, lines = ollamaPost(t, ts.url, "/api/chat", `{"model":"kiln-test","messages":[{"role":"user","content":"x"}],"options":{"temperature":"warm"}}`)
	if status != 400 || len(lines) != 1 || lines[0]["error"] == nil {
		t.Errorf("wrong type: %d %v", status, lines)
	}
	// Out of range, under Ollama's name for it.
	status, _, lines = ollamaPost(t, ts.url, "/api/chat", `{"model":"kiln-test","messages":[{"role":"user","content":"x"}],"options":{"repeat_penalty":11}}`)
	if status != 400 || len(lines) != 1 || lines[0]["error"] != "repeat_penalty must be between 0 and 10, not 11" {
		t.Errorf("repeat_penalty 11: %d %v", status, lines)
	}
	resp, err := http.Get(ts.url + "/api/tags")
	if err != nil {
		t.Fatal(err)
	}
	var tags struct {
		Models []struct {
			Name string `json:"name"`
		} `json:"models"`
	}
	json.NewDecoder(resp.Body).Decode(&tags)
	resp.Body.Close()
	if len(tags.Models) != 1 || tags.Models[0].Name != testModel+":latest" {
		t.Errorf("tags %+v", tags)
	}
	resp, err = http.Get(ts.url + "/api/ps")
	if err != nil {
		t.Fatal(err)
	}
	var ps struct {
		Models []struct {
			Name      string    `json:"name"`
			ExpiresAt time.Time `json:"expires_at"`
		} `json:"models"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ps); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(ps.Models) != 1 || ps.Models[0].Name != testModel+":latest" || ps.Models[0].ExpiresAt.Before(time.Now().AddDate(100, 0, 0)) {
		t.Errorf("ps %+v", ps)
	}
}
