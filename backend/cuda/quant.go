//go:build cgo

package cuda

import (
	"fmt"

	"github.com/kiln-llm/kiln/backend"
)

// Products with block-quantized weights (kernels/quant.cu; the device
// layout is in qlayout.go).
//
// With Q8_0 and K-quant weights a product of one or two tokens is qgemv:
// the activations quantized to int8 blocks as the block's first step, then
// integer dot products, a warp streaming each weight row. Up to
// qmvMaxTokens tokens (decode) a product is qmv: the weights are
// dequantized in registers and multiplied on tensor cores, the tokens as
// the mma's rows, so that the kernel streams the quantized bytes once
// whatever the token count; qmv_swiglu does the gate/up product of an MLP
// and its SwiGLU in one pass, and both take a mixture of experts' rows one
// expert each (sel), or tiles of up to 16 rows of one expert (qmvt_). From
// sm_89, FP8 products of one token and FP8 expert rows are f8mv's
// instead: the weight bytes straight into the FP8 mma, no dequantization
// (kernels/f8mv.cu). Above
// that the weight is dequantized to bf16, qSlab elements at a time, and
// multiplied by cuBLASLt; the grouped expert products (moe_group_mm64_,
// moe_group_mm128_) dequantize each tile of an expert's weights as it
// loads.

// qmvMaxTokens is the largest token count of the quantized decode kernels
// (two groups of the mma's 16 rows); KILN_CUDA_QMV_MAX lowers it (0:
// always dequantize and use cuBLASLt). Up to it a step reads the quantized
// weights once; above it dequantizing them for cuBLASLt costs less than
// the products on mma.sync (qmv won at 16 to 32 tokens and lost at 64:
// NOTES.md, "Figures behind the code").
const qmvMaxTokens = 32

// qgemvTokens is the most tokens of the qgemv kernels (qgemv1_, qgemv2_);
// qgemvMaxTokens the most they take by default (KILN_CUDA_QGEMV_MAX: 0
// to qgemvTokens).
const (
	qgemvTokens    = 2
	qgemvMaxTokens = 2
)

// qgemvWarpsSM is the qgemv warps a multiprocessor runs at once (80
// registers each; QGEMV_MAXW in the kernels); a launch has at most that many a
// multiprocessor, in blocks that take rounds of outputs
// (KILN_CUDA_QGEMV_GRID overrides the blocks).
const qgemvWarpsSM = 24

// qgemvBlock is the warps of a qgemv block over rows weight rows
// (KILN_CUDA_QGEMV_WARPS: 8, 12 or 24 for every product). Every block
// reads the whole activation vector and quantizes it before its first dot
// product, all blocks at once from the same lines of L2: one block of 24
// warps a multiprocessor instead of three of eight gave Qwen3-8B Q8_0 +3%
// at batch 1 and +5% at 2, Q4_K +2% and +4% (H200; NOTES.md). A product
// of fewer rows than 24 a multiprocessor keeps blocks of eight, so that
// its rows spread over every multiprocessor (not measured with 24).
func (b *Backend) qgemvBlock(rows int) int {
	if b.qgemvWarps > 0 {
		return b.qgemvWarps
	}
	if rows >= qgemvWarpsSM*b.sms {
		return qgemvWarpsSM
	}
	return 8
}

// qmvBlocksSM is the qmv blocks a launch has a multiprocessor at most
// (KILN_CUDA_QMV_GRID overrides the total; 0: a block an output group):
// each block takes rounds of output groups. On the Coder-Next shape in FP8
// (4 layers, H200) 16 gave +6% at batch 16 and +8% at 64 over a block a
// group, batch 1 unchanged; 8 and 4 lost (-1% to -23%).
const qmvBlocksSM = 16

