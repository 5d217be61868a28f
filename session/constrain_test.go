package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/grammar"
	"github.com/kiln-llm/kiln/internal/schematest"
	"github.com/kiln-llm/kiln/internal/testmodel"
)

// The bar of structured outputs: 200 requests with random JSON schemas
// (objects, arrays, enums, numbers, nesting, required fields) on the
// fixture models, half greedy, half sampled, all at once: every answer
// parses and validates against its schema, and ends (no answer is cut by
// its token limit).
func TestStructuredOutputs(t *testing.T) {
	const n = 200
	r := rand.New(rand.NewPCG(18, 1))
	archs := []string{"qwen3", "qwen35"}
	sessions := map[string]*Session{}
	for _, arch := range archs {
		sessions[arch], _ = newSession(t, arch, testmodel.Options{}, engine.Options{}, Options{})
	}
	type outcome struct {
		schema []byte
		req    string
		text   string
		final  Event
		err    error
	}
	results := make([]outcome, n)
	var wg sync.WaitGroup
	for i := range n {
		schema := schematest.Random(r)
		sp := engine.Sampling{MaxTokens: 2000}
		if i%2 == 1 {
			seed := uint64(i)
			sp.Temperature, sp.Seed = 1, &seed
		}
		arch := archs[i%len(archs)]
		req := &Request{Messages: []chat.Message{{Role: "user", Content: fmt.Sprintf("Answer %d as JSON.", i)}},
			Format: &Format{Schema: schema}, Sampling: sp}
		results[i].schema, results[i].req = schema, fmt.Sprintf("%s temperature %g", arch, sp.Temperature)
		st, err := sessions[arch].Generate(context.Background(), req)
		if err != nil {
			t.Fatalf("request %d (%s): %v", i, schema, err)
		}
		wg.Go(func() {
			res := collect(st)
			results[i].text, results[i].final = res.text+res.reasoning, res.final
		})
	}
	wg.Wait()
	valid, tokens := 0, 0
	for i, o := range results {
		switch {
		case o.final.Finish != engine.FinishStop:
			t.Errorf("request %d (%s): finished %s (%v) after %q; schema %s", i, o.req, o.final.Finish, o.final.Err, o.text, o.schema)
		default:
			if err := schematest.Validate(o.schema, []byte(o.text)); err != nil {
				t.Errorf("request %d (%s): %q: %v; schema %s", i, o.req, o.text, err, o.schema)
				continue
			}
			valid++
			tokens += o.final.Usage.CompletionTokens
		}
	}
	t.Logf("%d of %d answers valid, %d tokens", valid, n, tokens)
}

// response_format json_object: any object. The tiny models write strings
// without end when nothing bounds them, so an answer that ends is checked,
// and the mask step by step on a scripted answer: with a reasoning block
// the template opens, the reasoning is free (up to its end, no end of
// output) and what follows it is JSON.
func TestFormatObject(t *testing.T) {
	s, _ := newSession(t, "qwen3", testmodel.Options{}, engine.Options{}, Options{})
	ended := 0
	for i := range 8 {
		seed := uint64(i)
		res := generate(t, s, &Request{Messages: []chat.Message{{Role: "user", Content: "A JSON object, please."}},
			Format: &Format{}, Sampling: engine.Sampling{MaxTokens: 300, Temperature: 1, Seed: &seed}})
		if !strings.HasPrefix(res.text, "{") {
			t.Errorf("answer %q", res.text)
		}
		if res.final.Finish == engine.FinishStop {
			ended++
			var v map[string]any
			if err := json.Unmarshal([]byte(res.text), &v); err != nil {
				t.Errorf("answer %q: %v", res.text, err)
			}
		}
	}
	t.Logf("%d of 8 answers ended within 300 tokens", ended)

	s, f := newSession(t, "qwen35", testmodel.Options{ChatTemplate: "qwen3.8.jinja"}, engine.Options{}, Options{})
	er, parser, err := s.prompt(context.Background(), &Request{Messages: []chat.Message{{Role: "user", Content: "hi"}}, Format: &Format{}})
	mask := er.Mask
	if err != nil || mask == nil {
		t.Fatal(err, mask)
	}
	V := s.eng.VocabSize()
	allowed := make([]uint64, (V+63)/64)
	var gen []int32
	write := func(text string, inReasoning bool) {
		for _, id := range f.Tok.Encode(text) {
			clear(allowed)
			a := mask.Allow(gen, allowed)
			if allowed[id/64]>>(id%64)&1 == 0 {
				t.Fatalf("token %q refused after %q", f.Tok.Decode([]int32{id}), f.Tok.Decode(gen))
			}
			if inReasoning {
				// Free text: every token but the special ones, and no end.
				n := 0
				for _, w := range allowed {
					n += bits.OnesCount64(w)
				}
				if a != engine.AllowSet || n < f.Tok.VocabSize()-3 {
					t.Fatalf("reasoning %q: %d tokens allowed, %v", f.Tok.Decode(gen), n, a)
				}
			}
			gen = append(gen, id)
		}
	}
	write("Let me see: {{ not JSON }} yet", true)
	write("</think>\n\n", false)
	clear(allowed)
	mask.Allow(gen, allowed)
	for text, want := range map[string]bool{"{": true, "}": false, "x": false, "[": false} {
		if id := f.Tok.Encode(text)[0]; allowed[id/64]>>(id%64)&1 != 0 != want {
			t.Errorf("after the reasoning, %q allowed: %v", text, !want)
		}
	}
	write(`{"answer": [1, "two"]}`, false)
	clear(allowed)
	if a := mask.Allow(gen, allowed); a != engine.AllowSetOrEnd {
		t.Errorf("after a whole object: %v", a)
	}
	d := parser.Push(f.Tok.Decode(gen))
	if !strings.Contains(d.Reasoning, "not JSON") || d.Content != `{"answer": [1, "two"]}` {
		t.Errorf("parsed reasoning %q, content %q", d.Reasoning, d.Content)
	}
}

