package grammar

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/internal/schematest"
)

// testVocab is every single byte, as byte-level BPE vocabularies hold, and
// tokens spanning JSON's structure as real ones do.
func testVocab() *Vocab {
	var toks [][]byte
	for b := range 256 {
		toks = append(toks, []byte{byte(b)})
	}
	for _, s := range []string{`{"`, `":`, `": "`, `", "`, `"}`, `},`, `}]`, `"]`, `["`, `true`, `false`, `null`, ` "`,
		"\n  ", "\n    \"", `é`, `\u00e9`, `12`, `0.5`, `-1`, `name`, `"name": "`, `abc`, `"`, `\"`, "é\"}", "</think>", "\n\n", `"x"`} {
		toks = append(toks, []byte(s))
	}
	toks = append(toks, nil) // a special token
	return NewVocab(toks, len(toks)+5)
}

func allowedList(mask []uint64) []int32 {
	var out []int32
	for i, w := range mask {
		for ; w != 0; w &= w - 1 {
			out = append(out, int32(64*i+trailingZeros(w)))
		}
	}
	return out
}

// generate writes a random output of g, a token at a time among those
// allowed, ending where it may with probability 1/8; done is false when
// maxTokens ran out first.
func generate(t testing.TB, g *Grammar, r *rand.Rand, maxTokens int) (out []byte, done bool) {
	mt := g.Matcher()
	var gen []int32
	mask := make([]uint64, g.v.words())
	for len(gen) < maxTokens {
		clear(mask)
		end := mt.Allow(gen, mask)
		allowed := allowedList(mask)
		if end && (len(allowed) == 0 || r.IntN(8) == 0) {
			return out, true
		}
		if len(allowed) == 0 {
			t.Fatalf("no token after %q", out)
		}
		tok := allowed[r.IntN(len(allowed))]
		if len(g.v.tokens[tok]) == 0 {
			t.Fatalf("token %d, which writes nothing, allowed after %q", tok, out)
		}
		gen = append(gen, tok)
		out = append(out, g.v.tokens[tok]...)
	}
	return out, false
}

func TestSchemaLanguage(t *testing.T) {
	v := testVocab()
	for _, c := range []struct {
		schema  string
		ok, bad []string
	}{
		{`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string","maxLength":3}},"required":["a"]}`,
			[]string{`{"a":1}`, `{"a": -12, "b": "xyz"}`, "{\n  \"a\": 0\n}", `{"a":1,"b":""}`, `{"a":1,"b":"\u00e9\n\""}`},
			[]string{`{}`, `{"b":"x"}`, `{"a":1.5}`, `{"a":1,"b":"wxyz"}`, `{"b":"x","a":1}`, `{"a":01}`, `{"a":1,}`, ` {"a":1}`,
				`{"a":1}` + " ", `{"a":1,"c":2}`, `{"a":1e3}`, "{\"a\":1,\"b\":\"\t\"}"}},
		{`{"type":"array","items":{"enum":["x",1,null]},"minItems":1,"maxItems":2}`,
			[]string{`["x"]`, `[1, null]`, `[ 1 ]`}, []string{`[]`, `[1,1,1]`, `["y"]`, `[1.0]`}},
		{`{"type":"number","minimum":-1.5,"exclusiveMaximum":2}`,
			[]string{`-1.5`, `1.999`, `0`, `-0.25`, `-0`}, []string{`2`, `-1.6`, `2.0`, `-2`, `1.`, `.5`, `+1`}},
		{`{"type":"integer","exclusiveMinimum":-3,"maximum":120}`,
			[]string{`-2`, `0`, `120`, `99`}, []string{`-3`, `121`, `1000`, `0.0`}},
		{`{"anyOf":[{"type":"string"},{"type":"null"}]}`, []string{`"a\n\u00e9"`, `null`, `"\u20AC"`, `"€"`}, []string{`"\ud800"`, `nul`, "\"\xff\"", "\"\xed\xa0\x80\""}},
		{`{"$defs":{"n":{"type":"object","properties":{"c":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}`,
			[]string{`{}`, `{"c":{"c":{}}}`}, []string{`{"c":1}`}},
		{`{"type":"object"}`, []string{`{"x":[1,{"y":"z"}],"w":true}`, `{}`}, []string{`[]`}},
		{`{"type":"object","properties":{"a":{"type":"boolean"}},"additionalProperties":{"type":"integer"}}`,
			[]string{`{"a":true,"b":2}`, `{"b":2}`, `{"ab":3}`}, []string{`{"a":true,"a":3}`, `{"b":true}`, `{"a":3}`, `{"\u0061":3}`}},
		{`{"enum":[1,12,"a"],"type":"integer"}`, []string{`1`, `12`}, []string{`"a"`, `2`}},
		{`{"const":{"k":[true]}}`, []string{`{"k":[true]}`}, []string{`{"k":[false]}`, `{"k": [true]}`}},
		{`{"type":["string","null"],"minLength":2}`, []string{`"ab"`, `null`}, []string{`"a"`}},
		{`{"oneOf":[{"type":"object","properties":{"t":{"const":"a"}},"required":["t"]},{"type":"object","properties":{"t":{"const":"b"},"n":{"type":"integer"}},"required":["t","n"]}]}`,
			[]string{`{"t":"a"}`, `{"t":"b","n":3}`}, []string{`{"t":"b"}`, `{"t":"c"}`}},
		{`{"allOf":[{"type":"boolean"}],"description":"flag"}`, []string{`true`}, []string{`1`}},
		{`true`, []string{`"x"`, `[]`, `{"a":null}`, `-0.5`}, []string{`x`}},
	} {
		e, err := Schema([]byte(c.schema))
		if err != nil {
			t.Fatalf("%s: %v", c.schema, err)
		}
		g := Compile(e, v)
		for _, s := range c.ok {
			if !g.Valid([]byte(s)) {
				t.Errorf("%s: %s refused", c.schema, s)
			}
			if err := schematest.Validate([]byte(c.schema), []byte(s)); err != nil {
				t.Errorf("%s: %s is not valid, the test is wrong: %v", c.schema, s, err)
			}
		}
		for _, s := range c.bad {
			if g.Valid([]byte(s)) {
				t.Errorf("%s: %s accepted", c.schema, s)
			}
		}
	}
}

