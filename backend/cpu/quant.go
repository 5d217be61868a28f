package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/quant"
)

// Block-quantized weights (backend/quant.go gives the layouts) are read in
// place, like float weights; nothing is dequantized at load. A product
// takes one of two paths (matmul, quantDirectRows):
//
//   - Q8_0, Q4_K, Q5_K, Q6_K and MXFP4: the input rows are quantized once
//     per MatMul to int8 blocks with a float32 scale each (x ≈ d*q, d =
//     amax/127, rounded to nearest even): blocks of 32 for Q8_0 and MXFP4,
//     of 256 carrying the sums of every 16 quants for the K-quants
//     (llama.cpp's Q8_K). A weight block is then an integer dot product
//     (VPMADDUBSW/VPMADDWD on AVX2, four input rows sharing each unpacked
//     weight block; MXFP4's e2m1 values doubled to int8 by a VPSHUFB table)
//     and one float multiply-add by the two scales. The only error beyond
//     float rounding is that of x's int8 rounding: below 1% relative L2 of
//     a product for normal-like rows (the tests bound it). Integer dot
//     products being several times cheaper than f32 ones, this path serves
//     every row count on AVX2; without the assembly, prefill (more than
//     directRows rows) takes the panels.
//   - FP8 up to 64 input rows: e4m3 widened to f32 as it streams (through
//     f16 on AVX2) and dotted in f32, the block scale factored out.
//   - Otherwise (prefill) blocks of 16 weight rows are dequantized into the
//     k-major panels of the 6x16 f32 kernel: the products of the
//     dequantized weights, to float32 rounding.
//
// Embed dequantizes the rows it looks up (exactly, as quant.DequantizeRow).

// dequantBlock writes the len(out) (at most one block's) first elements of
// the block blk of dt to out, exactly as quant.DequantizeRow computes them.
// Q4_K and MXFP4 sub-blocks decode through 16-entry tables of their values
// (each computed as the reference computes it).
func dequantBlock(dt backend.DType, blk []byte, out []float32) {
	e, _ := dt.Block()
	if len(out) < e {
		// A partial block (the panels' FP8 row ends): decode whole, copy.
		var full [256]float32
		dequantBlock(dt, blk, full[:e])
		copy(out, full[:len(out)])
		return
	}
	switch dt {
	case backend.Q8_0:
		d := f16At(blk)
		q, o := (*[32]byte)(blk[2:34]), (*[32]float32)(out)
		for j, v := range q {
			o[j] = float32(int8(v)) * d
		}
	case backend.Q4_K:
		d, dmin := f16At(blk), f16At(blk[2:])
		sc, m := kScales(blk[4:16])
		for j := 0; j < 8; j += 2 {
			var lo, hi [16]float32
			d0, m0 := d*float32(sc[j]), dmin*float32(m[j])
			d1, m1 := d*float32(sc[j+1]), dmin*float32(m[j+1])
			for v := range 16 {
				lo[v] = float32(d0*float32(v)) - m0
				hi[v] = float32(d1*float32(v)) - m1
			}
			q := (*[32]byte)(blk[16+j/2*32:])
			o0, o1 := (*[32]float32)(out[j*32:]), (*[32]float32)(out[j*32+32:])
			for l, v := range q {
				o0[l] = lo[v&0xf]
				o1[l] = hi[v>>4]
			}
		}
	case backend.Q5_K: // (a 32-entry table per sub-block costs more than it saves)
		d, dmin := f16At(blk), f16At(blk[2:])
		sc, m := kScales(blk[4:16])
		qh := (*[32]byte)(blk[16:48])
		for j := 0; j < 8; j += 2 {
			d0, m0 := d*float32(sc[j]), dmin*float32(m[j])
			d1, m1 := d*float32(sc[j+1]), dmin*float32(m[j+1])
			q := (*[32]byte)(blk[48+j/2*32:])
			o0, o1 := (*[32]float32)(out[j*32:]), (*[32]float32)(out[j*32+32:])
			for l, v := range q {
				h := qh[l] >> uint(j)
				o0[l] = float32(d0*float32(v&0xf|h&1<<4)) - m0
				o1[l] = float32(d1*float32(v>>4|h&2<<3)) - m1
			}
		}
	case backend.Q6_K:
		ql, qh, sc := (*[128]byte)(blk[0:128]), (*[64]byte)(blk[128:192]), blk[192:208]
		d := f16At(blk[208:])
		var ds [16]float32
		for i, s := range sc {
			ds[i] = d * float32(int8(s))
		}
		for n := range 2 {
			l4, h2, dn, on := (*[64]byte)(ql[n*64:]), (*[32]byte)(qh[n*32:]), (*[8]float32)(ds[n*8:]), (*[128]float32)(out[n*128:])
			for l := range 32 {
				is := l / 16
				on[l] = dn[is] * float32(int(l4[l]&0xf|(h2[l]&3)<<4)-32)
				on[l+32] = dn[is+2] * float32(int(l4[l+32]&0xf|(h2[l]>>2&3)<<4)-32)
				on[l+64] = dn[is+4] * float32(int(l4[l]>>4|(h2[l]>>4&3)<<4)-32)
				on[l+96] = dn[is+6] * float32(int(l4[l+32]>>4|(h2[l]>>6&3)<<4)-32)
			}
		}
	case backend.MXFP4:
		d := quant.E8M0Half(blk[0])
		var tab [16]float32
		for v, f := range e2m1Half {
			tab[v] = f * d
		}
		q, o := (*[16]byte)(blk[1:17]), (*[32]float32)(out)
		for j, v := range q {
			o[j] = tab[v&0xf]
			o[j+16] = tab[v>>4]
		}
	case backend.FP8:
		s := math.Float32frombits(binary.LittleEndian.Uint32(blk))
		tab := e4m3Lookup()
		q, o := (*[128]byte)(blk[4:132]), (*[128]float32)(out)
		for j, v := range q {
			o[j] = tab[v] * s
		}
	default:
		panic(fmt.Sprintf("cpu: %v is not a quantized type", dt))
	}
}

