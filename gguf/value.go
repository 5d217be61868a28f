package gguf

import (
	"math"
	"reflect"
	"strconv"
	"strings"
)

// ValueType is a metadata value's type tag, numbered as gguf.h's gguf_type.
type ValueType uint32

// The metadata value types.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12

	typeNone ValueType = math.MaxUint32 // the zero Value's
)

// valueTypeNames are gguf.cpp's names for the types, so messages read alike.
var valueTypeNames = [...]string{"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64"}

// String returns the type's short name: "u8", "str", "arr", ...
func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return "ValueType(" + strconv.FormatUint(uint64(t), 10) + ")"
}

// size is the encoded size of a fixed-size type, 0 for strings and arrays.
func (t ValueType) size() int {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// Scalar is the Go types of GGUF's scalar values.
type Scalar interface {
	uint8 | int8 | uint16 | int16 | uint32 | int32 | float32 | bool | string | uint64 | int64 | float64
}

// Value is one metadata value: a scalar, an array of scalars, or an array of
// arrays. It holds the plain Go value (Any), typed exactly as the file's tag
// says, because GGUF readers are strict about types (general.alignment must
// be a u32) and a round trip must keep them. The zero Value is invalid.
type Value struct{ v any }

// Val returns a scalar value: Val(uint32(32)), Val("qwen3").
func Val[T Scalar](x T) Value { return Value{x} }

// Arr returns an array value: Arr([]string{...}), or, for an array of arrays,
// Arr([]Value{Arr(...), ...}). It keeps xs: do not change it afterwards.
func Arr[T Scalar | Value](xs []T) Value { return Value{xs} }

// Any returns the Go value: one of the Scalar types, a slice of one, or
// []Value for an array of arrays. Slices are shared: do not change them.
func (v Value) Any() any { return v.v }

// Type returns the value's type tag (TypeArray for arrays).
func (v Value) Type() ValueType {
	t, _ := kinds(v.v)
	return t
}

// Elem returns an array's element type (TypeArray for an array of arrays).
func (v Value) Elem() ValueType {
	_, e := kinds(v.v)
	return e
}

// Len returns an array's length, 0 for a scalar.
func (v Value) Len() int {
	if v.Type() != TypeArray {
		return 0
	}
	return reflect.ValueOf(v.v).Len()
}

// kinds maps a Go value to its type tag and, for arrays, its element tag.
func kinds(x any) (t, elem ValueType) {
	switch x.(type) {
	case uint8:
		return TypeUint8, typeNone
	case int8:
		return TypeInt8, typeNone
	case uint16:
		return TypeUint16, typeNone
	case int16:
		return TypeInt16, typeNone
	case uint32:
		return TypeUint32, typeNone
	case int32:
		return TypeInt32, typeNone
	case float32:
		return TypeFloat32, typeNone
	case bool:
		return TypeBool, typeNone
	case string:
		return TypeString, typeNone
	case uint64:
		return TypeUint64, typeNone
	case int64:
		return TypeInt64, typeNone
	case float64:
		return TypeFloat64, typeNone
	case []uint8:
		return TypeArray, TypeUint8
	case []int8:
		return TypeArray, TypeInt8
	case []uint16:
		return TypeArray, TypeUint16
	case []int16:
		return TypeArray, TypeInt16
	case []uint32:
		return TypeArray, TypeUint32
	case []int32:
		return TypeArray, TypeInt32
	case []float32:
		return TypeArray, TypeFloat32
	case []bool:
		return TypeArray, TypeBool
	case []string:
		return TypeArray, TypeString
	case []uint64:
		return TypeArray, TypeUint64
	case []int64:
		return TypeArray, TypeInt64
	case []float64:
		return TypeArray, TypeFloat64
	case []Value:
		return TypeArray, TypeArray
	}
	return typeNone, typeNone
}

// AsString returns a string value.
func (v Value) AsString() (string, bool) {
	s, ok := v.v.(string)
	return s, ok
}

// AsBool returns a bool value.
func (v Value) AsBool() (bool, bool) {
	b, ok := v.v.(bool)
	return b, ok
}

// AsUint returns a value of any integer type that is not negative: model
// configs are written with whichever width the converter chose (u32 here,
// i32 there), and callers want the number.
func (v Value) AsUint() (uint64, bool) { return toUint(v.v) }

// AsInt returns a value of any integer type that fits an int64.
func (v Value) AsInt() (int64, bool) { return toInt(v.v) }

// AsFloat returns a float value, or an integer value converted (a converter
// may write rope_freq_base = 1000000 as an integer).
func (v Value) AsFloat() (float64, bool) { return toFloat(v.v) }

// AsStrings returns an array of strings.
func (v Value) AsStrings() ([]string, bool) {
	s, ok := v.v.([]string)
	return s, ok
}

// AsInts returns an array of any integer type whose elements all fit an
// int64, as a new slice.
func (v Value) AsInts() ([]int64, bool) {
	switch x := v.v.(type) {
	case []uint8:
		return convert(x, toInt)
	case []int8:
		return convert(x, toInt)
	case []uint16:
		return convert(x, toInt)
	case []int16:
		return convert(x, toInt)
	case []uint32:
		return convert(x, toInt)
	case []int32:
		return convert(x, toInt)
	case []uint64:
		return convert(x, toInt)
	case []int64:
		return convert(x, toInt)
	}
	return nil, false
}

// AsFloats returns an array of floats, or of integers converted, as a new
// slice.
func (v Value) AsFloats() ([]float64, bool) {
	switch x := v.v.(type) {
	case []float32:
		return convert(x, toFloat)
	case []float64:
		return convert(x, toFloat)
	case []uint8:
		return convert(x, toFloat)
	case []int8:
		return convert(x, toFloat)
	case []uint16:
		return convert(x, toFloat)
	case []int16:
		return convert(x, toFloat)
	case []uint32:
		return convert(x, toFloat)
	case []int32:
		return convert(x, toFloat)
	case []uint64:
		return convert(x, toFloat)
	case []int64:
		return convert(x, toFloat)
	}
	return nil, false
}

func convert[T, U any](xs []T, f func(any) (U, bool)) ([]U, bool) {
	out := make([]U, len(xs))
	for i, x := range xs {
		u, ok := f(x)
		if !ok {
			return nil, false
		}
		out[i] = u
	}
	return out, true
}

func toUint(x any) (uint64, bool) {
	switch x := x.(type) {
	case uint8:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case uint32:
		return uint64(x), true
	case uint64:
		return x, true
	}
	if i, ok := toInt(x); ok && i >= 0 {
		return uint64(i), true
	}
	return 0, false
}

func toInt(x any) (int64, bool) {
	switch x := x.(type) {
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x), true
		}
	}
	return 0, false
}

