// Hopper's warpgroup products (wgmma, sm_90a): the descriptors, the
// products and their fences, for moe_wg.cu and flash.cu. Elsewhere the
// products trap: their kernels run only where the Go side found sm_90a.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA 1
#else
#define WGMMA 0
#endif

// wg_desc is the shared-memory descriptor of a K-major operand in the
// 128-byte swizzle whose 8-row atoms are 1024 bytes apart, from shared
// address a.
__device__ __forceinline__ unsigned long long wg_desc(unsigned a) {
	return (unsigned long long)((a & 0x3ffff) >> 4) | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

// wgmma_e4m3_n is d (+)= A . B^T for a warpgroup: 64 rows (da) by N = 8,
// 16 or 128 outputs (db), 32 columns; add 0 overwrites d. A
// thread's d[4 j + 2 h + e] is row 16 warp + lane / 4 + 8 h, output 8 j + 2
// (lane % 4) + e.
template <int N>
__device__ __forceinline__ void wgmma_e4m3_n(float (&d)[N / 2], unsigned long long da, unsigned long long db, int add) {
	static_assert(N == 8 || N == 16 || N == 128, "wgmma_e4m3_n: 8, 16 or 128 outputs");
#if WGMMA
	if constexpr (N == 8) {
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
			"wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
			: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
			: "l"(da), "l"(db), "r"(add));
	}
	if constexpr (N == 16) {
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
			"wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
			: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
			: "l"(da), "l"(db), "r"(add));
	}
	if constexpr (N == 128) {
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
			"wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
			: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
			: "l"(da), "l"(db), "r"(add));
	}
#else
	__trap();
#endif
}

// wgmma_bf16 is d += A . B^T for a warpgroup: 64 rows (da) by 128 outputs
// (db), 16 columns.
__device__ __forceinline__ void wgmma_bf16(float (&d)[64], unsigned long long da, unsigned long long db) {
#if WGMMA
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
		: "l"(da), "l"(db), "n"(1));
#else
	__trap();
#endif
}

// wgmma_bf16_n64 is d (+)= A . B^T for a warpgroup: 64 rows (da) by 64
// outputs (db), 16 columns; add 0 overwrites d.
__device__ __forceinline__ void wgmma_bf16_n64(float (&d)[32], unsigned long long da, unsigned long long db, int add) {
#if WGMMA
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
		: "l"(da), "l"(db), "r"(add));
#else
	__trap();
#endif
}

// wg_desc_mn is the descriptor of an MN-major operand (transposed: rows of
// 64 elements along M or N, one k each) in the 128-byte swizzle, 8-row
// atoms 1024 bytes apart along k, blocks of 64 elements along M or N lbo
// bytes apart (CUTLASS's SW128 MN-major canonical layout).
__device__ __forceinline__ unsigned long long wg_desc_mn(unsigned a, unsigned lbo) {
	return wg_desc(a) | (unsigned long long)(lbo >> 4) << 16;
}

