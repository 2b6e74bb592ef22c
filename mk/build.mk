# Build rules: lib/<subsystem>/ + kernels/ -> build/libft.a; tools/*.c -> bin/<tool>
# (build-emu/libft.a and build-emu/bin/<tool> in the emulated build, CUDA=emu, which also
# makes build-emu/libcudaemu.a from tests/emu/runtime).
#
# Each step prints one short line on stderr ("CC lib/core/cli.c", "NVCC
# kernels/cuda/x.cu", "AR build/libft.a", "LINK bin/ft-train"); V=1 prints the commands
# instead, make -s nothing. The compiler's errors and warnings show in full either way.

LIB_SRCS := $(wildcard lib/*/*.c) kernels/ops.c $(wildcard kernels/cpu/*.c)
CUDA_SRCS := $(if $(filter 1 emu,$(CUDA)),$(wildcard kernels/cuda/*.cu))
LIB_OBJS := $(LIB_SRCS:%.c=$(FT_BUILD)/%.o) $(CUDA_SRCS:%.cu=$(FT_BUILD)/%.o)
LIBFT := $(FT_BUILD)/libft.a

TOOL_NAMES := gpu-info ft-quantize ft-lora-init ft-train ft-eval ft-merge
TOOLS := $(TOOL_NAMES:%=$(FT_BIN)/%)

# The CUDA emulation (tests/emu/runtime): the whole of it in the emulated build; in the
# others only its kernel engine (no CUDA API symbol), for the host tests of tests/emu.
EMU_RT_SRCS := $(filter-out $(if $(filter 1,$(NCCL)),,tests/emu/runtime/nccl_emu.cc), \
                 $(wildcard tests/emu/runtime/*.cc))
EMU_ENGINE_SRCS := tests/emu/runtime/context.cc tests/emu/runtime/exec.cc
EMU_ENGINE_LIB := $(if $(filter emu,$(CUDA)),$(EMU_LIB),$(FT_BUILD)/tests/emu/libemu-engine.a)

# Installed as include/ftkit/<subsystem>/x.h (and include/ftkit/ops.h), the layout the
# headers include each other by: compile against them with -I$(PREFIX)/include/ftkit.
PUBLIC_HEADERS := $(filter-out %_internal.h,$(wildcard lib/*/*.h))

# $(call ft_step,WHAT,file) at the start of a recipe line: the short line (the line's
# command itself is not echoed), or nothing with V=1 (make echoes the command); make -s
# prints neither.
ifeq ($(V),1)
  ft_step =
else ifneq ($(findstring s,$(filter-out --%,$(firstword $(MAKEFLAGS)))),)
  ft_step = @
else
  ft_step = @printf '  %-5s %s\n' $(1) $(call q,$(2)) >&2;
endif

# The compiler, the flags given (CFLAGS, LDFLAGS: a word each) and the detected ones.
FT_CC = $(call q,$(CC)) $(FT_CFLAGS) $(call qw,$(CFLAGS))
FT_LD = $(FT_LDFLAGS) $(call qw,$(LDFLAGS))

# Rebuild everything when the flags change (CUDA=0 vs CUDA=1, OPT=..., CUDA_ARCHS=...).
# The file's last word is CUDA (the tests read it to call make the way the build was).
BUILD_FLAGS := $(FT_BUILD)/.flags
FT_FLAGS_TEXT := $(CC) $(FT_CFLAGS) $(CFLAGS) $(NVCC_FLAGS) $(EMU_CXXFLAGS) $(EMU_KERNEL_FLAGS) \
                 $(CUDA)
ifneq ($(FT_FLAGS_TEXT),$(file <$(BUILD_FLAGS)))
  $(shell mkdir -p $(FT_BUILD))
  $(file >$(BUILD_FLAGS),$(FT_FLAGS_TEXT))
endif

FT_CXX_EMU = $(call q,$(CXX_EMU)) $(EMU_CXXFLAGS)

$(FT_BUILD)/%.o: %.c $(BUILD_FLAGS)
	@mkdir -p $(dir $@)
	$(call ft_step,CC,$<)$(FT_CC) -MMD -MP -c $< -o $@

ifeq ($(CUDA),emu)
$(FT_BUILD)/%.o: %.cu $(BUILD_FLAGS)
	@mkdir -p $(dir $@)
	$(call ft_step,CXX,$<)$(FT_CXX_EMU) $(EMU_KERNEL_FLAGS) -MMD -MP -c $< -o $@
else
$(FT_BUILD)/%.o: %.cu $(BUILD_FLAGS)
	@mkdir -p $(dir $@)
	$(call ft_step,NVCC,$<)$(call q,$(NVCC)) $(NVCC_FLAGS) -c $< -o $@
endif

$(FT_BUILD)/tests/emu/runtime/%.o: tests/emu/runtime/%.cc $(BUILD_FLAGS)
	@mkdir -p $(dir $@)
	$(call ft_step,CXX,$<)$(FT_CXX_EMU) -MMD -MP -c $< -o $@

$(LIBFT): $(LIB_OBJS)
	@rm -f $@
	$(call ft_step,AR,$@)ar rcs $@ $^

$(FT_BUILD)/libcudaemu.a: $(EMU_RT_SRCS:%.cc=$(FT_BUILD)/%.o)
	@rm -f $@
	$(call ft_step,AR,$@)ar rcs $@ $^

$(FT_BUILD)/tests/emu/libemu-engine.a: $(EMU_ENGINE_SRCS:%.cc=$(FT_BUILD)/%.o)
	@rm -f $@
	$(call ft_step,AR,$@)ar rcs $@ $^

$(FT_BIN)/%: $(FT_BUILD)/tools/%.o $(LIBFT) $(EMU_LIB)
	@mkdir -p $(FT_BIN)
	$(call ft_step,LINK,$@)$(call q,$(CC)) $(FT_LD) $< $(LIBFT) $(LDLIBS) -o $@

-include $(shell find $(FT_BUILD) -name '*.d' 2>/dev/null)
