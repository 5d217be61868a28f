//go:build !amd64

package cpu

// asmKernels reports that this architecture has only the portable kernels.
func asmKernels() (func(), bool) { return nil, false }
