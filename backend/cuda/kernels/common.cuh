// Shared helpers of kiln's kernels. No CUDA headers are included: bf16 and
// f16 values travel as unsigned short and are converted by hand, so the
// sources compile with a bare NVRTC.

#define INF __int_as_float(0x7f800000)
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

typedef unsigned short u16;
typedef unsigned char u8;

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((unsigned)h) << 16); }

__device__ __forceinline__ u16 f2bf(float f) {
	unsigned u = __float_as_uint(f);
	if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);  // NaN stays NaN
	u += 0x7fffu + ((u >> 16) & 1u);                                       // round to nearest even
	return (u16)(u >> 16);
}

__device__ __forceinline__ float h2f(u16 h) {
	float f;
	asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
	return f;
}

__device__ __forceinline__ u16 f2h(float f) {
	u16 h;
	asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
	return h;
}

// ld reads element i of an array of type dt as float.
__device__ __forceinline__ float ld(const void *p, long i, int dt) {
	if (dt == DT_BF16) return bf2f(((const u16 *)p)[i]);
	if (dt == DT_F16) return h2f(((const u16 *)p)[i]);
	return ((const float *)p)[i];
}

__device__ __forceinline__ void st(void *p, long i, int dt, float v) {
	if (dt == DT_BF16) ((u16 *)p)[i] = f2bf(v);
	else if (dt == DT_F16) ((u16 *)p)[i] = f2h(v);
	else ((float *)p)[i] = v;
}

// ld_cg reads past L1, where another block's partial sums may be stale.
__device__ __forceinline__ float ld_cg(const float *p) {
	float v;
	asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
	return v;
}

// qstore writes output i: bf16, or f32 written or added to.
__device__ __forceinline__ void qstore(void *out, int odt, int accumulate, long i, float v) {
	if (odt == DT_BF16) {
		((u16 *)out)[i] = f2bf(v);
	} else {
		float *o = (float *)out + i;
		*o = accumulate ? *o + v : v;
	}
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

// block_sum returns the sum over the block to every thread; red holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float *red) {
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	v = warp_sum(v);
	__syncthreads();
	if (lane == 0) red[w] = v;
	__syncthreads();
	v = lane < nw ? red[lane] : 0.f;
	return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float *red) {
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
	v = warp_max(v);
	__syncthreads();
	if (lane == 0) red[w] = v;
	__syncthreads();
	v = lane < nw ? red[lane] : -INF;
	return warp_max(v);
}

// unpack8 widens 8 bf16 values held in a 16-byte vector.
__device__ __forceinline__ void unpack8(uint4 v, float *f) {
	f[0] = __uint_as_float(v.x << 16); f[1] = __uint_as_float(v.x & 0xffff0000u);
	f[2] = __uint_as_float(v.y << 16); f[3] = __uint_as_float(v.y & 0xffff0000u);
	f[4] = __uint_as_float(v.z << 16); f[5] = __uint_as_float(v.z & 0xffff0000u);
	f[6] = __uint_as_float(v.w << 16); f[7] = __uint_as_float(v.w & 0xffff0000u);
}

// load8 reads 8 consecutive elements of a bf16 or f32 array with 16-byte loads.
__device__ __forceinline__ void load8(const u16 *p, float *f) { unpack8(*(const uint4 *)p, f); }
__device__ __forceinline__ void load8(const float *p, float *f) {
	float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
	f[0] = a.x; f[1] = a.y; f[2] = a.z; f[3] = a.w; f[4] = b.x; f[5] = b.y; f[6] = b.z; f[7] = b.w;
}

__device__ __forceinline__ float ldk(const u16 *p, long i) { return bf2f(p[i]); }
__device__ __forceinline__ float ldk(const float *p, long i) { return p[i]; }

// Programmatic dependent launch (sm_90 on). A kernel launched with it
// (runOverlapped) may start while the previous kernel still runs: it calls
// pdl_wait, which returns once that kernel has finished and its writes are
// visible, before touching any memory other kernels write or read. Kernels
// that such a launch follows call pdl_trigger early to let it start; both
// are no-ops otherwise.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
	asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// decode_chunk is the number of keys per split: the grid has S splits
