package session

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/internal/testmodel"
	"github.com/kiln-llm/kiln/tokenizer"
)

// followUpConversation is a chat of at least history tokens of tok
// (vocabWords: user messages of 150 words, answers of 300) rendered by
// tmpl, then a new user message: the messages of the previous turn's
// request are msgs[:len(msgs)-2].
func followUpConversation(tb testing.TB, tok *tokenizer.Tokenizer, tmpl *chat.Template, history int) []chat.Message {
	tb.Helper()
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
	msgs := []chat.Message{{Role: "system", Content: "You are a helpful assistant."}}
	for {
		msgs = append(msgs, chat.Message{Role: "user", Content: text(150)}, chat.Message{Role: "assistant", Content: text(300)})
		s, err := tmpl.Render(&chat.RenderInput{Messages: msgs})
		if err != nil {
			tb.Fatal(err)
		}
		if len(tok.Encode(s)) >= history {
			break
		}
	}
	return append(msgs, chat.Message{Role: "user", Content: text(30)})
}

// qwen3TextSession is a session without an engine on Qwen3's tokenizer and
// chat template: the text side of a request alone.
func qwen3TextSession(tb testing.TB) *Session {
	tb.Helper()
	tok := qwen3Tokenizer(tb)
	src, err := os.ReadFile("../testdata/chat/qwen3.jinja")
	if err != nil {
		tb.Fatal(err)
	}
	tmpl, err := chat.ParseTemplate(string(src))
	if err != nil {
		tb.Fatal(err)
	}
	return New(nil, tok, tmpl, Options{})
}

// BenchmarkFollowUp measures the host work of a chat follow-up's prompt
// after histories of about 5K, 50K and 100K tokens (Qwen3's tokenizer and
// chat template), stage by stage: rendering the conversation, tokenizing it
// after the previous turn's prompt (its ids reused up to the last answer),
// the whole of it as Generate does it before the engine (prompt), and the
// next turn's preparation that runs in the background after the answer.
//
//	go test -run '^$' -bench FollowUp -benchtime 20x ./session
func BenchmarkFollowUp(b *testing.B) {
	s := qwen3TextSession(b)
	for _, history := range []int{5000, 50000, 100000} {
		followUpStages(b, s, fmt.Sprintf("history=%dK", history/1000), followUpConversation(b, s.tok, s.tmpl, history))
	}
}

// BenchmarkFollowUpDocument is BenchmarkFollowUp's stages for a
// conversation about a document, as kiln bench serve --dataset multiturn
// --history-len N sends it: a first message of N words (750, 13,000 and
// 37,300: about 2K, 35K and 100K tokens with the 512-token test vocabulary
// of the GPU runs) and four turns of 32 words.
//
//	go test -run '^$' -bench FollowUpDocument -benchtime 200x ./session
func BenchmarkFollowUpDocument(b *testing.B) {
	s := qwen3TextSession(b)
	words := vocabWords(s.tok, 20000)
	text := func(n, from int) string {
		var sb strings.Builder
		for i := range n {
			sb.WriteString(words[(from+7*i)%len(words)])
			sb.WriteByte(' ')
		}
		return sb.String()
	}
	for _, n := range []int{750, 13000, 37300} {
		msgs := []chat.Message{{Role: "user", Content: text(n+32, 1)}}
		for t := range 4 {
			role := "assistant"
			if t%2 == 1 {
				role = "user"
			}
			msgs = append(msgs, chat.Message{Role: role, Content: text(32, t+2)})
		}
		followUpStages(b, s, fmt.Sprintf("words=%d", n), msgs)
	}
}

