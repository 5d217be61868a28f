package main

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/kiln-llm/kiln/catalog"
	"github.com/kiln-llm/kiln/engine"
)

// stateCacheFlags are serve's flags for the state cache: the computed past
// of conversations the device lets go, kept in host memory and then on
// disk, so that the next turn of an idle conversation, or of yesterday's
// after a restart, starts at once.
type stateCacheFlags struct {
	dir, size, ram string
}

func (f *stateCacheFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.dir, "state-cache", "", "directory where conversations' computed state is kept across restarts (default $XDG_CACHE_HOME/kiln/state, i.e. ~/.cache/kiln/state); \"none\": host memory only")
	fs.StringVar(&f.size, "state-cache-size", "", "most disk space the state cache takes, e.g. 20GB (default: a tenth of the free space there when kiln starts, at most 20GB)")
	fs.StringVar(&f.ram, "state-cache-ram", "1GB", "most host memory for conversations the device let go, on their way to disk; 0: none")
}

// maxDefaultStateCache caps the default size of the state cache directory.
const maxDefaultStateCache = 20 << 30

// resolve turns the flags into the engine's options: the directory created
// (owner only), its size decided.
func (f *stateCacheFlags) resolve() (engine.StateCache, error) {
	var c engine.StateCache
	ram, err := parseBytes(f.ram)
	if err != nil {
		return c, fmt.Errorf("--state-cache-ram: %w", err)
	}
	c.RAMBytes = ram
	if f.dir == "none" {
		if f.size != "" {
			return c, errors.New("--state-cache-size needs a --state-cache directory")
		}
		return c, nil
	}
	if f.dir == "" {
		// The default: a directory that cannot be made leaves the cache in
		// memory, with a warning, rather than refusing to serve.
		base, err := os.UserCacheDir()
		if err == nil {
			c.Dir = filepath.Join(base, "kiln", "state")
			err = os.MkdirAll(c.Dir, 0o700)
		}
		if err != nil {
			slog.Warn("no state cache directory: conversations are kept in memory only (set --state-cache)", "err", err)
			c.Dir = ""
			return c, nil
		}
	} else {
		if c.Dir, err = filepath.Abs(f.dir); err != nil {
			return c, err
		}
		if err := os.MkdirAll(c.Dir, 0o700); err != nil {
			return c, fmt.Errorf("--state-cache: %w", err)
		}
	}
	if f.size != "" {
		if c.DiskBytes, err = parseBytes(f.size); err != nil {
			return c, fmt.Errorf("--state-cache-size: %w", err)
		}
		return c, nil
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(c.Dir, &st); err != nil {
		return c, fmt.Errorf("--state-cache %s: %w", c.Dir, err)
	}
	c.DiskBytes = min(int64(st.Bavail)*st.Bsize/10, maxDefaultStateCache)
	return c, nil
}

// parseBytes reads a size: a number of bytes, or one with a unit of B, KB,
// MB, GB or TB (powers of 1024, as kiln prints them; K, M, G, T, KiB, ...
// too), e.g. 20GB or 1.5G.
func parseBytes(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	units := []struct {
		suffix string
		shift  uint
	}{{"TIB", 40}, {"GIB", 30}, {"MIB", 20}, {"KIB", 10}, {"TB", 40}, {"GB", 30}, {"MB", 20}, {"KB", 10}, {"T", 40}, {"G", 30}, {"M", 20}, {"K", 10}, {"B", 0}}
	shift := uint(0)
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, shift = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.shift
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v < 0 || v*float64(int64(1)<<shift) > 1<<62 {
		return 0, fmt.Errorf("%q is not a size (such as 512MB or 20GB)", s)
	}
	return int64(v * float64(int64(1)<<shift)), nil
}

// weightsDigest identifies the weights of the model at p, so that the
// state cache never restores what other weights computed: the catalog's
// digest of a model by name (a hub commit, a GGUF file's sha256, an Ollama
// manifest), else a SHA-256 of each weight file's name, size and first and
// last MiB (of every file, for the embedded demo model).
func weightsDigest(p modelPath, resolved *catalog.Model) (string, error) {
	if resolved != nil && resolved.Digest != "" {
		return resolved.Digest, nil
	}
	h := sha256.New()
	if fsys := p.demoFS(); fsys != nil {
		err := fs.WalkDir(fsys, ".", func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := fs.ReadFile(fsys, path)
			fmt.Fprintf(h, "%s %d\n", path, len(b))
			h.Write(b)
			return err
		})
		return hex.EncodeToString(h.Sum(nil)), err
	}
	files := []string{string(p)}
	if fi, err := os.Stat(string(p)); err != nil {
		return "", err
	} else if fi.IsDir() {
		files = nil
		for _, pat := range []string{"config.json", "*.safetensors", "*.gguf"} {
			m, _ := filepath.Glob(filepath.Join(string(p), pat))
			files = append(files, m...)
		}
	}
	const edge = 1 << 20
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return "", err
		}
		fi, err := f.Stat()
		if err == nil {
			fmt.Fprintf(h, "%s %d\n", filepath.Base(name), fi.Size())
			_, err = io.Copy(h, io.NewSectionReader(f, 0, min(edge, fi.Size())))
			if err == nil && fi.Size() > edge {
				_, err = io.Copy(h, io.NewSectionReader(f, max(edge, fi.Size()-edge), edge))
			}
		}
		f.Close()
		if err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
