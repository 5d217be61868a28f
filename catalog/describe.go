package catalog

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kiln-llm/kiln/gguf"
	"github.com/kiln-llm/kiln/safetensors"
)

// Info is what kiln show says of a model.
type Info struct {
	*Model
	Arch   string // config.json's architecture ("Qwen3ForCausalLM"), or a GGUF file's ("qwen3")
	Family string // qwen3, qwen3moe, qwen3next, qwen35, qwen35moe: llama.cpp's name for it
	Params int64  // weights, counted from the tensors
	// Context is the longest context the model was made for.
	Context                        int
	Layers, Hidden, Heads, KVHeads int
	Experts, ExpertsUsed           int // 0 for a dense model
	Vocab                          int
	// Template is the chat template's source, from TemplateFrom (a file of
	// the checkpoint, or the GGUF's tokenizer.chat_template).
	Template, TemplateFrom string
	Files                  []File
}

// File is one file of a model.
type File struct {
	Name string
	Size int64
}

// Describe reads what a model is: its architecture, shapes, parameters,
// context, quantization, chat template and files.
func Describe(m *Model) (*Info, error) {
	in := &Info{Model: m}
	fi, err := os.Stat(m.Path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() || m.Format == "gguf" {
		file := m.Path
		if fi.IsDir() {
			ggufs, _ := filepath.Glob(filepath.Join(m.Path, "*.gguf"))
			file = ggufs[0]
		}
		return in, in.fromGGUF(file)
	}
	return in, in.fromCheckpoint(m.Path)
}

// family is llama.cpp's architecture name of a transformers class:
// Qwen3MoeForCausalLM is qwen3moe, Qwen3_5ForConditionalGeneration qwen35.
func family(arch string) string {
	for _, suffix := range []string{"ForCausalLM", "ForConditionalGeneration"} {
		arch = strings.TrimSuffix(arch, suffix)
	}
	return strings.ToLower(strings.ReplaceAll(arch, "_", ""))
}

func (in *Info) fromGGUF(file string) error {
	f, err := gguf.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	in.Arch = f.Architecture()
	in.Family = in.Arch
	get := func(key string) int {
		v, _ := f.Int(in.Arch + "." + key)
		return int(v)
	}
	in.Context, in.Layers, in.Hidden = get("context_length"), get("block_count"), get("embedding_length")
	in.Heads, in.KVHeads = get("attention.head_count"), get("attention.head_count_kv")
	in.Experts, in.ExpertsUsed = get("expert_count"), get("expert_used_count")
	if v, ok := f.Value("tokenizer.ggml.tokens"); ok {
		in.Vocab = v.Len()
	}
	for _, t := range f.Tensors {
		in.Params += int64(t.Numel())
	}
	if s, ok := f.String("tokenizer.chat_template"); ok {
		in.Template, in.TemplateFrom = s, "the GGUF file's tokenizer.chat_template"
	}
	in.Files = []File{{Name: filepath.Base(file), Size: in.Size}}
	if fi, err := os.Stat(file); err == nil {
		in.Files[0].Size = fi.Size()
	}
	return nil
}

// rawConfig is the part of a config.json kiln shows.
type rawConfig struct {
	Architectures         []string        `json:"architectures"`
	TextConfig            json.RawMessage `json:"text_config"`
	VocabSize             int             `json:"vocab_size"`
	HiddenSize            int             `json:"hidden_size"`
	NumHiddenLayers       int             `json:"num_hidden_layers"`
	NumAttentionHeads     int             `json:"num_attention_heads"`
	NumKeyValueHeads      int             `json:"num_key_value_heads"`
	MaxPositionEmbeddings int             `json:"max_position_embeddings"`
	NumExperts            int             `json:"num_experts"`
	NumLocalExperts       int             `json:"num_local_experts"`
	NumExpertsPerTok      int             `json:"num_experts_per_tok"`
	QuantizationConfig    *struct {
		QuantMethod string `json:"quant_method"`
	} `json:"quantization_config"`
}

// readConfig reads a checkpoint's config.json (its text_config, for a
// vision-language model).
func readConfig(dir string) (*rawConfig, error) {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, err
	}
	var c rawConfig
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, "config.json"), err)
	}
	if len(c.TextConfig) > 0 && string(c.TextConfig) != "null" {
		outer := c
		c = rawConfig{}
		if err := json.Unmarshal(outer.TextConfig, &c); err != nil {
			return nil, fmt.Errorf("%s: text_config: %w", filepath.Join(dir, "config.json"), err)
		}
		c.Architectures, c.QuantizationConfig = outer.Architectures, outer.QuantizationConfig
	}
	return &c, nil
}

