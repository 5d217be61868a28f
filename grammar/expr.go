package grammar

import (
	"bytes"
	"encoding/json"
	"math/big"
	"strings"
)

// kind is what a node matches.
type kind uint8

const (
	kLiteral kind = iota // one of the byte strings of lit
	kString              // a JSON string of minLen..maxLen characters
	kNumber              // a JSON number (integer: no fraction), within bounds
	kObject              // a JSON object: props in order, then extra keys
	kArray               // a JSON array of minItems..maxItems items
	kUnion               // any of alts (never a frame: entered as each alt)
	kSeq                 // parts one after the other
	kUntil               // any bytes up to and including the first until
	kText                // raw UTF-8 text of minLen..maxLen characters not containing until
	kSpace               // up to maxSpace whitespace bytes
	kAccept              // the bottom of every stack: the whole grammar matched
)

// node is a compiled grammar expression. Nodes form a graph (a schema's
// $ref may make it cyclic) that is read-only once compiled, except for the
// key tries objects build on first use (under the grammar's lock).
type node struct {
	kind kind

	lit    *trie // kLiteral
	values []any // kLiteral of enum or const: the values (decoded)
	base   *node // the other keywords beside an enum, until filter applied them

	// kString, kText: character bounds (maxLen -1: none); kString of an
	// object's extra key: exclude holds the defined property names.
	minLen, maxLen int
	exclude        *trie
	until          []byte  // kUntil, kText: the terminator (kText: forbidden)
	fail           []int32 // KMP failure function of until

	num *numberSpec // kNumber

	// kObject: the properties in the schema's order, which is the order
	// they are written in; extra (nil: none) the schema of other keys.
	props []prop
	extra *node
	xkey  *node   // an extra key: a string that is no property's name
	keys  []*trie // by first candidate index, built on first use

	// kArray
	items              *node
	minItems, maxItems int // maxItems -1: none

	alts  []*node // kUnion
	parts []*node // kSeq

	nullable bool // matches the empty string (kSeq, kUnion, kText, kSpace)
	sat      bool // some string matches it (after compile's fixpoint)
	// loose: a schema without type, enum or const, whose keywords kiln
	// read as a type: it matches values of other types too.
	loose bool
}

type prop struct {
	name     string
	value    *node
	required bool
}

// Expr is a grammar expression: a language of byte strings. Build one from
// a JSON schema (Schema) or from the constructors below, and Compile it.
type Expr struct{ n *node }

// Literal matches s exactly.
func Literal(s string) Expr { return Expr{literal(s)} }

func literal(ss ...string) *node {
	t := &trie{}
	for i, s := range ss {
		t.insert([]byte(s), i)
	}
	return &node{kind: kLiteral, lit: t, sat: len(ss) > 0}
}

// Seq matches its parts one after the other.
func Seq(parts ...Expr) Expr {
	n := &node{kind: kSeq}
	for _, p := range parts {
		n.parts = append(n.parts, p.n)
	}
	return Expr{n}
}

// Alt matches any of its alternatives (none: nothing).
func Alt(alts ...Expr) Expr {
	n := &node{kind: kUnion}
	for _, a := range alts {
		n.alts = append(n.alts, a.n)
	}
	return Expr{n}
}

// Until matches any bytes up to and including the first occurrence of
// terminator: free text such as a model's reasoning before "</think>".
func Until(terminator string) Expr {
	return Expr{&node{kind: kUntil, until: []byte(terminator), fail: failure([]byte(terminator))}}
}

// failure is the KMP failure function of s: fail[i] is the length of the
// longest proper prefix of s[:i+1] that is also its suffix.
func failure(s []byte) []int32 {
	fail := make([]int32, len(s))
	k := int32(0)
	for i := 1; i < len(s); i++ {
		for k > 0 && s[i] != s[k] {
			k = fail[k-1]
		}
		if s[i] == s[k] {
			k++
		}
		fail[i] = k
	}
	return fail
}

// Space matches up to maxSpace bytes of JSON whitespace (space, tab,
// newline, carriage return): what may precede a value.
func Space() Expr { return Expr{&node{kind: kSpace}} }

// maxSpace bounds each run of whitespace a grammar allows between JSON
// tokens: enough for a newline and the indentation of pretty-printed JSON,
// not a model's endless run of newlines.
const maxSpace = 20

// trie is a set of byte strings, each with a value (its index).
type trie struct {
	nodes []trieNode
}

type trieNode struct {
	next  []trieEdge // sorted by byte
	value int32      // -1: no string ends here
}

type trieEdge struct {
	b    byte
	node int32
}

func (t *trie) insert(s []byte, value int) {
	if len(t.nodes) == 0 {
		t.nodes = append(t.nodes, trieNode{value: -1})
	}
	at := int32(0)
	for _, c := range s {
		nx := t.child(at, c)
		if nx < 0 {
			nx = int32(len(t.nodes))
			t.nodes = append(t.nodes, trieNode{value: -1})
			edges := t.nodes[at].next
			i := 0
			for i < len(edges) && edges[i].b < c {
				i++
			}
			edges = append(edges, trieEdge{})
			copy(edges[i+1:], edges[i:])
			edges[i] = trieEdge{c, nx}
			t.nodes[at].next = edges
		}
		at = nx
	}
	if t.nodes[at].value < 0 {
		t.nodes[at].value = int32(value)
	}
}

