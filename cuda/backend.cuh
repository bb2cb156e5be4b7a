/*
 * The CUDA backend: llama/backend.h's contract on the GPU, with BF16 storage (act_t = __nv_bfloat16),
 * FP32 math, FP32 master weights and optimizer state, cuBLASLt GEMMs (FP8 in -p fp8) and cuDNN attention.
 * This file holds the memory functions and the backend queries; the ops live in one file per op family
 * (the families of dev/cuda/kernel_cases.cuh and the sections of cpu/backend.h):
 *   cuda/optimizer.cuh   working weights from master, gradient sum of squares, AdamW
 *   cuda/encoder.cuh     embedding forward/backward
 *   cuda/rmsnorm.cuh     RMSNorm (+ fused residual) forward/backward
 *   cuda/rope.cuh        RoPE
 *   cuda/attention.cuh   attention (cuDNN SDPA, or the plain fallback without USE_CUDNN)
 *   cuda/swiglu.cuh      SwiGLU
 *   cuda/classifier.cuh  fused softmax cross-entropy
 * and the FP8 library's GPU half (fp8/cast_cuda.cuh amax and cast-transpose, fp8/gemm_cublaslt.cuh).
 * Ops are asynchronous on the default stream except where a host value is returned (op_sum_f64).
 */
#pragma once

#include <cuda_bf16.h>
#include <nvtx3/nvToolsExt.h>

#include "../core/cuda_utils.cuh"
#include "../fp8/cast_cuda.cuh"
#include "../fp8/gemm_cublaslt.cuh"

/* Activations and working weights are BF16 on the GPU; every op computes in FP32. */
typedef __nv_bfloat16 act_t;
#define LLM8_BACKEND "cuda"
#define LLM8_BACKEND_MATH "GPU and cuBLASLt"
/* The GPU accumulates as its tensor cores do: --fp8-accum hopper is refused (train/trainer.h). */
#define BACKEND_MODELS_FP8_ACCUM 0
/* Kernels load and GEMMs are planned at first use (attention graphs: op_attention_prepare): the trainer warms up. */
#define BACKEND_WARMS_UP 1
/* The ops do not record themselves: the step's op list comes from the CPU build (core/op_record.h). */
#define BACKEND_RECORDS 0

#include "../llama/backend.h"
#include "optimizer.cuh"
#include "encoder.cuh"
#include "rmsnorm.cuh"
#include "rope.cuh"
#include "attention.cuh"
#include "swiglu.cuh"
#include "classifier.cuh"

/* ---------------------------------------------------------------- memory (device memory) */

