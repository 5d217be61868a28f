// Package cuda is the NVIDIA GPU implementation of backend.Backend.
//
// It needs no CUDA toolkit to build: the driver (libcuda.so.1), NVRTC and
// cuBLASLt are opened with dlopen when New is called. The kernels are CUDA C
// sources embedded in the binary (kernels/*.cu), compiled by NVRTC for the
// exact architecture of the GPU at first use and cached on disk under
// $XDG_CACHE_HOME/kiln/kernels (or ~/.cache/kiln/kernels), keyed by the
// source, the architecture, the options and the NVRTC version.
//
// The Go files follow the kernel files, one per op family: elementwise
// (embedding, norms, activations, casts), matmul (MatMul and MLP: the GEMV
// and cuBLASLt), skinny (the tensor-core GEMM of a few tokens), quant
// (products of block-quantized weights; qlayout is their device layout),
// attention (the paged KV cache, the steps RoPE, StoreKV and Attend, and
// FusedAttention's one kernel for q/k norm, RoPE and the cache write),
// deltanet (the state cache, CausalConv1d and GatedDeltaRule), moe (the
// steps Route, Experts and SharedExpert, and FusedMoE) and sample; step
// holds a step's metadata and the graph capture. Each kernel is launched
// through a struct of its parameters (kernel.go), which
// TestKernelSignatures checks against the sources without a GPU; the
// constants both sides use are defined once, in defines.go, from which
// kernels/defines.cuh is generated.
//
// All work is queued on one stream. The activations between ops are bf16
// (ActivationType) and the residual stream f32. bf16 weights are read by
// the GEMV for a step of up to two tokens, by the skinny GEMM up to eight
// and by cuBLASLt above. Block-quantized weights (backend/quant.go) are
// stored in a device layout of their own (qlayout.go) and read directly by
// the decode kernels: qgemv for one or two tokens of the integer types
// (activations quantized to int8, dp4a) and qmv up to 32 tokens (weights
// dequantized in registers, tensor cores); from sm_89 FP8 expert rows and
// one-token FP8 products of up to 2048 outputs are f8mv's (the weight bytes
// straight into the FP8 mma); larger steps dequantize them to bf16 for
// cuBLASLt (FP8 on Hopper: its block-scaled FP8 GEMM). Decode
// steps run inside Graph are captured once per key as CUDA graphs and
// replayed: every kernel reads the step's metadata (token ids, positions,
// block tables) from device buffers that Begin refreshes, so a replay stays
// valid as contexts grow.
//
// A group of GPUs (NewGroup) loads NCCL with NVLink multicast off
// (NCCL_NVLS_ENABLE=0) and, unless the environment sets it, its graph
// mixing support off (NCCL_GRAPH_MIXING_SUPPORT=0); each rank then has a
// communicator for the collectives its graphs capture and another for the
// rest (collective.go).
//
// Environment variables, read once by New, for troubleshooting and
// experiments (the defaults are what measured best; a value outside its
// range is ignored with a warning):
//
//	KILN_CUDA_GRAPHS=0            no CUDA graphs: every step launches its kernels one by one
//	KILN_CUDA_PROFILE=1           time every kernel launch (graphs off); kiln bench prints the times
//	KILN_CUDA_NVRTC_FLAGS=...     more NVRTC options, e.g. a kernel's -D switch for an A/B run
//	KILN_CUDA_PDL=0               no programmatic dependent launch (on by default from sm_90)
//	KILN_CUDA_GEMV_MAX=n          the most tokens of a bf16 product on the GEMV (0-8, default 2)
//	KILN_CUDA_GEMV_WARPS=n        the weight rows (warps) of a GEMV block (1-8, default 8)
//	KILN_CUDA_SKINNY_MAX=n        the most tokens of the skinny GEMM (0-8, default 8; 0: off)
//	KILN_CUDA_QGEMV_MAX=n         the most tokens of a Q8_0/K-quant product on qgemv (0-2, default 2; 0: off)
//	KILN_CUDA_QGEMV_GRID=n        the most blocks of a qgemv launch (default 24 warps a multiprocessor; 0: that)
//	KILN_CUDA_QGEMV_WARPS=n       the warps of every qgemv block (8, 12 or 24; default 24 where each multiprocessor gets a block, else 8)
//	KILN_CUDA_QMV_MAX=n           the most tokens of a quantized product on qmv (0-32, default 32; 0: off)
//	KILN_CUDA_FP8_SKINNY_MAX=n    the most tokens of an FP8 product on the FP8 skinny GEMM (0-8, default 2 on Hopper, 8 on sm_89; 0: off)
//	KILN_CUDA_FP8_GEMM_MIN=n      the fewest tokens of an FP8 product on cuBLASLt's block-scaled FP8 GEMM (default 4; 0: off)
//	KILN_CUDA_FP8_TILE=n          the cuBLASLt tile id of the block-scaled FP8 products of up to 64 tokens (default 18: 128 x 64; 0: the heuristic's)
//	KILN_CUDA_F8WG_MAX=n          the most tokens of a block-scaled FP8 product on f8wg (wgmma, sm_90a) rather than cuBLASLt (0-16, default 16; 0: off)
//	KILN_CUDA_F8MV_MAX=n          the most tokens of an FP8 product on f8mv (-1-8, default 1; 0: expert rows only; -1: off)
//	KILN_CUDA_F8MV_OUTS=n         the fewest outputs of an FP8 product on f8mv (default 4096; one token with fewer: qmv; expert rows: any)
//	KILN_CUDA_F8MV_COLS=n         the most columns of an FP8 product on f8mv (default 2048; more: the FP8 skinny GEMM)
//	KILN_CUDA_QMV_WARPS=n         the most warps of a qmv or f8mv block (1-8, default 8)
//	KILN_CUDA_QMV_GRID=n          the most blocks of a qmv (or f8mv) launch, each taking rounds of outputs
//	                              (default 16 a multiprocessor, f8mv a wave; 0: a block an output group)
//	KILN_CUDA_SPLITS=n            the most key splits of decode attention (1-512, default 512)
//	KILN_CUDA_SPLIT_BLOCKS=n      decode attention blocks a multiprocessor, scalar kernel (1-64, default 6)
//	KILN_CUDA_MMA_SPLIT_BLOCKS=n  the same for the tensor-core kernel (1-64, default 2)
//	KILN_CUDA_FLASH_SPLIT_QUERIES=n  the query tile of prefill attention with split keys, head dims 64 and 128 (64 or 128, default 128)
//	KILN_CUDA_ROUTER_GEMM=n       the fewest tokens whose MoE router product runs on tensor cores, or on cuBLASLt's
//	                              float32 GEMM for a float32 router (default 64; 0: never)
//
// Built without cgo, New always returns an error.
package cuda
