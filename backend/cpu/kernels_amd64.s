#include "textflag.h"
#include "zmm_amd64.h"

// GEMM6ARGS loads the 6x16 kernels' arguments: a's six rows at SI and
// R9-R13 (lda in bytes in R8), b at DI, k in CX, c at DX (ldc in bytes in
// BX).
#define GEMM6ARGS \
	MOVQ a+0(FP), SI; \
	MOVQ lda+8(FP), R8; \
	SHLQ $2, R8; \
	MOVQ b+16(FP), DI; \
	MOVQ k+24(FP), CX; \
	MOVQ c+32(FP), DX; \
	MOVQ ldc+40(FP), BX; \
	SHLQ $2, BX; \
	LEAQ (SI)(R8*1), R9; \
	LEAQ (R9)(R8*1), R10; \
	LEAQ (R10)(R8*1), R11; \
	LEAQ (R11)(R8*1), R12; \
	LEAQ (R12)(R8*1), R13

// HSUM reduces the 8 lanes of ymm register Y to lane 0 of its xmm X, using T.
#define HSUM(Y, X, T) \
	VEXTRACTF128 $1, Y, T; \
	VADDPS       T, X, X;  \
	VHADDPS      X, X, X;  \
	VHADDPS      X, X, X

// BF16 loads 8 bf16 values at addr as float32 into ymm register R.
#define BF16(addr, R) \
	VPMOVZXWD addr, R; \
	VPSLLD    $16, R, R

// HSUM4 reduces the 8 lanes of each of ymm registers A, B, C and D (the sums
// of four rows) to the four lanes of A's xmm X, in that order, using T.
#define HSUM4(A, B, C, D, X, T) \
	VHADDPS      B, A, A;  \
	VHADDPS      D, C, C;  \
	VHADDPS      C, A, A;  \
	VEXTRACTF128 $1, A, T; \
	VADDPS       T, X, X

// ROWS4 points R10, R11 and R12 at the three rows after DI's (DX bytes
// apart); ZERO8 zeroes Y0-Y7; LOAD4 and STORE4 move 32 floats at base
// plus the element index AX to and from four ymm registers.
#define ROWS4 \
	LEAQ (DI)(DX*1), R10; \
	LEAQ (R10)(DX*1), R11; \
	LEAQ (R11)(DX*1), R12
#define ZERO8 \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	VXORPS Y2, Y2, Y2; \
	VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; \
	VXORPS Y5, Y5, Y5; \
	VXORPS Y6, Y6, Y6; \
	VXORPS Y7, Y7, Y7
#define LOAD4(base, A, B, C, D) \
	VMOVUPS (base)(AX*4), A; \
	VMOVUPS 32(base)(AX*4), B; \
	VMOVUPS 64(base)(AX*4), C; \
	VMOVUPS 96(base)(AX*4), D
#define STORE4(base, A, B, C, D) \
	VMOVUPS A, (base)(AX*4); \
	VMOVUPS B, 32(base)(AX*4); \
	VMOVUPS C, 64(base)(AX*4); \
	VMOVUPS D, 96(base)(AX*4)

// The attention kernels below read rows of keys or values through LD, which
// loads 8 of them, elements 8p.. of the row at base plus the element index
// AX, as float32 into ymm register R: LDF32 for an f32 cache, LDBF16 for a
// bf16 one. Each is a macro instantiated for both.
#define LDF32(p, base, R) VMOVUPS p*32(base)(AX*4), R
#define LDBF16(p, base, R) BF16(p*16(base)(AX*2), R)

// DOTROWS sets out[r] = q . k_r for r < rows, k_r the row at k + r*stride
// bytes; hd is a multiple of 16. Four rows at a time share each load of q
// and one reduction.
#define DOTROWS(LD) \
	MOVQ q+0(FP), SI; \
	MOVQ k+8(FP), DI; \
	MOVQ stride+16(FP), DX; \
	MOVQ rows+24(FP), R8; \
	MOVQ hd+32(FP), CX; \
	MOVQ out+40(FP), R9; \
row4: \
	CMPQ R8, $4; \
	JLT row1; \
	ROWS4; \
	ZERO8; \
	XORQ AX, AX; \
inner4: \
	CMPQ AX, CX; \
	JGE sum4; \
	VMOVUPS (SI)(AX*4), Y8; \
	VMOVUPS 32(SI)(AX*4), Y9; \
	LD(0, DI, Y10); \
	LD(1, DI, Y11); \
	LD(0, R10, Y12); \
	LD(1, R10, Y13); \
	VFMADD231PS Y10, Y8, Y0; \
	VFMADD231PS Y11, Y9, Y1; \
	VFMADD231PS Y12, Y8, Y2; \
	VFMADD231PS Y13, Y9, Y3; \
	LD(0, R11, Y10); \
	LD(1, R11, Y11); \
	LD(0, R12, Y12); \
	LD(1, R12, Y13); \
	VFMADD231PS Y10, Y8, Y4; \
	VFMADD231PS Y11, Y9, Y5; \
	VFMADD231PS Y12, Y8, Y6; \
	VFMADD231PS Y13, Y9, Y7; \
	ADDQ $16, AX; \
	JMP inner4; \
sum4: \
	VADDPS Y1, Y0, Y0; \
	VADDPS Y3, Y2, Y2; \
	VADDPS Y5, Y4, Y4; \
	VADDPS Y7, Y6, Y6; \
	HSUM4(Y0, Y2, Y4, Y6, X0, X1); \
	VMOVUPS X0, (R9); \
	ADDQ $16, R9; \
	LEAQ (R12)(DX*1), DI; \
	SUBQ $4, R8; \
	JMP row4; \
row1: \
	TESTQ R8, R8; \
	JZ done; \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	XORQ AX, AX; \
inner1: \
	CMPQ AX, CX; \
	JGE sum1; \
	LD(0, DI, Y4); \
	LD(1, DI, Y5); \
	VFMADD231PS (SI)(AX*4), Y4, Y0; \
	VFMADD231PS 32(SI)(AX*4), Y5, Y1; \
	ADDQ $16, AX; \
	JMP inner1; \
sum1: \
	VADDPS Y1, Y0, Y0; \
	HSUM(Y0, X0, X2); \
	VMOVSS X0, (R9); \
	ADDQ $4, R9; \
	ADDQ DX, DI; \
	DECQ R8; \
	JMP row1; \
done: \
	VZEROUPPER; \
	RET

