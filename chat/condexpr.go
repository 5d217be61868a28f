package chat

import (
	"fmt"
	"strings"
)

// gonja parses Jinja's conditional expression (X if C else Y) only as a
// whole {{ }} or {% set %} expression, not nested inside brackets (in
// outputs, assignments, if and for tags), as in
// Qwen's
//
//	{{- 'a' + (x + '\n\n' if x else '') + 'b' }}
//
// rewriteConditionals moves each nested one into statements before its tag,
// which evaluate the same way:
//
//	{%- if x %}{% set __cond0 = x + '\n\n' %}{% else %}{% set __cond0 = '' %}{% endif %}{{ 'a' + (__cond0) + 'b' }}
//
// The opening tag takes over the original tag's left whitespace control
// ("+" where it had none, so lstrip_blocks leaves the line as {{ did).
func rewriteConditionals(src string) string {
	var out strings.Builder
	n := 0
	for i := 0; i < len(src); {
		tag, ok := nextTag(src, i)
		if !ok {
			out.WriteString(src[i:])
			break
		}
		out.WriteString(src[i:tag.start])
		text := src[tag.start:tag.end]
		if rewritable(tag) {
			text = rewriteTag(tag, &n)
		}
		out.WriteString(text)
		i = tag.end
		if tag.kind == '%' && strings.TrimSpace(tag.body) == "raw" {
			end := strings.Index(src[i:], "endraw")
			if end < 0 {
				out.WriteString(src[i:])
				break
			}
			out.WriteString(src[i : i+end])
			i += end
		}
	}
	return out.String()
}

// tag is one {{ }} / {% %} / {# #} of a template source.
type tag struct {
	start, end int
	kind       byte   // '{' output, '%' statement, '#' comment
	open       string // whitespace control after the opening: "-", "+" or ""
	close      string // before the closing
	body       string // between the controls
}

func nextTag(src string, from int) (tag, bool) {
	for i := from; i+1 < len(src); i++ {
		if src[i] != '{' || (src[i+1] != '{' && src[i+1] != '%' && src[i+1] != '#') {
			continue
		}
		t := tag{start: i, kind: src[i+1]}
		j := i + 2
		if j < len(src) && (src[j] == '-' || src[j] == '+') {
			t.open = src[j : j+1]
			j++
		}
		closer := t.closer()
		end := findClose(src, j, closer, t.kind != '#')
		if end < 0 {
			return tag{}, false
		}
		bodyEnd := end
		if bodyEnd > j && (src[bodyEnd-1] == '-' || src[bodyEnd-1] == '+') {
			t.close = src[bodyEnd-1 : bodyEnd]
			bodyEnd--
		}
		t.body = src[j:bodyEnd]
		t.end = end + len(closer)
		return t, true
	}
	return tag{}, false
}

// findClose finds closer at bracket depth 0, outside string literals.
func findClose(src string, i int, closer string, code bool) int {
	if !code {
		if k := strings.Index(src[i:], closer); k >= 0 {
			return i + k
		}
		return -1
	}
	depth := 0
	for ; i < len(src); i++ {
		switch c := src[i]; c {
		case '\'', '"':
			i = skipString(src, i)
		case '(', '[', '{':
			depth++
		case ')', ']', '}':
			if depth == 0 && strings.HasPrefix(src[i:], closer) {
				return i
			}
			depth--
		default:
			if depth == 0 && strings.HasPrefix(src[i:], closer) {
				return i
			}
		}
	}
	return -1
}

// skipString returns the index of the quote closing the literal at i.
func skipString(s string, i int) int {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch s[j] {
		case '\\':
			j++
		case q:
			return j
		}
	}
	return len(s)
}

// rewritable reports a tag before which statements may go: an output, an
// assignment, an if or a for (not elif: that would land in the branch
// before it).
func rewritable(t tag) bool {
	if t.kind == '{' {
		return true
	}
	f := strings.Fields(t.body)
	if t.kind != '%' || len(f) == 0 {
		return false
	}
	return f[0] == "if" || f[0] == "for" || (f[0] == "set" && topLevelAssign(t.body) > 0)
}