// dequantRow writes the len(dst) elements of one row of dt to dst.
func dequantRow(dt backend.DType, row []byte, dst []float32) {
	e, bs := dt.Block()
	row = row[:dt.RowBytes(len(dst))]
	for i := 0; i*e < len(dst); i++ {
		dequantBlock(dt, row[i*bs:(i+1)*bs], dst[i*e:min((i+1)*e, len(dst))])
	}
}

func f16At(b []byte) float32 { return f16Lookup()[binary.LittleEndian.Uint16(b)] }

// kScales unpacks the eight 6-bit scales and mins of a Q4_K or Q5_K block
// from its 12 bytes.
func kScales(s []byte) (sc, m [8]uint8) {
	for j := range 4 {
		sc[j], m[j] = s[j]&63, s[j+4]&63
		sc[j+4] = s[j+8]&0xf | s[j]>>6<<4
		m[j+4] = s[j+8]>>4 | s[j+4]>>6<<4
	}
	return
}

// e2m1Half holds twice the e2m1 values (quant.E8M0Half halves the scale),
// e2m1Int the same as integers.
var (
	e2m1Half = [16]float32{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}
	e2m1Int  = [16]int8{0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12}
)

var (
	e4m3Once  sync.Once
	e4m3Table [256]float32
)

func e4m3Lookup() *[256]float32 {
	e4m3Once.Do(func() {
		for i := range e4m3Table {
			e4m3Table[i] = quant.E4M3(uint8(i))
		}
	})
	return &e4m3Table
}

// Input rows quantized to int8 blocks for the integer dot kernels.

// intDot reports whether decode of dt quantizes the input rows to int8, and
// to blocks of how many elements.
func intDot(dt backend.DType) (blk int, ok bool) {
	switch dt {
	case backend.Q8_0, backend.MXFP4:
		return 32, true
	case backend.Q4_K, backend.Q5_K, backend.Q6_K:
		return 256, true
	}
	return 0, false
}

// q8Bytes is the size of one block of a quantized input row: the float32
// scale d, blk int8 quants (x ≈ d*q) and, for blocks of 256, the int16 sums
// of every 16 quants (at q8Sums), like llama.cpp's block_q8_K. A block
// carrying its scale and sums, the kernels follow one pointer per row.
func q8Bytes(blk int) int {
	if blk == 32 {
		return 4 + 32
	}
	return 4 + 256 + 32
}

const q8Sums = 4 + 256

// q8Rows holds n input rows of k elements quantized to blocks of blk, row
// after row.
type q8Rows struct {
	k, blk int
	stride int  // bytes of a row
	pairs  bool // the pair layout (quantizePairs)
	buf    []byte
	words  []uint32 // buf's storage, 4-byte aligned
}

// row returns input row t.
func (a *q8Rows) row(t int) []byte { return a.buf[t*a.stride : (t+1)*a.stride] }

var q8Pool = sync.Pool{New: func() any { return new(q8Rows) }}

