package kvcache

import (
	"errors"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeKV is a device's KV blocks in memory: block b holds bytes derived
// from the token prefix it was computed for, so that a restore can be
// checked against the prefix.
type fakeKV struct {
	bb     int
	blocks map[int][]byte
	reads  int
}

func (f *fakeKV) read(ids []int, dst []byte) error {
	f.reads++
	for i, b := range ids {
		copy(dst[i*f.bb:], f.blocks[b])
	}
	return nil
}

// content is what a block holding tokens[from:from+bs] of a prefix holds.
func content(tokens []int32, blk, bs, bb int) []byte {
	b := make([]byte, bb)
	h := uint32(2166136261)
	for _, t := range tokens[:min(len(tokens), (blk+1)*bs)] {
		h = (h ^ uint32(t)) * 16777619
	}
	for i := range b {
		b[i] = byte(h >> (8 * (i % 4)))
	}
	return b
}

// compute "computes" tokens into fresh device blocks.
func (f *fakeKV) compute(tokens []int32, bs int) []int32 {
	var ids []int32
	for blk := 0; blk*bs < len(tokens); blk++ {
		id := len(f.blocks)
		f.blocks[id] = content(tokens, blk, bs, f.bb)
		ids = append(ids, int32(id))
	}
	return ids
}

func testStore(t *testing.T, dir string, state int, disk int64) *Store {
	t.Helper()
	s, err := OpenStore(StoreOptions{Dir: dir, DiskBytes: disk, RAMBytes: 1 << 20, Model: "test-model", BlockSize: 4, BlockBytes: 8, StateBytes: state, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func randTokens(rng *rand.Rand, n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(rng.IntN(50))
	}
	return p
}

// checkLoad loads tokens[:n] from block from and compares with what the
// blocks held, into a new buffer (the one given is too small) and into a
// dirty one with room, which Load must use for the KV and then the state.
func checkLoad(t *testing.T, s *Store, tokens []int32, n, from int, wantState []byte) {
	t.Helper()
	var want []byte
	for blk := from; blk*4 < n; blk++ {
		want = append(want, content(tokens[:n], blk, 4, 8)...)
	}
	need := len(want) + len(wantState)
	for _, buf := range [][]byte{slices.Repeat([]byte{0xee}, max(need-1, 0)), slices.Repeat([]byte{0xee}, need+9)} {
		kv, st, err := s.Load(tokens, n, from, buf)
		if err != nil {
			t.Fatalf("load %d tokens from block %d: %v", n, from, err)
		}
		if !slices.Equal(kv, want) || !slices.Equal(st, wantState) {
			t.Fatalf("load %d tokens from block %d: %d bytes of KV (want %d), state %v (want %v)", n, from, len(kv), len(want), st, wantState)
		}
		if roomy := cap(buf) >= need; roomy && (len(kv) > 0 && &kv[0] != &buf[0] || len(st) > 0 && &st[0] != &buf[len(want)]) {
			t.Fatalf("load %d tokens from block %d: a new buffer where the one given had room", n, from)
		}
	}
}

// Prefixes go in as chunks and tips, come back from host memory and from
// the directory after a restart, share their chunks, and a dense prefix
// resumes from its whole chunks alone.
func TestStoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	dev := &fakeKV{bb: 8, blocks: map[int][]byte{}}
	s := testStore(t, dir, 3, 1<<20)
	C := s.ChunkTokens()
	conv := randTokens(rng, 2*C+10)
	state := []byte{1, 2, 3}
	if n, err := s.Put(conv, dev.compute(conv, 4), state, dev.read); err != nil || n != 3 {
		t.Fatalf("put: %d entries, %v", n, err)
	}
	// The next turn adds only its new chunk and tip.
	next := append(slices.Clone(conv), randTokens(rng, C)...)
	if n, err := s.Put(next, dev.compute(next, 4), []byte{4, 5, 6}, dev.read); err != nil || n != 2 {
		t.Fatalf("put of the next turn: %d entries, %v", n, err)
	}
	for _, needState := range []bool{true, false} {
		if got := s.Match(append(slices.Clone(conv), 7, 7), 1000, needState); got != len(conv) {
			t.Fatalf("match (state %v): %d, want %d", needState, got, len(conv))
		}
	}
	if got := s.Match(conv, len(conv)-1, true); got != 0 {
		t.Fatalf("match short of the tip: %d with state", got)
	}
	if got := s.Match(conv, len(conv)-1, false); got != 2*C {
		t.Fatalf("match short of the tip: %d without state, want the chunks' %d", got, 2*C)
	}
	checkLoad(t, s, conv, len(conv), 0, state)
	checkLoad(t, s, conv, len(conv), 5, state)
	checkLoad(t, s, conv, len(conv), (len(conv)+3)/4, state) // the state alone
	checkLoad(t, s, next, len(next), 2*C/4, []byte{4, 5, 6})
	checkLoad(t, s, conv, 2*C, 3, nil)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// After a restart, from the files.
	s = testStore(t, dir, 3, 1<<20)
	defer s.Close()
	if st := s.Stats(); st.Entries != 5 || st.RAMBytes != 0 || st.DiskBytes == 0 {
		t.Fatalf("reopened: %+v", st)
	}
	if got := s.Match(next, len(next), true); got != len(next) {
		t.Fatalf("match after a restart: %d, want %d", got, len(next))
	}
	checkLoad(t, s, next, len(next), 0, []byte{4, 5, 6})
	checkLoad(t, s, conv, len(conv), 1, state)
	// Another model's store sees none of it.
	other, err := OpenStore(StoreOptions{Dir: t.TempDir(), DiskBytes: 1 << 20, Model: "other", BlockSize: 4, BlockBytes: 8, StateBytes: 3, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if got := other.Match(next, len(next), false); got != 0 {
		t.Fatalf("another model matched %d tokens", got)
	}
}

// A second process cannot open a directory in use.
func TestStoreLock(t *testing.T) {
	dir := t.TempDir()
	s := testStore(t, dir, 0, 1<<20)
	if _, err := OpenStore(StoreOptions{Dir: dir, DiskBytes: 1, BlockSize: 4, BlockBytes: 8}); !errors.Is(err, ErrStoreBusy) {
		t.Fatalf("second open: %v", err)
	}
	s.Close()
	s2 := testStore(t, dir, 0, 1<<20)
	s2.Close()
}

// A file that fails its checksum, a truncated file and a crash's
// temporary file never load: the first is dropped at load, the others at
// Open.
func TestStoreCorruption(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(3, 4))
	dev := &fakeKV{bb: 8, blocks: map[int][]byte{}}
	s := testStore(t, dir, 2, 1<<20)
	C := s.ChunkTokens()
	conv := randTokens(rng, 3*C+5)
	if _, err := s.Put(conv, dev.compute(conv, 4), []byte{9, 9}, dev.read); err != nil {
		t.Fatal(err)
	}
	s.Close()
	files := entryFiles(t, dir)
	if len(files) != 4 {
		t.Fatalf("%d files, want 3 chunks and a tip", len(files))
	}
	// Flip a byte in the middle chunk's KV.
	var mid string
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if h, _ := parseHeader(b, int64(len(b))); h.kind == kindChunk && h.start == C {
			mid = f
			b[len(b)-20] ^= 1
			os.WriteFile(f, b, 0o600)
		}
	}
	// A crash mid-write, and a file cut short.
	os.WriteFile(filepath.Join(filepath.Dir(mid), "tmp-c-0000000000000001-123"), []byte("partial"), 0o600)
	cut := filepath.Join(filepath.Dir(mid), entryName(entryID{kindChunk, 77}))
	b, _ := os.ReadFile(mid)
	os.WriteFile(cut, b[:len(b)/2], 0o600)

	s = testStore(t, dir, 2, 1<<20)
	defer s.Close()
	for _, f := range entryFiles(t, dir) {
		if strings.Contains(f, "tmp-") || f == cut {
			t.Errorf("%s survived Open", f)
		}
	}
	if got := s.Match(conv, len(conv), true); got != len(conv) {
		t.Fatalf("match %d (the corruption is found by loading)", got)
	}
	if _, _, err := s.Load(conv, len(conv), 0, nil); err == nil {
		t.Fatal("a corrupt chunk loaded")
	}
	if st := s.Stats(); st.Corrupted != 1 || st.Entries != 1 {
		t.Fatalf("after a failed load: %+v (want the bad chunk, its successor and the tip dropped)", st)
	}
	if got := s.Match(conv, len(conv), false); got != C {
		t.Fatalf("match after the drop: %d, want the first chunk's %d", got, C)
	}
}

func entryFiles(t *testing.T, dir string) []string {
	var files []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() != ".lock" {
			files = append(files, p)
		}
		return nil
	})
	return files
}

