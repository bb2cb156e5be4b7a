/*
 * The GEMM contract both GEMM implementations follow (gemm_cpu.h, the CPU emulation; gemm_cublaslt.cuh,
 * cuBLASLt), the operand map of a linear layer's three GEMMs (docs/design.md#the-operand-map), and the shape/type
 * rules of FP8 GEMMs on Hopper, checked in one place.
 *
 * A GemmCall has cuBLASLt's column-major semantics: D (m x n, ld m) = scale_a * scale_b * op(A) op(B)
 * (+ D when accumulating), op(A) m x k, op(B) k x n, lda = trans_a ? k : m, ldb = trans_b ? n : k.
 * A row-major (r, c) matrix is the column-major (c, r) matrix, which is how the row-major tensors of
 * the model (X (N, C), W (OC, C) as PyTorch stores Linear weights, dY (N, OC)) map onto it. Nobody
 * writes m, n, k by hand: gemm_fprop / gemm_dgrad / gemm_wgrad build the call from the layer's N, C, OC
 * and the operands' types, following this table (FP8 rows use the transposed copies the fused
 * cast-transpose makes, because cuBLASLt runs FP8 only as TN):
 *
 *   GEMM                 m, n, k    A (op)                     B (op)                       D
 *   fprop  Y = X W^T     OC, N, C   W (T)                      X (N)                        Y (N, OC)
 *   dgrad  dX = dY W     C, N, OC   W (N); FP8: W^T copy (T)   dY (N)                       dX (N, C)
 *   wgrad  dW += dY^T X  C, OC, N   X (N); FP8: X^T copy (T)   dY (T); FP8: dY^T copy (N)   dW (OC, C)
 *
 * cuBLASLt runs FP8 only as TN, never E5M2 x E5M2, and with dimensions that are multiples of 16
 * (cuBLASLt documentation, "cublasLtMatmul", FP8 requirements); gemm_check enforces exactly that.
 */
#pragma once

#include <stdio.h>
#include <string.h>

#include "fp8.h"

typedef enum {
    DT_F32,  /* float */
    DT_ACT,  /* the build's activation type: BF16 on the GPU; float on the CPU, BF16-rounded in bf16/fp8 mode */
    DT_E4M3, /* FP8 codes */
    DT_E5M2,
} DType;

static inline const char* dtype_name(DType t) {
    return t == DT_F32 ? "f32" : t == DT_ACT ? "act" : t == DT_E4M3 ? "E4M3" : "E5M2";
}

static inline int dtype_is_fp8(DType t) { return t == DT_E4M3 || t == DT_E5M2; }

/*
 * How an FP8 GEMM accumulates (--fp8-accum). FP8_ACCUM_EXACT: FP32 accumulation of the exact products
 * (the CPU emulation's BLAS; the GPU ignores it: its accumulation is the tensor cores'). FP8_ACCUM_HOPPER:
 * the CPU emulation models Hopper's tensor-core chains (gemm_hopper.h); only the CPU build runs it.
 */
typedef enum { FP8_ACCUM_EXACT = 0, FP8_ACCUM_HOPPER = 1 } Fp8Accum;

/* --fp8-accum's values, indexed by Fp8Accum. */
static const char* const FP8_ACCUM_NAMES[] = {"exact", "hopper"};
static inline const char* fp8_accum_name(int a) { return a == FP8_ACCUM_HOPPER ? "hopper" : "exact"; }

/*
 * One input of a GEMM, as Transformer Engine's tensors carry it: the data, its type and, for FP8, a
 * pointer to its scale_inv (device memory on the GPU, host memory on the CPU; NULL otherwise).
 */
typedef struct {
    const void* data;
    DType dtype;
    const float* scale_inv;
} GemmOperand;

/* An operand in the activation type or FP32 (no scale). */
static inline GemmOperand gemm_operand(const void* data, DType dtype) {
    GemmOperand o = {data, dtype, NULL};
    return o;
}

/* An FP8 operand: codes of format dtype (DT_E4M3 / DT_E5M2) and their scale_inv. */
static inline GemmOperand gemm_operand_fp8(const uint8_t* codes, DType dtype, const float* scale_inv) {
    GemmOperand o = {codes, dtype, scale_inv};
    return o;
}

