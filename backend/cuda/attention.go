//go:build cgo

package cuda

import (
	"fmt"
	"unsafe"

	"github.com/kiln-llm/kiln/backend"
)

// The kernels of kernels/attention.cu and flash.cu.
var (
	qkNormRopeKernel  = newKernel[qkNormRopeArgs]("qk_norm_rope")
	ropeKernel        = newKernel[ropeArgs]("rope")
	kvStoreKernel     = newKernel[kvStoreArgs]("kv_store")
	attnCombineKernel = newKernel[attnCombineArgs]("attn_combine")
	kvMoveKernel      = newKernel[kvMoveArgs]("kv_move")
	// The scalar decode kernels by cache type, head dim and query heads
	// per kv head.
	attnDecodeKernels = map[attnShape]kernel[attnDecodeArgs]{}
	// The tensor-core decode kernels of bf16 caches by head dim, and their
	// fused form (q/k norms, RoPE and the combine inside).
	attnDecodeMMAKernels   = map[[3]int]kernel[attnDecodeArgs]{}      // by head dim, stages and tiles of 8 heads
	attnDecodeFusedKernels = map[[3]int]kernel[attnDecodeFusedArgs]{} // by head dim, stages and tiles of 8 heads
	// The flash prefill kernels of bf16 caches by query tile, key tile and
	// head dim.
	flashKernels = map[[3]int]kernel[flashArgs]{}
	// flashSplitKernels are the tiles with split keys, by the same key.
	flashSplitKernels = map[[3]int]kernel[flashArgs]{}
	// flashWGKernels are flash_wg's, by head dim (Hopper's; flashWG).
	flashWGKernels = map[int]kernel[attnPrefillArgs]{}
	// The prefill kernels of the other caches and head dims, by cache
	// type and head dim (G 0).
	attnPrefillKernels = map[attnShape]kernel[attnPrefillArgs]{}
)

// The tensor-core decode attention (attn_decode_mma) stages tiles of
// decodeMMAKeys keys and values (DM_BK), decodeMMAStages deep where a block
// may take their shared memory (decodeStages).
// A split of the decode attention takes at least decodeSplitMMA keys on
// tensor cores (a tile), decodeSplitScalar in the scalar kernel (a round
// of its warps at head dim 256): below that, short contexts leave splits
// idle (DS_MMA, DS_SCALAR). Qwen3-Next's heads (256, eight query heads a
// kv head) at 1K tokens took 17 us a layer in 16 splits of 64 keys, the
// warps' shuffles most of it (H200, scripts/ktrace).
const (
	decodeMMAKeys     = 64
	decodeSplitMMA    = decodeMMAKeys
	decodeSplitScalar = 16
	decodeMMAStages   = 3
)

// The scalar prefill attention (attn_prefill) takes attnPrefillQueries
// queries a block, four threads each, and walks the keys in tiles of
// attnPrefillKeys (AP_BQ, AP_BK).
const (
	attnPrefillQueries = 32
	attnPrefillKeys    = 32
)

// attnShape picks an attention kernel: the cache's type, the head dim and
// the query heads per kv head.
type attnShape struct {
	kv    backend.DType
	hd, G int
}

