package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"sync"

	"github.com/kiln-llm/kiln/backend"
)

// kvCache holds per layer a K and a V pool of [Blocks, BlockSize, KVHeads,
// HeadDim] elements, f32 or bf16.
type kvCache struct {
	spec backend.KVSpec
	k, v []kvPool // per layer
}

// kvPool is one layer's K or V pool; exactly one of f32 and b16 is set.
type kvPool struct {
	f32 []float32
	b16 []uint16
}

// NewKVCache allocates a zeroed paged KV cache.
func (b *Backend) NewKVCache(spec backend.KVSpec) (backend.KVCache, error) {
	if spec.Layers < 0 || spec.Blocks <= 0 || spec.BlockSize <= 0 || spec.KVHeads <= 0 || spec.HeadDim <= 0 {
		return nil, fmt.Errorf("cpu: kv cache: invalid spec %+v", spec)
	}
	if spec.DType != backend.F32 && spec.DType != backend.BF16 {
		return nil, fmt.Errorf("cpu: kv cache: unsupported dtype %v (want f32 or bf16)", spec.DType)
	}
	n := spec.Blocks * spec.BlockSize * spec.KVHeads * spec.HeadDim
	c := &kvCache{spec: spec}
	alloc := func() kvPool {
		if spec.DType == backend.F32 {
			return kvPool{f32: make([]float32, n)}
		}
		return kvPool{b16: make([]uint16, n)}
	}
	for range spec.Layers {
		c.k = append(c.k, alloc())
		c.v = append(c.v, alloc())
	}
	return c, nil
}

func (c *kvCache) Spec() backend.KVSpec { return c.spec }

// CopyBlock copies physical block src to dst in every layer.
func (c *kvCache) CopyBlock(dst, src int) {
	if dst < 0 || src < 0 || dst >= c.spec.Blocks || src >= c.spec.Blocks {
		panic(fmt.Sprintf("cpu: copy block %d to %d of %d", src, dst, c.spec.Blocks))
	}
	bs := c.spec.BlockSize * c.spec.KVHeads * c.spec.HeadDim
	for l := range c.k {
		for _, p := range []kvPool{c.k[l], c.v[l]} {
			if p.f32 != nil {
				copy(p.f32[dst*bs:(dst+1)*bs], p.f32[src*bs:(src+1)*bs])
			} else {
				copy(p.b16[dst*bs:(dst+1)*bs], p.b16[src*bs:(src+1)*bs])
			}
		}
	}
}

// blockParts calls f with each layer's K and V of block b, in SaveBlocks'
// order.
func (c *kvCache) blockParts(blocks []int, size int, f func(p kvPool, off, at int)) error {
	if size != len(blocks)*c.spec.BlockBytes() {
		return fmt.Errorf("cpu: %d bytes for %d KV blocks of %d", size, len(blocks), c.spec.BlockBytes())
	}
	n := c.spec.BlockSize * c.spec.KVHeads * c.spec.HeadDim
	at := 0
	for _, b := range blocks {
		if b < 0 || b >= c.spec.Blocks {
			return fmt.Errorf("cpu: KV block %d of %d", b, c.spec.Blocks)
		}
		for l := range c.k {
			for _, p := range []kvPool{c.k[l], c.v[l]} {
				f(p, b*n, at)
				at += n * c.spec.DType.Size()
			}
		}
	}
	return nil
}

// SaveBlocks copies blocks to dst (see backend.KVCache).
func (c *kvCache) SaveBlocks(blocks []int, dst []byte) error {
	n := c.spec.BlockSize * c.spec.KVHeads * c.spec.HeadDim
	return c.blockParts(blocks, len(dst), func(p kvPool, off, at int) {
		for i := range n {
			if p.f32 != nil {
				binary.LittleEndian.PutUint32(dst[at+4*i:], math.Float32bits(p.f32[off+i]))
			} else {
				binary.LittleEndian.PutUint16(dst[at+2*i:], p.b16[off+i])
			}
		}
	})
}

