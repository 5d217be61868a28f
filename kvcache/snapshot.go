package kvcache

import (
	"container/list"
	"slices"
	"time"
)

// SnapshotKind says what a snapshot is kept for.
type SnapshotKind uint8

const (
	// Point is a place where requests sharing a prefix go different ways
	// (the start of a message, the last block boundary before a prompt's
	// end): kept for other requests, which may diverge after it.
	Point SnapshotKind = iota
	// Tip is where a request ended (its answer's end): what its next turn
	// resumes from.
	Tip
	// Interval is a multiple of the engine's snapshot interval inside a
	// long prompt: kept while a spare device slot holds it, for a request
	// that shares a long prefix and diverges past it. A new snapshot
	// takes the slot of the least recently used one rather than wait for
	// a copy of an older snapshot to host memory, and one dropped for
	// room goes to no slower tier (Evicted): a 256K-token prompt saves
	// 256 of them, each as large as the model's state (~75 MB for
	// Qwen3-Next), and copying those off the device while the prompt's
	// passes wait cost more than recomputing 1024 tokens.
	Interval
)

// Snapshot is the state of a hybrid model's sequence after exactly Tokens:
// the DeltaNet conv and recurrent state (in a spare state slot of the
// device, in host memory, or both) and the KV blocks of the attention
// layers covering len(Tokens) tokens (the last one possibly partly filled).
type Snapshot struct {
	ID     uint64
	Group  uint64 // the request that saved it (see Snapshots.Parent)
	Kind   SnapshotKind
	Tokens []int32
	Blocks []int32
	// Stored is set by the store's user once a Store holds the snapshot.
	Stored bool
	// Used is when it was saved or last found.
	Used time.Time

	slot  int    // device slot holding the state; -1: none
	state []byte // host copy; nil: none
	elem  *list.Element
}

// OnDevice reports whether the state is in a device slot.
func (sn *Snapshot) OnDevice() bool { return sn.slot >= 0 }

// Bytes returns the host memory the snapshot's state takes.
func (sn *Snapshot) Bytes() int { return len(sn.state) }

// StateDevice holds the recurrent state of a model's sequences in numbered
// slots (a model on its backend). CopySlot is queued in order with the
// model's passes; SaveSlot waits for them.
type StateDevice interface {
	SlotBytes() int
	CopySlot(dst, src int)
	SaveSlot(slot int, dst []byte) error
	RestoreSlot(slot int, src []byte)
}

// Snapshots stores state snapshots: in spare device slots while they are
// recent (saving and restoring is then a copy on the device, queued with
// the passes), moved to host memory (least recently used first) when the
// slots run out, within a byte budget there, and dropped (least recently
// used first) beyond it and when the Allocator needs their blocks. A
// snapshot holds one reference on each of its blocks.
//
// Each snapshot belongs to a group (the request that saved it), and each
// group to the group it resumed from, so that a conversation can drop what
// it has moved past (see Parent and DropGroup).
type Snapshots struct {
	a         *Allocator
	blockSize int
	dev       StateDevice
	free      []int // spare device slots not holding a snapshot
	slots     int   // spare device slots in all
	budget    int64
	bytes     int64
	nextID    uint64
	lru       list.List     // *Snapshot, most recently used first
	held      map[int32]int // references the snapshots hold, per block
	groups    map[uint64]*snapGroup

	// Evicted, when set, is called with a snapshot about to be dropped for
	// room (host memory, blocks), while its state and blocks are still
	// valid: a slower tier may keep it.
	Evicted func(*Snapshot)
}

type snapGroup struct {
	parent   uint64
	children int // groups whose parent this is
	snaps    int
}

// NewSnapshots returns an empty store over a's blocks of blockSize tokens
// and dev's state, with slots as its spare device slots (none: host memory
// only) and at most budget bytes of state in host memory, and registers it
// as a reclaimer of a.
func NewSnapshots(a *Allocator, blockSize int, dev StateDevice, slots []int, budget int64) *Snapshots {
	s := &Snapshots{a: a, blockSize: blockSize, dev: dev, free: slices.Clone(slots), slots: len(slots), budget: budget,
		held: map[int32]int{}, groups: map[uint64]*snapGroup{}}
	a.AddReclaimer(s)
	return s
}

// Find returns the longest snapshot whose tokens are a prefix of tokens of
// at most maxLen tokens, or nil, and marks it used. The caller adopts its
// blocks (Table.Adopt) and restores its state (Restore) before anything else
// can change the store.
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
		best.Used = time.Now()
	}
	return best
}

// State returns sn's state in host memory: its host copy, or a copy read
// from its device slot (which waits for the device).
func (s *Snapshots) State(sn *Snapshot) ([]byte, error) {
	if sn.state != nil {
		return sn.state, nil
	}
	state := make([]byte, s.dev.SlotBytes())
	return state, s.dev.SaveSlot(sn.slot, state)
}

