# Toolchain and feature detection, and the build's remembered choices.
#
# CUDA: auto-detected from CUDA_HOME (default /usr/local/cuda) or nvcc on PATH;
# CUDA=0 forces the CPU-only build, which needs nothing from the CUDA toolkit.
# CUDA=emu is the emulated-device test build (docs/gpu.md, The emulated device): every
# kernels/cuda source compiled by the host C++ compiler against tests/emu's CUDA
# emulation, in build-emu/ (tools in build-emu/bin); it needs no CUDA toolkit, touches
# neither build/ nor bin/, and is never remembered.
#
# The build remembers its choices: CUDA, MPI, NCCL, CUDA_HOME, CUDA_ARCHS, OPT, CFLAGS and
# LDFLAGS given on the command line (unless as the detected or default value) are saved
# in build/config.mk, and a later make that does not give them uses the saved values
# (and says so on one line), so that `make CUDA=0` then `make train` stays a CPU build.
# Give a choice again to change it (the detected value: back to detecting); `make clean`
# forgets them all. Precedence: the command line, the environment, the saved value, then
# detection.

PREFIX ?= /usr/local
DESTDIR ?=

# ---- quoting -------------------------------------------------------------------------
# $(call q,text): text as one shell word. It stays as it is when it holds only characters
# the shell takes literally (letters, digits and _ . / : , + - = @ %); otherwise it is
# single-quoted, each ' written as '\''. Every make variable that reaches a recipe's
# shell goes through it (or through qw, word by word, for lists of flags and arguments).
FT_SHELL_SAFE := a b c d e f g h i j k l m n o p q r s t u v w x y z \
                 A B C D E F G H I J K L M N O P Q R S T U V W X Y Z \
                 0 1 2 3 4 5 6 7 8 9 _ . / : , + - = @ %
ft_strip_chars = $(if $(2),$(call ft_strip_chars,$(subst $(firstword $(2)),,$(1)),$(wordlist 2,$(words $(2)),$(2))),$(1))
ft_shell_bare = $(and $(1),$(filter 1,$(words x$(1)x)),$(if $(strip $(call ft_strip_chars,$(1),$(FT_SHELL_SAFE))),,1))
q = $(if $(call ft_shell_bare,$(1)),$(1),'$(subst ','\'',$(1))')
qw = $(foreach w,$(1),$(call q,$(w)))
FT_COMMA := ,

# ---- remembered choices --------------------------------------------------------------
# Read back first (a saved value counts as given for the detection below); saved at the
# end of this file, once the values a choice is compared with are known.
FT_SAVED_CHOICES := build/config.mk
FT_REMEMBERED := CUDA MPI NCCL CUDA_HOME CUDA_ARCHS OPT CFLAGS LDFLAGS
-include $(FT_SAVED_CHOICES)
ft_saved = $(filter-out undefined,$(origin FT_SAVED_$(1)))
FT_GIVEN := $(foreach v,$(FT_REMEMBERED),$(if $(filter command line,$(origin $(v))),$(v)))
FT_RECALLED := $(strip $(foreach v,$(FT_REMEMBERED),$(if $(filter undefined,$(origin $(v))),$(if \
                 $(call ft_saved,$(v)),$(v)))))
$(foreach v,$(FT_RECALLED),$(eval $(v) := $$(FT_SAVED_$(v))))
# one note line (stderr), from the top-level make only
ifneq ($(FT_RECALLED),)
  ifeq ($(MAKELEVEL),0)
    $(shell printf 'make: note: %s (remembered in %s; give them again to change them, make clean to forget)\n' \
      $(call q,$(foreach v,$(FT_RECALLED),$(v)=$($(v)))) $(FT_SAVED_CHOICES) >&2)
  endif
endif

# ---- the toolchain -------------------------------------------------------------------
CC := gcc
PKG_CONFIG ?= pkg-config

