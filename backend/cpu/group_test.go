package cpu

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/kiln-llm/kiln/backend"
)

// TestAllReduce: three ranks, each adding its share of an output to the
// residual as Partial leaves it (rank 0: the residual, the others: zeros)
// and summing those over the group, many times over (the group's barrier
// reused): every rank ends with the same bits, the residual plus the
// shares in rank order.
func TestAllReduce(t *testing.T) {
	const ranks, rows, cols, rounds = 3, 5, 7, 20
	g := NewGroup(ranks, Options{Threads: 1})
	rng := rand.New(rand.NewPCG(1, 2))
	start := make([]float64, rows*cols)
	for j := range start {
		start[j] = rng.NormFloat64()
	}
	parts := make([][][]float32, rounds)
	for i := range parts {
		for range ranks {
			p := make([]float32, rows*cols)
			for j := range p {
				p[j] = float32(rng.NormFloat64())
			}
			parts[i] = append(parts[i], p)
		}
	}
	got := make([][]float32, ranks)
	var wg sync.WaitGroup
	for r, b := range g {
		if b.Rank() != r || b.Ranks() != ranks {
			t.Fatalf("rank %d says rank %d of %d", r, b.Rank(), b.Ranks())
		}
		wg.Go(func() {
			x := tensorF32(b, start, rows, cols)
			for i := range rounds {
				b.Partial(x)
				p := readF32(t, b, x)
				for j := range p {
					p[j] += parts[i][r][j]
				}
				b.Write(x, asBytes(p))
				b.AllReduce(x)
			}
			got[r] = readF32(t, b, x)
		})
	}
	wg.Wait()
	want := make([]float32, rows*cols)
	for j := range want {
		want[j] = float32(start[j])
	}
	for i := range rounds {
		for j := range want {
			s := want[j] + parts[i][0][j]
			for r := 1; r < ranks; r++ {
				s += parts[i][r][j]
			}
			want[j] = s
		}
	}
	for r := range got {
		if !slices.Equal(got[r], want) {
			t.Errorf("rank %d: %v, want %v", r, got[r][:4], want[:4])
		}
	}
}

// TestGroupAbort: a rank that aborts the group releases the others from
// the collective they wait in, and every later collective fails too.
func TestGroupAbort(t *testing.T) {
	g := NewGroup(3, Options{Threads: 1})
	panics := make([]any, 3)
	var wg sync.WaitGroup
	for r, b := range g[:2] {
		wg.Go(func() {
			defer func() { panics[r] = recover() }()
			b.AllReduce(tensorF32(b, []float64{1, 2, 3, 4}, 2, 2))
		})
	}
	g[2].Abort()
	wg.Wait()
	for r, p := range panics[:2] {
		if p != backend.ErrGroupAborted {
			t.Errorf("rank %d: %v, want ErrGroupAborted", r, p)
		}
	}
	func() {
		defer func() {
			if p := recover(); p != backend.ErrGroupAborted {
				t.Errorf("a collective after the abort: %v", p)
			}
		}()
		b := g[2]
		b.AllReduce(tensorF32(b, make([]float64, 4), 2, 2))
	}()
}
