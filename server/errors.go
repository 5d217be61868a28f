package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/session"
)

// apiError is an error a client sees: an HTTP status and OpenAI's error
// object ({"error": {"message", "type", "param", "code"}}). Ollama routes
// write only the message, as Ollama does.
type apiError struct {
	status  int
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func (e *apiError) Error() string { return e.Message }

func newAPIError(status int, typ, code, param, format string, args ...any) *apiError {
	e := &apiError{status: status, Message: fmt.Sprintf(format, args...), Type: typ}
	if code != "" {
		e.Code = &code
	}
	if param != "" {
		e.Param = &param
	}
	return e
}

// badRequest is a 400 about one request field (param may be empty).
func badRequest(param, format string, args ...any) *apiError {
	return newAPIError(http.StatusBadRequest, "invalid_request_error", "", param, format, args...)
}

func notFound(code, format string, args ...any) *apiError {
	return newAPIError(http.StatusNotFound, "invalid_request_error", code, "", format, args...)
}

// asAPIError turns any error into what the client sees. Errors from
// submitting a request are the client's unless they say otherwise: the
// session and the engine reject a request before it runs only for what the
// request asked (template errors, sampling parameters, bad token ids, context
// overflow) or for load (queue full, closing).
func asAPIError(err error) *apiError {
	var ae *apiError
	var se *engine.SamplingError
	var ce *engine.ContextError
	var cse *session.ConstraintError
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &se):
		return badRequest(se.Param, "%s", se)
	case errors.As(err, &ce):
		return newAPIError(http.StatusBadRequest, "invalid_request_error", "context_length_exceeded", "messages", "%s", contextMessage(ce))
	case errors.As(err, &cse):
		param := "response_format"
		if cse.Tools {
			param = "tools"
		}
		return badRequest(param, "%s", cse)
	case errors.Is(err, engine.ErrEmbeddingModel):
		return badRequest("model", "%v: use /v1/embeddings or /api/embed", err)
	case errors.Is(err, engine.ErrContextOverflow):
		return newAPIError(http.StatusBadRequest, "invalid_request_error", "context_length_exceeded", "messages", "%v", err)
	case errors.Is(err, session.ErrNoFIM):
		return badRequest("suffix", "suffix (fill-in-the-middle) is not possible: %s", strings.TrimPrefix(err.Error(), "session: "))
	case errors.Is(err, engine.ErrQueueFull):
		return newAPIError(http.StatusTooManyRequests, "rate_limit_error", "queue_full", "", "the server is busy: %v; retry later", err)
	case errors.Is(err, engine.ErrClosed), errors.Is(err, errDraining):
		return newAPIError(http.StatusServiceUnavailable, "service_unavailable", "shutting_down", "", "the server is shutting down")
	case errors.Is(err, context.DeadlineExceeded):
		return newAPIError(http.StatusGatewayTimeout, "timeout", "timeout", "", "the request took longer than the server's time limit")
	case errors.Is(err, context.Canceled):
		// The client is gone; nobody reads this.
		return newAPIError(499, "cancelled", "", "", "request cancelled")
	}
	// The session's and the engine's errors name their package, as Go
	// errors do; a client gets the sentence without it.
	msg := strings.TrimPrefix(strings.TrimPrefix(err.Error(), "session: "), "engine: ")
	return newAPIError(http.StatusBadRequest, "invalid_request_error", "", "", "%s", msg)
}

// contextMessage is vLLM's sentence for a request over the context, and
// what would raise the context.
func contextMessage(ce *engine.ContextError) string {
	msg := fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %s tokens (%s in the prompt, %d in the completion).",
		ce.Context, ce.Count(ce.Requested()), ce.Count(uint64(ce.Prompt)), max(ce.MaxTokens, 1))
	switch ce.Limit {
	case engine.LimitKVCache:
		msg += " The server's KV cache bounds its context: start it with more --kv-memory (or a model with a smaller KV cache)."
	case engine.LimitOption:
		msg += " The server was started with --context " + strconv.Itoa(ce.Context) + ": a larger --context raises it, up to the model's own."
	case engine.LimitRequest:
		msg += " The request's num_ctx sets it: raise num_ctx (up to the context_length of /api/show)."
	}
	return msg + " Please reduce the length of the prompt or of the completion (max_tokens)."
}

var errDraining = errors.New("server is draining")

// marshal encodes v as JSON without escaping <, > and & (code and think
// tags stay readable, and shorter).
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// writeJSON writes v with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := marshal(v)
	if err != nil {
		http.Error(w, `{"error":{"message":"internal error encoding the response","type":"server_error"}}`, http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// writeOpenAIError writes err in OpenAI's error shape.
func writeOpenAIError(w http.ResponseWriter, err error) {
	ae := asAPIError(err)
	writeJSON(w, ae.status, map[string]any{"error": ae})
}

// ollamaParams are Ollama's names of the sampling parameters it spells
// differently from OpenAI.
var ollamaParams = map[string]string{"repetition_penalty": "repeat_penalty"}

// writeErrorFor writes err in the shape of the API r is a request of:
// Ollama's under /api/, OpenAI's elsewhere.
func writeErrorFor(w http.ResponseWriter, r *http.Request, err error) {
	if strings.HasPrefix(r.URL.Path, "/api/") {
		writeOllamaError(w, err)
	} else {
		writeOpenAIError(w, err)
	}
}

// writeOllamaError writes err as Ollama does: {"error": "message"}.
func writeOllamaError(w http.ResponseWriter, err error) {
	var se *engine.SamplingError
	if errors.As(err, &se) && ollamaParams[se.Param] != "" {
		err = &engine.SamplingError{Param: ollamaParams[se.Param], Reason: se.Reason}
	}
	ae := asAPIError(err)
	writeJSON(w, ae.status, map[string]string{"error": ae.Message})
}