# Library dependencies found through pkg-config (Debian: libjansson-dev, libyaml-dev,
# libpcre2-dev, libutf8proc-dev).
DEP_PKGS := jansson yaml-0.1 libpcre2-8 libutf8proc
DEP_CFLAGS := $(shell $(call q,$(PKG_CONFIG)) --cflags $(DEP_PKGS) 2>/dev/null)
DEP_LIBS := $(shell $(call q,$(PKG_CONFIG)) --libs $(DEP_PKGS) 2>/dev/null)
ifeq ($(strip $(DEP_LIBS)),)
  DEP_LIBS := -ljansson -lyaml -lpcre2-8 -lutf8proc
endif

# BLAS: OpenBLAS's OpenMP build, by its directory (Debian: libopenblas-openmp-dev), so a
# GEMM runs on the same libgomp threads as the CPU engine's own parallel loops; the
# pthreads build (the default libopenblas.so.0 on Debian) keeps a second pool whose
# threads spin against ours (lib/core/cpu_env.c, issue 25). The run path is
# linked in (-rpath): the loader must not pick the pthreads library of the same name.
# OPENBLAS_DIR: another directory holding an OpenMP libopenblas.so and its cblas.h.
FT_MULTIARCH := $(shell $(CC) -print-multiarch 2>/dev/null)
OPENBLAS_DIR ?= /usr/lib/$(FT_MULTIARCH)/openblas-openmp
OPENBLAS_INC ?= /usr/include/$(FT_MULTIARCH)/openblas-openmp
# (checked after scripts/install-deps.sh has run: mk/workflow.mk's DEPS_STAMP)
FT_OPENBLAS_CHECK = test -e $(call q,$(OPENBLAS_DIR)/libopenblas.so) || { printf '%s\n' \
  $(call q,error: OpenBLAS's OpenMP build not found: no $(OPENBLAS_DIR)/libopenblas.so \
  (scripts/install-deps.sh installs libopenblas-openmp-dev; elsewhere give OPENBLAS_DIR=<the \
  directory of an OpenMP-threaded libopenblas.so>, OPENBLAS_INC=<its cblas.h directory>)) >&2; \
  exit 1; }
DEP_CFLAGS += $(call q,-I$(OPENBLAS_INC))
DEP_LIBS += $(call q,-L$(OPENBLAS_DIR)) $(call q,-Wl$(FT_COMMA)-rpath$(FT_COMMA)$(OPENBLAS_DIR)) -lopenblas

OPT ?= -O2
CFLAGS ?= $(OPT) -g
# -fno-math-errno, -fno-trapping-math: no errno from libm, no FP exceptions watched, so
# the compiler may vectorize loops with selects (kernels/cpu/fast_exp.h); neither changes
# a computed value. -ffp-contract=off (ISO C's default, said outright): no multiply and
# add fused into an FMA, which the AVX2 / AVX-512 clones of the hot kernels
# (kernels/cpu/simd_clones.h) could otherwise do, and x86-64-v2 has none of.
# x86-64-v2 (SSE4.2, any x86-64 of the last decade) on x86-64 hosts; other architectures
# (aarch64: Grace Hopper nodes) build with the compiler's default.
FT_ARCH_FLAGS := $(if $(filter x86_64 amd64,$(shell uname -m)),-march=x86-64-v2)
FT_CFLAGS := -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -fopenmp -fno-math-errno -fno-trapping-math -ffp-contract=off $(FT_ARCH_FLAGS) \
             -Ilib -Ikernels $(DEP_CFLAGS)
LDLIBS := $(DEP_LIBS) -lm -ldl -lpthread
LDFLAGS ?=
FT_LDFLAGS := -fopenmp

# MPI: Open MPI through its compiler wrapper (mpicc --showme); MPI=0 builds without it,
# and then every run is a single process.
FT_AUTO_MPI := $(if $(shell command -v mpicc 2>/dev/null),1,0)
ifeq ($(origin MPI), undefined)
  MPI := $(FT_AUTO_MPI)
endif
ifeq ($(MPI),1)
  FT_CFLAGS += -DFT_HAVE_MPI $(shell mpicc --showme:compile)
  LDLIBS += $(shell mpicc --showme:link)
endif

CUDA_HOME ?= /usr/local/cuda
ifneq ($(wildcard $(CUDA_HOME)/bin/nvcc),)
  FT_AUTO_CUDA := 1
else ifneq ($(shell command -v nvcc 2>/dev/null),)
  FT_AUTO_CUDA := 1
  FT_AUTO_CUDA_HOME := $(patsubst %/bin/nvcc,%,$(shell command -v nvcc))
else
  FT_AUTO_CUDA := 0
endif
ifeq ($(origin CUDA), undefined)
  CUDA := $(FT_AUTO_CUDA)
  ifneq ($(FT_AUTO_CUDA_HOME),)
    CUDA_HOME := $(FT_AUTO_CUDA_HOME)
  endif
endif

# Where a build goes: build/ and bin/, or build-emu/ for the emulated device.
ifeq ($(CUDA),emu)
  FT_BUILD := build-emu
  FT_BIN := build-emu/bin
else
  FT_BUILD := build
  FT_BIN := bin
endif

ifeq ($(CUDA),1)
  NVCC ?= $(CUDA_HOME)/bin/nvcc
  # Ampere (A100), Ada (L4/4090) and Hopper (H100/H200).
  CUDA_ARCHS ?= 80 89 90
  NVCC_FLAGS := -O2 -std=c++17 -Xcompiler -Wall,-Werror -Ilib -Ikernels \
                $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a))
  FT_CFLAGS += -DFT_HAVE_CUDA $(call q,-I$(CUDA_HOME)/include)
  LDLIBS += $(call q,-L$(CUDA_HOME)/lib64) $(call q,-Wl$(FT_COMMA)-rpath$(FT_COMMA)$(CUDA_HOME)/lib64) -lcudart -lcublas -lstdc++
