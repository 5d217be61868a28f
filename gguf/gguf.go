// Package gguf reads and writes GGUF files, llama.cpp's model format:
// versions 2 and 3, little-endian, memory-mapped read-only or parsed from
// bytes.
//
// A file is the magic "GGUF", a uint32 version, uint64 counts of tensors and
// of metadata pairs, the metadata (key, type tag, value), one info record per
// tensor (name, dimensions innermost first, ggml type, offset into the data
// section), padding to the alignment (general.alignment, default 32), and the
// data section. Version 2 and 3 share this layout; 3 only allowed big-endian
// files, which are rejected here. Parse validates all of it before handing out
// a byte: every count against the bytes left (so a corrupt count cannot make
// it allocate), every type tag, every shape against its type's block size,
// every offset against the alignment and the file, and the uniqueness of keys
// and tensor names.
package gguf

import (
	"fmt"
	"io"
	"os"
	"strconv"
)

// Type is a ggml tensor type, numbered as in ggml.h (enum ggml_type) and as
// stored in the file.
type Type uint32

// The ggml tensor types. The gaps (4, 5, 31-33, 36-38) are types ggml has
// removed; files using them are rejected.
const (
	F32     Type = 0
	F16     Type = 1
	Q4_0    Type = 2
	Q4_1    Type = 3
	Q5_0    Type = 6
	Q5_1    Type = 7
	Q8_0    Type = 8
	Q8_1    Type = 9
	Q2_K    Type = 10
	Q3_K    Type = 11
	Q4_K    Type = 12
	Q5_K    Type = 13
	Q6_K    Type = 14
	Q8_K    Type = 15
	IQ2_XXS Type = 16
	IQ2_XS  Type = 17
	IQ3_XXS Type = 18
	IQ1_S   Type = 19
	IQ4_NL  Type = 20
	IQ3_S   Type = 21
	IQ2_S   Type = 22
	IQ4_XS  Type = 23
	I8      Type = 24
	I16     Type = 25
	I32     Type = 26
	I64     Type = 27
	F64     Type = 28
	IQ1_M   Type = 29
	BF16    Type = 30
	TQ1_0   Type = 34
	TQ2_0   Type = 35
	MXFP4   Type = 39
	NVFP4   Type = 40
	Q1_0    Type = 41
	Q2_0    Type = 42
)

// typeInfo is one row of ggml's type_traits: a block of elems elements takes
// bytes bytes (non-quantized types are blocks of one element). removed marks
// numbers ggml once used and dropped, named so that errors can say so.
type typeInfo struct {
	name         string
	elems, bytes int
	removed      bool
}

// qk is QK_K, the super-block of the k-quants and most i-quants.
const qk = 256

// types follows ggml.c's type_traits and ggml-common.h's block structs; the
// byte counts are written as sums of the struct fields so they can be checked
// against the C side by eye (testdata/ggml_types.txt checks them by machine).
var types = [...]typeInfo{
	F32:     {"F32", 1, 4, false},
	F16:     {"F16", 1, 2, false},
	Q4_0:    {"Q4_0", 32, 2 + 16, false},
	Q4_1:    {"Q4_1", 32, 2 + 2 + 16, false},
	4:       {"Q4_2", 0, 0, true},
	5:       {"Q4_3", 0, 0, true},
	Q5_0:    {"Q5_0", 32, 2 + 4 + 16, false},
	Q5_1:    {"Q5_1", 32, 2 + 2 + 4 + 16, false},
	Q8_0:    {"Q8_0", 32, 2 + 32, false},
	Q8_1:    {"Q8_1", 32, 2 + 2 + 32, false},
	Q2_K:    {"Q2_K", qk, 2 + 2 + qk/16 + qk/4, false},
	Q3_K:    {"Q3_K", qk, 2 + qk/4 + qk/8 + 12, false},
	Q4_K:    {"Q4_K", qk, 2 + 2 + 12 + qk/2, false},
	Q5_K:    {"Q5_K", qk, 2 + 2 + 12 + qk/2 + qk/8, false},
	Q6_K:    {"Q6_K", qk, 2 + qk/16 + 3*qk/4, false},
	Q8_K:    {"Q8_K", qk, 4 + qk + qk/16*2, false},
	IQ2_XXS: {"IQ2_XXS", qk, 2 + qk/8*2, false},
	IQ2_XS:  {"IQ2_XS", qk, 2 + qk/8*2 + qk/32, false},
	IQ3_XXS: {"IQ3_XXS", qk, 2 + 3*(qk/8), false},
	IQ1_S:   {"IQ1_S", qk, 2 + qk/8 + qk/16, false},
	IQ4_NL:  {"IQ4_NL", 32, 2 + 16, false},
	IQ3_S:   {"IQ3_S", qk, 2 + 13*(qk/32) + qk/64, false},
	IQ2_S:   {"IQ2_S", qk, 2 + qk/4 + qk/16, false},
	IQ4_XS:  {"IQ4_XS", qk, 2 + 2 + qk/64 + qk/2, false},
	I8:      {"I8", 1, 1, false},
	I16:     {"I16", 1, 2, false},
	I32:     {"I32", 1, 4, false},
	I64:     {"I64", 1, 8, false},
	F64:     {"F64", 1, 8, false},
	IQ1_M:   {"IQ1_M", qk, qk/8 + qk/16 + qk/32, false},
	BF16:    {"BF16", 1, 2, false},
	31:      {"Q4_0_4_4", 0, 0, true},
	32:      {"Q4_0_4_8", 0, 0, true},
	33:      {"Q4_0_8_8", 0, 0, true},
	TQ1_0:   {"TQ1_0", qk, 2 + qk/64 + (qk-4*qk/64)/5, false},
	TQ2_0:   {"TQ2_0", qk, 2 + qk/4, false},
	36:      {"IQ4_NL_4_4", 0, 0, true},
	37:      {"IQ4_NL_4_8", 0, 0, true},
	38:      {"IQ4_NL_8_8", 0, 0, true},
	MXFP4:   {"MXFP4", 32, 1 + 16, false},
	NVFP4:   {"NVFP4", 64, 4 + 32, false},
	Q1_0:    {"Q1_0", 128, 2 + 128/8, false},
	Q2_0:    {"Q2_0", 64, 2 + 64/4, false},
}

