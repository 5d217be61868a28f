package model

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/kiln-llm/kiln/backend"
)

// SyntheticOptions configures Synthetic.
type SyntheticOptions struct {
	Layers  int           // 0: the published depth
	Seed    uint64        // weights are a deterministic function of the seed
	DType   backend.DType // weight dtype: BF16, F16, F32, or a quantized type for the linear layers (the rest bf16)
	KVDType backend.DType // KV cache dtype, as in Options
	// Rank of Ranks, as in Options: each rank draws its share's weights
	// (random too: a split synthetic model is not the whole one's split).
	Rank, Ranks int
}

// syntheticConfigs are config.json files of published models (and of the
// test fixtures' shapes), for models with random weights.
var syntheticConfigs = map[string]string{
	"qwen3-0.6b": `{"architectures":["Qwen3ForCausalLM"],"vocab_size":151936,"hidden_size":1024,"intermediate_size":3072,
		"num_hidden_layers":28,"num_attention_heads":16,"num_key_value_heads":8,"head_dim":128,"rms_norm_eps":1e-6,
		"max_position_embeddings":40960,"rope_theta":1000000,"tie_word_embeddings":true,"eos_token_id":151645}`,
	"qwen3-8b": `{"architectures":["Qwen3ForCausalLM"],"vocab_size":151936,"hidden_size":4096,"intermediate_size":12288,
		"num_hidden_layers":36,"num_attention_heads":32,"num_key_value_heads":8,"head_dim":128,"rms_norm_eps":1e-6,
		"max_position_embeddings":40960,"rope_theta":1000000,"tie_word_embeddings":false,"eos_token_id":151645}`,
	"qwen3-30b-a3b": `{"architectures":["Qwen3MoeForCausalLM"],"vocab_size":151936,"hidden_size":2048,"intermediate_size":6144,
		"moe_intermediate_size":768,"num_experts":128,"num_experts_per_tok":8,"norm_topk_prob":true,"decoder_sparse_step":1,
		"num_hidden_layers":48,"num_attention_heads":32,"num_key_value_heads":4,"head_dim":128,"rms_norm_eps":1e-6,
		"max_position_embeddings":40960,"rope_theta":1000000,"tie_word_embeddings":false,"eos_token_id":151645}`,
	"qwen3-next-80b-a3b": `{"architectures":["Qwen3NextForCausalLM"],"vocab_size":151936,"hidden_size":2048,"intermediate_size":5120,
		"moe_intermediate_size":512,"shared_expert_intermediate_size":512,"num_experts":512,"num_experts_per_tok":10,
		"norm_topk_prob":true,"decoder_sparse_step":1,"num_hidden_layers":48,"full_attention_interval":4,
		"num_attention_heads":16,"num_key_value_heads":2,"head_dim":256,"partial_rotary_factor":0.25,
		"linear_num_key_heads":16,"linear_num_value_heads":32,"linear_key_head_dim":128,"linear_value_head_dim":128,
		"linear_conv_kernel_dim":4,"rms_norm_eps":1e-6,"max_position_embeddings":262144,"rope_theta":10000000,
		"tie_word_embeddings":false,"eos_token_id":151645}`,
	"qwen3.5-35b-a3b": `{"architectures":["Qwen3_5MoeForCausalLM"],"vocab_size":248320,"hidden_size":2048,
		"moe_intermediate_size":512,"shared_expert_intermediate_size":512,"num_experts":256,"num_experts_per_tok":8,
		"num_hidden_layers":40,"full_attention_interval":4,"num_attention_heads":16,"num_key_value_heads":2,"head_dim":256,
		"linear_num_key_heads":16,"linear_num_value_heads":32,"linear_key_head_dim":128,"linear_value_head_dim":128,
		"linear_conv_kernel_dim":4,"rms_norm_eps":1e-6,"max_position_embeddings":262144,
		"rope_parameters":{"rope_type":"default","rope_theta":10000000,"partial_rotary_factor":0.25},
		"tie_word_embeddings":false,"eos_token_id":248046}`,
	// The shapes of testdata/fixtures.
	"tiny-qwen3": `{"architectures":["Qwen3ForCausalLM"],"vocab_size":512,"hidden_size":64,"intermediate_size":128,
		"num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"max_position_embeddings":4096,
		"tie_word_embeddings":true,"eos_token_id":511}`,
	"tiny-qwen3moe": `{"architectures":["Qwen3MoeForCausalLM"],"vocab_size":512,"hidden_size":64,"intermediate_size":128,
		"moe_intermediate_size":32,"num_experts":8,"num_experts_per_tok":2,"mlp_only_layers":[1],
		"num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16,"max_position_embeddings":4096,
		"eos_token_id":511}`,
	"tiny-qwen3next": `{"architectures":["Qwen3NextForCausalLM"],"vocab_size":512,"hidden_size":64,"intermediate_size":128,
		"moe_intermediate_size":32,"shared_expert_intermediate_size":32,"num_experts":8,"num_experts_per_tok":2,
		"mlp_only_layers":[2],"layer_types":["linear_attention","full_attention","linear_attention","full_attention"],
		"num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":32,
		"linear_num_key_heads":2,"linear_num_value_heads":4,"linear_key_head_dim":16,"linear_value_head_dim":16,
		"max_position_embeddings":4096,"eos_token_id":511}`,
	"tiny-qwen35": `{"architectures":["Qwen3_5ForCausalLM"],"vocab_size":512,"hidden_size":64,"intermediate_size":128,
		"layer_types":["linear_attention","linear_attention","full_attention","linear_attention"],
		"num_hidden_layers":4,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":32,
		"linear_num_key_heads":2,"linear_num_value_heads":4,"linear_key_head_dim":16,"linear_value_head_dim":16,
		"max_position_embeddings":4096,"eos_token_id":511}`,
	"tiny-qwen35moe": `{"architectures":["Qwen3_5MoeForCausalLM"],"vocab_size":512,"hidden_size":64,
		"moe_intermediate_size":32,"shared_expert_intermediate_size":32,"num_experts":8,"num_experts_per_tok":2,
		"layer_types":["linear_attention","full_attention","linear_attention"],
		"num_hidden_layers":3,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":32,
		"linear_num_key_heads":2,"linear_num_value_heads":4,"linear_key_head_dim":16,"linear_value_head_dim":16,
		"max_position_embeddings":4096,"eos_token_id":511}`,
}

