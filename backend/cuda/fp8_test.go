//go:build cgo

package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/quant"
)

// TestFP8TileScales checks, without a GPU, the tile scales the block-scaled
// GEMM reads: one per 128x128 tile (partial edge tiles too), rows of tiles
// padded to four, and none for a weight whose tiles' rows disagree.
func TestFP8TileScales(t *testing.T) {
	const rows, cols = 300, 416 // 3 x 4 tiles, both edges partial
	nb := (cols + 127) / 128
	scale := func(r, j int) float32 { return float32(r/128*10 + j + 1) }
	data := make([]byte, rows*nb*132)
	for r := range rows {
		for j := range nb {
			binary.LittleEndian.PutUint32(data[(r*nb+j)*132:], math.Float32bits(scale(r, j)))
		}
	}
	ts := fp8TileScales(data, rows, cols)
	if ld := fp8TileStride(cols); ld != 4 || len(ts) != 3*ld {
		t.Fatalf("stride %d, %d scales; want 4, 12", ld, len(ts))
	}
	for i, tr := range []int{0, 128, 256} {
		for j := range nb {
			if got := ts[i*4+j]; got != scale(tr, j) {
				t.Errorf("tile (%d, %d): %v, want %v", i, j, got, scale(tr, j))
			}
		}
	}
	if fp8TileStride(5*128) != 8 {
		t.Errorf("stride of 5 blocks: %d, want 8", fp8TileStride(5*128))
	}
	binary.LittleEndian.PutUint32(data[(200*nb+2)*132:], math.Float32bits(7))
	if fp8TileScales(data, rows, cols) != nil {
		t.Error("a tile whose rows differ in scale was accepted")
	}
}

// fp8Reference is out[n, o] = x[n] . w_o with x quantized as quant_fp8_act
// does (per row and 128 columns: s = amax / 448, e4m3 of x / s) and w the
// exact values of the FP8 rows, in float64.
func fp8Reference(x []float32, w []float32, n, o, in int) []float32 {
	xq := make([]float64, len(x))
	for t := range n {
		for c0 := 0; c0 < in; c0 += 128 {
			blk := x[t*in+c0 : t*in+min(c0+128, in)]
			var a float32
			for _, v := range blk {
				a = max(a, float32(math.Abs(float64(v))))
			}
			s := float32(1)
			if a > 0 {
				s = a / 448
			}
			for i, v := range blk {
				xq[t*in+c0+i] = float64(quant.E4M3(quant.E4M3Bits(v/s))) * float64(s)
			}
		}
	}
	out := make([]float32, n*o)
	for t := range n {
		for r := range o {
			var acc float64
			for k := range in {
				acc += xq[t*in+k] * float64(w[r*in+k])
			}
			out[t*o+r] = float32(acc)
		}
	}
	return out
}

// TestFP8GEMM: products with FP8 weights from four tokens run as cuBLASLt
// block-scaled FP8 GEMMs and equal the product of the exact weights with
// the activations quantized as the kernel quantizes them; token counts that
// are not multiples of four, bf16 and f32 activations and outputs,
// accumulation, views by rows, the MLP, graph capture, and the tile of the
// products of a decode step.
func TestFP8GEMM(t *testing.T) {
	p := newPair(t, 31)
	if p.g.fp8Min == 0 {
		t.Skip("no block-scaled FP8 GEMM before Hopper")
	}
	// Up to 16 tokens on f8wg (sm_90a), then on cuBLASLt alone.
	for _, wg := range []int{p.g.f8wgMax, 0} {
		func(m int) {
			defer func() { p.g.f8wgMax = m }()
			p.g.f8wgMax = wg
			p.withFP8(-1, 0, p.g.fp8Min, func() { p.fp8GEMM(t) })
		}(p.g.f8wgMax)
		if wg == 0 {
			break
		}
	}
}

// fp8Product is the name of the launch that runs a block-scaled product
// of n tokens: f8wg's tile, or cuBLASLt.
func (p *pair) fp8Product(n int) string {
	if n <= p.g.f8wgMax {
		tok, _ := f8wgTile(n)
		return fmt.Sprintf("f8wg_%d", tok)
	}
	return "cublasLt"
}

