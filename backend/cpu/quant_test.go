package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kiln-llm/kiln/backend"
	"github.com/kiln-llm/kiln/quant"
)

var quantTypes = []backend.DType{backend.Q8_0, backend.Q4_K, backend.Q5_K, backend.Q6_K, backend.MXFP4, backend.FP8}

// quantWidths are the row widths each type is tested at: whole blocks, and
// for FP8 a partial last block too.
var quantWidths = map[backend.DType][]int{
	backend.Q8_0:  {32, 96, 128, 3072},
	backend.Q4_K:  {256, 512, 3072},
	backend.Q5_K:  {256, 512},
	backend.Q6_K:  {256, 512, 3072},
	backend.MXFP4: {32, 96, 1024},
	backend.FP8:   {128, 200, 3072},
}

// intPath reports whether decode products of dt quantize the input rows to
// int8 (their error is that of x's rounding, not of float sums).
func intPath(dt backend.DType) bool { _, ok := intDot(dt); return ok }

// Int8 rounding of the input rows changes a product by a relative L2 error
// of about (amax/127)/sqrt(12)/rms(x): 0.45% for normal rows in blocks of
// 32 (Q8_0), 0.7% in blocks of 256 (K-quants); intTol bounds it (the tests
// see at most 0.84%) and intMin says the rounding happened. A SwiGLU block
// rounds twice, the second time its heavy-tailed activations
// silu(gate)*up, whose larger amax doubles the step: opTol bounds MLP and
// MoE (the tests see at most 1.8%).
const intTol, opTol, intMin = 1e-2, 3e-2, 1e-4

// quantData returns random valid blocks of dt for [rows, cols] and their
// exact values (quant.Dequantize).
func quantData(r *rand.Rand, dt backend.DType, rows, cols int, std float32) ([]byte, []float32) {
	data := quant.Random(dt, rows, cols, std, r.Uint64)
	return data, quant.Dequantize(dt, data, rows, cols)
}

// loadQuant loads random blocks of dt with shape (rows of the innermost
// dimension) and returns the weight, its values in float64 and the same
// values as an F32 weight.
func loadQuant(t *testing.T, b *Backend, r *rand.Rand, dt backend.DType, std float32, shape ...int) (w backend.Tensor, vals []float64, wf backend.Tensor) {
	t.Helper()
	cols := shape[len(shape)-1]
	rows := shapeSize(shape) / cols
	data, f := quantData(r, dt, rows, cols, std)
	w, err := b.Load(dt, shape, data)
	if err != nil {
		t.Fatal(err)
	}
	wf, err = b.Load(backend.F32, shape, asBytes(f))
	if err != nil {
		t.Fatal(err)
	}
	return w, toF64(f), wf
}

// relL2 returns |got-want| / |want| over all elements.
func relL2(got []float32, want []float64) float64 {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - w
		num += d * d
		den += w * w
	}
	return math.Sqrt(num / den)
}

