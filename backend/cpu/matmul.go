package cpu

import (
	"fmt"
	"math"
	"sync"

	"github.com/kiln-llm/kiln/backend"
)

var (
	f16Once  sync.Once
	f16Table []float32
)

// f16Lookup returns the table of all 65536 f16 values as float32.
func f16Lookup() []float32 {
	f16Once.Do(func() {
		f16Table = make([]float32, 1<<16)
		for i := range f16Table {
			f16Table[i] = backend.F16ToF32(uint16(i))
		}
	})
	return f16Table
}

// weights is a row-major [rows, cols] matrix of any float or quantized
// dtype, read in place (a quantized row is whole blocks, dt.RowBytes(cols)).
type weights struct {
	dt         backend.DType
	buf        []byte
	rows, cols int
}

// weightsOf views a weight tensor as a matrix: a float tensor as its first
// dimension by the rest, a quantized one as its rows (all outer dimensions)
// by the row width.
func weightsOf(t *Tensor) weights {
	switch {
	case t.dt == backend.F32, t.dt == backend.BF16, t.dt == backend.F16:
	case t.dt.Quantized():
		c := t.shape[len(t.shape)-1]
		return weights{dt: t.dt, buf: t.buf, rows: shapeSize(t.shape) / max(c, 1), cols: c}
	default:
		panic(fmt.Sprintf("cpu: weight %v is not a float or quantized tensor", t))
	}
	r, c := matrix(t)
	return weights{dt: t.dt, buf: t.buf, rows: r, cols: c}
}

// rowBytes is the size of one row.
func (w weights) rowBytes() int { return w.dt.RowBytes(w.cols) }

// sub returns rows [r0, r0+n).
func (w weights) sub(r0, n int) weights {
	rb := w.rowBytes()
	return weights{dt: w.dt, buf: w.buf[r0*rb : (r0+n)*rb], rows: n, cols: w.cols}
}

// decode converts rows [r0, r0+len(dst)/cols) to float32.
func (w weights) decode(r0 int, dst []float32) {
	if w.dt.Quantized() {
		rb := w.rowBytes()
		for i := 0; i*w.cols < len(dst); i++ {
			dequantRow(w.dt, w.buf[(r0+i)*rb:(r0+i+1)*rb], dst[i*w.cols:(i+1)*w.cols])
		}
		return
	}
	off := r0 * w.cols
	switch w.dt {
	case backend.F32:
		copy(dst, bytesAs[float32](w.buf)[off:off+len(dst)])
	case backend.BF16:
		src := bytesAs[uint16](w.buf)[off : off+len(dst)]
		for i, h := range src {
			dst[i] = backend.BF16ToF32(h)
		}
	case backend.F16:
		tab := f16Lookup()
		src := bytesAs[uint16](w.buf)[off : off+len(dst)]
		for i, h := range src {
			dst[i] = tab[h]
		}
	}
}

// floats returns all of w as float32 (a copy unless w is f32); for the small
// per-layer vectors (norm weights, conv kernels).
func (w weights) floats() []float32 {
	if w.dt == backend.F32 {
		return bytesAs[float32](w.buf)
	}
	dst := make([]float32, w.rows*w.cols)
	w.decode(0, dst)
	return dst
}

func smallFloats(t backend.Tensor) []float32 { return weightsOf(asT(t)).floats() }

// dotRows computes out[j] = x . w[r0+j] for len(out) consecutive rows,
// reading the weights in their own dtype.
func (w weights) dotRows(r0 int, x []float32, out []float32) {
	k := w.cols
	switch w.dt {
	case backend.F32:
		all := bytesAs[float32](w.buf)
		for j := range out {
			out[j] = dotF32(x, all[(r0+j)*k:(r0+j+1)*k])
		}
	case backend.BF16:
		all := bytesAs[uint16](w.buf)
		// Row by row, the weights are one sequential stream (which the
		// kernel prefetches ahead): faster than interleaving rows.
		for j := range out {
			out[j] = dotBF16(x, all[(r0+j)*k:(r0+j+1)*k])
		}
	case backend.F16:
		all := bytesAs[uint16](w.buf)
		tab := f16Lookup()
		for j := range out {
			row := all[(r0+j)*k : (r0+j+1)*k]
			var s0, s1 float32
			i := 0
			for ; i+2 <= len(row); i += 2 {
				s0 += x[i] * tab[row[i]]
				s1 += x[i+1] * tab[row[i+1]]
			}
			for ; i < len(row); i++ {
				s0 += x[i] * tab[row[i]]
			}
			out[j] = s0 + s1
		}
	}
}