func init() {
	for _, s := range []attnShape{{backend.BF16, 256, 0}, {backend.F32, 64, 0}, {backend.F32, 128, 0}, {backend.F32, 256, 0}} {
		for _, G := range []int{1, 2, 4, 8} {
			s.G = G
			attnDecodeKernels[s] = newKernel[attnDecodeArgs](fmt.Sprintf("attn_decode_%v_%d_%d", s.kv, s.hd, G))
		}
	}
	for _, s := range [][2]int{{64, decodeMMAStages}, {128, decodeMMAStages}, {128, 2}} {
		for ng := 1; ng <= 2; ng++ {
			k := [3]int{s[0], s[1], ng}
			attnDecodeMMAKernels[k] = newKernel[attnDecodeArgs](fmt.Sprintf("attn_decode_mma_%d_%d_%d", s[0], s[1], ng))
			attnDecodeFusedKernels[k] = newKernel[attnDecodeFusedArgs](fmt.Sprintf("attn_decode_fused_%d_%d_%d", s[0], s[1], ng))
		}
	}
	for _, t := range [][3]int{{128, 64, 64}, {128, 64, 128}, {64, 64, 64}, {64, 64, 128}, {64, 32, 64}, {64, 32, 128}, {64, 32, 256}} {
		flashKernels[t] = newKernel[flashArgs](fmt.Sprintf("flash_prefill_%d_%d_%d", t[0], t[1], t[2]))
	}
	for _, hd := range []int{64, 128, 256} {
		flashWGKernels[hd] = newKernel[attnPrefillArgs](fmt.Sprintf("flash_wg_%d", hd))
	}
	for _, t := range [][3]int{{64, 64, 64}, {64, 64, 128}, {64, 32, 64}, {64, 32, 128}, {64, 32, 256}, {128, 32, 64}, {128, 32, 128}} {
		flashSplitKernels[t] = newKernel[flashArgs](fmt.Sprintf("flash_split_%d_%d_%d", t[0], t[1], t[2]))
	}
	for _, s := range []attnShape{{backend.BF16, 16, 0}, {backend.BF16, 32, 0}, {backend.BF16, 256, 0},
		{backend.F32, 16, 0}, {backend.F32, 32, 0}, {backend.F32, 64, 0}, {backend.F32, 128, 0}, {backend.F32, 256, 0}} {
		attnPrefillKernels[s] = newKernel[attnPrefillArgs](fmt.Sprintf("attn_prefill_%v_%d", s.kv, s.hd))
	}
}

// ropeFreq is struct RopeFreq: a rotary embedding's inverse frequencies.
type ropeFreq struct {
	f [128]float32
}

type qkNormRopeArgs struct {
	qkv                            devptr
	qdt                            int32
	qbuf, kc, vc                   devptr
	kvdt                           int32
	qn, kn                         devptr
	wdt, unitOffset                int32
	tokpos, tokseq, seqblk, blocks devptr
	H, KH, hd, rd, gated           int32
	eps, attnFactor                float32
	bs, hpb                        int32
	rf                             ropeFreq
}

type ropeArgs struct {
	x             devptr
	dt            int32
	tokpos        devptr
	heads, hd, rd int32
	attnFactor    float32
	rf            ropeFreq
}

type kvStoreArgs struct {
	kc, vc                         devptr
	kvdt                           int32
	k                              devptr
	kdt                            int32
	v                              devptr
	vdt                            int32
	tokpos, tokseq, seqblk, blocks devptr
	n, bs                          int32
}

type attnDecodeArgs struct {
	qbuf, kc, vc                                   devptr
	tokpos, tokseq, seqpos, seqblk, blocks, pm, pl devptr
	pacc                                           devptr
	H, KH, bs                                      int32
	scale                                          float32
}

type attnDecodeFusedArgs struct {
	kc, vc                                 devptr
	tokpos, tokseq, seqpos, seqblk, blocks devptr
	H, KH, bs                              int32
	scale                                  float32
	f                                      decodeFuse
	rf                                     ropeFreq
}

// decodeFuse is struct DecodeFuse: what attn_decode_fused takes to be
// qk_norm_rope too and write the output.
type decodeFuse struct {
	qkv             devptr
	qdt             int32
	qn, kn          devptr
	wdt, unitOffset int32
	eps, attnFactor float32
	rd, gated       int32
	out             devptr
	odt             int32
}

type attnCombineArgs struct {
	out          devptr
	odt          int32
	pm, pl, pacc devptr
	qkv          devptr
	qdt          int32
	tokpos       devptr
	H, KH, HD, S int32
	gated        int32
	least        int32 // decode: the fewest keys a split (0: all S splits hold partials)
}

type attnPrefillArgs struct {
	out                                    devptr
	odt                                    int32
	qbuf, kc, vc, qkv                      devptr
	qdt                                    int32
	seqpos, seqn, seqstart, seqblk, blocks devptr
	H, KH, bs                              int32
	scale                                  float32
	gated                                  int32
}

