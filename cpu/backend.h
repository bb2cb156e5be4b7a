/*
 * The CPU backend: llama/backend.h's contract in FP32 with OpenMP over rows and the FP8 library's CPU
 * emulation (fp8/cast_cpu.h, fp8/gemm_cpu.h: OpenBLAS GEMMs). It is the reference the GPU build is checked
 * against, so it emulates the GPU's numerics: in -p bf16 and fp8 every op rounds the values it stores to
 * BF16 (bf16_round) exactly where the GPU stores BF16, FP8 operands go through the same casts, and an FP8
 * GEMM multiplies the exact FP8 values with FP32 accumulation before applying scale_inv_a * scale_inv_b,
 * as cuBLASLt does. The casts are bit-identical to the GPU's; the rest differs in the last bits:
 * summation order, the tensor cores' accumulators (FP8 fast accumulation), cuDNN's flash attention
 * rounding P and dS to BF16, RMSNorm and softmax sums in double here against FP32 there, and glibc's expf
 * against CUDA's. dev/cuda/kernel_cases.cuh states each op's tolerance. Reductions use fixed chunking
 * and GEMMs fixed tiles of single-threaded BLAS calls (fp8/gemm_cpu.h), so results do not depend on the
 * thread count (they do on the BLAS kernel, which the ranks compare at start-up) and a resumed run
 * repeats the uninterrupted one bit for bit. Sections follow the GPU kernel files of cuda/ and the op families of dev/cuda.
 */
#pragma once

#include <math.h>
#include <omp.h>
#include <sys/mman.h>

#include "../core/common.h"
#include "../core/op_record.h"
#include "../fp8/cast_cpu.h"
#include "../fp8/gemm_cpu.h"

/* Activations and working weights are floats here, rounded to BF16 values in -p bf16 and fp8. */
typedef float act_t;
#define LLM8_BACKEND "cpu"
#define LLM8_BACKEND_MATH "BLAS (its OPENBLAS_* variables must reach every rank: mpirun -x)"
/* The CPU emulation can model Hopper's FP8 accumulation (--fp8-accum hopper, fp8/gemm_hopper.h). */
#define BACKEND_MODELS_FP8_ACCUM 1
/* Nothing is loaded or planned at first use here: no warm-up before the steps. */
#define BACKEND_WARMS_UP 0
/* The ops record themselves (core/op_record.h): --dry-run 2 and LLM8_TRACE_OPS run here. */
#define BACKEND_RECORDS 1

#include "../llama/backend.h"
#include "../llama/op_math.h"
#include "../llama/optim.h"

static int g_round_bf16 = 0; /* set by backend_init from -p: activations are stored as BF16 values */

static inline float store(float x) { return g_round_bf16 ? bf16_round(x) : x; }

/* store(x), its magnitude folded into a producer's fused amax (amax_combine: NaN wins, as fp8_amax_cpu). */
static inline float store_amax(float x, float* amax) {
    float y = store(x);
    *amax = amax_combine(*amax, fabsf(y));
    return y;
}

/* OpenMP reduction `amax`: fp8.h's amax_combine (NaN wins), so a fused amax equals fp8_amax_cpu's in any order. */
#pragma omp declare reduction(amax : float : omp_out = amax_combine(omp_out, omp_in)) initializer(omp_priv = 0.0f)

/* The GPU's attention statistics (cuda/backend.cuh att_stats_size: a log-sum-exp per row), bytes. */
#define ATT_STATS_GPU(B, NH, T) (4.0 * (double)(B) * (NH) * (T))

/* Causal attention's matrix FLOPs (Dao 2022, FlashAttention-2 section 4): forward q k^T and p v, each
   2 B NH T^2 HS, halved by the mask; backward five such products (s recomputed, dv, dp, dq, dk). */
static inline double attention_flops(int B, int T, int NH, int HS, int backward) {
    return (backward ? 5.0 : 2.0) * 2.0 * B * NH * (double)T * T * HS / 2.0;
}

/* ---------------------------------------------------------------- memory (host memory here) */

/* Plan-only mode maps the buffers without backing them (MAP_NORESERVE): the ops skip them, and the host
   code that reads one reads zero pages, so a 7B step is listed in little memory; they are never freed. */
static inline void* dev_alloc(size_t bytes) {
    void* p = NULL;
    if (g_record_mode == RECORD_PLAN) {
        p = mmap(NULL, bytes > 0 ? bytes : 64, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) die("plan: cannot map %.1f MiB of address space (%s)", mib(bytes), strerror(errno));
        return p;
    }
    if (posix_memalign(&p, 64, bytes > 0 ? bytes : 64) != 0) die("out of host memory allocating %.1f MiB", mib(bytes));
    return p;
}
static inline void dev_free(void* p) {
    if (g_record_mode != RECORD_PLAN) free(p);
}
static inline void dev_upload(void* dst, const void* src, size_t bytes) {
    RECORD("upload", "host", {bytes}, 0, bytes, 0, "");
    memcpy(dst, src, bytes);
}
static inline void dev_download(void* dst, const void* src, size_t bytes) {
    if (op_record((OpRecord){"download", "host", {bytes}, bytes, 0, 0, ""})) {
        memset(dst, 0, bytes); /* plan: what a read-back of untouched buffers would give */
        return;
    }
    memcpy(dst, src, bytes);
}
static inline void dev_zero(void* p, size_t bytes) {
    RECORD("zero", "kernel", {bytes}, 0, op_record_bytes(p, bytes), 0, "");
    memset(p, 0, bytes);
}
static inline void dev_copy(void* dst, const void* src, size_t bytes) {
    RECORD("copy", "kernel", {bytes}, op_record_bytes(src, bytes), op_record_bytes(dst, bytes), 0, "");
    memcpy(dst, src, bytes);
}
static inline void dev_upload_async(void* dst, const void* src, size_t bytes) {
    RECORD("upload_async", "host", {bytes}, 0, bytes, 0, "");
    memcpy(dst, src, bytes);
}
static inline void act_to_float_host(float* out, const act_t* x, size_t n) {
    if (op_record((OpRecord){"act_to_float_host", "host", {n}, RECORD_ACT_BYTES * n, 0, 0, ""})) {
        memset(out, 0, n * sizeof(float));
        return;
    }
    memcpy(out, x, n * sizeof(float));
}

