/*
 * train_llama: the GPU build of the llm8 trainer. The model, recipe, files and command line are the CPU
 * reference's (llama/model.h, llama/trainer.h); only the backend differs (llama/ops_cuda.cuh: BF16
 * activations, cuBLASLt FP8/BF16 GEMMs, cuDNN attention). See README.md for usage.
 */
#include "llama/ops_cuda.cuh"
#include "llama/model.h"
#include "llama/trainer.h"

#ifndef TESTING
int main(int argc, char** argv) { return train_main(argc, argv); }
#endif
