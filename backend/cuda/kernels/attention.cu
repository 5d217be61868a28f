// Attention: q/k RMSNorm + RoPE + paged KV write, split-K decode attention
// (which can do the norms, RoPE and cache write itself and merges its own
// splits, or leave the merge to a combine pass), and a causal flash-style
// kernel for prefill.
//
// Caches are [Blocks, BlockSize, KVHeads, HeadDim] per layer, bf16 or f32;
// block tables are concatenated per sequence (seqblk gives each one's start).

struct RopeFreq {
	float f[128];  // RotaryDim/2 inverse frequencies
};

// qk_norm_rope: grid (T, ceil((H + 2*KH) / 8)), block 256: eight heads of a
// token per block, one per warp, after the block made the token's cos/sin
// table (angles rounded to float32 as transformers computes them, then cos
// and sin in double). Query heads go normed and
// rotated to qbuf [T, H, hd]; key heads (normed, rotated) and value heads are
// stored in the paged cache at the token's position.
extern "C" __global__ void __launch_bounds__(256) qk_norm_rope(const float *qkv, float *qbuf, void *kc, void *vc, int kvdt,
		const void *qn, const void *kn, int wdt, int unitOffset,
		const int *tokpos, const int *tokseq, const int *seqblk, const int *blocks,
		int H, int KH, int hd, int rd, int gated, float eps, float attnFactor, int bs, RopeFreq rf) {
	__shared__ float cs[128], sn[128];
	__shared__ float buf[8][256];
	int t = blockIdx.x;
	int pos = tokpos[t];
	int half = rd / 2;
	for (int i = threadIdx.x; i < half; i += blockDim.x) {
		float a = (float)pos * rf.f[i];
		double s, c;
		sincos((double)a, &s, &c);
		cs[i] = (float)c * attnFactor;
		sn[i] = (float)s * attnFactor;
	}
	__syncthreads();
	int qstride = gated ? 2 * hd : hd;
	long width = (long)H * qstride + 2L * KH * hd;
	const float *row = qkv + t * width;
	long slot = (long)blocks[seqblk[tokseq[t]] + pos / bs] * bs + pos % bs;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
	float *hb = buf[warp];
	for (int h = blockIdx.y * nw + warp; h < min(H + 2 * KH, (int)(blockIdx.y + 1) * nw); h += nw) {
		const float *src;
		int kind, kh = 0;
		if (h < H) { src = row + h * qstride; kind = 0; }
		else if (h < H + KH) { kh = h - H; src = row + (long)H * qstride + kh * hd; kind = 1; }
		else { kh = h - H - KH; src = row + (long)H * qstride + (long)(KH + kh) * hd; kind = 2; }
		long off = (slot * KH + kh) * hd;
		if (kind == 2) {
			for (int i = lane; i < hd; i += 32) st(vc, off + i, kvdt, src[i]);
			continue;
		}
		float ss = 0.f;
		for (int i = lane; i < hd; i += 32) {
			float v = src[i];
			hb[i] = v;
			ss += v * v;
		}
		float sc = rsqrtf(warp_sum(ss) / hd + eps);
		const void *w = kind == 0 ? qn : kn;
		for (int i = lane; i < hd; i += 32) {
			float g = ld(w, i, wdt);
			if (unitOffset) g += 1.f;
			hb[i] *= sc * g;
		}
		__syncwarp();
		for (int i = lane; i < hd; i += 32) {
			float v = hb[i];
			if (i < rd) {
				int j = i < half ? i : i - half;
				v = i < half ? hb[i] * cs[j] - hb[i + half] * sn[j] : hb[i] * cs[j] + hb[j] * sn[j];
			}
			if (kind == 0) qbuf[((long)t * H + h) * hd + i] = v;
			else st(kc, off + i, kvdt, v);
		}
		__syncwarp();
	}
}

// decode_chunk is the number of keys per split: the grid has S splits
// whatever the context (a captured graph replays it as contexts grow), and
// short contexts use only the first few, keeping each split's work worth a
// block.
__device__ __forceinline__ int decode_chunk(int n, int S) { return max((n + S - 1) / S, 64); }