// Schemas kiln cannot constrain output to are refused with the feature
// named.
func TestSchemaRefused(t *testing.T) {
	for _, c := range []struct{ schema, feature, path string }{
		{`{"type":"string","pattern":"^a+$"}`, "pattern", ""},
		{`{"type":"object","properties":{"e":{"type":"string","format":"email"}}}`, "format", "/properties/e"},
		{`{"type":"array","items":[{"type":"string"}]}`, "items", ""},
		{`{"allOf":[{"type":"string"},{"maxLength":3}]}`, "allOf", ""},
		{`{"oneOf":[{"type":"integer"},{"type":"number"}]}`, "oneOf", ""},
		{`{"$ref":"https://example.com/s.json"}`, "$ref", ""},
		{`{"$ref":"#/$defs/x","type":"object"}`, "$ref", ""},
		{`{"type":"object","properties":{"a":{"not":{}}}}`, "not", "/properties/a"},
		{`{"type":"array","uniqueItems":true}`, "uniqueItems", ""},
	} {
		_, err := Schema([]byte(c.schema))
		var se *SchemaError
		if !errors.As(err, &se) || se.Feature != c.feature || se.Path != c.path || !strings.Contains(err.Error(), c.feature) {
			t.Errorf("%s: %v (%+v), want the feature %q at %q named", c.schema, err, se, c.feature, c.path)
		}
	}
	for _, s := range []string{`{"type":"string","minLength":3,"maxLength":2}`, `{"type":"integer","minimum":0.2,"maximum":0.8}`,
		`{"enum":["a"],"type":"integer"}`, `false`, `{"type":"object","properties":{"a":false},"required":["a"]}`,
		`{"$defs":{"n":{"type":"object","properties":{"c":{"$ref":"#/$defs/n"}},"required":["c"]}},"$ref":"#/$defs/n"}`,
		`{"type":"array","items":false,"minItems":1}`, `{"type":"strin"}`, `[]`, `{"minLength":-1}`, `{`} {
		if _, err := Schema([]byte(s)); err == nil {
			t.Errorf("%s accepted", s)
		}
	}
}

// Outputs written at random, a token at a time among the tokens allowed,
// parse and validate: random schemas, each sampled several times.
func TestRandomOutputsValidate(t *testing.T) {
	v := testVocab()
	r := rand.New(rand.NewPCG(1, 2))
	done := 0
	for i := range 300 {
		schema := schematest.Random(r)
		e, err := Schema(schema)
		if err != nil {
			t.Fatalf("schema %d %s: %v", i, schema, err)
		}
		g := Compile(e, v)
		for range 4 {
			out, ok := generate(t, g, r, 2000)
			if !ok {
				continue
			}
			done++
			if err := schematest.Validate(schema, out); err != nil {
				t.Fatalf("schema %s: output %s: %v", schema, out, err)
			}
			if !g.Valid(out) {
				t.Fatalf("schema %s: output %s not valid by the grammar that wrote it", schema, out)
			}
		}
	}
	if done < 1100 {
		t.Errorf("only %d of 1200 outputs ended within 2000 tokens", done)
	}
}

