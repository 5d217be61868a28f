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

__device__ __forceinline__ float silu_times(float g, float u) { return g / (1.f + __expf(-g)) * u; }

// skinny_finish adds up a skinny block's accumulators (lane layout of
// mma's C: rows r0 and r0 + 8 of the warp's 16, tokens tq and tq + 1) over
// its column groups through red (the tiles' shared memory, free once every
// copy has landed), and over the S splits of its tile through part (the
// last block to finish adds them in split order), and stores them.
template <bool SWIGLU>
__device__ __forceinline__ void skinny_finish(float (&acc)[4], float *red, void *out, int odt, int T, int O, int accumulate,
		float *part, int *cnt) {
	constexpr int BM = SK_BM, WK = SK_WK, WM = 4 / WK;
	__shared__ int last;
	int tile = blockIdx.x, s = blockIdx.y, S = gridDim.y;
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp % WM, wk = warp / WM;
	{
		// The column groups add up through shared memory, into group 0.
		asm volatile("cp.async.wait_group 0;");
		__syncthreads();
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
				if (row >= 0) qstore(out, odt, accumulate, (long)t * O + row, acc[2 * h + e]);
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
		else qstore(out, odt, accumulate, (long)t * O + o, a[e]);
	}
	if (threadIdx.x == 0) cnt[tile] = 0;  // ready for the next call (or graph replay)
}

// SkBf16 is the skinny GEMM's tiles for bf16 weights: SK_BM rows of SK_BK
// columns a stage, then the tokens' SK_BK activations, rows padded to SK_P.
template <bool SWIGLU>
struct SkBf16 {
	static constexpr int BK = SK_BK, STAGE = SK_STAGE, CPR = BK / 8;  // 16-byte chunks a row
	unsigned base;
	const u16 *x, *w;
	int T, O, I, tile;
	__device__ SkBf16(unsigned char *sm, const u16 *x, const void *w, long rb, int T, int O, int I, int tile)
		: base(smem_addr(sm)), x(x), w((const u16 *)w), T(T), O(O), I(I), tile(tile) {}
	// Each thread copies 16-byte chunks c = tid + 128 j of a tile: row c /
	// CPR. Rows past the end are not loaded; what shared memory holds there
	// only reaches outputs that are not stored.
	__device__ void load_w(int st, long col0) {
		unsigned d = base + st * STAGE;
#pragma unroll
		for (int j = 0; j < SK_BM * CPR / 128; j++) {
			int c = threadIdx.x + 128 * j, r = c / CPR, col = c % CPR * 8;
			int row = skinny_row<SWIGLU>(tile, r, O);
			if (row >= 0) cp_async16(d + 2 * (r * SK_P + col), w + (long)row * I + col0 + col);
		}
	}
	__device__ void load_x(int st, long col0) {
		unsigned d = base + st * STAGE + 2 * SK_BM * SK_P;
#pragma unroll
		for (int j = 0; j < SK_TOK * CPR / 128; j++) {
			int c = threadIdx.x + 128 * j, r = c / CPR, col = c % CPR * 8;
			if (r < T) cp_async16(d + 2 * (r * SK_P + col), x + (long)r * I + col0 + col);
		}
	}
	// ldmatrix rows: A (weights) lane l -> row l % 16 of the warp's 16,
	// columns +8 (l / 16); B (tokens) lane l -> token l % 8, columns +8 (l /
	// 8): fragments of two k steps. Warp column group wk takes its BK / WK
	// columns of each stage.
	__device__ void compute(int st, float (&acc)[4]) {
		int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp % (4 / SK_WK), wk = warp / (4 / SK_WK);
		unsigned aoff = 2 * ((wm * 16 + (lane & 15)) * SK_P + (lane >> 4) * 8 + wk * (BK / SK_WK));
		unsigned boff = 2 * ((SK_BM + (lane & 7)) * SK_P + (lane >> 3) * 8 + wk * (BK / SK_WK));
		unsigned a = base + st * STAGE;
#pragma unroll
		for (int k = 0; k < BK / SK_WK / 16; k += 2) {
			unsigned a0, a1, a2, a3, b0, b1, b2, b3;
			ldmatrix_x4(a + boff + 32 * k, b0, b1, b2, b3);
			ldmatrix_x4(a + aoff + 32 * k, a0, a1, a2, a3);
			mma_bf16(acc, a0, a1, a2, a3, b0, b1);
			ldmatrix_x4(a + aoff + 32 * (k + 1), a0, a1, a2, a3);
			mma_bf16(acc, a0, a1, a2, a3, b2, b3);
		}
	}
};

