package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/quant"
	"github.com/kiln-llm/kiln/safetensors"
)

// A param is one weight tensor of the model, declared by the layer that
// uses it: where its bytes come from in a checkpoint and the shape it must
// have. Layers list their params (see the weights methods); one binder then
// fills them all, from files or with synthetic values.
type param struct {
	dst   *backend.Tensor
	shape []int
	init  initKind
	// layouts are the checkpoint layouts the weight may be stored in, tried
	// in order; the first whose first part exists is used.
	layouts [][]part
	// rows, when set, permutes the rows (first-dimension slices) of the
	// concatenated parts: result row i is source row rows[i].
	rows []int
	// lin marks the weights of linear layers (projections, experts): the
	// ones quantized checkpoints quantize and --quantize may. Embeddings,
	// the LM head, norms, routers and the DeltaNet's small weights stay in
	// their float type, as in Qwen's FP8 checkpoints.
	lin bool
	// expert marks a stack of MoE experts, of which a step reads only the
	// chosen ones.
	expert bool
	// split and runs, when set, receive a fused weight that the file
	// stores in different types, so that nothing is widened: runs the
	// tensors of each run of consecutive parts of one type, split the
	// parts one by one, as views of those (loadRuns). The model makes a
	// product a run and joins them.
	split []*backend.Tensor
	runs  *[]backend.Tensor
	// tp is how the weight splits across the ranks of a tensor-parallel
	// model; its declared shape is then a rank's share.
	tp tpSplit
	// sections, for a weight split by rows, are the rows of a rank's share
	// of each section of the (permuted) whole, where one part holds
	// several ([q | k | v] of a DeltaNet): each section splits apart. Nil:
	// each part is a section. For a weight split by columns, the columns
	// of a rank's share of each section of every row.
	sections []int
	// ways, for a weight split by rows, is into how many equal ranges each
	// part splits, where fewer than the ranks (the KV heads of a model
	// with fewer of them than ranks: rank r holds range r*ways/ranks, which
	// other ranks hold too); nil or 0: the ranks.
	ways []int
}

// tpSplit says how a weight splits across the ranks of a tensor-parallel
// model (Options.Ranks): by whole heads or MLP rows, never inside one.
type tpSplit uint8

const (
	tpWhole tpSplit = iota // every rank holds all of it
	tpRows                 // each part's (or section's) rows in equal ranges, rank r the r-th (q|k|v, gate|up)
	tpCols                 // the columns in equal ranges (o_proj, down: their inputs are split)
	tpStack                // the parts' rows together in equal ranges (stacked experts: whole experts a rank)
)

// rowSplit marks p as split by rows across tensor-parallel ranks.
func (p param) rowSplit() param {
	p.tp = tpRows
	return p
}

// colSplit marks p as split by columns across tensor-parallel ranks.
func (p param) colSplit() param {
	p.tp = tpCols
	return p
}

// linear marks p as a linear layer's weight (see param.lin).
func (p param) linear() param {
	p.lin = true
	return p
}

// part is a checkpoint tensor; a layout's parts are concatenated along the
// first dimension (q|k|v, gate|up, expert after expert).
type part struct {
	name  string
	shape []int
	// transposed: the file holds each trailing matrix with its two last
	// dimensions swapped (e.g. fused experts stored [E, H, 2I]).
	transposed bool
}

// initKind says how a synthetic model fills a weight.
type initKind uint8

const (
	initNormal initKind = iota // N(0, 0.02), like transformers' init
	initOnes                   // RMSNorm weights
	initZeros                  // (1 + w) RMSNorm weights
	initALog                   // DeltaNet A_log = log(U(1, 16))
	initConv                   // DeltaNet conv: U(-1/sqrt(K), 1/sqrt(K))
)

// weight declares a plain weight stored under one name.
func weight(dst *backend.Tensor, name string, init initKind, shape ...int) param {
	return param{dst: dst, shape: shape, init: init, layouts: [][]part{{{name: name, shape: shape}}}}
}

