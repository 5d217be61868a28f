package gguf

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// pattern fills n bytes the way testdata/mkfixture.c fills its tensors.
func pattern(name string, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + int(name[0]))
	}
	return b
}

// tensorOf builds a WriteTensor of the right size for its shape and type.
func tensorOf(name string, t Type, shape ...int) WriteTensor {
	elems, bsize := t.Block()
	n := 1
	for _, d := range shape {
		n *= d
	}
	return WriteTensor{name, t, shape, pattern(name, n/elems*bsize)}
}

// sample is metadata of every type (arrays of arrays included) and tensors
// of several types and ranks.
func sample() ([]KV, []WriteTensor) {
	meta := []KV{
		{"general.architecture", Val("qwen3")},
		{"s.u8", Val(uint8(200))},
		{"s.i8", Val(int8(-100))},
		{"s.u16", Val(uint16(60000))},
		{"s.i16", Val(int16(-30000))},
		{"s.u32", Val(uint32(4000000000))},
		{"s.i32", Val(int32(-2000000000))},
		{"s.f32", Val(float32(0.15625))},
		{"s.bool", Val(true)},
		{"s.str", Val("héllo\x00world")},
		{"s.u64", Val(uint64(math.MaxUint64))},
		{"s.i64", Val(int64(math.MinInt64))},
		{"s.f64", Val(-2.5e-300)},
		{"a.u8", Arr([]uint8{1, 2, 255})},
		{"a.i8", Arr([]int8{-1, 0, 127})},
		{"a.u16", Arr([]uint16{1, 65535})},
		{"a.i16", Arr([]int16{-32768, 32767})},
		{"a.u32", Arr([]uint32{7, math.MaxUint32})},
		{"a.i32", Arr([]int32{-7, math.MaxInt32})},
		{"a.f32", Arr([]float32{1.5, -3e38})},
		{"a.bool", Arr([]bool{true, false, true})},
		{"a.str", Arr([]string{"a", "", "<|im_start|>", "Ġthe"})},
		{"a.u64", Arr([]uint64{math.MaxUint64, 0})},
		{"a.i64", Arr([]int64{-1, math.MaxInt64})},
		{"a.f64", Arr([]float64{math.Pi, -1e300})},
		{"a.empty", Arr([]int32{})},
		{"a.nested", Arr([]Value{
			Arr([]int32{1, 2}),
			Arr([]string{"x"}),
			Arr([]Value{Arr([]uint8{9})}),
			Arr([]Value{}),
		})},
	}
	tensors := []WriteTensor{
		tensorOf("f32", F32, 2, 3),
		tensorOf("f16", F16, 4),
		tensorOf("bf16", BF16, 2, 2, 2),
		tensorOf("q8_0", Q8_0, 2, 64),
		tensorOf("q4_k", Q4_K, 256),
		tensorOf("q6_k", Q6_K, 2, 256),
		tensorOf("mxfp4", MXFP4, 3, 32),
		tensorOf("i8", I8, 1, 1, 1, 5),
		tensorOf("q4_0", Q4_0, 32),
	}
	return meta, tensors
}

func written(t testing.TB, meta []KV, tensors []WriteTensor) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := Write(&b, meta, tensors); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func sampleFile(t testing.TB) []byte {
	meta, tensors := sample()
	return written(t, meta, tensors)
}

func TestRoundTrip(t *testing.T) {
	meta, tensors := sample()
	data := written(t, meta, tensors)
	f, err := Parse("x.gguf", data)
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != 3 || f.Alignment != 32 || f.DataOffset%32 != 0 || f.Name != "x.gguf" {
		t.Fatalf("version %d alignment %d data offset %d name %q", f.Version, f.Alignment, f.DataOffset, f.Name)
	}
	if !reflect.DeepEqual(f.KV, meta) {
		t.Fatalf("metadata\n got %v\nwant %v", f.KV, meta)
	}
	if len(f.Meta) != len(meta) {
		t.Fatalf("Meta has %d keys, want %d", len(f.Meta), len(meta))
	}
	for _, kv := range meta {
		if got := f.Meta[kv.Key]; !reflect.DeepEqual(got, kv.Value) || got.Type() != kv.Value.Type() || got.Elem() != kv.Value.Elem() {
			t.Errorf("Meta[%q] = %v (%s of %s), want %v", kv.Key, got, got.Type(), got.Elem(), kv.Value)
		}
	}
	if len(f.Tensors) != len(tensors) {
		t.Fatalf("%d tensors, want %d", len(f.Tensors), len(tensors))
	}
	for i, want := range tensors {
		got := f.Tensors[i]
		if byName, ok := f.Tensor(want.Name); !ok || byName != got {
			t.Errorf("Tensor(%q) = %v, %v", want.Name, byName, ok)
		}
		if got.Name != want.Name || got.Type != want.Type || !reflect.DeepEqual(got.Shape, want.Shape) || !bytes.Equal(got.Data, want.Data) {
			t.Errorf("tensor %d: got %s %s %v (%d bytes), want %s %s %v (%d bytes)",
				i, got.Name, got.Type, got.Shape, len(got.Data), want.Name, want.Type, want.Shape, len(want.Data))
		}
		if got.Offset%32 != 0 || (got.Offset-f.DataOffset)%32 != 0 || !bytes.Equal(data[got.Offset:int(got.Offset)+len(got.Data)], want.Data) {
			t.Errorf("tensor %q at offset %d", got.Name, got.Offset)
		}
	}
	if _, ok := f.Tensor("missing"); ok {
		t.Error("Tensor(missing) found")
	}
	if again := written(t, f.KV, writeTensors(f)); !bytes.Equal(again, data) {
		t.Error("writing the parsed file again gives other bytes")
	}
}

