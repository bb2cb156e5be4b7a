"""The report: the predictions table, --json, what it would take for 7B fp8 on 8 H100 to reach the target,
and the comparison of gradient reductions."""
from dataclasses import replace

from .assumptions import TARGET_7B_FP8, TARGET_FP8_SPEEDUP
from .calibration import replaced_rates
from .step import CATEGORIES, CATEGORY_TITLES, InputError, make_run, predict

GRAD_REDUCTIONS = ("fp32", "bf16", "fp8")  # the trainer's --grad-reduce wires


def what_it_takes(args, rates_for):
    """Llama-2 7B fp8 on one node of 8 H100 against TARGET_7B_FP8: the time the step must lose (or may
    gain), what each term alone would have to become, and the tokens/s of levers, alone and the helpful ones
    together: faster FP8 GEMMs (a rate), and trainer flags (its op list and plan at those flags)."""
    run = make_run(args, "llama2-7b", "fp8", "H100", 1, 8)
    rates = rates_for("H100")
    base = predict(run, rates)
    must_lose_ms = base["step_ms"] - 1e3 * base["tokens_per_gpu_step"] / TARGET_7B_FP8
    terms = [{"term": c, "ms": base["split_ms"][c], "alone_change": must_lose_ms / base["split_ms"][c]}
             for c in CATEGORIES if base["split_ms"][c] > 0]
    fp8_gemm_speedup = 1.10
    levers = [(f"FP8 GEMMs {fp8_gemm_speedup - 1:.0%} faster", {}, fp8_gemm_speedup),
              ("gradients reduce-scattered in BF16 (--grad-reduce bf16)", {"grad_reduce": "bf16"}, 1.0),
              # the amax pass delayed scaling saves (Colossal-AI: current scaling within 10% of delayed)
              ("delayed scaling (--fp8-recipe delayed)", {"fp8_recipe": "delayed"}, 1.0)]
    if (args.global_batch // (run.world * run.B * run.T)) % 2 == 0:
        levers.append(("micro-batch 2 (-b 2; -r as the plan needs)", {"B": 2 * run.B, "recompute": "auto"}, 1.0))
    rows, helpful, helpful_scale = [], {}, 1.0
    for name, change, gemm_scale in levers:
        result = predict(replace(run, **change), rates.with_gemm_scale("fp8", gemm_scale))
        rows.append({"lever": name, **lever_summary(result)})
        if result["tokens_per_s_per_gpu"] > base["tokens_per_s_per_gpu"] and result["fits"]:
            helpful.update(change)
            helpful_scale *= gemm_scale
    together = predict(replace(run, **helpful), rates.with_gemm_scale("fp8", helpful_scale))
    rows.append({"lever": "the helpful ones together", **lever_summary(together)})
    bf16 = predict(make_run(args, "llama2-7b", "bf16", "H100", 1, 8), rates)
    speedup = base["tokens_per_s_per_gpu"] / bf16["tokens_per_s_per_gpu"]
    return {"plan": f"llama2-7b fp8 {run.label()}", "target": TARGET_7B_FP8, "predicted": base["tokens_per_s_per_gpu"],
            "must_lose_ms": must_lose_ms, "step_ms": base["step_ms"], "terms": terms, "levers": rows,
            "fp8_over_bf16": speedup, "speedup_must_lose_ms": base["step_ms"] * (1 - speedup / TARGET_FP8_SPEEDUP)}


def lever_summary(result):
    return {key: result[key] for key in ("tokens_per_s_per_gpu", "memory_gib", "fits", "recompute")}


# The gradient reductions compared (13B on 2 x 8 H800; 7B beside it, and 13B on one node, where
# the all-to-all crosses no InfiniBand).
GRAD_REDUCE_PLANS = (("llama2-13b", "H800", 2, 8), ("llama2-7b", "H800", 2, 8), ("llama2-13b", "H800", 1, 8))


def grad_reduce_comparison(args, rates_for):
    """fp8 training with each gradient reduction on GRAD_REDUCE_PLANS, the other flags as given: one row per
    plan and reduction, the prediction's communication terms; a plan the flags do not allow (a global batch
    its GPUs do not divide) is a row with "skipped" saying why."""
    rows = []
    for model, gpu, nodes, per_node in GRAD_REDUCE_PLANS:
        for reduction in GRAD_REDUCTIONS:
            try:
                r = predict(make_run(args, model, "fp8", gpu, nodes, per_node, grad_reduce=reduction), rates_for(gpu))
            except InputError as e:
                rows.append({"model": model, "gpus": f"{nodes}x{per_node} {gpu}", "grad_reduce": reduction,
                             "skipped": str(e)})
                continue
            rows.append({key: r[key] for key in (
                "model", "gpus", "zero", "grad_accum", "recompute", "grad_reduce", "grad_wire_bytes_per_element",
                "grad_inter_node_bytes_per_element_per_nic", "comm_total_ms", "grad_reduction_kernels_ms",
                "comm_exposed_ms", "step_ms", "tokens_per_s_per_gpu")}
                        | {"exposed_share": r["comm_exposed_ms"] / r["step_ms"],
                           "comm_share": r["split_ms"]["comm"] / r["step_ms"]})
    return rows


def markdown_table(header, rows):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["| " + " | ".join(str(h).ljust(w) for h, w in zip(header, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(x).rjust(w) if i >= 3 else str(x).ljust(w)
                                       for i, (x, w) in enumerate(zip(row, widths))) + " |")
    return "\n".join(lines)


def predictions_table(results):
    header = ["model", "prec", "GPUs", "B", "accum", "ZeRO", "-r", "mem GiB", "tok/s/GPU", "MFU llm.c",
              "MFU Megatron", "step ms"] + [CATEGORY_TITLES[c] + " %" for c in CATEGORIES]
    rows = []
    for r in results:
        mem = f"{r['memory_gib']:.0f}" + ("" if r["fits"] else " (>)")
        rows.append([r["model"], r["precision"], r["gpus"], r["micro_batch"], r["grad_accum"], r["zero"], r["recompute"],
                     mem, f"{r['tokens_per_s_per_gpu']:,.0f}", f"{r['mfu_llmc']:.1%}", f"{r['mfu_megatron']:.1%}",
                     f"{r['step_ms']:,.0f}"] + [f"{100 * r['split_ms'][c] / r['step_ms']:.1f}" for c in CATEGORIES])
    return markdown_table(header, rows)


def print_report(results, calibration, comparison, takes, args):
    source = "assumed (datasheet) rates"
    if calibration is not None and calibration.device is not None:
        source = f"rates calibrated on {calibration.device} where measured, assumed elsewhere"
    print(f"llm8 performance model: the trainer's own ops of one training step (train_llama_cpu --dry-run 2) and "
          f"memory plan (train_llama --dry-run 1), timed with {source}; assumptions in scripts/perf/assumptions.py")
    print(f"seq {args.seq_len}, global batch {args.global_batch:,} tokens; ZeRO-1 for 7B, ZeRO-2 for 13B "
          f"unless --zero; -r {args.recompute}{' (the cheapest the plan fits)' if args.recompute == 'auto' else ''}; "
          f"collectives {'overlapped' if not args.no_overlap else 'not overlapped'}; "
          f"{args.nics_per_node}x {args.nic_gbits:g} Gb/s NICs per node; gradients reduced in {args.grad_reduce}, "
          f"AdamW moments in {args.optim_state}, gradient buffer in {args.grad_buffer}, master weights in "
          f"{args.master_weights}")
    print("MFU: model FLOPs/token x tokens/s over the precision's dense peak (FP8 peak for fp8, as the trainer "
          "reports it); llm.c: 6N + 12LCT; Megatron: 6L(hQKV + h^2 + 3hF + 2sh) + 6hV")
    print("step split, % of the step: GEMM, attn (attention kernels), mem (the other activation kernels, gradient "
          "zeroing and copies), cast (FP8 quantize, transposes, weight casts, scale upkeep), optim (norm, AdamW, weight "
          "refresh), comm (exposed collectives + overlap slowdown + a bf16/fp8 wire's conversion kernels), other "
          "(launch gaps, host copies and syncs, host collectives); mem GiB: the GPU build's plan, (>) = does not fit\n")
    print(predictions_table(results))
    print()
    for fp8 in (r for r in results if r["precision"] == "fp8"):
        bf16 = [r for r in results if r["precision"] == "bf16" and r["model"] == fp8["model"] and r["gpus"] == fp8["gpus"]]
        if bf16:
            print(f"fp8 / bf16, {fp8['model']} on {fp8['gpus']}: "
                  f"{fp8['tokens_per_s_per_gpu'] / bf16[0]['tokens_per_s_per_gpu']:.2f}x (target {TARGET_FP8_SPEEDUP}x)")
    if calibration is not None:
        print("\n== Calibration")
        for path, found in calibration.files:
            print(f"{path}: {', '.join(found)}")
        replaced = replaced_rates(calibration)
        print(f"replaced datasheet rates ({len(replaced)}, measured on {calibration.device}):" if replaced
              else "no rate replaced")
        for line in replaced:
            print(f"  {line}")
        if comparison:
            print("\n== Predicted vs measured on one GPU (datasheet: the model before calibration; calibrated: with "
                  "the measured rates; the ratio takes the calibrated prediction where there is one)")
            rows = []
            for c in comparison:
                fmt = "{:,.2f}" if c["unit"] == "x" else "{:,.1f}"
                rows.append([c["what"], fmt.format(c["datasheet"]),
                             fmt.format(c["calibrated"]) if "calibrated" in c else "-", fmt.format(c["measured"]),
                             c["unit"], f"{c.get('calibrated', c['datasheet']) / c['measured']:.2f}"])
            print(markdown_table(["what", "datasheet", "calibrated", "measured", "unit", "predicted/measured"], rows))
    print_what_it_takes(takes)


def print_what_it_takes(t):
    print(f"\n== What it would take: {t['plan']}, target {t['target']:,.0f} tokens/s/GPU")
    gap = t["must_lose_ms"]
    if gap > 0:
        print(f"predicted {t['predicted']:,.0f}: the {t['step_ms']:,.0f} ms step must lose {gap:,.0f} ms "
              f"({gap / t['step_ms']:.1%}). One term alone would have to shrink by:")
    else:
        print(f"predicted {t['predicted']:,.0f}: meets it with {-gap:,.0f} ms of the {t['step_ms']:,.0f} ms step to "
              f"spare. One term alone could grow by this much before it does not:")
    for term in t["terms"]:
        change = term["alone_change"]
        need = "cannot alone" if change >= 1 else f"{abs(change):.0%}"
        print(f"  {CATEGORY_TITLES[term['term']]:6} {term['ms']:8,.0f} ms  {need}")
    print("levers (modeled), tokens/s/GPU:")
    for lever in t["levers"]:
        fits = "" if lever["fits"] else f", does not fit: {lever['memory_gib']:.0f} GiB"
        print(f"  {lever['lever']:60} {lever['tokens_per_s_per_gpu']:8,.0f}  (-r {lever['recompute']}{fits})")
    line = f"fp8 / bf16 on this plan: {t['fp8_over_bf16']:.2f}x (target {TARGET_FP8_SPEEDUP}x)"
    if t["speedup_must_lose_ms"] > 0:
        line += f"; for {TARGET_FP8_SPEEDUP}x the fp8 step must lose {t['speedup_must_lose_ms']:,.0f} ms (bf16 as it is)"
    print(line)


def print_grad_reduce_comparison(rows):
    print("\n== Gradient reduction, fp8 training (every multi-GPU row models the trainer's collectives)")
    print("wire B/el: bytes per gradient element sent as the trainer's records give them (fp8: E4M3 and its "
          "scales); IB B/el/NIC: bytes per element each NIC sends out of the node; comm stream: link time "
          "+ the reduction's kernels (BF16 conversions, FP8 quantize and dequantize-and-sum); exposed: comm stream "
          "past compute; comm %: exposed + the cost of what overlaps")
    table, skipped = [], set()
    for r in rows:
        if "skipped" in r:
            if (r["model"], r["gpus"]) not in skipped:  # the same reason for every reduction
                print(f"skipped {r['model']} on {r['gpus']}: {r['skipped']}")
                skipped.add((r["model"], r["gpus"]))
            continue
        wire = f"{r['grad_wire_bytes_per_element']:.2f}"
        table.append([r["model"], r["gpus"], r["grad_reduce"], r["zero"], wire,
                      f"{r['grad_inter_node_bytes_per_element_per_nic']:.3f}", f"{r['comm_total_ms']:,.0f}",
                      f"{r['grad_reduction_kernels_ms']:,.0f}", f"{r['comm_exposed_ms']:,.0f}",
                      f"{r['exposed_share']:.1%}", f"{r['comm_share']:.1%}", f"{r['step_ms']:,.0f}",
                      f"{r['tokens_per_s_per_gpu']:,.0f}"])
    print(markdown_table(["model", "GPUs", "reduce", "ZeRO", "wire B/el", "IB B/el/NIC", "comm stream ms",
                          "of it kernels ms", "exposed ms", "exposed %", "comm %", "step ms", "tok/s/GPU"], table))