// The pieces a session builds tool calls and reasoning from.
func TestExpressions(t *testing.T) {
	v := testVocab()
	args, err := Schema([]byte(`{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}`))
	if err != nil {
		t.Fatal(err)
	}
	record, err := Record([]byte(`{"type":"object","properties":{"p":{"type":"string","maxLength":20},"n":{"anyOf":[{"type":"integer"},{"type":"null"}]},`+
		`"k":{"enum":["a b","c","x</parameter>"]}},"required":["p","k"]}`), func(name string) (string, string, string) {
		return "<parameter=" + name + ">\n", "\n</parameter>\n", map[string]string{"p": "string", "n": "integer", "k": "string"}[name]
	}, "</parameter>")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		e       Expr
		ok, bad []string
	}{
		{Seq(Until("</think>"), Space(), JSONObject()), []string{"let me think</think>\n\n{}", `</think>{"a":1}`, "<think></thin></think> {}"},
			[]string{"{}", "</think>{}</think>", "x</think>[]"}},
		{Alt(Seq(Literal(`f", "arguments": `), args, Literal("}\n</tool_call>")), Seq(Literal(`g", "arguments": `), JSONValue(), Literal("}\n</tool_call>"))),
			[]string{"f\", \"arguments\": {\"x\": 3}}\n</tool_call>", "g\", \"arguments\": [1]}\n</tool_call>"},
			[]string{"f\", \"arguments\": {}}\n</tool_call>", "h\", \"arguments\": {}}\n</tool_call>"}},
		{record,
			[]string{"<parameter=p>\nline one\nline\n</parameter>\n<parameter=k>\na b\n</parameter>\n",
				"<parameter=p>\n\n</parameter>\n<parameter=n>\n-3\n</parameter>\n<parameter=k>\nc\n</parameter>\n"},
			[]string{"<parameter=p>\nab</parameter>\n</parameter>\n<parameter=k>\nc\n</parameter>\n",
				"<parameter=p>\n123456789012345678901\n</parameter>\n<parameter=k>\nc\n</parameter>\n",
				"<parameter=p>\nx\n</parameter>\n<parameter=n>\nnull\n</parameter>\n<parameter=k>\nc\n</parameter>\n",
				"<parameter=p>\nx\n</parameter>\n<parameter=k>\n\"c\"\n</parameter>\n",
				"<parameter=p>\nx\n</parameter>\n<parameter=k>\nx</parameter>\n</parameter>\n"}},
	} {
		g := Compile(c.e, v)
		for _, s := range c.ok {
			if !g.Valid([]byte(s)) {
				t.Errorf("%q refused", s)
			}
		}
		for _, s := range c.bad {
			if g.Valid([]byte(s)) {
				t.Errorf("%q accepted", s)
			}
		}
		for range 20 {
			if _, ok := generate(t, g, rand.New(rand.NewPCG(3, 4)), 3000); !ok {
				t.Logf("an output did not end in 3000 tokens")
			}
		}
	}
}

