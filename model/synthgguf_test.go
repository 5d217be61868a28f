package model

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/backend/cpu"
	"github.com/kiln-llm/kiln/gguf"
	"github.com/kiln-llm/kiln/model/reference"
	"github.com/kiln-llm/kiln/tokenizer"
)

var synthPrompt = []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 300, 511}

// writeSynthGGUF writes a synthetic model's GGUF file into a test
// directory and returns its path and the warnings.
func writeSynthGGUF(t *testing.T, dir, name string, o SyntheticGGUFOptions) (string, []string) {
	t.Helper()
	var warnings []string
	o.Warn = func(s string) { warnings = append(warnings, s) }
	path := filepath.Join(dir, fmt.Sprintf("%s-%v-L%d.gguf", name, o.DType, o.Layers))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteSyntheticGGUF(f, name, o); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path, warnings
}

// syntheticLogits returns Synthetic's last-position logits of ids.
func syntheticLogits(t *testing.T, name string, o SyntheticOptions, ids []int32) []float32 {
	t.Helper()
	m, err := Synthetic(name, cpu.New(cpu.Options{}), o)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return lastLogits(t, m, ids)
}

// TestSyntheticGGUF writes the tiny shapes' GGUF files and loads them
// back: the model read from the file is the synthetic model, so its logits
// are Synthetic's, exactly in f32. A_log goes through the converter's -exp
// and kiln's log, which can move it by an ulp of float32, and in f16 and
// bf16 files some tensors are F32 (see below): those differ by rounding.
func TestSyntheticGGUF(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"tiny-qwen3", "tiny-qwen3moe", "tiny-qwen3next"} {
		for _, dt := range []backend.DType{backend.F32, backend.F16, backend.BF16} {
			t.Run(fmt.Sprintf("%s/%v", name, dt), func(t *testing.T) {
				path, _ := writeSynthGGUF(t, dir, name, SyntheticGGUFOptions{Seed: 7, DType: dt})
				got := loadLast(t, path, synthPrompt)
				want := syntheticLogits(t, name, SyntheticOptions{Seed: 7, DType: dt}, synthPrompt)
				e := relL2(got, want)
				t.Logf("relative L2 to Synthetic: %.2e (max |diff| %.2e)", e, maxDiff(got, want))
				// The converter keeps norms, routers and the DeltaNet's
				// small tensors in F32: in an f16 or bf16 file they hold
				// the same values in another type, which the backend
				// multiplies by another kernel, so rounding may differ.
				limit := 0.0
				if dt != backend.F32 || name == "tiny-qwen3next" {
					limit = 1e-6
				}
				if e > limit {
					t.Errorf("relative L2 %.2e to Synthetic, want <= %g", e, limit)
				}
			})
		}
	}
}

