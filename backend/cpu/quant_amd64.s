#include "textflag.h"
#include "zmm_amd64.h"

// Kernels for block-quantized weights (quant.go). Each sets out[r] for
// r < rows to the dot product of weight row r (rows consecutive in w) with
// one input row, or, the x4 forms, out[r*4+j] with input rows j < 4 (xstride
// bytes apart). The integer kernels read input rows quantized to blocks of
// [float32 d | int8 quants | int16 sums of 16 (256-blocks)]; VPMADDUBSW
// multiplies unsigned weight quants by signed input quants into int16 pair
// sums (at most 2*128*127, no saturation), VPMADDWD widens them to int32 (by
// the sub-block scales where there are), and each block ends in one float
// multiply-add per input row. The x4 forms unpack each weight block once.
//
// Only VEX-encoded instructions touch vector registers: a legacy SSE MOVD
// between AVX instructions costs about a hundred cycles on this code's
// test machine (AMD Zen 3).

// ARGS1 loads the arguments of a one-row kernel (w, rows, x, nb, out):
// the prefetch distance in R14, rows in R8, out in R12, w in SI; ARGS4
// those of a four-row kernel (w, rows, x, xstride, nb, out), xstride in R13.
#define ARGS1 \
	MOVQ ·prefetchBytes(SB), R14; \
	MOVQ rows+8(FP), R8; \
	MOVQ out+32(FP), R12; \
	MOVQ w+0(FP), SI
#define ARGS4 \
	MOVQ ·prefetchBytes(SB), R14; \
	MOVQ rows+8(FP), R8; \
	MOVQ out+40(FP), R12; \
	MOVQ w+0(FP), SI; \
	MOVQ xstride+24(FP), R13

// V4ROW starts a weight row of the AVX-512 K-quant kernels (after ARGS4):
// the input rows at DI, DI + R13, DI + 2 R13 and R9, the blocks in CX,
// the accumulators Z0-Z3 zeroed.
#define V4ROW \
	MOVQ x+16(FP), DI; \
	MOVQ nb+32(FP), CX; \
	LEAQ (DI)(R13*2), R9; \
	ADDQ R13, R9; \
	ZERO4(Z0, Z1, Z2, Z3)

// HSUMQ reduces the 8 lanes of ymm register Y to lane 0 of its xmm X, using T.
#define HSUMQ(Y, X, T) \
	VEXTRACTF128 $1, Y, T; \
	VADDPS       T, X, X;  \
	VHADDPS      X, X, X;  \
	VHADDPS      X, X, X

// F16S loads the f16 at addr as a float32 into lane 0 of xmm register X.
#define F16S(addr, X) \
	MOVWLZX   addr, AX; \
	VMOVD     AX, X;    \
	VCVTPH2PS X, X

// PFn prefetches n cache lines from R14 (prefetchBytes) ahead of the weights
// at SI: enough lines that a loop advancing SI by one block per iteration
// touches every line once, R14 bytes early. The hardware prefetcher alone
// leaves a core's stream well short of what it can draw (measured on the
// Xeon dev machine: Q4_K from memory, one core, 8.5 -> 16.1 GB/s).
#define PF1 PREFETCHT0 (SI)(R14*1)
#define PF2 PF1; PREFETCHT0 64(SI)(R14*1)
#define PF3 PF2; PREFETCHT0 128(SI)(R14*1)
#define PF4 PF3; PREFETCHT0 192(SI)(R14*1)

// BCAST32 broadcasts the 32-bit constant c to ymm register Y.
#define BCAST32(c, X, Y) \
	MOVL         c, AX; \
	VMOVD        AX, X; \
	VPBROADCASTD X, Y

// func dotQ8_0AVX(w *byte, rows int, x *byte, nb int, out *float32)
// Q8_0 rows of nb blocks of 34 bytes: per block, the signed quants' dot
// product (VPSIGNB moves the weights' signs onto the input, so that
// VPMADDUBSW sees |w| <= 128) times f16 d_w * d_x.
TEXT ·dotQ8_0AVX(SB), NOSPLIT, $0-40
	ARGS1
	BCAST32($0x00010001, X15, Y15) // int16 ones

