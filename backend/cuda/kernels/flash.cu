// Tensor-core prefill attention (FlashAttention-2 style) for bf16 caches:
// mma.sync m16n8k16 bf16 with f32 accumulation. A block is NW warps and 128
// queries of one sequence and head (fewer would re-read each key and value
// tile from L2 too often); each warp owns MT row tiles of 16 queries, and
// every key or value fragment it loads from shared memory serves all of them
// (with one tile per warp, shared memory bandwidth rather than the tensor
// cores set the pace). Key and value tiles of BK tokens are staged in shared
// memory by cp.async, two stages deep so the next tile loads while this one
// is used; the scores stay in registers, the probabilities are fed back to
// the second product straight from the accumulator layout, and V's fragments
// come from transposing ldmatrix loads.
//
// A step of few queries over long contexts (a follow-up turn's chunk after
// a long conversation) makes too few blocks to fill the GPU, each walking
// every key: the SPLIT kernels cut the keys into nsplit ranges of splitLen
// (a multiple of BK), block z = s * nsplit + split takes one, and write
// unnormalised partial results (max and sum in log2 units, as the decode
// kernels do) that attn_combine merges. (A template parameter: the split's
// registers made the 128-query kernel spill 136 bytes instead of 16.)
// flash_q4 returns dims d..d+3 of query row r (of a sequence from start)
// of head h, times qs, as bf16.
__device__ __forceinline__ uint2 flash_q4(const u16 *qbuf, int start, int r, int H, int h, int HD, int d, float qs) {
	uint2 v = *(const uint2 *)(qbuf + ((long)(start + r) * H + h) * HD + d), u;
	u.x = pack_bf16(__uint_as_float(v.x << 16) * qs, __uint_as_float(v.x & 0xffff0000u) * qs);
	u.y = pack_bf16(__uint_as_float(v.y << 16) * qs, __uint_as_float(v.y & 0xffff0000u) * qs);
	return u;
}

// flash_kv returns the element offset of key position key's row of kv head
// kh in a paged cache (block table bt, blocks of bs tokens).
__device__ __forceinline__ long flash_kv(const int *bt, int bs, int KH, int kh, int HD, int key) {
	return (((long)bt[key / bs] * bs + key % bs) * KH + kh) * HD;
}

// flash_mask sets to -inf the scores of a row tile's keys (kt + 8 n + qc
// and the next) past its two rows' positions or at k1 and past.
template <int BK>
__device__ __forceinline__ void flash_mask(float (&sc)[BK / 8][4], const int (&pos)[2], int kt, int qc, int k1) {
#pragma unroll
	for (int n = 0; n < BK / 8; n++) {
		int key = kt + n * 8 + qc;
#pragma unroll
		for (int e = 0; e < 4; e++) {
			int kk = key + (e & 1);
			if (kk > pos[e >> 1] || kk >= k1) sc[n][e] = -INF;
		}
	}
}

// flash_softmax moves a row tile's online softmax on by a key tile's scores
// sc (log2 units, in the accumulator layout): the maxima m and sums l of
// the lane's two rows, the accumulators o rescaled, and the probabilities
// as bf16 A fragments pa of the P.V product.
template <int BK, int NT>
__device__ __forceinline__ void flash_softmax(const float (&sc)[BK / 8][4], float (&m)[2], float (&l)[2], float (&o)[NT][4],
		unsigned (&pa)[BK / 16][4]) {
	float mx0 = -INF, mx1 = -INF;
#pragma unroll
	for (int n = 0; n < BK / 8; n++) {
		mx0 = fmaxf(mx0, fmaxf(sc[n][0], sc[n][1]));
		mx1 = fmaxf(mx1, fmaxf(sc[n][2], sc[n][3]));
	}
	mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
	mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
	mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
	mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
	float mn0 = fmaxf(m[0], mx0), mn1 = fmaxf(m[1], mx1);
	// Rows with nothing visible yet keep a zero state (and avoid inf - inf).
	float c0 = mn0 == -INF ? 1.f : exp2f(m[0] - mn0), c1 = mn1 == -INF ? 1.f : exp2f(m[1] - mn1);
	float b0 = mn0 == -INF ? 0.f : mn0, b1 = mn1 == -INF ? 0.f : mn1;
	float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
	for (int n = 0; n < BK / 8; n++) {
		float p00 = exp2f(sc[n][0] - b0), p01 = exp2f(sc[n][1] - b0);
		float p10 = exp2f(sc[n][2] - b1), p11 = exp2f(sc[n][3] - b1);
		ps0 += p00 + p01;
		ps1 += p10 + p11;
		int k = n >> 1, hi = (n & 1) * 2;
		pa[k][hi] = pack_bf16(p00, p01);
		pa[k][hi + 1] = pack_bf16(p10, p11);
	}
	l[0] = l[0] * c0 + ps0;
	l[1] = l[1] * c1 + ps1;
	m[0] = mn0;
	m[1] = mn1;
#pragma unroll
	for (int n = 0; n < NT; n++) {
		o[n][0] *= c0;
		o[n][1] *= c0;
		o[n][2] *= c1;
		o[n][3] *= c1;
	}
}

