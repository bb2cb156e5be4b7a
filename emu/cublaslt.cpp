/*
 * The emulated GPU's cuBLASLt: the descriptor, layout, preference, heuristic and matmul calls llm8 makes
 * (fp8/gemm_cublaslt.cuh), compiled against the toolkit's real cublasLt.h so the project's source is
 * unchanged. The matmul is computed on the CPU with arithmetic of its own (not fp8/gemm_cpu.h, which the
 * kernel checks compare against): operands decoded exactly to double, products summed in float64 in a
 * fixed order (4 interleaved partial sums over k, added pairwise at the end) and rounded to FP32, then
 * the FP32 epilogue: times alpha * scale_a * scale_b, plus beta * C, in FP32, and for BF16 D rounded to
 * BF16 (round-to-nearest-even) -- what the GPU's FP32 epilogue does, with a more exact accumulator than
 * Hopper's tensor cores.
 *
 * It runs on the stream it is given (emu_stream_enqueue): the scale pointers, A, B and C are read from
 * emulated device memory when the stream runs the GEMM, not when it is called; descriptor values and the
 * host alpha/beta are captured at the call, as the real library does.
 *
 * What Hopper's cuBLASLt refuses is refused with the status the library returns, each rule citing the
 * cuBLAS documentation (docs.nvidia.com/cuda/cublas, section "cublasLtMatmul()", its FP8 requirements and
 * its table of FP8 type combinations; or the cublasLt.h comment of the attribute). Every refusal also
 * prints one "emu cuBLASLt: ..." line saying which rule, as the real library does at CUBLASLT_LOG_LEVEL=1.
 * What the double does not emulate (epilogues, device pointer mode, FP8 D, batches, other orders) stops
 * the run through emu_fail instead of computing something else.
 *
 * Each check carries a "check:NAME" tag: dev/test/test_emu_libs.py deletes a tagged line in a copy of this
 * file to prove that the test of that rule fails without it.
 */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "emu_runtime.h"

/* The library version the double reports (cublasLtGetVersion): the toolkit header it was built against. */
#define EMU_CUBLASLT_VERSION CUBLAS_VERSION
/* Identifies an algorithm this double's heuristic returned (cublasLtMatmulAlgo_t is opaque). */
#define EMU_ALGO_MAGIC 0x6c6c6d38616c676fULL
/* The alignment cuBLASLt assumes of every pointer unless a preference lowers it (cublasLt.h,
   CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES: "default: 256"). */
#define EMU_DEFAULT_ALIGNMENT 256u
/* FP8 kernels need 16-byte aligned pointers and dimensions (docs, cublasLtMatmul, FP8 requirements). */
#define EMU_FP8_ALIGNMENT 16u

struct cublasLtContext {
    int magic;
};

namespace {

struct Desc {
    cublasComputeType_t compute;
    cudaDataType_t scale_type;
    int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
    int8_t fast_accum = 0;
    const void* scale_ptr[4] = {nullptr, nullptr, nullptr, nullptr}; /* A, B, C, D */
    uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    int32_t bias_type = -1; /* cublasLt.h: -1, the type the table gives for the GEMM's types */
};

struct Layout {
    cudaDataType_t type;
    uint64_t rows, cols;
    int64_t ld;
};

struct Pref {
    uint64_t max_workspace = 0; /* cublasLt.h: "default: 0 - no workspace allowed" */
    uint32_t reduction_mask = CUBLASLT_REDUCTION_SCHEME_MASK;
    uint32_t align[4] = {EMU_DEFAULT_ALIGNMENT, EMU_DEFAULT_ALIGNMENT, EMU_DEFAULT_ALIGNMENT, EMU_DEFAULT_ALIGNMENT};
};

/* What an algorithm of this double records about the query that chose it (in cublasLtMatmulAlgo_t.data). */
enum { ALGO_MAGIC, ALGO_WORKSPACE, ALGO_ALIGN, ALGO_PROBLEM, ALGO_WORDS };

Desc* desc_of(cublasLtMatmulDesc_t d) { return reinterpret_cast<Desc*>(d); }
Layout* layout_of(cublasLtMatrixLayout_t l) { return reinterpret_cast<Layout*>(l); }
Pref* pref_of(cublasLtMatmulPreference_t p) { return reinterpret_cast<Pref*>(p); }

/* Returns `status` after printing why, as the real library logs its refusals. */
cublasStatus_t refuse(cublasStatus_t status, const char* api, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
cublasStatus_t refuse(cublasStatus_t status, const char* api, const char* fmt, ...) {
    char line[1024]; /* one write of the whole line, so that ranks' lines do not interleave */
    int at = snprintf(line, sizeof(line) - 1, "emu cuBLASLt: %s returns %s: ", api, cublasLtGetStatusName(status));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + at, sizeof(line) - at - 1, fmt, ap);
    va_end(ap);
    at = (int)strlen(line);
    line[at++] = '\n';
    fwrite(line, 1, at, stderr);
    return status;
}

bool is_fp8(cudaDataType_t t) { return t == CUDA_R_8F_E4M3 || t == CUDA_R_8F_E5M2; }

size_t type_bytes(cudaDataType_t t) {
    switch (t) {
        case CUDA_R_32F: return 4;
        case CUDA_R_16BF: case CUDA_R_16F: return 2;
        case CUDA_R_8F_E4M3: case CUDA_R_8F_E5M2: return 1;
        default: return 0;
    }
}

const char* type_name(cudaDataType_t t) {
    switch (t) {
        case CUDA_R_32F: return "R_32F";
        case CUDA_R_16BF: return "R_16BF";
        case CUDA_R_16F: return "R_16F";
        case CUDA_R_8F_E4M3: return "R_8F_E4M3";
        case CUDA_R_8F_E5M2: return "R_8F_E5M2";
        default: return "other";
    }
}

/* The FP8 rows of the docs' type table (cublasLtMatmul, "FP8 ... supported type combinations", Hopper):
   A/B E4M3 x E4M3, E4M3 x E5M2 or E5M2 x E4M3; C 16BF -> D 16BF or FP8; C 16F -> D 16F or FP8; C 32F ->
   D 32F. An E5M2 D needs an E5M2 operand. */
bool fp8_cd_allowed(cudaDataType_t a, cudaDataType_t b, cudaDataType_t c, cudaDataType_t d) {
    bool e5m2_in = a == CUDA_R_8F_E5M2 || b == CUDA_R_8F_E5M2;
    bool fp8_d = d == CUDA_R_8F_E4M3 || (d == CUDA_R_8F_E5M2 && e5m2_in);
    if (c == CUDA_R_16BF) return d == CUDA_R_16BF || fp8_d;
    if (c == CUDA_R_16F) return d == CUDA_R_16F || fp8_d;
    if (c == CUDA_R_32F) return d == CUDA_R_32F;
    return false;
}

/* The FP8 type table's bias column: BF16 with C in BF16 or FP32 (FP32 D), FP16 with C in FP16. */
cudaDataType_t fp8_bias_type(cudaDataType_t c) { return c == CUDA_R_16F ? CUDA_R_16F : CUDA_R_16BF; }

/* Epilogues that read a bias vector or write a bias gradient (cublasLt.h, cublasLtEpilogue_t). */
bool has_bias(uint32_t epilogue) {
    return (epilogue & CUBLASLT_EPILOGUE_BIAS) || epilogue == CUBLASLT_EPILOGUE_DRELU_BGRAD ||
           epilogue == CUBLASLT_EPILOGUE_DGELU_BGRAD || epilogue == CUBLASLT_EPILOGUE_BGRADA || epilogue == CUBLASLT_EPILOGUE_BGRADB;
}

/* One 64-bit summary of what an algorithm's choice depends on (types, shapes, transposes, scales set). */
uint64_t problem_key(const Desc& d, const Layout& a, const Layout& b, const Layout& c, const Layout& dd) {
    uint64_t h = 1469598103934665603ULL;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ULL; };
    mix(d.compute); mix(d.scale_type); mix(d.trans_a); mix(d.trans_b); mix(d.fast_accum); mix(d.epilogue); mix((uint64_t)d.bias_type);
    for (int i = 0; i < 4; i++) mix(d.scale_ptr[i] != nullptr);
    for (const Layout* l : {&a, &b, &c, &dd}) { mix(l->type); mix(l->rows); mix(l->cols); mix((uint64_t)l->ld); }
    return h;
}

