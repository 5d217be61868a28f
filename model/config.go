package model

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"slices"
	"sort"
	"strings"
	"syscall"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/internal/mapfile"
	"github.com/kiln-llm/kiln/quant"
)

// LayerKind is the token mixer of a decoder layer.
type LayerKind uint8

const (
	FullAttention   LayerKind = iota // softmax attention over the KV cache
	LinearAttention                  // Gated DeltaNet with recurrent state
)

// Sampling holds a model's default sampling parameters (generation_config.json).
type Sampling struct {
	Temperature float32 // 0: greedy
	TopP        float32 // 1: no limit
	TopK        int     // 0: no limit
	MinP        float32 // 0: no limit
	// RepetitionPenalty divides the logits of tokens already seen (1: none),
	// as generation_config.json's repetition_penalty does in transformers.
	RepetitionPenalty float32
}

// MoEConfig sizes a model's mixture-of-experts layers.
type MoEConfig struct {
	Experts, TopK      int
	Intermediate       int // per expert
	SharedIntermediate int // 0: no shared expert
	NormTopK           bool
}

// Config is what kiln reads from a model directory's config.json and
// generation_config.json.
type Config struct {
	Name          string // the directory's base name, or the synthetic model's name
	Arch          string // architectures[0], e.g. "Qwen3ForCausalLM"
	VocabSize     int
	Hidden        int
	Layers        int
	ContextLength int     // max_position_embeddings
	EOS           []int32 // end-of-sequence tokens (generation_config.json wins over config.json)
	Defaults      Sampling

	Heads, KVHeads, HeadDim int
	Intermediate            int // dense MLP width
	NormEps                 float32
	TieEmbeddings           bool
	RotaryDim               int
	Rope                    backend.Rope
	Kinds                   []LayerKind // per layer
	Sparse                  []bool      // per layer: MoE MLP instead of the dense one
	MoE                     MoEConfig
	DeltaNet                backend.DeltaNetSpec
	// FP8Block is the tile of a fine-grained FP8 checkpoint's weight
	// scales (weight_block_size, rows then columns); zero otherwise.
	FP8Block [2]int
	// Quantized names how the checkpoint's weights are quantized already
	// ("FP8", "GGUF Q4_K_M"); "" for a float checkpoint.
	Quantized string
	// Embedding is set for an embedding model (a sentence-transformers
	// directory): Forward gives final normed hidden states, not logits.
	Embedding *EmbeddingConfig

	arch *archInfo
	// qkvzApart: a Qwen3-Next file that stores in_proj_qkvz as [q|k|v] and
	// z apart (a GGUF file's attn_qkv and attn_gate, maybe of two types),
	// bound as Qwen3.5's in_proj_qkv and in_proj_z are.
	qkvzApart bool
	// held is the range [first, first+n) of the MoE experts that a rank
	// of a split model holds (split); n 0: all of them.
	held [2]int
	// ranks is how many ranks a split model's config is one of (split);
	// 0: not split.
	ranks int
	// kvWays, when a split model has fewer KV heads than ranks, is the
	// whole model's KV heads: each rank holds the one its query heads read
	// (other ranks hold it too); 0 otherwise.
	kvWays int
	// vocab is the range [first, first+n) of the vocabulary whose
	// embedding and LM head rows a rank of a split model holds; n 0: all.
	vocab [2]int
}

// vocabShare returns the first token whose embedding and LM head rows the
// model holds, and how many.
func (c *Config) vocabShare() (first, n int) {
	if c.vocab[1] == 0 {
		return 0, c.VocabSize
	}
	return c.vocab[0], c.vocab[1]
}

// heldExperts returns the first MoE expert this model holds and how many.
func (c *Config) heldExperts() (first, n int) {
	if c.held[1] == 0 {
		return 0, c.MoE.Experts
	}
	return c.held[0], c.held[1]
}