/* cudaMalloc that stops naming the size and the free memory when it fails. */
static inline void* dev_alloc(size_t bytes) {
    void* p = NULL;
    cudaError_t err = device_alloc(&p, bytes > 0 ? bytes : 1);
    if (err != cudaSuccess) {
        size_t free_bytes = 0, total = 0;
        cudaMemGetInfo(&free_bytes, &total);
        die("cudaMalloc of %.1f MiB failed: %s (%.1f MiB free of %.1f MiB)", mib(bytes), cudaGetErrorString(err),
            mib(free_bytes), mib(total));
    }
    return p;
}
static inline void dev_free(void* p) { device_free(p); }
/* Synchronous copies, ordered after all queued work on the default stream. */
static inline void dev_upload(void* dst, const void* src, size_t bytes) {
    cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
static inline void dev_download(void* dst, const void* src, size_t bytes) {
    cudaCheck(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
static inline void dev_zero(void* p, size_t bytes) { cudaCheck(cudaMemsetAsync(p, 0, bytes, 0)); }
static inline void dev_copy(void* dst, const void* src, size_t bytes) {
    cudaCheck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, 0));
}

/* Pinned staging buffers of dev_upload_async, used in turn: a buffer is rewritten only after its last
   upload has completed (its event), which with this many in turn is long done in the step loop (tokens,
   targets and the embedding backward's bucketing: three uploads per micro-step). Sized at start-up
   (backend_reserve_workspaces: the largest upload of a step); they grow only where nothing sized them. */
#define UPLOAD_STAGES 8
typedef struct {
    void* host;
    size_t bytes;
    cudaEvent_t copied;
    int used;
} UploadStage;
static UploadStage g_upload_stages[UPLOAD_STAGES];
static int g_upload_next = 0;

/* Makes stage s hold at least `bytes` (cudaFreeHost waits for the device: start-up only, or unsized). */
static inline void upload_stage_size(UploadStage* s, size_t bytes) {
    if (s->bytes >= bytes) return;
    if (g_scratch_fixed) die("upload staging: %zu bytes needed, %zu sized at start-up", bytes, s->bytes);
    if (s->host) cudaCheck(cudaFreeHost(s->host));
    cudaCheck(cudaMallocHost(&s->host, bytes));
    s->bytes = bytes;
}

static inline void dev_upload_async(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    UploadStage* s = &g_upload_stages[g_upload_next];
    g_upload_next = (g_upload_next + 1) % UPLOAD_STAGES;
    if (s->used) cudaCheck(cudaEventSynchronize(s->copied));
    else cudaCheck(cudaEventCreateWithFlags(&s->copied, cudaEventDisableTiming));
    s->used = 1;
    upload_stage_size(s, bytes);
    memcpy(s->host, src, bytes);
    cudaCheck(cudaMemcpyAsync(dst, s->host, bytes, cudaMemcpyHostToDevice, 0));
    cudaCheck(cudaEventRecord(s->copied, 0));
}

/* out (n) host floats = x (n) device BF16 values (exact). */
static inline void act_to_float_host(float* out, const act_t* x, size_t n) {
    act_t* tmp = (act_t*)mallocCheck(n * sizeof(act_t));
    dev_download(tmp, x, n * sizeof(act_t));
    for (size_t i = 0; i < n; i++) out[i] = __bfloat162float(tmp[i]);
    free(tmp);
}

/* ---------------------------------------------------------------- backend */

/* FP8 tensor cores arrived with Ada (sm_89) and Hopper (sm_90). */
#define FP8_MIN_COMPUTE_CAPABILITY 89

static cudaDeviceProp g_device_prop;
static int g_backend_ready = 0;

/*
 * Selects the GPU, checks that this binary has kernels for it and that it can run precision p, and
 * creates the cuBLASLt handle and workspace and the cuDNN handle. Stops for -p fp32 (the CPU
 * reference's mode) and for -p fp8 on GPUs without FP8 tensor cores. Safe to call more than once.
 */
static inline void backend_init(Precision p) {
    if (p == PRECISION_FP32) die("-p fp32 is the CPU reference's mode; the GPU build runs bf16 or fp8");
    if (!g_backend_ready) {
        int count = 0;
        cudaError_t found = cudaGetDeviceCount(&count);
        if (found != cudaSuccess || count == 0)
            die("no usable CUDA GPU (%s); the CPU build is train_llama_cpu", found != cudaSuccess ? cudaGetErrorString(found) : "0 devices");
        /* the device comm_init selected for this rank's local rank */
        int device;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaGetDeviceProperties(&g_device_prop, device));
        cudaFuncAttributes attr;
        cudaError_t err = cudaFuncGetAttributes(&attr, params_from_master_kernel);
        if (err != cudaSuccess) {
            die("this binary has no kernels for %s (compute capability %d.%d): %s; rebuild with make GPU_ARCH=%d%d",
                g_device_prop.name, g_device_prop.major, g_device_prop.minor, cudaGetErrorString(err), g_device_prop.major,
                g_device_prop.minor);
        }
        gemm_cublaslt_init();
        attention_init();
        int runtime = 0, driver = 0;
        cudaCheck(cudaRuntimeGetVersion(&runtime));
        cudaCheck(cudaDriverGetVersion(&driver));
        size_t cublaslt = cublasLtGetVersion(); /* major * 10000 + minor * 100 + patch */
        char attention[192];
        attention_describe(attention, sizeof(attention));
        /* one line that scripts/device_check.sh reads ("attention: " last) */
        printf("| device: %s, compute capability %d.%d, %.1f GiB; CUDA runtime %d.%d, driver %d.%d; cuBLASLt %zu.%zu.%zu, "
               "workspace %.0f MiB; attention: %s\n",
               g_device_prop.name, g_device_prop.major, g_device_prop.minor, mib(g_device_prop.totalGlobalMem) / 1024.0,
               runtime / 1000, runtime % 1000 / 10, driver / 1000, driver % 1000 / 10, cublaslt / 10000, cublaslt / 100 % 100,
               cublaslt % 100, mib(CUBLASLT_WORKSPACE_BYTES), attention);
        g_backend_ready = 1;
    }
    int cc = g_device_prop.major * 10 + g_device_prop.minor;
    if (p == PRECISION_FP8 && cc < FP8_MIN_COMPUTE_CAPABILITY)
        die("-p fp8 needs FP8 tensor cores (compute capability 8.9 or newer); %s has %d.%d: use -p bf16", g_device_prop.name,
            g_device_prop.major, g_device_prop.minor);
}

