/*
 * The emulated GPU's cuDNN: the backend API of cudnn_graph.h (descriptors created, set, finalized, queried
 * and executed with a variant pack) as the cuDNN frontend calls it for cuda/cudnn_att.cpp's SDPA graphs, so
 * that the project's cuDNN glue and the frontend's own graph building run unchanged on the emulated GPU.
 * Compiled against the toolkit's real cudnn.h.
 *
 * The double interprets the operation graph the frontend emits (emu/LIBS_NOTES.md lists it): matmul,
 * pointwise (arithmetic, exp/log, comparisons, GEN_INDEX, BINARY_SELECT), reduction and reshape operations
 * on tensors of up to CUDNN_DIM_MAX dimensions. Every tensor holds FP32 values: an operation computes in
 * float64 (a matmul's sum over k in a fixed order) and its result is rounded to its output's data type,
 * so a BF16 tensor, virtual or not, holds BF16 values (the frontend declares P and dS BF16 before the
 * matmuls that read them, as the flash-attention kernels round them). The same arithmetic serves the
 * deterministic and the fastest backward graphs; it is deterministic, which cuDNN's fastest backward is not.
 *
 * Rules it enforces, each refused with the status the cuDNN API reference ("Backend Descriptor Types",
 * "cudnnBackendExecute()") gives and one "emu cuDNN: ..." line saying why: required attributes, attribute
 * types, dimensions and strides, data types, byte alignment, the shapes each operation relates, the graph's
 * UIDs and virtual tensors, the variant pack's tensors and pointers. What a GPU would fault on (host memory,
 * a tensor or workspace beyond its allocation) stops the run through emu_fail. Whatever the double does not
 * know (a descriptor type, an attribute, a pointwise mode, a data type) stops the run naming it, instead of
 * computing something else. Each refusal carries a "check:NAME" tag (dev/test/test_emu_libs.py).
 *
 * It reports cudnnGetVersion() = the version of the cuDNN headers it is built against, so the frontend
 * chooses the lowering it chooses with that library on an H100 (emu/runtime.cpp answers as sm_90).
 */
#include <cudnn.h>
#include <cuda_bf16.h>
#include <nvrtc.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "emu_runtime.h"

/* The version the double reports: its cuDNN headers' (cudnn_version.h), the library the GPU build links. */
#define EMU_CUDNN_VERSION CUDNN_VERSION

struct cudnnContext {
    cudaStream_t stream;
};

