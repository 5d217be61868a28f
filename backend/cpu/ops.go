package cpu

import (
	"fmt"
	"math"

	"github.com/kiln-llm/kiln/backend"
)

// Embed writes out[t] = table[Tokens[t]]; out [T, H] f32, table [V, H].
func (b *Backend) Embed(out, table backend.Tensor) { b.embed(out, table, 0, false) }

// embed writes out[t] = table[Tokens[t] - first]; a token outside the
// table's rows is refused, or (share: the table is a rank's share of the
// vocabulary) gets zeros.
func (b *Backend) embed(out, table backend.Tensor, first int, share bool) {
	ot := asT(out)
	w := weightsOf(asT(table))
	T, H := b.numTokens(), w.cols
	checkShape("embed out", ot, T, H)
	o := ot.out32()
	for _, tok := range b.step.tokens {
		if i := int(tok) - first; !share && (i < 0 || i >= w.rows) {
			panic(fmt.Sprintf("cpu: embed: token %d outside vocabulary of %d", tok, w.rows))
		}
	}
	b.pool.For(T, max(1, 8192/max(H, 1)), func(lo, hi int) {
		for t := lo; t < hi; t++ {
			row := o[t*H : (t+1)*H]
			if i := int(b.step.tokens[t]) - first; i >= 0 && i < w.rows {
				w.decode(i, row)
			} else {
				clear(row)
			}
		}
	})
}

// rmsScale returns 1/sqrt(mean(x^2) + eps), summing in float64.
func rmsScale(x []float32, eps float32) float32 {
	return float32(1 / math.Sqrt(sumSquares(x)/float64(len(x))+float64(eps)))
}

// normWeights returns w as float32, with 1 added when unitOffset.
func normWeights(w backend.Tensor, n int, unitOffset bool) []float32 {
	f := smallFloats(w)
	if len(f) != n {
		panic(fmt.Sprintf("cpu: norm weight has %d elements, want %d", len(f), n))
	}
	if unitOffset {
		g := make([]float32, n)
		for i, v := range f {
			g[i] = 1 + v
		}
		return g
	}
	return f
}

// rmsNormRow writes dst = x * rsqrt(mean(x^2)+eps) * w; dst may alias x.
func rmsNormRow(dst, x, w []float32, eps float32) {
	scaleMul(dst, x, w, rmsScale(x, eps))
}

// RMSNorm normalises each row of x; out may alias x.
func (b *Backend) RMSNorm(out, x, w backend.Tensor, eps float32, unitOffset bool) {
	ot, xt := asT(out), asT(x)
	n, h := matrix(xt)
	if on, oh := matrix(ot); on != n || oh != h {
		panic(fmt.Sprintf("cpu: rmsnorm out %v, x %v", ot, xt))
	}
	b.rmsNorm(ot.out32(), xt.f32(), n, h, normWeights(w, h, unitOffset), eps)
}

// rmsNorm normalises the n rows of h floats of xs into o.
func (b *Backend) rmsNorm(o, xs []float32, n, h int, wf []float32, eps float32) {
	b.pool.For(n, max(1, 4096/max(h, 1)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			rmsNormRow(o[r*h:(r+1)*h], xs[r*h:(r+1)*h], wf, eps)
		}
	})
}

// NormsInput is true for f32 rows (backend.NormedProducts): the products
// normalise their input in float32 as RMSNorm does, so that the tests'
// fused path runs the model's normalised products.
func (b *Backend) NormsInput(x, w backend.Tensor) bool { return asT(x).dt == backend.F32 }

// NormMatMul is MatMul(out, RMSNorm(x), w, accumulate).
func (b *Backend) NormMatMul(out, x backend.Tensor, n *backend.Norm, w backend.Tensor, accumulate bool) {
	ot, wm := asT(out), weightsOf(asT(w))
	rows := checkMatMul(ot, asT(x), wm, asT(w))
	b.pool.matmul(ot.out32(), b.normed(x, n), rows, wm, accumulate)
}

// NormMLP is MLP(out, RMSNorm(x), gateUp, down).
func (b *Backend) NormMLP(out, x backend.Tensor, n *backend.Norm, gateUp, down backend.Tensor) {
	ot := asT(out)
	gu, dn := weightsOf(asT(gateUp)), weightsOf(asT(down))
	rows := checkMLP(ot, asT(x), gu, dn, gateUp, down)
	b.swiglu(ot.out32(), b.normed(x, n), rows, gu, dn, true)
}

// normed returns RMSNorm(x) in b.normBuf.
func (b *Backend) normed(x backend.Tensor, n *backend.Norm) []float32 {
	xt := asT(x)
	rows, h := matrix(xt)
	if len(b.normBuf) < rows*h {
		b.normBuf = make([]float32, rows*h)
	}
	o := b.normBuf[:rows*h]
	b.rmsNorm(o, xt.f32(), rows, h, normWeights(n.W, h, n.UnitOffset), n.Eps)
	return o
}

func sigmoid(x float32) float32 { return 1 / (1 + expf(-x)) }

func silu(x float32) float32 { return x * sigmoid(x) }

