/*
 * cuDNN SDPA for cuda/cudnn_att.h: forward (training mode, with the softmax statistics) and backward
 * graphs of the cuDNN frontend graph API, one per shape, built at start-up (cudnn_att_prepare; a program
 * that does not prepare builds them on first use) and cached. q, k, v are read
 * straight from the fused qkv buffer and dq, dk, dv written straight into dqkv through strides, so no
 * permute kernels run around attention; grouped-query attention is native (K/V tensors with NKV heads).
 * Host-only C++, compiled by g++ (see the header); the emulated GPU links the same object against its
 * cuDNN double (docs/emulated-gpu.md). API: cudnn_frontend/graph_interface.h and graph_properties.h of the
 * nvidia-cudnn-frontend release in use (1.x), docs/operations/Attention.md.
 */
#include "cudnn_att.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <tuple>
#include <unordered_map>

#include <cuda_runtime.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include "../core/common.h"
#include "../core/cuda_check.h"

namespace fe = cudnn_frontend;

/* Bytes per BF16 element: the pointer offsets of k and v inside a qkv row. */
static const int64_t BF16_BYTES = 2;

/* Tensor UIDs of the variant packs. */
enum : int64_t { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DO, UID_DQ, UID_DK, UID_DV };

static cudnnHandle_t g_cudnn = nullptr;
/*
 * cuDNN's fastest SDPA backward accumulates dQ with atomics, so two runs differ in the last bits.
 * LLM8_DETERMINISTIC=1 selects its deterministic algorithm (slower) for bit-reproducible GPU runs.
 */
static bool g_deterministic = false;
static void* g_workspace = nullptr;
static int64_t g_workspace_bytes = 0;
static CudnnAttAlloc g_alloc = nullptr;
static CudnnAttFree g_free = nullptr;
/* Set by cudnn_att_prepare: from then on every shape's graph must exist already. */
static bool g_prepared = false;

/* (B, T, NH, NKV, HS, backward, deterministic) -> built graph */
typedef std::tuple<int, int, int, int, int, int, int> GraphKey;
static std::map<GraphKey, std::shared_ptr<fe::graph::Graph>> g_graphs;

static void cudnn_check(cudnnStatus_t status, const char* call, const char* file, int line) {
    if (status != CUDNN_STATUS_SUCCESS) die("cuDNN error at %s:%d: %s: %s", file, line, call, cudnnGetErrorString(status));
}
#define cudnnCheck(call) cudnn_check((call), #call, __FILE__, __LINE__)


/* The frontend returns error objects instead of status codes; `shape` names the attention call. */
static void fe_check(fe::error_t err, const char* call, const std::string& shape, const char* file, int line) {
    if (err.is_bad())
        die("cuDNN frontend error at %s:%d: %s for attention %s: %s", file, line, call, shape.c_str(), err.get_message().c_str());
}
#define feCheck(call, shape) fe_check((call), #call, shape, __FILE__, __LINE__)

static std::string shape_name(bool backward, int B, int T, int NH, int NKV, int HS) {
    char s[160];
    snprintf(s, sizeof(s), "%s (B %d, T %d, NH %d, NKV %d, HS %d)", backward ? "backward" : "forward", B, T, NH, NKV, HS);
    return s;
}

/* A (B, heads, T, HS) view of a (B, T, row) BF16 buffer: heads of HS contiguous elements per row. */
static std::shared_ptr<fe::graph::Tensor_attributes> bhsd_tensor(fe::graph::Graph& g, const char* name, int64_t uid, int B,
                                                                 int heads, int T, int HS, int64_t row) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({B, heads, T, HS})
                        .set_stride({(int64_t)T * row, HS, row, 1}));
}

static void set_bhsd(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid, int B, int heads, int T, int HS,
                     int64_t row) {
    t->set_output(true).set_uid(uid).set_dim({B, heads, T, HS}).set_stride({(int64_t)T * row, HS, row, 1});
}

