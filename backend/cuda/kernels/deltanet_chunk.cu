// Chunked Gated DeltaNet for prompts (the WY form of qwen-family.md,
// "Chunked Gated DeltaNet"), on tensor cores. After dn_conv, a sequence
// advancing by at least chunkMin tokens goes through these two kernels
// instead of dn_recur, in chunks of DN_C tokens (the last one partial):
//
//   dn_chunk_prep, a block per (chunk, value head, sequence), every chunk at
//   once: the q/k L2 norms, beta and the gate (fused here: no pass of their
//   own), G = the gates' cumulative sum within the chunk,
//   A = beta_i (k_i.k_j) exp(G_i - G_j) for j < i, T = (I + A)^-1,
//   W = T diag(beta exp(G)) K, U = T diag(beta) V,
//   P = (q_i.k_j) exp(G_i - G_j) for j <= i, and the rows q_i exp(G_i),
//   k_i exp(G_L - G_i) that the state multiplies.
//   dn_chunk_run, a block per (slice of DVS value columns, value head,
//   sequence), over the sequence's chunks in order with its slice of the
//   state S in registers: Vn = U - W S, O = (Q exp(G)) S + P Vn,
//   S = exp(G_L) S + (K exp(G_L - G))^T Vn.
//
// Every product is mma.sync bf16 with f32 accumulation, each operand
// entering as two bf16 parts (x = hi + lo) in three products (hi.hi, hi.lo,
// lo.hi; ~16 bits kept). A float64 emulation at Qwen3-Next's head shape (500
// tokens after a warm state, fast and slow gates) put bf16 operands at ~3e-3
// relative error of the outputs and the state (v, Vn and S lose their low
// bits in every product) and the split form at ~6e-6. T comes from f32
// arithmetic on CUDA cores.
//
// The scratch written by dn_chunk_prep, per (token, value head), only for
// tokens of chunked sequences: qg, kd, wg [2][DK] bf16 (hi, then lo) of
// q exp(G), k exp(G_L - G) and W; pg [2][DN_C] bf16 of P's row; ug [DV] f32
// of U's row; gg the token's G (f32). A chunk is DN_C tokens (defines.cuh).

// split2 returns (a, b) as bf16 pairs with (a, b) ~ hi + lo.
__device__ __forceinline__ void split2(float a, float b, unsigned &hi, unsigned &lo) {
	hi = pack_bf16(a, b);
	lo = pack_bf16(a - __uint_as_float(hi << 16), b - __uint_as_float(hi & 0xffff0000u));
}

// mma3 accumulates (ah + al)(bh + bl) less the al.bl term.
__device__ __forceinline__ void mma3(float (&c)[4], const unsigned (&ah)[4], const unsigned (&al)[4], unsigned bh0, unsigned bh1,
		unsigned bl0, unsigned bl1) {
	mma_bf16(c, ah[0], ah[1], ah[2], ah[3], bh0, bh1);
	mma_bf16(c, ah[0], ah[1], ah[2], ah[3], bl0, bl1);
	mma_bf16(c, al[0], al[1], al[2], al[3], bh0, bh1);
}

__device__ __forceinline__ void ldsm(unsigned a, unsigned (&r)[4]) { ldmatrix_x4(a, r[0], r[1], r[2], r[3]); }
__device__ __forceinline__ void ldsm_t(unsigned a, unsigned (&r)[4]) { ldmatrix_x4_trans(a, r[0], r[1], r[2], r[3]); }