/* Waits for the work queued on the compute stream (the legacy default stream), not for collectives still
   running on the communication stream (the next step waits for those where it needs them); surfaces
   asynchronous kernel faults here. No cudaDeviceSynchronize: the step loop never drains every stream. */
static inline void backend_synchronize(void) { cudaCheck(cudaStreamSynchronize(0)); }

static inline const char* backend_name(void) { return "cuda"; }
static inline void backend_math_identity(char* out, size_t len) {
    snprintf(out, len, "%.80s (compute capability %d.%d), cuBLASLt %zu", g_device_prop.name, g_device_prop.major,
             g_device_prop.minor, cublasLtGetVersion());
}

/* Dense (no sparsity) tensor-core peaks in FLOP/s from NVIDIA's H100/H200 datasheets. */
#define PEAK_SXM_BF16 989.4e12
#define PEAK_SXM_FP8 1978.9e12
#define PEAK_PCIE_BF16 756.0e12
#define PEAK_PCIE_FP8 1513.0e12
#define PEAK_NVL_BF16 835.5e12
#define PEAK_NVL_FP8 1670.5e12

/* Peak FLOP/s of the device for precision p, for MFU; 0 when the GPU is not one we know. */
static inline double backend_peak_flops(Precision p) {
    const char* name = g_device_prop.name;
    int fp8 = p == PRECISION_FP8;
    if (strstr(name, "H100") || strstr(name, "H800") || strstr(name, "H200")) {
        if (strstr(name, "PCIe")) return fp8 ? PEAK_PCIE_FP8 : PEAK_PCIE_BF16;
        if (strstr(name, "NVL")) return fp8 ? PEAK_NVL_FP8 : PEAK_NVL_BF16;
        return fp8 ? PEAK_SXM_FP8 : PEAK_SXM_BF16;
    }
    return 0.0;
}

/* Device memory in use (all processes), MiB. */
static inline double backend_memory_mib(void) {
    size_t free_bytes = 0, total = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total));
    return mib(total - free_bytes);
}

static inline int backend_memory_usage(size_t* ours, size_t* in_use) {
    size_t free_bytes = 0, total = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total));
    *ours = g_device_bytes;
    *in_use = total - free_bytes;
    return 1;
}

static inline void backend_load_kernels(void) {
    optimizer_load_kernels();
    fp8_load_update_kernels();
}

/* NVTX ranges (header-only NVTX 3): no-ops unless a tool such as Nsight Systems attaches. */
static inline void backend_range_push(const char* name) { nvtxRangePushA(name); }
static inline void backend_range_pop(void) { nvtxRangePop(); }

