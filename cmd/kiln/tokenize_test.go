package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/demo"
	"github.com/kiln-llm/kiln/tokenizer"
)

const tokenizeTestModel = "../../testdata/tokenizer/qwen3"

func TestTokenizeCommand(t *testing.T) {
	tok, err := tokenizer.Load(tokenizeTestModel)
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{"", "hello world\n", "<|im_start|>user\n  hi  \r\n<|im_end|>", " \t\n"} {
		var out strings.Builder
		if err := tokenize([]string{"--model", tokenizeTestModel}, strings.NewReader(text), &out); err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		var got []int32
		if err := json.Unmarshal([]byte(out.String()), &got); err != nil {
			t.Fatalf("%q: output %q: %v", text, out.String(), err)
		}
		if want := tok.Encode(text); !slices.Equal(got, want) || got == nil {
			t.Errorf("%q: printed %s, want %v", text, out.String(), want)
		}
	}
}

// TestTokenizeDemo: with no --model, kiln tokenize uses the embedded model's
// tokenizer, as every other command does.
func TestTokenizeDemo(t *testing.T) {
	tok, err := tokenizer.LoadFS(demo.FS())
	if err != nil {
		t.Fatal(err)
	}
	text := "func main() {\n\tfmt.Println(\"hi\")\n}\n"
	var out strings.Builder
	if err := tokenize(nil, strings.NewReader(text), &out); err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(tok.Encode(text))
	if strings.TrimSpace(out.String()) != string(want) {
		t.Errorf("printed %s, want %s", out.String(), want)
	}
}

// kiln tokenize "text" tokenizes its argument (flags before or after it),
// not stdin.
func TestTokenizeArgument(t *testing.T) {
	tok, err := tokenizer.Load(tokenizeTestModel)
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"hello world", "--model", tokenizeTestModel}, {"--model", tokenizeTestModel, "hello", "world"}} {
		var out strings.Builder
		if err := tokenize(args, strings.NewReader("not this"), &out); err != nil {
			t.Fatal(err)
		}
		if want, _ := json.Marshal(tok.Encode("hello world")); strings.TrimSpace(out.String()) != string(want) {
			t.Errorf("%q: printed %s, want %s", args, out.String(), want)
		}
	}
}

func TestTokenizeCommandErrors(t *testing.T) {
	for _, c := range []struct {
		args       []string
		in, substr string
	}{
		{[]string{"--model", tokenizeTestModel}, "ab\xffc", "offset 2"},
		{[]string{"--model", tokenizeTestModel}, "x\xe2\x82", "offset 1"},
		{[]string{"--model", "/nonexistent"}, "x", "/nonexistent: no such file or directory"},
	} {
		var out strings.Builder
		err := tokenize(c.args, strings.NewReader(c.in), &out)
		if err == nil || !strings.Contains(err.Error(), c.substr) {
			t.Errorf("%v %q: error %v, want one containing %q", c.args, c.in, err, c.substr)
		}
	}
}
