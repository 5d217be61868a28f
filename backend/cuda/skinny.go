//go:build cgo

package cuda

import (
	"github.com/kiln-llm/kiln/backend"
)

// skinnyMaxTokens is the largest token count of the tensor-core skinny
// GEMM (kernels/skinny.cu): above the GEMV's count and up to this one, bf16
// products whose inner width is a multiple of skinnyCols take it instead of
// cuBLASLt (faster at 3 to 8 tokens, slower at 16: NOTES.md, "Figures
// behind the code").
// KILN_CUDA_SKINNY_MAX lowers it (0: off).
const skinnyMaxTokens = 8

// The skinny GEMM's tile (SK_BM, SK_BK, SK_P and SK_STAGES of the kernel):
// skinnyRows weight rows by skinnyCols columns a stage, rows skinnyPitch
// elements apart in shared memory (16 bytes more than a row, which keeps
// ldmatrix free of bank conflicts), skinnyStages stages of the weight rows
// and skinnyMaxTokens activation rows, bf16.
const (
	skinnyRows   = 32
	skinnyCols   = 256
	skinnyPitch  = skinnyCols + 8
	skinnyStages = 3
	skinnySmem   = skinnyStages * (skinnyRows + skinnyMaxTokens) * skinnyPitch * 2
)

// fp8SkinnyCols is the FP8 skinny GEMM's columns a stage (F8_BK).
const fp8SkinnyCols = 512

// fp8SkinnySmem is the shared memory of an FP8 skinny GEMM block whose
// tiles hold tok tokens (kernels/skinny.cu, SkFp8): a stage is skinnyRows
// rows of fp8SkinnyCols e4m3 values (16 bytes longer in shared memory),
// each row's four block scales and tok rows of bf16 activations (also 16
// bytes longer); then the stage's activations quantized (hi and lo e4m3
// rows) and their scales.
func fp8SkinnySmem(tok int) int {
	stage := skinnyRows*(fp8SkinnyCols+16) + skinnyRows*16 + tok*(2*fp8SkinnyCols+16)
	return skinnyStages*stage + 2*tok*(fp8SkinnyCols+16) + tok*fp8SkinnyCols/128*4
}

// fp8SkinnyTok is the tokens the FP8 skinny kernel for n tokens holds:
// 2 (its smaller blocks fill the multiprocessors better) or 8.
func fp8SkinnyTok(n int) int {
	if n <= 2 {
		return 2
	}
	return skinnyMaxTokens
}

// The skinny GEMM kernels (kernels/skinny.cu).
var (
	skinnyKernel       = newKernel[skinnyArgs]("skinny_bf16")
	skinnySwigluKernel = newKernel[skinnySwigluArgs]("skinny_swiglu_bf16")
	// The FP8 kernels by their tiles' tokens: [0] 2, [1] 8.
	skinnyFP8Kernels       = [2]kernel[skinnyFP8Args]{newKernel[skinnyFP8Args]("skinny_fp8_2"), newKernel[skinnyFP8Args]("skinny_fp8")}
	skinnySwigluFP8Kernels = [2]kernel[skinnySwigluFP8Args]{newKernel[skinnySwigluFP8Args]("skinny_swiglu_fp8_2"), newKernel[skinnySwigluFP8Args]("skinny_swiglu_fp8")}
)

type skinnyFP8Args struct {
	out        devptr
	odt        int32
	x, w       devptr
	rb         int64
	T, O, I    int32
	accumulate int32
	part, cnt  devptr
}

type skinnySwigluFP8Args struct {
	out, x, w devptr
	rb        int64
	T, O, I   int32
	part, cnt devptr
}

type skinnyArgs struct {
	out        devptr
	odt        int32
	x, w       devptr
	T, O, I    int32
	accumulate int32
	part, cnt  devptr
}

type skinnySwigluArgs struct {
	out, x, w devptr
	T, O, I   int32
	part, cnt devptr
}

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
func (b *Backend) skinnyWave() int { return b.wave(skinnySmem) }

