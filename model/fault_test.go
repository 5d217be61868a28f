package model

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/backend/cpu"
)

// TestWeightFileChanged: a weight file truncated in place under a loaded
// model (as cp or a download rewriting it does) fails the next step with an
// error that names the file and says to restart; it used to kill the
// process with SIGBUS, and every request in it.
func TestWeightFileChanged(t *testing.T) {
	dir, tensors := copyFixture(t, "qwen3")
	path := filepath.Join(dir, "model.safetensors")
	writeSafetensors(t, path, tensors)
	m, err := Load(dir, cpu.New(cpu.Options{Threads: 4}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ids := readReference(t, fixtureDir("qwen3")).Prompts[0].IDs
	lastLogits(t, m, ids) // the model runs
	if err := os.Truncate(path, 4096); err != nil {
		t.Fatal(err)
	}
	for range 2 { // and keeps failing cleanly, step after step
		_, err = m.Forward([]Seq{{Tokens: ids, Blocks: blocksFor(0, len(ids), testBlockSize), Logits: LastLogits}})
		if !errors.Is(err, ErrWeightsChanged) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "restart kiln") {
			t.Fatalf("got %v", err)
		}
	}
}