// fused declares a weight stored as several tensors concatenated along the
// first dimension.
func fused(dst *backend.Tensor, parts ...part) param {
	shape := append([]int(nil), parts[0].shape...)
	for _, p := range parts[1:] {
		shape[0] += p.shape[0]
	}
	return param{dst: dst, shape: shape, layouts: [][]part{parts}}
}

func numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// tensorSource is where a binder finds checkpoint tensors.
type tensorSource interface {
	Tensor(name string) (*safetensors.Tensor, bool)
}

// binder loads params onto a backend.
type binder struct {
	b     backend.Backend
	src   tensorSource // nil: synthetic
	where string       // the checkpoint, for errors
	// fp8Block is the FP8 checkpoint's weight_block_size (rows, columns).
	fp8Block [2]int
	// quantize, when set, is the type linear weights stored as floats are
	// quantized to at load (--quantize), or where their rows are not whole
	// blocks of it, the one quantizeTo falls back to.
	quantize backend.DType
	// dequantize widens quantized weights to f32 exactly (the reference a
	// quantized model is checked against), after quantize.
	dequantize bool
	// fallbacks count the linear weights that quantize (or a synthetic
	// quantized dtype) left in another type.
	fallbacks []QuantFallback
	// copied lists the checkpoint bytes that were copied rather than used
	// in place (fused, permuted, converted weights), so that a mapping kept
	// for the rest can drop their pages (release).
	copied [][]byte
	// rank of ranks: the share of split weights (param.tp) to load; ranks
	// 0 or 1 loads them whole.
	rank, ranks int
	// synthetic
	dtype backend.DType
	seed  uint64
	// progress
	progress    func(done, total int64)
	done, total int64
}

// dtypeOf maps a checkpoint's dtype name (safetensors' and GGUF's) to the
// type kiln holds the weight in.
func dtypeOf(s string) (backend.DType, bool) {
	switch s {
	case "BF16":
		return backend.BF16, true
	case "F16":
		return backend.F16, true
	case "F32":
		return backend.F32, true
	case "F8_E4M3":
		return backend.FP8, true
	case "Q8_0":
		return backend.Q8_0, true
	case "Q4_K":
		return backend.Q4_K, true
	case "Q5_K":
		return backend.Q5_K, true
	case "Q6_K":
		return backend.Q6_K, true
	case "MXFP4":
		return backend.MXFP4, true
	}
	return 0, false
}

// loadable names the dtypes kiln reads, for errors.
const loadable = "BF16, F16, F32, F8_E4M3 (with weight_scale_inv) and GGUF's Q8_0, Q4_K, Q5_K, Q6_K and MXFP4"

func (bd *binder) bindAll(params []param) error {
	sizes := make([]int64, len(params))
	for i := range params {
		sizes[i] = bd.sizeOf(&params[i])
		bd.total += sizes[i]
	}
	for i := range params {
		var err error
		if bd.src == nil {
			err = bd.synthesize(&params[i], uint64(i))
		} else {
			err = bd.load(&params[i])
		}
		if err != nil {
			return err
		}
		bd.done += sizes[i]
		if bd.progress != nil {
			bd.progress(bd.done, bd.total)
		}
	}
	return nil
}

// sizeOf returns the bytes p will take, for progress reports.
func (bd *binder) sizeOf(p *param) int64 {
	if bd.src == nil {
		dt, _ := bd.synthType(p)
		return int64(dt.Bytes(p.shape...))
	}
	if l := bd.layout(p); l != nil {
		var n int64
		for _, pt := range l {
			if t, ok := bd.src.Tensor(pt.name); ok {
				n += int64(len(t.Data))
			}
		}
		return n
	}
	return 0
}

// layout picks the stored layout of p: the first whose first tensor exists
// with a fitting shape, else the first that exists (so that the error
// names its shape), else nil.
func (bd *binder) layout(p *param) []part {
	var found []part
	for _, l := range p.layouts {
		t, ok := bd.src.Tensor(l[0].name)
		if !ok {
			continue
		}
		if found == nil {
			found = l
		}
		if shapeFits(t.Shape, bd.whole(p, 0, l[0]).stored()) {
			return l
		}
	}
	return found
}

