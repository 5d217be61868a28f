package cpu

// The inner loops of matmul. Each keeps several independent accumulators so
// the adds pipeline; the assembly versions, where present, replace these at
// init (see kernels_amd64.go).

var (
	dotF32   = dotF32Go
	dot4F32  = dot4F32Go
	dotBF16  = dotBF16Go
	dot4BF16 = dot4BF16Go
)

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

// dot4F32Go sets out[j] = x . w[j*k:(j+1)*k] for j < 4.
func dot4F32Go(x, w []float32, k int, out []float32) {
	x = x[:k]
	w0, w1, w2, w3 := w[:k], w[k:2*k], w[2*k:3*k], w[3*k:4*k]
	var s0, s1, s2, s3 float32
	for i, v := range x {
		s0 += v * w0[i]
		s1 += v * w1[i]
		s2 += v * w2[i]
		s3 += v * w3[i]
	}
	out[0], out[1], out[2], out[3] = s0, s1, s2, s3
}

func dotBF16Go(x []float32, w []uint16) float32 {
	w = w[:len(x)]
	var s0, s1 float32
	i := 0
	for ; i+2 <= len(x); i += 2 {
		s0 += x[i] * bf16ToF32(w[i])
		s1 += x[i+1] * bf16ToF32(w[i+1])
	}
	for ; i < len(x); i++ {
		s0 += x[i] * bf16ToF32(w[i])
	}
	return s0 + s1
}

// dot4BF16Go sets out[j] = x . w[j*k:(j+1)*k] for j < 4.
func dot4BF16Go(x []float32, w []uint16, k int, out []float32) {
	x = x[:k]
	w0, w1, w2, w3 := w[:k], w[k:2*k], w[2*k:3*k], w[3*k:4*k]
	var s0, s1, s2, s3 float32
	for i, v := range x {
		s0 += v * bf16ToF32(w0[i])
		s1 += v * bf16ToF32(w1[i])
		s2 += v * bf16ToF32(w2[i])
		s3 += v * bf16ToF32(w3[i])
	}
	out[0], out[1], out[2], out[3] = s0, s1, s2, s3
}
