package model

import (
	"slices"

	"github.com/kiln-llm/kiln/backend"
)

// Qwen3-Next and Qwen3.5, dense and MoE (Qwen3NextForCausalLM,
// Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM and the text part of their
// ConditionalGeneration forms).
//
// The decoder layers of qwen3.go with three changes: most layers mix tokens
// with a Gated DeltaNet instead of attention (layer_types), the attention
// layers are gated (o_proj(attn * sigmoid(gate)), partial RoPE), and every
// RMSNorm weighs by (1 + w). A Gated DeltaNet layer:
//
//	[q | k | v] = silu(conv1d(in_proj_qkv(h))) over the sequence's conv history;  z = in_proj_z(h)
//	beta = sigmoid(in_proj_b(h));  g = -exp(A_log) * softplus(in_proj_a(h) + dt_bias)
//	o = gated delta rule over the sequence's recurrent state (q, k L2-normalised)
//	x += out_proj(RMSNorm(o) * w * silu(z))   per value head

// gatedDeltaNet is the linear-attention token mixer.
type gatedDeltaNet struct {
	qkv, z, ba backend.Tensor // projections to [q|k|v] (conv input), z and [b|a]
	qkvz       backend.Tensor // Qwen3-Next: qkv and z in one weight, viewed by qkv and z
	w          backend.DeltaNetWeights
	out        backend.Tensor
	spec       *backend.DeltaNetSpec
	layer      int // index among the model's DeltaNet layers, in the state cache
}

func (d *gatedDeltaNet) weights(c *Config, p string) []param {
	s := d.spec
	H, conv, vdim := c.Hidden, s.ConvDim(), s.ValueHeads*s.ValueDim
	// A rank of a split model holds its range of the key heads and of the
	// value heads that read them, in each section of [q | k | v (| z)].
	// Value heads stored tiled (value head h reads key head h % HK) are
	// HV/HK runs of HK heads, one per value head a key head has: a rank
	// holds its range of each run, which it reads tiled too.
	qk, v := s.KeyHeads*s.KeyDim, vdim
	heads := func(dim int) []int { return []int{s.ValueHeads * dim} }
	if s.TiledHeads {
		heads = func(dim int) []int { return slices.Repeat([]int{s.KeyHeads * dim}, s.ValueHeads/s.KeyHeads) }
	}
	vh, hv := heads(s.ValueDim), heads(1)
	sectioned := func(p param, sections ...[]int) param {
		p.sections = slices.Concat(sections...)
		return p
	}
	ps := []param{
		sectioned(weight(&d.w.Conv, p+"conv1d.weight", initConv, conv, s.ConvKernel).rowSplit(), []int{qk, qk}, vh),
		sectioned(weight(&d.w.ALog, p+"A_log", initALog, s.ValueHeads).colSplit(), hv),
		sectioned(weight(&d.w.DtBias, p+"dt_bias", initOnes, s.ValueHeads).colSplit(), hv),
		weight(&d.w.Norm, p+"norm.weight", initOnes, s.ValueDim),
		sectioned(weight(&d.out, p+"out_proj.weight", initNormal, H, vdim).linear().colSplit(), vh),
	}
	qkvApart := []param{
		sectioned(weight(&d.qkv, p+"in_proj_qkv.weight", initNormal, conv, H).linear().rowSplit(), []int{qk, qk}, vh),
		sectioned(weight(&d.z, p+"in_proj_z.weight", initNormal, vdim, H).linear().rowSplit(), vh),
	}
	if c.arch.fusedQKVZ {
		// Qwen3-Next interleaves the projections per key-head group; reorder
		// the rows once so that the output is [q all | k all | v all | z all]
		// and [b all | a all], the layout Qwen3.5 stores directly (over the
		// whole model's heads: a rank then takes its share of each).
		whole := *s
		if c.ranks > 1 {
			whole.KeyHeads, whole.ValueHeads = s.KeyHeads*c.ranks, s.ValueHeads*c.ranks
		}
		ba := weight(&d.ba, p+"in_proj_ba.weight", initNormal, 2*s.ValueHeads, H).rowSplit()
		ba.rows, ba.sections = baRows(&whole), []int{s.ValueHeads, s.ValueHeads}
		if c.qkvzApart {
			// Stored apart already, maybe in two types: one weight each, so
			// that neither is widened to the other's.
			return append(append(ps, qkvApart...), ba)
		}
		qkvz := weight(&d.qkvz, p+"in_proj_qkvz.weight", initNormal, conv+vdim, H).linear().rowSplit()
		qkvz.rows, qkvz.sections = qkvzRows(&whole), []int{qk, qk, v, v}
		return append(ps, qkvz, ba)
	}
	return append(append(ps, qkvApart...),
		sectioned(fused(&d.ba, part{name: p + "in_proj_b.weight", shape: []int{s.ValueHeads, H}},
			part{name: p + "in_proj_a.weight", shape: []int{s.ValueHeads, H}}).rowSplit(), hv, hv))
}