// RestoreBlocks writes blocks saved by SaveBlocks.
func (c *kvCache) RestoreBlocks(blocks []int, src []byte) error {
	n := c.spec.BlockSize * c.spec.KVHeads * c.spec.HeadDim
	return c.blockParts(blocks, len(src), func(p kvPool, off, at int) {
		for i := range n {
			if p.f32 != nil {
				p.f32[off+i] = math.Float32frombits(binary.LittleEndian.Uint32(src[at+4*i:]))
			} else {
				p.b16[off+i] = binary.LittleEndian.Uint16(src[at+2*i:])
			}
		}
	})
}

func (c *kvCache) Free() { c.k, c.v = nil, nil }

func (p kvPool) store(off int, src []float32) {
	if p.f32 != nil {
		copy(p.f32[off:off+len(src)], src)
		return
	}
	dst := p.b16[off : off+len(src)]
	for i, v := range src {
		dst[i] = backend.BF16Bits(v)
	}
}

// dotRows sets out[r] = q . row(off + r*stride).
func (p kvPool) dotRows(q []float32, off, stride int, out []float32) {
	if p.f32 != nil {
		dotRowsF32(q, p.f32[off:], stride, out)
	} else {
		dotRowsBF16(q, p.b16[off:], stride, out)
	}
}

// dot2Rows sets out0[r] = scale * q0 . row(off + r*stride) and out1[r] =
// scale * q1 . row(off + r*stride) for r < len(out0), q0 and q1 q's halves.
func (p kvPool) dot2Rows(q []float32, off, stride int, scale float32, out0, out1 []float32) {
	if p.f32 != nil {
		dot2RowsF32(q, p.f32[off:], stride, scale, out0, out1)
	} else {
		dot2RowsBF16(q, p.b16[off:], stride, scale, out0, out1)
	}
}

// axpy2Rows adds sum_r w0[r] * row(off + r*stride) to acc's first half
// and sum_r w1[r] * row(off + r*stride) to its second, r < len(w0).
func (p kvPool) axpy2Rows(acc, w0, w1 []float32, off, stride int) {
	if p.f32 != nil {
		axpy2RowsF32(acc, w0, w1, p.f32[off:], stride)
	} else {
		axpy2RowsBF16(acc, w0, w1, p.b16[off:], stride)
	}
}

// axpyRows adds sum_r w[r] * row(off + r*stride) to acc.
func (p kvPool) axpyRows(acc, w []float32, off, stride int) {
	if p.f32 != nil {
		axpyRowsF32(acc, w, p.f32[off:], stride)
	} else {
		axpyRowsBF16(acc, w, p.b16[off:], stride)
	}
}

// load converts the row at off to float32 in dst.
func (p kvPool) load(dst []float32, off int) {
	if p.f32 != nil {
		copy(dst, p.f32[off:off+len(dst)])
		return
	}
	for i, h := range p.b16[off : off+len(dst)] {
		dst[i] = backend.BF16ToF32(h)
	}
}

// ropeRow rotates the first 2*len(cos) dims of x, NeoX style (halves).
func ropeRow(x, cos, sin []float32) {
	half := len(cos)
	for i := range half {
		x1, x2 := x[i], x[i+half]
		x[i] = x1*cos[i] - x2*sin[i]
		x[i+half] = x2*cos[i] + x1*sin[i]
	}
}

// ropeTables fills cos and sin ([half] each) for a position: the angle is
// pos*invFreq rounded to float32, as transformers computes it.
func ropeTables(r *backend.Rope, pos int, cos, sin []float32) {
	for i, f := range r.InvFreq {
		a := float64(float32(pos) * f)
		cos[i] = float32(math.Cos(a)) * r.AttnFactor
		sin[i] = float32(math.Sin(a)) * r.AttnFactor
	}
}

// ropeKey identifies a RoPE's tables: the layers of a model share their
// frequencies.
type ropeKey struct {
	freq   *float32
	half   int
	factor float32
}

