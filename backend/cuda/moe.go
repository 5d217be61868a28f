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
	moeSplitKernel   = newKernel[moeSplitArgs]("moe_split")
	moeGatherKernel  = newKernel[moeGatherArgs]("moe_gather")
	moeGroupMMKernel = newKernel[moeGroupMMArgs]("moe_group_mm")
	moeCombineKernel = newKernel[moeCombineArgs]("moe_combine")
)

type moeRouteArgs struct {
	logits     devptr
	E, K, norm int32
	sel, wts   devptr
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
	R, E                        int32
	start, order, tiles, ntiles devptr
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
	O, I, e0, e1                          int32
}

type moeCombineArgs struct {
	out, y, wts devptr
	K, H        int32
	ys, gate    devptr
}

// moeGrouped reports whether R (token, choice) rows over E experts take the
// grouped products: from two rows an expert on average, where a tile of
// an expert's rows reads its weights fewer times than a GEMV per row
// (four rows an expert won, 1.25 lost: NOTES.md, "Figures behind the
// code").
func moeGrouped(R, E int) bool { return R >= 2*E }

// The grouped expert products' tile (MG_BM, MG_BN and MG_BK of
// kernels/moe.cu): moeGroupRows rows of one expert by moeGroupOuts outputs,
// moeGroupCols columns a stage.
const (
	moeGroupRows = 64
	moeGroupOuts = 128
	moeGroupCols = 32
)

// Route picks each token's experts; see backend.Backend.
func (b *Backend) Route(experts, weights, x, router backend.Tensor, spec *backend.MoESpec) {
	et, wt, xt := asT(experts), asT(weights), asT(x)
	checkRows("route experts", et, xt.rows(), spec.TopK)
	checkRows("route weights", wt, xt.rows(), spec.TopK)
	if et.dt != backend.I32 {
		panic(fmt.Sprintf("cuda: route: experts %v must be i32", et))
	}
	checkF32("route", wt)
	b.route(et.ptr, wt.ptr, xt, asT(router), spec)
}

// route writes each token's spec.TopK experts and their weights to sel and
// wts ([T, TopK] each).
func (b *Backend) route(sel, wts devptr, xt, router *tensor, spec *backend.MoESpec) {
	T, H := xt.rows(), xt.cols()
	E, K := spec.Experts, spec.TopK
	checkF32("route", xt)
	checkFloatW("moe router", router)
	if E <= 0 || E > 1024 || K <= 0 || K > E || router.rows() != E || router.cols() != H {
		panic(fmt.Sprintf("cuda: route: router %v for %d experts (top %d) of width %d", router, E, K, H))
	}
	if T == 0 {
		return
	}
	// The router product keeps float32's precision (not cuBLASLt's bf16
	// inputs): a rounding-sized change there can flip the choice of
	// experts. Prompts take it on tensor cores as x = hi + lo, two bf16
	// products accumulated in float32 (~16 bits of x, as the grouped
	// expert products); decode steps take the float32 GEMV (NOTES.md,
	// "Figures behind the code").
	logits := b.scratchF32("moe.logits", T, E)
	if b.routerGemm > 0 && T >= b.routerGemm && router.dt == backend.BF16 {
		hi, lo := b.scratchBuf("moe.xhi", 2*T*H), b.scratchBuf("moe.xlo", 2*T*H)
		moeSplitKernel.run(b, g1(b.blocksFor(T*H)), 256, 0, moeSplitArgs{hi: hi, lo: lo, x: xt.ptr, n: int64(T * H)})
		b.gemm(logits.ptr, hi, router.ptr, T, E, H, backend.BF16, backend.F32, false)
		b.gemm(logits.ptr, lo, router.ptr, T, E, H, backend.BF16, backend.F32, true)
	} else {
		moeGemvKernel.run(b, [3]int{(E + 7) / 8, T, 1}, 256, 0, moeGemvArgs{y: logits.ptr, x: xt.ptr, xdiv: 1, w: router.ptr, wdt: int32(router.dt), sel: 0, O: int32(E), I: int32(H)})
	}
	moeRouteKernel.run(b, g1(T), 256, 0, moeRouteArgs{logits: logits.ptr, E: int32(E), K: int32(K), norm: boolInt(spec.NormTopK), sel: sel, wts: wts})
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
	y := b.expertRows(xt, et.ptr, K, asT(gateUp), asT(down))
	if T > 0 {
		moeCombineKernel.run(b, g1(T), 256, 0, moeCombineArgs{out: ot.ptr, y: y.ptr, wts: wt.ptr, K: int32(K), H: int32(H)})
	}
}

