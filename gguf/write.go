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

// Write writes a GGUF version 3 file: meta in the order given, then the
// tensors' records and data in the order given, each tensor's data padded to
// the alignment. The alignment is 32 unless meta sets general.alignment (a
// u32 power of two). The layout is the one llama.cpp's gguf_write_to_file
// produces, byte for byte, so the output can be read by llama.cpp (except
// for arrays of arrays, which only gguf-py reads) and by Parse.
func Write(w io.Writer, meta []KV, tensors []WriteTensor) error {
	if err := write(w, meta, tensors); err != nil {
		return fmt.Errorf("gguf: write: %w", err)
	}
	return nil
}

func write(w io.Writer, meta []KV, tensors []WriteTensor) error {
	align := uint64(defaultAlignment)
	keys := make(map[string]bool, len(meta))
	for _, kv := range meta {
		switch {
		case kv.Key == "":
			return errors.New("empty key")
		case keys[kv.Key]:
			return fmt.Errorf("key %q given twice", kv.Key)
		}
		keys[kv.Key] = true
		if err := checkValue(kv.Value, 0); err != nil {
			return fmt.Errorf("key %q: %w", kv.Key, err)
		}
		if kv.Key == alignmentKey {
			a, ok := kv.Value.v.(uint32)
			if !ok || a == 0 || a&(a-1) != 0 {
				return fmt.Errorf("%s must be a u32 power of two, not %s %v", alignmentKey, kv.Value.Type(), kv.Value)
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
	var off uint64
	for _, t := range tensors {
		switch {
		case t.Name == "":
			return errors.New("tensor with an empty name")
		case len(t.Name) > maxName:
			return fmt.Errorf("tensor name %q is %d bytes long; ggml allows at most %d", t.Name, len(t.Name), maxName)
		case names[t.Name]:
			return fmt.Errorf("tensor %q given twice", t.Name)
		}
		names[t.Name] = true
		ne := make([]uint64, len(t.Shape))
		for i, d := range t.Shape {
			if d <= 0 {
				return fmt.Errorf("tensor %q: shape %v: every dimension must be positive", t.Name, t.Shape)
			}
			ne[len(ne)-1-i] = uint64(d)
		}
		size, err := tensorSize(t.Type, ne, math.MaxInt64)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		if size != uint64(len(t.Data)) {
			return fmt.Errorf("tensor %q: shape %v of %s takes %d bytes, Data holds %d", t.Name, t.Shape, t.Type, size, len(t.Data))
		}
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
	if _, err := w.Write(h.Bytes()); err != nil {
		return err
	}
	var pad enc
	for _, t := range tensors {
		if _, err := w.Write(t.Data); err != nil {
			return err
		}
		pad.Reset()
		pad.zeros(alignUp(uint64(len(t.Data)), align) - uint64(len(t.Data)))
		if _, err := w.Write(pad.Bytes()); err != nil {
			return err
		}
	}
	return nil
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
