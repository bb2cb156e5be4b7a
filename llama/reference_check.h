/*
 * The HF-reference check, shared by test_llama.c and test_llama.cu: runs the model of
 * dev/reference/llama_ref_model.bin on the reference batch with the build's ops and compares logits,
 * loss, every gradient (per tensor and layer), and the losses of the reference's AdamW steps against
 * HF transformers' float64 results (dev/reference/make_reference.py). Included after llama/model.h.
 */
#pragma once

#include "model.h"
#include "testing.h"

typedef struct {
    double logits_max_abs;  /* max |logit - ref| */
    double loss_abs;        /* |loss - ref| */
    double grad_rel_l2;     /* worst ||g - ref|| / ||ref|| over gradient segments */
    double step_loss_rel;   /* worst |loss_s - ref_s| / ref_s over the AdamW steps */
} RefTolerance;

/* Runs the reference comparison in precision p; prints every measured error; returns 0 when within tol. */
static inline int reference_check(Precision p, RefTolerance tol) {
    LlamaConfig cfg;
    checkpoint_read_config(REF_MODEL_PATH, &cfg);
    RefState r;
    ref_state_read(&r, REF_STATE_PATH, &cfg);
    int failures = 0;
    if (r.beta1 != ADAMW_BETA1 || r.beta2 != ADAMW_BETA2 || r.eps != ADAMW_EPS)
        failures += fail("reference AdamW betas/eps (%g, %g, %g) differ from ours (%g, %g, %g)", r.beta1, r.beta2, r.eps,
                         ADAMW_BETA1, ADAMW_BETA2, ADAMW_EPS);
    backend_init(p);
    Llama m;
    llama_build(&m, &cfg, p, r.B, r.T, 0, 0);
    float* params = (float*)mallocCheck(r.num_params * sizeof(float));
    checkpoint_read_params(REF_MODEL_PATH, &cfg, params);
    llama_set_params(&m, params);
    size_t N = (size_t)r.B * r.T, V = (size_t)cfg.vocab_size;

    /* logits, before the classifier replaces them with their gradient */
    float* logits = (float*)mallocCheck(N * V * sizeof(float));
    for (size_t i = 0; i < N * V; i++) logits[i] = NAN; /* poison: every value must be written */
    llama_forward(&m, r.inputs, NULL, r.B, r.T, 0.0f);
    for (size_t row = 0; row < N; row++) llama_logits_row(&m, row, logits + row * V);
    ErrorStats le = error_stats(logits, r.logits, N * V);
    printf("    logits: max abs err %.3e (max |ref| %.3e)%s\n", le.max_abs, le.ref_max, le.nonfinite ? " NON-FINITE" : "");
    if (le.nonfinite || le.max_abs > tol.logits_max_abs) failures += fail("logits max abs err %.3e > %.1e", le.max_abs, tol.logits_max_abs);

    float loss = llama_forward(&m, r.inputs, r.targets, r.B, r.T, 1.0f / (float)N);
    double loss_err = fabs((double)loss - r.loss);
    printf("    loss: %.7f vs ref %.7f, abs err %.3e\n", loss, r.loss, loss_err);
    if (!(loss_err <= tol.loss_abs)) failures += fail("loss abs err %.3e > %.1e", loss_err, tol.loss_abs);

    llama_zero_grads(&m);
    llama_backward(&m);
    float* grads = (float*)mallocCheck(r.num_params * sizeof(float));
    dev_download(grads, m.grads_memory, r.num_params * sizeof(float));
    GradSegment* seg = (GradSegment*)mallocCheck(LLAMA_GRAD_SEGMENTS(cfg.n_layers) * sizeof(GradSegment));
    int nseg = llama_grad_segments(&m, seg);
    double worst = -1.0;
    int worst_seg = 0;
    for (int i = 0; i < nseg; i++) {
        ErrorStats ge = error_stats(grads + seg[i].offset, r.grads + seg[i].offset, seg[i].count);
        double e = ge.nonfinite ? INFINITY : ge.rel_l2;
        if (e > worst) {
            worst = e;
            worst_seg = i;
        }
    }
    char name[64];
    llama_segment_name(&m, worst_seg, name, sizeof(name));
    printf("    gradients: worst relative L2 error %.3e in %s (%d tensors)\n", worst, name, nseg);
    if (!(worst <= tol.grad_rel_l2)) failures += fail("gradient of %s: relative L2 error %.3e > %.1e", name, worst, tol.grad_rel_l2);

    double worst_step = 0.0;
    for (int s = 0; s < r.steps; s++) {
        llama_zero_grads(&m);
        float l = llama_forward(&m, r.inputs, r.targets, r.B, r.T, 1.0f / (float)N);
        llama_backward(&m);
        int bad;
        float norm = llama_grad_norm(&m, &bad);
        llama_update(&m, r.lr, r.weight_decay, s, clip_factor(norm, r.clip));
        double rel = fabs((double)l - r.losses[s]) / fabs((double)r.losses[s]);
        if (!(rel <= worst_step)) worst_step = isfinite(rel) ? (rel > worst_step ? rel : worst_step) : INFINITY;
        printf("    step %d: loss %.7f ref %.7f rel err %.2e\n", s, l, r.losses[s], rel);
    }
    if (!(worst_step <= tol.step_loss_rel)) failures += fail("AdamW step losses: worst relative error %.3e > %.1e", worst_step, tol.step_loss_rel);

    free(seg);
    free(grads);
    free(logits);
    free(params);
    llama_free(&m);
    ref_state_free(&r);
    return failures != 0;
}
