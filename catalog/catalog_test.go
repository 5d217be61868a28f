package catalog_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-llm/kiln/catalog"
	"github.com/kiln-llm/kiln/hub"
	"github.com/kiln-llm/kiln/internal/hubtest"
	"github.com/kiln-llm/kiln/internal/ollamatest"
	"github.com/kiln-llm/kiln/ollama"
)

// setup starts the test hub and returns a catalog over an empty hub cache
// and an Ollama store holding qwen3:8b (a GGUF fixture) and a model named
// as a hub repository is.
func setup(t *testing.T) (*catalog.Catalog, *hubtest.Hub) {
	t.Helper()
	h := hubtest.StartModels(t)
	store := t.TempDir()
	gguf := hubtest.Fixture(t, "qwen3-w256-Q8_0.gguf")
	for _, name := range []string{"qwen3:8b", "kiln-test/tiny-qwen3"} {
		if _, err := ollamatest.Add(store, name, gguf); err != nil {
			t.Fatal(err)
		}
	}
	return &catalog.Catalog{
		Hub:    &hub.Client{Endpoint: h.URL(), Cache: hub.Cache{Dir: t.TempDir()}, RetryWait: time.Millisecond},
		Ollama: ollama.Store{Dir: store},
	}, h
}

func TestResolve(t *testing.T) {
	c, _ := setup(t)
	ctx := context.Background()
	// Nothing pulled yet: the message says what was tried and what to run.
	_, err := c.Resolve("kiln-test/demo")
	var nf *catalog.NotFoundError
	if !errors.As(err, &nf) || !strings.Contains(err.Error(), "`kiln pull kiln-test/demo` downloads it") ||
		!strings.Contains(err.Error(), "models--kiln-test--demo: never downloaded") || !strings.Contains(err.Error(), "kiln-test/demo:latest is not in Ollama's store") {
		t.Errorf("unpulled: %v", err)
	}
	if _, err := c.Resolve("qwen3:32b"); err == nil || !strings.Contains(err.Error(), "it has qwen3:8b") || !strings.Contains(err.Error(), "`ollama pull qwen3:32b`") {
		t.Errorf("missing Ollama tag: %v", err)
	}

	for _, name := range []string{"kiln-test/demo", "kiln-test/qwen3-w256-GGUF:Q8_0", "kiln-test/qwen3-w256-GGUF"} {
		if _, _, err := c.Pull(ctx, name, nil); err != nil {
			t.Fatalf("pull %s: %v", name, err)
		}
	}
	snap := func(repo string) string {
		commit, err := c.Hub.Cache.Commit(hub.Ref{Repo: repo})
		if err != nil {
			t.Fatal(err)
		}
		return filepath.Join(c.Hub.Cache.RepoDir(repo), "snapshots", commit)
	}
	blob8b, _ := c.Ollama.BlobPath("sha256:" + hubtest.SHA256(hubtest.Fixture(t, "qwen3-w256-Q8_0.gguf")))
	for name, want := range map[string]struct {
		name, path, format, quant string
		source                    catalog.Source
	}{
		"kiln-test/demo":                       {"kiln-test/demo", snap("kiln-test/demo"), "safetensors", "BF16", catalog.FromHub},
		"hf:kiln-test/demo":                    {"kiln-test/demo", snap("kiln-test/demo"), "safetensors", "BF16", catalog.FromHub},
		"kiln-test/qwen3-w256-GGUF":            {"kiln-test/qwen3-w256-GGUF:Q4_K_M", snap("kiln-test/qwen3-w256-GGUF") + "/qwen3-w256-Q4_K_M.gguf", "gguf", "Q4_K_M", catalog.FromHub},
		"kiln-test/qwen3-w256-GGUF:q8_0":       {"kiln-test/qwen3-w256-GGUF:Q8_0", snap("kiln-test/qwen3-w256-GGUF") + "/qwen3-w256-Q8_0.gguf", "gguf", "Q8_0", catalog.FromHub},
		"hf.co/kiln-test/qwen3-w256-GGUF:Q8_0": {"kiln-test/qwen3-w256-GGUF:Q8_0", snap("kiln-test/qwen3-w256-GGUF") + "/qwen3-w256-Q8_0.gguf", "gguf", "Q8_0", catalog.FromHub},
		"qwen3:8b":                             {"qwen3:8b", blob8b, "gguf", "Q8_0", catalog.FromOllama},
		"ollama:library/qwen3:8b":              {"qwen3:8b", blob8b, "gguf", "Q8_0", catalog.FromOllama},
	} {
		m, err := c.Resolve(name)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if m.Name != want.name || m.Path != want.path || m.Format != want.format || m.Quant != want.quant || m.Source != want.source {
			t.Errorf("%s resolved to %+v, want %+v", name, m, want)
		}
	}

	// A name two stores hold is refused, with the names that are not.
	if _, _, err := c.Pull(ctx, "kiln-test/tiny-qwen3", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resolve("kiln-test/tiny-qwen3"); err == nil || !strings.Contains(err.Error(), "names 2 models") ||
		!strings.Contains(err.Error(), "say hf:kiln-test/tiny-qwen3") || !strings.Contains(err.Error(), "say ollama:kiln-test/tiny-qwen3:latest") {
		t.Errorf("ambiguous: %v", err)
	}
	// So is a directory of the same name; ./ makes it a path.
	dir := t.TempDir()
	t.Chdir(dir)
	os.MkdirAll("kiln-test/demo", 0o755)
	if _, err := c.Resolve("kiln-test/demo"); err == nil || !strings.Contains(err.Error(), "say ./kiln-test/demo") {
		t.Errorf("directory and hub model: %v", err)
	}
	if m, err := c.Resolve("./kiln-test/demo"); err != nil || m.Source != catalog.FromPath {
		t.Errorf("./kiln-test/demo: %+v, %v", m, err)
	}
	if _, err := c.Resolve("./nothing/here"); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("a missing path: %v", err)
	}
}

