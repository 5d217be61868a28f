//go:build cgo

package cuda

import (
	"fmt"

	"github.com/kiln-llm/kiln/backend"
)

// kvCache is the paged cache: per layer, K then V, each [Blocks, BlockSize,
// KVHeads, HeadDim] of f32 or bf16, in one allocation.
type kvCache struct {
	b     *Backend
	spec  backend.KVSpec
	ptr   devptr
	plane int // bytes of one layer's K (or V) pool
}

// NewKVCache allocates a paged KV cache (f32 or bf16) on the device.
func (b *Backend) NewKVCache(spec backend.KVSpec) (backend.KVCache, error) {
	if spec.Layers < 0 || spec.Blocks <= 0 || spec.BlockSize <= 0 || spec.KVHeads <= 0 || spec.HeadDim <= 0 {
		return nil, fmt.Errorf("cuda: kv cache: invalid spec %+v", spec)
	}
	if spec.DType != backend.F32 && spec.DType != backend.BF16 {
		return nil, fmt.Errorf("cuda: kv cache: unsupported dtype %v (want f32 or bf16)", spec.DType)
	}
	if !attnHeadDim(spec.HeadDim) {
		// Refused here, when the model is loaded, rather than by the first
		// attention call.
		return nil, fmt.Errorf("cuda: attention head dim %d is not supported (16, 32, 64, 128 or 256); use --backend cpu", spec.HeadDim)
	}
	plane := spec.Blocks * spec.BlockSize * spec.KVHeads * spec.HeadDim * spec.DType.Size()
	p, err := b.malloc(2 * spec.Layers * plane)
	if err != nil {
		return nil, fmt.Errorf("cuda: kv cache of %d MiB: %w", 2*spec.Layers*plane>>20, err)
	}
	return &kvCache{b: b, spec: spec, ptr: p, plane: plane}, nil
}

func (c *kvCache) Spec() backend.KVSpec { return c.spec }

func (c *kvCache) k(layer int) devptr { return c.ptr + devptr(2*layer*c.plane) }
func (c *kvCache) v(layer int) devptr { return c.ptr + devptr((2*layer+1)*c.plane) }

// CopyBlock copies physical block src to dst in every layer (queued).
func (c *kvCache) CopyBlock(dst, src int) {
	if dst < 0 || src < 0 || dst >= c.spec.Blocks || src >= c.spec.Blocks {
		panic(fmt.Sprintf("cuda: copy block %d to %d of %d", src, dst, c.spec.Blocks))
	}
	bs := c.plane / c.spec.Blocks
	for p := 0; p < 2*c.spec.Layers; p++ {
		base := c.ptr + devptr(p*c.plane)
		c.b.copyDtoD(base+devptr(dst*bs), base+devptr(src*bs), bs)
	}
}

func (c *kvCache) Free() {
	if c.ptr != 0 {
		c.b.fail(c.b.Sync())
		c.b.freePtr(c.ptr)
		c.ptr = 0
	}
}

// attnHeadDim reports whether the attention kernels take head dim hd (each
// is compiled per head dim).
func attnHeadDim(hd int) bool {
	switch hd {
	case 16, 32, 64, 128, 256:
		return true
	}
	return false
}

