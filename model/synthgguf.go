package model

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/gguf"
)

// GGUF files of synthetic models, so that kiln and llama.cpp can be
// measured on the same weights at published shapes.
//
// WriteSyntheticGGUF writes the file llama.cpp's converter
// (convert_hf_to_gguf.py, --outtype f32/f16/bf16) would write from the
// synthetic model's weights saved as a Hugging Face checkpoint: the
// converter's tensor names, shapes and types (norms, routers, the DeltaNet
// conv and the 1-D tensors in F32, the rest in the chosen type), its
// stored transforms (Qwen3-Next's RMSNorm weights as 1 + w, A_log as
// -exp(A_log), in_proj_qkvz split into attn_qkv = [q|k|v] and attn_gate
// = z, experts stacked [E, I, H]) and the hyperparameters it writes. The
// weights are the very values Synthetic gives for the same name, layers,
// seed and dtype, generated again chunk by chunk and streamed, so files
// larger than memory can be written.

// SyntheticGGUFOptions configures WriteSyntheticGGUF.
type SyntheticGGUFOptions struct {
	Layers int    // 0: the published depth
	Seed   uint64 // as SyntheticOptions.Seed
	// DType is the converter's --outtype: F32, F16 or BF16. The weights
	// are Synthetic's in that dtype; the tensors the converter keeps in
	// F32 hold them widened.
	DType backend.DType
	// Vocab, when set, is the tokenizer.* metadata of another GGUF file,
	// written as given; the model's vocab_size becomes the number of its
	// tokens (the embeddings and the LM head are then the first rows of
	// the synthetic model's). When nil, a minimal byte-level BPE
	// vocabulary of the config's vocab_size is made (see SyntheticVocab).
	Vocab []gguf.KV
	// Warn, when set, is told what llama.cpp will not read as kiln does.
	Warn func(string)
	// Progress, when set, is called as tensor bytes are written, with the
	// bytes written so far and in all.
	Progress func(done, total int64)
}

// ggufArchNames maps the architectures WriteSyntheticGGUF writes to
// general.architecture.
var ggufArchNames = map[string]string{
	"Qwen3ForCausalLM":     "qwen3",
	"Qwen3MoeForCausalLM":  "qwen3moe",
	"Qwen3NextForCausalLM": "qwen3next",
}

// SyntheticGGUFNames lists the synthetic models WriteSyntheticGGUF can
// write: those of SyntheticNames whose architecture is in ggufArchNames.
func SyntheticGGUFNames() []string {
	var names []string
	for _, n := range SyntheticNames() {
		if cfg, err := syntheticConfig(n, 0); err == nil && ggufArchNames[cfg.Arch] != "" {
			names = append(names, n)
		}
	}
	return names
}

// GGUF's token types (gguf-py's TokenType).
const (
	tokNormal  = 1
	tokControl = 3
	tokUnused  = 5
)

