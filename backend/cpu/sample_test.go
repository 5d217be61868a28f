package cpu

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"testing"

	"github.com/kiln-llm/kiln/backend"
)

func logits32(v ...float64) []float32 { return toF32(v) }

func TestSampleRules(t *testing.T) {
	ln := func(p ...float64) []float32 {
		out := make([]float32, len(p))
		for i, v := range p {
			out[i] = float32(math.Log(v))
		}
		return out
	}
	for _, c := range []struct {
		name   string
		logits []float32
		p      backend.SampleParams
		want   int32
	}{
		{"greedy ties take the lower index", logits32(1, 3, 3, 2), backend.SampleParams{}, 1},
		{"repetition divides positive, multiplies negative", logits32(2, -2, 1.5),
			backend.SampleParams{RepetitionPenalty: 2, Counts: []backend.TokenCount{{Token: 0, Count: 1}, {Token: 1, Count: 4}}}, 2},
		{"repetition covers the prompt", logits32(2, 1.5, -1),
			backend.SampleParams{RepetitionPenalty: 2, Counts: []backend.TokenCount{{Token: 0, Prompt: true}}}, 1},
		{"presence and frequency do not", logits32(2, 1.5, -1),
			backend.SampleParams{PresencePenalty: 1, FrequencyPenalty: 1, Counts: []backend.TokenCount{{Token: 0, Prompt: true}}}, 0},
		{"frequency counts, presence once", logits32(5, 4.5, 0),
			backend.SampleParams{FrequencyPenalty: 0.2, PresencePenalty: 0.1, Counts: []backend.TokenCount{{Token: 0, Count: 3}}}, 1},
		{"frequency below the margin", logits32(5, 4.5, 0),
			backend.SampleParams{FrequencyPenalty: 0.1, PresencePenalty: 0.1, Counts: []backend.TokenCount{{Token: 0, Count: 3}}}, 0},
		{"bias", logits32(5, 4.5, 0), backend.SampleParams{Bias: []backend.TokenBias{{Token: 2, Bias: 10}}}, 2},
		{"top-k 1 is greedy", logits32(0, 1, 0.9), backend.SampleParams{Temperature: 1, TopK: 1, Uniform: 0.999}, 1},
		{"inverse cdf, first bucket", ln(0.5, 0.3, 0.2), backend.SampleParams{Temperature: 1, Uniform: 0.49}, 0},
		{"inverse cdf, sorted order", ln(0.2, 0.3, 0.5), backend.SampleParams{Temperature: 1, Uniform: 0.51}, 1},
		{"inverse cdf, last", ln(0.5, 0.3, 0.2), backend.SampleParams{Temperature: 1, Uniform: 0.81}, 2},
		{"top-p renormalises", ln(0.5, 0.3, 0.2), backend.SampleParams{Temperature: 1, TopP: 0.75, Uniform: 0.99}, 1},
		{"top-p keeps the prefix reaching p", ln(0.5, 0.3, 0.2), backend.SampleParams{Temperature: 1, TopP: 0.75, Uniform: 0.6}, 0},
		{"min-p", ln(0.5, 0.3, 0.2), backend.SampleParams{Temperature: 1, MinP: 0.5, Uniform: 0.99}, 1},
		{"top-p measures mass after top-k", ln(0.4, 0.35, 0.25), backend.SampleParams{Temperature: 1, TopK: 2, TopP: 0.5, Uniform: 0.99}, 0},
		{"low temperature sharpens", ln(0.5, 0.3, 0.2), backend.SampleParams{Temperature: 0.01, Uniform: 0.9}, 0},
	} {
		if got := SampleRow(c.logits, &c.p).Token; got != c.want {
			t.Errorf("%s: token %d, want %d", c.name, got, c.want)
		}
	}
}

func TestSampleLogprobs(t *testing.T) {
	l := logits32(1, 3, 2, 0)
	p := backend.SampleParams{Temperature: 0.5, Uniform: 0.3, Logprob: true, TopLogprobs: 2,
		Counts: []backend.TokenCount{{Token: 1, Count: 2}}, FrequencyPenalty: 0.5}
	got := SampleRow(l, &p)
	pen := []float64{1, 2, 2, 0} // token 1 loses 2*0.5
	var s float64
	for _, v := range pen {
		s += math.Exp(v)
	}
	lse := math.Log(s)
	if math.Abs(float64(got.Logprob)-(pen[got.Token]-lse)) > 1e-6 {
		t.Errorf("logprob of %d = %v, want %v", got.Token, got.Logprob, pen[got.Token]-lse)
	}
	if len(got.Top) != 2 || got.Top[0].Token != 1 || got.Top[1].Token != 2 ||
		math.Abs(float64(got.Top[0].Logprob)-(2-lse)) > 1e-6 {
		t.Errorf("top logprobs %+v", got.Top)
	}
	if q := (backend.SampleParams{Temperature: 1}); SampleRow(l, &q).Top != nil {
		t.Error("top logprobs returned unasked")
	}
}

