/*
 * train_llama: the GPU build of the llm8 trainer. The model, recipe, files and command line are the CPU
 * reference's; only the backend differs (BF16 activations, cuBLASLt FP8/BF16 GEMMs, cuDNN attention).
 * See README.md for usage.
 */
#include "cuda/backend.cuh"    // defines: act_t = __nv_bfloat16, dev_* (device memory), op_* (kernels, cuBLASLt, cuDNN)
#include "comm/comm_nccl.cuh"  // defines: comm_* (NCCL on a communication stream; MPI only to bootstrap)
#include "model/model.h"       // defines: Llama, llama_build, llama_forward, llama_backward, llama_update
#include "train/trainer.h"     // defines: train_main (command line, agreement, data, step loop, ZeRO, checkpoints, logs)

#ifndef TESTING
int main(int argc, char** argv) { return train_main(argc, argv); }
#endif
