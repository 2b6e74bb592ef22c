"""DPO against TRL 1.16's DPOTrainer, on the tiny random models of ftref: the C harness's
preference objective (train/pref.h) on a batch of pairs vs TRL's own compute_loss (the
trainer built around the same PEFT or full model) on the same collated batch.

- the loss and the metrics TRL logs (rewards/chosen, rewards/rejected,
  rewards/accuracies, rewards/margins, logps/chosen, logps/rejected): 1e-5 relative;
- the gradient of every trainable parameter (LoRA A and B, or every weight): 1e-4;
- five AdamW steps (torch.optim.AdamW on TRL's loss, as test_train.py's reference loop):
  every trainable weight 1e-5;
for the sigmoid, ipo and robust losses, the reference of a LoRA run both as TRL builds it
from a PeftModel (a frozen copy of the starting adapter) and from a fresh adapter (the
base, adapters disabled), full fine-tuning (a second model loaded from the same dir),
QLoRA (NF4 base quantized on load; TRL on a model holding the dequantized weights, as
test_qlora.py compares), and the pairs split into two micro-batches (grad_accum 2)."""

import pytest
import torch

import ftref
from pref_ref import TRAIN, Run, assert_five_steps, dequantized_dir, five_steps, \
    trainable_params, trainer_inputs


def dpo_trainer(model, ref_base, pref, tmp):
    """TRL's DPOTrainer around model (not trained: its compute_loss is the reference).
    ref_base: for a PEFT model, drop the "ref" adapter TRL copies from the starting one, so
    that the reference is the base with adapters disabled (TRL's fresh-adapter case)."""
    from trl import DPOConfig, DPOTrainer

    tok, ds = trainer_inputs(model.config.vocab_size)
    args = DPOConfig(output_dir=str(tmp), report_to=[], use_cpu=True,
                     gradient_checkpointing=False, bf16=False, beta=pref["beta"],
                     loss_type=[pref.get("loss_type", "sigmoid")],
                     label_smoothing=pref.get("label_smoothing", 0.0))
    tr = DPOTrainer(model=model, args=args, processing_class=tok, train_dataset=ds)
    if ref_base:
        assert "ref" in tr.model.peft_config
        tr.model.delete_adapter("ref")
        tr.model.set_adapter("default")
    return tr


METRICS = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
           "logps/chosen", "logps/rejected"]


def trl_step(tr, r):
    """TRL's loss (a graph) and its logged metrics for the run's batch."""
    for v in tr._metrics.values():
        v.clear()
    loss = tr.compute_loss(tr.model, dict(input_ids=r.ids, attention_mask=r.am,
                                          completion_mask=r.cm))
    mode = "train" if tr.model.training else "eval"
    return loss, torch.tensor([tr._metrics[mode][k][-1] for k in METRICS], dtype=torch.float64)

RUNS = [
    dict(id="lora-sigmoid", model="llama_gqa", adapter="no_k", pref=dict(beta=0.1)),
    # (adapter seed 3: the reward margins are differences of sums of ~25 nats, and on some
    # draws TRL's own float32 margins are 1e-5 off its float64 ones; on this draw every
    # metric of TRL in float32 agrees with float64 to < 6e-7)
    dict(id="lora-sigmoid-base-ref", model="llama_gqa", adapter="no_k", adapter_seed=3,
         pref=dict(beta=0.5), ref="base"),
    dict(id="lora-ipo", model="llama_gqa", adapter="qv", pref=dict(beta=0.2, loss_type="ipo")),
    dict(id="lora-robust", model="qwen2", adapter="no_k",
         pref=dict(beta=0.3, loss_type="robust", label_smoothing=0.1)),
    dict(id="full-sigmoid", model="llama_gqa", adapter=None, pref=dict(beta=0.1)),
    dict(id="lora-sigmoid-accum2", model="llama_gqa", adapter="no_k", pref=dict(beta=0.1),
         grad_accum=2, P=4),
    # QLoRA: the reference is TRL on a model holding the harness's dequantized weights
    # (test_qlora.py's reference), with the starting adapter and with the base
    dict(id="qlora-sigmoid", model="llama_gqa", adapter="no_k", pref=dict(beta=0.1),
         quant=dict(type="nf4", blocksize=64, double_quant=True)),
    dict(id="qlora-sigmoid-base-ref", model="llama_gqa", adapter="no_k", adapter_seed=3,
         pref=dict(beta=0.5), ref="base", quant=dict(type="nf4", blocksize=64,
                                                    double_quant=True)),
]


def _build(store, run, tmp, trl_model_dir=None):
    """The run (batch, harness spec) and TRL's trainer (on trl_model_dir when given: the
    dequantized weights of a QLoRA run)."""
    r = Run(store, run, trl_model_dir)
    pref = dict(run["pref"])
    if run.get("ref") == "base":
        pref["ref"] = "base"
    r.spec["pref"] = pref
    return r, dpo_trainer(r.model, run.get("ref") == "base", run["pref"], tmp)


class Case:
    pass


@pytest.fixture(scope="module", params=RUNS, ids=[r["id"] for r in RUNS])
def case(request, store, ft, tmp_path_factory):
    run = request.param
    c = Case()
    deq_dir = None
    if run.get("quant"):
        deq_dir = dequantized_dir(store, run, ft, tmp_path_factory.mktemp("dequant"))
    r, tr = _build(store, run, tmp_path_factory.mktemp("trl"), deq_dir)
    c.loss, c.metrics = trl_step(tr, r)
    tr.model.zero_grad(set_to_none=True)
    c.loss.backward()
    c.grads = {n: p.grad.detach().clone() for n, p in trainable_params(tr, r.key)}
    c.out = ft(r.spec, f"dpo-{run['id']}")
    return c


def test_dpo_loss_and_metrics(case):
    ftref.assert_close("DPO loss", case.out["pref.loss"], case.loss.detach(), ftref.TOL_LOSSES)
    for i, k in enumerate(METRICS):
        ftref.assert_close(k, case.out["pref.metrics"][i], case.metrics[i], ftref.TOL_LOSSES)


def test_dpo_grads(case):
    assert case.grads
    ftref.assert_tensor_dict_close("grad.", case.out, case.grads, ftref.TOL_GRAD)


@pytest.mark.parametrize("run", [RUNS[0], RUNS[2], RUNS[4]], ids=lambda r: r["id"])
def test_dpo_five_steps(run, store, ft, tmp_path_factory):
    """Five AdamW steps on TRL's loss."""
    r, tr = _build(store, run, tmp_path_factory.mktemp("trl5"))
    train = dict(TRAIN, lr=1e-2 if run["adapter"] else 1e-3)
    named = trainable_params(tr, r.key)
    losses = five_steps(named, lambda: trl_step(tr, r)[0], train)
    assert_five_steps(ft(dict(r.spec, train=train), f"dpo5-{run['id']}"), losses, named)
