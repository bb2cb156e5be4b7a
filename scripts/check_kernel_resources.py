#!/usr/bin/env python3
"""Compile-time resource check of every CUDA kernel, no GPU needed.

Reads ptxas's resource report (`nvcc -Xptxas -v`, kept by the Makefile in build/ptxas/<binary>.log) and
checks each kernel against the launch sizes the source uses and the hard limits of compute capability
9.0, from the CUDA C++ Programming Guide, "Compute Capabilities", table "Technical Specifications per
Compute Capability" (and "Function Parameters" for the parameter limit):
  - 1024 threads per block;
  - 255 32-bit registers per thread; 64K 32-bit registers per block (checked as registers x threads per
    block, with the registers rounded up to ptxas's allocation unit of 8 per thread, 256 per warp, as the
    CUDA Occupancy Calculator allocates them);
  - 227 KB (232,448 bytes) of shared memory per block, static + dynamic; 48 KB of static shared memory
    ("Shared Memory": allocations above 48 KB per block must be dynamic, with the opt-in);
  - 512 KB of local memory (stack frame) per thread.
The block size of each kernel comes from the source: the third argument of its LAUNCH(kernel, grid,
block[, smem[, stream]]) calls (core/cuda_utils.cuh), a literal or a #define, and its __launch_bounds__.
A launch with dynamic shared memory needs a formula in DYNAMIC_SMEM below, evaluated at the largest shape
the presets of llama/config.h allow (T 4096, dim 8192, head size 128): an unknown one is an error.
  usage: scripts/check_kernel_resources.py [--root DIR] LOG...   (exit 1 when a kernel breaks a limit)
"""
import argparse
import os
import re
import subprocess
import sys

MAX_THREADS = 1024
MAX_REGS_THREAD = 255
MAX_REGS_BLOCK = 65536
REG_UNIT = 8  # registers per thread are allocated in units of 8 (256 per warp)
MAX_SMEM_BLOCK = 227 * 1024
MAX_STATIC_SMEM = 48 * 1024
MAX_LOCAL = 512 * 1024

# The largest shapes the presets allow (llama/config.h: llama2-70b dim 8192, max_seq_len 4096, HS 128).
SHAPE = {"T": 4096, "C": 8192, "HS": 128}
# dynamic shared memory (bytes) of each kernel launched with it, as the launch computes it
DYNAMIC_SMEM = {
    "attention_forward_fallback_kernel": lambda s: s["T"] * 4,  # cuda/attention.cuh: T floats
    "attention_backward_query_kernel": lambda s: 2 * s["T"] * 4,  # 2 T floats
    "attention_backward_key_kernel": lambda s: (2 * s["T"] + 2 * s["HS"]) * 4,  # 2 T + 2 HS floats
    "rmsnorm_backward_kernel": lambda s: s["C"] * 4,  # cuda/rmsnorm.cuh: C floats
}

SOURCE_DIRS = ["core", "cuda", "fp8", "comm", "llama", "model", "train", "dev/cuda"]
SOURCE_FILES = ["train_llama.cu", "test_llama.cu"]


def sources(root):
    for f in SOURCE_FILES:
        if os.path.exists(os.path.join(root, f)):
            yield os.path.join(root, f)
    for d in SOURCE_DIRS:
        for dirpath, _, names in os.walk(os.path.join(root, d)):
            for n in sorted(names):
                if n.endswith((".cu", ".cuh", ".h")):
                    yield os.path.join(dirpath, n)


def split_args(text):
    """Top-level comma-separated arguments of text (up to its closing parenthesis)."""
    args, depth, cur = [], 0, ""
    for ch in text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            if depth == 0:
                args.append(cur.strip())
                return args
            depth -= 1
        if ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += ch
    args.append(cur.strip())
    return args


def launch_sizes(paths):
    """{kernel base name: {"block": set of ints, "bounds": int or None, "dynamic": bool}} from the source."""
    defines, launches, bounds = {}, [], {}
    for p in paths:
        text = strip_comments(open(p, errors="replace").read())
        for m in re.finditer(r"^\s*#define\s+(\w+)\s+\(?\s*(\d+)\s*\)?\s*$", text, re.M):
            defines[m.group(1)] = int(m.group(2))
        for m in re.finditer(r"\bLAUNCH\(\s*([A-Za-z_]\w*)", text):
            if text[max(0, m.start() - 8):m.start()].endswith("define "):
                continue
            args = split_args(text[m.end():])
            launches.append((m.group(1), args, p))
        for m in re.finditer(r"__global__\s+void\s+__launch_bounds__\(\s*(\w+)[^)]*\)\s*(\w+)", text):
            bounds[m.group(2)] = m.group(1)
    out = {}
    for name, args, p in launches:
        # args[0] is what followed the name (a template argument list, or empty), then grid, block, smem
        rest = args[1:] if args and args[0] in ("", ) or (args and args[0].startswith("<")) else args
        if len(rest) < 2:
            continue
        block, smem = rest[1], (rest[2] if len(rest) > 2 else "0")
        e = out.setdefault(name, {"block": set(), "bounds": None, "dynamic": False, "where": p})
        e["block"].add(evaluate(block, defines, f"{p}: LAUNCH({name}) block"))
        if smem not in ("0", "0u"):
            e["dynamic"] = True
    for name, b in bounds.items():
        e = out.setdefault(name, {"block": set(), "bounds": None, "dynamic": False, "where": ""})
        e["bounds"] = evaluate(b, defines, f"__launch_bounds__ of {name}")
    return out


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def evaluate(expr, defines, what):
    expr = expr.strip()
    if re.fullmatch(r"\d+", expr):
        return int(expr)
    if expr in defines:
        return defines[expr]
    raise SystemExit(f"error: {what}: cannot evaluate block size '{expr}' (a literal or a #define is expected)")


