package session

import (
	"math/rand/v2"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kiln-llm/kiln/tokenizer"
)

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// vocabWords returns n words made of the tokenizer's own tokens (two of
// its first 50000 ordinary ids each): text of the byte mix it was trained
// on, as long as wanted.
func vocabWords(tok *tokenizer.Tokenizer, n int) []string {
	rng := rand.New(rand.NewPCG(1, 2))
	words := make([]string, 0, n)
	for len(words) < n {
		a, b := int32(rng.IntN(50000)), int32(rng.IntN(50000))
		if w := strings.TrimSpace(tok.Decode([]int32{a, b})); w != "" && utf8.ValidString(w) && !tok.IsSpecial(a) && !tok.IsSpecial(b) {
			words = append(words, w)
		}
	}
	return words
}