// qmvBlocks is the x of a qmv grid of rows rows of groups output groups:
// a block a group, or where that is more than b.qmvGrid blocks, fewer
// blocks taking rounds of groups, the rounds as even as they can be.
func (b *Backend) qmvBlocks(groups, rows int) int {
	if b.qmvGrid == 0 {
		return groups
	}
	return blocksOver(groups, rows, b.qmvGrid)
}

// blocksOver is the x of a grid of rows rows whose blocks take rounds of
// groups, at most limit blocks in all: the rounds as even as they can be.
func blocksOver(groups, rows, limit int) int {
	per := max(1, limit/rows)
	rounds := (groups + per - 1) / per
	return (groups + rounds - 1) / rounds
}

// qgemvSmemMax bounds the activations qgemv quantizes into shared memory
// (as much as three blocks of eight warps a multiprocessor held); wider
// products take qmv.
const qgemvSmemMax = 48 << 10

// qgemvType reports whether qgemv takes weights of dt: the integer types.
// FP8's products of one and two tokens are f8mv's or the FP8 skinny GEMM's
// (sm_89 on) or qmv's; MXFP4 is an expert format (qmv's expert rows).
func qgemvType(dt backend.DType) bool {
	switch dt {
	case backend.Q8_0, backend.Q4_K, backend.Q5_K, backend.Q6_K:
		return true
	}
	return false
}

// quantKernels are the kernels of one quantized type (QKERNELS in
// kernels/quant.cu).
type quantKernels struct {
	embed kernel[qembedArgs]
	deq   kernel[qdeqArgs]
	// The qgemv kernels by their tokens less one (integer types).
	gv       [qgemvTokens]kernel[qgemvArgs]
	gvSwiglu [qgemvTokens]kernel[qgemvSwigluArgs]
	// The qmv kernels by the tokens they take (qmvKernel).
	mv       [3]kernel[qmvArgs]
	mvSwiglu [3]kernel[qmvSwigluArgs]
	// qmv of expert rows by tiles of one expert (qmvTiles).
	mvTiles, mvTilesSwiglu kernel[qmvTilesArgs]
	// The grouped expert products by their tiles' rows: [0] 64, [1] 128.
	groupMM [2]kernel[qgroupMMArgs]
}

var quantKernelTable = map[backend.DType]*quantKernels{}

func init() {
	for _, dt := range []backend.DType{backend.Q8_0, backend.Q4_K, backend.Q5_K, backend.Q6_K, backend.MXFP4, backend.FP8} {
		q := &quantKernels{embed: newKernel[qembedArgs]("qembed_" + dt.String()), deq: newKernel[qdeqArgs]("qdeq_" + dt.String())}
		for i := range qgemvTokens {
			if qgemvType(dt) {
				q.gv[i] = newKernel[qgemvArgs](fmt.Sprintf("qgemv%d_%v", i+1, dt))
				q.gvSwiglu[i] = newKernel[qgemvSwigluArgs](fmt.Sprintf("qgemv%d_swiglu_%v", i+1, dt))
			}
		}
		for i, pre := range []string{"qmv_", "qmv16_", "qmv32_"} {
			q.mv[i] = newKernel[qmvArgs](pre + dt.String())
			q.mvSwiglu[i] = newKernel[qmvSwigluArgs](pre + "swiglu_" + dt.String())
		}
		q.mvTiles = newKernel[qmvTilesArgs]("qmvt_" + dt.String())
		q.mvTilesSwiglu = newKernel[qmvTilesArgs]("qmvt_swiglu_" + dt.String())
		q.groupMM = [2]kernel[qgroupMMArgs]{newKernel[qgroupMMArgs]("moe_group_mm64_" + dt.String()), newKernel[qgroupMMArgs]("moe_group_mm128_" + dt.String())}
		quantKernelTable[dt] = q
	}
}

func quantKernelsOf(dt backend.DType) *quantKernels {
	q := quantKernelTable[dt]
	if q == nil {
		panic(fmt.Sprintf("cuda: no kernels for quantized type %v", dt))
	}
	return q
}

