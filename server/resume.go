package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"unsafe"
)

// A chat client sends the whole conversation with every turn, so the body
// of a follow-up is the previous turn's body with the answer and a new
// message added: decoding all of it costs as much as the history (4.3 ms
// for the 390 KB of a 100K-token conversation on the dev machine, 2-4 ms
// of a follow-up's 17-30 on the GPU machine). resumable keeps recent large
// bodies, where each of their messages ends and what it decoded to; a body
// that shares bytes with one of them decodes only what follows the last
// message they share whole, and is otherwise decoded exactly as
// parseBody decodes it: same values, same errors.

// resumeMinBody is the smallest body kept: below it a decode is cheap.
const resumeMinBody = 64 << 10

// resumeBudget bounds the bytes kept (resumeEntry.size).
const resumeBudget = 128 << 20

// resumable is the decoded bodies of one kind of chat request, R, whose
// messages are Ms (messages gives the field).
type resumable[R, M any] struct {
	messages        func(*R) *[]M
	minBody, budget int

	mu     sync.Mutex
	recent []*resumeEntry[M] // most recent first
	bytes  int
	hits   int // bodies decoded after a kept one's messages (tests)
}

type resumeEntry[M any] struct {
	body []byte
	open int   // the offset just after the messages array's '['
	ends []int // ends[k]: the offset just after message k
	msgs []M   // what they decoded to, never written to
}

// size is what an entry holds: its body, the decoded text (at most the
// body's bytes again) and a message and an end per message (a body of many
// empty messages decodes to several times its size).
func (e *resumeEntry[M]) size() int {
	var m M
	return 2*len(e.body) + len(e.ends)*(int(unsafe.Sizeof(m))+8)
}

func newResumable[R, M any](messages func(*R) *[]M) *resumable[R, M] {
	return &resumable[R, M]{messages: messages, minBody: resumeMinBody, budget: resumeBudget}
}

// decode decodes body into v (zero) as parseBody does, resuming after a
// kept body's messages where body starts with them. The decoded messages
// may be shared with other requests: read only. keep, when not nil, keeps
// body for the requests after it: for the handler to call once the engine
// took the request (a body refused, over the context say, is not worth
// its memory), while the engine computes the prompt (a body decoded whole
// is walked again there for its messages' ends).
func (c *resumable[R, M]) decode(body []byte, v *R) (keep func(), err error) {
	if len(body) < c.minBody {
		return nil, parseBody(body, v)
	}
	if e, k := c.longest(body); k > 0 {
		if open, ends, ok := c.resume(body, e, k, v); ok {
			var old *resumeEntry[M]
			if k == len(e.ends) {
				old = e // every body that shares messages with it shares them with this one
			}
			msgs := *c.messages(v)
			return func() { c.keep(body, open, ends, msgs, old) }, nil
		}
		// Decode afresh, so that v and the errors are parseBody's.
		var zero R
		*v = zero
	}
	if err := parseBody(body, v); err != nil {
		return nil, err
	}
	msgs := *c.messages(v)
	return func() {
		if open, ends, ok := messageEnds(body); ok && len(ends) == len(msgs) {
			c.keep(body, open, ends, msgs, nil)
		}
	}, nil
}

// longest returns the kept body that shares the most whole messages with
// body, and how many.
func (c *resumable[R, M]) longest(body []byte) (*resumeEntry[M], int) {
	// Compared outside the lock (entries never change once kept): other
	// requests need not wait on the bytes of this one's comparisons.
	c.mu.Lock()
	recent := slices.Clone(c.recent)
	c.mu.Unlock()
	var best *resumeEntry[M]
	k := 0
	for _, e := range recent {
		n := commonPrefix(e.body, body)
		if m := sort.SearchInts(e.ends, n+1); m > k { // ends[m-1] <= n
			best, k = e, m
		}
	}
	return best, k
}

