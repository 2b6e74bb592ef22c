"""DPO with an adapter that trains the embedding or the head in full (PEFT's
modules_to_save) or puts LoRA on them, against TRL 1.16's DPOTrainer with a PEFT model, on
the tiny random models of ftref (the C harness's preference objective, as test_dpo.py).

TRL's reference of a fresh adapter (the trainer given a peft_config) is the same model
under disable_adapter(): the LoRA layers compute with their base layer, PEFT's
ModulesToSaveWrapper with its original_module (the module as the base had it, of which
the trained copy starts as a copy). We keep those starting values and switch the pairs off
(train/pref.h ref_lora_off). Here the fresh adapter is PEFT's adapter with random pairs
(the policy is not the reference) whose original modules are set to its copies' values (a
fresh adapter's copies are the originals), TRL's "ref" adapter removed so that it takes
the disable_adapter path; the harness, "ref": "base", keeps the copies as loaded.

- the loss and TRL's metrics (1e-5), every gradient (1e-4) and five AdamW steps (1e-5)
  for modules_to_save on an untied model (embedding and head), on a tied one (PEFT's
  ensure_weight_tying: one copy), the head saved beside LoRA on the embedding, and
  LoRA on the embedding alone (its pair off in the reference);
- a starting adapter with modules_to_save (TRL's frozen "ref" copy of it, ft-train's
  tuning.lora.init_adapter): the reference is the adapter as it starts, copies included;
- LoRA on lm_head: TRL refuses it (its fused head reads lm_head.weight, leaving the pair
  out), so the reference is written here in torch on PEFT's model (the completion's
  summed log-probabilities with the adapter on and under disable_adapter(), TRL's sigmoid
  loss and metrics), itself checked against TRL's compute_loss where TRL computes;
  untied, and tied under ensure_weight_tying.
Tokens added to the vocabulary (modules_to_save of the grown embedding and head) through
ft-train: test_dpo_tokens.py."""

import pytest
import torch
import torch.nn.functional as F

import ftref
from pref_ref import TRAIN, Run, assert_five_steps, five_steps
from test_dpo import METRICS, dpo_trainer, trl_step

RUNS = [
    dict(id="mts-both", model="llama_gqa", adapter="mts_both_no_k", ref="fresh"),
    dict(id="mts-tie", model="tied", adapter="mts_tie_no_k", ref="fresh"),
    dict(id="mts-head-lora-embed", model="llama_gqa", adapter="mts_head_lora_embed_no_k",
         ref="fresh"),
    dict(id="mts-both-start", model="llama_gqa", adapter="mts_both_no_k", ref="adapter"),
    dict(id="lora-embed", model="llama_gqa", adapter="outer_embed", ref="base"),
    dict(id="lora-embed-head", model="llama_gqa", adapter="outer_no_k", ref="base",
         torch_ref=True),
    dict(id="lora-tie", model="tied", adapter="outer_tie_no_k", ref="base", torch_ref=True),
]
BETA = 0.3


def fresh_originals(model):
    """Every ModulesToSaveWrapper's original module set to its trained copy's values: the
    adapter as it would start from this base."""
    from peft.utils.other import ModulesToSaveWrapper

    n = 0
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, ModulesToSaveWrapper):
                mod.original_module.weight.copy_(mod.modules_to_save["default"].weight)
                n += 1
    assert n


def torch_dpo(model, r):
    """TRL's sigmoid DPO loss and metrics computed in torch on PEFT's model: each row's
    summed log-probability of its completion tokens, the policy's with the adapter on,
    the reference's under disable_adapter()."""
    def logps():
        logits = model(input_ids=r.ids, attention_mask=r.am).logits[:, :-1].double()
        lp = torch.log_softmax(logits, -1).gather(-1, r.ids[:, 1:, None])[..., 0]
        return (lp * r.cm[:, 1:]).sum(-1)

    pol = logps()
    with torch.no_grad(), model.disable_adapter():
        ref = logps()
    P = r.P
    wc, wr = BETA * (pol[:P] - ref[:P]), BETA * (pol[P:] - ref[P:])
    loss = -F.logsigmoid(wc - wr).mean()
    m = [wc.mean(), wr.mean(), (wc > wr).float().mean(), (wc - wr).mean(), pol[:P].mean(),
         pol[P:].mean()]
    return loss, torch.tensor([float(x.detach()) for x in m], dtype=torch.float64)