// stepRope returns the step's tables for r, each token's cos and sin
// ([T, half] each), made by the first layer of the step that asks for them
// (every layer of a decode step rotates the same positions).
func (b *Backend) stepRope(r *backend.Rope) (cos, sin []float32) {
	st := &b.step
	half := len(r.InvFreq)
	key := ropeKey{half: half, factor: r.AttnFactor}
	if half > 0 {
		key.freq = &r.InvFreq[0]
	}
	T := len(st.tokPos)
	if !st.ropeMade || st.rope != key {
		st.ropeCos, st.ropeSin = grow(&st.ropeCos, T*half), grow(&st.ropeSin, T*half)
		for t, pos := range st.tokPos {
			ropeTables(r, int(pos), st.ropeCos[t*half:(t+1)*half], st.ropeSin[t*half:(t+1)*half])
		}
		st.rope, st.ropeMade = key, true
	}
	return st.ropeCos[:T*half], st.ropeSin[:T*half]
}

// cacheOf returns kvc as this backend's cache after checking layer and
// the step's block tables against it.
func (b *Backend) cacheOf(what string, kvc backend.KVCache, layer int) *kvCache {
	c, ok := kvc.(*kvCache)
	if !ok {
		panic(fmt.Sprintf("cpu: %s: kv cache of another backend (%T)", what, kvc))
	}
	if layer < 0 || layer >= c.spec.Layers {
		panic(fmt.Sprintf("cpu: %s: layer %d of cache %+v", what, layer, c.spec))
	}
	bs := c.spec.BlockSize
	for i, s := range b.step.seqs {
		if need := (s.Pos + s.N + bs - 1) / bs; len(s.Blocks) < need {
			panic(fmt.Sprintf("cpu: %s: sequence %d has %d blocks, needs %d for %d tokens", what, i, len(s.Blocks), need, s.Pos+s.N))
		}
		for _, blk := range s.Blocks {
			if blk < 0 || int(blk) >= c.spec.Blocks {
				panic(fmt.Sprintf("cpu: %s: sequence %d uses block %d of %d", what, i, blk, c.spec.Blocks))
			}
		}
	}
	return c
}

// call sets a to what the parts of an attention over layer share, for H
// query heads q [T, H, hd] and the output o, and returns it.
func (c *kvCache) call(a *attnCall, layer, H int, scale float32, q, o []float32) *attnCall {
	KH := c.spec.KVHeads
	if H <= 0 || H%KH != 0 {
		panic(fmt.Sprintf("cpu: attention: %d query heads for %d kv heads", H, KH))
	}
	*a = attnCall{H: H, KH: KH, G: H / KH, hd: c.spec.HeadDim, bs: c.spec.BlockSize, scale: scale, q: q, o: o, kp: c.k[layer], vp: c.v[layer]}
	return a
}

// RoPE rotates each head of x by its token's position; see
// backend.Backend.
func (b *Backend) RoPE(x backend.Tensor, headDim int, r *backend.Rope) {
	xt := asT(x)
	T, W := matrix(xt)
	half := len(r.InvFreq)
	if T != b.numTokens() || headDim <= 0 || W%headDim != 0 || 2*half > headDim {
		panic(fmt.Sprintf("cpu: rope of %v: %d tokens, head dim %d, %d frequencies", xt, b.numTokens(), headDim, half))
	}
	xs := xt.out32()
	cos, sin := b.stepRope(r)
	b.pool.For(T, 1, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			for h := t * W; h < (t+1)*W; h += headDim {
				ropeRow(xs[h:h+headDim], cos[t*half:(t+1)*half], sin[t*half:(t+1)*half])
			}
		}
	})
}

