package server

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/internal/testmodel"
)

func norm(v []float64) float64 {
	var s float64
	for _, x := range v {
		s += x * x
	}
	return math.Sqrt(s)
}

// The embedding routes on an embedding model: OpenAI's /v1/embeddings (by
// the openai-go client: texts, token ids, dimensions, base64) and Ollama's
// /api/embed and /api/embeddings give the same vectors; inputs too long,
// bad dimensions and chat requests are 400s, and a chat model answers
// embeddings with a 400 that says what it is.
func TestEmbeddings(t *testing.T) {
	ts := serve(t, Options{}, engine.Options{}, testmodel.LoadDir(t, testmodel.AsEmbedding(t, "qwen3"), testmodel.Options{Threads: 2}))
	c := ts.client()
	ctx := context.Background()
	texts := []string{"The sea is deep.", "Mountains are tall, and the air up there is thin.", "hi"}
	res, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: testModel,
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: texts}})
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, text := range texts {
		want += len(ts.tok.Encode(text)) + 1 // and <|endoftext|>
	}
	if len(res.Data) != len(texts) || res.Usage.PromptTokens != int64(want) {
		t.Fatalf("%d embeddings, %d prompt tokens; want %d, %d", len(res.Data), res.Usage.PromptTokens, len(texts), want)
	}
	for i, d := range res.Data {
		if d.Index != int64(i) || len(d.Embedding) != 64 || math.Abs(norm(d.Embedding)-1) > 1e-5 {
			t.Errorf("embedding %d: index %d, %d components, norm %v", i, d.Index, len(d.Embedding), norm(d.Embedding))
		}
	}
	first := res.Data[0].Embedding

	close := func(what string, got []float64, want []float64) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d components, want %d", what, len(got), len(want))
		}
		for i := range got {
			if math.Abs(got[i]-want[i]) > 1e-6 {
				t.Fatalf("%s: component %d is %v, want %v", what, i, got[i], want[i])
			}
		}
	}
	ids := append(ts.tok.Encode(texts[0]), ts.tok.Encode("<|endoftext|>")...)
	var ids64 []int64
	for _, id := range ids {
		ids64 = append(ids64, int64(id))
	}
	byIDs, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: testModel, Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfTokens: ids64}})
	if err != nil {
		var ae *openai.Error
		errors.As(err, &ae)
		t.Fatal(err, ae.RawJSON())
	}
	close("token ids", byIDs.Data[0].Embedding, first)

	short, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: testModel, Dimensions: openai.Int(16),
		Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String(texts[0])}})
	if err != nil {
		t.Fatal(err)
	}
	n := norm(first[:16])
	var truncated []float64
	for _, x := range first[:16] {
		truncated = append(truncated, x/n)
	}
	close("dimensions 16", short.Data[0].Embedding, truncated)

	status, v := rawPost(t, ts.url, "/v1/embeddings", "application/json", []byte(`{"input":"The sea is deep.","encoding_format":"base64"}`))
	b64, _ := v["data"].([]any)[0].(map[string]any)["embedding"].(string)
	raw, err := base64.StdEncoding.DecodeString(b64)
	if status != 200 || err != nil || len(raw) != 4*64 {
		t.Fatalf("base64: %d %v %d bytes", status, err, len(raw))
	}
	var decoded []float64
	for i := 0; i < len(raw); i += 4 {
		decoded = append(decoded, float64(math.Float32frombits(binary.LittleEndian.Uint32(raw[i:]))))
	}
	close("base64", decoded, first)

	status, _, lines := ollamaPost(t, ts.url, "/api/embed", `{"model":"kiln-test","input":["The sea is deep.","hi"]}`)
	if status != 200 || len(lines) != 1 {
		t.Fatalf("/api/embed: %d %v", status, lines)
	}
	embs := lines[0]["embeddings"].([]any)
	var got []float64
	for _, x := range embs[0].([]any) {
		got = append(got, x.(float64))
	}
	close("/api/embed", got, first)
	status, _, lines = ollamaPost(t, ts.url, "/api/embeddings", `{"model":"kiln-test","prompt":"The sea is deep."}`)
	got = got[:0]
	for _, x := range lines[0]["embedding"].([]any) {
		got = append(got, x.(float64))
	}
	close("/api/embeddings", got, first)

	long := strings.Repeat("word ", 400) // over sentence_bert_config's 256 tokens
	for _, c := range []struct{ path, body, param string }{
		{"/v1/embeddings", `{"input":"hi","dimensions":0}`, "dimensions"},
		{"/v1/embeddings", `{"input":"hi","dimensions":65}`, "dimensions"},
		{"/v1/embeddings", `{"input":""}`, "input"},
		{"/v1/embeddings", `{"input":[]}`, "input"},
		{"/v1/embeddings", `{"input":{"a":1}}`, "input"},
		{"/v1/embeddings", `{"input":"` + long + `"}`, "input"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, "model"},
	} {
		status, v := rawPost(t, ts.url, c.path, "application/json", []byte(c.body))
		e, _ := v["error"].(map[string]any)
		if status != 400 || e == nil || c.param != "" && e["param"] != c.param {
			t.Errorf("%s %s: %d %v", c.path, c.body, status, v)
		}
	}
	if status, _, lines := ollamaPost(t, ts.url, "/api/embed", `{"input":"`+long+`"}`); status != 200 || len(lines[0]["embeddings"].([]any)) != 1 {
		t.Errorf("/api/embed truncates by default: %d %v", status, lines)
	}
	if status, _, _ := ollamaPost(t, ts.url, "/api/embed", `{"input":"`+long+`","truncate":false}`); status != 400 {
		t.Errorf("/api/embed truncate false: %d", status)
	}

	chat := startServer(t, Options{}, engine.Options{})
	status, v = rawPost(t, chat.url, "/v1/embeddings", "application/json", []byte(`{"input":"hi"}`))
	if e, _ := v["error"].(map[string]any); status != 400 || e == nil || !strings.Contains(e["message"].(string), "not an embedding model") {
		t.Errorf("embeddings of a chat model: %d %v", status, v)
	}
	if status, _, lines := ollamaPost(t, chat.url, "/api/embed", `{"input":"hi"}`); status != 400 || lines[0]["error"] == nil {
		t.Errorf("/api/embed of a chat model: %d %v", status, lines)
	}
}
