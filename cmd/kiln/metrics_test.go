package main

import (
	"bufio"
	"context"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-llm/kiln/server"
)

// scrape reads a Prometheus text page into its samples, keyed by name and
// labels as written.
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Fatalf("/metrics: %s, %s", resp.Status, ct)
	}
	samples := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if i < 0 || err != nil {
			t.Fatalf("/metrics: bad line %q", line)
		}
		samples[line[:i]] = v
	}
	return samples
}

// sum adds the samples of a metric over its label sets.
func sum(samples map[string]float64, name string) float64 {
	total := 0.0
	for k, v := range samples {
		if k == name || strings.HasPrefix(k, name+"{") {
			total += v
		}
	}
	return total
}

// /metrics scraped while kiln bench serve runs against the server: its
// counters only grow, and at the end they add up to the benchmark's own
// counts (plus the benchmark's warm-up request).
func TestMetricsAddUpToBenchServe(t *testing.T) {
	f := modelFlags{backend: "cpu", conversations: true}
	lm, err := f.load()
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(lm.sess, server.Options{ModelName: lm.name, Defaults: lm.defaults, Logger: slog.New(slog.DiscardHandler)})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		lm.sess.Close()
	})
	base := "http://" + l.Addr().String()
	page := base + "/metrics"
	before := scrape(t, page)

	counters := []string{"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:request_success_total",
		"vllm:prefix_cache_hits_total", "vllm:time_to_first_token_seconds_count"}
	done := make(chan struct{})
	var wg sync.WaitGroup
	var scrapes int
	wg.Go(func() {
		last := before
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			now := scrape(t, page)
			scrapes++
			for _, c := range counters {
				if sum(now, c) < sum(last, c) {
					t.Errorf("%s went down: %g, then %g", c, sum(last, c), sum(now, c))
				}
			}
			last = now
		}
	})
	const n, in, out = 12, 40, 20
	rep := runBench(t, "--base-url", base, "--vocab-size", strconv.Itoa(lm.regularVocab()), "--num-prompts", strconv.Itoa(n),
		"--input-len", strconv.Itoa(in), "--output-len", strconv.Itoa(out), "--max-concurrency", "4")
	close(done)
	wg.Wait()
	after := scrape(t, page)
	if rep["completed"].(float64) != n {
		t.Fatalf("the benchmark completed %v of %d: %v", rep["completed"], n, rep["errors"])
	}
	// The warm-up request: "hello", 4 tokens.
	warmIn, warmOut := float64(len(lm.tok.Encode("hello"))), 4.0
	delta := func(name string) float64 { return sum(after, name) - sum(before, name) }
	for _, c := range []struct {
		metric string
		want   float64
	}{
		{"vllm:prompt_tokens_total", rep["total_input_tokens"].(float64) + warmIn},
		{"vllm:generation_tokens_total", rep["total_output_tokens"].(float64) + warmOut},
		{"vllm:prefix_cache_hits_total", rep["total_cached_tokens"].(float64)},
		{"vllm:prefix_cache_queries_total", rep["total_input_tokens"].(float64) + warmIn},
		{`vllm:request_success_total{model_name="kiln-demo",finished_reason="length"}`, n + 1},
		{"vllm:request_success_total", n + 1},
		{"vllm:time_to_first_token_seconds_count", n + 1},
		{"vllm:request_time_per_output_token_seconds_count", n + 1},
		{"vllm:e2e_request_latency_seconds_count", n + 1},
		{"kiln_request_prepare_seconds_count", n + 1},
		{"vllm:request_queue_time_seconds_count", n + 1},
		{"vllm:request_prompt_tokens_sum", rep["total_input_tokens"].(float64) + warmIn},
		{"vllm:request_generation_tokens_sum", rep["total_output_tokens"].(float64) + warmOut},
	} {
		if got := delta(c.metric); got != c.want {
			t.Errorf("%s grew by %g during the benchmark, want %g", c.metric, got, c.want)
		}
	}
	// The benchmark's TTFTs are the client's, the server's start at
	// submission, after the request's preparation: the two server sums
	// together are at most the client's.
	ttft, prep, client := delta("vllm:time_to_first_token_seconds_sum"), delta("kiln_request_prepare_seconds_sum"), rep["mean_ttft_ms"].(float64)*n/1000
	if ttft <= 0 || prep <= 0 || ttft+prep > client+0.05 {
		t.Errorf("server TTFT sum %.3fs and preparation %.3fs, client %.3fs", ttft, prep, client)
	}
	// A request waits in the queue for part of its TTFT.
	if queue := delta("vllm:request_queue_time_seconds_sum"); queue <= 0 || queue > ttft {
		t.Errorf("queue time sum %.4fs, TTFT sum %.3fs", queue, ttft)
	}
	if after[`vllm:num_requests_running{model_name="kiln-demo"}`] != 0 || after[`kiln_kv_blocks_total{model_name="kiln-demo"}`] <= 0 {
		t.Errorf("after the run: %v", after)
	}
	t.Logf("%d scrapes during the run", scrapes)
}