// split returns the config of rank of a model split across ranks (tensor
// parallel): its share of the query and KV heads, of the Gated DeltaNet's
// key and value heads, of the dense MLPs' and the shared expert's rows,
// and (expert parallel) its range of whole experts (docs/multigpu.md).
func (c *Config) split(rank, ranks int) (*Config, error) {
	d := c.DeltaNet
	dense := c.Intermediate
	if !slices.Contains(c.Sparse, false) {
		dense = 0 // no dense MLP to split
	}
	// Fewer KV heads than ranks: each rank holds the KV head of its query
	// heads (as vLLM replicates them), where the ranks divide by them.
	kvShared := c.KVHeads < ranks && ranks%c.KVHeads == 0
	if c.Heads%ranks != 0 || (c.KVHeads%ranks != 0 && !kvShared) || dense%ranks != 0 || c.MoE.Experts%ranks != 0 || c.MoE.SharedIntermediate%ranks != 0 ||
		d.KeyHeads%ranks != 0 || d.ValueHeads%ranks != 0 || c.VocabSize%ranks != 0 {
		return nil, fmt.Errorf("model %s: %d attention heads, %d KV heads, %d/%d DeltaNet key/value heads, a dense MLP of %d, %d experts, a shared expert of %d and a vocabulary of %d do not split in %d ranks",
			c.Name, c.Heads, c.KVHeads, d.KeyHeads, d.ValueHeads, dense, c.MoE.Experts, c.MoE.SharedIntermediate, c.VocabSize, ranks)
	}
	s := *c
	s.Heads, s.KVHeads, s.Intermediate = c.Heads/ranks, c.KVHeads/ranks, c.Intermediate/ranks
	if kvShared {
		s.KVHeads, s.kvWays = 1, c.KVHeads
	}
	s.MoE.SharedIntermediate /= ranks
	s.DeltaNet.KeyHeads, s.DeltaNet.ValueHeads = d.KeyHeads/ranks, d.ValueHeads/ranks
	if n := c.MoE.Experts / ranks; n > 0 {
		s.held = [2]int{rank * n, n}
	}
	v := c.VocabSize / ranks
	s.vocab = [2]int{rank * v, v}
	s.ranks = ranks
	return &s, nil
}

// archInfo is what differs between the supported architectures.
type archInfo struct {
	hybrid        bool    // Qwen3-Next / Qwen3.5 family: DeltaNet layers, gated attention, 1+w norms
	moe           moeRule // which layers are sparse
	normTopK      bool    // default of norm_topk_prob
	fusedQKVZ     bool    // DeltaNet input projection stored as in_proj_qkvz / in_proj_ba (Qwen3-Next)
	partialRotary float64 // default partial_rotary_factor
}

type moeRule uint8

const (
	noMoE    moeRule = iota
	qwen3MoE         // sparse unless in mlp_only_layers, every decoder_sparse_step-th layer
	allMoE           // every layer
)

var archs = map[string]*archInfo{
	"Qwen3ForCausalLM":                   {partialRotary: 1},
	"Qwen3MoeForCausalLM":                {moe: qwen3MoE, partialRotary: 1},
	"Qwen3NextForCausalLM":               {hybrid: true, moe: qwen3MoE, normTopK: true, fusedQKVZ: true, partialRotary: 0.25},
	"Qwen3_5ForCausalLM":                 {hybrid: true, partialRotary: 0.25},
	"Qwen3_5ForConditionalGeneration":    {hybrid: true, partialRotary: 0.25},
	"Qwen3_5MoeForCausalLM":              {hybrid: true, moe: allMoE, normTopK: true, partialRotary: 0.25},
	"Qwen3_5MoeForConditionalGeneration": {hybrid: true, moe: allMoE, normTopK: true, partialRotary: 0.25},
}