// qmvKernel is the index in quantKernels.mv of the qmv kernel that takes
// n tokens (the first also takes expert rows, n 0): kernels of 8, 16 and
// 32 tokens.
func qmvKernel(n int) int {
	switch {
	case n > 16:
		return 2
	case n > 8:
		return 1
	}
	return 0
}

type qmvSwigluArgs struct {
	out         devptr
	odt         int32
	x           devptr
	T, xdiv     int32
	w           devptr
	rb, estride int64
	sel, ws     devptr
	xsh         int32
	O, I        int32
}

// qmvArgs are qmv_swiglu's and the accumulate flag.
type qmvArgs struct {
	qmvSwigluArgs
	acc int32
}

type qmvTilesArgs struct {
	out                         devptr
	odt                         int32
	x                           devptr
	xdiv                        int32
	w                           devptr
	rb, estride                 int64
	start, order, tiles, ntiles devptr
	O, I                        int32
}

type qgroupMMArgs struct {
	y, xg, w                    devptr
	rb, estride                 int64
	start, order, tiles, ntiles devptr
	O, I                        int32
}

type qgemvSwigluArgs struct {
	out  devptr
	odt  int32
	x    devptr
	xdt  int32
	w    devptr
	rb   int64
	O, I int32
	nrm  qNorm
}

// qNorm is the kernels' QNorm: the RMSNorm a product applies to its
// input, the f32 residual rows (w 0: none).
type qNorm struct {
	w    devptr
	wdt  int32
	eps  float32
	unit int32
}

// qgemvArgs are qgemv_swiglu's and the accumulate flag.
type qgemvArgs struct {
	qgemvSwigluArgs
	acc int32
}

type qdeqArgs struct {
	out, w   devptr
	rb, rows int64
	I        int32
}

type qembedArgs struct {
	out, w   devptr
	rb       int64
	tokens   devptr
	I        int32
	first, V int32
}

// qSlabElems bounds the bf16 scratch of a dequantized weight (64 MiB).
const qSlabElems = 32 << 20

// qUnitCols is the columns one lane of qmv dequantizes at a time (Q in
// kernels/quant.cu).
func qUnitCols(dt backend.DType) int {
	switch dt {
	case backend.Q4_K, backend.Q5_K, backend.Q6_K:
		return 64
	}
	return 32
}

// qmvFits reports whether qmv takes rows of cols elements of dt: whole
// units (only FP8 rows may end inside one).
func qmvFits(dt backend.DType, cols int) bool { return cols%qUnitCols(dt) == 0 }

// checkQmv panics unless qmv takes w as rows of in elements.
func checkQmv(w *tensor, in int) {
	if !qmvFits(w.dt, in) || w.qcols() != in {
		panic(fmt.Sprintf("cuda: qmv of %v with rows of %d", w, in))
	}
}

// qmvWarps is the warps of a qmv block for rows of cols elements of dt
// (KILN_CUDA_QMV_WARPS: at most that many). They split each row's units in
// groups of four (one a lane); each warp takes four groups or more while
// there are enough, so that its lanes stream several units in a row (a
// warp's loads start at once; the ring keeps them going).
func (b *Backend) qmvWarps(dt backend.DType, cols int) int {
	groups := (cols/qUnitCols(dt) + 3) / 4
	return max(1, min(b.qmvWarpsMax, (groups+3)/4))
}

// checkFloatW panics unless each weight is of a float type: the quantized
// types are read by the products, MLP, MoE experts and Embed only.
func checkFloatW(what string, ts ...*tensor) {
	for _, t := range ts {
		if t.dt.Quantized() {
			panic(fmt.Sprintf("cuda: %s: weight %v is quantized; only the linear layers, experts and the token embedding may be", what, t))
		}
	}
}

