package cpu

import (
	"fmt"
	"math"
	"sort"

	"github.com/kiln-llm/kiln/backend"
)

// Route picks each token's experts; see backend.Backend.
func (b *Backend) Route(experts, weights, x, router backend.Tensor, spec *backend.MoESpec) {
	et, wt, xt := asT(experts), asT(weights), asT(x)
	T, _ := matrix(xt)
	checkShape("route experts", et, T, spec.TopK)
	checkShape("route weights", wt, T, spec.TopK)
	if et.dt != backend.I32 || et.readOnly {
		panic(fmt.Sprintf("cpu: route: experts %v", et))
	}
	b.route(bytesAs[int32](et.buf), wt.out32(), xt, router, spec)
}

// route writes each token's spec.TopK experts and their weights to ids and
// wts ([T, TopK] each).
func (b *Backend) route(ids []int32, wts []float32, xt *Tensor, router backend.Tensor, spec *backend.MoESpec) {
	T, H := matrix(xt)
	E, K := spec.Experts, spec.TopK
	rw := weightsOf(asT(router))
	if E <= 0 || K <= 0 || K > E || rw.rows != E || rw.cols != H {
		panic(fmt.Sprintf("cpu: route: router %v for %+v and width %d", asT(router), *spec, H))
	}
	logits := make([]float32, T*E)
	b.pool.matmul(logits, xt.f32(), T, rw, false)
	idx := make([]int, K)
	for t := range T {
		p := logits[t*E : (t+1)*E]
		softmaxInPlace(p)
		topK(p, idx)
		var sum float32
		for _, ex := range idx {
			sum += p[ex]
		}
		for j, ex := range idx {
			wt := p[ex]
			if spec.NormTopK {
				wt /= sum
			}
			ids[t*K+j], wts[t*K+j] = int32(ex), wt
		}
	}
}

// Experts adds each token's chosen experts to out; see backend.Backend.
func (b *Backend) Experts(out, x, experts, weights, gateUp, down backend.Tensor) {
	et, wt := asT(experts), asT(weights)
	T, K := matrix(et)
	if et.dt != backend.I32 {
		panic(fmt.Sprintf("cpu: experts: expert ids %v", et))
	}
	checkShape("experts weights", wt, T, K)
	b.experts(asT(out), asT(x), bytesAs[int32](et.buf), wt.f32(), K, gateUp, down, 0, false)
}

// experts adds to out, for each token t and choice j < K, wts[t*K+j] times
// expert ids[t*K+j] applied to x, where gateUp and down hold experts first
// to first+E-1: all of them, or (ranged) a rank's range, a choice outside
// which is another rank's. Tokens are grouped by expert so that each
// chosen expert's weights are read once per call.
func (b *Backend) experts(ot, xt *Tensor, ids []int32, wts []float32, K int, gateUp, down backend.Tensor, first int, ranged bool) {
	T, H := matrix(xt)
	if on, oh := matrix(ot); on != T || oh != H || len(ids) != T*K {
		panic(fmt.Sprintf("cpu: experts: out %v, x %v, %d choices of %d", ot, xt, len(ids), K))
	}
	gu, dn := asT(gateUp), asT(down)
	if len(gu.shape) != 3 || len(dn.shape) != 3 {
		panic(fmt.Sprintf("cpu: experts: gate_up %v, down %v", gu, dn))
	}
	E, I := gu.shape[0], gu.shape[1]/2
	checkShape("experts gate_up", gu, E, 2*I, H)
	checkShape("experts down", dn, E, H, I)
	byExpert := make([][]int32, E)
	weightsBy := make([][]float32, E)
	for i, ex := range ids {
		if ex -= int32(first); ex < 0 || int(ex) >= E {
			if !ranged {
				panic(fmt.Sprintf("cpu: experts: expert %d of %d", ex, E))
			}
			continue
		}
		byExpert[ex] = append(byExpert[ex], int32(i/K))
		weightsBy[ex] = append(weightsBy[ex], wts[i])
	}
	// Both hold E matrices stacked along the rows.
	guW, downW := weightsOf(gu), weightsOf(dn)
	guW.rows, guW.cols = E*2*I, H
	downW.rows, downW.cols = E*H, I
	o, xs := ot.out32(), xt.f32()
	// Where the int8 kernels are assembly, every product of these types
	// is matmulQuant's whatever its rows (quantDirectRows), which
	// expertsTogether runs for all the experts at once.
	_, guInt := intDot(gu.dt)
	_, dnInt := intDot(dn.dt)
	if guInt && dnInt && intDotKernels {
		b.expertsTogether(o, xs, H, I, byExpert, weightsBy, guW, downW)
		return
	}
	for ex := range E {
		if len(byExpert[ex]) > 0 {
			b.expert(o, xs, H, byExpert[ex], weightsBy[ex], guW.sub(ex*2*I, 2*I), downW.sub(ex*H, H))
		}
	}
}

