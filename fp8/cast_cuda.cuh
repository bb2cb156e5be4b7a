/*
 * The FP8 current-scaling kernels of the GPU: fp8_amax_cuda (max |x| of a BF16 tensor into its
 * device-side Fp8Scale) and fp8_cast_transpose_cuda (scale from that amax, then the cast to E4M3/E5M2
 * codes written row-major and/or transposed in one pass, by a vectorized kernel where the shape allows,
 * else element by element), both also for FP32 master weights, which are rounded to BF16 first (the
 * value a BF16 copy would hold); and fp8_transpose_cuda (codes transposed).
 * The policy and the cast are fp8.h's functions, the same ones the CPU emulation (cast_cpu.h) runs, so
 * the codes are bit-identical to the CPU's. None synchronizes with the host: the scale lives in device
 * memory and the GEMM reads it there.
 */
#pragma once

#include <vector>

#include "fp8.h"
#include "../core/cuda_utils.cuh"

/*
 * Every amax op (fp8_amax_cuda, a producer's fused amax, the delayed cast) first zeroes its record's amax:
 * a 4-byte memset per op, queued on the stream, unless fp8_reset_amax_cuda has zeroed a run of records
 * with one strided memset since (the model does so once per forward for every X and dY record): a record
 * it zeroed skips its own memset once. Host-side bookkeeping only: each op still sets s->amax = max |x|.
 */
static uintptr_t g_amax_zeroed_base = 0;
static std::vector<char> g_amax_zeroed; /* per record from the base: zeroed and not used since */

static inline void fp8_reset_amax_cuda(Fp8Scale* s, size_t n) {
    if (n == 0) return;
    cudaCheck(cudaMemset2DAsync(&s->amax, sizeof(Fp8Scale), 0, sizeof(float), n, 0));
    g_amax_zeroed_base = (uintptr_t)s;
    g_amax_zeroed.assign(n, 1);
}

/* Zeroes s->amax for the op about to compute it, unless fp8_reset_amax_cuda has and nothing used it since. */
static inline void fp8_amax_zero(Fp8Scale* s) {
    size_t i = ((uintptr_t)s - g_amax_zeroed_base) / sizeof(Fp8Scale);
    if ((uintptr_t)s >= g_amax_zeroed_base && i < g_amax_zeroed.size() && g_amax_zeroed[i]) {
        g_amax_zeroed[i] = 0;
        return;
    }
    cudaCheck(cudaMemsetAsync(&s->amax, 0, sizeof(float), 0));
}

/* BF16 elements per 16-byte vector load. */
#define BF16_PER_VEC 8
#define BF16_ABS_MASK2 0x7fff7fffu

/*
 * max |x| over BF16 bit patterns: with the sign cleared, unsigned order of the 16-bit patterns is the
 * order of the magnitudes, +Inf (0x7f80) above every finite value and every NaN above +Inf, so a NaN
 * anywhere yields a NaN amax as amax_combine demands. Two 16-bit lanes per 32-bit word (__vmaxu2).
 */
__global__ void amax_kernel(unsigned int* amax_bits, const __nv_bfloat16* x, size_t n, int vectorized) {
    unsigned int m2 = 0; /* two running 16-bit maxima */
    size_t done = 0;
    if (vectorized) {
        const uint4* x4 = (const uint4*)x;
        size_t n4 = n / BF16_PER_VEC;
        for (size_t i = grid_index(); i < n4; i += grid_stride()) {
            uint4 v = x4[i];
            m2 = __vmaxu2(m2, v.x & BF16_ABS_MASK2);
            m2 = __vmaxu2(m2, v.y & BF16_ABS_MASK2);
            m2 = __vmaxu2(m2, v.z & BF16_ABS_MASK2);
            m2 = __vmaxu2(m2, v.w & BF16_ABS_MASK2);
        }
        done = n4 * BF16_PER_VEC;
    }
    const unsigned short* xs = (const unsigned short*)x;
    for (size_t i = done + grid_index(); i < n; i += grid_stride()) m2 = __vmaxu2(m2, (unsigned int)(xs[i] & 0x7fffu));
    unsigned int m = max(m2 & 0xffffu, m2 >> 16);
    m = block_reduce<BLOCK_THREADS>(m, MaxOp());
    /* the BF16 pattern shifted up is the FP32 pattern of the same value */
    if (threadIdx.x == 0 && m != 0) atomicMax(amax_bits, m << 16);
}

