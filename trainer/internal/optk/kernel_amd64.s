//go:build amd64 && !purego

#include "textflag.h"

// func adamAVX(n int, val, grad, mIn, vIn, mOut, vOut *float32, c *AdamCoeffs)
//
// Eight elements an iteration, in the order of adamGo. Registers: CX =
// elements left, DI = val, SI = grad, R8 = mIn, R9 = vIn, R10 = mOut, R11 =
// vOut, DX = byte offset; Y0..Y6 hold GScale, B1, C1, B2, C2, Alpha, Eps;
// BX = StoreGrad.
TEXT ·adamAVX(SB), NOSPLIT, $0-64
	MOVQ n+0(FP), CX
	MOVQ val+8(FP), DI
	MOVQ grad+16(FP), SI
	MOVQ mIn+24(FP), R8
	MOVQ vIn+32(FP), R9
	MOVQ mOut+40(FP), R10
	MOVQ vOut+48(FP), R11
	MOVQ c+56(FP), AX
	VBROADCASTSS 0(AX), Y0
	VBROADCASTSS 4(AX), Y1
	VBROADCASTSS 8(AX), Y2
	VBROADCASTSS 12(AX), Y3
	VBROADCASTSS 16(AX), Y4
	VBROADCASTSS 20(AX), Y5
	VBROADCASTSS 24(AX), Y6
	MOVBQZX 28(AX), BX
	XORQ DX, DX

loop:
	VMOVUPS (SI)(DX*1), Y7
	VMULPS  Y0, Y7, Y7          // gi = g*GScale
	TESTQ   BX, BX
	JZ      nostore
	VMOVUPS Y7, (SI)(DX*1)

nostore:
	VMOVUPS (R8)(DX*1), Y8
	VMULPS  Y8, Y1, Y8          // B1*mIn
	VMULPS  Y7, Y2, Y9          // C1*gi
	VADDPS  Y9, Y8, Y8          // m
	VMOVUPS Y8, (R10)(DX*1)
	VMOVUPS (R9)(DX*1), Y10
	VMULPS  Y10, Y3, Y10        // B2*vIn
	VMULPS  Y7, Y4, Y11         // C2*gi
	VMULPS  Y7, Y11, Y11        // (C2*gi)*gi
	VADDPS  Y11, Y10, Y10       // v
	VMOVUPS Y10, (R11)(DX*1)
	VSQRTPS Y10, Y10
	VADDPS  Y6, Y10, Y10        // sqrt(v)+Eps
	VMULPS  Y8, Y5, Y8          // Alpha*m
	VDIVPS  Y10, Y8, Y8         // (Alpha*m)/(sqrt(v)+Eps)
	VMOVUPS (DI)(DX*1), Y12
	VSUBPS  Y8, Y12, Y12        // val - step
	VMOVUPS Y12, (DI)(DX*1)
	ADDQ    $32, DX
	SUBQ    $8, CX
	JNZ     loop
	VZEROUPPER
	RET
