// Package testmodel gives tests the committed fixture models
// (testdata/fixtures: Qwen-family models trained tiny by
// scripts/make_fixtures.py, each with its tokenizer, chat template and
// transformers' logits) and the real chat templates of testdata/chat.
package testmodel

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"testing/fstest"

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
	dir := Dir(name)
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
	tmpl, err := chat.LoadTemplate(fsys)
	if err != nil {
		t.Fatalf("chat template of %s: %v", name, err)
	}
	return Fixture{Model: m, Tok: tok, Tmpl: tmpl}
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
