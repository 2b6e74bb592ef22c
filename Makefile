# ftkit: LLM fine-tuning in C and CUDA.
#
# Build
#   make                 build libft.a and the tools into bin/ (one line per step; V=1 the commands)
#   make all             the same
#   make CUDA=0          CPU-only build (needs no CUDA toolkit); CUDA, MPI, NCCL, CUDA_HOME,
#                        CUDA_ARCHS, OPT, CFLAGS, LDFLAGS given once stay until given again
#   make CUDA=emu        the emulated-device test build in build-emu/ (kernels/cuda on the host
#                        against tests/emu's CUDA emulation; never remembered)
#   make clean           remove build/, bin/ and build-emu/ (and forget those choices)
#   make install PREFIX=/usr/local DESTDIR=
#   make deps            install the system packages the build needs (Debian/Ubuntu)
# Train and evaluate (CONFIG=configs/x.yaml, default the demo; SECTION_KEY=value overrides)
#   make train           train (the default config: eval before/after, merge, summary)
#   make train-dpo       preference tuning (DPO) of the demo (configs/dpo.yaml unless CONFIG)
#   make eval | merge | lora-init            on the run's adapter [MODEL= ADAPTER= DATA= OUT=]
#   make train-distributed | train-zero ZERO_STAGE=1|2|3 | train-fsdp | train-model-parallel
#        | train-deepspeed DEEPSPEED_CONFIG=deepspeed_like/zero2.json   [NUM_GPUS=N HOSTFILE=f]
#                        on N ranks (mpirun/srun), each strategy in its own run dir by default
#                        (train.output_dir + -ddp, -zero2, ...; TRAIN_OUTPUT_DIR= names one)
#   make train-tb train-distributed-tb train-zero-tb train-deepspeed-tb train-fsdp-tb
#        train-model-parallel-tb              TensorBoard in the background, then that target
#   make tb              TensorBoard on the run dir [RUN_DIR= TB_PORT=6006]
#   make memory-check    the memory plan beside one measured step [NUM_GPUS=N]
#   make gpu-info        the hardware
#   make compare RUNS="runs/a runs/b"   table and loss-curve plot of finished runs [PLOT=f.svg]
# Test
#   make test            install what the tests need, build, run every test tier
#   make test-unit       C unit tests only (no Python)
#   make test-dist       the communication layer on real MPI ranks (np 1-4, hang/kill)
#   make test-conformance  the Hugging Face conformance suite (pytest)
#   make test-gpu        the GPU tier (on a machine with a GPU)
#   make test-gpu-emu    the GPU tier on the emulated CUDA device (no GPU needed; in make test)
#   make test-nccl-emu   the emulated device's NCCL (tests/emu) on MPI ranks 1-3, and its misuses
#   make unit-bins | gpu-bins   build the unit / GPU test binaries only
#   make gpu-bundle      the GPU tier's binaries and tools packed for a GPU machine
#   make config-reference  regenerate configs/README.md from the schema
# Benchmarks
#   make bench-cpu | bench-tokenizer   figures next to the Hugging Face baseline
#   make bench-dist      per-strategy step time, communication and a 1..64 GPU projection
#   make bench           GPU: tokens/s, peak memory and MFU against transformers + PEFT
#   make help            this text
#
# The fragments in mk/ hold the toolchain detection, the build rules, the tests and the
# workflow targets; every target a user runs is listed above (a test checks it).

.DEFAULT_GOAL := all

include mk/config.mk
include mk/build.mk
include mk/test.mk
include mk/workflow.mk

.PHONY: all deps clean install help

# (the emulated build, CUDA=emu, makes the GPU tier's binaries and the harnesses as well)
all: $(TOOLS) $(if $(filter emu,$(CUDA)),$(GPU_BINS) $(EMU_CHECK_BINS) $(HARNESSES))

deps:
	scripts/install-deps.sh

FT_INSTALL_ROOT = $(call q,$(DESTDIR)$(PREFIX))

install: all
	install -d $(FT_INSTALL_ROOT)/bin $(FT_INSTALL_ROOT)/lib $(FT_INSTALL_ROOT)/include/ftkit
	install -m 755 $(TOOLS) $(FT_INSTALL_ROOT)/bin/
	install -m 644 $(LIBFT) $(FT_INSTALL_ROOT)/lib/
	install -m 644 kernels/ops.h $(FT_INSTALL_ROOT)/include/ftkit/
	set -e; for h in $(PUBLIC_HEADERS:lib/%=%); do \
	  install -d $(FT_INSTALL_ROOT)/include/ftkit/"$${h%/*}"; \
	  install -m 644 "lib/$$h" $(FT_INSTALL_ROOT)/include/ftkit/"$$h"; \
	done

clean:
	rm -rf build bin build-emu

# The comment block at the top of this file, without its '# '.
help:
	@sed -n '3,/^$$/{/^$$/q;s/^# \{0,1\}//;p}' Makefile
