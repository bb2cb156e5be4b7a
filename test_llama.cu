/*
 * test_llama: checks of the CUDA build, run on a GPU (scripts/device_check.sh runs them all). It
 * includes the GPU trainer under TESTING and drives the same model code as test_llama_cpu:
 *   - the HF transformers reference (dev/reference/) in bf16 and fp8, with tolerances for the GPU's
 *     summation order and tensor-core accumulators;
 *   - the CPU reference build running the same recipe on the same batch (./test_llama_cpu --dump-run
 *     writes it to build/), which isolates GPU-specific errors from the recipe's own;
 *   - every kernel family against the CPU implementation of its op (dev/cuda/kernel_cases.cuh);
 *   - bit-identical resume, recompute and gradient accumulation on the GPU; ZeRO-1/2 on one rank without
 *     NCCL and, in the one check that starts NCCL (nccl_one_rank), through a one-rank communicator;
 *   - the FP8 safety net's model paths: BF16 linears in an fp8 run, the shadow gradient comparison;
 *   - production shapes: cuDNN attention at T 4096, HS 128 (default and deterministic backward), and the
 *     FP8 linear layers of Llama-2 7B and 13B (casts and fprop/dgrad/wgrad) at N 4096 tokens;
 *   - the oracle of the CPU model of Hopper's FP8 accumulation (fp8/gemm_hopper.h): cuBLASLt's bits against
 *     the model's, printed as fractions (hopper_accum_oracle).
 * `--list` / `--only NAME` as in test_llama_cpu; `--device-info` prints the start-up line (device, CUDA /
 * cuBLASLt / cuDNN versions, attention path) that heads a run of the checks. The GEMM benchmark and the
 * random shard of the device check's throughput runs are dev/tools/ programs (bench_gemm, write_shard).
 */
#define TESTING
#include "train_llama.cu"              // the GPU trainer: backend, model, training program
#include "dev/test/reference_check.h"  // defines: reference_check, check_*_in (model-level checks, both builds)
#include "dev/test/testing.h"          // defines: run_checks, fail, RefState
#include "dev/cuda/kernel_cases.cuh"   // defines: run_kernel_case (each GPU op vs build/cpu_reference.o)

static uint64_t g_seed;

/* ------------------------------------------------------------ HF reference and the CPU build */

/*
 * Tolerances against HF: the CPU build's (CPU_REF_TOL_*, set from the errors it measures) plus what the
 * GPU may differ from the CPU build (GPU_CPU_TOL_*), as gpu_ref_tolerance derives: bf16 logits 3.5e-2,
 * loss 1.2e-3, gradients 9.2e-2, steps 1.4e-3; fp8 logits 1.5e-1, loss 1.2e-2, gradients 6.8e-1, steps 1.6e-2.
 */
static int check_reference_bf16(void) {
    return reference_check(PRECISION_BF16, REF_STATE_PATH, gpu_ref_tolerance(CPU_REF_TOL_BF16, GPU_CPU_TOL_BF16));
}

static int check_reference_fp8(void) {
    return reference_check(PRECISION_FP8, REF_STATE_PATH, gpu_ref_tolerance(CPU_REF_TOL_FP8, GPU_CPU_TOL_FP8));
}

/* The GPU against the CPU build's run of the same recipe on the same batch (GPU_CPU_TOL_*). */
static int cpu_vs_gpu(Precision p, RefTolerance tol) {
    char path[PATH_LEN], cmd[2 * PATH_LEN];
    make_dir("build");
    snprintf(path, sizeof(path), "build/cpu_run_%s.bin", precision_name(p));
    snprintf(cmd, sizeof(cmd), "./test_llama_cpu --dump-run %s %s > /dev/null", precision_name(p), path);
    if (system(cmd) != 0) return fail("'%s' failed (build it with make test_llama_cpu)", cmd);
    return reference_check(p, path, tol);
}

static int check_cpu_vs_gpu_bf16(void) { return cpu_vs_gpu(PRECISION_BF16, GPU_CPU_TOL_BF16); }

static int check_cpu_vs_gpu_fp8(void) { return cpu_vs_gpu(PRECISION_FP8, GPU_CPU_TOL_FP8); }

/* ------------------------------------------------------------ model-level GPU checks */

/* Needs deterministic attention backward (main sets LLM8_DETERMINISTIC=1 for the checks). */
static int check_resume_bit_identical(void) { return check_resume_in(PRECISION_FP8); }

