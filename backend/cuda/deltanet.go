//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/kiln-llm/kiln/backend"
)

// stateCache holds, per DeltaNet layer, every slot's conv history [K-1,
// ConvDim] and every slot's recurrent state [HV, dk, dv], f32 on the device.
type stateCache struct {
	b           *Backend
	spec        backend.StateSpec
	convN, recN int      // floats per slot per layer
	conv, rec   []devptr // per layer, Slots * convN / recN floats
	chunk       *dnChunk // nil: no chunked kernels for these heads
	// chunked counts the (sequence, layer) pairs the chunked kernels ran,
	// so that tests can tell that they did.
	chunked int
}

// dnChunkLen is the tokens of a chunk of the chunked kernels (DN_C).
const dnChunkLen = 64

// The kernels of kernels/deltanet.cu.
var (
	dnConvKernel     = newKernel[dnConvArgs]("dn_conv")
	dnConvHistKernel = newKernel[dnConvHistArgs]("dn_conv_hist")
	dnConvStepKernel = newKernel[dnConvStepArgs]("dn_conv_step")
	dnRecurKernel    = newKernel[dnRecurArgs]("dn_recur")
)

// dnChunkKernels are the chunked kernels of deltanet_chunk.cu (DN_PREP,
// DN_RUN) by key dim, with the value columns and the warps of a
// dn_chunk_run block.
var dnChunkKernels = map[int]struct {
	prep      kernel[dnChunkPrepArgs]
	run       kernel[dnChunkRunArgs]
	dvs, warp int
}{
	16:  {newKernel[dnChunkPrepArgs]("dn_chunk_prep_16"), newKernel[dnChunkRunArgs]("dn_chunk_run_16_16"), 16, 4},
	128: {newKernel[dnChunkPrepArgs]("dn_chunk_prep_128"), newKernel[dnChunkRunArgs]("dn_chunk_run_128_32"), 32, 8},
}

type dnConvArgs struct {
	y, x                            devptr
	ldx                             int32
	w                               devptr
	wdt                             int32
	hist                            devptr
	T, CD, K, convN                 int32
	tokseq, seqpos, seqstart, slots devptr
}

type dnConvHistArgs struct {
	hist, x                       devptr
	ldx, CD, K, convN             int32
	seqpos, seqn, seqstart, slots devptr
}

type dnConvStepArgs struct {
	y, hist, x                    devptr
	ldx                           int32
	w                             devptr
	wdt, CD, K, convN             int32
	seqpos, seqn, seqstart, slots devptr
}

// dn_conv_step takes the conv of steps whose sequences bring up to
// dnConvStepTokens new tokens each. The convs take up to dnConvMaxK taps
// (the config's bound), dn_conv's threads runs of dnConvRun tokens.
const (
	dnConvStepTokens = 16
	dnConvMaxK       = 8
	dnConvRun        = 32
)

type dnRecurArgs struct {
	out, x                                devptr
	ldx                                   int32
	ba, aLog                              devptr
	adt                                   int32
	dtBias                                devptr
	bdt                                   int32
	state                                 devptr
	HK, HV, dk, dv, recN, chunkMin, tiled int32
	f                                     dnFused
	seqpos, seqn, seqstart, slots         devptr
}

// dnFused is struct DnFused: what dn_recur takes to run a decode step's
// conv and gated norm too.
type dnFused struct {
	convw    devptr
	cwdt     int32
	hist     devptr
	convN, K int32
	z        devptr
	ldz      int32
	normw    devptr
	nwdt     int32
	eps      float32
	gout     devptr
	godt     int32
	cnt      devptr
}

// dnStepWidth is the widest conv the fused decode step (dn_recur with
// its conv, DN_STEP_MAXK) takes.
const dnStepWidth = 4

type dnChunkPrepArgs struct {
	qkv, ba, aLog               devptr
	adt                         int32
	dtBias                      devptr
	bdt                         int32
	qg, kd, wg, pg, ug, gg      devptr
	HK, HV, DV, chunkMin, tiled int32
	seqn, seqstart              devptr
}

type dnChunkRunArgs struct {
	out, qg, kd, wg, pg, ug, gg, state devptr
	HV, DV, recN, chunkMin             int32
	seqpos, seqn, seqstart, slots      devptr
}

// dnChunk is how the chunked kernels take a state cache's heads.
type dnChunk struct {
	prep              kernel[dnChunkPrepArgs]
	run               kernel[dnChunkRunArgs]
	dvs, warp         int // value columns and warps of a dn_chunk_run block
	prepSmem, runSmem int
}

