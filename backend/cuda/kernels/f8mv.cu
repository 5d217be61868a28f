// The decode product of FP8 weights on the FP8 tensor cores, straight from
// registers (sm_89 on): out[t, o] (+)= x[t] . w_o for up to 8 tokens, or a
// mixture of experts' rows one expert each, as qmv takes them (quant.cu).
//
// At one or two tokens the product is a stream of weight bytes, and the
// FP8 mma takes those bytes as they are: the weights are the A operand (16
// rows, 32 columns an mma), the tokens B's 8 columns. The inner dimension
// of one mma is any 32 columns as long as A and B hold the same ones, so a
// lane (g, q) of a warp loads 16 bytes of weight rows g and g + 8 at
// columns 16q and 64 + 16q of a 128-column block (each load of the warp
// reads whole 32-byte sectors: 64 contiguous bytes a row) and the same
// columns of token g's activations: no shared-memory staging of weights, no
// conversion, nothing moves between lanes. The activations are quantized
// once a block, as the skinny GEMM does (f8_split: an e4m3 pair under one
// scale a token and 128 columns, two mmas a step); each block's products
// are scaled by the weight row's and the token's scales into the
// accumulators. On Hopper (F8_F16, common.cuh) each 4-byte word of weights
// is widened to f16 pairs for one f16 mma, and the activations are f16 rows
// under f16_block's scale instead of f8_split's pair.
//
// A block's W warps split each row's blocks of 128 columns (warp, warp + W,
// ...) and add their sums in a fixed order at the end; a block takes the
// groups of 16 rows blockIdx.x, + gridDim.x, ...; a lane keeps F8MV_U
// blocks in flight across the groups, the first requested before pdl_wait
// (the weights do not depend on the kernel before). The Go side gives a
// warp two blocks a row, so that a group's loads all start at once.
//
// Measured on an H200 (docs/performance.md, ncu at base clocks, one launch
// each): against qmv on the Coder-Next shape's experts, 16.4 vs 20 us for
// the routed and shared gate/up rows and 12.0 vs 14.6 us for their down
// rows. A lane's two 16-byte loads in one 32-byte sector (qmv's units have
// them) instead of the warp's loads covering whole sectors cost 2.3% of a
// 4-layer step.

// F8MV_U: blocks of 128 columns a lane keeps in flight (A/B:
// KILN_CUDA_NVRTC_FLAGS=-DF8MV_U=3; 3 and 4 took more registers and were
// slower).
#ifndef F8MV_U
#define F8MV_U 2
#endif
// F8MV_MINB: blocks of 256 threads a multiprocessor holds (the register
// bound: 2 allows 128 registers a thread).
#ifndef F8MV_MINB
#define F8MV_MINB 2
#endif

// F8Raw is a lane's share of one 128-column block of its two rows: 32 bytes
// each and the rows' scales.
struct F8Raw {
	uint4 a0, a1, b0, b1;
	float sa, sb;
};

// The row pitch of the quantized activations in shared memory: 64 bytes
// more than a row, so that the lanes of consecutive tokens read other banks.
__device__ __forceinline__ int f8mv_pitch(int I) { return I + 64; }

// MoeSum is the combine of a MoE block that the down product of its
// expert rows finishes (moe_combine's sums, without its launch): out[t, o]
// += sum_k wts[t, k] * y[t K + k, o], and with a shared expert among the
// rows (ws) + gs[t] * y[R + t, o]. The last of a token's K (+ 1) rows to
// finish a group of outputs adds them, in moe_combine's order; cnt counts
// the arrivals a (token, group) and is left at zero. Every row must arrive:
// no row of another rank's expert (sel -1).
struct MoeSum {
	float *out;  // 0: no combine
	const float *wts, *gs;
	int K;
	int *cnt;
};

