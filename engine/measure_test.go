package engine

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/backend/cpu"
	"github.com/kiln-llm/kiln/model"
)

// TestMeasureFollowUpTTFT measures the time to first token of a follow-up
// chat turn after long histories, with the prefix/state cache and without
// it, on a dense and a hybrid synthetic model, and the cost of preemption.
// It takes minutes, so it runs only when KILN_ENGINE_MEASURE is set:
//
//	KILN_ENGINE_MEASURE=1 go test -run MeasureFollowUpTTFT -v ./engine
//
// KILN_MEASURE_MODELS=name:layers,... picks other synthetic models and
// KILN_MEASURE_HISTORY=n,... other history lengths.
func TestMeasureFollowUpTTFT(t *testing.T) {
	if os.Getenv("KILN_ENGINE_MEASURE") == "" {
		t.Skip("set KILN_ENGINE_MEASURE=1 to measure")
	}
	models := []struct {
		name   string
		layers int
	}{{"tiny-qwen3", 0}, {"tiny-qwen3next", 0}, {"qwen3-0.6b", 1}}
	if v := os.Getenv("KILN_MEASURE_MODELS"); v != "" {
		models = models[:0]
		for _, f := range strings.Split(v, ",") {
			name, l, _ := strings.Cut(f, ":")
			n, _ := strconv.Atoi(l)
			models = append(models, struct {
				name   string
				layers int
			}{name, n})
		}
	}
	histories := []int{2048, 8192}
	if v := os.Getenv("KILN_MEASURE_HISTORY"); v != "" {
		histories = histories[:0]
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			if err != nil {
				t.Fatal(err)
			}
			histories = append(histories, n)
		}
	}
	for _, mc := range models {
		t.Run(mc.name, func(t *testing.T) {
			computed := map[int]bool{}
			for _, history := range histories {
				hit, hu, hs := followUp(t, mc.name, mc.layers, history, false)
				miss, _, _ := followUp(t, mc.name, mc.layers, history, true)
				fmt.Printf("%s (layers %d): history %5d tokens: follow-up TTFT %8.1f ms with cache (%d cached, %d computed; %d passes %.1f ms, host %.2f ms), %9.1f ms without: %.0fx\n",
					mc.name, mc.layers, history, ms(hit), hu.CachedTokens, hu.PromptTokens-hu.CachedTokens, hs.Steps, ms(hs.StepTime), ms(hit-hs.StepTime),
					ms(miss), float64(miss)/float64(hit))
				// The hit computes only the new message whatever the history
				// (its time still grows with the attention reading the
				// history's KV).
				computed[hu.PromptTokens-hu.CachedTokens] = true
				if hu.CachedTokens < history {
					t.Errorf("history %d: only %d tokens cached", history, hu.CachedTokens)
				}
				if miss < 5*hit {
					t.Errorf("history %d: hit %v, miss %v", history, hit, miss)
				}
			}
			if len(computed) != 1 {
				t.Errorf("the hit computed %v tokens: it depends on the history", computed)
			}
		})
	}
	t.Run("preemption", measurePreemption)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func syntheticModel(t *testing.T, name string, layers int) *model.Model {
	m, err := model.Synthetic(name, cpu.New(cpu.Options{}), model.SyntheticOptions{Layers: layers, Seed: 1, DType: backend.BF16})
	if err != nil {
		t.Fatal(err)
	}
	// The tiny shapes declare 4096 positions; their plain RoPE runs past
	// that, and the measurement needs up to 20K of history (the seed's case).
	if c := m.Config(); c.ContextLength < 32768 {
		c.ContextLength = 32768
	}
	return m
}

// followUp runs a first turn of history tokens (8 generated), then a second
// turn adding 32 tokens, and returns the second turn's TTFT and usage, and
// the forward passes until its first token (their count and time: the rest
// of the TTFT is the host's).
func followUp(t *testing.T, name string, layers, history int, noCache bool) (time.Duration, *Usage, Stats) {
	m := syntheticModel(t, name, layers)
	e, err := New(m, nil, Options{NoCache: noCache, MaxBatchTokens: 512, MaxRunning: 4, KVMemory: 4 << 30, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	rng := rand.New(rand.NewPCG(1, uint64(history)))
	ids := func(n int) []int32 {
		p := make([]int32, n)
		for i := range p {
			p[i] = int32(rng.IntN(500))
		}
		return p
	}
	p1 := ids(history)
	// The first turn's answer; computed by the cached engine only (the
	// other one would gain nothing from it).
	answer := ids(8)
	if !noCache {
		answer = generate(t, e, &Request{Prompt: p1, Sampling: Sampling{MaxTokens: 8, IgnoreEOS: true}}).tokens
	}
	p2 := append(append(slices.Clone(p1), answer...), ids(32)...)
	before := e.Stats()
	r2 := generate(t, e, &Request{Prompt: p2, Sampling: Sampling{MaxTokens: 1}})
	after := e.Stats()
	return r2.usage.TTFT, r2.usage, Stats{Steps: after.Steps - before.Steps, StepTime: after.StepTime - before.StepTime}
}

// measurePreemption runs the same 32 requests with a KV cache that holds
// them all and with one that forces preemptions, and compares.
func measurePreemption(t *testing.T) {
	run := func(blocks int) (time.Duration, Stats) {
		m := syntheticModel(t, "tiny-qwen3", 0)
		e, err := New(m, nil, Options{KVBlocks: blocks, MaxRunning: 16, MaxBatchTokens: 256, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		rng := rand.New(rand.NewPCG(5, 5))
		start := time.Now()
		var streams []*Stream
		for range 32 {
			p := make([]int32, 64+rng.IntN(64))
			for i := range p {
				p[i] = int32(rng.IntN(500))
			}
			st, err := e.Generate(context.Background(), &Request{Prompt: p, Sampling: Sampling{MaxTokens: 64, IgnoreEOS: true}})
			if err != nil {
				t.Fatal(err)
			}
			streams = append(streams, st)
		}
		for _, st := range streams {
			if r := collect(st); r.err != nil {
				t.Fatal(r.err)
			}
		}
		return time.Since(start), e.Stats()
	}
	ample, sa := run(16 * 12)
	tight, st := run(16 * 12 / 3)
	fmt.Printf("preemption: 32 requests x (64-128 prompt + 64 generated) tokens: %.2f s with room for all, %.2f s with a third of the KV blocks (%d preemptions, %d tokens recomputed): %.0f%% slower\n",
		ample.Seconds(), tight.Seconds(), st.Preemptions, st.RecomputedTokens, 100*(tight.Seconds()/ample.Seconds()-1))
	if sa.Preemptions != 0 || st.Preemptions == 0 {
		t.Errorf("preemptions: %d with room, %d tight", sa.Preemptions, st.Preemptions)
	}
}
