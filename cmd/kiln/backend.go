package main

import (
	"fmt"
	"log/slog"
	"slices"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/backend/cpu"
	"github.com/kiln-llm/kiln/backend/cuda"
	"github.com/kiln-llm/kiln/model"
	"github.com/kiln-llm/kiln/quant"
)

// openBackend returns the named compute backend: "cpu", "cuda", or "auto"
// (also "") for the best one available here. Auto takes CUDA when a GPU and
// its libraries are there, else the CPU, and says why in one log line.
func openBackend(name string) (backend.Backend, error) {
	switch name {
	case "auto", "":
		b, err := cuda.New(cuda.Options{})
		if err != nil {
			slog.Info("using the CPU backend", "cuda", err)
			return cpu.New(cpu.Options{}), nil
		}
		return b, nil
	case "cpu":
		return cpu.New(cpu.Options{}), nil
	case "cuda":
		b, err := cuda.New(cuda.Options{})
		if err != nil {
			return nil, err
		}
		return b, nil
	}
	return nil, fmt.Errorf("unknown backend %q (want auto, cpu or cuda)", name)
}

// modelSource is the model a command loads: --model (a path, or the demo
// model) or --synthetic NAME (generate, bench), with the flags that say how.
type modelSource struct {
	dir, synthetic string
	layers         int                     // synthetic: keep only the first layers (0: all)
	dtype          backend.DType           // synthetic: weight dtype
	kv             string                  // --kv: KV cache dtype ("": kvDType's default)
	quantize       string                  // --quantize: type the linear layers' float weights become at load
	progress       func(done, total int64) // of reading the weights; nil: none
}

// quantizeFlagHelp is the help of every command's --quantize flag.
const quantizeFlagHelp = "quantize the linear layers' bf16/f16/f32 weights as they load, for a GPU they would not fit: fp8 (Qwen's 128x128-tile FP8), q8_0 or q4_k"

// quantizeType resolves a --quantize flag ("" is none).
func quantizeType(flag string) (backend.DType, error) {
	if flag == "" {
		return backend.F32, nil
	}
	dt, err := parseQuant(flag)
	if err != nil || !slices.Contains(quant.Quantizable, dt) {
		return 0, fmt.Errorf("--quantize %q: want fp8, q8_0 or q4_k", flag)
	}
	return dt, nil
}

// kvFlagHelp is the help of every command's --kv flag.
const kvFlagHelp = "KV cache dtype: bf16 or f32 (default: bf16 on a GPU, f32 on the CPU)"

// kvDType resolves a --kv flag on backend b: "" is b's ActivationType, bf16
// on a GPU (its attention kernels run on tensor cores from bf16 caches, at
// half the memory) and f32 on the CPU.
func kvDType(flag string, b backend.Backend) (backend.DType, error) {
	switch flag {
	case "":
		return b.ActivationType(), nil
	case "bf16":
		return backend.BF16, nil
	case "f32":
		return backend.F32, nil
	}
	return 0, fmt.Errorf("--kv %q: want bf16 or f32", flag)
}

// openModel opens the backend the name and the model call for, then loads
// the model on it (or builds the synthetic one).
func openModel(backendName string, src modelSource) (*model.Model, backend.Backend, error) {
	var err error
	if src.dir, err = resolveModelPath(src.dir); err != nil {
		return nil, nil, err
	}
	// The config first: a bad model path fails before a GPU starts.
	if src.synthetic != "" {
		_, err = model.SyntheticConfig(src.synthetic)
	} else {
		_, err = modelPath(src.dir).config()
	}
	if err != nil {
		return nil, nil, err
	}
	b, err := openBackend(backendName)
	if err != nil {
		return nil, nil, err
	}
	kv, err := kvDType(src.kv, b)
	if err != nil {
		return nil, nil, err
	}
	q, err := quantizeType(src.quantize)
	if err != nil {
		return nil, nil, err
	}
	var m *model.Model
	if src.synthetic != "" {
		dt := src.dtype
		if q.Quantized() { // random weights drawn in the quantized type
			dt = q
		}
		m, err = model.Synthetic(src.synthetic, b, model.SyntheticOptions{Layers: src.layers, Seed: 1, DType: dt, KVDType: kv})
	} else {
		m, err = modelPath(src.dir).weights(b, model.Options{KVDType: kv, Quantize: q, Progress: src.progress})
	}
	if err != nil {
		return nil, nil, err
	}
	return m, b, nil
}