func (p *pair) fp8GEMM(t *testing.T) {
	const o, in = 384, 512
	data := quant.Random(backend.FP8, 2*o, in, 0.05, p.r.Uint64)
	gw, err := p.g.Load(backend.FP8, []int{2 * o, in}, data)
	if err != nil {
		t.Fatal(err)
	}
	wf := quant.Dequantize(backend.FP8, data, 2*o, in)
	for _, view := range []bool{false, true} {
		w, wv := p.g.Rows(gw, 0, o), wf[:o*in]
		if view { // rows [256, 640): whole tiles of the stacked weight
			w, wv = p.g.Rows(gw, 256, o), wf[256*in:(256+o)*in]
		}
		for _, n := range []int{4, 5, 16, 20, 33, 130} {
			for _, xdt := range []backend.DType{backend.F32, backend.BF16} {
				for _, odt := range []backend.DType{backend.F32, backend.BF16} {
					acc := odt == backend.F32 && n%2 == 1
					x := roundTo(xdt, p.randn(n*in, 1))
					want := fp8Reference(x, wv, n, o, in)
					_, gx := p.activation(xdt, x, n, in)
					gout := p.poisoned(odt, n, o)
					if acc {
						init := p.randn(n*o, 1)
						p.g.Write(gout, encode(backend.F32, init))
						for i := range want {
							want[i] += init[i]
						}
					}
					seen := p.launches(func() { p.g.MatMul(gout, gx, w, acc) })
					what := fmt.Sprintf("f8wg to %d: view %v: %d x %d x %d, x %v, out %v, acc %v", p.g.f8wgMax, view, n, o, in, xdt, odt, acc)
					expect(t, what, seen, []string{"quant_fp8_act", p.fp8Product(n)}, []string{qmvName(false, backend.FP8, n), "qdeq_fp8"})
					tol := 1e-3
					if odt == backend.BF16 {
						tol = 5e-3
					}
					if d := relL2(read(t, p.g, gout), want); !(d <= tol) {
						t.Errorf("%s: relative L2 %.2e from the quantized reference (tolerance %.0e)", what, d, tol)
					}
					p.g.Free(gx)
					p.g.Free(gout)
				}
			}
		}
	}
	// A decode step's products (up to fp8TileTokens tokens) run on 128 x 64
	// tiles (blaslt.go).
	for k, pl := range p.g.lt.plans {
		if k.wt == backend.FP8 && k.n <= fp8TileTokens {
			if tile := p.g.lt.tileOf(pl); tile != tile128x64 {
				t.Errorf("the FP8 product of %d x %d x %d runs tile %d, want %d (128 x 64)", k.n, k.m, k.k, tile, tile128x64)
			}
		}
	}
	// Below four tokens the products stay on qmv with bf16 activations.
	_, gx := p.activation(backend.BF16, p.randn(3*in, 1), 3, in)
	seen := p.launches(func() { p.g.MatMul(p.poisoned(backend.F32, 3, o), gx, p.g.Rows(gw, 0, o), false) })
	expect(t, "3 tokens", seen, []string{qmvName(false, backend.FP8, 3)}, []string{"quant_fp8_act", "cublasLt", "f8wg_8"})

	// The MLP: gate/up as a GEMM to bf16, SwiGLU, down as a GEMM. Against
	// the CPU's unquantized activations: the quantization's own distance.
	const H, I = 512, 384
	cgu, ggu := p.qload(backend.FP8, 2*I, H)
	cd, gd := p.qload(backend.FP8, H, I)
	for _, n := range []int{4, 37} {
		cx, gx := p.activation(backend.BF16, p.randn(n*H, 1), n, H)
		co, gout := p.out(n, H)
		p.g.Write(gout, make([]byte, 4*n*H))
		p.c.MLP(co, cx, cgu, cd)
		seen := p.launches(func() { p.g.MLP(gout, gx, ggu, gd) })
		what := fmt.Sprintf("mlp %d x %d x %d", n, H, I)
		expect(t, what, seen, []string{"quant_fp8_act", p.fp8Product(n), "silu_mul_bf16"}, []string{qmvName(true, backend.FP8, n)})
		p.compare(what, co, gout, 6e-2)
	}

	// Captured in a graph, replays give the eager products.
	const n = 8
	x := roundTo(backend.BF16, p.randn(n*in, 1))
	_, gxg := p.activation(backend.BF16, x, n, in)
	p.begin(&backend.Batch{Tokens: make([]int32, n), Seqs: []backend.SeqInfo{{N: n}}})
	gq := p.g.Alloc(backend.F32, n, o)
	want := fp8Reference(x, wf[:o*in], n, o, in)
	for step := range 3 {
		p.g.Write(gq, encode(backend.F32, make([]float32, n*o)))
		p.g.Graph(fmt.Sprintf("fp8 gemm, f8wg to %d", p.g.f8wgMax), func() { p.g.MatMul(gq, gxg, p.g.Rows(gw, 0, o), false) })
		if d := relL2(read(t, p.g, gq), want); !(d <= 1e-3) {
			t.Errorf("graph step %d: relative L2 %.2e from the quantized reference", step, d)
		}
	}
}