// whatever the context (a captured graph replays it as contexts grow), and
// short contexts use only the first few, keeping each split's work worth a
// block: at least least keys (DS_MMA or DS_SCALAR).
__device__ __forceinline__ int decode_chunk(int n, int S, int least) { return max((n + S - 1) / S, least); }

// decode_active is how many of the S splits hold keys of a context of n.
__device__ __forceinline__ int decode_active(int n, int S, int least) {
	int c = decode_chunk(n, S, least);
	return min(S, (n + c - 1) / c);
}

// attn_store writes dim d of head h of token t's attention output o to out
// [T, H*HD], times the sigmoid of its gate for a gated layer (whose fused
// projection qkv holds per query head [query | gate], then the keys and
// values).
__device__ __forceinline__ void attn_store(void *out, int odt, const void *qkv, int qdt, int gated, long t, int h, int H, int KH,
		int HD, int d, float o) {
	if (gated) {
		long width = 2L * H * HD + 2L * KH * HD;
		float g = ld(qkv, t * width + (long)h * 2 * HD + HD + d, qdt);
		o *= 1.f / (1.f + __expf(-g));
	}
	st(out, ((long)t * H + h) * HD + d, odt, o);
}

// DecodeSplit is what block (t, kh, split) of a split-K decode attention
// grid (T, KH, S) attends: keys [k0, k1) of token t's sequence, through its
// block table bt; keys before cached were stored by earlier steps.
struct DecodeSplit {
	int t, kh, split, S, n, k0, k1, cached;
	const int *bt;
	// init returns false for an idle split (attn_combine reads only the
	// active ones).
	__device__ __forceinline__ bool init(const int *tokpos, const int *tokseq, const int *seqpos, const int *seqblk, const int *blocks,
			int least) {
		t = blockIdx.x, kh = blockIdx.y, split = blockIdx.z, S = gridDim.z;
		n = tokpos[t] + 1;
		int chunk = decode_chunk(n, S, least);
		k0 = split * chunk, k1 = min(n, k0 + chunk);
		bt = blocks + seqblk[tokseq[t]];
		cached = seqpos[tokseq[t]];
		return k0 < n;
	}
	// merge hands put(g, d, M, L, A) the block's result for dim d of its
	// query head g from the W warps' maxima, sums and unnormalised outputs
	// (all in log2 units) of its G query heads (arrays sized for GM).
	template <int W, int GM, int HD, typename Put>
	__device__ __forceinline__ void merge(const float (*acc)[GM][HD], const float (*m)[GM], const float (*l)[GM], int G, Put put) const {
		for (int i = threadIdx.x; i < G * HD; i += blockDim.x) {
			int g = i / HD, d = i % HD;
			float M = -INF;
#pragma unroll
			for (int w = 0; w < W; w++) M = fmaxf(M, m[w][g]);
			float L = 0.f, A = 0.f;
			if (M != -INF) {
#pragma unroll
				for (int w = 0; w < W; w++) {
					float c = exp2f(m[w][g] - M);
					L += l[w][g] * c;
					A += acc[w][g][d] * c;
				}
			}
			put(g, d, M, L, A);
		}
	}
	// partial writes the block's result as split's partial for the combine.
	template <int W, int GM, int HD>
	__device__ __forceinline__ void partial(const float (*acc)[GM][HD], const float (*m)[GM], const float (*l)[GM],
			float *pm, float *pl, float *pacc, int H, int G) const {
		merge<W, GM, HD>(acc, m, l, G, [&](int g, int d, float M, float L, float A) {
			long pi = ((long)t * H + kh * G + g) * S + split;
			pacc[pi * HD + d] = A;
			if (d == 0) { pm[pi] = M; pl[pi] = L; }
		});
	}
};

// F8_MMA: the FP8 tensor-core instructions (mma m16n8k32 e4m3: sm_89 on,
// PTX ISA 8.4, a CUDA 12.4 compiler on). The backend passes NVRTC's version
// as KILN_NVRTC_VERSION (nvcc, for scripts/check-kernels.sh, says its own)
// and launches kernels that need them only where F8_MMA holds
// (Backend.fp8Skinny); elsewhere they trap.
#ifdef KILN_NVRTC_VERSION
#define KILN_CC_VERSION KILN_NVRTC_VERSION
#else
#define KILN_CC_VERSION (__CUDACC_VER_MAJOR__ * 100 + __CUDACC_VER_MINOR__)
#endif
#if __CUDA_ARCH__ >= 890 && KILN_CC_VERSION >= 1204
#define F8_MMA 1
#else
#define F8_MMA 0
#endif

