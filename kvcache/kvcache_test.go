package kvcache

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
)

// checkRefs verifies the allocator's accounting against the holders the test
// knows of: every block's count equals the number of holders referencing it.
func checkRefs(t *testing.T, a *Allocator, holders ...[]int32) {
	t.Helper()
	want := make([]int, a.Blocks())
	for _, h := range holders {
		for _, b := range h {
			want[b]++
		}
	}
	used := 0
	for b := range want {
		if a.Refs(int32(b)) != want[b] {
			t.Fatalf("block %d: refs %d, holders %d", b, a.Refs(int32(b)), want[b])
		}
		if want[b] > 0 {
			used++
		}
	}
	if a.Used() != used || a.Free() != a.Blocks()-used {
		t.Fatalf("used %d free %d, want used %d of %d", a.Used(), a.Free(), used, a.Blocks())
	}
}

func TestAllocatorRefcounts(t *testing.T) {
	a := NewAllocator(3)
	b0, _ := a.Alloc()
	b1, _ := a.Alloc()
	b2, _ := a.Alloc()
	if _, err := a.Alloc(); !errors.Is(err, ErrNoBlocks) {
		t.Fatalf("alloc from a full allocator: %v", err)
	}
	a.Retain(b1)
	a.Release(b1)
	if a.Free() != 0 {
		t.Fatal("a block with a reference left was freed")
	}
	a.Release(b1)
	if got, _ := a.Alloc(); got != b1 {
		t.Fatalf("freed block %d not reused, got %d", b1, got)
	}
	checkRefs(t, a, []int32{b0, b1, b2})
	defer func() {
		if recover() == nil {
			t.Fatal("double release did not panic")
		}
	}()
	a.Release(b0)
	a.Release(b0)
}