// flash_pv adds P.V of a key tile to the accumulators of MT row tiles, V's
// fragments by transposing loads from sV (byte address, rows KP bf16
// apart): lane l addresses row l%8 of matrix l/8 = (keys +0/+8) x (dims of
// n-tile n / n+1), and each fragment serves every row tile.
template <int MT, int BK, int NT, int KP>
__device__ __forceinline__ void flash_pv(float (&o)[MT][NT][4], const unsigned (&pa)[MT][BK / 16][4], unsigned sV, int mi, int mr) {
#pragma unroll
	for (int k = 0; k < BK / 16; k++) {
#pragma unroll
		for (int n = 0; n < NT; n += 2) {
			unsigned v0, v1, v2, v3;
			ldmatrix_x4_trans(sV + 2 * ((k * 16 + (mi & 1) * 8 + mr) * KP + (n + (mi >> 1)) * 8), v0, v1, v2, v3);
#pragma unroll
			for (int t = 0; t < MT; t++) {
				mma_bf16(o[t][n], pa[t][k][0], pa[t][k][1], pa[t][k][2], pa[t][k][3], v0, v1);
				mma_bf16(o[t][n + 1], pa[t][k][0], pa[t][k][1], pa[t][k][2], pa[t][k][3], v2, v3);
			}
		}
	}
}

// FlashOut is where a flash kernel's rows go: out (odt) and, for gated
// heads, the gates in the projection qkv (qdt); or, split, the partial
// results pm, pl, pacc of nsplit ranges.
struct FlashOut {
	void *out;
	int odt;
	const void *qkv;
	int qdt, gated;
	float *pm, *pl, *pacc;
	int nsplit, split;
};

// flash_store writes the rows of MT row tiles from query w0 on (lane rows
// w0 + 16 t + quad, + 8) of a sequence of nN new tokens from start: o / l,
// times the gate where gated; split, the unnormalised partial results.
template <int HD, int MT, bool SPLIT>
__device__ __forceinline__ void flash_store(const FlashOut &f, const float (&o)[MT][HD / 8][4], const float (&m)[MT][2],
		const float (&l)[MT][2], int w0, int nN, int start, int h, int H, int KH) {
	constexpr int NT = HD / 8;
	int lane = threadIdx.x & 31, quad = lane >> 2, qc = (lane & 3) * 2;
#pragma unroll
	for (int t = 0; t < MT; t++) {
#pragma unroll
		for (int half = 0; half < 2; half++) {
			// Row sums are spread over the quad.
			float lt = l[t][half];
			lt += __shfl_xor_sync(0xffffffffu, lt, 1);
			lt += __shfl_xor_sync(0xffffffffu, lt, 2);
			int r = w0 + t * 16 + quad + half * 8;
			if (r >= nN) continue;
			long tok = start + r;
			if (SPLIT) {
				// Rows that saw no key of this split leave m = -inf, l = 0
				// and zeros, which attn_combine weighs zero.
				long pi = (tok * H + h) * f.nsplit + f.split;
				if ((lane & 3) == 0) {
					f.pm[pi] = m[t][half];
					f.pl[pi] = lt;
				}
#pragma unroll
				for (int n = 0; n < NT; n++) {
					f.pacc[pi * HD + n * 8 + qc] = o[t][n][half * 2];
					f.pacc[pi * HD + n * 8 + qc + 1] = o[t][n][half * 2 + 1];
				}
				continue;
			}
			float inv = 1.f / lt;
#pragma unroll
			for (int n = 0; n < NT; n++) {
#pragma unroll
				for (int e = 0; e < 2; e++) {
					attn_store(f.out, f.odt, f.qkv, f.qdt, f.gated, tok, h, H, KH, HD, n * 8 + qc + e, o[t][n][half * 2 + e] * inv);
				}
			}
		}
	}
}

