package quant

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/kiln-llm/kiln/backend"
)

// Quantizable lists the types Quantize makes (--quantize).
var Quantizable = []backend.DType{backend.FP8, backend.Q8_0, backend.Q4_K}

// Quantize stores a [rows, cols] float32 matrix in dt. FP8 takes one scale
// per 128x128 tile, as Qwen's FP8 checkpoints do; Q8_0 rounds as llama.cpp's
// reference quantizer; Q4_K fits each sub-block's scale and minimum to its
// range (llama.cpp searches further for a smaller error; its files are
// loaded as they are).
func Quantize(dt backend.DType, w []float32, rows, cols int) ([]byte, error) {
	if err := dt.CheckCols(cols); err != nil {
		return nil, err
	}
	if len(w) != rows*cols {
		panic(fmt.Sprintf("quant: %d values for [%d, %d]", len(w), rows, cols))
	}
	out := make([]byte, rows*dt.RowBytes(cols))
	rb := dt.RowBytes(cols)
	switch dt {
	case backend.FP8:
		scales := fp8TileScales(w, rows, cols)
		tc := (cols + 127) / 128
		for r := range rows {
			for c := range tc {
				s := scales[r/128*tc+c]
				blk := out[r*rb+c*132:]
				binary.LittleEndian.PutUint32(blk, math.Float32bits(s))
				for j := c * 128; j < min(c*128+128, cols); j++ {
					blk[4+j-c*128] = E4M3Bits(w[r*cols+j] / s)
				}
			}
		}
	case backend.Q8_0:
		for r := range rows {
			for b := 0; b < cols/32; b++ {
				quantQ8_0(w[r*cols+b*32:][:32], out[r*rb+b*34:][:34])
			}
		}
	case backend.Q4_K:
		for r := range rows {
			for b := 0; b < cols/256; b++ {
				quantQ4K(w[r*cols+b*256:][:256], out[r*rb+b*144:][:144])
			}
		}
	default:
		return nil, fmt.Errorf("quant: kiln does not quantize to %v (it can: fp8, q8_0, q4_k)", dt)
	}
	return out, nil
}

// fp8TileScales returns amax/448 of each 128x128 tile (1 for a zero tile),
// row-major over the tiles.
func fp8TileScales(w []float32, rows, cols int) []float32 {
	tr, tc := (rows+127)/128, (cols+127)/128
	s := make([]float32, tr*tc)
	for r := range rows {
		for j, v := range w[r*cols : (r+1)*cols] {
			t := &s[r/128*tc+j/128]
			*t = max(*t, float32(math.Abs(float64(v))))
		}
	}
	for i := range s {
		if s[i] == 0 {
			s[i] = 1
		} else {
			s[i] /= 448
		}
	}
	return s
}

func quantQ8_0(x []float32, blk []byte) {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(blk, backend.F16Bits(d))
	for j, v := range x {
		blk[2+j] = byte(int8(math.Round(float64(v * id))))
	}
}

func quantQ4K(x []float32, blk []byte) {
	var scale, mins [8]float32
	for j := range 8 {
		lo, hi := float32(0), float32(0)
		for _, v := range x[j*32 : j*32+32] {
			lo, hi = min(lo, v), max(hi, v)
		}
		scale[j], mins[j] = (hi-lo)/15, -lo
	}
	var maxS, maxM float32
	for j := range 8 {
		maxS, maxM = max(maxS, scale[j]), max(maxM, mins[j])
	}
	d := backend.F16ToF32(backend.F16Bits(maxS / 63))
	dmin := backend.F16ToF32(backend.F16Bits(maxM / 63))
	binary.LittleEndian.PutUint16(blk, backend.F16Bits(d))
	binary.LittleEndian.PutUint16(blk[2:], backend.F16Bits(dmin))
	var ls, lm [8]uint8
	for j := range 8 {
		if d > 0 {
			ls[j] = uint8(min(63, math.Round(float64(scale[j]/d))))
		}
		if dmin > 0 {
			lm[j] = uint8(min(63, math.Round(float64(mins[j]/dmin))))
		}
	}
	s := blk[4:16]
	for j := range 4 {
		s[j] = ls[j] | ls[j+4]>>4<<6
		s[j+4] = lm[j] | lm[j+4]>>4<<6
		s[j+8] = ls[j+4]&0xf | lm[j+4]&0xf<<4
	}
	qs := blk[16:144]
	for j := range 8 {
		sc, m := d*float32(ls[j]), dmin*float32(lm[j])
		for l := range 32 {
			var q float64
			if sc > 0 {
				q = math.Round(float64((x[j*32+l] + m) / sc))
			}
			qs[j/2*32+l] |= uint8(min(15, max(0, q))) << (uint(j%2) * 4)
		}
	}
}