// qmv launches the quantized decode product: out[t, o] (+)= x[t] . w_o
// for T <= qmvMaxTokens tokens; with swiglu, w is [gate | up] of 2O rows
// and out = silu(gate) * up. x is [., I] f32 or bf16 (qmv reads it as
// bf16, converted where needed: qx), out f32 or bf16.
func (b *Backend) qmv(swiglu bool, out devptr, odt backend.DType, xt *tensor, T int, w *tensor, O, I int, accumulate bool) {
	b.qmvLaunch(swiglu, qmvKernel(T), 1, qmvSwigluArgs{out: out, odt: int32(odt), T: int32(T), xdiv: 1, w: w.ptr, rb: int64(w.rb()), O: int32(O), I: int32(I)}, xt, w, accumulate, false, nil)
}

// qmvRows is qmv of the R rows of a mixture of experts, out[r, o] =
// x[r / xdiv] . w[sel[r]]_o with experts estride bytes apart, and, given
// a shared expert ws laid out as one of them, S rows more: out[R + s, o] =
// x[xsh + s] . ws_o. selReady: the kernel before it is an f8mv product of
// the same rows (f8mv reads sel at once then). It reports whether f8mv
// took the product.
func (b *Backend) qmvRows(swiglu bool, out devptr, odt backend.DType, xt *tensor, xdiv int, w *tensor, estride int, sel devptr, R int, ws devptr, S, xsh, O, I int, selReady bool, sum *moeSum) bool {
	return b.qmvLaunch(swiglu, qmvKernel(0), R+S, qmvSwigluArgs{out: out, odt: int32(odt), T: int32(R), xdiv: int32(xdiv), w: w.ptr, rb: int64(w.rb()),
		estride: int64(estride), sel: sel, ws: ws, xsh: int32(xsh), O: int32(O), I: int32(I)}, xt, w, false, selReady, sum)
}

// qmvLaunch launches qmv kernel k over rows grid rows, or f8mv where it
// takes the product (a.x is set from xt; selReady and sum as f8mv's), and
// reports whether f8mv took it.
func (b *Backend) qmvLaunch(swiglu bool, k, rows int, a qmvSwigluArgs, xt, w *tensor, accumulate, selReady bool, sum *moeSum) bool {
	O, I := int(a.O), int(a.I)
	checkQmv(w, I)
	tokens := int(a.T)
	if a.sel != 0 {
		tokens = 0
	}
	if b.f8mvFits(w.dt, tokens, O, I) && (xt.dt == backend.F32 || xt.dt == backend.BF16) && xt.ptr%16 == 0 {
		b.f8mv(swiglu, rows, a, xt, accumulate, selReady, sum)
		return true
	}
	a.x = b.qx(xt)
	qk, outs := quantKernelsOf(w.dt), 8
	if swiglu {
		outs = 4
	}
	grid := [3]int{b.qmvBlocks((O+outs-1)/outs, rows), rows, 1}
	block := 32 * b.qmvWarps(w.dt, I)
	// Expert rows read sel, written by the kernel before: they wait for it.
	overlap := a.sel == 0
	if swiglu {
		qk.mvSwiglu[k].launch(b, overlap, grid, block, 0, a)
		return false
	}
	qk.mv[k].launch(b, overlap, grid, block, 0, qmvArgs{a, boolInt(accumulate)})
	return false
}

