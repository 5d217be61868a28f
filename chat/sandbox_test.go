package chat

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"time"

	"github.com/nikolalohinski/gonja/v2/nodes"
)

// hostile are templates that, before the sandbox, ended the process (stack
// overflow, out of memory) or never finished; the examples first.
var hostile = []struct{ name, src, want string }{
	{"recursive macro", `{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}`, "nested more than"},
	{"string times 1e10", `{{ 'x' * 10000000000 }}`, "over the limit"},
	{"string doubling", `{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}`, "more than"},
	{"range(1e8)", `{% for i in range(100000000) %}{% endfor %}`, "range() of 100000000 items"},
	{"loops without end", `{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}`, "steps"},
	{"recursive loop", `{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}`, "nested more than"},
	{"recursive loop over many", `{% set r = range(100000) %}{% for x in [0] if (x == 0) recursive %}{{ loop(r) }}{% endfor %}`, "steps"},
	{"recursive call block", `{% macro m() %}{% call m() %}{% endcall %}{% endmacro %}{{ m() }}`, "nested more than"},
	{"macro fan-out", `{% macro f(n) %}{% if n %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(40) }}`, "steps"},
	{"list doubling", `{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}`, "a list of more than"},
	{"list concat doubling", `{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l }}`, "would build"},
	{"varargs doubling", `{% macro f(n, *a) %}{% if n %}{{ f(n-1, a, a) }}{% else %}{{ a }}{% endif %}{% endmacro %}{{ f(100, 1) }}`, "arguments weigh more than"},
	{"deep nesting", `{% set ns = namespace(l=[]) %}{% for i in range(2000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}`, "nested more than 500 deep"},
	{"namespace holding itself", `{% set ns = namespace() %}{% set ns.x = ns %}{{ ns }}`, "only data"},
	{"namespace holding a loop", `{% set ns = namespace() %}{% for x in [1] recursive %}{% set ns.l = loop %}{{ ns.l([1]) }}{% endfor %}`, "only data"},
	{"replace doubling", `{% set ns = namespace(s='xx') %}{% for i in range(100) %}{% set ns.s = ns.s.replace('x', 'xx') %}{% endfor %}{{ ns.s }}`, "would build"},
	{"join of copies", `{{ ('x' * 1000000).join(range(100000)|map('string')) }}`, "over the limit"},
	{"center", `{{ 'x'|center(1000000000000) }}`, "over the limit"},
	{"indent", `{{ ('\n' * 1000000)|indent(100000) }}`, "over the limit"},
	{"ljust", `{{ 'x'.ljust(1000000000000) }}`, "over the limit"},
	{"zfill", `{{ '1'.zfill(1000000000000) }}`, "over the limit"},
	{"expandtabs", `{{ ('\t' * 1000000).expandtabs(100000) }}`, "over the limit"},
	{"str.format width", `{{ '{:>1000000000000}'.format(1) }}`, "over the limit"},
	{"format filter", `{{ ('%1000000s' * 1000)|format(1) }}`, "over the limit"},
	{"tojson indent", `{{ [[[1]]]|tojson(indent=1000000000000) }}`, "tojson would print"},
	{"batch", `{{ [1]|batch(10000000000, 0) }}`, "over the limit"},
	{"slice", `{{ [1]|slice(10000000000) }}`, "over the limit"},
	{"list times", `{{ [1] * 10000000000 }}`, "over the limit"},
}

func TestHostileTemplates(t *testing.T) {
	in := &RenderInput{Messages: []Message{{Role: "user", Content: "hi"}}}
	for _, c := range hostile {
		t.Run(c.name, func(t *testing.T) {
			tpl, err := compile(c.src)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tpl.Render(in)
			if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want a limit error with %q", err, c.want)
			}
		})
	}
}

// TestHostileTemplateRefusedAtLoad: a template that fails every rendering
// is refused when the model loads, with the limit it hit.
func TestHostileTemplateRefusedAtLoad(t *testing.T) {
	for _, c := range hostile {
		_, err := LoadTemplate(fstest.MapFS{"chat_template.jinja": {Data: []byte(c.src)}})
		if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "refused") {
			t.Errorf("%s: got %v", c.name, err)
		}
	}
	// One that misbehaves only on other conversations loads, and fails
	// those requests only.
	tpl, err := ParseTemplate(`{% if messages|length > 10 %}{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}{% endif %}ok`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tpl.Render(qwenConversation(3)); !errors.Is(err, ErrLimit) {
		t.Fatalf("got %v", err)
	}
}