/* ---------------------------------------------------------------- backend */

static inline void backend_init(Precision p) { g_round_bf16 = p != PRECISION_FP32; }
static inline void backend_synchronize(void) {}
static inline const char* backend_name(void) { return "cpu"; }
static inline void backend_math_identity(char* out, size_t len) { gemm_cpu_blas_identity(out, len); }
/* No meaningful peak for a CPU: MFU is reported as 0. */
static inline double backend_peak_flops(Precision p) {
    (void)p;
    return 0.0;
}
static inline double backend_memory_mib(void) { return 0.0; }
static inline int backend_memory_usage(size_t* ours, size_t* in_use) {
    *ours = *in_use = 0;
    return 0;
}
static inline void backend_load_kernels(void) {}
static inline void backend_range_push(const char* name) { (void)name; }
static inline void backend_range_pop(void) {}
/* Host RAM (the CPU build trains in host memory). */
static inline size_t backend_memory_total(const char** what) {
    *what = "host RAM";
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
}

/* The grow-only scratch of the emulated GEMMs (fp8/gemm_cpu.h decodes FP8 operands to floats, the Hopper
   model of --fp8-accum hopper to significands and exponents, and computes an accumulating product apart)
   and the embedding backward's sort. */
static inline int backend_workspaces(const WorkspaceQuery* q, MemoryEstimate* out) {
    const LlamaConfig* c = q->cfg;
    size_t N = (size_t)q->B * q->T, C = (size_t)c->dim, F = (size_t)c->ffn_dim, V = (size_t)c->vocab_size;
    size_t QKV = (size_t)llama_qkv_dim(c);
    size_t out_max = QKV > 2 * F ? QKV : 2 * F, in_max = C > F ? C : F; /* widest OC and C of the block's linears */
    int n = 0;
    if (q->precision == PRECISION_FP8) {
        /* A: W or W^T (OC C) or X^T (C N); B: X (N C), dY or dY^T (N OC) */
        size_t a = out_max * C > N * in_max ? out_max * C : N * in_max;
        out[n++] = (MemoryEstimate){"gemm_decode_a", a * sizeof(float), 0, "FP8 GEMM A operand decoded to floats", NULL};
        out[n++] = (MemoryEstimate){"gemm_decode_b", N * (out_max > in_max ? out_max : in_max) * sizeof(float), 0,
                                    "FP8 GEMM B operand decoded to floats", NULL};
        if (q->fp8_accum == FP8_ACCUM_HOPPER) {
            /* gemm_hopper: 2 (m + n) k bytes; fprop (OC + N) C, dgrad (C + N) OC, wgrad (C + OC) N per linear */
            const size_t dims[4][2] = {{QKV, C}, {C, C}, {2 * F, C}, {C, F}}; /* (OC, C): wqkv, wo, w13, w2 */
            size_t most = 0;
            for (int l = 0; l < 4; l++) {
                size_t oc = dims[l][0], ic = dims[l][1];
                size_t per[3] = {(oc + N) * ic, (ic + N) * oc, (ic + oc) * N};
                for (int g = 0; g < 3; g++) most = per[g] > most ? per[g] : most;
            }
            out[n++] = (MemoryEstimate){"gemm_hopper", 2 * most, 0,
                                        "FP8 GEMM operands decoded for the Hopper model (--fp8-accum hopper)", NULL};
        }
    }
    out[n++] = (MemoryEstimate){"gemm_accumulate", (out_max > V ? out_max : V) * C * sizeof(float), 0,
                                "a wgrad's product before it is added (the largest weight)", NULL};
    out[n++] = (MemoryEstimate){"encoder_backward", 2 * N * sizeof(int) + (N + 1) * sizeof(size_t), 0,
                                "embedding backward: (token, position) sort and bucket starts", NULL};
    return n;
}

/* The CPU's scratch is host memory the ops grow themselves: nothing to size. */
static inline void backend_reserve_workspaces(const MemoryEstimate* ws, int n, size_t tokens) {
    (void)ws;
    (void)n;
    (void)tokens;
}

/* Attention backward reads the softmax probabilities: (B, NH, T, T) floats per layer. */
static inline size_t att_stats_size(size_t B, int NH, int T) { return B * (size_t)NH * (size_t)T * (size_t)T; }

/* ---------------------------------------------------------------- profiling (wall clock: every op is synchronous) */

