package model

import (
	"fmt"

	"github.com/kiln-llm/kiln/backend"
)

// Qwen3 and Qwen3-MoE (Qwen3ForCausalLM, Qwen3MoeForCausalLM).
//
// A stack of pre-norm decoder layers over token embeddings:
//
//	x += o_proj(Attention(RMSNorm(x)))   q/k RMSNorm per head before RoPE, GQA
//	x += MLP(RMSNorm(x))                  SwiGLU, or a mixture of SwiGLU experts
//
// then a final RMSNorm and the LM head (tied to the embeddings when
// tie_word_embeddings). The attention, MLP and decoder layer defined here
// are shared with the hybrid models of qwen3next.go.

// decoderLayer is one pre-norm transformer block.
type decoderLayer struct {
	inputNorm, postNorm backend.Tensor
	mixer               mixer // attention or Gated DeltaNet
	mlp                 block // dense or sparse
	eps                 float32
	unitOffset          bool // norms weigh by (1 + w) (Qwen3-Next family)
}

// block is a sub-layer: it reads its input, the normalised hidden states
// [T, H], and adds its output to the residual stream x [T, H].
type block interface {
	forward(s *workspace, in *input, x backend.Tensor)
}

// mixer is the block that mixes tokens; bound makes the views of its fused
// weights once they are loaded.
type mixer interface {
	block
	bound(b backend.Backend)
}

func (l *decoderLayer) forward(s *workspace, x backend.Tensor) {
	l.mixer.forward(s, l.input(s, x, l.inputNorm, false), x)
	// The router product reads f32: a rounding-sized change there can flip
	// the choice of experts.
	_, sparse := l.mlp.(*sparseMLP)
	l.mlp.forward(s, l.input(s, x, l.postNorm, sparse), x)
}

// input is RMSNorm(x) with the weights w, as a block reads it.
func (l *decoderLayer) input(s *workspace, x, w backend.Tensor, f32 bool) *input {
	return &input{s: s, x: x, norm: backend.Norm{W: w, Eps: l.eps, UnitOffset: l.unitOffset}, f32: f32}
}

// input is a block's input, RMSNorm(x) of the residual rows x. Products
// take it from x themselves where the backend can (NormedProducts: a
// decode step's norm then costs no operation of its own); anything else
// reads it as a tensor, normalised once. x must not change while the
// block reads its input.
type input struct {
	s    *workspace
	x    backend.Tensor
	norm backend.Norm
	f32  bool           // the normalised rows in f32 rather than ActivationType
	h    backend.Tensor // the normalised rows, once made
}

// tensor returns the normalised rows.
func (in *input) tensor() backend.Tensor {
	if in.h == nil {
		H := in.x.Shape()[1]
		if in.f32 {
			in.h = in.s.get("h", H)
		} else {
			in.h = in.s.act("h", H)
		}
		in.s.b.RMSNorm(in.h, in.x, in.norm.W, in.norm.Eps, in.norm.UnitOffset)
	}
	return in.h
}

// detach makes the input independent of x, which a split model readies
// for the ranks' partial sums (addOutput) before a block like the MLP has
// read it: the rows are normalised now, or, where the product with w would
// take the norm itself, it reads a copy of x and computes from it what it
// would from x (a split model in one rank equals the whole).
func (in *input) detach(w backend.Tensor) {
	if in.h != nil {
		return
	}
	if in.normed(w) == nil {
		in.tensor()
		return
	}
	xc := in.s.get("xin", in.x.Shape()[1])
	in.s.b.CopyCols(xc, in.x, 0)
	in.x = xc
}

// matmul computes out (+)= RMSNorm(x) . w^T.
func (in *input) matmul(out, w backend.Tensor, accumulate bool) {
	if nb := in.normed(w); nb != nil {
		nb.NormMatMul(out, in.x, &in.norm, w, accumulate)
		return
	}
	in.s.b.MatMul(out, in.tensor(), w, accumulate)
}

// mlp adds the SwiGLU feed-forward of RMSNorm(x) to out.
func (in *input) mlp(out, gateUp, down backend.Tensor) {
	if nb := in.normed(gateUp); nb != nil {
		nb.NormMLP(out, in.x, &in.norm, gateUp, down)
		return
	}
	in.s.b.MLP(out, in.tensor(), gateUp, down)
}