// SupportedArchitectures lists the config.json architectures kiln loads.
func SupportedArchitectures() []string {
	names := make([]string, 0, len(archs))
	for n := range archs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Hybrid reports whether the model mixes DeltaNet and attention layers.
func (c *Config) Hybrid() bool { return c.arch.hybrid }

// AttnSpec returns the shape of the model's attention layers.
func (c *Config) AttnSpec() backend.AttnSpec {
	return backend.AttnSpec{
		Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, RotaryDim: c.RotaryDim,
		Gated: c.arch.hybrid, NormEps: c.NormEps, UnitOffsetNorm: c.arch.hybrid,
		Scale: float32(1 / math.Sqrt(float64(c.HeadDim))), Rope: c.Rope,
	}
}

// rawConfig is config.json (or its text_config), as transformers writes it.
type rawConfig struct {
	Architectures         []string        `json:"architectures"`
	TextConfig            json.RawMessage `json:"text_config"`
	VocabSize             int             `json:"vocab_size"`
	HiddenSize            int             `json:"hidden_size"`
	IntermediateSize      int             `json:"intermediate_size"`
	NumHiddenLayers       int             `json:"num_hidden_layers"`
	NumAttentionHeads     int             `json:"num_attention_heads"`
	NumKeyValueHeads      int             `json:"num_key_value_heads"`
	HeadDim               int             `json:"head_dim"`
	RMSNormEps            *float64        `json:"rms_norm_eps"`
	MaxPositionEmbeddings *int            `json:"max_position_embeddings"`
	TieWordEmbeddings     *bool           `json:"tie_word_embeddings"`
	HiddenAct             string          `json:"hidden_act"`
	AttentionBias         bool            `json:"attention_bias"`
	EOSTokenID            json.RawMessage `json:"eos_token_id"`

	RopeTheta           *float64       `json:"rope_theta"`
	RopeScaling         map[string]any `json:"rope_scaling"`
	RopeParameters      map[string]any `json:"rope_parameters"`
	PartialRotaryFactor *float64       `json:"partial_rotary_factor"`

	LayerTypes            []string `json:"layer_types"`
	FullAttentionInterval int      `json:"full_attention_interval"`
	LinearNumKeyHeads     int      `json:"linear_num_key_heads"`
	LinearNumValueHeads   int      `json:"linear_num_value_heads"`
	LinearKeyHeadDim      int      `json:"linear_key_head_dim"`
	LinearValueHeadDim    int      `json:"linear_value_head_dim"`
	LinearConvKernelDim   int      `json:"linear_conv_kernel_dim"`

	NumExperts                   int   `json:"num_experts"`
	NumLocalExperts              int   `json:"num_local_experts"` // Qwen3-MoE as transformers 5 saves it
	NumExpertsPerTok             int   `json:"num_experts_per_tok"`
	MoEIntermediateSize          int   `json:"moe_intermediate_size"`
	SharedExpertIntermediateSize int   `json:"shared_expert_intermediate_size"`
	NormTopKProb                 *bool `json:"norm_topk_prob"`
	DecoderSparseStep            int   `json:"decoder_sparse_step"`
	MLPOnlyLayers                []int `json:"mlp_only_layers"`

	QuantizationConfig *rawQuantization `json:"quantization_config"`
}

// rawQuantization is config.json's quantization_config.
type rawQuantization struct {
	QuantMethod     string `json:"quant_method"`
	Fmt             string `json:"fmt"`
	WeightBlockSize []int  `json:"weight_block_size"`
}

type rawGeneration struct {
	EOSTokenID  json.RawMessage `json:"eos_token_id"`
	DoSample    *bool           `json:"do_sample"`
	Temperature *float64        `json:"temperature"`
	TopP        *float64        `json:"top_p"`
	TopK        *int            `json:"top_k"`
	MinP        *float64        `json:"min_p"`
	// repetition_penalty as transformers' GenerationConfig spells it.
	RepetitionPenalty *float64 `json:"repetition_penalty"`
}

// ReadConfig reads config.json and, when present, generation_config.json
// from the root of fsys.
func ReadConfig(fsys fs.FS, name string) (*Config, error) {
	data, err := mapfile.ReadFS(fsys, "config.json", maxConfigFile)
	if err != nil {
		// A mistyped path reads as such, not as a config.json missing inside it.
		fi, serr := fs.Stat(fsys, ".")
		switch {
		case errors.Is(serr, fs.ErrNotExist):
			return nil, fmt.Errorf("model %s: no such directory", name)
		case errors.Is(serr, syscall.ENOTDIR) || serr == nil && !fi.IsDir():
			return nil, fmt.Errorf("model %s is a file, not a directory: give the directory that holds config.json", name)
		case errors.Is(err, fs.ErrNotExist):
			return nil, fmt.Errorf("model %s has no config.json", name)
		}
		return nil, fmt.Errorf("model %s: %w", name, err)
	}
	gen, err := mapfile.ReadFS(fsys, "generation_config.json", maxConfigFile)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("model %s: %w", name, err)
	}
	c, err := ParseConfig(data, gen)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", name, err)
	}
	if c.Embedding, err = readEmbedding(fsys); err != nil {
		return nil, fmt.Errorf("model %s: %w", name, err)
	}
	if c.Embedding != nil && c.arch.hybrid {
		return nil, fmt.Errorf("model %s: embeddings of %s are not supported (Qwen3's are)", name, c.Arch)
	}
	c.Name = name
	return c, nil
}