func TestListDescribeRemove(t *testing.T) {
	c, _ := setup(t)
	ctx := context.Background()
	for _, name := range []string{"kiln-test/demo", "kiln-test/qwen3-w256-GGUF:Q5_K_M", "kiln-test/qwen3-w256-GGUF:Q8_0"} {
		if _, _, err := c.Pull(ctx, name, nil); err != nil {
			t.Fatal(err)
		}
	}
	models, errs := c.List()
	if len(errs) > 0 {
		t.Errorf("List: %v", errs)
	}
	var got []string
	for _, m := range models {
		got = append(got, m.Name+" "+string(m.Source)+" "+m.Quant)
	}
	want := []string{"kiln-test/demo hf BF16", "kiln-test/qwen3-w256-GGUF:Q5_K_M hf Q5_K_M", "kiln-test/qwen3-w256-GGUF:Q8_0 hf Q8_0",
		"kiln-test/tiny-qwen3:latest ollama Q8_0", "qwen3:8b ollama Q8_0"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("List:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, m := range models {
		if again, err := c.Resolve(m.Name); err != nil && !strings.Contains(err.Error(), "names 2 models") || err == nil && again.Path != m.Path {
			t.Errorf("listed %s does not resolve back: %v", m.Name, err)
		}
		if m.Size <= 0 || m.Digest == "" {
			t.Errorf("%s: size %d, digest %q", m.Name, m.Size, m.Digest)
		}
	}
	demo, err := c.Resolve("kiln-test/demo")
	if err != nil {
		t.Fatal(err)
	}
	in, err := catalog.Describe(demo)
	if err != nil {
		t.Fatal(err)
	}
	// demo/README.md: 6 layers, hidden 256, 6,000,640 parameters, context 2048.
	if in.Arch != "Qwen3ForCausalLM" || in.Family != "qwen3" || in.Params != 6_000_640 || in.Context != 2048 || in.Layers != 6 ||
		in.Hidden != 256 || in.Vocab != 6144 || in.TemplateFrom != "chat_template.jinja" || !strings.Contains(in.Template, "<|im_start|>") || len(in.Files) != 6 {
		t.Errorf("demo: %+v", in)
	}
	gg, _ := c.Resolve("kiln-test/qwen3-w256-GGUF:Q8_0")
	if in, err := catalog.Describe(gg); err != nil || in.Family != "qwen3" || in.Params == 0 || in.Layers == 0 || in.Quant != "Q8_0" || in.TemplateFrom == "" {
		t.Errorf("GGUF: %+v, %v", in, err)
	}

	for name, want := range map[string]string{
		"qwen3:8b":         "kiln never deletes from Ollama's store; `ollama rm qwen3:8b` does",
		hubtest.Root():     "is a path, not a model of the Hugging Face cache",
		"kiln-test/absent": "not found",
	} {
		if _, _, err := c.Remove(name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("rm %s: %v, want %q", name, err, want)
		}
	}
	m, freed, err := c.Remove("kiln-test/qwen3-w256-GGUF:Q8_0")
	if err != nil || freed != m.Size || m.Size != int64(len(hubtest.Fixture(t, "qwen3-w256-Q8_0.gguf"))) {
		t.Errorf("rm :Q8_0: freed %d of %+v, %v", freed, m, err)
	}
	if _, err := c.Resolve("kiln-test/qwen3-w256-GGUF:Q5_K_M"); err != nil {
		t.Errorf("removing Q8_0 took Q5_K_M: %v", err)
	}
	if _, freed, err := c.Remove("kiln-test/demo"); err != nil || freed < 12_000_000 {
		t.Errorf("rm demo: freed %d, %v", freed, err)
	}
	if _, err := os.Stat(c.Hub.Cache.RepoDir("kiln-test/demo")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the demo's cache folder is still there: %v", err)
	}
	if _, err := c.Resolve("qwen3:8b"); err != nil {
		t.Errorf("Ollama's model after removals: %v", err)
	}
}

func TestPullOllamaName(t *testing.T) {
	c, _ := setup(t)
	_, _, err := c.Pull(context.Background(), "qwen3:8b", nil)
	if err == nil || !strings.Contains(err.Error(), "qwen3:8b is an Ollama name") || !strings.Contains(err.Error(), "`ollama pull qwen3:8b`") {
		t.Errorf("pull qwen3:8b: %v", err)
	}
}
