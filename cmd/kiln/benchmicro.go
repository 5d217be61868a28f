package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/model"
)

// The single-process micro benchmark: decode and prefill speed of one model
// on one backend, driving model.Forward and Sample directly (no engine),
// each figure printed beside its physical floor.
func init() { benchModes[""] = benchMicro }

// benchResult is one measured configuration.
type benchResult struct {
	Kind    string  `json:"kind"`              // "decode", "prefill" or "mixed"
	Batch   int     `json:"batch"`             // decoding sequences
	Context int     `json:"context"`           // decode: tokens already cached per sequence; prefill and mixed: prompt length
	Prompts int     `json:"prompts,omitempty"` // mixed: prompts of that length in the pass
	TokS    float64 `json:"tok_s"`
	FloorS  float64 `json:"floor_tok_s"` // tok/s at the floor
	Ratio   float64 `json:"ratio"`       // TokS / FloorS
	Bytes   float64 `json:"bytes_per_step,omitempty"`
	FLOPs   float64 `json:"flops,omitempty"`
	Seconds float64 `json:"seconds"` // measured time of the timed steps
	Steps   int     `json:"steps"`
}

type benchReport struct {
	Model     string  `json:"model"`
	Backend   string  `json:"backend"`
	GPUs      int     `json:"gpus"` // the ranks of a model split across GPUs; 1: one device
	Layers    int     `json:"layers"`
	Bandwidth float64 `json:"bandwidth_bytes_s"`
	Peak      float64 `json:"peak_flop_s"`
	PeakFP8   float64 `json:"peak_fp8_flop_s,omitempty"` // the linear layers' rate, when they run on FP8 tensor cores
	Date      string  `json:"date"`
	// How the decode steps sampled, and whether each was issued before
	// the last one's tokens reached the host (see benchDecode).
	DecodeSampling map[string]any `json:"decode_sampling"`
	DecodeAhead    bool           `json:"decode_ahead"`
	Results        []benchResult  `json:"results"`
}

