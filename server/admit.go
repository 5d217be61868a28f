package server

import (
	"context"
	"net/http"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kiln-llm/kiln/session"
)

// Work before admission. A request is decoded, rendered and tokenized
// before the engine can refuse it, and that work grows with the request:
// the body is bounded by Options.MaxBodyBytes (by default the largest
// request whose prompt can fit the context, DefaultMaxBody), the rendering
// and tokenizing by the context (package session), and the requests
// prepared at once by a gate of GOMAXPROCS slots, which a request holds
// from decoding its body until the engine has its prompt. Once a burst of
// large requests is over, the memory they took goes back to the system.

// largeBody is the body size from which a request counts as large.
const largeBody = 1 << 20

// memoryReturnInterval spaces the returns of memory to the system (each is
// a garbage collection).
const memoryReturnInterval = time.Second

// prepGate bounds the requests being prepared at once.
type prepGate struct {
	slots chan struct{}
	large atomic.Bool // a large request was seen since memory last went back

	mu      sync.Mutex
	pending bool // a return is scheduled
	last    time.Time
}

func newPrepGate(n int) *prepGate { return &prepGate{slots: make(chan struct{}, n)} }

// returnMemory gives the heap a burst left back to the system, at most
// once a memoryReturnInterval: the garbage collector alone would keep it
// until the heap next grows (a forced collection comes every two minutes).
func (g *prepGate) returnMemory() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.pending {
		return
	}
	g.pending = true
	time.AfterFunc(max(time.Until(g.last.Add(memoryReturnInterval)), 0), func() {
		if g.large.Swap(false) {
			debug.FreeOSMemory()
		}
		g.mu.Lock()
		g.pending, g.last = false, time.Now()
		g.mu.Unlock()
	})
}

// prepSlot is one request's claim on the gate, used by its handler
// goroutine only.
type prepSlot struct {
	g       *prepGate
	arrived time.Time // when the handler took the request
	held    bool
	large   bool
}

type prepKey struct{}

// withPrepSlot gives r a slot to claim; the returned function releases it
// if the handler still holds it.
func (s *Server) withPrepSlot(r *http.Request) (*http.Request, func()) {
	p := &prepSlot{g: s.prep, arrived: time.Now()}
	return r.WithContext(context.WithValue(r.Context(), prepKey{}, p)), p.release
}

func prepSlotOf(r *http.Request) *prepSlot {
	p, _ := r.Context().Value(prepKey{}).(*prepSlot)
	return p
}

// acquire waits for a slot, until ctx is done.
func (p *prepSlot) acquire(ctx context.Context) error {
	select {
	case p.g.slots <- struct{}{}:
		p.held = true
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// release gives the slot back; the last request of a burst that had a
// large one returns the memory.
func (p *prepSlot) release() {
	if p == nil {
		return
	}
	if p.held {
		p.held = false
		<-p.g.slots
	}
	if p.large {
		p.large = false
		p.g.large.Store(true)
	}
	if len(p.g.slots) == 0 && p.g.large.Load() {
		p.g.returnMemory()
	}
}

// decodeRequest is decodeBody for a generation request: the body is read
// first, then decoded once the request holds a slot of the gate, which
// start releases when the engine has the prompt.
func (s *Server) decodeRequest(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := s.readRequest(w, r)
	if err != nil {
		return err
	}
	return parseBody(body, v)
}

// readRequest reads a generation request's body and takes a slot of the
// gate to decode it in.
func (s *Server) readRequest(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body, err := readBody(w, r, s.opts.MaxBodyBytes)
	p := prepSlotOf(r)
	p.large = len(body) >= largeBody
	if err != nil {
		return nil, err
	}
	if err := p.acquire(r.Context()); err != nil {
		return nil, err
	}
	return body, nil
}

// DefaultMaxBody is the default Options.MaxBodyBytes of a server of sess:
// the largest request whose prompt can fit the engine's context. Each
// token of the context may take, in JSON, the most its text can be written
// as (tokenizer.MaxTokenBytes, each byte weighed as a JSON encoder may
// escape it: jsonBytes) or a message of its own (64 bytes; every message
// renders to a token at least), whichever is more, and 1 MiB holds what is
// not prompt text (sampling parameters, tools' descriptions beyond their
// rendering, a logit_bias). A tokenizer whose tokens have no bound on
// their length (or no engine to say the context) leaves the 8 MiB of old.
func DefaultMaxBody(sess *session.Session) int64 {
	if sess == nil || sess.Engine() == nil {
		return 8 << 20
	}
	per := 64
	if tok := sess.Tokenizer(); tok != nil {
		w := tok.MaxTokenBytes(jsonBytes)
		if w == 0 {
			return 8 << 20
		}
		per = max(per, w)
	}
	ctx, _ := sess.Engine().Context()
	return 1<<20 + int64(ctx)*int64(per)
}

// jsonBytes is the most bytes a JSON encoder writes for a byte of a
// string: 2 for an escaped quote, backslash or \n \r \t \b \f; 6 for
// another control character, or <, > and & as Go writes them (\u003c); 3
// for a byte of a multi-byte character, written \uXXXX by encoders that
// keep to ASCII (Python's default: 6 bytes for 2 or 3, 12 for 4).
func jsonBytes(b byte) int {
	switch {
	case b >= 0x80:
		return 3
	case b == '"' || b == '\\' || b == '\n' || b == '\r' || b == '\t' || b == '\b' || b == '\f':
		return 2
	case b < 0x20 || b == '<' || b == '>' || b == '&':
		return 6
	}
	return 1
}

// prepSlots is the size of the gate: the work is CPU-bound.
func prepSlots() int { return max(2, runtime.GOMAXPROCS(0)) }
