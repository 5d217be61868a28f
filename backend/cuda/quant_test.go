//go:build cgo

package cuda

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/model"
	"github.com/kiln-llm/kiln/model/reference"
	"github.com/kiln-llm/kiln/quant"
)

// The quantized types, each checked against the CPU backend computing with
// the float32 weights quant.Dequantize makes of the same blocks.
var quantTypes = []backend.DType{backend.Q8_0, backend.Q4_K, backend.Q5_K, backend.Q6_K, backend.MXFP4, backend.FP8}

// qload puts random blocks of dt on the GPU (shape [rows, cols] or [E,
// rows, cols]) and their exact float32 values on the CPU.
func (p *pair) qload(dt backend.DType, shape ...int) (backend.Tensor, backend.Tensor) {
	p.t.Helper()
	cols := shape[len(shape)-1]
	rows := shapeSize(shape) / cols
	data := quant.Random(dt, rows, cols, 0.05, p.r.Uint64)
	ct, err := p.c.Load(backend.F32, shape, encode(backend.F32, quant.Dequantize(dt, data, rows, cols)))
	if err != nil {
		p.t.Fatal(err)
	}
	gt, err := p.g.Load(dt, shape, data)
	if err != nil {
		p.t.Fatal(err)
	}
	return ct, gt
}

// launches runs f and returns how many times each kernel (and cuBLASLt)
// was launched on the GPU.
func (p *pair) launches(f func()) map[string]int {
	seen := map[string]int{}
	p.g.trace = func(name string) { seen[name]++ }
	defer func() { p.g.trace = nil }()
	f()
	return seen
}

// moeRun is a fused MoE block run on both backends by pair.moe.
type moeRun struct {
	cx, gx   backend.Tensor // the inputs
	init     []byte         // the residual both outputs started from
	co, gout backend.Tensor // the outputs
	seen     map[string]int // the GPU's launches
}

// moe runs the fused MoE block of experts ce (CPU) and ge (GPU) on T random
// rows of width H, each adding to the same random residual; the GPU's call
// goes through wrap (a setting to hold while it runs).
func (p *pair) moe(ce, ge *backend.Experts, T, H int, spec *backend.MoESpec, wrap func(func())) moeRun {
	var r moeRun
	p.begin(&backend.Batch{Tokens: make([]int32, T), Seqs: []backend.SeqInfo{{N: T}}})
	r.cx, r.gx = p.load(backend.F32, p.randn(T*H, 1), T, H)
	r.init = encode(backend.F32, p.randn(T*H, 1))
	r.co, r.gout = p.out(T, H)
	p.c.Write(r.co, r.init)
	p.g.Write(r.gout, r.init)
	p.c.MoE(r.co, r.cx, ce, spec)
	wrap(func() { r.seen = p.launches(func() { p.g.MoE(r.gout, r.gx, ge, spec) }) })
	return r
}

// matMuls multiplies random activations x [n, in] of type xdt by the pair of
// weights on both backends into outputs of type odt (a poisoned bf16 one on
// the GPU, or f32; when acc, adding to the same random values), and returns
// both outputs and the GPU's kernel launches.
func (p *pair) matMuls(cw, gw backend.Tensor, n, o, in int, xdt, odt backend.DType, acc bool) (co, gout backend.Tensor, seen map[string]int) {
	cx, gx := p.activation(xdt, p.randn(n*in, 1), n, in)
	co, gout = p.out(n, o)
	if odt == backend.BF16 {
		gout = p.poisoned(backend.BF16, n, o)
	}
	if acc {
		init := encode(backend.F32, p.randn(n*o, 1))
		p.c.Write(co, init)
		p.g.Write(gout, init)
	}
	p.c.MatMul(co, cx, cw, acc)
	seen = p.launches(func() { p.g.MatMul(gout, gx, gw, acc) })
	return co, gout, seen
}

// mlps runs the MLP of the pair of gate|up and down weights on random
// activations x [n, h] of type xdt on both backends, adding to the same
// random values, and returns both outputs and the GPU's kernel launches.
func (p *pair) mlps(cgu, ggu, cd, gd backend.Tensor, n, h int, xdt backend.DType) (co, gout backend.Tensor, seen map[string]int) {
	cx, gx := p.activation(xdt, p.randn(n*h, 1), n, h)
	init := encode(backend.F32, p.randn(n*h, 0.1))
	co, gout = p.out(n, h)
	p.c.Write(co, init)
	p.g.Write(gout, init)
	p.c.MLP(co, cx, cgu, cd)
	seen = p.launches(func() { p.g.MLP(gout, gx, ggu, gd) })
	return co, gout, seen
}

// expect reports kernels that should have run and did not, or that ran
// and should not have.
func expect(t *testing.T, what string, seen map[string]int, want, not []string) {
	t.Helper()
	for _, k := range want {
		if seen[k] == 0 {
			t.Errorf("%s: kernel %s did not run (ran: %v)", what, k, seen)
		}
	}
	for _, k := range not {
		if seen[k] > 0 {
			t.Errorf("%s: kernel %s ran (ran: %v)", what, k, seen)
		}
	}
}