// StoreKV writes each token's keys and values into the cache; see
// backend.Backend.
func (b *Backend) StoreKV(kvc backend.KVCache, layer int, k, v backend.Tensor) {
	kt, vt := asT(k), asT(v)
	c := b.cacheOf("store kv", kvc, layer)
	n := c.spec.KVHeads * c.spec.HeadDim
	checkShape("store kv k", kt, b.numTokens(), n)
	checkShape("store kv v", vt, b.numTokens(), n)
	b.storeKV(c, layer, kt.f32(), n, vt.f32(), n)
}

// storeKV writes token t's keys k[t*kStride:] and values v[t*vStride:]
// (KVHeads*HeadDim each) at its position in layer's pools. The writes run
// serially: padding rows (see backend.SeqInfo) may all write one spare
// block, so parallel stores would race. They are a small copy next to the
// attention itself.
func (b *Backend) storeKV(c *kvCache, layer int, k []float32, kStride int, v []float32, vStride int) {
	st := &b.step
	KH, hd, bs := c.spec.KVHeads, c.spec.HeadDim, c.spec.BlockSize
	kp, vp := c.k[layer], c.v[layer]
	for t := range st.tokens {
		s := &st.seqs[st.tokSeq[t]]
		pos := int(st.tokPos[t])
		slot := (int(s.Blocks[pos/bs])*bs + pos%bs) * KH * hd
		kp.store(slot, k[t*kStride:t*kStride+KH*hd])
		vp.store(slot, v[t*vStride:t*vStride+KH*hd])
	}
}

// Attend computes each token's causal attention over its sequence's
// cache; see backend.Backend.
func (b *Backend) Attend(out, q backend.Tensor, kvc backend.KVCache, layer int, scale float32) {
	ot, qt := asT(out), asT(q)
	c := b.cacheOf("attend", kvc, layer)
	hd := c.spec.HeadDim
	T, W := matrix(qt)
	if T != b.numTokens() || W%hd != 0 {
		panic(fmt.Sprintf("cpu: attend: q %v for %d tokens of heads of %d", qt, b.numTokens(), hd))
	}
	checkShape("attend out", ot, T, W)
	b.attend(c.call(&b.attn, layer, W/hd, scale, qt.f32(), ot.out32()))
}

// attend computes every token of the step: long prefills through the
// blocked kernel, other tokens one by one.
func (b *Backend) attend(a *attnCall) {
	st := &b.step
	var direct []int32
	for si, s := range st.seqs {
		if s.N >= blockedMinTokens && a.hd%gemmCols == 0 {
			b.attendBlocked(a, &st.seqs[si], st.seqStart[si])
			continue
		}
		for i := range s.N {
			direct = append(direct, int32(st.seqStart[si]+i))
		}
	}
	b.attendDirect(a, direct)
}

// MulSigmoid multiplies x by sigmoid(gate); see backend.Backend.
func (b *Backend) MulSigmoid(x, gate backend.Tensor) {
	xt, gt := asT(x), asT(gate)
	n, w := matrix(xt)
	checkShape("mul sigmoid gate", gt, xt.shape...)
	xs, gs := xt.out32(), gt.f32()
	b.pool.For(n, max(1, 4096/max(w, 1)), func(lo, hi int) {
		mulSigmoid(xs[lo*w:hi*w], gs[lo*w:hi*w])
	})
}

// mulSigmoid sets x[i] *= sigmoid(gate[i]).
func mulSigmoid(x, gate []float32) {
	for i, g := range gate[:len(x)] {
		x[i] *= sigmoid(g)
	}
}