/* max |bf16(x)| over FP32 x, as amax_kernel's bit patterns: the BF16 rounding's pattern, sign cleared. */
__global__ void amax_master_kernel(unsigned int* amax_bits, const float* x, size_t n) {
    unsigned int m = 0;
    for (size_t i = grid_index(); i < n; i += grid_stride()) {
        m = max(m, (unsigned int)(__bfloat16_as_ushort(f_to_bf16(x[i])) & 0x7fffu));
    }
    m = block_reduce<BLOCK_THREADS>(m, MaxOp());
    if (threadIdx.x == 0 && m != 0) atomicMax(amax_bits, m << 16);
}

/*
 * s->amax (device) = max |x| over x (n) BF16, or over the BF16 roundings of FP32 x (master weights), NaN
 * when any element is NaN (fp8.h amax_combine); 0 for n = 0. Reset and recomputed on every call; the
 * atomicMax on the value's bits is order-independent, so the result is deterministic. No host
 * synchronization.
 */
static inline void fp8_amax_cuda(Fp8Scale* s, const __nv_bfloat16* x, size_t n) {
    fp8_amax_zero(s);
    if (n == 0) return;
    int vectorized = ((uintptr_t)x % sizeof(uint4)) == 0;
    LAUNCH(amax_kernel, grid_for(ceil_div(n, BF16_PER_VEC), BLOCK_THREADS), BLOCK_THREADS)((unsigned int*)&s->amax, x, n,
                                                                                       vectorized);
    launchCheck();
}

static inline void fp8_amax_cuda(Fp8Scale* s, const float* x, size_t n) {
    fp8_amax_zero(s);
    if (n == 0) return;
    LAUNCH(amax_master_kernel, grid_for(n, BLOCK_THREADS), BLOCK_THREADS)((unsigned int*)&s->amax, x, n);
    launchCheck();
}

/*
 * A producer kernel's fused amax (amax_bits from fp8_amax_fused_begin, NULL when not asked): each thread
 * keeps fp8_amax_fold's running maximum of the BF16 values it writes, then every thread of the block
 * calls fp8_amax_fused_block_end (the block reduction needs them all). Folds the same sign-cleared bit
 * patterns as amax_kernel and publishes them as it does, so the amax is op_amax's, bit for bit.
 */
__device__ __forceinline__ unsigned int fp8_amax_fold(unsigned int m, __nv_bfloat16 y) {
    return max(m, (unsigned int)(__bfloat16_as_ushort(y) & 0x7fffu));
}

template <int THREADS>
__device__ __forceinline__ void fp8_amax_fused_block_end(unsigned int* amax_bits, unsigned int m) {
    m = block_reduce<THREADS>(m, MaxOp());
    if (threadIdx.x == 0 && m != 0) atomicMax(amax_bits, m << 16);
}

/* Resets s->amax (device) for a producer's fused amax and returns it as the kernel's amax_bits; NULL for s NULL. */
static inline unsigned int* fp8_amax_fused_begin(Fp8Scale* s) {
    if (s == NULL) return NULL;
    fp8_amax_zero(s);
    return (unsigned int*)&s->amax;
}

/* The value a cast reads: a BF16 element, or the BF16 rounding of an FP32 master weight. */
__device__ __forceinline__ float cast_input(__nv_bfloat16 x) { return bf16_to_f(x); }
__device__ __forceinline__ float cast_input(float x) { return bf16_to_f(f_to_bf16(x)); }

/* Square tile of the cast-transpose, and its shared-memory row padding (fewer bank conflicts). */
#define CT_TILE 64
#define CT_PAD 4
#define CT_THREADS 256
/* Each warp covers one tile row as 32 threads x 2 columns; 8 warps cover 8 rows per pass. */
#define CT_COLS_PER_THREAD 2
#define CT_ROWS_PER_PASS (CT_THREADS / WARP_SIZE)

/* The scale of a cast from s->amax, computed by every thread of every block (no grid-wide barrier);
   block 0's first thread publishes scale, scale_inv and the sticky non-finite flag. */
