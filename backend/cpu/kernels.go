package cpu

import (
	"math"

	"github.com/kiln-llm/kiln/backend"
)

// The inner loops of the backend, in portable Go. On amd64 with AVX2 and
// FMA, kernels_amd64.go replaces them with assembly at init; the test
// TestKernels checks that both agree.

var (
	dotF32    = dotF32Go
	dotBF16   = dotBF16Go
	dot4xBF16 = dot4xBF16Go
	axpy      = axpyGo
	axpyBF16  = axpyBF16Go
	gemm6x16  = gemm6x16Go
	scaleAxpy = scaleAxpyGo
	expShift  = expShiftGo

	sumSquares = sumSquaresGo
	scaleMul   = scaleMulGo
	siluMulRow = siluMulGo
	maxF32     = maxF32Go

	dotRowsF32   = dotRowsGo[float32]
	dotRowsBF16  = dotRowsGo[uint16]
	axpyRowsF32  = axpyRowsGo[float32]
	axpyRowsBF16 = axpyRowsGo[uint16]

	// Two query heads of a kv head at once (attention).
	dot2RowsF32   = dot2RowsGo[float32]
	dot2RowsBF16  = dot2RowsGo[uint16]
	axpy2RowsF32  = axpy2RowsGo[float32]
	axpy2RowsBF16 = axpy2RowsGo[uint16]

	// Quantized weights (quant.go).
	quantizeRow = quantizeRowGo
	dotQ8_0     = dotQ8_0Go
	dotQ4K      = dotQ4KGo
	dotQ5K      = dotQ5KGo
	dotQ6K      = dotQ6KGo
	dotMXFP4    = dotMXFP4Go
	dotFP8      = dotFP8Go
	dotQ8_0x4   = dotQx4Go(dotQ8_0Go)
	dotQ4Kx4    = dotQx4Go(dotQ4KGo)
	dotQ5Kx4    = dotQx4Go(dotQ5KGo)
	dotQ6Kx4    = dotQx4Go(dotQ6KGo)
	dotMXFP4x4  = dotQx4Go(dotMXFP4Go)
	dotFP8x4    = dotFP8x4Go

	// dotQ4Kx8 is dotQ4Kx4 for eight input rows (out[r*8+j]); nil where
	// only the four-row kernel does.
	dotQ4Kx8 func(w []byte, rb int, x []byte, xstride int, out []float32)

	// packHalf packs 16 bf16 (or f16) weight rows of k columns into a
	// panel (weights.pack); nil where only the portable loop does.
	packHalf func(bf16 bool, w []uint16, k int, dst []float32)
)

// dotRowsGo sets out[r] = q . k[r*stride:r*stride+len(q)] for r < len(out):
// one kv head's keys at consecutive positions of a cache block.
func dotRowsGo[E float32 | uint16](q []float32, k []E, stride int, out []float32) {
	for r := range out {
		row := k[r*stride : r*stride+len(q)]
		switch row := any(row).(type) {
		case []float32:
			out[r] = dotF32(q, row)
		case []uint16:
			out[r] = dotBF16(q, row)
		}
	}
}

// axpyRowsGo adds sum_r p[r] * v[r*stride:r*stride+len(acc)] to acc.
func axpyRowsGo[E float32 | uint16](acc, p []float32, v []E, stride int) {
	for r, pr := range p {
		row := v[r*stride : r*stride+len(acc)]
		switch row := any(row).(type) {
		case []float32:
			axpy(acc, pr, row)
		case []uint16:
			axpyBF16(acc, pr, row)
		}
	}
}

// dot2RowsGo sets, for r < len(out0), out0[r] = scale * q0 . k_r and
// out1[r] = scale * q1 . k_r, where q0 and q1 are the halves of q and k_r
// = k[r*stride:]: two query heads against one kv head's keys.
func dot2RowsGo[E float32 | uint16](q []float32, k []E, stride int, scale float32, out0, out1 []float32) {
	hd := len(q) / 2
	dotRowsGo(q[:hd], k, stride, out0)
	dotRowsGo(q[hd:], k, stride, out1[:len(out0)])
	for r := range out0 {
		out0[r] *= scale
		out1[r] *= scale
	}
}

// axpy2RowsGo adds sum_r p0[r] * v_r to acc's first half and sum_r p1[r]
// * v_r to its second, v_r = v[r*stride:]: two query heads' weighted values.
func axpy2RowsGo[E float32 | uint16](acc, p0, p1 []float32, v []E, stride int) {
	hd := len(acc) / 2
	axpyRowsGo(acc[:hd], p0, v, stride)
	axpyRowsGo(acc[hd:], p1[:len(p0)], v, stride)
}

