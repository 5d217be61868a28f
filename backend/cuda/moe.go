//go:build cgo

package cuda

import (
	"fmt"

	"github.com/kiln-llm/kiln/backend"
)

// moeRouterGemm is the fewest tokens whose router product runs on tensor
// cores (KILN_CUDA_ROUTER_GEMM overrides it; 0 never).
const moeRouterGemm = 64

// The kernels of kernels/moe.cu.
var (
	moeRouteKernel   = newKernel[moeRouteArgs]("moe_route")
	moeGemvKernel    = newKernel[moeGemvArgs]("moe_gemv")
	moeGroupKernel   = newKernel[moeGroupArgs]("moe_group")
	moeCountKernel   = newKernel[moeCountArgs]("moe_count")
	moeScatterKernel = newKernel[moeScatterArgs]("moe_scatter")
	moeSplitKernel   = newKernel[moeSplitArgs]("moe_split")
	moeGatherKernel  = newKernel[moeGatherArgs]("moe_gather")
	// The grouped products by their tiles' rows: [0] 64, [1] 128.
	moeGroupMMKernels = [2]kernel[moeGroupMMArgs]{newKernel[moeGroupMMArgs]("moe_group_mm64"), newKernel[moeGroupMMArgs]("moe_group_mm128")}
	moeGroupF8Kernels = [2]kernel[moeGroupF8Args]{newKernel[moeGroupF8Args]("moe_group_f8_64"), newKernel[moeGroupF8Args]("moe_group_f8_128")}
	// The bf16 ones on wgmma: [0] 64 rows by moeWGOuts, [1] 128 by twice that.
	moeGroupWGKernels = [2]kernel[moeGroupWGArgs]{newKernel[moeGroupWGArgs]("moe_group_wg64"), newKernel[moeGroupWGArgs]("moe_group_wg128")}
	// Those as gate/up products with the SwiGLU.
	moeGroupWGSwiGLUKernels = [2]kernel[moeGroupWGArgs]{newKernel[moeGroupWGArgs]("moe_group_wg64_swiglu"), newKernel[moeGroupWGArgs]("moe_group_wg128_swiglu")}
	// And writing bf16 rows.
	moeGroupWGBF16Kernels = [2]kernel[moeGroupWGArgs]{newKernel[moeGroupWGArgs]("moe_group_wg64_bf16"), newKernel[moeGroupWGArgs]("moe_group_wg128_bf16")}
	moeCombineKernel      = newKernel[moeCombineArgs]("moe_combine")
	// moe_rows by [rows a block - 1][swiglu].
	moeRowsKernels = [2][2]kernel[moeRowsArgs]{
		{newKernel[moeRowsArgs]("moe_rows_plain"), newKernel[moeRowsArgs]("moe_rows_swiglu")},
		{newKernel[moeRowsArgs]("moe_rows2_plain"), newKernel[moeRowsArgs]("moe_rows2_swiglu")},
	}
)

// moeRouterKernels are moe_router_N (kernels/gemv.cu) by tokens, 1 to
// gemvTokens: blocks of eight warps, two a row of the router.
var moeRouterKernels [gemvTokens]kernel[moeRouterArgs]

// moeRouterRows is the router rows of a moe_router block.
const moeRouterRows = 4

func init() {
	for n := 1; n <= gemvTokens; n++ {
		moeRouterKernels[n-1] = newKernel[moeRouterArgs](fmt.Sprintf("moe_router_%d", n))
	}
}

type moeRouterArgs struct {
	x, w, wg          devptr
	E, H              int32
	logits, gs, cnt   devptr
	K, norm, e0, held int32
	sel, wts          devptr
}

type moeRouteArgs struct {
	logits        devptr
	T, E, K, norm int32
	e0, held      int32
	sel, wts      devptr
}

type moeGemvArgs struct {
	y, x devptr
	xdiv int32
	w    devptr
	wdt  int32
	sel  devptr
	O, I int32
}

type moeGroupArgs struct {
	sel                         devptr
	R, E, tm, nb                int32
	bcnt                        devptr
	start, order, tiles, ntiles devptr
}

type moeCountArgs struct {
	sel  devptr
	R, E int32
	bcnt devptr
}

type moeScatterArgs struct {
	sel         devptr
	R, E        int32
	bcnt, order devptr
}

type moeSplitArgs struct {
	hi, lo, x devptr
	n         int64
}

type moeGatherArgs struct {
	xg, x devptr
	xdiv  int32
	order devptr
	I     int32
}

type moeGroupMMArgs struct {
	y, xg, w, start, order, tiles, ntiles devptr
	O, I                                  int32
}

type moeGroupWGArgs struct {
	y, x                           devptr
	xdiv                           int32
	w, start, order, tiles, ntiles devptr
	O, I                           int32
}

type moeGroupF8Args struct {
	y                           devptr
	ydt                         int32
	xq, xs                      devptr
	T, xdiv                     int32
	w                           devptr
	rb, estride                 int64
	start, order, tiles, ntiles devptr
	O, I                        int32
}

