/*
 * The memory plan (--dry-run 1): what one rank of a run with the given flags holds, by buffer and by
 * category, against the memory it would run on, with the cheapest recompute level and the largest
 * micro-batch that fit. The buffers are summed from the tables llama_build allocates (llama_state_table,
 * llama_acts_table, llama_small_table, laid out by llama_configure with comm/zero.h's shard layout for
 * --ranks N), printed exactly as a run prints them, so a plan and the run it describes can be compared
 * line by line; what the backend's ops and the communication library allocate outside the tables comes
 * from backend_workspaces and comm_workspaces (sizes, bounds, or estimates marked "~"; the JSON line has
 * each one's bytes under "workspaces"; GPU: cuDNN's attention workspace on the path the run's
 * LLM8_DETERMINISTIC and CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT select). A dry run
 * allocates nothing of the model, reads no data, starts no communication and needs no GPU when
 * --gpu-mem is given. Each binary plans its own backend: train_llama a GPU run (BF16 activations),
 * train_llama_cpu a CPU run (FP32 activations, attention probabilities) against host RAM.
 * Included by train/trainer.h after a backend, a communication implementation and model/model.h.
 */
#pragma once

#include "cli.h"
#include "shard_io.h"
#include "../comm/comm.h"
#include "../model/model.h"

/* The categories of the summary, in print order; a table entry's category is one of them. */
static const char* const PLAN_CATEGORIES[] = {"master weights", "working weights", "FP8 weight copies", "gradients",
                                              "AdamW moments", "activations", "other", "workspaces"};
#define NUM_PLAN_CATEGORIES (sizeof(PLAN_CATEGORIES) / sizeof(PLAN_CATEGORIES[0]))
#define MAX_PLAN_WORKSPACES (MAX_BACKEND_WORKSPACES + MAX_COMM_WORKSPACES + 2)
/* The largest micro-batch the search tries (a bound, not a limit anyone meets). */
#define PLAN_MAX_B (1 << 20)
/* A run fits when it leaves this fraction of the memory free: the context and the libraries' buffers are
   estimates. */
#define PLAN_HEADROOM 0.02

/* What one rank of a run needs. */
typedef struct {
    size_t by_category[NUM_PLAN_CATEGORIES];
    size_t total;
    MemoryEstimate workspaces[MAX_PLAN_WORKSPACES]; /* the "workspaces" category, entry by entry */
    int num_workspaces;
} MemoryPlan;

/* The settings a plan is for: the model's options and how gradients travel. */
typedef struct {
    const LlamaConfig* cfg;
    ModelOptions opt;
    CommWire wire;
    int checkpoints; /* the run writes checkpoints (-o, and -n not -1): model_save's device staging */
} PlanSettings;

/* The settings of a run with flags a and model cfg on `sharding` (the job's, or --ranks N for a dry run),
   the blocks --bf16-layers names (bf16_layers_parse). */
static inline PlanSettings plan_settings(const TrainArgs* a, const LlamaConfig* cfg, Sharding sharding, const char* bf16_blocks) {
    PlanSettings s = {cfg, train_args_model_options(a, sharding, bf16_blocks), a->grad_reduce,
                      a->output_dir != NULL && a->ckpt_every != NO_CHECKPOINTS};
    return s;
}

/*
 * The entries outside the tables of a run of model m (configured or built with settings s): the backend's
 * (backend_workspaces), the communication's (comm_workspaces), llama_bf16_weight's scratch and model_save's
 * staging; returns how many. The plan prints them, and the trainer sizes the scratch they name from them
 * at start-up (backend_reserve_workspaces), so that the plan is what the run allocates.
 */
static inline int plan_workspaces(const Llama* m, const PlanSettings* s, MemoryEstimate* out) {
    const ModelOptions* o = &s->opt;
    size_t piece = 0, segment = 0;
    for (int i = 0; i < m->num_segs; i++) {
        if (m->segs[i].shard.piece > piece) piece = m->segs[i].shard.piece;
        if (m->segs[i].param.count > segment) segment = m->segs[i].param.count;
    }
    WorkspaceQuery q = {s->cfg, o->B, o->T, o->precision, m->layout.chunks, o->fp8.accum};
    int n = backend_workspaces(&q, out);
    n += comm_workspaces(o->sharding.world, o->sharding.zero_stage, s->wire, piece, segment, out + n);
    if (llama_has_bf16_linears(m))
        out[n++] = (MemoryEstimate){"bf16_scratch", m->bf16_scratch_elems * sizeof(act_t), 0,
                                    "BF16 weight of a block linear running BF16 (llama_bf16_weight)", NULL};
    if (s->checkpoints && checkpoint_staging_bytes(m) > 0)
        out[n++] = (MemoryEstimate){"checkpoint_staging", checkpoint_staging_bytes(m), 0,
                                    "checkpoint: every rank's chunk of the master weights, all-gathered for rank 0 to write", NULL};
    return n;
}