// bound makes the views of a fused qkvz weight once it is loaded.
func (d *gatedDeltaNet) bound(b backend.Backend) {
	if d.qkvz != nil {
		conv := d.spec.ConvDim()
		d.qkv = b.Rows(d.qkvz, 0, conv)
		d.z = b.Rows(d.qkvz, conv, d.qkvz.Shape()[0]-conv)
	}
}

// qkvzRows maps Qwen3-Next's in_proj_qkvz rows, grouped per key head g as
// [q_g | k_g | v_g | z_g] (v_g and z_g covering the group's r = HV/HK value
// heads), to [q all | k all | v all | z all].
func qkvzRows(s *backend.DeltaNetSpec) []int {
	r := s.ValueHeads / s.KeyHeads
	dk, vg := s.KeyDim, r*s.ValueDim
	group := 2*dk + 2*vg
	var rows []int
	for _, sec := range []struct{ off, n int }{{0, dk}, {dk, dk}, {2 * dk, vg}, {2*dk + vg, vg}} {
		for g := range s.KeyHeads {
			for i := range sec.n {
				rows = append(rows, g*group+sec.off+i)
			}
		}
	}
	return rows
}

// baRows maps in_proj_ba rows, grouped per key head as [b_g | a_g], to
// [b all | a all].
func baRows(s *backend.DeltaNetSpec) []int {
	r := s.ValueHeads / s.KeyHeads
	var rows []int
	for _, off := range []int{0, r} {
		for g := range s.KeyHeads {
			for i := range r {
				rows = append(rows, g*2*r+off+i)
			}
		}
	}
	return rows
}

// forward follows the layer's description above.
func (d *gatedDeltaNet) forward(s *workspace, in *input, x backend.Tensor) {
	gated := d.mix(s, in)
	s.addOutput(x, func(out backend.Tensor) { s.b.MatMul(out, gated, d.out, true) })
}

// mix returns RMSNorm(o) * w * silu(z) for the layer's input. The
// delta rule takes b and a as they are and makes beta and g itself (the
// GPU kernels compute them as they read them). A backend that fuses the
// steps after the projections takes q, k, v and z from one product where
// the weights are one.
func (d *gatedDeltaNet) mix(s *workspace, in *input) backend.Tensor {
	b, sp := s.b, d.spec
	conv, vdim := sp.ConvDim(), sp.ValueHeads*sp.ValueDim
	ba, gated := s.get("ba", 2*sp.ValueHeads), s.act("gated", vdim)
	fused, isFused := b.(backend.FusedDeltaNet)
	// b and a first: on a GPU the large product after this small one
	// starts streaming its weights while this one runs.
	in.matmul(ba, d.ba, false)  // [b | a]
	var mixed, z backend.Tensor // [q | k | v] and z; z nil: after them in mixed's rows
	if isFused && d.qkvz != nil {
		mixed = s.get("qkvz", conv+vdim)
		in.matmul(mixed, d.qkvz, false)
	} else {
		mixed, z = s.get("mixed", conv), s.get("z", vdim)
		in.matmul(mixed, d.qkv, false)
		in.matmul(z, d.z, false)
	}
	if isFused {
		fused.DeltaNet(gated, mixed, z, ba, &d.w, sp, s.state, d.layer)
		return gated
	}
	qkv, o := s.get("conv", conv), s.get("core", vdim)
	b.CausalConv1d(qkv, mixed, d.w.Conv, s.state, d.layer)
	b.GatedDeltaRule(o, qkv, ba, d.w.ALog, d.w.DtBias, sp, s.state, d.layer)
	b.GatedRMSNorm(gated, o, z, d.w.Norm, d.w.NormEps)
	return gated
}
