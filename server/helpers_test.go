package server

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/internal/testmodel"
	"github.com/kiln-llm/kiln/session"
	"github.com/kiln-llm/kiln/tokenizer"
)

// The tests serve the tiny Qwen3 fixture (a real model trained by
// scripts/make_fixtures.py) with Qwen3's real chat template, so that tools
// and thinking render as they do for hub models.
const testModel = "kiln-test"

// newSession starts an engine and a session on a loaded model.
func newSession(t testing.TB, f testmodel.Fixture, opts engine.Options) (*session.Session, *tokenizer.Tokenizer) {
	t.Helper()
	opts.Logger = testmodel.Logger()
	e, err := engine.New(f.Model, f.Tok, opts)
	if err != nil {
		t.Fatal(err)
	}
	s := session.New(e, f.Tok, f.Tmpl, session.Options{Logger: opts.Logger})
	t.Cleanup(func() { s.Close() })
	return s, f.Tok
}

// testServer is a server listening on a loopback port and a Unix socket.
type testServer struct {
	srv  *Server
	eng  *engine.Engine
	tok  *tokenizer.Tokenizer
	url  string // http://127.0.0.1:port
	sock string
}

func startServer(t testing.TB, opts Options, eopts engine.Options) *testServer {
	t.Helper()
	return serve(t, opts, eopts, testmodel.Load(t, "qwen3", testmodel.Options{ChatTemplate: "qwen3.jinja", Threads: 2}))
}

// serve starts a test server on a loaded model.
func serve(t testing.TB, opts Options, eopts engine.Options, f testmodel.Fixture) *testServer {
	t.Helper()
	sess, tok := newSession(t, f, eopts)
	opts.ModelName = testModel
	if opts.Logger == nil {
		opts.Logger = testmodel.Logger()
	}
	opts.TokenText = func(id int32) string { return tok.Decode([]int32{id}) }
	srv := New(sess, opts)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Socket paths are limited to 108 bytes; t.TempDir can be longer.
	sockDir, err := os.MkdirTemp("", "kiln")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "kiln.sock")
	ul, err := ListenUnix(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	go srv.Serve(ul)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return &testServer{srv: srv, eng: sess.Engine(), tok: tok, url: "http://" + l.Addr().String(), sock: sock}
}

// client returns an openai-go client of the TCP listener.
func (ts *testServer) client(opts ...option.RequestOption) *openai.Client {
	c := openai.NewClient(append([]option.RequestOption{option.WithBaseURL(ts.url + "/v1/"), option.WithAPIKey("unused"),
		option.WithMaxRetries(0)}, opts...)...)
	return &c
}

// unixHTTP is an HTTP client whose requests all go to the Unix socket.
func unixHTTP(sock string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
}

// waitIdle waits until the engine runs nothing and, when blocks is not
// negative, holds exactly that many KV blocks.
func waitIdle(t testing.TB, e *engine.Engine, blocks int) engine.Stats {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := e.Stats()
		if st.Running == 0 && st.Waiting == 0 && (blocks < 0 || st.KVBlocksUsed == blocks) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("engine not idle: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rawGet gets url and decodes its JSON body.
func rawGet(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("%s: status %d: %v", url, resp.StatusCode, err)
	}
	return resp.StatusCode, v
}