// ParseConfig parses the contents of config.json and generation_config.json
// (nil when the model has none).
func ParseConfig(configJSON, generationJSON []byte) (*Config, error) {
	var top rawConfig
	if err := json.Unmarshal(configJSON, &top); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	if len(top.Architectures) == 0 {
		return nil, fmt.Errorf("config.json names no architecture; kiln supports %s", strings.Join(SupportedArchitectures(), ", "))
	}
	arch, ok := archs[top.Architectures[0]]
	if !ok {
		return nil, fmt.Errorf("unsupported architecture %q; kiln supports %s", top.Architectures[0], strings.Join(SupportedArchitectures(), ", "))
	}
	r := top
	if len(top.TextConfig) > 0 && !bytes.Equal(top.TextConfig, []byte("null")) {
		// Multimodal checkpoints nest the language model's config.
		r = rawConfig{}
		if err := json.Unmarshal(top.TextConfig, &r); err != nil {
			return nil, fmt.Errorf("config.json text_config: %w", err)
		}
		if top.TieWordEmbeddings != nil {
			r.TieWordEmbeddings = top.TieWordEmbeddings
		}
		if len(r.EOSTokenID) == 0 || bytes.Equal(r.EOSTokenID, []byte("null")) {
			r.EOSTokenID = top.EOSTokenID
		}
	}
	c := &Config{Arch: top.Architectures[0], arch: arch}
	if err := c.fill(&r); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	q := top.QuantizationConfig
	if q == nil {
		q = r.QuantizationConfig
	}
	if err := c.fillQuantization(q); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	eos, err := c.parseEOS(r.EOSTokenID)
	if err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	c.EOS = eos
	c.Defaults = Sampling{Temperature: 1, TopP: 1}
	if generationJSON != nil {
		if err := c.fillGeneration(generationJSON); err != nil {
			return nil, fmt.Errorf("generation_config.json: %w", err)
		}
	}
	return c, nil
}

// CheckQuantize reports why the model cannot be quantized to q as it
// loads (Options.Quantize; F32 is none): kiln does not quantize to q, or
// the checkpoint is quantized already. Quantizing its blocks again would
// only lose precision, and loading it as it is would serve another type
// than the one asked for without a word.
func (c *Config) CheckQuantize(q backend.DType) error {
	switch {
	case q == backend.F32:
		return nil
	case !slices.Contains(quant.Quantizable, q):
		return fmt.Errorf("model %s: kiln cannot quantize to %v (it can: fp8, q8_0, q4_k)", c.Name, q)
	case c.Quantized != "":
		return fmt.Errorf("model %s is already quantized (%s); kiln quantizes BF16, F16 and F32 checkpoints at load", c.Name, c.Quantized)
	}
	return nil
}

// fillQuantization accepts Qwen's fine-grained FP8 (e4m3 weights, one
// scale per tile); other methods are named in the error.
func (c *Config) fillQuantization(q *rawQuantization) error {
	if q == nil {
		return nil
	}
	if q.QuantMethod != "fp8" {
		return fmt.Errorf("quantization_config: quant_method %q is not supported; kiln loads Qwen's fp8 checkpoints and GGUF files", q.QuantMethod)
	}
	if q.Fmt != "" && q.Fmt != "e4m3" {
		return fmt.Errorf("quantization_config: fp8 format %q is not supported (e4m3 is)", q.Fmt)
	}
	c.FP8Block = [2]int{128, 128}
	c.Quantized = "FP8"
	if b := q.WeightBlockSize; b != nil {
		if len(b) != 2 || b[0] <= 0 || b[0] > maxDim || b[1] != 128 {
			return fmt.Errorf("quantization_config: weight_block_size %v is not supported (want [N, 128])", b)
		}
		c.FP8Block = [2]int{b[0], b[1]}
	}
	return nil
}