// f8mvTokens is the most tokens of f8mv (the FP8 mma's 8 columns);
// f8mvMaxTokens the most it takes by default (KILN_CUDA_F8MV_MAX: -1 to
// f8mvTokens). Of the products of that many tokens (expert rows: all) it
// takes those of at least f8mvOuts outputs and at most f8mvCols columns
// (KILN_CUDA_F8MV_OUTS, KILN_CUDA_F8MV_COLS); qmv takes those of fewer
// outputs, and the FP8 skinny GEMM those of more columns. One token in a
// graph on an H200, weights cycled past L2 (BenchmarkFP8Products,
// docs/performance.md): f8mv 8.2 / 5.5 us against the skinny GEMM's 9.1 /
// 7.3 on 8192 x 2048 and 4096 x 2048; qmv 6.3 against 7.1 and 7.6 on 2048
// x 4096, where f8mv's 128 row groups leave most of the GPU idle. On
// Qwen3-8B's 4096 columns f8mv won alone too (9.0 against 9.7 us on 4096 x
// 4096, 36.0 against 39.6 on 24576 x 4096), yet the model's step lost
// 3.8% with it (263.4 against 273.7 tok/s, same call): not understood, so
// products of more than 2048 columns stay on the skinny GEMM.
const (
	f8mvTokens    = 8
	f8mvMaxTokens = 1
	f8mvOuts      = 4096
	f8mvCols      = 2048
)

// f8mv's launch shape: each warp takes f8mvBlocksWarp blocks of 128
// columns of a row (at most qmvWarpsMax warps a block; with F8MV_U 2 in
// flight, a group's loads start at once), and a launch is at
// most a wave of blocks (f8mvWarpsSM warps a multiprocessor: its register
// bound, and qmvGrid's blocks at most) that take rounds of 16-row groups.
const (
	f8mvBlocksWarp = 2
	f8mvWarpsSM    = 16
	f8mvSmemMax    = 64 << 10
)

// The f8mv kernels (kernels/f8mv.cu).
var (
	f8mvKernel       = newKernel[f8mvArgs]("f8mv_fp8")
	f8mvSwigluKernel = newKernel[f8mvSwigluArgs]("f8mv_swiglu_fp8")
)

// f8mvSmem is the shared memory of an f8mv block of nt tokens with rows
// of in columns: the activations quantized (hi and lo rows 64 bytes longer
// than the rows) and their scales.
func f8mvSmem(nt, in int) int { return nt * (2*(in+64) + 4*(in/128)) }

// f8mvFits reports whether f8mv takes a product of n tokens (0: expert
// rows, one token each) with o rows of in columns of dt.
func (b *Backend) f8mvFits(dt backend.DType, n, o, in int) bool {
	return dt == backend.FP8 && n <= b.f8mvMax && (n == 0 || o >= b.f8mvOuts && in <= b.f8mvCols) && in%128 == 0 && f8mvSmem(max(n, 1), in) <= f8mvSmemMax
}

// fp8QmvFirst reports whether qmv takes a product of n tokens with o rows
// of in columns of dt before the FP8 skinny GEMM: where f8mv would take
// that many tokens but not so few outputs.
func (b *Backend) fp8QmvFirst(dt backend.DType, n, o, in int) bool {
	return dt == backend.FP8 && n >= 1 && n <= b.f8mvMax && n <= b.qmvMax && o < b.f8mvOuts && qmvFits(dt, in)
}

// f8mvSwigluArgs are qmv_swiglu's, x's type (f32 or bf16) and early.
type f8mvSwigluArgs struct {
	qmvSwigluArgs
	xdt, early int32
}

// f8mvArgs are f8mv_swiglu's, the accumulate flag and a MoE's combine.
type f8mvArgs struct {
	f8mvSwigluArgs
	accumulate int32
	sum        moeSum
}

// f8mvGroup is the outputs of an f8mv group of rows (a SwiGLU's: half).
const f8mvGroup = 16

