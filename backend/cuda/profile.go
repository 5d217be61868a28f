//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sort"
	"strings"
)

// profiler times every launch with a pair of events (KILN_CUDA_PROFILE=1;
// graphs are then not captured, so each kernel is seen).
type profiler struct {
	free    []C.CUevent
	pending []profMark
	total   map[string]float64 // milliseconds
	count   map[string]int
}

type profMark struct {
	name       string
	start, end C.CUevent
}

func (p *profiler) event(ctx C.CUcontext) C.CUevent {
	if n := len(p.free); n > 0 {
		e := p.free[n-1]
		p.free = p.free[:n-1]
		return e
	}
	var e C.CUevent
	if C.k_cuEventCreate(ctx, &e, 0) != 0 {
		panic("cuda: cuEventCreate failed")
	}
	return e
}

// around runs launch between two recorded events.
func (b *Backend) around(name string, launch func()) {
	p := b.prof
	if p == nil {
		launch()
		return
	}
	m := profMark{name: name, start: p.event(b.ctx), end: p.event(b.ctx)}
	C.k_cuEventRecord(b.ctx, m.start, b.stream)
	launch()
	C.k_cuEventRecord(b.ctx, m.end, b.stream)
	p.pending = append(p.pending, m)
	if len(p.pending) > 4096 {
		b.collect()
	}
}

// collect waits for the recorded events and adds up their times.
func (b *Backend) collect() {
	p := b.prof
	C.k_cuStreamSynchronize(b.ctx, b.stream)
	for _, m := range p.pending {
		var ms C.float
		if C.k_cuEventElapsedTime(b.ctx, &ms, m.start, m.end) == 0 {
			p.total[m.name] += float64(ms)
			p.count[m.name]++
		}
		p.free = append(p.free, m.start, m.end)
	}
	p.pending = p.pending[:0]
}

// ProfileReport returns the device time per kernel since the last report
// (empty unless KILN_CUDA_PROFILE=1), and resets the counts.
func (b *Backend) ProfileReport() string {
	if b.prof == nil {
		return ""
	}
	b.collect()
	p := b.prof
	names := make([]string, 0, len(p.total))
	sum := 0.0
	for n, t := range p.total {
		names = append(names, n)
		sum += t
	}
	sort.Slice(names, func(i, j int) bool { return p.total[names[i]] > p.total[names[j]] })
	var sb strings.Builder
	fmt.Fprintf(&sb, "%8s %6s %10s %8s  %s\n", "ms", "%", "calls", "us/call", "kernel")
	for _, n := range names {
		fmt.Fprintf(&sb, "%8.2f %6.1f %10d %8.1f  %s\n", p.total[n], 100*p.total[n]/sum, p.count[n], 1000*p.total[n]/float64(p.count[n]), n)
	}
	p.total, p.count = map[string]float64{}, map[string]int{}
	return sb.String()
}
