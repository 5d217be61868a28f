//go:build cgo

package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/quant"
)

// benchGPU is the package's GPU for a benchmark, or a skip.
func benchGPU(b *testing.B) *Backend {
	gpuOnce.Do(func() { gpu, gpuErr = New(Options{}) })
	if gpuErr != nil {
		b.Skipf("no GPU: %v", gpuErr)
	}
	return gpu
}

// benchWeightBytes is the least the copies of a benchmark's weight hold
// together: several times an H100's or H200's L2, so that every product
// reads its weights from memory.
const benchWeightBytes = 256 << 20

// benchWeights loads copies of the weight [o, in] of dt whose bytes are
// data, together at least benchWeightBytes.
func benchWeights(b *testing.B, g *Backend, dt backend.DType, o, in int, data []byte) []backend.Tensor {
	ws := make([]backend.Tensor, max(1, benchWeightBytes/len(data)))
	for i := range ws {
		w, err := g.Load(dt, []int{o, in}, data)
		if err != nil {
			b.Fatal(err)
		}
		ws[i] = w
	}
	return ws
}

// benchActivation is a random bf16 activation row [1, n] on g.
func benchActivation(g *Backend, rng *rand.Rand, n int) backend.Tensor {
	x := g.Alloc(backend.BF16, 1, n)
	xs := make([]float32, n)
	for i := range xs {
		xs[i] = float32(rng.NormFloat64())
	}
	g.Write(x, encode(backend.BF16, xs))
	return x
}

// benchGraph times the launches of record captured as the graph key,
// replayed and synchronized each round of b.Loop (the timer stops at the
// loop's end, and the launches alone return long before the GPU is done).
// A graph of benchLaunches launches or more spreads each round's replay
// and synchronization thin. The graph is dropped after, so that a second
// run (-count) captures its own.
func benchGraph(b *testing.B, g *Backend, key string, record func()) {
	defer g.dropGraph(key)
	step := func() {
		g.Graph(key, record)
		if err := g.Sync(); err != nil {
			b.Fatal(err)
		}
	}
	step() // captures
	for b.Loop() {
		step()
	}
}

// benchLaunches is the fewest launches of a benchmark's graph.
const benchLaunches = 256

// benchProducts times a decode step's product of the token x by the
// weights ws in turn into out, in a graph of products each overlapped with
// the one before as a step's are, and reports the time a product and the
// rate its weights (bytes each) were read at.
func benchProducts(b *testing.B, g *Backend, key string, ws []backend.Tensor, x, out backend.Tensor, bytes int) {
	g.Begin(&backend.Batch{Tokens: []int32{0}, Seqs: []backend.SeqInfo{{N: 1}}})
	n := max(benchLaunches, len(ws))
	benchGraph(b, g, key, func() {
		for i := range n {
			g.MatMul(out, x, ws[i%len(ws)], false)
		}
	})
	per := b.Elapsed().Seconds() / float64(b.N*n)
	b.ReportMetric(per*1e6, "us/product")
	b.ReportMetric(float64(bytes)/per/1e12, "TB/s")
}

// BenchmarkDecodeProducts times one token's product by a weight of
// Qwen3-8B's shapes in Q8_0, Q4_K and bf16 (qgemv and the bf16 GEMV;
// BenchmarkFP8Products has FP8's kernels). Against the bytes' time at the
// measured copy rate, the rest of a product's time is its fixed cost,
// which BenchmarkLaunchChain bounds from below.
func BenchmarkDecodeProducts(b *testing.B) {
	g := benchGPU(b)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, dt := range []backend.DType{backend.Q8_0, backend.Q4_K, backend.BF16} {
		for _, s := range qwen3Products {
			// Weights made and loaded inside the case: a -test.bench
			// pattern that leaves it out costs nothing.
			b.Run(fmt.Sprintf("%s/%v", s.name, dt), func(b *testing.B) {
				var data []byte
				if dt.Quantized() {
					data = quant.Random(dt, s.o, s.in, 0.05, rng.Uint64)
				} else {
					v := make([]float32, s.o*s.in)
					for k := range v {
						v[k] = float32(rng.NormFloat64() * 0.05)
					}
					data = encode(dt, v)
				}
				ws := benchWeights(b, g, dt, s.o, s.in, data)
				x, out := benchActivation(g, rng, s.in), g.Alloc(backend.F32, 1, s.o)
				benchProducts(b, g, fmt.Sprintf("bench/%s/%v", s.name, dt), ws, x, out, asT(ws[0]).bytes())
				for _, t := range append(ws, x, out) {
					g.Free(t)
				}
			})
		}
	}
}

