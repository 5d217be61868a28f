// On-device sampling. A row that asks only for its largest logit goes to
// argmax_rows; the others take three kernels: sample_scan over many blocks
// a row (penalties, the largest logit, the sums, a histogram of the keys),
// whose last block to finish plans the row; sample_gather over as many (the
// candidates, below); sample_rows, a block a row (the filters, the draw,
// log-probabilities). Only the drawn token, its log-probability and the
// requested top log-probabilities leave the device.

struct SampleArgs {
	float temperature, topP, minP, uniform;
	float presence, frequency, repetition;
	int topK, cntOff, cntN, biasOff, biasN, nTop, wantLp;
	int maskOff;  // word offset of the row's token mask (bit set: allowed), -1: none
};

// A row's plan, which sample_scan's last block writes: the largest logit
// and its first index, log Z (of the penalised logits), the sum of
// exp((z - mx) / T) over the row, and the candidates: the keys in bins >=
// sbin, sn of them (sbin < 0: none), gathered counting in gathered.
struct SamplePlan {
	float mx, logZ, sT;
	int tok, sbin, sn;
	unsigned gathered;
	int pad;
};
static_assert(sizeof(SamplePlan) == SAMPLE_PLAN_BYTES, "SamplePlan's size is the Go side's");

// SAMPLE_FAST (default on) draws a row's token among candidates when the
// filters keep only tokens among them: the row's SAMPLE_CAP largest logits
// at most, those of the top bins of a histogram of the keys' top
// SAMPLE_BITS bits, gathered and sorted in shared memory. Other rows walk
// the whole row (select_desc). -DSAMPLE_FAST=0 sends every row there, for an
// A/B run.
#ifndef SAMPLE_FAST
#define SAMPLE_FAST 1
#endif
#define SAMPLE_BINS (1 << SAMPLE_BITS)

// ordered maps a float to an unsigned int of the same order.
__device__ __forceinline__ unsigned ordered(float v) {
	unsigned u = __float_as_uint(v);
	return u ^ ((u >> 31) ? 0xffffffffu : 0x80000000u);
}

// key orders (value desc, index asc) as a descending unsigned 64-bit key.
__device__ __forceinline__ unsigned long long sort_key(float v, int i) {
	return ((unsigned long long)ordered(v) << 32) | (0xffffffffu - (unsigned)i);
}

__device__ __forceinline__ int key_index(unsigned long long k) { return (int)(0xffffffffu - (unsigned)(k & 0xffffffffu)); }

__device__ __forceinline__ float key_value(unsigned long long k) {
	unsigned u = (unsigned)(k >> 32);
	return __uint_as_float(u ^ ((u >> 31) ? 0x80000000u : 0xffffffffu));
}

__device__ __forceinline__ int key_bin(float v) { return (int)(ordered(v) >> (32 - SAMPLE_BITS)); }

// warp_scan returns the sum of x over the warp's lanes up to this one.
template <typename T>
__device__ __forceinline__ T warp_scan(T x) {
	int lane = threadIdx.x & 31;
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		T y = __shfl_up_sync(0xffffffffu, x, o);
		if (lane >= o) x += y;
	}
	return x;
}

// block_scan returns the sum of v over the block's threads before this one;
// red[32] holds the block's total after it (red: 33 values).
template <typename T>
__device__ T block_scan(T v, T *red) {
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	T x = warp_scan(v);
	T ex = __shfl_up_sync(0xffffffffu, x, 1);
	if (lane == 0) ex = T(0);
	__syncthreads();  // red may still be read after the last call
	if (lane == 31) red[w] = x;
	__syncthreads();
	if (w == 0) {
		T s = warp_scan(lane < nw ? red[lane] : T(0));
		T e = __shfl_up_sync(0xffffffffu, s, 1);
		if (lane < nw) red[lane] = lane == 0 ? T(0) : e;
		if (lane == 31) red[32] = s;
	}
	__syncthreads();
	return red[w] + ex;
}