const (
	// Up to directRows input rows, weights are dotted straight from their
	// dtype, a row at a time that stays in L1 while every input row passes:
	// decode is bound by reading the weights once.
	directRows = 12
	// Above, blocks of gemmCols weight rows are decoded and packed k-major
	// (in L2), and every input row of a tile (sized to stay in L3) runs
	// through the 6x16 kernel against each block: packing is paid once per
	// block and tile.
	gemmRows, gemmCols = 6, 16
)

// tileBytes bounds the input rows of one tile (a variable for tests).
var tileBytes = 8 << 20

// matmul computes out[n,o] (+)= sum_i x[n,i] * w[o,i] for x [n, w.cols] and
// out [n, w.rows], split over w's rows.
func (p *pool) matmul(out, x []float32, n int, w weights, accumulate bool) {
	k, o := w.cols, w.rows
	if n == 0 || o == 0 {
		return
	}
	if len(x) < n*k || len(out) < n*o {
		panic(fmt.Sprintf("cpu: matmul sizes: x %d, out %d for n %d, w [%d, %d]", len(x), len(out), n, o, k))
	}
	if n <= directRows || w.dt.Quantized() && n <= quantDirectRows(w.dt) {
		p.matmulDirect(out, x, n, w, accumulate)
		return
	}
	tile := max(gemmRows, tileBytes/(4*max(k, 1))/gemmRows*gemmRows)
	blocks := (o + gemmCols - 1) / gemmCols
	for t0 := 0; t0 < n; t0 += tile {
		nt := min(tile, n-t0)
		p.For(blocks, 1, func(lo, hi int) {
			packed := make([]float32, k*gemmCols)
			var pad []float32 // the last partial group of input rows, zero-padded
			var c [gemmRows * gemmCols]float32
			for blk := lo; blk < hi; blk++ {
				r0 := blk * gemmCols
				nc := min(gemmCols, o-r0)
				w.pack(r0, nc, packed)
				for g := t0; g < t0+nt; g += gemmRows {
					ng := min(gemmRows, t0+nt-g)
					a := x[g*k:]
					if ng < gemmRows {
						if pad == nil {
							pad = make([]float32, gemmRows*k)
						}
						copy(pad, x[g*k:(g+ng)*k])
						clear(pad[ng*k:])
						a = pad
					}
					if ng == gemmRows && nc == gemmCols && !accumulate {
						gemm6x16(a, k, packed, k, out[g*o+r0:], o) // straight into out
						continue
					}
					gemm6x16(a, k, packed, k, c[:], gemmCols)
					for i := range ng {
						dst := out[(g+i)*o+r0 : (g+i)*o+r0+nc]
						src := c[i*gemmCols : i*gemmCols+nc]
						if accumulate {
							for j, v := range src {
								dst[j] += v
							}
						} else {
							copy(dst, src)
						}
					}
				}
			}
		})
	}
}

