package engine

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kiln-llm/kiln/internal/testmodel"
)

// A conversation survives the engine: closed, its latest state goes to the
// state cache's directory, and a new engine on a new copy of the model
// restores the next turn from there and answers as a cold engine does.
func TestStateCacheRestart(t *testing.T) {
	for _, arch := range []string{"qwen3", "qwen3next"} {
		t.Run(arch, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 8))
			f := loadFixture(t, arch)
			sc, e, p1, r1 := storedTurn(t, f, rng)
			if st := e.Stats(); st.StateCacheEntries == 0 || st.StateCacheDiskBytes == 0 {
				t.Fatalf("after Close: %+v", st)
			}

			p2 := append(append(slices.Clone(p1), r1.tokens...), randomPrompt(rng, f, 20)...)
			e2 := newEngine(t, loadFixture(t, arch), Options{StateCache: sc})
			r2 := generate(t, e2, &Request{Prompt: p2, Sampling: Sampling{MaxTokens: 10}})
			cold := newEngine(t, loadFixture(t, arch), Options{NoCache: true})
			ref := generate(t, cold, &Request{Prompt: p2, Sampling: Sampling{MaxTokens: 10}})
			if !slices.Equal(r2.tokens, ref.tokens) {
				t.Errorf("after a restart %v, cold %v", r2.tokens, ref.tokens)
			}
			want := followUpCached(f, p1, r1.tokens)
			if st := e2.Stats(); r2.usage.CachedTokens != want || st.StateCacheRestores != 1 {
				t.Errorf("after a restart: %d tokens cached, want %d; %d restores", r2.usage.CachedTokens, want, st.StateCacheRestores)
			}
			// A regenerated answer then resumes on the device.
			again := generate(t, e2, &Request{Prompt: p2, Sampling: Sampling{MaxTokens: 10}})
			if st := e2.Stats(); !slices.Equal(again.tokens, ref.tokens) || st.StateCacheRestores != 1 || again.usage.CachedTokens < want {
				t.Errorf("regenerated: %v (cold %v), %d cached, %d restores", again.tokens, ref.tokens, again.usage.CachedTokens, st.StateCacheRestores)
			}
		})
	}
}

// storedTurn answers a first turn of 300 tokens on an engine with a state
// cache directory, then closes the engine, which keeps the conversation
// there for the next engine of sc.
func storedTurn(t *testing.T, f testmodel.Fixture, rng *rand.Rand) (sc StateCache, e *Engine, p1 []int32, r1 result) {
	t.Helper()
	sc = StateCache{Dir: t.TempDir(), DiskBytes: 64 << 20, Model: "fixture " + f.Model.Config().Name}
	p1 = randomPrompt(rng, f, 300)
	e = newEngine(t, f, Options{StateCache: sc})
	r1 = generate(t, e, &Request{Prompt: p1, Sampling: Sampling{MaxTokens: 12, IgnoreEOS: true}})
	e.Close()
	return sc, e, p1, r1
}