// first_where returns the least j < n for which pred(j) holds, n if none.
template <typename P>
__device__ int first_where(int n, P pred, int *s) {
	if (threadIdx.x == 0) *s = n;
	__syncthreads();
	for (int j = threadIdx.x; j < n; j += blockDim.x)
		if (pred(j)) {
			atomicMin(s, j);
			break;
		}
	__syncthreads();
	int r = *s;
	__syncthreads();
	return r;
}

#define SEL_HISTS 16  // select_desc's histograms: a pair of warps each

// select_desc walks the elements with key >= floor in descending key order,
// weighing element i by wt(i), and returns the key of the element at which
// the running sum first exceeds target (radix select, 8 bits per pass).
// Each pair of warps adds to its own histogram (hist: SEL_HISTS of 256),
// summed into tot, and a warp whose elements fall in one or two bins adds
// their sums: in the first passes most keys share a bin, where one
// histogram for the block, a lane's add each, serialized the adds. Once a
// pass over the index's bits finds the value's element alone (no tie), it
// is the answer.
template <typename Wt>
__device__ unsigned long long select_desc(const float *z, int V, unsigned long long floor, float target, Wt wt,
		float *hist, float *tot, unsigned long long *shared_key, float *shared_rem, int *shared_n) {
	unsigned long long prefix = 0, mask = 0;
	float *mine = hist + 256 * ((threadIdx.x >> 6) % SEL_HISTS);
	int lane = threadIdx.x & 31;
	if (threadIdx.x == 0) *shared_rem = target;
	for (int shift = 56; shift >= 0; shift -= 8) {
		for (int b = threadIdx.x; b < 256 * SEL_HISTS; b += blockDim.x) hist[b] = 0.f;
		if (threadIdx.x == 0) *shared_n = 0;
		__syncthreads();
		for (int i0 = 0; i0 < V; i0 += blockDim.x) {  // whole warps: the ballots take every lane
			int i = i0 + threadIdx.x;
			unsigned long long k = i < V ? sort_key(z[i], i) : 0ull;
			bool in = i < V && k >= floor && (k & mask) == prefix;
			if (!__any_sync(0xffffffffu, in)) continue;
			int bin = in ? (int)((k >> shift) & 255) : -1;
			float w = in ? wt(i) : 0.f;
			if (shift < 32 && in) {  // the value's elements: one unless tied
				atomicAdd(shared_n, 1);
				*shared_key = k;
			}
			unsigned same = __match_any_sync(0xffffffffu, bin);
			unsigned leads = __ballot_sync(0xffffffffu, in && __ffs(same) - 1 == lane);
			if (__popc(leads) > 2) {
				if (in) atomicAdd(&mine[bin], w);
				continue;
			}
			while (leads) {
				int l = __ffs(leads) - 1, b = __shfl_sync(0xffffffffu, bin, l);
				leads &= leads - 1;
				float t = warp_sum(bin == b ? w : 0.f);
				if (lane == l) atomicAdd(&mine[b], t);
			}
		}
		__syncthreads();
		if (shift < 32 && *shared_n == 1) {
			unsigned long long k = *shared_key;
			__syncthreads();
			return k;
		}
		for (int b = threadIdx.x; b < 256; b += blockDim.x) {
			float t = 0.f;
			for (int h = 0; h < SEL_HISTS; h++) t += hist[256 * h + b];
			tot[b] = t;
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			float rem = *shared_rem, run = 0.f;
			int chosen = -1, last = -1;
			for (int b = 255; b >= 0; b--) {
				if (tot[b] <= 0.f) continue;
				last = b;
				if (run + tot[b] > rem) { chosen = b; break; }
				run += tot[b];
			}
			if (chosen < 0) {  // rounding left the target past the end: take the last element
				chosen = last < 0 ? 0 : last;
				run -= last < 0 ? 0.f : tot[last];
				rem = run + (last < 0 ? 0.f : tot[last]) * 0.5f;
			}
			*shared_rem = rem - run;
			*shared_key = prefix | ((unsigned long long)chosen << shift);
		}
		__syncthreads();
		prefix = *shared_key;
		mask |= 255ull << shift;
		__syncthreads();
	}
	return prefix;
}

