//go:build cgo

package cuda

import (
	"fmt"
	"os"
	"strconv"

	"github.com/kiln-llm/kiln/backend"
)

// run launches kernel name on the stream; a launch error is kept for Sync.
func (b *Backend) run(name string, grid [3]int, block, smem int, vs ...any) {
	b.launchKernel(name, false, grid, block, smem, vs...)
}

// runOverlapped launches a kernel that calls pdl_wait before it touches
// memory that other kernels write or read: with b.pdl it may start while
// the previous kernel finishes (programmatic dependent launch).
func (b *Backend) runOverlapped(name string, grid [3]int, block, smem int, vs ...any) {
	b.launchKernel(name, b.pdl, grid, block, smem, vs...)
}

func (b *Backend) launchKernel(name string, pdl bool, grid [3]int, block, smem int, vs ...any) {
	if grid[0] == 0 || grid[1] == 0 || grid[2] == 0 {
		return
	}
	var a args
	a.add(vs...)
	if b.trace != nil {
		b.trace(name)
	}
	label := name
	if b.prof != nil {
		label = fmt.Sprintf("%s %v", name, grid) // the grid tells the calls of a kernel apart
	}
	b.around(label, func() { b.fail(launch(b.k.get(name), grid, block, smem, b.stream, &a, pdl)) })
}

// gemm runs out[n,m] (+)= x[n,k] . w[m,k]^T through cuBLASLt (x in w's
// type, out of type ot).
func (b *Backend) gemm(out, x, w devptr, n, m, k int, wt, ot backend.DType, accumulate bool) {
	b.gemmLd(out, x, w, n, m, k, m, wt, ot, accumulate)
}

// gemmLd is gemm with out's rows ldc elements apart.
func (b *Backend) gemmLd(out, x, w devptr, n, m, k, ldc int, wt, ot backend.DType, accumulate bool) {
	if b.trace != nil {
		b.trace("cublasLt")
	}
	label := "cublasLt"
	if b.prof != nil {
		label = fmt.Sprintf("cublasLt %dx%d", m, k)
	}
	b.around(label, func() { b.fail(b.lt.matmul(b.stream, out, x, w, n, m, k, ldc, wt, ot, accumulate)) })
}

func g1(n int) [3]int { return [3]int{n, 1, 1} }

// blocksFor is a grid-stride launch size for n elements.
func (b *Backend) blocksFor(n int) int { return max(1, min((n+255)/256, 8*b.sms)) }

func checkRows(what string, t *tensor, rows, cols int) {
	if t.rows() != rows || t.cols() != cols {
		panic(fmt.Sprintf("cuda: %s is %v, want [%d, %d]", what, t, rows, cols))
	}
}

func checkF32(what string, ts ...*tensor) {
	for _, t := range ts {
		if t.dt != backend.F32 {
			panic(fmt.Sprintf("cuda: %s: %v must be f32", what, t))
		}
	}
}

// checkAct panics unless each tensor is f32 or bf16 (ActivationType).
func checkAct(what string, ts ...*tensor) {
	for _, t := range ts {
		if t.dt != backend.F32 && t.dt != backend.BF16 {
			panic(fmt.Sprintf("cuda: %s: %v must be f32 or bf16", what, t))
		}
	}
}

// hx is the suffix of the GEMV kernels that read bf16 activations.
func hx(x *tensor) string {
	if x.dt == backend.BF16 {
		return "_hx"
	}
	return ""
}

// Embed writes out[t] = table[Tokens[t]].
func (b *Backend) Embed(out, table backend.Tensor) {
	ot, tt := asT(out), asT(table)
	T, V, H := b.meta.T, tt.rows(), tt.cols()
	checkRows("embed out", ot, T, H)
	checkF32("embed", ot)
	for _, tok := range b.meta.host[mTokens] {
		if tok < 0 || int(tok) >= V {
			panic(fmt.Sprintf("cuda: embed: token %d outside vocabulary of %d", tok, V))
		}
	}
	if tt.dt.Quantized() {
		// The looked-up rows dequantized as the reference does.
		b.run("qembed_"+tt.dt.String(), g1(T), 256, 0, ot.ptr, tt.ptr, int64Arg(tt.rb()), b.meta.dev[mTokens], H)
		return
	}
	b.run("embed", g1(T), 256, 0, ot.ptr, tt.ptr, int(tt.dt), b.meta.dev[mTokens], H)
}

func normBlock(n int) int {
	switch {
	case n >= 4096:
		return 1024
	case n >= 1024:
		return 512
	}
	return 128
}