// SkFp8 is the skinny GEMM's tiles for FP8 weights (kiln's device rows: a
// row's 128-byte blocks of e4m3 values, then their float32 scales) on the
// FP8 tensor cores (mma m16n8k32 e4m3, sm_89 on): a stage holds SK_BM rows
// of F8_BK values and each row's F8_BK / 128 scales, and the tokens' bf16
// activations of the same columns. Before the products the activations are
// quantized in shared memory per token and 128 columns to a pair of e4m3
// values (hi, and lo = the e4m3 of what hi misses) under one scale s =
// amax / 448: two mmas a step, and the products within ~2^-8 of bf16
// activations', where one e4m3 alone would be 2^-4. Each 128 columns the
// block's partial sums are scaled by the weight row's and the token's
// scales into the accumulators. On Hopper (F8_F16) the ldmatrix fragments
// are widened to f16 for two f16 mmas a step, against the activations as
// f16 rows (f16_block) in hi and lo's place.
// The tiles are sized for TOK tokens: 8, or 2 for the kernels of one or two
// tokens (decode at batch 1), whose smaller tiles let more blocks share a
// multiprocessor. F8_BK and the shared memory the Go side gives a block of
// each, F8_SMEM_8 and F8_SMEM_2, are in defines.cuh.
#define F8_WP (F8_BK + 16)      // bytes a weight row takes in a stage (+16: ldmatrix without bank conflicts)
#define F8_XP (2 * F8_BK + 16)  // bytes a token's bf16 activations take
#define F8_QP (F8_BK + 16)      // bytes a token's quantized activations take
#define F8_STAGE(TOK) (SK_BM * F8_WP + SK_BM * 16 + (TOK) * F8_XP)
#define F8_SMEM_OF(TOK) (SK_STAGES * F8_STAGE(TOK) + 2 * (TOK) * F8_QP + (TOK) * (F8_BK / 128) * 4)
static_assert(F8_SMEM_8 == F8_SMEM_OF(8) && F8_SMEM_2 == F8_SMEM_OF(2) && SK_TOK == 8, "F8_SMEM_n is the tiles' size");