type moeCombineArgs struct {
	out, y    devptr
	ydt       int32
	wts       devptr
	K, H      int32
	ys, x, wg devptr
	wgdt      int32
	gs        devptr
}

// moeSum is the combine that f8mv's down product of expert rows finishes
// (kernels' MoeSum): out += the rows weighted by wts, and the shared
// expert's by gs; cnt counts the arrivals a (token, group of outputs).
type moeSum struct {
	out, wts, gs devptr
	K            int32
	cnt          devptr
}

type moeRowsArgs struct {
	y, x                        devptr
	xdiv, xsh                   int32
	w, sel                      devptr
	R                           int32
	ws                          devptr
	O, I                        int32
	start, order, tiles, ntiles devptr
}

// moeGrouped reports whether R (token, choice) rows over E experts take the
// grouped products: from two rows an expert on average, where a tile of
// an expert's rows reads its weights fewer times than a GEMV per row
// (four rows an expert won, 1.25 lost: NOTES.md, "Figures behind the
// code").
func moeGrouped(R, E int) bool { return R >= 2*E }

// moeRowPairs reports whether R (token, choice) rows over E experts that
// take moe_rows go in pairs of one expert's rows: from one row for every
// two experts, where enough experts have two rows to pay for sorting them.
func moeRowPairs(R, E int) bool { return 2*R >= E }

// expertTiles is the most tiles of up to tm rows of one expert that R rows
// over E experts make: an expert with n rows makes ceil(n / tm).
func expertTiles(R, E, tm int) int { return (R + (tm-1)*min(E, R) + tm - 1) / tm }

// The grouped expert products' tiles (kernels/moe_mm.cuh): moeGroupRows
// rows of one expert (moeGroupRowsLarge from moeGroupLargeFrom rows an
// expert on average) by moeGroupOuts outputs (MG_BN), moeGroupCols columns
// a stage (MG_BK), moeGroupStages stages (MG_STAGES), rows moeGroupPitch
// elements apart in shared memory (MG_P: 16 bytes more than a stage's row
// keeps ldmatrix free of bank conflicts); and a slot of moeGroupRaw bytes
// (MG_RAW) for one unit's blocks of a quantized weight row (QTiles:
// Q5_K's, the largest, are 80). 128-row tiles read an expert's weights
// half as often as 64-row ones: at 80 rows an expert (a 4K-token
// Qwen3-Next prompt) prefill ran 1.04 (bf16) to 1.11 times (FP8) as fast
// with them; at four (Qwen3-30B-A3B, FP8, batch 64) 0.71 times (H200,
// 2026-11-28).
const (
	moeGroupRows      = 64
	moeGroupRowsLarge = 128
	moeGroupLargeFrom = 32
	moeGroupOuts      = 128
	moeGroupCols      = 32
	moeGroupStages    = 3
	moeGroupPitch     = moeGroupCols + 8
	moeGroupRaw       = 80
)

// The grouped products' tiles on wgmma (kernels/moe_wg.cu): moeWGOuts
// outputs (MW_BN) by 128 bytes of a row a stage (FP8: a block of 128
// columns; bf16: 64 columns), moeWGStages stages (MW_STAGES).
const (
	moeWGOuts   = 128
	moeWGStages = 4
)

// moeGroupWGSmem is the shared memory of the grouped products on wgmma in
// tiles of bm rows: stages of rows of 128 bytes and (FP8) their scales,
// after up to 1024 bytes that align the stages.
func moeGroupWGSmem(bm, bn int) int { return 1024 + moeWGStages*(bm+bn)*(128+4) }

// moeGroupSmem is the shared memory of the bf16 grouped products in tiles
// of bm rows: stages of the rows and of the weights; moeGroupQSmem that of
// the quantized ones: the rows' stages, two dequantized weight stages and
// the ring of the blocks' copies.
func moeGroupSmem(bm int) int { return 2 * moeGroupStages * (bm + moeGroupOuts) * moeGroupPitch }

func moeGroupQSmem(bm int) int {
	return 2*(moeGroupStages*bm+2*moeGroupOuts)*moeGroupPitch + moeGroupStages*moeGroupOuts*moeGroupRaw
}

// Route picks each token's experts; see backend.Backend.
func (b *Backend) Route(experts, weights, x, router backend.Tensor, spec *backend.MoESpec) {
	et, wt, xt := asT(experts), asT(weights), asT(x)
	checkRows("route experts", et, xt.rows(), spec.TopK)
	checkRows("route weights", wt, xt.rows(), spec.TopK)
	if et.dt != backend.I32 {
		panic(fmt.Sprintf("cuda: route: experts %v must be i32", et))
	}
	checkF32("route", wt)
	if spec.First != 0 {
		panic("cuda: route: a range of the experts is the fused MoE's (expert parallel)")
	}
	b.route(et.ptr, wt.ptr, xt, asT(router), spec, spec.Experts, nil)
}

