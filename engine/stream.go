package engine

import (
	"context"
	"sync"
)

// Stream is the output of one request. Read Events to its end (the channel
// is closed after the Done event) or cancel the request's context: a stream
// that is neither read nor cancelled keeps a goroutine waiting for its
// reader.
type Stream struct {
	out    chan Event
	ctx    context.Context
	mu     sync.Mutex
	queue  []Event
	notify chan struct{}
}

func newStream(ctx context.Context) *Stream {
	s := &Stream{out: make(chan Event, 16), ctx: ctx, notify: make(chan struct{}, 1)}
	go s.pump()
	return s
}

// Events returns the stream's events, closed after the one whose Done is
// set. After the request's context is cancelled, events not yet read may be
// dropped (the reader is assumed gone), but the final event is kept.
func (s *Stream) Events() <-chan Event { return s.out }

// push queues an event without blocking: the scheduler never waits for a
// slow reader.
func (s *Stream) push(ev Event) {
	s.mu.Lock()
	s.queue = append(s.queue, ev)
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// pump moves queued events to the reader's channel.
func (s *Stream) pump() {
	defer close(s.out)
	gone := false
	for {
		<-s.notify
		s.mu.Lock()
		q := s.queue
		s.queue = nil
		s.mu.Unlock()
		for _, ev := range q {
			if !gone {
				select {
				case s.out <- ev:
					if ev.Done {
						return
					}
					continue
				case <-s.ctx.Done():
					gone = true
				}
			}
			if ev.Done {
				// The reader may be gone: make room for the final event by
				// dropping the oldest unread one rather than block.
				for {
					select {
					case s.out <- ev:
						return
					default:
					}
					select {
					case <-s.out:
					default:
					}
				}
			}
		}
	}
}
