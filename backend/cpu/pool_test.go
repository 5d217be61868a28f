package cpu

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"testing"

	"github.com/kiln-llm/kiln/internal/mapfile"
)

// TestPoolFault: a worker that faults reading a mapped file truncated under
// it does not kill the process (SIGBUS): For raises the fault again in its
// caller, once every worker is done, for the model to report.
func TestPoolFault(t *testing.T) {
	path := filepath.Join(t.TempDir(), "weights")
	const pages = 64
	if err := os.WriteFile(path, make([]byte, pages*4096), 0o600); err != nil {
		t.Fatal(err)
	}
	data, unmap, err := mapfile.Open(path, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer unmap()
	p := newPool(4)
	sum := func() (r any) {
		defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
		defer func() { r = recover() }()
		var sums [pages]byte
		p.For(pages, 1, func(lo, hi int) {
			for i := lo; i < hi; i++ {
				sums[i] = data[i*4096]
			}
		})
		return nil
	}
	if r := sum(); r != nil {
		t.Fatalf("reading the whole file: %v", r)
	}
	if err := os.Truncate(path, 4096); err != nil {
		t.Fatal(err)
	}
	r := sum()
	f, ok := r.(interface{ Addr() uintptr })
	if !ok {
		t.Fatalf("reading past the truncation: %v, want a fault", r)
	}
	if got, ok := mapfile.Containing(f.Addr()); !ok || got != path {
		t.Fatalf("fault at %#x is in %q (%v), want %s", f.Addr(), got, ok, path)
	}
}
