//go:build cgo

#ifndef KILN_CUDA_SHIM_H
#define KILN_CUDA_SHIM_H
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

// The few CUDA driver, NVRTC and cuBLASLt types kiln needs, declared here so
// that the package builds without the CUDA toolkit; the libraries are opened
// with dlopen at run time.
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent, *CUgraph, *CUgraphExec;

// cuLaunchKernelEx's configuration (cuda.h layout): one attribute is enough
// for kiln, programmatic stream serialization.
typedef struct {
	int id;
	int pad;
	union {
		char raw[64];
		int value;
		void *align;
	} value;
} CUlaunchAttribute;
typedef struct {
	unsigned gridDimX, gridDimY, gridDimZ;
	unsigned blockDimX, blockDimY, blockDimZ;
	unsigned sharedMemBytes;
	CUstream hStream;
	CUlaunchAttribute *attrs;
	unsigned numAttrs;
} CUlaunchConfig;
#define CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION 6

typedef int nvrtcResult;
typedef void *nvrtcProgram;

typedef void *cublasLtHandle_t, *cublasLtMatmulDesc_t, *cublasLtMatrixLayout_t, *cublasLtMatmulPreference_t;
typedef struct { unsigned long long data[8]; } cublasLtMatmulAlgo_t;
typedef struct {
	cublasLtMatmulAlgo_t algo;
	size_t workspaceSize;
	int state;
	float wavesCount;
	int reserved[4];
} cublasLtMatmulHeuristicResult_t;

// NCCL (libnccl.so.2), for a model split across GPUs: its communicator
// handle, unique id (ncclUniqueId: 128 bytes), and the enums kiln passes.
// Buffers are declared CUdeviceptr (NCCL's void *: the same register).
typedef void *ncclComm_t;
typedef struct { char internal[128]; } ncclUniqueId;
#define NCCL_FLOAT32 7
#define NCCL_SUM 0

#define CU_FUNCS(X) \
	X(cuInit, (unsigned f), (f)) \
	X(cuDeviceGetCount, (int *n), (n)) \
	X(cuDeviceGet, (CUdevice *d, int i), (d, i)) \
	X(cuDeviceGetAttribute, (int *v, int a, CUdevice d), (v, a, d)) \
	X(cuDeviceGetName, (char *s, int n, CUdevice d), (s, n, d)) \
	X(cuDevicePrimaryCtxRetain, (CUcontext *c, CUdevice d), (c, d)) \
	X(cuCtxSetCurrent, (CUcontext c), (c)) \
	X(cuMemGetInfo_v2, (size_t *f, size_t *t), (f, t)) \
	X(cuMemAlloc_v2, (CUdeviceptr *p, size_t n), (p, n)) \
	X(cuMemFree_v2, (CUdeviceptr p), (p)) \
	X(cuMemAllocHost_v2, (void **p, size_t n), (p, n)) \
	X(cuMemFreeHost, (void *p), (p)) \
	X(cuMemcpyHtoDAsync_v2, (CUdeviceptr d, const void *s, size_t n, CUstream st), (d, s, n, st)) \
	X(cuMemcpyDtoHAsync_v2, (void *d, CUdeviceptr s, size_t n, CUstream st), (d, s, n, st)) \
	X(cuMemcpyDtoDAsync_v2, (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st), (d, s, n, st)) \
	X(cuMemsetD32Async, (CUdeviceptr d, unsigned v, size_t n, CUstream st), (d, v, n, st)) \
	X(cuStreamCreate, (CUstream *s, unsigned f), (s, f)) \
	X(cuStreamSynchronize, (CUstream s), (s)) \
	X(cuStreamBeginCapture_v2, (CUstream s, int mode), (s, mode)) \
	X(cuStreamEndCapture, (CUstream s, CUgraph *g), (s, g)) \
	X(cuGraphInstantiateWithFlags, (CUgraphExec *e, CUgraph g, unsigned long long f), (e, g, f)) \
	X(cuGraphLaunch, (CUgraphExec e, CUstream s), (e, s)) \
	X(cuGraphDestroy, (CUgraph g), (g)) \
	X(cuGraphExecDestroy, (CUgraphExec e), (e)) \
	X(cuEventCreate, (CUevent *e, unsigned f), (e, f)) \
	X(cuEventRecord, (CUevent e, CUstream s), (e, s)) \
	X(cuEventSynchronize, (CUevent e), (e)) \
	X(cuEventElapsedTime, (float *ms, CUevent a, CUevent b), (ms, a, b)) \
	X(cuModuleLoadData, (CUmodule *m, const void *img), (m, img)) \
	X(cuModuleGetFunction, (CUfunction *f, CUmodule m, const char *name), (f, m, name)) \
	X(cuFuncSetAttribute, (CUfunction f, int a, int v), (f, a, v)) \
	X(cuOccupancyMaxActiveBlocksPerMultiprocessor, (int *n, CUfunction f, int threads, size_t smem), (n, f, threads, smem)) \
	X(cuLaunchKernel, (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned smem, CUstream s, void **params, void **extra), (f, gx, gy, gz, bx, by, bz, smem, s, params, extra)) \
	X(cuLaunchKernelEx, (const CUlaunchConfig *c, CUfunction f, void **params, void **extra), (c, f, params, extra))