// Attention runs an attention layer's steps on its fused projection; see
// backend.FusedAttention. The q/k norms and RoPE take one pass over the
// projection and the gate reads it in place, so that no step's input is
// copied out of it.
func (b *Backend) Attention(out, qkv backend.Tensor, w backend.AttnWeights, spec *backend.AttnSpec, kvc backend.KVCache, layer int) {
	ot, qt := asT(out), asT(qkv)
	T := b.numTokens()
	H, KH, hd, rd := spec.Heads, spec.KVHeads, spec.HeadDim, spec.RotaryDim
	if H <= 0 || KH <= 0 || H%KH != 0 || hd <= 0 || rd < 0 || rd > hd || rd%2 != 0 || len(spec.Rope.InvFreq) != rd/2 {
		panic(fmt.Sprintf("cpu: attention: invalid spec %+v", *spec))
	}
	c := b.cacheOf("attention", kvc, layer)
	if c.spec.KVHeads != KH || c.spec.HeadDim != hd {
		panic(fmt.Sprintf("cpu: attention: cache %+v for spec %+v", c.spec, *spec))
	}
	width := spec.QKVWidth()
	checkShape("attention qkv", qt, T, width)
	checkShape("attention out", ot, T, H*hd)
	if T == 0 {
		return
	}
	qn := normWeights(w.QNorm, hd, spec.UnitOffsetNorm)
	kn := normWeights(w.KNorm, hd, spec.UnitOffsetNorm)
	x := qt.f32()
	o := ot.out32()
	qStride := hd
	if spec.Gated {
		qStride = 2 * hd
	}
	kOff, vOff := H*qStride, H*qStride+KH*hd
	// Queries (normed, rotated) go to a scratch buffer; keys and values into the cache.
	q, k := grow(&b.attnQ, T*H*hd), grow(&b.attnK, T*KH*hd)
	half := rd / 2
	cosT, sinT := b.stepRope(&spec.Rope)
	b.pool.For(T, 1, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			cos, sin := cosT[t*half:(t+1)*half], sinT[t*half:(t+1)*half]
			row := x[t*width : (t+1)*width]
			for h := range H {
				qh := q[(t*H+h)*hd : (t*H+h+1)*hd]
				rmsNormRow(qh, row[h*qStride:h*qStride+hd], qn, spec.NormEps)
				ropeRow(qh, cos, sin)
			}
			for h := range KH {
				kh := k[(t*KH+h)*hd : (t*KH+h+1)*hd]
				rmsNormRow(kh, row[kOff+h*hd:kOff+(h+1)*hd], kn, spec.NormEps)
				ropeRow(kh, cos, sin)
			}
		}
	})
	b.storeKV(c, layer, k, KH*hd, x[vOff:], width)
	b.attend(c.call(&b.attn, layer, H, spec.Scale, q, o))
	if spec.Gated {
		b.pool.For(T, 1, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				for h := range H {
					mulSigmoid(o[(t*H+h)*hd:(t*H+h+1)*hd], x[t*width+h*qStride+hd:])
				}
			}
		})
	}
}

// attnCall holds what the parts of one Attention call share: queries q [T,
// H, hd] (normed and rotated), the output o [T, H, hd] and the layer's cache.
type attnCall struct {
	H, KH, G, hd, bs int // G query heads share a kv head
	scale            float32
	q, o             []float32
	kp, vp           kvPool
}

// slot returns the cache offset of (position, kv head) of sequence s.
func (a *attnCall) slot(s *backend.SeqInfo, pos, kh int) int {
	return ((int(s.Blocks[pos/a.bs])*a.bs+pos%a.bs)*a.KH + kh) * a.hd
}

// attnPart is positions [j0, j1) of token t's attention (attendDirect).
type attnPart struct{ t, j0, j1 int }

// directScratch is attendDirect's, kept for the next call: a decode step
// allocating afresh every layer has the garbage collector return pages to
// the system and fault them back in.
type directScratch struct {
	parts      []attnPart
	first      []int
	stats, acc []float32
}

// scoresPool holds attendDirect tasks' score rows.
var scoresPool = sync.Pool{New: func() any { return new([]float32) }}

// decodeSpan is the number of positions one task of attendDirect covers
// (rounded to whole cache blocks); a variable for tests.
var decodeSpan = 256