// followUpStages runs the stages of a follow-up whose request is msgs
// (its previous turn's: msgs[:len(msgs)-2]) as sub-benchmarks of name.
func followUpStages(b *testing.B, s *Session, name string, msgs []chat.Message) {
	req := &Request{Messages: msgs}
	prev := &chat.RenderInput{Messages: msgs[:len(msgs)-2], AddGenerationPrompt: true}
	in := func() *chat.RenderInput {
		return &chat.RenderInput{Messages: msgs, AddGenerationPrompt: true}
	}
	b.Run(name+"/render", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.render(context.Background(), in(), math.MaxInt, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	prevText, err := s.render(context.Background(), prev, math.MaxInt, nil)
	if err != nil {
		b.Fatal(err)
	}
	text, err := s.render(context.Background(), in(), math.MaxInt, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run(name+"/tokenize", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			p := newPrompts(s.tok, promptCacheBytes)
			p.encode(prevText, math.MaxInt)
			b.StartTimer()
			p.encode(text, math.MaxInt)
		}
	})
	b.Run(name+"/prompt", func(b *testing.B) {
		for range b.N {
			b.StopTimer()
			s.prompts = newPrompts(s.tok, promptCacheBytes)
			s.prompts.encode(prevText, math.MaxInt)
			b.StartTimer()
			if _, _, err := s.prompt(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
	c := &turn{messages: msgs}
	c.content.WriteString("The answer of the follow-up, as it streamed.")
	b.Run(name+"/nextturn", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.nextTurn(c); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestMeasureFollowUpTTFT measures chat follow-ups on the hybrid fixture
// (qwen3next, its context raised) after long histories, as a multi-turn
// benchmark sends them: each turn right after the previous answer, with
// and without the next turn prepared. It splits the time to the first
// token into the session's work before the engine (rendering, tokenizing)
// and the engine's, whose passes it counts. Histories are in the fixture
// tokenizer's tokens (about 2.2 bytes each, Qwen3's 3.9); the prefill of
// the first turn grows with their square, so it runs only when
// KILN_SESSION_MEASURE is set (KILN_MEASURE_HISTORY=n,... for others):
//
//	KILN_SESSION_MEASURE=1 go test -run MeasureFollowUpTTFT -v ./session
func TestMeasureFollowUpTTFT(t *testing.T) {
	if os.Getenv("KILN_SESSION_MEASURE") == "" {
		t.Skip("set KILN_SESSION_MEASURE=1 to measure")
	}
	histories := []int{2000, 8000, 16000}
	if v := os.Getenv("KILN_MEASURE_HISTORY"); v != "" {
		histories = histories[:0]
		for _, f := range strings.Split(v, ",") {
			var n int
			if _, err := fmt.Sscan(f, &n); err != nil {
				t.Fatal(err)
			}
			histories = append(histories, n)
		}
	}
	for _, prepare := range []bool{false, true} {
		for _, history := range histories {
			f := testmodel.Load(t, "qwen3next", testmodel.Options{ChatTemplate: "qwen3.jinja"})
			f.Model.Config().ContextLength = 1 << 17
			e, err := engine.New(f.Model, f.Tok, engine.Options{Logger: testmodel.Logger(), KVMemory: 1 << 30})
			if err != nil {
				t.Fatal(err)
			}
			s := New(e, f.Tok, f.Tmpl, Options{PrepareNextTurn: prepare, Logger: testmodel.Logger()})
			msgs := followUpConversation(t, f.Tok, f.Tmpl, history)
			msgs = msgs[:len(msgs)-2]
			kwargs := map[string]any{"enable_thinking": false}
			var prompt, first, steps []time.Duration
			var passes []int64
			var cached, total int
			for turn := range 6 {
				before := e.Stats()
				start := time.Now()
				st, err := s.Generate(context.Background(), &Request{Messages: msgs, TemplateKwargs: kwargs,
					Sampling: engine.Sampling{MaxTokens: 16, IgnoreEOS: true}})
				if err != nil {
					t.Fatal(err)
				}
				submitted := time.Now()
				var answer strings.Builder
				var ttft time.Duration
				var after engine.Stats
				for {
					ev := st.Next()
					if ttft == 0 && len(ev.Tokens) > 0 {
						ttft = time.Since(submitted)
						after = e.Stats()
					}
					answer.WriteString(ev.Text)
					if ev.Done {
						if ev.Err != nil {
							t.Fatal(ev.Err)
						}
						cached, total = ev.Usage.CachedTokens, ev.Usage.PromptTokens
						break
					}
				}
				if turn > 0 { // the first turn computes the history
					prompt = append(prompt, submitted.Sub(start))
					first = append(first, ttft)
					steps = append(steps, after.StepTime-before.StepTime)
					passes = append(passes, after.Steps-before.Steps)
				}
				msgs = append(msgs, chat.Message{Role: "assistant", Content: answer.String()},
					chat.Message{Role: "user", Content: fmt.Sprintf("And what about the %d-th point you made, in a few words?", turn)})
			}
			slices.Sort(prompt)
			slices.Sort(first)
			slices.Sort(steps)
			slices.Sort(passes)
			m := len(prompt) / 2
			t.Logf("prepared %-5v history %6d tokens (last %d, %d cached): prompt %6.2f ms, engine to first token %6.2f ms (passes %d, %6.2f ms): TTFT %6.2f ms (medians)",
				prepare, history, total, cached, ms(prompt[m]), ms(first[m]), passes[m], ms(steps[m]), ms(prompt[m]+first[m]))
			s.Close()
		}
	}
}