// pack decodes rows [r0, r0+nc) into packed[p*16+j] = w[r0+j][p], with zeros
// for j >= nc. It walks p outermost so that stores are sequential: the 16
// rows are read as 16 sequential streams.
func (w weights) pack(r0, nc int, packed []float32) {
	k := w.cols
	packed = packed[:k*gemmCols]
	if nc < gemmCols {
		clear(packed)
	}
	if w.dt.Quantized() {
		w.packQuant(r0, nc, packed)
		return
	}
	if w.dt == backend.F32 {
		all := bytesAs[float32](w.buf)
		for j := range nc {
			row := all[(r0+j)*k : (r0+j+1)*k]
			for p, v := range row {
				packed[p*gemmCols+j] = v
			}
		}
		return
	}
	all := bytesAs[uint16](w.buf)
	if packHalf != nil && nc == gemmCols && k%gemmCols == 0 {
		packHalf(w.dt == backend.BF16, all[r0*k:(r0+gemmCols)*k], k, packed)
		return
	}
	var rows [gemmCols][]uint16
	for j := range nc {
		rows[j] = all[(r0+j)*k : (r0+j+1)*k]
	}
	if w.dt == backend.BF16 {
		for p := range k {
			dst := packed[p*gemmCols : p*gemmCols+nc]
			for j := range dst {
				dst[j] = backend.BF16ToF32(rows[j][p])
			}
		}
		return
	}
	tab := f16Lookup()
	for p := range k {
		dst := packed[p*gemmCols : p*gemmCols+nc]
		for j := range dst {
			dst[j] = tab[rows[j][p]]
		}
	}
}

// packQuant is pack for quantized weights: block column by block column,
// the nc rows' blocks are dequantized into a small buffer (in L1) and
// interleaved from there.
func (w weights) packQuant(r0, nc int, packed []float32) {
	k, rb := w.cols, w.rowBytes()
	e, bs := w.dt.Block()
	var buf [gemmCols * 256]float32
	for c0, bi := 0, 0; c0 < k; c0, bi = c0+e, bi+1 {
		ne := min(e, k-c0)
		for j := range nc {
			off := (r0+j)*rb + bi*bs
			dequantBlock(w.dt, w.buf[off:off+bs], buf[j*e:j*e+ne])
		}
		for p := range ne {
			dst := packed[(c0+p)*gemmCols : (c0+p)*gemmCols+nc]
			for j := range dst {
				dst[j] = buf[j*e+p]
			}
		}
	}
}

// matmulDirect is matmul for a few input rows: each weight row is read
// once from memory, in order, and dotted with every input row while it is
// in L1.
func (p *pool) matmulDirect(out, x []float32, n int, w weights, accumulate bool) {
	k, o := w.cols, w.rows
	if w.dt.Quantized() {
		p.matmulQuant(out, x, n, w, accumulate)
		return
	}
	p.For(o, rowGrain(k), func(lo, hi int) {
		var res [4]float32
		put := func(t, r int, v float32) {
			if accumulate {
				out[t*o+r] += v
			} else {
				out[t*o+r] = v
			}
		}
		for r := lo; r < hi; r++ {
			t := 0
			if w.dt == backend.BF16 {
				// Four input rows at a time share each converted weight.
				row := bytesAs[uint16](w.buf)[r*k : (r+1)*k]
				for ; t+4 <= n; t += 4 {
					dot4xBF16(row, x[t*k:(t+4)*k], res[:])
					for j, v := range res {
						put(t+j, r, v)
					}
				}
			}
			for ; t < n; t++ {
				w.dotRows(r, x[t*k:(t+1)*k], res[:1])
				put(t, r, res[0])
			}
		}
	})
}

// quantDirectRows is the most input rows for which a product with
// quantized weights of dt takes the direct path (matmulQuant) rather than
// dequantized panels. Integer dot products (VPMADDUBSW: 32 multiply-adds
// an instruction) beat the f32 panel kernel at every row count (on a Zen 3
// core, Q4_K [3072, 1024] at 256 rows: 40 against 32 GFLOP/s, at 64 rows
// 84 against 16), so the int8 types always take it; FP8's direct f32 dot
// wins up to about 64 rows.
func quantDirectRows(dt backend.DType) int {
	if _, ok := intDot(dt); ok && intDotKernels {
		return math.MaxInt
	}
	if dt == backend.FP8 {
		return 64
	}
	return directRows
}

