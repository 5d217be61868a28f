package cpu

import (
	"fmt"
	"math"

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

func (c *kvCache) Free() { c.k, c.v = nil, nil }

func (p kvPool) store(off int, src []float32) {
	if p.f32 != nil {
		copy(p.f32[off:off+len(src)], src)
		return
	}
	dst := p.b16[off : off+len(src)]
	for i, v := range src {
		dst[i] = f32ToBF16(v)
	}
}

func (p kvPool) dot(q []float32, off int) float32 {
	if p.f32 != nil {
		return dotF32(q, p.f32[off:off+len(q)])
	}
	return dotBF16(q, p.b16[off:off+len(q)])
}

// axpy adds a * row(off) to acc.
func (p kvPool) axpy(acc []float32, a float32, off int) {
	if p.f32 != nil {
		axpy(acc, a, p.f32[off:off+len(acc)])
	} else {
		axpyBF16(acc, a, p.b16[off:off+len(acc)])
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

// Attention runs one attention layer; see backend.Backend.
func (b *Backend) Attention(out, qkv backend.Tensor, w backend.AttnWeights, spec *backend.AttnSpec, kvc backend.KVCache, layer int) {
	ot, qt := asT(out), asT(qkv)
	c, ok := kvc.(*kvCache)
	if !ok {
		panic(fmt.Sprintf("cpu: attention: kv cache of another backend (%T)", kvc))
	}
	T := b.numTokens()
	H, KH, hd, rd := spec.Heads, spec.KVHeads, spec.HeadDim, spec.RotaryDim
	if H <= 0 || KH <= 0 || H%KH != 0 || hd <= 0 || rd < 0 || rd > hd || rd%2 != 0 || len(spec.Rope.InvFreq) != rd/2 {
		panic(fmt.Sprintf("cpu: attention: invalid spec %+v", *spec))
	}
	if c.spec.KVHeads != KH || c.spec.HeadDim != hd || layer < 0 || layer >= c.spec.Layers {
		panic(fmt.Sprintf("cpu: attention: layer %d of cache %+v for spec %+v", layer, c.spec, *spec))
	}
	width := spec.QKVWidth()
	checkShape("attention qkv", qt, T, width)
	checkShape("attention out", ot, T, H*hd)
	qn := normWeights(w.QNorm, hd, spec.UnitOffsetNorm)
	kn := normWeights(w.KNorm, hd, spec.UnitOffsetNorm)
	bs := c.spec.BlockSize
	st := &b.step
	for i, s := range st.seqs {
		if need := (s.Pos + s.N + bs - 1) / bs; len(s.Blocks) < need {
			panic(fmt.Sprintf("cpu: attention: sequence %d has %d blocks, needs %d for %d tokens", i, len(s.Blocks), need, s.Pos+s.N))
		}
		for _, blk := range s.Blocks {
			if blk < 0 || int(blk) >= c.spec.Blocks {
				panic(fmt.Sprintf("cpu: attention: sequence %d uses block %d of %d", i, blk, c.spec.Blocks))
			}
		}
	}
	x := qt.f32()
	o := ot.out32()
	qStride := hd
	if spec.Gated {
		qStride = 2 * hd
	}
	kOff, vOff := H*qStride, H*qStride+KH*hd
	kp, vp := c.k[layer], c.v[layer]
	// slot returns the cache offset of (position, kv head) of sequence s.
	slot := func(s *backend.SeqInfo, pos, kh int) int {
		return ((int(s.Blocks[pos/bs])*bs+pos%bs)*KH + kh) * hd
	}

	// Queries (normed, rotated) go to a scratch buffer; keys and values into the cache.
	q := make([]float32, T*H*hd)
	b.pool.For(T, 1, func(lo, hi int) {
		half := rd / 2
		cos, sin := make([]float32, half), make([]float32, half)
		kr := make([]float32, hd)
		for t := lo; t < hi; t++ {
			s := &st.seqs[st.tokSeq[t]]
			pos := int(st.tokPos[t])
			ropeTables(&spec.Rope, pos, cos, sin)
			row := x[t*width : (t+1)*width]
			for h := range H {
				qh := q[(t*H+h)*hd : (t*H+h+1)*hd]
				rmsNormRow(qh, row[h*qStride:h*qStride+hd], qn, spec.NormEps)
				ropeRow(qh, cos, sin)
			}
			for h := range KH {
				rmsNormRow(kr, row[kOff+h*hd:kOff+(h+1)*hd], kn, spec.NormEps)
				ropeRow(kr, cos, sin)
				kp.store(slot(s, pos, h), kr)
				vp.store(slot(s, pos, h), row[vOff+h*hd:vOff+(h+1)*hd])
			}
		}
	})

	// Each task is one (token, kv head): the group of query heads sharing
	// that kv head reads each cached key and value once.
	group := H / KH
	b.pool.For(T*KH, 1, func(lo, hi int) {
		var scores []float32
		for i := lo; i < hi; i++ {
			t, kh := i/KH, i%KH
			s := &st.seqs[st.tokSeq[t]]
			n := int(st.tokPos[t]) + 1
			if cap(scores) < group*n {
				scores = make([]float32, group*n)
			}
			sc := scores[:group*n]
			for j := range n {
				off := slot(s, j, kh)
				for g := range group {
					h := kh*group + g
					sc[g*n+j] = kp.dot(q[(t*H+h)*hd:(t*H+h+1)*hd], off) * spec.Scale
				}
			}
			for g := range group {
				softmaxInPlace(sc[g*n : (g+1)*n])
				clear(o[(t*H+kh*group+g)*hd : (t*H+kh*group+g+1)*hd])
			}
			for j := range n {
				off := slot(s, j, kh)
				for g := range group {
					h := kh*group + g
					vp.axpy(o[(t*H+h)*hd:(t*H+h+1)*hd], sc[g*n+j], off)
				}
			}
			if spec.Gated {
				for g := range group {
					h := kh*group + g
					gate := x[t*width+h*qStride+hd : t*width+h*qStride+2*hd]
					oh := o[(t*H+h)*hd : (t*H+h+1)*hd]
					for d := range oh {
						oh[d] *= sigmoid(gate[d])
					}
				}
			}
		}
	})
}

// softmaxInPlace replaces x by softmax(x), in float32 with a float64 sum.
func softmaxInPlace(x []float32) {
	m := float32(math.Inf(-1))
	for _, v := range x {
		m = max(m, v)
	}
	var sum float64
	for i, v := range x {
		e := float32(math.Exp(float64(v - m)))
		x[i] = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for i := range x {
		x[i] *= inv
	}
}
