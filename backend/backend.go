// Package backend defines the device interface that model code is written against.
//
// A Backend owns device memory and runs on it the steps a model's layers
// are written in (RMSNorm, RoPE, attention over the paged cache, the delta
// rule, routing, SwiGLU experts), each as coarse as a GPU wants it. Where a
// backend runs several steps as one kernel it says so through an optional
// interface (FusedAttention, FusedDeltaNet, FusedMoE), which the model calls instead of
// the steps: the model file keeps the paper's steps and the device keeps
// its fusion. The interface is shaped for GPUs: tensors live on the
// device, operations are queued (a GPU backend launches them
// asynchronously on one stream) and report failures at the next Sync or
// Read, and the metadata of a forward step (token ids, positions, block
// tables, state slots) is uploaded once by Begin into buffers the backend
// owns, so that a step's operations depend only on device memory and can
// be captured once and replayed (see Graph).
//
// Activations at this interface are float32 where precision matters (the
// residual stream, router inputs, logits) and of the backend's
// ActivationType where they only feed matrix products (bf16 on CUDA); the
// KV cache is of the dtype it was made with (KVSpec); weights may be bf16,
// f16, f32 or block-quantized (quant.go). A Backend is used by one
// goroutine at a time.
package backend

import (
	"errors"
	"fmt"
)

// DType is the element type of a tensor.
type DType uint8

const (
	F32 DType = iota
	BF16
	F16
	I32
	// Block-quantized weight types (weights only, see quant.go).
	Q8_0
	Q4_K
	Q5_K
	Q6_K
	MXFP4
	FP8
)

// Size returns the number of bytes of one element of a float or integer
// type; a quantized type has no per-element size (see RowBytes).
func (d DType) Size() int {
	switch d {
	case BF16, F16:
		return 2
	case F32, I32:
		return 4
	}
	panic(fmt.Sprintf("backend: %v has no element size", d))
}

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case BF16:
		return "bf16"
	case F16:
		return "f16"
	case I32:
		return "i32"
	case Q8_0:
		return "q8_0"
	case Q4_K:
		return "q4_k"
	case Q5_K:
		return "q5_k"
	case Q6_K:
		return "q6_k"
	case MXFP4:
		return "mxfp4"
	case FP8:
		return "fp8"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Tensor is a dense, row-major buffer on a backend's device. Shape[0] is the
// outermost dimension. Each backend has its own concrete type; passing one
// backend's tensor to another backend panics.
type Tensor interface {
	DType() DType
	Shape() []int
}

// Numel returns the number of elements of t.
func Numel(t Tensor) int {
	n := 1
	for _, d := range t.Shape() {
		n *= d
	}
	return n
}

// Batch describes one forward step: which sequences advance and by which
// tokens. Tokens holds the new tokens of all sequences, concatenated in the
// order of Seqs; token t of the step belongs to the sequence whose range
// covers t.
type Batch struct {
	Tokens []int32
	Seqs   []SeqInfo
	// LogitRows lists, in increasing order, the token rows (indices into
	// Tokens) whose logits the step must produce.
	LogitRows []int32
	// Fed, when not nil, has one entry per token: -1 keeps Tokens[t], r >= 0
	// makes token t the one the last SampleStart drew for its row r. The
	// token is taken on the device, so a decode step can be issued before
	// the last one's tokens reach the host.
	Fed []int32
}

// CheckFed reports a Fed that does not fit the batch or the last sampling's
// rows (a backend's Begin panics on it, as on other inconsistent batches).
func (bt *Batch) CheckFed(rows int) error {
	if bt.Fed == nil {
		return nil
	}
	if len(bt.Fed) != len(bt.Tokens) {
		return fmt.Errorf("%d fed entries for %d tokens", len(bt.Fed), len(bt.Tokens))
	}
	for t, r := range bt.Fed {
		if r < -1 || int(r) >= rows {
			return fmt.Errorf("token %d fed from row %d of a sampling of %d rows", t, r, rows)
		}
	}
	return nil
}