// Fragment addressing (byte offsets from a tile's 32-bit shared address;
// lane l addresses row l % 8 of the x4 load's matrix l / 8). In every tile
// below, the lo part of a bf16 matrix of R rows lies R rows after its hi part.
//
// a_frag: the A fragment of rows m0.. and columns k0.. of a row-major tile.
__device__ __forceinline__ int a_frag(int m0, int k0, int stride) {
	int l = threadIdx.x & 31;
	return 2 * ((m0 + ((l >> 3) & 1) * 8 + (l & 7)) * stride + k0 + (l >> 4) * 8);
}
// a_frag_t: the A fragment of A = X^T for a row-major X (rows k0.., columns m0..).
__device__ __forceinline__ int a_frag_t(int m0, int k0, int stride) {
	int l = threadIdx.x & 31;
	return 2 * ((k0 + (l >> 4) * 8 + (l & 7)) * stride + m0 + ((l >> 3) & 1) * 8);
}
// b_frag_t: B fragments of n-tiles n0 / n0 + 8 at rows k0.. of a row-major
// B [k][n] (ldmatrix .trans): b0, b1 of the first n-tile, then of the second.
__device__ __forceinline__ int b_frag_t(int k0, int n0, int stride) {
	int l = threadIdx.x & 31;
	return 2 * ((k0 + ((l >> 3) & 1) * 8 + (l & 7)) * stride + n0 + (l >> 4) * 8);
}
// b_frag: the same for B = X^T, X row-major [n][k] (plain ldmatrix).
__device__ __forceinline__ int b_frag(int k0, int n0, int stride) {
	int l = threadIdx.x & 31;
	return 2 * ((n0 + (l >> 4) * 8 + (l & 7)) * stride + k0 + ((l >> 3) & 1) * 8);
}