// TestStatementsRefused: statements that reach other templates (a
// self-include recursed without end) are refused at parse time.
func TestStatementsRefused(t *testing.T) {
	for _, src := range []string{
		`{% include "/chat_template" %}`,
		`{% import "/chat_template" as m %}`,
		`{% from "/chat_template" import f %}`,
		`{% extends "/chat_template" %}`,
		`{% block b %}{{ self.b() }}{% endblock %}`,
	} {
		if _, err := ParseTemplate(src); err == nil || !strings.Contains(err.Error(), "not supported") {
			t.Errorf("%s: got %v", src, err)
		}
	}
}

// TestSourceLimits: sources on which gonja's parser would recurse without
// bound are refused before it runs.
func TestSourceLimits(t *testing.T) {
	for name, src := range map[string]string{
		"brackets":    "{{ " + strings.Repeat("(", 100000) + "1" + strings.Repeat(")", 100000) + " }}",
		"long tag":    "{{ " + strings.Repeat("not ", 100000) + "1 }}",
		"blocks":      strings.Repeat("{% if true %}", 100000) + strings.Repeat("{% endif %}", 100000),
		"sum":         "{{ 1" + strings.Repeat("+1", 2000) + " }}",
		"prefix":      "{{ " + strings.Repeat("-", 4000) + "1 }}",
		"list in tag": "{{ " + strings.Repeat("[", 200) + strings.Repeat("]", 200) + " }}",
	} {
		if _, err := ParseTemplate(src); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestRenderContext(t *testing.T) {
	tpl, err := compile(`{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	unbounded := &RenderInput{Limits: Limits{Steps: 1 << 50}}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := tpl.RenderContext(ctx, unbounded); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrLimit) {
		t.Fatalf("request timeout: got %v", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	if _, err := tpl.RenderContext(ctx, unbounded); !errors.Is(err, context.Canceled) {
		t.Fatalf("client gone: got %v", err)
	}
	unbounded.Limits.Time = 50 * time.Millisecond
	if _, err := tpl.Render(unbounded); !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "took more than 50ms") {
		t.Fatalf("time limit: got %v", err)
	}
}

func TestOutputLimit(t *testing.T) {
	tpl, err := compile(`{% for m in messages %}{{ m.content }}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	in := &RenderInput{Messages: []Message{{Role: "user", Content: strings.Repeat("x", 600)}, {Role: "user", Content: strings.Repeat("y", 600)}}}
	in.Limits.Output = 1000
	if _, err := tpl.Render(in); !errors.Is(err, ErrOutputLimit) || !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "prompt is over 1000 bytes") {
		t.Fatalf("got %v", err)
	}
	// A value built over the limit, printed or not, stops it there too;
	// the other limits are not output limits.
	built, err := compile(`{% set x = messages[0].content + messages[1].content %}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := built.Render(in); !errors.Is(err, ErrOutputLimit) || !strings.Contains(err.Error(), "would build 1200 bytes") {
		t.Fatalf("built: got %v", err)
	}
	in.Limits.Steps = 3
	if _, err := tpl.Render(in); !errors.Is(err, ErrLimit) || errors.Is(err, ErrOutputLimit) {
		t.Fatalf("steps: got %v", err)
	}
	in.Limits.Steps = 0
	in.Limits.Output = 2000
	if out, err := tpl.Render(in); err != nil || len(out) != 1200 {
		t.Fatalf("got %d bytes, %v", len(out), err)
	}
}

// TestSandboxKeepsJinja: the rewritten operators, literals, calls and
// loops give what Python's Jinja gives.
func TestSandboxKeepsJinja(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{`{{ [1, 2] + [3] }}|{{ 'a' + 'b' }}|{{ 1 + 2 }}|{{ 1.5 + 1 }}|{{ 'ab' * 2 }}|{{ 2 * 'ab' }}|{{ [0] * 2 }}|{{ 2 * 3 }}|{{ 'ab' * -1 }}`, "[1, 2, 3]|ab|3|2.5|abab|abab|[0, 0]|6|"},
		{`{{ 'a' ~ 1 ~ 1.5 }}|{{ (1, 2) }}|{{ {'b': 1, 'a': 2, 'b': 3} }}|{% if {} %}T{% else %}F{% endif %}|{{ dict(b=1, a=2) }}`, "a11.5|[1, 2]|{'b': 3, 'a': 2}|F|{'a': 2, 'b': 1}"},
		{`{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}|{% for k, v in {'b': 1, 'a': 2} %}{{ k }}={{ v }};{% endfor %}|{{ {'b': 1, 'a': 2}|list }}|{{ {'b': 1}|first }}`, "ba|b=1;a=2;|['b', 'a']|b"},
		{`{% for x in [[1, [2, 3]], 4] recursive %}{% if x is iterable %}<{{ loop(x) }}>{% else %}{{ x }}{% endif %}{% endfor %}`, "<1<23>>4"},
		{`{% macro m(a, b=2) %}[{{ a }}{{ b }}{{ caller() }}]{% endmacro %}{% call m(1) %}body{% endcall %}`, "[12body]"},
		{`{% macro m(*args, **kw) %}{{ args|length }}{{ kw.x }}{% endmacro %}{{ m(1, 2, x=3) }}`, "23"},
		{`{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ n }}{% endif %}{% endmacro %}{{ f(100)|length }}`, "192"},
		{`{% macro g(x) %}<{{ x }}>{% endmacro %}{% macro h(**kw) %}{{ kw.f(1) }}{% endmacro %}{{ h(f=g) }}`, "<1>"},
		{`{% set x %}a{{ 1 + 1 }}b{% endset %}{{ x }}|{% filter upper %}abc{% endfilter %}|{% raw %}{{ raw }}{% endraw %}|{% with a = 1 %}{{ a }}{% endwith %}`, "a2b|ABC|{{ raw }}|1"},
		{`{% set ns = namespace(n=0) %}{% for i in range(5) %}{% set ns.n = ns.n + i %}{{ loop.cycle('a', 'b') }}{% endfor %}{{ ns.n }}{{ range(2, 9, 3) }}{{ range(3, 0, -1) }}`, "ababa10[2, 5, 8][3, 2, 1]"},
		{`{{ {'a': 1}.get('a') }}{{ {'a': 1}.copy() }}{{ [1, 2].copy() }}{{ 'a-b'.split('-') }}{{ '{}+{}'.format(1, 2) }}{{ 'x'.ljust(3, '.') }}|`, "1{'a': 1}[1, 2]['a', 'b']1+2x..|"},
		{`{{ ['a', 'b']|map('upper')|join(',') }}|{{ 'a'|indent(2, true) }}|{{ 'x'.join(['a', 'b']) }}|{{ 'aXa'|replace('a', 'bb') }}|{{ '%s=%d'|format('a', 3) }}`, "A,B|  a|axb|bbXbb|a=3"},
	} {
		tpl, err := compile(c.src)
		if err != nil {
			t.Errorf("%s: %v", c.src, err)
			continue
		}
		if got, err := tpl.Render(&RenderInput{}); err != nil || got != c.want {
			t.Errorf("%s\n got %q %v\nwant %q", c.src, got, err, c.want)
		}
	}
}

// TestTemplateErrors: mistakes a template makes are errors that say where.
func TestTemplateErrors(t *testing.T) {
	for src, want := range map[string]string{
		`{{ nope() }}`:            "line 1: 'nope' is undefined",
		"\n{{ 'a'.nope() }}":      "line 2: 'str' object has no attribute 'nope'",
		`{{ 'x' * 1.5 }}`:         "can't multiply sequence by non-int of type 'float'",
		`{{ [1] + 'a' }}`:         `can only concatenate list (not "str") to list`,
		`{{ range(1.5) }}`:        "'float' object cannot be interpreted as an integer",
		`{{ [loop] }}`:            "",
		`{{ [range] }}`:           "only data",
		`{{ 1 % 0 }}`:             "divide by zero",
		`{{ '[1]'.split('') }}`:   "empty separator",
		`{{ 'a'|wordwrap(1) }}`:   "filter 'wordwrap' not found",
		`{{ [1].append(2) }}`:     "'list' object has no attribute 'append'",
		`{{ {'a': 1}.update() }}`: "'dict' object has no attribute 'update'",
	} {
		tpl, err := compile(src)
		if err != nil {
			t.Errorf("%s: %v", src, err)
			continue
		}
		if _, err := tpl.Render(&RenderInput{}); (err == nil) != (want == "") || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("%s: got %v, want %q", src, err, want)
		}
	}
}

// FuzzTemplate: any template text either fails to parse or renders (or
// fails) under its limits; none ends the process.
func FuzzTemplate(f *testing.F) {
	for _, c := range hostile {
		f.Add(c.src)
	}
	for _, name := range []string{"qwen3.jinja", "qwen3.8.jinja"} {
		src, err := os.ReadFile(filepath.Join("..", "testdata", "chat", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(src))
	}
	f.Add(`{% for m in messages %}{{ m.role ~ ': ' ~ m.content|trim }}{% if not loop.last %}\n{% endif %}{% endfor %}`)
	in := qwenConversation(1)
	in.Limits = Limits{Steps: 20000, Output: 1 << 20, Memory: 8 << 20, Time: time.Second}
	f.Fuzz(func(t *testing.T, src string) {
		tpl, err := compile(src)
		if err != nil {
			return
		}
		out, err := tpl.Render(in)
		if err == nil && len(out) > in.Limits.Output {
			t.Fatalf("rendered %d bytes over the limit", len(out))
		}
	})
}

// TestLoadTemplateRefusesSpecialFiles: a named pipe in place of
// tokenizer_config.json or chat_template.jinja is refused, not read.
func TestLoadTemplateRefusesSpecialFiles(t *testing.T) {
	for _, name := range []string{"tokenizer_config.json", "chat_template.jinja"} {
		dir := t.TempDir()
		if err := syscall.Mkfifo(filepath.Join(dir, name), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadTemplate(os.DirFS(dir)); err == nil || !strings.Contains(err.Error(), name+": not a regular file (a named pipe)") {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// FuzzTokenizerConfig: any tokenizer_config.json gives a template or an
// error, never a panic.
func FuzzTokenizerConfig(f *testing.F) {
	f.Add([]byte(`{"chat_template": "{% for m in messages %}{{ bos_token }}{{ m.content }}{{ eos_token }}{% endfor %}", "bos_token": "<s>", "eos_token": {"content": "</s>"}, "add_bos_token": true}`))
	f.Add([]byte(`{"chat_template": [{"name": "default", "template": "{{ messages|length }}"}, {"name": "tool_use", "template": "x"}], "pad_token": null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		tpl, err := LoadTemplate(fstest.MapFS{"tokenizer_config.json": {Data: data}})
		if err != nil {
			return
		}
		tpl.Render(&RenderInput{Messages: []Message{{Role: "user", Content: "hi"}}, Limits: Limits{Steps: 20000, Time: time.Second}})
	})
}

// TestPrintParts: an output of a + chain of lookups prints its strings one
// after the other, as the sum would print, and leaves everything else
// (other types, undefined names, errors) to the plain path.
func TestPrintParts(t *testing.T) {
	in := qwenConversation(2)
	for _, src := range []string{
		`{% for m in messages %}{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>' + '\n' }}{% endfor %}`,
		`{{ 'a' + 'b' }}|{{ messages[0]['role'] + messages[0].content }}|{{ n + 'x' }}|{{ 'x' + n }}|{{ l + l }}|{{ n + n }}`,
		`{{ 'a' + nope }}`,
		`{{ nope.attr + 'a' }}`,
		`{{ 'a' + messages[0].nope }}`,
		`{{ l + 'a' }}`,
		`{{ 'a' + ('b' + 'c') }}|{{ 'a' + 'b' if true }}|{{ ('a' + 'b')|upper }}`,
	} {
		tpl, err := compile(`{% set n = 3 %}{% set l = [1] %}` + src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		tpl.plain = true
		want, werr := tpl.Render(in)
		tpl.plain = false
		got, err := tpl.Render(in)
		if got != want || fmt.Sprint(err) != fmt.Sprint(werr) {
			t.Errorf("%s\n parts %q %v\n plain %q %v", src, got, err, want, werr)
		}
	}
	tpl, err := compile(`{{ 'a' + messages[0].content }}`)
	if err != nil {
		t.Fatal(err)
	}
	if o := findOutput(tpl); o == nil || len(o.parts) != 2 {
		t.Errorf("the + chain of lookups was not taken apart: %+v", o)
	}
}

// findOutput is the first output of tpl's top level.
func findOutput(tpl *Template) *outputNode {
	for _, n := range tpl.tpl.Root().Nodes {
		if b, ok := n.(*nodes.ControlStructureBlock); ok {
			if o, ok := b.ControlStructure.(*outputNode); ok {
				return o
			}
		}
	}
	return nil
}