// dnPrepSmem is dn_chunk_prep's dynamic shared memory (its comment gives
// the layout): K, then Q or V, [2][DN_C][dim+8] bf16; A or the scaled T's
// (2 x [2][DN_C][72] bf16, the larger); T [DN_C][68] f32; the solve's
// blocks, 768 f32; G and beta.
func dnPrepSmem(dk, dv int) int {
	c := dnChunkLen
	return 4*c*(dk+8) + 4*c*(max(dk, dv)+8) + 4*c*72 + 4*c*68 + 4*768 + 4*2*c
}

// dnRunSmem is dn_chunk_run's: W, Q, K [2][DN_C][dk+8] bf16; P
// [2][DN_C][DN_C+8]; S [2][dk][dvs+8]; Vn [2][DN_C][dvs+8].
func dnRunSmem(dk, dvs int) int {
	c := dnChunkLen
	return 3*4*c*(dk+8) + 4*c*(c+8) + 4*dk*(dvs+8) + 4*c*(dvs+8)
}

// dnRecurRows is the rows of a state column each of dn_recur's threads
// holds (DR_ROWS): its four warps take key dims up to 4 * dnRecurRows.
const dnRecurRows = 32

// NewStateCache allocates zeroed recurrent state for spec.Slots sequences.
func (b *Backend) NewStateCache(spec backend.StateSpec) (backend.StateCache, error) {
	if err := spec.Check(); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	d := spec.DeltaNet
	// dn_recur holds a head's state columns in its four warps' registers.
	if d.KeyDim > 4*dnRecurRows {
		return nil, fmt.Errorf("cuda: Gated DeltaNet heads of key dim %d, value dim %d are not supported; use --backend cpu", d.KeyDim, d.ValueDim)
	}
	c := &stateCache{b: b, spec: spec}
	c.convN, c.recN = spec.SlotFloats()
	if ck, ok := dnChunkKernels[d.KeyDim]; ok && d.ValueDim%ck.dvs == 0 {
		k := &dnChunk{
			prep: ck.prep, run: ck.run, dvs: ck.dvs, warp: ck.warp,
			prepSmem: dnPrepSmem(d.KeyDim, d.ValueDim), runSmem: dnRunSmem(d.KeyDim, ck.dvs),
		}
		// dn_chunk_run takes 150 KB at Qwen3-Next's heads: an A100 or H100
		// gives it, GPUs of 100 KB a block run the recurrence instead.
		if max(k.prepSmem, k.runSmem) <= b.smemOp {
			c.chunk = k
		}
	}
	for range spec.Layers {
		for _, n := range []int{c.convN, c.recN} {
			p, err := b.malloc(4 * spec.Slots * n)
			if err != nil {
				c.Free()
				return nil, fmt.Errorf("cuda: state cache of %d slots: %w", spec.Slots, err)
			}
			if err := check("cuMemsetD32Async", C.k_cuMemsetD32Async(b.ctx, p, 0, C.size_t(spec.Slots*n), b.stream)); err != nil {
				b.freePtr(p)
				c.Free()
				return nil, err
			}
			if n == c.convN {
				c.conv = append(c.conv, p)
			} else {
				c.rec = append(c.rec, p)
			}
		}
	}
	return c, nil
}

func (c *stateCache) Spec() backend.StateSpec { return c.spec }

func (c *stateCache) SlotBytes() int { return c.spec.SlotBytes() }

func (c *stateCache) checkSlot(s int) {
	if s < 0 || s >= c.spec.Slots {
		panic(fmt.Sprintf("cuda: state slot %d of %d", s, c.spec.Slots))
	}
}

// parts calls f with each device piece of slot's state, in Save's order.
func (c *stateCache) parts(slot int, f func(p devptr, bytes int)) {
	for l := range c.conv {
		f(c.conv[l]+devptr(4*slot*c.convN), 4*c.convN)
		f(c.rec[l]+devptr(4*slot*c.recN), 4*c.recN)
	}
}

// CopySlot copies slot src's state to dst (queued).
func (c *stateCache) CopySlot(dst, src int) {
	c.checkSlot(dst)
	c.checkSlot(src)
	for l := range c.conv {
		c.b.copyDtoD(c.conv[l]+devptr(4*dst*c.convN), c.conv[l]+devptr(4*src*c.convN), 4*c.convN)
		c.b.copyDtoD(c.rec[l]+devptr(4*dst*c.recN), c.rec[l]+devptr(4*src*c.recN), 4*c.recN)
	}
}

