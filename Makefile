# llm8 build. `make train` prepares tiny-shakespeare, builds and trains; `make test` builds everything
# (the CUDA targets too when nvcc is found) and runs the test suite. `make help` lists the targets.

CC ?= gcc
PYTHON ?= python3
# Installs what is missing (Debian: OpenBLAS, OpenMPI, cJSON; PyPI: numpy, sentencepiece, ml_dtypes, ...)
# once, before anything below looks for it (mpicc, cJSON), unless the target is setup, clean or help.
SETUP_STAMP = build/.setup-done
ifeq ($(wildcard $(SETUP_STAMP)),)
  ifneq ($(filter-out setup clean help,$(or $(MAKECMDGOALS),all)),)
    $(info setup: first build here: installing what is missing (bash scripts/setup.sh))
    SETUP_OUTPUT := $(shell PYTHON=$(PYTHON) bash scripts/setup.sh >&2 && mkdir -p build && touch $(SETUP_STAMP) && echo ok)
    $(if $(SETUP_OUTPUT),,$(error setup failed: see the messages above, or run bash scripts/setup.sh))
  endif
endif
CFLAGS ?= -O3 -march=native
CFLAGS += -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -fopenmp -Wall -Wextra
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(shell command -v nvcc 2>/dev/null || (test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc))
# cuda_fp8.h is the FP8 conversion both builds use; the CPU build needs only the header.
CUDA_INCLUDE ?= $(CUDA_HOME)/include
CPU_INCLUDES = -I$(CUDA_INCLUDE)
# CPU GEMMs: OpenBLAS (make setup installs it); BLAS=none uses a slow built-in loop instead, for hosts
# where nothing can be installed (the device check on a GPU machine).
BLAS ?= openblas
ifeq ($(BLAS),none)
  CPU_INCLUDES += -DLLM8_NO_BLAS
  CPU_LIBS = -lm
else
  CPU_LIBS = -lopenblas -lm
endif

# MPI (multi-rank launch, docs/design.md#bootstrap): Open MPI from Debian (make setup), found through mpicc.
# USE_MPI=0 builds single-rank binaries that need no MPI (a GPU host without it, for instance).
USE_MPI ?= $(if $(shell command -v mpicc 2>/dev/null),1,0)
ifeq ($(USE_MPI),1)
  MPI_CFLAGS := -DLLM8_MPI $(shell mpicc --showme:compile 2>/dev/null || mpicc -compile_info 2>/dev/null | cut -d' ' -f2-)
  MPI_LIBS := $(shell mpicc --showme:link 2>/dev/null || mpicc -link_info 2>/dev/null | cut -d' ' -f2-)
endif
# cJSON (Debian's libcjson-dev, make setup) reads the data sets' manifest.json; USE_CJSON=0 builds without
# the check (a GPU host where nothing can be installed).
USE_CJSON ?= $(shell echo '#include <cjson/cJSON.h>' | $(CC) -E -x c - >/dev/null 2>&1 && echo 1 || echo 0)
ifeq ($(USE_CJSON),1)
  CPU_INCLUDES += -DLLM8_CJSON
  CPU_LIBS += -lcjson
endif
# The build id every rank compares at start-up (git describe of the tree, "unknown" outside git).
BUILD_ID := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
CPU_INCLUDES += $(MPI_CFLAGS) -DLLM8_BUILD_ID='"$(BUILD_ID)"'
CPU_LIBS += $(MPI_LIBS) -lpthread

# GPU build: sm_90 (H100/H200/H800) by default; `make train_llama GPU_ARCH=89` for Ada.
GPU_ARCH ?= 90
# --diag-error 114 ("referenced but not defined"): a backend function whose signature drifts from its
# prototype in llama/backend.h is, in C++, a new overload; this makes the unmatched prototype an error.
NVCC_FLAGS ?= -O3 -std=c++17 -gencode arch=compute_$(GPU_ARCH),code=sm_$(GPU_ARCH) --expt-relaxed-constexpr \
	-Xcompiler -fopenmp -Xcompiler -Wall --diag-error 114
CUDA_LIBS = -lcublasLt -lnccl -lgomp $(filter-out -pthread,$(MPI_LIBS)) -lpthread
NVCC_FLAGS += $(filter -I% -D%,$(MPI_CFLAGS)) -DLLM8_BUILD_ID='"$(BUILD_ID)"'
ifeq ($(USE_CJSON),1)
  NVCC_FLAGS += -DLLM8_CJSON
  CUDA_LIBS += -lcjson
