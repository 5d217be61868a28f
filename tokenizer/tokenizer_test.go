package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

func TestAPI(t *testing.T) {
	tok := loadTestTokenizer(t, "qwen3")
	id, ok := tok.TokenID("<|im_end|>")
	if !ok || !tok.IsSpecial(id) || tok.Token(id) != "<|im_end|>" {
		t.Fatalf("<|im_end|>: id %d ok %v special %v token %q", id, ok, tok.IsSpecial(id), tok.Token(id))
	}
	think, ok := tok.TokenID("<think>")
	if !ok || tok.IsSpecial(think) {
		t.Fatalf("<think> should be a non-special added token: %d %v", think, ok)
	}
	if got := tok.Encode("<think>"); len(got) != 1 || got[0] != think {
		t.Fatalf("Encode(<think>) = %v", got)
	}
	sp, ok := tok.TokenID("Ġ")
	if !ok || tok.IsSpecial(sp) || tok.Decode([]int32{sp}) != " " {
		t.Fatalf("Ġ: %d %v %q", sp, ok, tok.Decode([]int32{sp}))
	}
	if tok.VocabSize() <= int(id) || tok.Token(int32(tok.VocabSize())) != "" || tok.Token(-1) != "" {
		t.Fatalf("VocabSize %d, id %d", tok.VocabSize(), id)
	}
	if tok.IsSpecial(-1) || tok.IsSpecial(int32(tok.VocabSize())) {
		t.Fatal("out-of-range ids reported special")
	}
	if got := tok.Encode(""); len(got) != 0 {
		t.Fatalf("Encode(\"\") = %v", got)
	}
}

func TestLoadFS(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testdataDir, "qwen3", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := LoadFS(fstest.MapFS{"tokenizer.json": {Data: data}})
	if err != nil {
		t.Fatal(err)
	}
	if got := tok.Decode(tok.Encode("hello world")); got != "hello world" {
		t.Fatalf("round trip: %q", got)
	}
	if _, err := LoadFS(fstest.MapFS{}); err == nil {
		t.Fatal("LoadFS of an empty FS: no error")
	}
}

// TestLoadErrors: configurations the tokenizer cannot reproduce are
// refused with an error naming the part.
func TestLoadErrors(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testdataDir, "qwen3", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path, value, want string
	}{
		{"lookbehind", "pre_tokenizer", `{"type":"Split","pattern":{"Regex":"(?<=a)b"},"behavior":"Isolated","invert":false}`, "not supported"},
		{"no bytelevel", "pre_tokenizer", `{"type":"Whitespace"}`, "Whitespace"},
		{"normalizer", "normalizer", `{"type":"Lowercase"}`, "Lowercase"},
		{"decoder", "decoder", `{"type":"WordPiece"}`, "WordPiece"},
		{"behavior", "pre_tokenizer", `{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"a"},"behavior":"Removed","invert":false},{"type":"ByteLevel"}]}`, "Removed"},
		{"merge", "model.merges", `["a b c"]`, "merge 0"},
		{"merge token", "model.merges", `[["a","zzzzzz"]]`, "zzzzzz"},
		{"byte fallback", "model.byte_fallback", `true`, "byte_fallback"},
		{"model", "model.type", `"Unigram"`, "Unigram"},
		// Damaged files: each field range-checked, named in the error.
		{"negative added id", "added_tokens.0.id", `-7`, "added_tokens[0] (\"<|endoftext|>\"): id -7 is outside 0 to 4194303"},
		{"huge added id", "added_tokens.0.id", `2000000000`, "id 2000000000 is outside"},
		{"added id not int32", "added_tokens.0.id", `3000000000`, "added_tokens.id of type int32"},
		{"empty added token", "added_tokens.0.content", `""`, "added_tokens[0] (id 8000): content is empty"},
		{"long added token", "added_tokens.0.content", `"` + strings.Repeat("x", maxTokenLen+1) + `"`, "added_tokens[0] (id 8000): content is 65537 bytes long"},
		{"huge vocab id", "model.vocab.!", `2000000000`, `model.vocab: token "!" has id 2000000000, outside`},
		{"negative vocab id", "model.vocab.!", `-1`, `model.vocab: token "!" has id -1`},
		{"shared vocab id", "model.vocab.!", `1`, `model.vocab: tokens "!" and "\"" have the same id 1`},
		{"long vocab token", "model.vocab." + strings.Repeat("x", maxTokenLen+1), `5`, "bytes long, more than"},
		{"empty vocab token", "model.vocab.", `7`, "an empty token"},
	} {
		var j map[string]any
		if err := json.Unmarshal(data, &j); err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal([]byte(c.value), &v); err != nil {
			t.Fatal(err)
		}
		setPath(j, c.path, v)
		b, _ := json.Marshal(j)
		_, err := LoadFS(fstest.MapFS{"tokenizer.json": {Data: b}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one mentioning %q", c.name, err, c.want)
		}
	}
}