// quantizeRows quantizes the n rows of x [n, k] to blocks of blk (k a
// multiple of blk). The result comes from q8Pool; put it back when done.
func quantizeRows(x []float32, n, k, blk int) *q8Rows {
	a := q8Pool.Get().(*q8Rows)
	a.k, a.blk, a.stride, a.pairs = k, blk, k/blk*q8Bytes(blk), false
	a.alloc(n)
	for t := range n {
		quantizeRow(x[t*k:(t+1)*k], blk, a.row(t))
	}
	return a
}

// alloc sizes a's buffer for n rows of its stride.
func (a *q8Rows) alloc(n int) {
	if need := (n*a.stride + 3) / 4; cap(a.words) < need {
		a.words = make([]uint32, need)
	}
	a.buf = asBytes(a.words[:cap(a.words)])[:n*a.stride]
}

// q8PairBytes is the size of two blocks of 32 of an input row in the pair
// layout of the AVX-512 VNNI kernel (dotQ8_0x4Pairs): their 64 quants, each
// block's d in the eight float32 lanes of its half, and -128 times each
// block's quant sum in the first int32 lane of its half (the others 0),
// which starts the block's integer dot against weights biased by 128.
const q8PairBytes = 3 * 64

// dotQ8_0x4Pairs is dotQ8_0x4 for input rows in the pair layout; nil
// where the CPU has no AVX-512 VNNI.
var dotQ8_0x4Pairs func(w []byte, rb int, x []byte, xstride int, out []float32)

// pairRows reports whether a product of n input rows of k columns with
// weights of type dt takes the pair layout: Q8_0 prompts on AVX-512 VNNI
// (a decode step's row or few stay with the one-row kernel).
func pairRows(dt backend.DType, n, k int) bool {
	return dt == backend.Q8_0 && dotQ8_0x4Pairs != nil && n >= 4 && k%64 == 0
}

// quantizePairs quantizes the n rows of x [n, k] (k a multiple of 64) as
// quantizeRows does to blocks of 32, in the pair layout, and adds three
// zero rows (the kernel takes rows four at a time from any row). The
// result comes from q8Pool; put it back when done. The rows are shared
// among p's threads: packing them on the calling thread alone was ~9% of a
// Q8_0 prompt's time.
func (p *pool) quantizePairs(x []float32, n, k int) *q8Rows {
	a := q8Pool.Get().(*q8Rows)
	np := k / 64
	a.k, a.blk, a.stride, a.pairs = k, 32, np*q8PairBytes, true
	a.alloc(n + 3)
	p.For(n, max(1, 1<<14/k), func(lo, hi int) {
		row := make([]byte, 2*np*q8Bytes(32))
		for t := lo; t < hi; t++ {
			quantizeRow(x[t*k:(t+1)*k], 32, row)
			packPairs(a.row(t), row)
		}
	})
	clear(a.buf[n*a.stride:])
	return a
}

// packPairs writes the input row src, quantized to blocks of 32 (an even
// number of them), to dst in the pair layout.
func packPairs(dst, src []byte) {
	bs := q8Bytes(32)
	for p := range len(src) / (2 * bs) {
		d := dst[p*q8PairBytes : (p+1)*q8PairBytes]
		for h := range 2 {
			b := src[(2*p+h)*bs : (2*p+h+1)*bs]
			copy(d[32*h:32*h+32], b[4:])
			sum := int32(0)
			for _, q := range b[4:] {
				sum += int32(int8(q))
			}
			for l := range 8 {
				copy(d[64+32*h+4*l:], b[:4])
				v := uint32(0)
				if l == 0 {
					v = uint32(-128 * sum)
				}
				binary.LittleEndian.PutUint32(d[128+32*h+4*l:], v)
			}
		}
	}
}

// quantizeRowGo quantizes x to int8 blocks of blk written to dst: per
// block d = amax/127 and q = round-to-even(x * 127/amax) (a block with a
// NaN gets d NaN and quants 0), and for blocks of 256 the sums.
func quantizeRowGo(x []float32, blk int, dst []byte) {
	bs := q8Bytes(blk)
	for b := range len(x) / blk {
		xb, out := x[b*blk:(b+1)*blk], dst[b*bs:(b+1)*bs]
		qb := bytesAs[int8](out[4 : 4+blk])
		var amax float32
		for _, v := range xb {
			amax = max(amax, math.Float32frombits(math.Float32bits(v)&0x7fffffff))
		}
		var d float32
		switch {
		case amax != amax: // a NaN: so is every product
			d = float32(math.NaN())
			clear(qb)
		case amax == 0:
			clear(qb)
		default:
			d = amax / 127
			id := 127 / amax
			for i, v := range xb {
				qb[i] = int8(math.RoundToEven(float64(v * id)))
			}
		}
		binary.LittleEndian.PutUint32(out, math.Float32bits(d))
		if blk == 256 {
			for g := range 16 {
				var s int16
				for _, q := range qb[g*16 : g*16+16] {
					s += int16(q)
				}
				binary.LittleEndian.PutUint16(out[q8Sums+2*g:], uint16(s))
			}
		}
	}
}

