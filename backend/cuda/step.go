//go:build cgo

package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"log/slog"
	"unsafe"

	"github.com/kiln-llm/kiln/backend"
)

// Metadata regions of a step, each a device array of int32 that Begin
// refreshes. Kernels only ever read these buffers (never host values that
// change between steps), which is what lets a captured graph replay.
const (
	mTokens   = iota // [T] token ids
	mTokPos          // [T] absolute position of each token
	mTokSeq          // [T] sequence of each token
	mSeqPos          // [S] tokens already cached
	mSeqN            // [S] new tokens
	mSeqStart        // [S] first token of the sequence in the step
	mSeqBlk          // [S] offset of the sequence's block table in mBlocks
	mSeqSlot         // [S] state slot (hybrid models)
	mRows            // [R] logit rows
	mBlocks          // concatenated block tables
	// A step with state captures runs its delta rule in rounds, round r
	// taking each sequence's r-th segment (capture offsets end segments):
	mRoundPos   // [rounds * S] tokens cached before the segment
	mRoundN     // [rounds * S] the segment's tokens (0: none this round)
	mRoundStart // [rounds * S] its first token in the step
	// and each capture's conv history is the sequence's after Offset inputs:
	mCapPos   // [C] the sequence's cached tokens
	mCapN     // [C] the capture's offset
	mCapStart // [C] the sequence's first token in the step
	mCapSlot  // [C] the slot the capture writes
	mFed      // [T] Batch.Fed, when the step has it
	mCount
)

// stepMeta is the current step: host copies and the device buffers. The
// regions lie at fixed offsets of one device buffer, mirrored by a pinned
// staging buffer, so that a step's metadata goes up in one copy (each copy
// is a few microseconds of the device waiting between passes).
type stepMeta struct {
	host [mCount][]int32
	dev  [mCount]devptr // region i: buf + 4 * off[i]
	cap  [mCount]int
	off  [mCount]int
	buf  devptr
	// gen changes whenever the device buffer moves: captured graphs then
	// hold stale pointers and are captured again.
	gen     int
	staging unsafe.Pointer
	copied  C.CUevent // recorded after the last upload from staging

	T, S, R  int
	maxN     int // most new tokens of one sequence
	maxCtx   int // longest Pos+N
	maxBlock int // most blocks of one sequence
	// rounds is the delta rule's rounds (1 + the most captures of a
	// sequence), roundMaxN each round's longest segment, and caps the
	// step's captures in mCap* order.
	rounds    int
	roundMaxN []int
	caps      []stepCapture
}

// stepCapture is one capture of a step: sequence seq's state as it
// stands after round round goes to slot slot.
type stepCapture struct{ seq, round, slot int }

func (m *stepMeta) init(b *Backend) error {
	for i := range m.cap {
		m.cap[i] = 256
		if i == mBlocks {
			m.cap[i] = 4096
		}
	}
	if err := check("cuEventCreate", C.k_cuEventCreate(b.ctx, &m.copied, 2)); err != nil {
		return err
	}
	return m.layout(b)
}

// layout allocates the device and staging buffers for the capacities in
// cap, retiring the old device buffer (graphs may still use it).
func (m *stepMeta) layout(b *Backend) error {
	total := 0
	for i, c := range m.cap {
		m.off[i] = total
		total += c
	}
	p, err := b.malloc(4 * total)
	if err != nil {
		return err
	}
	if m.buf != 0 {
		b.retired = append(b.retired, m.buf)
	}
	m.buf = p
	for i := range m.dev {
		m.dev[i] = p + devptr(4*m.off[i])
	}
	m.gen++
	if m.staging != nil {
		C.k_cuMemFreeHost(b.ctx, m.staging)
	}
	return check("cuMemAllocHost", C.k_cuMemAllocHost_v2(b.ctx, &m.staging, C.size_t(4*total)))
}

