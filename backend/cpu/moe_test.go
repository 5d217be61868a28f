package cpu

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/kiln-llm/kiln/backend"
)

// refSwiGLU returns down(silu(gate(x)) * up(x)) in float64 for gateUp
// [2I, H] and down [H, I].
func refSwiGLU(x, gateUp, down []float64, H, I int) []float64 {
	h := refMatMul(x, gateUp, 1, H, 2*I)
	act := make([]float64, I)
	for i := range I {
		act[i] = silu64(h[i]) * h[I+i]
	}
	return refMatMul(act, down, 1, I, H)
}

func TestMoE(t *testing.T) {
	const T, H, E, I, Is = 9, 24, 8, 12, 20
	for _, c := range []struct {
		topK         int
		norm, shared bool
		dt           backend.DType
	}{
		{2, true, false, backend.BF16},
		{3, false, false, backend.F32},
		{4, true, true, backend.BF16},
		{1, false, true, backend.F16},
	} {
		t.Run(fmt.Sprintf("top%d_norm%v_shared%v_%v", c.topK, c.norm, c.shared, c.dt), func(t *testing.T) {
			b := New(Options{Threads: 2})
			r := newRand(uint64(30 + c.topK))
			xv, init := randVec(r, T*H, 1), randVec(r, T*H, 1)
			router, gu, down := randVec(r, E*H, 0.5), randVec(r, E*2*I*H, 0.3), randVec(r, E*H*I, 0.3)
			e := &backend.Experts{
				Router: loadWeight(t, b, c.dt, router, E, H),
				GateUp: loadWeight(t, b, c.dt, gu, E, 2*I, H),
				Down:   loadWeight(t, b, c.dt, down, E, H, I),
			}
			var sgu, sdown, sgate []float64
			if c.shared {
				sgu, sdown, sgate = randVec(r, 2*Is*H, 0.3), randVec(r, H*Is, 0.3), randVec(r, H, 0.5)
				e.SharedGateUp = loadWeight(t, b, c.dt, sgu, 2*Is, H)
				e.SharedDown = loadWeight(t, b, c.dt, sdown, H, Is)
				e.SharedGate = loadWeight(t, b, c.dt, sgate, 1, H)
			}
			// The fused operation, and its steps one by one.
			x, spec := tensorF32(b, xv, T, H), &backend.MoESpec{Experts: E, TopK: c.topK, NormTopK: c.norm}
			fused, steps := tensorF32(b, init, T, H), tensorF32(b, init, T, H)
			b.MoE(fused, x, e, spec)
			chosen, weights := b.Alloc(backend.I32, T, c.topK), b.Alloc(backend.F32, T, c.topK)
			b.Route(chosen, weights, x, e.Router, spec)
			b.Experts(steps, x, chosen, weights, e.GateUp, e.Down)
			if c.shared {
				b.SharedExpert(steps, x, e.SharedGateUp, e.SharedDown, e.SharedGate)
			}
			ids := bytesAs[int32](asT(chosen).buf)
			var wantIDs []float64
			var wantWeights []float64

			want := make([]float64, T*H)
			for tok := range T {
				x := toF64(toF32(xv[tok*H : (tok+1)*H]))
				o := want[tok*H : (tok+1)*H]
				for i := range o {
					o[i] = float64(float32(init[tok*H+i]))
				}
				logits := refMatMul(x, router, 1, H, E)
				m := slices.Max(logits)
				var sum float64
				p := make([]float64, E)
				for i, l := range logits {
					p[i] = math.Exp(l - m)
					sum += p[i]
				}
				order := make([]int, E)
				for i := range order {
					order[i] = i
				}
				slices.SortStableFunc(order, func(a, b int) int {
					if p[a] > p[b] {
						return -1
					} else if p[a] < p[b] {
						return 1
					}
					return 0
				})
				var topSum float64
				for _, ex := range order[:c.topK] {
					topSum += p[ex] / sum
				}
				for _, ex := range order[:c.topK] {
					wt := p[ex] / sum
					if c.norm {
						wt /= topSum
					}
					wantIDs, wantWeights = append(wantIDs, float64(ex)), append(wantWeights, wt)
					y := refSwiGLU(x, gu[ex*2*I*H:(ex+1)*2*I*H], down[ex*H*I:(ex+1)*H*I], H, I)
					for i := range o {
						o[i] += wt * y[i]
					}
				}
				if c.shared {
					var g float64
					for i := range H {
						g += x[i] * sgate[i]
					}
					y := refSwiGLU(x, sgu, sdown, H, Is)
					for i := range o {
						o[i] += sig64(g) * y[i]
					}
				}
			}
			gotIDs := make([]float32, len(ids))
			for i, ex := range ids {
				gotIDs[i] = float32(ex)
			}
			compare(t, "route: experts", gotIDs, wantIDs, 0)
			compare(t, "route: weights", readF32(t, b, weights), wantWeights, 1e-6)
			compare(t, "moe", readF32(t, b, fused), want, 1e-5)
			compare(t, "moe steps", readF32(t, b, steps), want, 1e-5)
		})
	}
}

