# Workflow targets: the tools chained on one run config.
#
#   make train [CONFIG=configs/x.yaml] [SECTION_KEY=value ...] [RESUME=auto|dir]
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
# one of the Make-level knobs below goes to ft-train as `--set-var NAME=value`, which maps
# it onto its config key (train.batch_size, ...); a name that matches no key fails there,
# naming it. The other targets read the resolved config the same way (ft-train --get KEY),
# so an override applies to the whole chain.
#
# With the embedded default config (configs/default.yaml: a tiny model and a toy task in
# demo/, seconds to minutes on a CPU), `make train` also evaluates the base before and the
# adapter after training, merges the adapter into train.output_dir/merged and prints a
# before/after summary; BEFORE_AFTER=1 does that for any config, BEFORE_AFTER=0 never.

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
                 MPIRUN RESUME RUNS PLOT OMP_NUM_THREADS MAKEFLAGS MAKEOVERRIDES MFLAGS SHELL
FT_LOWER := a b c d e f g h i j k l m n o p q r s t u v w x y z
ft_is_var = $(and $(findstring _,$(1)),$(if $(strip $(foreach c,$(FT_LOWER),$(findstring $(c),$(1)))),,1))
ft_quote = '$(subst ','\'',$(1))'
FT_VAR_NAMES = $(sort $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(if $(filter $(FT_MAKE_KNOBS),$(v)),,$(if $(call ft_is_var,$(v)),$(v))))))
FT_SET_VARS = $(foreach v,$(FT_VAR_NAMES),--set-var $(call ft_quote,$(v)=$($(v))))

# ft-train on the config with the overrides; in a recipe, $(call ft_get,KEY) is the
# resolved value of KEY (after a line that checked the config: errors show there).
FT_CFG = bin/ft-train --config $(call ft_quote,$(CONFIG)) $(FT_SET_VARS)
ft_get = $$($(FT_CFG) --get $(1) 2>/dev/null)

# Checks the config, the overrides and a target's strategy (errors show here, once) by
# reading one key: unlike --print-config it leaves the auto batch size alone, which is
# planned for the ranks of the launch from the model's config.json.
FT_CFG_CHECK = $(FT_CFG)$(if $(FT_DIST_SET), $(FT_DIST_SET)) --get train.output_dir > /dev/null

# Shell snippet: reads the config into shell variables (stops on a bad config or override).
# model, data (eval_path, else train_path), run (output_dir), adapter (ADAPTER, else
# run/final when it exists; ADAPTER=none: no adapter), and the ft-eval options (the run's
# data preparation, and its device: train.device, fp32 on the GPU without train.bf16).
define FT_READ_CONFIG
set -e; show() { echo "$$*" >&2; "$$@"; }; \
$(FT_CFG_CHECK); \
model=$(call ft_quote,$(MODEL)); [ -n "$$model" ] || model=$(call ft_get,model.name); \
run=$(call ft_get,train.output_dir); \
data=$(call ft_quote,$(DATA)); [ -n "$$data" ] || data=$(call ft_get,data.eval_path); \
[ -n "$$data" ] || data=$(call ft_get,data.train_path); \
adapter=$(call ft_quote,$(ADAPTER)); \
if [ -z "$$adapter" ] && [ -d "$$run/final" ]; then adapter="$$run/final"; fi; \
[ "$$adapter" != none ] || adapter=; \
evalopts="--max-seq-len $(call ft_get,model.max_seq_len) --format $(call ft_get,data.format) \
  --template $(call ft_get,data.chat_template)"; \
[ "$(call ft_get,data.train_on_all)" = false ] || evalopts="$$evalopts --train-on-all"; \
[ "$(call ft_get,data.add_eos)" = true ] || evalopts="$$evalopts --no-add-eos"; \
tok=$(call ft_get,model.tokenizer); [ -z "$$tok" ] || evalopts="$$evalopts --tokenizer $$tok"; \
evalopts="$$evalopts --device $(call ft_get,train.device)"; \
[ "$(call ft_get,train.bf16)" = true ] || evalopts="$$evalopts --fp32"; \
maxnew="--max-new-tokens $(call ft_get,train.generation_max_new_tokens)"; \
[ "$(call ft_get,train.predict_with_generate)" = true ] && gen="--generate $$maxnew" || gen=
endef

# Prints "name  loss  perplexity  exact_match  rougeL" from an ft-eval --json file.
define FT_SUMMARY_ROW
awk -v name=$(1) -F'[:,]' '{gsub(/[" ]/, "", $$1); gsub(/ /, "", $$2); v[$$1] = $$2} \
  END {printf "  %-8s %8.4f %11.3f", name, v["loss"], v["perplexity"]; \
       if ("exact_match" in v) printf " %12.3f %8.3f", v["exact_match"], v["rougeL"]; \
       printf "\n"}' $(2)
