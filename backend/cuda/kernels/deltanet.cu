// Gated DeltaNet (Qwen3-Next, Qwen3.5): the causal conv over each
// sequence's conv history, then the gated delta rule token by token over
// its recurrent state (long prompts: the chunked form, deltanet_chunk.cu).
// The state cache holds, per layer, every slot's conv history [K-1, CD] and
// then every slot's state [HV, dk, dv], f32; a sequence at position 0 starts
// from zeros, whatever its slot holds.

// dn_conv_hist: grid (S, ceil(CD / 256)), block 256, after dn_conv: each
// sequence's history becomes the last K-1 rows of [history | new inputs].
// A thread owns one channel and walks the rows upwards, so a row is read
// before it is overwritten.
extern "C" __global__ void dn_conv_hist(float *hist, const float *x, int ldx, int CD, int K, int convN, const int *seqpos, const int *seqn,
		const int *seqstart, const int *slots) {
	int s = blockIdx.x, ch = blockIdx.y * blockDim.x + threadIdx.x;
	int n = seqn[s];
	if (ch >= CD || n == 0) return;
	float *h = hist + (long)slots[s] * convN;
	bool fresh = seqpos[s] == 0;
	for (int r = 0; r < K - 1; r++) {
		int c = n + r;  // index in [history (K-1) | new (n)]
		h[r * CD + ch] = c < K - 1 ? (fresh ? 0.f : h[c * CD + ch]) : x[(long)(seqstart[s] + c - (K - 1)) * ldx + ch];
	}
}

// conv_tap moves a channel's window of its last K-1 inputs (win, M >= K-1
// registers; wc its K weights) on by input in and returns silu of the
// conv, summed in dn_conv's order.
template <int M>
__device__ __forceinline__ float conv_tap(const float *wc, float *win, int K, float in) {
	float acc = 0.f;
#pragma unroll
	for (int j = 0; j < M; j++)
		if (j < K - 1) acc += wc[j] * win[j];
#pragma unroll
	for (int j = 0; j <= M; j++)
		if (j == K - 1) acc += wc[j] * in;
#pragma unroll
	for (int j = 0; j < M; j++)
		if (j < K - 1) win[j] = j + 1 < K - 1 ? win[j + 1] : in;
	return acc / (1.f + __expf(-acc));
}

// conv_window loads channel ch's K weights and (unless fresh) its history
// of K-1 inputs from h ([K-1, CD]).
template <int M>
__device__ __forceinline__ void conv_window(float *wc, float *win, const void *w, int wdt, const float *h, int CD, int K, int ch, bool fresh) {
#pragma unroll
	for (int j = 0; j <= M; j++) {
		wc[j] = j < K ? ld(w, (long)ch * K + j, wdt) : 0.f;
		if (j < M) win[j] = j < K - 1 && !fresh ? h[j * CD + ch] : 0.f;
	}
}

// dn_conv: grid (ceil(T / DN_CONV_RUN), ceil(CD / 256)), block 256: a
// thread a channel over a run of DN_CONV_RUN tokens, its last K-1 inputs in
// registers (K <= DN_CONV_MAXK). y[t, ch] = silu(sum_j w[ch, j] * in(i -
// (K-1) + j)) where in() is the sequence's new input row (x's rows are ldx
// floats apart: the projection may hold z after the conv's inputs), or its
// conv history for negative indices. (A block a token took 227 us of a 4K
// prompt at Qwen3-Next's 8192 channels on an H200, 3.6x its bytes: every
// thread waited on two dependent loads for four taps.)
extern "C" __global__ void dn_conv(float *y, const float *x, int ldx, const void *w, int wdt, const float *hist, int T, int CD, int K,
		int convN, const int *tokseq, const int *seqpos, const int *seqstart, const int *slots) {
	const int M = DN_CONV_MAXK - 1, U = 8;
	int ch = blockIdx.y * blockDim.x + threadIdx.x, t0 = blockIdx.x * DN_CONV_RUN, t1 = min(T, t0 + DN_CONV_RUN);
	if (ch >= CD) return;
	float wc[M + 1], win[M];
#pragma unroll
	for (int j = 0; j <= M; j++) wc[j] = j < K ? ld(w, (long)ch * K + j, wdt) : 0.f;
	int s = -1;
	for (int tb = t0; tb < t1; tb += U) {
		float in[U];
#pragma unroll
		for (int u = 0; u < U; u++) in[u] = tb + u < t1 ? x[(long)(tb + u) * ldx + ch] : 0.f;
#pragma unroll
		for (int u = 0; u < U; u++) {
			int t = tb + u;
			if (t >= t1) break;
			if (tokseq[t] != s) {
				// The run starts, or a sequence does: the window from the
				// sequence's inputs before t, or its history.
				s = tokseq[t];
				int i = t - seqstart[s];
				bool fresh = seqpos[s] == 0;
				const float *h = hist + (long)slots[s] * convN;
#pragma unroll
				for (int j = 0; j < M; j++) {
					int src = i - (K - 1) + j;
					win[j] = j >= K - 1 ? 0.f : src >= 0 ? x[(long)(seqstart[s] + src) * ldx + ch] : fresh ? 0.f : h[(K - 1 + src) * CD + ch];
				}
			}
			y[(long)t * CD + ch] = conv_tap<M>(wc, win, K, in[u]);
		}
	}
}