// checkpointQuant names a checkpoint's weight type: FP8 for Qwen's FP8
// checkpoints, else the dtype most of its first shard's bytes are in.
func checkpointQuant(dir string, c *rawConfig) string {
	if q := c.QuantizationConfig; q != nil && q.QuantMethod != "" {
		return strings.ToUpper(q.QuantMethod)
	}
	shards, _ := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if len(shards) == 0 {
		return ""
	}
	sort.Strings(shards)
	f, err := safetensors.Open(shards[0])
	if err != nil {
		return ""
	}
	defer f.Close()
	bytes := map[string]int{}
	for _, n := range f.Names() {
		t, _ := f.Tensor(n)
		bytes[t.DType] += len(t.Data)
	}
	best := ""
	for dt, n := range bytes {
		if best == "" || n > bytes[best] || n == bytes[best] && dt < best {
			best = dt
		}
	}
	return best
}

func (in *Info) fromCheckpoint(dir string) error {
	c, err := readConfig(dir)
	if err != nil {
		return err
	}
	if len(c.Architectures) > 0 {
		in.Arch = c.Architectures[0]
		in.Family = family(in.Arch)
	}
	in.Context, in.Layers, in.Hidden, in.Vocab = c.MaxPositionEmbeddings, c.NumHiddenLayers, c.HiddenSize, c.VocabSize
	in.Heads, in.KVHeads = c.NumAttentionHeads, c.NumKeyValueHeads
	in.Experts, in.ExpertsUsed = max(c.NumExperts, c.NumLocalExperts), c.NumExpertsPerTok
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		fi, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		in.Files = append(in.Files, File{Name: e.Name(), Size: fi.Size()})
		if !strings.HasSuffix(e.Name(), ".safetensors") {
			continue
		}
		f, err := safetensors.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		for _, n := range f.Names() {
			// FP8 checkpoints' per-tile scales are no parameters.
			if t, _ := f.Tensor(n); !strings.HasSuffix(n, "_scale_inv") && !strings.HasSuffix(n, "_scale") {
				in.Params += int64(t.Numel())
			}
		}
		f.Close()
	}
	in.Template, in.TemplateFrom = checkpointTemplate(dir)
	return nil
}

// checkpointTemplate finds a checkpoint's chat template where transformers
// does: chat_template.jinja, chat_template.json, then tokenizer_config.json.
func checkpointTemplate(dir string) (string, string) {
	if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		return string(b), "chat_template.jinja"
	}
	for _, name := range []string{"chat_template.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		var v struct {
			ChatTemplate json.RawMessage `json:"chat_template"`
		}
		if json.Unmarshal(b, &v) != nil || len(v.ChatTemplate) == 0 {
			continue
		}
		var s string
		if json.Unmarshal(v.ChatTemplate, &s) == nil {
			return s, name
		}
		var named []struct{ Name, Template string }
		if json.Unmarshal(v.ChatTemplate, &named) == nil {
			for _, t := range named {
				if t.Name == "default" {
					return t.Template, name
				}
			}
		}
	}
	return "", ""
}

// ParamSize writes a parameter count as Ollama does: 8.2B, 752M.
func ParamSize(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.0fM", float64(n)/1e6)
	case n > 0:
		return fmt.Sprintf("%.0fK", float64(n)/1e3)
	}
	return ""
}
