package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

// chatCases is testdata/chat/cases.json, written by scripts/make_chat_cases.py
// from transformers' apply_chat_template.
type chatCases struct {
	Transformers  string            `json:"transformers"`
	SpecialTokens map[string]string `json:"special_tokens"`
	Cases         []struct {
		Name                string          `json:"name"`
		Template            string          `json:"template"`
		Messages            json.RawMessage `json:"messages"`
		Tools               json.RawMessage `json:"tools"`
		AddGenerationPrompt bool            `json:"add_generation_prompt"`
		Kwargs              map[string]any  `json:"kwargs"`
		Rendered            *string         `json:"rendered"`
		Error               string          `json:"error"`
		ErrorType           string          `json:"error_type"`
	} `json:"cases"`
}

func casesPath() string {
	if p := os.Getenv("KILN_CHAT_CASES"); p != "" {
		return p
	}
	return filepath.Join("..", "testdata", "chat", "cases.json")
}

// modelDir is a model directory holding only tokenizer files, as the cases
// were made: the template in chat_template.jinja, the special tokens in
// tokenizer_config.json.
func modelDir(t *testing.T, template string, special map[string]string) fstest.MapFS {
	src, err := os.ReadFile(filepath.Join("..", "testdata", "chat", template))
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := json.Marshal(special)
	return fstest.MapFS{
		"chat_template.jinja":   {Data: src},
		"tokenizer_config.json": {Data: cfg},
	}
}

func TestConformance(t *testing.T) {
	raw, err := os.ReadFile(casesPath())
	if err != nil {
		t.Fatal(err)
	}
	var doc chatCases
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Cases) == 0 {
		t.Fatal("no cases")
	}
	templates := map[string]*Template{}
	for _, c := range doc.Cases {
		tpl := templates[c.Template]
		if tpl == nil {
			if tpl, err = LoadTemplate(modelDir(t, c.Template, doc.SpecialTokens)); err != nil {
				t.Fatalf("%s: %v", c.Template, err)
			}
			templates[c.Template] = tpl
		}
		t.Run(c.Name, func(t *testing.T) {
			var msgs []Message
			if err := json.Unmarshal(c.Messages, &msgs); err != nil {
				t.Fatal(err)
			}
			// The case must be what a chat.Message carries, or the
			// template would not see what transformers saw.
			back, _ := json.Marshal(msgs)
			if !jsonEqual(back, c.Messages) {
				t.Fatalf("case messages are not in chat.Message's shape:\n%s\n%s", back, c.Messages)
			}
			in := &RenderInput{Messages: msgs, AddGenerationPrompt: c.AddGenerationPrompt, Kwargs: c.Kwargs}
			if string(c.Tools) != "null" && c.Tools != nil {
				if err := json.Unmarshal(c.Tools, &in.Tools); err != nil {
					t.Fatal(err)
				}
				if in.Tools == nil {
					in.Tools = []Tool{}
				}
			}
			got, err := tpl.Render(in)
			switch {
			case c.Rendered != nil && err != nil:
				t.Fatalf("error %v, want\n%q", err, *c.Rendered)
			case c.Rendered != nil && got != *c.Rendered:
				t.Fatalf("rendering differs\n got: %q\nwant: %q", got, *c.Rendered)
			case c.Rendered == nil && err == nil:
				t.Fatalf("rendered %q, want error %s: %s", got, c.ErrorType, c.Error)
			case c.Rendered == nil && c.ErrorType == "TemplateError":
				var te *TemplateError
				if !errors.As(err, &te) || te.Message != c.Error {
					t.Fatalf("error %v, want the template's %q", err, c.Error)
				}
			}
		})
	}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