// route writes each token's spec.TopK experts and their weights to sel and
// wts ([T, TopK] each): for a rank that holds experts [spec.First,
// spec.First + held), the index among them, or -1 and weight 0 for
// another rank's. Given a shared expert's gate, it may make the gate's
// sigmoid a token as well, and returns where (else 0). Where the product
// takes x in bf16 parts, xh is the first of them: x in bf16, for the
// experts' products to read too.
func (b *Backend) route(sel, wts devptr, xt, router *tensor, spec *backend.MoESpec, held int, gate *tensor) (gs devptr, xh *tensor) {
	T, H := xt.rows(), xt.cols()
	E, K := spec.Experts, spec.TopK
	checkF32("route", xt)
	checkFloatW("moe router", router)
	// moe_route's lanes hold the K picks: K <= 32.
	if E <= 0 || E > 1024 || K <= 0 || K > E || K > 32 || router.rows() != E || router.cols() != H {
		panic(fmt.Sprintf("cuda: route: router %v for %d experts (top %d) of width %d", router, E, K, H))
	}
	if T == 0 {
		return 0, nil
	}
	// The router product keeps float32's precision (not cuBLASLt's bf16
	// inputs): a rounding-sized change there can flip the choice of
	// experts. Prompts take it on tensor cores as x = hi + lo, two bf16
	// products accumulated in float32 (~16 bits of x); decode steps take
	// the bf16 GEMV with float32 activations (NOTES.md, "Figures behind
	// the code").
	logits := b.scratchF32("moe.logits", T, E)
	if router.dt == backend.BF16 && T <= b.gemvMax && H%16 == 0 {
		// Decode: the product and the ranking in one launch (moe_router),
		// the shared expert's gate one more row of it.
		a := moeRouterArgs{x: xt.ptr, w: router.ptr, E: int32(E), H: int32(H), logits: logits.ptr, cnt: b.zeroedScratch("moe.router", 4),
			K: int32(K), norm: boolInt(spec.NormTopK), e0: int32(spec.First), held: int32(held), sel: sel, wts: wts}
		rows := E
		if gate != nil && gate.dt == backend.BF16 && gate.numel() == H {
			a.wg, a.gs = gate.ptr, b.scratchBuf("moe.gs", 4*T)
			rows++
		}
		moeRouterKernels[T-1].runOverlapped(b, g1((rows+moeRouterRows-1)/moeRouterRows), 256, 0, a)
		return a.gs, nil
	}
	if b.routerGemm > 0 && T >= b.routerGemm && router.dt == backend.BF16 {
		hi, lo := b.scratchBuf("moe.xhi", 2*T*H), b.scratchBuf("moe.xlo", 2*T*H)
		moeSplitKernel.run(b, g1(b.blocksFor(T*H)), 256, 0, moeSplitArgs{hi: hi, lo: lo, x: xt.ptr, n: int64(T * H)})
		b.gemm(logits.ptr, hi, router.ptr, T, E, H, backend.BF16, backend.F32, false)
		b.gemm(logits.ptr, lo, router.ptr, T, E, H, backend.BF16, backend.F32, true)
		xh = &tensor{dt: backend.BF16, shape: []int{T, H}, ptr: hi, view: true}
	} else if b.routerGemm > 0 && T >= b.routerGemm && router.dt == backend.F32 {
		// A router kept in float32 (GGUF files: llama.cpp's converter
		// writes them so) takes cuBLASLt's float32 GEMM: moe_gemv reads
		// the router again for every token, 1.9 ms a layer for a 4K
		// prompt with 512 experts (H200, KILN_CUDA_PROFILE).
		b.gemm(logits.ptr, xt.ptr, router.ptr, T, E, H, backend.F32, backend.F32, false)
	} else {
		moeGemvKernel.run(b, [3]int{(E + 7) / 8, T, 1}, 256, 0, moeGemvArgs{y: logits.ptr, x: xt.ptr, xdiv: 1, w: router.ptr, wdt: int32(router.dt), sel: 0, O: int32(E), I: int32(H)})
	}
	moeRouteKernel.runOverlapped(b, g1((T+7)/8), 256, 0, moeRouteArgs{logits: logits.ptr, T: int32(T), E: int32(E), K: int32(K), norm: boolInt(spec.NormTopK),
		e0: int32(spec.First), held: int32(held), sel: sel, wts: wts})
	return 0, xh
}

// Experts adds each token's chosen experts to out; see backend.Backend.
func (b *Backend) Experts(out, x, experts, weights, gateUp, down backend.Tensor) {
	ot, xt, et, wt := asT(out), asT(x), asT(experts), asT(weights)
	T, H, K := xt.rows(), xt.cols(), et.cols()
	checkRows("experts out", ot, T, H)
	checkRows("experts ids", et, T, K)
	checkRows("experts weights", wt, T, K)
	checkF32("experts", ot, wt)
	if et.dt != backend.I32 {
		panic(fmt.Sprintf("cuda: experts: expert ids %v must be i32", et))
	}
	y, _, _ := b.expertRows(xt, nil, et.ptr, K, asT(gateUp), asT(down), nil, nil, nil)
	b.combine(ot, xt, y, wt.ptr, K, 0, nil, 0)
}

