package gguf

import (
	"bytes"
	"strings"
	"testing"
)

// TestWriterStreams writes the sample file through a Writer in pieces of
// every size from 1 byte up (pieces that end inside a tensor, at its end,
// and across several tensors): the bytes are Write's.
func TestWriterStreams(t *testing.T) {
	meta, tensors := sample()
	want := written(t, meta, tensors)
	infos := make([]TensorInfo, len(tensors))
	var data []byte
	for i, tn := range tensors {
		infos[i] = TensorInfo{tn.Name, tn.Type, tn.Shape}
		if n, err := infos[i].Size(); err != nil || n != int64(len(tn.Data)) {
			t.Fatalf("%s: Size %d, %v; want %d", tn.Name, n, err, len(tn.Data))
		}
		data = append(data, tn.Data...)
	}
	for piece := 1; piece <= len(data); piece = piece*2 + 1 {
		var b bytes.Buffer
		sw, err := NewWriter(&b, meta, infos)
		if err != nil {
			t.Fatal(err)
		}
		if ti, left, ok := sw.Tensor(); !ok || ti.Name != tensors[0].Name || left != int64(len(tensors[0].Data)) {
			t.Fatalf("first tensor: %v %d %v", ti, left, ok)
		}
		for i := 0; i < len(data); i += piece {
			if _, err := sw.Write(data[i:min(i+piece, len(data))]); err != nil {
				t.Fatal(err)
			}
		}
		if _, _, ok := sw.Tensor(); ok {
			t.Fatal("Tensor reports a tensor after the last byte")
		}
		if err := sw.Close(); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b.Bytes(), want) {
			t.Fatalf("pieces of %d bytes: the file differs from Write's", piece)
		}
	}
}

func TestWriterErrors(t *testing.T) {
	meta, tensors := sample()
	infos := []TensorInfo{{tensors[0].Name, tensors[0].Type, tensors[0].Shape}}
	size := len(tensors[0].Data)

	var b bytes.Buffer
	if _, err := NewWriter(&b, meta, []TensorInfo{{"w", Q4_K, []int{128}}}); err == nil || !strings.Contains(err.Error(), "not whole 256-element blocks") {
		t.Errorf("bad shape: %v", err)
	}
	if b.Len() != 0 {
		t.Errorf("NewWriter wrote %d bytes before failing", b.Len())
	}

	sw, err := NewWriter(&b, meta, infos)
	if err != nil {
		t.Fatal(err)
	}
	sw.Write(make([]byte, size-1))
	if err := sw.Close(); err == nil || !strings.Contains(err.Error(), "is missing 1 of its") {
		t.Errorf("short data: %v", err)
	}
	if _, err := sw.Write([]byte{0}); err == nil {
		t.Error("Write after Close: no error")
	}

	sw, _ = NewWriter(&b, meta, infos)
	if _, err := sw.Write(make([]byte, size+1)); err == nil || !strings.Contains(err.Error(), "1 bytes more than the 1 tensors take") {
		t.Errorf("too much data: %v", err)
	}
	if err := sw.Close(); err == nil {
		t.Error("Close after too much data: no error")
	}

	if _, err := NewWriter(failingWriter{}, meta, infos); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Errorf("failing writer: %v", err)
	}
}