// MLP adds to out the SwiGLU feed-forward of x; see backend.Backend.
func (b *Backend) MLP(out, x, gateUp, down backend.Tensor) {
	ot, xt := asT(out), asT(x)
	gu, dn := weightsOf(asT(gateUp)), weightsOf(asT(down))
	n := checkMLP(ot, xt, gu, dn, gateUp, down)
	b.swiglu(ot.out32(), xt.f32(), n, gu, dn, true)
}

// checkMLP panics unless out, x and the weights are an MLP's, and returns
// its rows.
func checkMLP(ot, xt *Tensor, gu, dn weights, gateUp, down backend.Tensor) int {
	n, h := matrix(xt)
	if on, oh := matrix(ot); on != n || oh != h || gu.cols != h || gu.rows != 2*dn.cols || dn.rows != h {
		panic(fmt.Sprintf("cpu: mlp out %v, x %v, gate_up %v, down %v", ot, xt, asT(gateUp), asT(down)))
	}
	return n
}

// swiglu writes (or adds, when accumulate) down(silu(gate(x)) * up(x)) for
// the n rows of xs to out. Its intermediates live in b.mlpBuf, kept for the
// next call.
func (b *Backend) swiglu(out, xs []float32, n int, gateUp, down weights, accumulate bool) {
	I := down.cols
	if need := 3 * n * I; len(b.mlpBuf) < need {
		b.mlpBuf = make([]float32, need)
	}
	h, act := b.mlpBuf[:2*n*I], b.mlpBuf[2*n*I:3*n*I]
	b.pool.matmul(h, xs, n, gateUp, false)
	siluMul(b.pool, act, h, n, I)
	b.pool.matmul(out, act, n, down, accumulate)
}

func siluMul(p *pool, out, gu []float32, n, in int) {
	p.For(n, max(1, 8192/max(in, 1)), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			siluMulRow(out[r*in:(r+1)*in], gu[2*r*in:(2*r+1)*in], gu[(2*r+1)*in:(2*r+2)*in])
		}
	})
}

// GatedRMSNorm computes out = w * rmsnorm(x) * silu(z) per head.
func (b *Backend) GatedRMSNorm(out, x, z, w backend.Tensor, eps float32) {
	ot, xt, zt := asT(out), asT(x), asT(z)
	n, width := matrix(xt)
	wf := smallFloats(w)
	dim := len(wf)
	if dim == 0 || width%dim != 0 {
		panic(fmt.Sprintf("cpu: gated rmsnorm: x %v is not whole heads of %d", xt, dim))
	}
	for _, t := range []*Tensor{ot, zt} {
		if tn, tw := matrix(t); tn != n || tw != width {
			panic(fmt.Sprintf("cpu: gated rmsnorm: %v does not match x %v", t, xt))
		}
	}
	o, xs, zs := ot.out32(), xt.f32(), zt.f32()
	heads := n * width / dim
	b.pool.For(heads, max(1, 4096/dim), func(lo, hi int) {
		for h := lo; h < hi; h++ {
			xr, zr, or := xs[h*dim:(h+1)*dim], zs[h*dim:(h+1)*dim], o[h*dim:(h+1)*dim]
			s := rmsScale(xr, eps)
			for i, v := range xr {
				or[i] = wf[i] * (v * s) * silu(zr[i])
			}
		}
	})
}

// CopyCols writes x into columns [col, col+w) of out.
func (b *Backend) CopyCols(out, x backend.Tensor, col int) {
	_, w := matrix(asT(x))
	copyCols(asT(out), col, asT(x), 0, w)
}

// SliceCols writes columns [col, col+w) of x to out.
func (b *Backend) SliceCols(out, x backend.Tensor, col int) {
	_, w := matrix(asT(out))
	copyCols(asT(out), 0, asT(x), col, w)
}

// copyCols copies columns [xcol, xcol+w) of each row of x to columns
// [ocol, ocol+w) of the same row of out.
func copyCols(ot *Tensor, ocol int, xt *Tensor, xcol, w int) {
	n, xw := matrix(xt)
	on, ow := matrix(ot)
	if on != n || xt.dt != ot.dt || ocol < 0 || xcol < 0 || ocol+w > ow || xcol+w > xw || ot.readOnly {
		panic(fmt.Sprintf("cpu: copy cols: %d columns from %v at %d to %v at %d", w, xt, xcol, ot, ocol))
	}
	es := xt.dt.Size()
	for t := range n {
		copy(ot.buf[(t*ow+ocol)*es:(t*ow+ocol+w)*es], xt.buf[(t*xw+xcol)*es:(t*xw+xcol+w)*es])
	}
}

// GatherRows writes out[r] = x[LogitRows[r]].
func (b *Backend) GatherRows(out, x backend.Tensor) {
	ot, xt := asT(out), asT(x)
	_, h := matrix(xt)
	rows := b.step.logitRows
	if on, oh := matrix(ot); on != len(rows) || oh != h || xt.dt != ot.dt {
		panic(fmt.Sprintf("cpu: gather rows: out %v, x %v, %d rows", ot, xt, len(rows)))
	}
	if ot.readOnly {
		panic("cpu: gather rows into a loaded weight")
	}
	es := h * xt.dt.Size()
	for i, r := range rows {
		if int(r) >= xt.shape[0] {
			panic(fmt.Sprintf("cpu: gather rows: row %d of %v", r, xt))
		}
		copy(ot.buf[i*es:(i+1)*es], xt.buf[int(r)*es:(int(r)+1)*es])
	}
}