// TestSyntheticGGUFLayout checks the file against what llama.cpp's
// converter writes: names, shapes, types, the stored transforms, the
// metadata kiln's reader and llama.cpp's loader need, and a vocabulary
// both tokenizers accept.
func TestSyntheticGGUFLayout(t *testing.T) {
	dir := t.TempDir()
	path, warnings := writeSynthGGUF(t, dir, "tiny-qwen3next", SyntheticGGUFOptions{Seed: 1, DType: backend.F16})
	if len(warnings) != 1 || !strings.Contains(warnings[0], "layers [2] have a dense MLP") {
		t.Errorf("warnings %q", warnings)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]struct {
		typ   gguf.Type
		shape []int
	}{
		"token_embd.weight":                {gguf.F16, []int{512, 64}},
		"output.weight":                    {gguf.F16, []int{512, 64}},
		"output_norm.weight":               {gguf.F32, []int{64}},
		"blk.0.attn_norm.weight":           {gguf.F32, []int{64}},
		"blk.0.post_attention_norm.weight": {gguf.F32, []int{64}},
		"blk.0.attn_qkv.weight":            {gguf.F16, []int{128, 64}},
		"blk.0.attn_gate.weight":           {gguf.F16, []int{64, 64}},
		"blk.0.ssm_ba.weight":              {gguf.F16, []int{8, 64}},
		"blk.0.ssm_conv1d.weight":          {gguf.F32, []int{128, 4}},
		"blk.0.ssm_a":                      {gguf.F32, []int{4}},
		"blk.0.ssm_dt.bias":                {gguf.F32, []int{4}},
		"blk.0.ssm_norm.weight":            {gguf.F32, []int{16}},
		"blk.0.ssm_out.weight":             {gguf.F16, []int{64, 64}},
		"blk.0.ffn_gate_inp.weight":        {gguf.F32, []int{8, 64}},
		"blk.0.ffn_gate_exps.weight":       {gguf.F16, []int{8, 32, 64}},
		"blk.0.ffn_up_exps.weight":         {gguf.F16, []int{8, 32, 64}},
		"blk.0.ffn_down_exps.weight":       {gguf.F16, []int{8, 64, 32}},
		"blk.0.ffn_gate_shexp.weight":      {gguf.F16, []int{32, 64}},
		"blk.0.ffn_down_shexp.weight":      {gguf.F16, []int{64, 32}},
		"blk.0.ffn_gate_inp_shexp.weight":  {gguf.F32, []int{64}},
		"blk.1.attn_q.weight":              {gguf.F16, []int{256, 64}},
		"blk.1.attn_k.weight":              {gguf.F16, []int{64, 64}},
		"blk.1.attn_output.weight":         {gguf.F16, []int{64, 128}},
		"blk.1.attn_q_norm.weight":         {gguf.F32, []int{32}},
		"blk.2.ffn_gate.weight":            {gguf.F16, []int{128, 64}},
		"blk.2.ffn_down.weight":            {gguf.F16, []int{64, 128}},
	}
	for name, w := range want {
		tn, ok := f.Tensor(name)
		if !ok {
			t.Errorf("no tensor %s", name)
			continue
		}
		if tn.Type != w.typ || !sameShape(tn.Shape, w.shape) {
			t.Errorf("%s: %v %v, want %v %v", name, tn.Type, tn.Shape, w.typ, w.shape)
		}
	}
	if _, ok := f.Tensor("blk.2.ffn_gate_inp.weight"); ok {
		t.Error("the dense layer 2 has a router")
	}
	// Stored transforms: norms 1 + w (synthetic w is 0), A = -exp(A_log) < 0.
	for _, name := range []string{"output_norm.weight", "blk.1.attn_q_norm.weight", "blk.0.post_attention_norm.weight"} {
		tn, _ := f.Tensor(name)
		for _, v := range reference.DecodeF32(tn.Data) {
			if v != 1 {
				t.Fatalf("%s holds %v, want 1 + 0", name, v)
			}
		}
	}
	a, _ := f.Tensor("blk.0.ssm_a")
	for _, v := range reference.DecodeF32(a.Data) {
		if !(v <= -1 && v >= -16) {
			t.Fatalf("ssm_a holds %v, want -exp(log(U(1, 16)))", v)
		}
	}
	for key, v := range map[string]uint64{
		"qwen3next.block_count": 4, "qwen3next.embedding_length": 64, "qwen3next.attention.key_length": 32,
		"qwen3next.rope.dimension_count": 8, "qwen3next.ssm.inner_size": 64, "qwen3next.ssm.state_size": 16,
		"qwen3next.expert_shared_feed_forward_length": 32, "general.file_type": 1, "tokenizer.ggml.eos_token_id": 511,
	} {
		if got, ok := f.Uint(key); !ok || got != v {
			t.Errorf("%s = %d (%v), want %d", key, got, ok, v)
		}
	}

	// The minimal vocabulary: kiln's tokenizer reads it, encodes any text
	// and decodes it back.
	v := tokenizer.GGUFVocab{Model: "gpt2", Pre: "qwen2", SpecialIDs: map[string]int64{}}
	v.Tokens, _ = f.Strings("tokenizer.ggml.tokens")
	v.Merges, _ = f.Strings("tokenizer.ggml.merges")
	types, _ := f.Ints("tokenizer.ggml.token_type")
	for _, ty := range types {
		v.Types = append(v.Types, int32(ty))
	}
	tok, err := tokenizer.FromGGUF(v)
	if err != nil {
		t.Fatal(err)
	}
	text := "Hello the world,\n\tünïcode ✓ <|im_end|>"
	ids := tok.Encode(text)
	if got := tok.Decode(ids); got != text {
		t.Errorf("decode(encode(%q)) = %q (ids %v)", text, got, ids)
	}
	if ids[len(ids)-1] != 511 || !tok.IsSpecial(511) {
		t.Errorf("<|im_end|> encodes as %v", ids)
	}
	if ids := tok.Encode(" the"); len(ids) != 1 {
		t.Errorf("\" the\" is %v, want one merged token", ids)
	}
	if _, err := SyntheticVocab(200, -1); err == nil {
		t.Error("a vocabulary of 200 tokens: no error")
	}
}

// vocabOf returns the tokenizer.* metadata of a GGUF file.
func vocabOf(t *testing.T, path string) []gguf.KV {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var kvs []gguf.KV
	for _, kv := range f.KV {
		if strings.HasPrefix(kv.Key, "tokenizer.") {
			kvs = append(kvs, kv)
		}
	}
	return kvs
}

