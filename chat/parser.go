package chat

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"strconv"
	"strings"
	"unicode"
)

const (
	thinkOpen     = "<think>"
	thinkClose    = "</think>"
	toolCallOpen  = "<tool_call>"
	toolCallClose = "</tool_call>"
)

// ParserOptions configure a Parser.
type ParserOptions struct {
	Tools      []Tool // tool schemas: XML-form parameter values are typed by them
	InThinking bool   // the prompt opened <think> (see OpensThinking)
	// NoToolCalls: the answer cannot call tools (its content is
	// constrained to JSON), so "<tool_call>" in it is text.
	NoToolCalls bool
}

// Delta is what a stretch of generated text adds to the reply.
type Delta struct {
	Reasoning, Content string
	ToolCalls          []ToolCall // complete calls only; Arguments is a JSON object (raw)
}

// Parser splits a model's generated text, as it streams in, into reasoning
// (<think>...</think>), content and tool calls, in Qwen's JSON form
//
//	<tool_call>
//	{"name": "f", "arguments": {"x": 1}}
//	</tool_call>
//
// and XML form
//
//	<tool_call>
//	<function=f>
//	<parameter=x>
//	1
//	</parameter>
//	</function>
//	</tool_call>
//
// It holds back only text that could be the start of a tag, so content
// streams as it comes. A tool call it cannot read comes back as content.
// Newlines right after </think> and </tool_call> are dropped (the template
// writes them and strips them again when the reply is sent back).
// A Parser is not safe for concurrent use.
type Parser struct {
	schemas     map[string]map[string]string // tool -> parameter -> JSON type
	mode        parseMode
	buf         string // text not yet given out: a possible tag start, or a tool call's body
	sawContent  bool   // non-whitespace content was given out (no <think> after that)
	dropNewline bool   // drop newlines until other text comes
	searched    int    // in a tool call: how much of buf holds no closing tag
	noCalls     bool
}

type parseMode int

const (
	modeContent parseMode = iota
	modeReasoning
	modeToolCall
)

// NewParser returns a parser for one generation.
func NewParser(opts ParserOptions) *Parser {
	p := &Parser{schemas: toolSchemas(opts.Tools), noCalls: opts.NoToolCalls}
	if opts.InThinking {
		p.mode = modeReasoning
	}
	return p
}

// Push adds generated text, split anywhere, and returns what it completes.
func (p *Parser) Push(text string) Delta {
	var d Delta
	p.buf += text
	for p.step(&d) {
	}
	return d
}

// Finish ends the generation: text held back is given out, and an
// unterminated tool call comes back as content.
func (p *Parser) Finish() Delta {
	var d Delta
	switch p.mode {
	case modeToolCall:
		p.emit(&d, toolCallOpen+p.buf)
	default:
		p.emit(&d, p.buf)
	}
	p.buf = ""
	return d
}

// step consumes what it can of buf; it reports whether to go on.
func (p *Parser) step(d *Delta) bool {
	if p.dropNewline {
		n := len(p.buf) - len(strings.TrimLeft(p.buf, "\n"))
		p.buf = p.buf[n:]
		if p.buf == "" {
			return false
		}
		p.dropNewline = false
	}
	if p.mode == modeToolCall {
		// A long call arrives in many pieces: search only the new text.
		from := max(0, p.searched-len(toolCallClose)+1)
		i := strings.Index(p.buf[from:], toolCallClose)
		if i < 0 {
			p.searched = len(p.buf)
			return false
		}
		i += from
		p.searched = 0
		body := p.buf[:i]
		p.buf = p.buf[i+len(toolCallClose):]
		p.mode = modeContent
		if call, ok := p.parseToolCall(body); ok {
			d.ToolCalls = append(d.ToolCalls, call)
			p.dropNewline = true
		} else {
			p.emit(d, toolCallOpen+body+toolCallClose)
		}
		return true
	}
	if p.mode == modeContent && !p.sawContent {
		// <think> opens reasoning only before any content.
		rest := strings.TrimLeftFunc(p.buf, unicode.IsSpace)
		if rest != "" && !strings.HasPrefix(rest, thinkOpen) {
			if strings.HasPrefix(thinkOpen, rest) {
				p.emit(d, p.buf[:len(p.buf)-len(rest)])
				p.buf = rest
				return false
			}
			p.sawContent = true
		}
	}
	tags := p.tags()
	at, tag := -1, ""
	for _, t := range tags {
		if i := strings.Index(p.buf, t); i >= 0 && (at < 0 || i < at) {
			at, tag = i, t
		}
	}
	if at < 0 {
		keep := heldBack(p.buf, tags)
		p.emit(d, p.buf[:len(p.buf)-keep])
		p.buf = p.buf[len(p.buf)-keep:]
		return false
	}
	p.emit(d, p.buf[:at])
	p.buf = p.buf[at+len(tag):]
	switch tag {
	case thinkOpen:
		p.mode = modeReasoning
		p.dropNewline = true
	case thinkClose:
		p.mode = modeContent
		p.dropNewline = true
	case toolCallOpen:
		p.mode = modeToolCall
	}
	return true
}