// refQuantizeX returns x as the int8 path sees it: per block of blk, d =
// amax/127 and q = round-to-even(x*127/amax) in float32, value d*q.
func refQuantizeX(x []float32, blk int) []float64 {
	out := make([]float64, len(x))
	for b := 0; b < len(x); b += blk {
		var amax float32
		for _, v := range x[b : b+blk] {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		if amax == 0 {
			continue
		}
		d, id := amax/127, 127/amax
		for i, v := range x[b : b+blk] {
			out[b+i] = float64(d) * math.RoundToEven(float64(v*id))
		}
	}
	return out
}

// TestDequantize checks the backend's dequantization, whole rows and the
// partial blocks the panel packing asks for, against quant.DequantizeRow
// bit for bit.
func TestDequantize(t *testing.T) {
	r := newRand(60)
	for _, dt := range quantTypes {
		for _, cols := range quantWidths[dt] {
			const rows = 3
			data, want := quantData(r, dt, rows, cols, 0.5)
			// Random bytes everywhere (scales included) too, except FP8's
			// NaN codes.
			raw := make([]byte, len(data))
			for i := range raw {
				raw[i] = byte(r.Uint32())
			}
			if dt == backend.FP8 {
				for i := range raw {
					if i%132 >= 4 && raw[i]&0x7f == 0x7f {
						raw[i] = 0x7e
					}
				}
			}
			rawWant := quant.Dequantize(dt, raw, rows, cols)
			for _, c := range []struct {
				data []byte
				want []float32
			}{{data, want}, {raw, rawWant}} {
				w := weights{dt: dt, buf: c.data, rows: rows, cols: cols}
				got := make([]float32, rows*cols)
				w.decode(0, got)
				sameBits(t, fmt.Sprintf("%v cols %d decode", dt, cols), got, c.want)
				one := make([]float32, cols)
				w.decode(2, one)
				sameBits(t, fmt.Sprintf("%v cols %d decode row 2", dt, cols), one, c.want[2*cols:])
				e, bs := dt.Block()
				for _, n := range []int{1, 7, 16, 31, e - 1} {
					if n <= 0 || n > e || n > cols {
						continue
					}
					part := make([]float32, n)
					dequantBlock(dt, c.data[bs:2*bs], part)
					if cols >= 2*e {
						sameBits(t, fmt.Sprintf("%v block prefix %d", dt, n), part, c.want[e:e+n])
					}
				}
			}
		}
	}
}

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i, g := range got {
		if math.Float32bits(g) != math.Float32bits(want[i]) && !(g != g && want[i] != want[i]) {
			t.Fatalf("%s: element %d is %v, want %v", what, i, g, want[i])
		}
	}
}

// TestQuantMatMul runs MatMul on every quantized type, decode row counts
// 1..12 and prefill counts, against the product with the dequantized
// weights: within float32 summation error on the dequantizing paths (FP8,
// Q5_K, MXFP4; the int8 types on the portable kernels beyond decode), and
// on the int8 path exactly (to float error) the product with x rounded as
// the path rounds it, within intTol of the exact one.
func TestQuantMatMul(t *testing.T) {
	b := New(Options{Threads: 3})
	r := newRand(61)
	for _, dt := range quantTypes {
		for _, k := range quantWidths[dt] {
			o := 37
			if k >= 3072 {
				o = 67 // more rows than one task takes
			}
			w, wv, _ := loadQuant(t, b, r, dt, 0.5, o, k)
			ns := []int{1, 2, 3, 4, 5, 7, 8, 11, 12, 13, 30, 70}
			if k >= 3072 {
				ns = []int{1, 4, 12, 13, 25}
			}
			for _, n := range ns {
				for _, acc := range []bool{false, true} {
					xv, init := randVec(r, n*k, 1), randVec(r, n*o, 1)
					out := tensorF32(b, init, n, o)
					b.MatMul(out, tensorF32(b, xv, n, k), w, acc)
					got := readF32(t, b, out)
					addInit := func(want []float64) []float64 {
						if acc {
							for i := range want {
								want[i] += float64(float32(init[i]))
							}
						}
						return want
					}
					what := fmt.Sprintf("%v %dx%dx%d acc=%v", dt, n, k, o, acc)
					xf := toF64(toF32(xv))
					exact := addInit(refMatMul(xf, wv, n, k, o))
					if !intPath(dt) || n > quantDirectRows(dt) && n > directRows {
						compare(t, what, got, exact, 1e-5*math.Sqrt(float64(k)))
						continue
					}
					blk, _ := intDot(dt)
					xq := refQuantizeX(toF32(xv), blk)
					compare(t, what+" (x rounded)", got, addInit(refMatMul(xq, wv, n, k, o)), 1e-5*math.Sqrt(float64(k)))
					if acc {
						continue // the init values would hide the error
					}
					if e := relL2(got, exact); !(e < intTol && e > intMin) {
						t.Fatalf("%s: relative L2 error %.3g of the int8 path, want in (%g, %g)", what, e, intMin, intTol)
					}
				}
			}
		}
	}
}

