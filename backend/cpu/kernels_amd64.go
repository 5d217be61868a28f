package cpu

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/kiln-llm/kiln/backend"
)

func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
func xgetbv0() (eax, edx uint32)

//go:noescape
func dot4xbf16AVX(w *uint16, x *float32, stride uintptr, n int, out *[4]float32)

//go:noescape
func gemm6x16AVX(a *float32, lda int, b *float32, k int, c *float32, ldc int)

//go:noescape
func gemm6x16AVX512(a *float32, lda int, b *float32, k int, c *float32, ldc int)

//go:noescape
func dotAVX(x, y *float32, n int) float32

//go:noescape
func dotbf16AVX(x *float32, w *uint16, n int) float32

//go:noescape
func axpyAVX(y, x *float32, a float32, n int)

//go:noescape
func axpybf16AVX(y *float32, x *uint16, a float32, n int)

//go:noescape
func expShiftAVX(x *float32, n int, m float32) float32

//go:noescape
func maxAVX(x *float32, n int) float32

//go:noescape
func sumSquaresAVX(x *float32, n int) float64

//go:noescape
func scaleMulAVX(dst, x, w *float32, s float32, n int)

//go:noescape
func siluMulAVX(out, gate, up *float32, n int)

//go:noescape
func scaleAxpyAVX(y, x *float32, b, a float32, n int)

//go:noescape
func dotRowsF32AVX(q *float32, k *float32, stride uintptr, rows int, hd int, out *float32)

//go:noescape
func dotRowsBF16AVX(q *float32, k *uint16, stride uintptr, rows int, hd int, out *float32)

//go:noescape
func dot2RowsF32AVX(q *float32, k *float32, stride uintptr, rows int, hd int, scale float32, out *float32, ostride uintptr)

//go:noescape
func dot2RowsBF16AVX(q *float32, k *uint16, stride uintptr, rows int, hd int, scale float32, out *float32, ostride uintptr)

//go:noescape
func axpy2RowsF32AVX(acc *float32, p *float32, pstride uintptr, v *float32, stride uintptr, rows int, hd int)

//go:noescape
func axpy2RowsBF16AVX(acc *float32, p *float32, pstride uintptr, v *uint16, stride uintptr, rows int, hd int)

//go:noescape
func axpyRowsF32AVX(acc *float32, p *float32, v *float32, stride uintptr, rows int, hd int)

//go:noescape
func axpyRowsBF16AVX(acc *float32, p *float32, v *uint16, stride uintptr, rows int, hd int)

//go:noescape
func dotQ8_0AVX(w *byte, rows int, x *byte, nb int, out *float32)

//go:noescape
func dotQ8_0x4AVX(w *byte, rows int, x *byte, xstride int, nb int, out *float32)

//go:noescape
func dotQ4KAVX(w *byte, rows int, x *byte, nb int, out *float32)

//go:noescape
func dotQ4Kx4AVX(w *byte, rows int, x *byte, xstride int, nb int, out *float32)

//go:noescape
func dotQ5KAVX(w *byte, rows int, x *byte, nb int, out *float32)

//go:noescape
func dotQ5Kx4AVX(w *byte, rows int, x *byte, xstride int, nb int, out *float32)

//go:noescape
func dotMXFP4AVX(w *byte, rows int, x *byte, nb int, out *float32)

//go:noescape
func dotMXFP4x4AVX(w *byte, rows int, x *byte, xstride int, nb int, out *float32)

//go:noescape
func dotQ6KAVX(w *byte, rows int, x *byte, nb int, out *float32)

//go:noescape
func dotQ6Kx4AVX(w *byte, rows int, x *byte, xstride int, nb int, out *float32)

//go:noescape
func dotFP8AVX(w *byte, rb int, rows int, x *float32, nb int, out *float32)

//go:noescape
func dotFP8x4AVX(w *byte, rb int, rows int, x *float32, xstride int, nb int, out *float32)

//go:noescape
func quantizeAVX(x *float32, nb int, blk int, dst *byte)