func benchMicro(args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	dir := fs.String("model", "", modelFlagHelp(weightFiles, "; or --synthetic"))
	backendName := fs.String("backend", "auto", "compute backend: auto, cpu or cuda")
	synth := fs.String("synthetic", "", "benchmark a synthetic model with random weights instead of --model (e.g. qwen3-8b)")
	layers := fs.Int("layers", 0, "synthetic model: keep only the first N layers (0: all)")
	dtype := fs.String("dtype", "bf16", "synthetic model: "+dtypeFlagHelp)
	kvType := fs.String("kv", "", kvFlagHelp)
	quantize := fs.String("quantize", "", quantizeFlagHelp)
	gpus := fs.String("gpus", "", gpusFlagHelp+"; the floors are then each GPU's share over one GPU's bandwidth and peak")
	bw := fs.Float64("bandwidth", 0, "memory bandwidth for the decode floor, bytes/s (default: a measured copy, device to device on a GPU)")
	peak := fs.Float64("peak", 0, "matrix FLOP/s for the prefill floor (default: 7.9e14 on CUDA, a rough 2-core estimate on CPU)")
	peakFP8 := fs.Float64("peak-fp8", 1.25e15, "FP8 matrix FLOP/s for the linear layers' share of the prefill floor, on a backend whose products with FP8 weights run on FP8 tensor cores")
	batches := fs.String("batches", "1,8,32,64", "decode batch sizes, at the first --contexts value")
	contexts := fs.String("contexts", "1024,8192,32768", "decode contexts, at batch 1")
	prefills := fs.String("prefill", "512,4096,16384", "prefill prompt lengths")
	mixed := fs.String("mixed", "", "mixed passes, as serving runs them: BxP[xN] is B sequences decoding at the first --contexts value beside N (default 1) prompts of P tokens (e.g. 15x512,12x512x4)")
	steps := fs.Int("steps", 32, "timed decode steps per configuration")
	var sampling benchSampling
	sampling.register(fs, "decode steps")
	ahead := fs.Bool("ahead", true, "decode: issue each step before the last one's tokens reach the host, as the engine does (dense models, GPU); false waits for them")
	asJSON := fs.Bool("json", false, "print the results as JSON")
	cpuProfile := fs.String("cpuprofile", "", "write a Go CPU profile of the measured runs (after loading) to this file, for 'go tool pprof'")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	bs, err1 := intList(*batches)
	cs, err2 := intList(*contexts)
	ps, err3 := intList(*prefills)
	ms, err4 := mixList(*mixed)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return err
	}
	if *steps < 1 {
		return fmt.Errorf("--steps must be positive")
	}
	if err := sampling.check(); err != nil {
		return err
	}
	sp := backend.SampleParams{Temperature: float32(sampling.temperature), TopP: float32(sampling.topP), TopK: sampling.topK}
	// The floors divide by these: 0 for --bandwidth and --peak is their default.
	for _, r := range []struct {
		flag string
		v    float64
		zero bool
	}{{"--bandwidth", *bw, true}, {"--peak", *peak, true}, {"--peak-fp8", *peakFP8, false}} {
		if math.IsNaN(r.v) || math.IsInf(r.v, 0) || r.v < 0 || r.v == 0 && !r.zero {
			return fmt.Errorf("%s %v: a rate must be a positive number", r.flag, r.v)
		}
	}
	if (*synth == "") == (*dir == "") {
		return fmt.Errorf("give exactly one of --model and --synthetic")
	}
	wdt, err := parseDType(*dtype)
	if err != nil {
		return err
	}
	start := time.Now()
	m, b, err := openModel(*backendName, modelSource{dir: *dir, synthetic: *synth, layers: *layers, dtype: wdt, kv: *kvType, quantize: *quantize, gpus: *gpus})
	if err != nil {
		return err
	}
	defer m.Close()
	cfg := m.Config()
	fmt.Fprintf(os.Stderr, "loaded %s in %.1fs\n", cfg.Name, time.Since(start).Seconds())
	onGPU := strings.HasPrefix(b.Name(), "cuda")
	if *bw == 0 {
		if dev, ok := b.(interface{ CopyBandwidth() (float64, error) }); ok {
			if *bw, err = dev.CopyBandwidth(); err != nil {
				return fmt.Errorf("measuring the memory bandwidth for the decode floor (--bandwidth gives it): %w", err)
			}
		} else {
			*bw = measureCopyBandwidth()
		}
	}
	if *peak == 0 {
		if onGPU {
			*peak = 7.9e14
		} else {
			*peak = float64(runtime.GOMAXPROCS(0)) * 3e9 * 32 // 2 FMA units x 8 f32 lanes x 2 FLOPs per core-cycle at ~3 GHz
		}
	}
	const blockSize = 16
	// One cache serves every configuration in turn: size it for the largest.
	need := 0
	for _, B := range bs {
		need = max(need, B*blocksFor(cs[0]+*steps+4, blockSize))
	}
	for _, C := range cs {
		need = max(need, blocksFor(C+*steps+4, blockSize))
	}
	for _, P := range ps {
		need = max(need, blocksFor(P, blockSize))
	}
	for _, x := range ms {
		need = max(need, x.B*blocksFor(cs[0]+4, blockSize)+x.N*blocksFor(x.P, blockSize))
	}
	// Hybrid models keep one recurrent-state slot per decoding sequence.
	slots := 1
	for _, B := range bs {
		slots = max(slots, B)
	}
	for _, x := range ms {
		slots = max(slots, x.B+x.N)
	}
	if err := m.AllocCache(model.CacheSpec{Blocks: need, BlockSize: blockSize, Slots: slots}); err != nil {
		return err
	}
	// FP8 weights whose products run on FP8 tensor cores: the linear layers'
	// FLOPs count at FP8's rate.
	fp8Peak := 0.0
	if f, ok := b.(backend.FP8Products); ok && f.FP8ProductTokens() > 0 && (wdt == backend.FP8 || *quantize == "fp8" || cfg.FP8Block != [2]int{}) {
		fp8Peak = *peakFP8
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	// Decode steps go ahead of their tokens where the engine's would: a
	// dense model on an asynchronous backend (see its scheduler's ahead).
	decodeAhead := *ahead && m.Feeds() && !m.Hybrid() && b.Asynchronous()
	rep := benchReport{Model: cfg.Name, Backend: b.Name(), GPUs: m.Ranks(), Layers: cfg.Layers, Bandwidth: *bw, Peak: *peak, PeakFP8: fp8Peak,
		Date: time.Now().UTC().Format(time.RFC3339), DecodeSampling: sampling.request(), DecodeAhead: decodeAhead}
	// A configuration's kernel profile leaves out its warm-up, whose
	// first calls carry lazy loads (cuBLASLt's kernels: milliseconds).
	warmed := func() { profileReport(b) }
	// Prefill first: its KV blocks are then real data for the decode runs.
	for _, P := range ps {
		r, err := benchPrefill(m, P, blockSize, warmed)
		if err != nil {
			return fmt.Errorf("prefill %d: %w", P, err)
		}
		r.FLOPs = prefillFLOPs(cfg, P)
		r.FloorS = float64(P) / prefillFloorTime(cfg, P, *peak, fp8Peak)
		r.Ratio = r.TokS / r.FloorS
		rep.Results = append(rep.Results, r)
		progress(*asJSON, r)
		profile(b, r)
	}
	type dcfg struct{ B, C int }
	var dcs []dcfg
	for _, B := range bs {
		dcs = append(dcs, dcfg{B, cs[0]})
	}
	for _, C := range cs[1:] {
		dcs = append(dcs, dcfg{1, C})
	}
	for _, d := range dcs {
		r, err := benchDecode(m, d.B, d.C, *steps, blockSize, decodeAhead, sp, warmed)
		if err != nil {
			return fmt.Errorf("decode batch %d context %d: %w", d.B, d.C, err)
		}
		// Bytes per step: every weight once (MoE: the experts the batch can
		// touch), plus each sequence's cached keys and values (the mean
		// context over the timed steps).
		ctx := float64(d.C) + float64(*steps)/2
		r.Bytes = float64(m.DecodeBytes(d.B)) + float64(d.B)*ctx*float64(m.KVBytesPerToken())
		r.FloorS = float64(d.B) / (r.Bytes / *bw)
		r.Ratio = r.TokS / r.FloorS
		rep.Results = append(rep.Results, r)
		progress(*asJSON, r)
		profile(b, r)
	}
	for _, x := range ms {
		r, err := benchMixed(m, x, cs[0], blockSize, warmed)
		if err != nil {
			return fmt.Errorf("mixed %dx%dx%d: %w", x.B, x.P, x.N, err)
		}
		// Compute-bound: the prompts' FLOPs and one token's products per
		// decoding sequence (their attention over the cache is left out).
		r.FLOPs = float64(x.N)*prefillFLOPs(cfg, x.P) + float64(x.B)*prefillFLOPs(cfg, 1)
		r.FloorS = float64(x.B+x.N*x.P) / (float64(x.N)*prefillFloorTime(cfg, x.P, *peak, fp8Peak) + float64(x.B)*prefillFloorTime(cfg, 1, *peak, fp8Peak))
		r.Ratio = r.TokS / r.FloorS
		rep.Results = append(rep.Results, r)
		progress(*asJSON, r)
		profile(b, r)
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	on := rep.Backend
	if rep.GPUs > 1 {
		on = fmt.Sprintf("%d x %s", rep.GPUs, on)
	}
	fmt.Printf("\n%s on %s (%d layers), %s\nfloors: decode = bytes/step / %.3g B/s, prefill = FLOPs / %.3g FLOP/s",
		rep.Model, on, rep.Layers, rep.Date, *bw, *peak)
	if fp8Peak > 0 {
		fmt.Printf(" (the linear layers' at FP8's %.3g)", fp8Peak)
	}
	fmt.Printf("\ndecode: %s", sampling)
	if sampling.temperature == 0 {
		fmt.Print(" (greedy)")
	}
	if decodeAhead {
		fmt.Print("; each step issued before the last one's tokens reach the host")
	}
	fmt.Println()
	fmt.Printf("%-8s %6s %8s %12s %12s %7s\n", "", "batch", "context", "tok/s", "floor tok/s", "ratio")
	for _, r := range rep.Results {
		kind := r.Kind
		if r.Prompts > 1 {
			kind = fmt.Sprintf("%s/%d", kind, r.Prompts)
		}
		fmt.Printf("%-8s %6d %8d %12.1f %12.1f %7.3f\n", kind, r.Batch, r.Context, r.TokS, r.FloorS, r.Ratio)
	}
	return nil
}

func progress(quiet bool, r benchResult) {
	if !quiet {
		fmt.Fprintf(os.Stderr, "%s batch %d context %d: %.1f tok/s (%.3f of the floor)\n", r.Kind, r.Batch, r.Context, r.TokS, r.Ratio)
	}
}

// profile prints the backend's per-kernel times of the last configuration's
// timed runs when it keeps them (the CUDA backend with KILN_CUDA_PROFILE=1).
func profile(b backend.Backend, r benchResult) {
	if rep := profileReport(b); rep != "" {
		runs := fmt.Sprintf("%d passes", benchRuns)
		if r.Kind == "decode" {
			runs = fmt.Sprintf("%d steps", r.Steps)
		}
		fmt.Fprintf(os.Stderr, "device time, %s batch %d context %d (%s):\n%s", r.Kind, r.Batch, r.Context, runs, rep)
	}
}

// profileReport returns the backend's per-kernel times since its last
// report, "" where it keeps none.
func profileReport(b backend.Backend) string {
	if p, ok := b.(interface{ ProfileReport() string }); ok {
		return p.ProfileReport()
	}
	return ""
}

func blocksFor(tokens, bs int) int { return (tokens + bs - 1) / bs }

func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad size %q in %q", f, s)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("empty list %q", s)
	}
	return out, nil
}

