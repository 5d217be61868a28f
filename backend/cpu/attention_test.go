package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/kiln-llm/kiln/backend"
)

// refNorm returns x * rsqrt(mean(x^2) + eps) * w in float64, with (1 + w)
// when unit.
func refNorm(x, w []float64, eps float32, unit bool) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	s := 1 / math.Sqrt(ss/float64(len(x))+float64(eps))
	out := make([]float64, len(x))
	for i, v := range x {
		g := w[i]
		if unit {
			g++
		}
		out[i] = v * s * g
	}
	return out
}

// refRope rotates the first 2*len(r.InvFreq) dims of one head x at
// position p in float64, from the angle rounded to float32 (the contract,
// as transformers computes it).
func refRope(x []float64, p int, r *backend.Rope) {
	half := len(r.InvFreq)
	for i := range half {
		a := float64(float32(p) * r.InvFreq[i])
		c, s := math.Cos(a)*float64(r.AttnFactor), math.Sin(a)*float64(r.AttnFactor)
		x1, x2 := x[i], x[i+half]
		x[i], x[i+half] = x1*c-x2*s, x2*c+x1*s
	}
}

// refAttend computes in float64 the attention of the query heads q [H*hd]
// over keys and values [n][KH*hd] (positions 0..n-1).
func refAttend(q []float64, keys, values [][]float64, H, KH, hd int, scale float32) []float64 {
	out := make([]float64, H*hd)
	for h := range H {
		kh := h / (H / KH)
		scores := make([]float64, len(keys))
		m := math.Inf(-1)
		for j, k := range keys {
			var s float64
			for i := range hd {
				s += q[h*hd+i] * k[kh*hd+i]
			}
			scores[j] = s * float64(scale)
			m = max(m, scores[j])
		}
		var sum float64
		for j := range scores {
			scores[j] = math.Exp(scores[j] - m)
			sum += scores[j]
		}
		for j, v := range values {
			for i := range hd {
				out[h*hd+i] += scores[j] / sum * v[kh*hd+i]
			}
		}
	}
	return out
}

// refAttention computes, in float64, the attention output of token pos of a
// sequence whose fused projections for positions 0..pos are rows: the
// steps of an attention layer one by one.
func refAttention(rows [][]float64, pos int, spec *backend.AttnSpec, qn, kn []float64) []float64 {
	H, KH, hd := spec.Heads, spec.KVHeads, spec.HeadDim
	qs := hd
	if spec.Gated {
		qs = 2 * hd
	}
	row := rows[pos]
	var q []float64
	for h := range H {
		qh := refNorm(row[h*qs:h*qs+hd], qn, spec.NormEps, spec.UnitOffsetNorm)
		refRope(qh, pos, &spec.Rope)
		q = append(q, qh...)
	}
	var keys, values [][]float64
	for j := 0; j <= pos; j++ {
		var k []float64
		for kh := range KH {
			kj := refNorm(rows[j][H*qs+kh*hd:H*qs+(kh+1)*hd], kn, spec.NormEps, spec.UnitOffsetNorm)
			refRope(kj, j, &spec.Rope)
			k = append(k, kj...)
		}
		keys = append(keys, k)
		values = append(values, rows[j][H*qs+KH*hd:H*qs+2*KH*hd])
	}
	out := refAttend(q, keys, values, H, KH, hd, spec.Scale)
	if spec.Gated {
		for h := range H {
			for i := range hd {
				out[h*hd+i] *= sig64(row[h*qs+hd+i])
			}
		}
	}
	return out
}

// seqStep is one sequence's part of a test step: n new tokens.
type seqStep struct{ seq, n int }

// attnCase runs steps of a scheduled batch through Attention (or layer,
// when set) and returns the outputs of every token of every sequence, in
// sequence order.
type attnCase struct {
	layer   func(b *Backend, out, qkv backend.Tensor, kv backend.KVCache)
	spec    backend.AttnSpec
	kvType  backend.DType
	lengths []int         // final length of each sequence
	steps   [][]seqStep   // the schedule
	rows    [][][]float64 // per sequence, per position: the qkv row
	qn, kn  []float64
}

func newAttnCase(seed uint64, spec backend.AttnSpec, lengths []int, steps [][]seqStep) *attnCase {
	r := newRand(seed)
	c := &attnCase{spec: spec, lengths: lengths, steps: steps}
	for _, n := range lengths {
		var rows [][]float64
		for range n {
			rows = append(rows, toF64(toF32(randVec(r, spec.QKVWidth(), 1))))
		}
		c.rows = append(c.rows, rows)
	}
	c.qn, c.kn = randVec(r, spec.HeadDim, 0.2), randVec(r, spec.HeadDim, 0.2)
	if !spec.UnitOffsetNorm {
		for i := range c.qn {
			c.qn[i]++
			c.kn[i]++
		}
	}
	return c
}