// TestFP8Skinny: FP8 products of up to eight tokens on the FP8 skinny GEMM
// (e4m3 tensor cores, the activations quantized in the kernel as an e4m3
// pair) against the CPU's product of the exact weights and unquantized
// activations: within the bar of bf16 activations. Partial tiles, the inner
// dimension whole and split, bf16 and f32 activations and outputs,
// accumulation, the MLP's fused SwiGLU and graph capture.
func TestFP8Skinny(t *testing.T) {
	p := newPair(t, 32)
	if p.g.fp8SkinnyMax == 0 {
		t.Skip("no FP8 tensor cores (sm_89) or NVRTC before 12.4")
	}
	p.withFP8(-1, skinnyMaxTokens, 0, func() { p.fp8Skinny(t) })
}

func (p *pair) fp8Skinny(t *testing.T) {
	var cover skinnyCover
	for _, c := range []quantCase{
		{1, 384, 4096, false}, {2, 100, 512, true}, {3, 384, 1024, true}, {5, 8448, 512, false}, {8, 200, 2048, true}, {7, 64, 12288, false},
	} {
		cw, gw := p.qload(backend.FP8, c.o, c.in)
		for _, xdt := range []backend.DType{backend.F32, backend.BF16} {
			for _, odt := range []backend.DType{backend.F32, backend.BF16} {
				if odt == backend.BF16 && c.acc {
					continue
				}
				co, gout, seen := p.matMuls(cw, gw, c.n, c.o, c.in, xdt, odt, c.acc)
				what := fmt.Sprintf("%d x %d x %d, x %v, out %v, acc %v", c.n, c.o, c.in, xdt, odt, c.acc)
				expect(t, what, seen, []string{skinnyFP8Kernels[fp8SkinnyTok(c.n)/skinnyMaxTokens].name}, []string{qmvName(false, backend.FP8, c.n), "cublasLt", "qdeq_fp8"})
				cover.add("skinny", p.g.fp8SkinnySplits(c.n, c.o, c.in, false))
				p.compare(what, co, gout, 1e-2)
			}
		}
	}
	cover.check(t, "FP8 GEMM")

	p.fp8MLPs(t, func(n int) (want, not []string) {
		k := fp8SkinnyTok(n) / skinnyMaxTokens
		return []string{skinnySwigluFP8Kernels[k].name, skinnyFP8Kernels[k].name}, []string{qmvName(true, backend.FP8, n), "cublasLt"}
	})

	// Captured in a graph, replays give the eager products.
	p.fp8Graph("fp8 skinny", 4, 384, 4096)
}

// TestF8MV: FP8 products of one to eight tokens and FP8 expert rows on
// f8mv (the weight bytes straight into the FP8 mma, the activations
// quantized in the kernel as an e4m3 pair) against the CPU's product of the
// exact weights and unquantized activations: within the bar of bf16
// activations. Outputs that end inside the last group of rows, one to
// eight warps a block, blocks taking rounds of groups (qmvGrid 3), bf16
// and f32 activations and outputs, accumulation, the MLP's fused SwiGLU,
// expert rows with a shared expert and with another rank's experts, and
// graph capture.
func TestF8MV(t *testing.T) {
	p := newPair(t, 33)
	if p.g.f8mvMax < 0 {
		t.Skip("no FP8 tensor cores (sm_89) or NVRTC before 12.4")
	}
	p.withFP8(f8mvTokens, 0, 0, func() { p.f8mv(t) })
}