/*
 * The rules a heuristic query and a matmul share: returns CUBLAS_STATUS_SUCCESS or the refusal, and sets
 * m, n, k. `api` names the caller in the refusal's message.
 */
cublasStatus_t check_problem(const char* api, const Desc& d, const Layout& a, const Layout& b, const Layout& c,
                             const Layout& dd, uint64_t* m, uint64_t* n, uint64_t* k) {
    bool fp8 = is_fp8(a.type) || is_fp8(b.type);
    /* FP8 requirements: "The compute type must be CUBLAS_COMPUTE_32F", "The scale type must be CUDA_R_32F" */
    if (fp8 && (d.compute != CUBLAS_COMPUTE_32F || d.scale_type != CUDA_R_32F)) /* check:fp8_compute */
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, api, "FP8 GEMM with compute type %d and scale type %d (needs "
                      "CUBLAS_COMPUTE_32F and CUDA_R_32F)", (int)d.compute, (int)d.scale_type);
    if (d.compute != CUBLAS_COMPUTE_32F || d.scale_type != CUDA_R_32F)
        emu_fail("%s: compute type %d / scale type %d not emulated (only CUBLAS_COMPUTE_32F with CUDA_R_32F)", api,
                 (int)d.compute, (int)d.scale_type);
    if ((d.trans_a != CUBLAS_OP_N && d.trans_a != CUBLAS_OP_T) || (d.trans_b != CUBLAS_OP_N && d.trans_b != CUBLAS_OP_T))
        emu_fail("%s: only CUBLAS_OP_N / CUBLAS_OP_T are emulated", api);
    /* op(A) is m x k, op(B) k x n, C and D m x n (docs, cublasLtMatmul: D = alpha op(A) op(B) + beta C) */
    *m = d.trans_a == CUBLAS_OP_T ? a.cols : a.rows;
    *k = d.trans_a == CUBLAS_OP_T ? a.rows : a.cols;
    uint64_t kb = d.trans_b == CUBLAS_OP_T ? b.cols : b.rows;
    *n = d.trans_b == CUBLAS_OP_T ? b.rows : b.cols;
    if (kb != *k || c.rows != *m || c.cols != *n || dd.rows != *m || dd.cols != *n)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "shapes do not agree: op(A) %lux%lu, op(B) %lux%lu, C %lux%lu, D %lux%lu",
                      (unsigned long)*m, (unsigned long)*k, (unsigned long)kb, (unsigned long)*n, (unsigned long)c.rows,
                      (unsigned long)c.cols, (unsigned long)dd.rows, (unsigned long)dd.cols);
    for (const Layout* l : {&a, &b, &c, &dd}) {
        /* a column-major matrix's ld is the column stride and cannot be less than its rows (cublasLt.h,
           CUBLASLT_MATRIX_LAYOUT_LD) */
        if (l->ld < (int64_t)l->rows || l->ld <= 0)
            return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "leading dimension %ld < rows %lu", (long)l->ld, (unsigned long)l->rows);
        if (type_bytes(l->type) == 0) emu_fail("%s: matrix type %d not emulated", api, (int)l->type);
    }
    if (!fp8) {
        /* the scale pointers apply to 8-bit inputs only; "If set for an unsupported matrix data, scale, and
           compute type combination, calling cublasLtMatmul() will return CUBLAS_INVALID_VALUE" (cublasLt.h,
           CUBLASLT_MATMUL_DESC_A_SCALE_POINTER) */
        if (d.scale_ptr[0] || d.scale_ptr[1] || d.scale_ptr[2] || d.scale_ptr[3]) /* check:scale_non_fp8 */
            return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "a scale pointer is set on a %s x %s GEMM", type_name(a.type), type_name(b.type));
        /* the docs' table for CUBLAS_COMPUTE_32F: A = B in BF16 or FP16 -> C = D in that type or FP32;
           FP32 -> FP32 */
        bool ok = a.type == b.type && c.type == dd.type &&
                  (((a.type == CUDA_R_16BF || a.type == CUDA_R_16F) && (dd.type == a.type || dd.type == CUDA_R_32F)) ||
                   (a.type == CUDA_R_32F && dd.type == CUDA_R_32F));
        if (!ok) /* check:regular_types */
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, api, "type combination A %s B %s C %s D %s", type_name(a.type),
                          type_name(b.type), type_name(c.type), type_name(dd.type));
        if (a.type == CUDA_R_16F) emu_fail("%s: FP16 GEMMs are not emulated (BF16 and FP32)", api);
        return CUBLAS_STATUS_SUCCESS;
    }
    /* ---- FP8 (docs, cublasLtMatmul: "To use FP8 kernels, the following set of requirements must be satisfied") */
    if (!is_fp8(a.type) || !is_fp8(b.type))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, api, "FP8 A with non-FP8 B (or the reverse): A %s B %s", type_name(a.type), type_name(b.type));
    /* the FP8 type table has no E5M2 x E5M2 row on Hopper */
    if (a.type == CUDA_R_8F_E5M2 && b.type == CUDA_R_8F_E5M2) /* check:e5m2_e5m2 */
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, api, "FP8 E5M2 x E5M2 is not in the FP8 type table");
    /* "A must be transposed and B non-transposed (The "TN" format)" on compute capability 8.9 / 9.0 */
    if (d.trans_a != CUBLAS_OP_T || d.trans_b != CUBLAS_OP_N) /* check:fp8_tn */
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, api, "FP8 GEMM in layout %c%c: Hopper runs FP8 only as TN",
                      d.trans_a == CUBLAS_OP_T ? 'T' : 'N', d.trans_b == CUBLAS_OP_T ? 'T' : 'N');
    /* "All matrix dimensions must meet the optimal requirements listed in Tensor Core Usage (i.e. pointers
       and matrix dimensions must support 16-byte alignment)": for 1-byte operands, multiples of 16 */
    const char* dim_names[3] = {"m", "n", "k"};
    uint64_t dims[3] = {*m, *n, *k};
    for (int i = 0; i < 3; i++)
        if (dims[i] == 0 || dims[i] % 16 != 0) /* check:fp8_dims */
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, api, "FP8 GEMM dimension %s = %lu is not a multiple of 16", dim_names[i],
                          (unsigned long)dims[i]);
    const char* ld_names[4] = {"lda", "ldb", "ldc", "ldd"};
    const Layout* ls[4] = {&a, &b, &c, &dd};
    for (int i = 0; i < 4; i++)
        if (ls[i]->ld % 16 != 0) /* check:fp8_ld */
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, api, "FP8 GEMM %s = %ld is not a multiple of 16", ld_names[i], (long)ls[i]->ld);
    /* the FP8 type table's C/D columns */
    if (!fp8_cd_allowed(a.type, b.type, c.type, dd.type)) /* check:fp8_cd */
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, api, "FP8 GEMM %s x %s with C %s, D %s is not in the FP8 type table",
                      type_name(a.type), type_name(b.type), type_name(c.type), type_name(dd.type));
    /* the bias column of the FP8 type table (and cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE) */
    if (has_bias(d.epilogue) && d.bias_type != -1 && d.bias_type != fp8_bias_type(c.type)) /* check:fp8_bias */
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, api, "FP8 GEMM with C %s and a bias of type %s (the FP8 type table "
                      "gives %s)", type_name(c.type), type_name((cudaDataType_t)d.bias_type), type_name(fp8_bias_type(c.type)));
    if (is_fp8(dd.type) || dd.type == CUDA_R_16F)
        emu_fail("%s: FP8 GEMM with D %s is not emulated (BF16 or FP32 D)", api, type_name(dd.type));
    if (d.scale_ptr[2] || d.scale_ptr[3]) emu_fail("%s: C/D scale pointers are not emulated (only FP8 D uses them)", api);
    return CUBLAS_STATUS_SUCCESS;
}