// AXPY4 adds the row at base (32 dims, loaded by LD into the scratch t0
// and t1 in turn) times the broadcast b to the accumulators a0-a3.
#define AXPY4(LD, base, b, a0, a1, a2, a3, t0, t1) \
	LD(0, base, t0); \
	VFMADD231PS t0, b, a0; \
	LD(1, base, t1); \
	VFMADD231PS t1, b, a1; \
	LD(2, base, t0); \
	VFMADD231PS t0, b, a2; \
	LD(3, base, t1); \
	VFMADD231PS t1, b, a3

// AXPYROWS adds sum_r p[r] * v_r to acc[0:hd] (hd a multiple of 32), v_r
// the row at v + r*stride bytes: 32 dims at a time, two rows per step into
// separate accumulators so that the FMAs do not wait on each other.
#define AXPYROWS(LD) \
	MOVQ acc+0(FP), R9; \
	MOVQ p+8(FP), SI; \
	MOVQ v+16(FP), DI; \
	MOVQ stride+24(FP), DX; \
	MOVQ rows+32(FP), R8; \
	MOVQ hd+40(FP), CX; \
	MOVQ R8, R11; \
	ANDQ $-2, R11; \
	XORQ AX, AX; \
chunk: \
	CMPQ AX, CX; \
	JGE done; \
	LOAD4(R9, Y0, Y1, Y2, Y3); \
	VXORPS Y4, Y4, Y4; \
	VXORPS Y5, Y5, Y5; \
	VXORPS Y6, Y6, Y6; \
	VXORPS Y7, Y7, Y7; \
	MOVQ DI, R10; \
	XORQ BX, BX; \
pair: \
	CMPQ BX, R11; \
	JGE single; \
	VBROADCASTSS (SI)(BX*4), Y8; \
	VBROADCASTSS 4(SI)(BX*4), Y9; \
	LEAQ (R10)(DX*1), R12; \
	AXPY4(LD, R10, Y8, Y0, Y1, Y2, Y3, Y10, Y11); \
	AXPY4(LD, R12, Y9, Y4, Y5, Y6, Y7, Y12, Y13); \
	LEAQ (R12)(DX*1), R10; \
	ADDQ $2, BX; \
	JMP pair; \
single: \
	CMPQ BX, R8; \
	JGE store; \
	VBROADCASTSS (SI)(BX*4), Y8; \
	AXPY4(LD, R10, Y8, Y0, Y1, Y2, Y3, Y10, Y11); \
store: \
	VADDPS Y4, Y0, Y0; \
	VADDPS Y5, Y1, Y1; \
	VADDPS Y6, Y2, Y2; \
	VADDPS Y7, Y3, Y3; \
	STORE4(R9, Y0, Y1, Y2, Y3); \
	ADDQ $32, AX; \
	JMP chunk; \
done: \
	VZEROUPPER; \
	RET

// DOT2ROWS computes the scaled dots of two query heads (q[0:hd] and
// q[hd:2hd]) with rows of keys: out[r] = scale * q[0:hd] . k_r and
// out[ostride/4 + r] = scale * q[hd:2hd] . k_r, k_r the row at k +
// r*stride bytes; hd is a multiple of 8. Each key is loaded once for both
// heads, four rows a reduction.
#define DOT2ROWS(LD) \
	MOVQ q+0(FP), SI; \
	MOVQ k+8(FP), DI; \
	MOVQ stride+16(FP), DX; \
	MOVQ rows+24(FP), R8; \
	MOVQ hd+32(FP), CX; \
	VBROADCASTSS scale+40(FP), Y15; \
	MOVQ out+48(FP), R9; \
	MOVQ ostride+56(FP), BX; \
	LEAQ (SI)(CX*4), R13; \
row4: \
	CMPQ R8, $4; \
	JLT row1; \
	ROWS4; \
	ZERO8; \
	XORQ AX, AX; \
inner4: \
	CMPQ AX, CX; \
	JGE sum4; \
	VMOVUPS (SI)(AX*4), Y8; \
	VMOVUPS (R13)(AX*4), Y9; \
	LD(0, DI, Y10); \
	LD(0, R10, Y11); \
	LD(0, R11, Y12); \
	LD(0, R12, Y13); \
	VFMADD231PS Y10, Y8, Y0; \
	VFMADD231PS Y10, Y9, Y1; \
	VFMADD231PS Y11, Y8, Y2; \
	VFMADD231PS Y11, Y9, Y3; \
	VFMADD231PS Y12, Y8, Y4; \
	VFMADD231PS Y12, Y9, Y5; \
	VFMADD231PS Y13, Y8, Y6; \
	VFMADD231PS Y13, Y9, Y7; \
	ADDQ $8, AX; \
	JMP inner4; \
sum4: \
	HSUM4(Y0, Y2, Y4, Y6, X0, X8); \
	HSUM4(Y1, Y3, Y5, Y7, X1, X8); \
	VMULPS X15, X0, X0; \
	VMULPS X15, X1, X1; \
	VMOVUPS X0, (R9); \
	VMOVUPS X1, (R9)(BX*1); \
	ADDQ $16, R9; \
	LEAQ (R12)(DX*1), DI; \
	SUBQ $4, R8; \
	JMP row4; \
row1: \
	TESTQ R8, R8; \
	JZ done; \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	XORQ AX, AX; \
inner1: \
	CMPQ AX, CX; \
	JGE sum1; \
	LD(0, DI, Y2); \
	VFMADD231PS (SI)(AX*4), Y2, Y0; \
	VFMADD231PS (R13)(AX*4), Y2, Y1; \
	ADDQ $8, AX; \
	JMP inner1; \
sum1: \
	HSUM(Y0, X0, X2); \
	HSUM(Y1, X1, X2); \
	VMULSS X15, X0, X0; \
	VMULSS X15, X1, X1; \
	VMOVSS X0, (R9); \
	VMOVSS X1, (R9)(BX*1); \
	ADDQ $4, R9; \
	ADDQ DX, DI; \
	DECQ R8; \
	JMP row1; \
done: \
	VZEROUPPER; \
	RET

// AXPY2ROWS adds the weighted values of two query heads: acc[d] += sum_r
// p[r] * v_r[d] and acc[hd+d] += sum_r p[pstride/4 + r] * v_r[d] for d <
// hd (a multiple of 32), v_r the row at v + r*stride bytes. Each value is
// loaded once for both heads.
#define AXPY2ROWS(LD) \
	MOVQ acc+0(FP), R9; \
	MOVQ p+8(FP), SI; \
	MOVQ pstride+16(FP), R13; \
	ADDQ SI, R13; \
	MOVQ v+24(FP), DI; \
	MOVQ stride+32(FP), DX; \
	MOVQ rows+40(FP), R8; \
	MOVQ hd+48(FP), CX; \
	LEAQ (R9)(CX*4), R14; \
	XORQ AX, AX; \