// dn_chunk_prep: grid (ceil(max new tokens / DN_C), HV, S), 256 threads
// (two blocks a multiprocessor by its shared memory: four warps a block
// left the schedulers without a ready warp 75% of the time, ncu, H200),
// dynamic shared memory dn_prep_smem(DK, DV) bytes (Go: dnPrepSmem), laid
// out as: K [2][DN_C][DK+8] bf16; Q [2][DN_C][DK+8] bf16, then V
// [2][DN_C][DV+8] bf16 in the same place; A [DN_C][68] f32, then T diag(beta)
// and T diag(beta exp(G)) [2][DN_C][72] bf16 in turn in the same place;
// T [DN_C][68] f32; the solve's blocks [3][16][16] f32; G, beta [DN_C] f32.
// Rows past the chunk's end are zero (beta and g too): A and T are then the
// identity there and nothing of them reaches valid rows.
template <int DK>
__device__ __forceinline__ void dn_chunk_prep(const float *qkv, const float *ba, const void *aLog, int adt, const void *dtBias,
		int bdt, u16 *qg, u16 *kd, u16 *wg, u16 *pg, float *ug, float *gg, int HK, int HV, int DV, int chunkMin, int tiled,
		const int *seqn, const int *seqstart) {
	constexpr int KP = DK + 8, AP = 68, TP = 72, E = (DK + 31) / 32, NW = 8;  // NW warps
	extern __shared__ __align__(16) unsigned char dsm[];
	int s = blockIdx.z, h = blockIdx.y, c0 = blockIdx.x * DN_C, n = seqn[s];
	if (n < chunkMin || c0 >= n) return;
	int L = min(DN_C, n - c0), VP = DV + 8;
	long t0 = seqstart[s] + c0;
	int kh = tiled ? h % HK : h / (HV / HK), CD = 2 * HK * DK + HV * DV;
	int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, quad = lane >> 2, qc = (lane & 3) * 2;
	int rw = warp & 3, par = warp >> 2;  // K K^T and Q K^T: the warp's rows, and which key blocks
	u16 *sK = (u16 *)dsm, *sQV = sK + 2 * DN_C * KP;
	static_assert(2 * DN_C * TP * 2 >= DN_C * AP * 4, "the scaled T's take A's place");
	float *sA = (float *)(sQV + 2 * DN_C * max(KP, VP));
	u16 *sT12 = (u16 *)sA;
	float *sT = (float *)(sT12 + 2 * DN_C * TP), *sX = sT + DN_C * AP, *sG = sX + 3 * 256, *sBeta = sG + DN_C;

	// beta and g of the chunk's tokens, G by a scan in each of two warps.
	if (tid < DN_C) {
		float g = 0.f, beta = 0.f;
		if (tid < L) {
			long t = t0 + tid;
			beta = 1.f / (1.f + __expf(-ba[t * 2 * HV + h]));
			float x = ba[t * 2 * HV + HV + h] + ld(dtBias, h, bdt);
			g = -__expf(ld(aLog, h, adt)) * (x > 20.f ? x : log1pf(__expf(x)));
		}
#pragma unroll
		for (int o = 1; o < 32; o <<= 1) {
			float u = __shfl_up_sync(0xffffffffu, g, o);
			if (lane >= o) g += u;
		}
		sG[tid] = g;
		sBeta[tid] = beta;
	}
	__syncthreads();
	if (tid >= 32 && tid < DN_C) sG[tid] += sG[31];
	__syncthreads();
	if (tid < L) gg[(t0 + tid) * HV + h] = sG[tid];

	// Normalised q (scaled by 1/sqrt(DK)) and k, a warp per row: to shared
	// memory as they are, to the scratch as q exp(G_i) and k exp(G_L - G_i).
	float gl = sG[L - 1];
	for (int r = warp; r < DN_C; r += NW) {
#pragma unroll
		for (int isk = 0; isk < 2; isk++) {
			float x[E], ss = 0.f;
#pragma unroll
			for (int e = 0; e < E; e++) {
				int d = lane + 32 * e;
				x[e] = r < L && d < DK ? qkv[(t0 + r) * CD + (isk * HK + kh) * DK + d] : 0.f;
				ss += x[e] * x[e];
			}
			ss = warp_sum(ss);
			float sc = rsqrtf(ss + 1e-6f) * (isk ? 1.f : rsqrtf((float)DK));
			float ex = __expf(isk ? gl - sG[r] : sG[r]);
			u16 *sm = (isk ? sK : sQV) + r * KP;
			u16 *gm = (isk ? kd : qg) + ((t0 + r) * HV + h) * 2 * DK;
#pragma unroll
			for (int e = 0; e < E; e++) {
				int d = lane + 32 * e;
				if (d >= DK) continue;
				float v = x[e] * sc;
				u16 hi = f2bf(v);
				sm[d] = hi;
				sm[DN_C * KP + d] = f2bf(v - bf2f(hi));
				if (r < L) {
					float w = v * ex;
					u16 wh = f2bf(w);
					gm[d] = wh;
					gm[DK + d] = f2bf(w - bf2f(wh));
				}
			}
		}
	}
	__syncthreads();

	// K K^T and Q K^T, warp w taking rows 16 (w % 4).. and, of the key
	// blocks up to its own (both are lower triangular), those of parity w /
	// 4; then A to shared memory and P's rows (zero above the diagonal) to
	// the scratch.
	{
		unsigned aK = smem_addr(sK), aQ = smem_addr(sQV);
		float kk[8][4], qk[8][4];
#pragma unroll
		for (int j = 0; j < 8; j++)
#pragma unroll
			for (int e = 0; e < 4; e++) kk[j][e] = qk[j][e] = 0.f;
#pragma unroll
		for (int ks = 0; ks < DK / 16; ks++) {
			unsigned akh[4], akl[4], aqh[4], aql[4];
			int ao = a_frag(rw * 16, ks * 16, KP);
			ldsm(aK + ao, akh);
			ldsm(aK + ao + 2 * DN_C * KP, akl);
			ldsm(aQ + ao, aqh);
			ldsm(aQ + ao + 2 * DN_C * KP, aql);
#pragma unroll
			for (int jb = 0; jb < 4; jb++) {
				if (jb > rw || (jb & 1) != par) continue;
				unsigned bh[4], bl[4];
				int bo = b_frag(ks * 16, jb * 16, KP);
				ldsm(aK + bo, bh);
				ldsm(aK + bo + 2 * DN_C * KP, bl);
				mma3(kk[2 * jb], akh, akl, bh[0], bh[1], bl[0], bl[1]);
				mma3(kk[2 * jb + 1], akh, akl, bh[2], bh[3], bl[2], bl[3]);
				mma3(qk[2 * jb], aqh, aql, bh[0], bh[1], bl[0], bl[1]);
				mma3(qk[2 * jb + 1], aqh, aql, bh[2], bh[3], bl[2], bl[3]);
			}
		}
#pragma unroll
		for (int hf = 0; hf < 2; hf++) {
			int i = rw * 16 + quad + hf * 8;
			float gi = sG[i], bi = sBeta[i];
			u16 *prow = pg + ((t0 + i) * HV + h) * 2 * DN_C;
#pragma unroll
			for (int nt = 0; nt < 8; nt++) {
				if ((nt >> 1 & 1) != par) continue;
				int j = nt * 8 + qc;
				float p[2] = {0.f, 0.f}, a[2] = {0.f, 0.f};
				if (nt <= 2 * rw + 1) {
#pragma unroll
					for (int e = 0; e < 2; e++) {
						if (j + e > i) continue;
						float ex = __expf(gi - sG[j + e]);  // <= 1: masked pairs never reach the exponential
						p[e] = qk[nt][2 * hf + e] * ex;
						if (j + e < i) a[e] = bi * ex * kk[nt][2 * hf + e];
					}
					*(float2 *)(sA + i * AP + j) = float2{a[0], a[1]};
				}
				if (i < L) {
					unsigned hi, lo;
					split2(p[0], p[1], hi, lo);
					*(unsigned *)(prow + j) = hi;
					*(unsigned *)(prow + DN_C + j) = lo;
				}
			}
		}
	}
	__syncthreads();

	// V (its rows' hi and lo parts) where Q was.
	for (int idx = tid; idx < DN_C * DV / 4; idx += blockDim.x) {
		int r = idx / (DV / 4), c = idx % (DV / 4) * 4;
		float4 v = {0.f, 0.f, 0.f, 0.f};
		if (r < L) v = *(const float4 *)(qkv + (t0 + r) * CD + 2 * HK * DK + h * DV + c);
		unsigned h0, l0, h1, l1;
		split2(v.x, v.y, h0, l0);
		split2(v.z, v.w, h1, l1);
		*(uint2 *)(sQV + r * VP + c) = uint2{h0, h1};
		*(uint2 *)(sQV + (DN_C + r) * VP + c) = uint2{l0, l1};
	}

	// T = (I + A)^-1 in blocks of 16 rows: the diagonal blocks by forward
	// substitution (a thread per column), then block (i, j), nearest the
	// diagonal first, as -T_ii sum_{k=j}^{i-1} A_ik T_kj (FLA's solve_tril
	// merges its blocks the same way).
	if (tid < DN_C) {
		int b = tid >> 4, c = tid & 15;
		const float *a = sA + b * 16 * AP + b * 16;
		float x[16];
#pragma unroll
		for (int i = 0; i < 16; i++) {
			float acc = i == c ? 1.f : 0.f;
#pragma unroll
			for (int j = 0; j < i; j++) acc -= a[i * AP + j] * x[j];
			x[i] = acc;
		}
#pragma unroll
		for (int i = 0; i < 16; i++) sT[(b * 16 + i) * AP + b * 16 + c] = x[i];
	}
	__syncthreads();
	for (int d = 1; d < 4; d++) {
		int np = 4 - d;  // blocks (p + d, p)
		for (int o = tid; o < np * 256; o += blockDim.x) {
			int p = o >> 8, r = (o >> 4) & 15, c = o & 15, i = p + d;
			float acc = 0.f;
			for (int m = p * 16; m < i * 16; m++) acc += sA[(i * 16 + r) * AP + m] * sT[m * AP + p * 16 + c];
			sX[o] = acc;
		}
		__syncthreads();
		for (int o = tid; o < np * 256; o += blockDim.x) {
			int p = o >> 8, r = (o >> 4) & 15, c = o & 15, i = p + d;
			float acc = 0.f;
			for (int m = 0; m <= r; m++) acc += sT[(i * 16 + r) * AP + i * 16 + m] * sX[(p << 8) + m * 16 + c];
			sT[(i * 16 + r) * AP + p * 16 + c] = -acc;
		}
		__syncthreads();
	}

	// T diag(f) as hi and lo bf16 where A was (T's blocks above the diagonal
	// were never written: masked, not multiplied).
	auto scaledT = [&](bool withG) {
		for (int idx = tid; idx < DN_C * DN_C / 2; idx += blockDim.x) {
			int i = idx / (DN_C / 2), j = idx % (DN_C / 2) * 2;
			float v[2];
#pragma unroll
			for (int e = 0; e < 2; e++)
				v[e] = j + e <= i ? sT[i * AP + j + e] * sBeta[j + e] * (withG ? __expf(sG[j + e]) : 1.f) : 0.f;
			unsigned hi, lo;
			split2(v[0], v[1], hi, lo);
			*(unsigned *)(sT12 + i * TP + j) = hi;
			*(unsigned *)(sT12 + (DN_C + i) * TP + j) = lo;
		}
	};
	// mulT multiplies that matrix by the DN_C-row matrix at sB (row stride
	// BP) in groups of 16 columns, each warp taking every NW-th group and
	// all rows, and hands the valid rows' results to store(i, col, v0, v1).
	auto mulT = [&](const u16 *sB, int BP, int ncols, auto store) {
		unsigned aT = smem_addr(sT12), aB = smem_addr(sB);
		for (int g = warp; g < ncols / 16; g += NW) {
			float acc[4][2][4];
#pragma unroll
			for (int m = 0; m < 4; m++)
#pragma unroll
				for (int e = 0; e < 4; e++) acc[m][0][e] = acc[m][1][e] = 0.f;
#pragma unroll
			for (int kb = 0; kb < 4; kb++) {
				unsigned bh[4], bl[4];
				int bo = b_frag_t(kb * 16, g * 16, BP);
				ldsm_t(aB + bo, bh);
				ldsm_t(aB + bo + 2 * DN_C * BP, bl);
#pragma unroll
				for (int m = kb; m < 4; m++) {  // T is lower triangular
					unsigned ah[4], al[4];
					int ao = a_frag(m * 16, kb * 16, TP);
					ldsm(aT + ao, ah);
					ldsm(aT + ao + 2 * DN_C * TP, al);
					mma3(acc[m][0], ah, al, bh[0], bh[1], bl[0], bl[1]);
					mma3(acc[m][1], ah, al, bh[2], bh[3], bl[2], bl[3]);
				}
			}
#pragma unroll
			for (int m = 0; m < 4; m++)
#pragma unroll
				for (int nt = 0; nt < 2; nt++)
#pragma unroll
					for (int hf = 0; hf < 2; hf++) {
						int i = m * 16 + quad + hf * 8;
						if (i < L) store(i, g * 16 + nt * 8 + qc, acc[m][nt][2 * hf], acc[m][nt][2 * hf + 1]);
					}
		}
	};
	scaledT(false);
	__syncthreads();
	mulT(sQV, VP, DV, [&](int i, int col, float v0, float v1) {
		*(float2 *)(ug + ((t0 + i) * HV + h) * DV + col) = float2{v0, v1};
	});
	__syncthreads();
	scaledT(true);
	__syncthreads();
	mulT(sK, KP, DK, [&](int i, int col, float v0, float v1) {
		unsigned hi, lo;
		split2(v0, v1, hi, lo);
		u16 *row = wg + ((t0 + i) * HV + h) * 2 * DK;
		*(unsigned *)(row + col) = hi;
		*(unsigned *)(row + DK + col) = lo;
	});
}