// wgmma_bf16_rs is d += A . B for a warpgroup, N = 64, 128 or 256 outputs: A's
// 64 rows from registers (a: each warp's 16 rows as an mma.sync A
// fragment), B (db) MN-major in shared memory, 16 columns; the outputs are
// d[N0 .. N0 + N / 8) of a thread's accumulators in mma.sync's layout.
template <int N, int N0, int NT>
__device__ __forceinline__ void wgmma_bf16_rs(float (&d)[NT][4], const unsigned (&a)[4], unsigned long long db) {
	static_assert(N == 64 || N == 128 || N == 256, "wgmma_bf16_rs: 64, 128 or 256 outputs");
#if WGMMA
	if constexpr (N == 64) {
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
			"wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
			: "+f"(d[N0 + 0][0]), "+f"(d[N0 + 0][1]), "+f"(d[N0 + 0][2]), "+f"(d[N0 + 0][3]), "+f"(d[N0 + 1][0]), "+f"(d[N0 + 1][1]), "+f"(d[N0 + 1][2]), "+f"(d[N0 + 1][3]), "+f"(d[N0 + 2][0]), "+f"(d[N0 + 2][1]), "+f"(d[N0 + 2][2]), "+f"(d[N0 + 2][3]), "+f"(d[N0 + 3][0]), "+f"(d[N0 + 3][1]), "+f"(d[N0 + 3][2]), "+f"(d[N0 + 3][3]), "+f"(d[N0 + 4][0]), "+f"(d[N0 + 4][1]), "+f"(d[N0 + 4][2]), "+f"(d[N0 + 4][3]), "+f"(d[N0 + 5][0]), "+f"(d[N0 + 5][1]), "+f"(d[N0 + 5][2]), "+f"(d[N0 + 5][3]), "+f"(d[N0 + 6][0]), "+f"(d[N0 + 6][1]), "+f"(d[N0 + 6][2]), "+f"(d[N0 + 6][3]), "+f"(d[N0 + 7][0]), "+f"(d[N0 + 7][1]), "+f"(d[N0 + 7][2]), "+f"(d[N0 + 7][3])
			: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(1));
	}
	if constexpr (N == 128) {
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
			"wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
			: "+f"(d[N0 + 0][0]), "+f"(d[N0 + 0][1]), "+f"(d[N0 + 0][2]), "+f"(d[N0 + 0][3]), "+f"(d[N0 + 1][0]), "+f"(d[N0 + 1][1]), "+f"(d[N0 + 1][2]), "+f"(d[N0 + 1][3]), "+f"(d[N0 + 2][0]), "+f"(d[N0 + 2][1]), "+f"(d[N0 + 2][2]), "+f"(d[N0 + 2][3]), "+f"(d[N0 + 3][0]), "+f"(d[N0 + 3][1]), "+f"(d[N0 + 3][2]), "+f"(d[N0 + 3][3]), "+f"(d[N0 + 4][0]), "+f"(d[N0 + 4][1]), "+f"(d[N0 + 4][2]), "+f"(d[N0 + 4][3]), "+f"(d[N0 + 5][0]), "+f"(d[N0 + 5][1]), "+f"(d[N0 + 5][2]), "+f"(d[N0 + 5][3]), "+f"(d[N0 + 6][0]), "+f"(d[N0 + 6][1]), "+f"(d[N0 + 6][2]), "+f"(d[N0 + 6][3]), "+f"(d[N0 + 7][0]), "+f"(d[N0 + 7][1]), "+f"(d[N0 + 7][2]), "+f"(d[N0 + 7][3]), "+f"(d[N0 + 8][0]), "+f"(d[N0 + 8][1]), "+f"(d[N0 + 8][2]), "+f"(d[N0 + 8][3]), "+f"(d[N0 + 9][0]), "+f"(d[N0 + 9][1]), "+f"(d[N0 + 9][2]), "+f"(d[N0 + 9][3]), "+f"(d[N0 + 10][0]), "+f"(d[N0 + 10][1]), "+f"(d[N0 + 10][2]), "+f"(d[N0 + 10][3]), "+f"(d[N0 + 11][0]), "+f"(d[N0 + 11][1]), "+f"(d[N0 + 11][2]), "+f"(d[N0 + 11][3]), "+f"(d[N0 + 12][0]), "+f"(d[N0 + 12][1]), "+f"(d[N0 + 12][2]), "+f"(d[N0 + 12][3]), "+f"(d[N0 + 13][0]), "+f"(d[N0 + 13][1]), "+f"(d[N0 + 13][2]), "+f"(d[N0 + 13][3]), "+f"(d[N0 + 14][0]), "+f"(d[N0 + 14][1]), "+f"(d[N0 + 14][2]), "+f"(d[N0 + 14][3]), "+f"(d[N0 + 15][0]), "+f"(d[N0 + 15][1]), "+f"(d[N0 + 15][2]), "+f"(d[N0 + 15][3])
			: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(1));
	}
	if constexpr (N == 256) {
		asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
			"wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
			: "+f"(d[N0 + 0][0]), "+f"(d[N0 + 0][1]), "+f"(d[N0 + 0][2]), "+f"(d[N0 + 0][3]), "+f"(d[N0 + 1][0]), "+f"(d[N0 + 1][1]), "+f"(d[N0 + 1][2]), "+f"(d[N0 + 1][3]), "+f"(d[N0 + 2][0]), "+f"(d[N0 + 2][1]), "+f"(d[N0 + 2][2]), "+f"(d[N0 + 2][3]), "+f"(d[N0 + 3][0]), "+f"(d[N0 + 3][1]), "+f"(d[N0 + 3][2]), "+f"(d[N0 + 3][3]), "+f"(d[N0 + 4][0]), "+f"(d[N0 + 4][1]), "+f"(d[N0 + 4][2]), "+f"(d[N0 + 4][3]), "+f"(d[N0 + 5][0]), "+f"(d[N0 + 5][1]), "+f"(d[N0 + 5][2]), "+f"(d[N0 + 5][3]), "+f"(d[N0 + 6][0]), "+f"(d[N0 + 6][1]), "+f"(d[N0 + 6][2]), "+f"(d[N0 + 6][3]), "+f"(d[N0 + 7][0]), "+f"(d[N0 + 7][1]), "+f"(d[N0 + 7][2]), "+f"(d[N0 + 7][3]), "+f"(d[N0 + 8][0]), "+f"(d[N0 + 8][1]), "+f"(d[N0 + 8][2]), "+f"(d[N0 + 8][3]), "+f"(d[N0 + 9][0]), "+f"(d[N0 + 9][1]), "+f"(d[N0 + 9][2]), "+f"(d[N0 + 9][3]), "+f"(d[N0 + 10][0]), "+f"(d[N0 + 10][1]), "+f"(d[N0 + 10][2]), "+f"(d[N0 + 10][3]), "+f"(d[N0 + 11][0]), "+f"(d[N0 + 11][1]), "+f"(d[N0 + 11][2]), "+f"(d[N0 + 11][3]), "+f"(d[N0 + 12][0]), "+f"(d[N0 + 12][1]), "+f"(d[N0 + 12][2]), "+f"(d[N0 + 12][3]), "+f"(d[N0 + 13][0]), "+f"(d[N0 + 13][1]), "+f"(d[N0 + 13][2]), "+f"(d[N0 + 13][3]), "+f"(d[N0 + 14][0]), "+f"(d[N0 + 14][1]), "+f"(d[N0 + 14][2]), "+f"(d[N0 + 14][3]), "+f"(d[N0 + 15][0]), "+f"(d[N0 + 15][1]), "+f"(d[N0 + 15][2]), "+f"(d[N0 + 15][3]), "+f"(d[N0 + 16][0]), "+f"(d[N0 + 16][1]), "+f"(d[N0 + 16][2]), "+f"(d[N0 + 16][3]), "+f"(d[N0 + 17][0]), "+f"(d[N0 + 17][1]), "+f"(d[N0 + 17][2]), "+f"(d[N0 + 17][3]), "+f"(d[N0 + 18][0]), "+f"(d[N0 + 18][1]), "+f"(d[N0 + 18][2]), "+f"(d[N0 + 18][3]), "+f"(d[N0 + 19][0]), "+f"(d[N0 + 19][1]), "+f"(d[N0 + 19][2]), "+f"(d[N0 + 19][3]), "+f"(d[N0 + 20][0]), "+f"(d[N0 + 20][1]), "+f"(d[N0 + 20][2]), "+f"(d[N0 + 20][3]), "+f"(d[N0 + 21][0]), "+f"(d[N0 + 21][1]), "+f"(d[N0 + 21][2]), "+f"(d[N0 + 21][3]), "+f"(d[N0 + 22][0]), "+f"(d[N0 + 22][1]), "+f"(d[N0 + 22][2]), "+f"(d[N0 + 22][3]), "+f"(d[N0 + 23][0]), "+f"(d[N0 + 23][1]), "+f"(d[N0 + 23][2]), "+f"(d[N0 + 23][3]), "+f"(d[N0 + 24][0]), "+f"(d[N0 + 24][1]), "+f"(d[N0 + 24][2]), "+f"(d[N0 + 24][3]), "+f"(d[N0 + 25][0]), "+f"(d[N0 + 25][1]), "+f"(d[N0 + 25][2]), "+f"(d[N0 + 25][3]), "+f"(d[N0 + 26][0]), "+f"(d[N0 + 26][1]), "+f"(d[N0 + 26][2]), "+f"(d[N0 + 26][3]), "+f"(d[N0 + 27][0]), "+f"(d[N0 + 27][1]), "+f"(d[N0 + 27][2]), "+f"(d[N0 + 27][3]), "+f"(d[N0 + 28][0]), "+f"(d[N0 + 28][1]), "+f"(d[N0 + 28][2]), "+f"(d[N0 + 28][3]), "+f"(d[N0 + 29][0]), "+f"(d[N0 + 29][1]), "+f"(d[N0 + 29][2]), "+f"(d[N0 + 29][3]), "+f"(d[N0 + 30][0]), "+f"(d[N0 + 30][1]), "+f"(d[N0 + 30][2]), "+f"(d[N0 + 30][3]), "+f"(d[N0 + 31][0]), "+f"(d[N0 + 31][1]), "+f"(d[N0 + 31][2]), "+f"(d[N0 + 31][3])
			: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "n"(1));
	}
#else
	__trap();
#endif
}

__device__ __forceinline__ void wgmma_fence() {
#if WGMMA
	asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
// wgmma_commit_wait commits the products issued and waits until at most N
// groups of them are running.
template <int N>
__device__ __forceinline__ void wgmma_commit_wait() {
#if WGMMA
	asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}
// fence_async_smem orders this thread's writes to shared memory before the
// async proxy's reads (wgmma's operands).
__device__ __forceinline__ void fence_async_smem() {
#if WGMMA
	asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

