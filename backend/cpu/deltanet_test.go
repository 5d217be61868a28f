package cpu

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/kiln-llm/kiln/backend"
)

// dnCase is a DeltaNet layer with random weights and per-sequence inputs.
type dnCase struct {
	spec                backend.DeltaNetSpec
	convW, aLog, dtBias []float64
	mixed, ba           [][][]float64 // per sequence, per token
}

func newDNCase(seed uint64, spec backend.DeltaNetSpec, lengths []int) *dnCase {
	r := newRand(seed)
	CD, HV := spec.ConvDim(), spec.ValueHeads
	c := &dnCase{spec: spec, convW: randVec(r, CD*spec.ConvKernel, 0.5), dtBias: randVec(r, HV, 0.5)}
	for range HV {
		c.aLog = append(c.aLog, -3+3*r.Float64()) // decays exp(A) in [0.05, 1], as trained models have
	}
	for _, n := range lengths {
		var m, ba [][]float64
		for range n {
			m = append(m, toF64(toF32(randVec(r, CD, 1))))
			ba = append(ba, toF64(toF32(randVec(r, 2*HV, 1))))
		}
		c.mixed = append(c.mixed, m)
		c.ba = append(c.ba, ba)
	}
	return c
}

// refConv computes in float64 the conv outputs of all tokens of sequence
// s from an empty history: silu(conv1d(mixed)).
func (c *dnCase) refConv(s int) [][]float64 {
	sp := c.spec
	K, CD := sp.ConvKernel, sp.ConvDim()
	var outs [][]float64
	for t := range c.mixed[s] {
		x := make([]float64, CD)
		for ch := range CD {
			var acc float64
			for j := range K {
				if src := t - (K - 1) + j; src >= 0 {
					acc += c.convW[ch*K+j] * c.mixed[s][src][ch]
				}
			}
			x[ch] = silu64(acc)
		}
		outs = append(outs, x)
	}
	return outs
}

// ref computes in float64 the outputs of all tokens of sequence s from an
// empty state: conv, silu, L2 norms, and the recurrence token by token.
func (c *dnCase) ref(s int) [][]float64 {
	sp := c.spec
	HK, HV, dk, dv := sp.KeyHeads, sp.ValueHeads, sp.KeyDim, sp.ValueDim
	S := make([]float64, HV*dk*dv)
	var outs [][]float64
	for t, x := range c.refConv(s) {
		l2 := func(v []float64, scale float64) {
			var ss float64
			for _, e := range v {
				ss += e * e
			}
			inv := scale / math.Sqrt(ss+1e-6)
			for i := range v {
				v[i] *= inv
			}
		}
		for h := range HK {
			l2(x[h*dk:(h+1)*dk], 1/math.Sqrt(float64(dk)))
			l2(x[(HK+h)*dk:(HK+h+1)*dk], 1)
		}
		o := make([]float64, HV*dv)
		for h := range HV {
			kh := h / (HV / HK)
			q, k, v := x[kh*dk:(kh+1)*dk], x[(HK+kh)*dk:(HK+kh+1)*dk], x[2*HK*dk+h*dv:2*HK*dk+(h+1)*dv]
			beta := sig64(c.ba[s][t][h])
			a := c.ba[s][t][HV+h] + c.dtBias[h]
			g := -math.Exp(c.aLog[h]) * math.Log1p(math.Exp(a))
			Sh := S[h*dk*dv : (h+1)*dk*dv]
			for i := range Sh {
				Sh[i] *= math.Exp(g)
			}
			for col := range dv {
				var u float64
				for r := range dk {
					u += Sh[r*dv+col] * k[r]
				}
				delta := beta * (v[col] - u)
				var oc float64
				for r := range dk {
					Sh[r*dv+col] += k[r] * delta
					oc += Sh[r*dv+col] * q[r]
				}
				o[h*dv+col] = oc
			}
		}
		outs = append(outs, o)
	}
	return outs
}

