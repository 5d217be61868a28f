package model

import (
	"strings"
	"testing"
	"testing/fstest"
)

// A sentence-transformers directory's modules: Qwen3-Embedding's layout is
// read, anything kiln would compute differently is refused by name, and a
// directory without modules.json is a generative model.
func TestReadEmbedding(t *testing.T) {
	modules := `[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},` +
		`{"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},` +
		`{"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]`
	last := `{"word_embedding_dimension":1024,"pooling_mode_cls_token":false,"pooling_mode_mean_tokens":false,"pooling_mode_lasttoken":true,"include_prompt":true}`
	e, err := readEmbedding(fstest.MapFS{"modules.json": {Data: []byte(modules)}, "1_Pooling/config.json": {Data: []byte(last)},
		"sentence_bert_config.json": {Data: []byte(`{"max_seq_length": 32768, "do_lower_case": false}`)}})
	if err != nil || e == nil || !e.Normalize || e.MaxTokens != 32768 {
		t.Fatalf("Qwen3-Embedding's layout: %+v, %v", e, err)
	}
	if e, err := readEmbedding(fstest.MapFS{"config.json": {Data: []byte(`{}`)}}); e != nil || err != nil {
		t.Errorf("no modules.json: %+v, %v", e, err)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"mean":              {"modules.json": {Data: []byte(modules)}, "1_Pooling/config.json": {Data: []byte(strings.Replace(last, `"pooling_mode_mean_tokens":false`, `"pooling_mode_mean_tokens":true`, 1))}},
		"Dense":             {"modules.json": {Data: []byte(strings.Replace(modules, "models.Normalize", "models.Dense", 1))}, "1_Pooling/config.json": {Data: []byte(last)}},
		"no pooling config": {"modules.json": {Data: []byte(modules)}},
		"no pooling":        {"modules.json": {Data: []byte(`[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"}]`)}},
		"bad JSON":          {"modules.json": {Data: []byte(`[`)}},
	} {
		if e, err := readEmbedding(fsys); err == nil {
			t.Errorf("%s: accepted as %+v", name, e)
		}
	}
}