// Conversations the KV cache has no room for go to the state cache in host
// memory and come back from there; an idle engine copies its conversations'
// latest state there too.
func TestStateCacheEviction(t *testing.T) {
	for _, arch := range []string{"qwen3", "qwen3next"} {
		t.Run(arch, func(t *testing.T) {
			f := loadFixture(t, arch)
			rng := rand.New(rand.NewPCG(9, 10))
			e := newEngine(t, f, Options{KVBlocks: 40, StateCache: StateCache{RAMBytes: 64 << 20}, spillAfter: time.Millisecond})
			evictAndReturn(t, e, newEngine(t, loadFixture(t, arch), Options{NoCache: true}), f, rng, 6)
			// Idle: the latest conversation's end is copied.
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				if kept, _ := e.Conversations(); len(kept) > 0 && kept[0].Stored {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			kept, stored := e.Conversations()
			t.Errorf("an idle engine did not copy its latest conversation: %+v, stored %+v", kept, stored)
		})
	}
}

// evictAndReturn runs n conversations of 300 tokens on e, whose KV cache
// of 40 blocks of 16 holds fewer, then their next turns: each answer is
// cold's (an engine without a cache), the next turns resume from the
// caches, some from the state cache.
func evictAndReturn(t *testing.T, e, cold *Engine, f testmodel.Fixture, rng *rand.Rand, n int) {
	t.Helper()
	var convs [][]int32
	for range n {
		p := randomPrompt(rng, f, 300)
		req := &Request{Prompt: p, Sampling: Sampling{MaxTokens: 8, IgnoreEOS: true}}
		r := generate(t, e, req)
		if ref := generate(t, cold, req); !slices.Equal(r.tokens, ref.tokens) {
			t.Errorf("%v, cold %v", r.tokens, ref.tokens)
		}
		convs = append(convs, append(append(p, r.tokens...), randomPrompt(rng, f, 10)...))
	}
	for i, p := range convs {
		req := &Request{Prompt: p, Sampling: Sampling{MaxTokens: 6}}
		r := generate(t, e, req)
		if ref := generate(t, cold, req); !slices.Equal(r.tokens, ref.tokens) {
			t.Errorf("conversation %d: %v, cold %v", i, r.tokens, ref.tokens)
		}
		if r.usage.CachedTokens < len(p)-10-16 {
			t.Errorf("conversation %d: %d of %d tokens cached", i, r.usage.CachedTokens, len(p))
		}
	}
	if st := e.Stats(); st.StateCacheRestores == 0 {
		t.Errorf("nothing restored from the state cache: %+v", st)
	}
}

// A corrupt file is refused: the next turn recomputes and answers right.
func TestStateCacheCorruptFile(t *testing.T) {
	dir := t.TempDir()
	sc := StateCache{Dir: dir, DiskBytes: 64 << 20, Model: "fixture"}
	rng := rand.New(rand.NewPCG(11, 12))
	f := loadFixture(t, "qwen3next")
	p1 := randomPrompt(rng, f, 300)
	e := newEngine(t, f, Options{StateCache: sc})
	r1 := generate(t, e, &Request{Prompt: p1, Sampling: Sampling{MaxTokens: 8, IgnoreEOS: true}})
	e.Close()
	files, _ := filepath.Glob(filepath.Join(dir, "*", "*-*"))
	if len(files) == 0 {
		t.Fatal("no files")
	}
	for _, p := range files {
		b, _ := os.ReadFile(p)
		b[len(b)/2] ^= 0x40
		os.WriteFile(p, b, 0o600)
	}
	p2 := append(append(slices.Clone(p1), r1.tokens...), randomPrompt(rng, f, 20)...)
	e2 := newEngine(t, loadFixture(t, "qwen3next"), Options{StateCache: sc})
	r2 := generate(t, e2, &Request{Prompt: p2, Sampling: Sampling{MaxTokens: 10}})
	ref := generate(t, newEngine(t, loadFixture(t, "qwen3next"), Options{NoCache: true}), &Request{Prompt: p2, Sampling: Sampling{MaxTokens: 10}})
	if !slices.Equal(r2.tokens, ref.tokens) || r2.usage.CachedTokens != 0 {
		t.Errorf("over corrupt files: %v (%d cached), cold %v", r2.tokens, r2.usage.CachedTokens, ref.tokens)
	}
}

// A request whose prefix is read from the state cache holds up no other:
// while its files are read (held here), a decoding request goes on; one
// cancelled during its read gives back what it read; then the follow-up
// restores and answers as a cold engine does.
func TestStateCacheReadsInBackground(t *testing.T) {
	for _, arch := range []string{"qwen3", "qwen3next"} {
		t.Run(arch, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(13, 14))
			f := loadFixture(t, arch)
			sc, _, p1, r1 := storedTurn(t, f, rng)
			reading, release := make(chan struct{}), make(chan struct{})
			e2 := newEngine(t, loadFixture(t, arch), Options{StateCache: sc, beforeRead: func() {
				reading <- struct{}{}
				<-release
			}})
			other, err := e2.Generate(context.Background(), &Request{Prompt: randomPrompt(rng, f, 20), Sampling: Sampling{MaxTokens: 100, IgnoreEOS: true}})
			if err != nil {
				t.Fatal(err)
			}
			// tokens waits for n more tokens of the other request: a loop
			// reading the files itself would have none to give.
			tokens := func(n int) {
				t.Helper()
				for got := 0; got < n; {
					select {
					case ev := <-other.Events():
						if ev.Done {
							t.Fatalf("the other request ended after %d of %d tokens: %v", got, n, ev.Err)
						}
						got += len(ev.Tokens)
					case <-time.After(time.Minute):
						t.Fatalf("the other request stalled during a read of the state cache (%d of %d tokens)", got, n)
					}
				}
			}
			tokens(1)
			p2 := append(append(slices.Clone(p1), r1.tokens...), randomPrompt(rng, f, 20)...)
			req := &Request{Prompt: p2, Sampling: Sampling{MaxTokens: 10}}

			ctx, cancel := context.WithCancel(context.Background())
			gone, err := e2.Generate(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			<-reading
			tokens(10)
			cancel()
			if r := collect(gone); r.finish != FinishCancelled || len(r.tokens) != 0 {
				t.Errorf("cancelled while reading: %v, %d tokens", r.finish, len(r.tokens))
			}
			release <- struct{}{}

			follow, err := e2.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			<-reading
			tokens(10)
			release <- struct{}{}
			r2 := collect(follow)
			if r := collect(other); r.err != nil || r.finish != FinishLength {
				t.Errorf("the other request: %v, %v", r.finish, r.err)
			}
			ref := generate(t, newEngine(t, loadFixture(t, arch), Options{NoCache: true}), req)
			if !slices.Equal(r2.tokens, ref.tokens) {
				t.Errorf("restored in the background %v, cold %v", r2.tokens, ref.tokens)
			}
			if want := followUpCached(f, p1, r1.tokens); r2.usage.CachedTokens != want {
				t.Errorf("%d tokens cached, want %d", r2.usage.CachedTokens, want)
			}
		})
	}
}