// resume decodes body after e's first k messages, which it shares byte for
// byte: what follows them, joined to what precedes the array, is decoded
// whole (the shared part was valid JSON and UTF-8 in e, and cut after a
// value), then e's messages go before the new ones. It reports the new
// body's array start and message ends, or false where body is not a
// follow-up of e that parseBody accepts (then v may hold a part of it).
func (c *resumable[R, M]) resume(body []byte, e *resumeEntry[M], k int, v *R) (int, []int, bool) {
	cut := e.ends[k-1]
	rest := bytes.TrimLeft(body[cut:], " \t\r\n")
	if len(rest) == 0 {
		return 0, nil, false
	}
	switch rest[0] {
	case ',':
		rest = rest[1:]
		if r := bytes.TrimLeft(rest, " \t\r\n"); len(r) == 0 || r[0] == ']' {
			return 0, nil, false // a comma before the end of the array
		}
	case ']':
	default:
		return 0, nil, false
	}
	from := len(body) - len(rest) // rest is body[from:]
	joined := make([]byte, 0, e.open+len(rest))
	joined = append(append(joined, body[:e.open]...), rest...)
	open, ends, ok := messageEnds(joined)
	if !ok || open != e.open {
		return 0, nil, false
	}
	msgs := c.messages(v)
	if parseBody(joined, v) != nil || len(*msgs) != len(ends) {
		return 0, nil, false
	}
	*msgs = append(slices.Clip(e.msgs[:k]), *msgs...)
	all := append(slices.Clip(e.ends[:k]), ends...)
	for i := k; i < len(all); i++ {
		all[i] += from - e.open
	}
	c.mu.Lock()
	c.hits++
	c.mu.Unlock()
	return open, all, true
}

// keep remembers body in place of old (if kept still), evicting the oldest
// bodies over the budget.
func (c *resumable[R, M]) keep(body []byte, open int, ends []int, msgs []M, old *resumeEntry[M]) {
	e := &resumeEntry[M]{body: body, open: open, ends: ends, msgs: msgs}
	if e.size() > c.budget {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.recent, old); old != nil && i >= 0 {
		c.recent = slices.Delete(c.recent, i, i+1)
		c.bytes -= old.size()
	}
	c.recent = slices.Insert(c.recent, 0, e)
	c.bytes += e.size()
	for c.bytes > c.budget {
		last := c.recent[len(c.recent)-1]
		c.recent = c.recent[:len(c.recent)-1]
		c.bytes -= last.size()
	}
}

// messageEnds walks a JSON object's keys and returns the offset just after
// the '[' of its "messages" array and the offset just after each of the
// array's values; false unless the object has exactly one key that names
// the array as encoding/json matches field names (any case) and its value
// is an array.
func messageEnds(data []byte) (open int, ends []int, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return 0, nil, false
	}
	found := 0
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return 0, nil, false
		}
		if key, _ := t.(string); !strings.EqualFold(key, "messages") {
			var skip json.RawMessage
			if dec.Decode(&skip) != nil {
				return 0, nil, false
			}
			continue
		}
		if found++; found > 1 {
			return 0, nil, false
		}
		if t, err := dec.Token(); err != nil || t != json.Delim('[') {
			return 0, nil, false
		}
		open = int(dec.InputOffset())
		for dec.More() {
			var skip json.RawMessage
			if dec.Decode(&skip) != nil {
				return 0, nil, false
			}
			ends = append(ends, int(dec.InputOffset()))
		}
		if _, err := dec.Token(); err != nil {
			return 0, nil, false
		}
	}
	return open, ends, found == 1
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	i := 0
	for i+4096 <= n && bytes.Equal(a[i:i+4096], b[i:i+4096]) {
		i += 4096
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// decodeChat is decodeRequest for a chat request, through the server's
// kept bodies c; keep (resumable.decode) may be nil.
func decodeChat[R, M any](s *Server, w http.ResponseWriter, r *http.Request, c *resumable[R, M], v *R) (keep func(), err error) {
	body, err := s.readRequest(w, r)
	if err != nil {
		return nil, err
	}
	return c.decode(body, v)
}
