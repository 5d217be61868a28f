// Package grammar constrains a model's output to a language of byte
// strings, token by token: JSON values of a JSON schema (a subset of JSON
// Schema compiled to a pushdown automaton over bytes), tool calls, free text
// up to a terminator. For each step of a generation it gives the set of
// vocabulary tokens that can continue a valid output, as a bitset the
// sampler takes, and whether the output may end there.
//
// The automaton keeps every reading of the bytes so far at once (a set of
// stacks, usually one), interned so that a state's transitions and its
// token mask are computed once and remembered: the mask of a state seen
// before is a copy, and a new one is one walk of the vocabulary's token
// trie (Vocab) that leaves a subtree as soon as the automaton refuses its
// prefix.
//
// Every state the automaton reaches can still complete (subschemas that
// allow nothing are pruned at compile time), so a vocabulary that holds
// every single byte as a token never leaves a generation without a token.
package grammar

import (
	"math/bits"
	"sync"
)

// Limits on what one grammar remembers; past them it starts afresh (the
// generations under way keep their states).
const (
	maxStates    = 1 << 15
	maxMaskBytes = 64 << 20
)

// Grammar is an expression compiled for one vocabulary. It is safe for
// concurrent use; its Matchers share what it has computed.
type Grammar struct {
	mu        sync.Mutex
	top       *node
	v         *Vocab
	m         *machine
	maskBytes int
}

// Compile compiles e for the tokens of v.
func Compile(e Expr, v *Vocab) *Grammar {
	analyze(e.n) // expressions built by the constructors
	return &Grammar{top: e.n, v: v, m: newMachine(e.n)}
}

// Matcher follows one generation.
type Matcher struct {
	g      *Grammar
	states []*State // after 0, 1, ... tokens
}

// Matcher returns a matcher at the grammar's start.
func (g *Grammar) Matcher() *Matcher {
	g.mu.Lock()
	defer g.mu.Unlock()
	return &Matcher{g: g, states: []*State{g.m.start}}
}

// Allow sets in allowed (a bitset of the vocabulary, token t at bit t%64 of
// word t/64) the tokens that may follow generated, the tokens of the
// generation so far, and reports whether the output may end there. A
// generation that left the grammar (a token it did not allow) gets none.
// generated may be asked again shorter (a preempted generation starting
// over) as long as it is a prefix of what was asked before.
func (mt *Matcher) Allow(generated []int32, allowed []uint64) (end bool) {
	g := mt.g
	g.mu.Lock()
	defer g.mu.Unlock()
	for len(mt.states) <= len(generated) {
		s := mt.states[len(mt.states)-1]
		t := generated[len(mt.states)-1]
		var b []byte
		if t >= 0 && int(t) < len(g.v.tokens) {
			b = g.v.tokens[t]
		}
		if len(b) == 0 {
			s = g.m.dead
		}
		for _, c := range b {
			s = g.m.step(s, c)
		}
		mt.states = append(mt.states, s)
	}
	s := mt.states[len(generated)]
	if len(s.stacks) == 0 {
		return false
	}
	g.fill(s, allowed)
	return s.accept
}

// fill sets in dst the tokens that may follow state s.
func (g *Grammar) fill(s *State, dst []uint64) {
	if r, need, room, ok := g.m.relaxed(s); ok {
		// In a string with a length bound: the mask of the same string
		// unbounded, less the tokens that would break the bound.
		g.mask(r).fillWithin(dst, g.v.strings(), need, room)
		return
	}
	g.mask(s).fill(dst)
}

// Valid reports whether text is a complete output of the grammar.
func (g *Grammar) Valid(text []byte) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.m.start
	for _, c := range text {
		s = g.m.step(s, c)
	}
	return s.accept
}

// mask returns the tokens that may follow state s.
func (g *Grammar) mask(s *State) *tokenSet {
	if s.mask != nil {
		return s.mask
	}
	if len(g.m.states) > maxStates || g.maskBytes > maxMaskBytes {
		// Start afresh: states interned from now on are new ones (s and
		// the states the matchers hold keep working, unshared).
		g.m = newMachine(g.top)
		g.maskBytes = 0
	}
	bits := make([]uint64, g.v.words())
	var skip *State
	if g.m.openString(s) {
		// Plain tokens lead s back to itself: all allowed, and the walk
		// leaves their subtrees alone.
		copy(bits, g.v.plain)
		skip = s
	}
	g.walk(0, s, skip, bits)
	s.mask = newTokenSet(bits)
	g.maskBytes += s.mask.bytes()
	return s.mask
}

// walk sets the tokens under trie node vn that state s allows, leaving
// alone the plain subtrees entered in state skip (see mask).
func (g *Grammar) walk(vn int32, s, skip *State, bits []uint64) {
	v := g.v
	nd := v.nodes[vn]
	for _, e := range v.edges[nd.edges:nd.edgesEnd] {
		next := g.m.step(s, e.b)
		c := &v.nodes[e.node]
		if len(next.stacks) == 0 || next == skip && c.plain {
			continue
		}
		for _, t := range v.ends[c.ends:c.endsEnd] {
			bits[t>>6] |= 1 << (t & 63)
		}
		if c.edgesEnd > c.edges {
			g.walk(e.node, next, skip, bits)
		}
	}
}

func trailingZeros(w uint64) int { return bits.TrailingZeros64(w) }
