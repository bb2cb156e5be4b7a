/*
 * The Llama-2 model as both builds run it: the buffers (one allocation each for parameters, gradients,
 * optimizer state, activations and FP8 copies, laid out by tables and printed in MiB), the linear layers
 * with their FP8 recipe, the forward and backward passes as straight sequences of named ops, and the
 * AdamW update. This header is compiled twice: by gcc into train_llama_cpu, after cpu/backend.h, and by
 * nvcc into train_llama, after cuda/backend.cuh. The backend defines `act_t` (float on the CPU,
 * __nv_bfloat16 on the GPU) and the functions of the contract llama/backend.h, which is all this file
 * calls; pointers below are device pointers on the GPU.
 *
 * Model (HF LlamaForCausalLM): x = embed(tokens); per layer
 *   h = x + wo(attn(rope(wqkv(rmsnorm(x)))));  x = h + w2(silu(w1 rmsnorm(h)) * w3 rmsnorm(h));
 * logits = output(rmsnorm(x)). FP8 recipe (DESIGN.md section 3): the four linear layers of each block
 * (wqkv, wo, w13, w2) run FP8 GEMMs in -p fp8, the embedding, attention and output layer stay in the
 * activation type; N = B*T tokens; C, QKV = C + 2*KVC, F as in config.h.
 */
#pragma once

#include <math.h>

#include "backend.h"
#include "config.h"
#include "optim.h"
#include "params.h"
#include "../fp8/fp8.h"
#include "../fp8/gemm.h"

typedef PARAM_TENSORS_STRUCT(act_t) ParamTensors;
typedef PARAM_TENSORS_STRUCT(float) GradTensors;

/*
 * The linear layers: four per block (wqkv, wo, w13, w2: the FP8 GEMMs of -p fp8, slot = layer *
 * LIN_PER_LAYER + which) and the output layer, which stays in the activation type (DESIGN.md section 3).
 */
typedef enum { LIN_QKV, LIN_WO, LIN_W13, LIN_W2, LIN_OUTPUT } LinearId;
#define LIN_PER_LAYER 4
static const char* const LINEAR_NAMES[] = {"wqkv", "wo", "w13", "w2", "output"};
/* The `layer` argument of the output layer, which belongs to no block. */
#define NO_LAYER (-1)
/* The three FP8 operands of a linear layer: weight (E4M3), input X (E4M3), output gradient dY (E5M2). */
enum { FP8_OP_W, FP8_OP_X, FP8_OP_DY, FP8_OPS };
static const char* const FP8_OPERAND_NAMES[FP8_OPS] = {"W", "X", "dY"};

/* FP8 buffers of one linear layer (device pointers), for Y (N, OC) = X (N, C) W^T with W (OC, C). */
typedef struct {
    uint8_t* w;   /* (OC, C) E4M3 copy of W, made once per optimizer step: fprop's A operand */
    uint8_t* wt;  /* (C, OC) E4M3 copy of W^T from the same cast: dgrad's A operand */
    uint8_t* xt;  /* (C, N) E4M3 copy of X^T saved by fprop: wgrad's A operand */
} Fp8Linear;

typedef struct {
    act_t* resid;      /* (L+1, N, C) residual stream: resid[l] enters layer l, resid[L] enters the final norm */
    act_t* resid_mid;  /* (L, N, C) residual after the attention half of each layer */
    float* rstd_attn;  /* (L, N) 1 / rms of resid[l] */
    float* rstd_ffn;   /* (L, N) 1 / rms of resid_mid[l] */
    float* rstd_final; /* (N) */
    act_t* ln_attn;    /* (L, N, C), or (N, C) scratch when backward does not need it (FP8 keeps xt; -r 1 recomputes) */
    act_t* qkv;        /* (L, N, QKV) q, k after RoPE, v */
    act_t* att;        /* (L, N, C) attention output, before wo */
    float* att_stats;  /* (L, att_stats_size(B, NH, T)) what attention backward needs, backend-specific */
    act_t* ln_ffn;     /* (L, N, C) or (N, C) scratch, as ln_attn */
    act_t* fc;         /* (L, N, 2F) [w1 x, w3 x] */
    act_t* swiglu;     /* (L, N, F) or (N, F) scratch, as ln_attn */
    act_t* branch;     /* (N, C) scratch: output of wo or w2 before the residual add */
    act_t* ln_final;   /* (N, C) */
    act_t* logits;     /* (N, V), replaced by d(loss)/d(logits) when targets are given */
    float* losses;     /* (N) per-token cross-entropy */
    act_t* d_resid;    /* (N, C) gradient of the residual stream */
    act_t* d_ln;       /* (N, C) gradient of a norm's output */
    act_t* d_att;      /* (N, C) */
    act_t* d_qkv;      /* (N, QKV) */
    act_t* d_fc;       /* (N, 2F) */
    act_t* d_swiglu;   /* (N, F) */
    uint8_t* x8;       /* (N, max(C, F)) E4M3 X of the running fprop: its B operand (fp8 only) */
    uint8_t* xt8;      /* (L, N * (3 C + F)) E4M3 X^T of the four linear layers, saved for wgrad (fp8 only) */
    uint8_t* dy8;      /* (N, max(QKV, 2F, C)) E5M2 dY: dgrad's B operand (fp8 only) */
    uint8_t* dyt8;     /* (max(QKV, 2F, C), N) E5M2 dY^T: wgrad's B operand (fp8 only) */
} Acts;