// f8mv: grid (ceil(O / outputs), rows, 1), W warps (W <= I / 128),
// dynamic shared memory NT * (2 * (I + 64) + 4 * I / 128) bytes for NT = T
// tokens (1 with sel). Arguments as qmv's, but x is bf16 or f32 (xdt,
// 16-byte aligned rows), and early (below); I % 128 == 0. With SWIGLU a
// group's 16 rows are 8 gate rows and their 8 up rows: 8 outputs.
template <bool SWIGLU>
__device__ __forceinline__ void f8mv(void *out, int odt, const void *x, int T, int xdiv, const u8 *w, long rb, long estride,
		const int *sel, const u8 *ws, int xsh, int O, int I, int xdt, int early, int accumulate, MoeSum sum) {
	extern __shared__ __align__(16) unsigned char fsm[];
	__shared__ float red[8][32][4];
	__shared__ bool last;  // this block finished a token's group of outputs (sum)
	if (!sel) pdl_trigger();
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
	int g = lane >> 2, q = lane & 3, r = blockIdx.y;
	long x0 = 0;  // the first token's activations: row x0 of x
	int NT = T;
	if (sel) {
		// Expert rows read sel as soon as it is written: after pdl_wait,
		// or at once (early) behind a product of the same rows that
		// waited, so that their first weights are requested while that
		// product runs. Either lets its successor start only after
		// waiting (then everything before this kernel is done).
		if (!early) {
			pdl_wait();
			pdl_trigger();
		}
		int e = r < T ? __ldcg(sel + r) : 0;
		if (r >= T) {
			w = ws;
			x0 = xsh + r - T;
		} else if (e < 0) {
			return;
		} else {
			w += (long)e * estride;
			x0 = r / xdiv;
		}
		NT = 1;
	}
	constexpr int OUTS = SWIGLU ? 8 : 16;
	int NB = I >> 7, P = f8mv_pitch(I);
	int n = (NB - 1 - warp) / W + 1;  // blocks of this warp a group
	int groups = (O + OUTS - 1) / OUTS, ng = blockIdx.x < groups ? (groups - 1 - blockIdx.x) / gridDim.x + 1 : 0;
	int total = n * ng;
	// Item (gi, bi): rows g and g + 8 of group blockIdx.x + gi * gridDim.x
	// (gate row g and its up row with SWIGLU), block warp + bi * W.
	auto load = [&](F8Raw &raw, Walk it) {
		int o0 = (blockIdx.x + it.gi * gridDim.x) * OUTS, col = 128 * (warp + it.bi * W) + 16 * q;
		long ra = min(o0 + g, O - 1), rb8 = SWIGLU ? O + ra : min(o0 + g + 8, O - 1);
		const u8 *pa = w + ra * rb, *pb = w + rb8 * rb;
		raw.a0 = qld16(pa + col);
		raw.a1 = qld16(pa + col + 64);
		raw.b0 = qld16(pb + col);
		raw.b1 = qld16(pb + col + 64);
		raw.sa = __ldg((const float *)(pa + I) + (col >> 7));
		raw.sb = __ldg((const float *)(pb + I) + (col >> 7));
	};
	F8Raw raw[F8MV_U];
	Walk ld;  // the next item to load: group gi (of the block's groups), block warp + bi * W of 128 columns
#pragma unroll
	for (int k = 0; k < F8MV_U; k++)
		if (k < total) {
			load(raw[k], ld);
			ld.next(n);
		}
	if (!sel || early) pdl_wait();
	if (sel && early) pdl_trigger();
	// The tokens' activations (bf16 or f32), quantized: hi and lo rows of
	// P bytes (with F8_F16 f16 rows of XP bytes in their place), then the
	// scales; a warp per token and 128 columns, each warp's reads requested
	// together.
	unsigned char *qhi = fsm, *qlo = fsm + NT * P;
	float *xsc = (float *)(fsm + 2 * NT * P);
	const int XP = 2 * P - 16;  // f16 rows: consecutive tokens' lanes on other banks
	for (int p0 = warp; p0 < NT * NB; p0 += 4 * W) {
		float v[4][4];
#pragma unroll
		for (int j = 0; j < 4; j++) {
			int p = p0 + j * W;
			if (p >= NT * NB) continue;
			long e = (x0 + p / NB) * I + 128 * (p % NB) + 4 * lane;
			if (xdt == DT_F32) {
				float4 f = __ldg((const float4 *)((const float *)x + e));
				v[j][0] = f.x, v[j][1] = f.y, v[j][2] = f.z, v[j][3] = f.w;
			} else {
				uint2 u = __ldg((const uint2 *)((const u16 *)x + e));
				v[j][0] = __uint_as_float(u.x << 16), v[j][1] = __uint_as_float(u.x & 0xffff0000u);
				v[j][2] = __uint_as_float(u.y << 16), v[j][3] = __uint_as_float(u.y & 0xffff0000u);
			}
		}
#pragma unroll
		for (int j = 0; j < 4; j++) {
			int p = p0 + j * W, t = p / NB, b = p % NB;
			if (p >= NT * NB) continue;
			if (F8_F16) {
				f16_block(v[j], fsm + t * XP + 256 * b, xsc + t * NB + b, lane);
			} else {
				f8_split(v[j], qhi + t * P + 128 * b, qlo + t * P + 128 * b, xsc + t * NB + b, lane);
			}
		}
	}
	__syncthreads();
	float acc[4] = {0.f, 0.f, 0.f, 0.f};
	Walk it;  // the item to multiply
	for (int i = 0; i < total; i += F8MV_U) {
#pragma unroll
		for (int k = 0; k < F8MV_U; k++) {
			if (i + k >= total) break;
			F8Raw c = raw[k];
			if (i + k + F8MV_U < total) {
				load(raw[k], ld);
				ld.next(n);
			}
			int b = warp + it.bi * W, col = 128 * b + 16 * q;
			uint4 h0 = make_uint4(0u, 0u, 0u, 0u), h1 = h0, l0 = h0, l1 = h0;
			float th[4] = {0.f, 0.f, 0.f, 0.f}, tl[4] = {0.f, 0.f, 0.f, 0.f};
			if (F8_F16) {
				// Token g's f16 activations at the lane's 32 columns (h0 and
				// l0 the first 16, h1 and l1 the 16 at + 64); two chains.
				if (g < NT) {
					const unsigned char *xr = fsm + g * XP + 2 * col;
					h0 = *(const uint4 *)xr, l0 = *(const uint4 *)(xr + 16);
					h1 = *(const uint4 *)(xr + 128), l1 = *(const uint4 *)(xr + 144);
				}
				mma_f8w(th, c.a0.x, c.b0.x, h0.x, h0.y);
				mma_f8w(tl, c.a0.y, c.b0.y, h0.z, h0.w);
				mma_f8w(th, c.a0.z, c.b0.z, l0.x, l0.y);
				mma_f8w(tl, c.a0.w, c.b0.w, l0.z, l0.w);
				mma_f8w(th, c.a1.x, c.b1.x, h1.x, h1.y);
				mma_f8w(tl, c.a1.y, c.b1.y, h1.z, h1.w);
				mma_f8w(th, c.a1.z, c.b1.z, l1.x, l1.y);
				mma_f8w(tl, c.a1.w, c.b1.w, l1.z, l1.w);
			} else {
				if (g < NT) {
					h0 = *(const uint4 *)(qhi + g * P + col);
					h1 = *(const uint4 *)(qhi + g * P + col + 64);
					l0 = *(const uint4 *)(qlo + g * P + col);
					l1 = *(const uint4 *)(qlo + g * P + col + 64);
				}
				// A: rows g (a0, a2) and g + 8 (a1, a3) at the lane's
				// columns 0-3 and 4-7 of each 8; B: token g at the same
				// columns.
				mma_e4m3(th, c.a0.x, c.b0.x, c.a0.y, c.b0.y, h0.x, h0.y);
				mma_e4m3(tl, c.a0.x, c.b0.x, c.a0.y, c.b0.y, l0.x, l0.y);
				mma_e4m3(th, c.a0.z, c.b0.z, c.a0.w, c.b0.w, h0.z, h0.w);
				mma_e4m3(tl, c.a0.z, c.b0.z, c.a0.w, c.b0.w, l0.z, l0.w);
				mma_e4m3(th, c.a1.x, c.b1.x, c.a1.y, c.b1.y, h1.x, h1.y);
				mma_e4m3(tl, c.a1.x, c.b1.x, c.a1.y, c.b1.y, l1.x, l1.y);
				mma_e4m3(th, c.a1.z, c.b1.z, c.a1.w, c.b1.w, h1.z, h1.w);
				mma_e4m3(tl, c.a1.z, c.b1.z, c.a1.w, c.b1.w, l1.z, l1.w);
			}
			// C: rows g (c0, c1) and g + 8 (c2, c3), tokens 2q and 2q + 1.
			float x0 = 2 * q < NT ? xsc[2 * q * NB + b] : 0.f, x1 = 2 * q + 1 < NT ? xsc[(2 * q + 1) * NB + b] : 0.f;
			acc[0] += (th[0] + tl[0]) * (c.sa * x0);
			acc[1] += (th[1] + tl[1]) * (c.sa * x1);
			acc[2] += (th[2] + tl[2]) * (c.sb * x0);
			acc[3] += (th[3] + tl[3]) * (c.sb * x1);
			int gi = it.gi;
			it.next(n);
			if (it.gi == gi) continue;
			// The group's last block: the warps' sums, in warp order, then
			// the outputs.
			int o0 = (blockIdx.x + gi * gridDim.x) * OUTS;
			if (W > 1) {
				if (gi > 0) __syncthreads();  // warp 0 has read the last group's sums
#pragma unroll
				for (int e = 0; e < 4; e++) red[warp][lane][e] = acc[e];
				__syncthreads();
				if (warp == 0)
					for (int v = 1; v < W; v++)
#pragma unroll
						for (int e = 0; e < 4; e++) acc[e] += red[v][lane][e];
			}
			if (warp == 0)
#pragma unroll
				for (int e = 0; e < 2; e++) {
					int t = 2 * q + e;
					if (t >= NT) continue;
					long base = (long)(sel ? r : t) * O;
					float ca = acc[e], cb = acc[2 + e];
					if (SWIGLU) {
						if (o0 + g < O) qstore(out, odt, 0, base + o0 + g, ca / (1.f + __expf(-ca)) * cb);
					} else {
						if (o0 + g < O) qstore(out, odt, accumulate, base + o0 + g, ca);
						if (o0 + g + 8 < O) qstore(out, odt, accumulate, base + o0 + g + 8, cb);
					}
				}
			if (!SWIGLU && sum.out) {
				// Rows r < T are token r / K's choices, the shared expert's
				// rows (ws) token r - T's.
				int tk = r < T ? r / sum.K : r - T, c = tk * groups + o0 / OUTS;
				if (warp == 0) __threadfence();  // the outputs before the arrival
				__syncthreads();
				if (threadIdx.x == 0) last = atomicAdd(sum.cnt + c, 1) == sum.K + (ws != 0) - 1;
				__syncthreads();
				if (last && warp == 0 && lane < OUTS && o0 + lane < O) {
					const float *y = (const float *)out;
					long o = (long)tk * O + o0 + lane;
					float ys = ws ? __ldcg(y + ((long)T + tk) * O + o0 + lane) : 0.f;
					float a = moe_add_rows(sum.out[o], sum.wts + tk * sum.K, y + (long)tk * sum.K * O + o0 + lane, O, sum.K);
					if (ws) a += sum.gs[tk] * ys;
					sum.out[o] = a;
					if (lane == 0) sum.cnt[c] = 0;
				}
			}
			acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
		}
	}
}

extern "C" __global__ void __launch_bounds__(256, F8MV_MINB) f8mv_fp8(void *out, int odt, const void *x, int T, int xdiv, const u8 *w,
		long rb, long estride, const int *sel, const u8 *ws, int xsh, int O, int I, int xdt, int early, int accumulate, MoeSum sum) {
	f8mv<false>(out, odt, x, T, xdiv, w, rb, estride, sel, ws, xsh, O, I, xdt, early, accumulate, sum);
}

extern "C" __global__ void __launch_bounds__(256, F8MV_MINB) f8mv_swiglu_fp8(void *out, int odt, const void *x, int T, int xdiv,
		const u8 *w, long rb, long estride, const int *sel, const u8 *ws, int xsh, int O, int I, int xdt, int early) {
	f8mv<true>(out, odt, x, T, xdiv, w, rb, estride, sel, ws, xsh, O, I, xdt, early, 0, MoeSum{});
}
