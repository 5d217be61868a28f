//go:build cgo

package cuda

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/backend/cpu"
	"github.com/kiln-llm/kiln/model/reference"
)

var (
	gpuOnce sync.Once
	gpu     *Backend
	gpuErr  error
)

// pair runs the same operations on the CPU reference and the GPU.
type pair struct {
	t *testing.T
	c *cpu.Backend
	g *Backend
	r *rand.Rand
}

func newPair(t *testing.T, seed uint64) *pair {
	t.Helper()
	gpuOnce.Do(func() { gpu, gpuErr = New(Options{}) })
	if gpuErr != nil {
		if os.Getenv("KILN_REQUIRE_GPU") != "" {
			t.Fatalf("KILN_REQUIRE_GPU is set but the CUDA backend is unavailable: %v", gpuErr)
		}
		t.Skipf("no GPU: %v", gpuErr)
	}
	return &pair{t: t, c: cpu.New(cpu.Options{}), g: gpu, r: rand.New(rand.NewPCG(seed, 0x6b696c6e))}
}

func (p *pair) randn(n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(p.r.NormFloat64() * scale)
	}
	return v
}

// encode stores v as dt (little endian).
func encode(dt backend.DType, v []float32) []byte {
	out := make([]byte, len(v)*dt.Size())
	for i, x := range v {
		switch dt {
		case backend.F32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
		case backend.BF16:
			u := math.Float32bits(x)
			u += 0x7fff + (u>>16)&1
			binary.LittleEndian.PutUint16(out[2*i:], uint16(u>>16))
		case backend.F16:
			binary.LittleEndian.PutUint16(out[2*i:], backend.F16Bits(x))
		}
	}
	return out
}

// load puts the same data on both backends.
func (p *pair) load(dt backend.DType, v []float32, shape ...int) (backend.Tensor, backend.Tensor) {
	p.t.Helper()
	data := encode(dt, v)
	ct, err := p.c.Load(dt, shape, data)
	if err != nil {
		p.t.Fatal(err)
	}
	gt, err := p.g.Load(dt, shape, append([]byte(nil), data...))
	if err != nil {
		p.t.Fatal(err)
	}
	return ct, gt
}

// out allocates an f32 output on both, the GPU's poisoned with NaN so that
// unwritten elements show.
func (p *pair) out(shape ...int) (backend.Tensor, backend.Tensor) {
	ct := p.c.Alloc(backend.F32, shape...)
	p.c.Write(ct, make([]byte, 4*shapeSize(shape)))
	return ct, p.poisoned(backend.F32, shape...)
}

// poisoned allocates a GPU tensor of type dt filled with NaN.
func (p *pair) poisoned(dt backend.DType, shape ...int) backend.Tensor {
	gt := p.g.Alloc(dt, shape...)
	nan := make([]float32, shapeSize(shape))
	for i := range nan {
		nan[i] = float32(math.NaN())
	}
	p.g.Write(gt, encode(dt, nan))
	return gt
}

func read(t *testing.T, b backend.Backend, x backend.Tensor) []float32 {
	t.Helper()
	buf := make([]byte, x.DType().Size()*backend.Numel(x))
	if err := b.Read(x, buf); err != nil {
		t.Fatal(err)
	}
	out := make([]float32, backend.Numel(x))
	for i := range out {
		if x.DType() == backend.BF16 {
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(buf[2*i:])) << 16)
		} else {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
		}
	}
	return out
}

// readI32 copies an int32 tensor to the host.
func readI32(t *testing.T, b backend.Backend, x backend.Tensor) []int32 {
	t.Helper()
	buf := make([]byte, 4*backend.Numel(x))
	if err := b.Read(x, buf); err != nil {
		t.Fatal(err)
	}
	out := make([]int32, len(buf)/4)
	for i := range out {
		out[i] = int32(binary.LittleEndian.Uint32(buf[4*i:]))
	}
	return out
}

