// Decode GEMV / skinny GEMM: out[t, o] (+)= sum_i x[t, i] * w[o, i] for a few
// tokens t, with bf16 weights streamed once with 16-byte loads. Each warp owns
// one output row. Requires I % 8 == 0.

// x8 reads 8 activations of an f32 or bf16 row.
__device__ __forceinline__ void x8(const float *x, float *f) { load8(x, f); }
__device__ __forceinline__ void x8(const u16 *x, float *f) { load8(x, f); }

// The activation rows a GEMV reads: a batch, row t at x + t I, or (the
// grouped expert rows) a pointer a row.
template <typename XT>
struct XBatch {
	const XT *x;
	long I;
	__device__ __forceinline__ const XT *operator[](int t) const { return x + t * I; }
};
template <int NT, typename XT>
struct XRows {
	const XT *p[NT];
	__device__ __forceinline__ const XT *operator[](int t) const { return p[t]; }
};

template <int NT, typename XR>
__device__ __forceinline__ void dot8(float (&acc)[NT], uint4 v, const XR &x, int k) {
	float w[8];
	unpack8(v, w);
#pragma unroll
	for (int t = 0; t < NT; t++) {
		float a[8];
		x8(x[t] + k * 8, a);
		acc[t] += w[0] * a[0] + w[1] * a[1] + w[2] * a[2] + w[3] * a[3] + w[4] * a[4] + w[5] * a[5] + w[6] * a[6] + w[7] * a[7];
	}
}

// ldw streams a weight vector past L1 (the weights are read once; L1 keeps
// the activations that every warp of the SM re-reads).
__device__ __forceinline__ uint4 ldw(const uint4 *p) {
	uint4 v;
	asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
	return v;
}

// warp_dots sets acc[r][t] = x[t] . w_r for the R weight rows a warp
// streams together (wr[r] points at row r's vector for this lane). Each lane
// keeps U vectors of each row in flight and requests the next U before using
// these, so its stream has no gaps (four pipelined measured faster at batch
// 1 than eight unpipelined, and than sixteen in one go; see NOTES.md).
// Kernels using it are launched overlapped (programmatic dependent launch):
// the first vectors are requested before pdl_wait, so the weight stream is
// under way when the previous kernel (which writes x) finishes.
template <int NT, int U, int R, typename XR>
__device__ __forceinline__ void warp_dots(float (&acc)[R][NT], const uint4 *const (&wr)[R], const XR &x, int I, int lane) {
	int rounds = (I >> 3) / (32 * U);
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int t = 0; t < NT; t++) acc[r][t] = 0.f;
	uint4 v[R][U];
	if (rounds > 0) {
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int u = 0; u < U; u++) v[r][u] = ldw(wr[r] + 32 * u);
	}
	pdl_wait();
	for (int i = 0; i < rounds; i++) {
		int k = lane + i * 32 * U;
		uint4 nv[R][U];
		if (i + 1 < rounds) {
#pragma unroll
			for (int r = 0; r < R; r++)
#pragma unroll
				for (int u = 0; u < U; u++) nv[r][u] = ldw(wr[r] + 32 * (U * (i + 1) + u));
		}
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int u = 0; u < U; u++) dot8<NT>(acc[r], v[r][u], x, k + 32 * u);
#pragma unroll
		for (int r = 0; r < R; r++)
#pragma unroll
			for (int u = 0; u < U; u++) v[r][u] = nv[r][u];
	}
	for (int k = lane + rounds * 32 * U; k < (I >> 3); k += 32) {
#pragma unroll
		for (int r = 0; r < R; r++) dot8<NT>(acc[r], ldw(wr[r] + k - lane), x, k);
	}
#pragma unroll
	for (int r = 0; r < R; r++)
#pragma unroll
		for (int t = 0; t < NT; t++) acc[r][t] = warp_sum(acc[r][t]);
}

// gemv_bf16: each warp owns one output row; out is f32 (written or added
// to) or bf16 (written).
template <int NT, typename XT>
__device__ __forceinline__ void gemv_bf16(void *out, int odt, const XT *x, const u16 *w, int O, int I, int accumulate) {
	pdl_trigger();
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int row = blockIdx.x * (blockDim.x >> 5) + warp;
	if (row >= O) return;
	const uint4 *const wr[1] = {(const uint4 *)(w + (long)row * I) + lane};
	float acc[1][NT];
	warp_dots<NT, 4, 1>(acc, wr, XBatch<XT>{x, I}, I, lane);
	if (lane == 0) {
#pragma unroll
		for (int t = 0; t < NT; t++) {
			long i = (long)t * O + row;
			if (odt == DT_BF16) {
				((u16 *)out)[i] = f2bf(acc[0][t]);
			} else {
				float *o = (float *)out + i;
				*o = accumulate ? *o + acc[0][t] : acc[0][t];
			}
		}
	}
}

