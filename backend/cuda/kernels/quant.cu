// Block-quantized weights: products, dequantization and embedding lookups
// that read the blocks directly. The interchange layouts are described in
// backend/quant.go; the device rows these kernels read (each row's block
// bodies, then their scales, 16-byte aligned) in backend/cuda/qlayout.go.
// Every kernel takes rb, the bytes of one device row.
//
// Decode products (qmv, qmv_swiglu; up to 8 tokens) run on tensor cores
// with the weights dequantized in registers: mma.sync m16n8k16 with the
// tokens as A (rows 0..7 of 16) and 8 weight rows as B. The inner
// dimension of one mma is any 16 columns, as long as A and B hold the same
// ones: lane (n, t) = (lane / 4, lane % 4) dequantizes its own "unit" of
// weight row n (32 or 64 consecutive columns, one or two 16-byte loads of
// quants) and lane (g, t) loads token g's activations at the same columns,
// so each lane reads whole 16-byte pieces of its row and no data moves
// between lanes. The four lanes of a row take four consecutive units (64 to
// 128 contiguous bytes of quants a row a step); the warps of a block split
// the row's units between them and add their partial sums in a fixed order
// at the end. The first units are requested before pdl_wait (the weights do
// not depend on the kernel before) and each lane keeps U units in flight.
//
// Dequantized weights are what the reference computes in float32, rounded
// to bf16 (so the products match those of cuBLASLt on the weights that
// qdeq writes), except FP8 (whose e4m3 values bf16 holds exactly: the scale
// of each 128-column block multiplies the mma results in float32) and MXFP4
// (values times a power of two: exact in bf16). Integers become floats
// without the conversion unit: byte b placed in the mantissa of 1.0 reads
// 1 + b / 32768 (mag; mag7 reads b < 128 as 0.5 + b / 256), and one fma
// with the block's scale gives scale * (b - offset) - min.

// Units a lane keeps in flight (A/B: KILN_CUDA_NVRTC_FLAGS=-DQMV_U64=3):
// QMV_U32 for the types of 32-column units, QMV_U64 for the K-quants.
#ifndef QMV_U32
#define QMV_U32 4
#endif
#ifndef QMV_U64
#define QMV_U64 2
#endif
// QMV_ACC2: two accumulator chains (A/B: -DQMV_ACC2=0).
#ifndef QMV_ACC2
#define QMV_ACC2 1
#endif

#define QT_Q8_0 4
#define QT_Q4_K 5
#define QT_Q5_K 6
#define QT_Q6_K 7
#define QT_MXFP4 8
#define QT_FP8 9


// prmt is the byte permute with 4-bit selectors (bit 3 of a selector
// replicates the selected byte's sign bit), which __byte_perm does not
// promise.
__device__ __forceinline__ unsigned prmt(unsigned a, unsigned b, unsigned s) {
	unsigned r;
	asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
	return r;
}

// magr returns byte i of w as the float 1 + b / 32768 (b in bits 8-15 of
// the mantissa); mag7 byte I, below 128, as 0.5 + b / 256 (bits 16-22):
// the smaller constant of mag7's fma rounds to 2^-17 of a quant step.
__device__ __forceinline__ float magr(unsigned w, unsigned i) { return __uint_as_float(prmt(w, 0x3F800000u, 0x7604u | (i << 4))); }
template <int I> __device__ __forceinline__ float mag(unsigned w) { return magr(w, I); }
template <int I> __device__ __forceinline__ float mag7(unsigned w) { return __uint_as_float(prmt(w, 0x3F000000u, 0x7054u | (I << 8))); }

// bfma2 is a bf16 pair fma (sm_80 on).
__device__ __forceinline__ unsigned bfma2(unsigned a, unsigned b, unsigned c) {
	unsigned r;
	asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
	return r;
}

