// Package server serves a session (package session) over HTTP: the OpenAI API
// (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models),
// Ollama's API (/api/chat, /api/generate, /api/embed, /api/embeddings,
// /api/tags, /api/ps, /api/show, /api/pull, /api/delete, /api/version),
// /health, /status and /metrics (Prometheus), on TCP listeners and on
// owner-only Unix sockets.
//
// No request names a path: the model is loaded before the server starts,
// and Ollama's model routes reach only the model stores (ModelStore).
package server

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"reflect"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/kiln-llm/kiln/catalog"
	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/session"
)

// Options configures a Server. The zero value of each field has a usable
// default.
type Options struct {
	// ModelName is the id clients send as "model" ("" and the Ollama form
	// "NAME:latest" are accepted too); others get 404.
	ModelName string
	// APIKey, when set, is required as "Authorization: Bearer KEY" on every
	// route except /health, on TCP listeners. Unix-socket clients are
	// authenticated by their uid instead.
	APIKey string
	// Defaults are the sampling parameters of fields a request leaves out
	// (the model's generation_config); a request's own values win.
	Defaults engine.Sampling
	// TokenText returns the text of one token, for logprobs. Nil shows
	// tokens as "token_id:N".
	TokenText func(id int32) string
	// Info is extra key/value information /status reports (model
	// directory, backend).
	Info map[string]string
	// Models, when set, is the machine's models: /api/tags lists them (the
	// served one first), /api/show describes any, /api/pull downloads into
	// the Hugging Face cache and /api/delete removes from it. Without it
	// those routes know only the served model.
	Models ModelStore
	// AllowedOrigins are the browser origins allowed to call the API
	// (CORS) beyond this machine's pages (http(s)://localhost,
	// 127.0.0.1, [::1], any port) and local apps' (app://, file://,
	// tauri://, vscode-webview://): origins such as
	// https://chat.example.com, * matching any part of one
	// (https://*.example.com), or "*" for every origin. See CheckOrigins.
	AllowedOrigins []string
	// AllowedHosts are the names, beyond this machine's (localhost, its
	// IP addresses and host name), that a server without an API key
	// answers to in the Host header: names such as kiln.example.com, *
	// matching any part of one, or "*" for every name. See guardBrowsers
	// and CheckHosts.
	AllowedHosts []string
	// Served is the served model's catalog entry (nil: the embedded demo
	// model), for its size, digest and details.
	Served *catalog.Model

	MaxBodyBytes   int64         // default DefaultMaxBody
	RequestTimeout time.Duration // one generation, submission to end; default 10 min
	// WriteTimeout is how long a stream's client may take nothing of it
	// while bytes wait for it (or one write may block) before the stream
	// is cancelled and its sequence freed; default 10 s.
	WriteTimeout time.Duration
	Logger       *slog.Logger // default slog.Default()
}

// Server is an HTTP front end of one session and its engine. Create it
// with New, call Serve for each listener, and Shutdown to drain.
type Server struct {
	sess    *session.Session
	prep    *prepGate
	opts    Options
	log     *slog.Logger
	metrics *serverMetrics
	hs      *http.Server
	handler http.Handler
	started time.Time
	// Recent chat bodies, so that a follow-up decodes only what it adds
	// to one of them (resume.go).
	chats       *resumable[chatRequest, wireMessage]
	ollamaChats *resumable[ollamaChatRequest, ollamaMessage]

	draining  atomic.Bool
	inFlight  atomic.Int64
	baseCtx   context.Context
	cancelAll context.CancelCauseFunc
}