// TestSyntheticGGUFVocab writes a published shape with another file's
// vocabulary of 512 tokens: its embeddings and LM head are the first 512
// rows of the synthetic model's, so its logits are the first 512 of
// Synthetic's.
func TestSyntheticGGUFVocab(t *testing.T) {
	if testing.Short() {
		t.Skip("builds qwen3-0.6b's 151936 x 1024 embeddings")
	}
	vocab := vocabOf(t, quantDir("qwen3-w256-Q8_0.gguf"))
	path, _ := writeSynthGGUF(t, t.TempDir(), "qwen3-0.6b", SyntheticGGUFOptions{Layers: 1, Seed: 1, DType: backend.BF16, Vocab: vocab})
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	emb, _ := f.Tensor("token_embd.weight")
	tmpl, _ := f.String("tokenizer.chat_template")
	f.Close()
	if !sameShape(emb.Shape, []int{512, 1024}) || !strings.Contains(tmpl, "im_start") {
		t.Fatalf("token_embd %v, chat template %q", emb.Shape, tmpl)
	}
	got := loadLast(t, path, synthPrompt)
	want := syntheticLogits(t, "qwen3-0.6b", SyntheticOptions{Layers: 1, Seed: 1, DType: backend.BF16}, synthPrompt)
	if len(got) != 512 || maxDiff(got, want[:512]) != 0 {
		t.Fatalf("%d logits, %g from Synthetic's first 512", len(got), maxDiff(got, want[:512]))
	}
}

func TestSyntheticGGUFErrors(t *testing.T) {
	var b bytes.Buffer
	for _, c := range []struct {
		name string
		o    SyntheticGGUFOptions
		want string
	}{
		{"tiny-qwen35", SyntheticGGUFOptions{DType: backend.F16}, "Qwen3_5ForCausalLM"},
		{"tiny-qwen3", SyntheticGGUFOptions{DType: backend.Q4_K}, "f32, f16 or bf16"},
		{"llama", SyntheticGGUFOptions{DType: backend.F16}, "no synthetic model"},
		{"tiny-qwen3", SyntheticGGUFOptions{DType: backend.F16, Vocab: []gguf.KV{{Key: "general.name", Value: gguf.Val("x")}}}, "not a tokenizer.* key"},
		{"tiny-qwen3", SyntheticGGUFOptions{DType: backend.F16, Vocab: []gguf.KV{{Key: "tokenizer.ggml.model", Value: gguf.Val("gpt2")}}}, "no tokenizer.ggml.tokens"},
	} {
		if err := WriteSyntheticGGUF(&b, c.name, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %+v: %v, want %q", c.name, c.o, err, c.want)
		}
	}
	if b.Len() != 0 {
		t.Errorf("%d bytes written by failing calls", b.Len())
	}
}

// TestNegExpOf: the stored -exp(A_log) comes back as A_log through kiln's
// reader wherever float32 allows, and never further than the rounding of
// -exp itself.
func TestNegExpOf(t *testing.T) {
	rng := splitmix(1)
	exact := 0
	for range 10000 {
		a := float32(math.Log(1 + 15*rng.uniform()))
		s := negExpOf(a)
		back := float32(math.Log(-float64(s)))
		if back == a {
			exact++
		}
		if d := math.Abs(float64(back - a)); d > 1e-7 {
			t.Fatalf("A_log %v: stored %v reads back as %v", a, s, back)
		}
		if r := math.Abs(float64(s)+math.Exp(float64(a))) / math.Exp(float64(a)); r > 1e-6 {
			t.Fatalf("A_log %v: stored %v, -exp is %v", a, s, -math.Exp(float64(a)))
		}
	}
	t.Logf("%d of 10000 A_log values read back exactly", exact)
}

// llamaConfigs are the tiny MoE shapes as llama.cpp can run them: its
// qwen3moe and qwen3next loaders want experts in every layer, and its
// qwen3moe always renormalises the top-k weights.
var llamaConfigs = map[string]string{
	"tiny-qwen3moe-llama": `{"architectures":["Qwen3MoeForCausalLM"],"vocab_size":512,"hidden_size":64,"intermediate_size":128,
		"moe_intermediate_size":32,"num_experts":8,"num_experts_per_tok":2,"norm_topk_prob":true,
		"num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"max_position_embeddings":4096,
		"eos_token_id":511}`,
	"tiny-qwen3next-llama": `{"architectures":["Qwen3NextForCausalLM"],"vocab_size":512,"hidden_size":64,"intermediate_size":128,
		"moe_intermediate_size":32,"shared_expert_intermediate_size":32,"num_experts":8,"num_experts_per_tok":2,
		"layer_types":["linear_attention","full_attention","linear_attention","full_attention"],
		"num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":32,
		"linear_num_key_heads":2,"linear_num_value_heads":4,"linear_key_head_dim":16,"linear_value_head_dim":16,
		"max_position_embeddings":4096,"eos_token_id":511}`,
}

