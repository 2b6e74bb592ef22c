# Build rules: lib/<subsystem>/ + kernels/ -> build/libft.a; tools/*.c -> bin/<tool>.

LIB_SRCS := $(wildcard lib/*/*.c) kernels/ops.c $(wildcard kernels/cpu/*.c)
CUDA_SRCS := $(if $(filter 1,$(CUDA)),$(wildcard kernels/cuda/*.cu))
LIB_OBJS := $(LIB_SRCS:%.c=build/%.o) $(CUDA_SRCS:%.cu=build/%.o)
LIBFT := build/libft.a

TOOL_NAMES := gpu-info ft-quantize ft-lora-init ft-train ft-eval ft-merge
TOOLS := $(TOOL_NAMES:%=bin/%)

# Installed as include/ftkit/<subsystem>/x.h (and include/ftkit/ops.h), the layout the
# headers include each other by: compile against them with -I$(PREFIX)/include/ftkit.
PUBLIC_HEADERS := $(filter-out %_internal.h,$(wildcard lib/*/*.h))

# Rebuild everything when the flags change (CUDA=0 vs CUDA=1, OPT=...).
BUILD_FLAGS := build/.flags
$(shell mkdir -p build && echo '$(CC) $(FT_CFLAGS) $(CFLAGS) $(CUDA)' | cmp -s - $(BUILD_FLAGS) \
        || echo '$(CC) $(FT_CFLAGS) $(CFLAGS) $(CUDA)' > $(BUILD_FLAGS))

build/%.o: %.c $(BUILD_FLAGS)
	@mkdir -p $(dir $@)
	$(CC) $(FT_CFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

build/%.o: %.cu $(BUILD_FLAGS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -c $< -o $@

$(LIBFT): $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

bin/%: build/tools/%.o $(LIBFT)
	@mkdir -p bin
	$(CC) $(FT_LDFLAGS) $(LDFLAGS) $< $(LIBFT) $(LDLIBS) -o $@

-include $(shell find build -name '*.d' 2>/dev/null)
