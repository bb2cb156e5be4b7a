/*
 * Drives the cuDNN double's backend API (emu/cudnn.cpp) directly, without the frontend, for the refusal
 * tests of dev/test/test_emu_libs.py: one small graph Y = op(X, B) built descriptor by descriptor, with the
 * mistake to plant given as key=value arguments:
 *   op=add|matmul|reduce|reshape|gen_index   the operation (gen_index: axis=N)
 *   x=D,D,D,D xs=S,S,S,S  b=...  y=...       dimensions (and strides; default: packed) of X, B, Y
 *   align=N  skip=NAME  xvirt=1  bvalue=1  bvirt=1  yvalue=1  buid=N  ytype=bf16
 *   ops=0|2  cycle=1  engine=N  noconfig=1  pairs=N  unfinalized=1  packuid=N  nopacky=1  xoffset=BYTES
 *   attrtype=1  setafter=1  getbefore=1  host=1  short=1  workspace=BYTES  unknown=descriptor|attribute
 * Each step prints "<step> <status>"; the first one refused ends the run (exit 0). After execute, "y ok"
 * or "y wrong" compares Y with op(X, B) computed here.
 */
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

static std::map<std::string, std::string> g_args;

static std::string arg(const char* key, const char* fallback) {
    auto it = g_args.find(key);
    return it == g_args.end() ? fallback : it->second;
}
static long num(const char* key, long fallback) { return atol(arg(key, std::to_string(fallback).c_str()).c_str()); }

static std::vector<int64_t> list(const char* key, const char* fallback) {
    std::vector<int64_t> v;
    std::string s = arg(key, fallback);
    for (size_t at = 0; at < s.size();) {
        v.push_back(atoll(s.c_str() + at));
        size_t comma = s.find(',', at);
        at = comma == std::string::npos ? s.size() : comma + 1;
    }
    return v;
}

static std::vector<int64_t> packed(const std::vector<int64_t>& dim) {
    std::vector<int64_t> s(dim.size(), 1);
    for (size_t d = dim.size(); d-- > 1;) s[d - 1] = s[d] * dim[d];
    return s;
}

/* Prints the step's status; a refusal ends the run. */
static void step(const char* name, cudnnStatus_t s) {
    printf("%s %s\n", name, cudnnGetErrorString(s));
    if (s != CUDNN_STATUS_SUCCESS) exit(0);
}

static cudnnBackendDescriptor_t create(cudnnBackendDescriptorType_t t) {
    cudnnBackendDescriptor_t d;
    step("create", cudnnBackendCreateDescriptor(t, &d));
    return d;
}

static void set(const char* name, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t,
                int64_t n, const void* v) {
    step(name, cudnnBackendSetAttribute(d, a, t, n, v));
}