// A forced tool call, by name or any of the tools, completes with
// arguments its schema allows, in the template's JSON form (Qwen3) and XML
// form (Qwen3.5, whose template opens a reasoning block first).
func TestForcedToolCallFollowsSchema(t *testing.T) {
	weather := `{"type":"object","properties":{"city":{"type":"string","maxLength":12},"days":{"type":"integer","minimum":1,"maximum":7},` +
		`"unit":{"enum":["celsius","fahrenheit"]}},"required":["city","days"]}`
	tools := []chat.Tool{
		chat.Tool(`{"type": "function", "function": {"name": "get_weather", "parameters": ` + weather + `}}`),
		chat.Tool(`{"type": "function", "function": {"name": "get_time", "parameters": {"type":"object","properties":{"zone":{"type":"string","maxLength":8}},"required":["zone"]}}}`),
	}
	schemas := map[string]string{"get_weather": weather, "get_time": `{"type":"object","properties":{"zone":{"type":"string","maxLength":8}},"required":["zone"]}`}
	for _, c := range []struct{ arch, template string }{{"qwen3", "qwen3.jinja"}, {"qwen35", "qwen3.8.jinja"}} {
		t.Run(c.arch, func(t *testing.T) {
			s, _ := newSession(t, c.arch, testmodel.Options{ChatTemplate: c.template}, engine.Options{}, Options{})
			for i, force := range []string{"get_weather", "*", "get_time", "*"} {
				seed := uint64(i)
				res := generate(t, s, &Request{Messages: []chat.Message{{Role: "user", Content: "What is the weather in Paris?"}}, Tools: tools,
					ForceToolCall: force, Sampling: engine.Sampling{MaxTokens: 400, Temperature: float32(i % 2), Seed: &seed}})
				if res.final.Finish != FinishToolCalls || len(res.calls) != 1 || strings.TrimSpace(res.text) != "" {
					t.Fatalf("forced %s: finish %s, calls %+v, content %q", force, res.final.Finish, res.calls, res.text)
				}
				call := res.calls[0].Function
				if force != "*" && call.Name != force {
					t.Errorf("forced %s, called %s", force, call.Name)
				}
				if err := schematest.Validate([]byte(schemas[call.Name]), call.Arguments); err != nil {
					t.Errorf("forced %s: %s(%s): %v", force, call.Name, call.Arguments, err)
				}
			}
		})
	}
}

// A schema the grammar cannot follow is refused before the engine sees the
// request, with the feature named.
func TestConstraintErrors(t *testing.T) {
	s, _ := newSession(t, "qwen3", testmodel.Options{ChatTemplate: "qwen3.jinja"}, engine.Options{}, Options{})
	msgs := []chat.Message{{Role: "user", Content: "hi"}}
	for _, c := range []struct {
		req   *Request
		tools bool
	}{
		{&Request{Messages: msgs, Format: &Format{Schema: json.RawMessage(`{"type":"string","pattern":"a+"}`)}}, false},
		{&Request{Prompt: "hi", Format: &Format{Schema: json.RawMessage(`{"type":`)}}, false},
		{&Request{Messages: msgs, ForceToolCall: "f", Tools: []chat.Tool{chat.Tool(`{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string","format":"uri"}}}}}`)}}, true},
	} {
		_, err := s.Generate(context.Background(), c.req)
		var ce *ConstraintError
		var se *grammar.SchemaError
		if !errors.As(err, &ce) || ce.Tools != c.tools || !errors.As(err, &se) {
			t.Errorf("%+v: %v", c.req, err)
		}
	}
	if st := s.eng.Stats(); st.PromptTokens != 0 {
		t.Errorf("the engine saw %d prompt tokens", st.PromptTokens)
	}
}