// dotF32Go returns x . w (len(w) >= len(x)).
func dotF32Go(x, w []float32) float32 {
	w = w[:len(x)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(x); i += 4 {
		s0 += x[i] * w[i]
		s1 += x[i+1] * w[i+1]
		s2 += x[i+2] * w[i+2]
		s3 += x[i+3] * w[i+3]
	}
	for ; i < len(x); i++ {
		s0 += x[i] * w[i]
	}
	return (s0 + s1) + (s2 + s3)
}

// dotBF16Go returns x . w for bf16 w (len(w) >= len(x)).
func dotBF16Go(x []float32, w []uint16) float32 {
	w = w[:len(x)]
	var s0, s1 float32
	i := 0
	for ; i+2 <= len(x); i += 2 {
		s0 += x[i] * backend.BF16ToF32(w[i])
		s1 += x[i+1] * backend.BF16ToF32(w[i+1])
	}
	for ; i < len(x); i++ {
		s0 += x[i] * backend.BF16ToF32(w[i])
	}
	return s0 + s1
}

// dot4xBF16Go sets out[j] = w . x[j*k:(j+1)*k] for j < 4 and k = len(w):
// one bf16 weight row against four input rows.
func dot4xBF16Go(w []uint16, x []float32, out []float32) {
	k := len(w)
	x0, x1, x2, x3 := x[:k], x[k:2*k], x[2*k:3*k], x[3*k:4*k]
	var s0, s1, s2, s3 float32
	for i, h := range w {
		v := backend.BF16ToF32(h)
		s0 += v * x0[i]
		s1 += v * x1[i]
		s2 += v * x2[i]
		s3 += v * x3[i]
	}
	out[0], out[1], out[2], out[3] = s0, s1, s2, s3
}

// axpyGo adds a*x to y (len(x) >= len(y)).
func axpyGo(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for i, v := range x {
		y[i] += a * v
	}
}

// scaleAxpyGo sets y = b*y + a*x (len(x) >= len(y)).
func scaleAxpyGo(y []float32, b, a float32, x []float32) {
	x = x[:len(y)]
	for i, v := range x {
		y[i] = b*y[i] + a*v
	}
}

// expShiftGo sets x[i] = exp(x[i] - m) and returns their sum: the
// exponentials of a softmax whose largest input is m.
func expShiftGo(x []float32, m float32) float32 {
	var sum float32
	for i, v := range x {
		x[i] = expf(max(v-m, -87.3))
		sum += x[i]
	}
	return sum
}

// maxF32Go returns the largest of x (-Inf for none). What it returns for a
// NaN in x is left open (a score row's NaN makes its softmax NaN anyway).
func maxF32Go(x []float32) float32 {
	m := float32(math.Inf(-1))
	for _, v := range x {
		if v > m {
			m = v
		}
	}
	return m
}

// sumSquaresGo returns the sum of x[i]^2 in float64.
func sumSquaresGo(x []float32) float64 {
	var ss float64
	for _, v := range x {
		ss += float64(v) * float64(v)
	}
	return ss
}

// scaleMulGo sets dst[i] = x[i] * s * w[i] (len(dst), len(w) >= len(x)).
func scaleMulGo(dst, x, w []float32, s float32) {
	dst, w = dst[:len(x)], w[:len(x)]
	for i, v := range x {
		dst[i] = v * s * w[i]
	}
}

// siluMulGo sets out[i] = silu(g[i]) * u[i] (len(g), len(u) >= len(out)).
func siluMulGo(out, g, u []float32) {
	g, u = g[:len(out)], u[:len(out)]
	for i := range out {
		out[i] = silu(g[i]) * u[i]
	}
}

// axpyBF16Go adds a*x to y for bf16 x (len(x) >= len(y)).
func axpyBF16Go(y []float32, a float32, x []uint16) {
	x = x[:len(y)]
	for i, v := range x {
		y[i] += a * backend.BF16ToF32(v)
	}
}

// gemm6x16Go sets c[i*ldc+j] = sum_{p<k} a[i*lda+p] * b[p*16+j] for i < 6
// and j < 16: six input rows against a block of 16 weight rows packed
// k-major.
func gemm6x16Go(a []float32, lda int, b []float32, k int, c []float32, ldc int) {
	for i := range 6 {
		ai := a[i*lda : i*lda+k]
		ci := c[i*ldc : i*ldc+16]
		clear(ci)
		for p, av := range ai {
			bp := b[p*16 : p*16+16]
			for j := range ci {
				ci[j] += av * bp[j]
			}
		}
	}
}
