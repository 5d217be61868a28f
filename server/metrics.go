package server

import (
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/session"
)

// serverMetrics is what GET /metrics exposes in Prometheus's text format:
// vLLM's metric names where vLLM has the metric (so that dashboards and
// alerts made for vLLM read kiln), kiln_ otherwise, each labelled with the
// served model as vLLM labels them. The engine's counters and gauges are
// read from engine.Stats at each scrape, all from one snapshot; the
// per-request histograms and finish counts are recorded as the server's
// generations end (generation.close).
type serverMetrics struct {
	set          *metrics.Set
	model        string // the model_name label's value, escaped
	ttft, tpot   *metrics.PrometheusHistogram
	e2e          *metrics.PrometheusHistogram
	prep         *metrics.PrometheusHistogram // kiln's: arrival to the engine having the prompt
	queue        *metrics.PrometheusHistogram
	promptTokens *metrics.PrometheusHistogram
	outputTokens *metrics.PrometheusHistogram
}

// Bucket bounds, in seconds, as vLLM's (with finer TPOT buckets below
// 10 ms, where a GPU decodes).
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	tpotBuckets = []float64{0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	e2eBuckets  = []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
)

// tokenBuckets are vLLM's for request lengths: 1, 2, 5, 10, 20, 50, ...
func tokenBuckets(most int) []float64 {
	var b []float64
	for scale := 1; ; scale *= 10 {
		for _, m := range []int{1, 2, 5} {
			if m*scale > most {
				return b
			}
			b = append(b, float64(m*scale))
		}
	}
}

func newServerMetrics(model string, eng *engine.Engine) *serverMetrics {
	metrics.ExposeMetadata(true) // # TYPE lines, which Prometheus reads
	model = labelEscaper.Replace(model)
	label := `{model_name="` + model + `"}`
	set := metrics.NewSet()
	ctx, _ := eng.Context()
	m := &serverMetrics{
		set:          set,
		model:        model,
		ttft:         set.NewPrometheusHistogramExt("vllm:time_to_first_token_seconds"+label, ttftBuckets),
		tpot:         set.NewPrometheusHistogramExt("vllm:request_time_per_output_token_seconds"+label, tpotBuckets),
		e2e:          set.NewPrometheusHistogramExt("vllm:e2e_request_latency_seconds"+label, e2eBuckets),
		prep:         set.NewPrometheusHistogramExt("kiln_request_prepare_seconds"+label, ttftBuckets),
		queue:        set.NewPrometheusHistogramExt("vllm:request_queue_time_seconds"+label, ttftBuckets),
		promptTokens: set.NewPrometheusHistogramExt("vllm:request_prompt_tokens"+label, tokenBuckets(ctx)),
		outputTokens: set.NewPrometheusHistogramExt("vllm:request_generation_tokens"+label, tokenBuckets(ctx)),
	}
	for _, r := range []string{"stop", "length", "abort", "error"} {
		m.finished(r) // every reason from 0, so that rate() sees the first
	}
	set.RegisterMetricsWriter(func(w io.Writer) {
		st := eng.Stats()
		for _, g := range []struct {
			name string
			v    int64
		}{
			{"vllm:num_requests_running", int64(st.Running)},
			{"vllm:num_requests_waiting", int64(st.Waiting)},
			{"kiln_kv_blocks_used", int64(st.KVBlocksUsed)},
			{"kiln_kv_blocks_cached", int64(st.KVBlocksCached)},
			{"kiln_kv_blocks_total", int64(st.KVBlocksTotal)},
			{"kiln_state_snapshots", int64(st.StateSnapshots)},
			{"kiln_state_snapshot_bytes", st.StateBytes},
		} {
			metrics.WriteGaugeUint64(w, g.name+label, uint64(max(g.v, 0)))
		}
		for _, c := range []struct {
			name string
			v    int64
		}{
			{"vllm:prompt_tokens_total", st.PromptTokens},
			{"vllm:generation_tokens_total", st.GeneratedTokens},
			{"vllm:prefix_cache_queries_total", st.PromptTokens},
			{"vllm:prefix_cache_hits_total", st.CacheHitTokens},
			{"vllm:num_preemptions_total", st.Preemptions},
			{"kiln_recomputed_tokens_total", st.RecomputedTokens},
		} {
			metrics.WriteCounterUint64(w, c.name+label, uint64(max(c.v, 0)))
		}
	})
	return m
}

// labelEscaper escapes a label value as the text format wants.
var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// finished is the counter of requests that ended for reason (vLLM's
// finished_reason: stop, length, abort).
func (m *serverMetrics) finished(reason string) *metrics.Counter {
	return m.set.GetOrCreateCounter(`vllm:request_success_total{model_name="` + m.model + `",finished_reason="` + reason + `"}`)
}

// observe records a generation that ended with final, prep after the
// request arrived.
func (m *serverMetrics) observe(final session.Event, prep time.Duration) {
	m.prep.Update(prep.Seconds())
	reason := "stop"
	switch final.Finish {
	case engine.FinishLength:
		reason = "length"
	case engine.FinishCancelled:
		reason = "abort"
	case engine.FinishError:
		reason = "error"
	}
	m.finished(reason).Inc()
	u := final.Usage
	if u == nil || reason == "abort" || reason == "error" {
		return
	}
	m.promptTokens.Update(float64(u.PromptTokens))
	m.outputTokens.Update(float64(u.CompletionTokens))
	m.queue.Update(u.Queued.Seconds())
	if u.CompletionTokens == 0 {
		return
	}
	m.ttft.Update(u.TTFT.Seconds())
	m.e2e.Update(u.Duration.Seconds())
	if u.CompletionTokens > 1 {
		m.tpot.Update((u.Duration - u.TTFT).Seconds() / float64(u.CompletionTokens-1))
	}
}

// metricsPage serves GET /metrics.
func (s *Server) metricsPage(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	s.metrics.set.WritePrometheus(w)
}