// expertRows returns y [T*K, H]: row t*K + j is token t's j-th chosen
// expert (sel) applied to it.
func (b *Backend) expertRows(xt *tensor, sel devptr, K int, gu, down *tensor) *tensor {
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
	y := b.scratchF32("moe.y", R, H)
	if R == 0 {
		return y
	}
	// Each (token, choice) row is a product with its expert's weights: a
	// GEMV per row, or (moeGrouped) tensor-core tiles of one expert's rows,
	// which read an expert's weights once per tile of its rows instead of
	// once per row. Quantized experts take qmv per row (gate/up with the
	// SwiGLU fused), or, grouped, bf16 copies of the experts that have rows
	// (a slab of experts at a time).
	groupable := func(w *tensor) bool { return w.dt == backend.BF16 || w.dt.Quantized() }
	grouped := moeGrouped(R, E) && groupable(gu) && groupable(down) && H%moeGroupCols == 0 && I%moeGroupCols == 0
	if !grouped && (gu.dt.Quantized() && !qmvFits(gu.dt, H) || down.dt.Quantized() && !qmvFits(down.dt, I)) {
		if !groupable(gu) || !groupable(down) || H%moeGroupCols != 0 || I%moeGroupCols != 0 {
			panic(fmt.Sprintf("cuda: moe: experts gate_up %v, down %v: quantized experts need widths that are multiples of %d", gu, down, moeGroupCols))
		}
		grouped = true // FP8 rows that end inside a unit of qmv
	}
	expertProduct := func(y, x devptr, xdiv int, w *tensor, O, in int) {
		moeGemvKernel.run(b, [3]int{(O + 7) / 8, R, 1}, 256, 0, moeGemvArgs{y: y, x: x, xdiv: int32(xdiv), w: w.ptr, wdt: int32(w.dt), sel: sel, O: int32(O), I: int32(in)})
	}
	if grouped {
		maxTiles := (R+moeGroupRows-1)/moeGroupRows + min(E, R)
		start, order := b.scratchBuf("moe.start", 4*(E+1)), b.scratchBuf("moe.order", 4*R)
		tiles, ntiles := b.scratchBuf("moe.tiles", 8*maxTiles), b.scratchBuf("moe.ntiles", 4)
		moeGroupKernel.run(b, g1(1), 1024, 0, moeGroupArgs{sel: sel, R: int32(R), E: int32(E), start: start, order: order, tiles: tiles, ntiles: ntiles})
		expertProduct = func(y, x devptr, xdiv int, w *tensor, O, in int) {
			xg := b.scratchBuf("moe.xg", 4*R*in) // bf16 hi and lo parts
			moeGatherKernel.run(b, g1(R), 256, 0, moeGatherArgs{xg: xg, x: x, xdiv: int32(xdiv), order: order, I: int32(in)})
			grid := [3]int{(O + moeGroupOuts - 1) / moeGroupOuts, maxTiles, 1}
			mm := moeGroupMMArgs{y: y, xg: xg, w: w.ptr, start: start, order: order, tiles: tiles, ntiles: ntiles, O: int32(O), I: int32(in), e0: 0, e1: int32(E)}
			if !w.dt.Quantized() {
				moeGroupMMKernel.run(b, grid, 128, 0, mm)
				return
			}
			per := max(1, min(E, b.qSlab/(O*in)))
			for e0 := 0; e0 < E; e0 += per {
				e1 := min(E, e0+per)
				buf := b.scratchBuf("moe.qdeq", 2*(e1-e0)*O*in)
				b.qdeq(buf, w, e0*O, (e1-e0)*O, in, start, e0, O)
				mm.w, mm.e0, mm.e1 = buf, int32(e0), int32(e1)
				moeGroupMMKernel.run(b, grid, 128, 0, mm)
			}
		}
	}
	var act *tensor // [R, I], f32 or (qmv_swiglu) bf16
	if !grouped && gu.dt.Quantized() {
		act = &tensor{dt: backend.BF16, shape: []int{R, I}, ptr: b.scratchBuf("moe.act", 2*R*I), view: true}
		b.qmv(true, act.ptr, backend.BF16, b.qx(xt), 1, K, gu, 2*I*gu.rb(), sel, R, I, H, false)
	} else {
		h := b.scratchF32("moe.h", R, 2*I)
		expertProduct(h.ptr, xt.ptr, K, gu, 2*I, H)
		act = b.scratchF32("moe.act", R, I)
		b.siluMul(act, h)
	}
	switch {
	case !grouped && down.dt.Quantized():
		b.qmv(false, y.ptr, backend.F32, b.qx(act), 1, 1, down, H*down.rb(), sel, R, H, I, false)
	case act.dt == backend.BF16:
		// Quantized gate/up before float32 or f16 down weights.
		af := b.scratchF32("moe.actf", R, I)
		b.cast(af.ptr, backend.F32, act.ptr, backend.BF16, R*I)
		expertProduct(y.ptr, af.ptr, 1, down, H, I)
	default:
		expertProduct(y.ptr, act.ptr, 1, down, H, I)
	}
	return y
}

