//go:build cgo

package cuda

import (
	"fmt"

	"github.com/kiln-llm/kiln/backend"
)

// Products with block-quantized weights (kernels/quant.cu; the device
// layout is in qlayout.go).
//
// Up to qmvMaxTokens tokens (decode) a product is qmv: the weights are
// dequantized in registers and multiplied on tensor cores, the tokens as
// the mma's rows, so that the kernel streams the quantized bytes once
// whatever the token count; qmv_swiglu does the gate/up product of an MLP
// and its SwiGLU in one pass, and both take a mixture of experts' rows one
// expert each (sel). Above that the weight is dequantized to bf16, qSlab
// elements at a time, and multiplied by cuBLASLt; the grouped expert
// products dequantize the experts that have rows, a slab of experts at a
// time, for moe_group_mm.

// qmvMaxTokens is the largest token count of the quantized decode kernels
// (two groups of the mma's 16 rows); KILN_CUDA_QMV_MAX lowers it (0:
// always dequantize and use cuBLASLt). Up to it a step reads the quantized
// weights once; above it dequantizing them for cuBLASLt costs less than
// the products on mma.sync. H100, Qwen3-8B shapes (12 layers), decode
// tok/s dequantizing against qmv: FP8 batch 16 841 -> 1886 (36 layers),
// batch 24 3450 -> 4459, batch 32 4528 -> 5850; Q4_K 690 -> 1459, 2869 ->
// 3302, 3779 -> 4355; at 64 qmv lost (FP8 2874 -> 2315).
const qmvMaxTokens = 32

// qmvName is the qmv kernel that takes n tokens (qmv_ also takes expert
// rows, n 0): kernels of 8, 16 and 32 tokens.
func qmvName(swiglu bool, dt backend.DType, n int) string {
	pre := "qmv_"
	switch {
	case n > 16:
		pre = "qmv32_"
	case n > 8:
		pre = "qmv16_"
	}
	if swiglu {
		pre += "swiglu_"
	}
	return pre + dt.String()
}

// qSlabElems bounds the bf16 scratch of a dequantized weight (64 MiB).
const qSlabElems = 32 << 20

// qUnitCols is the columns one lane of qmv dequantizes at a time (Q in
// kernels/quant.cu).
func qUnitCols(dt backend.DType) int {
	switch dt {
	case backend.Q4_K, backend.Q5_K, backend.Q6_K:
		return 64
	}
	return 32
}

// qmvFits reports whether qmv takes rows of cols elements of dt: whole
// units (only FP8 rows may end inside one).
func qmvFits(dt backend.DType, cols int) bool { return cols%qUnitCols(dt) == 0 }

// qmvWarps is the warps of a qmv block for rows of cols elements of dt
// (KILN_CUDA_QMV_WARPS: at most that many). They split each row's units in
// groups of four (one a lane); each warp takes four groups or more while
// there are enough, so that its lanes stream several units in a row (a
// warp's loads start at once; the ring keeps them going).
func (b *Backend) qmvWarps(dt backend.DType, cols int) int {
	groups := (cols/qUnitCols(dt) + 3) / 4
	return max(1, min(b.qmvWarpsMax, (groups+3)/4))
}

// checkFloatW panics unless each weight is of a float type: the quantized
// types are read by the products, MLP, MoE experts and Embed only.
func checkFloatW(what string, ts ...*tensor) {
	for _, t := range ts {
		if t.dt.Quantized() {
			panic(fmt.Sprintf("cuda: %s: weight %v is quantized; only the linear layers, experts and the token embedding may be", what, t))
		}
	}
}

// qmv launches the quantized decode product: out[t, o] (+)= x[t] . w_o for
// T <= qmvMaxTokens tokens, or with sel the R rows of a mixture of experts, out[r, o]
// = x[r / xdiv] . w[sel[r]]_o with experts estride bytes apart; with
// swiglu, w is [gate | up] of 2O rows and out = silu(gate) * up. x is bf16
// ([., I], 16-byte aligned, see qx), out f32 or bf16.
func (b *Backend) qmv(swiglu bool, out devptr, odt backend.DType, x devptr, T, xdiv int, w *tensor, estride int, sel devptr, R, O, I int, accumulate bool) {
	if !qmvFits(w.dt, I) || w.qcols() != I {
		panic(fmt.Sprintf("cuda: qmv of %v with rows of %d", w, I))
	}
	outs, name := 8, qmvName(swiglu, w.dt, T)
	if swiglu {
		outs = 4
	}
	if sel != 0 {
		name = qmvName(swiglu, w.dt, 0)
	}
	grid := [3]int{(O + outs - 1) / outs, max(R, 1), 1}
	a := []any{out, int(odt), x, T, xdiv, w.ptr, int64Arg(w.rb()), int64Arg(estride), sel, O, I}
	if !swiglu {
		a = append(a, boolInt(accumulate))
	}
	block := 32 * b.qmvWarps(w.dt, I)
	if sel == 0 {
		b.runOverlapped(name, grid, block, 0, a...)
		return
	}
	// Expert rows read sel, written by the kernel before.
	b.run(name, grid, block, 0, a...)
}

