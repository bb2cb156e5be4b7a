/*
 * cub::BlockReduce for the emulated GPU: the combination tree of CUB's default algorithm,
 * BLOCK_REDUCE_WARP_REDUCTIONS, bit for bit, since a GPU's sums depend on it (read from CCCL's
 * block/specializations/block_reduce_warp_reductions.cuh and warp/specializations/warp_reduce_shfl.cuh):
 *   - each warp of 32 threads reduces with shuffle-down steps at offsets 1, 2, 4, 8, 16; at each step
 *     lane L becomes op(own, lane L + offset's value) when L + offset < 32 and keeps its value otherwise;
 *   - after a barrier thread 0 folds the warp aggregates in warp order: op(op(w0, w1), w2) ...
 * Only full tiles (every thread contributes) of whole warps are supported; that is all the project uses.
 * The result is defined in thread 0 only, as in CUB; the other threads get NaN bytes.
 */
#pragma once

#include <cstring>

#include <cuda_runtime.h>

#include "../../emu_runtime.h"

namespace cub {

template <typename T, int BLOCK_DIM_X>
class BlockReduce {
    static_assert(BLOCK_DIM_X % 32 == 0, "emulated cub::BlockReduce: whole warps only");

public:
    struct TempStorage {
        /* the threads' inputs; on a GPU they stay in registers until the warp aggregates reach shared */
        T inputs[BLOCK_DIM_X];
    };

    explicit BlockReduce(TempStorage& storage) : storage_(storage) {
        if (blockDim.x != BLOCK_DIM_X || blockDim.y != 1 || blockDim.z != 1)
            emu_fail("cub::BlockReduce<T, %d> used in a block of (%u, %u, %u) threads", BLOCK_DIM_X, blockDim.x, blockDim.y,
                     blockDim.z);
    }

    template <typename Op>
    T Reduce(T input, Op op) {
        unsigned int tid = threadIdx.x;
        storage_.inputs[tid] = input;
        __syncthreads();
        T result;
        memset(static_cast<void*>(&result), 0xFF, sizeof(result));
        if (tid == 0) {
            for (int w = 0; w < BLOCK_DIM_X / 32; w++) {
                T lane[32];
                for (int l = 0; l < 32; l++) lane[l] = storage_.inputs[32 * w + l];
                /* ascending L reads lane L + offset before that lane is updated: the shuffle's snapshot */
                for (int offset = 1; offset < 32; offset *= 2)
                    for (int l = 0; l + offset < 32; l++) lane[l] = op(lane[l], lane[l + offset]);
                result = w == 0 ? lane[0] : op(result, lane[0]);
            }
        }
        return result;
    }

    T Sum(T input) { return Reduce(input, [](const T& a, const T& b) { return a + b; }); }

private:
    TempStorage& storage_;
};

}  // namespace cub
