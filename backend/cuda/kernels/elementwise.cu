// Row-wise and element-wise operations.

// embed: out[t] = the row tokens[t] - first of the table (V rows), or
// zeros for a token outside them (a rank's share of a table split by
// vocabulary). Grid T.
extern "C" __global__ void embed(float *out, const void *table, int dt, const int *tokens, int H, int first, int V) {
	int t = blockIdx.x, row = tokens[t] - first;
	long base = (long)row * H;
	bool in = row >= 0 && row < V;
	for (int i = threadIdx.x; i < H; i += blockDim.x) out[(long)t * H + i] = in ? ld(table, base + i, dt) : 0.f;
}

// rmsnorm normalises each row of x (one block per row) into out of type odt
// (f32 or bf16); an f32 out may alias x.
extern "C" __global__ void rmsnorm(void *out, int odt, const float *x, const void *w, int wdt, int n, float eps, int unitOffset) {
	pdl_trigger();  // a matrix product usually follows
	pdl_wait();
	__shared__ float red[32];
	const float *xr = x + (long)blockIdx.x * n;
	long base = (long)blockIdx.x * n;
	float ss = 0.f;
	for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
	float s = rsqrtf(block_sum(ss, red) / n + eps);
	for (int i = threadIdx.x; i < n; i += blockDim.x) {
		float g = ld(w, i, wdt);
		if (unitOffset) g += 1.f;
		st(out, base + i, odt, xr[i] * s * g);
	}
}

// rmsnorm_v4: the same for rows of n = 4k floats (16-byte aligned), each row
// read once into registers: V4 float4 per thread, 256 threads.
template <int V4>
__device__ __forceinline__ void rmsnorm_v4(void *out, int odt, const float *x, const void *w, int wdt, int n, float eps, int unitOffset) {
	pdl_trigger();  // a matrix product usually follows
	pdl_wait();
	__shared__ float red[32];
	const float4 *xr = (const float4 *)(x + (long)blockIdx.x * n);
	long row = (long)blockIdx.x * (n >> 2);  // in units of four elements
	int n4 = n >> 2;
	float4 v[V4];
	float ss = 0.f;
#pragma unroll
	for (int j = 0; j < V4; j++) {
		int i = threadIdx.x + j * blockDim.x;
		v[j] = i < n4 ? xr[i] : make_float4(0.f, 0.f, 0.f, 0.f);
		ss += v[j].x * v[j].x + v[j].y * v[j].y + v[j].z * v[j].z + v[j].w * v[j].w;
	}
	float s = rsqrtf(block_sum(ss, red) / n + eps);
	float u = unitOffset ? 1.f : 0.f;
#pragma unroll
	for (int j = 0; j < V4; j++) {
		int i = threadIdx.x + j * blockDim.x;
		if (i < n4) {
			float4 o;
			o.x = v[j].x * s * (ld(w, 4 * i, wdt) + u);
			o.y = v[j].y * s * (ld(w, 4 * i + 1, wdt) + u);
			o.z = v[j].z * s * (ld(w, 4 * i + 2, wdt) + u);
			o.w = v[j].w * s * (ld(w, 4 * i + 3, wdt) + u);
			if (odt == DT_BF16) ((uint2 *)out)[row + i] = make_uint2(pack_bf16(o.x, o.y), pack_bf16(o.z, o.w));
			else ((float4 *)out)[row + i] = o;
		}
	}
}

#define RMSNORM_V4(V4) \
	extern "C" __global__ void __launch_bounds__(256) rmsnorm_v4_##V4(void *out, int odt, const float *x, const void *w, int wdt, int n, float eps, int unitOffset) { \
		rmsnorm_v4<V4>(out, odt, x, w, wdt, n, eps, unitOffset); \
	}
RMSNORM_V4(1)
RMSNORM_V4(2)
RMSNORM_V4(4)
RMSNORM_V4(8)

// gated_rmsnorm: out = w * rmsnorm(x) * silu(z) per head of dim elements
// (a warp a head, eight a block; rows of width elements), out f32 or bf16
// (odt); z's rows are ldz floats apart (the projection may hold the conv's
// inputs before z). The sums are dn_recur's (its fused norm of a decode
// step). (A block a head took 111 us of a 4K prompt at Qwen3-Next's 32
// heads of 128 on an H200, 2.8x its bytes.)
extern "C" __global__ void gated_rmsnorm(void *out, int odt, const float *x, const float *z, int ldz, const void *w, int wdt, int dim,
		int width, float eps, int heads) {
	int head = blockIdx.x * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
	if (head >= heads) return;
	long base = (long)head * dim, zb = base / width * ldz + base % width;
	float ss = 0.f;
#pragma unroll 4
	for (int i = lane; i < dim; i += 32) ss += x[base + i] * x[base + i];
	float s = rsqrtf(warp_sum(ss) / dim + eps);
#pragma unroll 4
	for (int i = lane; i < dim; i += 32) {
		float zv = z[zb + i];
		st(out, base + i, odt, ld(w, i, wdt) * (x[base + i] * s) * (zv / (1.f + __expf(-zv))));
	}
}