// TestQuantOps runs MLP, MoE and Embed on quantized weights against the same
// ops on the dequantized F32 weights, decode and prefill, and a MatMul on
// Rows views of an expert stack.
func TestQuantOps(t *testing.T) {
	for _, dt := range quantTypes {
		t.Run(dt.String(), func(t *testing.T) {
			b := New(Options{Threads: 2})
			r := newRand(62)
			e, _ := dt.Block()
			H, I := max(e, 64), 2*max(e, 64) // whole blocks
			if dt == backend.FP8 {
				H, I = 200, 136
			}
			for _, T := range []int{1, 3, 12, 20, 70} {
				// Between the quantized and the F32 run: float error on
				// the dequantizing paths, opTol on the int8 path (which
				// MoE experts take with their few tokens each even where
				// the int8 types take panels beyond decode).
				// some: some products of the op may take the int8 path
				// (MoE's experts with few tokens), all: all do.
				check := func(what string, got, want []float32, some, all bool) {
					t.Helper()
					if intPath(dt) && some {
						lo := 0.0
						if all {
							lo = intMin
						}
						if err := relL2(got, toF64(want)); !(err < opTol && err >= lo) {
							t.Fatalf("%s T=%d: relative L2 error %.3g, want in [%g, %g)", what, T, err, lo, opTol)
						}
						return
					}
					compare(t, fmt.Sprintf("%s T=%d", what, T), got, toF64(want), 1e-5)
				}
				decode := T <= directRows || T <= quantDirectRows(dt)

				xv, init := randVec(r, T*H, 1), randVec(r, T*H, 1)
				x := tensorF32(b, xv, T, H)
				gu, _, guF := loadQuant(t, b, r, dt, 0.3, 2*I, H)
				down, _, downF := loadQuant(t, b, r, dt, 0.3, H, I)
				outQ, outF := tensorF32(b, init, T, H), tensorF32(b, init, T, H)
				b.MLP(outQ, x, gu, down)
				b.MLP(outF, x, guF, downF)
				check("mlp", readF32(t, b, outQ), readF32(t, b, outF), decode, decode)

				const E = 6
				router := loadWeight(t, b, backend.BF16, randVec(r, E*H, 0.5), E, H)
				egu, _, eguF := loadQuant(t, b, r, dt, 0.3, E, 2*I, H)
				edown, _, edownF := loadQuant(t, b, r, dt, 0.3, E, H, I)
				sgu, _, sguF := loadQuant(t, b, r, dt, 0.3, 2*I, H)
				sdown, _, sdownF := loadQuant(t, b, r, dt, 0.3, H, I)
				sgate := loadWeight(t, b, backend.F32, randVec(r, H, 0.5), 1, H)
				eq := &backend.Experts{Router: router, GateUp: egu, Down: edown, SharedGateUp: sgu, SharedDown: sdown, SharedGate: sgate}
				ef := &backend.Experts{Router: router, GateUp: eguF, Down: edownF, SharedGateUp: sguF, SharedDown: sdownF, SharedGate: sgate}
				spec := &backend.MoESpec{Experts: E, TopK: 2, NormTopK: true}
				outQ, outF = tensorF32(b, init, T, H), tensorF32(b, init, T, H)
				b.MoE(outQ, x, eq, spec)
				b.MoE(outF, x, ef, spec)
				check("moe", readF32(t, b, outQ), readF32(t, b, outF), true, decode)

				// One expert's gate/up rows through Rows (and Reshape) views.
				ex := b.Reshape(b.Rows(egu, 4, 1), 2*I, H)
				exF := b.Reshape(b.Rows(eguF, 4, 1), 2*I, H)
				half := b.Rows(ex, I, I)
				outQ, outF = b.Alloc(backend.F32, T, I), b.Alloc(backend.F32, T, I)
				b.MatMul(outQ, x, half, false)
				b.MatMul(outF, x, b.Rows(exF, I, I), false)
				check("expert view matmul", readF32(t, b, outQ), readF32(t, b, outF), decode, decode)

				// Embed dequantizes the looked-up rows exactly.
				const V = 40
				table, _, tableF := loadQuant(t, b, r, dt, 1, V, H)
				toks := make([]int32, T)
				for i := range toks {
					toks[i] = int32(r.IntN(V))
				}
				toks[0] = V - 1
				b.Begin(&backend.Batch{Tokens: toks, Seqs: []backend.SeqInfo{{N: T}}})
				embQ, embF := b.Alloc(backend.F32, T, H), b.Alloc(backend.F32, T, H)
				b.Embed(embQ, table)
				b.Embed(embF, tableF)
				sameBits(t, "embed", readF32(t, b, embQ), readF32(t, b, embF))
			}
		})
	}
}