__device__ inline float cast_scale_from_amax(Fp8Scale* s, Fp8Format f, int pow2) {
    float amax = s->amax;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        Fp8Scale published;
        fp8_scale_set(&published, amax, f, pow2);
        s->scale = published.scale;
        s->scale_inv = published.scale_inv;
        if (!fp8_amax_is_finite(amax)) s->nonfinite = 1.0f;
    }
    return fp8_compute_scale(amax, f, pow2);
}

/* The scale a cast uses: current scaling's from s->amax (cast_scale_from_amax), or under the delayed
   recipe the one s holds, which the cast only reads. */
__device__ inline float cast_scale(Fp8Scale* s, Fp8Format f, int pow2, int delayed) {
    return delayed ? s->scale : cast_scale_from_amax(s, f, pow2);
}

/* Ends a delayed cast's amax (every thread of the block calls it): the block's largest sign-cleared bit
   pattern m of the values it cast into s->amax (reset before the launch) and into *record (NULL: none). */
__device__ inline void cast_delayed_amax_end(Fp8Scale* s, unsigned int* record, unsigned int m) {
    m = block_reduce<CT_THREADS>(m, MaxOp());
    if (threadIdx.x == 0 && m != 0) {
        atomicMax((unsigned int*)&s->amax, m);
        if (record) atomicMax(record, m);
    }
}

/* Adds one block's cast statistics to *counts (a block of CT_THREADS threads; every thread calls it); block 0
   also adds the element count rows * cols. */
__device__ inline void add_cast_counts(Fp8Counts* counts, unsigned int saturated, unsigned int underflow,
                                       unsigned int nonzero, size_t rows, size_t cols) {
    unsigned long long sat = block_reduce<CT_THREADS>((unsigned long long)saturated, SumOp());
    unsigned long long under = block_reduce<CT_THREADS>((unsigned long long)underflow, SumOp());
    unsigned long long nz = block_reduce<CT_THREADS>((unsigned long long)nonzero, SumOp());
    if (threadIdx.x == 0) {
        atomicAdd(&counts->saturated, sat);
        atomicAdd(&counts->underflow, under);
        atomicAdd(&counts->nonzero, nz);
        if (blockIdx.x == 0) atomicAdd(&counts->count, (unsigned long long)rows * cols);
    }
}

/*
 * One block per 64 x 64 tile of x (rows, cols): each block derives the scale from s->amax itself (so no
 * grid-wide barrier is needed), casts its tile, writes the codes to out row-major, stages them in
 * shared memory and writes them to out_t (cols, rows) along the transposed rows, both coalesced.
 * Block 0 publishes scale and scale_inv, and sets the sticky nonfinite flag for a non-finite amax;
 * amax is only read.
 */
template <typename In>
__global__ void __launch_bounds__(CT_THREADS) cast_transpose_kernel(uint8_t* out, uint8_t* out_t, const In* x, size_t rows,
                                                                    size_t cols, size_t tiles_x, Fp8Scale* s, Fp8Format f,
                                                                    int pow2, Fp8Counts* counts, int delayed,
                                                                    unsigned int* record) {
    __shared__ uint8_t tile[CT_TILE][CT_TILE + CT_PAD];
    float scale = cast_scale(s, f, pow2, delayed);
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    size_t r0 = (blockIdx.x / tiles_x) * CT_TILE, c0 = (blockIdx.x % tiles_x) * CT_TILE;
    unsigned int saturated = 0, underflow = 0, nonzero = 0, amax_bits = 0;
    for (int lr = warp; lr < CT_TILE; lr += CT_ROWS_PER_PASS) {
        size_t r = r0 + lr;
        for (int e = 0; e < CT_COLS_PER_THREAD; e++) {
            int lc = lane * CT_COLS_PER_THREAD + e;
            size_t c = c0 + lc;
            if (r >= rows || c >= cols) continue;
            float v = cast_input(x[r * cols + c]);
            uint8_t code = fp8_quantize(v, scale, f);
            tile[lr][lc] = code;
            if (out) out[r * cols + c] = code;
            saturated += (unsigned int)fp8_is_max(code, f);
            nonzero += v != 0.0f;
            underflow += v != 0.0f && fp8_is_zero(code);
            amax_bits = max(amax_bits, __float_as_uint(v) & 0x7fffffffu);
        }
    }
    if (out_t) {
        __syncthreads();
        /* out_t row = input column c0 + lc; consecutive lanes write consecutive input rows */
        for (int lc = warp; lc < CT_TILE; lc += CT_ROWS_PER_PASS) {
            size_t c = c0 + lc;
            for (int e = 0; e < CT_COLS_PER_THREAD; e++) {
                int lr = lane * CT_COLS_PER_THREAD + e;
                size_t r = r0 + lr;
                if (r < rows && c < cols) out_t[c * rows + r] = tile[lr][lc];
            }
        }
    }
    if (counts) add_cast_counts(counts, saturated, underflow, nonzero, rows, cols);
    if (delayed) cast_delayed_amax_end(s, record, amax_bits);
}

