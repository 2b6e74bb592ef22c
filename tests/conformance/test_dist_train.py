"""Distributed ft-train on real Open MPI ranks (CPU): every strategy gives the model one
process would.

- DDP with N ranks of micro-batch b equals one process of batch N*b (losses of every
  step and the weights after them, within fp32 summation-order tolerance), with and
  without gradient checkpointing and gradient accumulation, LoRA and full fine-tuning;
- zero1, zero2, zero3, fsdp and CPU-offloaded optimizers equal it too, tied embeddings
  included; model_parallel (layers split across ranks) equals one process with the same
  batch;
- per-rank memory: sharded categories shrink as 1/N (run_summary.json);
- a checkpoint saved under one strategy / world size resumes under another with the
  losses of the uninterrupted run;
- a rank that hangs makes every rank stop with the timeout message; a killed rank stops
  the run instead of leaving the others waiting.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

import rankrun
from rankrun import make, FT_TRAIN, make_model, mpi_cmd, run, write_token_data
from safetensors.torch import load_file



@pytest.fixture(scope="module")
def work(tmp_path_factory):
    assert FT_TRAIN, "FT_TRAIN must be the path of bin/ft-train"
    d = tmp_path_factory.mktemp("dist_train")
    make_model(d, "model")
    make_model(d, "tied", tied=True)
    make_model(d, "deep", layers=4)
    write_token_data(d)
    return d


def write_config(d, name, model="model", mode="lora", **over):
    return rankrun.write_config(d, name, {"train.max_steps": 5, "train.warmup_steps": 1}, model=model, mode=mode, **over)


def logged(run_dir, key):
    """{step: value} of key in the run's metrics.jsonl (the training steps' lines)."""
    rows = [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in rows if key in r}


def losses(run_dir):
    return logged(run_dir, "loss")


def weights(run_dir):
    final = Path(run_dir) / "final"
    f = final / "adapter_model.safetensors"
    return load_file(str(f if f.exists() else final / "model.safetensors"))


def assert_same_run(a, b, loss_rtol=2e-5, w_atol=2e-4):
    """Run b equals run a: the loss and the pre-clip global gradient norm of every step
    (metrics.jsonl, 6 digits; loss_rtol relative) and the final weights (w_atol). The
    norm is what clipping divides by: a rank that reduced it wrongly (not averaged over
    the replicas, or only its own shard) logs another one, even where AdamW's invariance
    to the gradient's scale hides it from the weights."""
    for key in ("loss", "grad_norm"):
        la, lb = logged(a, key), logged(b, key)
        assert la.keys() == lb.keys() and la, key
        for s in la:
            assert abs(la[s] - lb[s]) <= loss_rtol * abs(la[s]) + 1e-7, (key, s, la[s], lb[s])
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() and wa
    worst = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    assert worst <= w_atol, worst


@pytest.fixture(scope="module")
def single(work):
    """One process, batch 8 (the reference of the 2-rank runs of micro-batch 4)."""
    runs = {}
    for key, over in {
        "lora": {},
        "lora_ckpt_accum": {"train.gradient_checkpointing": "true", "train.grad_accum": 2,
                            "train.batch_size": 4},
        "full": {"mode": "full"},
        "tied_full": {"mode": "full", "model": "tied"},
        "tied_lora": {"model": "tied"},
    }.items():
        over = dict(over)
        mode = over.pop("mode", "lora")
        model = over.pop("model", "model")
        o = {"train.batch_size": 8}
        if key == "lora_ckpt_accum":
            o = {"train.batch_size": 8, "train.grad_accum": 2,
                 "train.gradient_checkpointing": "true"}
        cfg = write_config(work, f"single_{key}", model=model, mode=mode,
                           **{k.replace(".", "__"): v for k, v in o.items()})
        run(cfg)
        runs[key] = work / "runs" / f"single_{key}"
    return runs


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp"])
def test_data_parallel_equals_one_process(work, single, strategy):
    cfg = write_config(work, f"np2_{strategy}", dist__strategy=strategy)
    run(cfg, 2)
    assert_same_run(single["lora"], work / "runs" / f"np2_{strategy}")


# Clipped runs: train.max_grad_norm far below the norms of these runs (~0.16), so every
# step clips, and train.adam_epsilon near the clipped gradient's elements (norm 0.01 over
# ~4k LoRA weights: ~1e-4). AdamW divides each element by its own running magnitude and
# so cancels a gradient's scale; with epsilon of that size it no longer does, and a wrong
# clip coefficient (a 1/sqrt(2) or a shard's own norm) moves the weights by ~1e-2.
CLIP = dict(train__max_grad_norm=0.01, train__adam_epsilon=1e-4)


@pytest.fixture(scope="module")
def single_clip(work):
    """One process, batch 8, every step clipped."""
    cfg = write_config(work, "single_clip", train__batch_size=8, **CLIP)
    run(cfg)
    d = work / "runs" / "single_clip"
    norms = logged(d, "grad_norm")
    assert len(norms) == 5 and min(norms.values()) > 10 * CLIP["train__max_grad_norm"], norms
    return d


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp"])
def test_clipping_equals_one_process(work, single_clip, strategy):
    """With clipping active the update is scaled by max_grad_norm / (global norm + 1e-6):
    each rank must clip by the norm of the whole averaged gradient, not of its own shard
    or of the un-averaged sum, for losses, norms and weights to equal one process's."""
    cfg = write_config(work, f"np2_clip_{strategy}", dist__strategy=strategy, **CLIP)
    run(cfg, 2)
    assert_same_run(single_clip, work / "runs" / f"np2_clip_{strategy}")


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "zero3"])
def test_checkpointing_and_accumulation(work, single, strategy):
    cfg = write_config(work, f"np2_ca_{strategy}", dist__strategy=strategy,
                       train__gradient_checkpointing="true", train__grad_accum=2)
    run(cfg, 2)
    assert_same_run(single["lora_ckpt_accum"], work / "runs" / f"np2_ca_{strategy}")