// RMSNorm normalises each row of x; out may alias x.
func (b *Backend) RMSNorm(out, x, w backend.Tensor, eps float32, unitOffset bool) {
	ot, xt, wt := asT(out), asT(x), asT(w)
	n, h := xt.rows(), xt.cols()
	checkRows("rmsnorm out", ot, n, h)
	checkF32("rmsnorm", xt)
	checkAct("rmsnorm", ot)
	checkFloatW("rmsnorm", wt)
	if wt.numel() != h {
		panic(fmt.Sprintf("cuda: rmsnorm weight %v for rows of %d", wt, h))
	}
	// Rows of up to 8192 floats, 16-byte aligned: one read into registers.
	if h%4 == 0 && h <= 8*1024 && ot.ptr%16 == 0 && xt.ptr%16 == 0 {
		v4 := 1
		for 256*4*v4 < h {
			v4 *= 2
		}
		b.run(fmt.Sprintf("rmsnorm_v4_%d", v4), g1(n), 256, 0, ot.ptr, int(ot.dt), xt.ptr, wt.ptr, int(wt.dt), h, eps, boolInt(unitOffset))
		return
	}
	b.run("rmsnorm", g1(n), normBlock(h), 0, ot.ptr, int(ot.dt), xt.ptr, wt.ptr, int(wt.dt), h, eps, boolInt(unitOffset))
}

func boolInt(v bool) int {
	if v {
		return 1
	}
	return 0
}

// GatedRMSNorm computes out = w * rmsnorm(x) * silu(z) per head.
func (b *Backend) GatedRMSNorm(out, x, z, w backend.Tensor, eps float32) {
	ot, xt, zt, wt := asT(out), asT(x), asT(z), asT(w)
	n, width := xt.rows(), xt.cols()
	dim := wt.numel()
	if dim == 0 || width%dim != 0 {
		panic(fmt.Sprintf("cuda: gated rmsnorm: x %v is not whole heads of %d", xt, dim))
	}
	checkRows("gated rmsnorm out", ot, n, width)
	checkRows("gated rmsnorm z", zt, n, width)
	checkF32("gated rmsnorm", ot, xt, zt)
	checkFloatW("gated rmsnorm", wt)
	b.run("gated_rmsnorm", g1(n*width/dim), normBlock(dim), 0, ot.ptr, xt.ptr, zt.ptr, wt.ptr, int(wt.dt), dim, eps)
}

// siluMul computes out = silu(gate) * up for gateUp [N, 2I] = [gate | up].
func (b *Backend) siluMul(out, gateUp *tensor) {
	n, I := gateUp.rows(), gateUp.cols()/2
	b.run("silu_mul", g1(b.blocksFor(n*I)), 256, 0, out.ptr, gateUp.ptr, n, I)
}

// MLP adds to out the SwiGLU feed-forward of x; see backend.Backend.
func (b *Backend) MLP(out, x, gateUp, down backend.Tensor) {
	b.mlp(asT(out), asT(x), asT(gateUp), asT(down), true)
}

// mlp writes (or adds, when accumulate) down(silu(gate(x)) * up(x)) to out.
// A few tokens take the GEMV with the activation fused in; more take
// cuBLASLt with bf16 in and out around a bf16 activation, where
// transformers rounds too.
func (b *Backend) mlp(ot, xt, gu, dn *tensor, accumulate bool) {
	n, H := xt.rows(), xt.cols()
	I := dn.cols()
	if gu.rows() != 2*I || gu.cols() != H || dn.rows() != H {
		panic(fmt.Sprintf("cuda: mlp x %v, gate_up %v, down %v", xt, gu, dn))
	}
	checkRows("mlp out", ot, n, H)
	checkF32("mlp", ot)
	checkAct("mlp", xt)
	if n == 0 {
		return
	}
	if gu.dt.Quantized() && b.qmlp(ot, xt, gu, dn, accumulate) {
		return
	}
	if gu.dt == backend.BF16 && n <= b.gemvMax && H%8 == 0 {
		act := b.scratchF32("mlp.act", n, I)
		w := b.gemvWarps
		b.runOverlapped(fmt.Sprintf("gemv_swiglu_bf16_%d%s", n, hx(xt)), g1((I+w-1)/w), 32*w, 0, act.ptr, xt.ptr, gu.ptr, I, H)
		b.MatMul(ot, act, dn, accumulate)
		return
	}
	if S := b.skinnySplits(n, I, H, gu.dt, true); S > 0 && dn.dt == backend.BF16 && xt.ptr%16 == 0 && gu.ptr%16 == 0 && dn.ptr%16 == 0 {
		act := b.scratchBuf("mlp.act", 2*n*I)
		b.skinny(true, S, act, backend.BF16, b.productInput(xt, gu.dt), gu.ptr, n, I, H, false)
		if S := b.skinnySplits(n, H, I, dn.dt, false); S > 0 {
			b.skinny(false, S, ot.ptr, backend.F32, act, dn.ptr, n, H, I, accumulate)
		} else {
			b.gemm(ot.ptr, act, dn.ptr, n, H, I, dn.dt, backend.F32, accumulate)
		}
		return
	}
	if gu.dt == backend.BF16 && dn.dt == backend.BF16 && I%8 == 0 {
		xp := b.productInput(xt, gu.dt)
		h := b.scratchBuf("mlp.gu", 2*n*2*I)
		act := b.scratchBuf("mlp.act", 2*n*I)
		b.gemm(h, xp, gu.ptr, n, 2*I, H, gu.dt, gu.dt, false)
		b.run("silu_mul_bf16", g1(b.blocksFor(n*I/8)), 256, 0, act, h, n, I)
		b.gemm(ot.ptr, act, dn.ptr, n, H, I, dn.dt, backend.F32, accumulate)
		return
	}
	h, act := b.scratchF32("mlp.gu", n, 2*I), b.scratchF32("mlp.act", n, I)
	b.MatMul(h, xt, gu, false)
	b.siluMul(act, h)
	b.MatMul(ot, act, dn, accumulate)
}

