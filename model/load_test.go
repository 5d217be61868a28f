package model

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/backend/cpu"
	"github.com/kiln-llm/kiln/safetensors"
)

type stTensor struct {
	dtype string
	shape []int
	data  []byte
}

// writeSafetensors writes tensors as one safetensors file.
func writeSafetensors(t *testing.T, path string, tensors map[string]stTensor) {
	t.Helper()
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	header := map[string]any{}
	var data bytes.Buffer
	for _, n := range names {
		tn := tensors[n]
		header[n] = map[string]any{"dtype": tn.dtype, "shape": tn.shape, "data_offsets": []int{data.Len(), data.Len() + len(tn.data)}}
		data.Write(tn.data)
	}
	h, _ := json.Marshal(header)
	var out bytes.Buffer
	binary.Write(&out, binary.LittleEndian, uint64(len(h)))
	out.Write(h)
	out.Write(data.Bytes())
	if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// copyFixture copies a fixture's non-weight files to a temporary directory
// and returns it with the fixture's tensors.
func copyFixture(t *testing.T, name string) (string, map[string]stTensor) {
	t.Helper()
	src, dst := fixtureDir(name), t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".safetensors") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	set, err := safetensors.OpenDir(src)
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	tensors := map[string]stTensor{}
	for _, n := range set.Names() {
		tn, _ := set.Tensor(n)
		tensors[n] = stTensor{tn.DType, tn.Shape, bytes.Clone(tn.Data)}
	}
	return dst, tensors
}

// lastLogits loads dir and returns the last-position logits of a prompt.
func lastLogits(t *testing.T, m *Model, ids []int32) []float32 {
	t.Helper()
	if err := m.AllocCache(CacheSpec{Blocks: 32, BlockSize: testBlockSize, Slots: 1}); err != nil {
		t.Fatal(err)
	}
	l, err := m.Forward([]Seq{{Tokens: ids, Blocks: blocksFor(0, len(ids), testBlockSize), Logits: LastLogits}})
	if err != nil {
		t.Fatal(err)
	}
	return readRows(t, m.Backend(), l)[0]
}

func loadLast(t *testing.T, dir string, ids []int32) []float32 {
	t.Helper()
	m, err := Load(dir, cpu.New(cpu.Options{}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	return lastLogits(t, m, ids)
}

// transpose2 swaps the last two dimensions of a stack of bf16 matrices.
func transpose2(data []byte, shape []int) []byte {
	n := len(shape)
	r, c := shape[n-2], shape[n-1]
	out := make([]byte, len(data))
	for m := 0; m < len(data)/(2*r*c); m++ {
		for i := range r {
			for j := range c {
				copy(out[2*(m*r*c+j*r+i):], data[2*(m*r*c+i*c+j):2*(m*r*c+i*c+j)+2])
			}
		}
	}
	return out
}

// TestExpertLayouts rewrites a MoE fixture's per-expert tensors as fused
// experts (transformers 5's [E, 2I, H] / [E, H, I], and down_proj with its
// last two dimensions swapped), sharded over two files with an index, and
// checks that the model computes the same logits.
func TestExpertLayouts(t *testing.T) {
	for _, name := range []string{"qwen3moe", "qwen35moe"} {
		ids := readReference(t, fixtureDir(name)).Prompts[1].IDs
		want := loadLast(t, fixtureDir(name), ids)
		for _, transposed := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/transposed=%v", name, transposed), func(t *testing.T) {
				dir, tensors := copyFixture(t, name)
				fusedGateUp := map[string][][]byte{}
				fusedDown := map[string][][]byte{}
				var E, I, H int
				for n, tn := range tensors {
					i := strings.Index(n, "mlp.experts.")
					if i < 0 {
						continue
					}
					prefix := n[:i+len("mlp.experts.")]
					var e int
					var proj string
					fmt.Sscanf(n[len(prefix):], "%d.%s", &e, &proj)
					E = max(E, e+1)
					delete(tensors, n)
					switch proj {
					case "gate_proj.weight", "up_proj.weight":
						I, H = tn.shape[0], tn.shape[1]
						if fusedGateUp[prefix] == nil {
							fusedGateUp[prefix] = make([][]byte, 64)
						}
						k := 2 * e
						if proj == "up_proj.weight" {
							k++
						}
						fusedGateUp[prefix][k] = tn.data
					case "down_proj.weight":
						if fusedDown[prefix] == nil {
							fusedDown[prefix] = make([][]byte, 64)
						}
						fusedDown[prefix][e] = tn.data
					}
				}
				for prefix, parts := range fusedGateUp {
					gu, down := bytes.Join(parts, nil), bytes.Join(fusedDown[prefix], nil)
					guShape, downShape := []int{E, 2 * I, H}, []int{E, H, I}
					if transposed {
						// Only down_proj: the fixtures have 2I == H, where a
						// swapped gate_up_proj is indistinguishable by shape
						// and transformers' orientation is assumed.
						down, downShape = transpose2(down, downShape), []int{E, I, H}
					}
					tensors[prefix+"gate_up_proj"] = stTensor{"BF16", guShape, gu}
					tensors[prefix+"down_proj"] = stTensor{"BF16", downShape, down}
				}
				// Two shards and an index.
				shards := []map[string]stTensor{{}, {}}
				weightMap := map[string]string{}
				for n, tn := range tensors {
					k := len(n) % 2
					shards[k][n] = tn
					weightMap[n] = fmt.Sprintf("model-%05d-of-00002.safetensors", k+1)
				}
				for k, s := range shards {
					writeSafetensors(t, filepath.Join(dir, fmt.Sprintf("model-%05d-of-00002.safetensors", k+1)), s)
				}
				idx, _ := json.Marshal(map[string]any{"weight_map": weightMap})
				os.WriteFile(filepath.Join(dir, safetensors.IndexFile), idx, 0o644)

				got := loadLast(t, dir, ids)
				if d := maxDiff(got, want); d != 0 {
					t.Fatalf("fused experts: logits differ by %g", d)
				}
			})
		}
	}
}

