//go:build cgo

package cuda

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/internal/testmodel"
	"github.com/kiln-llm/kiln/model"
	"github.com/kiln-llm/kiln/model/reference"
)

func readF32File(t *testing.T, path string) []float32 {
	t.Helper()
	out, err := reference.ReadF32(path)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func readLogits(t *testing.T, b backend.Backend, x backend.Tensor) [][]float32 {
	t.Helper()
	all := read(t, b, x)
	V := x.Shape()[1]
	var rows [][]float32
	for i := 0; i < x.Shape()[0]; i++ {
		rows = append(rows, all[i*V:(i+1)*V])
	}
	return rows
}

func argmaxMargin(x []float32) (int32, float32) {
	best, second := 0, -1
	for i, v := range x {
		if v > x[best] {
			best, second = i, best
		} else if i != best && (second < 0 || v > x[second]) {
			second = i
		}
	}
	return int32(best), x[best] - x[second]
}

// TestFixturesEndToEnd runs the dense, MoE and hybrid (Gated DeltaNet)
// fixtures on the GPU and on the CPU backend: last-position logits within
// bf16 tolerance (relative L2 1e-2) of transformers' fp32 reference, the
// CPU's argmax at every prompt position and the CPU's greedy continuation
// wherever the CPU's top-2 margin exceeds 0.05 (decode steps go through the
// captured graphs), except at a token whose routing was a near tie in some
// MoE layer (routeGaps). The GPU runs the models through its fused
// operations, and (steps) as the model files write them, step by step.
func TestFixturesEndToEnd(t *testing.T) {
	p := newPair(t, 6)
	dir := filepath.Join("..", "..", "testdata", "fixtures")
	for _, test := range []string{"qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen3/steps", "qwen3moe/steps", "qwen3next/steps", "qwen35moe/steps"} {
		t.Run(test, func(t *testing.T) {
			name, steps := strings.CutSuffix(test, "/steps")
			var gpu backend.Backend = p.g
			if steps {
				gpu = backend.Unfused(p.g)
			}
			fdir := filepath.Join(dir, name)
			ref, err := reference.Read(fdir)
			if err != nil {
				t.Skip(err)
			}
			const extra = 24 // greedy steps after each prompt
			var tables [][]int32
			nblocks := 0
			for _, pr := range ref.Prompts {
				n := (len(pr.IDs) + extra + 15) / 16
				var tb []int32
				for i := 0; i < n; i++ {
					tb = append(tb, int32(nblocks+i))
				}
				tables = append(tables, tb)
				nblocks += n
			}
			cache := model.CacheSpec{Blocks: nblocks, BlockSize: 16, Slots: 4}
			gm, err := model.Load(fdir, gpu, model.Options{KVDType: backend.BF16})
			if err == nil {
				err = gm.AllocCache(cache)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer gm.Close()
			rg := &routeGaps{Backend: p.c, t: t}
			cm, err := model.Load(fdir, rg, model.Options{KVDType: backend.BF16})
			if err != nil {
				t.Fatal(err)
			}
			defer cm.Close()
			if err := cm.AllocCache(cache); err != nil {
				t.Fatal(err)
			}
			for pi, pr := range ref.Prompts {
				blocks := tables[pi]
				seq := model.Seq{Tokens: pr.IDs, Blocks: blocks, Logits: model.AllLogits}
				gl, err := gm.Forward([]model.Seq{seq})
				if err != nil {
					t.Fatal(err)
				}
				grows := readLogits(t, p.g, gl)
				if e := relL2(grows[len(grows)-1], pr.Logits); !(e <= 1e-2) {
					t.Errorf("prompt %d: last logits relative L2 %.3g vs transformers fp32", pi, e)
				} else {
					t.Logf("prompt %d: last logits relative L2 %.3g vs transformers fp32", pi, e)
				}
				cl, err := cm.Forward([]model.Seq{seq})
				if err != nil {
					t.Fatal(err)
				}
				crows := readLogits(t, p.c, cl)
				// Every position: the CPU's argmax wherever its top-2 margin
				// exceeds 0.05 and its routing was no near tie (logits are
				// not compared position by position for the same reason).
				ties := 0
				for i := range crows {
					ct, margin := argmaxMargin(crows[i])
					if rg.nearTie(i) {
						ties++
						continue
					}
					if gt, _ := argmaxMargin(grows[i]); gt != ct && margin > 0.05 {
						t.Errorf("prompt %d position %d: GPU argmax %d, CPU %d (margin %.3g; logits relative L2 %.3g here, %.3g at the position before)",
							pi, i, gt, ct, margin, relL2(grows[i], crows[i]), relL2(grows[max(i-1, 0)], crows[max(i-1, 0)]))
					}
				}
				if ties > 0 {
					t.Logf("prompt %d: %d of %d positions not compared (routing near a tie)", pi, ties, len(crows))
				}
				gtok, _ := argmaxMargin(grows[len(grows)-1])
				ctok, margin := argmaxMargin(crows[len(crows)-1])
				tie := rg.nearTie(len(crows) - 1)
				pos := len(pr.IDs)
				for step := 0; step < extra; step++ {
					if gtok != ctok {
						// Allowed only where the CPU's choice is a near tie.
						if margin > 0.05 && !tie {
							t.Errorf("prompt %d step %d: GPU token %d, CPU token %d (margin %.3g)", pi, step, gtok, ctok, margin)
						}
						break
					}
					s := model.Seq{Tokens: []int32{gtok}, Pos: pos, Blocks: blocks, Logits: model.LastLogits}
					gl, err := gm.Forward([]model.Seq{s})
					if err != nil {
						t.Fatal(err)
					}
					cl, err := cm.Forward([]model.Seq{s})
					if err != nil {
						t.Fatal(err)
					}
					grows, crows = readLogits(t, p.g, gl), readLogits(t, p.c, cl)
					gtok, _ = argmaxMargin(grows[0])
					ctok, margin = argmaxMargin(crows[0])
					tie = rg.nearTie(0)
					pos++
				}
			}
		})
	}
}

// TestFed: decode steps on the GPU whose tokens feed_tokens takes from the
// last sampling (each step's graph issued before the last one's tokens are
// read, or beside a token from the host) give the tokens that steps given
// them by the host give, bit for bit: three sequences in a bucket of four,
// their rows fed in reverse order.
func TestFed(t *testing.T) {
	p := newPair(t, 8)
	for _, name := range []string{"qwen3", "qwen3next"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("..", "..", "testdata", "fixtures", name)
			ref, err := reference.Read(dir)
			if err != nil {
				t.Fatal(err)
			}
			var prompts [][]int32
			for _, pr := range ref.Prompts {
				prompts = append(prompts, pr.IDs)
			}
			decode := func(mode testmodel.FedMode) [][]int32 {
				m, err := model.Load(dir, p.g, model.Options{KVDType: backend.BF16})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				return testmodel.FedDecode(t, m, prompts, 24, mode)
			}
			want := decode(testmodel.FromHost)
			for _, mode := range []testmodel.FedMode{testmodel.FedAhead, testmodel.FedMixed} {
				got := decode(mode)
				for i := range want {
					if !slices.Equal(got[i], want[i]) {
						t.Errorf("%s: sequence %d: %v, from the host %v", mode, i, got[i], want[i])
					}
				}
			}
		})
	}
}

