package backend

import (
	"math"
	"testing"
)

// Every half and bfloat16 value survives the round trip through float32.
func TestRoundTrip(t *testing.T) {
	for i := range 1 << 16 {
		h := uint16(i)
		if f := F16ToF32(h); !math.IsNaN(float64(f)) && F16Bits(f) != h {
			t.Fatalf("f16 %#04x -> %v -> %#04x", h, f, F16Bits(f))
		}
		if f := BF16ToF32(h); !math.IsNaN(float64(f)) && BF16Bits(f) != h {
			t.Fatalf("bf16 %#04x -> %v -> %#04x", h, f, BF16Bits(f))
		}
	}
}

// Between two neighbouring half values, rounding goes to the nearer one and
// ties go to the even one (normal and subnormal ranges alike).
func TestF16Rounding(t *testing.T) {
	for _, h := range []uint16{0x0001, 0x0002, 0x03ff, 0x0400, 0x3c00, 0x3c01, 0x7bfe} {
		lo, hi := float64(F16ToF32(h)), float64(F16ToF32(h+1))
		even := h
		if h&1 == 1 {
			even = h + 1
		}
		for _, c := range []struct {
			x    float64
			want uint16
		}{{lo + (hi-lo)*0.25, h}, {lo + (hi-lo)*0.75, h + 1}, {(lo + hi) / 2, even}} {
			if got := F16Bits(float32(c.x)); got != c.want {
				t.Errorf("F16Bits(%v) = %#04x, want %#04x", c.x, got, c.want)
			}
		}
	}
	if F16Bits(70000) != 0x7c00 || F16Bits(-70000) != 0xfc00 {
		t.Error("values beyond the half range must become infinities")
	}
	if f := F16ToF32(F16Bits(float32(math.NaN()))); !math.IsNaN(float64(f)) {
		t.Error("NaN must stay NaN")
	}
	if BF16Bits(1+1.0/256) != 0x3f80 || BF16Bits(1+3.0/256) != 0x3f82 {
		t.Error("bf16 ties must go to even")
	}
}