// Tensor-core helpers (mma.sync, ldmatrix, cp.async), sm_80 on.

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
	unsigned r;
	asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
	return r;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
		: "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		: "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned smem_addr(const void *p) {
	unsigned a;
	asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
	return a;
}

// The shared-memory operations take 32-bit shared addresses (smem_addr):
// kernels that keep their tiles' addresses in that form spend half the
// registers and no conversions on them.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned a, unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3) {
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
		: "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned a, unsigned &r0, unsigned &r1, unsigned &r2, unsigned &r3) {
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
		: "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(a));
}

// movmatrix_trans transposes an 8 x 8 matrix of 16-bit elements held as
// ldmatrix leaves one (lane l: row l / 4, columns (l % 4) * 2 and + 1).
__device__ __forceinline__ unsigned movmatrix_trans(unsigned a) {
	unsigned d;
	asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
	return d;
}

// Walk walks a warp's items in order without divisions (tens of
// instructions each by a count known at run time): item bi of n of group
// gi.
struct Walk {
	int gi = 0, bi = 0;
	__device__ void next(int n) {
		if (++bi == n) bi = 0, gi++;
	}
};

// prefetch_l2 asks for the line at p in L2, with nothing waiting for it.
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// keep_sel returns prmt's identity selector made from n, a kernel argument
// that is never negative (a width): its sign bit is zero at run time,
// unknown to the compiler.
__device__ __forceinline__ unsigned keep_sel(int n) { return 0x3210u + ((unsigned)n >> 31); }

// kept returns a copy of v (a struct of unsigned 32-bit words: a slot of a
// ring of weight loads) through byte permutes by a keep_sel selector, which
// the compiler cannot fold. A ring that copies its oldest slot out and then
// loads the next into it means the load to land in the slot's registers
// while the copy is used; copied plainly, the compiler loads into new
// registers instead, computes on the slot in place, and moves the new
// registers into the slot at the loop's end, where the moves wait for the
// load just issued. qgemv copies this way; qmv and f8mv gained nothing from
// it (NOTES.md, 2026-11-30).
template <class T>
__device__ __forceinline__ T kept(const T &v, unsigned sel) {
	static_assert(sizeof(T) % 4 == 0, "a slot of 32-bit words");
	T r;
	const unsigned *s = reinterpret_cast<const unsigned *>(&v);
	unsigned *d = reinterpret_cast<unsigned *>(&r);
#pragma unroll
	for (int i = 0; i < (int)(sizeof(T) / 4); i++) asm("prmt.b32 %0, %1, 0, %2;" : "=r"(d[i]) : "r"(s[i]), "r"(sel));
	return r;
}

// qld16 streams 16 bytes of quants past L1 (each is read once).
__device__ __forceinline__ uint4 qld16(const u8 *p) {
	uint4 v;
	asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
	return v;
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void *src) {
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
}
// cp_async8 and cp_async4 copy 8 and 4 bytes (through L1: .cg takes 16
// only).
__device__ __forceinline__ void cp_async8(unsigned dst, const void *src) {
	asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async4(unsigned dst, const void *src) {
	asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src));
}

// FP8 tensor-core helpers (F8_MMA).

__device__ __forceinline__ void mma_e4m3(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
#if F8_MMA
	asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
		: "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		: "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
	__trap();
#endif
}

// e4m3x2 rounds b (low byte) and a (high byte) to e4m3, saturating; e4m3x2f
// widens such a pair (exactly).
__device__ __forceinline__ unsigned e4m3x2(float a, float b) {
	unsigned short r = 0;
#if F8_MMA
	asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(a), "f"(b));
#endif
	return r;
}
__device__ __forceinline__ void e4m3x2f(unsigned v, float &lo, float &hi) {
	unsigned h = 0;
#if F8_MMA
	asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((unsigned short)v));