__device__ __forceinline__ unsigned word(const uint4 &a, const uint4 &b, int k) {
	const uint4 &v = k < 4 ? a : b;
	int j = k & 3;
	return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

__device__ __forceinline__ unsigned byte_of(unsigned w, int i) { return (w >> (8 * i)) & 0xffu; }

// e4m3f widens an e4m3 value exactly (0x7f and 0xff, NaN in e4m3, read 480).
__device__ __forceinline__ float e4m3f(unsigned b) {
	unsigned em = b & 0x7fu;
	float v = em >= 8 ? __uint_as_float((em << 20) + (120u << 23)) : (float)em * 0.001953125f;
	return (b & 0x80u) ? -v : v;
}

// e8m0h returns half of the e8m0 scale 2^(e-127) (quant.E8M0Half).
__device__ __forceinline__ float e8m0h(unsigned e) { return __uint_as_float(e < 2 ? 0x00200000u << e : (e - 1) << 23); }

// pack2 packs the floats a (lower column) and b as bf16.
__device__ __forceinline__ unsigned pack2(float a, float b) { return pack_bf16(a, b); }

// fmas4 packs fma(mag(byte j of v), A, B) for the four bytes of v as two
// bf16 pairs; fmas4s the same with mag7 (bytes below 128).
__device__ __forceinline__ void fmas4(unsigned v, float A, float B, unsigned &p0, unsigned &p1) {
	p0 = pack2(fmaf(mag<0>(v), A, B), fmaf(mag<1>(v), A, B));
	p1 = pack2(fmaf(mag<2>(v), A, B), fmaf(mag<3>(v), A, B));
}
__device__ __forceinline__ void fmas4s(unsigned v, float A, float B, unsigned &p0, unsigned &p1) {
	p0 = pack2(fmaf(mag7<0>(v), A, B), fmaf(mag7<1>(v), A, B));
	p1 = pack2(fmaf(mag7<2>(v), A, B), fmaf(mag7<3>(v), A, B));
}

// kscale sets the scales d * sc and mins dmin * m of sub-blocks 2p and
// 2p + 1 of a Q4_K or Q5_K block from its first 16 bytes h (d, dmin, 12
// bytes of 6-bit scales and mins: quant.scaleMin).
__device__ __forceinline__ void kscale(uint4 h, int p, float (&S)[2], float (&M)[2]) {
	float d = h2f((u16)(h.x & 0xffffu)), dmin = h2f((u16)(h.x >> 16));
	unsigned sc, m;
	if (p < 2) {
		sc = h.y & 0x3f3f3f3fu;
		m = h.z & 0x3f3f3f3fu;
	} else {
		sc = (h.w & 0x0f0f0f0fu) | ((h.y >> 2) & 0x30303030u);
		m = ((h.w >> 4) & 0x0f0f0f0fu) | ((h.z >> 2) & 0x30303030u);
	}
	unsigned i = 2 * (p & 1);
	float D = d * 32768.f, Dm = dmin * 32768.f;
	S[0] = fmaf(magr(sc, i), D, -D);
	S[1] = fmaf(magr(sc, i + 1), D, -D);
	M[0] = fmaf(magr(m, i), Dm, -Dm);
	M[1] = fmaf(magr(m, i + 1), Dm, -Dm);
}

// kscale_exact returns the integer scale and min of sub-block j.
__device__ __forceinline__ void kscale_exact(uint4 h, int j, int &sc, int &m) {
	unsigned s[3] = {h.y, h.z, h.w};
	if (j < 4) {
		sc = byte_of(s[0], j) & 63;
		m = byte_of(s[1], j) & 63;
	} else {
		sc = (byte_of(s[2], j - 4) & 0xf) | (byte_of(s[0], j - 4) >> 6 << 4);
		m = (byte_of(s[2], j - 4) >> 4) | (byte_of(s[1], j - 4) >> 6 << 4);
	}
}

// Q<type> describes a type's units: a unit is E columns of one row (units
// (I) of them a row), in E / 32 halves of 32 consecutive columns (col(u,
// h) is a half's first), whose quants and scales one lane loads (load). K
// holds what a unit's dequantization computes once (prep); pairs writes a
// half's 16 bf16 pairs in column order; exact writes a half's 32 values as
// the reference computes them. U is the units a lane keeps in flight.
// SCALED types leave their block scale (scale) to the caller.
template <int QT> struct Q;

// Q8_0: a unit is a block (32 columns): 32 quants and the f16 scale.
template <> struct Q<QT_Q8_0> {
	static constexpr int E = 32, U = QMV_U32, UB = 32;
	static constexpr bool SCALED = false;
	struct Raw {
		uint4 a, b;
		unsigned d;
	};
	struct K {
		float A, B;
	};
	__device__ static int units(int I) { return I >> 5; }
	__device__ static int col(int u, int h) { return u << 5; }
	__device__ static void load(Raw &r, const u8 *row, int I, int u) {
		r.a = qld16(row + 32L * u);
		r.b = qld16(row + 32L * u + 16);
		r.d = __ldg((const u16 *)(row + 32L * (I >> 5)) + u);
	}
	// load_async copies what load reads into a Raw in shared memory
	// (cp.async, whole 4-byte words); settle picks load's value from them.
	__device__ static void load_async(Raw *s, const u8 *row, int I, int u) {
		cp_async16(smem_addr(&s->a), row + 32L * u);
		cp_async16(smem_addr(&s->b), row + 32L * u + 16);
		cp_async4(smem_addr(&s->d), row + 32L * (I >> 5) + 4 * (u >> 1));
	}
	__device__ static void settle(Raw &r, int u) { r.d = r.d >> (16 * (u & 1)) & 0xffffu; }
	__device__ static K prep(const Raw &r, int u) {
		float d = h2f((u16)r.d);
		return K{d * 32768.f, d * -32896.f};  // q + 128 = b: d * (b - 128)
	}
	__device__ static void pairs(const Raw &r, const K &k, int u, int h, unsigned (&p)[16]) {
#pragma unroll
		for (int j = 0; j < 8; j++) fmas4(word(r.a, r.b, j) ^ 0x80808080u, k.A, k.B, p[2 * j], p[2 * j + 1]);
	}
	__device__ static void exact(const Raw &r, int u, int h, float (&v)[32]) {
		float d = h2f((u16)r.d);
#pragma unroll
		for (int j = 0; j < 32; j++) v[j] = (float)(signed char)byte_of(word(r.a, r.b, j >> 2), j & 3) * d;
	}
};

// Q4_K: a unit is a quarter block (64 columns): the 32 bytes of quants of
// sub-blocks 2p (low nibbles) and 2p + 1 (high nibbles), and the block's
// 16-byte header.
template <> struct Q<QT_Q4_K> {
	static constexpr int E = 64, U = QMV_U64, UB = 36;
	static constexpr bool SCALED = false;
	struct Raw {
		uint4 a, b, h;
	};
	struct K {
		float A[2], B[2];
	};
	__device__ static int units(int I) { return I >> 6; }
	__device__ static int col(int u, int h) { return (u >> 2) * 256 + (u & 3) * 64 + h * 32; }
	__device__ static void load(Raw &r, const u8 *row, int I, int u) {
		const u8 *blk = row + 144L * (u >> 2);
		r.a = qld16(blk + 16 + 32 * (u & 3));
		r.b = qld16(blk + 32 + 32 * (u & 3));
		r.h = __ldg((const uint4 *)blk);
	}
	__device__ static void load_async(Raw *s, const u8 *row, int I, int u) {
		const u8 *blk = row + 144L * (u >> 2);
		cp_async16(smem_addr(&s->a), blk + 16 + 32 * (u & 3));
		cp_async16(smem_addr(&s->b), blk + 32 + 32 * (u & 3));
		cp_async16(smem_addr(&s->h), blk);
	}
	__device__ static void settle(Raw &r, int u) {}
	__device__ static K prep(const Raw &r, int u) {
		float S[2], M[2];
		kscale(r.h, u & 3, S, M);
		K k;  // q = 256 * (mag7 - 0.5): S * q - M
#pragma unroll
		for (int i = 0; i < 2; i++) {
			k.A[i] = S[i] * 256.f;
			k.B[i] = -fmaf(S[i], 128.f, M[i]);
		}
		return k;
	}
	__device__ static void pairs(const Raw &r, const K &k, int u, int h, unsigned (&p)[16]) {
#pragma unroll
		for (int j = 0; j < 8; j++) {
			unsigned w = word(r.a, r.b, j);
			fmas4s((h ? w >> 4 : w) & 0x0f0f0f0fu, k.A[h], k.B[h], p[2 * j], p[2 * j + 1]);
		}
	}
	__device__ static void exact(const Raw &r, int u, int h, float (&v)[32]) {
		int sc, m;
		kscale_exact(r.h, 2 * (u & 3) + h, sc, m);
		float d1 = __fmul_rn(h2f((u16)(r.h.x & 0xffffu)), (float)sc), m1 = __fmul_rn(h2f((u16)(r.h.x >> 16)), (float)m);
#pragma unroll
		for (int l = 0; l < 32; l++) {
			unsigned q = byte_of(word(r.a, r.b, l >> 2), l & 3) >> (4 * h) & 0xf;
			v[l] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
		}
	}
};

// Q5_K: Q4_K's units, with the block's 32 bytes of fifth bits (bit 2p + h
// of byte l for element l of sub-block 2p + h).
template <> struct Q<QT_Q5_K> {
	static constexpr int E = 64, U = QMV_U64, UB = 44;
	static constexpr bool SCALED = false;
	struct Raw {
		uint4 a, b, qa, qb, h;
	};
	typedef Q<QT_Q4_K>::K K;
	__device__ static int units(int I) { return I >> 6; }
	__device__ static int col(int u, int h) { return (u >> 2) * 256 + (u & 3) * 64 + h * 32; }
	__device__ static void load(Raw &r, const u8 *row, int I, int u) {
		const u8 *blk = row + 176L * (u >> 2);
		r.a = qld16(blk + 48 + 32 * (u & 3));
		r.b = qld16(blk + 64 + 32 * (u & 3));
		r.qa = __ldg((const uint4 *)(blk + 16));
		r.qb = __ldg((const uint4 *)(blk + 32));
		r.h = __ldg((const uint4 *)blk);
	}
	__device__ static void load_async(Raw *s, const u8 *row, int I, int u) {
		const u8 *blk = row + 176L * (u >> 2);
		cp_async16(smem_addr(&s->a), blk + 48 + 32 * (u & 3));
		cp_async16(smem_addr(&s->b), blk + 64 + 32 * (u & 3));
		cp_async16(smem_addr(&s->qa), blk + 16);
		cp_async16(smem_addr(&s->qb), blk + 32);
		cp_async16(smem_addr(&s->h), blk);
	}
	__device__ static void settle(Raw &r, int u) {}
	__device__ static K prep(const Raw &r, int u) {
		float S[2], M[2];
		kscale(r.h, u & 3, S, M);
		K k;  // q = 256 * (mag7 - 0.5): S * q - M
#pragma unroll
		for (int i = 0; i < 2; i++) {
			k.A[i] = S[i] * 256.f;
			k.B[i] = -fmaf(S[i], 128.f, M[i]);
		}
		return k;
	}
	__device__ static void pairs(const Raw &r, const K &k, int u, int h, unsigned (&p)[16]) {
		int sh = 2 * (u & 3) + h;
#pragma unroll
		for (int j = 0; j < 8; j++) {
			unsigned w = word(r.a, r.b, j), hb = (word(r.qa, r.qb, j) >> sh) & 0x01010101u;
			fmas4s(((h ? w >> 4 : w) & 0x0f0f0f0fu) | (hb << 4), k.A[h], k.B[h], p[2 * j], p[2 * j + 1]);
		}
	}
	__device__ static void exact(const Raw &r, int u, int h, float (&v)[32]) {
		int j = 2 * (u & 3) + h, sc, m;
		kscale_exact(r.h, j, sc, m);
		float d1 = __fmul_rn(h2f((u16)(r.h.x & 0xffffu)), (float)sc), m1 = __fmul_rn(h2f((u16)(r.h.x >> 16)), (float)m);
#pragma unroll
		for (int l = 0; l < 32; l++) {
			unsigned q = byte_of(word(r.a, r.b, l >> 2), l & 3) >> (4 * h) & 0xf;
			q |= (byte_of(word(r.qa, r.qb, l >> 2), l & 3) >> j & 1) << 4;
			v[l] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
		}
	}
};

// Q6_K: a unit is a quarter block: 32 bytes of ql (64 * n + 32 * hh + l,
// l < 32, for unit 2n + hh of its block), whose low nibbles are columns
// 128n + 32hh + l and high nibbles the columns 64 further; the 32 bytes of
// qh of half n (bits 2hh, 4 + 2hh); the 8 scales of half n; the f16 d.
// Device block: ql, qh and scales (208 bytes); the d values follow the
// row's blocks.
template <> struct Q<QT_Q6_K> {
	static constexpr int E = 64, U = QMV_U64, UB = 52;
	static constexpr bool SCALED = false;
	struct Raw {
		uint4 a, b, qa, qb;
		uint2 sc;
		unsigned d;
	};
	struct K {
		float A[2][2], B[2][2];  // [half][l >= 16]
	};
	__device__ static int units(int I) { return I >> 6; }
	__device__ static int col(int u, int h) { return (u >> 2) * 256 + (u & 3) * 32 + ((u & 3) >> 1) * 64 + h * 64; }
	__device__ static void load(Raw &r, const u8 *row, int I, int u) {
		const u8 *blk = row + 208L * (u >> 2);
		int n = (u & 3) >> 1;
		r.a = qld16(blk + 32 * (u & 3));
		r.b = qld16(blk + 32 * (u & 3) + 16);
		r.qa = __ldg((const uint4 *)(blk + 128 + 32 * n));
		r.qb = __ldg((const uint4 *)(blk + 144 + 32 * n));
		r.sc = __ldg((const uint2 *)(blk + 192 + 8 * n));
		r.d = __ldg((const u16 *)(row + 208L * (I >> 8)) + (u >> 2));
	}
	__device__ static void load_async(Raw *s, const u8 *row, int I, int u) {
		const u8 *blk = row + 208L * (u >> 2);
		int n = (u & 3) >> 1;
		cp_async16(smem_addr(&s->a), blk + 32 * (u & 3));
		cp_async16(smem_addr(&s->b), blk + 32 * (u & 3) + 16);
		cp_async16(smem_addr(&s->qa), blk + 128 + 32 * n);
		cp_async16(smem_addr(&s->qb), blk + 144 + 32 * n);
		cp_async8(smem_addr(&s->sc), blk + 192 + 8 * n);
		cp_async4(smem_addr(&s->d), row + 208L * (I >> 8) + 4 * (u >> 3));
	}
	__device__ static void settle(Raw &r, int u) { r.d = r.d >> (16 * ((u >> 2) & 1)) & 0xffffu; }
	__device__ static K prep(const Raw &r, int u) {
		float d = h2f((u16)r.d), D = d * 32768.f, C = d * -32896.f;  // int8 scale s + 128 = b: d * (b - 128)
		unsigned i = 2 * (u & 1);
		K k;
#pragma unroll
		for (int h = 0; h < 2; h++) {
			unsigned w = (h ? r.sc.y : r.sc.x) ^ 0x80808080u;
#pragma unroll
			for (int e = 0; e < 2; e++) {
				float S = fmaf(magr(w, i + e), D, C);
				k.A[h][e] = S * 256.f;
				k.B[h][e] = S * -160.f;  // b = 256 * (mag7 - 0.5): S * (b - 32)
			}
		}
		return k;
	}
	__device__ static void pairs(const Raw &r, const K &k, int u, int h, unsigned (&p)[16]) {
		int sh = 2 * (u & 1) + 4 * h;
#pragma unroll
		for (int j = 0; j < 8; j++) {
			unsigned w = word(r.a, r.b, j), hb = (word(r.qa, r.qb, j) >> sh) & 0x03030303u;
			fmas4s(((h ? w >> 4 : w) & 0x0f0f0f0fu) | (hb << 4), k.A[h][j >> 2], k.B[h][j >> 2], p[2 * j], p[2 * j + 1]);
		}
	}
	__device__ static void exact(const Raw &r, int u, int h, float (&v)[32]) {
		float d = h2f((u16)r.d);
		int sh = 2 * (u & 1) + 4 * h;
#pragma unroll
		for (int l = 0; l < 32; l++) {
			unsigned sw = h ? r.sc.y : r.sc.x;
			float s = __fmul_rn(d, (float)(signed char)byte_of(sw, 2 * (u & 1) + (l >> 4)));
			unsigned q = byte_of(word(r.a, r.b, l >> 2), l & 3) >> (4 * h) & 0xf;
			q |= (byte_of(word(r.qa, r.qb, l >> 2), l & 3) >> sh & 3) << 4;
			v[l] = __fmul_rn(s, (float)((int)q - 32));
		}
	}
};

// MXFP4: a unit is a block (32 columns: the low nibbles of its 16 bytes,
// then the high nibbles) and its e8m0 exponent. Nibbles become bytes
// holding twice the e2m1 value plus 64 by a table lookup (prmt picks 4
// bytes of 8 by the low 3 bits of 4 selector nibbles, and with the sign bit
// of a nibble set replicates the picked byte's sign bit instead: one lookup
// in the table of positive values, one in the negative's with the sign
// bits flipped, or-ed), then bf16 pairs 128 + byte, then one bf16 fma each
// with the block's power-of-two scale: exact.
template <> struct Q<QT_MXFP4> {
	static constexpr int E = 32, U = QMV_U32;
	static constexpr bool SCALED = false;
	struct Raw {
		uint4 a;
		unsigned e;
	};
	struct K {
		unsigned S, B;  // bf16 pairs: half the scale, and -192 times it
	};
	__device__ static int units(int I) { return I >> 5; }
	__device__ static int col(int u, int h) { return u << 5; }
	__device__ static void load(Raw &r, const u8 *row, int I, int u) {
		r.a = qld16(row + 16L * u);
		r.e = __ldg(row + 16L * (I >> 5) + u);
	}
	__device__ static void load_async(Raw *s, const u8 *row, int I, int u) {
		cp_async16(smem_addr(&s->a), row + 16L * u);
		cp_async4(smem_addr(&s->e), row + 16L * (I >> 5) + (u & ~3));
	}
	__device__ static void settle(Raw &r, int u) { r.e = r.e >> (8 * (u & 3)) & 0xffu; }
	__device__ static K prep(const Raw &r, int u) {
		unsigned e = r.e, s = e < 2 ? 0x20u << e : (e - 1) << 7, b = 0x8000u | ((e + 6) << 7) | 0x40u;
		return K{s | s << 16, b | b << 16};
	}
	// lut returns, for the 4 nibbles of sel's low 16 bits, 64 + twice their e2m1 values.
	__device__ static unsigned lut(unsigned sel) {
		return prmt(0x43424140u, 0x4c484644u, sel) | prmt(0x3d3e3f40u, 0x34383a3cu, sel ^ 0x8888u);
	}
	__device__ static void pairs(const Raw &r, const K &k, int u, int h, unsigned (&p)[16]) {
#pragma unroll
		for (int j = 0; j < 4; j++) {
			unsigned w = j == 0 ? r.a.x : j == 1 ? r.a.y : j == 2 ? r.a.z : r.a.w;
			// Bytes 4j..4j+3: low nibbles are columns 4j.., high ones 16 + 4j..
			unsigned r0 = lut(w), r1 = lut(w >> 16);  // columns 4j, 16+4j, 4j+1, 17+4j; then +2
			p[2 * j] = bfma2(prmt(r0, 0x43434343u, 0x4240u), k.S, k.B);
			p[2 * j + 1] = bfma2(prmt(r1, 0x43434343u, 0x4240u), k.S, k.B);
			p[8 + 2 * j] = bfma2(prmt(r0, 0x43434343u, 0x4341u), k.S, k.B);
			p[9 + 2 * j] = bfma2(prmt(r1, 0x43434343u, 0x4341u), k.S, k.B);
		}
	}
	__device__ static void exact(const Raw &r, int u, int h, float (&v)[32]) {
		float d = e8m0h(r.e);
#pragma unroll
		for (int j = 0; j < 32; j++) {
			unsigned b = byte_of(word(r.a, r.a, (j & 15) >> 2), j & 3);
			v[j] = (float)((int)(lut(j < 16 ? b & 0xf : b >> 4) & 0xff) - 64) * d;  // twice the e2m1 value
		}
	}
};

// FP8: a unit is a quarter block (32 columns) and the block's float32
// scale; the four lanes of a row take one block, so the scale multiplies
// their products after the mma (SCALED). An e4m3 byte moved into a bf16's
// exponent and mantissa fields reads its value times 2^-120 (subnormals
// too, as bf16 subnormals); a bf16 fma by 2^120 makes it exact.
template <> struct Q<QT_FP8> {
	static constexpr int E = 32, U = QMV_U32;
	static constexpr bool SCALED = true;
	struct Raw {
		uint4 a, b;
		float s;
	};
	struct K {};
	__device__ static int units(int I) { return (I + 31) >> 5; }
	__device__ static int col(int u, int h) { return u << 5; }
	__device__ static void load(Raw &r, const u8 *row, int I, int u) {
		r.a = qld16(row + 32L * u);
		r.b = qld16(row + 32L * u + 16);
		r.s = __ldg((const float *)(row + 128L * ((I + 127) >> 7)) + (u >> 2));
	}
	__device__ static void load_async(Raw *s, const u8 *row, int I, int u) {
		cp_async16(smem_addr(&s->a), row + 32L * u);
		cp_async16(smem_addr(&s->b), row + 32L * u + 16);
		cp_async4(smem_addr(&s->s), row + 128L * ((I + 127) >> 7) + 4 * (u >> 2));
	}
	__device__ static void settle(Raw &r, int u) {}
	__device__ static K prep(const Raw &r, int u) { return K{}; }
	__device__ static float scale(const Raw &r) { return r.s; }
	__device__ static unsigned cvt(unsigned t) {  // t: two e4m3 bytes in bits 8-15 and 24-31
		return bfma2(((t & 0x7f007f00u) >> 4) | (t & 0x80008000u), 0x7b807b80u, 0x80008000u);
	}
	__device__ static void pairs(const Raw &r, const K &k, int u, int h, unsigned (&p)[16]) {
#pragma unroll
		for (int j = 0; j < 8; j++) {
			unsigned w = word(r.a, r.b, j);
			p[2 * j] = cvt(prmt(w, 0, 0x1404u));
			p[2 * j + 1] = cvt(prmt(w, 0, 0x3424u));
		}
	}
	__device__ static void exact(const Raw &r, int u, int h, float (&v)[32]) {
#pragma unroll
		for (int j = 0; j < 32; j++) v[j] = __fmul_rn(e4m3f(byte_of(word(r.a, r.b, j >> 2), j & 3)), r.s);
	}
};

// qunit adds one unit's products to the lane's accumulators: acc[m] holds
// tokens 16m + g (c0, c1) and 16m + g + 8 (c2, c3), whose activations xa[m]
// and xb[m] point at (null: absent, zeros), for the warp's weight rows 2t
// and 2t + 1. Lanes whose unit is past the row's end (on false)
// contribute zeros. HI: some group has tokens 8-15.
//
// The products alternate between two accumulators (acc and acc2, summed at
// the end) so that consecutive mmas do not wait for each other's results.
template <int QT, int TG, bool HI>
__device__ __forceinline__ void qunit(float (&acc)[TG][4], float (&acc2)[TG][4], const typename Q<QT>::Raw &r, bool on, int u,
		const u16 *const (&xa)[TG], const u16 *const (&xb)[TG], int lane) {
	typedef Q<QT> q;
	float tc[TG][4], tc2[TG][4];
#pragma unroll
	for (int m = 0; m < TG; m++) tc[m][0] = tc[m][1] = tc[m][2] = tc[m][3] = tc2[m][0] = tc2[m][1] = tc2[m][2] = tc2[m][3] = 0.f;
	float(&c)[TG][4] = q::SCALED ? tc : acc;
	float(&c2)[TG][4] = q::SCALED ? tc2 : QMV_ACC2 ? acc2 : acc;
	typename q::K k;
	if (on) k = q::prep(r, u);
#pragma unroll
	for (int h = 0; h < q::E / 32; h++) {
		// The first group's activations are requested before the
		// dequantization, which hides their latency; the other groups'
		// come from L1 after the first group's products.
		uint4 va[4], vb[4];
#pragma unroll
		for (int j = 0; j < 4; j++) {
			va[j] = on && xa[0] ? __ldg((const uint4 *)(xa[0] + q::col(u, h)) + j) : make_uint4(0u, 0u, 0u, 0u);
			vb[j] = HI && on && xb[0] ? __ldg((const uint4 *)(xb[0] + q::col(u, h)) + j) : make_uint4(0u, 0u, 0u, 0u);
		}
		unsigned wp[16];
		if (on) {
			q::pairs(r, k, u, h, wp);
		} else {
#pragma unroll
			for (int j = 0; j < 16; j++) wp[j] = 0u;
		}
		__syncwarp();
#pragma unroll
		for (int m = 0; m < TG; m++) {
			if (m > 0) {
#pragma unroll
				for (int j = 0; j < 4; j++) {
					va[j] = on && xa[m] ? __ldg((const uint4 *)(xa[m] + q::col(u, h)) + j) : make_uint4(0u, 0u, 0u, 0u);
					vb[j] = on && xb[m] ? __ldg((const uint4 *)(xb[m] + q::col(u, h)) + j) : make_uint4(0u, 0u, 0u, 0u);
				}
			}
#pragma unroll
			for (int j = 0; j < 4; j++) {
				mma_bf16(c[m], va[j].x, vb[j].x, va[j].y, vb[j].y, wp[4 * j], wp[4 * j + 1]);
				mma_bf16(c2[m], va[j].z, vb[j].z, va[j].w, vb[j].w, wp[4 * j + 2], wp[4 * j + 3]);
			}
		}
	}
	if constexpr (q::SCALED) {
		// Row n's scale is lane 4n's (its unit is the block's first, valid when any is).
		float s = on ? q::scale(r) : 0.f;
		int t = lane & 3;
		float s0 = __shfl_sync(0xffffffffu, s, 8 * t), s1 = __shfl_sync(0xffffffffu, s, 8 * t + 4);
#pragma unroll
		for (int m = 0; m < TG; m++) {
			acc[m][0] += (tc[m][0] + tc2[m][0]) * s0;
			acc[m][1] += (tc[m][1] + tc2[m][1]) * s1;
			acc[m][2] += (tc[m][2] + tc2[m][2]) * s0;
			acc[m][3] += (tc[m][3] + tc2[m][3]) * s1;
		}
	}
}

// qmv: out[t, o] (+)= x[t] . w_o for T <= 16 TG tokens (sel == 0; the
// tokens in TG groups of 16, the mma's rows: 16 is as cheap as 1, and each
// dequantized weight serves every group), or, for the gridDim.y rows r of
// a mixture of experts (TG 1), out[r, o] = x[r / xdiv] . w[sel[r]]_o for
// the T (token, choice) rows (experts estride bytes apart; a row of
// another rank's expert, sel -1, is left as it is) and x[xsh + r - T] .
// ws_o for the rows after them (the shared expert, whose weights are laid
// out as an expert's). With TILES (TG 1, HI), the rows come as moe_group lists
// them, a block per tile of up to 16 rows of one expert (blockIdx.y, the
// mma's rows), so that the expert's weights are read once for them all.
// With SWIGLU, w is [gate | up] of 2O rows and out[., o] = silu(x . gate_o)
// * (x . up_o). x is bf16 (rows of I), out f32 or bf16 (odt). Grid (ceil(O
// / outputs), R, tiles allowed for, or 1), blocks of 1 to 8 warps that
// split each row's units; a block's warps take 8 weight rows: 8 outputs,
// or 4 gate rows interleaved with their up rows, for each of its output
// groups (blockIdx.x, + gridDim.x, ...).
template <int QT, bool SWIGLU, int TG, bool HI, bool TILES = false>
__device__ __forceinline__ void qmv(void *out, int odt, const u16 *x, int T, int xdiv, const u8 *w, long rb, long estride,
		const int *sel, const u8 *ws, int xsh, int O, int I, int accumulate, const int *start = nullptr, const int *order = nullptr,
		const int *tiles = nullptr, const int *ntiles = nullptr) {
	static_assert(!TILES || (TG == 1 && HI), "a tile's rows are the mma's 16");
	typedef Q<QT> q;
	__shared__ float red[8][32][4 * TG];
	pdl_trigger();
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
	int g = lane >> 2, t = lane & 3, r = blockIdx.y;
	constexpr int OUTS = SWIGLU ? 4 : 8;
	int j0 = 0, j1 = 0;  // TILES: the tile's rows in order
	if constexpr (TILES) {
		pdl_wait();
		if (r >= *ntiles) return;
		int e = tiles[2 * r];
		j0 = tiles[2 * r + 1], j1 = min(j0 + 16, start[e + 1]);
		w += e * estride;
	} else if (sel) {
		pdl_wait();
		if (r >= T) {
			w = ws;
		} else if (sel[r] < 0) {
			return;
		} else {
			w += (long)sel[r] * estride;
		}
	}
	int NU = q::units(I), NG = (NU + 3) >> 2;
	int n = warp < NG ? (NG - 1 - warp) / W + 1 : 0;  // unit groups of this warp: warp, warp + W, ...
	// The tokens of this lane's A rows: 16m + g and 16m + g + 8.
	const u16 *xa[TG], *xb[TG];
#pragma unroll
	for (int m = 0; m < TG; m++) {
		int ta = 16 * m + g, tb = ta + 8;
		if constexpr (TILES) {
			xa[m] = j0 + ta < j1 ? x + (long)(order[j0 + ta] / xdiv) * I : nullptr;
			xb[m] = j0 + tb < j1 ? x + (long)(order[j0 + tb] / xdiv) * I : nullptr;
		} else {
			xa[m] = sel ? (g == 0 ? x + (long)(r < T ? r / xdiv : xsh + r - T) * I : nullptr) : (ta < T ? x + (long)ta * I : nullptr);
			xb[m] = !sel && HI && tb < T ? x + (long)tb * I : nullptr;
		}
	}
	// A block takes output groups blockIdx.x, + gridDim.x, ...: fewer,
	// longer-lived blocks than a group each where the launch asks for it.
	int groups = (O + OUTS - 1) / OUTS;
	bool waited = sel || TILES;
	for (int og = blockIdx.x; og < groups; og += gridDim.x) {
		int o0 = og * OUTS;
		long wrow = SWIGLU ? ((g & 1) ? O : 0) + min(o0 + (g >> 1), O - 1) : min(o0 + g, O - 1);
		const u8 *row = w + wrow * rb;
		float acc[TG][4], acc2[TG][4];
#pragma unroll
		for (int m = 0; m < TG; m++) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = acc2[m][0] = acc2[m][1] = acc2[m][2] = acc2[m][3] = 0.f;
		typename q::Raw raw[q::U];
#pragma unroll
		for (int k = 0; k < q::U; k++) {
			int u = 4 * (warp + k * W) + t;
			if (k < n && u < NU) q::load(raw[k], row, I, u);
		}
		if (!waited) {
			pdl_wait();
			waited = true;
		}
		for (int i = 0; i < n; i += q::U) {
#pragma unroll
			for (int k = 0; k < q::U; k++) {
				if (i + k < n) {
					int u = 4 * (warp + (i + k) * W) + t, un = u + 4 * q::U * W;
					typename q::Raw cur = raw[k];
					if (i + k + q::U < n && un < NU) q::load(raw[k], row, I, un);
					qunit<QT, TG, HI>(acc, acc2, cur, u < NU, u, xa, xb, lane);
				}
			}
		}
#pragma unroll
		for (int m = 0; m < TG; m++)
#pragma unroll
			for (int e = 0; e < 4; e++) acc[m][e] += acc2[m][e];
		if (W > 1) {
			if (og != blockIdx.x) __syncthreads();  // warp 0 has read the last group's sums
#pragma unroll
			for (int m = 0; m < TG; m++)
#pragma unroll
				for (int e = 0; e < 4; e++) red[warp][lane][4 * m + e] = acc[m][e];
			__syncthreads();
			if (warp > 0) continue;
			for (int v = 1; v < W; v++)
#pragma unroll
				for (int m = 0; m < TG; m++)
#pragma unroll
					for (int e = 0; e < 4; e++) acc[m][e] += red[v][lane][4 * m + e];
		}
#pragma unroll
		for (int m = 0; m < TG; m++) {
#pragma unroll
			for (int hi = 0; hi < 2; hi++) {
				if (hi && !HI) break;
				if (!(hi ? xb[m] : xa[m])) continue;
				long base = (long)(TILES ? order[j0 + g + 8 * hi] : sel ? r : 16 * m + g + 8 * hi) * O;
				float c0 = acc[m][2 * hi], c1 = acc[m][2 * hi + 1];
				if constexpr (SWIGLU) {
					int o = o0 + t;
					if (o < O) qstore(out, odt, 0, base + o, c0 / (1.f + __expf(-c0)) * c1);
				} else {
					if (o0 + 2 * t < O) qstore(out, odt, accumulate, base + o0 + 2 * t, c0);
					if (o0 + 2 * t + 1 < O) qstore(out, odt, accumulate, base + o0 + 2 * t + 1, c1);
				}
			}
		}
	}
}

// qgemv: the decode product of NT (1 or 2) tokens with integer dot
// products, for the integer types (Q8_0 and the K-quants): out[t, o] (+)=
// x[t] . w_o, or with SWIGLU (w = [gate | up] of 2O rows) out[t, o] =
// silu(x[t] . gate_o) * (x[t] . up_o). Each block first quantizes the
// activations into shared memory, as the CPU backend and llama.cpp do: int8
// blocks of 32 columns, x ~ d * q with d = amax / 127 and q rounded to
// nearest even, and the sums of each 16 q (XQ). A warp per weight row (with
// SWIGLU a pair of warps takes an output's gate and up rows, and meets in
// shared memory) streams it as the bf16 GEMV does: lane l takes the row's
// units l, l + 32, ..., keeps QGEMV_U of them in flight (the first
// requested before pdl_wait) and dots each with dp4a, its quants as bytes
// against the activations' and the scales applied once a block of 16 or 32
// (qidot). Dequantizing to float instead cost 3-5 instructions a weight,
// which left the weight stream at 1.1-1.6 TB/s on an H100. The activations'
// 16-byte chunks are XOR-swizzled within rows of 128 bytes (xs_chunk):
// lanes read them 32 or 64 bytes apart, which would put a quarter warp on
// the same banks.
//
// With a norm (QNorm's w set) the product's input is RMSNorm(x) of the
// residual rows x (f32): the blocks quantize x * w, which the norm's
// factor a token (rsqrt(mean(x^2) + eps)) scales whole, and the sums are
// multiplied by it at the end. The norm then costs a decode step no launch
// of its own and no round trip of its rows through memory (H200, Qwen3-8B
// at batch 1, the two norms a layer skipped: Q4_K +10%, Q8_0 +6%).
//
// QGEMV_U: units in flight a lane of Q4_K, as many as 80 registers hold.
#ifndef QGEMV_U
#define QGEMV_U 2
#endif
// QGEMV_U8: units in flight of Q8_0, whose 9-register units fit three
// deep in 80 registers once the ring's copy is kept (NVRTC 12.4, sm_90a:
// 79-80 registers, no stack; Q4_K spills 24 bytes at three).
#ifndef QGEMV_U8
#define QGEMV_U8 3
#endif
// QGEMV_U56: units in flight of Q5_K and Q6_K, whose larger units would
// spill at QGEMV_U.
#ifndef QGEMV_U56
#define QGEMV_U56 1
#endif
// QGEMV_PF: each fetch also prefetches into L2 the lane's unit this many
// slots on in its row: 1 for Q8_0 (with three units in flight 2 lost
// 1-2%), none for the K-quants (H200, Qwen3-8B b1; NOTES.md); -DQGEMV_PF=N
// sets N for every type (A/B runs).
#ifndef QGEMV_PF
#define QGEMV_PF -1
#endif
// QGEMV_MAXW (defines.cuh): the most warps a qgemv block has (the host
// picks 8, 12 or 24: qgemvBlock in quant.go); the launch bounds give each
// thread 80 registers, for three blocks of eight a multiprocessor as for
// one of 24.

struct XQ {
	float d;
	int s0, s1, pad;
};

// QNorm is the RMSNorm a product applies to its input: weights w (wdt;
// 1 + w with unit), eps; w 0: none.
struct QNorm {
	const void *w;
	int wdt;
	float eps;
	int unit;
};

__device__ __forceinline__ int xs_chunk(int c) { return c ^ ((c >> 3) & 7); }

// dp4u is dp4a of four unsigned bytes a by four signed bytes b, plus c.
__device__ __forceinline__ int dp4u(unsigned a, int b, int c) {
	int r;
	asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
	return r;
}

// xload reads the 32 activation quants of token t from column col (a
// multiple of 32) as 8 words, and their block.
__device__ __forceinline__ XQ xload(const uint4 *xq, const XQ *xb, int C, int NB, int t, int col, int (&x)[8]) {
	uint4 a = xq[t * C + xs_chunk(col >> 4)], b = xq[t * C + xs_chunk((col >> 4) + 1)];
	x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
	return xb[t * NB + (col >> 5)];
}

// qidot adds the products of unit u of a row with NT tokens' quantized
// activations (xq: rows of C chunks, xb: rows of NB blocks) to acc.
template <int QT, int NT>
__device__ __forceinline__ void qidot(float (&acc)[NT], const typename Q<QT>::Raw &r, int u, const uint4 *xq, const XQ *xb, int C, int NB) {
	typedef Q<QT> q;
	if constexpr (QT == QT_Q8_0) {
		float d = h2f((u16)r.d);
#pragma unroll
		for (int t = 0; t < NT; t++) {
			int x[8], s = 0;
			XQ b = xload(xq, xb, C, NB, t, q::col(u, 0), x);
#pragma unroll
			for (int j = 0; j < 8; j++) s = __dp4a((int)word(r.a, r.b, j), x[j], s);
			acc[t] = fmaf(d * b.d, (float)s, acc[t]);
		}
	} else if constexpr (QT == QT_Q6_K) {
		// Values d * sc * (q - 32), a scale each 16 columns.
		float d = h2f((u16)r.d);
#pragma unroll
		for (int h = 0; h < 2; h++) {
			unsigned sw = h ? r.sc.y : r.sc.x;
			float S0 = d * (float)(signed char)byte_of(sw, 2 * (u & 1)), S1 = d * (float)(signed char)byte_of(sw, 2 * (u & 1) + 1);
			int sh = 2 * (u & 1) + 4 * h;
#pragma unroll
			for (int t = 0; t < NT; t++) {
				int x[8], s0 = 0, s1 = 0;
				XQ b = xload(xq, xb, C, NB, t, q::col(u, h), x);
#pragma unroll
				for (int j = 0; j < 8; j++) {
					unsigned w = word(r.a, r.b, j), hb = (word(r.qa, r.qb, j) >> sh) & 0x03030303u;
					unsigned v = ((h ? w >> 4 : w) & 0x0f0f0f0fu) | (hb << 4);
					if (j < 4) {
						s0 = dp4u(v, x[j], s0);
					} else {
						s1 = dp4u(v, x[j], s1);
					}
				}
				acc[t] = fmaf(b.d, fmaf(S0, (float)(s0 - 32 * b.s0), S1 * (float)(s1 - 32 * b.s1)), acc[t]);
			}
		}
	} else {
		// Q4_K and Q5_K: values S * q - M, a scale and min each 32 columns.
		float S[2], M[2];
		kscale(r.h, u & 3, S, M);
#pragma unroll
		for (int h = 0; h < 2; h++) {
#pragma unroll
			for (int t = 0; t < NT; t++) {
				int x[8], s = 0;
				XQ b = xload(xq, xb, C, NB, t, q::col(u, h), x);
#pragma unroll
				for (int j = 0; j < 8; j++) {
					unsigned w = word(r.a, r.b, j), v = (h ? w >> 4 : w) & 0x0f0f0f0fu;
					if constexpr (QT == QT_Q5_K) v |= ((word(r.qa, r.qb, j) >> (2 * (u & 3) + h)) & 0x01010101u) << 4;
					s = dp4u(v, x[j], s);
				}
				acc[t] = fmaf(b.d, fmaf(S[h], (float)s, -M[h] * (float)(b.s0 + b.s1)), acc[t]);
			}
		}
	}
}

template <int QT, int NT, bool SWIGLU>
__device__ __forceinline__ void qgemv(void *out, int odt, const void *x, int xdt, const u8 *w, long rb, int O, int I, QNorm nrm,
		int accumulate) {
	typedef Q<QT> q;
	constexpr int U = QT == QT_Q5_K || QT == QT_Q6_K ? QGEMV_U56 : QT == QT_Q8_0 ? QGEMV_U8 : QGEMV_U;
	constexpr int PF = QGEMV_PF >= 0 ? QGEMV_PF : QT == QT_Q8_0 ? 1 : 0;
	extern __shared__ uint4 xq[];
	__shared__ float up[2][QGEMV_MAXW / 2][NT], nss[QGEMV_MAXW][NT], rs[NT];
	pdl_trigger();
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = blockDim.x >> 5;
	// A block takes OB outputs a round, a warp each (with SWIGLU a pair of
	// warps: 2i the gate row, 2i + 1 the up row): round j's are from OB *
	// (blockIdx.x + j * gridDim.x). A lane's slots run over the rounds'
	// rows, L slots a row (units lane, lane + 32, ...), so that its ring
	// requests the next row's first units while it finishes a row.
	int OB = SWIGLU ? W >> 1 : W, wo = SWIGLU ? warp >> 1 : warp;
	int NU = q::units(I), L = (NU + 31) >> 5, NB = I >> 5, C = ((I >> 4) + 7) & ~7;
	int R = (O - OB * (int)blockIdx.x + OB * (int)gridDim.x - 1) / (OB * (int)gridDim.x), S = R * L;
	auto output = [&](int j) { return OB * ((int)blockIdx.x + j * (int)gridDim.x) + wo; };
	// Slot (gi, bi) is unit lane + 32 bi of round gi's row.
	Walk f;  // the next slot to fetch
	auto fetch = [&](typename q::Raw &r) {
		int u = lane + 32 * f.bi, o = min(output(f.gi), O - 1);  // a warp past the end reads row O - 1 and writes nothing
		const u8 *row = w + (long)(SWIGLU && (warp & 1) ? O + o : o) * rb;
		if (f.gi < R && u < NU) q::load(r, row, I, u);
		// The unit PF slots on in the row, into L2 only: requested from
		// DRAM now, loaded from L2 when its turn comes, with no register
		// waiting for it. A unit's quants are about UB bytes at UB * u of
		// the row (the scales kept apart are not prefetched).
		if (PF > 0 && f.gi < R && u + 32 * PF < NU) prefetch_l2(row + (long)(u + 32 * PF) * q::UB);
		f.next(L);
	};
	typename q::Raw raw[U];
#pragma unroll
	for (int k = 0; k < U; k++) fetch(raw[k]);
	// The norm's weights (+ 1 with unit) into shared memory as float32,
	// 16-byte chunks swizzled as xq's: they depend on no kernel, so this
	// runs before pdl_wait, and after it each thread reads its 32 without
	// a global load (one by one from global memory, lanes 64 bytes apart,
	// they made the prologue slower than the norm's own launch).
	XQ *xb = (XQ *)(xq + NT * C);
	float4 *gs = (float4 *)(xb + NT * NB);
	if (nrm.w) {
		float one = nrm.unit ? 1.f : 0.f;
		for (int c = threadIdx.x; c < I >> 2; c += blockDim.x) {
			float4 g;
			if (nrm.wdt == DT_F32 && ((unsigned long)nrm.w & 15) == 0) {
				g = ((const float4 *)nrm.w)[c];
			} else {
				g = make_float4(ld(nrm.w, 4 * c, nrm.wdt), ld(nrm.w, 4 * c + 1, nrm.wdt), ld(nrm.w, 4 * c + 2, nrm.wdt),
						ld(nrm.w, 4 * c + 3, nrm.wdt));
			}
			gs[xs_chunk(c)] = make_float4(g.x + one, g.y + one, g.z + one, g.w + one);
		}
		__syncthreads();
	}
	pdl_wait();
	// Four threads quantize a block of 32 columns, eight each, and meet by
	// shuffles (a NaN makes the block's d NaN). Every warp waits here for
	// the activations, which every block reads from L2 at once; a thread a
	// block of 32 kept 128 of 768 threads busy on rows of 4096, each
	// loading and quantizing its 32 in turn (Q8_0 b1 2% slower, H200).
	float ss[NT];
#pragma unroll
	for (int t = 0; t < NT; t++) ss[t] = 0.f;
	int tasks = 4 * NT * NB;
	for (int i = threadIdx.x; i < ((tasks + 31) & ~31); i += blockDim.x) {  // whole warps: the shuffles take every lane
		bool in = i < tasks;
		int g = in ? i >> 2 : 0, k = i & 3, t = g / NB, blk = g - t * NB;
		long at = (long)t * I + 32 * blk + 8 * k;
		float v[8];
		if (xdt == DT_BF16) {
			unpack8(*(const uint4 *)((const u16 *)x + at), v);
		} else {
#pragma unroll
			for (int j = 0; j < 2; j++) {
				float4 f = ((const float4 *)((const float *)x + at))[j];
				v[4 * j] = f.x, v[4 * j + 1] = f.y, v[4 * j + 2] = f.z, v[4 * j + 3] = f.w;
			}
		}
		if (nrm.w) {
			float s = 0.f;
#pragma unroll
			for (int j = 0; j < 2; j++) {
				float4 w = gs[xs_chunk(8 * blk + 2 * k + j)];
				s = fmaf(v[4 * j], v[4 * j], fmaf(v[4 * j + 1], v[4 * j + 1], fmaf(v[4 * j + 2], v[4 * j + 2], fmaf(v[4 * j + 3], v[4 * j + 3], s))));
				v[4 * j] *= w.x, v[4 * j + 1] *= w.y, v[4 * j + 2] *= w.z, v[4 * j + 3] *= w.w;
			}
#pragma unroll
			for (int u = 0; u < NT; u++)
				if (u == t && in) ss[u] += s;
		}
		float amax = 0.f, d = 0.f, id = 0.f;
		int nan = 0;
#pragma unroll
		for (int j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(v[j])), nan |= v[j] != v[j];
		amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
		amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
		nan |= __shfl_xor_sync(0xffffffffu, nan, 1);
		nan |= __shfl_xor_sync(0xffffffffu, nan, 2);
		if (nan) {
			d = __int_as_float(0x7fc00000);
		} else if (amax > 0.f) {
			d = __fdiv_rn(amax, 127.f), id = __fdiv_rn(127.f, amax);
		}
		unsigned wq[2];
		int sq = 0;
#pragma unroll
		for (int j = 0; j < 2; j++) {
			wq[j] = 0u;
#pragma unroll
			for (int b = 0; b < 4; b++) {
				int qv = __float2int_rn(v[4 * j + b] * id);
				wq[j] |= (unsigned)(qv & 0xff) << (8 * b);
				sq += qv;
			}
		}
		// Quarters 0 and 1 are the block's first 16 columns (XQ's s0), 2
		// and 3 the other 16 (s1); each chunk of 16 bytes is two quarters.
		int half = sq + __shfl_xor_sync(0xffffffffu, sq, 1), other = __shfl_xor_sync(0xffffffffu, half, 2);
		if (in) {
			((uint2 *)&xq[t * C + xs_chunk(2 * blk + (k >> 1))])[k & 1] = make_uint2(wq[0], wq[1]);
			if (k == 0) xb[g] = XQ{d, half, other, 0};
		}
	}
	// The norm's factor a token, from the warps' sums of squares, kept in
	// shared memory: in registers through the loop below it slowed the
	// weight stream.
	if (nrm.w) {
#pragma unroll
		for (int t = 0; t < NT; t++) {
			float v = warp_sum(ss[t]);
			if (lane == 0) nss[warp][t] = v;
		}
	}
	__syncthreads();
	if (threadIdx.x < NT) {
		float v = 0.f;
		for (int k = 0; k < W; k++) v += nss[k][threadIdx.x];
		rs[threadIdx.x] = nrm.w ? rsqrtf(v / I + nrm.eps) : 1.f;
	}
	__syncthreads();
	float acc[NT];
#pragma unroll
	for (int t = 0; t < NT; t++) acc[t] = 0.f;
	Walk c;  // the slot to compute
	unsigned ks = keep_sel(I);
	for (int s0 = 0; s0 < S; s0 += U) {
#pragma unroll
		for (int k = 0; k < U; k++) {
			if (s0 + k >= S) break;
			typename q::Raw cur = kept(raw[k], ks);
			fetch(raw[k]);
			int u = lane + 32 * c.bi, j = c.gi;
			if (u < NU) qidot<QT, NT>(acc, cur, u, xq, xb, C, NB);
			c.next(L);
			if (c.bi != 0) continue;
			// The row is done (the slots and rounds are the same for every warp of the block).
			int o = output(j);
#pragma unroll
			for (int t = 0; t < NT; t++) acc[t] = warp_sum(acc[t]) * rs[t];
			if constexpr (SWIGLU) {
				if (lane == 0 && (warp & 1))
#pragma unroll
					for (int t = 0; t < NT; t++) up[j & 1][wo][t] = acc[t];
				// Only the pair meets (named barrier 1 + wo, 64 threads): the
				// block's other pairs go on streaming their rows.
				asm volatile("bar.sync %0, 64;" ::"r"(1 + wo) : "memory");
				if (lane == 0 && !(warp & 1) && o < O)
#pragma unroll
					for (int t = 0; t < NT; t++) qstore(out, odt, 0, (long)t * O + o, acc[t] / (1.f + __expf(-acc[t])) * up[j & 1][wo][t]);
			} else if (lane == 0 && o < O) {
#pragma unroll
				for (int t = 0; t < NT; t++) qstore(out, odt, accumulate, (long)t * O + o, acc[t]);
			}
#pragma unroll
			for (int t = 0; t < NT; t++) acc[t] = 0.f;
		}
	}
}

// qdeq writes rows [rows, I] of w as bf16 (out rows of I). Grid-stride
// over (row, unit).
template <int QT>
__device__ __forceinline__ void qdeq(u16 *out, const u8 *w, long rb, long rows, int I) {
	typedef Q<QT> q;
	int NU = (I + q::E - 1) / q::E;
	long total = rows * NU;
	for (long it = blockIdx.x * (long)blockDim.x + threadIdx.x; it < total; it += (long)gridDim.x * blockDim.x) {
		long rr = it / NU;
		int u = (int)(it - rr * NU);
		typename q::Raw raw;
		q::load(raw, w + rr * rb, I, u);
#pragma unroll
		for (int h = 0; h < q::E / 32; h++) {
			float v[32];
			q::exact(raw, u, h, v);
			int c0 = q::col(u, h);
			u16 *o = out + rr * I + c0;
			if (c0 + 32 <= I && (I & 7) == 0) {
#pragma unroll
				for (int j = 0; j < 4; j++)
					((uint4 *)o)[j] = make_uint4(pack2(v[8 * j], v[8 * j + 1]), pack2(v[8 * j + 2], v[8 * j + 3]),
							pack2(v[8 * j + 4], v[8 * j + 5]), pack2(v[8 * j + 6], v[8 * j + 7]));
			} else {
				for (int j = 0; j < 32 && c0 + j < I; j++) o[j] = f2bf(v[j]);
			}
		}
	}
}

// qtile writes half h of unit u of a row as qdeq does (bf16 of the
// reference's float32 values): 16 bf16 pairs in column order. FP8's pairs
// are exact e4m3 values, then times the block's scale in float32 (the
// reference's product) and rounded, without exact's widening of each byte.
template <int QT>
__device__ __forceinline__ void qtile(const typename Q<QT>::Raw &r, int u, int h, unsigned (&p)[16]) {
	typedef Q<QT> q;
	if constexpr (QT == QT_FP8) {
		q::pairs(r, typename q::K{}, u, h, p);
#pragma unroll
		for (int j = 0; j < 16; j++)
			p[j] = pack2(__fmul_rn(__uint_as_float(p[j] << 16), r.s), __fmul_rn(__uint_as_float(p[j] & 0xffff0000u), r.s));
	} else {
		float v[32];
		q::exact(r, u, h, v);
#pragma unroll
		for (int j = 0; j < 16; j++) p[j] = pack2(v[2 * j], v[2 * j + 1]);
	}
}

// qunit_at sets the unit u and half h whose 32 columns start at column c
// (col's inverse): Q6_K's halves are 64 columns apart.
template <int QT>
__device__ __forceinline__ void qunit_at(int c, int &u, int &h) {
	if constexpr (QT == QT_Q6_K) {
		int r = c & 255;
		u = 4 * (c >> 8) + 2 * (r >> 7) + ((r & 63) >> 5);
		h = (r & 127) >> 6;
	} else {
		u = c / Q<QT>::E;
		h = c % Q<QT>::E / 32;
	}
}


// QTiles is group_mm's weight loader (moe_mm.cuh) for block-quantized
// experts (rows of rb bytes, experts estride bytes apart): thread i <
// MG_BN takes weight row o0 + i of each stage, its unit's blocks copied by
// cp.async (load_async) into its slot of a ring of MG_STAGES (raw, MG_RAW
// bytes a slot) and dequantized into the stage, two of which alternate in
// sB, as qdeq would have written them: the products are those on qdeq's
// bf16 copies, without the copies (2.4 ms of a Qwen3-Next layer's 4K-token
// prompt beside 4.6 ms of products). Loading the blocks into registers
// instead left one stage's products to hide their latency: 4 ms a layer
// for the gate/up products alone (H200, 2026-11-28).
template <int QT>
struct QTiles {
	typedef typename Q<QT>::Raw Raw;
	static_assert(MG_BN == 128 && MG_BK == 32, "a thread a weight row, a half unit a stage");
	static_assert(sizeof(Raw) <= MG_RAW, "a unit's blocks fit a slot");
	const u8 *w;
	long rb, estride;
	int O, I;
	u8 *raw;  // [MG_STAGES][MG_BN] slots of MG_RAW bytes
	__device__ static int buf(int kt) { return kt & 1; }
	__device__ __forceinline__ Raw *slot(int st) { return (Raw *)(raw + (st * MG_BN + threadIdx.x) * MG_RAW); }
	__device__ __forceinline__ void fetch(u16 *sB, int st, int e, int o0, int kt) {
		if (threadIdx.x >= MG_BN) return;
		int u, h;
		qunit_at<QT>(kt * MG_BK, u, h);
		Q<QT>::load_async(slot(st), w + e * estride + (long)min(o0 + (int)threadIdx.x, O - 1) * rb, I, u);
	}
	__device__ __forceinline__ void ready(u16 *sB, int st, int kt) {
		if (threadIdx.x >= MG_BN) return;
		int u, h;
		qunit_at<QT>(kt * MG_BK, u, h);
		Raw r = *slot(st);
		Q<QT>::settle(r, u);
		unsigned p[16];
		qtile<QT>(r, u, h, p);
		uint4 *d = (uint4 *)(sB + threadIdx.x * MG_P);
#pragma unroll
		for (int j = 0; j < 4; j++) d[j] = make_uint4(p[4 * j], p[4 * j + 1], p[4 * j + 2], p[4 * j + 3]);
	}
};

// qembed: out[t] = the row tokens[t] - first of the table w (V rows) as
// f32, zeros for a token outside them (embed's share). Grid T.
template <int QT>
__device__ __forceinline__ void qembed(float *out, const u8 *w, long rb, const int *tokens, int I, int first, int V) {
	typedef Q<QT> q;
	int r = tokens[blockIdx.x] - first;
	float *o = out + (long)blockIdx.x * I;
	if (r < 0 || r >= V) {
		for (int c = threadIdx.x; c < I; c += blockDim.x) o[c] = 0.f;
		return;
	}
	const u8 *row = w + (long)r * rb;
	int NU = (I + q::E - 1) / q::E;
	for (int u = threadIdx.x; u < NU; u += blockDim.x) {
		typename q::Raw raw;
		q::load(raw, row, I, u);
#pragma unroll
		for (int h = 0; h < q::E / 32; h++) {
			float v[32];
			q::exact(raw, u, h, v);
			int c0 = q::col(u, h);
			for (int j = 0; j < 32 && c0 + j < I; j++) o[c0 + j] = v[j];
		}
	}
}

// moe_group_mm64_, moe_group_mm128_: the grouped products of quantized
// experts in tiles of 64 and 128 rows (shared memory moeGroupQSmem); MINB
// blocks a multiprocessor, as many as their shared memory allows on an
// H100 (one block of 128-row tiles, all registers: 56.5K against 68.1K
// tok/s for a Qwen3-Next prompt; H200, 2026-11-28).
#define QGROUP_MM(NAME, QT, BM, MINB) \
	extern "C" __global__ void __launch_bounds__(2 * BM, MINB) moe_group_mm##BM##_##NAME(float *y, const u16 *xg, const u8 *w, long rb, \
			long estride, const int *start, const int *order, const int *tiles, const int *ntiles, int O, int I) { \
		extern __shared__ uint4 mgq_smem[]; \
		u16(*sA)[BM * MG_P] = (u16(*)[BM * MG_P])mgq_smem; \
		u16(*sB)[MG_BN * MG_P] = (u16(*)[MG_BN * MG_P])(sA + MG_STAGES); \
		QTiles<QT> wl{w, rb, estride, O, I, (u8 *)(sB + 2)}; \
		group_mm<BM>(y, xg, wl, sA, sB, start, order, tiles, ntiles, O, I); \
	}