// FromTiles converts a checkpoint's FP8 weight, e4m3 [rows, cols], and its
// weight_scale_inv, one scale per tile of br x bc ([ceil(rows/br),
// ceil(cols/bc)]), into kiln's FP8 rows. bc must be 128; the scale of each
// 128-element block of a row is its tile's.
func FromTiles(w []byte, scales []float32, rows, cols, br, bc int) ([]byte, error) {
	if bc != 128 || br <= 0 {
		return nil, fmt.Errorf("quant: FP8 blocks of %dx%d; kiln reads [rows, 128] tiles", br, bc)
	}
	tr, tc := (rows+br-1)/br, (cols+127)/128
	if len(w) != rows*cols || len(scales) != tr*tc {
		return nil, fmt.Errorf("quant: FP8 weight of %d bytes with %d scales for [%d, %d] in %dx%d tiles", len(w), len(scales), rows, cols, br, bc)
	}
	rb := backend.FP8.RowBytes(cols)
	out := make([]byte, rows*rb)
	for r := range rows {
		for c := range tc {
			blk := out[r*rb+c*132:]
			binary.LittleEndian.PutUint32(blk, math.Float32bits(scales[r/br*tc+c]))
			copy(blk[4:132], w[r*cols+c*128:r*cols+min(c*128+128, cols)])
		}
	}
	return out, nil
}

// Random fills rows x cols of dt with blocks whose values spread like
// N(0, std) weights, without the cost of quantizing (synthetic models of
// billions of parameters). next returns uniform 64-bit values.
func Random(dt backend.DType, rows, cols int, std float32, next func() uint64) []byte {
	rb := dt.RowBytes(cols)
	out := make([]byte, rows*rb)
	for i := 0; i < len(out); i += 8 {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], next())
		copy(out[i:], b[:])
	}
	_, bs := dt.Block()
	for r := range rows {
		row := out[r*rb : (r+1)*rb]
		for i := 0; i < len(row); i += bs {
			fixScales(dt, row[i:i+bs], std)
		}
	}
	return out
}

// fixScales replaces a random block's scale fields with ones that give its
// (uniform) quants about the standard deviation std.
func fixScales(dt backend.DType, blk []byte, std float32) {
	h := func(v float32) uint16 { return backend.F16Bits(v) }
	switch dt {
	case backend.Q8_0: // uniform int8: std 74
		binary.LittleEndian.PutUint16(blk, h(std/74))
	case backend.Q4_K, backend.Q5_K: // x = d*sc*q - dmin*m, sc, m < 64
		levels, mid := float32(4.6), float32(7.5) // uniform 4-bit quants
		if dt == backend.Q5_K {
			levels, mid = 9.2, 15.5
		}
		for j := range 12 {
			blk[4+j] = blk[4+j]&0x30 | 0xcf // 6-bit scales and mins of 15..63
		}
		d := std / levels / 40
		binary.LittleEndian.PutUint16(blk, h(d))
		binary.LittleEndian.PutUint16(blk[2:], h(d*mid)) // centres the values near 0
	case backend.Q6_K: // 16 int8 scales, q-32 uniform over 64 levels: std 18.5
		for j := range 16 {
			blk[192+j] = byte(int8(blk[192+j]%32) + 32)
		}
		binary.LittleEndian.PutUint16(blk[208:], h(std/18.5/48))
	case backend.MXFP4: // e2m1 doubled: std about 5
		blk[0] = uint8(127 + math.Round(math.Log2(float64(std/5*2))))
	case backend.FP8: // e4m3 bytes with exponent fields 5..8 (values 0.25..3.75)
		for j := 4; j < 132; j++ {
			blk[j] = blk[j]&0x87 | (5+blk[j]>>3&3)<<3
		}
		binary.LittleEndian.PutUint32(blk, math.Float32bits(std/1.4))
	}
}