// Restore writes sn's state (a snapshot the store holds) into the device
// slot slot.
func (s *Snapshots) Restore(sn *Snapshot, slot int) {
	if sn.slot >= 0 {
		s.dev.CopySlot(slot, sn.slot)
	} else {
		s.dev.RestoreSlot(slot, sn.state)
	}
}

// Save stores a snapshot of the state in device slot from after tokens,
// adding a reference to the blocks covering len(tokens) tokens, for group
// (which resumed from parent; 0: none). A snapshot of the same tokens is
// replaced. The state goes to a spare device slot (the least recently used
// Interval snapshot's, when none is free), or to host memory when there is
// none; older snapshots make room, least recently used first.
// ErrOverBudget when the state cannot be kept at all.
func (s *Snapshots) Save(tokens []int32, from int, blocks []int32, group, parent uint64, kind SnapshotKind) (*Snapshot, error) {
	for el := s.lru.Front(); el != nil; el = el.Next() {
		if sn := el.Value.(*Snapshot); slices.Equal(sn.Tokens, tokens) {
			s.drop(sn)
			break
		}
	}
	sn := &Snapshot{Kind: kind, slot: -1, Used: time.Now()}
	if s.slots > 0 {
		if len(s.free) == 0 && !s.recycle() {
			s.offload(s.lru.Back())
		}
		if len(s.free) > 0 {
			sn.slot = s.free[len(s.free)-1]
			s.free = s.free[:len(s.free)-1]
			s.dev.CopySlot(sn.slot, from)
		}
	}
	if sn.slot < 0 {
		n := int64(s.dev.SlotBytes())
		if n > s.budget || !s.makeRoom(n) {
			return nil, ErrOverBudget
		}
		sn.state = make([]byte, n)
		if err := s.dev.SaveSlot(from, sn.state); err != nil {
			return nil, err
		}
		s.bytes += n
	}
	s.nextID++
	sn.ID = s.nextID
	sn.Tokens = slices.Clone(tokens)
	nb := (len(tokens) + s.blockSize - 1) / s.blockSize
	sn.Blocks = slices.Clone(blocks[:nb])
	for _, b := range sn.Blocks {
		s.a.Retain(b)
		s.held[b]++
	}
	s.join(sn, group, parent)
	sn.elem = s.lru.PushFront(sn)
	return sn, nil
}

// Adopt moves sn into group (which resumed from parent): a request that
// resumed from a snapshot keeps it as its own, so that dropping the group
// that saved it (DropGroup, as the conversation moves on) leaves it.
func (s *Snapshots) Adopt(sn *Snapshot, group, parent uint64) {
	if sn.elem == nil || sn.Group == group {
		return
	}
	s.leave(sn)
	s.join(sn, group, parent)
}

// join counts sn in group, made (resuming from parent) on its first one.
func (s *Snapshots) join(sn *Snapshot, group, parent uint64) {
	g := s.groups[group]
	if g == nil {
		g = &snapGroup{parent: parent}
		s.groups[group] = g
		if p := s.groups[parent]; p != nil {
			p.children++
		}
	}
	g.snaps++
	sn.Group = group
}

// leave stops counting sn in its group, which goes with its last one.
func (s *Snapshots) leave(sn *Snapshot) {
	if g := s.groups[sn.Group]; g != nil {
		if g.snaps--; g.snaps == 0 {
			delete(s.groups, sn.Group)
			if p := s.groups[g.parent]; p != nil {
				p.children--
			}
		}
	}
}

// offload moves the least recently used snapshot at or before el (in LRU
// order, walking to the front) that holds a device slot to host memory,
// freeing its slot; a snapshot that finds no room there is dropped.
func (s *Snapshots) offload(el *list.Element) {
	for ; el != nil; el = el.Prev() {
		sn := el.Value.(*Snapshot)
		if sn.slot < 0 {
			continue
		}
		if sn.state == nil {
			n := int64(s.dev.SlotBytes())
			if n > s.budget || !s.makeRoom(n) {
				s.evict(sn)
				return
			}
			state := make([]byte, n)
			if err := s.dev.SaveSlot(sn.slot, state); err != nil {
				s.evict(sn)
				return
			}
			sn.state = state
			s.bytes += n
		}
		s.free = append(s.free, sn.slot)
		sn.slot = -1
		return
	}
}

// recycle drops the least recently used Interval snapshot in a device
// slot, freeing the slot, and reports whether there was one.
func (s *Snapshots) recycle() bool {
	for el := s.lru.Back(); el != nil; el = el.Prev() {
		if sn := el.Value.(*Snapshot); sn.Kind == Interval && sn.slot >= 0 {
			s.drop(sn)
			return true
		}
	}
	return false
}