func dirBytes(t *testing.T, dir string) int64 {
	var n int64
	for _, f := range entryFiles(t, dir) {
		if fi, err := os.Stat(f); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// Many conversations through a small budget: the directory never exceeds
// it, the least recently used go first, and what remains loads.
func TestStoreBudget(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(5, 6))
	dev := &fakeKV{bb: 8, blocks: map[int][]byte{}}
	const budget = 20 << 10
	s := testStore(t, dir, 16, budget)
	C := s.ChunkTokens()
	var convs [][]int32
	for i := range 60 {
		conv := randTokens(rng, C/2+rng.IntN(4*C))
		if i%3 == 1 {
			conv = append(slices.Clone(convs[i-1]), conv[:10]...) // a next turn
		}
		convs = append(convs, conv)
		if _, err := s.Put(conv, dev.compute(conv, 4), make([]byte, 16), dev.read); err != nil {
			t.Fatal(err)
		}
		s.Close() // waits for the writer
		if n := dirBytes(t, dir); n > budget {
			t.Fatalf("conversation %d: the directory holds %d bytes, over its budget of %d", i, n, budget)
		}
		s = testStore(t, dir, 16, budget)
	}
	defer s.Close()
	last := convs[len(convs)-1]
	if got := s.Match(last, len(last), true); got != len(last) {
		t.Fatalf("the last conversation matched %d of %d tokens", got, len(last))
	}
	checkLoad(t, s, last, len(last), 0, make([]byte, 16))
	if got := s.Match(convs[0], len(convs[0]), false); got != 0 {
		t.Fatalf("the first conversation still matches %d tokens", got)
	}
	if st := s.Stats(); st.DiskBytes > budget || st.DiskBytes != dirBytes(t, dir) {
		t.Fatalf("stats %+v, directory %d bytes", st, dirBytes(t, dir))
	}
}

// A prefix larger than the memory budget goes to the directory whole: Put
// waits for the writer instead of dropping what it has not written, and
// memory stays within about an entry of the budget.
func TestStoreBackpressure(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(7, 8))
	dev := &fakeKV{bb: 8, blocks: map[int][]byte{}}
	s := testStoreModel(t, dir, "m")
	conv := randTokens(rng, 40*s.ChunkTokens()+3)
	if n, err := s.Put(conv, dev.compute(conv, 4), nil, dev.read); err != nil || n != 41 {
		t.Fatalf("put: %d entries, %v", n, err)
	}
	if st := s.Stats(); st.RAMBytes > 600+2*500 || st.Dropped != 0 {
		t.Fatalf("after the put: %+v", st)
	}
	s.Close()
	s = testStoreModel(t, dir, "m")
	defer s.Close()
	if got := s.Match(conv, len(conv), false); got != len(conv) {
		t.Fatalf("from the directory: %d of %d tokens", got, len(conv))
	}
}

