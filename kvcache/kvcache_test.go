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

// slotDevice is a StateDevice of n slots of size bytes in memory; each
// slot's first byte tells its state apart.
type slotDevice struct {
	slots [][]byte
	saves int // SaveSlot calls: waits for the device
}

func newSlotDevice(n, size int) *slotDevice {
	d := &slotDevice{}
	for range n {
		d.slots = append(d.slots, make([]byte, size))
	}
	return d
}

func (d *slotDevice) SlotBytes() int        { return len(d.slots[0]) }
func (d *slotDevice) CopySlot(dst, src int) { copy(d.slots[dst], d.slots[src]) }
func (d *slotDevice) SaveSlot(slot int, dst []byte) error {
	d.saves++
	copy(dst, d.slots[slot])
	return nil
}
func (d *slotDevice) RestoreSlot(slot int, src []byte) { copy(d.slots[slot], src) }

func TestSnapshotsFindBudgetAndGroups(t *testing.T) {
	a := NewAllocator(16)
	dev := newSlotDevice(1, 10)
	s := NewSnapshots(a, 4, dev, nil, 25) // host memory only: two states
	tab := NewTable(4)
	if _, err := tab.Reserve(a, 0, 12); err != nil {
		t.Fatal(err)
	}
	toks := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	dev.slots[0][0] = 'p'
	p, _ := s.Save(toks[:5], 0, tab.Blocks(), 1, 0, Point)
	dev.slots[0][0] = 'q'
	q, _ := s.Save(toks[:9], 0, tab.Blocks(), 1, 0, Tip)
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
	s.Restore(p, 0)
	if dev.slots[0][0] != 'p' {
		t.Fatalf("restored state %q, want p's", dev.slots[0][0])
	}
	if got := s.Find([]int32{1, 2, 3, 4, 0, 6, 7, 8, 9, 10}, 10); got != nil {
		t.Fatalf("diverging tokens matched %v", got.Tokens)
	}
	// Over budget: the least recently used (q, p was found last) goes.
	r, _ := s.Save([]int32{7, 7}, 0, tab.Blocks(), 2, 1, Tip)
	if s.Len() != 2 || s.Bytes() != 20 || s.Find(toks, 12) != p {
		t.Fatalf("after budget eviction: %d snapshots, %d bytes", s.Len(), s.Bytes())
	}
	if parent, _ := s.Parent(2); parent != 1 {
		t.Fatalf("group 2's parent %d, want 1", parent)
	}
	if _, children := s.Parent(1); children != 1 {
		t.Fatalf("group 1 has %d children, want 1", children)
	}
	big := NewSnapshots(NewAllocator(4), 4, dev, nil, 9)
	if _, err := big.Save(toks, 0, tab.Blocks(), 3, 0, Point); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("oversized snapshot: %v", err)
	}
	s.DropGroup(1)
	if s.Len() != 1 || s.Find([]int32{7, 7, 1}, 3) != r {
		t.Fatal("DropGroup dropped the wrong snapshots")
	}
	if _, children := s.Parent(1); children != 0 {
		t.Fatal("a dropped group still counts")
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
	if s.Blocks() != 0 || s.Bytes() != 0 {
		t.Fatalf("an empty store holds %d blocks, %d bytes", s.Blocks(), s.Bytes())
	}
}

