// The decode products of FP8 weights on Hopper's wgmma: out[t, o] (+)=
// x_t . w_o for 4 to 16 tokens. cuBLASLt's block-scaled GEMM pads a decode
// step's tokens to tiles of 64 or 128 rows and cannot start before the
// kernel ahead of it ends; its products of 16 tokens ran at 0.5-0.6 of the
// bandwidth (docs/performance.md).
//
// Here the weights are wgmma's A operand (the 64 rows of every wgmma) and
// the tokens its B (N = 8 or 16: the tokens rounded up), so that no
// product is padded past 8 tokens' worth. A block is one warpgroup and 64
// weight rows; a stage is a block of 128 columns: the rows' 128-byte bodies
// (kiln's device rows, qlayout.go) and the tokens' e4m3 rows (quant_fp8_act's)
// copied by cp.async as they are into the 128-byte swizzle, with the
// tokens' scales and the weight tile's (fp8t: 64 rows lie in one 128-row
// tile). F8WG_STAGES stages are in flight, the first ones' weights
// requested before pdl_wait (they depend on no kernel). A stage's four
// products go to fresh accumulators, which the tile's scale times each
// token's adds to the totals. Where the tiles make less than a wave of
// blocks, the columns are split (grid.y) and the last block of a tile to
// finish adds the partial sums in split order (the result does not depend
// on which block came last).

