//go:build cgo

package cuda

import (
	"fmt"

	"github.com/kiln-llm/kiln/backend"
)

// Device layout of block-quantized weights (kernels/quant.cu reads it).
//
// A quantized tensor is a matrix of rows of cols elements (experts stacked
// by rows), as in the interchange form (backend/quant.go), and each row
// stays self-contained, so that views by rows (experts, the parts of a
// fused q|k|v) are a pointer and a row count as for float weights. Within
// a row, blocks whose size is not a multiple of 16 bytes are split in two:
// the body of every block (its quants, 16-byte multiples) one after the
// other, then the tails (the scales) of every block, then zeros up to a
// multiple of 16 bytes. Each 16-byte load of a kernel then reads quants of
// one block:
//
//	Q8_0   body: the 32 int8 quants (bytes 2-33); tail: the f16 scale d
//	Q6_K   body: ql, qh and the 16 scales (bytes 0-207); tail: the f16 d
//	MXFP4  body: the 16 bytes of e2m1 pairs; tail: the e8m0 exponent
//	FP8    body: the 128 e4m3 values; tail: the float32 scale
//	Q4_K, Q5_K  the interchange blocks as they are (144 and 176 bytes)
//
// A row of n blocks takes n*body + pad16(n*tail) bytes: its interchange
// size rounded up to 16 (the same size at Qwen's widths).
type qlayout struct {
	bodyOff, bodyLen int // the body's bytes within an interchange block
	tailOff, tailLen int // the tail's
}

func qlayoutOf(dt backend.DType) qlayout {
	switch dt {
	case backend.Q8_0:
		return qlayout{2, 32, 0, 2}
	case backend.Q4_K:
		return qlayout{0, 144, 0, 0}
	case backend.Q5_K:
		return qlayout{0, 176, 0, 0}
	case backend.Q6_K:
		return qlayout{0, 208, 208, 2}
	case backend.MXFP4:
		return qlayout{1, 16, 0, 1}
	case backend.FP8:
		return qlayout{4, 128, 0, 4}
	}
	panic(fmt.Sprintf("cuda: %v is not a quantized type", dt))
}

func pad16(n int) int { return (n + 15) &^ 15 }

// qBlocks returns the blocks of a row of cols elements of dt.
func qBlocks(dt backend.DType, cols int) int {
	e, _ := dt.Block()
	return (cols + e - 1) / e
}

// qRowBytes returns the device bytes of one row of cols elements of dt (a
// multiple of 16).
func qRowBytes(dt backend.DType, cols int) int {
	l, nb := qlayoutOf(dt), qBlocks(dt, cols)
	return nb*l.bodyLen + pad16(nb*l.tailLen)
}

// qPack converts rows of cols elements of dt from the interchange form to
// the device layout.
func qPack(dt backend.DType, data []byte, rows, cols int) []byte {
	l, nb := qlayoutOf(dt), qBlocks(dt, cols)
	_, bs := dt.Block()
	src, dst := nb*bs, qRowBytes(dt, cols)
	if len(data) != rows*src {
		panic(fmt.Sprintf("cuda: packing %d bytes as %d rows of %d %v elements", len(data), rows, cols, dt))
	}
	if l.tailLen == 0 && src == dst {
		return data
	}
	out := make([]byte, rows*dst)
	for r := range rows {
		in, o := data[r*src:(r+1)*src], out[r*dst:(r+1)*dst]
		for i := range nb {
			blk := in[i*bs : (i+1)*bs]
			copy(o[i*l.bodyLen:], blk[l.bodyOff:l.bodyOff+l.bodyLen])
			copy(o[nb*l.bodyLen+i*l.tailLen:], blk[l.tailOff:l.tailOff+l.tailLen])
		}
	}
	return out
}

// qUnpack is qPack's inverse.
func qUnpack(dt backend.DType, dev []byte, rows, cols int) []byte {
	l, nb := qlayoutOf(dt), qBlocks(dt, cols)
	_, bs := dt.Block()
	src, dst := qRowBytes(dt, cols), nb*bs
	if len(dev) != rows*src {
		panic(fmt.Sprintf("cuda: unpacking %d bytes as %d rows of %d %v elements", len(dev), rows, cols, dt))
	}
	if l.tailLen == 0 && src == dst {
		return dev
	}
	out := make([]byte, rows*dst)
	for r := range rows {
		in, o := dev[r*src:(r+1)*src], out[r*dst:(r+1)*dst]
		for i := range nb {
			blk := o[i*bs : (i+1)*bs]
			copy(blk[l.bodyOff:l.bodyOff+l.bodyLen], in[i*l.bodyLen:])
			copy(blk[l.tailOff:l.tailOff+l.tailLen], in[nb*l.bodyLen+i*l.tailLen:])
		}
	}
	return out
}