// SeqInfo is one sequence's part of a Batch.
type SeqInfo struct {
	Pos    int     // tokens of this sequence already in the cache; its new tokens sit at Pos, Pos+1, ...
	N      int     // new tokens this step
	Blocks []int32 // KV block table: physical block of each logical block, covering Pos+N tokens
	Slot   int     // recurrent-state slot (hybrid models); Pos == 0 means the slot's state is treated as empty
	// Captures, on a StateCapturer, also leave the sequence's recurrent
	// state as it stands after some of its new tokens in other slots.
	Captures []Capture
}

// Capture asks a step to write a hybrid sequence's recurrent state (every
// Gated DeltaNet layer's conv history and delta-rule state) as it stands
// after the first Offset of its new tokens (0 < Offset < N, increasing
// within a sequence) to state slot Slot, a slot no sequence of the step
// uses: one pass then leaves the states that a prefill would otherwise end
// a pass at each of to keep.
type Capture struct{ Offset, Slot int }

// Padding rows: a model pads decode batches to bucket sizes on a backend that
// captures graphs, with sequences that all name one spare block and one spare
// slot and whose results it discards. A backend must accept such sequences
// sharing a block or slot within one step; which one's writes persist is
// unspecified. No two real sequences of a step share a slot or write one
// block.

// Rope holds the rotary embedding of an attention layer, computed once on the
// host from the model config (YaRN and other scalings already applied).
type Rope struct {
	InvFreq    []float32 // RotaryDim/2 inverse frequencies
	AttnFactor float32   // multiplies cos and sin (YaRN's attention factor; 1 otherwise)
}

// AttnSpec fixes the shape of an attention layer.
type AttnSpec struct {
	Heads, KVHeads, HeadDim int
	RotaryDim               int     // leading dims of each head that RoPE rotates (NeoX rotate-half within them)
	Gated                   bool    // q projection yields [query | gate] per head; output is attn * sigmoid(gate)
	NormEps                 float32 // eps of the per-head q/k RMSNorm
	UnitOffsetNorm          bool    // q/k norm weights are stored as w-1 (Qwen3-Next style)
	Scale                   float32 // softmax scale, usually 1/sqrt(HeadDim)
	Rope                    Rope
}

// QKVWidth returns the width of the fused projection that
// FusedAttention.Attention reads.
func (s *AttnSpec) QKVWidth() int {
	q := s.Heads * s.HeadDim
	if s.Gated {
		q *= 2
	}
	return q + 2*s.KVHeads*s.HeadDim
}

// AttnWeights are the per-head q/k norms of an attention layer ([HeadDim]
// each), for FusedAttention.
type AttnWeights struct {
	QNorm, KNorm Tensor
}

// DeltaNetSpec fixes the shape of a Gated DeltaNet layer.
type DeltaNetSpec struct {
	KeyHeads, ValueHeads int // HK, HV; value head h reads key head h / (HV/HK)
	KeyDim, ValueDim     int // dk, dv
	ConvKernel           int // causal depthwise conv width (4)
	// Chunk is the chunk length of the chunked prefill algorithm; a sequence
	// advancing by fewer than Chunk tokens uses the token-by-token recurrence.
	// 0 forces the recurrence everywhere.
	Chunk int
	// TiledHeads: value head h reads key head h % KeyHeads, the order
	// llama.cpp's converter gives Qwen3.5's value heads in GGUF files,
	// instead of h / (ValueHeads / KeyHeads).
	TiledHeads bool
}

// KeyHead returns the key head value head h reads.
func (s *DeltaNetSpec) KeyHead(h int) int {
	if s.TiledHeads {
		return h % s.KeyHeads
	}
	return h / (s.ValueHeads / s.KeyHeads)
}

// ConvDim returns the number of channels of the conv1d: [q | k | v].
func (s *DeltaNetSpec) ConvDim() int {
	return 2*s.KeyHeads*s.KeyDim + s.ValueHeads*s.ValueDim
}