// flashArgs are the flash prefill kernel's: attn_prefill's, then where its
// split partial results go.
type flashArgs struct {
	attnPrefillArgs
	pm, pl, pacc     devptr
	nsplit, splitLen int32
}

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
	if spec.BlockSize&(spec.BlockSize-1) != 0 {
		// The decode attention finds a key's block by a shift (kernels/flash.cu).
		return nil, fmt.Errorf("cuda: kv cache: block size %d is not a power of two", spec.BlockSize)
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

// moveBlocks copies blocks between the cache and host (their bytes, as
// SaveBlocks lays them out), in batches of at most 16 MiB through a device
// buffer: one copy of a batch's bytes and one kv_move kernel that scatters
// them to the blocks or gathers them (a block's K and V of each layer apart
// were 2 x layers copies a block: 8.1K for a 21.6K-token conversation of
// three attention layers, whose restore's device part went from 77-83 to
// 35-62 ms on an H100). Pageable host memory goes to the device through
// the pinned staging buffer; a copy into it returns once the bytes are
// there.
func (c *kvCache) moveBlocks(blocks []int, host []byte, toDevice bool) error {
	bb := c.spec.BlockBytes()
	if len(host) != len(blocks)*bb {
		return fmt.Errorf("cuda: %d bytes for %d KV blocks of %d", len(host), len(blocks), bb)
	}
	ids := make([]int32, len(blocks))
	for i, blk := range blocks {
		if blk < 0 || blk >= c.spec.Blocks {
			return fmt.Errorf("cuda: KV block %d of %d", blk, c.spec.Blocks)
		}
		ids[i] = int32(blk)
	}
	b := c.b
	// Queued passes first: they may still write the blocks saved, or read
	// those restored.
	if err := b.Sync(); err != nil {
		return err
	}
	per, pieces := c.plane/c.spec.Blocks, 2*c.spec.Layers
	// From page-locked memory (HostBuffer) the copies start from host
	// itself; other memory goes through the two halves of the pinned
	// staging buffer, a batch's copy over the bus overlapping the host's
	// copy of the next into the other half (straight from pageable memory
	// the bus ran at 3.5 GB/s: 133 MB in 35-39 ms on an H100).
	batch := max(1, (16<<20)/bb)
	locked := b.pageLocked(host)
	var stage unsafe.Pointer
	if toDevice && !locked {
		stage = b.staging(2 * batch * bb)
	}
	for i := 0; i < len(blocks); i += batch {
		n := min(batch, len(blocks)-i)
		buf, idbuf := b.scratchBuf("kvmove", n*bb), b.scratchBuf("kvmoveids", 4*n)
		part := host[i*bb : (i+n)*bb]
		b.copyHtoD(idbuf, unsafe.Pointer(&ids[i]), 4*n)
		switch {
		case toDevice && locked:
			b.copyHtoD(buf, unsafe.Pointer(&part[0]), len(part))
		case toDevice:
			if err := b.stageToDevice(buf, part, stage, i/batch%2, batch*bb); err != nil {
				return err
			}
		}
		kvMoveKernel.run(b, [3]int{n, pieces, 1}, 256, 0, kvMoveArgs{cache: c.ptr, buf: buf, blocks: idbuf,
			plane: int64(c.plane), per: int32(per), pieces: int32(pieces), gather: boolInt(!toDevice)})
		if !toDevice {
			b.copyDtoH(unsafe.Pointer(&part[0]), buf, len(part))
		}
	}
	return b.Sync()
}

type kvMoveArgs struct {
	cache, buf, blocks devptr
	plane              int64
	per, pieces        int32
	gather             int32
}

// SaveBlocks waits for queued work and copies blocks to dst (see
// backend.KVCache).
func (c *kvCache) SaveBlocks(blocks []int, dst []byte) error {
	return c.moveBlocks(blocks, dst, false)
}

// RestoreBlocks writes blocks saved by SaveBlocks; it returns once the
// copies are done.
func (c *kvCache) RestoreBlocks(blocks []int, src []byte) error {
	return c.moveBlocks(blocks, src, true)
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

// cacheOf returns kvc as this backend's cache after checking layer and
// the step's block tables against it.
func (b *Backend) cacheOf(what string, kvc backend.KVCache, layer int) *kvCache {
	c, ok := kvc.(*kvCache)
	if !ok {
		panic(fmt.Sprintf("cuda: %s: kv cache of another backend (%T)", what, kvc))
	}
	if layer < 0 || layer >= c.spec.Layers {
		panic(fmt.Sprintf("cuda: %s: layer %d of cache %+v", what, layer, c.spec))
	}
	m := &b.meta
	bs := c.spec.BlockSize
	seqN, seqPos := m.host[mSeqN], m.host[mSeqPos]
	for i := range seqN {
		blk := m.host[mBlocks][m.host[mSeqBlk][i]:]
		if i+1 < len(seqN) {
			blk = m.host[mBlocks][m.host[mSeqBlk][i]:m.host[mSeqBlk][i+1]]
		}
		if need := (int(seqPos[i]+seqN[i]) + bs - 1) / bs; len(blk) < need {
			panic(fmt.Sprintf("cuda: %s: sequence %d has %d blocks, needs %d for %d tokens", what, i, len(blk), need, seqPos[i]+seqN[i]))
		}
		for _, x := range blk {
			if x < 0 || int(x) >= c.spec.Blocks {
				panic(fmt.Sprintf("cuda: %s: sequence %d uses block %d of %d", what, i, x, c.spec.Blocks))
			}
		}
	}
	return c
}

// ropeFreqs is a rotary embedding's frequencies as the kernels take them.
func ropeFreqs(r *backend.Rope) ropeFreq {
	var rf ropeFreq
	if len(r.InvFreq) > len(rf.f) {
		panic(fmt.Sprintf("cuda: rope of %d frequencies (the kernels take %d)", len(r.InvFreq), len(rf.f)))
	}
	copy(rf.f[:], r.InvFreq)
	return rf
}

// RoPE rotates each head of x by its token's position; see
// backend.Backend.
func (b *Backend) RoPE(x backend.Tensor, headDim int, r *backend.Rope) {
	xt := asT(x)
	T, W := b.meta.T, xt.cols()
	half := len(r.InvFreq)
	if xt.rows() != T || headDim <= 0 || W%headDim != 0 || 2*half > headDim {
		panic(fmt.Sprintf("cuda: rope of %v: %d tokens, head dim %d, %d frequencies", xt, T, headDim, half))
	}
	checkAct("rope", xt)
	ropeKernel.run(b, g1(T), 256, 0, ropeArgs{x: xt.ptr, dt: int32(xt.dt), tokpos: b.meta.dev[mTokPos],
		heads: int32(W / headDim), hd: int32(headDim), rd: int32(2 * half), attnFactor: r.AttnFactor, rf: ropeFreqs(r)})
}

// StoreKV writes each token's keys and values into the cache; see
// backend.Backend.
func (b *Backend) StoreKV(kvc backend.KVCache, layer int, k, v backend.Tensor) {
	kt, vt := asT(k), asT(v)
	c := b.cacheOf("store kv", kvc, layer)
	m := &b.meta
	n := c.spec.KVHeads * c.spec.HeadDim
	checkRows("store kv k", kt, m.T, n)
	checkRows("store kv v", vt, m.T, n)
	checkAct("store kv", kt, vt)
	kvStoreKernel.run(b, g1(m.T), 256, 0, kvStoreArgs{kc: c.k(layer), vc: c.v(layer), kvdt: int32(c.spec.DType),
		k: kt.ptr, kdt: int32(kt.dt), v: vt.ptr, vdt: int32(vt.dt),
		tokpos: m.dev[mTokPos], tokseq: m.dev[mTokSeq], seqblk: m.dev[mSeqBlk], blocks: m.dev[mBlocks], n: int32(n), bs: int32(c.spec.BlockSize)})
}

// Attend computes each token's causal attention over its sequence's
// cache; see backend.Backend. The queries are the kernels' in the cache's
// type: others are converted first.
func (b *Backend) Attend(out, q backend.Tensor, kvc backend.KVCache, layer int, scale float32) {
	ot, qt := asT(out), asT(q)
	c := b.cacheOf("attend", kvc, layer)
	hd, T := c.spec.HeadDim, b.meta.T
	if qt.cols()%hd != 0 {
		panic(fmt.Sprintf("cuda: attend: q %v is not whole heads of %d", qt, hd))
	}
	checkRows("attend q", qt, T, qt.cols())
	checkRows("attend out", ot, T, qt.cols())
	checkAct("attend", ot, qt)
	qbuf := qt.ptr
	if qt.dt != c.spec.DType {
		qbuf = b.scratchBuf("attnq", qt.numel()*c.spec.DType.Size())
		b.cast(qbuf, c.spec.DType, qt.ptr, qt.dt, qt.numel())
	}
	b.attend(ot, qbuf, c, layer, qt.cols()/hd, scale, nil)
}

// Attention runs an attention layer's steps on its fused projection; see
// backend.FusedAttention. qk_norm_rope normalises and rotates the queries
// into a buffer of the cache's type and the keys into the cache, where it
// also stores the values; the attention kernels gate their output.
func (b *Backend) Attention(out, qkv backend.Tensor, w backend.AttnWeights, spec *backend.AttnSpec, kvc backend.KVCache, layer int) {
	ot, qt := asT(out), asT(qkv)
	c := b.cacheOf("attention", kvc, layer)
	m := &b.meta
	T := m.T
	H, KH, hd, rd := spec.Heads, spec.KVHeads, spec.HeadDim, spec.RotaryDim
	if H <= 0 || KH <= 0 || H%KH != 0 || !attnHeadDim(hd) || rd < 0 || rd > hd || rd%2 != 0 || len(spec.Rope.InvFreq) != rd/2 {
		panic(fmt.Sprintf("cuda: attention: invalid or unsupported spec %+v", *spec))
	}
	if c.spec.KVHeads != KH || c.spec.HeadDim != hd {
		panic(fmt.Sprintf("cuda: attention: cache %+v for spec %+v", c.spec, *spec))
	}
	checkRows("attention qkv", qt, T, spec.QKVWidth())
	checkRows("attention out", ot, T, H*hd)
	checkAct("attention", ot, qt)
	if T == 0 {
		return
	}
	qn, kn := asT(w.QNorm), asT(w.KNorm)
	if qn.numel() != hd || kn.numel() != hd || qn.dt != kn.dt {
		panic(fmt.Sprintf("cuda: attention: q/k norms %v %v for head dim %d", qn, kn, hd))
	}
	checkFloatW("attention", qn)
	// A decode step with a block a token and kv head: the fused kernel.
	if b.fusedDecode && m.maxN == 1 && decodeMMA(c, H/KH) && b.decodeSplits(T, KH, b.decodeMMAPerSM(hd, H/KH)) == 1 {
		st := b.decodeStages(hd)
		k, smem := kernelFor(attnDecodeFusedKernels, [3]int{hd, st, headTiles(H / KH)}), decodeMMASmem(hd, st)
		b.allowSmem(k.name, smem)
		k.runOverlapped(b, [3]int{T, KH, 1}, 128, smem, attnDecodeFusedArgs{
			kc: c.k(layer), vc: c.v(layer), tokpos: m.dev[mTokPos], tokseq: m.dev[mTokSeq], seqpos: m.dev[mSeqPos],
			seqblk: m.dev[mSeqBlk], blocks: m.dev[mBlocks], H: int32(H), KH: int32(KH), bs: int32(c.spec.BlockSize), scale: spec.Scale,
			f: decodeFuse{qkv: qt.ptr, qdt: int32(qt.dt), qn: qn.ptr, kn: kn.ptr, wdt: int32(qn.dt), unitOffset: boolInt(spec.UnitOffsetNorm),
				eps: spec.NormEps, attnFactor: spec.Rope.AttnFactor, rd: int32(rd), gated: boolInt(spec.Gated), out: ot.ptr, odt: int32(ot.dt)},
			rf: ropeFreqs(&spec.Rope)})
		return
	}
	// The rotated queries, in the cache's type (what the kernels multiply the
	// keys in).
	qbuf := b.scratchBuf("attnq", T*H*hd*c.spec.DType.Size())
	// Eight heads a block (one per warp) while that leaves blocks to fill
	// the GPU; a long prompt has enough tokens for a block per token, which
	// makes the token's cos/sin table once instead of once per eight heads.
	hpb := 8
	if T >= 4*b.sms {
		hpb = H + 2*KH
	}
	qkNormRopeKernel.runOverlapped(b, [3]int{T, (H + 2*KH + hpb - 1) / hpb, 1}, 256, 0, qkNormRopeArgs{
		qkv: qt.ptr, qdt: int32(qt.dt), qbuf: qbuf, kc: c.k(layer), vc: c.v(layer), kvdt: int32(c.spec.DType),
		qn: qn.ptr, kn: kn.ptr, wdt: int32(qn.dt), unitOffset: boolInt(spec.UnitOffsetNorm),
		tokpos: m.dev[mTokPos], tokseq: m.dev[mTokSeq], seqblk: m.dev[mSeqBlk], blocks: m.dev[mBlocks],
		H: int32(H), KH: int32(KH), hd: int32(hd), rd: int32(rd), gated: boolInt(spec.Gated),
		eps: spec.NormEps, attnFactor: spec.Rope.AttnFactor, bs: int32(c.spec.BlockSize), hpb: int32(hpb), rf: ropeFreqs(&spec.Rope)})
	var gates *tensor
	if spec.Gated {
		gates = qt
	}
	b.attend(ot, qbuf, c, layer, H, spec.Scale, gates)
}

// attend writes to out [T, H*hd] the attention of the queries at qbuf ([T,
// H, hd] of the cache's type) over layer's cache; gates, when set, is a
// gated layer's fused projection, whose gates multiply the output by their
// sigmoid.
func (b *Backend) attend(ot *tensor, qbuf devptr, c *kvCache, layer, H int, scale float32, gates *tensor) {
	m := &b.meta
	T, KH, hd := m.T, c.spec.KVHeads, c.spec.HeadDim
	if H <= 0 || H%KH != 0 {
		panic(fmt.Sprintf("cuda: attention: %d query heads for %d kv heads", H, KH))
	}
	if T == 0 {
		return
	}
	var qkv devptr
	var qdt int32
	if gates != nil {
		qkv, qdt = gates.ptr, int32(gates.dt)
	}
	G := H / KH
	// Decode: tensor cores on bf16 caches of head dim 64 or 128 (any group
	// of up to 16 query heads per kv head), else the scalar kernel (f32
	// caches, head dim 256; groups of 1, 2, 4 or 8).
	mma := decodeMMA(c, G)
	scalar := (hd == 64 || hd == 128 || hd == 256) && (G == 1 || G == 2 || G == 4 || G == 8)
	if (mma || scalar) && m.maxN <= 4 {
		var k kernel[attnDecodeArgs]
		perSM, smem, least := b.splitBlocks, 0, decodeSplitScalar
		if mma {
			// The stages of keys and values, rows of hd + 8 bf16.
			st := b.decodeStages(hd)
			k, perSM, smem, least = kernelFor(attnDecodeMMAKernels, [3]int{hd, st, headTiles(G)}), b.decodeMMAPerSM(hd, G), decodeMMASmem(hd, st), decodeSplitMMA
		} else {
			k = kernelFor(attnDecodeKernels, attnShape{c.spec.DType, hd, G})
		}
		S := b.decodeSplits(T, KH, perSM)
		pm := b.scratchBuf("attnm", T*H*S*4)
		pl := b.scratchBuf("attnl", T*H*S*4)
		pacc := b.scratchBuf("attnacc", T*H*S*hd*4)
		k.runOverlapped(b, [3]int{T, KH, S}, 128, smem, attnDecodeArgs{
			qbuf: qbuf, kc: c.k(layer), vc: c.v(layer), tokpos: m.dev[mTokPos], tokseq: m.dev[mTokSeq], seqpos: m.dev[mSeqPos],
			seqblk: m.dev[mSeqBlk], blocks: m.dev[mBlocks], pm: pm, pl: pl, pacc: pacc, H: int32(H), KH: int32(KH), bs: int32(c.spec.BlockSize), scale: scale})
		attnCombineKernel.runOverlapped(b, [3]int{T, H, 1}, 4*hd, 0, attnCombineArgs{
			out: ot.ptr, odt: int32(ot.dt), pm: pm, pl: pl, pacc: pacc, qkv: qkv, qdt: qdt, tokpos: m.dev[mTokPos],
			H: int32(H), KH: int32(KH), HD: int32(hd), S: int32(S), gated: boolInt(gates != nil), least: int32(least)})
		return
	}
	pa := attnPrefillArgs{
		out: ot.ptr, odt: int32(ot.dt), qbuf: qbuf, kc: c.k(layer), vc: c.v(layer), qkv: qkv, qdt: qdt,
		seqpos: m.dev[mSeqPos], seqn: m.dev[mSeqN], seqstart: m.dev[mSeqStart], seqblk: m.dev[mSeqBlk], blocks: m.dev[mBlocks],
		H: int32(H), KH: int32(KH), bs: int32(c.spec.BlockSize), scale: scale, gated: boolInt(gates != nil)}
	if c.spec.DType == backend.BF16 && (hd == 64 || hd == 128 || hd == 256) && b.flashWG && m.maxN > flashWGMin {
		k, smem := flashWGKernels[hd], flashWGSmem(hd)
		b.allowSmem(k.name, smem)
		k.run(b, [3]int{H, (m.maxN + 127) / 128, m.S}, 256, smem, pa)
		return
	}
	if c.spec.DType == backend.BF16 && (hd == 64 || hd == 128 || hd == 256) {
		bq, bk := b.flashTileFor(m.maxN, hd)
		k := kernelFor(flashKernels, [3]int{bq, bk, hd})
		fa := flashArgs{attnPrefillArgs: pa, nsplit: 1}
		tiles, smem := (m.maxN+bq-1)/bq, flashSmem(bq, bk, hd)
		if bq == 64 {
			sq, sk := bq, bk
			if hd != 256 && b.flashSplitQueries == 128 {
				sq, sk = 128, 32
			}
			ks, ktiles, ksmem := kernelFor(flashSplitKernels, [3]int{sq, sk, hd}), (m.maxN+sq-1)/sq, flashSmem(sq, sk, hd)
			if ksmem > 48<<10 {
				b.allowSmem(ks.name, ksmem)
			}
			if S, L := b.flashSplits(H*ktiles*m.S, b.residentBlocks(ks.name, 128, ksmem), T*H*hd*4, sk); S > 1 {
				k, tiles, smem = ks, ktiles, ksmem
				fa.nsplit, fa.splitLen = int32(S), int32(L)
				fa.pm, fa.pl = b.scratchBuf("attnm", T*H*S*4), b.scratchBuf("attnl", T*H*S*4)
				fa.pacc = b.scratchBuf("attnacc", T*H*S*hd*4)
			}
		}
		if smem > 48<<10 {
			b.allowSmem(k.name, smem)
		}
		k.run(b, [3]int{H, tiles, m.S * int(fa.nsplit)}, 128, smem, fa)
		if fa.nsplit > 1 {
			attnCombineKernel.run(b, [3]int{T, H, 1}, 4*hd, 0, attnCombineArgs{
				out: ot.ptr, odt: int32(ot.dt), pm: fa.pm, pl: fa.pl, pacc: fa.pacc, qkv: qkv, qdt: qdt, tokpos: m.dev[mTokPos],
				H: int32(H), KH: int32(KH), HD: int32(hd), S: fa.nsplit, gated: boolInt(gates != nil)})
		}
		return
	}
	k := kernelFor(attnPrefillKernels, attnShape{c.spec.DType, hd, 0})
	// A tile of keys and one of values, f32.
	smem := 2 * attnPrefillKeys * hd * 4
	if smem > 48<<10 {
		b.allowSmem(k.name, smem)
	}
	k.run(b, [3]int{(m.maxN + attnPrefillQueries - 1) / attnPrefillQueries, H, m.S}, 4*attnPrefillQueries, smem, pa)
}

// decodeMMA reports whether decode attention over cache c with G query
// heads a kv head runs on tensor cores (attn_decode_mma, or fused): bf16
// caches of head dim 64 or 128, up to 16 query heads a kv head.
func decodeMMA(c *kvCache, G int) bool {
	return c.spec.DType == backend.BF16 && (c.spec.HeadDim == 64 || c.spec.HeadDim == 128) && G <= 16
}

// decodeMMASmem is attn_decode_mma's shared memory: st stages of keys and
// values, rows of hd + 8 bf16.
func decodeMMASmem(hd, st int) int { return st * 2 * decodeMMAKeys * (hd + 8) * 2 }

// decodeStages is how many stages the tensor-core decode attention of head
// dim hd takes: decodeMMAStages where a block may have their shared
// memory, else two (head dim 128 on GPUs of 99 KB a block: sm_86, sm_89).
// Two stages everywhere measured -4% at batch 64 on an H200 (512 blocks
// over three a multiprocessor, against two waves of two), +1% at 16
// (branch wip/decode-2stage, NOTES.md).
func (b *Backend) decodeStages(hd int) int {
	if decodeMMASmem(hd, decodeMMAStages)+decodeMMAStatic <= b.smemOp {
		return decodeMMAStages
	}
	return 2
}

// headTiles is how many tiles of 8 query heads the tensor-core decode
// attention takes for G heads a kv head (the columns of its mmas).
func headTiles(G int) int { return (G + 7) / 8 }

// decodeMMAStatic bounds the kernel's static shared memory (its warps'
// maxima and sums: 1.5 KB under NVRTC 12.4), which the block's limit
// counts with the stages.
const decodeMMAStatic = 2 << 10

// decodeMMAPerSM is how many blocks of the tensor-core decode attention of
// head dim hd and G query heads a kv head a multiprocessor holds, up to
// KILN_CUDA_MMA_SPLIT_BLOCKS: the splits fill that many (two on Hopper,
// one on GPUs of 100 KB a multiprocessor).
func (b *Backend) decodeMMAPerSM(hd, G int) int {
	st := b.decodeStages(hd)
	k, smem := kernelFor(attnDecodeMMAKernels, [3]int{hd, st, headTiles(G)}), decodeMMASmem(hd, st)
	b.allowSmem(k.name, smem)
	return min(b.mmaSplitBlocks, b.residentBlocks(k.name, 128, smem))
}

// decodeSplits is the number of splits of the decode attention's keys for
// T tokens: as many as fill one wave of perSM blocks a multiprocessor (a
// partial second wave of short splits measured slower: NOTES.md, "Figures
// behind the code"; the scalar kernel of f32 caches follows the rule
// unmeasured).
func (b *Backend) decodeSplits(T, KH, perSM int) int {
	return max(1, min(b.splitMax, perSM*b.sms/(T*KH)))
}

// flashSmem is the flash prefill kernel's shared memory: two stages of bk
// keys and values, then the bq queries, rows of hd + 8 bf16.
func flashSmem(bq, bk, hd int) int {
	return (2*2*bk + bq) * (hd + 8) * 2
}

// flashWGSmem is flash_wg's shared memory: the 128 queries, then two
// stages of 64 keys and of 64 values, rows of hd bf16, and room to align
// the first to 1024 bytes.
func flashWGSmem(hd int) int {
	return (128+4*64)*hd*2 + 1024
}

// flashWGMin: steps whose longest sequence adds more tokens take flash_wg
// (where flashWG), whose 128-query tiles are too few to fill the GPU below
// (flashTile's threshold for flash_prefill's).
const flashWGMin = 1024

// flashSplits returns how many ranges of how many keys (a multiple of bk)
// the flash prefill kernel cuts the step's keys into, for a grid of blocks
// blocks, resident of which one multiprocessor holds, whose rows' partial
// results take rowBytes each: a step whose blocks fill less than one wave
// and whose longest sequence has at least two ranges of flashSplitKeys
// splits into as many ranges as whole waves hold (a follow-up turn's chunk
// after a long conversation: a few blocks per head, each walking all the
// keys), keeping the partial results within flashSplitBytes. Whole waves:
// at 106K tokens of history a 90-token chunk's 32 blocks in 9 ranges made
// 288 blocks for 264 places, two waves for the time of one and a tenth
// (5.1 ms in three layers, H200 timeline, docs/performance.md).
func (b *Backend) flashSplits(blocks, resident, rowBytes, bk int) (n, keys int) {
	n = min(resident*b.sms/blocks, b.meta.maxCtx/flashSplitKeys, flashSplitBytes/rowBytes, 64)
	if n <= 1 {
		return 1, 0
	}
	keys = (b.meta.maxCtx + n - 1) / n
	keys = (keys + bk - 1) / bk * bk
	return (b.meta.maxCtx + keys - 1) / keys, keys
}

const (
	flashSplitKeys  = 256      // the fewest keys a split range takes
	flashSplitBytes = 64 << 20 // most bytes of split partial results
)

// flashTileFor is flashTile for head dim hd on this GPU: Qwen3-Next's 256
// take one tile shape, whose 256-wide accumulators fill the registers (241,
// no spills); 128-query tiles at head dim 128 take 102 KB of shared memory,
// so GPUs of 99 KB a block (sm_86, sm_89) take 64.
func (b *Backend) flashTileFor(maxN, hd int) (bq, bk int) {
	bq, bk = flashTile(maxN)
	if hd == 256 {
		return 64, 32
	}
	if flashSmem(bq, bk, hd) > b.smemOp {
		return 64, 64
	}
	return bq, bk
}

// flashTile returns the query and key tile of the flash prefill kernel for
// a step whose longest sequence adds maxN tokens (kernels/flash.cu):
// short prompts make too few 128-query blocks to fill the GPU, and the
// thresholds are where the smaller tiles stopped winning on an H100
// (NOTES.md, "Figures behind the code").
func flashTile(maxN int) (bq, bk int) {
	switch {
	case maxN <= 512:
		return 64, 32
	case maxN <= 1024:
		return 64, 64
	}
	return 128, 64
}
