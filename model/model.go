// Package model runs the Qwen3 family of language models (Qwen3, Qwen3-MoE,
// Qwen3-Next, Qwen3.5 and Qwen3.5-MoE) on a backend.Backend: it reads a
// Hugging Face model directory (config.json, generation_config.json,
// safetensors weights) or a GGUF file (read as the checkpoint it came from,
// gguf.go), binds the weights to the layers of qwen3.go or qwen3next.go,
// and advances batches of sequences one forward step at a time over a
// block-paged KV cache and per-sequence recurrent state.
package model

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync/atomic"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/safetensors"
)

// Options configures Load and LoadFS.
type Options struct {
	// Progress, when set, is called after each weight with the bytes of
	// weights loaded so far and in all.
	Progress func(done, total int64)
	// KVDType is the element type of the KV cache: F32 (the zero value) or
	// BF16.
	KVDType backend.DType
	// Quantize, when a quantized type (FP8, Q8_0 or Q4_K), is what the
	// linear layers' float weights are quantized to as they load; a
	// weight whose rows are not whole blocks of it takes Q8_0, or stays
	// in its float type (Model.QuantFallbacks). A checkpoint quantized
	// already is refused (Config.CheckQuantize).
	Quantize backend.DType
	// Dequantize widens quantized weights to float32 exactly as they load
	// (those Quantize makes too): the reference a quantized model is
	// checked against.
	Dequantize bool
	// Ranks > 0 loads rank Rank's share of a model split across Ranks
	// backends (tensor parallel: its share of the query and KV heads and of
	// the MLP's rows; docs/multigpu.md) onto a backend that is that rank of
	// a backend.Collective group. The ranks step together, each on its own
	// goroutine, and every attention and MLP output is summed over them.
	// Ranks 1 is the whole model run through a group of one (on a GPU,
	// through NCCL), which must equal the model run without a group.
	Rank, Ranks int
}

// tensorParallel returns the share of a split model that o asks b to load.
func (o Options) tensorParallel(b backend.Backend) (rank, ranks int, err error) {
	if o.Ranks <= 0 {
		return 0, 0, nil
	}
	c, ok := b.(backend.Collective)
	if !ok || c.Ranks() != o.Ranks || c.Rank() != o.Rank {
		return 0, 0, fmt.Errorf("model: rank %d of %d needs a backend that is that rank of a group of %d", o.Rank, o.Ranks, o.Ranks)
	}
	return o.Rank, o.Ranks, nil
}

// Model is a loaded model on a backend. Like its backend it is used by one
// goroutine at a time.
type Model struct {
	cfg     *Config
	b       backend.Backend
	weights *safetensors.Set // nil for synthetic models
	closer  io.Closer        // a GGUF file, closed with the model

	embed, norm, lmHead  backend.Tensor
	layers               []*decoderLayer
	attnSpec             backend.AttnSpec
	dnSpec               backend.DeltaNetSpec
	attnLayers, dnLayers int
	tensors              []backend.Tensor // every loaded weight, to free
	fallbacks            []QuantFallback
	// denseBytes are the weight bytes every step reads (the LM head, not
	// the embedding table, which is only indexed); expertBytes those of
	// all experts of all MoE layers, of which a step reads its choices.
	denseBytes, expertBytes int64

	kvDType backend.DType
	cache   CacheSpec
	kv      backend.KVCache
	state   backend.StateCache
	// generation is unique to each AllocCache of any model, so that graph
	// keys never name a capture made against freed caches or another
	// model's weights and buffers (two models of one name on a backend).
	generation int64

	prefill *workspace
	decode  map[int]*workspace // by batch-size bucket
	batch   backend.Batch
	// fed is batch.Fed's buffer; sampledRows the rows of the last
	// sampling, which a step's Seq.Fed may name.
	fed         []int32
	sampledRows int
	// tp is the backend's group when the model is one rank's share of a
	// split model (Options.Ranks); nil otherwise.
	tp backend.Collective
	// ranks are this model, then the other ranks of a split model whose
	// face it is (Group): their steps, caches and states follow its calls.
	ranks []*Model
}

