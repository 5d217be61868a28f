package cpu

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiln-llm/kiln/internal/mapfile"
)

// TestPoolFor checks that a loop covers each index once, for thread counts
// that do and do not divide the work, back to back (workers still
// spinning) and after the workers have parked.
func TestPoolFor(t *testing.T) {
	for _, threads := range []int{1, 2, 3, 5} {
		p := newPool(threads)
		for _, pause := range []time.Duration{0, 2 * spinTime} {
			for _, c := range [][2]int{{1, 1}, {7, 1}, {64, 8}, {100, 7}, {1000, 1}, {1000, 999}, {4097, 64}} {
				n, grain := c[0], c[1]
				t.Run(fmt.Sprintf("threads=%d/pause=%v/n=%d/grain=%d", threads, pause, n, grain), func(t *testing.T) {
					time.Sleep(pause)
					seen := make([]atomic.Int32, n)
					p.For(n, grain, func(lo, hi int) {
						for i := lo; i < hi; i++ {
							seen[i].Add(1)
						}
					})
					for i := range seen {
						if v := seen[i].Load(); v != 1 {
							t.Fatalf("index %d run %d times", i, v)
						}
					}
				})
			}
		}
	}
}

// TestPoolNested runs loops inside a loop's ranges and from two goroutines
// at once: the inner or second loop runs on its caller, and every index is
// covered once.
func TestPoolNested(t *testing.T) {
	p := newPool(3)
	const n, m = 40, 30
	var seen [n * m]atomic.Int32
	p.For(n, 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			p.For(m, 1, func(lo2, hi2 int) {
				for j := lo2; j < hi2; j++ {
					seen[i*m+j].Add(1)
				}
			})
		}
	})
	var wg sync.WaitGroup
	var other [n * m]atomic.Int32
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				p.For(n*m, 16, func(lo, hi int) {
					for i := lo; i < hi; i++ {
						if g == 0 {
							other[i].Add(1)
						}
					}
				})
			}
		}()
	}
	wg.Wait()
	for i := range seen {
		if seen[i].Load() != 1 || other[i].Load() != 50 {
			t.Fatalf("index %d: nested %d times (want 1), concurrent %d (want 50)", i, seen[i].Load(), other[i].Load())
		}
	}
}

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