// setPath sets the value at a dotted path of a JSON document ("a.0.b":
// numbers index arrays; the last part may be empty, an empty key).
func setPath(doc any, path string, v any) {
	keys := strings.Split(path, ".")
	for i, k := range keys {
		last := i == len(keys)-1
		switch d := doc.(type) {
		case map[string]any:
			if last {
				d[k] = v
				return
			}
			doc = d[k]
		case []any:
			n, _ := strconv.Atoi(k)
			if last {
				d[n] = v
				return
			}
			doc = d[n]
		}
	}
}

// plainTokenizer is the qwen3 test tokenizer with only Qwen3's own added
// tokens, none of which strips whitespace or decodes to other text, so
// that decode(encode(s)) is NFC(s).
func plainTokenizer(t testing.TB) *Tokenizer {
	data, err := os.ReadFile(filepath.Join(testdataDir, "qwen3", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var j map[string]any
	if err := json.Unmarshal(data, &j); err != nil {
		t.Fatal(err)
	}
	var keep []any
	for _, a := range j["added_tokens"].([]any) {
		m := a.(map[string]any)
		if !m["lstrip"].(bool) && !m["rstrip"].(bool) && !m["normalized"].(bool) && strings.HasPrefix(m["content"].(string), "<") &&
			m["content"] != "<|im" {
			keep = append(keep, a)
		}
	}
	j["added_tokens"] = keep
	b, _ := json.Marshal(j)
	tok, err := LoadFS(fstest.MapFS{"tokenizer.json": {Data: b}})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func FuzzEncodeDecode(f *testing.F) {
	tok := plainTokenizer(f)
	for _, s := range scannerSeeds {
		f.Add(s)
	}
	f.Add("<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>")
	f.Fuzz(func(t *testing.T, s string) {
		// HF normalizes the text between added tokens piece by piece;
		// every token here ends in '>', which composes only with U+0338.
		if !utf8.ValidString(s) || strings.Contains(s, ">\u0338") {
			return
		}
		ids := tok.Encode(s)
		if got, want := tok.Decode(ids), norm.NFC.String(s); got != want {
			t.Fatalf("Decode(Encode(%q)) = %q, want %q (ids %v)", s, got, want, ids)
		}
		if got, ok := tok.EncodeLimit(s, len(ids)); !ok || !slices.Equal(got, ids) {
			t.Fatalf("EncodeLimit(%q, %d) = %v, %v; Encode gives %v", s, len(ids), got, ok, ids)
		}
		if _, ok := tok.EncodeLimit(s, len(ids)-1); ok && len(ids) > 0 {
			t.Fatalf("EncodeLimit(%q, %d) accepted %d tokens", s, len(ids)-1, len(ids))
		}
	})
}

// TestConcurrentEncode: one Tokenizer shared by goroutines (the word cache
// is shared) gives every goroutine the sequential result.
func TestConcurrentEncode(t *testing.T) {
	tok := loadTestTokenizer(t, "qwen3")
	c := loadCases(t, "qwen3")
	done := make(chan string)
	for g := 0; g < 4; g++ {
		go func(g int) {
			for i := g; i < len(c.Encode); i += 2 {
				e := c.Encode[i]
				if got := tok.Encode(e.Text); !slices.Equal(got, e.IDs) {
					done <- fmt.Sprintf("goroutine %d: Encode(%q) = %v, want %v", g, e.Text, got, e.IDs)
					return
				}
			}
			done <- ""
		}(g)
	}
	for range 4 {
		if msg := <-done; msg != "" {
			t.Error(msg)
		}
	}
}

// TestEncodeOddInput: invalid UTF-8 (outside the contract) and very long
// pieces must not crash or hang; long pieces still round-trip.
func TestEncodeOddInput(t *testing.T) {
	tok := loadTestTokenizer(t, "qwen3")
	for _, s := range []string{"\xff\xfe", "a\xe2\x82b", "\xc0\x80<|im_end|>\xed\xa0\x80"} {
		tok.Encode(s)
	}
	long := strings.Repeat("abcdefghij", 20000) + strings.Repeat(" ", 5000) + strings.Repeat("世界", 3000)
	if got := tok.Decode(tok.Encode(long)); got != long {
		t.Fatalf("long input does not round-trip (%d bytes back of %d)", len(got), len(long))
	}
}

// TestPrefixSpaceAfterSplit: ByteLevel without its own regex gives each
// piece of the preceding Split its prefix space.
func TestPrefixSpaceAfterSplit(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testdataDir, "qwen3", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var j map[string]any
	if err := json.Unmarshal(data, &j); err != nil {
		t.Fatal(err)
	}
	steps := j["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)
	steps[len(steps)-1].(map[string]any)["add_prefix_space"] = true
	b, _ := json.Marshal(j)
	prefixed, err := LoadFS(fstest.MapFS{"tokenizer.json": {Data: b}})
	if err != nil {
		t.Fatal(err)
	}
	plain := loadTestTokenizer(t, "qwen3")
	// Split gives "hello", " world", "!"; each without a space gains one.
	want := slices.Concat(plain.Encode(" hello"), plain.Encode(" world"), plain.Encode(" !"))
	if got := prefixed.Encode("hello world!"); !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestLoadRefusesSpecialFiles: a named pipe or a directory in place of
// tokenizer.json is refused at once (reading a pipe would wait forever),
// and so is a file too large to be one.
func TestLoadRefusesSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "tokenizer.json")
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "tokenizer.json: not a regular file (a named pipe)") {
		t.Fatalf("pipe: %v", err)
	}
	os.Remove(path)
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "not a regular file (a directory)") {
		t.Fatalf("directory: %v", err)
	}
	os.Remove(path)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(maxFileSize + 1) // sparse: no disk used
	f.Close()
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "tokenizer.json: 268435457 bytes, more than the 268435456 allowed") {
		t.Fatalf("large file: %v", err)
	}
}