// f8mv launches qmv's product (q, over rows grid rows, x from xt: f32 or
// bf16) on f8mv. selReady: expert rows behind an f8mv product of the same
// rows, which may read sel at once (early). sum: the MoE's combine, which
// the down product of its expert rows finishes (not with swiglu).
func (b *Backend) f8mv(swiglu bool, rows int, q qmvSwigluArgs, xt *tensor, accumulate, selReady bool, sum *moeSum) {
	q.x = xt.ptr
	a := f8mvSwigluArgs{q, int32(xt.dt), boolInt(selReady && q.sel != 0)}
	O, I := int(a.O), int(a.I)
	outs, nt := f8mvGroup, int(a.T)
	if swiglu {
		outs = f8mvGroup / 2
	}
	if a.sel != 0 {
		nt = 1
	}
	W := max(1, min(b.qmvWarpsMax, I/128/f8mvBlocksWarp))
	groups := (O + outs - 1) / outs
	limit := b.sms * (f8mvWarpsSM / W)
	if b.qmvGrid > 0 {
		limit = min(limit, b.qmvGrid)
	}
	grid := [3]int{blocksOver(groups, rows, limit), rows, 1}
	smem := f8mvSmem(nt, I)
	if swiglu {
		if sum != nil {
			panic("cuda: f8mv: a MoE's combine after its gate/up product")
		}
		b.allowSmem(f8mvSwigluKernel.name, f8mvSmemMax)
		f8mvSwigluKernel.runOverlapped(b, grid, 32*W, smem, a)
		return
	}
	fa := f8mvArgs{f8mvSwigluArgs: a, accumulate: boolInt(accumulate)}
	if sum != nil {
		fa.sum = *sum
	}
	b.allowSmem(f8mvKernel.name, f8mvSmemMax)
	f8mvKernel.runOverlapped(b, grid, 32*W, smem, fa)
}

// qgemvSmem is the shared memory of a qgemv of n tokens with rows of in
// elements (in % 32 == 0): each token's int8 activations, padded to 128
// bytes, and a 16-byte XQ a block of 32.
func qgemvSmem(n, in int) int { return n * ((in+127)/128*128 + in/32*16) }

// qgemvNormSmem is the shared memory a qgemv that takes the RMSNorm of its
// input adds for the norm's weights: float32 of each of the in columns.
func qgemvNormSmem(in int) int { return 4 * in }

// qgemvFits reports whether qgemv takes a product of n tokens of x by rows
// of in elements of dt.
func (b *Backend) qgemvFits(dt backend.DType, xt *tensor, n, in int) bool {
	return n <= b.qgemvMax && qgemvType(dt) && qmvFits(dt, in) && qgemvSmem(n, in) <= qgemvSmemMax && xt.ptr%16 == 0
}

// qgemv launches the quantized product of one or two tokens with integer
// dot products (see qgemvFits): out[t, o] (+)= x[t] . w_o, or with swiglu
// (w = [gate | up] of 2O rows) out = silu(gate) * up. x is f32 or bf16,
// out f32 or bf16.
func (b *Backend) qgemv(swiglu bool, out devptr, odt backend.DType, xt, w *tensor, O, I int, nrm qNorm, accumulate bool) {
	n := xt.rows()
	if w.qcols() != I {
		panic(fmt.Sprintf("cuda: qgemv of %v with rows of %d", w, I))
	}
	qk, smem := quantKernelsOf(w.dt), qgemvSmem(n, I)
	if nrm.w != 0 {
		smem += qgemvNormSmem(I)
	}
	a := qgemvSwigluArgs{out: out, odt: int32(odt), x: xt.ptr, xdt: int32(xt.dt), w: w.ptr, rb: int64(w.rb()), O: int32(O), I: int32(I), nrm: nrm}
	// Blocks of W warps take rounds of W rows: W outputs, or W / 2 with
	// swiglu (a warp a gate or up row).
	rows := O
	if swiglu {
		rows = 2 * O
	}
	W := b.qgemvBlock(rows)
	grid := min((rows+W-1)/W, qgemvWarpsSM/W*b.sms)
	if b.qgemvGrid > 0 {
		grid = min(grid, b.qgemvGrid)
	}
	if swiglu {
		k := qk.gvSwiglu[n-1]
		b.allowSmem(k.name, qgemvSmemMax)
		k.runOverlapped(b, g1(grid), 32*W, smem, a)
		return
	}
	k := qk.gv[n-1]
	b.allowSmem(k.name, qgemvSmemMax)
	k.runOverlapped(b, g1(grid), 32*W, smem, qgemvArgs{a, boolInt(accumulate)})
}