// normed returns the backend's NormedProducts where a product with w
// takes the norm itself (and the rows are not made already), or nil.
func (in *input) normed(w backend.Tensor) backend.NormedProducts {
	if nb, ok := in.s.b.(backend.NormedProducts); ok && in.h == nil && nb.NormsInput(in.x, w) {
		return nb
	}
	return nil
}

func (l *decoderLayer) weights(c *Config, p string) []param {
	init := normInit(c)
	return []param{
		weight(&l.inputNorm, p+"input_layernorm.weight", init, c.Hidden),
		weight(&l.postNorm, p+"post_attention_layernorm.weight", init, c.Hidden),
	}
}

// normInit is how a synthetic model initialises RMSNorm weights: the
// Qwen3-Next family stores w - 1.
func normInit(c *Config) initKind {
	if c.arch.hybrid {
		return initZeros
	}
	return initOnes
}

// attention is softmax self-attention over the paged KV cache (GQA: a kv
// head serves Heads/KVHeads query heads).
type attention struct {
	qkv     backend.Tensor   // q|k|v fused, nil when a file stores them in different types
	runs    []backend.Tensor // then the runs of them in one type (q|k and v in a Q4_K_M file)
	q, k, v backend.Tensor   // q_proj, k_proj, v_proj: views of qkv or of the runs
	o       backend.Tensor
	norms   backend.AttnWeights
	spec    *backend.AttnSpec
	layer   int // index among the model's attention layers, in the KV cache
}

func (a *attention) weights(c *Config, p string) []param {
	s := a.spec
	q := s.Heads * s.HeadDim
	if s.Gated {
		q *= 2 // per head: query then gate
	}
	kv := s.KVHeads * s.HeadDim
	init := normInit(c)
	qkv := fused(&a.qkv, part{name: p + "q_proj.weight", shape: []int{q, c.Hidden}},
		part{name: p + "k_proj.weight", shape: []int{kv, c.Hidden}},
		part{name: p + "v_proj.weight", shape: []int{kv, c.Hidden}}).linear().rowSplit()
	qkv.split, qkv.runs = []*backend.Tensor{&a.q, &a.k, &a.v}, &a.runs
	if c.kvWays > 0 {
		qkv.ways = []int{0, c.kvWays, c.kvWays} // the KV head of the rank's query heads
	}
	return []param{
		qkv,
		weight(&a.o, p+"o_proj.weight", initNormal, c.Hidden, s.Heads*s.HeadDim).linear().colSplit(),
		weight(&a.norms.QNorm, p+"q_norm.weight", init, s.HeadDim),
		weight(&a.norms.KNorm, p+"k_norm.weight", init, s.HeadDim),
	}
}

// bound makes the views of a fused q|k|v weight once it is loaded.
func (a *attention) bound(b backend.Backend) {
	if a.qkv != nil {
		q := a.qkv.Shape()[0] - 2*a.spec.KVHeads*a.spec.HeadDim
		kv := a.spec.KVHeads * a.spec.HeadDim
		a.q, a.k, a.v = b.Rows(a.qkv, 0, q), b.Rows(a.qkv, q, kv), b.Rows(a.qkv, q+kv, kv)
	}
}

// forward: q, k, v = q_proj(h), k_proj(h), v_proj(h); q and k normalised
// per head, then rotated by their positions; k and v join the cache; each
// query attends over its sequence's keys so far; a gated layer multiplies
// the result by sigmoid(gate); x += o_proj(o).
func (a *attention) forward(s *workspace, in *input, x backend.Tensor) {
	b, sp := s.b, a.spec
	o := s.act("attn", sp.Heads*sp.HeadDim)
	if fused, ok := b.(backend.FusedAttention); ok {
		fused.Attention(o, a.projectQKV(s, in), a.norms, sp, s.kv, a.layer) // the steps below, as one operation
	} else {
		q, gate := a.query(s, in)
		k, v := s.get("k", sp.KVHeads*sp.HeadDim), s.act("v", sp.KVHeads*sp.HeadDim)
		in.matmul(k, a.k, false)
		in.matmul(v, a.v, false)
		a.headNorm(s, q, a.norms.QNorm)
		a.headNorm(s, k, a.norms.KNorm)
		b.RoPE(q, sp.HeadDim, &sp.Rope)
		b.RoPE(k, sp.HeadDim, &sp.Rope)
		b.StoreKV(s.kv, a.layer, k, v)
		b.Attend(o, q, s.kv, a.layer, sp.Scale)
		if sp.Gated {
			b.MulSigmoid(o, gate)
		}
	}
	s.addOutput(x, func(out backend.Tensor) { b.MatMul(out, o, a.o, true) })
}