// expertRows returns y [T*K, H]: row t*K + j is token t's j-th chosen
// expert (sel) applied to it. Given a shared expert (sgu, sdown) that the
// decode GEMV can take among those rows, it does, and returns where in y
// its rows (token t's at T*K + t) start; else ys is 0. Given a combine
// (sum: every expert this rank's), it reports whether the down product
// finished it, which f8mv does where the shared expert, if any, is among
// its rows.
func (b *Backend) expertRows(xt, xh *tensor, sel devptr, K int, gu, down, sgu, sdown *tensor, sum *moeSum) (y *tensor, ys devptr, summed bool) {
	T, H := xt.rows(), xt.cols()
	checkF32("experts", xt)
	if len(gu.shape) != 3 || len(down.shape) != 3 {
		panic(fmt.Sprintf("cuda: experts: gate_up %v, down %v", gu, down))
	}
	E, I := gu.shape[0], gu.shape[1]/2
	if E > 1024 || gu.shape[2] != H || down.shape[0] != E || down.shape[1] != H || down.shape[2] != I {
		panic(fmt.Sprintf("cuda: experts: gate_up %v, down %v for width %d", gu, down, H))
	}
	R := T * K
	if R == 0 {
		return b.scratchF32("moe.y", R, H), 0, false
	}
	// Each (token, choice) row is a product with its expert's weights: a
	// GEMV per row, or (moeGrouped) tensor-core tiles of one expert's rows,
	// which read an expert's weights once per tile of its rows instead of
	// once per row (quantized experts dequantized as their tiles load).
	// Quantized experts take qmv at decode (gate/up with the SwiGLU fused):
	// by tiles of one expert's rows from one row for every two experts
	// (moeRowPairs), else a row a block.
	groupable := func(w *tensor) bool { return w.dt == backend.BF16 || w.dt.Quantized() }
	grouped := moeGrouped(R, E) && groupable(gu) && groupable(down) && H%moeGroupCols == 0 && I%moeGroupCols == 0
	if !grouped && (gu.dt.Quantized() && !qmvFits(gu.dt, H) || down.dt.Quantized() && !qmvFits(down.dt, I)) {
		if !groupable(gu) || !groupable(down) || H%moeGroupCols != 0 || I%moeGroupCols != 0 {
			panic(fmt.Sprintf("cuda: moe: experts gate_up %v, down %v: quantized experts need widths that are multiples of %d", gu, down, moeGroupCols))
		}
		grouped = true // FP8 rows that end inside a unit of qmv
	}
	if !grouped && gu.dt == backend.BF16 && down.dt == backend.BF16 && H%8 == 0 && I%8 == 0 {
		y, ys = b.expertGemv(xt, sel, K, gu, down, sgu, sdown)
		return y, ys, false
	}
	// Quantized rows at decode take a shared expert laid out as the
	// experts as S = T rows more, a row a block, as expertGemv does.
	var qg expertGroups
	qtiles := !grouped && (gu.dt.Quantized() || down.dt.Quantized()) && moeRowPairs(R, E)
	if qtiles {
		qg = b.groupRows(sel, R, E, qmvTileRows)
	}
	S := 0
	if !grouped && !qtiles && gu.dt.Quantized() && down.dt.Quantized() && sgu != nil && sgu.dt == gu.dt && sdown.dt == down.dt &&
		sgu.rows() == 2*I && sgu.cols() == H && sdown.rows() == H && sdown.cols() == I {
		S = T
	}
	expertProduct := func(y, x devptr, xdiv int, w *tensor, O, in int) {
		moeGemvKernel.run(b, [3]int{(O + 7) / 8, R, 1}, 256, 0, moeGemvArgs{y: y, x: x, xdiv: int32(xdiv), w: w.ptr, wdt: int32(w.dt), sel: sel, O: int32(O), I: int32(in)})
	}
	var g expertGroups // the grouped products' rows, in tiles of bm
	bm := moeGroupRows
	if grouped {
		if R >= moeGroupLargeFrom*E {
			bm = moeGroupRowsLarge
		}
		g = b.groupRows(sel, R, E, bm)
		expertProduct = func(y, x devptr, xdiv int, w *tensor, O, in int) { b.groupProduct(y, x, xdiv, w, g, R, E, bm, O, in) }
	}
	// qrows is the quantized expert rows' product at decode (xsh: where the
	// shared expert's inputs start; selReady as qmvRows'); it reports
	// whether f8mv took it.
	qrows := func(swiglu bool, out devptr, odt backend.DType, xt *tensor, xdiv int, w *tensor, estride int, ws devptr, xsh, O, in int, selReady bool, sum *moeSum) bool {
		if qtiles {
			b.qmvTiles(swiglu, out, odt, b.qx(xt), xdiv, w, estride, qg, expertTiles(R, E, qmvTileRows), O, in)
			return false
		}
		return b.qmvRows(swiglu, out, odt, xt, xdiv, w, estride, sel, R, ws, S, xsh, O, in, selReady, sum)
	}
	if grouped && b.groupF8(gu, H) && b.groupF8(down, I) {
		// Both on wgmma: down's rows quantized straight from gate/up's
		// (the SwiGLU and e4m3 in one pass over them).
		h := b.scratchF32("moe.h", R, 2*I)
		expertProduct(h.ptr, xt.ptr, K, gu, 2*I, H)
		xq, xs := b.quantAct("moe", h.ptr, backend.F32, R, R, I, true)
		yb := b.expertRowsBF16(R, H)
		b.groupF8Product(yb.ptr, backend.BF16, xq, xs, R, 1, down, g, R, E, bm, H, I)
		return yb, ys, false
	}
	if grouped && b.groupWG(gu, H) && b.groupWG(down, I) {
		// Both on wgmma: gate/up's tiles read the tokens' rows through the
		// order, cast to bf16 once (moe_gather's R rows: 96 us a layer of
		// qnext12's 4K prompt, H200), and write down's gathered rows, the
		// SwiGLU applied (silu_mul and the second gather, 1.8 ms of a 4K
		// prompt's 38 in qnext12's 12 layers, and the float32 rows between
		// them, gone).
		if xh == nil {
			xh = &tensor{dt: backend.BF16, shape: []int{T, H}, ptr: b.scratchBuf("moe.xh", 2*T*H), view: true}
			b.toHalf(xh.ptr, xt.ptr, T*H, backend.BF16)
		}
		act := b.scratchBuf("moe.actg", 2*R*I)
		b.groupTiles(act, backend.BF16, xh.ptr, K, gu, g, R, E, bm, 2*I, H, true)
		yb := b.expertRowsBF16(R, H)
		b.groupTiles(yb.ptr, backend.BF16, act, 0, down, g, R, E, bm, H, I, false)
		return yb, ys, false
	}
	y = b.scratchF32("moe.y", R+S, H)
	if S > 0 {
		ys = y.ptr + devptr(4*R*H)
	}
	var act *tensor // [R + S, I], f32 or (qmv_swiglu) bf16
	upF8 := false   // gate/up took f8mv: down may read sel at once
	if !grouped && gu.dt.Quantized() {
		act = &tensor{dt: backend.BF16, shape: []int{R + S, I}, ptr: b.scratchBuf("moe.act", 2*(R+S)*I), view: true}
		upF8 = qrows(true, act.ptr, backend.BF16, xt, K, gu, 2*I*gu.rb(), ptrOf(sgu, S), 0, I, H, false, nil)
	} else {
		h := b.scratchF32("moe.h", R, 2*I)
		expertProduct(h.ptr, xt.ptr, K, gu, 2*I, H)
		act = b.scratchF32("moe.act", R, I)
		b.siluMul(act, h)
	}
	switch {
	case !grouped && down.dt.Quantized():
		if sum != nil && (sgu == nil || S > 0) && !qtiles {
			sum.cnt = b.zeroedScratch("moe.sum", 4*T*((H+f8mvGroup-1)/f8mvGroup))
		} else {
			sum = nil
		}
		summed = qrows(false, y.ptr, backend.F32, act, 1, down, H*down.rb(), ptrOf(sdown, S), R, H, I, upF8, sum) && sum != nil
	case act.dt == backend.BF16:
		// Quantized gate/up before float32 or f16 down weights.
		af := b.scratchF32("moe.actf", R, I)
		b.cast(af.ptr, backend.F32, act.ptr, backend.BF16, R*I)
		expertProduct(y.ptr, af.ptr, 1, down, H, I)
	default:
		expertProduct(y.ptr, act.ptr, 1, down, H, I)
	}
	return y, ys, summed
}

