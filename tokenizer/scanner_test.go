package tokenizer

import (
	"math"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// The oracle runs the same patterns in regexp2, which has lookahead. Its
// case-insensitive matching does not fold U+017F to 's' as Oniguruma does,
// so the contraction group is spelled out with that folding; the HF
// conformance cases check the folding itself.
var scannerPatterns = []struct {
	name    string
	pattern string
}{
	{"qwen2", qwenPattern(false, 1)},
	{"qwen35", qwenPattern(true, 1)},
	{"digits3", qwenPattern(false, 3)},
	{"qwen35-digits3", qwenPattern(true, 3)},
	{"gpt2", gpt2Pattern},
}

const foldedContractions = `(?:'[sS\x{17F}]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])`

func oracle(t testing.TB, pattern string) *regexp2.Regexp {
	p := strings.Replace(pattern, contractionsI, foldedContractions, 1)
	re, err := regexp2.Compile(p, regexp2.None)
	if err != nil {
		t.Fatalf("regexp2 %q: %v", p, err)
	}
	return re
}

// oraclePieces splits s with re, returning the matched pieces and gaps.
func oraclePieces(t testing.TB, re *regexp2.Regexp, s string) []string {
	runes := []rune(s)
	var out []string
	prev := 0
	m, err := re.FindRunesMatch(runes)
	for ; m != nil && err == nil; m, err = re.FindNextMatch(m) {
		if m.Index > prev {
			out = append(out, string(runes[prev:m.Index]))
		}
		if m.Length > 0 {
			out = append(out, string(runes[m.Index:m.Index+m.Length]))
		}
		prev = m.Index + m.Length
	}
	if err != nil {
		t.Fatal(err)
	}
	if prev < len(runes) {
		out = append(out, string(runes[prev:]))
	}
	return out
}

func splitPieces(sp splitter, s string) []string {
	var out []string
	start := 0
	for _, end := range sp.split(s, nil, math.MaxInt) {
		out = append(out, s[start:end])
		start = end
	}
	return out
}

var scannerSeeds = []string{
	"", "hello world", "Hello, World!", "it's IT'S they'll've 'ſ don'ſ", "a  b   c    ",
	"  \n\n  x\r\n\ty \t\n", "x   ", "   x", "1234567 ½² ３４５ Ⅻ", "e\u0301 A\u030a \u0301a",
	"\"quoted\" (paren) [x]", "!!!\n\n ?\r\n", "\u3000\u3000x\u00a0y\u0085z\u2028",
	"👩\u200d👩\u200d👧 🇺🇸 ❤️", "ab'cd'Sef", "'", "''", "' s", "\n", " ", "\t", "\r",
	"世界hello世界", "a\u0308\u0308b", "x\u0301\u0301 \u0301!", "1a2b3c", " 1 22 333 4444",
}

func TestScannerMatchesRegexp2(t *testing.T) {
	for _, p := range scannerPatterns {
		sc := knownScanner(p.pattern)
		if sc == nil {
			t.Fatalf("%s: no scanner", p.name)
		}
		re := oracle(t, p.pattern)
		for _, s := range scannerSeeds {
			got, want := splitPieces(sc, s), oraclePieces(t, re, s)
			if strings.Join(got, "|") != strings.Join(want, "|") || len(got) != len(want) {
				t.Errorf("%s %q:\n got %q\nwant %q", p.name, s, got, want)
			}
		}
	}
}

func FuzzScanner(f *testing.F) {
	for _, s := range scannerSeeds {
		f.Add(s)
	}
	type pair struct {
		sc *scanner
		re *regexp2.Regexp
	}
	var pairs []pair
	for _, p := range scannerPatterns {
		pairs = append(pairs, pair{knownScanner(p.pattern), oracle(f, p.pattern)})
	}
	f.Fuzz(func(t *testing.T, s string) {
		// Long inputs only slow the backtracking oracle down.
		if !utf8.ValidString(s) || len(s) > 512 {
			return
		}
		for i, p := range pairs {
			got, want := splitPieces(p.sc, s), oraclePieces(t, p.re, s)
			if len(got) != len(want) || strings.Join(got, "\x00") != strings.Join(want, "\x00") {
				t.Fatalf("%s %q:\n got %q\nwant %q", scannerPatterns[i].name, s, got, want)
			}
		}
	})
}

func TestGeneralSplitterMatchesScanner(t *testing.T) {
	// Without its lookahead, the Qwen pattern runs on the general path;
	// where the lookahead cannot matter (no whitespace run before a
	// non-space) it must split as the scanner does.
	noLook := strings.Replace(qwenPattern(false, 1), `|\s+(?!\S)`, "", 1)
	sp, err := newSplitter(noLook)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sp.(*regexSplitter); !ok {
		t.Fatalf("pattern without lookahead got %T", sp)
	}
	sc := knownScanner(qwenPattern(false, 1))
	for _, s := range []string{"hello world", "it's 123 ok!", "a\u3000b", "x\n\ny", "A\u00a0B"} {
		got, want := splitPieces(sp, s), splitPieces(sc, s)
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("%q: got %q want %q", s, got, want)
		}
	}
}

func TestUnsupportedPatterns(t *testing.T) {
	for _, p := range []string{`\s+(?!\S)`, `(?<=a)b`, `(a)\1`, `a++`, `(?>ab)`} {
		if _, err := newSplitter(p); err == nil {
			t.Errorf("%q: no error", p)
		}
	}
}