endef

# ---- Distributed training -------------------------------------------------------------
# train-distributed, train-zero, ... run the `train` recipe below (the same CONFIG and
# SECTION_KEY overrides, the same before/after summary for the default config) with
# ft-train started once per rank by mpirun (or srun under Slurm). Each target adds its
# strategy with --set, which applies after the config file and the overrides. Every rank
# joins the run; rank 0 writes the outputs. Their knobs:
#   NUM_GPUS=n         ranks; default: one per visible GPU (bin/gpu-info --count), else 2
#                      CPU ranks (then with --oversubscribe --bind-to none)
#   HOSTFILE=file      mpirun --hostfile file: ranks on several nodes
#   MPIRUN=cmd         the launcher (default mpirun; srun when SLURM_JOB_ID is set). Its
#                      options are Open MPI's, or srun's when the command is srun.
#   OMP_NUM_THREADS=n  threads per rank; CPU ranks get cores / ranks per node unless set.
#   ZERO_STAGE=1|2|3   train-zero (default 2);  DEEPSPEED_CONFIG=file  train-deepspeed
FT_DIST_TARGETS := train-distributed train-zero train-deepspeed train-fsdp train-model-parallel
FT_TRAIN_TARGETS := train $(FT_DIST_TARGETS)
FT_COMMA := ,

# What each target sets; its -tb variant sets the same, to check it before TensorBoard starts.
train-distributed train-distributed-tb: FT_DIST_SET = --set dist.strategy=ddp
train-zero train-zero-tb: FT_DIST_SET = --set dist.strategy=zero$(FT_ZERO_STAGE)
train-deepspeed train-deepspeed-tb: FT_DIST_SET = --set $(call ft_quote,dist.deepspeed_config=$(DEEPSPEED_CONFIG))
train-deepspeed train-deepspeed-tb: FT_DIST_CHECK = [ -f $(call ft_quote,$(DEEPSPEED_CONFIG)) ] || { \
  echo "make $@: DEEPSPEED_CONFIG=$(DEEPSPEED_CONFIG): no such file (shipped: $(or $(wildcard deepspeed_like/*.json),none))" >&2; exit 1; };
train-fsdp train-fsdp-tb: FT_DIST_SET = --set dist.strategy=fsdp
train-model-parallel train-model-parallel-tb: FT_DIST_SET = --set dist.strategy=model_parallel
$(FT_DIST_TARGETS) $(FT_DIST_TARGETS:%=%-tb): FT_LAUNCH = $(FT_LAUNCHER)

FT_ZERO_STAGE = $(if $(filter 1 2 3,$(ZERO_STAGE)),$(ZERO_STAGE),$(error ZERO_STAGE=$(ZERO_STAGE): \
  the ZeRO stage is 1, 2 or 3 (1: optimizer state sharded, 2: + gradients, 3: + parameters)))
FT_NUM_GPUS_OK = $(if $(NUM_GPUS),$(if $(shell echo $(call ft_quote,$(NUM_GPUS)) | grep -x '[1-9][0-9]*'),,\
  $(error NUM_GPUS=$(NUM_GPUS): the number of ranks, a positive integer)))

# Visible GPUs, asked once per make (empty when none); the ranks; CPU ranks when no GPU.
FT_GPU_COUNT = $(eval FT_GPU_COUNT := $$(filter-out 0,$$(firstword $$(shell bin/gpu-info --count 2>/dev/null))))$(FT_GPU_COUNT)
FT_NP = $(or $(NUM_GPUS),$(FT_GPU_COUNT),2)
FT_CPU_RANKS = $(if $(FT_GPU_COUNT),,1)

# srun: --ntasks unless the allocation fixed it (SLURM_NTASKS) and NUM_GPUS is not given.
FT_SRUN = $(filter srun,$(notdir $(firstword $(MPIRUN))))
FT_SRUN_NTASKS = $(if $(or $(NUM_GPUS),$(if $(SLURM_NTASKS),,1)),1)
FT_RANKS = $(if $(FT_SRUN),$(if $(FT_SRUN_NTASKS),$(FT_NP),$(SLURM_NTASKS)),$(FT_NP))
FT_NODES = $(if $(FT_SRUN),$(SLURM_JOB_NUM_NODES),$(if $(HOSTFILE),$(shell grep -c '^[[:space:]]*[^#[:space:]]' $(call ft_quote,$(HOSTFILE)) 2>/dev/null)))

