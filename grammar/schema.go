package grammar

import (
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"
)

// SchemaError is a JSON schema kiln cannot constrain output to: malformed,
// allowing no value, or using a feature the compiler does not support,
// which Feature names.
type SchemaError struct {
	Path    string // JSON pointer of the subschema, "" for the root
	Feature string // the unsupported keyword or construct, if that is the reason
	Reason  string
}

func (e *SchemaError) Error() string {
	at := "the schema"
	if e.Path != "" {
		at = "the schema at " + e.Path
	}
	return at + ": " + e.Reason
}

// Keywords that only annotate: read past.
var annotations = map[string]bool{
	"title": true, "description": true, "default": true, "examples": true, "$schema": true, "$id": true,
	"$comment": true, "deprecated": true, "readOnly": true, "writeOnly": true, "$defs": true, "definitions": true,
	"strict": true, "name": true, "contentMediaType": true, "contentEncoding": true,
}

// Keywords that constrain and are supported (the rest of JSON Schema's
// vocabulary is refused by name: see unsupported).
var supported = map[string]bool{
	"type": true, "enum": true, "const": true, "properties": true, "required": true, "additionalProperties": true,
	"items": true, "minItems": true, "maxItems": true, "minLength": true, "maxLength": true,
	"minimum": true, "maximum": true, "exclusiveMinimum": true, "exclusiveMaximum": true,
	"anyOf": true, "oneOf": true, "allOf": true, "$ref": true,
}

var unsupported = map[string]bool{
	"pattern": true, "format": true, "patternProperties": true, "propertyNames": true, "dependentRequired": true,
	"dependentSchemas": true, "dependencies": true, "if": true, "then": true, "else": true, "not": true,
	"minProperties": true, "maxProperties": true, "uniqueItems": true, "contains": true, "minContains": true,
	"maxContains": true, "multipleOf": true, "prefixItems": true, "additionalItems": true,
	"unevaluatedProperties": true, "unevaluatedItems": true, "$dynamicRef": true, "$recursiveRef": true,
	"$anchor": true, "$dynamicAnchor": true, "$recursiveAnchor": true,
}

type oneOf struct {
	alts []*node
	path string
}

// maxProperties bounds an object's properties: the keys that may come
// next are a trie per position, up to the next required property.
const maxProperties = 256

// compiler turns a JSON schema (a JSON Schema subset) into nodes.
type compiler struct {
	root  any
	refs  map[string]*node // compiled $ref targets, by pointer
	oneOf []oneOf          // checked disjoint at the end
	lits  []*node          // enum and const literals, filtered at the end
}

// Schema compiles a JSON schema to the expression of the JSON values it
// allows, written compactly or with bounded whitespace, object properties
// in the schema's order. It supports objects (properties, required,
// additionalProperties), arrays (items, minItems, maxItems), strings
// (minLength, maxLength), numbers and integers (minimum, maximum and their
// exclusive forms), booleans, null, enum, const, anyOf, oneOf (of disjoint
// alternatives), allOf of one schema, and $ref to the schema's own
// definitions ("#/$defs/...", "#/definitions/...", "#"), recursion
// included. Anything else is a *SchemaError naming it.
func Schema(schema []byte) (Expr, error) {
	v, err := parseJSON(schema)
	if err != nil {
		return Expr{}, &SchemaError{Reason: "not valid JSON: " + err.Error()}
	}
	c := &compiler{root: v, refs: map[string]*node{}}
	n, err := c.compile(v, "")
	if err != nil {
		return Expr{}, err
	}
	for _, l := range c.lits {
		l.filter()
	}
	analyze(n)
	for _, o := range c.oneOf {
		for i, a := range o.alts {
			for _, b := range o.alts[:i] {
				if a.sat && b.sat && !disjoint(a, b) {
					return Expr{}, &SchemaError{Path: o.path, Feature: "oneOf",
						Reason: "oneOf alternatives that may both match a value are not supported (anyOf is)"}
				}
			}
		}
	}
	if !n.sat {
		return Expr{}, &SchemaError{Reason: "it allows no value"}
	}
	return Expr{n}, nil
}

// JSONValue is the expression of any JSON value (the schema {}).
func JSONValue() Expr {
	n := anyValue()
	analyze(n)
	return Expr{n}
}

// JSONObject is the expression of any JSON object (OpenAI's json_object).
func JSONObject() Expr {
	n := anyValue()
	analyze(n)
	return Expr{n.alts[0]}
}

