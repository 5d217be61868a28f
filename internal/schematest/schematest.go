// Package schematest is test support for constrained decoding: random JSON
// schemas of the kinds applications send (objects with required and
// optional properties, arrays, enums, numbers with bounds, nesting,
// anyOf / oneOf, $defs), and validation of JSON against a schema by an
// independent validator (santhosh-tekuri/jsonschema, which passes the JSON
// Schema test suite).
package schematest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Validate reports why instance is not valid JSON or does not validate
// against schema; nil when it does.
func Validate(schema, instance []byte) error {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("schema.json", doc); err != nil {
		return err
	}
	sch, err := c.Compile("schema.json")
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(instance))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	if dec.More() {
		return fmt.Errorf("not JSON: data after the value")
	}
	return sch.Validate(v)
}

// Random returns a random schema. Every string has a maxLength and every
// array a maxItems, so that what a model writes under it ends soon.
func Random(r *rand.Rand) []byte {
	g := &gen{r: r}
	s := g.object(0)
	if r.IntN(4) == 0 {
		// A definition referred to from a property.
		def := g.value(1)
		s["$defs"] = map[string]any{"item": def}
		props := s["properties"].(map[string]any)
		props["ref"] = map[string]any{"$ref": "#/$defs/item"}
	}
	b, _ := json.Marshal(s)
	return b
}

type gen struct{ r *rand.Rand }

var words = []string{"name", "id", "count", "tags", "price", "city", "items", "kind", "score", "ok", "notes", "when", "é", "a b"}

func (g *gen) value(depth int) map[string]any {
	k := g.r.IntN(10)
	if depth >= 3 {
		k = 4 + g.r.IntN(6)
	}
	switch k {
	case 0, 1:
		return g.object(depth)
	case 2:
		return map[string]any{"type": "array", "items": g.value(depth + 1), "minItems": 0, "maxItems": 1 + g.r.IntN(3)}
	case 3:
		return map[string]any{"anyOf": []any{g.value(depth + 1), map[string]any{"type": "null"}}}
	case 4:
		n := 1 + g.r.IntN(4)
		var vals []any
		for i := range n {
			switch g.r.IntN(3) {
			case 0:
				vals = append(vals, words[g.r.IntN(len(words))]+fmt.Sprint(i))
			case 1:
				vals = append(vals, g.r.IntN(100)-20)
			default:
				vals = append(vals, strings.Repeat("x", i))
			}
		}
		return map[string]any{"enum": vals}
	case 5:
		s := map[string]any{"type": "integer"}
		if g.r.IntN(2) == 0 {
			lo := g.r.IntN(200) - 100
			s["minimum"] = lo
			s["maximum"] = lo + g.r.IntN(300)
		}
		return s
	case 6:
		s := map[string]any{"type": "number"}
		if g.r.IntN(2) == 0 {
			s["exclusiveMinimum"] = float64(g.r.IntN(100)) / 4
		}
		if g.r.IntN(2) == 0 {
			s["maximum"] = 30 + float64(g.r.IntN(100))/8
		}
		return s
	case 7:
		lo := g.r.IntN(3)
		return map[string]any{"type": "string", "minLength": lo, "maxLength": lo + g.r.IntN(12)}
	case 8:
		return map[string]any{"type": []any{"boolean", "null"}[g.r.IntN(2)]}
	}
	return map[string]any{"oneOf": []any{
		map[string]any{"type": "string", "maxLength": 5},
		map[string]any{"type": "integer"},
		map[string]any{"type": "object", "properties": map[string]any{"v": map[string]any{"type": "boolean"}}, "required": []any{"v"}, "additionalProperties": false},
	}}
}

func (g *gen) object(depth int) map[string]any {
	props := map[string]any{}
	var required []any
	n := 1 + g.r.IntN(4)
	for i := range n {
		name := words[g.r.IntN(len(words))] + fmt.Sprint(i)
		props[name] = g.value(depth + 1)
		if g.r.IntN(2) == 0 {
			required = append(required, name)
		}
	}
	s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}