template <int HD, int BK, int NW, int MT, bool SPLIT>
__device__ __forceinline__ void flash_prefill(void *out, int odt, const u16 *qbuf, const u16 *kc, const u16 *vc, const void *qkv, int qdt,
		const int *seqpos, const int *seqn, const int *seqstart, const int *seqblk, const int *blocks,
		int H, int KH, int bs, float scale, int gated, float *pm, float *pl, float *pacc, int nsplit, int splitLen) {
	constexpr int WQ = 16 * MT, BQ = WQ * NW, KS = HD / 16, NT = HD / 8, KP = HD + 8;
	// Dynamic shared memory: 2 stages x (K + V) x BK rows of HD + 8 bf16,
	// then the query tile, BQ rows of HD + 8 bf16.
	extern __shared__ __align__(16) u16 fsm[];
	// Heads vary fastest and query tiles run last to first, so the longest
	// (latest) tiles of every head start first and the short ones fill the tail.
	if (!SPLIT) nsplit = 1;
	int s = blockIdx.z / nsplit, split = blockIdx.z % nsplit, h = blockIdx.x, qi0 = (gridDim.y - 1 - blockIdx.y) * BQ;
	int nN = seqn[s];
	if (qi0 >= nN) return;
	int kh = h / (H / KH);
	int p0 = seqpos[s], start = seqstart[s];
	const int *bt = blocks + seqblk[s];
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, quad = lane >> 2, qc = (lane & 3) * 2;
	int mi = lane >> 3, mr = lane & 7;

	// The query tile (pre-scaled into log2 units) goes to shared memory as
	// bf16; warps read their A fragments from it by ldmatrix where used,
	// which keeps the registers for the accumulators.
	float qs = scale * LOG2E;
	u16 *sQ = fsm + 2 * 2 * BK * KP;
	unsigned sbase = smem_addr(fsm);  // byte addresses below: 2 per element
	for (int idx = threadIdx.x; idx < BQ * HD / 4; idx += blockDim.x) {
		int r = idx / (HD / 4), d = (idx % (HD / 4)) * 4;
		*(uint2 *)(sQ + r * KP + d) = flash_q4(qbuf, start, min(qi0 + r, nN - 1), H, h, HD, d, qs);
	}
	// Lane l's ldmatrix row of the warp's first query tile: matrices are
	// (rows +0/+8) x (dims +0/+8) in the order of an A fragment.
	int w0 = qi0 + warp * WQ;  // the warp's first query
	unsigned qrow = smem_addr(sQ + (warp * WQ + mr + (mi & 1) * 8) * KP + (mi >> 1) * 8);
	float o[MT][NT][4], m[MT][2], l[MT][2];
	int pos[MT][2];  // positions of the lane's rows (keys <= pos are visible)
#pragma unroll
	for (int t = 0; t < MT; t++) {
#pragma unroll
		for (int n = 0; n < NT; n++) o[t][n][0] = o[t][n][1] = o[t][n][2] = o[t][n][3] = 0.f;
		m[t][0] = m[t][1] = -INF;
		l[t][0] = l[t][1] = 0.f;
		pos[t][0] = p0 + w0 + t * 16 + quad;
		pos[t][1] = pos[t][0] + 8;
	}
	int kend = p0 + min(nN, qi0 + BQ);
	// This block's keys: [k0, k1), all of them unless split.
	int k0 = SPLIT ? split * splitLen : 0, k1 = SPLIT ? min(kend, k0 + splitLen) : kend;
	// stage copies tile kt into buffer st with cp.async, consecutive threads
	// taking consecutive 16 bytes of a key's row (keys past the end repeat
	// the last key: finite values that the mask zeroes).
	auto stage = [&](int st, int kt) {
		unsigned dK = sbase + 2 * st * 2 * BK * KP, dV = dK + 2 * BK * KP;
		for (int idx = threadIdx.x; idx < BK * HD / 8; idx += blockDim.x) {
			int j = idx / (HD / 8), d = idx % (HD / 8) * 8;
			long off = flash_kv(bt, bs, KH, kh, HD, min(kt + j, kend - 1)) + d;
			cp_async16(dK + 2 * (j * KP + d), kc + off);
			cp_async16(dV + 2 * (j * KP + d), vc + off);
		}
		asm volatile("cp.async.commit_group;");
	};
	if (k0 < k1) stage(0, k0);
	int it = 0;
	for (int kt = k0; kt < k1; kt += BK, it++) {
		if (kt + BK < k1) {
			stage((it + 1) & 1, kt + BK);
			asm volatile("cp.async.wait_group 1;");
		} else {
			asm volatile("cp.async.wait_group 0;");
		}
		__syncthreads();
		unsigned sK = sbase + 2 * (it & 1) * 2 * BK * KP, sV = sK + 2 * BK * KP;
		// Tiles entirely above the diagonal for this warp are skipped, and
		// all tiles by a warp whose rows are past the sequence's end (a
		// decoding sequence in a serving step has one).
		if (w0 < nN && kt <= p0 + min(w0 + WQ - 1, nN - 1)) {
			float sc[MT][BK / 8][4];
#pragma unroll
			for (int t = 0; t < MT; t++)
#pragma unroll
				for (int n = 0; n < BK / 8; n++) sc[t][n][0] = sc[t][n][1] = sc[t][n][2] = sc[t][n][3] = 0.f;
			// K fragments by ldmatrix: lane l addresses key row l%8 of the
			// n-tile, dims +8*(l/8) of a pair of k steps.
#pragma unroll
			for (int k = 0; k < KS; k += 2) {
				unsigned a[MT][2][4];
#pragma unroll
				for (int t = 0; t < MT; t++) {
					ldmatrix_x4(qrow + 2 * (t * 16 * KP + k * 16), a[t][0][0], a[t][0][1], a[t][0][2], a[t][0][3]);
					ldmatrix_x4(qrow + 2 * (t * 16 * KP + (k + 1) * 16), a[t][1][0], a[t][1][1], a[t][1][2], a[t][1][3]);
				}
#pragma unroll
				for (int n = 0; n < BK / 8; n++) {
					unsigned b0, b1, b2, b3;
					ldmatrix_x4(sK + 2 * ((n * 8 + mr) * KP + mi * 8 + k * 16), b0, b1, b2, b3);
#pragma unroll
					for (int t = 0; t < MT; t++) {
						mma_bf16(sc[t][n], a[t][0][0], a[t][0][1], a[t][0][2], a[t][0][3], b0, b1);
						mma_bf16(sc[t][n], a[t][1][0], a[t][1][1], a[t][1][2], a[t][1][3], b2, b3);
					}
				}
			}
			// Only tiles crossing the diagonal or the end of the keys are masked.
			if (kt + BK - 1 > p0 + w0 || kt + BK > k1)
#pragma unroll
				for (int t = 0; t < MT; t++) flash_mask<BK>(sc[t], pos[t], kt, qc, k1);
			unsigned pa[MT][BK / 16][4];
#pragma unroll
			for (int t = 0; t < MT; t++) flash_softmax<BK, NT>(sc[t], m[t], l[t], o[t], pa[t]);
			flash_pv<MT, BK, NT, KP>(o, pa, sV, mi, mr);
		}
		__syncthreads();  // the next stage overwrites this buffer
	}
	FlashOut f{out, odt, qkv, qdt, gated, pm, pl, pacc, nsplit, split};
	flash_store<HD, MT, SPLIT>(f, o, m, l, w0, nN, start, h, H, KH);
}