def test_four_ranks(work, single):
    for strategy in ["ddp", "zero3"]:
        cfg = write_config(work, f"np4_{strategy}", dist__strategy=strategy,
                           train__batch_size=2)
        run(cfg, 4)
        assert_same_run(single["lora"], work / "runs" / f"np4_{strategy}")


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3"])
def test_full_fine_tuning(work, single, strategy):
    cfg = write_config(work, f"np2_full_{strategy}", mode="full", dist__strategy=strategy)
    run(cfg, 2)
    assert_same_run(single["full"], work / "runs" / f"np2_full_{strategy}", w_atol=5e-4)


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_tied_embeddings(work, single, strategy):
    for mode, key in [("full", "tied_full"), ("lora", "tied_lora")]:
        cfg = write_config(work, f"np2_tied_{mode}_{strategy}", model="tied", mode=mode,
                           dist__strategy=strategy)
        run(cfg, 2)
        assert_same_run(single[key], work / "runs" / f"np2_tied_{mode}_{strategy}",
                        w_atol=5e-4)


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_offload_optimizer(work, single, strategy):
    cfg = write_config(work, f"np2_off_{strategy}", dist__strategy=strategy,
                       dist__offload_optimizer="cpu")
    run(cfg, 2)
    assert_same_run(single["lora"], work / "runs" / f"np2_off_{strategy}")
    s = json.loads((work / "runs" / f"np2_off_{strategy}" / "run_summary.json").read_text())
    # the AdamW state lives in host memory, none of it in the device's optimizer category
    assert s["peak_memory_by_category"]["optimizer"] == [0, 0]
    assert min(s["host_offload_bytes"]) > 0


MTS = dict(tuning__lora__modules_to_save="embed_tokens,lm_head")


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp",
                                      "model_parallel"])
def test_modules_to_save_under_strategies(work, strategy):
    """LoRA with the embedding and the head trained in full (modules_to_save): unit 0 and
    the head's unit then hold trainables beside the pairs; every strategy equals one
    process (data parallel: batch 8 on one rank; model parallel: the same batch), the
    saved adapter holding the embedding and the head."""
    dp = strategy != "model_parallel"
    ref = work / "runs" / f"mts_ref_{'dp' if dp else 'mp'}"
    if not ref.exists():
        run(write_config(work, ref.name, **(dict(train__batch_size=8) if dp else {}), **MTS))
    name = f"np2_mts_{strategy}"
    run(write_config(work, name, dist__strategy=strategy, **MTS), 2)
    assert_same_run(ref, work / "runs" / name, w_atol=5e-4)
    w = weights(work / "runs" / name)
    assert {"base_model.model.model.embed_tokens.weight",
            "base_model.model.lm_head.weight"} <= set(w)


@pytest.mark.parametrize("strategy", ["zero3", "model_parallel"])
def test_modules_to_save_tied(work, strategy):
    """On the tied model the one embedding (shared by the head) trains: model parallelism
    keeps its copy on the last stage in step, as in full fine-tuning."""
    dp = strategy != "model_parallel"
    ref = work / "runs" / f"mts_tied_ref_{'dp' if dp else 'mp'}"
    if not ref.exists():
        run(write_config(work, ref.name, model="tied",
                         **(dict(train__batch_size=8) if dp else {}), **MTS))
    name = f"np2_mts_tied_{strategy}"
    run(write_config(work, name, model="tied", dist__strategy=strategy, **MTS), 2)
    assert_same_run(ref, work / "runs" / name, w_atol=5e-4)
    w = weights(work / "runs" / name)
    assert torch.equal(w["base_model.model.model.embed_tokens.weight"],
                       w["base_model.model.lm_head.weight"])


DORA = dict(tuning__lora__use_dora="true")


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "zero3", "fsdp", "model_parallel"])
def test_dora_under_strategies(work, strategy):
    """DoRA (a magnitude beside each pair): every strategy equals one process, as for
    modules_to_save above. (Dropout masks follow the rows a rank holds, so these runs, as
    the others here, have none: DoRA's dropout is in test_train_semantics.py.)"""
    dp = strategy != "model_parallel"
    ref = work / "runs" / f"dora_ref_{'dp' if dp else 'mp'}"
    if not ref.exists():
        run(write_config(work, ref.name, **(dict(train__batch_size=8) if dp else {}), **DORA))
    name = f"np2_dora_{strategy}"
    run(write_config(work, name, dist__strategy=strategy, **DORA), 2)
    assert_same_run(ref, work / "runs" / name, w_atol=5e-4)
    assert any(k.endswith(".lora_magnitude_vector") for k in weights(work / "runs" / name))


OUTER = dict(tuning__lora__target_modules="q_proj,v_proj,embed_tokens,lm_head")


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero3", "fsdp", "model_parallel"])
def test_outer_lora_under_strategies(work, strategy):
    """LoRA on the embedding and lm_head (pairs in unit 0 and the head's unit): every
    strategy equals one process."""
    dp = strategy != "model_parallel"
    ref = work / "runs" / f"outer_ref_{'dp' if dp else 'mp'}"
    if not ref.exists():
        run(write_config(work, ref.name, **(dict(train__batch_size=8) if dp else {}), **OUTER))
    name = f"np2_outer_{strategy}"
    run(write_config(work, name, dist__strategy=strategy, **OUTER), 2)
    assert_same_run(ref, work / "runs" / name, w_atol=5e-4)
    w = weights(work / "runs" / name)
    assert {"base_model.model.model.embed_tokens.lora_embedding_A",
            "base_model.model.lm_head.lora_B.weight"} <= set(w)


# rank_pattern / alpha_pattern: pairs of other shapes per layer and module (the units'
# sizes differ: layer 0's q_proj rank 2, layer 1's down_proj 7, the head's 5)
PATTERNS = dict(tuning__lora__target_modules="q_proj,v_proj,down_proj,embed_tokens,lm_head",
                tuning__lora__rank_pattern=json.dumps({"model.layers.0.self_attn.q_proj": 2,
                                                       "layers.1.mlp.down_proj": 7,
                                                       "lm_head": 5, "embed_tokens": 3}),
                tuning__lora__alpha_pattern=json.dumps({"v_proj": 3, "lm_head": 12}))


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp",
                                      "model_parallel"])
