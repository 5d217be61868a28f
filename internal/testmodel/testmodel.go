// Package testmodel gives tests the committed fixture models
// (testdata/fixtures: Qwen-family models trained tiny by
// scripts/make_fixtures.py, each with its tokenizer, chat template and
// transformers' logits) and the real chat templates of testdata/chat.
package testmodel

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/backend/cpu"
	"github.com/kiln-llm/kiln/chat"
	"github.com/kiln-llm/kiln/model"
	"github.com/kiln-llm/kiln/tokenizer"
)

// Archs are the fixtures of every architecture kiln runs.
var Archs = []string{"qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe"}

// testdata is the repository's testdata directory, found from this file's
// place in the source tree (tests run with the source at hand).
func testdata() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata")
}

// Dir returns the absolute directory of the fixture named name (qwen3,
// qwen3next, ...).
func Dir(name string) string { return filepath.Join(testdata(), "fixtures", name) }

// Options choose what Load loads beside the fixture's weights.
type Options struct {
	// ChatTemplate names a template of testdata/chat to use instead of the
	// fixture's plain one: "qwen3.jinja" is Qwen3's own, which renders
	// tools and thinking as hub models do.
	ChatTemplate string
	Threads      int // of the CPU backend; 0: all cores
}

// Fixture is a fixture model with its tokenizer and chat template.
type Fixture struct {
	Model *model.Model
	Tok   *tokenizer.Tokenizer
	Tmpl  *chat.Template
}

// Load loads the fixture named name on a CPU backend of its own (an engine
// owns its model's caches, so each engine of a test loads its own).
func Load(t testing.TB, name string, opts Options) Fixture {
	t.Helper()
	return LoadDir(t, Dir(name), opts)
}

// LoadDir loads the model directory dir as Load loads a fixture (an
// embedding model without its chat template).
func LoadDir(t testing.TB, dir string, opts Options) Fixture {
	t.Helper()
	name := filepath.Base(dir)
	m, err := model.Load(dir, cpu.New(cpu.Options{Threads: opts.Threads}), model.Options{})
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	t.Cleanup(func() { m.Close() })
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatalf("tokenizer of %s: %v", name, err)
	}
	fsys := os.DirFS(dir)
	if opts.ChatTemplate != "" {
		// The fixture's tokenizer_config.json (its special tokens) with
		// the chosen template.
		files := fstest.MapFS{}
		for file, from := range map[string]string{"tokenizer_config.json": filepath.Join(dir, "tokenizer_config.json"),
			"chat_template.jinja": filepath.Join(testdata(), "chat", opts.ChatTemplate)} {
			b, err := os.ReadFile(from)
			if err != nil {
				t.Fatal(err)
			}
			files[file] = &fstest.MapFile{Data: b}
		}
		fsys = files
	}
	f := Fixture{Model: m, Tok: tok}
	if m.Config().Embedding != nil {
		return f // an embedding model has no chat template to need
	}
	if f.Tmpl, err = chat.LoadTemplate(fsys); err != nil {
		t.Fatalf("chat template of %s: %v", name, err)
	}
	return f
}

