// The read ceiling of a GPU, and what the decode products' way of reading
// costs against it. Buffers cycled past L2, launches back to back in a CUDA
// graph. Three tables:
// - stream: a plain read by loads in flight a thread (U), threads and
//   blocks a multiprocessor, L2 prefetch hint (pf) and order (gs:
//   grid-stride; blk: a contiguous chunk a block), over 100, 25 and 16 MB;
// - pattern: rows of RB bytes (I + I / 32: kiln's FP8 rows with their
//   scales) in groups of 16; an item is 128 bytes of each of a group's 16
//   rows, read as f8mv reads it (rows), as one contiguous 2 KB piece
//   (tiled: the same bytes laid out item by item) or as 512 bytes of each
//   of 4 rows (rows512);
// - work: K dependent integer operations after each 64 bytes a lane reads,
//   in f8mv's register pipeline and in a bulk-copy (TMA) ring through
//   shared memory.
// docs/performance.md has the figures ("FP8 decode products on Hopper's f16
// tensor cores"). On the GPU machine:
//
//   nvcc -O3 -arch=sm_90a -o /tmp/readceiling scripts/readceiling/readceiling.cu && /tmp/readceiling
#include <cstdio>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
// ld streams 16 bytes past L1, with an L2 prefetch hint of PF bytes (0: none).
template <int PF = 0> __device__ __forceinline__ uint4 ld(const void *p) {
	uint4 v;
	if (PF == 256)
		asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
	else if (PF == 128)
		asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
	else
		asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
	return v;
}
// MODE 0: grid-stride; 1: each block a contiguous chunk, threads striding within.
template <int U, int PF, int MODE> __global__ void stream(const uint4 *p, long n, unsigned *out) {
	unsigned acc = 0;
	long lo = 0, hi = n, stride = (long)gridDim.x * blockDim.x, i = blockIdx.x * (long)blockDim.x + threadIdx.x;
	if (MODE == 1) {
		long chunk = (n + gridDim.x - 1) / gridDim.x;
		lo = blockIdx.x * chunk, hi = min(n, lo + chunk), stride = blockDim.x, i = lo + threadIdx.x;
	}
	for (; i + (U - 1) * stride < hi; i += U * stride) {
		uint4 v[U];
#pragma unroll
		for (int k = 0; k < U; k++) v[k] = ld<PF>(p + i + k * stride);
#pragma unroll
		for (int k = 0; k < U; k++) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
	}
	for (; i < hi; i += stride) {
		uint4 v = ld<PF>(p + i);
		acc ^= v.x ^ v.y ^ v.z ^ v.w;
	}
	if (acc == 0x9e3779b9u) out[0] = acc;
}
__device__ __forceinline__ unsigned work(unsigned a, uint4 x, uint4 y, int K) {
	for (int i = 0; i < K; i++) a = a * 0x9e3779b1u + (x.x ^ y.w);
	return a ^ x.y ^ y.z;
}
struct Raw { uint4 a0, a1, b0, b1; };
// MODE 0: rows; 1: tiled (lane reads 16 B at 16 lane + 512 k); 2: rows512.
// U items in flight a lane.
template <int U, int MODE>
__global__ void rd(const unsigned char *w, int O, int I, long RB, int K, unsigned *out) {
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5, g = lane >> 2, q = lane & 3;
	int NB = I >> 7, groups = O / 16;
	int n = (NB - 1 - warp) / W + 1, ng = blockIdx.x < groups ? (groups - 1 - blockIdx.x) / gridDim.x + 1 : 0;
	int total = n * ng;
	unsigned acc = 0;
	auto load = [&](Raw &r, int i) {
		int gi = i / n, bi = i % n, grp = blockIdx.x + gi * gridDim.x, b = warp + bi * W;
		if (MODE == 0) {
			const unsigned char *pa = w + (long)(grp * 16 + g) * RB + 128 * b + 16 * q, *pb = pa + 8 * RB;
			r.a0 = ld(pa), r.a1 = ld(pa + 64), r.b0 = ld(pb), r.b1 = ld(pb + 64);
		} else if (MODE == 1) {
			const unsigned char *p = w + ((long)grp * NB + b) * 2048 + 16 * lane;
			r.a0 = ld(p), r.a1 = ld(p + 512), r.b0 = ld(p + 1024), r.b1 = ld(p + 1536);
		} else {
			const unsigned char *p = w + (long)(grp * 16) * RB + 512 * (b % (NB / 4)) + 16 * lane + (long)(b / (NB / 4)) * 4 * RB;
			r.a0 = ld(p), r.a1 = ld(p + RB), r.b0 = ld(p + 2 * RB), r.b1 = ld(p + 3 * RB);
		}
	};
	Raw raw[U];
#pragma unroll
	for (int k = 0; k < U; k++) if (k < total) load(raw[k], k);
	for (int i = 0; i < total; i += U) {
#pragma unroll
		for (int k = 0; k < U; k++) {
			if (i + k >= total) break;
			Raw c = raw[k];
			if (i + k + U < total) load(raw[k], i + k + U);
			acc = work(acc, c.a0, c.b1, K) ^ c.a1.x ^ c.b0.y;
		}
	}
	if (acc == 0x9e3779b9u) out[0] = acc;
}
__device__ __forceinline__ unsigned sa(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void bar_init(unsigned long long *b, int n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sa(b)), "r"(n)); }
__device__ __forceinline__ void bar_expect(unsigned long long *b, int bytes) {
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(b)), "r"(bytes));
}
__device__ __forceinline__ void bulk(void *dst, const void *src, int bytes, unsigned long long *b) {
	asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(sa(dst)), "l"(src), "r"(bytes), "r"(sa(b)) : "memory");
}
__device__ __forceinline__ void bar_wait(unsigned long long *b, unsigned ph) {
	asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}" ::"r"(sa(b)), "r"(ph) : "memory");
}
// ring: a block takes contiguous chunks of CH bytes (chunk blockIdx.x, +
// gridDim.x, ...) through S stages; thread 0 refills a stage once every
// warp is past it.
template <int S>
__global__ void ring(const unsigned char *w, long bytes, int CH, int K, unsigned *out) {
	extern __shared__ __align__(128) unsigned char sm[];
	__shared__ unsigned long long full[S];
	int nch = (int)(bytes / CH), mine = blockIdx.x < nch ? (nch - 1 - blockIdx.x) / gridDim.x + 1 : 0;
	if (threadIdx.x == 0) {
		for (int s = 0; s < S; s++) bar_init(&full[s], 1);
		asm volatile("fence.proxy.async.shared::cta;");
	}
	__syncthreads();
	if (threadIdx.x == 0)
		for (int s = 0; s < S && s < mine; s++) {
			bar_expect(&full[s], CH);
			bulk(sm + s * CH, w + (long)(blockIdx.x + s * gridDim.x) * CH, CH, &full[s]);
		}
	unsigned acc = 0;
	for (int i = 0; i < mine; i++) {
		int s = i % S;
		bar_wait(&full[s], (i / S) & 1);
		const uint4 *p = (const uint4 *)(sm + s * CH);
		for (int j = threadIdx.x * 4; j < CH / 16; j += blockDim.x * 4) {
			uint4 a = p[j], b = p[j + 1], c = p[j + 2], d = p[j + 3];
			acc = work(acc, a, d, K) ^ b.x ^ c.y;
		}
		__syncthreads();
		if (threadIdx.x == 0 && i + S < mine) {
			bar_expect(&full[s], CH);
			bulk(sm + s * CH, w + (long)(blockIdx.x + (i + S) * gridDim.x) * CH, CH, &full[s]);
		}
	}
	if (acc == 0x9e3779b9u) out[0] = acc;
}
typedef void (*Stream)(const uint4 *, long, unsigned *);
typedef void (*Kern)(const unsigned char *, int, int, long, int, unsigned *);
int main() {
	int sms;
	cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
	const int NBUF = 8;
	long maxb = 110L << 20;
	unsigned char *buf[NBUF];
	for (int i = 0; i < NBUF; i++) { CK(cudaMalloc(&buf[i], maxb)); CK(cudaMemset(buf[i], i, maxb)); }
	unsigned *out;
	CK(cudaMalloc(&out, 4));
	cudaStream_t s;
	CK(cudaStreamCreate(&s));
	cudaEvent_t e0, e1;
	cudaEventCreate(&e0), cudaEventCreate(&e1);
	// time prints the time of one launch(j) of sz bytes, L of them (j =
	// 0..L-1) in a graph.
	auto time = [&](const char *name, long sz, int L, auto launch) {
		cudaGraph_t gr;
		cudaGraphExec_t ge;
		cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
		for (int j = 0; j < L; j++) launch(j);
		cudaStreamEndCapture(s, &gr);
		if (cudaGraphInstantiate(&ge, gr, 0) != cudaSuccess) { printf("%s: instantiate failed\n", name); return; }
		cudaGraphLaunch(ge, s);
		if (cudaStreamSynchronize(s) != cudaSuccess) { printf("%s: %s\n", name, cudaGetErrorString(cudaGetLastError())); return; }
		const int R = 10;
		cudaEventRecord(e0, s);
		for (int r = 0; r < R; r++) cudaGraphLaunch(ge, s);
		cudaEventRecord(e1, s);
		cudaEventSynchronize(e1);
		float ms;
		cudaEventElapsedTime(&ms, e0, e1);
		double per = ms * 1e-3 / (R * L);
		printf("%-44s %7.2f us  %.2f TB/s\n", name, per * 1e6, sz / per / 1e12);
		fflush(stdout);
		cudaGraphExecDestroy(ge), cudaGraphDestroy(gr);
	};
	char nm[128];
	// stream: 8 buffers a graph, each in whole pieces of sz bytes.
	struct { const char *name; Stream k; } ss[] = {
		{"U1 pf0 gs", stream<1, 0, 0>}, {"U2 pf0 gs", stream<2, 0, 0>}, {"U4 pf0 gs", stream<4, 0, 0>}, {"U8 pf0 gs", stream<8, 0, 0>},
		{"U2 pf256 gs", stream<2, 256, 0>}, {"U4 pf256 gs", stream<4, 256, 0>}, {"U4 pf128 gs", stream<4, 128, 0>},
		{"U2 pf0 blk", stream<2, 0, 1>}, {"U4 pf0 blk", stream<4, 0, 1>}, {"U8 pf0 blk", stream<8, 0, 1>}, {"U4 pf256 blk", stream<4, 256, 1>},
	};
	const long piece = 100L << 20;
	for (long sz : {100L << 20, 25L << 20, 16L << 20})
		for (auto &k : ss)
			for (int th : {256, 512})
				for (int bp : {1, 2, 4, 8}) {
					if (th * bp > 2048) continue;
					snprintf(nm, sizeof nm, "%4ld MB %s %d thr %d/SM", sz >> 20, k.name, th, bp);
					long per = piece / sz;  // whole pieces a buffer: none crosses its end
					time(nm, sz, (int)(NBUF * per), [&](int j) {
						const uint4 *b = (const uint4 *)(buf[j / per] + j % per * sz);
						k.k<<<sms * bp, th, 0, s>>>(b, sz / 16, out);
					});
				}
	struct { const char *name; Kern k; } ks[] = {
		{"rows U1", rd<1, 0>}, {"rows U2", rd<2, 0>}, {"rows U3", rd<3, 0>},
		{"tiled U1", rd<1, 1>}, {"tiled U2", rd<2, 1>}, {"tiled U3", rd<3, 1>},
		{"rows512 U2", rd<2, 2>},
	};
	struct { const char *name; int O, I; } shapes[] = {{"gate/up 24576x4096", 24576, 4096}, {"qkv 6144x4096", 6144, 4096}, {"down 4096x12288", 4096, 12288}};
	for (auto &sh : shapes)
		for (auto &k : ks)
			for (int th : {128, 256, 512})
				for (int bp : {1, 2, 4}) {
					if (th * bp > 2048 || th * bp < 256) continue;
					long RB = sh.I + sh.I / 32;
					snprintf(nm, sizeof nm, "%s %s %d thr %d/SM", sh.name, k.name, th, bp);
					time(nm, RB * sh.O, NBUF, [&](int j) { k.k<<<sms * bp, th, 0, s>>>(buf[j], sh.O, sh.I, RB, 0, out); });
				}
	const int O = 24576, I = 4096;
	long RB = I + I / 32, sz = RB * O;
	for (int K : {0, 16, 64, 128, 256}) {
		for (int bp : {2, 4}) {
			snprintf(nm, sizeof nm, "rows U2 256 thr %d/SM K=%d", bp, K);
			time(nm, sz, NBUF, [&](int j) { rd<2, 0><<<sms * bp, 256, 0, s>>>(buf[j], O, I, RB, K, out); });
		}
		snprintf(nm, sizeof nm, "rows U4 256 thr 2/SM K=%d", K);
		time(nm, sz, NBUF, [&](int j) { rd<4, 0><<<sms * 2, 256, 0, s>>>(buf[j], O, I, RB, K, out); });
		for (int CH : {8192, 16384, 32768})
			for (int bp : {1, 2, 3}) {
				int smem = 4 * CH;
				if (smem * bp > 220 * 1024) continue;
				cudaFuncSetAttribute(ring<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
				snprintf(nm, sizeof nm, "ring 4 stages of %d B 256 thr %d/SM K=%d", CH, bp, K);
				time(nm, sz, NBUF, [&](int j) { ring<4><<<sms * bp, 256, smem, s>>>(buf[j], sz, CH, K, out); });
			}
	}
	printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