static std::shared_ptr<fe::graph::Graph> build_graph(bool backward, int B, int T, int NH, int NKV, int HS) {
    int64_t C = (int64_t)NH * HS, QKV = C + 2 * (int64_t)NKV * HS;
    float scale = 1.0f / std::sqrt((float)HS);
    std::string shape = shape_name(backward, B, T, NH, NKV, HS);
    auto g = std::make_shared<fe::graph::Graph>();
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto q = bhsd_tensor(*g, "q", UID_Q, B, NH, T, HS, QKV);
    auto k = bhsd_tensor(*g, "k", UID_K, B, NKV, T, HS, QKV);
    auto v = bhsd_tensor(*g, "v", UID_V, B, NKV, T, HS, QKV);
    if (!backward) {
        auto opts = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_causal_mask(true).set_attn_scale(scale);
        auto [o, stats] = g->sdpa(q, k, v, opts);
        set_bhsd(o, UID_O, B, NH, T, HS, C);
        stats->set_output(true)
            .set_uid(UID_STATS)
            .set_data_type(fe::DataType_t::FLOAT)
            .set_dim({B, NH, T, 1})
            .set_stride({(int64_t)NH * T, T, 1, 1});
    } else {
        auto o = bhsd_tensor(*g, "o", UID_O, B, NH, T, HS, C);
        auto dout = bhsd_tensor(*g, "dO", UID_DO, B, NH, T, HS, C);
        auto stats = g->tensor(fe::graph::Tensor_attributes()
                                   .set_name("stats")
                                   .set_uid(UID_STATS)
                                   .set_dim({B, NH, T, 1})
                                   .set_stride({(int64_t)NH * T, T, 1, 1})
                                   .set_data_type(fe::DataType_t::FLOAT));
        auto opts = fe::graph::SDPA_backward_attributes()
                        .set_name("sdpa_backward")
                        .set_causal_mask(true)
                        .set_attn_scale(scale)
                        .set_deterministic_algorithm(g_deterministic);
        auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, opts);
        set_bhsd(dq, UID_DQ, B, NH, T, HS, QKV);
        set_bhsd(dk, UID_DK, B, NKV, T, HS, QKV);
        set_bhsd(dv, UID_DV, B, NKV, T, HS, QKV);
    }
    feCheck(g->validate(), shape);
    feCheck(g->build_operation_graph(g_cudnn), shape);
    feCheck(g->create_execution_plans({fe::HeurMode_t::A}), shape);
    feCheck(g->check_support(), shape);
    feCheck(g->build_plans(), shape);
    return g;
}

/* ---------------------------------------------------------------- the backward's workspace, planned */

/* Where the frontend's SDPA backward (CompositeSDPABackwardNode::expand_node and
   get_fe_workspace_size_node in cudnn_frontend/node/scaled_dot_product_flash_attention.h, frontend 1.32)
   reads its dP-workspace limit, in bytes: unset, -1 (no limit), 0 (never) or n. */
static const char* const DP_LIMIT_ENV = "CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT";
/* The frontend's default limit for cuDNN 8.9.5 <= version < 9.0 on Hopper (same header). */
static const int64_t DP_DEFAULT_LIMIT = (int64_t)256 << 20;

static int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

/* The dP workspace, B NH s_q s_kv BF16 with the sequence lengths rounded up to the engine's tiles: 64 x 64
   in the frontend's cuDNN 8.9 rule, 64 x 128 in its Hopper rule for cuDNN >= 9.25 (the larger; the two
   agree when T is a multiple of 128, as at T 4096: 1 GiB for Llama-2 7B at B 1). */
static int64_t dp_workspace_bytes(int B, int T, int NH, int kv_tile) {
    return (int64_t)B * NH * round_up(T, 64) * round_up(T, kv_tile) * BF16_BYTES;
}

extern "C" int cudnn_att_deterministic_env(void) {
    const char* env = getenv("LLM8_DETERMINISTIC");
    return env != nullptr && strcmp(env, "1") == 0;
}

/*
 * The frontend's choice, restated (causal, no bias, no dropout, dense BHSD tensors, as build_graph makes):
 *   - cuDNN 8.9.5 <= version < 9.0 on sm >= 90: the dP path when its bytes (64 x 64 tiles) are within the
 *     limit (unset: 256 MiB; -1: always; 0: never);
 *   - deterministic on sm 9x with cuDNN >= 9.25: the "ordered dQ" engine (linear workspace) only when the
 *     limit is set to n >= 0 below the dP bytes (64 x 128 tiles);
 *   - otherwise a deterministic backward always takes the dP path.
 * The frontend's own workspace: the softmax row sums (B NH T FP32) always, plus the FP32 dQ accumulator
 * (B NH T HS) off the dP path; on the dP path the engine's workspace holds dP instead.
 */