chunk: \
	CMPQ AX, CX; \
	JGE done; \
	LOAD4(R9, Y0, Y1, Y2, Y3); \
	LOAD4(R14, Y4, Y5, Y6, Y7); \
	MOVQ DI, R10; \
	XORQ BX, BX; \
row: \
	CMPQ BX, R8; \
	JGE store; \
	VBROADCASTSS (SI)(BX*4), Y8; \
	VBROADCASTSS (R13)(BX*4), Y9; \
	LD(0, R10, Y10); \
	LD(1, R10, Y11); \
	LD(2, R10, Y12); \
	LD(3, R10, Y13); \
	VFMADD231PS Y10, Y8, Y0; \
	VFMADD231PS Y11, Y8, Y1; \
	VFMADD231PS Y12, Y8, Y2; \
	VFMADD231PS Y13, Y8, Y3; \
	VFMADD231PS Y10, Y9, Y4; \
	VFMADD231PS Y11, Y9, Y5; \
	VFMADD231PS Y12, Y9, Y6; \
	VFMADD231PS Y13, Y9, Y7; \
	ADDQ DX, R10; \
	INCQ BX; \
	JMP row; \
store: \
	STORE4(R9, Y0, Y1, Y2, Y3); \
	STORE4(R14, Y4, Y5, Y6, Y7); \
	ADDQ $32, AX; \
	JMP chunk; \
done: \
	VZEROUPPER; \
	RET

// func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL eaxArg+0(FP), AX
	MOVL ecxArg+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET

// func xgetbv0() (eax, edx uint32)
TEXT ·xgetbv0(SB), NOSPLIT, $0-8
	MOVL $0, CX
	XGETBV
	MOVL AX, eax+0(FP)
	MOVL DX, edx+4(FP)
	RET

// func dot4xbf16AVX(w *uint16, x *float32, stride uintptr, n int, out *[4]float32)
// out[j] = sum_{i<n} w[i] * x[j*stride/4 + i] for j < 4: one bf16 weight
// row, converted once, against four input rows; n is a multiple of 8.
TEXT ·dot4xbf16AVX(SB), NOSPLIT, $0-40
	MOVQ   w+0(FP), DI
	MOVQ   x+8(FP), SI
	MOVQ   stride+16(FP), DX
	MOVQ   n+24(FP), CX
	MOVQ   out+32(FP), R8
	LEAQ   (SI)(DX*1), R9
	LEAQ   (R9)(DX*1), R10
	LEAQ   (R10)(DX*1), R11
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	XORQ   AX, AX
	MOVQ   CX, BX
	ANDQ   $-16, BX

xloop16:
	CMPQ        AX, BX
	JGE         xtail8
	BF16((DI)(AX*2), Y4)
	BF16(16(DI)(AX*2), Y5)
	VFMADD231PS (SI)(AX*4), Y4, Y0
	VFMADD231PS 32(SI)(AX*4), Y5, Y6
	VFMADD231PS (R9)(AX*4), Y4, Y1
	VFMADD231PS 32(R9)(AX*4), Y5, Y7
	VFMADD231PS (R10)(AX*4), Y4, Y2
	VFMADD231PS 32(R10)(AX*4), Y5, Y8
	VFMADD231PS (R11)(AX*4), Y4, Y3
	VFMADD231PS 32(R11)(AX*4), Y5, Y9
	ADDQ        $16, AX
	JMP         xloop16

xtail8:
	CMPQ        AX, CX
	JGE         xdone
	BF16((DI)(AX*2), Y4)
	VFMADD231PS (SI)(AX*4), Y4, Y0
	VFMADD231PS (R9)(AX*4), Y4, Y1
	VFMADD231PS (R10)(AX*4), Y4, Y2
	VFMADD231PS (R11)(AX*4), Y4, Y3

xdone:
	VADDPS Y6, Y0, Y0
	VADDPS Y7, Y1, Y1
	VADDPS Y8, Y2, Y2
	VADDPS Y9, Y3, Y3
	HSUM(Y0, X0, X4)
	HSUM(Y1, X1, X4)
	HSUM(Y2, X2, X4)
	HSUM(Y3, X3, X4)
	VMOVSS X0, (R8)
	VMOVSS X1, 4(R8)
	VMOVSS X2, 8(R8)
	VMOVSS X3, 12(R8)
	VZEROUPPER
	RET

// func gemm6x16AVX(a *float32, lda int, b *float32, k int, c *float32, ldc int)
// c[i*ldc+j] = sum_{p<k} a[i*lda+p] * b[p*16+j] for i < 6, j < 16.
TEXT ·gemm6x16AVX(SB), NOSPLIT, $0-48
	GEMM6ARGS
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	XORQ AX, AX

gloop:
	CMPQ AX, CX
	JGE  gdone
	VMOVUPS      (DI), Y12
	VMOVUPS      32(DI), Y13
	VBROADCASTSS (SI)(AX*4), Y14
	VFMADD231PS  Y12, Y14, Y0
	VFMADD231PS  Y13, Y14, Y1
	VBROADCASTSS (R9)(AX*4), Y15
	VFMADD231PS  Y12, Y15, Y2
	VFMADD231PS  Y13, Y15, Y3
	VBROADCASTSS (R10)(AX*4), Y14
	VFMADD231PS  Y12, Y14, Y4
	VFMADD231PS  Y13, Y14, Y5
	VBROADCASTSS (R11)(AX*4), Y15
	VFMADD231PS  Y12, Y15, Y6
	VFMADD231PS  Y13, Y15, Y7
	VBROADCASTSS (R12)(AX*4), Y14
	VFMADD231PS  Y12, Y14, Y8
	VFMADD231PS  Y13, Y14, Y9
	VBROADCASTSS (R13)(AX*4), Y15
	VFMADD231PS  Y12, Y15, Y10
	VFMADD231PS  Y13, Y15, Y11
	ADDQ         $64, DI
	INCQ         AX
	JMP          gloop

