//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"

	"github.com/kiln-llm/kiln/backend"
)

// cuBLASLt constants (cublasLt.h, library_types.h).
const (
	cudaR32F     = 0
	cudaR16F     = 2
	cudaR16BF    = 14
	compute32F   = 68
	descTransA   = 3
	descTransB   = 4
	prefMaxWS    = 1
	opT          = 1
	ltWorkspaceB = 32 << 20
)

// blasLt runs the compute-bound products through cuBLASLt, with one plan
// (descriptors and the heuristic's algorithm) cached per shape.
type blasLt struct {
	ctx   C.CUcontext
	h     C.cublasLtHandle_t
	ws    devptr
	plans map[ltKey]*ltPlan
	// fp8Tile is the tile (cublasLt.h's cublasLtMatmulTile_t) of the
	// block-scaled FP8 products of a decode step (KILN_CUDA_FP8_TILE; 0:
	// the heuristic's).
	fp8Tile int
}

type ltKey struct {
	m, n, k int
	ldc     int           // elements between out's rows (m unless out is a slice of wider rows)
	lda     int           // elements between the weight's rows (k, or FP8 rows' bytes: fp8.go)
	wt      backend.DType // A (the weight) and B share this type
	ot      backend.DType // C and D: f32, or wt's type
}

type ltPlan struct {
	desc       C.cublasLtMatmulDesc_t
	la, lb, lc C.cublasLtMatrixLayout_t
	algo       C.cublasLtMatmulHeuristicResult_t
}

func newBlasLt(ctx C.CUcontext, s stream) (*blasLt, error) {
	if err := loadCublasLt(); err != nil {
		return nil, fmt.Errorf("cuda: no cuBLASLt: %w", err)
	}
	l := &blasLt{ctx: ctx, plans: map[ltKey]*ltPlan{}, fp8Tile: envInt("KILN_CUDA_FP8_TILE", tile128x64, 0, 1<<20)}
	if r := C.k_cublasLtCreate(l.ctx, &l.h); r != 0 {
		return nil, fmt.Errorf("cuda: cublasLtCreate failed (%d)", r)
	}
	if err := check("cuMemAlloc", C.k_cuMemAlloc_v2(l.ctx, &l.ws, ltWorkspaceB)); err != nil {
		return nil, err
	}
	return l, nil
}

func ltType(dt backend.DType) C.int {
	switch dt {
	case backend.BF16:
		return cudaR16BF
	case backend.F16:
		return cudaR16F
	case backend.FP8:
		return cudaR8FE4M3
	}
	return cudaR32F
}

func ltErr(call string, r C.int) error {
	if r != 0 {
		return fmt.Errorf("cuda: %s failed (cublas status %d)", call, r)
	}
	return nil
}

