package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kiln-llm/kiln/internal/mapfile"
)

// IndexFile names the index of a sharded checkpoint.
const IndexFile = "model.safetensors.index.json"

// Open memory-maps the safetensors file at path read-only and parses it.
func Open(path string) (*File, error) {
	data, unmap, err := mapfile.Open(path, 8) // the header length
	if err != nil {
		if os.IsNotExist(err) || os.IsPermission(err) {
			return nil, fmt.Errorf("safetensors: %w", err)
		}
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	f, err := Parse(path, data)
	if err != nil {
		unmap()
		return nil, err
	}
	f.unmap = unmap
	return f, nil
}

// Set is the tensors of a checkpoint, from one file or several shards.
type Set struct {
	files   []*File
	tensors map[string]*Tensor
}

// Tensor returns the named tensor.
func (s *Set) Tensor(name string) (*Tensor, bool) {
	t, ok := s.tensors[name]
	return t, ok
}

// Names returns every tensor name, sorted.
func (s *Set) Names() []string {
	names := make([]string, 0, len(s.tensors))
	for n := range s.tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Close releases every file of the set.
func (s *Set) Close() error {
	var errs []error
	for _, f := range s.files {
		errs = append(errs, f.Close())
	}
	s.files, s.tensors = nil, nil
	return errors.Join(errs...)
}

// OpenDir opens the checkpoint in dir, memory-mapped: the shards listed by
// model.safetensors.index.json when it exists, else model.safetensors, else
// every *.safetensors file.
func OpenDir(dir string) (*Set, error) {
	return openSet(osDir(dir), dir)
}

// OpenFS opens the checkpoint at the root of fsys (for example an embed.FS
// sub-tree), reading each file whole into memory; the lookup rules are
// OpenDir's.
func OpenFS(fsys fs.FS) (*Set, error) {
	return openSet(fsDir{fsys}, "fs")
}

// dir abstracts the two places a checkpoint can live.
type dir interface {
	readFile(name string) ([]byte, error)
	open(name string) (*File, error)
	glob() ([]string, error)
	exists(name string) bool
}

type osDir string

// maxIndex bounds an index file (Qwen3-235B's is 2 MB).
const maxIndex = 64 << 20

func (d osDir) readFile(name string) ([]byte, error) {
	return mapfile.ReadFile(filepath.Join(string(d), name), maxIndex)
}
func (d osDir) open(name string) (*File, error) { return Open(filepath.Join(string(d), name)) }
func (d osDir) exists(name string) bool {
	_, err := os.Stat(filepath.Join(string(d), name))
	return err == nil
}
func (d osDir) glob() ([]string, error) {
	m, err := filepath.Glob(filepath.Join(string(d), "*.safetensors"))
	for i := range m {
		m[i] = filepath.Base(m[i])
	}
	return m, err
}

type fsDir struct{ fsys fs.FS }

func (d fsDir) readFile(name string) ([]byte, error) { return mapfile.ReadFS(d.fsys, name, maxIndex) }
func (d fsDir) open(name string) (*File, error) {
	data, err := mapfile.ReadFS(d.fsys, name, math.MaxInt64-1)
	if err != nil {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	return Parse(name, data)
}
func (d fsDir) glob() ([]string, error) { return fs.Glob(d.fsys, "*.safetensors") }
func (d fsDir) exists(name string) bool {
	_, err := fs.Stat(d.fsys, name)
	return err == nil
}

func openSet(d dir, where string) (*Set, error) {
	s := &Set{tensors: map[string]*Tensor{}}
	index, err := d.readFile(IndexFile)
	switch {
	case err == nil:
		err = s.openIndexed(d, index)
	case errors.Is(err, fs.ErrNotExist):
		err = s.openPlain(d, where)
	}
	if err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Set) add(f *File) error {
	s.files = append(s.files, f)
	for _, n := range f.names {
		if prev, ok := s.tensors[n]; ok {
			return fmt.Errorf("safetensors: tensor %q is in both %s and %s", n, prev.File, f.Name)
		}
		s.tensors[n] = f.tensors[n]
	}
	return nil
}

func (s *Set) openIndexed(d dir, index []byte) error {
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(index, &idx); err != nil {
		return fmt.Errorf("safetensors: %s: %w", IndexFile, err)
	}
	if len(idx.WeightMap) == 0 {
		return fmt.Errorf("safetensors: %s has an empty weight_map", IndexFile)
	}
	var shards []string
	seen := map[string]bool{}
	for _, file := range idx.WeightMap {
		if file != path.Base(file) || strings.ContainsAny(file, `/\`) {
			return fmt.Errorf("safetensors: %s names shard %q outside the model directory", IndexFile, file)
		}
		if !seen[file] {
			seen[file] = true
			shards = append(shards, file)
		}
	}
	sort.Strings(shards)
	if err := s.openFiles(d, shards); err != nil {
		return err
	}
	for name, file := range idx.WeightMap {
		t, ok := s.tensors[name]
		if !ok || t.File != fileName(d, file) {
			return fmt.Errorf("safetensors: %s maps %q to %s, which does not hold it", IndexFile, name, file)
		}
	}
	return nil
}

// fileName is the name a File opened from d under file carries.
func fileName(d dir, file string) string {
	if od, ok := d.(osDir); ok {
		return filepath.Join(string(od), file)
	}
	return file
}

func (s *Set) openPlain(d dir, where string) error {
	files := []string{"model.safetensors"}
	if !d.exists("model.safetensors") {
		m, err := d.glob()
		if err != nil {
			return fmt.Errorf("safetensors: %w", err)
		}
		if len(m) == 0 {
			return fmt.Errorf("safetensors: no %s and no *.safetensors files in %s", IndexFile, where)
		}
		sort.Strings(m)
		files = m
	}
	return s.openFiles(d, files)
}

func (s *Set) openFiles(d dir, files []string) error {
	for _, file := range files {
		f, err := d.open(file)
		if err != nil {
			return err
		}
		if err := s.add(f); err != nil {
			return err
		}
	}
	return nil
}
