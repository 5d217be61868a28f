package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/kiln-llm/kiln/backend"
)

// stateCache holds, per DeltaNet layer, every slot's conv history
// [K-1, ConvDim] and recurrent state [HV, dk, dv], f32.
type stateCache struct {
	spec        backend.StateSpec
	convN, recN int         // floats per slot per layer
	conv, rec   [][]float32 // per layer, Slots * convN / recN
}

// NewStateCache allocates zeroed recurrent state for spec.Slots sequences.
func (b *Backend) NewStateCache(spec backend.StateSpec) (backend.StateCache, error) {
	if err := spec.Check(); err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
	}
	c := &stateCache{spec: spec}
	c.convN, c.recN = spec.SlotFloats()
	for range spec.Layers {
		c.conv = append(c.conv, make([]float32, spec.Slots*c.convN))
		c.rec = append(c.rec, make([]float32, spec.Slots*c.recN))
	}
	return c, nil
}

func (c *stateCache) Spec() backend.StateSpec { return c.spec }

func (c *stateCache) SlotBytes() int { return c.spec.SlotBytes() }

func (c *stateCache) checkSlot(s int) {
	if s < 0 || s >= c.spec.Slots {
		panic(fmt.Sprintf("cpu: state slot %d of %d", s, c.spec.Slots))
	}
}

func (c *stateCache) convOf(layer, slot int) []float32 {
	return c.conv[layer][slot*c.convN : (slot+1)*c.convN]
}

func (c *stateCache) recOf(layer, slot int) []float32 {
	return c.rec[layer][slot*c.recN : (slot+1)*c.recN]
}

func (c *stateCache) CopySlot(dst, src int) {
	c.checkSlot(dst)
	c.checkSlot(src)
	for l := range c.conv {
		copy(c.convOf(l, dst), c.convOf(l, src))
		copy(c.recOf(l, dst), c.recOf(l, src))
	}
}

func (c *stateCache) Save(slot int, dst []byte) error {
	if slot < 0 || slot >= c.spec.Slots {
		return fmt.Errorf("cpu: save state slot %d of %d", slot, c.spec.Slots)
	}
	if len(dst) != c.SlotBytes() {
		return fmt.Errorf("cpu: save state: buffer of %d bytes, slot has %d", len(dst), c.SlotBytes())
	}
	i := 0
	for l := range c.conv {
		for _, part := range [][]float32{c.convOf(l, slot), c.recOf(l, slot)} {
			for _, v := range part {
				binary.LittleEndian.PutUint32(dst[i:], math.Float32bits(v))
				i += 4
			}
		}
	}
	return nil
}

func (c *stateCache) Restore(slot int, src []byte) {
	c.checkSlot(slot)
	if len(src) != c.SlotBytes() {
		panic(fmt.Sprintf("cpu: restore state: %d bytes, slot has %d", len(src), c.SlotBytes()))
	}
	i := 0
	for l := range c.conv {
		for _, part := range [][]float32{c.convOf(l, slot), c.recOf(l, slot)} {
			for j := range part {
				part[j] = math.Float32frombits(binary.LittleEndian.Uint32(src[i:]))
				i += 4
			}
		}
	}
}

func (c *stateCache) Free() { c.conv, c.rec = nil, nil }

// stateOf returns stc as this backend's state cache after checking layer.
func stateOf(what string, stc backend.StateCache, layer int) *stateCache {
	c, ok := stc.(*stateCache)
	if !ok {
		panic(fmt.Sprintf("cpu: %s: state cache of another backend (%T)", what, stc))
	}
	if layer < 0 || layer >= c.spec.Layers {
		panic(fmt.Sprintf("cpu: %s: layer %d of %d", what, layer, c.spec.Layers))
	}
	return c
}

// slotStates returns each sequence's part of a layer's state (of: convOf
// or recOf), zeroed for a sequence at position 0. Sequences of one step
// that share a slot (a model's padding rows) each start from the slot's
// state, on private copies after the first, whose results the slot does
// not keep.
func (b *Backend) slotStates(c *stateCache, layer int, of func(layer, slot int) []float32) [][]float32 {
	seqs := b.step.seqs
	parts := make([][]float32, len(seqs))
	owner := map[int]bool{}
	for si, s := range seqs {
		if s.N == 0 {
			continue
		}
		c.checkSlot(s.Slot)
		parts[si] = of(layer, s.Slot)
		if owner[s.Slot] {
			parts[si] = slices.Clone(parts[si])
		}
		owner[s.Slot] = true
	}
	for si, s := range seqs {
		if s.N > 0 && s.Pos == 0 {
			clear(parts[si])
		}
	}
	return parts
}