// withQ runs f with the quantized decode kernels taking up to qgemvMax
// (qgemv) and qmvMax (qmv) tokens and weights dequantized slab elements at
// a time, without the FP8 tensor core products (TestFP8GEMM's and
// TestFP8Skinny's), then restores them.
func (p *pair) withQ(qgemvMax, qmvMax, slab int, f func()) {
	defer func(g, m, s int) { p.g.qgemvMax, p.g.qmvMax, p.g.qSlab = g, m, s }(p.g.qgemvMax, p.g.qmvMax, p.g.qSlab)
	p.g.qgemvMax, p.g.qmvMax, p.g.qSlab = qgemvMax, qmvMax, slab
	p.withFP8(-1, 0, 0, f)
}

// decodeName is the kernel of dt that takes a product (with swiglu, an
// MLP's gate/up) of n tokens up to qmvMax: qgemv's or qmv's.
func (p *pair) decodeName(swiglu bool, dt backend.DType, n int) string {
	if n <= p.g.qgemvMax && qgemvType(dt) {
		if swiglu {
			return quantKernelsOf(dt).gvSwiglu[n-1].name
		}
		return quantKernelsOf(dt).gv[n-1].name
	}
	return qmvName(swiglu, dt, n)
}

// withFP8 runs f with FP8 products on f8mv up to f8mvMax tokens (and
// expert rows from 0; -1: none), on the FP8 skinny GEMM up to skinnyMax
// tokens and on the block-scaled GEMM from gemmMin (0: neither), as far as
// the device has them, then restores all three.
func (p *pair) withFP8(f8mvMax, skinnyMax, gemmMin int, f func()) {
	defer func(m, s, g, o, c int) {
		p.g.f8mvMax, p.g.fp8SkinnyMax, p.g.fp8Min, p.g.f8mvOuts, p.g.f8mvCols = m, s, g, o, c
	}(p.g.f8mvMax, p.g.fp8SkinnyMax, p.g.fp8Min, p.g.f8mvOuts, p.g.f8mvCols)
	p.g.f8mvOuts, p.g.f8mvCols = 0, 1<<30 // f8mv for every product shape it can take
	if p.g.f8mvMax < 0 {
		f8mvMax = -1
	}
	if p.g.fp8SkinnyMax == 0 {
		skinnyMax = 0
	}
	if p.g.fp8Min == 0 {
		gemmMin = 0
	}
	p.g.f8mvMax, p.g.fp8SkinnyMax, p.g.fp8Min = f8mvMax, skinnyMax, gemmMin
	f()
}

// TestQuantLayout checks the device layout without a GPU: packing and
// unpacking give back the blocks, rows are 16-byte multiples no larger than
// the interchange rows rounded up, and views by rows and reshapes address
// whole rows.
func TestQuantLayout(t *testing.T) {
	next := func() func() uint64 {
		x := uint64(1)
		return func() uint64 { x = x*6364136223846793005 + 1442695040888963407; return x }
	}()
	for _, dt := range quantTypes {
		for _, cols := range []int{256, 512, 4096, 416, 200} {
			if dt.CheckCols(cols) != nil {
				continue
			}
			rows := 7
			data := quant.Random(dt, rows, cols, 0.02, next)
			rb := qRowBytes(dt, cols)
			if rb%16 != 0 || rb > pad16(dt.RowBytes(cols)) {
				t.Errorf("%v cols %d: device row of %d bytes (interchange %d)", dt, cols, rb, dt.RowBytes(cols))
			}
			dev := qPack(dt, data, rows, cols)
			if len(dev) != rows*rb {
				t.Fatalf("%v cols %d: packed %d bytes, want %d", dt, cols, len(dev), rows*rb)
			}
			if back := qUnpack(dt, dev, rows, cols); !slices.Equal(back, data) {
				t.Errorf("%v cols %d: unpacking does not give back the blocks", dt, cols)
			}
		}
		b := &Backend{}
		w := &tensor{dt: dt, shape: []int{4, 6, 512}, ptr: 1 << 20}
		if got, want := w.bytes(), 24*qRowBytes(dt, 512); got != want {
			t.Errorf("%v%v: %d bytes, want %d", dt, w.shape, got, want)
		}
		e := asT(b.Rows(w, 2, 1))
		if e.ptr != w.ptr+devptr(2*6*qRowBytes(dt, 512)) || !slices.Equal(e.shape, []int{1, 6, 512}) {
			t.Errorf("%v: expert 2 of %v at %#x %v", dt, w.shape, e.ptr-w.ptr, e.shape)
		}
		m := asT(b.Reshape(w, 24, 512))
		if r := asT(b.Rows(m, 5, 3)); r.ptr != w.ptr+devptr(5*qRowBytes(dt, 512)) || r.bytes() != 3*qRowBytes(dt, 512) {
			t.Errorf("%v: rows [5, 8) at %#x, %d bytes", dt, r.ptr-w.ptr, r.bytes())
		}
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "rows") {
					t.Errorf("%v: reshape changing the row width: %v", dt, r)
				}
			}()
			b.Reshape(w, 4, 6*512)
		}()
	}
}