// refDist returns the probability with which each token is drawn, derived
// from the rules directly: penalise, scale, rank, filter, renormalise.
func refDist(logits []float32, p *backend.SampleParams) []float64 {
	l := make([]float32, len(logits))
	copy(l, logits)
	for _, c := range p.Counts {
		v := l[c.Token]
		if v > 0 {
			v /= p.RepetitionPenalty
		} else {
			v *= p.RepetitionPenalty
		}
		if c.Count > 0 {
			v -= p.PresencePenalty + p.FrequencyPenalty*float32(c.Count)
		}
		l[c.Token] = v
	}
	for _, bb := range p.Bias {
		l[bb.Token] += bb.Bias
	}
	for i := range l {
		if !backend.Allowed(p.Mask, int32(i)) {
			l[i] = float32(math.Inf(-1))
		}
	}
	rank := make([]int, len(l))
	for i := range rank {
		rank[i] = i
	}
	sort.SliceStable(rank, func(a, b int) bool { return l[rank[a]] > l[rank[b]] })
	keep := len(rank)
	if p.TopK > 0 {
		keep = min(keep, p.TopK)
	}
	prob := make([]float64, len(l))
	var z float64
	for _, i := range rank[:keep] {
		if math.IsInf(float64(l[i]), -1) {
			continue // masked
		}
		prob[i] = math.Exp(float64(l[i]*(1/p.Temperature)) - float64(l[rank[0]]*(1/p.Temperature)))
		z += prob[i]
	}
	var cum float64
	for n, i := range rank[:keep] {
		cum += prob[i] / z
		if p.TopP > 0 && p.TopP < 1 && cum >= float64(p.TopP) {
			keep = n + 1
			break
		}
	}
	for n, i := range rank[:keep] {
		if prob[i] < float64(p.MinP)*prob[rank[0]] {
			keep = n
			break
		}
	}
	out := make([]float64, len(l))
	z = 0
	for _, i := range rank[:keep] {
		z += prob[i]
	}
	for _, i := range rank[:keep] {
		out[i] = prob[i] / z
	}
	return out
}

// TestSampleDrawLarge: on rows of 20,000 logits whose kept prefix runs to
// thousands of tokens (flat rows, rows of ties) or to a few (peaked), and
// after top-k, each draw is the token
// the rules give for its Uniform, walked in sorted order (refDist); only a
// draw on a rounding boundary of the two sums may differ.
func TestSampleDrawLarge(t *testing.T) {
	r := newRand(41)
	const V = 20000
	flat := toF32(randVec(r, V, 2))
	ties := toF32(randVec(r, V, 3))
	for i := range ties {
		ties[i] = float32(math.Round(float64(ties[i])*2) / 2)
	}
	// Peaked: 64 tokens 0.1 apart from 20 down over a flat row hold nearly
	// all the mass, where draw takes top-p, min-p and temperature alone
	// among the largest few hundred (drawTop).
	peaked := toF32(randVec(r, V, 1))
	for j := range 64 {
		peaked[(j*7919)%V] = 20 - 0.1*float32(j)
	}
	for _, row := range []struct {
		name string
		l    []float32
	}{{"flat", flat}, {"ties", ties}, {"peaked", peaked}} {
		for i, p := range []backend.SampleParams{
			{Temperature: 1},
			{Temperature: 0.8, TopP: 0.95},
			{Temperature: 1.2, MinP: 0.001},
			{Temperature: 1, TopK: 3000, TopP: 0.9},
			{Temperature: 0.9, TopP: 0.99, MinP: 0.0005, Mask: everyThird(V)},
			{Temperature: 1.5, TopP: 0.5, MinP: 0.01},
			// Top-k in one pass over the row (topCands): ties at the k-th
			// place, a mask, fewer tokens allowed than k.
			{Temperature: 0.7, TopK: 20},
			{Temperature: 0.8, TopK: 40, MinP: 0.05},
			{Temperature: 1, TopK: topKDirect, TopP: 0.9, Mask: everyThird(V)},
			{Temperature: 1, TopK: 20, Mask: backend.NewMask(V, func(t int32) bool { return t%2000 == 5 })},
		} {
			want := refDist(row.l, &p)
			rank := make([]int, V)
			for k := range rank {
				rank[k] = k
			}
			sort.SliceStable(rank, func(a, b int) bool { return row.l[rank[a]] > row.l[rank[b]] })
			differ := 0
			for k := range 200 {
				p.Uniform = (float32(k) + 0.5) / 200
				var cum float64
				ref := int32(-1)
				for _, tok := range rank {
					if cum += want[tok]; want[tok] > 0 && cum > float64(p.Uniform) {
						ref = int32(tok)
						break
					}
				}
				if got := SampleRow(row.l, &p).Token; got != ref {
					differ++
				}
			}
			if differ > 2 {
				t.Errorf("%s, params %d: %d of 200 draws differ from the sorted walk", row.name, i, differ)
			}
		}
	}
}

