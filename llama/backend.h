/*
 * The backend contract: every function the model (model/model.h) and the training program (train/)
 * call on a backend, with shapes, types and error behaviour. Each backend (cpu/backend.h,
 * cuda/backend.cuh) defines `act_t` and LLM8_BACKEND, includes this header, then defines every function
 * below, so a definition whose signature drifts from its prototype is a compile error: "conflicting
 * types" in C (gcc), and "referenced but not defined" for nvcc, which the Makefile turns into an error
 * (--diag-error 114) because C++ would otherwise take the drifted definition for an overload.
 *
 * Conventions: tensors are row-major and contiguous; pointers are device pointers on the GPU (host
 * memory on the CPU), Fp8Scale and Fp8Counts included; "act" is act_t, the activation type (BF16 on the
 * GPU; float on the CPU, rounded to BF16 values in -p bf16/fp8 wherever the GPU stores BF16); every op
 * computes in FP32; gradient outputs marked "+=" accumulate into what is there. Ops are asynchronous on
 * the GPU unless they return a host value. Errors (a failing library call, out of memory, a GEMM the
 * FP8 rules forbid) stop the program with one line naming the call; nothing returns an error code.
 * N = B*T tokens, C model width, F SwiGLU width, V vocabulary, NH/NKV query/kv heads of HS dims each,
 * QKV = (NH + 2 NKV) HS. The formulas are op_math.h's.
 */
#pragma once

#ifndef LLM8_BACKEND
#error "include a backend (cpu/backend.h or cuda/backend.cuh) before llama/backend.h"
#endif

#include "config.h"
#include "optim.h"
#include "../core/buffers.h"
#include "../fp8/fp8.h"
#include "../fp8/gemm.h"

/* ---------------------------------------------------------------- memory */

/* `bytes` of backend memory (device memory on the GPU); stops naming the size when it cannot. */
static inline void* dev_alloc(size_t bytes);
static inline void dev_free(void* p);
/* Host -> backend and backend -> host copies; synchronous (ordered after all queued work). */
static inline void dev_upload(void* dst, const void* src, size_t bytes);
static inline void dev_download(void* dst, const void* src, size_t bytes);
static inline void dev_zero(void* p, size_t bytes);
/* Backend -> backend copy, ordered with the ops (asynchronous on the GPU). */
static inline void dev_copy(void* dst, const void* src, size_t bytes);
/* Host -> backend copy ordered with the ops, like dev_copy (asynchronous on the GPU, which stages src in
   pinned host memory first): src may be reused as soon as it returns. */
static inline void dev_upload_async(void* dst, const void* src, size_t bytes);
/* out (n) host floats = x (n) act values (exact). */
static inline void act_to_float_host(float* out, const act_t* x, size_t n);

/* ---------------------------------------------------------------- backend */

/* Prepares the backend for precision p (GPU: device, cuBLASLt, cuDNN); stops when it cannot run p. */
static inline void backend_init(Precision p);
/* Waits for all queued work; surfaces asynchronous faults. */
static inline void backend_synchronize(void);
static inline const char* backend_name(void);
/* Each backend also defines BACKEND_MODELS_FP8_ACCUM: 1 when its FP8 GEMMs can run the Hopper
   accumulation model (--fp8-accum hopper; fp8/gemm_hopper.h), 0 when they accumulate on hardware.
   Known without a device, so the flag check runs before the GPU is looked for. */
/* The libraries and hardware whose choice changes results in the last bits, as text (len >= 128), for
   the start-up agreement: CPU, the BLAS and its kernels; GPU, the device and cuBLASLt. Needs
   backend_init. LLM8_BACKEND_MATH names it in messages. */
static inline void backend_math_identity(char* out, size_t len);
/* Peak FLOP/s of the device in precision p, for MFU; 0 when unknown. */
static inline double backend_peak_flops(Precision p);
/* Backend memory in use, MiB (0 when not meaningful). */
static inline double backend_memory_mib(void);
/* Bytes of llm8's own live allocations (*ours: dev_alloc, op scratch, the cuBLASLt workspace) and of the
   device memory in use by everything (*in_use, cudaMemGetInfo: also the CUDA context's and the
   libraries', and other processes'); returns 0 where the backend does not measure them (CPU). */
