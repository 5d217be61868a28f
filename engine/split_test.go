package engine

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kiln-llm/kiln/backend/cpu"
	"github.com/kiln-llm/kiln/internal/testmodel"
	"github.com/kiln-llm/kiln/model"
)

// TestSplitModel: an engine runs a model split across two CPU ranks
// (model.Group) as it runs a whole one: conversations that the KV cache
// has no room for go to the state cache and come back (every rank's
// blocks and states saved and restored), follow-ups resume from the
// caches, and each answer is the whole model's without a cache.
func TestSplitModel(t *testing.T) {
	for _, arch := range []string{"qwen3", "qwen3next"} {
		t.Run(arch, func(t *testing.T) {
			f := loadFixture(t, arch)
			group := cpu.NewGroup(2, cpu.Options{Threads: 1})
			ranks := make([]*model.Model, len(group))
			for r, b := range group {
				m, err := model.Load(testmodel.Dir(arch), b, model.Options{Rank: r, Ranks: len(group)})
				if err != nil {
					t.Fatal(err)
				}
				ranks[r] = m
			}
			m, err := model.Group(ranks)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(m.Close)
			f.Model = m
			e := newEngine(t, f, Options{KVBlocks: 40, StateCache: StateCache{RAMBytes: 64 << 20}, spillAfter: time.Millisecond})
			cold := newEngine(t, loadFixture(t, arch), Options{NoCache: true})
			rng := rand.New(rand.NewPCG(13, 14))
			var convs [][]int32
			for range 5 { // 5 x 300 tokens: more than the 40 blocks of 16 hold
				p := randomPrompt(rng, f, 300)
				r := generate(t, e, &Request{Prompt: p, Sampling: Sampling{MaxTokens: 8, IgnoreEOS: true}})
				if ref := generate(t, cold, &Request{Prompt: p, Sampling: Sampling{MaxTokens: 8, IgnoreEOS: true}}); !slices.Equal(r.tokens, ref.tokens) {
					t.Errorf("split %v, whole %v", r.tokens, ref.tokens)
				}
				convs = append(convs, append(append(p, r.tokens...), randomPrompt(rng, f, 10)...))
			}
			for i, p := range convs {
				r := generate(t, e, &Request{Prompt: p, Sampling: Sampling{MaxTokens: 6}})
				if ref := generate(t, cold, &Request{Prompt: p, Sampling: Sampling{MaxTokens: 6}}); !slices.Equal(r.tokens, ref.tokens) {
					t.Errorf("conversation %d: split %v, whole %v", i, r.tokens, ref.tokens)
				}
				if r.usage.CachedTokens < len(p)-10-16 {
					t.Errorf("conversation %d: %d of %d tokens cached", i, r.usage.CachedTokens, len(p))
				}
			}
			if st := e.Stats(); st.StateCacheRestores == 0 {
				t.Errorf("nothing restored from the state cache: %+v", st)
			}
		})
	}
}
