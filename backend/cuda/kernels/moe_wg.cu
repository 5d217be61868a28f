// The grouped expert products on Hopper's wgmma: FP8 experts on its FP8
// tensor cores, where the dense FP8 products already take their activations
// in e4m3 (cuBLASLt's block-scaled GEMMs, fp8.go), and bf16 experts on its
// bf16 ones: y[order[j], o] = x_j . w[e]_o for the rows j of each tile of
// expert e, as moe_group lists them. group_mm (moe_mm.cuh) runs these
// products on mma.sync, dequantizing each tile of weights into shared
// memory: 3.0 ms a layer for the gate/up products of an 8K-token
// Coder-Next prompt in FP8 (113 TFLOP/s, H200), a third of its prefill;
// in bf16 (qnext12, 4K tokens) 1.44 ms a layer, 109 TFLOP/s, half its
// prefill.
//
// A stage is 128 bytes of a row: the tile's rows of x and MW_BN weight
// rows copied by cp.async as they are. FP8: the rows of x come quantized
// once (quant_fp8_act: e4m3 with a float32 scale a row and 128 columns),
// read through order (no gather), and the weights' device rows hold the
// 128-byte bodies of their blocks and then the blocks' scales (qlayout.go);
// a stage is one block of 128 columns, with its scales. bf16: the rows are
// the tokens' (bf16, read through order: gate/up's, cast once) or come
// gathered (moe_gather; down's, written by gate/up's tiles) and a stage is
// 64 columns. A warpgroup takes 64 of
// the tile's rows by its MW_BN outputs, one wgmma m64n128 each 32 bytes of
// columns with both operands in shared memory, K-major in the 128-byte
// swizzle (atoms of 8 rows 1024 bytes apart, 16-byte piece c of row r at
// c ^ (r % 8)). FP8: each stage's products go to fresh accumulators, which
// the row's scale times the weight row's adds to the totals (the scales
// change every 128 columns), so a stage's products are waited for before
// the next; 0.93 ms for those gate/up products. bf16: the products
// accumulate in place, and a stage's run while the next is issued; tiles
// of 128 rows are 256 outputs wide, which halves the reads of the rows
// (qnext12's 4K prompt: gate/up 0.82 -> 0.65 ms a layer, down 0.55 ->
// 0.39; the loads bound these tiles, not the products).
//
// wgmma is sm_90a's; mma.sync's e4m3 (sm_89 on) is emulated on Hopper
// (converted to f16 first) and ran the FP8 tiles in 2.8 ms. Grid (ceil(O /
// MW_BN), tiles allowed for), a warpgroup per 64 rows of a tile; an FP8
// warpgroup past the tile's rows skips its products. Requires I % 128 == 0
// (FP8) or I % 64 == 0 (bf16); the products are wgmma.cuh's.

// store_rows writes a thread's accumulators of a tile BN outputs wide to
// y[order[j]] (float32, or bf16 where ydt says) for its rows j < j1: rows
// r0 and r0 + 8, outputs c0 + 8 n and the next, c0 + 8 n < O.
template <int BN>
__device__ __forceinline__ void store_rows(void *y, int ydt, const float (&acc)[BN / 128][64], const int *order, int r0, int j1, int c0,
		int O) {
	bool bf = ydt == DT_BF16;
#pragma unroll
	for (int h = 0; h < 2; h++) {
		int j = r0 + 8 * h;
		if (j >= j1) continue;
		long row = (long)order[j] * O;
#pragma unroll
		for (int q = 0; q < BN / 128; q++)
#pragma unroll
			for (int n = 0; n < 16; n++) {
				int o = c0 + 128 * q + 8 * n;
				float v0 = acc[q][4 * n + 2 * h], v1 = acc[q][4 * n + 2 * h + 1];
				unsigned pb = pack_bf16(v0, v1);
				if (o + 1 < O && !(O & 1)) {
					if (bf)
						*(unsigned *)((u16 *)y + row + o) = pb;
					else
						*(float2 *)((float *)y + row + o) = make_float2(v0, v1);
				} else {
					if (o < O) st(y, row + o, ydt, v0);
					if (o + 1 < O) st(y, row + o + 1, ydt, v1);
				}
			}
	}
}