static inline size_t plan_category(const char* name) {
    for (size_t c = 0; c < NUM_PLAN_CATEGORIES; c++) {
        if (strcmp(PLAN_CATEGORIES[c], name) == 0) return c;
    }
    die("memory plan: buffer category '%s' is not one of PLAN_CATEGORIES", name);
}

static inline void plan_add_table(MemoryPlan* p, const BufferSpec* specs, int n) {
    for (int i = 0; i < n; i++) p->by_category[plan_category(specs[i].category)] += buffer_bytes(&specs[i]);
}

/* The plan of settings `s`; prints the tables and workspaces as a run prints its tables when `print`. */
static inline MemoryPlan memory_plan(const PlanSettings* s, int print) {
    Llama m;
    llama_configure(&m, s->cfg, &s->opt);
    BufferSpec state[NUM_STATE_BUFFERS], acts[NUM_ACT_BUFFERS], small[NUM_SMALL_BUFFERS];
    int nstate = llama_state_table(&m, state), nacts = llama_acts_table(&m, acts), nsmall = llama_small_table(&m, small);
    MemoryPlan p;
    memset(&p, 0, sizeof(p));
    plan_add_table(&p, state, nstate);
    plan_add_table(&p, acts, nacts);
    plan_add_table(&p, small, nsmall);
    MemoryEstimate ws[MAX_PLAN_WORKSPACES];
    int nws = plan_workspaces(&m, s, ws);
    for (int i = 0; i < nws; i++) p.by_category[plan_category("workspaces")] += ws[i].bytes;
    memcpy(p.workspaces, ws, (size_t)nws * sizeof(ws[0]));
    p.num_workspaces = nws;
    for (size_t c = 0; c < NUM_PLAN_CATEGORIES; c++) p.total += p.by_category[c];
    if (print) {
        buffers_print(STATE_TABLE_TITLE, state, nstate);
        buffers_print(ACTS_TABLE_TITLE, acts, nacts);
        buffers_print(SMALL_TABLE_TITLE, small, nsmall);
        size_t outside = 0;
        for (int i = 0; i < nws; i++) outside += ws[i].bytes;
        printf("| outside the tables (~ estimate): %.1f MiB\n", mib(outside));
        for (int i = 0; i < nws; i++)
            printf("|  %c%-20s %10.2f MiB  %s\n", ws[i].estimate ? '~' : ' ', ws[i].name, mib(ws[i].bytes), ws[i].what);
    }
    llama_free(&m);
    return p;
}

/*
 * After step 1, where the backend measures device memory (the GPU, real or emulated): this run's plan by
 * category against what the run allocated (its buffer tables; for "workspaces", llm8's allocator total
 * less the tables), and the plan's estimates (the CUDA context, NCCL's buffers)
 * against cudaMemGetInfo's memory in use less llm8's allocations. Prints a table and one line
 * "memory after step 1: {JSON}" that scripts/device_check.sh reads (docs/memory.md). Allocates nothing.
 */
