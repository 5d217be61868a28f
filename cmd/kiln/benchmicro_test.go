package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// TestBenchMicro runs "kiln bench" on a dense and a hybrid synthetic model:
// every configuration gives a positive rate and a floor (hybrid models need a
// state slot per decoding sequence, and one for a mixed pass's prompt).
func TestBenchMicro(t *testing.T) {
	bin := kilnBinary(t)
	for _, name := range []string{"tiny-qwen3", "tiny-qwen3next"} {
		out, err := exec.Command(bin, "bench", "--synthetic", name, "--backend", "cpu", "--batches", "1,3",
			"--contexts", "64", "--prefill", "32", "--mixed", "2x16x2", "--steps", "2", "--temperature", "0.8", "--top-k", "5", "--json").Output()
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		var rep struct {
			Sampling map[string]any `json:"decode_sampling"`
			Ahead    bool           `json:"decode_ahead"`
			Results  []struct {
				Kind  string  `json:"kind"`
				Batch int     `json:"batch"`
				TokS  float64 `json:"tok_s"`
				Floor float64 `json:"floor_tok_s"`
			} `json:"results"`
		}
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		// Decode samples as asked; the CPU backend issues no step ahead.
		if rep.Sampling["temperature"] != 0.8 || rep.Sampling["top_k"] != 5.0 || rep.Ahead {
			t.Errorf("%s: decode sampling %v, ahead %v", name, rep.Sampling, rep.Ahead)
		}
		if len(rep.Results) != 4 || rep.Results[3].Kind != "mixed" || rep.Results[3].Batch != 2 {
			t.Fatalf("%s: %+v, want prefill, decode at batch 1 and 3, mixed with 2 decoding", name, rep.Results)
		}
		for _, r := range rep.Results {
			if !(r.TokS > 0) || !(r.Floor > 0) {
				t.Errorf("%s %s batch %d: %v tok/s, floor %v", name, r.Kind, r.Batch, r.TokS, r.Floor)
			}
		}
	}
}

// TestBenchRates: a floor's rate that is negative, zero (where zero is no
// default) or not a number is refused before the model loads.
func TestBenchRates(t *testing.T) {
	bin := kilnBinary(t)
	for _, bad := range [][]string{{"--bandwidth", "-1"}, {"--bandwidth", "NaN"}, {"--peak", "-3"}, {"--peak", "+Inf"}, {"--peak-fp8", "0"}} {
		args := append([]string{"bench", "--synthetic", "tiny-qwen3", "--backend", "cpu", "--steps", "1"}, bad...)
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), bad[0]+" ") || strings.Contains(string(out), "loaded") {
			t.Errorf("%v: err %v, output %s", bad, err, out)
		}
	}
}