__device__ __forceinline__ bool penalised(const SampleArgs &a) { return a.cntN > 0 || a.biasN > 0 || a.maskOff >= 0; }

// sample_scan reads ROW_CHUNK logits of a row a block: with penalties,
// bias or a mask it applies them and writes its chunk to work (the
// penalised row the next kernels read); it finds the chunk's largest
// logit, its sums of exp relative to it, and counts its finite logits'
// bins into the row's histogram. The last of a row's blocks to finish
// merges the chunks in order into the row's plan and leaves the histogram
// and its arrival count zero for the next sampling.
extern "C" __global__ void __launch_bounds__(256) sample_scan(const float *logits, int V, const SampleArgs *args, const int *cnt,
		const float *bias, const unsigned long long *mask, float *work, int *hist, float4 *part, unsigned *arrived, SamplePlan *plan) {
	__shared__ float zs[ROW_CHUNK];
	__shared__ int sh[SAMPLE_BINS];
	__shared__ float red[33];
	__shared__ int ired[33];
	__shared__ float bestv[8];
	__shared__ int besti[8];
	__shared__ bool last;
	__shared__ int sbin, sn;
	int r = blockIdx.y, c = blockIdx.x, nc = gridDim.x;
	SampleArgs a = args[r];
	int lo = c * ROW_CHUNK, n = min(V - lo, ROW_CHUNK);
	int topK = a.topK > 0 && a.topK < V ? a.topK : 0;
	// Candidates: the largest `need` logits (0: as many as fit).
	int need = a.temperature > 0.f ? (topK > 0 ? max(topK, a.nTop) : 0) : a.nTop;
	bool cands = SAMPLE_FAST && (a.temperature > 0.f || a.nTop > 0) && need <= SAMPLE_CAP;
	if (cands)
		for (int b = threadIdx.x; b < SAMPLE_BINS; b += blockDim.x) sh[b] = 0;
	const float *lg = logits + (long)r * V + lo;
	for (int i = threadIdx.x; i < n; i += blockDim.x) zs[i] = lg[i];
	__syncthreads();
	if (penalised(a)) {
		// Penalties (OpenAI / vLLM convention), then the bias, then the mask
		// (masked tokens weigh nothing in any sum and lose every comparison;
		// the host lists at most as many top tokens as the mask allows).
		for (int e = threadIdx.x; e < a.cntN; e += blockDim.x) {
			// 2 * (count among the generated tokens) + (1 if in the prompt).
			int tok = cnt[2 * (a.cntOff + e)] - lo, cp = cnt[2 * (a.cntOff + e) + 1], k = cp >> 1;
			if (tok < 0 || tok >= n || cp <= 0) continue;
			float v = zs[tok];
			if (a.repetition > 0.f && a.repetition != 1.f) v = v > 0.f ? v / a.repetition : v * a.repetition;
			if (k > 0) v -= a.frequency * k + a.presence;
			zs[tok] = v;
		}
		__syncthreads();
		for (int e = threadIdx.x; e < a.biasN; e += blockDim.x) {
			int tok = __float_as_int(bias[2 * (a.biasOff + e)]) - lo;
			if (tok >= 0 && tok < n) zs[tok] += bias[2 * (a.biasOff + e) + 1];
		}
		__syncthreads();
		float *zw = work + (long)r * V + lo;
		const unsigned long long *m = mask + a.maskOff;
		for (int i = threadIdx.x; i < n; i += blockDim.x) {
			if (a.maskOff >= 0 && !((m[(lo + i) >> 6] >> ((lo + i) & 63)) & 1ull)) zs[i] = -INF;
			zw[i] = zs[i];
		}
		__syncthreads();
	}
	float bv = -INF;
	int bi = V;
	for (int i = threadIdx.x; i < n; i += blockDim.x) {
		float v = zs[i];
		if (v > bv || bi == V) { bv = v; bi = lo + i; }
		if (cands && v > -INF) atomicAdd(&sh[key_bin(v)], 1);
	}
	for (int o = 16; o > 0; o >>= 1) {
		float ov = __shfl_xor_sync(0xffffffffu, bv, o);
		int oi = __shfl_xor_sync(0xffffffffu, bi, o);
		if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
	}
	if ((threadIdx.x & 31) == 0) { bestv[threadIdx.x >> 5] = bv; besti[threadIdx.x >> 5] = bi; }
	__syncthreads();
	bv = bestv[0], bi = besti[0];
	for (int w = 1; w < (int)(blockDim.x >> 5); w++)
		if (bestv[w] > bv || (bestv[w] == bv && besti[w] < bi)) { bv = bestv[w]; bi = besti[w]; }
	float it = a.temperature > 0.f ? 1.f / a.temperature : 0.f, se = 0.f, st = 0.f;
	if (bv > -INF)
		for (int i = threadIdx.x; i < n; i += blockDim.x) {
			se += __expf(zs[i] - bv);
			if (it > 0.f) st += __expf((zs[i] - bv) * it);
		}
	se = block_sum(se, red);
	st = block_sum(st, red);
	if (cands)
		for (int b = threadIdx.x; b < SAMPLE_BINS; b += blockDim.x)
			if (sh[b]) atomicAdd(&hist[(long)r * SAMPLE_BINS + b], sh[b]);
	__threadfence();  // every thread's adds reach the device before the block arrives
	__syncthreads();
	if (threadIdx.x == 0) {
		part[r * nc + c] = make_float4(bv, __int_as_float(bi), se, st);
		__threadfence();
		last = atomicAdd(&arrived[r], 1u) == (unsigned)nc - 1;
	}
	__syncthreads();
	if (!last)
		return;
	__threadfence();
	// The row: the chunks' largest in order (the first index among equals),
	// then their sums rescaled to it.
	bv = -INF, bi = V;
	for (int k = threadIdx.x; k < nc; k += blockDim.x) {
		float4 q = __ldcg(&part[r * nc + k]);
		int qi = __float_as_int(q.y);
		if (q.x > bv || (q.x == bv && qi < bi) || bi == V) { bv = q.x; bi = qi; }
	}
	for (int o = 16; o > 0; o >>= 1) {
		float ov = __shfl_xor_sync(0xffffffffu, bv, o);
		int oi = __shfl_xor_sync(0xffffffffu, bi, o);
		if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
	}
	__syncthreads();
	if ((threadIdx.x & 31) == 0) { bestv[threadIdx.x >> 5] = bv; besti[threadIdx.x >> 5] = bi; }
	__syncthreads();
	float mx = bestv[0];
	int tok = besti[0];
	for (int w = 1; w < (int)(blockDim.x >> 5); w++)
		if (bestv[w] > mx || (bestv[w] == mx && besti[w] < tok)) { mx = bestv[w]; tok = besti[w]; }
	se = 0.f, st = 0.f;
	for (int k = threadIdx.x; k < nc; k += blockDim.x) {
		float4 q = __ldcg(&part[r * nc + k]);
		if (q.x > -INF) {
			se += q.z * __expf(q.x - mx);
			st += q.w * __expf((q.x - mx) * it);
		}
	}
	se = block_sum(se, red);
	st = block_sum(st, red);
	// The candidates' bins, from the top: those that hold the need largest
	// (or as many as SAMPLE_CAP allows when need is 0).
	if (threadIdx.x == 0) sbin = -1;
	if (cands) {
		int *h = hist + (long)r * SAMPLE_BINS;
		const int per = SAMPLE_BINS / 256;  // bins a thread, descending
		int top = SAMPLE_BINS - 1 - per * (int)threadIdx.x, k = 0;
		for (int q = 0; q < per; q++) k += __ldcg(&h[top - q]);
		int cum = block_scan(k, ired), finite = ired[32];
		int want = min(need, finite);
		for (int q = 0; q < per; q++) {
			int b = top - q, hb = __ldcg(&h[b]);
			cum += hb;  // the finite logits in bins >= b
			bool at = need > 0 ? cum >= want && cum - hb < want : cum <= SAMPLE_CAP && (b == 0 || cum + __ldcg(&h[b - 1]) > SAMPLE_CAP);
			if (at && finite > 0) { sbin = b; sn = cum; }
		}
		__syncthreads();
		for (int b = threadIdx.x; b < SAMPLE_BINS; b += blockDim.x) h[b] = 0;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		bool ok = sbin >= 0 && sn > 0 && sn <= SAMPLE_CAP;
		plan[r] = SamplePlan{mx, mx + __logf(se), st, tok, ok ? sbin : -1, ok ? sn : 0, 0u, 0};
		arrived[r] = 0;
	}
}