// run executes the schedule; blocks come from a shuffled pool so that every
// sequence's table is scattered.
func (c *attnCase) run(t *testing.T, b *Backend, seed uint64) [][][]float32 {
	const bs = 4
	r := newRand(seed)
	nblocks := 0
	for _, n := range c.lengths {
		nblocks += (n + bs - 1) / bs
	}
	nblocks += 3 // unused blocks
	kv, err := b.NewKVCache(backend.KVSpec{Layers: 2, Blocks: nblocks, BlockSize: bs, KVHeads: c.spec.KVHeads, HeadDim: c.spec.HeadDim, DType: c.kvType})
	if err != nil {
		t.Fatal(err)
	}
	perm := r.Perm(nblocks)
	tables := make([][]int32, len(c.lengths))
	for i, n := range c.lengths {
		for range (n + bs - 1) / bs {
			tables[i] = append(tables[i], int32(perm[0]))
			perm = perm[1:]
		}
	}
	w := backend.AttnWeights{QNorm: loadWeight(t, b, backend.F32, c.qn, c.spec.HeadDim), KNorm: loadWeight(t, b, backend.BF16, c.kn, c.spec.HeadDim)}
	pos := make([]int, len(c.lengths))
	out := make([][][]float32, len(c.lengths))
	for _, st := range c.steps {
		var batch backend.Batch
		var qkv []float64
		for _, s := range st {
			batch.Seqs = append(batch.Seqs, backend.SeqInfo{Pos: pos[s.seq], N: s.n, Blocks: tables[s.seq]})
			for i := range s.n {
				batch.Tokens = append(batch.Tokens, 0)
				qkv = append(qkv, c.rows[s.seq][pos[s.seq]+i]...)
			}
		}
		T := len(batch.Tokens)
		b.Begin(&batch)
		o := b.Alloc(backend.F32, T, c.spec.Heads*c.spec.HeadDim)
		if c.layer != nil {
			c.layer(b, o, tensorF32(b, qkv, T, c.spec.QKVWidth()), kv)
		} else {
			b.Attention(o, tensorF32(b, qkv, T, c.spec.QKVWidth()), w, &c.spec, kv, 1)
		}
		got := readF32(t, b, o)
		row := c.spec.Heads * c.spec.HeadDim
		for _, s := range st {
			for range s.n {
				out[s.seq] = append(out[s.seq], got[:row])
				got = got[row:]
			}
			pos[s.seq] += s.n
		}
	}
	return out
}

func attnSpec(heads, kvHeads, hd, rd int, gated, unit bool) backend.AttnSpec {
	inv := make([]float32, rd/2)
	for i := range inv {
		inv[i] = float32(math.Pow(10000, -2*float64(i)/float64(rd)))
	}
	return backend.AttnSpec{Heads: heads, KVHeads: kvHeads, HeadDim: hd, RotaryDim: rd, Gated: gated, NormEps: 1e-6,
		UnitOffsetNorm: unit, Scale: float32(1 / math.Sqrt(float64(hd))), Rope: backend.Rope{InvFreq: inv, AttnFactor: 1.1}}
}

func TestAttention(t *testing.T) {
	// Sequence 0 prefills in two chunks, 1 arrives later, 2 decodes token by
	// token beside the others' prefills.
	lengths := []int{37, 5, 12}
	steps := [][]seqStep{
		{{0, 30}, {2, 1}},
		{{2, 1}, {0, 7}, {1, 5}},
		{{2, 8}},
		{{1, 0}, {2, 1}},
		{{2, 1}},
	}
	for i, c := range []struct {
		heads, kvHeads, hd, rd int
		gated, unit            bool
		kv                     backend.DType
	}{
		{4, 2, 16, 16, false, false, backend.F32},
		{6, 2, 16, 4, true, true, backend.F32},
		{4, 4, 8, 8, false, false, backend.BF16},
		{8, 1, 16, 8, true, false, backend.BF16},
		{6, 3, 8, 8, false, false, backend.F32}, // decode tasks split kv heads unevenly
	} {
		name := fmt.Sprintf("h%d_kv%d_hd%d_rot%d_gated%v_unit%v_%v", c.heads, c.kvHeads, c.hd, c.rd, c.gated, c.unit, c.kv)
		t.Run(name, func(t *testing.T) {
			ac := newAttnCase(uint64(10+i), attnSpec(c.heads, c.kvHeads, c.hd, c.rd, c.gated, c.unit), lengths, steps)
			ac.kvType = c.kv
			got := ac.run(t, New(Options{Threads: 2}), uint64(i))
			tol := 2e-6
			if c.kv == backend.BF16 {
				tol = 2e-2 // keys and values are rounded to bf16 in the cache
			}
			for s := range lengths {
				for p := range lengths[s] {
					compare(t, fmt.Sprintf("seq %d pos %d", s, p), got[s][p], refAttention(ac.rows[s], p, &ac.spec, ac.qn, ac.kn), tol)
				}
			}
			// Each sequence alone gives bit-identical results.
			for s := range lengths {
				var alone [][]seqStep
				for _, st := range steps {
					for _, q := range st {
						if q.seq == s {
							alone = append(alone, []seqStep{q})
						}
					}
				}
				ac1 := *ac
				ac1.steps = alone
				got1 := ac1.run(t, New(Options{Threads: 1}), uint64(100+i))
				for p := range lengths[s] {
					compare(t, fmt.Sprintf("alone: seq %d pos %d", s, p), got1[s][p], toF64(got[s][p]), 0)
				}
			}
		})
	}
}

