package model

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestYarnMatchesTransformers compares the YaRN inverse frequencies and
// attention factor with transformers' _compute_yarn_parameters, recorded by
// scripts/make_fixtures.py, and with the same configs in the legacy
// rope_theta / rope_scaling spelling.
func TestYarnMatchesTransformers(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "testdata", "fixtures", "rope_yarn.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Cases []struct {
			Name            string         `json:"name"`
			Config          map[string]any `json:"config"`
			InvFreq         []float64      `json:"inv_freq"`
			AttentionFactor float64        `json:"attention_factor"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Cases) == 0 {
		t.Fatal("no cases")
	}
	for _, c := range f.Cases {
		legacy := map[string]any{}
		for k, v := range c.Config {
			legacy[k] = v
		}
		rp := c.Config["rope_parameters"].(map[string]any)
		scaling := map[string]any{}
		for k, v := range rp {
			switch k {
			case "rope_theta":
				legacy["rope_theta"] = v
			case "partial_rotary_factor":
				legacy["partial_rotary_factor"] = v
			case "rope_type":
				scaling["type"] = v
			default:
				scaling[k] = v
			}
		}
		delete(legacy, "rope_parameters")
		legacy["rope_scaling"] = scaling
		for spelling, cfg := range map[string]map[string]any{"rope_parameters": c.Config, "rope_scaling": legacy} {
			raw, _ := json.Marshal(cfg)
			got, err := ParseConfig(raw, nil)
			if err != nil {
				t.Fatalf("%s (%s): %v", c.Name, spelling, err)
			}
			if len(got.Rope.InvFreq) != len(c.InvFreq) {
				t.Fatalf("%s (%s): %d frequencies, transformers has %d", c.Name, spelling, len(got.Rope.InvFreq), len(c.InvFreq))
			}
			for i, want := range c.InvFreq {
				if d := math.Abs(float64(got.Rope.InvFreq[i])-want) / want; d > 1e-6 {
					t.Errorf("%s (%s): inv_freq[%d] = %g, transformers %g", c.Name, spelling, i, got.Rope.InvFreq[i], want)
				}
			}
			if d := math.Abs(float64(got.Rope.AttnFactor) - c.AttentionFactor); d > 1e-6 {
				t.Errorf("%s (%s): attention factor %g, transformers %g", c.Name, spelling, got.Rope.AttnFactor, c.AttentionFactor)
			}
		}
	}
}

func parse(t *testing.T, config, generation string) (*Config, error) {
	t.Helper()
	var gen []byte
	if generation != "" {
		gen = []byte(generation)
	}
	return ParseConfig([]byte(config), gen)
}

func TestConfigVariants(t *testing.T) {
	// Nested text_config: the fixture of Qwen3_5ForConditionalGeneration.
	data, err := os.ReadFile(filepath.Join(fixtureDir("qwen35vl"), "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseConfig(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Hidden != 64 || c.Layers != 2 || c.Kinds[0] != LinearAttention || c.Kinds[1] != FullAttention ||
		c.RotaryDim != 8 || c.DeltaNet.ValueHeads != 4 || len(c.EOS) != 1 || c.EOS[0] != 511 {
		t.Fatalf("nested config parsed as %+v", c)
	}

	base := `"vocab_size":100,"hidden_size":32,"intermediate_size":64,"num_hidden_layers":8,"num_attention_heads":4,"num_key_value_heads":2,"head_dim":16`
	// Qwen3-Next defaults: full attention every 4th layer, partial rotary 0.25.
	c, err = parse(t, `{"architectures":["Qwen3NextForCausalLM"],`+base+`,"num_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":8,
		"linear_num_key_heads":1,"linear_num_value_heads":2,"linear_key_head_dim":8,"linear_value_head_dim":8,"mlp_only_layers":[1],"decoder_sparse_step":1}`, "")
	if err != nil {
		t.Fatal(err)
	}
	if c.RotaryDim != 4 || c.Kinds[3] != FullAttention || c.Kinds[2] != LinearAttention || c.Sparse[1] || !c.Sparse[0] || !c.MoE.NormTopK {
		t.Fatalf("Qwen3-Next defaults: %+v", c)
	}
	// Qwen3-MoE: decoder_sparse_step 2 makes odd layers sparse; num_local_experts spelling.
	c, err = parse(t, `{"architectures":["Qwen3MoeForCausalLM"],`+base+`,"num_local_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":8,"decoder_sparse_step":2}`, "")
	if err != nil {
		t.Fatal(err)
	}
	if c.Sparse[0] || !c.Sparse[1] || c.Sparse[2] || c.MoE.Experts != 4 || c.MoE.NormTopK || c.RotaryDim != 16 {
		t.Fatalf("Qwen3-MoE sparse layers %v, experts %d, norm %v", c.Sparse, c.MoE.Experts, c.MoE.NormTopK)
	}
	// generation_config: eos list beats config's int, sampling defaults read.
	c, err = parse(t, `{"architectures":["Qwen3ForCausalLM"],`+base+`,"eos_token_id":5}`, `{"eos_token_id":[7,8],"temperature":0.6,"top_p":0.95,"top_k":20,"do_sample":true}`)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.EOS) != 2 || c.EOS[0] != 7 || c.Defaults != (Sampling{Temperature: 0.6, TopP: 0.95, TopK: 20}) {
		t.Fatalf("eos %v defaults %+v", c.EOS, c.Defaults)
	}
	c, err = parse(t, `{"architectures":["Qwen3ForCausalLM"],`+base+`,"eos_token_id":5}`, `{"do_sample":false}`)
	if err != nil || c.EOS[0] != 5 || c.Defaults.Temperature != 0 {
		t.Fatalf("greedy generation config: %v %+v", err, c)
	}
	// Linear scaling and the default theta.
	c, err = parse(t, `{"architectures":["Qwen3ForCausalLM"],`+base+`,"rope_scaling":{"rope_type":"linear","factor":2.0}}`, "")
	if err != nil || math.Abs(float64(c.Rope.InvFreq[0])-0.5) > 1e-7 || math.Abs(float64(c.Rope.InvFreq[1])-0.5*math.Pow(10000, -2.0/16)) > 1e-7 {
		t.Fatalf("linear rope: %v %v", err, c.Rope.InvFreq)
	}
}

func TestConfigErrors(t *testing.T) {
	base := `"vocab_size":100,"hidden_size":32,"intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":4,"head_dim":8`
	cases := []struct{ config, want string }{
		{`{"architectures":["LlamaForCausalLM"],` + base + `}`, `unsupported architecture "LlamaForCausalLM"; kiln supports Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen3NextForCausalLM, Qwen3_5ForCausalLM`},
		{`{` + base + `}`, "names no architecture"},
		{`{"architectures":["Qwen3ForCausalLM"],` + base + `,"rope_scaling":{"rope_type":"dynamic","factor":2.0}}`, `rope_type "dynamic" is not supported`},
		{`{"architectures":["Qwen3ForCausalLM"],` + base + `,"num_key_value_heads":3}`, "not a multiple"},
		{`{"architectures":["Qwen3ForCausalLM"],` + base + `,"hidden_act":"gelu"}`, `hidden_act "gelu"`},
		{`{"architectures":["Qwen3ForCausalLM"],` + base + `,"eos_token_id":"x"}`, "eos_token_id"},
		{`{"architectures":["Qwen3_5ForCausalLM"],` + base + `,"layer_types":["full_attention"],"linear_num_key_heads":1,"linear_num_value_heads":1,"linear_key_head_dim":8,"linear_value_head_dim":8}`, "layer_types has 1 entries for 2 layers"},
		{`{"architectures":["Qwen3ForCausalLM"],"vocab_size":0}`, "vocab_size must be positive"},
		{`{"architectures":["Qwen3ForCausalLM"],` + base + `,"partial_rotary_factor":0.1}`, "rotary dimension"},
		// Sizes no model has: refused before the loader allocates tables by them.
		{`{"architectures":["Qwen3ForCausalLM"],` + base + `,"num_hidden_layers":1000000000}`, "num_hidden_layers 1000000000 is implausibly large"},
		{`{"architectures":["Qwen3ForCausalLM"],` + base + `,"head_dim":1073741824}`, "head_dim 1073741824 is implausibly large"},
		{`{"architectures":["Qwen3MoeForCausalLM"],` + base + `,"num_experts":100000000,"num_experts_per_tok":2,"moe_intermediate_size":8}`, "num_experts 100000000 is implausibly large"},
	}
	for _, c := range cases {
		_, err := parse(t, c.config, "")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.config, err, c.want)
		}
	}
}
