package model_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/internal/testmodel"
	"github.com/kiln-llm/kiln/model"
	"github.com/kiln-llm/kiln/model/reference"
)

// TestFed: decode steps whose tokens are fed from the last sampling on the
// device (Seq.Fed) give the tokens that steps given them by the host give:
// each step issued before the last one's tokens are read (ahead), and fed
// rows beside a token from the host (mixed); rows are fed in the reverse
// of the order they were sampled in; a dense and a hybrid model.
func TestFed(t *testing.T) {
	for _, name := range []string{"qwen3", "qwen3next"} {
		t.Run(name, func(t *testing.T) {
			const steps = 8
			ref, err := reference.Read(testmodel.Dir(name))
			if err != nil {
				t.Fatal(err)
			}
			var prompts [][]int32
			for _, p := range ref.Prompts {
				prompts = append(prompts, p.IDs)
			}
			want := testmodel.FedDecode(t, testmodel.Load(t, name, testmodel.Options{}).Model, prompts, steps, testmodel.FromHost)
			for _, mode := range []testmodel.FedMode{testmodel.FedAhead, testmodel.FedMixed} {
				got := testmodel.FedDecode(t, testmodel.Load(t, name, testmodel.Options{}).Model, prompts, steps, mode)
				for i := range want {
					if !slices.Equal(got[i], want[i]) {
						t.Errorf("%s: sequence %d: %v, from the host %v", mode, i, got[i], want[i])
					}
				}
			}
		})
	}
}

// TestFedRefused: a fed sequence that names no row of the last sampling,
// or has more than one new token, is an error, not a panic.
func TestFedRefused(t *testing.T) {
	m := testmodel.Load(t, "qwen3", testmodel.Options{}).Model
	if err := m.AllocCache(model.CacheSpec{Blocks: 4, BlockSize: 16, Slots: 1}); err != nil {
		t.Fatal(err)
	}
	logits, err := m.Forward([]model.Seq{{Tokens: []int32{1, 2}, Blocks: []int32{0}, Logits: model.LastLogits}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Sample(logits, make([]backend.SampleParams, 1)); err != nil {
		t.Fatal(err)
	}
	for _, s := range []model.Seq{
		{Tokens: []int32{0}, Pos: 2, Blocks: []int32{0}, Logits: model.LastLogits, Fed: true, FedRow: 1},
		{Tokens: []int32{0}, Pos: 2, Blocks: []int32{0}, Logits: model.LastLogits, Fed: true, FedRow: -1},
		{Tokens: []int32{0, 0}, Pos: 2, Blocks: []int32{0}, Logits: model.LastLogits, Fed: true},
	} {
		if _, err := m.Forward([]model.Seq{s}); err == nil || !strings.Contains(err.Error(), "fed from row") {
			t.Errorf("fed row %d with %d tokens: error %v", s.FedRow, len(s.Tokens), err)
		}
	}
}
