package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/kiln-llm/kiln/backend"
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
	// synthetic
	dtype backend.DType
	seed  uint64
	// progress
	progress    func(done, total int64)
	done, total int64
}

func dtypeOf(s string) (backend.DType, bool) {
	switch s {
	case "BF16":
		return backend.BF16, true
	case "F16":
		return backend.F16, true
	case "F32":
		return backend.F32, true
	}
	return 0, false
}

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
		return int64(numel(p.shape) * bd.dtype.Size())
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
		if shapeFits(t.Shape, l[0].stored()) {
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
		return fmt.Errorf("model: tensor %q not found in %s (want shape %v)", p.layouts[0][0].name, bd.where, p.layouts[0][0].stored())
	}
	tensors := make([]*safetensors.Tensor, len(layout))
	var dt backend.DType
	for i, pt := range layout {
		t, ok := bd.src.Tensor(pt.name)
		if !ok {
			return fmt.Errorf("model: tensor %q not found in %s (want shape %v)", pt.name, bd.where, pt.stored())
		}
		if !shapeFits(t.Shape, pt.stored()) {
			return fmt.Errorf("model: tensor %q in %s has shape %v, want %v", pt.name, t.File, t.Shape, pt.stored())
		}
		d, ok := dtypeOf(t.DType)
		if !ok {
			return fmt.Errorf("model: tensor %q in %s has dtype %s; kiln loads BF16, F16 and F32", pt.name, t.File, t.DType)
		}
		if i > 0 && d != dt {
			return fmt.Errorf("model: tensor %q in %s is %s but %q is %s; fused parts must share a dtype", pt.name, t.File, t.DType, layout[0].name, tensors[0].DType)
		}
		dt, tensors[i] = d, t
	}
	var data []byte
	if len(layout) == 1 && !layout[0].transposed && p.rows == nil {
		data = tensors[0].Data // used in place: the mapping stays open while the model lives
	} else {
		data = make([]byte, 0, numel(p.shape)*dt.Size())
		for i, t := range tensors {
			if layout[i].transposed {
				data = appendTransposed(data, t.Data, layout[i].shape, dt.Size())
			} else {
				data = append(data, t.Data...)
			}
		}
		if p.rows != nil {
			data = permuteRows(data, p.rows)
		}
	}
	t, err := bd.b.Load(dt, p.shape, data)
	if err != nil {
		return fmt.Errorf("model: tensor %q: %w", layout[0].name, err)
	}
	*p.dst = t
	return nil
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

// synthesize fills p with deterministic pseudo-random values of the
// binder's dtype, in parallel chunks each seeded from (seed, param, chunk).
func (bd *binder) synthesize(p *param, index uint64) error {
	n := numel(p.shape)
	size := bd.dtype.Size()
	data := make([]byte, n*size)
	const chunk = 1 << 16
	chunks := (n + chunk - 1) / chunk
	workers := min(runtime.GOMAXPROCS(0), max(chunks, 1))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := w; c < chunks; c += workers {
				rng := splitmix(bd.seed ^ index<<32 ^ uint64(c)*0x9e3779b97f4a7c15)
				lo, hi := c*chunk, min((c+1)*chunk, n)
				for i := lo; i < hi; i++ {
					putFloat(data[i*size:], bd.dtype, p.init.sample(&rng, p.shape))
				}
			}
		}()
	}
	wg.Wait()
	t, err := bd.b.Load(bd.dtype, p.shape, data)
	if err != nil {
		return err
	}
	*p.dst = t
	return nil
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