bool same_layout(const Layout& x, const Layout& y) {
    return x.type == y.type && x.rows == y.rows && x.cols == y.cols && x.ld == y.ld;
}

unsigned alignment_of(const void* p) {
    uintptr_t a = (uintptr_t)p;
    unsigned align = 1;
    while (align < EMU_DEFAULT_ALIGNMENT && a % (2 * align) == 0) align *= 2;
    return align;
}

/* The 256 values of an FP8 format, from cuda_fp8.h's host conversion (the GPU's decoding, bit for bit). */
struct Fp8Table {
    double e4m3[256], e5m2[256];
    Fp8Table() {
        for (int i = 0; i < 256; i++) {
            __nv_fp8_e4m3 a;
            __nv_fp8_e5m2 b;
            a.__x = b.__x = (__nv_fp8_storage_t)i;
            e4m3[i] = (float)a;
            e5m2[i] = (float)b;
        }
    }
};
const Fp8Table g_fp8;

/* Element `index` of a matrix of type t, exactly as a double. */
double load(const void* p, cudaDataType_t t, size_t index) {
    switch (t) {
        case CUDA_R_32F: return ((const float*)p)[index];
        case CUDA_R_16BF: { /* a BF16 is the upper half of the FP32 with the same value */
            uint32_t bits = (uint32_t)((const uint16_t*)p)[index] << 16;
            float f;
            memcpy(&f, &bits, sizeof(f));
            return f;
        }
        case CUDA_R_8F_E4M3: return g_fp8.e4m3[((const uint8_t*)p)[index]];
        case CUDA_R_8F_E5M2: return g_fp8.e5m2[((const uint8_t*)p)[index]];
        default: emu_fail("cublasLtMatmul: load of type %d not emulated", (int)t);
    }
}

