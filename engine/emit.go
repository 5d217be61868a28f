package engine

import (
	"slices"
	"time"

	"github.com/kiln-llm/kiln/backend"
)

// accept extends a sequence by its sampled token and tells whether the
// sequence ends there (a stop token or its length limit), so that it takes
// no part in the next pass.
func (q *seq) accept(t int32) (ends bool) {
	q.tokens = append(q.tokens, t)
	q.counts[t]++
	return q.stopIDs[t] || len(q.tokens) >= q.maxLen
}

// emit sends the token that accept added: it turns the token into text
// (held back while it could be the start of a stop string) and ends the
// sequence on a stop token, a stop string or its length limit.
func (s *scheduler) emit(q *seq, smp backend.Sampled) {
	now := time.Now()
	if q.firstTok.IsZero() {
		q.firstTok = now
	}
	q.lastTok = now
	t := smp.Token
	ev := Event{Tokens: []int32{t}}
	if q.params.Logprob || q.params.TopLogprobs > 0 {
		ev.Logprobs = []Logprob{logprobOf(smp)}
	}
	var reason FinishReason
	stopped := false
	if q.stopIDs[t] {
		reason = FinishStop
	} else if q.dec != nil {
		ev.Text, stopped = q.stop.push(q.dec.Next(t))
	}
	if stopped {
		reason = FinishStop
	} else if reason == "" && len(q.tokens) >= q.maxLen {
		reason = FinishLength
	}
	if reason != "" && !stopped {
		reason = q.flushText(&ev, reason)
	}
	if reason == "" {
		q.out.push(ev)
		return
	}
	s.finishWith(q, reason, nil, ev)
}

// complete ends q for reason with ev as its final event, after the text
// that its decoder and stop matcher still hold (a stop string it completes
// makes the reason FinishStop).
func (s *scheduler) complete(q *seq, reason FinishReason, ev Event) {
	s.finishWith(q, q.flushText(&ev, reason), nil, ev)
}

// flushText adds to ev the text q holds back (an unfinished character, what
// may start a stop string) as it ends for reason, which becomes FinishStop
// if that text completes a stop string.
func (q *seq) flushText(ev *Event, reason FinishReason) FinishReason {
	if q.dec == nil {
		return reason
	}
	tail, hit := q.stop.push(q.dec.Flush())
	ev.Text += tail
	if hit {
		return FinishStop
	}
	ev.Text += q.stop.flush()
	return reason
}

// logprobOf is a sampled token's log-probabilities in the engine's own type.
func logprobOf(smp backend.Sampled) Logprob {
	lp := Logprob{Token: smp.Token, Logprob: smp.Logprob}
	if len(smp.Top) > 0 {
		lp.Top = slices.Clone(smp.Top) // the backend's may be reused
	}
	return lp
}