// fillGeneration reads generation_config.json. Its values are checked
// here as the engine checks a request's: an invalid file fails the load
// rather than every request that takes its defaults.
func (c *Config) fillGeneration(data []byte) error {
	var g rawGeneration
	if err := json.Unmarshal(data, &g); err != nil {
		return err
	}
	eos, err := c.parseEOS(g.EOSTokenID)
	if err != nil {
		return err
	}
	if err := checkReals(
		real{"temperature", g.Temperature, 0, math.MaxFloat32, false},
		real{"top_p", g.TopP, 0, 1, false},
		real{"min_p", g.MinP, 0, 1, false},
		real{"repetition_penalty", g.RepetitionPenalty, 0, math.MaxFloat32, true}); err != nil {
		return err
	}
	if g.TopK != nil {
		if err := checkSizes(size{"top_k", *g.TopK, 0, math.MaxInt32}); err != nil {
			return err
		}
	}
	if len(eos) > 0 {
		c.EOS = eos
	}
	if g.Temperature != nil {
		c.Defaults.Temperature = float32(*g.Temperature)
	}
	if g.TopP != nil {
		c.Defaults.TopP = float32(*g.TopP)
	}
	if g.TopK != nil {
		c.Defaults.TopK = *g.TopK
	}
	if g.MinP != nil {
		c.Defaults.MinP = float32(*g.MinP)
	}
	if g.RepetitionPenalty != nil {
		c.Defaults.RepetitionPenalty = float32(*g.RepetitionPenalty)
	}
	if g.DoSample != nil && !*g.DoSample {
		c.Defaults.Temperature = 0
	}
	return nil
}

// parseEOS accepts an int, a list of ints or null; each a token of the
// vocabulary.
func (c *Config) parseEOS(raw json.RawMessage) ([]int32, error) {
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	var list []int32
	var one int32
	if err := json.Unmarshal(raw, &one); err == nil {
		list = []int32{one}
	} else if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("eos_token_id %s is neither an int nor a list of ints", clipJSON(raw))
	}
	if len(list) > maxEOS {
		return nil, fmt.Errorf("eos_token_id lists %d tokens, more than the %d allowed", len(list), maxEOS)
	}
	for _, id := range list {
		if id < 0 || int(id) >= c.VocabSize {
			return nil, fmt.Errorf("eos_token_id %d is outside the vocabulary (0 to %d)", id, c.VocabSize-1)
		}
	}
	return list, nil
}

// clipJSON shortens a JSON value for an error message.
func clipJSON(raw json.RawMessage) string {
	if len(raw) > 64 {
		return string(raw[:64]) + "..."
	}
	return string(raw)
}

func (c *Config) fill(r *rawConfig) error {
	if r.HiddenAct != "" && r.HiddenAct != "silu" {
		return fmt.Errorf("hidden_act %q is not supported (want silu)", r.HiddenAct)
	}
	if r.AttentionBias {
		return errors.New("attention_bias is not supported")
	}
	c.VocabSize, c.Hidden, c.Layers = r.VocabSize, r.HiddenSize, r.NumHiddenLayers
	c.Heads, c.KVHeads, c.HeadDim = r.NumAttentionHeads, r.NumKeyValueHeads, r.HeadDim
	c.Intermediate, c.ContextLength = r.IntermediateSize, defaultContext
	if r.MaxPositionEmbeddings != nil {
		c.ContextLength = *r.MaxPositionEmbeddings
	}
	if err := checkSizes(
		size{"vocab_size", c.VocabSize, 1, maxVocab}, size{"hidden_size", c.Hidden, 1, maxDim},
		size{"num_hidden_layers", c.Layers, 1, maxLayers}, size{"num_attention_heads", c.Heads, 1, maxHeads},
		size{"num_key_value_heads", c.KVHeads, 0, maxHeads}, size{"head_dim", c.HeadDim, 0, maxDim},
		size{"intermediate_size", c.Intermediate, 0, maxDim},
		size{"max_position_embeddings", c.ContextLength, 1, maxContext}); err != nil {
		return err
	}
	if c.KVHeads == 0 {
		c.KVHeads = c.Heads
	}
	if c.HeadDim == 0 {
		if c.HeadDim = c.Hidden / c.Heads; c.HeadDim == 0 {
			return fmt.Errorf("hidden_size %d has no head_dim for %d heads", c.Hidden, c.Heads)
		}
	}
	if c.Heads%c.KVHeads != 0 {
		return fmt.Errorf("num_attention_heads %d is not a multiple of num_key_value_heads %d", c.Heads, c.KVHeads)
	}
	c.NormEps = 1e-6
	if err := checkReals(real{"rms_norm_eps", r.RMSNormEps, 0, 1, true}); err != nil {
		return err
	}
	if r.RMSNormEps != nil {
		c.NormEps = float32(*r.RMSNormEps)
	}
	if r.TieWordEmbeddings != nil {
		c.TieEmbeddings = *r.TieWordEmbeddings
	}
	if err := c.fillRope(r); err != nil {
		return err
	}
	if err := c.fillLayers(r); err != nil {
		return err
	}
	return nil
}