// topLevelAssign is the index of a lone "=" outside brackets and strings.
func topLevelAssign(s string) int {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\'', '"':
			i = skipString(s, i)
		case '(', '[', '{':
			depth++
		case ')', ']', '}':
			depth--
		case '=':
			if depth == 0 && (i+1 == len(s) || s[i+1] != '=') && (i == 0 || !strings.ContainsRune("=!<>", rune(s[i-1]))) {
				return i
			}
		}
	}
	return -1
}

// rewriteTag rewrites the nested conditionals of one tag, innermost first.
func rewriteTag(t tag, n *int) string {
	body := t.body
	var pre strings.Builder
	first := true
	for {
		c, ok := innermostConditional(body)
		if !ok {
			break
		}
		name := fmt.Sprintf("__kiln_cond%d", *n)
		*n++
		open := "%"
		if first {
			open = "%" + t.open
			if t.open == "" {
				open = "%+"
			}
			first = false
		}
		els := c.no
		if els == "" {
			els = "__kiln_undefined"
		}
		fmt.Fprintf(&pre, "{%s if %s %%}{%% set %s = %s %%}{%% else %%}{%% set %s = %s %%}{%% endif %%}",
			open, c.cond, name, c.yes, name, els)
		body = body[:c.start] + " " + name + " " + body[c.end:]
	}
	if pre.Len() == 0 {
		return t.openText() + t.body + t.closeText()
	}
	return pre.String() + t.openText() + body + t.closeText()
}

func (t tag) openText() string  { return "{" + string(t.kind) + t.open }
func (t tag) closeText() string { return t.close + t.closer() }

func (t tag) closer() string {
	if t.kind == '{' {
		return "}}"
	}
	return string(t.kind) + "}"
}

// conditional is one "yes if cond else no" element inside brackets of an
// expression, at body[start:end].
type conditional struct {
	start, end    int
	yes, cond, no string
	depth         int
}

// innermostConditional finds the most deeply nested bracketed element
// holding a conditional expression at its own level.
func innermostConditional(s string) (conditional, bool) {
	type frame struct{ elemStart, ifAt, elseAt int }
	var best conditional
	found := false
	var stack []frame
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\'' || c == '"':
			i = skipString(s, i)
		case c == '(' || c == '[' || c == '{':
			stack = append(stack, frame{elemStart: i + 1, ifAt: -1, elseAt: -1})
		case c == ')' || c == ']' || c == '}' || ((c == ',' || c == ':') && len(stack) > 0):
			if len(stack) == 0 {
				continue
			}
			f := stack[len(stack)-1]
			if f.ifAt >= 0 && (!found || len(stack) > best.depth) {
				cd := conditional{start: f.elemStart, end: i, depth: len(stack)}
				cd.yes = s[f.elemStart:f.ifAt]
				if f.elseAt >= 0 {
					cd.cond = s[f.ifAt+2 : f.elseAt]
					cd.no = s[f.elseAt+4 : i]
				} else {
					cd.cond = s[f.ifAt+2 : i]
				}
				if strings.TrimSpace(cd.yes) != "" {
					best, found = cd, true
				}
			}
			if c == ',' || c == ':' {
				stack[len(stack)-1] = frame{elemStart: i + 1, ifAt: -1, elseAt: -1}
			} else {
				stack = stack[:len(stack)-1]
			}
		case isIdentStart(c):
			j := i
			for j < len(s) && isIdentChar(s[j]) {
				j++
			}
			if len(stack) > 0 && (i == 0 || s[i-1] != '.') {
				f := &stack[len(stack)-1]
				switch s[i:j] {
				case "if":
					if f.ifAt < 0 {
						f.ifAt = i
					}
				case "else":
					if f.ifAt >= 0 && f.elseAt < 0 {
						f.elseAt = i
					}
				}
			}
			i = j - 1
		}
	}
	return best, found
}

func isIdentStart(c byte) bool {
	return c == '_' || (c|0x20 >= 'a' && c|0x20 <= 'z')
}

func isIdentChar(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }
