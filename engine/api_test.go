package engine

import (
	"errors"
	"math"
	"testing"
)

// TestSamplingBounds: the zero value and the bounds themselves are valid;
// a value past either bound, or NaN, is a SamplingError naming the
// parameter as the API spells it.
func TestSamplingBounds(t *testing.T) {
	nan := float32(math.NaN())
	valid := []Sampling{
		{},
		{Temperature: 2, TopP: 1, MinP: 1, PresencePenalty: -2, FrequencyPenalty: 2, RepetitionPenalty: 10, TopLogprobs: 20, LogitBias: map[int32]float32{3: -100}},
		{Stop: make([]string, MaxStops)},
	}
	for i := range valid[2].Stop {
		valid[2].Stop[i] = "x"
	}
	for _, sp := range valid {
		if err := sp.Validate(); err != nil {
			t.Errorf("%+v: %v", sp, err)
		}
	}
	for _, c := range []struct {
		sp    Sampling
		param string
	}{
		{Sampling{Temperature: 2.01}, "temperature"},
		{Sampling{Temperature: -0.1}, "temperature"},
		{Sampling{Temperature: nan}, "temperature"},
		{Sampling{TopP: 1.5}, "top_p"},
		{Sampling{MinP: nan}, "min_p"},
		{Sampling{PresencePenalty: -3}, "presence_penalty"},
		{Sampling{FrequencyPenalty: 2.5}, "frequency_penalty"},
		{Sampling{RepetitionPenalty: 11}, "repetition_penalty"},
		{Sampling{TopK: -1}, "top_k"},
		{Sampling{MaxTokens: -1}, "max_tokens"},
		{Sampling{TopLogprobs: 21}, "top_logprobs"},
		{Sampling{LogitBias: map[int32]float32{5: 101}}, "logit_bias"},
		{Sampling{Stop: []string{"a", ""}}, "stop"},
		{Sampling{Stop: make([]string, MaxStops+1)}, "stop"},
	} {
		var se *SamplingError
		if err := c.sp.Validate(); !errors.As(err, &se) || se.Param != c.param {
			t.Errorf("%+v: %v, want an error about %s", c.sp, err, c.param)
		}
	}
}