// CopyCols writes x into columns [col, col+w) of out.
func (b *Backend) CopyCols(out, x backend.Tensor, col int) {
	ot, xt := asT(out), asT(x)
	n, w, W := xt.rows(), xt.cols(), ot.cols()
	if ot.rows() != n || xt.dt != ot.dt || col < 0 || col+w > W {
		panic(fmt.Sprintf("cuda: copy cols: out %v, x %v at column %d", ot, xt, col))
	}
	if n == 0 {
		return
	}
	u := xt.dt.Size() / 2
	b.run("copy_cols", g1(n), 256, 0, ot.ptr, xt.ptr, W*u, w*u, col*u)
}

// GatherRows writes out[r] = x[LogitRows[r]] for the current batch.
func (b *Backend) GatherRows(out, x backend.Tensor) {
	ot, xt := asT(out), asT(x)
	R, h := b.meta.R, xt.cols()
	checkRows("gather rows out", ot, R, h)
	checkF32("gather rows", ot, xt)
	for _, r := range b.meta.host[mRows] {
		if int(r) >= xt.rows() {
			panic(fmt.Sprintf("cuda: gather rows: row %d of %v", r, xt))
		}
	}
	b.run("gather_rows", g1(R), 256, 0, ot.ptr, xt.ptr, b.meta.dev[mRows], h)
}

// gemvMaxTokens is the largest token count served by the GEMV kernel by
// default; larger batches go to cuBLASLt, whose tensor-core tiles win once
// the weights are reused by a few rows (each extra row costs the CUDA-core
// kernel another pass over the activations). KILN_CUDA_GEMV_MAX overrides
// it (0 to 8).
const gemvMaxTokens = 2

// skinnyMaxTokens is the largest token count of the tensor-core skinny
// GEMM (kernels/skinny.cu): above the GEMV's count and up to this one, bf16
// products whose inner width is a multiple of skinnyCols take it instead of
// cuBLASLt (H100 decode steps: 3 and 4 tokens +3.5%, 8 tokens +0 to 1.8%;
// at 16 it lost, see NOTES.md).
// KILN_CUDA_SKINNY_MAX lowers it (0: off).
const skinnyMaxTokens = 8

// The skinny GEMM's tile (kernels/skinny.cu): SK_BM rows by SK_BK columns,
// and its shared memory, SK_STAGES stages of SK_BM + SK_TOK rows of SK_BK +
// 8 bf16.
const (
	skinnyRows = 32
	skinnyCols = 256
	skinnySmem = 3 * (skinnyRows + 8) * (skinnyCols + 8) * 2
)

// skinnySplits returns how many blocks split the inner dimension of a
// skinny GEMM of n tokens by o outputs (o gate and o up rows with swiglu)
// by in, or 0 when the product is not one for it. A tile is skinnyRows
// weight rows (half as many outputs with swiglu); when the tiles leave a
// wave of blocks unfilled, the inner dimension is split over as many
// blocks as fill it.
func (b *Backend) skinnySplits(n, o, in int, wdt backend.DType, swiglu bool) int {
	if wdt != backend.BF16 || n <= b.gemvMax || n > b.skinnyMax || in%skinnyCols != 0 {
		return 0
	}
	rows := skinnyRows
	if swiglu {
		rows /= 2
	}
	return max(1, min(in/skinnyCols, b.skinnyWave()/((o+rows-1)/rows)))
}

// skinnyWave is the number of skinny GEMM blocks the device runs at once
// (1 KB of shared memory a block is the system's).
func (b *Backend) skinnyWave() int { return max(1, b.smemSM/(skinnySmem+1024)) * b.sms }

// skinny computes out[n, o] (+)= x[n, in] . w[o, in]^T (out f32 or bf16),
// or with swiglu out[n, o] = silu(x . gate_o) * (x . up_o) in bf16 for w =
// [gate | up] of 2o rows; x is bf16, the inner dimension split S ways
// (skinnySplits).
func (b *Backend) skinny(swiglu bool, S int, out devptr, odt backend.DType, x, w devptr, n, o, in int, accumulate bool) {
	rows, wrows := skinnyRows, o
	if swiglu {
		rows, wrows = rows/2, 2*o
	}
	var part devptr
	if S > 1 {
		part = b.scratchBuf("skinny.part", 4*S*n*wrows)
	}
	grid := [3]int{(o + rows - 1) / rows, S, 1}
	if swiglu {
		b.allowSmem("skinny_swiglu_bf16", skinnySmem)
		b.runOverlapped("skinny_swiglu_bf16", grid, 128, skinnySmem, out, x, w, n, o, in, part, b.skinnyCnt)
		return
	}
	b.allowSmem("skinny_bf16", skinnySmem)
	b.runOverlapped("skinny_bf16", grid, 128, skinnySmem, out, int(odt), x, w, n, o, in, boolInt(accumulate), part, b.skinnyCnt)
}

