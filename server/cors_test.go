package server

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/engine"
)

// Browsers: pages of this machine and of the allowed origins get CORS
// headers and their preflights answered (before authentication, which a
// preflight cannot carry); other origins get 403, even for the POSTs a page
// may send without a preflight; clients without an Origin are untouched.
func TestCORS(t *testing.T) {
	ts := startServer(t, Options{APIKey: "sekret", AllowedOrigins: []string{"https://*.example.com"}}, engine.Options{})
	do := func(method, path, origin string, header map[string]string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(method, ts.url+path, strings.NewReader(`{"prompt": "hi", "max_tokens": 2}`))
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	preflight := map[string]string{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}
	for _, origin := range []string{"http://localhost:3000", "http://127.0.0.1:5173", "https://chat.example.com", "vscode-webview://abc"} {
		resp := do("OPTIONS", "/v1/completions", origin, preflight)
		h := resp.Header
		if resp.StatusCode != 204 || h.Get("Access-Control-Allow-Origin") != origin || !strings.Contains(h.Get("Access-Control-Allow-Methods"), "POST") ||
			h.Get("Access-Control-Allow-Headers") != "authorization, content-type" {
			t.Errorf("preflight from %s: %d %v", origin, resp.StatusCode, h)
		}
		resp = do("POST", "/v1/completions", origin, map[string]string{"Authorization": "Bearer sekret", "Content-Type": "application/json"})
		if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != origin || !strings.Contains(resp.Header.Get("Vary"), "Origin") {
			t.Errorf("POST from %s: %d %v", origin, resp.StatusCode, resp.Header)
		}
	}
	for _, origin := range []string{"https://evil.example.org", "http://example.com", "null"} {
		for _, req := range []struct {
			method string
			header map[string]string
		}{{"OPTIONS", preflight}, {"POST", map[string]string{"Content-Type": "text/plain", "Authorization": "Bearer sekret"}}} {
			if resp := do(req.method, "/v1/completions", origin, req.header); resp.StatusCode != 403 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
				t.Errorf("%s from %s: %d %v", req.method, origin, resp.StatusCode, resp.Header)
			}
		}
	}
	if resp := do("POST", "/v1/completions", "", map[string]string{"Authorization": "Bearer sekret"}); resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("no Origin: %d %v", resp.StatusCode, resp.Header)
	}
	if err := CheckOrigins([]string{"https://[x"}); err == nil {
		t.Error("a bad pattern accepted")
	}
}