// Save waits for queued work and copies a slot's state to dst.
func (c *stateCache) Save(slot int, dst []byte) error {
	if slot < 0 || slot >= c.spec.Slots {
		return fmt.Errorf("cuda: save state slot %d of %d", slot, c.spec.Slots)
	}
	if len(dst) != c.SlotBytes() {
		return fmt.Errorf("cuda: save state: buffer of %d bytes, slot has %d", len(dst), c.SlotBytes())
	}
	b := c.b
	host := b.staging(len(dst))
	off := 0
	c.parts(slot, func(p devptr, n int) {
		b.copyDtoH(unsafe.Add(host, off), p, n)
		off += n
	})
	if err := b.Sync(); err != nil {
		return err
	}
	copy(dst, unsafe.Slice((*byte)(host), len(dst)))
	return nil
}

// Restore writes a slot's state saved by Save; it returns once the copies
// are done (src may be reused at once).
func (c *stateCache) Restore(slot int, src []byte) {
	c.checkSlot(slot)
	if len(src) != c.SlotBytes() {
		panic(fmt.Sprintf("cuda: restore state: %d bytes, slot has %d", len(src), c.SlotBytes()))
	}
	b := c.b
	host := unsafe.Pointer(&src[0])
	if !b.pageLocked(src) {
		host = b.staging(len(src))
		// The staging buffer may still feed a queued read-back: wait first.
		b.fail(b.Sync())
		copy(unsafe.Slice((*byte)(host), len(src)), src)
	}
	off := 0
	c.parts(slot, func(p devptr, n int) {
		b.copyHtoD(p, unsafe.Add(host, off), n)
		off += n
	})
	b.fail(b.Sync())
}

func (c *stateCache) Free() {
	if c.conv == nil && c.rec == nil {
		return
	}
	c.b.fail(c.b.Sync())
	for _, p := range append(c.conv, c.rec...) {
		c.b.freePtr(p)
	}
	c.conv, c.rec = nil, nil
}

// stateOf returns stc as this backend's state cache after checking layer
// and the step's slots.
func (b *Backend) stateOf(what string, stc backend.StateCache, layer int) *stateCache {
	c, ok := stc.(*stateCache)
	if !ok {
		panic(fmt.Sprintf("cuda: %s: state cache of another backend (%T)", what, stc))
	}
	if layer < 0 || layer >= c.spec.Layers {
		panic(fmt.Sprintf("cuda: %s: layer %d of %d", what, layer, c.spec.Layers))
	}
	for _, s := range b.meta.host[mSeqSlot] {
		c.checkSlot(int(s))
	}
	for _, cp := range b.meta.caps {
		c.checkSlot(cp.slot)
	}
	return c
}

// CausalConv1d runs a DeltaNet layer's causal conv and silu over each
// sequence's conv history; see backend.Backend.
func (b *Backend) CausalConv1d(out, x, w backend.Tensor, stc backend.StateCache, layer int) {
	c := b.stateOf("causal conv", stc, layer)
	xt := asT(x)
	checkRows("causal conv x", xt, b.meta.T, c.spec.DeltaNet.ConvDim())
	checkF32("causal conv", xt)
	b.causalConv(c, asT(out), xt.ptr, xt.cols(), asT(w), layer)
}

