package cpu

import "testing"

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
