#!/usr/bin/env bash
# Installs what llm8 needs and is missing, and says what it installs:
#   Debian: OpenBLAS (CPU GEMMs, OpenMP build), OpenMPI (multi-rank launch), cJSON (data set manifests),
#           Boost.Context (the emulated GPU's fibers: make emu),
#           a C/C++ toolchain (gcc's ASan/UBSan runtimes come with it: `make SANITIZE=1`), clang and its
#           runtime with libFuzzer (`make fuzz`);
#   PyPI:   numpy, sentencepiece (tokenizing), ml_dtypes (FP8 test reference), matplotlib (loss plots),
#           safetensors (HF checkpoint interop), pytest, nvidia-cudnn-frontend 1.32.0 (header-only cuDNN graph
#           API; pinned: emu/cudnn.cpp, the emulated GPU's cuDNN, interprets the graphs this release emits),
#           zstandard and pyarrow (reading .jsonl.zst and .parquet corpora in dev/data/tokenize.py),
#           transformers 4.57 with JAX and Flax on the CPU (the reference Llama and Llama-2 tokenizer of
#           dev/test/test_eval_parity.py: about 0.9 GB and 45 s, where torch's CUDA wheels take 5.6 GB and
#           2 min; transformers 5 has no Flax models, hence the pin).
# Optional (LLM8_OPTIONAL_TESTS=1): torch and mmaemu, the oracle of dev/test/test_hopper_accum.py (the
# Hopper accumulation model against the bits an H100's cuBLASLt returns); about 3 GB with torch's CUDA
# wheels; the test skips without them, and nothing else needs them.
# The CUDA toolkit (nvcc, cuBLASLt, cuDNN, NCCL) is not installed here: the GPU build is skipped without
# nvcc. Runs as root or through sudo. Set PYTHON to choose the interpreter (default python3).
set -euo pipefail
PYTHON=${PYTHON:-python3}

if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null; then SUDO="sudo"; else
    echo "error: setup needs root or sudo to install Debian packages" >&2; exit 1; fi

missing_apt=()
have_header() { echo "#include <$1>" | ${CC:-gcc} -E -x c - >/dev/null 2>&1; }
command -v gcc >/dev/null || missing_apt+=(build-essential)
command -v g++ >/dev/null || missing_apt+=(g++)
have_header cblas.h && ldconfig -p | grep -q libopenblas || missing_apt+=(libopenblas-openmp-dev)
command -v mpirun >/dev/null || missing_apt+=(openmpi-bin libopenmpi-dev)
have_header cjson/cJSON.h || missing_apt+=(libcjson-dev)
# Boost.Context's fcontext: the emulated GPU's user-space thread switches (make emu)
echo '#include <boost/context/detail/fcontext.hpp>' | ${CXX:-g++} -E -x c++ - >/dev/null 2>&1 || missing_apt+=(libboost-context-dev)
# strace: a test checks that each error line reaches stderr in one write (ranks share one stderr)
command -v strace >/dev/null || missing_apt+=(strace)
command -v clang >/dev/null || missing_apt+=(clang)
# libFuzzer ships in clang's runtime package, which clang only recommends
fuzzer_runtime=$(clang -print-file-name="libclang_rt.fuzzer-$(uname -m).a" 2>/dev/null || true)
[ -f "$fuzzer_runtime" ] || missing_apt+=(libclang-rt-dev)
if [ ${#missing_apt[@]} -gt 0 ]; then
    if ! command -v apt-get >/dev/null; then
        echo "error: missing ${missing_apt[*]} and no apt-get to install them; install them by hand" >&2; exit 1
    fi
    echo "setup: installing Debian packages: ${missing_apt[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing_apt[@]}"
fi

command -v "$PYTHON" >/dev/null || { echo "error: $PYTHON not found (install python3 and python3-pip)" >&2; exit 1; }
# The PyPI packages of "module:package[==version]" specs whose module is missing (or, pinned, at another version).
missing_modules() {
    for spec in "$@"; do
        module=${spec%%:*} package=${spec#*:}
        "$PYTHON" -c "import importlib.util, importlib.metadata as m, sys
sys.exit(importlib.util.find_spec('$module') is None or ('==' in '$package' and m.version('${package%%==*}') != '${package##*==}'))" \
            2>/dev/null || echo "$package"
    done
}
# pip install of the packages given, saying what for ($1).
pip_install() {
    local what=$1; shift
    [ $# -gt 0 ] || return 0
    echo "setup: installing $what: $*"
    if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
        echo "error: $PYTHON has no pip (apt-get install python3-pip)" >&2; exit 1
    fi
    # Debian's system Python refuses pip installs (PEP 668) unless told otherwise.
    "$PYTHON" -m pip install -q "$@" 2>/dev/null || "$PYTHON" -m pip install -q --break-system-packages "$@"
}
mapfile -t missing_pip < <(missing_modules numpy:numpy sentencepiece:sentencepiece ml_dtypes:ml_dtypes \
    matplotlib:matplotlib safetensors:safetensors pytest:pytest cudnn:nvidia-cudnn-frontend==1.32.0 zstandard:zstandard \
    pyarrow:pyarrow)
pip_install "PyPI packages" "${missing_pip[@]}"
# pinned together: FlaxLlamaForCausalLM is in transformers 4.x only, and these jax/flax run it
mapfile -t missing_hf < <(missing_modules jax:jax==0.6.2 jaxlib:jaxlib==0.6.2 flax:flax==0.10.7 \
    transformers.models.llama.modeling_flax_llama:transformers==4.57.6)
pip_install "the reference Llama (transformers on JAX/Flax)" "${missing_hf[@]}"
if [ "${LLM8_OPTIONAL_TESTS:-0}" = 1 ]; then
    mapfile -t missing_opt < <(missing_modules torch:torch mmaemu:mmaemu==0.1.0)
    pip_install "optional test packages (LLM8_OPTIONAL_TESTS=1)" "${missing_opt[@]}"
fi
echo "setup: all dependencies present"