// Raw holds 8 cache elements as loaded (bf16: one 16-byte vector; f32:
// two), so that twice as many keys fit in registers while their loads are
// in flight; they are widened when used.
template <typename KT> struct Raw;
template <> struct Raw<u16> {
	uint4 v;
	__device__ __forceinline__ void load(const u16 *p) { v = *(const uint4 *)p; }
	__device__ __forceinline__ void zero() { v = make_uint4(0, 0, 0, 0); }
	__device__ __forceinline__ void widen(float *f) const { unpack8(v, f); }
};
template <> struct Raw<float> {
	float4 a, b;
	__device__ __forceinline__ void load(const float *p) { a = ((const float4 *)p)[0]; b = ((const float4 *)p)[1]; }
	__device__ __forceinline__ void zero() { a = b = make_float4(0.f, 0.f, 0.f, 0.f); }
	__device__ __forceinline__ void widen(float *f) const {
		f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
	}
};

__device__ __forceinline__ void stk(u16 *p, long i, float v) { p[i] = f2bf(v); }
__device__ __forceinline__ void stk(float *p, long i, float v) { p[i] = v; }

// Loads that bypass L1: partial results written by other blocks of the
// same launch (after their fence) are read from L2.
__device__ __forceinline__ float ldcg(const float *p) {
	float v;
	asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
	return v;
}
__device__ __forceinline__ float4 ldcg4(const float *p) {
	float4 v;
	asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
	return v;
}

// DecodeArgs are attn_decode's inputs. q is qbuf [T, H, HD] (normed and
// rotated by qk_norm_rope, the new keys and values already cached) unless
// fuse is set: then q is the raw qkv row and each block norms and rotates
// its own query heads, and the block whose split holds the token's own
// position also norms, rotates and caches the new key and value (valid when
// every sequence has one new token: no block reads another's new entry).
// cnt, when not null, holds T*KH zeroed counters: the last active split of
// each (token, kv head) to finish merges the partials and writes out (and
// zeroes its counter again); otherwise attn_combine does.
struct DecodeArgs {
	const float *q, *qkv;
	void *kc, *vc;
	const int *tokpos, *tokseq, *seqblk, *blocks;
	float *pm, *pl, *pacc;
	int *cnt;
	float *out;
	const void *qn, *kn;
};

// DECODE_SPLITS_MAX bounds S (the host's KILN_CUDA_SPLITS range): the merge
// keeps G*S weights in shared memory.
#define DECODE_SPLITS_MAX 512

