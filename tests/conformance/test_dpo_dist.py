"""DPO (train.objective dpo) under every data-parallel dist.strategy on real Open MPI ranks
(CPU): 2 ranks of 4 pairs equal one process of 8 (the loss, the gradient norm and DPO's
metrics of every step, and the weights after five steps), LoRA (the reference: the base
with the adapter off) and full fine-tuning (a frozen base copy per rank), LoRA from a starting adapter (the
reference: that adapter) under every strategy; model_parallel (2 pipeline stages, each
seeing the whole batch, with and without GPipe chunks) equals one process for DPO with
LoRA and full fine-tuning (each stage keeps its part of the base as the reference) and for
ORPO with LoRA and full fine-tuning."""

import json
from pathlib import Path

import pytest

import rankrun
from rankrun import FT_TRAIN, run
from safetensors.torch import load_file

METRICS = ["loss", "grad_norm", "rewards/chosen", "rewards/rejected", "rewards/accuracies",
           "rewards/margins", "logps/chosen", "logps/rejected"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    assert FT_TRAIN, "FT_TRAIN must be the path of bin/ft-train"
    d = tmp_path_factory.mktemp("dpo_dist")
    colours = ["red", "green", "blue", "grey", "black"]
    rows = [{"prompt": f"Q: colour of thing {i}?\nA:", "chosen": f" {colours[i % 5]}",
             "rejected": f" {colours[(i + 2) % 5]} or {colours[(i + 3) % 5]}"}
            for i in range(16)]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator([r["prompt"] + r["chosen"] + r["rejected"] for r in rows],
                           trainers.BpeTrainer(vocab_size=280, special_tokens=["<|endoftext|>"],
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                               show_progress=False))
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>")
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=tk.get_vocab_size(), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64)
    LlamaForCausalLM(cfg).save_pretrained(d / "model")
    hf.save_pretrained(d / "model")
    (d / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def write_config(d, name, **over):
    o = {"train.objective": "dpo", "train.pref.beta": 0.5, "train.max_steps": 5,
         "train.warmup_steps": 1, "data.train_path": str(d / "pairs.jsonl"),
         "data.format": "auto", "data.shuffle": "false"}
    o.update({k.replace("__", "."): v for k, v in over.items()})
    mode = o.pop("mode", "lora")
    return rankrun.write_config(d, name, o, mode=mode)


def logged(run_dir):
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if "loss" in r}


def weights(run_dir):
    final = Path(run_dir) / "final"
    f = final / "adapter_model.safetensors"
    return load_file(str(f if f.exists() else final / "model.safetensors"))


def assert_same_run(a, b, rtol=2e-5, w_atol=2e-4):
    la, lb = logged(a), logged(b)
    assert la.keys() == lb.keys() and len(la) == 5
    for s in la:
        for k in METRICS:
            x, y = la[s][k], lb[s][k]
            assert abs(x - y) <= rtol * abs(x) + 1e-6, (k, s, x, y)
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() and wa
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= w_atol


@pytest.fixture(scope="module")
def single(work):
    runs = {}
    for mode in ("lora", "full"):
        lr = {"train.learning_rate": 1e-3} if mode == "full" else {}
        cfg = write_config(work, f"single_{mode}", mode=mode, train__batch_size=8,
                           **{k.replace(".", "__"): v for k, v in lr.items()})
        run(cfg)
        runs[mode] = work / "runs" / f"single_{mode}"
    return runs


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp"])
def test_dpo_data_parallel_equals_one_process(work, single, strategy):
    cfg = write_config(work, f"np2_{strategy}", dist__strategy=strategy)
    run(cfg, 2)
    assert_same_run(single["lora"], work / "runs" / f"np2_{strategy}")


@pytest.mark.parametrize("strategy", ["ddp", "zero3"])
def test_dpo_full_data_parallel_equals_one_process(work, single, strategy):
    cfg = write_config(work, f"np2_full_{strategy}", mode="full", dist__strategy=strategy,
                       train__learning_rate=1e-3)
    run(cfg, 2)
    assert_same_run(single["full"], work / "runs" / f"np2_full_{strategy}")


@pytest.fixture(scope="module")
def single_orpo(work):
    runs = {}
    for mode in ("lora", "full"):
        lr = {"train__learning_rate": 1e-3} if mode == "full" else {}
        cfg = write_config(work, f"single_orpo_{mode}", mode=mode, train__batch_size=8,
                           train__objective="orpo", **lr)
        run(cfg)
        runs[mode] = work / "runs" / f"single_orpo_{mode}"
    return runs