// hasAVX2FMA reports whether the CPU and OS support AVX2, FMA and F16C.
func hasAVX2FMA() bool {
	maxID, _, _, _ := cpuid(0, 0)
	if maxID < 7 {
		return false
	}
	_, _, ecx1, _ := cpuid(1, 0)
	const fma, osxsave, avx, f16c = 1 << 12, 1 << 27, 1 << 28, 1 << 29
	if ecx1&(fma|osxsave|avx|f16c) != fma|osxsave|avx|f16c {
		return false
	}
	if xcr0, _ := xgetbv0(); xcr0&6 != 6 { // the OS saves xmm and ymm state
		return false
	}
	_, ebx7, _, _ := cpuid(7, 0)
	return ebx7&(1<<5) != 0
}

var useAVX = hasAVX2FMA()

// useAVX512: the prompts' kernels (f32 panels and their packing, Q8_0, Q4_K, Q5_K and Q6_K) take
// AVX-512 with VNNI where the CPU has it (tests turn it off to check the
// AVX2 kernels too).
var useAVX512 = hasVNNI512()

// prefetchBytes is how far ahead of the weights they read the quantized
// kernels prefetch (quant_amd64.s). On the Xeon dev machine one core
// streamed Q4_K rows from memory at 8.5 GB/s without, 11.9 at 1 KB,
// 16.1-17.5 at 2-3 KB and 14.2 at 4 KB ahead.
var prefetchBytes = 2048

func init() {
	if install, ok := asmKernels(); ok {
		install()
	}
}

// The wrappers check bounds, run the assembly over the multiple-of-8 prefix
// and finish the tail in Go.

func dotF32AVX(x, w []float32) float32 {
	n := len(x)
	w = w[:n]
	n8 := n &^ 7
	var s float32
	if n8 > 0 {
		s = dotAVX(unsafe.SliceData(x), unsafe.SliceData(w), n8)
	}
	for i := n8; i < n; i++ {
		s += x[i] * w[i]
	}
	return s
}

func dotBF16AVX(x []float32, w []uint16) float32 {
	n := len(x)
	w = w[:n]
	n8 := n &^ 7
	var s float32
	if n8 > 0 {
		s = dotbf16AVX(unsafe.SliceData(x), unsafe.SliceData(w), n8)
	}
	for i := n8; i < n; i++ {
		s += x[i] * backend.BF16ToF32(w[i])
	}
	return s
}

func dot4xBF16AVX(w []uint16, x []float32, out []float32) {
	k := len(w)
	x, out = x[:4*k], out[:4]
	k8 := k &^ 7
	var r [4]float32
	if k8 > 0 {
		dot4xbf16AVX(unsafe.SliceData(w), unsafe.SliceData(x), uintptr(4*k), k8, &r)
	}
	for i := k8; i < k; i++ {
		v := backend.BF16ToF32(w[i])
		for j := range 4 {
			r[j] += v * x[j*k+i]
		}
	}
	copy(out, r[:])
}

func axpyF32AVX(y []float32, a float32, x []float32) {
	n := len(y)
	x = x[:n]
	n8 := n &^ 7
	if n8 > 0 {
		axpyAVX(unsafe.SliceData(y), unsafe.SliceData(x), a, n8)
	}
	for i := n8; i < n; i++ {
		y[i] += a * x[i]
	}
}

func scaleAxpyF32AVX(y []float32, b, a float32, x []float32) {
	n := len(y)
	x = x[:n]
	n8 := n &^ 7
	if n8 > 0 {
		scaleAxpyAVX(unsafe.SliceData(y), unsafe.SliceData(x), b, a, n8)
	}
	for i := n8; i < n; i++ {
		y[i] = b*y[i] + a*x[i]
	}
}

func maxF32AVX(x []float32) float32 {
	n32 := len(x) &^ 31
	if n32 == 0 {
		return maxF32Go(x)
	}
	m := maxAVX(unsafe.SliceData(x), n32)
	if v := maxF32Go(x[n32:]); v > m {
		m = v
	}
	return m
}

