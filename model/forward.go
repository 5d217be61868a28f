package model

import (
	"errors"
	"fmt"
	"math/bits"
	"runtime/debug"
	"sync"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/internal/mapfile"
)

// workspace holds a step's activations: buffers of up to rows rows, viewed
// at the step's token count, in f32 (get: the residual stream, what norms
// and routers read) or in the backend's ActivationType (act: what only
// feeds matrix products), and the experts routers choose (ids). Decode buckets keep their workspace for the
// model's life so that a captured graph stays valid.
type workspace struct {
	b        backend.Backend
	rows     int // token capacity
	T, R     int // this step's tokens and logit rows
	bufs     map[string]backend.Tensor
	kv       backend.KVCache
	state    backend.StateCache
	logits   backend.Tensor // [R, V] view
	gathered backend.Tensor // [R, H] view
	// warm: the buffers exist, so a graph capture allocates nothing.
	warm bool
	// tp is the group of a split model's rank (Model.tp), whose blocks'
	// outputs are summed over the ranks; nil otherwise.
	tp backend.Collective
}

func newWorkspace(b backend.Backend, rows int) *workspace {
	return &workspace{b: b, rows: rows, bufs: map[string]backend.Tensor{}}
}

// buffer returns the [rows, width] buffer of type dt named name, allocating
// it (or reallocating it larger) on first use.
func (w *workspace) buffer(name string, dt backend.DType, rows, width int) backend.Tensor {
	key := fmt.Sprintf("%s/%d/%v", name, width, dt)
	t, ok := w.bufs[key]
	if ok && t.Shape()[0] >= rows {
		return t
	}
	if ok {
		w.b.Free(t)
	}
	if w.rows == 0 {
		// Prefill workspaces grow by powers of two so that slowly growing
		// steps do not reallocate every time.
		rows = bucket(rows)
	}
	t = w.b.Alloc(dt, max(rows, w.rows), width)
	w.bufs[key] = t
	return t
}

// get returns a [T, width] f32 activation buffer for this step.
func (w *workspace) get(name string, width int) backend.Tensor {
	return w.b.Rows(w.buffer(name, backend.F32, w.T, width), 0, w.T)
}

// act returns a [T, width] buffer for activations that only feed matrix
// products, in the backend's ActivationType.
func (w *workspace) act(name string, width int) backend.Tensor {
	return w.b.Rows(w.buffer(name, w.b.ActivationType(), w.T, width), 0, w.T)
}

// ids returns a [T, width] int32 buffer (the experts a router chose).
func (w *workspace) ids(name string, width int) backend.Tensor {
	return w.b.Rows(w.buffer(name, backend.I32, w.T, width), 0, w.T)
}

// addOutput adds a block's output to the residual stream x: add adds it
// to x; on a rank of a split model each rank adds its share, to x zeroed
// on all ranks but 0 (Collective.Partial), and the all-reduce sums them.
func (w *workspace) addOutput(x backend.Tensor, add func(out backend.Tensor)) {
	if w.tp == nil {
		add(x)
		return
	}
	w.tp.Partial(x)
	add(x)
	w.tp.AllReduce(x)
}

// heads views the step's activation x [T, n*dim] as its [T*n, dim] heads.
func (w *workspace) heads(x backend.Tensor, dim int) backend.Tensor {
	return w.b.Reshape(x, backend.Numel(x)/dim, dim)
}

func (w *workspace) free() {
	for _, t := range w.bufs {
		w.b.Free(t)
	}
	w.bufs = map[string]backend.Tensor{}
}

// ErrWeightsChanged is the error of a step that faulted reading a weight
// file the model has mapped: the file was truncated or rewritten in place.
var ErrWeightsChanged = errors.New("the weight file changed on disk while kiln had it mapped (rewritten or truncated in place); restart kiln to load it again")

// weightFault turns a panic from a fault on a mapped weight file into
// ErrWeightsChanged; any other panic goes on.
func weightFault(err *error) {
	r := recover()
	if r == nil {
		return
	}
	if f, ok := r.(interface{ Addr() uintptr }); ok {
		if path, ok := mapfile.Containing(f.Addr()); ok {
			*err = fmt.Errorf("model: %s: %w", path, ErrWeightsChanged)
			return
		}
	}
	panic(r)
}

// bucket returns the batch-size bucket of n decode sequences: the next
// power of two.
func bucket(n int) int {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len(uint(n-1))
}

