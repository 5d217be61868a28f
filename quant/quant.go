// Package quant holds the block-quantized weight formats of backend.DType as
// plain Go: the exact dequantization every backend is checked against, the
// quantizers behind --quantize, and Qwen's FP8 tiles turned into kiln's FP8
// rows. The block layouts are described in backend/quant.go.
package quant

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/kiln-llm/kiln/backend"
)

// DequantizeRow writes the cols elements of one row stored in dt to dst
// (len(dst) == cols, len(row) == dt.RowBytes(cols)), computing each value in
// float32 the way llama.cpp's reference dequantization does.
func DequantizeRow(dt backend.DType, row []byte, dst []float32) {
	if len(row) != dt.RowBytes(len(dst)) {
		panic(fmt.Sprintf("quant: %v row of %d elements from %d bytes", dt, len(dst), len(row)))
	}
	e, bs := dt.Block()
	for i := 0; i*e < len(dst); i++ {
		blk := row[i*bs : (i+1)*bs]
		out := dst[i*e : min((i+1)*e, len(dst))]
		switch dt {
		case backend.Q8_0:
			q8_0(blk, out)
		case backend.Q4_K:
			q4k(blk, out)
		case backend.Q5_K:
			q5k(blk, out)
		case backend.Q6_K:
			q6k(blk, out)
		case backend.MXFP4:
			mxfp4(blk, out)
		case backend.FP8:
			fp8(blk, out)
		default:
			panic(fmt.Sprintf("quant: %v is not a quantized type", dt))
		}
	}
}

// Dequantize returns a [rows, cols] matrix stored in dt as float32.
func Dequantize(dt backend.DType, data []byte, rows, cols int) []float32 {
	out := make([]float32, rows*cols)
	rb := dt.RowBytes(cols)
	for r := range rows {
		DequantizeRow(dt, data[r*rb:(r+1)*rb], out[r*cols:(r+1)*cols])
	}
	return out
}

func f16(b []byte) float32 { return backend.F16ToF32(binary.LittleEndian.Uint16(b)) }

func q8_0(b []byte, out []float32) {
	d := f16(b)
	for j := range out {
		out[j] = float32(int8(b[2+j])) * d
	}
}

// scaleMin returns the 6-bit scale and min of sub-block j of a Q4_K or Q5_K
// block from its 12 packed bytes: sub-blocks 0-3 keep theirs in the low six
// bits of bytes j and j+4, sub-blocks 4-7 split theirs between a nibble of
// byte j+4 and the top two bits of bytes j-4 and j.
func scaleMin(j int, s []byte) (sc, m float32) {
	if j < 4 {
		return float32(s[j] & 63), float32(s[j+4] & 63)
	}
	return float32(s[j+4]&0xf | s[j-4]>>6<<4), float32(s[j+4]>>4 | s[j]>>6<<4)
}

func q4k(b []byte, out []float32) {
	d, dmin := f16(b), f16(b[2:])
	scales, qs := b[4:16], b[16:144]
	for j := range 8 {
		sc, m := scaleMin(j, scales)
		d1, m1 := d*sc, dmin*m
		q := qs[j/2*32 : j/2*32+32]
		shift := uint(j%2) * 4
		for l := range 32 {
			out[j*32+l] = float32(d1*float32(q[l]>>shift&0xf)) - m1
		}
	}
}

func q5k(b []byte, out []float32) {
	d, dmin := f16(b), f16(b[2:])
	scales, qh, qs := b[4:16], b[16:48], b[48:176]
	for j := range 8 {
		sc, m := scaleMin(j, scales)
		d1, m1 := d*sc, dmin*m
		q := qs[j/2*32 : j/2*32+32]
		shift := uint(j%2) * 4
		for l := range 32 {
			v := q[l]>>shift&0xf | (qh[l]>>uint(j)&1)<<4
			out[j*32+l] = float32(d1*float32(v)) - m1
		}
	}
}

func q6k(b []byte, out []float32) {
	ql, qh, sc := b[0:128], b[128:192], b[192:208]
	d := f16(b[208:])
	for n := range 2 {
		l4, h2, s8 := ql[n*64:], qh[n*32:], sc[n*8:]
		for l := range 32 {
			is := l / 16
			q1 := int(l4[l]&0xf|(h2[l]>>0&3)<<4) - 32
			q2 := int(l4[l+32]&0xf|(h2[l]>>2&3)<<4) - 32
			q3 := int(l4[l]>>4|(h2[l]>>4&3)<<4) - 32
			q4 := int(l4[l+32]>>4|(h2[l]>>6&3)<<4) - 32
			o := out[n*128:]
			o[l] = float32(d*float32(int8(s8[is]))) * float32(q1)
			o[l+32] = float32(d*float32(int8(s8[is+2]))) * float32(q2)
			o[l+64] = float32(d*float32(int8(s8[is+4]))) * float32(q3)
			o[l+96] = float32(d*float32(int8(s8[is+6]))) * float32(q4)
		}
	}
}

// e2m1 holds twice the e2m1 values (llama.cpp's kvalues_mxfp4), so that
// they are integers; E8M0Half halves the scale to match.
var e2m1 = [16]float32{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}

// E8M0Half returns half of the e8m0 scale 2^(e-127).
func E8M0Half(e uint8) float32 {
	if e < 2 {
		return math.Float32frombits(0x00200000 << e)
	}
	return math.Float32frombits(uint32(e-1) << 23)
}

func mxfp4(b []byte, out []float32) {
	d := E8M0Half(b[0])
	for j := range 16 {
		out[j] = e2m1[b[1+j]&0xf] * d
		out[j+16] = e2m1[b[1+j]>>4] * d
	}
}

func fp8(b []byte, out []float32) {
	s := math.Float32frombits(binary.LittleEndian.Uint32(b))
	for j := range out {
		out[j] = E4M3(b[4+j]) * s
	}
}

// E4M3 widens an e4m3 (float8_e4m3fn) value: bias 7, no infinities, 0x7f
// and 0xff are NaN.
func E4M3(v uint8) float32 {
	sign := float32(1)
	if v&0x80 != 0 {
		sign = -1
	}
	e, m := int(v>>3&0xf), float32(v&7)
	switch {
	case e == 0xf && v&7 == 7:
		return float32(math.NaN())
	case e == 0:
		return sign * m * (1.0 / 512)
	}
	return sign * (1 + m/8) * float32(math.Ldexp(1, e-7))
}

// E4M3Bits rounds f to e4m3, to nearest with ties to even, saturating at
// ±448 (the largest finite value).
func E4M3Bits(f float32) uint8 {
	var sign uint8
	if math.Signbit(float64(f)) {
		sign, f = 0x80, -f
	}
	switch {
	case f != f:
		return 0x7f
	case f >= 448:
		return sign | 0x7e
	}
	// Below 2^-6 the spacing is 2^-9 (subnormals); above, 2^(e-3).
	exp := max(math.Ilogb(float64(f)), -6)
	step := math.Ldexp(1, exp-3)
	q := math.RoundToEven(float64(f) / step)
	v := q * step
	if v >= 448 {
		return sign | 0x7e
	}
	if v == 0 {
		return sign
	}
	e := math.Ilogb(v)
	if e < -6 {
		return sign | uint8(q) // subnormal: q*2^-9
	}
	m := int(math.Round(v/math.Ldexp(1, e)*8)) - 8
	return sign | uint8(e+7)<<3 | uint8(m)
}