func TestLoadErrors(t *testing.T) {
	type edit func(dir string, tensors map[string]stTensor)
	cases := []struct {
		name string
		edit edit
		want string
	}{
		{"missing", func(_ string, ts map[string]stTensor) { delete(ts, "model.norm.weight") },
			`tensor "model.norm.weight" not found in`},
		{"misshaped", func(_ string, ts map[string]stTensor) {
			tn := ts["model.layers.1.self_attn.o_proj.weight"]
			ts["model.layers.1.self_attn.o_proj.weight"] = stTensor{tn.dtype, []int{32, 128}, tn.data}
		}, `tensor "model.layers.1.self_attn.o_proj.weight" in ` + "%s" + `/model.safetensors has shape [32 128], want [64 64]`},
		{"dtype", func(_ string, ts map[string]stTensor) {
			tn := ts["model.norm.weight"]
			ts["model.norm.weight"] = stTensor{"I16", tn.shape, tn.data}
		}, "has dtype I16; kiln loads BF16, F16, F32, F8_E4M3"},
		{"architecture", func(dir string, _ map[string]stTensor) {
			os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"architectures":["GPT2LMHeadModel"]}`), 0o644)
		}, `unsupported architecture "GPT2LMHeadModel"; kiln supports Qwen3ForCausalLM`},
		{"truncated", func(dir string, _ map[string]stTensor) {
			p := filepath.Join(dir, "model.safetensors")
			data, _ := os.ReadFile(p)
			os.WriteFile(p, data[:len(data)-100], 0o644)
		}, "outside the"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, tensors := copyFixture(t, "qwen3")
			writeSafetensors(t, filepath.Join(dir, "model.safetensors"), tensors)
			c.edit(dir, tensors)
			if c.name != "architecture" && c.name != "truncated" {
				writeSafetensors(t, filepath.Join(dir, "model.safetensors"), tensors)
			}
			want := c.want
			if strings.Contains(want, "%s") {
				want = fmt.Sprintf(want, dir)
			}
			_, err := Load(dir, cpu.New(cpu.Options{}), Options{})
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("error %v, want %q", err, want)
			}
		})
	}
}

// TestLoadBadPath: a model path that is missing or a file says so.
func TestLoadBadPath(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "Qwen3-8B")
	if _, err := Load(missing, cpu.New(cpu.Options{}), Options{}); err == nil || err.Error() != "model Qwen3-8B: no such directory" {
		t.Errorf("missing directory: %v", err)
	}
	if _, err := ReadConfig(os.DirFS(missing), missing); err == nil || err.Error() != "model "+missing+": no such directory" {
		t.Errorf("missing directory: %v", err)
	}
	file := filepath.Join("..", "testdata", "fixtures", "qwen3", "config.json")
	if _, err := Load(file, cpu.New(cpu.Options{}), Options{}); err == nil || !strings.Contains(err.Error(), "is a file, not a directory") {
		t.Errorf("a file: %v", err)
	}
	if _, err := Load(t.TempDir(), cpu.New(cpu.Options{}), Options{}); err == nil || !strings.Contains(err.Error(), "has no config.json") {
		t.Errorf("no config.json: %v", err)
	}
}

// TestLoadFS loads a fixture through fs.FS (the embedded-model path) and
// reports progress.
func TestLoadFS(t *testing.T) {
	ids := readReference(t, fixtureDir("qwen3next")).Prompts[0].IDs
	want := loadLast(t, fixtureDir("qwen3next"), ids)
	var last, total int64
	calls := 0
	m, err := LoadFS(os.DirFS(fixtureDir("qwen3next")), cpu.New(cpu.Options{}), Options{Progress: func(done, all int64) {
		if done < last || all <= 0 {
			t.Errorf("progress %d of %d after %d", done, all, last)
		}
		last, total = done, all
		calls++
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if calls == 0 || last != total {
		t.Fatalf("progress ended at %d of %d after %d calls", last, total, calls)
	}
	if d := maxDiff(lastLogits(t, m, ids), want); d != 0 {
		t.Fatalf("LoadFS logits differ from Load by %g", d)
	}
}

func TestSynthetic(t *testing.T) {
	for _, name := range SyntheticNames() {
		raw := syntheticConfigs[name]
		if _, err := ParseConfig([]byte(raw), nil); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	c, _ := ParseConfig([]byte(syntheticConfigs["qwen3-next-80b-a3b"]), nil)
	if c.MoE.Experts != 512 || c.MoE.TopK != 10 || c.RotaryDim != 64 || c.Kinds[3] != FullAttention || c.Kinds[4] != LinearAttention {
		t.Fatalf("qwen3-next-80b-a3b config %+v", c)
	}
	for _, name := range []string{"tiny-qwen3", "tiny-qwen3moe", "tiny-qwen3next", "tiny-qwen35", "tiny-qwen35moe"} {
		t.Run(name, func(t *testing.T) {
			run := func(seed uint64) []float32 {
				m, err := Synthetic(name, cpu.New(cpu.Options{}), SyntheticOptions{Seed: seed, DType: backend.BF16})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				return lastLogits(t, m, []int32{1, 2, 3, 4, 5})
			}
			a, b, c := run(1), run(1), run(2)
			for _, v := range a {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatal("non-finite logit")
				}
			}
			if maxDiff(a, b) != 0 || maxDiff(a, c) == 0 {
				t.Fatalf("seeded weights: same seed differs by %g, other seed by %g", maxDiff(a, b), maxDiff(a, c))
			}
		})
	}
	// A hybrid model cut before its first attention layer is refused by
	// what it lacks, not as a corrupt config; cut at it, it loads.
	for name, first := range map[string]int{"qwen3-next-80b-a3b": 4, "tiny-qwen35": 3} {
		if _, err := syntheticConfig(name, first-1); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("give at least %d layers", first)) {
			t.Errorf("%s cut to %d layers: %v", name, first-1, err)
		}
		if c, err := syntheticConfig(name, first); err != nil || c.Kinds[first-1] != FullAttention {
			t.Errorf("%s cut to %d layers: %v", name, first, err)
		}
	}
	// More layers than the model has are refused, as many are its own.
	for name, n := range map[string]int{"qwen3-0.6b": 28, "tiny-qwen35moe": 3} {
		if _, err := syntheticConfig(name, n+1); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("has %d layers", n)) {
			t.Errorf("%s with %d layers: %v", name, n+1, err)
		}
		if c, err := syntheticConfig(name, n); err != nil || c.Layers != n {
			t.Errorf("%s with its %d layers: %v", name, n, err)
		}
	}
	m, err := Synthetic("qwen3-0.6b", cpu.New(cpu.Options{}), SyntheticOptions{Layers: 2, DType: backend.BF16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if c := m.Config(); c.Layers != 2 || c.VocabSize != 151936 || !c.TieEmbeddings || m.KVBytesPerToken() != 2*2*8*128*4 {
		t.Fatalf("qwen3-0.6b with 2 layers: %+v, %d KV bytes per token", c, m.KVBytesPerToken())
	}
	if _, err := Synthetic("llama", cpu.New(cpu.Options{}), SyntheticOptions{}); err == nil || !strings.Contains(err.Error(), "qwen3-8b") {
		t.Fatalf("unknown synthetic model: %v", err)
	}
}
