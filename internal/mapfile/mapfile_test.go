package mapfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestRefusesSpecialFiles: a named pipe, a directory or a device in place
// of a model file is refused at once; opening the pipe for reading would
// wait for a writer forever.
func TestRefusesSpecialFiles(t *testing.T) {
	dir := t.TempDir()
	pipe := filepath.Join(dir, "model.safetensors")
	if err := syscall.Mkfifo(pipe, 0o600); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		pipe:        "not a regular file (a named pipe)",
		dir:         "not a regular file (a directory)",
		"/dev/zero": "not a regular file (a device)",
	} {
		if _, _, err := Open(path, 8); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%s): %v", path, err)
		}
		if _, err := ReadFile(path, 1<<20); err == nil || err.Error() != path+": "+want {
			t.Errorf("ReadFile(%s): %v", path, err)
		}
		if _, err := ReadFS(os.DirFS(filepath.Dir(path)), filepath.Base(path), 1<<20); err == nil || err.Error() != filepath.Base(path)+": "+want {
			t.Errorf("ReadFS(%s): %v", path, err)
		}
	}
}

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.json")
	if err := os.WriteFile(path, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	fsys := os.DirFS(dir)
	if data, err := ReadFS(fsys, "config.json", 2); err != nil || string(data) != "{}" {
		t.Fatalf("%q %v", data, err)
	}
	if data, err := ReadFile(path, 2); err != nil || string(data) != "{}" {
		t.Fatalf("%q %v", data, err)
	}
	if _, err := ReadFS(fsys, "config.json", 1); err == nil || err.Error() != "config.json: 2 bytes, more than the 1 allowed" {
		t.Fatalf("over the limit: %v", err)
	}
	if _, err := ReadFile(path, 1); err == nil || err.Error() != path+": 2 bytes, more than the 1 allowed" {
		t.Fatalf("over the limit: %v", err)
	}
	if _, err := ReadFS(fsys, "missing.json", 1); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing: %v", err)
	}
}