endif

# NCCL (the GPU backend of lib/dist/dist.h): with CUDA, when nccl.h and libnccl sit under
# CUDA_HOME; NCCL=0 leaves it out. lib/dist/dist_nccl.c also needs MPI, which starts NCCL.
FT_AUTO_NCCL := $(if $(and $(filter 1,$(CUDA)),$(wildcard $(CUDA_HOME)/include/nccl.h),$(wildcard \
                  $(CUDA_HOME)/lib64/libnccl.so*)),1,0)
ifeq ($(CUDA),1)
  ifeq ($(origin NCCL), undefined)
    NCCL := $(FT_AUTO_NCCL)
  endif
else ifeq ($(CUDA),emu)
  # the NCCL emulation (tests/emu/include/nccl.h, tests/emu/runtime/nccl_emu.cc), with MPI
  ifeq ($(origin NCCL), undefined)
    NCCL := $(if $(and $(filter 1,$(MPI)),$(wildcard tests/emu/include/nccl.h),$(wildcard \
              tests/emu/runtime/nccl_emu.cc)),1,0)
  endif
else
  NCCL := 0
endif
ifeq ($(NCCL),1)
  FT_CFLAGS += -DFT_HAVE_NCCL
  LDLIBS += $(if $(filter emu,$(CUDA)),,-lnccl)
endif

# The emulated device: lib/ sees tests/emu's CUDA headers and runs unchanged; kernels/cuda
# and the emulation (tests/emu/runtime, the static library EMU_LIB that everything links)
# are C++20 from the host compiler. Their device code contracts a * b + c into an FMA as
# nvcc does (__global__ and __device__ turn -ffp-contract=fast on for it, and -mfma gives the
# instruction where this CPU has FMA), their host code does not; -rdynamic names functions
# in the emulation's messages.
CXX_EMU ?= g++
FT_HOST_FMA := $(if $(shell grep -qw fma /proc/cpuinfo 2>/dev/null && echo y),-mfma)
EMU_CXXFLAGS := -std=c++20 $(OPT) -g -Wall -Wextra -Werror -Wno-unknown-pragmas $(FT_ARCH_FLAGS) \
                -fno-math-errno -fstack-clash-protection -Itests/emu/include -Ilib -Ikernels \
                $(DEP_CFLAGS)
