package server

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-llm/kiln/engine"
)

// syncBuffer is a log the server writes from many goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Clients that send a streamed request and never read the answer (their
// receive buffers small, so that they fill early; their kernels still
// take what fits) have their streams cancelled once they took nothing for
// the write timeout, long before max_tokens: 20 of them used to run to
// the end, holding every slot while a normal request waited. Here the
// normal request is answered and each stream ends cancelled with a
// fraction of its tokens.
func TestClientNotReadingIsCancelled(t *testing.T) {
	const clients, maxTokens = 20, 3000
	var log syncBuffer
	ts := startServer(t, Options{WriteTimeout: 300 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&log, nil))}, engine.Options{NoCache: true})
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	body := fmt.Sprintf(`{"messages":[{"role":"user","content":"count"}],"stream":true,"max_tokens":%d,"ignore_eos":true}`, maxTokens)
	addr := ts.url[len("http://"):]
	for range clients {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", addr, len(body), body)
	}
	waitStarted := time.Now().Add(10 * time.Second)
	for ts.eng.Stats().Running == 0 && time.Now().Before(waitStarted) {
		time.Sleep(time.Millisecond)
	}
	if _, err := ts.client().Chat.Completions.New(t.Context(), greedy("hi", 4)); err != nil {
		t.Fatal(err)
	}
	// Every stream ends cancelled, with a fraction of its tokens, once its
	// client stopped taking them.
	deadline := time.Now().Add(60 * time.Second)
	re := regexp.MustCompile(`msg=generation finish=(\S+) prompt_tokens=\d+ cached_tokens=\d+ completion_tokens=(\d+)`)
	for {
		out := log.String()
		ends := re.FindAllStringSubmatch(out, -1)
		if len(ends) == clients+1 && strings.Count(out, "the client stopped reading") == clients {
			cancelled := 0
			for _, m := range ends {
				if n, _ := strconv.Atoi(m[2]); m[1] == "cancelled" && n < maxTokens {
					cancelled++
				}
			}
			if cancelled != clients {
				t.Errorf("%d of %d streams cancelled before max_tokens: %q", cancelled, clients, ends)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d generations ended, %d streams not read: %q", len(ends), strings.Count(out, "the client stopped reading"), ends)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := waitIdle(t, ts.eng, -1); st.StepTokens > clients*maxTokens/4 {
		t.Errorf("the engine computed %d tokens for %d streams of %d", st.StepTokens, clients, maxTokens)
	}
}
