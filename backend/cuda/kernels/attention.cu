// Attention: q/k RMSNorm + RoPE + paged KV write in one kernel (the fused
// path), RoPE and the KV write apart (the steps), split-K decode attention
// with a combine pass, and a causal flash-style kernel for prefill.
//
// Caches are [Blocks, BlockSize, KVHeads, HeadDim] per layer, bf16 or f32;
// block tables are concatenated per sequence (seqblk gives each one's start).

// rope: grid (T), block 256. Rotates each of the heads of token t's row of
// x [T, heads*hd] (f32, bf16 or f16) in place by the token's position: the
// first rd dims, NeoX style (rotate-half within them).
extern "C" __global__ void rope(void *x, int dt, const int *tokpos, int heads, int hd, int rd, float attnFactor, RopeFreq rf) {
	__shared__ float cs[128], sn[128];
	int t = blockIdx.x, half = rd / 2;
	rope_table(cs, sn, tokpos[t], half, attnFactor, rf);
	__syncthreads();
	long row = (long)t * heads * hd;
	for (int i = threadIdx.x; i < heads * half; i += blockDim.x) {
		int j = i % half;
		long a = row + (long)(i / half) * hd + j;
		float x1 = ld(x, a, dt), x2 = ld(x, a + half, dt);
		st(x, a, dt, x1 * cs[j] - x2 * sn[j]);
		st(x, a + half, dt, x2 * cs[j] + x1 * sn[j]);
	}
}

// kv_store: grid (T), block 256. Token t's keys and values (rows of n =
// KH*hd elements of k and v, of types kdt and vdt) go to its position in
// the paged caches kc and vc (of type kvdt).
extern "C" __global__ void kv_store(void *kc, void *vc, int kvdt, const void *k, int kdt, const void *v, int vdt,
		const int *tokpos, const int *tokseq, const int *seqblk, const int *blocks, int n, int bs) {
	int t = blockIdx.x, pos = tokpos[t];
	long slot = ((long)blocks[seqblk[tokseq[t]] + pos / bs] * bs + pos % bs) * n;
	for (int i = threadIdx.x; i < n; i += blockDim.x) {
		st(kc, slot + i, kvdt, ld(k, (long)t * n + i, kdt));
		st(vc, slot + i, kvdt, ld(v, (long)t * n + i, vdt));
	}
}

// kv_move: grid (n, pieces), block 256. Block (i, p) copies piece p (per
// layer its K, then its V) of KV block blocks[i] between the cache and buf,
// where each block's pieces follow each other: into the cache, or with
// gather out of it. per (a piece's bytes) is a multiple of 16.
extern "C" __global__ void kv_move(char *cache, char *buf, const int *blocks, long plane, int per, int pieces, int gather) {
	int i = blockIdx.x, p = blockIdx.y;
	uint4 *dev = (uint4 *)(cache + p * plane + (long)blocks[i] * per);
	uint4 *mem = (uint4 *)(buf + ((long)i * pieces + p) * per);
	for (int k = threadIdx.x; k < per / 16; k += blockDim.x) {
		if (gather) mem[k] = dev[k];
		else dev[k] = mem[k];
	}
}

// qk_norm_rope: grid (T, ceil((H + 2*KH) / hpb)), block 256: hpb heads of a
// token per block, one per warp at a time, each lane on four consecutive
// elements (hd % 4 == 0), after the block made the token's cos/sin table
// (angles rounded to float32 as transformers computes them, then cos and
// sin in double) and loaded the norm weights. Query heads go normed and
// rotated to qbuf [T, H, hd] (of the cache's type); key heads (normed and
// rotated) and value heads go to the paged caches at the token's
// position. Launched overlapped: the table, the weights and the cache
// slot (the step's metadata) come before pdl_wait, the projection after.
extern "C" __global__ void __launch_bounds__(256) qk_norm_rope(const void *qkv, int qdt, void *qbuf, void *kc, void *vc, int kvdt,
		const void *qn, const void *kn, int wdt, int unitOffset,
		const int *tokpos, const int *tokseq, const int *seqblk, const int *blocks,
		int H, int KH, int hd, int rd, int gated, float eps, float attnFactor, int bs, int hpb, RopeFreq rf) {
	pdl_trigger();  // decode attention starts streaming the cached keys
	__shared__ float cs[128], sn[128], wq[256], wk[256];
	__shared__ __align__(16) float buf[8][256];
	int t = blockIdx.x;
	int pos = tokpos[t];
	int half = rd / 2;
	rope_table(cs, sn, pos, half, attnFactor, rf);
	float u = unitOffset ? 1.f : 0.f;
	for (int i = threadIdx.x; i < hd; i += blockDim.x) {
		wq[i] = ld(qn, i, wdt) + u;
		wk[i] = ld(kn, i, wdt) + u;
	}
	__syncthreads();
	int qstride = gated ? 2 * hd : hd;
	long width = (long)H * qstride + 2L * KH * hd;
	long row = t * width;
	long slot = (long)blocks[seqblk[tokseq[t]] + pos / bs] * bs + pos % bs;
	pdl_wait();
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
	float *hb = buf[warp];
	for (int h = blockIdx.y * hpb + warp; h < min(H + 2 * KH, (int)(blockIdx.y + 1) * hpb); h += nw) {
		long src;  // the head's first element in qkv
		int kind, kh = 0;
		if (h < H) { src = row + h * qstride; kind = 0; }
		else if (h < H + KH) { kh = h - H; src = row + (long)H * qstride + kh * hd; kind = 1; }
		else { kh = h - H - KH; src = row + (long)H * qstride + (long)(KH + kh) * hd; kind = 2; }
		long off = (slot * KH + kh) * hd;
		if (kind == 2) {
			for (int i = 4 * lane; i < hd; i += 128) st4(vc, off + i, kvdt, ld4(qkv, src + i, qdt));
			continue;
		}
		head_norm_rope(qkv, src, qdt, kind == 0 ? wq : wk, eps, cs, sn, hd, rd, hb, [&](int i, float4 v) {
			if (kind == 0) st4(qbuf, ((long)t * H + h) * hd + i, kvdt, v);
			else st4(kc, off + i, kvdt, v);
		});
	}
}

