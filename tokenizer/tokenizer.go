// Package tokenizer is a byte-level BPE tokenizer that reads Hugging Face
// tokenizer.json files and produces exactly the ids and text HF `tokenizers`
// does: added tokens matched first (with their lstrip, rstrip, single_word
// and normalized flags), then the normalizer, the split pre-tokenizer, the
// ByteLevel mapping and the BPE merges; decoding through ByteLevel with
// invalid UTF-8 replaced as Rust's from_utf8_lossy does. FromGGUF builds
// the same tokenizer from the metadata llama.cpp's converter writes into a
// GGUF file.
//
// A Tokenizer is safe for concurrent use.
package tokenizer

import (
	"strings"
	"sync"
)

// Tokenizer encodes text to token ids and decodes ids to text.
type Tokenizer struct {
	normalize func(string) string // nil: none
	splits    []splitter          // applied in order, ByteLevel's regex last
	byteLevel bool
	// prefixBefore is the split step before which ByteLevel's
	// add_prefix_space applies: its own regex, or after all the steps
	// (len(splits)) when it has none; -1 when off.
	prefixBefore int
	model        *bpe

	rawAdded  *addedMatcher // added tokens matched before normalization
	normAdded *addedMatcher // added tokens matched in normalized text

	tokens []string // id -> token as written in tokenizer.json
	bytes  [][]byte // id -> bytes the ByteLevel decoder gives
	// prefix, suffix: the special tokens the post-processor puts around a
	// text (add_special_tokens=True).
	prefix, suffix []int32
	special        []bool
	ids            map[string]int32
	scratch        sync.Pool // *encodeScratch
}

type encodeScratch struct {
	segs   []segment
	norm   []segment
	pieces []string
	next   []string
	ends   []int
}

func (t *Tokenizer) buildVocab(f *fileJSON) {
	n := 0
	for _, id := range f.Model.Vocab {
		n = max(n, int(id)+1)
	}
	for _, a := range f.AddedTokens {
		n = max(n, int(a.ID)+1)
	}
	t.tokens = make([]string, n)
	t.bytes = make([][]byte, n)
	t.special = make([]bool, n)
	t.ids = make(map[string]int32, len(f.Model.Vocab)+len(f.AddedTokens))
	for tok, id := range f.Model.Vocab {
		t.tokens[id] = tok
		t.ids[tok] = id
	}
	var raw, normed []addedPattern
	for i := range f.AddedTokens {
		a := &f.AddedTokens[i]
		t.tokens[a.ID] = a.Content
		t.ids[a.Content] = a.ID
		t.special[a.ID] = a.Special
		if a.Normalized {
			p := a.Content
			if t.normalize != nil {
				p = t.normalize(p)
			}
			normed = append(normed, addedPattern{text: p, tok: a})
			// HF decodes (and reports) a normalized token by its
			// normalized form.
			t.tokens[a.ID] = p
		} else {
			raw = append(raw, addedPattern{text: a.Content, tok: a})
		}
	}
	for id, tok := range t.tokens {
		t.bytes[id] = byteLevelDecode(tok)
	}
	t.rawAdded = newAddedMatcher(raw)
	t.normAdded = newAddedMatcher(normed)
}

// Encode returns the ids of text as HF's encode(text,
// add_special_tokens=False) does: added and special tokens written in the
// text are recognised as such. text must be valid UTF-8.
func (t *Tokenizer) Encode(text string) []int32 {
	sc, _ := t.scratch.Get().(*encodeScratch)
	if sc == nil {
		sc = &encodeScratch{}
	}
	ids := make([]int32, 0, len(text)/3+4)
	sc.segs = t.rawAdded.split(text, sc.segs[:0])
	for _, seg := range sc.segs {
		if seg.tok != nil {
			ids = append(ids, seg.tok.ID)
			continue
		}
		s := seg.text
		if t.normalize != nil {
			s = t.normalize(s)
		}
		sc.norm = t.normAdded.split(s, sc.norm[:0])
		for _, ns := range sc.norm {
			if ns.tok != nil {
				ids = append(ids, ns.tok.ID)
				continue
			}
			ids = t.encodeText(ns.text, ids, sc)
		}
	}
	t.scratch.Put(sc)
	return ids
}