static int check_fp8_weights(void) { return check_fp8_weights_in(); }

static int check_recompute_bf16(void) { return check_recompute_in(PRECISION_BF16); }

static int check_recompute_fp8(void) { return check_recompute_in(PRECISION_FP8); }

/* The losses summed on the device (llama_forward_deferred) equal llama_forward's, bit for bit. */
static int check_forward_deferred(void) { return check_forward_deferred_in(PRECISION_FP8); }

/* The RMSNorm and SwiGLU kernels' fused amax leaves an fp8 run (-r 0, -r 2) bit-identical to op_amax reads. */
static int check_fused_amax(void) { return check_fused_amax_in(PRECISION_FP8); }

/* BF16: the split changes GEMM shapes (other algorithms, other summation order), hence 1e-2. */
static int check_grad_accumulation(void) { return check_grad_accumulation_in(PRECISION_BF16, 1e-2); }

/* One rank without NCCL (ZeRO-1/2: reduce-scatters as local copies, accumulation kernels, the
   communication stream and its events) against ZeRO-0: bit-identical. Needs a process that has not
   started NCCL (nccl_one_rank does; the device check runs every check in its own process). */
static int check_zero_one_rank(void) {
    if (g_nccl != NULL) return fail("an NCCL communicator exists already (nccl_one_rank ran first): run --only zero_one_rank");
    return check_zero_stages_in(PRECISION_FP8);
}

/* NCCL's start on this machine (a one-rank communicator: bootstrap, /dev/shm, its kernels) and the same
   ZeRO-1/2 run through it against ZeRO-0: bit-identical. The only check that starts NCCL, so that a
   machine where NCCL cannot start fails this row alone. */
static int check_nccl_one_rank(void) {
    comm_nccl_start();
    return check_zero_stages_in(PRECISION_FP8);
}

/* An fp8 run's block linears in BF16 (fallback, --bf16-layers) run the bf16 recipe's kernels: bit for bit
   (deterministic attention backward, set in main). */
static int check_bf16_linears_in_fp8(void) { return check_bf16_linears_in_fp8_in(); }

/* The shadow check's three-pass gradient comparison: the negated FP8 pass must give exactly -g8, which
   holds with deterministic kernels; 1e-6 leaves room for the GPU's summation of the chunk partials. */
static int check_shadow_grad_compare(void) { return check_shadow_grad_compare_in(1e-6); }

/* ------------------------------------------------------------ kernels against the CPU ops */

/* Small enough for the CPU side, with GQA, dimensions that are multiples of 16 and a row length that
   is not a multiple of the cast-transpose tile. */
static const KernelShape SMALL_SHAPE = {2, 96, 192, 6, 2, 528, 4000};

#define KERNEL_CHECK(family) \
    static int check_kernel_##family(void) { return run_kernel_case(#family, &SMALL_SHAPE, 0, g_seed) != 0; }
KERNEL_CHECK(optimizer)
KERNEL_CHECK(encoder)
KERNEL_CHECK(rmsnorm)
KERNEL_CHECK(rope)
KERNEL_CHECK(attention)
KERNEL_CHECK(swiglu)
KERNEL_CHECK(classifier)
KERNEL_CHECK(fp8_cast)
KERNEL_CHECK(fp8_cast_vec)
KERNEL_CHECK(fp8_weight)
KERNEL_CHECK(gemm)
KERNEL_CHECK(grad_fp8)
#if defined(USE_CUDNN) && defined(ATTENTION_FALLBACK)
KERNEL_CHECK(attention_fallback)
#endif

/* ------------------------------------------------------------ production shapes */

/* The micro-batch the production-shape checks use: one sequence of 4096 tokens, as Llama-2 trains. */
#define PROD_B 1
#define PROD_T 4096

/* The emulated GPU takes the attention checks at HS 128 with 8 heads and T 512: its double of cuDNN and
   the CPU reference compute on the CPU. */
#ifdef LLM8_EMU
#define PROD_ATT_T 512
#define PROD_ATT_HEADS 8
#else
#define PROD_ATT_T PROD_T
#define PROD_ATT_HEADS c->n_heads
#endif

/*
 * Attention at the Llama-2 7B shape (T 4096, HS 128, the 13B head size too) with cuDNN's default backward
 * (the fastest, not bit-reproducible: the one training runs) or its deterministic one, against the CPU op on
 * a slice of the heads (kc_attention_compare), plus a GQA case.
 */
