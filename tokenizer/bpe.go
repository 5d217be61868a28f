package tokenizer

import (
	"sync"
	"unicode/utf8"
)

// bpe is HF's BPE model over raw bytes: vocabulary strings made of
// byte-level characters are stored as the bytes they stand for, so pieces
// never need converting to byte-level characters.
type bpe struct {
	vocab  map[string]int32 // raw bytes -> id
	byteID [256]int32       // id of each single byte, -1 if absent
	// merges maps a pair of ids (left<<32 | right) to rank<<32 | merged id.
	merges       map[uint64]uint64
	ignoreMerges bool
	unk          int32 // -1: bytes missing from the vocabulary are dropped
	fuseUnk      bool

	cacheMu sync.RWMutex
	cache   map[string][]int32
	pool    sync.Pool // *bpeWork
}

// The word cache holds at most cacheCap pieces of at most cacheMaxPiece
// bytes; once full, new pieces are not cached.
const (
	cacheCap      = 1 << 16
	cacheMaxPiece = 256
)

type symbol struct {
	id         int32
	prev, next int32
	size       int32 // bytes covered; 0 once merged into its left neighbour
}

type mergeItem struct {
	rank  uint32
	pos   int32
	merge int32
}

type bpeWork struct {
	syms []symbol
	heap []mergeItem
}

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

// encode appends the ids of one pre-tokenized piece (raw bytes) to ids.
func (m *bpe) encode(piece string, ids []int32) []int32 {
	if len(piece) == 0 {
		return ids
	}
	if len(piece) == 1 && m.byteID[piece[0]] >= 0 {
		// Nothing to merge; spaces and punctuation often come alone.
		return append(ids, m.byteID[piece[0]])
	}
	m.cacheMu.RLock()
	hit, ok := m.cache[piece]
	m.cacheMu.RUnlock()
	if ok {
		return append(ids, hit...)
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[piece]; ok {
			return append(ids, id)
		}
	}
	if len(piece) > maxMergeBytes {
		return m.mergeChunks(piece, ids)
	}
	start := len(ids)
	ids = m.merge(piece, ids)
	if len(piece) > cacheMaxPiece {
		return ids
	}
	m.cacheMu.Lock()
	if len(m.cache) < cacheCap {
		m.cache[piece] = append([]int32(nil), ids[start:]...)
	}
	m.cacheMu.Unlock()
	return ids
}

// maxMergeBytes bounds the text one merge works on. A longer piece (a run
// of 16K letters, spaces or symbols: a hostile prompt, not text) is merged
// in chunks cut at character starts, so that its cost follows the chunk:
// merging takes ~30 bytes of memory a byte, and an 8 MiB prompt without a
// space is one piece. Its ids may differ from HF's at the cuts; every
// shorter piece is merged whole, as HF merges.
const maxMergeBytes = 16 << 10

// mergeChunks merges piece maxMergeBytes (or a few bytes less) at a time.
func (m *bpe) mergeChunks(piece string, ids []int32) []int32 {
	for len(piece) > maxMergeBytes {
		cut := maxMergeBytes
		for cut > maxMergeBytes-utf8.UTFMax && !utf8.RuneStart(piece[cut]) {
			cut--
		}
		ids = m.merge(piece[:cut], ids)
		piece = piece[cut:]
	}
	return m.merge(piece, ids)
}

// merge applies the merges by rank, lowest first and leftmost among equal
// ranks, exactly as HF's Word::merge_all: a queued merge is still taken if
// the pair at its position now merges into the same token, even when that
// pair differs from the one it was queued for.
func (m *bpe) merge(piece string, ids []int32) []int32 {
	w, _ := m.pool.Get().(*bpeWork)
	if w == nil {
		w = &bpeWork{}
	}
	syms := w.syms[:0]
	for i := 0; i < len(piece); i++ {
		id := m.byteID[piece[i]]
		if id < 0 {
			if m.unk < 0 {
				continue
			}
			if m.fuseUnk && len(syms) > 0 && syms[len(syms)-1].id == m.unk {
				syms[len(syms)-1].size++
				continue
			}
			id = m.unk
		}
		n := int32(len(syms))
		syms = append(syms, symbol{id: id, prev: n - 1, next: n + 1, size: 1})
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	h := w.heap[:0]
	for i := 0; i+1 < len(syms); i++ {
		if v, ok := m.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			h = heapPush(h, mergeItem{rank: uint32(v >> 32), pos: int32(i), merge: int32(uint32(v))})
		}
	}
	for len(h) > 0 {
		var top mergeItem
		top, h = heapPop(h)
		cur := &syms[top.pos]
		if cur.size == 0 || cur.next < 0 {
			continue
		}
		right := syms[cur.next]
		v, ok := m.merges[pairKey(cur.id, right.id)]
		if !ok || int32(uint32(v)) != top.merge {
			continue
		}
		rightPos := cur.next
		cur.id = top.merge
		cur.size += right.size
		cur.next = right.next
		syms[rightPos].size = 0
		nextPos := right.next
		if nextPos >= 0 {
			syms[nextPos].prev = top.pos
		}
		if cur.prev >= 0 {
			p := syms[cur.prev]
			if v, ok := m.merges[pairKey(p.id, cur.id)]; ok {
				h = heapPush(h, mergeItem{rank: uint32(v >> 32), pos: cur.prev, merge: int32(uint32(v))})
			}
		}
		if nextPos >= 0 {
			if v, ok := m.merges[pairKey(cur.id, syms[nextPos].id)]; ok {
				h = heapPush(h, mergeItem{rank: uint32(v >> 32), pos: top.pos, merge: int32(uint32(v))})
			}
		}
	}
	for _, s := range syms {
		if s.size != 0 {
			ids = append(ids, s.id)
		}
	}
	w.syms, w.heap = syms, h
	m.pool.Put(w)
	return ids
}

func lessItem(a, b mergeItem) bool {
	return a.rank < b.rank || a.rank == b.rank && a.pos < b.pos
}

func heapPush(h []mergeItem, it mergeItem) []mergeItem {
	h = append(h, it)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !lessItem(h[i], h[p]) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
	return h
}

func heapPop(h []mergeItem) (mergeItem, []mergeItem) {
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h = h[:n]
	for i := 0; ; {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && lessItem(h[r], h[l]) {
			m = r
		}
		if !lessItem(h[m], h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	return top, h
}
