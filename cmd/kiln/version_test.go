package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"
)

// kiln version: the version set at build time, the Go toolchain and the
// CUDA line (here: why it is not available).
func TestVersion(t *testing.T) {
	old := version
	defer func() { version = old }()
	version = "1.2.3"
	var out bytes.Buffer
	printVersion(&out, cudaStatus())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "kiln 1.2.3") || lines[1] != "go   "+runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH ||
		!strings.HasPrefix(lines[2], "cuda ") || len(lines[2]) < 10 {
		t.Errorf("kiln version printed %q", out.String())
	}
	version = ""
	if v := buildVersion(); v == "" || strings.HasPrefix(v, " ") {
		t.Errorf("version without ldflags: %q", v)
	}
}
