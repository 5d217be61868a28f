package hub

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Cache is a Hugging Face hub cache directory ($HF_HUB_CACHE).
type Cache struct{ Dir string }

// DefaultCacheDir is where huggingface_hub keeps its cache: $HF_HUB_CACHE,
// else $HUGGINGFACE_HUB_CACHE, else $HF_HOME/hub, else
// $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.
func DefaultCacheDir() string {
	for _, v := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"} {
		if d := os.Getenv(v); d != "" {
			return expandHome(d)
		}
	}
	return filepath.Join(hfHome(), "hub")
}

// hfHome is $HF_HOME, else $XDG_CACHE_HOME/huggingface, else
// ~/.cache/huggingface.
func hfHome() string {
	if d := os.Getenv("HF_HOME"); d != "" {
		return expandHome(d)
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(expandHome(d), "huggingface")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "huggingface")
}

func expandHome(p string) string {
	if rest, ok := strings.CutPrefix(p, "~/"); ok {
		if home, err := os.UserHomeDir(); err == nil {
			return filepath.Join(home, rest)
		}
	}
	return p
}

// RepoDir is the folder of a repository in the cache.
func (c Cache) RepoDir(repo string) string { return filepath.Join(c.Dir, FolderName(repo)) }

// lockDir holds the repository's blob locks, as huggingface_hub places them.
func (c Cache) lockDir(repo string) string {
	return filepath.Join(c.Dir, ".locks", FolderName(repo))
}

// NotCachedError says that a reference is not in the cache, and why.
type NotCachedError struct {
	Ref Ref
	Dir string // the repository folder looked in
	Why string
}

func (e *NotCachedError) Error() string {
	return fmt.Sprintf("%s is not in the Hugging Face cache (%s: %s)", e.Ref, e.Dir, e.Why)
}

func (e *NotCachedError) Unwrap() error { return ErrNotCached }

// Commit returns the commit ref's revision resolves to in the cache: the
// revision itself when it is a commit id, else what refs/REV says, else the
// one snapshot whose commit starts with it (an abbreviated commit), or for
// a ref without a revision that never recorded main, the repository's only
// snapshot.
func (c Cache) Commit(ref Ref) (string, error) {
	dir := c.RepoDir(ref.Repo)
	if commitHash.MatchString(ref.Revision) {
		return ref.Revision, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, "refs", filepath.FromSlash(ref.rev())))
	if err == nil {
		commit := strings.TrimSpace(string(b))
		if !commitHash.MatchString(commit) {
			return "", fmt.Errorf("%s: refs/%s holds %q, not a commit id", dir, ref.rev(), commit)
		}
		return commit, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	if _, serr := os.Stat(dir); serr != nil {
		return "", &NotCachedError{Ref: ref, Dir: dir, Why: "never downloaded"}
	}
	snaps, _ := os.ReadDir(filepath.Join(dir, "snapshots"))
	if shortCommit.MatchString(ref.Revision) {
		var hits []string
		for _, s := range snaps {
			if strings.HasPrefix(s.Name(), ref.Revision) {
				hits = append(hits, s.Name())
			}
		}
		if len(hits) == 1 {
			return hits[0], nil
		}
	}
	if ref.Revision == "" && len(snaps) == 1 {
		return snaps[0].Name(), nil
	}
	if ref.Revision == "" && len(snaps) > 1 {
		var ids []string
		for _, s := range snaps {
			ids = append(ids, s.Name())
		}
		return "", &NotCachedError{Ref: ref, Dir: dir, Why: fmt.Sprintf("no refs/main, and %d snapshots (%s): name one with @COMMIT", len(snaps), strings.Join(ids, ", "))}
	}
	return "", &NotCachedError{Ref: ref, Dir: dir, Why: "no refs/" + ref.rev()}
}

// Find returns the path of a cached model: its snapshot directory, or, for
// a repository of GGUF files, the GGUF file ref picks in it. It needs no
// network, and fails with a *NotCachedError when the files are not there.
func (c Cache) Find(ref Ref) (string, error) {
	commit, err := c.Commit(ref)
	if err != nil {
		return "", err
	}
	snap := filepath.Join(c.RepoDir(ref.Repo), "snapshots", commit)
	files, err := snapshotFiles(snap)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", &NotCachedError{Ref: ref, Dir: c.RepoDir(ref.Repo), Why: "no snapshot " + commit}
		}
		return "", err
	}
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = f.Name
	}
	if ref.Quant == "" {
		if missing := missingShards(snap); len(missing) > 0 {
			return "", &NotCachedError{Ref: ref, Dir: snap, Why: fmt.Sprintf("incomplete, %d weight files missing (%s)", len(missing), strings.Join(missing, ", "))}
		}
	}
	_, gguf, err := selectFiles(ref, names)
	if err != nil {
		why := err.Error()
		if inc, _ := filepath.Glob(filepath.Join(c.RepoDir(ref.Repo), "blobs", "*.incomplete")); len(inc) > 0 {
			why = "incomplete: a pull of it was interrupted"
		}
		return "", &NotCachedError{Ref: ref, Dir: snap, Why: why}
	}
	if gguf != "" {
		return filepath.Join(snap, filepath.FromSlash(gguf)), nil
	}
	return snap, nil
}

// Snapshot is one commit of a repository in the cache.
type Snapshot struct {
	Commit   string
	Dir      string
	Refs     []string // the branches and tags that resolve to it
	Files    []File
	Modified time.Time // the newest link in it
}