func toFloat(x any) (float64, bool) {
	switch x := x.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	if i, ok := toInt(x); ok {
		return float64(i), true
	}
	if u, ok := toUint(x); ok {
		return float64(u), true
	}
	return 0, false
}

// String formats the value for people: strings quoted, arrays shortened to
// their first few elements. It is not the string value; that is AsString.
func (v Value) String() string {
	var b strings.Builder
	format(&b, v.v)
	return b.String()
}

// maxShown is how many elements of an array String prints.
const maxShown = 8

func format(b *strings.Builder, x any) {
	switch x := x.(type) {
	case nil:
		b.WriteString("<invalid>")
	case string:
		b.WriteString(strconv.Quote(x))
	case float32:
		b.WriteString(strconv.FormatFloat(float64(x), 'g', -1, 32))
	case float64:
		b.WriteString(strconv.FormatFloat(x, 'g', -1, 64))
	case bool:
		b.WriteString(strconv.FormatBool(x))
	case Value:
		format(b, x.v)
	default:
		if i, ok := toInt(x); ok {
			b.WriteString(strconv.FormatInt(i, 10))
			return
		}
		if u, ok := toUint(x); ok {
			b.WriteString(strconv.FormatUint(u, 10))
			return
		}
		rv := reflect.ValueOf(x)
		if rv.Kind() != reflect.Slice {
			b.WriteString("<invalid>")
			return
		}
		b.WriteByte('[')
		for i := 0; i < rv.Len() && i < maxShown; i++ {
			if i > 0 {
				b.WriteString(", ")
			}
			format(b, rv.Index(i).Interface())
		}
		if rv.Len() > maxShown {
			b.WriteString(", ... " + strconv.Itoa(rv.Len()) + " in all")
		}
		b.WriteByte(']')
	}
}