// store_swiglu writes silu(gate) * up in bf16 to row j of y ([rows, Io])
// for a thread's rows j < j1 of a tile of OB gate outputs, whose up
// outputs follow them among the accumulators (so a thread holds both).
template <int OB>
__device__ __forceinline__ void store_swiglu(u16 *y, const float (&acc)[OB / 64][64], int r0, int j1, int c0, int Io) {
	constexpr int NC = OB / 8;  // a thread's pairs of gate outputs
#pragma unroll
	for (int h = 0; h < 2; h++) {
		int j = r0 + 8 * h;
		if (j >= j1) continue;
		u16 *row = y + (long)j * Io;
#pragma unroll
		for (int c = 0; c < NC; c++) {
			int o = c0 + 8 * c;
			const float *g = &acc[c / 16][4 * (c % 16) + 2 * h], *u = &acc[(c + NC) / 16][4 * ((c + NC) % 16) + 2 * h];
			float v0 = g[0] / (1.f + __expf(-g[0])) * u[0], v1 = g[1] / (1.f + __expf(-g[1])) * u[1];
			if (o + 1 < Io && !(Io & 1)) {
				*(unsigned *)(row + o) = f2bf(v0) | (unsigned)f2bf(v1) << 16;
			} else {
				if (o < Io) row[o] = f2bf(v0);
				if (o + 1 < Io) row[o + 1] = f2bf(v1);
			}
		}
	}
}