static int g_prof_on = 0;
static double g_prof_ms[PROF_PHASES];
static double g_prof_started[PROF_PHASES]; /* wall_seconds() of the open interval, -1 when none is open */

static inline void backend_profile_begin(void) {
    g_prof_on = 1;
    for (int p = 0; p < PROF_PHASES; p++) {
        g_prof_ms[p] = 0.0;
        g_prof_started[p] = -1.0;
    }
}

static inline void backend_timer_start(ProfPhase p) {
    if (p != PROF_FP8_CAST) op_record_phase(PROF_PHASE_NAMES[p]);
    if (!g_prof_on) return;
    if (g_prof_started[p] >= 0.0) die("profiling: phase %s started twice", PROF_PHASE_NAMES[p]);
    g_prof_started[p] = wall_seconds();
}

static inline void backend_timer_stop(ProfPhase p) {
    if (p != PROF_FP8_CAST) op_record_phase("step");
    if (!g_prof_on) return;
    if (g_prof_started[p] < 0.0) die("profiling: phase %s stopped without a start", PROF_PHASE_NAMES[p]);
    g_prof_ms[p] += 1e3 * (wall_seconds() - g_prof_started[p]);
    g_prof_started[p] = -1.0;
}

static inline void backend_profile_end(double* ms) {
    for (int p = 0; p < PROF_PHASES; p++) ms[p] = g_prof_on ? g_prof_ms[p] : 0.0;
    g_prof_on = 0;
}

/* ---------------------------------------------------------------- elementwise and row ops */

/* out (n) = master rounded to the activation type. */
static inline void op_params_from_master(act_t* out, const float* master, size_t n) {
    RECORD("params_from_master", "kernel", {n}, 4.0 * n, RECORD_ACT_BYTES * n, 0, "");
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = store(master[i]);
}

/* out (N, C) = wte[tokens] with wte (V, C). */
static inline void op_encoder_forward(act_t* out, const int* tokens, const act_t* wte, size_t N, int C) {
    RECORD("encoder_forward", "kernel", {N, C}, 4.0 * N + RECORD_ACT_BYTES * N * C, RECORD_ACT_BYTES * N * C, 0, "");
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) memcpy(out + i * C, wte + (size_t)tokens[i] * C, (size_t)C * sizeof(act_t));
}

/*
 * dwte (V, C) += scatter of dout (N, C) by tokens. The positions are bucketed by token (sorted by
 * (token, position)); each distinct token's rows are summed in position order, then added to dwte, so
 * the result is dwte + (this call's sum), as the contract asks, whatever the thread count.
 */
static int cmp_token_position(const void* a, const void* b) {
    const int* x = (const int*)a;
    const int* y = (const int*)b;
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

static inline void op_encoder_backward(float* dwte, const act_t* dout, const int* tokens, const int* tokens_host, size_t N,
                                       int C) {
    RECORD("encoder_backward", "kernel", {N, C}, (RECORD_ACT_BYTES + 4.0) * N * C + 4.0 * N, 4.0 * N * C, 0, "");
    (void)tokens_host;
    int* order = (int*)mallocCheck(2 * N * sizeof(int) + 1); /* (token, position) pairs */
    for (size_t i = 0; i < N; i++) {
        order[2 * i] = tokens[i];
        order[2 * i + 1] = (int)i;
    }
    qsort(order, N, 2 * sizeof(int), cmp_token_position);
    size_t* starts = (size_t*)mallocCheck((N + 1) * sizeof(size_t));
    size_t buckets = 0;
    for (size_t k = 0; k < N; k++) {
        if (k == 0 || order[2 * k] != order[2 * k - 2]) starts[buckets++] = k;
    }
    starts[buckets] = N;
#pragma omp parallel for schedule(static)
    for (size_t u = 0; u < buckets; u++) {
        float* row = dwte + (size_t)order[2 * starts[u]] * C;
        for (int c = 0; c < C; c++) {
            float sum = 0.0f;
            for (size_t k = starts[u]; k < starts[u + 1]; k++) sum += dout[(size_t)order[2 * k + 1] * C + c];
            row[c] += sum;
        }
    }
    free(order);
    free(starts);
}

/* One row of RMSNorm: returns rstd = 1 / sqrt(mean(x^2) + eps) (HF LlamaRMSNorm), sum in double. */
static inline float rms_rstd(const act_t* x, int C, float eps) {
    double ss = 0.0;
    for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
    return (float)(1.0 / sqrt(ss / C + (double)eps));
}

/* out (N, C) = inp * rstd * weight, rstd (N) = 1 / rms(inp). */
static inline void op_rmsnorm_forward(act_t* out, float* rstd, const act_t* inp, const act_t* weight, size_t N, int C,
                                      float eps, Fp8Scale* amax) {
    RECORD("rmsnorm_forward", "kernel", {N, C}, RECORD_ACT_BYTES * (N * C + C), RECORD_ACT_BYTES * N * C + 4.0 * N, 0, "");
    float a = 0.0f;
#pragma omp parallel for schedule(static) reduction(amax : a)
    for (size_t i = 0; i < N; i++) {
        const act_t* x = inp + i * C;
        float r = rms_rstd(x, C, eps);
        rstd[i] = r;
        for (int c = 0; c < C; c++) {
            out[i * C + c] = store_amax(x[c] * r * weight[c], &a);
        }
    }
    if (amax) amax->amax = a;
}

/* resid_out (N, C) = resid_in + branch (stored), then norm_out, rstd = RMSNorm(resid_out) as above. */
static inline void op_residual_rmsnorm_forward(act_t* resid_out, act_t* norm_out, float* rstd, const act_t* resid_in,
                                               const act_t* branch, const act_t* weight, size_t N, int C, float eps,
                                               Fp8Scale* amax) {
    RECORD("residual_rmsnorm_forward", "kernel", {N, C}, RECORD_ACT_BYTES * (2.0 * N * C + C),
           2.0 * RECORD_ACT_BYTES * N * C + 4.0 * N, 0, "");
    float a = 0.0f;
#pragma omp parallel for schedule(static) reduction(amax : a)
    for (size_t i = 0; i < N; i++) {
        act_t* x = resid_out + i * C;
        for (int c = 0; c < C; c++) x[c] = store(resid_in[i * C + c] + branch[i * C + c]);
        float r = rms_rstd(x, C, eps);
        rstd[i] = r;
        for (int c = 0; c < C; c++) {
            norm_out[i * C + c] = store_amax(x[c] * r * weight[c], &a);
        }
    }
    if (amax) amax->amax = a;
}

/*
 * RMSNorm backward. With xh = x * rstd and y = xh * w: dweight (C) += sum_i dout * xh;
 * dinp (N, C) += rstd * (g - xh * mean(g * xh)) with g = dout * w.
 */
static inline void op_rmsnorm_backward(act_t* dinp, float* dweight, const act_t* dout, const act_t* inp,
                                       const act_t* weight, const float* rstd, size_t N, int C) {
    RECORD("rmsnorm_backward", "kernel", {N, C}, RECORD_ACT_BYTES * (3.0 * N * C + C) + 4.0 * (N + C),
           RECORD_ACT_BYTES * N * C + 4.0 * C, 0, "");
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        const act_t* x = inp + i * C;
        const act_t* dy = dout + i * C;
        float r = rstd[i];
        double dot = 0.0;
        for (int c = 0; c < C; c++) dot += (double)dy[c] * weight[c] * (x[c] * r);
        float mean = (float)(dot / C);
        for (int c = 0; c < C; c++) {
            dinp[i * C + c] = store(dinp[i * C + c] + rmsnorm_dx(dy[c], weight[c], x[c] * r, r, mean));
        }
    }
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        float s = 0.0f;
        for (size_t i = 0; i < N; i++) s += dout[i * C + c] * (inp[i * C + c] * rstd[i]);
        dweight[c] += s;
    }
}

