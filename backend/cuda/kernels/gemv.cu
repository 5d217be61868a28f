// Decode GEMV / skinny GEMM: out[t, o] (+)= sum_i x[t, i] * w[o, i] for a few
// tokens t, with bf16 weights streamed once with 16-byte loads. Each warp owns
// one output row. Requires I % 8 == 0.

template <int NT>
__device__ __forceinline__ void dot8(float (&acc)[NT], uint4 v, const float *x, int I, int k) {
	float w[8];
	unpack8(v, w);
#pragma unroll
	for (int t = 0; t < NT; t++) {
		const float4 *xr = (const float4 *)(x + (long)t * I + k * 8);
		float4 a = xr[0], b = xr[1];
		acc[t] += w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
	}
}

// ldw streams a weight vector past L1 (the weights are read once; L1 keeps
// the activations that every warp of the SM re-reads).
__device__ __forceinline__ uint4 ldw(const uint4 *p) {
	uint4 v;
	asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
	return v;
}

// Each lane keeps U weight vectors in flight and requests the next U before
// using these, so its stream has no gaps (four pipelined measured 2% faster
// at batch 1 than eight unpipelined, and than sixteen in one go; see
// NOTES.md). Launched overlapped (programmatic dependent launch): the first
// vectors are requested before pdl_wait, so the weight stream is under way
// when the previous kernel (which writes x) finishes.
template <int NT, int U>
__device__ __forceinline__ void gemv_bf16(float *out, const float *x, const u16 *w, int O, int I, int accumulate) {
	pdl_trigger();
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	int row = blockIdx.x * (blockDim.x >> 5) + warp;
	if (row >= O) return;
	const uint4 *wr = (const uint4 *)(w + (long)row * I) + lane;
	int rounds = (I >> 3) / (32 * U);
	float acc[NT];
#pragma unroll
	for (int t = 0; t < NT; t++) acc[t] = 0.f;
	uint4 v[U];
	if (rounds > 0) {
#pragma unroll
		for (int u = 0; u < U; u++) v[u] = ldw(wr + 32 * u);
	}
	pdl_wait();
	for (int r = 0; r < rounds; r++) {
		int k = lane + r * 32 * U;
		uint4 nv[U];
		if (r + 1 < rounds) {
#pragma unroll
			for (int u = 0; u < U; u++) nv[u] = ldw(wr + 32 * (U * (r + 1) + u));
		}
#pragma unroll
		for (int u = 0; u < U; u++) dot8<NT>(acc, v[u], x, I, k + 32 * u);
#pragma unroll
		for (int u = 0; u < U; u++) v[u] = nv[u];
	}
	for (int k = lane + rounds * 32 * U; k < (I >> 3); k += 32) dot8<NT>(acc, ldw(wr + k - lane), x, I, k);
#pragma unroll
	for (int t = 0; t < NT; t++) {
		float s = warp_sum(acc[t]);
		if (lane == 0) {
			float *o = out + (long)t * O + row;
			*o = accumulate ? *o + s : s;
		}
	}
}

#define GEMV(NT) \
	extern "C" __global__ void __launch_bounds__(256) gemv_bf16_##NT(float *out, const float *x, const u16 *w, int O, int I, int acc) { \
		gemv_bf16<NT, 4>(out, x, w, O, I, acc); \
	}
GEMV(1)
GEMV(2)
GEMV(3)
GEMV(4)
GEMV(5)
GEMV(6)
GEMV(7)
GEMV(8)
