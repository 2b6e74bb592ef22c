# ftkit: LLM fine-tuning in C and CUDA.
#
#   make                 build libft.a and the tools into bin/
#   make CUDA=0          CPU-only build (needs no CUDA toolkit)
#   make test            install what the tests need, build, run every test tier
#   make test-unit       C unit tests only (no Python)
#   make test-dist       the communication layer on real MPI ranks (np 1-4, hang/kill)
#   make test-conformance  the Hugging Face conformance suite (pytest)
#   make install PREFIX=/usr/local DESTDIR=
#   make deps            install the system packages the build needs (Debian/Ubuntu)
#   make train [CONFIG=configs/x.yaml] [TRAIN_BATCH_SIZE=1 ...]   train (default: the demo)
#   make eval | merge | lora-init | memory-check | gpu-info | tb | train-tb
#   make train-distributed | train-zero ZERO_STAGE=1|2|3 | train-fsdp | train-model-parallel
#        | train-deepspeed DEEPSPEED_CONFIG=deepspeed_like/zero2.json   [NUM_GPUS=N HOSTFILE=f]
#        (each with a -tb variant)
#   make compare RUNS="runs/a runs/b"   table and loss-curve plot of finished runs
#   make bench-cpu | bench-tokenizer   figures next to the Hugging Face baseline
#   make bench-dist      per-strategy step time, communication and a 1..64 GPU projection
#   make bench           GPU: tokens/s, peak memory and MFU against transformers + PEFT
#
# The fragments in mk/ hold the toolchain detection, the build rules and the tests.

.DEFAULT_GOAL := all

include mk/config.mk
include mk/build.mk
include mk/test.mk
include mk/workflow.mk

.PHONY: all deps clean install help

all: $(TOOLS)

deps:
	scripts/install-deps.sh

install: all
	install -d "$(DESTDIR)$(PREFIX)/bin" "$(DESTDIR)$(PREFIX)/lib" "$(DESTDIR)$(PREFIX)/include/ftkit"
	install -m 755 $(TOOLS) "$(DESTDIR)$(PREFIX)/bin/"
	install -m 644 $(LIBFT) "$(DESTDIR)$(PREFIX)/lib/"
	install -m 644 kernels/ops.h "$(DESTDIR)$(PREFIX)/include/ftkit/"
	set -e; for h in $(PUBLIC_HEADERS:lib/%=%); do \
	  install -d "$(DESTDIR)$(PREFIX)/include/ftkit/$${h%/*}"; \
	  install -m 644 "lib/$$h" "$(DESTDIR)$(PREFIX)/include/ftkit/$$h"; \
	done

clean:
	rm -rf build bin

help:
	@sed -n '3,14p' Makefile
