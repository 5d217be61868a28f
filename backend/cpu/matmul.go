package cpu

import (
	"fmt"
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

// weights is a row-major [rows, cols] matrix of any float dtype, read in place.
type weights struct {
	dt         backend.DType
	buf        []byte
	rows, cols int
}

func weightsOf(t *Tensor) weights {
	switch t.dt {
	case backend.F32, backend.BF16, backend.F16:
	default:
		panic(fmt.Sprintf("cpu: weight %v is not a float tensor", t))
	}
	r, c := matrix(t)
	return weights{dt: t.dt, buf: t.buf, rows: r, cols: c}
}

// sub returns rows [r0, r0+n).
func (w weights) sub(r0, n int) weights {
	es := w.dt.Size() * w.cols
	return weights{dt: w.dt, buf: w.buf[r0*es : (r0+n)*es], rows: n, cols: w.cols}
}

// decode converts rows [r0, r0+len(dst)/cols) to float32.
func (w weights) decode(r0 int, dst []float32) {
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
	if n <= directRows {
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
					gemm6x16(a, k, packed, k, &c)
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

// matmulDirect is matmul for a few input rows: each weight row is read
// once from memory, in order, and dotted with every input row while it is
// in L1.
func (p *pool) matmulDirect(out, x []float32, n int, w weights, accumulate bool) {
	k, o := w.cols, w.rows
	grain := max(16, 1<<16/max(k, 1)) // at least ~64K weights per task
	p.For(o, grain, func(lo, hi int) {
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

// MatMul computes out[n,o] = sum_i x[n,i] * w[o,i], adding to out when
// accumulate.
func (b *Backend) MatMul(out, x, w backend.Tensor, accumulate bool) {
	ot, xt := asT(out), asT(x)
	wm := weightsOf(asT(w))
	n, k := matrix(xt)
	if k != wm.cols {
		panic(fmt.Sprintf("cpu: matmul x %v, w %v: inner dimensions differ", xt, asT(w)))
	}
	if on, oc := matrix(ot); on != n || oc != wm.rows {
		panic(fmt.Sprintf("cpu: matmul out %v, want [%d, %d]", ot, n, wm.rows))
	}
	b.pool.matmul(ot.out32(), xt.f32(), n, wm, accumulate)
}