extern "C" CudnnAttWorkspace cudnn_att_backward_workspace(int B, int T, int NH, int NKV, int HS, int deterministic,
                                                          int sm_major) {
    (void)NKV; /* K and V head counts change no workspace of a dense layout (dK/dV full-head sums are virtual) */
    size_t version = cudnnGetVersion();
    /* parsed as the frontend parses it: strtoll, valid when nothing follows the number */
    const char* env = getenv(DP_LIMIT_ENV);
    int64_t limit = 0;
    bool limit_set = false;
    if (env != nullptr) {
        char* end = nullptr;
        limit = std::strtoll(env, &end, 10);
        limit_set = *end == '\0';
    }
    bool dp = false;
    if (version >= 8905 && version < 90000 && sm_major >= 9) {
        /* the frontend's 8.9 rule fails the graph on a malformed limit (its Hopper rule below ignores one) */
        if (env != nullptr && !limit_set) die("%s=%s: the cuDNN frontend takes an integer (bytes; -1 no limit, 0 never)", DP_LIMIT_ENV, env);
        int64_t need = dp_workspace_bytes(B, T, NH, 64), cap = limit_set ? limit : DP_DEFAULT_LIMIT;
        dp = cap == -1 || (cap != 0 && need <= cap);
    }
    bool ordered_dq = deterministic && sm_major == 9 && version >= 92500 && limit_set && limit >= 0 &&
                      dp_workspace_bytes(B, T, NH, 128) > limit;
    if (deterministic && !ordered_dq) dp = true;

    CudnnAttWorkspace w;
    int64_t rows = (int64_t)B * NH * T, row_sums = rows * (int64_t)sizeof(float);
    const char* algorithm = deterministic ? "deterministic" : "fastest";
    char version_text[32];
    /* cuDNN 9 numbers its versions major * 10000 + minor * 100 + patch, cuDNN 8 major * 1000 + minor * 100 + patch */
    if (version >= 90000) snprintf(version_text, sizeof(version_text), "cuDNN %zu.%zu", version / 10000, version / 100 % 100);
    else snprintf(version_text, sizeof(version_text), "cuDNN %zu.%zu", version / 1000, version / 100 % 10);
    if (dp) {
        int64_t dp_bytes = dp_workspace_bytes(B, T, NH, sm_major == 9 ? 128 : 64);
        w.bytes = (size_t)(dp_bytes + row_sums);
        snprintf(w.what, sizeof(w.what), "cuDNN SDPA backward (%s, dP workspace path, %s, sm %d): dP %.1f MiB + row sums",
                 algorithm, version_text, sm_major * 10, (double)dp_bytes / (1 << 20));
    } else {
        int64_t dq_accum = rows * HS * (int64_t)sizeof(float);
        w.bytes = (size_t)(dq_accum + row_sums);
        snprintf(w.what, sizeof(w.what), "cuDNN SDPA backward (%s%s, %s, sm %d): FP32 dQ accumulator + row sums", algorithm,
                 ordered_dq ? ", ordered dQ" : "", version_text, sm_major * 10);
    }
    w.dp_workspace = dp ? 1 : 0;
    return w;
}

/* ---------------------------------------------------------------- graphs */

static std::string key_name(const GraphKey& k) {
    return shape_name(std::get<5>(k) != 0, std::get<0>(k), std::get<1>(k), std::get<2>(k), std::get<3>(k), std::get<4>(k));
}

/* Builds the graph of a key; for a backward, prints cuDNN's workspace beside the memory plan's figure. */
static fe::graph::Graph& build(const GraphKey& key) {
    bool backward = std::get<5>(key) != 0;
    int B = std::get<0>(key), T = std::get<1>(key), NH = std::get<2>(key), NKV = std::get<3>(key), HS = std::get<4>(key);
    auto g = build_graph(backward, B, T, NH, NKV, HS);
    if (backward) {
        int64_t need = 0;
        feCheck(g->get_workspace_size(need), key_name(key));
        /* what the memory plan counted for this shape against what cuDNN asks for: the plan must not be short */
        int device = 0, major = 0;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
        CudnnAttWorkspace planned = cudnn_att_backward_workspace(B, T, NH, NKV, HS, g_deterministic, major);
        printf("| attention %s: workspace %.1f MiB, planned %.1f MiB (%s)%s\n", key_name(key).c_str(), (double)need / (1 << 20),
               (double)planned.bytes / (1 << 20), planned.what,
               (size_t)need > planned.bytes ? ": warning: more than the memory plan counts" : "");
    }
    return *g_graphs.emplace(key, g).first->second;
}

/* Makes the shared workspace at least `need` bytes. Only at start-up (cudnn_att_prepare) or for a caller
   that never prepared: the old workspace may still be in use by a queued attention kernel. */
static void grow_workspace(int64_t need) {
    if (need <= g_workspace_bytes) return;
    cudaCheck(cudaDeviceSynchronize());
    if (g_workspace != nullptr) g_free(g_workspace);
    cudaCheck(g_alloc(&g_workspace, (size_t)need));
    g_workspace_bytes = need;
}

static GraphKey graph_key(bool backward, int B, int T, int NH, int NKV, int HS) {
    return GraphKey(B, T, NH, NKV, HS, backward ? 1 : 0, backward && g_deterministic ? 1 : 0);
}

/* The cached graph of a shape. After cudnn_att_prepare a shape it did not prepare stops the run (it would
   build a graph and grow the workspace mid-run); before, it is built here and the workspace grown. */
