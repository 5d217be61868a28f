package main

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestGenerateCommand builds kiln and runs "kiln generate" on a fixture:
// the greedy tokens must be transformers' and the dumped logits must match
// the reference logits.
func TestGenerateCommand(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the kiln binary")
	}
	bin := filepath.Join(t.TempDir(), "kiln")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := filepath.Join("..", "..", "testdata", "fixtures", "qwen3next")
	data, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Prompts []struct {
			IDs           []int32   `json:"ids"`
			Greedy        []int32   `json:"greedy"`
			GreedyMargins []float64 `json:"greedy_margins"`
		} `json:"prompts"`
	}
	if err := json.Unmarshal(data, &ref); err != nil {
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

	raw, err := os.ReadFile(dump)
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(dir, "ref_logits.f32"))
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) != 512*4 {
		t.Fatalf("dumped %d bytes, want %d", len(raw), 512*4)
	}
	want = want[512*4 : 2*512*4] // prompt 1
	var maxErr, maxRef float64
	for i := 0; i < len(raw); i += 4 {
		g := math.Float32frombits(binary.LittleEndian.Uint32(raw[i:]))
		w := math.Float32frombits(binary.LittleEndian.Uint32(want[i:]))
		maxErr = math.Max(maxErr, math.Abs(float64(g-w)))
		maxRef = math.Max(maxRef, math.Abs(float64(w)))
	}
	if maxErr > 1e-3*math.Max(1, maxRef) {
		t.Fatalf("dumped logits differ from the reference by %.3g", maxErr)
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
