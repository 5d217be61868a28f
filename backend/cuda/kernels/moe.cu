// Mixture of experts: routing on the device and expert products that read
// the chosen expert's weights through device-side indices (graph-safe).
// Correct first: each (token, choice) pair is its own GEMV.

// moe_route: one block per token. Softmax over the E router logits (f32),
// top-k (ties: lower index first, as torch.topk), optional renormalisation.
// Each of the k picks is a block-wide argmax: one thread walking all E
// experts k times took 215 us a token at 512 experts and top 10.
extern "C" __global__ void moe_route(const float *logits, int E, int K, int norm, int *sel, float *wts) {
	__shared__ float p[1024];
	__shared__ float red[32], wv[32];
	__shared__ int wi[32];
	int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	const float *l = logits + (long)t * E;
	float mx = -INF;
	for (int i = threadIdx.x; i < E; i += blockDim.x) mx = fmaxf(mx, l[i]);
	mx = block_max(mx, red);
	float s = 0.f;
	for (int i = threadIdx.x; i < E; i += blockDim.x) {
		p[i] = expf(l[i] - mx);
		s += p[i];
	}
	s = block_sum(s, red);  // also orders the writes of p before the picks
	float tot = 0.f;
	for (int k = 0; k < K; k++) {
		// Taken experts hold -1, below every probability.
		float bv = -1.f;
		int bi = E;
		for (int i = threadIdx.x; i < E; i += blockDim.x)
			if (p[i] > bv) { bv = p[i]; bi = i; }
		for (int o = 16; o > 0; o >>= 1) {
			float ov = __shfl_xor_sync(0xffffffffu, bv, o);
			int oi = __shfl_xor_sync(0xffffffffu, bi, o);
			if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
		}
		if (lane == 0) { wv[warp] = bv; wi[warp] = bi; }
		__syncthreads();
		if (warp == 0) {
			bv = lane < nw ? wv[lane] : -1.f;
			bi = lane < nw ? wi[lane] : E;
			for (int o = 16; o > 0; o >>= 1) {
				float ov = __shfl_xor_sync(0xffffffffu, bv, o);
				int oi = __shfl_xor_sync(0xffffffffu, bi, o);
				if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
			}
			if (lane == 0) {
				sel[t * K + k] = bi;
				wts[t * K + k] = bv / s;
				tot += bv / s;
				p[bi] = -1.f;
			}
		}
		__syncthreads();
	}
	if (norm && threadIdx.x == 0)
		for (int k = 0; k < K; k++) wts[t * K + k] /= tot;
}

// moe_gemv: y[r, o] = sum_i x[r / xdiv, i] * w[sel[r], o, i] for rows r of
// (token, choice) pairs (sel == 0 and xdiv == 1: a plain per-row product).
// Grid (ceil(O / 8), R), block 256: a warp per output.
extern "C" __global__ void moe_gemv(float *y, const float *x, int xdiv, const void *w, int wdt, const int *sel, int O, int I) {
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int o = blockIdx.x * 8 + warp, r = blockIdx.y;
	if (o >= O) return;
	long e = sel ? sel[r] : 0;
	long base = (e * O + o) * I;
	const float *xr = x + (long)(r / xdiv) * I;
	float acc = 0.f;
	for (int i = lane; i < I; i += 32) acc += xr[i] * ld(w, base + i, wdt);
	acc = warp_sum(acc);
	if (lane == 0) y[(long)r * O + o] = acc;
}

// moe_combine: out[t, j] += sum_k wts[t, k] * y[t * K + k, j], and, with a
// shared expert, + sigmoid(gate[t]) * ys[t, j].
extern "C" __global__ void moe_combine(float *out, const float *y, const float *wts, int K, int H,
		const float *ys, const float *gate) {
	int t = blockIdx.x;
	float g = ys ? 1.f / (1.f + __expf(-gate[t])) : 0.f;
	for (int j = threadIdx.x; j < H; j += blockDim.x) {
		float a = out[(long)t * H + j];
		for (int k = 0; k < K; k++) a += wts[t * K + k] * y[((long)t * K + k) * H + j];
		if (ys) a += g * ys[(long)t * H + j];
		out[(long)t * H + j] = a;
	}
}