// MoESpec fixes the routing of a mixture-of-experts layer.
type MoESpec struct {
	Experts, TopK int
	NormTopK      bool // renormalise the top-k probabilities to sum to 1
	// First is the first expert that the Experts' GateUp and Down hold,
	// when they hold a rank's range of them (expert parallel: the router
	// still chooses among all Experts, and a chosen expert outside the
	// range adds nothing here, its rank adds it). Only FusedMoE takes a
	// range, and only backends that are a Collective's ranks.
	First int
}

// Experts are a MoE layer's weights. GateUp is [E, 2I, H] (per expert, the
// gate rows then the up rows); Down is [E, H, I]. The shared expert, when
// present, is SharedGateUp [2Is, H], SharedDown [H, Is] and SharedGate [1, H];
// its output is scaled by sigmoid(x . SharedGate).
type Experts struct {
	Router       Tensor // [E, H]
	GateUp, Down Tensor
	SharedGateUp Tensor
	SharedDown   Tensor
	SharedGate   Tensor
}

// KVSpec sizes a paged KV cache.
type KVSpec struct {
	Layers, Blocks, BlockSize, KVHeads, HeadDim int
	DType                                       DType
}

// BlockBytes is the size of one block across layers as KVCache.SaveBlocks
// writes it: per layer its K then its V, [BlockSize, KVHeads, HeadDim] in
// the cache's type, little-endian.
func (s KVSpec) BlockBytes() int {
	return s.Layers * 2 * s.BlockSize * s.KVHeads * s.HeadDim * s.DType.Size()
}

// KVCache is a block-paged key/value store: per layer, K and V pools of
// [Blocks, BlockSize, KVHeads, HeadDim].
type KVCache interface {
	Spec() KVSpec
	// CopyBlock copies physical block src to dst in every layer (copy-on-write).
	CopyBlock(dst, src int)
	// SaveBlocks waits for queued work and copies blocks to host memory,
	// one after the other (len(dst) == len(blocks) * Spec().BlockBytes()).
	SaveBlocks(blocks []int, dst []byte) error
	// RestoreBlocks writes blocks saved by SaveBlocks; it returns once the
	// copies are done.
	RestoreBlocks(blocks []int, src []byte) error
	Free()
}

// StateSpec sizes the recurrent state of a hybrid model's DeltaNet layers.
type StateSpec struct {
	Layers, Slots int
	DeltaNet      DeltaNetSpec
}

// Check reports a spec that no state cache can hold.
func (s StateSpec) Check() error {
	d := s.DeltaNet
	if s.Layers < 0 || s.Slots <= 0 || d.KeyHeads <= 0 || d.ValueHeads <= 0 || d.ValueHeads%d.KeyHeads != 0 ||
		d.KeyDim <= 0 || d.ValueDim <= 0 || d.ConvKernel <= 0 || d.Chunk < 0 {
		return fmt.Errorf("invalid state cache spec %+v", s)
	}
	return nil
}

// SlotFloats returns the floats of one slot in one layer: its conv history
// and its recurrent state.
func (s StateSpec) SlotFloats() (conv, rec int) {
	d := s.DeltaNet
	return (d.ConvKernel - 1) * d.ConvDim(), d.ValueHeads * d.KeyDim * d.ValueDim
}

// SlotBytes is the size of one slot across layers as StateCache.Save
// writes it: per layer the conv history then the recurrent state,
// little-endian float32.
func (s StateSpec) SlotBytes() int {
	conv, rec := s.SlotFloats()
	return s.Layers * (conv + rec) * 4
}