func sumSquaresF32AVX(x []float32) float64 {
	n16 := len(x) &^ 15
	var ss float64
	if n16 > 0 {
		ss = sumSquaresAVX(unsafe.SliceData(x), n16)
	}
	return ss + sumSquaresGo(x[n16:])
}

func scaleMulF32AVX(dst, x, w []float32, s float32) {
	n := len(x)
	dst, w = dst[:n], w[:n]
	n8 := n &^ 7
	if n8 > 0 {
		scaleMulAVX(unsafe.SliceData(dst), unsafe.SliceData(x), unsafe.SliceData(w), s, n8)
	}
	scaleMulGo(dst[n8:], x[n8:], w[n8:], s)
}

func siluMulF32AVX(out, g, u []float32) {
	n := len(out)
	g, u = g[:n], u[:n]
	n8 := n &^ 7
	if n8 > 0 {
		siluMulAVX(unsafe.SliceData(out), unsafe.SliceData(g), unsafe.SliceData(u), n8)
	}
	siluMulGo(out[n8:], g[n8:], u[n8:])
}

func expShiftF32AVX(x []float32, m float32) float32 {
	n8 := len(x) &^ 7
	var sum float32
	if n8 > 0 {
		sum = expShiftAVX(unsafe.SliceData(x), n8, m)
	}
	return sum + expShiftGo(x[n8:], m)
}

func axpyBF16AVX(y []float32, a float32, x []uint16) {
	n := len(y)
	x = x[:n]
	n8 := n &^ 7
	if n8 > 0 {
		axpybf16AVX(unsafe.SliceData(y), unsafe.SliceData(x), a, n8)
	}
	for i := n8; i < n; i++ {
		y[i] += a * backend.BF16ToF32(x[i])
	}
}

// gemm6x16Asm wraps a 6x16 assembly kernel with the bounds checks.
func gemm6x16Asm(kern func(a *float32, lda int, b *float32, k int, c *float32, ldc int)) func(a []float32, lda int, b []float32, k int, c []float32, ldc int) {
	return func(a []float32, lda int, b []float32, k int, c []float32, ldc int) {
		_ = c[5*ldc+15]
		if k == 0 {
			for i := range 6 {
				clear(c[i*ldc : i*ldc+16])
			}
			return
		}
		_ = a[5*lda+k-1]
		_ = b[16*k-1]
		kern(unsafe.SliceData(a), lda, unsafe.SliceData(b), k, unsafe.SliceData(c), ldc)
	}
}

// asmKernels returns a function installing the assembly kernels, when the
// CPU has them.
func asmKernels() (func(), bool) {
	return func() {
		dotF32, dotBF16, dot4xBF16 = dotF32AVX, dotBF16AVX, dot4xBF16AVX
		axpy, axpyBF16, gemm6x16 = axpyF32AVX, axpyBF16AVX, gemm6x16Asm(gemm6x16AVX)
		dotRowsF32, dotRowsBF16 = dotRowsAsm[float32], dotRowsAsm[uint16]
		axpyRowsF32, axpyRowsBF16 = axpyRowsAsm[float32], axpyRowsAsm[uint16]
		dot2RowsF32, dot2RowsBF16 = dot2RowsAsm[float32], dot2RowsAsm[uint16]
		axpy2RowsF32, axpy2RowsBF16 = axpy2RowsAsm[float32], axpy2RowsAsm[uint16]
		scaleAxpy, expShift = scaleAxpyF32AVX, expShiftF32AVX
		sumSquares, scaleMul, siluMulRow, maxF32 = sumSquaresF32AVX, scaleMulF32AVX, siluMulF32AVX, maxF32AVX
		quantizeRow, intDotKernels = quantizeRowAsm, true
		dotQ8_0, dotQ8_0x4 = quantKernel(dotQ8_0AVX, backend.Q8_0), quantKernelN(dotQ8_0x4AVX, backend.Q8_0, 4)
		dotQ4K, dotQ4Kx4 = quantKernel(dotQ4KAVX, backend.Q4_K), quantKernelN(dotQ4Kx4AVX, backend.Q4_K, 4)
		dotQ5K, dotQ5Kx4 = quantKernel(dotQ5KAVX, backend.Q5_K), quantKernelN(dotQ5Kx4AVX, backend.Q5_K, 4)
		dotQ6K, dotQ6Kx4 = quantKernel(dotQ6KAVX, backend.Q6_K), quantKernelN(dotQ6Kx4AVX, backend.Q6_K, 4)
		dotMXFP4, dotMXFP4x4 = quantKernel(dotMXFP4AVX, backend.MXFP4), quantKernelN(dotMXFP4x4AVX, backend.MXFP4, 4)
		dotFP8, dotFP8x4 = dotFP8Asm, dotFP8x4Asm
		// The AVX-512 kernels, or none (the tests install the AVX2 ones
		// over them too).
		packHalf, dotQ8_0x4Pairs, dotQ4Kx8 = nil, nil, nil
		if useAVX512 {
			gemm6x16, packHalf = gemm6x16Asm(gemm6x16AVX512), packHalfAsm
			dotQ8_0x4Pairs = dotQ8_0x4VNNIAsm
			dotQ4Kx4 = quantKernelN(dotQ4Kx4VNNI, backend.Q4_K, 4)
			dotQ4Kx8 = quantKernelN(dotQ4Kx8VNNI, backend.Q4_K, 8)
			dotQ5Kx4 = quantKernelN(dotQ5Kx4VNNI, backend.Q5_K, 4)
			dotQ6Kx4 = quantKernelN(dotQ6Kx4VNNI, backend.Q6_K, 4)
		}
	}, useAVX
}

