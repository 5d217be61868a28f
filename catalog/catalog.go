// Package catalog is the models on this machine, by every name users give
// them: a model directory or GGUF file; a Hugging Face hub id in the shared
// hub cache (Org/Name, @revision, :QUANT for a repository of GGUF files);
// an Ollama name in Ollama's store (qwen3:8b), used in place. Resolve turns
// a name into the path kiln loads, or says what it tried and what to run;
// List and Describe say what is there (kiln ls and show, Ollama's
// /api/tags and /api/show); Pull and Remove change the hub cache, never
// Ollama's store.
package catalog

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kiln-llm/kiln/gguf"
	"github.com/kiln-llm/kiln/hub"
	"github.com/kiln-llm/kiln/ollama"
)

// Catalog finds models in the hub cache, Ollama's store and the file
// system.
type Catalog struct {
	// Hub downloads into its Cache, where hub models are found.
	Hub    *hub.Client
	Ollama ollama.Store
	// Check, when set, vets a checkpoint Pull is fetching once its config
	// is in, before its weights (kiln: that it loads such a model).
	Check func(snapshot string) error
}

// Default is the catalog of this user's environment: the hub client and
// cache of hub.FromEnv and Ollama's store at ollama.DefaultDir.
func Default() *Catalog {
	return &Catalog{Hub: hub.FromEnv(), Ollama: ollama.Store{Dir: ollama.DefaultDir()}}
}

// Source says where a model lives.
type Source string

const (
	FromPath   Source = "path"   // a directory or file named by its path
	FromHub    Source = "hf"     // the Hugging Face hub cache
	FromOllama Source = "ollama" // Ollama's store
)

// Model is one model on this machine.
type Model struct {
	// Name is how the model is named: "Qwen/Qwen3-8B",
	// "Qwen/Qwen3-8B-GGUF:Q4_K_M", "qwen3:8b", or the path given.
	Name   string
	Source Source
	Path   string // what kiln loads: a model directory or a GGUF file
	Where  string // where it lives: its hub cache folder, its Ollama manifest, its path
	// Size is its bytes on disk; Digest identifies its bytes: the commit of
	// a hub checkpoint, the sha256 of a hub GGUF file, the manifest's sha256
	// for Ollama ("" for a path).
	Size     int64
	Digest   string
	Modified time.Time
	Format   string // "safetensors" or "gguf"
	Quant    string // BF16, FP8, Q4_K_M, ...

	ref hub.Ref // a hub model's reference
}

// Resolve finds the model s names. A path (absolute, ./, ../, ~/, a .gguf
// name) is only a path; hf:NAME and ollama:NAME ask one store; any other
// name is looked up everywhere it could be (an existing path, the hub
// cache, Ollama's store), and must be found in exactly one. Failures say
// what was tried and what to run.
func (c *Catalog) Resolve(s string) (*Model, error) { return c.resolve(s, true) }

// Find is Resolve without paths: it looks only in the hub cache and
// Ollama's store, for names that come from the network.
func (c *Catalog) Find(s string) (*Model, error) { return c.resolve(s, false) }

func (c *Catalog) resolve(s string, paths bool) (*Model, error) {
	switch {
	case s == "":
		return nil, errors.New("no model named")
	case strings.HasPrefix(s, "hf:"):
		ref, err := hub.ParseRef(s[3:])
		if err != nil {
			return nil, err
		}
		return c.fromHub(ref)
	case strings.HasPrefix(s, "ollama:"):
		n, err := ollama.ParseName(s[7:])
		if err != nil {
			return nil, err
		}
		return c.fromOllama(n)
	case isPath(s):
		if !paths {
			return nil, fmt.Errorf("%q is a path; name a model of the Hugging Face cache or of Ollama's store", s)
		}
		return fromPath(s)
	}
	var found []*Model
	var tried []string
	if _, err := os.Stat(s); err == nil && paths {
		m, err := fromPath(s)
		if err != nil {
			return nil, err
		}
		found = append(found, m)
	}
	ref, hubErr := hub.ParseRef(s)
	name, ollamaErr := ollama.ParseName(s)
	if ollamaErr == nil && strings.HasPrefix(s, "hf.co/") {
		// Ollama's own spelling of a hub model: Ollama's copy first.
		if m, err := c.fromOllama(name); err == nil {
			return m, nil
		}
	}
	// look records what one store holds; a store that fails otherwise
	// than by not holding the model fails the lookup.
	look := func(m *Model, err, missing error) error {
		switch {
		case err == nil:
			found = append(found, m)
		case errors.Is(err, missing):
			tried = append(tried, err.Error())
		default:
			return err
		}
		return nil
	}
	if hubErr == nil {
		m, err := c.fromHub(ref)
		if err := look(m, err, hub.ErrNotCached); err != nil {
			return nil, err
		}
	}
	if ollamaErr == nil {
		m, err := c.fromOllama(name)
		if err := look(m, err, ollama.ErrNotFound); err != nil {
			return nil, err
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return nil, &NotFoundError{Name: s, Tried: tried, Path: paths, Hub: hubErr == nil, Ollama: ollamaErr == nil}
	}
	var where []string
	for _, m := range found {
		where = append(where, fmt.Sprintf("%s (%s, say %s)", m.Path, m.Source, m.Ref()))
	}
	return nil, fmt.Errorf("%q names %d models: %s", s, len(found), strings.Join(where, "; "))
}

// Ref is a name of the model that no other store can claim: hf:NAME,
// ollama:NAME, or a path that reads as one.
func (m *Model) Ref() string {
	switch m.Source {
	case FromHub:
		return "hf:" + m.Name
	case FromOllama:
		return "ollama:" + m.Name
	}
	if filepath.IsAbs(m.Name) || strings.HasPrefix(m.Name, ".") {
		return m.Name
	}
	return "./" + m.Name
}

// NotFoundError is a name no store holds.
type NotFoundError struct {
	Name              string
	Tried             []string
	Path, Hub, Ollama bool // the name could be a path, a hub id, an Ollama name
}

func (e *NotFoundError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "model %q not found:", e.Name)
	tried := e.Tried
	if e.Path {
		tried = append([]string{"no file or directory " + e.Name}, tried...)
	}
	for _, t := range tried {
		b.WriteString("\n  " + t)
	}
	switch {
	case e.Hub:
		fmt.Fprintf(&b, "\n`kiln pull %s` downloads it from the Hugging Face hub", e.Name)
	case e.Ollama:
		fmt.Fprintf(&b, "\n`ollama pull %s` puts it in Ollama's store, where kiln finds it; `kiln pull ORG/NAME` downloads a model from the Hugging Face hub", e.Name)
	default:
		b.WriteString("\ngive a model directory, a .gguf file, a Hugging Face id (Qwen/Qwen3-8B) or an Ollama name (qwen3:8b)")
	}
	return b.String()
}

