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
// ("The decode attention's copies and score chains"; the TMA rows in "What
// the decode attention's time is made of"). On the GPU machine:
//
//   nvcc -O3 -arch=sm_90a -o /tmp/kvread scripts/readceiling/kvread.cu -lcuda && /tmp/kvread
//
// The second table reads the slot-major cache by TMA (sm_90): a 2D tensor
// map over a layer's cache as rows of KH * HD values, a box of 64 values
// (128 bytes, the 128-byte swizzle's width) by 16 slots, so that one
// instruction from one thread copies half of 16 keys' rows of one head,
// counted by the stage's mbarrier. Its rows match the cp.async ones
// (68.65 against 69.03 us, H200): the copies' issue is not what bounds
// the read.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cuda.h>
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

// kvt reads what kv reads by TMA: thread 0 issues a stage's boxes (BK / 16
// groups of 16 keys, two halves of the head, K and V) against the stage's
// mbarrier; every thread waits for its phase. Requires bs % 16 == 0.
__device__ __forceinline__ unsigned sa(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
template <int BK, int ST>
__global__ void __launch_bounds__(128) kvt(const __grid_constant__ CUtensorMap mk, const __grid_constant__ CUtensorMap mv, const int *bt, int nb,
		int bs, int N, unsigned *out) {
	extern __shared__ unsigned char tsm[];
	__shared__ __align__(8) unsigned long long bar[ST];
	unsigned base = (sa(tsm) + 1023) & ~1023u;
	const unsigned char *gb = tsm + (base - sa(tsm));
	int t = blockIdx.x, kh = blockIdx.y;
	const int *b = bt + t * nb;
	if (threadIdx.x == 0) {
		for (int s = 0; s < ST; s++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(&bar[s])));
		asm volatile("fence.mbarrier_init.release.cluster;\nfence.proxy.async.shared::cta;" ::: "memory");
	}
	__syncthreads();
	auto stage = [&](int st, int kt) {
		if (threadIdx.x != 0 || kt >= N) return;
		unsigned d = base + st * 2 * BK * 256, bb = sa(&bar[st]);
		asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bb), "r"(2 * BK * 256) : "memory");
#pragma unroll
		for (int j = 0; j < BK / 16; j++) {
			int key = kt + 16 * j, row = b[key / bs] * bs + key % bs;
#pragma unroll
			for (int h = 0; h < 2; h++) {
				int c0 = kh * 128 + 64 * h;
				asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
					::"r"(d + (j * 2 + h) * 2048), "l"(&mk), "r"(c0), "r"(row), "r"(bb) : "memory");
				asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
					::"r"(d + BK * 256 + (j * 2 + h) * 2048), "l"(&mv), "r"(c0), "r"(row), "r"(bb) : "memory");
			}
		}
	};
	for (int s = 0; s < ST - 1; s++) stage(s, s * BK);
	unsigned acc = 0;
	int it = 0;
	for (int kt = 0; kt < N; kt += BK, it++) {
		stage((it + ST - 1) % ST, kt + (ST - 1) * BK);
		unsigned done, bb = sa(&bar[it % ST]), par = (it / ST) & 1;
		do {
			asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
				: "=r"(done) : "r"(bb), "r"(par) : "memory");
		} while (!done);
		const unsigned short *s = (const unsigned short *)(gb + (it % ST) * 2 * BK * 256);
		acc += s[threadIdx.x * 2] ^ s[BK * 128 + threadIdx.x * 2];
		__syncthreads();
	}
	if (acc == 0x12345678u) out[0] = acc;
}

// tmap is a tensor map over one layer's slot-major cache at p.
static CUtensorMap tmap(const u16 *p, int KH, int HD, long rows) {
	CUtensorMap m;
	cuuint64_t dim[2] = {(cuuint64_t)KH * HD, (cuuint64_t)rows}, stride[1] = {(cuuint64_t)KH * HD * 2};
	cuuint32_t box[2] = {64, 16}, es[2] = {1, 1};
	CUresult r = cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p, dim, stride, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
		CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
	if (r != CUDA_SUCCESS) printf("cuTensorMapEncodeTiled: %d\n", (int)r);
	return m;
}

template <int BK, int ST>
float runt(const u16 *K, const u16 *V, long plane, int L, const int *bt, int T, int KH, int HD, int nb, int bs, int N, unsigned *out) {
	int smem = 1024 + ST * 2 * BK * 256;
	cudaFuncSetAttribute(kvt<BK, ST>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
	std::vector<CUtensorMap> mk(L), mv(L);
	long rows = plane / (KH * HD);
	for (int l = 0; l < L; l++) mk[l] = tmap(K + l * plane, KH, HD, rows), mv[l] = tmap(V + l * plane, KH, HD, rows);
	cudaEvent_t a, b;
	cudaEventCreate(&a), cudaEventCreate(&b);
	const int R = 3 * L;
	for (int w = 0; w < 2; w++) {
		cudaEventRecord(a);
		for (int r = 0; r < R; r++) kvt<BK, ST><<<dim3(T, KH), 128, smem>>>(mk[r % L], mv[r % L], bt, nb, bs, N, out);
		cudaEventRecord(b);
		cudaEventSynchronize(b);
	}
	float ms;
	cudaEventElapsedTime(&ms, a, b);
	cudaEventDestroy(a), cudaEventDestroy(b);
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess) { printf("kvt: %s\n", cudaGetErrorString(e)); return -1; }
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
		float ut[4] = {
			runt<64, 3>(K, V, plane, L, bt, T, KH, HD, nb, bs, N, out),
			runt<32, 6>(K, V, plane, L, bt, T, KH, HD, nb, bs, N, out),
			runt<64, 2>(K, V, plane, L, bt, T, KH, HD, nb, bs, N, out),
			runt<32, 4>(K, V, plane, L, bt, T, KH, HD, nb, bs, N, out),
		};
		const char *tname[4] = {"TMA 64 keys x 3", "TMA 32 keys x 6", "TMA 64 keys x 2", "TMA 32 keys x 4"};
		for (int i = 0; i < 4; i++) printf("%s, %-26s %7.2f us  %.2f TB/s\n", o, tname[i], ut[i], bytes / ut[i] / 1e6);
	}
	return 0;
}
