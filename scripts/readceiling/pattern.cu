// Does the decode products' access pattern cap the read rate? Rows of RB bytes
// (4096 + 128 of scales), groups of 16 rows; an item is 128 bytes of each of a
// group's 16 rows, read as f8mv reads it (ROWS) or as one contiguous 2 KB piece
// (TILED: the same bytes, laid out item by item).
//
//   nvcc -O3 -arch=sm_90 -o /tmp/pattern scripts/readceiling/pattern.cu && /tmp/pattern
#include <cstdio>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
__device__ __forceinline__ uint4 ld(const unsigned char *p) {
	uint4 v;
	asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
	return v;
}
struct Raw { uint4 a0, a1, b0, b1; };
// MODE 0: f8mv rows; 1: tiled (item contiguous, lane reads 16 B at 16*lane + 512*k);
// 2: warp-contiguous rows: a warp's item is 512 B of each of 4 rows (lane: 16 B, rows r..r+3).
template <int U, int MODE>
__global__ void rd(const unsigned char *w, int O, int I, long RB, unsigned *out) {
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
			acc ^= c.a0.x ^ c.a1.y ^ c.b0.z ^ c.b1.w ^ c.a0.w ^ c.b1.x;
		}
	}
	if (acc == 0x9e3779b9u) out[0] = acc;
}
typedef void (*K)(const unsigned char *, int, int, long, unsigned *);
int main() {
	int sms;
	cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
	const int NBUF = 8;
	long maxb = 110L << 20;
	unsigned char *buf[NBUF];
	for (int i = 0; i < NBUF; i++) { CK(cudaMalloc(&buf[i], maxb)); cudaMemset(buf[i], i, maxb); }
	unsigned *out;
	CK(cudaMalloc(&out, 4));
	cudaStream_t s;
	cudaStreamCreate(&s);
	struct { const char *name; K k; } ks[] = {
		{"rows U1", rd<1, 0>}, {"rows U2", rd<2, 0>}, {"rows U3", rd<3, 0>},
		{"tiled U1", rd<1, 1>}, {"tiled U2", rd<2, 1>}, {"tiled U3", rd<3, 1>},
		{"rows512 U2", rd<2, 2>},
	};
	struct { const char *name; int O, I; } shapes[] = {{"gate/up 24576x4096", 24576, 4096}, {"qkv 6144x4096", 6144, 4096}, {"down 4096x12288", 4096, 12288}};
	int threads[] = {128, 256, 512}, bps[] = {1, 2, 4};
	cudaEvent_t e0, e1;
	cudaEventCreate(&e0), cudaEventCreate(&e1);
	for (auto &sh : shapes)
		for (auto &k : ks)
			for (int th : threads)
				for (int bp : bps) {
					if (th * bp > 2048 || th * bp < 256) continue;
					int grid = sms * bp;
					long RB = sh.I + sh.I / 32, sz = RB * sh.O;
					int L = 8;
					cudaGraph_t gr;
					cudaGraphExec_t ge;
					CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
					for (int j = 0; j < L; j++) k.k<<<grid, th, 0, s>>>(buf[j], sh.O, sh.I, RB, out);
					CK(cudaStreamEndCapture(s, &gr));
					CK(cudaGraphInstantiate(&ge, gr, 0));
					CK(cudaGraphLaunch(ge, s));
					CK(cudaStreamSynchronize(s));
					const int R = 10;
					cudaEventRecord(e0, s);
					for (int r = 0; r < R; r++) cudaGraphLaunch(ge, s);
					cudaEventRecord(e1, s);
					CK(cudaEventSynchronize(e1));
					float ms;
					cudaEventElapsedTime(&ms, e0, e1);
					double per = ms * 1e-3 / (R * L);
					printf("%-20s %-11s %3d thr %d/SM  %7.2f us  %.2f TB/s\n", sh.name, k.name, th, bp, per * 1e6, sz / per / 1e12);
					fflush(stdout);
					cudaGraphExecDestroy(ge), cudaGraphDestroy(gr);
				}
	printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