// sample_gather writes the keys of a chunk's candidates (finite, in bins >=
// the plan's sbin) to the row's candidates, in no order.
extern "C" __global__ void __launch_bounds__(256) sample_gather(const float *logits, int V, const SampleArgs *args, const float *work,
		SamplePlan *plan, unsigned long long *keys) {
	int r = blockIdx.y, lo = blockIdx.x * ROW_CHUNK, n = min(V - lo, ROW_CHUNK);
	int sbin = plan[r].sbin;
	if (sbin < 0)
		return;
	const float *z = (penalised(args[r]) ? work : logits) + (long)r * V;
	unsigned long long *out = keys + (long)r * SAMPLE_CAP;
	for (int i0 = 0; i0 < n; i0 += blockDim.x) {  // whole warps: the ballot takes every lane
		int i = i0 + threadIdx.x;
		float v = i < n ? z[lo + i] : -INF;
		bool is = v > -INF && key_bin(v) >= sbin;
		unsigned bal = __ballot_sync(0xffffffffu, is);
		if (!bal)
			continue;
		int lane = threadIdx.x & 31, lead = __ffs(bal) - 1;
		unsigned base = 0;
		if (lane == lead) base = atomicAdd(&plan[r].gathered, (unsigned)__popc(bal));
		base = __shfl_sync(0xffffffffu, base, lead);
		unsigned slot = base + __popc(bal & ((1u << lane) - 1));
		if (is && slot < SAMPLE_CAP) out[slot] = sort_key(v, lo + i);
	}
}

