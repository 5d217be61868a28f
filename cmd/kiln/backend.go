package main

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"

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
	gpus           string                  // --gpus: split the model across GPUs ("": one)
	progress       func(done, total int64) // of reading the weights; nil: none
}

// gpusFlagHelp is the help of every command's --gpus flag.
const gpusFlagHelp = "split the model across GPUs, joined by NCCL (tensor and expert parallel): N for the first N, or a list of ordinals (0,2); default: one GPU"

// maxGPUs bounds --gpus: more GPUs than one host has (and than a split
// model's heads divide into) is a typo.
const maxGPUs = 64

// parseGPUs resolves a --gpus flag: nil for one GPU, else the ordinals.
func parseGPUs(flag string) ([]int, error) {
	if flag == "" {
		return nil, nil
	}
	if !strings.Contains(flag, ",") {
		n, err := strconv.Atoi(flag)
		if err != nil || n < 1 || n > maxGPUs {
			return nil, fmt.Errorf("--gpus %q: want a number of GPUs (at most %d) or a list of their ordinals (0,1)", flag, maxGPUs)
		}
		if n == 1 {
			return nil, nil
		}
		devs := make([]int, n)
		for i := range devs {
			devs[i] = i
		}
		return devs, nil
	}
	var devs []int
	for f := range strings.SplitSeq(flag, ",") {
		d, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || d < 0 || d >= maxGPUs || slices.Contains(devs, d) {
			return nil, fmt.Errorf("--gpus %q: want distinct GPU ordinals (0,1)", flag)
		}
		devs = append(devs, d)
	}
	return devs, nil
}

// quantizeFlagHelp is the help of every command's --quantize flag.
const quantizeFlagHelp = "quantize the linear layers' bf16/f16/f32 weights as they load, for a GPU they would not fit: fp8 (Qwen's 128x128-tile FP8), q8_0 or q4_k (a weight whose rows are not whole blocks of it takes q8_0, or stays as it is)"

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
const kvFlagHelp = "KV cache dtype: bf16 or f32 (default bf16)"

// kvDType resolves a --kv flag; "" is bf16 on every backend. A GPU's
// attention kernels run on tensor cores from bf16 caches; on the CPU a bf16
// cache holds twice the context in the same memory and decodes long
// contexts faster (Qwen3-0.6B Q8_0 after 8192 tokens: 9.5 tok/s with f32,
// 13.1 with bf16; after 128 the same), as llama.cpp's f16 cache does.
func kvDType(flag string) (backend.DType, error) {
	switch flag {
	case "", "bf16":
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
	// The config first: a bad model path, or one --quantize does not
	// apply to, fails before a GPU starts.
	var cfg *model.Config
	if src.synthetic != "" {
		cfg, err = model.SyntheticConfig(src.synthetic)
	} else {
		cfg, err = modelPath(src.dir).config()
	}
	if err != nil {
		return nil, nil, err
	}
	q, err := quantizeType(src.quantize)
	if err != nil {
		return nil, nil, err
	}
	if err := cfg.CheckQuantize(q); err != nil {
		return nil, nil, fmt.Errorf("--quantize %s: %w", src.quantize, err)
	}
	devs, err := parseGPUs(src.gpus)
	if err != nil {
		return nil, nil, err
	}
	if devs != nil {
		return openSplitModel(backendName, devs, src)
	}
	b, err := openBackend(backendName)
	if err != nil {
		return nil, nil, err
	}
	m, err := loadModel(b, src, 0, 0, src.progress)
	if err != nil {
		return nil, nil, err
	}
	return m, b, nil
}

// openSplitModel loads the model split across the GPUs devs, a rank on
// each (docs/multigpu.md), and returns the group's face, rank 0, and its
// backend.
func openSplitModel(backendName string, devs []int, src modelSource) (*model.Model, backend.Backend, error) {
	if backendName != "auto" && backendName != "" && backendName != "cuda" {
		return nil, nil, fmt.Errorf("--gpus splits the model across GPUs: it needs the cuda backend, not %q", backendName)
	}
	bs, err := cuda.NewGroup(devs, cuda.Options{})
	if err != nil {
		return nil, nil, err
	}
	// The ranks load side by side; progress adds up their bytes.
	var mu sync.Mutex
	done, total := make([]int64, len(bs)), make([]int64, len(bs))
	ranks, errs := make([]*model.Model, len(bs)), make([]error, len(bs))
	var wg sync.WaitGroup
	for r, b := range bs {
		progress := func(d, t int64) {
			if src.progress == nil {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			done[r], total[r] = d, t
			var sd, st int64
			for i := range done {
				sd, st = sd+done[i], st+total[i]
			}
			src.progress(sd, st)
		}
		wg.Go(func() { ranks[r], errs[r] = loadModel(b, src, r, len(bs), progress) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, m := range ranks {
			if m != nil {
				m.Close()
			}
		}
		return nil, nil, err
	}
	m, err := model.Group(ranks)
	if err != nil {
		return nil, nil, err
	}
	slog.Info("model split across GPUs", "gpus", fmt.Sprint(devs), "weights_per_gpu", humanBytes(m.WeightBytes()/int64(len(bs))))
	return m, bs[0], nil
}

// loadModel loads the model src names on b, rank of ranks of a split
// model when ranks > 0 (model.Options).
func loadModel(b backend.Backend, src modelSource, rank, ranks int, progress func(done, total int64)) (*model.Model, error) {
	kv, err := kvDType(src.kv)
	if err != nil {
		return nil, err
	}
	q, err := quantizeType(src.quantize)
	if err != nil {
		return nil, err
	}
	var m *model.Model
	if src.synthetic != "" {
		dt := src.dtype
		if q.Quantized() { // random weights drawn in the quantized type
			dt = q
		}
		m, err = model.Synthetic(src.synthetic, b, model.SyntheticOptions{Layers: src.layers, Seed: 1, DType: dt, KVDType: kv, Rank: rank, Ranks: ranks})
	} else {
		m, err = modelPath(src.dir).weights(b, model.Options{KVDType: kv, Quantize: q, Progress: progress, Rank: rank, Ranks: ranks})
	}
	// A warning, as llama.cpp's quantizer gives: the weights take more
	// memory than --quantize said. The ranks of a split model decide alike.
	if err == nil && rank == 0 {
		for _, f := range m.QuantFallbacks() {
			slog.Warn(fmt.Sprintf("quantize: %d tensors kept %v (rows not a multiple of %d)", f.Weights, f.DType, f.Block))
		}
	}
	return m, err
}
