package cpu

import (
	"fmt"
	"testing"
)

// TestAVX2Kernels runs the kernels', products' and experts' tests with the
// AVX2 kernels where AVX-512 VNNI would replace them: CPUs without it take
// these.
func TestAVX2Kernels(t *testing.T) {
	if !useAVX512 {
		t.Skip("no AVX-512 VNNI here: the other tests take the AVX2 kernels")
	}
	restore := saveKernels()
	defer func() {
		useAVX512 = true
		restore()
	}()
	useAVX512 = false
	install, _ := asmKernels()
	install()
	t.Run("QuantKernels", TestQuantKernels)
	t.Run("QuantMatMul", TestQuantMatMul)
	t.Run("ExpertsTogether", TestExpertsTogether)
	t.Run("Kernels", TestKernels)
}

// BenchmarkPanel is the 6x16 panel product alone (k = 1024, in L1) on one
// thread, in AVX2 and in AVX-512 where the CPU has it: its GFLOP/s against
// a core's peak (two multiply-adds a cycle of 8 or 16 lanes).
//
//	go test -run - -bench Panel ./backend/cpu
func BenchmarkPanel(b *testing.B) {
	const k = 1024
	r := newRand(2)
	a, p, c := toF32(randVec(r, 6*k, 1)), toF32(randVec(r, 16*k, 1)), make([]float32, 96)
	kernels := map[string]func(a []float32, lda int, b []float32, k int, c []float32, ldc int){"avx2": gemm6x16Asm(gemm6x16AVX)}
	if useAVX512 {
		kernels["avx512"] = gemm6x16Asm(gemm6x16AVX512)
	}
	for name, kern := range kernels {
		b.Run(fmt.Sprintf("%s/k=%d", name, k), func(b *testing.B) {
			for b.Loop() {
				kern(a, k, p, k, c, 16)
			}
			b.ReportMetric(2*96*k*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