/*
 * fp8_cast_transpose_cuda with cast_transpose_kernel, element by element: for every shape and input type
 * (the vectorized kernel below takes BF16 tensors of suitable shapes only). Same arguments.
 */
template <typename In>
static inline void fp8_cast_transpose_tiled_cuda(uint8_t* out, uint8_t* out_t, const In* x, size_t rows, size_t cols,
                                                 Fp8Format f, Fp8Scale* s, int pow2, Fp8Counts* counts, int delayed,
                                                 unsigned int* record) {
    /* an empty tensor still gets one block, which publishes the scale */
    size_t tiles_x = cols > 0 ? ceil_div(cols, CT_TILE) : 1, tiles = rows > 0 ? ceil_div(rows, CT_TILE) * tiles_x : 1;
    if (tiles > INT32_MAX) die("cast-transpose of a (%zu, %zu) tensor needs more than 2^31 tiles", rows, cols);
    LAUNCH(cast_transpose_kernel<In>, (unsigned int)tiles, CT_THREADS)(out, out_t, x, rows, cols, tiles_x, s, f, pow2, counts, delayed,
                                                                        record);
    launchCheck();
}

/*
 * The vectorized cast-transpose: the same 64 x 64 tiles, blocks and results as cast_transpose_kernel,
 * with wide memory accesses. Loads: 16 bytes (8 BF16) per thread and pass, a warp reading 4 rows of 128
 * bytes. Stores: 8 codes (8 bytes) row-major; the transposed codes as 4-byte words, each thread
 * transposing a 4 x 4 byte micro-tile in registers (__byte_perm) so that it reads 4 words of shared
 * memory and writes 4 words of out_t. The shared tile is 64 rows of 17 words (68 bytes): a warp's
 * micro-tiles are 8 rows of micro-tiles by 4 columns, whose words then fall in 8 x 4 distinct banks
 * (row stride 4 words, column stride 1), so the transposed read has no bank conflicts.
 * Needs cols % 8 == 0, rows % 4 == 0, x 16-byte, out 8-byte and out_t 4-byte aligned
 * (fp8_cast_transpose_vec_ok); partial tiles are bounds-checked by whole vectors and words.
 */
#define CTV_PITCH_WORDS (CT_TILE / 4 + 1)   /* 17: a shared tile row, padded by one word */
#define CTV_LOAD_PASSES (CT_TILE * CT_TILE / BF16_PER_VEC / CT_THREADS) /* 2 */
#define CTV_MICRO 4                         /* the micro-tile of the transposed write: 4 x 4 codes */

/* Casts the 8 BF16 of one 16-byte vector: code i in byte i % 4 of codes->x (i < 4) or codes->y (memory
   order); adds to the three statistics counters as cast_transpose_kernel does. */
__device__ __forceinline__ void ctv_cast8(uint2* codes, uint4 v, float scale, Fp8Format f, unsigned int* saturated,
                                          unsigned int* underflow, unsigned int* nonzero, unsigned int* amax_bits) {
    unsigned int w[4] = {v.x, v.y, v.z, v.w};
    unsigned int packed[2] = {0u, 0u};
#pragma unroll
    for (int i = 0; i < BF16_PER_VEC; i++) {
        /* a BF16 pattern shifted up is the FP32 pattern of the same value (bf16_to_f, exactly) */
        unsigned int bits = i % 2 ? w[i / 2] & 0xffff0000u : w[i / 2] << 16;
        float x = __uint_as_float(bits);
        uint8_t code = fp8_quantize(x, scale, f);
        packed[i / 4] |= (unsigned int)code << (8 * (i % 4));
        *saturated += (unsigned int)fp8_is_max(code, f);
        *nonzero += x != 0.0f;
        *underflow += x != 0.0f && fp8_is_zero(code);
        *amax_bits = max(*amax_bits, bits & 0x7fffffffu);
    }
    *codes = make_uint2(packed[0], packed[1]);
}