/* Total device memory of the current GPU; 0 without a usable GPU (a dry run on a machine without one). */
static inline size_t backend_memory_total(const char** what) {
    *what = "GPU memory (cudaMemGetInfo total)";
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    size_t free_bytes = 0, total = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total));
    return total;
}

/* The CUDA context with cuBLASLt's and cuDNN's handles and loaded kernels: an estimate. A context alone
   measured 287 MB with lazy loading and 667 MB eager (pytorch/pytorch#86509); the libraries add theirs.
   The trainer's memory report after step 1 measures it on the device (docs/memory.md). */
#define CUDA_CONTEXT_ESTIMATE_BYTES ((size_t)1 << 30)

#ifdef USE_CUDNN
/* The GPU generation a plan is for: the current device's compute capability major, else Hopper (9, the
   H100/H200 of docs/design.md#targets) on a machine without a GPU, as *assumed says. */
static inline int plan_sm_major(int* assumed) {
    int count = 0, device = 0, major = 0;
    *assumed = cudaGetDeviceCount(&count) != cudaSuccess || count == 0 || cudaGetDevice(&device) != cudaSuccess ||
               cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess;
    if (*assumed) {
        cudaGetLastError(); /* clear the sticky "no device" error */
        return 9;
    }
    return major;
}
#endif

static inline int backend_workspaces(const WorkspaceQuery* q, MemoryEstimate* out) {
    const LlamaConfig* c = q->cfg;
    size_t N = (size_t)q->B * q->T, C = (size_t)c->dim;
    int n = 0;
    out[n++] = (MemoryEstimate){"cuda_context", CUDA_CONTEXT_ESTIMATE_BYTES, 1,
                                "CUDA context, cuBLASLt/cuDNN handles and kernels (287 MB lazy, pytorch/pytorch#86509, + libraries)", NULL};
    out[n++] = (MemoryEstimate){"cublaslt", CUBLASLT_WORKSPACE_BYTES, 0, "cuBLASLt workspace", NULL};
#ifdef USE_CUDNN
    /* the backward's workspace (the forward's is smaller: it keeps no dQ accumulator or dP) on the path
       cuDNN takes for this run: the deterministic backward (LLM8_DETERMINISTIC=1) on Hopper holds dP,
       B NH T T BF16, 1 GiB for Llama-2 7B at B 1, T 4096 */
    static char attention_what[sizeof(((CudnnAttWorkspace*)0)->what) + 64];
    int assumed;
    int sm = plan_sm_major(&assumed);
    CudnnAttWorkspace att = cudnn_att_backward_workspace(q->B, q->T, c->n_heads, c->n_kv_heads, c->dim / c->n_heads,
                                                         cudnn_att_deterministic_env(), sm);
    snprintf(attention_what, sizeof(attention_what), "%s%s", att.what, assumed ? "; no GPU here: planned for Hopper" : "");
    out[n++] = (MemoryEstimate){"cudnn_attention", att.bytes, 0, attention_what, NULL};
#else
    size_t rows = (size_t)q->B * (size_t)c->n_heads * (size_t)q->T;
    out[n++] = (MemoryEstimate){"attention", rows * sizeof(float), 0, "fallback attention backward row sums", &g_attention_scratch};
#endif
    out[n++] = (MemoryEstimate){"encoder_backward", (3 * N + 1) * sizeof(int), 0,
                                "embedding backward: positions, bucket starts and tokens (N distinct at most)", &g_encoder_scratch};
    out[n++] = (MemoryEstimate){"rmsnorm_backward", (N < RMSNORM_BWD_BLOCKS ? N : RMSNORM_BWD_BLOCKS) * C * sizeof(float), 0,
                                "RMSNorm backward per-block weight-gradient partials", &g_rmsnorm_scratch};
    out[n++] = (MemoryEstimate){"grad_norm_sum", 2 * ceil_div(q->grad_chunks, F64_SUM_BLOCK) * sizeof(double), 0,
                                "gradient norm: levels of the chunk sum", &g_sum_f64_scratch};
    return n;
}

