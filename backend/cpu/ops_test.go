package cpu

import (
	"fmt"
	"math"
	"syscall"
	"testing"
	"unsafe"

	"github.com/kiln-llm/kiln/backend"
)

var weightTypes = []backend.DType{backend.F32, backend.BF16, backend.F16}

func refMatMul(x, w []float64, n, k, o int) []float64 {
	out := make([]float64, n*o)
	for i := range n {
		for j := range o {
			var s float64
			for c := range k {
				s += x[i*k+c] * w[j*k+c]
			}
			out[i*o+j] = s
		}
	}
	return out
}

func TestMatMul(t *testing.T) {
	b := New(Options{Threads: 3})
	r := newRand(1)
	for _, dt := range weightTypes {
		for _, sz := range [][3]int{{1, 37, 19}, {3, 130, 33}, {4, 64, 40}, {5, 71, 21}, {70, 33, 50}, {130, 129, 7}, {200, 1030, 37}} {
			n, k, o := sz[0], sz[1], sz[2]
			for _, acc := range []bool{false, true} {
				t.Run(fmt.Sprintf("%v/%dx%dx%d/acc=%v", dt, n, k, o, acc), func(t *testing.T) {
					xv, wv, init := randVec(r, n*k, 1), randVec(r, o*k, 1), randVec(r, n*o, 1)
					w := loadWeight(t, b, dt, wv, o, k)
					x := tensorF32(b, xv, n, k)
					out := tensorF32(b, init, n, o)
					b.MatMul(out, x, w, acc)
					want := refMatMul(xv, wv, n, k, o)
					if acc {
						for i := range want {
							want[i] += float64(float32(init[i]))
						}
					}
					compare(t, "matmul", readF32(t, b, out), want, 1e-5*math.Sqrt(float64(k)))
				})
			}
		}
	}
}

// TestMatMulTiles runs TestMatMul with tiles of a few rows.
func TestMatMulTiles(t *testing.T) {
	defer func(v int) { tileBytes = v }(tileBytes)
	tileBytes = 1 << 12
	TestMatMul(t)
}

// readOnlyBytes returns n bytes filled by fill and then made read-only, so
// that any write through them faults.
func readOnlyBytes(t *testing.T, n int, fill func([]byte)) []byte {
	t.Helper()
	mem, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skip("mmap:", err)
	}
	t.Cleanup(func() { syscall.Munmap(mem) })
	fill(mem)
	if err := syscall.Mprotect(mem, syscall.PROT_READ); err != nil {
		t.Skip("mprotect:", err)
	}
	return mem
}

// TestLoadInPlace checks that Load keeps the caller's bytes (no copy) and
// that operations read weights from read-only memory without writing it.
func TestLoadInPlace(t *testing.T) {
	b := New(Options{})
	r := newRand(2)
	const V, H = 50, 24
	wv := randVec(r, V*H, 1)
	h := make([]uint16, V*H)
	for i := range h {
		h[i] = backend.BF16Bits(float32(wv[i]))
		wv[i] = float64(backend.BF16ToF32(h[i]))
	}
	data := readOnlyBytes(t, len(h)*2, func(m []byte) { copy(m, asBytes(h)) })
	w, err := b.Load(backend.BF16, []int{V, H}, data[:V*H*2])
	if err != nil {
		t.Fatal(err)
	}
	if unsafe.SliceData(w.(*Tensor).buf) != unsafe.SliceData(data) {
		t.Fatal("Load copied the data")
	}
	b.Begin(&backend.Batch{Tokens: []int32{3, 49, 0}, Seqs: []backend.SeqInfo{{N: 3}}})
	emb := b.Alloc(backend.F32, 3, H)
	b.Embed(emb, w)
	got := readF32(t, b, emb)
	for i, tok := range []int{3, 49, 0} {
		compare(t, "embed", got[i*H:(i+1)*H], wv[tok*H:(tok+1)*H], 0)
	}
	logits := b.Alloc(backend.F32, 3, V)
	b.MatMul(logits, emb, w, false)
	compare(t, "tied lm head", readF32(t, b, logits), refMatMul(toF64(got), wv, 3, H, V), 1e-5)

	if _, err := b.Load(backend.BF16, []int{V, H}, data[:10]); err == nil {
		t.Error("Load accepted a short buffer")
	}
	if _, err := b.Load(backend.I32, []int{2}, make([]byte, 8)); err == nil {
		t.Error("Load accepted an i32 weight")
	}
}