// gemv_swiglu_bf16: out[t, o] = silu(x[t] . w_o) * (x[t] . w_{O+o}) for w
// [2O, I] = [gate | up]: each warp streams a gate row and its up row, so the
// activation needs no kernel (or round trip through memory) of its own. U =
// 2 vectors per row keeps the bytes in flight of the one-row kernel (four
// measured the same at batch 1).
template <int NT, int U, typename XT>
__device__ __forceinline__ void gemv_swiglu_bf16(float *out, const XT *x, const u16 *w, int O, int I) {
	pdl_trigger();
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int row = blockIdx.x * (blockDim.x >> 5) + warp;
	if (row >= O) return;
	const uint4 *const wr[2] = {(const uint4 *)(w + (long)row * I) + lane, (const uint4 *)(w + (long)(O + row) * I) + lane};
	float acc[2][NT];
	warp_dots<NT, U, 2>(acc, wr, XBatch<XT>{x, I}, I, lane);
	if (lane == 0) {
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float g = acc[0][t];
			out[(long)t * O + row] = g / (1.f + __expf(-g)) * acc[1][t];
		}
	}
}

// Kernels: gemv_bf16_NT and gemv_swiglu_bf16_NT read f32 activations,
// the _hx variants bf16 ones.
#define GEMV(NT) \
	extern "C" __global__ void __launch_bounds__(256) gemv_bf16_##NT(void *out, int odt, const float *x, const u16 *w, int O, int I, int acc) { \
		gemv_bf16<NT>(out, odt, x, w, O, I, acc); \
	} \
	extern "C" __global__ void __launch_bounds__(256) gemv_bf16_##NT##_hx(void *out, int odt, const u16 *x, const u16 *w, int O, int I, int acc) { \
		gemv_bf16<NT>(out, odt, x, w, O, I, acc); \
	} \
	extern "C" __global__ void __launch_bounds__(256) gemv_swiglu_bf16_##NT(float *out, const float *x, const u16 *w, int O, int I) { \
		gemv_swiglu_bf16<NT, 2>(out, x, w, O, I); \
	} \
	extern "C" __global__ void __launch_bounds__(256) gemv_swiglu_bf16_##NT##_hx(float *out, const u16 *x, const u16 *w, int O, int I) { \
		gemv_swiglu_bf16<NT, 2>(out, x, w, O, I); \
	}
GEMV(1)
GEMV(2)
GEMV(3)
GEMV(4)
GEMV(5)
GEMV(6)
GEMV(7)
GEMV(8)

// moe_router: a decode step's router product and its ranking in one
// launch. Two warps a router row, a half of its columns each (warps w and
// w + 4 of a block of eight: its weights all requested before pdl_wait, in
// warp_dots), write logits [NT, E]; with a shared expert gate wg (a bf16
// row of H), the row after the routers' makes gs[t] = sigmoid(x[t] . wg)
// for the combine. The block that finishes last (cnt counts the arrivals;
// it resets it) ranks each token's experts, a warp a token (moe_rank).
// Grid ceil((E + (wg != 0)) / 4), 256 threads: warp 0 of every block has a
// row, so every block waits for the kernel before (pdl_wait, in warp_dots)
// before it arrives. H % 16 == 0.
template <int NT>
__device__ __forceinline__ void moe_router(const float *x, const u16 *w, const u16 *wg, int E, int H, float *logits, float *gs, int *cnt,
		int K, int norm, int e0, int held, int *sel, float *wts) {
	__shared__ float half[4][NT];
	__shared__ bool last;
	pdl_trigger();  // the experts' products follow (they wait for sel)
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, part = warp >> 2;
	int row = blockIdx.x * 4 + (warp & 3), hw = H / 2;
	bool has = row < E || (wg && row == E);
	float acc[1][NT];
	if (has) {
		const uint4 *const wr[1] = {(const uint4 *)((row < E ? w + (long)row * H : wg) + part * hw) + lane};
		warp_dots<NT, 4, 1>(acc, wr, XBatch<float>{x + part * hw, H}, hw, lane);
		if (part == 1 && lane == 0)
#pragma unroll
			for (int t = 0; t < NT; t++) half[warp & 3][t] = acc[0][t];
	}
	__syncthreads();
	if (has && part == 0 && lane == 0)
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float v = acc[0][t] + half[warp][t];
			if (row < E)
				logits[(long)t * E + row] = v;
			else
				gs[t] = 1.f / (1.f + __expf(-v));
		}
	__threadfence();  // the logits before the arrival
	__syncthreads();
	if (threadIdx.x == 0) last = atomicAdd(cnt, 1) == gridDim.x - 1;
	__syncthreads();
	if (!last) return;
	if (threadIdx.x == 0) *cnt = 0;
	for (int t = warp; t < NT; t += blockDim.x >> 5) moe_rank_e(logits + (long)t * E, E, K, norm, e0, held, sel + t * K, wts + t * K, lane);
}

#define MOE_ROUTER(NT) \
	extern "C" __global__ void __launch_bounds__(256) moe_router_##NT(const float *x, const u16 *w, const u16 *wg, int E, int H, \
			float *logits, float *gs, int *cnt, int K, int norm, int e0, int held, int *sel, float *wts) { \
		moe_router<NT>(x, w, wg, E, H, logits, gs, cnt, K, norm, e0, held, sel, wts); \
	}