#define NVRTC_FUNCS(X) \
	X(nvrtcVersion, (int *maj, int *min), (maj, min)) \
	X(nvrtcCreateProgram, (nvrtcProgram *p, const char *src, const char *name, int n, const char *const *h, const char *const *i), (p, src, name, n, h, i)) \
	X(nvrtcCompileProgram, (nvrtcProgram p, int n, const char *const *opts), (p, n, opts)) \
	X(nvrtcGetProgramLogSize, (nvrtcProgram p, size_t *n), (p, n)) \
	X(nvrtcGetProgramLog, (nvrtcProgram p, char *log), (p, log)) \
	X(nvrtcGetCUBINSize, (nvrtcProgram p, size_t *n), (p, n)) \
	X(nvrtcGetCUBIN, (nvrtcProgram p, char *c), (p, c)) \
	X(nvrtcDestroyProgram, (nvrtcProgram *p), (p))

#define LT_FUNCS(X) \
	X(cublasLtCreate, (cublasLtHandle_t *h), (h)) \
	X(cublasLtMatmulDescCreate, (cublasLtMatmulDesc_t *d, int compute, int scale), (d, compute, scale)) \
	X(cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t d), (d)) \
	X(cublasLtMatmulDescSetAttribute, (cublasLtMatmulDesc_t d, int a, const void *v, size_t n), (d, a, v, n)) \
	X(cublasLtMatrixLayoutCreate, (cublasLtMatrixLayout_t *l, int t, unsigned long long r, unsigned long long c, long long ld), (l, t, r, c, ld)) \
	X(cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t l), (l)) \
	X(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t *p), (p)) \
	X(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t p), (p)) \
	X(cublasLtMatmulPreferenceSetAttribute, (cublasLtMatmulPreference_t p, int a, const void *v, size_t n), (p, a, v, n)) \
	X(cublasLtMatmulAlgoGetHeuristic, (cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t p, int n, cublasLtMatmulHeuristicResult_t *r, int *got), (h, d, a, b, c, dd, p, n, r, got)) \
	X(cublasLtMatmulAlgoConfigSetAttribute, (cublasLtMatmulAlgo_t *algo, int a, const void *v, size_t n), (algo, a, v, n)) \
	X(cublasLtMatmulAlgoConfigGetAttribute, (const cublasLtMatmulAlgo_t *algo, int a, void *v, size_t n, size_t *w), (algo, a, v, n, w)) \
	X(cublasLtMatmulAlgoCheck, (cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t dd, const cublasLtMatmulAlgo_t *algo, cublasLtMatmulHeuristicResult_t *r), (h, d, a, b, c, dd, algo, r)) \
	X(cublasLtMatmul, (cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A, cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb, const void *beta, const void *C, cublasLtMatrixLayout_t lc, void *D, cublasLtMatrixLayout_t ld, const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsn, CUstream s), (h, d, alpha, A, la, B, lb, beta, C, lc, D, ld, algo, ws, wsn, s))


#define NCCL_FUNCS(X) \
	X(ncclGetUniqueId, (ncclUniqueId *id), (id)) \
	X(ncclCommInitRank, (ncclComm_t *c, int n, ncclUniqueId id, int r), (c, n, id, r)) \
	X(ncclAllReduce, (CUdeviceptr s, CUdeviceptr r, size_t n, int dt, int op, ncclComm_t c, CUstream st), (s, r, n, dt, op, c, st)) \
	X(ncclAllGather, (CUdeviceptr s, CUdeviceptr r, size_t n, int dt, ncclComm_t c, CUstream st), (s, r, n, dt, c, st)) \
	X(ncclCommAbort, (ncclComm_t c), (c))

// The driver's, cuBLASLt's and NCCL's wrappers take the context to run in first:
// goroutines move between OS threads, and each backend (one a GPU) has a
// context of its own, made current on the calling thread when it is not.
// NVRTC needs none.
#define UNPAREN(...) __VA_ARGS__
#define PROTO_CTX(name, params, args) int k_##name(CUcontext ctx, UNPAREN params);
#define PROTO(name, params, args) int k_##name params;
CU_FUNCS(PROTO_CTX)
NVRTC_FUNCS(PROTO)
LT_FUNCS(PROTO_CTX)
NCCL_FUNCS(PROTO_CTX)
const char *k_ncclGetErrorString(int r);
int load_nccl(char *err, int errn);
int load_cuda(char *err, int errn);
int load_nvrtc(char *err, int errn);
int load_lt(char *err, int errn);
// K_MAX_ARGS bounds a kernel's parameters (k_launch's array of them).
#define K_MAX_ARGS 32
int k_launch(CUcontext ctx, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned smem,
		CUstream s, char *buf, int *offs, int n, int pdl);
int k_lt_matmul(CUcontext ctx, cublasLtHandle_t h, cublasLtMatmulDesc_t d, float alpha, CUdeviceptr A, cublasLtMatrixLayout_t la,
		CUdeviceptr B, cublasLtMatrixLayout_t lb, float beta, CUdeviceptr C, cublasLtMatrixLayout_t lc,
		cublasLtMatmulHeuristicResult_t *r, CUdeviceptr ws, size_t wsn, CUstream s);
#endif