// TestQuantTensors checks Load, views and their refusals on quantized
// tensors.
func TestQuantTensors(t *testing.T) {
	b := New(Options{})
	r := newRand(63)
	data := quant.Random(backend.Q4_K, 6*4, 512, 1, r.Uint64)
	if _, err := b.Load(backend.Q4_K, []int{6, 4, 512}, data[:len(data)-1]); err == nil {
		t.Error("Load accepted a short buffer")
	}
	if _, err := b.Load(backend.Q4_K, []int{6, 4 * 512}, data); err != nil {
		t.Errorf("Load of whole blocks: %v", err)
	}
	if _, err := b.Load(backend.Q4_K, []int{6 * 16, 128}, data); err == nil {
		t.Error("Load accepted Q4_K rows of 128")
	}
	if _, err := b.Load(backend.FP8, []int{3, 200}, make([]byte, 3*264)); err != nil {
		t.Errorf("Load of padded FP8 rows: %v", err)
	}
	w, err := b.Load(backend.Q4_K, []int{6, 4, 512}, data)
	if err != nil {
		t.Fatal(err)
	}
	rb := backend.Q4_K.RowBytes(512)
	v := b.Rows(w, 2, 3).(*Tensor)
	if len(v.buf) != 3*4*rb || &v.buf[0] != &data[2*4*rb] {
		t.Fatalf("Rows of an expert stack: %d bytes", len(v.buf))
	}
	flat := b.Reshape(v, 12, 512).(*Tensor)
	rows := b.Rows(flat, 5, 2).(*Tensor)
	if len(rows.buf) != 2*rb || &rows.buf[0] != &data[(8+5)*rb] {
		t.Fatal("Rows of a reshaped view")
	}
	for name, f := range map[string]func(){
		"reshape row width":  func() { b.Reshape(w, 6, 8, 256) },
		"rows of one row":    func() { b.Rows(b.Reshape(b.Rows(flat, 0, 1), 512), 0, 256) },
		"element size":       func() { backend.Q4_K.Size() },
		"alloc without rows": func() { b.Alloc(backend.Q8_0) },
	} {
		if !panics(f) {
			t.Errorf("%s did not panic", name)
		}
	}
	a := b.Alloc(backend.Q8_0, 2, 64).(*Tensor)
	if len(a.buf) != 2*2*34 {
		t.Errorf("Alloc of q8_0 [2, 64]: %d bytes", len(a.buf))
	}
}