func (c *compiler) fail(path, feature, format string, args ...any) error {
	return &SchemaError{Path: path, Feature: feature, Reason: fmt.Sprintf(format, args...)}
}

func (c *compiler) compile(v any, path string) (*node, error) {
	switch s := v.(type) {
	case bool:
		if s {
			return anyValue(), nil
		}
		return &node{kind: kUnion}, nil // allows nothing
	case *object:
		return c.compileObject(s, path)
	}
	return nil, c.fail(path, "", "a schema must be an object or a boolean")
}

func (c *compiler) compileObject(s *object, path string) (*node, error) {
	var constraints []string
	for _, k := range s.keys {
		switch {
		case unsupported[k]:
			if k == "uniqueItems" && s.vals[k] == false {
				continue
			}
			return nil, c.fail(path, k, "the keyword %q is not supported", k)
		case supported[k]:
			constraints = append(constraints, k)
		}
	}
	only := func(k string) error {
		for _, o := range constraints {
			if o != k {
				return c.fail(path, k, "%s beside other keywords (%s) is not supported", k, o)
			}
		}
		return nil
	}
	if ref, ok := s.get("$ref"); ok {
		if err := only("$ref"); err != nil {
			return nil, err
		}
		return c.ref(ref, path)
	}
	if all, ok := s.get("allOf"); ok {
		if err := only("allOf"); err != nil {
			return nil, err
		}
		list, ok := all.([]any)
		if !ok || len(list) != 1 {
			return nil, c.fail(path, "allOf", "allOf of more than one schema is not supported")
		}
		return c.compile(list[0], path+"/allOf/0")
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		raw, ok := s.get(k)
		if !ok {
			continue
		}
		if err := only(k); err != nil {
			return nil, err
		}
		list, ok := raw.([]any)
		if !ok || len(list) == 0 {
			return nil, c.fail(path, "", "%s must be a non-empty array of schemas", k)
		}
		u := &node{kind: kUnion}
		for i, alt := range list {
			a, err := c.compile(alt, fmt.Sprintf("%s/%s/%d", path, k, i))
			if err != nil {
				return nil, err
			}
			u.alts = append(u.alts, a)
		}
		if k == "oneOf" {
			c.oneOf = append(c.oneOf, oneOf{u.alts, path})
		}
		return u, nil
	}
	var values []any
	if e, ok := s.get("enum"); ok {
		list, ok := e.([]any)
		if !ok {
			return nil, c.fail(path, "", "enum must be an array")
		}
		values = list
		if _, ok := s.get("const"); ok {
			return nil, c.fail(path, "const", "enum beside const is not supported")
		}
	} else if v, ok := s.get("const"); ok {
		values = []any{v}
	}
	types, err := c.types(s, path)
	if err != nil {
		return nil, err
	}
	var alts []*node
	for _, t := range types {
		n, err := c.typed(t, s, path)
		if err != nil {
			return nil, err
		}
		alts = append(alts, n)
	}
	base := alts[0]
	if len(alts) > 1 {
		base = &node{kind: kUnion, alts: alts}
	}
	if values == nil {
		_, typed := s.get("type")
		base.loose = !typed
		return base, nil
	}
	lit := &node{kind: kLiteral, lit: &trie{}, values: values, base: base}
	c.lits = append(c.lits, lit)
	return lit, nil
}

// types returns the JSON types a schema allows: its type keyword, or those
// its keywords are about, or all.
func (c *compiler) types(s *object, path string) ([]string, error) {
	all := []string{"object", "array", "string", "number", "boolean", "null"}
	raw, ok := s.get("type")
	if !ok {
		var ts []string
		for t, keys := range map[string][]string{
			"object": {"properties", "required", "additionalProperties"},
			"array":  {"items", "minItems", "maxItems"},
			"string": {"minLength", "maxLength"},
			"number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
		} {
			for _, k := range keys {
				if _, ok := s.get(k); ok {
					ts = append(ts, t)
					break
				}
			}
		}
		if len(ts) == 0 {
			return all, nil
		}
		slices.Sort(ts)
		return ts, nil
	}
	var ts []string
	switch t := raw.(type) {
	case string:
		ts = []string{t}
	case []any:
		for _, x := range t {
			s, ok := x.(string)
			if !ok {
				return nil, c.fail(path, "", "type must be a string or an array of strings")
			}
			ts = append(ts, s)
		}
	default:
		return nil, c.fail(path, "", "type must be a string or an array of strings")
	}
	for _, t := range ts {
		if !slices.Contains(all, t) && t != "integer" {
			return nil, c.fail(path, "", "unknown type %q", t)
		}
	}
	if len(ts) == 0 {
		return nil, c.fail(path, "", "type must name at least one type")
	}
	return ts, nil
}