// expertRowsBF16 is the expert rows [R, H] in bf16, where the wgmma tiles
// write them: half the bytes of float32 rows to write and for moe_combine
// to read (~80 us a layer of qnext12's 4K prompt), for one more rounding
// to bf16 of each expert's output before the weighted sum (vLLM's fused
// MoE keeps these rows in bf16 too; a dense layer's down product adds
// float32 to the residual).
func (b *Backend) expertRowsBF16(R, H int) *tensor {
	return &tensor{dt: backend.BF16, shape: []int{R, H}, ptr: b.scratchBuf("moe.yb", 2*R*H), view: true}
}

// groupProduct is the grouped product of experts w (O rows of in each) in
// tiles of bm rows listed by g: y[r] = x[r / xdiv] . w[sel[r]]^T for the R
// rows r, x float32. FP8 experts on Hopper take their rows in e4m3
// (groupF8); the others gather them in bf16 for the tiles on wgmma (bf16
// experts on Hopper, groupWG) or on mma.sync.
func (b *Backend) groupProduct(y, x devptr, xdiv int, w *tensor, g expertGroups, R, E, bm, O, in int) {
	if b.groupF8(w, in) {
		n := R / xdiv
		xq, xs := b.quantAct("moe", x, backend.F32, n, n, in, false)
		b.groupF8Product(y, backend.F32, xq, xs, n, xdiv, w, g, R, E, bm, O, in)
		return
	}
	b.groupTiles(y, backend.F32, b.gatherRows(x, xdiv, g, R, in), 0, w, g, R, E, bm, O, in, false)
}