MOE_ROUTER(1)
MOE_ROUTER(2)
MOE_ROUTER(3)
MOE_ROUTER(4)
MOE_ROUTER(5)
MOE_ROUTER(6)
MOE_ROUTER(7)
MOE_ROUTER(8)

// moe_rows: the expert products of decode steps, GEMVs whose weight matrix
// changes with the row. Row r < R is a (token, choice) pair: its weights
// are expert sel[r]'s (w holds the experts one after another) and its input
// x[r / xdiv]; rows R and on are the shared expert (ws) on x[xsh + r - R].
// A row whose sel is -1 (another rank's expert) is left as it is.
// SWIGLU: each expert is [gate | up] ([2O, I]) and y[r, o] = silu(x_r .
// gate_o) * (x_r . up_o), a warp an output; else y[r, o] = x_r . w_o, a warp
// four outputs (expert rows are short: four keep a lane's loads in flight).
// NT 1: grid (ceil(O / outputs a block), rows), a row a block. NT 2: the
// rows grouped by expert (moe_group with tiles of 2), grid (ceil(O /
// outputs a block), tiles allowed for), a tile a block, so an expert's
// weights are read once for up to two of its rows. sel and the tiles are
// the kernels' before gate/up (SWIGLU), which waits for them before it
// lets the next kernel launch: down, which always follows it over the same
// rows, then reads them at once and requests its first weights while
// gate/up runs (in warp_dots, before pdl_wait: its ramp was ~2 us of a
// decode step's 8.6 us down product of 10 experts, H200).
template <bool SWIGLU, int NT>
__device__ __forceinline__ void moe_rows(float *y, const float *x, int xdiv, int xsh, const u16 *w, const int *sel, int R,
		const u16 *ws, int O, int I, const int *start, const int *order, const int *tiles, const int *ntiles) {
	constexpr int RW = SWIGLU ? 2 : 4;  // weight rows a warp
	if (SWIGLU) pdl_wait();
	pdl_trigger();
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int o0 = (blockIdx.x * (blockDim.x >> 5) + warp) * (SWIGLU ? 1 : RW);
	if (o0 >= O) return;
	int rows[NT], n = NT;
	const u16 *m;
	// Read past L1, which may hold an earlier step's (down reads them
	// before any wait).
	if (NT == 1) {
		rows[0] = blockIdx.y;
		int e = rows[0] < R ? __ldcg(sel + rows[0]) : 0;
		if (e < 0) return;
		m = rows[0] < R ? w + (long)e * (SWIGLU ? 2 : 1) * O * I : ws;
	} else {
		if ((int)blockIdx.y >= __ldcg(ntiles)) return;
		int e = __ldcg(tiles + 2 * blockIdx.y), j0 = __ldcg(tiles + 2 * blockIdx.y + 1);
		n = min(NT, __ldcg(start + e + 1) - j0);
#pragma unroll
		for (int t = 0; t < NT; t++) rows[t] = __ldcg(order + j0 + min(t, n - 1));  // a short tile repeats its last row
		m = w + (long)e * (SWIGLU ? 2 : 1) * O * I;
	}
	XRows<NT, float> xr;
#pragma unroll
	for (int t = 0; t < NT; t++) xr.p[t] = x + (long)(rows[t] < R ? rows[t] / xdiv : xsh + rows[t] - R) * I;
	const uint4 *wr[RW];
#pragma unroll
	for (int k = 0; k < RW; k++) {
		int row = SWIGLU ? k * O + o0 : min(o0 + k, O - 1);  // past O: the last row again, not stored
		wr[k] = (const uint4 *)(m + (long)row * I) + lane;
	}
	float acc[RW][NT];
	warp_dots<NT, 2, RW>(acc, wr, xr, I, lane);
	if (lane != 0) return;
#pragma unroll
	for (int t = 0; t < NT; t++) {
		if (t >= n) break;
		float *out = y + (long)rows[t] * O + o0;
		if (SWIGLU) {
			out[0] = acc[0][t] / (1.f + __expf(-acc[0][t])) * acc[1][t];
		} else {
#pragma unroll
			for (int k = 0; k < RW; k++)
				if (o0 + k < O) out[k] = acc[k][t];
		}
	}
}

#define MOE_ROWS(NAME, SWIGLU, NT) \
	extern "C" __global__ void __launch_bounds__(256) NAME(float *y, const float *x, int xdiv, int xsh, const u16 *w, const int *sel, int R, \
			const u16 *ws, int O, int I, const int *start, const int *order, const int *tiles, const int *ntiles) { \
		moe_rows<SWIGLU, NT>(y, x, xdiv, xsh, w, sel, R, ws, O, I, start, order, tiles, ntiles); \
	}
MOE_ROWS(moe_rows_plain, false, 1)
MOE_ROWS(moe_rows_swiglu, true, 1)
MOE_ROWS(moe_rows2_plain, false, 2)
MOE_ROWS(moe_rows2_swiglu, true, 2)
