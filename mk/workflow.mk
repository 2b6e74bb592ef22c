# Workflow targets: the tools chained on one run config.
#
#   make train [CONFIG=configs/x.yaml] [SECTION_KEY=value ...] [RESUME=auto|dir]
#   make train-dpo [CONFIG=configs/dpo.yaml] [SECTION_KEY=value ...] [RESUME=auto|dir]
#   make eval | merge | lora-init  [CONFIG=...] [MODEL=dir] [ADAPTER=dir|none] [DATA=file] [OUT=dir]
#   make tb | train-tb             [RUN_DIR=dir] [TB_PORT=6006]
#   make gpu-info | memory-check [NUM_GPUS=n]
#   make train-distributed | train-zero [ZERO_STAGE=2] | train-deepspeed [DEEPSPEED_CONFIG=...]
#        | train-fsdp | train-model-parallel     [NUM_GPUS=n] [HOSTFILE=file] [MPIRUN=...]
#   make <any train target>-tb     TensorBoard in the background, then that training
#   make compare RUNS="runs/a runs/b" [PLOT=runs/compare.svg]
#
# Every variable given on the command line whose name is all capitals with an underscore
# (SECTION_KEY, e.g. TRAIN_BATCH_SIZE=4, TUNING_LORA_R=8, MODEL_MAX_SEQ_LEN=1024) and is not
# one of the Make-level knobs below, nor an environment variable of the ranks (a name
# starting with NCCL_, FT_, OMPI_, PMIX_, UCX_, SLURM_ or CUDA_), goes to ft-train as
# `--set-var NAME=value`, which maps it onto its config key (train.batch_size, ...); a name
# that matches no key fails there, naming it. The other targets read the resolved config
# the same way (ft-train --get KEY), so an override applies to the whole chain.
#
# Every train target checks the run before anything starts (ft-train --check N, N the
# ranks of the launch: the model dir, the data, the global batch and the strategy at N
# ranks, ...), once, before mpirun / srun and before the default job's "before"
# evaluation.
#
# With the embedded default config (configs/default.yaml: a tiny model and a toy task in
# demo/, seconds to minutes on a CPU), `make train` also evaluates the base before and the
# adapter after training, merges the adapter into train.output_dir/merged and prints a
# before/after summary; BEFORE_AFTER=1 does that for any config, BEFORE_AFTER=0 never. The
# default job starts over in its own run dir each time (train.overwrite_output_dir=true,
# where ft-train has that key) unless RESUME or TRAIN_OUTPUT_DIR is given.
#
# Every value a variable brings into a recipe is quoted for the shell ($(call q,...),
# mk/config.mk); NUM_GPUS, TB_PORT and ZERO_STAGE must be numbers in their range.

DEFAULT_CONFIG := configs/default.yaml
CONFIG ?= $(DEFAULT_CONFIG)
TB_PORT ?= 6006
BEFORE_AFTER ?= $(if $(filter $(DEFAULT_CONFIG) ./$(DEFAULT_CONFIG),$(CONFIG)),1,0)
ZERO_STAGE ?= 2
DEEPSPEED_CONFIG ?= deepspeed_like/zero2.json
MPIRUN ?= $(if $(SLURM_JOB_ID),srun,mpirun)

# Make-level knobs: never config overrides.
FT_MAKE_KNOBS := CONFIG CUDA CUDA_HOME CUDA_ARCHS CC NVCC NVCC_FLAGS PKG_CONFIG PREFIX DESTDIR \
                 NUM_GPUS NUM_NODES HOSTFILE ZERO_STAGE OPT CFLAGS LDFLAGS LDLIBS VENV \
                 DEEPSPEED_CONFIG RUN_DIR ADAPTER OUT DATA MODEL TB_PORT BEFORE_AFTER \
                 MPIRUN RESUME RUNS PLOT OMP_NUM_THREADS MAKEFLAGS MAKEOVERRIDES MFLAGS SHELL \
                 BENCH_ARGS CXX_EMU PYTHON
