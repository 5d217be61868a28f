package session

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/demo"
	"github.com/kiln-llm/kiln/engine"
	"github.com/kiln-llm/kiln/internal/testmodel"
	"github.com/kiln-llm/kiln/tokenizer"
)

// newSession starts an engine and its session on the fixture arch, with
// the fixture's own chat template unless opts names one.
func newSession(t testing.TB, arch string, tmpl testmodel.Options, eo engine.Options, so Options) (*Session, testmodel.Fixture) {
	t.Helper()
	f := testmodel.Load(t, arch, tmpl)
	eo.Logger = testmodel.Logger()
	e, err := engine.New(f.Model, f.Tok, eo)
	if err != nil {
		t.Fatal(err)
	}
	so.Logger = testmodel.Logger()
	s := New(e, f.Tok, f.Tmpl, so)
	t.Cleanup(func() { s.Close() })
	return s, f
}

type result struct {
	tokens          []int32
	text, reasoning string
	calls           []chat.ToolCall
	final           Event
}

func collect(st *Stream) result {
	var r result
	for {
		ev := st.Next()
		r.tokens = append(r.tokens, ev.Tokens...)
		r.text += ev.Text
		r.reasoning += ev.Reasoning
		r.calls = append(r.calls, ev.ToolCalls...)
		if ev.Done {
			r.final = ev
			return r
		}
	}
}

