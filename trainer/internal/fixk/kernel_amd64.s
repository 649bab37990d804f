//go:build amd64 && !purego

#include "textflag.h"

// Each kernel takes n, a positive multiple of 8, and handles eight values
// an iteration in the order of its Go form (see fixk.go). Common registers:
// CX = values left, Y15 = 0x7fffffff in every dword (clears a float32's
// sign), Y14 = the scale (or unscale), Y13 = Magic (or inv), Y0 = the
// running dword maximum of |g| bit patterns.
//
// Operand order matters only when both operands of an add are NaN (the
// result is then the first source's NaN): for Go's a + b, the assembly
// names a as the first source, "VADDPD b, a, dst" in Go's operand order.

// magic is Magic = 1.5*2^52 as a float64 bit pattern.
#define magic $0x4338000000000000

// SETUP loads Y15 (the sign mask), Y14 (the scale at off(FP)), Y13 (Magic)
// and clears Y0.
#define SETUP(off) \
	VPCMPEQD     Y15, Y15, Y15 \
	VPSRLD       $1, Y15, Y15 \
	VBROADCASTSD off(FP), Y14 \
	MOVQ         magic, AX \
	VMOVQ        AX, X13 \
	VPBROADCASTQ X13, Y13 \
	VPXOR        Y0, Y0, Y0

// ROUND sets Ya and Yb to the eight float32 values at (R) widened to
// float64 and rounded at scale Y14: (x*scale + Magic) - Magic, each rounded.
#define ROUND(R, Ya, Yb) \
	VCVTPS2PD (R), Ya \
	VCVTPS2PD 16(R), Yb \
	VMULPD    Y14, Ya, Ya \
	VMULPD    Y14, Yb, Yb \
	VADDPD    Y13, Ya, Ya \
	VADDPD    Y13, Yb, Yb \
	VSUBPD    Y13, Ya, Ya \
	VSUBPD    Y13, Yb, Yb

// MAXABS folds the sign-cleared bit patterns of the eight values at (R)
// into Y0, using Yt.
#define MAXABS(R, Yt) \
	VPAND   (R), Y15, Yt \
	VPMAXUD Yt, Y0, Y0

// HMAX leaves the largest dword of Y0 in AX.
#define HMAX \
	VEXTRACTI128 $1, Y0, X1 \
	VPMAXUD      X1, X0, X0 \
	VPSHUFD      $0x4e, X0, X1 \
	VPMAXUD      X1, X0, X0 \
	VPSHUFD      $0xb1, X0, X1 \
	VPMAXUD      X1, X0, X0 \
	VMOVD        X0, AX

// func maxAbsAVX2(n int, x *float32) uint32
TEXT ·maxAbsAVX2(SB), NOSPLIT, $0-20
	MOVQ     n+0(FP), CX
	MOVQ     x+8(FP), SI
	VPCMPEQD Y15, Y15, Y15
	VPSRLD   $1, Y15, Y15
	VPXOR    Y0, Y0, Y0
	VPXOR    Y2, Y2, Y2
	TESTQ    $8, CX
	JZ       loop16
	MAXABS(SI, Y1)
	ADDQ     $32, SI
	SUBQ     $8, CX
	JZ       done

loop16:
	VPAND   (SI), Y15, Y1
	VPAND   32(SI), Y15, Y3
	VPMAXUD Y1, Y0, Y0
	VPMAXUD Y3, Y2, Y2
	ADDQ    $64, SI
	SUBQ    $16, CX
	JNZ     loop16

done:
	VPMAXUD Y2, Y0, Y0
	HMAX
	MOVL    AX, ret+16(FP)
	VZEROUPPER
	RET

// func setAVX2(n int, f *float64, x *float32, scale float64) uint32
//
// DI = f, SI = x.
TEXT ·setAVX2(SB), NOSPLIT, $0-36
	MOVQ n+0(FP), CX
	MOVQ f+8(FP), DI
	MOVQ x+16(FP), SI
	SETUP(scale+24)

setloop:
	ROUND(SI, Y1, Y2)
	VMOVUPD Y1, (DI)
	VMOVUPD Y2, 32(DI)
	MAXABS(SI, Y3)
	ADDQ    $32, SI
	ADDQ    $64, DI
	SUBQ    $8, CX
	JNZ     setloop
	HMAX
	MOVL    AX, ret+32(FP)
	VZEROUPPER
	RET

// func set2AVX2(n int, f *float64, g0, g1 *float32, scale float64) uint32
//
// DI = f, SI = g0, R8 = g1. f = r(g0) + r(g1), g0's the first source.
TEXT ·set2AVX2(SB), NOSPLIT, $0-44
	MOVQ n+0(FP), CX
	MOVQ f+8(FP), DI
	MOVQ g0+16(FP), SI
	MOVQ g1+24(FP), R8
	SETUP(scale+32)

set2loop:
	ROUND(SI, Y1, Y2)
	ROUND(R8, Y3, Y4)
	VADDPD  Y3, Y1, Y1
	VADDPD  Y4, Y2, Y2
	VMOVUPD Y1, (DI)
	VMOVUPD Y2, 32(DI)
	MAXABS(SI, Y5)
	MAXABS(R8, Y6)
	ADDQ    $32, SI
	ADDQ    $32, R8
	ADDQ    $64, DI
	SUBQ    $8, CX
	JNZ     set2loop
	HMAX
	MOVL    AX, ret+40(FP)
	VZEROUPPER
	RET

// func addAVX2(n int, f *float64, x *float32, scale float64) uint32
//
// DI = f, SI = x. f = r(x) + f, r(x) the first source (as the gc compiler
// orders f[i] += r).
TEXT ·addAVX2(SB), NOSPLIT, $0-36
	MOVQ n+0(FP), CX
	MOVQ f+8(FP), DI
	MOVQ x+16(FP), SI
	SETUP(scale+24)

addloop:
	ROUND(SI, Y1, Y2)
	VADDPD  (DI), Y1, Y1
	VADDPD  32(DI), Y2, Y2
	VMOVUPD Y1, (DI)
	VMOVUPD Y2, 32(DI)
	MAXABS(SI, Y3)
	ADDQ    $32, SI
	ADDQ    $64, DI
	SUBQ    $8, CX
	JNZ     addloop
	HMAX
	MOVL    AX, ret+32(FP)
	VZEROUPPER
	RET

// func unfixAVX2(n int, dst *float32, f *float64, unscale, inv float64)
//
// DI = dst, SI = f, Y14 = unscale, Y13 = inv. dst = float32((f*unscale)*inv).
TEXT ·unfixAVX2(SB), NOSPLIT, $0-40
	MOVQ         n+0(FP), CX
	MOVQ         dst+8(FP), DI
	MOVQ         f+16(FP), SI
	VBROADCASTSD unscale+24(FP), Y14
	VBROADCASTSD inv+32(FP), Y13

unfixloop:
	VMOVUPD    (SI), Y1
	VMOVUPD    32(SI), Y2
	VMULPD     Y14, Y1, Y1
	VMULPD     Y14, Y2, Y2
	VMULPD     Y13, Y1, Y1
	VMULPD     Y13, Y2, Y2
	VCVTPD2PSY Y1, X1
	VCVTPD2PSY Y2, X2
	VMOVUPS    X1, (DI)
	VMOVUPS    X2, 16(DI)
	ADDQ       $64, SI
	ADDQ       $32, DI
	SUBQ       $8, CX
	JNZ        unfixloop
	VZEROUPPER
	RET
