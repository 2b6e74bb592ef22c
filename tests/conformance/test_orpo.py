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
from test_dpo import dequantized_dir, pref_batch

METRICS = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
           "logps/chosen", "logps/rejected", "nll_loss", "log_odds_ratio", "log_odds_chosen"]


def orpo_trainer(model, beta, tmp):
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    vocab = model.config.vocab_size
    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="t1", pad_token="t0")
    ds = Dataset.from_list([{"prompt": "t5", "chosen": "t6", "rejected": "t7"}])
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
    """The batch, the harness spec and TRL's trainer (on trl_model_dir when given: the
    dequantized weights of a QLoRA run)."""
    P = run.get("P", 3)
    import test_dpo
    test_dpo.P = P
    shape = ftref.SHAPES[run["model"]]
    model_dir = store.model(run["model"])
    vocab = ftref.make_config(shape).vocab_size
    ids, am, cm, labels = pref_batch(vocab, shape.T, shape.seed)
    if run["adapter"]:
        adapter_dir = store.adapter(run["model"], run["adapter"], seed=4)
        m = ftref.lora_mode_model(trl_model_dir or model_dir, adapter_dir)
        spec = dict(model_dir=model_dir, adapter_dir=adapter_dir, mode="lora")
        if run.get("quant"):
            spec["quant"] = run["quant"]
        key = ftref.peft_key
    else:
        m = ftref.full_mode_model(model_dir)
        spec = dict(model_dir=model_dir, mode="full")
        key = lambda n: n  # noqa: E731
    k = run.get("grad_accum", 1)
    spec.update(input_ids=ids, labels=labels, grad_accum=k,
                pref=dict(beta=run["beta"], loss_type="orpo"))
    tr = orpo_trainer(m, run["beta"], tmp)
    pm = P // k  # micro-batch i: pairs [i pm, (i+1) pm)
    batches = [trl_batch(torch.cat([ids[i * pm:(i + 1) * pm], ids[P + i * pm:P + (i + 1) * pm]]),
                         torch.cat([am[i * pm:(i + 1) * pm], am[P + i * pm:P + (i + 1) * pm]]),
                         torch.cat([cm[i * pm:(i + 1) * pm], cm[P + i * pm:P + (i + 1) * pm]]),
                         pm) for i in range(k)]
    return spec, tr, batches, key


def trainable_params(tr, key):
    return [(key(n), p) for n, p in tr.model.named_parameters() if p.requires_grad]


class Case:
    pass


@pytest.fixture(scope="module", params=RUNS, ids=[r["id"] for r in RUNS])
def case(request, store, ft, tmp_path_factory):
    run = request.param
    c = Case()
    deq_dir = None
    if run.get("quant"):
        deq_dir = dequantized_dir(store, run, ft, tmp_path_factory.mktemp("dequant"))
    spec, tr, batches, key = _build(store, run, tmp_path_factory.mktemp("orpo"), deq_dir)
    c.loss, c.metrics = trl_loss(tr, batches)
    tr.model.zero_grad(set_to_none=True)
    c.loss.backward()
    c.grads = {n: p.grad.detach().clone() for n, p in trainable_params(tr, key)}
    c.out = ft(spec, f"orpo-{run['id']}")
    return c


def test_orpo_loss_and_metrics(case):
    ftref.assert_close("ORPO loss", case.out["pref.loss"], case.loss.detach(), ftref.TOL_LOSSES)
    for i, k in enumerate(METRICS):
        ftref.assert_close(k, case.out["pref.metrics"][i], case.metrics[i], ftref.TOL_LOSSES)


def test_orpo_grads(case):
    assert case.grads
    ftref.assert_tensor_dict_close("grad.", case.out, case.grads, ftref.TOL_GRAD)


TRAIN = dict(steps=5, lr=1e-2, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01,
             warmup_steps=2, scheduler="cosine", max_grad_norm=1.0)


@pytest.mark.parametrize("run", [RUNS[0], RUNS[2], RUNS[4]], ids=lambda r: r["id"])
def test_orpo_five_steps(run, store, ft, tmp_path_factory):
    from transformers import get_cosine_schedule_with_warmup

    deq_dir = None
    if run.get("quant"):
        deq_dir = dequantized_dir(store, run, ft, tmp_path_factory.mktemp("dequant5"))
    spec, tr, batches, key = _build(store, run, tmp_path_factory.mktemp("orpo5"), deq_dir)
    train = dict(TRAIN, lr=1e-2 if run["adapter"] else 1e-3)
    named = trainable_params(tr, key)
    params = [p for _, p in named]
    opt = torch.optim.AdamW(params, lr=train["lr"], betas=tuple(train["betas"]),
                            eps=train["eps"], weight_decay=train["weight_decay"])
    sched = get_cosine_schedule_with_warmup(opt, train["warmup_steps"], train["steps"])
    losses = []
    for _ in range(train["steps"]):
        opt.zero_grad(set_to_none=True)
        loss, _ = trl_loss(tr, batches)
        losses.append(loss.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, train["max_grad_norm"])
        opt.step()
        sched.step()
    out = ft(dict(spec, train=train), f"orpo5-{run['id']}")
    ftref.assert_close("losses", out["losses"], torch.tensor(losses, dtype=torch.float64),
                       ftref.TOL_LOSSES)
    ftref.assert_tensor_dict_close("weight.", out, {n: p.detach().clone() for n, p in named},
                                   ftref.TOL_WEIGHT)
