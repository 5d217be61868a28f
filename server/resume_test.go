package server

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/kiln-llm/kiln/engine"
)

// plainDecode is what a chat body decodes to without kept bodies.
func plainDecode(body []byte) (chatRequest, error) {
	var r chatRequest
	err := parseBody(body, &r)
	return r, err
}

// resumeCheck decodes body through c and checks it against plainDecode:
// the same value, or an error with the same message.
func resumeCheck(t *testing.T, c *resumable[chatRequest, wireMessage], what string, body []byte) {
	t.Helper()
	var got chatRequest
	keep, gerr := c.decode(body, &got)
	if keep != nil {
		keep()
	}
	want, werr := plainDecode(body)
	if (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) {
		t.Fatalf("%s: error %v, want %v", what, gerr, werr)
	}
	if gerr == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: decoded\n%+v\nwant\n%+v", what, got, want)
	}
}

func testResumable() *resumable[chatRequest, wireMessage] {
	c := newResumable(func(r *chatRequest) *[]wireMessage { return &r.Messages })
	c.minBody = 0
	return c
}

// TestResumeFollowUps decodes a conversation's bodies turn by turn, as a
// client sends them (the whole history each time, fields after the
// messages, some pretty-printed), and bodies that must not resume or must
// fail as a plain decode fails.
func TestResumeFollowUps(t *testing.T) {
	c := testResumable()
	rng := rand.New(rand.NewPCG(1, 2))
	words := func(n int) string {
		w := make([]string, n)
		for i := range w {
			w[i] = []string{"tide", "shore", "grey", "\"quoted\"", "é", "line\nbreak", "\\", "tab\t"}[rng.IntN(8)]
		}
		return strings.Join(w, " ")
	}
	msgs := []map[string]any{{"role": "system", "content": "You are terse."}}
	bodyOf := func(msgs []map[string]any, pretty bool) []byte {
		v := map[string]any{"model": "m", "messages": msgs, "max_tokens": 8, "temperature": 0}
		var b []byte
		if pretty {
			b, _ = json.MarshalIndent(v, "", "  ")
		} else {
			b, _ = json.Marshal(v)
		}
		return b
	}
	for turn := range 8 {
		msgs = append(msgs, map[string]any{"role": "user", "content": words(50)})
		if turn == 5 { // content parts and a tool call with empty arguments
			msgs = append(msgs, map[string]any{"role": "assistant", "content": nil, "tool_calls": []map[string]any{
				{"id": "c1", "type": "function", "function": map[string]any{"name": "f"}}}},
				map[string]any{"role": "tool", "tool_call_id": "c1", "content": []map[string]any{{"type": "text", "text": words(5)}}})
		}
		before := c.hits
		resumeCheck(t, c, fmt.Sprintf("turn %d", turn), bodyOf(msgs, turn%3 == 2))
		if turn > 0 && turn%3 != 2 && turn%3 != 0 && c.hits != before+1 {
			t.Errorf("turn %d did not resume from the turn before", turn)
		}
		msgs = append(msgs, map[string]any{"role": "assistant", "content": words(30)})
	}
	if c.hits == 0 {
		t.Fatal("no body resumed")
	}
	base := string(bodyOf(msgs, false))
	i := strings.LastIndex(base, `]`) // the messages array's end
	for _, tc := range []struct{ what, body string }{
		{"an edited first message", strings.Replace(base, "You are terse.", "You are verbose.", 1)},
		{"a message added", base[:i] + `,{"role":"user","content":"more"}` + base[i:]},
		{"pretty tail", base[:i] + ",\n  {\"role\": \"user\",\n \"content\": \"x\"}\n" + base[i:]},
		{"a trailing comma", base[:i] + `,` + base[i:]},
		{"a comma and white space before the end", base[:i] + ", \n" + base[i:]},
		{"two commas", base[:i] + `,,{"role":"user","content":"x"}` + base[i:]},
		{"a second messages key", base[:len(base)-1] + `,"messages":[{"role":"user","content":"other"}]}`},
		{"a second Messages key", base[:len(base)-1] + `,"MESSAGES":[{"role":"user","content":"other"}]}`},
		{"messages null after", base[:len(base)-1] + `,"messages":null}`},
		{"truncated", base[:len(base)-3]},
		{"cut inside the array", base[:i]},
		{"invalid UTF-8 after", base[:i] + `,{"role":"user","content":"` + "\xff" + `"}` + base[i:]},
		{"a wrong type after", base[:i] + `,{"role":"user","content":5}` + base[i:]},
		{"a number in the array", base[:i] + `,7` + base[i:]},
		{"the same body", base},
		{"only the array's end changed", base[:i] + ` ` + base[i:]},
		{"another field after changed", strings.Replace(base, `"temperature":0`, `"temperature":"hot"`, 1)},
	} {
		resumeCheck(t, c, tc.what, []byte(tc.body))
	}
}

// TestResumeBudget keeps bodies within the budget, evicting the oldest;
// bodies of many empty messages count what their messages take.
func TestResumeBudget(t *testing.T) {
	c := testResumable()
	c.budget = 4000
	for n := range 40 {
		body := fmt.Sprintf(`{"messages":[{"role":"user","content":%q}]}`, strings.Repeat("x", 100+n*10))
		if n%2 == 1 {
			body = `{"messages":[` + strings.Repeat(`{"role":"user"},`, n) + `{"role":"user"}]}`
		}
		resumeCheck(t, c, "body", []byte(body))
		total := 0
		for _, e := range c.recent {
			total += e.size()
		}
		if total != c.bytes || c.bytes > c.budget {
			t.Fatalf("kept %d bytes (counted %d), budget %d", total, c.bytes, c.budget)
		}
	}
}