// writeTensors turns a parsed file's tensors back into Write's input.
func writeTensors(f *File) []WriteTensor {
	var w []WriteTensor
	for _, t := range f.Tensors {
		w = append(w, WriteTensor{t.Name, t.Type, t.Shape, t.Data})
	}
	return w
}

func TestAccessors(t *testing.T) {
	meta, _ := sample()
	meta = append(meta,
		KV{"neg", Val(int32(-5))},
		KV{"big", Val(uint64(math.MaxUint64))},
		KV{"intfloat", Val(uint32(1000000))},
		KV{"ints.big", Arr([]uint64{1, math.MaxUint64})},
	)
	f, err := Parse("x", written(t, meta, nil))
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, got, want any, ok bool) {
		t.Helper()
		if !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %v, %v; want %v, true", what, got, ok, want)
		}
	}
	not := func(what string, ok bool) {
		t.Helper()
		if ok {
			t.Errorf("%s: ok, want not", what)
		}
	}
	if f.Architecture() != "qwen3" {
		t.Errorf("Architecture() = %q", f.Architecture())
	}
	s, ok := f.String("s.str")
	check("String", s, "héllo\x00world", ok)
	_, ok = f.String("s.u8")
	not("String of u8", ok)
	_, ok = f.String("nope")
	not("String of a missing key", ok)

	for _, k := range []string{"s.u8", "s.u16", "s.u32", "s.u64", "intfloat"} {
		_, ok := f.Uint(k)
		if !ok {
			t.Errorf("Uint(%q) not ok", k)
		}
	}
	u, ok := f.Uint("s.u64")
	check("Uint(u64)", u, uint64(math.MaxUint64), ok)
	_, ok = f.Uint("neg")
	not("Uint of a negative i32", ok)
	_, ok = f.Uint("s.f32")
	not("Uint of f32", ok)
	i, ok := f.Int("neg")
	check("Int(i32)", i, int64(-5), ok)
	i, ok = f.Int("s.i64")
	check("Int(i64)", i, int64(math.MinInt64), ok)
	_, ok = f.Int("big")
	not("Int of MaxUint64", ok)

	x, ok := f.Float("s.f32")
	check("Float(f32)", x, 0.15625, ok)
	x, ok = f.Float("s.f64")
	check("Float(f64)", x, -2.5e-300, ok)
	x, ok = f.Float("intfloat")
	check("Float(u32)", x, 1e6, ok)
	_, ok = f.Float("s.str")
	not("Float of a string", ok)

	b, ok := f.Bool("s.bool")
	check("Bool", b, true, ok)
	_, ok = f.Bool("s.u8")
	not("Bool of u8", ok)

	ss, ok := f.Strings("a.str")
	check("Strings", ss, []string{"a", "", "<|im_start|>", "Ġthe"}, ok)
	_, ok = f.Strings("a.u8")
	not("Strings of u8s", ok)
	is, ok := f.Ints("a.i32")
	check("Ints(i32)", is, []int64{-7, math.MaxInt32}, ok)
	is, ok = f.Ints("a.u8")
	check("Ints(u8)", is, []int64{1, 2, 255}, ok)
	is, ok = f.Ints("a.empty")
	check("Ints(empty)", is, []int64{}, ok)
	_, ok = f.Ints("ints.big")
	not("Ints of MaxUint64", ok)
	_, ok = f.Ints("a.f32")
	not("Ints of floats", ok)
	_, ok = f.Ints("s.i32")
	not("Ints of a scalar", ok)
	fs, ok := f.Floats("a.f32")
	check("Floats(f32)", fs, []float64{1.5, float64(float32(-3e38))}, ok)
	fs, ok = f.Floats("a.i16")
	check("Floats(i16)", fs, []float64{-32768, 32767}, ok)
	_, ok = f.Floats("a.str")
	not("Floats of strings", ok)

	v, ok := f.Value("a.nested")
	if !ok || v.Type() != TypeArray || v.Elem() != TypeArray || v.Len() != 4 {
		t.Errorf("Value(a.nested) = %v (%s of %s, %d)", v, v.Type(), v.Elem(), v.Len())
	}
	if n := f.Meta["s.u8"].Len(); n != 0 {
		t.Errorf("Len of a scalar = %d", n)
	}
}

