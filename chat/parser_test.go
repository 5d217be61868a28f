package chat

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

var weatherTool = Tool(`{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
	"city": {"type": "string"}, "days": {"type": "integer"}, "scale": {"type": "number"}, "metric": {"type": "boolean"},
	"opts": {"type": "object"}, "tags": {"type": "array"}, "note": {"type": ["null", "string"]}, "zip": {"type": "string"}}}}}`)

// reply is a whole parse, tool call IDs left out (they are random).
type reply struct {
	Reasoning, Content string
	Calls              []FunctionCall
}

func (r *reply) add(d Delta) {
	r.Reasoning += d.Reasoning
	r.Content += d.Content
	for _, c := range d.ToolCalls {
		r.Calls = append(r.Calls, c.Function)
	}
}

func parseChunks(opts ParserOptions, chunks ...string) reply {
	p := NewParser(opts)
	var r reply
	for _, c := range chunks {
		r.add(p.Push(c))
	}
	r.add(p.Finish())
	return r
}

var parserSamples = []struct {
	name     string
	thinking bool
	text     string
	want     reply
}{
	{"plain", false, "Hello, <b>world</b> a<b and 1 < 2.", reply{Content: "Hello, <b>world</b> a<b and 1 < 2."}},
	{"think", false, "<think>\nLet me see.\n</think>\n\nIt is 4.", reply{Reasoning: "Let me see.\n", Content: "It is 4."}},
	{"opened_think", true, "Let me see.\n</think>\n\nIt is 4.", reply{Reasoning: "Let me see.\n", Content: "It is 4."}},
	{"think_later_is_content", false, "Answer: <think>x</think>", reply{Content: "Answer: <think>x</think>"}},
	{"json_call", true, "Need weather.</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
		reply{Reasoning: "Need weather.", Calls: []FunctionCall{{Name: "get_weather", Arguments: json.RawMessage(`{"city": "Paris", "days": 3}`)}}}},
	{"json_calls_with_text", false, "Checking.\n\n<tool_call>\n{\"name\": \"a\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>\n<tool_call>\n{\"name\": \"b\"}\n</tool_call>",
		reply{Content: "Checking.\n\n", Calls: []FunctionCall{{Name: "a", Arguments: json.RawMessage(`{"x": 1}`)}, {Name: "b", Arguments: json.RawMessage(`{}`)}}}},
	{"xml_call", false, "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n 5 \n</parameter>\n<parameter=scale>\n1.5\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=tags>\n[\"x\"]\n</parameter>\n<parameter=note>\nline1\nline2\n</parameter>\n<parameter=zip>\n01234\n</parameter>\n<parameter=extra>\n7\n</parameter>\n</function>\n</tool_call>",
		reply{Calls: []FunctionCall{{Name: "get_weather", Arguments: json.RawMessage(`{"city": "New York", "days": 5, "scale": 1.5, "metric": true, "opts": {"a":[1,2]}, "tags": ["x"], "note": "line1\nline2", "zip": "01234", "extra": "7"}`)}}}},
	{"xml_untyped_fallback", false, "<tool_call>\n<function=get_weather>\n<parameter=days>\nfive\n</parameter>\n</function>\n</tool_call>",
		reply{Calls: []FunctionCall{{Name: "get_weather", Arguments: json.RawMessage(`{"days": "five"}`)}}}},
	{"malformed_json", false, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }\n</tool_call>tail",
		reply{Content: "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }\n</tool_call>tail"}},
	{"malformed_xml", false, "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>",
		reply{Content: "<tool_call>\n<function=f>\n<parameter=x>\n1\n</function>\n</tool_call>"}},
	{"unterminated_call", false, "Sure.<tool_call>\n{\"name\": \"f\"", reply{Content: "Sure.<tool_call>\n{\"name\": \"f\""}},
	{"partial_tag_at_end", false, "a <tool_ca", reply{Content: "a <tool_ca"}},
	{"unicode", true, "思考中…</think>答え：東京 🌦", reply{Reasoning: "思考中…", Content: "答え：東京 🌦"}},
}

func TestParserSamples(t *testing.T) {
	for _, s := range parserSamples {
		opts := ParserOptions{Tools: []Tool{weatherTool}, InThinking: s.thinking}
		got := parseChunks(opts, s.text)
		if !sameReply(got, s.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", s.name, show(got), show(s.want))
		}
	}
}

// TestParserSplits: every way of cutting a sample in two or three pieces
// gives what one Push gives, and nothing is held back past a character
// that cannot start a tag.
func TestParserSplits(t *testing.T) {
	for _, s := range parserSamples {
		opts := ParserOptions{Tools: []Tool{weatherTool}, InThinking: s.thinking}
		whole := parseChunks(opts, s.text)
		for i := 0; i <= len(s.text); i++ {
			if got := parseChunks(opts, s.text[:i], s.text[i:]); !sameReply(got, whole) {
				t.Fatalf("%s split at %d:\n got %+v\nwant %+v", s.name, i, show(got), show(whole))
			}
			for j := i; j <= len(s.text) && len(s.text) < 200; j += 3 {
				if got := parseChunks(opts, s.text[:i], s.text[i:j], s.text[j:]); !sameReply(got, whole) {
					t.Fatalf("%s split at %d, %d:\n got %+v\nwant %+v", s.name, i, j, show(got), show(whole))
				}
			}
		}
		// Byte by byte.
		var chunks []string
		for i := range len(s.text) {
			chunks = append(chunks, s.text[i:i+1])
		}
		if got := parseChunks(opts, chunks...); !sameReply(got, whole) {
			t.Fatalf("%s byte by byte:\n got %+v\nwant %+v", s.name, show(got), show(whole))
		}
	}
}

