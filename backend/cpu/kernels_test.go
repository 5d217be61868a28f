package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/kiln-llm/kiln/backend"
)

// kernelSets lists the kernel implementations available on this machine.
func kernelSets() map[string]func() {
	sets := map[string]func(){"go": func() {
		dotF32, dotBF16, dot4xBF16, axpy, axpyBF16, gemm6x16 = dotF32Go, dotBF16Go, dot4xBF16Go, axpyGo, axpyBF16Go, gemm6x16Go
		dotRowsF32, dotRowsBF16, axpyRowsF32, axpyRowsBF16 = dotRowsGo[float32], dotRowsGo[uint16], axpyRowsGo[float32], axpyRowsGo[uint16]
		scaleAxpy, expShift = scaleAxpyGo, expShiftGo
		sumSquares, scaleMul, siluMulRow, maxF32 = sumSquaresGo, scaleMulGo, siluMulGo, maxF32Go
		dot2RowsF32, dot2RowsBF16, axpy2RowsF32, axpy2RowsBF16 = dot2RowsGo[float32], dot2RowsGo[uint16], axpy2RowsGo[float32], axpy2RowsGo[uint16]
		quantizeRow, dotQ8_0, dotQ4K, dotQ6K, dotFP8 = quantizeRowGo, dotQ8_0Go, dotQ4KGo, dotQ6KGo, dotFP8Go
		dotQ8_0x4, dotQ4Kx4, dotQ6Kx4, dotFP8x4 = dotQx4Go(dotQ8_0Go), dotQx4Go(dotQ4KGo), dotQx4Go(dotQ6KGo), dotFP8x4Go
		dotQ5K, dotQ5Kx4, dotMXFP4, dotMXFP4x4 = dotQ5KGo, dotQx4Go(dotQ5KGo), dotMXFP4Go, dotQx4Go(dotMXFP4Go)
		intDotKernels, dotQ8_0x4Pairs, packHalf = false, nil, nil
	}}
	if asm, ok := asmKernels(); ok {
		sets["asm"] = asm
	}
	return sets
}

