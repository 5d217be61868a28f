package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf16"
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
	if s, ok := unquote(b); ok {
		*c = messageContent(s)
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

// unquote decodes a JSON string literal as encoding/json does (a surrogate
// outside a pair is U+FFFD), or reports false for what is not one it can
// take as it is (invalid UTF-8, a raw control character, a malformed
// escape: json.Unmarshal's to judge). The decoder has checked the whole
// body before a field's UnmarshalJSON sees its bytes; decoding them again
// through json.Unmarshal scanned a message's content twice more, and a
// 100K-token conversation's 390 KB body took 8.6 ms to decode on the dev
// machine.
func unquote(b []byte) (string, bool) {
	if len(b) < 2 || b[0] != '"' || b[len(b)-1] != '"' {
		return "", false
	}
	b = b[1 : len(b)-1]
	// Escapes are ASCII: the literal's bytes tell the validity of all.
	if !utf8.Valid(b) || !noControl(b) {
		return "", false
	}
	i := bytes.IndexByte(b, '\\')
	if i < 0 {
		return string(b), true
	}
	out := make([]byte, 0, len(b))
	for i >= 0 {
		out, b = append(out, b[:i]...), b[i:]
		if len(b) < 2 {
			return "", false
		}
		e := b[1]
		switch k := strings.IndexByte("\"\\/bfnrt", e); {
		case k >= 0:
			out, b = append(out, "\"\\/\b\f\n\r\t"[k]), b[2:]
		case e == 'u':
			r, ok := hex4(b[2:])
			if !ok {
				return "", false
			}
			b = b[6:]
			if utf16.IsSurrogate(r) {
				// Paired with the next escape, or U+FFFD alone.
				r2 := rune(-1)
				if len(b) >= 6 && b[0] == '\\' && b[1] == 'u' {
					r2, _ = hex4(b[2:])
				}
				if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
					r, b = dec, b[6:]
				} else {
					r = utf8.RuneError
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			return "", false
		}
		i = bytes.IndexByte(b, '\\')
	}
	return string(append(out, b...)), true
}

// hex4 reads the four hex digits of a \u escape.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// noControl reports whether b has no control character, which JSON
// strings hold only escaped.
func noControl(b []byte) bool {
	for _, c := range b {
		if c < 0x20 {
			return false
		}
	}
	return true
}