// routeGaps is the CPU backend recording, for each token of the latest
// forward step, the smallest gap over the MoE layers between the router's
// probability for the last expert chosen and for the best one left out.
// Where that gap is a rounding's size, the GPU's bf16 activations may
// choose the other expert, and the token's logits then move by a whole
// expert's output: the fixtures' failing tokens on the unfused path had
// gaps of 2.5e-4 and 7.7e-4, and one token in ten has one under 2e-3.
type routeGaps struct {
	backend.Backend
	t   *testing.T
	gap []float32 // by token of the step Begin started
}

// nearTieGap is the gap under which a token's routing counts as a tie.
const nearTieGap = 2e-3

func (r *routeGaps) nearTie(i int) bool { return i < len(r.gap) && r.gap[i] < nearTieGap }

func (r *routeGaps) Begin(b *backend.Batch) {
	r.gap = nil
	r.Backend.Begin(b)
}

func (r *routeGaps) Route(experts, weights, x, router backend.Tensor, spec *backend.MoESpec) {
	r.Backend.Route(experts, weights, x, router, spec)
	T, E, K := x.Shape()[0], spec.Experts, spec.TopK
	logits := r.Alloc(backend.F32, T, E)
	defer r.Free(logits)
	r.MatMul(logits, x, router, false)
	all := read(r.t, r.Backend, logits)
	if r.gap == nil {
		r.gap = make([]float32, T)
		for i := range r.gap {
			r.gap[i] = float32(math.Inf(1))
		}
	}
	for i := range T {
		p := all[i*E : (i+1)*E]
		hi := slices.Max(p)
		var sum float64
		for j := range p {
			sum += math.Exp(float64(p[j] - hi))
		}
		sorted := slices.Sorted(slices.Values(p))
		kth, next := sorted[E-K], sorted[E-K-1]
		gap := (math.Exp(float64(kth-hi)) - math.Exp(float64(next-hi))) / sum
		r.gap[i] = min(r.gap[i], float32(gap))
	}
}