// TestQuantLoad uploads blocks and reads them back (through the device
// layout and back), whole and through views of experts.
func TestQuantLoad(t *testing.T) {
	p := newPair(t, 21)
	for _, dt := range quantTypes {
		for _, cols := range []int{512, 416} {
			if dt.CheckCols(cols) != nil {
				continue
			}
			const E, R = 3, 5
			data := quant.Random(dt, E*R, cols, 0.02, p.r.Uint64)
			w, err := p.g.Load(dt, []int{E, R, cols}, data)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(data))
			if err := p.g.Read(w, got); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, data) {
				t.Errorf("%v cols %d: read back differs", dt, cols)
			}
			e := p.g.Rows(w, 1, 2)
			got = make([]byte, 2*R*dt.RowBytes(cols))
			if err := p.g.Read(e, got); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, data[R*dt.RowBytes(cols):3*R*dt.RowBytes(cols)]) {
				t.Errorf("%v cols %d: experts 1-2 read back differ", dt, cols)
			}
			fresh := quant.Random(dt, E*R, cols, 0.02, p.r.Uint64)
			p.g.Write(w, fresh)
			got = make([]byte, len(data))
			if err := p.g.Read(w, got); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, fresh) {
				t.Errorf("%v cols %d: written blocks read back differ", dt, cols)
			}
			p.g.Free(w)
		}
	}
}

// quantCase is a product of n tokens by o outputs of width in.
type quantCase struct {
	n, o, in int
	acc      bool
}

// TestQuantMatMul: every quantized type at 1, 2, 3, 8 tokens (qmv, its
// blocks of 1 to 8 warps and outputs that do not fill the last tile) and
// 16, 64, 300 tokens (dequantized slabs and cuBLASLt), f32 and bf16
// activations, f32 outputs written or added to and bf16 outputs; small
// counts also through the dequantizing path (qmvMax 0), a view of a fused
// weight's rows, several slabs, and FP8 rows that end inside a block (416)
// or a qmv unit (200, which only the dequantizing path takes).
func TestQuantMatMul(t *testing.T) {
	p := newPair(t, 22)
	cases := []quantCase{
		{1, 300, 4096, false},
		{2, 260, 512, true},
		{2, 300, 2304, true}, // rounds: warps of several rows of 2-3 slots, adding to out
		{3, 300, 1024, false},
		{8, 77, 2304, true},
		{16, 300, 512, true},
		{64, 200, 1024, false},
		{300, 130, 512, false},
	}
	for _, dt := range quantTypes {
		cs := cases
		if qUnitCols(dt) == 32 {
			cs = append(slices.Clip(cs), quantCase{2, 100, 480, true}) // 15 units: the last group partial
		}
		if dt == backend.FP8 {
			cs = append(slices.Clip(cs), quantCase{1, 300, 416, true}, quantCase{5, 64, 416, false}, quantCase{3, 64, 200, false}, quantCase{16, 64, 200, true})
		}
		for _, c := range cs {
			for _, mode := range decodeModes {
				p.withDecode(mode, c.n, func() { p.quantMatMul(dt, c, mode) })
			}
		}
		// A view of the middle third of a fused weight, in several slabs.
		p.withQ(p.g.qgemvMax, p.g.qmvMax, 64*512, func() {
			const o, in = 256, 512
			cw, gw := p.qload(dt, 3*o, in)
			for _, n := range []int{2, 40, 70} {
				cx, gx := p.activation(backend.BF16, p.randn(n*in, 1), n, in)
				co, gout := p.out(n, o)
				seen := p.launches(func() { p.g.MatMul(gout, gx, p.g.Rows(gw, o, o), false) })
				p.c.MatMul(co, cx, p.c.Rows(cw, o, o), false)
				p.compare(fmt.Sprintf("%v: matmul %d x rows [%d, %d) x %d", dt, n, o, 2*o, in), co, gout, 1e-2)
				if n > qmvMaxTokens && seen["qdeq_"+dt.String()] != 4 {
					t.Errorf("%v: %d tokens: %d slabs dequantized, want 4", dt, n, seen["qdeq_"+dt.String()])
				}
			}
		})
	}
}

