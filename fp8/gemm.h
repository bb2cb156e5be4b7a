/*
 * The GEMM contract both builds implement (op_gemm in llama/ops_cpu.h and llama/ops_cuda.cuh), and the
 * shape/type rules of FP8 GEMMs on Hopper, checked in one place.
 *
 * Semantics are cuBLASLt's, column-major: D (m x n, ld m) = scale_a * scale_b * op(A) op(B) (+ D when
 * accumulating), op(A) m x k, op(B) k x n, lda = transA ? k : m, ldb = transB ? n : k. A row-major
 * (r, c) matrix is the column-major (c, r) matrix, so with A = W (OC, C) and B = X (N, C) row-major,
 * "TN" (transA, !transB) with m = OC, n = N, k = C gives D = Y (N, OC) row-major = X W^T.
 * cuBLASLt runs FP8 only as TN, never E5M2 x E5M2, and with leading dimensions that are multiples of 16
 * (cuBLASLt documentation, "cublasLtMatmul" FP8 requirements); gemm_check enforces exactly that.
 */
#pragma once

#include <stdio.h>

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
 * Returns 0 when the GEMM (types, transposes, m, n, k) is one cuBLASLt can run on Hopper, or 1 with a
 * one-line reason in `why` naming the offending operand or dimension. Non-FP8 GEMMs have no constraint.
 */
static inline int gemm_check(DType at, int transA, DType bt, int transB, int m, int n, int k, char* why, size_t len) {
    int a8 = dtype_is_fp8(at), b8 = dtype_is_fp8(bt);
    if (!a8 && !b8) return 0;
    if (a8 != b8) {
        snprintf(why, len, "FP8 GEMM with mixed operand types %s x %s (both must be FP8)", dtype_name(at), dtype_name(bt));
        return 1;
    }
    if (at == DT_E5M2 && bt == DT_E5M2) {
        snprintf(why, len, "FP8 GEMM E5M2 x E5M2 is not supported by cuBLASLt");
        return 1;
    }
    if (!transA || transB) {
        snprintf(why, len, "FP8 GEMM must use the TN layout (got %s%s)", transA ? "T" : "N", transB ? "T" : "N");
        return 1;
    }
    const char* names[3] = {"m", "n", "k"};
    int dims[3] = {m, n, k};
    for (int i = 0; i < 3; i++) {
        if (dims[i] <= 0 || dims[i] % FP8_DIM_MULTIPLE != 0) {
            snprintf(why, len, "FP8 GEMM dimension %s = %d is not a positive multiple of %d", names[i], dims[i], FP8_DIM_MULTIPLE);
            return 1;
        }
    }
    return 0;
}