func TestValueString(t *testing.T) {
	cases := []struct {
		v    Value
		want string
	}{
		{Val("a\"b"), `"a\"b"`},
		{Val(int8(-3)), "-3"},
		{Val(uint64(math.MaxUint64)), "18446744073709551615"},
		{Val(float32(0.1)), "0.1"},
		{Val(true), "true"},
		{Arr([]int32{1, 2}), "[1, 2]"},
		{Arr([]uint8{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}), "[1, 2, 3, 4, 5, 6, 7, 8, ... 10 in all]"},
		{Arr([]Value{Arr([]string{"x"}), Arr([]bool{})}), `[["x"], []]`},
		{Value{}, "<invalid>"},
	}
	for _, c := range cases {
		if got := c.v.String(); got != c.want {
			t.Errorf("String() = %s, want %s", got, c.want)
		}
	}
	if TypeString.String() != "str" || ValueType(99).String() != "ValueType(99)" {
		t.Errorf("ValueType names: %s %s", TypeString, ValueType(99))
	}
}

// TestTypes checks the type table against the one libggml-base reports
// (testdata/ggml_types.txt, made by testdata/mkfixture.c) and the sizes
// callers rely on.
func TestTypes(t *testing.T) {
	text, err := os.ReadFile("testdata/ggml_types.txt")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(text)), "\n")
	if len(lines) != len(types) {
		t.Errorf("ggml has %d types, the table %d", len(lines), len(types))
	}
	for _, line := range lines {
		fields := strings.Fields(line)
		n, _ := strconv.Atoi(fields[0])
		elems, _ := strconv.Atoi(fields[len(fields)-2])
		size, _ := strconv.Atoi(fields[len(fields)-1])
		typ := Type(n)
		e, b := typ.Block()
		if e != elems || b != size {
			t.Errorf("%s: Block() = %d, %d; ggml says %d, %d", typ, e, b, elems, size)
		}
		if elems != 0 && !strings.EqualFold(typ.String(), fields[1]) {
			t.Errorf("type %d: String() = %s, ggml says %s", n, typ, fields[1])
		}
		if (typ.check() == nil) != (elems != 0) {
			t.Errorf("%s: check() = %v", typ, typ.check())
		}
	}
	for _, c := range []struct {
		t           Type
		name        string
		elems, size int
	}{
		{F32, "F32", 1, 4}, {Q8_0, "Q8_0", 32, 34}, {Q4_K, "Q4_K", 256, 144}, {Q5_K, "Q5_K", 256, 176},
		{Q6_K, "Q6_K", 256, 210}, {MXFP4, "MXFP4", 32, 17}, {BF16, "BF16", 1, 2}, {IQ2_XXS, "IQ2_XXS", 256, 66},
		{Type(4), "Q4_2", 0, 0}, {Type(43), "Type(43)", 0, 0}, {Type(math.MaxUint32), "Type(4294967295)", 0, 0},
	} {
		e, b := c.t.Block()
		if c.t.String() != c.name || e != c.elems || b != c.size {
			t.Errorf("Type(%d): %s %d %d, want %s %d %d", uint32(c.t), c.t, e, b, c.name, c.elems, c.size)
		}
	}
}

// dump renders a file as mkfixture's dump prints llama.cpp's reading of it.
func dump(f *File) string {
	var b strings.Builder
	fmt.Fprintf(&b, "version %d alignment %d data_offset %d\n", f.Version, f.Alignment, f.DataOffset)
	for _, kv := range f.KV {
		fmt.Fprintf(&b, "kv %s %s", kv.Key, kv.Value.Type())
		if kv.Value.Type() == TypeArray {
			fmt.Fprintf(&b, " %s %d", kv.Value.Elem(), kv.Value.Len())
		}
		b.WriteString("\n")
	}
	for _, t := range f.Tensors {
		ne := []int{1, 1, 1, 1}
		for i, d := range t.Shape {
			ne[len(t.Shape)-1-i] = d
		}
		fmt.Fprintf(&b, "tensor %s %s ne %d %d %d %d offset %d size %d\n",
			t.Name, t.Type, ne[0], ne[1], ne[2], ne[3], t.Offset-f.DataOffset, len(t.Data))
	}
	return strings.ToLower(b.String())
}

