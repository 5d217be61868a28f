package chat

import (
	"encoding/json"
	"fmt"

	"github.com/kiln-llm/kiln/grammar"
)

// ToolCallGrammar returns the grammar of the rest of a tool call that
// ToolCallStart(name) began, for constrained decoding: the name of one of
// tools when name is empty, then arguments that the tool's parameter
// schema allows, then the end of the call, in the template's form (JSON
// arguments, or XML parameters written as the Parser reads them back:
// strings raw, other types as JSON). Errors are the template's (it writes
// no tool calls) and a tool's schema's (a *grammar.SchemaError, the tool
// named).
func (t *Template) ToolCallGrammar(tools []Tool, name string) (grammar.Expr, error) {
	xml, err := t.callForm()
	if err != nil {
		return grammar.Expr{}, err
	}
	types := toolSchemas(tools)
	var alts []grammar.Expr
	for _, raw := range tools {
		fn, params := toolFunction(raw)
		if fn == "" || name != "" && fn != name {
			continue
		}
		if len(params) == 0 || string(params) == "null" {
			params = json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`)
		}
		var call grammar.Expr
		if xml {
			fields, err := grammar.Record(params, func(p string) (string, string, string) {
				typ := types[fn][p]
				switch typ {
				case "integer", "number", "boolean", "object", "array", "null":
				default:
					typ = "string" // typedValue keeps the text as a string
				}
				return "<parameter=" + p + ">\n", "\n</parameter>\n", typ
			}, "</parameter>")
			if err != nil {
				return grammar.Expr{}, fmt.Errorf("tool %q: %w", fn, err)
			}
			call = grammar.Seq(fields, grammar.Literal("</function>\n</tool_call>"))
			if name == "" {
				call = grammar.Seq(grammar.Literal(fn+">\n"), call)
			}
		} else {
			args, err := grammar.ObjectSchema(params)
			if err != nil {
				return grammar.Expr{}, fmt.Errorf("tool %q: %w", fn, err)
			}
			call = grammar.Seq(args, grammar.Literal("}\n</tool_call>"))
			if name == "" {
				call = grammar.Seq(grammar.Literal(fn+`", "arguments": `), call)
			}
		}
		alts = append(alts, call)
	}
	if len(alts) == 0 {
		return grammar.Expr{}, fmt.Errorf("no tool named %q", name)
	}
	return grammar.Alt(alts...), nil
}

// toolFunction returns a tool's function name and parameter schema, from
// {"type": "function", "function": {...}} or the bare function object.
func toolFunction(raw Tool) (string, json.RawMessage) {
	type fn struct {
		Name       string          `json:"name"`
		Parameters json.RawMessage `json:"parameters"`
	}
	var t struct {
		Function *fn `json:"function"`
		fn
	}
	if json.Unmarshal(raw, &t) != nil {
		return "", nil
	}
	if t.Function != nil {
		return t.Function.Name, t.Function.Parameters
	}
	return t.Name, t.Parameters
}