@pytest.mark.parametrize("chunks", [1, 3])
def test_dpo_model_parallel_equals_one_process(work, single, chunks):
    """Two pipeline stages see the whole batch of 8 pairs: the reference forward (adapter
    off) and the policy's pass the residual stream stage to stage, the last stage's loss
    and metrics reach rank 0; with chunks 3 the 16 rows go in GPipe chunks of 6, 6, 4
    (a pair's chosen and rejected rows in different chunks)."""
    cfg = write_config(work, f"np2_mp_{chunks}", dist__strategy="model_parallel",
                       train__batch_size=8, dist__pipeline_micro_batches=chunks)
    run(cfg, 2)
    assert_same_run(single["lora"], work / "runs" / f"np2_mp_{chunks}")


@pytest.mark.parametrize("mode", ["lora", "full"])
def test_dpo_model_parallel_resume_is_bitwise(work, single, mode):
    """model_parallel DPO resumed from checkpoint-3 of another run: the same final weights,
    bit for bit, and the same metrics for the resumed steps (full fine-tuning's reference,
    each stage's part of the base, is kept at setup, before the checkpoint is read)."""
    import shutil
    common = dict(mode=mode, dist__strategy="model_parallel", train__batch_size=8,
                  train__save_steps=3, dist__pipeline_micro_batches=2)
    if mode == "full":
        common["train__learning_rate"] = 1e-3
    a, b = work / "runs" / f"mp_resume_a_{mode}", work / "runs" / f"mp_resume_b_{mode}"
    run(write_config(work, a.name, **common), 2)
    b.mkdir(parents=True)
    shutil.copytree(a / "checkpoint-3", b / "checkpoint-3")
    out = run(write_config(work, b.name, **common), 2, "--resume", "auto")
    assert "resumed from" in out.stderr + out.stdout
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() and all(torch_equal(wa[k], wb[k]) for k in wa)
    la, lb = logged(a), logged(b)
    assert sorted(lb) == [4, 5]
    for s in lb:
        for k in METRICS:
            assert la[s][k] == lb[s][k], (k, s, la[s][k], lb[s][k])


def torch_equal(x, y):
    import torch
    return torch.equal(x, y)


@pytest.mark.parametrize("objective", ["dpo", "orpo"])
def test_qlora_model_parallel_equals_one_process(work, objective):
    """QLoRA (NF4 base quantized on load, each stage its own layers'): DPO's reference is
    the quantized base with the adapter off."""
    common = dict(mode="qlora", train__objective=objective, train__batch_size=8)
    one = f"single_qlora_{objective}"
    run(write_config(work, one, **common))
    name = f"np2_mp_qlora_{objective}"
    run(write_config(work, name, dist__strategy="model_parallel",
                     dist__pipeline_micro_batches=2, **common), 2)
    assert_same_run(work / "runs" / one, work / "runs" / name)


@pytest.mark.parametrize("mode,chunks", [("lora", 1), ("lora", 3), ("full", 2)])
def test_orpo_model_parallel_equals_one_process(work, single_orpo, mode, chunks):
    lr = {"train__learning_rate": 1e-3} if mode == "full" else {}
    name = f"np2_orpo_mp_{mode}_{chunks}"
    cfg = write_config(work, name, mode=mode, dist__strategy="model_parallel",
                       train__objective="orpo", train__batch_size=8,
                       dist__pipeline_micro_batches=chunks, **lr)
    run(cfg, 2)
    assert_same_run(single_orpo[mode], work / "runs" / name)
    la, lb = logged(single_orpo[mode]), logged(work / "runs" / name)
    for s in la:
        for k in ("nll_loss", "log_odds_ratio", "log_odds_chosen"):
            assert abs(la[s][k] - lb[s][k]) <= 2e-5 * abs(la[s][k]) + 1e-6, (k, s)


@pytest.mark.parametrize("objective", ["dpo", "orpo"])
def test_pref_model_parallel_eval_equals_one_process(work, objective):
    """The held-out evaluation under model_parallel: every stage runs the forwards, the
    last stage's figures reach rank 0 (its log and metrics.jsonl)."""
    ev = {"data__eval_path": str(work / "pairs.jsonl"), "train__eval_strategy": "steps",
          "train__eval_steps": 5, "train__max_steps": 5, "train__objective": objective,
          "train__batch_size": 8}
    one = write_config(work, f"single_eval_{objective}", **ev)
    run(one)
    cfg = write_config(work, f"np2_mp_eval_{objective}", dist__strategy="model_parallel",
                       dist__pipeline_micro_batches=2, **ev)
    run(cfg, 2)

    def evals(name):
        rows = (work / "runs" / name / "metrics.jsonl").read_text().splitlines()
        return [r for r in map(json.loads, rows) if "eval_loss" in r]

    ea, eb = evals(f"single_eval_{objective}"), evals(f"np2_mp_eval_{objective}")
    assert len(ea) == len(eb) >= 1
    for a, b in zip(ea, eb):
        keys = [k for k in a if k.startswith("eval_")]
        assert "eval_rewards/margins" in keys and keys == [k for k in b if k.startswith("eval_")]
        for k in keys:
            assert abs(a[k] - b[k]) <= 2e-5 * abs(a[k]) + 1e-6, (k, a[k], b[k])


