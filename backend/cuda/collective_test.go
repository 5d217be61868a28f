//go:build cgo

package cuda

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/model"
	"github.com/kiln-llm/kiln/model/reference"
)

// groups opens, once, a group of one GPU and, where the machine has two,
// a group of two, through NCCL.
var (
	groupsOnce sync.Once
	groupsOf   map[int][]*Backend
	groupsErr  error
)

func testGroups(t *testing.T) map[int][]*Backend {
	t.Helper()
	newPair(t, 1) // skips without a GPU
	groupsOnce.Do(func() {
		n, err := deviceCount()
		if err != nil {
			groupsErr = err
			return
		}
		groupsOf = map[int][]*Backend{}
		for _, size := range []int{1, 2} {
			if size > n {
				break
			}
			devs := make([]int, size)
			for i := range devs {
				devs[i] = i
			}
			if groupsOf[size], err = NewGroup(devs, Options{}); err != nil {
				groupsErr = err
				return
			}
		}
	})
	if groupsErr != nil {
		if os.Getenv("KILN_REQUIRE_GPU") != "" {
			t.Fatalf("KILN_REQUIRE_GPU is set but no group of GPUs opens: %v", groupsErr)
		}
		t.Skip(groupsErr)
	}
	return groupsOf
}

// TestSplitFixtures runs each fixture split across the GPUs of a group
// (tensor and expert parallel through NCCL) against the whole model on one
// GPU, prompts and then greedy decode steps through the captured graphs
// (the collectives captured with them): split in one rank it equals the
// whole model bit for bit; in two, the last logits are within bf16
// tolerance (relative L2 1e-2; 3e-2 for the GGUF files of quantized
// weights, whose experts split whole) and the argmax is the whole model's
// wherever its top-2 margin exceeds 0.05.
func TestSplitFixtures(t *testing.T) {
	groups := testGroups(t)
	if len(groups) < 2 {
		t.Log("one GPU: the fixtures run split in one rank only")
	}
	dir := filepath.Join("..", "..", "testdata")
	type fixture struct{ name, model, prompts string }
	var fixtures []fixture
	for _, name := range []string{"qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe"} {
		fdir := filepath.Join(dir, "fixtures", name)
		fixtures = append(fixtures, fixture{name, fdir, fdir})
	}
	for _, c := range [][2]string{{"qwen3-w256-Q8_0", "qwen3"}, {"qwen3moe-w256-MXFP4_MOE", "qwen3moe"}} {
		fixtures = append(fixtures, fixture{c[0], filepath.Join(dir, "quant", c[0]+".gguf"), filepath.Join(dir, "fixtures", c[1])})
	}
	for _, f := range fixtures {
		tol := 1e-2
		if f.model != f.prompts {
			tol = 3e-2
		}
		for _, n := range []int{1, 2} {
			bs := groups[n]
			if bs == nil {
				continue
			}
			t.Run(fmt.Sprintf("%s/%d", f.name, n), func(t *testing.T) {
				ref, err := reference.Read(f.prompts)
				if err != nil {
					t.Skip(err)
				}
				const extra = 8
				nblocks := 0
				for _, pr := range ref.Prompts {
					nblocks = max(nblocks, (len(pr.IDs)+extra+15)/16)
				}
				cache := model.CacheSpec{Blocks: nblocks, BlockSize: 16, Slots: 2}
				opts := model.Options{KVDType: backend.BF16}
				whole, err := model.Load(f.model, bs[0], opts)
				if err != nil {
					t.Fatal(err)
				}
				defer whole.Close()
				ranks := make([]*model.Model, n)
				for r, b := range bs {
					o := opts
					o.Rank, o.Ranks = r, n
					if ranks[r], err = model.Load(f.model, b, o); err != nil {
						t.Fatal(err)
					}
				}
				split, err := model.Group(ranks)
				if err != nil {
					t.Fatal(err)
				}
				defer split.Close()
				for _, m := range []*model.Model{whole, split} {
					if err := m.AllocCache(cache); err != nil {
						t.Fatal(err)
					}
				}
				blocks := make([]int32, nblocks)
				for i := range blocks {
					blocks[i] = int32(i)
				}
				for pi, pr := range ref.Prompts {
					seq := model.Seq{Tokens: pr.IDs, Blocks: blocks, Slot: 0, Logits: model.LastLogits}
					pos := len(pr.IDs)
					for step := 0; step <= extra; step++ {
						wl, err := whole.Forward([]model.Seq{seq})
						if err != nil {
							t.Fatal(err)
						}
						w := read(t, bs[0], wl)
						sl, err := split.Forward([]model.Seq{seq})
						if err != nil {
							t.Fatal(err)
						}
						s := read(t, bs[0], sl)
						wt, margin := argmaxMargin(w)
						st, _ := argmaxMargin(s)
						switch {
						case n == 1 && !slices.Equal(w, s):
							t.Fatalf("prompt %d step %d: one rank through NCCL differs from the whole model (relative L2 %.3g)", pi, step, relL2(s, w))
						case n > 1 && !(relL2(s, w) <= tol):
							t.Fatalf("prompt %d step %d: split logits relative L2 %.3g from the whole model's", pi, step, relL2(s, w))
						case wt != st && margin > 0.05:
							t.Fatalf("prompt %d step %d: split argmax %d, whole %d (margin %.3g)", pi, step, st, wt, margin)
						}
						if step == 0 {
							t.Logf("prompt %d: relative L2 %.3g", pi, relL2(s, w))
						}
						seq = model.Seq{Tokens: []int32{wt}, Pos: pos, Blocks: blocks, Slot: 0, Logits: model.LastLogits}
						pos++
					}
				}
			})
		}
	}
}

