package model

import (
	"math"
	"strings"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/backend/cpu"
	"github.com/kiln-llm/kiln/model/reference"
)

// loadFixture loads a fixture on the CPU backend with a cache of 64 blocks
// and the given state slots.
func loadFixture(t *testing.T, name string, slots int) *Model {
	t.Helper()
	return loadFixtureOn(t, cpu.New(cpu.Options{}), name, slots)
}

// capturing is the CPU backend saying that it replays graphs, so that the
// model pads decode batches to buckets as it does for the GPU.
type capturing struct{ *cpu.Backend }

func (capturing) CapturesGraphs() bool { return true }

func loadFixtureOn(t *testing.T, b backend.Backend, name string, slots int) *Model {
	t.Helper()
	m, err := Load(fixtureDir(name), b, Options{})
	if err != nil {
		t.Fatal(err)
	}
	before := m.SlotBytes()
	if err := m.AllocCache(CacheSpec{Blocks: 64, BlockSize: testBlockSize, Slots: slots}); err != nil {
		t.Fatal(err)
	}
	// The engine sizes snapshots before allocating; the backend must agree.
	if m.Hybrid() && (before == 0 || before != m.state.SlotBytes()) {
		t.Fatalf("%s: SlotBytes %d before AllocCache, backend says %d", name, before, m.state.SlotBytes())
	}
	return m
}

func maxDiff(a, b []float32) float64 {
	d := 0.0
	for i := range a {
		d = math.Max(d, math.Abs(float64(a[i]-b[i])))
	}
	return d
}

// stepTol bounds the difference between two computations of the same
// logits that may take different paths (a DeltaNet prompt chunked or token
// by token, a sequence alone or in a batch).
const stepTol = 2e-4

// TestMixedBatch runs a sequence alone, then the same sequence inside a
// batch that also prefills and decodes other sequences, and checks that its
// logits do not change. It covers a prefill chunk continued from a cached
// prefix, and, on a backend that captures graphs, the decode bucket padding
// (3 decoding sequences padded to 4, the padding rows sharing a spare block
// and slot), on the fused path and step by step.
func TestMixedBatch(t *testing.T) {
	for _, name := range []string{"qwen3", "qwen3next", "qwen35moe", "qwen3/padded", "qwen3next/padded", "qwen35moe/steps", "qwen3/padded/steps", "qwen3next/padded/steps"} {
		t.Run(name, func(t *testing.T) {
			var be backend.Backend = cpu.New(cpu.Options{})
			name, steps := strings.CutSuffix(name, "/steps")
			name, padded := strings.CutSuffix(name, "/padded")
			if padded {
				be = capturing{cpu.New(cpu.Options{})}
			}
			if steps {
				be = backend.Unfused(be)
			}
			m := loadFixtureOn(t, be, name, 8)
			defer m.Close()
			defer func() {
				if padded != (len(m.decode) > 0) {
					t.Errorf("padded %v, but %d decode buckets were used", padded, len(m.decode))
				}
			}()
			b := m.Backend()
			ref := readReference(t, fixtureDir(name))
			long := ref.Prompts[2].IDs // > 200 tokens
			short := ref.Prompts[1].IDs

			// Alone: prefill 150 tokens, then a 70-token chunk (crosses the
			// 64-token DeltaNet chunk), then one decode step.
			alone := Seq{Tokens: long[:150], Blocks: blocksFor(0, 230, testBlockSize), Slot: 0}
			if _, err := m.Forward([]Seq{alone}); err != nil {
				t.Fatal(err)
			}
			alone.Pos, alone.Tokens, alone.Logits = 150, long[150:220], AllLogits
			l, err := m.Forward([]Seq{alone})
			if err != nil {
				t.Fatal(err)
			}
			chunkAlone := readRows(t, b, l)
			alone.Pos, alone.Tokens, alone.Logits = 220, long[220:221], LastLogits
			l, err = m.Forward([]Seq{alone})
			if err != nil {
				t.Fatal(err)
			}
			decodeAlone := readRows(t, b, l)[0]

			// Batched: the same steps in slot 1 / other blocks, beside other
			// sequences prefilling and decoding.
			seq := Seq{Tokens: long[:150], Blocks: blocksFor(20, 230, testBlockSize), Slot: 1}
			other := Seq{Tokens: short, Blocks: blocksFor(40, 64, testBlockSize), Slot: 2, Logits: LastLogits}
			if _, err := m.Forward([]Seq{other, seq}); err != nil {
				t.Fatal(err)
			}
			seq.Pos, seq.Tokens, seq.Logits = 150, long[150:220], AllLogits
			third := Seq{Tokens: long[:5], Blocks: blocksFor(50, 40, testBlockSize), Slot: 3, Logits: AllLogits}
			other.Pos, other.Tokens = len(short), []int32{7}
			l, err = m.Forward([]Seq{other, seq, third})
			if err != nil {
				t.Fatal(err)
			}
			rows := readRows(t, b, l)
			if len(rows) != 1+70+5 {
				t.Fatalf("%d logit rows, want 76", len(rows))
			}
			for i := range 70 {
				if d := maxDiff(rows[1+i], chunkAlone[i]); d > stepTol {
					t.Fatalf("chunk position %d differs from the sequence run alone by %.3g", i, d)
				}
			}
			// Decode step of three sequences: bucket 4 with one padding sequence.
			seq.Pos, seq.Tokens, seq.Logits = 220, long[220:221], LastLogits
			other.Pos, other.Tokens = len(short)+1, []int32{9}
			third.Pos, third.Tokens, third.Logits = 5, []int32{11}, LastLogits
			l, err = m.Forward([]Seq{third, seq, other})
			if err != nil {
				t.Fatal(err)
			}
			rows = readRows(t, b, l)
			if len(rows) != 3 {
				t.Fatalf("decode step returned %d rows, want 3", len(rows))
			}
			if d := maxDiff(rows[1], decodeAlone); d > stepTol {
				t.Fatalf("decode in a batch of 3 differs from alone by %.3g", d)
			}
		})
	}
}

