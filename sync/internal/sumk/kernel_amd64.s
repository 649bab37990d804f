//go:build amd64 && !purego

#include "textflag.h"

// func toAVX(n int, o, x, y *float64)
//
// Eight elements an iteration: o = x + y with x the first source (of two
// NaNs the sum keeps x's, as addGo's does). CX = elements left, DI = o,
// SI = x, DX = y, AX = byte offset. Both loads of a block come before its
// stores, so o may be x or y.
TEXT ·toAVX(SB), NOSPLIT, $0-32
	MOVQ n+0(FP), CX
	MOVQ o+8(FP), DI
	MOVQ x+16(FP), SI
	MOVQ y+24(FP), DX
	XORQ AX, AX

loop:
	VMOVUPD (SI)(AX*1), Y0
	VMOVUPD 32(SI)(AX*1), Y1
	VADDPD  (DX)(AX*1), Y0, Y0
	VADDPD  32(DX)(AX*1), Y1, Y1
	VMOVUPD Y0, (DI)(AX*1)
	VMOVUPD Y1, 32(DI)(AX*1)
	ADDQ    $64, AX
	SUBQ    $8, CX
	JNZ     loop
	VZEROUPPER
	RET

// func to32AVX(n int, o, x, y *float32)
//
// toAVX in float32: sixteen elements an iteration, o = x + y with x the
// first source (of two NaNs the sum keeps x's, as addGo's does).
TEXT ·to32AVX(SB), NOSPLIT, $0-32
	MOVQ n+0(FP), CX
	MOVQ o+8(FP), DI
	MOVQ x+16(FP), SI
	MOVQ y+24(FP), DX
	XORQ AX, AX

loop32:
	VMOVUPS (SI)(AX*1), Y0
	VMOVUPS 32(SI)(AX*1), Y1
	VADDPS  (DX)(AX*1), Y0, Y0
	VADDPS  32(DX)(AX*1), Y1, Y1
	VMOVUPS Y0, (DI)(AX*1)
	VMOVUPS Y1, 32(DI)(AX*1)
	ADDQ    $64, AX
	SUBQ    $16, CX
	JNZ     loop32
	VZEROUPPER
	RET