/* The dot products' lanes: product p of a dot goes to partial sum p % LANES. */
#define LANES 4
/* Output tile of the micro-kernel: TILE_I rows of op(A) against TILE_J columns of op(B). */
#define TILE_I 2
#define TILE_J 4
/* Cache blocks: BLOCK_M rows of op(A) and BLOCK_N columns of op(B), BLOCK_K deep (64 KiB and 128 KiB of
   doubles), stay in L2 while their tiles run; a dot's lanes carry from one k block to the next, so its
   sum keeps the order of one uninterrupted pass. */
#define BLOCK_M 32
#define BLOCK_N 64
#define BLOCK_K 256

typedef double lanes_t __attribute__((vector_size(LANES * sizeof(double))));

/* Element `index` of X as a double (exact: every emulated type's values are doubles). */
template <typename T>
double element(const void* x, size_t index);
template <> double element<float>(const void* x, size_t index) { return ((const float*)x)[index]; }
template <> double element<uint16_t>(const void* x, size_t index) { return load(x, CUDA_R_16BF, index); }
template <> double element<__nv_fp8_e4m3>(const void* x, size_t index) { return g_fp8.e4m3[((const uint8_t*)x)[index]]; }
template <> double element<__nv_fp8_e5m2>(const void* x, size_t index) { return g_fp8.e5m2[((const uint8_t*)x)[index]]; }

template <typename T>
void unpack_rows(double* out, const void* x, size_t ld, bool trans, uint64_t rows, uint64_t k, size_t kp) {
    /* op(X)[i][p] = trans ? X[p][i] : X[i][p]; column-major X[r][c] is at r + c * ld */
    if (trans) {
        for (uint64_t i = 0; i < rows; i++)
            for (uint64_t p = 0; p < k; p++) out[i * kp + p] = element<T>(x, p + i * ld);
        return;
    }
    /* a transpose, in 64 x 64 tiles: the tile's reads and writes both stay in L1 */
    for (uint64_t i0 = 0; i0 < rows; i0 += 64)
        for (uint64_t p0 = 0; p0 < k; p0 += 64)
            for (uint64_t p = p0; p < std::min<uint64_t>(p0 + 64, k); p++)
                for (uint64_t i = i0; i < std::min<uint64_t>(i0 + 64, rows); i++) out[i * kp + p] = element<T>(x, i + p * ld);
}

/*
 * Copies op(X) (rows x k) into out row by row, so the dot products run over contiguous k; rows and k
 * are padded with zeros to multiples of `row_multiple` and LANES (an exact 0 product changes no sum).
 */
size_t unpack_op(std::vector<double>& out, const void* x, const Layout& l, bool trans, uint64_t rows, uint64_t k,
                 uint64_t row_multiple) {
    size_t kp = (k + LANES - 1) / LANES * LANES, rp = (rows + row_multiple - 1) / row_multiple * row_multiple;
    out.resize(rp * kp);
    for (uint64_t i = 0; i < rows; i++) std::fill(&out[i * kp + k], &out[i * kp + kp], 0.0);
    std::fill(&out[rows * kp], &out[rp * kp], 0.0);
    switch (l.type) {
        case CUDA_R_32F: unpack_rows<float>(out.data(), x, l.ld, trans, rows, k, kp); break;
        case CUDA_R_16BF: unpack_rows<uint16_t>(out.data(), x, l.ld, trans, rows, k, kp); break;
        case CUDA_R_8F_E4M3: unpack_rows<__nv_fp8_e4m3>(out.data(), x, l.ld, trans, rows, k, kp); break;
        case CUDA_R_8F_E5M2: unpack_rows<__nv_fp8_e5m2>(out.data(), x, l.ld, trans, rows, k, kp); break;
        default: emu_fail("cublasLtMatmul: load of type %d not emulated", (int)l.type);
    }
    return kp;
}

/*
 * acc[ii * acc_stride + jj] = (first ? 0 : acc[...]) + the products a[ii][p] b[jj][p], p < len, for a
 * TILE_I x TILE_J tile (rows `stride` apart), product p into lane p % LANES; the caller adds the lanes
 * as (s0 + s1) + (s2 + s3) once k is done. The products of BF16, FP8 and even FP32 inputs are exact in double, so a fused multiply-add
 * gives the same bits as a multiply and an add, and the result does not depend on the instruction set
 * the clone below runs. Reads only the padded scratch of unpack_op, so it is left uninstrumented (ASan
 * checks the unpacking from device memory).
 */