// stored is the shape the part has in the file.
func (pt part) stored() []int {
	if !pt.transposed {
		return pt.shape
	}
	s := append([]int(nil), pt.shape...)
	n := len(s)
	s[n-1], s[n-2] = s[n-2], s[n-1]
	return s
}

// shapeFits accepts the wanted shape, or one that differs only by
// dimensions of size 1 (conv1d weights are stored [C, 1, K]).
func shapeFits(have, want []int) bool {
	return sameShape(have, want) || sameShape(squeeze(have), squeeze(want))
}

func squeeze(s []int) []int {
	out := []int{}
	for _, d := range s {
		if d != 1 {
			out = append(out, d)
		}
	}
	return out
}

func sameShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func (bd *binder) load(p *param) error {
	layout := bd.layout(p)
	if layout == nil {
		return bd.missing(p.layouts[0][0])
	}
	sharded := bd.ranks > 1 && p.tp != tpWhole
	if sharded {
		whole := make([]part, len(layout))
		for i, pt := range layout {
			whole[i] = bd.whole(p, i, pt)
		}
		layout = whole
	}
	// A fused weight's parts have one row width, so they take one type.
	_, cols := matrixOf(layout[0].shape)
	q, block := backend.F32, 0 // F32: not quantized here
	if p.lin && bd.quantize.Quantized() {
		q, block = quantizeTo(bd.quantize, func(dt backend.DType) bool { return bd.rowsFit(p, dt, cols) })
	}
	parts := make([]stored, len(layout))
	srcs := make([][]byte, 0, len(layout))
	mixed := false
	for i, pt := range layout {
		t, ok := bd.src.Tensor(pt.name)
		if !ok {
			return bd.missing(pt)
		}
		if !shapeFits(t.Shape, pt.stored()) {
			return fmt.Errorf("model: tensor %q in %s has shape %v, want %v", pt.name, t.File, t.Shape, pt.stored())
		}
		st, err := bd.read(pt, t)
		if err != nil {
			return err
		}
		if p.lin && bd.quantize.Quantized() && st.dt.Quantized() {
			// Config.CheckQuantize refuses such a checkpoint before
			// this, unless its config does not say so (FP8 weights
			// without a quantization_config).
			return fmt.Errorf("model: tensor %q in %s is %v already; kiln quantizes BF16, F16 and F32 checkpoints at load", pt.name, t.File, st.dt)
		}
		if q.Quantized() {
			// Part by part, as quantized checkpoints store them: FP8's
			// tiles never span q and k.
			data, err := quantizeParallel(q, st.dt, st.data, pt.shape)
			if err != nil {
				return fmt.Errorf("model: quantizing %q: %w", pt.name, err)
			}
			st = stored{q, data}
		}
		if block > 0 && i == 0 {
			bd.fellBack(st.dt, block)
		}
		if bd.dequantize && st.dt.Quantized() {
			st = stored{backend.F32, f32Bytes(floatsOf(st.dt, st.data, pt.shape))}
		}
		if st.dt.Quantized() && !bd.rowsFit(p, st.dt, cols) {
			e, _ := st.dt.Block()
			return fmt.Errorf("model: tensor %q in %s is %v: a rank's %v of its %d columns are not whole blocks of %d, so it does not split in %d ranks",
				pt.name, t.File, st.dt, bd.colSections(p, cols), cols, e, bd.ranks)
		}
		parts[i] = st
		srcs = append(srcs, t.Data)
		mixed = mixed || st.dt != parts[0].dt
	}
	if mixed && len(p.split) == len(parts) && p.rows == nil && (!sharded || p.tp == tpRows && p.sections == nil) {
		return bd.loadRuns(p, layout, parts, srcs, sharded)
	}
	if mixed {
		// Elsewhere the parts are widened to f32, which holds each exactly.
		for i := range parts {
			parts[i] = parts[i].widened(layout[i].shape)
		}
	}
	dt := parts[0].dt
	var data []byte
	switch {
	case sharded:
		data = bd.share(p, layout, dt, parts)
	case len(parts) == 1 && p.rows == nil:
		data = parts[0].data // used in place when read in place: the mapping stays open while the model lives
	default:
		data = make([]byte, 0, dt.Bytes(p.shape...))
		for _, st := range parts {
			data = append(data, st.data...)
		}
		if p.rows != nil {
			data = permuteRows(data, p.rows)
		}
	}
	if len(data) > 0 && len(srcs[0]) > 0 && &data[0] != &srcs[0][0] {
		bd.copied = append(bd.copied, srcs...)
	}
	t, err := bd.b.Load(dt, p.shape, data)
	if err != nil {
		return fmt.Errorf("model: tensor %q: %w", layout[0].name, err)
	}
	*p.dst = t
	return nil
}

