//go:build amd64 && !purego

#include "textflag.h"

// maskTable<>+4*(8-r) holds eight dwords whose first r are all ones: the
// lane mask of a row tail of r < 8 elements for VMASKMOVPS.
DATA maskTable<>+0(SB)/4, $0xffffffff
DATA maskTable<>+4(SB)/4, $0xffffffff
DATA maskTable<>+8(SB)/4, $0xffffffff
DATA maskTable<>+12(SB)/4, $0xffffffff
DATA maskTable<>+16(SB)/4, $0xffffffff
DATA maskTable<>+20(SB)/4, $0xffffffff
DATA maskTable<>+24(SB)/4, $0xffffffff
DATA maskTable<>+28(SB)/4, $0xffffffff
DATA maskTable<>+32(SB)/4, $0
DATA maskTable<>+36(SB)/4, $0
DATA maskTable<>+40(SB)/4, $0
DATA maskTable<>+44(SB)/4, $0
DATA maskTable<>+48(SB)/4, $0
DATA maskTable<>+52(SB)/4, $0
DATA maskTable<>+56(SB)/4, $0
DATA maskTable<>+60(SB)/4, $0
GLOBL maskTable<>(SB), RODATA|NOPTR, $64

// HSUM leaves in the low lane of X(r) the sum of the eight lanes of Y(r):
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)); X14 is clobbered.
#define HSUM(Y, X) \
	VEXTRACTF128 $1, Y, X14 \
	VADDPS       X14, X, X \
	VMOVHLPS     X, X, X14 \
	VADDPS       X14, X, X \
	VMOVSHDUP    X, X14 \
	VADDSS       X14, X, X

// STORE1 stores (or, when acc, adds) the low lane of X at addr.
#define STORE1(X, addr) \
	CMPB   acc+56(FP), $0 \
	JEQ    2(PC) \
	VADDSS addr, X, X \
	VMOVSS X, addr

// func nn4AVX(k, n int, a *float32, ars, acs int, b *float32, ldb int, c *float32, ldc int, acc bool)
//
// Registers: SI = A(0,0); R8 = ars, R12 = 3*ars, R9 = acs (bytes);
// DI = B(0,j) and BX = C(0,j) of the current column block; R10 = ldb,
// R11 = ldc (bytes); DX = columns left; AX = k counter; R13 = A(0,l);
// CX = B(l,j). Y0..Y7 accumulate, Y8..Y9 hold B, Y10 A, Y11..Y14 products,
// Y15 the tail mask.
TEXT ·nn4AVX(SB), NOSPLIT, $0-73
	MOVQ n+8(FP), DX
	MOVQ a+16(FP), SI
	MOVQ ars+24(FP), R8
	SHLQ $2, R8
	LEAQ (R8)(R8*2), R12
	MOVQ acs+32(FP), R9
	SHLQ $2, R9
	MOVQ b+40(FP), DI
	MOVQ ldb+48(FP), R10
	SHLQ $2, R10
	MOVQ c+56(FP), BX
	MOVQ ldc+64(FP), R11
	SHLQ $2, R11

block16:
	CMPQ DX, $16
	JLT  block8
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	MOVQ   k+0(FP), AX
	MOVQ   SI, R13
	MOVQ   DI, CX

loop16:
	VMOVUPS      (CX), Y8
	VMOVUPS      32(CX), Y9
	VBROADCASTSS (R13), Y10
	VMULPS       Y8, Y10, Y11
	VMULPS       Y9, Y10, Y12
	VADDPS       Y11, Y0, Y0
	VADDPS       Y12, Y1, Y1
	VBROADCASTSS (R13)(R8*1), Y10
	VMULPS       Y8, Y10, Y13
	VMULPS       Y9, Y10, Y14
	VADDPS       Y13, Y2, Y2
	VADDPS       Y14, Y3, Y3
	VBROADCASTSS (R13)(R8*2), Y10
	VMULPS       Y8, Y10, Y11
	VMULPS       Y9, Y10, Y12
	VADDPS       Y11, Y4, Y4
	VADDPS       Y12, Y5, Y5
	VBROADCASTSS (R13)(R12*1), Y10
	VMULPS       Y8, Y10, Y13
	VMULPS       Y9, Y10, Y14
	VADDPS       Y13, Y6, Y6
	VADDPS       Y14, Y7, Y7
	ADDQ         R9, R13
	ADDQ         R10, CX
	DECQ         AX
	JNZ          loop16

	LEAQ (R11)(R11*2), R13
	CMPB acc+72(FP), $0
	JEQ  store16
	VADDPS (BX), Y0, Y0
	VADDPS 32(BX), Y1, Y1
	VADDPS (BX)(R11*1), Y2, Y2
	VADDPS 32(BX)(R11*1), Y3, Y3
	VADDPS (BX)(R11*2), Y4, Y4
	VADDPS 32(BX)(R11*2), Y5, Y5
	VADDPS (BX)(R13*1), Y6, Y6
	VADDPS 32(BX)(R13*1), Y7, Y7

