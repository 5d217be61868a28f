//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"

	"github.com/kiln-llm/kiln/backend"
)

// FP8 weights on Hopper: block-scaled FP8 GEMMs through cuBLASLt.
//
// Qwen's FP8 checkpoints scale each 128x128 tile of a weight by one
// float32, which is what cuBLASLt's 2D block scaling (CUBLASLT_MATMUL_MATRIX_
// SCALE_BLK128x128_32F, sm_90) reads. With the activations quantized to
// e4m3 per token and 128 columns (1D block scaling, as vLLM and DeepSeek
// run these checkpoints), a product of four tokens or more runs on the FP8
// tensor cores straight from the weight's bytes: kiln's device rows (the
// 128-byte bodies of a row's blocks, then their scales; qlayout.go) are a
// column-major K x N matrix whose leading dimension is the row's bytes, and
// the tile scales are kept beside them at load. Below four tokens (the
// GEMM's smallest) products stay on qmv, with bf16 activations; from four
// to sixteen (sm_90a) they run on f8wg (kernels/f8wg.cu), which reads the
// same rows and tile scales without padding the tokens to cuBLASLt's tiles.

// The kernels of the block-scaled GEMM's activations (kernels/quant.cu).
var (
	quantFP8ActKernel = newKernel[quantFP8ActArgs]("quant_fp8_act")
	fp8RowsOutKernel  = newKernel[fp8RowsOutArgs]("fp8_rows_out")
)

// The decode products on wgmma (kernels/f8wg.cu) by their tiles' tokens:
// 8, 16.
var f8wgKernels = [2]kernel[f8wgArgs]{newKernel[f8wgArgs]("f8wg_8"), newKernel[f8wgArgs]("f8wg_16")}

type f8wgArgs struct {
	out        devptr
	odt        int32
	xq, xs     devptr
	T          int32
	w          devptr
	rb         int64
	wt         devptr
	ld, O, I   int32
	accumulate int32
	part, cnt  devptr
}

// f8wgMaxTokens is the most tokens of an FP8 product on f8wg (tiles of 32
// and 64 tokens lost to cuBLASLt: NOTES.md), and f8wgStages the stages of
// 128 columns its blocks keep in flight (F8WG_STAGES).
const (
	f8wgMaxTokens = 16
	f8wgStages    = 6
)

// f8wgTile is the tokens of the f8wg tile that takes n tokens, and its
// index in f8wgKernels.
func f8wgTile(n int) (tok, k int) {
	if n <= 8 {
		return 8, 0
	}
	return 16, 1
}

// f8wgSmem is the shared memory of an f8wg block of tok tokens: the
// swizzle's alignment, the stages' 64 weight rows and tok token rows of 128
// bytes, and their scales.
func f8wgSmem(tok int) int { return 1024 + f8wgStages*(64+tok)*128 + f8wgStages*(tok+1)*4 }

type quantFP8ActArgs struct {
	q, s, x               devptr
	xdt, T, Tp, K, swiglu int32
}

type fp8RowsOutArgs struct {
	out        devptr
	odt        int32
	d          devptr
	n          int64
	accumulate int32
}

// fp8GemmMinTokens is the fewest tokens of a block-scaled FP8 GEMM:
// cuBLASLt has no algorithm below four.
const fp8GemmMinTokens = 4

// fp8 cuBLASLt constants (cublasLt.h, library_types.h).
const (
	cudaR8FE4M3    = 28
	descAScalePtr  = 17
	descBScalePtr  = 18
	descAScaleMode = 31
	descBScaleMode = 32
	scaleVec128    = 4 // CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
	scaleBlk128    = 5 // CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
)

// fp8TileStride is the float32 scales a row of tiles takes in cuBLASLt's
// 2D layout: one per 128 columns, rounded up to a multiple of four.
func fp8TileStride(cols int) int { return ((cols+127)/128 + 3) &^ 3 }

// fp8TileScales returns the tile scales of FP8 rows in the interchange
// layout (backend/quant.go: blocks of a float32 scale and 128 e4m3 values),
// [ceil(rows/128)][fp8TileStride(cols)], or nil when some tile's rows do
// not share their block scales (the checkpoint was not quantized in
// 128x128 tiles) and the GEMM cannot take the weight.
func fp8TileScales(data []byte, rows, cols int) []float32 {
	nb := (cols + 127) / 128
	rb, ld := nb*132, fp8TileStride(cols)
	out := make([]float32, (rows+127)/128*ld)
	for r := range rows {
		for j := range nb {
			s := binary.LittleEndian.Uint32(data[r*rb+j*132:])
			i := r/128*ld + j
			if r%128 == 0 {
				out[i] = math.Float32frombits(s)
			} else if math.Float32bits(out[i]) != s {
				return nil
			}
		}
	}
	return out
}

// FP8ProductTokens reports from how many tokens products with FP8 weights
// run as block-scaled FP8 GEMMs (backend.FP8Products); 0: never.
func (b *Backend) FP8ProductTokens() int { return b.fp8Min }

// fp8Gemm reports whether the product of n tokens of x (rows of in) with
// w (o rows) runs as a block-scaled FP8 GEMM: whole 128-column blocks
// (every Qwen width), 16-byte aligned rows for cuBLASLt, and x read 16
// bytes at a time by quant_fp8_act.
func (b *Backend) fp8Gemm(w, x *tensor, n, in, o int) bool {
	return w.dt == backend.FP8 && w.fp8t != 0 && b.fp8Min > 0 && n >= b.fp8Min && in%128 == 0 && o%16 == 0 &&
		(x.dt == backend.F32 || x.dt == backend.BF16) && x.ptr%16 == 0
}