__attribute__((no_sanitize_address, target_clones("avx2", "default")))
void dot_tile(const double* a, const double* b, size_t stride, size_t len, lanes_t* acc, size_t acc_stride, bool first) {
    /* named accumulators, not arrays: they stay in registers (8 of the 16 vector registers); memcpy, not a
       helper: a function returning a vector would not share this clone's instruction set */
    lanes_t s00 = {}, s01 = {}, s02 = {}, s03 = {}, s10 = {}, s11 = {}, s12 = {}, s13 = {};
    lanes_t* acc1 = acc + acc_stride;
    if (!first) {
        memcpy(&s00, acc, sizeof(lanes_t)); memcpy(&s01, acc + 1, sizeof(lanes_t));
        memcpy(&s02, acc + 2, sizeof(lanes_t)); memcpy(&s03, acc + 3, sizeof(lanes_t));
        memcpy(&s10, acc1, sizeof(lanes_t)); memcpy(&s11, acc1 + 1, sizeof(lanes_t));
        memcpy(&s12, acc1 + 2, sizeof(lanes_t)); memcpy(&s13, acc1 + 3, sizeof(lanes_t));
    }
    const double *a1 = a + stride, *b1 = b + stride, *b2 = b + 2 * stride, *b3 = b + 3 * stride;
    for (size_t p = 0; p < len; p += LANES) {
        lanes_t x0, x1, y0, y1, y2, y3;
        memcpy(&x0, a + p, sizeof(lanes_t)); memcpy(&x1, a1 + p, sizeof(lanes_t));
        memcpy(&y0, b + p, sizeof(lanes_t)); memcpy(&y1, b1 + p, sizeof(lanes_t));
        memcpy(&y2, b2 + p, sizeof(lanes_t)); memcpy(&y3, b3 + p, sizeof(lanes_t));
        s00 += x0 * y0; s01 += x0 * y1; s02 += x0 * y2; s03 += x0 * y3;
        s10 += x1 * y0; s11 += x1 * y1; s12 += x1 * y2; s13 += x1 * y3;
    }
    memcpy(acc, &s00, sizeof(lanes_t)); memcpy(acc + 1, &s01, sizeof(lanes_t));
    memcpy(acc + 2, &s02, sizeof(lanes_t)); memcpy(acc + 3, &s03, sizeof(lanes_t));
    memcpy(acc1, &s10, sizeof(lanes_t)); memcpy(acc1 + 1, &s11, sizeof(lanes_t));
    memcpy(acc1 + 2, &s12, sizeof(lanes_t)); memcpy(acc1 + 3, &s13, sizeof(lanes_t));
}

/* Everything a queued GEMM needs, captured at the call. */
struct Gemm {
    Desc desc;
    Layout a, b, c, d;
    uint64_t m, n, k;
    double alpha, beta;
    const void *pa, *pb, *pc;
    void* pd;
};

/* No contraction of the epilogue (scale * dot + beta * C) into an FMA: its bits must not depend on the
   build's -march. */
__attribute__((optimize("fp-contract=off")))
void run_gemm(const Gemm& g) {
    /* scratch kept between GEMMs: the unpacked operands of the lm_head's GEMMs are tens of MiB */
    static thread_local std::vector<double> ar, bc;
    size_t kp = unpack_op(ar, g.pa, g.a, g.desc.trans_a == CUBLAS_OP_T, g.m, g.k, TILE_I);
    unpack_op(bc, g.pb, g.b, g.desc.trans_b != CUBLAS_OP_T, g.n, g.k, TILE_J); /* row j = column j of op(B) */
    /* the scales are read now, on the stream, as the GPU reads them (cublasLt.h: "Device pointer to the
       scale factor value"); NULL means 1 */
    double scale = g.alpha;
    for (int i = 0; i < 2; i++)
        if (g.desc.scale_ptr[i]) scale *= *(const float*)g.desc.scale_ptr[i];
    const float scale_f = (float)scale, beta_f = (float)g.beta;
    static thread_local lanes_t acc[BLOCK_M][BLOCK_N]; /* the lanes of one output block */
    for (uint64_t j0 = 0; j0 < g.n; j0 += BLOCK_N)
        for (uint64_t i0 = 0; i0 < g.m; i0 += BLOCK_M) {
            uint64_t i1 = std::min<uint64_t>(i0 + BLOCK_M, g.m), j1 = std::min<uint64_t>(j0 + BLOCK_N, g.n);
            for (size_t p0 = 0; p0 < kp; p0 += BLOCK_K) {
                size_t len = std::min<size_t>(BLOCK_K, kp - p0);
                for (uint64_t jt = j0; jt < j1; jt += TILE_J)
                    for (uint64_t it = i0; it < i1; it += TILE_I)
                        dot_tile(&ar[it * kp + p0], &bc[jt * kp + p0], kp, len, &acc[it - i0][jt - j0], BLOCK_N, p0 == 0);
            }
            for (uint64_t j = j0; j < j1; j++)
                for (uint64_t i = i0; i < i1; i++) {
                    const lanes_t& v = acc[i - i0][j - j0];
                    double dot = (v[0] + v[1]) + (v[2] + v[3]);
                    /* the FP32 epilogue: the accumulator rounded to FP32 first, then scaled and added to C
                       in FP32, fl(fl(scale * fl(acc)) + fl(beta * C)); so a wgrad accumulated through
                       beta = 1 equals the same product stored and then added by a kernel, as on the GPU */
                    float f = scale_f * (float)dot;
                    /* C is not read when beta is 0 (docs, cublasLtMatmul), so NaN-poisoned D/C stays harmless */
                    if (g.beta != 0.0) f += beta_f * (float)load(g.pc, g.c.type, i + j * (size_t)g.c.ld);
                    size_t at = i + j * (size_t)g.d.ld;
                    if (g.d.type == CUDA_R_32F) ((float*)g.pd)[at] = f;
                    else ((__nv_bfloat16*)g.pd)[at] = __float2bfloat16_rn(f);
                }
        }
}

