package engine

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kiln-llm/kiln/internal/testmodel"
)

// embed returns the embedding of one prompt.
func embed(t testing.TB, e *Engine, prompt []int32) []float32 {
	t.Helper()
	st, err := e.Generate(context.Background(), &Request{Prompt: prompt, Embed: true})
	if err != nil {
		t.Fatal(err)
	}
	var emb []float32
	for ev := range st.Events() {
		if ev.Done {
			if ev.Finish != FinishStop || ev.Err != nil || len(ev.Tokens) != 0 {
				t.Fatalf("embedding ended %s (%v), tokens %v", ev.Finish, ev.Err, ev.Tokens)
			}
			emb = ev.Embedding
		}
	}
	return emb
}

// An embedding model's requests give unit vectors of the hidden size, the
// same alone, in a batch of prompts of other lengths, prefilled in chunks
// and from the prefix cache; generation requests are refused by it, and
// embedding requests by a generative model.
func TestEmbed(t *testing.T) {
	f := testmodel.LoadDir(t, testmodel.AsEmbedding(t, "qwen3"), testmodel.Options{})
	e := newEngine(t, f, Options{MaxBatchTokens: 64})
	rng := rand.New(rand.NewPCG(4, 5))
	var prompts [][]int32
	for i := range 6 {
		prompts = append(prompts, randomPrompt(rng, f, 5+37*i))
	}
	alone := make([][]float32, len(prompts))
	for i, p := range prompts {
		alone[i] = embed(t, e, p)
		var n float64
		for _, x := range alone[i] {
			n += float64(x) * float64(x)
		}
		if len(alone[i]) != f.Model.Config().Hidden || math.Abs(n-1) > 1e-5 {
			t.Fatalf("embedding of %d components, norm² %v", len(alone[i]), n)
		}
	}
	fresh := newEngine(t, testmodel.LoadDir(t, testmodel.AsEmbedding(t, "qwen3"), testmodel.Options{}), Options{MaxBatchTokens: 64})
	streams := make([]*Stream, len(prompts))
	for i, p := range prompts {
		var err error
		if streams[i], err = fresh.Generate(context.Background(), &Request{Prompt: p, Embed: true}); err != nil {
			t.Fatal(err)
		}
	}
	for i, st := range streams {
		var got []float32
		for ev := range st.Events() {
			got = ev.Embedding
		}
		for j := range got {
			if math.Abs(float64(got[j]-alone[i][j])) > 1e-5 {
				t.Fatalf("prompt %d in a batch: component %d is %v, alone %v", i, j, got[j], alone[i][j])
			}
		}
	}
	again := embed(t, e, prompts[5])
	if st := e.Stats(); st.CacheHitTokens == 0 {
		t.Error("the same prompt again found nothing cached")
	}
	for j := range again {
		if math.Abs(float64(again[j]-alone[5][j])) > 1e-5 {
			t.Fatalf("from the cache: component %d is %v, was %v", j, again[j], alone[5][j])
		}
	}
	if _, err := e.Generate(context.Background(), &Request{Prompt: prompts[0]}); !errors.Is(err, ErrEmbeddingModel) {
		t.Errorf("generation on an embedding model: %v", err)
	}
	chat := newEngine(t, loadFixture(t, "qwen3"), Options{})
	if _, err := chat.Generate(context.Background(), &Request{Prompt: prompts[0], Embed: true}); !errors.Is(err, ErrNotEmbedding) {
		t.Errorf("an embedding of a generative model: %v", err)
	}
}