// Begin uploads the metadata of a forward step; it panics on an inconsistent
// batch (token counts that do not add up, logit rows out of order).
func (b *Backend) Begin(bt *backend.Batch) {
	if b.capture {
		panic("cuda: Begin inside Graph")
	}
	m := &b.meta
	for i := range m.host {
		m.host[i] = m.host[i][:0]
	}
	m.maxN, m.maxCtx, m.maxBlock = 0, 0, 0
	start := 0
	for i, q := range bt.Seqs {
		if q.N < 0 || q.Pos < 0 {
			panic(fmt.Sprintf("cuda: begin: sequence %d has Pos %d, N %d", i, q.Pos, q.N))
		}
		m.host[mSeqPos] = append(m.host[mSeqPos], int32(q.Pos))
		m.host[mSeqN] = append(m.host[mSeqN], int32(q.N))
		m.host[mSeqStart] = append(m.host[mSeqStart], int32(start))
		m.host[mSeqBlk] = append(m.host[mSeqBlk], int32(len(m.host[mBlocks])))
		m.host[mSeqSlot] = append(m.host[mSeqSlot], int32(q.Slot))
		m.host[mBlocks] = append(m.host[mBlocks], q.Blocks...)
		for j := 0; j < q.N; j++ {
			m.host[mTokSeq] = append(m.host[mTokSeq], int32(i))
			m.host[mTokPos] = append(m.host[mTokPos], int32(q.Pos+j))
		}
		start += q.N
		m.maxN = max(m.maxN, q.N)
		m.maxCtx = max(m.maxCtx, q.Pos+q.N)
		m.maxBlock = max(m.maxBlock, len(q.Blocks))
	}
	if start != len(bt.Tokens) {
		panic(fmt.Sprintf("cuda: begin: sequences cover %d tokens, batch has %d", start, len(bt.Tokens)))
	}
	m.captures(bt)
	m.host[mTokens] = append(m.host[mTokens], bt.Tokens...)
	for i, r := range bt.LogitRows {
		if r < 0 || int(r) >= start || (i > 0 && r <= bt.LogitRows[i-1]) {
			panic(fmt.Sprintf("cuda: begin: logit rows %v not increasing within %d tokens", bt.LogitRows, start))
		}
	}
	m.host[mRows] = append(m.host[mRows], bt.LogitRows...)
	m.T, m.S, m.R = start, len(bt.Seqs), len(bt.LogitRows)
	if err := bt.CheckFed(b.sampledRows); err != nil {
		panic("cuda: begin: " + err.Error())
	}
	m.host[mFed] = append(m.host[mFed], bt.Fed...)

	// The staging buffer may still feed the previous step's upload.
	b.fail(check("cuEventSynchronize", C.k_cuEventSynchronize(b.ctx, m.copied)))
	grow := false
	for i := range m.host {
		if n := len(m.host[i]); n > m.cap[i] {
			m.cap[i] = max(n, 2*m.cap[i])
			grow = true
		}
	}
	if grow {
		if err := m.layout(b); err != nil {
			panic(err)
		}
	}
	st := unsafe.Slice((*int32)(m.staging), m.off[mCount-1]+m.cap[mCount-1])
	end := 0
	for i, h := range m.host {
		copy(st[m.off[i]:], h)
		if len(h) > 0 {
			end = m.off[i] + len(h)
		}
	}
	b.fail(check("cuMemcpyHtoDAsync", C.k_cuMemcpyHtoDAsync_v2(b.ctx, m.buf, m.staging, C.size_t(4*end), b.stream)))
	b.fail(check("cuEventRecord", C.k_cuEventRecord(b.ctx, m.copied, b.stream)))
	if bt.Fed != nil {
		feedTokensKernel.run(b, g1((m.T+255)/256), 256, 0, feedTokensArgs{tokens: m.dev[mTokens], fed: m.dev[mFed], T: int32(m.T), sampled: b.sampled})
	}
}

var feedTokensKernel = newKernel[feedTokensArgs]("feed_tokens")

type feedTokensArgs struct {
	tokens, fed devptr
	T           int32
	sampled     devptr
}

