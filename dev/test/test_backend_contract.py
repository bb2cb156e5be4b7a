"""
The backend contract (llama/backend.h) is enforced by the compilers: a backend op whose signature drifts
from its prototype must fail to compile, in the CPU build (gcc: conflicting types) and in the GPU build
(nvcc: the unmatched prototype is "referenced but not defined", an error through the Makefile's flags).
Each test compiles a copy of the sources with one signature changed, using the exact compile command
`make` would run, and first checks that the unchanged copy compiles (so the error is the drift's).
"""
import shlex
import shutil
import subprocess

import pytest

from conftest import REPO

SOURCE_SUFFIXES = (".h", ".cuh", ".c", ".cu", ".cpp")
# The N of op_swiglu_forward becomes an int: a plausible drift that C would otherwise convert silently.
DRIFTS = {
    "cpu/backend.h": ("static inline void op_swiglu_forward(act_t* out, const act_t* inp, size_t N, int F, Fp8Scale* amax) {",
                      "static inline void op_swiglu_forward(act_t* out, const act_t* inp, int N, int F, Fp8Scale* amax) {"),
    "cuda/swiglu.cuh": ("static inline void op_swiglu_forward(act_t* out, const act_t* inp, size_t N, int F, Fp8Scale* amax) {",
                        "static inline void op_swiglu_forward(act_t* out, const act_t* inp, int N, int F, Fp8Scale* amax) {"),
}


def make_command(target, source):
    """The compiler command `make` runs for `target` (from a dry run), as an argument list."""
    out = subprocess.run(["make", "-n", "-B", target], cwd=REPO, capture_output=True, text=True).stdout
    for line in out.splitlines():
        args = shlex.split(line)
        # the compiler's own arguments end where the recipe's shell takes over (the GPU rules save
        # ptxas's report with "2> build/ptxas/...; rc=$?; ...")
        shell = [i for i, a in enumerate(args) if a.startswith(("2>", ">", ";", "&&", "|")) or a.endswith(";")]
        args = args[:shell[0]] if shell else args
        if source in args and "-o" in args:
            return args
    pytest.skip(f"make has no command building {target} from {source} here")


def copy_sources(dst):
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    for name in files:
        if name.endswith(SOURCE_SUFFIXES):
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dst / name)


def syntax_only(args, cuda):
    """The compile command reduced to its front end: no objects, no linking."""
    keep = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a.endswith((".o", ".a")) or a.startswith("-l"):
            continue
        keep.append(a)
    return keep + (["--cuda", "-o", "/dev/null"] if cuda else ["-fsyntax-only"])


@pytest.mark.parametrize("build", ["cpu", "cuda"])
def test_drifted_signature_fails_to_compile(tmp_path, build):
    cuda = build == "cuda"
    target, source, backend = ("train_llama", "train_llama.cu", "cuda/swiglu.cuh") if cuda else \
        ("train_llama_cpu", "train_llama.c", "cpu/backend.h")
    cmd = syntax_only(make_command(target, source), cuda)
    copy_sources(tmp_path)
    clean = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    assert clean.returncode == 0, f"the unchanged sources do not compile:\n{clean.stderr[-2000:]}"

    path = tmp_path / backend
    old, new = DRIFTS[backend]
    text = path.read_text()
    assert text.count(old) == 1, f"{backend} no longer defines op_swiglu_forward as this test expects"
    path.write_text(text.replace(old, new))
    drifted = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    print(drifted.stderr[-2000:])
    assert drifted.returncode != 0, "a backend op with a drifted signature compiled"
    expect = "conflicting types for" if not cuda else "was referenced but not defined"
    assert expect in drifted.stderr and "op_swiglu_forward" in drifted.stderr
