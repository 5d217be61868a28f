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
	"math"
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

	// maxBytes is the most bytes of text one token stands for
	// (MaxTokenBytes); 0: no bound.
	maxBytes int

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
	t.maxBytes = t.weighTokens(func(byte) int { return 1 })
}

// Encode returns the ids of text as HF's encode(text,
// add_special_tokens=False) does: added and special tokens written in the
// text are recognised as such. text must be valid UTF-8.
func (t *Tokenizer) Encode(text string) []int32 {
	ids, _ := t.encode(text, math.MaxInt)
	return ids
}

// EncodeLimit is Encode for a text that may have at most limit tokens (a
// prompt and its context): it returns false as soon as the text is known
// to have more, having done work in proportion to limit rather than to the
// text. A text of n bytes has at least n / MaxTokenBytes(nil) tokens, so a
// longer one is refused before it is split or merged.
func (t *Tokenizer) EncodeLimit(text string, limit int) ([]int32, bool) {
	return t.encode(text, max(limit, 0))
}

func (t *Tokenizer) encode(text string, limit int) ([]int32, bool) {
	sc, _ := t.scratch.Get().(*encodeScratch)
	if sc == nil {
		sc = &encodeScratch{}
	}
	defer t.putScratch(sc)
	ids := make([]int32, 0, min(len(text)/3, limit)+4)
	sc.segs = t.rawAdded.split(text, sc.segs[:0])
	for _, seg := range sc.segs {
		if seg.tok != nil {
			if ids = append(ids, seg.tok.ID); len(ids) > limit {
				return nil, false
			}
			continue
		}
		s := seg.text
		if t.normalize != nil {
			s = t.normalize(s)
		}
		sc.norm = t.normAdded.split(s, sc.norm[:0])
		for _, ns := range sc.norm {
			if ns.tok != nil {
				if ids = append(ids, ns.tok.ID); len(ids) > limit {
					return nil, false
				}
				continue
			}
			var ok bool
			if ids, ok = t.encodeText(ns.text, ids, limit, sc); !ok {
				return nil, false
			}
		}
	}
	return ids, true
}

// SpecialTokens returns the special tokens HF's encode(text,
// add_special_tokens=True) puts before and after the text's tokens, as the
// tokenizer.json's post-processor says (Qwen3-Embedding appends
// <|endoftext|>); the caller must not modify them.
func (t *Tokenizer) SpecialTokens() (prefix, suffix []int32) { return t.prefix, t.suffix }

// putScratch returns sc to the pool without the text it points into, and
// drops it after a text so large that keeping its buffers would hold
// memory a burst of huge prompts made the process take.
func (t *Tokenizer) putScratch(sc *encodeScratch) {
	const keep = 1 << 12
	if cap(sc.segs) > keep || cap(sc.norm) > keep || cap(sc.pieces) > keep || cap(sc.next) > keep || cap(sc.ends) > keep<<4 {
		return
	}
	clear(sc.segs[:cap(sc.segs)])
	clear(sc.norm[:cap(sc.norm)])
	clear(sc.pieces[:cap(sc.pieces)])
	clear(sc.next[:cap(sc.next)])
	t.scratch.Put(sc)
}

// encodeText pre-tokenizes and BPE-encodes text free of added tokens,
// returning false once ids would hold more than limit tokens.
func (t *Tokenizer) encodeText(s string, ids []int32, limit int, sc *encodeScratch) ([]int32, bool) {
	if s == "" {
		return ids, true
	}
	// Every piece gives at least one token, and one token at most
	// maxBytes bytes.
	room := limit - len(ids)
	if t.maxBytes == 0 {
		room = math.MaxInt // a piece may give no token
	} else if (len(s)-1)/t.maxBytes >= room {
		return ids, false
	}
	if len(t.splits) == 1 && t.prefixBefore < 0 {
		// The usual case, a single split step: no piece list needed.
		sc.ends = t.splits[0].split(s, sc.ends[:0], room)
		if len(sc.ends) > room {
			return ids, false
		}
		start := 0
		for _, end := range sc.ends {
			if ids = t.model.encode(s[start:end], ids); len(ids) > limit {
				return ids, false
			}
			start = end
		}
		return ids, true
	}
	pieces := append(sc.pieces[:0], s)
	for i, sp := range t.splits {
		if i == t.prefixBefore {
			pieces = addPrefixSpace(pieces)
		}
		next := sc.next[:0]
		for _, p := range pieces {
			sc.ends = sp.split(p, sc.ends[:0], room-len(next))
			start := 0
			for _, end := range sc.ends {
				if end > start {
					next = append(next, p[start:end])
				}
				start = end
			}
			if len(next) > room {
				sc.pieces, sc.next = pieces, next
				return ids, false
			}
		}
		pieces, sc.next = next, pieces
	}
	if t.prefixBefore == len(t.splits) {
		pieces = addPrefixSpace(pieces)
	}
	sc.pieces = pieces
	for _, p := range pieces {
		if ids = t.model.encode(p, ids); len(ids) > limit {
			return ids, false
		}
	}
	return ids, true
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

// MaxTokenBytes returns the most bytes of text one token stands for, each
// byte weighed by weight (nil: 1 each), so that a text of n bytes has at
// least n / MaxTokenBytes(nil) tokens. It returns 0 when there is no bound:
// an added token takes the whitespace around it (lstrip, rstrip), or bytes
// the vocabulary lacks are dropped or fused into one unknown token.
func (t *Tokenizer) MaxTokenBytes(weight func(byte) int) int {
	if weight == nil {
		return t.maxBytes
	}
	return t.weighTokens(weight)
}

// weighTokens is MaxTokenBytes(weight), computed.
func (t *Tokenizer) weighTokens(weight func(byte) int) int {
	most := 0
	weigh := func(s string) {
		w := 0
		for i := 0; i < len(s); i++ {
			w += weight(s[i])
		}
		most = max(most, w)
	}
	m := t.model
	for b, id := range m.byteID {
		if id >= 0 {
			continue
		}
		if m.unk < 0 || m.fuseUnk {
			return 0
		}
		weigh(string([]byte{byte(b)})) // the unknown token stands for one byte
	}
	for piece := range m.vocab {
		weigh(piece)
	}
	for _, am := range []*addedMatcher{t.rawAdded, t.normAdded} {
		for _, pats := range am.byFirst {
			for _, p := range pats {
				if p.tok.LStrip || p.tok.RStrip {
					return 0
				}
				weigh(p.text)
			}
		}
	}
	return most
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
