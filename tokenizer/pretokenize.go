package tokenizer

import (
	"fmt"
	"regexp"
	"strings"
)

// splitter cuts text into pieces; split appends each piece's end offset,
// and may stop once it has appended more than max.
type splitter interface {
	split(s string, ends []int, max int) []int
}

// Onig-syntax patterns that have a hand-written scanner. Qwen2/Qwen3 use
// qwenPattern; Qwen3.5 adds \p{M} to letters; Llama-3-style tokenizers
// take digits in threes.
const (
	contractionsI = `(?i:'s|'t|'re|'ve|'m|'ll|'d)`
	gpt2Pattern   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

func qwenPattern(marks bool, digits int) string {
	letters, punct := `\p{L}+`, `[^\s\p{L}\p{N}]+`
	if marks {
		letters, punct = `[\p{L}\p{M}]+`, `[^\s\p{L}\p{M}\p{N}]+`
	}
	num := `\p{N}`
	if digits == 3 {
		num = `\p{N}{1,3}`
	}
	return contractionsI + `|[^\r\n\p{L}\p{N}]?` + letters + `|` + num + `| ?` + punct +
		`[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
}

// knownScanner returns the hand-written scanner for pattern, if any.
func knownScanner(pattern string) *scanner {
	bmpClassOnce.Do(buildClassTable)
	if pattern == gpt2Pattern {
		return &scanner{}
	}
	for _, marks := range []bool{false, true} {
		for _, digits := range []int{1, 3} {
			if pattern == qwenPattern(marks, digits) {
				return &scanner{qwen: true, marks: marks, maxDigits: digits}
			}
		}
	}
	return nil
}

// regexSplitter is the general path: a pattern without lookaround,
// translated from Oniguruma's syntax to Go's. Go's regexp picks the match a
// backtracking engine would, so the pieces agree.
type regexSplitter struct{ re *regexp.Regexp }

func (r *regexSplitter) split(s string, ends []int, _ int) []int {
	prev := 0
	for _, m := range r.re.FindAllStringIndex(s, -1) {
		if m[0] > prev {
			ends = append(ends, m[0])
		}
		if m[1] > m[0] {
			ends = append(ends, m[1])
		}
		prev = m[1]
	}
	if prev < len(s) {
		ends = append(ends, len(s))
	}
	return ends
}

// Oniguruma's Unicode \s, \d and \w; Go's are ASCII-only.
const (
	spaceClass = `\t\n\v\f\r \x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}`
	digitClass = `\p{Nd}`
	wordClass  = `\p{L}\p{M}\p{Nd}\p{Pc}`
)

// newSplitter compiles an onig-syntax split pattern.
func newSplitter(pattern string) (splitter, error) {
	if sc := knownScanner(pattern); sc != nil {
		return sc, nil
	}
	goPat, err := translateOnig(pattern)
	if err != nil {
		return nil, err
	}
	re, err := regexp.Compile(goPat)
	if err != nil {
		return nil, fmt.Errorf("split pattern %q: %w", pattern, err)
	}
	return &regexSplitter{re: re}, nil
}

// translateOnig rewrites the class escapes whose meaning differs between
// Oniguruma and Go, and rejects constructs Go cannot run.
func translateOnig(p string) (string, error) {
	unsupported := func(what string) (string, error) {
		return "", fmt.Errorf("split pattern %q: %s is not supported", p, what)
	}
	var b strings.Builder
	inClass := false
	quantified := false // the previous token was a quantifier
	for i := 0; i < len(p); i++ {
		c := p[i]
		wasQuant := quantified
		quantified = false
		switch {
		case c == '\\' && i+1 < len(p):
			e := p[i+1]
			i++
			var cls string
			neg := false
			switch e {
			case 's', 'S':
				cls, neg = spaceClass, e == 'S'
			case 'd', 'D':
				cls, neg = digitClass, e == 'D'
			case 'w', 'W':
				cls, neg = wordClass, e == 'W'
			case 'p', 'P':
				// Copy \p{...} whole so its brace is not taken for a
				// counted repetition.
				j := strings.IndexByte(p[i:], '}')
				if j < 0 {
					return unsupported("an unterminated \\p{")
				}
				b.WriteString(p[i-1 : i+j+1])
				i += j
				continue
			default:
				if e >= '1' && e <= '9' {
					return unsupported("a backreference")
				}
				b.WriteByte('\\')
				b.WriteByte(e)
				continue
			}
			switch {
			case !inClass && !neg:
				b.WriteString("[" + cls + "]")
			case !inClass:
				b.WriteString("[^" + cls + "]")
			case !neg:
				b.WriteString(cls)
			default:
				return unsupported(fmt.Sprintf("\\%c inside a character class", e))
			}
		case inClass:
			if c == ']' {
				inClass = false
			}
			b.WriteByte(c)
		case c == '[':
			inClass = true
			b.WriteByte(c)
			if i+1 < len(p) && p[i+1] == '^' {
				b.WriteByte('^')
				i++
			}
			if i+1 < len(p) && p[i+1] == ']' {
				b.WriteString(`\]`)
				i++
			}
		case c == '(':
			for _, look := range []string{"(?=", "(?!", "(?<=", "(?<!", "(?>"} {
				if strings.HasPrefix(p[i:], look) {
					return unsupported("lookaround or an atomic group " + look)
				}
			}
			b.WriteByte(c)
		case c == '*' || c == '+' || c == '?' || c == '}':
			if c == '+' && wasQuant {
				return unsupported("a possessive quantifier")
			}
			quantified = c != '?' || !wasQuant
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// literalSplitter splits on a fixed string (Split's {"String": ...} form).
func literalSplitter(lit string) splitter {
	return &regexSplitter{re: regexp.MustCompile(regexp.QuoteMeta(lit))}
}
