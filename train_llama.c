/*
 * train_llama_cpu: the CPU reference build of the llm8 trainer. The model, recipe, files and command
 * line are the GPU trainer's; only the backend differs (FP32 math that emulates the GPU's BF16 and FP8
 * numerics). See README.md for usage.
 */
#include "cpu/backend.h"     // defines: act_t = float, dev_* (host memory), op_* (OpenMP loops, the FP8 library's CPU emulation)
#include "comm/comm_mpi.h"   // defines: comm_* (MPI collectives on host memory, summed in rank order)
#include "model/model.h"     // defines: Llama, llama_build, llama_forward, llama_backward, llama_update
#include "train/trainer.h"   // defines: train_main (command line, agreement, data, step loop, ZeRO, checkpoints, logs)

#ifndef TESTING
int main(int argc, char** argv) { return train_main(argc, argv); }
#endif