store16:
	VMOVUPS Y0, (BX)
	VMOVUPS Y1, 32(BX)
	VMOVUPS Y2, (BX)(R11*1)
	VMOVUPS Y3, 32(BX)(R11*1)
	VMOVUPS Y4, (BX)(R11*2)
	VMOVUPS Y5, 32(BX)(R11*2)
	VMOVUPS Y6, (BX)(R13*1)
	VMOVUPS Y7, 32(BX)(R13*1)
	ADDQ    $64, DI
	ADDQ    $64, BX
	SUBQ    $16, DX
	JMP     block16

block8:
	CMPQ DX, $8
	JLT  tail
	VXORPS Y0, Y0, Y0
	VXORPS Y2, Y2, Y2
	VXORPS Y4, Y4, Y4
	VXORPS Y6, Y6, Y6
	MOVQ   k+0(FP), AX
	MOVQ   SI, R13
	MOVQ   DI, CX

loop8:
	VMOVUPS      (CX), Y8
	VBROADCASTSS (R13), Y10
	VMULPS       Y8, Y10, Y11
	VADDPS       Y11, Y0, Y0
	VBROADCASTSS (R13)(R8*1), Y10
	VMULPS       Y8, Y10, Y12
	VADDPS       Y12, Y2, Y2
	VBROADCASTSS (R13)(R8*2), Y10
	VMULPS       Y8, Y10, Y13
	VADDPS       Y13, Y4, Y4
	VBROADCASTSS (R13)(R12*1), Y10
	VMULPS       Y8, Y10, Y14
	VADDPS       Y14, Y6, Y6
	ADDQ         R9, R13
	ADDQ         R10, CX
	DECQ         AX
	JNZ          loop8

	LEAQ (R11)(R11*2), R13
	CMPB acc+72(FP), $0
	JEQ  store8
	VADDPS (BX), Y0, Y0
	VADDPS (BX)(R11*1), Y2, Y2
	VADDPS (BX)(R11*2), Y4, Y4
	VADDPS (BX)(R13*1), Y6, Y6

store8:
	VMOVUPS Y0, (BX)
	VMOVUPS Y2, (BX)(R11*1)
	VMOVUPS Y4, (BX)(R11*2)
	VMOVUPS Y6, (BX)(R13*1)
	ADDQ    $32, DI
	ADDQ    $32, BX
	SUBQ    $8, DX

tail:
	TESTQ DX, DX
	JEQ   done
	MOVQ  $8, AX
	SUBQ  DX, AX
	LEAQ  maskTable<>(SB), CX
	VMOVUPS (CX)(AX*4), Y15
	VXORPS Y0, Y0, Y0
	VXORPS Y2, Y2, Y2
	VXORPS Y4, Y4, Y4
	VXORPS Y6, Y6, Y6
	MOVQ   k+0(FP), AX
	MOVQ   SI, R13
	MOVQ   DI, CX

looptail:
	VMASKMOVPS   (CX), Y15, Y8
	VBROADCASTSS (R13), Y10
	VMULPS       Y8, Y10, Y11
	VADDPS       Y11, Y0, Y0
	VBROADCASTSS (R13)(R8*1), Y10
	VMULPS       Y8, Y10, Y12
	VADDPS       Y12, Y2, Y2
	VBROADCASTSS (R13)(R8*2), Y10
	VMULPS       Y8, Y10, Y13
	VADDPS       Y13, Y4, Y4
	VBROADCASTSS (R13)(R12*1), Y10
	VMULPS       Y8, Y10, Y14
	VADDPS       Y14, Y6, Y6
	ADDQ         R9, R13
	ADDQ         R10, CX
	DECQ         AX
	JNZ          looptail

	LEAQ (R11)(R11*2), R13
	CMPB acc+72(FP), $0
	JEQ  storetail
	VMASKMOVPS (BX), Y15, Y8
	VADDPS     Y8, Y0, Y0
	VMASKMOVPS (BX)(R11*1), Y15, Y8
	VADDPS     Y8, Y2, Y2
	VMASKMOVPS (BX)(R11*2), Y15, Y8
	VADDPS     Y8, Y4, Y4
	VMASKMOVPS (BX)(R13*1), Y15, Y8
	VADDPS     Y8, Y6, Y6

