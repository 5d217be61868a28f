package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// KV is one metadata pair.
type KV struct {
	Key   string
	Value Value
}

// WriteTensor is one tensor for Write. Data holds the tensor's bytes exactly,
// in ggml's layout for Type.
type WriteTensor struct {
	Name  string
	Type  Type
	Shape []int // row-major, outermost first, as Tensor.Shape
	Data  []byte
}

// TensorInfo is one tensor of a file written by a Writer: what its record
// in the header says. Its bytes follow later.
type TensorInfo struct {
	Name  string
	Type  Type
	Shape []int // row-major, outermost first, as Tensor.Shape
}

// Size returns the bytes a tensor of the info's type and shape takes.
func (t TensorInfo) Size() (int64, error) {
	ne, err := dims(t.Name, t.Shape)
	if err != nil {
		return 0, err
	}
	size, err := tensorSize(t.Type, ne, math.MaxInt64)
	if err != nil {
		return 0, fmt.Errorf("tensor %q: %w", t.Name, err)
	}
	return int64(size), nil
}

// Write writes a GGUF version 3 file: meta in the order given, then the
// tensors' records and data in the order given, each tensor's data padded to
// the alignment. The alignment is 32 unless meta sets general.alignment (a
// u32 power of two). The layout is the one llama.cpp's gguf_write_to_file
// produces, byte for byte, so the output can be read by llama.cpp (except
// for arrays of arrays, which only gguf-py reads) and by Parse. Nothing is
// written when the input is invalid. Write holds every tensor's bytes at
// once; a Writer takes them a piece at a time.
func Write(w io.Writer, meta []KV, tensors []WriteTensor) error {
	if err := write(w, meta, tensors); err != nil {
		return fmt.Errorf("gguf: write: %w", err)
	}
	return nil
}

func write(w io.Writer, meta []KV, tensors []WriteTensor) error {
	infos := make([]TensorInfo, len(tensors))
	for i, t := range tensors {
		infos[i] = TensorInfo{t.Name, t.Type, t.Shape}
	}
	hdr, sizes, align, err := header(meta, infos)
	if err != nil {
		return err
	}
	for i, t := range tensors {
		if sizes[i] != uint64(len(t.Data)) {
			return fmt.Errorf("tensor %q: shape %v of %s takes %d bytes, Data holds %d", t.Name, t.Shape, t.Type, sizes[i], len(t.Data))
		}
	}
	sw := &Writer{w: w, align: align, infos: infos, sizes: sizes}
	if err := sw.start(hdr); err != nil {
		return err
	}
	for _, t := range tensors {
		if _, err := sw.write(t.Data); err != nil {
			return err
		}
	}
	return nil
}

// Writer writes a GGUF file whose tensors' bytes come a piece at a time, so
// that a file larger than memory can be written: NewWriter writes the
// header, which holds every tensor's record (offsets follow from the types
// and shapes), then Write takes the tensors' bytes in the order the tensors
// were given, as one stream, and pads each tensor to the alignment as its
// last byte arrives. The file is the one Write would produce from the same
// bytes. Close says whether every tensor got all its bytes; it does not
// close the underlying writer.
type Writer struct {
	w      io.Writer
	align  uint64
	infos  []TensorInfo
	sizes  []uint64
	cur    int    // the tensor whose bytes Write takes next
	left   uint64 // the bytes of tensor cur still to come
	err    error  // the first error, returned from then on
	closed bool
}

// NewWriter validates meta and tensors as Write does, then writes the
// header (metadata, tensor records, padding) to w. It writes nothing when
// they are invalid.
func NewWriter(w io.Writer, meta []KV, tensors []TensorInfo) (*Writer, error) {
	infos := append([]TensorInfo(nil), tensors...)
	hdr, sizes, align, err := header(meta, infos)
	if err != nil {
		return nil, fmt.Errorf("gguf: write: %w", err)
	}
	sw := &Writer{w: w, align: align, infos: infos, sizes: sizes}
	if err := sw.start(hdr); err != nil {
		return nil, fmt.Errorf("gguf: write: %w", err)
	}
	return sw, nil
}

func (sw *Writer) start(hdr []byte) error {
	if len(sw.sizes) > 0 {
		sw.left = sw.sizes[0]
	}
	if _, err := sw.w.Write(hdr); err != nil {
		sw.err = err
		return err
	}
	return nil
}