// attn_decode: grid (T, KH, S), block 128 (4 warps). Block (t, kh, split)
// attends the G query heads of kv head kh of token t over its split of the
// keys [0, pos]; each key row is read once for the G heads, with 16-byte
// loads: LANES = HD/8 lanes share one key, a warp covers 32/LANES keys per
// load and U such loads are issued before use. Partial results keep max and
// sum in log2 units.
template <typename KT, int HD, int G>
__device__ __forceinline__ void attn_decode(const DecodeArgs &a, int H, int KH, int bs, float scale, int gated,
		int fuse, int wdt, int unitOffset, int rd, float eps, float attnFactor, const RopeFreq &rf) {
	constexpr int LANES = HD / 8, TPW = 32 / LANES, U = sizeof(KT) == 2 ? 8 : 4, W = 4;
	constexpr int SB = G * (4 * HD > DECODE_SPLITS_MAX ? 4 * HD : DECODE_SPLITS_MAX);
	// One buffer, three lives: the fused prologue's query and key rows
	// [G+1][HD], then the warps' partials [W][G][HD], then the merge's
	// split weights [G][DECODE_SPLITS_MAX].
	__shared__ float sbuf[SB];
	__shared__ float sm_m[W][G], sm_l[W][G], sm_L[G];
	__shared__ float cs[HD / 2], sn[HD / 2];
	__shared__ int last;
	KT *kc = (KT *)a.kc, *vc = (KT *)a.vc;
	int t = blockIdx.x, kh = blockIdx.y, split = blockIdx.z, S = gridDim.z;
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane / LANES, sub = lane % LANES;
	int pos = a.tokpos[t];
	int n = pos + 1;
	int chunk = decode_chunk(n, S);
	int k0 = split * chunk, k1 = min(n, k0 + chunk);
	if (k0 >= n) return;  // an idle split: the merge reads only the active ones
	int act = (n + chunk - 1) / chunk;
	const int *bt = a.blocks + a.seqblk[a.tokseq[t]];
	int qstride = gated ? 2 * HD : HD;
	long width = (long)H * qstride + 2L * KH * HD;

	float q[G][8], acc[G][8], m[G], l[G];
	float qs = scale * LOG2E;
	if (fuse) {
		// As qk_norm_rope: angles rounded to float32, cos and sin in double.
		int half = rd / 2;
		for (int i = threadIdx.x; i < half; i += blockDim.x) {
			float ang = (float)pos * rf.f[i];
			double s, c;
			sincos((double)ang, &s, &c);
			cs[i] = (float)c * attnFactor;
			sn[i] = (float)s * attnFactor;
		}
		__syncthreads();
		const float *row = a.qkv + t * width;
		long off = (((long)bt[pos / bs] * bs + pos % bs) * KH + kh) * HD;
		int jobs = k1 == n ? G + 2 : G;  // the split holding pos also caches k and v
		for (int job = warp; job < jobs; job += W) {
			if (job == G + 1) {
				const float *src = row + (long)H * qstride + (long)(KH + kh) * HD;
				for (int i = lane; i < HD; i += 32) stk(vc, off + i, src[i]);
				continue;
			}
			const float *src = job < G ? row + (long)(kh * G + job) * qstride : row + (long)H * qstride + (long)kh * HD;
			float *hb = sbuf + job * HD;
			float ss = 0.f;
#pragma unroll
			for (int i = lane; i < HD; i += 32) {
				float v = src[i];
				hb[i] = v;
				ss += v * v;
			}
			float sc = rsqrtf(warp_sum(ss) / HD + eps);
			const void *w = job < G ? a.qn : a.kn;
#pragma unroll
			for (int i = lane; i < HD; i += 32) {
				float g = ld(w, i, wdt);
				if (unitOffset) g += 1.f;
				hb[i] *= sc * g;
			}
			__syncwarp();
			float r[HD / 32];
#pragma unroll
			for (int e = 0; e < HD / 32; e++) {
				int i = lane + 32 * e;
				float v = hb[i];
				if (i < rd) {
					int j = i < half ? i : i - half;
					v = i < half ? hb[i] * cs[j] - hb[i + half] * sn[j] : hb[i] * cs[j] + hb[j] * sn[j];
				}
				r[e] = v;
			}
			__syncwarp();
#pragma unroll
			for (int e = 0; e < HD / 32; e++) {
				if (job < G) hb[lane + 32 * e] = r[e];
				else stk(kc, off + lane + 32 * e, r[e]);
			}
		}
		// The new key and value (global stores) and the query rows are
		// visible to the whole block after this barrier.
		__syncthreads();
	}
#pragma unroll
	for (int g = 0; g < G; g++) {
		const float *qp = fuse ? sbuf + g * HD + sub * 8 : a.q + ((long)t * H + kh * G + g) * HD + sub * 8;
#pragma unroll
		for (int j = 0; j < 8; j++) { q[g][j] = qp[j] * qs; acc[g][j] = 0.f; }
		m[g] = -INF;
		l[g] = 0.f;
	}
	if (fuse) __syncthreads();  // sbuf is reused for the partials below
	for (int base = k0 + warp * TPW * U; base < k1; base += W * TPW * U) {
		Raw<KT> kr[U], vr[U];
		bool valid[U];
#pragma unroll
		for (int u = 0; u < U; u++) {
			int j = base + u * TPW + grp;
			valid[u] = j < k1;
			if (valid[u]) {
				long off = (((long)bt[j / bs] * bs + j % bs) * KH + kh) * HD + sub * 8;
				kr[u].load(kc + off);
				vr[u].load(vc + off);
			} else {
				kr[u].zero();
				vr[u].zero();
			}
		}
		// Scores of the tile first, then one rescale per head: independent
		// exponentials instead of a per-key dependency chain.
		float sc[U][G];
#pragma unroll
		for (int u = 0; u < U; u++) {
			float kf[8];
			kr[u].widen(kf);
#pragma unroll
			for (int g = 0; g < G; g++) {
				float s = 0.f;
#pragma unroll
				for (int d = 0; d < 8; d++) s += q[g][d] * kf[d];
#pragma unroll
				for (int o = LANES / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
				sc[u][g] = valid[u] ? s : -INF;
			}
		}
#pragma unroll
		for (int g = 0; g < G; g++) {
			float mt = sc[0][g];
#pragma unroll
			for (int u = 1; u < U; u++) mt = fmaxf(mt, sc[u][g]);
			float mn = fmaxf(m[g], mt);
			if (mn == -INF) continue;
			float c = exp2f(m[g] - mn);
			l[g] *= c;
#pragma unroll
			for (int d = 0; d < 8; d++) acc[g][d] *= c;
#pragma unroll
			for (int u = 0; u < U; u++) {
				float p = exp2f(sc[u][g] - mn);
				float vf[8];
				vr[u].widen(vf);
				l[g] += p;
#pragma unroll
				for (int d = 0; d < 8; d++) acc[g][d] += p * vf[d];
			}
			m[g] = mn;
		}
	}
	// Merge the key groups of the warp, then the warps.
#pragma unroll
	for (int o = LANES; o < 32; o <<= 1) {
#pragma unroll
		for (int g = 0; g < G; g++) {
			float mo = __shfl_xor_sync(0xffffffffu, m[g], o);
			float lo = __shfl_xor_sync(0xffffffffu, l[g], o);
			float mn = fmaxf(m[g], mo);
			float c1 = mn == -INF ? 0.f : exp2f(m[g] - mn), c2 = mn == -INF ? 0.f : exp2f(mo - mn);
			l[g] = l[g] * c1 + lo * c2;
#pragma unroll
			for (int d = 0; d < 8; d++) {
				float ao = __shfl_xor_sync(0xffffffffu, acc[g][d], o);
				acc[g][d] = acc[g][d] * c1 + ao * c2;
			}
			m[g] = mn;
		}
	}
	float *sm_acc = sbuf;  // [W][G][HD]
	if (grp == 0) {
#pragma unroll
		for (int g = 0; g < G; g++) {
#pragma unroll
			for (int d = 0; d < 8; d++) sm_acc[(warp * G + g) * HD + sub * 8 + d] = acc[g][d];
			if (sub == 0) { sm_m[warp][g] = m[g]; sm_l[warp][g] = l[g]; }
		}
	}
	__syncthreads();
	bool direct = a.cnt != nullptr && act == 1;  // the only active split: no merge
	for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
		int g = i / HD, d = i % HD;
		float M = -INF;
#pragma unroll
		for (int w = 0; w < W; w++) M = fmaxf(M, sm_m[w][g]);
		float L = 0.f, A = 0.f;
		if (M != -INF) {
#pragma unroll
			for (int w = 0; w < W; w++) {
				float c = exp2f(sm_m[w][g] - M);
				L += sm_l[w][g] * c;
				A += sm_acc[(w * G + g) * HD + d] * c;
			}
		}
		int h = kh * G + g;
		if (direct) {
			float o = A / L;
			if (gated) o *= 1.f / (1.f + __expf(-a.qkv[t * width + (long)h * 2 * HD + HD + d]));
			a.out[((long)t * H + h) * HD + d] = o;
			continue;
		}
		long pi = ((long)t * H + h) * S + split;
		a.pacc[pi * HD + d] = A;
		if (d == 0) { a.pm[pi] = M; a.pl[pi] = L; }
	}
	if (a.cnt == nullptr || direct) return;

	// Publish the partials; the last active split to arrive merges them.
	__threadfence();
	__syncthreads();
	if (threadIdx.x == 0) {
		int *c = a.cnt + t * KH + kh;
		int seen = atomicAdd(c, 1);
		last = seen == act - 1;
		if (last) *c = 0;  // every active split has counted: ready for the next launch
	}
	__syncthreads();
	if (!last) return;
	__threadfence();
	float *wts = sbuf;  // [G][DECODE_SPLITS_MAX]
	for (int g = warp; g < G; g += W) {
		long pb = ((long)t * H + kh * G + g) * S;
		float M = -INF;
		for (int s = lane; s < act; s += 32) M = fmaxf(M, ldcg(a.pm + pb + s));
		M = warp_max(M);
		float L = 0.f;
		for (int s = lane; s < act; s += 32) {
			float ms = ldcg(a.pm + pb + s);
			float c = ms == -INF ? 0.f : exp2f(ms - M);
			wts[g * DECODE_SPLITS_MAX + s] = c;
			L += ldcg(a.pl + pb + s) * c;
		}
		L = warp_sum(L);
		if (lane == 0) sm_L[g] = L;
	}
	__syncthreads();
	for (int i = threadIdx.x; i < G * HD / 4; i += blockDim.x) {
		int g = 4 * i / HD, d = 4 * i % HD;
		const float *pa = a.pacc + ((long)t * H + kh * G + g) * S * HD + d;
		const float *wg = wts + g * DECODE_SPLITS_MAX;
		float o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
		for (int s = 0; s < act; s++) {
			float4 v = ldcg4(pa + (long)s * HD);
			float c = wg[s];
			o[0] += v.x * c; o[1] += v.y * c; o[2] += v.z * c; o[3] += v.w * c;
		}
		int h = kh * G + g;
		float inv = 1.f / sm_L[g];
#pragma unroll
		for (int e = 0; e < 4; e++) {
			float v = o[e] * inv;
			if (gated) v *= 1.f / (1.f + __expf(-a.qkv[t * width + (long)h * 2 * HD + HD + d + e]));
			a.out[((long)t * H + h) * HD + d + e] = v;
		}
	}
}