ifeq ($(CUDA),emu)
  EMU_LIB := $(FT_BUILD)/libcudaemu.a
  FT_CFLAGS += -DFT_HAVE_CUDA -DFT_CUDA_EMU -Itests/emu/include
  EMU_CXXFLAGS += -DFT_HAVE_CUDA -DFT_CUDA_EMU $(if $(filter 1,$(MPI)),-DFT_HAVE_MPI \
                  $(shell mpicc --showme:compile)) $(if $(filter 1,$(NCCL)),-DFT_HAVE_NCCL)
  EMU_KERNEL_FLAGS := -x c++ -ffp-contract=off $(FT_HOST_FMA)
  LDLIBS := $(EMU_LIB) $(LDLIBS) -lstdc++
  FT_LDFLAGS += -rdynamic
endif

# ---- saving the choices given --------------------------------------------------------
# A choice given on the command line is saved when it differs from what make would use
# without it (the detection, the default); given as that, it is dropped from the file.
FT_DEFAULT_CUDA = $(FT_AUTO_CUDA)
FT_DEFAULT_MPI = $(FT_AUTO_MPI)
FT_DEFAULT_NCCL = $(FT_AUTO_NCCL)
FT_DEFAULT_CUDA_HOME = /usr/local/cuda
FT_DEFAULT_CUDA_ARCHS = 80 89 90
FT_DEFAULT_OPT = -O2
FT_DEFAULT_CFLAGS = $(OPT) -g
FT_DEFAULT_LDFLAGS =
ft_same = $(and $(findstring x$(strip $(1))x,x$(strip $(2))x),$(findstring x$(strip $(2))x,x$(strip $(1))x))
$(foreach v,$(FT_GIVEN),$(if $(call ft_same,$($(v)),$(FT_DEFAULT_$(v))),$(eval undefine \
  FT_SAVED_$(v)),$(eval FT_SAVED_$(v) := $$($(v)))))
# the file: one "FT_SAVED_NAME := value" line per choice ($ as $$, # as \#)
define FT_NL


endef
FT_HASH := \#
ft_make_text = $(subst $(FT_HASH),\$(FT_HASH),$(subst $$,$$$$,$(1)))
FT_SAVED_VARS = $(foreach v,$(FT_REMEMBERED),$(if $(call ft_saved,$(v)),$(v)))
FT_SAVED_LINES = $(foreach v,$(FT_SAVED_VARS),FT_SAVED_$(v) := $(call ft_make_text,$(FT_SAVED_$(v)))$(FT_NL))
FT_SAVED_TEXT := $(FT_HASH) The build choices given on make's command line (mk/config.mk); make clean \
                 forgets them.$(FT_NL)$(subst $(FT_NL) ,$(FT_NL),$(FT_SAVED_LINES))
# (the emulated build, CUDA=emu, saves nothing: it must not change what a later make builds)
ifneq ($(filter-out emu,$(CUDA)),)
ifneq ($(FT_GIVEN),)
  ifeq ($(strip $(FT_SAVED_VARS)),)
    $(shell rm -f $(FT_SAVED_CHOICES))
  else ifneq ($(strip $(FT_SAVED_TEXT)),$(strip $(file <$(FT_SAVED_CHOICES))))
    $(shell mkdir -p build)
    $(file >$(FT_SAVED_CHOICES).$(MAKELEVEL).tmp,$(FT_SAVED_TEXT))
    $(shell mv -f $(FT_SAVED_CHOICES).$(MAKELEVEL).tmp $(FT_SAVED_CHOICES))
  endif
endif
endif