static inline int backend_memory_usage(size_t* ours, size_t* in_use);
/* Loads, without running them, the kernels a warm-up cannot run without changing the training state
   (the update's: AdamW, the stored-format adds and loads, the delayed recipe's scale update); GPU:
   cudaFuncGetAttributes, which loads a kernel under CUDA's lazy loading. Each backend also defines
   BACKEND_WARMS_UP: 1 when it loads kernels, plans GEMMs or builds graphs at their first use, so that
   the trainer warms it up before the steps (trainer_warmup); BACKEND_RECORDS: 1 when each op records
   itself at its head (core/op_record.h: --dry-run 2, LLM8_TRACE_OPS), else 0. */
static inline void backend_load_kernels(void);
/* Opens and closes a named phase of the run on a profiler's timeline (GPU: an NVTX range, which Nsight
   Systems shows; the emulated GPU counts its allocations and device synchronizations per range,
   docs/emulated-gpu.md); nothing on the CPU. Ranges nest. */
static inline void backend_range_push(const char* name);
static inline void backend_range_pop(void);
/* Total memory of what the backend runs on, bytes (GPU: cudaMemGetInfo's total of the current device;
   CPU: host RAM), naming it in *what; 0 when there is none (no GPU). Allocates nothing of the model. */
static inline size_t backend_memory_total(const char** what);

/* A run's shape as the memory plan describes it to backend_workspaces. */
typedef struct {
    const LlamaConfig* cfg;
    int B, T;
    Precision precision;
    size_t grad_chunks; /* the gradient norm's ZERO_CHUNK chunks (op_sum_f64's input) */
    int fp8_accum;      /* the FP8 GEMMs' Fp8Accum (--fp8-accum; fp8/gemm.h) */
} WorkspaceQuery;
/* Most MemoryEstimate entries backend_workspaces writes. */
#define MAX_BACKEND_WORKSPACES 8
/* The memory the backend's ops allocate outside the model's buffer tables for a run of this shape
   (library workspaces, grow-only scratch): writes its named entries to out, returns how many. */
static inline int backend_workspaces(const WorkspaceQuery* q, MemoryEstimate* out);
/* Sizes, once at start-up, the scratch of every entry that names one (backend_workspaces' and
   comm_workspaces' entries for the run) and dev_upload_async's staging for the uploads of a forward and
   backward of up to `tokens` tokens; from then on scratch is fixed: an op that needs more stops the run
   naming the entry that undercounts, instead of reallocating mid-step. The CPU has nothing to size. */
static inline void backend_reserve_workspaces(const MemoryEstimate* ws, int n, size_t tokens);
/* Floats op_attention_forward keeps per layer for backward (the CPU keeps probabilities, the GPU log-sum-exps). */
static inline size_t att_stats_size(size_t B, int NH, int T);

/* ---------------------------------------------------------------- profiling (the trainer's --profile) */

/* The phases a profiled step is timed in. PROF_FP8_CAST is the time of every op_amax and op_cast_transpose
   (which time themselves) and lies inside the other three. */
typedef enum { PROF_FORWARD, PROF_BACKWARD, PROF_OPTIMIZER, PROF_FP8_CAST, PROF_PHASES } ProfPhase;
static const char* const PROF_PHASE_NAMES[PROF_PHASES] = {"forward", "backward", "optimizer", "fp8 casts"};

/* Starts a profiled step: until backend_profile_end, each backend_timer_start / backend_timer_stop pair adds
   the time between them to its phase. Outside a profiled step the timers do nothing. The GPU times with
   CUDA events on the default stream, so a profiled step queues its work as any other and waits only in
   backend_profile_end; the CPU reads the wall clock (its ops are synchronous). */