func TestViews(t *testing.T) {
	b := New(Options{})
	x := tensorF32(b, []float64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 4, 3)
	rows := b.Rows(x, 1, 2)
	if s := rows.Shape(); len(s) != 2 || s[0] != 2 || s[1] != 3 {
		t.Fatalf("rows shape %v", s)
	}
	compare(t, "rows", readF32(t, b, rows), []float64{3, 4, 5, 6, 7, 8}, 0)
	flat := b.Reshape(rows, 6)
	b.Write(flat, asBytes([]float32{-1, -2, -3, -4, -5, -6}))
	compare(t, "write through view", readF32(t, b, x), []float64{0, 1, 2, -1, -2, -3, -4, -5, -6, 9, 10, 11}, 0)
	for name, f := range map[string]func(){
		"rows out of range": func() { b.Rows(x, 3, 2) },
		"reshape size":      func() { b.Reshape(x, 5, 2) },
		"free view":         func() { b.Free(rows) },
	} {
		if !panics(f) {
			t.Errorf("%s did not panic", name)
		}
	}
}

func panics(f func()) (p bool) {
	defer func() { p = recover() != nil }()
	f()
	return false
}

func TestRMSNorm(t *testing.T) {
	b := New(Options{})
	r := newRand(3)
	const N, H = 5, 48
	for _, unit := range []bool{false, true} {
		for _, alias := range []bool{false, true} {
			xv, wv := randVec(r, N*H, 2), randVec(r, H, 0.3)
			x := tensorF32(b, xv, N, H)
			w := loadWeight(t, b, backend.BF16, wv, H)
			out := x
			if !alias {
				out = b.Alloc(backend.F32, N, H)
			}
			b.RMSNorm(out, x, w, 1e-6, unit)
			want := make([]float64, N*H)
			for i := range N {
				row := xv[i*H : (i+1)*H]
				var ss float64
				for _, v := range row {
					ss += float64(float32(v)) * float64(float32(v))
				}
				s := 1 / math.Sqrt(ss/H+1e-6)
				for j, v := range row {
					g := wv[j]
					if unit {
						g++
					}
					want[i*H+j] = float64(float32(v)) * s * g
				}
			}
			compare(t, fmt.Sprintf("rmsnorm unit=%v alias=%v", unit, alias), readF32(t, b, out), want, 1e-6)
		}
	}
}

func sig64(x float64) float64  { return 1 / (1 + math.Exp(-x)) }
func silu64(x float64) float64 { return x * sig64(x) }

func TestMLP(t *testing.T) {
	b := New(Options{Threads: 3})
	r := newRand(4)
	const N, H, I = 7, 24, 33
	xv, guv, dv, init := randVec(r, N*H, 1), randVec(r, 2*I*H, 0.3), randVec(r, H*I, 0.3), randVec(r, N*H, 1)
	out := tensorF32(b, init, N, H)
	b.MLP(out, tensorF32(b, xv, N, H), loadWeight(t, b, backend.F32, guv, 2*I, H), loadWeight(t, b, backend.F32, dv, H, I))
	gu := refMatMul(xv, guv, N, H, 2*I)
	act := make([]float64, N*I)
	for n := range N {
		for i := range I {
			act[n*I+i] = silu64(gu[n*2*I+i]) * gu[n*2*I+I+i]
		}
	}
	want := refMatMul(act, dv, N, I, H)
	for i := range want {
		want[i] += float64(float32(init[i]))
	}
	compare(t, "mlp", readF32(t, b, out), want, 1e-5)
}

func TestGatedRMSNorm(t *testing.T) {
	b := New(Options{})
	r := newRand(5)
	const N, heads, dim = 4, 3, 16
	xv, zv, wv := randVec(r, N*heads*dim, 1), randVec(r, N*heads*dim, 2), randVec(r, dim, 1)
	out := b.Alloc(backend.F32, N, heads*dim)
	b.GatedRMSNorm(out, tensorF32(b, xv, N, heads*dim), tensorF32(b, zv, N, heads*dim), loadWeight(t, b, backend.F32, wv, dim), 1e-6)
	want := make([]float64, len(xv))
	for h := range N * heads {
		x := toF64(toF32(xv[h*dim : (h+1)*dim]))
		var ss float64
		for _, v := range x {
			ss += v * v
		}
		s := 1 / math.Sqrt(ss/dim+1e-6)
		for i, v := range x {
			want[h*dim+i] = wv[i] * v * s * silu64(float64(float32(zv[h*dim+i])))
		}
	}
	compare(t, "gated rmsnorm", readF32(t, b, out), want, 1e-6)
}

