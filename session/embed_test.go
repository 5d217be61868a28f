package session

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/internal/testmodel"
)

// embedSession starts a session on the embedding model in dir.
func embedSession(t testing.TB, dir string) (*Session, testmodel.Fixture) {
	t.Helper()
	f := testmodel.LoadDir(t, dir, testmodel.Options{})
	e, err := engine.New(f.Model, f.Tok, engine.Options{Logger: testmodel.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	s := New(e, f.Tok, nil, Options{Logger: testmodel.Logger()})
	t.Cleanup(func() { s.Close() })
	return s, f
}

// kiln's embeddings of the Qwen3-Embedding-style fixture equal
// sentence-transformers' to 1e-4, token ids included: all inputs in one
// request (batched by the engine), then each alone, truncated to the
// fixture's max_seq_length where sentence-transformers truncated, and cut
// to 16 dimensions. The fixture is made on the GPU machine by
// scripts/make_embedding_fixture.py.
func TestEmbeddingReference(t *testing.T) {
	dir := testmodel.Dir("qwen3-embedding")
	if _, err := os.Stat(filepath.Join(dir, "reference.json")); errors.Is(err, os.ErrNotExist) {
		t.Skip("testdata/fixtures/qwen3-embedding is absent: run scripts/make_embedding_fixture.py on a machine with sentence-transformers and commit it")
	}
	checkReference(t, dir)
}

// checkReference compares the embeddings of the model in dir with its
// reference.json.
func checkReference(t *testing.T, dir string) {
	data, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		MaxSeqLength int `json:"max_seq_length"`
		Dimensions   int `json:"dimensions"`
		Cases        []struct {
			Input     string    `json:"input"`
			IDs       []int32   `json:"ids"`
			Truncated bool      `json:"truncated"`
			Embedding []float64 `json:"embedding"`
			Short     []float64 `json:"embedding_16"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	s, f := embedSession(t, dir)
	if info, _ := s.eng.Embedding(); info.MaxTokens != ref.MaxSeqLength || !info.Normalized || ref.Dimensions != 16 {
		t.Fatalf("the model reads as %+v; the reference has max_seq_length %d", info, ref.MaxSeqLength)
	}
	prefix, suffix := f.Tok.SpecialTokens()
	var inputs []string
	for i, c := range ref.Cases {
		ids := append(append(slices.Clone(prefix), f.Tok.Encode(c.Input)...), suffix...)
		if c.Truncated {
			ids = append(ids[:ref.MaxSeqLength-len(suffix)], suffix...)
		}
		if !slices.Equal(ids, c.IDs) {
			t.Errorf("case %d: kiln's tokens %v, sentence-transformers' %v", i, ids, c.IDs)
		}
		inputs = append(inputs, c.Input)
	}
	check := func(what string, got []float32, want []float64) {
		t.Helper()
		worst := 0.0
		for j := range want {
			worst = max(worst, math.Abs(float64(got[j])-want[j]))
		}
		if len(got) != len(want) || worst > 1e-4 {
			t.Errorf("%s: %d components, largest difference %.3g", what, len(got), worst)
		}
	}
	all, err := s.Embed(context.Background(), &EmbedRequest{Inputs: inputs, Truncate: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range ref.Cases {
		check(c.Input, all.Vectors[i], c.Embedding)
		one, err := s.Embed(context.Background(), &EmbedRequest{Inputs: []string{c.Input}, Truncate: c.Truncated, Dimensions: ref.Dimensions})
		if err != nil {
			t.Fatal(err)
		}
		check(c.Input+" (16 dimensions)", one.Vectors[0], c.Short)
	}
}

// Embeddings through the session: a token-id input equals the text's with
// the tokenizer's special tokens, dimensions cut and renormalise, inputs
// over the model's limit are an error unless truncated, and a generative
// model's session refuses them.
func TestEmbed(t *testing.T) {
	s, f := embedSession(t, testmodel.AsEmbedding(t, "qwen3"))
	ctx := context.Background()
	text := "The sea is deep and the waves are high."
	byText, err := s.Embed(ctx, &EmbedRequest{Inputs: []string{text}})
	if err != nil {
		t.Fatal(err)
	}
	_, suffix := f.Tok.SpecialTokens()
	ids := append(f.Tok.Encode(text), suffix...)
	byIDs, err := s.Embed(ctx, &EmbedRequest{InputIDs: [][]int32{ids}})
	if err != nil || byText.PromptTokens != len(ids) {
		t.Fatalf("by ids: %v; %d prompt tokens, want %d", err, byText.PromptTokens, len(ids))
	}
	for i, x := range byIDs.Vectors[0] {
		if math.Abs(float64(x-byText.Vectors[0][i])) > 1e-6 {
			t.Fatalf("by ids, component %d: %v, by text %v", i, x, byText.Vectors[0][i])
		}
	}
	short, err := s.Embed(ctx, &EmbedRequest{Inputs: []string{text}, Dimensions: 8})
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(byText.Vectors[0][:8])
	engine.Normalize(want)
	// The text is cached by now: its last token alone runs, through the
	// decode attention rather than the prompt's, whose sums round
	// differently (the engine's TestEmbed allows the cache 1e-5 too).
	for i := range want {
		if math.Abs(float64(short.Vectors[0][i]-want[i])) > 1e-5 {
			t.Fatalf("8 dimensions: %v, want %v", short.Vectors[0], want)
		}
	}
	long := ""
	for range 300 {
		long += "word "
	}
	if _, err := s.Embed(ctx, &EmbedRequest{Inputs: []string{long}}); !errors.Is(err, engine.ErrContextOverflow) {
		t.Errorf("an input over max_seq_length: %v", err)
	}
	if res, err := s.Embed(ctx, &EmbedRequest{Inputs: []string{long}, Truncate: true}); err != nil || res.PromptTokens != 256 {
		t.Errorf("truncated: %v, %+v", err, res)
	}
	var de *DimensionsError
	if _, err := s.Embed(ctx, &EmbedRequest{Inputs: []string{text}, Dimensions: 65}); !errors.As(err, &de) {
		t.Errorf("65 dimensions of 64: %v", err)
	}
	chat, _ := newSession(t, "qwen3", testmodel.Options{}, engine.Options{}, Options{})
	if _, err := chat.Embed(ctx, &EmbedRequest{Inputs: []string{text}}); !errors.Is(err, engine.ErrNotEmbedding) {
		t.Errorf("a generative model: %v", err)
	}
}