// silu_mul: out[r, i] = silu(gu[r, i]) * gu[r, I + i].
extern "C" __global__ void silu_mul(float *out, const float *gu, int rows, int I) {
	pdl_trigger();  // a matrix product usually follows
	long n = (long)rows * I;
	for (long k = blockIdx.x * (long)blockDim.x + threadIdx.x; k < n; k += (long)gridDim.x * blockDim.x) {
		long r = k / I, i = k - r * I;
		float g = gu[r * 2 * I + i], u = gu[r * 2 * I + I + i];
		out[k] = g / (1.f + __expf(-g)) * u;
	}
}

// silu_mul_bf16: the same on bf16 rows, eight elements at a time (I % 8 ==
// 0), for the products of cuBLASLt that read and write bf16.
extern "C" __global__ void silu_mul_bf16(u16 *out, const u16 *gu, int rows, int I) {
	pdl_trigger();
	long I8 = I / 8, n = (long)rows * I8;
	for (long k = blockIdx.x * (long)blockDim.x + threadIdx.x; k < n; k += (long)gridDim.x * blockDim.x) {
		long r = k / I8, i = k - r * I8;
		float g[8], u[8];
		unpack8(((const uint4 *)gu)[r * 2 * I8 + i], g);
		unpack8(((const uint4 *)gu)[r * 2 * I8 + I8 + i], u);
		float a[8];
#pragma unroll
		for (int j = 0; j < 8; j++) a[j] = g[j] / (1.f + __expf(-g[j])) * u[j];
		((uint4 *)out)[k] = make_uint4(pack_bf16(a[0], a[1]), pack_bf16(a[2], a[3]), pack_bf16(a[4], a[5]), pack_bf16(a[6], a[7]));
	}
}

// gather_rows: out[r] = x[rows[r]] for rows of H floats (one block per row).
extern "C" __global__ void gather_rows(float *out, const float *x, const int *rows, int H) {
	const float *src = x + (long)rows[blockIdx.x] * H;
	for (int i = threadIdx.x; i < H; i += blockDim.x) out[(long)blockIdx.x * H + i] = src[i];
}

// copy_cols: columns [ocol, ocol+w) of each row of out (oW wide) take
// columns [xcol, xcol+w) of the row of x (xW wide), in 2-byte units. Grid
// (rows, blocks a row): a wide row (a rank's share of the logits) takes
// many blocks.
extern "C" __global__ void copy_cols(u16 *out, int oW, int ocol, const u16 *x, int xW, int xcol, int w) {
	const u16 *src = x + (long)blockIdx.x * xW + xcol;
	u16 *dst = out + (long)blockIdx.x * oW + ocol;
	for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < w; i += gridDim.y * blockDim.x) dst[i] = src[i];
}

// zero_f32: x[k] = 0 for n floats, once the kernel before is done (a
// rank's residual made a partial sum: a memset would end the chain of
// overlapped launches, so the product after it could not start early).
extern "C" __global__ void zero_f32(float *x, long n) {
	pdl_trigger();
	pdl_wait();
	for (long k = blockIdx.x * (long)blockDim.x + threadIdx.x; k < n; k += (long)gridDim.x * blockDim.x) x[k] = 0.f;
}

// mul_sigmoid: x[k] *= sigmoid(gate[k]) for n elements, x of type xdt.
extern "C" __global__ void mul_sigmoid(void *x, int xdt, const float *gate, long n) {
	for (long k = blockIdx.x * (long)blockDim.x + threadIdx.x; k < n; k += (long)gridDim.x * blockDim.x)
		st(x, k, xdt, ld(x, k, xdt) * (1.f / (1.f + __expf(-gate[k]))));
}

// cast converts n elements of type idt to type odt (the rare conversions
// to_half does not cover).
extern "C" __global__ void cast(void *out, int odt, const void *in, int idt, long n) {
	for (long k = blockIdx.x * (long)blockDim.x + threadIdx.x; k < n; k += (long)gridDim.x * blockDim.x) st(out, k, odt, ld(in, k, idt));
}

// to_half converts n floats to bf16 (dt 1) or f16 (dt 2) for cuBLASLt,
// four at a time when both arrays are 16-byte aligned.
extern "C" __global__ void to_half(u16 *out, const float *in, long n, int dt) {
	long first = blockIdx.x * (long)blockDim.x + threadIdx.x, stride = (long)gridDim.x * blockDim.x;
	long n4 = (((unsigned long)in | (unsigned long)out) & 15) == 0 ? n / 4 : 0;
	for (long k = first; k < n4; k += stride) {
		float4 v = ((const float4 *)in)[k];
		uint2 u;
		if (dt == DT_BF16) {
			u.x = f2bf(v.x) | (unsigned)f2bf(v.y) << 16;
			u.y = f2bf(v.z) | (unsigned)f2bf(v.w) << 16;
		} else {
			u.x = f2h(v.x) | (unsigned)f2h(v.y) << 16;
			u.y = f2h(v.z) | (unsigned)f2h(v.w) << 16;
		}
		((uint2 *)out)[k] = u;
	}
	for (long k = 4 * n4 + first; k < n; k += stride) out[k] = dt == DT_BF16 ? f2bf(in[k]) : f2h(in[k]);
}
