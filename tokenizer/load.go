package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"golang.org/x/text/unicode/norm"

	"github.com/kiln-llm/kiln/internal/mapfile"
)

// fileJSON is the part of tokenizer.json that encoding and decoding use.
// Of the post-processor only a TemplateProcessing's single-sequence
// template is read (the special tokens add_special_tokens=True puts around
// a text); ByteLevel's changes only offsets.
type fileJSON struct {
	AddedTokens   []addedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	Decoder       json.RawMessage `json:"decoder"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Model         modelJSON       `json:"model"`
}

type modelJSON struct {
	Type                    string           `json:"type"`
	Dropout                 *float64         `json:"dropout"`
	UnkToken                *string          `json:"unk_token"`
	ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string          `json:"end_of_word_suffix"`
	FuseUnk                 bool             `json:"fuse_unk"`
	ByteFallback            bool             `json:"byte_fallback"`
	IgnoreMerges            bool             `json:"ignore_merges"`
	Vocab                   map[string]int32 `json:"vocab"`
	Merges                  []any            `json:"merges"`
}

type typed struct {
	Type string `json:"type"`
}

// Limits on a vocabulary, far above any real one (Qwen3.5 has 248,320
// tokens and about as many merges in an 11 MB tokenizer.json), so that a
// damaged or hostile file fails with an error naming what is wrong rather
// than a panic or an allocation of gigabytes.
const (
	maxTokens   = 1 << 22
	maxMerges   = 1 << 23
	maxTokenLen = 1 << 16
	maxFileSize = 1 << 28
)

// Load reads DIR/tokenizer.json.
func Load(dir string) (*Tokenizer, error) {
	path := filepath.Join(dir, "tokenizer.json")
	data, err := mapfile.ReadFile(path, maxFileSize)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, err)
	}
	return t, nil
}

// LoadFS reads tokenizer.json at the root of fsys.
func LoadFS(fsys fs.FS) (*Tokenizer, error) {
	data, err := mapfile.ReadFS(fsys, "tokenizer.json", maxFileSize)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: tokenizer.json: %w", err)
	}
	return t, nil
}

func parse(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	t := &Tokenizer{prefixBefore: -1}
	var err error
	if t.normalize, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if err = t.parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if err = parseDecoder(f.Decoder); err != nil {
		return nil, err
	}
	if t.model, err = parseModel(&f.Model); err != nil {
		return nil, err
	}
	if err := checkAdded(f.AddedTokens); err != nil {
		return nil, err
	}
	if t.prefix, t.suffix, err = parseTemplate(f.PostProcessor); err != nil {
		return nil, err
	}
	t.buildVocab(&f)
	return t, nil
}

// parseTemplate reads the special tokens a TemplateProcessing
// post-processor (alone or in a Sequence) puts before and after a single
// sequence.
func parseTemplate(raw json.RawMessage) (prefix, suffix []int32, err error) {
	if isNull(raw) {
		return nil, nil, nil
	}
	var pp struct {
		Type       string            `json:"type"`
		Processors []json.RawMessage `json:"processors"`
		Single     []struct {
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []int32 `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := json.Unmarshal(raw, &pp); err != nil {
		return nil, nil, fmt.Errorf("post_processor: %w", err)
	}
	switch pp.Type {
	case "Sequence":
		for _, p := range pp.Processors {
			pre, suf, err := parseTemplate(p)
			if err != nil || pre != nil || suf != nil {
				return pre, suf, err
			}
		}
	case "TemplateProcessing":
		seen := false
		for _, piece := range pp.Single {
			switch {
			case piece.Sequence != nil:
				if piece.Sequence.ID != "A" || seen {
					return nil, nil, fmt.Errorf("post_processor: a single template of sequence %q", piece.Sequence.ID)
				}
				seen = true
			case piece.SpecialToken != nil:
				st, ok := pp.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return nil, nil, fmt.Errorf("post_processor: special token %q not defined", piece.SpecialToken.ID)
				}
				for _, id := range st.IDs {
					if id < 0 || id >= maxTokens {
						return nil, nil, fmt.Errorf("post_processor: special token %q: id %d is outside 0 to %d", clip(piece.SpecialToken.ID), id, maxTokens-1)
					}
				}
				if seen {
					suffix = append(suffix, st.IDs...)
				} else {
					prefix = append(prefix, st.IDs...)
				}
			}
		}
	}
	return prefix, suffix, nil
}