// rowsFit reports whether blocks of dt tile the rows of p, cols wide, as
// a rank holds them: FP8 pads a row's last block, but a rank's share of a
// row split by columns is a byte range of it, so whole blocks.
func (bd *binder) rowsFit(p *param, dt backend.DType, cols int) bool {
	if bd.ranks <= 1 || p.tp != tpCols {
		return dt.CheckCols(cols) == nil
	}
	e, _ := dt.Block()
	for _, w := range bd.colSections(p, cols) {
		if w%e != 0 {
			return false
		}
	}
	return true
}

// quantizeTo returns the type a linear weight is quantized to when q is
// asked (--quantize) and fits says which types' blocks tile its rows: q,
// else, as llama.cpp's quantizer falls back tensor by tensor, Q8_0, else
// F32 for none (the weight keeps its float type); and, where that is not
// q, the elements of the blocks its rows are not whole blocks of.
func quantizeTo(q backend.DType, fits func(backend.DType) bool) (dt backend.DType, block int) {
	for _, dt := range []backend.DType{q, backend.Q8_0} {
		if fits(dt) {
			return dt, block
		}
		block, _ = dt.Block()
	}
	return backend.F32, block
}

// QuantFallback counts the linear weights that Options.Quantize (or a
// synthetic model's quantized type) held in another type, DType, because
// their rows are not whole blocks of Block elements (quantizeTo).
type QuantFallback struct {
	DType   backend.DType
	Weights int
	Block   int
}

// fellBack counts a linear weight held in dt for want of whole blocks of
// block elements.
func (bd *binder) fellBack(dt backend.DType, block int) {
	for i := range bd.fallbacks {
		if bd.fallbacks[i].DType == dt {
			bd.fallbacks[i].Weights++
			return
		}
	}
	bd.fallbacks = append(bd.fallbacks, QuantFallback{DType: dt, Weights: 1, Block: block})
}

// whole returns part i, pt, of p as the checkpoint holds it: for a weight
// split across tensor-parallel ranks, its declared share's shape times the
// ranges it splits into along the split dimension.
func (bd *binder) whole(p *param, i int, pt part) part {
	if bd.ranks <= 1 || p.tp == tpWhole || p.tp == tpStack {
		return pt // a stack's parts are declared whole
	}
	s := slices.Clone(pt.shape)
	if p.tp == tpRows {
		s[0] *= bd.ways(p, i)
	} else {
		s[len(s)-1] *= bd.ranks
	}
	pt.shape = s
	return pt
}

// ways returns into how many ranges part i of p splits (param.ways).
func (bd *binder) ways(p *param, i int) int {
	if i < len(p.ways) && p.ways[i] > 0 {
		return p.ways[i]
	}
	return bd.ranks
}

