package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// object is a JSON object that keeps its keys' order: a schema's
// properties are written in the order it lists them.
type object struct {
	keys []string
	vals map[string]any
}

func (o *object) get(k string) (any, bool) {
	v, ok := o.vals[k]
	return v, ok
}

// MarshalJSON writes the object in key order (enum and const values).
func (o *object) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.Write(encode(k))
		buf.WriteByte(':')
		buf.Write(encode(o.vals[k]))
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// parseJSON decodes one JSON value: objects as *object, arrays as []any,
// numbers as json.Number, strings, booleans and nil.
func parseJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, fmt.Errorf("data after the JSON value")
	}
	return v, nil
}

// maxNesting bounds how deeply a schema may nest, against a hostile one.
const maxNesting = 128

func decodeValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxNesting {
		return nil, fmt.Errorf("nested deeper than %d levels", maxNesting)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			o := &object{vals: map[string]any{}}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k := kt.(string)
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				if _, dup := o.vals[k]; !dup {
					o.keys = append(o.keys, k)
				}
				o.vals[k] = v
			}
			_, err := dec.Token()
			return o, err
		case '[':
			a := []any{}
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				a = append(a, v)
			}
			_, err := dec.Token()
			return a, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	}
	return tok, nil
}

// jsonEqual reports whether two decoded JSON values are equal as JSON
// Schema compares them (numbers by value, objects whatever their order).
func jsonEqual(a, b any) bool {
	switch x := a.(type) {
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		dx, okx := decimalOf(string(x))
		dy, oky := decimalOf(string(y))
		return okx && oky && dx == dy
	case *object:
		y, ok := b.(*object)
		if !ok || len(x.vals) != len(y.vals) {
			return false
		}
		for k, v := range x.vals {
			w, ok := y.vals[k]
			if !ok || !jsonEqual(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !jsonEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	return a == b
}

// accepts reports whether n matches the JSON encoding of v (for enum and
// const values beside other keywords; a reading of what the machine
// generates, not a general validator).
func (n *node) accepts(v any) bool {
	switch n.kind {
	case kLiteral:
		n.filter()
		for _, w := range n.values {
			if jsonEqual(v, w) {
				return true
			}
		}
	case kString:
		s, ok := v.(string)
		if !ok {
			return false
		}
		k := utf8.RuneCountInString(s)
		return k >= n.minLen && (n.maxLen < 0 || k <= n.maxLen)
	case kNumber:
		x, ok := v.(json.Number)
		if !ok {
			return false
		}
		r, ok := ratOf(string(x))
		return ok && (!n.num.integer || r.IsInt()) && n.num.within(r, r)
	case kObject:
		o, ok := v.(*object)
		if !ok {
			return false
		}
		defined := map[string]bool{}
		for _, p := range n.props {
			defined[p.name] = true
			pv, has := o.get(p.name)
			if has && !p.value.accepts(pv) || !has && p.required {
				return false
			}
		}
		for _, k := range o.keys {
			if !defined[k] && (n.extra == nil || !n.extra.accepts(o.vals[k])) {
				return false
			}
		}
		return true
	case kArray:
		a, ok := v.([]any)
		if !ok || len(a) < n.minItems || n.maxItems >= 0 && len(a) > n.maxItems {
			return false
		}
		for _, x := range a {
			if !n.items.accepts(x) {
				return false
			}
		}
		return true
	case kUnion:
		for _, alt := range n.alts {
			if alt.accepts(v) {
				return true
			}
		}
	}
	return false
}

// filter keeps the enum or const values of a literal that the schema's
// other keywords (base) accept.
func (n *node) filter() {
	b := n.base
	if b == nil {
		return
	}
	n.base = nil // a value that reaches n again through a $ref is judged by values alone
	var kept []any
	n.lit = &trie{}
	for _, v := range n.values {
		if b.accepts(v) {
			n.lit.insert(encode(v), len(kept))
			kept = append(kept, v)
		}
	}
	n.values = kept
}
