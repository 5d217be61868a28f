package demo

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"testing"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/model"
	"github.com/kiln-llm/kiln/safetensors"
	"github.com/kiln-llm/kiln/tokenizer"
)

// hfConfig is the part of config.json these tests check the other files
// against.
type hfConfig struct {
	ModelType     string   `json:"model_type"`
	Architectures []string `json:"architectures"`
	VocabSize     int      `json:"vocab_size"`
	Hidden        int      `json:"hidden_size"`
	Intermediate  int      `json:"intermediate_size"`
	Layers        int      `json:"num_hidden_layers"`
	Heads         int      `json:"num_attention_heads"`
	KVHeads       int      `json:"num_key_value_heads"`
	HeadDim       int      `json:"head_dim"`
	Tied          bool     `json:"tie_word_embeddings"`
}

func readJSON(t *testing.T, name string, v any) {
	t.Helper()
	data, err := fs.ReadFile(FS(), name)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func demoConfig(t *testing.T) hfConfig {
	t.Helper()
	var c hfConfig
	readJSON(t, "config.json", &c)
	return c
}

func TestFilesPresent(t *testing.T) {
	for _, name := range []string{
		"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
		"chat_template.jinja", "generation_config.json", "LICENSE",
	} {
		st, err := fs.Stat(FS(), name)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if st.Size() == 0 {
			t.Errorf("%s is empty", name)
		}
	}
	if st, err := fs.Stat(FS(), "model.safetensors"); err == nil && st.Size() > 20<<20 {
		t.Errorf("model.safetensors is %d bytes; the demo model must stay small enough to embed", st.Size())
	}
}

func TestConfigParses(t *testing.T) {
	c := demoConfig(t)
	if c.ModelType != "qwen3" || len(c.Architectures) != 1 || c.Architectures[0] != "Qwen3ForCausalLM" {
		t.Fatalf("model_type %q, architectures %q: want a qwen3 Qwen3ForCausalLM", c.ModelType, c.Architectures)
	}
	kc, err := model.ReadConfig(FS(), Name)
	if err != nil {
		t.Fatal(err)
	}
	if kc.VocabSize != c.VocabSize || kc.Hidden != c.Hidden || kc.Layers != c.Layers || !kc.TieEmbeddings {
		t.Errorf("kiln reads %+v from config.json %+v", kc, c)
	}
}

// TestWeightsMatchConfig checks every tensor a Qwen3 of the configured shape
// needs is present in bf16 with its shape, and nothing else.
func TestWeightsMatchConfig(t *testing.T) {
	c := demoConfig(t)
	set, err := safetensors.OpenFS(FS())
	if err != nil {
		t.Fatal(err)
	}
	defer set.Close()
	want := map[string][]int{
		"model.embed_tokens.weight": {c.VocabSize, c.Hidden},
		"model.norm.weight":         {c.Hidden},
	}
	if !c.Tied {
		want["lm_head.weight"] = []int{c.VocabSize, c.Hidden}
	}
	q, kv := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	for l := range c.Layers {
		p := fmt.Sprintf("model.layers.%d.", l)
		want[p+"input_layernorm.weight"] = []int{c.Hidden}
		want[p+"post_attention_layernorm.weight"] = []int{c.Hidden}
		want[p+"self_attn.q_proj.weight"] = []int{q, c.Hidden}
		want[p+"self_attn.k_proj.weight"] = []int{kv, c.Hidden}
		want[p+"self_attn.v_proj.weight"] = []int{kv, c.Hidden}
		want[p+"self_attn.o_proj.weight"] = []int{c.Hidden, q}
		want[p+"self_attn.q_norm.weight"] = []int{c.HeadDim}
		want[p+"self_attn.k_norm.weight"] = []int{c.HeadDim}
		want[p+"mlp.gate_proj.weight"] = []int{c.Intermediate, c.Hidden}
		want[p+"mlp.up_proj.weight"] = []int{c.Intermediate, c.Hidden}
		want[p+"mlp.down_proj.weight"] = []int{c.Hidden, c.Intermediate}
	}
	names := set.Names()
	if len(names) != len(want) {
		t.Errorf("%d tensors, want %d", len(names), len(want))
	}
	for _, n := range names {
		if _, ok := want[n]; !ok {
			t.Errorf("unexpected tensor %s", n)
		}
	}
	for n, shape := range want {
		ten, ok := set.Tensor(n)
		if !ok {
			t.Errorf("missing tensor %s", n)
			continue
		}
		if ten.DType != "BF16" || fmt.Sprint(ten.Shape) != fmt.Sprint(shape) {
			t.Errorf("%s: %s %v, want BF16 %v", n, ten.DType, ten.Shape, shape)
		}
	}
}

// TestTokenizer checks the tokenizer covers the model's vocabulary, has
// Qwen's chat tokens where generation_config.json expects them, round-trips
// Go source and compresses it as a trained BPE does.
func TestTokenizer(t *testing.T) {
	c := demoConfig(t)
	tok, err := tokenizer.LoadFS(FS())
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != c.VocabSize {
		t.Errorf("tokenizer has %d tokens, config.json %d", tok.VocabSize(), c.VocabSize)
	}
	var gen struct {
		EOS []int32 `json:"eos_token_id"`
	}
	readJSON(t, "generation_config.json", &gen)
	imEnd, ok1 := tok.TokenID("<|im_end|>")
	eot, ok2 := tok.TokenID("<|endoftext|>")
	if !ok1 || !ok2 || fmt.Sprint(gen.EOS) != fmt.Sprint([]int32{imEnd, eot}) {
		t.Errorf("eos_token_id %v, want the ids of <|im_end|> and <|endoftext|> (%d, %d)", gen.EOS, imEnd, eot)
	}
	for _, s := range []string{"<|im_start|>", "<think>", "</think>", "<tool_call>", "</tool_call>"} {
		if ids := tok.Encode(s); len(ids) != 1 {
			t.Errorf("%s encodes as %v, want one token", s, ids)
		}
	}
	src := "// Reverse returns s reversed.\nfunc Reverse(s string) string {\n\tr := []rune(s)\n" +
		"\tfor i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {\n\t\tr[i], r[j] = r[j], r[i]\n\t}\n\treturn string(r)\n}\n"
	ids := tok.Encode(src)
	if got := tok.Decode(ids); got != src {
		t.Errorf("round trip: got %q", got)
	}
	// Byte-level BPE trained on Go averages about 2.9 bytes a token; an
	// untrained or mismatched vocabulary stays near 1.
	if r := float64(len(src)) / float64(len(ids)); r < 2 {
		t.Errorf("%d bytes in %d tokens (%.2f a token): the merges do not fit Go source", len(src), len(ids), r)
	}
}

// TestChatTemplate checks kiln renders a question exactly as training
// rendered the chat examples (scripts/train_demo.py's CHAT_PROMPT).
func TestChatTemplate(t *testing.T) {
	tmpl, err := chat.LoadTemplate(FS())
	if err != nil {
		t.Fatal(err)
	}
	q := "write a Go function that reverses a string"
	want := "<|im_start|>user\n" + q + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
	// The model was trained on non-thinking turns only: a request that does
	// not ask for thinking (every plain OpenAI or Ollama client) must get the
	// prompt training used, or the model answers with <|endoftext|> at once.
	for _, kwargs := range []map[string]any{{"enable_thinking": false}, nil} {
		got, err := tmpl.Render(&chat.RenderInput{
			Messages:            []chat.Message{{Role: "user", Content: q}},
			AddGenerationPrompt: true,
			Kwargs:              kwargs,
		})
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("kwargs %v: rendered %q, training used %q", kwargs, got, want)
		}
	}
}