// plan returns the cached plan of key, made on first use; setup sets the
// descriptor's attributes beyond the transposes before the heuristic sees
// it (block scaling wants its modes and scale pointers).
//
// The algorithm is the heuristic's for the bucket of key.n (ltBucket),
// checked on key's exact shape: cuBLASLt picks kernels whose tile fits the
// token count (nvjet_..._64x88 for 88 tokens), each loaded on its first
// launch, so that every follow-up turn of a new length paid 3-6 ms of
// loading and heuristics a product before its first token (H200 timeline,
// docs/performance.md). A bucket's kernel covers its smaller counts.
func (l *blasLt) plan(key ltKey, setup func(C.cublasLtMatmulDesc_t) error) (*ltPlan, error) {
	if p, ok := l.plans[key]; ok {
		return p, nil
	}
	p := &ltPlan{}
	if err := ltErr("cublasLtMatmulDescCreate", C.k_cublasLtMatmulDescCreate(l.ctx, &p.desc, compute32F, cudaR32F)); err != nil {
		return nil, err
	}
	t := C.int(opT)
	if err := ltErr("cublasLtMatmulDescSetAttribute", C.k_cublasLtMatmulDescSetAttribute(l.ctx, p.desc, descTransA, unsafePtr(&t), 4)); err != nil {
		return nil, err
	}
	// Column-major view of row-major out[n,o] = x[n,i] . w[o,i]^T:
	// D (o x n) = A^T (A = w, i x o) * B (x, i x n).
	wt := ltType(key.wt)
	if setup != nil {
		if err := setup(p.desc); err != nil {
			return nil, err
		}
	}
	if err := ltErr("cublasLtMatrixLayoutCreate", C.k_cublasLtMatrixLayoutCreate(l.ctx, &p.la, wt, C.ulonglong(key.k), C.ulonglong(key.m), C.longlong(key.lda))); err != nil {
		return nil, err
	}
	if err := ltErr("cublasLtMatrixLayoutCreate", C.k_cublasLtMatrixLayoutCreate(l.ctx, &p.lb, wt, C.ulonglong(key.k), C.ulonglong(key.n), C.longlong(key.k))); err != nil {
		return nil, err
	}
	if err := ltErr("cublasLtMatrixLayoutCreate", C.k_cublasLtMatrixLayoutCreate(l.ctx, &p.lc, ltType(key.ot), C.ulonglong(key.m), C.ulonglong(key.n), C.longlong(key.ldc))); err != nil {
		return nil, err
	}
	if nb := ltBucket(key.n); nb != key.n {
		bk := key
		bk.n = nb
		if q, err := l.plan(bk, setup); err == nil {
			var r C.cublasLtMatmulHeuristicResult_t
			if C.k_cublasLtMatmulAlgoCheck(l.ctx, l.h, p.desc, p.la, p.lb, p.lc, p.lc, &q.algo.algo, &r) == 0 && r.workspaceSize <= ltWorkspaceB {
				p.algo = q.algo
				l.plans[key] = p
				return p, nil
			}
		}
	}
	var pref C.cublasLtMatmulPreference_t
	if err := ltErr("cublasLtMatmulPreferenceCreate", C.k_cublasLtMatmulPreferenceCreate(l.ctx, &pref)); err != nil {
		return nil, err
	}
	defer C.k_cublasLtMatmulPreferenceDestroy(l.ctx, pref)
	ws := C.size_t(ltWorkspaceB)
	if err := ltErr("cublasLtMatmulPreferenceSetAttribute", C.k_cublasLtMatmulPreferenceSetAttribute(l.ctx, pref, prefMaxWS, unsafePtr(&ws), 8)); err != nil {
		return nil, err
	}
	var got C.int
	if err := ltErr("cublasLtMatmulAlgoGetHeuristic", C.k_cublasLtMatmulAlgoGetHeuristic(l.ctx, l.h, p.desc, p.la, p.lb, p.lc, p.lc, pref, 1, &p.algo, &got)); err != nil {
		return nil, err
	}
	if got == 0 {
		return nil, fmt.Errorf("cuda: cuBLASLt has no algorithm for %+v", key)
	}
	if key.wt == backend.FP8 && key.n <= fp8TileTokens && l.fp8Tile > 0 {
		l.setTile(p, l.fp8Tile)
	}
	l.plans[key] = p
	return p, nil
}

// The block-scaled FP8 GEMM of a decode step (up to fp8TileTokens tokens)
// runs on tiles of 128 outputs by 64 tokens. cuBLASLt's heuristic gives
// it 128 x 128 tiles, which pad 16 tokens to 128, and its FP8 tensor cores
// then do eight times the step's products: at 4096 outputs that is 32
// blocks, each bound by its multiplications (o_proj: 14.3 us for 3.9 us
// of weight bytes). Of the tiles cuBLASLt offers the algorithm, 128 x 8 to
// 128 x 48, 64 x 16, 64 x 32, 256 x 16 and 256 x 32 are refused; 128 x 64
// ran Qwen3-8B FP8's decode at 4 to 16 tokens +11-14% and at 64 +6-7%,
// 64 x 64 +4-5% (H200, docs/performance.md). Splitting K in two on top
// gained nothing.
const (
	tile128x64    = 18 // CUBLASLT_MATMUL_TILE_128x64
	fp8TileTokens = 64
	algoTile      = 1 // CUBLASLT_ALGO_CONFIG_TILE_ID
)