func (p *pair) f8mv(t *testing.T) {
	not := notF8MV()
	for _, c := range []quantCase{
		{1, 384, 4096, false}, {2, 100, 512, true}, {3, 300, 1024, true}, {1, 2000, 128, false}, {8, 200, 2048, true}, {2, 64, 12288, false},
		{5, 37, 2304, false},
	} {
		cw, gw := p.qload(backend.FP8, c.o, c.in)
		for _, grid := range []int{p.g.qmvGrid, 3} {
			for _, xdt := range []backend.DType{backend.F32, backend.BF16} {
				for _, odt := range []backend.DType{backend.F32, backend.BF16} {
					if odt == backend.BF16 && c.acc {
						continue
					}
					var co, gout backend.Tensor
					var seen map[string]int
					p.withQmvGrid(grid, func() { co, gout, seen = p.matMuls(cw, gw, c.n, c.o, c.in, xdt, odt, c.acc) })
					what := fmt.Sprintf("%d x %d x %d, x %v, out %v, acc %v, grid %d", c.n, c.o, c.in, xdt, odt, c.acc, grid)
					expect(t, what, seen, []string{f8mvKernel.name}, append(not, "to_half")) // f32 activations read as they are
					p.compare(what, co, gout, 1e-2)
				}
			}
		}
	}

	p.fp8MLPs(t, func(n int) (want, not []string) {
		return []string{f8mvSwigluKernel.name, f8mvKernel.name}, append(notF8MV(), qmvName(true, backend.FP8, n), "silu_mul_bf16")
	})

	// Expert rows, with a shared expert as wide as the experts among them
	// and without one; all the experts, then a rank's second half. A
	// decode step's tokens (up to gemvMax) take the router and the ranking
	// in one launch, which makes the shared expert's gate; with every
	// expert this rank's and the gate made (or no shared expert), the down
	// product adds the rows to the residual (no moe_combine), also in
	// blocks that take rounds of groups (qmvGrid 3) and in a graph's
	// replays, which reuse its arrival counts.
	const E, K, H, I = 64, 4, 1024, 512
	for _, T := range []int{1, 2, 3} {
		for _, first := range []int{0, E / 2} {
			for _, shared := range []bool{true, false} {
				var ce, ge backend.Experts
				ce.Router, ge.Router = p.load(backend.BF16, p.randn(E*H, 0.3), E, H)
				ce.GateUp, ge.GateUp = p.qload(backend.FP8, E-first, 2*I, H)
				ce.Down, ge.Down = p.qload(backend.FP8, E-first, H, I)
				if shared {
					ce.SharedGateUp, ge.SharedGateUp = p.qload(backend.FP8, 2*I, H)
					ce.SharedDown, ge.SharedDown = p.qload(backend.FP8, H, I)
					ce.SharedGate, ge.SharedGate = p.load(backend.BF16, p.randn(H, 0.3), 1, H)
				}
				spec := &backend.MoESpec{Experts: E, TopK: K, NormTopK: true, First: first}
				decode := T <= p.g.gemvMax
				summed := first == 0 && (decode || !shared)
				for _, grid := range []int{p.g.qmvGrid, 3} {
					var r moeRun
					p.withQmvGrid(grid, func() { r = p.moe(&ce, &ge, T, H, spec, func(f func()) { f() }) })
					what := fmt.Sprintf("moe %d tokens, experts %d-%d of %d top %d, shared expert %v, grid %d", T, first, E-1, E, K, shared, grid)
					expect(t, what, r.seen, []string{f8mvSwigluKernel.name, f8mvKernel.name}, append(not, qmvName(true, backend.FP8, 0)))
					if r.seen[f8mvSwigluKernel.name] != 1 || r.seen[f8mvKernel.name] != 1 {
						t.Errorf("%s: the routed and shared rows are not one launch each (ran %v)", what, r.seen)
					}
					if got := r.seen[moeRouterKernels[T-1].name] > 0; got != decode || r.seen[moeRouteKernel.name] > 0 == decode {
						t.Errorf("%s: router and ranking in one launch %v, want %v (ran %v)", what, got, decode, r.seen)
					}
					if got := r.seen[moeCombineKernel.name] == 0; got != summed {
						t.Errorf("%s: combined by the down product %v, want %v (ran %v)", what, got, summed, r.seen)
					}
					p.compare(what, r.co, r.gout, 1.5e-2)
					if grid != p.g.qmvGrid {
						continue
					}
					if summed {
						// KILN_CUDA_MOE_SUM=0: the same rows, combined by moe_combine.
						off := p.moe(&ce, &ge, T, H, spec, func(f func()) {
							p.g.moeSum = false
							defer func() { p.g.moeSum = true }()
							f()
						})
						if off.seen[moeCombineKernel.name] != 1 {
							t.Errorf("%s: with the down product's sum off, launched %v", what, off.seen)
						}
						p.compare(what+", combined apart", off.co, off.gout, 1.5e-2)
					}
					for step := range 3 {
						p.g.Write(r.gout, r.init)
						p.g.Graph(fmt.Sprintf("f8mv moe %d/%d/%v", T, first, shared), func() { p.g.MoE(r.gout, r.gx, &ge, spec) })
						p.compare(fmt.Sprintf("%s: graph step %d", what, step), r.co, r.gout, 1.5e-2)
					}
				}
			}
		}
	}

	// Captured in a graph, replays give the eager products.
	p.fp8Graph("f8mv", 2, 384, 4096)
}

