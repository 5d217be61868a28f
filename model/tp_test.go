package model

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/backend/cpu"
	"github.com/kiln-llm/kiln/gguf"
	"github.com/kiln-llm/kiln/model/reference"
)

// TestTensorParallel splits every architecture's fixture across two CPU
// ranks (each its share of the attention heads, the Gated DeltaNet's key
// and value heads, the MLPs' and shared expert's rows, and its half of
// the experts; every block's output summed over the group) and checks each
// rank's logits against the whole model's, for the reference prompts and
// greedy decode steps after them; and that what does not split is refused
// with the reason.
func TestTensorParallel(t *testing.T) {
	for _, fixture := range []string{"qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe"} {
		t.Run(fixture, func(t *testing.T) { testTensorParallel(t, fixtureDir(fixture), fixtureDir(fixture), 2, 1e-5) })
	}
	// Four ranks of two KV heads: each rank holds its query head's.
	for _, fixture := range []string{"qwen3", "qwen3moe"} {
		t.Run(fixture+"/4", func(t *testing.T) { testTensorParallel(t, fixtureDir(fixture), fixtureDir(fixture), 4, 1e-5) })
	}
	// llama.cpp's GGUF files of the Qwen3.5 fixtures store the DeltaNet's
	// value heads tiled (value head h reads key head h % HK): a rank takes
	// its range of each run of key heads.
	for _, fixture := range []string{"qwen35", "qwen35moe"} {
		t.Run(fixture+"/gguf", func(t *testing.T) {
			testTensorParallel(t, "../testdata/quant/"+fixture+"-f32.gguf", fixtureDir(fixture), 2, 1e-5)
		})
	}
	// Block-quantized weights split by columns at their blocks of 32
	// (Q8_0; MXFP4's experts whole), the prompts the fixtures', of the same
	// vocabulary. Their products round the input rows to int8 blocks,
	// where a float rounding's difference between the split and the
	// whole can move a value by a step: the bound is that rounding's.
	for _, c := range [][2]string{{"qwen3-w256-Q8_0", "qwen3"}, {"qwen3moe-w256-MXFP4_MOE", "qwen3moe"}} {
		t.Run(c[0], func(t *testing.T) {
			testTensorParallel(t, "../testdata/quant/"+c[0]+".gguf", fixtureDir(c[1]), 2, 3e-2)
		})
	}
	// A fused q|k|v whose parts a file stores in two types (Q4_K_M keeps
	// some v projections in Q6_K) is held apart on each rank, not widened
	// to f32: the Q8_0 file with its v projections in f32.
	t.Run("qwen3-w256-Q8_0-v-f32", func(t *testing.T) {
		path := mixedGGUF(t, "../testdata/quant/qwen3-w256-Q8_0.gguf", ".attn_v.weight")
		testTensorParallel(t, path, fixtureDir("qwen3"), 2, 3e-2)
		g := cpu.NewGroup(2, cpu.Options{Threads: 1})
		m, err := Load(path, g[1], Options{Rank: 1, Ranks: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		a := m.layers[0].mixer.(*attention)
		if a.qkv != nil || a.q.DType() != backend.Q8_0 || a.v.DType() != backend.F32 || a.v.Shape()[0] != m.Config().KVHeads*a.spec.HeadDim {
			t.Errorf("rank 1's q|k|v: fused %v, q %v, v %v %v", a.qkv != nil, a.q.DType(), a.v.DType(), a.v.Shape())
		}
	})
	// Four attention heads do not split in three ranks; half of o_proj's
	// 256 columns are half a Q4_K block; a backend outside a group cannot
	// take a share.
	for _, c := range []struct {
		path  string
		ranks int
		want  string
	}{{fixtureDir("qwen3"), 3, "do not split in 3 ranks"}, {"../testdata/quant/qwen3moe-w256-Q4_K_M.gguf", 2, "not whole blocks of 256"}} {
		g := cpu.NewGroup(c.ranks, cpu.Options{Threads: 1})
		if _, err := Load(c.path, g[0], Options{Ranks: c.ranks}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s in %d ranks: %v, want an error saying %q", c.path, c.ranks, err, c.want)
		}
	}
	if _, err := Load(fixtureDir("qwen3"), cpu.New(cpu.Options{}), Options{Rank: 1, Ranks: 2}); err == nil || !strings.Contains(err.Error(), "rank 1 of 2 needs a backend") {
		t.Errorf("a share on a backend outside a group: %v", err)
	}
}

// testTensorParallel checks the model at path (a fixture's directory or a
// GGUF file of it) split in ranks against the whole, on the prompts of
// the reference in refDir: each rank's logits within tol of the whole
// model's (relative to the largest).
func testTensorParallel(t *testing.T, path, refDir string, ranks int, tol float64) {
	dir := path
	ref := readReference(t, refDir)
	whole, err := Load(dir, cpu.New(cpu.Options{Threads: 1}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer whole.Close()
	group := cpu.NewGroup(ranks, cpu.Options{Threads: 1})
	shares := make([]*Model, ranks)
	for r, b := range group {
		if shares[r], err = Load(dir, b, Options{Rank: r, Ranks: ranks}); err != nil {
			t.Fatal(err)
		}
		defer shares[r].Close()
		c, w := shares[r].Config(), whole.Config()
		if first, n := c.heldExperts(); c.Heads != w.Heads/ranks || c.KVHeads != max(w.KVHeads/ranks, 1) || c.Intermediate != w.Intermediate/ranks ||
			n != w.MoE.Experts/ranks || first != r*n {
			t.Fatalf("rank %d: %d heads, %d KV heads, MLP %d, experts %d from %d", r, c.Heads, c.KVHeads, c.Intermediate, n, first)
		}
	}
	spec := CacheSpec{Blocks: 128, BlockSize: testBlockSize, Slots: len(ref.Prompts)}
	for _, m := range append([]*Model{whole}, shares...) {
		if err := m.AllocCache(spec); err != nil {
			t.Fatal(err)
		}
	}
	// step runs one step on every rank at once and returns each rank's
	// logits.
	step := func(seq Seq) [][][]float32 {
		out := make([][][]float32, ranks)
		errs := make([]error, ranks)
		var wg sync.WaitGroup
		for r, m := range shares {
			wg.Go(func() {
				logits, err := m.Forward([]Seq{seq})
				if errs[r] = err; err == nil {
					out[r] = readRows(t, group[r], logits)
				}
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		return out
	}
	check := func(what string, want [][]float32, got [][][]float32) {
		for r := range got {
			for i := range want {
				if e := reference.MaxError(got[r][i], want[i]); e > tol {
					t.Errorf("%s, rank %d, row %d: max |split - whole| / max(1, max|whole|) = %.3g", what, r, i, e)
				}
			}
		}
	}
	for pi, p := range ref.Prompts {
		blocks := blocksFor(pi*24, len(p.IDs)+8, testBlockSize)
		seq := Seq{Tokens: p.IDs, Blocks: blocks, Slot: pi, Logits: AllLogits}
		logits, err := whole.Forward([]Seq{seq})
		if err != nil {
			t.Fatal(err)
		}
		want := readRows(t, whole.Backend(), logits)
		check(fmt.Sprintf("prompt %d", pi), want, step(seq))
		tok, pos := argmax(want[len(want)-1]), len(p.IDs)
		for i := range 8 {
			seq := Seq{Tokens: []int32{tok}, Pos: pos, Blocks: blocks, Slot: pi, Logits: LastLogits}
			logits, err := whole.Forward([]Seq{seq})
			if err != nil {
				t.Fatal(err)
			}
			want := readRows(t, whole.Backend(), logits)
			check(fmt.Sprintf("prompt %d decode step %d", pi, i), want, step(seq))
			tok, pos = argmax(want[0]), pos+1
		}
	}

}

// mixedGGUF writes a copy of the GGUF file at path whose tensors named
// with suffix are dequantized to f32, and returns its path.
func mixedGGUF(t *testing.T, path, suffix string) string {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ts []gguf.WriteTensor
	for _, x := range f.Tensors {
		w := gguf.WriteTensor{Name: x.Name, Type: x.Type, Shape: x.Shape, Data: x.Data}
		if strings.HasSuffix(x.Name, suffix) {
			dt, ok := dtypeOf(x.Type.String())
			if !ok {
				t.Fatalf("%s: %v", x.Name, x.Type)
			}
			w.Type, w.Data = gguf.F32, f32Bytes(floatsOf(dt, x.Data, x.Shape))
		}
		ts = append(ts, w)
	}
	out := filepath.Join(t.TempDir(), "mixed.gguf")
	var buf bytes.Buffer
	if err := gguf.Write(&buf, f.KV, ts); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}