// q8Block returns the scale, quants and sums (blocks of 256) of block b of
// a quantized input row.
func q8Block(x []byte, blk, b int) (d float32, qs []int8, sums []int16) {
	bs := q8Bytes(blk)
	blkb := x[b*bs : (b+1)*bs]
	d = math.Float32frombits(binary.LittleEndian.Uint32(blkb))
	qs = bytesAs[int8](blkb[4 : 4+blk])
	if blk == 256 {
		sums = bytesAs[int16](blkb[q8Sums : q8Sums+32])
	}
	return
}

// Portable dot kernels: each sets out[r] to the dot product of weight row r
// (rows of rb bytes, consecutive in w) and one input row. They are the
// reference for the assembly.

// dotQ8_0Go and dotMXFP4Go: per block, the weights' scale times dx times
// the integer dot of their int8 values with the quants.
func dotQ8_0Go(w []byte, rb int, x []byte, out []float32) { dot32Go(backend.Q8_0, w, rb, x, out) }

func dotMXFP4Go(w []byte, rb int, x []byte, out []float32) { dot32Go(backend.MXFP4, w, rb, x, out) }

func dot32Go(dt backend.DType, w []byte, rb int, x []byte, out []float32) {
	_, bs := dt.Block()
	nb := rb / bs
	var v [32]int8
	for r := range out {
		row := w[r*rb : (r+1)*rb]
		var s float32
		for b := range nb {
			dx, q, _ := q8Block(x, 32, b)
			d := int8Block(dt, row[b*bs:(b+1)*bs], &v)
			var is int32
			for i, wv := range v {
				is += int32(wv) * int32(q[i])
			}
			s += d * dx * float32(is)
		}
		out[r] = s
	}
}

// int8Block writes the values of a Q8_0 or MXFP4 block as int8 to v and
// returns their scale: Q8_0's f16 d, or MXFP4's e8m0 scale halved against
// its e2m1 values doubled to integers.
func int8Block(dt backend.DType, blk []byte, v *[32]int8) float32 {
	if dt == backend.Q8_0 {
		for i, b := range blk[2:34] {
			v[i] = int8(b)
		}
		return f16At(blk)
	}
	for i, b := range blk[1:17] {
		v[i], v[i+16] = e2m1Int[b&0xf], e2m1Int[b>>4]
	}
	return quant.E8M0Half(blk[0])
}

// dotQ4KGo and dotQ5KGo: per block, d*dx times the scaled integer dots of
// the eight sub-blocks, minus dmin*dx times the mins against the input sums.
func dotQ4KGo(w []byte, rb int, x []byte, out []float32) { dotKGo(backend.Q4_K, w, rb, x, out) }

func dotQ5KGo(w []byte, rb int, x []byte, out []float32) { dotKGo(backend.Q5_K, w, rb, x, out) }

func dotKGo(dt backend.DType, w []byte, rb int, x []byte, out []float32) {
	tab := f16Lookup()
	_, bs := dt.Block()
	nb := rb / bs
	var sub [32]uint8
	for r := range out {
		row := w[r*rb : (r+1)*rb]
		var s float32
		for b := range nb {
			dx, q, sums := q8Block(x, 256, b)
			blk := row[b*bs : (b+1)*bs]
			sc, m := kScales(blk[4:16])
			var sumi, summ int32
			for j := range 8 {
				kSub(dt, blk, j, &sub)
				var is int32
				for l, v := range sub {
					is += int32(v) * int32(q[j*32+l])
				}
				sumi += int32(sc[j]) * is
				summ += int32(m[j]) * (int32(sums[2*j]) + int32(sums[2*j+1]))
			}
			d, dmin := tab[binary.LittleEndian.Uint16(blk)]*dx, tab[binary.LittleEndian.Uint16(blk[2:])]*dx
			s += d*float32(sumi) - dmin*float32(summ)
		}
		out[r] = s
	}
}

// kSub writes the unsigned quants of sub-block j of a Q4_K or Q5_K block:
// sub-blocks 2i and 2i+1 are the low and high nibbles of 32 bytes, Q5_K's
// fifth bits bit j of each of the 32 bytes qh.
func kSub(dt backend.DType, blk []byte, j int, sub *[32]uint8) {
	shift := uint(j%2) * 4
	if dt == backend.Q4_K {
		for l, v := range (*[32]byte)(blk[16+j/2*32:]) {
			sub[l] = v >> shift & 0xf
		}
		return
	}
	qh := (*[32]byte)(blk[16:48])
	for l, v := range (*[32]byte)(blk[48+j/2*32:]) {
		sub[l] = v>>shift&0xf | qh[l]>>uint(j)&1<<4
	}
}