func dotRowsAsm[E float32 | uint16](q []float32, k []E, stride int, out []float32) {
	hd, rows := len(q), len(out)
	if hd%16 != 0 || rows == 0 {
		dotRowsGo(q, k, stride, out)
		return
	}
	_ = k[(rows-1)*stride+hd-1]
	var z E
	es := unsafe.Sizeof(z)
	switch k := any(k).(type) {
	case []float32:
		dotRowsF32AVX(unsafe.SliceData(q), unsafe.SliceData(k), uintptr(stride)*es, rows, hd, unsafe.SliceData(out))
	case []uint16:
		dotRowsBF16AVX(unsafe.SliceData(q), unsafe.SliceData(k), uintptr(stride)*es, rows, hd, unsafe.SliceData(out))
	}
}

func axpyRowsAsm[E float32 | uint16](acc, p []float32, v []E, stride int) {
	hd, rows := len(acc), len(p)
	if hd%32 != 0 || rows == 0 {
		axpyRowsGo(acc, p, v, stride)
		return
	}
	_ = v[(rows-1)*stride+hd-1]
	var z E
	es := unsafe.Sizeof(z)
	switch v := any(v).(type) {
	case []float32:
		axpyRowsF32AVX(unsafe.SliceData(acc), unsafe.SliceData(p), unsafe.SliceData(v), uintptr(stride)*es, rows, hd)
	case []uint16:
		axpyRowsBF16AVX(unsafe.SliceData(acc), unsafe.SliceData(p), unsafe.SliceData(v), uintptr(stride)*es, rows, hd)
	}
}

// dot2RowsAsm and axpy2RowsAsm take out1 and p1 at any distance from
// out0 and p0 (the score rows of consecutive heads).
func dot2RowsAsm[E float32 | uint16](q []float32, k []E, stride int, scale float32, out0, out1 []float32) {
	hd, rows := len(q)/2, len(out0)
	if hd%8 != 0 || rows == 0 {
		dot2RowsGo(q, k, stride, scale, out0, out1)
		return
	}
	_ = k[(rows-1)*stride+hd-1]
	_ = out1[rows-1]
	var z E
	es := unsafe.Sizeof(z)
	ostride := uintptr(unsafe.Pointer(unsafe.SliceData(out1))) - uintptr(unsafe.Pointer(unsafe.SliceData(out0)))
	switch k := any(k).(type) {
	case []float32:
		dot2RowsF32AVX(unsafe.SliceData(q), unsafe.SliceData(k), uintptr(stride)*es, rows, hd, scale, unsafe.SliceData(out0), ostride)
	case []uint16:
		dot2RowsBF16AVX(unsafe.SliceData(q), unsafe.SliceData(k), uintptr(stride)*es, rows, hd, scale, unsafe.SliceData(out0), ostride)
	}
	runtime.KeepAlive(out1) // written through out0's pointer
}

