/*
 * train_llama_cpu: the CPU reference build of the llm8 trainer. The model, recipe, files and command
 * line are the GPU trainer's (llama/model.h, llama/trainer.h); only the ops differ (llama/ops_cpu.h,
 * FP32 math that emulates the GPU's BF16 and FP8 numerics). See README.md for usage.
 */
#include "llama/ops_cpu.h"
#include "llama/model.h"
#include "llama/trainer.h"

#ifndef TESTING
int main(int argc, char** argv) { return train_main(argc, argv); }
#endif
