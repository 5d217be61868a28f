package tokenizer

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// GGUFVocab is a tokenizer as a GGUF file's metadata stores it
// (tokenizer.ggml.*), written by llama.cpp's convert_hf_to_gguf.py from a
// model's tokenizer.json (TextModel.get_vocab_base and _set_vocab_gpt2,
// gguf-py's SpecialVocab).
type GGUFVocab struct {
	// Model is tokenizer.ggml.model; only "gpt2" (byte-level BPE) is
	// supported.
	Model string
	// Pre is tokenizer.ggml.pre, the pre-tokenizer's name: "qwen2"
	// (Qwen2, Qwen3, Qwen3-Next, Qwen3-Coder) or "qwen35" (Qwen3.5).
	Pre string
	// Tokens is tokenizer.ggml.tokens, indexed by id: the model's tokens
	// in tokenizer.json's byte-level spelling ("Ġthe"), added tokens as
	// plain text, and "[PAD{id}]" placeholders where tokenizer.json has no
	// token.
	Tokens []string
	// Types is tokenizer.ggml.token_type, one per token: 1 normal, 3
	// control, 4 user-defined, 5 unused (the placeholders). Unknown (2)
	// and byte (6) tokens do not occur in a gpt2 vocabulary.
	Types []int32
	// Merges is tokenizer.ggml.merges, "a b" by rank.
	Merges []string
	// SpecialIDs are the file's tokenizer.ggml.<name>_token_id values by
	// <name> ("bos", "eos", "padding", ...), as far as it has them. They
	// are only checked: Encode never adds them, as Load's tokenizer does
	// not (HF's add_special_tokens=False), and the caller reads stop
	// tokens and add_bos_token from the file itself.
	SpecialIDs map[string]int64
}

// Token types of tokenizer.ggml.token_type (gguf-py's TokenType).
const (
	ggufNormal      = 1
	ggufUnknown     = 2
	ggufControl     = 3
	ggufUserDefined = 4
	ggufUnused      = 5
	ggufByte        = 6
)

// ggufPre is what a tokenizer.ggml.pre name stands for: the parts of the
// model's tokenizer.json that the GGUF file does not carry.
type ggufPre struct {
	pattern      string // the Split regex before ByteLevel (use_regex false)
	nfc          bool   // an NFC normalizer
	ignoreMerges bool
}

// ggufPres are the pre-tokenizers of the Qwen family as their tokenizer.json
// files define them. llama.cpp maps further names to the same regexes
// (deepseek-r1-qwen, megrez, stablelm2, ...), but their normalizers and
// BPE flags are those of other tokenizers, so they are refused rather than
// guessed.
var ggufPres = map[string]ggufPre{
	// Qwen2/Qwen3 tokenizer.json: NFC, the split regex, "a b" merges.
	"qwen2": {pattern: qwenPattern(false, 1), nfc: true},
	// Qwen3.5: letters take marks; no normalizer; ignore_merges.
	"qwen35": {pattern: qwenPattern(true, 1), ignoreMerges: true},
}

// FromGGUF builds a Tokenizer from the tokenizer stored in a GGUF file's
// metadata. It gives the ids and text that the tokenizer.json the file was
// converted from gives, with these limits, which follow from what the file
// keeps:
//
//   - Control and user-defined tokens are the added tokens: matched in the
//     text before anything else, leftmost-longest, as written (not
//     normalized), without lstrip, rstrip or single_word (Qwen's added
//     tokens have none of these).
//   - IsSpecial reports control tokens. The converter writes as control
//     every added token HF marks special and every other that looks
//     special ("<|...|>"), so Qwen's <|fim_prefix|>, <|repo_name|> and the
//     like, not special in tokenizer.json, are special here.
//   - Unused tokens (the converter's "[PAD{id}]" fillers up to the model's
//     vocab_size) are holes, as in tokenizer.json: no token, decoding to
//     nothing. VocabSize ends after the last token that is not one.
//
// Every part is validated; bad input gives an error, never a panic.
func FromGGUF(v GGUFVocab) (*Tokenizer, error) {
	t, err := fromGGUF(&v)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: gguf: %w", err)
	}
	return t, nil
}