func (p *pair) quantMatMul(dt backend.DType, c quantCase, mode string) {
	t := p.t
	t.Helper()
	cw, gw := p.qload(dt, c.o, c.in)
	for _, xdt := range []backend.DType{backend.F32, backend.BF16} {
		for _, odt := range []backend.DType{backend.F32, backend.BF16} {
			if odt == backend.BF16 && (c.acc || xdt == backend.F32) {
				continue // bf16 out: the fused q/k/v projection's case
			}
			co, gout, seen := p.matMuls(cw, gw, c.n, c.o, c.in, xdt, odt, c.acc)
			what := fmt.Sprintf("%s: matmul %d x %d x %d %v, x %v, out %v, acc=%v", mode, c.n, c.o, c.in, dt, xdt, odt, c.acc)
			p.compare(what, co, gout, 1e-2)
			q, d := p.decodeName(false, dt, c.n), "qdeq_"+dt.String()
			if c.n <= p.g.qmvMax && qmvFits(dt, c.in) {
				expect(t, what, seen, []string{q}, []string{d, "cublasLt"})
			} else {
				expect(t, what, seen, []string{d, "cublasLt"}, []string{q})
			}
		}
	}
}

// TestQuantMLP: quantized gate/up and down (the same type; a Q4_K gate/up
// with Q6_K down as Q4_K_M files store them; a bf16 down) at 1 to 300
// tokens: qmv_swiglu then qmv up to 8 tokens, the dequantized products with
// bf16 activations above, and the dequantizing path at few tokens too.
func TestQuantMLP(t *testing.T) {
	p := newPair(t, 23)
	const H, I = 512, 512
	type pairing struct{ gu, down backend.DType }
	var pairings []pairing
	for _, dt := range quantTypes {
		pairings = append(pairings, pairing{dt, dt})
	}
	pairings = append(pairings, pairing{backend.Q4_K, backend.Q6_K}, pairing{backend.Q8_0, backend.BF16})
	for _, pr := range pairings {
		cgu, ggu := p.qload(pr.gu, 2*I, H)
		var cd, gd backend.Tensor
		if pr.down == backend.BF16 {
			cd, gd = p.load(backend.BF16, p.randn(H*I, 0.05), H, I)
		} else {
			cd, gd = p.qload(pr.down, H, I)
		}
		for _, n := range []int{1, 2, 3, 8, 16, 64, 300} {
			for _, mode := range decodeModes {
				p.withDecode(mode, n, func() {
					for _, xdt := range []backend.DType{backend.F32, backend.BF16} {
						co, gout, seen := p.mlps(cgu, ggu, cd, gd, n, H, xdt)
						what := fmt.Sprintf("%s: mlp %d x %d x %d %v / %v, x %v", mode, n, H, I, pr.gu, pr.down, xdt)
						p.compare(what, co, gout, 1.5e-2)
						sw, dq := p.decodeName(true, pr.gu, n), "qdeq_"+pr.gu.String()
						if n <= p.g.qmvMax {
							expect(t, what, seen, []string{sw}, []string{dq, "silu_mul_bf16"})
							if pr.down.Quantized() {
								expect(t, what, seen, []string{p.decodeName(false, pr.down, n)}, []string{"cublasLt"})
							}
						} else {
							expect(t, what, seen, []string{dq, "silu_mul_bf16", "cublasLt"}, []string{sw})
						}
					}
				})
			}
		}
	}
}

