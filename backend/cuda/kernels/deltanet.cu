// Gated DeltaNet (Qwen3-Next, Qwen3.5): the causal conv over each
// sequence's conv history, then the gated delta rule token by token over
// its recurrent state (long prompts: the chunked form, deltanet_chunk.cu).
// The state cache holds, per layer, every slot's conv history [K-1, CD] and
// then every slot's state [HV, dk, dv], f32; a sequence at position 0 starts
// from zeros, whatever its slot holds.

// dn_conv: grid (T, ceil(CD / 256)), block 256. y[t, ch] = silu(sum_j
// w[ch, j] * in(i - (K-1) + j)) where in() is the sequence's new input row,
// or its conv history for negative indices.
extern "C" __global__ void dn_conv(float *y, const float *x, const void *w, int wdt, const float *hist, int CD, int K, int convN,
		const int *tokseq, const int *seqpos, const int *seqstart, const int *slots) {
	int t = blockIdx.x, ch = blockIdx.y * blockDim.x + threadIdx.x;
	if (ch >= CD) return;
	int s = tokseq[t], i = t - seqstart[s];
	bool fresh = seqpos[s] == 0;
	const float *h = hist + (long)slots[s] * convN;
	float acc = 0.f;
	for (int j = 0; j < K; j++) {
		int src = i - (K - 1) + j;
		float v = src >= 0 ? x[(long)(seqstart[s] + src) * CD + ch] : fresh ? 0.f : h[(K - 1 + src) * CD + ch];
		acc += ld(w, (long)ch * K + j, wdt) * v;
	}
	y[(long)t * CD + ch] = acc / (1.f + __expf(-acc));
}

// dn_conv_hist: grid (S, ceil(CD / 256)), block 256, after dn_conv: each
// sequence's history becomes the last K-1 rows of [history | new inputs].
// A thread owns one channel and walks the rows upwards, so a row is read
// before it is overwritten.
extern "C" __global__ void dn_conv_hist(float *hist, const float *x, int CD, int K, int convN, const int *seqpos, const int *seqn,
		const int *seqstart, const int *slots) {
	int s = blockIdx.x, ch = blockIdx.y * blockDim.x + threadIdx.x;
	int n = seqn[s];
	if (ch >= CD || n == 0) return;
	float *h = hist + (long)slots[s] * convN;
	bool fresh = seqpos[s] == 0;
	for (int r = 0; r < K - 1; r++) {
		int c = n + r;  // index in [history (K-1) | new (n)]
		h[r * CD + ch] = c < K - 1 ? (fresh ? 0.f : h[c * CD + ch]) : x[(long)(seqstart[s] + c - (K - 1)) * CD + ch];
	}
}

// dn_recur: grid (S, HV), block dv threads, dynamic shared memory dk * dv +
// 2 * dk floats (Go: dnRecurSmem). Block (s, h) holds value head h's state S [dk, dv] in
// shared memory (thread c owns column c) and for each new token t of
// sequence s: q and k L2-normalised (q also by 1/sqrt(dk)), beta =
// sigmoid(b), decay = exp(-exp(A_log) * softplus(a + dt_bias)), then
// u = S^T k; delta = beta (v - decay u); S = decay S + k delta^T; o = S^T q.
// Sequences of chunkMin tokens or more are dn_chunk_run's (deltanet_chunk.cu).
extern "C" __global__ void dn_recur(float *out, const float *qkv, const float *ba, const void *aLog, int adt, const void *dtBias,
		int bdt, float *state, int HK, int HV, int dk, int dv, int recN, int chunkMin, int tiled, const int *seqpos, const int *seqn,
		const int *seqstart, const int *slots) {
	extern __shared__ float dsm[];
	__shared__ float red[32];
	float *S = dsm, *q = S + dk * dv, *k = q + dk;
	int s = blockIdx.x, h = blockIdx.y, c = threadIdx.x, n = seqn[s];
	if (n == 0 || n >= chunkMin) return;
	int kh = tiled ? h % HK : h / (HV / HK), CD = 2 * HK * dk + HV * dv;
	float *g = state + (long)slots[s] * recN + (long)h * dk * dv;
	bool fresh = seqpos[s] == 0;
	for (int a = 0; a < dk; a++) S[a * dv + c] = fresh ? 0.f : g[a * dv + c];
	float A = -__expf(ld(aLog, h, adt)), bias = ld(dtBias, h, bdt), qs = rsqrtf((float)dk);
	for (int i = 0; i < n; i++) {
		long t = seqstart[s] + i;
		const float *row = qkv + t * CD;
		float qv = 0.f, kv = 0.f;
		for (int a = c; a < dk; a += dv) {
			qv = row[kh * dk + a];
			kv = row[(HK + kh) * dk + a];
			q[a] = qv;
			k[a] = kv;
		}
		// Norms over dk elements (dk <= dv: a thread holds at most one).
		float qn = block_sum(c < dk ? qv * qv : 0.f, red);
		float kn = block_sum(c < dk ? kv * kv : 0.f, red);
		float qi = rsqrtf(qn + 1e-6f) * qs, ki = rsqrtf(kn + 1e-6f);
		float beta = 1.f / (1.f + __expf(-ba[t * 2 * HV + h]));
		float x = ba[t * 2 * HV + HV + h] + bias;
		float decay = __expf(A * (x > 20.f ? x : log1pf(__expf(x))));
		float v = row[2 * HK * dk + h * dv + c];
		float u = 0.f;
		for (int a = 0; a < dk; a++) u += k[a] * S[a * dv + c];
		float delta = beta * (v - decay * u * ki);
		float o = 0.f;
		for (int a = 0; a < dk; a++) {
			float sa = decay * S[a * dv + c] + k[a] * ki * delta;
			S[a * dv + c] = sa;
			o += q[a] * sa;
		}
		out[t * HV * dv + h * dv + c] = o * qi;
		__syncthreads();  // q and k are overwritten by the next token
	}
	for (int a = 0; a < dk; a++) g[a * dv + c] = S[a * dv + c];
}