def test_rank_patterns_under_strategies(work, strategy):
    """Each pair its own rank and scaling (rank_pattern / alpha_pattern): every strategy
    equals one process, and the saved pairs have their ranks."""
    dp = strategy != "model_parallel"
    ref = work / "runs" / f"pat_ref_{'dp' if dp else 'mp'}"
    if not ref.exists():
        run(write_config(work, ref.name, **(dict(train__batch_size=8) if dp else {}),
                         **PATTERNS))
    name = f"np2_pat_{strategy}"
    run(write_config(work, name, dist__strategy=strategy, **PATTERNS), 2)
    assert_same_run(ref, work / "runs" / name, w_atol=5e-4)
    w = weights(work / "runs" / name)
    assert w["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape[0] == 2
    assert w["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"].shape[0] == 7
    assert w["base_model.model.lm_head.lora_B.weight"].shape[1] == 5


def _same_as_one_process(work, tag, model, strategy, extra):
    """A 2-rank run under strategy equals one process (data parallel: batch 8 on one rank;
    model parallel: the same batch); returns the run's saved adapter."""
    dp = strategy != "model_parallel"
    ref = work / "runs" / f"{tag}_ref_{model}_{'dp' if dp else 'mp'}"
    if not ref.exists():
        run(write_config(work, ref.name, model=model,
                         **(dict(train__batch_size=8) if dp else {}), **extra))
    name = f"np2_{tag}_{model}_{strategy}"
    run(write_config(work, name, model=model, dist__strategy=strategy, **extra), 2)
    assert_same_run(ref, work / "runs" / name, w_atol=5e-4)
    return weights(work / "runs" / name)


UNTIE = dict(MTS, tuning__lora__ensure_weight_tying="false")


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "zero3", "fsdp", "model_parallel"])
def test_modules_to_save_untied_under_strategies(work, strategy):
    """modules_to_save on the tied model without ensure_weight_tying (PEFT's separate
    copies, the model untied): every strategy equals one process, the two copies apart."""
    w = _same_as_one_process(work, "mts_untie", "tied", strategy, UNTIE)
    e, h = (w["base_model.model.model.embed_tokens.weight"],
            w["base_model.model.lm_head.weight"])
    assert not torch.equal(e, h)


MIXED = dict(tuning__lora__target_modules="q_proj,v_proj,embed_tokens",
             tuning__lora__modules_to_save="lm_head")


@pytest.mark.parametrize("strategy", ["ddp", "zero3", "model_parallel"])
def test_lora_embed_beside_saved_head_tied_under_strategies(work, strategy):
    """LoRA on the tied model's embedding, its head in modules_to_save, ensure_weight_tying
    false (PEFT's default: the two apart, the head a copy of its own): every strategy equals
    one process. Under ensure_weight_tying (true, or auto, which takes it with
    modules_to_save) PEFT 0.21.2 raises, and so does ft-train, saying so."""
    w = _same_as_one_process(work, "mixed_untie", "tied", strategy,
                             dict(MIXED, tuning__lora__ensure_weight_tying="false"))
    assert {"base_model.model.lm_head.weight",
            "base_model.model.model.embed_tokens.lora_embedding_A"} <= set(w)
    if strategy == "ddp":
        for tying in ("auto", "true"):
            out = run(write_config(work, f"mixed_{tying}", model="tied",
                                   tuning__lora__ensure_weight_tying=tying, **MIXED),
                      check=False)
            assert out.returncode != 0
            assert "ensure_weight_tying" in out.stderr and "PEFT" in out.stderr, \
                out.stderr[-2000:]


@pytest.mark.parametrize("model,strategy", [("tied", "zero3"), ("tied", "model_parallel"),
                                            ("model", "zero3"), ("tied", "ddp")])
def test_dora_outer_under_strategies(work, model, strategy):
    """DoRA on the embedding and lm_head (their magnitudes in unit 0 and the head's unit;
    tied: the head reads the embedding): every strategy equals one process."""
    w = _same_as_one_process(work, "dora_outer", model, strategy, dict(OUTER, **DORA))
    assert {"base_model.model.model.embed_tokens.lora_magnitude_vector",
            "base_model.model.lm_head.lora_magnitude_vector"} <= set(w)


@pytest.mark.parametrize("strategy", ["zero3", "model_parallel"])
def test_outer_tied_under_strategies(work, strategy):
    """LoRA on the tied model's embedding and lm_head (each its own pair: ensure_weight_tying
    auto / false): every strategy equals one process."""
    w = _same_as_one_process(work, "outer_tied", "tied", strategy, OUTER)
    assert not torch.equal(w["base_model.model.lm_head.lora_A.weight"].T,
                           w["base_model.model.model.embed_tokens.lora_embedding_B"])


TIE = dict(OUTER, tuning__lora__ensure_weight_tying="true")


@pytest.mark.parametrize("strategy,offload", [
    ("ddp", False), ("zero1", False), ("zero2", False), ("zero3", False), ("fsdp", False),
    ("model_parallel", False), ("ddp", True), ("zero1", True), ("zero2", True), ("zero3", True),
    ("fsdp", True)])