// qx returns x as bf16 at a 16-byte aligned address: x itself, or a
// converted copy in scratch memory.
func (b *Backend) qx(xt *tensor) devptr {
	if xt.dt == backend.BF16 && xt.ptr%16 == 0 {
		return xt.ptr
	}
	n := xt.numel()
	xp := b.scratchBuf("productx", 2*n)
	if xt.dt == backend.F32 {
		b.toHalf(xp, xt.ptr, n, backend.BF16)
	} else {
		b.cast(xp, backend.BF16, xt.ptr, xt.dt, n)
	}
	return xp
}

// qdeq writes rows [row0, row0 + rows) of the quantized w as bf16 rows of
// in elements at out.
func (b *Backend) qdeq(out devptr, w *tensor, row0, rows, in int) {
	units := (in + qUnitCols(w.dt) - 1) / qUnitCols(w.dt)
	quantKernelsOf(w.dt).deq.run(b, g1(b.blocksFor(rows*units)), 256, 0, qdeqArgs{
		out: out, w: w.ptr + devptr(row0*w.rb()), rb: int64(w.rb()), rows: int64(rows), I: int32(in)})
}

// qmvTileRows is the most rows of one expert in a tile of qmvt_: the mma's
// 16.
const qmvTileRows = 16

// qmvTiles is qmv of the expert rows that g lists by tiles of up to
// qmvTileRows rows of one expert (at most maxTiles): out[r, o] = x[r /
// xdiv] . w[e]_o for each row r of expert e, so that an expert's weights
// are read once for its rows.
func (b *Backend) qmvTiles(swiglu bool, out devptr, odt backend.DType, x devptr, xdiv int, w *tensor, estride int, g expertGroups, maxTiles, O, I int) {
	checkQmv(w, I)
	qk := quantKernelsOf(w.dt)
	k, outs := qk.mvTiles, 8
	if swiglu {
		k, outs = qk.mvTilesSwiglu, 4
	}
	// The tiles are written by the kernel before: no overlap.
	k.run(b, [3]int{b.qmvBlocks((O+outs-1)/outs, maxTiles), maxTiles, 1}, 32*b.qmvWarps(w.dt, I), 0, qmvTilesArgs{out: out, odt: int32(odt), x: x, xdiv: int32(xdiv),
		w: w.ptr, rb: int64(w.rb()), estride: int64(estride), start: g.start, order: g.order, tiles: g.tiles, ntiles: g.ntiles, O: int32(O), I: int32(I)})
}

// qgemm computes out[n, o] (+)= x[n, in] . w[o, in]^T through cuBLASLt,
// the weight dequantized to bf16 in slabs of at most qSlab elements
// (rows a multiple of 64); x is bf16, out f32 (written or added to) or
// bf16.
func (b *Backend) qgemm(out devptr, odt backend.DType, x devptr, w *tensor, n, o, in int, accumulate bool) {
	rows := o
	if o*in > b.qSlab {
		rows = max(64, b.qSlab/in/64*64)
	}
	for o0 := 0; o0 < o; o0 += rows {
		m := min(rows, o-o0)
		buf := b.scratchBuf("qdeq", 2*m*in)
		b.qdeq(buf, w, o0, m, in)
		b.gemmLd(out+devptr(o0*odt.Size()), x, buf, n, m, in, o, backend.BF16, odt, accumulate)
	}
}

