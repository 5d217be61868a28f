package grammar

import (
	"encoding/binary"
	"slices"
)

// The machine matches bytes against a node graph as a pushdown automaton
// that keeps every possible reading at once (a set of stacks, usually one):
// a stack's top frame is the node being matched and how far it got, the
// frames below are where to go on when it completes (each parent frame
// already holds the phase it continues in). Stacks are interned, so equal
// stacks are one pointer, and sets of them are interned as States, whose
// transitions are remembered: matching a byte a state has seen before is
// one array lookup, which is what makes walking a vocabulary's token trie
// fast (see Grammar.mask).

// frame is one node being matched.
type frame struct {
	n       *node
	phase   uint8
	ws      uint8 // whitespace bytes in the current run (containers)
	a, b, c int32
	num     string // the number so far, for a bounded number
}

// Frame fields by kind:
//
//	kLiteral  a: trie node
//	kString   a: characters still needed, b: characters still allowed (-1: any),
//	          c: node of exclude (-1: left it)
//	kText     as kString, c: the forbidden string's match length (KMP)
//	kNumber   a: digits of the current part
//	kObject   a: first property that may come next, b: key trie node (oKey),
//	          property whose value follows (oColon, oValue; -1: an extra key's)
//	kArray    a: items so far (saturated)
//	kSeq      a: next part
//	kUntil    c: the terminator's match length
//	kSpace    a: bytes so far

// String phases (kString, kText).
const (
	sOpen uint8 = iota // before the opening quote
	sBody              // between characters
	sEsc               // after a backslash
	sU0                // after \u
	sU1                // one hex digit read
	sU1D               // the hex digit D read: no surrogate
	sU2
	sU3
	sC1 // UTF-8: one continuation byte due
	sC2
	sC3
	sE0 // after E0: A0-BF, then one more
	sED // after ED: 80-9F (no surrogate), then one more
	sF0 // after F0: 90-BF, then two more
	sF4 // after F4: 80-8F, then two more
	sDone
)

// Object phases.
const (
	oOpen  uint8 = iota
	oFirst       // after '{'
	oKey         // in a property's key
	oColon       // after a key
	oValue       // after ':'
	oAfter       // after a value
	oComma       // after ','
	oDone
)

// Array phases.
const (
	aOpen  uint8 = iota
	aFirst       // after '['
	aAfter       // after an item
	aNext        // after ','
	aDone
)

const phaseDone uint8 = 1 // kUntil

// stack is an interned stack of frames: its top frame and the rest.
type stack struct {
	f      frame
	parent *stack
	id     uint32
}

type stackKey struct {
	f      frame
	parent *stack
}

// State is a set of stacks: where a grammar's match can be after some
// bytes. States are interned per grammar; dead (no stack) matches nothing.
type State struct {
	stacks []*stack
	accept bool // the whole grammar can end here
	next   *[256]*State
	mask   *tokenSet // the tokens that may follow, once computed
}

// machine interns a grammar's stacks and states. It is not safe for
// concurrent use (Grammar locks it).
type machine struct {
	stacks   map[stackKey]*stack
	states   map[string]*State
	accepted *stack
	dead     *State
	start    *State
	key      []byte
	unions   []*node // being entered
}

var acceptNode = &node{kind: kAccept, sat: true}

func newMachine(top *node) *machine {
	m := &machine{stacks: map[stackKey]*stack{}, states: map[string]*State{}}
	m.accepted = m.push(nil, frame{n: acceptNode})
	m.dead = m.intern(nil)
	m.start = m.intern(m.enter(top, m.accepted, nil))
	return m
}

// step returns the state after byte c.
func (m *machine) step(s *State, c byte) *State {
	if s.next != nil {
		if n := s.next[c]; n != nil {
			return n
		}
	} else if s != m.dead {
		s.next = new([256]*State)
	} else {
		return s
	}
	var out []*stack
	for _, st := range s.stacks {
		out = m.feed(st, c, out)
	}
	n := m.intern(out)
	s.next[c] = n
	return n
}

// intern returns the state of a set of stacks (in any order, repeats
// allowed).
func (m *machine) intern(stacks []*stack) *State {
	slices.SortFunc(stacks, func(a, b *stack) int { return int(a.id) - int(b.id) })
	stacks = slices.Compact(stacks)
	m.key = m.key[:0]
	for _, st := range stacks {
		m.key = binary.LittleEndian.AppendUint32(m.key, st.id)
	}
	if s, ok := m.states[string(m.key)]; ok {
		return s
	}
	s := &State{stacks: slices.Clone(stacks)}
	for _, st := range stacks {
		s.accept = s.accept || st.f.n == acceptNode
	}
	m.states[string(m.key)] = s
	return s
}

