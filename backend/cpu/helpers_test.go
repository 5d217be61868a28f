package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kiln-llm/kiln/backend"
)

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x6b696c6e)) }

func randVec(r *rand.Rand, n int, scale float64) []float64 {
	v := make([]float64, n)
	for i := range v {
		v[i] = r.NormFloat64() * scale
	}
	return v
}

func toF32(v []float64) []float32 {
	f := make([]float32, len(v))
	for i, x := range v {
		f[i] = float32(x)
	}
	return f
}

func toF64(v []float32) []float64 {
	f := make([]float64, len(v))
	for i, x := range v {
		f[i] = float64(x)
	}
	return f
}

// tensorF32 allocates an f32 tensor holding v.
func tensorF32(b *Backend, v []float64, shape ...int) backend.Tensor {
	t := b.Alloc(backend.F32, shape...)
	b.Write(t, asBytes(toF32(v)))
	return t
}

func readF32(t *testing.T, b *Backend, x backend.Tensor) []float32 {
	t.Helper()
	out := make([]float32, backend.Numel(x))
	if err := b.Read(x, asBytes(out)); err != nil {
		t.Fatal(err)
	}
	return out
}

// loadWeight stores v in dtype dt and loads it; v is replaced by the values
// the dtype can represent, so references see exactly what the backend reads.
func loadWeight(t *testing.T, b *Backend, dt backend.DType, v []float64, shape ...int) backend.Tensor {
	t.Helper()
	var data []byte
	switch dt {
	case backend.F32:
		f := toF32(v)
		for i := range v {
			v[i] = float64(f[i])
		}
		data = asBytes(f)
	case backend.BF16, backend.F16:
		enc, dec := backend.BF16Bits, backend.BF16ToF32
		if dt == backend.F16 {
			enc, dec = backend.F16Bits, backend.F16ToF32
		}
		h := make([]uint16, len(v))
		for i := range v {
			h[i] = enc(float32(v[i]))
			v[i] = float64(dec(h[i]))
		}
		data = asBytes(h)
	}
	w, err := b.Load(dt, shape, data)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// compare fails unless |got-want| <= tol * max(1, max|want|) everywhere.
func compare(t *testing.T, what string, got []float32, want []float64, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	scale := 1.0
	for _, w := range want {
		scale = max(scale, math.Abs(w))
	}
	worst, at := 0.0, 0
	for i := range got {
		if d := math.Abs(float64(got[i]) - want[i]); d > worst || math.IsNaN(d) {
			worst, at = d, i
			if math.IsNaN(d) {
				break
			}
		}
	}
	if !(worst <= tol*scale) {
		t.Fatalf("%s: |got-want| = %.3g at %d (got %v, want %v), tolerance %.3g", what, worst, at, got[at], want[at], tol*scale)
	}
}
