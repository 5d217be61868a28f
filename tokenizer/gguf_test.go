package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// ggufFromTokenizerJSON converts a tokenizer.json (with the
// tokenizer_config.json and config.json in dir, where there are) into what
// llama.cpp's convert_hf_to_gguf.py writes for a Qwen model
// (TextModel.get_vocab_base, _set_vocab_gpt2, gguf-py's SpecialVocab):
//
//   - ids 0..vocabSize-1 (config.json's vocab_size), each the token of
//     tokenizer.get_vocab() (the model's vocabulary with the added tokens
//     over it) or "[PAD{id}]" of type unused where there is none;
//   - model tokens as written, type normal; an added token not marked
//     normalized as decode(encode(token)), type control when it is special
//     or looks special ("<|...|>"), user-defined (with "▁" made a space)
//     otherwise;
//   - merges as written when they are "a b" strings, pairs joined by a
//     space with spaces inside them written as U+0120;
//   - bos/eos/unk/sep/pad/mask ids from tokenizer_config.json's *_token
//     (looked up among the added tokens), then config.json's *_token_id.
//
// The one step not reproduced is the choice of tokenizer.ggml.pre, which
// the converter makes by hashing the encoding of a fixed text and
// comparing with the published models' hashes: the test tokenizers are not
// published models, so pre is given.
//
// ref is the tokenizer.json loaded by this package, standing in for the
// converter's AutoTokenizer (the conformance tests hold it to HF's).
func ggufFromTokenizerJSON(t testing.TB, data []byte, dir string, vocabSize int, pre string) GGUFVocab {
	t.Helper()
	var f struct {
		AddedTokens []addedToken `json:"added_tokens"`
		Model       struct {
			Vocab  map[string]int32 `json:"vocab"`
			Merges []any            `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	ref, err := parse(data)
	if err != nil {
		t.Fatal(err)
	}

	// tokenizer.vocab (get_vocab with added tokens), added_vocab
	// (get_added_vocab), added_tokens_decoder.
	vocab := map[string]int32{}
	for tok, id := range f.Model.Vocab {
		vocab[tok] = id
	}
	addedVocab := map[string]int32{}
	decoder := map[int32]addedToken{}
	for _, a := range f.AddedTokens {
		vocab[a.Content] = a.ID
		addedVocab[a.Content] = a.ID
		decoder[a.ID] = a
	}
	reverse := map[int32]string{}
	for tok, id := range vocab {
		if prev, dup := reverse[id]; dup {
			t.Fatalf("id %d is both %q and %q", id, prev, tok)
		}
		reverse[id] = tok
	}
	for id := range reverse {
		if int(id) >= vocabSize {
			t.Fatalf("id %d is past vocab_size %d", id, vocabSize)
		}
	}

	v := GGUFVocab{Model: "gpt2", Pre: pre, SpecialIDs: map[string]int64{}}
	for i := range int32(vocabSize) {
		tok, ok := reverse[i]
		if !ok {
			v.Tokens = append(v.Tokens, fmt.Sprintf("[PAD%d]", i))
			v.Types = append(v.Types, ggufUnused)
			continue
		}
		ty := int32(ggufNormal)
		if _, isAdded := addedVocab[tok]; isAdded {
			if !decoder[i].Normalized {
				tok = ref.Decode(ref.Encode(tok))
			}
			if decoder[i].Special || looksSpecial(tok) {
				ty = ggufControl
			} else {
				tok = strings.ReplaceAll(tok, "\u2581", " ")
				ty = ggufUserDefined
			}
		}
		v.Tokens = append(v.Tokens, tok)
		v.Types = append(v.Types, ty)
	}

	for _, m := range f.Model.Merges {
		switch m := m.(type) {
		case string:
			v.Merges = append(v.Merges, m)
		case []any:
			if len(m) != 2 {
				t.Fatalf("merge %v", m)
			}
			parts := make([]string, 2)
			for i, p := range m {
				parts[i] = strings.ReplaceAll(p.(string), " ", "\u0120")
			}
			v.Merges = append(v.Merges, parts[0]+" "+parts[1])
		default:
			t.Fatalf("merge %v", m)
		}
	}

	// SpecialVocab: the first source to give a type wins.
	ggufName := map[string]string{"bos": "bos", "eos": "eos", "unk": "unknown", "sep": "seperator", "pad": "padding", "mask": "mask"}
	types := []string{"bos", "eos", "unk", "sep", "pad", "mask"}
	set := func(typ string, id any) {
		n, ok := id.(float64) // a JSON number
		if !ok || n != float64(int64(n)) {
			return
		}
		if n < 0 {
			t.Fatalf("%s token id %v", typ, n)
		}
		if _, done := v.SpecialIDs[ggufName[typ]]; !done {
			v.SpecialIDs[ggufName[typ]] = int64(n)
		}
	}
	if cfg := readJSONObject(t, filepath.Join(dir, "tokenizer_config.json")); cfg != nil {
		for _, typ := range types {
			var content string
			switch e := cfg[typ+"_token"].(type) {
			case string:
				content = e
			case map[string]any:
				c, ok := e["content"].(string)
				if !ok {
					continue
				}
				content = c
			default:
				continue
			}
			for _, a := range f.AddedTokens {
				if a.Content == content {
					set(typ, float64(a.ID))
					break
				}
			}
		}
	}
	if cfg := readJSONObject(t, filepath.Join(dir, "config.json")); cfg != nil {
		for _, typ := range types {
			id := cfg[typ+"_token_id"]
			if tc, ok := cfg["text_config"].(map[string]any); ok && id == nil {
				id = tc[typ+"_token_id"]
			}
			set(typ, id)
		}
	}
	return v
}

// looksSpecial is the converter's does_token_look_special.
func looksSpecial(tok string) bool {
	switch tok {
	case "<pad>", "<mask>", "<2mass>", "[@BOS@]":
		return true
	}
	return strings.HasPrefix(tok, "<|") && strings.HasSuffix(tok, "|>") ||
		strings.HasPrefix(tok, "<｜") && strings.HasSuffix(tok, "｜>") ||
		strings.HasPrefix(tok, "<unused") && strings.HasSuffix(tok, ">")
}

// readJSONObject reads a JSON object, or returns nil if the file is absent.
func readJSONObject(t testing.TB, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

// ggufLossless removes the added tokens a GGUF file cannot carry: those
// with lstrip, rstrip, single_word or normalized set, and those the
// converter rewrites (decode(encode(token)) differs). Qwen's added tokens
// have none of these; the test tokenizers add some to exercise Load. It
// returns the tokenizer.json without them and their ids.
func ggufLossless(t testing.TB, data []byte) ([]byte, []int32) {
	t.Helper()
	ref, err := parse(data)
	if err != nil {
		t.Fatal(err)
	}
	var j map[string]any
	if err := json.Unmarshal(data, &j); err != nil {
		t.Fatal(err)
	}
	var keep []any
	var dropped []int32
	for _, a := range j["added_tokens"].([]any) {
		m := a.(map[string]any)
		content := m["content"].(string)
		if m["lstrip"].(bool) || m["rstrip"].(bool) || m["single_word"].(bool) || m["normalized"].(bool) ||
			ref.Decode(ref.Encode(content)) != content {
			dropped = append(dropped, int32(m["id"].(float64)))
			continue
		}
		keep = append(keep, a)
	}
	j["added_tokens"] = keep
	out, err := json.Marshal(j)
	if err != nil {
		t.Fatal(err)
	}
	return out, dropped
}

// ggufTexts are texts around the added tokens, as chat prompts have them.
var ggufTexts = []string{
	"<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi there! 你好<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello!<|im_end|>\n",
	"<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>",
	"<|im_start|><|im_end|><|endoftext|>", "<|im_start", "<|im_star", "<|im", "<|im<|im_end|>", "<<|im_end|>>", "<|im_end|>|>",
	"x<|endoftext|>y", " <|im_end|> ", "\n<|im_start|>\n", "<|fim_prefix|>def f():\n    <|fim_suffix|>\n<|fim_middle|>",
	"<|repo_name|>kiln<|file_sep|>main.go\npackage main", "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>",
	"<think>\u0338", "</think>\u0338x", "e\u0301<|im_end|>\u0301", "<|im_end|>\u0308a", "<think>e\u0301</think>",
	"'s<|im_end|>'S", "<|IM_END|>", "<|im_end |>", "<|box_start|>(1,2)<|box_end|>", "ça naïve nai\u0308ve <|mask|> <|pad|>",
}

// ggufCheck compares g, the tokenizer FromGGUF built, with ref, the
// tokenizer.json it was converted from (without the added tokens GGUF
// cannot carry), over texts and every id.
func ggufCheck(t *testing.T, g, ref *Tokenizer, texts []string) {
	t.Helper()
	fails := 0
	fail := func(format string, args ...any) {
		t.Helper()
		fails++
		if fails <= 10 {
			t.Errorf(format, args...)
		}
	}
	if g.VocabSize() != ref.VocabSize() {
		fail("VocabSize %d, tokenizer.json %d", g.VocabSize(), ref.VocabSize())
	}
	for _, s := range texts {
		got, want := g.Encode(s), ref.Encode(s)
		if !slices.Equal(got, want) {
			fail("Encode(%q)\n got %v\nwant %v", s, got, want)
		}
		if d, w := g.Decode(want), ref.Decode(want); d != w {
			fail("Decode(%v) = %q, want %q", want, d, w)
		}
	}
	for id := int32(-2); id < int32(ref.VocabSize())+3; id++ {
		tok := ref.Token(id)
		if got := g.Token(id); got != tok {
			fail("Token(%d) = %q, want %q", id, got, tok)
		}
		if d, w := g.Decode([]int32{id}), ref.Decode([]int32{id}); d != w {
			fail("Decode([%d]) = %q, want %q", id, d, w)
		}
		if tok != "" {
			if got, ok := g.TokenID(tok); !ok || got != id {
				fail("TokenID(%q) = %d, %v; want %d", tok, got, ok, id)
			}
		}
		// Control tokens are special: the ones HF marks special and
		// those that look it.
		_, added := ref.rawAdded.byText(tok)
		if want := ref.IsSpecial(id) || added && looksSpecial(tok); g.IsSpecial(id) != want {
			fail("IsSpecial(%d) (%q) = %v, want %v", id, tok, g.IsSpecial(id), want)
		}
	}
	if fails > 0 {
		t.Errorf("%d differences", fails)
	}
}

// byText reports whether text is one of m's patterns.
func (m *addedMatcher) byText(text string) (*addedToken, bool) {
	if text == "" {
		return nil, false
	}
	for _, p := range m.byFirst[text[0]] {
		if p.text == text {
			return p.tok, true
		}
	}
	return nil, false
}

func corpusText(t testing.TB) []string {
	return strings.SplitAfter(string(readGzip(t, filepath.Join(testdataDir, "corpus.txt.gz"))), "\n")
}

// TestFromGGUFConformance converts the test tokenizers as llama.cpp's
// converter does and requires FromGGUF's tokenizer to give the ids and
// text of the tokenizer.json: HF's own, recorded in cases.json.gz, and
// Load's over the corpus, the chat texts and every id.
func TestFromGGUFConformance(t *testing.T) {
	corpus := corpusText(t)
	for _, c := range []struct{ name, pre string }{{"qwen3", "qwen2"}, {"qwen35", "qwen35"}} {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(testdataDir, c.name)
			full, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			data, dropped := ggufLossless(t, full)
			ref, err := parse(data)
			if err != nil {
				t.Fatal(err)
			}
			// Padded past the tokenizer as a model's vocab_size is
			// (Qwen3: 151,669 tokens, vocab_size 151,936).
			vocabSize := (ref.VocabSize()+len(dropped))/128*128 + 256
			v := ggufFromTokenizerJSON(t, data, dir, vocabSize, c.pre)
			holes := 0
			for id := range int32(vocabSize) {
				if ref.Token(id) == "" {
					holes++
					if v.Tokens[id] != fmt.Sprintf("[PAD%d]", id) || v.Types[id] != ggufUnused {
						t.Fatalf("hole %d: %q type %d", id, v.Tokens[id], v.Types[id])
					}
				}
			}
			if holes <= vocabSize-ref.VocabSize() {
				t.Fatalf("%d holes: none inside the vocabulary", holes)
			}
			g, err := FromGGUF(v)
			if err != nil {
				t.Fatal(err)
			}

			// HF's ids, where they use no dropped token.
			cases := loadCases(t, c.name)
			usesDropped := func(ids []int32) bool {
				return slices.ContainsFunc(ids, func(id int32) bool { return slices.Contains(dropped, id) })
			}
			fails, checked := 0, 0
			var texts []string
			for _, e := range cases.Encode {
				texts = append(texts, e.Text, e.Decoded)
				if usesDropped(e.IDs) {
					continue
				}
				checked++
				if got := g.Encode(e.Text); !slices.Equal(got, e.IDs) {
					fails++
					if fails <= 10 {
						t.Errorf("Encode(%q)\n got %v\n  HF %v", e.Text, got, e.IDs)
					}
				}
				if got := g.Decode(e.IDs); got != e.Decoded {
					fails++
					if fails <= 10 {
						t.Errorf("Decode(%v) = %q, HF %q", e.IDs, got, e.Decoded)
					}
				}
			}
			for _, d := range cases.Decode {
				if usesDropped(d.IDs) {
					continue
				}
				checked++
				if got := g.Decode(d.IDs); got != d.Text {
					fails++
					if fails <= 10 {
						t.Errorf("Decode(%v) = %q, HF %q", d.IDs, got, d.Text)
					}
				}
				if got := streamDecode(g, d.IDs); got != d.Text {
					fails++
					if fails <= 10 {
						t.Errorf("streaming decode of %v = %q, HF %q", d.IDs, got, d.Text)
					}
				}
			}
			if fails > 0 || checked < 2000 {
				t.Errorf("%d of %d HF cases differ", fails, checked)
			}

			texts = slices.Concat(texts, corpus, scannerSeeds, ggufTexts)
			ggufCheck(t, g, ref, texts)
		})
	}
}

// TestFromGGUFFixtures: the fixture models' tokenizer, converted with their
// config.json and tokenizer_config.json (special ids, vocab_size).
func TestFromGGUFFixtures(t *testing.T) {
	dir := "../testdata/fixtures/qwen3"
	data, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	ref, err := parse(data)
	if err != nil {
		t.Fatal(err)
	}
	cfg := readJSONObject(t, filepath.Join(dir, "config.json"))
	v := ggufFromTokenizerJSON(t, data, dir, int(cfg["vocab_size"].(float64)), "qwen2")
	imEnd, _ := ref.TokenID("<|im_end|>")
	eot, _ := ref.TokenID("<|endoftext|>")
	if want := map[string]int64{"eos": int64(imEnd), "padding": int64(eot)}; !mapsEqual(v.SpecialIDs, want) {
		t.Fatalf("special ids %v, want %v", v.SpecialIDs, want)
	}
	g, err := FromGGUF(v)
	if err != nil {
		t.Fatal(err)
	}
	ggufCheck(t, g, ref, slices.Concat(corpusText(t)[:2000], scannerSeeds, ggufTexts))
}

func mapsEqual(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestFromGGUFConverterRewrites: the added tokens a GGUF file cannot carry
// faithfully come through as the converter writes them, without error.
func TestFromGGUFConverterRewrites(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testdataDir, "qwen3", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	v := ggufFromTokenizerJSON(t, data, "", 8031, "qwen2")
	g, err := FromGGUF(v)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		id     int32
		tok    string
		typ    int32
		encode string
	}{
		{8026, "<|mask|>", ggufControl, " <|mask|> "},          // looks special; lstrip/rstrip lost
		{8027, "<|pad|>", ggufControl, " <|pad|>"},             // special; lstrip lost
		{8028, "nai\u0308ve", ggufUserDefined, "xnai\u0308ve"}, // normalized, single_word lost
		{8029, "<|im", ggufUserDefined, "<|im"},
		{8030, "\uFFFDa", ggufUserDefined, "\uFFFDa"}, // decode(encode("ça")) by HF
	} {
		if v.Tokens[c.id] != c.tok || v.Types[c.id] != c.typ {
			t.Errorf("token %d: %q type %d, want %q type %d", c.id, v.Tokens[c.id], v.Types[c.id], c.tok, c.typ)
		}
		if got := g.Encode(c.encode); !slices.Contains(got, c.id) {
			t.Errorf("Encode(%q) = %v, want it to hold %d", c.encode, got, c.id)
		}
		if got := g.Decode([]int32{c.id}); got != c.tok {
			t.Errorf("Decode([%d]) = %q, want %q", c.id, got, c.tok)
		}
		if g.IsSpecial(c.id) != (c.typ == ggufControl) {
			t.Errorf("IsSpecial(%d) = %v", c.id, g.IsSpecial(c.id))
		}
	}
}

// tinyVocab is a valid small vocabulary: the 256 byte tokens, a few merges,
// control and user-defined tokens and unused holes inside and at the end.
func tinyVocab() GGUFVocab {
	v := GGUFVocab{Model: "gpt2", Pre: "qwen2"}
	for b := range 256 {
		v.Tokens = append(v.Tokens, string(byteToRune[b]))
		v.Types = append(v.Types, ggufNormal)
	}
	add := func(tok string, ty int32) {
		v.Tokens = append(v.Tokens, tok)
		v.Types = append(v.Types, ty)
	}
	add("he", ggufNormal)           // 256
	add("[PAD257]", ggufUnused)     // 257
	add("hel", ggufNormal)          // 258
	add("ll", ggufNormal)           // 259
	add("hell", ggufNormal)         // 260
	add("hello", ggufNormal)        // 261
	add("<|im_end|>", ggufControl)  // 262
	add("<think>", ggufUserDefined) // 263
	add("[PAD264]", ggufUnused)     // 264
	add("Ġw", ggufNormal)           // 265
	add("[PAD266]", ggufUnused)     // 266
	v.Merges = []string{"h e", "he l", "l l", "hel l", "hell o", "Ġ w"}
	v.SpecialIDs = map[string]int64{"eos": 262, "padding": 262}
	return v
}

func TestFromGGUFTiny(t *testing.T) {
	g, err := FromGGUF(tinyVocab())
	if err != nil {
		t.Fatal(err)
	}
	if g.VocabSize() != 266 {
		t.Fatalf("VocabSize %d, want 266 (the trailing hole dropped)", g.VocabSize())
	}
	got := g.Encode("hello<|im_end|> world<think>")
	want := []int32{261, 262, 265, 'o', 'r', 'l', 'd', 263}
	if !slices.Equal(got, want) {
		t.Fatalf("Encode = %v, want %v", got, want)
	}
	if d := g.Decode(append(got, 257, 264, 266, 9999, -1)); d != "hello<|im_end|> world<think>" {
		t.Fatalf("Decode = %q", d)
	}
	if g.Token(257) != "" || g.Token(264) != "" {
		t.Fatal("holes have tokens")
	}
	if _, ok := g.TokenID("[PAD257]"); ok {
		t.Fatal("a hole has an id")
	}
	if !g.IsSpecial(262) || g.IsSpecial(263) || g.IsSpecial(261) {
		t.Fatal("IsSpecial: control tokens only")
	}
	// NFC between the added tokens (qwen2), none for qwen35.
	if got := g.Encode("e\u0301"); len(got) != 2 || got[0] != 0xC3 {
		t.Fatalf("qwen2 Encode(e + U+0301) = %v, want NFC é's two bytes", got)
	}
	v := tinyVocab()
	v.Pre = "qwen35"
	g35, err := FromGGUF(v)
	if err != nil {
		t.Fatal(err)
	}
	if got := g35.Encode("e\u0301"); len(got) != 3 {
		t.Fatalf("qwen35 Encode(e + U+0301) = %v, want three bytes", got)
	}
}

// TestFromGGUFIgnoreMerges: qwen35 (ignore_merges, as Qwen3.5's
// tokenizer.json) takes a piece that is a token whole; qwen2 merges it.
func TestFromGGUFIgnoreMerges(t *testing.T) {
	v := tinyVocab()
	v.Tokens = append(v.Tokens, "abc")
	v.Types = append(v.Types, ggufNormal)
	v.Tokens = append(v.Tokens, "bc")
	v.Types = append(v.Types, ggufNormal)
	v.Tokens = append(v.Tokens, "ab")
	v.Types = append(v.Types, ggufNormal)
	// "b c" ranks before "a b": merging gives a + bc; abc comes only
	// from "ab c".
	v.Merges = append(v.Merges, "b c", "a b", "ab c")
	for _, c := range []struct {
		pre  string
		want []int32
	}{{"qwen2", []int32{'a', 268}}, {"qwen35", []int32{267}}} {
		v.Pre = c.pre
		g, err := FromGGUF(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := g.Encode("abc"); !slices.Equal(got, c.want) {
			t.Errorf("%s: Encode(abc) = %v, want %v", c.pre, got, c.want)
		}
	}
}

func TestFromGGUFErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*GGUFVocab)
		want string
	}{
		{"model", func(v *GGUFVocab) { v.Model = "llama" }, `"llama"`},
		{"no model", func(v *GGUFVocab) { v.Model = "" }, "tokenizer.ggml.model"},
		{"pre", func(v *GGUFVocab) { v.Pre = "deepseek-r1-qwen" }, `"deepseek-r1-qwen"`},
		{"no pre", func(v *GGUFVocab) { v.Pre = "" }, `tokenizer.ggml.pre ""`},
		{"gpt-2 pre", func(v *GGUFVocab) { v.Pre = "gpt-2" }, `"gpt-2" is not supported`},
		{"empty", func(v *GGUFVocab) { v.Tokens, v.Types = nil, nil }, "empty"},
		{"types short", func(v *GGUFVocab) { v.Types = v.Types[:10] }, "10 entries for 267 tokens"},
		{"types long", func(v *GGUFVocab) { v.Types = append(v.Types, 1) }, "268 entries for 267 tokens"},
		{"no merges", func(v *GGUFVocab) { v.Merges = nil }, "merges is empty"},
		{"merge unknown", func(v *GGUFVocab) { v.Merges[2] = "l zz" }, `merge 2 ("l zz"): "zz"`},
		{"merge result unknown", func(v *GGUFVocab) { v.Merges[0] = "e h" }, `"eh" is not a normal token`},
		{"merge no space", func(v *GGUFVocab) { v.Merges[1] = "hel" }, "merge 1"},
		{"merge leading space", func(v *GGUFVocab) { v.Merges[1] = " he" }, "merge 1"},
		{"merge two spaces", func(v *GGUFVocab) { v.Merges[1] = "he  l" }, "merge 1"},
		{"merge of control token", func(v *GGUFVocab) { v.Merges[1] = "<|im_end|> l" }, `"<|im_end|>" is not a normal token`},
		{"merge of hole", func(v *GGUFVocab) { v.Merges[1] = "[PAD257] l" }, `"[PAD257]" is not a normal token`},
		{"type 0", func(v *GGUFVocab) { v.Types[5] = 0 }, "token 5"},
		{"type 7", func(v *GGUFVocab) { v.Types[5] = 7 }, "type 7"},
		{"type negative", func(v *GGUFVocab) { v.Types[5] = -1 }, "type -1"},
		{"byte type", func(v *GGUFVocab) { v.Types[5] = ggufByte }, "byte"},
		{"unknown type", func(v *GGUFVocab) { v.Types[5] = ggufUnknown }, "unknown"},
		{"empty token", func(v *GGUFVocab) { v.Tokens[262] = "" }, "token 262 is empty"},
		{"invalid utf8", func(v *GGUFVocab) { v.Tokens[263] = "<\xe4\xbd>" }, "not valid UTF-8"},
		{"long token", func(v *GGUFVocab) { v.Tokens[263] = strings.Repeat("x", maxTokenLen+1) }, "bytes long"},
		{"duplicate", func(v *GGUFVocab) { v.Tokens[263] = "hello" }, `tokens 261 and 263 are both "hello"`},
		{"no normal tokens", func(v *GGUFVocab) {
			for i := range v.Types {
				if v.Types[i] == ggufNormal {
					v.Types[i] = ggufUnused
				}
			}
		}, "no normal tokens"},
		{"eos negative", func(v *GGUFVocab) { v.SpecialIDs["eos"] = -1 }, "eos_token_id -1"},
		{"bos too big", func(v *GGUFVocab) { v.SpecialIDs["bos"] = 267 }, "bos_token_id 267 is outside the 267 tokens"},
		{"id huge", func(v *GGUFVocab) { v.SpecialIDs["padding"] = 1 << 40 }, "padding_token_id"},
		{"too many tokens", func(v *GGUFVocab) {
			v.Tokens = make([]string, maxTokens+1)
			v.Types = make([]int32, maxTokens+1)
		}, "more than"},
		{"too many merges", func(v *GGUFVocab) { v.Merges = make([]string, maxMerges+1) }, "more than"},
	} {
		v := tinyVocab()
		c.edit(&v)
		g, err := FromGGUF(v)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "tokenizer: gguf: ") {
			t.Errorf("%s: error %v, want one mentioning %q", c.name, err, c.want)
		}
		if g != nil {
			t.Errorf("%s: a tokenizer with the error", c.name)
		}
	}
}

// FuzzFromGGUF builds small vocabularies from the input: FromGGUF must
// refuse them or give a tokenizer whose ids are tokens and whose decoding
// of ASCII text it can spell byte by byte gives the text back.
func FuzzFromGGUF(f *testing.F) {
	// The pieces tokens and merges are made of.
	pieces := []string{"a", "b", "c", "ab", "bc", "abc", "Ġ", "Ġa", "Ġab", "<|x|>", "<y>", "<|x", "",
		"\xff", "[PAD]", "a b", " ", "aa", "aaa", "ĊĊ", "Ċ", "é", "Ã©", "x|>"}
	// Pre, token count, (piece, type) per token, merge count, (piece,
	// piece) per merge, eos.
	f.Add([]byte{0, 10, 0, 1, 1, 1, 2, 1, 3, 1, 4, 1, 5, 1, 6, 1, 7, 1, 9, 3, 10, 4, 4, 0, 1, 1, 2, 3, 2, 6, 0, 8})
	f.Add([]byte{1, 9, 0, 1, 1, 1, 3, 1, 9, 3, 12, 5, 14, 4, 11, 4, 20, 1, 19, 1, 2, 0, 1, 20, 20, 3})
	f.Add([]byte{2, 3, 0, 1, 0, 1, 1, 5, 1, 0, 0, 0})
	f.Add([]byte{0, 4, 15, 1, 16, 1, 0, 1, 1, 1, 1, 0, 1, 255})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 || len(data) > 256 {
			return
		}
		next := func() int {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return int(b)
		}
		v := GGUFVocab{Model: "gpt2", Pre: []string{"qwen2", "qwen35", "qwen2", "gpt-2"}[next()%4]}
		n := next() % 24
		for range n {
			v.Tokens = append(v.Tokens, pieces[next()%len(pieces)])
			v.Types = append(v.Types, int32(next()%8))
		}
		nm := next() % 16
		for range nm {
			a, b := next(), next()
			if a >= 200 { // a raw piece, not "a b"
				v.Merges = append(v.Merges, pieces[b%len(pieces)])
				continue
			}
			v.Merges = append(v.Merges, pieces[a%len(pieces)]+" "+pieces[b%len(pieces)])
		}
		if len(data) > 0 {
			v.SpecialIDs = map[string]int64{"eos": int64(int8(next()))}
		}
		g, err := FromGGUF(v)
		if err != nil {
			if g != nil {
				t.Fatal("a tokenizer with an error")
			}
			return
		}
		for _, s := range []string{"abc abc", "aaa\n\n<|x|><y>", "<|x", "Ġ é", "", "bca<y>ab ab\n"} {
			ids := g.Encode(s)
			spellable := true
			for i := 0; i < len(s); i++ {
				if g.model.byteID[s[i]] < 0 {
					spellable = false
				}
			}
			for _, id := range ids {
				if id < 0 || int(id) >= g.VocabSize() || g.Token(id) == "" {
					t.Fatalf("Encode(%q) = %v: %d is no token", s, ids, id)
				}
			}
			if d := g.Decode(ids); spellable && isASCII(s) && d != s {
				t.Fatalf("Decode(Encode(%q)) = %q (ids %v)", s, d, ids)
			}
		}
	})
}

// isASCII: NFC leaves s as it is.
func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
