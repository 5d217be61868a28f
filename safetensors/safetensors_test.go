package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"testing/fstest"
	"unsafe"
)

// build assembles a safetensors file from a raw header and data section.
func build(header string, data []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(header)))
	b.WriteString(header)
	b.Write(data)
	return b.Bytes()
}

// valid returns a well-formed two-tensor file: "a" F32[2,2] then "b" BF16[3].
func valid() []byte {
	data := make([]byte, 16+6)
	for i := range data {
		data[i] = byte(i)
	}
	return build(`{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},`+
		`"b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]}}  `, data)
}

func TestParseValid(t *testing.T) {
	f, err := Parse("x", valid())
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Names(); len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("names %v", got)
	}
	b, _ := f.Tensor("b")
	if b.DType != "BF16" || len(b.Shape) != 1 || b.Shape[0] != 3 || !bytes.Equal(b.Data, []byte{16, 17, 18, 19, 20, 21}) {
		t.Fatalf("tensor b = %+v", b)
	}
	if f.Metadata["format"] != "pt" {
		t.Fatalf("metadata %v", f.Metadata)
	}
}

func TestParseErrors(t *testing.T) {
	good := valid()
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"short", []byte{1, 2, 3}, "truncated file"},
		{"header beyond file", good[:40], "goes beyond the file"},
		{"truncated data", good[:len(good)-3], "outside the"},
		{"not json", build("hello", nil), "not JSON"},
		{"not object", build("[1,2]", nil), "not a JSON object"},
		{"offsets outside", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 4)), "outside the 4-byte data section"},
		{"reversed offsets", build(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`, make([]byte, 4)), "outside"},
		{"size mismatch", build(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, make([]byte, 8)), "needs 12 bytes"},
		{"overlap", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)), "overlap"},
		// An empty tensor inside a (sorted before the one overlapping it)
		// used to end the comparison there (issue 21).
		{"overlap past an empty tensor", build(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"e":{"dtype":"F32","shape":[0],"data_offsets":[2,2]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)), `tensors "a" [0, 8) and "b" [4, 8) overlap`},
		{"unknown dtype", build(`{"a":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}}`, make([]byte, 2)), `unknown dtype "Q4_K"`},
		{"duplicate", build(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`, make([]byte, 2)), `names "a" twice`},
		{"negative dim", build(`{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}`, nil), "negative dimension"},
		{"huge shape", build(`{"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, nil), "too large"},
		{"trailing", build(`{}xyz`, nil), "unexpected bytes"},
		{"bad offsets", build(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}}`, make([]byte, 1)), "has 1 values"},
	}
	for _, c := range cases {
		_, err := Parse("f.safetensors", c.data)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
		if err != nil && !strings.Contains(err.Error(), "f.safetensors") {
			t.Errorf("%s: error %v does not name the file", c.name, err)
		}
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestOpenMapped(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "model.safetensors"), valid())
	s, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a, ok := s.Tensor("a")
	if !ok || a.Numel() != 4 || a.Data[15] != 15 {
		t.Fatalf("tensor a = %+v", a)
	}
	writeFile(t, filepath.Join(dir, "empty.safetensors"), nil)
	if _, err := Open(filepath.Join(dir, "empty.safetensors")); err == nil || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("empty file: %v", err)
	}
}

func shard(names ...string) []byte {
	hdr := map[string]any{}
	for i, n := range names {
		hdr[n] = map[string]any{"dtype": "U8", "shape": []int{2}, "data_offsets": []int{2 * i, 2*i + 2}}
	}
	h, _ := json.Marshal(hdr)
	data := make([]byte, 2*len(names))
	for i := range names {
		data[2*i] = names[i][0]
	}
	return build(string(h), data)
}

func index(m map[string]string) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": m})
	return b
}