typedef struct {
    LlamaConfig cfg;
    Precision precision;
    int pow2_scales;           /* round FP8 scales down to powers of two */
    int recompute;             /* -r 1: norm and SwiGLU outputs are recomputed in backward */
    int B, T;                  /* the largest micro-batch the buffers hold */
    size_t num_params;
    size_t param_sizes[NUM_PARAM_TENSORS];
    void* state_memory;        /* one allocation: master, working weights, grads, adam_m, adam_v */
    float* master;             /* (P) FP32 master weights */
    act_t* params_memory;      /* (P) working weights (BF16 on the GPU) */
    ParamTensors params;
    float* grads_memory;       /* (P) FP32 gradients, accumulated over micro-steps */
    GradTensors grads;
    float* adam_m;             /* (P) AdamW first moment */
    float* adam_v;             /* (P) AdamW second moment */
    void* acts_memory;
    Acts acts;
    size_t acts_bytes;
    uint8_t* fp8_weights;      /* E4M3 W and W^T of every linear layer (fp8 only) */
    Fp8Linear* fp8_linear;     /* (L * LIN_PER_LAYER) host array of device pointers */
    Fp8Scale* fp8_scales;      /* (L * LIN_PER_LAYER * FP8_OPS) device */
    Fp8Counts* fp8_counts;     /* (L * LIN_PER_LAYER * FP8_OPS) device */
    int fp8_weights_valid;     /* the FP8 weight copies match the working weights */
    int fp8_stats_due;         /* this step's casts gather Fp8Counts */
    float* rope_cos;           /* (T, HS/2) */
    float* rope_sin;           /* (T, HS/2) */
    int* inputs;               /* (B, T) device copy of the micro-batch's tokens */
    int* targets;              /* (B, T) */
    const int* inputs_host;    /* the host tokens of the last forward */
    float* losses_host;        /* (B*T) */
    int last_B, last_T;        /* shape of the last forward */
} Llama;

/* Activation buffers (the fields of Acts): the size of the table llama_acts_table fills. */
#define NUM_ACT_BUFFERS (sizeof(Acts) / sizeof(void*))

/* One named buffer of a layout table. */
typedef struct {
    const char* name;
    void** ptr;
    size_t count;
    size_t elem;
} BufferSpec;

#define BUFFER_ALIGN 256

static inline size_t buffers_bytes(const BufferSpec* specs, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += ceil_div(specs[i].count * specs[i].elem, BUFFER_ALIGN) * BUFFER_ALIGN;
    return total;
}

/* Points every buffer of the table into `base` (one allocation of buffers_bytes), in table order. */
static inline void buffers_point(const BufferSpec* specs, int n, void* base) {
    char* p = (char*)base;
    for (int i = 0; i < n; i++) {
        *specs[i].ptr = specs[i].count > 0 ? (void*)p : NULL;
        p += ceil_div(specs[i].count * specs[i].elem, BUFFER_ALIGN) * BUFFER_ALIGN;
    }
}

static inline void buffers_print(const char* title, const BufferSpec* specs, int n) {
    printf("| %s: %.1f MiB\n", title, mib(buffers_bytes(specs, n)));
    for (int i = 0; i < n; i++) {
        if (specs[i].count > 0) printf("|   %-12s %10.2f MiB\n", specs[i].name, mib(specs[i].count * specs[i].elem));
    }
}

static inline size_t llama_slot(int layer, int lin) { return (size_t)layer * LIN_PER_LAYER + lin; }
static inline Fp8Scale* fp8_scale(Llama* m, size_t slot, int op) { return &m->fp8_scales[slot * FP8_OPS + op]; }
static inline Fp8Counts* fp8_counts(Llama* m, size_t slot, int op) {
    return m->fp8_stats_due ? &m->fp8_counts[slot * FP8_OPS + op] : NULL;
}

/* Does backward read the BF16 inputs of the linear layers (ln_attn, ln_ffn, swiglu) from memory? */
static inline int llama_keeps_linear_inputs(const Llama* m) { return m->precision != PRECISION_FP8 && !m->recompute; }