// share returns rank bd.rank's share of a split weight, from its parts as
// the checkpoint holds them (whole, of the layout's shapes): the rank's
// range of each part's rows, of every row's columns, or of the rows of
// the parts together.
func (bd *binder) share(p *param, layout []part, dt backend.DType, parts []stored) []byte {
	data := make([]byte, 0, dt.Bytes(p.shape...))
	r, n := bd.rank, bd.ranks
	if p.tp == tpCols {
		// Each row's blocks (a float type: its elements) of the rank's
		// range of every section.
		e, b := dt.Block()
		for i, st := range parts {
			rows, cols := matrixOf(layout[i].shape)
			rb := dt.RowBytes(cols)
			for row := range rows {
				off := 0
				for _, w := range bd.colSections(p, cols) {
					lo := row*rb + (off+r*w)/e*b
					data = append(data, st.data[lo:lo+w/e*b]...)
					off += n * w
				}
			}
		}
		return data
	}
	if p.tp == tpStack || p.sections != nil {
		var all []byte
		for _, st := range parts {
			all = append(all, st.data...)
		}
		if p.rows != nil {
			all = permuteRows(all, p.rows)
		}
		if p.tp == tpStack {
			size := len(all) / n
			return append(data, all[r*size:(r+1)*size]...)
		}
		rb := len(all) / (n * p.shape[0]) // the rank's shape holds 1/n of the rows
		for _, rows := range p.sections {
			sec := all[:n*rows*rb]
			all = all[n*rows*rb:]
			data = append(data, sec[r*rows*rb:(r+1)*rows*rb]...)
		}
		return data
	}
	for i, st := range parts {
		_, rows := bd.rowShare(p, i, layout[i].shape, st)
		data = append(data, rows...)
	}
	return data
}

// loadRuns loads a fused weight whose parts a file stores in several
// types (Q4_K_M keeps some v projections in Q6_K, q and k in Q4_K) without
// widening any: each run of consecutive parts of one type as one tensor
// (p.runs), the parts as views of it (p.split), so that the model makes
// one product a run. A rank takes its rows of each part.
func (bd *binder) loadRuns(p *param, layout []part, parts []stored, srcs [][]byte, sharded bool) error {
	*p.runs = nil
	for i := 0; i < len(parts); {
		j, rows := i, 0
		var datas [][]byte
		var shapes [][]int
		for ; j < len(parts) && parts[j].dt == parts[i].dt; j++ {
			shape, d := layout[j].shape, parts[j].data
			if sharded {
				shape, d = bd.rowShare(p, j, shape, parts[j])
			}
			datas, shapes = append(datas, d), append(shapes, shape)
			rows += shape[0]
		}
		data := datas[0] // used in place when a run is one part
		if len(datas) > 1 {
			data = slices.Concat(datas...)
			bd.copied = append(bd.copied, srcs[i:j]...)
		}
		shape := append([]int{rows}, shapes[0][1:]...)
		t, err := bd.b.Load(parts[i].dt, shape, data)
		if err != nil {
			return fmt.Errorf("model: tensor %q: %w", layout[i].name, err)
		}
		*p.runs = append(*p.runs, t)
		at := 0
		for k, s := range shapes {
			*p.split[i+k] = bd.b.Rows(t, at, s[0])
			at += s[0]
		}
		i = j
	}
	return nil
}

// rowShare returns the rank's range of the rows of part i of p (shape, as
// the checkpoint holds it; st its bytes) and that range's shape.
func (bd *binder) rowShare(p *param, i int, shape []int, st stored) ([]int, []byte) {
	rows, cols := matrixOf(shape)
	rb, w := st.dt.RowBytes(cols), bd.ways(p, i)
	per, k := rows/w, bd.rank*w/bd.ranks
	s := slices.Clone(shape)
	s[0] /= w
	return s, st.data[k*per*rb : (k+1)*per*rb]
}

// colSections returns the columns of a rank's share of each section of a
// weight of cols columns split by columns (param.sections; nil: one).
func (bd *binder) colSections(p *param, cols int) []int {
	if p.sections != nil {
		return p.sections
	}
	return []int{cols / bd.ranks}
}