// attendDirect computes the given tokens of the step one at a time, split
// into spans of positions (flash-decoding): each task computes, for every
// query head, the span's softmax statistics and weighted values from the
// cache blocks it reads in order, and the spans of a token are then merged.
// Long contexts thus use every thread even for a single token, and each
// block is read once, all heads together, as one sequential stretch.
func (b *Backend) attendDirect(a *attnCall, tokens []int32) {
	st := &b.step
	H, hd := a.H, a.hd
	span := max(1, decodeSpan/a.bs) * a.bs
	ws := &b.direct
	parts := ws.parts[:0]
	first := ws.first[:0] // parts of tokens[i]: first[i]..first[i+1]
	for _, t := range tokens {
		first = append(first, len(parts))
		n := int(st.tokPos[t]) + 1
		for j0 := 0; j0 < n; j0 += span {
			parts = append(parts, attnPart{int(t), j0, min(j0+span, n)})
		}
	}
	first = append(first, len(parts))
	ws.parts, ws.first = parts, first
	// Per part and head: the max score, the sum of exp(score - max), and
	// the values weighted by exp(score - max).
	stats := grow(&ws.stats, len(parts)*H*2)
	acc := grow(&ws.acc, len(parts)*H*hd)
	// Too few parts to keep every thread busy (a short decode) are split
	// further by kv heads, which write disjoint heads of the part's stats.
	groups := 1
	if len(parts) > 0 && len(parts) < 2*b.pool.threads {
		groups = min(a.KH, (2*b.pool.threads+len(parts)-1)/len(parts))
	}
	per := (a.KH + groups - 1) / groups
	b.pool.For(len(parts)*groups, 1, func(lo, hi int) {
		buf := scoresPool.Get().(*[]float32)
		defer scoresPool.Put(buf)
		scores := grow(buf, H*span)
		for i := lo; i < hi; i++ {
			p, kh0 := parts[i/groups], i%groups*per
			if kh0 >= a.KH {
				continue
			}
			pi := i / groups
			a.attendSpan(&st.seqs[st.tokSeq[p.t]], p.t, p.j0, p.j1, kh0, min(kh0+per, a.KH), scores, stats[pi*2*H:(pi+1)*2*H], acc[pi*H*hd:(pi+1)*H*hd])
		}
	})
	b.pool.For(len(tokens), 1, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			t := int(tokens[i])
			for h := range H {
				m := float32(math.Inf(-1))
				for pi := first[i]; pi < first[i+1]; pi++ {
					m = max(m, stats[(pi*H+h)*2])
				}
				o := a.o[(t*H+h)*hd : (t*H+h+1)*hd]
				clear(o)
				var l float32
				for pi := first[i]; pi < first[i+1]; pi++ {
					w := expf(stats[(pi*H+h)*2] - m)
					l += w * stats[(pi*H+h)*2+1]
					axpy(o, w, acc[(pi*H+h)*hd:(pi*H+h+1)*hd])
				}
				for d := range o {
					o[d] /= l
				}
			}
		}
	})
}