// gatherRows returns x's R rows (of in) in g's order, in bf16: row j is
// x[order[j] / xdiv].
func (b *Backend) gatherRows(x devptr, xdiv int, g expertGroups, R, in int) devptr {
	xg := b.scratchBuf("moe.xg", 2*R*in)
	moeGatherKernel.run(b, g1(R), 256, 0, moeGatherArgs{xg: xg, x: x, xdiv: int32(xdiv), order: g.order, I: int32(in)})
	return xg
}

// groupTiles is groupProduct's tiles, on bf16 rows x: x[order[j] / xdiv]
// is row j of the tiles (the wgmma tiles only: groupWG), or with xdiv 0
// x[j] (the rows gathered). With swiglu (wgmma only), w is gate/up and y is
// silu(gate) * up in bf16 ([R, O / 2]) in g's order: the down product's
// gathered rows.
func (b *Backend) groupTiles(y devptr, ydt backend.DType, x devptr, xdiv int, w *tensor, g expertGroups, R, E, bm, O, in int, swiglu bool) {
	large := bm == moeGroupRowsLarge
	grid := [3]int{(O + moeGroupOuts - 1) / moeGroupOuts, expertTiles(R, E, bm), 1}
	if b.groupWG(w, in) {
		bn := moeWGOuts * bm / moeGroupRows
		k, smem := moeGroupWGKernels[boolInt(large)], moeGroupWGSmem(bm, bn)
		grid[0] = (O + bn - 1) / bn
		switch {
		case swiglu && ydt == backend.BF16:
			k = moeGroupWGSwiGLUKernels[boolInt(large)]
			grid[0] = (O/2 + bn/2 - 1) / (bn / 2)
		case swiglu:
			panic("cuda: moe: the SwiGLU tiles write bf16 rows")
		case ydt == backend.BF16:
			k = moeGroupWGBF16Kernels[boolInt(large)]
		}
		b.allowSmem(k.name, smem)
		b.preferSmem(k.name)
		k.run(b, grid, 2*bm, smem, moeGroupWGArgs{y: y, x: x, xdiv: int32(xdiv), w: w.ptr, start: g.start, order: g.order, tiles: g.tiles,
			ntiles: g.ntiles, O: int32(O), I: int32(in)})
		return
	}
	if swiglu || xdiv != 0 || ydt != backend.F32 {
		panic("cuda: moe: the SwiGLU in the tiles, rows read through the order and bf16 rows out are the wgmma tiles'")
	}
	if w.dt.Quantized() {
		k, smem := quantKernelsOf(w.dt).groupMM[boolInt(large)], moeGroupQSmem(bm)
		b.allowSmem(k.name, smem)
		b.preferSmem(k.name)
		k.run(b, grid, 2*bm, smem, qgroupMMArgs{y: y, xg: x, w: w.ptr, rb: int64(w.rb()), estride: int64(O * w.rb()),
			start: g.start, order: g.order, tiles: g.tiles, ntiles: g.ntiles, O: int32(O), I: int32(in)})
		return
	}
	k, smem := moeGroupMMKernels[boolInt(large)], moeGroupSmem(bm)
	b.allowSmem(k.name, smem)
	b.preferSmem(k.name)
	k.run(b, grid, 2*bm, smem, moeGroupMMArgs{y: y, xg: x, w: w.ptr, start: g.start, order: g.order, tiles: g.tiles, ntiles: g.ntiles,
		O: int32(O), I: int32(in)})
}

// groupF8 reports whether the grouped products with w (rows of in) run on
// Hopper's FP8 tensor cores (moe_wg.cu): FP8 weights where the dense FP8
// products quantize their activations too (fp8Min), wgmma (moeWG), whole
// blocks of 128 columns, and the shared memory of its tiles.
func (b *Backend) groupF8(w *tensor, in int) bool {
	return w.dt == backend.FP8 && b.fp8Min > 0 && b.moeWG && in%128 == 0 && moeGroupWGSmem(moeGroupRowsLarge, moeWGOuts) <= b.smemOp
}

// groupWG reports whether the grouped products with bf16 weights w (rows
// of in) run on wgmma (moe_wg.cu): rows of whole 64-column stages, and the
// shared memory of its tiles. On an H200, qnext12's 4K-token prompt (512
// experts, 80 rows an expert) spent half its prefill in these products on
// mma.sync, at 109 TFLOP/s.
func (b *Backend) groupWG(w *tensor, in int) bool {
	return w.dt == backend.BF16 && b.moeWG && in%64 == 0 && moeGroupWGSmem(moeGroupRowsLarge, 2*moeWGOuts) <= b.smemOp
}