// dnRun runs a schedule of steps through CausalConv1d and GatedDeltaRule
// with slot[s] as each sequence's slot, starting every sequence at
// position 0, and keeps each sequence's conv outputs and outputs.
type dnRun struct {
	b                   *Backend
	c                   *dnCase
	st                  backend.StateCache
	convW, aLog, dtBias backend.Tensor
	pos                 []int
	slots               []int
	conv, out           [][][]float32
}

func newDNRun(t *testing.T, b *Backend, c *dnCase, slots int, chunk int) *dnRun {
	spec := c.spec
	spec.Chunk = chunk
	st, err := b.NewStateCache(backend.StateSpec{Layers: 2, Slots: slots, DeltaNet: spec})
	if err != nil {
		t.Fatal(err)
	}
	r := &dnRun{b: b, c: c, st: st, pos: make([]int, len(c.mixed)), conv: make([][][]float32, len(c.mixed)), out: make([][][]float32, len(c.mixed))}
	r.c = &dnCase{}
	*r.c = *c
	r.c.spec = spec
	for i := range c.mixed {
		r.slots = append(r.slots, i%slots)
	}
	HV := spec.ValueHeads
	r.convW = loadWeight(t, b, backend.F32, append([]float64(nil), c.convW...), spec.ConvDim(), spec.ConvKernel)
	r.aLog = loadWeight(t, b, backend.F32, append([]float64(nil), c.aLog...), HV)
	r.dtBias = loadWeight(t, b, backend.F32, append([]float64(nil), c.dtBias...), HV)
	return r
}

func (r *dnRun) step(t *testing.T, st []seqStep, caps ...[]backend.Capture) {
	b, sp := r.b, r.c.spec
	var batch backend.Batch
	var mixed, ba []float64
	for i, s := range st {
		batch.Seqs = append(batch.Seqs, backend.SeqInfo{Pos: r.pos[s.seq], N: s.n, Slot: r.slots[s.seq]})
		if i < len(caps) {
			batch.Seqs[i].Captures = caps[i]
		}
		for i := range s.n {
			batch.Tokens = append(batch.Tokens, 0)
			mixed = append(mixed, r.c.mixed[s.seq][r.pos[s.seq]+i]...)
			ba = append(ba, r.c.ba[s.seq][r.pos[s.seq]+i]...)
		}
	}
	T := len(batch.Tokens)
	b.Begin(&batch)
	CD := sp.ConvDim()
	x, o := b.Alloc(backend.F32, T, CD), b.Alloc(backend.F32, T, sp.ValueHeads*sp.ValueDim)
	b.CausalConv1d(x, tensorF32(b, mixed, T, CD), r.convW, r.st, 1)
	conv := readF32(t, b, x)
	b.GatedDeltaRule(o, x, tensorF32(b, ba, T, 2*sp.ValueHeads), r.aLog, r.dtBias, &sp, r.st, 1)
	if !slices.Equal(readF32(t, b, x), conv) {
		t.Fatal("GatedDeltaRule modified its input")
	}
	got := readF32(t, b, o)
	row := sp.ValueHeads * sp.ValueDim
	for _, s := range st {
		for range s.n {
			r.conv[s.seq] = append(r.conv[s.seq], conv[:CD])
			r.out[s.seq] = append(r.out[s.seq], got[:row])
			conv, got = conv[CD:], got[row:]
		}
		r.pos[s.seq] += s.n
	}
}

func flat(rows [][]float32) []float32 {
	var f []float32
	for _, r := range rows {
		f = append(f, r...)
	}
	return f
}

func flat64(rows [][]float64) []float64 {
	var f []float64
	for _, r := range rows {
		f = append(f, r...)
	}
	return f
}

var dnSpec = backend.DeltaNetSpec{KeyHeads: 2, ValueHeads: 4, KeyDim: 16, ValueDim: 32, ConvKernel: 4}

