// Package ollama reads Ollama's model store, read-only: a name such as
// qwen3:8b is a manifest (manifests/HOST/NAMESPACE/MODEL/TAG, a JSON list of
// layers) whose layer of media type application/vnd.ollama.image.model is
// a GGUF file, blobs/sha256-HEX. kiln loads that blob where it lies; it
// never copies, moves or writes anything in the store.
package ollama

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Store is an Ollama models directory.
type Store struct{ Dir string }

// DefaultDir is where Ollama keeps its models: $OLLAMA_MODELS, else
// ~/.ollama/models.
func DefaultDir() string {
	if d := os.Getenv("OLLAMA_MODELS"); d != "" {
		return d
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".ollama", "models")
}

// ModelMediaType is the media type of a manifest's GGUF layer.
const ModelMediaType = "application/vnd.ollama.image.model"

// Layer is one blob of a manifest.
type Layer struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

// manifest is a manifest file, as Ollama writes it (Docker's image
// manifest, schema 2).
type manifest struct {
	SchemaVersion int     `json:"schemaVersion"`
	MediaType     string  `json:"mediaType"`
	Config        Layer   `json:"config"`
	Layers        []Layer `json:"layers"`
}

// Model is a model in the store.
type Model struct {
	Name     Name
	Manifest string    // the manifest file
	Digest   string    // the manifest's sha256, as Ollama's API reports it
	Size     int64     // the bytes of its layers and config
	Modified time.Time // the manifest's modification time
	Blob     string    // the GGUF file: the model layer's blob
	Layers   []Layer
}

// digestPattern is the only digest form Ollama stores blobs under.
var digestPattern = regexp.MustCompile(`^sha256[:-]([0-9a-f]{64})$`)

// BlobPath returns the file of a blob digest ("sha256:HEX").
func (s Store) BlobPath(digest string) (string, error) {
	m := digestPattern.FindStringSubmatch(digest)
	if m == nil {
		return "", fmt.Errorf("%q is not a sha256 digest", digest)
	}
	return filepath.Join(s.Dir, "blobs", "sha256-"+m[1]), nil
}

// NotFoundError says that a name is not in the store, what was looked at,
// and which tags of the model the store does have.
type NotFoundError struct {
	Name  Name
	Path  string
	Other []string // other tags of the same model in the store
}

func (e *NotFoundError) Error() string {
	msg := fmt.Sprintf("%s is not in Ollama's store (no %s)", e.Name, e.Path)
	if len(e.Other) > 0 {
		msg += "; it has " + strings.Join(e.Other, ", ")
	}
	return msg
}

// ErrNotFound is the cause of every *NotFoundError.
var ErrNotFound = errors.New("not in Ollama's store")

func (e *NotFoundError) Unwrap() error { return ErrNotFound }

// Find reads the model of a name, matching its parts as Ollama does
// (case aside).
func (s Store) Find(n Name) (*Model, error) {
	root := filepath.Join(s.Dir, "manifests")
	p, ok := lookupFold(root, n.parts())
	if !ok {
		e := &NotFoundError{Name: n, Path: filepath.Join(root, n.path())}
		if tags, ok := lookupFold(root, n.parts()[:3]); ok {
			entries, _ := os.ReadDir(tags)
			for _, t := range entries {
				if !t.IsDir() {
					other := n
					other.Tag = t.Name()
					e.Other = append(e.Other, other.String())
				}
			}
		}
		return nil, e
	}
	return s.read(n, p)
}

// lookupFold finds the path of parts under root, each part matched
// exactly or else case-insensitively.
func lookupFold(root string, parts []string) (string, bool) {
	p := root
	for _, part := range parts {
		next := filepath.Join(p, part)
		if _, err := os.Lstat(next); err != nil {
			entries, _ := os.ReadDir(p)
			next = ""
			for _, e := range entries {
				if strings.EqualFold(e.Name(), part) {
					next = filepath.Join(p, e.Name())
					break
				}
			}
			if next == "" {
				return "", false
			}
		}
		p = next
	}
	fi, err := os.Stat(p)
	return p, err == nil && (len(parts) < 4 || fi.Mode().IsRegular())
}

// maxManifest bounds a manifest file: real ones are a few kilobytes.
const maxManifest = 1 << 20

// read parses the manifest at p.
func (s Store) read(n Name, p string) (*Model, error) {
	fi, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if fi.Size() > maxManifest {
		return nil, fmt.Errorf("%s: %d bytes is no Ollama manifest", p, fi.Size())
	}
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	m, err := parseManifest(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p, err)
	}
	sum := sha256.Sum256(data)
	mod := &Model{Name: n, Manifest: p, Digest: hex.EncodeToString(sum[:]), Modified: fi.ModTime(), Layers: m.Layers}
	var types []string
	for _, l := range append(m.Layers, m.Config) {
		mod.Size += l.Size
		if l.MediaType == ModelMediaType && mod.Blob == "" {
			if mod.Blob, err = s.BlobPath(l.Digest); err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
		}
		if l.MediaType != "" {
			types = append(types, strings.TrimPrefix(l.MediaType, "application/vnd.ollama.image."))
		}
	}
	if mod.Blob == "" {
		return nil, fmt.Errorf("%s has no GGUF model layer (it has %s): kiln reads Ollama's GGUF models", n, strings.Join(types, ", "))
	}
	if _, err := os.Stat(mod.Blob); err != nil {
		return nil, fmt.Errorf("%s: its model blob is missing from Ollama's store (%w): `ollama pull %s` fetches it again", n, err, n)
	}
	return mod, nil
}

// parseManifest reads a manifest's JSON and checks what kiln relies on:
// known schema, sha256 digests, sizes that are sizes.
func parseManifest(data []byte) (*manifest, error) {
	var m manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("not an Ollama manifest: %w", err)
	}
	if m.SchemaVersion != 2 {
		return nil, fmt.Errorf("manifest schema version %d, want 2", m.SchemaVersion)
	}
	for _, l := range append(m.Layers, m.Config) {
		if l.Digest == "" && l.MediaType == "" {
			continue // no config
		}
		if !digestPattern.MatchString(l.Digest) {
			return nil, fmt.Errorf("layer digest %q is not sha256:HEX", l.Digest)
		}
		if l.Size < 0 {
			return nil, fmt.Errorf("layer %s has size %d", l.Digest, l.Size)
		}
	}
	return &m, nil
}

// List returns the store's models, in name order; manifests that do not
// read (not GGUF models, missing blobs) are reported in errs, as Ollama
// skips them.
func (s Store) List() (models []*Model, errs []error) {
	root := filepath.Join(s.Dir, "manifests")
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		parts := strings.Split(filepath.ToSlash(rel), "/")
		if len(parts) != 4 {
			return nil
		}
		n := Name{Host: parts[0], Namespace: parts[1], Model: parts[2], Tag: parts[3]}
		if n.check() != nil {
			return nil
		}
		m, err := s.read(n, p)
		if err != nil {
			errs = append(errs, err)
			return nil
		}
		models = append(models, m)
		return nil
	})
	sort.Slice(models, func(i, j int) bool { return models[i].Name.String() < models[j].Name.String() })
	return models, errs
}