def test_outer_tied_weight_tying_under_strategies(work, strategy, offload):
    """ensure_weight_tying true (the head's pair the embedding's, one storage stepped by two
    AdamW states, the embedding's first): every strategy equals one process and keeps the
    pairs equal, the optimizer offloaded too. Under zero1-3 and fsdp the pairs' elements
    (and their moment states) fall to different owners (rank 0 holds the embedding's unit,
    the last rank the head's); under model_parallel the embedding and head are on two
    stages (lib/dist/dist_tied.c)."""
    if offload:  # against one process without offloading (whose step the model brackets)
        ref = work / "runs" / "outer_tie_ref_tied_dp"
        if not ref.exists():
            run(write_config(work, ref.name, model="tied", train__batch_size=8, **TIE))
        name = f"np2_outer_tie_off_{strategy}"
        run(write_config(work, name, model="tied", dist__strategy=strategy,
                         dist__offload_optimizer="cpu", **TIE), 2)
        assert_same_run(ref, work / "runs" / name, w_atol=5e-4)
        w = weights(work / "runs" / name)
    else:
        w = _same_as_one_process(work, "outer_tie", "tied", strategy, TIE)
    assert torch.equal(w["base_model.model.lm_head.lora_A.weight"].T,
                       w["base_model.model.model.embed_tokens.lora_embedding_B"])
    assert torch.equal(w["base_model.model.lm_head.lora_B.weight"].T,
                       w["base_model.model.model.embed_tokens.lora_embedding_A"])


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3", "fsdp", "model_parallel",
                                      "zero2+offload", "zero3+offload", "fsdp+offload_params"])
def test_outer_tied_weight_tying_qlora_under_strategies(work, strategy):
    """The tied pair under ensure_weight_tying beside a quantized base (QLoRA: NF4 + double
    quantization on load, the embedding and the head dense): every strategy on 2 ranks,
    the optimizer or the base offloaded too, equals one process of QLoRA and keeps the
    pairs equal (zero3 / fsdp shard the quantized base by blocks while the pair's
    exchange, lib/dist/dist_tied.c, moves the embedding's and the head's updates)."""
    name, _, off = strategy.partition("+")
    extra = dict(TIE, mode="qlora")
    if off:
        dp = name != "model_parallel"
        ref = work / "runs" / "qlora_tie_ref_tied_dp"
        if not ref.exists():
            run(write_config(work, ref.name, model="tied", train__batch_size=8, **extra))
        key = "dist__offload_params" if off == "offload_params" else "dist__offload_optimizer"
        run_name = f"np2_qlora_tie_{name}_{off}"
        run(write_config(work, run_name, model="tied", dist__strategy=name,
                         **{key: "cpu"}, **extra), 2)
        assert dp
        assert_same_run(ref, work / "runs" / run_name, w_atol=5e-4)
        w = weights(work / "runs" / run_name)
    else:
        w = _same_as_one_process(work, "qlora_tie", "tied", name, extra)
    assert torch.equal(w["base_model.model.lm_head.lora_A.weight"].T,
                       w["base_model.model.model.embed_tokens.lora_embedding_B"])
    assert torch.equal(w["base_model.model.lm_head.lora_B.weight"].T,
                       w["base_model.model.model.embed_tokens.lora_embedding_A"])


@pytest.mark.parametrize("strategy", ["ddp", "zero2", "zero3", "model_parallel"])
def test_dora_outer_tied_weight_tying_under_strategies(work, strategy):
    """DoRA with ensure_weight_tying (the one pair stepped twice, a magnitude on each
    module, in unit 0 and the head's unit): every strategy equals one process."""
    w = _same_as_one_process(work, "dora_outer_tie", "tied", strategy, dict(TIE, **DORA))
    assert torch.equal(w["base_model.model.lm_head.lora_A.weight"].T,
                       w["base_model.model.model.embed_tokens.lora_embedding_B"])
    assert {"base_model.model.model.embed_tokens.lora_magnitude_vector",
            "base_model.model.lm_head.lora_magnitude_vector"} <= set(w)


def _base_layer_adapter(work, model):
    """A PEFT adapter for OUTER's targets whose embed_tokens / lm_head base_layer weights
    (which PEFT saves, and its loading puts in the base) are moved off the model's own:
    a run started from it carries them into its saved adapter."""
    import ftref
    from safetensors.torch import save_file

    d = work / f"outer_init_{model}"
    if d.exists():
        return d
    ftref.build_adapter(work / model, d, ["q_proj", "v_proj", "embed_tokens", "lm_head"], seed=7)
    t = load_file(str(d / "adapter_model.safetensors"))
    g = torch.Generator().manual_seed(8)
    for k in list(t):
        if k.endswith(".base_layer.weight"):
            t[k] = t[k] + 0.05 * torch.randn(t[k].shape, generator=g)
    if model == "tied":  # one tensor in the model: PEFT's loading keeps the head's
        t["base_model.model.model.embed_tokens.base_layer.weight"] = \
            t["base_model.model.lm_head.base_layer.weight"].clone()
    save_file(t, str(d / "adapter_model.safetensors"), metadata={"format": "pt"})
    return d


@pytest.mark.parametrize("model,strategy", [("model", "zero2"), ("model", "zero3"),
                                            ("model", "fsdp"), ("model", "model_parallel"),
                                            ("tied", "zero3"), ("tied", "model_parallel")])
def test_outer_base_layer_saved_under_strategies(work, model, strategy):
    """A run started from an adapter that brought the embedding's and the head's base
    weights (base_layer) saves them again under every strategy (gathered where no rank
    holds them whole), equal to one process's."""
    init = _base_layer_adapter(work, model)
    dp = strategy != "model_parallel"
    extra = dict(OUTER, tuning__lora__init_adapter=str(init))
    ref = work / "runs" / f"outer_bl_ref_{model}_{'dp' if dp else 'mp'}"
    if not ref.exists():
        run(write_config(work, ref.name, model=model,
                         **(dict(train__batch_size=8) if dp else {}), **extra))
    name = f"np2_outer_bl_{model}_{strategy}"
    run(write_config(work, name, model=model, dist__strategy=strategy, **extra), 2)
    assert_same_run(ref, work / "runs" / name, w_atol=5e-4)
    w, wr = weights(work / "runs" / name), weights(ref)
    given = load_file(str(init / "adapter_model.safetensors"))
    for k in ["base_model.model.model.embed_tokens.base_layer.weight",
              "base_model.model.lm_head.base_layer.weight"]:
        assert torch.equal(w[k], wr[k]) and torch.equal(w[k], given[k]), k