def build(store, run, tmp):
    """The run (batch, harness spec, PEFT model) and its reference's loss function."""
    r = Run(store, dict(run, P=3))
    r.key = ftref.ours_key  # (the modules trained in full under their HF names)
    r.spec["pref"] = dict(beta=BETA, **({"ref": "base"} if run["ref"] != "adapter" else {}))
    if run["ref"] == "fresh":
        fresh_originals(r.model)
    if run.get("torch_ref"):
        return r, lambda: torch_dpo(r.model, r)
    tr = dpo_trainer(r.model, run["ref"] != "adapter", dict(beta=BETA), tmp)
    return r, lambda: trl_step(tr, r)


class Case:
    pass


@pytest.fixture(scope="module", params=RUNS, ids=[r["id"] for r in RUNS])
def case(request, store, ft, tmp_path_factory):
    run = request.param
    c = Case()
    r, step = build(store, run, tmp_path_factory.mktemp("trl"))
    c.loss, c.metrics = step()
    r.model.zero_grad(set_to_none=True)
    c.loss.backward()
    c.grads = {r.key(n): p.grad.detach().clone()
               for n, p in r.model.named_parameters() if p.requires_grad}
    c.out = ft(r.spec, f"dpo-mod-{run['id']}")
    c.run = run
    return c


def test_loss_and_metrics(case):
    ftref.assert_close("DPO loss", case.out["pref.loss"], case.loss.detach(), ftref.TOL_LOSSES)
    for i, k in enumerate(METRICS):
        ftref.assert_close(k, case.out["pref.metrics"][i], case.metrics[i], ftref.TOL_LOSSES)
    # the policy is not the reference (the rewards would be 0), but for the starting
    # adapter's, which is the policy as it starts
    assert (abs(float(case.metrics[3])) > 1e-3) == (case.run["ref"] != "adapter"), \
        case.metrics


def test_grads(case):
    saved = [k for k in case.grads if ".lora_" not in k]
    if case.run["adapter"].startswith("mts"):
        assert saved, sorted(case.grads)
    ftref.assert_tensor_dict_close("grad.", case.out, case.grads, ftref.TOL_GRAD)


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_five_steps(run, store, ft, tmp_path_factory):
    """Five AdamW steps on TRL's loss (the torch reference's for LoRA on lm_head): the
    reference stays the originals while the copies move."""
    r, step = build(store, run, tmp_path_factory.mktemp("trl5"))
    named = [(r.key(n), p) for n, p in r.model.named_parameters() if p.requires_grad]
    losses = five_steps(named, lambda: step()[0], TRAIN)
    assert_five_steps(ft(dict(r.spec, train=TRAIN), f"dpo-mod5-{run['id']}"), losses, named)


def test_torch_reference_is_trls(store, tmp_path):
    """The torch reference above = TRL's compute_loss where TRL computes (LoRA on the
    embedding, modules_to_save of both modules with the originals apart)."""
    for run in (RUNS[4], RUNS[0]):
        r, step = build(store, run, tmp_path / run["id"])
        loss, metrics = step()
        mine, mine_metrics = torch_dpo(r.model, r)
        ftref.assert_close("torch DPO loss", mine.detach(), loss.detach(), ftref.TOL_LOSSES)
        ftref.assert_close("torch DPO metrics", mine_metrics, metrics, ftref.TOL_LOSSES)