// dn_chunk_run: grid (DV / DVS, HV, S), NW warps (4 or 8), dynamic shared
// memory dn_run_smem(DK, DVS) bytes (Go: dnRunSmem): W, then Q exp(G), then
// K exp(G_L - G) [2][DN_C][DK+8] bf16; P [2][DN_C][DN_C+8] bf16; S
// [2][DK][DVS+8] bf16; Vn [2][DN_C][DVS+8] bf16. Warp w owns the chunk's
// rows 16 (w % 4).. of W S, Q S, Vn and O, their columns' NW / 4th part
// w / 4 (sharing each fragment of S between W and Q), and rows of S as
// accumulators (m-tiles w * MTW..). (Four warps a block, one block a
// multiprocessor by its shared memory, left the schedulers without a ready
// warp 69% of the time: ncu, H200.) A chunk's W and Q
// are loaded by cp.async during the previous chunk's output and state update,
// its K and P during its own W S and Q S. Rows past a partial chunk's end
// repeat its last row (finite; their Vn is zeroed, so they add nothing to S,
// and their outputs are not stored).
template <int DK, int DVS, int NW>
__device__ __forceinline__ void dn_chunk_run(float *out, const u16 *qg, const u16 *kd, const u16 *wg, const u16 *pg, const float *ug,
		const float *gg, float *state, int HV, int DV, int recN, int chunkMin, const int *seqpos, const int *seqn,
		const int *seqstart, const int *slots) {
	constexpr int AP = DK + 8, PP = DN_C + 8, SP = DVS + 8, NT = DVS / 8, MS = DK / 16, MTW = (MS + NW - 1) / NW, RC = DK / 8;
	constexpr int NTW = NT * 4 / NW;  // the n-tiles of a warp's rows (pairs: NTW even)
	static_assert(NTW % 2 == 0, "dn_chunk_run: a warp's columns are pairs of n-tiles");
	extern __shared__ __align__(16) unsigned char dsm[];
	int s = blockIdx.z, h = blockIdx.y, v0 = blockIdx.x * DVS, n = seqn[s];
	if (n < chunkMin) return;
	int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, quad = lane >> 2, qc = (lane & 3) * 2;
	int rw = warp & 3, wc = (warp >> 2) * NTW * 8;  // the warp's row block and first column in W S, Q S, Vn and O
	u16 *sW = (u16 *)dsm, *sQ = sW + 2 * DN_C * AP, *sKd = sQ + 2 * DN_C * AP, *sP = sKd + 2 * DN_C * AP;
	u16 *sS = sP + 2 * DN_C * PP, *sV = sS + 2 * DK * SP;
	unsigned aW = smem_addr(sW), aQ = smem_addr(sQ), aKd = smem_addr(sKd), aP = smem_addr(sP), aS = smem_addr(sS), aV = smem_addr(sV);
	long start = seqstart[s];
	int nch = (n + DN_C - 1) / DN_C;
	float *g = state + (long)slots[s] * recN + (long)h * DK * DV + v0;
	bool fresh = seqpos[s] == 0;

	// stage copies chunk c's rows of the two scratch arrays a and b ([2][W]
	// bf16 a token and head, W = DK for both, or DN_C for b when isP) into
	// sa and sb.
	auto stage = [&](int c, const u16 *a, u16 *sa, const u16 *b, u16 *sb, bool isP) {
		long t0 = start + (long)c * DN_C;
		int last = min(DN_C, n - c * DN_C) - 1;
		for (int idx = tid; idx < 2 * DN_C * RC; idx += blockDim.x) {
			int row = idx / RC, col = idx % RC * 8, r = row % DN_C, part = row / DN_C;
			cp_async16(smem_addr(sa + row * AP + col), a + ((t0 + min(r, last)) * HV + h) * 2 * DK + part * DK + col);
		}
		int bw = isP ? DN_C : DK, bp = isP ? PP : AP;
		for (int idx = tid; idx < 2 * DN_C * bw / 8; idx += blockDim.x) {
			int row = idx / (bw / 8), col = idx % (bw / 8) * 8, r = row % DN_C, part = row / DN_C;
			cp_async16(smem_addr(sb + row * bp + col), b + ((t0 + min(r, last)) * HV + h) * 2 * bw + part * bw + col);
		}
		asm volatile("cp.async.commit_group;");
	};

	float S[MTW][NT][4];
#pragma unroll
	for (int i = 0; i < MTW; i++)
#pragma unroll
		for (int nt = 0; nt < NT; nt++)
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				int row = (warp * MTW + i) * 16 + quad + hf * 8;
				float2 v = {0.f, 0.f};
				if (row < DK && !fresh) v = *(const float2 *)(g + (long)row * DV + nt * 8 + qc);
				S[i][nt][2 * hf] = v.x;
				S[i][nt][2 * hf + 1] = v.y;
			}
	// S as hi and lo bf16, the B operand of the next chunk's W S and Q S.
	auto shareS = [&]() {
#pragma unroll
		for (int i = 0; i < MTW; i++) {
			if (warp * MTW + i >= MS) continue;
#pragma unroll
			for (int nt = 0; nt < NT; nt++)
#pragma unroll
				for (int hf = 0; hf < 2; hf++) {
					int row = (warp * MTW + i) * 16 + quad + hf * 8;
					unsigned hi, lo;
					split2(S[i][nt][2 * hf], S[i][nt][2 * hf + 1], hi, lo);
					*(unsigned *)(sS + row * SP + nt * 8 + qc) = hi;
					*(unsigned *)(sS + (DK + row) * SP + nt * 8 + qc) = lo;
				}
		}
	};
	stage(0, wg, sW, qg, sQ, false);
	stage(0, kd, sKd, pg, sP, true);
	shareS();

	for (int c = 0; c < nch; c++) {
		long t0 = start + (long)c * DN_C;
		int L = min(DN_C, n - c * DN_C);
		// U of this warp's rows, requested before the products that hide its latency.
		float u[NTW][4];
#pragma unroll
		for (int nt = 0; nt < NTW; nt++)
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				int r = min(rw * 16 + quad + hf * 8, L - 1);
				float2 x = *(const float2 *)(ug + ((t0 + r) * HV + h) * DV + v0 + wc + nt * 8 + qc);
				u[nt][2 * hf] = x.x;
				u[nt][2 * hf + 1] = x.y;
			}
		float egl = __expf(gg[(t0 + L - 1) * HV + h]);
		asm volatile("cp.async.wait_group 1;");
		__syncthreads();  // W, Q and the state's fragments are in

		float ws[NTW][4], qs[NTW][4];