@pytest.mark.parametrize("what", ["mts", "dora", "outer"])
def test_adapter_extras_resume(work, what):
    """A checkpoint of a modules_to_save run (the embedding and head in the adapter, their
    AdamW state in the optimizer's) or of a DoRA run (the magnitudes) resumes under another
    strategy with the losses of the uninterrupted run."""
    extra = {"mts": MTS, "dora": DORA, "outer": OUTER}[what]
    ref = work / "runs" / f"{what}_ref_dp"
    if not ref.exists():
        run(write_config(work, ref.name, train__batch_size=8, **extra))
    name = f"{what}_ckpt_ddp"
    run(write_config(work, name, dist__strategy="ddp", train__save_steps=3, **extra), 2)
    cont = write_config(work, f"{name}_resumed", dist__strategy="zero3", **extra)
    run(cont, 2, "--resume", str(work / "runs" / name / "checkpoint-3"))
    got, want = losses(work / "runs" / f"{name}_resumed"), losses(ref)
    assert sorted(got) == [4, 5]
    for s in got:
        assert abs(got[s] - want[s]) <= 2e-5 * abs(want[s]), (s, got[s], want[s])


@pytest.mark.parametrize("saved,resumed", [("zero3", "zero2+offload"), ("ddp", "fsdp")])
def test_tied_weight_tying_resume(work, saved, resumed):
    """A checkpoint of LoRA's tied pair under ensure_weight_tying (both pairs' AdamW
    states, laid out by flat position) resumes under another strategy with the losses of
    the uninterrupted one-process run."""
    ref = work / "runs" / "outer_tie_ref_tied_dp"
    if not ref.exists():
        run(write_config(work, ref.name, model="tied", train__batch_size=8, **TIE))
    name = f"tie_ckpt_{saved}"
    if not (work / "runs" / name).exists():
        run(write_config(work, name, model="tied", dist__strategy=saved, train__save_steps=3,
                         **TIE), 2)
    strategy, _, off = resumed.partition("+")
    extra = dict(TIE, dist__offload_optimizer="cpu") if off else TIE
    cont = write_config(work, f"{name}_{strategy}_resumed", model="tied",
                        dist__strategy=strategy, **extra)
    run(cont, 2, "--resume", str(work / "runs" / name / "checkpoint-3"))
    got, want = losses(work / "runs" / f"{name}_{strategy}_resumed"), losses(ref)
    assert sorted(got) == [4, 5]
    for s in got:
        assert abs(got[s] - want[s]) <= 2e-5 * abs(want[s]), (s, got[s], want[s])


def test_model_parallel_equals_one_process(work):
    for mode, model, np_, chunks in [("lora", "model", 2, 1), ("full", "model", 2, 1),
                                     ("full", "tied", 2, 2), ("lora", "deep", 4, 4),
                                     ("full", "deep", 3, 3)]:
        ref = f"mp_ref_{mode}_{model}"
        if not (work / "runs" / ref).exists():
            run(write_config(work, ref, model=model, mode=mode))
        name = f"mp_{mode}_{model}_{np_}_{chunks}"
        cfg = write_config(work, name, model=model, mode=mode, dist__strategy="model_parallel",
                           dist__pipeline_micro_batches=chunks,
                           train__gradient_checkpointing="true" if np_ == 4 else "false")
        run(cfg, np_)
        assert_same_run(work / "runs" / ref, work / "runs" / name, w_atol=5e-4)


SPLIT = {"FT_DIST_SPLIT_COMPUTE": "1"}


@pytest.mark.parametrize("strategy", ["zero2", "zero3", "fsdp", "model_parallel"])
def test_split_compute_copies(work, single, strategy):
    """The strategies that bind the model to buffers of their own keep, on a bf16 GPU,
    a compute copy of the trainables beside the fp32 masters, refreshed after every
    change of the masters (load, update, resume). FT_DIST_SPLIT_COMPUTE=1 makes those
    copies separate buffers on CPU ranks too: a refresh left out trains on stale
    weights and the runs part."""
    for mode, model, key in [("lora", "model", "lora"), ("full", "tied", "tied_full")]:
        name = f"split_{strategy}_{mode}"
        cfg = write_config(work, name, model=model, mode=mode, dist__strategy=strategy,
                           train__save_steps=3)
        run(cfg, 2, env=SPLIT)
        if strategy == "model_parallel":  # one process with the whole batch of 8
            ref = work / "runs" / f"split_ref_{mode}"
            if not ref.exists():
                run(write_config(work, ref.name, model=model, mode=mode))
        else:
            ref = single[key]
        assert_same_run(ref, work / "runs" / name, w_atol=5e-4)
        # resumed from step 3, still split: the copies follow the loaded masters
        cont = write_config(work, f"{name}_resumed", model=model, mode=mode,
                            dist__strategy=strategy)
        run(cont, 2, "--resume", str(work / "runs" / name / "checkpoint-3"), env=SPLIT)
        got, want = losses(work / "runs" / f"{name}_resumed"), losses(ref)
        assert sorted(got) == [4, 5]
        for s in got:
            assert abs(got[s] - want[s]) <= 2e-5 * abs(want[s]), (s, got[s], want[s])


