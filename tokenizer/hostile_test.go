package tokenizer_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kiln-llm/kiln/demo"
	"github.com/kiln-llm/kiln/internal/testmodel"
	"github.com/kiln-llm/kiln/tokenizer"
)

// noSpaces is n bytes of letters without a space: one pre-token.
func noSpaces(n int) string {
	rng := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + rng.IntN(26))
	}
	return string(b)
}

// An 8 MiB prompt without a space is one pre-token of 8.4M symbols: merged
// whole, encoding it allocated 1,082 MB (6.0 s, dev). Merged in chunks, it
// allocates its ids (6.3M, 88 MB as the slice grows; 2.2 s); against a
// context it is refused from its length alone, and a prompt short enough
// to pass that check stops within its chunk once the tokens pass the
// limit.
func TestEncodeHugePiece(t *testing.T) {
	tok, err := tokenizer.LoadFS(demo.FS())
	if err != nil {
		t.Fatal(err)
	}
	huge := noSpaces(8 << 20)
	var ids []int32
	if a := testmodel.Allocated(func() { ids = tok.Encode(huge) }); a > 128<<20 {
		t.Errorf("Encode of %d bytes without a space allocated %d MB", len(huge), a>>20)
	}
	if got := tok.Decode(ids); got != huge {
		t.Fatalf("the chunked piece does not round-trip (%d bytes back of %d)", len(got), len(huge))
	}
	if a := testmodel.Allocated(func() {
		if _, ok := tok.EncodeLimit(huge, 2047); ok {
			t.Error("EncodeLimit accepted 8 MiB in 2047 tokens")
		}
	}); a > 1<<20 {
		t.Errorf("refusing %d bytes against 2047 tokens allocated %d KB", len(huge), a>>10)
	}
	// Under 32 bytes a token, so only counting can refuse it.
	long := huge[:2047*tok.MaxTokenBytes(nil)]
	if a := testmodel.Allocated(func() {
		if _, ok := tok.EncodeLimit(long, 2047); ok {
			t.Error("EncodeLimit accepted a prompt of more tokens")
		}
	}); a > 8<<20 {
		t.Errorf("refusing %d bytes by counting allocated %d KB", len(long), a>>10)
	}
}