#pragma unroll
		for (int nt = 0; nt < NTW; nt++)
#pragma unroll
			for (int e = 0; e < 4; e++) ws[nt][e] = qs[nt][e] = 0.f;
#pragma unroll
		for (int ks = 0; ks < MS; ks++) {
			unsigned awh[4], awl[4], aqh[4], aql[4];
			int ao = a_frag(rw * 16, ks * 16, AP);
			ldsm(aW + ao, awh);
			ldsm(aW + ao + 2 * DN_C * AP, awl);
			ldsm(aQ + ao, aqh);
			ldsm(aQ + ao + 2 * DN_C * AP, aql);
#pragma unroll
			for (int np = 0; np < NTW / 2; np++) {
				unsigned bh[4], bl[4];
				int bo = b_frag_t(ks * 16, wc + np * 16, SP);
				ldsm_t(aS + bo, bh);
				ldsm_t(aS + bo + 2 * DK * SP, bl);
				mma3(ws[2 * np], awh, awl, bh[0], bh[1], bl[0], bl[1]);
				mma3(ws[2 * np + 1], awh, awl, bh[2], bh[3], bl[2], bl[3]);
				mma3(qs[2 * np], aqh, aql, bh[0], bh[1], bl[0], bl[1]);
				mma3(qs[2 * np + 1], aqh, aql, bh[2], bh[3], bl[2], bl[3]);
			}
		}
		// Vn = U - W S, zero past the chunk's end.
