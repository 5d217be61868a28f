//go:build cgo

package cuda

import (
	"fmt"

	"github.com/kiln-llm/kiln/backend"
)

// Embed writes out[t] = table[Tokens[t]].
func (b *Backend) Embed(out, table backend.Tensor) {
	ot, tt := asT(out), asT(table)
	T, V, H := b.meta.T, tt.rows(), tt.cols()
	checkRows("embed out", ot, T, H)
	checkF32("embed", ot)
	for _, tok := range b.meta.host[mTokens] {
		if tok < 0 || int(tok) >= V {
			panic(fmt.Sprintf("cuda: embed: token %d outside vocabulary of %d", tok, V))
		}
	}
	if tt.dt.Quantized() {
		// The looked-up rows dequantized as the reference does.
		b.run("qembed_"+tt.dt.String(), g1(T), 256, 0, ot.ptr, tt.ptr, int64Arg(tt.rb()), b.meta.dev[mTokens], H)
		return
	}
	b.run("embed", g1(T), 256, 0, ot.ptr, tt.ptr, int(tt.dt), b.meta.dev[mTokens], H)
}

func normBlock(n int) int {
	switch {
	case n >= 4096:
		return 1024
	case n >= 1024:
		return 512
	}
	return 128
}

// RMSNorm normalises each row of x; out may alias x.
func (b *Backend) RMSNorm(out, x, w backend.Tensor, eps float32, unitOffset bool) {
	ot, xt, wt := asT(out), asT(x), asT(w)
	n, h := xt.rows(), xt.cols()
	checkRows("rmsnorm out", ot, n, h)
	checkF32("rmsnorm", xt)
	checkAct("rmsnorm", ot)
	checkFloatW("rmsnorm", wt)
	if wt.numel() != h {
		panic(fmt.Sprintf("cuda: rmsnorm weight %v for rows of %d", wt, h))
	}
	// Rows of up to 8192 floats, 16-byte aligned: one read into registers.
	if h%4 == 0 && h <= 8*1024 && ot.ptr%16 == 0 && xt.ptr%16 == 0 {
		v4 := 1
		for 256*4*v4 < h {
			v4 *= 2
		}
		b.run(fmt.Sprintf("rmsnorm_v4_%d", v4), g1(n), 256, 0, ot.ptr, int(ot.dt), xt.ptr, wt.ptr, int(wt.dt), h, eps, boolInt(unitOffset))
		return
	}
	b.run("rmsnorm", g1(n), normBlock(h), 0, ot.ptr, int(ot.dt), xt.ptr, wt.ptr, int(wt.dt), h, eps, boolInt(unitOffset))
}

// GatedRMSNorm computes out = w * rmsnorm(x) * silu(z) per head.
func (b *Backend) GatedRMSNorm(out, x, z, w backend.Tensor, eps float32) {
	ot, xt, zt, wt := asT(out), asT(x), asT(z), asT(w)
	n, width := xt.rows(), xt.cols()
	dim := wt.numel()
	if dim == 0 || width%dim != 0 {
		panic(fmt.Sprintf("cuda: gated rmsnorm: x %v is not whole heads of %d", xt, dim))
	}
	checkRows("gated rmsnorm out", ot, n, width)
	checkRows("gated rmsnorm z", zt, n, width)
	checkF32("gated rmsnorm", ot, xt, zt)
	checkFloatW("gated rmsnorm", wt)
	b.run("gated_rmsnorm", g1(n*width/dim), normBlock(dim), 0, ot.ptr, xt.ptr, zt.ptr, wt.ptr, int(wt.dt), dim, eps)
}

// siluMul computes out = silu(gate) * up for gateUp [N, 2I] = [gate | up].
func (b *Backend) siluMul(out, gateUp *tensor) {
	n, I := gateUp.rows(), gateUp.cols()/2
	b.run("silu_mul", g1(b.blocksFor(n*I)), 256, 0, out.ptr, gateUp.ptr, n, I)
}

// CopyCols writes x into columns [col, col+w) of out.
func (b *Backend) CopyCols(out, x backend.Tensor, col int) {
	ot, xt := asT(out), asT(x)
	n, w, W := xt.rows(), xt.cols(), ot.cols()
	if ot.rows() != n || xt.dt != ot.dt || col < 0 || col+w > W {
		panic(fmt.Sprintf("cuda: copy cols: out %v, x %v at column %d", ot, xt, col))
	}
	if n == 0 {
		return
	}
	u := xt.dt.Size() / 2
	b.run("copy_cols", g1(n), 256, 0, ot.ptr, xt.ptr, W*u, w*u, col*u)
}

// GatherRows writes out[r] = x[LogitRows[r]] for the current batch.
func (b *Backend) GatherRows(out, x backend.Tensor) {
	ot, xt := asT(out), asT(x)
	R, h := b.meta.R, xt.cols()
	checkRows("gather rows out", ot, R, h)
	checkF32("gather rows", ot, xt)
	for _, r := range b.meta.host[mRows] {
		if int(r) >= xt.rows() {
			panic(fmt.Sprintf("cuda: gather rows: row %d of %v", r, xt))
		}
	}
	b.run("gather_rows", g1(R), 256, 0, ot.ptr, xt.ptr, b.meta.dev[mRows], h)
}
