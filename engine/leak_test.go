package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestRandomizedNoLeaks runs thousands of requests with random lengths and
// shared prefixes, random cancellations and a KV cache small enough to force
// preemptions. Every uncancelled request must give its solo greedy tokens,
// and in the end every block is free, the snapshots within budget and every
// goroutine gone. Block accounting is also checked after every step.
func TestRandomizedNoLeaks(t *testing.T) {
	for _, tc := range []struct {
		arch     string
		requests int
		overlap  bool
		store    bool // a state cache in host memory, small enough to drop entries
	}{{"qwen3", 2000, false, false}, {"qwen3", 1000, true, false}, {"qwen3next", 1000, false, false},
		{"qwen3", 1000, false, true}, {"qwen3next", 1000, false, true}, {"qwen3next", 1000, true, true}} {
		t.Run(fmt.Sprintf("%s/overlap=%v/store=%v", tc.arch, tc.overlap, tc.store), func(t *testing.T) {
			randomizedRun(t, tc.arch, tc.requests, tc.overlap, tc.store)
		})
	}
}

func randomizedRun(t *testing.T, arch string, requests int, overlap, store bool) {
	const maxGen = 24
	f := loadFixture(t, arch)
	ref := newEngine(t, loadFixture(t, arch), Options{NoCache: true})
	rng := rand.New(rand.NewPCG(11, 12))

	// A pool of prompts sharing prefixes, and their solo greedy answers.
	bases := [][]int32{randomPrompt(rng, f, 9), randomPrompt(rng, f, 17), randomPrompt(rng, f, 4)}
	var prompts [][]int32
	solo := map[int][]int32{}
	for i := range 40 {
		p := slices.Clone(bases[i%len(bases)])
		p = append(p, randomPrompt(rng, f, rng.IntN(16))...)
		p = p[:1+rng.IntN(len(p))]
		prompts = append(prompts, p)
		solo[i] = generate(t, ref, &Request{Prompt: p, Sampling: Sampling{MaxTokens: maxGen}}).tokens
	}
	ref.Close()

	before := runtime.NumGoroutine()
	opts := Options{BlockSize: 4, KVBlocks: 14, MaxRunning: 8, MaxBatchTokens: 24, SnapshotInterval: 8, StateMemory: int64(6 * max(f.Model.SlotBytes(), 1)), overlap: overlap}
	if store {
		opts.StateCache = StateCache{RAMBytes: 64 << 10}
		opts.spillAfter = time.Millisecond
	}
	e := newEngine(t, f, opts)
	type job struct {
		prompt, maxTokens int
		cancelAfter       int // events read before cancelling; -1: never
	}
	jobs := make(chan job)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var completed, cancelled int
	for range 24 {
		wg.Go(func() {
			for j := range jobs {
				ctx, cancel := context.WithCancel(context.Background())
				st, err := e.Generate(ctx, &Request{Prompt: prompts[j.prompt], Sampling: Sampling{MaxTokens: j.maxTokens}})
				if err != nil {
					t.Error(err)
					cancel()
					continue
				}
				if j.cancelAfter == 0 {
					cancel()
				}
				var toks []int32
				var done *Event
				n := 0
				for ev := range st.Events() {
					toks = append(toks, ev.Tokens...)
					if n++; n == j.cancelAfter {
						cancel()
					}
					if ev.Done {
						done = &ev
					}
				}
				cancel()
				mu.Lock()
				switch {
				case done == nil:
					t.Error("stream closed without a final event")
				case done.Finish == FinishCancelled:
					cancelled++
				case j.cancelAfter >= 0:
					// Cancelled as it completed: events after the
					// cancellation may have been dropped.
				case done.Err != nil:
					t.Errorf("request failed: %v", done.Err)
				default:
					completed++
					want := solo[j.prompt]
					want = want[:min(len(want), j.maxTokens)]
					if !slices.Equal(toks, want) {
						t.Errorf("prompt %d (%d tokens), max %d: got %v (%s, %+v), solo %v", j.prompt, len(prompts[j.prompt]), j.maxTokens, toks, done.Finish, *done.Usage, want)
					}
				}
				mu.Unlock()
			}
		})
	}
	for range requests {
		j := job{prompt: rng.IntN(len(prompts)), maxTokens: 1 + rng.IntN(maxGen), cancelAfter: -1}
		if rng.IntN(8) == 0 {
			j.cancelAfter = rng.IntN(4)
		}
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	// Stats are published after each step: the last one may still be
	// running after the last stream ended.
	st := e.Stats()
	for end := time.Now().Add(5 * time.Second); st.Running+st.Waiting > 0 && time.Now().Before(end); st = e.Stats() {
		time.Sleep(time.Millisecond)
	}
	t.Logf("%d completed, %d cancelled; stats %+v", completed, cancelled, st)
	if st.Running != 0 || st.Waiting != 0 {
		t.Errorf("idle engine: %d running, %d waiting", st.Running, st.Waiting)
	}
	if st.Preemptions == 0 {
		t.Error("the small KV cache forced no preemption")
	}
	if completed == 0 || cancelled == 0 {
		t.Errorf("%d completed, %d cancelled: the test did not exercise both", completed, cancelled)
	}
	if store && (st.StateCacheRestores == 0 || st.StateCacheRAMBytes > 64<<10) {
		t.Errorf("state cache: %d restores, %d bytes", st.StateCacheRestores, st.StateCacheRAMBytes)
	}
	e.Close()
	if used := e.sched.alloc.Used(); used != 0 {
		t.Errorf("%d blocks held after Close", used)
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<16)
		t.Errorf("%d goroutines before, %d after:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}