// Group makes the ranks of a split model (ranks[i] loaded with
// Options{Rank: i, Ranks: len(ranks)} from one checkpoint) one model:
// ranks[0], whose calls then run on every rank (a step on each rank's
// goroutine, the caches and states of all), so that an engine, its
// caches and its sampler work above a split model as above a whole one.
// Closing it closes every rank.
func Group(ranks []*Model) (*Model, error) {
	for i, r := range ranks {
		if r.tp == nil || r.tp.Rank() != i || r.tp.Ranks() != len(ranks) || r.cfg.Name != ranks[0].cfg.Name {
			return nil, fmt.Errorf("model: group: model %d is not rank %d of %d of %s", i, i, len(ranks), ranks[0].cfg.Name)
		}
	}
	ranks[0].ranks = ranks
	return ranks[0], nil
}

// Ranks is how many devices the model is split across (1: not split).
func (m *Model) Ranks() int { return len(m.ranks) }

// peers returns the other ranks of a split model whose face m is.
func (m *Model) peers() []*Model { return m.ranks[1:] }

// Load reads the model in dir (a Hugging Face model directory, a GGUF
// file, or a directory holding one GGUF file); its weights are
// memory-mapped, and stay mapped until Close on a backend that uses them in
// place (the CPU); a backend that uploads them (CUDA) lets the files go
// once loaded.
func Load(dir string, b backend.Backend, opts Options) (*Model, error) {
	if file, ok, err := GGUFFile(dir); err != nil {
		return nil, err
	} else if ok {
		return LoadGGUF(file, b, opts)
	}
	return load(os.DirFS(dir), filepath.Base(filepath.Clean(dir)), dir, true, func() (*safetensors.Set, error) {
		return safetensors.OpenDir(dir)
	}, b, opts)
}

// LoadFS reads the model at the root of fsys (an embedded model, say); its
// weights are read into memory.
func LoadFS(fsys fs.FS, b backend.Backend, opts Options) (*Model, error) {
	return load(fsys, "embedded", "the embedded model", false, func() (*safetensors.Set, error) {
		return safetensors.OpenFS(fsys)
	}, b, opts)
}

// load reads a model's config and weights; mapped says the weights are a
// file mapping (whose pages release may drop), not memory of the heap.
func load(fsys fs.FS, name, where string, mapped bool, open func() (*safetensors.Set, error), b backend.Backend, opts Options) (*Model, error) {
	cfg, err := ReadConfig(fsys, name)
	if err != nil {
		return nil, err
	}
	set, err := open()
	if err != nil {
		return nil, fmt.Errorf("model %s: %w", name, err)
	}
	if err := cfg.CheckQuantize(opts.Quantize); err != nil {
		set.Close()
		return nil, err
	}
	bd := &binder{b: b, src: set, where: where, progress: opts.Progress, fp8Block: cfg.FP8Block, quantize: opts.Quantize, dequantize: opts.Dequantize}
	if bd.rank, bd.ranks, err = opts.tensorParallel(b); err != nil {
		set.Close()
		return nil, err
	}
	m, err := build(cfg, b, bd, opts.KVDType)
	if err != nil {
		set.Close()
		return nil, err
	}
	if !b.WeightsInPlace() {
		// The weights are on the device: the mapping would only hold
		// the file's pages in memory (and a file replaced under a
		// mapping faults its next read).
		set.Close()
		return m, nil
	}
	if mapped {
		bd.release()
	}
	m.weights = set
	return m, nil
}