// flash_wg: the prefill attention of long prompts on Hopper (sm_90a), both
// products on wgmma: blocks of two warpgroups and 128 queries of one
// sequence and head, a warpgroup 64 of them, key tiles of 64, staged by
// cp.async two deep. Q, K and V lie in shared memory in the 128-byte
// swizzle (wgmma.cuh) in panels of 64 dims: rows of 128 bytes, one query
// or key each. S = Q K^T is a wgmma m64n64 each 16 dims with both operands
// there, K-major; O += P V takes P from registers (the softmax leaves it as
// mma.sync A fragments, which is wgmma's register layout) and V as the
// transposed (MN-major) operand, its rows as they are. The softmax is
// flash_prefill's: a warp's 16 rows of scores are an mma accumulator.
// (flash_prefill's 128-query tiles ran Qwen3-30B-A3B's 4K prompt at 214
// TFLOP/s on an H200, 27% of the tensor cores, its shared memory the
// limit: Q, K and V fragments loaded by ldmatrix for each warp's rows; the
// scores alone on wgmma, 218.) Dynamic shared memory flashWGSmem(HD),
// aligned to 1024 bytes within: Q [HD / 64][128][64] bf16, then 2 stages
// of K and then of V [HD / 64][64][64] bf16.
template <int HD>
__device__ __forceinline__ void flash_wg(void *out, int odt, const u16 *qbuf, const u16 *kc, const u16 *vc, const void *qkv, int qdt,
		const int *seqpos, const int *seqn, const int *seqstart, const int *seqblk, const int *blocks, int H, int KH, int bs,
		float scale, int gated) {
	constexpr int BQ = 128, BK = 64, NP = HD / 64, NT = HD / 8;
	constexpr int SQ = NP * BQ * 128, SK = NP * BK * 128;  // bytes
	extern __shared__ __align__(16) u16 fsm[];
	unsigned base = (smem_addr(fsm) + 1023) & ~1023u;
	unsigned sQ = base, sK0 = sQ + SQ, sV0 = sK0 + 2 * SK;
	int h = blockIdx.x, qi0 = (gridDim.y - 1 - blockIdx.y) * BQ, s = blockIdx.z;
	int nN = seqn[s];
	if (qi0 >= nN) return;
	int kh = h / (H / KH), p0 = seqpos[s], start = seqstart[s];
	const int *bt = blocks + seqblk[s];
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = warp >> 2, quad = lane >> 2, qc = (lane & 3) * 2;
	// swz is the byte offset of dims d.. (a multiple of 4) of row r in a
	// [HD / 64][rows][64] swizzled array.
	auto swz = [](int rows, int r, int d) { return (d >> 6) * rows * 128 + r * 128 + ((((d & 63) >> 3) ^ (r & 7)) << 4) + (d & 7) * 2; };
	float qs = scale * LOG2E;
	for (int idx = threadIdx.x; idx < BQ * HD / 4; idx += blockDim.x) {
		int r = idx / (HD / 4), d = (idx % (HD / 4)) * 4;
		uint2 v = flash_q4(qbuf, start, min(qi0 + r, nN - 1), H, h, HD, d, qs);
		asm volatile("st.shared.v2.b32 [%0], {%1, %2};" ::"r"(sQ + swz(BQ, r, d)), "r"(v.x), "r"(v.y));
	}
	int kend = p0 + min(nN, qi0 + BQ);
	auto stage = [&](int st, int kt) {
		for (int idx = threadIdx.x; idx < BK * HD / 8; idx += blockDim.x) {
			int j = idx / (HD / 8), d = idx % (HD / 8) * 8;
			long off = flash_kv(bt, bs, KH, kh, HD, min(kt + j, kend - 1)) + d;
			cp_async16(sK0 + st * SK + swz(BK, j, d), kc + off);
			cp_async16(sV0 + st * SK + swz(BK, j, d), vc + off);
		}
		asm volatile("cp.async.commit_group;");
	};
	int w0 = qi0 + 16 * warp, g0 = qi0 + 64 * wg;  // the warp's and its warpgroup's first query
	float o[NT][4], m[2] = {-INF, -INF}, l[2] = {0.f, 0.f};
	int pos[2] = {p0 + w0 + quad, p0 + w0 + quad + 8};
#pragma unroll
	for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
	stage(0, 0);
	int it = 0;
	for (int kt = 0; kt < kend; kt += BK, it++) {
		if (kt + BK < kend) {
			stage((it + 1) & 1, kt + BK);
			asm volatile("cp.async.wait_group 1;");
		} else {
			asm volatile("cp.async.wait_group 0;");
		}
		fence_async_smem();
		__syncthreads();  // the stage is in, and Q (first time round)
		// A warpgroup skips the tiles above its rows' diagonal (the
		// products are the warpgroup's: the test is too).
		if (g0 < nN && kt <= p0 + min(g0 + 63, nN - 1)) {
			unsigned sK = sK0 + (it & 1) * SK, sV = sV0 + (it & 1) * SK;
			float acc[32];
			wgmma_fence();
#pragma unroll
			for (int p = 0; p < NP; p++)
#pragma unroll
				for (int ks = 0; ks < 4; ks++)
					wgmma_bf16_n64(acc, wg_desc(sQ + p * BQ * 128 + wg * 64 * 128 + 32 * ks), wg_desc(sK + p * BK * 128 + 32 * ks), p | ks);
			wgmma_commit_wait<0>();
			float sc[BK / 8][4];
#pragma unroll
			for (int n = 0; n < BK / 8; n++)
#pragma unroll
				for (int e = 0; e < 4; e++) sc[n][e] = acc[4 * n + e];
			if (kt + BK - 1 > p0 + w0 || kt + BK > kend) flash_mask<BK>(sc, pos, kt, qc, kend);
			unsigned pa[BK / 16][4];
			flash_softmax<BK, NT>(sc, m, l, o, pa);
			// V's 16 keys ks are two atoms of 8 rows (2048 bytes); its
			// panels of 64 dims lie BK rows apart.
			wgmma_fence();
#pragma unroll
			for (int ks = 0; ks < BK / 16; ks++) wgmma_bf16_rs<HD, 0, NT>(o, pa[ks], wg_desc_mn(sV + 2048 * ks, BK * 128));
			wgmma_commit_wait<0>();
		}
		__syncthreads();  // the next stage overwrites this buffer
	}
	FlashOut f{out, odt, qkv, qdt, gated, nullptr, nullptr, nullptr, 1, 0};
	float o1[1][NT][4], m1[1][2] = {{m[0], m[1]}}, l1[1][2] = {{l[0], l[1]}};
#pragma unroll
	for (int n = 0; n < NT; n++)
#pragma unroll
		for (int e = 0; e < 4; e++) o1[0][n][e] = o[n][e];
	flash_store<HD, 1, false>(f, o1, m1, l1, w0, nN, start, h, H, KH);
}