static inline void backend_profile_begin(void);
/* Opens / closes an interval of phase p; at most one interval per phase is open at a time (else stops). */
static inline void backend_timer_start(ProfPhase p);
static inline void backend_timer_stop(ProfPhase p);
/* Ends the profiled step: waits for its work and writes each phase's milliseconds to ms (PROF_PHASES
   values; all 0 when no step was being profiled). */
static inline void backend_profile_end(double* ms);

/* ---------------------------------------------------------------- weights and embedding */

/* out (n) act = master (n) FP32, rounded to nearest even. */
static inline void op_params_from_master(act_t* out, const float* master, size_t n);
/* out (N, C) = wte[tokens] with wte (V, C); tokens (N) backend int. */
static inline void op_encoder_forward(act_t* out, const int* tokens, const act_t* wte, size_t N, int C);
/* dwte (V, C) FP32 += scatter of dout (N, C) by token: each row of a token present is summed over its
   positions in position order first, then added (deterministic); tokens: the backend copy, tokens_host:
   the same tokens on the host. */
static inline void op_encoder_backward(float* dwte, const act_t* dout, const int* tokens, const int* tokens_host, size_t N,
                                       int C);

/* ---------------------------------------------------------------- RMSNorm */

/* out (N, C) = inp * rstd * weight, rstd (N) FP32 = 1 / sqrt(mean(inp^2) + eps) (HF LlamaRMSNorm).
   amax (may be NULL): amax->amax = max |out| over the stored values, as op_amax(amax, out, N C) would set
   it, bit for bit (NaN when any is NaN), computed as out is written; its other fields are kept. */
static inline void op_rmsnorm_forward(act_t* out, float* rstd, const act_t* inp, const act_t* weight, size_t N, int C,
                                      float eps, Fp8Scale* amax);
/* resid_out (N, C) = resid_in + branch (stored act), then norm_out, rstd = RMSNorm(resid_out), fused;
   amax (may be NULL) as op_rmsnorm_forward's, of norm_out. */
static inline void op_residual_rmsnorm_forward(act_t* resid_out, act_t* norm_out, float* rstd, const act_t* resid_in,
                                               const act_t* branch, const act_t* weight, size_t N, int C, float eps,
                                               Fp8Scale* amax);
/* With xh = inp * rstd: dinp (N, C) += rstd * (g - xh * mean(g * xh)), g = dout * weight (stored act);
   dweight (C) FP32 += sum over rows of dout * xh, deterministic. */
static inline void op_rmsnorm_backward(act_t* dinp, float* dweight, const act_t* dout, const act_t* inp,
                                       const act_t* weight, const float* rstd, size_t N, int C);

/* ---------------------------------------------------------------- RoPE */

/* RoPE in place on the q (NH heads) and k (NKV heads) parts of qkv (B, T, QKV), HF rotate-half:
   (x_i, x_{i+HS/2}) rotates by pos * theta^(-2i/HS); tables cos_t, sin_t (T, HS/2) FP32. */
static inline void op_rope_forward(act_t* qkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV,
                                   int HS);
/* The transpose rotation, on the gradients dqkv (B, T, QKV). */
static inline void op_rope_backward(act_t* dqkv, const float* cos_t, const float* sin_t, int B, int T, int NH, int NKV,
                                    int HS);

/* ---------------------------------------------------------------- attention */

/* Causal grouped-query attention: qkv (B, T, QKV) rows [q (NH HS) | k (NKV HS) | v (NKV HS)], query head
   h reads kv head h / (NH / NKV) (HF repeat_kv); out (B, T, NH HS) = softmax(q k^T / sqrt(HS)) v; stats
   (att_stats_size floats) keeps what backward needs. */
static inline void op_attention_forward(act_t* out, float* stats, const act_t* qkv, int B, int T, int NH, int NKV, int HS);
/* dqkv (B, T, QKV) = gradients of q, k, v (every element written; k and v summed over their group's
   heads) given dout (B, T, NH HS) and the forward's qkv, out and stats. */
static inline void op_attention_backward(act_t* dqkv, const act_t* dout, const act_t* qkv, const act_t* out,
                                         const float* stats, int B, int T, int NH, int NKV, int HS);