// causalConv is CausalConv1d of inputs x whose rows are ldx floats apart.
// dn_conv reads the history as it was, then dn_conv_hist moves it on; a
// step of few tokens a sequence (decode) takes both in one pass,
// dn_conv_step.
func (b *Backend) causalConv(c *stateCache, ot *tensor, x devptr, ldx int, cw *tensor, layer int) {
	m := &b.meta
	CD, K := c.spec.DeltaNet.ConvDim(), c.spec.DeltaNet.ConvKernel
	checkRows("causal conv out", ot, m.T, CD)
	checkF32("causal conv", ot)
	if cw.numel() != CD*K || K > dnConvMaxK {
		panic(fmt.Sprintf("cuda: causal conv: weight %v for %d channels of width %d (at most %d)", cw, CD, K, dnConvMaxK))
	}
	if m.T == 0 {
		return
	}
	if len(m.caps) > 0 {
		// A capture's history is its sequence's after the capture's
		// offset: the sequence's history as it was, in the capture's slot,
		// moved on by that many inputs (dn_conv_hist, the captures as its
		// sequences).
		for _, cp := range m.caps {
			src := int(m.host[mSeqSlot][cp.seq])
			b.copyDtoD(c.conv[layer]+devptr(4*cp.slot*c.convN), c.conv[layer]+devptr(4*src*c.convN), 4*c.convN)
		}
		dnConvHistKernel.run(b, [3]int{len(m.caps), (CD + 255) / 256, 1}, 256, 0, dnConvHistArgs{
			hist: c.conv[layer], x: x, ldx: int32(ldx), CD: int32(CD), K: int32(K), convN: int32(c.convN),
			seqpos: m.dev[mCapPos], seqn: m.dev[mCapN], seqstart: m.dev[mCapStart], slots: m.dev[mCapSlot]})
	}
	if m.maxN <= dnConvStepTokens {
		dnConvStepKernel.run(b, [3]int{m.S, (CD + 255) / 256, 1}, 256, 0, dnConvStepArgs{
			y: ot.ptr, hist: c.conv[layer], x: x, ldx: int32(ldx), w: cw.ptr, wdt: int32(cw.dt), CD: int32(CD), K: int32(K), convN: int32(c.convN),
			seqpos: m.dev[mSeqPos], seqn: m.dev[mSeqN], seqstart: m.dev[mSeqStart], slots: m.dev[mSeqSlot]})
		return
	}
	dnConvKernel.run(b, [3]int{(m.T + dnConvRun - 1) / dnConvRun, (CD + 255) / 256, 1}, 256, 0, dnConvArgs{
		y: ot.ptr, x: x, ldx: int32(ldx), w: cw.ptr, wdt: int32(cw.dt), hist: c.conv[layer], T: int32(m.T), CD: int32(CD), K: int32(K),
		convN:  int32(c.convN),
		tokseq: m.dev[mTokSeq], seqpos: m.dev[mSeqPos], seqstart: m.dev[mSeqStart], slots: m.dev[mSeqSlot]})
	dnConvHistKernel.run(b, [3]int{m.S, (CD + 255) / 256, 1}, 256, 0, dnConvHistArgs{
		hist: c.conv[layer], x: x, ldx: int32(ldx), CD: int32(CD), K: int32(K), convN: int32(c.convN),
		seqpos: m.dev[mSeqPos], seqn: m.dev[mSeqN], seqstart: m.dev[mSeqStart], slots: m.dev[mSeqSlot]})
}

// DeltaNet runs a Gated DeltaNet layer between its projections; see
// backend.FusedDeltaNet. A step whose sequences each bring few tokens
// (fewer than the chunked form takes, and few enough for dn_conv_step),
// without captures, takes one dn_recur with the conv and the gated norm in
// it; other steps take the three steps.
func (b *Backend) DeltaNet(out, qkv, z, ba backend.Tensor, w *backend.DeltaNetWeights, spec *backend.DeltaNetSpec, stc backend.StateCache, layer int) {
	c := b.stateOf("deltanet", stc, layer)
	c.checkSpec("deltanet", spec)
	m := &b.meta
	HV, dv, K := spec.ValueHeads, spec.ValueDim, spec.ConvKernel
	CD, vdim := spec.ConvDim(), HV*dv
	ot, xt, bt := asT(out), asT(qkv), asT(ba)
	checkF32("deltanet", xt)
	zp, ldx, ldz := devptr(0), CD, vdim
	if z == nil {
		checkRows("deltanet qkvz", xt, m.T, CD+vdim)
		zp, ldx, ldz = xt.ptr+devptr(4*CD), CD+vdim, CD+vdim
	} else {
		zt := asT(z)
		checkRows("deltanet qkv", xt, m.T, CD)
		checkRows("deltanet z", zt, m.T, vdim)
		checkF32("deltanet z", zt)
		zp = zt.ptr
	}
	nw := asT(w.Norm)
	if !c.fuses(spec, m) || nw.numel() != dv {
		conv := b.scratchF32("deltanet.conv", m.T, CD)
		b.causalConv(c, conv, xt.ptr, ldx, asT(w.Conv), layer)
		o := b.scratchF32("deltanet.o", m.T, vdim)
		b.GatedDeltaRule(o, conv, ba, w.ALog, w.DtBias, spec, stc, layer)
		b.gatedRMSNorm(ot, o, zp, ldz, nw, w.NormEps)
		return
	}
	checkRows("deltanet ba", bt, m.T, 2*HV)
	checkF32("deltanet ba", bt)
	checkRows("deltanet out", ot, m.T, vdim)
	checkAct("deltanet out", ot)
	checkFloatW("deltanet norm", nw)
	cw, al, db := asT(w.Conv), asT(w.ALog), asT(w.DtBias)
	if cw.numel() != CD*K || al.numel() != HV || db.numel() != HV {
		panic(fmt.Sprintf("cuda: deltanet: conv %v, A_log %v, dt_bias %v for %+v", cw, al, db, *spec))
	}
	if m.T == 0 {
		return
	}
	o := b.scratchF32("deltanet.o", m.T, vdim)
	a := c.recurArgs(o.ptr, xt.ptr, ldx, bt.ptr, al, db, layer, c.chunkMin(spec))
	a.f = dnFused{
		convw: cw.ptr, cwdt: int32(cw.dt), hist: c.conv[layer], convN: int32(c.convN), K: int32(K),
		z: zp, ldz: int32(ldz), normw: nw.ptr, nwdt: int32(nw.dt), eps: w.NormEps, gout: ot.ptr, godt: int32(ot.dt),
		cnt: b.zeroedScratch("deltanet.cnt", 4*m.S*spec.KeyHeads),
	}
	dnRecurKernel.runOverlapped(b, [3]int{m.S, HV, (dv + 31) / 32}, 128, 0, a)
}