// push returns the stack of f on parent.
func (m *machine) push(parent *stack, f frame) *stack {
	k := stackKey{f, parent}
	if st, ok := m.stacks[k]; ok {
		return st
	}
	st := &stack{f: f, parent: parent, id: uint32(len(m.stacks))}
	m.stacks[k] = st
	return st
}

// top returns st with its top frame replaced by f.
func (m *machine) top(st *stack, f frame) *stack { return m.push(st.parent, f) }

// completion says whether a frame's node has matched, and whether it may
// go on.
type completion uint8

const (
	open      completion = iota // must go on
	complete                    // has matched and cannot go on
	completes                   // has matched and may go on
)

func (m *machine) completion(f *frame) completion {
	n := f.n
	switch n.kind {
	case kLiteral:
		switch {
		case !n.lit.terminal(f.a):
			return open
		case n.lit.leaf(f.a):
			return complete
		}
		return completes
	case kString:
		if f.phase == sDone {
			return complete
		}
	case kText:
		if f.phase == sBody && f.a == 0 {
			if f.b == 0 {
				return complete
			}
			return completes
		}
	case kNumber:
		if numberEnds(n.num, f) {
			return completes
		}
	case kObject:
		if f.phase == oDone {
			return complete
		}
	case kArray:
		if f.phase == aDone {
			return complete
		}
	case kSeq:
		if int(f.a) == len(n.parts) {
			return complete
		}
		for _, p := range n.parts[f.a:] {
			if !p.nullable {
				return open
			}
		}
		return completes
	case kUntil:
		if f.phase == phaseDone {
			return complete
		}
	case kSpace:
		if f.a == maxSpace {
			return complete
		}
		return completes
	}
	return open
}

// settle appends st to out, and what is left when its top frames complete:
// a complete frame is popped (its parent goes on), one that may go on is
// kept and popped.
func (m *machine) settle(st *stack, out []*stack) []*stack {
	for {
		switch m.completion(&st.f) {
		case open:
			return append(out, st)
		case completes:
			out = append(out, st)
		}
		st = st.parent
	}
}

// enter appends to out the stacks that start matching n on parent: one per
// alternative of a union, settled (a node that matches the empty string
// also leaves parent going on).
func (m *machine) enter(n *node, parent *stack, out []*stack) []*stack {
	if !n.sat {
		return out
	}
	f := frame{n: n}
	switch n.kind {
	case kUnion:
		// A union that holds itself (through a $ref) adds nothing by it.
		if slices.Contains(m.unions, n) {
			return out
		}
		m.unions = append(m.unions, n)
		for _, a := range n.alts {
			out = m.enter(a, parent, out)
		}
		m.unions = m.unions[:len(m.unions)-1]
		return out
	case kString:
		f.phase, f.a, f.b = sOpen, int32(n.minLen), int32(n.maxLen)
	case kText:
		f.phase, f.a, f.b = sBody, int32(n.minLen), int32(n.maxLen)
	}
	return m.settle(m.push(parent, f), out)
}

// feedInto appends the stacks that start matching n on parent with byte c.
func (m *machine) feedInto(n *node, parent *stack, c byte, out []*stack) []*stack {
	for _, st := range m.enter(n, parent, nil) {
		out = m.feed(st, c, out)
	}
	return out
}

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\t' || c == '\r' }

// space appends st after a whitespace byte in a container frame f.
func (m *machine) space(st *stack, f frame, out []*stack) []*stack {
	if f.ws >= maxSpace {
		return out
	}
	f.ws++
	return m.settle(m.top(st, f), out)
}

// feed appends the stacks st becomes after byte c (none: c cannot follow).
func (m *machine) feed(st *stack, c byte, out []*stack) []*stack {
	f := st.f
	n := f.n
	switch n.kind {
	case kLiteral:
		nx := n.lit.child(f.a, c)
		if nx < 0 {
			return out
		}
		f.a = nx
	case kString:
		if f.phase == sOpen {
			if c != '"' {
				return out
			}
			f.phase = sBody
			break
		}
		if f.phase == sBody && c == '"' {
			if f.a > 0 || n.exclude != nil && f.c >= 0 && n.exclude.terminal(f.c) {
				return out
			}
			f.phase = sDone
			break
		}
		if n.exclude != nil {
			if c == '\\' {
				return out // extra keys are written unescaped: compared as bytes
			}
			f.c = n.exclude.child(f.c, c)
		}
		if !m.char(&f, c, true) {
			return out
		}
	case kText:
		if !m.char(&f, c, false) {
			return out
		}
		if f.c = kmp(n, f.c, c); int(f.c) == len(n.until) {
			return out
		}
	case kUntil:
		if f.c = kmp(n, f.c, c); int(f.c) == len(n.until) {
			f.phase = phaseDone
		}
	case kSpace:
		if !isSpace(c) || f.a >= maxSpace {
			return out
		}
		f.a++
	case kNumber:
		if !numberByte(n.num, &f, c) {
			return out
		}
	case kSeq:
		// Parts are entered as the bytes reach them.
		next := f
		next.a++
		return m.feedInto(n.parts[f.a], m.top(st, next), c, out)
	case kObject:
		return m.feedObject(st, f, c, out)
	case kArray:
		return m.feedArray(st, f, c, out)
	default: // kAccept
		return out
	}
	return m.settle(m.top(st, f), out)
}

