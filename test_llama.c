/*
 * test_llama_cpu: checks of the CPU reference build. It includes the trainer under TESTING and drives the
 * same model, optimizer, data and checkpoint code against independent references: HF transformers'
 * float64 run (dev/reference/), float64 GEMMs, and the FP8 format rules written out from the OCP spec.
 * `./test_llama_cpu --list` names the checks, `--only NAME` runs one; the FP8 codec is compared with
 * ml_dtypes by dev/test/test_fp8_codec.py through the --fp8-* tool modes below.
 */
#define TESTING
#include "train_llama.c"
#include "llama/reference_check.h"
#include "llama/testing.h"

/* ------------------------------------------------------------ HF reference */

/*
 * Tolerances. fp32: our FP32 math against HF's float64, so errors are FP32 rounding (~1e-7 relative,
 * grown by sums over C and T). bf16: every stored activation is rounded to 8 mantissa bits (2^-9
 * relative), so logits and gradients carry ~1% error. fp8: the block's GEMM operands are rounded to
 * 3 (E4M3) / 2 (E5M2) mantissa bits (2^-4 / 2^-3 relative per element), so gradients carry ~10%.
 */
static int check_reference_fp32(void) {
    RefTolerance tol = {1e-5, 1e-5, 1e-5, 1e-5};
    return reference_check(PRECISION_FP32, tol);
}

static int check_reference_bf16(void) {
    RefTolerance tol = {2e-2, 1e-3, 5e-2, 1e-3};
    return reference_check(PRECISION_BF16, tol);
}

static int check_reference_fp8(void) {
    RefTolerance tol = {5e-2, 1e-2, 2.5e-1, 1e-2};
    return reference_check(PRECISION_FP8, tol);
}

static Check CHECKS[] = {
    {"reference_fp32", check_reference_fp32, "fp32 forward/backward/AdamW vs HF transformers (float64)"},
    {"reference_bf16", check_reference_bf16, "bf16 recipe vs HF transformers"},
    {"reference_fp8", check_reference_fp8, "fp8 recipe vs HF transformers"},
};

int main(int argc, char** argv) { return run_checks(CHECKS, (int)(sizeof(CHECKS) / sizeof(CHECKS[0])), argc, argv); }