static int prod_attention(int deterministic) {
    const LlamaConfig* c = llama_preset("llama2-7b");
    int NH = PROD_ATT_HEADS, HS = c->dim / c->n_heads;
    KernelShape s = {PROD_B, PROD_ATT_T, NH * HS, NH, NH * c->n_kv_heads / c->n_heads, c->ffn_dim, c->vocab_size};
    backend_init(PRECISION_BF16); /* first: its start-up reads LLM8_DETERMINISTIC */
    int previous = attention_set_deterministic(deterministic);
    printf("    attention backward: %s\n", deterministic ? "deterministic" : "default (fastest)");
    int failed = run_kernel_case("attention", &s, 0, g_seed);
    attention_set_deterministic(previous);
    return failed != 0;
}

static int check_prod_attention(void) { return prod_attention(0); }

static int check_prod_attention_deterministic(void) { return prod_attention(1); }

/* An FP8 operand as the GPU cast it: codes in both layouts and the scale, on the device and on the host. */
typedef struct {
    DType dtype;
    uint8_t *d_codes, *d_codes_t, *codes, *codes_t;
    Fp8Scale* d_scale;
    Fp8Scale scale;
} ProdFp8Operand;

/* One layout of the operand as a GEMM reads it: the GPU's codes and scale_inv, or their host copies. */
static GemmOperand prod_gemm_operand(const ProdFp8Operand* o, int transposed, int gpu) {
    const uint8_t* codes = gpu ? (transposed ? o->d_codes_t : o->d_codes) : (transposed ? o->codes_t : o->codes);
    return gemm_operand_fp8(codes, o->dtype, gpu ? &o->d_scale->scale_inv : &o->scale.scale_inv);
}

/*
 * Casts x (rows, cols) (host BF16 values) to format f on the GPU as model.h does (op_amax, then
 * op_cast_transpose into both layouts) and checks amax, scale, scale_inv and every code of both layouts
 * against the CPU cast of the same values: bit-identical. Returns the number of failed comparisons.
 */
static int prod_cast(ProdFp8Operand* o, const char* label, const float* x, size_t rows, size_t cols, Fp8Format f) {
    size_t n = rows * cols;
    act_t* d_x = kc_dev_act(x, n);
    o->dtype = f == FP8_E4M3 ? DT_E4M3 : DT_E5M2;
    o->d_codes = (uint8_t*)dev_alloc(n);
    o->d_codes_t = (uint8_t*)dev_alloc(n);
    o->d_scale = (Fp8Scale*)dev_alloc(sizeof(Fp8Scale));
    kc_poison(o->d_codes, n);
    kc_poison(o->d_codes_t, n);
    kc_poison(o->d_scale, sizeof(Fp8Scale));
    op_amax(o->d_scale, d_x, n);
    op_fp8_clear_nonfinite(o->d_scale, 1);
    op_cast_transpose(o->d_codes, o->d_codes_t, d_x, rows, cols, f, o->d_scale, 0, NULL);
    o->codes = (uint8_t*)mallocCheck(n);
    o->codes_t = (uint8_t*)mallocCheck(n);
    dev_download(o->codes, o->d_codes, n);
    dev_download(o->codes_t, o->d_codes_t, n);
    dev_download(&o->scale, o->d_scale, sizeof(Fp8Scale));
    dev_free(d_x);
    uint8_t* ref = (uint8_t*)mallocCheck(n);
    uint8_t* ref_t = (uint8_t*)mallocCheck(n);
    Fp8Scale sc;
    cpu_ref_amax(&sc, x, n);
    sc.nonfinite = 0.0f;
    cpu_ref_cast_transpose(ref, ref_t, x, rows, cols, f, &sc, 0, NULL);
    char what[64];
    snprintf(what, sizeof(what), "cast %s (%zu, %zu) %s", label, rows, cols, fp8_format_name(f));
    int failed = kc_compare_cast(what, o->codes, o->codes_t, ref, ref_t, n, o->scale, sc);
    free(ref);
    free(ref_t);
    return failed;
}

static void prod_operand_free(ProdFp8Operand* o) {
    dev_free(o->d_codes);
    dev_free(o->d_codes_t);
    dev_free(o->d_scale);
    free(o->codes);
    free(o->codes_t);
}

