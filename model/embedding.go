package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path"
)

// EmbeddingConfig says how a sentence-transformers model directory
// (Qwen3-Embedding's layout: modules.json listing a Transformer, a Pooling
// and a Normalize module) turns the model's hidden states into a sentence
// embedding. kiln supports last-token pooling: the embedding is the final
// normed hidden state of a text's last token (the end-of-text token its
// tokenizer appends).
type EmbeddingConfig struct {
	Normalize bool // L2 normalization follows the pooling
	// MaxTokens is sentence_bert_config.json's max_seq_length, the most
	// tokens of an input (sentence-transformers truncates longer ones); 0:
	// the context length.
	MaxTokens int
}

// readEmbedding reads a directory's sentence-transformers modules: nil when
// it has none (a generative model).
func readEmbedding(fsys fs.FS) (*EmbeddingConfig, error) {
	data, err := fs.ReadFile(fsys, "modules.json")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var modules []struct {
		Path string `json:"path"`
		Type string `json:"type"`
	}
	if err := json.Unmarshal(data, &modules); err != nil {
		return nil, fmt.Errorf("modules.json: %w", err)
	}
	e := &EmbeddingConfig{}
	pooled := false
	for i, m := range modules {
		switch m.Type {
		case "sentence_transformers.models.Transformer":
			if i != 0 {
				return nil, fmt.Errorf("modules.json: the Transformer module is not the first")
			}
		case "sentence_transformers.models.Pooling":
			if err := readPooling(fsys, path.Join(m.Path, "config.json")); err != nil {
				return nil, err
			}
			pooled = true
		case "sentence_transformers.models.Normalize":
			if !pooled {
				return nil, fmt.Errorf("modules.json: Normalize before Pooling is not supported")
			}
			e.Normalize = true
		default:
			return nil, fmt.Errorf("modules.json: the sentence-transformers module %q is not supported (kiln runs Transformer, Pooling and Normalize)", m.Type)
		}
	}
	if !pooled {
		return nil, fmt.Errorf("modules.json lists no Pooling module")
	}
	if data, err := fs.ReadFile(fsys, "sentence_bert_config.json"); err == nil {
		var sb struct {
			MaxSeqLength int `json:"max_seq_length"`
		}
		if err := json.Unmarshal(data, &sb); err != nil {
			return nil, fmt.Errorf("sentence_bert_config.json: %w", err)
		}
		e.MaxTokens = max(sb.MaxSeqLength, 0)
	}
	return e, nil
}

// readPooling checks that a Pooling module pools the last token alone.
func readPooling(fsys fs.FS, file string) error {
	data, err := fs.ReadFile(fsys, file)
	if err != nil {
		return fmt.Errorf("the Pooling module's config: %w", err)
	}
	var modes map[string]any
	if err := json.Unmarshal(data, &modes); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	var on []string
	for k, v := range modes {
		if b, ok := v.(bool); ok && b && k != "include_prompt" {
			on = append(on, k)
		}
	}
	if mode, ok := modes["pooling_mode"].(string); ok && mode != "lasttoken" {
		on = append(on, mode)
	}
	if len(on) != 1 || on[0] != "pooling_mode_lasttoken" {
		return fmt.Errorf("%s: pooling %v is not supported (kiln pools the last token: pooling_mode_lasttoken)", file, on)
	}
	return nil
}