func envInt(name string, def, lo, hi int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v >= lo && v <= hi {
		return v
	}
	return def
}

// MatMul computes out[n,o] = sum_i x[n,i] * w[o,i] (+ out when accumulate).
func (b *Backend) MatMul(out, x, w backend.Tensor, accumulate bool) {
	ot, xt, wt := asT(out), asT(x), asT(w)
	n, in := xt.rows(), xt.cols()
	o := wt.rows()
	if wt.cols() != in {
		panic(fmt.Sprintf("cuda: matmul x %v, w %v", xt, wt))
	}
	checkRows("matmul out", ot, n, o)
	checkAct("matmul", ot, xt)
	if accumulate && ot.dt != backend.F32 {
		panic(fmt.Sprintf("cuda: matmul: accumulating into %v", ot))
	}
	if n == 0 {
		return
	}
	if wt.dt.Quantized() {
		b.qmatmul(ot, xt, wt, accumulate)
		return
	}
	if wt.dt == backend.BF16 && n <= b.gemvMax && in%8 == 0 {
		w := b.gemvWarps
		b.runOverlapped(fmt.Sprintf("gemv_bf16_%d%s", n, hx(xt)), g1((o+w-1)/w), 32*w, 0, ot.ptr, int(ot.dt), xt.ptr, wt.ptr, o, in, boolInt(accumulate))
		return
	}
	// The skinny GEMM copies rows in 16-byte pieces.
	if S := b.skinnySplits(n, o, in, wt.dt, false); S > 0 && xt.ptr%16 == 0 && wt.ptr%16 == 0 {
		b.skinny(false, S, ot.ptr, ot.dt, b.productInput(xt, wt.dt), wt.ptr, n, o, in, accumulate)
		return
	}
	xp := b.productInput(xt, wt.dt)
	if ot.dt == backend.F32 || ot.dt == wt.dt {
		b.gemm(ot.ptr, xp, wt.ptr, n, o, in, wt.dt, ot.dt, accumulate)
		return
	}
	// cuBLASLt writes a bf16 product only from bf16 inputs: f32 first.
	f := b.scratchBuf("productout", 4*n*o)
	b.gemm(f, xp, wt.ptr, n, o, in, wt.dt, backend.F32, false)
	b.run("cast", g1(b.blocksFor(n*o)), 256, 0, ot.ptr, int(ot.dt), f, int(backend.F32), int64Arg(n*o))
}

// productInput returns x in the type dt of the weights it meets: x itself
// when it has that type, else a converted copy in scratch memory.
func (b *Backend) productInput(xt *tensor, dt backend.DType) devptr {
	if xt.dt == dt {
		return xt.ptr
	}
	n := xt.numel()
	xp := b.scratchBuf("productx", n*dt.Size())
	if xt.dt == backend.F32 {
		b.run("to_half", g1(b.blocksFor(n)), 256, 0, xp, xt.ptr, int64Arg(n), int(dt))
	} else {
		b.run("cast", g1(b.blocksFor(n)), 256, 0, xp, int(dt), xt.ptr, int(xt.dt), int64Arg(n))
	}
	return xp
}

// int64Arg passes a 64-bit count to a kernel (a long parameter).
type int64Arg int64

// kvCache is the paged cache: per layer, K then V, each [Blocks, BlockSize,
// KVHeads, HeadDim] of f32 or bf16, in one allocation.
type kvCache struct {
	b     *Backend
	spec  backend.KVSpec
	ptr   devptr
	plane int // bytes of one layer's K (or V) pool
}

// NewKVCache allocates a paged KV cache (f32 or bf16) on the device.
func (b *Backend) NewKVCache(spec backend.KVSpec) (backend.KVCache, error) {
	if spec.Layers < 0 || spec.Blocks <= 0 || spec.BlockSize <= 0 || spec.KVHeads <= 0 || spec.HeadDim <= 0 {
		return nil, fmt.Errorf("cuda: kv cache: invalid spec %+v", spec)
	}
	if spec.DType != backend.F32 && spec.DType != backend.BF16 {
		return nil, fmt.Errorf("cuda: kv cache: unsupported dtype %v (want f32 or bf16)", spec.DType)
	}
	if !attnHeadDim(spec.HeadDim) {
		// Refused here, when the model is loaded, rather than by the first
		// attention call.
		return nil, fmt.Errorf("cuda: attention head dim %d is not supported (16, 32, 64, 128 or 256); use --backend cpu", spec.HeadDim)
	}
	plane := spec.Blocks * spec.BlockSize * spec.KVHeads * spec.HeadDim * spec.DType.Size()
	p, err := b.malloc(2 * spec.Layers * plane)
	if err != nil {
		return nil, fmt.Errorf("cuda: kv cache of %d MiB: %w", 2*spec.Layers*plane>>20, err)
	}
	return &kvCache{b: b, spec: spec, ptr: p, plane: plane}, nil
}