// TestAttentionLongPrefill takes the blocked path with several query blocks,
// a prefill continued at a non-zero position, and decodes after it.
func TestAttentionLongPrefill(t *testing.T) {
	for i, kvt := range []backend.DType{backend.F32, backend.BF16} {
		spec := attnSpec(4, 2, 32, 16, i == 1, false)
		ac := newAttnCase(uint64(60+i), spec, []int{150, 40}, [][]seqStep{{{0, 70}, {1, 17}}, {{0, 77}, {1, 1}}, {{0, 1}, {1, 22}}, {{0, 2}}})
		ac.kvType = kvt
		got := ac.run(t, New(Options{Threads: 2}), uint64(i))
		tol := 2e-6
		if kvt == backend.BF16 {
			tol = 2e-2
		}
		for s := range ac.lengths {
			for p := range ac.lengths[s] {
				compare(t, fmt.Sprintf("%v: seq %d pos %d", kvt, s, p), got[s][p], refAttention(ac.rows[s], p, &ac.spec, ac.qn, ac.kn), tol)
			}
		}
	}
}

// TestAttentionSpans splits decoding tokens into spans of one or two cache
// blocks, whose partial softmaxes are merged.
func TestAttentionSpans(t *testing.T) {
	defer func(v int) { decodeSpan = v }(decodeSpan)
	for _, span := range []int{1, 8} {
		decodeSpan = span
		t.Run(fmt.Sprint(span), func(t *testing.T) {
			TestAttention(t)
			TestAttentionLongPrefill(t)
		})
	}
}

func TestKVCacheCopyBlock(t *testing.T) {
	b := New(Options{})
	kvi, err := b.NewKVCache(backend.KVSpec{Layers: 1, Blocks: 4, BlockSize: 4, KVHeads: 1, HeadDim: 8, DType: backend.BF16})
	if err != nil {
		t.Fatal(err)
	}
	kv := kvi.(*kvCache)
	for i := range kv.k[0].b16 {
		kv.k[0].b16[i] = uint16(i)
		kv.v[0].b16[i] = uint16(3 * i)
	}
	kv.CopyBlock(3, 1)
	for i := range 32 {
		if kv.k[0].b16[96+i] != uint16(32+i) || kv.v[0].b16[96+i] != uint16(3*(32+i)) {
			t.Fatalf("CopyBlock: element %d not copied", i)
		}
	}
	if _, err := b.NewKVCache(backend.KVSpec{Layers: 1, Blocks: 4, BlockSize: 4, KVHeads: 1, HeadDim: 8, DType: backend.F16}); err == nil {
		t.Error("f16 kv cache accepted")
	}
}

// TestStoreKVAttend runs the plain steps' StoreKV and Attend on raw
// projections (no norms, no rotation) through the schedules of
// TestAttention, keys and values parted from the rows by SliceCols,
// against float64 attention.
func TestStoreKVAttend(t *testing.T) {
	lengths := []int{37, 5, 12}
	steps := [][]seqStep{{{0, 30}, {2, 1}}, {{2, 1}, {0, 7}, {1, 5}}, {{2, 8}}, {{1, 0}, {2, 1}}, {{2, 1}}}
	for i, kvt := range []backend.DType{backend.F32, backend.BF16} {
		spec := attnSpec(6, 2, 16, 16, false, false)
		H, KH, hd := spec.Heads, spec.KVHeads, spec.HeadDim
		ac := newAttnCase(uint64(70+i), spec, lengths, steps)
		ac.kvType = kvt
		ac.layer = func(b *Backend, out, qkv backend.Tensor, kv backend.KVCache) {
			T := qkv.Shape()[0]
			q, k, v := b.Alloc(backend.F32, T, H*hd), b.Alloc(backend.F32, T, KH*hd), b.Alloc(backend.F32, T, KH*hd)
			b.SliceCols(q, qkv, 0)
			b.SliceCols(k, qkv, H*hd)
			b.SliceCols(v, qkv, (H+KH)*hd)
			b.StoreKV(kv, 1, k, v)
			b.Attend(out, q, kv, 1, spec.Scale)
		}
		got := ac.run(t, New(Options{Threads: 2}), uint64(i))
		tol := 2e-6
		if kvt == backend.BF16 {
			tol = 2e-2
		}
		for s := range lengths {
			for p := range lengths[s] {
				rows := ac.rows[s][:p+1]
				var keys, values [][]float64
				for _, r := range rows {
					keys, values = append(keys, r[H*hd:(H+KH)*hd]), append(values, r[(H+KH)*hd:])
				}
				want := refAttend(rows[p][:H*hd], keys, values, H, KH, hd, spec.Scale)
				compare(t, fmt.Sprintf("%v: seq %d pos %d", kvt, s, p), got[s][p], want, tol)
			}
		}
	}
}