// dotQ6KGo: per block, d*dx times sum_g sc[g] * (q[g] . x[g] - 32*sum(x[g]))
// over the sixteen groups of 16 (q unsigned, 0..63).
func dotQ6KGo(w []byte, rb int, x []byte, out []float32) {
	tab := f16Lookup()
	nb := rb / 210
	for r := range out {
		row := w[r*rb : (r+1)*rb]
		var s float32
		for b := range nb {
			dx, q, sums := q8Block(x, 256, b)
			blk := row[b*210 : b*210+210]
			var is [16]int32
			for n := range 2 {
				l4, h2, qn := blk[n*64:n*64+64], blk[128+n*32:128+n*32+32], q[n*128:n*128+128]
				for l := range 32 {
					g := n*8 + l/16
					is[g] += int32(l4[l]&0xf|(h2[l]&3)<<4) * int32(qn[l])
					is[g+2] += int32(l4[l+32]&0xf|(h2[l]>>2&3)<<4) * int32(qn[l+32])
					is[g+4] += int32(l4[l]>>4|(h2[l]>>4&3)<<4) * int32(qn[l+64])
					is[g+6] += int32(l4[l+32]>>4|(h2[l]>>6&3)<<4) * int32(qn[l+96])
				}
			}
			var sumi int32
			for g, sc := range blk[192:208] {
				sumi += int32(int8(sc)) * (is[g] - 32*int32(sums[g]))
			}
			s += tab[binary.LittleEndian.Uint16(blk[208:])] * dx * float32(sumi)
		}
		out[r] = s
	}
}

// dotFP8Go: per block, the scale times the f32 dot of the e4m3 values with
// x (len(x) whole blocks of 128; the caller handles a partial last block).
func dotFP8Go(w []byte, rb int, x []float32, out []float32) {
	tab := e4m3Lookup()
	nb := len(x) / 128
	for r := range out {
		row := w[r*rb : r*rb+nb*132]
		var s float32
		for b := range nb {
			blk := row[b*132 : b*132+132]
			xb := x[b*128 : b*128+128]
			var s0, s1, s2, s3 float32
			for i := 0; i < 128; i += 4 {
				s0 += tab[blk[4+i]] * xb[i]
				s1 += tab[blk[5+i]] * xb[i+1]
				s2 += tab[blk[6+i]] * xb[i+2]
				s3 += tab[blk[7+i]] * xb[i+3]
			}
			s += math.Float32frombits(binary.LittleEndian.Uint32(blk)) * ((s0 + s1) + (s2 + s3))
		}
		out[r] = s
	}
}

// Four input rows at a time: out[r*4+j] is weight row r against input row
// j, the input rows xstride apart. The assembly unpacks each weight block
// once for the four; the portable versions run the one-row kernels.

func dotQx4Go(kern func(w []byte, rb int, x []byte, out []float32)) func(w []byte, rb int, x []byte, xstride int, out []float32) {
	return func(w []byte, rb int, x []byte, xstride int, out []float32) {
		rows := len(out) / 4
		var tmp [quantChunk]float32
		for j := range 4 {
			kern(w, rb, x[j*xstride:], tmp[:rows])
			for r, v := range tmp[:rows] {
				out[r*4+j] = v
			}
		}
	}
}

func dotFP8x4Go(w []byte, rb int, x []float32, xstride int, out []float32) {
	rows := len(out) / 4
	var tmp [quantChunk]float32
	for j := range 4 {
		dotFP8(w, rb, x[j*xstride:j*xstride+xstride], tmp[:rows])
		for r, v := range tmp[:rows] {
			out[r*4+j] = v
		}
	}
}

// fp8Tail adds to out[r*stride] (r < rows) the partial last block of each
// FP8 row when the width len(x) is not a multiple of 128.
func fp8Tail(w []byte, rb, rows int, x []float32, out []float32, stride int) {
	nb := len(x) / 128
	rest := x[nb*128:]
	if len(rest) == 0 {
		return
	}
	var buf [128]float32
	for r := range rows {
		dequantBlock(backend.FP8, w[r*rb+nb*132:r*rb+nb*132+132], buf[:len(rest)])
		out[r*stride] += dotF32(rest, buf[:len(rest)])
	}
}