/* x (n) = N(0, std^2) rounded to BF16 values, from the next seed of *stream (malloc'd). */
static float* prod_normal(size_t n, uint64_t* stream, float std) {
    float* x = kc_host(n);
    kc_fill_normal(x, n, splitmix64(stream), 0.0f, std, 1);
    return x;
}

/*
 * The four FP8 linear layers of a Llama-2 block (wqkv, wo, w13, w2) at the preset's shapes with
 * N = PROD_B * PROD_T tokens, as model.h runs them: W and X cast to E4M3 and dY to E5M2 on the GPU
 * (prod_cast: bit-identical to the CPU cast), then fprop (fast accumulation, k = C or F), dgrad (k = OC) and
 * wgrad (k = N, += into FP32) on the GPU's codes, against the CPU emulation of the same codes and scales on
 * as many output columns as the CPU can afford (kc_gemm_run), within kc_fp8_gemm_tolerance. Inputs as in
 * training: X ~ N(0, 1), W ~ N(0, 0.02^2), dY ~ N(0, 1e-6), the FP32 gradient dW already holding N(0, 1e-4).
 */
static int prod_fp8_linear(const char* preset) {
    const LlamaConfig* c = llama_preset(preset);
    backend_init(PRECISION_FP8);
    cpu_ref_init(PRECISION_BF16);
    uint64_t stream = g_seed;
    size_t N = (size_t)PROD_B * PROD_T;
    int failed = 0;
    for (int lin = 0; lin < LIN_PER_LAYER; lin++) {
        size_t OC, C;
        llama_linear_dims(c, (LinearId)lin, &OC, &C);
        printf("  %s %s: X (%zu, %zu), W (%zu, %zu), dY (%zu, %zu)\n", preset, LINEAR_NAMES[lin], N, C, OC, C, N, OC);
        fflush(stdout);
        ProdFp8Operand w, x, dy;
        float* host = prod_normal(OC * C, &stream, 0.02f);
        failed += prod_cast(&w, "W", host, OC, C, FP8_E4M3);
        free(host);
        host = prod_normal(N * C, &stream, 1.0f);
        failed += prod_cast(&x, "X", host, N, C, FP8_E4M3);
        free(host);
        host = prod_normal(N * OC, &stream, 1e-3f);
        failed += prod_cast(&dy, "dY", host, N, OC, FP8_E5M2);
        free(host);
        float* dW0 = kc_host(OC * C);
        kc_fill_normal(dW0, OC * C, splitmix64(&stream), 0.0f, 1e-2f, 0);
        GemmCall calls[2][3]; /* [CPU, GPU][fprop, dgrad, wgrad]: the same codes on both sides */
        for (int gpu = 0; gpu < 2; gpu++) {
            calls[gpu][0] = gemm_fprop(NULL, DT_ACT, prod_gemm_operand(&w, 0, gpu), prod_gemm_operand(&x, 0, gpu), N, C, OC);
            calls[gpu][1] = gemm_dgrad(NULL, DT_ACT, prod_gemm_operand(&w, 1, gpu), prod_gemm_operand(&dy, 0, gpu), N, C, OC);
            calls[gpu][2] = gemm_wgrad(NULL, prod_gemm_operand(&x, 1, gpu), prod_gemm_operand(&dy, 1, gpu), N, C, OC);
        }
        const char* kinds[3] = {"fprop E4M3xE4M3 fast_accum bf16", "dgrad E4M3xE5M2 bf16", "wgrad E4M3xE5M2 f32 +="};
        for (int g = 0; g < 3; g++) {
            char name[64];
            snprintf(name, sizeof(name), "%s %s", LINEAR_NAMES[lin], kinds[g]);
            KcGemm gemm = kc_fp8_gemm(name, calls[0][g], calls[1][g], g == 2 ? dW0 : NULL);
            printf("    %s: m %zu n %zu k %zu\n", name, gemm.gpu.m, gemm.gpu.n, gemm.gpu.k);
            failed += kc_gemm_run(&gemm, 0);
        }
        fflush(stdout);
        free(dW0);
        prod_operand_free(&w);
        prod_operand_free(&x);
        prod_operand_free(&dy);
    }
    return failed != 0;
}

static int check_prod_fp8_linear_7b(void) { return prod_fp8_linear("llama2-7b"); }