// Where computing a prefix is faster than restoring it, the engine computes
// it: a GPU prefills fast, and a dense model's KV is large.
func TestStateCacheComputesWhenFaster(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	f := loadFixture(t, "qwen3")
	sc, _, p1, r1 := storedTurn(t, f, rng)
	p2 := append(append(slices.Clone(p1), r1.tokens...), randomPrompt(rng, f, 20)...)
	req := &Request{Prompt: p2, Sampling: Sampling{MaxTokens: 10}}
	e := newEngine(t, loadFixture(t, "qwen3"), Options{StateCache: sc, prefillRate: 1e12})
	r := generate(t, e, req)
	ref := generate(t, newEngine(t, loadFixture(t, "qwen3"), Options{NoCache: true}), req)
	if st := e.Stats(); !slices.Equal(r.tokens, ref.tokens) || r.usage.CachedTokens != 0 || st.StateCacheRestores != 0 {
		t.Errorf("%v (cold %v), %d tokens cached, %d restores", r.tokens, ref.tokens, r.usage.CachedTokens, st.StateCacheRestores)
	}
}

func TestWorthRestoring(t *testing.T) {
	for _, c := range []struct {
		prefill, restore float64
		tokens           int
		bytes            int64
		want             bool
	}{
		{0, 0, 20000, 3e9, true},        // no prefill rate: restore
		{45e3, 0, 20000, 2.95e9, false}, // Qwen3-8B, 20K tokens: 1.5 s at the default rate, 0.44 s to compute
		{45e3, 0, 2048, 302e6, false},   // its 2K: 0.15 s against 46 ms
		{55e3, 0, 20000, 153e6, true},   // qnext12, 20K: 77 ms against 0.36 s
		{45e3, 20e9, 2048, 302e6, true}, // a measured restore of 20 GB/s: 15 ms
		{100, 0, 48, 7e6, true},         // a CPU: 0.48 s to compute 48 tokens
	} {
		s := &scheduler{prefillRate: c.prefill, restoreRate: c.restore}
		if restore, compute, ok := s.worthRestoring(c.tokens, c.bytes); ok != c.want {
			t.Errorf("%+v: restore %v, compute %v: %v", c, restore, compute, ok)
		}
	}
}
