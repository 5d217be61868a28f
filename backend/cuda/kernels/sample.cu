// On-device sampling: one block of 1024 threads per row of logits. Only the
// drawn token, its log-probability and the requested top log-probabilities
// leave the device.

struct SampleArgs {
	float temperature, topP, minP, uniform;
	float presence, frequency, repetition;
	int topK, cntOff, cntN, biasOff, biasN, nTop, wantLp;
	int maskOff;  // word offset of the row's token mask (bit set: allowed), -1: none
};

// key orders (value desc, index asc) as a descending unsigned 64-bit key.
__device__ __forceinline__ unsigned long long sort_key(float v, int i) {
	unsigned u = __float_as_uint(v);
	u ^= (u >> 31) ? 0xffffffffu : 0x80000000u;
	return ((unsigned long long)u << 32) | (0xffffffffu - (unsigned)i);
}

__device__ __forceinline__ int key_index(unsigned long long k) { return (int)(0xffffffffu - (unsigned)(k & 0xffffffffu)); }

// select_desc walks the elements with key >= floor in descending key order,
// weighing element i by wt(i), and returns the key of the element at which
// the running sum first exceeds target (radix select, 8 bits per pass).
template <typename Wt>
__device__ unsigned long long select_desc(const float *z, int V, unsigned long long floor, float target, Wt wt,
		float *hist, unsigned long long *shared_key, float *shared_rem) {
	unsigned long long prefix = 0, mask = 0;
	if (threadIdx.x == 0) *shared_rem = target;
	for (int shift = 56; shift >= 0; shift -= 8) {
		for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0.f;
		__syncthreads();
		for (int i = threadIdx.x; i < V; i += blockDim.x) {
			unsigned long long k = sort_key(z[i], i);
			if (k >= floor && (k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255], wt(i));
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			float rem = *shared_rem, run = 0.f;
			int chosen = -1, last = -1;
			for (int b = 255; b >= 0; b--) {
				if (hist[b] <= 0.f) continue;
				last = b;
				if (run + hist[b] > rem) { chosen = b; break; }
				run += hist[b];
			}
			if (chosen < 0) {  // rounding left the target past the end: take the last element
				chosen = last < 0 ? 0 : last;
				run -= last < 0 ? 0.f : hist[last];
				rem = run + (last < 0 ? 0.f : hist[last]) * 0.5f;
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

extern "C" __global__ void __launch_bounds__(1024) sample_rows(const float *logits, int V, const SampleArgs *args,
		const int *cnt, const float *bias, const unsigned long long *mask, float *work, int *outTok, float *outLp, int *topTok, float *topLp, int maxTop) {
	__shared__ float red[32];
	__shared__ float hist[256];
	__shared__ unsigned long long skey;
	__shared__ float srem;
	__shared__ int sidx;
	__shared__ float bestv[32];
	__shared__ int besti[32];
	int r = blockIdx.x;
	SampleArgs a = args[r];
	const float *lg = logits + (long)r * V;
	// Penalties, bias and mask work on a copy; without them the logits are
	// read in place.
	bool pen = a.cntN > 0 || a.biasN > 0 || a.maskOff >= 0;
	const float *z = lg;
	if (pen) {
		float *zw = work + (long)r * V;
		for (int i = threadIdx.x; i < V; i += blockDim.x) zw[i] = lg[i];
		__syncthreads();
		// Penalties (OpenAI / vLLM convention), then the bias.
		for (int e = threadIdx.x; e < a.cntN; e += blockDim.x) {
			// 2 * (count among the generated tokens) + (1 if in the prompt).
			int tok = cnt[2 * (a.cntOff + e)], cp = cnt[2 * (a.cntOff + e) + 1], c = cp >> 1;
			if (tok < 0 || tok >= V || cp <= 0) continue;
			float v = zw[tok];
			if (a.repetition > 0.f && a.repetition != 1.f) v = v > 0.f ? v / a.repetition : v * a.repetition;
			if (c > 0) v -= a.frequency * c + a.presence;
			zw[tok] = v;
		}
		__syncthreads();
		for (int e = threadIdx.x; e < a.biasN; e += blockDim.x) {
			int tok = __float_as_int(bias[2 * (a.biasOff + e)]);
			if (tok >= 0 && tok < V) zw[tok] += bias[2 * (a.biasOff + e) + 1];
		}
		__syncthreads();
		// Masked tokens weigh nothing in any sum and lose every comparison
		// (the host lists at most as many top tokens as the mask allows).
		if (a.maskOff >= 0) {
			const unsigned long long *m = mask + a.maskOff;
			for (int i = threadIdx.x; i < V; i += blockDim.x)
				if (!((m[i >> 6] >> (i & 63)) & 1ull)) zw[i] = -INF;
			__syncthreads();
		}
		z = zw;
	}
	// The largest logit and its first index, in one pass: four at a time
	// where rows are 16-byte aligned (a vocabulary that is a multiple of
	// four), which quarters each thread's chain of dependent loads.
	float bv = -INF;
	int bi = V;
	int i0 = 0;
	if ((V & 3) == 0 && ((unsigned long)z & 15) == 0) {
		const float4 *z4 = (const float4 *)z;
		for (int j = threadIdx.x; j < (V >> 2); j += blockDim.x) {
			float4 v = z4[j];
			int i = 4 * j;
			if (v.x > bv || bi == V) { bv = v.x; bi = i; }
			if (v.y > bv) { bv = v.y; bi = i + 1; }
			if (v.z > bv) { bv = v.z; bi = i + 2; }
			if (v.w > bv) { bv = v.w; bi = i + 3; }
		}
		i0 = V;
	}
	for (int i = i0 + threadIdx.x; i < V; i += blockDim.x)
		if (z[i] > bv || bi == V) { bv = z[i]; bi = i; }
	for (int o = 16; o > 0; o >>= 1) {
		float ov = __shfl_xor_sync(0xffffffffu, bv, o);
		int oi = __shfl_xor_sync(0xffffffffu, bi, o);
		if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
	}
	if ((threadIdx.x & 31) == 0) { bestv[threadIdx.x >> 5] = bv; besti[threadIdx.x >> 5] = bi; }
	__syncthreads();
	if (threadIdx.x == 0) {
		for (int w = 1; w < (int)(blockDim.x >> 5); w++)
			if (bestv[w] > bv || (bestv[w] == bv && besti[w] < bi)) { bv = bestv[w]; bi = besti[w]; }
		sidx = bi;
		bestv[0] = bv;
	}
	__syncthreads();
	float mx = bestv[0];
	int tok = sidx;
	// log Z of the penalised distribution, when anything needs it.
	float logZ = 0.f;
	if (a.temperature > 0.f || a.wantLp || a.nTop > 0) {
		float se = 0.f;
		for (int i = threadIdx.x; i < V; i += blockDim.x) se += __expf(z[i] - mx);
		logZ = mx + __logf(block_sum(se, red));
	}

	if (a.temperature > 0.f) {
		float it = 1.f / a.temperature;
		// Candidates are the keys >= floor; each filter raises floor (top-p's
		// mass is renormalised over the top-k candidates, before min-p).
		unsigned long long floor = 0;
		if (a.topK > 0 && a.topK < V)
			floor = select_desc(z, V, floor, (float)(a.topK - 1) + 0.5f, [](int) { return 1.f; }, hist, &skey, &srem);
		auto prob = [&](int i) { return __expf((z[i] - mx) * it); };
		if (a.topP > 0.f && a.topP < 1.f) {
			float s = 0.f;
			for (int i = threadIdx.x; i < V; i += blockDim.x)
				if (sort_key(z[i], i) >= floor) s += prob(i);
			s = block_sum(s, red);
			floor = select_desc(z, V, floor, a.topP * s, prob, hist, &skey, &srem);
		}
		if (a.minP > 0.f) {
			// p_i >= minP * p_max  <=>  z_i >= mx + T * log(minP)
			float zmin = mx + a.temperature * __logf(a.minP);
			unsigned long long mk = sort_key(zmin, 0x7fffffff);
			if (mk > floor) floor = mk;
		}
		float s = 0.f;
		for (int i = threadIdx.x; i < V; i += blockDim.x)
			if (sort_key(z[i], i) >= floor) s += prob(i);
		s = block_sum(s, red);
		tok = key_index(select_desc(z, V, floor, a.uniform * s, prob, hist, &skey, &srem));
	}
	if (threadIdx.x == 0) {
		outTok[r] = tok;
		outLp[r] = z[tok] - logZ;
	}
	// Top log-probabilities: repeated arg-max below the previous key.
	unsigned long long below = ~0ull;
	for (int n = 0; n < a.nTop && n < maxTop; n++) {
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
			topTok[r * maxTop + n] = i;
			topLp[r * maxTop + n] = z[i] - logZ;
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

// argmax_rows is sample_rows for rows that ask only for the largest logit
// (greedy, no penalties, bias, mask or log-probabilities): one block of
// sample_rows reads a row of 151,936 logits at a multiprocessor's share of
// the bandwidth (14.5 us on an H200), so here ARGMAX_CHUNK logits a block,
// and the last of a row's blocks to finish merges their partials in order.
// The same token as sample_rows: the first index of the largest value.
extern "C" __global__ void __launch_bounds__(256) argmax_rows(const float *logits, int V, float *partV, int *partI,
		unsigned *arrived, int *outTok) {
	__shared__ float bestv[8];
	__shared__ int besti[8];
	__shared__ bool last;
	int r = blockIdx.y, c = blockIdx.x, nc = gridDim.x;
	const float *z = logits + (long)r * V;
	int lo = c * ARGMAX_CHUNK, hi = min(V, lo + ARGMAX_CHUNK);
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
