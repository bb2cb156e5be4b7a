/*
 * cuDNN SDPA for cuda/cudnn_att.h: forward (training mode, with the softmax statistics) and backward
 * graphs of the cuDNN frontend graph API, one per shape, built on first use and cached. q, k, v are read
 * straight from the fused qkv buffer and dq, dk, dv written straight into dqkv through strides, so no
 * permute kernels run around attention; grouped-query attention is native (K/V tensors with NKV heads).
 * Host-only C++, compiled by g++ (see the header). API: cudnn_frontend/graph_interface.h and
 * graph_properties.h of the nvidia-cudnn-frontend release in use (1.x), docs/operations/Attention.md.
 */
#include "cudnn_att.h"

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

/* The cached graph of a shape, with the shared workspace grown to what it needs. */
static fe::graph::Graph& graph_for(bool backward, int B, int T, int NH, int NKV, int HS) {
    if (g_cudnn == nullptr) die("cudnn_att_init was not called before attention");
    GraphKey key(B, T, NH, NKV, HS, backward ? 1 : 0, backward && g_deterministic ? 1 : 0);
    auto it = g_graphs.find(key);
    if (it == g_graphs.end()) it = g_graphs.emplace(key, build_graph(backward, B, T, NH, NKV, HS)).first;
    int64_t need = 0;
    feCheck(it->second->get_workspace_size(need), shape_name(backward, B, T, NH, NKV, HS));
    if (need > g_workspace_bytes) {
        /* the old workspace may still be in use by a queued attention kernel */
        cudaCheck(cudaDeviceSynchronize());
        cudaCheck(cudaFree(g_workspace));
        cudaCheck(cudaMalloc(&g_workspace, (size_t)need));
        g_workspace_bytes = need;
    }
    return *it->second;
}

static void* offset(const void* p, int64_t elements) { return (char*)p + elements * BF16_BYTES; }

extern "C" void cudnn_att_init(void) {
    if (g_cudnn != nullptr) return;
    cudnnCheck(cudnnCreate(&g_cudnn));
    const char* env = getenv("LLM8_DETERMINISTIC");
    g_deterministic = env != nullptr && strcmp(env, "1") == 0;
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