// TestResumeConcurrent decodes follow-ups of one conversation from many
// goroutines (under -race: kept messages are shared, never written).
func TestResumeConcurrent(t *testing.T) {
	c := testResumable()
	msgs := []map[string]any{{"role": "user", "content": strings.Repeat("a b ", 500)}}
	var bodies [][]byte
	for i := range 6 {
		msgs = append(msgs, map[string]any{"role": "assistant", "content": fmt.Sprint("answer ", i),
			"tool_calls": []map[string]any{{"function": map[string]any{"name": "f"}}}},
			map[string]any{"role": "user", "content": fmt.Sprint("question ", i)})
		b, _ := json.Marshal(map[string]any{"messages": msgs})
		bodies = append(bodies, b)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 40 {
				var r chatRequest
				keep, err := c.decode(bodies[(g+i)%len(bodies)], &r)
				if err != nil {
					t.Error(err)
					return
				}
				keep()
				if _, err := convertMessages(r.Messages); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, b := range bodies {
		resumeCheck(t, c, "after", b)
	}
}

// FuzzResume decodes a body after another was kept: always what a plain
// decode gives.
func FuzzResume(f *testing.F) {
	f.Add(`{"messages":[{"role":"user","content":"a"}]}`, `{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}`)
	f.Add(`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"}],"n":1}`, `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"} , ],"n":1}`)
	f.Add(`{"messages":[{"role":"user","content":"a"}]}`, `{"messages":[{"role":"user","content":"a"}],"Messages":[]}`)
	f.Add(`{"messages":[{"role":"user","content":"a"}]}`, `{"messages":[{"role":"user","content":"a"}`)
	f.Fuzz(func(t *testing.T, prev, next string) {
		c := testResumable()
		var r chatRequest
		if keep, _ := c.decode([]byte(prev), &r); keep != nil {
			keep()
		}
		resumeCheck(t, c, "next", []byte(next))
	})
}

// TestResumeServer holds conversations with a server that resumes every
// chat body and one that resumes none, through OpenAI's API and Ollama's:
// the same answers, and the first resumed its follow-ups.
func TestResumeServer(t *testing.T) {
	servers := []*testServer{startServer(t, Options{}, engine.Options{}), startServer(t, Options{}, engine.Options{})}
	servers[0].srv.chats.minBody, servers[0].srv.ollamaChats.minBody = 0, 0
	var answers, ollama [2][]string
	for i, ts := range servers {
		c := ts.client()
		msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("Answer briefly.")}
		omsgs := []map[string]string{{"role": "system", "content": "Answer briefly."}}
		for turn := range 3 {
			q := fmt.Sprintf("Name a colour, then a number above %d.", turn)
			msgs = append(msgs, openai.UserMessage(q))
			resp, err := c.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
				Model: testModel, Messages: msgs, MaxTokens: openai.Int(12), Temperature: openai.Float(0)})
			if err != nil {
				t.Fatal(err)
			}
			a := resp.Choices[0].Message.Content
			answers[i] = append(answers[i], a)
			msgs = append(msgs, openai.AssistantMessage(a))

			omsgs = append(omsgs, map[string]string{"role": "user", "content": q})
			body, _ := json.Marshal(map[string]any{"model": testModel, "messages": omsgs, "stream": false,
				"options": map[string]any{"temperature": 0, "num_predict": 12}})
			status, _, out := ollamaPost(t, ts.url, "/api/chat", string(body))
			if status != 200 || len(out) != 1 {
				t.Fatalf("ollama chat: %d %v", status, out)
			}
			oa, _ := out[0]["message"].(map[string]any)["content"].(string)
			ollama[i] = append(ollama[i], oa)
			omsgs = append(omsgs, map[string]string{"role": "assistant", "content": oa})
		}
	}
	if !reflect.DeepEqual(answers[0], answers[1]) || !reflect.DeepEqual(ollama[0], ollama[1]) {
		t.Errorf("answers %q and %q with resumed bodies, %q and %q without", answers[0], ollama[0], answers[1], ollama[1])
	}
	if h, oh := servers[0].srv.chats.hits, servers[0].srv.ollamaChats.hits; h != 2 || oh != 2 {
		t.Errorf("%d OpenAI and %d Ollama follow-ups resumed, want 2 each", h, oh)
	}
	if h, oh := servers[1].srv.chats.hits, servers[1].srv.ollamaChats.hits; h != 0 || oh != 0 {
		t.Errorf("the server without kept bodies resumed %d and %d", h, oh)
	}
	// A body the engine refuses (over the context) is not kept.
	c := servers[0].srv.chats
	kept := len(c.recent)
	_, err := servers[0].client().Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: testModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("tide ", 20000))}})
	if err == nil || len(c.recent) != kept {
		t.Errorf("a prompt over the context: %v; %d bodies kept, %d before", err, len(c.recent), kept)
	}
}

// TestResumeReplaces keeps one body a conversation: a follow-up that has
// all of a kept body's messages takes its place.
func TestResumeReplaces(t *testing.T) {
	c := testResumable()
	msgs := []map[string]string{{"role": "user", "content": "first"}}
	for turn := range 5 {
		b, _ := json.Marshal(map[string]any{"messages": msgs})
		resumeCheck(t, c, fmt.Sprint("turn ", turn), b)
		if len(c.recent) != 1 {
			t.Fatalf("turn %d: %d bodies kept, want 1", turn, len(c.recent))
		}
		msgs = append(msgs, map[string]string{"role": "assistant", "content": "answer"}, map[string]string{"role": "user", "content": "next"})
	}
	if c.hits != 4 {
		t.Errorf("%d follow-ups resumed, want 4", c.hits)
	}
}