// groupF8Product is the grouped product of FP8 experts w (O rows of in
// each) on Hopper's FP8 tensor cores, in tiles of bm rows listed by g: y[r]
// = x[r / xdiv] . w[sel[r]]^T for the R rows r, x's n rows given in e4m3
// with their scales (xq, xs: quantAct's).
func (b *Backend) groupF8Product(y devptr, ydt backend.DType, xq, xs devptr, n, xdiv int, w *tensor, g expertGroups, R, E, bm, O, in int) {
	k, smem := moeGroupF8Kernels[boolInt(bm == moeGroupRowsLarge)], moeGroupWGSmem(bm, moeWGOuts)
	b.allowSmem(k.name, smem)
	k.run(b, [3]int{(O + moeWGOuts - 1) / moeWGOuts, expertTiles(R, E, bm), 1}, 2*bm, smem, moeGroupF8Args{y: y, ydt: int32(ydt), xq: xq, xs: xs,
		T: int32(n), xdiv: int32(xdiv), w: w.ptr, rb: int64(w.rb()), estride: int64(O * w.rb()), start: g.start, order: g.order,
		tiles: g.tiles, ntiles: g.ntiles, O: int32(O), I: int32(in)})
}

// ptrOf is t's address where n > 0, else 0.
func ptrOf(t *tensor, n int) devptr {
	if n == 0 {
		return 0
	}
	return t.ptr
}

// expertGroups is moe_group's listing of rows by expert, in tiles.
type expertGroups struct{ start, order, tiles, ntiles devptr }

// groupRows lists the R rows of sel by expert, in tiles of up to tm rows
// of one expert (moe_group).
func (b *Backend) groupRows(sel devptr, R, E, tm int) expertGroups {
	g := expertGroups{
		start: b.scratchBuf("moe.start", 4*(E+1)), order: b.scratchBuf("moe.order", 4*R),
		tiles: b.scratchBuf("moe.tiles", 8*expertTiles(R, E, tm)), ntiles: b.scratchBuf("moe.ntiles", 4),
	}
	a := moeGroupArgs{sel: sel, R: int32(R), E: int32(E), tm: int32(tm), start: g.start, order: g.order, tiles: g.tiles, ntiles: g.ntiles}
	if R <= moeGroupBlockRows {
		moeGroupKernel.run(b, g1(1), 1024, 0, a)
		return g
	}
	// A prompt's rows: counted and placed by blocks of moeGroupBlockRows,
	// between them one block that lays out the experts.
	nb := (R + moeGroupBlockRows - 1) / moeGroupBlockRows
	a.nb, a.bcnt = int32(nb), b.scratchBuf("moe.bcnt", 4*nb*(E+1))
	moeCountKernel.run(b, g1(nb), moeGroupBlockRows, 0, moeCountArgs{sel: sel, R: int32(R), E: int32(E), bcnt: a.bcnt})
	moeGroupKernel.run(b, g1(1), 1024, 0, a)
	moeScatterKernel.run(b, g1(nb), moeGroupBlockRows, 0, moeScatterArgs{sel: sel, R: int32(R), E: int32(E), bcnt: a.bcnt, order: g.order})
	return g
}

// moeGroupBlockRows is the rows a block of moe_count and moe_scatter
// takes, a thread each.
const moeGroupBlockRows = 1024

// expertGemv is expertRows for bf16 experts at decode: moe_rows streams
// each row's expert (gate/up with the SwiGLU, then down), 16 bytes a load,
// a row a block or (moeRowPairs) up to two rows of one expert, and takes a
// shared expert of the experts' width as T more rows of its own.
func (b *Backend) expertGemv(xt *tensor, sel devptr, K int, gu, down, sgu, sdown *tensor) (y *tensor, ys devptr) {
	T, H := xt.rows(), xt.cols()
	E, I, R := gu.shape[0], down.shape[2], T*K
	pairs := moeRowPairs(R, E)
	S, blocks := 0, R
	var ws [2]devptr
	var g expertGroups
	if pairs {
		g = b.groupRows(sel, R, E, 2)
		blocks = expertTiles(R, E, 2)
	} else if sgu != nil && sgu.dt == backend.BF16 && sdown.dt == backend.BF16 && sgu.rows() == 2*I && sgu.cols() == H && sdown.rows() == H && sdown.cols() == I {
		S, ws = T, [2]devptr{sgu.ptr, sdown.ptr}
		blocks += S
	}
	act := b.scratchF32("moe.act", R+S, I)
	y = b.scratchF32("moe.y", R+S, H)
	k := moeRowsKernels[boolInt(pairs)]
	w := b.gemvWarps
	a := moeRowsArgs{y: act.ptr, x: xt.ptr, xdiv: int32(K), xsh: 0, w: gu.ptr, sel: sel, R: int32(R), ws: ws[0], O: int32(I), I: int32(H),
		start: g.start, order: g.order, tiles: g.tiles, ntiles: g.ntiles}
	k[1].runOverlapped(b, [3]int{(I + w - 1) / w, blocks, 1}, 32*w, 0, a) // an output a warp
	a.y, a.x, a.xdiv, a.xsh, a.w, a.ws, a.O, a.I = y.ptr, act.ptr, 1, int32(R), down.ptr, ws[1], int32(H), int32(I)
	k[0].runOverlapped(b, [3]int{(H + 4*w - 1) / (4 * w), blocks, 1}, 32*w, 0, a) // four outputs a warp
	if S > 0 {
		ys = y.ptr + devptr(4*R*H)
	}
	return y, ys
}

