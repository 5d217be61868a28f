package tokenizer

import (
	"slices"
	"strings"
	"testing"
)

// demoTokenizer is the embedded demo model's (package demo imports nothing
// of ours, but reading the file keeps the test independent of it).
func demoTokenizer(t testing.TB) *Tokenizer {
	tok, err := Load("../demo/model")
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// EncodeLimit gives Encode's ids to a text of at most limit tokens and
// refuses one of more, line by line over the corpus and the HF cases and
// for the whole corpus at once, with and without a bound on token length.
func TestEncodeLimit(t *testing.T) {
	texts := corpusText(t)
	for _, e := range loadCases(t, "qwen3").Encode {
		texts = append(texts, e.Text)
	}
	texts = append(texts, strings.Join(texts, ""), strings.Repeat("a", 40000)+"<|im_end|>"+strings.Repeat(" ", 20000))
	for name, tok := range map[string]*Tokenizer{"qwen3": loadTestTokenizer(t, "qwen3"), "plain": plainTokenizer(t), "demo": demoTokenizer(t)} {
		for _, s := range texts {
			want := tok.Encode(s)
			n := len(want)
			if got, ok := tok.EncodeLimit(s, n); !ok || !slices.Equal(got, want) {
				t.Fatalf("%s: EncodeLimit(%.40q, %d) = %v, %v; Encode gives %v", name, s, n, got, ok, want)
			}
			if n == 0 {
				continue
			}
			if got, ok := tok.EncodeLimit(s, n-1); ok {
				t.Fatalf("%s: EncodeLimit(%.40q, %d) accepted %d tokens", name, s, n-1, len(got))
			}
		}
	}
}

// MaxTokenBytes is the longest text a token stands for, and 0 for a
// vocabulary with tokens that take the whitespace around them.
func TestMaxTokenBytes(t *testing.T) {
	for _, c := range []struct {
		tok  *Tokenizer
		want int
	}{{demoTokenizer(t), 32}, {plainTokenizer(t), 576}, {loadTestTokenizer(t, "qwen3"), 0}} {
		if got := c.tok.MaxTokenBytes(nil); got != c.want {
			t.Errorf("MaxTokenBytes = %d, want %d", got, c.want)
		}
	}
	double := func(byte) int { return 2 }
	if got := demoTokenizer(t).MaxTokenBytes(double); got != 64 {
		t.Errorf("MaxTokenBytes(2 a byte) = %d, want 64", got)
	}
}