// sample_rows draws a row's token: among its candidates, sorted here, or
// over the whole row with radix selects; and lists its top
// log-probabilities.
extern "C" __global__ void __launch_bounds__(1024, 1) sample_rows(const float *logits, int V, const SampleArgs *args, const float *work,
		const SamplePlan *plan, const unsigned long long *keys, int *outTok, float *outLp, int *topTok, float *topLp, int maxTop) {
	__shared__ float red[33];
	__shared__ unsigned long long ckeys[SAMPLE_CAP];
	// The candidates' cumulative probabilities, or select_desc's sums by bin.
	__shared__ float cum[SAMPLE_CAP];
	__shared__ float whist[SEL_HISTS * 256];
	__shared__ unsigned long long skey;
	__shared__ float srem;
	__shared__ int sfirst;
	int r = blockIdx.x;
	SampleArgs a = args[r];
	SamplePlan pl = plan[r];
	const float *z = (penalised(a) ? work : logits) + (long)r * V;
	int topK = a.topK > 0 && a.topK < V ? a.topK : 0;
	float mx = pl.mx, logZ = pl.logZ, it = a.temperature > 0.f ? 1.f / a.temperature : 0.f;
	int tok = pl.tok, sbin = pl.sbin, n = pl.sn;
	bool cands = sbin >= 0;
	if (cands) {
		// Bitonic sort, descending, padded to a power of two with keys below
		// any logit's.
		int N2 = 2;
		while (N2 < n) N2 <<= 1;
		for (int j = threadIdx.x; j < N2; j += blockDim.x) ckeys[j] = j < n ? keys[(long)r * SAMPLE_CAP + j] : 0ull;
		__syncthreads();
		for (int k = 2; k <= N2; k <<= 1)
			for (int j = k >> 1; j > 0; j >>= 1) {
				int t = threadIdx.x;
				if (t < N2 / 2) {
					int i = ((t & ~(j - 1)) << 1) | (t & (j - 1));
					unsigned long long x = ckeys[i], y = ckeys[i + j];
					if ((i & k) == 0 ? x < y : x > y) { ckeys[i] = y; ckeys[i + j] = x; }
				}
				__syncthreads();
			}
	}

	bool drawn = false;
	if (a.temperature > 0.f && cands) {
		// Cumulative probabilities of the first nk candidates; full: the
		// candidates hold every token the filters could keep.
		int nk = topK > 0 ? min(topK, n) : n;
		bool full = topK > 0 || sbin == 0;
		int t2 = 2 * threadIdx.x;
		float p0 = t2 < nk ? __expf((key_value(ckeys[t2]) - mx) * it) : 0.f;
		float p1 = t2 + 1 < nk ? __expf((key_value(ckeys[t2 + 1]) - mx) * it) : 0.f;
		float ex = block_scan(p0 + p1, red), total = full ? red[32] : pl.sT;
		cum[t2] = ex + p0;
		cum[t2 + 1] = ex + p0 + p1;
		__syncthreads();
		int keep = nk;
		bool known = full;  // the kept tokens are the first keep candidates
		if (a.minP > 0.f) {
			// p_i >= minP * p_max  <=>  z_i >= mx + T * log(minP)
			float zmin = mx + a.temperature * __logf(a.minP);
			int m = first_where(nk, [&](int j) { return key_value(ckeys[j]) < zmin; }, &sfirst);
			keep = max(m, 1);
			known = known || m < nk || key_bin(zmin) >= sbin;
		}
		if (a.topP > 0.f && a.topP < 1.f) {
			// The shortest prefix of at least topP of the mass.
			float target = a.topP * total;
			int m = first_where(nk, [&](int j) { return cum[j] >= target; }, &sfirst);
			if (m < nk) {
				keep = min(keep, m + 1);
				known = true;
			}
		}
		// Temperature alone, past the candidates: the draw may still land
		// among them.
		bool alone = !known && a.minP <= 0.f && !(a.topP > 0.f && a.topP < 1.f);
		if (known || alone) {
			float mass = known ? cum[keep - 1] : pl.sT, target = a.uniform * mass;
			int j = first_where(keep, [&](int j) { return cum[j] > target; }, &sfirst);
			if (j < keep || known) {
				tok = key_index(ckeys[min(j, keep - 1)]);  // rounding left the target past the end: the last kept
				drawn = true;
			}
		}
		__syncthreads();
	}
	if (a.temperature > 0.f && !drawn) {
		// Candidates are the keys >= floor; each filter raises floor (top-p's
		// mass is renormalised over the top-k candidates, before min-p).
		unsigned long long floor = 0;
		if (topK > 0)
			floor = select_desc(z, V, floor, (float)(topK - 1) + 0.5f, [](int) { return 1.f; }, whist, cum, &skey, &srem, &sfirst);
		auto prob = [&](int i) { return __expf((z[i] - mx) * it); };
		if (a.topP > 0.f && a.topP < 1.f) {
			float s = 0.f;
			for (int i = threadIdx.x; i < V; i += blockDim.x)
				if (sort_key(z[i], i) >= floor) s += prob(i);
			s = block_sum(s, red);
			floor = select_desc(z, V, floor, a.topP * s, prob, whist, cum, &skey, &srem, &sfirst);
		}
		if (a.minP > 0.f) {
			float zmin = mx + a.temperature * __logf(a.minP);
			unsigned long long mk = sort_key(zmin, 0x7fffffff);
			if (mk > floor) floor = mk;
		}
		float s = 0.f;
		for (int i = threadIdx.x; i < V; i += blockDim.x)
			if (sort_key(z[i], i) >= floor) s += prob(i);
		s = block_sum(s, red);
		tok = key_index(select_desc(z, V, floor, a.uniform * s, prob, whist, cum, &skey, &srem, &sfirst));
	}
	if (threadIdx.x == 0) {
		outTok[r] = tok;
		outLp[r] = z[tok] - logZ;
	}
	// Top log-probabilities: the first candidates, or repeated arg-max
	// below the previous key.
	int nTop = min(a.nTop, maxTop);
	if (cands && nTop <= n) {
		for (int j = threadIdx.x; j < nTop; j += blockDim.x) {
			topTok[r * maxTop + j] = key_index(ckeys[j]);
			topLp[r * maxTop + j] = key_value(ckeys[j]) - logZ;
		}
		return;
	}
	unsigned long long below = ~0ull;
	for (int j = 0; j < nTop; j++) {
		unsigned long long best = 0;
		for (int i = threadIdx.x; i < V; i += blockDim.x) {
			unsigned long long k = sort_key(z[i], i);
			if (k < below && k > best) best = k;
		}
		// Block max of 64-bit keys through shared memory.
		if (threadIdx.x == 0) skey = 0;
		__syncthreads();
		atomicMax(&skey, best);
		__syncthreads();
		below = skey;
		__syncthreads();
		if (threadIdx.x == 0) {
			int i = key_index(below);
			topTok[r * maxTop + j] = i;
			topLp[r * maxTop + j] = z[i] - logZ;
		}
	}
}