// dn_conv_step: dn_conv and then dn_conv_hist in one pass, for steps whose
// sequences bring few tokens each (decode): grid (S, ceil(CD / 256)), block
// 256, a thread a (sequence, channel) taking the sequence's new tokens in
// turn with the last K-1 inputs in registers.
extern "C" __global__ void dn_conv_step(float *y, float *hist, const float *x, int ldx, const void *w, int wdt, int CD, int K, int convN,
		const int *seqpos, const int *seqn, const int *seqstart, const int *slots) {
	int s = blockIdx.x, ch = blockIdx.y * blockDim.x + threadIdx.x, n = seqn[s];
	if (ch >= CD || n == 0) return;
	float *h = hist + (long)slots[s] * convN;
	float win[DN_CONV_MAXK - 1], wc[DN_CONV_MAXK];
	conv_window<DN_CONV_MAXK - 1>(wc, win, w, wdt, h, CD, K, ch, seqpos[s] == 0);
	for (int i = 0; i < n; i++) {
		long t = seqstart[s] + i;
		y[t * CD + ch] = conv_tap<DN_CONV_MAXK - 1>(wc, win, K, x[t * ldx + ch]);
	}
#pragma unroll
	for (int j = 0; j < DN_CONV_MAXK - 1; j++)
		if (j < K - 1) h[j * CD + ch] = win[j];
}