// build declares the model's layers for cfg and binds their weights.
func build(cfg *Config, b backend.Backend, bd *binder, kv backend.DType) (m *Model, err error) {
	// Binding reads the mapped files: one rewritten meanwhile fails the
	// load, as it fails a step (Forward).
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer weightFault(&err)
	if kv != backend.F32 && kv != backend.BF16 {
		return nil, fmt.Errorf("model: KV cache dtype %v is not supported (f32 or bf16)", kv)
	}
	var tp backend.Collective
	if bd.ranks > 0 {
		if cfg, err = cfg.split(bd.rank, bd.ranks); err != nil {
			return nil, err
		}
		// A rank's experts are a range of them, which only the one-call
		// MoE takes.
		if _, fused := b.(backend.FusedMoE); cfg.MoE.Experts > 0 && !fused {
			return nil, fmt.Errorf("model %s: expert parallel needs a backend with the fused MoE operation", cfg.Name)
		}
		tp = b.(backend.Collective)
	}
	m = &Model{tp: tp, cfg: cfg, b: b, attnSpec: cfg.AttnSpec(), dnSpec: cfg.DeltaNet, kvDType: kv, decode: map[int]*workspace{}}
	m.ranks = []*Model{m}
	prefix := "model."
	if bd.src != nil {
		// Multimodal checkpoints keep the language model under model.language_model.
		if _, ok := bd.src.Tensor("model.language_model.embed_tokens.weight"); ok {
			prefix = "model.language_model."
		}
		// Embedding checkpoints are the bare transformer (saved from
		// Qwen3Model): no prefix, no LM head.
		if _, ok := bd.src.Tensor("embed_tokens.weight"); ok && cfg.Embedding != nil {
			prefix = ""
		}
	}
	params := m.declare(cfg, prefix)
	for _, k := range cfg.Kinds {
		if k == FullAttention {
			m.attnLayers++
		} else {
			m.dnLayers++
		}
	}
	err = bd.bindAll(params)
	m.fallbacks = bd.fallbacks
	for _, p := range params {
		owned := []backend.Tensor{*p.dst}
		if p.runs != nil {
			owned = append(owned, *p.runs...) // p.split's are views of these
		}
		for _, t := range owned {
			if t == nil {
				continue
			}
			m.tensors = append(m.tensors, t)
			n := int64(t.DType().Bytes(t.Shape()...))
			switch {
			case p.expert:
				m.expertBytes += n
			case p.dst != &m.embed || cfg.TieEmbeddings:
				m.denseBytes += n
			}
		}
	}
	if err != nil {
		m.Close()
		return nil, err
	}
	if cfg.TieEmbeddings {
		m.lmHead = m.embed
	}
	for _, l := range m.layers {
		l.mixer.bound(b)
	}
	return m, nil
}

// declare makes the model's layers for cfg and lists their weights, in
// the order a synthetic model numbers them (see binder.synthesize).
func (m *Model) declare(cfg *Config, prefix string) []param {
	_, V := cfg.vocabShare() // a rank of a split model: its range of the vocabulary
	H := cfg.Hidden
	params := []param{weight(&m.embed, prefix+"embed_tokens.weight", initNormal, V, H).rowSplit()}
	layers, layerParams := decoderLayers(cfg, prefix, &m.attnSpec, &m.dnSpec)
	m.layers = layers
	params = append(params, layerParams...)
	params = append(params, weight(&m.norm, prefix+"norm.weight", normInit(cfg), H))
	if !cfg.TieEmbeddings && cfg.Embedding == nil {
		params = append(params, weight(&m.lmHead, "lm_head.weight", initNormal, V, H).rowSplit())
	}
	return params
}

// Config returns the model's configuration.
func (m *Model) Config() *Config { return m.cfg }

// Backend returns the backend the model runs on.
func (m *Model) Backend() backend.Backend { return m.b }

// Hybrid reports whether the model keeps recurrent state (DeltaNet layers)
// besides its KV cache; its sequences then need state slots.
func (m *Model) Hybrid() bool { return m.dnLayers > 0 }

// CapturesStates reports whether a step can leave a hybrid sequence's
// state after some of its new tokens in other slots (Seq.Captures): the
// model is hybrid and its backend a backend.StateCapturer that says so.
func (m *Model) CapturesStates() bool {
	c, ok := m.b.(backend.StateCapturer)
	return m.Hybrid() && ok && c.CapturesStates()
}

// DecodeBytes is the weight memory one decode step of B sequences reads:
// every weight but the embedding table once, and of each MoE layer's
// experts as many as the batch can choose (B * top-k, at most all).
func (m *Model) DecodeBytes(B int) int64 {
	if m.cfg.MoE.Experts == 0 {
		return m.denseBytes
	}
	E := int64(m.cfg.MoE.Experts)
	return m.denseBytes + m.expertBytes*min(E, int64(B*m.cfg.MoE.TopK))/E
}

// QuantFallbacks returns, by type, the linear weights that Options.Quantize
// (or a synthetic model's quantized type) could not store in that type:
// those whose rows are not whole blocks of it take Q8_0 where its 32
// elements fit, else keep their float type, as llama.cpp's quantizer
// does. A split model's ranks decide alike; these are one rank's.
func (m *Model) QuantFallbacks() []QuantFallback { return m.fallbacks }

// WeightBytes is the device memory the weights take (on all ranks).
func (m *Model) WeightBytes() int64 {
	var n int64
	for _, r := range m.ranks {
		for _, t := range r.tensors {
			n += int64(t.DType().Bytes(t.Shape()...))
		}
	}
	return n
}

