// What the MoE kernels of several files share: a token's experts from its
// router logits (moe_route in moe.cu; moe_router in gemv.cu, the router
// product and the ranking in one launch at decode), and the weighted sum
// of a token's expert rows (moe_combine; f8mv's down product, which
// finishes the combine at decode).

// moe_rank: a warp ranks one token's E router logits lt (E <= 1024), each
// lane holding experts lane, lane + 32, ...: softmax over all of them
// (f32), then the top k in torch.topk's order (higher probability first,
// ties to the lower index), picked one at a time: each lane's best expert
// not yet taken, then the warp's best of those; optional
// renormalisation. A rank of a model split by experts holds experts [e0,
// e0 + held): a choice of another rank's expert gets sel -1 and weight 0
// (its rank adds it). lt is read past L1: moe_router's other blocks wrote
// it. (A block a token, a thread an expert, ranking the warps' first k:
// 10-16 us at 512 experts and top 10 on an H200, its barriers most of it.)
// PL is the experts a lane holds, E <= 32 PL: each of the k picks scans
// them (moe_rank_e takes the least PL that E allows; 32 for 128 experts
// scanned 28 empty places a pick).
template <int PL>
__device__ __forceinline__ void moe_rank(const float *lt, int E, int K, int norm, int e0, int held, int *sel, float *wts, int lane) {
	float p[PL];
	float mx = -INF;
#pragma unroll
	for (int j = 0; j < PL; j++) {
		int e = lane + 32 * j;
		p[j] = e < E ? __ldcg(lt + e) : -INF;
		mx = fmaxf(mx, p[j]);
	}
	mx = warp_max(mx);
	float s = 0.f;
#pragma unroll
	for (int j = 0; j < PL; j++) {
		int e = lane + 32 * j;
		p[j] = e < E ? expf(p[j] - mx) : -1.f;  // padding: below every probability
		s += e < E ? p[j] : 0.f;
	}
	s = warp_sum(s);
	unsigned taken = 0;
	float mine = 0.f;
	int mi = 0;
	for (int r = 0; r < K; r++) {
		float bp = -1.f;  // none: padding is never picked
		int bj = 0;
#pragma unroll
		for (int j = 0; j < PL; j++)
			if (!(taken >> j & 1) && p[j] > bp) bp = p[j], bj = j;
		// The warp's best in two reductions (not ten shuffles): a
		// probability's bits order as it does (it is >= 0), and of the
		// lanes that hold the best, the lowest expert wins.
		unsigned best = __reduce_max_sync(0xffffffffu, bp >= 0.f ? __float_as_uint(bp) : 0u);
		int bi = (int)__reduce_min_sync(0xffffffffu, bp >= 0.f && __float_as_uint(bp) == best ? lane + 32 * bj : 0xffffffffu);
		if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
		if (lane == r) mine = __uint_as_float(best), mi = bi;
	}
	float pr = lane < K ? mine / s : 0.f;
	float tot = warp_sum(pr);
	if (lane < K) {
		bool ours = mi >= e0 && mi < e0 + held;
		sel[lane] = ours ? mi - e0 : -1;
		wts[lane] = !ours ? 0.f : norm ? pr / tot : pr;
	}
}

// moe_rank_e is moe_rank for any E <= 1024.
__device__ __forceinline__ void moe_rank_e(const float *lt, int E, int K, int norm, int e0, int held, int *sel, float *wts, int lane) {
	if (E <= 128)
		moe_rank<4>(lt, E, K, norm, e0, held, sel, wts, lane);
	else if (E <= 256)
		moe_rank<8>(lt, E, K, norm, e0, held, sel, wts, lane);
	else if (E <= 512)
		moe_rank<16>(lt, E, K, norm, e0, held, sel, wts, lane);
	else
		moe_rank<32>(lt, E, K, norm, e0, held, sel, wts, lane);
}

// moe_add_rows returns a + sum_k wts[k] * y[k * ys] over a token's K rows
// (y: its first row's element, rows ys apart, written by other blocks or
// kernels: read past L1), in order, a row of weight 0 (another rank's
// expert, never written) read but not added. Sixteen rows' loads are in
// flight together: a branch on each weight before its row's load made ten
// round trips in turn (9.5 us a decode step of 10 experts, H200).
#define MOE_ADD_ROWS 16
__device__ __forceinline__ float moe_add_rows(float a, const float *wts, const float *y, long ys, int K) {
	for (int k0 = 0; k0 < K; k0 += MOE_ADD_ROWS) {
		float wk[MOE_ADD_ROWS], v[MOE_ADD_ROWS];
#pragma unroll
		for (int u = 0; u < MOE_ADD_ROWS; u++) {
			int k = k0 + u;
			wk[u] = k < K ? wts[k] : 0.f;
			v[u] = k < K ? __ldcg(y + k * ys) : 0.f;
		}
#pragma unroll
		for (int u = 0; u < MOE_ADD_ROWS; u++)
			if (wk[u] != 0.f) a += wk[u] * v[u];
	}
	return a;
}

// moe_add_rows2 is moe_add_rows on a pair of columns of bf16 rows (y: the
// pair in its first row, rows ys pairs apart), in the same order.
__device__ __forceinline__ float2 moe_add_rows2(float2 a, const float *wts, const unsigned *y, long ys, int K) {
	for (int k0 = 0; k0 < K; k0 += MOE_ADD_ROWS) {
		float wk[MOE_ADD_ROWS];
		unsigned v[MOE_ADD_ROWS];
#pragma unroll
		for (int u = 0; u < MOE_ADD_ROWS; u++) {
			int k = k0 + u;
			wk[u] = k < K ? wts[k] : 0.f;
			v[u] = k < K ? __ldcg(y + k * ys) : 0u;
		}
#pragma unroll
		for (int u = 0; u < MOE_ADD_ROWS; u++)
			if (wk[u] != 0.f) {
				a.x += wk[u] * __uint_as_float(v[u] << 16);
				a.y += wk[u] * __uint_as_float(v[u] & 0xffff0000u);
			}
	}
	return a;
}