// Write takes the next bytes of the tensors' data: the current tensor's,
// then, past its end, the next tensor's. Giving more bytes than the tensors
// take is an error.
func (sw *Writer) Write(p []byte) (int, error) {
	n, err := sw.write(p)
	if err != nil {
		return n, fmt.Errorf("gguf: write: %w", err)
	}
	return n, nil
}

func (sw *Writer) write(p []byte) (int, error) {
	if sw.err != nil {
		return 0, sw.err
	}
	if sw.closed {
		return 0, errors.New("Write after Close")
	}
	done := 0
	for len(p) > 0 {
		if sw.cur >= len(sw.sizes) {
			sw.err = fmt.Errorf("%d bytes more than the %d tensors take", len(p), len(sw.sizes))
			return done, sw.err
		}
		k := min(uint64(len(p)), sw.left)
		n, err := sw.w.Write(p[:k])
		done += n
		if err == nil && uint64(n) < k {
			err = io.ErrShortWrite
		}
		if err != nil {
			sw.err = err
			return done, err
		}
		p = p[k:]
		sw.left -= k
		if sw.left == 0 {
			if err := sw.pad(); err != nil {
				sw.err = err
				return done, err
			}
			sw.cur++
			if sw.cur < len(sw.sizes) {
				sw.left = sw.sizes[sw.cur]
			}
		}
	}
	return done, nil
}