// Bounds on a config's values, far beyond any published model: a corrupt
// or hostile config.json fails with a message naming the field instead of
// making the loader allocate per-layer and per-expert tables that exhaust
// memory before the checkpoint's tensors are ever compared with the config,
// or an engine that sizes its KV cache by a context of 2^63 tokens.
const (
	maxLayers     = 1024
	maxHeads      = 1024
	maxExperts    = 4096
	maxDim        = 1 << 17 // hidden, intermediate and head sizes
	maxVocab      = 1 << 23
	maxContext    = 1 << 24 // Qwen's longest: 1M tokens with YaRN
	maxEOS        = 64
	maxConfigFile = 16 << 20
	// maxConvKernel is the widest DeltaNet conv: the GPU kernels keep a
	// channel's window in registers (Qwen's models use 4).
	maxConvKernel = 8
	// defaultContext is transformers' max_position_embeddings for the Qwen3
	// configs when config.json leaves it out.
	defaultContext = 32768
)

// size is one config value and its bounds.
type size struct {
	name   string
	v      int
	lo, hi int
}

func checkSizes(sizes ...size) error {
	for _, s := range sizes {
		switch {
		case s.v < s.lo && s.lo == 1:
			return fmt.Errorf("%s must be positive, have %d", s.name, s.v)
		case s.v < s.lo:
			return fmt.Errorf("%s %d is out of range (kiln accepts %d to %d)", s.name, s.v, s.lo, s.hi)
		case s.v > s.hi:
			return fmt.Errorf("%s %d is implausibly large (kiln accepts at most %d): is the file corrupt?", s.name, s.v, s.hi)
		}
	}
	return nil
}

// real is one optional float value and its bounds; openLo excludes lo.
type real struct {
	name   string
	v      *float64
	lo, hi float64
	openLo bool
}

func checkReals(reals ...real) error {
	for _, r := range reals {
		if r.v == nil {
			continue
		}
		v := *r.v
		if v >= r.lo && (!r.openLo || v > r.lo) && v <= r.hi {
			continue
		}
		lo := "["
		if r.openLo {
			lo = "("
		}
		if r.hi == math.MaxFloat32 { // no bound but a float32's
			return fmt.Errorf("%s %g is out of range %s%g, 3.4e38]", r.name, v, lo, r.lo)
		}
		return fmt.Errorf("%s %g is out of range %s%g, %g]", r.name, v, lo, r.lo, r.hi)
	}
	return nil
}

