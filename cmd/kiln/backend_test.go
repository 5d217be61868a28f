package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/backend"
)

// --kv defaults to bf16, on the CPU too.
func TestKVDType(t *testing.T) {
	for flag, want := range map[string]backend.DType{"": backend.BF16, "f32": backend.F32, "bf16": backend.BF16} {
		if got, err := kvDType(flag); err != nil || got != want {
			t.Errorf("--kv %q: %v, %v; want %v", flag, got, err, want)
		}
	}
	if _, err := kvDType("f16"); err == nil {
		t.Error("--kv f16 accepted")
	}
}

// --gpus: a count is the first GPUs, one of them no split; a list is those
// ordinals; anything else is refused with the forms it takes.
func TestParseGPUs(t *testing.T) {
	for flag, want := range map[string][]int{"": nil, "1": nil, "2": {0, 1}, "4": {0, 1, 2, 3}, "0,2": {0, 2}, "3,1": {3, 1}, "5,": nil} {
		got, err := parseGPUs(flag)
		if flag == "5," {
			if err == nil {
				t.Errorf("--gpus %q accepted: %v", flag, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("--gpus %q: %v, %v; want %v", flag, got, err, want)
		}
	}
	for _, flag := range []string{"0", "-1", "x", "1,1", "0,-2"} {
		if _, err := parseGPUs(flag); err == nil || !strings.Contains(err.Error(), "--gpus") {
			t.Errorf("--gpus %q: %v", flag, err)
		}
	}
	if _, _, err := openModel("cpu", modelSource{gpus: "2"}); err == nil || !strings.Contains(err.Error(), "cuda backend") {
		t.Errorf("--gpus on the CPU backend: %v", err)
	}
}

// FuzzParseGPUs: any --gpus value is refused with the flag's name or gives
// distinct ordinals, at least two of them.
func FuzzParseGPUs(f *testing.F) {
	for _, s := range []string{"", "1", "2", "0,2", "3,1", "1,1", "-1", "x", "5,", " 1 , 2 ", "99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, flag string) {
		devs, err := parseGPUs(flag)
		if err != nil {
			if !strings.Contains(err.Error(), "--gpus") {
				t.Errorf("%q: %v", flag, err)
			}
			return
		}
		if devs == nil {
			return
		}
		if len(devs) < 2 && !strings.Contains(flag, ",") {
			t.Errorf("%q: %v, fewer than two GPUs split nothing", flag, devs)
		}
		for i, d := range devs {
			if d < 0 || slices.Index(devs, d) != i {
				t.Errorf("%q: %v", flag, devs)
			}
		}
	})
}
