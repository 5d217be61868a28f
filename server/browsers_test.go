package server

import (
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/engine"
)

// A page cannot drive the server: a Host that is not a name of this
// machine (DNS rebinding) is refused unless allowed or an API key guards
// the server, and a POST from a page of another origin must be JSON (a
// text/plain one needs no preflight). Clients that are not browsers, and
// the Unix socket, are untouched.
func TestBrowserGuard(t *testing.T) {
	ts := startServer(t, Options{AllowedHosts: []string{"*.lan", "kiln.example.com"}}, engine.Options{})
	port := ts.url[strings.LastIndexByte(ts.url, ':'):]
	hostname, _ := os.Hostname()
	do := func(c *http.Client, method, host, contentType string, header map[string]string) (int, string) {
		t.Helper()
		var body *strings.Reader
		if method == "POST" {
			body = strings.NewReader(`{"prompt": "hi", "max_tokens": 1}`)
		} else {
			body = strings.NewReader("")
		}
		path := "/status"
		if method == "POST" {
			path = "/v1/completions"
		}
		req, _ := http.NewRequest(method, ts.url+path, body)
		req.Host = host
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 512)
		n, _ := resp.Body.Read(buf)
		b.Write(buf[:n])
		return resp.StatusCode, b.String()
	}
	tcp := http.DefaultClient
	for _, host := range []string{"127.0.0.1" + port, "localhost" + port, "[::1]" + port, "app.localhost" + port, "192.168.1.20" + port,
		hostname + port, "box.lan" + port, "KILN.example.com", ""} {
		if status, body := do(tcp, "GET", host, "", nil); status != 200 {
			t.Errorf("Host %q: %d %s", host, status, body)
		}
	}
	for _, host := range []string{"attacker.example" + port, "attacker.example", "localhost.attacker.example", "lan" + port} {
		if status, body := do(tcp, "GET", host, "", nil); status != 403 || !strings.Contains(body, "host_not_allowed") {
			t.Errorf("Host %q: %d %s", host, status, body)
		}
		if status, _ := do(unixHTTP(ts.sock), "GET", host, "", nil); status != 200 {
			t.Errorf("Host %q on the Unix socket: %d", host, status)
		}
	}
	self := "127.0.0.1" + port
	for _, c := range []struct {
		contentType string
		header      map[string]string
		status      int
	}{
		{"text/plain", map[string]string{"Origin": "http://evil.example"}, 403},
		{"application/x-www-form-urlencoded", map[string]string{"Origin": "null"}, 403},
		{"text/plain;charset=UTF-8", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"multipart/form-data; boundary=x", map[string]string{"Origin": "http://localhost:3000"}, 403},
		{"application/json", map[string]string{"Origin": "http://localhost:3000"}, 200},             // after a preflight: CORS's to allow
		{"application/json; charset=utf-8", map[string]string{"Sec-Fetch-Site": "cross-site"}, 200}, // the same
		{"text/plain", map[string]string{"Origin": "http://" + self, "Sec-Fetch-Site": "same-origin"}, 200},
		{"application/x-www-form-urlencoded", nil, 200}, // curl -d
		{"", nil, 200},
	} {
		if status, body := do(tcp, "POST", self, c.contentType, c.header); status != c.status {
			t.Errorf("POST %q %v: %d %s, want %d", c.contentType, c.header, status, body, c.status)
		}
	}
	keyed := startServer(t, Options{APIKey: "sekret"}, engine.Options{})
	req, _ := http.NewRequest("GET", keyed.url+"/status", nil)
	req.Host = "attacker.example"
	req.Header.Set("Authorization", "Bearer sekret")
	resp, err := tcp.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("a server with an API key refused Host attacker.example: %d", resp.StatusCode)
	}
	if err := CheckHosts([]string{"kiln.example.com", "*.lan", "*"}); err != nil {
		t.Error(err)
	}
	for _, bad := range []string{"", "http://x", "x:80", "[x"} {
		if CheckHosts([]string{bad}) == nil {
			t.Errorf("host pattern %q accepted", bad)
		}
	}
}
