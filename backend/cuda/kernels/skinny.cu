// Tensor-core skinny GEMM for decode batches of 3 to 8 tokens:
// out[t, o] (+)= sum_i x[t, i] * w[o, i] with bf16 weights and activations
// and f32 accumulation (mma.sync m16n8k16: the weights are the A operand, the
// tokens the B operand's 8 columns).
//
// The products are bound by the weight stream, so the kernel is built around
// it: a block owns SK_BM weight rows and streams them through shared memory
// with cp.async, SK_STAGES tiles of SK_BK columns deep, together with the
// matching slice of the activations. Where the rows alone make too few
// blocks for a wave, the columns are split (split-K) and the last block of a
// tile to finish adds the partial sums in a fixed order, so results do not
// depend on timing. The first weight tiles are requested before pdl_wait:
// they do not depend on the kernel before, which may still be running. Each
// block starts its walk over the columns at its own offset, so that the
// blocks' concurrent requests spread over the rows' addresses.
//
// Rows are padded to SK_BK + 8 elements, which shifts consecutive rows by
// 16 bytes and keeps ldmatrix free of bank conflicts.
//
// Measured on an H100 (NOTES.md): tiles of 32 rows by 256 columns (512
// contiguous bytes a row a stage) were the fastest of 64 x 128, 32 x 256
// and 16 x 512 at 8 tokens and close to it at 4. At 16 tokens every shape
// lost to cuBLASLt, so the kernel stops at 8.

// SK_TOK, SK_STAGES, SK_BM, SK_BK and the row pitch SK_P are in defines.cuh.
#define SK_STAGE ((SK_BM + SK_TOK) * SK_P * 2)  // bytes
#define SK_WK 2  // warps along a stage's columns; two along the rows

// skinny_row is the weight row held in row r of a block's tile, or -1 past
// the end. With swiglu (w = [gate | up], O outputs) each 16 rows are 8 gate
// rows and the matching 8 up rows, so one thread's accumulators hold a gate
// product and its up product for the same output and token.
template <bool SWIGLU>
__device__ __forceinline__ int skinny_row(int tile, int r, int O) {
	if (!SWIGLU) {
		int row = tile * SK_BM + r;
		return row < O ? row : -1;
	}
	int g = tile * (SK_BM / 2) + (r >> 4) * 8 + (r & 7);
	return g >= O ? -1 : (r & 8) ? O + g : g;
}

// ld_cg reads past L1, where another block's partial sums may be stale.
__device__ __forceinline__ float ld_cg(const float *p) {
	float v;
	asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
	return v;
}

// skinny_emit stores output i: bf16, or f32 written or added to.
__device__ __forceinline__ void skinny_emit(void *out, int odt, int accumulate, long i, float v) {
	if (odt == DT_BF16) {
		((u16 *)out)[i] = f2bf(v);
	} else {
		float *o = (float *)out + i;
		*o = accumulate ? *o + v : v;
	}
}

__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.f + __expf(-g)) * u; }

