/*
 * test_llama: checks of the CUDA build, run on a GPU (scripts/device_check.sh runs them all). It
 * includes the GPU trainer under TESTING and drives the same model code as test_llama_cpu:
 *   - the HF transformers reference (dev/reference/) in bf16 and fp8, with tolerances for the GPU's
 *     summation order and tensor-core accumulators;
 *   - the CPU reference build running the same recipe on the same batch (./test_llama_cpu --dump-run
 *     writes it to build/), which isolates GPU-specific errors from the recipe's own;
 *   - every kernel family against the CPU implementation of its op (dev/cuda/kernel_cases.cuh);
 *   - bit-identical resume, recompute and gradient accumulation on the GPU;
 *   - the FP8 safety net's model paths: BF16 linears in an fp8 run, the shadow gradient comparison.
 * `--list` / `--only NAME` as in test_llama_cpu. Tool modes: --bench-gemm (FP8 vs BF16 GEMM TFLOP/s at
 * Llama-2 7B/13B shapes) and --write-shard PATH TOKENS SEED (random tokens for throughput runs).
 */
#define TESTING
#include "train_llama.cu"              // the GPU trainer: backend, model, training program
#include "dev/test/reference_check.h"  // defines: reference_check, check_*_in (model-level checks, both builds)
#include "dev/test/testing.h"          // defines: run_checks, fail, RefState
#include "dev/cuda/kernel_cases.cuh"   // defines: run_kernel_case (each GPU op vs build/cpu_reference.o)

static uint64_t g_seed;

/* ------------------------------------------------------------ HF reference and the CPU build */

/*
 * Tolerances against HF: the CPU build's (test_llama.c) widened for the GPU's other summation order,
 * cuDNN's flash attention (P rounded to BF16 before P V) and FP8 fast accumulation in fprop.
 */
static int check_reference_bf16(void) {
    RefTolerance tol = {3e-2, 2e-3, 8e-2, 2e-3};
    return reference_check(PRECISION_BF16, REF_STATE_PATH, tol);
}

static int check_reference_fp8(void) {
    RefTolerance tol = {8e-2, 2e-2, 3e-1, 2e-2};
    return reference_check(PRECISION_FP8, REF_STATE_PATH, tol);
}

/*
 * The GPU against the CPU build on the same recipe: both round at the same places, so what is left is
 * summation order, accumulator width and the odd value on the other side of a BF16/FP8 rounding boundary.
 */
static int cpu_vs_gpu(Precision p, RefTolerance tol) {
    char path[PATH_LEN], cmd[2 * PATH_LEN];
    make_dir("build");
    snprintf(path, sizeof(path), "build/cpu_run_%s.bin", precision_name(p));
    snprintf(cmd, sizeof(cmd), "./test_llama_cpu --dump-run %s %s > /dev/null", precision_name(p), path);
    if (system(cmd) != 0) return fail("'%s' failed (build it with make test_llama_cpu)", cmd);
    return reference_check(p, path, tol);
}

static int check_cpu_vs_gpu_bf16(void) {
    RefTolerance tol = {2e-2, 1e-3, 5e-2, 1e-3};
    return cpu_vs_gpu(PRECISION_BF16, tol);
}

static int check_cpu_vs_gpu_fp8(void) {
    RefTolerance tol = {5e-2, 1e-2, 2e-1, 1e-2};
    return cpu_vs_gpu(PRECISION_FP8, tol);
}

/* ------------------------------------------------------------ model-level GPU checks */

/* Needs deterministic attention backward (main sets LLM8_DETERMINISTIC=1 for the checks). */
static int check_resume_bit_identical(void) { return check_resume_in(PRECISION_FP8); }

static int check_recompute_identical(void) { return check_recompute_in(PRECISION_BF16); }

/* BF16: the split changes GEMM shapes (other algorithms, other summation order), hence 1e-2. */
static int check_grad_accumulation(void) { return check_grad_accumulation_in(PRECISION_BF16, 1e-2); }

/* The NCCL path with one rank (ZeRO-1/2: reduce-scatters, accumulation kernels, the communication
   stream and its events) against ZeRO-0, which communicates nothing: bit-identical. */
static int check_nccl_one_rank(void) { return check_zero_stages_in(PRECISION_FP8); }

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
KERNEL_CHECK(gemm)

/* ------------------------------------------------------------ GEMM benchmark */

/* Fills n BF16 values with a hash of their index, in [-1, 1). */
__global__ void fill_bf16_kernel(act_t* x, size_t n, uint32_t salt) {
    for (size_t i = grid_index(); i < n; i += grid_stride()) {
        uint32_t h = (uint32_t)i * 2654435761u ^ salt;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = f_to_bf16((float)(h & 0xffffff) * 0x1p-23f - 1.0f);
    }
}

