package model

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/gguf"
	"github.com/kiln-llm/kiln/safetensors"
)

// GGUF files, as llama.cpp's converter and quantizer write them.
//
// A GGUF file is read as if it were the Hugging Face checkpoint it was made
// from: its metadata becomes a config.json, and ggufSource answers the
// binder's requests for HF tensor names with the file's tensors, renamed
// (blk.N.attn_q for model.layers.N.self_attn.q_proj), sliced (one expert of
// ffn_gate_exps) or undone where the converter changed them: Qwen3-Next's
// RMSNorm weights are stored as 1 + w and A_log as -exp(A_log); its
// in_proj_qkvz comes split into [q|k|v] (attn_qkv) and z (attn_gate), maybe
// of two quantized types, which the model binds apart (Config.qkvzApart).
// Everything else, the quantized blocks included, is used in place.

// ggufArchs maps general.architecture to the HF architecture it came from.
var ggufArchs = map[string]string{
	"qwen3":     "Qwen3ForCausalLM",
	"qwen3moe":  "Qwen3MoeForCausalLM",
	"qwen3next": "Qwen3NextForCausalLM",
	"qwen35":    "Qwen3_5ForCausalLM",
	"qwen35moe": "Qwen3_5MoeForCausalLM",
}

// GGUFFile returns the GGUF file path names: path itself when it is a
// .gguf file (or any file that starts with GGUF's magic), or the one .gguf file of a directory that holds no
// config.json; ok is false for anything else (a HF model directory).
func GGUFFile(path string) (file string, ok bool, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		if strings.HasSuffix(strings.ToLower(path), ".gguf") {
			return "", false, fmt.Errorf("model %s: no such file", path)
		}
		return "", false, nil // Load reports the missing directory
	}
	if !fi.IsDir() {
		// By name, or by magic: Ollama's blobs are named by their digest.
		return path, strings.HasSuffix(strings.ToLower(path), ".gguf") || gguf.IsGGUF(path), nil
	}
	if _, err := os.Stat(filepath.Join(path, "config.json")); err == nil {
		return "", false, nil
	}
	files, _ := filepath.Glob(filepath.Join(path, "*.gguf"))
	switch len(files) {
	case 0:
		return "", false, nil
	case 1:
		return files[0], true, nil
	}
	return "", false, fmt.Errorf("model %s holds %d GGUF files (%s); give the one to load", path, len(files), strings.Join(baseNames(files), ", "))
}

func baseNames(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = filepath.Base(p)
	}
	return out
}

// ReadPathConfig reads the configuration of the model at path: a Hugging
// Face model directory or a GGUF file (or a directory holding one).
func ReadPathConfig(path string) (*Config, error) {
	file, ok, err := GGUFFile(path)
	if err != nil {
		return nil, err
	}
	if !ok {
		return ReadConfig(os.DirFS(path), path)
	}
	f, err := gguf.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c, err := GGUFConfig(f)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", path, err)
	}
	c.Name = strings.TrimSuffix(filepath.Base(file), filepath.Ext(file))
	return c, nil
}

// LoadGGUF reads the model in a GGUF file; its tensors are memory-mapped
// and stay mapped until Close.
func LoadGGUF(path string, b backend.Backend, opts Options) (*Model, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	m, err := loadGGUF(f, b, opts)
	if err != nil {
		f.Close()
		return nil, err
	}
	return m, nil
}

