// Tensor-core prefill attention (FlashAttention-2 style) for bf16 caches:
// mma.sync m16n8k16 bf16 with f32 accumulation. A block is 8 warps and 128
// queries of one sequence and head (fewer would re-read each key and value
// tile from L2 too often); each warp owns 16 queries. Key and
// value tiles of 64 tokens are staged in shared memory by cp.async, two
// stages deep so the next tile loads while this one is used; the scores stay
// in registers, the probabilities are fed back to the second product
// straight from the accumulator layout, and V's fragments come from
// transposing ldmatrix loads.

template <int HD>
__device__ __forceinline__ void flash_prefill(float *out, const float *qbuf, const u16 *kc, const u16 *vc, const float *qkv,
		const int *seqpos, const int *seqn, const int *seqstart, const int *seqblk, const int *blocks,
		int H, int KH, int bs, float scale, int gated) {
	constexpr int NW = 8, BQ = 16 * NW, BK = 64, KS = HD / 16, NT = HD / 8, KP = HD + 8;
	// Dynamic shared memory: 2 stages x (K + V) x 64 rows of HD + 8 bf16,
	// then the query tile, BQ rows of HD + 8 bf16.
	extern __shared__ __align__(16) u16 fsm[];
	// Heads vary fastest and query tiles run last to first, so the longest
	// (latest) tiles of every head start first and the short ones fill the tail.
	int s = blockIdx.z, h = blockIdx.x, qi0 = (gridDim.y - 1 - blockIdx.y) * BQ;
	int nN = seqn[s];
	if (qi0 >= nN) return;
	int kh = h / (H / KH);
	int p0 = seqpos[s], start = seqstart[s];
	const int *bt = blocks + seqblk[s];
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, quad = lane >> 2, qc = (lane & 3) * 2;
	int mi = lane >> 3, mr = lane & 7;

	// The query tile (pre-scaled into log2 units) goes to shared memory as
	// bf16; warps read their A fragments from it by ldmatrix where used,
	// which keeps registers under 128 so that two blocks fit a multiprocessor.
	int r0 = qi0 + warp * 16 + quad, r1 = r0 + 8;
	float qs = scale * LOG2E;
	u16 *sQ = fsm + 2 * 2 * BK * KP;
	for (int idx = threadIdx.x; idx < BQ * HD / 4; idx += blockDim.x) {
		int r = idx / (HD / 4), d = (idx % (HD / 4)) * 4;
		float4 v = *(const float4 *)(qbuf + ((long)(start + min(qi0 + r, nN - 1)) * H + h) * HD + d);
		uint2 u;
		u.x = pack_bf16(v.x * qs, v.y * qs);
		u.y = pack_bf16(v.z * qs, v.w * qs);
		*(uint2 *)(sQ + r * KP + d) = u;
	}
	// Lane l's ldmatrix row of the warp's query tile: matrices are (rows
	// +0/+8) x (dims +0/+8) in the order of an A fragment.
	const u16 *qrow = sQ + (warp * 16 + mr + (mi & 1) * 8) * KP + (mi >> 1) * 8;
	float o[NT][4];
#pragma unroll
	for (int n = 0; n < NT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
	float m0 = -INF, m1 = -INF, l0 = 0.f, l1 = 0.f;
	int pos0 = p0 + r0, pos1 = p0 + r1;  // positions of the two rows (keys <= pos are visible)
	int kend = p0 + min(nN, qi0 + BQ);
	// stage copies tile kt into buffer st with cp.async (keys past the end
	// repeat the last key: finite values that the mask zeroes).
	auto stage = [&](int st, int kt) {
		u16 *dK = fsm + st * 2 * BK * KP, *dV = dK + BK * KP;
		for (int idx = threadIdx.x; idx < BK * HD / 8; idx += blockDim.x) {
			int j = idx % BK, d = (idx / BK) * 8, key = min(kt + j, kend - 1);
			long off = (((long)bt[key / bs] * bs + key % bs) * KH + kh) * HD + d;
			cp_async16(dK + j * KP + d, kc + off);
			cp_async16(dV + j * KP + d, vc + off);
		}
		asm volatile("cp.async.commit_group;");
	};
	stage(0, 0);
	int it = 0;
	for (int kt = 0; kt < kend; kt += BK, it++) {
		if (kt + BK < kend) {
			stage((it + 1) & 1, kt + BK);
			asm volatile("cp.async.wait_group 1;");
		} else {
			asm volatile("cp.async.wait_group 0;");
		}
		__syncthreads();
		const u16 *sK = fsm + (it & 1) * 2 * BK * KP, *sV = sK + BK * KP;
		// Tiles entirely above the diagonal for this warp are skipped.
		if (kt <= p0 + min(qi0 + warp * 16 + 15, nN - 1)) {
			float sc[BK / 8][4];
#pragma unroll
			for (int n = 0; n < BK / 8; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
			// K fragments by ldmatrix: lane l addresses key row l%8 of the
			// n-tile, dims +8*(l/8) of a pair of k steps.
#pragma unroll
			for (int k = 0; k < KS; k += 2) {
				unsigned a[2][4];
				ldmatrix_x4(qrow + k * 16, a[0][0], a[0][1], a[0][2], a[0][3]);
				ldmatrix_x4(qrow + (k + 1) * 16, a[1][0], a[1][1], a[1][2], a[1][3]);
#pragma unroll
				for (int n = 0; n < BK / 8; n++) {
					unsigned b0, b1, b2, b3;
					ldmatrix_x4(sK + (n * 8 + mr) * KP + mi * 8 + k * 16, b0, b1, b2, b3);
					mma_bf16(sc[n], a[0][0], a[0][1], a[0][2], a[0][3], b0, b1);
					mma_bf16(sc[n], a[1][0], a[1][1], a[1][2], a[1][3], b2, b3);
				}
			}
			float mx0 = -INF, mx1 = -INF;
			// Only tiles crossing the diagonal or the end of the keys are masked.
			if (kt + BK - 1 > p0 + qi0 + warp * 16 || kt + BK > kend) {
#pragma unroll
				for (int n = 0; n < BK / 8; n++) {
					int key = kt + n * 8 + qc;
					if (key > pos0 || key >= kend) sc[n][0] = -INF;
					if (key + 1 > pos0 || key + 1 >= kend) sc[n][1] = -INF;
					if (key > pos1 || key >= kend) sc[n][2] = -INF;
					if (key + 1 > pos1 || key + 1 >= kend) sc[n][3] = -INF;
				}
			}
#pragma unroll
			for (int n = 0; n < BK / 8; n++) {
				mx0 = fmaxf(mx0, fmaxf(sc[n][0], sc[n][1]));
				mx1 = fmaxf(mx1, fmaxf(sc[n][2], sc[n][3]));
			}
			mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
			mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
			mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
			mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
			float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
			// Rows with nothing visible yet keep a zero state (and avoid inf - inf).
			float c0 = mn0 == -INF ? 1.f : exp2f(m0 - mn0), c1 = mn1 == -INF ? 1.f : exp2f(m1 - mn1);
			float b0 = mn0 == -INF ? 0.f : mn0, b1 = mn1 == -INF ? 0.f : mn1;
			float ps0 = 0.f, ps1 = 0.f;
			unsigned pa[BK / 16][4];
#pragma unroll
			for (int n = 0; n < BK / 8; n++) {
				float p00 = exp2f(sc[n][0] - b0), p01 = exp2f(sc[n][1] - b0);
				float p10 = exp2f(sc[n][2] - b1), p11 = exp2f(sc[n][3] - b1);
				ps0 += p00 + p01;
				ps1 += p10 + p11;
				int k = n >> 1;
				if ((n & 1) == 0) { pa[k][0] = pack_bf16(p00, p01); pa[k][1] = pack_bf16(p10, p11); }
				else { pa[k][2] = pack_bf16(p00, p01); pa[k][3] = pack_bf16(p10, p11); }
			}
			l0 = l0 * c0 + ps0;
			l1 = l1 * c1 + ps1;
			m0 = mn0;
			m1 = mn1;
#pragma unroll
			for (int n = 0; n < NT; n++) { o[n][0] *= c0; o[n][1] *= c0; o[n][2] *= c1; o[n][3] *= c1; }
			// V fragments by transposing loads: lane l addresses row l%8 of matrix
			// l/8 = (keys +0/+8) x (dims of n-tile n / n+1).
#pragma unroll
			for (int k = 0; k < BK / 16; k++) {
#pragma unroll
				for (int n = 0; n < NT; n += 2) {
					unsigned v0, v1, v2, v3;
					ldmatrix_x4_trans(sV + (k * 16 + (mi & 1) * 8 + mr) * KP + (n + (mi >> 1)) * 8, v0, v1, v2, v3);
					mma_bf16(o[n], pa[k][0], pa[k][1], pa[k][2], pa[k][3], v0, v1);
					mma_bf16(o[n + 1], pa[k][0], pa[k][1], pa[k][2], pa[k][3], v2, v3);
				}
			}
		}
		__syncthreads();  // the next stage overwrites this buffer
	}
	// Row sums are spread over the quad.
	l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
	l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
	l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
	l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
	long width = (long)H * (gated ? 2 * HD : HD) + 2L * KH * HD;
#pragma unroll
	for (int half = 0; half < 2; half++) {
		int r = half ? r1 : r0;
		if (r >= nN) continue;
		long t = start + r;
		float inv = 1.f / (half ? l1 : l0);
#pragma unroll
		for (int n = 0; n < NT; n++) {
#pragma unroll
			for (int e = 0; e < 2; e++) {
				int d = n * 8 + qc + e;
				float v = o[n][half * 2 + e] * inv;
				if (gated) v *= 1.f / (1.f + __expf(-qkv[t * width + (long)h * 2 * HD + HD + d]));
				out[(t * H + h) * HD + d] = v;
			}
		}
	}
}

#define FLASH(HD) \
	extern "C" __global__ void __launch_bounds__(256, 2) flash_prefill_##HD(float *out, const float *qbuf, const u16 *kc, \
			const u16 *vc, const float *qkv, const int *seqpos, const int *seqn, const int *seqstart, const int *seqblk, \
			const int *blocks, int H, int KH, int bs, float scale, int gated) { \
		flash_prefill<HD>(out, qbuf, kc, vc, qkv, seqpos, seqn, seqstart, seqblk, blocks, H, KH, bs, scale, gated); \
	}
FLASH(64)
FLASH(128)