// testStoreModel opens a store of 600 bytes of memory: about one entry.
func testStoreModel(t *testing.T, dir, model string) *Store {
	t.Helper()
	s, err := OpenStore(StoreOptions{Dir: dir, DiskBytes: 1 << 20, RAMBytes: 600, Model: model, BlockSize: 4, BlockBytes: 8, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// FuzzStoreEntry: any bytes are refused or read as an entry whose parts
// encode to those bytes again, the same from its file, and read with fewer
// KV bytes wanted (skip) its last ones.
func FuzzStoreEntry(f *testing.F) {
	h := fileHeader{kind: kindTip, start: 64, n: 3, blocks: 2, blockBytes: 8, stateBytes: 2, key: 5, parent: 6, model: 7}
	f.Add(encodeEntry(&h, []int32{1, 2, 3}, []byte("0123456789abcdef"), []byte{1, 2}), uint8(8))
	f.Add([]byte(fileMagic), uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, skip uint8) {
		path := filepath.Join(t.TempDir(), "entry")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		var kv []byte
		if len(b) >= headerSize {
			if h, err := parseHeader(b, int64(len(b))); err == nil {
				kv = make([]byte, h.blocks*h.blockBytes)
			}
		}
		h, toks, st, err := loadEntry(b, "", kv, nil)
		if _, _, _, ferr := loadEntry(nil, path, kv, nil); (err == nil) != (ferr == nil) {
			t.Fatalf("from memory: %v; from its file: %v", err, ferr)
		}
		if err != nil {
			return
		}
		if !slices.Equal(encodeEntry(h, toks, kv, st), b) {
			t.Fatalf("the parts of %+v do not encode to the bytes read", h)
		}
		dst := make([]byte, len(kv)-min(int(skip), len(kv)))
		if _, _, _, err := loadEntry(nil, path, dst, nil); err != nil || !slices.Equal(dst, kv[len(kv)-len(dst):]) {
			t.Fatalf("the file's last %d KV bytes: %v", len(dst), err)
		}
	})
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// BenchmarkStoreLoad restores, from the directory after a restart, a
// 21.6K-token conversation of the Qwen3-Next shape with 12 layers (3 of
// attention: 96 KB a 16-token block; 9 DeltaNet states: 19 MB), the
// 153 MB a restarted daemon reads and checks before its next turn.
func BenchmarkStoreLoad(b *testing.B) {
	const bs, bb, stateBytes, n = 16, 96 << 10, 19 << 20, 21600
	dir := b.TempDir()
	opts := StoreOptions{Dir: dir, DiskBytes: 1 << 30, RAMBytes: 1 << 30, Model: "bench", BlockSize: bs, BlockBytes: bb, StateBytes: stateBytes, Logger: quiet()}
	s, err := OpenStore(opts)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := randTokens(rng, n)
	blocks := make([]int32, (n+bs-1)/bs)
	for i := range blocks {
		blocks[i] = int32(i)
	}
	fill := func(ids []int, dst []byte) error {
		for i := range dst {
			dst[i] = byte(i)
		}
		return nil
	}
	if _, err := s.Put(tokens, blocks, make([]byte, stateBytes), fill); err != nil {
		b.Fatal(err)
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	if s, err = OpenStore(opts); err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if got := s.Match(tokens, n, true); got != n {
		b.Fatalf("match %d of %d tokens", got, n)
	}
	b.SetBytes(int64(len(blocks)*bb + stateBytes))
	var buf []byte
	for b.Loop() {
		kv, _, err := s.Load(tokens, n, 0, buf)
		if err != nil {
			b.Fatal(err)
		}
		buf = kv // the engine's staging buffer
	}
}