// expertsTogether is the loop over expert above, for experts of int8-dot
// types: every chosen expert's rows gathered into one buffer and quantized
// once, and each of the three steps (gate and up, the SwiGLU, down) one
// pool.For over all the experts' rows, where expert by expert the threads
// met three times an expert (a decode step of ten experts: 30 times a MoE
// layer). The products and their order are expert's: the same sums.
func (b *Backend) expertsTogether(out, xs []float32, H, I int, byExpert [][]int32, weightsBy [][]float32, guW, downW weights) {
	R := 0
	for _, toks := range byExpert {
		R += len(toks)
	}
	if len(b.expertBuf) < R*(H+3*I) {
		b.expertBuf = make([]float32, R*(H+3*I))
	}
	// xe holds the rows, then (quantized meanwhile) down's outputs.
	xe, h, act := b.expertBuf[:R*H], b.expertBuf[R*H:R*(H+2*I)], b.expertBuf[R*(H+2*I):R*(H+3*I)]
	r := 0
	for _, toks := range byExpert {
		for _, t := range toks {
			copy(xe[r*H:(r+1)*H], xs[int(t)*H:(int(t)+1)*H])
			r++
		}
	}
	// jobs quantizes x (R rows of k) for w's products and makes a product a
	// chosen expert: of its rows (in byExpert's order) with its matrix of w
	// (width rows a row of the outputs y). An expert's rows take the layout
	// that matmulQuant would give them (pairRows), so that the sums are
	// the same; the rows are quantized to each layout some expert takes.
	var quantized []*q8Rows
	defer func() {
		for _, q := range quantized {
			q8Pool.Put(q)
		}
	}()
	jobs := func(x []float32, k int, y []float32, w weights, width int) []quantJob {
		var std, pairs *q8Rows
		for _, toks := range byExpert {
			switch n := len(toks); {
			case n > 0 && pairRows(w.dt, n, k) && pairs == nil:
				pairs = b.pool.quantizePairs(x, R, k)
				quantized = append(quantized, pairs)
			case n > 0 && !pairRows(w.dt, n, k) && std == nil:
				blk, _ := intDot(w.dt)
				std = quantizeRows(x, R, k, blk)
				quantized = append(quantized, std)
			}
		}
		var js []quantJob
		r := 0
		for ex, toks := range byExpert {
			n := len(toks)
			if n == 0 {
				continue
			}
			q := std
			if pairRows(w.dt, n, k) {
				q = pairs
			}
			sub := *q
			sub.buf = q.buf[r*q.stride:] // the pair kernel reads rows four at a time
			js = append(js, quantJob{out: y[r*width : (r+n)*width], qx: &sub, n: n, w: w.sub(ex*width, width)})
			r += n
		}
		return js
	}
	b.pool.quantJobs(jobs(xe, H, h, guW, 2*I))
	siluMul(b.pool, act, h, R, I)
	b.pool.quantJobs(jobs(act, I, xe, downW, H))
	r = 0
	for ex, toks := range byExpert {
		for i, t := range toks {
			axpy(out[int(t)*H:(int(t)+1)*H], weightsBy[ex][i], xe[r*H:(r+1)*H])
			r++
		}
	}
}