endif
CXX ?= g++
# The cuDNN frontend is header-only and ships in the nvidia-cudnn-frontend wheel; its attention graphs
# live in one host-compiled file (cuda/cudnn_att.cpp, ~45 s with g++) so editing the trainer never
# recompiles them. USE_CUDNN=0 builds the plain fallback attention instead.
CUDNN_FRONTEND_INCLUDE ?= $(shell $(PYTHON) -c "import os,sysconfig; p=os.path.join(sysconfig.get_paths()['purelib'],'include'); print(p if os.path.exists(os.path.join(p,'cudnn_frontend.h')) else '')" 2>/dev/null)
# A build/cudnn_att.o compiled elsewhere (same x86-64 Linux) is used as is when the headers are missing.
CUDNN_PREBUILT = $(if $(CUDNN_FRONTEND_INCLUDE),,$(wildcard build/cudnn_att.o))
USE_CUDNN ?= $(if $(or $(CUDNN_FRONTEND_INCLUDE),$(CUDNN_PREBUILT)),1,0)
# The frontend's JSON (de)serialization is unused here and is half of its compile time. The tests' copies
# with a planted fault build it with CUDNN_ATT_O=-O0 (half the time).
CUDNN_ATT_O ?= -O2
CUDNN_ATT_FLAGS = $(CUDNN_ATT_O) -std=c++17 -fPIC -Wall -Wextra -DCUDNN_FRONTEND_SKIP_JSON_LIB
ifeq ($(USE_CUDNN)$(origin USE_CUDNN),0file)
  ifneq ($(NVCC),)
    $(info note: no cuDNN frontend headers (pip install nvidia-cudnn-frontend): the GPU build uses the slow fallback attention)
  endif
endif
ifeq ($(USE_CUDNN),1)
  CUDNN_OBJ = build/cudnn_att.o
  NVCC_FLAGS += -DUSE_CUDNN
  # frontend >= 1.3x references NVRTC (its runtime-compiled norm engines) even when only SDPA is used
  CUDA_LIBS += -lcudnn -lnvrtc
endif

DATA_DIR ?= dev/data/tinyshakespeare
TRAIN_DATA = $(DATA_DIR)/tiny_shakespeare_train.bin

