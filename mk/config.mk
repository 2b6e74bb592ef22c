# Toolchain and feature detection.
#
# CUDA: auto-detected from CUDA_HOME (default /usr/local/cuda) or nvcc on PATH;
# CUDA=0 forces the CPU-only build, which needs nothing from the CUDA toolkit.

PREFIX ?= /usr/local
DESTDIR ?=

CC := gcc
PKG_CONFIG ?= pkg-config

# Library dependencies found through pkg-config (Debian: libjansson-dev, libyaml-dev,
# libopenblas-dev, libpcre2-dev, libutf8proc-dev).
DEP_PKGS := jansson yaml-0.1 openblas libpcre2-8 libutf8proc
DEP_CFLAGS := $(shell $(PKG_CONFIG) --cflags $(DEP_PKGS) 2>/dev/null)
DEP_LIBS := $(shell $(PKG_CONFIG) --libs $(DEP_PKGS) 2>/dev/null)
ifeq ($(strip $(DEP_LIBS)),)
  DEP_LIBS := -ljansson -lyaml -lopenblas -lpcre2-8 -lutf8proc
endif

OPT ?= -O2
CFLAGS ?= $(OPT) -g
FT_CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -fopenmp -fno-math-errno -march=x86-64-v2 \
             -Ilib -Ikernels $(DEP_CFLAGS)
LDLIBS := $(DEP_LIBS) -lm -ldl -lpthread
LDFLAGS ?=
FT_LDFLAGS := -fopenmp

# MPI: Open MPI through its compiler wrapper (mpicc --showme); MPI=0 builds without it,
# and then every run is a single process.
ifeq ($(origin MPI), undefined)
  MPI := $(if $(shell command -v mpicc 2>/dev/null),1,0)
endif
ifeq ($(MPI),1)
  FT_CFLAGS += -DFT_HAVE_MPI $(shell mpicc --showme:compile)
  LDLIBS += $(shell mpicc --showme:link)
endif

CUDA_HOME ?= /usr/local/cuda
ifeq ($(origin CUDA), undefined)
  ifneq ($(wildcard $(CUDA_HOME)/bin/nvcc),)
    CUDA := 1
  else ifneq ($(shell command -v nvcc 2>/dev/null),)
    CUDA := 1
    CUDA_HOME := $(patsubst %/bin/nvcc,%,$(shell command -v nvcc))
  else
    CUDA := 0
  endif
endif

ifeq ($(CUDA),1)
  NVCC ?= $(CUDA_HOME)/bin/nvcc
  # Ampere (A100), Ada (L4/4090) and Hopper (H100/H200).
  CUDA_ARCHS ?= 80 89 90
  NVCC_FLAGS := -O2 -std=c++17 -Xcompiler -Wall,-Werror -Ilib -Ikernels \
                $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a))
  FT_CFLAGS += -DFT_HAVE_CUDA -I$(CUDA_HOME)/include
  LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas -lstdc++
endif

# NCCL (the GPU backend of lib/dist/dist.h): with CUDA, when nccl.h and libnccl sit under
# CUDA_HOME; NCCL=0 leaves it out. lib/dist/dist_nccl.c also needs MPI, which starts NCCL.
ifeq ($(CUDA),1)
  ifeq ($(origin NCCL), undefined)
    NCCL := $(if $(and $(wildcard $(CUDA_HOME)/include/nccl.h),$(wildcard $(CUDA_HOME)/lib64/libnccl.so*)),1,0)
  endif
else
  NCCL := 0
endif
ifeq ($(NCCL),1)
  FT_CFLAGS += -DFT_HAVE_NCCL
  LDLIBS += -lnccl
endif