// TestAllReduce: each rank's residual as Partial leaves it, plus a share
// of its own, summed in place by AllReduce over a group of one GPU and of
// two, in several shapes: every rank ends with the residual plus the
// shares, bit for bit.
func TestAllReduce(t *testing.T) {
	for n, bs := range testGroups(t) {
		for round, shape := range [][2]int{{1, 4096}, {64, 2048}, {3, 4096}, {700, 1000}} {
			rng := rand.New(rand.NewPCG(uint64(round), uint64(n)))
			rows, cols := shape[0], shape[1]
			start := make([][]float32, n) // rank 0's is the residual; Partial zeroes the others'
			shares := make([][]float32, n)
			for r := range n {
				start[r], shares[r] = make([]float32, rows*cols), make([]float32, rows*cols)
				for i := range start[r] {
					start[r][i], shares[r][i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
				}
			}
			xs := make([]backend.Tensor, n)
			for r, b := range bs {
				xs[r] = b.Alloc(backend.F32, rows, cols)
				b.Write(xs[r], encode(backend.F32, start[r]))
				b.Partial(xs[r])
				got := read(t, b, xs[r])
				if r == 0 && !slices.Equal(got, start[0]) || r > 0 && slices.ContainsFunc(got, func(v float32) bool { return v != 0 }) {
					t.Fatalf("%d ranks, round %d: rank %d's residual after Partial is not %s", n, round, r, map[bool]string{true: "kept", false: "zeros"}[r == 0])
				}
				for i := range got {
					got[i] += shares[r][i]
				}
				b.Write(xs[r], encode(backend.F32, got))
			}
			var wg sync.WaitGroup
			for r, b := range bs {
				wg.Go(func() { b.AllReduce(xs[r]) })
			}
			wg.Wait()
			want := make([]float32, rows*cols)
			for i := range want {
				want[i] = start[0][i] + shares[0][i]
				for r := 1; r < n; r++ {
					want[i] += shares[r][i]
				}
			}
			for r, b := range bs {
				if err := b.Sync(); err != nil {
					t.Fatal(err)
				}
				if got := read(t, b, xs[r]); !slices.Equal(got, want) {
					t.Fatalf("%d ranks, round %d, [%d, %d]: rank %d's sum differs (relative L2 %.3g)", n, round, rows, cols, r, relL2(got, want))
				}
				b.Free(xs[r])
			}
		}
	}
}

// TestAllReduceGraphs: all-reduces captured in a graph and all-reduces
// issued as they come, queued one after the other with no wait between
// (a prefill after a decode step): with NCCL's graph mixing support off
// they go through different communicators, and every sum is right.
func TestAllReduceGraphs(t *testing.T) {
	for n, bs := range testGroups(t) {
		xs := make([]backend.Tensor, n)
		for r, b := range bs {
			xs[r] = b.Alloc(backend.F32, 3, 4096)
			b.Write(xs[r], encode(backend.F32, slices.Repeat([]float32{1}, 3*4096)))
		}
		const rounds = 5
		var wg sync.WaitGroup
		for r, b := range bs {
			wg.Go(func() {
				for range rounds {
					b.Graph("allreduce graphs", func() { b.AllReduce(xs[r]) })
					b.AllReduce(xs[r])
				}
			})
		}
		wg.Wait()
		want := float32(1)
		for range 2 * rounds {
			want *= float32(n)
		}
		for r, b := range bs {
			if err := b.Sync(); err != nil {
				t.Fatal(err)
			}
			if got := read(t, b, xs[r]); slices.ContainsFunc(got, func(v float32) bool { return v != want }) {
				t.Fatalf("%d ranks: rank %d holds %v, want %v everywhere", n, r, got[0], want)
			}
			b.Free(xs[r])
		}
	}
}

// TestGroupAbort: a rank waiting in an all-reduce that its peer will never
// join is released when the peer aborts the group, and every later
// collective panics with backend.ErrGroupAborted.
func TestGroupAbort(t *testing.T) {
	groups := testGroups(t)
	if groups[2] == nil {
		t.Skip("one GPU")
	}
	// A group of its own: this one ends.
	bs, err := NewGroup([]int{0, 1}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	xs := make([]backend.Tensor, 2)
	var wg sync.WaitGroup
	for r, b := range bs {
		xs[r] = b.Alloc(backend.F32, 4, 8)
		b.Write(xs[r], make([]byte, 4*32))
		wg.Go(func() { b.AllReduce(xs[r]) }) // connects the pair
	}
	wg.Wait()
	for _, b := range bs {
		if err := b.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	bs[0].AllReduce(xs[0]) // rank 1 never joins
	done := make(chan error, 1)
	go func() { done <- bs[0].Sync() }()
	bs[1].Abort()
	select {
	case err := <-done:
		t.Logf("rank 0's wait ended: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("rank 0 still waits 30 s after the abort")
	}
	defer func() {
		if p := recover(); p != backend.ErrGroupAborted {
			t.Errorf("a collective after the abort: %v, want ErrGroupAborted", p)
		}
	}()
	bs[0].AllReduce(xs[0])
}

// BenchmarkAllReduce: NCCL's all-reduce of a [rows, 4096] f32 residual
// across two GPUs as the decode graphs issue it, 100 in a captured graph;
// us/allreduce is one of them.
func BenchmarkAllReduce(b *testing.B) {
	n, err := deviceCount()
	if err != nil || n < 2 {
		b.Skip("two GPUs needed")
	}
	bs, err := NewGroup([]int{0, 1}, Options{})
	if err != nil {
		b.Fatal(err)
	}
	for _, rows := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			const inGraph = 100
			xs := make([]backend.Tensor, 2)
			for r, g := range bs {
				xs[r] = g.Alloc(backend.F32, rows, 4096)
			}
			var wg sync.WaitGroup
			step := func() {
				for r, g := range bs {
					wg.Go(func() {
						g.Graph(fmt.Sprintf("allreduce/%d", rows), func() {
							for range inGraph {
								g.AllReduce(xs[r])
							}
						})
					})
				}
				wg.Wait()
			}
			sync := func() {
				for _, g := range bs {
					if err := g.Sync(); err != nil {
						b.Fatal(err)
					}
				}
			}
			step() // captures
			sync()
			for b.Loop() {
				step()
			}
			sync()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/1e3/float64(b.N*inGraph), "us/allreduce")
			for r, g := range bs {
				g.Free(xs[r])
				g.dropGraph(fmt.Sprintf("allreduce/%d", rows)) // a second run (-count) captures its own
			}
		})
	}
}