// TestNormedProducts: qgemv's products of one and two tokens taking the
// RMSNorm of their f32 input themselves (backend.NormedProducts), against
// RMSNorm then the product on the CPU: every integer type, norm weights in
// f32 and bf16, plain and (1 + w), rows of very different scales, one
// round of outputs a block and several; the MLP with Q4_K gate/up and Q6_K
// down, as Q4_K_M files hold them. No rmsnorm kernel runs; other products
// do not take the norm.
func TestNormedProducts(t *testing.T) {
	p := newPair(t, 31)
	const H, I = 1024, 512
	norm := func(dt backend.DType, unit bool) (*backend.Norm, *backend.Norm) {
		cw, gw := p.load(dt, p.randn(H, 0.3), H)
		return &backend.Norm{W: cw, Eps: 1e-6, UnitOffset: unit}, &backend.Norm{W: gw, Eps: 1e-6, UnitOffset: unit}
	}
	input := func(n int) (backend.Tensor, backend.Tensor) {
		v := p.randn(n*H, 1)
		for i := range v[:H] {
			v[i] *= 40 // the first row far from unit scale
		}
		return p.load(backend.F32, v, n, H)
	}
	for _, dt := range []backend.DType{backend.Q8_0, backend.Q4_K, backend.Q5_K, backend.Q6_K} {
		cw, gw := p.qload(dt, 300, H)
		for _, n := range []int{1, 2} {
			for _, ndt := range []backend.DType{backend.F32, backend.BF16} {
				for _, unit := range []bool{false, true} {
					for _, grid := range []int{0, 3} {
						cn, gn := norm(ndt, unit)
						cx, gx := input(n)
						if !p.g.NormsInput(gx, gw) {
							t.Fatalf("%v: %d tokens: the product does not take the norm", dt, n)
						}
						init := encode(backend.F32, p.randn(n*300, 1))
						co, gout := p.out(n, 300)
						p.c.Write(co, init)
						p.g.Write(gout, init)
						ch := p.c.Alloc(backend.F32, n, H)
						p.c.RMSNorm(ch, cx, cn.W, cn.Eps, unit)
						p.c.MatMul(co, ch, cw, true)
						full := p.g.qgemvGrid
						if grid > 0 {
							p.g.qgemvGrid = grid
						}
						seen := p.launches(func() { p.g.NormMatMul(gout, gx, gn, gw, true) })
						p.g.qgemvGrid = full
						what := fmt.Sprintf("normed matmul %d x 300 x %d %v, norm %v unit=%v, grid %d", n, H, dt, ndt, unit, grid)
						p.compare(what, co, gout, 1e-2)
						expect(t, what, seen, []string{p.decodeName(false, dt, n)}, []string{"rmsnorm", "rmsnorm_v4_1"})
					}
				}
			}
		}
	}
	cgu, ggu := p.qload(backend.Q4_K, 2*I, H)
	cd, gd := p.qload(backend.Q6_K, H, I)
	for _, n := range []int{1, 2} {
		cn, gn := norm(backend.BF16, true)
		cx, gx := input(n)
		init := encode(backend.F32, p.randn(n*H, 0.1))
		co, gout := p.out(n, H)
		p.c.Write(co, init)
		p.g.Write(gout, init)
		ch := p.c.Alloc(backend.F32, n, H)
		p.c.RMSNorm(ch, cx, cn.W, cn.Eps, true)
		p.c.MLP(co, ch, cgu, cd)
		seen := p.launches(func() { p.g.NormMLP(gout, gx, gn, ggu, gd) })
		what := fmt.Sprintf("normed mlp %d x %d x %d Q4_K / Q6_K", n, H, I)
		p.compare(what, co, gout, 1.5e-2)
		expect(t, what, seen, []string{p.decodeName(true, backend.Q4_K, n), p.decodeName(false, backend.Q6_K, n)}, []string{"rmsnorm", "rmsnorm_v4_1"})
	}
	_, bw := p.load(backend.BF16, p.randn(300*H, 0.05), 300, H)
	_, q8 := p.qload(backend.Q8_0, 300, H)
	_, x3 := input(3)
	_, xb := p.activation(backend.BF16, p.randn(H, 1), 1, H)
	for _, c := range []struct {
		what string
		x, w backend.Tensor
	}{{"bf16 weights", x3, bw}, {"three tokens", x3, q8}, {"bf16 rows", xb, q8}} {
		if p.g.NormsInput(c.x, c.w) {
			t.Errorf("%s: the product takes the norm", c.what)
		}
	}
}

// TestQuantMoE: quantized experts (and a quantized shared expert) with a
// bf16 router, per row (qmv_swiglu and qmv over each row's expert), by
// tiles of one expert's rows (qmvt_) and grouped (moe_group_mm64_ and
// moe_group_mm128_, the tiles dequantized as they load); and a rank's share of them (expert
// parallel: the second half of the experts, the other half's choices
// left to their rank). A shared expert as wide as the experts is rows of
// the per-row products; a wider one its own MLP.
func TestQuantMoE(t *testing.T) {
	p := newPair(t, 24)
	const H, I = 512, 256
	for _, dt := range quantTypes {
		for _, c := range []struct{ T, E, K int }{{2, 8, 2}, {16, 8, 2}, {3, 32, 4}, {300, 32, 4}, {12, 32, 4}, {3, 64, 4}, {300, 4, 2}} {
			T, E, K := c.T, c.E, c.K
			for _, first := range []int{0, E / 2} {
				held := E - first
				for _, Is := range []int{0, I, 512} { // the shared expert's width; 0: none
					shared := Is > 0
					var ce, ge backend.Experts
					ce.Router, ge.Router = p.load(backend.BF16, p.randn(E*H, 0.3), E, H)
					ce.GateUp, ge.GateUp = p.qload(dt, held, 2*I, H)
					ce.Down, ge.Down = p.qload(dt, held, H, I)
					if shared {
						ce.SharedGateUp, ge.SharedGateUp = p.qload(dt, 2*Is, H)
						ce.SharedDown, ge.SharedDown = p.qload(dt, H, Is)
						ce.SharedGate, ge.SharedGate = p.load(backend.BF16, p.randn(H, 0.3), 1, H)
					}
					spec := &backend.MoESpec{Experts: E, TopK: K, NormTopK: true, First: first}
					r := p.moe(&ce, &ge, T, H, spec, func(f func()) { p.withQ(p.g.qgemvMax, p.g.qmvMax, p.g.qSlab, f) })
					co, gout, seen := r.co, r.gout, r.seen
					what := fmt.Sprintf("moe %v %d tokens, experts %d-%d of %d top %d, shared expert of width %d", dt, T, first, E-1, E, K, Is)
					p.compare(what, co, gout, 1.5e-2)
					sw, mv := "qmv_swiglu_"+dt.String(), "qmv_"+dt.String()
					gm, other := "moe_group_mm64_"+dt.String(), "moe_group_mm128_"+dt.String()
					if T*K >= moeGroupLargeFrom*held {
						gm, other = other, gm
					}
					tsw, tmv := "qmvt_swiglu_"+dt.String(), "qmvt_"+dt.String()
					// A shared expert outside the per-row products runs as an
					// MLP, whose kernels (qmv_swiglu, qdeq) may be among these.
					not := func(names ...string) []string {
						if Is > 0 {
							return nil
						}
						return names
					}
					switch R := T * K; {
					case moeGrouped(R, held):
						expect(t, what, seen, []string{gm}, append(not(sw, mv, tsw, tmv, "qdeq_"+dt.String()), other))
					case moeRowPairs(R, held):
						expect(t, what, seen, []string{tsw, tmv}, not(sw, mv, gm))
					default:
						expect(t, what, seen, []string{sw, mv}, []string{tsw, tmv, gm})
						if Is == I {
							// One launch each for the routed and shared rows, no MLP of its own.
							expect(t, what, seen, nil, []string{"cublasLt", "qdeq_" + dt.String(), "qgemv1_swiglu_" + dt.String(), "skinny_swiglu_fp8_2"})
							if seen[sw] != 1 || seen[mv] != 1 {
								t.Errorf("%s: the shared expert is not rows of qmv (ran %v)", what, seen)
							}
						}
					}
				}
			}
		}
	}
}

