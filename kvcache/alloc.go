// Package kvcache manages the memory that a sequence's past occupies: the
// blocks of a paged KV cache (an Allocator with reference counts and per
// sequence block Tables with copy-on-write), a PrefixCache that keeps the full
// blocks of finished and running sequences for later requests with the same
// token prefix, a Snapshots store of hybrid models' recurrent state, in spare
// device slots and host memory, keyed by the exact token prefix it
// corresponds to, and a Store that keeps both off the device (host memory,
// then a bounded directory) for conversations the device let go.
//
// Caches hold references on the blocks they keep and give them back, least
// recently used first, when the Allocator runs out of free blocks.
//
// Except for the Store, none of the types is safe for concurrent use: one
// goroutine (the engine's scheduler) owns them.
package kvcache

import (
	"errors"
	"fmt"
)

var (
	// ErrNoBlocks: every block is referenced by a sequence and no cache
	// holds one it could give back.
	ErrNoBlocks = errors.New("kvcache: out of KV blocks")
	// ErrOverBudget: a snapshot is larger than the whole snapshot budget.
	ErrOverBudget = errors.New("kvcache: snapshot larger than its budget")
)

// Reclaimer is a cache that holds block references it can give back.
type Reclaimer interface {
	// Reclaim drops the cache's least recently used entry that it may drop,
	// releasing its block references, and reports whether it dropped one.
	// Dropping an entry does not free a block that another holder still
	// references.
	Reclaim() bool
}

// Allocator hands out the blocks 0..n-1 of a paged KV cache. A block is free
// (reference count 0) or held by one or more holders: sequences' Tables and
// caches. A block shared by several holders must not be written: a Table
// copies it first (see Table.Reserve).
type Allocator struct {
	refs       []int32
	free       []int32 // stack of free blocks
	reclaimers []Reclaimer
}

// NewAllocator returns an allocator of n blocks, all free.
func NewAllocator(n int) *Allocator {
	if n <= 0 {
		panic(fmt.Sprintf("kvcache: allocator of %d blocks", n))
	}
	a := &Allocator{refs: make([]int32, n), free: make([]int32, n)}
	for i := range a.free {
		// Lowest block on top, so that allocation order is easy to follow in tests.
		a.free[i] = int32(n - 1 - i)
	}
	return a
}

// AddReclaimer registers a cache that Alloc asks for blocks, in registration
// order, when no block is free.
func (a *Allocator) AddReclaimer(r Reclaimer) { a.reclaimers = append(a.reclaimers, r) }

// Alloc returns a block with reference count 1. When none is free it asks the
// reclaimers to drop entries until one is; ErrNoBlocks when they cannot.
func (a *Allocator) Alloc() (int32, error) {
	for len(a.free) == 0 {
		if !a.reclaim() {
			return -1, ErrNoBlocks
		}
	}
	b := a.free[len(a.free)-1]
	a.free = a.free[:len(a.free)-1]
	a.refs[b] = 1
	return b, nil
}

func (a *Allocator) reclaim() bool {
	for _, r := range a.reclaimers {
		if r.Reclaim() {
			return true
		}
	}
	return false
}

// Retain adds a reference to a held block.
func (a *Allocator) Retain(b int32) {
	if a.refs[b] <= 0 {
		panic(fmt.Sprintf("kvcache: retain of free block %d", b))
	}
	a.refs[b]++
}

// Release drops a reference; the block is free when none is left.
func (a *Allocator) Release(b int32) {
	switch a.refs[b] {
	case 0:
		panic(fmt.Sprintf("kvcache: release of free block %d", b))
	case 1:
		a.refs[b] = 0
		a.free = append(a.free, b)
	default:
		a.refs[b]--
	}
}

// Refs returns the reference count of block b.
func (a *Allocator) Refs(b int32) int { return int(a.refs[b]) }

// Blocks returns the number of blocks.
func (a *Allocator) Blocks() int { return len(a.refs) }

// Free returns the number of free blocks.
func (a *Allocator) Free() int { return len(a.free) }

// Used returns the number of held blocks.
func (a *Allocator) Used() int { return len(a.refs) - len(a.free) }
