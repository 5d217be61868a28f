package demo

import (
	"slices"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/backend/cpu"
	"github.com/kiln-llm/kiln/model"
	"github.com/kiln-llm/kiln/tokenizer"
)

// greedy continues prompt with kiln's CPU backend until an end-of-sequence
// token or max tokens, returning the decoded continuation.
func greedy(t *testing.T, m *model.Model, tok *tokenizer.Tokenizer, prompt string, max int) string {
	t.Helper()
	const blockSize = 16
	ids := tok.Encode(prompt)
	blocks := make([]int32, (len(ids)+max+blockSize-1)/blockSize)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	if err := m.AllocCache(model.CacheSpec{Blocks: len(blocks), BlockSize: blockSize, Slots: 1}); err != nil {
		t.Fatal(err)
	}
	seq := model.Seq{Tokens: ids, Blocks: blocks, Logits: model.LastLogits}
	var out []int32
	for len(out) < max {
		logits, err := m.Forward([]model.Seq{seq})
		if err != nil {
			t.Fatal(err)
		}
		s, err := m.Sample(logits, []backend.SampleParams{{Temperature: 0}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, s[0].Token)
		if slices.Contains(m.Config().EOS, s[0].Token) {
			break
		}
		seq.Pos += len(seq.Tokens)
		seq.Tokens = []int32{s[0].Token}
	}
	return tok.Decode(out)
}

// TestGreedyMatchesTransformers runs the embedded model through kiln's CPU
// backend and expects the greedy continuations transformers printed for the
// same prompts at the end of training (demo/README.md): the model, its
// tokenizer and kiln's Qwen3 agree, and the model completes Go.
func TestGreedyMatchesTransformers(t *testing.T) {
	b := cpu.New(cpu.Options{})
	m, err := model.LoadFS(FS(), b, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tok, err := tokenizer.LoadFS(FS())
	if err != nil {
		t.Fatal(err)
	}
	chat := func(q string) string {
		return "<|im_start|>user\n" + q + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
	}
	for _, c := range []struct{ prompt, want string }{
		{"func (b *Buffer) Len() int {\n", "\treturn len(b.buf)\n}\n```<|im_end|>"},
		{"// Max returns the larger of a and b.\nfunc Max(a, b int) int {\n", "\treturn a\n}\n```<|im_end|>"},
		{
			chat("Write a Go function that reports whether n is a prime number."),
			"```go\n// primeLegacyPrec reports whether n is a prime number.\nfunc primeLegacyPrec(n uint) bool {\n" +
				"\treturn n == uint(n) && n == uint(n)\n}\n```<|im_end|>",
		},
	} {
		got := greedy(t, m, tok, c.prompt, 64)
		if got != c.want {
			t.Errorf("%q continues as\n%q\nwant (transformers)\n%q", c.prompt, got, c.want)
		}
		if !strings.HasSuffix(got, "<|im_end|>") {
			t.Errorf("%q: no end of turn within 64 tokens", c.prompt)
		}
	}
}