template <bool SWIGLU, int TOK>
struct SkFp8 {
	static constexpr int BK = F8_BK, STAGE = F8_STAGE(TOK), CPR = BK / 16, CPX = 2 * BK / 16, NB = BK / 128;
	unsigned char *sm;
	unsigned base;
	const u16 *x;
	const u8 *w;
	long rb;  // bytes a device row takes (its scales start at byte I: I / 128 blocks of 128 values)
	int T, O, I, tile;
	__device__ SkFp8(unsigned char *sm, const u16 *x, const void *w, long rb, int T, int O, int I, int tile)
		: sm(sm), base(smem_addr(sm)), x(x), w((const u8 *)w), rb(rb), T(T), O(O), I(I), tile(tile) {}
	__device__ void load_w(int st, long col0) {
		unsigned d = base + st * STAGE;
#pragma unroll
		for (int j = 0; j < SK_BM * CPR / 128; j++) {
			int c = threadIdx.x + 128 * j, r = c / CPR, col = c % CPR * 16;
			int row = skinny_row<SWIGLU>(tile, r, O);
			if (row >= 0) cp_async16(d + r * F8_WP + col, w + row * rb + col0 + col);
		}
		if (threadIdx.x < SK_BM) {  // the rows' NB scales
			int row = skinny_row<SWIGLU>(tile, threadIdx.x, O);
			if (row >= 0) cp_async16(d + SK_BM * F8_WP + 16 * threadIdx.x, w + row * rb + I + col0 / 128 * 4);
		}
	}
	__device__ void load_x(int st, long col0) {
		unsigned d = base + st * STAGE + SK_BM * F8_WP + SK_BM * 16;
#pragma unroll
		for (int j = 0; j < TOK * CPX / 128; j++) {
			int c = threadIdx.x + 128 * j, r = c / CPX, col = c % CPX * 8;
			if (r < T) cp_async16(d + r * F8_XP + 2 * col, x + (long)r * I + col0 + col);
		}
	}
	__device__ void compute(int st, float (&acc)[4]) {
		int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp % (4 / SK_WK), wk = warp / (4 / SK_WK);
		const unsigned char *stage = sm + st * STAGE;
		const float *wsc = (const float *)(stage + SK_BM * F8_WP);
		const unsigned char *xr = stage + SK_BM * F8_WP + SK_BM * 16;
		unsigned char *qhi = sm + SK_STAGES * STAGE, *qlo = qhi + TOK * F8_QP;
		float *xsc = (float *)(qlo + TOK * F8_QP);
		// Quantize the stage's activations: a warp per (token, 128 columns);
		// with F8_F16 f16 rows of 2 F8_QP bytes in the place of hi and lo.
		for (int p = warp; p < T * NB; p += 4) {
			int t = p / NB, j = p % NB;
			uint2 u = *((const uint2 *)(xr + t * F8_XP + 256 * j) + lane);
			float v[4] = {__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
				__uint_as_float(u.y & 0xffff0000u)};
			if (F8_F16) {
				f16_block(v, qhi + 2 * t * F8_QP + 256 * j, xsc + t * NB + j, lane);
			} else {
				f8_split(v, qhi + t * F8_QP + 128 * j, qlo + t * F8_QP + 128 * j, xsc + t * NB + j, lane);
			}
		}
		__syncthreads();
		// ldmatrix rows: lane l -> weight row l % 16 of the warp's 16, bytes
		// +16 (l / 16): A of one k step of 32. Lane (g, q) takes token g's
		// quantized values at the same columns as B. Warp column group wk
		// takes its BK / WK columns: NB / WK blocks of 128.
		int g = lane >> 2, q = lane & 3;
		unsigned a = base + st * STAGE + (wm * 16 + (lane & 15)) * F8_WP + (lane >> 4) * 16;
#pragma unroll
		for (int b = 0; b < NB / SK_WK; b++) {
			int blk = wk * (NB / SK_WK) + b;
			float tmp[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
			for (int k = 0; k < 4; k++) {
				int col = 128 * blk + 32 * k;
				unsigned a0, a1, a2, a3, h0 = 0, h1 = 0, l0 = 0, l1 = 0;
				ldmatrix_x4(a + col, a0, a1, a2, a3);
				if (F8_F16) {
					// a0 and a1: rows g and g + 8 at columns 4q to 4q + 3 of
					// the 32; a2 and a3 at 16 + 4q.
					uint2 x0 = make_uint2(0u, 0u), x1 = x0;
					if (g < T) {
						const unsigned char *xg = qhi + 2 * g * F8_QP + 2 * (col + 4 * q);
						x0 = *(const uint2 *)xg, x1 = *(const uint2 *)(xg + 32);
					}
					mma_f8w(tmp, a0, a1, x0.x, x0.y);
					mma_f8w(tmp, a2, a3, x1.x, x1.y);
				} else {
					if (g < T) {
						h0 = *(const unsigned *)(qhi + g * F8_QP + col + 4 * q);
						h1 = *(const unsigned *)(qhi + g * F8_QP + col + 16 + 4 * q);
						l0 = *(const unsigned *)(qlo + g * F8_QP + col + 4 * q);
						l1 = *(const unsigned *)(qlo + g * F8_QP + col + 16 + 4 * q);
					}
					mma_e4m3(tmp, a0, a1, a2, a3, h0, h1);
					mma_e4m3(tmp, a0, a1, a2, a3, l0, l1);
				}
			}
			float w0 = wsc[(wm * 16 + g) * 4 + blk], w1 = wsc[(wm * 16 + g + 8) * 4 + blk];
			float x0 = 2 * q < T ? xsc[2 * q * NB + blk] : 0.f, x1 = 2 * q + 1 < T ? xsc[(2 * q + 1) * NB + blk] : 0.f;
			acc[0] += tmp[0] * (w0 * x0);
			acc[1] += tmp[1] * (w0 * x1);
			acc[2] += tmp[2] * (w1 * x0);
			acc[3] += tmp[3] * (w1 * x1);
		}
	}
};

// skinny: grid (tiles, S), 128 threads, dynamic shared memory SK_STAGES *
// SK_STAGE (bf16) or F8_SMEM_n (FP8) bytes; K is
// the weights' tiles (SkBf16, SkFp8). With SWIGLU, out is bf16 [T, O] =
// silu(x . gate) * (x . up). part holds S * T * rows(w) partial sums and cnt
// one zeroed counter per tile when S > 1. Requires I % K::BK == 0 and T <=
// SK_TOK; x is bf16.
template <bool SWIGLU, class K>
__device__ __forceinline__ void skinny(void *out, int odt, const u16 *x, const void *w, long rb, int T, int O, int I, int accumulate,
		float *part, int *cnt) {
	extern __shared__ __align__(16) unsigned char ssm[];
	pdl_trigger();
	int tile = blockIdx.x, s = blockIdx.y, S = gridDim.y;
	int nk = I / K::BK, k0 = s * nk / S, n = (s + 1) * nk / S - k0, rot = n > 0 ? tile % n : 0;
	K k(ssm, x, w, rb, T, O, I, tile);
	auto col0 = [&](int i) { return (long)(k0 + (i + rot) % n) * K::BK; };
	constexpr int AHEAD = SK_STAGES - 1;
#pragma unroll
	for (int i = 0; i < AHEAD; i++)
		if (i < n) k.load_w(i, col0(i));
	pdl_wait();
#pragma unroll
	for (int i = 0; i < AHEAD; i++) {
		if (i < n) k.load_x(i, col0(i));
		asm volatile("cp.async.commit_group;");
	}
	float acc[4] = {};
	for (int i = 0; i < n; i++) {
		asm volatile("cp.async.wait_group %0;" ::"n"(AHEAD - 1));
		__syncthreads();  // stage i is in, and every warp is done with stage i - 1's buffers
		if (i + AHEAD < n) {
			k.load_w((i + AHEAD) % SK_STAGES, col0(i + AHEAD));
			k.load_x((i + AHEAD) % SK_STAGES, col0(i + AHEAD));
		}
		asm volatile("cp.async.commit_group;");
		k.compute(i % SK_STAGES, acc);
	}
	skinny_finish<SWIGLU>(acc, (float *)ssm, out, odt, T, O, accumulate, part, cnt);
}

extern "C" __global__ void __launch_bounds__(128) skinny_bf16(void *out, int odt, const u16 *x, const u16 *w, int T, int O, int I,
		int accumulate, float *part, int *cnt) {
	skinny<false, SkBf16<false>>(out, odt, x, w, 0, T, O, I, accumulate, part, cnt);
}

extern "C" __global__ void __launch_bounds__(128) skinny_swiglu_bf16(u16 *out, const u16 *x, const u16 *w, int T, int O, int I,
		float *part, int *cnt) {
	skinny<true, SkBf16<true>>(out, DT_BF16, x, w, 0, T, O, I, 0, part, cnt);
}

// skinny_fp8 and skinny_swiglu_fp8: w is FP8 device rows of rb bytes (sm_89
// on); the _2 kernels take up to two tokens.
#define SKINNY_FP8(SUF, TOK) \
	extern "C" __global__ void __launch_bounds__(128) skinny_fp8##SUF(void *out, int odt, const u16 *x, const u8 *w, long rb, int T, int O, \
			int I, int accumulate, float *part, int *cnt) { \
		skinny<false, SkFp8<false, TOK>>(out, odt, x, w, rb, T, O, I, accumulate, part, cnt); \
	} \
	extern "C" __global__ void __launch_bounds__(128) skinny_swiglu_fp8##SUF(u16 *out, const u16 *x, const u8 *w, long rb, int T, int O, \
			int I, float *part, int *cnt) { \
		skinny<true, SkFp8<true, TOK>>(out, DT_BF16, x, w, rb, T, O, I, 0, part, cnt); \
	}
SKINNY_FP8(, 8)
SKINNY_FP8(_2, 2)
