package cpu

import (
	"fmt"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/quant"
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

// BenchmarkRead measures this machine's read bandwidth: a dot product over
// 512 MB of f32 split over all cores (bytes are those read), the ceiling of
// a GEMV that reads each weight once.
func BenchmarkRead(b *testing.B) {
	const n = 128 << 20
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i & 7)
	}
	p := New(Options{}).pool
	ones := make([]float32, 1<<20)
	sink := make([]float32, n>>20)
	b.SetBytes(4 * n)
	b.ResetTimer()
	for range b.N {
		p.For(n>>20, 1, func(lo, hi int) {
			for c := lo; c < hi; c++ {
				sink[c] += dotF32(ones, x[c<<20:(c+1)<<20])
			}
		})
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

// BenchmarkQuantGEMV is decode through quantized weights of Qwen3-0.6B's
// MLP shapes, bf16 beside them; bytes are the weights read, so MB/s is the
// bandwidth the product streams them at. Keep it short on a shared machine:
//
//	go test -run - -bench QuantGEMV -benchtime 200x ./backend/cpu
func BenchmarkQuantGEMV(b *testing.B) {
	for _, dt := range []backend.DType{backend.BF16, backend.Q8_0, backend.Q4_K, backend.Q6_K, backend.FP8, backend.Q5_K, backend.MXFP4} {
		for _, sz := range [][2]int{{3072, 1024}, {1024, 3072}} {
			for _, n := range []int{1, 4} {
				b.Run(fmt.Sprintf("%v/%dx%d/n=%d", dt, sz[0], sz[1], n), func(b *testing.B) { benchMatMul(b, dt, sz[0], sz[1], n) })
			}
		}
	}
}

// BenchmarkQuantPrefill is a many-row product through quantized weights.
func BenchmarkQuantPrefill(b *testing.B) {
	for _, dt := range []backend.DType{backend.Q8_0, backend.Q4_K, backend.Q6_K, backend.FP8} {
		b.Run(dt.String(), func(b *testing.B) { benchMatMul(b, dt, 3072, 1024, 256) })
	}
}

// benchMatMul runs out = x w^T over enough distinct copies of w (together
// larger than any cache) that every call reads its weights from memory.
func benchMatMul(b *testing.B, dt backend.DType, o, k, n int) {
	be := New(Options{})
	r := newRand(1)
	size := dt.Bytes(o, k)
	var first []byte
	if dt.Quantized() {
		first = quant.Random(dt, o, k, 1, r.Uint64)
	} else {
		first = make([]byte, size)
		h := bytesAs[uint16](first)
		for j := range h {
			h[j] = backend.BF16Bits(float32(r.NormFloat64()))
		}
	}
	total := 1 << 30
	if dt.Quantized() {
		total = 512 << 20 // the same bytes in fewer copies: set up faster
	}
	ws := make([]backend.Tensor, max(1, total/size))
	for i := range ws {
		wb := append([]byte(nil), first...)
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

// BenchmarkAttention is one attention layer of Qwen3-0.6B's shape (16 heads,
// 8 kv heads, head dim 128): a 512-token prefill chunk and a single decoded
// token after 8K tokens of context, a follow-up turn's 100 tokens after
// 850, and a decoded token after 160 (the CPU decode bar's context); each
// with a bf16 and an f32 (the CPU's default) cache.
func BenchmarkAttention(b *testing.B) {
	for _, c := range []struct{ ctx, n int }{{8192, 512}, {8192, 1}, {850, 100}, {160, 1}} {
		for _, kvdt := range []backend.DType{backend.BF16, backend.F32} {
			ctx, n := c.ctx, c.n
			b.Run(fmt.Sprintf("ctx%d/new=%d/%v", ctx, n, kvdt), func(b *testing.B) {
				be := New(Options{})
				spec := attnSpec(16, 8, 128, 128, false, false)
				const bs = 16
				kv, err := be.NewKVCache(backend.KVSpec{Layers: 1, Blocks: (ctx + n + bs - 1) / bs, BlockSize: bs, KVHeads: 8, HeadDim: 128, DType: kvdt})
				if err != nil {
					b.Fatal(err)
				}
				blocks := make([]int32, (ctx+n+bs-1)/bs)
				for i := range blocks {
					blocks[i] = int32(i)
				}
				r := newRand(3)
				ones := make([]float64, 128)
				for i := range ones {
					ones[i] = 1
				}
				w := backend.AttnWeights{QNorm: tensorF32(be, ones, 128), KNorm: tensorF32(be, ones, 128)}
				qkv := tensorF32(be, randVec(r, n*spec.QKVWidth(), 1), n, spec.QKVWidth())
				out := be.Alloc(backend.F32, n, 16*128)
				be.Begin(&backend.Batch{Tokens: make([]int32, n), Seqs: []backend.SeqInfo{{Pos: ctx, N: n, Blocks: blocks}}})
				b.ResetTimer()
				for range b.N {
					be.Attention(out, qkv, w, &spec, kv, 0)
				}
			})
		}
	}
}

// BenchmarkDeltaNet is one Gated DeltaNet layer of Qwen3-Next's shape (16 key
// heads, 32 value heads, dims 128): a 512-token prefill chunk continuing a
// sequence, and a single decoded token.
func BenchmarkDeltaNet(b *testing.B) {
	spec := backend.DeltaNetSpec{KeyHeads: 16, ValueHeads: 32, KeyDim: 128, ValueDim: 128, ConvKernel: 4, Chunk: 64}
	for _, n := range []int{512, 1} {
		b.Run(fmt.Sprintf("new=%d", n), func(b *testing.B) {
			be := New(Options{})
			st, err := be.NewStateCache(backend.StateSpec{Layers: 1, Slots: 1, DeltaNet: spec})
			if err != nil {
				b.Fatal(err)
			}
			r := newRand(4)
			CD, HV := spec.ConvDim(), spec.ValueHeads
			convW := tensorF32(be, randVec(r, CD*4, 0.5), CD, 4)
			aLog, dtBias := tensorF32(be, randVec(r, HV, 0.5), HV), tensorF32(be, randVec(r, HV, 0.5), HV)
			mixed := tensorF32(be, randVec(r, n*CD, 1), n, CD)
			ba := tensorF32(be, randVec(r, n*2*HV, 1), n, 2*HV)
			conv := be.Alloc(backend.F32, n, CD)
			out := be.Alloc(backend.F32, n, HV*spec.ValueDim)
			be.Begin(&backend.Batch{Tokens: make([]int32, n), Seqs: []backend.SeqInfo{{Pos: 1000, N: n}}})
			b.ResetTimer()
			for range b.N {
				be.CausalConv1d(conv, mixed, convW, st, 0)
				be.GatedDeltaRule(out, conv, ba, aLog, dtBias, &spec, st, 0)
			}
		})
	}
}

// BenchmarkSample draws a token for each of 16 rows of a Qwen-sized
// vocabulary, greedy and sampled, free and under token masks (a
// constrained step: a third of the vocabulary, or 50 tokens).
func BenchmarkSample(b *testing.B) {
	const R, V = 16, 151936
	be := New(Options{})
	r := newRand(3)
	logits := tensorF32(be, randVec(r, R*V, 3), R, V)
	masks := map[string][]uint64{
		"free":  nil,
		"third": backend.NewMask(V, func(t int32) bool { return t%3 == 0 }),
		"50":    backend.NewMask(V, func(t int32) bool { return t%3001 == 7 }),
	}
	for _, temp := range []float32{0, 0.8} {
		for _, name := range []string{"free", "third", "50"} {
			b.Run(fmt.Sprintf("temperature=%g/mask=%s", temp, name), func(b *testing.B) {
				params := make([]backend.SampleParams, R)
				for i := range params {
					params[i] = backend.SampleParams{Temperature: temp, TopP: 0.95, Uniform: 0.5, Mask: masks[name]}
				}
				for b.Loop() {
					if _, err := be.Sample(logits, params); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