gdone:
	VMOVUPS Y0, (DX)
	VMOVUPS Y1, 32(DX)
	ADDQ    BX, DX
	VMOVUPS Y2, (DX)
	VMOVUPS Y3, 32(DX)
	ADDQ    BX, DX
	VMOVUPS Y4, (DX)
	VMOVUPS Y5, 32(DX)
	ADDQ    BX, DX
	VMOVUPS Y6, (DX)
	VMOVUPS Y7, 32(DX)
	ADDQ    BX, DX
	VMOVUPS Y8, (DX)
	VMOVUPS Y9, 32(DX)
	ADDQ    BX, DX
	VMOVUPS Y10, (DX)
	VMOVUPS Y11, 32(DX)
	VZEROUPPER
	RET

// GSTEP512 adds b's row at off(DI) times a's elements at column AX + col
// of the six rows to the accumulators c0-c5 (embedded broadcasts; Z12
// scratch).
#define GSTEP512(off, col, c0, c1, c2, c3, c4, c5) \
	VMOVUPS          off(DI), Z12; \
	VFMADD231PS.BCST col(SI)(AX*4), Z12, c0; \
	VFMADD231PS.BCST col(R9)(AX*4), Z12, c1; \
	VFMADD231PS.BCST col(R10)(AX*4), Z12, c2; \
	VFMADD231PS.BCST col(R11)(AX*4), Z12, c3; \
	VFMADD231PS.BCST col(R12)(AX*4), Z12, c4; \
	VFMADD231PS.BCST col(R13)(AX*4), Z12, c5

// func gemm6x16AVX512(a *float32, lda int, b *float32, k int, c *float32, ldc int)
// gemm6x16AVX with a zmm a row of c: six multiply-adds a step of k where
// the AVX2 kernel takes twelve; even and odd steps go to two sets of
// accumulators, added at the end, so that the multiply-adds' latency
// does not bound them.
TEXT ·gemm6x16AVX512(SB), NOSPLIT, $0-48
	GEMM6ARGS
	ZERO4(Z0, Z1, Z2, Z3)
	ZERO4(Z4, Z5, Z6, Z7)
	ZERO4(Z8, Z9, Z10, Z11)
	XORQ AX, AX
	MOVQ CX, R14
	ANDQ $-2, R14

g5pair:
	CMPQ AX, R14
	JGE  g5tail
	GSTEP512(0, 0, Z0, Z1, Z2, Z3, Z4, Z5)
	GSTEP512(64, 4, Z6, Z7, Z8, Z9, Z10, Z11)
	ADDQ $128, DI
	ADDQ $2, AX
	JMP  g5pair

g5tail:
	CMPQ AX, CX
	JGE  g5done
	GSTEP512(0, 0, Z0, Z1, Z2, Z3, Z4, Z5)

g5done:
	VADDPS  Z6, Z0, Z0
	VADDPS  Z7, Z1, Z1
	VADDPS  Z8, Z2, Z2
	VADDPS  Z9, Z3, Z3
	VADDPS  Z10, Z4, Z4
	VADDPS  Z11, Z5, Z5
	VMOVUPS Z0, (DX)
	VMOVUPS Z1, (DX)(BX*1)
	VMOVUPS Z2, (DX)(BX*2)
	LEAQ    (DX)(BX*2), DX
	VMOVUPS Z3, (DX)(BX*1)
	VMOVUPS Z4, (DX)(BX*2)
	LEAQ    (DX)(BX*2), DX
	VMOVUPS Z5, (DX)(BX*1)
	VZEROUPPER
	RET

// The panel packing of 16 weight rows of bf16 or f16 (matmul.go's pack):
// 16 columns of each row widened to float32 into Z0-Z15, transposed in
// registers (32-bit, then 64-bit unpacks within 128-bit lanes, then two
// rounds of lane shuffles) and stored as 16 rows of the panel.

// PACKBF16 loads 16 bf16 of each of the 16 rows from DX on (R8 bytes
// apart) as float32 into Z0-Z15.
#define PACKBF16 \
	VPMOVZXWD (DX), Z0; \
	VPSLLD $16, Z0, Z0; \
	ADDQ R8, DX; \
	VPMOVZXWD (DX), Z1; \
	VPSLLD $16, Z1, Z1; \
	ADDQ R8, DX; \
	VPMOVZXWD (DX), Z2; \
	VPSLLD $16, Z2, Z2; \
	ADDQ R8, DX; \
	VPMOVZXWD (DX), Z3; \
	VPSLLD $16, Z3, Z3; \
	ADDQ R8, DX; \
	VPMOVZXWD (DX), Z4; \
	VPSLLD $16, Z4, Z4; \
	ADDQ R8, DX; \
	VPMOVZXWD (DX), Z5; \
	VPSLLD $16, Z5, Z5; \
	ADDQ R8, DX; \
	VPMOVZXWD (DX), Z6; \
	VPSLLD $16, Z6, Z6; \
	ADDQ R8, DX; \
	VPMOVZXWD (DX), Z7; \
	VPSLLD $16, Z7, Z7; \
	ADDQ R8, DX; \
	VPMOVZXWD (DX), Z8; \
	VPSLLD $16, Z8, Z8; \
	ADDQ R8, DX; \
	VPMOVZXWD (DX), Z9; \
	VPSLLD $16, Z9, Z9; \
	ADDQ R8, DX; \
	VPMOVZXWD (DX), Z10; \
	VPSLLD $16, Z10, Z10; \
	ADDQ R8, DX; \
	VPMOVZXWD (DX), Z11; \
	VPSLLD $16, Z11, Z11; \
	ADDQ R8, DX; \
	VPMOVZXWD (DX), Z12; \
	VPSLLD $16, Z12, Z12; \
	ADDQ R8, DX; \
	VPMOVZXWD (DX), Z13; \
	VPSLLD $16, Z13, Z13; \
	ADDQ R8, DX; \
	VPMOVZXWD (DX), Z14; \
	VPSLLD $16, Z14, Z14; \
	ADDQ R8, DX; \
	VPMOVZXWD (DX), Z15; \
	VPSLLD $16, Z15, Z15