// New returns a server for sess.
func New(sess *session.Session, opts Options) *Server {
	if opts.MaxBodyBytes <= 0 {
		opts.MaxBodyBytes = DefaultMaxBody(sess)
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = 10 * time.Minute
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{sess: sess, prep: newPrepGate(prepSlots()), opts: opts, log: opts.Logger, started: time.Now(), metrics: newServerMetrics(opts.ModelName, sess.Engine()),
		chats:       newResumable(func(r *chatRequest) *[]wireMessage { return &r.Messages }),
		ollamaChats: newResumable(func(r *ollamaChatRequest) *[]ollamaMessage { return &r.Messages })}
	s.baseCtx, s.cancelAll = context.WithCancelCause(context.Background())
	s.handler = s.routes()
	s.hs = &http.Server{
		Handler: s.handler,
		// No ReadTimeout or WriteTimeout: net/http keeps a read deadline
		// armed while the handler runs, and its expiry cancels the request's
		// context, which would cut off generations that outlast it. Bodies
		// get their own deadline (decodeBody) and streamed writes theirs
		// (streamWriter).
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		BaseContext:       func(net.Listener) context.Context { return s.baseCtx },
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if c.LocalAddr().Network() == "unix" {
				ctx = context.WithValue(ctx, trustedConn{}, true)
			}
			if cc, ok := c.(*countingConn); ok {
				ctx = context.WithValue(ctx, connKey{}, cc)
			}
			return ctx
		},
		ErrorLog: slog.NewLogLogger(opts.Logger.Handler(), slog.LevelWarn),
	}
	return s
}

// trustedConn marks a request context whose connection came through a Unix
// socket, whose peer uid was checked (see ListenUnix).
type trustedConn struct{}

// Handler returns the server's routes, with authentication, request logging
// and panic recovery. Requests through it count as TCP requests.
func (s *Server) Handler() http.Handler { return s.handler }

// Serve accepts connections on l until Shutdown; it returns nil after a
// Shutdown and the accept error otherwise.
func (s *Server) Serve(l net.Listener) error {
	err := s.hs.Serve(countingListener{l})
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Shutdown drains the server: listeners close and new requests get 503 at
// once, in-flight requests run to completion until ctx is done, then the
// rest are cancelled (their sequences freed) and their connections closed.
// It returns an error only when requests had to be cancelled.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	err := s.hs.Shutdown(ctx)
	if err == nil {
		return nil
	}
	n := s.inFlight.Load()
	s.cancelAll(errDraining) // what the cancelled clients are told
	// Cancelled handlers finish within a decode step or two.
	grace, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.hs.Shutdown(grace); err != nil {
		s.hs.Close()
	}
	return fmt.Errorf("drain timed out: cancelled %d in-flight requests", n)
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	route := func(method, path string, h http.HandlerFunc) {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
				w.Header().Set("Allow", method)
				writeErrorFor(w, r, newAPIError(http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "",
					"%s %s is not supported; use %s", r.Method, r.URL.Path, method))
				return
			}
			h(w, r)
		})
	}
	route("GET", "/health", s.health)
	route("GET", "/status", s.status)
	route("GET", "/metrics", s.metricsPage)
	route("GET", "/v1/models", s.listModels)
	route("GET", "/v1/models/{id...}", s.getModel)
	route("POST", "/v1/chat/completions", s.openAI(s.chatCompletions))
	route("POST", "/v1/completions", s.openAI(s.completions))
	route("POST", "/v1/embeddings", s.openAI(s.embeddings))
	route("GET", "/api/tags", s.ollamaTags)
	route("GET", "/api/ps", s.ollamaPs)
	route("GET", "/api/version", s.ollamaVersion)
	route("POST", "/api/show", s.ollama(s.ollamaShow))
	route("POST", "/api/chat", s.ollama(s.ollamaChat))
	route("POST", "/api/generate", s.ollama(s.ollamaGenerate))
	route("POST", "/api/embed", s.ollama(s.ollamaEmbed(false)))
	route("POST", "/api/embeddings", s.ollama(s.ollamaEmbed(true)))
	route("POST", "/api/pull", s.ollama(s.ollamaPull))
	route("DELETE", "/api/delete", s.ollama(s.ollamaDelete))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeErrorFor(w, r, notFound("unknown_url", "unknown route %s %s", r.Method, r.URL.Path))
	})
	return s.logged(s.recovered(s.guardBrowsers(s.cors(s.authorized(mux)))))
}

// openAI adapts a handler that returns its error to OpenAI's error shape.
func (s *Server) openAI(h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return s.generation(h, writeOpenAIError)
}

// ollama adapts a handler that returns its error to Ollama's error shape.
func (s *Server) ollama(h func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return s.generation(h, writeOllamaError)
}