// KVBytesPerToken is the KV cache memory one token takes in every attention
// layer, for sizing the cache from free memory.
func (m *Model) KVBytesPerToken() int64 {
	return int64(m.attnLayers) * 2 * int64(m.attnSpec.KVHeads*m.attnSpec.HeadDim*m.kvDType.Size())
}

// SlotBytes is the size of one sequence's recurrent state (as SaveSlot
// writes it: every rank's); 0 for models without DeltaNet layers.
func (m *Model) SlotBytes() int {
	n := 0
	for _, r := range m.ranks {
		n += r.rankSlotBytes()
	}
	return n
}

// rankSlotBytes is SlotBytes of this rank alone.
func (m *Model) rankSlotBytes() int {
	if m.state != nil {
		return m.state.SlotBytes()
	}
	d := m.dnSpec
	return m.dnLayers * ((d.ConvKernel-1)*d.ConvDim() + d.ValueHeads*d.KeyDim*d.ValueDim) * 4
}

// AllocCache allocates (or reallocates, dropping their contents) the KV
// cache and the state slots that sequences address: blocks 0..Blocks-1 of
// BlockSize tokens and slots 0..Slots-1. One more block and slot are kept
// for the padding sequences of batch-size buckets.
func (m *Model) AllocCache(spec CacheSpec) error {
	for _, p := range m.peers() {
		if err := p.AllocCache(spec); err != nil {
			return err
		}
	}
	if spec.Blocks <= 0 || spec.BlockSize <= 0 {
		return fmt.Errorf("model: cache needs positive Blocks and BlockSize, have %+v", spec)
	}
	if m.Hybrid() && spec.Slots <= 0 {
		return fmt.Errorf("model: %s keeps recurrent state; the cache needs Slots > 0", m.cfg.Name)
	}
	m.freeCache()
	kv, err := m.b.NewKVCache(backend.KVSpec{
		Layers: m.attnLayers, Blocks: spec.Blocks + 1, BlockSize: spec.BlockSize,
		KVHeads: m.attnSpec.KVHeads, HeadDim: m.attnSpec.HeadDim, DType: m.kvDType,
	})
	if err != nil {
		return fmt.Errorf("model: %w", err)
	}
	m.kv = kv
	if m.Hybrid() {
		st, err := m.b.NewStateCache(backend.StateSpec{Layers: m.dnLayers, Slots: spec.Slots + 1, DeltaNet: m.dnSpec})
		if err != nil {
			m.freeCache()
			return fmt.Errorf("model: %w", err)
		}
		m.state = st
	}
	m.cache = spec
	m.generation = cacheGenerations.Add(1)
	return nil
}

// cacheGenerations numbers the caches AllocCache makes (Model.generation).
var cacheGenerations atomic.Int64

func (m *Model) freeCache() {
	if m.kv != nil {
		m.kv.Free()
		m.kv = nil
	}
	if m.state != nil {
		m.state.Free()
		m.state = nil
	}
	m.cache = CacheSpec{}
}

// CopyBlock copies KV block src to dst in every layer (copy-on-write).
func (m *Model) CopyBlock(dst, src int) {
	for _, r := range m.ranks {
		r.kv.CopyBlock(dst, src)
	}
}

// BlockBytes is the size of one KV block across the attention layers (of
// every rank), as SaveBlocks writes it.
func (m *Model) BlockBytes() int {
	n := 0
	for _, r := range m.ranks {
		n += r.kv.Spec().BlockBytes()
	}
	return n
}

// SaveBlocks copies KV blocks to host memory, one after the other (see
// backend.KVCache); a split model's block holds every rank's part of it,
// rank after rank.
func (m *Model) SaveBlocks(blocks []int, dst []byte) error {
	if len(m.ranks) == 1 {
		return m.kv.SaveBlocks(blocks, dst)
	}
	return m.rankBlocks(blocks, dst, func(r *Model, part []byte) error { return r.kv.SaveBlocks(blocks, part) }, true)
}

// RestoreBlocks writes KV blocks saved by SaveBlocks.
func (m *Model) RestoreBlocks(blocks []int, src []byte) error {
	if len(m.ranks) == 1 {
		return m.kv.RestoreBlocks(blocks, src)
	}
	return m.rankBlocks(blocks, src, func(r *Model, part []byte) error { return r.kv.RestoreBlocks(blocks, part) }, false)
}