// notF8MV returns the kernels of FP8 products that f8mv replaces.
func notF8MV() []string {
	return []string{qmvName(false, backend.FP8, 1), skinnyFP8Kernels[0].name, skinnyFP8Kernels[1].name, "cublasLt", "qdeq_fp8"}
}

// fp8MLPs runs FP8 MLPs of 1, 3 and 8 tokens against the CPU's, each
// launching the kernels kernels(n) wants and none of those it does not.
func (p *pair) fp8MLPs(t *testing.T, kernels func(n int) (want, not []string)) {
	const H, I = 1024, 512
	cgu, ggu := p.qload(backend.FP8, 2*I, H)
	cd, gd := p.qload(backend.FP8, H, I)
	for _, n := range []int{1, 3, 8} {
		co, gout, seen := p.mlps(cgu, ggu, cd, gd, n, H, backend.BF16)
		what := fmt.Sprintf("mlp %d x %d x %d", n, H, I)
		want, not := kernels(n)
		expect(t, what, seen, want, not)
		p.compare(what, co, gout, 1.5e-2)
	}
}

// fp8Graph captures an FP8 product of n tokens by [o, in] in a graph and
// checks that replays give the CPU's product.
func (p *pair) fp8Graph(name string, n, o, in int) {
	cw, gw := p.qload(backend.FP8, o, in)
	cx, gx := p.activation(backend.BF16, p.randn(n*in, 1), n, in)
	p.begin(&backend.Batch{Tokens: make([]int32, n), Seqs: []backend.SeqInfo{{N: n}}})
	co, gq := p.out(n, o)
	p.c.MatMul(co, cx, cw, false)
	for step := range 3 {
		p.g.Write(gq, encode(backend.F32, make([]float32, n*o)))
		p.g.Graph(name, func() { p.g.MatMul(gq, gx, gw, false) })
		p.compare(fmt.Sprintf("%s: graph step %d", name, step), co, gq, 1e-2)
	}
}

// withQmvGrid runs f with at most grid blocks a qmv or f8mv launch (0: a
// block a group for qmv), then restores the bound.
func (p *pair) withQmvGrid(grid int, f func()) {
	defer func(g int) { p.g.qmvGrid = g }(p.g.qmvGrid)
	p.g.qmvGrid = grid
	f()
}

