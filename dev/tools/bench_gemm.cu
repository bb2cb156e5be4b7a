/*
 * bench_gemm: FP8 vs BF16 GEMM TFLOP/s of one Llama-2 7B and 13B block on the GPU (cuBLASLt through the
 * trainer's op_gemm), for scripts/device_check.sh and scripts/perf_model.py's measured rates. Not part of
 * `make all`; build with `make build/tools/bench_gemm`, run with no arguments.
 */
#include "../../cuda/backend.cuh" // defines: act_t = __nv_bfloat16, dev_*, op_amax, op_cast_transpose, op_gemm
#include "../../llama/params.h"   // defines: llama_preset, llama_linear_dims, LINEAR_NAMES

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
    LAUNCH(fill_bf16_kernel, grid_for(n, BLOCK_THREADS), BLOCK_THREADS)(x, n, salt);
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
int main(int argc, char** argv) {
    (void)argv;
    if (argc != 1) die("usage: bench_gemm (no arguments; dev/tools/bench_gemm.cu)");
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