// pad writes the zeros that align the end of the current tensor.
func (sw *Writer) pad() error {
	size := sw.sizes[sw.cur]
	n := alignUp(size, sw.align) - size
	if n == 0 {
		return nil
	}
	var z [64]byte
	for n > 0 {
		k := min(n, uint64(len(z)))
		if _, err := sw.w.Write(z[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// Tensor returns the tensor whose bytes Write takes next and how many of
// its bytes are still to come; ok is false once every tensor is complete.
func (sw *Writer) Tensor() (t TensorInfo, left int64, ok bool) {
	if sw.cur >= len(sw.infos) {
		return TensorInfo{}, 0, false
	}
	return sw.infos[sw.cur], int64(sw.left), true
}

// Close reports the first error of the writes, or that a tensor is still
// missing bytes. It does not close the underlying writer.
func (sw *Writer) Close() error {
	sw.closed = true
	switch {
	case sw.err != nil:
		return fmt.Errorf("gguf: write: %w", sw.err)
	case sw.cur < len(sw.sizes):
		return fmt.Errorf("gguf: write: tensor %q (%d of %d) is missing %d of its %d bytes", sw.infos[sw.cur].Name, sw.cur+1, len(sw.sizes), sw.left, sw.sizes[sw.cur])
	}
	return nil
}

// dims returns a row-major shape as ggml's ne[], innermost first.
func dims(name string, shape []int) ([]uint64, error) {
	ne := make([]uint64, len(shape))
	for i, d := range shape {
		if d <= 0 {
			return nil, fmt.Errorf("tensor %q: shape %v: every dimension must be positive", name, shape)
		}
		ne[len(ne)-1-i] = uint64(d)
	}
	return ne, nil
}

// header validates meta and the tensors and encodes the file's header, up
// to the data section (padding included); sizes are the tensors' bytes.
func header(meta []KV, tensors []TensorInfo) (hdr []byte, sizes []uint64, align uint64, err error) {
	align = uint64(defaultAlignment)
	keys := make(map[string]bool, len(meta))
	for _, kv := range meta {
		switch {
		case kv.Key == "":
			return nil, nil, 0, errors.New("empty key")
		case keys[kv.Key]:
			return nil, nil, 0, fmt.Errorf("key %q given twice", kv.Key)
		}
		keys[kv.Key] = true
		if err := checkValue(kv.Value, 0); err != nil {
			return nil, nil, 0, fmt.Errorf("key %q: %w", kv.Key, err)
		}
		if kv.Key == alignmentKey {
			a, ok := kv.Value.v.(uint32)
			if !ok || a == 0 || a&(a-1) != 0 {
				return nil, nil, 0, fmt.Errorf("%s must be a u32 power of two, not %s %v", alignmentKey, kv.Value.Type(), kv.Value)
			}
			align = uint64(a)
		}
	}

	var h enc
	h.raw([]byte(magic))
	h.u32(latestVersion)
	h.u64(uint64(len(tensors)))
	h.u64(uint64(len(meta)))
	for _, kv := range meta {
		h.str(kv.Key)
		h.u32(uint32(kv.Value.Type()))
		h.value(kv.Value.v)
	}

	names := make(map[string]bool, len(tensors))
	sizes = make([]uint64, len(tensors))
	var off uint64
	for i, t := range tensors {
		switch {
		case t.Name == "":
			return nil, nil, 0, errors.New("tensor with an empty name")
		case len(t.Name) > maxName:
			return nil, nil, 0, fmt.Errorf("tensor name %q is %d bytes long; ggml allows at most %d", t.Name, len(t.Name), maxName)
		case names[t.Name]:
			return nil, nil, 0, fmt.Errorf("tensor %q given twice", t.Name)
		}
		names[t.Name] = true
		ne, err := dims(t.Name, t.Shape)
		if err != nil {
			return nil, nil, 0, err
		}
		size, err := tensorSize(t.Type, ne, math.MaxInt64)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		sizes[i] = size
		h.str(t.Name)
		h.u32(uint32(len(ne)))
		for _, d := range ne {
			h.u64(d)
		}
		h.u32(uint32(t.Type))
		h.u64(off)
		off = alignUp(off+size, align)
	}
	// llama.cpp pads the data section's start even when there are no tensors.
	h.zeros(alignUp(uint64(h.Len()), align) - uint64(h.Len()))
	return h.Bytes(), sizes, align, nil
}

// checkValue rejects what GGUF cannot encode: the zero Value, and arrays of
// arrays holding scalars or nested deeper than Parse accepts. depth counts
// the arrays around v.
func checkValue(v Value, depth int) error {
	t, elem := kinds(v.v)
	switch {
	case t == typeNone:
		return errors.New("invalid (zero) Value")
	case t != TypeArray:
		return nil
	case depth+1 > maxNesting:
		return fmt.Errorf("arrays nested more than %d deep", maxNesting)
	case elem != TypeArray:
		return nil
	}
	for i, e := range v.v.([]Value) {
		if e.v == nil {
			return fmt.Errorf("element %d of an array of arrays is invalid (zero)", i)
		}
		if e.Type() != TypeArray {
			return fmt.Errorf("element %d of an array of arrays is a %s, not an array", i, e.Type())
		}
		if err := checkValue(e, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// enc builds the header in memory: it is small (metadata and tensor
// records), and building it first lets Write fail before writing anything.
type enc struct{ bytes.Buffer }

func (e *enc) raw(b []byte) { e.Write(b) }
func (e *enc) u8(v uint8)   { e.WriteByte(v) }

func (e *enc) u16(v uint16) {
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], v)
	e.Write(b[:])
}

func (e *enc) u32(v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	e.Write(b[:])
}

func (e *enc) u64(v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	e.Write(b[:])
}

func (e *enc) str(s string) {
	e.u64(uint64(len(s)))
	e.WriteString(s)
}

func (e *enc) zeros(n uint64) {
	var z [4096]byte
	for n > 0 {
		k := min(n, uint64(len(z)))
		e.Write(z[:k])
		n -= k
	}
}

func (e *enc) bool(b bool) {
	if b {
		e.u8(1)
	} else {
		e.u8(0)
	}
}

// value writes a value without its type tag; an array writes its element
// type and length before the elements (which is also how an element of an
// array of arrays is written).
func (e *enc) value(x any) {
	switch x := x.(type) {
	case uint8:
		e.u8(x)
	case int8:
		e.u8(uint8(x))
	case uint16:
		e.u16(x)
	case int16:
		e.u16(uint16(x))
	case uint32:
		e.u32(x)
	case int32:
		e.u32(uint32(x))
	case float32:
		e.u32(math.Float32bits(x))
	case bool:
		e.bool(x)
	case string:
		e.str(x)
	case uint64:
		e.u64(x)
	case int64:
		e.u64(uint64(x))
	case float64:
		e.u64(math.Float64bits(x))
	default:
		_, elem := kinds(x)
		e.u32(uint32(elem))
		switch x := x.(type) {
		case []uint8:
			array(e, x)
		case []int8:
			array(e, x)
		case []uint16:
			array(e, x)
		case []int16:
			array(e, x)
		case []uint32:
			array(e, x)
		case []int32:
			array(e, x)
		case []float32:
			array(e, x)
		case []bool:
			array(e, x)
		case []string:
			array(e, x)
		case []uint64:
			array(e, x)
		case []int64:
			array(e, x)
		case []float64:
			array(e, x)
		case []Value:
			e.u64(uint64(len(x)))
			for _, v := range x {
				e.value(v.v)
			}
		}
	}
}

func array[T Scalar](e *enc, xs []T) {
	e.u64(uint64(len(xs)))
	for _, x := range xs {
		e.value(x)
	}
}