/*
 * RoPE, HF rotate-half convention, in place on the q (NH heads) and k (NKV heads) parts of qkv
 * (B, T, QKV): for i < HS/2, (x_i, x_{i+HS/2}) rotates by the angle pos * theta^(-2i/HS).
 * direction +1: forward; -1: backward (the transpose rotation, applied to gradients).
 */
static inline void rope_apply(act_t* qkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV, int HS,
                              float direction) {
    int half = HS / 2, heads = NH + NKV;
    size_t QKV = (size_t)(NH + 2 * NKV) * HS;
#pragma omp parallel for schedule(static)
    for (long long bt = 0; bt < (long long)B * T; bt++) {
        int t = (int)(bt % T);
        act_t* row = qkv + (size_t)bt * QKV;
        for (int h = 0; h < heads; h++) {
            act_t* v = row + (size_t)h * HS; /* q heads then k heads are contiguous */
            for (int i = 0; i < half; i++) {
                float c = cos_t[t * half + i], s = direction * sin_t[t * half + i];
                float o1, o2;
                rope_rotate(v[i], v[i + half], c, s, &o1, &o2);
                v[i] = store(o1);
                v[i + half] = store(o2);
            }
        }
    }
}

static inline void op_rope_forward(act_t* qkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV,
                                   int HS) {
    RECORD("rope_forward", "kernel", {B, T, NH, NKV, HS}, RECORD_ACT_BYTES * B * T * (NH + NKV) * HS + 4.0 * T * HS,
           RECORD_ACT_BYTES * B * T * (NH + NKV) * HS, 0, "");
    rope_apply(qkv, cos_t, sin_t, B, T, NH, NKV, HS, 1.0f);
}

static inline void op_rope_backward(act_t* dqkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV,
                                    int HS) {
    RECORD("rope_backward", "kernel", {B, T, NH, NKV, HS}, RECORD_ACT_BYTES * B * T * (NH + NKV) * HS + 4.0 * T * HS,
           RECORD_ACT_BYTES * B * T * (NH + NKV) * HS, 0, "");
    rope_apply(dqkv, cos_t, sin_t, B, T, NH, NKV, HS, -1.0f);
}

static inline void op_attention_prepare(const AttentionShape* shapes, int n, int NH, int NKV, int HS) {
    (void)shapes, (void)n, (void)NH, (void)NKV, (void)HS; /* the probabilities live in the activations */
}

/*
 * Causal attention with grouped-query heads: qkv (B, T, QKV) rows [q (NH*HS) | k (NKV*HS) | v (NKV*HS)],
 * query head h reads kv head h / (NH / NKV) (HF repeat_kv); out (B, T, NH*HS) = softmax(q k^T / sqrt(HS)) v.
 * probs (B, NH, T, T) keeps the softmax for backward (zeros above the diagonal).
 */