// TestRoPE rotates the heads of tokens at scattered positions against
// float64, a partial rotation included.
func TestRoPE(t *testing.T) {
	b := New(Options{Threads: 2})
	r := newRand(80)
	for _, c := range []struct{ heads, hd, rd int }{{3, 16, 16}, {2, 32, 8}} {
		spec := attnSpec(c.heads, c.heads, c.hd, c.rd, false, false)
		b.Begin(&backend.Batch{Tokens: make([]int32, 7), Seqs: []backend.SeqInfo{{Pos: 0, N: 3}, {Pos: 1000, N: 1}, {Pos: 40000, N: 3}}})
		W := c.heads * c.hd
		xv := randVec(r, 7*W, 1)
		x := tensorF32(b, xv, 7, W)
		b.RoPE(x, c.hd, &spec.Rope)
		want := toF64(toF32(xv))
		for tok, pos := range []int{0, 1, 2, 1000, 40000, 40001, 40002} {
			for h := range c.heads {
				refRope(want[tok*W+h*c.hd:tok*W+(h+1)*c.hd], pos, &spec.Rope)
			}
		}
		compare(t, fmt.Sprintf("rope %+v", c), readF32(t, b, x), want, 1e-5)
	}
}

// SaveBlocks writes each block's layers, K then V, in the cache's type;
// RestoreBlocks reads them back into other blocks.
func TestKVCacheSaveRestoreBlocks(t *testing.T) {
	b := New(Options{})
	for _, dt := range []backend.DType{backend.F32, backend.BF16} {
		spec := backend.KVSpec{Layers: 2, Blocks: 5, BlockSize: 4, KVHeads: 2, HeadDim: 4, DType: dt}
		kvi, err := b.NewKVCache(spec)
		if err != nil {
			t.Fatal(err)
		}
		kv := kvi.(*kvCache)
		n := spec.BlockSize * spec.KVHeads * spec.HeadDim
		for l := range 2 {
			for i := range 5 * n {
				v := float32(1000*l + i)
				kv.k[l].store(i, []float32{v})
				kv.v[l].store(i, []float32{-v})
			}
		}
		buf := make([]byte, 2*spec.BlockBytes())
		if err := kv.SaveBlocks([]int{3, 1}, buf); err != nil {
			t.Fatal(err)
		}
		// The first piece is layer 0's K of block 3, the second its V.
		at := func(p kvPool, off int) float32 {
			v := make([]float32, 1)
			p.load(v, off)
			return v[0]
		}
		if dt == backend.F32 && (binary.LittleEndian.Uint32(buf) != math.Float32bits(at(kv.k[0], 3*n)) ||
			binary.LittleEndian.Uint32(buf[4*n:]) != math.Float32bits(at(kv.v[0], 3*n))) {
			t.Fatalf("%v: saved %x, not layer 0's K then V of block 3", dt, buf[:8])
		}
		if err := kv.RestoreBlocks([]int{0, 4}, buf); err != nil {
			t.Fatal(err)
		}
		for l := range 2 {
			for i := range n {
				if at(kv.k[l], i) != at(kv.k[l], 3*n+i) || at(kv.v[l], 4*n+i) != at(kv.v[l], n+i) {
					t.Fatalf("%v: layer %d element %d not restored", dt, l, i)
				}
			}
		}
		if err := kv.SaveBlocks([]int{5}, buf[:spec.BlockBytes()]); err == nil {
			t.Errorf("%v: block 5 of 5 saved", dt)
		}
		if err := kv.RestoreBlocks([]int{0}, buf); err == nil {
			t.Errorf("%v: two blocks' bytes restored into one", dt)
		}
	}
}
