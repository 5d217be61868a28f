// Grouped expert products on tensor cores, shared by moe.cu (bf16 experts)
// and quant.cu (block-quantized experts, dequantized as their tiles load).
// The (token, choice) rows are listed expert by expert (moe_group),
// gathered in that order as bf16 (moe_gather), and multiplied by their
// expert's weights in tiles of BM rows of one expert by MG_BN outputs,
// so that an expert's weights are read once per tile of its rows rather
// than once per row. The rows are rounded to bf16 as the dense products'
// inputs are (cuBLASLt takes bf16): as two parts, x = hi + lo, the
// products kept ~16 bits of the float32 rows at twice the tensor-core
// work, which a Qwen3-Next prompt paid for with 61% of its prefill
// (NOTES.md, 2026-11-28). The tile, BM rows by MG_BN outputs, MG_BK
// columns a stage, MG_STAGES stages, rows MG_P elements apart in shared
// memory, is in defines.cuh.

// group_mm: y[order[j], o] = sum_i xg[j, i] * w[e, o, i] for the rows j of
// each tile (of expert e). sA holds MG_STAGES stages of the tile's rows,
// sB stages of MG_BN weight rows by MG_BK columns, which the
// weight loader WL fills in two steps: fetch(sB stage, st, e, o0, kt)
// starts the copies of stage kt (cp.async, committed with the rows'),
// ready(sB stage, st, kt) finishes them once they are in, before the block's
// barrier (bf16: nothing; quantized: the blocks copied to a ring of
// MG_STAGES, st, dequantized into the stage), and WL::buf(kt) is stage
// kt's place in sB. Grid (ceil(O / MG_BN), tiles allowed for), 2 BM
// threads: warps of 32 rows by 64 outputs (BM / 32 by 2), mma.sync
// m16n8k16 with the rows as A and the weight rows as B; a warp's 16-row
// steps past the tile's rows skip their products, so a tile of a few rows
// costs what its weights' loads do. Requires I % MG_BK == 0.
template <int BM, class WL>
__device__ __forceinline__ void group_mm(float *y, const u16 *xg, WL &wl, u16 (*sA)[BM * MG_P], u16 (*sB)[MG_BN * MG_P],
		const int *start, const int *order, const int *tiles, const int *ntiles, int O, int I) {
	int tile = blockIdx.y;
	if (tile >= *ntiles) return;
	int e = tiles[2 * tile], j0 = tiles[2 * tile + 1], j1 = min(j0 + BM, start[e + 1]);
	int o0 = blockIdx.x * MG_BN;
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp % (BM / 32), wn = warp / (BM / 32);
	int mt = min(2, (j1 - j0 - wm * 32 + 15) >> 4);  // this warp's 16-row steps with rows (0 to 2)
	int mi = lane >> 3, mr = lane & 7;
	int nk = I / MG_BK;
	// Rows past the tile's end are not loaded (a row of products reads its
	// own row of x only, and theirs are not stored); outputs past O repeat
	// the last output.
	auto loadA = [&](int st, int kt) {
		int k0 = kt * MG_BK;
		for (int c = threadIdx.x; c < (j1 - j0) * (MG_BK / 8); c += 2 * BM) {
			int r = c / (MG_BK / 8), col = c % (MG_BK / 8) * 8;
			cp_async16(smem_addr(&sA[st][r * MG_P + col]), xg + (long)(j0 + r) * I + k0 + col);
		}
	};
	float acc[2][8][4];
#pragma unroll
	for (int t = 0; t < 2; t++)
#pragma unroll
		for (int n = 0; n < 8; n++) acc[t][n][0] = acc[t][n][1] = acc[t][n][2] = acc[t][n][3] = 0.f;
#pragma unroll
	for (int s = 0; s < MG_STAGES - 1; s++) {
		if (s < nk) {
			loadA(s, s);
			wl.fetch(sB[WL::buf(s)], s, e, o0, s);
		}
		asm volatile("cp.async.commit_group;");
	}
	for (int kt = 0; kt < nk; kt++) {
		int st = kt % MG_STAGES;
		asm volatile("cp.async.wait_group %0;" ::"n"(MG_STAGES - 2));
		wl.ready(sB[WL::buf(kt)], st, kt);
		__syncthreads();  // stage kt is in; every warp is done with the stages about to be refilled
		int nx = kt + MG_STAGES - 1;
		if (nx < nk) {
			loadA(nx % MG_STAGES, nx);
			wl.fetch(sB[WL::buf(nx)], nx % MG_STAGES, e, o0, nx);
		}
		asm volatile("cp.async.commit_group;");
		const u16 *sb = sB[WL::buf(kt)];
		if (mt <= 0) continue;
#pragma unroll
		for (int ks = 0; ks < MG_BK / 32; ks++) {
			unsigned a[2][2][4];  // [row tile][k step][fragment]
#pragma unroll
			for (int t = 0; t < 2; t++)
#pragma unroll
				for (int k = 0; k < 2; k++)
					ldmatrix_x4(smem_addr(&sA[st][(wm * 32 + t * 16 + mr + (mi & 1) * 8) * MG_P + ks * 32 + k * 16 + (mi >> 1) * 8]),
							a[t][k][0], a[t][k][1], a[t][k][2], a[t][k][3]);
#pragma unroll
			for (int n = 0; n < 8; n++) {
				unsigned b0, b1, b2, b3;  // k step 0: b0, b1; k step 1: b2, b3
				ldmatrix_x4(smem_addr(&sb[(wn * 64 + n * 8 + mr) * MG_P + ks * 32 + mi * 8]), b0, b1, b2, b3);
				mma_bf16(acc[0][n], a[0][0][0], a[0][0][1], a[0][0][2], a[0][0][3], b0, b1);
				mma_bf16(acc[0][n], a[0][1][0], a[0][1][1], a[0][1][2], a[0][1][3], b2, b3);
				if (mt > 1) {
					mma_bf16(acc[1][n], a[1][0][0], a[1][0][1], a[1][0][2], a[1][0][3], b0, b1);
					mma_bf16(acc[1][n], a[1][1][0], a[1][1][1], a[1][1][2], a[1][1][3], b2, b3);
				}
			}
		}
	}
	asm volatile("cp.async.wait_group 0;");
#pragma unroll
	for (int t = 0; t < 2; t++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			int j = j0 + wm * 32 + t * 16 + (lane >> 2) + h * 8;
			if (j >= j1) continue;
			long row = (long)order[j] * O;
#pragma unroll
			for (int n = 0; n < 8; n++) {
				int o = o0 + wn * 64 + n * 8 + (lane & 3) * 2;
				if (o < O) y[row + o] = acc[t][n][2 * h];
				if (o + 1 < O) y[row + o + 1] = acc[t][n][2 * h + 1];
			}
		}
}