static inline void memory_report(Llama* m, const PlanSettings* s) {
    size_t ours = 0, in_use = 0;
    if (!backend_memory_usage(&ours, &in_use)) return;
    MemoryPlan p = memory_plan(s, 0);
    BufferSpec tables[NUM_STATE_BUFFERS + NUM_ACT_BUFFERS + NUM_SMALL_BUFFERS];
    int n = llama_state_table(m, tables);
    n += llama_acts_table(m, tables + n);
    n += llama_small_table(m, tables + n);
    size_t allocated[NUM_PLAN_CATEGORIES] = {0}, in_tables = 0, estimates = 0, ws = plan_category("workspaces");
    for (int i = 0; i < n; i++) {
        allocated[plan_category(tables[i].category)] += buffer_bytes(&tables[i]) + BUFFER_REDZONE;
        in_tables += buffer_bytes(&tables[i]) + BUFFER_REDZONE;
    }
    allocated[ws] += ours > in_tables ? ours - in_tables : 0;
    for (int i = 0; i < p.num_workspaces; i++) estimates += p.workspaces[i].estimate ? p.workspaces[i].bytes : 0;
    size_t not_ours = in_use > ours ? in_use - ours : 0;
    printf("| memory after step 1, MiB: category  plan | allocated (the run's tables; workspaces: llm8's allocator total less them)\n");
    for (size_t c = 0; c < NUM_PLAN_CATEGORIES; c++)
        printf("|   %-18s %10.2f | %10.2f%s\n", PLAN_CATEGORIES[c], mib(p.by_category[c] - (c == ws ? estimates : 0)), mib(allocated[c]),
               c == ws ? " (the plan without its estimates)" : "");
    printf("|   %-18s %10.2f | %10.2f (llm8's allocations: its allocator's total)\n", "llm8 in all", mib(p.total - estimates), mib(ours));
    printf("|   %-18s ~%9.2f | %10.2f (context, libraries: the plan's estimates | cudaMemGetInfo in use %.2f less llm8's)\n",
           "not llm8's", mib(estimates), mib(not_ours), mib(in_use));
    printf("memory after step 1: {\"plan\": {");
    for (size_t c = 0; c < NUM_PLAN_CATEGORIES; c++) printf("\"%s\": %zu, ", PLAN_CATEGORIES[c], p.by_category[c] - (c == ws ? estimates : 0));
    printf("\"llm8\": %zu, \"estimates\": %zu, \"total\": %zu}, \"allocated\": {", p.total - estimates, estimates, p.total);
    for (size_t c = 0; c < NUM_PLAN_CATEGORIES; c++) printf("\"%s\": %zu, ", PLAN_CATEGORIES[c], allocated[c]);
    printf("\"llm8\": %zu}, \"not_llm8\": %zu, \"in_use\": %zu}\n", ours, not_ours, in_use);
}

/* The memory a plan may use of `memory`: all but the headroom. */
static inline size_t plan_usable(size_t memory) { return memory - (size_t)((double)memory * PLAN_HEADROOM); }

static inline int plan_fits(const PlanSettings* s, size_t memory) { return memory_plan(s, 0).total <= plan_usable(memory); }

/* Micro-batch sizes an FP8 run can take at this T: B T a multiple of FP8_DIM_MULTIPLE. */
static inline int plan_b_step(Precision p, int T) {
    if (p != PRECISION_FP8) return 1;
    int step = 1;
    while ((long long)step * T % FP8_DIM_MULTIPLE != 0) step++;
    return step;
}

/* The largest micro-batch (a multiple of plan_b_step) with which settings `s` fit `memory`; 0 if none. */
static inline int plan_largest_b(PlanSettings s, size_t memory) {
    int step = plan_b_step(s.opt.precision, s.opt.T), lo = 0, hi = step;
    /* doubling, then bisection: memory grows with B */
    for (;;) {
        s.opt.B = hi;
        if (!plan_fits(&s, memory)) break;
        lo = hi;
        if (hi > PLAN_MAX_B / 2) return lo;
        hi *= 2;
    }
    while (hi - lo > step) {
        int mid = lo + (hi - lo) / (2 * step) * step;
        s.opt.B = mid;
        if (plan_fits(&s, memory)) lo = mid;
        else hi = mid;
    }
    return lo;
}

static inline double gib(size_t bytes) { return (double)bytes / (double)(1ull << 30); }

/*
 * --dry-run 1: prints the plan of the flags' run on --ranks N ranks against --gpu-mem (or the backend's
 * memory) and returns the exit status 0. The last line, "plan: {...}", is JSON for scripts.
 */