storetail:
	VMASKMOVPS Y0, Y15, (BX)
	VMASKMOVPS Y2, Y15, (BX)(R11*1)
	VMASKMOVPS Y4, Y15, (BX)(R11*2)
	VMASKMOVPS Y6, Y15, (BX)(R13*1)

done:
	VZEROUPPER
	RET

// func nn4RowsAVX(k, n int, a *float32, ars, acs int, b *float32, rows *int, c *float32, ldc int, acc bool)
//
// nn4AVX with B(l, j) = b[rows[l] + j]: the same registers, except R10 =
// rows, AX = l (counting up), CX = b + 4*(rows[l] + j).
// (The AVX code of both is the same otherwise.)
TEXT ·nn4RowsAVX(SB), NOSPLIT, $0-73
	MOVQ n+8(FP), DX
	MOVQ a+16(FP), SI
	MOVQ ars+24(FP), R8
	SHLQ $2, R8
	LEAQ (R8)(R8*2), R12
	MOVQ acs+32(FP), R9
	SHLQ $2, R9
	MOVQ b+40(FP), DI
	MOVQ rows+48(FP), R10
	MOVQ c+56(FP), BX
	MOVQ ldc+64(FP), R11
	SHLQ $2, R11

rblock16:
	CMPQ DX, $16
	JLT  rblock8
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7
	XORQ   AX, AX
	MOVQ   SI, R13

rloop16:
	MOVQ         (R10)(AX*8), CX
	LEAQ         (DI)(CX*4), CX
	VMOVUPS      (CX), Y8
	VMOVUPS      32(CX), Y9
	VBROADCASTSS (R13), Y10
	VMULPS       Y8, Y10, Y11
	VMULPS       Y9, Y10, Y12
	VADDPS       Y11, Y0, Y0
	VADDPS       Y12, Y1, Y1
	VBROADCASTSS (R13)(R8*1), Y10
	VMULPS       Y8, Y10, Y13
	VMULPS       Y9, Y10, Y14
	VADDPS       Y13, Y2, Y2
	VADDPS       Y14, Y3, Y3
	VBROADCASTSS (R13)(R8*2), Y10
	VMULPS       Y8, Y10, Y11
	VMULPS       Y9, Y10, Y12
	VADDPS       Y11, Y4, Y4
	VADDPS       Y12, Y5, Y5
	VBROADCASTSS (R13)(R12*1), Y10
	VMULPS       Y8, Y10, Y13
	VMULPS       Y9, Y10, Y14
	VADDPS       Y13, Y6, Y6
	VADDPS       Y14, Y7, Y7
	ADDQ         R9, R13
	INCQ         AX
	CMPQ         AX, k+0(FP)
	JLT          rloop16

	LEAQ (R11)(R11*2), R13
	CMPB acc+72(FP), $0
	JEQ  rstore16
	VADDPS (BX), Y0, Y0
	VADDPS 32(BX), Y1, Y1
	VADDPS (BX)(R11*1), Y2, Y2
	VADDPS 32(BX)(R11*1), Y3, Y3
	VADDPS (BX)(R11*2), Y4, Y4
	VADDPS 32(BX)(R11*2), Y5, Y5
	VADDPS (BX)(R13*1), Y6, Y6
	VADDPS 32(BX)(R13*1), Y7, Y7

rstore16:
	VMOVUPS Y0, (BX)
	VMOVUPS Y1, 32(BX)
	VMOVUPS Y2, (BX)(R11*1)
	VMOVUPS Y3, 32(BX)(R11*1)
	VMOVUPS Y4, (BX)(R11*2)
	VMOVUPS Y5, 32(BX)(R11*2)
	VMOVUPS Y6, (BX)(R13*1)
	VMOVUPS Y7, 32(BX)(R13*1)
	ADDQ    $64, DI
	ADDQ    $64, BX
	SUBQ    $16, DX
	JMP     rblock16