/* A (B, T) shape a run's attention takes: with its backward (training) or its forward only. */
typedef struct {
    int B, T, backward;
} AttentionShape;
/* Readies attention for the n shapes a run uses, before its first step, so that no step allocates: the
   GPU builds cuDNN's graphs and sizes their workspace for the largest (a shape not prepared then stops
   the run); the CPU needs nothing. */
static inline void op_attention_prepare(const AttentionShape* shapes, int n, int NH, int NKV, int HS);

/* ---------------------------------------------------------------- SwiGLU and classifier */

/* out (N, F) = silu(a) * b with inp (N, 2F) = [a | b] per row (SwiGLU, Shazeer 2020); amax (may be
   NULL) as op_rmsnorm_forward's, of out. */
static inline void op_swiglu_forward(act_t* out, const act_t* inp, size_t N, int F, Fp8Scale* amax);
/* dinp (N, 2F) = [dout * b * silu'(a) | dout * silu(a)]. */
static inline void op_swiglu_backward(act_t* dinp, const act_t* dout, const act_t* inp, size_t N, int F);
/* Fused softmax cross-entropy: losses (N) FP32 = logsumexp(logits_i) - logits_i[target_i]; logits (N, V)
   is overwritten with dloss * (softmax(logits_i) - onehot(target_i)). targets (N) backend int. */
static inline void op_classifier(act_t* logits, float* losses, const int* targets, size_t N, int V, float dloss);

/* ---------------------------------------------------------------- reductions and optimizer */

/* partials (ceil(n / chunk)) FP64 = sum of x^2 over each chunk of `chunk` consecutive FP32 values of x (n),
   each in a fixed order; deterministic. */
static inline void op_sum_squares_chunks(double* partials, const float* x, size_t n, size_t chunk);
/* Sum of x (n) FP64, returned to the host, in an order that depends on n only (deterministic). */
static inline double op_sum_f64(const double* x, size_t n);
/* *sum (one FP64 in backend memory) = the sum of x (n) FP32 as FP64, added in index order: the bits of
   the host loop `for i: s += x[i]`. Asynchronous on the GPU. */
static inline void op_sum_f32_in_order(double* sum, const float* x, size_t n);
/* AdamW (optim.h's adamw_update) on n FP32 master weights with moments s and grads * grad_scale: each
   moment is decoded to FP32, updated, and stored again in s.format; in fp8, each ADAMW_CHUNK-element chunk
   (the last may be partial) gets new scales from its new values' amax (optim.h "the moments' storage"). */
static inline void op_adamw(float* master, AdamwMoments s, const float* grads, size_t n, float lr, float wd, float bc1,
                            float bc2_sqrt, float grad_scale);
/* A stored FP32 array (optim.h StoreCodec; dst starts at a ZERO_CHUNK boundary, scale_inv at its first
   chunk's, NULL unless scaled): dst (n) = x (n FP32), or dst decoded + x in FP32 when accumulate, stored
   in codec c; a scaled codec gives each chunk (the last may be partial) the scale of its new amax. */
static inline void op_store_add(StoreCodec c, void* dst, float* scale_inv, const float* x, size_t n, int accumulate);
/* out (n FP32) = src (n, codec c, as op_store_add) decoded, or out + that when accumulate. */
static inline void op_store_load(StoreCodec c, float* out, const void* src, const float* scale_inv, size_t n, int accumulate);

/* ---------------------------------------------------------------- FP8 and GEMM */

/* The steps of op_fp8_quantize (below), each an op of its own for the kernel checks (dev/cuda):
   s->amax = max |x| over n act values; NaN when any is NaN (fp8.h amax_combine). Timed as PROF_FP8_CAST. */
static inline void op_amax(Fp8Scale* s, const act_t* x, size_t n);
/* s->scale, s->scale_inv from s->amax (fp8_compute_scale), s->nonfinite = 1 when that amax is not finite
   (sticky: never cleared here); then x (rows, cols) cast to codes of format f,
   written to out (rows, cols) and/or out_t (cols, rows) (either may be NULL); counts (may be NULL)
   accumulates the cast statistics. Codes are bit-identical across backends. Timed as PROF_FP8_CAST. */