// flash_prefill_BQ_BK_HD: blocks of four warps, BQ queries, key tiles of
// BK. Long prompts: four warps of two row tiles measured best on an H100
// (against eight warps of one row tile); with shared-memory addresses held
// as 32-bit values, tiles of 64 keys beat 48 and 32 (backend/cuda/NOTES.md,
// "Figures behind the code"). Prompts of up to 1K tokens make too few
// 128-query blocks to fill the GPU, and the longest one sets the time: 64
// queries a block (one row tile a warp) there, with 32-key tiles (four
// blocks a multiprocessor) up to 512 tokens. Which is used: flashTile in
// attention.go. flash_split_BQ_BK_HD: tiles with split keys. With the keys
// split the blocks are enough whatever the query tile, and 128 queries
// (two row tiles a warp) halve the key and value tiles each block stages
// and each fragment's shared-memory loads; their 32-key tiles keep the
// 128-dim kernel within the registers of two blocks a multiprocessor (239;
// 64 keys spill), where the 64-query 32-key kernel of four blocks spills.
#define FLASH(NAME, BQ, BK, MINB, HD, SPLIT) \
	extern "C" __global__ void __launch_bounds__(128, MINB) NAME(void *out, int odt, \
			const u16 *qbuf, const u16 *kc, const u16 *vc, const void *qkv, int qdt, const int *seqpos, const int *seqn, \
			const int *seqstart, const int *seqblk, const int *blocks, int H, int KH, int bs, float scale, int gated, \
			float *pm, float *pl, float *pacc, int nsplit, int splitLen) { \
		flash_prefill<HD, BK, 4, BQ / 64, SPLIT>(out, odt, qbuf, kc, vc, qkv, qdt, seqpos, seqn, seqstart, seqblk, blocks, H, KH, \
				bs, scale, gated, pm, pl, pacc, nsplit, splitLen); \
	}
FLASH(flash_prefill_128_64_64, 128, 64, 2, 64, false)
FLASH(flash_prefill_128_64_128, 128, 64, 2, 128, false)
FLASH(flash_prefill_64_64_64, 64, 64, 2, 64, false)
FLASH(flash_prefill_64_64_128, 64, 64, 2, 128, false)
FLASH(flash_prefill_64_32_64, 64, 32, 4, 64, false)
FLASH(flash_prefill_64_32_128, 64, 32, 4, 128, false)
FLASH(flash_prefill_64_32_256, 64, 32, 2, 256, false)
FLASH(flash_split_64_64_64, 64, 64, 2, 64, true)
FLASH(flash_split_64_64_128, 64, 64, 2, 128, true)
FLASH(flash_split_64_32_64, 64, 32, 4, 64, true)
FLASH(flash_split_64_32_128, 64, 32, 4, 128, true)
FLASH(flash_split_64_32_256, 64, 32, 2, 256, true)
FLASH(flash_split_128_32_64, 128, 32, 2, 64, true)
FLASH(flash_split_128_32_128, 128, 32, 2, 128, true)

// flash_wg_HD: flash_wg's kernels (sm_90a; elsewhere they trap). Grid (H,
// query tiles of 128, sequences), 256 threads; MINB blocks a multiprocessor.
#define FLASH_WG(HD, MINB) \
	extern "C" __global__ void __launch_bounds__(256, MINB) flash_wg_##HD(void *out, int odt, const u16 *qbuf, const u16 *kc, \
			const u16 *vc, const void *qkv, int qdt, const int *seqpos, const int *seqn, const int *seqstart, const int *seqblk, \
			const int *blocks, int H, int KH, int bs, float scale, int gated) { \
		if (WGMMA) { \
			flash_wg<HD>(out, odt, qbuf, kc, vc, qkv, qdt, seqpos, seqn, seqstart, seqblk, blocks, H, KH, bs, scale, gated); \
		} else { \
			__trap(); \
		} \
	}
FLASH_WG(64, 2)
FLASH_WG(128, 2)
FLASH_WG(256, 1)

// attn_decode_mma: the split-K decode attention of attn_decode (same grid
// (T, KH, S), same partial results for attn_combine) on tensor cores, for
// bf16 caches. The G = H / KH <= 16 query heads of kv head kh are the
// columns of NG n-tiles of 8 (columns past G are zero) and a warp's 16 keys
// the rows; 128 threads stage tiles of DM_BK keys and values in shared
// memory by cp.async, ST deep, and each warp takes 16 keys of a tile:
// scores, online softmax and P.V by mma.sync, then the four warps merge.
// The scalar kernel spends ~60 instructions per key and lane on bf16
// widening, shuffles and FMAs and stops short of the memory's speed; here
// a key costs a few.
//
// Launched overlapped like attn_decode: the first ST - 1 tiles' keys cached
// by earlier steps are requested before pdl_wait, this step's keys (at and
// past seqpos) and the queries are read after it.
//
// Fused (a step of one token a sequence, and enough of them that a block
// takes all of a token's keys: S = 1): the kernel is also qk_norm_rope and
// writes the output itself, no partials for attn_combine. Each block norms
// and rotates its G query heads and the key of kv head kh, stores the key
// and value, and attends: three dependent launches a layer become one.
// (With splits, the last to finish merging the partials was tried: at
// batch 1 the kernel could no longer be placed beside the projection's
// blocks to stream the cached keys early, and lost 3.4 us a layer; NOTES.md.)
struct DecodeFuse {
	const void *qkv;  // the layer's fused projection [T, q | k | v], type qdt
	int qdt;
	const void *qn, *kn;  // the q and k norms' weights, type wdt
	int wdt, unitOffset;
	float eps, attnFactor;
	int rd, gated;
	void *out;  // [T, H*HD], type odt
	int odt;
};