// TestSaveRestoreSlot continues a hybrid sequence after saving its state,
// clobbering the slot and restoring it, and compares with an uninterrupted
// run; CopySlot and CopyBlock then fork the sequence into another slot.
func TestSaveRestoreSlot(t *testing.T) {
	for _, name := range []string{"qwen3next", "qwen35"} {
		t.Run(name, func(t *testing.T) {
			m := loadFixture(t, name, 4)
			defer m.Close()
			b := m.Backend()
			ids := readReference(t, fixtureDir(name)).Prompts[2].IDs
			blocks := blocksFor(0, 200, testBlockSize)
			run := func(s Seq) []float32 {
				t.Helper()
				l, err := m.Forward([]Seq{s})
				if err != nil {
					t.Fatal(err)
				}
				return readRows(t, b, l)[0]
			}
			// Uninterrupted: 100 tokens then 40 more.
			run(Seq{Tokens: ids[:100], Blocks: blocks, Slot: 0, Logits: LastLogits})
			want := run(Seq{Tokens: ids[100:140], Pos: 100, Blocks: blocks, Slot: 0, Logits: LastLogits})

			// Interrupted: save after 100 tokens, overwrite the slot with
			// another sequence's state, restore, continue.
			run(Seq{Tokens: ids[:100], Blocks: blocks, Slot: 1, Logits: LastLogits})
			saved := make([]byte, m.SlotBytes())
			if err := m.SaveSlot(1, saved); err != nil {
				t.Fatal(err)
			}
			run(Seq{Tokens: ids[50:90], Blocks: blocksFor(20, 40, testBlockSize), Slot: 1, Logits: LastLogits})
			m.RestoreSlot(1, saved)
			got := run(Seq{Tokens: ids[100:140], Pos: 100, Blocks: blocks, Slot: 1, Logits: LastLogits})
			if d := maxDiff(got, want); d > stepTol {
				t.Fatalf("continued after restore: logits differ by %.3g", d)
			}

			// Fork: copy slot 0's state at 140 tokens into slot 2 and its
			// partial last block into a fresh block, then decode both.
			m.CopySlot(2, 0)
			fork := append([]int32(nil), blocks[:8]...)
			last := 140 / testBlockSize
			m.CopyBlock(40, int(blocks[last]))
			fork = append(fork, 40, 41, 42)
			a := run(Seq{Tokens: []int32{5}, Pos: 140, Blocks: blocks, Slot: 0, Logits: LastLogits})
			c := run(Seq{Tokens: []int32{5}, Pos: 140, Blocks: fork, Slot: 2, Logits: LastLogits})
			if d := maxDiff(a, c); d > stepTol {
				t.Fatalf("forked sequence differs by %.3g", d)
			}
		})
	}
}

// TestFusedAndSteps runs every fixture's long prompt in two chunks and a
// decode step beside another sequence's prefill, through the backend's
// fused operations and through the model files' steps, and compares the
// logits of every position: the two paths compute the same things in the
// same float32 operations on the CPU.
func TestFusedAndSteps(t *testing.T) {
	for _, name := range reference.Fixtures {
		t.Run(name, func(t *testing.T) {
			ref := readReference(t, fixtureDir(name))
			long, short := ref.Prompts[2].IDs, ref.Prompts[1].IDs
			var got [2][][]float32
			for i, path := range paths {
				m := loadFixtureOn(t, path.backend(), name, 2)
				seq := Seq{Tokens: long[:150], Blocks: blocksFor(0, 230, testBlockSize), Logits: AllLogits}
				other := Seq{Tokens: short, Blocks: blocksFor(20, 64, testBlockSize), Slot: 1, Logits: AllLogits}
				for _, step := range [][]Seq{{seq}, {other, {Tokens: long[150:220], Pos: 150, Blocks: seq.Blocks, Logits: AllLogits}},
					{{Tokens: long[220:221], Pos: 220, Blocks: seq.Blocks, Logits: LastLogits}, {Tokens: []int32{7}, Pos: len(short), Blocks: other.Blocks, Slot: 1, Logits: LastLogits}}} {
					l, err := m.Forward(step)
					if err != nil {
						t.Fatal(err)
					}
					got[i] = append(got[i], readRows(t, m.Backend(), l)...)
				}
				m.Close()
			}
			for r := range got[0] {
				if e := reference.MaxError(got[1][r], got[0][r]); e > 1e-6 {
					t.Fatalf("logit row %d: steps differ from fused by %.3g of max(1, max|logit|)", r, e)
				}
			}
		})
	}
}