size_t matrix_bytes(const Layout& l) {
    return l.rows == 0 || l.cols == 0 ? 0 : ((size_t)l.ld * (l.cols - 1) + l.rows) * type_bytes(l.type);
}

}  // namespace

extern "C" {

/* ------------------------------------------------------------------ handle and status strings */

/* A handle; the double keeps no state in it. */
cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
    if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new cublasLtContext{1};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

/* The status's enumerator name, as the real library spells it. */
const char* cublasLtGetStatusName(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
        case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
        case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
        case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
        case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
        case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
        case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
        case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
        case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

/* A one-line description of the status. */
const char* cublasLtGetStatusString(cublasStatus_t status) {
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: return "success";
        case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument";
        case CUBLAS_STATUS_NOT_SUPPORTED: return "the requested functionality is not supported";
        default: return cublasLtGetStatusName(status);
    }
}

/* The version of the toolkit headers the double was built against (major * 10000 + minor * 100 + patch). */
size_t cublasLtGetVersion(void) { return EMU_CUBLASLT_VERSION; }

/* ------------------------------------------------------------------ descriptors */

/* A matmul descriptor with cuBLASLt's defaults (no transposes, no scales, fast accumulation off). */
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale_type) {
    if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
    Desc* d = new Desc();
    d->compute = compute;
    d->scale_type = scale_type;
    *desc = reinterpret_cast<cublasLtMatmulDesc_t>(d);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
    delete desc_of(desc);
    return CUBLAS_STATUS_SUCCESS;
}

/*
 * Sets one attribute. A size other than the attribute's type returns CUBLAS_STATUS_INVALID_VALUE
 * (cublasLt.h, cublasLtMatmulDescSetAttribute); attributes the double does not emulate stop the run.
 */
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
    Desc* d = desc_of(desc);
    auto sized = [&](size_t want) { return buf != nullptr && size == want; };
    const char* api = "cublasLtMatmulDescSetAttribute";
    switch (attr) {
        case CUBLASLT_MATMUL_DESC_TRANSA:
        case CUBLASLT_MATMUL_DESC_TRANSB: /* int32_t */
            if (!sized(sizeof(int32_t))) return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "TRANSA/B size %zu", size);
            memcpy(attr == CUBLASLT_MATMUL_DESC_TRANSA ? &d->trans_a : &d->trans_b, buf, sizeof(int32_t));
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_DESC_FAST_ACCUM: /* int8_t */
            if (!sized(sizeof(int8_t))) return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "FAST_ACCUM size %zu", size);
            memcpy(&d->fast_accum, buf, 1);
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_DESC_A_SCALE_POINTER:
        case CUBLASLT_MATMUL_DESC_B_SCALE_POINTER:
        case CUBLASLT_MATMUL_DESC_C_SCALE_POINTER:
        case CUBLASLT_MATMUL_DESC_D_SCALE_POINTER: /* const void* */
            if (!sized(sizeof(void*))) return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "scale pointer size %zu", size);
            memcpy(&d->scale_ptr[attr - CUBLASLT_MATMUL_DESC_A_SCALE_POINTER], buf, sizeof(void*));
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
            if (!sized(sizeof(int32_t))) return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "SCALE_TYPE size %zu", size);
            d->scale_type = (cudaDataType_t)*(const int32_t*)buf;
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_DESC_EPILOGUE: /* uint32_t; checked against the type table, computed only if DEFAULT */
            if (!sized(sizeof(uint32_t))) return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "EPILOGUE size %zu", size);
            memcpy(&d->epilogue, buf, sizeof(uint32_t));
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: /* int32_t */
            if (!sized(sizeof(int32_t))) return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "BIAS_DATA_TYPE size %zu", size);
            memcpy(&d->bias_type, buf, sizeof(int32_t));
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET: /* a performance hint: nothing to emulate */
            if (!sized(sizeof(int32_t))) return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "SM_COUNT_TARGET size %zu", size);
            return CUBLAS_STATUS_SUCCESS;
        default:
            emu_fail("%s: attribute %d is not emulated by the cuBLASLt double", api, (int)attr);
    }
}

/* A column-major layout of rows x cols elements of `type` with column stride ld (checked when used). */
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld) {
    if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
    *layout = reinterpret_cast<cublasLtMatrixLayout_t>(new Layout{type, rows, cols, ld});
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
    delete layout_of(layout);
    return CUBLAS_STATUS_SUCCESS;
}

/* A heuristic preference with cuBLASLt's defaults: no workspace, every reduction scheme, 256-byte alignment. */
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
    if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
    *pref = reinterpret_cast<cublasLtMatmulPreference_t>(new Pref());
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
    delete pref_of(pref);
    return CUBLAS_STATUS_SUCCESS;
}