func (c *Config) fillLayers(r *rawConfig) error {
	c.Kinds = make([]LayerKind, c.Layers)
	if c.arch.hybrid {
		switch {
		case len(r.LayerTypes) > 0:
			if len(r.LayerTypes) != c.Layers {
				return fmt.Errorf("layer_types has %d entries for %d layers", len(r.LayerTypes), c.Layers)
			}
			for i, t := range r.LayerTypes {
				switch t {
				case "full_attention", "attention":
					c.Kinds[i] = FullAttention
				case "linear_attention":
					c.Kinds[i] = LinearAttention
				default:
					return fmt.Errorf("layer_types[%d] = %q; want full_attention or linear_attention", i, t)
				}
			}
		default:
			if err := checkSizes(size{"full_attention_interval", r.FullAttentionInterval, 0, c.Layers}); err != nil {
				return err
			}
			interval := r.FullAttentionInterval
			if interval <= 0 {
				interval = 4
			}
			for i := range c.Kinds {
				if (i+1)%interval != 0 {
					c.Kinds[i] = LinearAttention
				}
			}
		}
		d := &c.DeltaNet
		d.KeyHeads, d.ValueHeads = r.LinearNumKeyHeads, r.LinearNumValueHeads
		d.KeyDim, d.ValueDim, d.ConvKernel = r.LinearKeyHeadDim, r.LinearValueHeadDim, r.LinearConvKernelDim
		if d.ConvKernel == 0 {
			d.ConvKernel = 4
		}
		d.Chunk = 64
		if err := checkSizes(size{"linear_num_key_heads", d.KeyHeads, 1, maxHeads}, size{"linear_num_value_heads", d.ValueHeads, 1, maxHeads},
			size{"linear_key_head_dim", d.KeyDim, 1, maxDim}, size{"linear_value_head_dim", d.ValueDim, 1, maxDim},
			size{"linear_conv_kernel_dim", d.ConvKernel, 1, maxDim}); err != nil {
			return err
		}
		if d.ConvKernel > maxConvKernel {
			return fmt.Errorf("linear_conv_kernel_dim %d is wider than kiln's convs take (%d taps)", d.ConvKernel, maxConvKernel)
		}
		if d.ValueHeads%d.KeyHeads != 0 {
			return fmt.Errorf("linear_num_value_heads %d is not a multiple of linear_num_key_heads %d", d.ValueHeads, d.KeyHeads)
		}
	}
	c.Sparse = make([]bool, c.Layers)
	if c.arch.moe != noMoE {
		m := &c.MoE
		m.Experts = r.NumExperts
		if m.Experts == 0 {
			m.Experts = r.NumLocalExperts
		}
		m.TopK, m.Intermediate, m.SharedIntermediate = r.NumExpertsPerTok, r.MoEIntermediateSize, r.SharedExpertIntermediateSize
		m.NormTopK = c.arch.normTopK
		if c.arch.moe == qwen3MoE && r.NormTopKProb != nil {
			m.NormTopK = *r.NormTopKProb
		}
		if err := checkSizes(size{"num_experts", m.Experts, 0, maxExperts}, size{"moe_intermediate_size", m.Intermediate, 0, maxDim},
			size{"shared_expert_intermediate_size", m.SharedIntermediate, 0, maxDim}); err != nil {
			return err
		}
		if m.Experts > 0 && (m.TopK <= 0 || m.TopK > m.Experts || m.Intermediate <= 0) {
			return fmt.Errorf("experts: %d of %d per token, intermediate size %d: invalid", m.TopK, m.Experts, m.Intermediate)
		}
		if err := checkSizes(size{"decoder_sparse_step", r.DecoderSparseStep, 0, c.Layers}); err != nil {
			return err
		}
		step := r.DecoderSparseStep
		if step <= 0 {
			step = 1
		}
		dense := map[int]bool{}
		for i, l := range r.MLPOnlyLayers {
			if l < 0 || l >= c.Layers {
				return fmt.Errorf("mlp_only_layers[%d] = %d is not a layer (0 to %d)", i, l, c.Layers-1)
			}
			dense[l] = true
		}
		for i := range c.Sparse {
			c.Sparse[i] = m.Experts > 0 && (c.arch.moe == allMoE || (!dense[i] && (i+1)%step == 0))
		}
	}
	for i, s := range c.Sparse {
		if !s && c.Intermediate <= 0 {
			return fmt.Errorf("layer %d has a dense MLP but intermediate_size is %d", i, c.Intermediate)
		}
	}
	return nil
}

// ropeParams gathers the rotary settings from either spelling:
// rope_theta / rope_scaling / partial_rotary_factor at the top level
// (transformers 4) or one rope_parameters object (transformers 5).
func (c *Config) fillRope(r *rawConfig) error {
	p := map[string]any{"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": c.arch.partialRotary}
	if r.RopeTheta != nil {
		p["rope_theta"] = *r.RopeTheta
	}
	if r.PartialRotaryFactor != nil {
		p["partial_rotary_factor"] = *r.PartialRotaryFactor
	}
	for _, m := range []map[string]any{r.RopeScaling, r.RopeParameters} {
		for k, v := range m {
			if v != nil {
				p[k] = v
			}
		}
	}
	if t, ok := p["type"]; ok && r.RopeParameters["rope_type"] == nil && r.RopeScaling["rope_type"] == nil {
		p["rope_type"] = t // rope_scaling's older key
	}
	rope, dim, err := computeRope(p, c.HeadDim, c.ContextLength)
	if err != nil {
		return err
	}
	c.Rope, c.RotaryDim = rope, dim
	return nil
}