#define DECODE(KT, KN, HD, G) \
	extern "C" __global__ void __launch_bounds__(128) attn_decode_##KN##_##HD##_##G(DecodeArgs a, int H, int KH, int bs, float scale, int gated, \
			int fuse, int wdt, int unitOffset, int rd, float eps, float attnFactor, RopeFreq rf) { \
		attn_decode<KT, HD, G>(a, H, KH, bs, scale, gated, fuse, wdt, unitOffset, rd, eps, attnFactor, rf); \
	}
#define DECODE_G(KT, KN, HD) DECODE(KT, KN, HD, 1) DECODE(KT, KN, HD, 2) DECODE(KT, KN, HD, 4) DECODE(KT, KN, HD, 8)
DECODE_G(u16, bf16, 64)
DECODE_G(u16, bf16, 128)
DECODE_G(u16, bf16, 256)
DECODE_G(float, f32, 64)
DECODE_G(float, f32, 128)
DECODE_G(float, f32, 256)

// attn_combine: grid (T, H), block 4*HD. Merges the active partials of
// each head (four groups of threads take every fourth split, then add up),
// applies the sigmoid gate when gated and writes out [T, H*HD].
extern "C" __global__ void attn_combine(float *out, const float *pm, const float *pl, const float *pacc,
		const float *qkv, const int *tokpos, int H, int KH, int HD, int S, int gated) {
	__shared__ float wt[512];
	__shared__ float part[3][256];
	__shared__ float red[32];
	int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x % HD, sg = threadIdx.x / HD;
	int n = tokpos[t] + 1;
	int act = min(S, (n + decode_chunk(n, S) - 1) / decode_chunk(n, S));
	long pi = ((long)t * H + h) * S;
	float M = -INF;
	for (int s = threadIdx.x; s < act; s += blockDim.x) M = fmaxf(M, pm[pi + s]);
	M = block_max(M, red);
	float L = 0.f;
	for (int s = threadIdx.x; s < act; s += blockDim.x) {
		float c = pm[pi + s] == -INF ? 0.f : exp2f(pm[pi + s] - M);
		wt[s] = c;
		L += pl[pi + s] * c;
	}
	L = block_sum(L, red);  // its barriers also publish wt
	float A = 0.f;
#pragma unroll 4
	for (int s = sg; s < act; s += 4) A += pacc[(pi + s) * HD + d] * wt[s];
	if (sg > 0) part[sg - 1][d] = A;
	__syncthreads();
	if (sg > 0) return;
	A += part[0][d] + part[1][d] + part[2][d];
	float o = A / L;
	if (gated) {
		long width = 2L * H * HD + 2L * KH * HD;
		float g = qkv[t * width + (long)h * 2 * HD + HD + d];
		o *= 1.f / (1.f + __expf(-g));
	}
	out[((long)t * H + h) * HD + d] = o;
}

