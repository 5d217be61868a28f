// How fast a decode step's attention can read its paged KV cache: the
// copies of attn_decode_mma (kernels/flash.cu) without the arithmetic. A
// block per token and kv head (grid (T, KH)) stages tiles of BK keys and
// values by cp.async, ST deep, consecutive threads on consecutive 16 bytes
// of a key's row, as the kernel does; only the layout of the cache
// differs:
//
//   slot-major [block, slot, kv head, dim]: kiln's cache, a head's keys
//              KH * HD * 2 bytes apart;
//   head-major [block, kv head, slot, dim]: a head's bs keys of a block
//              contiguous.
//
// Batch 64 at 1K tokens of Qwen3-8B's heads (8 kv heads of 128) is 268 MB
// a layer: each launch reads another layer's cache (past L2). Block
// tables in order, or shuffled. docs/performance.md has the figures
// ("The decode attention's copies and score chains"). On the GPU machine:
//
//   nvcc -O3 -arch=sm_90a -o /tmp/kvread scripts/readceiling/kvread.cu && /tmp/kvread
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <random>
#include <vector>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

typedef unsigned short u16;

__device__ __forceinline__ void cp16(void *s, const void *g) {
	unsigned a = (unsigned)__cvta_generic_to_shared(s);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(g));
}

// kv reads the keys and values of token blockIdx.x's kv head blockIdx.y:
// N keys through block table bt (nb blocks a token, bs keys a block).
template <int HD, int BK, int ST, bool HEADMAJOR>
__global__ void __launch_bounds__(128) kv(const u16 *kc, const u16 *vc, const int *bt, int nb, int bs, int KH, int N, unsigned *out) {
	constexpr int KP = HD + 8, CPT = BK * HD / 8 / 128;
	extern __shared__ __align__(16) u16 sm[];
	int t = blockIdx.x, kh = blockIdx.y;
	const int *b = bt + t * nb;
	auto stage = [&](int st, int kt) {
		if (kt < N) {
			u16 *dK = sm + st * 2 * BK * KP, *dV = dK + BK * KP;
#pragma unroll
			for (int c = 0; c < CPT; c++) {
				int idx = threadIdx.x + c * 128, j = idx / (HD / 8), d = idx % (HD / 8) * 8, key = kt + j;
				long off = HEADMAJOR ? (((long)b[key / bs] * KH + kh) * bs + key % bs) * HD + d
						     : (((long)b[key / bs] * bs + key % bs) * KH + kh) * HD + d;
				cp16(dK + j * KP + d, kc + off);
				cp16(dV + j * KP + d, vc + off);
			}
		}
		asm volatile("cp.async.commit_group;");
	};
	for (int s = 0; s < ST - 1; s++) stage(s, s * BK);
	unsigned acc = 0;
	int it = 0;
	for (int kt = 0; kt < N; kt += BK, it++) {
		stage((it + ST - 1) % ST, kt + (ST - 1) * BK);
		asm volatile("cp.async.wait_group %0;" ::"n"(ST - 1));
		__syncthreads();
		const u16 *s = sm + (it % ST) * 2 * BK * KP;
		acc += s[threadIdx.x * 2] ^ s[BK * KP + threadIdx.x * 2];
		__syncthreads();
	}
	if (acc == 0x12345678u) out[0] = acc;  // keeps the copies
}

template <int HD, int BK, int ST, bool HM>
float run(const u16 *K, const u16 *V, long plane, int L, const int *bt, int T, int KH, int nb, int bs, int N, unsigned *out) {
	int smem = ST * 2 * BK * (HD + 8) * 2;
	cudaFuncSetAttribute(kv<HD, BK, ST, HM>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
	cudaEvent_t a, b;
	cudaEventCreate(&a), cudaEventCreate(&b);
	const int R = 3 * L;
	for (int w = 0; w < 2; w++) {
		cudaEventRecord(a);
		for (int r = 0; r < R; r++) kv<HD, BK, ST, HM><<<dim3(T, KH), 128, smem>>>(K + (r % L) * plane, V + (r % L) * plane, bt, nb, bs, KH, N, out);
		cudaEventRecord(b);
		cudaEventSynchronize(b);
	}
	float ms;
	cudaEventElapsedTime(&ms, a, b);
	cudaEventDestroy(a), cudaEventDestroy(b);
	if (cudaGetLastError() != cudaSuccess) return -1;
	return 1000 * ms / R;
}

int main() {
	const int T = 64, KH = 8, HD = 128, N = 1024, bs = 16, nb = N / bs, L = 4;
	long plane = (long)T * N * KH * HD;  // elements of one layer's K
	u16 *K, *V;
	int *bt;
	unsigned *out;
	CK(cudaMalloc(&K, 2 * L * plane));
	CK(cudaMalloc(&V, 2 * L * plane));
	CK(cudaMemset(K, 1, 2 * L * plane));
	CK(cudaMemset(V, 1, 2 * L * plane));
	CK(cudaMalloc(&bt, 4 * T * nb));
	CK(cudaMalloc(&out, 4));
	double bytes = 2.0 * plane * 2;
	std::vector<int> order(T * nb);
	for (int shuffle = 0; shuffle < 2; shuffle++) {
		for (int i = 0; i < T * nb; i++) order[i] = i;
		if (shuffle) std::shuffle(order.begin(), order.end(), std::mt19937(1));
		CK(cudaMemcpy(bt, order.data(), 4 * T * nb, cudaMemcpyHostToDevice));
		const char *o = shuffle ? "shuffled" : "in order";
		float us[6] = {
			run<HD, 64, 3, false>(K, V, plane, L, bt, T, KH, nb, bs, N, out),
			run<HD, 64, 3, true>(K, V, plane, L, bt, T, KH, nb, bs, N, out),
			run<HD, 32, 6, false>(K, V, plane, L, bt, T, KH, nb, bs, N, out),
			run<HD, 32, 6, true>(K, V, plane, L, bt, T, KH, nb, bs, N, out),
			run<HD, 16, 12, false>(K, V, plane, L, bt, T, KH, nb, bs, N, out),
			run<HD, 16, 12, true>(K, V, plane, L, bt, T, KH, nb, bs, N, out),
		};
		const char *name[6] = {"64 keys x 3, slot-major", "64 keys x 3, head-major", "32 keys x 6, slot-major",
			"32 keys x 6, head-major", "16 keys x 12, slot-major", "16 keys x 12, head-major"};
		for (int i = 0; i < 6; i++) printf("%s, %-26s %7.2f us  %.2f TB/s\n", o, name[i], us[i], bytes / us[i] / 1e6);
	}
	return 0;
}