/* The largest upload of a step is op_encoder_backward's bucketing, 3 N + 1 ints (tokens and targets: N).
   cuDNN's workspace, sized by cuda/cudnn_att.cpp, is held at its plan entry too. */
static inline void backend_reserve_workspaces(const MemoryEstimate* ws, int n, size_t tokens) {
    for (int i = 0; i < n; i++) {
        if (ws[i].scratch != NULL) scratch_size(ws[i].scratch, ws[i].bytes);
#ifdef USE_CUDNN
        if (strcmp(ws[i].name, "cudnn_attention") == 0) cudnn_att_reserve(ws[i].bytes);
#endif
    }
    for (int i = 0; i < UPLOAD_STAGES; i++) upload_stage_size(&g_upload_stages[i], (3 * tokens + 1) * sizeof(int));
    g_scratch_fixed = 1;
}

/* Attention keeps the softmax log-sum-exp per (b, head, query): (B, NH, T) floats per layer. */
static inline size_t att_stats_size(size_t B, int NH, int T) { return B * (size_t)NH * (size_t)T; }

/* ---------------------------------------------------------------- profiling: CUDA events */

/* Intervals the event pool starts with; it doubles when a profiled step needs more (one per timed op). */
#define PROF_INITIAL_INTERVALS 256

/* One timed interval of a profiled step: two events on the default stream, read when the step ends. */
typedef struct {
    cudaEvent_t start, stop;
    ProfPhase phase;
} ProfInterval;

static ProfInterval* g_prof_intervals = NULL;
static int g_prof_count = 0, g_prof_capacity = 0, g_prof_on = 0;
static int g_prof_open[PROF_PHASES]; /* index of each phase's open interval, -1 when none is open */

static inline void backend_profile_begin(void) {
    g_prof_on = 1;
    g_prof_count = 0;
    for (int p = 0; p < PROF_PHASES; p++) g_prof_open[p] = -1;
}

static inline void backend_timer_start(ProfPhase p) {
    if (!g_prof_on) return;
    if (g_prof_open[p] >= 0) die("profiling: phase %s started twice", PROF_PHASE_NAMES[p]);
    if (g_prof_count == g_prof_capacity) {
        int capacity = g_prof_capacity > 0 ? 2 * g_prof_capacity : PROF_INITIAL_INTERVALS;
        ProfInterval* grown = (ProfInterval*)realloc(g_prof_intervals, (size_t)capacity * sizeof(ProfInterval));
        if (grown == NULL) die("out of host memory for %d profiling intervals", capacity);
        for (int i = g_prof_capacity; i < capacity; i++) {
            cudaCheck(cudaEventCreate(&grown[i].start));
            cudaCheck(cudaEventCreate(&grown[i].stop));
        }
        g_prof_intervals = grown;
        g_prof_capacity = capacity;
    }
    ProfInterval* interval = &g_prof_intervals[g_prof_count];
    interval->phase = p;
    g_prof_open[p] = g_prof_count++;
    cudaCheck(cudaEventRecord(interval->start, 0));
}

static inline void backend_timer_stop(ProfPhase p) {
    if (!g_prof_on) return;
    if (g_prof_open[p] < 0) die("profiling: phase %s stopped without a start", PROF_PHASE_NAMES[p]);
    cudaCheck(cudaEventRecord(g_prof_intervals[g_prof_open[p]].stop, 0));
    g_prof_open[p] = -1;
}

static inline void backend_profile_end(double* ms) {
    for (int p = 0; p < PROF_PHASES; p++) ms[p] = 0.0;
    if (!g_prof_on) return;
    g_prof_on = 0;
    for (int p = 0; p < PROF_PHASES; p++) {
        if (g_prof_open[p] >= 0) die("profiling: phase %s still open at the end of the step", PROF_PHASE_NAMES[p]);
    }
    if (g_prof_count > 0) cudaCheck(cudaEventSynchronize(g_prof_intervals[g_prof_count - 1].stop)); /* all on stream 0 */
    for (int i = 0; i < g_prof_count; i++) {
        float elapsed = 0.0f;
        cudaCheck(cudaEventElapsedTime(&elapsed, g_prof_intervals[i].start, g_prof_intervals[i].stop));
        ms[g_prof_intervals[i].phase] += elapsed;
    }
}

