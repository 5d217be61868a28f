package main

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func TestPercentileLikeNumpy(t *testing.T) {
	seq := make([]float64, 100)
	for i := range seq {
		seq[i] = float64(i + 1)
	}
	for _, c := range []struct {
		data    []float64
		p, want float64
	}{
		{[]float64{1, 2, 3, 4}, 50, 2.5},
		{[]float64{1, 2, 3, 4}, 0, 1},
		{[]float64{1, 2, 3, 4}, 100, 4},
		{seq, 99, 99.01},
		{seq, 90, 90.1},
		{[]float64{7}, 99, 7},
	} {
		if got := percentile(c.data, c.p); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("percentile(%v, %g) = %g, want %g", c.data[:min(4, len(c.data))], c.p, got, c.want)
		}
	}
}

// Arrival gaps have mean 1/rate whatever the burstiness, and variance
// 1/(rate^2 * burstiness).
func TestGammaArrivals(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const rate, n = 4.0, 40000
	for _, k := range []float64{0.5, 1, 3} {
		var sum, sq float64
		for range n {
			x := gamma(rng, k, 1/(rate*k))
			sum += x
			sq += x * x
		}
		mean := sum / n
		variance := sq/n - mean*mean
		if math.Abs(mean-1/rate) > 0.03/rate {
			t.Errorf("burstiness %g: mean gap %g, want %g", k, mean, 1/rate)
		}
		if want := 1 / (rate * rate * k); math.Abs(variance-want) > 0.08*want {
			t.Errorf("burstiness %g: variance %g, want %g", k, variance, want)
		}
	}
}

func TestSampleLen(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	seen := map[int]bool{}
	for range 2000 {
		n := sampleLen(rng, 100, 0.1)
		if n < 90 || n > 110 {
			t.Fatalf("length %d outside [90, 110]", n)
		}
		seen[n] = true
	}
	if len(seen) != 21 {
		t.Errorf("%d distinct lengths, want all 21", len(seen))
	}
	if n := sampleLen(rng, 5, 0); n != 5 {
		t.Errorf("range 0: %d", n)
	}
}