func parseNormalizer(raw json.RawMessage) (func(string) string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var ty typed
	if err := json.Unmarshal(raw, &ty); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	switch ty.Type {
	case "NFC":
		return norm.NFC.String, nil
	case "NFD":
		return norm.NFD.String, nil
	case "NFKC":
		return norm.NFKC.String, nil
	case "NFKD":
		return norm.NFKD.String, nil
	case "Sequence":
		var seq struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := json.Unmarshal(raw, &seq); err != nil {
			return nil, fmt.Errorf("normalizer: %w", err)
		}
		var fns []func(string) string
		for _, r := range seq.Normalizers {
			fn, err := parseNormalizer(r)
			if err != nil {
				return nil, err
			}
			if fn != nil {
				fns = append(fns, fn)
			}
		}
		switch len(fns) {
		case 0:
			return nil, nil
		case 1:
			return fns[0], nil
		}
		return func(s string) string {
			for _, fn := range fns {
				s = fn(s)
			}
			return s
		}, nil
	}
	return nil, fmt.Errorf("normalizer %q is not supported (NFC, NFD, NFKC, NFKD and Sequence are)", ty.Type)
}

func (t *Tokenizer) parsePreTokenizer(raw json.RawMessage) error {
	if isNull(raw) {
		return errors.New("pre_tokenizer: none given; a byte-level BPE needs ByteLevel")
	}
	var ty typed
	if err := json.Unmarshal(raw, &ty); err != nil {
		return fmt.Errorf("pre_tokenizer: %w", err)
	}
	steps := []json.RawMessage{raw}
	if ty.Type == "Sequence" {
		var seq struct {
			PreTokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := json.Unmarshal(raw, &seq); err != nil {
			return fmt.Errorf("pre_tokenizer: %w", err)
		}
		steps = seq.PreTokenizers
	}
	for i, r := range steps {
		var st struct {
			Type           string `json:"type"`
			AddPrefixSpace bool   `json:"add_prefix_space"`
			UseRegex       *bool  `json:"use_regex"`
			Behavior       string `json:"behavior"`
			Invert         bool   `json:"invert"`
			Pattern        struct {
				Regex  *string `json:"Regex"`
				String *string `json:"String"`
			} `json:"pattern"`
		}
		if err := json.Unmarshal(r, &st); err != nil {
			return fmt.Errorf("pre_tokenizer: %w", err)
		}
		switch st.Type {
		case "Split":
			if t.byteLevel {
				return errors.New("pre_tokenizer: Split after ByteLevel is not supported")
			}
			if st.Behavior != "Isolated" || st.Invert {
				return fmt.Errorf("pre_tokenizer: Split with behavior %q invert %v is not supported (Isolated, not inverted, is)", st.Behavior, st.Invert)
			}
			var sp splitter
			switch {
			case st.Pattern.Regex != nil:
				var err error
				if sp, err = newSplitter(*st.Pattern.Regex); err != nil {
					return fmt.Errorf("pre_tokenizer: %w", err)
				}
			case st.Pattern.String != nil:
				sp = literalSplitter(*st.Pattern.String)
			default:
				return errors.New("pre_tokenizer: Split without a pattern")
			}
			t.splits = append(t.splits, sp)
		case "ByteLevel":
			if i != len(steps)-1 {
				return errors.New("pre_tokenizer: ByteLevel must be the last step")
			}
			t.byteLevel = true
			if st.AddPrefixSpace {
				t.prefixBefore = len(t.splits)
			}
			if st.UseRegex == nil || *st.UseRegex {
				t.splits = append(t.splits, knownScanner(gpt2Pattern))
			}
		default:
			return fmt.Errorf("pre_tokenizer %q is not supported (Sequence, Split and ByteLevel are)", st.Type)
		}
	}
	if !t.byteLevel {
		return errors.New("pre_tokenizer: no ByteLevel step; only byte-level BPE is supported")
	}
	return nil
}

func parseDecoder(raw json.RawMessage) error {
	var ty typed
	if !isNull(raw) {
		if err := json.Unmarshal(raw, &ty); err != nil {
			return fmt.Errorf("decoder: %w", err)
		}
	}
	if ty.Type != "ByteLevel" {
		return fmt.Errorf("decoder %q is not supported (ByteLevel is)", ty.Type)
	}
	return nil
}

func parseModel(mj *modelJSON) (*bpe, error) {
	if mj.Type != "BPE" && mj.Type != "" {
		return nil, fmt.Errorf("model %q is not supported (BPE is)", mj.Type)
	}
	if mj.Dropout != nil && *mj.Dropout > 0 {
		return nil, errors.New("model: BPE dropout is not supported")
	}
	if mj.ByteFallback {
		return nil, errors.New("model: byte_fallback is not supported")
	}
	if p := mj.ContinuingSubwordPrefix; p != nil && *p != "" {
		return nil, errors.New("model: continuing_subword_prefix is not supported")
	}
	if p := mj.EndOfWordSuffix; p != nil && *p != "" {
		return nil, errors.New("model: end_of_word_suffix is not supported")
	}
	m := &bpe{
		vocab:        make(map[string]int32, len(mj.Vocab)),
		merges:       make(map[uint64]uint64, len(mj.Merges)),
		ignoreMerges: mj.IgnoreMerges,
		fuseUnk:      mj.FuseUnk,
		unk:          -1,
		cache:        map[string][]int32{},
	}
	for i := range m.byteID {
		m.byteID[i] = -1
	}
	if len(mj.Merges) > maxMerges {
		return nil, fmt.Errorf("model.merges: %d merges, more than the %d allowed", len(mj.Merges), maxMerges)
	}
	byID := make(map[int32]string, len(mj.Vocab))
	for tok, id := range mj.Vocab {
		switch {
		case id < 0 || id >= maxTokens:
			return nil, fmt.Errorf("model.vocab: token %q has id %d, outside 0 to %d", clip(tok), id, maxTokens-1)
		case len(tok) > maxTokenLen:
			return nil, fmt.Errorf("model.vocab: token %q is %d bytes long, more than the %d allowed", clip(tok), len(tok), maxTokenLen)
		case tok == "":
			return nil, fmt.Errorf("model.vocab: an empty token (id %d)", id)
		}
		if other, dup := byID[id]; dup {
			a, b := min(tok, other), max(tok, other) // a fixed order for the message
			return nil, fmt.Errorf("model.vocab: tokens %q and %q have the same id %d", clip(a), clip(b), id)
		}
		byID[id] = tok
		raw, ok := fromByteLevel(tok)
		if !ok {
			// Not made of byte-level characters: no piece can ever
			// spell it, so it only matters for id lookups.
			continue
		}
		m.vocab[raw] = id
		if len(raw) == 1 {
			m.byteID[raw[0]] = id
		}
	}
	if mj.UnkToken != nil {
		id, ok := mj.Vocab[*mj.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model: unk_token %q is not in the vocabulary", *mj.UnkToken)
		}
		m.unk = id
	}
	for rank, r := range mj.Merges {
		a, b, err := parseMerge(r)
		if err != nil {
			return nil, fmt.Errorf("model: merge %d: %w", rank, err)
		}
		ia, oka := mj.Vocab[a]
		ib, okb := mj.Vocab[b]
		in, okn := mj.Vocab[a+b]
		switch {
		case !oka:
			return nil, fmt.Errorf("model: merge %d: %q is not in the vocabulary", rank, a)
		case !okb:
			return nil, fmt.Errorf("model: merge %d: %q is not in the vocabulary", rank, b)
		case !okn:
			return nil, fmt.Errorf("model: merge %d: %q is not in the vocabulary", rank, a+b)
		}
		// A repeated pair keeps its last rank, as HF's map does.
		m.merges[pairKey(ia, ib)] = uint64(rank)<<32 | uint64(uint32(in))
	}
	return m, nil
}

// checkAdded range-checks added_tokens, which buildVocab indexes by id.
func checkAdded(added []addedToken) error {
	if len(added) > maxTokens {
		return fmt.Errorf("added_tokens: %d tokens, more than the %d allowed", len(added), maxTokens)
	}
	for i, a := range added {
		switch {
		case a.ID < 0 || a.ID >= maxTokens:
			return fmt.Errorf("added_tokens[%d] (%q): id %d is outside 0 to %d", i, clip(a.Content), a.ID, maxTokens-1)
		case a.Content == "":
			return fmt.Errorf("added_tokens[%d] (id %d): content is empty", i, a.ID)
		case len(a.Content) > maxTokenLen:
			return fmt.Errorf("added_tokens[%d] (id %d): content is %d bytes long, more than the %d allowed", i, a.ID, len(a.Content), maxTokenLen)
		}
	}
	return nil
}

// parseMerge reads a merge in either form: "a b" or ["a", "b"].
func parseMerge(v any) (string, string, error) {
	switch m := v.(type) {
	case string:
		a, b, ok := strings.Cut(m, " ")
		if !ok || strings.Contains(b, " ") {
			return "", "", fmt.Errorf("%q is not two tokens separated by one space", m)
		}
		return a, b, nil
	case []any:
		if len(m) == 2 {
			a, oka := m[0].(string)
			b, okb := m[1].(string)
			if oka && okb {
				return a, b, nil
			}
		}
	}
	return "", "", fmt.Errorf("%v is neither \"a b\" nor [\"a\", \"b\"]", v)
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}
