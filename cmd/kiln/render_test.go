package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runRender runs "kiln render" (on the embedded demo model when dir is "")
// with stdin from a string, returning stdout.
func runRender(t *testing.T, dir, request string) (string, error) {
	t.Helper()
	in := filepath.Join(t.TempDir(), "in.json")
	out := filepath.Join(t.TempDir(), "out.txt")
	if err := os.WriteFile(in, []byte(request), 0o644); err != nil {
		t.Fatal(err)
	}
	stdin, _ := os.Open(in)
	stdout, _ := os.Create(out)
	oldIn, oldOut := os.Stdin, os.Stdout
	os.Stdin, os.Stdout = stdin, stdout
	var args []string
	if dir != "" {
		args = []string{"--model", dir}
	}
	err := render(args)
	os.Stdin, os.Stdout = oldIn, oldOut
	stdin.Close()
	stdout.Close()
	got, _ := os.ReadFile(out)
	return string(got), err
}

func TestRender(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("..", "..", "testdata", "chat", "qwen3.8.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	quoted, _ := json.Marshal(string(src))
	// A directory with only tokenizer files, the template inside the config.
	cfg := `{"eos_token": "<|im_end|>", "chat_template": ` + string(quoted) + `}`
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := runRender(t, dir, `{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": false}}`)
	want := "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
	if err != nil || got != want {
		t.Fatalf("got %q, %v\nwant %q", got, err, want)
	}
	got, err = runRender(t, dir, `{"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": false}`)
	if err != nil || !strings.HasSuffix(got, "<|im_start|>user\nhi<|im_end|>\n") {
		t.Fatalf("without the generation prompt: got %q, %v", got, err)
	}
	if _, err := runRender(t, dir, `{"messages": [{"role": "system", "content": "s"}]}`); err == nil || err.Error() != "No user query found in messages." {
		t.Fatalf("template error: got %v", err)
	}
	if _, err := runRender(t, dir, `{"messages": [`); err == nil {
		t.Fatal("bad JSON: want an error")
	}
}

// TestRenderDemo: with no --model, kiln render uses the embedded model's
// template, whose thinking is off unless a request turns it on.
func TestRenderDemo(t *testing.T) {
	got, err := runRender(t, "", `{"messages":[{"role":"user","content":"hi"}]}`)
	if err != nil {
		t.Fatal(err)
	}
	if want := "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"; got != want {
		t.Errorf("rendered %q, want %q", got, want)
	}
}
