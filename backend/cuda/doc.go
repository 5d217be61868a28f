// Package cuda is the NVIDIA GPU implementation of backend.Backend.
//
// It needs no CUDA toolkit to build: the driver (libcuda.so.1), NVRTC and
// cuBLASLt are opened with dlopen when New is called. The kernels are CUDA C
// sources embedded in the binary (kernels/*.cu), compiled by NVRTC for the
// exact architecture of the GPU at first use and cached on disk under
// $XDG_CACHE_HOME/kiln/kernels (or ~/.cache/kiln/kernels), keyed by the
// source, the architecture and the NVRTC version.
//
// All work is queued on one stream. Activations are float32; bf16 weights are
// read directly by the decode kernels (GEMV) and by cuBLASLt for larger
// batches (activations converted to bf16 on the fly). Block-quantized
// weights (backend/quant.go) are stored in a device layout of their own
// (qlayout.go) and read directly by the decode kernels, which dequantize
// them in registers; larger batches dequantize them to bf16 for cuBLASLt
// (quant.go). Decode steps run inside
// Graph are captured once per key as CUDA graphs and replayed: every kernel
// reads the step's metadata (token ids, positions, block tables) from device
// buffers that Begin refreshes, so a replay stays valid as contexts grow.
//
// Built without cgo, New always returns an error.
package cuda
