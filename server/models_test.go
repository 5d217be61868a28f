package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kiln-llm/kiln/catalog"
	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/hub"
	"github.com/kiln-llm/kiln/internal/hubtest"
	"github.com/kiln-llm/kiln/internal/ollamatest"
	"github.com/kiln-llm/kiln/ollama"
)

// testCatalog is a catalog over the test hub, an empty hub cache and an
// Ollama store holding qwen3:8b.
func testCatalog(t *testing.T) (*catalog.Catalog, string) {
	t.Helper()
	h := hubtest.StartModels(t)
	store := t.TempDir()
	if _, err := ollamatest.Add(store, "qwen3:8b", hubtest.Fixture(t, "qwen3-w256-Q4_K_M.gguf")); err != nil {
		t.Fatal(err)
	}
	return &catalog.Catalog{Hub: &hub.Client{Endpoint: h.URL(), Cache: hub.Cache{Dir: t.TempDir()}, RetryWait: time.Millisecond},
		Ollama: ollama.Store{Dir: store}}, store
}

func ollamaDo(t *testing.T, method, url, body string) (int, []map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []map[string]any
	dec := json.NewDecoder(resp.Body)
	for {
		var v map[string]any
		if err := dec.Decode(&v); err != nil {
			break
		}
		out = append(out, v)
	}
	return resp.StatusCode, out
}