func (c *kvCache) Spec() backend.KVSpec { return c.spec }

func (c *kvCache) k(layer int) devptr { return c.ptr + devptr(2*layer*c.plane) }
func (c *kvCache) v(layer int) devptr { return c.ptr + devptr((2*layer+1)*c.plane) }

// CopyBlock copies physical block src to dst in every layer (queued).
func (c *kvCache) CopyBlock(dst, src int) {
	if dst < 0 || src < 0 || dst >= c.spec.Blocks || src >= c.spec.Blocks {
		panic(fmt.Sprintf("cuda: copy block %d to %d of %d", src, dst, c.spec.Blocks))
	}
	bs := c.plane / c.spec.Blocks
	for p := 0; p < 2*c.spec.Layers; p++ {
		base := c.ptr + devptr(p*c.plane)
		c.b.copyDtoD(base+devptr(dst*bs), base+devptr(src*bs), bs)
	}
}

func (c *kvCache) Free() {
	if c.ptr != 0 {
		c.b.fail(c.b.Sync())
		c.b.freePtr(c.ptr)
		c.ptr = 0
	}
}

// attnHeadDim reports whether the attention kernels take head dim hd (each
// is compiled per head dim).
func attnHeadDim(hd int) bool {
	switch hd {
	case 16, 32, 64, 128, 256:
		return true
	}
	return false
}