// TestQuantEmbed looks up rows of quantized token tables: exactly the
// float32 values the reference dequantization gives.
func TestQuantEmbed(t *testing.T) {
	p := newPair(t, 25)
	const T, V = 9, 300
	toks := make([]int32, T)
	for i := range toks {
		toks[i] = int32(p.r.IntN(V))
	}
	toks[0], toks[1] = 0, V-1
	p.begin(&backend.Batch{Tokens: toks, Seqs: []backend.SeqInfo{{N: T}}})
	for _, dt := range quantTypes {
		for _, H := range []int{512, 416, 200} {
			if dt.CheckCols(H) != nil {
				continue
			}
			ctab, gtab := p.qload(dt, V, H)
			co, gout := p.out(T, H)
			p.c.Embed(co, ctab)
			seen := p.launches(func() { p.g.Embed(gout, gtab) })
			what := fmt.Sprintf("embed %v [%d, %d]", dt, V, H)
			p.compare(what, co, gout, 0)
			expect(t, what, seen, []string{"qembed_" + dt.String()}, []string{"embed"})
		}
	}
}

// TestQuantGraph captures decode steps of quantized products (an MLP and a
// bf16-out projection) and replays them on new inputs.
func TestQuantGraph(t *testing.T) {
	p := newPair(t, 26)
	p.withFP8(-1, 0, 0, func() { p.quantGraph(t) }) // the FP8 tensor-core products in graphs are TestFP8GEMM's, TestFP8Skinny's and TestF8MV's
}

func (p *pair) quantGraph(t *testing.T) {
	const H, I = 512, 512
	for i, dt := range quantTypes {
		n := 2 + 2*(i%2) // qgemv and qmv in turn
		cgu, ggu := p.qload(dt, 2*I, H)
		cd, gd := p.qload(dt, H, I)
		cw, gw := p.qload(dt, 384, H)
		p.begin(&backend.Batch{Tokens: make([]int32, n), Seqs: []backend.SeqInfo{{N: n}}})
		gx := p.g.Alloc(backend.BF16, n, H)
		gout := p.g.Alloc(backend.F32, n, H)
		gq := p.g.Alloc(backend.BF16, n, 384)
		for step := range 3 {
			x := roundTo(backend.BF16, p.randn(n*H, 1))
			p.g.Write(gx, encode(backend.BF16, x))
			p.g.Write(gout, make([]byte, 4*n*H))
			nan := make([]float32, n*384)
			for i := range nan {
				nan[i] = float32(math.NaN())
			}
			p.g.Write(gq, encode(backend.BF16, nan))
			p.g.Graph("quant "+dt.String(), func() {
				p.g.MLP(gout, gx, ggu, gd)
				p.g.MatMul(gq, gx, gw, false)
			})
			cx, _ := p.c.Load(backend.F32, []int{n, H}, encode(backend.F32, x))
			co, cq := p.c.Alloc(backend.F32, n, H), p.c.Alloc(backend.F32, n, 384)
			p.c.Write(co, make([]byte, 4*n*H))
			p.c.MLP(co, cx, cgu, cd)
			p.c.MatMul(cq, cx, cw, false)
			p.compare(fmt.Sprintf("graph %v step %d: mlp", dt, step), co, gout, 1.5e-2)
			p.compare(fmt.Sprintf("graph %v step %d: projection", dt, step), cq, gq, 1e-2)
		}
		for _, x := range []backend.Tensor{gx, gout, gq} {
			p.g.Free(x)
		}
	}
}