// SyntheticNames lists the models Synthetic can build.
func SyntheticNames() []string {
	names := make([]string, 0, len(syntheticConfigs))
	for n := range syntheticConfigs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// SyntheticConfig returns the config of the named synthetic model with its
// published number of layers.
func SyntheticConfig(name string) (*Config, error) {
	return syntheticConfig(name, 0)
}

// Synthetic builds the named model (see SyntheticNames) with random weights
// and no files, for benchmarks; o.Layers > 0 keeps only the first layers.
func Synthetic(name string, b backend.Backend, o SyntheticOptions) (*Model, error) {
	cfg, err := syntheticConfig(name, o.Layers)
	if err != nil {
		return nil, err
	}
	switch o.DType {
	case backend.BF16, backend.F16, backend.F32, backend.FP8, backend.Q8_0, backend.Q4_K, backend.Q5_K, backend.Q6_K, backend.MXFP4:
	default:
		return nil, fmt.Errorf("model: synthetic weights cannot be %v", o.DType)
	}
	bd := &binder{b: b, dtype: o.DType, seed: o.Seed}
	if bd.rank, bd.ranks, err = (Options{Rank: o.Rank, Ranks: o.Ranks}).tensorParallel(b); err != nil {
		return nil, err
	}
	return build(cfg, b, bd, o.KVDType)
}

// syntheticConfig parses the named synthetic config; layers > 0 keeps only
// the first layers.
func syntheticConfig(name string, layers int) (*Config, error) {
	raw, ok := syntheticConfigs[name]
	if !ok {
		return nil, fmt.Errorf("model: no synthetic model %q; there are %s", name, strings.Join(SyntheticNames(), ", "))
	}
	if layers > 0 {
		var m map[string]any
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			return nil, err
		}
		// A hybrid model cut before its first attention layer would have
		// no KV cache to serve from.
		first := 0
		if iv, ok := m["full_attention_interval"].(float64); ok {
			first = int(iv)
		} else if types, ok := m["layer_types"].([]any); ok {
			first = slices.Index(types, any("full_attention")) + 1
			if first == 0 {
				first = len(types) + 1
			}
		}
		if layers < first {
			return nil, fmt.Errorf("model %s: its first attention layer is layer %d (Gated DeltaNet before it): give at least %d layers", name, first, first)
		}
		if n, _ := m["num_hidden_layers"].(float64); layers > int(n) {
			return nil, fmt.Errorf("model %s has %d layers: %d would keep more than it has", name, int(n), layers)
		}
		if types, ok := m["layer_types"].([]any); ok && len(types) > layers {
			m["layer_types"] = types[:layers]
		}
		m["num_hidden_layers"] = layers
		data, _ := json.Marshal(m)
		raw = string(data)
	}
	cfg, err := ParseConfig([]byte(raw), nil)
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", name, err)
	}
	cfg.Name = name
	return cfg, nil
}