// relL2 is ||a - b|| / ||b||; NaN anywhere gives +Inf.
func relL2(a, b []float32) float64 {
	var d, n float64
	for i := range a {
		if math.IsNaN(float64(a[i])) || math.IsInf(float64(a[i]), 0) {
			return math.Inf(1)
		}
		x := float64(a[i]) - float64(b[i])
		d += x * x
		n += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(d / max(n, 1e-30))
}

// compare checks out tensors of both backends within tol.
func (p *pair) compare(what string, ct, gt backend.Tensor, tol float64) {
	p.t.Helper()
	want, got := read(p.t, p.c, ct), read(p.t, p.g, gt)
	if e := relL2(got, want); !(e <= tol) {
		p.t.Errorf("%s: relative L2 error %.3g > %.3g", what, e, tol)
	} else {
		p.t.Logf("%s: relative L2 error %.3g", what, e)
	}
}

func (p *pair) begin(b *backend.Batch) {
	p.c.Begin(b)
	p.g.Begin(b)
}

func TestRowOps(t *testing.T) {
	for _, H := range []int{1000, 1002, 4096, 5120} { // the register kernel at 1, 4 and 8 float4 per thread, and the general one
		t.Run(fmt.Sprint(H), func(t *testing.T) { testRowOps(t, H) })
	}
}

func testRowOps(t *testing.T, H int) {
	p := newPair(t, 1)
	const T, V = 7, 300
	toks := make([]int32, T)
	for i := range toks {
		toks[i] = int32(p.r.IntN(V))
	}
	p.begin(&backend.Batch{Tokens: toks, Seqs: []backend.SeqInfo{{N: 3}, {N: 4}}, LogitRows: []int32{2, 5, 6}})
	for _, dt := range []backend.DType{backend.F32, backend.BF16, backend.F16} {
		ctab, gtab := p.load(dt, p.randn(V*H, 1), V, H)
		co, gout := p.out(T, H)
		p.c.Embed(co, ctab)
		p.g.Embed(gout, gtab)
		p.compare("embed "+dt.String(), co, gout, 0)

		for _, unit := range []bool{false, true} {
			cw, gw := p.load(dt, p.randn(H, 0.3), H)
			cn, gn := p.out(T, H)
			p.c.RMSNorm(cn, co, cw, 1e-6, unit)
			p.g.RMSNorm(gn, gout, gw, 1e-6, unit)
			p.compare(fmt.Sprintf("rmsnorm %v unit=%v", dt, unit), cn, gn, 1e-6)
			gh := p.poisoned(backend.BF16, T, H) // an activation for the products
			p.g.RMSNorm(gh, gout, gw, 1e-6, unit)
			p.compare(fmt.Sprintf("rmsnorm %v unit=%v to bf16", dt, unit), cn, gh, 4e-3)
			p.c.RMSNorm(cn, cn, cw, 1e-6, unit) // in place
			p.g.RMSNorm(gn, gn, gw, 1e-6, unit)
			p.compare("rmsnorm in place", cn, gn, 1e-6)
		}
	}
	co, gout := p.load(backend.F32, p.randn(T*H, 2), T, H)
	cz, gz := p.load(backend.F32, p.randn(T*H, 2), T, H)
	cw, gw := p.load(backend.BF16, p.randn(H/2, 1), H/2)
	cg, gg := p.out(T, H)
	p.c.GatedRMSNorm(cg, co, cz, cw, 1e-6)
	p.g.GatedRMSNorm(gg, gout, gz, gw, 1e-6)
	p.compare("gated rmsnorm", cg, gg, 1e-6)
	gh := p.poisoned(backend.BF16, T, H) // an activation for the products
	p.g.GatedRMSNorm(gh, gout, gz, gw, 1e-6)
	p.compare("gated rmsnorm to bf16", cg, gh, 4e-3)

	cr, gr := p.out(3, H)
	p.c.GatherRows(cr, cg)
	p.g.GatherRows(gr, gg)
	p.compare("gather rows", cr, gr, 1e-6)
}

func TestMatMul(t *testing.T) {
	p := newPair(t, 2)
	cases := []struct {
		n, o, i int
		dt      backend.DType
		acc     bool
	}{
		{1, 1000, 512, backend.BF16, false},
		{2, 300, 2056, backend.BF16, true},
		{3, 700, 1544, backend.BF16, true},
		{8, 256, 4096, backend.BF16, false},
		{9, 512, 384, backend.BF16, false},
		{100, 1536, 1024, backend.BF16, true},
		// Token counts that run their bucket's cuBLASLt algorithm (ltBucket).
		{88, 1024, 512, backend.BF16, false},
		{300, 512, 256, backend.BF16, true},
		{5, 200, 100, backend.BF16, false}, // width not a multiple of 8
		{16, 100, 64, backend.F32, false},
		{7, 128, 96, backend.F16, true},
		{3, 64, 33, backend.BF16, false}, // an odd element count for to_half
		// Skinny GEMM shapes: the inner dimension split over 12 and 3
		// blocks (partial last tiles), and not split.
		{8, 1000, 4096, backend.BF16, true},
		{7, 4100, 1024, backend.BF16, false},
		{5, 20000, 256, backend.BF16, false},
	}
	var cover skinnyCover
	p.productPaths(func(kernel string, gemv int) {
		for _, c := range cases {
			cover.add(kernel, p.g.skinnySplits(c.n, c.o, c.i, c.dt, false))
			for _, xdt := range []backend.DType{backend.F32, backend.BF16} {
				tol := 1e-5
				if xdt == backend.F32 && c.dt != backend.F32 && (c.dt != backend.BF16 || c.n > gemv || c.i%8 != 0) {
					tol = 8e-3 // activations rounded to bf16 / f16
				}
				cw, gw := p.load(c.dt, p.randn(c.o*c.i, 0.05), c.o, c.i)
				odt := backend.F32
				if !c.acc && xdt == backend.BF16 {
					odt = backend.BF16 // the fused q/k/v projection's case
					tol = max(tol, 4e-3)
				}
				co, gout, _ := p.matMuls(cw, gw, c.n, c.o, c.i, xdt, odt, c.acc)
				p.compare(fmt.Sprintf("%s: matmul %d x %d x %d %v, x %v, acc=%v", kernel, c.n, c.o, c.i, c.dt, xdt, c.acc), co, gout, tol)
			}
		}
	})
	cover.check(t, "product")
	// Every cuBLASLt plan of a token count between buckets has its bucket's.
	for k := range p.g.lt.plans {
		if b := k; ltBucket(k.n) != k.n {
			b.n = ltBucket(k.n)
			if _, ok := p.g.lt.plans[b]; !ok {
				t.Errorf("cuBLASLt plan %+v without its bucket's (%d tokens)", k, b.n)
			}
		}
	}
}

// roundTo rounds x in place to the values of dt (f32 or bf16) and returns it.
func roundTo(dt backend.DType, x []float32) []float32 {
	if dt == backend.BF16 {
		for i, v := range x {
			u := math.Float32bits(v)
			x[i] = math.Float32frombits((u + 0x7fff + (u>>16)&1) &^ 0xffff)
		}
	}
	return x
}

// activation puts x on both backends in writable tensors, on the GPU as dt
// (f32 or bf16), on the CPU as f32 holding the same values.
func (p *pair) activation(dt backend.DType, x []float32, shape ...int) (backend.Tensor, backend.Tensor) {
	p.t.Helper()
	x = roundTo(dt, x)
	ct, gt := p.c.Alloc(backend.F32, shape...), p.g.Alloc(dt, shape...)
	p.c.Write(ct, encode(backend.F32, x))
	p.g.Write(gt, encode(dt, x))
	return ct, gt
}

// skinnyCover records whether a test's cases ran the skinny GEMM with its
// inner dimension split and whole: both reductions must be exercised.
type skinnyCover struct{ split, whole bool }

// add notes a case that kernel ran with S splits (0: not the skinny GEMM).
func (c *skinnyCover) add(kernel string, S int) {
	if kernel == "skinny" && S > 0 {
		c.split, c.whole = c.split || S > 1, c.whole || S == 1
	}
}

func (c *skinnyCover) check(t *testing.T, what string) {
	if !c.split || !c.whole {
		t.Errorf("the cases ran the skinny %s split: %v, whole: %v; want both", what, c.split, c.whole)
	}
}

// productPaths runs f with the GEMV serving every token count it can, then
// with the skinny GEMM above two tokens, then with cuBLASLt for all.
func (p *pair) productPaths(f func(kernel string, gemvMax int)) {
	defer func(m, s int) { p.g.gemvMax, p.g.skinnyMax = m, s }(p.g.gemvMax, p.g.skinnyMax)
	for _, mode := range []struct {
		kernel         string
		gemv, skinnyTo int
	}{{"gemv", 8, 0}, {"skinny", 2, skinnyMaxTokens}, {"cublasLt", 0, 0}} {
		p.g.gemvMax, p.g.skinnyMax = mode.gemv, mode.skinnyTo
		f(mode.kernel, mode.gemv)
	}
}

func TestMLP(t *testing.T) {
	p := newPair(t, 9)
	cases := []struct {
		n, h, i int
		dt      backend.DType
	}{
		{1, 512, 1024, backend.BF16},
		{2, 1000, 264, backend.BF16},
		{3, 512, 1024, backend.BF16},
		{64, 256, 512, backend.BF16},
		{8, 1024, 3072, backend.BF16}, // skinny: both products split
		{6, 256, 12800, backend.BF16}, // skinny: gate/up whole, down split 49 ways
		{5, 100, 60, backend.BF16},    // widths not multiples of 8: the general path
		{4, 96, 64, backend.F16},
		{3, 64, 48, backend.F32},
	}
	var cover skinnyCover
	p.productPaths(func(kernel string, gemv int) {
		for _, c := range cases {
			cover.add(kernel, p.g.skinnySplits(c.n, c.i, c.h, c.dt, true))
			for _, xdt := range []backend.DType{backend.F32, backend.BF16} {
				tol := 1e-5
				if c.dt != backend.F32 && (c.dt != backend.BF16 || c.n > gemv || c.h%8 != 0) {
					tol = 1.5e-2 // activations and products rounded to bf16 / f16
				}
				cgu, ggu := p.load(c.dt, p.randn(2*c.i*c.h, 0.05), 2*c.i, c.h)
				cd, gd := p.load(c.dt, p.randn(c.h*c.i, 0.05), c.h, c.i)
				co, gout, _ := p.mlps(cgu, ggu, cd, gd, c.n, c.h, xdt)
				p.compare(fmt.Sprintf("%s: mlp %d x %d x %d %v, x %v", kernel, c.n, c.h, c.i, c.dt, xdt), co, gout, tol)
			}
		}
	})
	cover.check(t, "gate/up product")
}

type attnCase struct {
	H, KH, hd, rd int
	gated, unit   bool
	kv            backend.DType
}

func (c attnCase) spec() *backend.AttnSpec {
	s := &backend.AttnSpec{Heads: c.H, KVHeads: c.KH, HeadDim: c.hd, RotaryDim: c.rd, Gated: c.gated,
		NormEps: 1e-6, UnitOffsetNorm: c.unit, Scale: float32(1 / math.Sqrt(float64(c.hd)))}
	s.Rope.AttnFactor = 1
	for i := 0; i < c.rd/2; i++ {
		s.Rope.InvFreq = append(s.Rope.InvFreq, float32(math.Pow(1e6, -2*float64(i)/float64(c.rd))))
	}
	return s
}

// attnSteps runs prefill, decode and chunk steps on a few sequences through
// both backends and compares each step's output; step wraps the GPU's
// operations (a Graph in TestGraphReplay). The operations are
// FusedAttention's, or with steps StoreKV and Attend on random queries,
// keys and values of the activation type act.
func attnSteps(p *pair, c attnCase, act backend.DType, steps [][]int, plain bool, step func(key string, f func())) {
	spec := c.spec()
	// Each sequence's blocks, 512 in all at least, shuffled.
	const bs = 16
	longest := 0
	for s := range steps[0] {
		n := 0
		for _, ns := range steps {
			n += ns[s]
		}
		longest = max(longest, n)
	}
	blocks := max(512, len(steps[0])*((longest+bs-1)/bs))
	kvs := backend.KVSpec{Layers: 2, Blocks: blocks, BlockSize: bs, KVHeads: c.KH, HeadDim: c.hd, DType: c.kv}
	ckv, err := p.c.NewKVCache(kvs)
	if err != nil {
		p.t.Fatal(err)
	}
	gkv, err := p.g.NewKVCache(kvs)
	if err != nil {
		p.t.Fatal(err)
	}
	defer gkv.Free()
	cqn, gqn := p.load(backend.BF16, p.randn(c.hd, 0.3), c.hd)
	ckn, gkn := p.load(backend.BF16, p.randn(c.hd, 0.3), c.hd)
	perm := p.r.Perm(blocks)
	nseq := len(steps[0])
	tables := make([][]int32, nseq)
	for s := range tables {
		for j := 0; j < blocks/nseq; j++ {
			tables[s] = append(tables[s], int32(perm[s*(blocks/nseq)+j]))
		}
	}
	pos := make([]int, nseq)
	// The input: the fused projection, or [q | k | v] parted by SliceCols.
	width := spec.QKVWidth()
	if plain {
		width = (c.H + 2*c.KH) * c.hd
	}
	// The GPU's inputs and output live in buffers kept per key, as a
	// model's activations do: a captured graph keeps reading the same
	// memory.
	type io struct{ x, q, k, v, out backend.Tensor }
	bufs := map[string]io{}
	for si, ns := range steps {
		var b backend.Batch
		for s, n := range ns {
			need := (pos[s] + n + bs - 1) / bs
			b.Seqs = append(b.Seqs, backend.SeqInfo{Pos: pos[s], N: n, Blocks: tables[s][:need]})
			for range n {
				b.Tokens = append(b.Tokens, 0)
			}
		}
		T := len(b.Tokens)
		p.begin(&b)
		key := fmt.Sprintf("attention steps=%v %v", plain, ns)
		g, ok := bufs[key]
		if !ok {
			g = io{x: p.g.Alloc(act, T, width), out: p.poisoned(act, T, c.H*c.hd)}
			if plain {
				g.q, g.k, g.v = p.g.Alloc(act, T, c.H*c.hd), p.g.Alloc(act, T, c.KH*c.hd), p.g.Alloc(act, T, c.KH*c.hd)
			}
			bufs[key] = g
		}
		x := roundTo(act, p.randn(T*width, 1))
		cx, _ := p.c.Load(backend.F32, []int{T, width}, encode(backend.F32, x))
		p.g.Write(g.x, encode(act, x))
		co := p.c.Alloc(backend.F32, T, c.H*c.hd)
		if plain {
			cq, ck, cv := p.c.Alloc(backend.F32, T, c.H*c.hd), p.c.Alloc(backend.F32, T, c.KH*c.hd), p.c.Alloc(backend.F32, T, c.KH*c.hd)
			for _, b := range []struct {
				be         backend.Backend
				x, q, k, v backend.Tensor
			}{{p.c, cx, cq, ck, cv}, {p.g, g.x, g.q, g.k, g.v}} {
				b.be.SliceCols(b.q, b.x, 0)
				b.be.SliceCols(b.k, b.x, c.H*c.hd)
				b.be.SliceCols(b.v, b.x, (c.H+c.KH)*c.hd)
			}
			p.c.StoreKV(ckv, 1, ck, cv)
			p.c.Attend(co, cq, ckv, 1, spec.Scale)
			step(key, func() {
				p.g.StoreKV(gkv, 1, g.k, g.v)
				p.g.Attend(g.out, g.q, gkv, 1, spec.Scale)
			})
		} else {
			p.c.Attention(co, cx, backend.AttnWeights{QNorm: cqn, KNorm: ckn}, spec, ckv, 1)
			step(key, func() {
				p.g.Attention(g.out, g.x, backend.AttnWeights{QNorm: gqn, KNorm: gkn}, spec, gkv, 1)
			})
		}
		tol := 2e-5
		if act == backend.BF16 {
			tol = 4e-3 // the output rounded to bf16
		}
		if c.kv == backend.BF16 {
			tol = 1e-2 // bf16 keys and values; the tensor-core kernel also rounds q and p to bf16
		}
		p.compare(fmt.Sprintf("%+v %v in and out, steps %v, step %d %v", c, act, plain, si, ns), co, g.out, tol)
		for s, n := range ns {
			pos[s] += n
		}
	}
}

// TestAttentionDeep: a prompt's chunks of 2048 tokens (flash_wg where the
// GPU has it) up to 32K keys of depth, then a chunk of 1100, against the
// CPU: a chunk at depth attends every key before it. Qwen3-Next's head dim
// (256, gated, a quarter of it rotated), four query heads of one kv head
// to keep the CPU's side short.
func TestAttentionDeep(t *testing.T) {
	p := newPair(t, 11)
	steps := make([][]int, 16, 17)
	for i := range steps {
		steps[i] = []int{2048}
	}
	steps = append(steps, []int{1100})
	ran := map[string]bool{}
	p.g.trace = func(name string) { ran[name] = true }
	defer func() { p.g.trace = nil }()
	attnSteps(p, attnCase{4, 1, 256, 64, true, false, backend.BF16}, backend.BF16, steps, false, func(_ string, f func()) { f() })
	if p.g.flashWG && !ran["flash_wg_256"] {
		t.Errorf("flash_wg_256 did not run (ran %v)", ran)
	}
}

// TestAttention compares FusedAttention, and the steps StoreKV and Attend
// (queries of the activation type and f32, which Attend converts to the
// cache's type), with the CPU: every decode and prefill kernel, on each
// cache type.
func TestAttention(t *testing.T) {
	p := newPair(t, 3)
	cases := []attnCase{
		{8, 2, 128, 128, false, false, backend.BF16},
		{4, 4, 64, 32, true, true, backend.F32},
		{6, 2, 32, 32, false, false, backend.BF16}, // decode through the general kernel
		{16, 2, 256, 64, true, false, backend.BF16},
		{8, 1, 128, 128, false, false, backend.F32},
		{10, 2, 128, 128, false, false, backend.BF16}, // a group of 5 (Qwen3-14B): tensor-core decode only
		{16, 1, 64, 64, true, false, backend.BF16},
		{8, 8, 64, 64, true, false, backend.BF16},
		// The tensor-core decode's tiles of 8 heads: a group of 16 at head
		// dim 128 (Qwen3-235B; two tiles), 12 (the second tile part
		// empty), 8 (Qwen3-30B-A3B; one full tile), 7 at head dim 64
		// (Qwen2.5-0.5B).
		{32, 2, 128, 128, false, false, backend.BF16},
		{24, 2, 128, 64, true, false, backend.BF16},
		{16, 2, 128, 128, false, true, backend.BF16},
		{14, 2, 64, 64, false, false, backend.BF16},
	}
	// {3, 1, 4, 2}: the decode kernel with tokens of one sequence that
	// attend each other's keys, stored in the same step; {600, 2, 1, 1}:
	// enough tokens for q/k norm + RoPE to take a block per token; 300, 600
	// and 1100 new tokens: each of the flash kernel's tiles; {40, 1, 1, 1}
	// after 1.75K tokens: too few blocks for the GPU, so the keys are split
	// (flashSplits: ranges of 256 keys, the diagonal in the last one; the
	// shorter sequences have none in most).
	steps := [][]int{{40, 300, 1, 77}, {1, 1, 1, 1}, {1, 1, 1, 1}, {5, 1, 33, 1}, {1, 1, 1, 1}, {3, 1, 4, 2}, {600, 2, 1, 1}, {1100, 1, 1, 1}, {40, 1, 1, 1}}
	tiles := map[[2]int]bool{}
	for _, s := range steps {
		bq, bk := flashTile(slices.Max(s))
		tiles[[2]int{bq, bk}] = true
	}
	if len(tiles) != 3 {
		t.Fatalf("the steps take flash tiles %v, want all three", tiles)
	}
	ran := map[string]bool{}
	p.g.trace = func(name string) { ran[name] = true }
	for _, c := range cases {
		for _, out := range []backend.DType{backend.F32, backend.BF16} {
			for _, plain := range []bool{false, true} {
				attnSteps(p, c, out, steps, plain, func(_ string, f func()) { f() })
			}
		}
	}
	p.g.trace = nil
	// Both tiles of 8 heads at both head dims (split steps).
	for _, name := range []string{"attn_decode_mma_64_3_1", "attn_decode_mma_64_3_2",
		fmt.Sprintf("attn_decode_mma_128_%d_1", p.g.decodeStages(128)), fmt.Sprintf("attn_decode_mma_128_%d_2", p.g.decodeStages(128))} {
		if !ran[name] {
			t.Errorf("%s did not run", name)
		}
	}
	// One split a token, as batches that fill the GPU take: the decode
	// steps of bf16 caches at head dim 64 and 128 run attn_decode_fused.
	func() {
		defer func(s int) { p.g.splitMax, p.g.trace = s, nil }(p.g.splitMax)
		p.g.splitMax = 1
		ran := map[string]bool{}
		p.g.trace = func(name string) { ran[name] = true }
		for _, c := range cases {
			for _, out := range []backend.DType{backend.F32, backend.BF16} {
				attnSteps(p, c, out, steps, false, func(_ string, f func()) { f() })
			}
		}
		for _, name := range []string{"attn_decode_fused_64_3_1", "attn_decode_fused_64_3_2",
			fmt.Sprintf("attn_decode_fused_128_%d_1", p.g.decodeStages(128)), fmt.Sprintf("attn_decode_fused_128_%d_2", p.g.decodeStages(128))} {
			if !ran[name] {
				t.Errorf("%s did not run", name)
			}
		}
	}()
	// The split keys' other query tile (KILN_CUDA_FLASH_SPLIT_QUERIES).
	defer func(q int) { p.g.flashSplitQueries = q }(p.g.flashSplitQueries)
	p.g.flashSplitQueries = 192 - p.g.flashSplitQueries
	for _, c := range []attnCase{cases[0], cases[6]} {
		attnSteps(p, c, backend.BF16, steps, false, func(_ string, f func()) { f() })
	}
	// On Hopper the 1100-token step took flash_wg: flash_prefill's
	// 128-query tiles (the other GPUs') too.
	if p.g.flashWG {
		defer func() { p.g.flashWG = true }()
		p.g.flashWG = false
		for _, c := range []attnCase{cases[0], cases[3], cases[6]} {
			attnSteps(p, c, backend.BF16, steps, false, func(_ string, f func()) { f() })
		}
	}
	// A GPU of 99 KB a block (sm_86, sm_89), as this one would be without
	// Hopper's kernels: head dim 128 decodes in two stages, split and
	// fused, and the 1100-token step prefills in 64-query tiles (or split),
	// where 128-query tiles would take 102 KB.
	func() {
		defer func(smem, split, sq int, wg bool) {
			p.g.smemOp, p.g.splitMax, p.g.flashSplitQueries, p.g.flashWG, p.g.trace = smem, split, sq, wg, nil
		}(p.g.smemOp, p.g.splitMax, p.g.flashSplitQueries, p.g.flashWG)
		p.g.smemOp, p.g.flashSplitQueries, p.g.flashWG = 99<<10, 128, false
		ran := map[string]bool{}
		p.g.trace = func(name string) {
			if strings.HasPrefix(name, "attn_decode_") || strings.HasPrefix(name, "flash_") {
				ran[name] = true
			}
		}
		for _, split := range []int{p.g.splitMax, 1} {
			p.g.splitMax = split
			for _, c := range []attnCase{cases[0], cases[8]} { // groups of 4 and 16 (two tiles of 8 heads)
				attnSteps(p, c, backend.BF16, steps, false, func(_ string, f func()) { f() })
			}
		}
		for _, name := range []string{"attn_decode_mma_128_2_1", "attn_decode_fused_128_2_1", "attn_decode_mma_128_2_2", "attn_decode_fused_128_2_2"} {
			if !ran[name] {
				t.Errorf("with 99 KB a block %s did not run (ran %v)", name, ran)
			}
		}
		for name := range ran {
			if strings.HasPrefix(name, "flash_prefill_128_64") || strings.Contains(name, "_128_3_") {
				t.Errorf("with 99 KB a block %s ran", name)
			}
		}
	}()
}

// TestRoPE rotates f32 and bf16 activations at scattered positions
// (40000: the float32 angle's rounding matters) against the CPU, full and
// partial rotations.
func TestRoPE(t *testing.T) {
	p := newPair(t, 13)
	p.begin(&backend.Batch{Tokens: make([]int32, 7), Seqs: []backend.SeqInfo{{Pos: 0, N: 3}, {Pos: 1000, N: 1}, {Pos: 40000, N: 3}}})
	for _, c := range []attnCase{{16, 16, 128, 128, false, false, 0}, {4, 4, 256, 64, false, false, 0}, {8, 8, 64, 32, false, false, 0}} {
		spec := c.spec()
		for _, act := range []backend.DType{backend.F32, backend.BF16} {
			x := roundTo(act, p.randn(7*c.H*c.hd, 1))
			cx, gx := p.c.Alloc(backend.F32, 7, c.H*c.hd), p.g.Alloc(act, 7, c.H*c.hd)
			p.c.Write(cx, encode(backend.F32, x))
			p.g.Write(gx, encode(act, x))
			p.c.RoPE(cx, c.hd, &spec.Rope)
			p.g.RoPE(gx, c.hd, &spec.Rope)
			tol := 1e-6
			if act == backend.BF16 {
				tol = 4e-3
			}
			p.compare(fmt.Sprintf("rope %d heads of %d, %d rotated, %v", c.H, c.hd, c.rd, act), cx, gx, tol)
		}
	}
}

// TestMulSigmoid parts a gated layer's q projection into query and gate
// (SliceCols) and gates an f32 and a bf16 output with it on both backends.
func TestMulSigmoid(t *testing.T) {
	p := newPair(t, 14)
	const T, H, hd = 9, 4, 64
	cqg, gqg := p.load(backend.F32, p.randn(T*H*2*hd, 2), T*H, 2*hd)
	cgate, ggate := p.out(T, H*hd)
	cq, gq := p.out(T, H*hd)
	for _, b := range []struct {
		be              backend.Backend
		qg, gate, query backend.Tensor
	}{{p.c, cqg, cgate, cq}, {p.g, gqg, ggate, gq}} {
		b.be.SliceCols(b.be.Reshape(b.query, T*H, hd), b.qg, 0)
		b.be.SliceCols(b.be.Reshape(b.gate, T*H, hd), b.qg, hd)
	}
	p.compare("slice cols: query", cq, gq, 0)
	p.compare("slice cols: gate", cgate, ggate, 0)
	for _, act := range []backend.DType{backend.F32, backend.BF16} {
		o := roundTo(act, p.randn(T*H*hd, 1))
		co, gout := p.c.Alloc(backend.F32, T, H*hd), p.g.Alloc(act, T, H*hd)
		p.c.Write(co, encode(backend.F32, o))
		p.g.Write(gout, encode(act, o))
		p.c.MulSigmoid(co, cgate)
		p.g.MulSigmoid(gout, ggate)
		tol := 1e-6
		if act == backend.BF16 {
			tol = 4e-3
		}
		p.compare(fmt.Sprintf("mul sigmoid %v", act), co, gout, tol)
	}
}

// TestGraphReplay captures decode steps and replays them as positions and
// block tables grow: every replay must match the CPU.
func TestGraphReplay(t *testing.T) {
	p := newPair(t, 4)
	steps := [][]int{{50, 200}}
	for range 16 {
		steps = append(steps, []int{1, 1})
	}
	before := len(p.g.graphs)
	for _, plain := range []bool{false, true} {
		attnSteps(p, attnCase{8, 2, 128, 128, false, false, backend.BF16}, backend.BF16, steps, plain, p.g.Graph)
	}
	if len(p.g.graphs) == before {
		t.Errorf("no graph was captured")
	}
}

func TestSample(t *testing.T) {
	p := newPair(t, 5)
	const V = 151936
	params := []backend.SampleParams{
		{},
		{Logprob: true, TopLogprobs: 5},
		{Temperature: 0.7, Uniform: 0.31, Logprob: true},
		{Temperature: 1, TopK: 40, Uniform: 0.77},
		{Temperature: 0.9, TopP: 0.9, Uniform: 0.5},
		{Temperature: 1.2, MinP: 0.05, Uniform: 0.99},
		{Temperature: 0.6, TopK: 20, TopP: 0.8, MinP: 0.02, Uniform: 0.12},
		{Temperature: 1, Uniform: 0.6, RepetitionPenalty: 1.3, PresencePenalty: 0.5, FrequencyPenalty: 0.2,
			Counts: []backend.TokenCount{{Token: 3, Count: 2}, {Token: 10, Count: 1, Prompt: true}, {Token: 12, Prompt: true}}, Bias: []backend.TokenBias{{Token: 7, Bias: 5}}},
		{Temperature: 0, RepetitionPenalty: 2, Counts: []backend.TokenCount{{Token: 0, Count: 1}, {Token: 5, Prompt: true}}, TopLogprobs: 3},
		// Token masks (constrained decoding): a few tokens, with more top
		// log-probabilities asked for than allowed; every third token under
		// filters, with a masked token's bias and penalty on top.
		{Mask: backend.NewMask(V, func(t int32) bool { return t == 17 || t == 4000 || t == 151935 }), Logprob: true, TopLogprobs: 5},
		{Temperature: 0.9, Uniform: 0.42, Mask: backend.NewMask(V, func(t int32) bool { return t == 17 || t == 4000 || t == 151935 }), Logprob: true},
		{Temperature: 0.8, TopK: 50, TopP: 0.9, MinP: 0.01, Uniform: 0.7, Logprob: true, TopLogprobs: 4, Mask: backend.NewMask(V, func(t int32) bool { return t%3 == 0 }),
			Bias: []backend.TokenBias{{Token: 7, Bias: 50}}, Counts: []backend.TokenCount{{Token: 9, Count: 3}}, FrequencyPenalty: 1},
		// Around the candidates' room (SAMPLE_CAP, 2048): a large top-k
		// within it, one past it; top-p alone within the candidates and
		// past them; temperature alone drawn past them (where the tokens
		// still weigh enough that float32 sums over the row place the draw
		// as float64 ones do); many top tokens.
		{Temperature: 1, TopK: 1000, TopP: 0.5, Uniform: 0.93, Logprob: true, TopLogprobs: 20},
		{Temperature: 1, TopK: 3000, Uniform: 0.25},
		{Temperature: 0.3, TopP: 0.7, Uniform: 0.66, TopLogprobs: 8},
		{Temperature: 1.5, TopP: 0.99, Uniform: 0.5},
		{Temperature: 1.5, Uniform: 0.7},
		{TopLogprobs: 30},
	}
	R := len(params)
	logits := p.randn(R*V, 3)
	// Make the penalised tokens matter: put them on top.
	logits[7*V+3], logits[7*V+10], logits[7*V+7], logits[7*V+12] = 14, 13, 9, 12
	// Row 8 (greedy): 20 / 2 for token 0 leaves 12 (prompt-only, 18 / 2 = 9)
	// and 11 (untouched) to decide.
	logits[8*V], logits[8*V+5], logits[8*V+6] = 20, 18, 11
	cl, gl := p.load(backend.F32, logits, R, V)
	want, err := p.c.Sample(cl, params)
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.g.Sample(gl, params)
	if err != nil {
		t.Fatal(err)
	}
	for i := range params {
		w, g := want[i], got[i]
		if w.Token != g.Token || math.Abs(float64(w.Logprob-g.Logprob)) > 1e-3 || len(w.Top) != len(g.Top) {
			t.Errorf("row %d %+v: got %+v, want %+v", i, params[i], g, w)
			continue
		}
		for j := range w.Top {
			if w.Top[j].Token != g.Top[j].Token || math.Abs(float64(w.Top[j].Logprob-g.Top[j].Logprob)) > 1e-3 {
				t.Errorf("row %d top %d: got %+v, want %+v", i, j, g.Top[j], w.Top[j])
			}
		}
	}
	// Sweeps of draws: the token must follow Uniform exactly as on the CPU,
	// drawn among the candidates after top-k and top-p, after top-p alone,
	// and with temperature alone, where the largest draws land past them.
	row := p.randn(V, 2)
	rows := make([]float32, 0, 64*V)
	for range 64 {
		rows = append(rows, row...)
	}
	cl, gl = p.load(backend.F32, rows, 64, V)
	for _, sp := range []backend.SampleParams{{Temperature: 0.8, TopP: 0.95, TopK: 100}, {Temperature: 0.5, TopP: 0.9}, {Temperature: 0.6}} {
		sweep := make([]backend.SampleParams, 64)
		for i := range sweep {
			sweep[i] = sp
			sweep[i].Uniform = float32(i) / 64
		}
		want, _ = p.c.Sample(cl, sweep)
		got, err = p.g.Sample(gl, sweep)
		if err != nil {
			t.Fatal(err)
		}
		diff := 0
		for i := range sweep {
			if want[i].Token != got[i].Token {
				diff++
			}
		}
		if diff > 1 { // one draw may sit on a float rounding boundary
			t.Errorf("%+v: %d of 64 draws differ from the CPU sampler", sp, diff)
		}
	}
}

// Greedy sampling takes the first of tied maxima, within a block and
// across a row's chunks, in both greedy paths.
func TestArgmaxTies(t *testing.T) {
	p := newPair(t, 11)
	defer func(on bool) { p.g.argmax = on }(p.g.argmax)
	// Greedy rows that ask for nothing else go to argmax_rows, the others
	// (here KILN_CUDA_ARGMAX=0's way) to sample_scan, whose merge takes
	// the largest logit: both take the first index of the largest value,
	// across threads and chunks.
	for _, argmax := range []bool{true, false} {
		p.g.argmax = argmax
		for _, V := range []int{151936, 1001, 2*rowChunk + 1} {
			rows := make([]float32, 5*V)                   // row 0: all tied
			rows[V+6], rows[V+5] = 1, 1                    // one group of four
			rows[2*V+min(4097, V-100)], rows[2*V+9] = 2, 2 // two threads
			rows[3*V+V-1] = 3                              // the last element
			rows[4*V+V/2], rows[4*V+V-2] = -1, 4           // two chunks (V > rowChunk)
			_, gl := p.load(backend.F32, rows, 5, V)
			got, err := p.g.Sample(gl, make([]backend.SampleParams, 5))
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range []int32{0, 5, 9, int32(V - 1), int32(V - 2)} {
				if got[i].Token != want {
					t.Errorf("argmax_rows %v, V %d row %d: token %d, want %d", argmax, V, i, got[i].Token, want)
				}
			}
		}
	}
}

func TestMoE(t *testing.T) {
	p := newPair(t, 8)
	// The router product stays in float32's precision, so no near tie
	// between experts flips the selection (from 64 tokens, on tensor cores
	// or cuBLASLt's float32 GEMM, it may order two near-equal picks either
	// way: sameRouting). 512 experts, top 10: Qwen3-Next's
	// routing. A few tokens take moe_rows (one GEMV row a (token, choice),
	// and the shared expert as more rows when it has the experts' width),
	// more of them its pairs of an expert's rows; enough tokens for two rows
	// an expert go through the grouped tensor-core products (in 128-row
	// tiles from 32 rows an expert). A shared expert
	// that is not among the rows rounds its inputs to bf16 beyond 8 tokens.
	const H, I = 64, 32
	paths := map[string]bool{}
	for _, c := range []struct{ T, E, K int }{{1, 512, 10}, {2, 8, 2}, {16, 512, 10}, {32, 512, 10}, {64, 8, 2}, {128, 512, 10}, {300, 8, 2}, {600, 4, 2}} {
		T, E, K := c.T, c.E, c.K
		for _, Is := range []int{0, I, 48} { // shared expert's width (0: none)
			tol := 1e-5
			if moeGrouped(T*K, E) {
				tol = 5e-3 // rows in bf16, as cuBLASLt's inputs
			}
			if Is > 0 && T > 8 && (Is != I || moeRowPairs(T*K, E)) {
				tol = 5e-3 // cuBLASLt's bf16 inputs
			}
			for _, norm := range []bool{false, true} {
				var ce, ge backend.Experts
				// Routers of GGUF files are float32: half the cases.
				rdt := backend.BF16
				if norm {
					rdt = backend.F32
				}
				ce.Router, ge.Router = p.load(rdt, p.randn(E*H, 0.3), E, H)
				ce.GateUp, ge.GateUp = p.load(backend.BF16, p.randn(E*2*I*H, 0.1), E, 2*I, H)
				ce.Down, ge.Down = p.load(backend.BF16, p.randn(E*H*I, 0.1), E, H, I)
				if Is > 0 {
					ce.SharedGateUp, ge.SharedGateUp = p.load(backend.BF16, p.randn(2*Is*H, 0.1), 2*Is, H)
					ce.SharedDown, ge.SharedDown = p.load(backend.BF16, p.randn(H*Is, 0.1), H, Is)
					ce.SharedGate, ge.SharedGate = p.load(backend.BF16, p.randn(H, 0.3), 1, H)
				}
				spec := &backend.MoESpec{Experts: E, TopK: K, NormTopK: norm}
				r := p.moe(&ce, &ge, T, H, spec, func(f func()) { f() })
				cx, gx, init, co, gout, seen := r.cx, r.gx, r.init, r.co, r.gout, r.seen
				what := fmt.Sprintf("%d tokens, %d experts top %d shared width %d norm=%v", T, E, K, Is, norm)
				p.compare("moe "+what, co, gout, tol)
				rows, pairs := seen["moe_rows_swiglu"] > 0, seen["moe_rows2_swiglu"] > 0
				grouped, large := seen["moe_group_mm64"]+seen["moe_group_mm128"] > 0, seen["moe_group_mm128"] > 0
				if boolInt(rows)+boolInt(pairs)+boolInt(grouped) != 1 || grouped != moeGrouped(T*K, E) || pairs != (!grouped && moeRowPairs(T*K, E)) ||
					large != (T*K >= moeGroupLargeFrom*E) {
					t.Errorf("moe %s: launched %v", what, seen)
				}
				// With moe_rows, the shared expert is among its rows iff it
				// has the experts' width (else its MLP has a SwiGLU of its own).
				apart := false
				for k := range seen {
					apart = apart || strings.HasPrefix(k, "gemv_swiglu") || strings.HasPrefix(k, "skinny_swiglu") || strings.HasPrefix(k, "silu_mul")
				}
				if rows && Is > 0 && apart != (Is != I) {
					t.Errorf("moe %s: the shared expert ran apart from the rows: %v (launched %v)", what, apart, seen)
				}
				paths[fmt.Sprintf("rows %v pairs %v grouped %v", rows, pairs, grouped)] = true
				// The steps: the GPU's on its own choices, from the same
				// residual as the fused operation.
				gsteps := p.poisoned(backend.F32, T, H)
				p.g.Write(gsteps, init)
				gsel, gw := p.g.Alloc(backend.I32, T, K), p.poisoned(backend.F32, T, K)
				p.g.Route(gsel, gw, gx, ge.Router, spec)
				csel, cw := p.c.Alloc(backend.I32, T, K), p.c.Alloc(backend.F32, T, K)
				p.c.Route(csel, cw, cx, ce.Router, spec)
				p.compare("route weights "+what, cw, gw, 1e-5)
				if want, got := readI32(t, p.c, csel), readI32(t, p.g, gsel); !sameRouting(want, got, read(t, p.c, cw), K) {
					t.Errorf("route %s: experts %v, CPU %v", what, got, want)
				}
				p.g.Experts(gsteps, gx, gsel, gw, ge.GateUp, ge.Down)
				if Is > 0 {
					p.g.SharedExpert(gsteps, gx, ge.SharedGateUp, ge.SharedDown, ge.SharedGate)
				}
				stol := tol
				if Is > 0 && T > 8 {
					stol = 5e-3 // SharedExpert is always the MLP
				}
				p.compare("moe steps "+what, co, gsteps, stol)
			}
		}
	}
	if len(paths) != 3 {
		t.Errorf("the cases took %v; want the rows, their pairs and the grouped products", paths)
	}
}

// sameRouting reports whether got picks each token's K experts as want
// does, in its order except where two picks' weights (the CPU's, wts) are
// within rounding of each other: a router product on tensor cores (from 64
// tokens) may order such a pair either way.
func sameRouting(want, got []int32, wts []float32, K int) bool {
	for t := 0; t*K < len(want); t++ {
		w, g, p := want[t*K:(t+1)*K], got[t*K:(t+1)*K], wts[t*K:(t+1)*K]
		for j := range w {
			if g[j] == w[j] {
				continue
			}
			i := slices.Index(w, g[j])
			if i < 0 || math.Abs(float64(p[i]-p[j])) > 1e-5*math.Abs(float64(p[j])) {
				return false
			}
		}
	}
	return true
}

// TestCopyBandwidth: the copy rate kiln bench divides a decode step's
// bytes by is a rate a GPU's memory can have (an RTX 3060's 0.36 TB/s to
// a B200's 8 TB/s, read plus written: 0.1 to 20 TB/s), and the copies
// leave the memory they took.
func TestCopyBandwidth(t *testing.T) {
	p := newPair(t, 12)
	free := p.g.deviceFree()
	bw, err := p.g.CopyBandwidth()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("device-to-device copy: %.3g B/s (read + written)", bw)
	if bw < 1e11 || bw > 2e13 {
		t.Errorf("copy rate %.3g B/s", bw)
	}
	if after := p.g.deviceFree(); after < free-(64<<20) {
		t.Errorf("%d MiB free after the copies, %d before", after>>20, free>>20)
	}
}

// TestKVCacheSpec: a head dim without attention kernels, or a block size
// that is not a power of two, is refused when the cache is made, not by the
// first attention call.
func TestKVCacheSpec(t *testing.T) {
	p := newPair(t, 11)
	spec := backend.KVSpec{Layers: 1, Blocks: 4, BlockSize: 16, KVHeads: 2, HeadDim: 96, DType: backend.BF16}
	for _, bad := range []backend.KVSpec{spec, {Layers: 1, Blocks: 4, BlockSize: 12, KVHeads: 2, HeadDim: 128, DType: backend.BF16}} {
		if c, err := p.g.NewKVCache(bad); err == nil {
			c.Free()
			t.Fatalf("%+v accepted", bad)
		} else {
			t.Logf("refused as expected: %v", err)
		}
	}
	spec.HeadDim = 128
	c, err := p.g.NewKVCache(spec)
	if err != nil {
		t.Fatal(err)
	}
	c.Free()
}

// TestSmallSmemChoices pins what a GPU of 99 KB a block (sm_86, sm_89)
// takes against a Hopper's 227 KB (no GPU needed): the decode attention's
// stages and the flash prefill's tiles.
func TestSmallSmemChoices(t *testing.T) {
	small, hopper := &Backend{smemOp: 99 << 10}, &Backend{smemOp: 227 << 10}
	for _, c := range []struct {
		b          *Backend
		hd, stages int
	}{{small, 64, 3}, {small, 128, 2}, {hopper, 64, 3}, {hopper, 128, 3}} {
		if got := c.b.decodeStages(c.hd); got != c.stages {
			t.Errorf("smemOp %d, head dim %d: %d stages, want %d", c.b.smemOp, c.hd, got, c.stages)
		}
		if st := c.b.decodeStages(c.hd); decodeMMASmem(c.hd, st)+decodeMMAStatic > c.b.smemOp {
			t.Errorf("smemOp %d, head dim %d: %d stages take %d bytes", c.b.smemOp, c.hd, st, decodeMMASmem(c.hd, st))
		}
	}
	for _, hd := range []int{64, 128, 256} {
		for _, maxN := range []int{300, 600, 1100, 8192} {
			for _, b := range []*Backend{small, hopper} {
				bq, bk := b.flashTileFor(maxN, hd)
				if flashSmem(bq, bk, hd) > b.smemOp {
					t.Errorf("smemOp %d, head dim %d, %d tokens: tile %d x %d takes %d bytes", b.smemOp, hd, maxN, bq, bk, flashSmem(bq, bk, hd))
				}
				if _, ok := flashKernels[[3]int{bq, bk, hd}]; !ok {
					t.Errorf("head dim %d, %d tokens: no flash kernel of tile %d x %d", hd, maxN, bq, bk)
				}
			}
		}
	}
	if bq, _ := hopper.flashTileFor(1100, 128); bq != 128 {
		t.Errorf("a Hopper's 1100-token prompt at head dim 128 takes %d-query tiles, want 128", bq)
	}
}

// TestSkinnySplits pins the skinny GEMM's choice on an H100's figures (no
// GPU needed): which products it takes and how far it splits them.
func TestSkinnySplits(t *testing.T) {
	b := &Backend{sms: 132, smemSM: 228 << 10, gemvMax: gemvMaxTokens, skinnyMax: skinnyMaxTokens}
	for _, c := range []struct {
		n, o, in int
		dt       backend.DType
		swiglu   bool
		want     int
	}{
		{8, 6144, 4096, backend.BF16, false, 2},   // Qwen3-8B q/k/v: 192 tiles, 396 blocks a wave
		{8, 4096, 4096, backend.BF16, false, 3},   // o
		{8, 12288, 4096, backend.BF16, true, 1},   // gate/up: 768 tiles
		{8, 4096, 12288, backend.BF16, false, 3},  // down
		{4, 151936, 4096, backend.BF16, false, 1}, // LM head
		{8, 64, 512, backend.BF16, false, 2},      // at most one split per 256 columns
		{2, 4096, 4096, backend.BF16, false, 0},   // the GEMV's
		{9, 4096, 4096, backend.BF16, false, 0},   // cuBLASLt's
		{8, 4096, 4000, backend.BF16, false, 0},   // columns not whole tiles
		{8, 4096, 4096, backend.F16, false, 0},    // not bf16
	} {
		if got := b.skinnySplits(c.n, c.o, c.in, c.dt, c.swiglu); got != c.want {
			t.Errorf("skinnySplits(%d, %d, %d, %v, swiglu=%v) = %d, want %d", c.n, c.o, c.in, c.dt, c.swiglu, got, c.want)
		}
	}
	var cover skinnyCover
	cover.add("cublasLt", 3)
	cover.add("skinny", 0)
	cover.add("skinny", 1)
	if cover.split || !cover.whole {
		t.Errorf("cover %+v after one whole skinny case", cover)
	}
}

// TestDeltaNet runs Gated DeltaNet steps (CausalConv1d, then
// GatedDeltaRule on its output) on both backends: sequences that start,
// continue across steps and decode, and prompts long enough for the
// chunked form, several in one step beside short and decoding ones, with
// partial last chunks, continuing from the state of earlier chunked and
// recurrent steps (steps of few tokens a sequence take the conv in one
// pass, dn_conv_step); at Qwen3-Next's head shape (HK 16, HV 32, dk = dv = 128)
// and a small one. The value heads' gates run from slow (exp(g) ~ 0.995 a
// token) to fast (~ 0.5), so that the state carried across chunks and steps
// shows in the outputs. Some steps capture states (backend.Capture) inside
// and at the edge of chunks, in a few tokens' step and beside other
// sequences, into slots no sequence uses. Outputs and the saved states
// (the captures' too) must match, and the chunked kernels must have taken
// every segment of spec.Chunk tokens or more (captures end segments).
func TestDeltaNet(t *testing.T) {
	p := newPair(t, 9)
	for _, sp := range []backend.DeltaNetSpec{
		{KeyHeads: 2, ValueHeads: 4, KeyDim: 16, ValueDim: 16, ConvKernel: 4, Chunk: 8},
		{KeyHeads: 16, ValueHeads: 32, KeyDim: 128, ValueDim: 128, ConvKernel: 4, Chunk: 64},
		{KeyHeads: 2, ValueHeads: 4, KeyDim: 16, ValueDim: 16, ConvKernel: 4, Chunk: 8, TiledHeads: true}, // Qwen3.5 GGUF files
	} {
		const layers, slots = 2, 8 // slots 5-7: captures only
		ss := backend.StateSpec{Layers: layers, Slots: slots, DeltaNet: sp}
		cst, err := p.c.NewStateCache(ss)
		if err != nil {
			t.Fatal(err)
		}
		gst, err := p.g.NewStateCache(ss)
		if err != nil {
			t.Fatal(err)
		}
		// The fused layer (DeltaNet) on a state cache of its own.
		fst, err := p.g.NewStateCache(ss)
		if err != nil {
			t.Fatal(err)
		}
		CD, HV, vdim := sp.ConvDim(), sp.ValueHeads, sp.ValueHeads*sp.ValueDim
		var w [layers]struct{ c, g backend.DeltaNetWeights }
		for l := range w {
			w[l].c.Conv, w[l].g.Conv = p.load(backend.BF16, p.randn(CD*sp.ConvKernel, 0.5), CD, sp.ConvKernel)
			aLog := p.randn(HV, 0.3)
			for h := range aLog {
				aLog[h] += -5 + 5*float32(h)/float32(HV)
			}
			w[l].c.ALog, w[l].g.ALog = p.load(backend.F32, aLog, HV)
			w[l].c.DtBias, w[l].g.DtBias = p.load(backend.BF16, p.randn(HV, 0.5), HV)
			w[l].c.Norm, w[l].g.Norm = p.load(backend.BF16, p.randn(sp.ValueDim, 1), sp.ValueDim)
			w[l].c.NormEps, w[l].g.NormEps = 1e-6, 1e-6
		}
		// Each step: new tokens per slot (0: the slot sits the step out),
		// and whether that slot starts over at position 0.
		pos := make([]int, slots)
		chunked := 0 // (sequence, layer) pairs for the chunked kernels
		tol := 1e-4  // until a chunked step: its bf16 hi + lo products keep ~1e-5
		// The captures of steps 3, 5 and 6 by sequence.
		captures := map[int]map[int][]backend.Capture{
			3: {0: {{Offset: 5, Slot: 5}, {Offset: 64, Slot: 6}}, 3: {{Offset: 100, Slot: 7}}},
			5: {1: {{Offset: 7, Slot: 6}}},
			6: {2: {{Offset: 70, Slot: 5}}},
		}
		for i, step := range [][]int{
			{0, 0, 0, 2, 0}, // up to dnConvStepTokens a sequence: dn_conv_step
			{100, 3, 1, 0, 0},
			{1, 70, 1, 5, 0},
			{200, 1, 64, 130, 8},
			{1, 1, 1, 1, 1},
			{3, 16, 0, 2, 9},
			{64, 2, 150, 1, 63},
			{1, 1, 1, 1, 1},
		} {
			var b backend.Batch
			for s, n := range step {
				if n == 0 {
					continue
				}
				caps := captures[i][s]
				b.Seqs = append(b.Seqs, backend.SeqInfo{Pos: pos[s], N: n, Blocks: []int32{0}, Slot: s, Captures: caps})
				for range n {
					b.Tokens = append(b.Tokens, 0)
				}
				from := 0
				for j := 0; j <= len(caps); j++ {
					to := n
					if j < len(caps) {
						to = caps[j].Offset
					}
					if to-from >= sp.Chunk {
						chunked += layers
						tol = 5e-4
					}
					from = to
				}
			}
			T := len(b.Tokens)
			p.begin(&b)
			for l := range layers {
				mixed, zs := p.randn(T*CD, 1), p.randn(T*vdim, 1)
				cm, gm := p.load(backend.F32, mixed, T, CD)
				cb, gb := p.load(backend.F32, p.randn(T*2*HV, 1), T, 2*HV)
				cx, gx := p.out(T, CD)
				p.c.CausalConv1d(cx, cm, w[l].c.Conv, cst, l)
				p.g.CausalConv1d(gx, gm, w[l].g.Conv, gst, l)
				p.compare(fmt.Sprintf("causal conv %+v step %v layer %d", sp, step, l), cx, gx, 1e-5)
				co, gout := p.out(T, vdim)
				p.c.GatedDeltaRule(co, cx, cb, w[l].c.ALog, w[l].c.DtBias, &sp, cst, l)
				p.g.GatedDeltaRule(gout, gx, gb, w[l].g.ALog, w[l].g.DtBias, &sp, gst, l)
				p.compare(fmt.Sprintf("delta rule %+v step %v layer %d", sp, step, l), co, gout, tol)
				// The fused layer against the CPU's three steps: z apart in
				// layer 0, after the conv inputs of each row in layer 1.
				cz, gz := p.load(backend.F32, zs, T, vdim)
				cg, gg := p.out(T, vdim)
				p.c.GatedRMSNorm(cg, co, cz, w[l].c.Norm, w[l].c.NormEps)
				if l == 0 {
					p.g.DeltaNet(gg, gm, gz, gb, &w[l].g, &sp, fst, l)
				} else {
					qkvz := make([]float32, 0, T*(CD+vdim))
					for i := range T {
						qkvz = append(append(qkvz, mixed[i*CD:(i+1)*CD]...), zs[i*vdim:(i+1)*vdim]...)
					}
					_, gq := p.load(backend.F32, qkvz, T, CD+vdim)
					p.g.DeltaNet(gg, gq, nil, gb, &w[l].g, &sp, fst, l)
				}
				p.compare(fmt.Sprintf("fused layer %+v step %v layer %d", sp, step, l), cg, gg, tol)
			}
			for s, n := range step {
				pos[s] += n
			}
		}
		for _, st := range []backend.StateCache{gst, fst} {
			if got := st.(*stateCache).chunked; got != chunked {
				t.Errorf("%+v: the chunked kernels ran %d (sequence, layer) pairs, want %d", sp, got, chunked)
			}
		}
		for s := range slots {
			cb := make([]byte, cst.SlotBytes())
			if err := cst.Save(s, cb); err != nil {
				t.Fatal(err)
			}
			for i, st := range []backend.StateCache{gst, fst} {
				gb := make([]byte, st.SlotBytes())
				if err := st.Save(s, gb); err != nil {
					t.Fatal(err)
				}
				if e := relL2(reference.DecodeF32(gb), reference.DecodeF32(cb)); !(e <= tol) {
					t.Errorf("%+v slot %d (fused %v): saved state relative L2 %.3g", sp, s, i == 1, e)
				} else {
					t.Logf("%+v slot %d (fused %v): saved state relative L2 %.3g", sp, s, i == 1, e)
				}
			}
		}
		// A restored slot continues as the original would.
		state := make([]byte, gst.SlotBytes())
		if err := gst.Save(1, state); err != nil {
			t.Fatal(err)
		}
		// From pageable memory through the staging buffer, and straight
		// from page-locked memory.
		locked, err := p.g.HostBuffer(len(state))
		if err != nil {
			t.Fatal(err)
		}
		copy(locked, state)
		for _, src := range [][]byte{state, locked} {
			gst.Restore(3, src)
			gst.CopySlot(2, 3)
			got := make([]byte, gst.SlotBytes())
			if err := gst.Save(2, got); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, state) {
				t.Errorf("%+v: slot 1 restored into 3 (page-locked: %v) and copied to 2 differs", sp, p.g.pageLocked(src))
			}
			gst.Restore(3, make([]byte, len(state)))
		}
		cst.Free()
		gst.Free()
		fst.Free()
	}
}