func TestTableReserveCopyOnWrite(t *testing.T) {
	a := NewAllocator(8)
	x := NewTable(4)
	if _, err := x.Reserve(a, 0, 6); err != nil {
		t.Fatal(err)
	}
	if len(x.Blocks()) != 2 {
		t.Fatalf("6 tokens of 4-token blocks: %d blocks", len(x.Blocks()))
	}
	// y shares x's blocks (as after a prefix hit) and writes token 5, in the
	// second, shared block: it gets a private copy of it, the first stays shared.
	y := NewTable(4)
	y.Adopt(a, x.Blocks())
	copies, err := y.Reserve(a, 5, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(copies) != 1 || copies[0].Src != x.Blocks()[1] || copies[0].Dst != y.Blocks()[1] || y.Blocks()[0] != x.Blocks()[0] {
		t.Fatalf("copies %v, x %v, y %v", copies, x.Blocks(), y.Blocks())
	}
	checkRefs(t, a, x.Blocks(), y.Blocks())
	// Writing a private block copies nothing.
	if copies, _ := y.Reserve(a, 6, 1); len(copies) != 0 {
		t.Fatalf("private write copied %v", copies)
	}
	// A reservation that cannot be met leaves the table as it was.
	before := slices.Clone(y.Blocks())
	if _, err := y.Reserve(a, 4, 100); !errors.Is(err, ErrNoBlocks) {
		t.Fatalf("oversized reserve: %v", err)
	}
	if !slices.Equal(before, y.Blocks()) {
		t.Fatalf("failed reserve changed the table: %v -> %v", before, y.Blocks())
	}
	checkRefs(t, a, x.Blocks(), y.Blocks())
	x.Release(a)
	y.Release(a)
	checkRefs(t, a)
}

func TestPrefixCacheMatchAndEviction(t *testing.T) {
	a := NewAllocator(6)
	c := NewPrefixCache(a, 2)
	seq := []int32{1, 2, 3, 4, 5}
	x := NewTable(2)
	if _, err := x.Reserve(a, 0, len(seq)); err != nil {
		t.Fatal(err)
	}
	var ch Chain
	c.Insert(&ch, seq, x.Blocks())
	if c.Len() != 2 {
		t.Fatalf("5 tokens in 2-token blocks: %d cached, want 2", c.Len())
	}
	blocks, mch := c.Match([]int32{1, 2, 3, 4, 9, 9})
	if !slices.Equal(blocks, x.Blocks()[:2]) || mch != ch {
		t.Fatalf("match %v %v, want %v %v", blocks, mch, x.Blocks()[:2], ch)
	}
	if blocks, _ := c.Match([]int32{1, 2, 7, 4}); len(blocks) != 1 {
		t.Fatalf("diverging prefix matched %d blocks", len(blocks))
	}
	x.Release(a)
	checkRefs(t, a, blocks[:2])
	// Fill the rest: the cache gives back its blocks, leaf first.
	y := NewTable(2)
	if _, err := y.Reserve(a, 0, 12); err != nil {
		t.Fatalf("cache did not give back its blocks: %v", err)
	}
	if c.Len() != 0 {
		t.Fatalf("%d entries left after reclaim", c.Len())
	}
	y.Release(a)
	checkRefs(t, a)
}

// Two sequences that computed the same prefix side by side: the second's
// own blocks hang below the first's copy of the prefix, which the cache
// gives back (with what hangs below it) once the first is gone, so that
// the second can use every other block.
func TestPrefixCacheReclaimBelowOthersCopy(t *testing.T) {
	a := NewAllocator(8)
	c := NewPrefixCache(a, 2)
	seq := []int32{1, 2, 3, 4, 5, 6}
	x, y := NewTable(2), NewTable(2)
	var xc, yc Chain
	for _, tb := range []*Table{x, y} {
		if _, err := tb.Reserve(a, 0, 4); err != nil {
			t.Fatal(err)
		}
	}
	c.Insert(&xc, seq[:4], x.Blocks())
	c.Insert(&yc, seq[:4], y.Blocks()) // the same prefix: x's copy is kept
	if _, err := y.Reserve(a, 4, 2); err != nil {
		t.Fatal(err)
	}
	c.Insert(&yc, seq, y.Blocks()) // y's third block hangs below x's second
	x.Release(a)
	if _, err := y.Reserve(a, 6, 10); err != nil {
		t.Fatalf("y alone cannot grow to 8 blocks: %v (cache holds %d)", err, c.Len())
	}
	checkRefs(t, a, y.Blocks())
	y.Release(a)
	checkRefs(t, a)
}

// TestPrefixCacheRandomInvariants runs random sequences over a small pool:
// whatever the interleaving, every match returns blocks whose cached tokens
// equal the request's, reference counts equal the holders, and a cleared
// cache leaves every block free.
func TestPrefixCacheRandomInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const bs = 4
	a := NewAllocator(40)
	c := NewPrefixCache(a, bs)
	content := map[int32][]int32{} // block -> the tokens written into it
	type seq struct {
		tab    *Table
		tokens []int32
		ch     Chain
	}
	var live []*seq
	holders := func() [][]int32 {
		var h [][]int32
		for _, s := range live {
			h = append(h, s.tab.Blocks())
		}
		for _, e := range c.entries {
			h = append(h, []int32{e.block})
		}
		return h
	}
	for step := range 3000 {
		if len(live) > 0 && (len(live) > 4 || rng.IntN(3) == 0) {
			i := rng.IntN(len(live))
			s := live[i]
			c.Insert(&s.ch, s.tokens, s.tab.Blocks())
			s.tab.Release(a)
			live = slices.Delete(live, i, i+1)
		} else {
			n := 1 + rng.IntN(20)
			tokens := make([]int32, n)
			for i := range tokens {
				tokens[i] = int32(rng.IntN(2)) // small alphabet: many shared prefixes
			}
			s := &seq{tab: NewTable(bs), tokens: tokens}
			blocks, ch := c.Match(tokens)
			for i, b := range blocks {
				if !slices.Equal(content[b], tokens[i*bs:(i+1)*bs]) {
					t.Fatalf("step %d: block %d holds %v, matched for %v", step, b, content[b], tokens[i*bs:(i+1)*bs])
				}
			}
			s.tab.Adopt(a, blocks)
			s.ch = ch
			pos := min(len(blocks)*bs, n-1)
			copies, err := s.tab.Reserve(a, pos, n-pos)
			if errors.Is(err, ErrNoBlocks) {
				s.tab.Release(a)
				continue
			} else if err != nil {
				t.Fatal(err)
			}
			for _, cp := range copies {
				content[cp.Dst] = slices.Clone(content[cp.Src])
			}
			// "Compute" the new tokens: write them into their blocks.
			for p := pos; p < n; p++ {
				b := s.tab.Blocks()[p/bs]
				if p%bs == 0 || len(content[b]) > p%bs {
					content[b] = content[b][:p%bs]
				}
				content[b] = append(content[b], tokens[p])
			}
			live = append(live, s)
		}
		checkRefs(t, a, holders()...)
	}
	for _, s := range live {
		s.tab.Release(a)
	}
	live = nil
	c.Clear()
	checkRefs(t, a)
}

