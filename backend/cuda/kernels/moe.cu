// Mixture of experts: routing on the device and expert products that read
// the chosen expert's weights through device-side indices (graph-safe).
// Correct first: each (token, choice) pair is its own GEMV.

// moe_route: a warp per token ranks its router logits (moe_rank), eight
// tokens a block (a block of one warp a token left a 4K prompt's 4096
// blocks at 32 warps a multiprocessor, the blocks' limit).
extern "C" __global__ void __launch_bounds__(256) moe_route(const float *logits, int T, int E, int K, int norm, int e0, int held, int *sel,
		float *wts) {
	pdl_trigger();  // the experts' products follow (they wait for sel)
	pdl_wait();
	int t = blockIdx.x * 8 + (threadIdx.x >> 5);
	if (t < T) moe_rank_e(logits + (long)t * E, E, K, norm, e0, held, sel + t * K, wts + t * K, threadIdx.x & 31);
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

// moe_count: block b counts the experts of rows [b, b + 1) MOE_GROUP_ROWS
// into bcnt[b (E + 1) + e], e = E for rows of other ranks' experts (sel
// -1). Grid ceil(R / MOE_GROUP_ROWS), 1024 threads.
extern "C" __global__ void __launch_bounds__(1024) moe_count(const int *sel, int R, int E, int *bcnt) {
	__shared__ int cnt[1025];
	for (int e = threadIdx.x; e <= E; e += blockDim.x) cnt[e] = 0;
	__syncthreads();
	int r = blockIdx.x * MOE_GROUP_ROWS + threadIdx.x;
	if (r < R) atomicAdd(&cnt[sel[r] >= 0 ? sel[r] : E], 1);
	__syncthreads();
	for (int e = threadIdx.x; e <= E; e += blockDim.x) bcnt[blockIdx.x * (E + 1) + e] = cnt[e];
}

// moe_group: one block of 1024 threads (E <= 1024). Expert e's rows are
// order[start[e] .. start[e+1]) (in no particular order: each row's product
// is its own); its tiles of tm rows are tiles[2i] = e, tiles[2i+1] = the
// tile's first index in order, for i < *ntiles. Rows of other ranks'
// experts (sel -1) close order, in no tile. With nb == 0 the block counts
// and places the rows itself; else moe_count's nb blocks counted them
// (bcnt), this block turns each count into where the block's rows of the
// expert start in order, in place, and moe_scatter places them. (One
// block placing a 4K prompt's 40960 rows of 512 experts took 57 us, its
// scattered stores in turn.)
extern "C" __global__ void __launch_bounds__(1024) moe_group(const int *sel, int R, int E, int tm, int nb, int *bcnt, int *start,
		int *order, int *tiles, int *ntiles) {
	__shared__ int cnt[1024], cur[1024], other;
	int e = threadIdx.x;
	if (nb == 0) {
		cnt[e] = 0;
		__syncthreads();
		for (int r = threadIdx.x; r < R; r += blockDim.x)
			if (sel[r] >= 0) atomicAdd(&cnt[sel[r]], 1);
		__syncthreads();
	} else {
		int n = 0;
		if (e < E)
			for (int b = 0; b < nb; b++) n += bcnt[b * (E + 1) + e];
		cnt[e] = n;
	}
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
	if (nb == 0) {
		for (int r = threadIdx.x; r < R; r += blockDim.x) order[atomicAdd(sel[r] >= 0 ? &cur[sel[r]] : &other, 1)] = r;
		return;
	}
	for (int c = e; c <= E; c += blockDim.x) {
		int o = c < E ? cur[c] : other;
		for (int b = 0; b < nb; b++) {
			int n = bcnt[b * (E + 1) + c];
			bcnt[b * (E + 1) + c] = o;
			o += n;
		}
	}
}

// moe_scatter: block b places rows [b, b + 1) MOE_GROUP_ROWS in order
// from where moe_group says its rows of each expert start (bcnt). Grid
// ceil(R / MOE_GROUP_ROWS), 1024 threads.
extern "C" __global__ void __launch_bounds__(1024) moe_scatter(const int *sel, int R, int E, const int *bcnt, int *order) {
	__shared__ int cur[1025];
	for (int e = threadIdx.x; e <= E; e += blockDim.x) cur[e] = bcnt[blockIdx.x * (E + 1) + e];
	__syncthreads();
	int r = blockIdx.x * MOE_GROUP_ROWS + threadIdx.x;
	if (r < R) order[atomicAdd(&cur[sel[r] >= 0 ? sel[r] : E], 1)] = r;
}

// moe_split: x (n floats) as two bf16 parts, x = hi + lo, for the router
// product on tensor cores (two products, each in float32 accumulators);
// hi is x in bf16 (f2bf, as to_half makes it), which the experts' products
// read as well.
__device__ __forceinline__ void split_bf16(float v, u16 &hi, u16 &lo) {
	hi = f2bf(v);
	lo = f2bf(v - bf2f(hi));
}
extern "C" __global__ void moe_split(u16 *hi, u16 *lo, const float *x, long n) {
	long first = blockIdx.x * (long)blockDim.x + threadIdx.x, stride = (long)gridDim.x * blockDim.x;
	long n4 = (((unsigned long)x | (unsigned long)hi | (unsigned long)lo) & 15) == 0 ? n / 4 : 0;
	for (long k = first; k < n4; k += stride) {
		float4 v = ((const float4 *)x)[k];
		u16 h[4], l[4];
		split_bf16(v.x, h[0], l[0]);
		split_bf16(v.y, h[1], l[1]);
		split_bf16(v.z, h[2], l[2]);
		split_bf16(v.w, h[3], l[3]);
		((uint2 *)hi)[k] = make_uint2(h[0] | (unsigned)h[1] << 16, h[2] | (unsigned)h[3] << 16);
		((uint2 *)lo)[k] = make_uint2(l[0] | (unsigned)l[1] << 16, l[2] | (unsigned)l[3] << 16);
	}
	for (long k = 4 * n4 + first; k < n; k += stride) split_bf16(x[k], hi[k], lo[k]);
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

// moe_combine: out[t, j] += sum_k wts[t, k] * y[t * K + k, j] (y float32 or
// bf16: ydt; bf16 wants H even), and, with a shared expert, + sigmoid(x[t] . wg) * ys[t, j]:
// gs[t] where moe_router made it, else each block makes it itself (a dot
// of H: cheaper than a launch of its own). Grid (T, column blocks), 256
// threads, a column each a round.
extern "C" __global__ void moe_combine(float *__restrict__ out, const void *__restrict__ y, int ydt, const float *__restrict__ wts, int K,
		int H, const float *__restrict__ ys, const float *__restrict__ x, const void *wg, int wgdt, const float *__restrict__ gs) {
	__shared__ float red[32];
	pdl_trigger();
	pdl_wait();
	int t = blockIdx.x;
	float g = 0.f;
	if (ys && gs) {
		g = gs[t];
	} else if (ys) {
		float d = 0.f;
#pragma unroll 8
		for (int i = threadIdx.x; i < H; i += blockDim.x) d += x[(long)t * H + i] * ld(wg, i, wgdt);
		d = block_sum(d, red);
		g = 1.f / (1.f + __expf(-d));
	}
	if (ydt == DT_BF16) {
		// bf16 rows a pair of columns a thread: a warp's loads are 128
		// bytes of a row, as float32 rows' are (one column a thread made
		// 64-byte loads, and the combine slower than on float32 rows).
		for (int j = 2 * (blockIdx.y * blockDim.x + threadIdx.x); j < H; j += 2 * gridDim.y * blockDim.x) {
			float2 a = *(const float2 *)(out + (long)t * H + j);
			a = moe_add_rows2(a, wts + t * K, (const unsigned *)((const u16 *)y + (long)t * K * H + j), H / 2, K);
			if (ys) {
				float2 v = *(const float2 *)(ys + (long)t * H + j);
				a.x += g * v.x;
				a.y += g * v.y;
			}
			*(float2 *)(out + (long)t * H + j) = a;
		}
		return;
	}
	for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < H; j += gridDim.y * blockDim.x) {
		float a = moe_add_rows(out[(long)t * H + j], wts + t * K, (const float *)y + (long)t * K * H + j, H, K);
		if (ys) a += g * ys[(long)t * H + j];
		out[(long)t * H + j] = a;
	}
}