__global__ void __launch_bounds__(CT_THREADS) cast_transpose_vec_kernel(uint8_t* out, uint8_t* out_t, const __nv_bfloat16* x,
                                                                        size_t rows, size_t cols, size_t tiles_x, Fp8Scale* s,
                                                                        Fp8Format f, int pow2, Fp8Counts* counts, int delayed,
                                                                        unsigned int* record) {
    __shared__ uint32_t tile[CT_TILE * CTV_PITCH_WORDS];
    float scale = cast_scale(s, f, pow2, delayed);
    size_t r0 = (blockIdx.x / tiles_x) * CT_TILE, c0 = (blockIdx.x % tiles_x) * CT_TILE;
    unsigned int saturated = 0, underflow = 0, nonzero = 0, amax_bits = 0;
    for (int pass = 0; pass < CTV_LOAD_PASSES; pass++) {
        int v = pass * CT_THREADS + threadIdx.x;
        int lr = v / (CT_TILE / BF16_PER_VEC), lc = (v % (CT_TILE / BF16_PER_VEC)) * BF16_PER_VEC;
        size_t r = r0 + lr, c = c0 + lc;
        if (r >= rows || c >= cols) continue; /* cols % 8 == 0: a vector is wholly inside or outside */
        uint4 in = *(const uint4*)(x + r * cols + c);
        uint2 codes;
        ctv_cast8(&codes, in, scale, f, &saturated, &underflow, &nonzero, &amax_bits);
        if (out) *(uint2*)(out + r * cols + c) = codes;
        tile[lr * CTV_PITCH_WORDS + lc / 4] = codes.x;
        tile[lr * CTV_PITCH_WORDS + lc / 4 + 1] = codes.y;
    }
    if (out_t) {
        __syncthreads();
        /* warp w: micro-tile rows (w % 2) * 8 + lane % 8, micro-tile columns (w / 2) * 4 + lane / 8 */
        int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
        int mr = (warp % 2) * 8 + lane % 8, mc = (warp / 2) * 4 + lane / 8;
        size_t r = r0 + (size_t)mr * CTV_MICRO;
        if (r < rows) { /* rows % 4 == 0: a micro-tile row is wholly inside or outside */
            uint32_t w0 = tile[(mr * CTV_MICRO + 0) * CTV_PITCH_WORDS + mc];
            uint32_t w1 = tile[(mr * CTV_MICRO + 1) * CTV_PITCH_WORDS + mc];
            uint32_t w2 = tile[(mr * CTV_MICRO + 2) * CTV_PITCH_WORDS + mc];
            uint32_t w3 = tile[(mr * CTV_MICRO + 3) * CTV_PITCH_WORDS + mc];
            /* byte j of word i (tile row i, column j) becomes byte i of output word j */
            uint32_t lo01 = __byte_perm(w0, w1, 0x5140), lo23 = __byte_perm(w2, w3, 0x5140);
            uint32_t hi01 = __byte_perm(w0, w1, 0x7362), hi23 = __byte_perm(w2, w3, 0x7362);
            uint32_t t[CTV_MICRO] = {__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632),
                                     __byte_perm(hi01, hi23, 0x5410), __byte_perm(hi01, hi23, 0x7632)};
#pragma unroll
            for (int j = 0; j < CTV_MICRO; j++) {
                size_t c = c0 + (size_t)mc * CTV_MICRO + j;
                if (c < cols) *(uint32_t*)(out_t + c * rows + r) = t[j];
            }
        }
    }
    if (counts) add_cast_counts(counts, saturated, underflow, nonzero, rows, cols);
    if (delayed) cast_delayed_amax_end(s, record, amax_bits);
}

/* Can cast_transpose_vec_kernel cast x (rows, cols) into out / out_t (either may be NULL)? */
static inline int fp8_cast_transpose_vec_ok(const uint8_t* out, const uint8_t* out_t, const __nv_bfloat16* x, size_t rows,
                                            size_t cols) {
    return rows > 0 && cols > 0 && cols % BF16_PER_VEC == 0 && rows % CTV_MICRO == 0 && (uintptr_t)x % 16 == 0 &&
           (uintptr_t)out % 8 == 0 && (uintptr_t)out_t % 4 == 0;
}