static inline void op_attention_forward(act_t* out, float* probs, const act_t* qkv, int B, int T, int NH, int NKV, int HS) {
    RECORD("attention_forward", "kernel", {B, T, NH, NKV, HS}, RECORD_ACT_BYTES * B * T * (NH + 2 * NKV) * HS,
           RECORD_ACT_BYTES * B * T * NH * HS + ATT_STATS_GPU(B, NH, T), attention_flops(B, T, NH, HS, 0), "");
    size_t C = (size_t)NH * HS, KVC = (size_t)NKV * HS, QKV = C + 2 * KVC;
    int group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int h = 0; h < NH; h++) {
            int kvh = h / group;
            for (int t = 0; t < T; t++) {
                const act_t* q = qkv + ((size_t)b * T + t) * QKV + (size_t)h * HS;
                float* p = probs + (((size_t)b * NH + h) * T + t) * T;
                float maxv = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    const act_t* k = qkv + ((size_t)b * T + s) * QKV + C + (size_t)kvh * HS;
                    float dot = 0.0f;
                    for (int d = 0; d < HS; d++) dot += q[d] * k[d];
                    p[s] = dot * scale;
                    if (p[s] > maxv) maxv = p[s];
                }
                float sum = 0.0f;
                for (int s = 0; s <= t; s++) {
                    p[s] = expf(p[s] - maxv);
                    sum += p[s];
                }
                for (int s = 0; s <= t; s++) p[s] /= sum;
                for (int s = t + 1; s < T; s++) p[s] = 0.0f;
                act_t* o = out + ((size_t)b * T + t) * C + (size_t)h * HS;
                for (int d = 0; d < HS; d++) {
                    float acc = 0.0f;
                    for (int s = 0; s <= t; s++) acc += p[s] * qkv[((size_t)b * T + s) * QKV + C + KVC + (size_t)kvh * HS + d];
                    o[d] = store(acc);
                }
            }
        }
    }
}

/*
 * Attention backward: dqkv (B, T, QKV) = gradients of q, k, v given dout (B, T, C) and the saved probs.
 * dS = P * (dP - rowsum(P * dP)) with dP = dout v^T; dq = dS k / sqrt(HS), dk = dS^T q / sqrt(HS),
 * dv = P^T dout; k and v gradients sum over the query heads of their group. out is unused here (cuDNN
 * needs it); it is in the signature so that both backends take the same arguments.
 */
static inline void op_attention_backward(act_t* dqkv, const act_t* dout, const act_t* qkv, const act_t* out,
                                         const float* probs, int B, int T, int NH, int NKV, int HS) {
    RECORD("attention_backward", "kernel", {B, T, NH, NKV, HS},
           RECORD_ACT_BYTES * B * T * (NH + 2 * NKV + 2 * NH) * HS + ATT_STATS_GPU(B, NH, T),
           RECORD_ACT_BYTES * B * T * (NH + 2 * NKV) * HS, attention_flops(B, T, NH, HS, 1), "");
    (void)out;
    size_t C = (size_t)NH * HS, KVC = (size_t)NKV * HS, QKV = C + 2 * KVC;
    int group = NH / NKV;
    float scale = 1.0f / sqrtf((float)HS);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int kvh = 0; kvh < NKV; kvh++) {
            float* dk = (float*)callocCheck((size_t)T * HS, sizeof(float));
            float* dv = (float*)callocCheck((size_t)T * HS, sizeof(float));
            float* dq = (float*)mallocCheck((size_t)HS * sizeof(float));
            float* dp = (float*)mallocCheck((size_t)T * sizeof(float));
            for (int h = kvh * group; h < (kvh + 1) * group; h++) {
                for (int t = 0; t < T; t++) {
                    const act_t* q = qkv + ((size_t)b * T + t) * QKV + (size_t)h * HS;
                    const act_t* go = dout + ((size_t)b * T + t) * C + (size_t)h * HS;
                    const float* p = probs + (((size_t)b * NH + h) * T + t) * T;
                    float rowsum = 0.0f;
                    for (int s = 0; s <= t; s++) {
                        const act_t* v = qkv + ((size_t)b * T + s) * QKV + C + KVC + (size_t)kvh * HS;
                        float dot = 0.0f;
                        for (int d = 0; d < HS; d++) dot += go[d] * v[d];
                        dp[s] = dot;
                        rowsum += p[s] * dot;
                    }
                    for (int d = 0; d < HS; d++) dq[d] = 0.0f;
                    for (int s = 0; s <= t; s++) {
                        const act_t* k = qkv + ((size_t)b * T + s) * QKV + C + (size_t)kvh * HS;
                        float ds = p[s] * (dp[s] - rowsum) * scale;
                        for (int d = 0; d < HS; d++) {
                            dq[d] += ds * k[d];
                            dk[(size_t)s * HS + d] += ds * q[d];
                            dv[(size_t)s * HS + d] += p[s] * go[d];
                        }
                    }
                    act_t* dqo = dqkv + ((size_t)b * T + t) * QKV + (size_t)h * HS;
                    for (int d = 0; d < HS; d++) dqo[d] = store(dq[d]);
                }
            }
            for (int s = 0; s < T; s++) {
                act_t* row = dqkv + ((size_t)b * T + s) * QKV;
                for (int d = 0; d < HS; d++) {
                    row[C + (size_t)kvh * HS + d] = store(dk[(size_t)s * HS + d]);
                    row[C + KVC + (size_t)kvh * HS + d] = store(dv[(size_t)s * HS + d]);
                }
            }
            free(dk);
            free(dv);
            free(dq);
            free(dp);
        }
    }
}