// SpecialTokens returns the special tokens HF's encode(text,
// add_special_tokens=True) puts before and after the text's tokens, as the
// tokenizer.json's post-processor says (Qwen3-Embedding appends
// <|endoftext|>); the caller must not modify them.
func (t *Tokenizer) SpecialTokens() (prefix, suffix []int32) { return t.prefix, t.suffix }

// encodeText pre-tokenizes and BPE-encodes text free of added tokens.
func (t *Tokenizer) encodeText(s string, ids []int32, sc *encodeScratch) []int32 {
	if s == "" {
		return ids
	}
	if len(t.splits) == 1 && t.prefixBefore < 0 {
		// The usual case, a single split step: no piece list needed.
		sc.ends = t.splits[0].split(s, sc.ends[:0])
		start := 0
		for _, end := range sc.ends {
			ids = t.model.encode(s[start:end], ids)
			start = end
		}
		return ids
	}
	pieces := append(sc.pieces[:0], s)
	for i, sp := range t.splits {
		if i == t.prefixBefore {
			pieces = addPrefixSpace(pieces)
		}
		next := sc.next[:0]
		for _, p := range pieces {
			sc.ends = sp.split(p, sc.ends[:0])
			start := 0
			for _, end := range sc.ends {
				if end > start {
					next = append(next, p[start:end])
				}
				start = end
			}
		}
		pieces, sc.next = next, pieces
	}
	if t.prefixBefore == len(t.splits) {
		pieces = addPrefixSpace(pieces)
	}
	for _, p := range pieces {
		ids = t.model.encode(p, ids)
	}
	sc.pieces = pieces
	return ids
}

// addPrefixSpace gives every piece a leading space it lacks, as ByteLevel's
// add_prefix_space does for each piece it receives.
func addPrefixSpace(pieces []string) []string {
	for i, p := range pieces {
		if !strings.HasPrefix(p, " ") {
			pieces[i] = " " + p
		}
	}
	return pieces
}

// Decode returns the text of ids as HF's decode(ids,
// skip_special_tokens=False) does. Ids outside the vocabulary are skipped.
func (t *Tokenizer) Decode(ids []int32) string {
	var buf []byte
	for _, id := range ids {
		if id >= 0 && int(id) < len(t.bytes) {
			buf = append(buf, t.bytes[id]...)
		}
	}
	out, _ := appendLossy(make([]byte, 0, len(buf)+8), buf, true)
	return string(out)
}

// TokenID returns the id of a token written as in tokenizer.json
// (byte-level characters for model tokens, e.g. "Ġthe").
func (t *Tokenizer) TokenID(tok string) (int32, bool) {
	id, ok := t.ids[tok]
	return id, ok
}

// Token returns the token string of id as written in tokenizer.json (an
// added token with "normalized": true in its normalized form, as HF's
// id_to_token gives it), or "" for an id outside the vocabulary.
func (t *Tokenizer) Token(id int32) string {
	if id < 0 || int(id) >= len(t.tokens) {
		return ""
	}
	return t.tokens[id]
}

// TokenBytes returns the bytes token id writes when decoded (nil for an id
// outside the vocabulary); the caller must not modify them.
func (t *Tokenizer) TokenBytes(id int32) []byte {
	if id < 0 || int(id) >= len(t.bytes) {
		return nil
	}
	return t.bytes[id]
}

// VocabSize returns one more than the largest id of the model vocabulary and
// the added tokens. (A model's embedding table may be larger still.)
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// IsSpecial reports whether id is an added token marked special, such as
// <|im_end|>; decoding with skip_special_tokens=True would drop those.
func (t *Tokenizer) IsSpecial(id int32) bool {
	return id >= 0 && int(id) < len(t.special) && t.special[id]
}
