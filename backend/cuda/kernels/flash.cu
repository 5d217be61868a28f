// Tensor-core prefill attention (FlashAttention-2 style) for bf16 caches:
// mma.sync m16n8k16 bf16 with f32 accumulation. A block is 4 warps and 64
// queries of one sequence and head; each warp owns 16 queries. Key and
// value tiles of 64 tokens are staged in shared memory by cp.async, two
// stages deep so the next tile loads while this one is used; the scores stay
// in registers, the probabilities are fed back to the second product
// straight from the accumulator layout, and V's fragments come from
// transposing ldmatrix loads.

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
	unsigned r;
	asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
	return r;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
		: "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		: "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4_trans(const u16 *p, unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3) {
	unsigned a;
	asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
		: "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}

__device__ __forceinline__ unsigned smem_addr(const void *p) {
	unsigned a;
	asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
	return a;
}

__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(dst)), "l"(src));
}

template <int HD>
__device__ __forceinline__ void flash_prefill(float *out, const float *qbuf, const u16 *kc, const u16 *vc, const float *qkv,
		const int *seqpos, const int *seqn, const int *seqstart, const int *seqblk, const int *blocks,
		int H, int KH, int bs, float scale, int gated) {
	constexpr int BQ = 64, BK = 64, KS = HD / 16, NT = HD / 8, KP = HD + 8;
	// Dynamic shared memory: 2 stages x (K + V) x 64 rows of HD + 8 bf16.
	extern __shared__ __align__(16) u16 fsm[];  // two stages of [K tile | V tile]
	int s = blockIdx.z, h = blockIdx.y, qi0 = blockIdx.x * BQ;
	int nN = seqn[s];
	if (qi0 >= nN) return;
	int kh = h / (H / KH);
	int p0 = seqpos[s], start = seqstart[s];
	const int *bt = blocks + seqblk[s];
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, quad = lane >> 2, qc = (lane & 3) * 2;

	// Query fragments (pre-scaled into log2 units), rows r0 and r0+8 of the warp's 16.
	int r0 = qi0 + warp * 16 + quad, r1 = r0 + 8;
	float qs = scale * LOG2E;
	unsigned qa[KS][4];
	{
		const float *q0 = qbuf + ((long)(start + min(r0, nN - 1)) * H + h) * HD;
		const float *q1 = qbuf + ((long)(start + min(r1, nN - 1)) * H + h) * HD;
#pragma unroll
		for (int k = 0; k < KS; k++) {
			int c = k * 16 + qc;
			qa[k][0] = pack_bf16(q0[c] * qs, q0[c + 1] * qs);
			qa[k][1] = pack_bf16(q1[c] * qs, q1[c + 1] * qs);
			qa[k][2] = pack_bf16(q0[c + 8] * qs, q0[c + 9] * qs);
			qa[k][3] = pack_bf16(q1[c + 8] * qs, q1[c + 9] * qs);
		}
	}
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
			for (int n = 0; n < BK / 8; n++) {
				sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
				const u16 *kr = sK + (n * 8 + quad) * KP + qc;
#pragma unroll
				for (int k = 0; k < KS; k++) {
					unsigned b0 = *(const unsigned *)(kr + k * 16), b1 = *(const unsigned *)(kr + k * 16 + 8);
					mma_bf16(sc[n], qa[k][0], qa[k][1], qa[k][2], qa[k][3], b0, b1);
				}
			}
			float mx0 = -INF, mx1 = -INF;
#pragma unroll
			for (int n = 0; n < BK / 8; n++) {
				int key = kt + n * 8 + qc;
				if (key > pos0 || key >= kend) sc[n][0] = -INF;
				if (key + 1 > pos0 || key + 1 >= kend) sc[n][1] = -INF;
				if (key > pos1 || key >= kend) sc[n][2] = -INF;
				if (key + 1 > pos1 || key + 1 >= kend) sc[n][3] = -INF;
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
			int mi = lane >> 3, mr = lane & 7;
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
	extern "C" __global__ void __launch_bounds__(128) flash_prefill_##HD(float *out, const float *qbuf, const u16 *kc, const u16 *vc, \
			const float *qkv, const int *seqpos, const int *seqn, const int *seqstart, const int *seqblk, const int *blocks, \
			int H, int KH, int bs, float scale, int gated) { \
		flash_prefill<HD>(out, qbuf, kc, vc, qkv, seqpos, seqn, seqstart, seqblk, blocks, H, KH, bs, scale, gated); \
	}
FLASH(64)
FLASH(128)
