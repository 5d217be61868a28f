//go:build cgo

package cuda

import (
	"fmt"

	"github.com/kiln-llm/kiln/backend"
)

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

// gemvTokens is the most tokens of a GEMV kernel (kernels/gemv.cu).
const gemvTokens = 8

// The GEMV kernels by whether they read bf16 activations (the _hx ones)
// and the tokens they take, 1 to gemvTokens.
var (
	gemvKernels       [2][gemvTokens]kernel[gemvArgs]
	gemvSwigluKernels [2][gemvTokens]kernel[gemvSwigluArgs]
)

func init() {
	for hx, suffix := range []string{"", "_hx"} {
		for n := 1; n <= gemvTokens; n++ {
			gemvKernels[hx][n-1] = newKernel[gemvArgs](fmt.Sprintf("gemv_bf16_%d%s", n, suffix))
			gemvSwigluKernels[hx][n-1] = newKernel[gemvSwigluArgs](fmt.Sprintf("gemv_swiglu_bf16_%d%s", n, suffix))
		}
	}
}

type gemvArgs struct {
	out  devptr
	odt  int32
	x, w devptr
	O, I int32
	acc  int32
}

type gemvSwigluArgs struct {
	out, x, w devptr
	O, I      int32
}

// hx is the first index of the GEMV kernels that read x: 1 for bf16
// activations.
func hx(x *tensor) int {
	if x.dt == backend.BF16 {
		return 1
	}
	return 0
}

// MLP adds to out the SwiGLU feed-forward of x; see backend.Backend.
func (b *Backend) MLP(out, x, gateUp, down backend.Tensor) {
	b.mlp(asT(out), asT(x), asT(gateUp), asT(down), true)
}

// checkMLP panics unless out, x, gateUp and down are an MLP's, and returns
// its tokens, hidden and intermediate sizes.
func checkMLP(ot, xt, gu, dn *tensor) (n, H, I int) {
	n, H = xt.rows(), xt.cols()
	I = dn.cols()
	if gu.rows() != 2*I || gu.cols() != H || dn.rows() != H {
		panic(fmt.Sprintf("cuda: mlp x %v, gate_up %v, down %v", xt, gu, dn))
	}
	checkRows("mlp out", ot, n, H)
	checkF32("mlp", ot)
	checkAct("mlp", xt)
	return n, H, I
}

// mlp writes (or adds, when accumulate) down(silu(gate(x)) * up(x)) to out.
// A few tokens take the GEMV with the activation fused in, up to
// skinnyMaxTokens the skinny GEMM with it fused in its epilogue; more take
// cuBLASLt with bf16 in and out around a bf16 activation, where
// transformers rounds too. Quantized weights take qmlp.
func (b *Backend) mlp(ot, xt, gu, dn *tensor, accumulate bool) {
	n, H, I := checkMLP(ot, xt, gu, dn)
	if n == 0 {
		return
	}
	if gu.dt.Quantized() && b.qmlp(ot, xt, gu, dn, accumulate) {
		return
	}
	if gu.dt == backend.BF16 && n <= b.gemvMax && H%8 == 0 {
		act := b.scratchF32("mlp.act", n, I)
		w := b.gemvWarps
		gemvSwigluKernels[hx(xt)][n-1].runOverlapped(b, g1((I+w-1)/w), 32*w, 0, gemvSwigluArgs{out: act.ptr, x: xt.ptr, w: gu.ptr, O: int32(I), I: int32(H)})
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
		b.siluMulBF16(act, h, n, I)
		b.gemm(ot.ptr, act, dn.ptr, n, H, I, dn.dt, backend.F32, accumulate)
		return
	}
	h, act := b.scratchF32("mlp.gu", n, 2*I), b.scratchF32("mlp.act", n, I)
	b.MatMul(h, xt, gu, false)
	b.siluMul(act, h)
	b.MatMul(ot, act, dn, accumulate)
}

// gemv is MatMul's product of up to b.gemvMax tokens with bf16 weights
// (rows a multiple of 8): a warp per output streams its weight row, the
// activations as they are (float32 ones keep their precision).
func (b *Backend) gemv(ot, xt, wt *tensor, accumulate bool) {
	n, o, in := xt.rows(), wt.rows(), xt.cols()
	w := b.gemvWarps
	gemvKernels[hx(xt)][n-1].runOverlapped(b, g1((o+w-1)/w), 32*w, 0, gemvArgs{out: ot.ptr, odt: int32(ot.dt), x: xt.ptr, w: wt.ptr, O: int32(o), I: int32(in), acc: boolInt(accumulate)})
}