// skinny: grid (tiles, S), 128 threads, dynamic shared memory SK_STAGES *
// SK_STAGE. With SWIGLU, out is bf16 [T, O] = silu(x . gate) * (x . up).
// part holds S * T * rows(w) partial sums and cnt one zeroed counter per
// tile when S > 1. Requires I % SK_BK == 0 and T <= SK_TOK.
template <bool SWIGLU>
__device__ __forceinline__ void skinny(void *out, int odt, const u16 *x, const u16 *w, int T, int O, int I, int accumulate,
		float *part, int *cnt) {
	constexpr int BM = SK_BM, BK = SK_BK, P = SK_P, WK = SK_WK, WM = 4 / WK, CPR = BK / 8;  // 16-byte chunks a row
	extern __shared__ __align__(16) u16 ssm[];
	__shared__ int last;
	pdl_trigger();
	int tile = blockIdx.x, s = blockIdx.y, S = gridDim.y;
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp % WM, wk = warp / WM;
	int nk = I / BK, k0 = s * nk / S, n = (s + 1) * nk / S - k0, rot = n > 0 ? tile % n : 0;
	unsigned base = smem_addr(ssm);
	// Each thread copies 16-byte chunks c = tid + 128 j of a tile: row c /
	// CPR. Rows past the end are not loaded; what shared memory holds there
	// only reaches outputs that are not stored.
	auto load = [&](int st, int i, bool weights) {
		long col0 = (long)(k0 + (i + rot) % n) * BK;
		unsigned d = base + st * SK_STAGE;
		if (weights) {
#pragma unroll
			for (int j = 0; j < BM * CPR / 128; j++) {
				int c = threadIdx.x + 128 * j, r = c / CPR, col = c % CPR * 8;
				int row = skinny_row<SWIGLU>(tile, r, O);
				if (row >= 0) cp_async16(d + 2 * (r * P + col), w + (long)row * I + col0 + col);
			}
			return;
		}
		d += 2 * BM * P;
#pragma unroll
		for (int j = 0; j < SK_TOK * CPR / 128; j++) {
			int c = threadIdx.x + 128 * j, r = c / CPR, col = c % CPR * 8;
			if (r < T) cp_async16(d + 2 * (r * P + col), x + (long)r * I + col0 + col);
		}
	};
	constexpr int AHEAD = SK_STAGES - 1;
#pragma unroll
	for (int i = 0; i < AHEAD; i++)
		if (i < n) load(i, i, true);
	pdl_wait();
#pragma unroll
	for (int i = 0; i < AHEAD; i++) {
		if (i < n) load(i, i, false);
		asm volatile("cp.async.commit_group;");
	}
	// ldmatrix rows: A (weights) lane l -> row l % 16 of the warp's 16,
	// columns +8 (l / 16); B (tokens) lane l -> token l % 8, columns +8 (l /
	// 8): fragments of two k steps. Warp column group wk takes its BK / WK
	// columns of each stage.
	unsigned aoff = 2 * ((wm * 16 + (lane & 15)) * P + (lane >> 4) * 8 + wk * (BK / WK));
	unsigned boff = 2 * ((BM + (lane & 7)) * P + (lane >> 3) * 8 + wk * (BK / WK));
	float acc[4] = {};
	for (int i = 0; i < n; i++) {
		asm volatile("cp.async.wait_group %0;" ::"n"(AHEAD - 1));
		__syncthreads();  // stage i is in, and every warp is done with stage i - 1's buffer
		if (i + AHEAD < n) {
			load((i + AHEAD) % SK_STAGES, i + AHEAD, true);
			load((i + AHEAD) % SK_STAGES, i + AHEAD, false);
		}
		asm volatile("cp.async.commit_group;");
		unsigned st = base + (i % SK_STAGES) * SK_STAGE;
#pragma unroll
		for (int k = 0; k < BK / WK / 16; k += 2) {
			unsigned a0, a1, a2, a3, b0, b1, b2, b3;
			ldmatrix_x4(st + boff + 32 * k, b0, b1, b2, b3);
			ldmatrix_x4(st + aoff + 32 * k, a0, a1, a2, a3);
			mma_bf16(acc, a0, a1, a2, a3, b0, b1);
			ldmatrix_x4(st + aoff + 32 * (k + 1), a0, a1, a2, a3);
			mma_bf16(acc, a0, a1, a2, a3, b2, b3);
		}
	}
	{
		// The column groups add up through shared memory, into group 0.
		asm volatile("cp.async.wait_group 0;");
		__syncthreads();
		float *red = (float *)ssm;
		if (wk > 0)
#pragma unroll
			for (int j = 0; j < 4; j++) red[(warp * 32 + lane) * 4 + j] = acc[j];
		__syncthreads();
		if (wk == 0)
			for (int g = 1; g < WK; g++)
#pragma unroll
				for (int j = 0; j < 4; j++) acc[j] += red[((warp + g * WM) * 32 + lane) * 4 + j];
	}
	// Group 0's lane holds rows r0 and r0 + 8 of the tile, tokens tq and tq + 1.
	int r0 = wm * 16 + (lane >> 2), tq = 2 * (lane & 3);
	if (S == 1) {
		if (wk > 0) return;
#pragma unroll
		for (int e = 0; e < 2; e++) {
			int t = tq + e;
			if (t >= T) continue;
			if (SWIGLU) {
				int g = skinny_row<true>(tile, r0, O);
				if (g >= 0) ((u16 *)out)[(long)t * O + g] = f2bf(silu_times(acc[e], acc[2 + e]));
				continue;
			}
#pragma unroll
			for (int h = 0; h < 2; h++) {
				int row = skinny_row<false>(tile, r0 + 8 * h, O);
				if (row >= 0) skinny_emit(out, odt, accumulate, (long)t * O + row, acc[2 * h + e]);
			}
		}
		return;
	}
	int WR = SWIGLU ? 2 * O : O;
	if (wk == 0)
#pragma unroll
		for (int e = 0; e < 2; e++)
#pragma unroll
			for (int h = 0; h < 2; h++) {
				int t = tq + e, row = skinny_row<SWIGLU>(tile, r0 + 8 * h, O);
				if (t < T && row >= 0) part[((long)s * T + t) * WR + row] = acc[2 * h + e];
			}
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0) last = atomicAdd(cnt + tile, 1) == S - 1;
	__syncthreads();
	if (!last) return;
	__threadfence();
	// Each thread adds up to E outputs, all their partials requested
	// together (the sums run in split order: the result does not depend on
	// which block came last).
	constexpr int OUTS = SWIGLU ? BM / 2 : BM, E = OUTS * SK_TOK / 128;
	long step = (long)T * WR;
	float a[E], b[E];
#pragma unroll
	for (int e = 0; e < E; e++) a[e] = b[e] = 0.f;
	for (int j = 0; j < S; j++) {
#pragma unroll
		for (int e = 0; e < E; e++) {
			int idx = threadIdx.x + 128 * e, t = idx / OUTS, o = tile * OUTS + idx % OUTS;
			if (t >= T || o >= O) continue;
			const float *p = part + j * step + (long)t * WR + o;
			a[e] += ld_cg(p);
			if (SWIGLU) b[e] += ld_cg(p + O);
		}
	}
#pragma unroll
	for (int e = 0; e < E; e++) {
		int idx = threadIdx.x + 128 * e, t = idx / OUTS, o = tile * OUTS + idx % OUTS;
		if (t >= T || o >= O) continue;
		if (SWIGLU) ((u16 *)out)[(long)t * O + o] = f2bf(silu_times(a[e], b[e]));
		else skinny_emit(out, odt, accumulate, (long)t * O + o, a[e]);
	}
	if (threadIdx.x == 0) cnt[tile] = 0;  // ready for the next call (or graph replay)
}

extern "C" __global__ void __launch_bounds__(128) skinny_bf16(void *out, int odt, const u16 *x, const u16 *w, int T, int O, int I,
		int accumulate, float *part, int *cnt) {
	skinny<false>(out, odt, x, w, T, O, I, accumulate, part, cnt);
}

extern "C" __global__ void __launch_bounds__(128) skinny_swiglu_bf16(u16 *out, const u16 *x, const u16 *w, int T, int O, int I,
		float *part, int *cnt) {
	skinny<true>(out, DT_BF16, x, w, T, O, I, 0, part, cnt);
}