// typed compiles the keywords of s that apply to values of type t.
func (c *compiler) typed(t string, s *object, path string) (*node, error) {
	switch t {
	case "null":
		return literalValues("null"), nil
	case "boolean":
		return literalValues("true", "false"), nil
	case "string":
		n := &node{kind: kString}
		var err error
		n.minLen, n.maxLen, err = c.counts(s, "minLength", "maxLength", path)
		return n, err
	case "number", "integer":
		return c.number(t == "integer", s, path)
	case "array":
		return c.array(s, path)
	}
	return c.object(s, path)
}

// literalValues is a literal of JSON values written as themselves.
func literalValues(texts ...string) *node {
	n := literal(texts...)
	for _, t := range texts {
		v, _ := parseJSON([]byte(t))
		n.values = append(n.values, v)
	}
	return n
}

// counts reads a pair of bounds on a count (minimum 0 and maximum -1 when
// absent).
func (c *compiler) counts(s *object, lo, hi, path string) (int, int, error) {
	min, err := c.count(s, lo, path, 0)
	if err != nil {
		return 0, 0, err
	}
	max, err := c.count(s, hi, path, -1)
	return min, max, err
}

// count reads a non-negative integer keyword (def when absent).
func (c *compiler) count(s *object, k, path string, def int) (int, error) {
	raw, ok := s.get(k)
	if !ok {
		return def, nil
	}
	num, ok := raw.(json.Number)
	if ok {
		if r, ok := ratOf(string(num)); ok && r.IsInt() && r.Sign() >= 0 && r.Num().IsInt64() && r.Num().Int64() < 1<<31 {
			return int(r.Num().Int64()), nil
		}
	}
	return 0, c.fail(path, "", "%s must be a non-negative integer", k)
}

func (c *compiler) number(integer bool, s *object, path string) (*node, error) {
	n := &node{kind: kNumber, num: &numberSpec{integer: integer}}
	bound := func(k string) (*big.Rat, error) {
		raw, ok := s.get(k)
		if !ok {
			return nil, nil
		}
		num, ok := raw.(json.Number)
		if !ok {
			return nil, c.fail(path, "", "%s must be a number", k)
		}
		r, ok := ratOf(string(num))
		if !ok {
			return nil, c.fail(path, "", "%s is not a number", k)
		}
		return r, nil
	}
	min, err := bound("minimum")
	if err != nil {
		return nil, err
	}
	max, err := bound("maximum")
	if err != nil {
		return nil, err
	}
	exclMin, exclMax := false, false
	for _, e := range []struct {
		k     string
		limit **big.Rat
		excl  *bool
		lower bool
	}{{"exclusiveMinimum", &min, &exclMin, true}, {"exclusiveMaximum", &max, &exclMax, false}} {
		raw, ok := s.get(e.k)
		if !ok {
			continue
		}
		if b, ok := raw.(bool); ok { // draft 4: a flag on minimum / maximum
			*e.excl = b && *e.limit != nil
			continue
		}
		r, err := bound(e.k)
		if err != nil {
			return nil, err
		}
		// Draft 6 on: a bound of its own; the tighter one wins.
		if *e.limit == nil || e.lower && r.Cmp(*e.limit) >= 0 || !e.lower && r.Cmp(*e.limit) <= 0 {
			*e.limit, *e.excl = r, true
		}
	}
	n.sat = n.num.setBounds(min, max, exclMin, exclMax)
	return n, nil
}