// gemvMaxTokens is the largest token count served by the GEMV kernel by
// default; larger batches go to the skinny GEMM or cuBLASLt, whose
// tensor-core tiles win once the weights are reused by a few rows (each
// extra row costs the CUDA-core kernel another pass over the activations).
// KILN_CUDA_GEMV_MAX overrides it (0 to gemvTokens).
const gemvMaxTokens = 2

// checkMatMul panics unless out, x and w are a product's, and returns its
// tokens, columns and outputs.
func checkMatMul(ot, xt, wt *tensor, accumulate bool) (n, in, o int) {
	n, in, o = xt.rows(), xt.cols(), wt.rows()
	if wt.cols() != in {
		panic(fmt.Sprintf("cuda: matmul x %v, w %v", xt, wt))
	}
	checkRows("matmul out", ot, n, o)
	checkAct("matmul", ot, xt)
	if accumulate && ot.dt != backend.F32 {
		panic(fmt.Sprintf("cuda: matmul: accumulating into %v", ot))
	}
	return n, in, o
}

// MatMul computes out[n,o] = sum_i x[n,i] * w[o,i] (+ out when accumulate).
func (b *Backend) MatMul(out, x, w backend.Tensor, accumulate bool) {
	ot, xt, wt := asT(out), asT(x), asT(w)
	n, in, o := checkMatMul(ot, xt, wt, accumulate)
	if n == 0 {
		return
	}
	if wt.dt.Quantized() {
		b.qmatmul(ot, xt, wt, accumulate)
		return
	}
	if wt.dt == backend.BF16 && n <= b.gemvMax && in%8 == 0 {
		b.gemv(ot, xt, wt, accumulate)
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
	b.cast(ot.ptr, ot.dt, f, backend.F32, n*o)
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
		b.toHalf(xp, xt.ptr, n, dt)
	} else {
		b.cast(xp, dt, xt.ptr, xt.dt, n)
	}
	return xp
}

// NormsInput reports whether a product with w takes x's RMSNorm itself
// (backend.NormedProducts): the qgemv decode products of quantized
// weights, from the f32 residual rows.
func (b *Backend) NormsInput(x, w backend.Tensor) bool {
	xt, wt := asT(x), asT(w)
	n, in := xt.rows(), xt.cols()
	return xt.dt == backend.F32 && wt.cols() == in && b.qgemvFits(wt.dt, xt, n, in) && qgemvSmem(n, in)+qgemvNormSmem(in) <= qgemvSmemMax
}

// NormMatMul is MatMul(out, RMSNorm(x), w, accumulate) on qgemv.
func (b *Backend) NormMatMul(out, x backend.Tensor, n *backend.Norm, w backend.Tensor, accumulate bool) {
	ot, xt, wt := asT(out), asT(x), asT(w)
	_, in, o := checkMatMul(ot, xt, wt, accumulate)
	b.qgemv(false, ot.ptr, ot.dt, xt, wt, o, in, b.normOf(xt, wt, n), accumulate)
}

// NormMLP is MLP(out, RMSNorm(x), gateUp, down), its gate/up product on
// qgemv.
func (b *Backend) NormMLP(out, x backend.Tensor, n *backend.Norm, gateUp, down backend.Tensor) {
	ot, xt, gu, dn := asT(out), asT(x), asT(gateUp), asT(down)
	rows, H, I := checkMLP(ot, xt, gu, dn)
	act := &tensor{dt: backend.BF16, shape: []int{rows, I}, view: true, ptr: b.scratchBuf("mlp.act", 2*rows*I)}
	b.qgemv(true, act.ptr, backend.BF16, xt, gu, I, H, b.normOf(xt, gu, n), false)
	b.MatMul(ot, act, dn, true)
}

// normOf is the kernels' form of n for a product of x with w, which must
// be one NormsInput allows.
func (b *Backend) normOf(xt, wt *tensor, n *backend.Norm) qNorm {
	nw := asT(n.W)
	checkFloatW("rmsnorm", nw)
	if !b.NormsInput(xt, wt) || nw.numel() != xt.cols() {
		panic(fmt.Sprintf("cuda: a product of x %v with %v cannot take the norm %v", xt, wt, nw))
	}
	return qNorm{w: nw.ptr, wdt: int32(nw.dt), eps: n.Eps, unit: boolInt(n.UnitOffset)}
}