// intDotKernels says the int8 kernels are assembly (on other machines the
// portable ones are slower than the panels beyond decode).
var intDotKernels = false

// matmulQuant is matmulDirect for quantized weights (see quant.go): each
// task walks its weight rows in chunks small enough to stay in L1 while
// every input row of a tile (sized to stay in L2) is dotted with them, four
// input rows per kernel call while there are four.
func (p *pool) matmulQuant(out, x []float32, n int, w weights, accumulate bool) {
	j := quantJob{out: out, x: x, n: n, w: w, accumulate: accumulate}
	if blk, ok := intDot(w.dt); ok {
		if pairRows(w.dt, n, w.cols) {
			j.qx = p.quantizePairs(x, n, w.cols)
		} else {
			j.qx = quantizeRows(x, n, w.cols, blk)
		}
		defer q8Pool.Put(j.qx)
	}
	p.For(w.rows, rowGrain(w.cols), j.rows)
}

// rowGrain is the fewest weight rows of k columns a task of a direct
// product takes: ~64K weights.
func rowGrain(k int) int { return max(16, 1<<16/max(k, 1)) }

// quantJobs runs the products of jobs in one For over all their weight
// rows: a decode step's experts, each a few input rows, whose products one
// at a time met the threads three times an expert.
func (p *pool) quantJobs(jobs []quantJob) {
	if len(jobs) == 0 {
		return
	}
	total := 0
	for _, j := range jobs {
		total += j.w.rows
	}
	p.For(total, rowGrain(jobs[0].w.cols), func(lo, hi int) {
		off := 0
		for i := range jobs {
			o := jobs[i].w.rows
			if lo < off+o && hi > off {
				jobs[i].rows(max(lo, off)-off, min(hi, off+o)-off)
			}
			off += o
		}
	})
}

// quantJob is one product of quantized weights: out[n, w.rows] (+)= x .
// w^T, the input rows quantized to int8 blocks in qx for the integer
// kernels (FP8's read x as it is).
type quantJob struct {
	out, x     []float32
	qx         *q8Rows
	n          int
	w          weights
	accumulate bool
}

