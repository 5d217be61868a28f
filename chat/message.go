// Package chat turns conversations into prompts with a model's own chat
// template, and generated text back into reasoning, content and tool calls.
package chat

import "encoding/json"

// Message is one message of a conversation, as the OpenAI chat API spells it.
type Message struct {
	Role             string     `json:"role"`
	Content          string     `json:"content"`
	ReasoningContent string     `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
	ToolCallID       string     `json:"tool_call_id,omitempty"`
	Name             string     `json:"name,omitempty"`
}

// ToolCall is a call the assistant made.
type ToolCall struct {
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type,omitempty"` // "function"
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function and its arguments. Arguments is the JSON
// the client sent: an object, or a string holding JSON (as OpenAI sends it).
// Templates see an object with its keys in order, or the string as is.
type FunctionCall struct {
	Name      string          `json:"name"`
	Arguments json.RawMessage `json:"arguments"`
}

// Tool is a tool definition as the client sent it (OpenAI's
// {"type":"function","function":{...}}); kept raw so that templates print it
// with its keys in the client's order.
type Tool = json.RawMessage
