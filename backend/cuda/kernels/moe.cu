// Mixture of experts: routing on the device and expert products that read
// the chosen expert's weights through device-side indices (graph-safe).
// Correct first: each (token, choice) pair is its own GEMV.

// moe_route: a block per token, a thread per expert (E <= 1024, the block
// E rounded up to a warp). Softmax over the E router logits (f32), then the
// top k in torch.topk's order (higher probability first, ties to the lower
// index), optional renormalisation. A rank of a model split by experts
// holds experts [e0, e0 + held): a choice of another rank's expert gets sel
// -1 and weight 0 (its rank adds it). Each warp ranks its 32 experts among
// themselves (shuffles) and lists its first k; the lists' experts are then
// ranked among all the lists, which puts the top k in place at once.
// (Picking them one by one took ~10 us at 512 experts and top 10, with a
// block-wide argmax a pick, and 13 us with a warp's.)
extern "C" __global__ void __launch_bounds__(1024) moe_route(const float *logits, int E, int K, int norm, int e0, int held, int *sel,
		float *wts) {
	__shared__ float cp[1024];
	__shared__ int ci[1024];
	__shared__ float red[32];
	int t = blockIdx.x, i = threadIdx.x, lane = i & 31, KW = min(K, 32);
	float l = i < E ? logits[(long)t * E + i] : -INF;
	float mx = block_max(l, red);
	float p = i < E ? expf(l - mx) : -1.f;  // padding: below every probability
	float s = block_sum(i < E ? p : 0.f, red);
	int rank = 0;
	for (int o = 0; o < 32; o++) {
		float po = __shfl_sync(0xffffffffu, p, o);
		rank += po > p || (po == p && o < lane);
	}
	if (rank < KW) {
		cp[(i >> 5) * KW + rank] = p;
		ci[(i >> 5) * KW + rank] = i;
	}
	__syncthreads();
	int C = (blockDim.x >> 5) * KW;
	bool top = false;
	if (i < C) {
		p = cp[i];
		int e = ci[i];
		rank = 0;
		for (int j = 0; j < C; j++) rank += cp[j] > p || (cp[j] == p && ci[j] < e);
		top = rank < K;
		i = e;
	}
	float tot = block_sum(top ? p / s : 0.f, red);
	if (top) {
		bool mine = i >= e0 && i < e0 + held;
		sel[t * K + rank] = mine ? i - e0 : -1;
		wts[t * K + rank] = !mine ? 0.f : norm ? p / s / tot : p / s;
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

// Grouped expert products on tensor cores: the (token, choice) rows are
// listed expert by expert (moe_group), gathered in that order as bf16
// (moe_gather), and multiplied by their expert's weights in tiles of MG_BM
// rows of one expert by MG_BN outputs (moe_group_mm), so that an expert's
// weights are read once per tile of its rows rather than once per row.
// The rows are rounded to bf16 as the dense products' inputs are (cuBLASLt
// takes bf16): as two parts, x = hi + lo, the products kept ~16 bits of
// the float32 rows at twice the tensor-core work, which a Qwen3-Next
// prompt paid for with 61% of its prefill (NOTES.md, 2026-11-28). The
// tile, MG_BM rows by MG_BN outputs, MG_BK columns a stage, is in
// defines.cuh.
#define MG_P (MG_BK + 8)
#define MG_STAGES 3

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

// moe_group_mm: y[order[j], o] = sum_i xg[j, i] * w[e, o, i] for the rows j
// of each tile whose expert e is in [e0, e1) (w holds experts e0..e1-1:
// all of them, or a slab of quantized experts dequantized to bf16). Grid
// (ceil(O / MG_BN), tiles allowed for), 128 threads: four warps of 32 rows
// by 64 outputs, mma.sync m16n8k16 with the rows as A and the weight rows
// as B, MG_STAGES stages of MG_BK columns by cp.async; four blocks a
// multiprocessor (their registers capped at 128, the shared-memory carveout
// at its largest: preferSmem), where two left the schedulers without a
// ready warp 68% of the time (ncu, H100, 2026-11-28). Requires I % MG_BK ==
// 0.
extern "C" __global__ void __launch_bounds__(128, 4) moe_group_mm(float *y, const u16 *xg, const u16 *w, const int *start,
		const int *order, const int *tiles, const int *ntiles, int O, int I, int e0, int e1) {
	__shared__ __align__(16) u16 sA[MG_STAGES][MG_BM * MG_P];
	__shared__ __align__(16) u16 sB[MG_STAGES][MG_BN * MG_P];
	int tile = blockIdx.y;
	if (tile >= *ntiles) return;
	int e = tiles[2 * tile], j0 = tiles[2 * tile + 1], j1 = min(j0 + MG_BM, start[e + 1]);
	if (e < e0 || e >= e1) return;
	int o0 = blockIdx.x * MG_BN;
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp & 1, wn = warp >> 1;
	int mi = lane >> 3, mr = lane & 7;
	const u16 *wb = w + (long)(e - e0) * O * I;
	int nk = I / MG_BK;
	// Rows past the tile's end repeat its last row, outputs past O the last
	// output: finite values whose results are not stored.
	auto load = [&](int st, int kt) {
		int k0 = kt * MG_BK;
		for (int c = threadIdx.x; c < MG_BM * (MG_BK / 8); c += 128) {
			int r = c / (MG_BK / 8), col = c % (MG_BK / 8) * 8;
			cp_async16(smem_addr(&sA[st][r * MG_P + col]), xg + (long)min(j0 + r, j1 - 1) * I + k0 + col);
		}
		for (int c = threadIdx.x; c < MG_BN * (MG_BK / 8); c += 128) {
			int r = c / (MG_BK / 8), col = c % (MG_BK / 8) * 8;
			cp_async16(smem_addr(&sB[st][r * MG_P + col]), wb + (long)min(o0 + r, O - 1) * I + k0 + col);
		}
	};
	float acc[2][8][4];
#pragma unroll
	for (int t = 0; t < 2; t++)
#pragma unroll
		for (int n = 0; n < 8; n++) acc[t][n][0] = acc[t][n][1] = acc[t][n][2] = acc[t][n][3] = 0.f;
#pragma unroll
	for (int s = 0; s < MG_STAGES - 1; s++) {
		if (s < nk) load(s, s);
		asm volatile("cp.async.commit_group;");
	}
	for (int kt = 0; kt < nk; kt++) {
		asm volatile("cp.async.wait_group %0;" ::"n"(MG_STAGES - 2));
		__syncthreads();  // stage kt is in; every warp is done with the stage about to be refilled
		if (kt + MG_STAGES - 1 < nk) load((kt + MG_STAGES - 1) % MG_STAGES, kt + MG_STAGES - 1);
		asm volatile("cp.async.commit_group;");
		int st = kt % MG_STAGES;
#pragma unroll
		for (int ks = 0; ks < MG_BK / 32; ks++) {
			unsigned a[2][2][4];  // [row tile][k step][fragment]
#pragma unroll
			for (int t = 0; t < 2; t++)
#pragma unroll
				for (int k = 0; k < 2; k++)
					ldmatrix_x4(smem_addr(&sA[st][(wm * 32 + t * 16 + mr + (mi & 1) * 8) * MG_P + ks * 32 + k * 16 + (mi >> 1) * 8]),
							a[t][k][0], a[t][k][1], a[t][k][2], a[t][k][3]);
#pragma unroll
			for (int n = 0; n < 8; n++) {
				unsigned b0, b1, b2, b3;  // k step 0: b0, b1; k step 1: b2, b3
				ldmatrix_x4(smem_addr(&sB[st][(wn * 64 + n * 8 + mr) * MG_P + ks * 32 + mi * 8]), b0, b1, b2, b3);
#pragma unroll
				for (int t = 0; t < 2; t++) {
					mma_bf16(acc[t][n], a[t][0][0], a[t][0][1], a[t][0][2], a[t][0][3], b0, b1);
					mma_bf16(acc[t][n], a[t][1][0], a[t][1][1], a[t][1][2], a[t][1][3], b2, b3);
				}
			}
		}
	}
	asm volatile("cp.async.wait_group 0;");
#pragma unroll
	for (int t = 0; t < 2; t++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			int j = j0 + wm * 32 + t * 16 + (lane >> 2) + h * 8;
			if (j >= j1) continue;
			long row = (long)order[j] * O;
#pragma unroll
			for (int n = 0; n < 8; n++) {
				int o = o0 + wn * 64 + n * 8 + (lane & 3) * 2;
				if (o < O) y[row + o] = acc[t][n][2 * h];
				if (o + 1 < O) y[row + o + 1] = acc[t][n][2 * h + 1];
			}
		}
}

// moe_combine: out[t, j] += sum_k wts[t, k] * y[t * K + k, j], and, with a
// shared expert, + sigmoid(x[t] . wg) * ys[t, j]. Grid (T, ceil(H / 256)),
// 256 threads, a column each; each block makes the shared expert's gate
// itself (a dot of H: cheaper than a launch of its own at decode). A row of
// weight 0 is another rank's expert, its y never written: skipped.
extern "C" __global__ void moe_combine(float *__restrict__ out, const float *__restrict__ y, const float *__restrict__ wts, int K, int H,
		const float *__restrict__ ys, const float *__restrict__ x, const void *wg, int wgdt) {
	__shared__ float red[32];
	int t = blockIdx.x, j = blockIdx.y * blockDim.x + threadIdx.x;
	float g = 0.f;
	if (ys) {
		float d = 0.f;
		for (int i = threadIdx.x; i < H; i += blockDim.x) d += x[(long)t * H + i] * ld(wg, i, wgdt);
		d = block_sum(d, red);
		g = 1.f / (1.f + __expf(-d));
	}
	if (j >= H) return;
	float a = out[(long)t * H + j];
	for (int k = 0; k < K; k++) {
		float w = wts[t * K + k];
		if (w != 0.f) a += w * y[((long)t * K + k) * H + j];
	}
	if (ys) a += g * ys[(long)t * H + j];
	out[(long)t * H + j] = a;
}