// child returns the node after byte c from node at, -1 if none.
func (t *trie) child(at int32, c byte) int32 {
	if at < 0 || int(at) >= len(t.nodes) {
		return -1
	}
	for _, e := range t.nodes[at].next {
		if e.b == c {
			return e.node
		}
		if e.b > c {
			break
		}
	}
	return -1
}

func (t *trie) terminal(at int32) bool {
	return at >= 0 && int(at) < len(t.nodes) && t.nodes[at].value >= 0
}
func (t *trie) leaf(at int32) bool { return len(t.nodes[at].next) == 0 }
func (t *trie) empty() bool        { return len(t.nodes) == 0 }

// numberSpec bounds a JSON number.
type numberSpec struct {
	integer bool
	// lo, hi: the bounds as grid points (multiples of 10^-fracDigits, or
	// integers), nil when unbounded; bounded says whether either is set.
	lo, hi  *big.Rat
	bounded bool
}

// encode writes v as compact JSON without HTML escaping: the bytes a model
// writes for a literal value.
func encode(v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// Record compiles an object schema to its properties written one after
// the other in a syntax of the caller's (a tool call's XML form): for each
// property in the schema's order, optional ones possibly left out, open,
// the value and close, as field says. A value is written as JSON of the
// type field names, or, for "string", as raw text: unquoted, unescaped,
// free of forbidden. Values of other types than the one named are not
// written (whoever reads the record types values so).
func Record(schema []byte, field func(name string) (open, close, typ string), forbidden string) (Expr, error) {
	e, err := Schema(schema)
	if err != nil {
		return Expr{}, err
	}
	obj := e.n
	if obj.kind != kObject {
		return Expr{}, &SchemaError{Reason: "parameters must be an object schema"}
	}
	seq := &node{kind: kSeq}
	for _, p := range obj.props {
		open, close, typ := field(p.name)
		v := restrict(p.value, typ, forbidden, map[*node]*node{})
		if v == nil {
			if p.required {
				return Expr{}, &SchemaError{Path: "/properties/" + escapePointer(p.name), Reason: "no value of type " + typ + " is allowed"}
			}
			continue
		}
		part := &node{kind: kSeq, parts: []*node{literal(open), v, literal(close)}}
		if !p.required {
			part = &node{kind: kUnion, alts: []*node{part, {kind: kSeq}}}
		}
		seq.parts = append(seq.parts, part)
	}
	analyze(seq)
	if !seq.sat {
		return Expr{}, &SchemaError{Reason: "it allows no value"}
	}
	return Expr{seq}, nil
}

// restrict returns the part of n that writes values of JSON type typ
// ("string": as raw text without forbidden), nil if none.
func restrict(n *node, typ, forbidden string, seen map[*node]*node) *node {
	if r, ok := seen[n]; ok {
		return r
	}
	seen[n] = nil // a union reached again through itself adds nothing
	var r *node
	switch n.kind {
	case kUnion:
		u := &node{kind: kUnion}
		for _, a := range n.alts {
			if x := restrict(a, typ, forbidden, seen); x != nil {
				u.alts = append(u.alts, x)
			}
		}
		if len(u.alts) > 0 {
			r = u
		}
	case kString:
		if typ == "string" {
			r = &node{kind: kText, minLen: n.minLen, maxLen: n.maxLen, until: []byte(forbidden), fail: failure([]byte(forbidden))}
		}
	case kNumber:
		switch {
		case typ == "number" || typ == "integer" && n.num.integer:
			r = n
		case typ == "integer":
			spec := &numberSpec{integer: true}
			var lo, hi *big.Rat
			if n.num.bounded {
				lo, hi = n.num.lo, n.num.hi
			}
			r = &node{kind: kNumber, num: spec, sat: spec.setBounds(lo, hi, false, false)}
		}
	case kObject, kArray:
		if typ == map[kind]string{kObject: "object", kArray: "array"}[n.kind] {
			r = n
		}
	case kLiteral:
		var texts []string
		var values []any
		for _, v := range n.values {
			var t string
			switch x := v.(type) {
			case string:
				t = "string"
				if typ == t && !strings.Contains(x, forbidden) {
					texts = append(texts, x)
				}
			case json.Number:
				t = "number"
				if d, _ := decimalOf(string(x)); typ == "integer" && d.exp >= int64(len(d.digits)) {
					t = "integer"
				}
			case bool:
				t = "boolean"
			case nil:
				t = "null"
			case *object:
				t = "object"
			case []any:
				t = "array"
			}
			if t == typ && typ != "string" {
				values = append(values, v)
			}
		}
		switch {
		case typ == "string" && len(texts) > 0:
			r = literal(texts...)
		case len(values) > 0:
			r = literal()
			for i, v := range values {
				r.lit.insert(encode(v), i)
			}
			r.values = values
		}
	}
	seen[n] = r
	return r
}

// ObjectSchema is Schema restricted to the objects it allows (a tool's
// arguments).
func ObjectSchema(schema []byte) (Expr, error) {
	e, err := Schema(schema)
	if err != nil {
		return Expr{}, err
	}
	n := restrict(e.n, "object", "", map[*node]*node{})
	if n == nil {
		return Expr{}, &SchemaError{Reason: "it allows no object"}
	}
	return Expr{n}, nil
}
