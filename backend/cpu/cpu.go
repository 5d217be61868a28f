// Package cpu is the pure-Go implementation of backend.Backend.
//
// Operations run synchronously when called, split over a fixed pool of
// worker goroutines; every sum is accumulated in float32 (or wider). Weights
// given to Load are used in place (they are typically memory-mapped and
// read-only): bf16, f16 and f32 weights are decoded as they are read, and
// so are block-quantized ones (quant.go says how).
//
// Speed comes from a few small kernels (kernels.go, with AVX2+FMA assembly
// chosen at run time by CPUID on amd64 and portable Go elsewhere):
//   - MatMul with up to 12 input rows (decode) streams each weight row once,
//     in order, and dots it with every input row while it is in L1; this is
//     bound by memory bandwidth. More rows (prefill) decode blocks of 16
//     weight rows into a k-major panel and run a 6x16 register-tiled kernel.
//     Q8_0, Q4_K and Q6_K weights take int8 dot products with the input
//     rows quantized to int8 at any row count (quant.go).
//   - Attention for prefills of 16 or more tokens packs the sequence's keys
//     and values once and uses the same 6x16 kernel for Q K^T and P V; other
//     tokens are split into spans of positions whose partial softmaxes are
//     merged (flash-decoding), so one long decode uses every thread.
//   - The chunked Gated DeltaNet and the recurrence run on row kernels (a
//     dot or axpy over many rows per call).
//
// SampleRow is the reference sampler that other backends are tested against.
package cpu

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/kiln-llm/kiln/backend"
)

// Options configures a Backend.
type Options struct {
	// Threads is the number of goroutines an operation is split over;
	// 0 means runtime.GOMAXPROCS(0).
	Threads int
}

// Backend is the CPU implementation of backend.Backend. Like every backend it
// is used by one goroutine at a time.
type Backend struct {
	pool *pool
	step step
	// kpack and vpack are Attention's packed keys and values, attnQ and
	// attnK its normed and rotated queries and keys, kept to be reused by
	// the next call; attn and direct what its parts share.
	kpack, vpack, attnQ, attnK []float32
	attn                       attnCall
	direct                     directScratch
	// mlpBuf holds the products and activations of a SwiGLU block;
	// expertBuf an expert's gathered rows, then its outputs; normBuf the
	// normalised rows of a NormedProducts product.
	mlpBuf, expertBuf, normBuf []float32
	// group, when set, is the tensor-parallel group the backend is rank
	// rank of (NewGroup).
	group *group
	rank  int
	// reduced holds an AllReduce's sums until every rank has read its x.
	reduced []float32
	// sampled is the last sampling's tokens, for Batch.Fed.
	sampled []int32
}

var (
	_ backend.Backend        = (*Backend)(nil)
	_ backend.FusedAttention = (*Backend)(nil)
	_ backend.FusedMoE       = (*Backend)(nil)
)

// New returns a CPU backend.
func New(opts Options) *Backend {
	n := opts.Threads
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	return &Backend{pool: newPool(n)}
}

// Name reports "cpu".
func (b *Backend) Name() string { return "cpu" }

// WeightsInPlace reports true: Load reads weights from the caller's bytes.
func (b *Backend) WeightsInPlace() bool { return true }

// Tensor is the CPU backend's tensor: a shape over a byte buffer in host
// memory. Views share the buffer of the tensor they were made from.
type Tensor struct {
	dt    backend.DType
	shape []int
	buf   []byte
	// readOnly marks weights made by Load (and their views): their bytes
	// belong to the caller and are never written.
	readOnly bool
	view     bool
}

// DType returns the element type.
func (t *Tensor) DType() backend.DType { return t.dt }

// Shape returns the dimensions, outermost first.
func (t *Tensor) Shape() []int { return t.shape }

func (t *Tensor) numel() int { return shapeSize(t.shape) }

// byteSize returns the bytes of a tensor of dt with shape: elements times
// their size, or for a quantized type whole blocks of each innermost row.
func byteSize(dt backend.DType, shape []int) int {
	if dt.Quantized() {
		if len(shape) == 0 {
			panic(fmt.Sprintf("cpu: a %v tensor needs a row dimension", dt))
		}
		return dt.Bytes(shape...)
	}
	return shapeSize(shape) * dt.Size()
}

// rowLen is the number of elements per index of the first dimension.
func (t *Tensor) rowLen() int {
	n := 1
	for _, d := range t.shape[1:] {
		n *= d
	}
	return n
}

func (t *Tensor) String() string { return fmt.Sprintf("%v%v", t.dt, t.shape) }

func asT(t backend.Tensor) *Tensor {
	if t == nil {
		panic("cpu: nil tensor")
	}
	c, ok := t.(*Tensor)
	if !ok {
		panic(fmt.Sprintf("cpu: tensor of another backend (%T)", t))
	}
	if c.buf == nil && len(c.shape) > 0 && shapeSize(c.shape) > 0 {
		panic("cpu: use of a freed tensor")
	}
	return c
}