// Forward advances each sequence by its new tokens and returns the logits
// [R, V] of the positions asked for: one row per LastLogits sequence, one
// per new token of an AllLogits sequence, none for NoLogits, in order; an
// embedding model (Config.Embedding) returns those positions' final normed
// hidden states [R, H] instead. The rows live in the model's workspace and
// stay valid until the next Forward. On a backend that captures graphs, decode steps (every sequence
// one token, each wanting logits) are padded to a batch-size bucket and run
// through backend.Graph.
func (m *Model) Forward(seqs []Seq) (logits backend.Tensor, err error) {
	if len(m.ranks) == 1 {
		return m.forward(seqs)
	}
	// A split model (Group): every rank runs the step, each on a goroutine
	// of its own (their collectives wait for each other). The sequences are
	// checked first, once: a refused step fails on no rank.
	for i := range seqs {
		if err := m.check(i, &seqs[i]); err != nil {
			return nil, err
		}
	}
	errs := make([]error, len(m.ranks))
	var wg sync.WaitGroup
	for i, p := range m.peers() {
		wg.Go(func() { _, errs[i+1] = p.rankForward(seqs) })
	}
	logits, errs[0] = m.rankForward(seqs)
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return logits, nil
}

// rankForward runs one rank's step of a split model; a rank that fails
// ends the group's collectives (Abort), so that the others fail too
// instead of waiting for it.
func (m *Model) rankForward(seqs []Seq) (logits backend.Tensor, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("model: rank %d of %d: %v", m.tp.Rank(), m.tp.Ranks(), r)
		}
		if err != nil {
			m.tp.Abort()
		}
	}()
	return m.forward(seqs)
}

// forward is Forward on one model (or one rank of a split one).
func (m *Model) forward(seqs []Seq) (logits backend.Tensor, err error) {
	// On the CPU the weights are read from the files' mappings, and a file
	// rewritten in place (cp, curl -o, a re-download) faults the next read
	// of its pages: with SetPanicOnFault that is a panic (the backend's
	// workers pass theirs on to this goroutine), which fails the step,
	// instead of a SIGBUS that ends the process and every request in it.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer weightFault(&err)
	if m.kv == nil {
		return nil, errors.New("model: Forward before AllocCache")
	}
	if len(seqs) == 0 {
		return nil, errors.New("model: Forward of no sequences")
	}
	decode := true
	for i := range seqs {
		if err := m.check(i, &seqs[i]); err != nil {
			return nil, err
		}
		decode = decode && len(seqs[i].Tokens) == 1 && seqs[i].Logits != NoLogits
	}
	bt := &m.batch
	bt.Tokens, bt.Seqs, bt.LogitRows, bt.Fed = bt.Tokens[:0], bt.Seqs[:0], bt.LogitRows[:0], nil
	for i := range seqs {
		if seqs[i].Fed {
			if m.fed == nil {
				m.fed = make([]int32, 0, len(seqs)) // bt.Fed must not be nil
			}
			bt.Fed = m.fed[:0]
		}
	}
	for _, s := range seqs {
		start := int32(len(bt.Tokens))
		if bt.Fed != nil {
			for range s.Tokens {
				bt.Fed = append(bt.Fed, -1)
			}
			if s.Fed {
				bt.Fed[start] = int32(s.FedRow)
			}
		}
		bt.Tokens = append(bt.Tokens, s.Tokens...)
		bt.Seqs = append(bt.Seqs, backend.SeqInfo{Pos: s.Pos, N: len(s.Tokens), Blocks: s.Blocks, Slot: s.Slot, Captures: s.Captures})
		switch s.Logits {
		case LastLogits:
			bt.LogitRows = append(bt.LogitRows, int32(len(bt.Tokens)-1))
		case AllLogits:
			for t := start; t < int32(len(bt.Tokens)); t++ {
				bt.LogitRows = append(bt.LogitRows, t)
			}
		}
	}
	R := len(bt.LogitRows)
	// Decode steps go through captured graphs, one per batch-size bucket,
	// when the backend replays captures; elsewhere every step runs as it is.
	decode = decode && m.b.CapturesGraphs()
	var ws *workspace
	if decode {
		n := bucket(len(seqs))
		// Padding sequences decode token 0 at position 0 into the spare
		// block and slot; their rows are computed and dropped.
		pad := backend.SeqInfo{N: 1, Blocks: []int32{int32(m.cache.Blocks)}, Slot: m.cache.Slots}
		for len(bt.Seqs) < n {
			bt.LogitRows = append(bt.LogitRows, int32(len(bt.Tokens)))
			bt.Tokens = append(bt.Tokens, 0)
			if bt.Fed != nil {
				bt.Fed = append(bt.Fed, -1)
			}
			bt.Seqs = append(bt.Seqs, pad)
		}
		ws = m.decode[n]
		if ws == nil {
			ws = newWorkspace(m.b, n)
			m.decode[n] = ws
		}
	} else {
		if m.prefill == nil {
			m.prefill = newWorkspace(m.b, 0)
		}
		ws = m.prefill
	}
	ws.T, ws.R, ws.kv, ws.state, ws.tp = len(bt.Tokens), len(bt.LogitRows), m.kv, m.state, m.tp
	ws.gathered = m.b.Rows(ws.buffer("gathered", backend.F32, max(ws.R, 1), m.cfg.Hidden), 0, ws.R)
	out := ws.gathered
	if m.cfg.Embedding == nil {
		ws.logits = m.b.Rows(ws.buffer("logits", backend.F32, max(ws.R, 1), m.cfg.VocabSize), 0, ws.R)
		out = ws.logits
	}
	if bt.Fed != nil {
		m.fed = bt.Fed
	}
	m.b.Begin(bt)
	if decode && ws.warm {
		m.b.Graph(fmt.Sprintf("%s/decode/%d/g%d", m.cfg.Name, ws.T, m.generation), func() { m.record(ws) })
	} else {
		// A bucket's first step runs directly and allocates its buffers.
		m.record(ws)
		ws.warm = decode
	}
	return m.b.Rows(out, 0, R), nil
}