// f8wg: grid (ceil(O / 64), S), 128 threads, dynamic shared memory
// f8wgSmem(NT) (fp8.go). xq and xs are quant_fp8_act's rows of T <= NT
// tokens and their scales ([I / 128][T]); w is FP8 device rows of rb
// bytes, wt the tile scales ([ceil(O / 128)][ld]); out f32 (written or
// added to) or bf16 [T, O]. part holds S * T * O partial sums and cnt one
// zeroed counter a tile when S > 1. Requires I % 128 == 0; sm_90a.
template <int NT>
__device__ __forceinline__ void f8wg(void *out, int odt, const u8 *xq, const float *xs, int T, const u8 *w, long rb, const float *wt,
		int ld, int O, int I, int accumulate, float *part, int *cnt) {
	constexpr int SA = 64 * 128, STAGE = SA + NT * 128, AHEAD = F8WG_STAGES - 1;
	extern __shared__ uint4 fw_smem[];
	__shared__ int last;
	unsigned base = (smem_addr(fw_smem) + 1023) & ~1023u;  // the swizzle's atoms are 1024-byte aligned
	// A stage's NT token scales, then the weight tile's.
	float *sc = (float *)((u8 *)fw_smem + (base - smem_addr(fw_smem)) + F8WG_STAGES * STAGE);
	pdl_trigger();
	int tile = blockIdx.x, s = blockIdx.y, S = gridDim.y, o0 = 64 * tile;
	int nk = I >> 7, k0 = s * nk / S, n = (s + 1) * nk / S - k0;
	int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
	// A thread's four 16-byte copies of a stage's weights: piece c & 7 of
	// row c / 8 (rows past O read row O - 1, whose outputs are not stored).
	const u8 *ap[4];
	unsigned ad[4];
#pragma unroll
	for (int i = 0; i < 4; i++) {
		int c = tid + 128 * i, r = c >> 3;
		ap[i] = w + (long)min(o0 + r, O - 1) * rb + (long)k0 * 128 + (c & 7) * 16;
		ad[i] = r * 128 + (((c & 7) ^ (r & 7)) << 4);
	}
	const float *ws = wt + (long)(o0 >> 7) * ld + k0;
	auto load_w = [&](int st, int k) {
		unsigned d = base + st * STAGE;
#pragma unroll
		for (int i = 0; i < 4; i++) cp_async16(d + ad[i], ap[i] + k * 128);
		if (tid == 0) cp_async4(smem_addr(sc + st * (NT + 1) + NT), ws + k);
	};
	// Token rows past T are not loaded: a token's products read its own row
	// only, and theirs are not stored.
	auto load_x = [&](int st, int k) {
		unsigned d = base + st * STAGE + SA;
		const u8 *xk = xq + (long)(k0 + k) * 128;
#pragma unroll
		for (int i = 0; i < (NT * 8 + 127) / 128; i++) {
			int c = tid + 128 * i, r = c >> 3;
			if (r < T) cp_async16(d + r * 128 + (((c & 7) ^ (r & 7)) << 4), xk + (long)r * I + (c & 7) * 16);
		}
		if (tid < T) cp_async4(smem_addr(sc + st * (NT + 1) + tid), xs + (long)(k0 + k) * T + tid);
	};
#pragma unroll
	for (int i = 0; i < AHEAD; i++)
		if (i < n) load_w(i, i);
	pdl_wait();
#pragma unroll
	for (int i = 0; i < AHEAD; i++) {
		if (i < n) load_x(i, i);
		asm volatile("cp.async.commit_group;");
	}
	float acc[NT / 2], prod[NT / 2];
#pragma unroll
	for (int j = 0; j < NT / 2; j++) acc[j] = 0.f;
	for (int i = 0; i < n; i++) {
		int st = i % F8WG_STAGES;
		asm volatile("cp.async.wait_group %0;" ::"n"(AHEAD - 1));
		fence_async_smem();
		__syncthreads();  // stage i is in, and every warp is done with stage i - 1, refilled next
		if (i + AHEAD < n) {
			load_w((i + AHEAD) % F8WG_STAGES, i + AHEAD);
			load_x((i + AHEAD) % F8WG_STAGES, i + AHEAD);
		}
		asm volatile("cp.async.commit_group;");
		unsigned a = base + st * STAGE;
		wgmma_fence();
#pragma unroll
		for (int ks = 0; ks < 4; ks++) wgmma_e4m3_n<NT>(prod, wg_desc(a + 32 * ks), wg_desc(a + SA + 32 * ks), ks);
		wgmma_commit_wait<0>();
		const float *ssc = sc + st * (NT + 1);
		float wsc = ssc[NT];
#pragma unroll
		for (int j = 0; j < NT / 8; j++) {
			float x0 = ssc[8 * j + 2 * (lane & 3)] * wsc, x1 = ssc[8 * j + 2 * (lane & 3) + 1] * wsc;
			acc[4 * j] = fmaf(prod[4 * j], x0, acc[4 * j]);
			acc[4 * j + 1] = fmaf(prod[4 * j + 1], x1, acc[4 * j + 1]);
			acc[4 * j + 2] = fmaf(prod[4 * j + 2], x0, acc[4 * j + 2]);
			acc[4 * j + 3] = fmaf(prod[4 * j + 3], x1, acc[4 * j + 3]);
		}
	}
	asm volatile("cp.async.wait_group 0;");
	// acc[j]: weight row o0 + 16 warp + lane / 4 + 8 ((j / 2) % 2), token
	// 8 (j / 4) + 2 (lane % 4) + j % 2 (wgmma_e4m3_n).
	int r0 = o0 + 16 * warp + (lane >> 2), t0 = 2 * (lane & 3);
	auto row = [&](int j) { return r0 + 8 * ((j >> 1) & 1); };
	auto tok = [&](int j) { return t0 + 8 * (j >> 2) + (j & 1); };
	if (S == 1) {
#pragma unroll
		for (int j = 0; j < NT / 2; j++)
			if (row(j) < O && tok(j) < T) qstore(out, odt, accumulate, (long)tok(j) * O + row(j), acc[j]);
		return;
	}
#pragma unroll
	for (int j = 0; j < NT / 2; j++)
		if (row(j) < O && tok(j) < T) part[((long)s * T + tok(j)) * O + row(j)] = acc[j];
	__threadfence();
	__syncthreads();
	if (tid == 0) last = atomicAdd(cnt + tile, 1) == S - 1;
	__syncthreads();
	if (!last) return;
	__threadfence();
#pragma unroll
	for (int j = 0; j < NT / 2; j++) acc[j] = 0.f;
	for (int q = 0; q < S; q++)
#pragma unroll
		for (int j = 0; j < NT / 2; j++)
			if (row(j) < O && tok(j) < T) acc[j] += ld_cg(part + ((long)q * T + tok(j)) * O + row(j));
#pragma unroll
	for (int j = 0; j < NT / 2; j++)
		if (row(j) < O && tok(j) < T) qstore(out, odt, accumulate, (long)tok(j) * O + row(j), acc[j]);
	if (tid == 0) cnt[tile] = 0;  // ready for the next call (or graph replay)
}

// f8wg_8, f8wg_16: tiles of up to that many tokens (elsewhere than sm_90a
// they trap).
#define F8WG(NT) \
	extern "C" __global__ void __launch_bounds__(128) f8wg_##NT(void *out, int odt, const u8 *xq, const float *xs, int T, const u8 *w, \
			long rb, const float *wt, int ld, int O, int I, int accumulate, float *part, int *cnt) { \
		if (WGMMA) { \
			f8wg<NT>(out, odt, xq, xs, T, w, rb, wt, ld, O, I, accumulate, part, cnt); \
		} else { \
			__trap(); \
		} \
	}
F8WG(8)
F8WG(16)
