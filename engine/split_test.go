package engine

import (
	"math/rand/v2"
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
			evictAndReturn(t, e, newEngine(t, loadFixture(t, arch), Options{NoCache: true}), f, rand.New(rand.NewPCG(13, 14)), 5)
		})
	}
}