/* out (N, F) = silu(a) * b with inp (N, 2F) = [a | b] per row (SwiGLU, Shazeer 2020). */
static inline void op_swiglu_forward(act_t* out, const act_t* inp, size_t N, int F, Fp8Scale* amax) {
    RECORD("swiglu_forward", "kernel", {N, F}, RECORD_ACT_BYTES * N * 2 * F, RECORD_ACT_BYTES * N * F, 0, "");
    float a = 0.0f;
#pragma omp parallel for schedule(static) reduction(amax : a)
    for (size_t i = 0; i < N; i++) {
        for (int j = 0; j < F; j++) {
            out[i * F + j] = store_amax(swiglu(inp[i * 2 * F + j], inp[i * 2 * F + F + j]), &a);
        }
    }
    if (amax) amax->amax = a;
}

/* dinp (N, 2F) = [dout * b * silu'(a) | dout * silu(a)], silu'(a) = s (1 + a (1 - s)), s = sigmoid(a). */
static inline void op_swiglu_backward(act_t* dinp, const act_t* dout, const act_t* inp, size_t N, int F) {
    RECORD("swiglu_backward", "kernel", {N, F}, RECORD_ACT_BYTES * N * 3 * F, RECORD_ACT_BYTES * N * 2 * F, 0, "");
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        for (int j = 0; j < F; j++) {
            float da, db;
            swiglu_backward(inp[i * 2 * F + j], inp[i * 2 * F + F + j], dout[i * F + j], &da, &db);
            dinp[i * 2 * F + j] = store(da);
            dinp[i * 2 * F + F + j] = store(db);
        }
    }
}

/*
 * Fused softmax cross-entropy: losses (N) = logsumexp(logits_i) - logits_i[target_i]; logits (N, V) is
 * overwritten with dloss * (softmax(logits_i) - onehot(target_i)).
 */
static inline void op_classifier(act_t* logits, float* losses, const int* targets, size_t N, int V, float dloss) {
    RECORD("classifier", "kernel", {N, V}, RECORD_ACT_BYTES * N * V + 4.0 * N, RECORD_ACT_BYTES * N * V + 4.0 * N, 0, "");
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < N; i++) {
        act_t* x = logits + i * V;
        float maxv = -INFINITY;
        for (int v = 0; v < V; v++) maxv = x[v] > maxv ? x[v] : maxv;
        double sum = 0.0;
        for (int v = 0; v < V; v++) sum += exp((double)(x[v] - maxv));
        float lse = maxv + (float)log(sum);
        losses[i] = lse - x[targets[i]];
        for (int v = 0; v < V; v++) {
            float p = expf(x[v] - lse);
            x[v] = store((p - (v == targets[i] ? 1.0f : 0.0f)) * dloss);
        }
    }
}

/* ---------------------------------------------------------------- reductions and optimizer */

static inline void op_sum_squares_chunks(double* partials, const float* x, size_t n, size_t chunk) {
    RECORD("sum_squares_chunks", "kernel", {n, chunk}, 4.0 * n, 8.0 * ceil_div(n, chunk), 0, "");
    size_t chunks = ceil_div(n, chunk);
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        size_t end = (k + 1) * chunk < n ? (k + 1) * chunk : n;
        double s = 0.0;
        for (size_t i = k * chunk; i < end; i++) s += (double)x[i] * x[i];
        partials[k] = s;
    }
}

/* In index order. */
static inline double op_sum_f64(const double* x, size_t n) {
    if (op_record((OpRecord){"sum_f64", "host", {n}, 8.0 * n, 0, 0, ""})) return 0.0;
    double total = 0.0;
    for (size_t i = 0; i < n; i++) total += x[i];
    return total;
}

static inline void op_sum_f32_in_order(double* sum, const float* x, size_t n) {
    RECORD("sum_f32_in_order", "kernel", {n}, 4.0 * n, 8.0, 0, "");
    double total = 0.0;
    for (size_t i = 0; i < n; i++) total += x[i];
    *sum = total;
}

/* AdamW on n parameters (optim.h's adamw_update), gradients multiplied by grad_scale: FP32 moments in
   place; the others one chunk of ADAMW_CHUNK elements at a time: decode, update in FP32, then (fp8) the
   chunk's scales from the new values' amax, and encode. */