func TestTopK(t *testing.T) {
	p := []float32{0.1, 0.5, 0.2, 0.5, float32(math.NaN()), 0.2, 0.7}
	idx := make([]int, 5)
	topK(p, idx)
	if want := []int{6, 1, 3, 2, 5}; !slices.Equal(idx, want) {
		t.Errorf("topK = %v, want %v (ties by lower index)", idx, want)
	}
}

// TestExpertsTogether: experts of int8-dot types go through
// expertsTogether (one pool.For a step over every chosen expert's rows);
// the sums are expert's, expert by expert, to the bit, at decode's few
// rows an expert and at a prompt's, four at a time and one by one.
func TestExpertsTogether(t *testing.T) {
	if !intDotKernels {
		t.Skip("the int8 kernels are not assembly here: experts take the loop")
	}
	const H, E, I, K = 512, 8, 256, 3
	for _, dt := range []backend.DType{backend.Q8_0, backend.Q4_K, backend.Q6_K} {
		for _, T := range []int{1, 2, 11, 40} {
			b := New(Options{Threads: 2})
			r := newRand(uint64(T))
			gu, _, _ := loadQuant(t, b, r, dt, 0.05, E, 2*I, H)
			down, _, _ := loadQuant(t, b, r, backend.Q6_K, 0.05, E, H, I)
			x := tensorF32(b, randVec(r, T*H, 1), T, H)
			ids := make([]int32, T*K)
			wts := make([]float32, T*K)
			for i := range ids {
				ids[i], wts[i] = int32((i*5+i/K)%E), float32(r.Float64())
			}
			init := randVec(r, T*H, 1)
			together, loop := tensorF32(b, init, T, H), tensorF32(b, init, T, H)
			b.experts(asT(together), asT(x), ids, wts, K, gu, down, 0, false)
			// The loop over experts, as experts runs it for other types.
			gt, dn := asT(gu), asT(down)
			guW, downW := weightsOf(gt), weightsOf(dn)
			guW.rows, guW.cols, downW.rows, downW.cols = E*2*I, H, E*H, I
			for ex := range E {
				var toks []int32
				var ws []float32
				for i, id := range ids {
					if int(id) == ex {
						toks, ws = append(toks, int32(i/K)), append(ws, wts[i])
					}
				}
				if len(toks) > 0 {
					b.expert(asT(loop).out32(), asT(x).f32(), H, toks, ws, guW.sub(ex*2*I, 2*I), downW.sub(ex*H, H))
				}
			}
			if got, want := readF32(t, b, together), readF32(t, b, loop); !slices.Equal(got, want) {
				t.Errorf("%v, %d tokens: experts together differ from one by one (max |diff| %.3g)", dt, T, maxAbsDiff(got, want))
			}
		}
	}
}

func maxAbsDiff(a, b []float32) float64 {
	d := 0.0
	for i := range a {
		d = max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}