/* fp8_cast_transpose_cuda with cast_transpose_vec_kernel; stops when fp8_cast_transpose_vec_ok is false. */
static inline void fp8_cast_transpose_vec_cuda(uint8_t* out, uint8_t* out_t, const __nv_bfloat16* x, size_t rows,
                                               size_t cols, Fp8Format f, Fp8Scale* s, int pow2, Fp8Counts* counts,
                                               int delayed, unsigned int* record) {
    if (!fp8_cast_transpose_vec_ok(out, out_t, x, rows, cols))
        die("vectorized cast-transpose of a (%zu, %zu) tensor: needs cols %% %d == 0, rows %% %d == 0 and aligned pointers",
            rows, cols, BF16_PER_VEC, CTV_MICRO);
    size_t tiles_x = ceil_div(cols, CT_TILE), tiles = ceil_div(rows, CT_TILE) * tiles_x;
    if (tiles > INT32_MAX) die("cast-transpose of a (%zu, %zu) tensor needs more than 2^31 tiles", rows, cols);
    LAUNCH(cast_transpose_vec_kernel, (unsigned int)tiles, CT_THREADS)(out, out_t, x, rows, cols, tiles_x, s, f, pow2, counts,
                                                                   delayed, record);
    launchCheck();
}

/*
 * Sets s->scale / s->scale_inv (device) from s->amax (fp8_compute_scale) and s->nonfinite to 1 when that
 * amax is not finite (sticky, fp8.h Fp8Scale), then casts x (rows, cols) BF16, or FP32 master weights
 * rounded to BF16, into FP8 codes out (rows, cols) and out_t (cols, rows); either may be NULL. counts
 * (device, may be NULL) accumulates the cast statistics (fp8.h Fp8Counts) with integer atomics. A BF16
 * tensor whose shape and pointers allow it takes the vectorized kernel, anything else the element-wise
 * one: the same codes, scale and counts.
 */
static inline void fp8_cast_transpose_cuda(uint8_t* out, uint8_t* out_t, const __nv_bfloat16* x, size_t rows, size_t cols,
                                           Fp8Format f, Fp8Scale* s, int pow2, Fp8Counts* counts) {
    if (fp8_cast_transpose_vec_ok(out, out_t, x, rows, cols))
        fp8_cast_transpose_vec_cuda(out, out_t, x, rows, cols, f, s, pow2, counts, 0, NULL);
    else fp8_cast_transpose_tiled_cuda(out, out_t, x, rows, cols, f, s, pow2, counts, 0, NULL);
}

static inline void fp8_cast_transpose_cuda(uint8_t* out, uint8_t* out_t, const float* x, size_t rows, size_t cols,
                                           Fp8Format f, Fp8Scale* s, int pow2, Fp8Counts* counts) {
    fp8_cast_transpose_tiled_cuda(out, out_t, x, rows, cols, f, s, pow2, counts, 0, NULL);
}

/*
 * The delayed recipe's cast (llama/backend.h op_cast_transpose_delayed): the same kernels, codes and
 * counts with the scale s holds, s->amax (reset here) and *record (device, may be NULL) raised to the
 * tensor's amax by the kernel's blocks with atomicMax on the sign-cleared bit patterns, as amax_kernel
 * publishes them (order-independent, so deterministic). No host synchronization.
 */
static inline void fp8_cast_transpose_delayed_cuda(uint8_t* out, uint8_t* out_t, const __nv_bfloat16* x, size_t rows,
                                                   size_t cols, Fp8Format f, Fp8Scale* s, Fp8Counts* counts, float* record) {
    fp8_amax_zero(s);
    if (fp8_cast_transpose_vec_ok(out, out_t, x, rows, cols))
        fp8_cast_transpose_vec_cuda(out, out_t, x, rows, cols, f, s, 0, counts, 1, (unsigned int*)record);
    else fp8_cast_transpose_tiled_cuda(out, out_t, x, rows, cols, f, s, 0, counts, 1, (unsigned int*)record);
}