// StateCache holds per-slot DeltaNet state for every DeltaNet layer: the conv
// history [ConvKernel-1, ConvDim] and the recurrent matrix [HV, dk, dv], f32.
type StateCache interface {
	Spec() StateSpec
	// SlotBytes is the size of one slot's state across all layers, as Save writes it.
	SlotBytes() int
	CopySlot(dst, src int)
	// Save copies a slot's state to host memory (len(dst) == SlotBytes()).
	Save(slot int, dst []byte) error
	// Restore writes a slot's state from host memory saved by Save.
	Restore(slot int, src []byte)
	Free()
}

// SampleParams selects how one row of logits becomes a token. Penalties and
// bias are applied first, then the mask, then temperature, then the top-k /
// top-p / min-p filters; Uniform in [0,1) draws from what remains.
// Temperature 0 is greedy.
type SampleParams struct {
	Temperature       float32
	TopK              int     // 0: no limit
	TopP              float32 // 1 or 0: no limit
	MinP              float32
	Uniform           float32 // the request's random draw for this step
	PresencePenalty   float32
	FrequencyPenalty  float32
	RepetitionPenalty float32      // 1 or 0: none
	Counts            []TokenCount // tokens seen so far, for the penalties (each token once)
	Bias              []TokenBias
	// Mask, when set, is a bitset of the tokens that may be drawn (see
	// MaskWords; at least one): the others count as logits of -Inf, for the
	// draw and for the log-probabilities, and are never among Top.
	Mask        []uint64
	TopLogprobs int // >0: also return this many most likely tokens
	Logprob     bool
}

// Penalized reports whether a penalty applies, so that Counts matter.
func (p *SampleParams) Penalized() bool {
	return p.PresencePenalty != 0 || p.FrequencyPenalty != 0 || (p.RepetitionPenalty != 0 && p.RepetitionPenalty != 1)
}

// MaskWords is the length of a token mask over a vocabulary of V tokens:
// token t is bit t%64 of word t/64.
func MaskWords(V int) int { return (V + 63) / 64 }

// NewMask returns the mask over V tokens that allows those allow holds for.
func NewMask(V int, allow func(t int32) bool) []uint64 {
	m := make([]uint64, MaskWords(V))
	for t := range int32(V) {
		if allow(t) {
			m[t>>6] |= 1 << (t & 63)
		}
	}
	return m
}

// Allowed reports whether mask allows token t (a nil mask allows all).
func Allowed(mask []uint64, t int32) bool {
	return mask == nil || mask[t>>6]>>(t&63)&1 != 0
}

// TokenCount is where a token occurred, for the penalties: the presence
// and frequency penalties look at the generated tokens only (Count, as in
// OpenAI's API and vLLM), the repetition penalty at the prompt too (as in
// vLLM and Hugging Face).
type TokenCount struct {
	Token  int32
	Count  int32 // occurrences among the generated tokens
	Prompt bool  // the token occurs in the prompt
}

// TokenBias adds Bias to a token's logit.
type TokenBias struct {
	Token int32
	Bias  float32
}

// Sampled is the token drawn from one row, with its log-probability (under the
// model's distribution after penalties, before temperature) when asked for.
type Sampled struct {
	Token   int32
	Logprob float32
	Top     []TokenLogprob
}

// TokenLogprob pairs a token with its log-probability.
type TokenLogprob struct {
	Token   int32
	Logprob float32
}

// FP8Products is implemented by a backend whose products with FP8 weights
// run on FP8 tensor cores from FP8ProductTokens() tokens (the activations
// quantized to e4m3 per token and 128 columns), 0 when it has none: the
// matrix rate such products are measured against is then FP8's.
type FP8Products interface {
	FP8ProductTokens() int
}