// CausalConv1d runs a DeltaNet layer's causal conv and silu over each
// sequence's conv history; see backend.Backend.
func (b *Backend) CausalConv1d(out, x, w backend.Tensor, stc backend.StateCache, layer int) {
	c := stateOf("causal conv", stc, layer)
	T, CD, K := b.numTokens(), c.spec.DeltaNet.ConvDim(), c.spec.DeltaNet.ConvKernel
	ot, xt := asT(out), asT(x)
	checkShape("causal conv x", xt, T, CD)
	checkShape("causal conv out", ot, T, CD)
	convW := smallFloats(w)
	if len(convW) != CD*K {
		panic(fmt.Sprintf("cpu: causal conv: weight %v for %d channels of width %d", asT(w), CD, K))
	}
	st := &b.step
	hists := b.slotStates(c, layer, c.convOf)
	xs, o := xt.f32(), ot.out32()
	b.pool.For(T, max(1, 4096/CD), func(lo, hi int) {
		for t := lo; t < hi; t++ {
			si := st.tokSeq[t]
			i := t - st.seqStart[si] // index within the sequence's new tokens
			hist := hists[si]
			dst := o[t*CD : (t+1)*CD]
			clear(dst)
			for j := range K {
				src := i - (K - 1) + j // input index; negative: from history
				var row []float32
				if src >= 0 {
					row = xs[(st.seqStart[si]+src)*CD : (st.seqStart[si]+src+1)*CD]
				} else {
					row = hist[(K-1+src)*CD : (K+src)*CD]
				}
				for ch, v := range row {
					dst[ch] += convW[ch*K+j] * v
				}
			}
			for ch, v := range dst {
				dst[ch] = silu(v)
			}
		}
	})
	// The history after n new inputs is the last K-1 rows of [history |
	// the first n new inputs]: a capture's first, from the history as it
	// was, then the sequence's own, in place (its row r reads row n + r,
	// not yet overwritten).
	for si, s := range st.seqs {
		if s.N == 0 {
			continue
		}
		hist, in := hists[si], xs[st.seqStart[si]*CD:(st.seqStart[si]+s.N)*CD]
		row := func(i int) []float32 { // row i of [history | new inputs]
			if i < K-1 {
				return hist[i*CD : (i+1)*CD]
			}
			return in[(i-(K-1))*CD : (i-K+2)*CD]
		}
		for _, cp := range s.Captures {
			c.checkSlot(cp.Slot)
			dst := c.convOf(layer, cp.Slot)
			for r := range K - 1 {
				copy(dst[r*CD:(r+1)*CD], row(cp.Offset+r))
			}
		}
		for r := range K - 1 {
			copy(hist[r*CD:(r+1)*CD], row(s.N+r))
		}
	}
}