# Threads per rank: OMP_NUM_THREADS when set; for CPU ranks, srun's --cpus-per-task, else
# this machine's cores over the ranks per node (at least 1).
FT_OMP_AUTO = $(or $(if $(FT_SRUN),$(SLURM_CPUS_PER_TASK)),$(shell n=$$(nproc 2>/dev/null || echo 1); \
  r=$(FT_RANKS); h=$(or $(FT_NODES),1); [ "$$h" -ge 1 ] || h=1; per=$$(( (r + h - 1) / h )); \
  t=$$(( n / per )); [ "$$t" -ge 1 ] || t=1; echo $$t))
FT_OMP = $(if $(filter undefined default,$(origin OMP_NUM_THREADS)),$(if $(FT_CPU_RANKS),$(FT_OMP_AUTO)),$(OMP_NUM_THREADS))

FT_MPIRUN_CMD = $(MPIRUN)$(if $(filter 0,$(shell id -u)), --allow-run-as-root) -np $(FT_NP)\
  $(if $(HOSTFILE), --hostfile $(call ft_quote,$(HOSTFILE)))$(if $(FT_CPU_RANKS), --oversubscribe --bind-to none)\
  $(if $(FT_OMP), -x OMP_NUM_THREADS=$(FT_OMP))
FT_SRUN_CMD = $(MPIRUN)$(if $(FT_SRUN_NTASKS), --ntasks=$(FT_NP))$(if $(FT_OMP), --export=ALL$(FT_COMMA)OMP_NUM_THREADS=$(FT_OMP))
FT_LAUNCHER = $(FT_NUM_GPUS_OK)$(strip $(if $(FT_SRUN),$(FT_SRUN_CMD),$(FT_MPIRUN_CMD)))

# The training command of a train target, and (distributed) what to check before it: the
# launcher, the hostfile, the target's own check, and the config with the strategy, in one
# process (so that a bad override is reported once, not by every rank).
FT_TRAIN_CMD = $(if $(FT_LAUNCH),$(FT_LAUNCH) )$(FT_CFG)$(if $(FT_DIST_SET), $(FT_DIST_SET))\
  $(if $(RESUME), --resume $(call ft_quote,$(RESUME)))
define FT_LAUNCH_CHECK_SH
command -v $(firstword $(MPIRUN)) > /dev/null 2>&1 || { echo "make $@: $(firstword $(MPIRUN)) not found: \
$(if $(FT_SRUN),run inside a Slurm job,install Open MPI (openmpi-bin; scripts/install-deps.sh build does)) \
or name the launcher: MPIRUN=..." >&2; exit 1; }; \
$(if $(HOSTFILE),$(if $(FT_SRUN),echo "make $@: HOSTFILE is not used under srun: Slurm places the ranks on the job's nodes" >&2;,\
[ -f $(call ft_quote,$(HOSTFILE)) ] || { echo "make $@: HOSTFILE=$(HOSTFILE): no such file" >&2; exit 1; };)) \
$(FT_DIST_CHECK) $(FT_CFG_CHECK)
endef
FT_LAUNCH_CHECK = $(if $(FT_LAUNCH),$(FT_LAUNCH_CHECK_SH))

.PHONY: train eval merge lora-init gpu-info memory-check tb compare $(FT_DIST_TARGETS) \
        $(FT_TRAIN_TARGETS:%=%-tb)

# The build needs the C libraries installed: checked once per build dir.
DEPS_STAMP := build/.deps-build
$(DEPS_STAMP): scripts/install-deps.sh
	scripts/install-deps.sh build
	@mkdir -p $(dir $@) && touch $@
$(LIB_OBJS) $(TOOLS:bin/%=build/tools/%.o): | $(DEPS_STAMP)

$(FT_TRAIN_TARGETS): $(TOOLS)
ifeq ($(BEFORE_AFTER),1)
	@$(FT_READ_CONFIG); \
	$(if $(FT_LAUNCH),$(FT_LAUNCH_CHECK); )\
	gen="--generate $$maxnew"; \
	mkdir -p "$$run"; \
	echo "== before: the base model $$model on $$data" >&2; \
	bin/ft-eval --model "$$model" --data "$$data" $$evalopts $$gen --json \
	  --predictions "$$run/predictions-before.jsonl" > "$$run/eval-before.json" 2> "$$run/eval-before.log" \
	  || { cat "$$run/eval-before.log" >&2; exit 1; }; \
	echo "== training: $(CONFIG) -> $$run$(if $(FT_LAUNCH), ($(filter-out --set,$(FT_DIST_SET))$(FT_COMMA) $(FT_RANKS) ranks))" >&2; \
	adapter=$$($(FT_TRAIN_CMD)); \
	echo "== after: $$model + $$adapter" >&2; \
	mode=$(call ft_get,tuning.mode); \
	if [ "$$mode" = full ]; then set -- --model "$$adapter"; else set -- --model "$$model" --adapter "$$adapter"; fi; \
	bin/ft-eval "$$@" --data "$$data" $$evalopts $$gen --json \
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
	echo "TensorBoard: $$run (make tb)"