// Backend is a device that holds tensors and runs a model's operations.
// Unless a method says otherwise, out may not alias an input, shapes are
// checked (a mismatch is a programming error and panics) and errors of queued
// work surface at the next Sync or Read.
type Backend interface {
	Name() string

	// Memory.

	// Alloc returns an uninitialised tensor.
	Alloc(dt DType, shape ...int) Tensor
	// Load returns a weight tensor holding data (little-endian elements of
	// dt). The CPU backend may keep a reference to data instead of copying it
	// (data is memory-mapped and read-only); others upload it.
	Load(dt DType, shape []int, data []byte) (Tensor, error)
	// WeightsInPlace reports whether Load may keep references to its data,
	// which must then stay mapped while the weights live; otherwise the
	// files can be closed once the weights are loaded.
	WeightsInPlace() bool
	// Write copies host data into t, ordered after queued work.
	Write(t Tensor, data []byte)
	// Read waits for queued work and copies t to host memory.
	Read(t Tensor, dst []byte) error
	// Rows returns a view of rows [start, start+n) of t's first dimension.
	Rows(t Tensor, start, n int) Tensor
	// Reshape returns a view of t with another shape of the same size.
	Reshape(t Tensor, shape ...int) Tensor
	// Free releases a tensor made by Alloc or Load (not a view).
	Free(t Tensor)
	// Sync waits for queued work and returns its first error.
	Sync() error

	NewKVCache(spec KVSpec) (KVCache, error)
	NewStateCache(spec StateSpec) (StateCache, error)

	// Step.

	// Begin uploads the metadata of a forward step; the operations that
	// follow, until the next Begin, act on this batch.
	Begin(b *Batch)
	// Graph runs record, which issues the operations of one step whose
	// shapes depend only on key. A backend may capture them the first time
	// and replay the capture for later calls with the same key (record is
	// then not called); the CPU backend always calls record.
	Graph(key string, record func())
	// CapturesGraphs reports whether Graph replays captures. Only then is
	// it worth padding decode batches to a few bucket sizes: each size is
	// one capture, and padding rows are computed for nothing.
	CapturesGraphs() bool
	// Asynchronous reports whether operations are queued on the device and
	// run while the host goes on (until Read, Sync or Sample waits for
	// them). The engine then does a pass's host work while the next one
	// runs.
	Asynchronous() bool
	// ActivationType is the dtype of the activations around a layer's
	// matrix products (a dense layer's normalised hidden states, the fused
	// q/k/v projection, attention outputs): F32, or BF16 where the
	// backend's products read bf16 anyway (the precision the reference
	// computes them in), so that each is written once in the form its
	// reader takes.
	ActivationType() DType

	// Operations. Tensors named out are written, T is the step's token count.

	// Embed writes out[t] = table[Tokens[t]]; out [T, H] f32, table [V, H].
	Embed(out, table Tensor)
	// RMSNorm normalises each row of x: out = x * rsqrt(mean(x^2) + eps) * w,
	// or * (1 + w) when unitOffset. out is f32 (and may alias x) or of
	// ActivationType.
	RMSNorm(out, x, w Tensor, eps float32, unitOffset bool)
	// MatMul computes out[n,o] = sum_i x[n,i] * w[o,i], adding to out when
	// accumulate. x is f32 or of ActivationType, w any weight dtype (float
	// or block-quantized); out is f32, or of ActivationType when not
	// accumulating.
	MatMul(out, x, w Tensor, accumulate bool)
	// MLP adds to out [T, H] the SwiGLU feed-forward of x [T, H]:
	// down(silu(x . gate^T) * (x . up^T)) with gateUp [2I, H] = [gate | up]
	// and down [H, I]; x f32 or of ActivationType. One operation rather than three so that a backend can
	// fuse the activation into either product and keep the [T, I]
	// intermediate in its own precision.
	MLP(out, x, gateUp, down Tensor)

	// The steps of an attention layer after its projections, as the model
	// runs them where the backend has no FusedAttention: per-head q/k
	// RMSNorm (RMSNorm over [T*heads, HeadDim] views), then these.

	// RoPE rotates each head of x [T, heads*headDim] in place by its
	// token's position p: the first 2*len(r.InvFreq) dims, NeoX style
	// (x[i], x[i+half] by the angle p*InvFreq[i], rounded to float32 as
	// transformers computes it), cos and sin scaled by r.AttnFactor. x is
	// f32 or of ActivationType.
	RoPE(x Tensor, headDim int, r *Rope)
	// StoreKV writes each token's keys and values k, v [T, KVHeads*HeadDim]
	// into the layer's paged cache at the token's position, in the cache's
	// dtype; k and v are f32 or of ActivationType.
	StoreKV(kv KVCache, layer int, k, v Tensor)
	// Attend computes each token's causal attention over its sequence's
	// cached keys and values (positions 0 to its own, stored by StoreKV):
	// per query head h of q [T, H*HeadDim], softmax(scale * q_h . k_j)
	// weighing the v_j of kv head h / (H / KVHeads). out [T, H*HeadDim];
	// q and out are f32 or of ActivationType.
	Attend(out, q Tensor, kv KVCache, layer int, scale float32)
	// MulSigmoid multiplies x by sigmoid(gate) elementwise; x is f32 or of
	// ActivationType, gate f32, of x's shape.
	MulSigmoid(x, gate Tensor)

	// The steps of a Gated DeltaNet layer between its projections and its
	// gated norm.

	// CausalConv1d runs the layer's short causal convolution over each
	// sequence's inputs x [T, ConvDim] ([q | k | v] before the conv),
	// preceded by the slot's conv history (zeros for a sequence at position
	// 0): out[t, c] = silu(sum_j w[c, j] * in[t-(K-1)+j, c]) with w
	// [ConvDim, K]. The history becomes the last K-1 inputs. out and x are
	// f32 [T, ConvDim].
	CausalConv1d(out, x, w Tensor, st StateCache, layer int)
	// GatedDeltaRule runs the gated delta rule over each sequence's
	// recurrent state (chunked or token by token, see DeltaNetSpec.Chunk)
	// on qkv [T, ConvDim] = [q | k | v] (after the conv) and ba [T, 2*HV] =
	// [b | a]: per token and value head h, reading key head
	// spec.KeyHead(h), q and k L2-normalised (q then scaled by
	// 1/sqrt(dk)), beta = sigmoid(b), g = -exp(aLog) * softplus(a +
	// dtBias), and S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q.
	// aLog and dtBias are [HV]; out is f32 [T, HV*dv]. Inputs are not
	// modified.
	GatedDeltaRule(out, qkv, ba, aLog, dtBias Tensor, spec *DeltaNetSpec, st StateCache, layer int)
	// GatedRMSNorm computes out = w * rmsnorm(x) * silu(z) per head, x and z
	// [T, heads*dim] f32, w [dim]; out is f32 or of ActivationType.
	GatedRMSNorm(out, x, z, w Tensor, eps float32)
	// The steps of a mixture-of-experts block, as the model runs them where
	// the backend has no FusedMoE.

	// Route picks each token's experts: the router logits x . router^T
	// [T, E] in float32 (a rounding-sized change can flip the choice),
	// softmax over all experts, the spec.TopK largest (ties to the lower
	// index) in decreasing order, renormalised to sum to 1 when
	// spec.NormTopK. experts is I32 [T, TopK], weights f32 [T, TopK]; x is
	// f32 [T, H].
	Route(experts, weights, x, router Tensor, spec *MoESpec)
	// Experts adds to out [T, H], for each token and each of its experts e
	// with weight w, w * down_e(silu(gate_e(x)) * up_e(x)), with gateUp
	// [E, 2I, H] (per expert the gate rows, then the up rows) and down [E,
	// H, I]; x is f32 [T, H], experts and weights come from Route.
	Experts(out, x, experts, weights, gateUp, down Tensor)
	// SharedExpert adds to out [T, H] the expert every token takes,
	// weighed by its own gate: sigmoid(x . gate) * down(silu(x . g^T) *
	// (x . u^T)) with gateUp [2I, H] = [g | u], down [H, I], gate [1, H].
	SharedExpert(out, x, gateUp, down, gate Tensor)

	// GatherRows writes out[r] = x[LogitRows[r]] for the current batch.
	GatherRows(out, x Tensor)
	// CopyCols writes x [T, w] into columns [col, col+w) of out [T, W]
	// (same dtype): a projection computed in parts, whose weights a file
	// stores in different types, joins its fused activation.
	CopyCols(out, x Tensor, col int)
	// SliceCols writes columns [col, col+w) of x [T, W] to out [T, w] (same
	// dtype), CopyCols' converse: the query and the gate of a gated
	// attention layer's q projection, interleaved per head, part.
	SliceCols(out, x Tensor, col int)
	// Sample draws one token from each row of logits [R, V] (len(params) ==
	// R) and returns them to the host; only the tokens (and requested
	// log-probabilities) cross from the device.
	Sample(logits Tensor, params []SampleParams) ([]Sampled, error)
	// SampleStart issues Sample and returns the wait for its tokens: until
	// then the host may issue the next step, whose Batch.Fed names them. A
	// second SampleStart may be issued before the first's wait, not a third.
	SampleStart(logits Tensor, params []SampleParams) (wait func() ([]Sampled, error), err error)
}

