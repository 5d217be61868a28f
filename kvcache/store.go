package kvcache

import (
	"bytes"
	"cmp"
	"container/list"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// StoreOptions configure a Store.
type StoreOptions struct {
	// Dir is the cache directory; "" keeps entries in host memory only.
	// Entries live in a subdirectory per Model; the budget covers them all.
	Dir       string
	DiskBytes int64 // most bytes of entries in Dir
	RAMBytes  int64 // most bytes of entries in host memory
	// Model names the model, its weights and the layout of its KV blocks
	// and state: entries saved under another name are never loaded.
	Model      string
	BlockSize  int // tokens per KV block
	BlockBytes int // bytes of one KV block, all layers (backend.KVSpec.BlockBytes)
	StateBytes int // bytes of a hybrid model's state; 0 for others
	Logger     *slog.Logger
}

// Store keeps the computed past of conversations off the device: the KV
// blocks and (hybrid models) the recurrent state of token prefixes, in host
// memory and then in a bounded directory, so that a conversation the device
// let go (evicted, idle, or across a restart) resumes without recomputing.
//
// A prefix is stored as chunks of ChunkTokens tokens (the KV blocks of
// tokens [k*ChunkTokens, (k+1)*ChunkTokens), one entry each, shared by every
// prefix that contains them: a conversation's next turn adds only its new
// chunks) and a tip: the KV blocks of the tokens after its last whole chunk,
// and the state after them. Entries are keyed by a hash of the model and
// the token prefix they end; each holds its own tokens, which a load
// compares. Files are written whole under a temporary name and renamed
// (a crash leaves no partial entry: temporary files are removed at Open),
// and carry a CRC-32C that a load checks. Each tier drops its least recently
// used entries beyond its budget; an entry whose chunk chain lost a link is
// dropped with it.
//
// Store is safe for concurrent use; a goroutine of its own writes files.
type Store struct {
	opts     StoreOptions
	dir      string // opts.Dir/<model hash>; "" without a directory
	seed     uint64
	lockFile *os.File
	log      *slog.Logger

	mu        sync.Mutex
	entries   map[entryID]*storeEntry
	lru       list.List   // *storeEntry, most recently used first
	tipLens   map[int]int // tips of this model by length
	ram, disk int64       // bytes held in each tier (disk: with files being written)
	queue     []*storeEntry
	touched   map[*storeEntry]bool // files whose use is not yet on their mtime
	written   *sync.Cond           // signalled when the writer is done with an entry
	wake      chan struct{}
	closed    bool
	done      chan struct{}
	stats     StoreStats
}

// StoreStats are a store's counters.
type StoreStats struct {
	Entries            int
	RAMBytes           int64
	DiskBytes          int64
	Restores           int64 // prefixes loaded
	RestoredTokens     int64
	Saved              int64 // entries written to the directory
	Dropped, Corrupted int64 // entries evicted for room; entries whose file failed its checks
}

// ChunkTokens is the tokens of a chunk entry: 16 blocks.
func (s *Store) ChunkTokens() int { return chunkBlocks * s.opts.BlockSize }

const chunkBlocks = 16

type entryKind byte

const (
	kindChunk entryKind = 'c'
	kindTip   entryKind = 't'
)

type entryID struct {
	kind entryKind
	key  uint64
}

// storeEntry is one chunk or tip, in host memory, on disk or both.
type storeEntry struct {
	fileHeader
	size    int64
	data    []byte // the file's bytes while in host memory
	onDisk  bool
	queued  bool // waiting for the writer
	writing bool // the writer is writing its file
	gone    bool // dropped from the index
	own     bool // this store's model (others' files only count for the budget)
	path    string
	modTime time.Time
	elem    *list.Element
}

func (e *storeEntry) id() entryID { return entryID{e.kind, e.key} }

// end is the length of the prefix the entry ends.
func (e *storeEntry) end() int { return e.start + e.n }

// ErrStoreBusy: another process uses the cache directory.
var ErrStoreBusy = errors.New("kvcache: the state cache directory is in use by another process")

// OpenStore opens (creating) the store's directory, removes temporary files
// a crash left, indexes the entries there (headers only) and drops the
// least recently used beyond the budget. Another process holding the
// directory gives ErrStoreBusy.
func OpenStore(opts StoreOptions) (*Store, error) {
	if opts.BlockSize <= 0 || opts.BlockBytes <= 0 || opts.StateBytes < 0 || opts.RAMBytes < 0 || opts.DiskBytes < 0 {
		return nil, fmt.Errorf("kvcache: invalid store options %+v", opts)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Store{opts: opts, seed: modelSeed(opts.Model), log: opts.Logger, entries: map[entryID]*storeEntry{},
		tipLens: map[int]int{}, touched: map[*storeEntry]bool{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	s.written = sync.NewCond(&s.mu)
	if opts.Dir != "" {
		if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
			return nil, fmt.Errorf("kvcache: state cache: %w", err)
		}
		f, err := os.OpenFile(filepath.Join(opts.Dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, fmt.Errorf("kvcache: state cache: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("%w (%s)", ErrStoreBusy, opts.Dir)
			}
			return nil, fmt.Errorf("kvcache: state cache lock: %w", err)
		}
		s.lockFile = f
		s.dir = filepath.Join(opts.Dir, fmt.Sprintf("%016x", s.seed))
		if err := os.MkdirAll(s.dir, 0o700); err != nil {
			s.unlock()
			return nil, fmt.Errorf("kvcache: state cache: %w", err)
		}
		if err := s.scan(); err != nil {
			s.unlock()
			return nil, err
		}
	}
	go s.writer()
	return s, nil
}

func (s *Store) unlock() {
	if s.lockFile != nil {
		syscall.Flock(int(s.lockFile.Fd()), syscall.LOCK_UN)
		s.lockFile.Close()
		s.lockFile = nil
	}
}

// modelSeed hashes the model's name into the root of every prefix key.
func modelSeed(model string) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < len(model); i++ {
		h ^= uint64(model[i])
		h *= 0x100000001b3
	}
	return mix64(h)
}

// The file format: a header, the entry's tokens, its KV blocks, its state,
// and a CRC-32C (Castagnoli) of all that, little-endian.
const (
	fileMagic  = "KILNST01"
	headerSize = 64
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type fileHeader struct {
	kind                                     entryKind
	start, n, blocks, blockBytes, stateBytes int
	key, parent, model                       uint64
}

func (h *fileHeader) size() int64 {
	return headerSize + 4*int64(h.n) + int64(h.blocks)*int64(h.blockBytes) + int64(h.stateBytes) + 4
}

func (h *fileHeader) put(b []byte) {
	copy(b, fileMagic)
	b[8] = byte(h.kind)
	le := binary.LittleEndian
	le.PutUint32(b[12:], uint32(h.start))
	le.PutUint32(b[16:], uint32(h.n))
	le.PutUint32(b[20:], uint32(h.blocks))
	le.PutUint32(b[24:], uint32(h.blockBytes))
	le.PutUint32(b[28:], uint32(h.stateBytes))
	le.PutUint64(b[32:], h.key)
	le.PutUint64(b[40:], h.parent)
	le.PutUint64(b[48:], h.model)
}

// parseHeader reads a header; fileSize, when not negative, must be the size
// it implies.
func parseHeader(b []byte, fileSize int64) (*fileHeader, error) {
	if len(b) < headerSize || string(b[:8]) != fileMagic {
		return nil, errors.New("not a kiln state cache entry")
	}
	le := binary.LittleEndian
	h := &fileHeader{kind: entryKind(b[8]), start: int(le.Uint32(b[12:])), n: int(le.Uint32(b[16:])),
		blocks: int(le.Uint32(b[20:])), blockBytes: int(le.Uint32(b[24:])), stateBytes: int(le.Uint32(b[28:])),
		key: le.Uint64(b[32:]), parent: le.Uint64(b[40:]), model: le.Uint64(b[48:])}
	switch {
	case h.kind != kindChunk && h.kind != kindTip:
		return nil, fmt.Errorf("entry kind %q", h.kind)
	case h.blockBytes <= 0 || h.blocks > 1<<24 || h.blockBytes > 1<<30 || h.n > 1<<28:
		return nil, fmt.Errorf("implausible sizes: %d tokens, %d blocks of %d bytes", h.n, h.blocks, h.blockBytes)
	case h.kind == kindChunk && (h.n == 0 || h.blocks == 0), h.kind == kindTip && h.n == 0 && h.stateBytes == 0:
		return nil, errors.New("empty entry")
	case fileSize >= 0 && h.size() != fileSize:
		return nil, fmt.Errorf("%d bytes, the header says %d", fileSize, h.size())
	}
	return h, nil
}

// encodeEntry lays out an entry's file: header, tokens, KV, state, CRC.
func encodeEntry(h *fileHeader, tokens []int32, kv, state []byte) []byte {
	b := make([]byte, h.size())
	h.put(b)
	off := headerSize
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(b[off:], uint32(t))
		off += 4
	}
	off += copy(b[off:], kv)
	off += copy(b[off:], state)
	binary.LittleEndian.PutUint32(b[off:], crc32.Checksum(b[:off], castagnoli))
	return b
}

// loadEntry reads an entry from host memory (data) or else from its file
// at path; see readEntry.
func loadEntry(data []byte, path string, dst, stateDst []byte) (h *fileHeader, tokens []int32, state []byte, err error) {
	if data != nil {
		return readEntry(bytes.NewReader(data), int64(len(data)), dst, stateDst)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, nil, err
	}
	return readEntry(f, st.Size(), dst, stateDst)
}

// readEntry reads an entry's size bytes from r and checks them (header,
// tokens, KV, state and the CRC of them all), its last len(dst) bytes of
// KV straight into dst, the blocks before them only through the checksum:
// reading whole files and copying their KV out cost a restored 20K-token
// conversation a second pass over its ~150 MB. The state goes to stateDst
// when it has the state's size.
func readEntry(r io.Reader, size int64, dst, stateDst []byte) (h *fileHeader, tokens []int32, state []byte, err error) {
	head := make([]byte, headerSize)
	if _, err := io.ReadFull(r, head); err != nil {
		return nil, nil, nil, err
	}
	if h, err = parseHeader(head, size); err != nil {
		return nil, nil, nil, err
	}
	skip := h.blocks*h.blockBytes - len(dst)
	if skip < 0 {
		return nil, nil, nil, fmt.Errorf("%d bytes of KV, want %d", h.blocks*h.blockBytes, len(dst))
	}
	toks := make([]byte, 4*h.n)
	if state = stateDst; len(state) != h.stateBytes {
		state = make([]byte, h.stateBytes)
	}
	var sum [4]byte
	crc := crc32.Update(0, castagnoli, head)
	for _, part := range [][]byte{toks, make([]byte, skip), dst} {
		if _, err := io.ReadFull(r, part); err != nil {
			return nil, nil, nil, err
		}
		crc = crc32.Update(crc, castagnoli, part)
	}
	for _, part := range [][]byte{state, sum[:]} {
		if _, err := io.ReadFull(r, part); err != nil {
			return nil, nil, nil, err
		}
	}
	if crc32.Update(crc, castagnoli, state) != binary.LittleEndian.Uint32(sum[:]) {
		return nil, nil, nil, errors.New("checksum mismatch")
	}
	tokens = make([]int32, h.n)
	for i := range tokens {
		tokens[i] = int32(binary.LittleEndian.Uint32(toks[4*i:]))
	}
	return h, tokens, state, nil
}

// scan indexes Dir's entries (every model's: they all count for the
// budget) and removes temporary files and files that are not entries.
func (s *Store) scan() error {
	subs, err := os.ReadDir(s.opts.Dir)
	if err != nil {
		return fmt.Errorf("kvcache: state cache: %w", err)
	}
	var found []*storeEntry
	for _, sub := range subs {
		if !sub.IsDir() {
			continue
		}
		dir := filepath.Join(s.opts.Dir, sub.Name())
		own := dir == s.dir
		files, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, f := range files {
			path := filepath.Join(dir, f.Name())
			if strings.HasPrefix(f.Name(), "tmp-") {
				os.Remove(path) // a write a crash interrupted
				continue
			}
			e, err := readIndexEntry(path)
			if err != nil {
				s.log.Warn("state cache: removing a bad entry", "file", path, "err", err)
				os.Remove(path)
				continue
			}
			e.own = own && s.owns(&e.fileHeader)
			found = append(found, e)
		}
	}
	// Oldest first; among entries of the same time, descendants (larger
	// start) before their ancestors, which so stay longer.
	slices.SortFunc(found, func(a, b *storeEntry) int {
		if c := a.modTime.Compare(b.modTime); c != 0 {
			return c
		}
		return cmp.Compare(b.start, a.start)
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range found {
		s.index(e)
		s.disk += e.size
	}
	s.fitDisk(0)
	return nil
}

// readIndexEntry reads a file's header into an index entry.
func readIndexEntry(path string) (*storeEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	var b [headerSize]byte
	if _, err := io.ReadFull(f, b[:]); err != nil {
		return nil, err
	}
	h, err := parseHeader(b[:], fi.Size())
	if err != nil {
		return nil, err
	}
	e := &storeEntry{fileHeader: *h, size: fi.Size(), onDisk: true, path: path, modTime: fi.ModTime()}
	if filepath.Base(path) != entryName(e.id()) {
		return nil, fmt.Errorf("holds %s", entryName(e.id()))
	}
	return e, nil
}

func entryName(id entryID) string { return fmt.Sprintf("%c-%016x", id.kind, id.key) }

// owns reports whether an entry's header is of this store's model.
func (s *Store) owns(h *fileHeader) bool {
	return h.model == s.seed && h.blockBytes == s.opts.BlockBytes && (h.stateBytes == 0 || h.stateBytes == s.opts.StateBytes)
}

// index adds e to the index, most recently used.
func (s *Store) index(e *storeEntry) {
	if e.own {
		s.entries[e.id()] = e
		if e.kind == kindTip {
			s.tipLens[e.end()]++
		}
	}
	e.elem = s.lru.PushFront(e)
}

// drop removes e from the index and both tiers, and with it the entries
// whose chunk chain passes through it: without e they can never be loaded.
func (s *Store) drop(e *storeEntry) {
	if e.gone {
		return
	}
	e.gone = true
	s.lru.Remove(e.elem)
	if e.data != nil {
		s.ram -= e.size
		e.data = nil
	}
	if e.onDisk && !e.writing {
		os.Remove(e.path)
		s.disk -= e.size
		e.onDisk = false
	}
	if !e.own {
		return
	}
	delete(s.entries, e.id())
	if e.kind == kindTip {
		if s.tipLens[e.end()]--; s.tipLens[e.end()] == 0 {
			delete(s.tipLens, e.end())
		}
		return
	}
	for _, c := range s.entries {
		if c.parent == e.key && c.start == e.end() {
			s.drop(c)
		}
	}
}

// fitDisk drops the least recently used files until extra more bytes fit
// in the budget; false when they cannot.
func (s *Store) fitDisk(extra int64) bool {
	for el := s.lru.Back(); s.disk+extra > s.opts.DiskBytes && el != nil; {
		prev := el.Prev()
		if e := el.Value.(*storeEntry); e.onDisk && !e.writing {
			// Dropping an entry drops its descendants, which may be the
			// previous element: start again from the back.
			s.dropFile(e)
			s.stats.Dropped++
			prev = s.lru.Back()
		}
		el = prev
	}
	return s.disk+extra <= s.opts.DiskBytes
}

// dropFile removes e's file; e leaves the index unless it is in host memory.
func (s *Store) dropFile(e *storeEntry) {
	if e.data == nil {
		s.drop(e)
		return
	}
	os.Remove(e.path)
	s.disk -= e.size
	e.onDisk = false
}

// fitRAM drops host copies, least recently used first, until the budget
// holds: copies the directory has, and the entries it has not (without a
// directory, or too large for it). Entries waiting for the writer stay (Put
// waits for it).
func (s *Store) fitRAM() {
	for el := s.lru.Back(); s.ram > s.opts.RAMBytes && el != nil; {
		prev := el.Prev()
		switch e := el.Value.(*storeEntry); {
		case e.data == nil || e.writing || e.queued:
		case e.onDisk:
			s.ram -= e.size
			e.data = nil
		default: // no directory, or one that refused it
			s.drop(e)
			s.stats.Dropped++
			prev = s.lru.Back()
		}
		el = prev
	}
}

// touch marks e used (and its file, for the order after a restart).
func (s *Store) touch(e *storeEntry) {
	s.lru.MoveToFront(e.elem)
	if e.onDisk {
		s.touched[e] = true
	}
}

// Put stores the prefix tokens whose KV blocks are blocks (covering
// len(tokens) tokens) and, for a hybrid model, whose state after them is
// state: the chunks the store lacks, and a tip for the tokens after the last
// whole chunk and the state (none when the prefix ends a chunk and has no
// state). read copies device blocks to host memory; Put reads the blocks of
// new entries only, an entry at a time. The entries go to host memory, and
// to the directory in the background; with a directory, Put waits for the
// writer while entries not written yet fill the memory budget. It returns
// how many entries it added.
func (s *Store) Put(tokens []int32, blocks []int32, state []byte, read func(blocks []int, dst []byte) error) (int, error) {
	n := len(tokens)
	bs, C := s.opts.BlockSize, s.ChunkTokens()
	if n == 0 || len(blocks) < (n+bs-1)/bs || (state != nil && len(state) != s.opts.StateBytes) {
		return 0, fmt.Errorf("kvcache: store: %d blocks and %d state bytes for %d tokens", len(blocks), len(state), n)
	}
	var add []*storeEntry // new entries, ancestors first
	var seen []*storeEntry
	h := prefixHash(s.seed)
	parent := uint64(0)
	s.mu.Lock()
	for start := 0; start < n; start += C {
		end := min(start+C, n)
		for _, t := range tokens[start:end] {
			h = h.add(t)
		}
		key := h.key(end)
		if end-start == C {
			if e := s.entries[entryID{kindChunk, key}]; e != nil {
				seen = append(seen, e)
			} else {
				add = append(add, &storeEntry{fileHeader: fileHeader{kind: kindChunk, start: start, n: C, blocks: chunkBlocks,
					blockBytes: s.opts.BlockBytes, key: key, parent: parent, model: s.seed}})
			}
			parent = key
		}
		if end < n {
			continue
		}
		// The tip: the tokens after the last whole chunk, and the state.
		base := end
		if end-start < C {
			base = start
		}
		if base == n && state == nil {
			break
		}
		if e := s.entries[entryID{kindTip, key}]; e != nil && (e.stateBytes > 0 || state == nil) {
			seen = append(seen, e)
			break
		}
		add = append(add, &storeEntry{fileHeader: fileHeader{kind: kindTip, start: base, n: n - base, blocks: (n+bs-1)/bs - base/bs,
			blockBytes: s.opts.BlockBytes, stateBytes: len(state), key: key, parent: parent, model: s.seed}})
	}
	for i := len(seen) - 1; i >= 0; i-- {
		s.touch(seen[i])
	}
	s.mu.Unlock()
	if len(add) == 0 {
		return 0, nil
	}
	var ids []int
	for i, e := range add {
		ids = ids[:0]
		for _, b := range blocks[e.start/bs : e.start/bs+e.blocks] {
			ids = append(ids, int(b))
		}
		kv := make([]byte, e.blocks*s.opts.BlockBytes)
		if err := read(ids, kv); err != nil {
			return i, err
		}
		var st []byte
		if e.kind == kindTip {
			st = state
		}
		e.data = encodeEntry(&e.fileHeader, tokens[e.start:e.end()], kv, st)
		e.size = int64(len(e.data))
		e.own = true
		e.path = filepath.Join(s.dir, entryName(e.id()))
		s.mu.Lock()
		for s.dir != "" && s.ram+e.size > s.opts.RAMBytes && len(s.queue) > 0 {
			s.fitRAM()
			if s.ram+e.size > s.opts.RAMBytes {
				s.written.Wait()
			}
		}
		if old := s.entries[e.id()]; old != nil {
			s.drop(old) // a tip without state that this one replaces
		}
		s.index(e)
		s.ram += e.size
		if s.dir != "" {
			s.queue = append(s.queue, e)
			e.queued = true
		}
		s.fitRAM()
		s.mu.Unlock()
		s.poke()
	}
	s.mu.Lock()
	for i := len(add) - 1; i >= 0; i-- { // ancestors most recently used
		if !add[i].gone {
			s.lru.MoveToFront(add[i].elem)
		}
	}
	s.mu.Unlock()
	return len(add), nil
}

// Match returns the length of the longest prefix of tokens[:maxLen] that the
// store can restore, 0 for none: one ending at a tip with state when
// needState is set (hybrid models), else also at the end of a chain of
// whole chunks. It hashes the tokens once; Load compares them.
func (s *Store) Match(tokens []int32, maxLen int, needState bool) int {
	maxLen = min(maxLen, len(tokens))
	C := s.ChunkTokens()
	s.mu.Lock()
	defer s.mu.Unlock()
	lens := make([]int, 0, len(s.tipLens))
	for l := range s.tipLens {
		if l <= maxLen {
			lens = append(lens, l)
		}
	}
	slices.Sort(lens)
	h := prefixHash(s.seed)
	chainEnd, chainOK, best := 0, true, 0
	for i := 0; i < maxLen; i++ {
		h = h.add(tokens[i])
		pos := i + 1
		if chainOK && pos%C == 0 {
			if s.entries[entryID{kindChunk, h.key(pos)}] != nil {
				chainEnd = pos
			} else {
				chainOK = false
			}
		}
		for len(lens) > 0 && lens[0] < pos {
			lens = lens[1:]
		}
		if len(lens) > 0 && lens[0] == pos && pos-pos%C <= chainEnd {
			if e := s.entries[entryID{kindTip, h.key(pos)}]; e != nil && (e.stateBytes > 0 || !needState) {
				best = pos
			}
		}
		if len(lens) == 0 && !chainOK {
			break
		}
	}
	if !needState {
		best = max(best, chainEnd)
	}
	return best
}

// Load returns the KV blocks of tokens[:n] from block fromBlock on (one
// after the other, as read copied them) and, at a tip with state, the state
// after n tokens, for a prefix Match found. kv and then state are buf's
// memory where buf has the room (a caller that restores often keeps one:
// the page faults of a fresh buffer were a third of a 150 MB restore's
// time; page-locked, it crosses to a GPU at the bus's rate), else new. An
// entry that fails its checks (a corrupt file, other tokens) is dropped and
// Load fails.
func (s *Store) Load(tokens []int32, n, fromBlock int, buf []byte) (kv, state []byte, err error) {
	bs, C := s.opts.BlockSize, s.ChunkTokens()
	s.mu.Lock()
	var chain []*storeEntry
	h := prefixHash(s.seed)
	for start := 0; start < n; start += C {
		end := min(start+C, n)
		for _, t := range tokens[start:end] {
			h = h.add(t)
		}
		if end-start == C {
			e := s.entries[entryID{kindChunk, h.key(end)}]
			if e == nil {
				s.mu.Unlock()
				return nil, nil, errors.New("kvcache: store: the prefix is no longer stored")
			}
			chain = append(chain, e)
		}
	}
	tip := s.entries[entryID{kindTip, h.key(n)}]
	if tip == nil && n%C != 0 {
		s.mu.Unlock()
		return nil, nil, errors.New("kvcache: store: the prefix is no longer stored")
	}
	if tip != nil {
		chain = append(chain, tip)
	}
	for i := len(chain) - 1; i >= 0; i-- {
		s.touch(chain[i])
	}
	type src struct {
		e    *storeEntry
		data []byte
		path string
	}
	var srcs []src
	for _, e := range chain {
		if (e.start+e.n+bs-1)/bs > fromBlock || (e == tip && e.stateBytes > 0) {
			srcs = append(srcs, src{e, e.data, e.path})
		}
	}
	s.mu.Unlock()
	total := (n+bs-1)/bs - fromBlock
	kvBytes, stateBytes := total*s.opts.BlockBytes, 0
	if tip != nil {
		stateBytes = tip.stateBytes
	}
	if cap(buf) < kvBytes+stateBytes {
		buf = make([]byte, kvBytes+stateBytes)
	}
	kv, stateDst := buf[:kvBytes], buf[kvBytes:kvBytes+stateBytes]
	// The entries are read, checked and copied in parallel: a restored
	// conversation of 20K tokens is ~150 MB of files, and one core reading
	// and checking them took 125-185 ms of a restarted turn's TTFT. Chunks
	// and the tip begin on block boundaries: their blocks follow each other.
	errs := make([]error, len(srcs))
	offs := make([]int, len(srcs)+1)
	for i, sc := range srcs {
		offs[i+1] = offs[i] + max(sc.e.blocks-max(fromBlock-sc.e.start/bs, 0), 0)*s.opts.BlockBytes
	}
	if offs[len(srcs)] != len(kv) {
		return nil, nil, fmt.Errorf("kvcache: store: %d bytes of KV for %d blocks", offs[len(srcs)], total)
	}
	var wg sync.WaitGroup
	for i, sc := range srcs {
		wg.Go(func() {
			e := sc.e
			var sd []byte
			if e == tip {
				sd = stateDst
			}
			h, toks, st, err := loadEntry(sc.data, sc.path, kv[offs[i]:offs[i+1]], sd)
			switch {
			case err != nil:
			case *h != e.fileHeader:
				err = errors.New("the header changed")
			case !slices.Equal(toks, tokens[e.start:e.end()]):
				err = errors.New("other tokens (a hash collision)")
			}
			if err != nil {
				errs[i] = err
				return
			}
			if e == tip {
				state = st
			}
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, nil, s.bad(srcs[i].e, err)
		}
	}
	s.mu.Lock()
	s.stats.Restores++
	s.stats.RestoredTokens += int64(n - min(n, fromBlock*bs))
	s.mu.Unlock()
	return kv, state, nil
}

// bad drops an entry that failed its checks.
func (s *Store) bad(e *storeEntry, err error) error {
	s.log.Warn("state cache: dropping an entry that failed its checks", "file", e.path, "err", err)
	s.mu.Lock()
	s.stats.Corrupted++
	s.drop(e)
	s.mu.Unlock()
	return fmt.Errorf("kvcache: store: %s: %w", entryName(e.id()), err)
}

func (s *Store) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// writer writes queued entries to the directory, each under a temporary
// name then renamed, and records the use of entries on their files' times.
func (s *Store) writer() {
	defer close(s.done)
	for {
		s.mu.Lock()
		for len(s.queue) == 0 && len(s.touched) == 0 && !s.closed {
			s.mu.Unlock()
			<-s.wake
			s.mu.Lock()
		}
		if len(s.queue) == 0 && len(s.touched) == 0 {
			s.mu.Unlock()
			return
		}
		var touched []string
		for e := range s.touched {
			if e.onDisk && !e.gone {
				touched = append(touched, e.path)
			}
		}
		clear(s.touched)
		var e *storeEntry
		var data []byte
		if len(s.queue) > 0 {
			e = s.queue[0]
			s.queue = s.queue[1:]
			e.queued = false
			if e.gone || e.data == nil || e.onDisk || !s.fitDisk(e.size) || e.gone {
				e = nil // dropped, written, or too large for the budget
			} else {
				e.writing = true
				s.disk += e.size
				data = e.data
			}
		}
		s.written.Broadcast()
		s.mu.Unlock()
		now := time.Now()
		for _, p := range touched {
			os.Chtimes(p, now, now)
		}
		if e == nil {
			continue
		}
		err := writeFile(e.path, data)
		s.mu.Lock()
		e.writing = false
		switch {
		case err != nil:
			s.disk -= e.size
			s.log.Warn("state cache: write failed", "file", e.path, "err", err)
		case e.gone:
			os.Remove(e.path)
			s.disk -= e.size
		default:
			e.onDisk = true
			s.stats.Saved++
		}
		s.written.Broadcast()
		s.mu.Unlock()
	}
}

// writeFile writes data to path atomically: to a temporary file of the same
// directory, then renamed over path.
func writeFile(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "tmp-"+filepath.Base(path)+"-")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// Close writes what is queued, stops the writer and releases the
// directory.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.poke()
	<-s.done
	s.unlock()
	return nil
}

// Stats returns the store's counters.
func (s *Store) Stats() StoreStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Entries, st.RAMBytes, st.DiskBytes = len(s.entries), s.ram, s.disk
	return st
}

// StoredPrefix is a prefix the store can restore: a tip and its chunks.
type StoredPrefix struct {
	Tokens int
	Bytes  int64 // of its entries, shared chunks included
	State  bool
	InRAM  bool // every entry in host memory
	OnDisk bool // every entry on disk
}

// Prefixes returns the stored prefixes, most recently used first, at most
// max.
func (s *Store) Prefixes(max int) []StoredPrefix {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []StoredPrefix
	for el := s.lru.Front(); el != nil && len(out) < max; el = el.Next() {
		tip := el.Value.(*storeEntry)
		if !tip.own || tip.kind != kindTip {
			continue
		}
		p := StoredPrefix{Tokens: tip.end(), State: tip.stateBytes > 0, InRAM: true, OnDisk: true}
		for e := tip; e != nil; {
			p.Bytes += e.size
			p.InRAM = p.InRAM && e.data != nil
			p.OnDisk = p.OnDisk && e.onDisk
			if e.start == 0 {
				break
			}
			e = s.entries[entryID{kindChunk, e.parent}]
		}
		out = append(out, p)
	}
	return out
}