template <int HD, int ST, int NG, bool FUSED>
__device__ __forceinline__ void attn_decode_mma(const u16 *qbuf, const u16 *kc, const u16 *vc,
		const int *tokpos, const int *tokseq, const int *seqpos, const int *seqblk, const int *blocks,
		float *pm, float *pl, float *pacc, int H, int KH, int bs, float scale, const DecodeFuse &f, const RopeFreq &rf) {
	constexpr int W = 4, BK = DM_BK, KS = HD / 16, KP = HD + 8;
	extern __shared__ __align__(16) u16 dsm[];  // ST stages x (K + V) x BK rows of KP bf16
	__shared__ float sm_m[W][16], sm_l[W][16];
	int G = H / KH;
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, quad = lane >> 2, qc = (lane & 3) * 2;
	int mi = lane >> 3, mr = lane & 7;
	DecodeSplit sp;
	if (!sp.init(tokpos, tokseq, seqpos, seqblk, blocks, DS_MMA)) return;
	int t = sp.t, kh = sp.kh, n = sp.n, k0 = sp.k0, k1 = sp.k1, cached = sp.cached;
	const int *bt = sp.bt;

	// copy moves the tile at kt into buffer st: thread i takes columns dc
	// and dc + HD/2 (16 bytes each) of keys r, r + JS, ..., so that
	// consecutive threads read a key's row in two runs of HD bytes and each
	// address serves four copies; keys past k1 repeat the last key (finite
	// values that the mask removes). Before pdl_wait (when = early) it
	// leaves this step's keys out, and fixup then loads just those. The
	// block size is a power of two (NewKVCache): with a division by it for
	// every 16-byte piece, the addresses were ~390 of the loop's ~670
	// instructions a tile, and with two warps a scheduler the kernel issued
	// on 44% of cycles and read its keys at 2.7 TB/s (H200, ncu, batch 64).
	enum { all, early, fixup };
	constexpr int CH = HD / 16, JS = 32 * W / CH, CPT = BK / JS;
	const int r = threadIdx.x / CH, lb = __ffs(bs) - 1, rs = KH * HD, bsr = bs * rs, dc = threadIdx.x % CH * 8, hoff = kh * HD + dc;
	const long last = (long)bt[(k1 - 1) >> lb] * bsr + ((k1 - 1) & (bs - 1)) * rs + hoff;
	auto copy = [&](int st, int kt, int when) {
		if (kt >= k1) return;
		u16 *dK = dsm + st * 2 * BK * KP + r * KP + dc, *dV = dK + BK * KP;
#pragma unroll
		for (int c = 0; c < CPT; c++) {
			int key = kt + r + c * JS;
			if ((when == early && min(key, k1 - 1) >= cached) || (when == fixup && min(key, k1 - 1) < cached)) continue;
			long off = key < k1 ? (long)bt[key >> lb] * bsr + ((key & (bs - 1)) * rs + hoff) : last;
#pragma unroll
			for (int h = 0; h < 2; h++) {
				int e = c * JS * KP + h * HD / 2;
				if (when == fixup) {
					*(uint4 *)(dK + e) = *(const uint4 *)(kc + off + h * HD / 2);
					*(uint4 *)(dV + e) = *(const uint4 *)(vc + off + h * HD / 2);
				} else {
					cp_async16(smem_addr(dK + e), kc + off + h * HD / 2);
					cp_async16(smem_addr(dV + e), vc + off + h * HD / 2);
				}
			}
		}
	};
	auto stage = [&](int st, int kt, int when) {
		copy(st, kt, when);
		asm volatile("cp.async.commit_group;");
	};
	// The first ST - 1 tiles, then a tile a step of the loop into the buffer
	// the step before freed.
#pragma unroll
	for (int s = 0; s < ST - 1; s++) stage(s, k0 + s * BK, early);
	// Fused: the last stage, idle until the loop, holds the rope table, the
	// norms' weights, a head a warp as it is normed and the normed queries.
	static_assert(ST >= 2 && (128 + (2 + W + 8) * HD) * 4 <= 2 * BK * KP * 2, "the fused prologue's scratch");
	float *cs = (float *)(dsm + (ST - 1) * 2 * BK * KP), *sn = cs + 64, *wq = sn + 64, *wk = wq + HD, *hb = wk + HD + warp * HD;
	u16 *sq = (u16 *)(wk + HD + W * HD);
	if constexpr (FUSED) {
		rope_table(cs, sn, n - 1, f.rd / 2, f.attnFactor, rf);
		float u = f.unitOffset ? 1.f : 0.f;
		for (int i = threadIdx.x; i < HD; i += blockDim.x) {
			wq[i] = ld(f.qn, i, f.wdt) + u;
			wk[i] = ld(f.kn, i, f.wdt) + u;
		}
	}
	pdl_wait();
	pdl_trigger();  // the next kernel may launch and wait for this grid
	if constexpr (FUSED) {
		__syncthreads();
		int qstride = f.gated ? 2 * HD : HD;
		long row = (long)t * ((long)H * qstride + 2L * KH * HD), kv = row + (long)H * qstride + kh * HD;
		long off = (((long)bt[(n - 1) / bs] * bs + (n - 1) % bs) * KH + kh) * HD;
		// A warp a query head, then the key and the value.
		for (int j = warp; j < G + 2; j += W) {
			if (j < G) {
				head_norm_rope(f.qkv, row + (long)(kh * G + j) * qstride, f.qdt, wq, f.eps, cs, sn, HD, f.rd, hb,
					[&](int i, float4 v) { st4(sq, j * HD + i, DT_BF16, v); });
			} else if (j == G) {
				head_norm_rope(f.qkv, kv, f.qdt, wk, f.eps, cs, sn, HD, f.rd, hb,
					[&](int i, float4 v) { st4((u16 *)kc, off + i, DT_BF16, v); });
			} else {
				for (int i = 4 * lane; i < HD; i += 128) st4((u16 *)vc, off + i, DT_BF16, ld4(f.qkv, kv + (long)KH * HD + i, f.qdt));
			}
		}
		__syncthreads();
	}
	// This step's keys in the first ST - 1 tiles, now that qk_norm_rope (or
	// this block) has stored them (plain loads: the barrier before their use
	// publishes them).
#pragma unroll
	for (int s = 0; s < ST - 1; s++) copy(s, k0 + s * BK, fixup);

	// The products run with the keys as the mma's rows and the heads as
	// its 8 columns (NG tiles of 8: G <= 8 NG): S^T = K Q^T, then O^T = V^T
	// P^T, so that a warp's 16 keys take one row tile, not a 16-row tile
	// of G heads, and its accumulators hold HD x 8 NG values (HD x 16
	// with the heads as rows: half the mmas and registers at G = 4). That
	// gained only 0.7% at batch 64 (H200): the copies' issue and addresses,
	// not the mmas, are what the warps wait on (NOTES.md, 2026-11-29).
	// Query fragments (B operands: dims x heads, pre-scaled into log2
	// units), kept in registers for all tiles: lane l holds head l / 4 of
	// each n-tile, dims (l % 4) * 2 and + 1 (and + 8).
	float qs = scale * LOG2E;
	unsigned qb[KS][NG][2];
#pragma unroll
	for (int ng = 0; ng < NG; ng++) {
		int g = ng * 8 + quad;
		const u16 *q0 = (FUSED ? sq : qbuf + ((long)t * H + kh * G) * HD) + min(g, G - 1) * HD;
#pragma unroll
		for (int k = 0; k < KS; k++) {
			int d = k * 16 + qc;
			qb[k][ng][0] = g < G ? pack_bf16(bf2f(q0[d]) * qs, bf2f(q0[d + 1]) * qs) : 0u;
			qb[k][ng][1] = g < G ? pack_bf16(bf2f(q0[d + 8]) * qs, bf2f(q0[d + 9]) * qs) : 0u;
		}
	}
	if constexpr (FUSED) __syncthreads();  // the loop's first stage overwrites sq
	// o[m][ng]: dims 16 m + l / 4 (and + 8) of heads 8 ng + (l % 4) * 2
	// and + 1; the lane's running maxima and (partial) sums of those heads.
	float o[KS][NG][4], mx[NG][2], ls[NG][2];
#pragma unroll
	for (int m = 0; m < KS; m++)
#pragma unroll
		for (int ng = 0; ng < NG; ng++) o[m][ng][0] = o[m][ng][1] = o[m][ng][2] = o[m][ng][3] = 0.f;
#pragma unroll
	for (int ng = 0; ng < NG; ng++) mx[ng][0] = mx[ng][1] = -INF, ls[ng][0] = ls[ng][1] = 0.f;

	int it = 0;
	for (int kt = k0; kt < k1; kt += BK, it++) {
		stage((it + ST - 1) % ST, kt + (ST - 1) * BK, all);
		asm volatile("cp.async.wait_group %0;" ::"n"(ST - 1));
		__syncthreads();
		int kw = kt + warp * 16;  // this warp's 16 keys
		if (kw < k1) {
			const u16 *sK = dsm + (it % ST) * 2 * BK * KP + warp * 16 * KP, *sV = sK + BK * KP;
			// Scores: lane l holds keys l / 4 and l / 4 + 8 of heads (l %
			// 4) * 2 and + 1 of each n-tile; even and odd k-steps in two
			// chains, added after.
			float sc[NG][4], s2[NG][4];
#pragma unroll
			for (int ng = 0; ng < NG; ng++) sc[ng][0] = sc[ng][1] = sc[ng][2] = sc[ng][3] = s2[ng][0] = s2[ng][1] = s2[ng][2] = s2[ng][3] = 0.f;
#pragma unroll
			for (int k = 0; k < KS; k++) {
				unsigned a0, a1, a2, a3;
				ldmatrix_x4(smem_addr(sK + ((mi & 1) * 8 + mr) * KP + k * 16 + (mi >> 1) * 8), a0, a1, a2, a3);
#pragma unroll
				for (int ng = 0; ng < NG; ng++) mma_bf16(k & 1 ? s2[ng] : sc[ng], a0, a1, a2, a3, qb[k][ng][0], qb[k][ng][1]);
			}
			bool lo = kw + quad < k1, hi = kw + quad + 8 < k1;
			unsigned pb[NG][2];
			float cf[NG][2];
#pragma unroll
			for (int ng = 0; ng < NG; ng++) {
#pragma unroll
				for (int e = 0; e < 4; e++) sc[ng][e] += s2[ng][e];
				if (!lo) sc[ng][0] = sc[ng][1] = -INF;
				if (!hi) sc[ng][2] = sc[ng][3] = -INF;
				// Each head's maximum over the warp's keys: down the rows
				// (the lanes of one l % 4). The first key of the warp's
				// range is always valid, so the new maxima are finite.
#pragma unroll
				for (int h = 0; h < 2; h++) {
					float v = fmaxf(sc[ng][h], sc[ng][h + 2]);
					v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
					v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
					v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
					float mn = fmaxf(mx[ng][h], v);
					cf[ng][h] = exp2f(mx[ng][h] - mn);
					mx[ng][h] = mn;
				}
				float p0 = exp2f(sc[ng][0] - mx[ng][0]), p1 = exp2f(sc[ng][1] - mx[ng][1]);
				float p2 = exp2f(sc[ng][2] - mx[ng][0]), p3 = exp2f(sc[ng][3] - mx[ng][1]);
				ls[ng][0] = ls[ng][0] * cf[ng][0] + p0 + p2;
				ls[ng][1] = ls[ng][1] * cf[ng][1] + p1 + p3;
				// P^T as the B operand (keys x heads): the C fragment's
				// 8 x 8 halves transposed across the warp.
				pb[ng][0] = movmatrix_trans(pack_bf16(p0, p1));
				pb[ng][1] = movmatrix_trans(pack_bf16(p2, p3));
			}
			// Once the maxima settle the factors are 1 (exp2f(0)): the
			// warp then skips the accumulators' multiplications.
			bool same = true;
#pragma unroll
			for (int ng = 0; ng < NG; ng++) same = same && cf[ng][0] == 1.f && cf[ng][1] == 1.f;
			if (!__all_sync(0xffffffffu, same)) {
#pragma unroll
				for (int m = 0; m < KS; m++)
#pragma unroll
					for (int ng = 0; ng < NG; ng++)
						o[m][ng][0] *= cf[ng][0], o[m][ng][1] *= cf[ng][1], o[m][ng][2] *= cf[ng][0], o[m][ng][3] *= cf[ng][1];
			}
			// O^T += V^T P^T: V^T's A fragments by transposing loads of
			// the 16 keys' rows, 16 dims a row tile.
#pragma unroll
			for (int m = 0; m < KS; m++) {
				unsigned a0, a1, a2, a3;
				ldmatrix_x4_trans(smem_addr(sV + ((mi >> 1) * 8 + mr) * KP + m * 16 + (mi & 1) * 8), a0, a1, a2, a3);
#pragma unroll
				for (int ng = 0; ng < NG; ng++) mma_bf16(o[m][ng], a0, a1, a2, a3, pb[ng][0], pb[ng][1]);
			}
		}
		__syncthreads();  // the next stage overwrites this buffer
	}
	asm volatile("cp.async.wait_group 0;");

	// Each head's sum over the warp's keys (down the rows); then the warps
	// merge as in attn_decode, their partial outputs in the stages' memory.
	float (*sm_acc)[16][HD] = (float (*)[16][HD])dsm;
#pragma unroll
	for (int ng = 0; ng < NG; ng++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			float v = ls[ng][h];
			v += __shfl_xor_sync(0xffffffffu, v, 4);
			v += __shfl_xor_sync(0xffffffffu, v, 8);
			v += __shfl_xor_sync(0xffffffffu, v, 16);
			int g = ng * 8 + qc + h;
			if (g < G) {
#pragma unroll
				for (int m = 0; m < KS; m++) {
					sm_acc[warp][g][m * 16 + quad] = o[m][ng][h];
					sm_acc[warp][g][m * 16 + quad + 8] = o[m][ng][h + 2];
				}
				if (quad == 0) {
					sm_m[warp][g] = mx[ng][h];
					sm_l[warp][g] = v;
				}
			}
		}
	__syncthreads();
	if constexpr (FUSED) {
		sp.merge<W, 16, HD>(sm_acc, sm_m, sm_l, G, [&](int g, int d, float M, float L, float A) {
			attn_store(f.out, f.odt, f.qkv, f.qdt, f.gated, t, kh * G + g, H, KH, HD, d, A / L);
		});
		return;
	}
	sp.partial<W, 16, HD>(sm_acc, sm_m, sm_l, pm, pl, pacc, H, G);
}

