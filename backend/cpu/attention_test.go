package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/kiln-llm/kiln/backend"
)

// refAttention computes, in float64, the attention output of token pos of a
// sequence whose fused projections for positions 0..pos are rows.
func refAttention(rows [][]float64, pos int, spec *backend.AttnSpec, qn, kn []float64) []float64 {
	H, KH, hd, rd := spec.Heads, spec.KVHeads, spec.HeadDim, spec.RotaryDim
	qs := hd
	if spec.Gated {
		qs = 2 * hd
	}
	norm := func(x, w []float64) []float64 {
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		s := 1 / math.Sqrt(ss/float64(len(x))+float64(spec.NormEps))
		out := make([]float64, len(x))
		for i, v := range x {
			g := w[i]
			if spec.UnitOffsetNorm {
				g++
			}
			out[i] = v * s * g
		}
		return out
	}
	rope := func(x []float64, p int) {
		half := rd / 2
		for i := range half {
			a := float64(p) * float64(spec.Rope.InvFreq[i])
			c, s := math.Cos(a)*float64(spec.Rope.AttnFactor), math.Sin(a)*float64(spec.Rope.AttnFactor)
			x1, x2 := x[i], x[i+half]
			x[i], x[i+half] = x1*c-x2*s, x2*c+x1*s
		}
	}
	out := make([]float64, H*hd)
	for h := range H {
		kh := h / (H / KH)
		row := rows[pos]
		q := norm(row[h*qs:h*qs+hd], qn)
		rope(q, pos)
		scores := make([]float64, pos+1)
		vs := make([][]float64, pos+1)
		m := math.Inf(-1)
		for j := 0; j <= pos; j++ {
			k := norm(rows[j][H*qs+kh*hd:H*qs+(kh+1)*hd], kn)
			rope(k, j)
			var s float64
			for i := range hd {
				s += q[i] * k[i]
			}
			scores[j] = s * float64(spec.Scale)
			m = max(m, scores[j])
			vs[j] = rows[j][H*qs+KH*hd+kh*hd : H*qs+KH*hd+(kh+1)*hd]
		}
		var sum float64
		for j := range scores {
			scores[j] = math.Exp(scores[j] - m)
			sum += scores[j]
		}
		for j := range scores {
			for i := range hd {
				out[h*hd+i] += scores[j] / sum * vs[j][i]
			}
		}
		if spec.Gated {
			for i := range hd {
				out[h*hd+i] *= sig64(row[h*qs+hd+i])
			}
		}
	}
	return out
}

// seqStep is one sequence's part of a test step: n new tokens.
type seqStep struct{ seq, n int }

// attnCase runs steps of a scheduled batch through Attention and returns
// the outputs of every token of every sequence, in sequence order.
type attnCase struct {
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
		b.Attention(o, tensorF32(b, qkv, T, c.spec.QKVWidth()), w, &c.spec, kv, 1)
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