#pragma unroll
		for (int nt = 0; nt < NTW; nt++)
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				int r = rw * 16 + quad + hf * 8;
				bool ok = r < L;
				unsigned hi, lo;
				split2(ok ? u[nt][2 * hf] - ws[nt][2 * hf] : 0.f, ok ? u[nt][2 * hf + 1] - ws[nt][2 * hf + 1] : 0.f, hi, lo);
				*(unsigned *)(sV + r * SP + wc + nt * 8 + qc) = hi;
				*(unsigned *)(sV + (DN_C + r) * SP + wc + nt * 8 + qc) = lo;
			}
		asm volatile("cp.async.wait_group 0;");
		__syncthreads();  // Vn, K and P are in; W and Q are free
		if (c + 1 < nch) stage(c + 1, wg, sW, qg, sQ, false);

		// O = (Q exp(G)) S + P Vn; P is lower triangular: key blocks up to the warp's own.
#pragma unroll
		for (int kb = 0; kb < 4; kb++) {
			if (kb > rw) continue;
			unsigned aph[4], apl[4];
			int ao = a_frag(rw * 16, kb * 16, PP);
			ldsm(aP + ao, aph);
			ldsm(aP + ao + 2 * DN_C * PP, apl);
#pragma unroll
			for (int np = 0; np < NTW / 2; np++) {
				unsigned bh[4], bl[4];
				int bo = b_frag_t(kb * 16, wc + np * 16, SP);
				ldsm_t(aV + bo, bh);
				ldsm_t(aV + bo + 2 * DN_C * SP, bl);
				mma3(qs[2 * np], aph, apl, bh[0], bh[1], bl[0], bl[1]);
				mma3(qs[2 * np + 1], aph, apl, bh[2], bh[3], bl[2], bl[3]);
			}
		}