static act_t* random_bf16(size_t n, uint32_t salt) {
    act_t* x = (act_t*)dev_alloc(n * sizeof(act_t));
    fill_bf16_kernel<<<grid_for(n, BLOCK_THREADS), BLOCK_THREADS>>>(x, n, salt);
    launchCheck();
    return x;
}

/* Mean milliseconds of `iters` calls of a GEMM after warm-up (cuBLASLt's heuristic runs in the warm-up). */
#define BENCH_WARMUP 3
#define BENCH_ITERS 20

static double time_gemm(const GemmCall* g) {
    cudaEvent_t start, stop;
    cudaCheck(cudaEventCreate(&start));
    cudaCheck(cudaEventCreate(&stop));
    for (int i = 0; i < BENCH_WARMUP; i++) op_gemm(g);
    cudaCheck(cudaEventRecord(start));
    for (int i = 0; i < BENCH_ITERS; i++) op_gemm(g);
    cudaCheck(cudaEventRecord(stop));
    cudaCheck(cudaEventSynchronize(stop));
    float ms;
    cudaCheck(cudaEventElapsedTime(&ms, start, stop));
    cudaCheck(cudaEventDestroy(start));
    cudaCheck(cudaEventDestroy(stop));
    return ms / BENCH_ITERS;
}

/*
 * FP8 vs BF16 TFLOP/s of the twelve GEMMs of one block (four linear layers x fprop/dgrad/wgrad) at the
 * Llama-2 7B and 13B shapes with M = B*T = 4096 tokens, laid out exactly as model.h issues them (BF16:
 * TN / NN / NT; FP8: TN on the W, W^T, X^T, dY, dY^T copies). Prints one line per GEMM and a summary line
 * per model: "gemm <model> block: bf16 X ms, fp8 Y ms, speedup Z".
 */
static int bench_gemm(void) {
    backend_init(PRECISION_FP8);
    const char* names[2] = {"llama2-7b", "llama2-13b"};
    const size_t M = 4096;
    printf("%-11s %-5s %-6s %6s %6s %6s | %9s %9s | %7s\n", "model", "layer", "gemm", "m", "n", "k", "bf16 TF/s", "fp8 TF/s", "speedup");
    for (int mi = 0; mi < 2; mi++) {
        const LlamaConfig* c = llama_preset(names[mi]);
        double total_bf16 = 0.0, total_fp8 = 0.0;
        for (int lin = 0; lin < LIN_PER_LAYER; lin++) {
            size_t OC, C;
            llama_linear_dims(c, (LinearId)lin, &OC, &C);
            size_t w_elems = OC * C, x_elems = M * C, y_elems = M * OC;
            act_t* W = random_bf16(w_elems, 1);
            act_t* X = random_bf16(x_elems, 2);
            act_t* dY = random_bf16(y_elems, 3);
            act_t* Y = (act_t*)dev_alloc(y_elems * sizeof(act_t));
            act_t* dX = (act_t*)dev_alloc(x_elems * sizeof(act_t));
            float* dW = (float*)dev_alloc(w_elems * sizeof(float));
            dev_zero(dW, w_elems * sizeof(float));
            uint8_t *w8 = (uint8_t*)dev_alloc(w_elems), *wt8 = (uint8_t*)dev_alloc(w_elems);
            uint8_t *x8 = (uint8_t*)dev_alloc(x_elems), *xt8 = (uint8_t*)dev_alloc(x_elems);
            uint8_t *dy8 = (uint8_t*)dev_alloc(y_elems), *dyt8 = (uint8_t*)dev_alloc(y_elems);
            Fp8Scale* s = (Fp8Scale*)dev_alloc(3 * sizeof(Fp8Scale));
            op_amax(&s[0], W, w_elems);
            op_cast_transpose(w8, wt8, W, OC, C, FP8_E4M3, &s[0], 0, NULL);
            op_amax(&s[1], X, x_elems);
            op_cast_transpose(x8, xt8, X, M, C, FP8_E4M3, &s[1], 0, NULL);
            op_amax(&s[2], dY, y_elems);
            op_cast_transpose(dy8, dyt8, dY, M, OC, FP8_E5M2, &s[2], 0, NULL);
            GemmCall bf16[3] = {
                gemm_fprop(Y, DT_ACT, gemm_operand(W, DT_ACT), gemm_operand(X, DT_ACT), M, C, OC),
                gemm_dgrad(dX, DT_ACT, gemm_operand(W, DT_ACT), gemm_operand(dY, DT_ACT), M, C, OC),
                gemm_wgrad(dW, gemm_operand(X, DT_ACT), gemm_operand(dY, DT_ACT), M, C, OC),
            };
            GemmCall fp8[3] = {
                gemm_fprop(Y, DT_ACT, gemm_operand_fp8(w8, DT_E4M3, &s[0].scale_inv), gemm_operand_fp8(x8, DT_E4M3, &s[1].scale_inv), M, C, OC),
                gemm_dgrad(dX, DT_ACT, gemm_operand_fp8(wt8, DT_E4M3, &s[0].scale_inv), gemm_operand_fp8(dy8, DT_E5M2, &s[2].scale_inv), M, C, OC),
                gemm_wgrad(dW, gemm_operand_fp8(xt8, DT_E4M3, &s[1].scale_inv), gemm_operand_fp8(dyt8, DT_E5M2, &s[2].scale_inv), M, C, OC),
            };
            const char* gemm_names[3] = {"fprop", "dgrad", "wgrad"};
            for (int g = 0; g < 3; g++) {
                double flops = 2.0 * bf16[g].m * bf16[g].n * bf16[g].k;
                double tb = time_gemm(&bf16[g]), tf = time_gemm(&fp8[g]);
                total_bf16 += tb;
                total_fp8 += tf;
                printf("%-11s %-5s %-6s %6zu %6zu %6zu | %9.1f %9.1f | %6.2fx\n", names[mi], LINEAR_NAMES[lin], gemm_names[g],
                       bf16[g].m, bf16[g].n, bf16[g].k, flops / tb / 1e9, flops / tf / 1e9, tb / tf);
            }
            void* bufs[] = {W, X, dY, Y, dX, dW, w8, wt8, x8, xt8, dy8, dyt8, s};
            for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) dev_free(bufs[i]);
        }
        printf("gemm %s block: bf16 %.3f ms, fp8 %.3f ms, speedup %.2fx\n", names[mi], total_bf16, total_fp8,
               total_bf16 / total_fp8);
    }
    return 0;
}