// TestQuantRefused: ops that take no quantized weight say so.
func TestQuantRefused(t *testing.T) {
	p := newPair(t, 27)
	const T, H = 2, 256
	p.begin(&backend.Batch{Tokens: make([]int32, T), Seqs: []backend.SeqInfo{{N: T}}})
	_, w := p.qload(backend.Q8_0, 1, H)
	_, x := p.load(backend.F32, p.randn(T*H, 1), T, H)
	_, out := p.out(T, H)
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "quantized") {
			t.Errorf("rmsnorm with a quantized weight: %v", r)
		}
	}()
	p.g.RMSNorm(out, x, p.g.Reshape(w, H), 1e-6, false)
}

// TestQuantModels runs the quantized models of testdata/quant end to end:
// the fixtures as Qwen's FP8 checkpoints, and llama.cpp's quantizations
// (Q8_0, Q4_K_M, Q5_K_M, MXFP4_MOE) of 256-wide random models. Each
// prompt's last logits, from one prefill (dequantized slabs and cuBLASLt)
// and from a prefill of all but the last token and a decode step (qmv),
// are compared with the CPU's on the same weights dequantized exactly to
// float32: the median over prompts within 1e-2 (bf16 activations, as the
// bf16 fixtures are held to), or for the GGUF files within 1.25 times
// llama.cpp's own distance (int8 activations) if that is larger, the bar
// the CPU backend meets.
func TestQuantModels(t *testing.T) {
	p := newPair(t, 28)
	dir := filepath.Join("..", "..", "testdata", "quant")
	type qmodel struct{ name, path, prompts, lldump string }
	var cases []qmodel
	for _, f := range []string{"qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe"} {
		d := filepath.Join(dir, "fp8-"+f)
		cases = append(cases, qmodel{"fp8-" + f, d, d, ""})
	}
	for _, f := range []string{"qwen3-w256-Q8_0", "qwen3-w256-Q4_K_M", "qwen3-w256-Q5_K_M", "qwen3moe-w256-Q4_K_M",
		"qwen3moe-w256-MXFP4_MOE", "qwen3next-w256-Q4_K_M"} {
		cases = append(cases, qmodel{f, filepath.Join(dir, f+".gguf"), filepath.Join(dir, f[:strings.Index(f, "-w256")+5]),
			filepath.Join(dir, f+".lldump.f32")})
	}
	seen := map[string]int{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var ref struct {
				Prompts []struct {
					IDs []int32 `json:"ids"`
				} `json:"prompts"`
			}
			raw, err := os.ReadFile(filepath.Join(c.prompts, "reference.json"))
			if err != nil {
				t.Skip(err)
			}
			if err := json.Unmarshal(raw, &ref); err != nil {
				t.Fatal(err)
			}
			spec := model.CacheSpec{Blocks: 32, BlockSize: 16, Slots: 2}
			load := func(b backend.Backend, opts model.Options) *model.Model {
				m, err := model.Load(c.path, b, opts)
				if err == nil {
					err = m.AllocCache(spec)
				}
				if err != nil {
					t.Fatal(err)
				}
				return m
			}
			cm := load(p.c, model.Options{Dequantize: true})
			defer cm.Close()
			gm := load(p.g, model.Options{KVDType: backend.BF16})
			defer gm.Close()
			blocks := make([]int32, spec.Blocks)
			for i := range blocks {
				blocks[i] = int32(i)
			}
			last := func(b backend.Backend, m *model.Model, ids []int32, pos int) []float32 {
				l, err := m.Forward([]model.Seq{{Tokens: ids, Pos: pos, Blocks: blocks, Logits: model.LastLogits}})
				if err != nil {
					t.Fatal(err)
				}
				return read(t, b, l)
			}
			var exact, pre, dec [][]float32
			for _, pr := range ref.Prompts {
				ids := pr.IDs
				exact = append(exact, last(p.c, cm, ids, 0))
				for k, v := range p.launches(func() {
					pre = append(pre, last(p.g, gm, ids, 0))
					n := len(ids)
					if n > 1 {
						if _, err := gm.Forward([]model.Seq{{Tokens: ids[:n-1], Blocks: blocks, Logits: model.NoLogits}}); err != nil {
							t.Fatal(err)
						}
					}
					dec = append(dec, last(p.g, gm, ids[n-1:], n-1))
				}) {
					seen[k] += v
				}
			}
			bar := 1e-2
			if strings.HasPrefix(c.name, "fp8-") && p.g.fp8Min > 0 {
				// Hopper's block-scaled FP8 GEMMs quantize the activations of
				// products of four tokens or more (the CUDA bar).
				bar = 5e-2
			}
			if c.lldump != "" {
				all, err := reference.ReadF32(c.lldump)
				if err != nil {
					t.Fatal(err)
				}
				v := len(all) / len(exact)
				var ll [][]float32
				for i := range exact {
					ll = append(ll, all[i*v:(i+1)*v])
				}
				dl := medianRelL2(ll, exact)
				t.Logf("llama.cpp: relative L2 %.2e to the exactly dequantized file", dl)
				bar = max(bar, 1.25*dl)
			}
			dp, dd := medianRelL2(pre, exact), medianRelL2(dec, exact)
			t.Logf("relative L2 to the exactly dequantized model (median over %d prompts): prefill %.2e, decode %.2e (bar %.2e, FP8 GEMM from %d tokens)", len(exact), dp, dd, bar, p.g.fp8Min)
			if !(dp <= bar) || !(dd <= bar) {
				t.Errorf("prefill %.2e, decode %.2e from the exactly dequantized model, bar %.2e", dp, dd, bar)
			}
		})
	}
	// Both kinds of product ran on every type the files hold.
	for _, dt := range quantTypes {
		if dt == backend.Q5_K || dt == backend.Q6_K {
			continue // which tensors a Q4_K_M / Q5_K_M file keeps in them is llama.cpp's choice
		}
		decode := 0
		for _, k := range []string{"qgemv1_", "qgemv1_swiglu_", "qmv_", "qmv_swiglu_"} {
			decode += seen[k+dt.String()]
		}
		prompt := seen["qdeq_"+dt.String()] + seen["moe_group_mm64_"+dt.String()] + seen["moe_group_mm128_"+dt.String()]
		if decode == 0 || prompt == 0 {
			t.Errorf("%v: the models ran the decode products (qgemv, qmv) %d and the prompts' (qdeq, moe_group_mm) %d times", dt, decode, prompt)
		}
	}
}