func TestLoadTemplateFromConfig(t *testing.T) {
	src := "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}{{ pad_token is defined }}"
	named, _ := json.Marshal([]map[string]string{{"name": "tool_use", "template": "x"}, {"name": "default", "template": src}})
	for name, chatTemplate := range map[string]json.RawMessage{
		"string": json.RawMessage(mustJSON(src)),
		"named":  named,
	} {
		cfg := `{"bos_token": "<s>", "pad_token": null, "eos_token": {"content": "</s>", "lstrip": false}, "chat_template": ` + string(chatTemplate) + `}`
		tpl, err := LoadTemplate(fstest.MapFS{"tokenizer_config.json": {Data: []byte(cfg)}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := tpl.Render(&RenderInput{Messages: []Message{{Role: "user", Content: "hi"}}})
		if err != nil || got != "<s>hi</s>False" {
			t.Fatalf("%s: got %q, %v", name, got, err)
		}
	}
	if _, err := LoadTemplate(fstest.MapFS{"tokenizer_config.json": {Data: []byte(`{}`)}}); err == nil {
		t.Fatal("no template: want an error")
	}
	if _, err := LoadTemplate(fstest.MapFS{}); err == nil {
		t.Fatal("empty directory: want an error")
	}
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// TestJinjaCompat checks, template by template, behaviour the Qwen templates
// do not all exercise; expectations are what Python's Jinja prints.
func TestJinjaCompat(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{`{{ {"b": 1, "a": [1.5, true, none, "é\"<>&'"]} | tojson }}`, `{"b": 1, "a": [1.5, true, null, "é\"<>&'"]}`},
		{`{{ {"a": [1, {}], "b": []} | tojson(indent=2) }}`, "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}"},
		{`{{ {"b": 1, "a": 2} | tojson(sort_keys=true) }}`, `{"a": 2, "b": 1}`},
		{`{{ "é" | tojson(ensure_ascii=true) }}`, `"\u00e9"`},
		{`{{ x | tojson }}`, `[1e+16, 1e-05, 0.0001, 100.0, 12345678901234567890, -0.0]`},
		{`{{ "  a b  ".strip() }}|{{ "xxaxx".strip("x") }}|{{ "\n\na\n".lstrip("\n") }}|{{ "a  ".rstrip() }}`, "a b|a|a\n|a"},
		{`{{ "a b  c ".split() }}|{{ "a,b,,c".split(",") }}|{{ "a,b,c".rsplit(",", 1) }}|{{ " a b c ".split(none, 1) }}`, "['a', 'b', 'c']|['a', 'b', '', 'c']|['a,b', 'c']|['a', 'b c ']"},
		{`{{ "x".split("</think>")[-1] }}|{{ "a</think>b".split("</think>")[0] }}`, "x|a"},
		{`{{ "abc".startswith(("x", "a")) }}{{ "abc".endswith("bc") }}{{ "abc".startswith("b", 1) }}`, "TrueTrueTrue"},
		{`{{ "héllo".startswith("é", 1) }}{{ "héllo".endswith("l", 0, 3) }}{{ "héllo".endswith("o", -1) }}{{ "héllo".startswith("", 9) }}{{ "héllo".startswith("l", 3, 2) }}`, "TrueTrueTrueFalseFalse"},
		{`{{ "aaa".replace("a", "b", 2) }}`, "bba"},
		{`{% set ns = namespace(n=0) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}`, "6"},
		{`{% for k, v in {"z": 1, "a": 2} | items %}{{ k }}={{ v }};{% endfor %}`, "z=1;a=2;"},
		{`{% for k, v in {"z": 1, "a": 2}.items() %}{{ k }}={{ v }};{% endfor %}`, "z=1;a=2;"},
		{`{{ undefined_var is defined }}{{ n is defined }}{{ n is none }}{{ undefined_var is none }}`, "FalseTrueTrueFalse"},
		{`{{ (n | default("d")) is none }}|{{ undefined_var | default("d") }}|{{ "" | default("d", true) }}`, "True|d|d"},
		{`{{ [1, 2, 3][::-1] }}{{ "abc"[::-1] }}{{ [1, 2, 3] | length }}`, "[3, 2, 1]cba3"},
		{`{{ 1 is string }}{{ "a" is string }}{{ {} is mapping }}{{ [] is mapping }}`, "FalseTrueTrueFalse"},
		{`{% for m in [1, 2] %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }};{% endfor %}`, "0TrueFalse;1FalseTrue;"},
		{"{% if true %}\n  x\n{% endif %}\ny\n", "  x\ny"},
		{"  {%- if true %} a {% endif -%}  \nb", " a b"},
		{"a\r\nb{{ 'c\r\nd' }}\re\n\n", "a\nbc\nd\ne\n"},
		// Conditional expressions nested in brackets (rewriteConditionals).
		{`{{ 'a' + ('b' if t else 'c') + 'd' }}{{ 'a' + ('b' if f else 'c') + 'd' }}`, "abdacd"},
		{`{{ [1 if t else 2, (3 if f else 4)] }}`, "[1, 4]"},
		{`{% set y = 'p' ~ ('q' if f else 'r') %}{{ y }}`, "pr"},
		{`{{ ('a' if f else ('b' if t else 'c')) }}`, "b"},
		{`{{ 'abc'.startswith('a' if t else 'b') }}`, "True"},
		{"x\n  {{ ('a' if t else 'b') }}\n  z\n  {{- ('if' if f else 'else') }}\n", "x\n  a\n  zelse"},
		{`{% for i in [1, 2] %}{{ ('<' if loop.first else ',') ~ i }}{% endfor %}`, "<1,2"},
		{`{% if 'a' in ('abc' if t else 'xyz') %}yes{% else %}no{% endif %}`, "yes"},
		{`{% for c in ('ab' if f else 'cd') %}{{ c }}{% endfor %}`, "cd"},
		{`{{ e is mapping }}{{ not e }}{{ e | tojson }}{{ e | items | length }}{% if e %}x{% endif %}`, "TrueTrue{}0"},
	} {
		tpl, err := ParseTemplate(c.src)
		if err != nil {
			t.Fatalf("%s: %v", c.src, err)
		}
		got, err := tpl.Render(&RenderInput{Kwargs: map[string]any{
			"n": nil,
			"t": true,
			"e": json.RawMessage(`{}`),
			"f": false,
			"x": json.RawMessage(`[1e16, 0.00001, 0.0001, 100.0, 12345678901234567890, -0.0]`),
		}})
		if err != nil {
			t.Fatalf("%s: %v", c.src, err)
		}
		if got != c.want {
			t.Errorf("%s\n got %q\nwant %q", c.src, got, c.want)
		}
	}
}

func TestRaiseException(t *testing.T) {
	tpl, err := ParseTemplate(`a{{ raise_exception("bad " ~ x) }}b`)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tpl.Render(&RenderInput{Kwargs: map[string]any{"x": "input"}})
	var te *TemplateError
	if !errors.As(err, &te) || te.Message != "bad input" || err.Error() != "bad input" {
		t.Fatalf("got %v", err)
	}
	if _, err := tpl.Render(&RenderInput{Kwargs: map[string]any{"messages": 1}}); err == nil || !strings.Contains(err.Error(), "messages") {
		t.Fatalf("kwarg replacing messages: got %v", err)
	}
}

func TestOpensThinking(t *testing.T) {
	for prompt, want := range map[string]bool{
		"<|im_start|>assistant\n<think>\n":                             true,
		"<|im_start|>assistant\n<think>\n\n</think>\n\n":               false,
		"<|im_start|>user\n<think><|im_end|>\n<|im_start|>assistant\n": false,
		"<|im_start|>assistant\n":                                      false,
	} {
		if got := OpensThinking(prompt); got != want {
			t.Errorf("OpensThinking(%q) = %v", prompt, got)
		}
	}
}

func qwenConversation(n int) *RenderInput {
	in := &RenderInput{AddGenerationPrompt: true, Tools: []Tool{weatherTool}}
	in.Messages = append(in.Messages, Message{Role: "system", Content: "You are helpful."})
	for i := range n {
		in.Messages = append(in.Messages,
			Message{Role: "user", Content: strings.Repeat("question ", i+1)},
			Message{Role: "assistant", ReasoningContent: "thinking", ToolCalls: []ToolCall{{Type: "function", Function: FunctionCall{Name: "get_weather", Arguments: json.RawMessage(`{"city": "Paris", "days": 2}`)}}}},
			Message{Role: "tool", Content: "sunny"},
			Message{Role: "assistant", Content: "It is sunny."})
	}
	return in
}

// TestRenderConcurrent renders from many goroutines at once (run with
// -race): a Template is shared by all requests.
func TestRenderConcurrent(t *testing.T) {
	for _, name := range []string{"qwen3.jinja", "qwen3.8.jinja"} {
		tpl, err := LoadTemplate(modelDir(t, name, nil))
		if err != nil {
			t.Fatal(err)
		}
		want, err := tpl.Render(qwenConversation(3))
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 8)
		for range 8 {
			go func() {
				for range 5 {
					got, err := tpl.Render(qwenConversation(3))
					if err == nil && got != want {
						err = errors.New("renderings differ between goroutines")
					}
					if err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		for range 8 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	}
}

func BenchmarkRender(b *testing.B) {
	for _, name := range []string{"qwen3.jinja", "qwen3.8.jinja"} {
		b.Run(name, func(b *testing.B) {
			src, err := os.ReadFile(filepath.Join("..", "testdata", "chat", name))
			if err != nil {
				b.Fatal(err)
			}
			tpl, err := ParseTemplate(string(src))
			if err != nil {
				b.Fatal(err)
			}
			in := qwenConversation(5) // 21 messages
			for b.Loop() {
				if _, err := tpl.Render(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzRender: any text in any message field renders with both Qwen
// templates, or fails only with the template's own raise_exception.
func FuzzRender(f *testing.F) {
	f.Add("What's up?", "<think>x</think>\n\nfine", "hmm", `{"city": "Paris"}`, true)
	f.Add("<tool_response>\nr\n</tool_response>", "", "", `{}`, false)
	f.Add(" {{ raise_exception('x') }} ", "\n\n", " \u2028", `{"a": [1, 2.5e300, null, {"b": "\u00e9"}]}`, true)
	tpls := map[string]*Template{}
	for _, name := range []string{"qwen3.jinja", "qwen3.8.jinja"} {
		src, err := os.ReadFile(filepath.Join("..", "testdata", "chat", name))
		if err != nil {
			f.Fatal(err)
		}
		if tpls[name], err = ParseTemplate(string(src)); err != nil {
			f.Fatal(err)
		}
	}
	f.Fuzz(func(t *testing.T, user, answer, reasoning, args string, gen bool) {
		if !json.Valid([]byte(args)) || !strings.HasPrefix(strings.TrimSpace(args), "{") {
			args = "{}"
		}
		in := &RenderInput{
			Messages: []Message{
				{Role: "system", Content: reasoning},
				{Role: "user", Content: user},
				{Role: "assistant", Content: answer, ReasoningContent: reasoning, ToolCalls: []ToolCall{{Function: FunctionCall{Name: "f", Arguments: json.RawMessage(args)}}}},
				{Role: "tool", Content: answer},
			},
			Tools:               []Tool{weatherTool},
			AddGenerationPrompt: gen,
		}
		for name, tpl := range tpls {
			_, err := tpl.Render(in)
			var te *TemplateError
			if err != nil && !errors.As(err, &te) {
				t.Fatalf("%s: %v", name, err)
			}
		}
	})
}

// TestJinjaWithMessages: whitespace control, comments, macros and gonja's
// own filters, as Python's Jinja renders them.
func TestJinjaWithMessages(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"a\n  {# c #}\nb", "a\nb"},
		{"a\n  {%- set x = 1 -%}  \n  b", "ab"},
		{"{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\n", "  1\n  2\n"},
		{"x {{- \"y\" -}}\n\t z", "xyz"},
		{"{% macro m(a, b=2) %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(1, b=3) }}", "1213"},
		{"{{ \"%s-%d\" | format(\"a\", 3) }}{{ [3,1,2] | sort | join(\",\") }}{{ \"AbC\" | lower }}{{ messages | selectattr(\"role\", \"equalto\", \"user\") | list | length }}", "a-31,2,3abc1"},
	} {
		tpl, err := ParseTemplate(c.src)
		if err != nil {
			t.Errorf("%q: %v", c.src, err)
			continue
		}
		got, err := tpl.Render(&RenderInput{Messages: []Message{{Role: "user", Content: "q"}, {Role: "assistant", Content: "r"}}})
		if err != nil || got != c.want {
			t.Errorf("%q: got %q %v want %q", c.src, got, err, c.want)
		}
	}
}

// ToolCallStart follows each template's format, and what it starts the
// output parser reads back as a call once the model completes it.
func TestToolCallStart(t *testing.T) {
	for _, c := range []struct {
		name, any, named, rest string
	}{
		{"qwen3.jinja", "<tool_call>\n{\"name\": \"", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ", "{\"city\": \"Paris\"}}\n</tool_call>"},
		{"qwen3.8.jinja", "<tool_call>\n<function=", "<tool_call>\n<function=get_weather>\n", "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"},
	} {
		tpl, err := LoadTemplate(modelDir(t, c.name, nil))
		if err != nil {
			t.Fatal(err)
		}
		anyStart, err1 := tpl.ToolCallStart("")
		named, err2 := tpl.ToolCallStart("get_weather")
		if err1 != nil || err2 != nil || anyStart != c.any || named != c.named {
			t.Errorf("%s: %q (%v), %q (%v)", c.name, anyStart, err1, named, err2)
			continue
		}
		p := NewParser(ParserOptions{Tools: []Tool{weatherTool}})
		d := p.Push(named + c.rest)
		f := p.Finish()
		calls := append(d.ToolCalls, f.ToolCalls...)
		if len(calls) != 1 || calls[0].Function.Name != "get_weather" || !json.Valid(calls[0].Function.Arguments) || !strings.Contains(string(calls[0].Function.Arguments), "Paris") || d.Content+f.Content != "" {
			t.Errorf("%s: parsed %+v, content %q", c.name, calls, d.Content+f.Content)
		}
	}
	plain, err := ParseTemplate("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.ToolCallStart("f"); err == nil {
		t.Error("a template without tool calls gave a tool call start")
	}
}