/* Activation buffers for micro-batch (B, T). */
static inline int llama_acts_table(Llama* m, BufferSpec* s) {
    const LlamaConfig* c = &m->cfg;
    size_t N = (size_t)m->B * m->T, C = (size_t)c->dim, L = (size_t)c->n_layers, F = (size_t)c->ffn_dim;
    size_t QKV = (size_t)llama_qkv_dim(c), V = (size_t)c->vocab_size;
    size_t keep = llama_keeps_linear_inputs(m) ? L : 1;
    int fp8 = m->precision == PRECISION_FP8;
    size_t dmax = QKV > 2 * F ? QKV : 2 * F;
    size_t a = sizeof(act_t), f = sizeof(float);
    Acts* x = &m->acts;
    int n = 0;
#define SPEC(field, count, elem) s[n++] = (BufferSpec){#field, (void**)&x->field, (count), (elem)}
    SPEC(resid, (L + 1) * N * C, a);
    SPEC(resid_mid, L * N * C, a);
    SPEC(rstd_attn, L * N, f);
    SPEC(rstd_ffn, L * N, f);
    SPEC(rstd_final, N, f);
    SPEC(ln_attn, keep * N * C, a);
    SPEC(qkv, L * N * QKV, a);
    SPEC(att, L * N * C, a);
    SPEC(att_stats, L * att_stats_size((size_t)m->B, c->n_heads, m->T), f);
    SPEC(ln_ffn, keep * N * C, a);
    SPEC(fc, L * N * 2 * F, a);
    SPEC(swiglu, keep * N * F, a);
    SPEC(branch, N * C, a);
    SPEC(ln_final, N * C, a);
    SPEC(logits, N * V, a);
    SPEC(losses, N, f);
    SPEC(d_resid, N * C, a);
    SPEC(d_ln, N * C, a);
    SPEC(d_att, N * C, a);
    SPEC(d_qkv, N * QKV, a);
    SPEC(d_fc, N * 2 * F, a);
    SPEC(d_swiglu, N * F, a);
    SPEC(x8, fp8 ? N * (C > F ? C : F) : 0, 1);
    SPEC(xt8, fp8 ? L * N * (3 * C + F) : 0, 1);
    SPEC(dy8, fp8 ? N * (dmax > C ? dmax : C) : 0, 1);
    SPEC(dyt8, fp8 ? N * (dmax > C ? dmax : C) : 0, 1);
#undef SPEC
    if ((size_t)n != NUM_ACT_BUFFERS) die("activation table has %d buffers, Acts has %zu fields", n, NUM_ACT_BUFFERS);
    return n;
}

/* Output width OC and input width C of linear layer `lin`. */
static inline void llama_linear_dims(const LlamaConfig* c, LinearId lin, size_t* out_dim, size_t* in_dim) {
    size_t C = (size_t)c->dim, F = (size_t)c->ffn_dim;
    size_t outs[] = {(size_t)llama_qkv_dim(c), C, 2 * F, C, (size_t)c->vocab_size};
    size_t ins[] = {C, C, C, F, C};
    *out_dim = outs[lin];
    *in_dim = ins[lin];
}

/*
 * Allocates every buffer of a model for micro-batches up to (B, T) and prints the memory table. The
 * weights are undefined until llama_set_params.
 */
static inline void llama_build(Llama* m, const LlamaConfig* cfg, Precision precision, int B, int T, int pow2_scales,
                               int recompute) {
    memset(m, 0, sizeof(*m));
    m->cfg = *cfg;
    m->precision = precision;
    m->pow2_scales = pow2_scales;
    m->recompute = recompute;
    m->B = B;
    m->T = T;
    param_sizes(cfg, m->param_sizes);
    m->num_params = param_count(cfg);
    size_t P = m->num_params, L = (size_t)cfg->n_layers;
    printf("| parameters: %zu (%.2f M)\n", P, P / 1e6);

    BufferSpec state[] = {
        {"master", (void**)&m->master, P, sizeof(float)},
        {"weights", (void**)&m->params_memory, P, sizeof(act_t)},
        {"grads", (void**)&m->grads_memory, P, sizeof(float)},
        {"adam_m", (void**)&m->adam_m, P, sizeof(float)},
        {"adam_v", (void**)&m->adam_v, P, sizeof(float)},
    };
    int nstate = (int)(sizeof(state) / sizeof(state[0]));
    buffers_print("weights and optimizer state", state, nstate); /* first, so an out-of-memory stop follows its sizes */
    m->state_memory = dev_alloc(buffers_bytes(state, nstate));
    buffers_point(state, nstate, m->state_memory);
    param_pointers(cfg, &m->params, m->params_memory, sizeof(act_t));
    param_pointers(cfg, &m->grads, m->grads_memory, sizeof(float));
    dev_zero(m->adam_m, P * sizeof(float));
    dev_zero(m->adam_v, P * sizeof(float));
    dev_zero(m->grads_memory, P * sizeof(float));

    BufferSpec acts[NUM_ACT_BUFFERS];
    int nacts = llama_acts_table(m, acts);
    m->acts_bytes = buffers_bytes(acts, nacts);
    buffers_print("activations", acts, nacts);
    m->acts_memory = dev_alloc(m->acts_bytes);
    buffers_point(acts, nacts, m->acts_memory);

    size_t nslots = L * LIN_PER_LAYER;
    m->fp8_linear = (Fp8Linear*)callocCheck(nslots, sizeof(Fp8Linear));
    m->fp8_scales = (Fp8Scale*)dev_alloc(nslots * FP8_OPS * sizeof(Fp8Scale));
    m->fp8_counts = (Fp8Counts*)dev_alloc(nslots * FP8_OPS * sizeof(Fp8Counts));
    dev_zero(m->fp8_scales, nslots * FP8_OPS * sizeof(Fp8Scale));
    dev_zero(m->fp8_counts, nslots * FP8_OPS * sizeof(Fp8Counts));
    if (precision == PRECISION_FP8) {
        size_t per_layer = 0;
        for (int lin = 0; lin < LIN_PER_LAYER; lin++) {
            size_t OC, C;
            llama_linear_dims(cfg, (LinearId)lin, &OC, &C);
            per_layer += 2 * OC * C;
        }
        printf("| FP8 weight copies (W and W^T): %.1f MiB\n", mib(L * per_layer));
        m->fp8_weights = (uint8_t*)dev_alloc(L * per_layer);
        uint8_t* w = m->fp8_weights;
        size_t N = (size_t)B * T;
        uint8_t* xt = m->acts.xt8;
        for (size_t l = 0; l < L; l++) {
            for (int lin = 0; lin < LIN_PER_LAYER; lin++) {
                Fp8Linear* f = &m->fp8_linear[llama_slot((int)l, lin)];
                size_t OC, C;
                llama_linear_dims(cfg, (LinearId)lin, &OC, &C);
                f->w = w;
                f->wt = w + OC * C;
                w += 2 * OC * C;
                f->xt = xt;
                xt += C * N;
            }
        }
    }

    size_t half = (size_t)llama_head_dim(cfg) / 2;
    float* cos_host = (float*)mallocCheck((size_t)T * half * sizeof(float));
    float* sin_host = (float*)mallocCheck((size_t)T * half * sizeof(float));
    rope_tables(T, llama_head_dim(cfg), cfg->rope_theta, cos_host, sin_host);
    m->rope_cos = (float*)dev_alloc((size_t)T * half * sizeof(float));
    m->rope_sin = (float*)dev_alloc((size_t)T * half * sizeof(float));
    dev_upload(m->rope_cos, cos_host, (size_t)T * half * sizeof(float));
    dev_upload(m->rope_sin, sin_host, (size_t)T * half * sizeof(float));
    free(cos_host);
    free(sin_host);
    m->inputs = (int*)dev_alloc((size_t)B * T * sizeof(int));
    m->targets = (int*)dev_alloc((size_t)B * T * sizeof(int));
    m->losses_host = (float*)mallocCheck((size_t)B * T * sizeof(float));
}