// query returns q_proj(h) [T, Heads*HeadDim] and, for a gated layer,
// whose q_proj gives per head [query | gate], the gate apart.
func (a *attention) query(s *workspace, in *input) (q, gate backend.Tensor) {
	b, sp := s.b, a.spec
	n := sp.Heads * sp.HeadDim
	q = s.get("q", n)
	if !sp.Gated {
		in.matmul(q, a.q, false)
		return q, nil
	}
	qg := s.get("qgate", 2*n)
	in.matmul(qg, a.q, false)
	heads := b.Reshape(qg, s.T*sp.Heads, 2*sp.HeadDim)
	gate = s.get("gate", n)
	b.SliceCols(s.heads(q, sp.HeadDim), heads, 0)
	b.SliceCols(s.heads(gate, sp.HeadDim), heads, sp.HeadDim)
	return q, gate
}

// headNorm applies the RMSNorm of weight w to each head of x in place.
func (a *attention) headNorm(s *workspace, x, w backend.Tensor) {
	heads := s.heads(x, a.spec.HeadDim)
	s.b.RMSNorm(heads, heads, w, a.spec.NormEps, a.spec.UnitOffsetNorm)
}

// projectQKV returns the fused projection [q | k | v] of the input that
// FusedAttention reads, in one product or, when the file stores the parts
// in different types, joined from a product a run of them. One token's
// columns are contiguous, so that its products write them in place.
func (a *attention) projectQKV(s *workspace, in *input) backend.Tensor {
	b, W := s.b, a.spec.QKVWidth()
	qkv := s.act("qkv", W)
	if a.qkv != nil {
		in.matmul(qkv, a.qkv, false)
		return qkv
	}
	col := 0
	for i, w := range a.runs {
		n := w.Shape()[0]
		if s.T == 1 {
			in.matmul(b.Reshape(b.Rows(b.Reshape(qkv, W, 1), col, n), 1, n), w, false)
		} else {
			part := s.act(fmt.Sprintf("qkv%d", i), n)
			in.matmul(part, w, false)
			b.CopyCols(qkv, part, col)
		}
		col += n
	}
	return qkv
}

// mlp is a SwiGLU feed-forward block: down(silu(gate(h)) * up(h)).
type mlp struct {
	gateUp, down backend.Tensor // [2I, H] = [gate | up], [H, I]
	inter        int
}

func (m *mlp) weights(c *Config, p string) []param {
	return []param{
		fused(&m.gateUp, part{name: p + "gate_proj.weight", shape: []int{m.inter, c.Hidden}},
			part{name: p + "up_proj.weight", shape: []int{m.inter, c.Hidden}}).linear().rowSplit(),
		weight(&m.down, p+"down_proj.weight", initNormal, c.Hidden, m.inter).linear().colSplit(),
	}
}

func (m *mlp) forward(s *workspace, in *input, x backend.Tensor) {
	if s.tp != nil {
		in.detach(m.gateUp) // the product reads its input inside addOutput
	}
	s.addOutput(x, func(out backend.Tensor) { in.mlp(out, m.gateUp, m.down) })
}

// sparseMLP is a mixture of SwiGLU experts: a router picks the top-k
// experts per token (softmax in f32 over all experts), plus, in the
// Qwen3-Next family, a shared expert scaled by sigmoid(h . shared_gate).
type sparseMLP struct {
	experts backend.Experts
	spec    backend.MoESpec
}