// group_wg is the products of either kind (F8: xq and xs are quant_fp8_act's
// rows; else xq is bf16 rows, xs unused), row j of a tile's x being xq's
// row order[j] / xdiv, or j where xdiv is 0 (bf16 rows gathered); rb is a
// weight row's bytes, estride an expert's; y's rows are float32 or bf16
// (ydt; bf16 halves the bytes of the rows moe_combine reads). SW (bf16): w
// is an expert's gate rows then its up rows (O of them), and a tile takes
// BN / 2 of each, the same outputs, to write silu(gate) * up in bf16 as row
// j of y ([rows, O / 2]): the down product's gathered rows, with no f32
// rows written, read again, and gathered between them.
template <int BM, int BN, bool F8, bool SW = false>
__device__ __forceinline__ void group_wg(void *y, int ydt, const u8 *xq, const float *xs, int T, int xdiv, const u8 *w, long rb, long estride,
		const int *start, const int *order, const int *tiles, const int *ntiles, int O, int I) {
	constexpr int NTHR = 2 * BM, CA = BM * 8 / NTHR, CB = BN * 8 / NTHR;  // a warpgroup each 64 rows; a thread's 16-byte copies a stage
	constexpr int SA = BM * 128, SB = BN * 128;                           // a stage's bytes
	static_assert(!F8 || BN == MW_BN, "FP8 tiles are MW_BN outputs wide");
	// Stages loaded ahead: FP8 waits for each stage's products, bf16 lets
	// one group run on, so the stage it reads is refilled a step later.
	constexpr int AHEAD = F8 ? MW_STAGES - 1 : MW_STAGES - 2;
	extern __shared__ uint4 mw_smem[];
	unsigned base = (smem_addr(mw_smem) + 1023) & ~1023u;  // the swizzle's atoms are 1024-byte aligned
	unsigned sA = base, sB = base + MW_STAGES * SA;
	float *sX = (float *)((u8 *)mw_smem + (sB + MW_STAGES * SB - smem_addr(mw_smem))), *sW = sX + MW_STAGES * BM;
	int tile = blockIdx.y;
	if (tile >= *ntiles) return;
	int e = tiles[2 * tile], j0 = tiles[2 * tile + 1], j1 = min(j0 + BM, start[e + 1]);
	long ab = F8 ? I : 2 * I;  // a row's bytes
	constexpr int OB = SW ? BN / 2 : BN;  // a tile's outputs
	int o0 = blockIdx.x * OB, nk = ab >> 7;
	int lane = threadIdx.x & 31, wg = threadIdx.x >> 7, wr = (threadIdx.x >> 5) & 3;
	bool rows = j0 + 64 * wg < j1;  // this warpgroup has rows
	const u8 *we = w + e * estride;
	const u8 *ap[CA], *bp[CB];
	unsigned ad[CA], bd[CB];  // where each copy goes in a stage (swizzled)
	// Rows past the tile's end are not loaded: a row of products reads its
	// own row of x only, and theirs are not stored (a tile holds 80 of 128
	// rows on average in a 4K-token Qwen3-Next prompt; the loads, not the
	// products, bound these tiles).
	unsigned amask = 0;  // the copies that are rows of the tile
#pragma unroll
	for (int i = 0; i < CA; i++) {
		int c = threadIdx.x + NTHR * i, r = c >> 3, j = min(j0 + r, j1 - 1);
		ap[i] = xq + (xdiv ? order[j] / xdiv : j) * ab + (c & 7) * 16;
		ad[i] = r * 128 + (((c & 7) ^ (r & 7)) << 4);
		amask |= (unsigned)(j0 + r < j1) << i;
	}
#pragma unroll
	for (int i = 0; i < CB; i++) {
		int c = threadIdx.x + NTHR * i, r = c >> 3;
		int o = SW ? r / OB * (O / 2) + min(o0 + r % OB, O / 2 - 1) : min(o0 + r, O - 1);
		bp[i] = we + (long)o * rb + (c & 7) * 16;
		bd[i] = r * 128 + (((c & 7) ^ (r & 7)) << 4);
	}
	// FP8: threads below BM copy their row's scale, the last MW_BN their
	// weight row's.
	int wi = threadIdx.x - (NTHR - MW_BN);
	const float *spx = F8 ? xs + order[min(j0 + (int)threadIdx.x, j1 - 1)] / xdiv : nullptr;
	const float *spw = F8 ? (const float *)(we + (long)min(o0 + max(wi, 0), O - 1) * rb + (long)nk * 128) : nullptr;
	auto load = [&](int st, int kt) {
#pragma unroll
		for (int i = 0; i < CA; i++)
			if (amask >> i & 1) cp_async16(sA + st * SA + ad[i], ap[i] + kt * 128);
#pragma unroll
		for (int i = 0; i < CB; i++) cp_async16(sB + st * SB + bd[i], bp[i] + kt * 128);
		if (F8 && (int)threadIdx.x < j1 - j0) cp_async4(smem_addr(sX + st * BM + threadIdx.x), spx + (long)kt * T);
		if (F8 && wi >= 0) cp_async4(smem_addr(sW + st * MW_BN + wi), spw + kt);
	};
	float acc[BN / 128][64], part[64];  // acc[h]: outputs 128 h on
#pragma unroll
	for (int h = 0; h < BN / 128; h++)
#pragma unroll
		for (int i = 0; i < 64; i++) acc[h][i] = 0.f;
#pragma unroll
	for (int s = 0; s < AHEAD; s++) {
		if (s < nk) load(s, s);
		asm volatile("cp.async.commit_group;");
	}
	for (int kt = 0; kt < nk; kt++) {
		int st = kt % MW_STAGES;
		asm volatile("cp.async.wait_group %0;" ::"n"(AHEAD - 1));
		fence_async_smem();
		// Stage kt is in; every warpgroup is done with the stage about to
		// be refilled (bf16: its products were waited for last step).
		__syncthreads();
		int nx = kt + AHEAD;
		if (nx < nk) load(nx % MW_STAGES, nx);
		asm volatile("cp.async.commit_group;");
		// bf16: a warpgroup past the tile's rows multiplies what its stage
		// holds there (skipping would have ptxas serialize the products:
		// C7515).
		if (F8 && !rows) continue;
		wgmma_fence();
		if constexpr (F8) {
#pragma unroll
			for (int ks = 0; ks < 4; ks++) wgmma_e4m3_n<128>(part, wg_desc(sA + st * SA + wg * 64 * 128 + 32 * ks), wg_desc(sB + st * SB + 32 * ks), ks);
			wgmma_commit_wait<0>();
			const float *sx = sX + st * BM + 64 * wg + 16 * wr + (lane >> 2), *sw = sW + st * MW_BN + (lane & 3) * 2;
			float x0 = sx[0], x1 = sx[8];
#pragma unroll
			for (int n = 0; n < 16; n++) {
				float w0 = sw[8 * n], w1 = sw[8 * n + 1];
				acc[0][4 * n] = fmaf(part[4 * n], x0 * w0, acc[0][4 * n]);
				acc[0][4 * n + 1] = fmaf(part[4 * n + 1], x0 * w1, acc[0][4 * n + 1]);
				acc[0][4 * n + 2] = fmaf(part[4 * n + 2], x1 * w0, acc[0][4 * n + 2]);
				acc[0][4 * n + 3] = fmaf(part[4 * n + 3], x1 * w1, acc[0][4 * n + 3]);
			}
		} else {
#pragma unroll
			for (int ks = 0; ks < 4; ks++)
#pragma unroll
				for (int h = 0; h < BN / 128; h++)
					wgmma_bf16(acc[h], wg_desc(sA + st * SA + wg * 64 * 128 + 32 * ks), wg_desc(sB + st * SB + h * 128 * 128 + 32 * ks));
			wgmma_commit_wait<1>();
		}
	}
	asm volatile("cp.async.wait_group 0;");
	if (!F8) wgmma_commit_wait<0>();
	// The stores are functions of their own: written in place, the
	// SwiGLU's left the plain tiles' accumulators on the stack (NVRTC 12.4).
	int r0 = j0 + 64 * wg + 16 * wr + (lane >> 2), c0 = o0 + (lane & 3) * 2;  // this thread's first row and output
	if constexpr (SW)
		store_swiglu<OB>((u16 *)y, acc, r0, j1, c0, O / 2);
	else
		store_rows<BN>(y, ydt, acc, order, r0, j1, c0, O);
}