// TestSampleDistribution draws with Uniform on a fine grid: each token must
// be drawn as often as its probability under the rules says.
func TestSampleDistribution(t *testing.T) {
	r := newRand(40)
	const V, N = 300, 4000
	for i, p := range []backend.SampleParams{
		{Temperature: 1},
		{Temperature: 0.7, TopK: 20},
		{Temperature: 1.3, TopP: 0.8},
		{Temperature: 1, MinP: 0.05},
		{Temperature: 0.9, TopK: 50, TopP: 0.9, MinP: 0.02, RepetitionPenalty: 1.3, PresencePenalty: 0.4, FrequencyPenalty: 0.2,
			Counts: []backend.TokenCount{{Token: 3, Count: 2}, {Token: 7, Count: 1, Prompt: true}, {Token: 100, Count: 5}, {Token: 12, Prompt: true}},
			Bias:   []backend.TokenBias{{Token: 9, Bias: 2}, {Token: 11, Bias: -50}}},
		{Temperature: 1, Mask: maskOf(V, 3, 7, 100, 12, 200, 299)},
		{Temperature: 0.8, TopK: 3, TopP: 0.9, Bias: []backend.TokenBias{{Token: 9, Bias: 30}}, Mask: everyThird(V)},
		{Temperature: 1.1, MinP: 0.1, Mask: everyThird(V)},
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			l := toF32(randVec(r, V, 2))
			l[3], l[7], l[100], l[12] = 4, -3, 5, 4.5
			want := refDist(l, &p)
			counts := make([]float64, V)
			for k := range N {
				p.Uniform = (float32(k) + 0.5) / N
				counts[SampleRow(l, &p).Token]++
			}
			for tok := range V {
				if math.Abs(counts[tok]/N-want[tok]) > 1.5/N {
					t.Fatalf("token %d drawn %v of %d times, want probability %v", tok, counts[tok], N, want[tok])
				}
			}
		})
	}
}

func TestSampleBatch(t *testing.T) {
	b := New(Options{Threads: 2})
	l := tensorF32(b, []float64{0, 1, 5, 3, 2, 1, 0, 9, 9}, 3, 3)
	res, err := b.Sample(l, []backend.SampleParams{{}, {}, {}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Token != 2 || res[1].Token != 0 || res[2].Token != 1 {
		t.Errorf("greedy rows: %+v", res)
	}
	if _, err := b.Sample(l, []backend.SampleParams{{}, {}}); err == nil {
		t.Error("row count mismatch accepted")
	}
	if _, err := b.Sample(l, []backend.SampleParams{{}, {Counts: []backend.TokenCount{{Token: 3, Count: 1}}}, {}}); err == nil {
		t.Error("penalty token outside the vocabulary accepted")
	}
}

// maskOf allows the tokens listed.
func maskOf(V int, toks ...int32) []uint64 {
	return backend.NewMask(V, func(t int32) bool { return slices.Contains(toks, t) })
}

func everyThird(V int) []uint64 { return backend.NewMask(V, func(t int32) bool { return t%3 == 0 }) }

// A mask excludes tokens whatever their logits and bias: greedy takes the
// best allowed token, log-probabilities are those of the allowed tokens
// alone, and the top log-probabilities list only allowed tokens.
func TestSampleMask(t *testing.T) {
	l := logits32(9, 1, 3, 2, 8)
	mask := maskOf(5, 1, 2, 3)
	p := backend.SampleParams{Mask: mask, Logprob: true, TopLogprobs: 5, Bias: []backend.TokenBias{{Token: 4, Bias: 5}}}
	got := SampleRow(l, &p)
	lse := math.Log(math.Exp(1) + math.Exp(3) + math.Exp(2))
	if got.Token != 2 || math.Abs(float64(got.Logprob)-(3-lse)) > 1e-6 {
		t.Errorf("greedy under a mask: token %d logprob %v, want 2 and %v", got.Token, got.Logprob, 3-lse)
	}
	if len(got.Top) != 3 || got.Top[0].Token != 2 || got.Top[1].Token != 3 || got.Top[2].Token != 1 {
		t.Errorf("top logprobs under a mask: %+v", got.Top)
	}
	for k := range 100 {
		q := backend.SampleParams{Temperature: 2, Uniform: float32(k) / 100, Mask: maskOf(5, 0, 3)}
		if tok := SampleRow(l, &q).Token; tok != 0 && tok != 3 {
			t.Fatalf("drew masked token %d", tok)
		}
	}
	b := New(Options{Threads: 1})
	lt := tensorF32(b, []float64{0, 1, 5, 3, 2, 1}, 2, 3)
	if res, err := b.Sample(lt, []backend.SampleParams{{Mask: maskOf(3, 0)}, {Mask: maskOf(3, 1, 2)}}); err != nil || res[0].Token != 0 || res[1].Token != 1 {
		t.Errorf("masked rows: %+v, %v", res, err)
	}
	for _, bad := range [][]uint64{{}, {0}, {1, 0}} {
		if _, err := b.Sample(lt, []backend.SampleParams{{Mask: bad}, {}}); err == nil {
			t.Errorf("mask %v accepted", bad)
		}
	}
}