// GatedDeltaRule runs the gated delta rule over each sequence's recurrent
// state; see backend.Backend. Each sequence uses the chunked algorithm
// when it advances by at least spec.Chunk tokens, the token-by-token
// recurrence otherwise.
func (b *Backend) GatedDeltaRule(out, qkv, ba, aLogW, dtBiasW backend.Tensor, spec *backend.DeltaNetSpec, stc backend.StateCache, layer int) {
	c := stateOf("delta rule", stc, layer)
	sp := *spec
	sp.Chunk = c.spec.DeltaNet.Chunk // the chunk length may differ per call, the shapes may not
	if sp != c.spec.DeltaNet {
		panic(fmt.Sprintf("cpu: delta rule: spec %+v does not match the state cache's %+v", *spec, c.spec.DeltaNet))
	}
	T := b.numTokens()
	HK, HV, dk, dv := spec.KeyHeads, spec.ValueHeads, spec.KeyDim, spec.ValueDim
	CD := spec.ConvDim()
	ot, xt, bt := asT(out), asT(qkv), asT(ba)
	checkShape("delta rule qkv", xt, T, CD)
	checkShape("delta rule ba", bt, T, 2*HV)
	checkShape("delta rule out", ot, T, HV*dv)
	aLog, dtBias := smallFloats(aLogW), smallFloats(dtBiasW)
	if len(aLog) != HV || len(dtBias) != HV {
		panic(fmt.Sprintf("cpu: delta rule: A_log %d, dt_bias %d for %d value heads", len(aLog), len(dtBias), HV))
	}
	st := &b.step
	rec := b.slotStates(c, layer, c.recOf)
	x, ab, o := xt.f32(), bt.f32(), ot.out32()

	// Per token: q and k L2-normalised per head (q also scaled) into qk;
	// beta and g per value head.
	QK := 2 * HK * dk
	qk := make([]float32, T*QK)
	beta, gate := make([]float32, T*HV), make([]float32, T*HV)
	qScale := float32(1 / math.Sqrt(float64(dk)))
	b.pool.For(T, 1, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			for h := range 2 * HK {
				v := x[t*CD+h*dk : t*CD+(h+1)*dk]
				var ss float64
				for _, e := range v {
					ss += float64(e) * float64(e)
				}
				inv := float32(1 / math.Sqrt(ss+1e-6))
				if h < HK {
					inv *= qScale
				}
				dst := qk[t*QK+h*dk : t*QK+(h+1)*dk]
				for i, e := range v {
					dst[i] = e * inv
				}
			}
			for h := range HV {
				bv, av := ab[t*2*HV+h], ab[t*2*HV+HV+h]
				beta[t*HV+h] = sigmoid(bv)
				gate[t*HV+h] = float32(-math.Exp(float64(aLog[h])) * softplus(float64(av+dtBias[h])))
			}
		}
	})

	// The delta rule per (sequence, value head).
	type task struct{ seq, head int }
	var tasks []task
	for si, s := range st.seqs {
		for h := range HV {
			if s.N > 0 {
				tasks = append(tasks, task{si, h})
			}
		}
	}
	b.pool.For(len(tasks), 1, func(lo, hi int) {
		var ws deltaScratch
		for _, tk := range tasks[lo:hi] {
			s := &st.seqs[tk.seq]
			h := tk.head
			kh := spec.KeyHead(h)
			t0 := st.seqStart[tk.seq]
			d := deltaHead{
				qk: qk[t0*QK:], qkStride: QK, qOff: kh * dk, kOff: (HK + kh) * dk,
				v: x[t0*CD+2*HK*dk+h*dv:], vStride: CD,
				beta: beta[t0*HV+h:], gate: gate[t0*HV+h:], gStride: HV,
				out: o[t0*HV*dv+h*dv:], oStride: HV * dv,
				dk: dk, dv: dv,
			}
			S := rec[tk.seq][h*dk*dv : (h+1)*dk*dv]
			// Each capture ends a segment, which runs as a step of its
			// own would, and takes the state after it.
			from := 0
			for j := 0; j <= len(s.Captures); j++ {
				to := s.N
				if j < len(s.Captures) {
					to = s.Captures[j].Offset
				}
				d.segment(S, from, to, spec.Chunk, &ws)
				if j < len(s.Captures) {
					copy(c.recOf(layer, s.Captures[j].Slot)[h*dk*dv:(h+1)*dk*dv], S)
				}
				from = to
			}
		}
	})
}

// segment advances S by tokens t0..t1-1: chunk by chunk when they are at
// least chunk many, else token by token.
func (d *deltaHead) segment(S []float32, t0, t1, chunk int, ws *deltaScratch) {
	if chunk > 0 && t1-t0 >= chunk {
		for c0 := t0; c0 < t1; c0 += chunk {
			d.chunk(S, c0, min(chunk, t1-c0), ws)
		}
		return
	}
	for t := t0; t < t1; t++ {
		d.step(S, t, ws)
	}
}

func softplus(x float64) float64 {
	// As torch: linear above threshold 20.
	if x > 20 {
		return x
	}
	return math.Log1p(math.Exp(x))
}

// deltaHead addresses one (sequence, value head) of a GatedDeltaRule
// call: token t's normalised q and k rows, v row, beta, g and output row.
type deltaHead struct {
	qk         []float32
	qkStride   int
	qOff, kOff int
	v          []float32
	vStride    int
	beta, gate []float32
	gStride    int
	out        []float32
	oStride    int
	dk, dv     int
}

func (d *deltaHead) q(t int) []float32  { return d.qk[t*d.qkStride+d.qOff : t*d.qkStride+d.qOff+d.dk] }
func (d *deltaHead) k(t int) []float32  { return d.qk[t*d.qkStride+d.kOff : t*d.qkStride+d.kOff+d.dk] }
func (d *deltaHead) vt(t int) []float32 { return d.v[t*d.vStride : t*d.vStride+d.dv] }
func (d *deltaHead) o(t int) []float32  { return d.out[t*d.oStride : t*d.oStride+d.dv] }

// deltaScratch is a worker's reusable scratch memory.
type deltaScratch struct {
	u                    []float32
	gam, a, U, W, qk, kt []float32
}

func grow(s *[]float32, n int) []float32 {
	if cap(*s) < n {
		*s = make([]float32, n)
	}
	return (*s)[:n]
}