// Offload moves least recently used snapshots from device slots to host
// memory until at least n spare slots are free: the scheduler calls it when
// idle, so that the snapshots of the next request's prefill are device
// copies, not waits for the device.
func (s *Snapshots) Offload(n int) {
	for len(s.free) < min(n, s.slots) && s.lru.Len() > 0 {
		before := len(s.free)
		s.offload(s.lru.Back())
		if len(s.free) == before {
			return
		}
	}
}

// makeRoom frees host memory for n more bytes, least recently used state
// first: a snapshot also in a device slot loses its host copy, others are
// evicted. False when it cannot.
func (s *Snapshots) makeRoom(n int64) bool {
	for el := s.lru.Back(); s.bytes+n > s.budget && el != nil; {
		prev := el.Prev()
		sn := el.Value.(*Snapshot)
		switch {
		case sn.state == nil:
		case sn.slot >= 0:
			s.bytes -= int64(len(sn.state))
			sn.state = nil
		default:
			s.evict(sn)
		}
		el = prev
	}
	return s.bytes+n <= s.budget
}

// Parent returns the group that group resumed from (0: none or unknown)
// and how many groups resumed from group.
func (s *Snapshots) Parent(group uint64) (parent uint64, children int) {
	if g := s.groups[group]; g != nil {
		return g.parent, g.children
	}
	return 0, 0
}

// DropGroup drops every snapshot of group (parent eviction: a conversation
// two turns on no longer needs the places where that turn diverged).
func (s *Snapshots) DropGroup(group uint64) {
	for el := s.lru.Front(); el != nil; {
		next := el.Next()
		if sn := el.Value.(*Snapshot); sn.Group == group {
			s.drop(sn)
		}
		el = next
	}
}

// Reclaim implements Reclaimer: it drops the least recently used snapshot
// that holds a block no one else references, so that dropping it frees
// memory; failing that, the least recently used one holding a block that
// only snapshots reference. Points of one sequence inside the same last
// block hold the same blocks, so neither frees one alone, and snapshots
// made so filled a 160-block cache in a test of 1,000 conversations (all
// but a few blocks, nothing running: "the sequence does not fit").
func (s *Snapshots) Reclaim() bool {
	for _, only := range []func(b int32) bool{
		func(b int32) bool { return s.a.Refs(b) == 1 },
		func(b int32) bool { return s.a.Refs(b) == s.held[b] },
	} {
		for el := s.lru.Back(); el != nil; el = el.Prev() {
			if sn := el.Value.(*Snapshot); slices.ContainsFunc(sn.Blocks, only) {
				s.evict(sn)
				return true
			}
		}
	}
	return false
}

// evict drops a snapshot for room, offering it to Evicted first.
func (s *Snapshots) evict(sn *Snapshot) {
	if s.Evicted != nil && sn.Kind != Interval {
		s.Evicted(sn)
	}
	s.drop(sn)
}

func (s *Snapshots) drop(sn *Snapshot) {
	s.lru.Remove(sn.elem)
	sn.elem = nil
	s.bytes -= int64(len(sn.state))
	sn.state = nil
	if sn.slot >= 0 {
		s.free = append(s.free, sn.slot)
		sn.slot = -1
	}
	for _, b := range sn.Blocks {
		s.a.Release(b)
		if s.held[b]--; s.held[b] == 0 {
			delete(s.held, b)
		}
	}
	sn.Blocks = nil
	s.leave(sn)
}

// Clear drops every snapshot.
func (s *Snapshots) Clear() {
	for s.lru.Len() > 0 {
		s.drop(s.lru.Back().Value.(*Snapshot))
	}
}

// Each calls f for each snapshot, most recently used first.
func (s *Snapshots) Each(f func(*Snapshot)) {
	for el := s.lru.Front(); el != nil; el = el.Next() {
		f(el.Value.(*Snapshot))
	}
}

// Holders calls f for each block reference the store holds (for accounting
// checks).
func (s *Snapshots) Holders(f func(block int32)) {
	s.Each(func(sn *Snapshot) {
		for _, b := range sn.Blocks {
			f(b)
		}
	})
}

// Len returns the number of snapshots held.
func (s *Snapshots) Len() int { return s.lru.Len() }

// Bytes returns the state bytes held in host memory.
func (s *Snapshots) Bytes() int64 { return s.bytes }

// FreeSlots returns the spare device slots holding no snapshot.
func (s *Snapshots) FreeSlots() int { return len(s.free) }

// DeviceSlots returns the spare device slots holding a snapshot.
func (s *Snapshots) DeviceSlots() int { return s.slots - len(s.free) }

// Blocks returns how many distinct KV blocks the snapshots hold (a
// conversation's snapshots share most of theirs).
func (s *Snapshots) Blocks() int { return len(s.held) }

// Budget returns the byte budget of host memory.
func (s *Snapshots) Budget() int64 { return s.budget }