/* Sets one preference (sizes checked as cublasLt.h documents); others stop the run. */
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
    Pref* p = pref_of(pref);
    const char* api = "cublasLtMatmulPreferenceSetAttribute";
    switch (attr) {
        case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: /* uint64_t */
            if (!buf || size != sizeof(uint64_t)) return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "MAX_WORKSPACE_BYTES size %zu", size);
            memcpy(&p->max_workspace, buf, sizeof(uint64_t));
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK: /* uint32_t */
            if (!buf || size != sizeof(uint32_t)) return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "REDUCTION_SCHEME_MASK size %zu", size);
            memcpy(&p->reduction_mask, buf, sizeof(uint32_t));
            return CUBLAS_STATUS_SUCCESS;
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
        case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: /* uint32_t */
            if (!buf || size != sizeof(uint32_t)) return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "MIN_ALIGNMENT size %zu", size);
            memcpy(&p->align[attr - CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES], buf, sizeof(uint32_t));
            return CUBLAS_STATUS_SUCCESS;
        default:
            emu_fail("%s: preference %d is not emulated by the cuBLASLt double", api, (int)attr);
    }
}

/* ------------------------------------------------------------------ heuristic and matmul */

/*
 * LLM8_EMU_CUBLASLT_NO_ALGO=fp8|all: the heuristic finds no algorithm for FP8 GEMMs (fp8) or for every
 * GEMM (all), returning CUBLAS_STATUS_NOT_SUPPORTED with no result, as cuBLASLt does for a valid problem
 * it has no kernel for in the installed library on this GPU (cublasLt.h, cublasLtMatmulAlgoGetHeuristic:
 * "CUBLAS_STATUS_NOT_SUPPORTED if no heuristic function available for current configuration"). That
 * happens on real GPUs for shapes and type combinations no rule of the documentation rules out, so the
 * caller's "no algorithm" exit is a path to test (dev/test/test_emu.py); unset, nothing changes.
 */
static bool no_algorithm_asked(bool fp8) {
    const char* v = getenv("LLM8_EMU_CUBLASLT_NO_ALGO");
    if (!v || !*v) return false;
    if (strcmp(v, "all") == 0) return true;
    if (strcmp(v, "fp8") == 0) return fp8;
    emu_fail("LLM8_EMU_CUBLASLT_NO_ALGO=%s: expected fp8 or all", v);
}

