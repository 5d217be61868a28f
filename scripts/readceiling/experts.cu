// How fast a decode step's expert rows can be read: the bytes of K experts
// chosen among E in a layer's stacked weights (each expert one region of
// RB bytes), against the same bytes in one region, and against a larger
// read (the ramp of a launch). Every launch reads another layer's experts
// (past L2), launches back to back in a CUDA graph: each a full launch, or
// launched early (PDL) but reading only once the one before has ended, as
// a decode step's dependent products run.
// docs/performance.md has the figures ("Expert rows at the read ceiling").
// On the GPU machine:
//
//   nvcc -O3 -arch=sm_90a -o /tmp/experts scripts/readceiling/experts.cu && /tmp/experts
#include <utility>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <vector>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__device__ __forceinline__ uint4 ld(const void *p) {
	uint4 v;
	asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
	return v;
}

// regions: R regions of n16 16-byte units each, region r at base +
// off[r]; blockIdx.y is the region, and its gridDim.x blocks take
// contiguous shares of it, U loads of 16 bytes a thread in flight.
// PDL: launched to overlap the kernel before (programmatic dependent
// launch), it lets the next one start at once and waits for the one before
// ends before its first load, as a product whose rows the kernel before
// chose (the experts) does.
template <int U, bool PDL>
__global__ void regions(const char *base, const long *off, long n16, unsigned *out) {
	if (PDL) asm volatile("griddepcontrol.launch_dependents;");
	if (PDL) asm volatile("griddepcontrol.wait;" ::: "memory");
	const char *p = base + off[blockIdx.y];
	long chunk = (n16 + gridDim.x - 1) / gridDim.x;
	long lo = blockIdx.x * chunk, hi = min(n16, lo + chunk);
	unsigned acc = 0;
	for (long i = lo + threadIdx.x; i < hi; i += U * blockDim.x) {
		uint4 v[U];
#pragma unroll
		for (int k = 0; k < U; k++) {
			long j = i + k * (long)blockDim.x;
			v[k] = j < hi ? ld(p + 16 * j) : make_uint4(0, 0, 0, 0);
		}
#pragma unroll
		for (int k = 0; k < U; k++) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
	}
	if (acc == 0x12345678u) out[0] = acc;  // keeps the loads
}

int main() {
	int sms;
	CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
	const int L = 32, E = 512, K = 10;
	const long gu = 1024L * 2112, dn = 2048L * 528;  // Coder-Next's FP8 gate/up and down experts
	char *buf;
	long layer = (long)E * gu;
	CK(cudaMalloc(&buf, L * layer));
	CK(cudaMemset(buf, 1, L * layer));
	long *doff;
	CK(cudaMalloc(&doff, 64 * 8 * L));
	unsigned *out;
	CK(cudaMalloc(&out, 4));
	cudaStream_t st;
	CK(cudaStreamCreate(&st));
	srand(1);
	printf("%-44s %8s %10s %8s\n", "case", "MB", "us/launch", "TB/s");
	// case: K regions of rb bytes: apart (random experts of each layer),
	// adjacent (experts 0..K-1), or one region of K*rb (the same bytes).
	struct Case {
		const char *name;
		long rb;
		int k, mode;  // mode 0 random, 1 adjacent, 2 one region
	} cases[] = {
		{"gate/up, 10 random experts", gu, K, 0}, {"gate/up, 10 adjacent experts", gu, K, 1}, {"gate/up bytes, one region", gu, K, 2},
		{"down, 10 random experts", dn, K, 0},     {"down, 10 adjacent experts", dn, K, 1},     {"down bytes, one region", dn, K, 2},
		{"one region of 100 MB", gu, 48, 2},       {"one region of 4 MB", gu, 2, 2},
	};
	for (auto &c : cases) {
		std::vector<long> off(64 * L);
		int R = c.mode == 2 ? 1 : c.k;
		long n16 = (c.mode == 2 ? c.k * c.rb : c.rb) / 16;
		for (int l = 0; l < L; l++) {
			std::vector<int> ex(E);
			for (int e = 0; e < E; e++) ex[e] = e;
			for (int e = E - 1; e > 0; e--) std::swap(ex[e], ex[rand() % (e + 1)]);
			for (int r = 0; r < R; r++) off[64 * l + r] = l * layer + (c.mode == 0 ? ex[r] : r) * c.rb;
		}
		CK(cudaMemcpy(doff, off.data(), 8 * off.size(), cudaMemcpyHostToDevice));
		for (int bs : {2, 4}) for (int pdl : {0, 1}) {
			cudaGraph_t g;
			cudaGraphExec_t ge;
			CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
			dim3 grid((bs * sms + R - 1) / R, R);
			for (int it = 0; it < 64; it++) {
				if (!pdl) {
					regions<4, false><<<grid, 512, 0, st>>>(buf, doff + 64 * (it % L), n16, out);
					continue;
				}
				cudaLaunchConfig_t cfg = {};
				cudaLaunchAttribute at[1];
				at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
				at[0].val.programmaticStreamSerializationAllowed = 1;
				cfg.gridDim = grid, cfg.blockDim = dim3(512), cfg.stream = st, cfg.attrs = at, cfg.numAttrs = 1;
				CK(cudaLaunchKernelEx(&cfg, regions<4, true>, (const char *)buf, (const long *)(doff + 64 * (it % L)), n16, out));
			}
			CK(cudaStreamEndCapture(st, &g));
			CK(cudaGraphInstantiate(&ge, g, 0));
			CK(cudaGraphLaunch(ge, st));
			cudaEvent_t a, b;
			cudaEventCreate(&a);
			cudaEventCreate(&b);
			cudaEventRecord(a, st);
			for (int rep = 0; rep < 5; rep++) CK(cudaGraphLaunch(ge, st));
			cudaEventRecord(b, st);
			CK(cudaEventSynchronize(b));
			float ms;
			cudaEventElapsedTime(&ms, a, b);
			double us = ms * 1e3 / (5 * 64), bytes = (double)R * n16 * 16;
			char name[96];
			snprintf(name, sizeof name, "%s (%d blocks/SM%s)", c.name, bs, pdl ? ", PDL" : "");
			printf("%-44s %8.1f %10.2f %8.2f\n", name, bytes / 1e6, us, bytes / us / 1e6);
			cudaEventDestroy(a);
			cudaEventDestroy(b);
			cudaGraphExecDestroy(ge);
			cudaGraphDestroy(g);
		}
	}
	return 0;
}
