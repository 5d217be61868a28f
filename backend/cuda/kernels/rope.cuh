// The rotary embedding and the per-head q/k RMSNorm before it, shared by
// qk_norm_rope (attention.cu) and the fused decode attention (flash.cu).

struct RopeFreq {
	float f[128];  // RotaryDim/2 inverse frequencies
};

// ld4 and st4 move four consecutive elements (from an index that is a
// multiple of four) of an f32, bf16 or f16 array.
__device__ __forceinline__ float4 ld4(const void *p, long i, int dt) {
	if (dt == DT_BF16) {
		uint2 u = *(const uint2 *)((const u16 *)p + i);
		return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
	}
	if (dt == DT_F32) return *(const float4 *)((const float *)p + i);
	return make_float4(ld(p, i, dt), ld(p, i + 1, dt), ld(p, i + 2, dt), ld(p, i + 3, dt));
}

__device__ __forceinline__ void st4(void *p, long i, int dt, float4 v) {
	if (dt == DT_BF16) *(uint2 *)((u16 *)p + i) = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
	else if (dt == DT_F32) *(float4 *)((float *)p + i) = v;
	else { st(p, i, dt, v.x); st(p, i + 1, dt, v.y); st(p, i + 2, dt, v.z); st(p, i + 3, dt, v.w); }
}

// rope_table fills cs and sn with the cos and sin (times attnFactor) of a
// position's angles, rounded to float32 as transformers computes them,
// then cos and sin in double; the block's threads share the work.
__device__ __forceinline__ void rope_table(float *cs, float *sn, int pos, int half, float attnFactor, const RopeFreq &rf) {
	for (int i = threadIdx.x; i < half; i += blockDim.x) {
		float a = (float)pos * rf.f[i];
		double s, c;
		sincos((double)a, &s, &c);
		cs[i] = (float)c * attnFactor;
		sn[i] = (float)s * attnFactor;
	}
}

// head_norm_rope is a warp's work on one head of hd elements (hd % 4 == 0)
// at src of qkv (type qdt): the RMSNorm of weight w, then its first rd dims
// rotated by the table cs, sn (NeoX style: rotate-half within them). hb is
// the warp's hd floats of shared memory; each lane hands four consecutive
// outputs i..i+3 to put(i, v).
template <typename Put>
__device__ __forceinline__ void head_norm_rope(const void *qkv, long src, int qdt, const float *w, float eps,
		const float *cs, const float *sn, int hd, int rd, float *hb, Put put) {
	int lane = threadIdx.x & 31, half = rd / 2;
	float ss = 0.f;
	for (int i = 4 * lane; i < hd; i += 128) {
		float4 v = ld4(qkv, src + i, qdt);
		*(float4 *)(hb + i) = v;
		ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
	}
	float sc = rsqrtf(warp_sum(ss) / hd + eps);
	for (int i = 4 * lane; i < hd; i += 128) {
		float4 v = *(float4 *)(hb + i);
		*(float4 *)(hb + i) = make_float4(v.x * sc * w[i], v.y * sc * w[i + 1], v.z * sc * w[i + 2], v.w * sc * w[i + 3]);
	}
	__syncwarp();
	for (int i = 4 * lane; i < hd; i += 128) {
		float o[4];
#pragma unroll
		for (int e = 0; e < 4; e++) {
			int k = i + e;
			float v = hb[k];
			if (k < rd) {
				int j = k < half ? k : k - half;
				v = k < half ? v * cs[j] - hb[k + half] * sn[j] : v * cs[j] + hb[j] * sn[j];
			}
			o[e] = v;
		}
		put(i, make_float4(o[0], o[1], o[2], o[3]));
	}
	__syncwarp();
}
