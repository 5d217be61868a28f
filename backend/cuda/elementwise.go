//go:build cgo

package cuda

import (
	"fmt"
	"slices"

	"github.com/kiln-llm/kiln/backend"
)

// The kernels of kernels/elementwise.cu.
var (
	embedKernel        = newKernel[embedArgs]("embed")
	rmsnormKernel      = newKernel[rmsnormArgs]("rmsnorm")
	gatedRMSNormKernel = newKernel[gatedRMSNormArgs]("gated_rmsnorm")
	siluMulKernel      = newKernel[siluMulArgs]("silu_mul")
	siluMulBF16Kernel  = newKernel[siluMulArgs]("silu_mul_bf16")
	gatherRowsKernel   = newKernel[gatherRowsArgs]("gather_rows")
	copyColsKernel     = newKernel[copyColsArgs]("copy_cols")
	mulSigmoidKernel   = newKernel[mulSigmoidArgs]("mul_sigmoid")
	zeroF32Kernel      = newKernel[zeroF32Args]("zero_f32")
	castKernel         = newKernel[castArgs]("cast")
	toHalfKernel       = newKernel[toHalfArgs]("to_half")
	// rmsnormV4Kernels[i] holds rows of up to 1024 << i floats in
	// registers (RMSNORM_V4).
	rmsnormV4Kernels = [...]kernel[rmsnormArgs]{
		newKernel[rmsnormArgs]("rmsnorm_v4_1"), newKernel[rmsnormArgs]("rmsnorm_v4_2"),
		newKernel[rmsnormArgs]("rmsnorm_v4_4"), newKernel[rmsnormArgs]("rmsnorm_v4_8"),
	}
)

type embedArgs struct {
	out, table devptr
	dt         int32
	tokens     devptr
	H          int32
	first, V   int32
}

type rmsnormArgs struct {
	out        devptr
	odt        int32
	x, w       devptr
	wdt, n     int32
	eps        float32
	unitOffset int32
}

type gatedRMSNormArgs struct {
	out             devptr
	odt             int32
	x, z            devptr
	ldz             int32
	w               devptr
	wdt, dim, width int32
	eps             float32
	heads           int32
}

type siluMulArgs struct {
	out, gu devptr
	rows, I int32
}

type gatherRowsArgs struct {
	out, x, rows devptr
	H            int32
}

type copyColsArgs struct {
	out      devptr
	oW, ocol int32
	x        devptr
	xW, xcol int32
	w        int32
}

type mulSigmoidArgs struct {
	x    devptr
	xdt  int32
	gate devptr
	n    int64
}

type zeroF32Args struct {
	x devptr
	n int64
}

type castArgs struct {
	out devptr
	odt int32
	in  devptr
	idt int32
	n   int64
}

type toHalfArgs struct {
	out, in devptr
	n       int64
	dt      int32
}

// cast converts n elements of type idt at in to type odt at out.
func (b *Backend) cast(out devptr, odt backend.DType, in devptr, idt backend.DType, n int) {
	castKernel.run(b, g1(b.blocksFor(n)), 256, 0, castArgs{out: out, odt: int32(odt), in: in, idt: int32(idt), n: int64(n)})
}

// toHalf converts n float32 elements at in to bf16 or f16 (dt) at out.
func (b *Backend) toHalf(out, in devptr, n int, dt backend.DType) {
	toHalfKernel.run(b, g1(b.blocksFor(n)), 256, 0, toHalfArgs{out: out, in: in, n: int64(n), dt: int32(dt)})
}

// Embed writes out[t] = table[Tokens[t]].
func (b *Backend) Embed(out, table backend.Tensor) { b.embed(out, table, 0, false) }

// embed writes the rows of the step's tokens, less first, of table; share:
// table is a rank's rows of a table split by vocabulary, and tokens outside
// them get zeros (Collective.EmbedShare) instead of an error.
func (b *Backend) embed(out, table backend.Tensor, first int, share bool) {
	ot, tt := asT(out), asT(table)
	T, V, H := b.meta.T, tt.rows(), tt.cols()
	checkRows("embed out", ot, T, H)
	checkF32("embed", ot)
	for _, tok := range b.meta.host[mTokens] {
		if !share && (tok < 0 || int(tok) >= V) {
			panic(fmt.Sprintf("cuda: embed: token %d outside vocabulary of %d", tok, V))
		}
	}
	if tt.dt.Quantized() {
		// The looked-up rows dequantized as the reference does.
		quantKernelsOf(tt.dt).embed.run(b, g1(T), 256, 0, qembedArgs{out: ot.ptr, w: tt.ptr, rb: int64(tt.rb()), tokens: b.meta.dev[mTokens],
			I: int32(H), first: int32(first), V: int32(V)})
		return
	}
	embedKernel.run(b, g1(T), 256, 0, embedArgs{out: ot.ptr, table: tt.ptr, dt: int32(tt.dt), tokens: b.meta.dev[mTokens], H: int32(H),
		first: int32(first), V: int32(V)})
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
	a := rmsnormArgs{out: ot.ptr, odt: int32(ot.dt), x: xt.ptr, w: wt.ptr, wdt: int32(wt.dt), n: int32(h), eps: eps, unitOffset: boolInt(unitOffset)}
	if h%4 == 0 && h <= 8*1024 && ot.ptr%16 == 0 && xt.ptr%16 == 0 {
		v4 := 0
		for 256*4<<v4 < h {
			v4++
		}
		rmsnormV4Kernels[v4].runOverlapped(b, g1(n), 256, 0, a)
		return
	}
	rmsnormKernel.runOverlapped(b, g1(n), normBlock(h), 0, a)
}

