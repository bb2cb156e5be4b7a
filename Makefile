# llm8 build. `make train` prepares tiny-shakespeare, builds and trains; `make test` builds everything
# (the CUDA targets too when nvcc is found) and runs the test suite. `make help` lists the targets.

CC ?= gcc
PYTHON ?= python3
CFLAGS ?= -O3 -march=native
CFLAGS += -std=c11 -D_POSIX_C_SOURCE=200809L -fopenmp -Wall -Wextra
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(shell command -v nvcc 2>/dev/null || (test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc))
# cuda_fp8.h is the FP8 conversion both builds use; the CPU build needs only the header.
CUDA_INCLUDE ?= $(CUDA_HOME)/include
CPU_INCLUDES = -I$(CUDA_INCLUDE)
CPU_LIBS = -lopenblas -lm

# GPU build: sm_90 (H100/H200/H800) by default; `make train_llama GPU_ARCH=89` for Ada.
GPU_ARCH ?= 90
NVCC_FLAGS ?= -O3 -std=c++17 -gencode arch=compute_$(GPU_ARCH),code=sm_$(GPU_ARCH) --expt-relaxed-constexpr \
	-Xcompiler -fopenmp -Xcompiler -Wall
CUDA_LIBS = -lcublasLt -lcublas -lgomp
CXX ?= g++
# The cuDNN frontend is header-only and ships in the nvidia-cudnn-frontend wheel; its attention graphs
# live in one host-compiled file (llama/cudnn_att.cpp, ~1 min with g++) so editing the trainer never
# recompiles them. USE_CUDNN=0 builds the plain fallback attention instead.
CUDNN_FRONTEND_INCLUDE ?= $(shell $(PYTHON) -c "import os,sysconfig; p=os.path.join(sysconfig.get_paths()['purelib'],'include'); print(p if os.path.exists(os.path.join(p,'cudnn_frontend.h')) else '')" 2>/dev/null)
USE_CUDNN ?= $(if $(CUDNN_FRONTEND_INCLUDE),1,0)
ifeq ($(USE_CUDNN),1)
  CUDNN_OBJ = build/cudnn_att.o
  NVCC_FLAGS += -DUSE_CUDNN
  CUDA_LIBS += -lcudnn
endif

DATA_DIR ?= dev/data/tinyshakespeare
TRAIN_DATA = $(DATA_DIR)/tiny_shakespeare_train.bin
SETUP_STAMP = build/.setup-done

HEADERS = $(wildcard llama/*.h fp8/*.h dataloader/*.h)
CUDA_HEADERS = $(wildcard llama/*.cuh fp8/*.cuh)

CPU_TARGETS = train_llama_cpu test_llama_cpu
GPU_TARGETS = $(if $(NVCC),train_llama test_llama,)

.PHONY: all cpu gpu train test setup data clean help fp8-vs-bf16

all: $(CPU_TARGETS) $(GPU_TARGETS)
cpu: $(CPU_TARGETS)
gpu: train_llama test_llama

help:
	@echo "make train        prepare tiny-shakespeare, build, train a small Llama (GPU build if a GPU is present)"
	@echo "make test         build everything and run the test suite"
	@echo "make all          build train_llama_cpu test_llama_cpu (+ train_llama test_llama with nvcc)"
	@echo "make fp8-vs-bf16  train the same seed in bf16 and fp8 on tiny-shakespeare and compare the losses"
	@echo "make setup        install the Debian and PyPI packages llm8 needs"
	@echo "make clean        remove build outputs"

# Installs what is missing (Debian: OpenBLAS, OpenMPI; PyPI: numpy, sentencepiece, ml_dtypes, ...).
$(SETUP_STAMP): scripts/setup.sh
	PYTHON=$(PYTHON) bash scripts/setup.sh
	@mkdir -p build && touch $@
setup:
	PYTHON=$(PYTHON) bash scripts/setup.sh
	@mkdir -p build && touch $(SETUP_STAMP)

train_llama_cpu: train_llama.c $(HEADERS) | $(SETUP_STAMP)
	$(CC) $(CFLAGS) $(CPU_INCLUDES) $< -o $@ $(CPU_LIBS)

test_llama_cpu: test_llama.c train_llama.c $(HEADERS) | $(SETUP_STAMP)
	$(CC) $(CFLAGS) $(CPU_INCLUDES) $< -o $@ $(CPU_LIBS)

build/cudnn_att.o: llama/cudnn_att.cpp llama/cudnn_att.h | $(SETUP_STAMP)
	@mkdir -p build
	$(CXX) -O2 -std=c++17 -fPIC -I$(CUDA_INCLUDE) -I$(CUDNN_FRONTEND_INCLUDE) -c $< -o $@

train_llama: train_llama.cu $(HEADERS) $(CUDA_HEADERS) $(CUDNN_OBJ) | $(SETUP_STAMP)
	$(NVCC) $(NVCC_FLAGS) $< $(CUDNN_OBJ) -o $@ $(CUDA_LIBS)

test_llama: test_llama.cu train_llama.cu $(HEADERS) $(CUDA_HEADERS) $(CUDNN_OBJ) | $(SETUP_STAMP)
	$(NVCC) $(NVCC_FLAGS) $< $(CUDNN_OBJ) -o $@ $(CUDA_LIBS)

# Tokenized tiny-shakespeare (from ../shared/data when present, else downloaded: dev/data/llm8_data.py).
$(TRAIN_DATA): dev/data/tinyshakespeare.py dev/data/llm8_data.py | $(SETUP_STAMP)
	$(PYTHON) dev/data/tinyshakespeare.py --out $(DATA_DIR)
data: $(TRAIN_DATA)

# The default run: the `tiny` preset for one epoch of tiny-shakespeare, with samples and FP8 statistics.
TRAIN_FLAGS ?= -o runs/tinyshakespeare -s 80 -g 64 --fp8-stats 20
HAS_GPU = $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
train: $(TRAIN_DATA) $(if $(and $(HAS_GPU),$(NVCC)),train_llama,train_llama_cpu)
	./$(if $(and $(HAS_GPU),$(NVCC)),train_llama,train_llama_cpu) $(TRAIN_FLAGS)

test: all $(TRAIN_DATA)
	$(PYTHON) -m pytest dev/test -q -p no:cacheprovider

fp8-vs-bf16: train_llama_cpu $(TRAIN_DATA)
	bash scripts/fp8_vs_bf16.sh

clean:
	rm -rf build train_llama_cpu test_llama_cpu train_llama test_llama