static fe::graph::Graph& graph_for(bool backward, int B, int T, int NH, int NKV, int HS) {
    if (g_cudnn == nullptr) die("cudnn_att_init was not called before attention");
    GraphKey key = graph_key(backward, B, T, NH, NKV, HS);
    auto it = g_graphs.find(key);
    if (it != g_graphs.end()) return *it->second;
    if (g_prepared)
        die("attention %s%s: not among the shapes cudnn_att_prepare built at start-up", key_name(key).c_str(),
            backward && g_deterministic ? " (deterministic)" : "");
    fe::graph::Graph& g = build(key);
    int64_t need = 0;
    feCheck(g.get_workspace_size(need), key_name(key));
    grow_workspace(need);
    return g;
}

extern "C" void cudnn_att_prepare(const CudnnAttShape* shapes, int n, int NH, int NKV, int HS) {
    if (g_cudnn == nullptr) die("cudnn_att_init was not called before cudnn_att_prepare");
    int64_t need = g_workspace_bytes;
    for (int i = 0; i < n; i++)
        for (int backward = 0; backward <= shapes[i].backward; backward++) {
            GraphKey key = graph_key(backward != 0, shapes[i].B, shapes[i].T, NH, NKV, HS);
            auto it = g_graphs.find(key);
            fe::graph::Graph& g = it != g_graphs.end() ? *it->second : build(key);
            int64_t bytes = 0;
            feCheck(g.get_workspace_size(bytes), key_name(key));
            need = std::max(need, bytes);
        }
    grow_workspace(need);
    g_prepared = true;
    printf("| attention: %zu cuDNN graph(s) built at start-up, workspace %.1f MiB\n", g_graphs.size(), (double)g_workspace_bytes / (1 << 20));
}

extern "C" void cudnn_att_reserve(size_t bytes) {
    if (g_cudnn == nullptr) die("cudnn_att_init was not called before cudnn_att_reserve");
    grow_workspace((int64_t)bytes);
}

static void* offset(const void* p, int64_t elements) { return (char*)p + elements * BF16_BYTES; }

extern "C" void cudnn_att_init(CudnnAttAlloc alloc, CudnnAttFree free) {
    if (g_cudnn != nullptr) return;
    g_alloc = alloc;
    g_free = free;
    cudnnCheck(cudnnCreate(&g_cudnn));
    g_deterministic = cudnn_att_deterministic_env() != 0;
}

extern "C" int cudnn_att_set_deterministic(int on) {
    int previous = g_deterministic ? 1 : 0;
    g_deterministic = on != 0;
    return previous;
}

/* cuDNN 9 numbers its versions major * 10000 + minor * 100 + patch (cudnn_version.h). */
extern "C" void cudnn_att_versions(char* out, size_t len) {
    size_t run = cudnnGetVersion();
    snprintf(out, len, "cuDNN %zu.%zu.%zu (built with %d.%d.%d), frontend %d.%d.%d", run / 10000, run / 100 % 100, run % 100,
             CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL, CUDNN_FRONTEND_MAJOR_VERSION, CUDNN_FRONTEND_MINOR_VERSION,
             CUDNN_FRONTEND_PATCH_VERSION);
}

extern "C" void cudnn_att_forward(void* out, float* stats, const void* qkv, int B, int T, int NH, int NKV, int HS) {
    fe::graph::Graph& g = graph_for(false, B, T, NH, NKV, HS);
    int64_t C = (int64_t)NH * HS, KVC = (int64_t)NKV * HS;
    std::unordered_map<int64_t, void*> pack = {
        {UID_Q, offset(qkv, 0)}, {UID_K, offset(qkv, C)}, {UID_V, offset(qkv, C + KVC)}, {UID_O, out}, {UID_STATS, stats},
    };
    feCheck(g.execute(g_cudnn, pack, g_workspace), shape_name(false, B, T, NH, NKV, HS));
}

extern "C" void cudnn_att_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const float* stats, int B,
                                   int T, int NH, int NKV, int HS) {
    fe::graph::Graph& g = graph_for(true, B, T, NH, NKV, HS);
    int64_t C = (int64_t)NH * HS, KVC = (int64_t)NKV * HS;
    std::unordered_map<int64_t, void*> pack = {
        {UID_Q, offset(qkv, 0)},    {UID_K, offset(qkv, C)},    {UID_V, offset(qkv, C + KVC)},
        {UID_O, offset(out, 0)},    {UID_DO, offset(dout, 0)},  {UID_STATS, (void*)stats},
        {UID_DQ, offset(dqkv, 0)},  {UID_DK, offset(dqkv, C)},  {UID_DV, offset(dqkv, C + KVC)},
    };
    feCheck(g.execute(g_cudnn, pack, g_workspace), shape_name(true, B, T, NH, NKV, HS));
}