// step advances S [dk, dv] by token t:
// S = exp(g) S; delta = beta (v - S^T k); S += k delta^T; o = S^T q.
func (d *deltaHead) step(S []float32, t int, ws *deltaScratch) {
	dk, dv := d.dk, d.dv
	k, q, v := d.k(t), d.q(t), d.vt(t)
	decay := float32(math.Exp(float64(d.gate[t*d.gStride])))
	bt := d.beta[t*d.gStride]
	u := grow(&ws.u, dv)
	clear(u)
	axpyRowsF32(u, k, S, dv) // S^T k before the decay
	for c := range u {
		u[c] = bt * (v[c] - decay*u[c]) // delta
	}
	for a := range dk {
		scaleAxpy(S[a*dv:(a+1)*dv], decay, k[a], u)
	}
	o := d.o(t)
	clear(o)
	axpyRowsF32(o, q, S, dv)
}

// chunk advances S by the L tokens t0..t0+L-1 at once (the chunked form of
// the gated delta rule, see qwen-family.md). With G the in-chunk cumulative
// sum of g, A[i,j] = beta_i (k_i.k_j) exp(G_i-G_j) for i > j, and
// (I+A) U = beta V, (I+A) W = beta exp(G) K solved by forward substitution:
//
//	Vn = U - W S
//	o_i = exp(G_i) S^T q_i + sum_{j<=i} (q_i.k_j) exp(G_i-G_j) Vn_j
//	S  = exp(G_L) S + sum_i exp(G_L-G_i) k_i Vn_i^T
//
// Every product runs through the row kernels: one call per row of a result.
func (d *deltaHead) chunk(S []float32, t0, L int, ws *deltaScratch) {
	dk, dv := d.dk, d.dv
	gam := grow(&ws.gam, L)
	var acc float32
	for i := range L {
		acc += d.gate[(t0+i)*d.gStride]
		gam[i] = acc
	}
	beta := func(i int) float32 { return d.beta[(t0+i)*d.gStride] }
	// A holds -A (strictly lower), qk the decayed, causally masked Q K^T.
	A, qk := grow(&ws.a, L*L), grow(&ws.qk, L*L)
	keys := d.qk[t0*d.qkStride+d.kOff:]
	for i := range L {
		ai, qi := A[i*L:i*L+i+1], qk[i*L:i*L+i+1]
		dotRowsF32(d.k(t0+i), keys, d.qkStride, ai)
		dotRowsF32(d.q(t0+i), keys, d.qkStride, qi)
		b := beta(i)
		for j := range qi {
			e := float32(math.Exp(float64(gam[i] - gam[j])))
			ai[j] *= -b * e
			qi[j] *= e
		}
	}
	U, W := grow(&ws.U, L*dv), grow(&ws.W, L*dk)
	for i := range L {
		ui, wi := U[i*dv:(i+1)*dv], W[i*dk:(i+1)*dk]
		b := beta(i)
		eb := b * float32(math.Exp(float64(gam[i])))
		for c, v := range d.vt(t0 + i) {
			ui[c] = b * v
		}
		for c, v := range d.k(t0 + i) {
			wi[c] = eb * v
		}
		axpyRowsF32(ui, A[i*L:i*L+i], U, dv)
		axpyRowsF32(wi, A[i*L:i*L+i], W, dk)
	}
	// U becomes Vn = U - W S.
	for i := range L {
		wi := W[i*dk : (i+1)*dk]
		for a := range wi {
			wi[a] = -wi[a]
		}
		axpyRowsF32(U[i*dv:(i+1)*dv], wi, S, dv)
	}
	qs := grow(&ws.u, dk)
	for i := range L {
		o := d.o(t0 + i)
		clear(o)
		eg := float32(math.Exp(float64(gam[i])))
		for a, qa := range d.q(t0 + i) {
			qs[a] = eg * qa
		}
		axpyRowsF32(o, qs, S, dv)
		axpyRowsF32(o, qk[i*L:i*L+i+1], U, dv)
	}
	gl := gam[L-1]
	egl := float32(math.Exp(float64(gl)))
	for i := range S {
		S[i] *= egl
	}
	// S[a] += sum_i exp(G_L-G_i) k_i[a] Vn_i: column a of the decayed keys
	// weighs the rows of Vn.
	kt := grow(&ws.kt, dk*L)
	for i := range L {
		e := float32(math.Exp(float64(gl - gam[i])))
		for a, ka := range d.k(t0 + i) {
			kt[a*L+i] = e * ka
		}
	}
	for a := range dk {
		axpyRowsF32(S[a*dv:(a+1)*dv], kt[a*L:(a+1)*L], U, dv)
	}
}
