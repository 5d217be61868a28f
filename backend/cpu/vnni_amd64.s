#include "textflag.h"

// The Q8_0 prompt kernel on AVX-512 VNNI (quant.go's pair layout): tiles of
// four weight rows by four input rows, two blocks of 32 (a zmm) a step.
// VPDPBUSD multiplies unsigned bytes by signed ones, so the weights are
// biased by 128 (w XOR 0x80 = w + 128 as unsigned) and each input block's
// accumulator starts at -128 times its quants' sum, which the layout keeps
// in the block's first lane: the lanes of a block then sum to its integer
// dot product exactly. Per step and pair of rows: a copy of that start,
// VPDPBUSD, a conversion, the scales' product and one multiply-add, where
// the AVX2 kernel (dotQ8_0x4AVX) takes eight instructions a block.

// WPAIR loads weight row base's next two blocks: quants biased into zmm
// register WQ (its ymm YQ), scales d as 8 + 8 float32 lanes in WS (YS); K1
// selects the high eight words, Z31 holds 0x80 bytes.
#define WPAIR(base, YQ, WQ, YS, WS) \
	VMOVDQU64     2 base, YQ; \
	VINSERTI64X4  $1, 36 base, WQ, WQ; \
	VPXORD        Z31, WQ, WQ; \
	VPBROADCASTW  0 base, YS; \
	VPBROADCASTW  34 base, K1, YS; \
	VCVTPH2PS     YS, WS

// XDOT adds to SUM the pair of blocks of weight row (WQ, WS) against the
// input pair loaded in Z24 (quants), Z25 (scales) and Z26 (starts); A and
// S are scratch.
#define XDOT(WQ, WS, A, S, SUM) \
	VMOVDQA32   Z26, A; \
	VPDPBUSD    Z24, WQ, A; \
	VCVTDQ2PS   A, A; \
	VMULPS      Z25, WS, S; \
	VFMADD231PS S, A, SUM

// XLOAD loads input row x's pair into Z24-Z26.
#define XLOAD(x) \
	VMOVDQU64 0 x, Z24; \
	VMOVUPS   64 x, Z25; \
	VMOVDQU64 128 x, Z26

// HSUM16 stores the sum of zmm register Z's 16 lanes at addr (Y, X its
// ymm and xmm; T, TX scratch).
#define HSUM16(Z, Y, X, T, TX, addr) \
	VEXTRACTF64X4 $1, Z, T; \
	VADDPS        T, Y, Y; \
	VEXTRACTF32X4 $1, Y, TX; \
	VADDPS        TX, X, X; \
	VHADDPS       X, X, X; \
	VHADDPS       X, X, X; \
	VMOVSS        X, addr

// func dotQ8_0x4VNNI(w *byte, rows int, x *byte, xstride int, np int, out *float32)
// out[r*4+j] for weight rows r < rows (Q8_0, np pairs of blocks each, rows
// consecutive) and input rows j < 4 (pair layout, xstride bytes apart).
TEXT ·dotQ8_0x4VNNI(SB), NOSPLIT, $0-48
	MOVQ w+0(FP), BX
	MOVQ rows+8(FP), R8
	MOVQ xstride+24(FP), R13
	MOVQ np+32(FP), R10
	MOVQ out+40(FP), R12
	IMUL3Q $68, R10, R9 // bytes of a weight row
	MOVL $0x80808080, AX
	VPBROADCASTD AX, Z31
	MOVL $0xff00, AX
	KMOVW AX, K1

vquad:
	CMPQ R8, $4
	JLT  vsingle
	MOVQ BX, SI
	LEAQ (BX)(R9*2), R11
	ADDQ R9, R11 // row 3
	MOVQ x+16(FP), DI
	LEAQ (DI)(R13*2), DX
	ADDQ R13, DX // input row 3
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	VPXORD Z4, Z4, Z4
	VPXORD Z5, Z5, Z5
	VPXORD Z6, Z6, Z6
	VPXORD Z7, Z7, Z7
	VPXORD Z8, Z8, Z8
	VPXORD Z9, Z9, Z9
	VPXORD Z10, Z10, Z10
	VPXORD Z11, Z11, Z11
	VPXORD Z12, Z12, Z12
	VPXORD Z13, Z13, Z13
	VPXORD Z14, Z14, Z14
	VPXORD Z15, Z15, Z15
	MOVQ R10, CX