// mixCfg is a mixed pass: B decoding sequences beside N prompts of P
// tokens.
type mixCfg struct{ B, P, N int }

func mixList(s string) ([]mixCfg, error) {
	var out []mixCfg
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		parts := strings.Split(f, "x")
		if len(parts) == 2 {
			parts = append(parts, "1")
		}
		var v [3]int
		ok := len(parts) == 3
		for i := 0; ok && i < 3; i++ {
			var err error
			v[i], err = strconv.Atoi(parts[i])
			ok = err == nil && v[i] >= 0 && (i == 0 || v[i] > 0)
		}
		if !ok {
			return nil, fmt.Errorf("bad mixed pass %q in %q (want BxP or BxPxN, e.g. 15x512)", f, s)
		}
		out = append(out, mixCfg{v[0], v[1], v[2]})
	}
	return out, nil
}

// dtypeFlagHelp is --dtype's help, for a synthetic model's weights.
const dtypeFlagHelp = "weight dtype (bf16, f16, f32; or fp8, q8_0, q4_k, q5_k, q6_k, mxfp4 for the linear layers)"

func parseDType(s string) (backend.DType, error) {
	switch s {
	case "bf16":
		return backend.BF16, nil
	case "f16":
		return backend.F16, nil
	case "f32":
		return backend.F32, nil
	}
	if q, err := parseQuant(s); err == nil {
		return q, nil
	}
	return 0, fmt.Errorf("unknown dtype %q (bf16, f16, f32, fp8, q8_0, q4_k, q5_k, q6_k or mxfp4)", s)
}