#endif
	lo = h2f((u16)(h & 0xffffu)), hi = h2f((u16)(h >> 16));
}

// F8_F16: FP8 products on the f16 tensor cores, each e4m3 weight widened
// once by cvt (exact), the activations in f16 under one scale per 128
// columns. Hopper's mma.sync has no FP8: ptxas emulates mma m16n8k32 e4m3
// by widening both operands to f16 for every instruction, for both halves
// of f8_split's pair (ncu on an H200: f8mv's gate/up product issued ~124K
// warp instructions a multiprocessor where its loads, mmas and scaling
// count ~37K in the source). Default from sm_90 (measured on Hopper only);
// A/B: -DF8_F16=0.
#ifndef F8_F16
#if F8_MMA && __CUDA_ARCH__ >= 900
#define F8_F16 1
#else
#define F8_F16 0
#endif
#endif

__device__ __forceinline__ void mma_f16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
		: "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		: "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// mma_f8w adds the products of four consecutive e4m3 weights of rows g (wa)
// and g + 8 (wb) with token g's f16 activations at the same columns (x01,
// x23: f16 pairs) to the m16n8k16 accumulators c. The mma's k slots (2q,
// 2q + 1) take the first two columns and (2q + 8, 2q + 9) the last two, in
// A and B alike.
__device__ __forceinline__ void mma_f8w(float (&c)[4], unsigned wa, unsigned wb, unsigned x01, unsigned x23) {
	unsigned a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#if F8_MMA
	asm("{.reg .b16 l, h;\n\tmov.b32 {l, h}, %4;\n\tcvt.rn.f16x2.e4m3x2 %0, l;\n\tcvt.rn.f16x2.e4m3x2 %2, h;\n\t"
		"mov.b32 {l, h}, %5;\n\tcvt.rn.f16x2.e4m3x2 %1, l;\n\tcvt.rn.f16x2.e4m3x2 %3, h;\n\t}"
		: "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(wa), "r"(wb));
#endif
	mma_f16(c, a0, a1, a2, a3, x01, x23);
}

// f16_block writes 128 activations (a warp, four a lane: v) as f16 under
// one scale s = amax / 2^14 (*sc) at x (128 f16): within f16's range
// whatever the activations' (bf16 or f32), rounded to 2^-11 of each value.
__device__ __forceinline__ void f16_block(float (&v)[4], unsigned char *x, float *sc, int lane) {
	float a = warp_max(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
	float s = a > 0.f ? a * (1.f / 16384.f) : 1.f, inv = 1.f / s;
	unsigned h01, h23;
	asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h01) : "f"(v[1] * inv), "f"(v[0] * inv));
	asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h23) : "f"(v[3] * inv), "f"(v[2] * inv));
	((uint2 *)x)[lane] = make_uint2(h01, h23);
	if (lane == 0) *sc = s;
}

// f8_split quantizes 128 activations (a warp, four a lane: v) to e4m3
// pairs under one scale s = amax / 448 (*sc): hi, and lo = the e4m3 of what
// hi misses, whose products with e4m3 weights come within ~2^-8 of the
// activations' where one e4m3 alone would be 2^-4.
__device__ __forceinline__ void f8_split(float (&v)[4], unsigned char *hi, unsigned char *lo, float *sc, int lane) {
	float a = warp_max(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
	float s = a > 0.f ? a * (1.f / 448.f) : 1.f, inv = 1.f / s;
#pragma unroll
	for (int e = 0; e < 4; e++) v[e] *= inv;
	unsigned h01 = e4m3x2(v[1], v[0]), h23 = e4m3x2(v[3], v[2]);
	float f[4];
	e4m3x2f(h01, f[0], f[1]);
	e4m3x2f(h23, f[2], f[3]);
	unsigned l01 = e4m3x2(v[1] - f[1], v[0] - f[0]), l23 = e4m3x2(v[3] - f[3], v[2] - f[2]);
	((unsigned *)hi)[lane] = h01 | h23 << 16;
	((unsigned *)lo)[lane] = l01 | l23 << 16;
	if (lane == 0) *sc = s;
}