// TestMulSigmoid gates a gated attention layer's output by its gate,
// parted from the q projection per head by SliceCols, against float64.
func TestMulSigmoid(t *testing.T) {
	b := New(Options{Threads: 2})
	r := newRand(6)
	const T, H, hd = 5, 3, 8
	qg, ov := randVec(r, T*H*2*hd, 2), randVec(r, T*H*hd, 1)
	heads := b.Reshape(tensorF32(b, qg, T, H*2*hd), T*H, 2*hd) // per head [query | gate]
	gate, query := b.Alloc(backend.F32, T, H*hd), b.Alloc(backend.F32, T, H*hd)
	b.SliceCols(b.Reshape(gate, T*H, hd), heads, hd)
	b.SliceCols(b.Reshape(query, T*H, hd), heads, 0)
	o := tensorF32(b, ov, T, H*hd)
	b.MulSigmoid(o, gate)
	want, wantQ := make([]float64, T*H*hd), make([]float64, T*H*hd)
	for i := range want {
		h, d := i/hd, i%hd
		wantQ[i] = float64(float32(qg[h*2*hd+d]))
		want[i] = float64(float32(ov[i])) * sig64(float64(float32(qg[h*2*hd+hd+d])))
	}
	compare(t, "slice cols", readF32(t, b, query), wantQ, 0)
	compare(t, "mul sigmoid", readF32(t, b, o), want, 1e-6)
	if !panics(func() { b.SliceCols(b.Reshape(query, T*H, hd), heads, hd+1) }) {
		t.Error("SliceCols accepted columns past the end of x")
	}
}

func TestGatherRows(t *testing.T) {
	b := New(Options{})
	b.Begin(&backend.Batch{Tokens: make([]int32, 4), Seqs: []backend.SeqInfo{{N: 3}, {N: 1}}, LogitRows: []int32{0, 2, 3}})
	x := tensorF32(b, []float64{0, 1, 10, 11, 20, 21, 30, 31}, 4, 2)
	out := b.Alloc(backend.F32, 3, 2)
	b.GatherRows(out, x)
	compare(t, "gather", readF32(t, b, out), []float64{0, 1, 20, 21, 30, 31}, 0)
	if !panics(func() { b.Begin(&backend.Batch{Tokens: make([]int32, 2), Seqs: []backend.SeqInfo{{N: 3}}}) }) {
		t.Error("Begin accepted sequences covering more tokens than the batch")
	}
	if !panics(func() {
		b.Begin(&backend.Batch{Tokens: make([]int32, 2), Seqs: []backend.SeqInfo{{N: 2}}, LogitRows: []int32{1, 0}})
	}) {
		t.Error("Begin accepted decreasing logit rows")
	}
}

func TestF16(t *testing.T) {
	for _, c := range []struct {
		h uint16
		f float32
	}{{0x3c00, 1}, {0xc000, -2}, {0x0001, 5.960464477539063e-08}, {0x7bff, 65504}, {0x8000, float32(math.Copysign(0, -1))}} {
		if got := backend.F16ToF32(c.h); math.Float32bits(got) != math.Float32bits(c.f) {
			t.Errorf("f16 %#04x = %v, want %v", c.h, got, c.f)
		}
	}
	if !math.IsInf(float64(backend.F16ToF32(0x7c00)), 1) || !math.IsNaN(float64(backend.F16ToF32(0x7e00))) {
		t.Error("f16 inf/nan")
	}
	for _, c := range []struct {
		f float32
		h uint16
	}{{1, 0x3f80}, {1.00390625, 0x3f80}, {1.01171875, 0x3f82}, {-3.5, 0xc060}} {
		if got := backend.BF16Bits(c.f); got != c.h {
			t.Errorf("bf16(%v) = %#04x, want %#04x", c.f, got, c.h)
		}
	}
}