// char advances a string's character state by byte c (JSON string rules:
// escapes, no control characters; text: raw UTF-8, tab and newlines
// allowed). A character's bounds are counted at its first byte, so that it
// can always be finished.
func (m *machine) char(f *frame, c byte, json bool) bool {
	ph := f.phase
	next := sBody
	switch ph {
	case sBody:
		switch {
		case c == '\\' && json:
			next = sEsc
		case c < 0x20:
			if json || c != '\n' && c != '\t' && c != '\r' {
				return false
			}
		case c < 0x80:
		case c >= 0xC2 && c <= 0xDF:
			next = sC1
		case c == 0xE0:
			next = sE0
		case c == 0xED:
			next = sED
		case c >= 0xE1 && c <= 0xEF:
			next = sC2
		case c == 0xF0:
			next = sF0
		case c >= 0xF1 && c <= 0xF3:
			next = sC3
		case c == 0xF4:
			next = sF4
		default:
			return false
		}
		if f.b == 0 {
			return false
		}
		if f.b > 0 {
			f.b--
		}
		if f.a > 0 {
			f.a--
		}
	case sEsc:
		switch c {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		case 'u':
			next = sU0
		default:
			return false
		}
	case sU0:
		if !isHex(c) {
			return false
		}
		next = sU1
		if c == 'd' || c == 'D' {
			next = sU1D
		}
	case sU1D:
		if c < '0' || c > '7' {
			return false
		}
		next = sU2
	case sU1, sU2:
		if !isHex(c) {
			return false
		}
		next = ph + 1
		if ph == sU1 {
			next = sU2
		}
	case sU3:
		if !isHex(c) {
			return false
		}
	case sC1, sC2, sC3:
		if c < 0x80 || c > 0xBF {
			return false
		}
		next = ph - 1
		if ph == sC1 {
			next = sBody
		}
	case sE0, sED, sF0, sF4:
		lo, hi, then := byte(0xA0), byte(0xBF), sC1
		switch ph {
		case sED:
			lo, hi = 0x80, 0x9F
		case sF0:
			lo, hi, then = 0x90, 0xBF, sC2
		case sF4:
			lo, hi, then = 0x80, 0x8F, sC2
		}
		if c < lo || c > hi {
			return false
		}
		next = then
	default:
		return false
	}
	f.phase = next
	return true
}

func isHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// kmp advances the match length of n.until by byte c.
func kmp(n *node, k int32, c byte) int32 {
	for {
		if n.until[k] == c {
			return k + 1
		}
		if k == 0 {
			return 0
		}
		k = n.fail[k-1]
	}
}

func (m *machine) feedObject(st *stack, f frame, c byte, out []*stack) []*stack {
	n := f.n
	switch f.phase {
	case oOpen:
		if c != '{' {
			return out
		}
		f.phase = oFirst
	case oFirst, oComma:
		if isSpace(c) {
			return m.space(st, f, out)
		}
		if c == '}' && f.phase == oFirst && n.closable(int(f.a)) {
			f.phase = oDone
			break
		}
		if c != '"' {
			return out
		}
		f.ws = 0
		if t := n.keyTrie(int(f.a)); !t.empty() {
			k := f
			k.phase, k.b = oKey, t.child(0, c)
			out = m.settle(m.top(st, k), out)
		}
		if n.extra != nil && n.closable(int(f.a)) {
			k := f
			k.phase, k.a, k.b = oColon, int32(len(n.props)), -1
			out = m.feedInto(n.xkey, m.top(st, k), c, out)
		}
		return out
	case oKey:
		t := n.keyTrie(int(f.a))
		nx := t.child(f.b, c)
		if nx < 0 {
			return out
		}
		f.b = nx
		if t.terminal(nx) {
			j := t.nodes[nx].value
			f.phase, f.a, f.b = oColon, j+1, j
		}
	case oColon:
		if isSpace(c) {
			return m.space(st, f, out)
		}
		if c != ':' {
			return out
		}
		f.phase, f.ws = oValue, 0
	case oValue:
		if isSpace(c) {
			return m.space(st, f, out)
		}
		v := n.extra
		if f.b >= 0 {
			v = n.props[f.b].value
		}
		f.phase, f.ws, f.b = oAfter, 0, 0
		return m.feedInto(v, m.top(st, f), c, out)
	case oAfter:
		return m.afterValue(st, f, c, '}', n.more(int(f.a)), n.closable(int(f.a)), oComma, oDone, out)
	default:
		return out
	}
	return m.settle(m.top(st, f), out)
}

