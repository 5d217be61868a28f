// Mixture of experts: routing on the device and expert products that read
// the chosen expert's weights through device-side indices (graph-safe).
// Correct first: each (token, choice) pair is its own GEMV.

// moe_route: a warp per token, each lane holding experts lane, lane + 32,
// ... (E <= 1024). Softmax over the E router logits (f32), then the top k
// in torch.topk's order (higher probability first, ties to the lower
// index), picked one at a time: each lane's best expert not yet taken,
// then the warp's best of those by shuffles; optional renormalisation. A
// rank of a model split by experts holds experts [e0, e0 + held): a choice
// of another rank's expert gets sel -1 and weight 0 (its rank adds it).
// (A block a token, a thread an expert, ranking the warps' first k: 10-16
// us at 512 experts and top 10 on an H200, its barriers most of it.)
#define MOE_ROUTE_PER_LANE 32
extern "C" __global__ void __launch_bounds__(32) moe_route(const float *logits, int E, int K, int norm, int e0, int held, int *sel,
		float *wts) {
	pdl_trigger();  // the experts' products follow (they wait for sel)
	pdl_wait();
	int t = blockIdx.x, lane = threadIdx.x;
	const float *lt = logits + (long)t * E;
	float p[MOE_ROUTE_PER_LANE];
	float mx = -INF;
#pragma unroll
	for (int j = 0; j < MOE_ROUTE_PER_LANE; j++) {
		int e = lane + 32 * j;
		p[j] = e < E ? lt[e] : -INF;
		mx = fmaxf(mx, p[j]);
	}
	mx = warp_max(mx);
	float s = 0.f;
#pragma unroll
	for (int j = 0; j < MOE_ROUTE_PER_LANE; j++) {
		int e = lane + 32 * j;
		p[j] = e < E ? expf(p[j] - mx) : -1.f;  // padding: below every probability
		s += e < E ? p[j] : 0.f;
	}
	s = warp_sum(s);
	unsigned taken = 0;
	float mine = 0.f;
	int mi = 0;
	for (int r = 0; r < K; r++) {
		float bp = -2.f;
		int bj = 0;
#pragma unroll
		for (int j = 0; j < MOE_ROUTE_PER_LANE; j++)
			if (!(taken >> j & 1) && p[j] > bp) bp = p[j], bj = j;
		int bi = lane + 32 * bj;
#pragma unroll
		for (int d = 16; d > 0; d >>= 1) {
			float op = __shfl_xor_sync(0xffffffffu, bp, d);
			int oi = __shfl_xor_sync(0xffffffffu, bi, d);
			if (op > bp || (op == bp && oi < bi)) bp = op, bi = oi;
		}
		if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
		if (lane == r) mine = bp, mi = bi;
	}
	float pr = lane < K ? mine / s : 0.f;
	float tot = warp_sum(pr);
	if (lane < K) {
		bool ours = mi >= e0 && mi < e0 + held;
		sel[t * K + lane] = ours ? mi - e0 : -1;
		wts[t * K + lane] = !ours ? 0.f : norm ? pr / tot : pr;
	}
}

// moe_gemv: y[r, o] = sum_i x[r / xdiv, i] * w[sel[r], o, i] for rows r of
// (token, choice) pairs (sel == 0 and xdiv == 1: a plain per-row product);
// a row whose sel is -1 (another rank's expert) is left as it is.
// Grid (ceil(O / 8), R), block 256: a warp per output.
extern "C" __global__ void moe_gemv(float *y, const float *x, int xdiv, const void *w, int wdt, const int *sel, int O, int I) {
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int o = blockIdx.x * 8 + warp, r = blockIdx.y;
	if (o >= O) return;
	long e = sel ? sel[r] : 0;
	if (e < 0) return;
	long base = (e * O + o) * I;
	const float *xr = x + (long)(r / xdiv) * I;
	float acc = 0.f;
	for (int i = lane; i < I; i += 32) acc += xr[i] * ld(w, base + i, wdt);
	acc = warp_sum(acc);
	if (lane == 0) y[(long)r * O + o] = acc;
}

// scan1024 returns the inclusive sum of v over threads 0..threadIdx.x of a
// block of 1024 threads; buf holds 1024 ints.
__device__ int scan1024(int v, int *buf) {
	int e = threadIdx.x;
	buf[e] = v;
	__syncthreads();
	for (int off = 1; off < 1024; off <<= 1) {
		int add = e >= off ? buf[e - off] : 0;
		__syncthreads();
		buf[e] += add;
		__syncthreads();
	}
	int r = buf[e];
	__syncthreads();
	return r;
}

// moe_group: one block of 1024 threads (E <= 1024). Expert e's rows are
// order[start[e] .. start[e+1]) (in no particular order: each row's product
// is its own); its tiles of tm rows are tiles[2i] = e, tiles[2i+1] = the
// tile's first index in order, for i < *ntiles. Rows of other ranks'
// experts (sel -1) close order, in no tile.
extern "C" __global__ void __launch_bounds__(1024) moe_group(const int *sel, int R, int E, int tm, int *start, int *order, int *tiles,
		int *ntiles) {
	__shared__ int cnt[1024], cur[1024], other;
	int e = threadIdx.x;
	cnt[e] = 0;
	__syncthreads();
	for (int r = threadIdx.x; r < R; r += blockDim.x)
		if (sel[r] >= 0) atomicAdd(&cnt[sel[r]], 1);
	__syncthreads();
	int v = cnt[e];
	int first = scan1024(v, cur) - v;
	if (e < E) start[e] = first;
	if (e == E - 1) start[E] = first + v;
	int nt = (v + tm - 1) / tm;
	int t0 = scan1024(nt, cur) - nt;
	for (int i = 0; i < nt; i++) {
		tiles[2 * (t0 + i)] = e;
		tiles[2 * (t0 + i) + 1] = first + i * tm;
	}
	if (e == 1023) *ntiles = t0 + nt;
	cur[e] = first;
	if (e == E - 1) other = first + v;
	__syncthreads();
	for (int r = threadIdx.x; r < R; r += blockDim.x) order[atomicAdd(sel[r] >= 0 ? &cur[sel[r]] : &other, 1)] = r;
}

