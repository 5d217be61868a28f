package hubtest

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/demo"
)

// Root is the repository's root directory (for testdata).
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// lfs reports whether the hub would store a file with LFS: weights, and
// anything of 10 MB or more.
func lfs(name string, size int) bool {
	return strings.HasSuffix(name, ".safetensors") || strings.HasSuffix(name, ".gguf") || size >= 10<<20
}

// dirRepo is a repository of the files of a directory, plus a README.
func dirRepo(id string, fsys fs.FS, names ...string) (*Repo, error) {
	r := &Repo{ID: id, Files: []File{{Name: "README.md", Data: []byte("# " + id + "\n\nServed by kiln's test hub.\n")}}}
	for _, n := range names {
		data, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, err
		}
		r.Files = append(r.Files, File{Name: n, Data: data, LFS: lfs(n, len(data))})
	}
	return r, nil
}

// Models are the repositories of real models the test hub serves:
//
//   - kiln-test/demo: kiln's embedded demo model as a Hugging Face
//     checkpoint (bf16 safetensors, tokenizer, template, generation config);
//   - kiln-test/tiny-qwen3: testdata/fixtures/qwen3, a 3-layer random Qwen3;
//   - kiln-test/qwen3-w256-GGUF: llama.cpp's Q4_K_M, Q5_K_M and Q8_0 files
//     of a 256-wide random Qwen3 (testdata/quant).
func Models() ([]*Repo, error) {
	root := Root()
	text := []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "model.safetensors"}
	demoRepo, err := dirRepo("kiln-test/demo", demo.FS(), append(text, "LICENSE")...)
	if err != nil {
		return nil, err
	}
	tiny, err := dirRepo("kiln-test/tiny-qwen3", os.DirFS(filepath.Join(root, "testdata", "fixtures", "qwen3")), text...)
	if err != nil {
		return nil, err
	}
	ggufs, err := dirRepo("kiln-test/qwen3-w256-GGUF", os.DirFS(filepath.Join(root, "testdata", "quant")),
		"qwen3-w256-Q4_K_M.gguf", "qwen3-w256-Q5_K_M.gguf", "qwen3-w256-Q8_0.gguf")
	if err != nil {
		return nil, fmt.Errorf("the GGUF fixtures: %w", err)
	}
	return []*Repo{demoRepo, tiny, ggufs}, nil
}

// StartModels starts a hub serving Models for the test's duration.
func StartModels(tb testing.TB) *Hub {
	tb.Helper()
	repos, err := Models()
	if err != nil {
		tb.Fatal(err)
	}
	h := New(repos...)
	tb.Cleanup(h.Close)
	return h
}

// Fixture returns the bytes of testdata/quant/NAME, a GGUF file llama.cpp
// made.
func Fixture(tb testing.TB, name string) []byte {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(Root(), "testdata", "quant", name))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