func num(p map[string]any, key string) (float64, bool, error) {
	v, ok := p[key]
	if !ok || v == nil {
		return 0, false, nil
	}
	f, ok := v.(float64)
	if !ok {
		return 0, false, fmt.Errorf("rope %s = %v is not a number", key, v)
	}
	return f, true, nil
}

// computeRope turns rope parameters into inverse frequencies the way
// transformers' ROPE_INIT_FUNCTIONS do (default, linear and yarn).
func computeRope(p map[string]any, headDim, maxPos int) (backend.Rope, int, error) {
	var rope backend.Rope
	get := func(key string, def float64) float64 {
		if f, ok, _ := num(p, key); ok {
			return f
		}
		return def
	}
	for _, k := range []string{"rope_theta", "partial_rotary_factor", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim"} {
		if _, _, err := num(p, k); err != nil {
			return rope, 0, err
		}
	}
	ropeReal := func(key string, hi float64) real {
		if f, ok, _ := num(p, key); ok {
			return real{"rope " + key, &f, 0, hi, true}
		}
		return real{name: key}
	}
	// Zero factor and attention_factor are yarn's "derive it".
	if err := checkReals(ropeReal("rope_theta", 1e12), ropeReal("original_max_position_embeddings", maxContext)); err != nil {
		return rope, 0, err
	}
	for _, k := range []string{"factor", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"} {
		if f, ok, _ := num(p, k); ok && (f < 0 || f > 1e6) {
			return rope, 0, fmt.Errorf("rope %s %g is out of range [0, 1e6]", k, f)
		}
	}
	base := get("rope_theta", 10000)
	dim := int(float64(headDim) * get("partial_rotary_factor", 1))
	if dim <= 0 || dim%2 != 0 || dim > headDim {
		return rope, 0, fmt.Errorf("rotary dimension %d (head_dim %d x partial_rotary_factor) must be even and in (0, head_dim]", dim, headDim)
	}
	half := dim / 2
	pos := make([]float64, half) // base^(2i/d)
	for i := range pos {
		pos[i] = math.Pow(base, float64(2*i)/float64(dim))
	}
	rope.InvFreq = make([]float32, half)
	rope.AttnFactor = 1
	typ, _ := p["rope_type"].(string)
	switch typ {
	case "default", "":
		for i := range pos {
			rope.InvFreq[i] = float32(1 / pos[i])
		}
	case "linear":
		factor := get("factor", 1)
		for i := range pos {
			rope.InvFreq[i] = float32(1 / (factor * pos[i]))
		}
	case "yarn":
		orig := get("original_max_position_embeddings", float64(maxPos))
		factor := get("factor", 0)
		if factor == 0 {
			factor = float64(maxPos) / orig
		}
		mscale := func(scale, m float64) float64 {
			if scale <= 1 {
				return 1
			}
			return 0.1*m*math.Log(scale) + 1
		}
		attn, ok, _ := num(p, "attention_factor")
		if !ok {
			ms, all := get("mscale", 0), get("mscale_all_dim", 0)
			if ms != 0 && all != 0 {
				attn = mscale(factor, ms) / mscale(factor, all)
			} else {
				attn = mscale(factor, 1)
			}
		}
		betaFast, betaSlow := get("beta_fast", 0), get("beta_slow", 0)
		if betaFast == 0 {
			betaFast = 32
		}
		if betaSlow == 0 {
			betaSlow = 1
		}
		corr := func(rot float64) float64 {
			return float64(dim) * math.Log(orig/(rot*2*math.Pi)) / (2 * math.Log(base))
		}
		low, high := corr(betaFast), corr(betaSlow)
		if t, ok := p["truncate"].(bool); !ok || t {
			low, high = math.Floor(low), math.Ceil(high)
		}
		low, high = math.Max(low, 0), math.Min(high, float64(dim-1))
		if low == high {
			high += 0.001
		}
		for i := range pos {
			ramp := math.Min(math.Max((float64(i)-low)/(high-low), 0), 1)
			extrapolation := 1 - ramp // weight of the unscaled frequency
			rope.InvFreq[i] = float32(1/(factor*pos[i])*(1-extrapolation) + 1/pos[i]*extrapolation)
		}
		rope.AttnFactor = float32(attn)
	default:
		return rope, 0, fmt.Errorf("rope_type %q is not supported (kiln supports default, linear and yarn)", typ)
	}
	return rope, dim, nil
}