// Attention runs one attention layer; see backend.Backend.
func (b *Backend) Attention(out, qkv backend.Tensor, w backend.AttnWeights, spec *backend.AttnSpec, kvc backend.KVCache, layer int) {
	ot, qt := asT(out), asT(qkv)
	c, ok := kvc.(*kvCache)
	if !ok {
		panic(fmt.Sprintf("cuda: attention: kv cache of another backend (%T)", kvc))
	}
	m := &b.meta
	T := m.T
	H, KH, hd, rd := spec.Heads, spec.KVHeads, spec.HeadDim, spec.RotaryDim
	if H <= 0 || KH <= 0 || H%KH != 0 || !attnHeadDim(hd) || rd < 0 || rd > hd || rd%2 != 0 || len(spec.Rope.InvFreq) != rd/2 {
		panic(fmt.Sprintf("cuda: attention: invalid or unsupported spec %+v", *spec))
	}
	if c.spec.KVHeads != KH || c.spec.HeadDim != hd || layer < 0 || layer >= c.spec.Layers {
		panic(fmt.Sprintf("cuda: attention: layer %d of cache %+v for spec %+v", layer, c.spec, *spec))
	}
	checkRows("attention qkv", qt, T, spec.QKVWidth())
	checkRows("attention out", ot, T, H*hd)
	checkAct("attention", ot, qt)
	bs := c.spec.BlockSize
	seqN, seqPos := m.host[mSeqN], m.host[mSeqPos]
	for i := range seqN {
		blk := m.host[mBlocks][m.host[mSeqBlk][i]:]
		if i+1 < len(seqN) {
			blk = m.host[mBlocks][m.host[mSeqBlk][i]:m.host[mSeqBlk][i+1]]
		}
		if need := (int(seqPos[i]+seqN[i]) + bs - 1) / bs; len(blk) < need {
			panic(fmt.Sprintf("cuda: attention: sequence %d has %d blocks, needs %d for %d tokens", i, len(blk), need, seqPos[i]+seqN[i]))
		}
		for _, x := range blk {
			if x < 0 || int(x) >= c.spec.Blocks {
				panic(fmt.Sprintf("cuda: attention: sequence %d uses block %d of %d", i, x, c.spec.Blocks))
			}
		}
	}
	if T == 0 {
		return
	}
	var rf [128]float32
	copy(rf[:], spec.Rope.InvFreq)
	qn, kn := asT(w.QNorm), asT(w.KNorm)
	if qn.numel() != hd || kn.numel() != hd || qn.dt != kn.dt {
		panic(fmt.Sprintf("cuda: attention: q/k norms %v %v for head dim %d", qn, kn, hd))
	}
	checkFloatW("attention", qn)
	// The rotated queries, in the cache's type (what the kernels multiply the
	// keys in).
	qbuf := b.scratchBuf("attnq", T*H*hd*c.spec.DType.Size())
	kvdt := int(c.spec.DType)
	// Eight heads a block (one per warp) while that leaves blocks to fill
	// the GPU; a long prompt has enough tokens for a block per token, which
	// makes the token's cos/sin table once instead of once per eight heads.
	hpb := 8
	if T >= 4*b.sms {
		hpb = H + 2*KH
	}
	b.run("qk_norm_rope", [3]int{T, (H + 2*KH + hpb - 1) / hpb, 1}, 256, 0,
		qt.ptr, int(qt.dt), qbuf, c.k(layer), c.v(layer), kvdt, qn.ptr, kn.ptr, int(qn.dt), boolInt(spec.UnitOffsetNorm),
		m.dev[mTokPos], m.dev[mTokSeq], m.dev[mSeqBlk], m.dev[mBlocks],
		H, KH, hd, rd, boolInt(spec.Gated), spec.NormEps, spec.Rope.AttnFactor, bs, hpb, rf[:])

	kn2 := "bf16"
	if c.spec.DType == backend.F32 {
		kn2 = "f32"
	}
	G := H / KH
	// Decode: tensor cores on bf16 caches of head dim 64 or 128 (any group
	// of up to 16 query heads per kv head), else the scalar kernel (f32
	// caches, head dim 256; groups of 1, 2, 4 or 8).
	mma := c.spec.DType == backend.BF16 && (hd == 64 || hd == 128) && G <= 16
	scalar := (hd == 64 || hd == 128 || hd == 256) && (G == 1 || G == 2 || G == 4 || G == 8)
	if (mma || scalar) && m.maxN <= 4 {
		name, perSM, smem := fmt.Sprintf("attn_decode_%s_%d_%d", kn2, hd, G), b.splitBlocks, 0
		if mma {
			// Three stages of 64 keys and values, bf16.
			name, perSM, smem = fmt.Sprintf("attn_decode_mma_%d", hd), b.mmaSplitBlocks, 3*2*64*(hd+8)*2
			b.allowSmem(name, smem)
		}
		// As many splits as fill one wave of blocks: a partial second
		// wave of short splits measured slower (tensor-core kernel, batch
		// 16 at 640 tokens: three splits 2146 tok/s, two 2181-2187; the
		// scalar kernel of f32 caches follows the rule unmeasured).
		S := max(1, min(b.splitMax, perSM*b.sms/(T*KH)))
		pm := b.scratchBuf("attnm", T*H*S*4)
		pl := b.scratchBuf("attnl", T*H*S*4)
		pacc := b.scratchBuf("attnacc", T*H*S*hd*4)
		b.launchKernel(name, b.pdl, [3]int{T, KH, S}, 128, smem,
			qbuf, c.k(layer), c.v(layer), m.dev[mTokPos], m.dev[mTokSeq], m.dev[mSeqPos], m.dev[mSeqBlk], m.dev[mBlocks],
			pm, pl, pacc, H, KH, bs, spec.Scale)
		b.runOverlapped("attn_combine", [3]int{T, H, 1}, 4*hd, 0, ot.ptr, int(ot.dt), pm, pl, pacc, qt.ptr, int(qt.dt), m.dev[mTokPos], H, KH, hd, S, boolInt(spec.Gated))
		return
	}
	if c.spec.DType == backend.BF16 && (hd == 64 || hd == 128 || hd == 256) {
		bq, bk := flashTile(m.maxN)
		if hd == 256 {
			// Qwen3-Next's heads: one tile shape, whose 256-wide
			// accumulators fill the registers (241, no spills).
			bq, bk = 64, 32
		}
		name := fmt.Sprintf("flash_prefill_%d_%d_%d", bq, bk, hd)
		// Two stages of bk keys and values, then the bq queries, bf16.
		smem := (2*2*bk + bq) * (hd + 8) * 2
		if smem > 48<<10 {
			b.allowSmem(name, smem)
		}
		b.run(name, [3]int{H, (m.maxN + bq - 1) / bq, m.S}, 128, smem,
			ot.ptr, int(ot.dt), qbuf, c.k(layer), c.v(layer), qt.ptr, int(qt.dt),
			m.dev[mSeqPos], m.dev[mSeqN], m.dev[mSeqStart], m.dev[mSeqBlk], m.dev[mBlocks],
			H, KH, bs, spec.Scale, boolInt(spec.Gated))
		return
	}
	name := fmt.Sprintf("attn_prefill_%s_%d", kn2, hd)
	smem := 2 * 32 * hd * 4
	if smem > 48<<10 {
		b.allowSmem(name, smem)
	}
	b.run(name, [3]int{(m.maxN + 31) / 32, H, m.S}, 128, smem,
		ot.ptr, int(ot.dt), qbuf, c.k(layer), c.v(layer), qt.ptr, int(qt.dt),
		m.dev[mSeqPos], m.dev[mSeqN], m.dev[mSeqStart], m.dev[mSeqBlk], m.dev[mBlocks],
		H, KH, bs, spec.Scale, boolInt(spec.Gated))
}

// moeRouterGemm is the fewest tokens whose router product runs on tensor
// cores (KILN_CUDA_ROUTER_GEMM overrides it; 0 never).
var moeRouterGemm = envInt("KILN_CUDA_ROUTER_GEMM", 64, 0, 1<<30)