static inline void llama_free(Llama* m) {
    dev_free(m->state_memory);
    dev_free(m->acts_memory);
    dev_free(m->fp8_weights);
    dev_free(m->fp8_scales);
    dev_free(m->fp8_counts);
    dev_free(m->rope_cos);
    dev_free(m->rope_sin);
    dev_free(m->inputs);
    dev_free(m->targets);
    free(m->fp8_linear);
    free(m->losses_host);
    memset(m, 0, sizeof(*m));
}

/* Refreshes the BF16 working weights from the FP32 master weights; the FP8 copies follow lazily. */
static inline void llama_refresh_working_weights(Llama* m) {
    op_params_from_master(m->params_memory, m->master, m->num_params);
    m->fp8_weights_valid = 0;
}

/* Loads host FP32 parameters (param_count elements, checkpoint order) as master and working weights. */
static inline void llama_set_params(Llama* m, const float* params) {
    dev_upload(m->master, params, m->num_params * sizeof(float));
    llama_refresh_working_weights(m);
}

/* Copies the FP32 master weights to the host (param_count elements). */
static inline void llama_get_params(Llama* m, float* params) {
    dev_download(params, m->master, m->num_params * sizeof(float));
}

/* A linear layer as its GEMMs see it: y (N, OC) = x (N, C) weight^T. */
typedef struct {
    act_t* weight;  /* (OC, C) working weight */
    float* dweight; /* (OC, C) FP32 gradient */
    size_t in_dim;  /* C */
    size_t out_dim; /* OC */
    Fp8Linear* fp8; /* its FP8 buffers when it runs FP8 GEMMs, else NULL */
    size_t slot;    /* index of its FP8 scales and counts (fp8 only) */
} Linear;

/* Linear layer `lin` of block `layer` (NO_LAYER for LIN_OUTPUT). */
static inline Linear llama_linear(Llama* m, int layer, LinearId lin) {
    Linear x;
    memset(&x, 0, sizeof(x));
    llama_linear_dims(&m->cfg, lin, &x.out_dim, &x.in_dim);
    if (lin == LIN_OUTPUT) {
        x.weight = m->params.output;
        x.dweight = m->grads.output;
        return x;
    }
    act_t* weights[LIN_PER_LAYER] = {m->params.wqkv, m->params.wo, m->params.w13, m->params.w2};
    float* grads[LIN_PER_LAYER] = {m->grads.wqkv, m->grads.wo, m->grads.w13, m->grads.w2};
    size_t per_layer = x.out_dim * x.in_dim;
    x.weight = weights[lin] + (size_t)layer * per_layer;
    x.dweight = grads[lin] + (size_t)layer * per_layer;
    x.slot = llama_slot(layer, lin);
    if (m->precision == PRECISION_FP8) x.fp8 = &m->fp8_linear[x.slot];
    return x;
}

/* Tokens of the last forward's micro-batch: the N of every GEMM. */
static inline size_t llama_tokens(const Llama* m) { return (size_t)m->last_B * m->last_T; }

/*
 * Casts every FP8 linear weight to E4M3 with its own current scale, writing W and W^T in one pass
 * (DESIGN.md: once per optimizer step, reused by every micro-batch, bytes and scale always in step).
 */