@pytest.fixture(scope="module")
def tied(work):
    """The work model with tied embeddings: model_parallel's last stage holds a copy of
    the embedding for its head (kept too as the full reference's part)."""
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM
    import torch
    src = work / "model"
    cfg = LlamaConfig.from_pretrained(src)
    cfg.tie_word_embeddings = True
    torch.manual_seed(2)
    LlamaForCausalLM(cfg).save_pretrained(work / "tied")
    for f in src.iterdir():
        if "token" in f.name or f.name == "special_tokens_map.json":
            shutil.copy(f, work / "tied" / f.name)
    return work / "tied"


TIE = dict(tuning__lora__target_modules="q_proj,v_proj,embed_tokens,lm_head",
           tuning__lora__ensure_weight_tying="true")


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp", "model_parallel",
                                      "zero2+offload", "zero3+offload", "qlora+zero3",
                                      "qlora+fsdp"])
def test_dpo_tied_weight_tying_equals_one_process(work, tied, strategy):
    """DPO with LoRA's tied pair under ensure_weight_tying (the head's pair the embedding's,
    one storage stepped twice; its exchange under the sharded strategies,
    lib/dist/dist_tied.c), the reference the tied base with the pair off: every strategy
    on 2 ranks (the optimizer offloaded, a QLoRA base sharded) equals one process, the
    pairs kept equal."""
    first, _, second = strategy.partition("+")
    qlora = first == "qlora"
    name = second if qlora else first
    off = second == "offload"
    common = dict(mode="qlora" if qlora else "lora", model__name=str(tied), **TIE)
    one = f"single_tie_{'qlora' if qlora else 'lora'}"
    if not (work / "runs" / one).exists():
        run(write_config(work, one, train__batch_size=8, **common))
    over = dict(dist__strategy=name, **common)
    if name == "model_parallel":
        over.update(train__batch_size=8, dist__pipeline_micro_batches=3)
    if off:
        over["dist__offload_optimizer"] = "cpu"
    run_name = f"np2_tie_{strategy.replace('+', '_')}"
    run(write_config(work, run_name, **over), 2)
    assert_same_run(work / "runs" / one, work / "runs" / run_name)
    w = weights(work / "runs" / run_name)
    assert torch_equal(w["base_model.model.lm_head.lora_A.weight"].T,
                       w["base_model.model.model.embed_tokens.lora_embedding_B"])
    # the reference is not the policy after the first step
    assert logged(work / "runs" / run_name)[5]["rewards/margins"] != 0


def test_dpo_full_model_parallel_tied_equals_one_process(work, tied):
    common = dict(mode="full", model__name=str(tied), train__batch_size=8,
                  train__learning_rate=1e-3)
    run(write_config(work, "single_full_tied", **common))
    run(write_config(work, "np3_mp_full_tied", dist__strategy="model_parallel",
                     dist__pipeline_micro_batches=2, **common), 3)
    assert_same_run(work / "runs" / "single_full_tied", work / "runs" / "np3_mp_full_tied")
    from test_memcheck import assert_exact
    cfg = write_config(work, "measure_mp_full_tied", dist__strategy="model_parallel",
                       **dict(common, train__batch_size=3))
    out = run(cfg, 3, "--measure")
    assert_exact(out.stdout, 3)


@pytest.mark.parametrize("objective,mode,np_,chunks", [("dpo", "lora", 2, 1),
                                                     ("dpo", "lora", 3, 3),
                                                     ("dpo", "full", 2, 1),
                                                     ("dpo", "full", 3, 3),
                                                     ("orpo", "full", 2, 3),
                                                     ("orpo", "lora", 2, 2)])
def test_pref_model_parallel_memory_plan_exact(work, objective, mode, np_, chunks):
    """The cpu-mp plan of a preference step (2 batch_size rows per stage, in the
    objective's GPipe chunks; 5 pairs in 3 chunks are rows 4 + 4 + 2) equals every
    stage's measured peaks."""
    from test_memcheck import assert_exact
    name = f"measure_mp_{objective}_{mode}_{np_}_{chunks}"
    cfg = write_config(work, name, mode=mode, train__objective=objective,
                       train__batch_size=5, dist__strategy="model_parallel",
                       dist__pipeline_micro_batches=chunks)
    out = run(cfg, np_, "--measure")
    assert_exact(out.stdout, np_)
    assert "planned = cpu-mp (exact)" in out.stdout


@pytest.mark.parametrize("strategy,np_", [("zero2", 2), ("zero3", 2), ("fsdp", 3),
                                         ("model_parallel", 2), ("ddp", 2)])
