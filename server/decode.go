package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// bodyTimeout bounds reading a request body, against clients that send it
// slowly to hold connections.
const bodyTimeout = time.Minute

// decodeBody reads a JSON request body of at most limit bytes into v. Bodies
// that are too large get 413; bodies that are not valid UTF-8 (which
// encoding/json would silently replace), not JSON, or have a field of the
// wrong type get 400 naming the field.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, v any) error {
	body, err := readBody(w, r, limit)
	if err != nil {
		return err
	}
	return parseBody(body, v)
}

// readBody reads a request body of at most limit bytes, into one buffer of
// its declared length. On an error it returns what it read.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		// Refused before a byte of it is read: a client that sent
		// "Expect: 100-continue" then never sends the body, and one that
		// did not is not cut off mid-upload by the limit's close.
		return nil, tooLarge(limit)
	}
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(bodyTimeout))
	var buf bytes.Buffer
	if n := r.ContentLength; n > 0 && n <= limit {
		buf.Grow(int(n) + bytes.MinRead) // ReadFrom wants room to see the end
	}
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, limit))
	// Cleared at once: an expired read deadline during the response would
	// cancel the request (see Server.hs).
	rc.SetReadDeadline(time.Time{})
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return buf.Bytes(), tooLarge(limit)
		}
		return buf.Bytes(), badRequest("", "reading the request body: %v", err)
	}
	return buf.Bytes(), nil
}

// tooLarge is the error of a body over the server's limit.
func tooLarge(limit int64) error {
	return newAPIError(http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "",
		"request body exceeds the server's limit of %d bytes (kiln serve --max-body)", limit)
}

// parseBody decodes a JSON request body into v.
func parseBody(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("", "the request body is empty; send a JSON object")
	}
	if !utf8.Valid(body) {
		return badRequest("", "the request body is not valid UTF-8")
	}
	if err := json.Unmarshal(body, v); err != nil {
		return jsonError(err)
	}
	return nil
}

// jsonError describes a decoding error for the client.
func jsonError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var fe *fieldError
	switch {
	case errors.As(err, &syn):
		return badRequest("", "the request body is not valid JSON: %v (at byte %d)", syn, syn.Offset)
	case errors.As(err, &typ):
		// Fields of embedded structs are reported with the struct's name.
		typ.Field = strings.TrimPrefix(strings.TrimPrefix(typ.Field, "samplingFields."), "ollamaCommon.")
		if typ.Field == "" {
			return badRequest("", "the request body must be a JSON object, not %s", typ.Value)
		}
		return badRequest(typ.Field, "field %q must be %s, not %s", typ.Field, jsonKind(typ.Type.String()), typ.Value)
	case errors.As(err, &fe):
		return badRequest(fe.field, "%v", fe)
	}
	return badRequest("", "the request body is not valid JSON: %v", err)
}

// jsonKind names a Go type as a JSON type for error messages.
func jsonKind(goType string) string {
	switch {
	case strings.HasPrefix(goType, "*"):
		return jsonKind(goType[1:])
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	case strings.HasPrefix(goType, "map["), strings.Contains(goType, "."):
		return "an object"
	case goType == "string":
		return "a string"
	case goType == "bool":
		return "a boolean"
	case strings.HasPrefix(goType, "float"):
		return "a number"
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"):
		return "an integer"
	}
	return goType
}

// fieldError is a value of the wrong shape in a field that accepts several.
type fieldError struct {
	field, msg string
}

func (e *fieldError) Error() string { return fmt.Sprintf("field %q %s", e.field, e.msg) }

// stringList is a JSON string or array of strings (OpenAI's "stop"). null
// and "" are an empty list.
type stringList []string

func (s *stringList) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*s = nil
		if one != "" {
			*s = stringList{one}
		}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return &fieldError{"stop", "must be a string or an array of strings"}
	}
	*s = nil
	for _, m := range many {
		if m != "" {
			*s = append(*s, m)
		}
	}
	return nil
}

// messageContent is a message's content: a string, null, or an array of
// parts of which kiln accepts only {"type": "text", "text": ...}.
type messageContent string

func (c *messageContent) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*c = ""
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		*c = messageContent(s)
		return nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(b, &parts); err != nil {
		return &fieldError{"content", "must be a string or an array of content parts"}
	}
	var sb strings.Builder
	for _, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return &fieldError{"content", fmt.Sprintf("has a part of type %q; this model accepts only text parts", p.Type)}
		}
		sb.WriteString(*p.Text)
	}
	*c = messageContent(sb.String())
	return nil
}
