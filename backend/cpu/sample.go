package cpu

import (
	"cmp"
	"fmt"
	"math"
	mathbits "math/bits"
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
	b.sampled = b.sampled[:0]
	for _, s := range res {
		b.sampled = append(b.sampled, s.Token)
	}
	return res, nil
}

// SampleStart is Sample, done before it returns.
func (b *Backend) SampleStart(logits backend.Tensor, params []backend.SampleParams) (func() ([]backend.Sampled, error), error) {
	res, err := b.Sample(logits, params)
	if err != nil {
		return nil, err
	}
	return func() ([]backend.Sampled, error) { return res, nil }, nil
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
	if p.Mask != nil {
		if len(p.Mask) != backend.MaskWords(V) {
			return fmt.Errorf("token mask of %d words for a vocabulary of %d", len(p.Mask), V)
		}
		if allowedCount(p.Mask, V) == 0 {
			return fmt.Errorf("the token mask allows no token")
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
//  1. penalties: for every token in Counts that occurs in the prompt or
//     with a positive count, a repetition penalty r (unless 0 or 1) divides
//     a positive logit by r and multiplies a non-positive one by r; for
//     every token with a positive count the presence penalty is subtracted
//     once and the frequency penalty count times; then Bias is added, and
//     the tokens Mask excludes get -Inf. The log-probabilities reported are
//     log_softmax of these logits.
//  2. Temperature 0 picks the largest logit (the lowest index among equals).
//  3. Otherwise logits are divided by the temperature, sorted by decreasing
//     value (ties: lower index first) and filtered: top-k keeps the first k;
//     top-p (0 < p < 1) keeps the shortest prefix whose renormalised mass is
//     at least p; min-p drops tokens whose probability is below min-p times
//     the largest. The token is the first whose cumulative probability,
//     renormalised over what is kept, exceeds Uniform.
//
// Out-of-range tokens in Counts or Bias and a mask that allows nothing panic
// (Sample reports them as errors).
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
		n := min(p.TopLogprobs, len(l))
		if p.Mask != nil {
			n = min(n, allowedCount(p.Mask, len(l)))
		}
		if n > 0 {
			idx := make([]int, n)
			topK(l, idx)
			for _, i := range idx {
				res.Top = append(res.Top, backend.TokenLogprob{Token: int32(i), Logprob: float32(float64(l[i]) - lse)})
			}
		}
	}
	return res
}

// penalise returns a copy of logits with penalties, bias and mask applied.
func penalise(logits []float32, p *backend.SampleParams) []float32 {
	l := slices.Clone(logits)
	rp := p.RepetitionPenalty
	for _, c := range p.Counts {
		if c.Count <= 0 && !c.Prompt {
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
		if c.Count > 0 {
			v -= p.PresencePenalty
			v -= p.FrequencyPenalty * float32(c.Count)
		}
		l[c.Token] = v
	}
	for _, b := range p.Bias {
		l[b.Token] += b.Bias
	}
	if p.Mask != nil {
		inf := float32(math.Inf(-1))
		for w, bits := range p.Mask {
			for out := ^bits; out != 0; out &= out - 1 {
				if t := w*64 + mathbits.TrailingZeros64(out); t < len(l) {
					l[t] = inf
				}
			}
		}
	}
	return l
}

// allowedCount is the number of tokens below V that mask allows.
func allowedCount(mask []uint64, V int) int {
	n := 0
	for w, bits := range mask {
		if rest := V - 64*w; rest < 64 {
			bits &= 1<<max(rest, 0) - 1
		}
		n += mathbits.OnesCount64(bits)
	}
	return n
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
// Only as long a prefix of the sorted candidates as the filters and the
// draw need is sorted: usually a few dozen tokens of the vocabulary.
func draw(l []float32, p *backend.SampleParams) int32 {
	inv := 1 / p.Temperature
	type cand struct {
		tok   int32
		logit float32
	}
	// Masked tokens cannot be drawn: they are left out from the start.
	cands := make([]cand, 0, len(l))
	for i, v := range l {
		if backend.Allowed(p.Mask, int32(i)) {
			cands = append(cands, cand{int32(i), v * inv})
		}
	}
	byValue := func(a, b cand) int {
		if c := cmp.Compare(b.logit, a.logit); c != 0 {
			return c
		}
		return cmp.Compare(a.tok, b.tok)
	}
	less := func(a, b cand) bool { return byValue(a, b) < 0 }
	if k := p.TopK; k > 0 && k < len(cands) {
		partialSelect(cands, k, less)
		cands = cands[:k]
	}
	// Probabilities relative to the largest; their total needs no order.
	m := cands[0].logit
	for _, c := range cands {
		m = max(m, c.logit)
	}
	var total float64
	for _, c := range cands {
		total += math.Exp(float64(c.logit - m))
	}
	topP, minP := p.TopP > 0 && p.TopP < 1, p.MinP > 0
	var probs []float64 // of the sorted prefix cands[:len(probs)]
	var cum float64     // of probs, for top-p
	n := -1             // how many candidates the filters keep, once known
	for size := min(64, len(cands)); ; size = min(2*size, len(cands)) {
		sorted := len(probs)
		if size < len(cands) {
			partialSelect(cands[sorted:], size-sorted, less)
		}
		slices.SortFunc(cands[sorted:size], byValue)
		for i := sorted; i < size; i++ {
			probs = append(probs, math.Exp(float64(cands[i].logit-m)))
			if n >= 0 {
				continue
			}
			if minP && i > 0 && probs[i] < float64(p.MinP)*probs[0] {
				n = i
				continue
			}
			cum += probs[i]
			if topP && cum/total >= float64(p.TopP) {
				n = i + 1
			}
		}
		if n < 0 && size == len(cands) {
			n = size
		}
		if n >= 0 {
			var kept float64
			for _, v := range probs[:n] {
				kept += v
			}
			if i, ok := inverseCDF(probs[:n], float64(p.Uniform)*kept); ok {
				return cands[i].tok
			}
			return cands[n-1].tok // rounding left r at the very end
		}
		if !topP && !minP {
			// Everything is kept: the draw resolves once the prefix's mass passes it.
			if i, ok := inverseCDF(probs, float64(p.Uniform)*total); ok {
				return cands[i].tok
			}
		}
	}
}

// inverseCDF returns the first index whose cumulative probability exceeds r.
func inverseCDF(probs []float64, r float64) (int, bool) {
	var cum float64
	for i, v := range probs {
		cum += v
		if cum > r {
			return i, true
		}
	}
	return 0, false
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
