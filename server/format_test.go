package server

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"

	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/internal/schematest"
)

const personSchema = `{"type":"object","properties":{"name":{"type":"string","maxLength":16},"age":{"type":"integer","minimum":0,"maximum":120},` +
	`"pets":{"type":"array","items":{"enum":["cat","dog"]},"maxItems":3}},"required":["name","age"],"additionalProperties":false}`

// Structured outputs through the wire: OpenAI's response_format
// json_schema (whole and streamed, by the openai-go client), Ollama's
// format as a schema (/api/chat) and "json" (/api/generate).
func TestStructuredOutputWire(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	c := ts.client()
	ctx := context.Background()
	var schema map[string]any
	json.Unmarshal([]byte(personSchema), &schema)
	params := openai.ChatCompletionNewParams{Model: testModel, MaxTokens: openai.Int(400), Temperature: openai.Float(0.7), Seed: openai.Int(3),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Describe a person.")},
		ResponseFormat: openai.ChatCompletionNewParamsResponseFormatUnion{OfJSONSchema: &shared.ResponseFormatJSONSchemaParam{
			JSONSchema: shared.ResponseFormatJSONSchemaJSONSchemaParam{Name: "person", Schema: schema, Strict: openai.Bool(true)}}}}
	whole, err := c.Chat.Completions.New(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if ch := whole.Choices[0]; ch.FinishReason != "stop" || schematest.Validate([]byte(personSchema), []byte(ch.Message.Content)) != nil {
		t.Errorf("json_schema: %q (%s): %v", ch.Message.Content, ch.FinishReason, schematest.Validate([]byte(personSchema), []byte(ch.Message.Content)))
	}
	stream := c.Chat.Completions.NewStreaming(ctx, params)
	var streamed strings.Builder
	for stream.Next() {
		if ch := stream.Current().Choices; len(ch) > 0 {
			streamed.WriteString(ch[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil || streamed.String() != whole.Choices[0].Message.Content {
		t.Errorf("streamed %q (%v), whole %q", streamed.String(), err, whole.Choices[0].Message.Content)
	}

	status, _, lines := ollamaPost(t, ts.url, "/api/chat", `{"model":"kiln-test","stream":false,"messages":[{"role":"user","content":"A person?"}],`+
		`"format":`+personSchema+`,"options":{"temperature":0.5,"seed":1,"num_predict":400}}`)
	if status != 200 || len(lines) != 1 {
		t.Fatalf("ollama chat: %d %v", status, lines)
	}
	msg, _ := lines[0]["message"].(map[string]any)
	content, _ := msg["content"].(string)
	if err := schematest.Validate([]byte(personSchema), []byte(content)); err != nil || lines[0]["done_reason"] != "stop" {
		t.Errorf("ollama chat format: %q (%v): %v", content, lines[0]["done_reason"], err)
	}
	// "json": any object; the tiny model's strings may not end, so only an
	// answer that ended must parse.
	status, _, lines = ollamaPost(t, ts.url, "/api/generate", `{"model":"kiln-test","stream":false,"prompt":"{","raw":true,"format":"json","options":{"num_predict":100}}`)
	response, _ := lines[0]["response"].(string)
	if status != 200 || !strings.HasPrefix(response, "{") {
		t.Fatalf("ollama generate json: %d %q", status, response)
	}
	var obj map[string]any
	if lines[0]["done_reason"] == "stop" && json.Unmarshal([]byte(response), &obj) != nil {
		t.Errorf("ollama generate json: %q", response)
	}
	for _, bad := range []string{`"yaml"`, `5`, `{"type":"string","format":"email"}`} {
		status, _, lines := ollamaPost(t, ts.url, "/api/generate", `{"model":"kiln-test","prompt":"x","format":`+bad+`}`)
		if status != 400 || len(lines) != 1 || lines[0]["error"] == nil {
			t.Errorf("format %s: %d %v", bad, status, lines)
		}
	}
}