/* ------------------------------------------------------------ tool: random shard */

/* Writes a version-1 shard of n random tokens in [3, 32000), a BOS every 1024 tokens (documents). */
static void write_random_shard(const char* path, size_t n, uint64_t seed) {
    Rng rng;
    rng_seed(&rng, seed);
    uint16_t* tokens = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) tokens[i] = i % 1024 == 0 ? LLAMA_BOS : (uint16_t)(3 + rng_below(&rng, LLAMA_VOCAB_SIZE - 3));
    shard_write_u16(path, tokens, n);
    free(tokens);
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
    {"kernel_swiglu", check_kernel_swiglu, "SwiGLU forward/backward vs CPU"},
    {"kernel_classifier", check_kernel_classifier, "fused softmax cross-entropy vs CPU"},
    {"kernel_fp8_cast", check_kernel_fp8_cast, "amax + FP8 cast-transpose bit-identical to CPU"},
    {"kernel_gemm", check_kernel_gemm, "cuBLASLt BF16/FP8 GEMMs vs the CPU emulation"},
    {"resume_bit_identical", check_resume_bit_identical, "GPU save -> load -> continue reproduces losses and weights"},
    {"recompute_identical", check_recompute_identical, "GPU -r 1 gives bit-identical gradients"},
    {"grad_accumulation", check_grad_accumulation, "GPU: 2 micro-batches accumulate the 1-batch gradient"},
    {"nccl_one_rank", check_nccl_one_rank, "GPU: ZeRO-1/2 over a one-rank NCCL communicator equal ZeRO-0 bit for bit"},
    {"bf16_linears_in_fp8", check_bf16_linears_in_fp8, "GPU: fp8 with every block linear in BF16 equals the bf16 recipe bit for bit"},
    {"shadow_grad_compare", check_shadow_grad_compare, "GPU: shadow gradient comparison (three passes) vs the direct one"},
};

int main(int argc, char** argv) {
    if (argc == 2 && strcmp(argv[1], "--bench-gemm") == 0) return bench_gemm();
    if (argc == 5 && strcmp(argv[1], "--write-shard") == 0) {
        write_random_shard(argv[2], (size_t)parse_integer("--write-shard", argv[3], 2, INT32_MAX),
                           (uint64_t)parse_integer("--write-shard", argv[4], 0, LLONG_MAX));
        return 0;
    }
    /* cuDNN's default attention backward is not bit-reproducible; the resume check needs it to be */
    setenv("LLM8_DETERMINISTIC", "1", 0);
    /* one rank: the NCCL communicator of the checkpoint and ZeRO checks (listing the checks needs no GPU) */
    if (!(argc == 2 && strcmp(argv[1], "--list") == 0)) comm_init(&argc, &argv);
    g_seed = test_seed(argc, argv);
    return run_checks(CHECKS, (int)(sizeof(CHECKS) / sizeof(CHECKS[0])), argc, argv);
}