# One folder per layer (docs/layout.md); every build depends on all of their headers.
HEADERS = $(wildcard core/*.h fp8/*.h llama/*.h cpu/*.h comm/*.h model/*.h train/*.h dataloader/*.h)
CUDA_HEADERS = $(wildcard core/*.cuh fp8/*.cuh cuda/*.cuh cuda/*.h comm/*.cuh)
TEST_HEADERS = $(wildcard dev/test/*.h)
# the kernel cases: the index and one file per op family
KERNEL_CASES = dev/cuda/kernel_cases.cuh $(wildcard dev/cuda/cases/*.cuh)

# SANITIZE=1 (`make SANITIZE=1 cpu`): the CPU binaries built with AddressSanitizer + UndefinedBehavior-
# Sanitizer into build/sanitize/, beside the normal ones rather than over them; `make test` builds them
# and runs its tests marked `sanitize` on them too. -O1 keeps the runs fast enough to test.
SANITIZE_DIR = build/sanitize
SANITIZE_FLAGS = -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
SANITIZED_CPU_TARGETS = $(SANITIZE_DIR)/train_llama_cpu $(SANITIZE_DIR)/test_llama_cpu
$(SANITIZE_DIR)/%: CFLAGS += $(SANITIZE_FLAGS)

ifeq ($(SANITIZE),1)
  CPU_TARGETS = $(SANITIZED_CPU_TARGETS)
  GPU_TARGETS =
else
  CPU_TARGETS = train_llama_cpu test_llama_cpu
  GPU_TARGETS = $(if $(NVCC),train_llama test_llama,)
endif

# libFuzzer harnesses (dev/fuzz, clang from Debian; not part of `all`): one per reader of untrusted
# input (the manifest's needs cJSON). `make fuzz FUZZ_SECONDS=N` runs each for N seconds from its seeds
# and committed regressions.
FUZZ_CC ?= clang
FUZZ_FLAGS = -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -std=c11 -D_GNU_SOURCE -Wall -Wextra
FUZZ_HARNESSES = shard model state tokenizer cli manifest evals
FUZZ_BINS = $(FUZZ_HARNESSES:%=build/fuzz/fuzz_%)
FUZZ_SEEDS = build/fuzz/seeds/.done
FUZZ_SECONDS ?= 60

.PHONY: all cpu gpu train test setup data clean help fp8-vs-bf16 figures fuzz fuzz-build test-build device-prepare

all: $(CPU_TARGETS) $(GPU_TARGETS)
cpu: $(CPU_TARGETS)
gpu: train_llama test_llama

help:
	@echo "make train        prepare tiny-shakespeare, build, train a small Llama (GPU build if a GPU is present)"
	@echo "make test         build everything and run the test suite"
	@echo "make all          build train_llama_cpu test_llama_cpu (+ train_llama test_llama with nvcc)"
	@echo "make fp8-vs-bf16  train the same seed in bf16 and fp8 on tiny-shakespeare and compare the losses"
	@echo "make figures      retrain bf16 and fp8 (CPU build, 2 runs of 7-20 min) and redraw docs/images/loss_fp8_vs_bf16.png"
	@echo "make fuzz FUZZ_SECONDS=N  run each libFuzzer harness (dev/fuzz) for N seconds (default 60)"
	@echo "make SANITIZE=1 cpu  build train_llama_cpu and test_llama_cpu with ASan + UBSan into build/sanitize/"
	@echo "make setup        install the Debian and PyPI packages llm8 needs"
	@echo "make clean        remove build outputs"
	@echo "make dev/cuda/bench_kernels  kernel playground: every GPU op vs its CPU op, timed at Llama-2 7B/13B shapes"
	@echo "make build/tools/bench_gemm  FP8 vs BF16 GEMM TFLOP/s of a Llama-2 7B/13B block (dev/tools/, docs/layout.md)"
	@echo "make device-prepare  prepare build/device for scripts/device_check.sh on a GPU machine (prints what to carry)"
	@echo "make build/time_cpu_reference [BLAS=none]  time the CPU side of test_llama's production checks (no GPU)"

# Installs what is missing (Debian: OpenBLAS, OpenMPI; PyPI: numpy, sentencepiece, ml_dtypes, ...).
$(SETUP_STAMP): scripts/setup.sh
	PYTHON=$(PYTHON) bash scripts/setup.sh
	@mkdir -p build && touch $@
setup:
	PYTHON=$(PYTHON) bash scripts/setup.sh
	@mkdir -p build && touch $(SETUP_STAMP)

train_llama_cpu $(SANITIZE_DIR)/train_llama_cpu: train_llama.c $(HEADERS) | $(SETUP_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(CPU_INCLUDES) $< -o $@ $(CPU_LIBS)

test_llama_cpu $(SANITIZE_DIR)/test_llama_cpu: test_llama.c train_llama.c $(HEADERS) $(TEST_HEADERS) | $(SETUP_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(CPU_INCLUDES) $< -o $@ $(CPU_LIBS)

# dev/tools/ (docs/layout.md): programs apart from the tests. numerics exposes the CPU build's numeric code
# to the Python tests; write_shard writes the device check's random shard; bench_gemm times the GPU's GEMMs.
TOOLS_DIR = build/tools
CPU_TOOLS = $(TOOLS_DIR)/numerics $(TOOLS_DIR)/write_shard
$(CPU_TOOLS): $(TOOLS_DIR)/%: dev/tools/%.c $(HEADERS) | $(SETUP_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(CPU_INCLUDES) $< -o $@ $(CPU_LIBS)

$(TOOLS_DIR)/bench_gemm: dev/tools/bench_gemm.cu $(HEADERS) $(CUDA_HEADERS) $(CUDNN_OBJ) | $(SETUP_STAMP)
	@mkdir -p $(@D) $(PTXAS_LOG)
	$(NVCC) $(NVCC_FLAGS) $< $(CUDNN_OBJ) -o $@ $(CUDA_LIBS) $(PTXAS_V)

# The CPU backend as its own object with prefixed names (cpu_ref_*): what test_llama and the kernel
# playground compare every GPU op with.
build/cpu_reference.o: dev/cuda/cpu_reference.c dev/cuda/cpu_reference.h $(HEADERS) | $(SETUP_STAMP)
	@mkdir -p build
	$(CC) $(CFLAGS) $(CPU_INCLUDES) -c $< -o $@

build/cudnn_att.o: $(if $(CUDNN_PREBUILT),,cuda/cudnn_att.cpp cuda/cudnn_att.h core/common.h core/cuda_check.h) | $(SETUP_STAMP)
	@test -n "$(CUDNN_FRONTEND_INCLUDE)" || { echo "error: cuDNN frontend headers not found (pip install nvidia-cudnn-frontend), or build with USE_CUDNN=0"; exit 1; }
	@mkdir -p build
	$(CXX) $(CUDNN_ATT_FLAGS) -I$(CUDA_INCLUDE) -isystem $(CUDNN_FRONTEND_INCLUDE) -c $< -o $@

# Both GPU binaries keep ptxas's resource report (-Xptxas -v: registers, static shared memory, stack and
# spills of every kernel) in build/ptxas/<binary>.log, for scripts/check_kernel_resources.py (make test);
# its "ptxas info" lines stay out of the build output.
PTXAS_LOG = build/ptxas
PTXAS_V = -Xptxas -v 2> $(PTXAS_LOG)/$(notdir $@).log; rc=$$?; grep -v -e '^ptxas info' -e '^    [0-9]* bytes stack frame' $(PTXAS_LOG)/$(notdir $@).log >&2; exit $$rc

train_llama: train_llama.cu $(HEADERS) $(CUDA_HEADERS) $(CUDNN_OBJ) | $(SETUP_STAMP)
	@mkdir -p $(PTXAS_LOG)
	$(NVCC) $(NVCC_FLAGS) $< $(CUDNN_OBJ) -o $@ $(CUDA_LIBS) $(PTXAS_V)

# test_llama links the CPU reference object (the kernel checks compare each GPU op with its CPU op), so
# it also needs the CPU build's BLAS and OpenMP.
test_llama: test_llama.cu train_llama.cu $(KERNEL_CASES) build/cpu_reference.o $(HEADERS) $(CUDA_HEADERS) $(TEST_HEADERS) $(CUDNN_OBJ) | $(SETUP_STAMP)
	@mkdir -p $(PTXAS_LOG)
	$(NVCC) $(NVCC_FLAGS) $< build/cpu_reference.o $(CUDNN_OBJ) -o $@ $(CUDA_LIBS) $(CPU_LIBS) $(PTXAS_V)

# The emulated GPU (emu/, docs/emulated-gpu.md): train_llama.cu and test_llama.cu compiled as C++
# by g++ against emu/'s runtime, with ASan, and the doubles of cuBLASLt, cuDNN and NCCL; no nvcc, no GPU.
# With USE_CUDNN (the default where the frontend headers are) they link the GPU build's own
# build/cudnn_att.o against the cuDNN double; USE_CUDNN=0 builds them with the fallback attention alone.
# EMU_ASAN=0 builds without ASan.
EMU_DIR = build/emu
EMU_ASAN ?= 1
# test_emu.py builds its planted-fault copies with EMU_O=-O0: half the compile time, the same checks.
# -finline-small-functions inlines the toolkit's bf16 conversions (static, not inline, for g++): -15% of an
# emulated step's CPU time at no extra compile time.
EMU_O ?= -O1 -finline-small-functions
EMU_CXXFLAGS = -x c++ -std=c++17 -DOMPI_SKIP_MPICXX=1 -DMPICH_SKIP_MPICXX=1 $(EMU_O) -g -fno-omit-frame-pointer -fopenmp -Wall -Wno-unknown-pragmas -DLLM8_EMU=1 -Iemu -I$(CUDA_INCLUDE) \
	$(filter -I% -D%,$(MPI_CFLAGS)) -DLLM8_BUILD_ID='"$(BUILD_ID)"' $(if $(filter 1,$(USE_CJSON)),-DLLM8_CJSON) \
	$(if $(filter 1,$(EMU_ASAN)),-fsanitize=address)
EMU_LIBS = -lboost_context -lgomp $(filter-out -pthread,$(MPI_LIBS)) -lpthread $(if $(filter 1,$(USE_CJSON)),-lcjson) \
	$(if $(filter 1,$(EMU_ASAN)),-fsanitize=address -static-libasan)
EMU_RUNTIME_SRCS = emu/runtime.cpp emu/nvtx.cpp emu/sanitizer_defaults.cpp
EMU_LIB_SRCS = $(wildcard emu/cublaslt.cpp emu/nccl.cpp) $(if $(wildcard emu/nccl.cpp),,emu/nccl_stub.cpp) \
	$(if $(filter 1,$(USE_CUDNN)),emu/cudnn.cpp)
# The trainer and its checks with cuDNN: the double above and the GPU build's glue object.
EMU_CUDNN_FLAGS = $(if $(filter 1,$(USE_CUDNN)),-DUSE_CUDNN)
EMU_OBJS = $(patsubst emu/%.cpp,$(EMU_DIR)/%.o,$(EMU_RUNTIME_SRCS) $(EMU_LIB_SRCS))
EMU_HEADERS = $(wildcard emu/*.h emu/cub/block/*.cuh)
.PHONY: emu
emu: $(EMU_DIR)/train_llama $(EMU_DIR)/test_llama $(EMU_DIR)/test_intrinsics $(EMU_DIR)/attention_smem

# The library doubles' CPU GEMMs are most of an emulated step: optimized (still under ASan).
$(EMU_DIR)/cublaslt.o $(EMU_DIR)/cudnn.o: EMU_OPT = -O3 -march=native
$(EMU_DIR)/%.o: emu/%.cpp $(EMU_HEADERS) | $(SETUP_STAMP)
	@mkdir -p $(@D)
	$(CXX) $(filter-out -x c++,$(EMU_CXXFLAGS)) $(EMU_OPT) -c $< -o $@

$(EMU_DIR)/train_llama: train_llama.cu $(EMU_OBJS) $(CUDNN_OBJ) $(HEADERS) $(CUDA_HEADERS) $(EMU_HEADERS) | $(SETUP_STAMP)
	@mkdir -p $(@D)
	$(CXX) $(EMU_CXXFLAGS) $(EMU_CUDNN_FLAGS) $< -x none $(EMU_OBJS) $(CUDNN_OBJ) -o $@ $(EMU_LIBS)

$(EMU_DIR)/test_llama: test_llama.cu train_llama.cu $(KERNEL_CASES) build/cpu_reference.o $(EMU_OBJS) $(CUDNN_OBJ) $(HEADERS) $(CUDA_HEADERS) $(TEST_HEADERS) $(EMU_HEADERS) | $(SETUP_STAMP)
	@mkdir -p $(@D)
	$(CXX) $(EMU_CXXFLAGS) $(EMU_CUDNN_FLAGS) $< -x none build/cpu_reference.o $(EMU_OBJS) $(CUDNN_OBJ) -o $@ $(EMU_LIBS) $(CPU_LIBS)

# The fallback attention's backward launched at a shape needing > 48 KiB of shared memory (test_emu.py).
$(EMU_DIR)/attention_smem: emu/tests/attention_smem.cpp $(EMU_OBJS) $(HEADERS) $(CUDA_HEADERS) $(EMU_HEADERS) | $(SETUP_STAMP)
	@mkdir -p $(@D)
	$(CXX) $(EMU_CXXFLAGS) -I. $< -x none $(EMU_OBJS) -o $@ $(EMU_LIBS)

# The intrinsics, barrier and block reduction of emu/ against NVIDIA's documentation (dev/test/test_emu.py).
$(EMU_DIR)/test_intrinsics: emu/tests/test_intrinsics.cpp $(EMU_DIR)/runtime.o $(EMU_DIR)/nvtx.o $(EMU_HEADERS) | $(SETUP_STAMP)
	@mkdir -p $(@D)
	$(CXX) $(EMU_CXXFLAGS) $< -x none $(EMU_DIR)/runtime.o $(EMU_DIR)/nvtx.o -o $@ $(EMU_LIBS)

# Kernel playground (not part of `all`): every GPU op against the CPU reference object, like test_llama.
# The CPU side of test_llama's production checks, timed (scripts/device_check.sh budgets from it; no GPU).
build/time_cpu_reference: dev/cuda/time_cpu_reference.c build/cpu_reference.o $(HEADERS) | $(SETUP_STAMP)
	$(CC) $(CFLAGS) $(CPU_INCLUDES) $< build/cpu_reference.o -o $@ $(CPU_LIBS)

dev/cuda/bench_kernels: dev/cuda/bench_kernels.cu $(KERNEL_CASES) build/cpu_reference.o $(HEADERS) $(CUDA_HEADERS) $(CUDNN_OBJ) | $(SETUP_STAMP)
	@mkdir -p $(PTXAS_LOG)
	$(NVCC) $(NVCC_FLAGS) $< build/cpu_reference.o $(CUDNN_OBJ) -o $@ $(CUDA_LIBS) $(CPU_LIBS) $(PTXAS_V)

build/fuzz/fuzz_%: dev/fuzz/fuzz_%.c dev/fuzz/fuzz.h dev/fuzz/fuzz_inputs.h $(HEADERS) | $(SETUP_STAMP)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_FLAGS) -I$(CUDA_INCLUDE) $(if $(filter 1,$(USE_CJSON)),-DLLM8_CJSON) $< -o $@ -lm $(if $(filter 1,$(USE_CJSON)),-lcjson)

build/fuzz/make_seeds: dev/fuzz/make_seeds.c dev/fuzz/fuzz_inputs.h $(HEADERS) | $(SETUP_STAMP)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(CPU_INCLUDES) $< -o $@ -lm

$(FUZZ_SEEDS): build/fuzz/make_seeds
	rm -rf $(@D)
	build/fuzz/make_seeds $(@D)
	touch $@

fuzz-build: $(FUZZ_BINS) $(FUZZ_SEEDS)
fuzz: fuzz-build
	bash dev/fuzz/fuzz.sh $(FUZZ_SECONDS) $(FUZZ_HARNESSES)

# Tokenized tiny-shakespeare (from ../shared/data when present, else downloaded: dev/data/llm8_data.py).
$(TRAIN_DATA): dev/data/tinyshakespeare.py dev/data/llm8_data.py dev/data/llm8_corpus.py | $(SETUP_STAMP)
	$(PYTHON) dev/data/tinyshakespeare.py --out $(DATA_DIR)
data: $(TRAIN_DATA)

# The default run: the `tiny` preset for one epoch of tiny-shakespeare, with samples and FP8 statistics.
TRAIN_FLAGS ?= -o $(TRAIN_DIR) -s 80 -g 64 --fp8-stats 20
HAS_GPU = $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
TRAIN_DIR = runs/tinyshakespeare
train: $(TRAIN_DATA) $(if $(and $(HAS_GPU),$(NVCC)),train_llama,train_llama_cpu)
	rm -rf $(TRAIN_DIR)
	./$(if $(and $(HAS_GPU),$(NVCC)),train_llama,train_llama_cpu) $(TRAIN_FLAGS)

# Everything the tests run, for one parallel build (.ci/run: make -j2 test-build ...; then make test).
test-build: all train_llama_cpu test_llama_cpu $(SANITIZED_CPU_TARGETS) $(CPU_TOOLS) fuzz-build
# Without the shared data (and no network) the tests that need tiny-shakespeare are skipped, saying why.
test: test-build
	@$(MAKE) --no-print-directory data || echo "warning: tiny-shakespeare not prepared; the tests that need it will be skipped"
	$(PYTHON) -m pytest dev/test -q -rs -p no:cacheprovider --durations=25

fp8-vs-bf16: train_llama_cpu $(TRAIN_DATA)
	bash scripts/fp8_vs_bf16.sh

# The README's loss figure: bf16 and fp8 (current scaling) trained with the trainer's defaults (the tiny
# preset, one epoch of tiny-shakespeare) by the CPU build, so that it can be redrawn on any machine
# (TRAINER=./train_llama for the GPU build); fp8_vs_bf16.sh's 1% check must pass before the figure is
# redrawn (a failing run leaves its plot in runs/cmp_fp8/compare_loss.png). --dpi 80 keeps it < 200 KB.
TRAINER ?= ./train_llama_cpu
LOSS_FIGURE = docs/images/loss_fp8_vs_bf16.png
figures: train_llama_cpu $(TRAIN_DATA)
	RECIPES=current EVALS= TRAINER=$(TRAINER) PYTHON=$(PYTHON) bash scripts/fp8_vs_bf16.sh
	@mkdir -p $(dir $(LOSS_FIGURE))
	$(PYTHON) scripts/compare_loss.py runs/cmp_fp8 runs/cmp_bf16 --labels "fp8 (current scaling)" bf16 \
		--title "Llama-2 'tiny' (9.0M params), tiny-shakespeare, 1 epoch, $(if $(filter %_cpu,$(TRAINER)),CPU,GPU) build" \
		--dpi 80 --out $(LOSS_FIGURE)
	@ls -l $(LOSS_FIGURE)

# What the device check needs and the GPU machine cannot make (no network, no cuDNN frontend headers, no
# OpenBLAS), made here into build/device: the cuDNN glue object, the shards, the CPU build's fp8 curve.
device-prepare: build/cudnn_att.o train_llama_cpu $(TRAIN_DATA)
	CUDNN_FRONTEND_INCLUDE="$(CUDNN_FRONTEND_INCLUDE)" bash scripts/device_prepare.sh

clean:
	rm -rf build train_llama_cpu test_llama_cpu train_llama test_llama dev/cuda/bench_kernels
