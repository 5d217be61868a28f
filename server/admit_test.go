package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kiln-llm/kiln/engine"
)

// The gate lets n requests prepare at once; the next waits for a slot or
// for its context.
func TestPrepGate(t *testing.T) {
	g := newPrepGate(2)
	a, b, c := &prepSlot{g: g}, &prepSlot{g: g}, &prepSlot{g: g}
	for _, p := range []*prepSlot{a, b} {
		if err := p.acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := c.acquire(ctx); err == nil {
		t.Fatal("a third request prepared beside two")
	}
	got := make(chan error)
	go func() { got <- c.acquire(context.Background()) }()
	a.release()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	a.release() // again: a no-op
	if len(g.slots) != 2 {
		t.Fatalf("%d slots held, want 2", len(g.slots))
	}
	b.release()
	c.release()
	if len(g.slots) != 0 {
		t.Fatalf("%d slots held after every release", len(g.slots))
	}
}

// retained is the heap memory the process holds from the system.
func retained() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapSys - m.HeapReleased
}

// Twelve 8 MiB prompts without a space at once, as chat messages, a
// completion prompt and an Ollama chat, against a server that reads bodies
// that large: each is refused as over the context (400) before it is
// tokenized (the engine never sees it), the server goes on answering, and
// the memory the burst took goes back to the system. scripts/burst.sh
// does the same to a kiln serve process under a memory limit.
func TestHugePromptsBurst(t *testing.T) {
	ts := startServer(t, Options{MaxBodyBytes: 16 << 20}, engine.Options{})
	text := strings.Repeat("x", 8<<20)
	bodies := []struct{ path, body string }{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"` + text + `"}]}`},
		{"/v1/completions", `{"prompt":"` + text + `"}`},
		{"/api/chat", `{"messages":[{"role":"user","content":"` + text + `"}],"stream":false}`},
	}
	text = ""
	debug.FreeOSMemory()
	idle := retained()
	var wg sync.WaitGroup
	for i := range 12 {
		b := bodies[i%len(bodies)]
		wg.Go(func() {
			resp, err := http.Post(ts.url+b.path, "application/json", strings.NewReader(b.body))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var v struct {
				Error json.RawMessage `json:"error"`
			}
			json.NewDecoder(resp.Body).Decode(&v)
			if resp.StatusCode != 400 || !bytes.Contains(v.Error, []byte("context")) {
				t.Errorf("%s: %d %s", b.path, resp.StatusCode, v.Error)
			}
		})
	}
	wg.Wait()
	if st := ts.eng.Stats(); st.PromptTokens != 0 {
		t.Errorf("the engine saw %d prompt tokens", st.PromptTokens)
	}
	if _, err := ts.client().Chat.Completions.New(context.Background(), greedy("still there?", 2)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for retained() > idle+32<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("the heap holds %d MB from the system, %d MB before the burst", retained()>>20, idle>>20)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// jsonEscaped writes s as a JSON string the longest way jsonBytes allows:
// non-ASCII as \uXXXX (surrogate pairs beyond the BMP), <, > and & as Go
// escapes them.
func jsonEscaped(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteString(`\` + string(r))
		case r == '\n':
			b.WriteString(`\n`)
		case r < 0x20 || r == '<' || r == '>' || r == '&' || r >= 0x80 && r < 0x10000:
			fmt.Fprintf(&b, `\u%04x`, r)
		case r >= 0x10000:
			r -= 0x10000
			fmt.Fprintf(&b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// The default body limit lets through the largest request that can fit:
// a prompt of the heaviest token (in JSON) repeated to fill the context,
// escaped as heavily as any encoder does. A body over the limit is 413.
func TestDefaultMaxBody(t *testing.T) {
	ts := startServer(t, Options{}, engine.Options{})
	limit := ts.srv.opts.MaxBodyBytes
	if limit != DefaultMaxBody(ts.srv.sess) {
		t.Fatalf("MaxBodyBytes %d, DefaultMaxBody %d", limit, DefaultMaxBody(ts.srv.sess))
	}
	heavy, weight := "", 0
	for id := range int32(ts.tok.VocabSize()) {
		text := ts.tok.Decode([]int32{id})
		if !utf8.ValidString(text) || strings.ContainsRune(text, utf8.RuneError) {
			continue
		}
		if w := len(jsonEscaped(text)) - 2; w > weight {
			heavy, weight = text, w
		}
	}
	ctx, _ := ts.eng.Context()
	body := `{"prompt":` + jsonEscaped(strings.Repeat(heavy, ctx-1)) + `,"max_tokens":1}`
	t.Logf("heaviest token %q: %d JSON bytes; a context of it %d bytes, the limit %d", heavy, weight, len(body), limit)
	if int64(len(body)) > limit {
		t.Fatalf("the largest legal request, %d bytes, is over the limit of %d", len(body), limit)
	}
	if status, v := rawPost(t, ts.url, "/v1/completions", "application/json", []byte(body)); status == 413 {
		t.Errorf("the largest legal request: %d %v", status, v)
	}
	over := `{"prompt":"` + strings.Repeat("x", int(limit)) + `"}`
	if status, v := rawPost(t, ts.url, "/v1/completions", "application/json", []byte(over)); status != 413 {
		t.Errorf("a body over the limit: %d %v", status, v)
	}
}