else
	@$(or $(FT_LAUNCH_CHECK),:)
	$(FT_TRAIN_CMD)
endif

eval: $(TOOLS)
	@$(FT_READ_CONFIG); \
	show bin/ft-eval --model "$$model" $${adapter:+--adapter "$$adapter"} --data "$$data" $$evalopts $$gen

merge: $(TOOLS)
	@$(FT_READ_CONFIG); \
	[ -n "$$adapter" ] || { echo "make merge: no adapter: $$run/final does not exist (make train first, or ADAPTER=dir)" >&2; exit 1; }; \
	out=$(call ft_quote,$(OUT)); [ -n "$$out" ] || out="$$run/merged"; \
	show bin/ft-merge --model "$$model" --adapter "$$adapter" --out "$$out" --force

lora-init: $(TOOLS)
	@$(FT_READ_CONFIG); \
	out=$(call ft_quote,$(OUT)); [ -n "$$out" ] || out="$$run/lora-init"; \
	rs=; [ "$(call ft_get,tuning.lora.rslora)" = false ] || rs=--rslora; \
	show bin/ft-lora-init --model "$$model" --out "$$out" --r $(call ft_get,tuning.lora.r) \
	  --alpha $(call ft_get,tuning.lora.alpha) --dropout $(call ft_get,tuning.lora.dropout) \
	  --target $(call ft_get,tuning.lora.target_modules) --seed $(call ft_get,train.seed) $$rs

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
	@$(or $(FT_LAUNCH_CHECK),$(FT_CFG_CHECK))
	$(if $(FT_LAUNCH),$(FT_LAUNCH) )$(FT_CFG) --measure
	@bin/gpu-info

# TensorBoard on the run dir (RUN_DIR, else train.output_dir), from PATH or the venv.
FT_TENSORBOARD = $(firstword $(shell command -v tensorboard 2>/dev/null) $(wildcard $(VENV)/bin/tensorboard))
define FT_TB_HINT
echo "tensorboard is not installed: pip install tensorboard (or scripts/setup-python.sh .venv, \
which puts one in .venv/bin); then make tb. The event files are in $$dir." >&2
endef
define FT_RUN_DIR
set -e; dir=$(call ft_quote,$(RUN_DIR)); \
[ -n "$$dir" ] || { $(FT_CFG_CHECK); dir=$(call ft_get,train.output_dir); }
endef

tb: bin/ft-train
	@$(FT_RUN_DIR); \
	if [ -z "$(FT_TENSORBOARD)" ]; then $(FT_TB_HINT); exit 0; fi; \
	mkdir -p "$$dir"; \
	echo "TensorBoard on $$dir: http://localhost:$(TB_PORT)/" >&2; \
	exec $(FT_TENSORBOARD) --logdir "$$dir" --port $(TB_PORT)

# <train target>-tb: TensorBoard in the background on the run dir, then the training.
define FT_TRAIN_TB
@$(or $(FT_LAUNCH_CHECK),:)
@$(FT_RUN_DIR); \
if [ -z "$(FT_TENSORBOARD)" ]; then $(FT_TB_HINT); else \
  mkdir -p "$$dir"; \
  $(FT_TENSORBOARD) --logdir "$$dir" --port $(TB_PORT) > "$$dir/tensorboard.log" 2>&1 & \
  echo $$! > "$$dir/tensorboard.pid"; \
  echo "TensorBoard on $$dir: http://localhost:$(TB_PORT)/ (pid $$!; log $$dir/tensorboard.log)" >&2; \
fi
@+$(MAKE) --no-print-directory $(1)
@$(FT_RUN_DIR); [ ! -f "$$dir/tensorboard.pid" ] || \
  echo "TensorBoard is still running on http://localhost:$(TB_PORT)/ (stop it: kill $$(cat "$$dir/tensorboard.pid"))"
endef

$(FT_TRAIN_TARGETS:%=%-tb): %-tb: $(TOOLS)
	$(call FT_TRAIN_TB,$*)

# Runs side by side: a table (stdout) and the loss curves (SVG) of ft-train run dirs.
compare:
	@$(if $(strip $(RUNS)),,echo 'make compare: name the run dirs: make compare RUNS="runs/a runs/b" [PLOT=file.svg]' >&2; exit 2;) \
	scripts/compare-runs.sh $(if $(PLOT),--plot $(call ft_quote,$(PLOT))) -- $(foreach r,$(RUNS),$(call ft_quote,$(r)))