static inline int memory_plan_main(const TrainArgs* a) {
    if (launcher_world() > 0) die("flag --dry-run: plans a run without starting it; run it alone, with --ranks N for N ranks");
    LlamaConfig cfg;
    train_args_model(a, &cfg);
    int ranks = a->plan_ranks > 0 ? a->plan_ranks : 1;
    int accum = train_args_grad_accum(a, ranks);
    Sharding sh = {ranks, 0, a->zero_stage};
    train_args_check_grad_buffer(a, ranks);
    char* blocks = (char*)mallocCheck((size_t)cfg.n_layers);
    bf16_layers_parse(a->bf16_layers, cfg.n_layers, blocks);
    PlanSettings s = plan_settings(a, &cfg, sh, blocks);
    const char* memory_what = "--gpu-mem";
    size_t memory = a->gpu_mem_gib > 0.0f ? (size_t)((double)a->gpu_mem_gib * (double)(1ull << 30)) : backend_memory_total(&memory_what);

    printf("+-----------------------------------------------------------------------\n");
    printf("| memory plan (--dry-run) of one rank, %s build: %s, -p %s, micro-batch %d x %d, %d rank(s), ZeRO-%d, -r %d, "
           "gradients reduced in %s, AdamW moments in %s, gradient buffer in %s, master weights in %s, %d micro-step(s) per step\n",
           backend_name(), a->model, precision_name(a->precision), a->B, a->T, ranks, a->zero_stage, a->recompute,
           COMM_WIRE_NAMES[a->grad_reduce], optim_state_name(a->optim_state), grad_format_name(a->grad_buffer),
           master_format_name(a->master_weights), accum);
    llama_config_print(&cfg);
    MemoryPlan p = memory_plan(&s, 1);
    printf("| by category (GiB):");
    for (size_t c = 0; c < NUM_PLAN_CATEGORIES; c++) printf(" %s %.2f |", PLAN_CATEGORIES[c], gib(p.by_category[c]));
    printf(" total %.2f\n", gib(p.total));

    int fits = -1, cheapest = -1, largest = -1, largest_leanest = -1;
    if (memory == 0) {
        printf("| memory: no GPU found here to plan against: give --gpu-mem GiB for a verdict\n");
    } else {
        size_t usable = plan_usable(memory);
        fits = p.total <= usable;
        printf("| memory: %.2f GiB (%s), of which %.2f GiB usable (%.0f%% kept free): %s %.2f GiB\n", gib(memory), memory_what,
               gib(usable), 100.0 * PLAN_HEADROOM, fits ? "fits, to spare" : "does not fit, over by",
               gib(fits ? usable - p.total : p.total - usable));
        for (int r = 0; r < RECOMPUTE_LEVELS && cheapest < 0; r++) {
            PlanSettings t = s;
            t.opt.recompute = r;
            if (plan_fits(&t, memory)) cheapest = r;
        }
        if (cheapest >= 0) printf("| cheapest recompute that fits micro-batch %d: -r %d\n", a->B, cheapest);
        else printf("| no recompute level fits micro-batch %d: use more ranks, a higher ZeRO stage or a smaller -b / -t\n", a->B);
        largest = plan_largest_b(s, memory);
        PlanSettings leanest = s;
        leanest.opt.recompute = RECOMPUTE_LEVELS - 1;
        largest_leanest = plan_largest_b(leanest, memory);
        printf("| largest micro-batch that fits at T %d: B %d with -r %d, B %d with -r %d\n", a->T, largest, a->recompute,
               largest_leanest, leanest.opt.recompute);
    }
    printf("plan: {\"model\": \"%s\", \"backend\": \"%s\", \"precision\": \"%s\", \"B\": %d, \"T\": %d, \"ranks\": %d, "
           "\"zero\": %d, \"recompute\": %d, \"grad_accum\": %d, \"grad_reduce\": \"%s\", \"optim_state\": \"%s\", \"grad_buffer\": \"%s\", \"master_weights\": \"%s\", \"total_bytes\": %zu, \"total_gib\": %.4f, \"memory_gib\": %.4f, "
           "\"usable_bytes\": %zu, "
           "\"fits\": %d, \"cheapest_recompute\": %d, \"largest_B\": %d, \"largest_B_max_recompute\": %d, \"bytes\": {",
           a->model, backend_name(), precision_name(a->precision), a->B, a->T, ranks, a->zero_stage, a->recompute, accum,
           COMM_WIRE_NAMES[a->grad_reduce], optim_state_name(a->optim_state), grad_format_name(a->grad_buffer),
           master_format_name(a->master_weights), p.total,
           gib(p.total), gib(memory), memory ? plan_usable(memory) : 0, fits, cheapest, largest, largest_leanest);
    for (size_t c = 0; c < NUM_PLAN_CATEGORIES; c++) printf("%s\"%s\": %zu", c ? ", " : "", PLAN_CATEGORIES[c], p.by_category[c]);
    printf("}, \"workspaces\": {");
    for (int i = 0; i < p.num_workspaces; i++) printf("%s\"%s\": %zu", i ? ", " : "", p.workspaces[i].name, p.workspaces[i].bytes);
    printf("}}\n");
    free(blocks);
    return EXIT_SUCCESS;
}