/* ---------------------------------------------------------------- FP8 and GEMM (the FP8 library's GPU half) */

static inline void op_amax(Fp8Scale* s, const act_t* x, size_t n) {
    backend_timer_start(PROF_FP8_CAST);
    fp8_amax_cuda(s, x, n);
    backend_timer_stop(PROF_FP8_CAST);
}

static inline void op_cast_transpose(uint8_t* out, uint8_t* out_t, const act_t* x, size_t rows, size_t cols, Fp8Format f,
                                     Fp8Scale* s, int pow2, Fp8Counts* counts) {
    backend_timer_start(PROF_FP8_CAST);
    fp8_cast_transpose_cuda(out, out_t, x, rows, cols, f, s, pow2, counts);
    backend_timer_stop(PROF_FP8_CAST);
}

static inline void op_cast_transpose_delayed(uint8_t* out, uint8_t* out_t, const act_t* x, size_t rows, size_t cols,
                                             Fp8Format f, Fp8Scale* s, Fp8Counts* counts, float* record) {
    backend_timer_start(PROF_FP8_CAST);
    fp8_cast_transpose_delayed_cuda(out, out_t, x, rows, cols, f, s, counts, record);
    backend_timer_stop(PROF_FP8_CAST);
}

static inline void op_fp8_quantize(uint8_t* out, uint8_t* out_t, const act_t* x, size_t rows, size_t cols, Fp8Format f,
                                   const Fp8Quant* q) {
    backend_timer_start(PROF_FP8_CAST);
    fp8_quantize_cuda(out, out_t, x, rows, cols, f, q);
    backend_timer_stop(PROF_FP8_CAST);
}

static inline void op_fp8_delayed_update(Fp8Scale* s, float* history, const float* step_amax, size_t n, int H, int pos, int len,
                                         int algo, Fp8Format f, int margin, int pow2) {
    fp8_delayed_update_cuda(s, history, step_amax, n, H, pos, len, algo, f, margin, pow2);
}

static inline void op_amax_master(Fp8Scale* s, const float* master, size_t n) {
    backend_timer_start(PROF_FP8_CAST);
    fp8_amax_cuda(s, master, n);
    backend_timer_stop(PROF_FP8_CAST);
}

static inline void op_cast_transpose_master(uint8_t* out, uint8_t* out_t, const float* master, size_t rows, size_t cols,
                                            Fp8Format f, Fp8Scale* s, int pow2, Fp8Counts* counts) {
    backend_timer_start(PROF_FP8_CAST);
    fp8_cast_transpose_cuda(out, out_t, master, rows, cols, f, s, pow2, counts);
    backend_timer_stop(PROF_FP8_CAST);
}

/* One strided memset: the nonfinite field of each 16-byte record. */
static inline void op_fp8_clear_nonfinite(Fp8Scale* s, size_t n) {
    if (n == 0) return;
    cudaCheck(cudaMemset2DAsync(&s->nonfinite, sizeof(Fp8Scale), 0, sizeof(float), n, 0));
}

static inline void op_fp8_reset_amax(Fp8Scale* s, size_t n) { fp8_reset_amax_cuda(s, n); }

static inline void op_transpose_fp8(uint8_t* out_t, const uint8_t* in, size_t rows, size_t cols) {
    backend_timer_start(PROF_FP8_CAST);
    fp8_transpose_cuda(out_t, in, rows, cols);
    backend_timer_stop(PROF_FP8_CAST);
}

static inline void op_gemm(const GemmCall* g) { gemm_cublaslt(g); }