func axpy2RowsAsm[E float32 | uint16](acc, p0, p1 []float32, v []E, stride int) {
	hd, rows := len(acc)/2, len(p0)
	if hd%32 != 0 || rows == 0 {
		axpy2RowsGo(acc, p0, p1, v, stride)
		return
	}
	_ = v[(rows-1)*stride+hd-1]
	_ = p1[rows-1]
	var z E
	es := unsafe.Sizeof(z)
	pstride := uintptr(unsafe.Pointer(unsafe.SliceData(p1))) - uintptr(unsafe.Pointer(unsafe.SliceData(p0)))
	switch v := any(v).(type) {
	case []float32:
		axpy2RowsF32AVX(unsafe.SliceData(acc), unsafe.SliceData(p0), pstride, unsafe.SliceData(v), uintptr(stride)*es, rows, hd)
	case []uint16:
		axpy2RowsBF16AVX(unsafe.SliceData(acc), unsafe.SliceData(p0), pstride, unsafe.SliceData(v), uintptr(stride)*es, rows, hd)
	}
	runtime.KeepAlive(p1) // read through p0's pointer
}

// The quantized kernels' wrappers check that the weight rows (whole blocks
// of rb bytes, consecutive in w) and the input rows cover what the assembly
// reads.

// quantKernel wraps a one-input-row integer kernel for dt.
func quantKernel(kern func(w *byte, rows int, x *byte, nb int, out *float32), dt backend.DType) func(w []byte, rb int, x []byte, out []float32) {
	_, bs := dt.Block()
	blk, _ := intDot(dt)
	return func(w []byte, rb int, x []byte, out []float32) {
		rows, nb := len(out), rb/bs
		if rows == 0 {
			return
		}
		if rb != nb*bs || len(w) < rows*rb || len(x) < nb*q8Bytes(blk) {
			panic(fmt.Sprintf("cpu: %v kernel sizes", dt))
		}
		if nb == 0 {
			clear(out)
			return
		}
		kern(unsafe.SliceData(w), rows, unsafe.SliceData(x), nb, unsafe.SliceData(out))
	}
}

// quantKernelN wraps an integer kernel of n input rows (4 or 8) for dt.
func quantKernelN(kern func(w *byte, rows int, x *byte, xstride int, nb int, out *float32), dt backend.DType, n int) func(w []byte, rb int, x []byte, xstride int, out []float32) {
	_, bs := dt.Block()
	blk, _ := intDot(dt)
	return func(w []byte, rb int, x []byte, xstride int, out []float32) {
		rows, nb := len(out)/n, rb/bs
		if rows == 0 {
			return
		}
		if rb != nb*bs || len(w) < rows*rb || xstride < nb*q8Bytes(blk) || len(x) < (n-1)*xstride+nb*q8Bytes(blk) {
			panic(fmt.Sprintf("cpu: %v kernel sizes", dt))
		}
		if nb == 0 {
			clear(out)
			return
		}
		kern(unsafe.SliceData(w), rows, unsafe.SliceData(x), xstride, nb, unsafe.SliceData(out))
	}
}

func quantizeRowAsm(x []float32, blk int, dst []byte) {
	nb := len(x) / blk
	if nb == 0 {
		return
	}
	if blk != 32 && blk != 256 || len(dst) < nb*q8Bytes(blk) {
		panic("cpu: quantize sizes")
	}
	quantizeAVX(unsafe.SliceData(x), nb, blk, unsafe.SliceData(dst))
}