// parseQuant reads a quantized weight type by its name.
func parseQuant(s string) (backend.DType, error) {
	for _, dt := range []backend.DType{backend.FP8, backend.Q8_0, backend.Q4_K, backend.Q5_K, backend.Q6_K, backend.MXFP4} {
		if strings.EqualFold(s, dt.String()) {
			return dt, nil
		}
	}
	return 0, fmt.Errorf("unknown quantized type %q", s)
}

// seqTokens is a deterministic prompt of n tokens.
func seqTokens(n, vocab, seed int) []int32 {
	t := make([]int32, n)
	x := uint32(seed*7919 + 1)
	for i := range t {
		x = x*1664525 + 1013904223
		t[i] = int32(x>>8) % int32(vocab)
	}
	return t
}

func blockRange(start, n int) []int32 {
	b := make([]int32, n)
	for i := range b {
		b[i] = int32(start + i)
	}
	return b
}

// benchRuns is the timed passes of a prefill or mixed configuration, after
// one of warm-up.
const benchRuns = 3

// benchPrefill times one prompt of P tokens through Forward and Sample
// (median of benchRuns after a warm-up; warmed is called after it).
func benchPrefill(m *model.Model, P, bs int, warmed func()) (benchResult, error) {
	cfg := m.Config()
	seq := model.Seq{Tokens: seqTokens(P, cfg.VocabSize, P), Blocks: blockRange(0, blocksFor(P, bs)), Logits: model.LastLogits}
	var times []float64
	for i := 0; i <= benchRuns; i++ {
		start := time.Now()
		if err := benchPass(m, []model.Seq{seq}, []backend.SampleParams{{}}, 1); err != nil {
			return benchResult{}, err
		}
		if i == 0 {
			warmed()
		} else {
			times = append(times, time.Since(start).Seconds())
		}
	}
	sort.Float64s(times)
	t := times[len(times)/2]
	return benchResult{Kind: "prefill", Batch: 1, Context: P, TokS: float64(P) / t, Seconds: t, Steps: 1}, nil
}

