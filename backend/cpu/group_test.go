package cpu

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// TestAddAllReduced: three ranks, each adding the group's sum of their
// partial rows to their own residual, many times over (the group's
// barrier reused): every rank ends with the same bits, the sum taken in
// rank order.
func TestAddAllReduced(t *testing.T) {
	const ranks, rows, cols, rounds = 3, 5, 7, 20
	g := NewGroup(ranks, Options{Threads: 1})
	rng := rand.New(rand.NewPCG(1, 2))
	parts := make([][][]float64, rounds)
	for i := range parts {
		for range ranks {
			p := make([]float64, rows*cols)
			for j := range p {
				p[j] = rng.NormFloat64()
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
			x := tensorF32(b, make([]float64, rows*cols), rows, cols)
			for i := range rounds {
				b.AddAllReduced(x, tensorF32(b, parts[i][r], rows, cols))
			}
			got[r] = readF32(t, b, x)
		})
	}
	wg.Wait()
	want := make([]float32, rows*cols)
	for i := range rounds {
		for j := range want {
			var s float32
			for r := range ranks {
				s += float32(parts[i][r][j])
			}
			want[j] += s
		}
	}
	for r := range got {
		if !slices.Equal(got[r], want) {
			t.Errorf("rank %d: %v, want %v", r, got[r][:4], want[:4])
		}
	}
}
