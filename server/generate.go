package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/session"
)

// samplingFields are the decoding parameters OpenAI-style requests share
// (vLLM's top_k, min_p, repetition_penalty and ignore_eos included). A nil
// field takes the server's default.
type samplingFields struct {
	Temperature       *float32           `json:"temperature"`
	TopP              *float32           `json:"top_p"`
	TopK              *int               `json:"top_k"`
	MinP              *float32           `json:"min_p"`
	Seed              *int64             `json:"seed"`
	Stop              stringList         `json:"stop"`
	PresencePenalty   *float32           `json:"presence_penalty"`
	FrequencyPenalty  *float32           `json:"frequency_penalty"`
	RepetitionPenalty *float32           `json:"repetition_penalty"`
	LogitBias         map[string]float32 `json:"logit_bias"`
	IgnoreEOS         bool               `json:"ignore_eos"`
	N                 *int               `json:"n"`
}

// sampling merges a request's fields over the server defaults. Their bounds
// are engine.Sampling's, checked when the request is submitted; the checks
// here are of the wire's own forms (n, top_k's -1, logit_bias keys) and of
// values the engine reads as "unset" (top_p and max_tokens 0). maxTokens nil
// keeps the default.
func (s *Server) sampling(f *samplingFields, maxTokens *int) (engine.Sampling, error) {
	sp := s.opts.Defaults
	if f.N != nil && *f.N != 1 {
		return sp, badRequest("n", "n must be 1: kiln returns one choice per request")
	}
	for _, v := range []struct {
		dst *float32
		v   *float32
	}{
		{&sp.Temperature, f.Temperature}, {&sp.TopP, f.TopP}, {&sp.MinP, f.MinP},
		{&sp.PresencePenalty, f.PresencePenalty}, {&sp.FrequencyPenalty, f.FrequencyPenalty}, {&sp.RepetitionPenalty, f.RepetitionPenalty},
	} {
		if v.v != nil {
			*v.dst = *v.v
		}
	}
	if f.TopP != nil && *f.TopP == 0 {
		return sp, badRequest("top_p", "top_p must be greater than 0")
	}
	if f.TopK != nil {
		switch k := *f.TopK; {
		case k == -1: // vLLM's "no limit"
			sp.TopK = 0
		case k < 0:
			return sp, badRequest("top_k", "top_k must be -1 (no limit) or at least 0, not %d", k)
		default:
			sp.TopK = k
		}
	}
	if f.Seed != nil {
		seed := uint64(*f.Seed)
		sp.Seed = &seed
	}
	if f.Stop != nil {
		sp.Stop = f.Stop
	}
	if len(f.LogitBias) > 0 {
		sp.LogitBias = make(map[int32]float32, len(f.LogitBias))
		for k, v := range f.LogitBias {
			id, err := strconv.ParseInt(k, 10, 32)
			if err != nil || id < 0 {
				return sp, badRequest("logit_bias", "logit_bias keys must be token ids, not %q", k)
			}
			sp.LogitBias[int32(id)] = v
		}
	}
	if maxTokens != nil {
		if *maxTokens < 1 {
			return sp, badRequest("max_tokens", "max_tokens must be at least 1, not %d", *maxTokens)
		}
		sp.MaxTokens = *maxTokens
	}
	sp.IgnoreEOS = f.IgnoreEOS
	return sp, nil
}

func (s *Server) setLogprobs(sp *engine.Sampling, on bool, top int) error {
	if top > 0 && !on {
		return badRequest("top_logprobs", "top_logprobs requires logprobs")
	}
	sp.Logprobs, sp.TopLogprobs = on, top
	return nil
}

// thinkingKwargs returns kwargs with enable_thinking set, copying it.
func thinkingKwargs(kwargs map[string]any, on bool) map[string]any {
	out := make(map[string]any, len(kwargs)+1)
	for k, v := range kwargs {
		out[k] = v
	}
	out["enable_thinking"] = on
	return out
}

// generation is one submitted request.
type generation struct {
	ctx     context.Context
	cancel  context.CancelFunc
	read    func() session.Event // the stream's next event (session.Stream.Next)
	log     *slog.Logger         // nil: no log line
	metrics *serverMetrics       // nil: not recorded
	final   session.Event
	counted bool // recorded in metrics
	// prep is the time from the handler taking the request to the engine
	// having its prompt: reading and decoding the body, rendering and
	// tokenizing. The engine's TTFT starts where it ends.
	prep time.Duration
}

// start submits req under the request's context, bounded by the server's
// request timeout. The caller must call close.
func (s *Server) start(r *http.Request, req *session.Request) (*generation, error) {
	ctx, cancel := context.WithTimeout(r.Context(), s.opts.RequestTimeout)
	st, err := s.sess.Generate(ctx, req)
	p := prepSlotOf(r)
	p.release() // the engine has the prompt, or refused it
	if err != nil {
		cancel()
		return nil, err
	}
	g := &generation{ctx: ctx, cancel: cancel, read: st.Next, log: s.log, metrics: s.metrics}
	if p != nil {
		g.prep = time.Since(p.arrived)
	}
	return g, nil
}