// moeGrouped reports whether R (token, choice) rows over E experts take the
// grouped products: from two rows an expert on average. H100, 16:45 UTC:
// Qwen3-30B-A3B (128 experts) decode batch 64 (four rows an expert) 1457 ->
// 2443 tok/s grouped, prefill 4K 1.85K -> 37.2K; Qwen3-Next (512) batch 64
// (1.25 rows an expert) 4553 per row, 3901 grouped.
func moeGrouped(R, E int) bool { return R >= 2*E }

// The grouped expert products' tile (kernels/moe.cu): MG_BM rows of one
// expert by MG_BN outputs, MG_BK columns a stage.
const (
	moeGroupRows = 64
	moeGroupOuts = 128
	moeGroupCols = 32
)

// flashTile returns the query and key tile of the flash prefill kernel for
// a step whose longest sequence adds maxN tokens (kernels/flash.cu). On an
// H100 (Qwen3-8B shapes, 2026-11-22): prefill of 512 tokens 36.2K tok/s
// with 128 x 64 tiles, 38.9K with 64 x 64, 38.4K with 64 x 32; 1K 38.1K /
// 39.4K / 37.7K; serving's passes of 13 decoding sequences beside three
// 512-token prompts 36.7K / 37.6K / 38.9K, beside one 29.9K / 32.0K /
// 33.1K.
func flashTile(maxN int) (bq, bk int) {
	switch {
	case maxN <= 512:
		return 64, 32
	case maxN <= 1024:
		return 64, 64
	}
	return 128, 64
}

