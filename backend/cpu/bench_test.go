package cpu

import (
	"fmt"
	"testing"

	"github.com/kiln-llm/kiln/backend"
)

// BenchmarkCopy measures this machine's memory bandwidth as a large copy
// split over all cores, counting the bytes read plus the bytes written: the
// floor that a bandwidth-bound GEMV is compared against.
func BenchmarkCopy(b *testing.B) {
	const n = 512 << 20
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	p := New(Options{}).pool
	b.SetBytes(2 * n)
	b.ResetTimer()
	for range b.N {
		p.For(n, 1<<20, func(lo, hi int) { copy(dst[lo:hi], src[lo:hi]) })
	}
}

// BenchmarkGEMV is batch-1 decode through a Qwen3-0.6B-sized set of bf16
// matrices (MLP up/gate, down, and the lm head); bytes are the weights read.
func BenchmarkGEMV(b *testing.B) {
	for _, sz := range [][2]int{{3072, 1024}, {1024, 3072}, {151936, 1024}} {
		for _, n := range []int{1, 4} {
			b.Run(fmt.Sprintf("%dx%d/n=%d", sz[0], sz[1], n), func(b *testing.B) { benchMatMul(b, backend.BF16, sz[0], sz[1], n) })
		}
	}
}

// BenchmarkPrefill is a many-row matmul; bytes are the weights read.
func BenchmarkPrefill(b *testing.B) {
	benchMatMul(b, backend.BF16, 3072, 1024, 256)
}

// benchMatMul runs out = x w^T over enough distinct copies of w (together
// larger than any cache) that every call reads its weights from memory.
func benchMatMul(b *testing.B, dt backend.DType, o, k, n int) {
	be := New(Options{})
	r := newRand(1)
	size := o * k * dt.Size()
	ws := make([]backend.Tensor, max(1, (1<<30)/size))
	for i := range ws {
		wb := make([]byte, size)
		h := bytesAs[uint16](wb)
		for j := range h {
			h[j] = f32ToBF16(float32(r.NormFloat64()))
		}
		w, err := be.Load(dt, []int{o, k}, wb)
		if err != nil {
			b.Fatal(err)
		}
		ws[i] = w
	}
	x := tensorF32(be, randVec(r, n*k, 1), n, k)
	out := be.Alloc(backend.F32, n, o)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := range b.N {
		be.MatMul(out, x, ws[i%len(ws)], false)
	}
	b.ReportMetric(2*float64(o*k*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}
