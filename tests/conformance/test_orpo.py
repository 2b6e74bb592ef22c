"""ORPO against TRL 1.16's experimental ORPOTrainer, on the tiny random models of ftref: the
C harness's ORPO objective (train/pref.h FT_PREF_ORPO) on a batch of pairs vs TRL's own
get_batch_loss_metrics on the same batch (its concatenated chosen/rejected inputs):

- the loss and the metrics TRL logs (rewards/chosen, rewards/rejected,
  rewards/accuracies, rewards/margins, logps/chosen, logps/rejected, nll_loss,
  log_odds_ratio, log_odds_chosen): 1e-5 relative;
- the gradient of every trainable parameter (LoRA, full): 1e-4;
- five AdamW steps on TRL's loss: every trainable weight 1e-5;
LoRA, QLoRA (NF4 base quantized on load; TRL on a model holding the dequantized weights,
as test_dpo.py and test_qlora.py compare) and full fine-tuning, and the pairs split into
two micro-batches (TRL: the loss of each micro-batch divided by the accumulation steps)."""

import pytest
import torch

import ftref
from pref_ref import TRAIN, Run, assert_five_steps, dequantized_dir, five_steps, \
    trainable_params, trainer_inputs

METRICS = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
           "logps/chosen", "logps/rejected", "nll_loss", "log_odds_ratio", "log_odds_chosen"]


def orpo_trainer(model, beta, tmp):
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    tok, ds = trainer_inputs(model.config.vocab_size)
    args = ORPOConfig(output_dir=str(tmp), report_to=[], use_cpu=True, bf16=False,
                      gradient_checkpointing=False, beta=beta)
    return ORPOTrainer(model=model, args=args, processing_class=tok, train_dataset=ds)


def trl_batch(ids, am, cm, P):
    labels = ids.masked_fill(cm == 0, -100)
    return {"chosen_input_ids": ids[:P], "chosen_attention_mask": am[:P],
            "chosen_labels": labels[:P], "rejected_input_ids": ids[P:],
            "rejected_attention_mask": am[P:], "rejected_labels": labels[P:]}


def trl_loss(tr, batches):
    """TRL's loss over micro-batches (each divided by their number, as the HF Trainer does
    with gradient accumulation) and the metrics of each, averaged as TRL logs them."""
    total, mets = 0.0, []
    for b in batches:
        loss, m = tr.get_batch_loss_metrics(tr.model, b, "train")
        total = total + loss / len(batches)
        mets.append([float(m[k]) for k in METRICS])
    return total, torch.tensor(mets, dtype=torch.float64).mean(0)


RUNS = [
    dict(id="lora", model="llama_gqa", adapter="no_k", beta=0.1),
    dict(id="lora-beta", model="qwen2", adapter="qv", beta=0.5),
    dict(id="full", model="llama_gqa", adapter=None, beta=0.1),
    dict(id="lora-accum2", model="llama_gqa", adapter="no_k", beta=0.2, grad_accum=2, P=4),
    dict(id="qlora", model="llama_gqa", adapter="no_k", beta=0.1,
         quant=dict(type="nf4", blocksize=64, double_quant=True)),
    dict(id="qlora-accum2", model="qwen2", adapter="qv", beta=0.3, grad_accum=2, P=4,
         quant=dict(type="nf4", blocksize=64, double_quant=False)),
]


def _build(store, run, tmp, trl_model_dir=None):
    """The run (batch, harness spec), TRL's trainer (on trl_model_dir when given: the
    dequantized weights of a QLoRA run) and the pairs split into TRL's micro-batches."""
    r = Run(store, run, trl_model_dir)
    r.spec["pref"] = dict(beta=run["beta"], loss_type="orpo")
    tr = orpo_trainer(r.model, run["beta"], tmp)
    P, k = r.P, run.get("grad_accum", 1)
    pm = P // k  # micro-batch i: pairs [i pm, (i+1) pm)

    def rows(t, i):
        return torch.cat([t[i * pm:(i + 1) * pm], t[P + i * pm:P + (i + 1) * pm]])

    batches = [trl_batch(rows(r.ids, i), rows(r.am, i), rows(r.cm, i), pm) for i in range(k)]
    return r, tr, batches


class Case:
    pass


@pytest.fixture(scope="module", params=RUNS, ids=[r["id"] for r in RUNS])
def case(request, store, ft, tmp_path_factory):
    run = request.param
    c = Case()
    deq_dir = None
    if run.get("quant"):
        deq_dir = dequantized_dir(store, run, ft, tmp_path_factory.mktemp("dequant"))
    r, tr, batches = _build(store, run, tmp_path_factory.mktemp("orpo"), deq_dir)
    c.loss, c.metrics = trl_loss(tr, batches)
    tr.model.zero_grad(set_to_none=True)
    c.loss.backward()
    c.grads = {n: p.grad.detach().clone() for n, p in trainable_params(tr, r.key)}
    c.out = ft(r.spec, f"orpo-{run['id']}")
    return c


def test_orpo_loss_and_metrics(case):
    ftref.assert_close("ORPO loss", case.out["pref.loss"], case.loss.detach(), ftref.TOL_LOSSES)
    for i, k in enumerate(METRICS):
        ftref.assert_close(k, case.out["pref.metrics"][i], case.metrics[i], ftref.TOL_LOSSES)


def test_orpo_grads(case):
    assert case.grads
    ftref.assert_tensor_dict_close("grad.", case.out, case.grads, ftref.TOL_GRAD)


@pytest.mark.parametrize("run", [RUNS[0], RUNS[2], RUNS[4]], ids=lambda r: r["id"])
def test_orpo_five_steps(run, store, ft, tmp_path_factory):
    deq_dir = None
    if run.get("quant"):
        deq_dir = dequantized_dir(store, run, ft, tmp_path_factory.mktemp("dequant5"))
    r, tr, batches = _build(store, run, tmp_path_factory.mktemp("orpo5"), deq_dir)
    train = dict(TRAIN, lr=1e-2 if run["adapter"] else 1e-3)
    named = trainable_params(tr, r.key)
    losses = five_steps(named, lambda: trl_loss(tr, batches)[0], train)
    assert_five_steps(ft(dict(r.spec, train=train), f"orpo5-{run['id']}"), losses, named)