// TestKernels checks every kernel of every implementation against float64
// on lengths with and without a tail, and then runs the ops tests on the
// portable kernels too.
func TestKernels(t *testing.T) {
	r := newRand(50)
	restore := saveKernels()
	defer restore()
	for name, use := range kernelSets() {
		use()
		for _, n := range []int{0, 1, 7, 8, 9, 16, 17, 33, 128, 1027} {
			x, y := randVec(r, n, 1), randVec(r, 4*n, 1)
			yb := make([]uint16, 4*n)
			for i := range y {
				yb[i] = backend.BF16Bits(float32(y[i]))
				y[i] = float64(backend.BF16ToF32(yb[i]))
			}
			xf, yf := toF32(x), toF32(y)
			tol := 1e-5 * math.Sqrt(float64(n+1))
			want := refMatMul(x, y, 1, n, 4)
			compare(t, fmt.Sprintf("%s dotF32 n=%d", name, n), []float32{dotF32(xf, yf)}, want[:1], tol)
			compare(t, fmt.Sprintf("%s dotBF16 n=%d", name, n), []float32{dotBF16(xf, yb)}, want[:1], tol)
			// One bf16 row (x's first n values rounded) against the four rows of y.
			xb := make([]uint16, n)
			xr := make([]float64, n)
			for i := range xb {
				xb[i] = backend.BF16Bits(float32(x[i]))
				xr[i] = float64(backend.BF16ToF32(xb[i]))
			}
			got4 := make([]float32, 4)
			dot4xBF16(xb, yf, got4)
			compare(t, fmt.Sprintf("%s dot4xBF16 n=%d", name, n), got4, refMatMul(xr, y, 1, n, 4), tol)

			acc := toF32(randVec(r, n, 1))
			wantAxpy := make([]float64, n)
			for i := range n {
				wantAxpy[i] = float64(acc[i]) + 0.75*y[i]
			}
			acc2 := append([]float32(nil), acc...)
			axpy(acc, 0.75, yf)
			compare(t, fmt.Sprintf("%s axpy n=%d", name, n), acc, wantAxpy, 1e-6)
			axpyBF16(acc2, 0.75, yb)
			compare(t, fmt.Sprintf("%s axpyBF16 n=%d", name, n), acc2, wantAxpy, 1e-6)
			acc3 := toF32(x)
			scaleAxpy(acc3, -0.5, 0.75, yf)
			for i := range n {
				wantAxpy[i] = -0.5*float64(float32(x[i])) + 0.75*y[i]
			}
			compare(t, fmt.Sprintf("%s scaleAxpy n=%d", name, n), acc3, wantAxpy, 1e-6)

			ex := toF32(randVec(r, n, 30))
			m := float32(0)
			for _, v := range ex {
				m = max(m, v)
			}
			wantExp := make([]float64, n)
			var wantSum float64
			for i, v := range ex {
				wantExp[i] = math.Exp(float64(v - m))
				wantSum += wantExp[i]
			}
			gotSum := expShift(ex, m)
			compare(t, fmt.Sprintf("%s expShift n=%d", name, n), ex, wantExp, 1e-6)
			compare(t, fmt.Sprintf("%s expShift sum n=%d", name, n), []float32{gotSum}, []float64{wantSum}, 1e-6)

			mx := toF32(randVec(r, n, 3))
			wantMax := math.Inf(-1)
			for _, v := range mx {
				wantMax = max(wantMax, float64(v))
			}
			if got := maxF32(mx); float64(got) != wantMax {
				t.Fatalf("%s maxF32 n=%d: %v, want %v", name, n, got, wantMax)
			}
			sq := toF32(randVec(r, n, 3))
			var wantSq float64
			for _, v := range sq {
				wantSq += float64(v) * float64(v)
			}
			compare(t, fmt.Sprintf("%s sumSquares n=%d", name, n), []float32{float32(sumSquares(sq))}, []float64{wantSq}, 1e-6)
			w := toF32(randVec(r, n, 1))
			got := make([]float32, n)
			scaleMul(got, sq, w, 0.3)
			for i := range got {
				if want := sq[i] * 0.3 * w[i]; got[i] != want {
					t.Fatalf("%s scaleMul n=%d: [%d] = %g, want %g", name, n, i, got[i], want)
				}
			}
			g, u := toF32(randVec(r, n, 6)), toF32(randVec(r, n, 1))
			if n > 2 {
				g[0], g[1], g[2] = -100, 100, 0 // exp(-g) past float32's range, and past the clamp
			}
			wantSilu := make([]float64, n)
			for i := range n {
				x := float64(g[i])
				wantSilu[i] = x / (1 + math.Exp(-x)) * float64(u[i])
			}
			siluMulRow(got, g, u)
			compare(t, fmt.Sprintf("%s siluMulRow n=%d", name, n), got, wantSilu, 1e-6)

			// c's rows 19 apart: the kernel writes 16 of each and leaves
			// the 3 between as they were (12345).
			a, b := randVec(r, 6*(n+3), 1), randVec(r, 16*n, 1)
			c := make([]float32, 6*19)
			for i := range c {
				c[i] = 12345
			}
			gemm6x16(toF32(a), n+3, toF32(b), n, c, 19)
			wantC := make([]float64, 6*19)
			for i := range 6 {
				for j := range 16 {
					for p := range n {
						wantC[i*19+j] += float64(float32(a[i*(n+3)+p])) * float64(float32(b[p*16+j]))
					}
				}
				for j := 16; j < 19; j++ {
					wantC[i*19+j] = 12345
				}
			}
			compare(t, fmt.Sprintf("%s gemm6x16 k=%d", name, n), c, wantC, tol)
		}
		for _, hd := range []int{8, 16, 32, 64, 128} {
			for _, rows := range []int{1, 2, 4, 5, 9, 16} {
				const stride = 300
				q, kv := randVec(r, hd, 1), randVec(r, (rows-1)*stride+hd, 1)
				kb := make([]uint16, len(kv))
				for i := range kv {
					kb[i] = backend.BF16Bits(float32(kv[i]))
					kv[i] = float64(backend.BF16ToF32(kb[i]))
				}
				p := randVec(r, rows, 1)
				wantDot, wantAxpy := make([]float64, rows), make([]float64, hd)
				for row := range rows {
					for d := range hd {
						wantDot[row] += float64(float32(q[d])) * kv[row*stride+d]
						wantAxpy[d] += float64(float32(p[row])) * kv[row*stride+d]
					}
				}
				what := fmt.Sprintf("%s hd=%d rows=%d", name, hd, rows)
				got := make([]float32, rows)
				dotRowsF32(toF32(q), toF32(kv), stride, got)
				compare(t, what+" dotRowsF32", got, wantDot, 1e-5)
				dotRowsBF16(toF32(q), kb, stride, got)
				compare(t, what+" dotRowsBF16", got, wantDot, 1e-5)
				acc := make([]float32, hd)
				axpyRowsF32(acc, toF32(p), toF32(kv), stride)
				compare(t, what+" axpyRowsF32", acc, wantAxpy, 1e-5)
				acc = make([]float32, hd)
				axpyRowsBF16(acc, toF32(p), kb, stride)
				compare(t, what+" axpyRowsBF16", acc, wantAxpy, 1e-5)

				// Two heads: q2 and p2 hold a second head after the
				// first, whose scores sit 37 floats after its own.
				q2, p2 := randVec(r, 2*hd, 1), randVec(r, rows+37, 1)
				want2Dot, want2Axpy := make([]float64, 2*rows), make([]float64, 2*hd)
				for h := range 2 {
					for row := range rows {
						for d := range hd {
							want2Dot[h*rows+row] += 0.125 * float64(float32(q2[h*hd+d])) * kv[row*stride+d]
							want2Axpy[h*hd+d] += float64(float32(p2[h*37+row])) * kv[row*stride+d]
						}
					}
				}
				scores := make([]float32, 37+rows)
				for _, k := range []struct {
					name string
					dot  func(q []float32, scores []float32)
					axpy func(acc, p []float32)
				}{
					{"F32", func(q, s []float32) { dot2RowsF32(q, toF32(kv), stride, 0.125, s[:rows], s[37:]) },
						func(acc, p []float32) { axpy2RowsF32(acc, p[:rows], p[37:], toF32(kv), stride) }},
					{"BF16", func(q, s []float32) { dot2RowsBF16(q, kb, stride, 0.125, s[:rows], s[37:]) },
						func(acc, p []float32) { axpy2RowsBF16(acc, p[:rows], p[37:], kb, stride) }},
				} {
					k.dot(toF32(q2), scores)
					compare(t, what+" dot2Rows"+k.name, append(scores[:rows:rows], scores[37:37+rows]...), want2Dot, 1e-5)
					acc := make([]float32, 2*hd)
					k.axpy(acc, toF32(p2))
					compare(t, what+" axpy2Rows"+k.name, acc, want2Axpy, 1e-5)
				}
			}
		}
		t.Run(name+"/MatMul", TestMatMul)
		t.Run(name+"/Attention", TestAttention)
		t.Run(name+"/AttentionLongPrefill", TestAttentionLongPrefill)
		t.Run(name+"/DeltaNet", TestDeltaNetPaths)
		t.Run(name+"/QuantMatMul", TestQuantMatMul)
		t.Run(name+"/QuantOps", TestQuantOps)
	}
}