// isPath reports whether s can only be a path.
func isPath(s string) bool {
	return filepath.IsAbs(s) || s == "." || s == ".." || strings.HasPrefix(s, "./") || strings.HasPrefix(s, "../") ||
		strings.HasPrefix(s, "~/") || strings.HasSuffix(strings.ToLower(s), ".gguf") || strings.Count(s, "/") > 2
}

// fromPath is the model at a path.
func fromPath(s string) (*Model, error) {
	p := s
	if rest, ok := strings.CutPrefix(s, "~/"); ok {
		home, err := os.UserHomeDir()
		if err != nil {
			return nil, err
		}
		p = filepath.Join(home, rest)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(abs)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("model %s: no such file or directory", s)
	}
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", s, err)
	}
	m := &Model{Name: s, Source: FromPath, Path: abs, Where: abs, Modified: fi.ModTime()}
	if fi.IsDir() {
		entries, _ := os.ReadDir(abs)
		for _, e := range entries {
			if info, err := os.Stat(filepath.Join(abs, e.Name())); err == nil && info.Mode().IsRegular() {
				m.Size += info.Size()
			}
		}
	} else {
		m.Size = fi.Size()
	}
	m.Format, m.Quant = inspect(abs)
	return m, nil
}

// fromHub is a hub model in the cache.
func (c *Catalog) fromHub(ref hub.Ref) (*Model, error) {
	p, err := c.Hub.Cache.Find(ref)
	if err != nil {
		return nil, err
	}
	commit, _ := c.Hub.Cache.Commit(ref)
	return hubModel(ref, commit, p, c.Hub.Cache.RepoDir(ref.Repo))
}

// hubModel describes the hub model ref at path p of its snapshot.
func hubModel(ref hub.Ref, commit, p, repoDir string) (*Model, error) {
	m := &Model{Source: FromHub, Path: p, Where: repoDir, Digest: commit, ref: ref}
	if fi, err := os.Lstat(p); err == nil {
		m.Modified = fi.ModTime()
	}
	m.Format, m.Quant = inspect(p)
	if m.Format == "gguf" {
		if target, err := filepath.EvalSymlinks(p); err == nil {
			m.Digest = filepath.Base(target) // the blob's name: its sha256
		}
		if fi, err := os.Stat(p); err == nil {
			m.Size = fi.Size()
		}
		if q := hub.QuantOf(filepath.Base(p)); q != "" {
			ref.Quant = q
		} else if m.Quant != "" {
			ref.Quant = m.Quant
		}
	} else {
		blobs := map[string]bool{}
		filepath.WalkDir(p, func(f string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			target, err := filepath.EvalSymlinks(f)
			if fi, serr := os.Stat(f); err == nil && serr == nil && !blobs[target] {
				blobs[target] = true
				m.Size += fi.Size()
			}
			return nil
		})
	}
	m.Name, m.ref = ref.String(), ref
	return m, nil
}

// fromOllama is a model of Ollama's store.
func (c *Catalog) fromOllama(n ollama.Name) (*Model, error) {
	om, err := c.Ollama.Find(n)
	if err != nil {
		return nil, err
	}
	return ollamaModel(om), nil
}

func ollamaModel(om *ollama.Model) *Model {
	m := &Model{Name: om.Name.String(), Source: FromOllama, Path: om.Blob, Where: om.Manifest,
		Size: om.Size, Digest: om.Digest, Modified: om.Modified}
	m.Format, m.Quant = inspect(om.Blob)
	return m
}

// inspect says what format a model's files are in and how they are
// quantized; "" where it cannot tell.
func inspect(p string) (format, quant string) {
	fi, err := os.Stat(p)
	if err != nil {
		return "", ""
	}
	if !fi.IsDir() {
		if !gguf.IsGGUF(p) {
			return "", ""
		}
		f, err := gguf.Open(p)
		if err != nil {
			return "gguf", ""
		}
		defer f.Close()
		return "gguf", f.FileType()
	}
	if ggufs, _ := filepath.Glob(filepath.Join(p, "*.gguf")); len(ggufs) == 1 {
		if _, err := os.Stat(filepath.Join(p, "config.json")); err != nil {
			return inspect(ggufs[0])
		}
	}
	cfg, err := readConfig(p)
	if err != nil {
		return "", ""
	}
	return "safetensors", checkpointQuant(p, cfg)
}