// lldump runs llama.cpp's lldump (LLAMA_BIN) on a file and returns the
// last position's logits of ids.
func lldump(t *testing.T, bin, path string, ids []int32) []float32 {
	t.Helper()
	var s []string
	for _, id := range ids {
		s = append(s, fmt.Sprint(id))
	}
	out := path + ".lldump.f32"
	if b, err := exec.Command(filepath.Join(bin, "lldump"), path, out, strings.Join(s, ",")).CombinedOutput(); err != nil {
		t.Fatalf("lldump %s: %v\n%s", path, err, tail(b))
	}
	v, err := reference.ReadF32(out)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func tail(b []byte) []byte {
	if len(b) > 3000 {
		return b[len(b)-3000:]
	}
	return b
}

// llamaQuantize runs llama.cpp's llama-quantize on a file and returns the
// output's path.
func llamaQuantize(t *testing.T, bin, src, ftype string) string {
	t.Helper()
	dst := strings.TrimSuffix(src, ".gguf") + "-" + ftype + ".gguf"
	if b, err := exec.Command(filepath.Join(bin, "llama-quantize"), src, dst, ftype).CombinedOutput(); err != nil {
		t.Fatalf("llama-quantize %s %s: %v\n%s", filepath.Base(src), ftype, err, tail(b))
	}
	return dst
}

// TestSyntheticGGUFLlamaCpp has llama.cpp (the binaries in $LLAMA_BIN:
// lldump, llama-quantize) read kiln synth's files and compares its logits
// (its CPU backend) with kiln's on the same file.
//
// Computing in float32 on the file's weights, llama.cpp is within relative
// L2 1e-3 of kiln: on f32 files as they are, on f16 and bf16 files once
// llama-quantize has widened them to F32 (which keeps every value). Run on
// the f16 and bf16 files directly, llama.cpp's CPU rounds the activations
// to the weights' type before each product, which costs it up to a few
// 1e-3. The MoE shapes make routing choices a rounding can flip (a near
// tie of the second and third expert moves the logits by a few 1e-3), so
// each case runs three seeds and holds the median to the bound, every seed
// to ten times it (a misread tensor is off by O(1)). The tiny MoE shapes
// are run as llama.cpp can run them (llamaConfigs). Finally a 1024-wide
// qwen3-0.6b layer goes through llama-quantize to Q4_K_M, which both read.
func TestSyntheticGGUFLlamaCpp(t *testing.T) {
	bin := os.Getenv("LLAMA_BIN")
	if bin == "" {
		t.Skip("LLAMA_BIN (a directory holding llama.cpp's lldump and llama-quantize) is not set")
	}
	for name, raw := range llamaConfigs {
		syntheticConfigs[name] = raw
		defer delete(syntheticConfigs, name)
	}
	dir := t.TempDir()
	median := func(x []float64) float64 {
		s := slices.Clone(x)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for _, name := range []string{"tiny-qwen3", "tiny-qwen3moe-llama", "tiny-qwen3next-llama"} {
		for _, dt := range []backend.DType{backend.F32, backend.F16, backend.BF16} {
			t.Run(fmt.Sprintf("%s/%v", name, dt), func(t *testing.T) {
				var exact, direct []float64
				for seed := uint64(1); seed <= 3; seed++ {
					path, warnings := writeSynthGGUF(t, dir, name, SyntheticGGUFOptions{Seed: seed, DType: dt})
					if len(warnings) > 0 {
						t.Errorf("warnings %q", warnings)
					}
					kiln := loadLast(t, path, synthPrompt)
					direct = append(direct, relL2(lldump(t, bin, path, synthPrompt), kiln))
					if dt == backend.F32 {
						exact = append(exact, direct[len(direct)-1])
					} else {
						wide := llamaQuantize(t, bin, path, "F32")
						exact = append(exact, relL2(lldump(t, bin, wide, synthPrompt), kiln))
					}
				}
				t.Logf("relative L2 of llama.cpp to kiln, seeds 1-3: in f32 %.2e, on the %v file %.2e", exact, dt, direct)
				for _, c := range []struct {
					what  string
					x     []float64
					bound float64
				}{{"in f32", exact, 1e-3}, {"on the file as stored", direct, 5e-3}} {
					if m := median(c.x); m > c.bound || slices.Max(c.x) > 10*c.bound {
						t.Errorf("llama.cpp %s: relative L2 %.2e to kiln, want a median <= %g and all <= %g", c.what, c.x, c.bound, 10*c.bound)
					}
				}
			})
		}
	}
	t.Run("llama-quantize", func(t *testing.T) {
		// A 64-wide file: llama-quantize takes it (its rows are too short
		// for the K-quants, so it falls back to other types) and llama.cpp
		// runs the result.
		tiny, _ := writeSynthGGUF(t, dir, "tiny-qwen3", SyntheticGGUFOptions{Seed: 5, DType: backend.F16})
		q := llamaQuantize(t, bin, tiny, "Q4_K_M")
		e := relL2(lldump(t, bin, q, synthPrompt), loadLast(t, tiny, synthPrompt))
		t.Logf("llama.cpp on %s: relative L2 %.2e to kiln on the f16 file", filepath.Base(q), e)
		if e > 0.2 {
			t.Errorf("llama.cpp on %s is %.2e from kiln on the f16 file", filepath.Base(q), e)
		}
		if testing.Short() {
			return
		}
		// One qwen3-0.6b layer, 1024 wide, with a vocabulary of 512:
		// Q4_K_M holds Q4_K and Q6_K, which kiln reads too. As in
		// TestGGUFQuantized, kiln must be no further than 1.25 times
		// llama.cpp from the file dequantized exactly.
		vocab := vocabOf(t, quantDir("qwen3-w256-Q8_0.gguf"))
		wide, _ := writeSynthGGUF(t, dir, "qwen3-0.6b", SyntheticGGUFOptions{Layers: 1, Seed: 5, DType: backend.F16, Vocab: vocab})
		kiln := loadLast(t, wide, synthPrompt)
		t.Logf("qwen3-0.6b, 1 layer, f16: llama.cpp %.2e from kiln; widened to f32, %.2e",
			relL2(lldump(t, bin, wide, synthPrompt), kiln), relL2(lldump(t, bin, llamaQuantize(t, bin, wide, "F32"), synthPrompt), kiln))
		q = llamaQuantize(t, bin, wide, "Q4_K_M")
		m, err := Load(q, cpu.New(cpu.Options{}), Options{})
		if err != nil {
			t.Fatal(err)
		}
		got := lastLogits(t, m, synthPrompt)
		hasQ4K := hasWeight(m, backend.Q4_K)
		m.Close()
		m, err = Load(q, cpu.New(cpu.Options{}), Options{Dequantize: true})
		if err != nil {
			t.Fatal(err)
		}
		exact := lastLogits(t, m, synthPrompt)
		m.Close()
		ll := lldump(t, bin, q, synthPrompt)
		dk, dl := relL2(got, exact), relL2(ll, exact)
		t.Logf("Q4_K_M: relative L2 to the exactly dequantized file: kiln %.2e, llama.cpp %.2e; the file to the f16 one: %.2e", dk, dl, relL2(exact, kiln))
		if !hasQ4K || dk > 1.25*dl || dl > 0.15 {
			t.Errorf("Q4_K_M (Q4_K weights: %v): kiln %.2e, llama.cpp %.2e from the dequantized file", hasQ4K, dk, dl)
		}
	})
}

// TestSyntheticGGUFNames: the names kiln synth lists are the ones
// WriteSyntheticGGUF writes (the tiny shapes written, the rest refused).
func TestSyntheticGGUFNames(t *testing.T) {
	ok := SyntheticGGUFNames()
	for _, n := range SyntheticNames() {
		if !slices.Contains(ok, n) {
			if err := WriteSyntheticGGUF(io.Discard, n, SyntheticGGUFOptions{DType: backend.F16}); err == nil {
				t.Errorf("%s: written, but not in SyntheticGGUFNames", n)
			}
		} else if strings.HasPrefix(n, "tiny-") {
			if err := WriteSyntheticGGUF(io.Discard, n, SyntheticGGUFOptions{DType: backend.F16}); err != nil {
				t.Errorf("%s: %v", n, err)
			}
		}
	}
	for _, n := range []string{"tiny-qwen3", "tiny-qwen3moe", "tiny-qwen3next", "qwen3-8b"} {
		if !slices.Contains(ok, n) {
			t.Errorf("SyntheticGGUFNames %v lacks %s", ok, n)
		}
	}
}