func (s *Server) generation(h func(http.ResponseWriter, *http.Request) error, writeErr func(http.ResponseWriter, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.draining.Load() {
			w.Header().Set("Connection", "close")
			writeErr(w, errDraining)
			return
		}
		s.inFlight.Add(1)
		defer s.inFlight.Add(-1)
		r, release := s.withPrepSlot(r)
		defer release()
		err := h(w, r)
		if errors.Is(err, errClientWrite) {
			// The client is gone or stopped reading: what is left to
			// write must not wait for it, and the connection closes.
			http.NewResponseController(w).SetWriteDeadline(time.Now())
			level := slog.LevelDebug
			if errors.Is(err, errNotReading) {
				level = slog.LevelInfo
			}
			s.log.Log(r.Context(), level, "stream cancelled", "path", r.URL.Path, "err", err)
			return
		}
		// A streamed response leaves a write deadline on the connection;
		// the next request on it must not inherit it.
		http.NewResponseController(w).SetWriteDeadline(time.Time{})
		if err != nil {
			if hw, ok := w.(*statusWriter); ok && hw.wrote {
				// Mid-stream: the handler already reported it in-band.
				s.log.Debug("request ended with an error after the response started", "path", r.URL.Path, "err", err)
				return
			}
			writeErr(w, err)
		}
	}
}