// checkSpec panics unless spec is the state cache's heads (its chunk
// length aside).
func (c *stateCache) checkSpec(what string, spec *backend.DeltaNetSpec) {
	sp := *spec
	sp.Chunk = c.spec.DeltaNet.Chunk
	if sp != c.spec.DeltaNet {
		panic(fmt.Sprintf("cuda: %s: spec %+v does not match the state cache's %+v", what, *spec, c.spec.DeltaNet))
	}
}

// fuses reports whether DeltaNet takes this step in one dn_recur.
func (c *stateCache) fuses(spec *backend.DeltaNetSpec, m *stepMeta) bool {
	return m.rounds == 1 && len(m.caps) == 0 && m.maxN <= dnConvStepTokens && m.maxN < c.chunkMin(spec) && spec.ConvKernel <= dnStepWidth
}

// chunkMin is the fewest new tokens of a sequence that the chunked kernels
// take.
func (c *stateCache) chunkMin(spec *backend.DeltaNetSpec) int {
	if c.chunk != nil && spec.Chunk > 0 {
		return spec.Chunk
	}
	return math.MaxInt32
}

// recurArgs are dn_recur's arguments for layer's state, the conv's outputs
// x (rows ldx floats apart) and ba, writing out, sequences of chunkMin
// tokens or more left to the chunked kernels; the step's sequences.
func (c *stateCache) recurArgs(out, x devptr, ldx int, ba devptr, al, db *tensor, layer, chunkMin int) dnRecurArgs {
	m, d := &c.b.meta, c.spec.DeltaNet
	return dnRecurArgs{
		out: out, x: x, ldx: int32(ldx), ba: ba, aLog: al.ptr, adt: int32(al.dt), dtBias: db.ptr, bdt: int32(db.dt), state: c.rec[layer],
		HK: int32(d.KeyHeads), HV: int32(d.ValueHeads), dk: int32(d.KeyDim), dv: int32(d.ValueDim), recN: int32(c.recN),
		chunkMin: int32(chunkMin), tiled: boolInt(d.TiledHeads),
		seqpos: m.dev[mSeqPos], seqn: m.dev[mSeqN], seqstart: m.dev[mSeqStart], slots: m.dev[mSeqSlot]}
}

// CapturesStates is true: a step's captures leave the states of its
// sequences at their offsets (Begin lays out the rounds, CausalConv1d and
// GatedDeltaRule write the captures' slots).
func (b *Backend) CapturesStates() bool { return true }