// check validates one sequence of a step.
func (m *Model) check(i int, s *Seq) error {
	if len(s.Tokens) == 0 {
		return fmt.Errorf("model: sequence %d has no new tokens", i)
	}
	for _, t := range s.Tokens {
		if t < 0 || int(t) >= m.cfg.VocabSize {
			return fmt.Errorf("model: sequence %d: token %d outside the vocabulary (%d)", i, t, m.cfg.VocabSize)
		}
	}
	if s.Pos < 0 {
		return fmt.Errorf("model: sequence %d: negative position %d", i, s.Pos)
	}
	end := s.Pos + len(s.Tokens)
	if need := (end + m.cache.BlockSize - 1) / m.cache.BlockSize; len(s.Blocks) < need {
		return fmt.Errorf("model: sequence %d: %d blocks of %d tokens cannot hold %d tokens", i, len(s.Blocks), m.cache.BlockSize, end)
	}
	for _, b := range s.Blocks {
		if b < 0 || int(b) >= m.cache.Blocks {
			return fmt.Errorf("model: sequence %d: block %d outside the cache (%d blocks)", i, b, m.cache.Blocks)
		}
	}
	if m.Hybrid() && (s.Slot < 0 || s.Slot >= m.cache.Slots) {
		return fmt.Errorf("model: sequence %d: state slot %d outside the cache (%d slots)", i, s.Slot, m.cache.Slots)
	}
	if len(s.Captures) > 0 && !m.CapturesStates() {
		return fmt.Errorf("model: sequence %d: state captures on a model or backend that takes none", i)
	}
	for j, c := range s.Captures {
		if c.Offset <= 0 || c.Offset >= len(s.Tokens) || (j > 0 && c.Offset <= s.Captures[j-1].Offset) {
			return fmt.Errorf("model: sequence %d: capture offsets %v not increasing within its %d new tokens", i, s.Captures, len(s.Tokens))
		}
		if c.Slot < 0 || c.Slot >= m.cache.Slots || c.Slot == s.Slot {
			return fmt.Errorf("model: sequence %d: capture slot %d outside the cache (%d slots) or its own", i, c.Slot, m.cache.Slots)
		}
	}
	if s.Fed && (len(s.Tokens) != 1 || s.FedRow < 0 || s.FedRow >= m.sampledRows) {
		return fmt.Errorf("model: sequence %d: fed from row %d of a sampling of %d rows, with %d new tokens", i, s.FedRow, m.sampledRows, len(s.Tokens))
	}
	if s.Fed && !m.Feeds() {
		return fmt.Errorf("model: sequence %d: fed on a model split across devices", i)
	}
	if s.Logits > AllLogits {
		return fmt.Errorf("model: sequence %d: unknown Logits %d", i, s.Logits)
	}
	return nil
}

// record issues the operations of one step: embed, the decoder layers, and
// the final norm and LM head on the rows that need logits.
func (m *Model) record(ws *workspace) {
	b, c := m.b, m.cfg
	x := ws.get("x", c.Hidden)
	if m.tp == nil {
		b.Embed(x, m.embed)
	} else {
		// Each rank holds a range of the vocabulary's rows: the sum over
		// the ranks is each token's.
		first, _ := c.vocabShare()
		m.tp.EmbedShare(x, m.embed, first)
		m.tp.AllReduce(x)
	}
	for _, l := range m.layers {
		l.forward(ws, x)
	}
	if ws.R == 0 {
		return
	}
	b.GatherRows(ws.gathered, x)
	b.RMSNorm(ws.gathered, ws.gathered, m.norm, c.NormEps, c.Hybrid())
	if c.Embedding == nil && m.tp == nil {
		b.MatMul(ws.logits, ws.gathered, m.lmHead, false)
	} else if c.Embedding == nil {
		// Each rank's LM head rows give its range of the logits.
		_, V := c.vocabShare()
		part := b.Rows(ws.buffer("logits part", backend.F32, ws.R, V), 0, ws.R)
		b.MatMul(part, ws.gathered, m.lmHead, false)
		m.tp.GatherCols(ws.logits, part)
	}
}
