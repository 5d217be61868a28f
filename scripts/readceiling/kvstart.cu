// The decode attention's copies with its start and end, timed as
// KILN_CUDA_PROFILE times kernels: kvread.cu's slot-major kernel (64 keys x
// 3 stages, batch 64 at 1K tokens of Qwen3-8B's heads) with the kernel's
// chain of dependent loads before its block table (token position,
// sequence, the sequence's first block) and a merge through shared memory
// and a store at its end, each timed back to back and with an event pair
// around each launch. docs/performance.md has the figures ("What the
// decode attention's time is made of"). On the GPU machine:
//
//   nvcc -O3 -arch=sm_90a -o /tmp/kvstart scripts/readceiling/kvstart.cu && /tmp/kvstart
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>
typedef unsigned short u16;
__device__ __forceinline__ void cp16(void *s, const void *g) {
	unsigned a = (unsigned)__cvta_generic_to_shared(s);
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(g));
}
template <bool CHAIN, bool EPI>
__global__ void __launch_bounds__(128) kv(const u16 *kc, const u16 *vc, const int *bt, const int *tokpos, const int *tokseq, const int *seqblk,
		int nb, int bs, int KH, int N, float *out) {
	constexpr int HD = 128, BK = 64, ST = 3, KP = HD + 8, CPT = BK * HD / 8 / 128;
	extern __shared__ __align__(16) u16 sm[];
	int t = blockIdx.x, kh = blockIdx.y;
	const int *b = bt + t * nb;
	int n = N;
	if (CHAIN) {
		n = tokpos[t] + 1;
		b = bt + seqblk[tokseq[t]];
	}
	auto stage = [&](int st, int kt) {
		if (kt < n) {
			u16 *dK = sm + st * 2 * BK * KP, *dV = dK + BK * KP;
#pragma unroll
			for (int c = 0; c < CPT; c++) {
				int idx = threadIdx.x + c * 128, j = idx / (HD / 8), d = idx % (HD / 8) * 8, key = kt + j;
				long off = (((long)b[key / bs] * bs + key % bs) * KH + kh) * HD + d;
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
	if (EPI) {
		float *sa = (float *)sm;
		for (int i = 0; i < 64; i++) sa[threadIdx.x * 64 + (i ^ (threadIdx.x & 31))] = (float)(acc + i);
		__syncthreads();
		for (int i = threadIdx.x; i < 4 * HD; i += 128) {
			float v = 0;
			for (int w = 0; w < 4; w++) v += sa[w * 2048 + i];
			out[((long)t * KH + kh) * 4 * HD + i] = v;
		}
	} else if (acc == 0x12345678u) out[0] = acc;
}
template <bool C, bool E>
void run(const u16 *K, const u16 *V, long plane, int L, const int *bt, const int *tp, const int *ts, const int *sb, int T, int KH, int nb, int bs,
		int N, float *out) {
	int smem = 3 * 2 * 64 * 136 * 2;
	cudaFuncSetAttribute(kv<C, E>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
	const int R = 3 * L;
	std::vector<cudaEvent_t> ev(2 * R + 2);
	for (auto &e : ev) cudaEventCreate(&e);
	float b2b = 0, each = 0;
	for (int w = 0; w < 2; w++) {
		cudaEventRecord(ev[0]);
		for (int r = 0; r < R; r++) kv<C, E><<<dim3(T, KH), 128, smem>>>(K + (r % L) * plane, V + (r % L) * plane, bt, tp, ts, sb, nb, bs, KH, N, out);
		cudaEventRecord(ev[1]);
		cudaEventSynchronize(ev[1]);
		cudaEventElapsedTime(&b2b, ev[0], ev[1]);
		for (int r = 0; r < R; r++) {
			cudaEventRecord(ev[2 + 2 * r]);
			kv<C, E><<<dim3(T, KH), 128, smem>>>(K + (r % L) * plane, V + (r % L) * plane, bt, tp, ts, sb, nb, bs, KH, N, out);
			cudaEventRecord(ev[3 + 2 * r]);
		}
		cudaEventSynchronize(ev[2 * R + 1]);
		each = 0;
		for (int r = 0; r < R; r++) {
			float ms;
			cudaEventElapsedTime(&ms, ev[2 + 2 * r], ev[3 + 2 * r]);
			each += ms;
		}
	}
	cudaError_t e = cudaGetLastError();
	printf("chain %d epilogue %d: back to back %.2f us, event pairs %.2f us %s\n", C, E, 1000 * b2b / R, 1000 * each / R, e == cudaSuccess ? "" : cudaGetErrorString(e));
}
int main() {
	const int T = 64, KH = 8, HD = 128, N = 1024, bs = 16, nb = N / bs, L = 4;
	long plane = (long)T * N * KH * HD;
	u16 *K, *V;
	int *bt, *tp, *ts, *sb;
	float *out;
	cudaMalloc(&K, 2 * L * plane), cudaMalloc(&V, 2 * L * plane);
	cudaMemset(K, 1, 2 * L * plane), cudaMemset(V, 1, 2 * L * plane);
	cudaMalloc(&bt, 4 * T * nb), cudaMalloc(&tp, 4 * T), cudaMalloc(&ts, 4 * T), cudaMalloc(&sb, 4 * T);
	cudaMalloc(&out, 4L * T * KH * 4 * HD);
	std::vector<int> o(T * nb), p(T), s(T), q(T);
	for (int i = 0; i < T * nb; i++) o[i] = i;
	for (int i = 0; i < T; i++) p[i] = N - 1, s[i] = i, q[i] = i * nb;
	cudaMemcpy(bt, o.data(), 4 * T * nb, cudaMemcpyHostToDevice);
	cudaMemcpy(tp, p.data(), 4 * T, cudaMemcpyHostToDevice);
	cudaMemcpy(ts, s.data(), 4 * T, cudaMemcpyHostToDevice);
	cudaMemcpy(sb, q.data(), 4 * T, cudaMemcpyHostToDevice);
	run<false, false>(K, V, plane, L, bt, tp, ts, sb, T, KH, nb, bs, N, out);
	run<true, false>(K, V, plane, L, bt, tp, ts, sb, T, KH, nb, bs, N, out);
	run<false, true>(K, V, plane, L, bt, tp, ts, sb, T, KH, nb, bs, N, out);
	run<true, true>(K, V, plane, L, bt, tp, ts, sb, T, KH, nb, bs, N, out);
	return 0;
}
