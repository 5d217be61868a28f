package cpu

import (
	"fmt"
	"math"

	"github.com/kiln-llm/kiln/backend"
)

// MoE adds to out the mixture of experts applied to x; see backend.Backend.
// Tokens are grouped by expert so that each chosen expert's weights are read
// once per call.
func (b *Backend) MoE(out, x backend.Tensor, e *backend.Experts, spec *backend.MoESpec) {
	ot, xt := asT(out), asT(x)
	T, H := matrix(xt)
	if on, oh := matrix(ot); on != T || oh != H {
		panic(fmt.Sprintf("cpu: moe out %v, x %v", ot, xt))
	}
	E, K := spec.Experts, spec.TopK
	if E <= 0 || K <= 0 || K > E {
		panic(fmt.Sprintf("cpu: moe: invalid spec %+v", *spec))
	}
	router := weightsOf(asT(e.Router))
	gu, down := asT(e.GateUp), asT(e.Down)
	if router.rows != E || router.cols != H || len(gu.shape) != 3 || len(down.shape) != 3 {
		panic(fmt.Sprintf("cpu: moe: router %v, gate_up %v, down %v for %d experts of width %d", asT(e.Router), gu, down, E, H))
	}
	I := gu.shape[1] / 2
	checkShape("moe gate_up", gu, E, 2*I, H)
	checkShape("moe down", down, E, H, I)
	xs, o := xt.f32(), ot.out32()

	logits := make([]float32, T*E)
	b.pool.matmul(logits, xs, T, router, false)
	// Route: per expert, the tokens that chose it and their weights.
	byExpert := make([][]int32, E)
	weightsBy := make([][]float32, E)
	idx := make([]int, K)
	for t := range T {
		p := logits[t*E : (t+1)*E]
		softmaxInPlace(p)
		topK(p, idx)
		var sum float32
		for _, ex := range idx {
			sum += p[ex]
		}
		for _, ex := range idx {
			wt := p[ex]
			if spec.NormTopK {
				wt /= sum
			}
			byExpert[ex] = append(byExpert[ex], int32(t))
			weightsBy[ex] = append(weightsBy[ex], wt)
		}
	}
	// Both hold E matrices stacked along the rows.
	guW, downW := weightsOf(gu), weightsOf(down)
	guW.rows, guW.cols = E*2*I, H
	downW.rows, downW.cols = E*H, I
	for ex := range E {
		if len(byExpert[ex]) == 0 {
			continue
		}
		b.expert(o, xs, H, byExpert[ex], weightsBy[ex], guW.sub(ex*2*I, 2*I), downW.sub(ex*H, H))
	}

	if e.SharedGateUp == nil {
		return
	}
	sgu, sdown, sg := weightsOf(asT(e.SharedGateUp)), weightsOf(asT(e.SharedDown)), weightsOf(asT(e.SharedGate))
	if sgu.cols != H || sgu.rows%2 != 0 || sdown.rows != H || sdown.cols != sgu.rows/2 || sg.rows*sg.cols != H {
		panic(fmt.Sprintf("cpu: moe: shared expert gate_up %v, down %v, gate %v for width %d", asT(e.SharedGateUp), asT(e.SharedDown), asT(e.SharedGate), H))
	}
	sg.rows, sg.cols = 1, H
	gates := make([]float32, T)
	b.pool.matmul(gates, xs, T, sg, false)
	tokens := make([]int32, T)
	for t := range T {
		tokens[t] = int32(t)
		gates[t] = sigmoid(gates[t])
	}
	b.expert(o, xs, H, tokens, gates, sgu, sdown)
}

// expert adds wts[i] * down(silu(gate(x)) * up(x)) for x = xs[tokens[i]] to
// out[tokens[i]].
func (b *Backend) expert(out, xs []float32, H int, tokens []int32, wts []float32, gateUp, down weights) {
	n := len(tokens)
	xe := make([]float32, n*H)
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
	n := 0
	for i, v := range p {
		if math.IsNaN(float64(v)) {
			v = float32(math.Inf(-1))
		}
		// Insertion into the sorted prefix: strictly greater moves ahead, so ties keep index order.
		if n == k && !(v > val(p, idx[k-1])) {
			continue
		}
		j := min(n, k-1)
		for j > 0 && v > val(p, idx[j-1]) {
			idx[j] = idx[j-1]
			j--
		}
		idx[j] = i
		if n < k {
			n++
		}
	}
}

func val(p []float32, i int) float32 {
	v := p[i]
	if math.IsNaN(float64(v)) {
		return float32(math.Inf(-1))
	}
	return v
}
