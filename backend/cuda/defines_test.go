//go:build cgo

package cuda

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite kernels/"+definesHeader+" from kernelDefines")

// TestKernelDefines checks that kernels/defines.cuh is the header
// kernelDefines makes (-update writes it), and that no kernel file defines
// one of its names again.
func TestKernelDefines(t *testing.T) {
	var h strings.Builder
	h.WriteString("// The constants the kernels share with the Go side, generated from\n" +
		"// kernelDefines (backend/cuda/defines.go) by go generate: do not edit.\n")
	for _, d := range kernelDefines {
		if d.doc != "" {
			fmt.Fprintf(&h, "\n// %s\n", d.doc)
		}
		fmt.Fprintf(&h, "#define %s %d\n", d.name, d.value)
	}
	path := filepath.Join("kernels", definesHeader)
	if *update {
		if err := os.WriteFile(path, []byte(h.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != h.String() {
		t.Errorf("%s is not what kernelDefines makes: run go generate ./backend/cuda", path)
	}
	files, err := filepath.Glob(filepath.Join("kernels", "*.cu*"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if filepath.Base(f) == definesHeader {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range kernelDefines {
			if regexp.MustCompile(`(?m)^\s*#\s*define\s+` + d.name + `\b`).Match(src) {
				t.Errorf("%s defines %s, which %s defines (from Go)", f, d.name, definesHeader)
			}
		}
	}
}
