package server

import (
	"errors"
	"net"
	"sync/atomic"
	"time"
)

// A client that stops reading a stream would keep its sequence generating
// to max_tokens: a write blocks, and its deadline fires, only once the
// kernel's buffers are full, and a whole answer fits in them. So a stream
// watches what its client takes: the bytes written to the connection less
// those the kernel still holds (on TCP not yet acknowledged, which a
// client that does not read stops doing once its receive buffer is full;
// on a Unix socket not yet read). A client that took nothing for the
// write timeout while bytes waited has its stream cancelled, freeing the
// sequence; and a TCP stream's send buffer is kept small, which bounds
// the bytes waiting for it (and makes writes block where the kernel
// cannot say what is queued).

// streamSendBuffer is the send buffer of a TCP connection once it streams
// (the kernel doubles it): a token stream needs little, and what a client
// leaves unread waits in it.
const streamSendBuffer = 64 << 10

var (
	// errClientWrite: writing a stream failed or its client stopped
	// reading; the connection must not be reused.
	errClientWrite = errors.New("writing to the client")
	errNotReading  = errors.New("the client stopped reading")
)

// countingListener counts the bytes written to each connection it accepts.
type countingListener struct{ net.Listener }

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c}, nil
}

type countingConn struct {
	net.Conn
	written atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.written.Add(int64(n))
	return n, err
}

// CloseWrite lets net/http half-close a TCP connection it ends, as it
// does with an unwrapped one.
func (c *countingConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

type connKey struct{}

// progress follows what the client of a stream takes.
type progress struct {
	c     *countingConn
	taken int64
	since time.Time // when taken last grew, or nothing waited
}

// newProgress starts following c (nil: a connection not accepted by
// Serve, which is then left to the write deadlines).
func newProgress(c *countingConn) *progress {
	if c == nil {
		return nil
	}
	if tcp, ok := c.Conn.(*net.TCPConn); ok {
		tcp.SetWriteBuffer(streamSendBuffer)
	}
	return &progress{c: c, taken: c.written.Load(), since: time.Now()}
}

// stalled reports whether the client has taken nothing for d while bytes
// waited for it.
func (p *progress) stalled(now time.Time, d time.Duration) bool {
	if p == nil {
		return false
	}
	queued, ok := queuedBytes(p.c.Conn)
	if !ok {
		return false
	}
	taken := p.c.written.Load() - int64(queued)
	if queued == 0 || taken > p.taken {
		p.taken, p.since = taken, now
		return false
	}
	return now.Sub(p.since) > d
}