func generate(t testing.TB, s *Session, req *Request) result {
	t.Helper()
	st, err := s.Generate(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	r := collect(st)
	if r.final.Err != nil {
		t.Fatalf("request failed: %v", r.final.Err)
	}
	return r
}

// A chat's second turn, whose rendered prompt extends the first's, finds
// the first turn cached and answers as a cold engine does, on every
// architecture.
func TestChatTurnFromCache(t *testing.T) {
	for _, arch := range testmodel.Archs {
		t.Run(arch, func(t *testing.T) {
			t.Parallel()
			cached, _ := newSession(t, arch, testmodel.Options{}, engine.Options{SnapshotInterval: 32}, Options{})
			scratch, _ := newSession(t, arch, testmodel.Options{}, engine.Options{NoCache: true}, Options{})
			msgs := []chat.Message{{Role: "system", Content: "You are a helpful assistant."}, {Role: "user", Content: "Tell me about the sea."}}
			c1 := generate(t, cached, &Request{Messages: msgs, Sampling: engine.Sampling{MaxTokens: 10}})
			msgs = append(msgs, chat.Message{Role: "assistant", Content: c1.text}, chat.Message{Role: "user", Content: "And the mountains?"})
			c2 := generate(t, cached, &Request{Messages: msgs, Sampling: engine.Sampling{MaxTokens: 10}})
			ref := generate(t, scratch, &Request{Messages: msgs, Sampling: engine.Sampling{MaxTokens: 10}})
			if !slices.Equal(c2.tokens, ref.tokens) || c2.final.Usage.CachedTokens == 0 {
				t.Errorf("chat turn 2: cached %d tokens, %v; from scratch %v", c2.final.Usage.CachedTokens, c2.tokens, ref.tokens)
			}
		})
	}
}

// With PrepareNextTurn, a chat's next turn finds the whole conversation
// cached, the previous answer included (the template renders it differently
// from the tokens generated), and answers as a cold engine does.
func TestPrepareNextTurn(t *testing.T) {
	for _, arch := range []string{"qwen3", "qwen3next"} {
		t.Run(arch, func(t *testing.T) {
			// One engine per model: an engine owns its model's cache.
			prepared, f := newSession(t, arch, testmodel.Options{}, engine.Options{}, Options{PrepareNextTurn: true})
			plain, _ := newSession(t, arch, testmodel.Options{}, engine.Options{}, Options{})
			scratch, _ := newSession(t, arch, testmodel.Options{}, engine.Options{NoCache: true}, Options{})
			msgs := []chat.Message{{Role: "system", Content: "You are a helpful assistant who answers at length."},
				{Role: "user", Content: "Tell me about the sea, the waves, the tides and the fish that live there."}}
			var cached [2]int
			total2 := 0
			for i, s := range []*Session{prepared, plain} {
				c1 := generate(t, s, &Request{Messages: msgs, Sampling: engine.Sampling{MaxTokens: 40}})
				s.turns.Wait()
				next := append(slices.Clone(msgs), chat.Message{Role: "assistant", Content: c1.text}, chat.Message{Role: "user", Content: "And the mountains?"})
				c2 := generate(t, s, &Request{Messages: next, Sampling: engine.Sampling{MaxTokens: 10}})
				ref := generate(t, scratch, &Request{Messages: next, Sampling: engine.Sampling{MaxTokens: 10}})
				if !slices.Equal(c2.tokens, ref.tokens) {
					t.Errorf("turn 2 %v, from scratch %v", c2.tokens, ref.tokens)
				}
				cached[i] = c2.final.Usage.CachedTokens
				if i == 0 {
					// All but the new user message and the generation
					// prompt, less a partial block.
					text, err := f.Tmpl.Render(&chat.RenderInput{Messages: next, AddGenerationPrompt: true})
					if err != nil {
						t.Fatal(err)
					}
					total := len(f.Tok.Encode(text))
					total2 = total
					if want := total - len(f.Tok.Encode("And the mountains?<|im_end|>\n<|im_start|>assistant\n")) - 16; c2.final.Usage.CachedTokens < want {
						t.Errorf("turn 2 cached %d of %d prompt tokens, want at least %d", c2.final.Usage.CachedTokens, total, want)
					}
				}
			}
			if cached[0] <= cached[1] {
				t.Errorf("turn 2 cached %d tokens with the next turn prepared, %d without", cached[0], cached[1])
			}
			t.Logf("turn 2 cached %d tokens prepared, %d not (total %d)", cached[0], cached[1], total2)
		})
	}
}

// TestChatOutput feeds a reply's tokens, as the engine streams them,
// through a chat request's stream: reasoning, content and tool calls come
// apart, and a reply that called tools finishes with FinishToolCalls.
func TestChatOutput(t *testing.T) {
	f := testmodel.Load(t, "qwen3", testmodel.Options{})
	s := New(nil, f.Tok, f.Tmpl, Options{})
	_, parser, err := s.prompt(context.Background(), &Request{Messages: []chat.Message{{Role: "user", Content: "hi"}}})
	if err != nil {
		t.Fatal(err)
	}
	reply := "<think>\nlet me see\n</think>\n\nCalling.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>"
	ids := f.Tok.Encode(reply)
	events := make(chan engine.Event, len(ids)+1)
	dec := f.Tok.NewDecoder()
	for _, id := range ids {
		events <- engine.Event{Tokens: []int32{id}, Text: dec.Next(id)}
	}
	events <- engine.Event{Tokens: []int32{f.Model.Config().EOS[0]}, Text: dec.Flush(), Done: true, Finish: engine.FinishStop}
	close(events)
	r := collect(&Stream{s: s, ctx: context.Background(), events: events, parser: parser})
	if strings.TrimSpace(r.reasoning) != "let me see" || r.text != "Calling." || r.final.Finish != FinishToolCalls ||
		len(r.calls) != 1 || r.calls[0].Function.Name != "f" || string(r.calls[0].Function.Arguments) != `{"x": 1}` {
		t.Errorf("reasoning %q, content %q, finish %s, calls %+v", r.reasoning, r.text, r.final.Finish, r.calls)
	}
	if again := (&Stream{final: &r.final}).Next(); !again.Done {
		t.Error("Next after the final event did not return it again")
	}
}

// A forced tool call extends the prompt with the start of a call, which the
// parser reads as generated: the answer is a call of the named function.
func TestForceToolCall(t *testing.T) {
	s, f := newSession(t, "qwen3", testmodel.Options{ChatTemplate: "qwen3.jinja"}, engine.Options{}, Options{})
	tools := []chat.Tool{chat.Tool(`{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}`)}
	msgs := []chat.Message{{Role: "user", Content: "Weather in Paris?"}}
	er, _, err := s.prompt(context.Background(), &Request{Messages: msgs, Tools: tools, ForceToolCall: "get_weather"})
	if err != nil {
		t.Fatal(err)
	}
	if prompt := f.Tok.Decode(er.Prompt); !strings.HasSuffix(prompt, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ") {
		t.Errorf("forced prompt ends %q", prompt[max(0, len(prompt)-80):])
	}
	// The tiny model will not close the call: while it writes, the parser
	// holds everything as the call's arguments, never content.
	st, err := s.Generate(context.Background(), &Request{Messages: msgs, Tools: tools, ForceToolCall: "get_weather", Sampling: engine.Sampling{MaxTokens: 8}})
	if err != nil {
		t.Fatal(err)
	}
	for ev := st.Next(); !ev.Done; ev = st.Next() {
		if ev.Text != "" || ev.Reasoning != "" {
			t.Errorf("forced call: content %q, reasoning %q", ev.Text, ev.Reasoning)
		}
	}
}

// Requests the session cannot render fail at once, with the engine never
// seeing them.
func TestRequestErrors(t *testing.T) {
	s, _ := newSession(t, "qwen3", testmodel.Options{}, engine.Options{}, Options{})
	msgs := []chat.Message{{Role: "user", Content: "hi"}}
	for name, req := range map[string]*Request{
		"two prompts":               {PromptIDs: []int32{1}, Prompt: "x"},
		"no prompt":                 {},
		"forced call without tools": {Messages: msgs, ForceToolCall: "*"},
	} {
		if _, err := s.Generate(context.Background(), req); err == nil || !strings.HasPrefix(err.Error(), "session: ") {
			t.Errorf("%s: %v", name, err)
		}
	}
	noTemplate := New(s.eng, s.tok, nil, Options{})
	if _, err := noTemplate.Generate(context.Background(), &Request{Messages: msgs}); err == nil {
		t.Error("a conversation without a chat template accepted")
	}
	if st := s.eng.Stats(); st.PromptTokens != 0 {
		t.Errorf("the engine saw %d prompt tokens", st.PromptTokens)
	}
}

// A Suffix prompts the model in Qwen's fill-in-the-middle format when its
// vocabulary has the FIM tokens (the demo model's does), and fails with
// ErrNoFIM when it has not (the fixture's has only the chat tokens).
func TestFillInTheMiddle(t *testing.T) {
	s, f := newSession(t, "qwen3", testmodel.Options{}, engine.Options{}, Options{})
	if _, err := s.Generate(context.Background(), &Request{Prompt: "func add(", Suffix: "}\n"}); !errors.Is(err, ErrNoFIM) {
		t.Errorf("FIM without FIM tokens: %v", err)
	}
	tok, err := tokenizer.LoadFS(demo.FS())
	if err != nil {
		t.Fatal(err)
	}
	fim := New(nil, tok, f.Tmpl, Options{})
	er, _, err := fim.prompt(context.Background(), &Request{Prompt: "func add(a, b int) int {\n\treturn ", Suffix: "\n}\n"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tok.Decode(er.Prompt), "<|fim_prefix|>func add(a, b int) int {\n\treturn <|fim_suffix|>\n}\n<|fim_middle|>"; got != want {
		t.Errorf("FIM prompt %q, want %q", got, want)
	}
	if _, _, err := fim.prompt(context.Background(), &Request{PromptIDs: []int32{1}, Suffix: "x"}); err == nil {
		t.Error("a Suffix with token ids accepted")
	}
}

// A prompt over the context is refused before it is tokenized whole, and a
// conversation before it is rendered whole: an engine.ContextError (its
// prompt count a lower bound), the engine never seeing them, for an 8 MiB
// text without a space, refused with next to no work, and for one under
// the byte bound that only counting refuses.
func TestPromptOverContext(t *testing.T) {
	s, f := newSession(t, "qwen3", testmodel.Options{ChatTemplate: "qwen3.jinja"}, engine.Options{}, Options{})
	ctx, _ := s.eng.Context()
	limit := ctx - 1
	per := f.Tok.MaxTokenBytes(nil)
	if per == 0 {
		t.Fatal("the fixture's tokenizer has no bound on a token's bytes")
	}
	huge := strings.Repeat("x", 8<<20)
	counted := strings.Repeat("qz", per*limit/2)
	for name, c := range map[string]struct {
		req *Request
		max uint64 // bytes it may allocate; 0: any
	}{
		"huge prompt":          {&Request{Prompt: huge}, 1 << 20},
		"huge conversation":    {&Request{Messages: []chat.Message{{Role: "user", Content: huge}}}, 1 << 20},
		"counted prompt":       {&Request{Prompt: counted}, 0},
		"counted conversation": {&Request{Messages: []chat.Message{{Role: "user", Content: counted[:len(counted)/2]}}}, 0},
	} {
		var err error
		a := testmodel.Allocated(func() { _, err = s.Generate(context.Background(), c.req) })
		var ce *engine.ContextError
		if !errors.As(err, &ce) || !ce.AtLeast || ce.Prompt != ctx || ce.Context != ctx {
			t.Errorf("%s: %v", name, err)
		}
		if c.max > 0 && a > c.max {
			t.Errorf("%s: refusing it allocated %d KB", name, a>>10)
		}
	}
	if st := s.eng.Stats(); st.PromptTokens != 0 {
		t.Errorf("the engine saw %d prompt tokens", st.PromptTokens)
	}
	if len(f.Tok.Encode(counted[:len(counted)/2])) <= limit {
		t.Error("the counted conversation fits the context: the test proves nothing")
	}
}