// close cancels the request if it is still running, which makes the engine
// free its sequence, and records and logs what it cost.
func (g *generation) close() {
	g.cancel()
	if !g.final.Done { // the handler left before the end: the client is gone
		g.final = session.Event{Done: true, Finish: engine.FinishCancelled}
	}
	g.count()
	if g.log == nil {
		return
	}
	for !g.final.Done {
		// The handler stopped reading (its client is gone): once
		// cancelled, the stream drops what is unread and ends, within a
		// step, with the final event, which says what was generated.
		g.next()
	}
	u := usageOf(g.final)
	g.log.Info("generation", "finish", g.final.Finish, "prompt_tokens", u.PromptTokens, "cached_tokens", u.CachedTokens,
		"completion_tokens", u.CompletionTokens, "prep", g.prep.Round(time.Microsecond), "queued", u.Queued.Round(time.Microsecond), "ttft", u.TTFT.Round(time.Microsecond), "decode_tok_s", math.Round(u.DecodeTokensPerS*10)/10)
}

// next returns the stream's next event.
func (g *generation) next() session.Event {
	ev := g.read()
	if ev.Done {
		g.final = ev
		g.count() // before the client hears of the end
	}
	return ev
}

// count records the generation's end in the server's metrics, once.
func (g *generation) count() {
	if g.metrics != nil && !g.counted {
		g.counted = true
		g.metrics.observe(g.final, g.prep)
	}
}

// failure is the error a final event reports, nil when it finished normally.
func (g *generation) failure(ev session.Event) error {
	switch ev.Finish {
	case engine.FinishCancelled:
		if g.ctx.Err() != nil {
			// The client left, the time limit passed, or the drain ran out.
			return context.Cause(g.ctx)
		}
		return context.Canceled
	case engine.FinishError:
		err := ev.Err
		if err == nil {
			err = errors.New("unknown engine error")
		}
		if errors.Is(err, engine.ErrContextOverflow) || errors.Is(err, engine.ErrQueueFull) || errors.Is(err, engine.ErrClosed) {
			return err
		}
		return newAPIError(http.StatusInternalServerError, "server_error", "", "", "generation failed: %v", err)
	}
	return nil
}

// result is a whole generation, for non-streaming responses.
type result struct {
	text, reasoning strings.Builder
	toolCalls       []chat.ToolCall
	logprobs        []engine.Logprob
	final           session.Event
}

// collect reads the whole stream.
func (g *generation) collect() (*result, error) {
	res := &result{}
	for {
		ev := g.next()
		res.text.WriteString(ev.Text)
		res.reasoning.WriteString(ev.Reasoning)
		res.toolCalls = append(res.toolCalls, ev.ToolCalls...)
		res.logprobs = append(res.logprobs, ev.Logprobs...)
		if ev.Done {
			res.final = ev
			return res, g.failure(ev)
		}
	}
}

// usage returns the final event's usage, never nil.
func usageOf(ev session.Event) engine.Usage {
	if ev.Usage == nil {
		return engine.Usage{}
	}
	return *ev.Usage
}

// streamWriter writes a streamed response (SSE or NDJSON). A write that
// fails or does not complete within the server's write timeout, or a
// client that took nothing of it for as long (stall.go), cancels the
// generation, so that a client that disconnects or stops reading frees its
// sequence.
type streamWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	cancel  context.CancelFunc
	prog    *progress
	err     error
}

func (s *Server) newStreamWriter(w http.ResponseWriter, g *generation, contentType string) *streamWriter {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	c, _ := g.ctx.Value(connKey{}).(*countingConn)
	return &streamWriter{w: w, rc: http.NewResponseController(w), timeout: s.opts.WriteTimeout, cancel: g.cancel, prog: newProgress(c)}
}

func (sw *streamWriter) write(b []byte) error {
	if sw.err != nil {
		return sw.err
	}
	now := time.Now()
	if sw.prog.stalled(now, sw.timeout) {
		sw.fail(fmt.Errorf("%w: it took nothing for %v", errNotReading, sw.timeout))
		return sw.err
	}
	sw.rc.SetWriteDeadline(now.Add(sw.timeout))
	_, err := sw.w.Write(b)
	if err == nil {
		err = sw.rc.Flush()
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = fmt.Errorf("%w: a write waited %v", errNotReading, sw.timeout)
	}
	if err != nil {
		sw.fail(err)
		return sw.err
	}
	return nil
}

func (sw *streamWriter) fail(err error) {
	sw.err = fmt.Errorf("%w: %w", errClientWrite, err)
	sw.cancel()
}

// event writes v as one server-sent event.
func (sw *streamWriter) event(v any) error {
	b, err := marshal(v)
	if err != nil {
		return err
	}
	return sw.write(append(append([]byte("data: "), b...), '\n', '\n'))
}

// line writes v as one NDJSON line.
func (sw *streamWriter) line(v any) error {
	b, err := marshal(v)
	if err != nil {
		return err
	}
	return sw.write(append(b, '\n'))
}

// tokenText is a token's text for logprobs.
func (s *Server) tokenText(id int32) string {
	if s.opts.TokenText == nil {
		return "token_id:" + strconv.Itoa(int(id))
	}
	return s.opts.TokenText(id)
}

// argumentsString returns a tool call's arguments as OpenAI sends them: a
// string holding JSON.
func argumentsString(raw json.RawMessage) string {
	var s string
	if len(raw) > 0 && raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
		return s
	}
	if len(raw) == 0 {
		return "{}"
	}
	return string(raw)
}

// argumentsObject returns a tool call's arguments as Ollama sends them: a
// JSON object (or whatever JSON value the model produced).
func argumentsObject(raw json.RawMessage) json.RawMessage {
	s := argumentsString(raw)
	if json.Valid([]byte(s)) {
		return json.RawMessage(s)
	}
	b, _ := json.Marshal(s)
	return b
}