q8row:
	TESTQ  R8, R8
	JZ     q8done
	MOVQ   x+16(FP), DI
	MOVQ   nb+24(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1

q8pair:
	CMPQ CX, $2
	JLT  q8single
	PF2
	F16S(0(SI), X2)
	VMULSS       0(DI), X2, X2
	VBROADCASTSS X2, Y2
	VMOVDQU      2(SI), Y3
	VMOVDQU      4(DI), Y5
	VPSIGNB      Y3, Y3, Y4
	VPSIGNB      Y3, Y5, Y5
	VPMADDUBSW   Y5, Y4, Y4
	VPMADDWD     Y15, Y4, Y4
	VCVTDQ2PS    Y4, Y4
	VFMADD231PS  Y4, Y2, Y0
	F16S(34(SI), X6)
	VMULSS       36(DI), X6, X6
	VBROADCASTSS X6, Y6
	VMOVDQU      36(SI), Y7
	VMOVDQU      40(DI), Y9
	VPSIGNB      Y7, Y7, Y8
	VPSIGNB      Y7, Y9, Y9
	VPMADDUBSW   Y9, Y8, Y8
	VPMADDWD     Y15, Y8, Y8
	VCVTDQ2PS    Y8, Y8
	VFMADD231PS  Y8, Y6, Y1
	ADDQ $68, SI
	ADDQ $72, DI
	SUBQ $2, CX
	JMP  q8pair

q8single:
	TESTQ CX, CX
	JZ    q8sum
	F16S(0(SI), X2)
	VMULSS       0(DI), X2, X2
	VBROADCASTSS X2, Y2
	VMOVDQU      2(SI), Y3
	VMOVDQU      4(DI), Y5
	VPSIGNB      Y3, Y3, Y4
	VPSIGNB      Y3, Y5, Y5
	VPMADDUBSW   Y5, Y4, Y4
	VPMADDWD     Y15, Y4, Y4
	VCVTDQ2PS    Y4, Y4
	VFMADD231PS  Y4, Y2, Y0
	ADDQ $34, SI

q8sum:
	VADDPS Y1, Y0, Y0
	HSUMQ(Y0, X0, X2)
	VMOVSS X0, (R12)
	ADDQ   $4, R12
	DECQ   R8
	JMP    q8row

q8done:
	VZEROUPPER
	RET

// The x4 kernels' frame: X4ROW starts a weight row against the four input
// rows (DI the first, set with CX beforehand; R13 apart, R9 the fourth;
// accumulators Y0-Y3 zeroed),
// X4SUM stores its four sums.
#define X4ROW \
	LEAQ   (DI)(R13*2), R9; \
	ADDQ   R13, R9; \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	VXORPS Y2, Y2, Y2; \
	VXORPS Y3, Y3, Y3

#define X4SUM \
	HSUMQ(Y0, X0, X8); \
	VMOVSS X0, 0(R12); \
	HSUMQ(Y1, X1, X8); \
	VMOVSS X1, 4(R12); \
	HSUMQ(Y2, X2, X8); \
	VMOVSS X2, 8(R12); \
	HSUMQ(Y3, X3, X8); \
	VMOVSS X3, 12(R12); \
	ADDQ   $16, R12

// SROW adds to acc one input row's block of 32 int8 quants at x (4 bytes
// past its scale at x): Y5 the signed weights, Y6 their magnitudes, Y4 d_w
// broadcast, Y15 int16 ones; Y7 and Y8 scratch.
#define SROW(x, acc) \
	VMOVDQU      4 x, Y7; \
	VPSIGNB      Y5, Y7, Y7; \
	VPMADDUBSW   Y7, Y6, Y7; \
	VPMADDWD     Y15, Y7, Y7; \
	VCVTDQ2PS    Y7, Y7; \
	VBROADCASTSS x, Y8; \
	VMULPS       Y4, Y8, Y8; \
	VFMADD231PS  Y7, Y8, acc

#define SROWS \
	SROW((DI), Y0); \
	SROW((DI)(R13*1), Y1); \
	SROW((DI)(R13*2), Y2); \
	SROW((R9), Y3)

// func dotQ8_0x4AVX(w *byte, rows int, x *byte, xstride int, nb int, out *float32)
// dotQ8_0AVX against four input rows: |w|, d_w loaded once per block.
TEXT ·dotQ8_0x4AVX(SB), NOSPLIT, $0-48
	ARGS4
	BCAST32($0x00010001, X15, Y15) // int16 ones

q8x4row:
	TESTQ R8, R8
	JZ    q8x4done
	MOVQ x+16(FP), DI
	MOVQ nb+32(FP), CX
	X4ROW

q8x4block:
	TESTQ CX, CX
	JZ    q8x4sum
	PF1
	F16S(0(SI), X4)
	VBROADCASTSS X4, Y4     // d_w
	VMOVDQU      2(SI), Y5
	VPSIGNB      Y5, Y5, Y6 // |w|
	SROWS
	ADDQ $34, SI
	ADDQ $36, DI
	ADDQ $36, R9
	DECQ CX
	JMP  q8x4block

q8x4sum:
	X4SUM
	DECQ R8
	JMP  q8x4row

q8x4done:
	VZEROUPPER
	RET

// MXW decodes the MXFP4 block at SI into Y5 (its 32 e2m1 values doubled,
// as int8: low nibbles then high, looked up in Y13) and Y6 (their
// magnitudes), and its e8m0 scale halved into X4: 2^(e-128), as float bits
// (e-1) << 23, or the subnormal (e+1) << 21 for e < 2 (AX, BX, DX scratch;
// Y14 low-nibble masks).
#define MXW \
	VMOVDQU     1(SI), X5; \
	VPSRLW      $4, X5, X6; \
	VINSERTI128 $1, X6, Y5, Y5; \
	VPAND       Y14, Y5, Y5; \
	VPSHUFB     Y5, Y13, Y5; \
	VPSIGNB     Y5, Y5, Y6; \
	MOVBLZX     (SI), AX; \
	LEAL        -1(AX), DX; \
	SHLL        $23, DX; \
	LEAL        1(AX), BX; \
	SHLL        $21, BX; \
	CMPL        AX, $2; \
	CMOVLCS     BX, DX; \
	VMOVD       DX, X4

// MXCONST loads MXW's constants and the int16 ones.
#define MXCONST \
	BCAST32($0x00010001, X15, Y15); \
	BCAST32($0x0f0f0f0f, X14, Y14); \
	VBROADCASTI128 e2m1Int<>(SB), Y13

// func dotMXFP4AVX(w *byte, rows int, x *byte, nb int, out *float32)
// MXFP4 rows of nb blocks of 17 bytes against input rows in blocks of 32:
// per block the integer dot of the doubled e2m1 values with the quants
// (signs moved onto the input as in dotQ8_0AVX) times 2^(e-128) * d_x.
TEXT ·dotMXFP4AVX(SB), NOSPLIT, $0-40
	ARGS1
	MXCONST

mxrow:
	TESTQ  R8, R8
	JZ     mxdone
	MOVQ   x+16(FP), DI
	MOVQ   nb+24(FP), CX
	VXORPS Y0, Y0, Y0

mxblock:
	TESTQ CX, CX
	JZ    mxsum
	PF1
	MXW
	VMULSS       (DI), X4, X4
	VBROADCASTSS X4, Y4
	VMOVDQU      4(DI), Y7
	VPSIGNB      Y5, Y7, Y7
	VPMADDUBSW   Y7, Y6, Y7
	VPMADDWD     Y15, Y7, Y7
	VCVTDQ2PS    Y7, Y7
	VFMADD231PS  Y7, Y4, Y0
	ADDQ $17, SI
	ADDQ $36, DI
	DECQ CX
	JMP  mxblock

mxsum:
	HSUMQ(Y0, X0, X2)
	VMOVSS X0, (R12)
	ADDQ   $4, R12
	DECQ   R8
	JMP    mxrow

mxdone:
	VZEROUPPER
	RET

// func dotMXFP4x4AVX(w *byte, rows int, x *byte, xstride int, nb int, out *float32)
// dotMXFP4AVX against four input rows: each block decoded once.
TEXT ·dotMXFP4x4AVX(SB), NOSPLIT, $0-48
	ARGS4
	MXCONST

mxx4row:
	TESTQ R8, R8
	JZ    mxx4done
	MOVQ x+16(FP), DI
	MOVQ nb+32(FP), CX
	X4ROW

mxx4block:
	TESTQ CX, CX
	JZ    mxx4sum
	PF1
	MXW
	VBROADCASTSS X4, Y4
	SROWS
	ADDQ $17, SI
	ADDQ $36, DI
	ADDQ $36, R9
	DECQ CX
	JMP  mxx4block

mxx4sum:
	X4SUM
	DECQ R8
	JMP  mxx4row

mxx4done:
	VZEROUPPER
	RET

// The K-quant kernels (Q4_K, Q5_K). A block is f16 d and dmin, 12 bytes of
// 6-bit sub-block scales and mins, (Q5_K) 32 bytes of fifth bits, and 128
// bytes of nibbles: 32 bytes hold sub-blocks 2i (low nibbles) and 2i+1
// (high). Per block: d*d_x times the sum over the sub-blocks of scale *
// (quants . x), minus dmin*d_x times the sum of min * (the sub-block's
// input sum, from the 16-sums).

// KSCALES unpacks the scales and mins of the block at SI (bytes 4..15)
// into the low bytes of sc and m (v, t, u scratch): sc[0:4] = u0 & 0x3f,
// m[0:4] = u1 & 0x3f, sc[4:8] = u2 & 0xf | u0 >> 6 << 4, m[4:8] = u2 >> 4 |
// u1 >> 6 << 4 (per byte of the words u0, u1, u2).
#define KSCALES(sc, m, v, t, u) \
	MOVL 4(SI), sc; \
	MOVL 8(SI), m; \
	MOVL 12(SI), v; \
	MOVL sc, t; \
	SHRL $2, t; \
	ANDL $0x30303030, t; \
	MOVL v, u; \
	ANDL $0x0f0f0f0f, u; \
	ORL  t, u; \
	ANDL $0x3f3f3f3f, sc; \
	SHLQ $32, u; \
	ORQ  u, sc; \
	MOVL m, t; \
	SHRL $2, t; \
	ANDL $0x30303030, t; \
	SHRL $4, v; \
	ANDL $0x0f0f0f0f, v; \
	ORL  t, v; \
	ANDL $0x3f3f3f3f, m; \
	SHLQ $32, v; \
	ORQ  v, m

// NIB splits the 32 bytes at qo(SI) into their low nibbles lo and high
// nibbles hi (Y15 holds the 0x0f masks).
#define NIB(qo, lo, hi) \
	VMOVDQU qo(SI), lo; \
	VPSRLW  $4, lo, hi; \
	VPAND   Y15, lo, lo; \
	VPAND   Y15, hi, hi

// FIFTH ORs Q5_K's fifth bits into the nibbles lo and hi: bit b of each qh
// byte is moved to bit 4 by the word shift opl (oph) $nl ($nh) and picked
// by mask (0x10 bytes; t scratch). A word shift of at most 4 keeps bit 4
// of each byte within the byte.
#define FIFTH(qh, opl, nl, oph, nh, lo, hi, t, mask) \
	opl   $nl, qh, t; \
	VPAND mask, t, t; \
	VPOR  t, lo, lo; \
	oph   $nh, qh, t; \
	VPAND mask, t, t; \
	VPOR  t, hi, hi

// Q4DOTS unpacks a Q4_K block's four 32-byte groups of nibbles into lo and
// hi and dots each pair of sub-blocks with DOT (KDOT1 or KDOT4).
#define Q4DOTS(DOT, lo, hi) \
	NIB(16, lo, hi); \
	DOT(4, 36, 0, 32); \
	NIB(48, lo, hi); \
	DOT(68, 100, 64, 96); \
	NIB(80, lo, hi); \
	DOT(132, 164, 128, 160); \
	NIB(112, lo, hi); \
	DOT(196, 228, 192, 224)

// Q5DOTS is Q4DOTS for a Q5_K block: LOADQH (re)loads its fifth bits into
// qh before each group, FIFTH ORs them in (t scratch, mask the 0x10 bytes).
#define Q5DOTS(DOT, lo, hi, LOADQH, qh, t, mask) \
	NIB(48, lo, hi); \
	LOADQH; \
	FIFTH(qh, VPSLLW, 4, VPSLLW, 3, lo, hi, t, mask); \
	DOT(4, 36, 0, 32); \
	NIB(80, lo, hi); \
	LOADQH; \
	FIFTH(qh, VPSLLW, 2, VPSLLW, 1, lo, hi, t, mask); \
	DOT(68, 100, 64, 96); \
	NIB(112, lo, hi); \
	LOADQH; \
	FIFTH(qh, VPSRLW, 0, VPSRLW, 1, lo, hi, t, mask); \
	DOT(132, 164, 128, 160); \
	NIB(144, lo, hi); \
	LOADQH; \
	FIFTH(qh, VPSRLW, 2, VPSRLW, 3, lo, hi, t, mask); \
	DOT(196, 228, 192, 224)

// NOQH and QH13 are Q5DOTS's LOADQH: qh kept in a register by the one-row
// kernel, reloaded into Y13 (KDOT4's scratch) by the four-row one.
#define NOQH
#define QH13 VMOVDQU 16(SI), Y13

// KHEAD1 starts a block of the one-row kernels: scales as int16 in both
// halves of Y2, the mins' products with the input sums added to X1
// (dmin*d_x times), d*d_x broadcast in Y4, the int32 sums Y6 zeroed.
#define KHEAD1 \
	KSCALES(AX, R9, R10, R11, R13); \
	VMOVQ        AX, X2; \
	VMOVQ        R9, X3; \
	VPMOVZXBW    X2, X2; \
	VINSERTI128  $1, X2, Y2, Y2; \
	VPMOVZXBW    X3, X3; \
	VMOVDQU      260(DI), X4; \
	VPHADDW      276(DI), X4, X4; \
	VPMADDWD     X4, X3, X3; \
	VCVTDQ2PS    X3, X3; \
	MOVL         (SI), AX; \
	VMOVD        AX, X4; \
	VCVTPH2PS    X4, X4; \
	VBROADCASTSS (DI), X5; \
	VMULPS       X5, X4, X4; \
	VMOVSHDUP    X4, X5; \
	VBROADCASTSS X5, X5; \
	VFMADD231PS  X3, X5, X1; \
	VBROADCASTSS X4, Y4; \
	VPXOR        Y6, Y6, Y6

// KDOT1 adds to Y6 the sub-blocks in Y7 and Y8 dotted with the input
// quants at xo0(DI) and xo1(DI), times their scales (q4kScale offsets so0
// and so1 pick them from Y2).
#define KDOT1(xo0, xo1, so0, so1) \
	VPMADDUBSW xo0(DI), Y7, Y7; \
	VPMADDUBSW xo1(DI), Y8, Y8; \
	VPSHUFB    q4kScale<>+so0(SB), Y2, Y9; \
	VPSHUFB    q4kScale<>+so1(SB), Y2, Y10; \
	VPMADDWD   Y9, Y7, Y7; \
	VPMADDWD   Y10, Y8, Y8; \
	VPADDD     Y7, Y6, Y6; \
	VPADDD     Y8, Y6, Y6

// KTAIL1 ends a block of bs bytes of the one-row kernels.
#define KTAIL1(bs) \
	VCVTDQ2PS   Y6, Y6; \
	VFMADD231PS Y6, Y4, Y0; \
	ADDQ        $bs, SI; \
	ADDQ        $292, DI; \
	DECQ        CX

// KSUM1 stores a row's sum of the one-row kernels.
#define KSUM1 \
	HSUMQ(Y0, X0, X2); \
	VHADDPS X1, X1, X1; \
	VHADDPS X1, X1, X1; \
	VSUBSS  X1, X0, X0; \
	VMOVSS  X0, (R12); \
	ADDQ    $4, R12; \
	DECQ    R8

// KROW1 starts a row of the one-row kernels (after DI and CX are set).
#define KROW1 \
	VXORPS Y0, Y0, Y0; \
	VXORPS X1, X1, X1

// func dotQ4KAVX(w *byte, rows int, x *byte, nb int, out *float32)
// Q4_K rows of nb blocks of 144 bytes.
TEXT ·dotQ4KAVX(SB), NOSPLIT, $0-40
	ARGS1
	BCAST32($0x0f0f0f0f, X15, Y15) // low nibbles

q4row:
	TESTQ R8, R8
	JZ    q4done
	MOVQ x+16(FP), DI
	MOVQ nb+24(FP), CX
	KROW1

q4block:
	TESTQ CX, CX
	JZ    q4sum
	PF3
	KHEAD1
	Q4DOTS(KDOT1, Y7, Y8)
	KTAIL1(144)
	JMP q4block

q4sum:
	KSUM1
	JMP q4row

q4done:
	VZEROUPPER
	RET

// func dotQ5KAVX(w *byte, rows int, x *byte, nb int, out *float32)
// Q5_K rows of nb blocks of 176 bytes: dotQ4KAVX with the fifth bits (qh
// in Y11) ORed into the nibbles.
TEXT ·dotQ5KAVX(SB), NOSPLIT, $0-40
	ARGS1
	BCAST32($0x0f0f0f0f, X15, Y15) // low nibbles
	BCAST32($0x10101010, X14, Y14) // fifth bits

q5row:
	TESTQ R8, R8
	JZ    q5done
	MOVQ x+16(FP), DI
	MOVQ nb+24(FP), CX
	KROW1

q5block:
	TESTQ CX, CX
	JZ    q5sum
	PF3
	KHEAD1
	VMOVDQU 16(SI), Y11
	Q5DOTS(KDOT1, Y7, Y8, NOQH, Y11, Y12, Y14)
	KTAIL1(176)
	JMP q5block

q5sum:
	KSUM1
	JMP q5row

q5done:
	VZEROUPPER
	RET

// The four-row K-quant kernels: accumulators Y0-Y3, int32 sums Y4-Y7;
// scales, mins and nibbles unpacked once per block, the mins' products
// going straight into the float accumulators.

// KMIN4 subtracts from acc one input row's mins products (x its block):
// dmin (Y13) * d_x times the mins (X9) against the input's 16-sums.
#define KMIN4(x, acc) \
	VMOVDQU      260 x, X10; \
	VPHADDW      276 x, X10, X10; \
	VPMADDWD     X10, X9, X10; \
	VCVTDQ2PS    X10, X10; \
	VBROADCASTSS x, Y11; \
	VMULPS       Y13, Y11, Y12; \
	VFNMADD231PS Y10, Y12, acc

// KHEAD4 starts a block of the four-row kernels: scales in Y8, mins in
// X9, d in Y14, the mins' products subtracted, the int32 sums zeroed.
#define KHEAD4 \
	KSCALES(AX, BX, DX, R10, R11); \
	VMOVQ        AX, X8; \
	VMOVQ        BX, X9; \
	VPMOVZXBW    X8, X8; \
	VINSERTI128  $1, X8, Y8, Y8; \
	VPMOVZXBW    X9, X9; \
	MOVL         (SI), AX; \
	VMOVD        AX, X14; \
	VCVTPH2PS    X14, X14; \
	VMOVSHDUP    X14, X13; \
	VBROADCASTSS X13, Y13; \
	VBROADCASTSS X14, Y14; \
	KMIN4((DI), Y0); \
	KMIN4((DI)(R13*1), Y1); \
	KMIN4((DI)(R13*2), Y2); \
	KMIN4((R9), Y3); \
	VPXOR        Y4, Y4, Y4; \
	VPXOR        Y5, Y5, Y5; \
	VPXOR        Y6, Y6, Y6; \
	VPXOR        Y7, Y7, Y7

// KROW4 adds to the int32 sums isum one input row's products with the
// sub-blocks in Y9 and Y10 (quants at xo0 and xo1 past x), scaled by Y11
// and Y12 (Y13 scratch).
#define KROW4(xo0, xo1, x, isum) \
	VPMADDUBSW xo0 x, Y9, Y13; \
	VPMADDWD   Y11, Y13, Y13; \
	VPADDD     Y13, isum, isum; \
	VPMADDUBSW xo1 x, Y10, Y13; \
	VPMADDWD   Y12, Y13, Y13; \
	VPADDD     Y13, isum, isum

// KDOT4 dots the sub-blocks in Y9 and Y10 with the four input rows.
#define KDOT4(xo0, xo1, so0, so1) \
	VPSHUFB q4kScale<>+so0(SB), Y8, Y11; \
	VPSHUFB q4kScale<>+so1(SB), Y8, Y12; \
	KROW4(xo0, xo1, (DI), Y4); \
	KROW4(xo0, xo1, (DI)(R13*1), Y5); \
	KROW4(xo0, xo1, (DI)(R13*2), Y6); \
	KROW4(xo0, xo1, (R9), Y7)

// KFIN4 adds one input row's int32 sums times d*d_x to its accumulator.
#define KFIN4(x, isum, acc) \
	VCVTDQ2PS    isum, isum; \
	VBROADCASTSS x, Y11; \
	VMULPS       Y14, Y11, Y11; \
	VFMADD231PS  isum, Y11, acc

// KTAIL4 ends a block of bs bytes of the four-row kernels.
#define KTAIL4(bs) \
	KFIN4((DI), Y4, Y0); \
	KFIN4((DI)(R13*1), Y5, Y1); \
	KFIN4((DI)(R13*2), Y6, Y2); \
	KFIN4((R9), Y7, Y3); \
	KNEXT4(bs)

// KNEXT4 moves the four-row K-quant kernels to the next block (bs bytes
// of weights, 292 of each input row).
#define KNEXT4(bs) \
	ADDQ $bs, SI; \
	ADDQ $292, DI; \
	ADDQ $292, R9; \
	DECQ CX

// func dotQ4Kx4AVX(w *byte, rows int, x *byte, xstride int, nb int, out *float32)
TEXT ·dotQ4Kx4AVX(SB), NOSPLIT, $0-48
	ARGS4
	BCAST32($0x0f0f0f0f, X15, Y15) // low nibbles

q4x4row:
	TESTQ R8, R8
	JZ    q4x4done
	MOVQ x+16(FP), DI
	MOVQ nb+32(FP), CX
	X4ROW

q4x4block:
	TESTQ CX, CX
	JZ    q4x4sum
	PF3
	KHEAD4
	Q4DOTS(KDOT4, Y9, Y10)
	KTAIL4(144)
	JMP q4x4block

q4x4sum:
	X4SUM
	DECQ R8
	JMP  q4x4row

q4x4done:
	VZEROUPPER
	RET

// func dotQ5Kx4AVX(w *byte, rows int, x *byte, xstride int, nb int, out *float32)
// dotQ4Kx4AVX with Q5_K's fifth bits (qh reloaded into Y13, the 0x10 masks
// from memory: no register is left).
TEXT ·dotQ5Kx4AVX(SB), NOSPLIT, $0-48
	ARGS4
	BCAST32($0x0f0f0f0f, X15, Y15) // low nibbles

q5x4row:
	TESTQ R8, R8
	JZ    q5x4done
	MOVQ x+16(FP), DI
	MOVQ nb+32(FP), CX
	X4ROW

q5x4block:
	TESTQ CX, CX
	JZ    q5x4sum
	PF3
	KHEAD4
	Q5DOTS(KDOT4, Y9, Y10, QH13, Y13, Y11, fifthBit<>(SB))
	KTAIL4(176)
	JMP q5x4block

q5x4sum:
	X4SUM
	DECQ R8
	JMP  q5x4row

q5x4done:
	VZEROUPPER
	RET

// func dotQ6KAVX(w *byte, rows int, x *byte, nb int, out *float32)
// Q6_K rows of nb blocks of 210 bytes: per block d*d_x times the sum over
// the sixteen groups of 16 of scale * (q . x - 32 * sum x), q the unsigned
// 6-bit quants (low 4 bits from ql, high 2 from qh).
TEXT ·dotQ6KAVX(SB), NOSPLIT, $0-40
	ARGS1
	BCAST32($0x0f0f0f0f, X15, Y15) // low nibbles
	BCAST32($0x30303030, X14, Y14) // bits 4 and 5

q6row:
	TESTQ  R8, R8
	JZ     q6done
	MOVQ   x+16(FP), DI
	MOVQ   nb+24(FP), CX
	VXORPS Y0, Y0, Y0

q6block:
	TESTQ CX, CX
	JZ    q6sum
	PF4
	VPMOVSXBW 192(SI), Y2 // the 16 scales as int16
	VPMADDWD  260(DI), Y2, Y3
	VPSLLD    $5, Y3, Y3  // 32 * sum of scale * 16-sum
	VMOVDQU   192(SI), X11
	VPXOR     Y6, Y6, Y6
	VMOVDQU    0(SI), Y10
	VPAND      Y15, Y10, Y10
	VMOVDQU    128(SI), Y12
	VPSLLW     $4, Y12, Y12
	VPAND      Y14, Y12, Y12
	VPOR       Y12, Y10, Y10
	VPMADDUBSW 4(DI), Y10, Y10
	VPSHUFB    q6kScale<>+0(SB), X11, X12
	VPMOVSXBW  X12, Y12
	VPMADDWD   Y12, Y10, Y10
	VPADDD     Y10, Y6, Y6
	VMOVDQU    32(SI), Y10
	VPAND      Y15, Y10, Y10
	VMOVDQU    128(SI), Y12
	VPSLLW     $2, Y12, Y12
	VPAND      Y14, Y12, Y12
	VPOR       Y12, Y10, Y10
	VPMADDUBSW 36(DI), Y10, Y10
	VPSHUFB    q6kScale<>+16(SB), X11, X12
	VPMOVSXBW  X12, Y12
	VPMADDWD   Y12, Y10, Y10
	VPADDD     Y10, Y6, Y6
	VMOVDQU    0(SI), Y10
	VPSRLW     $4, Y10, Y10
	VPAND      Y15, Y10, Y10
	VMOVDQU    128(SI), Y12
	VPAND      Y14, Y12, Y12
	VPOR       Y12, Y10, Y10
	VPMADDUBSW 68(DI), Y10, Y10
	VPSHUFB    q6kScale<>+32(SB), X11, X12
	VPMOVSXBW  X12, Y12
	VPMADDWD   Y12, Y10, Y10
	VPADDD     Y10, Y6, Y6
	VMOVDQU    32(SI), Y10
	VPSRLW     $4, Y10, Y10
	VPAND      Y15, Y10, Y10
	VMOVDQU    128(SI), Y12
	VPSRLW     $2, Y12, Y12
	VPAND      Y14, Y12, Y12
	VPOR       Y12, Y10, Y10
	VPMADDUBSW 100(DI), Y10, Y10
	VPSHUFB    q6kScale<>+48(SB), X11, X12
	VPMOVSXBW  X12, Y12
	VPMADDWD   Y12, Y10, Y10
	VPADDD     Y10, Y6, Y6
	VMOVDQU    64(SI), Y10
	VPAND      Y15, Y10, Y10
	VMOVDQU    160(SI), Y12
	VPSLLW     $4, Y12, Y12
	VPAND      Y14, Y12, Y12
	VPOR       Y12, Y10, Y10
	VPMADDUBSW 132(DI), Y10, Y10
	VPSHUFB    q6kScale<>+64(SB), X11, X12
	VPMOVSXBW  X12, Y12
	VPMADDWD   Y12, Y10, Y10
	VPADDD     Y10, Y6, Y6
	VMOVDQU    96(SI), Y10
	VPAND      Y15, Y10, Y10
	VMOVDQU    160(SI), Y12
	VPSLLW     $2, Y12, Y12
	VPAND      Y14, Y12, Y12
	VPOR       Y12, Y10, Y10
	VPMADDUBSW 164(DI), Y10, Y10
	VPSHUFB    q6kScale<>+80(SB), X11, X12
	VPMOVSXBW  X12, Y12
	VPMADDWD   Y12, Y10, Y10
	VPADDD     Y10, Y6, Y6
	VMOVDQU    64(SI), Y10
	VPSRLW     $4, Y10, Y10
	VPAND      Y15, Y10, Y10
	VMOVDQU    160(SI), Y12
	VPAND      Y14, Y12, Y12
	VPOR       Y12, Y10, Y10
	VPMADDUBSW 196(DI), Y10, Y10
	VPSHUFB    q6kScale<>+96(SB), X11, X12
	VPMOVSXBW  X12, Y12
	VPMADDWD   Y12, Y10, Y10
	VPADDD     Y10, Y6, Y6
	VMOVDQU    96(SI), Y10
	VPSRLW     $4, Y10, Y10
	VPAND      Y15, Y10, Y10
	VMOVDQU    160(SI), Y12
	VPSRLW     $2, Y12, Y12
	VPAND      Y14, Y12, Y12
	VPOR       Y12, Y10, Y10
	VPMADDUBSW 228(DI), Y10, Y10
	VPSHUFB    q6kScale<>+112(SB), X11, X12
	VPMOVSXBW  X12, Y12
	VPMADDWD   Y12, Y10, Y10
	VPADDD     Y10, Y6, Y6
	VPSUBD       Y3, Y6, Y6
	VCVTDQ2PS    Y6, Y6
	F16S(208(SI), X4)
	VMULSS       (DI), X4, X4
	VBROADCASTSS X4, Y4
	VFMADD231PS  Y6, Y4, Y0
	ADDQ         $210, SI
	ADDQ         $292, DI
	DECQ         CX
	JMP          q6block

q6sum:
	HSUMQ(Y0, X0, X2)
	VMOVSS X0, (R12)
	ADDQ   $4, R12
	DECQ   R8
	JMP    q6row

q6done:
	VZEROUPPER
	RET

// func dotQ6Kx4AVX(w *byte, rows int, x *byte, xstride int, nb int, out *float32)
// dotQ6KAVX against four input rows (accumulators Y0-Y3, int32 sums
// Y4-Y7, starting at -32 * sum of scale * 16-sum): each group's quants and
// scales unpacked once.
TEXT ·dotQ6Kx4AVX(SB), NOSPLIT, $0-48
	ARGS4
	BCAST32($0x0f0f0f0f, X15, Y15) // low nibbles
	BCAST32($0x30303030, X14, Y14) // bits 4 and 5

q6x4row:
	TESTQ  R8, R8
	JZ     q6x4done
	MOVQ   x+16(FP), DI
	LEAQ   (DI)(R13*2), R9
	ADDQ   R13, R9
	MOVQ   nb+32(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3

q6x4block:
	TESTQ CX, CX
	JZ    q6x4sum
	PF4
	VPMOVSXBW 192(SI), Y10 // the 16 scales as int16
	VMOVDQU   192(SI), X11
	VPMADDWD  260(DI), Y10, Y12
	VPSLLD    $5, Y12, Y12
	VPXOR     Y4, Y4, Y4
	VPSUBD    Y12, Y4, Y4
	VPMADDWD  260(DI)(R13*1), Y10, Y12
	VPSLLD    $5, Y12, Y12
	VPXOR     Y5, Y5, Y5
	VPSUBD    Y12, Y5, Y5
	VPMADDWD  260(DI)(R13*2), Y10, Y12
	VPSLLD    $5, Y12, Y12
	VPXOR     Y6, Y6, Y6
	VPSUBD    Y12, Y6, Y6
	VPMADDWD  260(R9), Y10, Y12
	VPSLLD    $5, Y12, Y12
	VPXOR     Y7, Y7, Y7
	VPSUBD    Y12, Y7, Y7
	VMOVDQU    0(SI), Y8
	VPAND      Y15, Y8, Y8
	VMOVDQU    128(SI), Y9
	VPSLLW     $4, Y9, Y9
	VPAND      Y14, Y9, Y9
	VPOR       Y9, Y8, Y8
	VPSHUFB    q6kScale<>+0(SB), X11, X10
	VPMOVSXBW  X10, Y10
	VPMADDUBSW 4(DI), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y4, Y4
	VPMADDUBSW 4(DI)(R13*1), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y5, Y5
	VPMADDUBSW 4(DI)(R13*2), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y6, Y6
	VPMADDUBSW 4(R9), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y7, Y7
	VMOVDQU    32(SI), Y8
	VPAND      Y15, Y8, Y8
	VMOVDQU    128(SI), Y9
	VPSLLW     $2, Y9, Y9
	VPAND      Y14, Y9, Y9
	VPOR       Y9, Y8, Y8
	VPSHUFB    q6kScale<>+16(SB), X11, X10
	VPMOVSXBW  X10, Y10
	VPMADDUBSW 36(DI), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y4, Y4
	VPMADDUBSW 36(DI)(R13*1), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y5, Y5
	VPMADDUBSW 36(DI)(R13*2), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y6, Y6
	VPMADDUBSW 36(R9), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y7, Y7
	VMOVDQU    0(SI), Y8
	VPSRLW     $4, Y8, Y8
	VPAND      Y15, Y8, Y8
	VMOVDQU    128(SI), Y9
	VPAND      Y14, Y9, Y9
	VPOR       Y9, Y8, Y8
	VPSHUFB    q6kScale<>+32(SB), X11, X10
	VPMOVSXBW  X10, Y10
	VPMADDUBSW 68(DI), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y4, Y4
	VPMADDUBSW 68(DI)(R13*1), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y5, Y5
	VPMADDUBSW 68(DI)(R13*2), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y6, Y6
	VPMADDUBSW 68(R9), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y7, Y7
	VMOVDQU    32(SI), Y8
	VPSRLW     $4, Y8, Y8
	VPAND      Y15, Y8, Y8
	VMOVDQU    128(SI), Y9
	VPSRLW     $2, Y9, Y9
	VPAND      Y14, Y9, Y9
	VPOR       Y9, Y8, Y8
	VPSHUFB    q6kScale<>+48(SB), X11, X10
	VPMOVSXBW  X10, Y10
	VPMADDUBSW 100(DI), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y4, Y4
	VPMADDUBSW 100(DI)(R13*1), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y5, Y5
	VPMADDUBSW 100(DI)(R13*2), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y6, Y6
	VPMADDUBSW 100(R9), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y7, Y7
	VMOVDQU    64(SI), Y8
	VPAND      Y15, Y8, Y8
	VMOVDQU    160(SI), Y9
	VPSLLW     $4, Y9, Y9
	VPAND      Y14, Y9, Y9
	VPOR       Y9, Y8, Y8
	VPSHUFB    q6kScale<>+64(SB), X11, X10
	VPMOVSXBW  X10, Y10
	VPMADDUBSW 132(DI), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y4, Y4
	VPMADDUBSW 132(DI)(R13*1), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y5, Y5
	VPMADDUBSW 132(DI)(R13*2), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y6, Y6
	VPMADDUBSW 132(R9), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y7, Y7
	VMOVDQU    96(SI), Y8
	VPAND      Y15, Y8, Y8
	VMOVDQU    160(SI), Y9
	VPSLLW     $2, Y9, Y9
	VPAND      Y14, Y9, Y9
	VPOR       Y9, Y8, Y8
	VPSHUFB    q6kScale<>+80(SB), X11, X10
	VPMOVSXBW  X10, Y10
	VPMADDUBSW 164(DI), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y4, Y4
	VPMADDUBSW 164(DI)(R13*1), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y5, Y5
	VPMADDUBSW 164(DI)(R13*2), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y6, Y6
	VPMADDUBSW 164(R9), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y7, Y7
	VMOVDQU    64(SI), Y8
	VPSRLW     $4, Y8, Y8
	VPAND      Y15, Y8, Y8
	VMOVDQU    160(SI), Y9
	VPAND      Y14, Y9, Y9
	VPOR       Y9, Y8, Y8
	VPSHUFB    q6kScale<>+96(SB), X11, X10
	VPMOVSXBW  X10, Y10
	VPMADDUBSW 196(DI), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y4, Y4
	VPMADDUBSW 196(DI)(R13*1), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y5, Y5
	VPMADDUBSW 196(DI)(R13*2), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y6, Y6
	VPMADDUBSW 196(R9), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y7, Y7
	VMOVDQU    96(SI), Y8
	VPSRLW     $4, Y8, Y8
	VPAND      Y15, Y8, Y8
	VMOVDQU    160(SI), Y9
	VPSRLW     $2, Y9, Y9
	VPAND      Y14, Y9, Y9
	VPOR       Y9, Y8, Y8
	VPSHUFB    q6kScale<>+112(SB), X11, X10
	VPMOVSXBW  X10, Y10
	VPMADDUBSW 228(DI), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y4, Y4
	VPMADDUBSW 228(DI)(R13*1), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y5, Y5
	VPMADDUBSW 228(DI)(R13*2), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y6, Y6
	VPMADDUBSW 228(R9), Y8, Y12
	VPMADDWD   Y10, Y12, Y12
	VPADDD     Y12, Y7, Y7
	F16S(208(SI), X13)
	VBROADCASTSS X13, Y13 // d
	VCVTDQ2PS    Y4, Y4
	VBROADCASTSS 0(DI), Y12
	VMULPS       Y13, Y12, Y12
	VFMADD231PS  Y4, Y12, Y0
	VCVTDQ2PS    Y5, Y5
	VBROADCASTSS 0(DI)(R13*1), Y12
	VMULPS       Y13, Y12, Y12
	VFMADD231PS  Y5, Y12, Y1
	VCVTDQ2PS    Y6, Y6
	VBROADCASTSS 0(DI)(R13*2), Y12
	VMULPS       Y13, Y12, Y12
	VFMADD231PS  Y6, Y12, Y2
	VCVTDQ2PS    Y7, Y7
	VBROADCASTSS 0(R9), Y12
	VMULPS       Y13, Y12, Y12
	VFMADD231PS  Y7, Y12, Y3
	ADDQ $210, SI
	ADDQ $292, DI
	ADDQ $292, R9
	DECQ CX
	JMP  q6x4block

q6x4sum:
	HSUMQ(Y0, X0, X8)
	VMOVSS X0, 0(R12)
	HSUMQ(Y1, X1, X8)
	VMOVSS X1, 4(R12)
	HSUMQ(Y2, X2, X8)
	VMOVSS X2, 8(R12)
	HSUMQ(Y3, X3, X8)
	VMOVSS X3, 12(R12)
	ADDQ $16, R12
	DECQ R8
	JMP  q6x4row

q6x4done:
	VZEROUPPER
	RET

// func dotFP8AVX(w *byte, rb int, rows int, x *float32, nb int, out *float32)
// FP8 rows of rb bytes, their first nb blocks of 132 bytes: per block the
// float32 scale times the f32 dot of its 128 e4m3 values with x. An e4m3
// byte becomes the f16 of its value / 256 by moving its exponent and
// mantissa into place ((sign-extended byte << 7) & 0xbf80; subnormals land
// on f16 subnormals, 0x7f/0xff read as ±480 rather than NaN); VCVTPH2PS
// widens it and each row's sum is scaled by 256 at the end.
TEXT ·dotFP8AVX(SB), NOSPLIT, $0-48
	MOVQ ·prefetchBytes(SB), R14
	MOVQ    w+0(FP), R9
	MOVQ    rows+16(FP), R8
	MOVQ    out+40(FP), R12
	BCAST32($0xbf80bf80, X15, Y15)
	MOVL    $0x43800000, AX // 256
	VMOVD   AX, X14

f8row:
	TESTQ  R8, R8
	JZ     f8done
	MOVQ   R9, SI
	MOVQ   x+24(FP), DI
	MOVQ   nb+32(FP), CX
	VXORPS Y0, Y0, Y0

f8block:
	TESTQ  CX, CX
	JZ     f8sum
	PF3
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VPMOVSXBW    4(SI), Y5
	VPSLLW       $7, Y5, Y5
	VPAND        Y15, Y5, Y5
	VEXTRACTI128 $1, Y5, X6
	VCVTPH2PS    X5, Y5
	VCVTPH2PS    X6, Y6
	VFMADD231PS  0(DI), Y5, Y1
	VFMADD231PS  32(DI), Y6, Y2
	VPMOVSXBW    20(SI), Y5
	VPSLLW       $7, Y5, Y5
	VPAND        Y15, Y5, Y5
	VEXTRACTI128 $1, Y5, X6
	VCVTPH2PS    X5, Y5
	VCVTPH2PS    X6, Y6
	VFMADD231PS  64(DI), Y5, Y3
	VFMADD231PS  96(DI), Y6, Y4
	VPMOVSXBW    36(SI), Y5
	VPSLLW       $7, Y5, Y5
	VPAND        Y15, Y5, Y5
	VEXTRACTI128 $1, Y5, X6
	VCVTPH2PS    X5, Y5
	VCVTPH2PS    X6, Y6
	VFMADD231PS  128(DI), Y5, Y1
	VFMADD231PS  160(DI), Y6, Y2
	VPMOVSXBW    52(SI), Y5
	VPSLLW       $7, Y5, Y5
	VPAND        Y15, Y5, Y5
	VEXTRACTI128 $1, Y5, X6
	VCVTPH2PS    X5, Y5
	VCVTPH2PS    X6, Y6
	VFMADD231PS  192(DI), Y5, Y3
	VFMADD231PS  224(DI), Y6, Y4
	VPMOVSXBW    68(SI), Y5
	VPSLLW       $7, Y5, Y5
	VPAND        Y15, Y5, Y5
	VEXTRACTI128 $1, Y5, X6
	VCVTPH2PS    X5, Y5
	VCVTPH2PS    X6, Y6
	VFMADD231PS  256(DI), Y5, Y1
	VFMADD231PS  288(DI), Y6, Y2
	VPMOVSXBW    84(SI), Y5
	VPSLLW       $7, Y5, Y5
	VPAND        Y15, Y5, Y5
	VEXTRACTI128 $1, Y5, X6
	VCVTPH2PS    X5, Y5
	VCVTPH2PS    X6, Y6
	VFMADD231PS  320(DI), Y5, Y3
	VFMADD231PS  352(DI), Y6, Y4
	VPMOVSXBW    100(SI), Y5
	VPSLLW       $7, Y5, Y5
	VPAND        Y15, Y5, Y5
	VEXTRACTI128 $1, Y5, X6
	VCVTPH2PS    X5, Y5
	VCVTPH2PS    X6, Y6
	VFMADD231PS  384(DI), Y5, Y1
	VFMADD231PS  416(DI), Y6, Y2
	VPMOVSXBW    116(SI), Y5
	VPSLLW       $7, Y5, Y5
	VPAND        Y15, Y5, Y5
	VEXTRACTI128 $1, Y5, X6
	VCVTPH2PS    X5, Y5
	VCVTPH2PS    X6, Y6
	VFMADD231PS  448(DI), Y5, Y3
	VFMADD231PS  480(DI), Y6, Y4
	VADDPS       Y2, Y1, Y1
	VADDPS       Y4, Y3, Y3
	VADDPS       Y3, Y1, Y1
	VBROADCASTSS (SI), Y7
	VFMADD231PS  Y1, Y7, Y0
	ADDQ         $132, SI
	ADDQ         $512, DI
	DECQ         CX
	JMP          f8block

f8sum:
	HSUMQ(Y0, X0, X2)
	VMULSS X14, X0, X0
	VMOVSS X0, (R12)
	ADDQ   $4, R12
	ADDQ   rb+8(FP), R9
	DECQ   R8
	JMP    f8row

f8done:
	VZEROUPPER
	RET

// func dotFP8x4AVX(w *byte, rb int, rows int, x *float32, xstride int, nb int, out *float32)
// dotFP8AVX against four input rows: each block's values are widened once
// and multiplied by its scale * 256, then dotted into two accumulators per
// input row (Y0-Y7).
TEXT ·dotFP8x4AVX(SB), NOSPLIT, $0-56
	MOVQ ·prefetchBytes(SB), R14
	MOVQ    w+0(FP), R10
	MOVQ    rows+16(FP), R8
	MOVQ    out+48(FP), R12
	MOVQ    xstride+32(FP), R13
	BCAST32($0xbf80bf80, X15, Y15)
	BCAST32($0x43800000, X13, Y13) // 256

f8x4row:
	TESTQ  R8, R8
	JZ     f8x4done
	MOVQ   R10, SI
	MOVQ   x+24(FP), DI
	LEAQ   (DI)(R13*2), R9
	ADDQ   R13, R9
	MOVQ   nb+40(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

f8x4block:
	TESTQ        CX, CX
	JZ           f8x4sum
	PF3
	VBROADCASTSS (SI), Y14
	VMULPS       Y13, Y14, Y14
	VPMOVSXBW    4(SI), Y8
	VPSLLW       $7, Y8, Y8
	VPAND        Y15, Y8, Y8
	VEXTRACTI128 $1, Y8, X10
	VCVTPH2PS    X8, Y9
	VCVTPH2PS    X10, Y10
	VMULPS       Y14, Y9, Y9
	VMULPS       Y14, Y10, Y10
	VFMADD231PS  0(DI), Y9, Y0
	VFMADD231PS  32(DI), Y10, Y1
	VFMADD231PS  0(DI)(R13*1), Y9, Y2
	VFMADD231PS  32(DI)(R13*1), Y10, Y3
	VFMADD231PS  0(DI)(R13*2), Y9, Y4
	VFMADD231PS  32(DI)(R13*2), Y10, Y5
	VFMADD231PS  0(R9), Y9, Y6
	VFMADD231PS  32(R9), Y10, Y7
	VPMOVSXBW    20(SI), Y8
	VPSLLW       $7, Y8, Y8
	VPAND        Y15, Y8, Y8
	VEXTRACTI128 $1, Y8, X10
	VCVTPH2PS    X8, Y9
	VCVTPH2PS    X10, Y10
	VMULPS       Y14, Y9, Y9
	VMULPS       Y14, Y10, Y10
	VFMADD231PS  64(DI), Y9, Y0
	VFMADD231PS  96(DI), Y10, Y1
	VFMADD231PS  64(DI)(R13*1), Y9, Y2
	VFMADD231PS  96(DI)(R13*1), Y10, Y3
	VFMADD231PS  64(DI)(R13*2), Y9, Y4
	VFMADD231PS  96(DI)(R13*2), Y10, Y5
	VFMADD231PS  64(R9), Y9, Y6
	VFMADD231PS  96(R9), Y10, Y7
	VPMOVSXBW    36(SI), Y8
	VPSLLW       $7, Y8, Y8
	VPAND        Y15, Y8, Y8
	VEXTRACTI128 $1, Y8, X10
	VCVTPH2PS    X8, Y9
	VCVTPH2PS    X10, Y10
	VMULPS       Y14, Y9, Y9
	VMULPS       Y14, Y10, Y10
	VFMADD231PS  128(DI), Y9, Y0
	VFMADD231PS  160(DI), Y10, Y1
	VFMADD231PS  128(DI)(R13*1), Y9, Y2
	VFMADD231PS  160(DI)(R13*1), Y10, Y3
	VFMADD231PS  128(DI)(R13*2), Y9, Y4
	VFMADD231PS  160(DI)(R13*2), Y10, Y5
	VFMADD231PS  128(R9), Y9, Y6
	VFMADD231PS  160(R9), Y10, Y7
	VPMOVSXBW    52(SI), Y8
	VPSLLW       $7, Y8, Y8
	VPAND        Y15, Y8, Y8
	VEXTRACTI128 $1, Y8, X10
	VCVTPH2PS    X8, Y9
	VCVTPH2PS    X10, Y10
	VMULPS       Y14, Y9, Y9
	VMULPS       Y14, Y10, Y10
	VFMADD231PS  192(DI), Y9, Y0
	VFMADD231PS  224(DI), Y10, Y1
	VFMADD231PS  192(DI)(R13*1), Y9, Y2
	VFMADD231PS  224(DI)(R13*1), Y10, Y3
	VFMADD231PS  192(DI)(R13*2), Y9, Y4
	VFMADD231PS  224(DI)(R13*2), Y10, Y5
	VFMADD231PS  192(R9), Y9, Y6
	VFMADD231PS  224(R9), Y10, Y7
	VPMOVSXBW    68(SI), Y8
	VPSLLW       $7, Y8, Y8
	VPAND        Y15, Y8, Y8
	VEXTRACTI128 $1, Y8, X10
	VCVTPH2PS    X8, Y9
	VCVTPH2PS    X10, Y10
	VMULPS       Y14, Y9, Y9
	VMULPS       Y14, Y10, Y10
	VFMADD231PS  256(DI), Y9, Y0
	VFMADD231PS  288(DI), Y10, Y1
	VFMADD231PS  256(DI)(R13*1), Y9, Y2
	VFMADD231PS  288(DI)(R13*1), Y10, Y3
	VFMADD231PS  256(DI)(R13*2), Y9, Y4
	VFMADD231PS  288(DI)(R13*2), Y10, Y5
	VFMADD231PS  256(R9), Y9, Y6
	VFMADD231PS  288(R9), Y10, Y7
	VPMOVSXBW    84(SI), Y8
	VPSLLW       $7, Y8, Y8
	VPAND        Y15, Y8, Y8
	VEXTRACTI128 $1, Y8, X10
	VCVTPH2PS    X8, Y9
	VCVTPH2PS    X10, Y10
	VMULPS       Y14, Y9, Y9
	VMULPS       Y14, Y10, Y10
	VFMADD231PS  320(DI), Y9, Y0
	VFMADD231PS  352(DI), Y10, Y1
	VFMADD231PS  320(DI)(R13*1), Y9, Y2
	VFMADD231PS  352(DI)(R13*1), Y10, Y3
	VFMADD231PS  320(DI)(R13*2), Y9, Y4
	VFMADD231PS  352(DI)(R13*2), Y10, Y5
	VFMADD231PS  320(R9), Y9, Y6
	VFMADD231PS  352(R9), Y10, Y7
	VPMOVSXBW    100(SI), Y8
	VPSLLW       $7, Y8, Y8
	VPAND        Y15, Y8, Y8
	VEXTRACTI128 $1, Y8, X10
	VCVTPH2PS    X8, Y9
	VCVTPH2PS    X10, Y10
	VMULPS       Y14, Y9, Y9
	VMULPS       Y14, Y10, Y10
	VFMADD231PS  384(DI), Y9, Y0
	VFMADD231PS  416(DI), Y10, Y1
	VFMADD231PS  384(DI)(R13*1), Y9, Y2
	VFMADD231PS  416(DI)(R13*1), Y10, Y3
	VFMADD231PS  384(DI)(R13*2), Y9, Y4
	VFMADD231PS  416(DI)(R13*2), Y10, Y5
	VFMADD231PS  384(R9), Y9, Y6
	VFMADD231PS  416(R9), Y10, Y7
	VPMOVSXBW    116(SI), Y8
	VPSLLW       $7, Y8, Y8
	VPAND        Y15, Y8, Y8
	VEXTRACTI128 $1, Y8, X10
	VCVTPH2PS    X8, Y9
	VCVTPH2PS    X10, Y10
	VMULPS       Y14, Y9, Y9
	VMULPS       Y14, Y10, Y10
	VFMADD231PS  448(DI), Y9, Y0
	VFMADD231PS  480(DI), Y10, Y1
	VFMADD231PS  448(DI)(R13*1), Y9, Y2
	VFMADD231PS  480(DI)(R13*1), Y10, Y3
	VFMADD231PS  448(DI)(R13*2), Y9, Y4
	VFMADD231PS  480(DI)(R13*2), Y10, Y5
	VFMADD231PS  448(R9), Y9, Y6
	VFMADD231PS  480(R9), Y10, Y7
	ADDQ $132, SI
	ADDQ $512, DI
	ADDQ $512, R9
	DECQ CX
	JMP  f8x4block

f8x4sum:
	VADDPS Y1, Y0, Y0
	VADDPS Y3, Y2, Y2
	VADDPS Y5, Y4, Y4
	VADDPS Y7, Y6, Y6
	HSUMQ(Y0, X0, X8)
	VMOVSS X0, 0(R12)
	HSUMQ(Y2, X2, X8)
	VMOVSS X2, 4(R12)
	HSUMQ(Y4, X4, X8)
	VMOVSS X4, 8(R12)
	HSUMQ(Y6, X6, X8)
	VMOVSS X6, 12(R12)
	ADDQ $16, R12
	ADDQ rb+8(FP), R10
	DECQ R8
	JMP  f8x4row

f8x4done:
	VZEROUPPER
	RET

// func quantizeAVX(x *float32, nb int, blk int, dst *byte)
// quantizeRowGo on AVX2, bit for bit: nb blocks of blk (32 or 256)
// elements into blocks of [d | blk quants | 16 sums for blk 256]; per
// block d = amax/127 and q = x * (127/amax) rounded to nearest even
// (VCVTPS2DQ); a NaN gives d NaN and quants 0.
TEXT ·quantizeAVX(SB), NOSPLIT, $0-32
	MOVQ    x+0(FP), SI
	MOVQ    nb+8(FP), CX
	MOVQ    blk+16(FP), R8
	MOVQ    dst+24(FP), DI
	BCAST32($0x7fffffff, X15, Y15) // |x| mask
	MOVL    $0x42fe0000, AX        // 127
	VMOVD   AX, X14
	VMOVDQU quantPerm<>(SB), Y13
	BCAST32($0x01010101, X12, Y12) // int8 ones
	BCAST32($0x00010001, X11, Y11) // int16 ones

qblock:
	TESTQ  CX, CX
	JZ     qdone
	LEAQ   4(DI)(R8*1), BX // the block's sums (blk 256)
	VXORPS Y0, Y0, Y0
	VPXOR  Y9, Y9, Y9      // NaN lanes seen
	XORQ   AX, AX

qmax:
	VMOVUPS (SI)(AX*4), Y1
	VCMPPS  $3, Y1, Y1, Y2
	VPOR    Y2, Y9, Y9
	VANDPS  Y15, Y1, Y1
	VMAXPS  Y1, Y0, Y0
	ADDQ    $8, AX
	CMPQ    AX, R8
	JLT     qmax
	VEXTRACTF128 $1, Y0, X1
	VMAXPS       X1, X0, X0
	VMOVHLPS     X0, X0, X1
	VMAXPS       X1, X0, X0
	VMOVSHDUP    X0, X1
	VMAXSS       X1, X0, X0
	VXORPS       X1, X1, X1
	VPTEST       Y9, Y9
	JNZ          qnan
	VUCOMISS     X1, X0
	JNE          qscale
	JMP          qzeros // amax 0: d 0, quants 0

qnan:
	MOVL  $0x7fc00000, AX
	VMOVD AX, X1

qzeros:
	VMOVSS X1, (DI)
	VXORPS X1, X1, X1
	XORQ   AX, AX

qzero:
	VMOVDQU Y1, 4(DI)(AX*1)
	ADDQ    $32, AX
	CMPQ    AX, R8
	JLT     qzero
	CMPQ    R8, $256
	JNE     qnext
	VMOVDQU Y1, (BX)
	JMP     qnext

qscale:
	VDIVSS       X14, X0, X1 // d = amax/127
	VMOVSS       X1, (DI)
	VDIVSS       X0, X14, X2 // 127/amax
	VBROADCASTSS X2, Y2
	XORQ         AX, AX

qchunk:
	VMULPS     (SI)(AX*4), Y2, Y3
	VMULPS     32(SI)(AX*4), Y2, Y4
	VMULPS     64(SI)(AX*4), Y2, Y5
	VMULPS     96(SI)(AX*4), Y2, Y6
	VCVTPS2DQ  Y3, Y3
	VCVTPS2DQ  Y4, Y4
	VCVTPS2DQ  Y5, Y5
	VCVTPS2DQ  Y6, Y6
	VPACKSSDW  Y4, Y3, Y3
	VPACKSSDW  Y6, Y5, Y5
	VPACKSSWB  Y5, Y3, Y3
	VPERMD     Y3, Y13, Y3
	VMOVDQU    Y3, 4(DI)(AX*1)
	CMPQ       R8, $256
	JNE        qchunknext
	// sums of 16: bytes -> pairs -> fours, then two horizontal adds
	VPMADDUBSW   Y3, Y12, Y3
	VPMADDWD     Y11, Y3, Y3
	VPHADDD      Y3, Y3, Y3
	VPHADDD      Y3, Y3, Y3
	VMOVD        X3, R9
	MOVW         R9, (BX)
	VEXTRACTI128 $1, Y3, X3
	VMOVD        X3, R9
	MOVW         R9, 2(BX)
	ADDQ         $4, BX

qchunknext:
	ADDQ $32, AX
	CMPQ AX, R8
	JLT  qchunk

qnext:
	LEAQ (SI)(R8*4), SI
	LEAQ 4(DI)(R8*1), DI
	CMPQ R8, $256
	JNE  qnext2
	ADDQ $32, DI

qnext2:
	DECQ CX
	JMP  qblock

qdone:
	VZEROUPPER
	RET

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

// HSUM4 stores the sums of Z0-Z3 at 0-12(R12) and moves R12 past them
// (Y24 scratch).
#define HSUM4 \
	HSUM16(Z0, Y0, X0, Y24, X24, 0(R12)); \
	HSUM16(Z1, Y1, X1, Y24, X24, 4(R12)); \
	HSUM16(Z2, Y2, X2, Y24, X24, 8(R12)); \
	HSUM16(Z3, Y3, X3, Y24, X24, 12(R12)); \
	ADDQ $16, R12

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
	ZERO4(Z0, Z1, Z2, Z3)
	ZERO4(Z4, Z5, Z6, Z7)
	ZERO4(Z8, Z9, Z10, Z11)
	ZERO4(Z12, Z13, Z14, Z15)
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
	ZERO4(Z0, Z1, Z2, Z3)
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

	HSUM4
	ADDQ R9, BX
	DECQ R8
	JMP  vsingle

vdone:
	VZEROUPPER
	RET

// K4UNPACK spreads the group of nibbles at qo(SI) (two sub-blocks of 32:
// low nibbles, then high) over the 64 bytes of Z16 (Z17 scratch).
#define K4UNPACK(qo) \
	VMOVDQU64    qo(SI), Y16; \
	VPSRLW       $4, Y16, Y17; \
	VINSERTI64X4 $1, Y17, Z16, Z16; \
	VPANDD       Z13, Z16, Z16

// K4VGROUP dots the group of nibbles at qo(SI) (two sub-blocks) with the
// four input rows' quants at xo, times the sub-blocks' scales S (words),
// into their int32 sums Z4-Z7 (Z16, Z17 and Z11, Z12 scratch).
#define K4VGROUP(qo, xo, S) \
	K4UNPACK(qo); \
	VROWS4(Z16, xo, S)

// VROW adds to one input row's int32 sums acc the products of the 64
// unsigned quants in Q with the row's quants at xo from in, times the
// scales (words) in S: VPMADDUBSW's int16 pairs, multiplied and added by
// VPDPWSSD (T scratch).
#define VROW(Q, xo, in, S, T, acc) \
	VPMADDUBSW xo in, Q, T; \
	VPDPWSSD   S, T, acc

// VROWS4 is VROW for the four input rows at DI, DI + R13, DI + 2 R13 and
// R9, into Z4-Z7 (Z11, Z12 scratch).
#define VROWS4(Q, xo, S) \
	VROW(Q, xo, (DI), S, Z11, Z4); \
	VROW(Q, xo, (DI)(R13*1), S, Z12, Z5); \
	VROW(Q, xo, (DI)(R13*2), S, Z11, Z6); \
	VROW(Q, xo, (R9), S, Z12, Z7)

// Q4KGROUPS runs GROUP (K4VGROUP or K8VGROUP) over a Q4_K block's four
// groups of nibbles, each with its input quants and its scales.
#define Q4KGROUPS(GROUP) \
	GROUP(16, 4, Z24); \
	GROUP(48, 68, Z25); \
	GROUP(80, 132, Z26); \
	GROUP(112, 196, Z27)

// K4VFIN adds one input row's block to acc: (d * isum - dmin * the mins
// against its 16-sums) * d_x (x its block; M, MZ scratch).
#define K4VFIN(x, isum, M, MZ, acc) \
	VPMADDWD         260 x, Y9, M; \
	VCVTDQ2PS        isum, isum; \
	VCVTDQ2PS        MZ, MZ; \
	VMULPS           Z14, isum, isum; \
	VFNMADD231PS     Z15, MZ, isum; \
	VFMADD231PS.BCST x, isum, acc

// KVHEAD starts a block of the AVX-512 Q4_K and Q5_K kernels: the scales
// spread by sub-block pair into Z24-Z27 (words), each min twice in Y9, d
// and dmin broadcast in Z14 and Z15, the int32 sums Z4-Z7 zeroed (X8, Z10
// scratch).
#define KVHEAD \
	KSCALES(AX, BX, DX, R10, R11); \
	VMOVQ        AX, X8; \
	VPMOVZXBW    X8, X8; \
	VMOVQ        BX, X9; \
	VPMOVZXBW    X9, X9; \
	VMOVDQU64    q4kPerm<>+256(SB), Y10; \
	VPERMW       Y9, Y10, Y9; \
	VMOVDQU64    q4kPerm<>+0(SB), Z10; \
	VPERMW       Z8, Z10, Z24; \
	VMOVDQU64    q4kPerm<>+64(SB), Z10; \
	VPERMW       Z8, Z10, Z25; \
	VMOVDQU64    q4kPerm<>+128(SB), Z10; \
	VPERMW       Z8, Z10, Z26; \
	VMOVDQU64    q4kPerm<>+192(SB), Z10; \
	VPERMW       Z8, Z10, Z27; \
	MOVL         (SI), AX; \
	VMOVD        AX, X14; \
	VCVTPH2PS    X14, X14; \
	VMOVSHDUP    X14, X15; \
	VBROADCASTSS X15, Z15; \
	VBROADCASTSS X14, Z14; \
	ZERO4(Z4, Z5, Z6, Z7)

// KVTAIL ends a block of bs bytes of the AVX-512 Q4_K and Q5_K kernels.
#define KVTAIL(bs) \
	K4VFIN((DI), Z4, Y28, Z28, Z0); \
	K4VFIN((DI)(R13*1), Z5, Y29, Z29, Z1); \
	K4VFIN((DI)(R13*2), Z6, Y30, Z30, Z2); \
	K4VFIN((R9), Z7, Y31, Z31, Z3); \
	KNEXT4(bs)

// K5VGROUP is K4VGROUP for Q5_K: the fifth bits of the group's two
// sub-blocks, bits of the qh bytes in Y18 moved to bit 4 by the word
// shifts opl $nl (low nibbles) and oph $nh (high), picked by the 0x10
// bytes in Z20 and ORed in (Z17, Z19 scratch).
#define K5VGROUP(qo, opl, nl, oph, nh, xo, S) \
	K4UNPACK(qo); \
	opl          $nl, Y18, Y17; \
	oph          $nh, Y18, Y19; \
	VINSERTI64X4 $1, Y19, Z17, Z17; \
	VPTERNLOGD   $0xf8, Z20, Z17, Z16; \
	VROWS4(Z16, xo, S)

// KVFIN adds one input row's int32 sums times d (Z14) * d_x to acc (x
// its block).
#define KVFIN(x, isum, acc) \
	VCVTDQ2PS        isum, isum; \
	VMULPS           Z14, isum, isum; \
	VFMADD231PS.BCST x, isum, acc

// func dotQ4Kx4VNNI(w *byte, rows int, x *byte, xstride int, nb int, out *float32)
// dotQ4Kx4AVX in zmm registers on AVX-512 (BW, VNNI): a group of 32
// bytes of nibbles is two sub-blocks of 32 (low nibbles, then high) in one
// zmm, dotted with the 64 input quants of those sub-blocks by VPMADDUBSW
// and multiplied by their scales as int16 (VPERMW spreads each over its
// sub-block's half) while VPDPWSSD adds the pairs into int32. A block then
// ends in float: d times the sums less dmin times the mins' products with
// the input's 16-sums, times d_x (broadcast from the input block).
TEXT ·dotQ4Kx4VNNI(SB), NOSPLIT, $0-48
	ARGS4
	MOVL         $0x0f0f0f0f, AX
	VPBROADCASTD AX, Z13 // low nibbles

k4vrow:
	TESTQ  R8, R8
	JZ     k4vdone
	V4ROW

k4vblock:
	TESTQ CX, CX
	JZ    k4vsum
	PF3
	KVHEAD
	Q4KGROUPS(K4VGROUP)
	KVTAIL(144)
	JMP k4vblock

k4vsum:
	HSUM4
	DECQ R8
	JMP  k4vrow

k4vdone:
	VZEROUPPER
	RET

// The eight-row Q4_K kernel's input rows are DI, DI + R13, DI + 2 R13,
// DI + R14 (R14 = 3 R13) and the same from R9 = DI + 4 R13; their int32
// sums Z4-Z7, Z22, Z23, Z28, Z29 and float sums Z0-Z3, Z18-Z21.

// VROWS8 is VROW for the eight input rows (Z11, Z12 scratch).
#define VROWS8(Q, xo, S) \
	VROW(Q, xo, (DI), S, Z11, Z4); \
	VROW(Q, xo, (DI)(R13*1), S, Z12, Z5); \
	VROW(Q, xo, (DI)(R13*2), S, Z11, Z6); \
	VROW(Q, xo, (DI)(R14*1), S, Z12, Z7); \
	VROW(Q, xo, (R9), S, Z11, Z22); \
	VROW(Q, xo, (R9)(R13*1), S, Z12, Z23); \
	VROW(Q, xo, (R9)(R13*2), S, Z11, Z28); \
	VROW(Q, xo, (R9)(R14*1), S, Z12, Z29)

// K8VGROUP is K4VGROUP for the eight input rows.
#define K8VGROUP(qo, xo, S) \
	K4UNPACK(qo); \
	VROWS8(Z16, xo, S)

// KV8TAIL is KVTAIL for the eight input rows (Z30, Z31 scratch).
#define KV8TAIL(bs) \
	K4VFIN((DI), Z4, Y30, Z30, Z0); \
	K4VFIN((DI)(R13*1), Z5, Y31, Z31, Z1); \
	K4VFIN((DI)(R13*2), Z6, Y30, Z30, Z2); \
	K4VFIN((DI)(R14*1), Z7, Y31, Z31, Z3); \
	K4VFIN((R9), Z22, Y30, Z30, Z18); \
	K4VFIN((R9)(R13*1), Z23, Y31, Z31, Z19); \
	K4VFIN((R9)(R13*2), Z28, Y30, Z30, Z20); \
	K4VFIN((R9)(R14*1), Z29, Y31, Z31, Z21); \
	KNEXT4(bs)

// HSUM8 stores the sums of Z0-Z3 and Z18-Z21 at 0-28(R12) and moves R12
// past them (Z8, Y24 scratch: VHADDPS has no encoding for X16 and up).
#define HSUM8 \
	HSUM4; \
	VMOVAPS Z18, Z8; \
	HSUM16(Z8, Y8, X8, Y24, X24, 0(R12)); \
	VMOVAPS Z19, Z8; \
	HSUM16(Z8, Y8, X8, Y24, X24, 4(R12)); \
	VMOVAPS Z20, Z8; \
	HSUM16(Z8, Y8, X8, Y24, X24, 8(R12)); \
	VMOVAPS Z21, Z8; \
	HSUM16(Z8, Y8, X8, Y24, X24, 12(R12)); \
	ADDQ    $16, R12

// func dotQ4Kx8VNNI(w *byte, rows int, x *byte, xstride int, nb int, out *float32)
// dotQ4Kx4VNNI for eight input rows (out[r*8+j]): each block's scales and
// each group's nibbles are unpacked once for twice the rows, which is most
// of what the four-row kernel does beside its products. The weights come
// from L1 (the caller's chunks of rows), so R14 holds three input rows'
// stride here rather than a prefetch distance.
TEXT ·dotQ4Kx8VNNI(SB), NOSPLIT, $0-48
	ARGS4
	LEAQ         (R13)(R13*2), R14
	MOVL         $0x0f0f0f0f, AX
	VPBROADCASTD AX, Z13 // low nibbles

k8vrow:
	TESTQ R8, R8
	JZ    k8vdone
	MOVQ  x+16(FP), DI
	MOVQ  nb+32(FP), CX
	LEAQ  (DI)(R13*4), R9
	ZERO4(Z0, Z1, Z2, Z3)
	ZERO4(Z18, Z19, Z20, Z21)

k8vblock:
	TESTQ CX, CX
	JZ    k8vsum
	KVHEAD
	ZERO4(Z22, Z23, Z28, Z29)
	Q4KGROUPS(K8VGROUP)
	KV8TAIL(144)
	JMP k8vblock

k8vsum:
	HSUM8
	DECQ R8
	JMP  k8vrow

k8vdone:
	VZEROUPPER
	RET

// func dotQ5Kx4VNNI(w *byte, rows int, x *byte, xstride int, nb int, out *float32)
// dotQ4Kx4VNNI for Q5_K: the fifth bits (qh, 32 bytes at 16) ORed into
// each group's nibbles, as dotQ5Kx4AVX does.
TEXT ·dotQ5Kx4VNNI(SB), NOSPLIT, $0-48
	ARGS4
	MOVL         $0x0f0f0f0f, AX
	VPBROADCASTD AX, Z13 // low nibbles
	MOVL         $0x10101010, AX
	VPBROADCASTD AX, Z20 // the fifth bit

k5vrow:
	TESTQ R8, R8
	JZ    k5vdone
	V4ROW

k5vblock:
	TESTQ CX, CX
	JZ    k5vsum
	PF3
	KVHEAD
	VMOVDQU64 16(SI), Y18
	K5VGROUP(48, VPSLLW, 4, VPSLLW, 3, 4, Z24)
	K5VGROUP(80, VPSLLW, 2, VPSLLW, 1, 68, Z25)
	K5VGROUP(112, VPSRLW, 0, VPSRLW, 1, 132, Z26)
	K5VGROUP(144, VPSRLW, 2, VPSRLW, 3, 196, Z27)
	KVTAIL(176)
	JMP k5vblock

k5vsum:
	HSUM4
	DECQ R8
	JMP  k5vrow

k5vdone:
	VZEROUPPER
	RET

// Q6VHALF unpacks half n of a Q6_K block (ql at qlo, qh at qho) into two
// zmm of 64 six-bit quants, values 128n to 128n + 63 (low nibbles of the
// half's 64 ql bytes, with qh's bit pairs 0 and 1) and the next 64 (high
// nibbles, bit pairs 2 and 3), and dots each with the four input rows'
// quants at xoA and xoB times their scales SA and SB (Z13 the 0x0f
// masks, Z15 the 0x30 masks; Z8, Z9, Z24-Z26 scratch).
#define Q6VHALF(qlo, qho, xoA, xoB, SA, SB) \
	VMOVDQU64    qlo(SI), Z8; \
	VMOVDQU64    qho(SI), Y9; \
	VPSLLW       $4, Y9, Y24; \
	VPSLLW       $2, Y9, Y25; \
	VINSERTI64X4 $1, Y25, Z24, Z24; \
	VPSRLW       $2, Y9, Y26; \
	VINSERTI64X4 $1, Y26, Z9, Z25; \
	VPANDD       Z15, Z24, Z24; \
	VPANDD       Z15, Z25, Z25; \
	VPANDD       Z13, Z8, Z16; \
	VPORD        Z24, Z16, Z16; \
	VPSRLW       $4, Z8, Z17; \
	VPANDD       Z13, Z17, Z17; \
	VPORD        Z25, Z17, Z17; \
	VROWS4(Z16, xoA, SA); \
	VROWS4(Z17, xoB, SB)

// Q6VSTART starts one input row's int32 sums at -32 times the sum of each
// scale (words in Y10) times its 16-sum (x the row's block; Z28 scratch).
#define Q6VSTART(x, isum) \
	VPMADDWD 260 x, Y10, Y28; \
	VPSLLD   $5, Z28, Z28; \
	VPXORD   isum, isum, isum; \
	VPSUBD   Z28, isum, isum

// func dotQ6Kx4VNNI(w *byte, rows int, x *byte, xstride int, nb int, out *float32)
// dotQ6Kx4AVX in zmm registers on AVX-512 (BW, VNNI), as dotQ4Kx4VNNI:
// 64 quants a zmm, their scales spread over the int16 pairs by VPERMW.
TEXT ·dotQ6Kx4VNNI(SB), NOSPLIT, $0-48
	ARGS4
	MOVL         $0x0f0f0f0f, AX
	VPBROADCASTD AX, Z13 // low nibbles
	MOVL         $0x30303030, AX
	VPBROADCASTD AX, Z15 // bits 4 and 5

q6vrow:
	TESTQ  R8, R8
	JZ     q6vdone
	V4ROW

q6vblock:
	TESTQ CX, CX
	JZ    q6vsum
	PF4
	VPMOVSXBW    192(SI), Y10 // the 16 scales as words
	VMOVDQU64    q6kPerm<>+0(SB), Z11
	VPERMW       Z10, Z11, Z20
	VMOVDQU64    q6kPerm<>+64(SB), Z11
	VPERMW       Z10, Z11, Z21
	VMOVDQU64    q6kPerm<>+128(SB), Z11
	VPERMW       Z10, Z11, Z22
	VMOVDQU64    q6kPerm<>+192(SB), Z11
	VPERMW       Z10, Z11, Z23
	MOVWLZX      208(SI), AX
	VMOVD        AX, X14
	VCVTPH2PS    X14, X14
	VBROADCASTSS X14, Z14 // d
	Q6VSTART((DI), Z4)
	Q6VSTART((DI)(R13*1), Z5)
	Q6VSTART((DI)(R13*2), Z6)
	Q6VSTART((R9), Z7)
	Q6VHALF(0, 128, 4, 68, Z20, Z21)
	Q6VHALF(64, 160, 132, 196, Z22, Z23)
	KVFIN((DI), Z4, Z0)
	KVFIN((DI)(R13*1), Z5, Z1)
	KVFIN((DI)(R13*2), Z6, Z2)
	KVFIN((R9), Z7, Z3)
	KNEXT4(210)
	JMP q6vblock

q6vsum:
	HSUM4
	DECQ R8
	JMP  q6vrow

q6vdone:
	VZEROUPPER
	RET


// q4kScale: VPSHUFB masks broadcasting int16 word s (s < 8) of each half.
DATA q4kScale<>+0(SB)/8, $0x0100010001000100
DATA q4kScale<>+8(SB)/8, $0x0100010001000100
DATA q4kScale<>+16(SB)/8, $0x0100010001000100
DATA q4kScale<>+24(SB)/8, $0x0100010001000100
DATA q4kScale<>+32(SB)/8, $0x0302030203020302
DATA q4kScale<>+40(SB)/8, $0x0302030203020302
DATA q4kScale<>+48(SB)/8, $0x0302030203020302
DATA q4kScale<>+56(SB)/8, $0x0302030203020302
DATA q4kScale<>+64(SB)/8, $0x0504050405040504
DATA q4kScale<>+72(SB)/8, $0x0504050405040504
DATA q4kScale<>+80(SB)/8, $0x0504050405040504
DATA q4kScale<>+88(SB)/8, $0x0504050405040504
DATA q4kScale<>+96(SB)/8, $0x0706070607060706
DATA q4kScale<>+104(SB)/8, $0x0706070607060706
DATA q4kScale<>+112(SB)/8, $0x0706070607060706
DATA q4kScale<>+120(SB)/8, $0x0706070607060706
DATA q4kScale<>+128(SB)/8, $0x0908090809080908
DATA q4kScale<>+136(SB)/8, $0x0908090809080908
DATA q4kScale<>+144(SB)/8, $0x0908090809080908
DATA q4kScale<>+152(SB)/8, $0x0908090809080908
DATA q4kScale<>+160(SB)/8, $0x0b0a0b0a0b0a0b0a
DATA q4kScale<>+168(SB)/8, $0x0b0a0b0a0b0a0b0a
DATA q4kScale<>+176(SB)/8, $0x0b0a0b0a0b0a0b0a
DATA q4kScale<>+184(SB)/8, $0x0b0a0b0a0b0a0b0a
DATA q4kScale<>+192(SB)/8, $0x0d0c0d0c0d0c0d0c
DATA q4kScale<>+200(SB)/8, $0x0d0c0d0c0d0c0d0c
DATA q4kScale<>+208(SB)/8, $0x0d0c0d0c0d0c0d0c
DATA q4kScale<>+216(SB)/8, $0x0d0c0d0c0d0c0d0c
DATA q4kScale<>+224(SB)/8, $0x0f0e0f0e0f0e0f0e
DATA q4kScale<>+232(SB)/8, $0x0f0e0f0e0f0e0f0e
DATA q4kScale<>+240(SB)/8, $0x0f0e0f0e0f0e0f0e
DATA q4kScale<>+248(SB)/8, $0x0f0e0f0e0f0e0f0e
GLOBL q4kScale<>(SB), RODATA|NOPTR, $256

// fifthBit: Q5_K's fifth bits moved to bit 4 of each byte.
DATA fifthBit<>+0(SB)/8, $0x1010101010101010
DATA fifthBit<>+8(SB)/8, $0x1010101010101010
DATA fifthBit<>+16(SB)/8, $0x1010101010101010
DATA fifthBit<>+24(SB)/8, $0x1010101010101010
GLOBL fifthBit<>(SB), RODATA|NOPTR, $32

// e2m1Int: the e2m1 values doubled, as int8 (quant.go's e2m1Int).
DATA e2m1Int<>+0(SB)/8, $0x0c08060403020100
DATA e2m1Int<>+8(SB)/8, $0xf4f8fafcfdfeff00
GLOBL e2m1Int<>(SB), RODATA|NOPTR, $16

// q6kScale: VPSHUFB masks giving bytes 2i (8 times) then 2i+1 (8 times).
DATA q6kScale<>+0(SB)/8, $0x0000000000000000
DATA q6kScale<>+8(SB)/8, $0x0101010101010101
DATA q6kScale<>+16(SB)/8, $0x0202020202020202
DATA q6kScale<>+24(SB)/8, $0x0303030303030303
DATA q6kScale<>+32(SB)/8, $0x0404040404040404
DATA q6kScale<>+40(SB)/8, $0x0505050505050505
DATA q6kScale<>+48(SB)/8, $0x0606060606060606
DATA q6kScale<>+56(SB)/8, $0x0707070707070707
DATA q6kScale<>+64(SB)/8, $0x0808080808080808
DATA q6kScale<>+72(SB)/8, $0x0909090909090909
DATA q6kScale<>+80(SB)/8, $0x0a0a0a0a0a0a0a0a
DATA q6kScale<>+88(SB)/8, $0x0b0b0b0b0b0b0b0b
DATA q6kScale<>+96(SB)/8, $0x0c0c0c0c0c0c0c0c
DATA q6kScale<>+104(SB)/8, $0x0d0d0d0d0d0d0d0d
DATA q6kScale<>+112(SB)/8, $0x0e0e0e0e0e0e0e0e
DATA q6kScale<>+120(SB)/8, $0x0f0f0f0f0f0f0f0f
GLOBL q6kScale<>(SB), RODATA|NOPTR, $128

// quantPerm: VPERMD indices undoing the lane interleaving of VPACKSSDW and
// VPACKSSWB.
DATA quantPerm<>+0(SB)/4, $0
DATA quantPerm<>+4(SB)/4, $4
DATA quantPerm<>+8(SB)/4, $1
DATA quantPerm<>+12(SB)/4, $5
DATA quantPerm<>+16(SB)/4, $2
DATA quantPerm<>+20(SB)/4, $6
DATA quantPerm<>+24(SB)/4, $3
DATA quantPerm<>+28(SB)/4, $7
GLOBL quantPerm<>(SB), RODATA|NOPTR, $32

// q4kPerm: VPERMW indices spreading a Q4_K block's eight scales (words)
// over the int16 pairs of each group's two sub-blocks, 64 bytes a group;
// at 256, each of the eight mins twice (against the input's 16-sums).
DATA q4kPerm<>+0(SB)/8, $0x0000000000000000
DATA q4kPerm<>+8(SB)/8, $0x0000000000000000
DATA q4kPerm<>+16(SB)/8, $0x0000000000000000
DATA q4kPerm<>+24(SB)/8, $0x0000000000000000
DATA q4kPerm<>+32(SB)/8, $0x0001000100010001
DATA q4kPerm<>+40(SB)/8, $0x0001000100010001
DATA q4kPerm<>+48(SB)/8, $0x0001000100010001
DATA q4kPerm<>+56(SB)/8, $0x0001000100010001
DATA q4kPerm<>+64(SB)/8, $0x0002000200020002
DATA q4kPerm<>+72(SB)/8, $0x0002000200020002
DATA q4kPerm<>+80(SB)/8, $0x0002000200020002
DATA q4kPerm<>+88(SB)/8, $0x0002000200020002
DATA q4kPerm<>+96(SB)/8, $0x0003000300030003
DATA q4kPerm<>+104(SB)/8, $0x0003000300030003
DATA q4kPerm<>+112(SB)/8, $0x0003000300030003
DATA q4kPerm<>+120(SB)/8, $0x0003000300030003
DATA q4kPerm<>+128(SB)/8, $0x0004000400040004
DATA q4kPerm<>+136(SB)/8, $0x0004000400040004
DATA q4kPerm<>+144(SB)/8, $0x0004000400040004
DATA q4kPerm<>+152(SB)/8, $0x0004000400040004
DATA q4kPerm<>+160(SB)/8, $0x0005000500050005
DATA q4kPerm<>+168(SB)/8, $0x0005000500050005
DATA q4kPerm<>+176(SB)/8, $0x0005000500050005
DATA q4kPerm<>+184(SB)/8, $0x0005000500050005
DATA q4kPerm<>+192(SB)/8, $0x0006000600060006
DATA q4kPerm<>+200(SB)/8, $0x0006000600060006
DATA q4kPerm<>+208(SB)/8, $0x0006000600060006
DATA q4kPerm<>+216(SB)/8, $0x0006000600060006
DATA q4kPerm<>+224(SB)/8, $0x0007000700070007
DATA q4kPerm<>+232(SB)/8, $0x0007000700070007
DATA q4kPerm<>+240(SB)/8, $0x0007000700070007
DATA q4kPerm<>+248(SB)/8, $0x0007000700070007
DATA q4kPerm<>+256(SB)/8, $0x0001000100000000
DATA q4kPerm<>+264(SB)/8, $0x0003000300020002
DATA q4kPerm<>+272(SB)/8, $0x0005000500040004
DATA q4kPerm<>+280(SB)/8, $0x0007000700060006
GLOBL q4kPerm<>(SB), RODATA|NOPTR, $288

// q6kPerm: VPERMW indices spreading a Q6_K block's sixteen scales (words)
// over the int16 pairs of each 64 quants, eight pairs a scale.
DATA q6kPerm<>+0(SB)/8, $0x0000000000000000
DATA q6kPerm<>+8(SB)/8, $0x0000000000000000
DATA q6kPerm<>+16(SB)/8, $0x0001000100010001
DATA q6kPerm<>+24(SB)/8, $0x0001000100010001
DATA q6kPerm<>+32(SB)/8, $0x0002000200020002
DATA q6kPerm<>+40(SB)/8, $0x0002000200020002
DATA q6kPerm<>+48(SB)/8, $0x0003000300030003
DATA q6kPerm<>+56(SB)/8, $0x0003000300030003
DATA q6kPerm<>+64(SB)/8, $0x0004000400040004
DATA q6kPerm<>+72(SB)/8, $0x0004000400040004
DATA q6kPerm<>+80(SB)/8, $0x0005000500050005
DATA q6kPerm<>+88(SB)/8, $0x0005000500050005
DATA q6kPerm<>+96(SB)/8, $0x0006000600060006
DATA q6kPerm<>+104(SB)/8, $0x0006000600060006
DATA q6kPerm<>+112(SB)/8, $0x0007000700070007
DATA q6kPerm<>+120(SB)/8, $0x0007000700070007
DATA q6kPerm<>+128(SB)/8, $0x0008000800080008
DATA q6kPerm<>+136(SB)/8, $0x0008000800080008
DATA q6kPerm<>+144(SB)/8, $0x0009000900090009
DATA q6kPerm<>+152(SB)/8, $0x0009000900090009
DATA q6kPerm<>+160(SB)/8, $0x000a000a000a000a
DATA q6kPerm<>+168(SB)/8, $0x000a000a000a000a
DATA q6kPerm<>+176(SB)/8, $0x000b000b000b000b
DATA q6kPerm<>+184(SB)/8, $0x000b000b000b000b
DATA q6kPerm<>+192(SB)/8, $0x000c000c000c000c
DATA q6kPerm<>+200(SB)/8, $0x000c000c000c000c
DATA q6kPerm<>+208(SB)/8, $0x000d000d000d000d
DATA q6kPerm<>+216(SB)/8, $0x000d000d000d000d
DATA q6kPerm<>+224(SB)/8, $0x000e000e000e000e
DATA q6kPerm<>+232(SB)/8, $0x000e000e000e000e
DATA q6kPerm<>+240(SB)/8, $0x000f000f000f000f
DATA q6kPerm<>+248(SB)/8, $0x000f000f000f000f
GLOBL q6kPerm<>(SB), RODATA|NOPTR, $256