// attendSpan computes, for token t, positions [j0, j1) of its sequence and
// the query heads of kv heads [kh0, kh1), each query head h's max score
// stats[2h], sum of exp(score - max) stats[2h+1], and acc[h] = sum of
// exp(score - max) * value. scores is scratch of H*(j1-j0) floats.
func (a *attnCall) attendSpan(s *backend.SeqInfo, t, j0, j1, kh0, kh1 int, scores, stats, acc []float32) {
	G, H, KH, hd, bs := a.G, a.H, a.KH, a.hd, a.bs
	n := j1 - j0
	stride := KH * hd
	// Query heads go in pairs, which read each key and value once (G is
	// even in every Qwen model); an odd one out goes alone.
	for b0 := j0; b0 < j1; b0 += bs { // j0 is block-aligned
		rows := min(bs, j1-b0)
		for kh := kh0; kh < kh1; kh++ {
			off := a.slot(s, b0, kh)
			for g := 0; g < G; g += 2 {
				h := kh*G + g
				sc := scores[h*n+b0-j0 : h*n+b0-j0+rows]
				if g+1 < G {
					a.kp.dot2Rows(a.q[(t*H+h)*hd:(t*H+h+2)*hd], off, stride, a.scale, sc, scores[(h+1)*n+b0-j0:])
					continue
				}
				a.kp.dotRows(a.q[(t*H+h)*hd:(t*H+h+1)*hd], off, stride, sc)
				for j := range sc {
					sc[j] *= a.scale
				}
			}
		}
	}
	for h := kh0 * G; h < kh1*G; h++ {
		row := scores[h*n : (h+1)*n]
		m := maxF32(row)
		stats[2*h], stats[2*h+1] = m, expShift(row, m)
	}
	clear(acc[kh0*G*hd : kh1*G*hd])
	for b0 := j0; b0 < j1; b0 += bs {
		rows := min(bs, j1-b0)
		for kh := kh0; kh < kh1; kh++ {
			off := a.slot(s, b0, kh)
			for g := 0; g < G; g += 2 {
				h := kh*G + g
				p := scores[h*n+b0-j0 : h*n+b0-j0+rows]
				if g+1 < G {
					a.vp.axpy2Rows(acc[h*hd:(h+2)*hd], p, scores[(h+1)*n+b0-j0:], off, stride)
					continue
				}
				a.vp.axpyRows(acc[h*hd:(h+1)*hd], p, off, stride)
			}
		}
	}
}

const (
	// blockedMinTokens is the fewest new tokens of a sequence that take the
	// blocked path: below, packing the cache costs more than it saves.
	blockedMinTokens = 16
	// blockedQueryTokens is the number of query tokens of one blocked task.
	blockedQueryTokens = 32
)