// MoE adds to out [T, H] the mixture of experts applied to x [T, H]: router
// products and the shared expert through MatMul, routing and the chosen
// experts' products in kernels that read expert indices from device memory.
func (b *Backend) MoE(out, x backend.Tensor, e *backend.Experts, spec *backend.MoESpec) {
	ot, xt := asT(out), asT(x)
	T, H := xt.rows(), xt.cols()
	checkRows("moe out", ot, T, H)
	checkF32("moe", ot, xt)
	E, K := spec.Experts, spec.TopK
	router, gu, down := asT(e.Router), asT(e.GateUp), asT(e.Down)
	checkFloatW("moe router", router)
	if E <= 0 || E > 1024 || K <= 0 || K > E || router.rows() != E || router.cols() != H || len(gu.shape) != 3 || len(down.shape) != 3 {
		panic(fmt.Sprintf("cuda: moe: router %v, gate_up %v, down %v for %d experts (top %d) of width %d", router, gu, down, E, K, H))
	}
	I := gu.shape[1] / 2
	if gu.shape[0] != E || gu.shape[2] != H || down.shape[0] != E || down.shape[1] != H || down.shape[2] != I {
		panic(fmt.Sprintf("cuda: moe: gate_up %v, down %v for %d experts of width %d", gu, down, E, H))
	}
	if T == 0 {
		return
	}
	// The router product keeps float32's precision (not cuBLASLt's bf16
	// inputs): a rounding-sized change there can flip the choice of
	// experts. Prompts take it on tensor cores as x = hi + lo, two bf16
	// products accumulated in float32 (~16 bits of x, as the grouped
	// expert products); decode steps take the float32 GEMV. H100, two
	// alternating runs: Qwen3-Next (12 layers) prefill 4K 43.8K/43.6K ->
	// 54.0K/54.1K tok/s, 16K 49.4K/49.5K -> 63.6K/63.6K; Qwen3-30B-A3B 4K
	// 18.8K -> 20.3K.
	logits := b.scratchF32("moe.logits", T, E)
	if moeRouterGemm > 0 && T >= moeRouterGemm && router.dt == backend.BF16 {
		hi, lo := b.scratchBuf("moe.xhi", 2*T*H), b.scratchBuf("moe.xlo", 2*T*H)
		b.run("moe_split", g1(b.blocksFor(T*H)), 256, 0, hi, lo, xt.ptr, int64Arg(T*H))
		b.gemm(logits.ptr, hi, router.ptr, T, E, H, backend.BF16, backend.F32, false)
		b.gemm(logits.ptr, lo, router.ptr, T, E, H, backend.BF16, backend.F32, true)
	} else {
		b.run("moe_gemv", [3]int{(E + 7) / 8, T, 1}, 256, 0, logits.ptr, xt.ptr, 1, router.ptr, int(router.dt), devptr(0), E, H)
	}
	sel := b.scratchBuf("moe.sel", 4*T*K)
	wts := b.scratchBuf("moe.wts", 4*T*K)
	b.run("moe_route", g1(T), 256, 0, logits.ptr, E, K, boolInt(spec.NormTopK), sel, wts)
	R := T * K
	// Each (token, choice) row is a product with its expert's weights: a
	// GEMV per row, or (moeGrouped) tensor-core tiles of one expert's rows,
	// which read an expert's weights once per tile of its rows instead of
	// once per row. Quantized experts take qmv per row (gate/up with the
	// SwiGLU fused), or, grouped, bf16 copies of the experts that have rows
	// (a slab of experts at a time).
	groupable := func(w *tensor) bool { return w.dt == backend.BF16 || w.dt.Quantized() }
	grouped := moeGrouped(R, E) && groupable(gu) && groupable(down) && H%moeGroupCols == 0 && I%moeGroupCols == 0
	if !grouped && (gu.dt.Quantized() && !qmvFits(gu.dt, H) || down.dt.Quantized() && !qmvFits(down.dt, I)) {
		if !groupable(gu) || !groupable(down) || H%moeGroupCols != 0 || I%moeGroupCols != 0 {
			panic(fmt.Sprintf("cuda: moe: experts gate_up %v, down %v: quantized experts need widths that are multiples of %d", gu, down, moeGroupCols))
		}
		grouped = true // FP8 rows that end inside a unit of qmv
	}
	expertProduct := func(y, x devptr, xdiv int, w *tensor, O, in int) {
		b.run("moe_gemv", [3]int{(O + 7) / 8, R, 1}, 256, 0, y, x, xdiv, w.ptr, int(w.dt), sel, O, in)
	}
	if grouped {
		maxTiles := (R+moeGroupRows-1)/moeGroupRows + min(E, R)
		start, order := b.scratchBuf("moe.start", 4*(E+1)), b.scratchBuf("moe.order", 4*R)
		tiles, ntiles := b.scratchBuf("moe.tiles", 8*maxTiles), b.scratchBuf("moe.ntiles", 4)
		b.run("moe_group", g1(1), 1024, 0, sel, R, E, start, order, tiles, ntiles)
		expertProduct = func(y, x devptr, xdiv int, w *tensor, O, in int) {
			xg := b.scratchBuf("moe.xg", 4*R*in) // bf16 hi and lo parts
			b.run("moe_gather", g1(R), 256, 0, xg, x, xdiv, order, in)
			grid := [3]int{(O + moeGroupOuts - 1) / moeGroupOuts, maxTiles, 1}
			if !w.dt.Quantized() {
				b.run("moe_group_mm", grid, 128, 0, y, xg, w.ptr, start, order, tiles, ntiles, O, in, 0, E)
				return
			}
			per := max(1, min(E, b.qSlab/(O*in)))
			for e0 := 0; e0 < E; e0 += per {
				e1 := min(E, e0+per)
				buf := b.scratchBuf("moe.qdeq", 2*(e1-e0)*O*in)
				b.qdeq(buf, w, e0*O, (e1-e0)*O, in, start, e0, O)
				b.run("moe_group_mm", grid, 128, 0, y, xg, buf, start, order, tiles, ntiles, O, in, e0, e1)
			}
		}
	}
	var act *tensor // [R, I], f32 or (qmv_swiglu) bf16
	if !grouped && gu.dt.Quantized() {
		act = &tensor{dt: backend.BF16, shape: []int{R, I}, ptr: b.scratchBuf("moe.act", 2*R*I), view: true}
		b.qmv(true, act.ptr, backend.BF16, b.qx(xt), 1, K, gu, 2*I*gu.rb(), sel, R, I, H, false)
	} else {
		h := b.scratchF32("moe.h", R, 2*I)
		expertProduct(h.ptr, xt.ptr, K, gu, 2*I, H)
		act = b.scratchF32("moe.act", R, I)
		b.siluMul(act, h)
	}
	y := b.scratchF32("moe.y", R, H)
	switch {
	case !grouped && down.dt.Quantized():
		b.qmv(false, y.ptr, backend.F32, b.qx(act), 1, 1, down, H*down.rb(), sel, R, H, I, false)
	case act.dt == backend.BF16:
		// Quantized gate/up before float32 or f16 down weights.
		af := b.scratchF32("moe.actf", R, I)
		b.run("cast", g1(b.blocksFor(R*I)), 256, 0, af.ptr, int(backend.F32), act.ptr, int(backend.BF16), int64Arg(R*I))
		expertProduct(y.ptr, af.ptr, 1, down, H, I)
	default:
		expertProduct(y.ptr, act.ptr, 1, down, H, I)
	}
	var ys, gate devptr
	if e.SharedGateUp != nil {
		sgu, sdown, sg := asT(e.SharedGateUp), asT(e.SharedDown), asT(e.SharedGate)
		Is := sgu.rows() / 2
		if sgu.cols() != H || sgu.rows()%2 != 0 || sdown.rows() != H || sdown.cols() != Is || sg.numel() != H {
			panic(fmt.Sprintf("cuda: moe: shared expert gate_up %v, down %v, gate %v for width %d", sgu, sdown, sg, H))
		}
		g := b.scratchF32("moe.gate", T, 1)
		b.MatMul(g, xt, b.Reshape(sg, 1, H), false)
		so := b.scratchF32("moe.so", T, H)
		b.mlp(so, xt, sgu, sdown, false)
		ys, gate = so.ptr, g.ptr
	}
	b.run("moe_combine", g1(T), 256, 0, ot.ptr, y.ptr, wts, K, H, ys, gate)
}