// attn_decode: grid (T, KH, S), block 128 (4 warps). Block (t, kh, split)
// attends the G query heads of kv head kh of token t over its split of the
// keys [0, pos]; each key row is read once for the G heads, with 16-byte
// loads: LANES = HD/8 lanes share one key, a warp covers 32/LANES keys per
// load and keeps U such loads of keys and of values in flight. Writes unnormalised partial
// results (max and sum in log2 units) for attn_combine.
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

//
// Launched overlapped (programmatic dependent launch) after qk_norm_rope: the
// first tile of keys cached by earlier steps (before seqpos, this step's
// first position of the sequence) is requested before pdl_wait, so the
// stream is under way when qk_norm_rope finishes; keys of this step and the
// queries are read after it.
template <typename KT, int HD, int G>
__device__ __forceinline__ void attn_decode(const KT *qbuf, const KT *kc, const KT *vc,
		const int *tokpos, const int *tokseq, const int *seqpos, const int *seqblk, const int *blocks,
		float *pm, float *pl, float *pacc, int H, int KH, int bs, float scale) {
	constexpr int LANES = HD / 8, TPW = 32 / LANES, U = sizeof(KT) == 2 ? 4 : 2, W = 4;
	__shared__ float sm_acc[W][G][HD];
	__shared__ float sm_m[W][G], sm_l[W][G];
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, grp = lane / LANES, sub = lane % LANES;
	DecodeSplit sp;
	if (!sp.init(tokpos, tokseq, seqpos, seqblk, blocks, DS_SCALAR)) return;
	int t = sp.t, kh = sp.kh, k0 = sp.k0, k1 = sp.k1, cached = sp.cached;
	const int *bt = sp.bt;

	// Software pipelined: the keys and values of the warp's next tile are
	// requested before this tile is used, so each lane always has U of each
	// in flight (keys past the split's end load as zeros, scored -inf).
	constexpr int STEP = W * TPW * U;
	Raw<KT> kr[U], vr[U];
	auto fetch = [&](int j, Raw<KT> &kd, Raw<KT> &vd) {
		long off = (((long)bt[j / bs] * bs + j % bs) * KH + kh) * HD + sub * 8;
		kd.load(kc + off);
		vd.load(vc + off);
	};
	auto load = [&](int base, Raw<KT> (&kd)[U], Raw<KT> (&vd)[U], int end) {
#pragma unroll
		for (int u = 0; u < U; u++) {
			int j = base + u * TPW + grp;
			if (j < end) {
				fetch(j, kd[u], vd[u]);
			} else {
				kd[u].zero();
				vd[u].zero();
			}
		}
	};
	int first = k0 + warp * TPW * U;
	load(first, kr, vr, min(k1, cached));
	pdl_wait();
	pdl_trigger();  // attn_combine may launch and wait for this grid
#pragma unroll
	for (int u = 0; u < U; u++) {
		int j = first + u * TPW + grp;
		if (j >= cached && j < k1) fetch(j, kr[u], vr[u]);
	}

	float q[G][8], acc[G][8], m[G], l[G];
	float qs = scale * LOG2E;
#pragma unroll
	for (int g = 0; g < G; g++) {
		const KT *qp = qbuf + ((long)t * H + kh * G + g) * HD + sub * 8;
#pragma unroll
		for (int j = 0; j < 8; j++) { q[g][j] = ldk(qp, j) * qs; acc[g][j] = 0.f; }
		m[g] = -INF;
		l[g] = 0.f;
	}
	for (int base = k0 + warp * TPW * U; base < k1; base += STEP) {
		Raw<KT> nk[U], nv[U];
		if (base + STEP < k1) load(base + STEP, nk, nv, k1);
		bool valid[U];
#pragma unroll
		for (int u = 0; u < U; u++) valid[u] = base + u * TPW + grp < k1;
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
#pragma unroll
		for (int u = 0; u < U; u++) kr[u] = nk[u], vr[u] = nv[u];
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
	if (grp == 0) {
#pragma unroll
		for (int g = 0; g < G; g++) {
#pragma unroll
			for (int d = 0; d < 8; d++) sm_acc[warp][g][sub * 8 + d] = acc[g][d];
			if (sub == 0) { sm_m[warp][g] = m[g]; sm_l[warp][g] = l[g]; }
		}
	}
	__syncthreads();
	sp.partial<W, G, HD>(sm_acc, sm_m, sm_l, pm, pl, pacc, H, G);
}

#define DECODE(KT, KN, HD, G) \
	extern "C" __global__ void __launch_bounds__(128) attn_decode_##KN##_##HD##_##G(const KT *qbuf, const KT *kc, const KT *vc, \
			const int *tokpos, const int *tokseq, const int *seqpos, const int *seqblk, const int *blocks, \
			float *pm, float *pl, float *pacc, int H, int KH, int bs, float scale) { \
		attn_decode<KT, HD, G>(qbuf, kc, vc, tokpos, tokseq, seqpos, seqblk, blocks, pm, pl, pacc, H, KH, bs, scale); \
	}
