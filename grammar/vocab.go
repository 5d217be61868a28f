package grammar

import (
	"bytes"
	"slices"
	"sync"
	"unicode/utf8"
)

// Vocab is a tokenizer's vocabulary as the bytes each token writes,
// indexed for masks: a trie of the tokens' byte strings in depth-first
// order, so that a mask is computed by one walk that leaves a subtree as
// soon as the grammar refuses its prefix. A Vocab is built once per
// tokenizer and is read-only: safe for concurrent use.
type Vocab struct {
	size   int      // mask bits: the model's vocabulary
	tokens [][]byte // id -> bytes (nil: never allowed)
	nodes  []vocabNode
	edges  []vocabEdge
	ends   []int32 // the tokens ending at each node, node by node
	// plain is the bitset of the tokens that are plain JSON string
	// content: whole UTF-8 characters, none a control character, quote or
	// backslash. Such a token leaves an unbounded string where it was.
	plain []uint64

	strOnce sync.Once
	str     *stringTable
}

type vocabNode struct {
	edges, edgesEnd int32 // children: edges[edges:edgesEnd], by byte
	ends, endsEnd   int32 // tokens spelled by the path to this node
	plain           bool  // every token of the subtree is plain
}

type vocabEdge struct {
	b    byte
	node int32
}

// NewVocab indexes tokens (id -> the bytes the token writes; nil or empty
// for tokens a grammar never allows, such as special tokens) for masks of
// size bits (the model's vocabulary, which may exceed the tokenizer's).
func NewVocab(tokens [][]byte, size int) *Vocab {
	v := &Vocab{size: size, tokens: make([][]byte, size), plain: make([]uint64, (size+63)/64)}
	var ids []int32
	for id, b := range tokens[:min(len(tokens), size)] {
		if len(b) > 0 {
			v.tokens[id] = b
			ids = append(ids, int32(id))
			if plainString(b) {
				v.plain[id>>6] |= 1 << (id & 63)
			}
		}
	}
	slices.SortFunc(ids, func(a, b int32) int {
		if c := bytes.Compare(v.tokens[a], v.tokens[b]); c != 0 {
			return c
		}
		return int(a - b)
	})
	v.build(ids, 0)
	return v
}

// build adds the trie node of the tokens ids (sorted, sharing their first
// depth bytes) and its subtree, and returns its index.
func (v *Vocab) build(ids []int32, depth int) int32 {
	at := int32(len(v.nodes))
	v.nodes = append(v.nodes, vocabNode{})
	nd := vocabNode{ends: int32(len(v.ends)), plain: true}
	i := 0
	for i < len(ids) && len(v.tokens[ids[i]]) == depth {
		v.ends = append(v.ends, ids[i])
		nd.plain = nd.plain && plainString(v.tokens[ids[i]])
		i++
	}
	nd.endsEnd = int32(len(v.ends))
	type group struct {
		b      byte
		lo, hi int
	}
	var groups []group
	for i < len(ids) {
		b := v.tokens[ids[i]][depth]
		j := i
		for j < len(ids) && v.tokens[ids[j]][depth] == b {
			j++
		}
		groups = append(groups, group{b, i, j})
		i = j
	}
	nd.edges = int32(len(v.edges))
	v.edges = append(v.edges, make([]vocabEdge, len(groups))...)
	nd.edgesEnd = int32(len(v.edges))
	for k, g := range groups {
		child := v.build(ids[g.lo:g.hi], depth+1)
		v.edges[int(nd.edges)+k] = vocabEdge{g.b, child}
		nd.plain = nd.plain && v.nodes[child].plain
	}
	v.nodes[at] = nd
	return at
}

func plainString(b []byte) bool {
	for _, c := range b {
		if c < 0x20 || c == '"' || c == '\\' {
			return false
		}
	}
	return utf8.Valid(b)
}

// Size is the number of tokens a mask covers.
func (v *Vocab) Size() int { return v.size }

// words is the length of a mask.
func (v *Vocab) words() int { return (v.size + 63) / 64 }

// tokenSet is a computed mask, kept as a bitset or, when few tokens are
// allowed, as their list.
type tokenSet struct {
	bits []uint64
	list []int32
}

func newTokenSet(bits []uint64) *tokenSet {
	n := 0
	for _, w := range bits {
		for ; w != 0; w &= w - 1 {
			n++
		}
	}
	if 4*n >= 8*len(bits) {
		return &tokenSet{bits: bits}
	}
	ts := &tokenSet{list: make([]int32, 0, n)}
	for i, w := range bits {
		for ; w != 0; w &= w - 1 {
			ts.list = append(ts.list, int32(64*i+trailingZeros(w)))
		}
	}
	return ts
}

// bytes is the memory the set holds.
func (t *tokenSet) bytes() int { return 8*len(t.bits) + 4*len(t.list) }

// fill sets the set's tokens in dst.
func (t *tokenSet) fill(dst []uint64) {
	if t.bits != nil {
		for i, w := range t.bits {
			dst[i] |= w
		}
		return
	}
	for _, tok := range t.list {
		dst[tok>>6] |= 1 << (tok & 63)
	}
}

// stringTable is what each token writes into a JSON string it starts in
// between two characters: the characters it begins before a closing quote
// (or its end), and whether it closes the string. For the bounds of a
// string's length: longer[k] is the bitset of the tokens that begin more
// than k characters (k < denseChars), long the tokens that begin at least
// denseChars, closing the tokens that close a string.
type stringTable struct {
	chars   []int32
	longer  [denseChars][]uint64
	long    []int32
	closing []int32
}

const denseChars = 64

// strings returns the vocabulary's string table, built on first use.
func (v *Vocab) strings() *stringTable {
	v.strOnce.Do(func() {
		t := &stringTable{chars: make([]int32, v.size)}
		words := v.words()
		for k := range t.longer {
			t.longer[k] = make([]uint64, words)
		}
		var m machine
		for id, b := range v.tokens {
			f := frame{phase: sBody, b: -1}
			n := int32(0)
			for _, c := range b {
				if f.phase == sBody && c == '"' {
					t.closing = append(t.closing, int32(id))
					break
				}
				if f.phase == sBody {
					n++
				}
				if !m.char(&f, c, true) {
					break // never allowed in a string: in no mask there
				}
			}
			t.chars[id] = n
			for k := range min(n, denseChars) {
				t.longer[k][id>>6] |= 1 << (id & 63)
			}
			if n >= denseChars {
				t.long = append(t.long, int32(id))
			}
		}
		v.str = t
	})
	return v.str
}

// fillWithin sets in dst the tokens of the set that a string needing need
// more characters and allowing room more (-1: any) takes.
func (ts *tokenSet) fillWithin(dst []uint64, t *stringTable, need, room int32) {
	ts.fill(dst)
	switch {
	case room >= denseChars:
		for _, id := range t.long {
			if t.chars[id] > room {
				dst[id>>6] &^= 1 << (id & 63)
			}
		}
	case room >= 0:
		for i, w := range t.longer[room] {
			dst[i] &^= w
		}
	}
	if need > 0 {
		for _, id := range t.closing {
			if t.chars[id] < need {
				dst[id>>6] &^= 1 << (id & 63)
			}
		}
	}
}