// TestDeltaNetPaths checks the chunked and recurrent paths against the
// float64 recurrence and each other, for lengths around the chunk size.
func TestDeltaNetPaths(t *testing.T) {
	lengths := []int{1, 3, 5, 63, 64, 65, 130, 200}
	c := newDNCase(20, dnSpec, lengths)
	b := New(Options{Threads: 2})
	for i, n := range lengths {
		want := flat64(c.ref(i))
		byChunk := map[int][]float32{}
		for _, chunk := range []int{0, 1, 16, 64} {
			r := newDNRun(t, b, c, len(lengths), chunk)
			r.step(t, []seqStep{{i, n}})
			got := flat(r.out[i])
			compare(t, fmt.Sprintf("len %d chunk %d vs float64", n, chunk), got, want, 1e-4)
			byChunk[chunk] = got
		}
		compare(t, fmt.Sprintf("len %d: chunked vs recurrent", n), byChunk[64], toF64(byChunk[0]), 1e-4)
		compare(t, fmt.Sprintf("len %d: chunk 1 vs recurrent", n), byChunk[1], toF64(byChunk[0]), 1e-5)
	}
}

// TestDeltaNetContinue processes a prompt, saves its slot, restores it into
// another slot and continues there with a chunked prefill and decode steps.
func TestDeltaNetContinue(t *testing.T) {
	c := newDNCase(21, dnSpec, []int{100 + 70 + 3})
	c.mixed = append(c.mixed, c.mixed[0])
	c.ba = append(c.ba, c.ba[0])
	b := New(Options{Threads: 2})
	r := newDNRun(t, b, c, 3, 64)
	r.slots = []int{0, 2}
	r.step(t, []seqStep{{0, 100}})
	saved := make([]byte, r.st.SlotBytes())
	if err := r.st.Save(0, saved); err != nil {
		t.Fatal(err)
	}
	// Sequence 1 has the same tokens: it resumes at 100 from the snapshot.
	r.st.Restore(2, saved)
	r.pos[1] = 100
	r.out[1], r.conv[1] = r.out[0], r.conv[0]
	r.step(t, []seqStep{{1, 70}})
	for range 3 {
		r.step(t, []seqStep{{1, 1}})
	}
	compare(t, "continued", flat(r.out[1]), flat64(c.ref(0)), 1e-4)
	compare(t, "continued conv", flat(r.conv[1][100:]), flat64(c.refConv(0)[100:]), 1e-5)
	if err := r.st.Save(0, saved[1:]); err == nil {
		t.Error("Save accepted a short buffer")
	}

	// CopySlot carries the same state.
	r2 := newDNRun(t, b, c, 3, 64)
	r2.slots = []int{0, 1}
	r2.step(t, []seqStep{{0, 100}})
	r2.st.CopySlot(1, 0)
	r2.pos[1] = 100
	r2.out[1] = r2.out[0]
	r2.step(t, []seqStep{{1, 73}})
	compare(t, "after CopySlot", flat(r2.out[1]), toF64(flat(r.out[1])), 1e-5)
}