# Environment variables of the ranks (NCCL_TIMEOUT, FT_DIST_TIMEOUT, ...): not config keys.
FT_ENV_PREFIXES := NCCL_% FT_% OMPI_% PMIX_% UCX_% SLURM_% CUDA_%
FT_LOWER := a b c d e f g h i j k l m n o p q r s t u v w x y z
ft_is_var = $(and $(findstring _,$(1)),$(if $(strip $(foreach c,$(FT_LOWER),$(findstring $(c),$(1)))),,1))
FT_VAR_NAMES = $(sort $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(if \
  $(filter $(FT_MAKE_KNOBS) $(FT_ENV_PREFIXES),$(v)),,$(if $(call ft_is_var,$(v)),$(v))))))
FT_SET_VARS = $(foreach v,$(FT_VAR_NAMES), --set-var $(call q,$(v)=$($(v))))
ft_given = $(filter command line,$(origin $(1)))

# $(call ft_is_count,text): non-empty when text is a positive integer (digits, no leading 0).
ft_is_count = $(and $(filter 1,$(words x$(1)x)),$(if $(strip $(call \
  ft_strip_chars,$(1),0 1 2 3 4 5 6 7 8 9)),,1),$(if $(filter 0%,$(1)),,1))
# $(call ft_cached,NAME,VAR): VAR's value, computed once per make and target.
ft_cached = $(if $(filter undefined,$(origin FT_CACHE_$(1)_$@)),$(eval FT_CACHE_$(1)_$@ := \
  $$($(2))))$(FT_CACHE_$(1)_$@)

# ---- the config ------------------------------------------------------------------------
# ft-train on the config with the overrides and what the target sets (its strategy, its
# run dir, ...: FT_TARGET_SET); in a recipe, $(call ft_get,KEY) is the resolved value of
# KEY (after a line that checked the config: errors show there).
FT_CFG = bin/ft-train --config $(call q,$(CONFIG))$(FT_SET_VARS)$(FT_TARGET_SET)
ft_get = $$($(FT_CFG) --get $(1) 2>/dev/null)
FT_TARGET_SET = $(if $(FT_DIST_SET), $(FT_DIST_SET))$(FT_OUT_SET)$(FT_FRESH_SET)

# That the config and the overrides load (the targets that do not train).
FT_CFG_LOADS = $(FT_CFG) --get train.output_dir > /dev/null

# A strategy target trains in its own run dir: the config's train.output_dir (with the
# overrides) plus the target's suffix (runs/default-zero2, ...), unless TRAIN_OUTPUT_DIR
# is given. Empty when the config does not load (the check says why).
FT_OWN_DIR_SH = $(shell d=$$(bin/ft-train --config $(call q,$(CONFIG))$(FT_SET_VARS) --get \
  train.output_dir 2>/dev/null) && [ -n "$$d" ] && printf '%s%s' "$${d%/}" $(call q,$(FT_RUN_SUFFIX)))
FT_OUT_SET = $(if $(FT_RUN_SUFFIX),$(if $(call ft_given,TRAIN_OUTPUT_DIR),,$(if \
  $(call ft_cached,owndir,FT_OWN_DIR_SH), --set $(call q,train.output_dir=$(call ft_cached,owndir,FT_OWN_DIR_SH)))))

# The default job starts over (its own run dir, not one the user named; not resumed):
# train.overwrite_output_dir=true, where this ft-train has that key.
FT_HAS_OVERWRITE_SH = $(shell bin/ft-train --config $(DEFAULT_CONFIG) --get \
  train.overwrite_output_dir > /dev/null 2>&1 && echo 1)
FT_FRESH_SET = $(if $(and $(FT_IS_TRAIN),$(filter $(DEFAULT_CONFIG) ./$(DEFAULT_CONFIG),$(CONFIG)),$(if \
  $(RESUME)$(call ft_given,TRAIN_OUTPUT_DIR)$(call ft_given,TRAIN_OVERWRITE_OUTPUT_DIR),,1),$(call \
  ft_cached,overwrite,FT_HAS_OVERWRITE_SH)), --set train.overwrite_output_dir=true)

