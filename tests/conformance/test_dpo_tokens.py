"""ft-train's DPO in LoRA mode with tokens added (model.add_special_tokens: the grown
embedding and head trained in full as modules_to_save) against TRL 1.16's DPOTrainer as a
PEFT user runs it: tokenizer.add_special_tokens, model.resize_token_embeddings(len(tok))
(new rows the mean of the old ones: ftkit's exact mean, test_added_tokens.py), the adapter,
DPOTrainer. With a fresh adapter TRL's reference is the model under disable_adapter(): the
pairs off, the embedding and the head PEFT's original modules, the resized base's.

- llama and a tied llama: five steps of ft-train's DPO on string pairs using the new
  tokens = TRL's DPOTrainer.train() on PEFT's model from our starting adapter (a run at
  learning rate 0), its "ref" adapter copy removed (TRL given a peft_config): every step's
  loss and metrics (1e-5; the rewards to 1e-5 of beta max|logps|, as test_dpo_train.py
  explains) and every trained tensor (1e-5);
- the saved adapter and tokenizer reload by the recipe (AutoTokenizer on the adapter dir,
  resize_token_embeddings(len(tok)), PeftModel.from_pretrained) with no missing or
  unexpected keys, to our logits;
- a run from such an adapter (tuning.lora.init_adapter: the reference is that adapter as
  it starts, TRL's "ref" copy, the trained embedding and head included) = TRL's;
- every dist.strategy (and an offloaded optimizer) on 2 ranks = one process, and the
  memory plan (the embedding's and head's starting values kept, each rank its part)
  equals every rank's measured bytes;
- ORPO (no reference) with the tokens added trains too;
- on the GPU (or the emulated device) five steps equal the CPU's, fp32 and bf16."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ftref
import rankrun
from test_added_tokens import ADD, family_dir, file_key_to_ours, no_key_warnings, \
    resized_base
from test_added_tokens import config as tokens_config

MAXLEN = 32
STEPS = 5
BETA = 0.1
METRICS = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
           "logps/chosen", "logps/rejected"]


def pairs(n):
    """n string pairs using the added tokens (in prompts, completions and only some)."""
    words = ["abc", "de", "fgh", "ij", "klm", "nop", "qr", "stu", "vw", "xyz"]
    out = []
    for i in range(n):
        w = [words[(i + k) % len(words)] for k in range(4)]
        out.append({"prompt": f"<|im_start|>{w[0]} {w[1]}<|im_end|>" if i % 3 else f"{w[0]} {w[1]}",
                    "chosen": f" {w[2]}<|im_end|>",
                    "rejected": f" {w[3]} {w[1]}" + ("<|im_start|>" if i % 2 else "")})
    return out


def config(d, name, model, data, **over):
    base = dict(data__format="auto", train__objective="dpo", train__batch_size=4,
                train__max_steps=STEPS, train__warmup_steps=1, train__weight_decay=0.0,
                train__max_grad_norm=1.0, train__lr_scheduler="cosine",
                train__pref__beta=BETA, model__max_seq_len=MAXLEN)
    base.update(over)
    return tokens_config(d, name, model, data, **base)


def logged(run_dir):
    rows = [json.loads(x) for x in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "loss" in r and "step" in r]


def adapter(run_dir):
    return load_file(str(Path(run_dir) / "final" / "adapter_model.safetensors"))


class Case:
    pass


@pytest.fixture(scope="module", params=["llama", "tied"])
def case(request, tmp_path_factory):
    """The family's model and tokenizer, 4 pairs, our starting adapter (a run at learning
    rate 0) and our five-step DPO run."""
    c = Case()
    c.family = request.param
    c.d = tmp_path_factory.mktemp(f"dpo_tok_{c.family}")
    c.model, c.V = family_dir(None, c.d, c.family)
    c.tied = c.family == "tied"
    c.data = c.d / "pairs.jsonl"
    c.data.write_text("".join(json.dumps(r) + "\n" for r in pairs(4)))
    out = rankrun.run(config(c.d, "init", c.model, c.data, train__learning_rate=0,
                             train__max_steps=1))
    assert f"vocabulary {c.V} -> {c.V + 2}" in out.stderr, out.stderr[-3000:]
    mts = "embed_tokens" if c.tied else "embed_tokens, lm_head"
    assert f"modules_to_save: {mts}" in out.stderr, out.stderr[-3000:]
    c.init = c.d / "runs" / "init" / "final"
    c.run = c.d / "runs" / "five"
    rankrun.run(config(c.d, "five", c.model, c.data, train__learning_rate=1e-2))
    start = load_file(str(c.init / "adapter_model.safetensors"))
    c.rows = {"V": c.V, "embed": start["base_model.model.model.embed_tokens.weight"]}
    if not c.tied:
        c.rows["head"] = start["base_model.model.lm_head.weight"]
    return c


def trl_train(c, adapter_dir, keep_ref, lr=1e-2):
    """TRL's DPOTrainer.train() on the pairs, PEFT's model from adapter_dir on the resized
    base (its new rows ours); keep_ref: TRL's "ref" copy of the starting adapter as the
    reference, else (removed) the adapter disabled. Per step the loss and the logged
    metrics; the trained tensors (our names)."""
    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    losses = []

    class Recording(DPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            losses.append(loss.item())
            return loss

    tok = AutoTokenizer.from_pretrained(str(adapter_dir))
    assert tok.convert_tokens_to_ids(ADD) == [c.V, c.V + 1]
    model = PeftModel.from_pretrained(resized_base(c.model, c.V + 2, c.rows), str(adapter_dir),
                                      is_trainable=True)
    rows = [json.loads(x) for x in c.data.read_text().splitlines()]
    args = DPOConfig(output_dir=str(c.d / "trl"), report_to=[], use_cpu=True, bf16=False,
                     gradient_checkpointing=False, per_device_train_batch_size=4,
                     max_steps=STEPS, learning_rate=lr, lr_scheduler_type="cosine",
                     warmup_steps=1, weight_decay=0.0, max_grad_norm=1.0, logging_steps=1,
                     save_strategy="no", max_length=MAXLEN, seed=0,
                     dataloader_drop_last=False, beta=BETA)
    tr = Recording(model=model, args=args, processing_class=tok,
                   train_dataset=Dataset.from_list(rows))
    assert "ref" in tr.model.peft_config
    if not keep_ref:
        tr.model.delete_adapter("ref")
        tr.model.set_adapter("default")
    tr.train()
    logs = [h for h in tr.state.log_history if "rewards/chosen" in h]
    weights = {ftref.ours_key(n): p.detach().clone() for n, p in tr.model.named_parameters()
               if p.requires_grad}
    return losses, logs, weights


def assert_matches_trl(c, run_dir, trl):
    losses, logs, want = trl
    ours = logged(run_dir)
    assert len(ours) == len(logs) == len(losses) == STEPS
    ftref.assert_close("losses", torch.tensor([m["loss"] for m in ours], dtype=torch.float64),
                       torch.tensor(losses, dtype=torch.float64), ftref.TOL_LOSSES)
    scale = BETA * max(abs(h[k]) for h in logs for k in ("logps/chosen", "logps/rejected"))
    for k in METRICS:
        a = torch.tensor([m[k] for m in ours], dtype=torch.float64)
        b = torch.tensor([h[k] for h in logs], dtype=torch.float64)
        if k == "rewards/accuracies":
            assert torch.equal(a, b), (k, a, b)
        elif k.startswith("rewards/"):
            err = float((a - b).abs().max()) / scale
            assert err <= ftref.TOL_LOSSES, (k, err, a.tolist(), b.tolist())
        else:
            ftref.assert_close(k, a, b, ftref.TOL_LOSSES)
    got = {file_key_to_ours(k): v for k, v in adapter(run_dir).items()}
    if c.tied:  # (the head's key holds the one embedding again, as PEFT saves it)
        assert torch.equal(got.pop("lm_head.weight"), got["model.embed_tokens.weight"])
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    for k, w in want.items():
        ftref.assert_close(f"weight {k}", got[k], w, ftref.TOL_WEIGHT)


def test_five_steps_match_trl(case):
    assert_matches_trl(case, case.run, trl_train(case, case.init, keep_ref=False))
    # the reference is the originals, not the policy: the rewards move off 0
    assert abs(logged(case.run)[-1]["rewards/margins"]) > 1e-4


def test_saved_adapter_reloads_in_peft(case, ft):
    from peft import PeftModel
    from transformers import AutoTokenizer

    final = case.run / "final"
    tok = AutoTokenizer.from_pretrained(str(final))
    assert len(tok) == case.V + 2 and tok.convert_tokens_to_ids(ADD) == [case.V, case.V + 1]
    base = ftref.load_hf(case.model)
    base.resize_token_embeddings(len(tok))
    pm = no_key_warnings(lambda: PeftModel.from_pretrained(base, str(final)))
    pm.eval()
    ids = torch.tensor([tok("<|im_start|>abc de<|im_end|> fgh").input_ids])
    assert case.V in ids and case.V + 1 in ids
    out = ft(dict(model_dir=case.model, adapter_dir=final, mode="lora", input_ids=ids),
             f"dpo-tok-saved-{case.family}")
    ftref.assert_close("saved adapter logits", out["logits"], ftref.hf_forward(pm, ids)[0],
                       ftref.TOL_LOGITS)


def test_from_adapter_matches_trl(case):
    """DPO from the five-step run's adapter (init_adapter with the same tokens added, its
    modules_to_save named): TRL's reference is its "ref" copy, the trained embedding and
    head included."""
    name = "from_adapter"
    rankrun.run(config(case.d, name, case.model, case.data, train__learning_rate=1e-2,
                       tuning__lora__init_adapter=str(case.run / "final"),
                       tuning__lora__modules_to_save="embed_tokens" if case.tied
                       else "embed_tokens,lm_head"))
    run_dir = case.d / "runs" / name
    assert logged(run_dir)[0]["rewards/margins"] == 0  # the policy as it starts
    assert_matches_trl(case, run_dir, trl_train(case, case.run / "final", keep_ref=True))


# ---- every strategy on two ranks -------------------------------------------------------


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    d = tmp_path_factory.mktemp("dpo_tok_dist")
    model, _ = family_dir(None, d, "llama")
    data = d / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in pairs(16)))
    return d, model, data


STRATEGIES = ["ddp", "zero1", "zero2", "zero3", "fsdp", "model_parallel", "zero2+offload",
              "zero3+offload", "zero2+split", "zero3+split", "model_parallel+split"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategies_equal_one_process(dist, strategy, monkeypatch):
    """2 ranks of 4 pairs = one process of 8 (model_parallel: 2 stages of the same 8, in
    GPipe chunks); the losses, gradient norms and DPO's metrics of every step, the
    adapter after them. split: FT_DIST_SPLIT_COMPUTE=1 gives the compute copies (what
    the kept originals are swapped into) buffers of their own, as bf16 does on a GPU."""
    import test_dpo_dist as dd

    d, model, data = dist
    name, _, off = strategy.partition("+")
    if off == "split":
        monkeypatch.setenv("FT_DIST_SPLIT_COMPUTE", "1")
        off = ""
    dp = name != "model_parallel"
    common = dict(train__learning_rate=1e-2, data__shuffle="false")
    ref = d / "runs" / "one"
    if not ref.exists():
        rankrun.run(config(d, ref.name, model, data, train__batch_size=8, **common))
    over = dict(dist__strategy=name, train__batch_size=4 if dp else 8, **common)
    if off:
        over["dist__offload_optimizer"] = "cpu"
    if not dp:
        over["dist__pipeline_micro_batches"] = 3
    run = f"np2_{strategy.replace('+', '_')}"
    rankrun.run(config(d, run, model, data, **over), 2)
    dd.assert_same_run(ref, d / "runs" / run, w_atol=5e-4)
    assert adapter(d / "runs" / run)["base_model.model.model.embed_tokens.weight"].shape[0] == 66


@pytest.mark.parametrize("strategy,np_", [("ddp", 2), ("zero3", 2), ("fsdp", 3),
                                         ("model_parallel", 2), ("model_parallel", 3)])
def test_memory_plan_exact(dist, strategy, np_):
    """The kept embedding and head (their starting values and a scratch for the policy's,
    each rank what its forward reads of them) in the plan: planned == measured."""
    from test_memcheck import assert_exact

    d, model, data = dist
    cfg = config(d, f"measure_{strategy}_{np_}", model, data, dist__strategy=strategy,
                 train__batch_size=3)
    out = rankrun.run(cfg, np_, "--measure")
    assert_exact(out.stdout, np_)


def test_orpo_with_tokens_trains(case):
    """ORPO has no reference: with the tokens added it trains the grown modules."""
    name = "orpo"
    rankrun.run(config(case.d, name, case.model, case.data, train__learning_rate=1e-2,
                       train__objective="orpo", train__max_steps=2))
    w = adapter(case.d / "runs" / name)
    emb = w["base_model.model.model.embed_tokens.weight"]
    assert emb.shape[0] == case.V + 2
    assert not torch.equal(emb[case.V:], case.rows["embed"][case.V:])


# ---- the GPU (the emulated device: FT_EMU=1 with the emulated build's FT_TRAIN) -----------


@pytest.mark.skipif(not (os.environ.get("FT_EMU") == "1" or torch.cuda.is_available()),
                    reason="no CUDA GPU (and not the emulated device: FT_EMU unset)")
@pytest.mark.parametrize("bf16", [False, True], ids=["fp32", "bf16"])
@pytest.mark.parametrize("family", ["llama", "tied"])
def test_gpu_equals_cpu(tmp_path, family, bf16):
    """DPO with tokens added on the GPU (the originals kept on the device, in the compute
    dtype) trains as on the CPU: the losses, DPO's metrics and the saved adapter of five
    steps (fp32: 1e-5 per tensor; bf16: 1e-2 for the losses and logps, the rewards to 1e-2
    of beta max|logps|, and test_added_tokens.py's 8e-2 for the adapter taken whole:
    AdamW's normalised steps turn bf16's rounding of a gradient entry near 0 into a step
    of either sign, which leaves one small LoRA B here 12% off while the losses agree to
    1e-4)."""
    model, V = family_dir(None, tmp_path, family)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in pairs(4)))
    env = {"FT_EMU_DEVICES": "1"} if os.environ.get("FT_EMU") == "1" else None
    common = dict(train__learning_rate=1e-2)
    rankrun.run(config(tmp_path, "cpu", model, data, train__device="cpu", **common))
    rankrun.run(config(tmp_path, "gpu", model, data, train__device="cuda",
                       train__bf16="true" if bf16 else "false", **common), env=env)
    tol_w, tol_l = (8e-2, 1e-2) if bf16 else (1e-5, 1e-5)
    a, b = adapter(tmp_path / "runs" / "cpu"), adapter(tmp_path / "runs" / "gpu")
    assert a.keys() == b.keys()
    if bf16:
        ftref.assert_close("gpu adapter", torch.cat([b[k].flatten() for k in sorted(b)]),
                           torch.cat([a[k].flatten() for k in sorted(a)]), tol_w)
    else:
        for k in a:
            ftref.assert_close(f"gpu {k}", b[k], a[k], tol_w)
    la, lb = logged(tmp_path / "runs" / "cpu"), logged(tmp_path / "runs" / "gpu")
    scale = BETA * max(abs(m[k]) for m in la for k in ("logps/chosen", "logps/rejected"))
    for k in ["loss"] + METRICS:
        x = torch.tensor([m[k] for m in lb], dtype=torch.float64)
        y = torch.tensor([m[k] for m in la], dtype=torch.float64)
        if k.startswith("rewards/") and k != "rewards/accuracies":
            assert float((x - y).abs().max()) <= tol_l * scale, (k, x, y)
        elif k != "rewards/accuracies" or not bf16:
            ftref.assert_close(f"gpu {k}", x, y, tol_l)
    assert abs(la[-1]["rewards/margins"]) > 1e-4
    assert b["base_model.model.model.embed_tokens.weight"].shape[0] == V + 2