// TestOllamaModels drives /api/pull, /api/tags, /api/show and /api/delete
// against a catalog of the test hub and an Ollama store.
func TestOllamaModels(t *testing.T) {
	cat, _ := testCatalog(t)
	ts := startServer(t, Options{Models: cat}, engine.Options{})

	// A streamed pull: Ollama's progress objects, then success.
	status, lines := ollamaDo(t, "POST", ts.url+"/api/pull", `{"model":"kiln-test/qwen3-w256-GGUF:Q8_0"}`)
	if status != 200 || len(lines) < 4 || lines[0]["status"] != "pulling manifest" || lines[len(lines)-1]["status"] != "success" {
		t.Fatalf("pull: %d %v", status, lines)
	}
	var sawBytes bool
	for _, l := range lines {
		if l["status"] == "pulling qwen3-w256-Q8_0.gguf" && l["completed"] == l["total"] && strings.HasPrefix(l["digest"].(string), "sha256:") {
			sawBytes = true
		}
	}
	if !sawBytes {
		t.Errorf("no completed progress for the file: %v", lines)
	}
	if status, lines := ollamaDo(t, "POST", ts.url+"/api/pull", `{"model":"kiln-test/tiny-qwen3","stream":false}`); status != 200 || len(lines) != 1 || lines[0]["status"] != "success" {
		t.Errorf("pull, not streamed: %d %v", status, lines)
	}
	for body, want := range map[string]string{
		`{"model":"kiln-test/absent","stream":false}`: "was not found on",
		`{"model":"qwen3:8b","stream":false}`:         "is an Ollama name",
		`{"model":"../../etc","stream":false}`:        "want ORG/NAME",
	} {
		status, lines := ollamaDo(t, "POST", ts.url+"/api/pull", body)
		if status < 400 || len(lines) != 1 || !strings.Contains(lines[0]["error"].(string), want) {
			t.Errorf("pull %s: %d %v, want %q", body, status, lines, want)
		}
	}
	status, lines = ollamaDo(t, "POST", ts.url+"/api/pull", `{"model":"kiln-test/absent"}`)
	if status != 200 || len(lines) != 2 || !strings.Contains(lines[1]["error"].(string), "not found") {
		t.Errorf("streamed pull of a missing model: %d %v", status, lines)
	}

	// The tags: the served model first, then the hub cache's, then Ollama's,
	// with real sizes and digests.
	status, lines = ollamaDo(t, "GET", ts.url+"/api/tags", "")
	if status != 200 || len(lines) != 1 {
		t.Fatalf("tags: %d %v", status, lines)
	}
	var names []string
	byName := map[string]map[string]any{}
	for _, m := range lines[0]["models"].([]any) {
		m := m.(map[string]any)
		names = append(names, m["name"].(string))
		byName[m["name"].(string)] = m
	}
	if strings.Join(names, " ") != testModel+":latest kiln-test/qwen3-w256-GGUF:Q8_0 kiln-test/tiny-qwen3:latest qwen3:8b" {
		t.Errorf("tags: %q", names)
	}
	q8 := hubtest.Fixture(t, "qwen3-w256-Q8_0.gguf")
	if m := byName["kiln-test/qwen3-w256-GGUF:Q8_0"]; m["size"] != float64(len(q8)) || m["digest"] != hubtest.SHA256(q8) ||
		m["details"].(map[string]any)["quantization_level"] != "Q8_0" || m["details"].(map[string]any)["family"] != "qwen3" {
		t.Errorf("the GGUF's tag: %v", m)
	}
	om, err := cat.Find("qwen3:8b")
	if err != nil {
		t.Fatal(err)
	}
	if m := byName["qwen3:8b"]; m["size"] != float64(om.Size) || m["digest"] != om.Digest || m["details"].(map[string]any)["format"] != "gguf" {
		t.Errorf("Ollama's model's tag: %v", m)
	}

	// Show any of them.
	status, lines = ollamaDo(t, "POST", ts.url+"/api/show", `{"model":"kiln-test/tiny-qwen3:latest"}`)
	if status != 200 || lines[0]["model_info"].(map[string]any)["qwen3.context_length"] != float64(4096) ||
		lines[0]["model_info"].(map[string]any)["general.parameter_count"].(float64) < 1000 || !strings.Contains(lines[0]["template"].(string), "im_start") {
		t.Errorf("show: %d %v", status, lines)
	}
	if status, lines := ollamaDo(t, "POST", ts.url+"/api/show", `{"model":"/etc/passwd"}`); status != 400 || !strings.Contains(lines[0]["error"].(string), "is a path") {
		t.Errorf("show of a path: %d %v", status, lines)
	}
	if status, lines := ollamaDo(t, "POST", ts.url+"/api/show", `{"model":"qwen3:32b"}`); status != 404 || lines[0]["error"] == nil {
		t.Errorf("show of a missing model: %d %v", status, lines)
	}

	// Delete: the hub cache's models go, the served one and Ollama's stay.
	for _, tc := range []struct {
		body string
		want int
	}{
		{`{"model":"` + testModel + `"}`, http.StatusConflict},
		{`{"model":"qwen3:8b"}`, http.StatusBadRequest},
		{`{"model":"kiln-test/absent"}`, http.StatusNotFound},
		{`{"model":"kiln-test/qwen3-w256-GGUF:Q8_0"}`, http.StatusOK},
		{`{"model":"kiln-test/qwen3-w256-GGUF:Q8_0"}`, http.StatusNotFound},
	} {
		status, lines := ollamaDo(t, "DELETE", ts.url+"/api/delete", tc.body)
		if status != tc.want || status != 200 && (len(lines) != 1 || lines[0]["error"] == nil) {
			t.Errorf("delete %s: %d %v, want %d", tc.body, status, lines, tc.want)
		}
	}
	if _, err := cat.Find("qwen3:8b"); err != nil {
		t.Errorf("Ollama's model after the deletes: %v", err)
	}
}

// TestOllamaErrorShape: every /api/ route answers errors as Ollama does,
// {"error": "..."}, whatever goes wrong.
func TestOllamaErrorShape(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/api/nothing", ""},
		{"GET", "/api/pull", ""},
		{"POST", "/api/delete", `{"model":"x"}`},
		{"POST", "/api/pull", `{"model":"kiln-test/demo"}`}, // no store
		{"POST", "/api/show", `{`},
		{"PUT", "/api/chat", `{}`},
	} {
		status, lines := ollamaDo(t, tc.method, ts.url+tc.path, tc.body)
		if status < 400 || len(lines) != 1 {
			t.Errorf("%s %s: %d %v", tc.method, tc.path, status, lines)
			continue
		}
		if msg, ok := lines[0]["error"].(string); !ok || msg == "" {
			t.Errorf("%s %s: %v is not Ollama's error shape", tc.method, tc.path, lines[0])
		}
	}
	// The OpenAI routes keep OpenAI's shape.
	if _, lines := ollamaDo(t, "GET", ts.url+"/v1/nothing", ""); len(lines) != 1 || lines[0]["error"].(map[string]any)["message"] == nil {
		t.Errorf("/v1/nothing: %v", lines)
	}
}