rblock8:
	CMPQ DX, $8
	JLT  rtail
	VXORPS Y0, Y0, Y0
	VXORPS Y2, Y2, Y2
	VXORPS Y4, Y4, Y4
	VXORPS Y6, Y6, Y6
	XORQ   AX, AX
	MOVQ   SI, R13

rloop8:
	MOVQ         (R10)(AX*8), CX
	LEAQ         (DI)(CX*4), CX
	VMOVUPS      (CX), Y8
	VBROADCASTSS (R13), Y10
	VMULPS       Y8, Y10, Y11
	VADDPS       Y11, Y0, Y0
	VBROADCASTSS (R13)(R8*1), Y10
	VMULPS       Y8, Y10, Y12
	VADDPS       Y12, Y2, Y2
	VBROADCASTSS (R13)(R8*2), Y10
	VMULPS       Y8, Y10, Y13
	VADDPS       Y13, Y4, Y4
	VBROADCASTSS (R13)(R12*1), Y10
	VMULPS       Y8, Y10, Y14
	VADDPS       Y14, Y6, Y6
	ADDQ         R9, R13
	INCQ         AX
	CMPQ         AX, k+0(FP)
	JLT          rloop8

	LEAQ (R11)(R11*2), R13
	CMPB acc+72(FP), $0
	JEQ  rstore8
	VADDPS (BX), Y0, Y0
	VADDPS (BX)(R11*1), Y2, Y2
	VADDPS (BX)(R11*2), Y4, Y4
	VADDPS (BX)(R13*1), Y6, Y6

rstore8:
	VMOVUPS Y0, (BX)
	VMOVUPS Y2, (BX)(R11*1)
	VMOVUPS Y4, (BX)(R11*2)
	VMOVUPS Y6, (BX)(R13*1)
	ADDQ    $32, DI
	ADDQ    $32, BX
	SUBQ    $8, DX

rtail:
	TESTQ DX, DX
	JEQ   rdone
	MOVQ  $8, AX
	SUBQ  DX, AX
	LEAQ  maskTable<>(SB), CX
	VMOVUPS (CX)(AX*4), Y15
	VXORPS Y0, Y0, Y0
	VXORPS Y2, Y2, Y2
	VXORPS Y4, Y4, Y4
	VXORPS Y6, Y6, Y6
	XORQ   AX, AX
	MOVQ   SI, R13

rlooptail:
	MOVQ         (R10)(AX*8), CX
	LEAQ         (DI)(CX*4), CX
	VMASKMOVPS   (CX), Y15, Y8
	VBROADCASTSS (R13), Y10
	VMULPS       Y8, Y10, Y11
	VADDPS       Y11, Y0, Y0
	VBROADCASTSS (R13)(R8*1), Y10
	VMULPS       Y8, Y10, Y12
	VADDPS       Y12, Y2, Y2
	VBROADCASTSS (R13)(R8*2), Y10
	VMULPS       Y8, Y10, Y13
	VADDPS       Y13, Y4, Y4
	VBROADCASTSS (R13)(R12*1), Y10
	VMULPS       Y8, Y10, Y14
	VADDPS       Y14, Y6, Y6
	ADDQ         R9, R13
	INCQ         AX
	CMPQ         AX, k+0(FP)
	JLT          rlooptail

	LEAQ (R11)(R11*2), R13
	CMPB acc+72(FP), $0
	JEQ  rstoretail
	VMASKMOVPS (BX), Y15, Y8
	VADDPS     Y8, Y0, Y0
	VMASKMOVPS (BX)(R11*1), Y15, Y8
	VADDPS     Y8, Y2, Y2
	VMASKMOVPS (BX)(R11*2), Y15, Y8
	VADDPS     Y8, Y4, Y4
	VMASKMOVPS (BX)(R13*1), Y15, Y8
	VADDPS     Y8, Y6, Y6

rstoretail:
	VMASKMOVPS Y0, Y15, (BX)
	VMASKMOVPS Y2, Y15, (BX)(R11*1)
	VMASKMOVPS Y4, Y15, (BX)(R11*2)
	VMASKMOVPS Y6, Y15, (BX)(R13*1)

rdone:
	VZEROUPPER
	RET

