package model

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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
	q3 := `{"architectures":["Qwen3ForCausalLM"],` + base
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
		// Every other field read, range-checked (issue 21).
		{q3 + `,"max_position_embeddings":9223372036854775807}`, "config.json: max_position_embeddings 9223372036854775807 is implausibly large (kiln accepts at most 16777216)"},
		{q3 + `,"max_position_embeddings":0}`, "max_position_embeddings must be positive, have 0"},
		{q3 + `,"intermediate_size":-5}`, "intermediate_size -5 is out of range (kiln accepts 0 to 131072)"},
		{q3 + `,"num_key_value_heads":-2}`, "num_key_value_heads -2 is out of range"},
		{q3 + `,"head_dim":0,"hidden_size":2}`, "hidden_size 2 has no head_dim for 4 heads"},
		{q3 + `,"rms_norm_eps":0}`, "rms_norm_eps 0 is out of range (0, 1]"},
		{q3 + `,"rms_norm_eps":1e300}`, "rms_norm_eps 1e+300 is out of range"},
		{q3 + `,"rope_theta":-1}`, "rope rope_theta -1 is out of range (0, 1e+12]"},
		{q3 + `,"rope_scaling":{"rope_type":"yarn","factor":-4,"original_max_position_embeddings":32768}}`, "rope factor -4 is out of range"},
		{q3 + `,"rope_scaling":{"rope_type":"yarn","factor":4,"original_max_position_embeddings":0}}`, "rope original_max_position_embeddings 0 is out of range"},
		{q3 + `,"eos_token_id":100}`, "eos_token_id 100 is outside the vocabulary (0 to 99)"},
		{q3 + `,"eos_token_id":[5,-1]}`, "eos_token_id -1 is outside the vocabulary"},
		{q3 + `,"eos_token_id":5000000000}`, "eos_token_id 5000000000 is neither an int nor a list of ints"},
		{`{"architectures":["Qwen3MoeForCausalLM"],` + base + `,"num_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":8,"mlp_only_layers":[7]}`, "mlp_only_layers[0] = 7 is not a layer (0 to 1)"},
		{`{"architectures":["Qwen3MoeForCausalLM"],` + base + `,"num_experts":-4,"num_experts_per_tok":2,"moe_intermediate_size":8}`, "num_experts -4 is out of range"},
		{`{"architectures":["Qwen3_5ForCausalLM"],` + base + `,"linear_num_key_heads":1,"linear_num_value_heads":2,"linear_key_head_dim":8,"linear_value_head_dim":8,"linear_conv_kernel_dim":-1}`, "linear_conv_kernel_dim must be positive"},
		{`{"architectures":["Qwen3_5ForCausalLM"],` + base + `,"linear_num_key_heads":1,"linear_num_value_heads":2,"linear_key_head_dim":8,"linear_value_head_dim":8,"linear_conv_kernel_dim":9}`, "linear_conv_kernel_dim 9 is wider than kiln's convs take (8 taps)"},
		{`{"architectures":["Qwen3_5ForCausalLM"],` + base + `,"linear_num_key_heads":1,"linear_num_value_heads":2,"linear_key_head_dim":8,"linear_value_head_dim":8,"full_attention_interval":-3}`, "full_attention_interval -3 is out of range"},
		{`{"architectures":["Qwen3ForCausalLM"],` + base + `,"quantization_config":{"quant_method":"fp8","weight_block_size":[1000000000,128]}}`, "weight_block_size"},
	}
	for _, c := range cases {
		_, err := parse(t, c.config, "")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.config, err, c.want)
		}
	}
	// generation_config.json: values a request would be refused for fail
	// the load, not every request that takes them as defaults.
	for gen, want := range map[string]string{
		`{"temperature":-1}`:           "temperature -1 is out of range [0, 3.4e38]",
		`{"temperature":1e300}`:        "temperature 1e+300 is out of range",
		`{"top_p":5}`:                  "top_p 5 is out of range [0, 1]",
		`{"min_p":-0.5}`:               "min_p -0.5 is out of range [0, 1]",
		`{"top_k":-1}`:                 "top_k -1 is out of range",
		`{"repetition_penalty":0}`:     "repetition_penalty 0 is out of range (0, 3.4e38]",
		`{"eos_token_id":[1,1000000]}`: "eos_token_id 1000000 is outside the vocabulary",
		`{"temperature":"hot"}`:        "cannot unmarshal",
		`not json`:                     "invalid character",
		``:                             "unexpected end of JSON input",
	} {
		_, err := ParseConfig([]byte(q3+`}`), []byte(gen))
		if err == nil || !strings.HasPrefix(err.Error(), "generation_config.json: ") || !strings.Contains(err.Error(), want) {
			t.Errorf("generation_config.json %s: error %v, want %q", gen, err, want)
		}
	}
}

// TestReadConfigRefusesSpecialFiles: a named pipe in place of config.json
// or generation_config.json is refused at once; reading it would wait for
// a writer forever.
func TestReadConfigRefusesSpecialFiles(t *testing.T) {
	for _, name := range []string{"config.json", "generation_config.json"} {
		dir := t.TempDir()
		if name != "config.json" {
			data, err := os.ReadFile(filepath.Join(fixtureDir("qwen3"), "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dir, "config.json"), data, 0o600)
		}
		if err := syscall.Mkfifo(filepath.Join(dir, name), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadConfig(os.DirFS(dir), "m"); err == nil || err.Error() != "model m: "+name+": not a regular file (a named pipe)" {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzParseConfig: any config.json and generation_config.json give a
// config whose sizes are in range, or an error; never a panic.
func FuzzParseConfig(f *testing.F) {
	for _, name := range []string{"qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen35vl"} {
		data, err := os.ReadFile(filepath.Join(fixtureDir(name), "config.json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, []byte(`{"eos_token_id":[1,2],"temperature":0.6,"top_p":0.95,"top_k":20,"do_sample":true}`))
	}
	f.Fuzz(func(t *testing.T, config, gen []byte) {
		c, err := ParseConfig(config, gen)
		if err != nil {
			return
		}
		if c.ContextLength < 1 || c.ContextLength > maxContext || c.Layers > maxLayers || c.VocabSize > maxVocab ||
			len(c.Kinds) != c.Layers || c.HeadDim <= 0 || c.KVHeads <= 0 || c.Heads%c.KVHeads != 0 {
			t.Fatalf("config out of range: %+v", c)
		}
		for _, id := range c.EOS {
			if id < 0 || int(id) >= c.VocabSize {
				t.Fatalf("eos %d outside the vocabulary of %d", id, c.VocabSize)
			}
		}
	})
}
