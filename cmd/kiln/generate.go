package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/model"
)

func init() {
	register(&command{
		name:    "generate",
		summary: "continue a prompt of token ids (validation against a reference)",
		run:     runGenerate,
	})
}

// generateResult is what generate prints with --json.
type generateResult struct {
	Tokens       []int32 `json:"tokens"`
	FinishReason string  `json:"finish_reason"` // "eos" or "length"
	PromptTokens int     `json:"prompt_tokens"`
	PrefillMS    float64 `json:"prefill_ms"`
	DecodeTPS    float64 `json:"decode_tokens_per_s"`
	Backend      string  `json:"backend"`
}

func runGenerate(args []string) error {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	dir := fs.String("model", "", modelFlagHelp(weightFiles, "; or --synthetic"))
	synth := fs.String("synthetic", "", "a synthetic model with random weights instead: "+strings.Join(model.SyntheticNames(), ", "))
	layers := fs.Int("layers", 0, "with --synthetic: keep only this many layers (0: all)")
	backendName := fs.String("backend", "auto", "compute backend: auto, cpu or cuda")
	kvType := fs.String("kv", "", kvFlagHelp)
	quantize := fs.String("quantize", "", quantizeFlagHelp)
	gpus := fs.String("gpus", "", gpusFlagHelp)
	promptIDs := fs.String("prompt-ids", "", "comma-separated prompt token ids")
	maxTokens := fs.Int("max-tokens", 32, "tokens to generate at most")
	temperature := fs.Float64("temperature", 0, "sampling temperature; 0 is greedy")
	topP := fs.Float64("top-p", 1, "nucleus sampling threshold")
	topK := fs.Int("top-k", 0, "sample among the k most likely tokens (0: all)")
	seed := fs.Uint64("seed", 1, "random seed for sampling")
	ignoreEOS := fs.Bool("ignore-eos", false, "keep generating after an end-of-sequence token")
	asJSON := fs.Bool("json", false, "print a JSON object")
	dumpLogits := fs.String("dump-logits", "", "write the logits of the last prompt position to this file (little-endian float32)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if (*dir == "") == (*synth == "") {
		return errors.New("give exactly one of --model and --synthetic")
	}
	prompt, err := parseIDs(*promptIDs)
	if err != nil {
		return err
	}
	if *maxTokens < 1 {
		return errors.New("--max-tokens must be at least 1")
	}
	m, b, err := openModel(*backendName, modelSource{dir: *dir, synthetic: *synth, layers: *layers, dtype: backend.BF16, kv: *kvType, quantize: *quantize, gpus: *gpus})
	if err != nil {
		return err
	}
	defer m.Close()

	const blockSize = 16
	total := len(prompt) + *maxTokens
	// Past the context the model is off its training distribution, and a
	// mistyped --max-tokens would size the cache by it.
	if ctx := m.Config().ContextLength; ctx > 0 && total > ctx {
		return fmt.Errorf("%d prompt tokens plus --max-tokens %d exceed the model's context of %d tokens", len(prompt), *maxTokens, ctx)
	}
	if err := m.AllocCache(model.CacheSpec{Blocks: (total + blockSize - 1) / blockSize, BlockSize: blockSize, Slots: 1}); err != nil {
		return err
	}
	blocks := make([]int32, (total+blockSize-1)/blockSize)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	rng := rand.New(rand.NewPCG(*seed, 0))
	params := []backend.SampleParams{{Temperature: float32(*temperature), TopP: float32(*topP), TopK: *topK}}
	eos := m.Config().EOS

	res := generateResult{PromptTokens: len(prompt), FinishReason: "length", Backend: b.Name(), Tokens: []int32{}}
	start := time.Now()
	seq := model.Seq{Tokens: prompt, Blocks: blocks, Logits: model.LastLogits}
	var decodeStart time.Time
	for len(res.Tokens) < *maxTokens {
		logits, err := m.Forward([]model.Seq{seq})
		if err != nil {
			return err
		}
		if seq.Pos == 0 && *dumpLogits != "" {
			if err := writeLogits(b, logits, *dumpLogits); err != nil {
				return err
			}
		}
		params[0].Uniform = rng.Float32()
		out, err := m.Sample(logits, params)
		if err != nil {
			return err
		}
		if seq.Pos == 0 {
			res.PrefillMS = float64(time.Since(start).Microseconds()) / 1000
			decodeStart = time.Now()
		}
		tok := out[0].Token
		res.Tokens = append(res.Tokens, tok)
		if !*ignoreEOS && slices.Contains(eos, tok) {
			res.FinishReason = "eos"
			break
		}
		seq.Pos += len(seq.Tokens)
		seq.Tokens = []int32{tok}
	}
	if n := len(res.Tokens) - 1; n > 0 {
		res.DecodeTPS = float64(n) / time.Since(decodeStart).Seconds()
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		return enc.Encode(res)
	}
	ids := make([]string, len(res.Tokens))
	for i, t := range res.Tokens {
		ids[i] = strconv.Itoa(int(t))
	}
	fmt.Println(strings.Join(ids, " "))
	fmt.Fprintf(os.Stderr, "%d prompt tokens in %.1f ms, %d generated (%s) at %.1f tokens/s on %s\n",
		res.PromptTokens, res.PrefillMS, len(res.Tokens), res.FinishReason, res.DecodeTPS, res.Backend)
	return nil
}

func parseIDs(s string) ([]int32, error) {
	if strings.TrimSpace(s) == "" {
		return nil, errors.New("--prompt-ids is required")
	}
	var ids []int32
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.ParseInt(strings.TrimSpace(f), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("--prompt-ids: %q is not a token id", f)
		}
		ids = append(ids, int32(v))
	}
	return ids, nil
}

// writeLogits writes logits [1, V] as little-endian float32.
func writeLogits(b backend.Backend, logits backend.Tensor, path string) error {
	raw := make([]byte, backend.Numel(logits)*4)
	if err := b.Read(logits, raw); err != nil {
		return err
	}
	out := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		// Read gives host-order float32; the file is little-endian.
		v := math.Float32frombits(binary.NativeEndian.Uint32(raw[i:]))
		binary.LittleEndian.PutUint32(out[i:], math.Float32bits(v))
	}
	return os.WriteFile(path, out, 0o644)
}