// tinyTokenizerJSON is a whole tokenizer.json of a few tokens: the fuzz
// seed, small enough for the fuzzer to change every part of it.
const tinyTokenizerJSON = `{"added_tokens":[{"id":6,"content":"<|im_end|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],
"normalizer":{"type":"NFC"},
"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":"\\s+|\\w+"},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"use_regex":false}]},
"decoder":{"type":"ByteLevel"},
"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2,"Ġ":3,"Ġab":4,"c":5},"merges":["a b","Ġ ab"]}}`

// FuzzLoad: any tokenizer.json either loads or is refused with an error;
// one that loads encodes and decodes without a panic.
func FuzzLoad(f *testing.F) {
	f.Add([]byte(tinyTokenizerJSON))
	f.Add([]byte(strings.Replace(tinyTokenizerJSON, `"id":6`, `"id":-7`, 1)))
	f.Add([]byte(strings.Replace(tinyTokenizerJSON, `"id":6`, `"id":2000000000`, 1)))
	f.Fuzz(func(t *testing.T, data []byte) {
		tok, err := LoadFS(fstest.MapFS{"tokenizer.json": {Data: data}})
		if err != nil {
			return
		}
		for _, s := range []string{"ab ab<|im_end|>c", "", "\xff x"} {
			ids := tok.Encode(strings.ToValidUTF8(s, "?"))
			tok.Decode(ids)
			for _, id := range ids {
				if id < 0 || int(id) >= tok.VocabSize() {
					t.Fatalf("id %d outside the vocabulary of %d", id, tok.VocabSize())
				}
			}
		}
	})
}

// A TemplateProcessing post-processor's special tokens around a single
// sequence, alone or in a Sequence; ByteLevel's adds none.
func TestSpecialTokens(t *testing.T) {
	for _, c := range []struct {
		pp             string
		prefix, suffix []int32
	}{
		{`{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":false,"use_regex":false}`, nil, nil},
		{`{"type":"TemplateProcessing","single":[{"Sequence":{"id":"A","type_id":0}},{"SpecialToken":{"id":"<|endoftext|>","type_id":0}}],` +
			`"pair":[],"special_tokens":{"<|endoftext|>":{"id":"<|endoftext|>","ids":[9],"tokens":["<|endoftext|>"]}}}`, nil, []int32{9}},
		{`{"type":"Sequence","processors":[{"type":"ByteLevel"},{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>","type_id":0}},` +
			`{"Sequence":{"id":"A","type_id":0}}],"special_tokens":{"<s>":{"id":"<s>","ids":[1],"tokens":["<s>"]}}}]}`, []int32{1}, nil},
	} {
		pre, suf, err := parseTemplate(json.RawMessage(c.pp))
		if err != nil || !slices.Equal(pre, c.prefix) || !slices.Equal(suf, c.suffix) {
			t.Errorf("%s: %v %v %v", c.pp, pre, suf, err)
		}
	}
	if _, _, err := parseTemplate(json.RawMessage(`{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"x"}}],"special_tokens":{}}`)); err == nil {
		t.Error("an undefined special token accepted")
	}
}