// attn_prefill: grid (ceil(maxN/32), H, S), block 128, dynamic shared memory
// 2*32*HD floats. Four threads share a query (thread c owns dims c, c+4, ...);
// 32 queries of one sequence and head per block walk the causal key range in
// tiles of 32 keys staged in shared memory, with an online softmax.
template <typename KT, int HD>
__device__ __forceinline__ void attn_prefill(float *out, const float *qbuf, const KT *kc, const KT *vc, const float *qkv,
		const int *seqpos, const int *seqn, const int *seqstart, const int *seqblk, const int *blocks,
		int H, int KH, int bs, float scale, int gated) {
	constexpr int DPT = HD / 4, BQ = 32, BK = 32;
	extern __shared__ float smem[];
	float *sK = smem, *sV = smem + BK * HD;
	int s = blockIdx.z, h = blockIdx.y, qi0 = blockIdx.x * BQ;
	int nN = seqn[s];
	if (qi0 >= nN) return;
	int G = H / KH, kh = h / G;
	int p0 = seqpos[s], start = seqstart[s];
	const int *bt = blocks + seqblk[s];
	int r = threadIdx.x >> 2, c = threadIdx.x & 3;
	int qi = qi0 + r;
	bool vq = qi < nN;
	int qpos = p0 + qi;
	long t = start + qi;
	float q[DPT], acc[DPT];
	float qs = scale * LOG2E;
#pragma unroll
	for (int i = 0; i < DPT; i++) {
		q[i] = vq ? qbuf[(t * H + h) * HD + i * 4 + c] * qs : 0.f;
		acc[i] = 0.f;
	}
	float m = -INF, l = 0.f;
	int kend = p0 + min(nN, qi0 + BQ);
	for (int kt = 0; kt < kend; kt += BK) {
		__syncthreads();
		for (int idx = threadIdx.x; idx < BK * HD; idx += blockDim.x) {
			int j = idx / HD, d = idx % HD, key = kt + j;
			float kv = 0.f, vv = 0.f;
			if (key < kend) {
				long off = (((long)bt[key / bs] * bs + key % bs) * KH + kh) * HD + d;
				kv = ldk(kc, off);
				vv = ldk(vc, off);
			}
			sK[idx] = kv;
			sV[idx] = vv;
		}
		__syncthreads();
		float sc[BK];
		float mt = -INF;
#pragma unroll
		for (int j = 0; j < BK; j++) {
			float a = 0.f;
#pragma unroll
			for (int i = 0; i < DPT; i++) a += q[i] * sK[j * HD + i * 4 + c];
			a += __shfl_xor_sync(0xffffffffu, a, 1);
			a += __shfl_xor_sync(0xffffffffu, a, 2);
			int key = kt + j;
			sc[j] = (vq && key <= qpos && key < kend) ? a : -INF;
			mt = fmaxf(mt, sc[j]);
		}
		float mn = fmaxf(m, mt);
		if (mn == -INF) continue;
		float cf = exp2f(m - mn);
		l *= cf;
#pragma unroll
		for (int i = 0; i < DPT; i++) acc[i] *= cf;
#pragma unroll
		for (int j = 0; j < BK; j++) {
			float p = exp2f(sc[j] - mn);
			l += p;
#pragma unroll
			for (int i = 0; i < DPT; i++) acc[i] += p * sV[j * HD + i * 4 + c];
		}
		m = mn;
	}
	if (!vq) return;
	float inv = 1.f / l;
	long width = (long)H * (gated ? 2 * HD : HD) + 2L * KH * HD;
#pragma unroll
	for (int i = 0; i < DPT; i++) {
		int d = i * 4 + c;
		float o = acc[i] * inv;
		if (gated) {
			float g = qkv[t * width + (long)h * 2 * HD + HD + d];
			o *= 1.f / (1.f + __expf(-g));
		}
		out[(t * H + h) * HD + d] = o;
	}
}

#define PREFILL(KT, KN, HD) \
	extern "C" __global__ void __launch_bounds__(128) attn_prefill_##KN##_##HD(float *out, const float *qbuf, const KT *kc, const KT *vc, \
			const float *qkv, const int *seqpos, const int *seqn, const int *seqstart, const int *seqblk, const int *blocks, \
			int H, int KH, int bs, float scale, int gated) { \
		attn_prefill<KT, HD>(out, qbuf, kc, vc, qkv, seqpos, seqn, seqstart, seqblk, blocks, H, KH, bs, scale, gated); \
	}
PREFILL(u16, bf16, 16)
PREFILL(u16, bf16, 32)
PREFILL(u16, bf16, 64)
PREFILL(u16, bf16, 128)
PREFILL(u16, bf16, 256)
PREFILL(float, f32, 16)
PREFILL(float, f32, 32)
PREFILL(float, f32, 64)
PREFILL(float, f32, 128)
PREFILL(float, f32, 256)
