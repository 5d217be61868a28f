package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// binDir holds the kiln binary the tests that run it as a program share;
// TestMain removes it.
var binDir string

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
	buildOut  []byte
)

// kilnBinary builds kiln once per test run (or takes $KILN_BINARY) and
// returns its path; tests that need the build skip under -short.
func kilnBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("KILN_BINARY"); bin != "" {
		return bin // the GPU machine has no Go: a binary built here
	}
	if testing.Short() {
		t.Skip("builds the kiln binary")
	}
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "kiln-bin"); buildErr != nil {
			return
		}
		builtBin = filepath.Join(binDir, "kiln")
		buildOut, buildErr = exec.Command("go", "build", "-o", builtBin, ".").CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("go build: %v\n%s", buildErr, buildOut)
	}
	return builtBin
}