// TestKVBlocksSaveRestore: blocks written with RestoreBlocks, from pageable
// memory (in batches through the staging buffer) and from page-locked
// memory, read back with SaveBlocks as the CPU backend's do, and CopyBlock
// copies what they hold.
func TestKVBlocksSaveRestore(t *testing.T) {
	p := newPair(t, 12)
	spec := backend.KVSpec{Layers: 4, Blocks: 320, BlockSize: 16, KVHeads: 8, HeadDim: 128, DType: backend.BF16}
	g, err := p.g.NewKVCache(spec)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Free()
	c, err := p.c.NewKVCache(spec)
	if err != nil {
		t.Fatal(err)
	}
	blocks := make([]int, 300) // more than one 16 MiB batch
	for i := range blocks {
		blocks[i] = (7 * i) % spec.Blocks
	}
	for _, locked := range []bool{false, true} {
		saveRestore(t, p, g, c, blocks, locked)
	}
}

func saveRestore(t *testing.T, p *pair, g, c backend.KVCache, blocks []int, locked bool) {
	spec := g.Spec()
	src := make([]byte, len(blocks)*spec.BlockBytes())
	if locked {
		var err error
		if src, err = p.g.HostBuffer(len(src)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range src {
		src[i] = byte(p.r.IntN(256))
	}
	for _, kv := range []backend.KVCache{g, c} {
		if err := kv.RestoreBlocks(blocks, src); err != nil {
			t.Fatal(err)
		}
	}
	// A block none of the restored ones is, as the copy's destination.
	dst := 0
	for slices.Contains(blocks, dst) {
		dst++
	}
	g.CopyBlock(dst, blocks[5])
	c.CopyBlock(dst, blocks[5])
	back := append(slices.Clone(blocks), dst)
	gb := make([]byte, len(back)*spec.BlockBytes())
	cb := make([]byte, len(gb))
	if err := g.SaveBlocks(back, gb); err != nil {
		t.Fatal(err)
	}
	if err := c.SaveBlocks(back, cb); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(gb, cb) || !slices.Equal(gb[:len(src)], src) || !slices.Equal(gb[len(src):], src[5*spec.BlockBytes():6*spec.BlockBytes()]) {
		t.Fatalf("the blocks read back (page-locked source: %v) differ from those written, or from the CPU backend's", locked)
	}
}