// WriteSyntheticGGUF writes the named synthetic model (see SyntheticNames;
// the Qwen3, Qwen3-MoE and Qwen3-Next shapes) to w as a GGUF file in
// llama.cpp's layout.
func WriteSyntheticGGUF(w io.Writer, name string, o SyntheticGGUFOptions) error {
	cfg, err := syntheticConfig(name, o.Layers)
	if err != nil {
		return err
	}
	arch, ok := ggufArchNames[cfg.Arch]
	if !ok {
		return fmt.Errorf("model: %s is a %s; GGUF files can be written for %s models", name, cfg.Arch, strings.Join(slices.Sorted(maps.Values(ggufArchNames)), ", "))
	}
	var ftype uint32 // llama.cpp's LLAMA_FTYPE_*
	var outType gguf.Type
	switch o.DType {
	case backend.F32:
		ftype, outType = 0, gguf.F32
	case backend.F16:
		ftype, outType = 1, gguf.F16
	case backend.BF16:
		ftype, outType = 32, gguf.BF16
	default:
		return fmt.Errorf("model: GGUF files of synthetic models are f32, f16 or bf16, not %v (llama-quantize makes the quantized types from them)", o.DType)
	}
	warn := o.Warn
	if warn == nil {
		warn = func(string) {}
	}

	vocab := o.Vocab
	if vocab != nil {
		n := -1
		for _, kv := range vocab {
			if !strings.HasPrefix(kv.Key, "tokenizer.") {
				return fmt.Errorf("model: vocabulary key %q is not a tokenizer.* key", kv.Key)
			}
			if kv.Key == "tokenizer.ggml.tokens" {
				if toks, ok := kv.Value.AsStrings(); ok {
					n = len(toks)
				}
			}
		}
		if n <= 0 {
			return errors.New("model: the vocabulary has no tokenizer.ggml.tokens strings")
		}
		cfg.VocabSize = n
	} else {
		eos := -1
		if len(cfg.EOS) > 0 {
			eos = int(cfg.EOS[0])
		}
		vocab, err = SyntheticVocab(cfg.VocabSize, eos)
		if err != nil {
			return err
		}
	}

	m := &Model{cfg: cfg, attnSpec: cfg.AttnSpec(), dnSpec: cfg.DeltaNet}
	params := m.declare(cfg, "model.")
	outs, err := ggufTensors(cfg, params, outType)
	if err != nil {
		return err
	}
	meta, err := syntheticGGUFMeta(name, arch, cfg, ftype, warn)
	if err != nil {
		return err
	}
	meta = append(meta, vocab...)

	infos := make([]gguf.TensorInfo, len(outs))
	var total int64
	for i, t := range outs {
		infos[i] = t.info
		n, err := t.info.Size()
		if err != nil {
			return err
		}
		total += n
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	sw, err := gguf.NewWriter(bw, meta, infos)
	if err != nil {
		return err
	}
	g := &synthGen{params: params, dt: o.DType, seed: o.Seed, workers: runtime.GOMAXPROCS(0), total: total, progress: o.Progress}
	for _, t := range outs {
		if err := g.write(sw, t); err != nil {
			return err
		}
	}
	if err := sw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

// syntheticGGUFMeta returns the general.* and architecture keys the
// converter writes for cfg (conversion/base.py set_gguf_parameters and the
// Qwen classes' additions).
func syntheticGGUFMeta(name, arch string, cfg *Config, ftype uint32, warn func(string)) ([]gguf.KV, error) {
	var raw rawConfig
	if err := json.Unmarshal([]byte(syntheticConfigs[name]), &raw); err != nil {
		return nil, err
	}
	theta := 10000.0 // transformers' default for the Qwen3 family
	if raw.RopeTheta != nil {
		theta = *raw.RopeTheta
	}
	if len(raw.RopeScaling) > 0 {
		return nil, fmt.Errorf("model: %s: rope_scaling is not written to GGUF files yet", name)
	}
	u := func(v int) gguf.Value { return gguf.Val(uint32(v)) }
	k := func(s string) string { return arch + "." + s }
	meta := []gguf.KV{
		{Key: "general.architecture", Value: gguf.Val(arch)},
		{Key: "general.type", Value: gguf.Val("model")},
		{Key: "general.name", Value: gguf.Val(name)},
		{Key: k("block_count"), Value: u(cfg.Layers)},
		{Key: k("context_length"), Value: u(cfg.ContextLength)},
		{Key: k("embedding_length"), Value: u(cfg.Hidden)},
	}
	if cfg.Intermediate > 0 {
		meta = append(meta, gguf.KV{Key: k("feed_forward_length"), Value: u(cfg.Intermediate)})
	}
	meta = append(meta,
		gguf.KV{Key: k("attention.head_count"), Value: u(cfg.Heads)},
		gguf.KV{Key: k("attention.head_count_kv"), Value: u(cfg.KVHeads)},
		gguf.KV{Key: k("rope.freq_base"), Value: gguf.Val(float32(theta))},
		gguf.KV{Key: k("attention.layer_norm_rms_epsilon"), Value: gguf.Val(cfg.NormEps)},
	)
	moe := cfg.MoE
	if moe.Experts > 0 {
		meta = append(meta,
			gguf.KV{Key: k("expert_count"), Value: u(moe.Experts)},
			gguf.KV{Key: k("expert_used_count"), Value: u(moe.TopK)})
	}
	meta = append(meta,
		gguf.KV{Key: k("attention.key_length"), Value: u(cfg.HeadDim)},
		gguf.KV{Key: k("attention.value_length"), Value: u(cfg.HeadDim)})
	if moe.Experts > 0 {
		meta = append(meta, gguf.KV{Key: k("expert_feed_forward_length"), Value: u(moe.Intermediate)})
		if moe.SharedIntermediate > 0 {
			meta = append(meta, gguf.KV{Key: k("expert_shared_feed_forward_length"), Value: u(moe.SharedIntermediate)})
		}
		var dense []int
		for i, s := range cfg.Sparse {
			if !s {
				dense = append(dense, i)
			}
		}
		if len(dense) > 0 {
			warn(fmt.Sprintf("layers %v have a dense MLP: the file holds ffn_gate/ffn_up/ffn_down there, as the converter writes them; kiln loads it, llama.cpp's %s loader wants experts in every layer and will refuse it", dense, arch))
		}
		if arch == "qwen3moe" && !moe.NormTopK {
			// llama.cpp renormalises Qwen3-MoE's top-k weights whatever
			// the file says; kiln reads this key (and, without it,
			// renormalises too).
			meta = append(meta, gguf.KV{Key: k("expert_weights_norm"), Value: gguf.Val(false)})
			warn(fmt.Sprintf("%s does not renormalise its top-%d routing weights (norm_topk_prob false): the file says so in %s, which kiln follows and llama.cpp ignores (it always renormalises)", name, moe.TopK, k("expert_weights_norm")))
		}
	}
	if cfg.arch.hybrid {
		d := cfg.DeltaNet
		meta = append(meta,
			gguf.KV{Key: k("ssm.conv_kernel"), Value: u(d.ConvKernel)},
			gguf.KV{Key: k("ssm.state_size"), Value: u(d.KeyDim)},
			gguf.KV{Key: k("ssm.group_count"), Value: u(d.KeyHeads)},
			gguf.KV{Key: k("ssm.time_step_rank"), Value: u(d.ValueHeads)},
			gguf.KV{Key: k("ssm.inner_size"), Value: u(d.ValueDim * d.ValueHeads)})
		if len(raw.LayerTypes) > 0 {
			rec := make([]bool, cfg.Layers)
			for i, kind := range cfg.Kinds {
				rec[i] = kind == LinearAttention
			}
			meta = append(meta, gguf.KV{Key: k("attention.recurrent_layers"), Value: gguf.Arr(rec)})
		}
		interval := raw.FullAttentionInterval
		if interval <= 0 {
			interval = 4
		}
		meta = append(meta,
			gguf.KV{Key: k("full_attention_interval"), Value: u(interval)},
			gguf.KV{Key: k("rope.dimension_count"), Value: u(cfg.RotaryDim)})
		if d.ValueDim != d.KeyDim {
			warn(fmt.Sprintf("DeltaNet value heads of %d and key heads of %d: llama.cpp's %s takes both as ssm.state_size and will not load the file", d.ValueDim, d.KeyDim, arch))
		}
	} else if cfg.RotaryDim != cfg.HeadDim {
		meta = append(meta, gguf.KV{Key: k("rope.dimension_count"), Value: u(cfg.RotaryDim)})
	}
	meta = append(meta,
		gguf.KV{Key: "general.file_type", Value: gguf.Val(ftype)},
		gguf.KV{Key: "general.quantization_version", Value: gguf.Val(uint32(2))})
	return meta, nil
}

// chatMLTemplate is the fixtures' chat template: ChatML without tools.
const chatMLTemplate = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

// syntheticMerges are the first merges of GPT-2's and Qwen's vocabularies.
var syntheticMerges = []string{"Ġ Ġ", "Ġ t", "Ġ a", "ĠĠ ĠĠ", "i n", "h e", "ĠĠ Ġ", "r e", "o n", "o r", "Ġt he", "a t", "e r", "Ġ s", "Ġ c", "l e"}

// SyntheticVocab returns the tokenizer.* metadata of a minimal byte-level
// BPE vocabulary of n tokens, which llama.cpp and kiln load as Qwen's
// ("gpt2" model, "qwen2" pre-tokenizer): the 256 byte tokens in GPT-2's
// byte-to-unicode spelling (Qwen's first 256 ids), a few merges, Qwen's
// <|endoftext|>, <|im_start|> and <|im_end|> as control tokens at
// eos-2..eos (after the merges when eos does not leave room), and
// "[PAD<id>]" unused tokens, as the converter writes for ids its
// tokenizer lacks, everywhere else. eos < 0 puts the control tokens last.
func SyntheticVocab(n, eos int) ([]gguf.KV, error) {
	merges := syntheticMerges
	need := 256 + len(merges) + 3
	if n < need {
		return nil, fmt.Errorf("model: a synthetic vocabulary needs at least %d tokens, not %d", need, n)
	}
	tokens := make([]string, n)
	types := make([]int32, n)
	// The ids of the byte tokens follow GPT-2's bytes_to_unicode order,
	// as Qwen's do: the printable bytes first.
	enc := byteEncoder()
	for i, b := range byteOrder() {
		tokens[i] = enc[b]
		types[i] = tokNormal
	}
	for i, mg := range merges {
		tokens[256+i] = strings.Replace(mg, " ", "", 1)
		types[256+i] = tokNormal
	}
	if eos < need-1 || eos >= n {
		eos = n - 1
	}
	for i, s := range []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"} {
		tokens[eos-2+i] = s
		types[eos-2+i] = tokControl
	}
	for i := range tokens {
		if tokens[i] == "" {
			tokens[i] = fmt.Sprintf("[PAD%d]", i)
			types[i] = tokUnused
		}
	}
	return []gguf.KV{
		{Key: "tokenizer.ggml.model", Value: gguf.Val("gpt2")},
		{Key: "tokenizer.ggml.pre", Value: gguf.Val("qwen2")},
		{Key: "tokenizer.ggml.tokens", Value: gguf.Arr(tokens)},
		{Key: "tokenizer.ggml.token_type", Value: gguf.Arr(types)},
		{Key: "tokenizer.ggml.merges", Value: gguf.Arr(append([]string(nil), merges...))},
		{Key: "tokenizer.ggml.eos_token_id", Value: gguf.Val(uint32(eos))},
		{Key: "tokenizer.ggml.padding_token_id", Value: gguf.Val(uint32(eos - 2))},
		{Key: "tokenizer.ggml.bos_token_id", Value: gguf.Val(uint32(eos - 2))},
		{Key: "tokenizer.ggml.add_bos_token", Value: gguf.Val(false)},
		{Key: "tokenizer.chat_template", Value: gguf.Val(chatMLTemplate)},
	}, nil
}

// printableByte reports whether GPT-2's bytes_to_unicode keeps byte b as
// the character of the same number: '!'..'~', '¡'..'¬' and '®'..'ÿ'.
func printableByte(b byte) bool {
	return b >= '!' && b <= '~' || b >= 0xa1 && b <= 0xac || b >= 0xae
}

// byteOrder lists the bytes in the order of bytes_to_unicode: the
// printable ones, then the rest.
func byteOrder() []byte {
	var out []byte
	for _, want := range []bool{true, false} {
		for b := range 256 {
			if printableByte(byte(b)) == want {
				out = append(out, byte(b))
			}
		}
	}
	return out
}

// byteEncoder is GPT-2's bytes_to_unicode: printable bytes stand for
// themselves, the others for U+0100 onwards in byte order.
func byteEncoder() map[byte]string {
	enc := map[byte]string{}
	next := 0
	for _, b := range byteOrder() {
		if printableByte(b) {
			enc[b] = string(rune(b))
		} else {
			enc[b] = string(rune(256 + next))
			next++
		}
	}
	return enc
}

// synthTensor is one tensor of the file: its record and where its rows come
// from among the synthetic model's weights.
type synthTensor struct {
	info gguf.TensorInfo
	segs []synthSeg
	// xform is the converter's stored transform of each value, if any.
	xform func(float32) float32
}

// synthSeg is rows row0..row0+rows of weight param (rows as matrixOf
// counts them, in the order Synthetic holds them).
type synthSeg struct{ param, row0, rows int }

var hfLayer = regexp.MustCompile(`^model\.layers\.(\d+)\.(.+)$`)

// ggufLayerNames maps the rest of an HF layer tensor's name to the
// converter's (gguf-py's tensor_mapping for qwen3, qwen3moe, qwen3next).
var ggufLayerNames = map[string]string{
	"input_layernorm.weight":             "attn_norm.weight",
	"self_attn.q_proj.weight":            "attn_q.weight",
	"self_attn.k_proj.weight":            "attn_k.weight",
	"self_attn.v_proj.weight":            "attn_v.weight",
	"self_attn.o_proj.weight":            "attn_output.weight",
	"self_attn.q_norm.weight":            "attn_q_norm.weight",
	"self_attn.k_norm.weight":            "attn_k_norm.weight",
	"mlp.gate_proj.weight":               "ffn_gate.weight",
	"mlp.up_proj.weight":                 "ffn_up.weight",
	"mlp.down_proj.weight":               "ffn_down.weight",
	"mlp.gate.weight":                    "ffn_gate_inp.weight",
	"mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
	"mlp.shared_expert.up_proj.weight":   "ffn_up_shexp.weight",
	"mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
	"mlp.shared_expert_gate.weight":      "ffn_gate_inp_shexp.weight",
	"linear_attn.conv1d.weight":          "ssm_conv1d.weight",
	"linear_attn.A_log":                  "ssm_a",
	"linear_attn.dt_bias":                "ssm_dt.bias",
	"linear_attn.norm.weight":            "ssm_norm.weight",
	"linear_attn.out_proj.weight":        "ssm_out.weight",
	"linear_attn.in_proj_ba.weight":      "ssm_ba.weight",
}

var hfExpert = regexp.MustCompile(`^mlp\.experts\.\d+\.(gate|up|down)_proj\.weight$`)

// ggufName returns the converter's name of an HF tensor, and whether it is
// one of a stack (the experts).
func ggufName(cfg *Config, hf string) (string, bool, error) {
	switch hf {
	case "model.embed_tokens.weight":
		return "token_embd.weight", false, nil
	case "model.norm.weight":
		return "output_norm.weight", false, nil
	case "lm_head.weight":
		return "output.weight", false, nil
	}
	m := hfLayer.FindStringSubmatch(hf)
	if m == nil {
		return "", false, fmt.Errorf("model: no GGUF name for %s", hf)
	}
	blk, rest := "blk."+m[1]+".", m[2]
	if e := hfExpert.FindStringSubmatch(rest); e != nil {
		return blk + "ffn_" + e[1] + "_exps.weight", true, nil
	}
	if rest == "post_attention_layernorm.weight" {
		if cfg.arch.hybrid {
			return blk + "post_attention_norm.weight", false, nil
		}
		return blk + "ffn_norm.weight", false, nil
	}
	if g, ok := ggufLayerNames[rest]; ok {
		return blk + g, false, nil
	}
	return "", false, fmt.Errorf("model: no GGUF name for %s", hf)
}

// keptF32 says whether the converter stores a tensor in F32 whatever the
// --outtype: 1-D tensors, norms, routers, the DeltaNet conv, and tensors
// not named *.weight (conversion/base.py prepare_tensors).
func keptF32(name string, shape []int) bool {
	return len(shape) <= 1 || strings.HasSuffix(name, "_norm.weight") || !strings.HasSuffix(name, ".weight") ||
		strings.HasSuffix(name, ".ffn_gate_inp.weight") || strings.HasSuffix(name, ".ffn_gate_inp_shexp.weight") ||
		strings.HasSuffix(name, ".ssm_conv1d.weight")
}

// ggufTensors lays the model's weights out as the converter writes them.
func ggufTensors(cfg *Config, params []param, outType gguf.Type) ([]*synthTensor, error) {
	var outs []*synthTensor
	byName := map[string]*synthTensor{}
	// add appends rows of param i to the named tensor, making it with
	// the given shape (a stack's count grows with its parts).
	add := func(name string, shape []int, stacked bool, hf string, seg synthSeg) {
		t := byName[name]
		if t == nil {
			if stacked {
				shape = append([]int{0}, shape...)
			}
			if strings.HasSuffix(name, ".ffn_gate_inp_shexp.weight") {
				shape = squeeze(shape) // [1, H] in HF; the converter's file holds [H]
			}
			t = &synthTensor{info: gguf.TensorInfo{Name: name, Type: outType, Shape: append([]int(nil), shape...)}}
			if keptF32(name, t.info.Shape) {
				t.info.Type = gguf.F32
			}
			switch {
			case strings.HasSuffix(hf, ".A_log"):
				t.xform = negExpOf
			case cfg.arch.hybrid && strings.HasSuffix(hf, "norm.weight") && !strings.HasSuffix(hf, "linear_attn.norm.weight"):
				t.xform = plusOne
			}
			byName[name] = t
			outs = append(outs, t)
		}
		if stacked {
			t.info.Shape[0]++
		}
		if n := len(t.segs); n > 0 && t.segs[n-1].param == seg.param && t.segs[n-1].row0+t.segs[n-1].rows == seg.row0 {
			t.segs[n-1].rows += seg.rows
			return
		}
		t.segs = append(t.segs, seg)
	}
	for i := range params {
		p := &params[i]
		rows, cols := matrixOf(p.shape)
		hf := p.layouts[0][0].name
		switch {
		case strings.HasSuffix(hf, ".in_proj_qkvz.weight"):
			// Synthetic holds it as [q all | k all | v all | z all], the
			// converter's attn_qkv and attn_gate one after the other.
			blk := "blk." + hfLayer.FindStringSubmatch(hf)[1] + "."
			conv := cfg.DeltaNet.ConvDim()
			add(blk+"attn_qkv.weight", []int{conv, cols}, false, hf, synthSeg{i, 0, conv})
			add(blk+"attn_gate.weight", []int{rows - conv, cols}, false, hf, synthSeg{i, conv, rows - conv})
			continue
		case p.rows != nil:
			// Synthetic holds the rows permuted as the binder permutes the
			// checkpoint's (row k is the file's row p.rows[k]); the file
			// keeps the checkpoint's order.
			name, _, err := ggufName(cfg, hf)
			if err != nil {
				return nil, err
			}
			inv := make([]int, len(p.rows))
			for k, r := range p.rows {
				inv[r] = k
			}
			for _, k := range inv {
				add(name, p.shape, false, hf, synthSeg{i, k, 1})
			}
			continue
		}
		off := 0
		for _, pt := range p.layouts[0] {
			n := numel(pt.shape) / cols
			name, stacked, err := ggufName(cfg, pt.name)
			if err != nil {
				return nil, err
			}
			add(name, pt.shape, stacked, pt.name, synthSeg{i, off, n})
			off += n
		}
		if off != rows {
			return nil, fmt.Errorf("model: the parts of %s hold %d rows, the weight %d", hf, off, rows)
		}
	}
	for _, t := range outs {
		n := 0
		for _, s := range t.segs {
			n += s.rows
		}
		if n*t.info.Shape[len(t.info.Shape)-1] != numel(t.info.Shape) {
			return nil, fmt.Errorf("model: GGUF tensor %s %v gets %d rows", t.info.Name, t.info.Shape, n)
		}
	}
	return outs, nil
}

func plusOne(v float32) float32 { return v + 1 }

// negExpOf returns -exp(a), as the converter stores A_log: of the float32
// values nearest it, the one whose log kiln's reader (float32 of the
// float64 log) takes back to a, or nearest to it.
func negExpOf(a float32) float32 {
	x := float32(-math.Exp(float64(a)))
	best, bestErr := x, math.Inf(1)
	for _, dir := range []float32{float32(math.Inf(-1)), float32(math.Inf(1))} {
		c := x
		for range 8 {
			back := float32(math.Log(-float64(c)))
			if e := math.Abs(float64(back) - float64(a)); e < bestErr {
				best, bestErr = c, e
			}
			if bestErr == 0 {
				return best
			}
			c = math.Nextafter32(c, dir)
		}
	}
	return best
}

// synthGen generates a synthetic model's weights as Synthetic does, chunk
// by chunk, and streams them into a file.
type synthGen struct {
	params   []param
	dt       backend.DType
	seed     uint64
	workers  int
	done     int64
	total    int64
	progress func(done, total int64)
}

// chunkKey names chunk c of weight param.
type chunkKey struct{ param, c int }

// piece is rows from..to of a chunk, relative to its first row.
type piece struct {
	key      chunkKey
	from, to int
}

// maxBatch is how many chunks (64K values each) are generated at once.
const maxBatch = 64

// batch is consecutive pieces of a tensor and the chunks they read that
// the batch before did not generate.
type batch struct {
	pieces []piece
	keys   []chunkKey
	data   map[chunkKey][]byte
}

// write streams tensor t's bytes into sw. The chunks of the next batch are
// generated while a batch is written.
func (g *synthGen) write(sw *gguf.Writer, t *synthTensor) error {
	var pieces []piece
	for _, s := range t.segs {
		_, cols := matrixOf(g.params[s.param].shape)
		per := synthChunkRows(g.dt, cols)
		for r := s.row0; r < s.row0+s.rows; {
			c := r / per
			end := min((c+1)*per, s.row0+s.rows)
			pieces = append(pieces, piece{chunkKey{s.param, c}, r - c*per, end - c*per})
			r = end
		}
	}
	var batches []*batch
	prev := map[chunkKey]bool{}
	for len(pieces) > 0 {
		b := &batch{}
		have := map[chunkKey]bool{}
		n := 0
		for ; n < len(pieces); n++ {
			k := pieces[n].key
			if have[k] || prev[k] {
				continue
			}
			if len(b.keys) == maxBatch {
				break
			}
			have[k] = true
			b.keys = append(b.keys, k)
		}
		b.pieces, pieces = pieces[:n], pieces[n:]
		batches = append(batches, b)
		prev = have
	}

	ready := make(chan *batch, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		defer close(ready)
		for _, b := range batches {
			b.data = g.generate(b.keys, t)
			select {
			case ready <- b:
			case <-stop:
				return
			}
		}
	}()
	size := 4
	if t.info.Type != gguf.F32 {
		size = 2
	}
	var last map[chunkKey][]byte
	for b := range ready {
		for _, pc := range b.pieces {
			_, cols := matrixOf(g.params[pc.key.param].shape)
			chunk, ok := b.data[pc.key]
			if !ok {
				chunk = last[pc.key]
			}
			data := chunk[pc.from*cols*size : pc.to*cols*size]
			if _, err := sw.Write(data); err != nil {
				return err
			}
			g.done += int64(len(data))
			if g.progress != nil {
				g.progress(g.done, g.total)
			}
		}
		last, b.data = b.data, nil // batches holds every batch till the end
	}
	return nil
}

// generate returns the chunks of keys with their values as tensor t
// stores them, made over g.workers goroutines.
func (g *synthGen) generate(keys []chunkKey, t *synthTensor) map[chunkKey][]byte {
	out := make([][]byte, len(keys))
	var wg sync.WaitGroup
	workers := min(g.workers, len(keys))
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := w; j < len(keys); j += workers {
				out[j] = g.chunk(keys[j], t)
			}
		}()
	}
	wg.Wait()
	chunks := make(map[chunkKey][]byte, len(keys))
	for j, k := range keys {
		chunks[k] = out[j]
	}
	return chunks
}