func (s *Server) authorized(next http.Handler) http.Handler {
	if s.opts.APIKey == "" {
		return next
	}
	want := []byte("Bearer " + s.opts.APIKey)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		trusted, _ := r.Context().Value(trustedConn{}).(bool)
		if trusted || r.URL.Path == "/health" {
			next.ServeHTTP(w, r)
			return
		}
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="kiln"`)
			msg := "missing API key: send 'Authorization: Bearer <key>'"
			if len(got) > 0 {
				msg = "incorrect API key provided"
			}
			writeErrorFor(w, r, newAPIError(http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "", "%s", msg))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) recovered(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("panic serving a request", "path", r.URL.Path, "panic", v)
				if sw, ok := w.(*statusWriter); !ok || !sw.wrote {
					writeErrorFor(w, r, newAPIError(http.StatusInternalServerError, "server_error", "", "", "internal server error"))
				}
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// statusWriter records what a handler wrote, for the request log and to
// know whether an error can still be sent as a status.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
	wrote  bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.status, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.status, w.wrote = http.StatusOK, true
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

// Unwrap lets http.ResponseController reach Flush and SetWriteDeadline.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) logged(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		level := slog.LevelInfo
		if r.URL.Path == "/health" || r.URL.Path == "/metrics" {
			level = slog.LevelDebug
		}
		s.log.Log(r.Context(), level, "request", "method", r.Method, "path", r.URL.Path, "status", sw.status,
			"bytes", sw.bytes, "dur", time.Since(start).Round(time.Microsecond), "remote", r.RemoteAddr)
	})
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "draining"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// Status is the body of GET /status.
type Status struct {
	Model    string            `json:"model"`
	PID      int               `json:"pid"`
	UptimeS  float64           `json:"uptime_s"`
	InFlight int64             `json:"in_flight"`
	Draining bool              `json:"draining"`
	Stats    EngineStats       `json:"stats"`
	Info     map[string]string `json:"info,omitempty"`
	// Conversations are those the engine's caches keep (most recently used
	// first), with the memory each takes; Stored the prefixes its state
	// cache holds.
	Conversations []ConversationStatus `json:"conversations"`
	Stored        []StoredStatus       `json:"stored,omitempty"`
}

// ConversationStatus is one conversation's latest computed past in the
// engine (engine.Conversation).
type ConversationStatus struct {
	Tokens      int     `json:"tokens"`
	DeviceBytes int64   `json:"device_bytes"` // its KV blocks, those it shares included, and a device state slot
	HostBytes   int64   `json:"host_bytes"`   // its state in host memory
	Stored      bool    `json:"stored"`       // the state cache holds it too
	IdleS       float64 `json:"idle_s"`
}

// StoredStatus is a prefix the state cache holds (kvcache.StoredPrefix).
type StoredStatus struct {
	Tokens int   `json:"tokens"`
	Bytes  int64 `json:"bytes"` // its entries, shared chunks included
	State  bool  `json:"state"`
	InRAM  bool  `json:"in_ram"`
	OnDisk bool  `json:"on_disk"`
}

// EngineStats is engine.Stats as /status reports it: with snake_case keys
// (kv_blocks_used), as everywhere else in the API, and durations in seconds
// under a key ending in _s (step_time_s), as uptime_s; engine.Stats has no
// JSON tags, and its Go field names leaked onto the wire.
type EngineStats engine.Stats

var durationType = reflect.TypeFor[time.Duration]()

// statsKey is the wire key of field f.
func statsKey(f reflect.StructField) string {
	if f.Type == durationType {
		return snakeCase(f.Name) + "_s"
	}
	return snakeCase(f.Name)
}

// MarshalJSON writes every field under its wire key.
func (s EngineStats) MarshalJSON() ([]byte, error) {
	v := reflect.ValueOf(s)
	m := make(map[string]any, v.NumField())
	for i := range v.NumField() {
		f := v.Type().Field(i)
		if f.Type == durationType {
			m[statsKey(f)] = time.Duration(v.Field(i).Int()).Seconds()
		} else {
			m[statsKey(f)] = v.Field(i).Interface()
		}
	}
	return json.Marshal(m)
}

// UnmarshalJSON reads what MarshalJSON writes.
func (s *EngineStats) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	v := reflect.ValueOf(s).Elem()
	for i := range v.NumField() {
		f := v.Type().Field(i)
		name := statsKey(f)
		raw, ok := m[name]
		if !ok {
			continue
		}
		if f.Type == durationType {
			var sec float64
			if err := json.Unmarshal(raw, &sec); err != nil {
				return fmt.Errorf("stats.%s: %w", name, err)
			}
			v.Field(i).SetInt(int64(sec * float64(time.Second)))
		} else if err := json.Unmarshal(raw, v.Field(i).Addr().Interface()); err != nil {
			return fmt.Errorf("stats.%s: %w", name, err)
		}
	}
	return nil
}

// snakeCase turns a Go field name into its JSON key: KVBlocksUsed is
// kv_blocks_used (an initialism is one word).
func snakeCase(name string) string {
	r := []rune(name)
	var b strings.Builder
	for i, c := range r {
		if i > 0 && unicode.IsUpper(c) && (unicode.IsLower(r[i-1]) || i+1 < len(r) && unicode.IsLower(r[i+1])) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}

func (s *Server) status(w http.ResponseWriter, r *http.Request) {
	st := Status{
		Model:         s.opts.ModelName,
		PID:           os.Getpid(),
		UptimeS:       time.Since(s.started).Seconds(),
		InFlight:      s.inFlight.Load(),
		Draining:      s.draining.Load(),
		Stats:         EngineStats(s.sess.Engine().Stats()),
		Info:          s.opts.Info,
		Conversations: []ConversationStatus{},
	}
	convs, stored := s.sess.Engine().Conversations()
	for _, c := range convs {
		st.Conversations = append(st.Conversations, ConversationStatus{Tokens: c.Tokens, DeviceBytes: c.DeviceBytes,
			HostBytes: c.HostBytes, Stored: c.Stored, IdleS: c.Idle.Seconds()})
	}
	for _, p := range stored {
		st.Stored = append(st.Stored, StoredStatus{Tokens: p.Tokens, Bytes: p.Bytes, State: p.State, InRAM: p.InRAM, OnDisk: p.OnDisk})
	}
	writeJSON(w, http.StatusOK, st)
}

// contextLength is the most tokens one request may hold, prompt and
// answer, as /v1/models, /api/show and /api/ps report it: the engine's
// context, bounded by what its KV cache holds for one sequence.
func (s *Server) contextLength() int {
	n, _ := s.sess.Engine().Context()
	return n
}

// checkModel accepts the loaded model's name, "" and Ollama's "NAME:latest"
// (either way round).
func (s *Server) checkModel(name string) error {
	if name == "" || strings.TrimSuffix(name, ":latest") == strings.TrimSuffix(s.opts.ModelName, ":latest") {
		return nil
	}
	return notFound("model_not_found", "the model %q does not exist; this server serves %q", name, s.opts.ModelName)
}