// missing reports a tensor the checkpoint lacks, or (a GGUF file) holds in
// a form kiln cannot read.
func (bd *binder) missing(pt part) error {
	if es, ok := bd.src.(interface{ TensorErr(string) error }); ok {
		if err := es.TensorErr(pt.name); err != nil {
			return fmt.Errorf("model: %s: %w", bd.where, err)
		}
	}
	return fmt.Errorf("model: tensor %q not found in %s (want shape %v)", pt.name, bd.where, pt.stored())
}

// stored is one part of a weight as kiln holds it: its type and bytes.
type stored struct {
	dt   backend.DType
	data []byte
}

// read returns a checkpoint tensor in kiln's form: float and GGUF types as
// stored (transposed if the layout says so), FP8 as FP8 rows built from
// the weight and its tile scales.
func (bd *binder) read(pt part, t *safetensors.Tensor) (stored, error) {
	dt, ok := dtypeOf(t.DType)
	if !ok {
		return stored{}, fmt.Errorf("model: tensor %q in %s has dtype %s; kiln loads %s", pt.name, t.File, t.DType, loadable)
	}
	rows, cols := matrixOf(pt.shape)
	if err := dt.CheckCols(cols); err != nil {
		return stored{}, fmt.Errorf("model: tensor %q in %s: %w", pt.name, t.File, err)
	}
	switch {
	case dt == backend.FP8:
		if pt.transposed {
			return stored{}, fmt.Errorf("model: tensor %q in %s: FP8 experts stored transposed are not supported", pt.name, t.File)
		}
		data, err := bd.fp8Rows(pt.name, t, rows, cols)
		return stored{dt, data}, err
	case dt.Quantized():
		if pt.transposed {
			return stored{}, fmt.Errorf("model: tensor %q in %s: quantized experts stored transposed are not supported", pt.name, t.File)
		}
		return stored{dt, t.Data}, nil
	case pt.transposed:
		return stored{dt, appendTransposed(nil, t.Data, pt.shape, dt.Size())}, nil
	}
	return stored{dt, t.Data}, nil
}

// matrixOf returns the rows and columns of a weight (experts stacked by
// rows; a vector is one row).
func matrixOf(shape []int) (rows, cols int) {
	cols = shape[len(shape)-1]
	return numel(shape) / max(cols, 1), cols
}

// fp8Rows builds kiln's FP8 rows from an e4m3 weight and its
// weight_scale_inv (f32 or bf16, one scale per tile of fp8Block).
func (bd *binder) fp8Rows(name string, t *safetensors.Tensor, rows, cols int) ([]byte, error) {
	sname := name + "_scale_inv"
	st, ok := bd.src.Tensor(sname)
	if !ok {
		return nil, fmt.Errorf("model: FP8 tensor %q in %s has no %q beside it", name, t.File, sname)
	}
	br, bc := bd.fp8Block[0], bd.fp8Block[1]
	if br == 0 {
		br, bc = 128, 128
	}
	tr, tc := (rows+br-1)/br, (cols+bc-1)/bc
	sdt, ok := dtypeOf(st.DType)
	if !ok || sdt.Quantized() || len(st.Data) != tr*tc*sdt.Size() {
		return nil, fmt.Errorf("model: %q in %s is %s%v; want %d x %d scales in F32 or BF16 for %v in %dx%d tiles", sname, st.File, st.DType, st.Shape, tr, tc, t.Shape, br, bc)
	}
	scales := make([]float32, tr*tc)
	for i := range scales {
		switch sdt {
		case backend.F32:
			scales[i] = math.Float32frombits(binary.LittleEndian.Uint32(st.Data[4*i:]))
		case backend.BF16:
			scales[i] = backend.BF16ToF32(binary.LittleEndian.Uint16(st.Data[2*i:]))
		case backend.F16:
			scales[i] = backend.F16ToF32(binary.LittleEndian.Uint16(st.Data[2*i:]))
		}
	}
	data, err := quant.FromTiles(t.Data, scales, rows, cols, br, bc)
	if err != nil {
		return nil, fmt.Errorf("model: tensor %q in %s: %w", name, t.File, err)
	}
	return data, nil
}

