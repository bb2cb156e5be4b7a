/*
 * bench_kernels: the kernel playground. Runs kernel families of dev/cuda/kernel_cases.cuh at a Llama-2
 * shape: each GPU op against the CPU op of the same name (build/cpu_reference.o), then timed, and ends with a
 * summary table. Not part of `make all`; build with `make dev/cuda/bench_kernels`.
 *
 *   ./dev/cuda/bench_kernels [family ...] [--shape 7b|13b|small] [--iters N] [--seed S]
 *
 * Families (default all): optimizer encoder rmsnorm rope attention swiglu classifier fp8_cast fp8_cast_vec
 * fp8_weight gemm (fp8_cast_vec: the element-wise and the vectorized cast-transpose kernel, GB/s of each
 * and the speed-up). Shapes: 7b (default: B 1, T 4096, C 4096, NH 32, NKV 32, F 11008, V 32000), 13b
 * (C 5120, NH 40, NKV 40, F 13824), small (B 2, T 256, C 512, NH 8, NKV 2, F 1376: GQA, seconds on any host).
 * --iters: timed launches per op after one warm-up (default 20; 0 checks only). --seed: replay a run.
 * Exit status 1 when any comparison fails.
 *
 * CPU time: the references run on the host with OpenMP/OpenBLAS. At 7B/13B most are a few seconds on 16
 * cores; attention is O(T^2) per head with a (B, NH, T, T) probability matrix, so its correctness part
 * compares the full-size GPU run on a slice of it (the first batch and the first kv heads with their
 * query heads, 8 heads at T 4096, see kc_attention_compare) while the timing runs the full size; all of
 * the GPU output is still checked to be finite. GEMMs are compared in full with OpenBLAS; built without
 * BLAS (make BLAS=none) they compare a slice of the output columns the same way. A default run should
 * take about a minute on a 16-core host.
 */
#include <limits.h>
#include <time.h>

#include "kernel_cases.cuh"
#include "../../train/cli.h"

#define DEFAULT_ITERS 20

typedef struct {
    const char* name;
    KernelShape shape;
} NamedShape;

static const NamedShape SHAPES[] = {
    {"7b", {1, 4096, 4096, 32, 32, 11008, 32000}},
    {"13b", {1, 4096, 5120, 40, 40, 13824, 32000}},
    {"small", {2, 256, 512, 8, 2, 1376, 32000}},
};
#define NUM_SHAPES ((int)(sizeof(SHAPES) / sizeof(SHAPES[0])))

static void usage(FILE* f) {
    fprintf(f, "usage: ./dev/cuda/bench_kernels [family ...] [--shape 7b|13b|small] [--iters N] [--seed S]\nfamilies:");
    for (int i = 0; i < NUM_KERNEL_CASES; i++) fprintf(f, " %s", KERNEL_CASES[i].family);
    fprintf(f, "\n");
}


int main(int argc, char** argv) {
    const char* families[NUM_KERNEL_CASES];
    int num_families = 0;
    const NamedShape* shape = &SHAPES[0];
    int iters = DEFAULT_ITERS;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--shape") == 0 || strcmp(argv[i], "--iters") == 0 || strcmp(argv[i], "--seed") == 0) {
            if (i + 1 >= argc) die("flag %s needs a value (see --help)", argv[i]);
            const char* flag = argv[i++];
            if (strcmp(flag, "--shape") == 0) {
                shape = NULL;
                for (int k = 0; k < NUM_SHAPES; k++) {
                    if (strcmp(SHAPES[k].name, argv[i]) == 0) shape = &SHAPES[k];
                }
                if (shape == NULL) die("--shape: unknown shape '%s' (7b, 13b or small)", argv[i]);
            } else if (strcmp(flag, "--iters") == 0) {
                iters = (int)parse_integer(flag, argv[i], 0, 1000000);
            } else {
                seed = (uint64_t)parse_integer(flag, argv[i], 0, LLONG_MAX);
            }
        } else if (argv[i][0] == '-') {
            usage(stderr);
            die("unknown flag '%s'", argv[i]);
        } else {
            if (kernel_case_find(argv[i]) == NULL) {
                usage(stderr);
                die("unknown kernel family '%s'", argv[i]);
            }
            if (num_families == NUM_KERNEL_CASES) die("too many families (each at most once)");
            families[num_families++] = argv[i];
        }
    }
    if (num_families == 0) {
        for (int i = 0; i < NUM_KERNEL_CASES; i++) families[num_families++] = KERNEL_CASES[i].family;
    }

    backend_init(PRECISION_FP8);
    cpu_ref_init(PRECISION_BF16);
    const KernelShape* s = &shape->shape;
    printf("| bench_kernels: shape %s (B %d T %d C %d NH %d NKV %d F %d V %d), %d timed iterations, seed %llu, "
           "%d CPU threads\n",
           shape->name, s->B, s->T, s->C, s->NH, s->NKV, s->F, s->V, iters, (unsigned long long)seed, omp_get_max_threads());

    int failed[NUM_KERNEL_CASES];
    double slowest_us[NUM_KERNEL_CASES], seconds[NUM_KERNEL_CASES];
    char slowest_op[NUM_KERNEL_CASES][sizeof(g_kernel_case_slowest_op)];
    int total_failed = 0;
    for (int i = 0; i < num_families; i++) {
        double t0 = wall_seconds();
        failed[i] = run_kernel_case(families[i], s, iters, seed + (uint64_t)i);
        seconds[i] = wall_seconds() - t0;
        slowest_us[i] = g_kernel_case_slowest_us;
        snprintf(slowest_op[i], sizeof(slowest_op[i]), "%s", g_kernel_case_slowest_op);
        total_failed += failed[i] != 0;
    }

    printf("\n| %-12s | %-6s | %-44s | %12s | %8s |\n", "family", "result", "slowest op", "time (us)", "wall (s)");
    printf("|--------------|--------|----------------------------------------------|--------------|----------|\n");
    for (int i = 0; i < num_families; i++) {
        printf("| %-12s | %-6s | %-44s | %12.1f | %8.1f |\n", families[i], failed[i] ? "FAIL" : "ok",
               slowest_op[i][0] ? slowest_op[i] : "-", slowest_us[i], seconds[i]);
    }
    printf("%d of %d families passed (seed %llu)\n", num_families - total_failed, num_families, (unsigned long long)seed);
    return total_failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