#pragma unroll
		for (int hf = 0; hf < 2; hf++) {
			int r = rw * 16 + quad + hf * 8;
			if (r >= L) continue;
			float *o = out + (t0 + r) * HV * DV + h * DV + v0 + wc + qc;
#pragma unroll
			for (int nt = 0; nt < NTW; nt++) *(float2 *)(o + nt * 8) = float2{qs[nt][2 * hf], qs[nt][2 * hf + 1]};
		}

		// S = exp(G_L) S + (K exp(G_L - G))^T Vn.
#pragma unroll
		for (int i = 0; i < MTW; i++) {
			int mt = warp * MTW + i;
			if (mt >= MS) continue;
#pragma unroll
			for (int nt = 0; nt < NT; nt++)
#pragma unroll
				for (int e = 0; e < 4; e++) S[i][nt][e] *= egl;
#pragma unroll
			for (int kb = 0; kb < 4; kb++) {
				unsigned akh[4], akl[4];
				int ao = a_frag_t(mt * 16, kb * 16, AP);
				ldsm_t(aKd + ao, akh);
				ldsm_t(aKd + ao + 2 * DN_C * AP, akl);
#pragma unroll
				for (int np = 0; np < NT / 2; np++) {
					unsigned bh[4], bl[4];
					int bo = b_frag_t(kb * 16, np * 16, SP);
					ldsm_t(aV + bo, bh);
					ldsm_t(aV + bo + 2 * DN_C * SP, bl);
					mma3(S[i][2 * np], akh, akl, bh[0], bh[1], bl[0], bl[1]);
					mma3(S[i][2 * np + 1], akh, akl, bh[2], bh[3], bl[2], bl[3]);
				}
			}
		}
		shareS();  // every warp read the old S before the barrier above
		__syncthreads();  // K, P and Vn are free
		if (c + 1 < nch) stage(c + 1, kd, sKd, pg, sP, true);
	}
