package kvcache

// Copy asks the caller to copy KV block Src to Dst (in every layer) before
// the step that writes Dst.
type Copy struct{ Dst, Src int32 }

// Table is one sequence's block table: logical block i of the sequence (its
// tokens i*BlockSize ... (i+1)*BlockSize-1) lives in physical block Blocks()[i].
// The table holds one reference on each of its blocks.
type Table struct {
	blockSize int
	blocks    []int32
}

// NewTable returns an empty table for blocks of blockSize tokens.
func NewTable(blockSize int) *Table { return &Table{blockSize: blockSize} }

// Blocks returns the physical blocks; the slice is valid until the next call
// that changes the table.
func (t *Table) Blocks() []int32 { return t.blocks }

// Adopt appends blocks that another holder (a cache) already computed,
// adding a reference to each. They must cover whole logical blocks that the
// table does not have yet; the last may be partly filled (a later write to it
// is copied first, see Reserve).
func (t *Table) Adopt(a *Allocator, blocks []int32) {
	for _, b := range blocks {
		a.Retain(b)
		t.blocks = append(t.blocks, b)
	}
}

// Reserve makes the table ready for a step that writes tokens pos ...
// pos+n-1: it allocates the blocks needed to cover pos+n tokens and replaces
// every block of that range that is shared with another holder by a private
// copy. It returns the copies the caller must perform before the step. On
// error (ErrNoBlocks) the table is left as it was.
func (t *Table) Reserve(a *Allocator, pos, n int) ([]Copy, error) {
	if n <= 0 {
		return nil, nil
	}
	bs := t.blockSize
	have := len(t.blocks)
	need := (pos + n + bs - 1) / bs
	var copies []Copy
	type swap struct {
		i   int
		old int32
	}
	var swapped []swap
	rollback := func() {
		for _, s := range swapped {
			a.Release(t.blocks[s.i])
			t.blocks[s.i] = s.old
		}
		for _, b := range t.blocks[have:] {
			a.Release(b)
		}
		t.blocks = t.blocks[:have]
	}
	for i := pos / bs; i < have && i < need; i++ {
		if a.Refs(t.blocks[i]) <= 1 {
			continue
		}
		nb, err := a.Alloc()
		if err != nil {
			rollback()
			return nil, err
		}
		swapped = append(swapped, swap{i, t.blocks[i]})
		copies = append(copies, Copy{Dst: nb, Src: t.blocks[i]})
		t.blocks[i] = nb
	}
	for len(t.blocks) < need {
		b, err := a.Alloc()
		if err != nil {
			rollback()
			return nil, err
		}
		t.blocks = append(t.blocks, b)
	}
	for _, s := range swapped {
		a.Release(s.old)
	}
	return copies, nil
}

// Release drops the table's references and empties it.
func (t *Table) Release(a *Allocator) {
	for _, b := range t.blocks {
		a.Release(b)
	}
	t.blocks = t.blocks[:0]
}
