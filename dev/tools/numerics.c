/*
 * numerics: the CPU build's numeric code (FP8 and BF16 codecs, the scaling policy and delayed recipe, AdamW
 * and its stored states, the emulated FP8 GEMM, the FP8 gradient wire) as file-in, file-out commands,
 * for the Python tests that compare it with independent references (dev/test/test_fp8_codec.py,
 * test_delayed_scaling.py, test_optim_state.py, test_state_storage.py, test_hopper_accum.py,
 * test_grad_reduce_fp8.py) and for dev/fp8_accum_error.py. It includes the same headers as
 * train_llama_cpu; `make build/tools/numerics`. Files hold raw little-endian arrays, no header.
 */
/* Elements per MPI call, small: --grad-reduce-fp8 then splits its exchanges with small inputs (comm/comm_mpi.h). */
#define MPI_MAX_COUNT ((size_t)1 << 14)
#include "../../cpu/backend.h"   // defines: the codecs, op_adamw, op_store_*, gemm_cpu, gemm_hopper (CPU emulation)
#include "../../comm/comm_mpi.h" // defines: comm_* (MPI collectives on host memory), the FP8 gradient wire

static float* read_floats(const char* path, size_t* n) {
    FILE* f = fopenCheck(path, "rb");
    *n = file_size(f, path) / sizeof(float);
    float* x = (float*)mallocCheck(*n * sizeof(float));
    freadCheck(x, sizeof(float), *n, f, path);
    fcloseCheck(f, path);
    return x;
}

static void write_bytes(const char* path, const void* data, size_t bytes) {
    FILE* f = fopenCheck(path, "wb");
    fwriteCheck(data, 1, bytes, f, path);
    fcloseCheck(f, path);
}

/* n bytes from path, which must hold exactly n. */
static uint8_t* read_codes(const char* path, size_t n) {
    FILE* f = fopenCheck(path, "rb");
    if (file_size(f, path) != n) die("%s: expected %zu bytes", path, n);
    uint8_t* c = (uint8_t*)mallocCheck(n);
    freadCheck(c, 1, n, f, path);
    fcloseCheck(f, path);
    return c;
}

static Fp8Format parse_format(const char* s) {
    if (strcmp(s, "e4m3") == 0) return FP8_E4M3;
    if (strcmp(s, "e5m2") == 0) return FP8_E5M2;
    die("unknown FP8 format '%s' (e4m3 | e5m2)", s);
}

LLM8_NORETURN static void usage(void) {
    die("usage: numerics MODE ARGS... (modes: --fp8-decode, --fp8-encode, --bf16-round, --half-encode, --adamw, "
        "--store, --fp8-gemm, --fp8-delayed, --grad-fp8-pack, --grad-reduce-fp8, --fp8-scale; see dev/tools/numerics.c)");
}

/*
 * --fp8-decode FMT OUT: the 256 codes' values (float32); --fp8-encode FMT SCALE IN OUT: fp8_quantize
 * of each float32 of IN; --bf16-round IN OUT; --half-encode IN OUT: the binary16 bits (uint16) of each
 * float32 (optim.h half_bits_from_float); --adamw STATE STEPS LR WD GRAD_SCALE IN OUT: IN is n master
 * weights then STEPS x n gradients (float32), OUT the master weights after STEPS AdamW steps (op_adamw,
 * t = 1..STEPS) from zero moments stored as STATE (--optim-state), then the moments' bytes (m, v) and
 * their scale_inv (float32, 2 per chunk, fp8 only); --fp8-scale FMT POW2 IN OUT: for each amax in IN, the
 * (scale, scale_inv, finite flag) the policy gives; --fp8-delayed FMT ALGO MARGIN POW2 H IN OUT: IN is an
 * initial scale then T step amaxes (float32), OUT the T (scale, scale_inv) pairs one record of the delayed
 * recipe holds after each step's update (fp8_delayed_update_cpu, history H);
 * --fp8-gemm ACCUM FMT_X FMT_W M N K FAST SPLITS SCALE_X SCALE_W X W OUT: Y (M, N) float32 =
 * scale_x scale_w X W^T for FP8 codes X (M, K) and W (N, K), row-major, run as an fprop GemmCall with
 * fast accumulation FAST and --fp8-accum ACCUM (hopper with SPLITS > 1: contiguous split-K parts);
 * --grad-fp8-pack IN OUT: the FP8 gradient wire's block of IN's float32s (comm/grad_fp8.h: codes, then
 * one scale_inv per chunk); --grad-reduce-fp8 KIND N IN OUT, under mpirun with W ranks: this rank's
 * input from IN.<rank> (float32), the collective on the FP8 wire, its output to OUT.<rank>: KIND
 * reduce_scatter (IN: W * N, OUT: N), reduce_scatter_acc (IN: N initial recv then W * N; OUT: N, the
 * accumulating form) or all_reduce (IN and OUT: N); --store CODEC STEPS IN OUT: IN is STEPS + 1 rows of
 * n float32; a poisoned array in CODEC (optim.h StoreCodec: fp32, bf16, e4m3, fp16) stores the first
 * row, then adds each next of the first STEPS rows (op_store_add, split at a chunk boundary), then OUT
 * is its bytes, its scale_inv (float32 per chunk, scaled codecs only), the last row plus the decoded
 * array (op_store_load, accumulate) and the decoded array alone (float32 each).
 */