// feed_tokens takes a step's tokens that the last sampling drew (fed[t] is
// its row, -1 for a token the host gave) from that sampling's results on
// the device, so that a decode step can be issued before they reach the
// host.
extern "C" __global__ void feed_tokens(int *tokens, const int *fed, int T, const int *sampled) {
	int t = blockIdx.x * blockDim.x + threadIdx.x;
	if (t < T && fed[t] >= 0)
		tokens[t] = sampled[fed[t]];
}

// argmax_rows is the sampler for rows that ask only for the largest logit
// (greedy, no penalties, bias, mask or log-probabilities): sample_scan's
// merge alone, ROW_CHUNK logits a block, the last of a row's blocks to
// finish merging their partials in order. The same token as the sampler's:
// the first index of the largest value.
extern "C" __global__ void __launch_bounds__(256) argmax_rows(const float *logits, int V, float *partV, int *partI,
		unsigned *arrived, int *outTok) {
	__shared__ float bestv[8];
	__shared__ int besti[8];
	__shared__ bool last;
	int r = blockIdx.y, c = blockIdx.x, nc = gridDim.x;
	const float *z = logits + (long)r * V;
	int lo = c * ROW_CHUNK, hi = min(V, lo + ROW_CHUNK);
	float bv = -INF;
	int bi = V;
	for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
		float v = z[i];
		if (v > bv || bi == V) { bv = v; bi = i; }
	}
	for (int o = 16; o > 0; o >>= 1) {
		float ov = __shfl_xor_sync(0xffffffffu, bv, o);
		int oi = __shfl_xor_sync(0xffffffffu, bi, o);
		if (ov > bv || (ov == bv && oi < bi) || (bi == V && oi < V)) { bv = ov; bi = oi; }
	}
	if ((threadIdx.x & 31) == 0) { bestv[threadIdx.x >> 5] = bv; besti[threadIdx.x >> 5] = bi; }
	__syncthreads();
	if (threadIdx.x == 0) {
		for (int w = 1; w < (int)(blockDim.x >> 5); w++)
			if (bestv[w] > bv || (bestv[w] == bv && besti[w] < bi) || (bi == V && besti[w] < V)) { bv = bestv[w]; bi = besti[w]; }
		partV[r * nc + c] = bv;
		partI[r * nc + c] = bi;
		__threadfence();
		last = atomicAdd(&arrived[r], 1u) == (unsigned)nc - 1;
	}
	__syncthreads();
	if (!last || threadIdx.x != 0)
		return;
	__threadfence();
	bv = __ldcg(&partV[r * nc]);
	bi = __ldcg(&partI[r * nc]);
	for (int k = 1; k < nc; k++) {
		float ov = __ldcg(&partV[r * nc + k]);
		int oi = __ldcg(&partI[r * nc + k]);
		if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
	}
	outTok[r] = bi;
	arrived[r] = 0;
}