// GatedRMSNorm computes out = w * rmsnorm(x) * silu(z) per head.
func (b *Backend) GatedRMSNorm(out, x, z, w backend.Tensor, eps float32) {
	xt, zt := asT(x), asT(z)
	checkRows("gated rmsnorm z", zt, xt.rows(), xt.cols())
	checkF32("gated rmsnorm", zt)
	b.gatedRMSNorm(asT(out), xt, zt.ptr, xt.cols(), asT(w), eps)
}

// gatedRMSNorm is GatedRMSNorm with z's rows ldz floats apart.
func (b *Backend) gatedRMSNorm(ot, xt *tensor, z devptr, ldz int, wt *tensor, eps float32) {
	n, width := xt.rows(), xt.cols()
	dim := wt.numel()
	if dim == 0 || width%dim != 0 {
		panic(fmt.Sprintf("cuda: gated rmsnorm: x %v is not whole heads of %d", xt, dim))
	}
	checkRows("gated rmsnorm out", ot, n, width)
	checkF32("gated rmsnorm", xt)
	checkAct("gated rmsnorm", ot)
	checkFloatW("gated rmsnorm", wt)
	heads := n * width / dim
	gatedRMSNormKernel.run(b, g1((heads+7)/8), 256, 0, gatedRMSNormArgs{out: ot.ptr, odt: int32(ot.dt), x: xt.ptr, z: z, ldz: int32(ldz),
		w: wt.ptr, wdt: int32(wt.dt), dim: int32(dim), width: int32(width), eps: eps, heads: int32(heads)})
}

// siluMul computes out = silu(gate) * up for gateUp [N, 2I] = [gate | up].
func (b *Backend) siluMul(out, gateUp *tensor) {
	n, I := gateUp.rows(), gateUp.cols()/2
	siluMulKernel.run(b, g1(b.blocksFor(n*I)), 256, 0, siluMulArgs{out: out.ptr, gu: gateUp.ptr, rows: int32(n), I: int32(I)})
}

// siluMulBF16 is siluMul of bf16 rows at gu ([n, 2I]) into out ([n, I]).
func (b *Backend) siluMulBF16(out, gu devptr, n, I int) {
	siluMulBF16Kernel.run(b, g1(b.blocksFor(n*I/8)), 256, 0, siluMulArgs{out: out, gu: gu, rows: int32(n), I: int32(I)})
}

// CopyCols writes x into columns [col, col+w) of out.
func (b *Backend) CopyCols(out, x backend.Tensor, col int) {
	xt := asT(x)
	b.copyCols(asT(out), col, xt, 0, xt.cols())
}

// SliceCols writes columns [col, col+w) of x to out.
func (b *Backend) SliceCols(out, x backend.Tensor, col int) {
	ot := asT(out)
	b.copyCols(ot, 0, asT(x), col, ot.cols())
}

// copyCols copies columns [xcol, xcol+w) of each row of x to columns
// [ocol, ocol+w) of the same row of out.
func (b *Backend) copyCols(ot *tensor, ocol int, xt *tensor, xcol, w int) {
	n := xt.rows()
	if ot.rows() != n || xt.dt != ot.dt || ocol < 0 || xcol < 0 || ocol+w > ot.cols() || xcol+w > xt.cols() {
		panic(fmt.Sprintf("cuda: copy cols: %d columns from %v at %d to %v at %d", w, xt, xcol, ot, ocol))
	}
	if n == 0 {
		return
	}
	u := xt.dt.Size() / 2
	// A block a row and a block for each 8K units of it, 32 at most.
	copyColsKernel.run(b, [3]int{n, min(32, (w*u+8191)/8192), 1}, 256, 0, copyColsArgs{out: ot.ptr, oW: int32(ot.cols() * u), ocol: int32(ocol * u),
		x: xt.ptr, xW: int32(xt.cols() * u), xcol: int32(xcol * u), w: int32(w * u)})
}

// MulSigmoid multiplies x by sigmoid(gate); see backend.Backend.
func (b *Backend) MulSigmoid(x, gate backend.Tensor) {
	xt, gt := asT(x), asT(gate)
	if !slices.Equal(xt.shape, gt.shape) {
		panic(fmt.Sprintf("cuda: mul sigmoid: x %v, gate %v", xt, gt))
	}
	checkAct("mul sigmoid", xt)
	checkF32("mul sigmoid gate", gt)
	n := xt.numel()
	mulSigmoidKernel.run(b, g1(b.blocksFor(n)), 256, 0, mulSigmoidArgs{x: xt.ptr, xdt: int32(xt.dt), gate: gt.ptr, n: int64(n)})
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
	gatherRowsKernel.run(b, g1(R), 256, 0, gatherRowsArgs{out: ot.ptr, x: xt.ptr, rows: b.meta.dev[mRows], H: int32(h)})
}
