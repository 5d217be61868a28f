package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/gguf"
)

// TestSynth writes synthetic models with "kiln synth" and runs them with
// "kiln bench --model FILE.gguf" and "kiln tokenize" (the file's own
// vocabulary and chat template); model's TestSyntheticGGUF checks that the
// file holds the synthetic model's very weights.
func TestSynth(t *testing.T) {
	bin := kilnBinary(t)
	dir := t.TempDir()
	run := func(args ...string) (string, error) {
		out, err := exec.Command(bin, args...).CombinedOutput()
		return string(out), err
	}
	for _, c := range []struct {
		name, dtype string
		warn        string
	}{
		{"tiny-qwen3", "f16", ""},
		{"tiny-qwen3moe", "bf16", "layers [1] have a dense MLP"},
		{"tiny-qwen3next", "f32", "layers [2] have a dense MLP"},
	} {
		path := filepath.Join(dir, c.name+".gguf")
		out, err := run("synth", "--synthetic", c.name, "--dtype", c.dtype, "--out", path)
		if err != nil {
			t.Fatalf("kiln synth %s: %v\n%s", c.name, err, out)
		}
		if !strings.Contains(out, "wrote "+path) || (c.warn != "") != strings.Contains(out, "warning: ") || !strings.Contains(out, c.warn) {
			t.Errorf("kiln synth %s printed %q", c.name, out)
		}
		bench, err := exec.Command(bin, "bench", "--model", path, "--backend", "cpu", "--batches", "1",
			"--contexts", "16", "--prefill", "16", "--steps", "1", "--json").Output()
		if err != nil {
			t.Fatalf("kiln bench --model %s: %v\n%s", path, err, bench)
		}
		var rep struct {
			Model   string `json:"model"`
			Results []struct {
				TokS float64 `json:"tok_s"`
			} `json:"results"`
		}
		if err := json.Unmarshal(bench, &rep); err != nil || rep.Model != c.name || len(rep.Results) != 2 || !(rep.Results[1].TokS > 0) {
			t.Errorf("kiln bench --model %s: %v %s", path, err, bench)
		}
		var ids strings.Builder
		if err := tokenize([]string{"--model", path}, strings.NewReader("<|im_start|>user\n the cat<|im_end|>"), &ids); err != nil {
			t.Fatal(err)
		}
		// <|im_start|> u s er \n Ġthe Ġc at <|im_end|>: the byte tokens
		// have Qwen's ids, the merges apply.
		if ids.String() != "[510,84,82,268,198,266,270,267,511]\n" {
			t.Errorf("%s tokenizes the ChatML line as %s", c.name, ids.String())
		}
	}

	// --vocab-from: another file's 512 tokens, and LM head, for qwen3-0.6b.
	if testing.Short() {
		return
	}
	path := filepath.Join(dir, "small.gguf")
	if out, err := run("synth", "--synthetic", "qwen3-0.6b", "--layers", "1", "--vocab-from", "../../testdata/quant/qwen3-w256-Q8_0.gguf", "--out", path); err != nil {
		t.Fatalf("kiln synth --vocab-from: %v\n%s", err, out)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	toks, _ := f.Strings("tokenizer.ggml.tokens")
	emb, _ := f.Tensor("token_embd.weight")
	layers, _ := f.Uint("qwen3.block_count")
	f.Close()
	if len(toks) != 512 || emb.Shape[0] != 512 || emb.Type != gguf.BF16 || layers != 1 {
		t.Errorf("--vocab-from: %d tokens, token_embd %v %v, %d layers", len(toks), emb.Type, emb.Shape, layers)
	}

	// Errors leave no file behind.
	for _, args := range [][]string{
		{"--synthetic", "tiny-qwen3", "--dtype", "q4_k"},
		{"--synthetic", "tiny-qwen35"},
		{"--synthetic", "nope"},
		{"--synthetic", "tiny-qwen3", "--vocab-from", filepath.Join(dir, "missing.gguf")},
	} {
		bad := filepath.Join(dir, "bad.gguf")
		if out, err := run(append(append([]string{"synth"}, args...), "--out", bad)...); err == nil {
			t.Errorf("kiln synth %v: no error\n%s", args, out)
		}
		if _, err := os.Stat(bad); err == nil {
			t.Errorf("kiln synth %v left %s", args, bad)
		}
	}
	if out, err := run("synth", "--synthetic", "tiny-qwen3"); err == nil || !strings.Contains(out, "--out is required") {
		t.Errorf("no --out: %v %s", err, out)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") {
			t.Errorf("temporary file %s left", e.Name())
		}
	}
}
