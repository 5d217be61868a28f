package session

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/internal/testmodel"
)

// A follow-up that goes another way than the conversation computed so far
// (the first turn and the next turn prepared after it: an answer the client
// sends back in another form or edited, a regenerated reply, an edited user
// message, a changed system prompt) reuses the computed tokens up to where
// it diverges, and answers as a cold engine does. Dense models reuse every whole block before the divergence; hybrid
// models resume from the state at the message start before it, or at the
// last block boundary of the first turn's prompt: at most a block before the
// divergence when it is in the last block of a message start or of that
// prompt's end (the case of an answer sent back without its empty reasoning
// block, which Qwen3's template adds to the prompt when thinking is off).
func TestDivergenceReuse(t *testing.T) {
	const bs = 16
	system := "You are a helpful assistant who answers at length about the sea and its creatures."
	first := []chat.Message{{Role: "system", Content: system},
		{Role: "user", Content: "Tell me about the sea, the waves, the tides and the fish that live there."}}
	kwargs := map[string]any{"enable_thinking": false}
	for _, arch := range []string{"qwen3", "qwen3next"} {
		t.Run(arch, func(t *testing.T) {
			tmpl := testmodel.Options{ChatTemplate: "qwen3.jinja"}
			cold, _ := newSession(t, arch, tmpl, engine.Options{NoCache: true}, Options{})
			for _, tc := range []struct {
				name string
				next func(answer string) []chat.Message
				// hybrid resumes at the last message start at or before the
				// divergence (true), or within a block of it (false)
				atMessage bool
			}{
				{"answer as sent", func(a string) []chat.Message {
					return append(slices.Clone(first), chat.Message{Role: "assistant", Content: a}, chat.Message{Role: "user", Content: "And the mountains?"})
				}, false},
				{"reasoning as content", func(a string) []chat.Message {
					return append(slices.Clone(first), chat.Message{Role: "assistant", Content: "<think>\n\n</think>\n\n" + a}, chat.Message{Role: "user", Content: "And the mountains?"})
				}, false},
				{"edited answer", func(a string) []chat.Message {
					return append(slices.Clone(first), chat.Message{Role: "assistant", Content: a[:len(a)/2] + " (edited) " + a[len(a)/2:]}, chat.Message{Role: "user", Content: "And the mountains?"})
				}, true},
				{"regenerated", func(string) []chat.Message { return slices.Clone(first) }, false},
				{"edited user message", func(string) []chat.Message {
					m := slices.Clone(first)
					m[1].Content = strings.Replace(m[1].Content, "tides", "currents", 1)
					return m
				}, true},
				{"changed system prompt", func(string) []chat.Message {
					m := slices.Clone(first)
					m[0].Content = strings.Replace(m[0].Content, "creatures", "plants", 1)
					return m
				}, true},
			} {
				t.Run(tc.name, func(t *testing.T) {
					s, f := newSession(t, arch, tmpl, engine.Options{}, Options{PrepareNextTurn: true})
					r1 := generate(t, s, &Request{Messages: first, TemplateKwargs: kwargs, Sampling: engine.Sampling{MaxTokens: 40}})
					s.turns.Wait()
					p1, _, err := s.prompt(context.Background(), &Request{Messages: first, TemplateKwargs: kwargs})
					if err != nil {
						t.Fatal(err)
					}
					c := &turn{messages: first, kwargs: kwargs}
					c.content.WriteString(r1.text)
					prepared, err := s.nextTurn(c)
					if err != nil {
						t.Fatal(err)
					}
					req := &Request{Messages: tc.next(r1.text), TemplateKwargs: kwargs, Sampling: engine.Sampling{MaxTokens: 10}}
					p2, _, err := s.prompt(context.Background(), req)
					if err != nil {
						t.Fatal(err)
					}
					// Where the prompt leaves what was computed: the first
					// turn (its answer's last token is never fed) or the
					// prepared next turn.
					d := 0
					for _, computed := range [][]int32{append(slices.Clone(p1.Prompt), r1.tokens[:len(r1.tokens)-1]...), prepared.Prompt} {
						n := 0
						for n < len(computed) && n < len(p2.Prompt) && computed[n] == p2.Prompt[n] {
							n++
						}
						d = max(d, n)
					}
					d = min(d, len(p2.Prompt)-1) // the last prompt token is always computed
					want := d / bs * bs
					if f.Model.Hybrid() {
						mark := 0
						for _, c := range p1.Checkpoints {
							if c <= d {
								mark = c
							}
						}
						if want = d - bs + 1; tc.atMessage || want < mark {
							want = mark
						}
					}
					r2 := generate(t, s, req)
					ref := generate(t, cold, req)
					if !slices.Equal(r2.tokens, ref.tokens) {
						t.Errorf("from cache %v, cold %v", r2.tokens, ref.tokens)
					}
					got := r2.final.Usage.CachedTokens
					if got < want || got > d {
						t.Errorf("diverged at token %d of %d: %d cached, want at least %d", d, len(p2.Prompt), got, want)
					}
					t.Logf("diverged at token %d of %d: %d cached", d, len(p2.Prompt), got)
				})
			}
		})
	}
}

// A follow-up's user message changed after it was answered (a client that
// edits its last question and sends it again) resumes where the prepared
// start of that message ends: the conversation moving on a turn (the next
// turn prepared after the follow-up) keeps the state there. Hybrid models
// resume exactly there, dense ones at its last whole block.
func TestEditedFollowUpReuse(t *testing.T) {
	const bs = 16
	kwargs := map[string]any{"enable_thinking": false}
	first := []chat.Message{{Role: "system", Content: "You are a helpful assistant who answers at length about the sea."},
		{Role: "user", Content: "Tell me about the sea, the waves, the tides and the fish that live there."}}
	for _, arch := range []string{"qwen3", "qwen3next"} {
		t.Run(arch, func(t *testing.T) {
			tmpl := testmodel.Options{ChatTemplate: "qwen3.jinja"}
			cold, _ := newSession(t, arch, tmpl, engine.Options{NoCache: true}, Options{})
			s, f := newSession(t, arch, tmpl, engine.Options{}, Options{PrepareNextTurn: true})
			r1 := generate(t, s, &Request{Messages: first, TemplateKwargs: kwargs, Sampling: engine.Sampling{MaxTokens: 30}})
			s.turns.Wait()
			c := &turn{messages: first, kwargs: kwargs}
			c.content.WriteString(r1.text)
			prepared, err := s.nextTurn(c) // what every second turn starts with
			if err != nil {
				t.Fatal(err)
			}
			ask := func(q string) *Request {
				m := append(slices.Clone(first), chat.Message{Role: "assistant", Content: r1.text}, chat.Message{Role: "user", Content: q})
				return &Request{Messages: m, TemplateKwargs: kwargs, Sampling: engine.Sampling{MaxTokens: 10}}
			}
			generate(t, s, ask("And the mountains, and the forests on them?"))
			s.turns.Wait()
			edited := ask("And the rivers?")
			r3 := generate(t, s, edited)
			if ref := generate(t, cold, edited); !slices.Equal(r3.tokens, ref.tokens) {
				t.Errorf("from cache %v, cold %v", r3.tokens, ref.tokens)
			}
			want := len(prepared.Prompt)
			if !f.Model.Hybrid() {
				want = want / bs * bs
			}
			if got := r3.final.Usage.CachedTokens; got < want {
				t.Errorf("the edited follow-up reused %d tokens, want at least %d (the prepared start of its message)", got, want)
			}
		})
	}
}