// File is a file of a snapshot.
type File struct {
	Name string // "/"-separated path in the repository
	Path string // its link in the snapshot
	Blob string // the blob's name (its ETag), "" for a plain file
	Size int64
}

// Repo is a repository in the cache.
type Repo struct {
	ID        string
	Dir       string
	Snapshots []Snapshot
}

// Repos lists the model repositories in the cache (none when the cache
// does not exist).
func (c Cache) Repos() ([]Repo, error) {
	entries, err := os.ReadDir(c.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var repos []Repo
	for _, e := range entries {
		id := repoOfFolder(e.Name())
		if id == "" || !e.IsDir() {
			continue
		}
		r, err := c.repo(id)
		if err != nil {
			return nil, err
		}
		repos = append(repos, r)
	}
	return repos, nil
}

func (c Cache) repo(id string) (Repo, error) {
	r := Repo{ID: id, Dir: c.RepoDir(id)}
	refs := map[string][]string{} // commit -> ref names
	refsDir := filepath.Join(r.Dir, "refs")
	filepath.WalkDir(refsDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil {
			name, _ := filepath.Rel(refsDir, p)
			commit := strings.TrimSpace(string(b))
			refs[commit] = append(refs[commit], filepath.ToSlash(name))
		}
		return nil
	})
	snaps, err := os.ReadDir(filepath.Join(r.Dir, "snapshots"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return r, err
	}
	for _, s := range snaps {
		if !s.IsDir() {
			continue
		}
		dir := filepath.Join(r.Dir, "snapshots", s.Name())
		files, err := snapshotFiles(dir)
		if err != nil {
			return r, err
		}
		sn := Snapshot{Commit: s.Name(), Dir: dir, Refs: refs[s.Name()], Files: files}
		sort.Strings(sn.Refs)
		for _, f := range files {
			if fi, err := os.Lstat(f.Path); err == nil && fi.ModTime().After(sn.Modified) {
				sn.Modified = fi.ModTime()
			}
		}
		r.Snapshots = append(r.Snapshots, sn)
	}
	return r, nil
}

// snapshotFiles lists the files of a snapshot directory, following its
// links to their blobs; dangling links are left out.
func snapshotFiles(dir string) ([]File, error) {
	if _, err := os.Stat(dir); err != nil {
		return nil, err
	}
	var files []File
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		fi, err := os.Stat(p)
		if err != nil || !fi.Mode().IsRegular() {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		f := File{Name: filepath.ToSlash(rel), Path: p, Size: fi.Size()}
		if target, err := os.Readlink(p); err == nil {
			f.Blob = filepath.Base(target)
		}
		files = append(files, f)
		return nil
	})
	return files, err
}

// Remove deletes what ref names from the cache: the snapshot its revision
// resolves to (and the refs that name it), or, with a quantization, only
// that GGUF file of it; then every blob no snapshot links to any more. A
// repository left without snapshots is removed whole. It returns the
// bytes freed.
func (c Cache) Remove(ref Ref) (int64, error) {
	commit, err := c.Commit(ref)
	if err != nil {
		return 0, err
	}
	dir := c.RepoDir(ref.Repo)
	snap := filepath.Join(dir, "snapshots", commit)
	if _, err := os.Stat(snap); err != nil {
		return 0, &NotCachedError{Ref: ref, Dir: dir, Why: "no snapshot " + commit}
	}
	if ref.Quant != "" {
		path, err := c.Find(ref)
		if err != nil {
			return 0, err
		}
		if err := os.Remove(path); err != nil {
			return 0, err
		}
		for d := filepath.Dir(path); d != snap; d = filepath.Dir(d) {
			if os.Remove(d) != nil {
				break
			}
		}
		if left, _ := snapshotFiles(snap); len(left) == 0 {
			err = c.removeSnapshot(dir, snap, commit)
		}
	} else {
		err = c.removeSnapshot(dir, snap, commit)
	}
	if err != nil {
		return 0, err
	}
	return c.collect(ref.Repo)
}

// removeSnapshot deletes a snapshot and the refs that resolve to it.
func (c Cache) removeSnapshot(dir, snap, commit string) error {
	if err := os.RemoveAll(snap); err != nil {
		return err
	}
	refsDir := filepath.Join(dir, "refs")
	return filepath.WalkDir(refsDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == commit {
			return os.Remove(p)
		}
		return nil
	})
}

// collect deletes the blobs of a repository that no snapshot links to, or
// the whole repository when no snapshot is left, and returns the bytes
// freed. Downloads in progress (.incomplete) stay unless the repository
// goes.
func (c Cache) collect(repo string) (int64, error) {
	r, err := c.repo(repo)
	if err != nil {
		return 0, err
	}
	used := map[string]bool{}
	for _, s := range r.Snapshots {
		for _, f := range s.Files {
			used[f.Blob] = true
		}
	}
	blobs, err := os.ReadDir(filepath.Join(r.Dir, "blobs"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, err
	}
	var freed int64
	for _, b := range blobs {
		incomplete := strings.HasSuffix(b.Name(), ".incomplete")
		if used[b.Name()] || incomplete && len(r.Snapshots) > 0 {
			continue
		}
		p := filepath.Join(r.Dir, "blobs", b.Name())
		fi, err := os.Lstat(p)
		if err != nil {
			continue
		}
		if err := os.Remove(p); err != nil {
			return freed, err
		}
		freed += fi.Size()
	}
	if len(r.Snapshots) == 0 {
		if err := os.RemoveAll(r.Dir); err != nil {
			return freed, err
		}
		os.RemoveAll(c.lockDir(repo))
	}
	return freed, nil
}