namespace {

/* ---------------------------------------------------------------- descriptors and attributes */

struct Attr {
    cudnnBackendAttributeType_t type;
    int64_t count;
    std::vector<char> bytes;
};

struct Tensor {
    int64_t uid = 0, align = 0;
    cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
    std::vector<int64_t> dim, stride;
    bool is_virtual = false, by_value = false;
};

enum OpKind { OP_MATMUL, OP_POINTWISE, OP_REDUCTION, OP_RESHAPE };

/* One operation: inputs (matmul A, B; pointwise X, B, T; reduction and reshape X) and its output. */
struct Op {
    OpKind kind;
    int mode = 0; /* pointwise mode or reduction operator */
    int64_t axis = -1;
    std::vector<Tensor> in;
    Tensor out;
};

struct Graph {
    std::map<int64_t, Tensor> tensors; /* by UID */
    std::vector<Op> ops;               /* in an order where every input is ready */
};

struct Desc {
    cudnnBackendDescriptorType_t type;
    bool finalized = false;
    std::map<int, Attr> attrs;
    Tensor tensor;                      /* TENSOR */
    Op op;                              /* OPERATION_* */
    std::shared_ptr<const Graph> graph; /* OPERATIONGRAPH, ENGINEHEUR, ENGINE, ENGINECFG, EXECUTION_PLAN */
    int64_t workspace = 0;              /* EXECUTION_PLAN */
};

struct TypeName {
    int type;
    const char* name;
};
#define T(x) {CUDNN_BACKEND_##x##_DESCRIPTOR, #x}
const TypeName DESC_TYPES[] = {
    T(TENSOR), T(POINTWISE), T(MATMUL), T(REDUCTION), T(OPERATION_POINTWISE), T(OPERATION_MATMUL),
    T(OPERATION_REDUCTION), T(OPERATION_RESHAPE), T(OPERATIONGRAPH), T(ENGINEHEUR), T(ENGINECFG),
    T(ENGINE), T(KNOB_CHOICE), T(EXECUTION_PLAN), T(VARIANT_PACK),
};
#undef T

const char* desc_name(int type) {
    for (const TypeName& t : DESC_TYPES)
        if (t.type == type) return t.name;
    return nullptr;
}

/* The attributes the double knows, with the type the API reference gives each (cudnn_graph.h's names). */
struct AttrSpec {
    int desc, attr;
    cudnnBackendAttributeType_t type;
    const char* name;
};
#define A(d, a, t) {CUDNN_BACKEND_##d##_DESCRIPTOR, CUDNN_ATTR_##a, CUDNN_TYPE_##t, #a}
const AttrSpec ATTRS[] = {
    A(TENSOR, TENSOR_BYTE_ALIGNMENT, INT64), A(TENSOR, TENSOR_DATA_TYPE, DATA_TYPE),
    A(TENSOR, TENSOR_DIMENSIONS, INT64), A(TENSOR, TENSOR_STRIDES, INT64), A(TENSOR, TENSOR_UNIQUE_ID, INT64),
    A(TENSOR, TENSOR_IS_VIRTUAL, BOOLEAN), A(TENSOR, TENSOR_IS_BY_VALUE, BOOLEAN),
    A(POINTWISE, POINTWISE_MODE, POINTWISE_MODE), A(POINTWISE, POINTWISE_MATH_PREC, DATA_TYPE),
    A(POINTWISE, POINTWISE_AXIS, INT64),
    A(MATMUL, MATMUL_COMP_TYPE, DATA_TYPE),
    A(REDUCTION, REDUCTION_OPERATOR, REDUCTION_OPERATOR_TYPE), A(REDUCTION, REDUCTION_COMP_TYPE, DATA_TYPE),
    A(REDUCTION, REDUCTION_IS_DETERMINISTIC, BOOLEAN),
    A(OPERATION_POINTWISE, OPERATION_POINTWISE_PW_DESCRIPTOR, BACKEND_DESCRIPTOR),
    A(OPERATION_POINTWISE, OPERATION_POINTWISE_XDESC, BACKEND_DESCRIPTOR),
    A(OPERATION_POINTWISE, OPERATION_POINTWISE_BDESC, BACKEND_DESCRIPTOR),
    A(OPERATION_POINTWISE, OPERATION_POINTWISE_TDESC, BACKEND_DESCRIPTOR),
    A(OPERATION_POINTWISE, OPERATION_POINTWISE_YDESC, BACKEND_DESCRIPTOR),
    A(OPERATION_POINTWISE, OPERATION_POINTWISE_ALPHA1, FLOAT), A(OPERATION_POINTWISE, OPERATION_POINTWISE_ALPHA2, FLOAT),
    A(OPERATION_MATMUL, OPERATION_MATMUL_ADESC, BACKEND_DESCRIPTOR),
    A(OPERATION_MATMUL, OPERATION_MATMUL_BDESC, BACKEND_DESCRIPTOR),
    A(OPERATION_MATMUL, OPERATION_MATMUL_CDESC, BACKEND_DESCRIPTOR),
    A(OPERATION_MATMUL, OPERATION_MATMUL_DESC, BACKEND_DESCRIPTOR),
    A(OPERATION_REDUCTION, OPERATION_REDUCTION_XDESC, BACKEND_DESCRIPTOR),
    A(OPERATION_REDUCTION, OPERATION_REDUCTION_YDESC, BACKEND_DESCRIPTOR),
    A(OPERATION_REDUCTION, OPERATION_REDUCTION_DESC, BACKEND_DESCRIPTOR),
    A(OPERATION_RESHAPE, OPERATION_RESHAPE_XDESC, BACKEND_DESCRIPTOR),
    A(OPERATION_RESHAPE, OPERATION_RESHAPE_YDESC, BACKEND_DESCRIPTOR),
    A(OPERATIONGRAPH, OPERATIONGRAPH_HANDLE, HANDLE), A(OPERATIONGRAPH, OPERATIONGRAPH_OPS, BACKEND_DESCRIPTOR),
    A(OPERATIONGRAPH, OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, INT64),
    A(ENGINEHEUR, ENGINEHEUR_MODE, HEUR_MODE), A(ENGINEHEUR, ENGINEHEUR_OPERATION_GRAPH, BACKEND_DESCRIPTOR),
    A(ENGINEHEUR, ENGINEHEUR_RESULTS, BACKEND_DESCRIPTOR),
    A(ENGINE, ENGINE_OPERATION_GRAPH, BACKEND_DESCRIPTOR), A(ENGINE, ENGINE_GLOBAL_INDEX, INT64),
    A(ENGINE, ENGINE_KNOB_INFO, BACKEND_DESCRIPTOR), A(ENGINE, ENGINE_NUMERICAL_NOTE, NUMERICAL_NOTE),
    A(ENGINE, ENGINE_BEHAVIOR_NOTE, BEHAVIOR_NOTE),
    A(ENGINECFG, ENGINECFG_ENGINE, BACKEND_DESCRIPTOR), A(ENGINECFG, ENGINECFG_KNOB_CHOICES, BACKEND_DESCRIPTOR),
    A(ENGINECFG, ENGINECFG_WORKSPACE_SIZE, INT64), A(ENGINECFG, ENGINECFG_SHARED_MEMORY_USED, INT32),
    A(KNOB_CHOICE, KNOB_CHOICE_KNOB_TYPE, KNOB_TYPE), A(KNOB_CHOICE, KNOB_CHOICE_KNOB_VALUE, INT64),
    A(EXECUTION_PLAN, EXECUTION_PLAN_HANDLE, HANDLE), A(EXECUTION_PLAN, EXECUTION_PLAN_ENGINE_CONFIG, BACKEND_DESCRIPTOR),
    A(EXECUTION_PLAN, EXECUTION_PLAN_WORKSPACE_SIZE, INT64),
    A(VARIANT_PACK, VARIANT_PACK_UNIQUE_IDS, INT64), A(VARIANT_PACK, VARIANT_PACK_DATA_POINTERS, VOID_PTR),
    A(VARIANT_PACK, VARIANT_PACK_WORKSPACE, VOID_PTR),
};
#undef A

const AttrSpec* attr_spec(int desc, int attr) {
    for (const AttrSpec& s : ATTRS)
        if (s.desc == desc && s.attr == attr) return &s;
    return nullptr;
}

std::string g_last_error;

/* Returns `status` after printing why (and keeping it for cudnnGetLastErrorString), as cuDNN logs a refusal. */
cudnnStatus_t refuse(cudnnStatus_t status, const char* api, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
cudnnStatus_t refuse(cudnnStatus_t status, const char* api, const char* fmt, ...) {
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    g_last_error = std::string(api) + ": " + why;
    fprintf(stderr, "emu cuDNN: %s returns %s: %s\n", api, cudnnGetErrorString(status), why);
    return status;
}

Desc* desc_of(cudnnBackendDescriptor_t d) { return static_cast<Desc*>(d); }

const Attr* find(const Desc* d, int attr) {
    auto it = d->attrs.find(attr);
    return it == d->attrs.end() ? nullptr : &it->second;
}

template <typename V>
V scalar(const Desc* d, int attr, V fallback) {
    const Attr* a = find(d, attr);
    if (a == nullptr || a->count < 1) return fallback;
    V v;
    memcpy(&v, a->bytes.data(), sizeof(V));
    return v;
}

template <typename V>
std::vector<V> array(const Desc* d, int attr) {
    const Attr* a = find(d, attr);
    if (a == nullptr) return {};
    std::vector<V> v((size_t)a->count);
    memcpy(v.data(), a->bytes.data(), v.size() * sizeof(V));
    return v;
}

size_t attr_type_bytes(cudnnBackendAttributeType_t t) {
    switch (t) {
        case CUDNN_TYPE_INT64: return 8;
        case CUDNN_TYPE_DOUBLE: return 8;
        case CUDNN_TYPE_FLOAT: return 4;
        case CUDNN_TYPE_BOOLEAN: return sizeof(bool);
        case CUDNN_TYPE_HANDLE: return sizeof(cudnnHandle_t);
        case CUDNN_TYPE_VOID_PTR: return sizeof(void*);
        case CUDNN_TYPE_BACKEND_DESCRIPTOR: return sizeof(cudnnBackendDescriptor_t);
        default: return 4; /* the enums */
    }
}

/* ---------------------------------------------------------------- data types */

size_t dtype_bytes(cudnnDataType_t t) {
    switch (t) {
        case CUDNN_DATA_FLOAT: case CUDNN_DATA_INT32: return 4;
        case CUDNN_DATA_BFLOAT16: case CUDNN_DATA_HALF: return 2;
        case CUDNN_DATA_BOOLEAN: return 1;
        default: return 0; /* not emulated */
    }
}

const char* dtype_name(cudnnDataType_t t) {
    switch (t) {
        case CUDNN_DATA_FLOAT: return "FLOAT";
        case CUDNN_DATA_INT32: return "INT32";
        case CUDNN_DATA_BFLOAT16: return "BFLOAT16";
        case CUDNN_DATA_HALF: return "HALF";
        case CUDNN_DATA_BOOLEAN: return "BOOLEAN";
        default: return "?";
    }
}

/* A value as a tensor of type t holds it: FP32, BF16 and FP16 rounded to nearest even, integers exact. */
float round_to(cudnnDataType_t t, double v) {
    switch (t) {
        case CUDNN_DATA_BFLOAT16: return __bfloat162float(__float2bfloat16_rn((float)v));
        case CUDNN_DATA_HALF: return __half2float(__float2half_rn((float)v));
        case CUDNN_DATA_INT32: return (float)(int32_t)v;
        case CUDNN_DATA_BOOLEAN: return v != 0.0 ? 1.0f : 0.0f;
        default: return (float)v;
    }
}

float load(cudnnDataType_t t, const char* p) {
    switch (t) {
        case CUDNN_DATA_BFLOAT16: { __nv_bfloat16 v; memcpy(&v, p, 2); return __bfloat162float(v); }
        case CUDNN_DATA_HALF: { __half v; memcpy(&v, p, 2); return __half2float(v); }
        case CUDNN_DATA_INT32: { int32_t v; memcpy(&v, p, 4); return (float)v; }
        case CUDNN_DATA_BOOLEAN: return *p != 0 ? 1.0f : 0.0f;
        default: { float v; memcpy(&v, p, 4); return v; }
    }
}

void store(cudnnDataType_t t, char* p, float v) {
    switch (t) {
        case CUDNN_DATA_BFLOAT16: { __nv_bfloat16 b = __float2bfloat16_rn(v); memcpy(p, &b, 2); break; }
        case CUDNN_DATA_HALF: { __half h = __float2half_rn(v); memcpy(p, &h, 2); break; }
        case CUDNN_DATA_INT32: { int32_t i = (int32_t)v; memcpy(p, &i, 4); break; }
        case CUDNN_DATA_BOOLEAN: *p = v != 0.0f; break;
        default: memcpy(p, &v, 4);
    }
}

/* ---------------------------------------------------------------- shapes */

int64_t elements(const Tensor& t) {
    int64_t n = 1;
    for (int64_t d : t.dim) n *= d;
    return n;
}

/* Bytes from the tensor's pointer to one past its last element, through its strides. */
int64_t extent_bytes(const Tensor& t) {
    int64_t last = 0;
    for (size_t i = 0; i < t.dim.size(); i++) last += (t.dim[i] - 1) * t.stride[i];
    return (last + 1) * (int64_t)dtype_bytes(t.dtype);
}

std::string describe(const Tensor& t) {
    std::string s = "uid " + std::to_string(t.uid) + " " + dtype_name(t.dtype) + (t.is_virtual ? " virtual" : "") + " (";
    for (size_t i = 0; i < t.dim.size(); i++) s += (i ? ", " : "") + std::to_string(t.dim[i]);
    s += ") strides (";
    for (size_t i = 0; i < t.stride.size(); i++) s += (i ? ", " : "") + std::to_string(t.stride[i]);
    return s + ")";
}

/* How an input's dimension maps onto the output's: equal, broadcast (1), or grouped (a divisor: output
   index i reads input index i / (out / in), the frontend's "(hk g)" head grouping for GQA). */
bool maps_onto(int64_t in, int64_t out, bool grouped) { return in == out || in == 1 || (grouped && out % in == 0); }

/* ---------------------------------------------------------------- finalize */

const Tensor* tensor_attr(const Desc* d, int attr) {
    const Attr* a = find(d, attr);
    if (a == nullptr || a->count < 1) return nullptr;
    Desc* t;
    memcpy(&t, a->bytes.data(), sizeof(t));
    return t != nullptr && t->type == CUDNN_BACKEND_TENSOR_DESCRIPTOR && t->finalized ? &t->tensor : nullptr;
}

const Desc* desc_attr(const Desc* d, int attr, cudnnBackendDescriptorType_t type) {
    const Attr* a = find(d, attr);
    if (a == nullptr || a->count < 1) return nullptr;
    Desc* x;
    memcpy(&x, a->bytes.data(), sizeof(x));
    return x != nullptr && x->type == type && x->finalized ? x : nullptr;
}

cudnnStatus_t finalize_tensor(Desc* d) {
    const char* api = "cudnnBackendFinalize(TENSOR)";
    Tensor& t = d->tensor;
    for (int a : {CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_ATTR_TENSOR_STRIDES,
                  CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT})
        if (find(d, a) == nullptr) /* check:tensor_required */
            return refuse(CUDNN_STATUS_BAD_PARAM, api, "required attribute %s not set", attr_spec(d->type, a)->name);
    t.uid = scalar<int64_t>(d, CUDNN_ATTR_TENSOR_UNIQUE_ID, 0);
    t.dtype = scalar<cudnnDataType_t>(d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_DATA_FLOAT);
    t.dim = array<int64_t>(d, CUDNN_ATTR_TENSOR_DIMENSIONS);
    t.stride = array<int64_t>(d, CUDNN_ATTR_TENSOR_STRIDES);
    t.align = scalar<int64_t>(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, 0);
    t.is_virtual = scalar<bool>(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, false);
    t.by_value = scalar<bool>(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, false);
    if (dtype_bytes(t.dtype) == 0) emu_fail("%s: uid %ld: data type %d is not emulated", api, (long)t.uid, (int)t.dtype);
    if (t.dim.empty() || t.dim.size() > CUDNN_DIM_MAX || t.dim.size() != t.stride.size()) /* check:tensor_rank */
        return refuse(CUDNN_STATUS_BAD_PARAM, api, "%s: %zu dimensions and %zu strides (1 to CUDNN_DIM_MAX %d, as many of each)",
                      describe(t).c_str(), t.dim.size(), t.stride.size(), CUDNN_DIM_MAX);
    for (size_t i = 0; i < t.dim.size(); i++)
        if (t.dim[i] <= 0 || t.stride[i] <= 0) /* check:tensor_positive */
            return refuse(CUDNN_STATUS_BAD_PARAM, api, "%s: dimension %zu or its stride is not positive", describe(t).c_str(), i);
    if (t.align <= 0 || t.align % (int64_t)dtype_bytes(t.dtype) != 0) /* check:tensor_alignment */
        return refuse(CUDNN_STATUS_BAD_PARAM, api, "%s: byte alignment %ld is not a multiple of the data type's %zu bytes",
                      describe(t).c_str(), (long)t.align, dtype_bytes(t.dtype));
    if (t.is_virtual && t.by_value) /* check:tensor_virtual_by_value */
        return refuse(CUDNN_STATUS_BAD_PARAM, api, "%s: a tensor passed by value cannot be virtual", describe(t).c_str());
    if (t.by_value && elements(t) != 1) /* check:tensor_by_value_scalar */
        return refuse(CUDNN_STATUS_BAD_PARAM, api, "%s: a tensor passed by value is a scalar", describe(t).c_str());
    return CUDNN_STATUS_SUCCESS;
}

/* The operation descriptors: their tensors, and the shape rule each operation relates them by. */
cudnnStatus_t finalize_op(Desc* d) {
    Op& op = d->op;
    const char* api = "cudnnBackendFinalize(OPERATION)";
    int sub_attr, out_attr; /* the operation's own descriptor, its output */
    cudnnBackendDescriptorType_t sub_type = CUDNN_BACKEND_POINTWISE_DESCRIPTOR;
    std::vector<int> in_attrs;
    switch (d->type) {
        case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR:
            op.kind = OP_MATMUL, sub_attr = CUDNN_ATTR_OPERATION_MATMUL_DESC, sub_type = CUDNN_BACKEND_MATMUL_DESCRIPTOR;
            in_attrs = {CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_ATTR_OPERATION_MATMUL_BDESC}, out_attr = CUDNN_ATTR_OPERATION_MATMUL_CDESC;
            break;
        case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
            op.kind = OP_POINTWISE, sub_attr = CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR;
            in_attrs = {CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_ATTR_OPERATION_POINTWISE_TDESC};
            out_attr = CUDNN_ATTR_OPERATION_POINTWISE_YDESC;
            break;
        case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR:
            op.kind = OP_REDUCTION, sub_attr = CUDNN_ATTR_OPERATION_REDUCTION_DESC, sub_type = CUDNN_BACKEND_REDUCTION_DESCRIPTOR;
            in_attrs = {CUDNN_ATTR_OPERATION_REDUCTION_XDESC}, out_attr = CUDNN_ATTR_OPERATION_REDUCTION_YDESC;
            break;
        default:
            op.kind = OP_RESHAPE, sub_attr = 0;
            in_attrs = {CUDNN_ATTR_OPERATION_RESHAPE_XDESC}, out_attr = CUDNN_ATTR_OPERATION_RESHAPE_YDESC;
    }
    auto missing = [&](int attr) {
        return refuse(CUDNN_STATUS_BAD_PARAM, api, "%s: required attribute %s not set (or not finalized)", desc_name(d->type),
                      attr_spec(d->type, attr)->name);
    };
    const Desc* sub = sub_attr ? desc_attr(d, sub_attr, sub_type) : nullptr;
    if (sub_attr && sub == nullptr) /* check:op_required */
        return missing(sub_attr);
    if (op.kind == OP_MATMUL && scalar<cudnnDataType_t>(sub, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_DATA_FLOAT) != CUDNN_DATA_FLOAT)
        emu_fail("%s: matmul compute type other than FLOAT is not emulated", api);
    if (op.kind == OP_REDUCTION) {
        op.mode = scalar<int>(sub, CUDNN_ATTR_REDUCTION_OPERATOR, -1);
        if (op.mode != CUDNN_REDUCE_TENSOR_ADD && op.mode != CUDNN_REDUCE_TENSOR_MAX && op.mode != CUDNN_REDUCE_TENSOR_MIN &&
            op.mode != CUDNN_REDUCE_TENSOR_AMAX)
            emu_fail("%s: reduction operator %d is not emulated", api, op.mode);
    }
    if (op.kind == OP_POINTWISE) {
        op.mode = scalar<int>(sub, CUDNN_ATTR_POINTWISE_MODE, -1);
        op.axis = scalar<int64_t>(sub, CUDNN_ATTR_POINTWISE_AXIS, -1);
        switch (op.mode) {
            case CUDNN_POINTWISE_EXP: case CUDNN_POINTWISE_LOG: case CUDNN_POINTWISE_IDENTITY: case CUDNN_POINTWISE_NEG:
            case CUDNN_POINTWISE_GEN_INDEX: in_attrs.resize(1); break;
            case CUDNN_POINTWISE_ADD: case CUDNN_POINTWISE_SUB: case CUDNN_POINTWISE_MUL: case CUDNN_POINTWISE_DIV:
            case CUDNN_POINTWISE_MAX: case CUDNN_POINTWISE_MIN: case CUDNN_POINTWISE_CMP_EQ: case CUDNN_POINTWISE_CMP_NEQ:
            case CUDNN_POINTWISE_CMP_GT: case CUDNN_POINTWISE_CMP_GE: case CUDNN_POINTWISE_CMP_LT: case CUDNN_POINTWISE_CMP_LE:
            case CUDNN_POINTWISE_LOGICAL_AND: case CUDNN_POINTWISE_LOGICAL_OR: in_attrs.resize(2); break;
            case CUDNN_POINTWISE_BINARY_SELECT: break;
            default: emu_fail("%s: pointwise mode %d is not emulated", api, op.mode);
        }
        for (int a : {CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2})
            if (scalar<float>(d, a, 1.0f) != 1.0f) emu_fail("%s: pointwise %s other than 1 is not emulated", api, attr_spec(d->type, a)->name);
    }
    in_attrs.push_back(out_attr);
    for (int a : in_attrs) {
        const Tensor* t = tensor_attr(d, a);
        if (t == nullptr) /* check:op_required */
            return missing(a);
        if (a == out_attr) op.out = *t;
        else op.in.push_back(*t);
    }
    const Tensor& x = op.in[0];
    size_t rank = op.out.dim.size();
    for (const Tensor& t : op.in)
        if (t.dim.size() != rank && op.kind != OP_RESHAPE) /* check:op_rank */
            return refuse(CUDNN_STATUS_BAD_PARAM, api, "%s: input %s and output %s differ in rank", desc_name(d->type),
                          describe(t).c_str(), describe(op.out).c_str());
    if (op.out.by_value) /* check:op_output_by_value */
        return refuse(CUDNN_STATUS_BAD_PARAM, api, "%s: output %s is passed by value", desc_name(d->type), describe(op.out).c_str());
    const std::vector<int64_t>& o = op.out.dim;
    if (op.kind == OP_MATMUL) {
        /* A (..., M, K) x B (..., K, N) = C (..., M, N); batch dimensions broadcast or grouped */
        const Tensor& b = op.in[1];
        bool ok = rank >= 2 && x.dim[rank - 2] == o[rank - 2] && b.dim[rank - 1] == o[rank - 1] && x.dim[rank - 1] == b.dim[rank - 2];
        for (size_t i = 0; ok && i + 2 < rank; i++) ok = maps_onto(x.dim[i], o[i], true) && maps_onto(b.dim[i], o[i], true);
        if (!ok) /* check:matmul_shape */
            return refuse(CUDNN_STATUS_BAD_PARAM, api, "matmul: A %s x B %s does not give C %s", describe(x).c_str(),
                          describe(b).c_str(), describe(op.out).c_str());
    } else if (op.kind == OP_POINTWISE) {
        for (const Tensor& t : op.in)
            for (size_t i = 0; i < rank; i++)
                if (!maps_onto(t.dim[i], o[i], false)) /* check:pointwise_broadcast */
                    return refuse(CUDNN_STATUS_BAD_PARAM, api, "pointwise mode %d: input %s does not broadcast to output %s",
                                  op.mode, describe(t).c_str(), describe(op.out).c_str());
        if (op.mode == CUDNN_POINTWISE_GEN_INDEX && (op.axis < 0 || op.axis >= (int64_t)rank)) /* check:gen_index_axis */
            return refuse(CUDNN_STATUS_BAD_PARAM, api, "GEN_INDEX: axis %ld outside the output's %zu dimensions", (long)op.axis, rank);
    } else if (op.kind == OP_REDUCTION) {
        for (size_t i = 0; i < rank; i++)
            if (!maps_onto(o[i], x.dim[i], true)) /* check:reduction_shape */
                return refuse(CUDNN_STATUS_BAD_PARAM, api, "reduction: output %s is not a reduction of input %s",
                              describe(op.out).c_str(), describe(x).c_str());
    } else if (elements(x) != elements(op.out)) /* check:reshape_elements */ {
        return refuse(CUDNN_STATUS_BAD_PARAM, api, "reshape: input %s and output %s differ in elements", describe(x).c_str(),
                      describe(op.out).c_str());
    }
    return CUDNN_STATUS_SUCCESS;
}

/* LLM8_EMU_CUDNN_TRACE=1: each finalized graph's operations, in the order they run, on stderr. */
void trace(const Graph& g) {
    const char* kinds[] = {"matmul", "pointwise", "reduction", "reshape"};
    fprintf(stderr, "emu cuDNN: graph of %zu operations\n", g.ops.size());
    for (const Op& op : g.ops) {
        fprintf(stderr, "  %s", kinds[op.kind]);
        if (op.kind == OP_POINTWISE || op.kind == OP_REDUCTION) fprintf(stderr, " mode %d", op.mode);
        if (op.axis >= 0) fprintf(stderr, " axis %ld", (long)op.axis);
        for (const Tensor& t : op.in) fprintf(stderr, " [%s%s]", describe(t).c_str(), t.by_value ? " by value" : "");
        fprintf(stderr, " -> [%s]\n", describe(op.out).c_str());
    }
}

/* The graph: one description per UID, each tensor written once, every virtual input written by an
   operation, no cycle; the operations are ordered so that each runs after the ones it reads. */
cudnnStatus_t finalize_graph(Desc* d) {
    const char* api = "cudnnBackendFinalize(OPERATIONGRAPH)";
    auto ops = array<Desc*>(d, CUDNN_ATTR_OPERATIONGRAPH_OPS);
    if (ops.empty()) /* check:graph_required */
        return refuse(CUDNN_STATUS_BAD_PARAM, api, "OPERATIONGRAPH_OPS not set");
    auto g = std::make_shared<Graph>();
    std::map<int64_t, int> writer;
    std::vector<Op> pending;
    for (Desc* od : ops) {
        bool is_op = od != nullptr && od->finalized && desc_name(od->type) && strncmp(desc_name(od->type), "OPERATION_", 10) == 0;
        if (!is_op) /* check:graph_required */
            return refuse(CUDNN_STATUS_BAD_PARAM, api, "an entry of OPERATIONGRAPH_OPS is not a finalized operation");
        pending.push_back(od->op);
        std::vector<const Tensor*> all;
        for (const Tensor& t : od->op.in) all.push_back(&t);
        all.push_back(&od->op.out);
        for (const Tensor* t : all) {
            auto it = g->tensors.emplace(t->uid, *t).first;
            const Tensor& seen = it->second;
            bool same = seen.dim == t->dim && seen.stride == t->stride && seen.dtype == t->dtype &&
                        seen.is_virtual == t->is_virtual && seen.by_value == t->by_value;
            if (!same) /* check:graph_uid */
                return refuse(CUDNN_STATUS_BAD_PARAM, api, "UID %ld names two different tensors: %s and %s", (long)t->uid,
                              describe(seen).c_str(), describe(*t).c_str());
        }
        if (++writer[od->op.out.uid] > 1) /* check:graph_single_writer */
            return refuse(CUDNN_STATUS_BAD_PARAM, api, "tensor %s is the output of two operations", describe(od->op.out).c_str());
    }
    for (const Op& op : pending)
        for (const Tensor& t : op.in)
            if (t.is_virtual && writer.count(t.uid) == 0) /* check:graph_virtual_input */
                return refuse(CUDNN_STATUS_BAD_PARAM, api, "virtual tensor %s is read but no operation writes it", describe(t).c_str());
    std::set<int64_t> ready;
    for (auto& [uid, t] : g->tensors)
        if (writer.count(uid) == 0) ready.insert(uid);
    while (!pending.empty()) {
        size_t before = pending.size();
        for (size_t i = 0; i < pending.size();) {
            bool inputs_ready = true;
            for (const Tensor& t : pending[i].in) inputs_ready = inputs_ready && ready.count(t.uid) > 0;
            if (!inputs_ready) { i++; continue; }
            ready.insert(pending[i].out.uid);
            g->ops.push_back(pending[i]);
            pending.erase(pending.begin() + (long)i);
        }
        if (pending.size() == before) /* check:graph_cycle */
            return refuse(CUDNN_STATUS_BAD_PARAM, api, "the operations form a cycle");
    }
    d->graph = g;
    if (getenv("LLM8_EMU_CUDNN_TRACE") != nullptr) trace(*g);
    return CUDNN_STATUS_SUCCESS;
}

/* The engine's workspace: none of its own (the double keeps its intermediates in host memory), unless
   LLM8_EMU_CUDNN_WORKSPACE=BYTES asks every plan for that many, which execute then scribbles over as an
   engine's scratch: how tests check that callers size and pass the workspace the plan reports. */
int64_t engine_workspace() {
    const char* env = getenv("LLM8_EMU_CUDNN_WORKSPACE");
    return env != nullptr ? atoll(env) : 0;
}

cudnnStatus_t finalize(Desc* d) {
    const char* api = "cudnnBackendFinalize";
    switch (d->type) {
        case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return finalize_tensor(d);
        case CUDNN_BACKEND_POINTWISE_DESCRIPTOR:
            if (find(d, CUDNN_ATTR_POINTWISE_MODE) == nullptr) /* check:op_required */
                return refuse(CUDNN_STATUS_BAD_PARAM, api, "POINTWISE: POINTWISE_MODE not set");
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_BACKEND_MATMUL_DESCRIPTOR:
            if (find(d, CUDNN_ATTR_MATMUL_COMP_TYPE) == nullptr) /* check:op_required */
                return refuse(CUDNN_STATUS_BAD_PARAM, api, "MATMUL: MATMUL_COMP_TYPE not set");
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_BACKEND_REDUCTION_DESCRIPTOR:
            if (find(d, CUDNN_ATTR_REDUCTION_OPERATOR) == nullptr) /* check:op_required */
                return refuse(CUDNN_STATUS_BAD_PARAM, api, "REDUCTION: REDUCTION_OPERATOR not set");
            return CUDNN_STATUS_SUCCESS;
        case CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR: return CUDNN_STATUS_SUCCESS;
        case CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR: case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
        case CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR: case CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR: return finalize_op(d);
        case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return finalize_graph(d);
        case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR:
        case CUDNN_BACKEND_ENGINE_DESCRIPTOR: {
            int attr = d->type == CUDNN_BACKEND_ENGINE_DESCRIPTOR ? CUDNN_ATTR_ENGINE_OPERATION_GRAPH : CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH;
            const Desc* g = desc_attr(d, attr, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
            if (g == nullptr) /* check:plan_required */
                return refuse(CUDNN_STATUS_BAD_PARAM, api, "%s: %s not set (or not finalized)", desc_name(d->type),
                              attr_spec(d->type, attr)->name);
            int64_t index = scalar<int64_t>(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, -1);
            if (d->type == CUDNN_BACKEND_ENGINE_DESCRIPTOR && index != 0) /* check:engine_index */
                return refuse(CUDNN_STATUS_NOT_SUPPORTED, api, "ENGINE: global index %ld; the double has one engine, index 0", (long)index);
            d->graph = g->graph;
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: {
            const Desc* e = desc_attr(d, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_BACKEND_ENGINE_DESCRIPTOR);
            if (e == nullptr) /* check:plan_required */
                return refuse(CUDNN_STATUS_BAD_PARAM, api, "ENGINECFG: ENGINECFG_ENGINE not set (or not finalized)");
            if (find(d, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES) != nullptr && find(d, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES)->count > 0)
                emu_fail("%s: ENGINECFG knob choices are not emulated (the double's engine has no knobs)", api);
            d->graph = e->graph;
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: {
            const Desc* cfg = desc_attr(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
            if (cfg == nullptr) /* check:plan_required */
                return refuse(CUDNN_STATUS_BAD_PARAM, api, "EXECUTION_PLAN: EXECUTION_PLAN_ENGINE_CONFIG not set (or not finalized)");
            d->graph = cfg->graph;
            d->workspace = engine_workspace();
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: {
            const Attr* ids = find(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
            const Attr* ptrs = find(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
            if (ids == nullptr || ptrs == nullptr || ids->count != ptrs->count) /* check:variant_pack_pairs */
                return refuse(CUDNN_STATUS_BAD_PARAM, api, "VARIANT_PACK: UNIQUE_IDS and DATA_POINTERS must be set, as many of each");
            return CUDNN_STATUS_SUCCESS;
        }
        default: emu_fail("%s: descriptor type %d is not emulated", api, (int)d->type);
    }
}

/* ---------------------------------------------------------------- execution */

/* A tensor's values, dense in its logical order (row-major over its dimensions). */
typedef std::vector<float> Values;

/* Element offsets (in elements) of the dense index space `out` into a tensor of dims `in` whose
   elements are at `stride`: broadcast dimensions (1) stay, grouped ones divide. */
std::vector<int64_t> offsets(const std::vector<int64_t>& out, const std::vector<int64_t>& in, const std::vector<int64_t>& stride) {
    int64_t n = 1;
    for (int64_t d : out) n *= d;
    std::vector<int64_t> off((size_t)n);
    std::vector<int64_t> idx(out.size(), 0);
    int64_t o = 0;
    for (int64_t i = 0; i < n; i++) {
        off[(size_t)i] = o;
        for (size_t d = out.size(); d-- > 0;) { /* the next index, the offset following it */
            if (++idx[d] < out[d]) {
                if (in[d] > 1 && idx[d] % (out[d] / in[d]) == 0) o += stride[d];
                break;
            }
            idx[d] = 0;
            if (in[d] > 1) o -= (in[d] - 1) * stride[d];
        }
    }
    return off;
}

std::vector<int64_t> dense_strides(const std::vector<int64_t>& dim) {
    std::vector<int64_t> s(dim.size(), 1);
    for (size_t d = dim.size(); d-- > 1;) s[d - 1] = s[d] * dim[d];
    return s;
}

Values load_tensor(const Tensor& t, const char* p) {
    std::vector<int64_t> off = offsets(t.dim, t.dim, t.stride);
    Values v(off.size());
    size_t bytes = dtype_bytes(t.dtype);
    for (size_t i = 0; i < off.size(); i++) v[i] = load(t.dtype, p + off[i] * (int64_t)bytes);
    return v;
}

void store_tensor(const Tensor& t, char* p, const Values& v) {
    std::vector<int64_t> off = offsets(t.dim, t.dim, t.stride);
    size_t bytes = dtype_bytes(t.dtype);
    for (size_t i = 0; i < off.size(); i++) store(t.dtype, p + off[i] * (int64_t)bytes, v[i]);
}

double pointwise(int mode, double x, double b, double t) {
    switch (mode) {
        case CUDNN_POINTWISE_ADD: return x + b;
        case CUDNN_POINTWISE_SUB: return x - b;
        case CUDNN_POINTWISE_MUL: return x * b;
        case CUDNN_POINTWISE_DIV: return x / b;
        case CUDNN_POINTWISE_MAX: return std::isnan(x) || std::isnan(b) ? NAN : std::fmax(x, b);
        case CUDNN_POINTWISE_MIN: return std::isnan(x) || std::isnan(b) ? NAN : std::fmin(x, b);
        case CUDNN_POINTWISE_EXP: return std::exp(x);
        case CUDNN_POINTWISE_LOG: return std::log(x);
        case CUDNN_POINTWISE_NEG: return -x;
        case CUDNN_POINTWISE_IDENTITY: return x;
        case CUDNN_POINTWISE_CMP_EQ: return x == b;
        case CUDNN_POINTWISE_CMP_NEQ: return x != b;
        case CUDNN_POINTWISE_CMP_GT: return x > b;
        case CUDNN_POINTWISE_CMP_GE: return x >= b;
        case CUDNN_POINTWISE_CMP_LT: return x < b;
        case CUDNN_POINTWISE_CMP_LE: return x <= b;
        case CUDNN_POINTWISE_LOGICAL_AND: return x != 0 && b != 0;
        case CUDNN_POINTWISE_LOGICAL_OR: return x != 0 || b != 0;
        default: return t != 0 ? x : b; /* BINARY_SELECT: y = t ? x : b */
    }
}

Values run_pointwise(const Op& op, const std::vector<const Values*>& in) {
    const std::vector<int64_t>& o = op.out.dim;
    std::vector<std::vector<int64_t>> off;
    for (const Tensor& t : op.in) off.push_back(offsets(o, t.dim, dense_strides(t.dim)));
    Values y((size_t)elements(op.out));
    std::vector<int64_t> ostride = dense_strides(o);
    for (size_t i = 0; i < y.size(); i++) {
        double v[3] = {0, 0, 0};
        for (size_t k = 0; k < in.size(); k++) v[k] = (*in[k])[(size_t)off[k][i]];
        double r = op.mode == CUDNN_POINTWISE_GEN_INDEX ? (double)((int64_t)i / ostride[(size_t)op.axis] % o[(size_t)op.axis])
                                                         : pointwise(op.mode, v[0], v[1], v[2]);
        y[i] = round_to(op.out.dtype, r);
    }
    return y;
}

/* C (..., M, N) = A (..., M, K) B (..., K, N): float64 sums over k (4 interleaved, added pairwise), then
   the output's rounding. Not instrumented by ASan (its shadow checks tripled the time of the emulated
   production-shape checks): it touches only vectors it sized itself from the checked shapes. */
__attribute__((no_sanitize("address"))) Values run_matmul(const Op& op, const Values& a, const Values& b) {
    const Tensor &ta = op.in[0], &tb = op.in[1];
    size_t r = op.out.dim.size();
    int64_t M = op.out.dim[r - 2], N = op.out.dim[r - 1], K = ta.dim[r - 1];
    std::vector<int64_t> batch(op.out.dim.begin(), op.out.dim.end() - 2);
    auto batch_offsets = [&](const Tensor& t) {
        std::vector<int64_t> dim(t.dim.begin(), t.dim.end() - 2), s = dense_strides(t.dim);
        s.resize(batch.size());
        return offsets(batch, dim, s);
    };
    std::vector<int64_t> oa = batch_offsets(ta), ob = batch_offsets(tb);
    Values c((size_t)elements(op.out));
    std::vector<double> bt((size_t)(K * N));
    for (size_t p = 0; p < oa.size(); p++) {
        const float* A = a.data() + oa[p];
        for (int64_t k = 0; k < K; k++)
            for (int64_t n = 0; n < N; n++) bt[(size_t)(n * K + k)] = b[(size_t)(ob[p] + k * N + n)];
        float* C = c.data() + p * (size_t)(M * N);
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double s[4] = {0.0, 0.0, 0.0, 0.0}; /* k mod 4 apart, then pairwise: a fixed order */
                const double* B = bt.data() + n * K;
                int64_t k = 0;
                for (; k + 4 <= K; k += 4)
                    for (int j = 0; j < 4; j++) s[j] += (double)A[m * K + k + j] * B[k + j];
                for (; k < K; k++) s[0] += (double)A[m * K + k] * B[k];
                C[m * N + n] = round_to(op.out.dtype, (s[0] + s[1]) + (s[2] + s[3]));
            }
    }
    return c;
}

Values run_reduction(const Op& op, const Values& x) {
    const Tensor& tx = op.in[0];
    /* each input element's output index: dimensions of 1 collapse, grouped ones divide */
    std::vector<int64_t> to = offsets(tx.dim, op.out.dim, dense_strides(op.out.dim));
    bool add = op.mode == CUDNN_REDUCE_TENSOR_ADD;
    std::vector<double> acc((size_t)elements(op.out), add ? 0.0 : op.mode == CUDNN_REDUCE_TENSOR_MIN ? INFINITY : op.mode == CUDNN_REDUCE_TENSOR_MAX ? -INFINITY : 0.0);
    for (size_t i = 0; i < x.size(); i++) {
        double v = op.mode == CUDNN_REDUCE_TENSOR_AMAX ? std::fabs(x[i]) : x[i];
        double& a = acc[(size_t)to[i]];
        if (add) a += v;
        else if (std::isnan(v) || std::isnan(a)) a = NAN;
        else a = op.mode == CUDNN_REDUCE_TENSOR_MIN ? std::fmin(a, v) : std::fmax(a, v);
    }
    Values y(acc.size());
    for (size_t i = 0; i < y.size(); i++) y[i] = round_to(op.out.dtype, acc[i]);
    return y;
}

/* Y is X's memory seen through Y's dimensions and strides (both as the descriptors give them). */
Values run_reshape(const Op& op, const Values& x) {
    const Tensor& tx = op.in[0];
    std::vector<int64_t> ox = offsets(tx.dim, tx.dim, tx.stride), oy = offsets(op.out.dim, op.out.dim, op.out.stride);
    int64_t size = 0;
    for (int64_t o : ox) size = std::max(size, o + 1);
    Values memory((size_t)size);
    std::vector<char> written((size_t)size, 0);
    for (size_t i = 0; i < ox.size(); i++) memory[(size_t)ox[i]] = x[i], written[(size_t)ox[i]] = 1;
    Values y(oy.size());
    for (size_t i = 0; i < oy.size(); i++) {
        if (oy[i] >= size || !written[(size_t)oy[i]])
            emu_fail("cudnnBackendExecute: reshape output %s reads memory its input %s does not describe", describe(op.out).c_str(),
                     describe(tx).c_str());
        y[i] = round_to(op.out.dtype, memory[(size_t)oy[i]]);
    }
    return y;
}

/* Runs the plan's graph on the stream: loads the real inputs, computes every operation, stores the real outputs. */
void run_graph(const Graph& g, const std::map<int64_t, char*>& ptrs, const std::map<int64_t, Values>& by_value) {
    std::map<int64_t, Values> values = by_value;
    std::map<int64_t, size_t> last_use;
    for (size_t i = 0; i < g.ops.size(); i++)
        for (const Tensor& t : g.ops[i].in) last_use[t.uid] = i;
    for (size_t i = 0; i < g.ops.size(); i++) {
        const Op& op = g.ops[i];
        std::vector<const Values*> in;
        for (const Tensor& t : op.in) {
            if (values.count(t.uid) == 0) values[t.uid] = load_tensor(t, ptrs.at(t.uid));
            in.push_back(&values[t.uid]);
        }
        Values y = op.kind == OP_MATMUL      ? run_matmul(op, *in[0], *in[1])
                   : op.kind == OP_POINTWISE ? run_pointwise(op, in)
                   : op.kind == OP_REDUCTION ? run_reduction(op, *in[0])
                                             : run_reshape(op, *in[0]);
        if (!op.out.is_virtual) store_tensor(op.out, ptrs.at(op.out.uid), y);
        values[op.out.uid] = std::move(y);
        for (const Tensor& t : op.in) /* what no later operation reads: freed (T x T intermediates) */
            if (last_use[t.uid] == i) values.erase(t.uid);
    }
}

cudnnStatus_t execute(cudnnHandle_t handle, Desc* plan, Desc* pack) {
    const char* api = "cudnnBackendExecute";
    bool ready = plan != nullptr && pack != nullptr && plan->type == CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR &&
                 pack->type == CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR && plan->finalized && pack->finalized;
    if (!ready) /* check:execute_finalized */
        return refuse(CUDNN_STATUS_BAD_PARAM, api, "needs a finalized EXECUTION_PLAN and a finalized VARIANT_PACK");
    const Graph& g = *plan->graph;
    auto ids = array<int64_t>(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
    auto data = array<char*>(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
    char* workspace = scalar<char*>(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, nullptr);
    std::map<int64_t, char*> ptrs;
    std::map<int64_t, Values> by_value;
    for (size_t i = 0; i < ids.size(); i++) {
        auto it = g.tensors.find(ids[i]);
        if (it == g.tensors.end() || it->second.is_virtual) /* check:pack_uid */
            return refuse(CUDNN_STATUS_BAD_PARAM, api, "variant pack UID %ld is %s", (long)ids[i],
                          it == g.tensors.end() ? "no tensor of the plan's graph" : "a virtual tensor (it has no memory)");
        if (!ptrs.emplace(ids[i], data[i]).second) /* check:pack_uid */
            return refuse(CUDNN_STATUS_BAD_PARAM, api, "variant pack UID %ld given twice", (long)ids[i]);
    }
    for (const auto& [uid, t] : g.tensors) {
        if (t.is_virtual) continue;
        auto it = ptrs.find(uid);
        if (it == ptrs.end() || it->second == nullptr) /* check:pack_pointer */
            return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, api, "tensor %s has no pointer in the variant pack", describe(t).c_str());
        if ((uintptr_t)it->second % (uintptr_t)t.align != 0) /* check:pack_alignment */
            return refuse(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, api, "tensor %s at %p is not aligned to its %ld-byte alignment",
                          describe(t).c_str(), (void*)it->second, (long)t.align);
        if (t.by_value) {
            by_value[uid] = Values{load(t.dtype, it->second)}; /* read at the call, as the library reads host scalars */
        } else if (!emu_is_device_ptr(it->second, (size_t)extent_bytes(t))) {
            emu_fail("%s: tensor %s at %p: its %ld bytes %s", api, describe(t).c_str(), (void*)it->second, (long)extent_bytes(t),
                     emu_is_device_ptr(it->second, 1) ? "run past the end of the device allocation they start in"
                                                      : "are not device memory");
        }
    }
    int64_t ws = plan->workspace;
    if (ws > 0 && (workspace == nullptr || !emu_is_device_ptr(workspace, (size_t)ws)))
        emu_fail("%s: the workspace at %p is not %ld bytes of device memory (EXECUTION_PLAN_WORKSPACE_SIZE)", api, (void*)workspace,
                 (long)ws);
    std::shared_ptr<const Graph> graph = plan->graph;
    emu_stream_enqueue(handle->stream, [graph, ptrs, by_value, workspace, ws]() {
        if (ws > 0) memset(workspace, 0xff, (size_t)ws); /* the engine's scratch: NaN bytes */
        run_graph(*graph, ptrs, by_value);
    });
    return CUDNN_STATUS_SUCCESS;
}

/* ---------------------------------------------------------------- attribute queries */

cudnnStatus_t put(int64_t* count, void* out, int64_t requested, const void* src, int64_t n, size_t bytes) {
    if (count != nullptr) *count = n;
    if (out != nullptr && requested > 0 && n > 0) memcpy(out, src, (size_t)std::min(requested, n) * bytes);
    return CUDNN_STATUS_SUCCESS;
}

/* A descriptor the caller created, filled as a copy of `src` (how cuDNN returns descriptor attributes). */
void fill(void* out, const Desc& src) {
    Desc* d = desc_of(*static_cast<cudnnBackendDescriptor_t*>(out));
    if (d == nullptr || d->type != src.type)
        emu_fail("cudnnBackendGetAttribute: the descriptor to fill is not a created %s descriptor", desc_name(src.type));
    *d = src;
}

cudnnStatus_t get(Desc* d, int attr, cudnnBackendAttributeType_t type, int64_t requested, int64_t* count, void* out) {
    const char* api = "cudnnBackendGetAttribute";
    const AttrSpec* spec = attr_spec(d->type, attr);
    if (spec == nullptr)
        emu_fail("%s: attribute %d (cudnn_graph.h) of a %s descriptor is not emulated", api, attr, desc_name(d->type));
    if (spec->type != type) /* check:attribute_type */
        return refuse(CUDNN_STATUS_BAD_PARAM, api, "%s is of type %d, asked as %d", spec->name, (int)spec->type, (int)type);
    if (!d->finalized) /* check:get_finalized */
        return refuse(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED, api, "%s of a descriptor (%s) not finalized", spec->name,
                      desc_name(d->type));
    switch (attr) {
        case CUDNN_ATTR_ENGINEHEUR_RESULTS: case CUDNN_ATTR_ENGINECFG_ENGINE: {
            /* one engine (index 0) for every graph; the heuristic's one result is its configuration, no knobs */
            Desc result{attr == CUDNN_ATTR_ENGINECFG_ENGINE ? CUDNN_BACKEND_ENGINE_DESCRIPTOR : CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                        true, {}, {}, {}, d->graph};
            if (count != nullptr) *count = 1;
            if (requested > 0) fill(out, result);
            return CUDNN_STATUS_SUCCESS;
        }
        case CUDNN_ATTR_ENGINE_GLOBAL_INDEX: { int64_t v = 0; return put(count, out, requested, &v, 1, 8); }
        case CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT: { int64_t v = 1; return put(count, out, requested, &v, 1, 8); }
        case CUDNN_ATTR_ENGINE_KNOB_INFO: case CUDNN_ATTR_ENGINECFG_KNOB_CHOICES: case CUDNN_ATTR_ENGINE_NUMERICAL_NOTE:
        case CUDNN_ATTR_ENGINE_BEHAVIOR_NOTE: return put(count, out, requested, nullptr, 0, 0);
        case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE: return put(count, out, requested, &d->workspace, 1, 8);
        case CUDNN_ATTR_ENGINECFG_WORKSPACE_SIZE: { int64_t v = engine_workspace(); return put(count, out, requested, &v, 1, 8); }
        case CUDNN_ATTR_ENGINECFG_SHARED_MEMORY_USED: { int32_t v = 0; return put(count, out, requested, &v, 1, 4); }
        default: emu_fail("%s: %s of a %s descriptor is not emulated", api, spec->name, desc_name(d->type));
    }
}

}  // namespace

/* ---------------------------------------------------------------- the API */

extern "C" {

size_t cudnnGetVersion(void) { return EMU_CUDNN_VERSION; }

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) {
    *handle = new cudnnContext{nullptr};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) {
    delete handle;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
    handle->stream = stream;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t* stream) {
    *stream = handle->stream;
    return CUDNN_STATUS_SUCCESS;
}

const char* cudnnGetErrorString(cudnnStatus_t status) {
    switch (status) {
        case CUDNN_STATUS_SUCCESS: return "CUDNN_STATUS_SUCCESS";
        case CUDNN_STATUS_BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
        case CUDNN_STATUS_BAD_PARAM_NULL_POINTER: return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
        case CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER: return "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER";
        case CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED: return "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED";
        case CUDNN_STATUS_NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
        default: return "CUDNN_STATUS (other)";
    }
}

void cudnnGetLastErrorString(char* message, size_t max_size) {
    if (max_size == 0) return;
    snprintf(message, max_size, "%s", g_last_error.c_str());
    g_last_error.clear();
}

cudnnStatus_t cudnnBackendCreateDescriptor(cudnnBackendDescriptorType_t type, cudnnBackendDescriptor_t* descriptor) {
    if (desc_name(type) == nullptr) emu_fail("cudnnBackendCreateDescriptor: descriptor type %d (cudnn_graph.h) is not emulated", (int)type);
    Desc* d = new Desc;
    d->type = type;
    *descriptor = d;
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendDestroyDescriptor(cudnnBackendDescriptor_t descriptor) {
    delete desc_of(descriptor);
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendSetAttribute(cudnnBackendDescriptor_t descriptor, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t count, const void* elements) {
    const char* api = "cudnnBackendSetAttribute";
    Desc* d = desc_of(descriptor);
    const AttrSpec* spec = attr_spec(d->type, name);
    if (spec == nullptr) emu_fail("%s: attribute %d (cudnn_graph.h) of a %s descriptor is not emulated", api, (int)name, desc_name(d->type));
    if (d->finalized) /* check:set_finalized */
        return refuse(CUDNN_STATUS_BAD_PARAM, api, "%s set on a finalized descriptor (%s)", spec->name, desc_name(d->type));
    if (type != spec->type) /* check:attribute_type */
        return refuse(CUDNN_STATUS_BAD_PARAM, api, "%s is of type %d, set as %d", spec->name, (int)spec->type, (int)type);
    if (count < 0 || (count > 0 && elements == nullptr)) /* check:attribute_type */
        return refuse(CUDNN_STATUS_BAD_PARAM, api, "%s: %ld elements at %p", spec->name, (long)count, elements);
    size_t bytes = (size_t)count * attr_type_bytes(type);
    d->attrs[name] = Attr{type, count, std::vector<char>((const char*)elements, (const char*)elements + bytes)};
    return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnBackendGetAttribute(cudnnBackendDescriptor_t const descriptor, cudnnBackendAttributeName_t name,
                                       cudnnBackendAttributeType_t type, int64_t requested, int64_t* count, void* elements) {
    return get(desc_of(descriptor), name, type, requested, count, elements);
}

cudnnStatus_t cudnnBackendFinalize(cudnnBackendDescriptor_t descriptor) {
    Desc* d = desc_of(descriptor);
    if (d->finalized) return CUDNN_STATUS_SUCCESS;
    cudnnStatus_t s = finalize(d);
    d->finalized = s == CUDNN_STATUS_SUCCESS;
    return s;
}

cudnnStatus_t cudnnBackendExecute(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, cudnnBackendDescriptor_t pack) {
    return execute(handle, desc_of(plan), desc_of(pack));
}

/* ---------------------------------------------------------------- what else the frontend links

   The CUDA runtime, NVRTC and legacy cuDNN calls the frontend references beside the backend API. The ones
   its execute path makes answer as a runtime with no stream capture and no driver entry points would; the
   others belong to features llm8 does not use (runtime-compiled kernels, CUDA graphs, filter reordering)
   and stop the run naming them. */

cudaError_t cudaGetDriverEntryPointByVersion(const char*, void** fn, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
    *fn = nullptr;
    if (status != nullptr) *status = cudaDriverEntryPointSymbolNotFound;
    return cudaErrorSymbolNotFound;
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t, cudaStreamCaptureStatus* status, unsigned long long* id, cudaGraph_t* graph,
                                     const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges, size_t* n) {
    *status = cudaStreamCaptureStatusNone;
    if (id != nullptr) *id = 0;
    if (graph != nullptr) *graph = nullptr;
    if (deps != nullptr) *deps = nullptr;
    if (edges != nullptr) *edges = nullptr;
    if (n != nullptr) *n = 0;
    return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode*) { return cudaSuccess; }

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* a, const void* p) {
    memset(a, 0, sizeof(*a));
    a->type = emu_is_device_ptr(p, 1) ? cudaMemoryTypeDevice : cudaMemoryTypeUnregistered;
    a->devicePointer = a->type == cudaMemoryTypeDevice ? const_cast<void*>(p) : nullptr;
    return cudaSuccess;
}

#define EMU_NOT_PROVIDED(name) emu_fail("the cuDNN frontend called %s, which the emulated GPU does not provide", name)
cudaError_t cudaLaunchKernel(const void*, dim3, dim3, void**, size_t, cudaStream_t) { EMU_NOT_PROVIDED("cudaLaunchKernel"); }
cudaError_t cudaLibraryLoadData(cudaLibrary_t*, const void*, cudaJitOption*, void**, unsigned int, cudaLibraryOption*, void**,
                                unsigned int) { EMU_NOT_PROVIDED("cudaLibraryLoadData"); }
cudaError_t cudaLibraryGetKernel(cudaKernel_t*, cudaLibrary_t, const char*) { EMU_NOT_PROVIDED("cudaLibraryGetKernel"); }
cudaError_t cudaLibraryUnload(cudaLibrary_t) { EMU_NOT_PROVIDED("cudaLibraryUnload"); }
cudaError_t cudaKernelSetAttributeForDevice(cudaKernel_t, cudaFuncAttribute, int, int) { EMU_NOT_PROVIDED("cudaKernelSetAttributeForDevice"); }
cudaError_t cudaUserObjectCreate(cudaUserObject_t*, void*, cudaHostFn_t, unsigned int, unsigned int) { EMU_NOT_PROVIDED("cudaUserObjectCreate"); }
cudaError_t cudaUserObjectRelease(cudaUserObject_t, unsigned int) { EMU_NOT_PROVIDED("cudaUserObjectRelease"); }
cudaError_t cudaGraphRetainUserObject(cudaGraph_t, cudaUserObject_t, unsigned int, unsigned int) { EMU_NOT_PROVIDED("cudaGraphRetainUserObject"); }
nvrtcResult nvrtcCreateProgram(nvrtcProgram*, const char*, const char*, int, const char* const*, const char* const*) { EMU_NOT_PROVIDED("nvrtcCreateProgram"); }
nvrtcResult nvrtcCompileProgram(nvrtcProgram, int, const char* const*) { EMU_NOT_PROVIDED("nvrtcCompileProgram"); }
nvrtcResult nvrtcDestroyProgram(nvrtcProgram*) { EMU_NOT_PROVIDED("nvrtcDestroyProgram"); }
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram, size_t*) { EMU_NOT_PROVIDED("nvrtcGetCUBINSize"); }
nvrtcResult nvrtcGetCUBIN(nvrtcProgram, char*) { EMU_NOT_PROVIDED("nvrtcGetCUBIN"); }
nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram, size_t*) { EMU_NOT_PROVIDED("nvrtcGetProgramLogSize"); }
nvrtcResult nvrtcGetProgramLog(nvrtcProgram, char*) { EMU_NOT_PROVIDED("nvrtcGetProgramLog"); }
/* the legacy filter API of the frontend's reorder helper, referenced when it is built without optimization */
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t*) { EMU_NOT_PROVIDED("cudnnCreateFilterDescriptor"); }
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t) { EMU_NOT_PROVIDED("cudnnDestroyFilterDescriptor"); }
cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t, cudnnDataType_t, cudnnTensorFormat_t, int, const int[]) {
    EMU_NOT_PROVIDED("cudnnSetFilterNdDescriptor");
}
cudnnStatus_t cudnnReorderFilterAndBias(cudnnHandle_t, const cudnnFilterDescriptor_t, cudnnReorderType_t, const void*, void*, int,
                                        const void*, void*) { EMU_NOT_PROVIDED("cudnnReorderFilterAndBias"); }
#undef EMU_NOT_PROVIDED

}  // extern "C"