// BenchmarkFP8Products times one-token FP8 products inside a CUDA graph
// (launched as a decode step launches them) on each kernel that takes
// them, at the Coder-Next and Qwen3-8B shapes. Copies of the weight, 256
// MB or more in all, take turns, so that each product reads its weight
// from memory and not from L2: `cuda.test -test.run '^$' -test.bench
// BenchmarkFP8Products -test.benchtime 50x`.
// TestFP8Routes: with the default thresholds one-token FP8 products take
// the kernel the whole models' steps measured the fastest on their shape
// (see f8mvCols).
func TestFP8Routes(t *testing.T) {
	b := &Backend{f8mvMax: f8mvMaxTokens, f8mvOuts: f8mvOuts, f8mvCols: f8mvCols, qmvMax: qmvMaxTokens, fp8SkinnyMax: 2}
	for _, c := range []struct {
		o, in int
		want  string
	}{{8192, 2048, "f8mv"}, {4096, 2048, "f8mv"}, {2048, 4096, "qmv"}, {1024, 2048, "qmv"}, {4096, 4096, "skinny"}, {4096, 12288, "skinny"}} {
		got := "skinny"
		switch {
		case b.f8mvFits(backend.FP8, 1, c.o, c.in):
			got = "f8mv"
		case b.fp8QmvFirst(backend.FP8, 1, c.o, c.in):
			got = "qmv"
		}
		if got != c.want {
			t.Errorf("%d x %d at one token: %s, want %s", c.o, c.in, got, c.want)
		}
		if b.f8mvFits(backend.FP8, 2, c.o, c.in) || b.fp8QmvFirst(backend.FP8, 2, c.o, c.in) {
			t.Errorf("%d x %d at two tokens: not the skinny GEMM's", c.o, c.in)
		}
	}
	if !b.f8mvFits(backend.FP8, 0, 64, 12288) {
		t.Error("expert rows of any shape are f8mv's")
	}
}