// tags are the tags that end the current mode's text.
func (p *Parser) tags() []string {
	if p.mode == modeReasoning {
		return []string{thinkClose}
	}
	var tags []string
	if !p.noCalls {
		tags = append(tags, toolCallOpen)
	}
	if !p.sawContent {
		tags = append(tags, thinkOpen)
	}
	return tags
}

// heldBack is the length of the longest suffix of s that a tag starts with.
func heldBack(s string, tags []string) int {
	i := strings.LastIndexByte(s, '<')
	if i < 0 {
		return 0
	}
	for ; i < len(s); i++ {
		for _, t := range tags {
			if len(s)-i < len(t) && strings.HasPrefix(t, s[i:]) {
				return len(s) - i
			}
		}
	}
	return 0
}

func (p *Parser) emit(d *Delta, s string) {
	if s == "" {
		return
	}
	if p.mode == modeReasoning {
		d.Reasoning += s
		return
	}
	d.Content += s
	if strings.TrimSpace(s) != "" {
		p.sawContent = true
	}
}

// parseToolCall reads a tool call's body in either form.
func (p *Parser) parseToolCall(body string) (ToolCall, bool) {
	body = strings.TrimSpace(body)
	var name string
	var args json.RawMessage
	var ok bool
	if strings.HasPrefix(body, "<function=") {
		name, args, ok = p.parseXMLCall(body)
	} else {
		name, args, ok = parseJSONCall(body)
	}
	if !ok {
		return ToolCall{}, false
	}
	return ToolCall{ID: newCallID(), Type: "function", Function: FunctionCall{Name: name, Arguments: args}}, true
}