// qmv kernels by the tokens they take: qmv_ (8, and expert rows), qmv16_
// and qmv32_; the widest holds more accumulators and activations, so it
// takes the registers of one block an SM (MINB). (A 64-token kernel, four
// groups, spilled in the K-quants and lost to dequantizing for cuBLASLt:
// backend/cuda/NOTES.md, "Figures behind the code".) QKERNELS adds qmvt_,
// the expert rows by tiles of one expert, and the grouped products
// dequantizing their tiles (QGROUP_MM).
#define QMV(PRE, NAME, QT, TG, HI, MINB) \
	extern "C" __global__ void __launch_bounds__(256, MINB) PRE##NAME(void *out, int odt, const u16 *x, int T, int xdiv, const u8 *w, \
			long rb, long estride, const int *sel, const u8 *ws, int xsh, int O, int I, int acc) { \
		qmv<QT, false, TG, HI>(out, odt, x, T, xdiv, w, rb, estride, sel, ws, xsh, O, I, acc); \
	} \
	extern "C" __global__ void __launch_bounds__(256, MINB) PRE##swiglu_##NAME(void *out, int odt, const u16 *x, int T, int xdiv, \
			const u8 *w, long rb, long estride, const int *sel, const u8 *ws, int xsh, int O, int I) { \
		qmv<QT, true, TG, HI>(out, odt, x, T, xdiv, w, rb, estride, sel, ws, xsh, O, I, 0); \
	}
