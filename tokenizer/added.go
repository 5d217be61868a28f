package tokenizer

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's "added_tokens".
type addedToken struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// addedMatcher finds added tokens in text the way HF's AddedVocabulary does:
// leftmost-longest matches (its Aho-Corasick automaton), then the
// single_word, lstrip and rstrip rules applied to each match in turn.
type addedMatcher struct {
	first [256]bool
	// byFirst lists the patterns by first byte, longest first.
	byFirst map[byte][]addedPattern
}

type addedPattern struct {
	text string
	tok  *addedToken
}

func newAddedMatcher(pats []addedPattern) *addedMatcher {
	m := &addedMatcher{byFirst: map[byte][]addedPattern{}}
	for _, p := range pats {
		if p.text == "" {
			continue
		}
		m.first[p.text[0]] = true
		m.byFirst[p.text[0]] = append(m.byFirst[p.text[0]], p)
	}
	for _, l := range m.byFirst {
		sort.SliceStable(l, func(i, j int) bool { return len(l[i].text) > len(l[j].text) })
	}
	return m
}

func (m *addedMatcher) empty() bool { return len(m.byFirst) == 0 }

// find returns the leftmost-longest match in s at or after from.
func (m *addedMatcher) find(s string, from int) (start, end int, tok *addedToken) {
	for i := from; i < len(s); i++ {
		if !m.first[s[i]] {
			continue
		}
		for _, p := range m.byFirst[s[i]] {
			if strings.HasPrefix(s[i:], p.text) {
				return i, i + len(p.text), p.tok
			}
		}
	}
	return -1, -1, nil
}

// segment is a span of text, or of an added token when tok is set.
type segment struct {
	text string
	tok  *addedToken
}

// split cuts s into text and added-token segments, appending them to segs.
// The whitespace an lstrip/rstrip token takes becomes part of its segment.
func (m *addedMatcher) split(s string, segs []segment) []segment {
	if m.empty() {
		return append(segs, segment{text: s})
	}
	done := 0 // end of the last emitted segment
	for pos := 0; pos < len(s); {
		start, end, tok := m.find(s, pos)
		if tok == nil {
			break
		}
		pos = end
		if tok.SingleWord {
			startOK := start == 0 || !endsWithWord(s[:start])
			stopOK := end == len(s) || !startsWithWord(s[end:])
			if !startOK || !stopOK {
				continue
			}
		}
		if tok.LStrip {
			start = max(trailingSpaceStart(s[:start]), done)
		}
		if tok.RStrip {
			end += leadingSpaceLen(s[end:])
		}
		if done < start {
			segs = append(segs, segment{text: s[done:start]})
		}
		segs = append(segs, segment{text: s[start:end], tok: tok})
		done = end
	}
	if done < len(s) {
		segs = append(segs, segment{text: s[done:]})
	}
	return segs
}

// isWordChar is the Unicode \w of Rust's regex crate, which HF uses for
// single_word: Alphabetic, marks, decimal digits, connector punctuation and
// the joiners.
func isWordChar(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) ||
		unicode.Is(unicode.Pc, r) || unicode.Is(unicode.Nl, r) ||
		unicode.Is(unicode.Other_Alphabetic, r) || r == 0x200C || r == 0x200D
}

func isSpace(r rune) bool { return unicode.Is(unicode.White_Space, r) }

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return len(s) > 0 && isWordChar(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return len(s) > 0 && isWordChar(r)
}

func trailingSpaceStart(s string) int {
	i := len(s)
	for i > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if !isSpace(r) {
			break
		}
		i -= n
	}
	return i
}

func leadingSpaceLen(s string) int {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !isSpace(r) {
			break
		}
		i += n
	}
	return i
}
