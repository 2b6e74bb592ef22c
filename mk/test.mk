# Test tiers.
#   test-unit         C unit tests (tests/unit/test_*.c), no Python; each binary prints
#                     "N passed, N failed", and the runner adds them up. Also the CUDA
#                     kernels that tests/emu runs on the host (C++20, no GPU needed), and
#                     the shape of lib/ (scripts/check-layout.sh: folders, calls one way).
#   test-dist         the communication interface (lib/dist/dist.h) under real MPI ranks
#                     (tests/dist, driven by tests/run-dist.sh); needs MPI in the build.
#   test-conformance  pytest against Hugging Face transformers + PEFT (tests/conformance),
#                     in a virtualenv made by scripts/setup-python.sh.
#   test-gpu          the CUDA ops against the CPU ops (tests/gpu), then the same binaries
#                     under compute-sanitizer memcheck; needs a GPU (run on the GPU machine).
#                     CUDA builds compile these binaries in test-unit, so CI without a GPU
#                     still catches a build break.
#   test-gpu-emu      the GPU tier on the emulated device (make CUDA=emu, build-emu/): the
#                     emulation's own tests (tests/emu/checks), tests/gpu's binaries on small
#                     shapes, ft-train on the emulated GPU and the Python GPU tests (the
#                     model against transformers + PEFT on the CPU, ft-train's curves,
#                     strategies on 2 ranks, resume, QLoRA, out of memory), the emulation's
#                     checks in place of compute-sanitizer. Needs no GPU and no CUDA toolkit.
#   test-nccl-emu     the NCCL emulation of the emulated CUDA device (tests/emu/include/
#                     nccl.h, tests/emu/runtime/nccl_emu.cc) under real MPI ranks (alone and
#                     np 1-3, and the misuses it must stop), linked with the emulated runtime
#                     of make CUDA=emu; needs MPI. Part of test-gpu-emu (so of `make test`).
#   test              deps + build + every tier but test-gpu, test-gpu-emu last.

UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(FT_BUILD)/tests/unit/%)
DIST_SRCS := $(wildcard tests/dist/test_*.c)
DIST_BINS := $(DIST_SRCS:tests/dist/%.c=$(FT_BUILD)/tests/dist/%)
# Host-emulated CUDA kernels (tests/emu, C++20): run in test-unit, with or without a GPU.
EMU_SRCS := $(wildcard tests/emu/test_*.cc)
EMU_BINS := $(EMU_SRCS:tests/emu/%.cc=$(FT_BUILD)/tests/emu/%)
GPU_SRCS := $(if $(filter 1 emu,$(CUDA)),$(wildcard tests/gpu/test_*.c))
GPU_BINS := $(GPU_SRCS:tests/gpu/%.c=$(FT_BUILD)/tests/gpu/%)
# The emulated device's own tests (tests/emu/checks, emulated build only): its semantics,
# and misuse.cu, whose cases each do one wrong thing that test_checks.sh sees stopped.
EMU_CHECK_BINS := $(if $(filter emu,$(CUDA)),$(patsubst tests/emu/checks/%.cu,$(FT_BUILD)/tests/emu/checks/%, \
                    $(wildcard tests/emu/checks/*.cu)))
EMU_CHECK_TESTS := $(filter $(FT_BUILD)/tests/emu/checks/test_%,$(EMU_CHECK_BINS))
CONFORM_HARNESS := $(FT_BUILD)/tests/ft-conform
DATA_HARNESS := $(FT_BUILD)/tests/ft-data
TOKENIZE_HARNESS := $(FT_BUILD)/tests/ft-tokenize
TB_HARNESS := $(FT_BUILD)/tests/ft-tb
HARNESSES := $(CONFORM_HARNESS) $(DATA_HARNESS) $(TOKENIZE_HARNESS) $(TB_HARNESS)
VENV ?= .venv

BENCH_TRAIN := $(FT_BUILD)/tests/bench-train
# cuBLAS / cublasLt GEMM timings of linear.cu's calls (tests/bench/bench_gemm.c): real CUDA
# builds only (the emulated device has no cublasLt)
BENCH_GEMM := $(if $(filter 1,$(CUDA)),$(FT_BUILD)/tests/bench-gemm)

.PHONY: test test-unit test-dist test-conformance test-gpu test-gpu-emu gpu-bundle unit-bins gpu-bins \
        bench-cpu bench-tokenizer bench-dist bench config-reference test-nccl-emu

EMU_HEADERS := $(wildcard tests/emu/include/*.h)

$(FT_BUILD)/tests/emu/%: tests/emu/%.cc tests/emu/cuda_emu.h tests/emu/emu_check.h $(EMU_HEADERS) \
                         $(wildcard kernels/cuda/*.cuh) $(EMU_ENGINE_LIB) $(LIBFT)
	@mkdir -p $(dir $@)
	$(call ft_step,CXX,$<)$(call q,$(CXX_EMU)) -std=c++20 -O2 -pthread -Wall -Wextra -Werror \
	  -Wno-unknown-pragmas -Ikernels -Ilib -Itests/emu -Itests/emu/include $< $(EMU_ENGINE_LIB) \
	  $(LIBFT) $(FT_LD) $(LDLIBS) -o $@

$(FT_BUILD)/tests/emu/checks/%: tests/emu/checks/%.cu tests/unit/check.h $(EMU_HEADERS) $(LIBFT) \
                                $(EMU_LIB)
	@mkdir -p $(dir $@)
	$(call ft_step,CXX,$<)$(FT_CXX_EMU) $(EMU_KERNEL_FLAGS) -Itests/unit $< -x none $(FT_LD) \
	  $(LIBFT) $(LDLIBS) -o $@

$(FT_BUILD)/tests/unit/%: tests/unit/%.c tests/unit/check.h tests/unit/tiny_model.h $(LIBFT) $(EMU_LIB)
	@mkdir -p $(dir $@)
	$(call ft_step,CC,$<)$(FT_CC) -Itests/unit $< $(LIBFT) $(FT_LD) $(LDLIBS) -o $@

$(FT_BUILD)/tests/gpu/%: tests/gpu/%.c tests/gpu/gpu_check.h tests/unit/check.h $(LIBFT) $(EMU_LIB)
	@mkdir -p $(dir $@)
	$(call ft_step,CC,$<)$(FT_CC) -Itests/unit -Itests/gpu $< $(LIBFT) $(FT_LD) $(LDLIBS) -o $@

$(FT_BUILD)/tests/dist/%: tests/dist/%.c tests/unit/check.h $(LIBFT) $(EMU_LIB)
	@mkdir -p $(dir $@)
	$(call ft_step,CC,$<)$(FT_CC) -Itests/unit $< $(LIBFT) $(FT_LD) $(LDLIBS) -o $@

# The conformance harnesses: small CLIs over the library that the pytest suite drives.
$(CONFORM_HARNESS): tests/conformance/harness.c $(LIBFT) $(EMU_LIB)
$(DATA_HARNESS): tests/conformance/data_harness.c $(LIBFT) $(EMU_LIB)
$(TOKENIZE_HARNESS): tests/conformance/tokenize.c $(LIBFT) $(EMU_LIB)
$(TB_HARNESS): tests/conformance/tb_harness.c $(LIBFT) $(EMU_LIB)
$(BENCH_TRAIN): tests/bench/bench_train.c $(LIBFT) $(EMU_LIB)
$(HARNESSES) $(BENCH_TRAIN):
	@mkdir -p $(dir $@)
	$(call ft_step,CC,$<)$(FT_CC) $< $(LIBFT) $(FT_LD) $(LDLIBS) -o $@
$(FT_BUILD)/tests/bench-gemm: tests/bench/bench_gemm.c $(BUILD_FLAGS)
	@mkdir -p $(dir $@)
	$(call ft_step,CC,$<)$(FT_CC) $< $(FT_LD) $(LDLIBS) -lcublasLt -o $@

# CPU training tokens/s and peak RSS, ours vs transformers + PEFT (sdpa) in the same run:
# SmolLM-135M's shape and a tiny one, LoRA and full, checkpointing off and on
# (docs/benchmarks.md). BENCH_CPU_ARGS: more arguments (--shapes, --modes, --reps, ...).
bench-cpu: $(BENCH_TRAIN)
	scripts/setup-python.sh $(call q,$(VENV))
	$(call q,$(VENV))/bin/python tests/bench/bench_cpu_train.py $(BENCH_TRAIN) $(BENCH_CPU_ARGS)

# Distributed training on CPU ranks, per strategy: step time, compute vs communication,
# bytes per step and rank; then a scaling model (tests/bench/scaling_model.py) projecting
# 1..64 GPUs. Tables on stdout; results.json, measured.tsv, projection.tsv in runs/bench-dist.
ifeq ($(MPI),1)
bench-dist: $(TOOLS)
	scripts/setup-python.sh $(call q,$(VENV))
	$(call q,$(VENV))/bin/python tests/bench/bench_dist.py --ft-train $(FT_BIN)/ft-train --out runs/bench-dist
else
bench-dist:
	@echo "make bench-dist: this build has no MPI (scripts/install-deps.sh build installs Open MPI)" >&2; exit 1
endif

# GPU training throughput and peak memory, ours vs transformers + PEFT on the same GPU,
# and MFU against the measured bf16 GEMM rate (tests/bench/bench_gpu.py; issue 8's
# configs). Run on the GPU machine, by a python with torch (CUDA), transformers and peft
# (PYTHON=, default python3); BENCH_ARGS="--configs lora-1b --steps 3" picks and shortens
# (its words go to the script one by one).
# The table goes to bench/results/<device>.md and .json.
PYTHON ?= python3
ifeq ($(CUDA),1)
bench: $(BENCH_TRAIN)
	$(call q,$(PYTHON)) tests/bench/bench_gpu.py --bench-train $(BENCH_TRAIN) --out bench/results \
	  $(call qw,$(BENCH_ARGS))
else
bench:
	@printf 'make bench: this build has no CUDA (nvcc not found; CUDA_HOME=%s)\n' $(call q,$(CUDA_HOME)) >&2; exit 1
endif

# Tokenizer throughput and ids, ours vs Hugging Face tokenizers, on ~8 MB of text.
bench-tokenizer: $(TOKENIZE_HARNESS)
	scripts/setup-python.sh $(call q,$(VENV))
	FT_TOKENIZE=$(call q,$(abspath $(TOKENIZE_HARNESS))) $(call q,$(VENV))/bin/python tests/bench/bench_tokenizer.py

unit-bins: $(UNIT_BINS) $(EMU_BINS)
gpu-bins: $(GPU_BINS) $(EMU_CHECK_BINS) $(BENCH_GEMM)

# The CPU tiers (unit, dist, conformance) hide the GPUs (CUDA_VISIBLE_DEVICES empty): their
# references are the fp32 CPU engine, which train.device auto would leave for a GPU on a
# GPU machine. The GPU tier is make test-gpu.
CPU_ONLY := CUDA_VISIBLE_DEVICES=

test-unit: $(UNIT_BINS) $(EMU_BINS) $(GPU_BINS) $(TOOLS)
	$(FT_BIN)/ft-train --config-reference | diff -u configs/README.md - \
	  || { echo "configs/README.md is stale: make config-reference"; exit 1; }
	$(CPU_ONLY) tests/run-unit.sh $(UNIT_BINS) $(EMU_BINS) scripts/check-layout.sh

ifeq ($(MPI),1)
test-dist: $(DIST_BINS)
	$(CPU_ONLY) tests/run-dist.sh $(FT_BUILD)/tests/dist
else
test-dist:
	@echo "dist: 0 passed, 0 failed (no MPI in this build)"
endif

# The NCCL emulation (issue 20) on its own: tests/emu/test_nccl_emu.c under real MPI ranks
# (tests/emu/run-nccl-emu.sh), against the emulated runtime of make CUDA=emu
# (build-emu/libcudaemu.a, which holds tests/emu/runtime/nccl_emu.cc when the build has MPI).
# Part of make test-gpu-emu; make test-nccl-emu runs it alone (in the emulated build).
# lib/dist/dist_nccl.c is built against the emulated nccl.h in that build itself.
NCCL_EMU_BIN := $(FT_BUILD)/tests/nccl-emu/test_nccl_emu
ifeq ($(CUDA),emu)
ifeq ($(NCCL),1)
EMU_CHECK_BINS += $(NCCL_EMU_BIN)

$(NCCL_EMU_BIN): tests/emu/test_nccl_emu.c $(EMU_HEADERS) $(EMU_LIB)
	@mkdir -p $(dir $@)
	$(call ft_step,CC,$<)$(FT_CC) $< $(FT_LD) $(LDLIBS) -o $@

test-nccl-emu: $(NCCL_EMU_BIN)
	env -u CUDA_VISIBLE_DEVICES FT_NCCL_EMU_BIN=$(NCCL_EMU_BIN) tests/emu/run-nccl-emu.sh
else
test-nccl-emu:
	@echo "nccl-emu: 0 passed, 0 failed (this emulated build has no NCCL emulation: it needs MPI)"
endif
else
test-nccl-emu:
	$(MAKE) --no-print-directory CUDA=emu test-nccl-emu
endif

ifeq ($(CUDA),1)
test-gpu: $(GPU_BINS) $(TOOLS) $(CONFORM_HARNESS)
	FT_CONFORM=$(call q,$(abspath $(CONFORM_HARNESS))) tests/run-gpu.sh $(GPU_BINS)
else ifeq ($(CUDA),emu)
test-gpu: test-gpu-emu
else
test-gpu:
	@printf 'make test-gpu: this build has no CUDA (nvcc not found; CUDA_HOME=%s)\n' $(call q,$(CUDA_HOME)) >&2; exit 1
endif

# The GPU tier on the emulated device (docs/gpu.md, The emulated device): the emulated build
# (build-emu/, made by a make of its own with CUDA=emu), then tests/run-gpu.sh in its
# emulated mode on the emulation's own tests, tests/gpu's binaries on small shapes
# (FT_GPU_TEST_SMALL), ft-train on the emulated GPU (tests/emu/checks/test_train.sh) and
# run-gpu.sh's own check (test_run_gpu.sh: a tier whose Python tests skip fails).
# test_dist_nccl runs (under mpirun, 1 to 3 ranks) when the build has the NCCL emulation.
# Then the Python GPU tests (test_gpu_model.py, test_gpu_train.py) on the emulated build's
# harness and tools, by the conformance venv's python (made here if test-conformance has
# not made it): torch on the CPU as the reference. All of it in the emulation's deferred
# mode (FT_EMU_ASYNC=1: stream work runs only when the host waits for it, so a missing
# synchronization shows as a wrong result); `make test-gpu-emu FT_EMU_ASYNC=0` runs every
# call when issued.
FT_EMU_ASYNC ?= 1
ifeq ($(CUDA),emu)
test-gpu-emu: $(GPU_BINS) $(EMU_CHECK_BINS) $(TOOLS) $(CONFORM_HARNESS)
	scripts/setup-python.sh $(call q,$(VENV))
	env -u CUDA_VISIBLE_DEVICES FT_EMU=1 FT_EMU_ASYNC=$(FT_EMU_ASYNC) FT_EMU_NCCL=$(NCCL) FT_GPU_TEST_SMALL=1 \
	  FT_EMU_MISUSE=$(FT_BUILD)/tests/emu/checks/misuse FT_EMU_TRAIN=$(call q,$(abspath $(FT_BIN)/ft-train)) \
	  FT_CONFORM=$(call q,$(abspath $(CONFORM_HARNESS))) FT_TRAIN=$(call q,$(abspath $(FT_BIN)/ft-train)) \
	  FT_EVAL=$(call q,$(abspath $(FT_BIN)/ft-eval)) FT_QUANTIZE=$(call q,$(abspath $(FT_BIN)/ft-quantize)) \
	  PYTHON=$(call q,$(abspath $(VENV))/bin/python) \
	  tests/run-gpu.sh $(EMU_CHECK_TESTS) tests/emu/checks/test_checks.sh $(GPU_BINS) \
	  tests/emu/checks/test_train.sh tests/emu/checks/test_run_gpu.sh tests/emu/checks/test_gpu_session.sh \
	  tests/emu/checks/test_dist.sh tests/emu/run-nccl-emu.sh
else
test-gpu-emu:
	$(MAKE) --no-print-directory CUDA=emu test-gpu-emu
endif

# The GPU tier's binaries and the tools, with the shared libraries they need, packed for a
# GPU machine that has the CUDA driver and toolkit but not the build's Debian libraries;
# beside it the bitsandbytes wheel of the suite's lock, from the wheel cache (the QLoRA
# baseline of the bench), where setup-python.sh has fetched it. scripts/gpu-session.sh
# runs them there.
FT_WHEEL_CACHE ?= $(VENV)/wheels
BNB_VERSION = $(shell sed -n 's/^bitsandbytes==//p' scripts/python-requirements.txt 2>/dev/null)
gpu-bundle: $(GPU_BINS) $(TOOLS) $(HARNESSES) $(BENCH_TRAIN) $(BENCH_GEMM)
	@mkdir -p .gpu
	scripts/gpu-bundle.sh .gpu/ftkit.tar.xz $(GPU_BINS) $(TOOLS) $(HARNESSES) $(BENCH_TRAIN) $(BENCH_GEMM) \
	  tests/run-gpu.sh tests/run-unit.sh
	@rm -f .gpu/bitsandbytes-*.whl; whl=$$(ls $(call q,$(FT_WHEEL_CACHE))/bitsandbytes-$(BNB_VERSION)-*.whl 2>/dev/null | head -n 1); \
	if [ -n "$$whl" ]; then cp "$$whl" .gpu/ && echo "gpu-bundle: .gpu/$$(basename "$$whl")"; \
	else echo "gpu-bundle: no bitsandbytes $(BNB_VERSION) wheel in $(FT_WHEEL_CACHE) (scripts/setup-python.sh fetches it): the bench's QLoRA baseline will be skipped" >&2; fi

config-reference: $(FT_BIN)/ft-train
	$(FT_BIN)/ft-train --config-reference > configs/README.md

# The tests find the tools and harnesses through these (one test file by hand:
# `make -n test-conformance` shows the line; put a file or -k after tests/conformance).
FT_CONFORM_ENV = FT_CONFORM=$(call q,$(abspath $(CONFORM_HARNESS))) \
  FT_DATA=$(call q,$(abspath $(DATA_HARNESS))) FT_TOKENIZE=$(call q,$(abspath $(TOKENIZE_HARNESS))) \
  FT_TRAIN=$(call q,$(abspath $(FT_BIN)/ft-train)) FT_LORA_INIT=$(call q,$(abspath $(FT_BIN)/ft-lora-init)) \
  FT_MERGE=$(call q,$(abspath $(FT_BIN)/ft-merge)) FT_EVAL=$(call q,$(abspath $(FT_BIN)/ft-eval)) \
  FT_TB=$(call q,$(abspath $(TB_HARNESS))) FT_QUANTIZE=$(call q,$(abspath $(FT_BIN)/ft-quantize)) \
  OMP_NUM_THREADS=2 $(CPU_ONLY)

test-conformance: $(HARNESSES) $(TOOLS)
	scripts/setup-python.sh $(call q,$(VENV))
	$(FT_CONFORM_ENV) $(call q,$(VENV))/bin/python -m pytest -q tests/conformance

test:
	scripts/install-deps.sh test
	$(MAKE) all
	$(MAKE) test-unit
	$(MAKE) test-dist
	$(MAKE) test-conformance
	$(MAKE) test-gpu-emu