/* x (rows, cols) BF16 cast as q says (fp8.h Fp8Quant; device pointers) into out and/or out_t. */
static inline void fp8_quantize_cuda(uint8_t* out, uint8_t* out_t, const __nv_bfloat16* x, size_t rows, size_t cols, Fp8Format f,
                                     const Fp8Quant* q) {
    if (q->amax) fp8_amax_cuda(q->s, x, rows * cols);
    if (!q->history && q->record == NULL) {
        fp8_cast_transpose_cuda(out, out_t, x, rows, cols, f, q->s, q->pow2, q->counts);
        return;
    }
    if (!q->history) fp8_cast_transpose_cuda(NULL, NULL, x, 0, cols, f, q->s, q->pow2, NULL); /* the scale from the amax */
    fp8_cast_transpose_delayed_cuda(out, out_t, x, rows, cols, f, q->s, q->counts, q->record);
}

/* One thread per record: fp8.h's fp8_delayed_update (the CPU runs the same function in a loop). */
__global__ void delayed_update_kernel(Fp8Scale* s, float* history, const float* step_amax, size_t n, int H, int pos, int len,
                                      int algo, Fp8Format f, int margin, int pow2) {
    size_t i = grid_index();
    if (i < n) fp8_delayed_update(&s[i], history + i * (size_t)H, step_amax[i], H, pos, len, algo, f, margin, pow2);
}

/* op_fp8_delayed_update on the device (llama/backend.h). */
static inline void fp8_delayed_update_cuda(Fp8Scale* s, float* history, const float* step_amax, size_t n, int H, int pos,
                                           int len, int algo, Fp8Format f, int margin, int pow2) {
    if (n == 0) return;
    LAUNCH(delayed_update_kernel, grid_for(n, BLOCK_THREADS), BLOCK_THREADS)(s, history, step_amax, n, H, pos, len, algo, f,
                                                                           margin, pow2);
    launchCheck();
}

/* Loads delayed_update_kernel without running it (the trainer's warm-up: the update changes the histories). */
static inline void fp8_load_update_kernels(void) {
    cudaFuncAttributes attr;
    cudaCheck(cudaFuncGetAttributes(&attr, (const void*)delayed_update_kernel));
}

/* One CT_TILE x CT_TILE tile per block, staged in shared memory so that reads and writes are coalesced. */
__global__ void __launch_bounds__(CT_THREADS) transpose_u8_kernel(uint8_t* out_t, const uint8_t* in, size_t rows, size_t cols,
                                                                  size_t tiles_x) {
    __shared__ uint8_t tile[CT_TILE][CT_TILE + CT_PAD];
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    size_t r0 = (blockIdx.x / tiles_x) * CT_TILE, c0 = (blockIdx.x % tiles_x) * CT_TILE;
    for (int lr = warp; lr < CT_TILE; lr += CT_ROWS_PER_PASS) {
        for (int e = 0; e < CT_COLS_PER_THREAD; e++) {
            int lc = lane * CT_COLS_PER_THREAD + e;
            if (r0 + lr < rows && c0 + lc < cols) tile[lr][lc] = in[(r0 + lr) * cols + c0 + lc];
        }
    }
    __syncthreads();
    for (int lc = warp; lc < CT_TILE; lc += CT_ROWS_PER_PASS) {
        for (int e = 0; e < CT_COLS_PER_THREAD; e++) {
            int lr = lane * CT_COLS_PER_THREAD + e;
            if (r0 + lr < rows && c0 + lc < cols) out_t[(c0 + lc) * rows + r0 + lr] = tile[lr][lc];
        }
    }
}

/* out_t (cols, rows) = in (rows, cols) transposed: FP8 codes, copied (a weight's W^T from its gathered W). */
static inline void fp8_transpose_cuda(uint8_t* out_t, const uint8_t* in, size_t rows, size_t cols) {
    if (rows == 0 || cols == 0) return;
    size_t tiles_x = ceil_div(cols, CT_TILE), tiles = ceil_div(rows, CT_TILE) * tiles_x;
    if (tiles > INT32_MAX) die("transpose of a (%zu, %zu) tensor needs more than 2^31 tiles", rows, cols);
    LAUNCH(transpose_u8_kernel, (unsigned int)tiles, CT_THREADS)(out_t, in, rows, cols, tiles_x);
    launchCheck();
}