int main(int argc, char** argv) {
    if (argc < 2) usage();
    size_t n;
    if (strcmp(argv[1], "--fp8-decode") == 0 && argc == 4) {
        float v[256];
        for (int c = 0; c < 256; c++) v[c] = fp8_to_float((uint8_t)c, parse_format(argv[2]));
        write_bytes(argv[3], v, sizeof(v));
        return 0;
    }
    if (strcmp(argv[1], "--fp8-encode") == 0 && argc == 6) {
        Fp8Format f = parse_format(argv[2]);
        float scale = strtof(argv[3], NULL);
        float* x = read_floats(argv[4], &n);
        uint8_t* c = (uint8_t*)mallocCheck(n);
        for (size_t i = 0; i < n; i++) c[i] = fp8_quantize(x[i], scale, f);
        write_bytes(argv[5], c, n);
        return 0;
    }
    if (strcmp(argv[1], "--bf16-round") == 0 && argc == 4) {
        float* x = read_floats(argv[2], &n);
        for (size_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
        write_bytes(argv[3], x, n * sizeof(float));
        return 0;
    }
    if (strcmp(argv[1], "--half-encode") == 0 && argc == 4) {
        float* x = read_floats(argv[2], &n);
        uint16_t* h = (uint16_t*)mallocCheck(n * sizeof(uint16_t) + 1);
        for (size_t i = 0; i < n; i++) h[i] = half_bits_from_float(x[i]);
        write_bytes(argv[3], h, n * sizeof(uint16_t));
        return 0;
    }
    if (strcmp(argv[1], "--adamw") == 0 && argc == 9) {
        int f = name_index(OPTIM_STATE_NAMES, 3, argv[2]), steps = atoi(argv[3]);
        if (f < 0 || steps < 1) die("--adamw: '%s' is not fp32, bf16 or fp8, or steps %s < 1", argv[2], argv[3]);
        float lr = strtof(argv[4], NULL), wd = strtof(argv[5], NULL), grad_scale = strtof(argv[6], NULL);
        float* x = read_floats(argv[7], &n);
        size_t P = n / (size_t)(steps + 1);
        if (P * (size_t)(steps + 1) != n) die("--adamw: %s holds %zu floats, not a multiple of %d", argv[7], n, steps + 1);
        size_t mb = P * adamw_moment_bytes((OptimState)f, 0), vb = P * adamw_moment_bytes((OptimState)f, 1);
        size_t sc = adamw_scale_count((OptimState)f, P), out_bytes = P * sizeof(float) + mb + vb + sc * sizeof(float);
        char* out = (char*)callocCheck(out_bytes + 1, 1);
        float* scale_inv = (float*)mallocCheck(sc * sizeof(float) + 1); /* its own allocation: aligned */
        AdamwMoments st = {(OptimState)f, out + P * sizeof(float), out + P * sizeof(float) + mb, scale_inv};
        for (size_t k = 0; k < sc; k++) st.scale_inv[k] = 1.0f;
        for (int t = 1; t <= steps; t++) {
            float bc1 = 1.0f - powf(ADAMW_BETA1, (float)t), bc2_sqrt = sqrtf(1.0f - powf(ADAMW_BETA2, (float)t));
            op_adamw(x, st, x + (size_t)t * P, P, lr, wd, bc1, bc2_sqrt, grad_scale);
        }
        memcpy(out, x, P * sizeof(float));
        memcpy(out + P * sizeof(float) + mb + vb, scale_inv, sc * sizeof(float));
        write_bytes(argv[8], out, out_bytes);
        return 0;
    }
    if (strcmp(argv[1], "--store") == 0 && argc == 6) {
        const char* names[] = {[STORE_FP32] = "fp32", [STORE_BF16] = "bf16", [STORE_E4M3] = "e4m3", [STORE_FP16] = "fp16"};
        int c = -1, steps = atoi(argv[3]);
        for (int k = 0; k < (int)(sizeof(names) / sizeof(names[0])); k++)
            if (strcmp(argv[2], names[k]) == 0) c = k;
        if (c < 0 || steps < 1) die("--store: '%s' is not fp32, bf16, e4m3 or fp16, or steps %s < 1", argv[2], argv[3]);
        float* x = read_floats(argv[4], &n);
        size_t P = n / (size_t)(steps + 1);
        if (P * (size_t)(steps + 1) != n) die("--store: %s holds %zu floats, not a multiple of %d", argv[4], n, steps + 1);
        StoreCodec codec = (StoreCodec)c;
        size_t eb = store_bytes(codec), bytes = P * eb, sc = store_scale_count(codec, P);
        char* out = (char*)mallocCheck(bytes + sc * sizeof(float) + 2 * P * sizeof(float) + 1);
        memset(out, 0x7f, bytes); /* poison: the first row is stored without reading it */
        float* scale_inv = (float*)mallocCheck((sc + 1) * sizeof(float));
        for (size_t k = 0; k < sc; k++) scale_inv[k] = NAN;
        /* two calls, split at a chunk boundary, as the segments of one bucket are added */
        size_t split = P > ZERO_CHUNK ? (P / 2 / ZERO_CHUNK) * ZERO_CHUNK : P;
        for (int t = 0; t < steps; t++) {
            const float* row = x + (size_t)t * P;
            op_store_add(codec, out, scale_inv, row, split, t > 0);
            op_store_add(codec, out + split * eb, sc ? scale_inv + split / ZERO_CHUNK : NULL, row + split, P - split, t > 0);
        }
        float* last = x + (size_t)steps * P;
        op_store_load(codec, last, out, scale_inv, P, 1);
        memcpy(out + bytes, scale_inv, sc * sizeof(float));
        memcpy(out + bytes + sc * sizeof(float), last, P * sizeof(float));
        float* decoded = (float*)mallocCheck(P * sizeof(float) + 1); /* its own allocation: aligned */
        op_store_load(codec, decoded, out, scale_inv, P, 0);
        memcpy(out + bytes + sc * sizeof(float) + P * sizeof(float), decoded, P * sizeof(float));
        write_bytes(argv[5], out, bytes + sc * sizeof(float) + 2 * P * sizeof(float));
        return 0;
    }
    if (strcmp(argv[1], "--fp8-gemm") == 0 && argc == 15) {
        int accum = name_index(FP8_ACCUM_NAMES, 2, argv[2]);
        if (accum < 0) die("--fp8-gemm: '%s' is not exact or hopper", argv[2]);
        Fp8Format fx = parse_format(argv[3]), fw = parse_format(argv[4]);
        size_t M = strtoull(argv[5], NULL, 10), N = strtoull(argv[6], NULL, 10), K = strtoull(argv[7], NULL, 10);
        int fast = atoi(argv[8]), splits = atoi(argv[9]);
        float scale_x = strtof(argv[10], NULL), scale_w = strtof(argv[11], NULL);
        uint8_t* x = read_codes(argv[12], M * K);
        uint8_t* w = read_codes(argv[13], N * K);
        float* y = (float*)mallocCheck(M * N * sizeof(float));
        GemmCall g = gemm_fprop(y, DT_F32, gemm_operand_fp8(w, fw == FP8_E4M3 ? DT_E4M3 : DT_E5M2, &scale_w),
                                gemm_operand_fp8(x, fx == FP8_E4M3 ? DT_E4M3 : DT_E5M2, &scale_x), M, K, N);
        g.fast_accum = fast;
        g.accum = accum;
        char why[256];
        if (gemm_check(&g, why, sizeof(why))) die("--fp8-gemm: %s", why);
        if (accum == FP8_ACCUM_HOPPER && splits != 1) {
            if (gemm_hopper(&g, splits)) die("--fp8-gemm: non-finite codes");
        } else {
            gemm_cpu(&g);
        }
        write_bytes(argv[14], y, M * N * sizeof(float));
        return 0;
    }
    if (strcmp(argv[1], "--fp8-delayed") == 0 && argc == 9) {
        Fp8Format f = parse_format(argv[2]);
        int algo = name_index(FP8_AMAX_ALGO_NAMES, 2, argv[3]), margin = atoi(argv[4]), pow2 = atoi(argv[5]), H = atoi(argv[6]);
        if (algo < 0 || H < 1) die("--fp8-delayed: bad ALGO '%s' or H %d", argv[3], H);
        float* x = read_floats(argv[7], &n);
        if (n < 1) die("--fp8-delayed: %s holds no initial scale", argv[7]);
        float* history = (float*)callocCheck((size_t)H, sizeof(float));
        float* out = (float*)mallocCheck(2 * n * sizeof(float));
        Fp8Scale s = {0.0f, x[0], 1.0f / x[0], 0.0f};
        for (size_t t = 0; t + 1 < n; t++) {
            int len = (int)t + 1 < H ? (int)t + 1 : H;
            fp8_delayed_update_cpu(&s, history, &x[t + 1], 1, H, (int)(t % (size_t)H), len, algo, f, margin, pow2);
            out[2 * t] = s.scale;
            out[2 * t + 1] = s.scale_inv;
        }
        write_bytes(argv[8], out, 2 * (n - 1) * sizeof(float));
        free(history);
        free(out);
        free(x);
        return 0;
    }
    if (strcmp(argv[1], "--grad-fp8-pack") == 0 && argc == 4) {
        float* x = read_floats(argv[2], &n);
        uint8_t* block = (uint8_t*)mallocCheck(grad_fp8_block_bytes(n) + 1);
        grad_fp8_pack(block, x, n);
        write_bytes(argv[3], block, grad_fp8_block_bytes(n));
        free(block);
        free(x);
        return 0;
    }
    if (strcmp(argv[1], "--grad-reduce-fp8") == 0 && argc == 6) {
        const char* kind = argv[2];
        size_t N = strtoull(argv[3], NULL, 10);
        int rs = strcmp(kind, "reduce_scatter") == 0, acc = strcmp(kind, "reduce_scatter_acc") == 0;
        if (!rs && !acc && strcmp(kind, "all_reduce") != 0) die("--grad-reduce-fp8: '%s' is not reduce_scatter, reduce_scatter_acc or all_reduce", kind);
        comm_init(&argc, &argv);
        char path[4096];
        snprintf(path, sizeof(path), "%s.%d", argv[4], g_dist.rank);
        float* x = read_floats(path, &n);
        size_t W = (size_t)g_dist.world, want = rs ? W * N : acc ? (W + 1) * N : N;
        if (n != want) die("--grad-reduce-fp8: %s holds %zu floats, expected %zu", path, n, want);
        float* out = x;
        if (rs || acc) {
            out = (float*)mallocCheck(N * sizeof(float) + 1);
            if (acc) memcpy(out, x, N * sizeof(float));
            comm_reduce_scatter(acc ? x + N : x, out, N, acc, WIRE_FP8);
        } else {
            comm_all_reduce(x, N, WIRE_FP8);
        }
        comm_wait_all();
        snprintf(path, sizeof(path), "%s.%d", argv[5], g_dist.rank);
        write_bytes(path, out, N * sizeof(float));
        if (out != x) free(out);
        free(x);
        comm_finalize();
        return 0;
    }
    if (strcmp(argv[1], "--fp8-scale") == 0 && argc == 6) {
        Fp8Format f = parse_format(argv[2]);
        int pow2 = atoi(argv[3]);
        float* x = read_floats(argv[4], &n);
        float* out = (float*)mallocCheck(3 * n * sizeof(float));
        for (size_t i = 0; i < n; i++) {
            Fp8Scale s;
            fp8_scale_set(&s, x[i], f, pow2);
            out[3 * i] = s.scale;
            out[3 * i + 1] = s.scale_inv;
            out[3 * i + 2] = (float)fp8_amax_is_finite(x[i]);
        }
        write_bytes(argv[5], out, 3 * n * sizeof(float));
        return 0;
    }
    usage();
}
