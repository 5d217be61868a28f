//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
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
}

// NewStateCache allocates zeroed recurrent state for spec.Slots sequences.
func (b *Backend) NewStateCache(spec backend.StateSpec) (backend.StateCache, error) {
	if err := spec.Check(); err != nil {
		return nil, fmt.Errorf("cuda: %w", err)
	}
	d := spec.DeltaNet
	// dn_recur runs a thread per column of a head's state, which sits in
	// shared memory, and a thread per key element for the norms.
	if d.KeyDim > d.ValueDim || d.ValueDim > 1024 || 4*(d.KeyDim*d.ValueDim+2*d.KeyDim) > b.smemOp {
		return nil, fmt.Errorf("cuda: Gated DeltaNet heads of key dim %d, value dim %d are not supported; use --backend cpu", d.KeyDim, d.ValueDim)
	}
	c := &stateCache{b: b, spec: spec}
	c.convN, c.recN = spec.SlotFloats()
	for range spec.Layers {
		for _, n := range []int{c.convN, c.recN} {
			p, err := b.malloc(4 * spec.Slots * n)
			if err != nil {
				c.Free()
				return nil, fmt.Errorf("cuda: state cache of %d slots: %w", spec.Slots, err)
			}
			if err := check("cuMemsetD32Async", C.k_cuMemsetD32Async(p, 0, C.size_t(spec.Slots*n), b.stream)); err != nil {
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
		b.fail(check("cuMemcpyDtoHAsync", C.k_cuMemcpyDtoHAsync_v2(unsafe.Add(host, off), p, C.size_t(n), b.stream)))
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
	host := b.staging(len(src))
	// The staging buffer may still feed a queued read-back: wait first.
	b.fail(b.Sync())
	copy(unsafe.Slice((*byte)(host), len(src)), src)
	off := 0
	c.parts(slot, func(p devptr, n int) {
		b.fail(check("cuMemcpyHtoDAsync", C.k_cuMemcpyHtoDAsync_v2(p, unsafe.Add(host, off), C.size_t(n), b.stream)))
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

// GatedDeltaNet runs the recurrent core of a DeltaNet layer; see
// backend.Backend. The delta rule runs token by token for every sequence
// (the CPU backend's chunked form for long prompts is not ported yet), a
// block per (sequence, value head).
func (b *Backend) GatedDeltaNet(out, mixed, ba backend.Tensor, w backend.DeltaNetWeights, spec *backend.DeltaNetSpec, stc backend.StateCache, layer int) {
	c, ok := stc.(*stateCache)
	if !ok {
		panic(fmt.Sprintf("cuda: deltanet: state cache of another backend (%T)", stc))
	}
	sp := *spec
	sp.Chunk = c.spec.DeltaNet.Chunk
	if sp != c.spec.DeltaNet {
		panic(fmt.Sprintf("cuda: deltanet: spec %+v does not match the state cache's %+v", *spec, c.spec.DeltaNet))
	}
	if layer < 0 || layer >= c.spec.Layers {
		panic(fmt.Sprintf("cuda: deltanet: layer %d of %d", layer, c.spec.Layers))
	}
	m := &b.meta
	T, S := m.T, m.S
	HK, HV, dk, dv, K := spec.KeyHeads, spec.ValueHeads, spec.KeyDim, spec.ValueDim, spec.ConvKernel
	CD := spec.ConvDim()
	ot, mt, bt := asT(out), asT(mixed), asT(ba)
	checkRows("deltanet mixed", mt, T, CD)
	checkRows("deltanet ba", bt, T, 2*HV)
	checkRows("deltanet out", ot, T, HV*dv)
	checkF32("deltanet", ot, mt, bt)
	cw, al, db := asT(w.ConvW), asT(w.ALog), asT(w.DtBias)
	if cw.numel() != CD*K || al.numel() != HV || db.numel() != HV {
		panic(fmt.Sprintf("cuda: deltanet: weights conv %v, A_log %v, dt_bias %v for %d channels of kernel %d, %d heads", cw, al, db, CD, K, HV))
	}
	for _, s := range m.host[mSeqSlot] {
		c.checkSlot(int(s))
	}
	if T == 0 {
		return
	}
	qkv := b.scratchBuf("deltanet.qkv", 4*T*CD)
	b.run("dn_conv", [3]int{T, (CD + 255) / 256, 1}, 256, 0, qkv, mt.ptr, cw.ptr, int(cw.dt), c.conv[layer], CD, K, c.convN,
		m.dev[mTokSeq], m.dev[mSeqPos], m.dev[mSeqStart], m.dev[mSeqSlot])
	b.run("dn_conv_hist", [3]int{S, (CD + 255) / 256, 1}, 256, 0, c.conv[layer], mt.ptr, CD, K, c.convN,
		m.dev[mSeqPos], m.dev[mSeqN], m.dev[mSeqStart], m.dev[mSeqSlot])
	smem := 4 * (dk*dv + 2*dk)
	if smem > 48<<10 {
		b.allowSmem("dn_recur", smem)
	}
	b.run("dn_recur", [3]int{S, HV, 1}, dv, smem, ot.ptr, qkv, bt.ptr, al.ptr, int(al.dt), db.ptr, int(db.dt), c.rec[layer],
		HK, HV, dk, dv, c.recN, m.dev[mSeqPos], m.dev[mSeqN], m.dev[mSeqStart], m.dev[mSeqSlot])
}