// GatedDeltaRule runs the gated delta rule over each sequence's recurrent
// state; see backend.Backend. As on the CPU, a sequence advancing by
// spec.Chunk tokens or more takes the chunked form (dn_chunk_prep, then
// dn_chunk_run, in chunks of dnChunkLen tokens whatever spec.Chunk is: the
// results do not depend on the chunk length), the others the recurrence
// token by token (dn_recur, a block per sequence and value head). Both
// compute the norms and the gates as they read q, k, b and a.
func (b *Backend) GatedDeltaRule(out, qkv, ba, aLog, dtBias backend.Tensor, spec *backend.DeltaNetSpec, stc backend.StateCache, layer int) {
	c := b.stateOf("delta rule", stc, layer)
	c.checkSpec("delta rule", spec)
	m := &b.meta
	T, S := m.T, m.S
	HK, HV, dk, dv := spec.KeyHeads, spec.ValueHeads, spec.KeyDim, spec.ValueDim
	ot, xt, bt := asT(out), asT(qkv), asT(ba)
	checkRows("delta rule qkv", xt, T, spec.ConvDim())
	checkRows("delta rule ba", bt, T, 2*HV)
	checkRows("delta rule out", ot, T, HV*dv)
	checkF32("delta rule", ot, xt, bt)
	al, db := asT(aLog), asT(dtBias)
	if al.numel() != HV || db.numel() != HV {
		panic(fmt.Sprintf("cuda: delta rule: A_log %v, dt_bias %v for %d value heads", al, db, HV))
	}
	if T == 0 {
		return
	}
	chunkMin := c.chunkMin(spec)
	// run advances the sequences by the segments the metadata at seqpos,
	// seqn and seqstart give (ns: seqn's host copy; maxN the longest).
	run := func(seqpos, seqn, seqstart devptr, ns []int32, maxN int) {
		long, short := 0, false
		for _, n := range ns {
			if int(n) >= chunkMin {
				long++
			} else if n > 0 {
				short = true
			}
		}
		if long > 0 {
			k := c.chunk
			// dn_chunk_prep's results for dn_chunk_run, per (token, value head):
			// q, k and W rows as bf16 hi and lo, P's row likewise, U's row, G.
			th := T * HV
			wB, pB, uB := 4*th*dk, 4*th*dnChunkLen, 4*th*dv
			qg := b.scratchBuf("deltanet.chunk", 3*wB+pB+uB+4*th)
			kd, wg := qg+devptr(wB), qg+devptr(2*wB)
			pg := wg + devptr(wB)
			ug := pg + devptr(pB)
			gg := ug + devptr(uB)
			if k.prepSmem > 48<<10 {
				b.allowSmem(k.prep.name, k.prepSmem)
			}
			if k.runSmem > 48<<10 {
				b.allowSmem(k.run.name, k.runSmem)
			}
			k.prep.run(b, [3]int{(maxN + dnChunkLen - 1) / dnChunkLen, HV, S}, 256, k.prepSmem, dnChunkPrepArgs{
				qkv: xt.ptr, ba: bt.ptr, aLog: al.ptr, adt: int32(al.dt), dtBias: db.ptr, bdt: int32(db.dt),
				qg: qg, kd: kd, wg: wg, pg: pg, ug: ug, gg: gg, HK: int32(HK), HV: int32(HV), DV: int32(dv), chunkMin: int32(chunkMin),
				tiled: boolInt(spec.TiledHeads), seqn: seqn, seqstart: seqstart})
			k.run.run(b, [3]int{dv / k.dvs, HV, S}, 32*k.warp, k.runSmem, dnChunkRunArgs{
				out: ot.ptr, qg: qg, kd: kd, wg: wg, pg: pg, ug: ug, gg: gg, state: c.rec[layer], HV: int32(HV), DV: int32(dv), recN: int32(c.recN),
				chunkMin: int32(chunkMin), seqpos: seqpos, seqn: seqn, seqstart: seqstart, slots: m.dev[mSeqSlot]})
			c.chunked += long
		}
		if short {
			a := c.recurArgs(ot.ptr, xt.ptr, xt.cols(), bt.ptr, al, db, layer, chunkMin)
			a.seqpos, a.seqn, a.seqstart = seqpos, seqn, seqstart
			dnRecurKernel.run(b, [3]int{S, HV, (dv + 31) / 32}, 128, 0, a)
		}
	}
	if m.rounds == 1 {
		run(m.dev[mSeqPos], m.dev[mSeqN], m.dev[mSeqStart], m.host[mSeqN], m.maxN)
		return
	}
	// With captures, round r advances each sequence by its r-th segment
	// (as a step of its own would: the results are the CPU's), and the
	// captures that end there take the state it leaves.
	for r := range m.rounds {
		off := devptr(4 * r * S)
		run(m.dev[mRoundPos]+off, m.dev[mRoundN]+off, m.dev[mRoundStart]+off, m.host[mRoundN][r*S:(r+1)*S], m.roundMaxN[r])
		for _, cp := range m.caps {
			if cp.round == r {
				src := int(m.host[mSeqSlot][cp.seq])
				b.copyDtoD(c.rec[layer]+devptr(4*cp.slot*c.recN), c.rec[layer]+devptr(4*src*c.recN), 4*c.recN)
			}
		}
	}
}