// TestSnapshotsAdopt: a snapshot that a later request adopts stays when
// the group that saved it is dropped, goes with the adopter's group, and
// the groups' counts follow (a group that lost its last snapshot is gone,
// and its parent has one child fewer).
func TestSnapshotsAdopt(t *testing.T) {
	a := NewAllocator(16)
	s := NewSnapshots(a, 4, newSlotDevice(1, 10), nil, 100)
	tab := NewTable(4)
	if _, err := tab.Reserve(a, 0, 12); err != nil {
		t.Fatal(err)
	}
	toks := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	s.Save(toks[:3], 0, tab.Blocks(), 1, 0, Tip)
	p, _ := s.Save(toks[:5], 0, tab.Blocks(), 2, 1, Point)
	q, _ := s.Save(toks[:7], 0, tab.Blocks(), 2, 1, Tip)
	if _, children := s.Parent(1); children != 1 {
		t.Fatalf("group 1 has %d children, want 1", children)
	}
	s.Adopt(q, 3, 2)
	if q.Group != 3 {
		t.Fatalf("adopted snapshot in group %d, want 3", q.Group)
	}
	if parent, _ := s.Parent(3); parent != 2 {
		t.Fatalf("group 3's parent %d, want 2", parent)
	}
	s.Adopt(p, 3, 2) // group 2's last: the group goes
	if parent, children := s.Parent(2); parent != 0 || children != 0 {
		t.Fatalf("an emptied group still counts: parent %d, %d children", parent, children)
	}
	if _, children := s.Parent(1); children != 0 {
		t.Fatalf("group 1 has %d children once group 2 is gone, want 0", children)
	}
	s.DropGroup(2)
	if s.Len() != 3 {
		t.Fatalf("dropping the group that saved them dropped adopted snapshots: %d left", s.Len())
	}
	s.DropGroup(3)
	if s.Len() != 1 || s.Find(toks, 9).Group != 1 {
		t.Fatalf("dropping the adopter's group left %d snapshots", s.Len())
	}
	s.Clear()
	tab.Release(a)
	checkRefs(t, a)
}

// Snapshots live in the spare device slots while there are some: saving and
// restoring copy on the device; the least recently used move to host
// memory when the slots run out or Offload asks, and come back from there.
func TestSnapshotsDeviceSlots(t *testing.T) {
	a := NewAllocator(16)
	dev := newSlotDevice(4, 8) // slot 0 runs the sequence, 1-3 are spare
	var evicted []uint64
	s := NewSnapshots(a, 4, dev, []int{1, 2, 3}, 16)
	s.Evicted = func(sn *Snapshot) { evicted = append(evicted, sn.ID) }
	tab := NewTable(4)
	if _, err := tab.Reserve(a, 0, 16); err != nil {
		t.Fatal(err)
	}
	toks := make([]int32, 16)
	var snaps []*Snapshot
	for i := range 3 {
		toks[i] = int32(i + 1)
		dev.slots[0][0] = byte('a' + i)
		sn, err := s.Save(toks[:i+1], 0, tab.Blocks(), 1, 0, Point)
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, sn)
	}
	if dev.saves != 0 || s.DeviceSlots() != 3 || s.Bytes() != 0 {
		t.Fatalf("three snapshots in three slots: %d waits, %d slots, %d host bytes", dev.saves, s.DeviceSlots(), s.Bytes())
	}
	// A fourth moves the least recently used (the first) to host memory.
	dev.slots[0][0] = 'd'
	toks[3] = 4
	d, _ := s.Save(toks[:4], 0, tab.Blocks(), 1, 0, Tip)
	if snaps[0].OnDevice() || snaps[0].Bytes() != 8 || !d.OnDevice() || dev.saves != 1 {
		t.Fatalf("after a fourth: first on device %v (%d host bytes), fourth on device %v, %d waits", snaps[0].OnDevice(), snaps[0].Bytes(), d.OnDevice(), dev.saves)
	}
	for i, sn := range append(snaps, d) {
		s.Restore(sn, 0)
		if dev.slots[0][0] != byte('a'+i) {
			t.Fatalf("snapshot %d restored %q", i, dev.slots[0][0])
		}
	}
	// Offload frees slots, least recently used first; the host budget (two
	// states) evicts the oldest host copy beyond it.
	s.Offload(3)
	if s.FreeSlots() != 3 || s.Len() != 2 || len(evicted) != 2 || s.Bytes() != 16 {
		t.Fatalf("after Offload(3): %d free slots, %d snapshots, evicted %v, %d bytes", s.FreeSlots(), s.Len(), evicted, s.Bytes())
	}
	s.Restore(d, 0)
	if dev.slots[0][0] != 'd' {
		t.Fatalf("offloaded snapshot restored %q", dev.slots[0][0])
	}
	s.Clear()
	tab.Release(a)
	checkRefs(t, a)
	if s.FreeSlots() != 3 {
		t.Fatalf("%d free slots after Clear", s.FreeSlots())
	}
}

