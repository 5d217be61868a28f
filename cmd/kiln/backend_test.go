package main

import (
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/backend/cpu"
)

// --kv defaults to the backend's activation type (f32 on the CPU; bf16 on a
// GPU, whose attention kernels use tensor cores only on bf16 caches).
func TestKVDType(t *testing.T) {
	b := cpu.New(cpu.Options{})
	for flag, want := range map[string]backend.DType{"": backend.F32, "f32": backend.F32, "bf16": backend.BF16} {
		if got, err := kvDType(flag, b); err != nil || got != want {
			t.Errorf("--kv %q: %v, %v; want %v", flag, got, err, want)
		}
	}
	if _, err := kvDType("f16", b); err == nil {
		t.Error("--kv f16 accepted")
	}
}