// TestLlamaCppFixtures reads files written by llama.cpp's gguf_write_to_file
// (testdata/mkfixture.c), compares the reading with llama.cpp's own (the
// .dump files), and checks that Write reproduces them byte for byte.
func TestLlamaCppFixtures(t *testing.T) {
	for _, name := range []string{"llama", "llama-a64"} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", name+".gguf")
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			want, err := os.ReadFile(filepath.Join("testdata", name+".dump"))
			if err != nil {
				t.Fatal(err)
			}
			if got := dump(f); got != strings.ToLower(string(want)) {
				t.Errorf("reading differs from llama.cpp's:\n%s\nwant\n%s", got, want)
			}
			if f.Architecture() != "fixture" {
				t.Errorf("architecture %q", f.Architecture())
			}
			checks := map[string]any{
				"t.u8": uint8(200), "t.i8": int8(-100), "t.u16": uint16(60000), "t.i16": int16(-30000),
				"t.u32": uint32(4000000000), "t.i32": int32(-2000000000), "t.f32": float32(0.15625),
				"t.bool": true, "t.str": "héllo\nworld", "t.empty": "",
				"t.u64": uint64(18000000000000000000), "t.i64": int64(-9000000000000000000), "t.f64": -2.5e-300,
				"a.u8": []uint8{1, 2, 255}, "a.i8": []int8{-1, 0, 127}, "a.u16": []uint16{1, 65535},
				"a.i16": []int16{-32768, 32767}, "a.u32": []uint32{7, 4294967295},
				"a.i32": []int32{-7, 2147483647, -2147483648}, "a.f32": []float32{1.5, float32(math.Copysign(0, -1)), 3e38},
				"a.bool": []bool{true, false, true}, "a.str": []string{"a", "", "<|im_start|>", "Ġthe"},
				"a.u64": []uint64{18446744073709551615, 0}, "a.i64": []int64{-1, 9223372036854775807},
				"a.f64": []float64{3.141592653589793, -1e300}, "a.empty": []int32{},
			}
			for k, want := range checks {
				if got := f.Meta[k].Any(); !reflect.DeepEqual(got, want) {
					t.Errorf("%s = %#v, want %#v", k, got, want)
				}
			}
			for _, tn := range f.Tensors {
				if !bytes.Equal(tn.Data, pattern(tn.Name, len(tn.Data))) {
					t.Errorf("tensor %q: wrong data", tn.Name)
				}
			}
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if again := written(t, f.KV, writeTensors(f)); !bytes.Equal(again, data) {
				t.Errorf("Write gives %d bytes that differ from llama.cpp's %d", len(again), len(data))
			}

			// Version 2 has the same layout (3 only allowed big-endian files).
			v2 := bytes.Clone(data)
			v2[4] = 2
			f2, err := Parse("v2", v2)
			if err != nil {
				t.Fatal(err)
			}
			if f2.Version != 2 || dump(f2) != strings.Replace(dump(f), "version 3", "version 2", 1) {
				t.Errorf("version 2 reads differently:\n%s", dump(f2))
			}
		})
	}
}