def demangle(names):
    if not names:
        return {}
    try:
        r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True)
        return dict(zip(names, r.stdout.splitlines()))
    except (OSError, subprocess.CalledProcessError):  # no binutils: the name of _Z<length><name>...
        out = {}
        for n in names:
            m = re.match(r"_Z(\d+)", n)
            out[n] = n[m.end():m.end() + int(m.group(1))] + "(" if m else n
        return out


def base_name(demangled):
    """comm_store_kernel<float>(float*, ...) -> comm_store_kernel; void f(int) -> f."""
    head = demangled.split("(", 1)[0]
    head = re.sub(r"<.*>$", "", head).strip()
    return head.split()[-1].split("::")[-1] if head else demangled


def parse_ptxas(text):
    """Kernels ("entry functions") of a ptxas -v report: {mangled: {regs, smem, stack, spill_st, spill_ld, cmem}}."""
    kernels, current, entries, last_props = {}, None, set(), None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", line)
        if m:
            entries.add(m.group(1))
            continue
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            last_props = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and last_props:
            kernels.setdefault(last_props, {}).update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
            current = last_props
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            k = kernels.setdefault(current, {})
            k["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            k["smem"] = int(s.group(1)) if s else 0
            c = re.search(r"(\d+) bytes cmem\[0\]", line)
            k["cmem"] = int(c.group(1)) if c else 0
            current = None
    return {n: k for n, k in kernels.items() if n in entries and "regs" in k}


def check(reports, sizes):
    """Rows (kernel, regs, stack, smem static, smem dynamic, block, regs per block, reg margin, smem margin, problems)."""
    rows, seen = [], set()
    for mangled, k in sorted(reports.items(), key=lambda kv: kv[1]["pretty"]):
        name, pretty = k["base"], k["pretty"]
        if pretty in seen:
            continue
        seen.add(pretty)
        problems = []
        src = sizes.get(name)
        if src is None or (not src["block"] and src["bounds"] is None):
            problems.append("no LAUNCH or __launch_bounds__ in the source gives its block size")
            block = MAX_THREADS  # the worst case
        else:
            block = max(list(src["block"]) + ([src["bounds"]] if src["bounds"] else []))
            if src["bounds"] is not None and src["block"] and max(src["block"]) > src["bounds"]:
                problems.append(f"launched with {max(src['block'])} threads above __launch_bounds__({src['bounds']})")
        dyn = 0
        if src is not None and src["dynamic"]:
            if name not in DYNAMIC_SMEM:
                problems.append("launched with dynamic shared memory that DYNAMIC_SMEM has no formula for")
            else:
                dyn = DYNAMIC_SMEM[name](SHAPE)
        regs_alloc = -(-max(k["regs"], 1) // REG_UNIT) * REG_UNIT
        per_block = regs_alloc * (-(-block // 32) * 32)
        smem_total = k["smem"] + dyn
        if block > MAX_THREADS:
            problems.append(f"{block} threads per block > {MAX_THREADS}")
        if k["regs"] > MAX_REGS_THREAD:
            problems.append(f"{k['regs']} registers per thread > {MAX_REGS_THREAD}")
        if per_block > MAX_REGS_BLOCK:
            alloc = "" if regs_alloc == k["regs"] else f" ({k['regs']} used)"
            problems.append(f"{regs_alloc} registers{alloc} x {block} threads = {per_block} > {MAX_REGS_BLOCK}")
        if k["smem"] > MAX_STATIC_SMEM:
            problems.append(f"{k['smem']} bytes of static shared memory > {MAX_STATIC_SMEM}")
        if smem_total > MAX_SMEM_BLOCK:
            problems.append(f"{smem_total} bytes of shared memory > {MAX_SMEM_BLOCK}")
        if k.get("stack", 0) > MAX_LOCAL:
            problems.append(f"{k['stack']} bytes of stack > {MAX_LOCAL}")
        rows.append((pretty, k["regs"], k.get("stack", 0), k["smem"], dyn, block, per_block,
                     MAX_REGS_BLOCK - per_block, MAX_SMEM_BLOCK - smem_total, k.get("spill_st", 0), problems))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                    help="the source tree whose LAUNCH calls give the block sizes")
    ap.add_argument("--extra-source", action="append", default=[], help="one more source file to read launches from")
    ap.add_argument("logs", nargs="+", help="ptxas -v reports (build/ptxas/*.log)")
    a = ap.parse_args()
    reports = {}
    for log in a.logs:
        reports.update(parse_ptxas(open(log, errors="replace").read()))
    if not reports:
        print("error: no kernel in " + " ".join(a.logs) + " (built with -Xptxas -v?)")
        return 1
    names = demangle(list(reports))
    for m, k in reports.items():
        k["pretty"] = base_name(names[m]) + (re.search(r"<.*?>(?=\()", names[m]).group(0) if re.search(r"<.*?>(?=\()", names[m]) else "")
        k["base"] = base_name(names[m])
    sizes = launch_sizes(list(sources(a.root)) + a.extra_source)
    rows = check(reports, sizes)
    fmt = "%-44s %5s %6s %7s %7s %6s %9s %10s %10s %6s"
    print(fmt % ("kernel", "regs", "stack", "smem", "dynsmem", "block", "regs/blk", "reg margin", "smem margin", "spill"))
    bad = 0
    for r in rows:
        print(fmt % tuple(str(x) for x in r[:10]) + ("" if not r[10] else "  FAIL: " + "; ".join(r[10])))
        bad += bool(r[10])
    print(f"{len(rows)} kernels, {bad} over a limit of compute capability 9.0 "
          f"(dynamic shared memory at T {SHAPE['T']}, dim {SHAPE['C']}, head size {SHAPE['HS']})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