static int check_prod_fp8_linear_13b(void) { return prod_fp8_linear("llama2-13b"); }

/* ------------------------------------------------------------ the Hopper accumulation model's oracle */

#define ORACLE_M 1024            /* output features: small, so the CPU model takes seconds */
#define ORACLE_N 64              /* tokens */
#define ORACLE_OUTLIER_EVERY 97  /* one channel (k) in 97 of X and dY is an outlier ... */
#define ORACLE_OUTLIER_GAIN 32.0f /* ... this many times larger (a power of 2: still a BF16 value) */
#define ORACLE_MAX_SPLITS 4      /* contiguous split-K counts tried with the model, 1 (the trainer's) first */

/* x (rows, K) = N(0, std^2) BF16 values; with outliers, every ORACLE_OUTLIER_EVERY-th channel k scaled up. */
static float* oracle_values(size_t rows, size_t K, uint64_t* stream, float std, int outliers) {
    float* x = prod_normal(rows * K, stream, std);
    if (outliers) {
#pragma omp parallel for schedule(static)
        for (size_t r = 0; r < rows; r++)
            for (size_t k = 3; k < K; k += ORACLE_OUTLIER_EVERY) x[r * K + k] *= ORACLE_OUTLIER_GAIN;
    }
    return x;
}

/* Number of outputs whose bits agree (kc_same_bits). */
static size_t oracle_same(const float* a, const float* b, size_t n) {
    size_t same = 0;
    for (size_t i = 0; i < n; i++) same += kc_same_bits(a[i], b[i]);
    return same;
}

/*
 * The only real oracle of fp8/gemm_hopper.h: cuBLASLt's FP8 GEMM (op_gemm, i.e. gemm_cublaslt) on
 * the GPU against the CPU model on the same codes and scales, at the 7B reduction lengths K 4096 (C) and 11008
 * (F) with m ORACLE_M, n ORACLE_N: fprop (E4M3 x E4M3, fast accumulation) and dgrad (E4M3 x E5M2, without),
 * each to BF16 and to FP32 D. The operands are cast on the GPU (prod_cast: bit-identical to the CPU cast), X and
 * dY with outlier channels (they set the block alignment that truncates the small products). Prints, per GEMM,
 * the fraction of bit-equal outputs for the model unsplit (what the trainer runs), for the best of 1 ..
 * ORACLE_MAX_SPLITS contiguous split-K parts (cuBLASLt's split choice is not modelled), and for the exact
 * emulation, and the "table:" line device_check.sh puts in its row. A low fraction does not fail (the split
 * guess, another cuBLASLt); errors beyond the normal FP8 GEMM tolerance against the exact emulation
 * (kc_fp8_gemm_tolerance) or a cast that differs from the CPU's do.
 */