// TestHFReference compares the last-position logits of a model directory
// made by scripts/hf_reference.py (KILN_HF_REF names it) with transformers
// on the same GPU, each of its prompts as one prefill and as a prefill of
// all but the last token and a decode step, with a bf16 and an f32 KV
// cache; KILN_HF_REF_CPU=1 adds the CPU backend (float32 arithmetic on the
// same weights), which tells the GPU's own rounding from the weights'. With
// KILN_HF_DUMP set it writes kiln's logits of the first prompt (GPU, bf16
// cache) there (kiln_prefill.f32, kiln_decode.f32) for
// scripts/rounding_study.py.
func TestHFReference(t *testing.T) {
	dir := os.Getenv("KILN_HF_REF")
	if dir == "" {
		t.Skip("KILN_HF_REF is not set")
	}
	p := newPair(t, 7)
	var ref struct {
		Prompts [][]int32 `json:"prompts"`
		Arch    string    `json:"arch"`
	}
	data, err := os.ReadFile(filepath.Join(dir, "hf_reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	if len(ref.Prompts) == 0 {
		t.Fatalf("%s/hf_reference.json holds no prompts", dir)
	}
	w16 := readF32File(t, filepath.Join(dir, "ref_logits.f32"))
	w32 := readF32File(t, filepath.Join(dir, "ref_logits_fp32.f32"))
	V := len(w32) / len(ref.Prompts)
	if len(w16) != len(w32) || V*len(ref.Prompts) != len(w32) {
		t.Fatalf("%d and %d reference logits for %d prompts", len(w16), len(w32), len(ref.Prompts))
	}
	type run struct {
		name string
		b    backend.Backend
		kv   backend.DType
	}
	runs := []run{{"cuda, bf16 KV", p.g, backend.BF16}, {"cuda, f32 KV", p.g, backend.F32}}
	if os.Getenv("KILN_HF_REF_CPU") == "1" {
		runs = append(runs, run{"cpu, bf16 KV", p.c, backend.BF16})
	}
	for ri, r := range runs {
		m, err := model.Load(dir, r.b, model.Options{KVDType: r.kv})
		if err != nil {
			t.Fatal(err)
		}
		longest := 0
		for _, pr := range ref.Prompts {
			longest = max(longest, len(pr))
		}
		nb := (longest + 15) / 16
		if err := m.AllocCache(model.CacheSpec{Blocks: nb, BlockSize: 16, Slots: 1}); err != nil {
			m.Close()
			t.Fatal(err)
		}
		blocks := make([]int32, nb)
		for i := range blocks {
			blocks[i] = int32(i)
		}
		for pi, prompt := range ref.Prompts {
			want16, want32 := w16[pi*V:(pi+1)*V], w32[pi*V:(pi+1)*V]
			n := len(prompt)
			l, err := m.Forward([]model.Seq{{Tokens: prompt, Blocks: blocks, Logits: model.LastLogits}})
			if err != nil {
				t.Fatal(err)
			}
			got := read(t, r.b, l)
			if _, err := m.Forward([]model.Seq{{Tokens: prompt[:n-1], Blocks: blocks, Logits: model.NoLogits}}); err != nil {
				t.Fatal(err)
			}
			l, err = m.Forward([]model.Seq{{Tokens: prompt[n-1:], Pos: n - 1, Blocks: blocks, Logits: model.LastLogits}})
			if err != nil {
				t.Fatal(err)
			}
			got2 := read(t, r.b, l)
			if out := os.Getenv("KILN_HF_DUMP"); out != "" && ri == 0 && pi == 0 {
				for name, x := range map[string][]float32{"prefill": got, "decode": got2} {
					if err := os.WriteFile(filepath.Join(out, "kiln_"+name+".f32"), encode(backend.F32, x), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			ga, _ := argmaxMargin(got)
			wa, wm := argmaxMargin(want16)
			// Through 36 random layers bf16 rounding alone moves
			// transformers' own logits by several percent: transformers bf16
			// against itself, through eager instead of sdpa attention or a
			// cached decode step for the last token, differs by 0.055 and
			// 0.041 (scripts/rounding_study.py). So the test holds kiln to
			// the float32 model: kiln must be at least as close to it as
			// transformers bf16 is.
			hf, k1, k2 := relL2(want16, want32), relL2(got, want32), relL2(got2, want32)
			t.Logf("%s %s, %d-token prompt: vs transformers fp32 relative L2 %.4g (prefill), %.4g (decode); transformers bf16 vs fp32 %.4g; vs transformers bf16 %.4g, %.4g; argmax %d vs %d (margin %.3g)",
				ref.Arch, r.name, n, k1, k2, hf, relL2(got, want16), relL2(got2, want16), ga, wa, wm)
			if !(k1 <= hf) || !(k2 <= hf) {
				t.Errorf("%s, %d-token prompt: kiln is further from the float32 model than transformers bf16 (%.4g, %.4g > %.4g)", r.name, n, k1, k2, hf)
			}
		}
		m.Close()
	}
}