// qwen3Products are Qwen3-8B's products, [o, in] each.
var qwen3Products = []struct {
	name  string
	o, in int
}{{"qwen3-8b-qkv", 6144, 4096}, {"qwen3-8b-o", 4096, 4096}, {"qwen3-8b-gate-up", 24576, 4096}, {"qwen3-8b-down", 4096, 12288}}

// BenchmarkLaunchChain times a chain of dependent launches that do nothing
// (zero_f32 of one float, which waits for the kernel before it), of one
// block and of three blocks a multiprocessor, overlapped as a decode step's
// are: what a kernel boundary costs with no bytes behind it.
func BenchmarkLaunchChain(b *testing.B) {
	g := benchGPU(b)
	for _, blocks := range []int{1, 3 * g.sms} {
		b.Run(fmt.Sprintf("blocks=%d", blocks), func(b *testing.B) {
			x := g.Alloc(backend.F32, 1)
			defer g.Free(x)
			benchGraph(b, g, fmt.Sprintf("bench/chain/%d", blocks), func() {
				for range benchLaunches {
					zeroF32Kernel.runOverlapped(g, g1(blocks), 256, 0, zeroF32Args{x: asT(x).ptr, n: 1})
				}
			})
			b.ReportMetric(b.Elapsed().Seconds()*1e6/float64(b.N*benchLaunches), "us/launch")
		})
	}
}

// BenchmarkSample times a sampling of one or eight rows of 151,936 logits
// (Qwen's vocabulary), from the call to the tokens on the host, by its
// parameters: greedy, Qwen's recommended (temperature 0.7, top-p 0.8,
// top-k 20), top-p 0.9 alone and temperature 0.7 alone. The logits are
// normal with a standard deviation of 1 (flat: top-p keeps most of the row
// and most draws land past the 2048 largest, on the whole-row path) or 4
// (peaked: both stay among the candidates).
func BenchmarkSample(b *testing.B) {
	g := benchGPU(b)
	const V = 151936
	rng := rand.New(rand.NewPCG(1, 2))
	cases := []struct {
		name string
		p    backend.SampleParams
	}{
		{"greedy", backend.SampleParams{}},
		{"qwen", backend.SampleParams{Temperature: 0.7, TopP: 0.8, TopK: 20}},
		{"topp", backend.SampleParams{Temperature: 0.7, TopP: 0.9}},
		{"temp", backend.SampleParams{Temperature: 0.7}},
	}
	for _, sd := range []float64{1, 4} {
		for _, R := range []int{1, 8} {
			xs := make([]float32, R*V)
			for i := range xs {
				xs[i] = float32(rng.NormFloat64() * sd)
			}
			x, err := g.Load(backend.F32, []int{R, V}, encode(backend.F32, xs))
			if err != nil {
				b.Fatal(err)
			}
			for _, c := range cases {
				b.Run(fmt.Sprintf("sd%v/R%d/%s", sd, R, c.name), func(b *testing.B) {
					ps := make([]backend.SampleParams, R)
					for i := range ps {
						ps[i] = c.p
						ps[i].Uniform = float32(i+1) / float32(R+1)
					}
					for b.Loop() {
						if _, err := g.Sample(x, ps); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
			g.Free(x)
		}
	}
}