static inline void llama_fp8_refresh_weights(Llama* m) {
    for (int l = 0; l < m->cfg.n_layers; l++) {
        for (int lin = 0; lin < LIN_PER_LAYER; lin++) {
            Linear x = llama_linear(m, l, (LinearId)lin);
            if (x.fp8 == NULL) continue;
            Fp8Scale* s = fp8_scale(m, x.slot, FP8_OP_W);
            op_amax(s, x.weight, x.out_dim * x.in_dim);
            op_cast_transpose(x.fp8->w, x.fp8->wt, x.weight, x.out_dim, x.in_dim, FP8_E4M3, s, m->pow2_scales,
                              fp8_counts(m, x.slot, FP8_OP_W));
        }
    }
    m->fp8_weights_valid = 1;
}

/*
 * fprop of linear layer `lin` of block `layer`: out (N, OC) = inp (N, C) W^T, N = the forward's B*T.
 * An FP8 layer casts inp to E4M3 with its just-in-time scale, keeping the X^T copy for wgrad, and runs
 * E4M3 x E4M3 with fast accumulation; any other layer runs a GEMM in the activation type.
 */
static inline void linear_forward(Llama* m, int layer, LinearId lin, act_t* out, const act_t* inp) {
    Linear x = llama_linear(m, layer, lin);
    size_t N = llama_tokens(m), C = x.in_dim, OC = x.out_dim;
    if (x.fp8 == NULL) {
        GemmCall g = gemm_fprop(out, DT_ACT, gemm_operand(x.weight, DT_ACT), gemm_operand(inp, DT_ACT), N, C, OC);
        op_gemm(&g);
        return;
    }
    Fp8Scale* sw = fp8_scale(m, x.slot, FP8_OP_W);
    Fp8Scale* sx = fp8_scale(m, x.slot, FP8_OP_X);
    op_amax(sx, inp, N * C);
    op_cast_transpose(m->acts.x8, x.fp8->xt, inp, N, C, FP8_E4M3, sx, m->pow2_scales, fp8_counts(m, x.slot, FP8_OP_X));
    GemmCall g = gemm_fprop(out, DT_ACT, gemm_operand_fp8(x.fp8->w, DT_E4M3, &sw->scale_inv),
                            gemm_operand_fp8(m->acts.x8, DT_E4M3, &sx->scale_inv), N, C, OC);
    op_gemm(&g);
}

/*
 * dgrad and wgrad of linear layer `lin` of block `layer`: dinp (N, C) = dout (N, OC) W and
 * dW (OC, C) FP32 += dout^T inp. An FP8 layer casts dout to E5M2 (and dout^T) with its just-in-time
 * scale; dgrad multiplies the E4M3 W^T copy, wgrad the E4M3 X^T saved by fprop (inp is not read); fast
 * accumulation is off for both (TE's default for the backward GEMMs). Otherwise GEMMs in the activation
 * type.
 */
static inline void linear_backward(Llama* m, int layer, LinearId lin, act_t* dinp, const act_t* dout, const act_t* inp) {
    Linear x = llama_linear(m, layer, lin);
    size_t N = llama_tokens(m), C = x.in_dim, OC = x.out_dim;
    if (x.fp8 == NULL) {
        GemmCall dgrad = gemm_dgrad(dinp, DT_ACT, gemm_operand(x.weight, DT_ACT), gemm_operand(dout, DT_ACT), N, C, OC);
        op_gemm(&dgrad);
        GemmCall wgrad = gemm_wgrad(x.dweight, gemm_operand(inp, DT_ACT), gemm_operand(dout, DT_ACT), N, C, OC);
        op_gemm(&wgrad);
        return;
    }
    Fp8Scale* sw = fp8_scale(m, x.slot, FP8_OP_W);
    Fp8Scale* sx = fp8_scale(m, x.slot, FP8_OP_X);
    Fp8Scale* sdy = fp8_scale(m, x.slot, FP8_OP_DY);
    op_amax(sdy, dout, N * OC);
    op_cast_transpose(m->acts.dy8, m->acts.dyt8, dout, N, OC, FP8_E5M2, sdy, m->pow2_scales,
                      fp8_counts(m, x.slot, FP8_OP_DY));
    GemmCall dgrad = gemm_dgrad(dinp, DT_ACT, gemm_operand_fp8(x.fp8->wt, DT_E4M3, &sw->scale_inv),
                                gemm_operand_fp8(m->acts.dy8, DT_E5M2, &sdy->scale_inv), N, C, OC);
    op_gemm(&dgrad);
    GemmCall wgrad = gemm_wgrad(x.dweight, gemm_operand_fp8(x.fp8->xt, DT_E4M3, &sx->scale_inv),
                                gemm_operand_fp8(m->acts.dyt8, DT_E5M2, &sdy->scale_inv), N, C, OC);
    op_gemm(&wgrad);
}

/* Pointer to layer l's slice of a per-layer activation buffer of `per` elements per layer. */
#define LAYER(buf, l, per) ((buf) + (size_t)(l) * (per))
/* Slice of a buffer that is per-layer when `keep`, else one shared scratch slice. */
#define KEPT(buf, l, per, keep) ((buf) + ((keep) ? (size_t)(l) * (per) : 0))

/*
 * Forward pass on a micro-batch of (B, T) tokens, B <= m->B, T <= m->T. inputs, targets: host (B, T)
 * int arrays; targets may be NULL (logits only, e.g. for sampling). With targets, returns the mean
 * cross-entropy and leaves dloss * d(loss_i)/d(logits) in acts.logits for backward (dloss: the
 * weight of one token's loss in the step's objective, 1 / (B*T*grad_accum_steps)); without, returns 0.
 */
