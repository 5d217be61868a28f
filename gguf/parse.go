package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"os"
	"sort"

	"github.com/kiln-llm/kiln/internal/mapfile"
)

const (
	magic            = "GGUF"
	latestVersion    = 3
	defaultAlignment = 32
	alignmentKey     = "general.alignment"

	// headerSize is the magic, the version and the two counts.
	headerSize = 4 + 4 + 8 + 8
	// maxDims is GGML_MAX_DIMS.
	maxDims = 4
	// maxName is the longest tensor name ggml stores (GGML_MAX_NAME less its
	// NUL); llama.cpp rejects longer ones, so a file with one is not a file
	// llama.cpp wrote or could read.
	maxName = 63
	// maxNesting bounds arrays of arrays, so a file of nested array headers
	// cannot recurse the parser into a stack overflow.
	maxNesting = 16

	// The smallest encodings of a key-value pair (key length, a one-byte key,
	// type tag, a one-byte value) and of a tensor info (name length, a
	// one-byte name, dimension count, one dimension, type, offset): a count
	// the bytes left cannot hold at this size each is corrupt, and is
	// rejected before anything is allocated for it.
	minKV         = 8 + 1 + 4 + 1
	minTensorInfo = 8 + 1 + 4 + 8 + 4 + 8

	// preallocation caps the capacity reserved from a count in the file; real
	// files hold tens of keys and hundreds of tensors, and a lying count then
	// costs only what its entries actually parse to.
	preallocation = 1024
)

// Open memory-maps the GGUF file at path read-only and parses it.
func Open(path string) (*File, error) {
	data, unmap, err := mapfile.Open(path, headerSize)
	if err != nil {
		if os.IsNotExist(err) || os.IsPermission(err) {
			return nil, fmt.Errorf("gguf: %w", err)
		}
		return nil, fmt.Errorf("gguf %s: %w", path, err)
	}
	f, err := Parse(path, data)
	if err != nil {
		unmap()
		return nil, err
	}
	f.unmap = unmap
	return f, nil
}

// Parse parses a whole GGUF file held in data; name is used in errors and as
// the File's Name. The tensors' Data alias data; the metadata is copied.
func Parse(name string, data []byte) (*File, error) {
	f, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("gguf %s: %w", name, err)
	}
	f.Name = name
	return f, nil
}

// reader walks the file; every read checks the bytes left first, and errors
// say at which byte the problem is.
type reader struct {
	data []byte
	off  int
}

func (r *reader) left() int { return len(r.data) - r.off }

func (r *reader) take(n int, what string) ([]byte, error) {
	if n > r.left() {
		return nil, fmt.Errorf("truncated at byte %d: %s takes %d bytes, %d are left", r.off, what, n, r.left())
	}
	b := r.data[r.off : r.off+n]
	r.off += n
	return b, nil
}