// Three stages where a block may take 102 KB at head dim 128 (backend:
// decodeStages), two on GPUs of 99 KB a block (sm_86, sm_89); NG tiles of
// 8 query heads (G <= 8 NG).
#define DECODE_MMA(HD, ST, NG) \
	extern "C" __global__ void __launch_bounds__(128) attn_decode_mma_##HD##_##ST##_##NG(const u16 *qbuf, const u16 *kc, \
			const u16 *vc, const int *tokpos, const int *tokseq, const int *seqpos, const int *seqblk, const int *blocks, \
			float *pm, float *pl, float *pacc, int H, int KH, int bs, float scale) { \
		attn_decode_mma<HD, ST, NG, false>(qbuf, kc, vc, tokpos, tokseq, seqpos, seqblk, blocks, pm, pl, pacc, H, KH, bs, scale, \
			DecodeFuse{}, RopeFreq{}); \
	} \
	extern "C" __global__ void __launch_bounds__(128) attn_decode_fused_##HD##_##ST##_##NG(const u16 *kc, const u16 *vc, \
			const int *tokpos, const int *tokseq, const int *seqpos, const int *seqblk, const int *blocks, \
			int H, int KH, int bs, float scale, DecodeFuse f, RopeFreq rf) { \
		attn_decode_mma<HD, ST, NG, true>(nullptr, kc, vc, tokpos, tokseq, seqpos, seqblk, blocks, nullptr, nullptr, nullptr, H, KH, \
			bs, scale, f, rf); \
	}
DECODE_MMA(64, 3, 1)
DECODE_MMA(64, 3, 2)
DECODE_MMA(128, 3, 1)
DECODE_MMA(128, 3, 2)
DECODE_MMA(128, 2, 1)
DECODE_MMA(128, 2, 2)
