package cpu

import "testing"

// TestAVX2Kernels runs the quantized kernels' and products' tests with the
// AVX2 kernels where AVX-512 VNNI would replace them: CPUs without it take
// these.
func TestAVX2Kernels(t *testing.T) {
	if !useVNNI {
		t.Skip("no AVX-512 VNNI here: the other tests take the AVX2 kernels")
	}
	restore := saveKernels()
	defer func() {
		useVNNI = true
		restore()
	}()
	useVNNI = false
	install, _ := asmKernels()
	install()
	t.Run("QuantKernels", TestQuantKernels)
	t.Run("QuantMatMul", TestQuantMatMul)
	t.Run("ExpertsTogether", TestExpertsTogether)
}