func f32Bytes(f []float32) []byte {
	out := make([]byte, 4*len(f))
	for i, v := range f {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
	}
	return out
}

// widened returns the part as f32.
func (st stored) widened(shape []int) stored {
	if st.dt == backend.F32 {
		return st
	}
	return stored{backend.F32, f32Bytes(floatsOf(st.dt, st.data, shape))}
}

// floatsOf decodes a weight of any type to float32.
func floatsOf(dt backend.DType, data []byte, shape []int) []float32 {
	rows, cols := matrixOf(shape)
	if dt.Quantized() {
		return quant.Dequantize(dt, data, rows, cols)
	}
	f := make([]float32, rows*cols)
	for i := range f {
		switch dt {
		case backend.F32:
			f[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		case backend.BF16:
			f[i] = backend.BF16ToF32(binary.LittleEndian.Uint16(data[2*i:]))
		case backend.F16:
			f[i] = backend.F16ToF32(binary.LittleEndian.Uint16(data[2*i:]))
		}
	}
	return f
}

// quantizeParallel quantizes a float weight to q over all cores, in
// chunks of whole 128-row tiles (FP8's scales span 128 rows).
func quantizeParallel(q, dt backend.DType, data []byte, shape []int) ([]byte, error) {
	rows, cols := matrixOf(shape)
	if err := q.CheckCols(cols); err != nil {
		return nil, err
	}
	rb, eb := q.RowBytes(cols), dt.Size()*cols
	out := make([]byte, rows*rb)
	const chunk = 128
	var (
		wg   sync.WaitGroup
		next atomic.Int64
		errs = make([]error, runtime.GOMAXPROCS(0))
	)
	for w := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				r0 := int(next.Add(chunk)) - chunk
				if r0 >= rows {
					return
				}
				n := min(chunk, rows-r0)
				f := floatsOf(dt, data[r0*eb:(r0+n)*eb], []int{n, cols})
				b, err := quant.Quantize(q, f, n, cols)
				if err != nil {
					errs[w] = err
					return
				}
				copy(out[r0*rb:], b)
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// appendTransposed appends src, a stack of matrices stored [.., c, r], as
// [.., r, c] where shape is the wanted [.., r, c].
func appendTransposed(dst, src []byte, shape []int, size int) []byte {
	n := len(shape)
	r, c := shape[n-2], shape[n-1]
	batch := numel(shape[:n-2])
	out := make([]byte, len(src))
	for m := 0; m < batch; m++ {
		base := m * r * c * size
		for i := 0; i < r; i++ {
			for j := 0; j < c; j++ {
				copy(out[base+(i*c+j)*size:base+(i*c+j+1)*size], src[base+(j*r+i)*size:base+(j*r+i+1)*size])
			}
		}
	}
	return append(dst, out...)
}

func permuteRows(data []byte, rows []int) []byte {
	row := len(data) / len(rows)
	out := make([]byte, len(data))
	for i, r := range rows {
		copy(out[i*row:(i+1)*row], data[r*row:(r+1)*row])
	}
	return out
}

// synthType is the type a synthetic model stores p in: the binder's, but
// only linear weights are quantized (the rest bf16), and those whose rows
// the type does not fit fall back as --quantize's do (quantizeTo: block
// is then the elements of the blocks that did not fit).
func (bd *binder) synthType(p *param) (dt backend.DType, block int) {
	if !bd.dtype.Quantized() {
		return bd.dtype, 0
	}
	if !p.lin {
		return backend.BF16, 0
	}
	_, cols := matrixOf(p.shape)
	if dt, block = quantizeTo(bd.dtype, func(dt backend.DType) bool { return dt.CheckCols(cols) == nil }); !dt.Quantized() {
		dt = backend.BF16
	}
	return dt, block
}

// synthesize fills p with deterministic pseudo-random values of its
// synthetic type, in parallel chunks each seeded from (seed, param, chunk).
func (bd *binder) synthesize(p *param, index uint64) error {
	dt, block := bd.synthType(p)
	if block > 0 {
		bd.fellBack(dt, block)
	}
	data := make([]byte, dt.Bytes(p.shape...))
	rows, cols := matrixOf(p.shape)
	rowsPer := synthChunkRows(dt, cols)
	chunks := (rows + rowsPer - 1) / rowsPer
	workers := min(runtime.GOMAXPROCS(0), max(chunks, 1))
	rb := dt.RowBytes(cols)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := w; c < chunks; c += workers {
				rng := synthRNG(bd.seed, index, c)
				r0, r1 := c*rowsPer, min((c+1)*rowsPer, rows)
				if dt.Quantized() {
					copy(data[r0*rb:], quant.Random(dt, r1-r0, cols, 0.02, rng.next))
					continue
				}
				size := dt.Size()
				for i := r0 * cols; i < r1*cols; i++ {
					putFloat(data[i*size:], dt, p.init.sample(&rng, p.shape))
				}
			}
		}()
	}
	wg.Wait()
	t, err := bd.b.Load(dt, p.shape, data)
	if err != nil {
		return err
	}
	*p.dst = t
	return nil
}