// qx returns x as bf16 at a 16-byte aligned address: x itself, or a
// converted copy in scratch memory.
func (b *Backend) qx(xt *tensor) devptr {
	if xt.dt == backend.BF16 && xt.ptr%16 == 0 {
		return xt.ptr
	}
	n := xt.numel()
	xp := b.scratchBuf("productx", 2*n)
	if xt.dt == backend.F32 {
		b.run("to_half", g1(b.blocksFor(n)), 256, 0, xp, xt.ptr, int64Arg(n), int(backend.BF16))
	} else {
		b.run("cast", g1(b.blocksFor(n)), 256, 0, xp, int(backend.BF16), xt.ptr, int(xt.dt), int64Arg(n))
	}
	return xp
}

// qdeq writes rows [row0, row0 + rows) of the quantized w as bf16 rows of
// in elements at out. With start (moe_group's expert row ranges), rows of
// experts without any (token, choice) row are skipped: row r is expert e0
// + r / epr's.
func (b *Backend) qdeq(out devptr, w *tensor, row0, rows, in int, start devptr, e0, epr int) {
	units := (in + qUnitCols(w.dt) - 1) / qUnitCols(w.dt)
	b.run("qdeq_"+w.dt.String(), g1(b.blocksFor(rows*units)), 256, 0,
		out, w.ptr+devptr(row0*w.rb()), int64Arg(w.rb()), int64Arg(rows), in, start, e0, epr)
}

// qgemm computes out[n, o] (+)= x[n, in] . w[o, in]^T through cuBLASLt,
// the weight dequantized to bf16 in slabs of at most qSlab elements
// (rows a multiple of 64); x is bf16, out f32 (written or added to) or
// bf16.
func (b *Backend) qgemm(out devptr, odt backend.DType, x devptr, w *tensor, n, o, in int, accumulate bool) {
	rows := o
	if o*in > b.qSlab {
		rows = max(64, b.qSlab/in/64*64)
	}
	for o0 := 0; o0 < o; o0 += rows {
		m := min(rows, o-o0)
		buf := b.scratchBuf("qdeq", 2*m*in)
		b.qdeq(buf, w, o0, m, in, 0, 0, 0)
		b.gemmLd(out+devptr(o0*odt.Size()), x, buf, n, m, in, o, backend.BF16, odt, accumulate)
	}
}

// qmatmul is MatMul with a quantized weight.
func (b *Backend) qmatmul(ot, xt, wt *tensor, accumulate bool) {
	n, in, o := xt.rows(), xt.cols(), wt.rows()
	if b.fp8Gemm(wt, xt, n, in, o) {
		b.fp8gemm(ot.ptr, ot.dt, xt, wt, n, o, in, accumulate)
		return
	}
	if n <= b.qmvMax && qmvFits(wt.dt, in) {
		b.qmv(false, ot.ptr, ot.dt, b.qx(xt), n, 1, wt, 0, 0, 0, o, in, accumulate)
		return
	}
	b.qgemm(ot.ptr, ot.dt, b.productInput(xt, backend.BF16), wt, n, o, in, accumulate)
}

// qmlp is the MLP with a quantized gate/up weight, or reports false for
// the general path: an FP8 weight on Hopper takes the block-scaled GEMM
// from four tokens (fp8.go), a few tokens take qmv_swiglu, more the dequantized
// product through cuBLASLt (bf16 out, as the bf16 path) and silu_mul_bf16;
// the down product is a MatMul of the bf16 activation.
func (b *Backend) qmlp(ot, xt, gu, dn *tensor, accumulate bool) bool {
	n, H := xt.rows(), xt.cols()
	I := dn.cols()
	act := &tensor{dt: backend.BF16, shape: []int{n, I}, view: true}
	switch {
	case b.fp8Gemm(gu, xt, n, H, 2*I) && I%8 == 0:
		h := b.scratchBuf("mlp.gu", 2*n*2*I)
		act.ptr = b.scratchBuf("mlp.act", 2*n*I)
		b.fp8gemm(h, backend.BF16, xt, gu, n, 2*I, H, false)
		b.run("silu_mul_bf16", g1(b.blocksFor(n*I/8)), 256, 0, act.ptr, h, n, I)
	case n <= b.qmvMax && qmvFits(gu.dt, H):
		act.ptr = b.scratchBuf("mlp.act", 2*n*I)
		b.qmv(true, act.ptr, backend.BF16, b.qx(xt), n, 1, gu, 0, 0, 0, I, H, false)
	case I%8 == 0:
		h := b.scratchBuf("mlp.gu", 2*n*2*I)
		act.ptr = b.scratchBuf("mlp.act", 2*n*I)
		b.qgemm(h, backend.BF16, b.productInput(xt, backend.BF16), gu, n, 2*I, H, false)
		b.run("silu_mul_bf16", g1(b.blocksFor(n*I/8)), 256, 0, act.ptr, h, n, I)
	default:
		return false
	}
	b.MatMul(ot, act, dn, accumulate)
	return true
}