// BenchmarkFP8Products times one token's product by an FP8 weight of
// Qwen3-Coder-Next's and Qwen3-8B's shapes on each of the kernels that take
// it: f8mv, the FP8 skinny GEMM and qmv.
func BenchmarkFP8Products(b *testing.B) {
	g := benchGPU(b)
	if g.f8mvMax < 0 || g.fp8SkinnyMax == 0 {
		b.Skip("no FP8 tensor cores (sm_89) or NVRTC before 12.4")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	shapes := append([]struct {
		name  string
		o, in int
	}{{"coder-next-qkv", 8192, 2048}, {"coder-next-z", 4096, 2048}, {"coder-next-out", 2048, 4096}, {"coder-next-kv", 1024, 2048}},
		qwen3Products...)
	for _, s := range shapes {
		// Weights loaded inside the shape's case, once for its kernels: a
		// -test.bench pattern that leaves the shape out costs nothing.
		b.Run(s.name, func(b *testing.B) {
			data := quant.Random(backend.FP8, s.o, s.in, 0.05, rng.Uint64)
			ws := benchWeights(b, g, backend.FP8, s.o, s.in, data)
			x, out := benchActivation(g, rng, s.in), g.Alloc(backend.F32, 1, s.o)
			for _, k := range []struct {
				name          string
				f8mvMax, sMax int
			}{{"f8mv", 1, 0}, {"skinny", -1, 2}, {"qmv", -1, 0}} {
				b.Run(k.name, func(b *testing.B) {
					defer func(m, o, c, s int) {
						g.f8mvMax, g.f8mvOuts, g.f8mvCols, g.fp8SkinnyMax = m, o, c, s
					}(g.f8mvMax, g.f8mvOuts, g.f8mvCols, g.fp8SkinnyMax)
					g.f8mvMax, g.f8mvOuts, g.f8mvCols, g.fp8SkinnyMax = k.f8mvMax, 0, 1<<30, k.sMax
					benchProducts(b, g, "fp8 products/"+s.name+"/"+k.name, ws, x, out, len(data))
				})
			}
			for _, t := range append(ws, x, out) {
				g.Free(t)
			}
		})
	}
}

// TestGroupWG checks the grouped expert products on Hopper's wgmma
// (moe_wg.cu) against float64 sums on the same weights: FP8 experts on the
// FP8 tensor cores, with activations whose e4m3 quantization is exact (each
// block of 128 holds e4m3 values times a power of two, one of them 448
// times it), and bf16 experts, with activations that are bf16 values (what
// moe_gather keeps of them). What is left is the tensor cores'
// accumulation, which keeps fewer bits than float32 in FP8 (2.3e-4 on an
// H200). Tiles of 64 and 128 rows, outputs that end inside a tile (odd
// too), rows of token pairs (xdiv 2) and of another rank's experts (sel -1:
// not written).
func TestGroupWG(t *testing.T) {
	p := newPair(t, 41)
	if !p.g.moeWG {
		t.Skip("the grouped products on wgmma are Hopper's (sm_90a)")
	}
	const T, xdiv, E = 300, 2, 8
	const R = T * xdiv
	for _, dt := range []backend.DType{backend.FP8, backend.BF16} {
		if dt == backend.FP8 && p.g.fp8Min == 0 {
			continue
		}
		for _, c := range []struct{ O, in, bm int }{{328, 384, 64}, {328, 384, 128}, {129, 1024, 128}, {256, 128, 64}, {200, 320, 128}, {600, 320, 128}} {
			if dt == backend.FP8 && c.in%128 != 0 {
				continue // whole blocks only
			}
			x := make([]float32, T*c.in)
			tol, kernels := 1e-5, []string{"moe_gather", fmt.Sprintf("moe_group_wg%d", c.bm)}
			if dt == backend.FP8 {
				tol, kernels = 1e-3, []string{"quant_fp8_act", fmt.Sprintf("moe_group_f8_%d", c.bm)}
				for i := 0; i < len(x); i += 128 {
					scale := float32(math.Ldexp(1, p.r.IntN(9)-4))
					for j := range 128 {
						v := float32(math.NaN())
						for v != v {
							v = quant.E4M3(uint8(p.r.Uint32()))
						}
						x[i+j] = v * scale
					}
					x[i+p.r.IntN(128)] = 448 * scale * float32(1-2*p.r.IntN(2))
				}
			} else {
				for i := range x {
					x[i] = math.Float32frombits(math.Float32bits(float32(p.r.NormFloat64())) &^ 0xffff)
				}
			}
			sel := make([]int32, R)
			for r := range sel {
				sel[r] = int32(p.r.IntN(E+1)) - 1
			}
			var cw, gw backend.Tensor
			if dt == backend.FP8 {
				cw, gw = p.qload(dt, E, c.O, c.in)
			} else {
				cw, gw = p.load(dt, p.randn(E*c.O*c.in, 0.1), E, c.O, c.in)
			}
			w := read(t, p.c, cw)
			_, gx := p.load(backend.F32, x, T, c.in)
			gsel, buf := p.g.Alloc(backend.I32, R), make([]byte, 4*R)
			for r, e := range sel {
				binary.LittleEndian.PutUint32(buf[4*r:], uint32(e))
			}
			p.g.Write(gsel, buf)
			gy := p.poisoned(backend.F32, R, c.O)
			b := p.g
			seen := p.launches(func() {
				g := b.groupRows(asT(gsel).ptr, R, E, c.bm)
				b.groupProduct(asT(gy).ptr, asT(gx).ptr, xdiv, asT(gw), g, R, E, c.bm, c.O, c.in)
			})
			what := fmt.Sprintf("%v: %d rows of %d experts x %d x %d, tiles of %d", dt, R, E, c.O, c.in, c.bm)
			expect(t, what, seen, kernels, nil)
			y := read(t, p.g, gy)
			var want, got []float32
			for r, e := range sel {
				row := y[r*c.O : (r+1)*c.O]
				if e < 0 {
					for _, v := range row {
						if v == v {
							t.Fatalf("%s: row %d of another rank's expert was written", what, r)
						}
					}
					continue
				}
				for o := range c.O {
					var s float64
					for i := range c.in {
						s += float64(x[r/xdiv*c.in+i]) * float64(w[(int(e)*c.O+o)*c.in+i])
					}
					want, got = append(want, float32(s)), append(got, row[o])
				}
			}
			if d := relL2(got, want); !(d <= tol) {
				t.Errorf("%s: relative L2 %.3g from the float64 sums", what, d)
			} else {
				t.Logf("%s: relative L2 %.3g", what, d)
			}
		}
	}

	// Through MoE (gate/up with the SwiGLU in its tiles, reading the
	// tokens' rows through the order; down on the rows they wrote, writing
	// bf16 rows) against the CPU's float32 activations: rows in bf16, as
	// cuBLASLt's inputs.
	{
		const H, I = 512, 256
		var ce, ge backend.Experts
		ce.Router, ge.Router = p.load(backend.BF16, p.randn(E*H, 0.3), E, H)
		ce.GateUp, ge.GateUp = p.load(backend.BF16, p.randn(E*2*I*H, 0.1), E, 2*I, H)
		ce.Down, ge.Down = p.load(backend.BF16, p.randn(E*H*I, 0.1), E, H, I)
		for _, c := range []struct{ T, bm int }{{40, moeGroupRows}, {300, moeGroupRowsLarge}} {
			r := p.moe(&ce, &ge, c.T, H, &backend.MoESpec{Experts: E, TopK: 2, NormTopK: true}, func(f func()) { f() })
			what := fmt.Sprintf("bf16 moe of %d tokens, tiles of %d rows", c.T, c.bm)
			expect(t, what, r.seen, []string{fmt.Sprintf("moe_group_wg%d_swiglu", c.bm), fmt.Sprintf("moe_group_wg%d_bf16", c.bm)},
				[]string{"silu_mul", "moe_gather", fmt.Sprintf("moe_group_wg%d", c.bm)})
			p.compare(what, r.co, r.gout, 5e-3)
		}
	}

	if p.g.fp8Min == 0 {
		return
	}
	// The SwiGLU quantized in one pass (down's rows): the bytes and scales
	// of silu_mul's rows quantized.
	const n, in = 37, 384
	b := p.g
	_, gh := p.load(backend.F32, p.randn(n*2*in, 2), n, 2*in)
	act := p.g.Alloc(backend.F32, n, in)
	b.siluMul(asT(act), asT(gh))
	raw := func(ptr devptr, bytes int) []float32 {
		return read(t, p.g, &tensor{dt: backend.F32, shape: []int{bytes / 4}, ptr: ptr, view: true})
	}
	q1, s1 := b.quantAct("test.unfused", asT(act).ptr, backend.F32, n, n, in, false)
	q2, s2 := b.quantAct("test.fused", asT(gh).ptr, backend.F32, n, n, in, true)
	fused := raw(q2, n*in)
	for i, v := range raw(q1, n*in) {
		if w := fused[i]; math.Float32bits(v) != math.Float32bits(w) {
			t.Fatalf("SwiGLU quantized in one pass: bytes %d-%d differ from silu_mul's quantized", 4*i, 4*i+3)
		}
	}
	if a, c := raw(s1, 4*n*in/128), raw(s2, 4*n*in/128); !slices.Equal(a, c) {
		t.Fatalf("SwiGLU quantized in one pass: scales %v, silu_mul's quantized %v", c, a)
	}

	// Through MoE (gate/up, SwiGLU, down) against the CPU's float32
	// activations: the quantization's own distance, as the dense FP8 MLP's
	// (TestFP8GEMM).
	const H, I = 512, 256
	var ce, ge backend.Experts
	ce.Router, ge.Router = p.load(backend.BF16, p.randn(E*H, 0.3), E, H)
	ce.GateUp, ge.GateUp = p.qload(backend.FP8, E, 2*I, H)
	ce.Down, ge.Down = p.qload(backend.FP8, E, H, I)
	// The last takes moe_combine's block a token.
	for _, c := range []struct{ T, bm int }{{40, moeGroupRows}, {300, moeGroupRowsLarge}, {moeCombineTokenBlocks * p.g.sms, moeGroupRowsLarge}} {
		r := p.moe(&ce, &ge, c.T, H, &backend.MoESpec{Experts: E, TopK: 2, NormTopK: true}, func(f func()) { f() })
		what := fmt.Sprintf("moe of %d tokens, tiles of %d rows", c.T, c.bm)
		expect(t, what, r.seen, []string{fmt.Sprintf("moe_group_f8_%d", c.bm)}, []string{"moe_gather", "silu_mul"})
		p.compare(what, r.co, r.gout, 6e-2)
	}

	// Captured in a graph (a decode step of a batch whose rows reach the
	// grouped products, as Qwen3-30B-A3B's 128 experts do at batch 64),
	// replays give the eager MoE.
	spec := &backend.MoESpec{Experts: E, TopK: 2, NormTopK: true}
	r := p.moe(&ce, &ge, 64, H, spec, func(f func()) { f() })
	eager := read(t, p.g, r.gout)
	gout := p.poisoned(backend.F32, 64, H)
	for step := range 3 {
		p.g.Write(gout, r.init)
		p.g.Graph("moe f8", func() { p.g.MoE(gout, r.gx, &ge, spec) })
		if d := relL2(read(t, p.g, gout), eager); !(d <= 1e-6) {
			t.Errorf("graph step %d: relative L2 %.2e from the eager MoE", step, d)
		}
	}
	if seen := p.launches(func() { p.g.MoE(gout, r.gx, &ge, spec) }); seen["moe_group_f8_64"] == 0 {
		t.Errorf("64 tokens of 8 experts: the grouped FP8 products did not run (ran %v)", seen)
	}
}
