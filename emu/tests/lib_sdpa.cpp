/*
 * Drives the project's cuDNN attention (cuda/cudnn_att.cpp, the GPU build's build/cudnn_att.o) on the
 * cuDNN double (emu/cudnn.cpp) and the emulated runtime, for dev/test/test_emu_libs.py. key=value
 * arguments: dir, heads=NH,NKV,HS, cases=BxT,BxT,... (run in that order: forward, then backward), det=0|1
 * (the deterministic backward), prepare=0|1 (cudnn_att_prepare with every case's shape first), extra=BxT
 * (one more forward after the cases, prepared or not). Case i reads DIR/qkv<i>.bin and DIR/dout<i>.bin
 * (BF16, (B, T, QKV) and (B, T, NH HS)) and writes DIR/out<i>.bin, DIR/stats<i>.bin (FP32, (B, NH, T))
 * and DIR/dqkv<i>.bin from device memory that starts as NaN bytes, so an element not written shows.
 */
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "../../cuda/cudnn_att.h"

static std::map<std::string, std::string> g_args;

static std::string arg(const char* key, const char* fallback) {
    auto it = g_args.find(key);
    return it == g_args.end() ? fallback : it->second;
}

static void* device_from_file(const std::string& path, size_t bytes) {
    std::vector<char> host(bytes);
    FILE* f = fopen(path.c_str(), "rb");
    if (!f || fread(host.data(), 1, bytes, f) != bytes) {
        fprintf(stderr, "lib_sdpa: cannot read %zu bytes of %s\n", bytes, path.c_str());
        exit(2);
    }
    fclose(f);
    void* p;
    cudaMalloc(&p, bytes);
    cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice);
    return p;
}

static void file_from_device(const std::string& path, const void* p, size_t bytes) {
    std::vector<char> host(bytes);
    cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost);
    FILE* f = fopen(path.c_str(), "wb");
    if (!f || fwrite(host.data(), 1, bytes, f) != bytes) {
        fprintf(stderr, "lib_sdpa: cannot write %s\n", path.c_str());
        exit(2);
    }
    fclose(f);
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IONBF, 0);
    for (int i = 1; i < argc; i++) {
        const char* eq = strchr(argv[i], '=');
        if (!eq) { fprintf(stderr, "lib_sdpa: argument %s is not key=value\n", argv[i]); return 2; }
        g_args[std::string(argv[i], eq - argv[i])] = eq + 1;
    }
    std::string dir = arg("dir", ".");
    int NH, NKV, HS;
    if (sscanf(arg("heads", "4,2,16").c_str(), "%d,%d,%d", &NH, &NKV, &HS) != 3) { fprintf(stderr, "lib_sdpa: heads=NH,NKV,HS\n"); return 2; }
    std::vector<CudnnAttShape> cases;
    std::string list = arg("cases", "1x64");
    for (size_t at = 0; at < list.size();) {
        CudnnAttShape s = {0, 0, 1};
        if (sscanf(list.c_str() + at, "%dx%d", &s.B, &s.T) != 2) { fprintf(stderr, "lib_sdpa: cases=BxT,...\n"); return 2; }
        cases.push_back(s);
        size_t comma = list.find(',', at);
        at = comma == std::string::npos ? list.size() : comma + 1;
    }
    cudnn_att_init(cudaMalloc, [](void* p) { cudaFree(p); });
    cudnn_att_set_deterministic(atoi(arg("det", "0").c_str()));
    if (atoi(arg("prepare", "0").c_str())) cudnn_att_prepare(cases.data(), (int)cases.size(), NH, NKV, HS);
    size_t C = (size_t)NH * HS, QKV = C + 2 * (size_t)NKV * HS;
    for (size_t i = 0; i < cases.size(); i++) {
        int B = cases[i].B, T = cases[i].T;
        size_t BT = (size_t)B * T;
        std::string n = std::to_string(i);
        void* qkv = device_from_file(dir + "/qkv" + n + ".bin", BT * QKV * 2);
        void* dout = device_from_file(dir + "/dout" + n + ".bin", BT * C * 2);
        void *out, *dqkv, *stats;
        cudaMalloc(&out, BT * C * 2);
        cudaMalloc(&dqkv, BT * QKV * 2);
        cudaMalloc(&stats, (size_t)B * NH * T * 4);
        cudnn_att_forward(out, (float*)stats, qkv, B, T, NH, NKV, HS);
        cudnn_att_backward(dqkv, dout, qkv, out, (const float*)stats, B, T, NH, NKV, HS);
        file_from_device(dir + "/out" + n + ".bin", out, BT * C * 2);
        file_from_device(dir + "/stats" + n + ".bin", stats, (size_t)B * NH * T * 4);
        file_from_device(dir + "/dqkv" + n + ".bin", dqkv, BT * QKV * 2);
        for (void* p : {qkv, dout, out, dqkv, stats}) cudaFree(p);
        printf("case %zu done\n", i);
    }
    std::string extra = arg("extra", "");
    if (!extra.empty()) {
        int B, T;
        if (sscanf(extra.c_str(), "%dx%d", &B, &T) != 2) { fprintf(stderr, "lib_sdpa: extra=BxT\n"); return 2; }
        void *qkv, *out, *stats;
        cudaMalloc(&qkv, (size_t)B * T * QKV * 2);
        cudaMalloc(&out, (size_t)B * T * C * 2);
        cudaMalloc(&stats, (size_t)B * NH * T * 4);
        cudnn_att_forward(out, (float*)stats, qkv, B, T, NH, NKV, HS);
        cudaDeviceSynchronize();
        for (void* p : {qkv, out, stats}) cudaFree(p);
        printf("extra done\n");
    }
    return 0;
}