def test_dpo_init_adapter_memory_plan_exact(work, single, strategy, np_):
    """DPO from a starting adapter: the kept adapter and the policy's scratch are what
    each rank's forward reads (whole, its zero3 / fsdp shard, its pipeline stage's
    part): planned == measured on every rank."""
    from test_memcheck import assert_exact
    name = f"measure_adapter_{strategy}_{np_}"
    cfg = write_config(work, name, dist__strategy=strategy, train__batch_size=3,
                       tuning__lora__init_adapter=str(single["lora"] / "final"))
    out = run(cfg, np_, "--measure")
    assert_exact(out.stdout, np_)


@pytest.mark.parametrize("chunks,split", [(1, "0"), (3, "1")])
def test_dpo_full_model_parallel_equals_one_process(work, single, chunks, split, monkeypatch):
    """Full fine-tuning's reference under model_parallel: each stage keeps its own part of
    the base (no whole second model on a stage) and swaps it in for the reference
    forward."""
    monkeypatch.setenv("FT_DIST_SPLIT_COMPUTE", split)
    name = f"np2_mp_full_{chunks}_{split}"
    cfg = write_config(work, name, mode="full", dist__strategy="model_parallel",
                       train__batch_size=8, train__learning_rate=1e-3,
                       dist__pipeline_micro_batches=chunks)
    run(cfg, 2)
    assert_same_run(single["full"], work / "runs" / name)


@pytest.mark.parametrize("strategy,split", [("ddp", "0"), ("zero1", "0"), ("zero2", "0"),
                                            ("zero2", "1"), ("zero3", "0"), ("zero3", "1"),
                                            ("fsdp", "0"), ("model_parallel", "0"),
                                            ("model_parallel", "1")])
def test_dpo_init_adapter_data_parallel_equals_one_process(work, single, strategy, split,
                                                           monkeypatch):
    """The reference is the starting adapter (here the single LoRA run's result), kept by
    each rank as its forward reads it: whole, the zero2 copy, the zero3 / fsdp shard
    (gathered unit by unit: the windows are emptied at each swap), the pipeline stage's
    part (model_parallel: 2 stages of the whole batch, GPipe chunks of 6, 6, 4 rows).
    FT_DIST_SPLIT_COMPUTE=1 gives the compute copies their own buffers in fp32, as bf16
    does on a GPU (the copies are what is swapped)."""
    monkeypatch.setenv("FT_DIST_SPLIT_COMPUTE", split)
    adapter = {"tuning__lora__init_adapter": str(single["lora"] / "final")}
    one = write_config(work, "single_adapter", train__batch_size=8, **adapter)
    if not (work / "runs" / "single_adapter" / "final").exists():
        run(one)
    mp = {"train__batch_size": 8, "dist__pipeline_micro_batches": 3} \
        if strategy == "model_parallel" else {}
    if strategy in ("zero3", "fsdp"):
        # two micro-batches of 2 pairs: the second's reference forward follows the first's
        # backward, whose last windows hold the policy's first layers
        mp = {"train__batch_size": 2, "train__grad_accum": 2}
    cfg = write_config(work, f"np2_{strategy}_{split}_adapter", dist__strategy=strategy,
                       **adapter, **mp)
    run(cfg, 2)
    assert_same_run(work / "runs" / "single_adapter",
                    work / "runs" / f"np2_{strategy}_{split}_adapter")
    # the reference is not the base: the first step's rewards are 0 (policy = reference)
    assert logged(work / "runs" / "single_adapter")[1]["rewards/chosen"] == 0


@pytest.fixture(scope="module")
def orpo_ddp(work):
    cfg = write_config(work, "np2_orpo_ddp", dist__strategy="ddp", train__objective="orpo")
    run(cfg, 2)
    return work / "runs" / "np2_orpo_ddp"


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3", "fsdp"])
def test_orpo_sharded_equals_ddp(work, orpo_ddp, strategy):
    """ORPO's loss is a mean per micro-batch (its NLL over the micro-batch's tokens), so
    two ranks of 4 pairs are not one process of 8, in TRL either; every sharded strategy
    equals DDP on the same ranks (ORPO's metrics included)."""
    cfg = write_config(work, f"np2_orpo_{strategy}", dist__strategy=strategy,
                       train__objective="orpo")
    run(cfg, 2)
    assert_same_run(orpo_ddp, work / "runs" / f"np2_orpo_{strategy}")
    la = logged(orpo_ddp)
    lb = logged(work / "runs" / f"np2_orpo_{strategy}")
    for s in la:
        for k in ("nll_loss", "log_odds_ratio", "log_odds_chosen"):
            assert abs(la[s][k] - lb[s][k]) <= 2e-5 * abs(la[s][k]) + 1e-6, (k, s)