// moeCombineTokenBlocks: from this many tokens a multiprocessor,
// moe_combine takes a block a token.
const moeCombineTokenBlocks = 8

// combine adds to out [T, H] the expert rows y [T*K, H] weighted by wts
// and, where ys is set, the shared expert's rows ys [T, H] weighted by
// sigmoid(x . gate): gs[t] where route made it (else 0).
func (b *Backend) combine(ot, xt, y *tensor, wts devptr, K int, ys devptr, gate *tensor, gs devptr) {
	T, H := xt.rows(), xt.cols()
	if T == 0 {
		return
	}
	a := moeCombineArgs{out: ot.ptr, wts: wts, K: int32(K), H: int32(H), ys: ys, gs: gs}
	if y != nil {
		a.y, a.ydt = y.ptr, int32(y.dt)
	}
	if ys != 0 {
		checkFloatW("shared expert gate", gate)
		if gate.numel() != H {
			panic(fmt.Sprintf("cuda: shared expert gate %v for width %d", gate, H))
		}
		a.x, a.wg, a.wgdt = xt.ptr, gate.ptr, int32(gate.dt)
	}
	// A block a column block at decode; a block a token for prompts, whose
	// blocks then read their rows whole (a block a column block: 0.75 ms
	// for 8K tokens of ten experts' rows of 2048, a quarter of the bytes'
	// rate on an H200).
	ny := (H + 255) / 256
	if T >= moeCombineTokenBlocks*b.sms {
		ny = 1
	}
	moeCombineKernel.runOverlapped(b, [3]int{T, ny, 1}, 256, 0, a)
}

// SharedExpert adds the gated shared expert to out; see backend.Backend.
func (b *Backend) SharedExpert(out, x, gateUp, down, gate backend.Tensor) {
	ot, xt := asT(out), asT(x)
	checkRows("shared expert out", ot, xt.rows(), xt.cols())
	checkF32("shared expert", ot, xt)
	ys := b.sharedExpert(xt, asT(gateUp), asT(down))
	b.combine(ot, xt, nil, 0, 0, ys.ptr, asT(gate), 0)
}

// sharedExpert returns the shared expert's output ys [T, H] (moe_combine
// gates it).
func (b *Backend) sharedExpert(xt, sgu, sdown *tensor) *tensor {
	T, H := xt.rows(), xt.cols()
	Is := sgu.rows() / 2
	if sgu.cols() != H || sgu.rows()%2 != 0 || sdown.rows() != H || sdown.cols() != Is {
		panic(fmt.Sprintf("cuda: shared expert gate_up %v, down %v for width %d", sgu, sdown, H))
	}
	ys := b.scratchF32("moe.so", T, H)
	b.mlp(ys, xt, sgu, sdown, false)
	return ys
}

// MoE runs a MoE block's steps as one operation; see backend.FusedMoE.
// The choices stay in scratch memory, and one moe_combine adds the routed
// experts and the shared one to the residual.
func (b *Backend) MoE(out, x backend.Tensor, e *backend.Experts, spec *backend.MoESpec) {
	ot, xt := asT(out), asT(x)
	T, H, K := xt.rows(), xt.cols(), spec.TopK
	checkRows("moe out", ot, T, H)
	checkF32("moe", ot, xt)
	gu := asT(e.GateUp)
	held := gu.shape[0]
	if len(gu.shape) != 3 || spec.First < 0 || spec.First+held > spec.Experts || held < spec.Experts && spec.First%held != 0 {
		panic(fmt.Sprintf("cuda: moe: gate_up %v from expert %d of %d", gu, spec.First, spec.Experts))
	}
	sel, wts := b.scratchBuf("moe.sel", 4*T*K), b.scratchBuf("moe.wts", 4*T*K)
	var sgu, sdown, gate *tensor
	if e.SharedGateUp != nil {
		sgu, sdown, gate = asT(e.SharedGateUp), asT(e.SharedDown), asT(e.SharedGate)
	}
	gs, xh := b.route(sel, wts, xt, asT(e.Router), spec, held, gate)
	// The down product may add the rows to the residual itself where every
	// expert is this rank's and route made the shared expert's gate (unless
	// b.moeSum is off).
	var sum *moeSum
	if held == spec.Experts && (sgu == nil || gs != 0) && b.moeSum {
		sum = &moeSum{out: ot.ptr, wts: wts, gs: gs, K: int32(K)}
	}
	y, ys, summed := b.expertRows(xt, xh, sel, K, asT(e.GateUp), asT(e.Down), sgu, sdown, sum)
	if summed {
		return
	}
	if sgu != nil && ys == 0 {
		x := xt
		if xh != nil && sgu.dt == backend.BF16 {
			x = xh // route's bf16 x, which the product would make again
		}
		ys = b.sharedExpert(x, sgu, sdown).ptr
	}
	b.combine(ot, xt, y, wts, K, ys, gate, gs)
}