def test_tensorboard_per_rank(work):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    cfg = write_config(work, "tb_ddp", dist__strategy="zero2", train__max_steps=3)
    run(cfg, 2)
    d = work / "runs" / "tb_ddp"
    assert len(list(d.glob("events.out.tfevents.*"))) == 1  # rank 0 writes
    acc = EventAccumulator(str(d), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ["train/loss", "train/tokens_per_second", "dist/comm_bytes_per_step",
                "rank0/loss", "rank1/loss", "rank0/tokens_per_second", "rank1/tokens_per_second",
                "rank0/memory/weights_peak_bytes", "rank1/memory/optimizer_peak_bytes"]:
        assert tag in tags, (tag, sorted(tags))
    loss = {e.step: e.value for e in acc.Scalars("train/loss")}
    assert loss == pytest.approx(losses(d), rel=1e-5)
    r0 = {e.step: e.value for e in acc.Scalars("rank0/loss")}
    r1 = {e.step: e.value for e in acc.Scalars("rank1/loss")}
    for s in loss:  # the global loss lies between the ranks' own (token-weighted mean)
        assert min(r0[s], r1[s]) - 1e-5 <= loss[s] <= max(r0[s], r1[s]) + 1e-5
    rates = [acc.Scalars(f"rank{r}/tokens_per_second")[-1].value for r in (0, 1)]
    assert acc.Scalars("train/tokens_per_second")[-1].value == pytest.approx(sum(rates), rel=1e-5)
    summary = json.loads((d / "run_summary.json").read_text())
    assert acc.Scalars("rank1/memory/optimizer_peak_bytes")[-1].value == \
        summary["peak_memory_by_category"]["optimizer"][1]
    # where rank 0's step time goes: the blocked part is a part of it
    step = acc.Scalars("dist/step_seconds")[-1].value
    wait = acc.Scalars("dist/comm_wait_seconds")[-1].value
    assert 0 < step and 0 <= wait <= step


def test_memory_shrinks_with_sharding(work):
    peaks = {}
    for strategy, np_ in [("ddp", 2), ("zero1", 2), ("zero2", 2), ("zero3", 2), ("zero3", 4)]:
        name = f"mem_{strategy}_{np_}"
        cfg = write_config(work, name, mode="full", dist__strategy=strategy,
                           train__batch_size=8 // np_, train__max_steps=1)
        run(cfg, np_)
        s = json.loads((work / "runs" / name / "run_summary.json").read_text())
        assert s["world_size"] == np_ and s["strategy"] == strategy
        peaks[strategy, np_] = {k: v[0] for k, v in s["peak_memory_by_category"].items()}
    ddp = peaks["ddp", 2]
    z1, z2, z3, z34 = peaks["zero1", 2], peaks["zero2", 2], peaks["zero3", 2], peaks["zero3", 4]
    # optimizer state: 1/N from zero1 on
    for p in (z1, z2, z3):
        assert abs(p["optimizer"] - ddp["optimizer"] / 2) <= 0.01 * ddp["optimizer"]
    assert abs(z34["optimizer"] - ddp["optimizer"] / 4) <= 0.01 * ddp["optimizer"]
    # gradients: whole under ddp and zero1 (+ the shard), 1/N from zero2 on
    assert z1["gradients"] >= ddp["gradients"]
    assert abs(z2["gradients"] - ddp["gradients"] / 2) <= 0.01 * ddp["gradients"]
    # weights: whole until zero3, then 1/N
    assert z2["weights"] == ddp["weights"]
    assert abs(z3["weights"] - ddp["weights"] / 2) <= 0.01 * ddp["weights"]
    assert abs(z34["weights"] - ddp["weights"] / 4) <= 0.01 * ddp["weights"]


def test_resume_under_another_strategy(work):
    full = write_config(work, "resume_full", train__max_steps=6, train__batch_size=8)
    run(full)
    ref = losses(work / "runs" / "resume_full")
    # checkpoint-3 of 2 zero2 ranks (global batch 8) continues on 4 ddp ranks, and
    # checkpoint-3 of 4 zero3 ranks in one process
    for saver, np_s, b_s, loader, np_l, b_l in [("zero2", 2, 4, "ddp", 4, 2),
                                                 ("zero3", 4, 2, "none", 1, 8)]:
        save = write_config(work, f"resume_{saver}", dist__strategy=saver, train__max_steps=6,
                            train__save_steps=3, train__batch_size=b_s)
        run(save, np_s)
        ck = work / "runs" / f"resume_{saver}" / "checkpoint-3"
        assert (ck / "trainer_state.json").exists()
        cont = write_config(work, f"resume_{saver}_on_{loader}", dist__strategy=loader,
                            train__max_steps=6, train__save_steps=3, train__batch_size=b_l)
        out = run(cont, np_l, "--resume", str(ck))
        assert f"saved by {saver} on {np_s} ranks" in out.stderr
        got = losses(work / "runs" / f"resume_{saver}_on_{loader}")
        assert sorted(got) == [4, 5, 6]
        for s in got:
            assert abs(got[s] - ref[s]) <= 2e-5 * abs(ref[s]), (saver, loader, s, got[s], ref[s])
        assert_same_run(work / "runs" / "resume_full", work / "runs" / f"resume_{saver}",
                        w_atol=2e-4)


def _parent_pid(pid):
    """The parent of pid from /proc/<pid>/stat (None once it is gone). The command name,
    field 2, is in parentheses and may hold spaces: the fields after its ')' are split."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _descends_from(pid, ancestor):
    while pid and pid > 1:
        if pid == ancestor:
            return True
        pid = _parent_pid(pid)
    return False


def _rank_pids(parent_pid):
    """pid of each rank's ft-train under mpirun parent_pid, by OMPI_COMM_WORLD_RANK (only
    this mpirun's: other ft-train runs on the machine, a test run beside this one, are
    not touched)."""
    pids = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            if "ft-train" not in (p / "cmdline").read_bytes().decode(errors="ignore"):
                continue
            env = (p / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if not _descends_from(int(p.name), parent_pid):
            continue
        for kv in env:
            if kv.startswith(b"OMPI_COMM_WORLD_RANK="):
                pids[int(kv.split(b"=")[1])] = int(p.name)
    return pids


@pytest.mark.parametrize("how", ["hang", "kill", "hang_nccl_timeout"])
def test_a_lost_rank_stops_the_run(work, how):
    # hang_nccl_timeout: no dist.timeout_s; NCCL_TIMEOUT (seconds) in the environment
    timeout = {} if how == "hang_nccl_timeout" else {"dist__timeout_s": 3}
    cfg = write_config(work, f"lost_{how}", dist__strategy="ddp", train__max_steps=100000,
                       train__batch_size=2, **timeout)
    e = {k: v for k, v in os.environ.items() if k not in ("NCCL_TIMEOUT", "FT_DIST_TIMEOUT")}
    e["OMP_NUM_THREADS"] = "1"
    if how == "hang_nccl_timeout":
        e["NCCL_TIMEOUT"] = "3"
    p = subprocess.Popen(mpi_cmd(2, FT_TRAIN, "--config", str(cfg)), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=e)
    try:
        deadline = time.time() + 60
        pids = {}
        while time.time() < deadline and len(pids) < 2:
            time.sleep(0.5)
            pids = _rank_pids(p.pid)
        assert len(pids) == 2, "ranks did not start"
        time.sleep(2)  # let them train
        os.kill(pids[1], signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
        if how != "kill" and pids.get(1):  # (never pid 0: that is our process group)
            try:
                os.kill(pids[1], signal.SIGKILL)
            except OSError:
                pass
    assert p.returncode != 0
    if how != "kill":
        assert "did not complete within 3 s" in err and "rank 0" in err, err[-3000:]




def test_make_targets_train_on_ranks(work, single):
    """The make targets launch real ranks: train-distributed and train-deepspeed with
    deepspeed_like/zero2.json ('auto' batch keys, stage 2) give the one-process run;
    a HOSTFILE naming this host twice works as a two-node launch would. Each target
    trains in its own run dir, the config's train.output_dir with its suffix."""
    hostfile = work / "hosts"
    hostfile.write_text("localhost slots=2\n")
    for target, extra, name, suffix in [
            ("train-distributed", [], "mk_ddp", "-ddp"),
            ("train-deepspeed", ["DEEPSPEED_CONFIG=deepspeed_like/zero2.json"], "mk_ds",
             "-deepspeed-zero2"),
            ("train-zero", ["ZERO_STAGE=3", f"HOSTFILE={hostfile}"], "mk_z3", "-zero3")]:
        cfg = write_config(work, name)
        out = make(target, f"CONFIG={cfg}", "NUM_GPUS=2", *extra)
        assert out.returncode == 0, out.stderr[-3000:]
        run_dir = work / "runs" / (name + suffix)
        assert out.stdout.strip().endswith(str(run_dir / "final")), out.stdout
        assert not (work / "runs" / name).exists()
        s = json.loads((run_dir / "run_summary.json").read_text())
        assert s["world_size"] == 2
        assert s["strategy"] == {"mk_ddp": "ddp", "mk_ds": "zero2", "mk_z3": "zero3"}[name]
        assert_same_run(single["lora"], run_dir)
    # the global batch rule of the JSON: train_batch_size 16 with micro 4 on 2 ranks
    ds = work / "ds16.json"
    ds.write_text(json.dumps({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                              "zero_optimization": {"stage": 1}}))
    cfg = write_config(work, "ds16", dist__deepspeed_config=ds, train__max_steps=1)
    cfg.write_text(cfg.read_text().replace("  batch_size: 4\n", "").replace("  grad_accum: 1\n", ""))
    out = run(cfg, 2)
    assert "  grad_accum: 2" in (work / "runs" / "ds16" / "config.yaml").read_text()
    bad = write_config(work, "ds_bad", dist__deepspeed_config=ds, train__grad_accum=3)
    out = run(bad, 2, check=False)
    assert out.returncode != 0 and "train_batch_size 16" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("strategy,np_", [("ddp", 2), ("zero2", 2), ("zero3", 2),
                                          ("model_parallel", 2)])
def test_qlora_under_strategies(work, strategy, np_):
    """QLoRA: ddp and zero2 keep the whole quantized base on every rank (a replica: 0.5
    byte/param), model_parallel a stage's layers; zero3 shards it by blocks (below)."""
    ref = "qlora_single"
    if not (work / "runs" / ref).exists():
        run(write_config(work, ref, mode="qlora", train__batch_size=8))
    b = 8 if strategy == "model_parallel" else 8 // np_
    name = f"qlora_{strategy}_{np_}"
    run(write_config(work, name, mode="qlora", dist__strategy=strategy, train__batch_size=b),
        np_)
    assert_same_run(work / "runs" / ref, work / "runs" / name)
    state = (work / "runs" / name / "final" / "adapter_config.json")
    assert state.exists()


def quant_bytes(run_dir):
    return json.loads((Path(run_dir) / "run_summary.json").read_text())["quantized_base_bytes"]


@pytest.mark.parametrize("strategy,np_,offload", [("zero3", 2, False), ("fsdp", 2, True),
                                                  ("zero3", 4, True), ("fsdp", 4, False),
                                                  ("fsdp", 3, False)])
def test_qlora_sharded_base(work, strategy, np_, offload):
    """zero3 / fsdp shard the quantized base (NF4 + double quantization) by whole blocks:
    each rank keeps 1/N of the packed codes and absmax codes (the nested state, one fp32
    per 256 blocks and the map, on every rank), gathers a layer before its forward and
    its backward; with dist.offload_params cpu the shard is in host memory. Losses, norms
    and the adapter equal one process; the ranks' bytes add up to the whole base."""
    b = 8 // np_ if 8 % np_ == 0 else 3  # 3 ranks: a global batch of 9
    ref = "qlora_single" if b * np_ == 8 else f"qlora_single_{b * np_}"
    if not (work / "runs" / ref).exists():
        run(write_config(work, ref, mode="qlora", train__batch_size=b * np_))
    whole = "qlora_ddp_whole"
    if not (work / "runs" / whole).exists():
        run(write_config(work, whole, mode="qlora", dist__strategy="ddp", train__batch_size=4,
                         train__max_steps=1), 2)
    name = f"qlora_sharded_{strategy}_{np_}_{int(offload)}"
    over = {"dist__offload_params": "cpu"} if offload else {}
    cfg = write_config(work, name, mode="qlora", dist__strategy=strategy, train__batch_size=b,
                       **over)
    run(cfg, np_)
    assert_same_run(work / "runs" / ref, work / "runs" / name)
    full = quant_bytes(work / "runs" / whole)
    got = quant_bytes(work / "runs" / name)
    assert len(got) == np_ and full[0] == full[1] > 0
    # 2 layers x 7 weights of 1024 or 2048 elements in blocks of 64: the nested state is
    # one float and a 256-float map per weight, kept by every rank
    replicated = 14 * (256 + 1) * 4
    assert sum(got) == full[0] + (np_ - 1) * replicated, (got, full)
    sharded = full[0] - replicated
    for g in got:  # each rank within one block per weight of an even split
        assert abs((g - replicated) - sharded / np_) <= 14 * (32 + 1), (got, sharded)
    if offload:  # the shard is in the host memory context
        host = json.loads((work / "runs" / name / "run_summary.json").read_text())[
            "host_offload_bytes"]
        assert all(h >= g - replicated for h, g in zip(host, got)), (host, got)


def test_qlora_sharded_prequantized_and_resume(work):
    """ft-quantize's output (NF4 + double quantization in the checkpoint) sharded as it is
    by zero3 with gradient checkpointing equals quantizing on load in one process; a
    QLoRA checkpoint saved by fsdp on 2 ranks with the base offloaded resumes on 4 zero3
    ranks and in one process with the losses of the uninterrupted run."""
    exe = os.environ.get("FT_QUANTIZE") or str(Path(FT_TRAIN).parent / "ft-quantize")
    q = work / "model-nf4"
    if not q.exists():
        subprocess.run([exe, "--model", str(work / "model"), "--out", str(q)], check=True,
                       capture_output=True, text=True)
    ref = "qlora_single6_ckpt"
    run(write_config(work, ref, mode="qlora", train__batch_size=8, train__max_steps=6,
                     train__gradient_checkpointing="true"))
    pre = write_config(work, "qlora_prequant_z3", mode="qlora", dist__strategy="zero3",
                       train__batch_size=4, train__max_steps=6,
                       train__gradient_checkpointing="true")
    pre.write_text(pre.read_text().replace(str(work / "model") + "\n", str(q) + "\n"))
    assert str(q) in pre.read_text()
    run(pre, 2)
    assert_same_run(work / "runs" / ref, work / "runs" / "qlora_prequant_z3")
    ref_losses = losses(work / "runs" / ref)
    save = write_config(work, "qlora_resume_fsdp", mode="qlora", dist__strategy="fsdp",
                        dist__offload_params="cpu", train__batch_size=4, train__max_steps=6,
                        train__save_steps=3, train__gradient_checkpointing="true")
    run(save, 2)
    ck = work / "runs" / "qlora_resume_fsdp" / "checkpoint-3"
    for loader, np_, b in [("zero3", 4, 2), ("none", 1, 8)]:
        name = f"qlora_resume_on_{loader}"
        cont = write_config(work, name, mode="qlora", dist__strategy=loader,
                            train__batch_size=b, train__max_steps=6, train__save_steps=3,
                            train__gradient_checkpointing="true")
        out = run(cont, np_, "--resume", str(ck))
        assert "saved by fsdp on 2 ranks" in out.stderr
        got = losses(work / "runs" / name)
        assert sorted(got) == [4, 5, 6]
        for s in got:
            assert abs(got[s] - ref_losses[s]) <= 2e-5 * abs(ref_losses[s]), (loader, s)
        wa, wb = weights(work / "runs" / ref), weights(work / "runs" / name)
        assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 2e-4


@pytest.mark.parametrize("strategy,np_,model,quant", [
    ("zero3", 2, "model", {"tuning__quant__type": "int8"}),
    ("fsdp", 4, "model", {"tuning__quant__type": "fp4", "tuning__quant__double_quant": "false",
                          "tuning__quant__blocksize": 32}),
    ("zero3", 2, "tied", {}),
])
def test_qlora_sharded_formats(work, strategy, np_, model, quant):
    """int8 (rows with their scales), FP4 without double quantization (blocks with fp32
    absmax) and a tied embedding (a third parameter window) sharded the same way: equal to
    one process, every rank keeping part of the base."""
    key = "_".join(f"{v}" for v in quant.values()) or "nf4"
    ref = f"qlora_fmt_single_{model}_{key}"
    if not (work / "runs" / ref).exists():
        run(write_config(work, ref, model=model, mode="qlora", train__batch_size=8, **quant))
    name = f"qlora_fmt_{strategy}_{np_}_{model}_{key}"
    run(write_config(work, name, model=model, mode="qlora", dist__strategy=strategy,
                     train__batch_size=8 // np_, dist__offload_params="cpu", **quant), np_)
    assert_same_run(work / "runs" / ref, work / "runs" / name)
    got = quant_bytes(work / "runs" / name)
    assert len(got) == np_ and all(0 < g < 0.6 * sum(got) for g in got), got


def test_sharded_base_refuses_a_weight_of_another_format(work):
    """A checkpoint whose weights are not in its quantization_config's format cannot be
    cut by the config's blocks: the weight is named; one process still trains on it."""
    exe = os.environ.get("FT_QUANTIZE") or str(Path(FT_TRAIN).parent / "ft-quantize")
    q = work / "model-nf4-odd"
    if not q.exists():
        subprocess.run([exe, "--model", str(work / "model"), "--out", str(q)], check=True,
                       capture_output=True, text=True)
        cfg = json.loads((q / "config.json").read_text())
        cfg["quantization_config"]["bnb_4bit_blocksize"] = 128
        (q / "config.json").write_text(json.dumps(cfg))
    bad = write_config(work, "qlora_odd_z3", mode="qlora", dist__strategy="zero3",
                       train__max_steps=1)
    bad.write_text(bad.read_text().replace(str(work / "model") + "\n", str(q) + "\n"))
    out = run(bad, 2, check=False)
    assert out.returncode != 0
    assert "model.layers.0.self_attn.q_proj.weight" in out.stderr and \
        "blocksize 64" in out.stderr and "blocksize 128" in out.stderr, out.stderr[-2000:]
    one = write_config(work, "qlora_odd_one", mode="qlora", train__max_steps=1)
    one.write_text(one.read_text().replace(str(work / "model") + "\n", str(q) + "\n"))
    run(one)
    assert (work / "runs" / "qlora_odd_one" / "final" / "adapter_model.safetensors").exists()