#define DECODE_G(KT, KN, HD) DECODE(KT, KN, HD, 1) DECODE(KT, KN, HD, 2) DECODE(KT, KN, HD, 4) DECODE(KT, KN, HD, 8)
DECODE_G(u16, bf16, 256)
DECODE_G(float, f32, 64)
DECODE_G(float, f32, 128)
DECODE_G(float, f32, 256)

// attn_combine: grid (T, H), block 4*HD. Merges the active partials of
// each head (decode's splits of at least least keys; all S when least is 0:
// the split prefill's, whose ranges do not follow decode_chunk); four
// groups of threads take every fourth split, then add up,
// applies the sigmoid gate when gated and writes out [T, H*HD]. Launched
// overlapped: its blocks are placed while the attention grid finishes and
// wait for it in pdl_wait.
extern "C" __global__ void attn_combine(void *out, int odt, const float *pm, const float *pl, const float *pacc,
		const void *qkv, int qdt, const int *tokpos, int H, int KH, int HD, int S, int gated, int least) {
	pdl_trigger();  // the output projection follows
	__shared__ float wt[512];
	__shared__ float part[3][256];
	__shared__ float red[32];
	int t = blockIdx.x, h = blockIdx.y, d = threadIdx.x % HD, sg = threadIdx.x / HD;
	int n = tokpos[t] + 1;  // step metadata, uploaded before the step
	int act = least == 0 ? S : decode_active(n, S, least);
	pdl_wait();
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
	attn_store(out, odt, qkv, qdt, gated, t, h, H, KH, HD, d, A / L);
}

// attn_prefill: grid (ceil(maxN/AP_BQ), H, S), block 4*AP_BQ, dynamic shared
// memory 2*AP_BK*HD floats. Four threads share a query (thread c owns dims c,
// c+4, ...); AP_BQ queries of one sequence and head per block walk the causal
// key range in tiles of AP_BK keys staged in shared memory, with an online
// softmax.
template <typename KT, int HD>
__device__ __forceinline__ void attn_prefill(void *out, int odt, const KT *qbuf, const KT *kc, const KT *vc, const void *qkv, int qdt,
		const int *seqpos, const int *seqn, const int *seqstart, const int *seqblk, const int *blocks,
		int H, int KH, int bs, float scale, int gated) {
	constexpr int DPT = HD / 4, BQ = AP_BQ, BK = AP_BK;
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
		q[i] = vq ? ldk(qbuf, (t * H + h) * HD + i * 4 + c) * qs : 0.f;
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
#pragma unroll
	for (int i = 0; i < DPT; i++) attn_store(out, odt, qkv, qdt, gated, t, h, H, KH, HD, i * 4 + c, acc[i] * inv);
}

#define PREFILL(KT, KN, HD) \
	extern "C" __global__ void __launch_bounds__(128) attn_prefill_##KN##_##HD(void *out, int odt, const KT *qbuf, const KT *kc, const KT *vc, \
			const void *qkv, int qdt, const int *seqpos, const int *seqn, const int *seqstart, const int *seqblk, const int *blocks, \
			int H, int KH, int bs, float scale, int gated) { \
		attn_prefill<KT, HD>(out, odt, qbuf, kc, vc, qkv, qdt, seqpos, seqn, seqstart, seqblk, blocks, H, KH, bs, scale, gated); \
	}
PREFILL(u16, bf16, 16)
PREFILL(u16, bf16, 32)
PREFILL(u16, bf16, 256)
PREFILL(float, f32, 16)
PREFILL(float, f32, 32)
PREFILL(float, f32, 64)
PREFILL(float, f32, 128)
PREFILL(float, f32, 256)