func (m *machine) feedArray(st *stack, f frame, c byte, out []*stack) []*stack {
	n := f.n
	switch f.phase {
	case aOpen:
		if c != '[' {
			return out
		}
		f.phase = aFirst
	case aFirst, aNext:
		if isSpace(c) {
			return m.space(st, f, out)
		}
		if c == ']' && f.phase == aFirst && n.minItems == 0 {
			f.phase, f.ws = aDone, 0
			break
		}
		if n.maxItems >= 0 && int(f.a) >= n.maxItems {
			return out
		}
		f.phase, f.ws = aAfter, 0
		if n.maxItems >= 0 || int(f.a) < n.minItems {
			f.a++ // counted only while a bound needs it
		}
		return m.feedInto(n.items, m.top(st, f), c, out)
	case aAfter:
		return m.afterValue(st, f, c, ']', n.maxItems < 0 || int(f.a) < n.maxItems, int(f.a) >= n.minItems, aNext, aDone, out)
	default:
		return out
	}
	return m.settle(m.top(st, f), out)
}

// afterValue advances a container frame f after one of its values by byte
// c: whitespace; ',' (to phase comma) when more may come; its closing byte
// (to phase done) when it may end.
func (m *machine) afterValue(st *stack, f frame, c, closing byte, more, closable bool, comma, done uint8, out []*stack) []*stack {
	switch {
	case isSpace(c):
		return m.space(st, f, out)
	case c == ',' && more:
		f.phase = comma
	case c == closing && closable:
		f.phase = done
	default:
		return out
	}
	f.ws = 0
	return m.settle(m.top(st, f), out)
}

// closable reports whether an object whose next property can be props[a]
// may end: no required property is left.
func (n *node) closable(a int) bool {
	for _, p := range n.props[min(a, len(n.props)):] {
		if p.required {
			return false
		}
	}
	return true
}

// more reports whether a key may follow a ',' when the next property can
// be props[a].
func (n *node) more(a int) bool {
	return !n.keyTrie(a).empty() || n.extra != nil && n.closable(a)
}

// keyTrie returns the trie of the keys that may come when the next property
// can be props[a]: those of props[a] up to the first required one, each
// quoted as JSON writes it, its value the property's index.
func (n *node) keyTrie(a int) *trie {
	if n.keys == nil {
		n.keys = make([]*trie, len(n.props)+1)
	}
	if t := n.keys[a]; t != nil {
		return t
	}
	t := &trie{}
	for j := a; j < len(n.props); j++ {
		p := n.props[j]
		if p.value.sat {
			t.insert(encode(p.name), j)
		}
		if p.required {
			break
		}
	}
	n.keys[a] = t
	return t
}

// relaxed returns, for a state inside a JSON string with a length bound
// (every stack between characters of a string, with the same characters
// needed and allowed), the state of the same strings unbounded, and the
// bound. The tokens allowed in s are those allowed in the relaxed state
// that fit the bound (see Vocab.strings): a string's bound then costs no
// mask of its own for each of its lengths.
func (m *machine) relaxed(s *State) (r *State, need, room int32, ok bool) {
	var stacks []*stack
	for i, st := range s.stacks {
		f := st.f
		if f.n.kind != kString || f.phase != sBody || i > 0 && (f.a != need || f.b != room) {
			return nil, 0, 0, false
		}
		need, room = f.a, f.b
		f.a, f.b = 0, -1
		stacks = append(stacks, m.top(st, f))
	}
	if need == 0 && room < 0 {
		return nil, 0, 0, false
	}
	return m.intern(stacks), need, room, true
}

// openString reports whether every stack of s is between the characters
// of a JSON string without bounds or excluded values: a plain token (see
// Vocab.plain) leads s back to itself.
func (m *machine) openString(s *State) bool {
	for _, st := range s.stacks {
		f := &st.f
		if f.n.kind != kString || f.phase != sBody || f.a != 0 || f.b >= 0 || f.n.exclude != nil {
			return false
		}
	}
	return len(s.stacks) > 0
}