// withAsm installs the assembly kernels for the rest of the test, which
// it skips where there are none.
func withAsm(t *testing.T) {
	asm, ok := asmKernels()
	if !ok {
		t.Skip("no assembly kernels on this machine")
	}
	t.Cleanup(saveKernels())
	asm()
}

func saveKernels() func() {
	a, b, c, d, e, f := dotF32, dotBF16, dot4xBF16, axpy, axpyBF16, gemm6x16
	g, h, i, j, k, l := dotRowsF32, dotRowsBF16, axpyRowsF32, axpyRowsBF16, scaleAxpy, expShift
	m, n, o, p, q := quantizeRow, dotQ8_0, dotQ4K, dotQ6K, dotFP8
	r, u, v, x, y := dotQ8_0x4, dotQ4Kx4, dotQ6Kx4, dotFP8x4, intDotKernels
	z1, z2, z3, z4 := dotQ5K, dotQ5Kx4, dotMXFP4, dotMXFP4x4
	z5, z6, z7, z12 := sumSquares, scaleMul, siluMulRow, maxF32
	z8, z9, z10, z11 := dot2RowsF32, dot2RowsBF16, axpy2RowsF32, axpy2RowsBF16
	z13, z14, z15 := dotQ8_0x4Pairs, packHalf, dotQ4Kx8
	return func() {
		dotQ8_0x4Pairs, packHalf, dotQ4Kx8 = z13, z14, z15
		sumSquares, scaleMul, siluMulRow, maxF32 = z5, z6, z7, z12
		dot2RowsF32, dot2RowsBF16, axpy2RowsF32, axpy2RowsBF16 = z8, z9, z10, z11
		dotF32, dotBF16, dot4xBF16, axpy, axpyBF16, gemm6x16 = a, b, c, d, e, f
		dotRowsF32, dotRowsBF16, axpyRowsF32, axpyRowsBF16, scaleAxpy, expShift = g, h, i, j, k, l
		quantizeRow, dotQ8_0, dotQ4K, dotQ6K, dotFP8 = m, n, o, p, q
		dotQ8_0x4, dotQ4Kx4, dotQ6Kx4, dotFP8x4, intDotKernels = r, u, v, x, y
		dotQ5K, dotQ5Kx4, dotMXFP4, dotMXFP4x4 = z1, z2, z3, z4
	}
}