// attendBlocked computes the new tokens of a prefilling sequence whose
// first token is t0 of the step, with the GEMM kernel: the sequence's cached
// keys and values are packed once per kv head, then each task takes a block
// of query tokens of one kv head: scores = Q K^T, causal softmax, P V.
func (b *Backend) attendBlocked(a *attnCall, s *backend.SeqInfo, t0 int) {
	KH, hd, G, H := a.KH, a.hd, a.G, a.H
	n := s.Pos + s.N
	npad := (n + gemmCols - 1) / gemmCols * gemmCols
	// kpk[kh]: [npad/16][hd][16]; vpk[kh]: [hd/16][npad][16].
	per := npad * hd
	b.kpack = grow(&b.kpack, KH*per)
	b.vpack = grow(&b.vpack, KH*per)
	kpk, vpk := b.kpack, b.vpack
	blocks := npad / gemmCols
	b.pool.For(KH*blocks, 4, func(lo, hi int) {
		// A block's 16 key rows are staged as they are, then written a
		// dimension at a time: 64 contiguous bytes a store run instead
		// of 16 bytes-apart scatters (the packing was a quarter of a
		// 100-token follow-up's attention at 850 tokens of context).
		stage := make([]float32, gemmCols*hd)
		for i := lo; i < hi; i++ {
			kh, blk := i/blocks, i%blocks
			kb := kpk[kh*per+blk*hd*gemmCols : kh*per+(blk+1)*hd*gemmCols]
			for j := range gemmCols {
				pos, row := blk*gemmCols+j, stage[j*hd:(j+1)*hd]
				// V's rows go to their panels [hd/16][npad][16] in runs of 16.
				vrow := vpk[kh*per+pos*gemmCols:]
				if pos >= n {
					clear(row)
					for db := 0; db < hd/gemmCols; db++ {
						clear(vrow[db*npad*gemmCols : db*npad*gemmCols+gemmCols])
					}
					continue
				}
				off := a.slot(s, pos, kh)
				a.kp.load(row, off)
				for db := 0; db < hd/gemmCols; db++ {
					a.vp.load(vrow[db*npad*gemmCols:db*npad*gemmCols+gemmCols], off+db*gemmCols)
				}
			}
			for d := range hd {
				dst := kb[d*gemmCols : d*gemmCols+gemmCols : d*gemmCols+gemmCols]
				for j := range dst {
					dst[j] = stage[j*hd+d]
				}
			}
		}
	})

	qblocks := (s.N + blockedQueryTokens - 1) / blockedQueryTokens
	b.pool.For(KH*qblocks, 1, func(lo, hi int) {
		var qa, sc, inv []float32
		var c [gemmRows * gemmCols]float32
		for task := lo; task < hi; task++ {
			kh, qb := task/qblocks, task%qblocks
			i0 := qb * blockedQueryTokens
			nt := min(blockedQueryTokens, s.N-i0)
			rows := nt * G
			rpad := (rows + gemmRows - 1) / gemmRows * gemmRows
			nk := s.Pos + i0 + nt // keys visible to the block's last token
			nkpad := (nk + gemmCols - 1) / gemmCols * gemmCols
			// Row r is query head kh*G + r%G of token i0 + r/G, pre-scaled.
			qa = grow(&qa, rpad*hd)
			for r := range rows {
				t := t0 + i0 + r/G
				dst := qa[r*hd : (r+1)*hd]
				for d, v := range a.q[(t*H+kh*G+r%G)*hd:][:hd] {
					dst[d] = v * a.scale
				}
			}
			clear(qa[rows*hd:])
			sc = grow(&sc, rpad*nkpad)
			for rg := 0; rg < rpad; rg += gemmRows {
				for kb := 0; kb < nkpad/gemmCols; kb++ {
					gemm6x16(qa[rg*hd:], hd, kpk[kh*per+kb*hd*gemmCols:], hd, sc[rg*nkpad+kb*gemmCols:], nkpad)
				}
			}
			// Unnormalised probabilities; the outputs are divided by their sums.
			inv = grow(&inv, rows)
			for r := range rpad {
				row := sc[r*nkpad : (r+1)*nkpad]
				if r >= rows {
					clear(row)
					continue
				}
				vis := s.Pos + i0 + r/G + 1
				inv[r] = 1 / expShift(row[:vis], maxF32(row[:vis]))
				clear(row[vis:])
			}
			for db := 0; db < hd/gemmCols; db++ {
				for rg := 0; rg < rpad; rg += gemmRows {
					gemm6x16(sc[rg*nkpad:], nkpad, vpk[kh*per+db*npad*gemmCols:], nkpad, c[:], gemmCols)
					for i := range min(gemmRows, rows-rg) {
						r := rg + i
						t := t0 + i0 + r/G
						dst := a.o[(t*H+kh*G+r%G)*hd+db*gemmCols:][:gemmCols]
						for j, v := range c[i*gemmCols : (i+1)*gemmCols] {
							dst[j] = v * inv[r]
						}
					}
				}
			}
		}
	})
}

// softmaxInPlace replaces x by softmax(x), in float32.
func softmaxInPlace(x []float32) {
	inv := 1 / expShift(x, maxF32(x))
	for i := range x {
		x[i] *= inv
	}
}

// expf returns e^x in float32 within a few ulp (Cephes' expf: x = n ln2 + r,
// e^r by a degree-6 polynomial); several times faster than math.Exp, which
// matters for softmax over long contexts.
func expf(x float32) float32 {
	switch {
	case x != x || x > 88:
		return float32(math.Exp(float64(x)))
	case x < -87:
		return float32(math.Exp(float64(x))) // subnormal results and zero
	}
	// Round x/ln2 to an integer by adding 1.5*2^23: the sum's ulp is 1.
	const magic = 12582912
	n := float32(float32(x*1.44269504088896341)+magic) - magic
	r := x - n*0.693359375 + n*2.12194440e-4
	p := float32(1.9875691500e-4)
	p = p*r + 1.3981999507e-3
	p = p*r + 8.3334519073e-3
	p = p*r + 4.1665795894e-2
	p = p*r + 1.6666665459e-1
	p = p*r + 5.0000001201e-1
	y := p*r*r + r + 1
	return y * math.Float32frombits(uint32(int32(n)+127)<<23)
}
