package main

import (
	"os"
	"path/filepath"
	"testing"
)

// A daemon that drains while its successor starts must not remove the
// successor's pid file (it used to, at exit).
func TestRemoveOwnPIDFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kiln.pid")
	os.WriteFile(path, []byte("4242\n"), 0o600) // the successor's
	removeOwnPIDFile(path, 1234)
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("removed another daemon's pid file: %v", err)
	}
	removeOwnPIDFile(path, 4242)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("left its own pid file: %v", err)
	}
}
