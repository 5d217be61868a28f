//go:build cgo

#include <dlfcn.h>
#include <stdio.h>
#include "shim.h"

#define DECLARE(name, params, args) static int (*p_##name) params;
CU_FUNCS(DECLARE)
NVRTC_FUNCS(DECLARE)
LT_FUNCS(DECLARE)
NCCL_FUNCS(DECLARE)
static const char *(*p_ncclGetErrorString)(int);

// t_ctx is the context this OS thread last made current through use_ctx.
static __thread CUcontext t_ctx;
static void use_ctx(CUcontext c) {
	if (c && t_ctx != c) {
		p_cuCtxSetCurrent(c);
		t_ctx = c;
	}
}

#define WRAP_CTX(name, params, args) int k_##name(CUcontext ctx, UNPAREN params) { use_ctx(ctx); return p_##name args; }
#define WRAP(name, params, args) int k_##name params { return p_##name args; }
CU_FUNCS(WRAP_CTX)
NVRTC_FUNCS(WRAP)
LT_FUNCS(WRAP_CTX)
// NCCL's calls may leave another device's context current (its runtime's
// cudaSetDevice): the next call sets the context again.
#define WRAP_NCCL(name, params, args) int k_##name(CUcontext ctx, UNPAREN params) { \
	use_ctx(ctx); \
	int res_ = p_##name args; \
	t_ctx = NULL; \
	return res_; \
}
NCCL_FUNCS(WRAP_NCCL)
const char *k_ncclGetErrorString(int r) { return p_ncclGetErrorString(r); }

static void *open_first(const char **names, int n, char *err, int errn) {
	for (int i = 0; i < n; i++) {
		void *h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
		if (h) return h;
	}
	snprintf(err, errn, "%s: %s", names[0], dlerror());
	return NULL;
}

#define LOAD(name, params, args) \
	p_##name = (int (*) params)dlsym(h, #name); \
	if (!p_##name) { snprintf(err, errn, "missing symbol %s", #name); return -1; }

int load_cuda(char *err, int errn) {
	const char *names[] = {"libcuda.so.1", "libcuda.so"};
	void *h = open_first(names, 2, err, errn);
	if (!h) return -1;
	CU_FUNCS(LOAD)
	return 0;
}

int load_nvrtc(char *err, int errn) {
	const char *names[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"};
	void *h = open_first(names, 3, err, errn);
	if (!h) return -1;
	NVRTC_FUNCS(LOAD)
	return 0;
}

int load_lt(char *err, int errn) {
	const char *names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
	void *h = open_first(names, 3, err, errn);
	if (!h) return -1;
	LT_FUNCS(LOAD)
	return 0;
}

int load_nccl(char *err, int errn) {
	const char *names[] = {"libnccl.so.2", "libnccl.so"};
	void *h = open_first(names, 2, err, errn);
	if (!h) return -1;
	NCCL_FUNCS(LOAD)
	p_ncclGetErrorString = (const char *(*)(int))dlsym(h, "ncclGetErrorString");
	if (!p_ncclGetErrorString) { snprintf(err, errn, "missing symbol ncclGetErrorString"); return -1; }
	return 0;
}

// launch builds the kernel parameter array from an argument buffer (a Go
// struct) and the offsets of the arguments in it.
// With pdl set the kernel may start before the previous kernel in the
// stream has finished (programmatic dependent launch): it must wait
// (griddepcontrol.wait) before touching anything that kernel writes or reads.
int k_launch(CUcontext ctx, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned smem,
		CUstream s, char *buf, int *offs, int n, int pdl) {
	void *params[K_MAX_ARGS];
	for (int i = 0; i < n && i < K_MAX_ARGS; i++) params[i] = buf + offs[i];
	if (!pdl) return k_cuLaunchKernel(ctx, f, gx, gy, gz, bx, 1, 1, smem, s, params, NULL);
	CUlaunchAttribute at;
	memset(&at, 0, sizeof at);
	at.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
	at.value.value = 1;
	CUlaunchConfig cfg = {gx, gy, gz, bx, 1, 1, smem, s, &at, 1};
	return k_cuLaunchKernelEx(ctx, &cfg, f, params, NULL);
}

int k_lt_matmul(CUcontext ctx, cublasLtHandle_t h, cublasLtMatmulDesc_t d, float alpha, CUdeviceptr A, cublasLtMatrixLayout_t la,
		CUdeviceptr B, cublasLtMatrixLayout_t lb, float beta, CUdeviceptr C, cublasLtMatrixLayout_t lc,
		cublasLtMatmulHeuristicResult_t *r, CUdeviceptr ws, size_t wsn, CUstream s) {
	return k_cublasLtMatmul(ctx, h, d, &alpha, (void *)A, la, (void *)B, lb, &beta, (void *)C, lc, (void *)C, lc,
		&r->algo, (void *)ws, wsn, s);
}