// benchSampling is how a bench's decode steps, or its requests, sample:
// greedy unless told, as vLLM's serving benchmark sends its requests.
type benchSampling struct {
	temperature, topP float64
	topK              int
}

func (b *benchSampling) register(fs *flag.FlagSet, what string) {
	fs.Float64Var(&b.temperature, "temperature", 0, what+": sampling temperature (0: greedy)")
	fs.Float64Var(&b.topP, "top-p", 1, what+": top-p, with --temperature")
	fs.IntVar(&b.topK, "top-k", 0, what+": top-k, with --temperature (0: none)")
}

func (b *benchSampling) check() error {
	if !(b.temperature >= 0) || !(b.topP > 0 && b.topP <= 1) || b.topK < 0 {
		return fmt.Errorf("--temperature %v, --top-p %v, --top-k %d: want a temperature >= 0, a top-p in (0, 1] and a top-k >= 0", b.temperature, b.topP, b.topK)
	}
	return nil
}

func (b benchSampling) String() string {
	return fmt.Sprintf("temperature %v, top-p %v, top-k %d", b.temperature, b.topP, b.topK)
}

// request returns the fields of an OpenAI request that sample as b says.
func (b *benchSampling) request() map[string]any {
	r := map[string]any{"temperature": b.temperature}
	if b.topP < 1 {
		r["top_p"] = b.topP
	}
	if b.topK > 0 {
		r["top_k"] = b.topK
	}
	return r
}

// benchPass runs one forward pass and samples a token for each sequence, as
// the scheduler does; the decoding sequences seqs[from:] advance by theirs.
func benchPass(m *model.Model, seqs []model.Seq, params []backend.SampleParams, from int) error {
	logits, err := m.Forward(seqs)
	if err != nil {
		return err
	}
	out, err := m.Sample(logits, params)
	if err != nil {
		return err
	}
	for i := from; i < len(seqs); i++ {
		seqs[i].Tokens[0] = out[i].Token
		seqs[i].Pos++
	}
	return nil
}

