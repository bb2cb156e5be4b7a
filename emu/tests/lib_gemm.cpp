/*
 * Drives the cuBLASLt double (emu/cublaslt.cpp) with one GEMM described on the command line, for
 * dev/test/test_emu_libs.py: key=value arguments give the cuBLASLt problem (ta tb m n k lda ldb ldc
 * atype btype ctype dtype alpha beta; compute=32f|16f, scale_type, epilogue=default|bias|gelu_bias,
 * bias_type) and the mistakes to plant (scales=before|after|none, ws_pref, ws,
 * align_pref, offset_a, offset_d, host_a, inplace, cld, algo=null). Operands come from DIR/a.bin, b.bin, c.bin,
 * sa.f32, sb.f32 (column-major, ld * cols elements); D goes to DIR/d.bin. Prints "heuristic STATUS" and
 * "matmul STATUS" (the library's status names), so the test sees what the project's cublasCheck would.
 */
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

static std::map<std::string, std::string> g_args;

static std::string arg(const char* key, const char* fallback) {
    auto it = g_args.find(key);
    return it == g_args.end() ? fallback : it->second;
}
static long num(const char* key, long fallback) { return atol(arg(key, std::to_string(fallback).c_str()).c_str()); }

static cudaDataType_t type_of(const std::string& s) {
    if (s == "f32") return CUDA_R_32F;
    if (s == "bf16") return CUDA_R_16BF;
    if (s == "e4m3") return CUDA_R_8F_E4M3;
    if (s == "e5m2") return CUDA_R_8F_E5M2;
    if (s == "f16") return CUDA_R_16F;
    fprintf(stderr, "lib_gemm: unknown type %s\n", s.c_str());
    exit(2);
}
static size_t bytes_of(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : (t == CUDA_R_16BF || t == CUDA_R_16F) ? 2 : 1; }

static std::vector<char> read_file(const std::string& path, size_t bytes) {
    std::vector<char> v(bytes);
    FILE* f = fopen(path.c_str(), "rb");
    if (!f || fread(v.data(), 1, bytes, f) != bytes) {
        fprintf(stderr, "lib_gemm: cannot read %zu bytes of %s\n", bytes, path.c_str());
        exit(2);
    }
    fclose(f);
    return v;
}