/* One GEMM in cuBLASLt's column-major terms (see the banner). */
typedef struct {
    void* d;
    DType d_type;   /* DT_ACT or DT_F32 */
    int accumulate; /* D += instead of D = */
    GemmOperand a, b;
    int trans_a, trans_b;
    size_t m, n, k;
    int fast_accum; /* Hopper's FP8 fast accumulation (FP8 only) */
    int accum;      /* Fp8Accum (FP8 only; gemm_fprop/dgrad/wgrad leave it FP8_ACCUM_EXACT) */
} GemmCall;

/*
 * fprop of a linear layer: y (N, OC) = x (N, C) w^T with w (OC, C). FP8 operands (w and x both E4M3)
 * use fast accumulation, as Transformer Engine does for the forward GEMM.
 */
static inline GemmCall gemm_fprop(void* y, DType y_type, GemmOperand w, GemmOperand x, size_t N, size_t C, size_t OC) {
    GemmCall g = {y, y_type, 0, w, x, 1, 0, OC, N, C, dtype_is_fp8(w.dtype), FP8_ACCUM_EXACT};
    return g;
}

/*
 * dgrad: dx (N, C) = dy (N, OC) w with w (OC, C). With FP8 operands w is the E4M3 copy of w^T (C, OC)
 * and dy is E5M2 (TN); otherwise w itself (NN). No fast accumulation (TE's default for backward GEMMs).
 */
static inline GemmCall gemm_dgrad(void* dx, DType dx_type, GemmOperand w, GemmOperand dy, size_t N, size_t C, size_t OC) {
    int fp8 = dtype_is_fp8(w.dtype);
    GemmCall g = {dx, dx_type, 0, w, dy, fp8, 0, C, N, OC, 0, FP8_ACCUM_EXACT};
    return g;
}

/*
 * wgrad: dw (OC, C) FP32 += dy^T (OC, N) x (N, C). With FP8 operands x is the E4M3 copy of x^T (C, N)
 * and dy the E5M2 copy of dy^T (OC, N) (TN); otherwise x (N, C) and dy (N, OC) themselves (NT).
 */
static inline GemmCall gemm_wgrad(float* dw, GemmOperand x, GemmOperand dy, size_t N, size_t C, size_t OC) {
    int fp8 = dtype_is_fp8(x.dtype);
    GemmCall g = {dw, DT_F32, 1, x, dy, fp8, !fp8, C, OC, N, 0, FP8_ACCUM_EXACT};
    return g;
}

/*
 * Returns 0 when the GEMM is one the implementations run (for FP8: what cuBLASLt runs on Hopper), or 1
 * with a one-line reason in `why` naming the offending operand or dimension.
 */
static inline int gemm_check(const GemmCall* g, char* why, size_t len) {
    if (g->d_type != DT_F32 && g->d_type != DT_ACT) {
        snprintf(why, len, "GEMM output type %s is not supported (act or f32)", dtype_name(g->d_type));
        return 1;
    }
    int a8 = dtype_is_fp8(g->a.dtype), b8 = dtype_is_fp8(g->b.dtype);
    if (!a8 && !b8) return 0;
    if (a8 != b8) {
        snprintf(why, len, "FP8 GEMM with mixed operand types %s x %s (both must be FP8)", dtype_name(g->a.dtype),
                 dtype_name(g->b.dtype));
        return 1;
    }
    if (g->a.dtype == DT_E5M2 && g->b.dtype == DT_E5M2) {
        snprintf(why, len, "FP8 GEMM E5M2 x E5M2 is not supported by cuBLASLt");
        return 1;
    }
    if (!g->trans_a || g->trans_b) {
        snprintf(why, len, "FP8 GEMM must use the TN layout (got %s%s)", g->trans_a ? "T" : "N", g->trans_b ? "T" : "N");
        return 1;
    }
    if (g->a.scale_inv == NULL || g->b.scale_inv == NULL) {
        snprintf(why, len, "FP8 GEMM m %zu n %zu k %zu without scale_inv pointers", g->m, g->n, g->k);
        return 1;
    }
    const char* names[3] = {"m", "n", "k"};
    size_t dims[3] = {g->m, g->n, g->k};
    for (int i = 0; i < 3; i++) {
        if (dims[i] == 0 || dims[i] % FP8_DIM_MULTIPLE != 0) {
            snprintf(why, len, "FP8 GEMM dimension %s = %zu is not a positive multiple of %d", names[i], dims[i], FP8_DIM_MULTIPLE);
            return 1;
        }
    }
    return 0;
}
