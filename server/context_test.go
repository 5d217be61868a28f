package server

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-llm/kiln/engine"
)

// promptIDs returns n ordinary token ids.
func (ts *testServer) promptIDs(n int) []int32 {
	var ids []int32
	for len(ids) < n {
		ids = append(ids, ts.tok.Encode("func main() { fmt.Println(\"hello, world\") }\n")...)
	}
	return ids[:n]
}

// complete posts a /v1/completions request of prompt ids.
func (ts *testServer) complete(t *testing.T, ids []int32, maxTokens int) (int, map[string]any) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": ids, "max_tokens": maxTokens, "temperature": 0, "ignore_eos": true})
	return rawPost(t, ts.url, "/v1/completions", "application/json", body)
}

// The context the server advertises is what one sequence gets from its KV
// cache: a prompt and max_tokens that fill it exactly are served, one token
// more is a 400 context_length_exceeded that says how to raise it; Ollama's
// num_ctx lowers it for a request and num_predict is cut to the room left.
func TestHonestContext(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{BlockSize: 16, KVBlocks: 9})
	const ctx = 8 * 16 // all blocks but one
	status, models := rawGet(t, ts.url+"/v1/models")
	if data, _ := models["data"].([]any); status != 200 || len(data) != 1 || data[0].(map[string]any)["max_model_len"] != float64(ctx) {
		t.Errorf("/v1/models: %d %v, want max_model_len %d", status, models, ctx)
	}
	_, _, show := ollamaPost(t, ts.url, "/api/show", `{"model": "kiln-test"}`)
	if info, _ := show[0]["model_info"].(map[string]any); info["qwen3.context_length"] != float64(ctx) {
		t.Errorf("/api/show model_info %v, want qwen3.context_length %d", info, ctx)
	}

	ids := ts.promptIDs(100)
	status, v := ts.complete(t, ids, ctx-100)
	usage, _ := v["usage"].(map[string]any)
	if status != 200 || usage["completion_tokens"] != float64(ctx-100) {
		t.Fatalf("100 prompt tokens + max_tokens %d: %d %v", ctx-100, status, v)
	}
	status, v = ts.complete(t, ids, ctx-100+1)
	e, _ := v["error"].(map[string]any)
	if msg, _ := e["message"].(string); status != 400 || e["code"] != "context_length_exceeded" || e["param"] != "prompt" ||
		!strings.Contains(msg, fmt.Sprintf("maximum context length is %d tokens", ctx)) || !strings.Contains(msg, "--kv-memory") {
		t.Errorf("one token more: %d %v", status, v)
	}

	// Ollama: num_ctx below the server's bounds the request, above it is
	// the server's; num_predict is cut to the room left.
	raw := func(numCtx, numPredict int) (int, []map[string]any) {
		body := fmt.Sprintf(`{"model": "kiln-test", "raw": true, "stream": false, "prompt": %q, "options": {"num_ctx": %d, "num_predict": %d, "temperature": 0}}`,
			ts.tok.Decode(ids), numCtx, numPredict)
		status, _, out := ollamaPost(t, ts.url, "/api/generate", body)
		return status, out
	}
	prompt := len(ts.tok.Encode(ts.tok.Decode(ids)))
	if status, out := raw(64, 10); status != 400 || !strings.Contains(fmt.Sprint(out[0]["error"]), "num_ctx") {
		t.Errorf("num_ctx 64 below a %d-token prompt: %d %v", prompt, status, out)
	}
	for _, numCtx := range []int{prompt + 5, 100000} {
		want := min(numCtx, ctx) - prompt
		status, out := raw(numCtx, 1000)
		if status != 200 || out[0]["eval_count"] != float64(want) || out[0]["done_reason"] != "length" {
			t.Errorf("num_ctx %d, num_predict 1000: %d %v; want %d tokens", numCtx, status, out, want)
		}
	}
}

// keep_alive is checked as Ollama reads it (the model stays loaded for the
// server's life whatever it says).
func TestKeepAlive(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	for _, ka := range []string{`"5m"`, `0`, `-1`, `"-1"`, `"3600"`, `300.5`} {
		body := `{"model": "kiln-test", "prompt": "hi", "stream": false, "keep_alive": ` + ka + `, "options": {"num_predict": 2}}`
		if status, _, out := ollamaPost(t, ts.url, "/api/generate", body); status != 200 {
			t.Errorf("keep_alive %s: %d %v", ka, status, out)
		}
	}
	status, _, out := ollamaPost(t, ts.url, "/api/chat", `{"model": "kiln-test", "messages": [], "keep_alive": "soon"}`)
	if status != 400 || !strings.Contains(fmt.Sprint(out[0]["error"]), "keep_alive") {
		t.Errorf("keep_alive \"soon\": %d %v", status, out)
	}
}

// Answers that together outgrow the KV cache are preempted and resumed:
// every one returns all of its tokens, the same as alone.
func TestPreemptedAnswersKeepTheirTokens(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{BlockSize: 16, KVBlocks: 24, MaxRunning: 4})
	const n, prompt, answer = 6, 40, 300 // 6 x 340 tokens in a cache of 384
	alone := map[int]any{}
	for i := range n {
		_, v := ts.complete(t, ts.promptIDs(prompt+i), answer)
		alone[i] = v["choices"]
	}
	before := ts.eng.Stats().Preemptions
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			status, v := ts.complete(t, ts.promptIDs(prompt+i), answer)
			usage, _ := v["usage"].(map[string]any)
			if status != 200 || usage["completion_tokens"] != float64(answer) || fmt.Sprint(v["choices"]) != fmt.Sprint(alone[i]) {
				t.Errorf("request %d: %d, %v; alone %v", i, status, v, alone[i])
			}
		})
	}
	wg.Wait()
	if st := ts.eng.Stats(); st.Preemptions == before {
		t.Errorf("no preemption: %+v", st)
	}
}