/* A device copy of `host` placed `offset` bytes into its allocation (to plant misalignment). */
static char* device_copy(const std::vector<char>& host, size_t offset) {
    void* p;
    cudaMalloc(&p, host.size() + offset + 16);
    cudaMemcpy((char*)p + offset, host.data(), host.size(), cudaMemcpyHostToDevice);
    return (char*)p + offset;
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IONBF, 0); /* the status lines survive an emu_fail abort */
    for (int i = 1; i < argc; i++) {
        const char* eq = strchr(argv[i], '=');
        if (!eq) { fprintf(stderr, "lib_gemm: argument %s is not key=value\n", argv[i]); return 2; }
        g_args[std::string(argv[i], eq - argv[i])] = eq + 1;
    }
    std::string dir = arg("dir", ".");
    bool ta = arg("ta", "T") == "T", tb = arg("tb", "N") == "T";
    uint64_t m = num("m", 16), n = num("n", 16), k = num("k", 16);
    int64_t lda = num("lda", ta ? k : m), ldb = num("ldb", tb ? n : k), ldd = num("ldc", m), ldc = num("cld", ldd);
    cudaDataType_t at = type_of(arg("atype", "e4m3")), bt = type_of(arg("btype", "e4m3")), dt = type_of(arg("dtype", "bf16"));
    float alpha = (float)atof(arg("alpha", "1").c_str()), beta = (float)atof(arg("beta", "0").c_str());
    bool inplace = num("inplace", 1) != 0;

    uint64_t a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    std::vector<char> a_host = read_file(dir + "/a.bin", lda * a_cols * bytes_of(at));
    char* A = num("host_a", 0) ? a_host.data() : device_copy(a_host, num("offset_a", 0)); /* host_a: a planted host pointer */
    char* B = device_copy(read_file(dir + "/b.bin", ldb * b_cols * bytes_of(bt)), 0);
    size_t d_bytes = ldd * n * bytes_of(dt);
    cudaDataType_t ct = type_of(arg("ctype", arg("dtype", "bf16").c_str()));
    std::vector<char> c_host = beta != 0.0f ? read_file(dir + "/c.bin", ldc * n * bytes_of(ct)) : std::vector<char>(ldc * n * bytes_of(ct));
    std::vector<char> nan(d_bytes, (char)0xff); /* D starts as NaN unless it is C: every element must be written */
    char* D = device_copy(inplace && beta != 0.0f ? c_host : nan, num("offset_d", 0));
    char* C = inplace ? D : device_copy(c_host, 0);
    float* sa = (float*)device_copy(read_file(dir + "/sa.f32", 4), 0);
    float* sb = (float*)device_copy(read_file(dir + "/sb.f32", 4), 0);

    cublasLtHandle_t handle;
    cublasLtCreate(&handle);
    cublasLtMatmulDesc_t desc;
    cublasComputeType_t compute = arg("compute", "32f") == "16f" ? CUBLAS_COMPUTE_16F : CUBLAS_COMPUTE_32F;
    cublasLtMatmulDescCreate(&desc, compute, type_of(arg("scale_type", "f32")));
    std::string epilogue_name = arg("epilogue", "default");
    uint32_t epilogue = epilogue_name == "bias" ? CUBLASLT_EPILOGUE_BIAS
                        : epilogue_name == "gelu_bias" ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT)
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
    if (arg("bias_type", "") != "") {
        int32_t bias_type = type_of(arg("bias_type", ""));
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
    }
    cublasOperation_t op_a = ta ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b));
    int8_t fast = (int8_t)num("fast", 0);
    if (fast) cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast));
    std::string scales = arg("scales", "before");
    auto set_scales = [&]() {
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa));
        cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb));
    };
    if (scales == "before") set_scales();

    cublasLtMatrixLayout_t la, lb, lc, ld;
    cublasLtMatrixLayoutCreate(&la, at, a_rows, a_cols, lda);
    cublasLtMatrixLayoutCreate(&lb, bt, b_rows, b_cols, ldb);
    cublasLtMatrixLayoutCreate(&lc, ct, m, n, ldc);
    cublasLtMatrixLayoutCreate(&ld, dt, m, n, ldd);

    cublasLtMatmulPreference_t pref;
    cublasLtMatmulPreferenceCreate(&pref);
    uint64_t ws_pref = num("ws_pref", 1 << 20);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_pref, sizeof(ws_pref));
    uint32_t align = (uint32_t)num("align_pref", 256);
    for (int a = CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES; a <= CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES; a++)
        cublasLtMatmulPreferenceSetAttribute(pref, (cublasLtMatmulPreferenceAttributes_t)a, &align, sizeof(align));
    uint32_t mask = (uint32_t)num("reduction_mask", CUBLASLT_REDUCTION_SCHEME_MASK);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof(mask));

    cublasLtMatmulHeuristicResult_t result;
    const cublasLtMatmulAlgo_t* algo = nullptr;
    if (arg("algo", "heuristic") == "heuristic") {
        int found = 0;
        cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, lc, ld, pref, 1, &result, &found);
        printf("heuristic %s\n", cublasLtGetStatusName(st));
        if (st != CUBLAS_STATUS_SUCCESS || found == 0) { printf("matmul skipped\n"); return 0; }
        algo = &result.algo;
    }
    if (scales == "after") set_scales();
    size_t ws = (size_t)num("ws", (long)ws_pref);
    void* workspace = nullptr;
    if (ws) cudaMalloc(&workspace, ws);
    cudaStream_t stream;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    cublasStatus_t st = cublasLtMatmul(handle, desc, &alpha, A, la, B, lb, &beta, C, lc, D, ld, algo, workspace, ws, stream);
    printf("matmul %s\n", cublasLtGetStatusName(st));
    cudaStreamSynchronize(stream);
    std::vector<char> out(d_bytes);
    cudaMemcpy(out.data(), D, d_bytes, cudaMemcpyDeviceToHost);
    FILE* f = fopen((dir + "/d.bin").c_str(), "wb");
    fwrite(out.data(), 1, d_bytes, f);
    fclose(f);
    return 0;
}