// dn_recur: grid (S, HV, ceil(dv / 32)), 128 threads. Block (s, h, z) owns
// columns z*32 .. z*32+31 of value head h's state S [dk, dv] for sequence s
// (the delta rule keeps columns apart: only the norms of q and k are
// shared), lane l column z*32 + l, warp w the rows a = w + 4j, in registers
// (dk <= 4 * DR_ROWS). For each new token t: q and k L2-normalised (q also
// by 1/sqrt(dk)), beta = sigmoid(b), decay = exp(-exp(A_log) * softplus(a +
// dt_bias)), then u = S^T k; delta = beta (v - decay u); S = decay S + k
// delta^T; o = S^T q, the warps' parts of u and o summed through shared
// memory. (A block a head with the state in shared memory took 16 us a
// decode step of Qwen3-Next's 32 heads: 32 blocks.) Sequences of chunkMin
// tokens or more are dn_chunk_run's (deltanet_chunk.cu).
//
// x holds q, k and v (rows ldx floats apart), the conv's outputs; or, with
// convw set (a decode step's whole layer between its projections, K <=
// DN_STEP_MAXK), the conv's inputs: the block then runs the conv of the
// channels it reads (q and k of its key head, v of its columns), writes o
// to out (f32) and the gated RMSNorm to gout: w * rmsnorm(o) * silu(z) per
// value head, z's rows ldz floats apart. The heads that share a key head
// all read its q and k history and need each other's o for the norm, so
// the last of the group's blocks to finish (cnt: an arrival count per
// sequence and key head, zero between launches, which that block resets)
// moves the q and k history on and writes the group's norms.
#define DN_STEP_MAXK 4
struct DnFused {
	void *convw;  // 0: the conv and the norm are not dn_recur's
	int cwdt;
	float *hist;
	int convN, K;
	float *z;
	int ldz;
	void *normw;
	int nwdt;
	float eps;
	void *gout;
	int godt;
	int *cnt;
};
extern "C" __global__ void __launch_bounds__(128) dn_recur(float *out, const float *x, int ldx, const float *ba, const void *aLog, int adt,
		const void *dtBias, int bdt, float *state, int HK, int HV, int dk, int dv, int recN, int chunkMin, int tiled, DnFused f,
		const int *seqpos, const int *seqn, const int *seqstart, const int *slots) {
	__shared__ float q[4 * DR_ROWS], k[4 * DR_ROWS], part[2][4][32], red[32];
	__shared__ int last;
	pdl_trigger();  // the output projection may request its weights
	int s = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5, c = blockIdx.z * 32 + lane, n = seqn[s];
	if (n == 0 || n >= chunkMin) return;
	int r = HV / HK, kh = tiled ? h % HK : h / r, CD = 2 * HK * dk + HV * dv;
	int chq = kh * dk + threadIdx.x, chk = (HK + kh) * dk + threadIdx.x, chv = 2 * HK * dk + h * dv + c;
	bool col = c < dv, qk = threadIdx.x < dk, fresh = seqpos[s] == 0, conv = f.convw != 0;
	float *g = state + (long)slots[s] * recN + (long)h * dk * dv + c;
	float S[DR_ROWS];
#pragma unroll
	for (int j = 0; j < DR_ROWS; j++) {
		int a = w + 4 * j;
		S[j] = a < dk && col && !fresh ? g[(long)a * dv] : 0.f;
	}
	// The conv's windows and weights of the block's channels.
	const int M = DN_STEP_MAXK - 1;
	float *hs = conv ? f.hist + (long)slots[s] * f.convN : 0;
	float wq[M + 1], winq[M], wk[M + 1], wink[M], wv[M + 1], winv[M];
	if (conv) {
		if (qk) {
			conv_window<M>(wq, winq, f.convw, f.cwdt, hs, CD, f.K, chq, fresh);
			conv_window<M>(wk, wink, f.convw, f.cwdt, hs, CD, f.K, chk, fresh);
		}
		if (col) conv_window<M>(wv, winv, f.convw, f.cwdt, hs, CD, f.K, chv, fresh);
	}
	float A = -__expf(ld(aLog, h, adt)), bias = ld(dtBias, h, bdt), qs = rsqrtf((float)dk);
	// The state, the conv's history and the weights are this layer's, last
	// written by earlier steps: loaded before waiting for the projections.
	pdl_wait();
	for (int i = 0; i < n; i++) {
		long t = seqstart[s] + i;
		const float *row = x + t * ldx;
		float qv = 0.f, kv = 0.f;
		if (qk) {
			qv = conv ? conv_tap<M>(wq, winq, f.K, row[chq]) : row[chq];
			kv = conv ? conv_tap<M>(wk, wink, f.K, row[chk]) : row[chk];
			q[threadIdx.x] = qv;
			k[threadIdx.x] = kv;
		}
		float qn = block_sum(qv * qv, red);  // its barriers also publish q and k
		float kn = block_sum(kv * kv, red);
		float qi = rsqrtf(qn + 1e-6f) * qs, ki = rsqrtf(kn + 1e-6f);
		float beta = 1.f / (1.f + __expf(-ba[t * 2 * HV + h]));
		float xa = ba[t * 2 * HV + HV + h] + bias;
		float decay = __expf(A * (xa > 20.f ? xa : log1pf(__expf(xa))));
		float u = 0.f;
#pragma unroll
		for (int j = 0; j < DR_ROWS; j++)
			if (w + 4 * j < dk) u += k[w + 4 * j] * S[j];
		part[0][w][lane] = u;
		__syncthreads();
		u = part[0][0][lane] + part[0][1][lane] + part[0][2][lane] + part[0][3][lane];
		float v = !col ? 0.f : conv ? conv_tap<M>(wv, winv, f.K, row[chv]) : row[chv];
		float delta = beta * (v - decay * u * ki);
		float o = 0.f;
#pragma unroll
		for (int j = 0; j < DR_ROWS; j++) {
			int a = w + 4 * j;
			if (a < dk) {
				S[j] = decay * S[j] + k[a] * ki * delta;
				o += q[a] * S[j];
			}
		}
		part[1][w][lane] = o;
		__syncthreads();  // also: every warp is done with q, k and part[0]
		if (w == 0 && col) out[t * HV * dv + h * dv + c] = (part[1][0][lane] + part[1][1][lane] + part[1][2][lane] + part[1][3][lane]) * qi;
	}
#pragma unroll
	for (int j = 0; j < DR_ROWS; j++) {
		int a = w + 4 * j;
		if (a < dk && col) g[(long)a * dv] = S[j];
	}
	if (!conv) return;
	if (w == 0 && col) {
#pragma unroll
		for (int j = 0; j < M; j++)
			if (j < f.K - 1) hs[j * CD + chv] = winv[j];
	}
	__threadfence();  // o before the arrival
	__syncthreads();
	if (threadIdx.x == 0) last = atomicAdd(f.cnt + s * HK + kh, 1) == r * gridDim.z - 1;
	__syncthreads();
	if (!last) return;
	if (threadIdx.x == 0) f.cnt[s * HK + kh] = 0;
	if (qk) {
#pragma unroll
		for (int j = 0; j < M; j++)
			if (j < f.K - 1) {
				hs[j * CD + chq] = winq[j];
				hs[j * CD + chk] = wink[j];
			}
	}
	// A warp a (token, head) of the group: the norm over the head's dv
	// outputs, read past L1 (other blocks wrote them).
	for (int p = w; p < r * n; p += 4) {
		int hh = tiled ? kh + (p % r) * HK : kh * r + p % r;
		long t = seqstart[s] + p / r, base = t * HV * dv + hh * dv;
		float ss = 0.f;
		for (int j = lane; j < dv; j += 32) {
			float ov = __ldcg(out + base + j);
			ss += ov * ov;
		}
		float rs = rsqrtf(warp_sum(ss) / dv + f.eps);
		for (int j = lane; j < dv; j += 32) {
			float zv = f.z[t * f.ldz + hh * dv + j];
			st(f.gout, base + j, f.godt, ld(f.normw, j, f.nwdt) * (__ldcg(out + base + j) * rs) * (zv / (1.f + __expf(-zv))));
		}
	}
}