static inline void op_cast_transpose(uint8_t* out, uint8_t* out_t, const act_t* x, size_t rows, size_t cols, Fp8Format f,
                                     Fp8Scale* s, int pow2, Fp8Counts* counts);
/* The delayed recipe's cast (fp8.h Fp8Recipe): x (rows, cols) cast with the scale s holds (s->scale and
   s->scale_inv are only read) into out and/or out_t as op_cast_transpose does, s->amax = max |x| of
   this tensor, and, when record is not NULL, *record (backend memory) = max(*record, that amax) (NaN
   when either is NaN), all in the cast's one pass over x. counts as op_cast_transpose's. Timed as
   PROF_FP8_CAST. */
static inline void op_cast_transpose_delayed(uint8_t* out, uint8_t* out_t, const act_t* x, size_t rows, size_t cols,
                                             Fp8Format f, Fp8Scale* s, Fp8Counts* counts, float* record);
/* The cast of an activation or gradient as the model resolved its recipe (fp8.h Fp8Quant; its pointers
   are backend memory): x (rows, cols) to codes of format f in out (rows, cols) and/or out_t (cols, rows),
   as op_amax when q->amax, then op_cast_transpose, or op_cast_transpose_delayed with q->record (after
   setting the scale from the amax, unless q->history), would. Timed as PROF_FP8_CAST. */
static inline void op_fp8_quantize(uint8_t* out, uint8_t* out_t, const act_t* x, size_t rows, size_t cols, Fp8Format f,
                                   const Fp8Quant* q);
/* The delayed recipe's update after an applied step, for n records s of format f: fp8.h's
   fp8_delayed_update of record i with its history (history + i H, a ring of H, entry `pos` replaced,
   `len` entries in use) and step_amax[i]. All in backend memory; asynchronous on the GPU. */
static inline void op_fp8_delayed_update(Fp8Scale* s, float* history, const float* step_amax, size_t n, int H, int pos, int len,
                                         int algo, Fp8Format f, int margin, int pow2);
/* s->amax = max |x| over the BF16 roundings x of master (n) FP32, the values a BF16 copy would hold; 0
   when n is 0 (NaN when any is NaN). */
static inline void op_amax_master(Fp8Scale* s, const float* master, size_t n);
/* op_cast_transpose of the BF16 roundings of master (rows, cols) FP32: the codes and counts a cast of a
   BF16 copy of it would give. rows or cols may be 0 (the scale is still set). */
static inline void op_cast_transpose_master(uint8_t* out, uint8_t* out_t, const float* master, size_t rows, size_t cols,
                                            Fp8Format f, Fp8Scale* s, int pow2, Fp8Counts* counts);
/* s[i].nonfinite = 0 for the n records s (the sticky flags the casts set); the other fields are kept. */
static inline void op_fp8_clear_nonfinite(Fp8Scale* s, size_t n);
/* s[i].amax = 0 for the n records s, ahead of the ops that compute them (op_amax, a fused amax,
   op_cast_transpose_delayed), each of which zeroes its own record first anyway: on the GPU one strided
   memset here spares those ops theirs (one per cast), once per record. The other fields are kept. */
static inline void op_fp8_reset_amax(Fp8Scale* s, size_t n);
/* out_t (cols, rows) = in (rows, cols) transposed: FP8 codes, copied. */
static inline void op_transpose_fp8(uint8_t* out_t, const uint8_t* in, size_t rows, size_t cols);
/* Runs a GEMM (fp8/gemm.h: build it with gemm_fprop / gemm_dgrad / gemm_wgrad); DT_ACT outputs are
   stored in the activation type; each element of D is rounded once, from the FP32 sum over all of k (no
   rounded partial sums, split-K included), and an accumulating GEMM adds its whole product to D in that
   one rounding (D = D + op(A) op(B)). Stops with gemm_check's reason for a GEMM the FP8 rules forbid. */
static inline void op_gemm(const GemmCall* g);