// TestLlamaCppReads has llama.cpp read what Write produces, when
// GGUF_LLAMA_DUMP names a built testdata/mkfixture.c.
func TestLlamaCppReads(t *testing.T) {
	tool := os.Getenv("GGUF_LLAMA_DUMP")
	if tool == "" {
		t.Skip("GGUF_LLAMA_DUMP is not set")
	}
	meta, tensors := sample()
	var flat []KV
	for _, kv := range meta {
		if kv.Value.Elem() != TypeArray { // llama.cpp does not read arrays of arrays
			flat = append(flat, kv)
		}
	}
	for _, align := range []uint32{32, 64, 128} {
		m := flat
		if align != 32 {
			m = append([]KV{{alignmentKey, Val(align)}}, flat...)
		}
		path := filepath.Join(t.TempDir(), "w.gguf")
		if err := os.WriteFile(path, written(t, m, tensors), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(tool, "dump", path).CombinedOutput()
		if err != nil {
			t.Fatalf("llama.cpp cannot read Write's output: %v\n%s", err, out)
		}
		f, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := dump(f); got != strings.ToLower(string(out)) {
			t.Errorf("alignment %d: llama.cpp reads\n%s\nParse reads\n%s", align, out, got)
		}
		f.Close()
	}
}

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.gguf")
	data := sampleFile(t)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	q, ok := f.Tensor("q4_k")
	if !ok || !bytes.Equal(q.Data, pattern("q4_k", 144)) || f.Name != path {
		t.Fatalf("tensor q4_k = %+v", q)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if s, _ := f.String("s.str"); s != "héllo\x00world" {
		t.Fatalf("metadata after Close: %q", s)
	}

	empty := filepath.Join(dir, "empty.gguf")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(empty); err == nil || !strings.Contains(err.Error(), "truncated") || !strings.Contains(err.Error(), empty) {
		t.Fatalf("empty file: %v", err)
	}
	bad := filepath.Join(dir, "bad.gguf")
	if err := os.WriteFile(bad, data[:len(data)-200], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(bad); err == nil || !strings.Contains(err.Error(), "past the end") {
		t.Fatalf("truncated file: %v", err)
	}
	if _, err := Open(filepath.Join(dir, "none.gguf")); err == nil {
		t.Fatal("missing file opened")
	}
}

// TestTruncated cuts a file at every byte: up to the end of the last
// tensor's data every prefix must fail, with an error, not a panic.
func TestTruncated(t *testing.T) {
	data := sampleFile(t)
	f, err := Parse("x", data)
	if err != nil {
		t.Fatal(err)
	}
	last := f.Tensors[len(f.Tensors)-1]
	end := int(last.Offset) + len(last.Data)
	for n := range end {
		if _, err := Parse("cut.gguf", data[:n]); err == nil {
			t.Fatalf("file cut to %d of %d bytes parsed", n, len(data))
		} else if !strings.HasPrefix(err.Error(), "gguf cut.gguf: ") {
			t.Fatalf("cut to %d: error %q does not name the file", n, err)
		}
	}
	for n := end; n <= len(data); n++ {
		if _, err := Parse("cut.gguf", data[:n]); err != nil {
			t.Fatalf("cut to %d, after the last tensor: %v", n, err)
		}
	}
}

// raw assembles files field by field, for the malformed ones.
type raw struct{ enc }

func newRaw(version uint32, nTensors, nKV uint64) *raw {
	r := &raw{}
	r.WriteString("GGUF")
	r.u32(version)
	r.u64(nTensors)
	r.u64(nKV)
	return r
}

func (r *raw) kv(key string, t ValueType, v any) *raw {
	r.str(key)
	r.u32(uint32(t))
	r.value(v)
	return r
}

func (r *raw) tensor(name string, t Type, off uint64, ne ...uint64) *raw {
	r.str(name)
	r.u32(uint32(len(ne)))
	for _, d := range ne {
		r.u64(d)
	}
	r.u32(uint32(t))
	r.u64(off)
	return r
}

// data pads to the alignment and appends n bytes of data.
func (r *raw) data(align, n int) []byte {
	r.zeros(alignUp(uint64(r.Len()), uint64(align)) - uint64(r.Len()))
	r.zeros(uint64(n))
	return r.Bytes()
}

// nested is an array header nested depth deep around an empty u8 array.
func nested(depth int) []byte {
	var e enc
	for range depth - 1 {
		e.u32(uint32(TypeArray))
		e.u64(1)
	}
	e.u32(uint32(TypeUint8))
	e.u64(0)
	return e.Bytes()
}

func TestParseErrors(t *testing.T) {
	good := sampleFile(t)
	withVersion := func(v uint32) []byte {
		b := bytes.Clone(good)
		b[4], b[5], b[6], b[7] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		return b
	}
	deep := newRaw(3, 0, 1)
	deep.str("k")
	deep.u32(uint32(TypeArray))
	deep.Write(nested(maxNesting + 1))
	okDeep := newRaw(3, 0, 1)
	okDeep.str("k")
	okDeep.u32(uint32(TypeArray))
	okDeep.Write(nested(maxNesting))
	if _, err := Parse("deep", okDeep.Bytes()); err != nil {
		t.Fatalf("arrays nested %d deep: %v", maxNesting, err)
	}
	arrayOf := func(et ValueType, n uint64) []byte {
		r := newRaw(3, 0, 1)
		r.str("k")
		r.u32(uint32(TypeArray))
		r.u32(uint32(et))
		r.u64(n)
		r.zeros(64)
		return r.Bytes()
	}
	hugeKey := newRaw(3, 0, 1)
	hugeKey.u64(1 << 62)
	hugeKey.zeros(64)
	hugeString := newRaw(3, 0, 1)
	hugeString.str("k")
	hugeString.u32(uint32(TypeString))
	hugeString.u64(1 << 40)
	hugeString.zeros(10)

	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "truncated file: 0 bytes"},
		{"short", []byte("GG"), "truncated file"},
		{"bad magic", append([]byte("GGML"), good[4:]...), `bad magic "GGML"`},
		{"header cut", good[:12], "truncated at byte 8: the tensor count"},
		{"version 0", withVersion(0), "unsupported GGUF version 0"},
		{"version 1", withVersion(1), "version 1 (32-bit counts) is no longer supported"},
		{"version 4", withVersion(4), "unsupported GGUF version 4"},
		{"big-endian", withVersion(0x03000000), "big-endian"},
		{"big-endian v2", withVersion(0x02000000), "version 2 byte-swapped"},
		{"huge kv count", newRaw(3, 0, 1<<40).data(32, 100), "claims 1099511627776 metadata pairs"},
		{"huge tensor count", newRaw(3, math.MaxUint64, 0).data(32, 100), "claims 18446744073709551615 tensors"},
		{"huge key", hugeKey.Bytes(), "key 0 is 4611686018427387904 bytes long, more than the 64 left"},
		{"huge string", hugeString.Bytes(), `key "k": at byte 37: the string is 1099511627776 bytes long, more than the 10 left`},
		{"huge array", arrayOf(TypeUint32, 17), "array of 17 u32 elements cannot fit in the 64 bytes left"},
		{"huge string array", arrayOf(TypeString, 9), "array of 9 str elements cannot fit"},
		{"huge nested array", arrayOf(TypeArray, 6), "array of 6 arr elements cannot fit"},
		{"max array", arrayOf(TypeUint8, math.MaxUint64), "cannot fit"},
		{"unknown value type", newRaw(3, 0, 1).kv("k", 13, uint8(0)).data(1, 0), `key "k": at byte 33: unknown value type 13`},
		{"unknown element type", arrayOf(99, 1), "array of unknown value type 99"},
		{"nested too deep", deep.Bytes(), "nested more than 16 deep"},
		{"empty key", newRaw(3, 0, 1).kv("", TypeUint8, uint8(0)).data(1, 8), "at byte 24: key 0 is empty"},
		{"duplicate key", newRaw(3, 0, 2).kv("k", TypeUint8, uint8(0)).kv("k", TypeUint8, uint8(0)).data(1, 0), `key "k" appears twice`},
		{"string cut", newRaw(3, 0, 1).kv("k", TypeString, "hello").data(1, 0)[:24+9+4+8+3], `key "k": at byte 37: the string is 5 bytes long, more than the 3 left`},
		{"alignment type", newRaw(3, 0, 1).kv(alignmentKey, TypeUint64, uint64(32)).data(1, 0), "general.alignment is a u64, want u32"},
		{"alignment 48", newRaw(3, 0, 1).kv(alignmentKey, TypeUint32, uint32(48)).data(1, 0), "general.alignment 48 is not a power of two"},
		{"alignment 0", newRaw(3, 0, 1).kv(alignmentKey, TypeUint32, uint32(0)).data(1, 0), "general.alignment 0 is not a power of two"},
		{"no dims", newRaw(3, 1, 0).tensor("w", F32, 0).data(32, 64), `tensor "w": 0 dimensions, want 1 to 4`},
		{"5 dims", newRaw(3, 1, 0).tensor("w", F32, 0, 1, 1, 1, 1, 1).data(32, 64), `tensor "w": 5 dimensions, want 1 to 4`},
		{"zero dim", newRaw(3, 1, 0).tensor("w", F32, 0, 4, 0).data(32, 64), "shape [0 4]: every dimension must be positive"},
		{"negative dim", newRaw(3, 1, 0).tensor("w", F32, 0, 4, math.MaxUint64).data(32, 64), "shape [-1 4]: every dimension must be positive"},
		{"unknown type", newRaw(3, 1, 0).tensor("w", 99, 0, 4).data(32, 64), `tensor "w": unknown ggml type 99`},
		{"removed type", newRaw(3, 1, 0).tensor("w", 31, 0, 4).data(32, 64), "type Q4_0_4_4 (31) has been removed from ggml"},
		{"partial block", newRaw(3, 1, 0).tensor("w", Q8_0, 0, 48).data(32, 64), "rows of 48 elements are not whole 32-element blocks"},
		{"overflow", newRaw(3, 1, 0).tensor("w", F32, 0, 1<<62, 1<<62).data(32, 64), "shape [4611686018427387904 4611686018427387904] of F32 is too large"},
		{"bigger than file", newRaw(3, 1, 0).tensor("w", F32, 0, 1<<40).data(32, 64), "shape [1099511627776] of F32 takes 4398046511104 bytes, more than the whole file (128)"},
		{"block overflow", newRaw(3, 1, 0).tensor("w", Q8_K, 0, math.MaxInt64-255).data(32, 64), "of Q8_K is too large"},
		{"misaligned", newRaw(3, 1, 0).tensor("w", F32, 16, 4).data(32, 64), `tensor "w": offset 16 is not a multiple of the alignment 32`},
		{"past EOF", newRaw(3, 1, 0).tensor("w", F32, 32, 16).data(32, 64), `tensor "w": its 64 bytes at offset 32 run past the end of the file (the data section holds 64 bytes)`},
		{"offset past EOF", newRaw(3, 1, 0).tensor("w", F32, math.MaxUint64-31, 1).data(32, 64), "run past the end"},
		{"no data section", newRaw(3, 1, 0).tensor("w", F32, 0, 1).Bytes(), "truncated file: the data section would start at byte 64, the file has 57"},
		{"overlap", newRaw(3, 2, 0).tensor("a", F32, 0, 16).tensor("b", F32, 32, 8).data(32, 64), `tensors "a" [0, 64) and "b" [32, 64) overlap`},
		{"duplicate tensor", newRaw(3, 2, 0).tensor("a", F32, 0, 1).tensor("a", F32, 32, 1).data(32, 64), `tensor "a" appears twice`},
		{"empty tensor name", newRaw(3, 1, 0).tensor("", F32, 0, 1).data(32, 64), "tensor 0 has an empty name"},
		{"long tensor name", newRaw(3, 1, 0).tensor(strings.Repeat("x", 64), F32, 0, 1).data(32, 64), "is 64 bytes long; ggml allows at most 63"},
		{"tensor info cut", newRaw(3, 1, 0).tensor(strings.Repeat("w", 40), F32, 0, 1).Bytes()[:24+48+4+4], "truncated at byte 76: a dimension takes 8 bytes, 4 are left"},
	}
	for _, c := range cases {
		_, err := Parse("f.gguf", c.data)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
		if err != nil && !strings.HasPrefix(err.Error(), "gguf f.gguf: ") {
			t.Errorf("%s: error %v does not name the file", c.name, err)
		}
	}
}