static void set_desc(const char* name, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendDescriptor_t v) {
    set(name, d, a, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
}

struct Tensor {
    int64_t uid;
    std::vector<int64_t> dim, stride;
    cudnnDataType_t type;
    bool is_virtual, by_value;
    cudnnBackendDescriptor_t desc;
};

static Tensor tensor(const char* step_name, const char* key, int64_t uid, const char* dims) {
    Tensor t{uid, list(key, dims), {}, CUDNN_DATA_FLOAT, false, false, nullptr};
    t.stride = g_args.count(std::string(key) + "s") ? list((std::string(key) + "s").c_str(), "") : packed(t.dim);
    t.desc = create(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t align = num("align", 16);
    bool skip_align = arg("skip", "") == "TENSOR_BYTE_ALIGNMENT";
    if (arg("attrtype", "0") == "1" && uid == 1) {
        int32_t small = (int32_t)uid; /* the UID as INT32: the API reference says INT64 */
        set("set_uid_int32", t.desc, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT32, 1, &small);
    }
    set(step_name, t.desc, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(step_name, t.desc, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &t.type);
    set(step_name, t.desc, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, (int64_t)t.dim.size(), t.dim.data());
    set(step_name, t.desc, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, (int64_t)t.stride.size(), t.stride.data());
    if (!skip_align || uid != 1) set(step_name, t.desc, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    return t;
}

static void finish_tensor(const char* step_name, Tensor& t, bool is_virtual, bool by_value) {
    t.is_virtual = is_virtual;
    t.by_value = by_value;
    if (is_virtual) set(step_name, t.desc, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) set(step_name, t.desc, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    step(step_name, cudnnBackendFinalize(t.desc));
}

/* One operation of `kind` reading x (and b) into y. */
static cudnnBackendDescriptor_t operation(const std::string& kind, const Tensor& x, const Tensor* b, const Tensor& y) {
    bool skip_x = arg("skip", "") == "XDESC";
    cudnnBackendDescriptor_t op;
    if (kind == "matmul") {
        cudnnBackendDescriptor_t mm = create(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
        cudnnDataType_t f = CUDNN_DATA_FLOAT;
        set("matmul", mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
        step("matmul", cudnnBackendFinalize(mm));
        op = create(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
        if (!skip_x) set_desc("op", op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, x.desc);
        set_desc("op", op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b->desc);
        set_desc("op", op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, y.desc);
        set_desc("op", op, CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    } else if (kind == "reduce") {
        cudnnBackendDescriptor_t red = create(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
        cudnnReduceTensorOp_t add = CUDNN_REDUCE_TENSOR_ADD;
        cudnnDataType_t f = CUDNN_DATA_FLOAT;
        set("reduction", red, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &add);
        set("reduction", red, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
        step("reduction", cudnnBackendFinalize(red));
        op = create(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
        if (!skip_x) set_desc("op", op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x.desc);
        set_desc("op", op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y.desc);
        set_desc("op", op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, red);
    } else if (kind == "reshape") {
        op = create(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
        if (!skip_x) set_desc("op", op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x.desc);
        set_desc("op", op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y.desc);
    } else {
        cudnnBackendDescriptor_t pw = create(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
        cudnnPointwiseMode_t mode = kind == "gen_index" ? CUDNN_POINTWISE_GEN_INDEX : CUDNN_POINTWISE_ADD;
        cudnnDataType_t f = CUDNN_DATA_FLOAT;
        int64_t axis = num("axis", 3);
        set("pointwise", pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
        set("pointwise", pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &f);
        if (kind == "gen_index") set("pointwise", pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
        step("pointwise", cudnnBackendFinalize(pw));
        op = create(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
        set_desc("op", op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
        if (!skip_x) set_desc("op", op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x.desc);
        if (kind != "gen_index") set_desc("op", op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b->desc);
        set_desc("op", op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y.desc);
    }
    step("op", cudnnBackendFinalize(op));
    return op;
}

static float* device_values(const Tensor& t, size_t offset, float base) {
    size_t n = 1;
    for (size_t d = 0; d < t.dim.size(); d++) n += (size_t)(t.dim[d] - 1) * (size_t)t.stride[d];
    std::vector<float> host(n);
    for (size_t i = 0; i < n; i++) host[i] = base + 0.25f * (float)i;
    char* p;
    cudaMalloc((void**)&p, n * sizeof(float) + offset - (num("short", 0) ? 1 : 0));
    if (arg("host", "0") == "1") p = (char*)malloc(n * sizeof(float) + offset);
    cudaMemcpy(p + offset, host.data(), n * sizeof(float) - (num("short", 0) ? 4 : 0), cudaMemcpyHostToDevice);
    return (float*)(p + offset);
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IONBF, 0);
    for (int i = 1; i < argc; i++) {
        const char* eq = strchr(argv[i], '=');
        if (!eq) { fprintf(stderr, "lib_cudnn: argument %s is not key=value\n", argv[i]); return 2; }
        g_args[std::string(argv[i], eq - argv[i])] = eq + 1;
    }
    std::string kind = arg("op", "add");
    const char *xd = "1,2,4,8", *bd = kind == "matmul" ? "1,2,8,3" : "1,2,1,8",
               *yd = kind == "matmul" ? "1,2,4,3" : kind == "reduce" ? "1,2,4,1" : kind == "reshape" ? "1,2,8,4" : xd;
    if (kind == "reshape" && !g_args.count("ys")) g_args["ys"] = "64,32,1,8"; /* X's memory read transposed */
    cudnnHandle_t handle;
    step("handle", cudnnCreate(&handle));
    if (arg("unknown", "") == "descriptor") create(CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR);
    if (arg("unknown", "") == "attribute") {
        int64_t one = 1;
        set("vector_count", create(CUDNN_BACKEND_TENSOR_DESCRIPTOR), CUDNN_ATTR_TENSOR_VECTOR_COUNT, CUDNN_TYPE_INT64, 1, &one);
    }

    Tensor x = tensor("tensor_x", "x", 1, xd);
    finish_tensor("tensor_x", x, arg("xvirt", "0") == "1", false);
    Tensor b = tensor("tensor_b", "b", num("buid", 2), bd);
    finish_tensor("tensor_b", b, arg("bvirt", "0") == "1", arg("bvalue", "0") == "1");
    Tensor y = tensor("tensor_y", "y", 3, yd);
    finish_tensor("tensor_y", y, false, arg("yvalue", "0") == "1");
    std::vector<cudnnBackendDescriptor_t> ops = {operation(kind, x, &b, y)};
    if (arg("ops", "1") == "2") ops.push_back(operation(kind, x, &b, y)); /* a second writer of Y */
    if (arg("cycle", "0") == "1") {
        /* Z = Y + B with Y = Z + B: each virtual, each written, neither first */
        Tensor z = tensor("tensor_z", "y", 4, yd), v = tensor("tensor_v", "y", 5, yd);
        finish_tensor("tensor_z", z, true, false);
        finish_tensor("tensor_v", v, true, false);
        ops = {operation(kind, z, &b, v), operation(kind, v, &b, z)};
    }
    if (arg("ops", "1") == "0") ops.clear();

    cudnnBackendDescriptor_t graph = create(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set("graph", graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    if (!ops.empty()) set("graph", graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)ops.size(), ops.data());
    step("graph", cudnnBackendFinalize(graph));

    cudnnBackendDescriptor_t heur = create(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    set_desc("heur", heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    set("heur", heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    int64_t count = 0;
    if (arg("getbefore", "0") == "1") step("get", cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));
    step("heur", cudnnBackendFinalize(heur));
    if (arg("setafter", "0") == "1") set("set", heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    step("get", cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr));

    cudnnBackendDescriptor_t engine = create(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
    int64_t index = num("engine", 0);
    set_desc("engine", engine, CUDNN_ATTR_ENGINE_OPERATION_GRAPH, graph);
    set("engine", engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &index);
    step("engine", cudnnBackendFinalize(engine));
    cudnnBackendDescriptor_t cfg = create(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    set_desc("cfg", cfg, CUDNN_ATTR_ENGINECFG_ENGINE, engine);
    step("cfg", cudnnBackendFinalize(cfg));
    cudnnBackendDescriptor_t plan = create(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
    if (arg("noconfig", "0") != "1") set_desc("plan", plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, cfg);
    step("plan", cudnnBackendFinalize(plan));
    int64_t workspace_size = -1;
    step("workspace", cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &count, &workspace_size));
    printf("workspace size %ld\n", (long)workspace_size);

    float* px = device_values(x, (size_t)num("xoffset", 0), 1.0f);
    float* pb = device_values(b, 0, -3.0f);
    float* py = device_values(y, 0, NAN);
    float value = -3.0f; /* B passed by value: its one element, in host memory */
    std::vector<int64_t> uids = {x.uid, y.uid};
    std::vector<void*> ptrs = {px, py};
    if (kind == "add" || kind == "matmul") uids.push_back(b.uid), ptrs.push_back(b.by_value ? (void*)&value : (void*)pb);
    if (arg("nopacky", "0") == "1") uids.erase(uids.begin() + 1), ptrs.erase(ptrs.begin() + 1);
    if (g_args.count("packuid")) uids.push_back(num("packuid", 0)), ptrs.push_back(px);
    void* workspace = nullptr;
    if (num("workspace", 0) > 0) cudaMalloc(&workspace, (size_t)num("workspace", 0));
    cudnnBackendDescriptor_t pack = create(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set("pack", pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data());
    set("pack", pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, num("pairs", (long)ptrs.size()), ptrs.data());
    set("pack", pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    if (arg("unfinalized", "0") != "1") step("pack", cudnnBackendFinalize(pack));
    step("execute", cudnnBackendExecute(handle, plan, pack));

    size_t ny = 1;
    for (int64_t d : y.dim) ny *= (size_t)d;
    std::vector<float> got(ny);
    cudaMemcpy(got.data(), py, ny * sizeof(float), cudaMemcpyDeviceToHost);
    bool ok = true;
    for (size_t i = 0; i < ny && kind == "add"; i++) { /* X (1,2,4,8) + B (1,2,1,8), both packed from 0.25 i */
        size_t h = i / 32, c = i % 8;
        ok = ok && got[i] == (1.0f + 0.25f * (float)i) + (b.by_value ? value : -3.0f + 0.25f * (float)(h * 8 + c));
    }
    printf("y %s\n", ok ? "ok" : "wrong");
    return 0;
}