// chunk returns one chunk of a weight's values, drawn as binder.synthesize
// draws them, rounded to the synthetic dtype, transformed as t says and
// encoded in t's type.
func (g *synthGen) chunk(k chunkKey, t *synthTensor) []byte {
	p := &g.params[k.param]
	rows, cols := matrixOf(p.shape)
	per := synthChunkRows(g.dt, cols)
	r0, r1 := k.c*per, min((k.c+1)*per, rows)
	rng := synthRNG(g.seed, uint64(k.param), k.c)
	n := (r1 - r0) * cols
	var out []byte
	if t.info.Type == gguf.F32 {
		out = make([]byte, 4*n)
	} else {
		out = make([]byte, 2*n)
	}
	if t.xform == nil && (t.info.Type == gguf.F16 && g.dt == backend.F16 || t.info.Type == gguf.BF16 && g.dt == backend.BF16) {
		// Stored as Synthetic holds it: its very bits.
		for i := range n {
			putFloat(out[2*i:], g.dt, p.init.sample(&rng, p.shape))
		}
		return out
	}
	for i := range n {
		v := roundTo(g.dt, p.init.sample(&rng, p.shape))
		if t.xform != nil {
			v = t.xform(v)
		}
		switch t.info.Type {
		case gguf.F32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		case gguf.F16:
			binary.LittleEndian.PutUint16(out[2*i:], backend.F16Bits(v))
		case gguf.BF16:
			binary.LittleEndian.PutUint16(out[2*i:], backend.BF16Bits(v))
		}
	}
	return out
}

// roundTo returns v as a weight of type dt holds it.
func roundTo(dt backend.DType, v float32) float32 {
	switch dt {
	case backend.F16:
		return backend.F16ToF32(backend.F16Bits(v))
	case backend.BF16:
		return backend.BF16ToF32(backend.BF16Bits(v))
	}
	return v
}