// Collective is implemented by a backend that is one rank of a group
// running a model split across devices (tensor parallel, docs/multigpu.md):
// each rank holds its share of the heads and MLP columns, and a block's
// partial outputs are summed over the group.
type Collective interface {
	// Rank is this backend's place in the group, 0 to Ranks-1.
	Rank() int
	Ranks() int
	// Partial readies the residual x [T, H] (f32) for this rank's share
	// of a block's output, once the block has read its input from x: kept
	// on rank 0, zeroed elsewhere, so that after each rank has added its
	// share to x, AllReduce(x) makes x the residual plus the whole output.
	Partial(x Tensor)
	// AllReduce sums x [T, H] (f32) over every rank of the group in
	// place; the ranks call it with the same shapes, in the same order.
	AllReduce(x Tensor)
	// EmbedShare writes out[t] = table[Tokens[t] - first] (out [T, H]
	// f32) for the step's tokens in [first, first+V) of the rank's share
	// of the embedding table [V, H], and zeros for the others, whose rows
	// other ranks hold.
	EmbedShare(out, table Tensor, first int)
	// GatherCols writes to out [R, ranks*W] (f32) each rank's x [R, W]
	// (f32) as columns r*W to (r+1)*W, on every rank.
	GatherCols(out, x Tensor)
	// Abort ends the group: a rank that failed mid-step calls it, and every
	// rank waiting in a collective, or calling one later, panics with
	// ErrGroupAborted instead of waiting for it forever.
	Abort()
}