static inline float llama_forward(Llama* m, const int* inputs, const int* targets, int B, int T, float dloss) {
    const LlamaConfig* c = &m->cfg;
    if (B > m->B || T > m->T) die("forward on (B %d, T %d) exceeds the allocated (%d, %d)", B, T, m->B, m->T);
    size_t N = (size_t)B * T;
    int C = c->dim, L = c->n_layers, NH = c->n_heads, NKV = c->n_kv_heads, HS = llama_head_dim(c);
    int F = c->ffn_dim, V = c->vocab_size, QKV = llama_qkv_dim(c);
    int keep = llama_keeps_linear_inputs(m);
    size_t NC = N * C, NF = N * F, stats_per = att_stats_size((size_t)m->B, NH, m->T);
    Acts* a = &m->acts;
    ParamTensors* p = &m->params;
    if (m->precision == PRECISION_FP8 && !m->fp8_weights_valid) llama_fp8_refresh_weights(m);
    m->last_B = B;
    m->last_T = T;
    m->inputs_host = inputs;
    dev_upload(m->inputs, inputs, N * sizeof(int));

    op_encoder_forward(a->resid, m->inputs, p->tok_embeddings, N, C);                            /* (N, C) */
    op_rmsnorm_forward(a->ln_attn, a->rstd_attn, a->resid, p->attn_norm, N, C, c->norm_eps);     /* (N, C) */
    for (int l = 0; l < L; l++) {
        act_t* x = LAYER(a->resid, l, NC);               /* (N, C) layer input */
        act_t* ln_attn = KEPT(a->ln_attn, l, NC, keep);  /* (N, C) */
        act_t* qkv = LAYER(a->qkv, l, N * QKV);          /* (N, QKV) */
        act_t* att = LAYER(a->att, l, NC);               /* (N, C) */
        float* stats = LAYER(a->att_stats, l, stats_per);
        act_t* mid = LAYER(a->resid_mid, l, NC);         /* (N, C) */
        act_t* ln_ffn = KEPT(a->ln_ffn, l, NC, keep);    /* (N, C) */
        act_t* fc = LAYER(a->fc, l, 2 * NF);             /* (N, 2F) */
        act_t* sw = KEPT(a->swiglu, l, NF, keep);        /* (N, F) */
        act_t* next = LAYER(a->resid, l + 1, NC);        /* (N, C) next layer's input */
        int last = l == L - 1;
        act_t* next_ln = last ? a->ln_final : KEPT(a->ln_attn, l + 1, NC, keep);
        float* next_rstd = last ? a->rstd_final : LAYER(a->rstd_attn, l + 1, N);
        const act_t* next_norm = last ? p->norm : LAYER(p->attn_norm, l + 1, C);

        linear_forward(m, l, LIN_QKV, qkv, ln_attn);
        op_rope_forward(qkv, m->rope_cos, m->rope_sin, B, T, NH, NKV, HS);
        op_attention_forward(att, stats, qkv, B, T, NH, NKV, HS);
        linear_forward(m, l, LIN_WO, a->branch, att);
        op_residual_rmsnorm_forward(mid, ln_ffn, LAYER(a->rstd_ffn, l, N), x, a->branch, LAYER(p->ffn_norm, l, C), N, C,
                                    c->norm_eps);
        linear_forward(m, l, LIN_W13, fc, ln_ffn);
        op_swiglu_forward(sw, fc, N, F);
        linear_forward(m, l, LIN_W2, a->branch, sw);
        op_residual_rmsnorm_forward(next, next_ln, next_rstd, mid, a->branch, next_norm, N, C, c->norm_eps);
    }
    linear_forward(m, NO_LAYER, LIN_OUTPUT, a->logits, a->ln_final);                              /* (N, V) */
    if (targets == NULL) return 0.0f;
    dev_upload(m->targets, targets, N * sizeof(int));
    op_classifier(a->logits, a->losses, m->targets, N, V, dloss);
    dev_download(m->losses_host, a->losses, N * sizeof(float));
    double sum = 0.0;
    for (size_t i = 0; i < N; i++) sum += m->losses_host[i];
    return (float)(sum / (double)N);
}

/*
 * Backward pass of the last llama_forward (which must have had targets): accumulates d(loss)/d(param)
 * into m->grads (FP32, += so that micro-steps add up; llama_zero_grads starts a step).
 */