// Attention runs one attention layer; see backend.Backend.
func (b *Backend) Attention(out, qkv backend.Tensor, w backend.AttnWeights, spec *backend.AttnSpec, kvc backend.KVCache, layer int) {
	ot, qt := asT(out), asT(qkv)
	c, ok := kvc.(*kvCache)
	if !ok {
		panic(fmt.Sprintf("cuda: attention: kv cache of another backend (%T)", kvc))
	}
	m := &b.meta
	T := m.T
	H, KH, hd, rd := spec.Heads, spec.KVHeads, spec.HeadDim, spec.RotaryDim
	if H <= 0 || KH <= 0 || H%KH != 0 || !attnHeadDim(hd) || rd < 0 || rd > hd || rd%2 != 0 || len(spec.Rope.InvFreq) != rd/2 {
		panic(fmt.Sprintf("cuda: attention: invalid or unsupported spec %+v", *spec))
	}
	if c.spec.KVHeads != KH || c.spec.HeadDim != hd || layer < 0 || layer >= c.spec.Layers {
		panic(fmt.Sprintf("cuda: attention: layer %d of cache %+v for spec %+v", layer, c.spec, *spec))
	}
	checkRows("attention qkv", qt, T, spec.QKVWidth())
	checkRows("attention out", ot, T, H*hd)
	checkAct("attention", ot, qt)
	bs := c.spec.BlockSize
	seqN, seqPos := m.host[mSeqN], m.host[mSeqPos]
	for i := range seqN {
		blk := m.host[mBlocks][m.host[mSeqBlk][i]:]
		if i+1 < len(seqN) {
			blk = m.host[mBlocks][m.host[mSeqBlk][i]:m.host[mSeqBlk][i+1]]
		}
		if need := (int(seqPos[i]+seqN[i]) + bs - 1) / bs; len(blk) < need {
			panic(fmt.Sprintf("cuda: attention: sequence %d has %d blocks, needs %d for %d tokens", i, len(blk), need, seqPos[i]+seqN[i]))
		}
		for _, x := range blk {
			if x < 0 || int(x) >= c.spec.Blocks {
				panic(fmt.Sprintf("cuda: attention: sequence %d uses block %d of %d", i, x, c.spec.Blocks))
			}
		}
	}
	if T == 0 {
		return
	}
	var rf [128]float32
	copy(rf[:], spec.Rope.InvFreq)
	qn, kn := asT(w.QNorm), asT(w.KNorm)
	if qn.numel() != hd || kn.numel() != hd || qn.dt != kn.dt {
		panic(fmt.Sprintf("cuda: attention: q/k norms %v %v for head dim %d", qn, kn, hd))
	}
	checkFloatW("attention", qn)
	// The rotated queries, in the cache's type (what the kernels multiply the
	// keys in).
	qbuf := b.scratchBuf("attnq", T*H*hd*c.spec.DType.Size())
	kvdt := int(c.spec.DType)
	// Eight heads a block (one per warp) while that leaves blocks to fill
	// the GPU; a long prompt has enough tokens for a block per token, which
	// makes the token's cos/sin table once instead of once per eight heads.
	hpb := 8
	if T >= 4*b.sms {
		hpb = H + 2*KH
	}
	b.run("qk_norm_rope", [3]int{T, (H + 2*KH + hpb - 1) / hpb, 1}, 256, 0,
		qt.ptr, int(qt.dt), qbuf, c.k(layer), c.v(layer), kvdt, qn.ptr, kn.ptr, int(qn.dt), boolInt(spec.UnitOffsetNorm),
		m.dev[mTokPos], m.dev[mTokSeq], m.dev[mSeqBlk], m.dev[mBlocks],
		H, KH, hd, rd, boolInt(spec.Gated), spec.NormEps, spec.Rope.AttnFactor, bs, hpb, rf[:])

	kn2 := "bf16"
	if c.spec.DType == backend.F32 {
		kn2 = "f32"
	}
	G := H / KH
	// Decode: tensor cores on bf16 caches of head dim 64 or 128 (any group
	// of up to 16 query heads per kv head), else the scalar kernel (f32
	// caches, head dim 256; groups of 1, 2, 4 or 8).
	mma := c.spec.DType == backend.BF16 && (hd == 64 || hd == 128) && G <= 16
	scalar := (hd == 64 || hd == 128 || hd == 256) && (G == 1 || G == 2 || G == 4 || G == 8)
	if (mma || scalar) && m.maxN <= 4 {
		name, perSM, smem := fmt.Sprintf("attn_decode_%s_%d_%d", kn2, hd, G), b.splitBlocks, 0
		if mma {
			// Three stages of 64 keys and values, bf16.
			name, perSM, smem = fmt.Sprintf("attn_decode_mma_%d", hd), b.mmaSplitBlocks, 3*2*64*(hd+8)*2
			b.allowSmem(name, smem)
		}
		// As many splits as fill one wave of blocks: a partial second
		// wave of short splits measured slower (tensor-core kernel, batch
		// 16 at 640 tokens: three splits 2146 tok/s, two 2181-2187; the
		// scalar kernel of f32 caches follows the rule unmeasured).
		S := max(1, min(b.splitMax, perSM*b.sms/(T*KH)))
		pm := b.scratchBuf("attnm", T*H*S*4)
		pl := b.scratchBuf("attnl", T*H*S*4)
		pacc := b.scratchBuf("attnacc", T*H*S*hd*4)
		b.launchKernel(name, b.pdl, [3]int{T, KH, S}, 128, smem,
			qbuf, c.k(layer), c.v(layer), m.dev[mTokPos], m.dev[mTokSeq], m.dev[mSeqPos], m.dev[mSeqBlk], m.dev[mBlocks],
			pm, pl, pacc, H, KH, bs, spec.Scale)
		b.runOverlapped("attn_combine", [3]int{T, H, 1}, 4*hd, 0, ot.ptr, int(ot.dt), pm, pl, pacc, qt.ptr, int(qt.dt), m.dev[mTokPos], H, KH, hd, S, boolInt(spec.Gated))
		return
	}
	if c.spec.DType == backend.BF16 && (hd == 64 || hd == 128 || hd == 256) {
		bq, bk := flashTile(m.maxN)
		if hd == 256 {
			// Qwen3-Next's heads: one tile shape, whose 256-wide
			// accumulators fill the registers (241, no spills).
			bq, bk = 64, 32
		}
		name := fmt.Sprintf("flash_prefill_%d_%d_%d", bq, bk, hd)
		// Two stages of bk keys and values, then the bq queries, bf16.
		smem := (2*2*bk + bq) * (hd + 8) * 2
		if smem > 48<<10 {
			b.allowSmem(name, smem)
		}
		b.run(name, [3]int{H, (m.maxN + bq - 1) / bq, m.S}, 128, smem,
			ot.ptr, int(ot.dt), qbuf, c.k(layer), c.v(layer), qt.ptr, int(qt.dt),
			m.dev[mSeqPos], m.dev[mSeqN], m.dev[mSeqStart], m.dev[mSeqBlk], m.dev[mBlocks],
			H, KH, bs, spec.Scale, boolInt(spec.Gated))
		return
	}
	name := fmt.Sprintf("attn_prefill_%s_%d", kn2, hd)
	smem := 2 * 32 * hd * 4
	if smem > 48<<10 {
		b.allowSmem(name, smem)
	}
	b.run(name, [3]int{(m.maxN + 31) / 32, H, m.S}, 128, smem,
		ot.ptr, int(ot.dt), qbuf, c.k(layer), c.v(layer), qt.ptr, int(qt.dt),
		m.dev[mSeqPos], m.dev[mSeqN], m.dev[mSeqStart], m.dev[mSeqBlk], m.dev[mBlocks],
		H, KH, bs, spec.Scale, boolInt(spec.Gated))
}

// flashTile returns the query and key tile of the flash prefill kernel for
// a step whose longest sequence adds maxN tokens (kernels/flash.cu). On an
// H100 (Qwen3-8B shapes, 2026-11-22): prefill of 512 tokens 36.2K tok/s
// with 128 x 64 tiles, 38.9K with 64 x 64, 38.4K with 64 x 32; 1K 38.1K /
// 39.4K / 37.7K; serving's passes of 13 decoding sequences beside three
// 512-token prompts 36.7K / 37.6K / 38.9K, beside one 29.9K / 32.0K /
// 33.1K.
func flashTile(maxN int) (bq, bk int) {
	switch {
	case maxN <= 512:
		return 64, 32
	case maxN <= 1024:
		return 64, 64
	}
	return 128, 64
}
