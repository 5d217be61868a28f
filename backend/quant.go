package backend

import "fmt"

// Block-quantized weights.
//
// A quantized weight is a matrix [rows, cols] (experts: [E, rows, cols])
// whose every row is a whole number of blocks, each holding BlockElems
// consecutive elements of the row and the scales they need. Rows are
// self-contained, so views by rows, stacking experts, fusing q|k|v and
// permuting rows work on bytes exactly as they do for float weights. The
// GGUF types keep llama.cpp's block layouts byte for byte, so a GGUF file's
// tensors are used as they are stored:
//
//	Q8_0   32 elements, 34 bytes: f16 scale d, 32 int8 q; x = d*q
//	Q4_K  256 elements, 144 bytes: f16 d, f16 dmin, 12 bytes of 6-bit scales
//	      and mins for 8 sub-blocks of 32, 128 bytes of 4-bit q;
//	      x = d*sc*q - dmin*m
//	Q5_K  256 elements, 176 bytes: Q4_K's fields plus 32 bytes of fifth bits
//	Q6_K  256 elements, 210 bytes: 128 bytes of low 4 bits, 64 of high 2
//	      bits, 16 int8 scales for sub-blocks of 16, f16 d; x = d*sc*(q-32)
//	MXFP4  32 elements, 17 bytes: e8m0 exponent, 16 bytes of e2m1 pairs
//	      (element j in the low nibble of byte j, element j+16 in the high)
//
// FP8 is kiln's row form of the fine-grained FP8 checkpoints Qwen publishes
// (e4m3 weights with one float32 scale per 128x128 tile, weight_scale_inv):
// a block is 128 elements of a row, 132 bytes: the float32 scale of the
// block's tile, then 128 e4m3 values; x = scale*q. Rows whose width is not a
// multiple of 128 end in a block padded with zeros, as edge tiles are
// partial in the checkpoint. Keeping the scale beside its values makes the
// rows self-contained at a cost of 3% over the checkpoint's bytes.

// Quantized reports whether d is a block-quantized weight type.
func (d DType) Quantized() bool { return d >= Q8_0 && d <= FP8 }

// Block returns the elements and bytes of one block of d; a float or
// integer type is a block of one element.
func (d DType) Block() (elems, bytes int) {
	switch d {
	case Q8_0:
		return 32, 34
	case Q4_K:
		return 256, 144
	case Q5_K:
		return 256, 176
	case Q6_K:
		return 256, 210
	case MXFP4:
		return 32, 17
	case FP8:
		return 128, 132
	}
	return 1, d.Size()
}

// RowBytes returns the bytes of one row of cols elements.
func (d DType) RowBytes(cols int) int {
	e, b := d.Block()
	return (cols + e - 1) / e * b
}

// CheckCols reports a row width d cannot store: a GGUF block type needs
// whole blocks (FP8 pads its last block).
func (d DType) CheckCols(cols int) error {
	if e, _ := d.Block(); d != FP8 && cols%e != 0 {
		return fmt.Errorf("%v rows hold whole blocks of %d elements; a row of %d does not", d, e, cols)
	}
	return nil
}

// Bytes returns the size of a tensor of d with shape (the innermost
// dimension is the row).
func (d DType) Bytes(shape ...int) int {
	if len(shape) == 0 {
		return d.RowBytes(1)
	}
	rows := 1
	for _, n := range shape[:len(shape)-1] {
		rows *= n
	}
	return rows * d.RowBytes(shape[len(shape)-1])
}