static inline void llama_backward(Llama* m) {
    const LlamaConfig* c = &m->cfg;
    int B = m->last_B, T = m->last_T;
    size_t N = (size_t)B * T;
    int C = c->dim, L = c->n_layers, NH = c->n_heads, NKV = c->n_kv_heads, HS = llama_head_dim(c);
    int F = c->ffn_dim, QKV = llama_qkv_dim(c);
    int keep = llama_keeps_linear_inputs(m);
    int fp8 = m->precision == PRECISION_FP8;
    size_t NC = N * C, NF = N * F, stats_per = att_stats_size((size_t)m->B, NH, m->T);
    Acts* a = &m->acts;
    ParamTensors* p = &m->params;
    GradTensors* g = &m->grads;

    dev_zero(a->d_resid, NC * sizeof(act_t));
    linear_backward(m, NO_LAYER, LIN_OUTPUT, a->d_ln, a->logits, a->ln_final);                   /* (N, C) */
    op_rmsnorm_backward(a->d_resid, g->norm, a->d_ln, LAYER(a->resid, L, NC), p->norm, a->rstd_final, N, C);
    for (int l = L - 1; l >= 0; l--) {
        act_t* x = LAYER(a->resid, l, NC);
        act_t* ln_attn = KEPT(a->ln_attn, l, NC, keep);
        act_t* qkv = LAYER(a->qkv, l, N * QKV);
        act_t* att = LAYER(a->att, l, NC);
        float* stats = LAYER(a->att_stats, l, stats_per);
        act_t* mid = LAYER(a->resid_mid, l, NC);
        act_t* ln_ffn = KEPT(a->ln_ffn, l, NC, keep);
        act_t* fc = LAYER(a->fc, l, 2 * NF);
        act_t* sw = KEPT(a->swiglu, l, NF, keep);
        float* rstd_attn = LAYER(a->rstd_attn, l, N);
        float* rstd_ffn = LAYER(a->rstd_ffn, l, N);

        /* -r 1 in bf16/fp32: rebuild the linear inputs backward reads (same kernels, same bytes). FP8
           backward reads the saved X^T copies instead and needs none of them. */
        if (!keep && !fp8) {
            op_rmsnorm_forward(ln_ffn, rstd_ffn, mid, LAYER(p->ffn_norm, l, C), N, C, c->norm_eps);
            op_swiglu_forward(sw, fc, N, F);
        }
        linear_backward(m, l, LIN_W2, a->d_swiglu, a->d_resid, sw);                               /* (N, F) */
        op_swiglu_backward(a->d_fc, a->d_swiglu, fc, N, F);                                       /* (N, 2F) */
        linear_backward(m, l, LIN_W13, a->d_ln, a->d_fc, ln_ffn);                                 /* (N, C) */
        op_rmsnorm_backward(a->d_resid, LAYER(g->ffn_norm, l, C), a->d_ln, mid, LAYER(p->ffn_norm, l, C), rstd_ffn, N, C);
        linear_backward(m, l, LIN_WO, a->d_att, a->d_resid, att);                                 /* (N, C) */
        op_attention_backward(a->d_qkv, a->d_att, qkv, att, stats, B, T, NH, NKV, HS);            /* (N, QKV) */
        op_rope_backward(a->d_qkv, m->rope_cos, m->rope_sin, B, T, NH, NKV, HS);
        if (!keep && !fp8) op_rmsnorm_forward(ln_attn, rstd_attn, x, LAYER(p->attn_norm, l, C), N, C, c->norm_eps);
        linear_backward(m, l, LIN_QKV, a->d_ln, a->d_qkv, ln_attn);                               /* (N, C) */
        op_rmsnorm_backward(a->d_resid, LAYER(g->attn_norm, l, C), a->d_ln, x, LAYER(p->attn_norm, l, C), rstd_attn, N, C);
    }
    op_encoder_backward(g->tok_embeddings, a->d_resid, m->inputs, m->inputs_host, N, C);
}

static inline void llama_zero_grads(Llama* m) { dev_zero(m->grads_memory, m->num_params * sizeof(float)); }

/* A contiguous piece of the gradient named for error messages: one tensor, or one layer of it. */
typedef struct {
    int tensor;
    int layer; /* -1 for tensors that are not per layer */
    size_t offset, count;
} GradSegment;

/* Per-layer tensors (attn_norm, wqkv, wo, ffn_norm, w13, w2) and the others (tok_embeddings, norm, output). */
static inline int param_is_per_layer(int tensor) { return tensor != P_TOK_EMBEDDINGS && tensor != P_NORM && tensor != P_OUTPUT; }

/* Number of gradient segments: one per tensor that is not per layer, one per layer of the others. */
static inline size_t llama_grad_segment_count(int n_layers) {
    size_t n = 0;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) n += param_is_per_layer(t) ? (size_t)n_layers : 1;
    return n;
}

/* Splits the gradient into per-tensor, per-layer segments; returns how many (llama_grad_segment_count). */
static inline int llama_grad_segments(const Llama* m, GradSegment* seg) {
    size_t off = 0;
    int n = 0;
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        int per_layer = param_is_per_layer(t);
        int parts = per_layer ? m->cfg.n_layers : 1;
        size_t each = m->param_sizes[t] / (size_t)parts;
        for (int k = 0; k < parts; k++) {
            seg[n].tensor = t;
            seg[n].layer = per_layer ? k : -1;
            seg[n].offset = off;
            seg[n].count = each;
            off += each;
            n++;
        }
    }
    return n;
}

/*
 * Global L2 norm of the gradient. When it is not finite, *bad is set to the index of the first segment
 * (llama_grad_segments order) whose sum of squares is not finite, else -1.
 */
static inline float llama_grad_norm(Llama* m, int* bad) {
    GradSegment* seg = (GradSegment*)mallocCheck(llama_grad_segment_count(m->cfg.n_layers) * sizeof(GradSegment));
    int n = llama_grad_segments(m, seg);
    double total = 0.0;
    *bad = -1;
    for (int i = 0; i < n; i++) {
        double s = op_sum_squares(m->grads_memory + seg[i].offset, seg[i].count);
        if (!isfinite(s) && *bad < 0) *bad = i;
        total += s;
    }
    free(seg);
    return (float)sqrt(total);
}