// TestQuantKernels checks the assembly of the quantized dot kernels, one
// and four input rows, against the portable one-row kernels on random
// blocks (scales included, so every bit pattern of the quants and scales
// occurs) and quantized input rows with extreme quants: block counts 1..9
// and whole rows, weight row counts with and without a remainder, FP8 rows
// with a partial last block.
func TestQuantKernels(t *testing.T) {
	withAsm(t)
	r := newRand(64)
	randBytes := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		return b
	}
	type kern struct {
		dt     backend.DType
		one, g func(w []byte, rb int, x []byte, out []float32)
		four   func(w []byte, rb int, x []byte, xstride int, out []float32)
	}
	for _, k := range []kern{
		{backend.Q8_0, dotQ8_0, dotQ8_0Go, dotQ8_0x4},
		{backend.Q4_K, dotQ4K, dotQ4KGo, dotQ4Kx4},
		{backend.Q5_K, dotQ5K, dotQ5KGo, dotQ5Kx4},
		{backend.Q6_K, dotQ6K, dotQ6KGo, dotQ6Kx4},
		{backend.MXFP4, dotMXFP4, dotMXFP4Go, dotMXFP4x4},
	} {
		e, bs := k.dt.Block()
		blk, _ := intDot(k.dt)
		for _, nb := range []int{1, 2, 3, 4, 5, 8, 9, 3072 / e} {
			for _, rows := range []int{1, 2, 3, 7, 16} {
				cols := nb * e
				w := randBytes(rows * nb * bs)
				// Keep the f16 scales finite (random bytes may be NaN or Inf).
				for b := range rows * nb {
					switch k.dt {
					case backend.Q8_0:
						w[b*bs+1] &= 0x3b
					case backend.Q4_K, backend.Q5_K:
						w[b*bs+1] &= 0x3b
						w[b*bs+3] &= 0x3b
					case backend.MXFP4:
						w[b*bs] %= 200 // 2^71 at most: large products stay finite; 0 and 1 are subnormal
					case backend.Q6_K:
						w[b*bs+209] &= 0x3b
					}
				}
				// Eight input rows with a few large values, and extreme quants.
				xs := toF32(randVec(r, 8*cols, 1))
				xs[r.IntN(len(xs))] = 40
				qx := quantizeRows(xs, 8, cols, blk)
				if nb > 2 {
					for j := range 8 {
						_, q, _ := q8Block(qx.row(j), blk, 1)
						for i := range q {
							q[i] = -127
						}
						_, q, _ = q8Block(qx.row(j), blk, 2)
						for i := range q {
							q[i] = 127
						}
						quantSums(qx.row(j), blk)
					}
				}
				// The four-row kernel on rows 0-3 and 4-7; the eight-row one
				// on all.
				got, want, got4 := make([]float32, rows), make([]float32, rows), make([]float32, 8*rows)
				k.four(w, nb*bs, qx.buf, qx.stride, got4[:4*rows])
				k.four(w, nb*bs, qx.buf[4*qx.stride:], qx.stride, got4[4*rows:])
				var got8 []float32
				if k.dt == backend.Q4_K && dotQ4Kx8 != nil {
					got8 = make([]float32, 8*rows)
					dotQ4Kx8(w, nb*bs, qx.buf, qx.stride, got8)
				}
				// Q8_0's AVX-512 VNNI kernel, on the same quants in the pair
				// layout (an even number of blocks).
				var gotp []float32
				if k.dt == backend.Q8_0 && dotQ8_0x4Pairs != nil && nb%2 == 0 {
					stride := nb / 2 * q8PairBytes
					px := make([]byte, 4*stride)
					for j := range 4 {
						packPairs(px[j*stride:(j+1)*stride], qx.row(j))
					}
					gotp = make([]float32, 4*rows)
					dotQ8_0x4Pairs(w, nb*bs, px, stride, gotp)
				}
				for j := range 8 {
					k.one(w, nb*bs, qx.row(j), got)
					k.g(w, nb*bs, qx.row(j), want)
					terms := make([]float64, rows)
					for i := range rows {
						terms[i] = absTerms(k.dt, w[i*nb*bs:(i+1)*nb*bs], qx.row(j), cols)
					}
					what := fmt.Sprintf("%v kernel nb=%d rows=%d input %d", k.dt, nb, rows, j)
					compareTerms(t, what, got, want, terms)
					for i := range got {
						got[i] = got4[(j/4)*4*rows+i*4+j%4]
					}
					compareTerms(t, what+" (x4)", got, want, terms)
					if got8 != nil {
						for i := range got {
							got[i] = got8[i*8+j]
						}
						compareTerms(t, what+" (x8)", got, want, terms)
					}
					if gotp != nil && j < 4 {
						for i := range got {
							got[i] = gotp[i*4+j]
						}
						compareTerms(t, what+" (pairs)", got, want, terms)
					}
				}
				q8Pool.Put(qx)
			}
		}
	}
	for _, cols := range []int{128, 256, 200, 1000, 3072, 3100} {
		for _, rows := range []int{1, 2, 5} {
			rb := backend.FP8.RowBytes(cols)
			w := randBytes(rows * rb)
			for i := range w {
				if i%rb%132 >= 4 && w[i]&0x7f == 0x7f {
					w[i] = 0x7e // NaN codes: the assembly reads ±480
				}
			}
			for r := range rows {
				for b := 0; b < rb; b += 132 {
					copy(w[r*rb+b:], asBytes([]float32{float32(1 + r + b/132)}))
				}
			}
			x := toF32(randVec(r, 4*cols, 1))
			// The kernels sum in other orders than the Go loop: measured
			// against the sum of the terms' magnitudes, the weights with
			// their sign bits cleared (the scales are positive).
			wabs := slices.Clone(w)
			for i := range wabs {
				if i%rb%132 >= 4 {
					wabs[i] &= 0x7f
				}
			}
			got, want, got4 := make([]float32, rows), make([]float32, rows), make([]float32, 4*rows)
			mag, terms := make([]float32, rows), make([]float64, rows)
			dotFP8x4(w, rb, x, cols, got4)
			for j := range 4 {
				xj := x[j*cols : (j+1)*cols]
				dotFP8(w, rb, xj, got)
				fp8Tail(w, rb, rows, xj, got, 1)
				dotFP8Go(w, rb, xj, want)
				fp8Tail(w, rb, rows, xj, want, 1)
				fp8Tail(w, rb, rows, xj, got4[j:], 4)
				xa := make([]float32, cols)
				for i, v := range xj {
					xa[i] = float32(math.Abs(float64(v)))
				}
				dotFP8Go(wabs, rb, xa, mag)
				fp8Tail(wabs, rb, rows, xa, mag, 1)
				for i, m := range mag {
					terms[i] = float64(m)
				}
				what := fmt.Sprintf("fp8 kernel cols=%d rows=%d input %d", cols, rows, j)
				compareTerms(t, what, got, want, terms)
				for i := range got {
					got[i] = got4[i*4+j]
				}
				compareTerms(t, what+" (x4)", got, want, terms)
			}
		}
	}
}