// SharedExpert adds the gated shared expert to out; see backend.Backend.
func (b *Backend) SharedExpert(out, x, gateUp, down, gate backend.Tensor) {
	ot, xt := asT(out), asT(x)
	checkRows("shared expert out", ot, xt.rows(), xt.cols())
	checkF32("shared expert", ot)
	ys, g := b.sharedExpert(xt, asT(gateUp), asT(down), asT(gate))
	if xt.rows() > 0 {
		moeCombineKernel.run(b, g1(xt.rows()), 256, 0, moeCombineArgs{out: ot.ptr, H: int32(xt.cols()), ys: ys.ptr, gate: g.ptr})
	}
}

// sharedExpert returns the shared expert's output ys [T, H] and its gate
// logits g [T, 1] (moe_combine takes their sigmoid).
func (b *Backend) sharedExpert(xt, sgu, sdown, sg *tensor) (ys, g *tensor) {
	T, H := xt.rows(), xt.cols()
	Is := sgu.rows() / 2
	if sgu.cols() != H || sgu.rows()%2 != 0 || sdown.rows() != H || sdown.cols() != Is || sg.numel() != H {
		panic(fmt.Sprintf("cuda: shared expert gate_up %v, down %v, gate %v for width %d", sgu, sdown, sg, H))
	}
	g = b.scratchF32("moe.gate", T, 1)
	b.MatMul(g, xt, b.Reshape(sg, 1, H), false)
	ys = b.scratchF32("moe.so", T, H)
	b.mlp(ys, xt, sgu, sdown, false)
	return ys, g
}

// MoE runs a MoE block's steps as one operation; see backend.FusedMoE.
// The choices stay in scratch memory, and one moe_combine adds the routed
// experts and the shared one to the residual.
func (b *Backend) MoE(out, x backend.Tensor, e *backend.Experts, spec *backend.MoESpec) {
	ot, xt := asT(out), asT(x)
	T, H, K := xt.rows(), xt.cols(), spec.TopK
	checkRows("moe out", ot, T, H)
	checkF32("moe", ot, xt)
	if gu := asT(e.GateUp); len(gu.shape) != 3 || gu.shape[0] != spec.Experts {
		panic(fmt.Sprintf("cuda: moe: gate_up %v for %d experts", gu, spec.Experts))
	}
	sel, wts := b.scratchBuf("moe.sel", 4*T*K), b.scratchBuf("moe.wts", 4*T*K)
	b.route(sel, wts, xt, asT(e.Router), spec)
	y := b.expertRows(xt, sel, K, asT(e.GateUp), asT(e.Down))
	a := moeCombineArgs{out: ot.ptr, y: y.ptr, wts: wts, K: int32(K), H: int32(H)}
	if e.SharedGateUp != nil {
		ys, g := b.sharedExpert(xt, asT(e.SharedGateUp), asT(e.SharedDown), asT(e.SharedGate))
		a.ys, a.gate = ys.ptr, g.ptr
	}
	if T > 0 {
		moeCombineKernel.run(b, g1(T), 256, 0, a)
	}
}
