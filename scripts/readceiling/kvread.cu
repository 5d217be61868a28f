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
//
// The third times the cp.async kernel with the decode attention's start
// (three dependent loads before its block table) and end (a merge through
// shared memory and a store), back to back and with an event pair around
// each launch, as KILN_CUDA_PROFILE times the attention.
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

// Start is where the attention finds a token's keys: its position, its
// sequence, the sequence's first block (three dependent loads).
struct Start {
	const int *tokpos, *tokseq, *seqblk;
};

// kv reads the keys and values of token blockIdx.x's kv head blockIdx.y:
// N keys through block table bt (nb blocks a token, bs keys a block). With
// START it finds them as the attention does (s); with MERGE it ends as the
// attention does, its threads' results through shared memory, then a
// store.
template <int HD, int BK, int ST, bool HEADMAJOR, bool START = false, bool MERGE = false>
__global__ void __launch_bounds__(128) kv(const u16 *kc, const u16 *vc, const int *bt, int nb, int bs, int KH, int N, float *out, Start s0) {
	constexpr int KP = HD + 8, CPT = BK * HD / 8 / 128;
	extern __shared__ __align__(16) u16 sm[];
	int t = blockIdx.x, kh = blockIdx.y, n = N;
	const int *b = bt + t * nb;
	if (START) {
		n = s0.tokpos[t] + 1;
		b = bt + s0.seqblk[s0.tokseq[t]];
	}
	auto stage = [&](int st, int kt) {
		if (kt < n) {
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
	for (int kt = 0; kt < n; kt += BK, it++) {
		stage((it + ST - 1) % ST, kt + (ST - 1) * BK);
		asm volatile("cp.async.wait_group %0;" ::"n"(ST - 1));
		__syncthreads();
		const u16 *s = sm + (it % ST) * 2 * BK * KP;
		acc += s[threadIdx.x * 2] ^ s[BK * KP + threadIdx.x * 2];
		__syncthreads();
	}
	asm volatile("cp.async.wait_group 0;");
	if (MERGE) {
		float *sa = (float *)sm;
		for (int i = 0; i < 64; i++) sa[threadIdx.x * 64 + (i ^ (threadIdx.x & 31))] = (float)(acc + i);
		__syncthreads();
		for (int i = threadIdx.x; i < 4 * HD; i += 128) {
			float v = 0;
			for (int w = 0; w < 4; w++) v += sa[w * 2048 + i];
			out[((long)t * KH + kh) * 4 * HD + i] = v;
		}
	} else if (acc == 0x12345678u) {
		out[0] = acc;  // keeps the copies
	}
}

// run returns kv's time a launch, launches back to back; with each, it
// also times each launch between its own pair of events (as
// KILN_CUDA_PROFILE does) and sets *each to their mean.
template <int HD, int BK, int ST, bool HM, bool START = false, bool MERGE = false>
float run(const u16 *K, const u16 *V, long plane, int L, const int *bt, int T, int KH, int nb, int bs, int N, float *out, Start s0 = {},
		float *each = nullptr) {
	int smem = ST * 2 * BK * (HD + 8) * 2;
	cudaFuncSetAttribute(kv<HD, BK, ST, HM, START, MERGE>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
	const int R = 3 * L;
	std::vector<cudaEvent_t> ev(2 * R + 2);
	for (auto &e : ev) cudaEventCreate(&e);
	auto launch = [&](int r) {
		kv<HD, BK, ST, HM, START, MERGE><<<dim3(T, KH), 128, smem>>>(K + (r % L) * plane, V + (r % L) * plane, bt, nb, bs, KH, N, out, s0);
	};
	float ms = 0;
	for (int w = 0; w < 2; w++) {
		cudaEventRecord(ev[0]);
		for (int r = 0; r < R; r++) launch(r);
		cudaEventRecord(ev[1]);
		cudaEventSynchronize(ev[1]);
		cudaEventElapsedTime(&ms, ev[0], ev[1]);
		if (!each) continue;
		for (int r = 0; r < R; r++) {
			cudaEventRecord(ev[2 + 2 * r]);
			launch(r);
			cudaEventRecord(ev[3 + 2 * r]);
		}
		cudaEventSynchronize(ev[2 * R + 1]);
		*each = 0;
		for (int r = 0; r < R; r++) {
			float m;
			cudaEventElapsedTime(&m, ev[2 + 2 * r], ev[3 + 2 * r]);
			*each += 1000 * m / R;
		}
	}
	for (auto &e : ev) cudaEventDestroy(e);
	if (cudaGetLastError() != cudaSuccess) return -1;
	return 1000 * ms / R;
}

// kvt reads what kv reads by TMA: thread 0 issues a stage's boxes (BK / 16
// groups of 16 keys, two halves of the head, K and V) against the stage's
// mbarrier; every thread waits for its phase. Requires bs % 16 == 0.
__device__ __forceinline__ unsigned sa(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
template <int BK, int ST>
__global__ void __launch_bounds__(128) kvt(const __grid_constant__ CUtensorMap mk, const __grid_constant__ CUtensorMap mv, const int *bt, int nb,
		int bs, int N, float *out) {
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
float runt(const u16 *K, const u16 *V, long plane, int L, const int *bt, int T, int KH, int HD, int nb, int bs, int N, float *out) {
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
	int *bt, *tokpos, *tokseq, *seqblk;
	float *out;
	CK(cudaMalloc(&K, 2 * L * plane));
	CK(cudaMalloc(&V, 2 * L * plane));
	CK(cudaMemset(K, 1, 2 * L * plane));
	CK(cudaMemset(V, 1, 2 * L * plane));
	CK(cudaMalloc(&bt, 4 * T * nb));
	CK(cudaMalloc(&out, 4L * T * KH * 4 * HD));
	// The start's loads: token t at position N - 1 of sequence t, whose
	// blocks begin at t nb in the table.
	std::vector<int> pos(T, N - 1), seq(T), first(T);
	for (int t = 0; t < T; t++) seq[t] = t, first[t] = t * nb;
	CK(cudaMalloc(&tokpos, 4 * T));
	CK(cudaMalloc(&tokseq, 4 * T));
	CK(cudaMalloc(&seqblk, 4 * T));
	CK(cudaMemcpy(tokpos, pos.data(), 4 * T, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(tokseq, seq.data(), 4 * T, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(seqblk, first.data(), 4 * T, cudaMemcpyHostToDevice));
	Start s0{tokpos, tokseq, seqblk};
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
	// The third table: 64 keys x 3, slot-major, in order, with the
	// attention's start and end, back to back and an event pair a launch.
	std::sort(order.begin(), order.end());
	CK(cudaMemcpy(bt, order.data(), 4 * T * nb, cudaMemcpyHostToDevice));
	float each[4], b2b[4] = {
		run<HD, 64, 3, false, false, false>(K, V, plane, L, bt, T, KH, nb, bs, N, out, s0, &each[0]),
		run<HD, 64, 3, false, true, false>(K, V, plane, L, bt, T, KH, nb, bs, N, out, s0, &each[1]),
		run<HD, 64, 3, false, false, true>(K, V, plane, L, bt, T, KH, nb, bs, N, out, s0, &each[2]),
		run<HD, 64, 3, false, true, true>(K, V, plane, L, bt, T, KH, nb, bs, N, out, s0, &each[3]),
	};
	const char *sname[4] = {"plain", "with the start", "with the merge", "with both"};
	for (int i = 0; i < 4; i++) printf("64 keys x 3, %-15s back to back %7.2f us, an event pair a launch %7.2f us\n", sname[i], b2b[i], each[i]);
	return 0;
}
