// Macros of the AVX-512 kernels (kernels_amd64.s, quant_amd64.s).

// ZERO4 zeroes four zmm registers.
#define ZERO4(a, b, c, d) \
	VPXORD a, a, a; \
	VPXORD b, b, b; \
	VPXORD c, c, c; \
	VPXORD d, d, d