// loadGGUF builds the model of f on b. The model keeps f open when it
// reads its weights in place; on an error the caller closes f.
func loadGGUF(f *gguf.File, b backend.Backend, opts Options) (*Model, error) {
	name := strings.TrimSuffix(filepath.Base(f.Name), filepath.Ext(f.Name))
	cfg, err := GGUFConfig(f)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", name, err)
	}
	cfg.Name = name
	if err := cfg.CheckQuantize(opts.Quantize); err != nil {
		return nil, err
	}
	src := &ggufSource{f: f, cfg: cfg, made: map[string]*safetensors.Tensor{}, errs: map[string]error{}}
	bd := &binder{b: b, src: src, where: f.Name, progress: opts.Progress, quantize: opts.Quantize, dequantize: opts.Dequantize}
	if bd.rank, bd.ranks, err = opts.tensorParallel(b); err != nil {
		return nil, err
	}
	m, err := build(cfg, b, bd, opts.KVDType)
	if err != nil {
		return nil, err
	}
	if !b.WeightsInPlace() {
		f.Close() // as in load: the weights are on the device
		return m, nil
	}
	bd.release()
	m.closer = f
	return m, nil
}

// GGUFConfig reads a model's configuration from a GGUF file's metadata.
func GGUFConfig(f *gguf.File) (*Config, error) {
	arch := f.Architecture()
	hf, ok := ggufArchs[arch]
	if !ok {
		return nil, fmt.Errorf("GGUF architecture %q is not supported; kiln loads qwen3, qwen3moe, qwen3next, qwen35 and qwen35moe", arch)
	}
	key := func(k string) string { return arch + "." + k }
	cfg := map[string]any{"architectures": []string{hf}}
	ints := []struct{ gguf, hf string }{
		{"embedding_length", "hidden_size"}, {"block_count", "num_hidden_layers"},
		{"feed_forward_length", "intermediate_size"}, {"attention.head_count", "num_attention_heads"},
		{"attention.head_count_kv", "num_key_value_heads"}, {"attention.key_length", "head_dim"},
		{"context_length", "max_position_embeddings"}, {"expert_count", "num_experts"},
		{"expert_used_count", "num_experts_per_tok"}, {"expert_feed_forward_length", "moe_intermediate_size"},
		{"expert_shared_feed_forward_length", "shared_expert_intermediate_size"},
		{"ssm.conv_kernel", "linear_conv_kernel_dim"}, {"ssm.state_size", "linear_key_head_dim"},
		{"ssm.group_count", "linear_num_key_heads"}, {"ssm.time_step_rank", "linear_num_value_heads"},
		{"full_attention_interval", "full_attention_interval"},
	}
	for _, k := range ints {
		if v, ok := f.Uint(key(k.gguf)); ok {
			cfg[k.hf] = v
		}
	}
	if v, ok := f.Float(key("attention.layer_norm_rms_epsilon")); ok {
		cfg["rms_norm_eps"] = v
	}
	if v, ok := f.Float(key("rope.freq_base")); ok {
		cfg["rope_theta"] = v
	}
	if inner, ok := f.Uint(key("ssm.inner_size")); ok {
		if hv, ok := f.Uint(key("ssm.time_step_rank")); ok && hv > 0 {
			cfg["linear_value_head_dim"] = inner / hv
		}
	}
	if rd, ok := f.Uint(key("rope.dimension_count")); ok {
		if hd, ok := f.Uint(key("attention.key_length")); ok && hd > 0 {
			cfg["partial_rotary_factor"] = float64(rd) / float64(hd)
		}
	}
	if t, ok := f.String(key("rope.scaling.type")); ok && t == "yarn" {
		factor, _ := f.Float(key("rope.scaling.factor"))
		orig, _ := f.Uint(key("rope.scaling.original_context_length"))
		cfg["rope_scaling"] = map[string]any{"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": orig}
	}
	if v, ok := f.Bool(key("expert_weights_norm")); ok {
		cfg["norm_topk_prob"] = v
	} else if arch == "qwen3moe" {
		cfg["norm_topk_prob"] = true // llama.cpp always renormalises Qwen3-MoE's top k
	}
	if rec, ok := f.Value(key("attention.recurrent_layers")); ok {
		if flags, ok := rec.Any().([]bool); ok {
			types := make([]string, len(flags))
			for i, r := range flags {
				types[i] = "full_attention"
				if r {
					types[i] = "linear_attention"
				}
			}
			cfg["layer_types"] = types
		}
	}
	// The layers are the blk.N groups the file holds: a block_count that
	// says otherwise is a damaged file, not a bigger model.
	blocks := 0
	for _, t := range f.Tensors {
		if rest, ok := strings.CutPrefix(t.Name, "blk."); ok {
			if i := strings.IndexByte(rest, '.'); i > 0 {
				if n, err := strconv.Atoi(rest[:i]); err == nil && n >= blocks {
					blocks = n + 1
				}
			}
		}
	}
	if n, ok := f.Uint(key("block_count")); !ok || n != uint64(blocks) {
		return nil, fmt.Errorf("GGUF file %s: %s.block_count is %v but the file holds %d blocks", f.Name, arch, f.Meta[key("block_count")], blocks)
	}
	emb, ok := f.Tensor("token_embd.weight")
	if !ok || len(emb.Shape) != 2 {
		return nil, fmt.Errorf("GGUF file %s has no token_embd.weight matrix", f.Name)
	}
	cfg["vocab_size"] = emb.Shape[0]
	_, hasOutput := f.Tensor("output.weight")
	cfg["tie_word_embeddings"] = !hasOutput
	// MoE files hold experts in some layers: the others are dense.
	if _, ok := cfg["num_experts"]; ok {
		layers, _ := f.Uint(key("block_count"))
		var dense []int
		for i := range int(min(layers, 1<<16)) {
			if _, ok := f.Tensor(fmt.Sprintf("blk.%d.ffn_gate_inp.weight", i)); !ok {
				dense = append(dense, i)
			}
		}
		cfg["mlp_only_layers"] = dense
		cfg["decoder_sparse_step"] = 1
	}
	var eos []int64
	for _, k := range []string{"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"} {
		if v, ok := f.Uint(k); ok && !containsInt(eos, int64(v)) {
			eos = append(eos, int64(v))
		}
	}
	if len(eos) > 0 {
		cfg["eos_token_id"] = eos
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	c, err := ParseConfig(data, nil)
	if err != nil {
		return nil, fmt.Errorf("GGUF metadata: %s", strings.TrimPrefix(err.Error(), "config.json: "))
	}
	// llama.cpp's converter reorders Qwen3.5's value heads (z, b, a, A_log,
	// dt_bias, the conv's and out_proj's value channels with them) so that
	// value head h reads key head h % HK; the DeltaNet takes them so.
	c.DeltaNet.TiledHeads = c.arch.hybrid && !c.arch.fusedQKVZ && c.DeltaNet.KeyHeads != c.DeltaNet.ValueHeads
	c.qkvzApart = c.arch.fusedQKVZ
	for _, t := range f.Tensors {
		if e, _ := t.Type.Block(); e > 1 {
			c.Quantized = "GGUF " + cmp.Or(f.FileType(), t.Type.String())
			break
		}
	}
	return c, nil
}

func containsInt(s []int64, v int64) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// ggufSource answers the binder's HF tensor names from a GGUF file.
type ggufSource struct {
	f    *gguf.File
	cfg  *Config
	made map[string]*safetensors.Tensor // tensors computed from the file's, by HF name
	errs map[string]error               // why a name could not be served
}

var layerName = regexp.MustCompile(`^model\.layers\.(\d+)\.(.+)$`)

// layerTensors maps the rest of an HF layer tensor's name to GGUF's.
var layerTensors = map[string][]string{
	"input_layernorm.weight":             {"attn_norm.weight"},
	"post_attention_layernorm.weight":    {"post_attention_norm.weight", "ffn_norm.weight"},
	"self_attn.q_proj.weight":            {"attn_q.weight"},
	"self_attn.k_proj.weight":            {"attn_k.weight"},
	"self_attn.v_proj.weight":            {"attn_v.weight"},
	"self_attn.o_proj.weight":            {"attn_output.weight"},
	"self_attn.q_norm.weight":            {"attn_q_norm.weight"},
	"self_attn.k_norm.weight":            {"attn_k_norm.weight"},
	"mlp.gate_proj.weight":               {"ffn_gate.weight"},
	"mlp.up_proj.weight":                 {"ffn_up.weight"},
	"mlp.down_proj.weight":               {"ffn_down.weight"},
	"mlp.gate.weight":                    {"ffn_gate_inp.weight"},
	"mlp.shared_expert.gate_proj.weight": {"ffn_gate_shexp.weight"},
	"mlp.shared_expert.up_proj.weight":   {"ffn_up_shexp.weight"},
	"mlp.shared_expert.down_proj.weight": {"ffn_down_shexp.weight"},
	"mlp.shared_expert_gate.weight":      {"ffn_gate_inp_shexp.weight"},
	"linear_attn.in_proj_ba.weight":      {"ssm_ba.weight"},
	"linear_attn.in_proj_qkv.weight":     {"attn_qkv.weight"},
	"linear_attn.in_proj_z.weight":       {"attn_gate.weight"},
	"linear_attn.in_proj_b.weight":       {"ssm_beta.weight"},
	"linear_attn.in_proj_a.weight":       {"ssm_alpha.weight"},
	"linear_attn.conv1d.weight":          {"ssm_conv1d.weight"},
	"linear_attn.dt_bias":                {"ssm_dt.bias"},
	"linear_attn.norm.weight":            {"ssm_norm.weight"},
	"linear_attn.out_proj.weight":        {"ssm_out.weight"},
}

var expertName = regexp.MustCompile(`^mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight$`)

func (s *ggufSource) Tensor(name string) (*safetensors.Tensor, bool) {
	if t, ok := s.made[name]; ok {
		return t, t != nil
	}
	t, err := s.tensor(name)
	if err == nil && t == nil {
		if g := s.layerNames(name); len(g) > 0 {
			err = fmt.Errorf("the file has no tensor %s (kiln's %s)", strings.Join(g, " or "), name)
		}
	}
	if err != nil {
		s.errs[name] = err
	}
	s.made[name] = t
	return t, t != nil
}

// TensorErr says why name could not be served: a tensor the file has in a
// form kiln cannot read, or lacks (named as the file would name it).
func (s *ggufSource) TensorErr(name string) error { return s.errs[name] }

// layerNames are the file's names that a layer's HF tensor name is read
// from, in the order tried; none for other names.
func (s *ggufSource) layerNames(name string) []string {
	m := layerName.FindStringSubmatch(name)
	if m == nil {
		return nil
	}
	var g []string
	for _, n := range layerTensors[m[2]] {
		g = append(g, "blk."+m[1]+"."+n)
	}
	return g
}

// tensor returns the file's tensor for an HF name, nil if it has none.
func (s *ggufSource) tensor(name string) (*safetensors.Tensor, error) {
	hybrid := s.cfg.arch.hybrid
	switch name {
	case "model.embed_tokens.weight":
		return s.plain(name, "token_embd.weight"), nil
	case "lm_head.weight":
		return s.plain(name, "output.weight"), nil
	case "model.norm.weight":
		return s.norm(name, "output_norm.weight", hybrid)
	}
	m := layerName.FindStringSubmatch(name)
	if m == nil {
		return nil, nil
	}
	blk, rest := "blk."+m[1]+".", m[2]
	switch {
	case rest == "linear_attn.A_log":
		return s.aLog(name, blk+"ssm_a")
	case strings.HasSuffix(rest, "norm.weight") && rest != "linear_attn.norm.weight":
		for _, g := range layerTensors[rest] {
			if t, err := s.norm(name, blk+g, hybrid); t != nil || err != nil {
				return t, err
			}
		}
		return nil, nil
	}
	if e := expertName.FindStringSubmatch(rest); e != nil {
		return s.expert(name, blk, e[1], e[2])
	}
	for _, g := range layerTensors[rest] {
		if t := s.plain(name, blk+g); t != nil {
			return t, nil
		}
	}
	return nil, nil
}

// plain returns a file tensor under an HF name, as stored.
func (s *ggufSource) plain(name, g string) *safetensors.Tensor {
	t, ok := s.f.Tensor(g)
	if !ok {
		return nil
	}
	return &safetensors.Tensor{Name: name, DType: t.Type.String(), Shape: t.Shape, Data: t.Data, File: s.f.Name}
}

// floats returns a small float tensor's values.
func (s *ggufSource) floats(g string) (*gguf.Tensor, []float32, error) {
	t, ok := s.f.Tensor(g)
	if !ok {
		return nil, nil, nil
	}
	dt, ok := dtypeOf(t.Type.String())
	if !ok || dt.Quantized() {
		return nil, nil, fmt.Errorf("tensor %s is %v; want a float type", g, t.Type)
	}
	return t, floatsOf(dt, t.Data, []int{len(t.Data) / dt.Size()}), nil
}

func f32Tensor(name, file string, shape []int, v []float32) *safetensors.Tensor {
	return &safetensors.Tensor{Name: name, DType: "F32", Shape: shape, Data: f32Bytes(v), File: file}
}

// norm returns an RMSNorm weight; the hybrid models' converter stored 1 + w
// where the model weighs by (1 + w), so w is given back.
func (s *ggufSource) norm(name, g string, unitOffset bool) (*safetensors.Tensor, error) {
	if !unitOffset {
		return s.plain(name, g), nil
	}
	t, v, err := s.floats(g)
	if t == nil || err != nil {
		return nil, err
	}
	for i := range v {
		v[i]--
	}
	return f32Tensor(name, s.f.Name, t.Shape, v), nil
}

// aLog recovers A_log from ssm_a = -exp(A_log).
func (s *ggufSource) aLog(name, g string) (*safetensors.Tensor, error) {
	t, v, err := s.floats(g)
	if t == nil || err != nil {
		return nil, err
	}
	for i, a := range v {
		if !(a < 0) {
			return nil, fmt.Errorf("tensor %s holds %v; -exp(A_log) is negative", g, a)
		}
		v[i] = float32(math.Log(-float64(a)))
	}
	return f32Tensor(name, s.f.Name, t.Shape, v), nil
}

// expert returns one expert's projection: rows of the stacked tensor
// (ffn_gate_exps [E, I, H]), or of the fused gate|up stack.
func (s *ggufSource) expert(name, blk, e, proj string) (*safetensors.Tensor, error) {
	i, _ := strconv.Atoi(e)
	g, half := blk+"ffn_"+proj+"_exps.weight", -1
	t, ok := s.f.Tensor(g)
	if !ok && proj != "down" {
		g = blk + "ffn_gate_up_exps.weight"
		if t, ok = s.f.Tensor(g); !ok {
			return nil, nil
		}
		half = 0
		if proj == "up" {
			half = 1
		}
	} else if !ok {
		return nil, nil
	}
	if len(t.Shape) != 3 || i >= t.Shape[0] {
		return nil, fmt.Errorf("tensor %s has shape %v; want [experts > %d, rows, cols]", g, t.Shape, i)
	}
	dt, ok := dtypeOf(t.Type.String())
	if !ok {
		return nil, fmt.Errorf("tensor %s has type %v; kiln loads %s", g, t.Type, loadable)
	}
	rows, cols := t.Shape[1], t.Shape[2]
	rb := dt.RowBytes(cols)
	data := t.Data[i*rows*rb : (i+1)*rows*rb]
	if half >= 0 {
		rows /= 2
		data = data[half*rows*rb : (half+1)*rows*rb]
	}
	return &safetensors.Tensor{Name: name, DType: t.Type.String(), Shape: []int{rows, cols}, Data: data, File: s.f.Name}, nil
}