// TestSnapshotsIntervals: a snapshot saved with every slot taken takes the
// slot of the least recently used Interval snapshot (before a less
// recently used point's), which is dropped without a wait for the device
// or a copy to a slower tier; with no Interval snapshot on the device the
// least recently used one moves to host memory as before; an Interval
// snapshot dropped for host memory's budget goes to no slower tier either.
func TestSnapshotsIntervals(t *testing.T) {
	a := NewAllocator(16)
	dev := newSlotDevice(3, 8) // slot 0 runs the sequence, 1-2 are spare
	var evicted []uint64
	s := NewSnapshots(a, 4, dev, []int{1, 2}, 8)
	s.Evicted = func(sn *Snapshot) { evicted = append(evicted, sn.ID) }
	tab := NewTable(4)
	if _, err := tab.Reserve(a, 0, 16); err != nil {
		t.Fatal(err)
	}
	toks := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	save := func(n int, kind SnapshotKind) *Snapshot {
		t.Helper()
		dev.slots[0][0] = byte(n)
		sn, err := s.Save(toks[:n], 0, tab.Blocks(), 1, 0, kind)
		if err != nil {
			t.Fatal(err)
		}
		return sn
	}
	check := func(what string, saves, host int, on ...*Snapshot) {
		t.Helper()
		for _, sn := range on {
			if !sn.OnDevice() {
				t.Fatalf("%s: the snapshot of %d tokens is not on the device", what, len(sn.Tokens))
			}
		}
		if s.Len() != len(on)+host || dev.saves != saves {
			t.Fatalf("%s: %d snapshots, %d waits; want %d, %d", what, s.Len(), dev.saves, len(on)+host, saves)
		}
	}
	p := save(1, Point)
	i1 := save(4, Interval)
	i2 := save(8, Interval)
	check("a point and two intervals in two slots", 0, 0, p, i2)
	tip := save(10, Tip)
	check("then a tip", 0, 0, p, tip)
	i3 := save(12, Interval)
	check("then an interval with none on the device", 1, 1, tip, i3)
	if p.Bytes() != 8 || i1.OnDevice() || i2.OnDevice() || len(evicted) != 0 {
		t.Fatalf("the point's host bytes %d, intervals dropped on device %v %v, evicted %v", p.Bytes(), i1.OnDevice(), i2.OnDevice(), evicted)
	}
	if sn := s.Find(toks, 11); sn != tip {
		t.Fatalf("the longest snapshot within 11 tokens: %v, want the tip", sn)
	}
	s.Restore(p, 0)
	if dev.slots[0][0] != 1 {
		t.Fatalf("the point restored %d", dev.slots[0][0])
	}
	// Host memory holds one state: the point and the tip leave it for
	// room through the slower tier, the interval without.
	s.Offload(2)
	p2 := save(2, Point)
	s.Offload(2)
	if want := []uint64{p.ID, tip.ID}; !slices.Equal(evicted, want) || s.Len() != 1 || p2.Bytes() != 8 {
		t.Fatalf("evicted %v, want %v (point, tip); %d snapshots left", evicted, want, s.Len())
	}
	s.Clear()
	tab.Release(a)
	checkRefs(t, a)
}