func TestExpf(t *testing.T) {
	worst := 0.0
	for x := -100.0; x < 88.7; x += 0.001 { // e^88.73 overflows float32
		got, want := float64(expf(float32(x))), math.Exp(float64(float32(x)))
		if want < 1e-37 { // below the normal range only absolute accuracy counts
			if math.Abs(got-want) > 1e-44 {
				t.Fatalf("expf(%v) = %v, want %v", x, got, want)
			}
			continue
		}
		worst = max(worst, math.Abs(got-want)/want)
	}
	if worst > 4e-7 {
		t.Fatalf("expf relative error %v", worst)
	}
	if !math.IsInf(float64(expf(float32(math.Inf(1)))), 1) || expf(float32(math.Inf(-1))) != 0 || !math.IsNaN(float64(expf(float32(math.NaN())))) {
		t.Error("expf special values")
	}
}

// TestPackHalf checks the assembly packing of bf16 and f16 weight rows
// into a panel against the conversion element by element: every finite
// bit pattern (NaNs left out: the conversion may quiet them), subnormal
// f16 included.
func TestPackHalf(t *testing.T) {
	withAsm(t)
	if packHalf == nil {
		t.Skip("no AVX-512 here: the portable loop packs")
	}
	r := newRand(70)
	for _, bf16 := range []bool{true, false} {
		for _, k := range []int{16, 48, 1024} {
			w := make([]uint16, 16*k)
			for i := range w {
				v := uint16(r.Uint32())
				if bf16 && v&0x7f80 == 0x7f80 || !bf16 && v&0x7c00 == 0x7c00 {
					v &^= 0x4000 // not Inf or NaN
				}
				w[i] = v
			}
			got := make([]float32, 16*k)
			packHalf(bf16, w, k, got)
			for p := range k {
				for j := range 16 {
					want := backend.F16ToF32(w[j*k+p])
					if bf16 {
						want = backend.BF16ToF32(w[j*k+p])
					}
					if g := got[p*16+j]; math.Float32bits(g) != math.Float32bits(want) {
						t.Fatalf("bf16 %v k %d: panel[%d][%d] = %g, want %g (bits %#04x)", bf16, k, p, j, g, want, w[j*k+p])
					}
				}
			}
		}
	}
}