#pragma unroll
	for (int i = 0; i < MTW; i++) {
		if (warp * MTW + i >= MS) continue;
#pragma unroll
		for (int nt = 0; nt < NT; nt++)
#pragma unroll
			for (int hf = 0; hf < 2; hf++) {
				int row = (warp * MTW + i) * 16 + quad + hf * 8;
				*(float2 *)(g + (long)row * DV + nt * 8 + qc) = float2{S[i][nt][2 * hf], S[i][nt][2 * hf + 1]};
			}
	}
}

// The head shapes built (Go: dnChunkKernels): key dim DK, DVS value columns
// and NW warps a dn_chunk_run block. 16 is the test fixtures' shape; 128 is
// Qwen3-Next's and Qwen3.5's, where 32-column slices make HV * 4 blocks a
// sequence.
#define DN_PREP(DK) \
	extern "C" __global__ void __launch_bounds__(256, 2) dn_chunk_prep_##DK(const float *qkv, const float *ba, const void *aLog, \
			int adt, const void *dtBias, int bdt, u16 *qg, u16 *kd, u16 *wg, u16 *pg, float *ug, float *gg, int HK, int HV, \
			int DV, int chunkMin, int tiled, const int *seqn, const int *seqstart) { \
		dn_chunk_prep<DK>(qkv, ba, aLog, adt, dtBias, bdt, qg, kd, wg, pg, ug, gg, HK, HV, DV, chunkMin, tiled, seqn, seqstart); \
	}
#define DN_RUN(DK, DVS, NW) \
	extern "C" __global__ void __launch_bounds__(32 * NW) dn_chunk_run_##DK##_##DVS(float *out, const u16 *qg, const u16 *kd, \
			const u16 *wg, const u16 *pg, const float *ug, const float *gg, float *state, int HV, int DV, int recN, int chunkMin, \
			const int *seqpos, const int *seqn, const int *seqstart, const int *slots) { \
		dn_chunk_run<DK, DVS, NW>(out, qg, kd, wg, pg, ug, gg, state, HV, DV, recN, chunkMin, seqpos, seqn, seqstart, slots); \
	}
DN_PREP(16)
DN_PREP(128)
DN_RUN(16, 16, 4)
DN_RUN(128, 32, 8)