func TestWriteErrors(t *testing.T) {
	okMeta, okTensors := sample()
	cases := []struct {
		name    string
		meta    []KV
		tensors []WriteTensor
		want    string
	}{
		{"empty key", []KV{{"", Val(1.0)}}, nil, "empty key"},
		{"duplicate key", []KV{{"k", Val(1.0)}, {"k", Val(2.0)}}, nil, `key "k" given twice`},
		{"zero value", []KV{{"k", Value{}}}, nil, `key "k": invalid (zero) Value`},
		{"scalar in nested", []KV{{"k", Arr([]Value{Arr([]int8{1}), Val(int8(1))})}}, nil, "element 1 of an array of arrays is a i8"},
		{"zero in nested", []KV{{"k", Arr([]Value{{}})}}, nil, "element 0 of an array of arrays"},
		{"too deep", []KV{{"k", Value{deepValue(maxNesting + 1)}}}, nil, "nested more than 16 deep"},
		{"alignment u64", []KV{{alignmentKey, Val(uint64(32))}}, nil, "general.alignment must be a u32 power of two, not u64 32"},
		{"alignment 48", []KV{{alignmentKey, Val(uint32(48))}}, nil, "not u32 48"},
		{"tensor no name", nil, []WriteTensor{{"", F32, []int{1}, make([]byte, 4)}}, "empty name"},
		{"tensor long name", nil, []WriteTensor{{strings.Repeat("n", 64), F32, []int{1}, make([]byte, 4)}}, "at most 63"},
		{"tensor twice", nil, []WriteTensor{okTensors[0], okTensors[0]}, `tensor "f32" given twice`},
		{"no dims", nil, []WriteTensor{{"w", F32, nil, nil}}, "0 dimensions"},
		{"5 dims", nil, []WriteTensor{{"w", F32, []int{1, 1, 1, 1, 1}, make([]byte, 4)}}, "5 dimensions"},
		{"negative dim", nil, []WriteTensor{{"w", F32, []int{-1, 4}, nil}}, "shape [-1 4]: every dimension must be positive"},
		{"unknown type", nil, []WriteTensor{{"w", Type(5), []int{4}, nil}}, "type Q4_3 (5) has been removed"},
		{"partial block", nil, []WriteTensor{{"w", Q4_K, []int{128}, make([]byte, 72)}}, "rows of 128 elements are not whole 256-element blocks"},
		{"size mismatch", nil, []WriteTensor{{"w", Q8_0, []int{2, 32}, make([]byte, 34)}}, "shape [2 32] of Q8_0 takes 68 bytes, Data holds 34"},
		{"too large", nil, []WriteTensor{{"w", F64, []int{math.MaxInt, math.MaxInt}, nil}}, "too large"},
	}
	for _, c := range cases {
		var b bytes.Buffer
		err := Write(&b, c.meta, c.tensors)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "gguf: write: ") {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
		if b.Len() != 0 {
			t.Errorf("%s: wrote %d bytes before failing", c.name, b.Len())
		}
	}
	if err := Write(failingWriter{}, okMeta, okTensors); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("failing writer: %v", err)
	}
}