// qmatmul is MatMul with a quantized weight.
func (b *Backend) qmatmul(ot, xt, wt *tensor, accumulate bool) {
	n, in, o := xt.rows(), xt.cols(), wt.rows()
	if b.qgemvFits(wt.dt, xt, n, in) {
		b.qgemv(false, ot.ptr, ot.dt, xt, wt, o, in, qNorm{}, accumulate)
		return
	}
	if b.f8mvFits(wt.dt, n, o, in) || b.fp8QmvFirst(wt.dt, n, o, in) {
		b.qmv(false, ot.ptr, ot.dt, xt, n, wt, o, in, accumulate)
		return
	}
	if wt.dt == backend.FP8 {
		if S := b.fp8SkinnySplits(n, o, in, false); S > 0 {
			b.skinnyFP8(false, S, ot.ptr, ot.dt, b.qx(xt), wt, n, o, in, accumulate)
			return
		}
	}
	if b.fp8Gemm(wt, xt, n, in, o) {
		b.fp8gemm(ot.ptr, ot.dt, xt, wt, n, o, in, accumulate)
		return
	}
	if n <= b.qmvMax && qmvFits(wt.dt, in) {
		b.qmv(false, ot.ptr, ot.dt, xt, n, wt, o, in, accumulate)
		return
	}
	b.qgemm(ot.ptr, ot.dt, b.productInput(xt, backend.BF16), wt, n, o, in, accumulate)
}

// qmlp is the MLP with a quantized gate/up weight, or reports false for
// the general path: an FP8 weight takes f8mv at one token and the FP8
// skinny GEMM up to eight from sm_89 (skinny.go) and on Hopper the
// block-scaled GEMM above (fp8.go), a few tokens take qmv_swiglu, more the dequantized
// product through cuBLASLt (bf16 out, as the bf16 path) and silu_mul_bf16;
// the down product is a MatMul of the bf16 activation.
func (b *Backend) qmlp(ot, xt, gu, dn *tensor, accumulate bool) bool {
	n, H := xt.rows(), xt.cols()
	I := dn.cols()
	act := &tensor{dt: backend.BF16, shape: []int{n, I}, view: true}
	S := 0
	if gu.dt == backend.FP8 {
		S = b.fp8SkinnySplits(n, I, H, true)
	}
	switch {
	case b.qgemvFits(gu.dt, xt, n, H):
		act.ptr = b.scratchBuf("mlp.act", 2*n*I)
		b.qgemv(true, act.ptr, backend.BF16, xt, gu, I, H, qNorm{}, false)
	case b.f8mvFits(gu.dt, n, I, H) || b.fp8QmvFirst(gu.dt, n, I, H):
		act.ptr = b.scratchBuf("mlp.act", 2*n*I)
		b.qmv(true, act.ptr, backend.BF16, xt, n, gu, I, H, false)
	case S > 0:
		act.ptr = b.scratchBuf("mlp.act", 2*n*I)
		b.skinnyFP8(true, S, act.ptr, backend.BF16, b.qx(xt), gu, n, I, H, false)
	case b.fp8Gemm(gu, xt, n, H, 2*I) && I%8 == 0:
		h := b.scratchBuf("mlp.gu", 2*n*2*I)
		act.ptr = b.scratchBuf("mlp.act", 2*n*I)
		b.fp8gemm(h, backend.BF16, xt, gu, n, 2*I, H, false)
		b.siluMulBF16(act.ptr, h, n, I)
	case n <= b.qmvMax && qmvFits(gu.dt, H):
		act.ptr = b.scratchBuf("mlp.act", 2*n*I)
		b.qmv(true, act.ptr, backend.BF16, xt, n, gu, I, H, false)
	case I%8 == 0:
		h := b.scratchBuf("mlp.gu", 2*n*2*I)
		act.ptr = b.scratchBuf("mlp.act", 2*n*I)
		b.qgemm(h, backend.BF16, b.productInput(xt, backend.BF16), gu, n, 2*I, H, false)
		b.siluMulBF16(act.ptr, h, n, I)
	default:
		return false
	}
	b.MatMul(ot, act, dn, accumulate)
	return true
}
