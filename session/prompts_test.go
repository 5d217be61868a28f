package session

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/internal/testmodel"
	"github.com/kiln-llm/kiln/tokenizer"
)

func qwen3Tokenizer(t testing.TB) *tokenizer.Tokenizer {
	tok, err := tokenizer.Load("../testdata/tokenizer/qwen3")
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// checkEncode encodes text through p and compares with a plain Encode: the
// ids, and the message starts with the positions of messageStart's id.
func checkEncode(t *testing.T, p *prompts, text string) (reused int) {
	t.Helper()
	ids, marks, reused, ok := p.encode(text, math.MaxInt)
	want := p.tok.Encode(text)
	if !ok {
		t.Fatalf("encode %q: over an unbounded limit", text)
	}
	// Under a limit of its length it is the same; one token less refuses it.
	if got, _, _, ok := p.encode(text, len(want)); !ok || !slices.Equal(got, want) {
		t.Fatalf("encode %q at its own length %d: ok %v", text, len(want), ok)
	}
	if len(want) > 0 {
		if _, _, _, ok := p.encode(text, len(want)-1); ok {
			t.Fatalf("encode %q: %d tokens accepted under a limit of %d", text, len(want), len(want)-1)
		}
	}
	if !slices.Equal(ids, want) {
		t.Fatalf("encode %q:\n got %v\nwant %v (reused %d)", text, ids, want, reused)
	}
	var wantMarks []int
	for i, id := range want {
		if id == p.markID {
			wantMarks = append(wantMarks, i)
		}
	}
	if !slices.Equal(marks, wantMarks) {
		t.Fatalf("encode %q: marks %v, want %v", text, marks, wantMarks)
	}
	return reused
}

// A conversation's turns, edited and regenerated at random, tokenize as a
// plain Encode does, and every follow-up reuses the ids before the first
// message that changed.
func TestPromptReuse(t *testing.T) {
	for _, tc := range []struct {
		name string
		tok  *tokenizer.Tokenizer
	}{{"qwen3", qwen3Tokenizer(t)}, {"fixture", testmodel.Load(t, "qwen3", testmodel.Options{}).Tok}} {
		t.Run(tc.name, func(t *testing.T) {
			f := testmodel.Load(t, "qwen3", testmodel.Options{ChatTemplate: "qwen3.jinja"})
			p := newPrompts(tc.tok, 1<<20)
			if !p.reuse {
				t.Fatal("no reuse with a Qwen tokenizer")
			}
			rng := rand.New(rand.NewPCG(1, 2))
			pieces := []string{"hello", " world", "\n", "  ", "é", "e\u0301", "日本語", "<think>", "</think>", messageStart, "<|im_end|>",
				"<tool_call>", "12345", "\t", "!", " <|im_start|> ", "<|im_start", "|>", "😀"}
			say := func() string {
				var b strings.Builder
				for range 1 + rng.IntN(12) {
					b.WriteString(pieces[rng.IntN(len(pieces))])
				}
				return b.String()
			}
			render := func(msgs []chat.Message) string {
				text, err := f.Tmpl.Render(&chat.RenderInput{Messages: msgs, AddGenerationPrompt: true})
				if err != nil {
					t.Fatal(err)
				}
				return text
			}
			reusedTurns := 0
			for range 40 {
				msgs := []chat.Message{{Role: "system", Content: say()}, {Role: "user", Content: say()}}
				prev := render(msgs)
				checkEncode(t, p, prev)
				for range 6 {
					switch rng.IntN(4) {
					case 0: // an edited last user message
						msgs[len(msgs)-1].Content = say()
					case 1: // a changed system prompt
						msgs[0].Content = say()
					default: // the answer and a new message
						msgs = append(msgs, chat.Message{Role: "assistant", Content: say()}, chat.Message{Role: "user", Content: say()})
					}
					text := render(msgs)
					reused := checkEncode(t, p, text)
					// Everything before the last message start that both
					// texts hold whole comes from the earlier prompt.
					n := 0
					for n < len(prev) && n < len(text) && prev[n] == text[n] {
						n++
					}
					if cut := strings.LastIndex(text[:n], messageStart); cut > 0 {
						if want := len(p.tok.Encode(text[:cut])); reused < want {
							t.Errorf("reused %d ids, the text before the last shared message start has %d", reused, want)
						}
					}
					if reused > 0 {
						reusedTurns++
					}
					prev = text
				}
			}
			if reusedTurns == 0 {
				t.Error("no turn reused ids")
			}
		})
	}
}

// FuzzPromptReuse: a text encoded after another that shares its beginning
// gives the ids and message starts of a plain Encode.
func FuzzPromptReuse(f *testing.F) {
	tok := qwen3Tokenizer(f)
	f.Add("<|im_start|>system\nhi<|im_end|>\n<|im_start|>user\nyo", "<|im_start|>system\nhi<|im_end|>\n<|im_start|>user\nyou there")
	f.Add("a<|im_start|>b", "a<|im_start|> b<|im_start|>")
	f.Add("x <|im_start|>\n", "x <|im_start|>\n\u0301")
	f.Fuzz(func(t *testing.T, a, b string) {
		if !utf8.ValidString(a) || !utf8.ValidString(b) {
			return
		}
		p := newPrompts(tok, 1<<20)
		checkEncode(t, p, a)
		checkEncode(t, p, b)
		checkEncode(t, p, a+b)
		checkEncode(t, p, a)
	})
}