// TestDeltaNetPaths runs a prompt that is not a multiple of the 64-token
// chunk through the hybrid fixtures twice, once with the chunked DeltaNet
// algorithm and once token by token (Chunk 0), and compares the logits of
// every position.
func TestDeltaNetPaths(t *testing.T) {
	for _, name := range []string{"qwen3next", "qwen35", "qwen35moe"} {
		t.Run(name, func(t *testing.T) {
			ids := readReference(t, fixtureDir(name)).Prompts[2].IDs // 260 tokens
			all := func(chunk int) [][]float32 {
				m, err := Load(fixtureDir(name), cpu.New(cpu.Options{}), Options{})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				m.dnSpec.Chunk = chunk
				if err := m.AllocCache(CacheSpec{Blocks: 32, BlockSize: testBlockSize, Slots: 1}); err != nil {
					t.Fatal(err)
				}
				l, err := m.Forward([]Seq{{Tokens: ids, Blocks: blocksFor(0, len(ids), testBlockSize), Logits: AllLogits}})
				if err != nil {
					t.Fatal(err)
				}
				return readRows(t, m.Backend(), l)
			}
			chunked, recurrent := all(64), all(0)
			for pos := range chunked {
				scale := 0.0
				for _, v := range recurrent[pos] {
					scale = math.Max(scale, math.Abs(float64(v)))
				}
				if d := maxDiff(chunked[pos], recurrent[pos]); d > 1e-4*math.Max(1, scale) {
					t.Fatalf("position %d: chunked and recurrent logits differ by %.3g (scale %.3g)", pos, d, scale)
				}
			}
		})
	}
}

func TestForwardErrors(t *testing.T) {
	m, err := Load(fixtureDir("qwen35"), cpu.New(cpu.Options{}), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.Forward([]Seq{{Tokens: []int32{1}, Blocks: []int32{0}}}); err == nil || !strings.Contains(err.Error(), "before AllocCache") {
		t.Fatalf("forward without a cache: %v", err)
	}
	if err := m.AllocCache(CacheSpec{Blocks: 4, BlockSize: 16}); err == nil || !strings.Contains(err.Error(), "Slots > 0") {
		t.Fatalf("hybrid cache without slots: %v", err)
	}
	if err := m.AllocCache(CacheSpec{Blocks: 4, BlockSize: 16, Slots: 2}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		seq  Seq
		want string
	}{
		{Seq{Blocks: []int32{0}}, "no new tokens"},
		{Seq{Tokens: []int32{512}, Blocks: []int32{0}}, "outside the vocabulary"},
		{Seq{Tokens: make([]int32, 17), Blocks: []int32{0}}, "cannot hold 17 tokens"},
		{Seq{Tokens: []int32{1}, Blocks: []int32{4}}, "block 4 outside the cache"},
		{Seq{Tokens: []int32{1}, Blocks: []int32{0}, Slot: 2}, "state slot 2 outside"},
		{Seq{Tokens: []int32{1}, Pos: -1, Blocks: []int32{0}}, "negative position"},
	}
	for _, c := range cases {
		if _, err := m.Forward([]Seq{c.seq}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want %q", c.seq, err, c.want)
		}
	}
	if _, err := m.Forward(nil); err == nil {
		t.Error("forward of no sequences succeeded")
	}
}

// TestBF16KVCache runs the long prompt of a fixture with a bf16 KV cache:
// the logits move by about bf16's precision, no more.
func TestBF16KVCache(t *testing.T) {
	ids := readReference(t, fixtureDir("qwen3")).Prompts[2].IDs
	run := func(dt backend.DType) []float32 {
		m, err := Load(fixtureDir("qwen3"), cpu.New(cpu.Options{}), Options{KVDType: dt})
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if want := int64(3 * 2 * 2 * 16 * dt.Size()); m.KVBytesPerToken() != want {
			t.Fatalf("KVBytesPerToken %d, want %d", m.KVBytesPerToken(), want)
		}
		return lastLogits(t, m, ids)
	}
	f32, bf16 := run(backend.F32), run(backend.BF16)
	scale := 0.0
	for _, v := range f32 {
		scale = math.Max(scale, math.Abs(float64(v)))
	}
	if d := maxDiff(f32, bf16); d == 0 || d > 2e-2*scale {
		t.Fatalf("bf16 KV cache moved the logits by %.3g (scale %.3g)", d, scale)
	}
	if argmax(f32) != argmax(bf16) {
		t.Fatalf("bf16 KV cache changed the greedy token")
	}
	if _, err := Load(fixtureDir("qwen3"), cpu.New(cpu.Options{}), Options{KVDType: backend.I32}); err == nil {
		t.Fatal("an i32 KV cache was accepted")
	}
}