func (r *reader) u32(what string) (uint32, error) {
	b, err := r.take(4, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (r *reader) u64(what string) (uint64, error) {
	b, err := r.take(8, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

func (r *reader) str(what string) (string, error) {
	at := r.off
	n, err := r.u64(what + "'s length")
	if err != nil {
		return "", err
	}
	if n > uint64(r.left()) {
		return "", fmt.Errorf("at byte %d: %s is %d bytes long, more than the %d left", at, what, n, r.left())
	}
	b, _ := r.take(int(n), what)
	return string(b), nil
}

// tensorInfo is a tensor's record before its data is placed.
type tensorInfo struct {
	name string
	typ  Type
	ne   []uint64 // innermost first, as stored
	off  uint64   // in the data section
	size uint64
}

func parse(data []byte) (*File, error) {
	r := &reader{data: data}
	if len(data) < len(magic) {
		return nil, fmt.Errorf("truncated file: %d bytes, the magic alone takes %d", len(data), len(magic))
	}
	if m := string(data[:4]); m != magic {
		return nil, fmt.Errorf("bad magic %q, want %q: not a GGUF file", m, magic)
	}
	r.off = 4
	version, err := r.u32("the version")
	if err != nil {
		return nil, err
	}
	switch {
	case version != 0 && version&0xffff == 0:
		// A big-endian file's small version number reads as a large one
		// with its low half zero; llama.cpp detects it the same way.
		return nil, fmt.Errorf("version %#x is version %d byte-swapped: a big-endian GGUF file, which kiln does not read; convert the model again on a little-endian machine",
			version, bits.ReverseBytes32(version))
	case version == 1:
		return nil, errors.New("GGUF version 1 (32-bit counts) is no longer supported; convert the model again with a current llama.cpp")
	case version < 2 || version > latestVersion:
		return nil, fmt.Errorf("unsupported GGUF version %d: this reader knows versions 2 and 3", version)
	}
	nTensors, err := r.u64("the tensor count")
	if err != nil {
		return nil, err
	}
	nKV, err := r.u64("the metadata count")
	if err != nil {
		return nil, err
	}
	if nKV > uint64(r.left()/minKV) {
		return nil, fmt.Errorf("header claims %d metadata pairs, more than the %d bytes left can hold", nKV, r.left())
	}
	if nTensors > uint64(r.left()/minTensorInfo) {
		return nil, fmt.Errorf("header claims %d tensors, more than the %d bytes left can hold", nTensors, r.left())
	}

	f := &File{
		Version: version,
		KV:      make([]KV, 0, min(nKV, preallocation)),
		Meta:    make(map[string]Value, min(nKV, preallocation)),
	}
	for i := range nKV {
		at := r.off
		key, err := r.str(fmt.Sprintf("key %d", i))
		if err != nil {
			return nil, err
		}
		if key == "" {
			return nil, fmt.Errorf("at byte %d: key %d is empty", at, i)
		}
		if _, dup := f.Meta[key]; dup {
			return nil, fmt.Errorf("at byte %d: key %q appears twice", at, key)
		}
		t, err := r.u32("its type")
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		v, err := r.value(ValueType(t), 0)
		if err != nil {
			return nil, fmt.Errorf("key %q: %w", key, err)
		}
		f.KV = append(f.KV, KV{key, v})
		f.Meta[key] = v
	}

	f.Alignment = defaultAlignment
	if v, ok := f.Meta[alignmentKey]; ok {
		a, ok := v.v.(uint32)
		if !ok {
			return nil, fmt.Errorf("%s is a %s, want u32", alignmentKey, v.Type())
		}
		if a == 0 || a&(a-1) != 0 {
			return nil, fmt.Errorf("%s %d is not a power of two", alignmentKey, a)
		}
		f.Alignment = int(a)
	}

	infos := make([]tensorInfo, 0, min(nTensors, preallocation))
	seen := make(map[string]bool, min(nTensors, preallocation))
	for i := range nTensors {
		at := r.off
		ti, err := r.tensorInfo(i, uint64(len(data)))
		if err != nil {
			return nil, err
		}
		if seen[ti.name] {
			return nil, fmt.Errorf("at byte %d: tensor %q appears twice", at, ti.name)
		}
		seen[ti.name] = true
		if ti.off%uint64(f.Alignment) != 0 {
			return nil, fmt.Errorf("tensor %q: offset %d is not a multiple of the alignment %d", ti.name, ti.off, f.Alignment)
		}
		infos = append(infos, ti)
	}

	// The data section starts at the next multiple of the alignment (from
	// the file's start); llama.cpp pads even with no tensors, but only
	// needs the padding when there are some.
	start := uint64(r.off)
	if nTensors > 0 {
		start = alignUp(start, uint64(f.Alignment))
		if start > uint64(len(data)) {
			return nil, fmt.Errorf("truncated file: the data section would start at byte %d, the file has %d", start, len(data))
		}
	}
	f.DataOffset = int64(start)
	avail := uint64(len(data)) - start
	f.Tensors = make([]*Tensor, 0, len(infos))
	f.tensors = make(map[string]*Tensor, len(infos))
	for _, ti := range infos {
		if ti.off > avail || ti.size > avail-ti.off {
			return nil, fmt.Errorf("tensor %q: its %d bytes at offset %d run past the end of the file (the data section holds %d bytes): truncated or corrupt",
				ti.name, ti.size, ti.off, avail)
		}
		abs := int(start + ti.off)
		end := abs + int(ti.size)
		t := &Tensor{Name: ti.name, Type: ti.typ, Shape: shapeOf(ti.ne), Offset: int64(abs), Data: data[abs:end:end]}
		f.Tensors = append(f.Tensors, t)
		f.tensors[t.Name] = t
	}
	if err := checkOverlap(infos); err != nil {
		return nil, err
	}
	return f, nil
}

// tensorInfo reads the i-th tensor's record; fileSize bounds its byte size.
func (r *reader) tensorInfo(i, fileSize uint64) (tensorInfo, error) {
	var ti tensorInfo
	at := r.off
	name, err := r.str(fmt.Sprintf("tensor %d's name", i))
	if err != nil {
		return ti, err
	}
	switch {
	case name == "":
		return ti, fmt.Errorf("at byte %d: tensor %d has an empty name", at, i)
	case len(name) > maxName:
		return ti, fmt.Errorf("at byte %d: tensor name %q is %d bytes long; ggml allows at most %d", at, name, len(name), maxName)
	}
	ti.name = name
	fail := func(err error) (tensorInfo, error) { return ti, fmt.Errorf("tensor %q: %w", name, err) }
	nd, err := r.u32("the dimension count")
	if err != nil {
		return fail(err)
	}
	if nd < 1 || nd > maxDims {
		return fail(fmt.Errorf("%d dimensions, want 1 to %d", nd, maxDims))
	}
	ti.ne = make([]uint64, nd)
	for j := range ti.ne {
		if ti.ne[j], err = r.u64("a dimension"); err != nil {
			return fail(err)
		}
	}
	t, err := r.u32("the type")
	if err != nil {
		return fail(err)
	}
	ti.typ = Type(t)
	if ti.size, err = tensorSize(ti.typ, ti.ne, fileSize); err != nil {
		return fail(err)
	}
	if ti.off, err = r.u64("the offset"); err != nil {
		return fail(err)
	}
	return ti, nil
}

// tensorSize returns the bytes a tensor of type t and dimensions ne
// (innermost first) takes, or why it cannot exist. limit (the file size when
// reading) bounds the answer, which keeps the arithmetic from overflowing.
func tensorSize(t Type, ne []uint64, limit uint64) (uint64, error) {
	if len(ne) < 1 || len(ne) > maxDims {
		return 0, fmt.Errorf("%d dimensions, want 1 to %d", len(ne), maxDims)
	}
	for _, d := range ne {
		if d == 0 || d > math.MaxInt64 {
			return 0, fmt.Errorf("shape %v: every dimension must be positive", signed(ne))
		}
	}
	if err := t.check(); err != nil {
		return 0, err
	}
	elems, bsize := t.Block()
	if ne[0]%uint64(elems) != 0 {
		return 0, fmt.Errorf("shape %v of %s: rows of %d elements are not whole %d-element blocks", signed(ne), t, ne[0], elems)
	}
	hi, size := bits.Mul64(ne[0]/uint64(elems), uint64(bsize))
	ok := hi == 0
	numel := ne[0]
	for _, d := range ne[1:] {
		var hi2 uint64
		hi, size = bits.Mul64(size, d)
		hi2, numel = bits.Mul64(numel, d)
		ok = ok && hi == 0 && hi2 == 0
	}
	if !ok || size > math.MaxInt64 || numel > math.MaxInt {
		return 0, fmt.Errorf("shape %v of %s is too large", signed(ne), t)
	}
	if size > limit {
		return 0, fmt.Errorf("shape %v of %s takes %d bytes, more than the whole file (%d)", signed(ne), t, size, limit)
	}
	return size, nil
}

// signed formats dimensions in row-major order, as int64 so that a negative
// one (what llama.cpp would call it) shows as such.
func signed(ne []uint64) []int64 {
	s := make([]int64, len(ne))
	for i, d := range ne {
		s[len(ne)-1-i] = int64(d)
	}
	return s
}

// shapeOf reverses ggml's innermost-first dimensions into a row-major shape.
func shapeOf(ne []uint64) []int {
	s := make([]int, len(ne))
	for i, d := range ne {
		s[len(ne)-1-i] = int(d)
	}
	return s
}

func alignUp(n, a uint64) uint64 { return n + (a-n%a)%a }

// checkOverlap rejects tensors sharing bytes: llama.cpp writes them back to
// back, and two views of the same bytes are a corrupt (or crafted) file.
func checkOverlap(infos []tensorInfo) error {
	order := make([]int, len(infos))
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(a, b int) bool { return infos[order[a]].off < infos[order[b]].off })
	for k := 1; k < len(order); k++ {
		p, q := infos[order[k-1]], infos[order[k]]
		if q.off < p.off+p.size {
			return fmt.Errorf("tensors %q [%d, %d) and %q [%d, %d) overlap in the data section",
				p.name, p.off, p.off+p.size, q.name, q.off, q.off+q.size)
		}
	}
	return nil
}

// value reads a value of type t; depth counts the arrays around it.
func (r *reader) value(t ValueType, depth int) (Value, error) {
	if t == TypeArray {
		return r.array(depth + 1)
	}
	if t == TypeString {
		s, err := r.str("the string")
		return Value{s}, err
	}
	n := t.size()
	if n == 0 {
		return Value{}, fmt.Errorf("at byte %d: unknown value type %d", r.off-4, uint32(t))
	}
	b, err := r.take(n, "the "+t.String()+" value")
	if err != nil {
		return Value{}, err
	}
	return Value{scalar(t, b)}, nil
}

// scalar decodes a fixed-size value.
func scalar(t ValueType, b []byte) any {
	le := binary.LittleEndian
	switch t {
	case TypeUint8:
		return b[0]
	case TypeInt8:
		return int8(b[0])
	case TypeBool:
		// llama.cpp writes 0 or 1 and reads any non-zero byte as true.
		return b[0] != 0
	case TypeUint16:
		return le.Uint16(b)
	case TypeInt16:
		return int16(le.Uint16(b))
	case TypeUint32:
		return le.Uint32(b)
	case TypeInt32:
		return int32(le.Uint32(b))
	case TypeFloat32:
		return math.Float32frombits(le.Uint32(b))
	case TypeUint64:
		return le.Uint64(b)
	case TypeInt64:
		return int64(le.Uint64(b))
	case TypeFloat64:
		return math.Float64frombits(le.Uint64(b))
	}
	panic("gguf: scalar of type " + t.String())
}

// array reads an array's element type, count and elements.
func (r *reader) array(depth int) (Value, error) {
	at := r.off
	if depth > maxNesting {
		return Value{}, fmt.Errorf("at byte %d: arrays nested more than %d deep", at, maxNesting)
	}
	et, err := r.u32("the array's element type")
	if err != nil {
		return Value{}, err
	}
	n, err := r.u64("the array's length")
	if err != nil {
		return Value{}, err
	}
	t := ValueType(et)
	// Each element takes at least its fixed size, a string its 8-byte
	// length, an array its type and length: a count the bytes left cannot
	// hold is rejected before the slice is made.
	least := t.size()
	switch t {
	case TypeString:
		least = 8
	case TypeArray:
		least = 4 + 8
	}
	if least == 0 {
		return Value{}, fmt.Errorf("at byte %d: array of unknown value type %d", at, et)
	}
	if n > uint64(r.left()/least) {
		return Value{}, fmt.Errorf("at byte %d: array of %d %s elements cannot fit in the %d bytes left", at, n, t, r.left())
	}
	switch t {
	case TypeString:
		return r.strings(int(n))
	case TypeArray:
		out := make([]Value, n)
		for i := range out {
			if out[i], err = r.array(depth + 1); err != nil {
				return Value{}, err
			}
		}
		return Value{out}, nil
	}
	b, _ := r.take(int(n)*least, "the array")
	switch t {
	case TypeUint8:
		return Value{fixed(b, 1, func(b []byte) uint8 { return b[0] })}, nil
	case TypeInt8:
		return Value{fixed(b, 1, func(b []byte) int8 { return int8(b[0]) })}, nil
	case TypeBool:
		return Value{fixed(b, 1, func(b []byte) bool { return b[0] != 0 })}, nil
	case TypeUint16:
		return Value{fixed(b, 2, binary.LittleEndian.Uint16)}, nil
	case TypeInt16:
		return Value{fixed(b, 2, func(b []byte) int16 { return int16(binary.LittleEndian.Uint16(b)) })}, nil
	case TypeUint32:
		return Value{fixed(b, 4, binary.LittleEndian.Uint32)}, nil
	case TypeInt32:
		return Value{fixed(b, 4, func(b []byte) int32 { return int32(binary.LittleEndian.Uint32(b)) })}, nil
	case TypeFloat32:
		return Value{fixed(b, 4, func(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) })}, nil
	case TypeUint64:
		return Value{fixed(b, 8, binary.LittleEndian.Uint64)}, nil
	case TypeInt64:
		return Value{fixed(b, 8, func(b []byte) int64 { return int64(binary.LittleEndian.Uint64(b)) })}, nil
	default: // TypeFloat64
		return Value{fixed(b, 8, func(b []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(b)) })}, nil
	}
}

// strings reads an array of n strings. A vocabulary is hundreds of
// thousands of them, so the first pass only checks the lengths, and the
// strings are then cut from one copy of the array's bytes (length prefixes
// included) instead of being allocated one by one.
func (r *reader) strings(n int) (Value, error) {
	start := r.off
	for range n {
		at := r.off
		l, err := r.u64("a string's length")
		if err != nil {
			return Value{}, err
		}
		if l > uint64(r.left()) {
			return Value{}, fmt.Errorf("at byte %d: a string in the array is %d bytes long, more than the %d left", at, l, r.left())
		}
		r.off += int(l)
	}
	all := string(r.data[start:r.off])
	out := make([]string, n)
	p := 0
	for i := range out {
		l := int(binary.LittleEndian.Uint64(r.data[start+p:]))
		out[i] = all[p+8 : p+8+l]
		p += 8 + l
	}
	return Value{out}, nil
}

// fixed decodes len(b)/size elements of size bytes each.
func fixed[T any](b []byte, size int, dec func([]byte) T) []T {
	out := make([]T, len(b)/size)
	for i := range out {
		out[i] = dec(b[i*size:])
	}
	return out
}