vquadpair:
	WPAIR((SI), Y16, Z16, Y20, Z20)
	WPAIR((SI)(R9*1), Y17, Z17, Y21, Z21)
	WPAIR((SI)(R9*2), Y18, Z18, Y22, Z22)
	WPAIR((R11), Y19, Z19, Y23, Z23)
	XLOAD((DI))
	XDOT(Z16, Z20, Z27, Z29, Z0)
	XDOT(Z17, Z21, Z28, Z30, Z4)
	XDOT(Z18, Z22, Z27, Z29, Z8)
	XDOT(Z19, Z23, Z28, Z30, Z12)
	XLOAD((DI)(R13*1))
	XDOT(Z16, Z20, Z27, Z29, Z1)
	XDOT(Z17, Z21, Z28, Z30, Z5)
	XDOT(Z18, Z22, Z27, Z29, Z9)
	XDOT(Z19, Z23, Z28, Z30, Z13)
	XLOAD((DI)(R13*2))
	XDOT(Z16, Z20, Z27, Z29, Z2)
	XDOT(Z17, Z21, Z28, Z30, Z6)
	XDOT(Z18, Z22, Z27, Z29, Z10)
	XDOT(Z19, Z23, Z28, Z30, Z14)
	XLOAD((DX))
	XDOT(Z16, Z20, Z27, Z29, Z3)
	XDOT(Z17, Z21, Z28, Z30, Z7)
	XDOT(Z18, Z22, Z27, Z29, Z11)
	XDOT(Z19, Z23, Z28, Z30, Z15)
	ADDQ $68, SI
	ADDQ $68, R11
	ADDQ $192, DI
	ADDQ $192, DX
	DECQ CX
	JNZ  vquadpair

	HSUM16(Z0, Y0, X0, Y24, X24, 0(R12))
	HSUM16(Z1, Y1, X1, Y24, X24, 4(R12))
	HSUM16(Z2, Y2, X2, Y24, X24, 8(R12))
	HSUM16(Z3, Y3, X3, Y24, X24, 12(R12))
	HSUM16(Z4, Y4, X4, Y24, X24, 16(R12))
	HSUM16(Z5, Y5, X5, Y24, X24, 20(R12))
	HSUM16(Z6, Y6, X6, Y24, X24, 24(R12))
	HSUM16(Z7, Y7, X7, Y24, X24, 28(R12))
	HSUM16(Z8, Y8, X8, Y24, X24, 32(R12))
	HSUM16(Z9, Y9, X9, Y24, X24, 36(R12))
	HSUM16(Z10, Y10, X10, Y24, X24, 40(R12))
	HSUM16(Z11, Y11, X11, Y24, X24, 44(R12))
	HSUM16(Z12, Y12, X12, Y24, X24, 48(R12))
	HSUM16(Z13, Y13, X13, Y24, X24, 52(R12))
	HSUM16(Z14, Y14, X14, Y24, X24, 56(R12))
	HSUM16(Z15, Y15, X15, Y24, X24, 60(R12))
	ADDQ $64, R12
	LEAQ (BX)(R9*4), BX
	SUBQ $4, R8
	JMP  vquad

// The last rows (fewer than four), one at a time against the four inputs.
vsingle:
	TESTQ R8, R8
	JZ    vdone
	MOVQ  BX, SI
	MOVQ  x+16(FP), DI
	LEAQ  (DI)(R13*2), DX
	ADDQ  R13, DX
	VPXORD Z0, Z0, Z0
	VPXORD Z1, Z1, Z1
	VPXORD Z2, Z2, Z2
	VPXORD Z3, Z3, Z3
	MOVQ  R10, CX

vsinglepair:
	WPAIR((SI), Y16, Z16, Y20, Z20)
	XLOAD((DI))
	XDOT(Z16, Z20, Z27, Z29, Z0)
	XLOAD((DI)(R13*1))
	XDOT(Z16, Z20, Z28, Z30, Z1)
	XLOAD((DI)(R13*2))
	XDOT(Z16, Z20, Z27, Z29, Z2)
	XLOAD((DX))
	XDOT(Z16, Z20, Z28, Z30, Z3)
	ADDQ $68, SI
	ADDQ $192, DI
	ADDQ $192, DX
	DECQ CX
	JNZ  vsinglepair

	HSUM16(Z0, Y0, X0, Y24, X24, 0(R12))
	HSUM16(Z1, Y1, X1, Y24, X24, 4(R12))
	HSUM16(Z2, Y2, X2, Y24, X24, 8(R12))
	HSUM16(Z3, Y3, X3, Y24, X24, 12(R12))
	ADDQ $16, R12
	ADDQ R9, BX
	DECQ R8
	JMP  vsingle

vdone:
	VZEROUPPER
	RET