// dotFP8Asm covers the whole blocks of x (fp8Tail adds a partial one).
func dotFP8Asm(w []byte, rb int, x []float32, out []float32) {
	rows, nb := len(out), len(x)/128
	if rows == 0 {
		return
	}
	if rb < nb*132 || len(w) < (rows-1)*rb+nb*132 {
		panic("cpu: fp8 kernel sizes")
	}
	if nb == 0 {
		clear(out)
		return
	}
	dotFP8AVX(unsafe.SliceData(w), rb, rows, unsafe.SliceData(x), nb, unsafe.SliceData(out))
}

// dotFP8x4Asm is dotFP8Asm against four input rows xstride floats apart.
func dotFP8x4Asm(w []byte, rb int, x []float32, xstride int, out []float32) {
	rows, nb := len(out)/4, xstride/128
	if rows == 0 {
		return
	}
	if rb < nb*132 || len(w) < (rows-1)*rb+nb*132 || len(x) < 3*xstride+nb*128 {
		panic("cpu: fp8 kernel sizes")
	}
	if nb == 0 {
		clear(out)
		return
	}
	dotFP8x4AVX(unsafe.SliceData(w), rb, rows, unsafe.SliceData(x), 4*xstride, nb, unsafe.SliceData(out))
}

//go:noescape
func packBF16AVX512(w *uint16, k int, n int, dst *float32)

//go:noescape
func packF16AVX512(w *uint16, k int, n int, dst *float32)

//go:noescape
func dotQ8_0x4VNNI(w *byte, rows int, x *byte, xstride int, np int, out *float32)

//go:noescape
func dotQ4Kx4VNNI(w *byte, rows int, x *byte, xstride int, nb int, out *float32)

//go:noescape
func dotQ4Kx8VNNI(w *byte, rows int, x *byte, xstride int, nb int, out *float32)

//go:noescape
func dotQ5Kx4VNNI(w *byte, rows int, x *byte, xstride int, nb int, out *float32)

//go:noescape
func dotQ6Kx4VNNI(w *byte, rows int, x *byte, xstride int, nb int, out *float32)

// hasVNNI512 reports whether the CPU and OS support AVX-512 (F, BW, VL) with
// VNNI: dotQ8_0x4VNNI's instructions and registers.
func hasVNNI512() bool {
	if !useAVX {
		return false
	}
	_, ebx7, ecx7, _ := cpuid(7, 0)
	const f, bw, vl, vnni = 1 << 16, 1 << 30, 1 << 31, 1 << 11
	if ebx7&(f|bw|vl) != f|bw|vl || ecx7&vnni == 0 {
		return false
	}
	xcr0, _ := xgetbv0() // the OS saves the opmask and all 32 zmm registers
	return xcr0&0xe6 == 0xe6
}

// packHalfAsm packs the 16 rows of k columns in w (k a multiple of 16)
// into the panel dst: 16 columns of each a step, transposed in registers.
func packHalfAsm(bf16 bool, w []uint16, k int, dst []float32) {
	if k%16 != 0 || len(w) < 16*k || len(dst) < 16*k {
		panic("cpu: pack sizes")
	}
	if k == 0 {
		return
	}
	if bf16 {
		packBF16AVX512(unsafe.SliceData(w), k, k, unsafe.SliceData(dst))
	} else {
		packF16AVX512(unsafe.SliceData(w), k, k, unsafe.SliceData(dst))
	}
}

// dotQ8_0x4VNNIAsm is dotQ8_0x4's form for input rows in the pair layout
// (quantizePairs): out[r*4+j] for the weight rows r in w (rb bytes each).
func dotQ8_0x4VNNIAsm(w []byte, rb int, x []byte, xstride int, out []float32) {
	rows, np := len(out)/4, rb/(2*34)
	if rows == 0 {
		return
	}
	if rb != np*2*34 || len(w) < rows*rb || xstride < np*q8PairBytes || len(x) < 3*xstride+np*q8PairBytes {
		panic("cpu: Q8_0 pair kernel sizes")
	}
	if np == 0 {
		clear(out)
		return
	}
	dotQ8_0x4VNNI(unsafe.SliceData(w), rows, unsafe.SliceData(x), xstride, np, unsafe.SliceData(out))
}