// String returns the type's name as ggml.h spells it ("Q4_K", "BF16"), or
// "Type(n)" for a number ggml never defined.
func (t Type) String() string {
	if int(t) < len(types) && types[t].name != "" {
		return types[t].name
	}
	return "Type(" + strconv.FormatUint(uint64(t), 10) + ")"
}

// Block returns how many elements one block of the type holds and how many
// bytes it takes; 0, 0 for an unknown or removed type.
func (t Type) Block() (elems, bytes int) {
	if int(t) < len(types) {
		return types[t].elems, types[t].bytes
	}
	return 0, 0
}

// check says why a tensor of the type cannot be read, if it cannot.
func (t Type) check() error {
	switch {
	case int(t) < len(types) && types[t].removed:
		return fmt.Errorf("type %s (%d) has been removed from ggml; convert the model again", t, uint32(t))
	case int(t) >= len(types) || types[t].elems == 0:
		return fmt.Errorf("unknown ggml type %d", uint32(t))
	}
	return nil
}

// Tensor is one tensor of a file. Data aliases the file's bytes (a read-only
// mapping when the file was opened with Open): never write to it, and never
// use it after the File is closed.
type Tensor struct {
	Name string
	Type Type
	// Shape is row-major, outermost dimension first, as safetensors and
	// PyTorch write it: GGUF stores ggml's ne[], innermost first, so a
	// [rows, cols] weight arrives as ne = {cols, rows} and is reversed here.
	Shape  []int
	Offset int64 // absolute offset of Data in the file
	Data   []byte
}

// Numel returns the number of elements.
func (t *Tensor) Numel() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// File is one parsed GGUF file.
type File struct {
	Name       string // the path, or the name given to Parse; used in errors
	Version    uint32 // 2 or 3
	Alignment  int    // of the data section and of each tensor's offset in it
	DataOffset int64  // where the data section starts in the file

	// KV is the metadata in file order; Meta indexes the same values by key.
	KV   []KV
	Meta map[string]Value

	Tensors []*Tensor // in file order

	tensors map[string]*Tensor
	unmap   func() error
}

// Tensor returns the named tensor.
func (f *File) Tensor(name string) (*Tensor, bool) {
	t, ok := f.tensors[name]
	return t, ok
}

// Close releases the file's mapping, if any; its tensors' Data must no longer
// be used. The metadata is copied out of the mapping and stays valid.
func (f *File) Close() error {
	if f.unmap == nil {
		return nil
	}
	err := f.unmap()
	f.unmap = nil
	return err
}

// Value returns the metadata value under key.
func (f *File) Value(key string) (Value, bool) {
	v, ok := f.Meta[key]
	return v, ok
}

// The typed accessors below return false when the key is missing or its value
// does not convert (see the Value methods of the same name with an As prefix).

// String returns a string value.
func (f *File) String(key string) (string, bool) { return f.Meta[key].AsString() }

// Uint returns an integer value of any integer type that is not negative.
func (f *File) Uint(key string) (uint64, bool) { return f.Meta[key].AsUint() }

// Int returns an integer value of any integer type that fits an int64.
func (f *File) Int(key string) (int64, bool) { return f.Meta[key].AsInt() }

// Float returns a float value, or an integer one converted.
func (f *File) Float(key string) (float64, bool) { return f.Meta[key].AsFloat() }

// Bool returns a bool value.
func (f *File) Bool(key string) (bool, bool) { return f.Meta[key].AsBool() }

// Strings returns an array of strings.
func (f *File) Strings(key string) ([]string, bool) { return f.Meta[key].AsStrings() }

// Ints returns an array of any integer type whose elements all fit an int64.
func (f *File) Ints(key string) ([]int64, bool) { return f.Meta[key].AsInts() }

// Floats returns an array of floats, or of integers converted.
func (f *File) Floats(key string) ([]float64, bool) { return f.Meta[key].AsFloats() }

// Architecture returns general.architecture ("llama", "qwen3", ...), the
// prefix of the model's own keys; "" when the file has none.
func (f *File) Architecture() string {
	s, _ := f.String("general.architecture")
	return s
}

// fileTypes are the names of llama.cpp's LLAMA_FTYPE values, which a
// file's general.file_type gives: the quantization it was made with.
var fileTypes = map[uint64]string{
	0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
	11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
	19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S",
	27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
	38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
}

// FileType returns the name of the quantization the file was made with
// (general.file_type: "Q4_K_M", "Q8_0", "BF16"), or "" when it does not
// say.
func (f *File) FileType() string {
	ft, ok := f.Uint("general.file_type")
	if !ok {
		return ""
	}
	return fileTypes[ft]
}

// IsGGUF reports whether the file at path starts with GGUF's magic: Ollama
// stores its models as blobs/sha256-HEX, with no extension.
func IsGGUF(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, len(magic))
	_, err = io.ReadFull(f, b)
	return err == nil && string(b) == magic
}