func (c *compiler) array(s *object, path string) (*node, error) {
	n := &node{kind: kArray}
	var err error
	if n.minItems, n.maxItems, err = c.counts(s, "minItems", "maxItems", path); err != nil {
		return nil, err
	}
	items, ok := s.get("items")
	switch {
	case !ok:
		n.items = anyValue()
	case isArray(items):
		return nil, c.fail(path, "items", "items as an array of schemas (a tuple) is not supported")
	default:
		if n.items, err = c.compile(items, path+"/items"); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func isArray(v any) bool {
	_, ok := v.([]any)
	return ok
}

func (c *compiler) object(s *object, path string) (*node, error) {
	n := &node{kind: kObject}
	if raw, ok := s.get("properties"); ok {
		props, ok := raw.(*object)
		if !ok {
			return nil, c.fail(path, "", "properties must be an object")
		}
		if len(props.keys) > maxProperties {
			return nil, c.fail(path, "properties", "more than %d properties in one object are not supported", maxProperties)
		}
		for _, name := range props.keys {
			v, err := c.compile(props.vals[name], path+"/properties/"+escapePointer(name))
			if err != nil {
				return nil, err
			}
			n.props = append(n.props, prop{name: name, value: v})
		}
	}
	add, hasAdd := s.get("additionalProperties")
	switch a := add.(type) {
	case bool:
		if a {
			n.extra = anyValue()
		}
	case nil:
		if !hasAdd && len(n.props) == 0 {
			// {"type": "object"}: any object. With properties listed, no
			// others are written (they would still be valid).
			n.extra = anyValue()
		}
	default:
		v, err := c.compile(add, path+"/additionalProperties")
		if err != nil {
			return nil, err
		}
		n.extra = v
	}
	if raw, ok := s.get("required"); ok {
		list, ok := raw.([]any)
		if !ok {
			return nil, c.fail(path, "", "required must be an array of strings")
		}
		for _, r := range list {
			name, ok := r.(string)
			if !ok {
				return nil, c.fail(path, "", "required must be an array of strings")
			}
			i := slices.IndexFunc(n.props, func(p prop) bool { return p.name == name })
			if i < 0 {
				// Required but not listed: written last, as extra properties
				// are (none allowed: the object allows no value).
				v := n.extra
				if v == nil {
					v = &node{kind: kUnion}
				}
				n.props = append(n.props, prop{name: name, value: v})
				i = len(n.props) - 1
			}
			n.props[i].required = true
		}
	}
	if n.extra != nil {
		n.xkey = &node{kind: kString, maxLen: -1, sat: true}
		if len(n.props) > 0 {
			n.xkey.exclude = &trie{}
			for i, p := range n.props {
				n.xkey.exclude.insert([]byte(p.name), i)
			}
		}
	}
	return n, nil
}

// ref compiles the target of a $ref, once per target (which makes
// recursive schemas cyclic graphs).
func (c *compiler) ref(raw any, path string) (*node, error) {
	ref, ok := raw.(string)
	if !ok || !strings.HasPrefix(ref, "#") {
		return nil, c.fail(path, "$ref", "only $ref to the schema's own definitions (\"#/$defs/...\") is supported, not %v", raw)
	}
	if n, ok := c.refs[ref]; ok {
		return n, nil
	}
	target := c.root
	ptr := strings.TrimPrefix(ref, "#")
	if ptr != "" {
		if !strings.HasPrefix(ptr, "/") {
			return nil, c.fail(path, "$ref", "$ref %q is not a JSON pointer", ref)
		}
		for _, tok := range strings.Split(ptr[1:], "/") {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			var next any
			switch t := target.(type) {
			case *object:
				next, ok = t.get(tok)
			case []any:
				i, err := strconv.Atoi(tok)
				ok = err == nil && i >= 0 && i < len(t)
				if ok {
					next = t[i]
				}
			}
			if !ok {
				return nil, c.fail(path, "$ref", "$ref %q points nowhere", ref)
			}
			target = next
		}
	}
	// The node exists before its content, for the references inside it.
	n := &node{}
	c.refs[ref] = n
	compiled, err := c.compile(target, ptr)
	if err != nil {
		return nil, err
	}
	*n = *compiled
	if compiled.kind == kLiteral {
		c.lits = append(c.lits, n)
	}
	return n, nil
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// anyValue is the node of any JSON value: a union of an object and an array
// of any values, a string, a number and the literals.
func anyValue() *node {
	v := &node{kind: kUnion, loose: true}
	obj := &node{kind: kObject, extra: v, xkey: &node{kind: kString, maxLen: -1, sat: true}}
	arr := &node{kind: kArray, items: v, maxItems: -1}
	v.alts = []*node{obj, arr, {kind: kString, maxLen: -1}, {kind: kNumber, num: &numberSpec{}, sat: true},
		literalValues("true", "false", "null")}
	return v
}

// analyze computes which nodes reachable from root match some string (sat)
// and which match the empty string (nullable), as least fixpoints, since
// $ref makes the graph cyclic. An array whose items match nothing can only
// be empty.
func analyze(root *node) {
	var all []*node
	seen := map[*node]bool{}
	var visit func(n *node)
	visit = func(n *node) {
		if n == nil || seen[n] {
			return
		}
		seen[n] = true
		all = append(all, n)
		for _, p := range n.props {
			visit(p.value)
		}
		for _, x := range append(append([]*node{n.extra, n.xkey, n.items}, n.alts...), n.parts...) {
			visit(x)
		}
	}
	visit(root)
	for _, n := range all {
		switch n.kind {
		case kLiteral:
			n.sat = !n.lit.empty()
			n.nullable = n.sat && n.lit.terminal(0)
		case kString, kText:
			n.sat = n.maxLen < 0 || n.minLen <= n.maxLen
			n.nullable = n.kind == kText && n.minLen == 0
		case kUntil:
			n.sat = true
		case kSpace:
			n.sat, n.nullable = true, true
		case kObject, kArray, kUnion, kSeq:
			n.sat, n.nullable = false, false
		}
	}
	for changed := true; changed; {
		changed = false
		for _, n := range all {
			sat, nullable := n.sat, n.nullable
			switch n.kind {
			case kObject:
				sat = true
				for _, p := range n.props {
					sat = sat && (!p.required || p.value.sat)
				}
			case kArray:
				sat = (n.minItems == 0 || n.items.sat) && (n.maxItems < 0 || n.minItems <= n.maxItems)
			case kUnion:
				sat, nullable = false, false
				for _, a := range n.alts {
					sat = sat || a.sat
					nullable = nullable || a.sat && a.nullable
				}
			case kSeq:
				sat, nullable = true, true
				for _, p := range n.parts {
					sat = sat && p.sat
					nullable = nullable && p.nullable
				}
			}
			if sat != n.sat || nullable != n.nullable {
				n.sat, n.nullable, changed = sat, nullable, true
			}
		}
	}
	for _, n := range all {
		if n.kind == kArray && !n.items.sat {
			n.maxItems = 0
		}
	}
}

// disjoint reports whether no value one of a and b writes matches the
// other's schema, conservatively (false when unsure): their types differ,
// or both are literals of different values, or both are objects with a
// required property whose literal values differ (a tagged union).
// Schemas whose type kiln inferred (loose) match values of any type.
func disjoint(a, b *node) bool {
	for _, u := range []*node{a, b} {
		if u.kind == kUnion {
			other := a
			if u == a {
				other = b
			}
			for _, x := range u.alts {
				if x.sat && !disjoint(x, other) {
					return false
				}
			}
			return !u.loose
		}
	}
	if a.loose || b.loose {
		return false
	}
	ta, tb := typesOf(a), typesOf(b)
	if ta&tb == 0 {
		return true
	}
	switch {
	case a.kind == kLiteral && b.kind == kLiteral:
		for _, v := range a.values {
			for _, w := range b.values {
				if jsonEqual(v, w) {
					return false
				}
			}
		}
		return true
	case a.kind == kObject && b.kind == kObject:
		for _, p := range a.props {
			i := slices.IndexFunc(b.props, func(q prop) bool { return q.name == p.name })
			if p.required && i >= 0 && b.props[i].required && p.value.kind == kLiteral && b.props[i].value.kind == kLiteral &&
				disjoint(p.value, b.props[i].value) {
				return true
			}
		}
	}
	return false
}

// JSON types as bits, for disjoint (an integer is a number).
const (
	tObject = 1 << iota
	tArray
	tString
	tNumber
	tBoolean
	tNull
)

// typesOf returns the JSON types of the values n writes.
func typesOf(n *node) int {
	switch n.kind {
	case kObject:
		return tObject
	case kArray:
		return tArray
	case kString, kText:
		return tString
	case kNumber:
		return tNumber
	case kLiteral:
		t := 0
		for _, v := range n.values {
			switch v.(type) {
			case *object:
				t |= tObject
			case []any:
				t |= tArray
			case string:
				t |= tString
			case json.Number:
				t |= tNumber
			case bool:
				t |= tBoolean
			default:
				t |= tNull
			}
		}
		return t
	}
	t := 0
	for _, x := range n.alts {
		t |= typesOf(x)
	}
	return t
}