// f32 returns t's elements as float32; t must be F32.
func (t *Tensor) f32() []float32 {
	if t.dt != backend.F32 {
		panic(fmt.Sprintf("cpu: want f32 tensor, have %v", t))
	}
	return bytesAs[float32](t.buf)
}

// out32 returns the elements of an F32 output tensor, which must be writable.
func (t *Tensor) out32() []float32 {
	if t.readOnly {
		panic(fmt.Sprintf("cpu: write to a loaded weight %v", t))
	}
	return t.f32()
}

// bytesAs views b as elements of E without copying (the host is
// little-endian, like the formats; E must not hold pointers).
func bytesAs[E any](b []byte) []E {
	var z E
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*E)(unsafe.Pointer(&b[0])), len(b)/int(unsafe.Sizeof(z)))
}

// asBytes views s as its bytes without copying.
func asBytes[E any](s []E) []byte {
	var z E
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(z)))
}

func shapeSize(shape []int) int {
	n := 1
	for _, d := range shape {
		if d < 0 {
			panic(fmt.Sprintf("cpu: negative dimension in %v", shape))
		}
		n *= d
	}
	return n
}

func checkShape(what string, t *Tensor, dims ...int) {
	ok := len(t.shape) == len(dims)
	for i := 0; ok && i < len(dims); i++ {
		ok = t.shape[i] == dims[i]
	}
	if !ok {
		panic(fmt.Sprintf("cpu: %s has shape %v, want %v", what, t.shape, dims))
	}
}

// matrix views t as rows x cols where rows is the first dimension (or 1 for
// a vector).
func matrix(t *Tensor) (rows, cols int) {
	if len(t.shape) == 1 {
		return 1, t.shape[0]
	}
	return t.shape[0], t.rowLen()
}

// Alloc returns a zeroed tensor (the interface allows any contents).
func (b *Backend) Alloc(dt backend.DType, shape ...int) backend.Tensor {
	size := byteSize(dt, shape)
	// Allocate as 4-byte words so that every dtype is naturally aligned.
	words := (size + 3) / 4
	buf := asBytes(make([]uint32, words))
	if buf == nil {
		buf = []byte{}
	}
	return &Tensor{dt: dt, shape: append([]int(nil), shape...), buf: buf[:size]}
}

// Load wraps data as a weight tensor without copying it. data is never
// written, so it may be a read-only memory mapping; it must stay valid and
// unchanged while the tensor is in use.
func (b *Backend) Load(dt backend.DType, shape []int, data []byte) (backend.Tensor, error) {
	switch dt {
	case backend.F32, backend.BF16, backend.F16:
	case backend.Q8_0, backend.Q4_K, backend.Q5_K, backend.Q6_K, backend.MXFP4, backend.FP8:
		if len(shape) == 0 {
			return nil, fmt.Errorf("cpu: load: a %v weight needs a row dimension", dt)
		}
		if err := dt.CheckCols(shape[len(shape)-1]); err != nil {
			return nil, fmt.Errorf("cpu: load: %w", err)
		}
	default:
		return nil, fmt.Errorf("cpu: load: unsupported weight dtype %v", dt)
	}
	for _, d := range shape {
		if d < 0 {
			return nil, fmt.Errorf("cpu: load: negative dimension in shape %v", shape)
		}
	}
	if size := byteSize(dt, shape); len(data) != size {
		return nil, fmt.Errorf("cpu: load: %v%v needs %d bytes, have %d", dt, shape, size, len(data))
	}
	if data == nil {
		data = []byte{}
	}
	return &Tensor{dt: dt, shape: append([]int(nil), shape...), buf: data, readOnly: true}, nil
}

// Write copies data into t; len(data) must be t's size in bytes.
func (b *Backend) Write(t backend.Tensor, data []byte) {
	c := asT(t)
	if c.readOnly {
		panic(fmt.Sprintf("cpu: write to a loaded weight %v", c))
	}
	if len(data) != len(c.buf) {
		panic(fmt.Sprintf("cpu: write of %d bytes to %v (%d bytes)", len(data), c, len(c.buf)))
	}
	copy(c.buf, data)
}

// Read copies t into dst; len(dst) must be t's size in bytes.
func (b *Backend) Read(t backend.Tensor, dst []byte) error {
	c := asT(t)
	if len(dst) != len(c.buf) {
		return fmt.Errorf("cpu: read of %v (%d bytes) into %d bytes", c, len(c.buf), len(dst))
	}
	copy(dst, c.buf)
	return nil
}

// Rows returns a view of rows [start, start+n) of t's first dimension.
func (b *Backend) Rows(t backend.Tensor, start, n int) backend.Tensor {
	c := asT(t)
	if len(c.shape) == 0 || start < 0 || n < 0 || start+n > c.shape[0] {
		panic(fmt.Sprintf("cpu: rows [%d, %d) of %v", start, start+n, c))
	}
	if c.dt.Quantized() && len(c.shape) == 1 {
		panic(fmt.Sprintf("cpu: rows of %v: the elements of one quantized row", c))
	}
	row := byteSize(c.dt, c.shape[1:])
	shape := append([]int{n}, c.shape[1:]...)
	return &Tensor{dt: c.dt, shape: shape, buf: c.buf[start*row : (start+n)*row : (start+n)*row], readOnly: c.readOnly, view: true}
}

