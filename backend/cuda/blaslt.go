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
	h     C.cublasLtHandle_t
	ws    devptr
	plans map[ltKey]*ltPlan
}

type ltKey struct {
	m, n, k int
	ldc     int           // elements between out's rows (m unless out is a slice of wider rows)
	wt      backend.DType // A (the weight) and B share this type
	ot      backend.DType // C and D: f32, or wt's type
}

type ltPlan struct {
	desc       C.cublasLtMatmulDesc_t
	la, lb, lc C.cublasLtMatrixLayout_t
	algo       C.cublasLtMatmulHeuristicResult_t
}

func newBlasLt(s stream) (*blasLt, error) {
	if err := loadCublasLt(); err != nil {
		return nil, fmt.Errorf("cuda: no cuBLASLt: %w", err)
	}
	l := &blasLt{plans: map[ltKey]*ltPlan{}}
	if r := C.k_cublasLtCreate(&l.h); r != 0 {
		return nil, fmt.Errorf("cuda: cublasLtCreate failed (%d)", r)
	}
	if err := check("cuMemAlloc", C.k_cuMemAlloc_v2(&l.ws, ltWorkspaceB)); err != nil {
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
	}
	return cudaR32F
}

func ltErr(call string, r C.int) error {
	if r != 0 {
		return fmt.Errorf("cuda: %s failed (cublas status %d)", call, r)
	}
	return nil
}

func (l *blasLt) plan(key ltKey) (*ltPlan, error) {
	if p, ok := l.plans[key]; ok {
		return p, nil
	}
	p := &ltPlan{}
	if err := ltErr("cublasLtMatmulDescCreate", C.k_cublasLtMatmulDescCreate(&p.desc, compute32F, cudaR32F)); err != nil {
		return nil, err
	}
	t := C.int(opT)
	if err := ltErr("cublasLtMatmulDescSetAttribute", C.k_cublasLtMatmulDescSetAttribute(p.desc, descTransA, unsafePtr(&t), 4)); err != nil {
		return nil, err
	}
	// Column-major view of row-major out[n,o] = x[n,i] . w[o,i]^T:
	// D (o x n) = A^T (A = w, i x o) * B (x, i x n).
	wt := ltType(key.wt)
	if err := ltErr("cublasLtMatrixLayoutCreate", C.k_cublasLtMatrixLayoutCreate(&p.la, wt, C.ulonglong(key.k), C.ulonglong(key.m), C.longlong(key.k))); err != nil {
		return nil, err
	}
	if err := ltErr("cublasLtMatrixLayoutCreate", C.k_cublasLtMatrixLayoutCreate(&p.lb, wt, C.ulonglong(key.k), C.ulonglong(key.n), C.longlong(key.k))); err != nil {
		return nil, err
	}
	if err := ltErr("cublasLtMatrixLayoutCreate", C.k_cublasLtMatrixLayoutCreate(&p.lc, ltType(key.ot), C.ulonglong(key.m), C.ulonglong(key.n), C.longlong(key.ldc))); err != nil {
		return nil, err
	}
	var pref C.cublasLtMatmulPreference_t
	if err := ltErr("cublasLtMatmulPreferenceCreate", C.k_cublasLtMatmulPreferenceCreate(&pref)); err != nil {
		return nil, err
	}
	defer C.k_cublasLtMatmulPreferenceDestroy(pref)
	ws := C.size_t(ltWorkspaceB)
	if err := ltErr("cublasLtMatmulPreferenceSetAttribute", C.k_cublasLtMatmulPreferenceSetAttribute(pref, prefMaxWS, unsafePtr(&ws), 8)); err != nil {
		return nil, err
	}
	var got C.int
	if err := ltErr("cublasLtMatmulAlgoGetHeuristic", C.k_cublasLtMatmulAlgoGetHeuristic(l.h, p.desc, p.la, p.lb, p.lc, p.lc, pref, 1, &p.algo, &got)); err != nil {
		return nil, err
	}
	if got == 0 {
		return nil, fmt.Errorf("cuda: cuBLASLt has no algorithm for %+v", key)
	}
	l.plans[key] = p
	return p, nil
}

// matmul computes out[n,m] (+)= x[n,k] . w[m,k]^T with x already in w's
// type and out of type ot, out's rows ldc elements apart.
func (l *blasLt) matmul(s stream, out, x, w devptr, n, m, k, ldc int, wt, ot backend.DType, accumulate bool) error {
	p, err := l.plan(ltKey{m, n, k, ldc, wt, ot})
	if err != nil {
		return err
	}
	beta := C.float(0)
	if accumulate {
		beta = 1
	}
	return ltErr("cublasLtMatmul", C.k_lt_matmul(l.h, p.desc, 1, w, p.la, x, p.lb, beta, out, p.lc, &p.algo, l.ws, ltWorkspaceB, s))
}