// fp8gemm computes out[n, o] (+)= x[n, in] . w[o, in]^T on the FP8 tensor
// cores: x quantized per token and 128 columns, w's tile scales, out f32
// (written or added to) or bf16. Up to b.f8wgMax tokens it is f8wg's;
// above, cuBLASLt's, where a token count that is not a multiple of four
// is padded with zero rows whose products go to scratch.
func (b *Backend) fp8gemm(out devptr, odt backend.DType, xt *tensor, w *tensor, n, o, in int, accumulate bool) {
	if n <= b.f8wgMax {
		b.f8wg(out, odt, xt, w, n, o, in, accumulate)
		return
	}
	np := (n + 3) &^ 3
	q, s := b.quantAct("fp8", xt.ptr, xt.dt, n, np, in, false)
	d := out
	if np != n {
		d = b.scratchBuf("fp8.out", np*o*odt.Size())
	}
	if b.trace != nil {
		b.trace("cublasLt")
	}
	label := "cublasLt"
	if b.prof != nil {
		label = fmt.Sprintf("cublasLt fp8 %dx%d", o, in)
	}
	acc := accumulate && d == out
	b.around(label, func() { b.fail(b.lt.fp8matmul(b.stream, d, q, s, w.ptr, w.fp8t, np, o, in, w.rb(), odt, acc)) })
	if d != out {
		fp8RowsOutKernel.run(b, g1(b.blocksFor(n*o)), 256, 0, fp8RowsOutArgs{out: out, odt: int32(odt), d: d, n: int64(n * o), accumulate: boolInt(accumulate)})
	}
}

// f8wg is fp8gemm's product of up to b.f8wgMax tokens on wgmma (sm_90a):
// blocks of 64 weight rows, the columns split where the tiles fill less
// than a wave (at least two stages a split).
func (b *Backend) f8wg(out devptr, odt backend.DType, xt *tensor, w *tensor, n, o, in int, accumulate bool) {
	q, s := b.quantAct("fp8", xt.ptr, xt.dt, n, n, in, false)
	tok, k := f8wgTile(n)
	smem, tiles, S := f8wgSmem(tok), (o+63)/64, 1
	kk := f8wgKernels[k]
	b.allowSmem(kk.name, smem)
	if tiles <= b.skinnyWave() { // a counter a tile
		S = max(1, min(in/128/2, b.residentBlocks(kk.name, 128, smem)*b.sms/tiles))
	}
	var part devptr
	if S > 1 {
		part = b.scratchBuf("f8wg.part", 4*S*n*o)
	}
	kk.runOverlapped(b, [3]int{tiles, S, 1}, 128, smem, f8wgArgs{
		out: out, odt: int32(odt), xq: q, xs: s, T: int32(n), w: w.ptr, rb: int64(w.rb()), wt: w.fp8t,
		ld: int32(fp8TileStride(in)), O: int32(o), I: int32(in), accumulate: boolInt(accumulate), part: part, cnt: b.skinnyCnt})
}

// quantAct quantizes n rows of x (f32 or bf16, rows of in; with swiglu,
// f32 rows of gate | up, 2 in, whose SwiGLU it quantizes) for FP8
// products, in rows of e4m3 padded with zeros to np, and their scales
// (quant_fp8_act's layout), into the scratch buffers pre.x and pre.s.
func (b *Backend) quantAct(pre string, x devptr, xdt backend.DType, n, np, in int, swiglu bool) (q, s devptr) {
	nb := (in + 127) / 128
	q = b.scratchBuf(pre+".x", np*in)
	s = b.scratchBuf(pre+".s", 4*nb*np)
	quantFP8ActKernel.runOverlapped(b, g1(max(1, min((nb*np+7)/8, 16*b.sms))), 256, 0, quantFP8ActArgs{q: q, s: s, x: x, xdt: int32(xdt), T: int32(n), Tp: int32(np), K: int32(in),
		swiglu: boolInt(swiglu)})
	return q, s
}

// loadTileScales uploads the tile scales of t's interchange data (a
// weight whose tiles do not share scales keeps fp8t 0).
func (b *Backend) loadTileScales(t *tensor, data []byte) error {
	ts := fp8TileScales(data, t.qrows(), t.qcols())
	if ts == nil {
		return nil
	}
	p, err := b.malloc(4 * len(ts))
	if err != nil {
		return err
	}
	t.fp8t = p
	return check("cuMemcpyHtoD", C.k_cuMemcpyHtoDAsync_v2(b.ctx, p, unsafe.Pointer(&ts[0]), C.size_t(4*len(ts)), b.stream))
}

// writeTileScales replaces t's tile scales with those of new data, or
// drops them when its tiles no longer share scales.
func (b *Backend) writeTileScales(t *tensor, data []byte) {
	ts := fp8TileScales(data, t.qrows(), t.qcols())
	if ts == nil {
		b.fail(b.Sync())
		b.fail(check("cuMemFree", C.k_cuMemFree_v2(b.ctx, t.fp8t)))
		t.fp8t = 0
		return
	}
	b.fail(b.Sync()) // the host slice is staged by the time the copy returns
	b.fail(check("cuMemcpyHtoD", C.k_cuMemcpyHtoDAsync_v2(b.ctx, t.fp8t, unsafe.Pointer(&ts[0]), C.size_t(4*len(ts)), b.stream)))
	b.fail(b.Sync())
}