func parseJSONCall(body string) (string, json.RawMessage, bool) {
	var c struct {
		Name      *string         `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	dec := json.NewDecoder(strings.NewReader(body))
	if dec.Decode(&c) != nil || dec.More() || c.Name == nil || *c.Name == "" {
		return "", nil, false
	}
	args := bytes.TrimSpace(c.Arguments)
	if len(args) == 0 || string(args) == "null" {
		return *c.Name, json.RawMessage("{}"), true
	}
	// Some models write the arguments as a string holding the JSON.
	var s string
	if json.Unmarshal(args, &s) == nil {
		args = []byte(strings.TrimSpace(s))
	}
	if len(args) == 0 || args[0] != '{' || !json.Valid(args) {
		return "", nil, false
	}
	return *c.Name, json.RawMessage(args), true
}

// parseXMLCall reads <function=NAME> <parameter=P>value</parameter>...
// </function>; values are typed by the tool's schema.
func (p *Parser) parseXMLCall(body string) (string, json.RawMessage, bool) {
	rest := strings.TrimPrefix(body, "<function=")
	end := strings.IndexByte(rest, '>')
	if end < 0 {
		return "", nil, false
	}
	name := strings.TrimSpace(rest[:end])
	rest = rest[end+1:]
	if name == "" || strings.ContainsAny(name, "<\n") {
		return "", nil, false
	}
	types := p.schemas[name]
	var out bytes.Buffer
	out.WriteByte('{')
	seen := map[string]bool{}
	for {
		rest = strings.TrimLeft(rest, " \t\r\n")
		if strings.HasPrefix(rest, "</function>") {
			if strings.TrimSpace(rest[len("</function>"):]) != "" {
				return "", nil, false
			}
			break
		}
		if !strings.HasPrefix(rest, "<parameter=") {
			return "", nil, false
		}
		rest = rest[len("<parameter="):]
		end := strings.IndexByte(rest, '>')
		if end < 0 {
			return "", nil, false
		}
		param := strings.TrimSpace(rest[:end])
		rest = rest[end+1:]
		close := strings.Index(rest, "</parameter>")
		if close < 0 || param == "" || seen[param] {
			return "", nil, false
		}
		seen[param] = true
		value := strings.TrimPrefix(rest[:close], "\n")
		value = strings.TrimSuffix(value, "\n")
		rest = rest[close+len("</parameter>"):]
		if out.Len() > 1 {
			out.WriteString(", ")
		}
		key, _ := json.Marshal(param)
		out.Write(key)
		out.WriteString(": ")
		out.Write(typedValue(value, types[param]))
	}
	out.WriteByte('}')
	return name, json.RawMessage(out.Bytes()), true
}

// typedValue turns a parameter's text into JSON of its schema type;
// text that does not parse as that type stays a string.
func typedValue(v, typ string) []byte {
	t := strings.TrimSpace(v)
	switch typ {
	case "integer":
		if i, err := strconv.ParseInt(t, 10, 64); err == nil {
			return []byte(strconv.FormatInt(i, 10))
		}
		if f, err := strconv.ParseFloat(t, 64); err == nil && f == float64(int64(f)) {
			return []byte(strconv.FormatInt(int64(f), 10))
		}
	case "number":
		if json.Valid([]byte(t)) {
			if _, err := strconv.ParseFloat(t, 64); err == nil {
				return []byte(t)
			}
		}
		if f, err := strconv.ParseFloat(t, 64); err == nil && !strings.ContainsAny(t, "nNiI") {
			return []byte(strconv.FormatFloat(f, 'g', -1, 64))
		}
	case "boolean":
		switch strings.ToLower(t) {
		case "true":
			return []byte("true")
		case "false":
			return []byte("false")
		}
	case "object", "array":
		if json.Valid([]byte(t)) && (t[0] == '{') == (typ == "object") && (t[0] == '[') == (typ == "array") {
			var buf bytes.Buffer
			if json.Compact(&buf, []byte(t)) == nil {
				return buf.Bytes()
			}
		}
	case "null":
		if t == "null" {
			return []byte("null")
		}
	}
	s, _ := json.Marshal(v)
	return s
}

// toolSchemas maps each tool's parameters to their JSON types, from
// {"type": "function", "function": {"name", "parameters": {"properties"}}}
// (or the bare function object). A union type takes its first non-null
// member.
func toolSchemas(tools []Tool) map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, raw := range tools {
		name, params := toolFunction(raw)
		var schema struct {
			Properties map[string]struct {
				Type  json.RawMessage `json:"type"`
				AnyOf []struct {
					Type json.RawMessage `json:"type"`
				} `json:"anyOf"`
			} `json:"properties"`
		}
		if name == "" || len(params) > 0 && json.Unmarshal(params, &schema) != nil {
			continue
		}
		types := map[string]string{}
		for p, prop := range schema.Properties {
			typ := schemaType(prop.Type)
			for _, alt := range prop.AnyOf {
				if typ == "" {
					typ = schemaType(alt.Type)
				}
			}
			types[p] = typ
		}
		out[name] = types
	}
	return out
}

func schemaType(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var list []string
	json.Unmarshal(raw, &list)
	for _, t := range list {
		if t != "null" {
			return t
		}
	}
	if len(list) > 0 {
		return list[0]
	}
	return ""
}

const idChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

// newCallID is "call_" and 24 random letters and digits.
func newCallID() string {
	b := make([]byte, 24)
	rand.Read(b)
	for i := range b {
		b[i] = idChars[int(b[i])%len(idChars)]
	}
	return "call_" + string(b)
}
