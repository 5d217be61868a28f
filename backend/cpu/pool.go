package cpu

import (
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// pool is a fixed set of worker goroutines that operations split their work
// over; the calling goroutine always takes part.
//
// A decode step of a small model is a few hundred parallel loops of tens of
// microseconds each, so handing a loop to the workers must cost far less
// than that. Waking a parked goroutine takes the Go scheduler several
// microseconds and often more (the thread of an idle P has to be woken), so
// workers spin on the published loop for spinTime after finishing one, and
// only then park; the caller wakes the parked ones. This is what llama.cpp's
// threadpool does (spin, then sleep on a condition variable).
//
// A loop started while another runs (nested, or from another goroutine)
// runs whole on its caller, so nesting cannot deadlock.
//
// A fault reading a mapped weight file that changed on disk panics
// (instead of killing the process with SIGBUS) on whichever goroutine ran
// into it; For raises it again in its caller, for the model to report.
type pool struct {
	threads int
	busy    atomic.Bool         // a loop is being handed out
	cur     atomic.Pointer[job] // the latest loop
	workers []*worker
}

type worker struct {
	asleep atomic.Bool
	wake   chan struct{}
}

// job is one parallel loop: fn over [0, n) in ranges of size, claimed
// through next. The caller closes it when no range is left and then waits
// until no worker is inside it: a worker that joins after the close runs
// nothing, so fn (and what it refers to) is never used after For returns.
type job struct {
	fn      func(lo, hi int)
	n, size int
	next    atomic.Int64
	active  atomic.Int32
	closed  atomic.Bool
	panic   atomic.Pointer[any] // the first panic of a range, raised by For
}

// spinTime is how long an idle worker polls for the next loop before
// parking: longer than the gaps between the loops of a step, short enough
// that an idle server costs nothing.
const spinTime = 200 * time.Microsecond

func newPool(threads int) *pool {
	p := &pool{threads: threads}
	for i := 1; i < threads; i++ {
		w := &worker{wake: make(chan struct{}, 1)}
		w.asleep.Store(true)
		p.workers = append(p.workers, w)
		go p.work(w)
	}
	return p
}

// For calls fn over [0, n) split into contiguous ranges of about grain
// items or more, in parallel. Ranges are handed out dynamically, so uneven work
// balances itself.
func (p *pool) For(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	grain = max(grain, 1)
	chunks := (n + grain - 1) / grain
	if p.threads == 1 || chunks == 1 || !p.busy.CompareAndSwap(false, true) {
		fn(0, n)
		return
	}
	defer p.busy.Store(false)
	// A few ranges per thread lets fast threads take over the tail.
	tasks := min(chunks, 4*p.threads)
	j := &job{fn: fn, n: n, size: (n + tasks - 1) / tasks}
	p.cur.Store(j)
	for _, w := range p.workers[:min(len(p.workers), tasks-1)] {
		if w.asleep.Load() && w.asleep.CompareAndSwap(true, false) {
			w.wake <- struct{}{}
		}
	}
	j.run()
	j.closed.Store(true)
	for i := 0; j.active.Load() != 0; i++ {
		if i%64 == 63 {
			runtime.Gosched() // a worker may be waiting for this thread's P
		}
	}
	j.fn = nil // p.cur keeps the job: not what fn refers to
	if r := j.panic.Load(); r != nil {
		panic(*r)
	}
}

// run takes ranges until none is left. A range that panics stops its
// runner, and every other range is skipped: the step has failed.
func (j *job) run() {
	defer func() {
		if r := recover(); r != nil {
			j.panic.CompareAndSwap(nil, &r)
			j.next.Store(int64(j.n)) // no range left to claim
		}
	}()
	for {
		lo := int(j.next.Add(1)-1) * j.size
		if lo >= j.n {
			return
		}
		j.fn(lo, min(lo+j.size, j.n))
	}
}

// work is a worker's loop: join each new job while it is open.
func (p *pool) work(w *worker) {
	debug.SetPanicOnFault(true)
	var seen *job
	<-w.wake
	for {
		j := p.cur.Load()
		if j == seen {
			j = p.wait(w, seen)
		}
		seen = j
		j.active.Add(1)
		if !j.closed.Load() {
			j.run()
		}
		j.active.Add(-1)
	}
}

// wait returns the first job after seen: polled for spinTime, then parked
// until a caller wakes the worker.
func (p *pool) wait(w *worker, seen *job) *job {
	var deadline time.Time
	for i := 0; ; i++ {
		if j := p.cur.Load(); j != seen {
			return j
		}
		if i%256 == 255 {
			now := time.Now()
			if deadline.IsZero() {
				deadline = now.Add(spinTime)
			} else if now.After(deadline) {
				break
			}
			runtime.Gosched() // let goroutines that need this P run
		}
	}
	w.asleep.Store(true)
	if j := p.cur.Load(); j != seen && w.asleep.CompareAndSwap(true, false) {
		return j
	}
	// Asleep, or a caller took the flag and is sending the wake-up.
	<-w.wake
	return p.cur.Load()
}