static int check_hopper_accum_oracle(void) {
    backend_init(PRECISION_FP8);
    cpu_ref_init(PRECISION_BF16);
    uint64_t stream = g_seed;
    const size_t Ks[2] = {4096, 11008}, M = ORACLE_M, N = ORACLE_N, nd = M * N;
    int failed = 0;
    size_t same_unsplit[2] = {0, 0}, same_best[2] = {0, 0}, same_exact[2] = {0, 0}, total[2] = {0, 0}; /* [BF16, FP32] */
    float* exact = kc_host(nd);
    float* model = kc_host(nd);
    for (int ki = 0; ki < 2; ki++) {
        size_t K = Ks[ki];
        for (int kind = 0; kind < 2; kind++) { /* fprop, dgrad */
            ProdFp8Operand a, b;
            char label[32];
            float* host = oracle_values(M, K, &stream, 0.02f, 0);
            snprintf(label, sizeof(label), "%s K %zu", kind == 0 ? "W" : "W^T", K);
            failed += prod_cast(&a, label, host, M, K, FP8_E4M3);
            free(host);
            host = oracle_values(N, K, &stream, kind == 0 ? 1.0f : 1e-3f, 1);
            snprintf(label, sizeof(label), "%s K %zu", kind == 0 ? "X" : "dY", K);
            failed += prod_cast(&b, label, host, N, K, kind == 0 ? FP8_E4M3 : FP8_E5M2);
            free(host);
            for (int f32 = 0; f32 < 2; f32++) {
                DType dt = f32 ? DT_F32 : DT_ACT;
                GemmCall call[2]; /* [CPU, GPU]: the same codes and scales */
                for (int gpu = 0; gpu < 2; gpu++)
                    call[gpu] = kind == 0 ? gemm_fprop(NULL, dt, prod_gemm_operand(&a, 0, gpu), prod_gemm_operand(&b, 0, gpu), N, K, M)
                                          : gemm_dgrad(NULL, dt, prod_gemm_operand(&a, 0, gpu), prod_gemm_operand(&b, 0, gpu), N, M, K);
                char name[96];
                snprintf(name, sizeof(name), "%s %s K %zu %s", kind == 0 ? "fprop" : "dgrad",
                         kind == 0 ? "E4M3xE4M3 fast_accum" : "E4M3xE5M2", K, f32 ? "f32" : "bf16");
                size_t elem = f32 ? sizeof(float) : sizeof(act_t);
                void* d = dev_alloc(nd * elem);
                kc_poison(d, nd * elem);
                call[1].d = d;
                op_gemm(&call[1]);
                float* got = f32 ? kc_get_f32((const float*)d, nd) : kc_get_act((const act_t*)d, nd);
                dev_free(d);
                call[0].d = exact;
                cpu_ref_gemm(&call[0]);
                size_t se = oracle_same(got, exact, nd), s1 = 0, best = 0;
                int best_splits = 1;
                call[0].d = model;
                call[0].accum = FP8_ACCUM_HOPPER;
                for (int splits = 1; splits <= ORACLE_MAX_SPLITS; splits++) {
                    if (cpu_ref_gemm_hopper(&call[0], splits)) {
                        failed += fail("%s: the Hopper model refused the GEMM (non-finite code?)", name);
                        break;
                    }
                    size_t same = oracle_same(got, model, nd);
                    if (splits == 1) s1 = same;
                    if (same > best) best = same, best_splits = splits;
                }
                printf("    %s: bit-equal outputs of %zu: hopper model unsplit %.4f, best split (%d) %.4f, exact emulation %.4f\n",
                       name, nd, (double)s1 / nd, best_splits, (double)best / nd, (double)se / nd);
                double rel_l2, max_abs_frac;
                kc_fp8_gemm_tolerance(&call[1], &rel_l2, &max_abs_frac);
                failed += kc_compare_norm(name, got, exact, nd, rel_l2, max_abs_frac);
                same_unsplit[f32] += s1;
                same_best[f32] += best;
                same_exact[f32] += se;
                total[f32] += nd;
                free(got);
            }
            fflush(stdout);
            prod_operand_free(&a);
            prod_operand_free(&b);
        }
    }
    printf("table: bit-equal BF16 %.4f (best split %.4f, exact %.4f), FP32 %.4f (best split %.4f, exact %.4f)\n",
           (double)same_unsplit[0] / total[0], (double)same_best[0] / total[0], (double)same_exact[0] / total[0],
           (double)same_unsplit[1] / total[1], (double)same_best[1] / total[1], (double)same_exact[1] / total[1]);
    free(exact);
    free(model);
    return failed != 0;
}

