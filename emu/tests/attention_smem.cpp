/*
 * Launches the fallback attention's backward (cuda/attention.cuh) at T 8192, where both of its kernels need
 * more than 48 KiB of dynamic shared memory (2 T floats and 2 T + 2 HS floats), and exits without running
 * them (the emulated streams are lazy): the launch configuration is all it tests. dev/test/test_emu.py
 * builds it from a copy of the source without the key kernel's opt-in and expects the launch refused.
 */
#include <unistd.h>

#include "cuda/backend.cuh"

int main() {
    const int B = 1, T = 8192, NH = 1, NKV = 1, HS = 16;
    size_t qkv_elems = (size_t)B * T * (NH + 2 * NKV) * HS, out_elems = (size_t)B * T * NH * HS;
    act_t *dqkv, *qkv, *dout, *out;
    float* stats;
    cudaCheck(cudaMalloc(&dqkv, qkv_elems * sizeof(act_t)));
    cudaCheck(cudaMalloc(&qkv, qkv_elems * sizeof(act_t)));
    cudaCheck(cudaMalloc(&dout, out_elems * sizeof(act_t)));
    cudaCheck(cudaMalloc(&out, out_elems * sizeof(act_t)));
    cudaCheck(cudaMalloc(&stats, (size_t)B * NH * T * sizeof(float)));
    op_attention_backward(dqkv, dout, qkv, out, stats, B, T, NH, NKV, HS);
    printf("attention backward at T %d launched\n", T);
    fflush(stdout);
    _exit(0); /* the queued kernels never run: T 8192 would take minutes on the CPU */
}