// qgemv kernels (the integer types): qgemv1_ and qgemv2_ by their tokens.
#define QGEMV(NAME, QT, NT) \
	extern "C" __global__ void __launch_bounds__(32 * QGEMV_MAXW, 1) qgemv##NT##_##NAME(void *out, int odt, const void *x, int xdt, \
			const u8 *w, long rb, int O, int I, QNorm nrm, int acc) { \
		qgemv<QT, NT, false>(out, odt, x, xdt, w, rb, O, I, nrm, acc); \
	} \
	extern "C" __global__ void __launch_bounds__(32 * QGEMV_MAXW, 1) qgemv##NT##_swiglu_##NAME(void *out, int odt, const void *x, int xdt, \
			const u8 *w, long rb, int O, int I, QNorm nrm) { \
		qgemv<QT, NT, true>(out, odt, x, xdt, w, rb, O, I, nrm, 0); \
	}
#define QGEMVS(NAME, QT) QGEMV(NAME, QT, 1) QGEMV(NAME, QT, 2)
#define QKERNELS(NAME, QT) \
	QMV(qmv_, NAME, QT, 1, false, 2) \
	QMV(qmv16_, NAME, QT, 1, true, 2) \
	QMV(qmv32_, NAME, QT, 2, true, 1) \
	extern "C" __global__ void __launch_bounds__(256, 2) qmvt_##NAME(void *out, int odt, const u16 *x, int xdiv, const u8 *w, long rb, \
			long estride, const int *start, const int *order, const int *tiles, const int *ntiles, int O, int I) { \
		qmv<QT, false, 1, true, true>(out, odt, x, 0, xdiv, w, rb, estride, nullptr, nullptr, 0, O, I, 0, start, order, tiles, ntiles); \
	} \
	extern "C" __global__ void __launch_bounds__(256, 2) qmvt_swiglu_##NAME(void *out, int odt, const u16 *x, int xdiv, const u8 *w, \
			long rb, long estride, const int *start, const int *order, const int *tiles, const int *ntiles, int O, int I) { \
		qmv<QT, true, 1, true, true>(out, odt, x, 0, xdiv, w, rb, estride, nullptr, nullptr, 0, O, I, 0, start, order, tiles, ntiles); \
	} \
	QGROUP_MM(NAME, QT, 64, 3) \
	QGROUP_MM(NAME, QT, 128, 2) \
	extern "C" __global__ void __launch_bounds__(256) qdeq_##NAME(u16 *out, const u8 *w, long rb, long rows, int I) { \
		qdeq<QT>(out, w, rb, rows, I); \
	} \
	extern "C" __global__ void __launch_bounds__(256) qembed_##NAME(float *out, const u8 *w, long rb, const int *tokens, int I, \
			int first, int V) { \
		qembed<QT>(out, w, rb, tokens, I, first, V); \
	}
