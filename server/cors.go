package server

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"path"
)

// defaultOrigins are the browser origins every server allows, as Ollama's
// do: pages served from this machine, and the local apps (Electron, Tauri,
// VS Code webviews) whose pages have origins of their own.
var defaultOrigins = []string{"app://*", "file://*", "tauri://*", "vscode-webview://*"}

// CheckOrigins checks patterns for Options.AllowedOrigins.
func CheckOrigins(patterns []string) error {
	for _, p := range patterns {
		if _, err := path.Match(p, ""); err != nil || p == "" {
			return fmt.Errorf("origin pattern %q: want an origin such as https://app.example.com, with * for any part", p)
		}
	}
	return nil
}

// originAllowed reports whether a browser page of origin may call the API.
func (s *Server) originAllowed(origin string) bool {
	if u, err := url.Parse(origin); err == nil && (u.Scheme == "http" || u.Scheme == "https") {
		host := u.Hostname()
		if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
			return true
		}
	}
	for _, p := range append(defaultOrigins, s.opts.AllowedOrigins...) {
		if ok, _ := path.Match(p, origin); ok || p == "*" {
			return true
		}
	}
	return false
}

// cors answers browsers (CORS): a request with an Origin header from an
// allowed origin gets Access-Control-Allow-Origin, and its preflight
// (OPTIONS with Access-Control-Request-Method) the methods and headers it
// asks for; any request from another origin is refused with 403, since a
// page can send some POSTs (text/plain bodies) without a preflight.
// Requests without an Origin (every non-browser client) pass untouched.
func (s *Server) cors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if origin == "" {
			next.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		h.Add("Vary", "Origin")
		if !s.originAllowed(origin) {
			writeErrorFor(w, r, newAPIError(http.StatusForbidden, "invalid_request_error", "origin_not_allowed", "",
				"browser origin %s is not allowed: start the server with --allowed-origins %s", origin, origin))
			return
		}
		h.Set("Access-Control-Allow-Origin", origin)
		if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
			next.ServeHTTP(w, r)
			return
		}
		h.Add("Vary", "Access-Control-Request-Method, Access-Control-Request-Headers")
		h.Set("Access-Control-Allow-Methods", "GET, HEAD, POST, DELETE, OPTIONS")
		if want := r.Header.Get("Access-Control-Request-Headers"); want != "" {
			h.Set("Access-Control-Allow-Headers", want)
		}
		h.Set("Access-Control-Max-Age", "86400")
		w.WriteHeader(http.StatusNoContent)
	})
}