// PACKF16 is PACKBF16 for f16.
#define PACKF16 \
	VCVTPH2PS (DX), Z0; \
	ADDQ R8, DX; \
	VCVTPH2PS (DX), Z1; \
	ADDQ R8, DX; \
	VCVTPH2PS (DX), Z2; \
	ADDQ R8, DX; \
	VCVTPH2PS (DX), Z3; \
	ADDQ R8, DX; \
	VCVTPH2PS (DX), Z4; \
	ADDQ R8, DX; \
	VCVTPH2PS (DX), Z5; \
	ADDQ R8, DX; \
	VCVTPH2PS (DX), Z6; \
	ADDQ R8, DX; \
	VCVTPH2PS (DX), Z7; \
	ADDQ R8, DX; \
	VCVTPH2PS (DX), Z8; \
	ADDQ R8, DX; \
	VCVTPH2PS (DX), Z9; \
	ADDQ R8, DX; \
	VCVTPH2PS (DX), Z10; \
	ADDQ R8, DX; \
	VCVTPH2PS (DX), Z11; \
	ADDQ R8, DX; \
	VCVTPH2PS (DX), Z12; \
	ADDQ R8, DX; \
	VCVTPH2PS (DX), Z13; \
	ADDQ R8, DX; \
	VCVTPH2PS (DX), Z14; \
	ADDQ R8, DX; \
	VCVTPH2PS (DX), Z15
// PACKT16 transposes Z0-Z15 and stores them at DI as the panel's 16 rows
// of 16 (Z16-Z31 scratch).
#define PACKT16 \
	VUNPCKLPS Z1, Z0, Z16; \
	VUNPCKHPS Z1, Z0, Z17; \
	VUNPCKLPS Z3, Z2, Z18; \
	VUNPCKHPS Z3, Z2, Z19; \
	VUNPCKLPS Z5, Z4, Z20; \
	VUNPCKHPS Z5, Z4, Z21; \
	VUNPCKLPS Z7, Z6, Z22; \
	VUNPCKHPS Z7, Z6, Z23; \
	VUNPCKLPS Z9, Z8, Z24; \
	VUNPCKHPS Z9, Z8, Z25; \
	VUNPCKLPS Z11, Z10, Z26; \
	VUNPCKHPS Z11, Z10, Z27; \
	VUNPCKLPS Z13, Z12, Z28; \
	VUNPCKHPS Z13, Z12, Z29; \
	VUNPCKLPS Z15, Z14, Z30; \
	VUNPCKHPS Z15, Z14, Z31; \
	VUNPCKLPD Z18, Z16, Z0; \
	VUNPCKHPD Z18, Z16, Z1; \
	VUNPCKLPD Z19, Z17, Z2; \
	VUNPCKHPD Z19, Z17, Z3; \
	VUNPCKLPD Z22, Z20, Z4; \
	VUNPCKHPD Z22, Z20, Z5; \
	VUNPCKLPD Z23, Z21, Z6; \
	VUNPCKHPD Z23, Z21, Z7; \
	VUNPCKLPD Z26, Z24, Z8; \
	VUNPCKHPD Z26, Z24, Z9; \
	VUNPCKLPD Z27, Z25, Z10; \
	VUNPCKHPD Z27, Z25, Z11; \
	VUNPCKLPD Z30, Z28, Z12; \
	VUNPCKHPD Z30, Z28, Z13; \
	VUNPCKLPD Z31, Z29, Z14; \
	VUNPCKHPD Z31, Z29, Z15; \
	VSHUFF32X4 $0x44, Z4, Z0, Z16; \
	VSHUFF32X4 $0xee, Z4, Z0, Z20; \
	VSHUFF32X4 $0x44, Z12, Z8, Z24; \
	VSHUFF32X4 $0xee, Z12, Z8, Z28; \
	VSHUFF32X4 $0x44, Z5, Z1, Z17; \
	VSHUFF32X4 $0xee, Z5, Z1, Z21; \
	VSHUFF32X4 $0x44, Z13, Z9, Z25; \
	VSHUFF32X4 $0xee, Z13, Z9, Z29; \
	VSHUFF32X4 $0x44, Z6, Z2, Z18; \
	VSHUFF32X4 $0xee, Z6, Z2, Z22; \
	VSHUFF32X4 $0x44, Z14, Z10, Z26; \
	VSHUFF32X4 $0xee, Z14, Z10, Z30; \
	VSHUFF32X4 $0x44, Z7, Z3, Z19; \
	VSHUFF32X4 $0xee, Z7, Z3, Z23; \
	VSHUFF32X4 $0x44, Z15, Z11, Z27; \
	VSHUFF32X4 $0xee, Z15, Z11, Z31; \
	VSHUFF32X4 $0x88, Z24, Z16, Z0; \
	VSHUFF32X4 $0xdd, Z24, Z16, Z4; \
	VSHUFF32X4 $0x88, Z28, Z20, Z8; \
	VSHUFF32X4 $0xdd, Z28, Z20, Z12; \
	VSHUFF32X4 $0x88, Z25, Z17, Z1; \
	VSHUFF32X4 $0xdd, Z25, Z17, Z5; \
	VSHUFF32X4 $0x88, Z29, Z21, Z9; \
	VSHUFF32X4 $0xdd, Z29, Z21, Z13; \
	VSHUFF32X4 $0x88, Z26, Z18, Z2; \
	VSHUFF32X4 $0xdd, Z26, Z18, Z6; \
	VSHUFF32X4 $0x88, Z30, Z22, Z10; \
	VSHUFF32X4 $0xdd, Z30, Z22, Z14; \
	VSHUFF32X4 $0x88, Z27, Z19, Z3; \
	VSHUFF32X4 $0xdd, Z27, Z19, Z7; \
	VSHUFF32X4 $0x88, Z31, Z23, Z11; \
	VSHUFF32X4 $0xdd, Z31, Z23, Z15; \
	VMOVUPS Z0, 0(DI); \
	VMOVUPS Z1, 64(DI); \
	VMOVUPS Z2, 128(DI); \
	VMOVUPS Z3, 192(DI); \
	VMOVUPS Z4, 256(DI); \
	VMOVUPS Z5, 320(DI); \
	VMOVUPS Z6, 384(DI); \
	VMOVUPS Z7, 448(DI); \
	VMOVUPS Z8, 512(DI); \
	VMOVUPS Z9, 576(DI); \
	VMOVUPS Z10, 640(DI); \
	VMOVUPS Z11, 704(DI); \
	VMOVUPS Z12, 768(DI); \
	VMOVUPS Z13, 832(DI); \
	VMOVUPS Z14, 896(DI); \
	VMOVUPS Z15, 960(DI)

// func packBF16AVX512(w *uint16, k int, n int, dst *float32)
// dst[p*16+j] = w[j*k+p] as float32 for j < 16, p < n (n a multiple of 16).
TEXT ·packBF16AVX512(SB), NOSPLIT, $0-32
	MOVQ w+0(FP), SI
	MOVQ k+8(FP), R8
	SHLQ $1, R8
	MOVQ n+16(FP), CX
	MOVQ dst+24(FP), DI