func TestSharded(t *testing.T) {
	files := fstest.MapFS{
		"model-00001-of-00002.safetensors": {Data: shard("x", "y")},
		"model-00002-of-00002.safetensors": {Data: shard("z")},
		IndexFile: {Data: index(map[string]string{
			"x": "model-00001-of-00002.safetensors",
			"y": "model-00001-of-00002.safetensors",
			"z": "model-00002-of-00002.safetensors",
		})},
	}
	dir := t.TempDir()
	for name, f := range files {
		writeFile(t, filepath.Join(dir, name), f.Data)
	}
	fromFS, err := OpenFS(files)
	if err != nil {
		t.Fatal(err)
	}
	fromDir, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer fromDir.Close()
	for _, s := range []*Set{fromFS, fromDir} {
		if got := strings.Join(s.Names(), ","); got != "x,y,z" {
			t.Fatalf("names %s", got)
		}
		z, _ := s.Tensor("z")
		if z.Data[0] != 'z' || !strings.HasSuffix(z.File, "model-00002-of-00002.safetensors") {
			t.Fatalf("tensor z = %+v", z)
		}
	}

	bad := fstest.MapFS{
		"a.safetensors": {Data: shard("x")},
		IndexFile:       {Data: index(map[string]string{"x": "a.safetensors", "w": "a.safetensors"})},
	}
	if _, err := OpenFS(bad); err == nil || !strings.Contains(err.Error(), `"w"`) {
		t.Fatalf("index naming a missing tensor: %v", err)
	}
	escape := fstest.MapFS{IndexFile: {Data: index(map[string]string{"x": "../a.safetensors"})}}
	if _, err := OpenFS(escape); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Fatalf("index escaping the directory: %v", err)
	}
	dup := fstest.MapFS{"a.safetensors": {Data: shard("x")}, "b.safetensors": {Data: shard("x")}}
	if _, err := OpenFS(dup); err == nil || !strings.Contains(err.Error(), "in both") {
		t.Fatalf("tensor in two files: %v", err)
	}
	if _, err := OpenFS(fstest.MapFS{}); err == nil || !strings.Contains(err.Error(), "no model.safetensors.index.json") {
		t.Fatalf("empty directory: %v", err)
	}
}

// FuzzParse checks that no input makes the header parser panic, and that
// whatever it accepts keeps its promises.
func FuzzParse(f *testing.F) {
	f.Add(valid())
	f.Add(shard("a", "b", "c"))
	f.Add(build(`{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}`, make([]byte, 4)))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse("fuzz", data)
		if err != nil {
			return
		}
		var prevEnd int
		for _, n := range file.Names() {
			tn, _ := file.Tensor(n)
			if len(tn.Data) != tn.Numel()*dtypeSizes[tn.DType] {
				t.Fatalf("tensor %q: %d bytes for shape %v %s", n, len(tn.Data), tn.Shape, tn.DType)
			}
			if len(tn.Data) == 0 {
				continue
			}
			off := int(uintptrOf(tn.Data) - uintptrOf(data))
			if off < 0 || off+len(tn.Data) > len(data) || off < prevEnd {
				t.Fatalf("tensor %q at [%d, %d) outside data or overlapping (previous end %d)", n, off, off+len(tn.Data), prevEnd)
			}
			prevEnd = off + len(tn.Data)
		}
	})
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// TestOpenRefusesSpecialFiles: a named pipe in place of the weights or of
// their index is refused at once; loading used to wait on it forever.
func TestOpenRefusesSpecialFiles(t *testing.T) {
	for _, name := range []string{"model.safetensors", IndexFile} {
		dir := t.TempDir()
		if err := syscall.Mkfifo(filepath.Join(dir, name), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenDir(dir); err == nil || !strings.Contains(err.Error(), name+": not a regular file (a named pipe)") {
			t.Errorf("%s: %v", name, err)
		}
		if _, err := OpenFS(os.DirFS(dir)); err == nil || !strings.Contains(err.Error(), name+": not a regular file (a named pipe)") {
			t.Errorf("%s through fs.FS: %v", name, err)
		}
	}
}
