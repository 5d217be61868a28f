package session

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/tokenizer"
)

// TestMeasureFollowUpPrompt measures the host work of a chat follow-up's
// prompt after long histories, with Qwen3's tokenizer and chat template:
// rendering the conversation and tokenizing it, in full and reusing the
// previous turn's ids. It runs only when
// KILN_SESSION_MEASURE is set:
//
//	KILN_SESSION_MEASURE=1 go test -run MeasureFollowUpPrompt -v ./session
func TestMeasureFollowUpPrompt(t *testing.T) {
	if os.Getenv("KILN_SESSION_MEASURE") == "" {
		t.Skip("set KILN_SESSION_MEASURE=1 to measure")
	}
	tok, err := tokenizer.Load("../testdata/tokenizer/qwen3")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("../testdata/chat/qwen3.jinja")
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := chat.ParseTemplate(string(src))
	if err != nil {
		t.Fatal(err)
	}
	words := vocabWords(tok, 20000)
	next := 0
	text := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteString(words[next%len(words)])
			b.WriteByte(' ')
			next++
		}
		return b.String()
	}
	best := func(f func()) time.Duration {
		d := time.Duration(1 << 62)
		for range 5 {
			start := time.Now()
			f()
			d = min(d, time.Since(start))
		}
		return d
	}
	for _, history := range []int{2000, 20000, 100000} {
		msgs := []chat.Message{{Role: "system", Content: "You are a helpful assistant."}}
		for {
			msgs = append(msgs, chat.Message{Role: "user", Content: text(150)}, chat.Message{Role: "assistant", Content: text(300)})
			if s, _ := tmpl.Render(&chat.RenderInput{Messages: msgs}); len(tok.Encode(s)) >= history {
				break
			}
		}
		msgs = append(msgs, chat.Message{Role: "user", Content: text(30)})
		in := &chat.RenderInput{Messages: msgs, AddGenerationPrompt: true}
		var prompt string
		render := best(func() { prompt, _ = tmpl.Render(in) })
		var ids []int32
		encode := best(func() { ids = tok.Encode(prompt) })
		// The previous turn's prompt, tokenized then; the follow-up reuses
		// its ids up to the answer.
		prev, err := tmpl.Render(&chat.RenderInput{Messages: msgs[:len(msgs)-2], AddGenerationPrompt: true})
		if err != nil {
			t.Fatal(err)
		}
		reuse, reused := time.Duration(1<<62), 0
		for range 5 {
			p := newPrompts(tok, promptCacheBytes)
			p.encode(prev, math.MaxInt)
			start := time.Now()
			_, _, reused, _ = p.encode(prompt, math.MaxInt)
			reuse = min(reuse, time.Since(start))
		}
		fmt.Printf("history %6d tokens (%3d messages, %6d bytes): render %6.2f ms, tokenize %6.2f ms, tokenize after the previous turn %6.3f ms (%d ids reused)\n",
			len(ids), len(msgs), len(prompt), ms(render), ms(encode), ms(reuse), reused)
	}
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// vocabWords returns n words made of the tokenizer's own tokens (two of
// its first 50000 ordinary ids each): text of the byte mix it was trained
// on, as long as wanted.
func vocabWords(tok *tokenizer.Tokenizer, n int) []string {
	rng := rand.New(rand.NewPCG(1, 2))
	words := make([]string, 0, n)
	for len(words) < n {
		a, b := int32(rng.IntN(50000)), int32(rng.IntN(50000))
		if w := strings.TrimSpace(tok.Decode([]int32{a, b})); w != "" && utf8.ValidString(w) && !tok.IsSpecial(a) && !tok.IsSpecial(b) {
			words = append(words, w)
		}
	}
	return words
}
