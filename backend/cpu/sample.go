package cpu

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/kiln-llm/kiln/backend"
)

// Sample draws one token per row of logits [R, V].
func (b *Backend) Sample(logits backend.Tensor, params []backend.SampleParams) ([]backend.Sampled, error) {
	lt := asT(logits)
	R, V := matrix(lt)
	if len(params) != R {
		return nil, fmt.Errorf("cpu: sample: %d rows of logits, %d params", R, len(params))
	}
	for i := range params {
		if err := checkSampleParams(&params[i], V); err != nil {
			return nil, fmt.Errorf("cpu: sample row %d: %w", i, err)
		}
	}
	l := lt.f32()
	res := make([]backend.Sampled, R)
	b.pool.For(R, 1, func(lo, hi int) {
		for r := lo; r < hi; r++ {
			res[r] = SampleRow(l[r*V:(r+1)*V], &params[r])
		}
	})
	return res, nil
}

func checkSampleParams(p *backend.SampleParams, V int) error {
	for _, c := range p.Counts {
		if c.Token < 0 || int(c.Token) >= V {
			return fmt.Errorf("penalty token %d outside vocabulary of %d", c.Token, V)
		}
	}
	for _, c := range p.Bias {
		if c.Token < 0 || int(c.Token) >= V {
			return fmt.Errorf("bias token %d outside vocabulary of %d", c.Token, V)
		}
	}
	if p.Temperature < 0 || p.TopK < 0 || p.TopP < 0 || p.TopP > 1 || p.MinP < 0 || p.MinP > 1 || p.RepetitionPenalty < 0 || p.TopLogprobs < 0 {
		return fmt.Errorf("invalid parameters %+v", *p)
	}
	return nil
}

// SampleRow is the reference sampler: it draws one token from a row of
// logits following backend.SampleParams exactly, in this order:
//
//  1. penalties, for every token in Counts with a positive count: a
//     repetition penalty r (unless 0 or 1) divides a positive logit by r and
//     multiplies a non-positive one by r; the presence penalty is subtracted
//     once and the frequency penalty count times; then Bias is added. The
//     log-probabilities reported are log_softmax of these logits.
//  2. Temperature 0 picks the largest logit (the lowest index among equals).
//  3. Otherwise logits are divided by the temperature, sorted by decreasing
//     value (ties: lower index first) and filtered: top-k keeps the first k;
//     top-p (0 < p < 1) keeps the shortest prefix whose renormalised mass is
//     at least p; min-p drops tokens whose probability is below min-p times
//     the largest. The token is the first whose cumulative probability,
//     renormalised over what is kept, exceeds Uniform.
//
// Out-of-range tokens in Counts or Bias panic (Sample reports them as errors).
func SampleRow(logits []float32, p *backend.SampleParams) backend.Sampled {
	l := penalise(logits, p)
	var tok int32
	if p.Temperature <= 0 {
		tok = int32(argmax(l))
	} else {
		tok = draw(l, p)
	}
	res := backend.Sampled{Token: tok}
	if p.Logprob || p.TopLogprobs > 0 {
		lse := logSumExp(l)
		res.Logprob = float32(float64(l[tok]) - lse)
		if n := min(p.TopLogprobs, len(l)); n > 0 {
			idx := make([]int, n)
			topK(l, idx)
			for _, i := range idx {
				res.Top = append(res.Top, backend.TokenLogprob{Token: int32(i), Logprob: float32(float64(l[i]) - lse)})
			}
		}
	}
	return res
}

// penalise returns a copy of logits with penalties and bias applied.
func penalise(logits []float32, p *backend.SampleParams) []float32 {
	l := slices.Clone(logits)
	rp := p.RepetitionPenalty
	for _, c := range p.Counts {
		if c.Count <= 0 {
			continue
		}
		v := l[c.Token]
		if rp != 0 && rp != 1 {
			if v > 0 {
				v /= rp
			} else {
				v *= rp
			}
		}
		v -= p.PresencePenalty
		v -= p.FrequencyPenalty * float32(c.Count)
		l[c.Token] = v
	}
	for _, b := range p.Bias {
		l[b.Token] += b.Bias
	}
	return l
}

// argmax returns the index of the largest value, the lowest among equals.
func argmax(l []float32) int {
	best := 0
	for i, v := range l {
		if v > l[best] {
			best = i
		}
	}
	return best
}

func logSumExp(l []float32) float64 {
	m := float64(l[argmax(l)])
	if math.IsInf(m, 0) {
		return m
	}
	var s float64
	for _, v := range l {
		s += math.Exp(float64(v) - m)
	}
	return m + math.Log(s)
}

// draw samples from the penalised logits l with temperature and filters.
func draw(l []float32, p *backend.SampleParams) int32 {
	inv := 1 / p.Temperature
	type cand struct {
		tok   int32
		logit float32
	}
	cands := make([]cand, len(l))
	for i, v := range l {
		cands[i] = cand{int32(i), v * inv}
	}
	byValue := func(a, b cand) int {
		if c := cmp.Compare(b.logit, a.logit); c != 0 {
			return c
		}
		return cmp.Compare(a.tok, b.tok)
	}
	if k := p.TopK; k > 0 && k < len(cands) {
		// Only the k best need ordering.
		partialSelect(cands, k, func(a, b cand) bool { return byValue(a, b) < 0 })
		cands = cands[:k]
	}
	slices.SortFunc(cands, byValue)
	probs := make([]float64, len(cands))
	m := float64(cands[0].logit)
	var total float64
	for i, c := range cands {
		probs[i] = math.Exp(float64(c.logit) - m)
		total += probs[i]
	}
	n := len(cands)
	if p.TopP > 0 && p.TopP < 1 {
		var cum float64
		for i := range n {
			cum += probs[i]
			if cum/total >= float64(p.TopP) {
				n = i + 1
				break
			}
		}
	}
	if p.MinP > 0 {
		thr := float64(p.MinP) * probs[0]
		for i := 1; i < n; i++ {
			if probs[i] < thr {
				n = i
				break
			}
		}
	}
	total = 0
	for _, v := range probs[:n] {
		total += v
	}
	r := float64(p.Uniform) * total
	var cum float64
	for i, v := range probs[:n] {
		cum += v
		if cum > r {
			return cands[i].tok
		}
	}
	return cands[n-1].tok
}

// partialSelect reorders s so that its first k elements are the k least
// under less (in no particular order), by quickselect.
func partialSelect[E any](s []E, k int, less func(a, b E) bool) {
	lo, hi := 0, len(s)
	for hi-lo > 1 {
		// Median of three as pivot, moved to hi-1.
		mid := lo + (hi-lo)/2
		if less(s[mid], s[lo]) {
			s[mid], s[lo] = s[lo], s[mid]
		}
		if less(s[hi-1], s[lo]) {
			s[hi-1], s[lo] = s[lo], s[hi-1]
		}
		if less(s[mid], s[hi-1]) {
			s[mid], s[hi-1] = s[hi-1], s[mid]
		}
		pivot := s[hi-1]
		st := lo
		for i := lo; i < hi-1; i++ {
			if less(s[i], pivot) {
				s[i], s[st] = s[st], s[i]
				st++
			}
		}
		s[st], s[hi-1] = s[hi-1], s[st]
		switch {
		case st == k || st == k-1:
			return
		case st < k:
			lo = st + 1
		default:
			hi = st
		}
	}
}