/*
 * Returns one algorithm when the problem is one Hopper's cuBLASLt runs, or CUBLAS_STATUS_NOT_SUPPORTED /
 * INVALID_VALUE with no result. The algorithm records the query's workspace limit (the double assumes the
 * worst the contract allows: it needs all of it, cublasLtMatmulHeuristicResult_t.workspaceSize), the
 * alignments it was chosen for and the problem, which cublasLtMatmul checks.
 */
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t adesc,
                                              cublasLtMatrixLayout_t bdesc, cublasLtMatrixLayout_t cdesc,
                                              cublasLtMatrixLayout_t ddesc, cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* found) {
    const char* api = "cublasLtMatmulAlgoGetHeuristic";
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    /* cublasLt.h: "CUBLAS_STATUS_INVALID_VALUE if requestedAlgoCount is less or equal to zero" */
    if (requested <= 0 || !found || !results || !desc || !adesc || !bdesc || !cdesc || !ddesc || !pref)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "requested %d or a NULL argument", requested);
    *found = 0;
    const Desc& d = *desc_of(desc);
    const Layout &a = *layout_of(adesc), &b = *layout_of(bdesc), &c = *layout_of(cdesc), &dd = *layout_of(ddesc);
    const Pref& p = *pref_of(pref);
    uint64_t m, n, k;
    cublasStatus_t status = check_problem(api, d, a, b, c, dd, &m, &n, &k);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    if (is_fp8(a.type)) {
        /* Practice, not documentation: kernels chosen without scales need not work with them, so the A/B
           scale pointers must be set before the query (openxla/xla#40747, which sets dummy ones for its
           heuristic query). The double refuses the query, so the mistake cannot pass unseen. */
        if (!d.scale_ptr[0] || !d.scale_ptr[1]) /* check:scales_before_heuristic */
            return refuse(CUBLAS_STATUS_NOT_SUPPORTED, api, "FP8 heuristic query before the A/B scale pointers are set "
                          "(a kernel chosen without scales may not support them: openxla/xla#40747)");
        /* FP8 kernels need 16-byte alignment (FP8 requirements): a preference promising less finds none */
        for (int i = 0; i < 4; i++)
            if (p.align[i] < EMU_FP8_ALIGNMENT) /* check:fp8_align */
                return refuse(CUBLAS_STATUS_NOT_SUPPORTED, api, "FP8 GEMM with MIN_ALIGNMENT_%c_BYTES = %u (< 16)", "ABCD"[i], p.align[i]);
    }
    if ((p.reduction_mask & CUBLASLT_REDUCTION_SCHEME_MASK) == 0 && p.reduction_mask != 0)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "REDUCTION_SCHEME_MASK 0x%x", p.reduction_mask);
    if (no_algorithm_asked(is_fp8(a.type)))
        return refuse(CUBLAS_STATUS_NOT_SUPPORTED, api, "no algorithm, as LLM8_EMU_CUBLASLT_NO_ALGO asks (m %llu n %llu k %llu)",
                      (unsigned long long)m, (unsigned long long)n, (unsigned long long)k);
    memset(&results[0], 0, sizeof(results[0]));
    uint64_t* algo = results[0].algo.data;
    algo[ALGO_MAGIC] = EMU_ALGO_MAGIC;
    algo[ALGO_WORKSPACE] = p.max_workspace;
    algo[ALGO_ALIGN] = (uint64_t)(p.align[0] & 0xffff) | (uint64_t)(p.align[1] & 0xffff) << 16 |
                       (uint64_t)(p.align[2] & 0xffff) << 32 | (uint64_t)(p.align[3] & 0xffff) << 48;
    algo[ALGO_PROBLEM] = problem_key(d, a, b, c, dd);
    results[0].workspaceSize = p.max_workspace;
    results[0].state = CUBLAS_STATUS_SUCCESS;
    results[0].wavesCount = 1.0f;
    *found = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/*
 * D = alpha * scale_a * scale_b * op(A) op(B) + beta * C, queued on `stream`. Checks the problem again
 * (the real library refuses at the call, not only in the heuristic), the algorithm against the problem
 * and the pointers it was chosen for, the workspace, and that every matrix, scale and the workspace lie
 * in emulated device memory. Returns the refusal's status without queueing anything.
 */
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t adesc, const void* B, cublasLtMatrixLayout_t bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t cdesc, void* D, cublasLtMatrixLayout_t ddesc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
    const char* api = "cublasLtMatmul";
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!desc || !adesc || !bdesc || !cdesc || !ddesc || !alpha || !beta || !A || !B || !D)
        return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "a NULL argument");
    Gemm g;
    g.desc = *desc_of(desc);
    g.a = *layout_of(adesc);
    g.b = *layout_of(bdesc);
    g.c = *layout_of(cdesc);
    g.d = *layout_of(ddesc);
    cublasStatus_t status = check_problem(api, g.desc, g.a, g.b, g.c, g.d, &g.m, &g.n, &g.k);
    if (status != CUBLAS_STATUS_SUCCESS) return status;
    if (g.desc.epilogue != CUBLASLT_EPILOGUE_DEFAULT) emu_fail("%s: epilogue %u is not emulated", api, g.desc.epilogue);
    bool fp8 = is_fp8(g.a.type);
    if (fp8) {
        /* FP8 requirements: "pointers ... must support 16-byte alignment" */
        const void* ptrs[4] = {A, B, C, D};
        for (int i = 0; i < 4; i++)
            if (ptrs[i] && alignment_of(ptrs[i]) < EMU_FP8_ALIGNMENT) /* check:fp8_ptr_align */
                return refuse(CUBLAS_STATUS_NOT_SUPPORTED, api, "FP8 GEMM with %c at %p, not 16-byte aligned", "ABCD"[i], ptrs[i]);
    }
    /* the docs' in-place rule (C == D needs ldc == ldd and the same type; enforced since CUDA 13, see
       openxla/xla#34912) */
    if (C == D && !same_layout(g.c, g.d)) /* check:in_place */
        return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "C == D with different C and D layouts");
    size_t need_workspace = 0;
    if (algo) {
        const uint64_t* data = algo->data;
        if (data[ALGO_MAGIC] != EMU_ALGO_MAGIC) emu_fail("%s: the algorithm did not come from cublasLtMatmulAlgoGetHeuristic", api);
        if (data[ALGO_PROBLEM] != problem_key(g.desc, g.a, g.b, g.c, g.d))
            emu_fail("%s: the algorithm was chosen for another problem (types, shapes, transposes, fast accumulation or "
                     "which scale pointers are set differ; cuBLASLt does not promise it runs this one)", api);
        const void* ptrs[4] = {A, B, C, D};
        for (int i = 0; i < 4; i++) {
            unsigned promised = (unsigned)(data[ALGO_ALIGN] >> (16 * i) & 0xffff);
            /* cublasLt.h, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*: the algorithm may need the promised alignment */
            if (ptrs[i] && alignment_of(ptrs[i]) < promised)
                emu_fail("%s: %c at %p is %u-byte aligned but its algorithm was chosen for %u bytes "
                         "(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES; a GPU may fault with a misaligned address)",
                         api, "ABCD"[i], ptrs[i], alignment_of(ptrs[i]), promised, "ABCD"[i]);
        }
        need_workspace = data[ALGO_WORKSPACE];
    }
    /* cublasLt.h, cublasLtMatmul: "CUBLAS_STATUS_INVALID_VALUE ... when workspaceSizeInBytes is less than
       workspace required by configured algo" */
    if (workspace_bytes < need_workspace || (need_workspace > 0 && !workspace)) /* check:workspace */
        return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "workspace %p of %zu bytes, the algorithm may use %zu", workspace,
                      workspace_bytes, need_workspace);
    g.alpha = *(const float*)alpha; /* CUBLASLT_POINTER_MODE_HOST: read at the call */
    g.beta = *(const float*)beta;
    g.pa = A;
    g.pb = B;
    g.pc = g.beta != 0.0 ? C : nullptr;
    g.pd = D;
    if (g.beta != 0.0 && !C) return refuse(CUBLAS_STATUS_INVALID_VALUE, api, "beta != 0 with C NULL");
    /* a GPU faults on host memory or a range past its allocation; name the operand instead */
    struct { const void* p; size_t bytes; const char* what; } spans[] = {
        {A, matrix_bytes(g.a), "A"}, {B, matrix_bytes(g.b), "B"}, {g.pc, g.pc ? matrix_bytes(g.c) : 0, "C"},
        {D, matrix_bytes(g.d), "D"}, {g.desc.scale_ptr[0], sizeof(float), "the A scale"},
        {g.desc.scale_ptr[1], sizeof(float), "the B scale"}, {workspace_bytes ? workspace : nullptr, workspace_bytes, "the workspace"}};
    for (auto& s : spans)
        if (s.p && !emu_is_device_ptr(s.p, s.bytes))
            emu_fail("%s: %s (%p, %zu bytes) is not inside one emulated device allocation", api, s.what, s.p, s.bytes);
    emu_stream_enqueue(stream, [g]() { run_gemm(g); });
    return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