// CheckCollective panics, naming op, unless x is an f32 matrix, as
// Collective.Partial and AllReduce take it.
func CheckCollective(op string, x Tensor) {
	if x.DType() != F32 || len(x.Shape()) != 2 {
		panic(fmt.Sprintf("%s: %v%v, want an f32 matrix", op, x.DType(), x.Shape()))
	}
}

// ErrGroupAborted is the panic of a collective of a group that a failed
// rank ended (Collective.Abort).
var ErrGroupAborted = errors.New("a rank of the group failed: the split model cannot step any more")

// HostMemory is implemented by a backend whose copies between host and
// device run at the bus's rate only from page-locked host memory (CUDA):
// HostBuffer returns n bytes of it, kept for the backend's life. KVCache
// RestoreBlocks and StateCache Restore copy from such a buffer directly;
// from other memory they stage it first.
type HostMemory interface {
	HostBuffer(n int) ([]byte, error)
}

// StateCapturer is implemented by a backend whose Gated DeltaNet steps
// honour SeqInfo.Captures when CapturesStates reports true. Elsewhere a
// caller that wants the state at a place inside a prefill ends a pass
// there.
type StateCapturer interface {
	CapturesStates() bool
}

// FusedAttention is implemented by a backend that runs an attention
// layer's steps between its projections as one operation (on CUDA: q/k
// norm, RoPE and the cache write in one kernel, the gate in the attention
// kernel's output). A model calls it where the backend has it, and the
// steps one by one elsewhere.
type FusedAttention interface {
	// Attention runs on the fused projection qkv [T, spec.QKVWidth()] (the
	// query heads, each [query | gate] when spec.Gated, then the keys, then
	// the values): per-head q/k RMSNorm (eps spec.NormEps, weights
	// w.QNorm and w.KNorm, (1 + w) when spec.UnitOffsetNorm), RoPE,
	// StoreKV, Attend and, when spec.Gated, MulSigmoid by the gate. out is
	// [T, Heads*HeadDim]; qkv and out are f32 or of ActivationType.
	Attention(out, qkv Tensor, w AttnWeights, spec *AttnSpec, kv KVCache, layer int)
}