// setTile sets tile on p's algorithm where cuBLASLt accepts it for p's
// shape, and otherwise leaves the heuristic's.
func (l *blasLt) setTile(p *ltPlan, tile int) {
	a := p.algo.algo
	t := uint32(tile)
	if C.k_cublasLtMatmulAlgoConfigSetAttribute(l.ctx, &a, algoTile, unsafePtr(&t), 4) != 0 {
		return
	}
	var r C.cublasLtMatmulHeuristicResult_t
	if C.k_cublasLtMatmulAlgoCheck(l.ctx, l.h, p.desc, p.la, p.lb, p.lc, p.lc, &a, &r) != 0 || r.workspaceSize > ltWorkspaceB {
		return
	}
	p.algo.algo, p.algo.workspaceSize = a, r.workspaceSize
}

// tileOf returns the tile of p's algorithm.
func (l *blasLt) tileOf(p *ltPlan) int {
	var t uint32
	var n C.size_t
	C.k_cublasLtMatmulAlgoConfigGetAttribute(l.ctx, &p.algo.algo, algoTile, unsafePtr(&t), 4, &n)
	return int(t)
}

// ltBucket is the token count whose algorithm a product of n tokens runs:
// n itself up to 16 (decode batches, each captured in a graph), then the
// next multiple of 32 up to 256 (follow-up turns, short prompts) and of
// 128 beyond (prompt chunks).
func ltBucket(n int) int {
	switch {
	case n <= 16:
		return n
	case n <= 256:
		return (n + 31) / 32 * 32
	}
	return (n + 127) / 128 * 128
}

// matmul computes out[n,m] (+)= x[n,k] . w[m,k]^T with x already in w's
// type and out of type ot, out's rows ldc elements apart.
func (l *blasLt) matmul(s stream, out, x, w devptr, n, m, k, ldc int, wt, ot backend.DType, accumulate bool) error {
	p, err := l.plan(ltKey{m, n, k, ldc, k, wt, ot}, nil)
	if err != nil {
		return err
	}
	beta := C.float(0)
	if accumulate {
		beta = 1
	}
	return ltErr("cublasLtMatmul", C.k_lt_matmul(l.ctx, l.h, p.desc, 1, w, p.la, x, p.lb, beta, out, p.lc, &p.algo, l.ws, ltWorkspaceB, s))
}

// fp8matmul computes out[n,m] (+)= x[n,k] . w[m,k]^T with w FP8 rows of
// lda bytes whose 128x128 tiles scale by ws (fp8TileStride layout) and x
// e4m3 rows whose 1x128 blocks scale by xs ([ceil(k/128)][n]); n is a
// multiple of four; out is f32 or bf16.
func (l *blasLt) fp8matmul(s stream, out, x, xs, w, ws devptr, n, m, k, lda int, ot backend.DType, accumulate bool) error {
	// Block-scaled FP8: the weight's 128x128 tiles, the activations' 1x128
	// blocks; the scale pointers change with the weight.
	scales := func(d C.cublasLtMatmulDesc_t) error {
		for _, a := range [][2]C.int{{descAScaleMode, scaleBlk128}, {descBScaleMode, scaleVec128}} {
			v := a[1]
			if err := ltErr("cublasLtMatmulDescSetAttribute", C.k_cublasLtMatmulDescSetAttribute(l.ctx, d, a[0], unsafePtr(&v), 4)); err != nil {
				return err
			}
		}
		for _, a := range []struct {
			attr C.int
			ptr  devptr
		}{{descAScalePtr, ws}, {descBScalePtr, xs}} {
			v := a.ptr
			if err := ltErr("cublasLtMatmulDescSetAttribute", C.k_cublasLtMatmulDescSetAttribute(l.ctx, d, a.attr, unsafePtr(&v), 8)); err != nil {
				return err
			}
		}
		return nil
	}
	key := ltKey{m, n, k, m, lda, backend.FP8, ot}
	p, ok := l.plans[key]
	if !ok {
		var err error
		if p, err = l.plan(key, scales); err != nil {
			return err
		}
	} else if err := scales(p.desc); err != nil {
		return err
	}
	beta := C.float(0)
	if accumulate {
		beta = 1
	}
	return ltErr("cublasLtMatmul", C.k_lt_matmul(l.ctx, l.h, p.desc, 1, w, p.la, x, p.lb, beta, out, p.lc, &p.algo, l.ws, ltWorkspaceB, s))
}