static inline void op_adamw(float* master, AdamwMoments s, const float* grads, size_t n, float lr, float wd, float bc1,
                            float bc2_sqrt, float grad_scale) {
    RECORD("adamw", "kernel", {n},
           (8.0 + adamw_moment_bytes(s.format, 0) + adamw_moment_bytes(s.format, 1)) * n + 4.0 * adamw_scale_count(s.format, n),
           (4.0 + adamw_moment_bytes(s.format, 0) + adamw_moment_bytes(s.format, 1)) * n + 4.0 * adamw_scale_count(s.format, n),
           0, optim_state_name(s.format));
    if (s.format == OPTIM_STATE_FP32) { /* the default: in place, no decode, no chunk buffers */
        float *m = (float*)s.m, *v = (float*)s.v;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) adamw_update(&master[i], &m[i], &v[i], grads[i] * grad_scale, lr, wd, bc1, bc2_sqrt);
        return;
    }
    size_t chunks = ceil_div(n, ADAMW_CHUNK);
    int fp8 = s.format == OPTIM_STATE_FP8;
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        float mt[ADAMW_CHUNK], vt[ADAMW_CHUNK];
        size_t begin = k * ADAMW_CHUNK, len = n - begin < ADAMW_CHUNK ? n - begin : ADAMW_CHUNK;
        float sinv_m = fp8 ? s.scale_inv[2 * k] : 1.0f, sinv_v = fp8 ? s.scale_inv[2 * k + 1] : 1.0f;
        float amax_m = 0.0f, amax_v = 0.0f;
        for (size_t j = 0; j < len; j++) {
            size_t i = begin + j;
            mt[j] = adamw_moment_load(&s, 0, i, sinv_m);
            vt[j] = adamw_moment_load(&s, 1, i, sinv_v);
            adamw_update(&master[i], &mt[j], &vt[j], grads[i] * grad_scale, lr, wd, bc1, bc2_sqrt);
            amax_m = fmaxf(amax_m, fabsf(mt[j]));
            amax_v = fmaxf(amax_v, fabsf(vt[j]));
        }
        float scale_m = fp8 ? adamw_moment_scale(0, amax_m) : 1.0f, scale_v = fp8 ? adamw_moment_scale(1, amax_v) : 1.0f;
        for (size_t j = 0; j < len; j++) {
            adamw_moment_store(&s, 0, begin + j, mt[j], scale_m);
            adamw_moment_store(&s, 1, begin + j, vt[j], scale_v);
        }
        if (fp8) {
            s.scale_inv[2 * k] = 1.0f / scale_m;
            s.scale_inv[2 * k + 1] = 1.0f / scale_v;
        }
    }
}

/* One chunk at a time: [stored +] x in FP32, the chunk's amax and scale, then stored. */
static inline void op_store_add(StoreCodec c, void* dst, float* scale_inv, const float* x, size_t n, int accumulate) {
    RECORD("store_add", "kernel", {n, (size_t)accumulate, store_bytes(c)},
           4.0 * n + (accumulate ? (double)store_bytes(c) * n + 4.0 * store_scale_count(c, n) : 0.0),
           (double)store_bytes(c) * n + 4.0 * store_scale_count(c, n), 0, "");
    size_t chunks = zero_chunks(n);
    int scaled = store_is_scaled(c);
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < chunks; k++) {
        float sum[ZERO_CHUNK];
        size_t begin = k * ZERO_CHUNK, len = n - begin < ZERO_CHUNK ? n - begin : ZERO_CHUNK;
        float sinv = scaled ? scale_inv[k] : 1.0f, amax = 0.0f;
        for (size_t j = 0; j < len; j++) {
            sum[j] = accumulate ? store_load(c, dst, begin + j, sinv) + x[begin + j] : x[begin + j];
            amax = amax_combine(amax, fabsf(sum[j]));
        }
        float scale = store_scale(c, amax);
        for (size_t j = 0; j < len; j++) store_put(c, dst, begin + j, sum[j], scale);
        if (scaled) scale_inv[k] = grad_fp8_scale_inv(amax, scale);
    }
}

/* Element by element: decoded with its chunk's scale_inv when scaled, [added to out,] written to out. */
static inline void op_store_load(StoreCodec c, float* out, const void* src, const float* scale_inv, size_t n, int accumulate) {
    RECORD("store_load", "kernel", {n, (size_t)accumulate, store_bytes(c)},
           (double)store_bytes(c) * n + 4.0 * store_scale_count(c, n) + (accumulate ? 4.0 * n : 0.0), 4.0 * n, 0, "");
    int scaled = store_is_scaled(c);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float v = store_load(c, src, i, scaled ? scale_inv[i / ZERO_CHUNK] : 1.0f);
        out[i] = accumulate ? out[i] + v : v;
    }
}

/* ---------------------------------------------------------------- FP8 and GEMM (the FP8 library's CPU emulation) */

static inline void op_amax(Fp8Scale* s, const act_t* x, size_t n) {
    RECORD("amax", "kernel", {n}, RECORD_ACT_BYTES * n, sizeof(Fp8Scale), 0, "");
    backend_timer_start(PROF_FP8_CAST);
    fp8_amax_cpu(s, x, n, 0);
    backend_timer_stop(PROF_FP8_CAST);
}

static inline void op_cast_transpose(uint8_t* out, uint8_t* out_t, const act_t* x, size_t rows, size_t cols, Fp8Format f,
                                     Fp8Scale* s, int pow2, Fp8Counts* counts) {
    RECORD("cast_transpose", "kernel", {rows, cols, out != NULL, out_t != NULL}, RECORD_ACT_BYTES * rows * cols,
           (double)rows * cols * ((out != NULL) + (out_t != NULL)) + sizeof(Fp8Scale), 0, "");
    backend_timer_start(PROF_FP8_CAST);
    fp8_cast_transpose_cpu(out, out_t, x, rows, cols, f, s, pow2, counts, 0);
    backend_timer_stop(PROF_FP8_CAST);
}

