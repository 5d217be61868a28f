package grammar

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// syntheticVocab is a vocabulary of Qwen's size and make (151,643 byte
// strings and 293 special tokens in a 151,936-token model) for measuring
// masks: every byte; words and word pieces with and without a leading
// space, in the cases code and prose use; punctuation runs, quotes
// included, some ending in newlines; runs of spaces and indentation; CJK
// characters and pairs, and pieces of UTF-8 characters. No real vocabulary
// of that size is at hand here; what a mask walks is the trie of these
// strings, which has the size and branching of a real one.
func syntheticVocab() *Vocab {
	const n, size = 151643, 151936
	r := rand.New(rand.NewPCG(7, 8))
	seen := map[string]bool{}
	var toks [][]byte
	add := func(s string) {
		if !seen[s] && len(toks) < n {
			seen[s] = true
			toks = append(toks, []byte(s))
		}
	}
	for b := range 256 {
		add(string([]byte{byte(b)}))
	}
	for i := 1; i <= 80; i++ {
		add(strings.Repeat(" ", i))
		add("\n" + strings.Repeat(" ", i))
		add(strings.Repeat("\t", 1+i%8))
		add(strings.Repeat("\n", 1+i%4))
	}
	punct := []string{`"`, `'`, ",", ".", ":", ";", "(", ")", "[", "]", "{", "}", "=", "-", "_", "/", "\\", "*", "#", "!", "?", "<", ">", "&", "|", "+", "%", "@", "$", "`"}
	for len(toks) < 6000 {
		k := 1 + r.IntN(4)
		var sb strings.Builder
		if r.IntN(3) == 0 {
			sb.WriteByte(' ')
		}
		for range k {
			sb.WriteString(punct[r.IntN(len(punct))])
		}
		if r.IntN(5) == 0 {
			sb.WriteString("\n")
		}
		add(sb.String())
	}
	for len(toks) < 26000 {
		c := 0x4E00 + r.IntN(0x9FFF-0x4E00)
		s := string(rune(c))
		if r.IntN(2) == 0 {
			s += string(rune(0x4E00 + r.IntN(0x9FFF-0x4E00)))
		}
		add(s)
		if r.IntN(8) == 0 {
			add(s[:len(s)-1]) // a piece of a character
		}
	}
	cons, vow := "bcdfghjklmnprstvwxyz", "aeiou"
	word := func() string {
		var sb strings.Builder
		for range 1 + r.IntN(4) {
			sb.WriteByte(cons[r.IntN(len(cons))])
			sb.WriteByte(vow[r.IntN(len(vow))])
			if r.IntN(2) == 0 {
				sb.WriteByte(cons[r.IntN(len(cons))])
			}
		}
		return sb.String()
	}
	for len(toks) < n {
		w := word()
		switch r.IntN(6) {
		case 0:
			w = strings.ToUpper(w[:1]) + w[1:]
		case 1:
			w = w[:max(2, len(w)/2)] // a piece
		}
		if r.IntN(2) == 0 {
			w = " " + w
		}
		add(w)
	}
	return NewVocab(append(toks, make([][]byte, size-n)...), size)
}

const benchSchema = `{"type":"object","properties":{
	"name":{"type":"string","maxLength":40},
	"age":{"type":"integer","minimum":0,"maximum":150},
	"email":{"type":"string"},
	"role":{"enum":["admin","user","guest"]},
	"score":{"type":"number"},
	"tags":{"type":"array","items":{"type":"string","maxLength":16},"maxItems":5},
	"address":{"type":"object","properties":{"city":{"type":"string"},"zip":{"type":"string","minLength":5,"maxLength":5}},"required":["city"]},
	"active":{"type":"boolean"}},
	"required":["name","age","role","active"],"additionalProperties":false}`

// BenchmarkMask measures the host's work per generated token of a
// constrained request on a vocabulary of Qwen's size, as the engine does
// it (clear the sequence's mask, fill it, look for a set bit): over whole
// generations of random allowed tokens, for a schema seen for the first
// time (every state's mask computed) and seen before (masks remembered).
func BenchmarkMask(b *testing.B) {
	v := syntheticVocab()
	e, err := Schema([]byte(benchSchema))
	if err != nil {
		b.Fatal(err)
	}
	for _, warm := range []bool{false, true} {
		b.Run(fmt.Sprintf("warm=%v", warm), func(b *testing.B) {
			g := Compile(e, v)
			if warm {
				for i := range 20 {
					run(b, g, uint64(i))
				}
			}
			steps, elapsed := 0, time.Duration(0)
			for i := 0; b.Loop(); i++ {
				if !warm {
					g = Compile(e, v)
				}
				s, d := run(b, g, uint64(100+i))
				steps += s
				elapsed += d
			}
			b.ReportMetric(float64(elapsed.Microseconds())/float64(steps), "µs/token")
			b.ReportMetric(float64(steps)/float64(b.N), "tokens/op")
		})
	}
}

// run generates one output of g with random allowed tokens (ending where
// it may with probability 1/4) and returns its tokens and the time spent
// in masks.
func run(b *testing.B, g *Grammar, seed uint64) (int, time.Duration) {
	r := rand.New(rand.NewPCG(seed, 1))
	mt := g.Matcher()
	mask := make([]uint64, g.v.words())
	var gen []int32
	var spent time.Duration
	for len(gen) < 2000 {
		start := time.Now()
		clear(mask)
		end := mt.Allow(gen, mask)
		any := false
		for _, w := range mask {
			if w != 0 {
				any = true
				break
			}
		}
		spent += time.Since(start)
		if end && (!any || r.IntN(4) == 0) {
			break
		}
		// A random allowed token: a random word, then its lowest bit.
		for {
			i := r.IntN(len(mask))
			if w := mask[i]; w != 0 {
				gen = append(gen, int32(64*i+trailingZeros(w)))
				break
			}
		}
	}
	return len(gen), spent
}

func TestSyntheticVocab(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a vocabulary of 151,643 tokens")
	}
	v := syntheticVocab()
	bytes := 0
	for _, tok := range v.tokens {
		bytes += len(tok)
	}
	t.Logf("%d tokens, %d bytes, %d trie nodes", len(v.tokens), bytes, len(v.nodes))
}