// Reshape returns a view of t with another shape of the same size.
func (b *Backend) Reshape(t backend.Tensor, shape ...int) backend.Tensor {
	c := asT(t)
	if shapeSize(shape) != c.numel() {
		panic(fmt.Sprintf("cpu: reshape %v to %v", c, shape))
	}
	// Quantized rows are whole blocks: only the outer dimensions may change.
	if c.dt.Quantized() && (len(shape) == 0 || shape[len(shape)-1] != c.shape[len(c.shape)-1]) {
		panic(fmt.Sprintf("cpu: reshape %v to %v changes the quantized row width", c, shape))
	}
	return &Tensor{dt: c.dt, shape: append([]int(nil), shape...), buf: c.buf, readOnly: c.readOnly, view: true}
}

// Free releases t's memory (Alloc) or its reference to the loaded data (Load).
func (b *Backend) Free(t backend.Tensor) {
	c := asT(t)
	if c.view {
		panic(fmt.Sprintf("cpu: free of a view %v", c))
	}
	c.buf = nil
}

// Sync returns nil: operations run to completion when called.
func (b *Backend) Sync() error { return nil }

// Graph calls record: the CPU backend captures nothing.
func (b *Backend) Graph(key string, record func()) { record() }

// CapturesGraphs is false: the CPU backend runs every step as it comes.
func (b *Backend) CapturesGraphs() bool { return false }

// CapturesStates is true: the Gated DeltaNet steps honour SeqInfo.Captures.
func (b *Backend) CapturesStates() bool { return true }

// Asynchronous is false: every operation is done when its call returns.
func (b *Backend) Asynchronous() bool { return false }

// ActivationType is F32: the CPU computes every product in f32.
func (b *Backend) ActivationType() backend.DType { return backend.F32 }

// step is the metadata of the current forward step, copied by Begin.
type step struct {
	tokens    []int32
	seqs      []backend.SeqInfo
	logitRows []int32
	// seqStart[s] is the index of sequence s's first token in tokens.
	seqStart []int
	// tokSeq and tokPos give each token's sequence and absolute position.
	tokSeq []int32
	tokPos []int32
	// ropeCos and ropeSin are stepRope's tables for rope, when ropeMade.
	rope             ropeKey
	ropeMade         bool
	ropeCos, ropeSin []float32
}

// Begin copies the metadata of a forward step; it panics on an inconsistent
// batch (token counts that do not add up, logit rows out of order).
func (b *Backend) Begin(bt *backend.Batch) {
	s := &b.step
	if err := bt.CheckFed(len(b.sampled)); err != nil {
		panic("cpu: begin: " + err.Error())
	}
	s.tokens = append(s.tokens[:0], bt.Tokens...)
	for t, r := range bt.Fed {
		if r >= 0 {
			s.tokens[t] = b.sampled[r]
		}
	}
	s.seqs = s.seqs[:0]
	s.seqStart = s.seqStart[:0]
	s.tokSeq = s.tokSeq[:0]
	s.tokPos = s.tokPos[:0]
	s.ropeMade = false
	start := 0
	for i, q := range bt.Seqs {
		if q.N < 0 || q.Pos < 0 {
			panic(fmt.Sprintf("cpu: begin: sequence %d has Pos %d, N %d", i, q.Pos, q.N))
		}
		q.Blocks = append([]int32(nil), q.Blocks...)
		q.Captures = append([]backend.Capture(nil), q.Captures...)
		for j, c := range q.Captures {
			if c.Offset <= 0 || c.Offset >= q.N || (j > 0 && c.Offset <= q.Captures[j-1].Offset) || c.Slot == q.Slot {
				panic(fmt.Sprintf("cpu: begin: sequence %d of %d new tokens in slot %d has captures %v", i, q.N, q.Slot, q.Captures))
			}
		}
		s.seqs = append(s.seqs, q)
		s.seqStart = append(s.seqStart, start)
		for j := 0; j < q.N; j++ {
			s.tokSeq = append(s.tokSeq, int32(i))
			s.tokPos = append(s.tokPos, int32(q.Pos+j))
		}
		start += q.N
	}
	if start != len(bt.Tokens) {
		panic(fmt.Sprintf("cpu: begin: sequences cover %d tokens, batch has %d", start, len(bt.Tokens)))
	}
	s.logitRows = append(s.logitRows[:0], bt.LogitRows...)
	for i, r := range s.logitRows {
		if r < 0 || int(r) >= start || (i > 0 && r <= s.logitRows[i-1]) {
			panic(fmt.Sprintf("cpu: begin: logit rows %v not increasing within %d tokens", bt.LogitRows, start))
		}
	}
}

func (b *Backend) numTokens() int { return len(b.step.tokens) }