func TestParserStreamsPromptly(t *testing.T) {
	p := NewParser(ParserOptions{})
	if d := p.Push("Hello <"); d.Content != "Hello " {
		t.Fatalf("got %q, want everything before the possible tag", d.Content)
	}
	if d := p.Push("b> x"); d.Content != "<b> x" {
		t.Fatalf("got %q, want the released text", d.Content)
	}
	if d := p.Push(" <tool_call"); d.Content != " " {
		t.Fatalf("got %q", d.Content)
	}
	p = NewParser(ParserOptions{InThinking: true})
	if d := p.Push("hmm </thin"); d.Reasoning != "hmm " {
		t.Fatalf("got %+v", d)
	}
}

func TestParserCallIDs(t *testing.T) {
	p := NewParser(ParserOptions{})
	d := p.Push("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call><tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>")
	if len(d.ToolCalls) != 2 {
		t.Fatalf("got %+v", d)
	}
	a, b := d.ToolCalls[0], d.ToolCalls[1]
	if !strings.HasPrefix(a.ID, "call_") || len(a.ID) != 29 || a.ID == b.ID || a.Type != "function" {
		t.Fatalf("ids %q %q type %q", a.ID, b.ID, a.Type)
	}
}

func sameReply(a, b reply) bool {
	if a.Reasoning != b.Reasoning || a.Content != b.Content || len(a.Calls) != len(b.Calls) {
		return false
	}
	for i := range a.Calls {
		if a.Calls[i].Name != b.Calls[i].Name || !jsonEqual(a.Calls[i].Arguments, b.Calls[i].Arguments) {
			return false
		}
	}
	return true
}

func show(r reply) any {
	type call struct{ Name, Args string }
	var calls []call
	for _, c := range r.Calls {
		calls = append(calls, call{c.Name, string(c.Arguments)})
	}
	return struct {
		Reasoning, Content string
		Calls              []call
	}{r.Reasoning, r.Content, calls}
}

var tagStrings = []string{thinkOpen, thinkClose, toolCallOpen, toolCallClose}

// FuzzParser: no panic on any text split anywhere; splitting never changes
// the result; text without tags comes back as content unchanged; every tool
// call's arguments are a JSON object.
func FuzzParser(f *testing.F) {
	for _, s := range parserSamples {
		f.Add(s.text, uint16(len(s.text)/2), uint16(len(s.text)/3), s.thinking)
	}
	f.Add("a<b<<tool_call><<", uint16(3), uint16(9), false)
	f.Fuzz(func(t *testing.T, text string, cut1, cut2 uint16, thinking bool) {
		opts := ParserOptions{Tools: []Tool{weatherTool}, InThinking: thinking}
		whole := parseChunks(opts, text)
		i := int(cut1) % (len(text) + 1)
		j := i + int(cut2)%(len(text)-i+1)
		if got := parseChunks(opts, text[:i], text[i:j], text[j:]); !sameReply(got, whole) {
			t.Fatalf("split at %d, %d:\n got %+v\nwant %+v", i, j, show(got), show(whole))
		}
		for _, c := range whole.Calls {
			var obj map[string]any
			if err := json.Unmarshal(c.Arguments, &obj); err != nil || obj == nil {
				t.Fatalf("call %s: arguments %s are not a JSON object", c.Name, c.Arguments)
			}
		}
		for _, tag := range tagStrings {
			if strings.Contains(text, tag) {
				return
			}
		}
		want := reply{Content: text}
		if thinking {
			want = reply{Reasoning: text}
		}
		if !reflect.DeepEqual(whole, want) {
			t.Fatalf("no tags, yet got %+v", show(whole))
		}
		if utf8.ValidString(text) && !utf8.ValidString(whole.Content+whole.Reasoning) {
			t.Fatal("valid UTF-8 in, invalid out")
		}
	})
}

// BenchmarkParser streams a long reasoning, answer and tool call a few
// bytes (about a token) at a time.
func BenchmarkParser(b *testing.B) {
	text := "<think>\n" + strings.Repeat("Let me weigh <b>this</b> and 1 < 2. ", 200) + "\n</think>\n\n" +
		strings.Repeat("The answer, with a < sign. ", 200) +
		"<tool_call>\n<function=get_weather>\n<parameter=city>\n" + strings.Repeat("x", 4000) + "\n</parameter>\n</function>\n</tool_call>"
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		p := NewParser(ParserOptions{Tools: []Tool{weatherTool}})
		for i := 0; i < len(text); i += 4 {
			p.Push(text[i:min(i+4, len(text))])
		}
		if d := p.Finish(); d.Content != "" {
			b.Fatalf("left over %q", d.Content)
		}
	}
}

// With NoToolCalls (the content is constrained JSON), a "<tool_call>" in
// the answer is text.
func TestParserNoToolCalls(t *testing.T) {
	p := NewParser(ParserOptions{NoToolCalls: true, InThinking: true})
	text := "hm</think>\n\n{\"note\": \"<tool_call>\\n{}</tool_call>\"}"
	var got Delta
	for i := range len(text) {
		d := p.Push(text[i : i+1])
		got.Reasoning += d.Reasoning
		got.Content += d.Content
		got.ToolCalls = append(got.ToolCalls, d.ToolCalls...)
	}
	d := p.Finish()
	got.Content += d.Content
	if got.Reasoning != "hm" || got.Content != "{\"note\": \"<tool_call>\\n{}</tool_call>\"}" || len(got.ToolCalls) != 0 {
		t.Errorf("%+v", got)
	}
}
