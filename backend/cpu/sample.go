package cpu

import (
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

// penalise returns a copy of logits with penalties, bias and mask applied,
// or logits itself when there are none.
func penalise(logits []float32, p *backend.SampleParams) []float32 {
	if len(p.Counts) == 0 && len(p.Bias) == 0 && p.Mask == nil {
		return logits
	}
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
// The filters keep a prefix of the candidates in decreasing order (top-k
// the first k, top-p the shortest whose mass reaches p of the total, min-p
// those at least min-p times the largest), and the token is the first of
// that prefix whose cumulative mass passes Uniform of the prefix's. A
// top-k up to topKDirect is taken in one pass (topCands); without top-k
// the 256 largest tokens are tried first (drawTop). Otherwise each is
// found by selecting on mass (massSelect), in time linear in the
// vocabulary, without sorting it: a flat row whose top-p prefix holds most
// of the vocabulary costs no more than a peaked one.
func draw(l []float32, p *backend.SampleParams) int32 {
	inv := 1 / p.Temperature
	if p.TopK <= 0 {
		if tok, ok := drawTop(l, p, inv); ok {
			return tok
		}
	}
	// Masked tokens cannot be drawn: they are left out from the start.
	var cands []cand
	if k := p.TopK; k > 0 && k <= topKDirect {
		cands = topCands(l, p.Mask, inv, k)
	} else {
		cands = make([]cand, 0, len(l))
		for i, v := range l {
			if backend.Allowed(p.Mask, int32(i)) {
				cands = append(cands, cand{tok: int32(i), logit: v * inv})
			}
		}
		if k > 0 && k < len(cands) {
			partialSelect(cands, k, cand.before)
			cands = cands[:k]
		}
	}
	// Probabilities relative to the largest (1 for it).
	m := cands[0].logit
	for _, c := range cands {
		m = max(m, c.logit)
	}
	var total float64
	for i := range cands {
		cands[i].prob = math.Exp(float64(cands[i].logit - m))
		total += cands[i].prob
	}
	n := len(cands)
	if p.MinP > 0 {
		keep := 0
		for _, c := range cands {
			if c.prob >= float64(p.MinP) {
				keep++
			}
		}
		n = max(keep, 1)
	}
	if p.TopP > 0 && p.TopP < 1 {
		if j := massSelect(cands, func(cum float64) bool { return cum/total >= float64(p.TopP) }); j >= 0 && j+1 < n {
			n = j + 1 // cands[:n] is the prefix already
		} else if n < len(cands) {
			partialSelect(cands, n, cand.before)
		}
	} else if n < len(cands) {
		partialSelect(cands, n, cand.before)
	}
	kept := cands[:n]
	var mass float64
	for _, c := range kept {
		mass += c.prob
	}
	r := float64(p.Uniform) * mass
	if j := massSelect(kept, func(cum float64) bool { return cum > r }); j >= 0 {
		return kept[j].tok
	}
	// Rounding left r at the very end: the prefix's last token.
	last := kept[0]
	for _, c := range kept[1:] {
		if last.before(c) {
			last = c
		}
	}
	return last.tok
}

// topKDirect is the largest top-k that topCands takes in one pass over the
// row; a larger one selects among every allowed token.
const topKDirect = 256

// topCands returns the first k of the allowed tokens of l in candidate
// order (fewer when fewer are allowed), sorted: one pass over the row,
// keeping the best k so far, which most tokens do not enter (top-k 20 or
// 40, as chat requests ask, costs a comparison a token).
func topCands(l []float32, mask []uint64, inv float32, k int) []cand {
	top := make([]cand, 0, k)
	for i, v := range l {
		c := cand{tok: int32(i), logit: v * inv}
		if (len(top) < k || c.before(top[k-1])) && backend.Allowed(mask, int32(i)) {
			top = insertBest(top, k, c, cand.before)
		}
	}
	return top
}

// drawTop is draw without top-k, among the row's topKDirect largest
// tokens: it reports false when what the filters keep, or the draw, lies
// past them. A row of a trained model usually holds most of its mass
// there, so that temperature alone, top-p or min-p cost two passes over
// the row (the largest tokens, the total mass) instead of a selection
// among all of its tokens; on a flat row the second pass stops as soon as
// its running total shows that they do not.
func drawTop(l []float32, p *backend.SampleParams, inv float32) (int32, bool) {
	top := topCands(l, p.Mask, inv, topKDirect)
	m := top[0].logit
	if math.IsInf(float64(m), -1) {
		return 0, false // no token weighs anything: draw's rules decide
	}
	prob := func(c cand) float64 { return math.Exp(float64(c.logit - m)) }
	cum := make([]float64, len(top))
	var c float64
	for j, x := range top {
		c += prob(x)
		cum[j] = c
	}
	// n: the kept tokens are top[:n] when known; top holds every allowed
	// token when it holds fewer than it could.
	n, known := len(top), len(top) < topKDirect
	if p.MinP > 0 {
		keep := 0
		for keep < len(top) && prob(top[keep]) >= float64(p.MinP) {
			keep++
		}
		if keep < len(top) || known {
			n, known = max(keep, 1), true
		}
	}
	topP := p.TopP > 0 && p.TopP < 1
	// The total mass past which the answer is certainly not among top.
	bound := math.Inf(1)
	switch {
	case known:
	case topP:
		bound = cum[len(top)-1] / float64(p.TopP)
	case p.MinP > 0:
		return 0, false
	default:
		bound = cum[len(top)-1] / float64(p.Uniform)
	}
	var total float64
	for i0 := 0; i0 < len(l); i0 += 4096 {
		for i, v := range l[i0:min(i0+4096, len(l))] {
			if backend.Allowed(p.Mask, int32(i0+i)) {
				total += math.Exp(float64(v*inv - m))
			}
		}
		if total >= bound {
			return 0, false
		}
	}
	if topP {
		j := 0
		for j < len(top) && cum[j]/total < float64(p.TopP) {
			j++
		}
		if j < len(top) {
			n, known = min(n, j+1), true
		}
	}
	mass := total // temperature alone: the whole row's
	if known {
		mass = cum[n-1]
	} else if topP || p.MinP > 0 {
		return 0, false
	}
	r := float64(p.Uniform) * mass
	for j := range n {
		if cum[j] > r {
			return top[j].tok, true
		}
	}
	// Rounding left r at the very end of a known prefix: its last token.
	return top[n-1].tok, known
}

// cand is a token drawn among, its logit over the temperature and its
// probability relative to the largest.
type cand struct {
	tok   int32
	logit float32
	prob  float64
}

// before orders candidates by decreasing logit, then increasing token.
func (a cand) before(b cand) bool {
	return a.logit > b.logit || a.logit == b.logit && a.tok < b.tok
}

// massSelect finds the first candidate, in decreasing order, at which the
// mass of it and those before it is past: it reorders c so that those
// before it come first (in no particular order) and returns its index,
// or -1 when past never holds (past must hold from some mass on). Like
// quickselect, it partitions around pivots, keeping the side the
// crossing is on, in linear time.
func massSelect(c []cand, past func(cum float64) bool) int {
	lo, hi := 0, len(c)
	var acc float64 // the mass of c[:lo], all before the crossing
	for hi-lo > 32 {
		s := partition(c, lo, hi, cand.before)
		var mass float64
		for _, x := range c[lo:s] {
			mass += x.prob
		}
		switch {
		case past(acc + mass):
			hi = s
		case past(acc + mass + c[s].prob):
			return s
		default:
			acc += mass + c[s].prob
			lo = s + 1
		}
	}
	slices.SortFunc(c[lo:hi], func(a, b cand) int {
		switch {
		case a.before(b):
			return -1
		case b.before(a):
			return 1
		}
		return 0 // a token against itself
	})
	for j := lo; j < hi; j++ {
		acc += c[j].prob
		if past(acc) {
			return j
		}
	}
	return -1
}

// partialSelect reorders s so that its first k elements are the k least
// under less (in no particular order), by quickselect.
func partialSelect[E any](s []E, k int, less func(a, b E) bool) {
	lo, hi := 0, len(s)
	for hi-lo > 1 {
		st := partition(s, lo, hi, less)
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

// partition reorders s[lo:hi] (at least two elements) around a pivot, the
// median of its first, middle and last: those less than it first, then
// it, then the rest; it returns the pivot's index.
func partition[E any](s []E, lo, hi int, less func(a, b E) bool) int {
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
	return st
}
