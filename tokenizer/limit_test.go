package tokenizer

import (
	"math/rand/v2"
	"runtime"
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

// noSpaces is n bytes of letters without a space: one pre-token.
func noSpaces(n int) string {
	rng := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + rng.IntN(26))
	}
	return string(b)
}

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// An 8 MiB prompt without a space is one pre-token of 8.4M symbols: merged
// whole, encoding it allocated 1,082 MB (6.0 s, dev). Merged in chunks,
// it allocates its ids (6.3M, 88 MB as the slice grows; 2.2 s); against a context it is refused
// from its length alone, and a prompt short enough to pass that check
// stops within its chunk once the tokens pass the limit.
func TestEncodeHugePiece(t *testing.T) {
	tok := demoTokenizer(t)
	huge := noSpaces(8 << 20)
	var ids []int32
	if a := allocated(func() { ids = tok.Encode(huge) }); a > 128<<20 {
		t.Errorf("Encode of %d bytes without a space allocated %d MB", len(huge), a>>20)
	}
	if got := tok.Decode(ids); got != huge {
		t.Fatalf("the chunked piece does not round-trip (%d bytes back of %d)", len(got), len(huge))
	}
	if a := allocated(func() {
		if _, ok := tok.EncodeLimit(huge, 2047); ok {
			t.Error("EncodeLimit accepted 8 MiB in 2047 tokens")
		}
	}); a > 1<<20 {
		t.Errorf("refusing %d bytes against 2047 tokens allocated %d KB", len(huge), a>>10)
	}
	// Under 32 bytes a token, so only counting can refuse it.
	long := huge[:2047*tok.MaxTokenBytes(nil)]
	if a := allocated(func() {
		if _, ok := tok.EncodeLimit(long, 2047); ok {
			t.Error("EncodeLimit accepted a prompt of more tokens")
		}
	}); a > 8<<20 {
		t.Errorf("refusing %d bytes by counting allocated %d KB", len(long), a>>10)
	}
}