// synthChunkRows is the rows of one chunk of a synthetic weight: whole rows
// of at least 64K elements (and 128 rows of a quantized type, FP8's tile).
func synthChunkRows(dt backend.DType, cols int) int {
	rowsPer := max(1, (1<<16)/max(cols, 1))
	if dt.Quantized() {
		rowsPer = max(rowsPer, 128)
	}
	return rowsPer
}

// synthRNG seeds chunk c of weight index of a synthetic model.
func synthRNG(seed, index uint64, c int) splitmix {
	return splitmix(seed ^ index<<32 ^ uint64(c)*0x9e3779b97f4a7c15)
}

type splitmix uint64

func (s *splitmix) next() uint64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// uniform returns a value in [0, 1).
func (s *splitmix) uniform() float64 { return float64(s.next()>>11) / (1 << 53) }

func (k initKind) sample(rng *splitmix, shape []int) float32 {
	switch k {
	case initOnes:
		return 1
	case initZeros:
		return 0
	case initALog:
		return float32(math.Log(1 + 15*rng.uniform()))
	case initConv:
		bound := 1 / math.Sqrt(float64(shape[len(shape)-1]))
		return float32((2*rng.uniform() - 1) * bound)
	}
	// Irwin-Hall: the sum of 4 uniforms (the four 16-bit quarters of one
	// draw), scaled to unit variance, is close enough to a normal for
	// benchmark weights and much cheaper.
	r := rng.next()
	sum := float64(r&0xffff + r>>16&0xffff + r>>32&0xffff + r>>48)
	return float32((sum/65536 - 2) * math.Sqrt(3) * 0.02)
}

func putFloat(dst []byte, dt backend.DType, v float32) {
	switch dt {
	case backend.F32:
		binary.LittleEndian.PutUint32(dst, math.Float32bits(v))
	case backend.BF16:
		binary.LittleEndian.PutUint16(dst, backend.BF16Bits(v))
	case backend.F16:
		binary.LittleEndian.PutUint16(dst, backend.F16Bits(v))
	}
}

// release drops from memory the pages of a mapped checkpoint that only
// copied weights were read from: the mapping stays open for the weights
// used in place, and without this every page read at load time would stay
// resident beside its copy (the CPU backend's RSS was the file plus the
// copies). Only whole pages inside a copied tensor are dropped; a page
// read again is read back from the file.
func (bd *binder) release() {
	page := uintptr(os.Getpagesize())
	for _, b := range bd.copied {
		if len(b) == 0 {
			continue
		}
		start := uintptr(unsafe.Pointer(&b[0]))
		lo := (start + page - 1) &^ (page - 1)
		hi := (start + uintptr(len(b))) &^ (page - 1)
		if hi > lo {
			syscall.Madvise(b[lo-start:hi-start], syscall.MADV_DONTNEED)
		}
	}
	bd.copied = nil
}