// TestQuantizeRows checks the assembly quantizer of input rows against the
// portable one bit for bit, zero and NaN blocks included.
func TestQuantizeRows(t *testing.T) {
	withAsm(t)
	r := newRand(65)
	for _, blk := range []int{32, 256} {
		for _, nb := range []int{1, 2, 3, 12} {
			x := toF32(randVec(r, nb*blk, 3))
			x[r.IntN(len(x))] = 1e4
			if nb > 1 {
				clear(x[blk : 2*blk]) // a zero block
			}
			if nb > 2 {
				x[2*blk+5] = float32(math.NaN())
			}
			for i := range x[:blk] {
				if i%3 == 0 {
					x[i] = float32(i%7) * 0.5
				}
			}
			got, want := make([]byte, nb*q8Bytes(blk)), make([]byte, nb*q8Bytes(blk))
			for i := range got {
				got[i], want[i] = 0xa5, 0x5a // every byte is written
			}
			quantizeRow(x, blk, got)
			quantizeRowGo(x, blk, want)
			for b := range nb {
				d1, q1, s1 := q8Block(got, blk, b)
				d2, q2, s2 := q8Block(want, blk, b)
				what := fmt.Sprintf("quantize blk=%d nb=%d block %d", blk, nb, b)
				sameBits(t, what+" scale", []float32{d1}, []float32{d2})
				for i := range q1 {
					if q1[i] != q2[i] {
						t.Fatalf("%s: quant %d is %d, want %d", what, i, q1[i], q2[i])
					}
				}
				for i := range s1 {
					if s1[i] != s2[i] {
						t.Fatalf("%s: sum %d is %d, want %d", what, i, s1[i], s2[i])
					}
				}
			}
		}
	}
}