// medianRelL2 is the median over rows of the relative L2 distances.
func medianRelL2(got, want [][]float32) float64 {
	d := make([]float64, len(want))
	for i := range want {
		d[i] = relL2(got[i], want[i])
	}
	slices.Sort(d)
	if n := len(d); n%2 == 0 {
		return (d[n/2-1] + d[n/2]) / 2
	}
	return d[len(d)/2]
}

// decodeModes are the paths a product of few tokens is checked on: the
// defaults (qgemv up to two tokens, qmv up to qmvMaxTokens), qgemv with
// three blocks of 24 warps (each taking several rounds of outputs; the
// defaults give these small products blocks of eight), qmv alone (three
// blocks a row, rounds of output groups too), and the weights dequantized
// for cuBLASLt.
var decodeModes = []string{"default", "rounds", "qmv", "dequantized"}

// withDecode runs f with the decode paths of mode for n tokens and reports
// true, or reports false where the mode is not one for n (each covers what
// the default does not, at a few tokens).
func (p *pair) withDecode(mode string, n int, f func()) bool {
	gv, qmv, grid, qgrid, warps := p.g.qgemvMax, p.g.qmvMax, p.g.qgemvGrid, p.g.qmvGrid, p.g.qgemvWarps
	switch mode {
	case "rounds":
		if n > qgemvTokens {
			return false
		}
		grid, warps = 3, qgemvWarpsSM
	case "qmv":
		if n > qgemvTokens {
			return false
		}
		gv, qgrid = 0, 3
	case "dequantized":
		if n > 3 {
			return false
		}
		gv, qmv = 0, 0
	}
	defer func(g, q, w int) { p.g.qgemvGrid, p.g.qmvGrid, p.g.qgemvWarps = g, q, w }(p.g.qgemvGrid, p.g.qmvGrid, p.g.qgemvWarps)
	p.g.qgemvGrid, p.g.qmvGrid, p.g.qgemvWarps = grid, qgrid, warps
	p.withQ(gv, qmv, qSlabElems, f)
	return true
}

// qmvName is the qmv kernel of dt that takes n tokens.
func qmvName(swiglu bool, dt backend.DType, n int) string {
	if swiglu {
		return quantKernelsOf(dt).mvSwiglu[qmvKernel(n)].name
	}
	return quantKernelsOf(dt).mv[qmvKernel(n)].name
}

// TestQmvNames pins which kernel takes which token count.
func TestQmvNames(t *testing.T) {
	for n, want := range map[int]string{0: "qmv_q4_k", 1: "qmv_q4_k", 8: "qmv_q4_k", 9: "qmv16_q4_k", 16: "qmv16_q4_k", 17: "qmv32_q4_k", 32: "qmv32_q4_k"} {
		if got := qmvName(false, backend.Q4_K, n); got != want {
			t.Errorf("%d tokens: %s, want %s", n, got, want)
		}
	}
	if got := qmvName(true, backend.FP8, 20); got != "qmv32_swiglu_fp8" {
		t.Errorf("swiglu, 20 tokens: %s", got)
	}
}