// func nt4x2AVX(k int, a *float32, lda int, b *float32, ldb int, c *float32, ldc int, acc bool)
//
// Registers: SI = A(0,l), R8 = lda, R12 = 3*lda; DI = B(0,l), R10 = ldb
// (bytes); AX = elements left. Y0..Y7 accumulate C(r, col) at Y(2r+col),
// Y8..Y11 hold A rows, Y12..Y13 B rows, Y14 products, Y15 the tail mask.
TEXT ·nt4x2AVX(SB), NOSPLIT, $0-57
	MOVQ k+0(FP), AX
	MOVQ a+8(FP), SI
	MOVQ lda+16(FP), R8
	SHLQ $2, R8
	LEAQ (R8)(R8*2), R12
	MOVQ b+24(FP), DI
	MOVQ ldb+32(FP), R10
	SHLQ $2, R10
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	VXORPS Y4, Y4, Y4
	VXORPS Y5, Y5, Y5
	VXORPS Y6, Y6, Y6
	VXORPS Y7, Y7, Y7

ntloop:
	CMPQ    AX, $8
	JLT     nttail
	VMOVUPS (DI), Y12
	VMOVUPS (DI)(R10*1), Y13
	VMOVUPS (SI), Y8
	VMULPS  Y12, Y8, Y14
	VADDPS  Y14, Y0, Y0
	VMULPS  Y13, Y8, Y14
	VADDPS  Y14, Y1, Y1
	VMOVUPS (SI)(R8*1), Y9
	VMULPS  Y12, Y9, Y14
	VADDPS  Y14, Y2, Y2
	VMULPS  Y13, Y9, Y14
	VADDPS  Y14, Y3, Y3
	VMOVUPS (SI)(R8*2), Y10
	VMULPS  Y12, Y10, Y14
	VADDPS  Y14, Y4, Y4
	VMULPS  Y13, Y10, Y14
	VADDPS  Y14, Y5, Y5
	VMOVUPS (SI)(R12*1), Y11
	VMULPS  Y12, Y11, Y14
	VADDPS  Y14, Y6, Y6
	VMULPS  Y13, Y11, Y14
	VADDPS  Y14, Y7, Y7
	ADDQ    $32, SI
	ADDQ    $32, DI
	SUBQ    $8, AX
	JMP     ntloop

nttail:
	TESTQ AX, AX
	JEQ   ntreduce
	MOVQ  $8, CX
	SUBQ  AX, CX
	LEAQ  maskTable<>(SB), DX
	VMOVUPS    (DX)(CX*4), Y15
	VMASKMOVPS (DI), Y15, Y12
	VMASKMOVPS (DI)(R10*1), Y15, Y13
	VMASKMOVPS (SI), Y15, Y8
	VMULPS     Y12, Y8, Y14
	VADDPS     Y14, Y0, Y0
	VMULPS     Y13, Y8, Y14
	VADDPS     Y14, Y1, Y1
	VMASKMOVPS (SI)(R8*1), Y15, Y9
	VMULPS     Y12, Y9, Y14
	VADDPS     Y14, Y2, Y2
	VMULPS     Y13, Y9, Y14
	VADDPS     Y14, Y3, Y3
	VMASKMOVPS (SI)(R8*2), Y15, Y10
	VMULPS     Y12, Y10, Y14
	VADDPS     Y14, Y4, Y4
	VMULPS     Y13, Y10, Y14
	VADDPS     Y14, Y5, Y5
	VMASKMOVPS (SI)(R12*1), Y15, Y11
	VMULPS     Y12, Y11, Y14
	VADDPS     Y14, Y6, Y6
	VMULPS     Y13, Y11, Y14
	VADDPS     Y14, Y7, Y7

ntreduce:
	HSUM(Y0, X0)
	HSUM(Y1, X1)
	HSUM(Y2, X2)
	HSUM(Y3, X3)
	HSUM(Y4, X4)
	HSUM(Y5, X5)
	HSUM(Y6, X6)
	HSUM(Y7, X7)
	MOVQ c+40(FP), BX
	MOVQ ldc+48(FP), R11
	SHLQ $2, R11
	LEAQ (R11)(R11*2), R13
	STORE1(X0, (BX))
	STORE1(X1, 4(BX))
	STORE1(X2, (BX)(R11*1))
	STORE1(X3, 4(BX)(R11*1))
	STORE1(X4, (BX)(R11*2))
	STORE1(X5, 4(BX)(R11*2))
	STORE1(X6, (BX)(R13*1))
	STORE1(X7, 4(BX)(R13*1))
	VZEROUPPER
	RET