// benchDecode times steps decode steps of B sequences that each have C
// tokens cached (the cache's contents are whatever earlier runs left
// there: decode reads the same bytes whatever they hold); warmed is called
// after the warm-up steps. Each sequence samples as sp says, a new draw
// each step. With ahead, each step is issued before the last one's tokens
// reach the host, its tokens fed from that sampling on the device.
//
// The warm-up decodes the positions the timed steps then decode again, so
// that their cache pages are resident, as in a server that has run before
// (and as llama-bench, which clears its cache before timing, has them): a
// page's first touch is a fault, 16 us a 4 KB page on the Firecracker VMs
// the CPU figures come from, ~1.5 ms a step of Qwen3-0.6B's f32 cache.
func benchDecode(m *model.Model, B, C, steps, bs int, ahead bool, sp backend.SampleParams, warmed func()) (benchResult, error) {
	cfg := m.Config()
	warm := max(4, steps)
	nb := blocksFor(C+warm, bs)
	seqs := make([]model.Seq, B)
	for i := range seqs {
		seqs[i] = model.Seq{Tokens: []int32{int32(i % cfg.VocabSize)}, Pos: C, Blocks: blockRange(i*nb, nb), Slot: i, Logits: model.LastLogits}
	}
	params := make([]backend.SampleParams, B)
	rng := rand.New(rand.NewPCG(1, 2))
	var pending func() ([]backend.Sampled, error)
	// drain waits for the last step's tokens, which the next step then
	// takes from the host.
	drain := func() error {
		if pending == nil {
			return nil
		}
		out, err := pending()
		pending = nil
		for i := range seqs {
			seqs[i].Fed = false
			if err == nil {
				seqs[i].Tokens[0] = out[i].Token
			}
		}
		return err
	}
	var start time.Time
	for s := 0; s < warm+steps; s++ {
		if s == warm {
			if err := drain(); err != nil {
				return benchResult{}, err
			}
			for i := range seqs {
				seqs[i].Pos = C
			}
			warmed()
			start = time.Now()
		}
		logits, err := m.Forward(seqs)
		if err != nil {
			return benchResult{}, err
		}
		for i := range params {
			params[i] = sp
			params[i].Uniform = rng.Float32()
		}
		wait, err := m.SampleStart(logits, params)
		if err != nil {
			return benchResult{}, err
		}
		for i := range seqs {
			seqs[i].Pos++
		}
		if !ahead {
			pending = wait
			if err := drain(); err != nil {
				return benchResult{}, err
			}
			continue
		}
		if pending != nil {
			if _, err := pending(); err != nil {
				return benchResult{}, err
			}
		}
		pending = wait
		for i := range seqs {
			seqs[i].Fed, seqs[i].FedRow = true, i
		}
	}
	if err := drain(); err != nil {
		return benchResult{}, err
	}
	t := time.Since(start).Seconds()
	return benchResult{Kind: "decode", Batch: B, Context: C, TokS: float64(B*steps) / t, Seconds: t, Steps: steps}, nil
}

// benchMixed times passes of x.B sequences decoding at context C beside
// x.N prompts of x.P tokens (median of benchRuns after a warm-up, warmed
// called after it), each pass sampling a token for every sequence as the
// scheduler does.
func benchMixed(m *model.Model, x mixCfg, C, bs int, warmed func()) (benchResult, error) {
	cfg := m.Config()
	const passes = benchRuns + 1
	B, P, N := x.B, x.P, x.N
	nb, pb := blocksFor(C+passes, bs), blocksFor(P, bs)
	seqs := make([]model.Seq, N+B)
	for i := range N {
		seqs[i] = model.Seq{Tokens: seqTokens(P, cfg.VocabSize, P+i), Blocks: blockRange(B*nb+i*pb, pb), Slot: B + i, Logits: model.LastLogits}
	}
	for i := N; i < N+B; i++ {
		seqs[i] = model.Seq{Tokens: []int32{int32(i % cfg.VocabSize)}, Pos: C, Blocks: blockRange((i-N)*nb, nb), Slot: i - N, Logits: model.LastLogits}
	}
	params := make([]backend.SampleParams, N+B)
	var times []float64
	for s := 0; s < passes; s++ {
		start := time.Now()
		if err := benchPass(m, seqs, params, N); err != nil {
			return benchResult{}, err
		}
		if s == 0 {
			warmed()
		} else {
			times = append(times, time.Since(start).Seconds())
		}
	}
	sort.Float64s(times)
	t := times[len(times)/2]
	return benchResult{Kind: "mixed", Batch: B, Context: P, Prompts: N, TokS: float64(B+N*P) / t, Seconds: t, Steps: 1}, nil
}