// rows computes the job's outputs of weight rows [lo, hi).
func (j *quantJob) rows(lo, hi int) {
	out, x, n, w, qx, accumulate := j.out, j.x, j.n, j.w, j.qx, j.accumulate
	k, o, rb := w.cols, w.rows, w.rowBytes()
	xstride := 4 * k // bytes of an input row as the kernels read it
	if qx != nil {
		xstride = qx.stride
	}
	var kern func(w []byte, rb int, x []byte, out []float32)
	var kern4, kern8 func(w []byte, rb int, x []byte, xstride int, out []float32)
	switch w.dt {
	case backend.Q8_0:
		kern, kern4 = dotQ8_0, dotQ8_0x4
	case backend.Q4_K:
		kern, kern4, kern8 = dotQ4K, dotQ4Kx4, dotQ4Kx8
	case backend.Q5_K:
		kern, kern4 = dotQ5K, dotQ5Kx4
	case backend.Q6_K:
		kern, kern4 = dotQ6K, dotQ6Kx4
	case backend.MXFP4:
		kern, kern4 = dotMXFP4, dotMXFP4x4
	}
	chunk := max(1, min(quantChunk, (16<<10)/max(rb, 1)))
	if qx != nil && qx.pairs && chunk >= 4 {
		chunk &^= 3 // the pair kernel takes weight rows four at a time
	}
	tile := max(4, (64<<10)/xstride&^3)
	var res [8 * quantChunk]float32
	// put stores (or adds) v[j*stride] for j < nr at out[t, r0+j].
	put := func(t, r0, nr int, v []float32, stride int) {
		dst := out[t*o+r0 : t*o+r0+nr]
		if accumulate {
			for j := range dst {
				dst[j] += v[j*stride]
			}
		} else {
			for j := range dst {
				dst[j] = v[j*stride]
			}
		}
	}
	// put4 is put of four rows' results, t to t+3, that a kernel of n
	// input rows left in v (v[r*n+j] for input row t+j), in one pass over
	// v (row by row with a stride of four it was ~7% of a prompt's time).
	put4 := func(t, r0, nr int, v []float32, n int) {
		d0 := out[t*o+r0:][:nr]
		d1, d2, d3 := out[(t+1)*o+r0:][:nr], out[(t+2)*o+r0:][:nr], out[(t+3)*o+r0:][:nr]
		for r := range d0 {
			q := (*[4]float32)(v[n*r:])
			if accumulate {
				d0[r] += q[0]
				d1[r] += q[1]
				d2[r] += q[2]
				d3[r] += q[3]
			} else {
				d0[r], d1[r], d2[r], d3[r] = q[0], q[1], q[2], q[3]
			}
		}
	}
	for t0 := 0; t0 < n; t0 += tile {
		t1 := min(n, t0+tile)
		for r0 := lo; r0 < hi; r0 += chunk {
			nr := min(chunk, hi-r0)
			rows := w.buf[r0*rb : (r0+nr)*rb]
			switch {
			case qx != nil && qx.pairs: // three rows past the last to read
				for t := t0; t < t1; t += 4 {
					dotQ8_0x4Pairs(rows, rb, qx.buf[t*qx.stride:], qx.stride, res[:4*nr])
					if t+4 <= t1 {
						put4(t, r0, nr, res[:], 4)
						continue
					}
					for j := range t1 - t {
						put(t+j, r0, nr, res[j:], 4)
					}
				}
			case qx != nil:
				t := t0
				for ; kern8 != nil && t+8 <= t1; t += 8 {
					kern8(rows, rb, qx.buf[t*qx.stride:], qx.stride, res[:8*nr])
					put4(t, r0, nr, res[:], 8)
					put4(t+4, r0, nr, res[4:], 8)
				}
				for ; t+4 <= t1; t += 4 {
					kern4(rows, rb, qx.buf[t*qx.stride:], qx.stride, res[:4*nr])
					put4(t, r0, nr, res[:], 4)
				}
				for ; t < t1; t++ {
					kern(rows, rb, qx.row(t), res[:nr])
					put(t, r0, nr, res[:], 1)
				}
			default: // FP8
				t := t0
				for ; t+4 <= t1; t += 4 {
					dotFP8x4(rows, rb, x[t*k:(t+4)*k], k, res[:4*nr])
					for j := range 4 {
						fp8Tail(rows, rb, nr, x[(t+j)*k:(t+j+1)*k], res[j:], 4)
						put(t+j, r0, nr, res[j:], 4)
					}
				}
				for ; t < t1; t++ {
					xt, v := x[t*k:(t+1)*k], res[:nr]
					dotFP8(rows, rb, xt, v)
					fp8Tail(rows, rb, nr, xt, v, 1)
					put(t, r0, nr, v, 1)
				}
			}
		}
	}
}

// quantChunk bounds the weight rows of one quantized kernel call.
const quantChunk = 16

// MatMul computes out[n,o] = sum_i x[n,i] * w[o,i], adding to out when
// accumulate.
func (b *Backend) MatMul(out, x, w backend.Tensor, accumulate bool) {
	ot, xt := asT(out), asT(x)
	wm := weightsOf(asT(w))
	n := checkMatMul(ot, xt, wm, asT(w))
	b.pool.matmul(ot.out32(), xt.f32(), n, wm, accumulate)
}

// checkMatMul panics unless out, x and w (wt, as wm) are a product's, and
// returns its rows.
func checkMatMul(ot, xt *Tensor, wm weights, wt *Tensor) int {
	n, k := matrix(xt)
	if k != wm.cols {
		panic(fmt.Sprintf("cpu: matmul x %v, w %v: inner dimensions differ", xt, wt))
	}
	if on, oc := matrix(ot); on != n || oc != wm.rows {
		panic(fmt.Sprintf("cpu: matmul out %v, want [%d, %d]", ot, n, wm.rows))
	}
	return n
}