// FusedDeltaNet is implemented by a backend that runs a Gated DeltaNet
// layer's steps between its projections as one operation (on CUDA a
// decode step's conv, delta rule and gated norm are one kernel). A model
// calls it where the backend has it, and the steps one by one elsewhere.
type FusedDeltaNet interface {
	// DeltaNet runs CausalConv1d on qkv's conv inputs, GatedDeltaRule with
	// ba, and GatedRMSNorm of its output by z into out [T, HV*dv] (of
	// ActivationType or f32). qkv is [T, ConvDim], or [T, ConvDim + HV*dv]
	// holding z after the conv inputs when z is nil (one projection for
	// both).
	DeltaNet(out, qkv, z, ba Tensor, w *DeltaNetWeights, spec *DeltaNetSpec, st StateCache, layer int)
}

// DeltaNetWeights are a Gated DeltaNet layer's weights between its
// projections.
type DeltaNetWeights struct {
	Conv         Tensor // [ConvDim, ConvKernel]
	ALog, DtBias Tensor // [HV]
	Norm         Tensor // [dv], the gated RMSNorm's
	NormEps      float32
}

// FusedMoE is implemented by a backend that runs a mixture-of-experts
// block as one operation (on CUDA the routed and the shared experts' sums
// join the residual in one kernel). A model calls it where the backend has
// it, and the steps one by one elsewhere.
type FusedMoE interface {
	// MoE adds to out [T, H] what Route, Experts and, when e has a shared
	// expert, SharedExpert add for x [T, H].
	MoE(out, x Tensor, e *Experts, spec *MoESpec)
}

// Norm is the RMSNorm of NormedProducts: x * rsqrt(mean(x^2) + Eps) * W,
// or * (1 + W) when UnitOffset, as RMSNorm computes it.
type Norm struct {
	W          Tensor
	Eps        float32
	UnitOffset bool
}

// NormedProducts is implemented by a backend whose products can normalise
// their input themselves (on CUDA the decode kernels of quantized weights
// quantize the residual rows times the norm's weights, and scale their sums
// by the rows' factor): a pre-norm block's RMSNorm then costs a decode step
// no operation of its own. A model calls them where NormsInput allows, and
// RMSNorm and the plain product elsewhere.
type NormedProducts interface {
	// NormsInput reports whether NormMatMul and NormMLP take x [T, H] f32
	// with the weight w (MLP's gateUp).
	NormsInput(x, w Tensor) bool
	// NormMatMul is MatMul(out, RMSNorm(x), w, accumulate).
	NormMatMul(out, x Tensor, n *Norm, w Tensor, accumulate bool)
	// NormMLP is MLP(out, RMSNorm(x), gateUp, down).
	NormMLP(out, x Tensor, n *Norm, gateUp, down Tensor)
}

// Unfused returns b without its fused operations (FusedAttention,
// FusedDeltaNet, FusedMoE, NormedProducts), so that a model on it runs
// every layer step by step: the tests compare the two paths through it.
func Unfused(b Backend) Backend { return unfused{b} }

// unfused has the methods of Backend only.
type unfused struct{ Backend }
