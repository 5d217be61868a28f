package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/internal/testmodel"
	"github.com/kiln-llm/kiln/model/reference"
)

// TestGenerateCommand builds kiln and runs "kiln generate" on a fixture:
// the greedy tokens must be transformers' and the dumped logits must match
// the reference logits.
func TestGenerateCommand(t *testing.T) {
	bin := kilnBinary(t)
	dir := testmodel.Dir("qwen3next")
	ref, err := reference.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	p := ref.Prompts[1]
	ids := make([]string, len(p.IDs))
	for i, id := range p.IDs {
		ids[i] = strconv.Itoa(int(id))
	}
	dump := filepath.Join(t.TempDir(), "logits.f32")
	cmd := exec.Command(bin, "generate", "--model", dir, "--prompt-ids", strings.Join(ids, ","),
		"--max-tokens", "32", "--temperature", "0", "--ignore-eos", "--json", "--dump-logits", dump, "--backend", "cpu")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kiln generate: %v\n%s", err, out)
	}
	var res struct {
		Tokens       []int32 `json:"tokens"`
		FinishReason string  `json:"finish_reason"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	if len(res.Tokens) != 32 || res.FinishReason != "length" {
		t.Fatalf("%d tokens, finish %q", len(res.Tokens), res.FinishReason)
	}
	for i, tok := range res.Tokens {
		if tok != p.Greedy[i] {
			if p.GreedyMargins[i] > 1e-2 {
				t.Fatalf("token %d is %d, transformers %d (margin %.3g)", i, tok, p.Greedy[i], p.GreedyMargins[i])
			}
			break
		}
	}

	got, err := reference.ReadF32(dump)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(p.Logits) {
		t.Fatalf("dumped %d logits, want %d", len(got), len(p.Logits))
	}
	if e := reference.MaxError(got, p.Logits); e > 1e-3 {
		t.Fatalf("dumped logits differ from the reference by %.3g (relative to max(1, max|ref|))", e)
	}

	// A bf16 cache generates too; an unknown cache type is refused.
	bf16 := exec.Command(bin, "generate", "--model", dir, "--prompt-ids", "1,2,3", "--max-tokens", "2", "--ignore-eos", "--kv", "bf16", "--backend", "cpu")
	if out, err := bf16.CombinedOutput(); err != nil {
		t.Fatalf("--kv bf16: %v %s", err, out)
	}
	f16 := exec.Command(bin, "generate", "--model", dir, "--prompt-ids", "1,2,3", "--kv", "f16", "--backend", "cpu")
	if out, err := f16.CombinedOutput(); err == nil || !strings.Contains(string(out), "want bf16 or f32") {
		t.Fatalf("--kv f16: %v %s", err, out)
	}
	bad := exec.Command(bin, "generate", "--model", dir, "--prompt-ids", "1,x")
	if out, err := bad.CombinedOutput(); err == nil || !strings.Contains(string(out), `"x" is not a token id`) {
		t.Fatalf("bad prompt ids: %v %s", err, out)
	}
	long := exec.Command(bin, "generate", "--model", dir, "--prompt-ids", "1,2,3", "--max-tokens", "4094", "--ignore-eos", "--backend", "cpu") // 4097 > 4096
	if out, err := long.CombinedOutput(); err == nil || !strings.Contains(string(out), "exceed the model's context") {
		t.Fatalf("generating past the context: %v %s", err, out)
	}
}
