package kvcache

import (
	"container/list"
	"slices"
	"time"
)

// PrefixCache keeps full KV blocks for reuse by later sequences with the same
// token prefix. Each cached block is keyed by a hash chain: the key of logical
// block i hashes the key of block i-1 and the block's tokens, so a key names
// the whole prefix up to the block's end. The cache holds one reference on
// each cached block. Reclaim drops least recently used entries that no
// sequence shares, leaves of the chain first (no cached block extends
// them), and an entry only with everything below it, so that a cached
// chain never has holes.
type PrefixCache struct {
	a         *Allocator
	blockSize int
	entries   map[uint64]*prefixEntry
	lru       list.List // *prefixEntry, most recently used first

	// Evicted, when set, is called with the prefix (its tokens and blocks)
	// that a leaf ends before Reclaim drops the leaf, unless the prefix was
	// marked stored (MarkStored): a slower tier may keep it. The prefix is
	// marked stored then.
	Evicted func(tokens, blocks []int32)
}

type prefixEntry struct {
	key, parent uint64
	tokens      []int32
	block       int32
	children    int
	stored      bool // a slower tier holds the prefix it ends
	used        time.Time
	elem        *list.Element
}

// Chain is a sequence's position in the prefix cache: how many of its full
// blocks it has offered to the cache (Insert) and the key of the last one.
type Chain struct {
	n   int
	key uint64
}

const chainRoot uint64 = 0xcbf29ce484222325

// chainKey hashes a block's tokens onto its parent's key (the keys only
// find candidates; Match compares the tokens).
func chainKey(parent uint64, tokens []int32) uint64 {
	h := prefixHash(parent ^ uint64(len(tokens)))
	for _, t := range tokens {
		h = h.add(t)
	}
	return mix64(uint64(h))
}

// prefixHash is a running hash of tokens: one multiply and shift per token.
type prefixHash uint64

func (h prefixHash) add(t int32) prefixHash {
	x := (uint64(h) ^ uint64(uint32(t))) * 0x9e3779b97f4a7c15
	return prefixHash(x ^ x>>29)
}

// key names the prefix of n tokens the hash has consumed.
func (h prefixHash) key(n int) uint64 { return mix64(uint64(h) ^ uint64(n)*0x2545f4914f6cdd1d) }

// mix64 spreads the bits of a hash (MurmurHash3's finalizer).
func mix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// NewPrefixCache returns an empty cache over a's blocks of blockSize tokens
// and registers it as a reclaimer of a.
func NewPrefixCache(a *Allocator, blockSize int) *PrefixCache {
	c := &PrefixCache{a: a, blockSize: blockSize, entries: map[uint64]*prefixEntry{}}
	a.AddReclaimer(c)
	return c
}

// Match returns the cached blocks of the longest prefix of tokens made of
// full blocks, and the Chain a sequence starting with these blocks continues
// from. The caller adopts the blocks (Table.Adopt) before anything else can
// allocate.
func (c *PrefixCache) Match(tokens []int32) ([]int32, Chain) {
	var blocks []int32
	ch := Chain{key: chainRoot}
	bs := c.blockSize
	now := time.Now()
	for (ch.n+1)*bs <= len(tokens) {
		blk := tokens[ch.n*bs : (ch.n+1)*bs]
		k := chainKey(ch.key, blk)
		e, ok := c.entries[k]
		if !ok || e.parent != ch.key || !slices.Equal(e.tokens, blk) {
			break
		}
		c.lru.MoveToFront(e.elem)
		e.used = now
		blocks = append(blocks, e.block)
		ch = Chain{n: ch.n + 1, key: k}
	}
	return blocks, ch
}

// Insert offers the full blocks of a sequence that ch has not covered yet:
// tokens are the sequence's tokens whose KV is computed, blocks its block
// table. A block whose prefix is cached already (computed by another
// sequence) is skipped; the sequence keeps its own copy.
func (c *PrefixCache) Insert(ch *Chain, tokens []int32, blocks []int32) {
	bs := c.blockSize
	if ch.n > 0 {
		if _, ok := c.entries[ch.key]; !ok {
			// The chain's last entry was dropped (it was another sequence's
			// copy of the same tokens): walk again from the root so that what
			// this sequence adds hangs off a cached parent.
			*ch = Chain{key: chainRoot}
		}
	}
	if ch.key == 0 {
		ch.key = chainRoot
	}
	now := time.Now()
	for (ch.n+1)*bs <= len(tokens) && ch.n < len(blocks) {
		blk := tokens[ch.n*bs : (ch.n+1)*bs]
		k := chainKey(ch.key, blk)
		e, ok := c.entries[k]
		if !ok {
			e = &prefixEntry{key: k, parent: ch.key, tokens: slices.Clone(blk), block: blocks[ch.n], used: now}
			c.a.Retain(e.block)
			e.elem = c.lru.PushFront(e)
			c.entries[k] = e
			if p, ok := c.entries[ch.key]; ok && ch.n > 0 {
				p.children++
			}
		} else {
			c.lru.MoveToFront(e.elem)
			e.used = now
		}
		*ch = Chain{n: ch.n + 1, key: k}
	}
}

