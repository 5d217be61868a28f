package cpu

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
)

// pool is a fixed set of worker goroutines that operations split their work
// over. The calling goroutine always takes part, and hand-offs never block,
// so a parallel loop nested in another cannot deadlock: with every worker
// busy the caller runs the whole loop itself.
type pool struct {
	threads int
	work    chan func()
}

func newPool(threads int) *pool {
	p := &pool{threads: threads, work: make(chan func())}
	for i := 1; i < threads; i++ {
		go func() {
			// A fault reading a mapped weight file that changed on disk
			// panics (instead of killing the process with SIGBUS); For
			// passes the panic on to its caller.
			debug.SetPanicOnFault(true)
			for f := range p.work {
				f()
			}
		}()
	}
	return p
}

// For calls fn over [0, n) split into contiguous ranges of at least grain
// items, in parallel. Ranges are handed out dynamically, so uneven work
// balances itself.
func (p *pool) For(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	chunks := (n + grain - 1) / grain
	if p.threads == 1 || chunks == 1 {
		fn(0, n)
		return
	}
	// A few ranges per thread lets fast threads take over the tail.
	tasks := min(chunks, 4*p.threads)
	size := (n + tasks - 1) / tasks
	var next atomic.Int64
	run := func() {
		for {
			lo := int(next.Add(1)-1) * size
			if lo >= n {
				return
			}
			fn(lo, min(lo+size, n))
		}
	}
	// A panic (a fault on a mapped weight) is raised again by the caller
	// once every worker has stopped touching fn's data.
	var panicked atomic.Pointer[any]
	catch := func() {
		if r := recover(); r != nil {
			panicked.Store(&r)
		}
	}
	var wg sync.WaitGroup
	for i := 1; i < min(p.threads, tasks); i++ {
		wg.Add(1)
		select {
		case p.work <- func() { defer wg.Done(); defer catch(); run() }:
		default:
			wg.Done()
		}
	}
	func() { defer catch(); run() }()
	wg.Wait()
	if r := panicked.Load(); r != nil {
		panic(*r)
	}
}