func runBench(t *testing.T, args ...string) map[string]any {
	t.Helper()
	out := filepath.Join(t.TempDir(), "bench.json")
	if err := benchServe(append(args, "--output-json", out)); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep map[string]any
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

// A run whose every request fails (prompts longer than the demo model's
// context) is an error, and a report path that cannot be written fails
// before the run.
func TestBenchServeFailures(t *testing.T) {
	out := filepath.Join(t.TempDir(), "bench.json")
	err := benchServe([]string{"--num-prompts", "2", "--input-len", "4000", "--output-len", "2", "--output-json", out})
	if err == nil || !strings.Contains(err.Error(), "all 2 requests failed") {
		t.Errorf("all failed: %v", err)
	}
	if _, serr := os.Stat(out); serr != nil {
		t.Errorf("no report of the failed run: %v", serr)
	}
	err = benchServe([]string{"--num-prompts", "2", "--output-json", filepath.Join(t.TempDir(), "missing", "bench.json")})
	if err == nil || !strings.Contains(err.Error(), "--output-json") {
		t.Errorf("unwritable report: %v", err)
	}
}

// The random workload sends prompts of exactly --input-len tokens and gets
// exactly --output-len tokens back, against kiln started in-process on the
// demo model.
func TestBenchServeRandomExactLengths(t *testing.T) {
	rep := runBench(t, "--num-prompts", "8", "--input-len", "48", "--output-len", "20", "--max-concurrency", "4", "--goodput", "ttft:100000")
	if rep["completed"].(float64) != 8 || rep["failed"].(float64) != 0 {
		t.Fatalf("completed %v, failed %v: %v", rep["completed"], rep["failed"], rep["errors"])
	}
	if rep["total_input_tokens"].(float64) != 8*48 || rep["total_output_tokens"].(float64) != 8*20 {
		t.Errorf("tokens in %v, out %v; want %d and %d", rep["total_input_tokens"], rep["total_output_tokens"], 8*48, 8*20)
	}
	for _, k := range []string{"mean_ttft_ms", "median_tpot_ms", "p99_itl_ms", "mean_e2el_ms", "output_throughput"} {
		if v, _ := rep[k].(float64); v <= 0 {
			t.Errorf("%s = %v", k, rep[k])
		}
	}
	if rep["request_goodput"].(float64) != rep["request_throughput"].(float64) {
		t.Errorf("a 100 s TTFT SLO: goodput %v, throughput %v", rep["request_goodput"], rep["request_throughput"])
	}
	if rep["mean_e2el_ms"].(float64) < rep["mean_ttft_ms"].(float64) {
		t.Error("E2EL below TTFT")
	}
	// The server's passes: each request decodes 19 tokens after its first,
	// at most 4 at a time.
	steps, _ := rep["engine_steps"].(map[string]any)
	num := func(k string) float64 { v, _ := steps[k].(float64); return v }
	// The CPU backend issues no pass ahead of its tokens (they are ready
	// when the pass returns).
	_, ahead := steps["decode_passes_ahead"]
	if num("decode_only_passes") < 2*19 || num("passes_with_prefill") < 1 || num("mean_decode_only_batch") < 1 || !ahead || num("decode_passes_ahead") != 0 ||
		num("mean_decode_only_batch") > 4 || num("time_in_passes_pct") <= 0 || num("time_in_passes_pct") > 100 {
		t.Errorf("engine steps %v", steps)
	}
}

// Requests sample as --temperature, --top-p and --top-k say, and the
// report says so; values out of range are refused before the run.
func TestBenchServeSampling(t *testing.T) {
	rep := runBench(t, "--num-prompts", "4", "--input-len", "16", "--output-len", "8", "--temperature", "0.8", "--top-p", "0.9", "--top-k", "20")
	if rep["completed"].(float64) != 4 || rep["total_output_tokens"].(float64) != 4*8 {
		t.Fatalf("completed %v, output %v: %v", rep["completed"], rep["total_output_tokens"], rep["errors"])
	}
	if s, _ := rep["sampling"].(map[string]any); s["temperature"] != 0.8 || s["top_p"] != 0.9 || s["top_k"] != 20.0 {
		t.Errorf("reported sampling %v", rep["sampling"])
	}
	var mu sync.Mutex
	var last map[string]any // the workload's request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		json.NewDecoder(r.Body).Decode(&body)
		if _, ids := body["prompt"].([]any); ids { // not the warm-up's text prompt
			mu.Lock()
			last = body
			mu.Unlock()
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"text\":\"hi\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	runBench(t, "--base-url", srv.URL, "--served-model-name", "m", "--vocab-size", "100", "--num-prompts", "1", "--temperature", "0.7", "--top-k", "5")
	mu.Lock()
	got := last
	mu.Unlock()
	if got["temperature"] != 0.7 || got["top_k"] != 5.0 || got["top_p"] != nil {
		t.Errorf("request sent %v", got)
	}
	for _, bad := range [][]string{{"--temperature", "-1"}, {"--top-p", "0"}, {"--top-p", "1.5"}, {"--top-k", "-2"}} {
		if err := benchServe(append([]string{"--num-prompts", "1"}, bad...)); err == nil || !strings.Contains(err.Error(), "want a temperature") {
			t.Errorf("%v: %v", bad, err)
		}
	}
}

// A synthetic model (random weights at a published shape, here the
// hybrid test shape) is served with a vocabulary of its size: its random
// answers have text, both workloads run, and --model with it, or --layers
// without it, is refused.
func TestBenchServeSynthetic(t *testing.T) {
	rep := runBench(t, "--backend", "cpu", "--synthetic", "tiny-qwen3next", "--num-prompts", "4", "--input-len", "24", "--output-len", "6")
	if rep["completed"].(float64) != 4 || rep["total_output_tokens"].(float64) != 4*6 {
		t.Fatalf("completed %v, output %v: %v", rep["completed"], rep["total_output_tokens"], rep["errors"])
	}
	rep = runBench(t, "--backend", "cpu", "--synthetic", "tiny-qwen3", "--dataset", "multiturn", "--num-prompts", "2", "--turns", "2",
		"--input-len", "20", "--output-len", "4")
	if rep["completed"].(float64) != 4 {
		t.Fatalf("multiturn: completed %v: %v", rep["completed"], rep["errors"])
	}
	err := benchServe([]string{"--synthetic", "tiny-qwen3", "--model", "x", "--num-prompts", "1"})
	if err == nil || !strings.Contains(err.Error(), "one of --model and --synthetic") {
		t.Errorf("--model with --synthetic: %v", err)
	}
	err = benchServe([]string{"--layers", "2", "--num-prompts", "1"})
	if err == nil || !strings.Contains(err.Error(), "--synthetic NAME") {
		t.Errorf("--layers without --synthetic: %v", err)
	}
}

// Later turns of a conversation resend the history (here after a document
// of 300 tokens), which the engine's caches serve; their TTFT's median and
// percentiles are reported.
func TestBenchServeMultiturn(t *testing.T) {
	rep := runBench(t, "--dataset", "multiturn", "--num-prompts", "3", "--turns", "3", "--input-len", "30", "--output-len", "10",
		"--request-rate", "50", "--history-len", "300")
	if rep["completed"].(float64) != 9 || rep["total_output_tokens"].(float64) != 90 {
		t.Fatalf("completed %v, output %v: %v", rep["completed"], rep["total_output_tokens"], rep["errors"])
	}
	prompt, cached := rep["later_turn_prompt_tokens"].(float64), rep["later_turn_cached_tokens"].(float64)
	if prompt < 6*300 || cached < prompt*0.6 || rep["later_turn_cached_pct"].(float64) != 100*cached/prompt {
		t.Errorf("later turns: %v of %v prompt tokens from cache (%v%%)", cached, prompt, rep["later_turn_cached_pct"])
	}
	for _, k := range []string{"median_ttft_later_turns_ms", "p99_ttft_later_turns_ms"} {
		if v, _ := rep[k].(float64); v <= 0 {
			t.Errorf("%s = %v", k, rep[k])
		}
	}
}

// A server that closes an idle keep-alive connection as a request goes out
// on it (llama-server does) costs the benchmark no request: it is sent
// again on a new connection.
func TestBenchRetriesClosedIdleConnection(t *testing.T) {
	type connKey struct{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := r.Context().Value(connKey{}).(*atomic.Int32); n.Add(1) > 1 {
			// The connection's second request: close without an answer.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"text\":\"hi\"}]}\n\ndata: [DONE]\n\n")
	}))
	srv.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, new(atomic.Int32))
	}
	srv.Start()
	defer srv.Close()
	cl := &benchClient{cfg: &benchConfig{baseURL: srv.URL, servedModel: "m"}, http: &http.Client{Transport: &http.Transport{}}}
	for i := range 4 {
		if r, _ := cl.stream(context.Background(), "/v1/completions", map[string]any{"prompt": "x"}); !r.ok {
			t.Fatalf("request %d failed: %s", i, r.err)
		}
	}
}