QKERNELS(q8_0, QT_Q8_0)
QKERNELS(q4_k, QT_Q4_K)
QKERNELS(q5_k, QT_Q5_K)
QKERNELS(q6_k, QT_Q6_K)
QGEMVS(q8_0, QT_Q8_0)
QGEMVS(q4_k, QT_Q4_K)
QGEMVS(q5_k, QT_Q5_K)
QGEMVS(q6_k, QT_Q6_K)
QKERNELS(mxfp4, QT_MXFP4)
QKERNELS(fp8, QT_FP8)

// quant_fp8_act quantizes the activations of an FP8 weight's product for
// the block-scaled products (f8wg.cu, cuBLASLt's; fp8.go) and for the FP8
// experts' grouped products (moe_wg.cu): rows t < T of x (f32 or bf16, K columns;
// with swiglu, f32 rows of 2K whose halves g and u make silu(g) * u, as
// silu_mul writes it) become e4m3 rows of q (K bytes apart; rows T..Tp-1 zeros, the GEMM's
// padding to four tokens), with one float32 scale per row and 128 columns
// in s, [ceil(K/128)][Tp] (a block's scales contiguous, the layout of
// cuBLASLt's 1x128 scaling): s = amax / 448, q = x / s rounded to nearest
// (ties to even, saturating), as quant.E4M3Bits. A warp per (row,
// 128-column block), consecutive warps along a row, the block's warps
// taking rounds of them (a block of one warp per item read 0.8 TB/s: 84 us
// for 8K tokens of 2048 columns, H200); four columns a lane; K % 4 == 0.
// The e4m3 conversion needs F8_MMA's compiler. Launched overlapped: it
// lets the product after it start (f8wg requests its weights) and waits
// for the kernel before it.
extern "C" __global__ void __launch_bounds__(256) quant_fp8_act(u8 *q, float *s, const void *x, int xdt, int T, int Tp, int K, int swiglu) {
#if F8_MMA
	pdl_trigger();  // the product after it requests its first weights
	pdl_wait();
	int lane = threadIdx.x & 31, nb = (K + 127) >> 7;
	long items = (long)Tp * nb;
	for (long it = blockIdx.x * 8L + (threadIdx.x >> 5); it < items; it += gridDim.x * 8L) {
		int t = (int)(it / nb), b = (int)(it - (long)t * nb), c = 128 * b + 4 * lane;
		float v[4] = {0.f, 0.f, 0.f, 0.f};
		if (t < T && c < K) {
			if (swiglu) {
				const float *gu = (const float *)x + (long)t * 2 * K + c;
				float4 g = *(const float4 *)gu, u = *(const float4 *)(gu + K);
				v[0] = g.x / (1.f + __expf(-g.x)) * u.x, v[1] = g.y / (1.f + __expf(-g.y)) * u.y;
				v[2] = g.z / (1.f + __expf(-g.z)) * u.z, v[3] = g.w / (1.f + __expf(-g.w)) * u.w;
			} else if (xdt == DT_BF16) {
				uint2 u = *(const uint2 *)((const u16 *)x + (long)t * K + c);
				v[0] = __uint_as_float(u.x << 16), v[1] = __uint_as_float(u.x & 0xffff0000u);
				v[2] = __uint_as_float(u.y << 16), v[3] = __uint_as_float(u.y & 0xffff0000u);
			} else {
				float4 f = *(const float4 *)((const float *)x + (long)t * K + c);
				v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
			}
		}
		float a = warp_max(fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3]))));
		float sc = a > 0.f ? __fdiv_rn(a, 448.f) : 1.f;
		unsigned short lo, hi;
		asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(__fdiv_rn(v[1], sc)), "f"(__fdiv_rn(v[0], sc)));
		asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(__fdiv_rn(v[3], sc)), "f"(__fdiv_rn(v[2], sc)));
		if (c < K) *(unsigned *)(q + (long)t * K + c) = (unsigned)lo | (unsigned)hi << 16;
		if (lane == 0) s[(long)b * Tp + t] = sc;
	}
#else
	__trap();
#endif
}

// fp8_rows_out moves the first T rows of a padded GEMM result d (rows of
// O, out's type) to out, or adds them (f32 only).
extern "C" __global__ void fp8_rows_out(void *out, int odt, const void *d, long n, int accumulate) {
	for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
		if (odt == DT_BF16) {
			((u16 *)out)[i] = ((const u16 *)d)[i];
		} else {
			float v = ((const float *)d)[i];
			((float *)out)[i] = accumulate ? ((float *)out)[i] + v : v;
		}
	}
}