func TestSnapshotsFindBudgetAndGroups(t *testing.T) {
	a := NewAllocator(16)
	s := NewSnapshots(a, 4, 30)
	tab := NewTable(4)
	if _, err := tab.Reserve(a, 0, 12); err != nil {
		t.Fatal(err)
	}
	toks := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	p, _ := s.Save(toks[:5], make([]byte, 10), tab.Blocks(), 1)
	q, _ := s.Save(toks[:9], make([]byte, 10), tab.Blocks(), 1)
	if len(p.Blocks) != 2 || len(q.Blocks) != 3 {
		t.Fatalf("blocks held: %d and %d, want 2 and 3", len(p.Blocks), len(q.Blocks))
	}
	if s.Blocks() != 3 {
		t.Fatalf("two snapshots sharing two blocks hold %d distinct blocks, want 3", s.Blocks())
	}
	if got := s.Find(toks, 12); got != q {
		t.Fatalf("longest prefix: got %v", got)
	}
	if got := s.Find(toks, 8); got != p {
		t.Fatalf("maxLen 8: got %v", got)
	}
	if got := s.Find([]int32{1, 2, 3, 4, 0, 6, 7, 8, 9, 10}, 10); got != nil {
		t.Fatalf("diverging tokens matched %v", got.Tokens)
	}
	// Over budget: the least recently used (q, p was found last) goes.
	r, _ := s.Save([]int32{7, 7}, make([]byte, 15), tab.Blocks(), 2)
	if s.Len() != 2 || s.Bytes() != 25 || s.Find(toks, 12) != p {
		t.Fatalf("after budget eviction: %d snapshots, %d bytes", s.Len(), s.Bytes())
	}
	if _, err := s.Save(toks, make([]byte, 31), tab.Blocks(), 3); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("oversized snapshot: %v", err)
	}
	s.DropGroup(1, 0)
	if s.Len() != 1 || s.Find([]int32{7, 7, 1}, 3) != r {
		t.Fatal("DropGroup dropped the wrong snapshots")
	}
	if s.Blocks() != 1 {
		t.Fatalf("one 2-token snapshot holds %d blocks, want 1", s.Blocks())
	}
	checkRefs(t, a, tab.Blocks(), r.Blocks)
	tab.Release(a)
	// The table is gone: the snapshot's block is the only reference, and
	// the allocator can get it back.
	other := NewTable(4)
	if _, err := other.Reserve(a, 0, 64); err != nil || s.Len() != 0 {
		t.Fatalf("snapshot blocks not reclaimed: %v, %d left", err, s.Len())
	}
	other.Release(a)
	checkRefs(t, a)
	if s.Blocks() != 0 {
		t.Fatalf("an empty store holds %d blocks", s.Blocks())
	}
}