// captures sets the delta rule's rounds and the captures of bt, whose
// sequences' metadata are set (see the mRound and mCap regions).
func (m *stepMeta) captures(bt *backend.Batch) {
	m.rounds, m.caps = 1, m.caps[:0]
	for i, q := range bt.Seqs {
		for j, c := range q.Captures {
			if c.Offset <= 0 || c.Offset >= q.N || (j > 0 && c.Offset <= q.Captures[j-1].Offset) || c.Slot == q.Slot || c.Slot < 0 {
				panic(fmt.Sprintf("cuda: begin: sequence %d of %d new tokens in slot %d has captures %v", i, q.N, q.Slot, q.Captures))
			}
		}
		m.rounds = max(m.rounds, len(q.Captures)+1)
	}
	m.roundMaxN = m.roundMaxN[:0]
	if m.rounds == 1 {
		return
	}
	for r := range m.rounds {
		maxN := 0
		for i, q := range bt.Seqs {
			from, to := 0, 0 // this round's segment of the sequence
			if r <= len(q.Captures) {
				if r > 0 {
					from = q.Captures[r-1].Offset
				}
				to = q.N
				if r < len(q.Captures) {
					to = q.Captures[r].Offset
				}
			}
			m.host[mRoundPos] = append(m.host[mRoundPos], int32(q.Pos+from))
			m.host[mRoundN] = append(m.host[mRoundN], int32(to-from))
			m.host[mRoundStart] = append(m.host[mRoundStart], m.host[mSeqStart][i]+int32(from))
			maxN = max(maxN, to-from)
		}
		m.roundMaxN = append(m.roundMaxN, maxN)
	}
	for i, q := range bt.Seqs {
		for j, c := range q.Captures {
			m.host[mCapPos] = append(m.host[mCapPos], int32(q.Pos))
			m.host[mCapN] = append(m.host[mCapN], int32(c.Offset))
			m.host[mCapStart] = append(m.host[mCapStart], m.host[mSeqStart][i])
			m.host[mCapSlot] = append(m.host[mCapSlot], int32(c.Slot))
			m.caps = append(m.caps, stepCapture{seq: i, round: j, slot: c.Slot})
		}
	}
}

// graph is one captured step.
type graph struct {
	g    C.CUgraph
	exec C.CUgraphExec
	gen  int
}

// dropGraph destroys the graph captured under key, if there is one.
func (b *Backend) dropGraph(key string) {
	if g := b.graphs[key]; g != nil {
		C.k_cuGraphExecDestroy(b.ctx, g.exec)
		C.k_cuGraphDestroy(b.ctx, g.g)
		delete(b.graphs, key)
	}
}

// CapturesGraphs is true unless KILN_CUDA_GRAPHS=0 or the per-kernel
// profile (which times launches one by one) is on.
func (b *Backend) CapturesGraphs() bool { return b.useGraphs && b.prof == nil }

// Asynchronous is true: operations are queued on the backend's stream.
func (b *Backend) Asynchronous() bool { return true }

// ActivationType is BF16: cuBLASLt multiplies bf16 inputs, and the GEMV
// reads half the bytes of f32 activations.
func (b *Backend) ActivationType() backend.DType { return backend.BF16 }

// Graph captures the launches of record as a CUDA graph the first time a key
// is seen (and again after the metadata buffers moved) and replays it after.
func (b *Backend) Graph(key string, record func()) {
	if b.capture {
		panic("cuda: nested Graph")
	}
	if !b.CapturesGraphs() || b.err != nil {
		record()
		return
	}
	if g := b.graphs[key]; g != nil && g.gen == b.meta.gen {
		b.fail(check("cuGraphLaunch", C.k_cuGraphLaunch(b.ctx, g.exec, b.stream)))
		return
	}
	b.dropGraph(key)
	if err := check("cuStreamBeginCapture", C.k_cuStreamBeginCapture_v2(b.ctx, b.stream, captureRelaxed)); err != nil {
		b.fail(err)
		return
	}
	b.capture = true
	func() {
		defer func() {
			if b.capture {
				// record panicked: leave the stream usable before re-panicking.
				var g C.CUgraph
				C.k_cuStreamEndCapture(b.ctx, b.stream, &g)
				if g != nil {
					C.k_cuGraphDestroy(b.ctx, g)
				}
				b.capture = false
			}
		}()
		record()
		g := &graph{gen: b.meta.gen}
		b.capture = false
		if err := check("cuStreamEndCapture", C.k_cuStreamEndCapture(b.ctx, b.stream, &g.g)); err != nil {
			b.fail(err)
			return
		}
		if b.err != nil {
			C.k_cuGraphDestroy(b.ctx, g.g)
			return
		}
		if err := check("cuGraphInstantiate", C.k_cuGraphInstantiateWithFlags(b.ctx, &g.exec, g.g, 0)); err != nil {
			C.k_cuGraphDestroy(b.ctx, g.g)
			b.fail(err)
			return
		}
		b.graphs[key] = g
		slog.Debug("cuda: captured a graph", "key", key)
		b.fail(check("cuGraphLaunch", C.k_cuGraphLaunch(b.ctx, g.exec, b.stream)))
	}()
}