func fromGGUF(v *GGUFVocab) (*Tokenizer, error) {
	if v.Model != "gpt2" {
		return nil, fmt.Errorf("tokenizer.ggml.model %q is not supported (gpt2 is)", v.Model)
	}
	pre, ok := ggufPres[v.Pre]
	if !ok {
		return nil, fmt.Errorf("tokenizer.ggml.pre %q is not supported (%s are)", v.Pre, strings.Join(ggufPreNames(), ", "))
	}
	n := len(v.Tokens)
	switch {
	case n == 0:
		return nil, errors.New("tokenizer.ggml.tokens is empty")
	case n > maxTokens:
		return nil, fmt.Errorf("tokenizer.ggml.tokens has %d tokens, more than the %d allowed", n, maxTokens)
	case len(v.Types) != n:
		return nil, fmt.Errorf("tokenizer.ggml.token_type has %d entries for %d tokens", len(v.Types), n)
	case len(v.Merges) == 0:
		return nil, errors.New("tokenizer.ggml.merges is empty; a gpt2 vocabulary needs merges")
	case len(v.Merges) > maxMerges:
		return nil, fmt.Errorf("tokenizer.ggml.merges has %d merges, more than the %d allowed", len(v.Merges), maxMerges)
	}

	m := &bpe{
		vocab:        map[string]int32{},
		merges:       make(map[uint64]uint64, len(v.Merges)),
		ignoreMerges: pre.ignoreMerges,
		unk:          -1,
		cache:        map[string][]int32{},
	}
	for i := range m.byteID {
		m.byteID[i] = -1
	}
	ids := make(map[string]int32, n)
	normal := make(map[string]int32, n) // the BPE model's vocabulary
	var added []addedToken
	size := 0 // one past the last token that is not a hole
	for i, tok := range v.Tokens {
		id := int32(i)
		ty := v.Types[i]
		switch ty {
		case ggufUnused:
			continue
		case ggufNormal, ggufControl, ggufUserDefined:
		case ggufUnknown, ggufByte:
			return nil, fmt.Errorf("token %d (%q) has type %d (%s), which a gpt2 vocabulary does not use", i, clip(tok), ty, map[int32]string{ggufUnknown: "unknown", ggufByte: "byte"}[ty])
		default:
			return nil, fmt.Errorf("token %d (%q) has type %d, not a token type (1 to 6)", i, clip(tok), ty)
		}
		switch {
		case tok == "":
			return nil, fmt.Errorf("token %d is empty", i)
		case len(tok) > maxTokenLen:
			return nil, fmt.Errorf("token %d is %d bytes long, more than the %d allowed", i, len(tok), maxTokenLen)
		case !utf8.ValidString(tok):
			return nil, fmt.Errorf("token %d (%q) is not valid UTF-8", i, clip(tok))
		}
		if prev, dup := ids[tok]; dup {
			return nil, fmt.Errorf("tokens %d and %d are both %q", prev, i, clip(tok))
		}
		ids[tok] = id
		size = i + 1
		if ty != ggufNormal {
			added = append(added, addedToken{ID: id, Content: tok, Special: ty == ggufControl})
			continue
		}
		normal[tok] = id
		if raw, ok := fromByteLevel(tok); ok {
			m.vocab[raw] = id
			if len(raw) == 1 {
				m.byteID[raw[0]] = id
			}
		}
	}
	if len(normal) == 0 {
		return nil, errors.New("tokenizer.ggml.tokens has no normal tokens")
	}

	for rank, mg := range v.Merges {
		// llama.cpp splits at the first space after the first byte.
		sp := -1
		if len(mg) > 1 {
			if j := strings.IndexByte(mg[1:], ' '); j >= 0 {
				sp = j + 1
			}
		}
		if sp < 0 {
			return nil, fmt.Errorf("merge %d (%q) is not two tokens separated by a space", rank, clip(mg))
		}
		a, b := mg[:sp], mg[sp+1:]
		ia, oka := normal[a]
		ib, okb := normal[b]
		in, okn := normal[a+b]
		switch {
		case !oka:
			return nil, fmt.Errorf("merge %d (%q): %q is not a normal token", rank, clip(mg), clip(a))
		case !okb:
			return nil, fmt.Errorf("merge %d (%q): %q is not a normal token", rank, clip(mg), clip(b))
		case !okn:
			return nil, fmt.Errorf("merge %d (%q): %q is not a normal token", rank, clip(mg), clip(a+b))
		}
		// A repeated pair keeps its last rank, as HF's map does.
		m.merges[pairKey(ia, ib)] = uint64(rank)<<32 | uint64(uint32(in))
	}

	names := make([]string, 0, len(v.SpecialIDs))
	for name := range v.SpecialIDs {
		names = append(names, name)
	}
	slices.Sort(names) // the first bad one in a fixed order
	for _, name := range names {
		if id := v.SpecialIDs[name]; id < 0 || id >= int64(n) {
			return nil, fmt.Errorf("tokenizer.ggml.%s_token_id %d is outside the %d tokens", name, id, n)
		}
	}

	sc := knownScanner(pre.pattern)
	if sc == nil {
		return nil, fmt.Errorf("tokenizer.ggml.pre %q: no scanner for its pattern", v.Pre)
	}
	t := &Tokenizer{
		splits:       []splitter{sc},
		byteLevel:    true,
		prefixBefore: -1,
		model:        m,
		normAdded:    newAddedMatcher(nil),
		tokens:       make([]string, size),
		bytes:        make([][]byte, size),
		special:      make([]bool, size),
		ids:          ids,
	}
	if pre.nfc {
		t.normalize = norm.NFC.String
	}
	for tok, id := range ids {
		t.tokens[id] = tok
		t.bytes[id] = byteLevelDecode(tok)
	}
	pats := make([]addedPattern, len(added))
	for i := range added {
		a := &added[i]
		pats[i] = addedPattern{text: a.Content, tok: a}
		t.special[a.ID] = a.Special
		// The converter stored an added token as the text HF decodes it
		// to (decode(encode(token))); its bytes are that text.
		t.bytes[a.ID] = []byte(a.Content)
	}
	t.rawAdded = newAddedMatcher(pats)
	t.maxBytes = t.weighTokens(func(byte) int { return 1 })
	return t, nil
}

func ggufPreNames() []string {
	names := make([]string, 0, len(ggufPres))
	for name := range ggufPres {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// clip shortens s for an error message.
func clip(s string) string {
	const limit = 64
	if len(s) <= limit {
		return s
	}
	i := limit
	for i > 0 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i] + "..."
}
