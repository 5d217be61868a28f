package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"

	"github.com/kiln-llm/kiln/backend/cuda"
)

// version is set at build time (go build -ldflags "-X main.version=1.2.3");
// without it, the module version of go install, else the commit.
var version string

func init() {
	register(&command{name: "version", summary: "print kiln's version, its Go version and whether CUDA is usable here", run: func(args []string) error {
		fs := flag.NewFlagSet("kiln version", flag.ContinueOnError)
		fs.Usage = func() {
			fmt.Fprintf(fs.Output(), "usage: kiln version\n\nPrints kiln's version (set at build time by -ldflags \"-X main.version=V\", else the module's\nor the commit's), the Go toolchain it was built with, and the GPU the CUDA backend finds here\nor why it cannot start.\n")
		}
		if err := parseFlags(fs, args); err != nil {
			return err
		}
		if fs.NArg() > 0 {
			return fmt.Errorf("unexpected arguments %q", fs.Args())
		}
		printVersion(os.Stdout, cudaStatus())
		return nil
	}})
}

// buildVersion is kiln's version: the one set at build time, the module's,
// or "devel", with the commit (and "modified" for a dirty tree) from the
// build's VCS stamp.
func buildVersion() string {
	v := version
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return max(v, "devel")
	}
	if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		v = bi.Main.Version
	}
	if v == "" {
		v = "devel"
	}
	var rev, when string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value[:min(12, len(s.Value))]
		case "vcs.time":
			when = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev != "" {
		v += " (" + rev
		if when != "" {
			v += ", " + when
		}
		if dirty {
			v += ", modified"
		}
		v += ")"
	}
	return v
}

// cudaStatus says whether the CUDA backend starts here (the process exits
// soon after, which frees it): the GPU it found, or why not.
func cudaStatus() string {
	b, err := cuda.New(cuda.Options{})
	if err != nil {
		return "not available: " + err.Error()
	}
	return fmt.Sprintf("%s, %s free", b.Name(), humanBytes(b.FreeMemory()))
}

func printVersion(w io.Writer, cudaLine string) {
	fmt.Fprintf(w, "kiln %s\ngo   %s %s/%s\ncuda %s\n", buildVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH, cudaLine)
}