static inline void op_cast_transpose_delayed(uint8_t* out, uint8_t* out_t, const act_t* x, size_t rows, size_t cols,
                                             Fp8Format f, Fp8Scale* s, Fp8Counts* counts, float* record) {
    RECORD("cast_transpose_delayed", "kernel", {rows, cols, out != NULL, out_t != NULL}, RECORD_ACT_BYTES * rows * cols,
           (double)rows * cols * ((out != NULL) + (out_t != NULL)) + sizeof(Fp8Scale), 0, "");
    backend_timer_start(PROF_FP8_CAST);
    fp8_cast_transpose_delayed_cpu(out, out_t, x, rows, cols, f, s, counts, record);
    backend_timer_stop(PROF_FP8_CAST);
}

static inline void op_fp8_quantize(uint8_t* out, uint8_t* out_t, const act_t* x, size_t rows, size_t cols, Fp8Format f,
                                   const Fp8Quant* q) {
    RECORD("fp8_quantize", "kernel", {rows, cols, out != NULL, out_t != NULL, (size_t)q->amax},
           RECORD_ACT_BYTES * rows * cols * (1 + (q->amax != 0)),
           (double)rows * cols * ((out != NULL) + (out_t != NULL)) + sizeof(Fp8Scale), 0, "");
    backend_timer_start(PROF_FP8_CAST);
    fp8_quantize_cpu(out, out_t, x, rows, cols, f, q);
    backend_timer_stop(PROF_FP8_CAST);
}

static inline void op_fp8_delayed_update(Fp8Scale* s, float* history, const float* step_amax, size_t n, int H, int pos, int len,
                                         int algo, Fp8Format f, int margin, int pow2) {
    RECORD("fp8_delayed_update", "kernel", {n, (size_t)H}, (4.0 * H + 4.0 + sizeof(Fp8Scale)) * n, (4.0 + sizeof(Fp8Scale)) * n,
           0, "");
    fp8_delayed_update_cpu(s, history, step_amax, n, H, pos, len, algo, f, margin, pow2);
}

static inline void op_amax_master(Fp8Scale* s, const float* master, size_t n) {
    RECORD("amax_master", "kernel", {n}, 4.0 * n, sizeof(Fp8Scale), 0, "");
    backend_timer_start(PROF_FP8_CAST);
    fp8_amax_cpu(s, master, n, 1);
    backend_timer_stop(PROF_FP8_CAST);
}

static inline void op_cast_transpose_master(uint8_t* out, uint8_t* out_t, const float* master, size_t rows, size_t cols,
                                            Fp8Format f, Fp8Scale* s, int pow2, Fp8Counts* counts) {
    RECORD("cast_transpose_master", "kernel", {rows, cols, out != NULL, out_t != NULL}, 4.0 * rows * cols,
           (double)rows * cols * ((out != NULL) + (out_t != NULL)) + sizeof(Fp8Scale), 0, "");
    backend_timer_start(PROF_FP8_CAST);
    fp8_cast_transpose_cpu(out, out_t, master, rows, cols, f, s, pow2, counts, 1);
    backend_timer_stop(PROF_FP8_CAST);
}

static inline void op_fp8_clear_nonfinite(Fp8Scale* s, size_t n) {
    RECORD("fp8_clear_nonfinite", "kernel", {n}, 0, 4.0 * n, 0, "");
    for (size_t i = 0; i < n; i++) s[i].nonfinite = 0.0f;
}

static inline void op_fp8_reset_amax(Fp8Scale* s, size_t n) {
    RECORD("fp8_reset_amax", "kernel", {n}, 0, 4.0 * n, 0, "");
    for (size_t i = 0; i < n; i++) s[i].amax = 0.0f;
}

static inline void op_transpose_fp8(uint8_t* out_t, const uint8_t* in, size_t rows, size_t cols) {
    RECORD("transpose_fp8", "kernel", {rows, cols}, (double)rows * cols, (double)rows * cols, 0, "");
    backend_timer_start(PROF_FP8_CAST);
    fp8_transpose_cpu(out_t, in, rows, cols);
    backend_timer_stop(PROF_FP8_CAST);
}

/* Bytes of a GEMM operand element on the GPU, for op_gemm's record. */
static inline double gemm_dtype_bytes(DType t) { return t == DT_F32 ? 4.0 : t == DT_ACT ? RECORD_ACT_BYTES : 1.0; }

/* op_gemm's record detail: the operand and output types, e.g. "e4m3 x e4m3 -> act +=". */
static inline const char* gemm_record_detail(const GemmCall* g) {
    char detail[64];
    snprintf(detail, sizeof(detail), "%s x %s -> %s%s", dtype_name(g->a.dtype), dtype_name(g->b.dtype), dtype_name(g->d_type),
             g->accumulate ? " +=" : "");
    return op_record_intern(detail);
}

/* gemm_cpu, then a DT_ACT output stored as the activation type (BF16 values where the GPU stores BF16). */
static inline void op_gemm(const GemmCall* g) {
    RECORD("gemm", "gemm", {g->m, g->n, g->k},
           gemm_dtype_bytes(g->a.dtype) * g->m * g->k + gemm_dtype_bytes(g->b.dtype) * g->k * g->n +
               (g->accumulate ? gemm_dtype_bytes(g->d_type) * g->m * g->n : 0.0),
           gemm_dtype_bytes(g->d_type) * g->m * g->n, 2.0 * g->m * g->n * g->k,
           gemm_record_detail(g));
    gemm_cpu(g);
    if (g->d_type == DT_ACT && g_round_bf16) {
        float* d = (float*)g->d;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < g->m * g->n; i++) d[i] = store(d[i]);
    }
}