func (m *sparseMLP) weights(c *Config, p string) []param {
	E, I, H := c.MoE.Experts, c.MoE.Intermediate, c.Hidden
	_, held := c.heldExperts() // a rank's range of them (expert parallel): the stacks' rows split
	// Experts are stored one tensor per projection and expert, or fused:
	// [E, 2I, H] gate|up and [E, H, I] as transformers 5 and the Qwen3.5
	// hub checkpoints hold them, or with the last two dimensions swapped
	// (GPT-OSS style). The shape tells which, except when 2I == H, where
	// transformers' orientation is assumed.
	var gateUp, down []part
	for e := range E {
		q := fmt.Sprintf("%sexperts.%d.", p, e)
		gateUp = append(gateUp, part{name: q + "gate_proj.weight", shape: []int{I, H}}, part{name: q + "up_proj.weight", shape: []int{I, H}})
		down = append(down, part{name: q + "down_proj.weight", shape: []int{H, I}})
	}
	fusedGateUp := part{name: p + "experts.gate_up_proj", shape: []int{E, 2 * I, H}}
	fusedDown := part{name: p + "experts.down_proj", shape: []int{E, H, I}}
	tGateUp, tDown := fusedGateUp, fusedDown
	tGateUp.transposed, tDown.transposed = true, true
	ps := []param{
		weight(&m.experts.Router, p+"gate.weight", initNormal, E, H),
		{dst: &m.experts.GateUp, shape: []int{held, 2 * I, H}, layouts: [][]part{gateUp, {fusedGateUp}, {tGateUp}}, lin: true, expert: true, tp: tpStack},
		{dst: &m.experts.Down, shape: []int{held, H, I}, layouts: [][]part{down, {fusedDown}, {tDown}}, lin: true, expert: true, tp: tpStack},
	}
	if Is := c.MoE.SharedIntermediate; Is > 0 {
		q := p + "shared_expert."
		ps = append(ps,
			fused(&m.experts.SharedGateUp, part{name: q + "gate_proj.weight", shape: []int{Is, H}},
				part{name: q + "up_proj.weight", shape: []int{Is, H}}).linear().rowSplit(),
			weight(&m.experts.SharedDown, q+"down_proj.weight", initNormal, H, Is).linear().colSplit(),
			weight(&m.experts.SharedGate, p+"shared_expert_gate.weight", initNormal, 1, H))
	}
	return ps
}

// forward: the router picks each token's top-k experts (softmax over all,
// renormalised when norm_topk_prob); x += the chosen experts' outputs,
// weighed; x += sigmoid(shared_expert_gate(h)) * shared_expert(h).
func (m *sparseMLP) forward(s *workspace, in *input, x backend.Tensor) {
	b, e, h := s.b, &m.experts, in.tensor()
	if fused, ok := b.(backend.FusedMoE); ok {
		s.addOutput(x, func(out backend.Tensor) { fused.MoE(out, h, e, &m.spec) }) // the steps below, as one operation
		return
	}
	chosen, weights := s.ids("experts", m.spec.TopK), s.get("expert weights", m.spec.TopK)
	b.Route(chosen, weights, h, e.Router, &m.spec)
	b.Experts(x, h, chosen, weights, e.GateUp, e.Down)
	if e.SharedGateUp != nil {
		b.SharedExpert(x, h, e.SharedGateUp, e.SharedDown, e.SharedGate)
	}
}

// feedForward returns layer i's MLP and its params.
func feedForward(c *Config, i int, p string) (block, []param) {
	if c.Sparse[i] {
		first, _ := c.heldExperts()
		m := &sparseMLP{spec: backend.MoESpec{Experts: c.MoE.Experts, TopK: c.MoE.TopK, NormTopK: c.MoE.NormTopK, First: first}}
		return m, m.weights(c, p)
	}
	m := &mlp{inter: c.Intermediate}
	return m, m.weights(c, p)
}

// decoderLayers builds the decoder layers of every architecture: attention
// layers here, Gated DeltaNet layers (qwen3next.go) where the config's
// layer kinds say linear_attention.
func decoderLayers(c *Config, prefix string, attn *backend.AttnSpec, dn *backend.DeltaNetSpec) ([]*decoderLayer, []param) {
	var layers []*decoderLayer
	var params []param
	var nAttn, nDelta int // each kind's layers are numbered apart in their caches
	for i, kind := range c.Kinds {
		p := fmt.Sprintf("%slayers.%d.", prefix, i)
		l := &decoderLayer{eps: c.NormEps, unitOffset: c.arch.hybrid}
		params = append(params, l.weights(c, p)...)
		switch kind {
		case FullAttention:
			a := &attention{spec: attn, layer: nAttn}
			nAttn++
			l.mixer = a
			params = append(params, a.weights(c, p+"self_attn.")...)
		case LinearAttention:
			d := &gatedDeltaNet{spec: dn, layer: nDelta, w: backend.DeltaNetWeights{NormEps: c.NormEps}}
			nDelta++
			l.mixer = d
			params = append(params, d.weights(c, p+"linear_attn.")...)
		}
		ffn, ffnParams := feedForward(c, i, p+"mlp.")
		l.mlp = ffn
		params = append(params, ffnParams...)
		layers = append(layers, l)
	}
	return layers, params
}