// moe_group_f8_64, moe_group_f8_128: the FP8 products in tiles of 64 and
// 128 rows (one and two warpgroups) by MW_BN outputs; moe_group_wg64,
// moe_group_wg128: the bf16 ones (moe_group_mm's arguments and xdiv, the
// rows read as group_wg reads them), the second by 2 MW_BN outputs, and
// moe_group_wg64_bf16, moe_group_wg128_bf16 the same writing bf16 rows (the
// output type a constant: as a branch it had ptxas serialize the products,
// C7514); moe_group_wg64_swiglu, moe_group_wg128_swiglu: those tiles as
// gate/up products with the SwiGLU (SW; y bf16 [rows, O / 2], gathered
// order).
// Shared memory moeGroupWGSmem;
// sm_90a only (elsewhere they trap).
#define MOE_GROUP_F8(BM) \
	extern "C" __global__ void __launch_bounds__(2 * BM, 1) moe_group_f8_##BM(void *y, int ydt, const u8 *xq, const float *xs, int T, \
			int xdiv, const u8 *w, long rb, long estride, const int *start, const int *order, const int *tiles, const int *ntiles, int O, \
			int I) { \
		if (WGMMA) { \
			group_wg<BM, MW_BN, true>(y, ydt, xq, xs, T, xdiv, w, rb, estride, start, order, tiles, ntiles, O, I); \
		} else { \
			__trap(); \
		} \
	}
MOE_GROUP_F8(64)
MOE_GROUP_F8(128)

#define MOE_GROUP_WG(BM, BN, SW, YDT, NAME) \
	extern "C" __global__ void __launch_bounds__(2 * BM, 1) NAME(void *y, const u16 *x, int xdiv, const u16 *w, const int *start, \
			const int *order, const int *tiles, const int *ntiles, int O, int I) { \
		if (WGMMA) { \
			group_wg<BM, BN, false, SW>(y, YDT, (const u8 *)x, nullptr, 0, xdiv, (const u8 *)w, 2L * I, 2L * O * I, start, order, tiles, \
					ntiles, O, I); \
		} else { \
			__trap(); \
		} \
	}
MOE_GROUP_WG(64, MW_BN, false, DT_F32, moe_group_wg64)
MOE_GROUP_WG(128, 2 * MW_BN, false, DT_F32, moe_group_wg128)
MOE_GROUP_WG(64, MW_BN, false, DT_BF16, moe_group_wg64_bf16)
MOE_GROUP_WG(128, 2 * MW_BN, false, DT_BF16, moe_group_wg128_bf16)
MOE_GROUP_WG(64, MW_BN, true, DT_BF16, moe_group_wg64_swiglu)
MOE_GROUP_WG(128, 2 * MW_BN, true, DT_BF16, moe_group_wg128_swiglu)