// wave is the number of blocks of smem bytes of shared memory the device
// runs at once (1 KB of shared memory a block is the system's).
func (b *Backend) wave(smem int) int { return max(1, b.smemSM/(smem+1024)) * b.sms }

// fp8SkinnySplits is skinnySplits for FP8 weights (the skinny GEMM on the
// FP8 tensor cores, up to b.fp8SkinnyMax tokens, 0 where the device or the
// compiler has none).
func (b *Backend) fp8SkinnySplits(n, o, in int, swiglu bool) int {
	if n > b.fp8SkinnyMax || in%fp8SkinnyCols != 0 {
		return 0
	}
	rows := skinnyRows
	if swiglu {
		rows /= 2
	}
	return max(1, min(in/fp8SkinnyCols, b.wave(fp8SkinnySmem(fp8SkinnyTok(n)))/((o+rows-1)/rows)))
}

// skinnyGrid is the grid of a skinny product of n tokens and o outputs
// (blocks of skinnyRows weight rows, or half as many outputs of gate|up
// pairs with swiglu, by S splits of the inner dimension) and the f32
// partial sums its splits add up through.
func (b *Backend) skinnyGrid(swiglu bool, S, n, o int) (grid [3]int, part devptr) {
	rows, wrows := skinnyRows, o
	if swiglu {
		rows, wrows = rows/2, 2*o
	}
	if S > 1 {
		part = b.scratchBuf("skinny.part", 4*S*n*wrows)
	}
	return [3]int{(o + rows - 1) / rows, S, 1}, part
}

// skinnyFP8 is skinny for an FP8 weight w (fp8SkinnySplits): x bf16, its
// activations quantized in the kernel (kernels/skinny.cu, SkFp8).
func (b *Backend) skinnyFP8(swiglu bool, S int, out devptr, odt backend.DType, x devptr, w *tensor, n, o, in int, accumulate bool) {
	grid, part := b.skinnyGrid(swiglu, S, n, o)
	tok := fp8SkinnyTok(n)
	smem, k := fp8SkinnySmem(tok), tok/skinnyMaxTokens
	if swiglu {
		sk := skinnySwigluFP8Kernels[k]
		b.allowSmem(sk.name, smem)
		sk.runOverlapped(b, grid, 128, smem, skinnySwigluFP8Args{
			out: out, x: x, w: w.ptr, rb: int64(w.rb()), T: int32(n), O: int32(o), I: int32(in), part: part, cnt: b.skinnyCnt})
		return
	}
	sk := skinnyFP8Kernels[k]
	b.allowSmem(sk.name, smem)
	sk.runOverlapped(b, grid, 128, smem, skinnyFP8Args{
		out: out, odt: int32(odt), x: x, w: w.ptr, rb: int64(w.rb()), T: int32(n), O: int32(o), I: int32(in),
		accumulate: boolInt(accumulate), part: part, cnt: b.skinnyCnt})
}

// skinny computes out[n, o] (+)= x[n, in] . w[o, in]^T (out f32 or bf16),
// or with swiglu out[n, o] = silu(x . gate_o) * (x . up_o) in bf16 for w =
// [gate | up] of 2o rows; x is bf16, the inner dimension split S ways
// (skinnySplits).
func (b *Backend) skinny(swiglu bool, S int, out devptr, odt backend.DType, x, w devptr, n, o, in int, accumulate bool) {
	grid, part := b.skinnyGrid(swiglu, S, n, o)
	if swiglu {
		b.allowSmem(skinnySwigluKernel.name, skinnySmem)
		skinnySwigluKernel.runOverlapped(b, grid, 128, skinnySmem, skinnySwigluArgs{
			out: out, x: x, w: w, T: int32(n), O: int32(o), I: int32(in), part: part, cnt: b.skinnyCnt})
		return
	}
	b.allowSmem(skinnyKernel.name, skinnySmem)
	skinnyKernel.runOverlapped(b, grid, 128, skinnySmem, skinnyArgs{
		out: out, odt: int32(odt), x: x, w: w, T: int32(n), O: int32(o), I: int32(in), accumulate: boolInt(accumulate), part: part, cnt: b.skinnyCnt})
}