/* "wqkv[layer 3]" style name of gradient segment `index`. */
static inline void llama_segment_name(const Llama* m, int index, char* out, size_t len) {
    GradSegment* seg = (GradSegment*)mallocCheck(llama_grad_segment_count(m->cfg.n_layers) * sizeof(GradSegment));
    llama_grad_segments(m, seg);
    if (seg[index].layer < 0) snprintf(out, len, "%s", PARAM_NAMES[seg[index].tensor]);
    else snprintf(out, len, "%s[layer %d]", PARAM_NAMES[seg[index].tensor], seg[index].layer);
    free(seg);
}

/*
 * One AdamW step (t = step + 1) on every parameter: gradients multiplied by grad_scale (clipping),
 * weight decay on 2-D weights only; then the working weights are refreshed from the master weights.
 */
static inline void llama_update(Llama* m, float lr, float weight_decay, int step, float grad_scale) {
    float t = (float)(step + 1);
    float bc1 = 1.0f - powf(ADAMW_BETA1, t);
    float bc2_sqrt = sqrtf(1.0f - powf(ADAMW_BETA2, t));
    size_t off = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        float wd = param_is_decayed(i) ? weight_decay : 0.0f;
        op_adamw(m->master + off, m->adam_m + off, m->adam_v + off, m->grads_memory + off, m->param_sizes[i], lr, wd,
                 bc1, bc2_sqrt, grad_scale);
        off += m->param_sizes[i];
    }
    llama_refresh_working_weights(m);
}

/* Returns the first FP8 operand whose amax is not finite, as "w13[layer 2] dY", or 0 when all are. */
static inline int llama_fp8_nonfinite(Llama* m, char* out, size_t len) {
    if (m->precision != PRECISION_FP8) return 0;
    size_t n = (size_t)m->cfg.n_layers * LIN_PER_LAYER * FP8_OPS;
    Fp8Scale* s = (Fp8Scale*)mallocCheck(n * sizeof(Fp8Scale));
    dev_download(s, m->fp8_scales, n * sizeof(Fp8Scale));
    int found = 0;
    for (size_t i = 0; i < n && !found; i++) {
        if (!fp8_amax_is_finite(s[i].amax)) {
            size_t slot = i / FP8_OPS;
            snprintf(out, len, "%s[layer %zu] %s", LINEAR_NAMES[slot % LIN_PER_LAYER], slot / LIN_PER_LAYER,
                     FP8_OPERAND_NAMES[i % FP8_OPS]);
            found = 1;
        }
    }
    free(s);
    return found;
}

/* Starts a step whose FP8 casts gather statistics: counters zeroed, weights recast to count them too. */
static inline void llama_fp8_stats_begin(Llama* m) {
    if (m->precision != PRECISION_FP8) return;
    dev_zero(m->fp8_counts, (size_t)m->cfg.n_layers * LIN_PER_LAYER * FP8_OPS * sizeof(Fp8Counts));
    m->fp8_stats_due = 1;
    m->fp8_weights_valid = 0;
}

/*
 * Ends a statistics step: for every FP8 operand, calls `emit` with its layer, GEMM, operand, format,
 * amax, scale, saturated fraction (codes at +-max) and underflow fraction (non-zero inputs cast to 0).
 * The amax/scale are those of the operand's last cast in the step.
 */
typedef void (*Fp8StatsEmit)(void* ctx, int layer, const char* gemm, const char* operand, const char* format, float amax,
                             float scale, double saturated_frac, double underflow_frac);

static inline void llama_fp8_stats_end(Llama* m, Fp8StatsEmit emit, void* ctx) {
    if (m->precision != PRECISION_FP8 || !m->fp8_stats_due) return;
    m->fp8_stats_due = 0;
    size_t n = (size_t)m->cfg.n_layers * LIN_PER_LAYER * FP8_OPS;
    Fp8Scale* s = (Fp8Scale*)mallocCheck(n * sizeof(Fp8Scale));
    Fp8Counts* k = (Fp8Counts*)mallocCheck(n * sizeof(Fp8Counts));
    dev_download(s, m->fp8_scales, n * sizeof(Fp8Scale));
    dev_download(k, m->fp8_counts, n * sizeof(Fp8Counts));
    for (size_t i = 0; i < n; i++) {
        size_t slot = i / FP8_OPS;
        int op = (int)(i % FP8_OPS);
        double sat = k[i].count ? (double)k[i].saturated / (double)k[i].count : 0.0;
        double under = k[i].nonzero ? (double)k[i].underflow / (double)k[i].nonzero : 0.0;
        emit(ctx, (int)(slot / LIN_PER_LAYER), LINEAR_NAMES[slot % LIN_PER_LAYER], FP8_OPERAND_NAMES[op],
             op == FP8_OP_DY ? "E5M2" : "E4M3", s[i].amax, s[i].scale, sat, under);
    }
    free(s);
    free(k);
}

/* Copies row `row` (0-based, < last B*T) of the last forward's logits to the host as floats (V). */
static inline void llama_logits_row(Llama* m, size_t row, float* out) {
    act_to_float_host(out, m->acts.logits + row * (size_t)m->cfg.vocab_size, (size_t)m->cfg.vocab_size);
}