func deepValue(depth int) any {
	if depth == 1 {
		return []uint8{}
	}
	return []Value{{deepValue(depth - 1)}}
}

type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, fmt.Errorf("disk full") }

func TestWriteAlignment(t *testing.T) {
	_, tensors := sample()
	for _, a := range []uint32{1, 8, 64, 4096} {
		data := written(t, []KV{{alignmentKey, Val(a)}}, tensors)
		f, err := Parse("x", data)
		if err != nil {
			t.Fatalf("alignment %d: %v", a, err)
		}
		if f.Alignment != int(a) || f.DataOffset%int64(a) != 0 {
			t.Fatalf("alignment %d: read %d, data at %d", a, f.Alignment, f.DataOffset)
		}
		for _, tn := range f.Tensors {
			if tn.Offset%int64(a) != 0 {
				t.Errorf("alignment %d: tensor %q at %d", a, tn.Name, tn.Offset)
			}
		}
	}
	// Without tensors the file is the header padded to the alignment, as
	// llama.cpp writes it.
	if data := written(t, nil, nil); len(data) != 32 {
		t.Errorf("empty file: %d bytes", len(data))
	}
}

// FuzzParse checks that no input makes Parse panic or over-allocate, that
// what it accepts keeps its promises, and that Write reproduces it: a
// parsed file written, parsed and written again gives the same bytes.
func FuzzParse(f *testing.F) {
	f.Add(sampleFile(f))
	for _, name := range []string{"llama.gguf", "llama-a64.gguf"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add(written(f, []KV{{"k", Arr([]Value{Arr([]string{"a"})})}}, []WriteTensor{tensorOf("w", Q8_0, 32)}))
	f.Add(newRaw(2, 0, 0).Bytes())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse("fuzz", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "gguf fuzz: ") {
				t.Fatalf("error %q does not name the file", err)
			}
			return
		}
		if len(file.KV) != len(file.Meta) {
			t.Fatalf("%d pairs, %d keys", len(file.KV), len(file.Meta))
		}
		type span struct{ begin, end int }
		var spans []span
		for _, tn := range file.Tensors {
			elems, bsize := tn.Type.Block()
			if elems == 0 || len(tn.Shape) < 1 || len(tn.Shape) > 4 || tn.Shape[len(tn.Shape)-1]%elems != 0 {
				t.Fatalf("tensor %q: %s %v", tn.Name, tn.Type, tn.Shape)
			}
			if len(tn.Data) != tn.Numel()/elems*bsize {
				t.Fatalf("tensor %q: %d bytes for %s %v", tn.Name, len(tn.Data), tn.Type, tn.Shape)
			}
			off := int(uintptrOf(tn.Data) - uintptrOf(data))
			if off != int(tn.Offset) || off < 0 || off+len(tn.Data) > len(data) || (tn.Offset-file.DataOffset)%int64(file.Alignment) != 0 {
				t.Fatalf("tensor %q at %d (Offset %d), %d bytes, in %d", tn.Name, off, tn.Offset, len(tn.Data), len(data))
			}
			for _, s := range spans {
				if off < s.end && s.begin < off+len(tn.Data) {
					t.Fatalf("tensor %q overlaps another", tn.Name)
				}
			}
			spans = append(spans, span{off, off + len(tn.Data)})
		}
		if file.Alignment > 1<<16 {
			return // Write would pad to it
		}
		var once bytes.Buffer
		if err := Write(&once, file.KV, writeTensors(file)); err != nil {
			t.Fatalf("Write of a parsed file: %v", err)
		}
		again, err := Parse("again", once.Bytes())
		if err != nil {
			t.Fatalf("Parse of a written file: %v", err)
		}
		var twice bytes.Buffer
		if err := Write(&twice, again.KV, writeTensors(again)); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(once.Bytes(), twice.Bytes()) {
			t.Fatal("write, parse, write changes the file")
		}
	})
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// TestFileType reads general.file_type of files llama.cpp's quantizer made,
// and finds them by their magic whatever their name.
func TestFileType(t *testing.T) {
	for file, want := range map[string]string{
		"qwen3-w256-Q4_K_M.gguf": "Q4_K_M", "qwen3-w256-Q5_K_M.gguf": "Q5_K_M", "qwen3-w256-Q8_0.gguf": "Q8_0", "qwen3-f32.gguf": "F32",
	} {
		path := filepath.Join("..", "testdata", "quant", file)
		f, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := f.FileType(); got != want {
			t.Errorf("%s: file type %q, want %q", file, got, want)
		}
		f.Close()
		if !IsGGUF(path) {
			t.Errorf("%s: not recognised as GGUF", file)
		}
	}
	if IsGGUF("gguf_test.go") || IsGGUF("no such file") {
		t.Error("a Go file or a missing one is GGUF")
	}
}