// AsEmbedding lays fixture name out as a sentence-transformers embedding
// model, as Qwen3-Embedding's directory is (modules.json with last-token
// Pooling and Normalize, a tokenizer that appends <|endoftext|>), in a
// temporary directory, and returns the directory.
func AsEmbedding(t testing.TB, name string) string {
	t.Helper()
	src, dir := Dir(name), t.TempDir()
	// The weights of the bare transformer, as Qwen3Model saves them: no
	// "model." prefix, no LM head.
	st, err := os.ReadFile(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	n := binary.LittleEndian.Uint64(st)
	var header map[string]json.RawMessage
	if err := json.Unmarshal(st[8:8+n], &header); err != nil {
		t.Fatal(err)
	}
	flat := map[string]json.RawMessage{}
	for k, v := range header {
		if k != "lm_head.weight" {
			flat[strings.TrimPrefix(k, "model.")] = v
		}
	}
	h, _ := json.Marshal(flat)
	h = append(h, bytes.Repeat([]byte(" "), (8-len(h)%8)%8)...)
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(h)))
	out = append(append(out, h...), st[8+n:]...)
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"config.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(filepath.Join(src, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var tok map[string]any
	if err := json.Unmarshal(b, &tok); err != nil {
		t.Fatal(err)
	}
	var eot any
	for _, a := range tok["added_tokens"].([]any) {
		if a := a.(map[string]any); a["content"] == "<|endoftext|>" {
			eot = a["id"]
		}
	}
	tok["post_processor"] = map[string]any{"type": "TemplateProcessing",
		"single":         []any{map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}, map[string]any{"SpecialToken": map[string]any{"id": "<|endoftext|>", "type_id": 0}}},
		"pair":           []any{},
		"special_tokens": map[string]any{"<|endoftext|>": map[string]any{"id": "<|endoftext|>", "ids": []any{eot}, "tokens": []any{"<|endoftext|>"}}}}
	files := map[string]any{
		"tokenizer.json": tok,
		"modules.json": []any{
			map[string]any{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
			map[string]any{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
			map[string]any{"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}},
		"1_Pooling/config.json":     map[string]any{"word_embedding_dimension": 64, "pooling_mode_lasttoken": true, "pooling_mode_mean_tokens": false, "include_prompt": true},
		"sentence_bert_config.json": map[string]any{"max_seq_length": 256, "do_lower_case": false},
	}
	for f, v := range files {
		b, _ := json.Marshal(v)
		os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// Logger returns a logger for the code under test: discarded unless the
// tests run with -v.
func Logger() *slog.Logger {
	if testing.Verbose() {
		return slog.Default()
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// Allocated returns the bytes f allocates (a bound on the work a hostile
// input may cost is asserted in bytes, never in time).
func Allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// FedMode is how FedDecode's steps get their tokens.
type FedMode string

const (
	FromHost FedMode = "from the host"
	FedAhead FedMode = "ahead" // each step issued before the last one's tokens are read
	FedMixed FedMode = "mixed" // fed rows beside sequence 2, whose token comes from the host
)

// FedDecode gives m a cache and decodes steps greedy tokens after each of
// three prompts (of 320 tokens at most, with their steps): every step
// takes the sequences in the reverse order of the last, so fed rows are
// not in the sampled rows' order. It returns each sequence's tokens; they
// must not depend on mode (model.Seq.Fed).
func FedDecode(t testing.TB, m *model.Model, prompts [][]int32, steps int, mode FedMode) [][]int32 {
	t.Helper()
	const blockSize = 16
	if err := m.AllocCache(model.CacheSpec{Blocks: 63, BlockSize: blockSize, Slots: 3}); err != nil {
		t.Fatal(err)
	}
	seqs := make([]model.Seq, 3)
	for i := range seqs {
		ids := prompts[i%len(prompts)]
		var blocks []int32
		for b := 0; b*blockSize < len(ids)+steps; b++ {
			blocks = append(blocks, int32(i*21+b))
		}
		seqs[i] = model.Seq{Tokens: ids, Blocks: blocks, Slot: i, Logits: model.LastLogits}
	}
	out := make([][]int32, len(seqs))
	record := func(slots []int, got []backend.Sampled) {
		for i, s := range slots {
			out[s] = append(out[s], got[i].Token)
		}
	}
	var lag func() ([]backend.Sampled, error) // the last step's sampling (ahead)
	var lagSlots []int
	for range steps {
		logits, err := m.Forward(seqs)
		if err != nil {
			t.Fatal(err)
		}
		wait, err := m.SampleStart(logits, make([]backend.SampleParams, len(seqs)))
		if err != nil {
			t.Fatal(err)
		}
		var slots []int
		for i := range seqs {
			slots = append(slots, seqs[i].Slot)
			seqs[i].Pos += len(seqs[i].Tokens)
		}
		var got []backend.Sampled
		if mode == FedAhead {
			if lag != nil {
				g, err := lag()
				if err != nil {
					t.Fatal(err)
				}
				record(lagSlots, g)
			}
			lag, lagSlots = wait, slots
		} else if got, err = wait(); err != nil {
			t.Fatal(err)
		} else {
			record(slots, got)
		}
		slices.Reverse(seqs)
		for i := range seqs {
			row := len(seqs) - 1 - i // seqs[i]'s row in the sampling
			seqs[i].Fed, seqs[i].FedRow = mode == FedAhead || mode == FedMixed && seqs[i].Slot != 2, row
			seqs[i].Tokens = []int32{0}
			if !seqs[i].Fed {
				seqs[i].Tokens[0] = got[row].Token
			}
		}
	}
	if lag != nil {
		g, err := lag()
		if err != nil {
			t.Fatal(err)
		}
		record(lagSlots, g)
	}
	return out
}
