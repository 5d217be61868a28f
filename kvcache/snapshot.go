package kvcache

import (
	"container/list"
	"slices"
)

// Snapshot is the state of a hybrid model's sequence after exactly Tokens:
// the DeltaNet conv and recurrent state (State, as the model saves a slot)
// and the KV blocks of the attention layers covering len(Tokens) tokens (the
// last one possibly partly filled).
type Snapshot struct {
	ID     uint64
	Group  uint64 // the turn of a conversation that saved it (see Snapshots.DropGroup)
	Tokens []int32
	State  []byte
	Blocks []int32

	elem *list.Element
}

// Snapshots stores state snapshots in host memory under a byte budget (the
// sum of len(State)), dropping least recently used ones to stay within it
// and when the Allocator needs their blocks. A snapshot holds one reference
// on each of its blocks.
type Snapshots struct {
	a         *Allocator
	blockSize int
	budget    int64
	bytes     int64
	nextID    uint64
	lru       list.List     // *Snapshot, most recently used first
	held      map[int32]int // references the snapshots hold, per block
}

// NewSnapshots returns an empty store of at most budget bytes of state over
// a's blocks, and registers it as a reclaimer of a.
func NewSnapshots(a *Allocator, blockSize int, budget int64) *Snapshots {
	s := &Snapshots{a: a, blockSize: blockSize, budget: budget, held: map[int32]int{}}
	a.AddReclaimer(s)
	return s
}

// Find returns the longest snapshot whose tokens are a prefix of tokens of
// at most maxLen tokens, or nil, and marks it used. The caller copies what it
// needs (Table.Adopt of its blocks, the model's RestoreSlot of its state)
// before anything else can change the store.
func (s *Snapshots) Find(tokens []int32, maxLen int) *Snapshot {
	maxLen = min(maxLen, len(tokens))
	var best *Snapshot
	for el := s.lru.Front(); el != nil; el = el.Next() {
		sn := el.Value.(*Snapshot)
		n := len(sn.Tokens)
		if n > maxLen || (best != nil && n <= len(best.Tokens)) {
			continue
		}
		if slices.Equal(sn.Tokens, tokens[:n]) {
			best = sn
		}
	}
	if best != nil {
		s.lru.MoveToFront(best.elem)
	}
	return best
}

// Save stores a snapshot of state after tokens, taking ownership of state
// and adding a reference to the blocks covering len(tokens) tokens. A
// snapshot of the same tokens is replaced. Older snapshots are dropped, least
// recently used first, to keep within the budget; ErrOverBudget when state
// alone exceeds it.
func (s *Snapshots) Save(tokens []int32, state []byte, blocks []int32, group uint64) (*Snapshot, error) {
	if int64(len(state)) > s.budget {
		return nil, ErrOverBudget
	}
	for el := s.lru.Front(); el != nil; el = el.Next() {
		if sn := el.Value.(*Snapshot); slices.Equal(sn.Tokens, tokens) {
			s.drop(sn)
			break
		}
	}
	for s.bytes+int64(len(state)) > s.budget {
		s.drop(s.lru.Back().Value.(*Snapshot))
	}
	s.nextID++
	nb := (len(tokens) + s.blockSize - 1) / s.blockSize
	sn := &Snapshot{ID: s.nextID, Group: group, Tokens: slices.Clone(tokens), State: state, Blocks: slices.Clone(blocks[:nb])}
	for _, b := range sn.Blocks {
		s.a.Retain(b)
		s.held[b]++
	}
	s.bytes += int64(len(state))
	sn.elem = s.lru.PushFront(sn)
	return sn, nil
}

// DropGroup drops every snapshot of group except the one whose ID is keep
// (0: none). This is parent eviction: a conversation that moves on drops the
// snapshots it resumed from and its own earlier ones, so that it holds one
// state, not one per turn.
func (s *Snapshots) DropGroup(group, keep uint64) {
	for el := s.lru.Front(); el != nil; {
		next := el.Next()
		if sn := el.Value.(*Snapshot); sn.Group == group && sn.ID != keep {
			s.drop(sn)
		}
		el = next
	}
}

// Reclaim implements Reclaimer: it drops the least recently used snapshot
// that holds a block no one else references, so that dropping it frees
// memory.
func (s *Snapshots) Reclaim() bool {
	for el := s.lru.Back(); el != nil; el = el.Prev() {
		sn := el.Value.(*Snapshot)
		if slices.ContainsFunc(sn.Blocks, func(b int32) bool { return s.a.Refs(b) == 1 }) {
			s.drop(sn)
			return true
		}
	}
	return false
}

func (s *Snapshots) drop(sn *Snapshot) {
	s.lru.Remove(sn.elem)
	s.bytes -= int64(len(sn.State))
	for _, b := range sn.Blocks {
		s.a.Release(b)
		if s.held[b]--; s.held[b] == 0 {
			delete(s.held, b)
		}
	}
	sn.Blocks = nil
}

// Clear drops every snapshot.
func (s *Snapshots) Clear() {
	for s.lru.Len() > 0 {
		s.drop(s.lru.Back().Value.(*Snapshot))
	}
}

// Holders calls f for each block reference the store holds (for accounting
// checks).
func (s *Snapshots) Holders(f func(block int32)) {
	for el := s.lru.Front(); el != nil; el = el.Next() {
		for _, b := range el.Value.(*Snapshot).Blocks {
			f(b)
		}
	}
}

// Len returns the number of snapshots held.
func (s *Snapshots) Len() int { return s.lru.Len() }

// Bytes returns the state bytes held.
func (s *Snapshots) Bytes() int64 { return s.bytes }

// Blocks returns how many distinct KV blocks the snapshots hold (a
// conversation's snapshots share most of theirs).
func (s *Snapshots) Blocks() int { return len(s.held) }

// Budget returns the byte budget.
func (s *Snapshots) Budget() int64 { return s.budget }