// moe_split: x (n floats) as two bf16 parts, x = hi + lo, for the router
// product on tensor cores (two products, each in float32 accumulators).
extern "C" __global__ void moe_split(u16 *hi, u16 *lo, const float *x, long n) {
	for (long k = blockIdx.x * (long)blockDim.x + threadIdx.x; k < n; k += (long)gridDim.x * blockDim.x) {
		float v = x[k];
		u16 h = f2bf(v);
		hi[k] = h;
		lo[k] = f2bf(v - bf2f(h));
	}
}

// moe_gather: row j of xg is x[order[j] / xdiv] in bf16, I elements (a
// multiple of 4). Grid R, block 256.
extern "C" __global__ void moe_gather(u16 *xg, const float *x, int xdiv, const int *order, int I) {
	int j = blockIdx.x;
	const float4 *src = (const float4 *)(x + (long)(order[j] / xdiv) * I);
	uint2 *dst = (uint2 *)(xg + (long)j * I);
	for (int i = threadIdx.x; i < I / 4; i += blockDim.x) {
		float4 v = src[i];
		dst[i] = make_uint2(f2bf(v.x) | (unsigned)f2bf(v.y) << 16, f2bf(v.z) | (unsigned)f2bf(v.w) << 16);
	}
}

// moe_group_mm64, moe_group_mm128: the grouped products (group_mm,
// moe_mm.cuh) of bf16 experts in tiles of 64 and 128 rows, whose weights
// load by cp.async; shared memory moeGroupSmem. Their registers are capped
// at 128 and the shared-memory carveout is the largest (preferSmem): four
// and two blocks a multiprocessor (two blocks of 64-row tiles left the
// schedulers without a ready warp 68% of the time: ncu, H100, 2026-11-28).
struct BF16Tiles {
	const u16 *w;
	int O, I;
	__device__ static int buf(int kt) { return kt % MG_STAGES; }
	__device__ __forceinline__ void fetch(u16 *sB, int st, int e, int o0, int kt) {
		const u16 *wb = w + (long)e * O * I;
		int k0 = kt * MG_BK;
		for (int c = threadIdx.x; c < MG_BN * (MG_BK / 8); c += blockDim.x) {
			int r = c / (MG_BK / 8), col = c % (MG_BK / 8) * 8;
			cp_async16(smem_addr(&sB[r * MG_P + col]), wb + (long)min(o0 + r, O - 1) * I + k0 + col);
		}
	}
	__device__ __forceinline__ void ready(u16 *sB, int st, int kt) {}
};

#define MOE_GROUP_MM(BM, MINB) \
	extern "C" __global__ void __launch_bounds__(2 * BM, MINB) moe_group_mm##BM(float *y, const u16 *xg, const u16 *w, const int *start, \
			const int *order, const int *tiles, const int *ntiles, int O, int I) { \
		extern __shared__ uint4 mg_smem[]; \
		u16(*sA)[BM * MG_P] = (u16(*)[BM * MG_P])mg_smem; \
		u16(*sB)[MG_BN * MG_P] = (u16(*)[MG_BN * MG_P])(sA + MG_STAGES); \
		BF16Tiles wl{w, O, I}; \
		group_mm<BM>(y, xg, wl, sA, sB, start, order, tiles, ntiles, O, I); \
	}
MOE_GROUP_MM(64, 4)
MOE_GROUP_MM(128, 2)

// moe_combine: out[t, j] += sum_k wts[t, k] * y[t * K + k, j], and, with a
// shared expert, + sigmoid(x[t] . wg) * ys[t, j]. Grid (T, column blocks),
// 256 threads, a column each a round; each block makes the shared expert's
// gate itself (a dot of H: cheaper than a launch of its own at decode). A
// row of weight 0 is another rank's expert, its y never written: read, not
// added.
extern "C" __global__ void moe_combine(float *__restrict__ out, const float *__restrict__ y, const float *__restrict__ wts, int K, int H,
		const float *__restrict__ ys, const float *__restrict__ x, const void *wg, int wgdt) {
	__shared__ float red[32];
	pdl_trigger();
	pdl_wait();
	int t = blockIdx.x;
	float g = 0.f;
	if (ys) {
		float d = 0.f;
#pragma unroll 8
		for (int i = threadIdx.x; i < H; i += blockDim.x) d += x[(long)t * H + i] * ld(wg, i, wgdt);
		d = block_sum(d, red);
		g = 1.f / (1.f + __expf(-d));
	}
	for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < H; j += gridDim.y * blockDim.x) {
		float a = out[(long)t * H + j];
		// Eight rows' loads at a time, none waiting on another's weight (a
		// branch on each weight before its row's load made ten round trips
		// in turn: 9.5 us a decode step of 10 experts, H200).
		for (int k0 = 0; k0 < K; k0 += 8) {
			float wk[8], v[8];
#pragma unroll
			for (int u = 0; u < 8; u++) {
				int k = k0 + u;
				wk[u] = k < K ? wts[t * K + k] : 0.f;
				v[u] = k < K ? y[((long)t * K + k) * H + j] : 0.f;
			}
#pragma unroll
			for (int u = 0; u < 8; u++)
				if (wk[u] != 0.f) a += wk[u] * v[u];
		}
		if (ys) a += g * ys[(long)t * H + j];
		out[(long)t * H + j] = a;
	}
}
