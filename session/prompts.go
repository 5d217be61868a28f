package session

import (
	"container/list"
	"hash/maphash"
	"slices"
	"strings"
	"sync"

	"github.com/kiln-llm/kiln/tokenizer"
)

// messageStart is the special token that opens every message of a ChatML
// conversation (Qwen's templates).
const messageStart = "<|im_start|>"

// promptCacheBytes bounds the memory of the prompts kept for reuse: about
// 80 conversations of 100K tokens.
const promptCacheBytes = 64 << 20

// prompts tokenizes prompts, reusing the token ids of earlier prompts that
// share their beginning. A special token is matched before anything else the
// tokenizer does, so it splits a text into parts that are tokenized
// independently: the ids of a text up to a message start are the first ids of
// every text that begins with the same bytes and has a message start there.
// A conversation's next turn so tokenizes only from the message start before
// its first change (the previous answer, usually): host work proportional to
// the new text, not the history. Lookups hash the text once (maphash, GB/s)
// and compare the reused part once.
//
// It also gives each prompt's message starts as token positions, where the
// engine keeps hybrid models' state (engine.Request.Checkpoints).
type prompts struct {
	tok    *tokenizer.Tokenizer
	markID int32 // messageStart's id; -1: the tokenizer has none
	reuse  bool  // the tokenizer encodes around messageStart independently
	seed   maphash.Seed

	mu     sync.Mutex
	budget int64
	bytes  int64
	lru    list.List                // *promptEntry, most recently used first
	index  map[uint64]*list.Element // hash of text[:cut.off] -> an entry with that cut
}

// promptEntry is a tokenized prompt and its message starts.
type promptEntry struct {
	text string
	ids  []int32
	cuts []promptCut
}

// promptCut is a message start: its byte offset in the text, its index in
// the ids and the hash of the text before it.
type promptCut struct {
	off, id int
	key     uint64
}

func (e *promptEntry) size() int64 {
	return int64(len(e.text) + 4*len(e.ids) + 24*len(e.cuts) + 64)
}

func newPrompts(tok *tokenizer.Tokenizer, budget int64) *prompts {
	p := &prompts{tok: tok, markID: -1, seed: maphash.MakeSeed(), budget: budget, index: map[uint64]*list.Element{}}
	if tok == nil {
		return p
	}
	id, ok := tok.TokenID(messageStart)
	if !ok || !tok.IsSpecial(id) {
		return p
	}
	p.markID = id
	// Reuse holds when the token takes no whitespace around it (lstrip,
	// rstrip) and the text on each side is tokenized on its own.
	left, right := "a \n ", " \n b"
	whole := tok.Encode(left + messageStart + right)
	parts := append(append(tok.Encode(left), id), tok.Encode(right)...)
	p.reuse = slices.Equal(whole, parts)
	return p
}

// encode returns the ids of text, as tok.Encode gives them, the positions
// of its message starts, and how many of the ids came from an earlier
// prompt; or ok false, having tokenized no more than that, when text has
// more than limit tokens (tokenizer.EncodeLimit).
func (p *prompts) encode(text string, limit int) (ids []int32, marks []int, reused int, ok bool) {
	if !p.reuse {
		if ids, ok = p.tok.EncodeLimit(text, limit); !ok {
			return nil, nil, 0, false
		}
		if p.markID >= 0 {
			for i, id := range ids {
				if id == p.markID {
					marks = append(marks, i)
				}
			}
		}
		return ids, marks, 0, true
	}
	// The message starts of text and the hash of the text before each.
	var cuts []promptCut
	var h maphash.Hash
	h.SetSeed(p.seed)
	prev := 0
	for from := 0; ; {
		i := strings.Index(text[from:], messageStart)
		if i < 0 {
			break
		}
		off := from + i
		h.WriteString(text[prev:off])
		prev = off
		cuts = append(cuts, promptCut{off: off, id: -1, key: h.Sum64()})
		from = off + len(messageStart)
	}
	// The longest earlier prompt sharing the text up to one of these cuts:
	// the cuts before it are the same in both.
	at := -1 // the cut of text up to which an earlier prompt is reused
	var from *promptEntry
	p.mu.Lock()
	for k := len(cuts) - 1; k >= 0; k-- {
		el, ok := p.index[cuts[k].key]
		if !ok {
			continue
		}
		e := el.Value.(*promptEntry)
		if k < len(e.cuts) && e.cuts[k].off == cuts[k].off && e.text[:cuts[k].off] == text[:cuts[k].off] {
			from, at = e, k
			p.lru.MoveToFront(el)
			break
		}
	}
	p.mu.Unlock()
	start, next := 0, 0 // where tokenizing starts: its byte offset, its first cut
	if from != nil {
		for i := range at + 1 {
			cuts[i].id = from.cuts[i].id
		}
		start, next, reused = cuts[at].off, at, cuts[at].id
		if reused > limit {
			return nil, nil, 0, false
		}
		ids = make([]int32, reused, reused+(len(text)-start)/3+16)
		copy(ids, from.ids)
	}
	rest, ok := p.tok.EncodeLimit(text[start:], limit-reused)
	if !ok {
		return nil, nil, 0, false
	}
	ids = append(ids, rest...)
	// The new part's message starts are its mark tokens, in order.
	for i := cutID(cuts, next); i < len(ids) && next < len(cuts); i++ {
		if ids[i] == p.markID {
			cuts[next].id = i
			next++
		}
	}
	marks = make([]int, 0, len(cuts))
	for _, c := range cuts[:next] {
		marks = append(marks, c.id)
	}
	if next == len(cuts) {
		p.add(&promptEntry{text: text, ids: ids, cuts: cuts})
	} // else not one token per message start: nothing to keep
	return ids, marks, reused, true
}

// cutID is the id index of cuts[k], or 0 past the end.
func cutID(cuts []promptCut, k int) int {
	if k < len(cuts) && cuts[k].id >= 0 {
		return cuts[k].id
	}
	return 0
}

// add keeps e for reuse, dropping the least recently used prompts beyond
// the budget.
func (p *prompts) add(e *promptEntry) {
	if e.size() > p.budget || len(e.cuts) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	el := p.lru.PushFront(e)
	p.bytes += e.size()
	for _, c := range e.cuts {
		p.index[c.key] = el
	}
	for p.bytes > p.budget {
		old := p.lru.Back()
		oe := old.Value.(*promptEntry)
		for _, c := range oe.cuts {
			if p.index[c.key] == old {
				delete(p.index, c.key)
			}
		}
		p.lru.Remove(old)
		p.bytes -= oe.size()
	}
}