// quantSums recomputes the 16-sums of a quantized input row (blocks of
// 256) after its quants changed.
func quantSums(x []byte, blk int) {
	if blk != 256 {
		return
	}
	for b := range len(x) / q8Bytes(blk) {
		_, q, sums := q8Block(x, blk, b)
		for g := range sums {
			var s int16
			for _, v := range q[g*16 : g*16+16] {
				s += int16(v)
			}
			sums[g] = s
		}
	}
}

// absTerms returns the sum of the magnitudes of the products a kernel sums
// for one weight row w of cols elements and one quantized input row x: the
// kernels sum them in different orders (the assembly in int32 lanes
// converted to float before they are added), so this bounds their
// difference. A K-quant weight is a difference (d*sc*q - dmin*m for Q4_K
// and Q5_K, d*sc*q - 32*d*sc for Q6_K) whose two parts are summed apart.
func absTerms(dt backend.DType, w, x []byte, cols int) float64 {
	blk, _ := intDot(dt)
	_, bs := dt.Block()
	deq := func(w []byte) []float32 {
		f := make([]float32, cols)
		quant.DequantizeRow(dt, w, f)
		return f
	}
	a, b := deq(w), make([]float32, cols)
	zero := func(off, n int) []float32 { // w with bytes [off, off+n) of each block zeroed
		z := append([]byte(nil), w...)
		for o := 0; o < len(z); o += bs {
			clear(z[o+off : o+off+n])
		}
		return deq(z)
	}
	switch dt {
	case backend.Q4_K, backend.Q5_K:
		a, b = zero(2, 2), zero(0, 2) // dmin zero: d*sc*q; d zero: -dmin*m
	case backend.Q6_K:
		b = zero(0, 192) // quants zero: -32*d*sc
		for i := range a {
			a[i] -= b[i]
		}
	}
	var sum float64
	for i := range a {
		d, q, _ := q8Block(x, blk, i/blk)
		sum += (math.Abs(float64(a[i])) + math.Abs(float64(b[i]))) * math.Abs(float64(d)*float64(q[i%blk]))
	}
	return sum
}

// compareTerms checks got against want within 1e-5 of the sum of the
// magnitudes of the products each is a sum of.
func compareTerms(t *testing.T, what string, got, want []float32, terms []float64) {
	t.Helper()
	for i := range got {
		if d := math.Abs(float64(got[i]) - float64(want[i])); !(d <= 1e-5*terms[i]) {
			t.Fatalf("%s: element %d is %v, want %v (terms' magnitudes %.4g)", what, i, got[i], want[i], terms[i])
		}
	}
}

// TestQuantMoEMixed runs a MoE layer whose experts mix quantized types, at
// the shapes of a 256-wide Qwen3-MoE Q4_K_M file (gate/up Q4_K, down Q6_K
// in one layer, Q4_K in another), against the dequantized F32 experts.
func TestQuantMoEMixed(t *testing.T) {
	b := New(Options{Threads: 2})
	r := newRand(66)
	const E, H, I = 8, 256, 256
	for _, down := range []backend.DType{backend.Q6_K, backend.Q4_K} {
		for _, T := range []int{1, 5, 16, 40} {
			x := tensorF32(b, randVec(r, T*H, 1), T, H)
			router := loadWeight(t, b, backend.F32, randVec(r, E*H, 0.5), E, H)
			gu, _, guF := loadQuant(t, b, r, backend.Q4_K, 0.3, E, 2*I, H)
			dn, _, dnF := loadQuant(t, b, r, down, 0.3, E, H, I)
			spec := &backend.MoESpec{Experts: E, TopK: 2, NormTopK: true}
			outQ, outF := b.Alloc(backend.F32, T, H), b.Alloc(backend.F32, T, H)
			b.MoE(outQ, x, &backend.Experts{Router: router, GateUp: gu, Down: dn}, spec)
			b.MoE(outF, x, &backend.Experts{Router: router, GateUp: guF, Down: dnF}, spec)
			got, want := readF32(t, b, outQ), readF32(t, b, outF)
			if e := relL2(got, toF64(want)); !(e < opTol) {
				t.Fatalf("down %v, T=%d: relative L2 error %.3g, want below %g", down, T, e, opTol)
			}
		}
	}
}