pbloop:
	TESTQ CX, CX
	JZ    pbdone
	MOVQ  SI, DX
	PACKBF16
	PACKT16
	ADDQ  $32, SI
	ADDQ  $1024, DI
	SUBQ  $16, CX
	JMP   pbloop

pbdone:
	VZEROUPPER
	RET

// func packF16AVX512(w *uint16, k int, n int, dst *float32)
// packBF16AVX512 for f16 weights.
TEXT ·packF16AVX512(SB), NOSPLIT, $0-32
	MOVQ w+0(FP), SI
	MOVQ k+8(FP), R8
	SHLQ $1, R8
	MOVQ n+16(FP), CX
	MOVQ dst+24(FP), DI

phloop:
	TESTQ CX, CX
	JZ    phdone
	MOVQ  SI, DX
	PACKF16
	PACKT16
	ADDQ  $32, SI
	ADDQ  $1024, DI
	SUBQ  $16, CX
	JMP   phloop

phdone:
	VZEROUPPER
	RET

// func dotAVX(x, y *float32, n int) float32
// sum_{i<n} x[i]*y[i]; n is a multiple of 8.
TEXT ·dotAVX(SB), NOSPLIT, $0-28
	MOVQ x+0(FP), SI
	MOVQ y+8(FP), DI
	MOVQ n+16(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	XORQ AX, AX
	MOVQ CX, BX
	ANDQ $-16, BX

dloop16:
	CMPQ AX, BX
	JGE  dtail
	VMOVUPS     (SI)(AX*4), Y2
	VMOVUPS     32(SI)(AX*4), Y3
	VFMADD231PS (DI)(AX*4), Y2, Y0
	VFMADD231PS 32(DI)(AX*4), Y3, Y1
	ADDQ        $16, AX
	JMP         dloop16

dtail:
	CMPQ AX, CX
	JGE  ddone
	VMOVUPS     (SI)(AX*4), Y2
	VFMADD231PS (DI)(AX*4), Y2, Y0

ddone:
	VADDPS Y1, Y0, Y0
	HSUM(Y0, X0, X2)
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// func dotbf16AVX(x *float32, w *uint16, n int) float32
// sum_{i<n} x[i]*w[i]; n is a multiple of 8. Four accumulators hide the FMA
// latency: this is the GEMV kernel, streaming weights from memory (software
// prefetching made it slower: the hardware prefetcher does better alone).
TEXT ·dotbf16AVX(SB), NOSPLIT, $0-28
	MOVQ   x+0(FP), SI
	MOVQ   w+8(FP), DI
	MOVQ   n+16(FP), CX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	XORQ   AX, AX
	MOVQ   CX, BX
	ANDQ   $-32, BX

bloop32:
	CMPQ        AX, BX
	JGE         bloop
	VMOVUPS     (SI)(AX*4), Y2
	BF16((DI)(AX*2), Y3)
	VFMADD231PS Y3, Y2, Y0
	VMOVUPS     32(SI)(AX*4), Y4
	BF16(16(DI)(AX*2), Y5)
	VFMADD231PS Y5, Y4, Y1
	VMOVUPS     64(SI)(AX*4), Y2
	BF16(32(DI)(AX*2), Y3)
	VFMADD231PS Y3, Y2, Y6
	VMOVUPS     96(SI)(AX*4), Y4
	BF16(48(DI)(AX*2), Y5)
	VFMADD231PS Y5, Y4, Y7
	ADDQ        $32, AX
	JMP         bloop32

bloop:
	CMPQ        AX, CX
	JGE         bdone
	VMOVUPS     (SI)(AX*4), Y2
	BF16((DI)(AX*2), Y3)
	VFMADD231PS Y3, Y2, Y0
	ADDQ        $8, AX
	JMP         bloop

bdone:
	VADDPS Y1, Y0, Y0
	VADDPS Y7, Y6, Y6
	VADDPS Y6, Y0, Y0
	HSUM(Y0, X0, X2)
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// func axpyAVX(y, x *float32, a float32, n int)
// y[i] += a*x[i] for i < n; n is a multiple of 8.
TEXT ·axpyAVX(SB), NOSPLIT, $0-32
	MOVQ         y+0(FP), DI
	MOVQ         x+8(FP), SI
	VBROADCASTSS a+16(FP), Y0
	MOVQ         n+24(FP), CX
	XORQ         AX, AX

aloop:
	CMPQ        AX, CX
	JGE         adone
	VMOVUPS     (DI)(AX*4), Y1
	VFMADD231PS (SI)(AX*4), Y0, Y1
	VMOVUPS     Y1, (DI)(AX*4)
	ADDQ        $8, AX
	JMP         aloop

adone:
	VZEROUPPER
	RET

// func axpybf16AVX(y *float32, x *uint16, a float32, n int)
// y[i] += a*x[i] for i < n; n is a multiple of 8.
TEXT ·axpybf16AVX(SB), NOSPLIT, $0-32
	MOVQ         y+0(FP), DI
	MOVQ         x+8(FP), SI
	VBROADCASTSS a+16(FP), Y0
	MOVQ         n+24(FP), CX
	XORQ         AX, AX

abloop:
	CMPQ        AX, CX
	JGE         abdone
	VMOVUPS     (DI)(AX*4), Y1
	BF16((SI)(AX*2), Y2)
	VFMADD231PS Y2, Y0, Y1
	VMOVUPS     Y1, (DI)(AX*4)
	ADDQ        $8, AX
	JMP         abloop

abdone:
	VZEROUPPER
	RET

// func dotRowsF32AVX(q *float32, k *float32, stride uintptr, rows int, hd int, out *float32)
TEXT ·dotRowsF32AVX(SB), NOSPLIT, $0-48
	DOTROWS(LDF32)

// func dotRowsBF16AVX(q *float32, k *uint16, stride uintptr, rows int, hd int, out *float32)
TEXT ·dotRowsBF16AVX(SB), NOSPLIT, $0-48
	DOTROWS(LDBF16)

// func axpyRowsF32AVX(acc *float32, p *float32, v *float32, stride uintptr, rows int, hd int)
TEXT ·axpyRowsF32AVX(SB), NOSPLIT, $0-48
	AXPYROWS(LDF32)

// func axpyRowsBF16AVX(acc *float32, p *float32, v *uint16, stride uintptr, rows int, hd int)
TEXT ·axpyRowsBF16AVX(SB), NOSPLIT, $0-48
	AXPYROWS(LDBF16)

// func scaleAxpyAVX(y, x *float32, b, a float32, n int)
// y[i] = b*y[i] + a*x[i] for i < n; n is a multiple of 8.
TEXT ·scaleAxpyAVX(SB), NOSPLIT, $0-32
	MOVQ         y+0(FP), DI
	MOVQ         x+8(FP), SI
	VBROADCASTSS b+16(FP), Y0
	VBROADCASTSS a+20(FP), Y1
	MOVQ         n+24(FP), CX
	XORQ         AX, AX

sloop:
	CMPQ        AX, CX
	JGE         sdone
	VMULPS      (DI)(AX*4), Y0, Y2
	VFMADD231PS (SI)(AX*4), Y1, Y2
	VMOVUPS     Y2, (DI)(AX*4)
	ADDQ        $8, AX
	JMP         sloop

sdone:
	VZEROUPPER
	RET

// func expShiftAVX(x *float32, n int, m float32) float32
// x[i] = exp(x[i] - m) for i < n (a multiple of 8), returning their sum:
// the exponentials of a softmax, with expf's polynomial (arguments below
// -87.3 give exp(-87.3) instead of less: nothing next to the max's 1).
TEXT ·expShiftAVX(SB), NOSPLIT, $0-28
	MOVQ         x+0(FP), DI
	MOVQ         n+8(FP), CX
	VBROADCASTSS m+16(FP), Y15
	MOVL         $0xc2ae999a, AX // -87.3
	VMOVD        AX, X14
	VBROADCASTSS X14, Y14
	MOVL         $0x3fb8aa3b, AX // log2(e)
	VMOVD        AX, X13
	VBROADCASTSS X13, Y13
	MOVL         $0x3f318000, AX // 0.693359375
	VMOVD        AX, X12
	VBROADCASTSS X12, Y12
	MOVL         $0x395e8083, AX // 2.12194440e-4
	VMOVD        AX, X11
	VBROADCASTSS X11, Y11
	MOVL         $0x3f800000, AX // 1
	VMOVD        AX, X10
	VBROADCASTSS X10, Y10
	VXORPS       Y9, Y9, Y9      // sum
	XORQ         AX, AX

eloop:
	CMPQ   AX, CX
	JGE    edone
	VMOVUPS (DI)(AX*4), Y0
	VSUBPS  Y15, Y0, Y0
	VMAXPS  Y14, Y0, Y0          // v
	VMULPS  Y13, Y0, Y1
	VROUNDPS $0, Y1, Y1          // n = round(v / ln2)
	VFNMADD231PS Y12, Y1, Y0     // r = v - n*C1
	VFMADD231PS  Y11, Y1, Y0     // r += n*C2
	MOVL         $0x39506967, DX // 1.9875691500e-4
	VMOVD        DX, X2
	VBROADCASTSS X2, Y2
	MOVL         $0x3ab743ce, DX // 1.3981999507e-3
	VMOVD        DX, X3
	VBROADCASTSS X3, Y3
	VFMADD213PS  Y3, Y0, Y2      // p = p*r + c
	MOVL         $0x3c088908, DX // 8.3334519073e-3
	VMOVD        DX, X3
	VBROADCASTSS X3, Y3
	VFMADD213PS  Y3, Y0, Y2
	MOVL         $0x3d2aa9c1, DX // 4.1665795894e-2
	VMOVD        DX, X3
	VBROADCASTSS X3, Y3
	VFMADD213PS  Y3, Y0, Y2
	MOVL         $0x3e2aaaaa, DX // 1.6666665459e-1
	VMOVD        DX, X3
	VBROADCASTSS X3, Y3
	VFMADD213PS  Y3, Y0, Y2
	MOVL         $0x3f000000, DX // 5.0000001201e-1
	VMOVD        DX, X3
	VBROADCASTSS X3, Y3
	VFMADD213PS  Y3, Y0, Y2
	VMULPS       Y0, Y0, Y4      // r*r
	VADDPS       Y10, Y0, Y5     // r + 1
	VFMADD231PS  Y4, Y2, Y5      // y = p*r*r + r + 1
	VCVTPS2DQ    Y1, Y6
	VPSLLD       $23, Y6, Y6
	VPADDD       Y10, Y6, Y6     // 2^n: n added to the exponent of 1.0
	VMULPS       Y6, Y5, Y5
	VMOVUPS      Y5, (DI)(AX*4)
	VADDPS       Y5, Y9, Y9
	ADDQ         $8, AX
	JMP          eloop

edone:
	HSUM(Y9, X9, X0)
	VMOVSS X9, ret+24(FP)
	VZEROUPPER
	RET

// func sumSquaresAVX(x *float32, n int) float64
// Returns sum x[i]^2 in float64 (the squares are exact there); n is a
// multiple of 16.
TEXT ·sumSquaresAVX(SB), NOSPLIT, $0-24
	MOVQ   x+0(FP), SI
	MOVQ   n+8(FP), CX
	VXORPD Y0, Y0, Y0
	VXORPD Y1, Y1, Y1
	VXORPD Y2, Y2, Y2
	VXORPD Y3, Y3, Y3
	XORQ   AX, AX

sqloop:
	CMPQ        AX, CX
	JGE         sqdone
	VCVTPS2PD   (SI)(AX*4), Y4
	VCVTPS2PD   16(SI)(AX*4), Y5
	VCVTPS2PD   32(SI)(AX*4), Y6
	VCVTPS2PD   48(SI)(AX*4), Y7
	VFMADD231PD Y4, Y4, Y0
	VFMADD231PD Y5, Y5, Y1
	VFMADD231PD Y6, Y6, Y2
	VFMADD231PD Y7, Y7, Y3
	ADDQ        $16, AX
	JMP         sqloop

sqdone:
	VADDPD       Y1, Y0, Y0
	VADDPD       Y3, Y2, Y2
	VADDPD       Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPD       X1, X0, X0
	VHADDPD      X0, X0, X0
	VMOVSD       X0, ret+16(FP)
	VZEROUPPER
	RET

// func scaleMulAVX(dst, x, w *float32, s float32, n int)
// dst[i] = x[i] * s * w[i], rounded after each product as the Go loop is;
// n is a multiple of 8.
TEXT ·scaleMulAVX(SB), NOSPLIT, $0-40
	MOVQ         dst+0(FP), DI
	MOVQ         x+8(FP), SI
	MOVQ         w+16(FP), DX
	VBROADCASTSS s+24(FP), Y15
	MOVQ         n+32(FP), CX
	XORQ         AX, AX

smloop:
	CMPQ    AX, CX
	JGE     smdone
	VMOVUPS (SI)(AX*4), Y0
	VMULPS  Y15, Y0, Y0
	VMULPS  (DX)(AX*4), Y0, Y0
	VMOVUPS Y0, (DI)(AX*4)
	ADDQ    $8, AX
	JMP     smloop

smdone:
	VZEROUPPER
	RET

// CONST broadcasts the float32 with bits V into ymm register R.
#define CONST(V, R) \
	MOVL         V, AX; \
	VMOVD        AX, X0; \
	VBROADCASTSS X0, R

// func siluMulAVX(out, gate, up *float32, n int)
// out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + exp(-x)) with exp as
// expShiftAVX computes it (its argument clamped to [-87.3, 88]); n is a
// multiple of 8.
TEXT ·siluMulAVX(SB), NOSPLIT, $0-32
	CONST($0xc2ae999a, Y15) // -87.3
	CONST($0x42b00000, Y14) // 88
	CONST($0x3fb8aa3b, Y13) // log2(e)
	CONST($0x3f318000, Y12) // 0.693359375
	CONST($0x395e8083, Y11) // 2.12194440e-4
	CONST($0x3f800000, Y10) // 1
	CONST($0x39506967, Y9)  // 1.9875691500e-4
	CONST($0x3ab743ce, Y8)  // 1.3981999507e-3
	CONST($0x3c088908, Y7)  // 8.3334519073e-3
	CONST($0x3d2aa9c1, Y6)  // 4.1665795894e-2
	CONST($0x3e2aaaaa, Y5)  // 1.6666665459e-1
	MOVQ out+0(FP), DI
	MOVQ gate+8(FP), SI
	MOVQ up+16(FP), DX
	MOVQ n+24(FP), CX
	XORQ AX, AX

siloop:
	CMPQ         AX, CX
	JGE          sidone
	VMOVUPS      (SI)(AX*4), Y4      // g
	VXORPS       Y0, Y0, Y0
	VSUBPS       Y4, Y0, Y0          // v = -g
	VMAXPS       Y15, Y0, Y0
	VMINPS       Y14, Y0, Y0
	VMULPS       Y13, Y0, Y1
	VROUNDPS     $0, Y1, Y1          // n = round(v / ln2)
	VFNMADD231PS Y12, Y1, Y0         // r = v - n*C1
	VFMADD231PS  Y11, Y1, Y0         // r += n*C2
	VMOVAPS      Y9, Y2
	VFMADD213PS  Y8, Y0, Y2          // p = p*r + c
	VFMADD213PS  Y7, Y0, Y2
	VFMADD213PS  Y6, Y0, Y2
	VFMADD213PS  Y5, Y0, Y2
	MOVL         $0x3f000000, BX     // 5.0000001201e-1
	VMOVD        BX, X3
	VBROADCASTSS X3, Y3
	VFMADD213PS  Y3, Y0, Y2
	VMULPS       Y0, Y0, Y3          // r*r
	VADDPS       Y10, Y0, Y0         // r + 1
	VFMADD231PS  Y3, Y2, Y0          // e = p*r*r + r + 1
	VCVTPS2DQ    Y1, Y1
	VPSLLD       $23, Y1, Y1
	VPADDD       Y10, Y1, Y1         // 2^n: n added to the exponent of 1.0
	VMULPS       Y1, Y0, Y0          // exp(-g)
	VADDPS       Y10, Y0, Y0
	VDIVPS       Y0, Y10, Y0         // sigmoid(g) = 1 / (1 + exp(-g))
	VMULPS       Y4, Y0, Y0          // silu(g)
	VMULPS       (DX)(AX*4), Y0, Y0
	VMOVUPS      Y0, (DI)(AX*4)
	ADDQ         $8, AX
	JMP          siloop

sidone:
	VZEROUPPER
	RET

// func dot2RowsF32AVX(q *float32, k *float32, stride uintptr, rows int, hd int, scale float32, out *float32, ostride uintptr)
TEXT ·dot2RowsF32AVX(SB), NOSPLIT, $0-64
	DOT2ROWS(LDF32)

// func dot2RowsBF16AVX(q *float32, k *uint16, stride uintptr, rows int, hd int, scale float32, out *float32, ostride uintptr)
TEXT ·dot2RowsBF16AVX(SB), NOSPLIT, $0-64
	DOT2ROWS(LDBF16)

// func axpy2RowsF32AVX(acc *float32, p *float32, pstride uintptr, v *float32, stride uintptr, rows int, hd int)
TEXT ·axpy2RowsF32AVX(SB), NOSPLIT, $0-56
	AXPY2ROWS(LDF32)

// func axpy2RowsBF16AVX(acc *float32, p *float32, pstride uintptr, v *uint16, stride uintptr, rows int, hd int)
TEXT ·axpy2RowsBF16AVX(SB), NOSPLIT, $0-56
	AXPY2ROWS(LDBF16)

// func maxAVX(x *float32, n int) float32
// Returns the largest of x[0:n] (n a positive multiple of 32); see maxF32Go.
TEXT ·maxAVX(SB), NOSPLIT, $0-20
	MOVQ    x+0(FP), SI
	MOVQ    n+8(FP), CX
	VMOVUPS (SI), Y0
	VMOVAPS Y0, Y1
	VMOVAPS Y0, Y2
	VMOVAPS Y0, Y3
	XORQ    AX, AX

mxloop:
	CMPQ   AX, CX
	JGE    mxdone
	VMAXPS (SI)(AX*4), Y0, Y0
	VMAXPS 32(SI)(AX*4), Y1, Y1
	VMAXPS 64(SI)(AX*4), Y2, Y2
	VMAXPS 96(SI)(AX*4), Y3, Y3
	ADDQ   $32, AX
	JMP    mxloop

mxdone:
	VMAXPS       Y1, Y0, Y0
	VMAXPS       Y3, Y2, Y2
	VMAXPS       Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VMAXPS       X1, X0, X0
	VPERMILPS    $0x4e, X0, X1
	VMAXPS       X1, X0, X0
	VPERMILPS    $0xb1, X0, X1
	VMAXPS       X1, X0, X0
	VMOVSS       X0, ret+16(FP)
	VZEROUPPER
	RET
