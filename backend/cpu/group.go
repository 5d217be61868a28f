package cpu

import (
	"fmt"
	"sync"

	"github.com/kiln-llm/kiln/backend"
)

// A group is CPU backends that run one model split across them (tensor
// parallel) in one process: the reference for a split model's arithmetic,
// which a group of GPUs computes through NCCL (docs/multigpu.md).
type group struct {
	n            int
	mu           sync.Mutex
	cond         *sync.Cond
	arrived, gen int
	aborted      bool
	parts        [][]float32
}

var _ backend.Collective = (*Backend)(nil)

// NewGroup returns n CPU backends, ranks 0 to n-1 of one group, each with
// opts's threads. A collective (AddAllReduced) returns once every rank has
// called it, so each rank runs on a goroutine of its own.
func NewGroup(n int, opts Options) []*Backend {
	g := &group{n: n, parts: make([][]float32, n)}
	g.cond = sync.NewCond(&g.mu)
	bs := make([]*Backend, n)
	for r := range bs {
		bs[r] = New(opts)
		bs[r].group, bs[r].rank = g, r
	}
	return bs
}

// wait returns once every rank of the group has called it; it panics with
// backend.ErrGroupAborted once the group is aborted.
func (g *group) wait() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.aborted {
		panic(backend.ErrGroupAborted)
	}
	gen := g.gen
	if g.arrived++; g.arrived == g.n {
		g.arrived = 0
		g.gen++
		g.cond.Broadcast()
		return
	}
	for gen == g.gen && !g.aborted {
		g.cond.Wait()
	}
	if g.aborted {
		panic(backend.ErrGroupAborted)
	}
}

// Abort ends the backend's group; see backend.Collective.
func (b *Backend) Abort() {
	if g := b.group; g != nil {
		g.mu.Lock()
		g.aborted = true
		g.cond.Broadcast()
		g.mu.Unlock()
	}
}

// Rank is the backend's place in its group (0 outside one).
func (b *Backend) Rank() int { return b.rank }

// Ranks is the size of the backend's group (1 outside one).
func (b *Backend) Ranks() int {
	if b.group == nil {
		return 1
	}
	return b.group.n
}

// Partial zeroes the residual x on every rank but 0, whose residual it
// is; see backend.Collective.
func (b *Backend) Partial(x backend.Tensor) {
	backend.CheckCollective("cpu: partial", x)
	if b.rank != 0 {
		clear(asT(x).out32())
	}
}

// AllReduce sums x over the group's ranks in place, taken in rank order so
// that every rank gets the same bits; see backend.Collective.
func (b *Backend) AllReduce(x backend.Tensor) {
	backend.CheckCollective("cpu: all-reduce", x)
	g := b.group
	if g == nil {
		return
	}
	xs := asT(x).out32()
	g.parts[b.rank] = xs
	g.wait()
	// Into a buffer of the rank's own first: the others are reading x.
	sum := b.reduced[:0]
	for i := range xs {
		var s float32
		for _, p := range g.parts {
			s += p[i]
		}
		sum = append(sum, s)
	}
	b.reduced = sum
	g.wait() // every rank has read every x
	copy(xs, sum)
}

// EmbedShare writes the embeddings of the step's tokens that the rank's
// share of the table holds, zeros for the others; see backend.Collective.
func (b *Backend) EmbedShare(out, table backend.Tensor, first int) { b.embed(out, table, first, true) }

// GatherCols joins the ranks' column blocks; see backend.Collective.
func (b *Backend) GatherCols(out, x backend.Tensor) {
	ot, xt := asT(out), asT(x)
	R, W := matrix(xt)
	n := b.Ranks()
	checkShape("gather cols out", ot, R, n*W)
	if ot.dt != backend.F32 || xt.dt != backend.F32 {
		panic(fmt.Sprintf("cpu: gather cols: %v into %v", xt, ot))
	}
	o := ot.out32()
	parts := [][]float32{xt.f32()}
	if g := b.group; g != nil {
		g.parts[b.rank] = xt.f32()
		g.wait()
		parts = g.parts
	}
	for r, p := range parts {
		for i := range R {
			copy(o[i*n*W+r*W:i*n*W+(r+1)*W], p[i*W:(i+1)*W])
		}
	}
	if b.group != nil {
		b.group.wait() // no rank writes its x again while another reads it
	}
}
