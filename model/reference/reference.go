// Package reference reads the outputs transformers computed for the fixture
// models (testdata/fixtures, made by scripts/make_fixtures.py), so that every
// backend and command is checked against the same numbers.
package reference

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
)

// Fixtures names the fixture directories under testdata/fixtures.
var Fixtures = []string{"qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen35vl"}

// Reference is what transformers computed, in fp32, for one fixture.
type Reference struct {
	Architecture string   `json:"architecture"`
	VocabSize    int      `json:"vocab_size"`
	Prompts      []Prompt `json:"prompts"`
}

// Prompt is one reference prompt and transformers' outputs for it.
type Prompt struct {
	IDs           []int32   `json:"ids"`
	Argmax        []int32   `json:"argmax"`  // per prompt position
	Margins       []float64 `json:"margins"` // top-2 logit margin per prompt position
	Greedy        []int32   `json:"greedy"`  // the greedy continuation
	GreedyMargins []float64 `json:"greedy_margins"`
	MaxAbsLogit   float64   `json:"max_abs_logit"`
	Logits        []float32 `json:"-"` // at the last prompt position (ref_logits.f32)
}

// Read reads dir/reference.json and the last-position logits of every prompt
// from dir/ref_logits.f32.
func Read(dir string) (*Reference, error) {
	data, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		return nil, err
	}
	var r Reference
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	path := filepath.Join(dir, "ref_logits.f32")
	all, err := ReadF32(path)
	if err != nil {
		return nil, err
	}
	if len(all) != len(r.Prompts)*r.VocabSize {
		return nil, fmt.Errorf("%s holds %d floats, want %d", path, len(all), len(r.Prompts)*r.VocabSize)
	}
	for i := range r.Prompts {
		r.Prompts[i].Logits = all[i*r.VocabSize : (i+1)*r.VocabSize]
	}
	return &r, nil
}

// ReadF32 reads a file of little-endian float32 values.
func ReadF32(path string) ([]float32, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return DecodeF32(raw), nil
}

// DecodeF32 decodes little-endian float32 values.
func DecodeF32(raw []byte) []float32 {
	out := make([]float32, len(raw)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
	}
	return out
}

// MaxError is the error measure of the fixtures' bar: max |got - want| over
// the row, divided by max(1, max |want|).
func MaxError(got, want []float32) float64 {
	var maxErr, maxRef float64
	for i := range want {
		maxErr = math.Max(maxErr, math.Abs(float64(got[i])-float64(want[i])))
		maxRef = math.Max(maxRef, math.Abs(float64(want[i])))
	}
	return maxErr / math.Max(1, maxRef)
}
