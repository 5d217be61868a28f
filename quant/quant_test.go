package quant

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kiln-llm/kiln/backend"
)

func TestE4M3RoundTrip(t *testing.T) {
	for v := range 256 {
		f := E4M3(uint8(v))
		if f != f {
			if v&0x7f != 0x7f {
				t.Fatalf("%#x decodes to NaN", v)
			}
			continue
		}
		if got := E4M3Bits(f); got != uint8(v) && !(f == 0 && got&0x7f == 0) {
			t.Fatalf("%#x -> %v -> %#x", v, f, got)
		}
	}
	if E4M3(0x7e) != 448 || E4M3(0x01) != 1.0/512 {
		t.Fatalf("max %v, smallest %v", E4M3(0x7e), E4M3(0x01))
	}
	// Halfway between 1 and 1.125 rounds to even (1); beyond 448 saturates.
	if E4M3Bits(1.0625) != 0x38 || E4M3Bits(1e6) != 0x7e || E4M3Bits(-1e6) != 0xfe {
		t.Fatalf("rounding: %#x %#x %#x", E4M3Bits(1.0625), E4M3Bits(1e6), E4M3Bits(-1e6))
	}
}

func normal(n int, rng *rand.Rand) []float32 {
	w := make([]float32, n)
	for i := range w {
		w[i] = float32(rng.NormFloat64() * 0.02)
	}
	return w
}

func relL2(a, b []float32) float64 {
	var num, den float64
	for i := range a {
		d := float64(a[i] - b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	return math.Sqrt(num / den)
}

// Each quantizer's round trip lands within the error its bits allow.
func TestQuantizeRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		dt         backend.DType
		rows, cols int
		tol        float64
	}{
		{backend.FP8, 130, 200, 0.04},
		{backend.Q8_0, 7, 512, 0.01},
		{backend.Q4_K, 5, 512, 0.12},
	} {
		w := normal(c.rows*c.cols, rng)
		q, err := Quantize(c.dt, w, c.rows, c.cols)
		if err != nil {
			t.Fatal(err)
		}
		if len(q) != c.dt.Bytes(c.rows, c.cols) {
			t.Fatalf("%v: %d bytes, want %d", c.dt, len(q), c.dt.Bytes(c.rows, c.cols))
		}
		if e := relL2(Dequantize(c.dt, q, c.rows, c.cols), w); e > c.tol || e == 0 {
			t.Errorf("%v: relative L2 %.4f, want (0, %v]", c.dt, e, c.tol)
		}
	}
	if _, err := Quantize(backend.Q4_K, make([]float32, 64), 1, 64); err == nil {
		t.Error("Q4_K of a 64-wide row: no error")
	}
}

// FP8 rows made from a checkpoint's tiles hold each element's tile scale,
// and dequantize to weight * scale exactly.
func TestFromTiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	rows, cols := 300, 260
	w := make([]byte, rows*cols)
	for i := range w {
		w[i] = byte(rng.IntN(256))
		if w[i]&0x7f == 0x7f {
			w[i] = 0x10
		}
	}
	scales := make([]float32, 3*3)
	for i := range scales {
		scales[i] = float32(i+1) / 64
	}
	q, err := FromTiles(w, scales, rows, cols, 128, 128)
	if err != nil {
		t.Fatal(err)
	}
	got := Dequantize(backend.FP8, q, rows, cols)
	for r := range rows {
		for c := range cols {
			want := E4M3(w[r*cols+c]) * scales[r/128*3+c/128]
			if got[r*cols+c] != want {
				t.Fatalf("[%d,%d] = %v, want %v", r, c, got[r*cols+c], want)
			}
		}
	}
	if _, err := FromTiles(w, scales[:8], rows, cols, 128, 128); err == nil {
		t.Error("too few scales: no error")
	}
}

// Random blocks have finite values of about the asked spread.
func TestRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dt := range []backend.DType{backend.Q8_0, backend.Q4_K, backend.Q5_K, backend.Q6_K, backend.MXFP4, backend.FP8} {
		w := Dequantize(dt, Random(dt, 16, 512, 0.02, rng.Uint64), 16, 512)
		var ss float64
		for _, v := range w {
			if v != v || math.IsInf(float64(v), 0) {
				t.Fatalf("%v: %v", dt, v)
			}
			ss += float64(v) * float64(v)
		}
		if rms := math.Sqrt(ss / float64(len(w))); rms < 0.005 || rms > 0.08 {
			t.Errorf("%v: rms %.4f, want about 0.02", dt, rms)
		}
	}
}
