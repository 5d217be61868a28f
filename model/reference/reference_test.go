package reference

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	for _, name := range Fixtures {
		r, err := Read(filepath.Join("..", "..", "testdata", "fixtures", name))
		if err != nil {
			t.Fatal(err)
		}
		for i, p := range r.Prompts {
			if len(p.Logits) != r.VocabSize || len(p.Argmax) != len(p.IDs) || len(p.Greedy) == 0 {
				t.Errorf("%s prompt %d: %d logits (vocab %d), %d argmax for %d ids, %d greedy", name, i, len(p.Logits), r.VocabSize, len(p.Argmax), len(p.IDs), len(p.Greedy))
			}
		}
	}
}

// A logits file that does not match reference.json is an error, not a
// silent misalignment of every prompt's logits.
func TestReadShortLogits(t *testing.T) {
	src := filepath.Join("..", "..", "testdata", "fixtures", "qwen3")
	dir := t.TempDir()
	for _, f := range []string{"reference.json", "ref_logits.f32"} {
		data, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "ref_logits.f32" {
			data = data[:len(data)-4]
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Read(dir); err == nil || !strings.Contains(err.Error(), "floats") {
		t.Errorf("error %v, want one about the number of floats", err)
	}
}

func TestMaxError(t *testing.T) {
	if e := MaxError([]float32{1, 2.5}, []float32{1, 2}); e != 0.25 {
		t.Errorf("MaxError = %v, want 0.5/2", e)
	}
	if e := MaxError([]float32{0.1}, []float32{0.2}); e < 0.0999 || e > 0.1001 {
		t.Errorf("MaxError with small references = %v, want 0.1 (divided by 1)", e)
	}
}