# Shell functions for recipes. show CMD ARGS...: prints the command on stderr (each
# argument quoted where the shell would need it), then runs it.
define FT_SHOW
show() { \
  s=; for a in "$$@"; do \
    case $$a in ''|*[!A-Za-z0-9_./:,+=@%-]*) a="'$$(printf '%s' "$$a" | sed "s/'/'\\\\''/g")'" ;; esac; \
    printf '%s%s' "$$s" "$$a" >&2; s=' '; \
  done; echo >&2; "$$@"; }
endef

# Shell snippet: reads the config into shell variables (stops on a bad config or override).
# model, data (eval_path, else train_path), run (output_dir), adapter (ADAPTER, else
# run/final when it exists; ADAPTER=none: no adapter), and `ft_eval CMD...`: CMD (bin/ft-eval
# and its options, or show bin/ft-eval ...) with the run's data preparation and device
# (train.device; fp32 on the GPU without train.bf16), and generation when gen is set
# (train.predict_with_generate).
define FT_READ_CONFIG
set -e; $(FT_SHOW); \
model=$(call q,$(MODEL)); [ -n "$$model" ] || model=$(call ft_get,model.name); \
run=$(call ft_get,train.output_dir); \
data=$(call q,$(DATA)); [ -n "$$data" ] || data=$(call ft_get,data.eval_path); \
[ -n "$$data" ] || data=$(call ft_get,data.train_path); \
adapter=$(call q,$(ADAPTER)); \
if [ -z "$$adapter" ] && [ -d "$$run/final" ]; then adapter="$$run/final"; fi; \
[ "$$adapter" != none ] || adapter=; \
maxlen=$(call ft_get,model.max_seq_len); fmt=$(call ft_get,data.format); \
tmpl=$(call ft_get,data.chat_template); tok=$(call ft_get,model.tokenizer); \
tname=$(call ft_get,data.chat_template_name); tkw=$(call ft_get,data.chat_template_kwargs); \
dev=$(call ft_get,train.device); maxnew=$(call ft_get,train.generation_max_new_tokens); \
all=; [ "$(call ft_get,data.train_on_all)" = false ] || all=--train-on-all; \
noeos=; [ "$(call ft_get,data.add_eos)" = true ] || noeos=--no-add-eos; \
fp32=; [ "$(call ft_get,train.bf16)" = true ] || fp32=--fp32; \
gen=; [ "$(call ft_get,train.predict_with_generate)" != true ] || gen=1; \
ft_eval() { "$$@" --max-seq-len "$$maxlen" --format "$$fmt" --template "$$tmpl" \
  $${tname:+--template-name "$$tname"} --template-kwargs "$$tkw" \
  $${tok:+--tokenizer "$$tok"} $$all $$noeos --device "$$dev" $$fp32 \
  $${gen:+--generate --max-new-tokens "$$maxnew"}; }
endef

# Prints "name  loss  perplexity  exact_match  rougeL" from an ft-eval --json file.
define FT_SUMMARY_ROW
awk -v name=$(1) 'function num(x, fmt) { return x == "null" ? sprintf(fmt "s", "-") : sprintf(fmt "f", x) } \
  {gsub(/[{}" ]/, ""); n = split($$0, kv, ","); for (i = 1; i <= n; i++) if (split(kv[i], p, ":") == 2) v[p[1]] = p[2]} \
  END {printf "  %-8s %s %s", name, num(v["loss"], "%8.4"), num(v["perplexity"], "%11.3"); \
       if ("exact_match" in v) printf " %s %s", num(v["exact_match"], "%12.3"), num(v["rougeL"], "%8.3"); \
       printf "\n"}' $(2)
endef

# ---- Distributed training -------------------------------------------------------------
# train-distributed, train-zero, ... run the `train` recipe below (the same CONFIG and
# SECTION_KEY overrides, the same before/after summary for the default config) with
# ft-train started once per rank by mpirun (or srun under Slurm). Each target adds its
# strategy with --set, which applies after the config file and the overrides, and trains
# in its own run dir (FT_OUT_SET). Every rank joins the run; rank 0 writes the outputs.
# Their knobs:
#   NUM_GPUS=n         ranks; default: one per visible GPU (bin/gpu-info --count), else 2
#                      CPU ranks (then with --oversubscribe --bind-to none)
#   HOSTFILE=file      mpirun --hostfile file: ranks on several nodes
#   MPIRUN=cmd         the launcher (default mpirun; srun when SLURM_JOB_ID is set). Its
#                      options are Open MPI's, or srun's when the command is srun.
#   OMP_NUM_THREADS=n  threads per rank; CPU ranks get cores / ranks per node unless set.
#   ZERO_STAGE=1|2|3   train-zero (default 2);  DEEPSPEED_CONFIG=file  train-deepspeed
# FT_DIST_TIMEOUT and NCCL_TIMEOUT, when set, go to the ranks of other nodes too (-x).
FT_DIST_TARGETS := train-distributed train-zero train-deepspeed train-fsdp train-model-parallel
FT_TRAIN_TARGETS := train $(FT_DIST_TARGETS)