// Reclaim implements Reclaimer: it drops the least recently used leaf that
// no sequence shares or, when there is none, the least recently used entry
// that no sequence shares with every entry below it (unreachable without
// it). The second is for a sequence that computed a prefix beside another:
// its own entries hang below the other's copies of that prefix, whose
// blocks it does not hold, and they must not stay pinned while it runs
// (it could then not grow to the context the cache was sized for).
func (c *PrefixCache) Reclaim() bool {
	var unshared *prefixEntry
	for el := c.lru.Back(); el != nil; el = el.Prev() {
		e := el.Value.(*prefixEntry)
		if c.a.Refs(e.block) > 1 {
			continue
		}
		if e.children == 0 {
			c.spill(e)
			c.drop(e)
			return true
		}
		if unshared == nil {
			unshared = e
		}
	}
	if unshared == nil {
		return false
	}
	below := map[uint64]bool{unshared.key: true}
	for grew := true; grew; {
		grew = false
		for k, e := range c.entries {
			if !below[k] && below[e.parent] {
				below[k], grew = true, true
			}
		}
	}
	for k := range below { // the leaves first: a spill reads the chain above it
		if e := c.entries[k]; e.children == 0 {
			c.spill(e)
		}
	}
	for k := range below {
		c.drop(c.entries[k])
	}
	return true
}

// spill hands the prefix that the leaf e ends to the slower tier (Evicted)
// before e is dropped, unless that tier holds it already.
func (c *PrefixCache) spill(e *prefixEntry) {
	if !e.stored && c.Evicted != nil {
		tokens, blocks := c.prefix(e)
		c.Evicted(tokens, blocks)
		c.MarkStored(Leaf{entry: e})
	}
}

func (c *PrefixCache) drop(e *prefixEntry) {
	c.lru.Remove(e.elem)
	delete(c.entries, e.key)
	if p, ok := c.entries[e.parent]; ok {
		p.children--
	}
	c.a.Release(e.block)
}

// prefix returns the tokens and blocks of the prefix that e ends.
func (c *PrefixCache) prefix(e *prefixEntry) (tokens, blocks []int32) {
	var chain []*prefixEntry
	for ; e != nil; e = c.entries[e.parent] {
		chain = append(chain, e)
	}
	for i := len(chain) - 1; i >= 0; i-- {
		tokens = append(tokens, chain[i].tokens...)
		blocks = append(blocks, chain[i].block)
	}
	return tokens, blocks
}

// Leaf is a cached prefix that no cached block extends: a conversation's
// latest computed past.
type Leaf struct {
	Tokens, Blocks []int32
	Stored         bool
	Used           time.Time
	entry          *prefixEntry
}

// Leaves returns the cached prefixes no block extends, most recently used
// first, at most max; unstored only keeps those not marked stored.
func (c *PrefixCache) Leaves(max int, unstored bool) []Leaf {
	var out []Leaf
	for el := c.lru.Front(); el != nil && len(out) < max; el = el.Next() {
		e := el.Value.(*prefixEntry)
		if e.children > 0 || (unstored && e.stored) {
			continue
		}
		tokens, blocks := c.prefix(e)
		out = append(out, Leaf{Tokens: tokens, Blocks: blocks, Stored: e.stored, Used: e.used, entry: e})
	}
	return out
}

// MarkStored records that a slower tier holds the prefix of l, and so the
// shorter ones of its chain: those it keeps to the last whole unit it
// stores (a chunk of kvcache.Store), which is close enough not to store
// each again when Reclaim takes the chain's blocks one by one.
func (c *PrefixCache) MarkStored(l Leaf) {
	for e := l.entry; e != nil; e = c.entries[e.parent] {
		if c.entries[e.key] != e {
			return // dropped meanwhile
		}
		e.stored = true
	}
}

// Clear drops every entry (when the engine closes).
func (c *PrefixCache) Clear() {
	for c.lru.Len() > 0 {
		// Leaves first keeps the children counts consistent.
		for el := c.lru.Back(); el != nil; {
			prev := el.Prev()
			if e := el.Value.(*prefixEntry); e.children == 0 {
				c.drop(e)
			}
			el = prev
		}
	}
}

// Holders calls f for each block reference the cache holds (for accounting
// checks).
func (c *PrefixCache) Holders(f func(block int32)) {
	for _, e := range c.entries {
		f(e.block)
	}
}

// Len returns the number of cached blocks.
func (c *PrefixCache) Len() int { return len(c.entries) }