// linearParams is the number of weights of one token's matrix products
// (MoE layers counting only the top-k experts), the LM head included.
func linearParams(c *model.Config) (dense, expert float64, moeLayers int) {
	H := float64(c.Hidden)
	dense = float64(c.VocabSize) * H // LM head (the embedding table is only indexed)
	for l := 0; l < c.Layers; l++ {
		if c.Kinds[l] == model.FullAttention {
			q := float64(c.Heads * c.HeadDim)
			if c.Hybrid() {
				q *= 2 // gated attention: [query | gate]
			}
			dense += H*(q+2*float64(c.KVHeads*c.HeadDim)) + float64(c.Heads*c.HeadDim)*H
		} else {
			d := c.DeltaNet
			dense += H*float64(2*d.KeyHeads*d.KeyDim+2*d.ValueHeads*d.ValueDim+2*d.ValueHeads) + float64(d.ValueHeads*d.ValueDim)*H
		}
		if c.Sparse != nil && c.Sparse[l] {
			moeLayers++
			expert = 3 * H * float64(c.MoE.Intermediate)
			dense += float64(c.MoE.Experts)*H + 3*H*float64(c.MoE.SharedIntermediate)
		} else {
			dense += 3 * H * float64(c.Intermediate)
		}
	}
	return dense, expert, moeLayers
}

// prefillFLOPs counts the matrix FLOPs of one P-token prompt whose last
// position gets logits: 2 per weight per token (the LM head's for the last
// token only), plus causal attention (QK^T and PV over P^2/2 pairs per
// head).
func prefillFLOPs(c *model.Config, P int) float64 {
	dense, expert, moe := linearParams(c)
	head := float64(c.VocabSize) * float64(c.Hidden)
	perTok := dense - head + float64(moe)*float64(c.MoE.TopK)*expert
	return 2*perTok*float64(P) + 2*head + attentionFLOPs(c, P)
}

// attentionFLOPs counts causal attention's share of prefillFLOPs.
func attentionFLOPs(c *model.Config, P int) float64 {
	attnLayers := 0
	for _, k := range c.Kinds {
		if k == model.FullAttention {
			attnLayers++
		}
	}
	p := float64(P)
	return float64(attnLayers) * 4 * p * p / 2 * float64(c.Heads*c.HeadDim)
}

// prefillFloorTime is the least time the prefill FLOPs of a P-token prompt
// take: at peak, or with FP8 products (fp8Peak > 0) the linear layers'
// share of them at fp8Peak and attention's at peak.
func prefillFloorTime(c *model.Config, P int, peak, fp8Peak float64) float64 {
	flops, attn := prefillFLOPs(c, P), attentionFLOPs(c, P)
	if fp8Peak == 0 {
		return flops / peak
	}
	return (flops-attn)/fp8Peak + attn/peak
}

// measureCopyBandwidth times copying a 256 MiB buffer (bytes read plus
// written per second), the CPU's decode floor.
func measureCopyBandwidth() float64 {
	const n = 256 << 20
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src {
		src[i] = byte(i)
	}
	best := 0.0
	for range 3 {
		start := time.Now()
		copy(dst, src)
		best = max(best, 2*n/time.Since(start).Seconds())
	}
	return best
}