// BenchmarkPrefixMatch: the lookup of a follow-up's 100K-token prompt whose
// history is cached.
func BenchmarkPrefixMatch(b *testing.B) {
	const n, bs = 100_000, 16
	a := NewAllocator(n/bs + 8)
	c := NewPrefixCache(a, bs)
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := make([]int32, n)
	for i := range tokens {
		tokens[i] = int32(rng.IntN(150_000))
	}
	tab := NewTable(bs)
	if _, err := tab.Reserve(a, 0, n); err != nil {
		b.Fatal(err)
	}
	var ch Chain
	c.Insert(&ch, tokens, tab.Blocks())
	b.ResetTimer()
	for range b.N {
		if blocks, _ := c.Match(tokens); len(blocks) != n/bs {
			b.Fatalf("%d blocks matched", len(blocks))
		}
	}
}

// BenchmarkSnapshotFind: the lookup of a follow-up's 100K-token prompt
// among a conversation's snapshots (its last turns' message starts and
// ends) and 24 other conversations sharing its 2K-token system prompt.
func BenchmarkSnapshotFind(b *testing.B) {
	const n = 100_000
	rng := rand.New(rand.NewPCG(1, 2))
	conv := make([]int32, n+64)
	for i := range conv {
		conv[i] = int32(rng.IntN(150_000))
	}
	a := NewAllocator(n/16 + 64)
	s := NewSnapshots(a, 16, newSlotDevice(1, 8), nil, 1<<30)
	tab := NewTable(16)
	if _, err := tab.Reserve(a, 0, n+64); err != nil {
		b.Fatal(err)
	}
	for i, l := range []int{n - 3000, n - 2990, n - 2000, n - 1990, n - 1000, n - 990, n - 40, n} {
		if _, err := s.Save(conv[:l], 0, tab.Blocks(), uint64(1+i/2), 0, Point); err != nil {
			b.Fatal(err)
		}
	}
	for i := range 24 {
		other := append(slices.Clone(conv[:2000]), int32(i), 7, 7)
		if _, err := s.Save(other, 0, tab.Blocks(), uint64(100+i), 0, Tip); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for range b.N {
		if sn := s.Find(conv, n+63); len(sn.Tokens) != n {
			b.Fatalf("found %d tokens", len(sn.Tokens))
		}
	}
}

// TestSnapshotsReclaimShared: snapshots that hold the same blocks (two
// points of a sequence inside one block) free none alone, but the blocks
// are the snapshots' only: the allocator gets them back by evicting both,
// and never evicts a snapshot whose blocks a table also holds.
func TestSnapshotsReclaimShared(t *testing.T) {
	a := NewAllocator(3)
	s := NewSnapshots(a, 4, newSlotDevice(1, 10), nil, 100)
	tab := NewTable(4)
	if _, err := tab.Reserve(a, 0, 8); err != nil {
		t.Fatal(err)
	}
	toks := []int32{1, 2, 3, 4, 5, 6, 7, 8}
	s.Save(toks[:5], 0, tab.Blocks(), 1, 0, Point)
	s.Save(toks[:7], 0, tab.Blocks(), 1, 0, Tip)
	kept := NewTable(4)
	if _, err := kept.Reserve(a, 0, 4); err != nil { // the third block
		t.Fatal(err)
	}
	s.Save([]int32{9, 9, 9}, 0, kept.Blocks(), 2, 0, Tip)
	tab.Release(a)
	other := NewTable(4)
	if _, err := other.Reserve(a, 0, 8); err != nil {
		t.Fatalf("two blocks held only by two snapshots not reclaimed: %v (%d snapshots left)", err, s.Len())
	}
	if s.Len() != 1 || s.Find([]int32{9, 9, 9, 1}, 4) == nil {
		t.Fatalf("%d snapshots left; the one whose block a table holds must stay", s.Len())
	}
	if _, err := other.Reserve(a, 0, 12); err == nil {
		t.Fatal("a block a table holds was taken")
	}
	other.Release(a)
	kept.Release(a)
	s.Clear()
	checkRefs(t, a)
}