// TestDeltaNetCaptures checks that a step's captures leave in their slots
// exactly the state that steps ending there leave in the sequence's own
// slot, and change none of the step's outputs: captures inside and at the
// edge of chunks, after a few tokens (a token-by-token segment) and beside
// another sequence.
func TestDeltaNetCaptures(t *testing.T) {
	lengths := []int{150, 40}
	c := newDNCase(24, dnSpec, lengths)
	b := New(Options{Threads: 2})
	const slots = 6
	offsets := []int{5, 64, 100}
	one := newDNRun(t, b, c, slots, 64)
	one.slots = []int{0, 1}
	caps := []backend.Capture{{Offset: 5, Slot: 2}, {Offset: 64, Slot: 3}, {Offset: 100, Slot: 4}}
	one.step(t, []seqStep{{0, 150}, {1, 40}}, caps, []backend.Capture{{Offset: 39, Slot: 5}})

	apart := newDNRun(t, b, c, slots, 64)
	apart.slots = []int{0, 1}
	state := func(st backend.StateCache, slot int) []byte {
		buf := make([]byte, st.SlotBytes())
		if err := st.Save(slot, buf); err != nil {
			t.Fatal(err)
		}
		return buf
	}
	from := 0
	for i, off := range append(offsets, 150) {
		apart.step(t, []seqStep{{0, off - from}})
		from = off
		if i < len(offsets) && !slices.Equal(state(one.st, caps[i].Slot), state(apart.st, 0)) {
			t.Errorf("capture at %d differs from the state of steps ending there", off)
		}
	}
	apart.step(t, []seqStep{{1, 39}})
	if !slices.Equal(state(one.st, 5), state(apart.st, 1)) {
		t.Error("the second sequence's capture differs")
	}
	apart.step(t, []seqStep{{1, 1}})
	for s := range lengths {
		compare(t, fmt.Sprintf("seq %d with captures", s), flat(one.out[s]), toF64(flat(apart.out[s])), 0)
		compare(t, fmt.Sprintf("seq %d conv with captures", s), flat(one.conv[s]), toF64(flat(apart.conv[s])), 0)
		if !slices.Equal(state(one.st, s), state(apart.st, s)) {
			t.Errorf("seq %d: the state after the step differs", s)
		}
	}
}

// TestDeltaNetMixedBatch checks that a batch mixing a long prefill and
// single-token decodes gives each sequence exactly what it gets alone.
func TestDeltaNetMixedBatch(t *testing.T) {
	lengths := []int{90, 10, 12}
	c := newDNCase(22, dnSpec, lengths)
	steps := [][]seqStep{
		{{1, 8}, {2, 2}},
		{{0, 80}, {1, 1}, {2, 1}},
		{{2, 9}, {1, 1}, {0, 10}},
	}
	b := New(Options{Threads: 2})
	mixed := newDNRun(t, b, c, 3, 64)
	for _, st := range steps {
		mixed.step(t, st)
	}
	for s := range lengths {
		alone := newDNRun(t, b, c, 3, 64)
		for _, st := range steps {
			for _, q := range st {
				if q.seq == s {
					alone.step(t, []seqStep{q})
				}
			}
		}
		compare(t, fmt.Sprintf("seq %d", s), flat(mixed.out[s]), toF64(flat(alone.out[s])), 0)
		compare(t, fmt.Sprintf("seq %d vs float64", s), flat(mixed.out[s]), flat64(c.ref(s)), 1e-4)
		compare(t, fmt.Sprintf("seq %d conv vs float64", s), flat(mixed.conv[s]), flat64(c.refConv(s)), 1e-5)
	}
}

// TestDeltaNetRestart checks that Pos 0 starts from an empty state even when
// the slot holds another sequence's state.
func TestDeltaNetRestart(t *testing.T) {
	c := newDNCase(23, dnSpec, []int{20, 9})
	b := New(Options{})
	r := newDNRun(t, b, c, 1, 64)
	r.step(t, []seqStep{{0, 20}})
	r.step(t, []seqStep{{1, 9}})
	compare(t, "reused slot", flat(r.out[1]), flat64(c.ref(1)), 1e-4)
}

// TestDeltaNetSharedSlot runs two sequences in one slot in one step (as a
// model's padding rows do): each computes from the slot's state, and the
// slot keeps the first one's.
func TestDeltaNetSharedSlot(t *testing.T) {
	c := newDNCase(24, dnSpec, []int{30, 7})
	b := New(Options{Threads: 2})
	r := newDNRun(t, b, c, 1, 64)
	r.slots = []int{0, 0}
	r.step(t, []seqStep{{0, 20}, {1, 7}})
	r.step(t, []seqStep{{0, 10}})
	compare(t, "first", flat(r.out[0]), flat64(c.ref(0)), 1e-4)
	compare(t, "second", flat(r.out[1]), flat64(c.ref(1)), 1e-4)
}
