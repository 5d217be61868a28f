package server

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kiln-llm/kiln/tokenizer"
)

// TestUnquote: a message's content decodes as encoding/json decodes it,
// escapes and surrogates (paired and alone) included, and a long one
// without the second scan.
func TestUnquote(t *testing.T) {
	for _, lit := range []string{`""`, `"plain"`, `"a\nb\tc\\d\/e\"f\b\f\r"`, `"\u00e9\u4e2d\ud83d\ude00"`, `"lone \ud800 high"`,
		`"lone \udc00 low"`, `"\ud800\u0041"`, `"\ud83d\ude00\ud83d"`, `"\u0000"`, `"naïve ☃"`} {
		var want string
		if err := json.Unmarshal([]byte(lit), &want); err != nil {
			t.Fatalf("%s: %v", lit, err)
		}
		if got, ok := unquote([]byte(lit)); !ok || got != want {
			t.Errorf("unquote(%s) = %q, %v; want %q", lit, got, ok, want)
		}
	}
	for _, bad := range []string{`"a\"`, `"\x"`, `"\u12"`, "\"tab\there\"", "\"\xff\"", `plain`, `"`} {
		if got, ok := unquote([]byte(bad)); ok {
			t.Errorf("unquote(%q) = %q: took what json.Unmarshal must judge", bad, got)
		}
	}
	var c messageContent
	long := strings.Repeat("line of text\n", 30000)
	body, _ := json.Marshal(long)
	if err := json.Unmarshal(body, &c); err != nil || string(c) != long {
		t.Errorf("a %d-byte content: %v", len(long), err)
	}
}

// FuzzUnquote: whatever encoding/json decodes as a string, unquote decodes
// the same or leaves to it; a valid UTF-8 literal it always takes.
func FuzzUnquote(f *testing.F) {
	for _, s := range []string{`"a\nb"`, `"\ud83d\ude00"`, `"\ud800"`, `"x\u00e9"`, `"<>&"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var want string
		if json.Unmarshal(b, &want) != nil {
			return
		}
		lit := []byte(strings.TrimSpace(string(b)))
		got, ok := unquote(lit)
		if ok && got != want {
			t.Fatalf("unquote(%q) = %q, json.Unmarshal %q", lit, got, want)
		}
		if !ok && utf8.Valid(lit) && len(lit) > 0 && lit[0] == '"' {
			t.Fatalf("unquote(%q) refused a valid literal", lit)
		}
		// Any text, as a client's encoder writes it.
		enc, _ := json.Marshal(want)
		if got, ok := unquote(enc); !ok || got != want {
			t.Fatalf("unquote(%s) = %q, %v; want %q", enc, got, ok, want)
		}
	})
}

// BenchmarkParseLongChat decodes a chat request of a 390 KB message, the
// size of a 100K-token conversation's history.
func BenchmarkParseLongChat(b *testing.B) {
	long := strings.Repeat("The tide rises and falls\ntwice a day along the long grey shore. ", 6000)
	body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{{"role": "system", "content": "x"}, {"role": "user", "content": long}}})
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		var r chatRequest
		if err := parseBody(body, &r); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseFollowUp decodes a chat follow-up's request as a
// multi-turn client sends it, the whole conversation each turn: histories
// of about 5K, 50K and 100K tokens of Qwen3's tokenizer (3.9 bytes a
// token of its own vocabulary's words), user messages of 150 words and
// answers of 300. It times what the handler does before the session has
// the messages: the JSON decode and the messages' conversion.
//
//	go test -run '^$' -bench ParseFollowUp ./server
func BenchmarkParseFollowUp(b *testing.B) {
	tok, err := tokenizer.Load("../testdata/tokenizer/qwen3")
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	word := func() string {
		for {
			a, c := int32(rng.IntN(50000)), int32(rng.IntN(50000))
			if w := strings.TrimSpace(tok.Decode([]int32{a, c})); w != "" && utf8.ValidString(w) && !tok.IsSpecial(a) && !tok.IsSpecial(c) {
				return w
			}
		}
	}
	text := func(n int) string {
		var sb strings.Builder
		for range n {
			sb.WriteString(word())
			sb.WriteByte(' ')
		}
		return sb.String()
	}
	for _, history := range []int{5000, 50000, 100000} {
		msgs := []map[string]string{{"role": "system", "content": "You are a helpful assistant."}}
		for size := 0; size < history*39/10; {
			u, a := text(150), text(300)
			msgs = append(msgs, map[string]string{"role": "user", "content": u}, map[string]string{"role": "assistant", "content": a})
			size += len(u) + len(a)
		}
		msgs = append(msgs, map[string]string{"role": "user", "content": text(30)})
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "stream": true, "max_tokens": 128})
		b.Run(fmt.Sprintf("history=%dK", history/1000), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				var r chatRequest
				if err := parseBody(body, &r); err != nil {
					b.Fatal(err)
				}
				if _, err := convertMessages(r.Messages); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