// rankBlocks runs copy on each rank of a split model with that rank's
// part of blocks, gathered from (save: into) buf, where each block holds
// the ranks' parts one after the other.
func (m *Model) rankBlocks(blocks []int, buf []byte, copyRank func(r *Model, part []byte) error, save bool) error {
	bb := m.BlockBytes()
	if len(buf) != len(blocks)*bb {
		return fmt.Errorf("model: %d bytes for %d KV blocks of %d", len(buf), len(blocks), bb)
	}
	off := 0
	for _, r := range m.ranks {
		rb := r.kv.Spec().BlockBytes()
		part := make([]byte, len(blocks)*rb)
		if !save {
			for i := range blocks {
				copy(part[i*rb:(i+1)*rb], buf[i*bb+off:])
			}
		}
		if err := copyRank(r, part); err != nil {
			return err
		}
		if save {
			for i := range blocks {
				copy(buf[i*bb+off:i*bb+off+rb], part[i*rb:(i+1)*rb])
			}
		}
		off += rb
	}
	return nil
}

// CopySlot copies the recurrent state of slot src to slot dst.
func (m *Model) CopySlot(dst, src int) {
	for _, r := range m.ranks {
		r.state.CopySlot(dst, src)
	}
}

// SaveSlot copies a slot's recurrent state to host memory (len(dst) ==
// SlotBytes()): each rank's in turn.
func (m *Model) SaveSlot(slot int, dst []byte) error {
	if m.state == nil {
		return errors.New("model: no state cache (not a hybrid model, or AllocCache not called)")
	}
	if len(dst) != m.SlotBytes() {
		return fmt.Errorf("model: save slot: %d bytes, a slot has %d", len(dst), m.SlotBytes())
	}
	for _, r := range m.ranks {
		n := r.state.SlotBytes()
		if err := r.state.Save(slot, dst[:n]); err != nil {
			return err
		}
		dst = dst[n:]
	}
	return nil
}

// HostBuffer returns n bytes of host memory that RestoreBlocks and
// RestoreSlot copy to the device at the bus's rate (page-locked, on CUDA),
// or nil where the backend has none (its copies from any memory are then
// alike), or an error where it refuses.
func (m *Model) HostBuffer(n int) ([]byte, error) {
	h, ok := m.b.(backend.HostMemory)
	if !ok || len(m.ranks) > 1 {
		return nil, nil // a split model copies each rank's part out first
	}
	return h.HostBuffer(n)
}

// RestoreSlot writes a slot's recurrent state saved by SaveSlot.
func (m *Model) RestoreSlot(slot int, src []byte) {
	for _, r := range m.ranks {
		n := r.state.SlotBytes()
		r.state.Restore(slot, src[:n])
		src = src[n:]
	}
}

// Sample draws one token from each row of logits returned by Forward.
func (m *Model) Sample(logits backend.Tensor, p []backend.SampleParams) ([]backend.Sampled, error) {
	m.sampledRows = len(p)
	return m.b.Sample(logits, p)
}

// SampleStart is Sample issued: wait gives its tokens. Until then a decode
// step of the sequences may be issued whose Seq.Fed names them (see
// Feeds): the next step runs on the device while the host reads these
// tokens. At most two samplings may wait at once.
func (m *Model) SampleStart(logits backend.Tensor, p []backend.SampleParams) (wait func() ([]backend.Sampled, error), err error) {
	m.sampledRows = len(p)
	return m.b.SampleStart(logits, p)
}

// Feeds reports whether a step may take tokens from the last sampling
// (Seq.Fed): not on a model split across devices, where every rank needs
// the token and only the first samples.
func (m *Model) Feeds() bool { return len(m.ranks) == 1 }

// Close frees the model's caches and weights and unmaps its files.
func (m *Model) Close() {
	for _, p := range m.peers() {
		p.Close()
	}
	m.ranks = m.ranks[:1]
	m.freeCache()
	for _, ws := range m.decode {
		ws.free()
	}
	if m.prefill != nil {
		m.prefill.free()
	}
	for _, t := range m.tensors {
		m.b.Free(t)
	}
	m.tensors = nil
	if m.weights != nil {
		m.weights.Close()
		m.weights = nil
	}
	if m.closer != nil {
		m.closer.Close()
		m.closer = nil
	}
}
