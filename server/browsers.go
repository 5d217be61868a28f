package server

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"strings"
)

// Browsers reach a server on this machine too. Any page can send requests
// to 127.0.0.1, and by DNS rebinding read the answers: its host name, made
// to resolve to 127.0.0.1, makes the page and the server one origin for
// the browser, so CORS never applies (and the Host header stays the
// page's name). A page can also send a POST without asking first (CORS's
// preflight) when its body is text/plain or a form.
//
// guardBrowsers refuses both: a request whose Host is not a name of this
// machine (loopback names, an IP address, the host name, or
// Options.AllowedHosts), unless an API key guards the server (a page has
// no key), and a POST, PUT or DELETE from a page of another origin that is
// not JSON. Clients that are not browsers send no Origin or Sec-Fetch-Site
// and may POST with any content type (curl -d sends a form's). It stands
// before CORS (cors.go) and authentication, and Unix-socket requests skip
// it: no page reaches a socket.
func (s *Server) guardBrowsers(next http.Handler) http.Handler {
	hostname, _ := os.Hostname()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if trusted, _ := r.Context().Value(trustedConn{}).(bool); trusted {
			next.ServeHTTP(w, r)
			return
		}
		if s.opts.APIKey == "" && !s.hostAllowed(r.Host, hostname) {
			writeErrorFor(w, r, newAPIError(http.StatusForbidden, "invalid_request_error", "host_not_allowed", "",
				"Host %q is not a name of this server; start it with --allowed-hosts %s to answer to it", r.Host, hostOnly(r.Host)))
			return
		}
		switch r.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
			if crossOrigin(r) && !isJSON(r.Header.Get("Content-Type")) {
				writeErrorFor(w, r, newAPIError(http.StatusForbidden, "invalid_request_error", "content_type_not_allowed", "",
					"a browser page of another origin must send Content-Type: application/json, not %q", r.Header.Get("Content-Type")))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// hostOnly is a Host header without its port.
func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return strings.Trim(hostport, "[]")
}

// hostAllowed reports whether a Host header names this server: an IP
// address (a page's origin is then that address, never a rebound name),
// localhost or a subdomain of it, the machine's host name (whole or its
// first label), or an allowed host (patterns with *).
func (s *Server) hostAllowed(hostport, hostname string) bool {
	host := strings.ToLower(strings.TrimSuffix(hostOnly(hostport), "."))
	if host == "" || net.ParseIP(host) != nil || host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	if hostname = strings.ToLower(hostname); hostname != "" && (host == hostname || host == strings.Split(hostname, ".")[0]) {
		return true
	}
	for _, p := range s.opts.AllowedHosts {
		if ok, _ := path.Match(strings.ToLower(p), host); ok || p == "*" {
			return true
		}
	}
	return false
}

// CheckHosts checks patterns for Options.AllowedHosts.
func CheckHosts(patterns []string) error {
	for _, p := range patterns {
		if _, err := path.Match(p, ""); err != nil || p == "" || strings.ContainsAny(p, "/:") {
			return fmt.Errorf("host pattern %q: want a host name such as kiln.example.com, with * for any part", p)
		}
	}
	return nil
}

// crossOrigin reports whether r comes from a browser page of another
// origin than the server's: its Origin names another host (or is "null",
// a sandboxed page or a file), or the browser says so (Sec-Fetch-Site).
func crossOrigin(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "cross-site", "same-site":
		return true
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		return false
	}
	u, err := url.Parse(origin)
	return err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host)
}

// isJSON reports whether a Content-Type is JSON (application/json, or a
// +json type), which a page can send to another origin only after a
// preflight.
func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}
