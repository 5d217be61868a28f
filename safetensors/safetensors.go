// Package safetensors reads Hugging Face safetensors checkpoints: single
// files and sharded sets (model.safetensors.index.json), memory-mapped
// read-only or parsed from bytes (for models embedded with go:embed).
//
// A file is an 8-byte little-endian header length N, N bytes of JSON mapping
// each tensor name to its dtype, shape and [begin, end) byte range in the data
// section that follows, and the data section. Parse validates all of it:
// every tensor's range lies inside the data, no two ranges overlap, each
// range's size is shape x dtype size, names are unique and dtypes known.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sort"
)

// maxHeader bounds the JSON header; real checkpoints stay far below it, and a
// corrupt length must not make the parser allocate gigabytes.
const maxHeader = 100 << 20

// dtypeSizes are the element sizes of the dtypes the format defines.
var dtypeSizes = map[string]int{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// Tensor is one tensor of a file. Data aliases the file's bytes (a read-only
// mapping when the file was opened with Open): never write to it.
type Tensor struct {
	Name  string
	DType string // as the file says: "BF16", "F16", "F32", ...
	Shape []int
	Data  []byte
	File  string // the file it came from, for error messages
}

// Numel returns the number of elements.
func (t *Tensor) Numel() int {
	n := 1
	for _, d := range t.Shape {
		n *= d
	}
	return n
}

// File is one parsed safetensors file.
type File struct {
	Name     string
	Metadata map[string]string
	tensors  map[string]*Tensor
	names    []string // in data order
	unmap    func() error
}

// Names returns the tensor names in the order of their data.
func (f *File) Names() []string { return f.names }

// Tensor returns the named tensor.
func (f *File) Tensor(name string) (*Tensor, bool) {
	t, ok := f.tensors[name]
	return t, ok
}

// Close releases the file's mapping, if any; its tensors' Data must no
// longer be used.
func (f *File) Close() error {
	if f.unmap == nil {
		return nil
	}
	err := f.unmap()
	f.unmap = nil
	return err
}

type entry struct {
	DType   string   `json:"dtype"`
	Shape   []int64  `json:"shape"`
	Offsets []uint64 `json:"data_offsets"`
}

// Parse parses a whole safetensors file held in data; name is used in
// errors and in each Tensor's File. The tensors alias data.
func Parse(name string, data []byte) (*File, error) {
	f, err := parse(name, data)
	if err != nil {
		return nil, fmt.Errorf("safetensors %s: %w", name, err)
	}
	return f, nil
}

func parse(name string, data []byte) (*File, error) {
	if len(data) < 8 {
		return nil, fmt.Errorf("truncated file: %d bytes, the header length alone takes 8", len(data))
	}
	n := binary.LittleEndian.Uint64(data)
	if n > uint64(len(data)-8) {
		return nil, fmt.Errorf("header length %d goes beyond the file (%d bytes): truncated or not safetensors", n, len(data))
	}
	if n > maxHeader {
		return nil, fmt.Errorf("header length %d exceeds the %d-byte limit", n, maxHeader)
	}
	header, body := data[8:8+n], data[8+n:]
	entries, meta, err := decodeHeader(header)
	if err != nil {
		return nil, err
	}
	f := &File{Name: name, Metadata: meta, tensors: make(map[string]*Tensor, len(entries))}
	type span struct {
		begin, end uint64
		name       string
	}
	spans := make([]span, 0, len(entries))
	for _, kv := range entries {
		e := kv.e
		size, ok := dtypeSizes[e.DType]
		if !ok {
			return nil, fmt.Errorf("tensor %q: unknown dtype %q", kv.name, e.DType)
		}
		if len(e.Offsets) != 2 {
			return nil, fmt.Errorf("tensor %q: data_offsets has %d values, want 2", kv.name, len(e.Offsets))
		}
		begin, end := e.Offsets[0], e.Offsets[1]
		if begin > end || end > uint64(len(body)) {
			return nil, fmt.Errorf("tensor %q: data_offsets [%d, %d) outside the %d-byte data section", kv.name, begin, end, len(body))
		}
		shape := make([]int, len(e.Shape))
		numel := uint64(1)
		for i, d := range e.Shape {
			if d < 0 {
				return nil, fmt.Errorf("tensor %q: negative dimension in shape %v", kv.name, e.Shape)
			}
			hi, lo := bits.Mul64(numel, uint64(d))
			if hi != 0 || lo > math.MaxInt32*uint64(1<<20) {
				return nil, fmt.Errorf("tensor %q: shape %v is too large", kv.name, e.Shape)
			}
			numel = lo
			shape[i] = int(d)
		}
		if want := numel * uint64(size); want != end-begin {
			return nil, fmt.Errorf("tensor %q: shape %v of %s needs %d bytes, data_offsets [%d, %d) hold %d",
				kv.name, e.Shape, e.DType, want, begin, end, end-begin)
		}
		f.tensors[kv.name] = &Tensor{Name: kv.name, DType: e.DType, Shape: shape, Data: body[begin:end:end], File: name}
		spans = append(spans, span{begin, end, kv.name})
	}
	sort.Slice(spans, func(i, j int) bool {
		if spans[i].begin != spans[j].begin {
			return spans[i].begin < spans[j].begin
		}
		return spans[i].end < spans[j].end
	})
	// Each span is compared with the one that reaches furthest before it:
	// with the previous one only, an empty tensor inside a span (it
	// occupies no bytes and overlaps nothing) hid the spans it sits in.
	var last *span
	for i := range spans {
		s := &spans[i]
		if s.begin == s.end {
			continue
		}
		if last != nil && s.begin < last.end {
			return nil, fmt.Errorf("tensors %q [%d, %d) and %q [%d, %d) overlap",
				last.name, last.begin, last.end, s.name, s.begin, s.end)
		}
		if last == nil || s.end > last.end {
			last = s
		}
	}
	for _, s := range spans {
		f.names = append(f.names, s.name)
	}
	return f, nil
}

type namedEntry struct {
	name string
	e    entry
}

// decodeHeader walks the header object token by token, because
// encoding/json's map decoding would silently keep the last of two entries
// with the same name.
func decodeHeader(header []byte) ([]namedEntry, map[string]string, error) {
	dec := json.NewDecoder(bytes.NewReader(header))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return nil, nil, fmt.Errorf("header is not JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, nil, errors.New("header is not a JSON object")
	}
	var entries []namedEntry
	var meta map[string]string
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, fmt.Errorf("header: %w", err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, nil, fmt.Errorf("header: key %v is not a string", tok)
		}
		if seen[name] {
			return nil, nil, fmt.Errorf("header names %q twice", name)
		}
		seen[name] = true
		if name == "__metadata__" {
			if err := dec.Decode(&meta); err != nil {
				return nil, nil, fmt.Errorf("header: __metadata__ must map strings to strings: %w", err)
			}
			continue
		}
		var e entry
		if err := dec.Decode(&e); err != nil {
			return nil, nil, fmt.Errorf("header: tensor %q: %w", name, err)
		}
		entries = append(entries, namedEntry{name, e})
	}
	if _, err := dec.Token(); err != nil {
		return nil, nil, fmt.Errorf("header: %w", err)
	}
	// Anything but padding spaces after the object is corruption.
	if rest := bytes.TrimRight(header[dec.InputOffset():], " \x00\t\r\n"); len(rest) > 0 {
		return nil, nil, fmt.Errorf("header: %d unexpected bytes after the JSON object", len(rest))
	}
	return entries, meta, nil
}