static Check CHECKS[] = {
    {"reference_bf16", check_reference_bf16, "GPU bf16 vs HF transformers (float64)"},
    {"reference_fp8", check_reference_fp8, "GPU fp8 vs HF transformers (float64)"},
    {"cpu_vs_gpu_bf16", check_cpu_vs_gpu_bf16, "GPU bf16 vs the CPU build's bf16 on the same batch"},
    {"cpu_vs_gpu_fp8", check_cpu_vs_gpu_fp8, "GPU fp8 vs the CPU build's fp8 on the same batch"},
    {"kernel_optimizer", check_kernel_optimizer, "params_from_master, gradient-norm reduction, AdamW vs CPU"},
    {"kernel_encoder", check_kernel_encoder, "embedding forward/backward vs CPU"},
    {"kernel_rmsnorm", check_kernel_rmsnorm, "RMSNorm (+ fused residual) forward/backward vs CPU"},
    {"kernel_rope", check_kernel_rope, "RoPE forward/backward vs CPU"},
    {"kernel_attention", check_kernel_attention, "causal GQA attention forward/backward vs CPU"},
#if defined(USE_CUDNN) && defined(ATTENTION_FALLBACK)
    {"kernel_attention_fallback", check_kernel_attention_fallback, "the fallback attention kernels (emulated build) vs CPU"},
#endif
    {"kernel_swiglu", check_kernel_swiglu, "SwiGLU forward/backward vs CPU"},
    {"kernel_classifier", check_kernel_classifier, "fused softmax cross-entropy vs CPU"},
    {"kernel_fp8_cast", check_kernel_fp8_cast, "amax + FP8 cast-transpose bit-identical to CPU"},
    {"kernel_fp8_cast_vec", check_kernel_fp8_cast_vec, "element-wise and vectorized cast-transpose kernels bit-identical to CPU"},
    {"kernel_fp8_weight", check_kernel_fp8_weight, "FP8 weights from master weights (amax, cast, transpose) bit-identical to CPU"},
    {"kernel_gemm", check_kernel_gemm, "cuBLASLt BF16/FP8 GEMMs vs the CPU emulation"},
    {"kernel_grad_fp8", check_kernel_grad_fp8, "--grad-reduce fp8 pack and sum kernels bit-identical to CPU"},
    {"resume_bit_identical", check_resume_bit_identical, "GPU save -> load -> continue reproduces losses and weights"},
    {"fp8_weights", check_fp8_weights, "GPU: E4M3 W, W^T cast from bf16(master weights); llama_bf16_weight"},
    {"recompute_bf16", check_recompute_bf16, "GPU bf16 -r 1 and -r 2: bit-identical losses, gradients, weights"},
    {"recompute_fp8", check_recompute_fp8, "GPU fp8 -r 1 and -r 2: bit-identical losses, gradients, weights, FP8 statistics"},
    {"forward_deferred", check_forward_deferred, "GPU: losses summed on the device (llama_forward_deferred) equal llama_forward's"},
    {"fused_amax", check_fused_amax, "GPU fp8 with the producers' fused amax vs separate op_amax: bit-identical runs"},
    {"grad_accumulation", check_grad_accumulation, "GPU: 2 micro-batches accumulate the 1-batch gradient"},
    {"zero_one_rank", check_zero_one_rank, "GPU: ZeRO-1/2 on one rank without NCCL (local copies) equal ZeRO-0 bit for bit"},
    {"nccl_one_rank", check_nccl_one_rank, "GPU: NCCL starts (one-rank communicator); ZeRO-1/2 through it equal ZeRO-0 bit for bit"},
    {"prod_attention", check_prod_attention, "attention at T 4096, HS 128 (emulated GPU: T 512, 8 heads), default (fastest) backward vs CPU on a slice"},
    {"prod_attention_deterministic", check_prod_attention_deterministic, "the same with the deterministic backward"},
    {"prod_fp8_linear_7b", check_prod_fp8_linear_7b, "Llama-2 7B linear layers, N 4096: FP8 casts vs CPU, fprop/dgrad/wgrad vs CPU emulation"},
    {"prod_fp8_linear_13b", check_prod_fp8_linear_13b, "Llama-2 13B linear layers, N 4096: the same"},
    {"hopper_accum_oracle", check_hopper_accum_oracle, "cuBLASLt FP8 GEMMs at K 4096/11008 vs the CPU Hopper accumulation model: bit-equal fractions"},
    {"bf16_linears_in_fp8", check_bf16_linears_in_fp8, "GPU: fp8 with every block linear in BF16 equals the bf16 recipe bit for bit"},
    {"shadow_grad_compare", check_shadow_grad_compare, "GPU: shadow gradient comparison (three passes) vs the direct one"},
};

int main(int argc, char** argv) {
    if (argc == 2 && strcmp(argv[1], "--device-info") == 0) {
        backend_init(PRECISION_BF16); /* prints the start-up line: device, library versions, attention path */
        return 0;
    }
    /* cuDNN's default attention backward is not bit-reproducible; the resume check needs it to be */
    setenv("LLM8_DETERMINISTIC", "1", 0);
    /* one rank: the device and the communication stream of the checkpoint and ZeRO checks, no NCCL
       (only nccl_one_rank starts it); listing the checks needs no GPU */
    int listing = argc == 2 && strcmp(argv[1], "--list") == 0;
    if (!listing) comm_init(&argc, &argv);
    g_seed = test_seed(argc, argv);
    int status = run_checks(CHECKS, (int)(sizeof(CHECKS) / sizeof(CHECKS[0])), argc, argv);
    if (!listing) comm_finalize(); /* a launcher (mpirun) takes an exit without MPI_Finalize for a failure */
    return status;
}