# What each target sets (its -tb variant the same: TensorBoard watches its run dir).
$(FT_TRAIN_TARGETS) $(FT_TRAIN_TARGETS:%=%-tb): FT_IS_TRAIN := 1
train-distributed train-distributed-tb: FT_DIST_SET = --set dist.strategy=ddp
train-distributed train-distributed-tb: FT_RUN_SUFFIX = -ddp
train-distributed train-distributed-tb: FT_STRATEGY = ddp
train-zero train-zero-tb: FT_DIST_SET = --set dist.strategy=zero$(FT_ZERO_STAGE)
train-zero train-zero-tb: FT_RUN_SUFFIX = -zero$(FT_ZERO_STAGE)
train-zero train-zero-tb: FT_STRATEGY = zero$(FT_ZERO_STAGE)
train-deepspeed train-deepspeed-tb: FT_DIST_SET = --set $(call q,dist.deepspeed_config=$(DEEPSPEED_CONFIG))
train-deepspeed train-deepspeed-tb: FT_RUN_SUFFIX = -deepspeed-$(FT_DS_NAME)
train-deepspeed train-deepspeed-tb: FT_STRATEGY = deepspeed $(DEEPSPEED_CONFIG)
train-deepspeed train-deepspeed-tb: FT_DIST_CHECK = [ -f $(call q,$(DEEPSPEED_CONFIG)) ] || { \
  printf 'make %s: DEEPSPEED_CONFIG=%s: no such file (shipped: %s)\n' $@ $(call q,$(DEEPSPEED_CONFIG)) \
  $(call q,$(or $(wildcard deepspeed_like/*.json),none)) >&2; exit 1; };
train-fsdp train-fsdp-tb: FT_DIST_SET = --set dist.strategy=fsdp
train-fsdp train-fsdp-tb: FT_RUN_SUFFIX = -fsdp
train-fsdp train-fsdp-tb: FT_STRATEGY = fsdp
train-model-parallel train-model-parallel-tb: FT_DIST_SET = --set dist.strategy=model_parallel
train-model-parallel train-model-parallel-tb: FT_RUN_SUFFIX = -model-parallel
train-model-parallel train-model-parallel-tb: FT_STRATEGY = model_parallel
$(FT_DIST_TARGETS) $(FT_DIST_TARGETS:%=%-tb): FT_LAUNCH = $(FT_LAUNCHER)

# The DeepSpeed JSON's name without its folder and .json: zero3_offload.
FT_DS_NAME = $(shell n=$(call q,$(DEEPSPEED_CONFIG)); n=$${n##*/}; printf '%s' "$${n%.json}")
FT_ZERO_STAGE = $(if $(filter 1 2 3,$(ZERO_STAGE)),$(ZERO_STAGE),$(error ZERO_STAGE=$(ZERO_STAGE): \
  the ZeRO stage is 1, 2 or 3 (1: optimizer state sharded, 2: + gradients, 3: + parameters)))
FT_NUM_GPUS_OK = $(if $(NUM_GPUS),$(if $(call ft_is_count,$(NUM_GPUS)),,\
  $(error NUM_GPUS=$(NUM_GPUS): the number of ranks, a positive integer)))
# (the shell sees TB_PORT only once it is known to be digits: $(and) stops at the first empty)
FT_TB_PORT = $(if $(and $(call ft_is_count,$(TB_PORT)),$(shell [ $(TB_PORT) -le 65535 ] 2>/dev/null \
  && echo 1)),$(TB_PORT),$(error TB_PORT=$(TB_PORT): a port number, 1-65535))

# Visible GPUs, asked once per make (empty when none); the ranks; CPU ranks when no GPU.
FT_GPU_COUNT = $(eval FT_GPU_COUNT := $$(filter-out 0,$$(firstword $$(shell bin/gpu-info --count 2>/dev/null))))$(FT_GPU_COUNT)
FT_NP = $(or $(NUM_GPUS),$(FT_GPU_COUNT),2)
FT_CPU_RANKS = $(if $(FT_GPU_COUNT),,1)

# srun: --ntasks unless the allocation fixed it (SLURM_NTASKS) and NUM_GPUS is not given.
FT_SRUN = $(filter srun,$(notdir $(firstword $(MPIRUN))))
FT_SRUN_NTASKS = $(if $(or $(NUM_GPUS),$(if $(SLURM_NTASKS),,1)),1)
FT_RANKS = $(if $(FT_SRUN),$(if $(FT_SRUN_NTASKS),$(FT_NP),$(SLURM_NTASKS)),$(FT_NP))
FT_NODES = $(if $(FT_SRUN),$(SLURM_JOB_NUM_NODES),$(if $(HOSTFILE),$(shell grep -c \
  '^[[:space:]]*[^#[:space:]]' $(call q,$(HOSTFILE)) 2>/dev/null)))

# Threads per rank: OMP_NUM_THREADS when set; for CPU ranks, srun's --cpus-per-task, else
# this machine's cores over the ranks per node (at least 1).
FT_OMP_AUTO = $(or $(if $(FT_SRUN),$(SLURM_CPUS_PER_TASK)),$(shell n=$$(nproc 2>/dev/null || echo 1); \
  r=$(call q,$(FT_RANKS)); h=$(call q,$(or $(FT_NODES),1)); [ "$$h" -ge 1 ] 2>/dev/null || h=1; \
  per=$$(( (r + h - 1) / h )); t=$$(( n / per )); [ "$$t" -ge 1 ] || t=1; echo $$t))
FT_OMP = $(if $(filter undefined default,$(origin OMP_NUM_THREADS)),$(if $(FT_CPU_RANKS),$(FT_OMP_AUTO)),$(OMP_NUM_THREADS))

FT_FORWARD_ENV = $(foreach v,FT_DIST_TIMEOUT NCCL_TIMEOUT,$(if $(filter environment% command%,$(origin $(v))), -x $(v)))
FT_MPIRUN_CMD = $(call qw,$(MPIRUN))$(if $(filter 0,$(shell id -u)), --allow-run-as-root) -np $(FT_NP)\
  $(if $(HOSTFILE), --hostfile $(call q,$(HOSTFILE)))$(if $(FT_CPU_RANKS), --oversubscribe --bind-to none)\
  $(if $(FT_OMP), -x $(call q,OMP_NUM_THREADS=$(FT_OMP)))$(FT_FORWARD_ENV)
FT_SRUN_CMD = $(call qw,$(MPIRUN))$(if $(FT_SRUN_NTASKS), --ntasks=$(FT_NP))$(if $(FT_OMP), $(call \
  q,--export=ALL$(FT_COMMA)OMP_NUM_THREADS=$(FT_OMP)))
FT_LAUNCHER = $(FT_NUM_GPUS_OK)$(strip $(if $(FT_SRUN),$(FT_SRUN_CMD),$(FT_MPIRUN_CMD)))

# The training command of a train target, and what to check before it: (distributed)
# the launcher, the hostfile and the target's own check, then the run at the launch's
# ranks (ft-train --check), in one process so that it is said once, not by every rank.
FT_TRAIN_CMD = $(if $(FT_LAUNCH),$(FT_LAUNCH) )$(FT_CFG)$(if $(RESUME), --resume $(call q,$(RESUME)))
define FT_LAUNCH_CHECK_SH
command -v $(call q,$(firstword $(MPIRUN))) > /dev/null 2>&1 || { \
printf 'make %s: %s not found: %s or name the launcher: MPIRUN=...\n' $@ $(call q,$(firstword $(MPIRUN))) \
$(call q,$(if $(FT_SRUN),run inside a Slurm job,install Open MPI (openmpi-bin; scripts/install-deps.sh build does))) \
>&2; exit 1; }; \
$(if $(HOSTFILE),$(if $(FT_SRUN),echo "make $@: HOSTFILE is not used under srun: Slurm places the ranks on the job's nodes" >&2;,\
[ -f $(call q,$(HOSTFILE)) ] || { printf 'make %s: HOSTFILE=%s: no such file\n' $@ $(call q,$(HOSTFILE)) >&2; exit 1; };)) \
$(FT_DIST_CHECK)
endef
FT_CHECK_RANKS = $(if $(FT_LAUNCH),$(FT_RANKS),1)
FT_TRAIN_CHECK = $(if $(FT_LAUNCH),$(FT_LAUNCH_CHECK_SH) )$(FT_CFG) --check $(call q,$(FT_CHECK_RANKS)) > /dev/null

.PHONY: train eval merge lora-init gpu-info memory-check tb compare $(FT_DIST_TARGETS) \
        $(FT_TRAIN_TARGETS:%=%-tb) train-dpo

# The build needs the C libraries installed: checked once per build dir.
DEPS_STAMP := $(FT_BUILD)/.deps-build
$(DEPS_STAMP): scripts/install-deps.sh
	$(call ft_step,DEPS,scripts/install-deps.sh build)scripts/install-deps.sh build
	@$(FT_OPENBLAS_CHECK)
	@mkdir -p $(dir $@) && touch $@
$(LIB_OBJS) $(TOOLS:$(FT_BIN)/%=$(FT_BUILD)/tools/%.o): | $(DEPS_STAMP)

# The default job: the "before" evaluation goes to a temporary dir and joins the run dir
# once the training has made it (the run dir holds only the run's own files until then).
$(FT_TRAIN_TARGETS): $(TOOLS)
ifeq ($(BEFORE_AFTER),1)
	@set -e; $(FT_TRAIN_CHECK); \
	$(FT_READ_CONFIG); \
	gen=1; \
	before=$$(mktemp -d); trap 'rm -rf "$$before"' EXIT; \
	echo "== before: the base model $$model on $$data" >&2; \
	ft_eval bin/ft-eval --model "$$model" --data "$$data" --json \
	  --predictions "$$before/predictions-before.jsonl" > "$$before/eval-before.json" \
	  2> "$$before/eval-before.log" || { cat "$$before/eval-before.log" >&2; exit 1; }; \
	printf '== training: %s -> %s%s\n' $(call q,$(CONFIG)) "$$run" \
	  $(call q,$(if $(FT_LAUNCH), ($(FT_STRATEGY)$(FT_COMMA) $(FT_RANKS) ranks))) >&2; \
	adapter=$$($(FT_TRAIN_CMD)); \
	mv -f "$$before"/* "$$run"/; \
	echo "== after: $$model + $$adapter" >&2; \
	mode=$(call ft_get,tuning.mode); \
	if [ "$$mode" = full ]; then set -- --model "$$adapter"; else set -- --model "$$model" --adapter "$$adapter"; fi; \
	ft_eval bin/ft-eval "$$@" --data "$$data" --json \
	  --predictions "$$run/predictions-after.jsonl" > "$$run/eval-after.json" 2> "$$run/eval-after.log" \
	  || { cat "$$run/eval-after.log" >&2; exit 1; }; \
	if [ "$$mode" != full ]; then \
	  echo "== merging: $$model + $$adapter -> $$run/merged" >&2; \
	  bin/ft-merge --model "$$model" --adapter "$$adapter" --out "$$run/merged" --force > /dev/null; \
	fi; \
	echo; \
	echo "Before and after fine-tuning ($$data):"; \
	printf "  %-8s %8s %11s %12s %8s\n" "" loss perplexity exact_match rougeL; \
	$(call FT_SUMMARY_ROW,before,"$$run/eval-before.json"); \
	$(call FT_SUMMARY_ROW,after,"$$run/eval-after.json"); \
	echo; \
	echo "adapter:     $$adapter"; \
	[ ! -d "$$run/merged" ] || echo "merged:      $$run/merged"; \
	echo "predictions: $$run/predictions-before.jsonl, $$run/predictions-after.jsonl (logs: eval-*.log)"; \
	echo "TensorBoard: $$run (make tb$(if $(FT_RUN_SUFFIX), RUN_DIR=$$run))"
else
	@$(FT_TRAIN_CHECK)
	$(FT_TRAIN_CMD)
endif

# Preference tuning: configs/dpo.yaml (DPO of the demo model on demo/pref_train.jsonl,
# preference accuracy on demo/pref_eval.jsonl) unless CONFIG is given; the same overrides
# as train (TRAIN_EPOCHS=1, TRAIN_PREF_BETA=0.2, ...). The demo config starts over in its
# run dir each time, unless RESUME or TRAIN_OUTPUT_DIR is given.
DPO_CONFIG := configs/dpo.yaml
train-dpo: CONFIG = $(DPO_CONFIG)
train-dpo: FT_IS_TRAIN := 1
train-dpo: FT_FRESH_SET = $(if $(and $(filter $(DPO_CONFIG) ./$(DPO_CONFIG),$(CONFIG)),$(if \
  $(RESUME)$(call ft_given,TRAIN_OUTPUT_DIR)$(call ft_given,TRAIN_OVERWRITE_OUTPUT_DIR),,1)), \
  --set train.overwrite_output_dir=true)
train-dpo: $(TOOLS)
	@set -e; $(FT_TRAIN_CHECK); \
	$(FT_READ_CONFIG); \
	printf '== preference tuning: %s -> %s\n' $(call q,$(CONFIG)) "$$run" >&2; \
	final=$$($(FT_TRAIN_CMD)); \
	ev=$(call ft_get,data.eval_path); \
	if [ -n "$$ev" ]; then \
	  echo "== preference accuracy on $$ev (ft-eval --preference)" >&2; \
	  if [ "$(call ft_get,tuning.mode)" = full ]; then set -- --model "$$final" --reference "$$model"; \
	  else set -- --model "$$model" --adapter "$$final"; fi; \
	  ft_eval bin/ft-eval "$$@" --data "$$ev" --preference --beta "$(call ft_get,train.pref.beta)"; \
	fi; \
	echo "adapter:     $$final"; \
	echo "TensorBoard: $$run (make tb RUN_DIR=$$run)"

eval: $(TOOLS)
	@set -e; $(FT_CFG_LOADS); \
	$(FT_READ_CONFIG); \
	ft_eval show bin/ft-eval --model "$$model" $${adapter:+--adapter "$$adapter"} --data "$$data"

merge: $(TOOLS)
	@set -e; $(FT_CFG_LOADS); \
	$(FT_READ_CONFIG); \
	[ -n "$$adapter" ] || { echo "make merge: no adapter: $$run/final does not exist (make train first, or ADAPTER=dir)" >&2; exit 1; }; \
	out=$(call q,$(OUT)); [ -n "$$out" ] || out="$$run/merged"; \
	show bin/ft-merge --model "$$model" --adapter "$$adapter" --out "$$out" --force

lora-init: $(TOOLS)
	@set -e; $(FT_CFG_LOADS); \
	$(FT_READ_CONFIG); \
	out=$(call q,$(OUT)); [ -n "$$out" ] || out="$$run/lora-init"; \
	rs=; [ "$(call ft_get,tuning.lora.rslora)" = false ] || rs=--rslora; \
	mts="$(call ft_get,tuning.lora.modules_to_save)"; [ -z "$$mts" ] || rs="$$rs --modules-to-save $$mts"; \
	[ "$(call ft_get,tuning.lora.use_dora)" = false ] || rs="$$rs --dora"; \
	set --; rp="$(call ft_get,tuning.lora.rank_pattern)"; ap="$(call ft_get,tuning.lora.alpha_pattern)"; \
	[ "$$rp" = "{}" ] || set -- "$$@" --rank-pattern "$$rp"; \
	[ "$$ap" = "{}" ] || set -- "$$@" --alpha-pattern "$$ap"; \
	show bin/ft-lora-init --model "$$model" --out "$$out" --r $(call ft_get,tuning.lora.r) \
	  --alpha $(call ft_get,tuning.lora.alpha) --dropout $(call ft_get,tuning.lora.dropout) \
	  --target $(call ft_get,tuning.lora.target_modules) --seed $(call ft_get,train.seed) $$rs "$$@"

gpu-info: bin/gpu-info
	bin/gpu-info

# The memory plan of CONFIG per category with the peaks of one measured training step
# beside it (ft-train --measure: every rank measures its own allocator, rank 0 prints;
# nothing is written to the run dir), then the devices' live usage. Ranks: NUM_GPUS, else
# one per visible GPU, else one CPU process; several start through the launcher of the
# train targets (mpirun / srun, HOSTFILE, MPIRUN). dist.strategy is the config's
# (DIST_STRATEGY=zero3 sets it).
memory-check: FT_NP = $(or $(NUM_GPUS),$(FT_GPU_COUNT),1)
memory-check: FT_LAUNCH = $(if $(filter-out 1,$(FT_NP)),$(FT_LAUNCHER))
memory-check: bin/ft-train bin/gpu-info
	@$(FT_TRAIN_CHECK)
	$(if $(FT_LAUNCH),$(FT_LAUNCH) )$(FT_CFG) --measure
	@bin/gpu-info

# TensorBoard on the run dir (RUN_DIR, else train.output_dir), from PATH or the venv.
FT_TENSORBOARD = $(firstword $(shell command -v tensorboard 2>/dev/null) $(wildcard $(VENV)/bin/tensorboard))
define FT_TB_HINT
echo "tensorboard is not installed: pip install tensorboard (or scripts/setup-python.sh .venv, \
which puts one in .venv/bin); then make tb. The event files are in $$dir." >&2
endef
define FT_RUN_DIR
set -e; dir=$(call q,$(RUN_DIR)); \
[ -n "$$dir" ] || { $(FT_CFG_LOADS); dir=$(call ft_get,train.output_dir); }; \
[ "$$dir" = / ] || dir=$${dir%/}
endef

tb: bin/ft-train
	@$(FT_RUN_DIR); \
	if [ -z $(call q,$(FT_TENSORBOARD)) ]; then $(FT_TB_HINT); exit 0; fi; \
	mkdir -p "$$dir"; \
	echo "TensorBoard on $$dir: http://localhost:$(FT_TB_PORT)/" >&2; \
	exec $(call q,$(FT_TENSORBOARD)) --logdir "$$dir" --port $(FT_TB_PORT)

# <train target>-tb: TensorBoard in the background on the run dir, then the training. Its
# log and pid sit beside the run dir (run.tensorboard.log, .pid), not in it. (Each line
# is its own in the rule: make -n runs a line that names $(MAKE), and only that one.)
$(FT_TRAIN_TARGETS:%=%-tb): %-tb: $(TOOLS)
	@$(FT_TRAIN_CHECK)
	@$(FT_RUN_DIR); \
	if [ -z $(call q,$(FT_TENSORBOARD)) ]; then $(FT_TB_HINT); else \
	  mkdir -p "$$dir"; \
	  $(call q,$(FT_TENSORBOARD)) --logdir "$$dir" --port $(FT_TB_PORT) > "$$dir.tensorboard.log" 2>&1 & \
	  echo $$! > "$$dir.tensorboard.pid"; \
	  echo "TensorBoard on $$dir: http://localhost:$(FT_TB_PORT)/ (pid $$!; log $$dir.tensorboard.log)" >&2; \
	fi
	@+$(MAKE) --no-print-directory $*
	@$(FT_RUN_DIR); [ ! -f "$$dir.tensorboard.pid" ] || \
	  echo "TensorBoard is still running on http://localhost:$(FT_TB_PORT)/ (stop it: kill $$(cat "$$dir.tensorboard.pid"))"

# Runs side by side: a table (stdout) and the loss curves (SVG) of ft-train run dirs.
compare:
	@$(if $(strip $(RUNS)),,echo 'make compare: name the run dirs: make compare RUNS="runs/a runs/b" [PLOT=file.svg]' >&2; exit 2;) \
	scripts/compare-runs.sh $(if $(PLOT),--plot $(call q,$(PLOT))) -- $(call qw,$(RUNS))
