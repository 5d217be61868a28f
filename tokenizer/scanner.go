package tokenizer

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// The split patterns of the Qwen family and GPT-2 use a "\s+(?!\S)"
// lookahead, which Go's regexp lacks, so they are scanned by hand. A scanner
// returns the end of the match starting at a position; the patterns match
// every character somewhere, so the matches tile the text.

// Character classes as the patterns see them (Oniguruma's Unicode classes).
const (
	clsL  = 1 << iota // \p{L}
	clsN              // \p{N}
	clsM              // \p{M}
	clsWS             // \s: White_Space
	clsNL             // \r or \n
)

// bmpClass caches the classes of the Basic Multilingual Plane, where
// nearly all text lives; the Unicode tables are binary searches. It is
// built by the first knownScanner call, which every scanner comes from.
var (
	bmpClass     [0x10000]uint8
	bmpClassOnce sync.Once
)

func buildClassTable() {
	for r := range rune(len(bmpClass)) {
		bmpClass[r] = classOfSlow(r)
	}
}

func classOfSlow(r rune) uint8 {
	var c uint8
	if unicode.IsLetter(r) {
		c |= clsL
	}
	if unicode.IsNumber(r) {
		c |= clsN
	}
	if unicode.IsMark(r) {
		c |= clsM
	}
	if unicode.Is(unicode.White_Space, r) {
		c |= clsWS
	}
	if r == '\r' || r == '\n' {
		c |= clsNL
	}
	return c
}

// classAt decodes the character at s[i:] and returns its classes and size.
// Invalid bytes cannot occur: the text is valid UTF-8 by the time it is split.
func classAt(s string, i int) (uint8, int) {
	if b := s[i]; b < utf8.RuneSelf {
		return bmpClass[b], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	if r < rune(len(bmpClass)) {
		return bmpClass[r], n
	}
	return classOfSlow(r), n
}

// scanner describes one of the known split patterns.
type scanner struct {
	// qwen: the Qwen2 family; otherwise GPT-2's ByteLevel pattern.
	qwen bool
	// marks: \p{M} counts as a letter and not as punctuation (Qwen3.5).
	marks bool
	// maxDigits: how many \p{N} one match takes (1 or 3); 0 means any
	// number, with an optional leading space (GPT-2).
	maxDigits int
}

func (sc *scanner) letterMask() uint8 {
	if sc.marks {
		return clsL | clsM
	}
	return clsL
}

// split appends the end offset of every piece of s to ends, or of the
// first max+1 pieces.
func (sc *scanner) split(s string, ends []int, max int) []int {
	for i, n := 0, 0; i < len(s) && n <= max; n++ {
		i = sc.next(s, i)
		ends = append(ends, i)
	}
	return ends
}

// contraction reports the length of the match of the contraction
// alternative ('s|'t|'re|'ve|'m|'ll|'d) at s[i:], s[i] being an apostrophe.
func (sc *scanner) contraction(s string, i int) int {
	rest := s[i+1:]
	if len(rest) == 0 {
		return 0
	}
	lower := func(b byte) byte {
		if sc.qwen && b >= 'A' && b <= 'Z' {
			return b + 'a' - 'A'
		}
		return b
	}
	c0 := lower(rest[0])
	switch c0 {
	case 's', 't', 'm', 'd':
		return 2
	}
	if len(rest) >= 2 {
		c1 := lower(rest[1])
		if (c0 == 'r' || c0 == 'v') && c1 == 'e' || c0 == 'l' && c1 == 'l' {
			return 3
		}
	}
	// Case-insensitive matching in Oniguruma uses Unicode case folding,
	// under which LATIN SMALL LETTER LONG S (U+017F) is an 's'.
	if sc.qwen && len(rest) >= 2 && rest[0] == 0xC5 && rest[1] == 0xBF {
		return 3
	}
	return 0
}

// next returns the end of the match that starts at i.
func (sc *scanner) next(s string, i int) int {
	letter := sc.letterMask()
	punctExcl := uint8(clsWS | clsL | clsN)
	if sc.marks {
		punctExcl |= clsM
	}
	c0, n0 := classAt(s, i)
	if s[i] == '\'' {
		if n := sc.contraction(s, i); n > 0 {
			return i + n
		}
	}
	// Letters, with one optional leading character: any non-letter,
	// non-number but CR/LF (Qwen), or a space (GPT-2).
	if c0&letter != 0 {
		return sc.run(s, i, letter)
	}
	j := i + n0
	var c1 uint8
	if j < len(s) {
		c1, _ = classAt(s, j)
	}
	lead := s[i] == ' '
	if sc.qwen {
		lead = c0&(clsNL|clsL|clsN) == 0
	}
	if lead && j < len(s) && c1&letter != 0 {
		return sc.run(s, j, letter)
	}
	// Numbers.
	if c0&clsN != 0 {
		if sc.maxDigits == 0 {
			return sc.run(s, i, clsN)
		}
		end := j
		for k := 1; k < sc.maxDigits && end < len(s); k++ {
			c, n := classAt(s, end)
			if c&clsN == 0 {
				break
			}
			end += n
		}
		return end
	}
	if !sc.qwen && s[i] == ' ' && j < len(s) && c1&clsN != 0 {
		return sc.run(s, j, clsN)
	}
	// Punctuation: " ?[^\s\p{L}\p{N}]+", then (Qwen) "[\r\n]*".
	start := -1
	if c0&punctExcl == 0 {
		start = i
	} else if s[i] == ' ' && j < len(s) && c1&punctExcl == 0 {
		start = j
	}
	if start >= 0 {
		end := sc.runNot(s, start, punctExcl)
		if sc.qwen {
			for end < len(s) && (s[end] == '\r' || s[end] == '\n') {
				end++
			}
		}
		return end
	}
	// Whitespace. The run is maximal, so it ends at a non-space or at the end.
	end := i
	lastNL := -1
	lastStart := i
	for end < len(s) {
		c, n := classAt(s, end)
		if c&clsWS == 0 {
			break
		}
		if c&clsNL != 0 {
			lastNL = end
		}
		lastStart = end
		end += n
	}
	if sc.qwen && lastNL >= 0 {
		// "\s*[\r\n]+": backtracking stops at the run's last line break.
		return lastNL + 1
	}
	// "\s+(?!\S)" leaves the last space to the next word; "\s+" takes a
	// lone space before a non-space.
	if end == len(s) || lastStart == i {
		return end
	}
	return lastStart
}

// run returns the end of the run of characters in classes mask from i.
func (sc *scanner) run(s string, i int, mask uint8) int {
	for i < len(s) {
		c, n := classAt(s, i)
		if c&mask == 0 {
			break
		}
		i += n
	}
	return i
}

// runNot returns the end of the run of characters in none of classes mask.
func (sc *scanner) runNot(s string, i int, mask uint8) int {
	for i < len(s) {
		c, n := classAt(s, i)
		if c&mask != 0 {
			break
		}
		i += n
	}
	return i
}
