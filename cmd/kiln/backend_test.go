package main

import (
	"bytes"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/internal/testmodel"
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

// kiln run --quantize q4_k on the qwen3 fixture, whose rows are 64 and 128
// wide, holds its linear weights in Q8_0 (Q4_K's blocks are 256), says so
// and answers; on a GGUF file quantized already it stops with the reason
// before it opens the backend (here CUDA, which this test never reaches).
func TestQuantizeFlag(t *testing.T) {
	bin := kilnBinary(t)
	env, _ := cliEnv(t)
	kiln := func(args ...string) (string, string, error) {
		cmd := exec.Command(bin, append([]string{"run", "--no-daemon", "--max-tokens", "8", "--temperature", "0"}, args...)...)
		var out, errb bytes.Buffer
		cmd.Env, cmd.Stdout, cmd.Stderr = env, &out, &errb
		err := cmd.Run()
		return out.String(), errb.String(), err
	}
	out, errOut, err := kiln("--backend", "cpu", "--model", testmodel.Dir("qwen3"), "--quantize", "q4_k", "hello")
	if err != nil || strings.TrimSpace(out) == "" {
		t.Fatalf("--quantize q4_k: %v\n%q\n%s", err, out, errOut)
	}
	if want := "quantize: 12 tensors kept q8_0 (rows not a multiple of 256)"; !strings.Contains(errOut, want) {
		t.Errorf("--quantize q4_k: stderr %q, want %q", errOut, want)
	}
	_, errOut, err = kiln("--backend", "cuda", "--model", "../../testdata/quant/qwen3-w256-Q4_K_M.gguf", "--quantize", "q4_k", "hello")
	if want := "--quantize q4_k: model qwen3-w256-Q4_K_M is already quantized (GGUF Q4_K_M)"; err == nil || !strings.Contains(errOut, want) {
		t.Errorf("--quantize q4_k of a Q4_K_M file: %v %q, want %q", err, errOut, want)
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

// TestDiffers: kiln run uses a daemon only when every load flag it was
// given matches how the daemon loaded its model (its status's Info).
func TestDiffers(t *testing.T) {
	daemon := (&modelFlags{quantize: "q4_k", gpus: "0,1"}).loadInfo()
	daemon["backend"] = "2 x cuda"
	for _, c := range []struct {
		f    modelFlags
		want string
	}{
		{modelFlags{backend: "auto"}, ""},
		{modelFlags{backend: "cuda", quantize: "q4_k", kv: "bf16", gpus: "0,1"}, ""},
		{modelFlags{quantize: "q8_0"}, "--quantize q8_0"},
		{modelFlags{kv: "f32"}, "--kv f32"},
		{modelFlags{gpus: "0"}, "--gpus 0"},
		{modelFlags{backend: "cpu"}, "--backend cpu"},
	} {
		if got := c.f.differs(daemon); got != c.want {
			t.Errorf("%+v against %v: %q, want %q", c.f, daemon, got, c.want)
		}
	}
	if got := (&modelFlags{quantize: "fp8"}).differs(map[string]string{"backend": "cuda"}); got != "--quantize fp8" {
		t.Errorf("--quantize fp8 against a daemon that says nothing of it: %q", got)
	}
}
