package server

import (
	"encoding/json"
	"strings"

	"github.com/kiln-llm/kiln/session"
)

// wireFormat is OpenAI's response_format: "text", "json_object" (any JSON
// object) or "json_schema" (an object following json_schema.schema; strict
// or not, the output is constrained to it).
type wireFormat struct {
	Type       string `json:"type"`
	JSONSchema *struct {
		Name   string          `json:"name"`
		Schema json.RawMessage `json:"schema"`
		Strict *bool           `json:"strict"`
	} `json:"json_schema"`
}

// format returns the session's Format of f (nil: free text).
func (f *wireFormat) format() (*session.Format, error) {
	if f == nil {
		return nil, nil
	}
	switch f.Type {
	case "", "text":
		return nil, nil
	case "json_object":
		return &session.Format{}, nil
	case "json_schema":
		if f.JSONSchema == nil {
			return nil, badRequest("response_format", "response_format json_schema needs a json_schema object")
		}
		if s := f.JSONSchema.Schema; len(s) > 0 && string(s) != "null" {
			return &session.Format{Schema: s}, nil
		}
		return &session.Format{}, nil
	}
	return nil, badRequest("response_format", "response_format type must be \"text\", \"json_object\" or \"json_schema\", not %q", f.Type)
}

// ollamaFormat reads Ollama's format: "json" (any JSON object) or a JSON
// schema; "" and null are free text.
func ollamaFormat(raw json.RawMessage) (*session.Format, error) {
	f := strings.TrimSpace(string(raw))
	switch {
	case f == "" || f == "null" || f == `""`:
		return nil, nil
	case f == `"json"`:
		return &session.Format{}, nil
	case strings.HasPrefix(f, "{") || f == "true":
		return &session.Format{Schema: raw}, nil
	}
	return nil, badRequest("format", "format must be \"json\" or a JSON schema, not %s", f)
}
