package ollama_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/internal/ollamatest"
	"github.com/kiln-llm/kiln/ollama"
)

func TestParseName(t *testing.T) {
	for in, want := range map[string]string{
		"qwen3":                              "registry.ollama.ai/library/qwen3:latest",
		"qwen3:8b":                           "registry.ollama.ai/library/qwen3:8b",
		"user/model:q4":                      "registry.ollama.ai/user/model:q4",
		"hf.co/unsloth/Qwen3-8B-GGUF:Q4_K_M": "hf.co/unsloth/Qwen3-8B-GGUF:Q4_K_M",
		"localhost:5000/ns/m:t":              "localhost:5000/ns/m:t",
	} {
		n, err := ollama.ParseName(in)
		if got := n.Host + "/" + n.Namespace + "/" + n.Model + ":" + n.Tag; err != nil || got != want {
			t.Errorf("ParseName(%q) = %s, %v; want %s", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"qwen3:8b":              "qwen3:8b",
		"qwen3":                 "qwen3:latest",
		"user/model":            "user/model:latest",
		"hf.co/org/repo:Q4_K_M": "hf.co/org/repo:Q4_K_M",
	} {
		if n, _ := ollama.ParseName(in); n.String() != want {
			t.Errorf("ParseName(%q).String() = %q, want %q", in, n.String(), want)
		}
	}
	for _, bad := range []string{"", "qwen3:", "../x", "a/../b", "a/b/c/d", "..:x", "q:..", "qw en", "/abs", "a/.b", "ns.x/m"} {
		if n, err := ollama.ParseName(bad); err == nil {
			t.Errorf("ParseName(%q) = %+v, want an error", bad, n)
		}
	}
}

func FuzzParseName(f *testing.F) {
	for _, s := range []string{"qwen3:8b", "hf.co/a/b:c", "a/b", "../x:y", "x/../../y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ollama.ParseName(s)
		if err != nil {
			return
		}
		for _, p := range []string{n.Host, n.Namespace, n.Model, n.Tag} {
			if p == "" || p == "." || p == ".." || strings.ContainsAny(p, "/\\\x00") {
				t.Errorf("%q parsed to a part %q that is no single path element", s, p)
			}
		}
		if again, err := ollama.ParseName(n.String()); err != nil || again != n {
			t.Errorf("%q: %q reads back as %+v, %v", s, n.String(), again, err)
		}
	})
}

// snapshotTree records every file under dir with its size and time, to
// check that reading the store changed nothing.
func snapshotTree(t *testing.T, dir string) map[string]string {
	out := map[string]string{}
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil {
			out[p] = fi.Mode().String() + fi.ModTime().String() + string(rune(fi.Size()))
		}
		return nil
	})
	return out
}

func TestStore(t *testing.T) {
	dir := t.TempDir()
	gguf := []byte("GGUF\x03\x00\x00\x00 not really a model")
	blob, err := ollamatest.Add(dir, "qwen3:8b", gguf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ollamatest.Add(dir, "qwen3:0.6b", []byte("GGUF small")); err != nil {
		t.Fatal(err)
	}
	if _, err := ollamatest.Add(dir, "hf.co/Org/Repo-GGUF:Q8_0", []byte("GGUF hf")); err != nil {
		t.Fatal(err)
	}
	// A manifest without a GGUF layer (a model of Ollama's newer engine)
	// and one whose blob is gone.
	os.MkdirAll(filepath.Join(dir, "manifests/registry.ollama.ai/library/imagegen"), 0o755)
	os.WriteFile(filepath.Join(dir, "manifests/registry.ollama.ai/library/imagegen/latest"),
		[]byte(`{"schemaVersion":2,"layers":[{"mediaType":"application/vnd.ollama.image.tensor","digest":"sha256:`+strings.Repeat("a", 64)+`","size":1}]}`), 0o644)
	gone, _ := ollamatest.Add(dir, "gone:1b", []byte("GGUF gone"))
	os.Remove(gone)
	before := snapshotTree(t, dir)

	s := ollama.Store{Dir: dir}
	for _, name := range []string{"qwen3:8b", "QWEN3:8B", "library/qwen3:8b", "registry.ollama.ai/library/qwen3:8b"} {
		n, err := ollama.ParseName(name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.Find(n)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var size int64
		for _, l := range m.Layers {
			size += l.Size
		}
		if m.Blob != blob || m.Size <= size || size <= int64(len(gguf)) {
			t.Errorf("%s: blob %s, size %d (layers %d)", name, m.Blob, m.Size, size)
		}
		data, _ := os.ReadFile(m.Manifest)
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != m.Digest {
			t.Errorf("%s: digest %s is not the manifest's sha256", name, m.Digest)
		}
	}
	n, _ := ollama.ParseName("qwen3")
	_, err = s.Find(n)
	var nf *ollama.NotFoundError
	if !errors.As(err, &nf) || !errors.Is(err, ollama.ErrNotFound) || !strings.Contains(err.Error(), "it has qwen3:0.6b, qwen3:8b") {
		t.Errorf("qwen3:latest: %v", err)
	}
	for name, want := range map[string]string{
		"imagegen": "has no GGUF model layer (it has tensor)",
		"gone:1b":  "model blob is missing",
	} {
		n, _ := ollama.ParseName(name)
		if _, err := s.Find(n); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", name, err, want)
		}
	}
	models, errs := s.List()
	var names []string
	for _, m := range models {
		names = append(names, m.Name.String())
	}
	if strings.Join(names, " ") != "hf.co/Org/Repo-GGUF:Q8_0 qwen3:0.6b qwen3:8b" || len(errs) != 2 {
		t.Errorf("List: %q, errors %v", names, errs)
	}
	if after := snapshotTree(t, dir); len(after) != len(before) {
		t.Errorf("reading the store changed it: %d entries, then %d", len(before), len(after))
	} else {
		for p, v := range before {
			if after[p] != v {
				t.Errorf("reading the store changed %s", p)
			}
		}
	}
	if _, err := (ollama.Store{Dir: filepath.Join(dir, "none")}).Find(n); !errors.Is(err, ollama.ErrNotFound) {
		t.Errorf("missing store: %v", err)
	}
}