// SharedExpert adds the gated shared expert to out; see backend.Backend.
func (b *Backend) SharedExpert(out, x, gateUp, down, gate backend.Tensor) {
	ot, xt := asT(out), asT(x)
	T, H := matrix(xt)
	sgu, sdown, sg := weightsOf(asT(gateUp)), weightsOf(asT(down)), weightsOf(asT(gate))
	if on, oh := matrix(ot); on != T || oh != H || sgu.cols != H || sgu.rows%2 != 0 || sdown.rows != H || sdown.cols != sgu.rows/2 || sg.rows*sg.cols != H {
		panic(fmt.Sprintf("cpu: shared expert: out %v, x %v, gate_up %v, down %v, gate %v", ot, xt, asT(gateUp), asT(down), asT(gate)))
	}
	sg.rows, sg.cols = 1, H
	gates := make([]float32, T)
	xs := xt.f32()
	b.pool.matmul(gates, xs, T, sg, false)
	tokens := make([]int32, T)
	for t := range T {
		tokens[t] = int32(t)
		gates[t] = sigmoid(gates[t])
	}
	b.expert(ot.out32(), xs, H, tokens, gates, sgu, sdown)
}

// MoE runs Route, Experts and SharedExpert in one call; see
// backend.FusedMoE. The CPU computes the steps as they are: the choices
// stay in host memory of their own.
func (b *Backend) MoE(out, x backend.Tensor, e *backend.Experts, spec *backend.MoESpec) {
	xt := asT(x)
	T, _ := matrix(xt)
	ids, wts := make([]int32, T*spec.TopK), make([]float32, T*spec.TopK)
	b.route(ids, wts, xt, e.Router, spec)
	ranged := asT(e.GateUp).shape[0] < spec.Experts
	b.experts(asT(out), xt, ids, wts, spec.TopK, e.GateUp, e.Down, spec.First, ranged)
	if e.SharedGateUp != nil {
		b.SharedExpert(out, x, e.SharedGateUp, e.SharedDown, e.SharedGate)
	}
}

// expert adds wts[i] * down(silu(gate(x)) * up(x)) for x = xs[tokens[i]] to
// out[tokens[i]].
func (b *Backend) expert(out, xs []float32, H int, tokens []int32, wts []float32, gateUp, down weights) {
	n := len(tokens)
	// Kept for the backend's life, as mlpBuf: a buffer a call (the
	// shared expert's a prompt's rows) was fresh memory each time, its
	// pages faulted in by the copy (6% of a Qwen3-Next prompt's CPU time).
	if len(b.expertBuf) < n*H {
		b.expertBuf = make([]float32, n*H)
	}
	xe := b.expertBuf[:n*H]
	for i, t := range tokens {
		copy(xe[i*H:(i+1)*H], xs[int(t)*H:(int(t)+1)*H])
	}
	b.swiglu(xe, xe, n, gateUp, down, false) // x is read only before out is written
	for i, t := range tokens {
		axpy(out[int(t)*H:(int(t)+1)*H], wts[i], xe[i*H:(i+1)*H])
	}
}

// topK writes to idx the indices of the len(idx) largest values of p in
// decreasing order; equal values keep the lower index first (as torch.topk).
// NaN counts as smallest.
func topK(p []float32, idx []int) {
	k := len(idx)
	greater := func(a, b int) bool { return val(p, a) > val(p, b) } // strictly: ties keep index order
	best := idx[:0]
	for i := range p {
		if len(best) < k || greater(i, best[k-1]) {
			best = insertBest(best, k, i, greater)
		}
	}
}

// insertBest puts x into best, sorted by before and at most k long, where
// it belongs, dropping best's last when full (x must then come before it):
// a step of a top-k in one pass, in which most values do not enter.
func insertBest[E any](best []E, k int, x E, before func(a, b E) bool) []E {
	j := sort.Search(len(best), func(j int) bool { return before(x, best[j]) })
	if len(best) < k {
		best = append(best, x)
	}
	copy(best[j+1:], best[j:])
	best[j] = x
	return best
}

func val(p []float32, i int) float32 {
	v := p[i]
	if math.IsNaN(float64(v)) {
		return float32(math.Inf(-1))
	}
	return v
}