// The mask of a state is every token whose bytes the grammar takes from
// there: checked token by token against the byte-level machine.
func TestMaskMatchesBytes(t *testing.T) {
	v := testVocab()
	e, err := Schema([]byte(`{"type":"object","properties":{"name":{"type":"string","maxLength":4},"n":{"enum":[1,12,"x"]},` +
		`"zip":{"type":"string","minLength":2,"maxLength":3}},"required":["n"]}`))
	if err != nil {
		t.Fatal(err)
	}
	g := Compile(e, v)
	for _, prefix := range []string{``, `{`, `{"na`, `{"name":"ab`, `{"name":"abc`, `{"name":"abcd`, `{"n":1`, `{"n":1}`, `{"name":"\`,
		`{"n":1,"zip":"`, `{"n":1,"zip":"a`, `{"n":1,"zip":"\u00e9`, `{"n":1,"zip":"ab`, `{"n":1,"zip":"é`, `{"n":1,"zip":"abc`} {
		s := g.m.start
		for _, c := range []byte(prefix) {
			s = g.m.step(s, c)
		}
		mask := make([]uint64, v.words())
		g.mu.Lock()
		g.fill(s, mask)
		g.mu.Unlock()
		for id, b := range v.tokens {
			want := len(b) > 0
			st := s
			for _, c := range b {
				st = g.m.step(st, c)
			}
			want = want && len(st.stacks) > 0
			if got := mask[id/64]>>(id%64)&1 != 0; got != want {
				t.Errorf("after %q token %q: allowed %v, want %v", prefix, b, got, want)
			}
		}
	}
}

func FuzzSchema(f *testing.F) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 20 {
		f.Add(schematest.Random(r), uint64(1))
	}
	f.Add([]byte(`{"type":"object","properties":{"a":{"$ref":"#"}},"additionalProperties":{"type":"number","minimum":-1e3}}`), uint64(2))
	f.Add([]byte(`{"anyOf":[{"type":"string","maxLength":0},{"enum":[[],{},""]}]}`), uint64(3))
	v := testVocab()
	f.Fuzz(func(t *testing.T, schema []byte, seed uint64) {
		e, err := Schema(schema)
		if err != nil {
			var se *SchemaError
			if !errors.As(err, &se) {
				t.Fatalf("error of another type: %v", err)
			}
			return
		}
		g := Compile(e, v)
		r := rand.New(rand.NewPCG(seed, seed))
		for range 3 {
			out, ok := generate(t, g, r, 400)
			if !ok {
				continue
			}
			if !json.Valid(out) {
				t.Fatalf("output %q is not JSON", out)
			}
			if err := schematest.Validate(schema, out); err != nil && !strings.HasPrefix(err.Error(), "schema:") {
				t.Fatalf("output %s: %v", out, err)
			}
		}
	})
}

func FuzzMachine(f *testing.F) {
	schemas := []string{
		`{"type":"object","properties":{"a":{"type":"integer","minimum":-5,"maximum":50},"b":{"type":"array","items":{"type":"string","maxLength":2},"maxItems":3}},"required":["a"]}`,
		`{"anyOf":[{"type":"number","exclusiveMinimum":0.5},{"enum":["x","xy",null]},{"type":"object","additionalProperties":{"type":"boolean"},"properties":{"k":{"type":"null"}}}]}`,
		`{"$defs":{"t":{"type":"object","properties":{"v":{"type":"integer"},"kids":{"type":"array","items":{"$ref":"#/$defs/t"}}},"required":["v"]}},"$ref":"#/$defs/t"}`,
	}
	for i, s := range []string{`{"a":5}`, `{"a": -5, "b": ["", "ab"]}`, `0.75`, `"xy"`, `{"k":null,"z":true}`, `{"v":1,"kids":[{"v":2}]}`} {
		f.Add(uint8(i%len(schemas)), []byte(s))
	}
	v := testVocab()
	grammars := make([]*Grammar, len(schemas))
	for i, s := range schemas {
		e, err := Schema([]byte(s))
		if err != nil {
			f.Fatal(err)
		}
		grammars[i] = Compile(e, v)
	}
	f.Fuzz(func(t *testing.T, which uint8, text []byte) {
		i := int(which) % len(schemas)
		if grammars[i].Valid(text) {
			if err := schematest.Validate([]byte(schemas[i]), text); err != nil {
				t.Fatalf("%s accepted %q: %v", schemas[i], text, err)
			}
		}
	})
}

func ExampleSchema() {
	e, _ := Schema([]byte(`{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]}`))
	g := Compile(e, NewVocab([][]byte{[]byte(`{"ok":`), []byte(`true`), []byte(`}`), []byte(`"`)}, 4))
	mt := g.Matcher()
	mask := make([]uint64, 1)
	mt.Allow(nil, mask)
	fmt.Printf("%04b ", mask[0])
	clear(mask)
	end := mt.Allow([]int32{0, 1, 2}, mask)
	fmt.Println(mask[0], end)
	// Output: 0001 0 true
}

// Schemas that ask for too much end in an error or in outputs, quickly.
func TestHostileSchemas(t *testing.T) {
	v := testVocab()
	for _, s := range []string{`{"type":"string","minLength":2147483647}`, `{"type":"number","maximum":1e999999999,"minimum":-1e-99999999}`,
		`{"type":"integer","minimum":1e40,"maximum":1e41}`, `{"type":"array","items":{"type":"array","items":{"type":"array"}},"minItems":1000000}`,
		`{"anyOf":[{"$ref":"#"},{"type":"array","items":{"$ref":"#"}}]}`, `{"enum":[1e99999999999999999999,1E-99999999999999999999]}`} {
		e, err := Schema([]byte(s))
		if err != nil {
			continue
		}
		generate(t, Compile(e, v), rand.New(rand.NewPCG(1, 1)), 400)
	}
}
