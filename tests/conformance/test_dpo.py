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

P = 3  # pairs; the batch has 2P rows


def pref_batch(vocab, T, seed):
    """input_ids [2P, T] (chosen rows, then rejected), TRL's attention_mask and
    completion_mask, and the labels (ids on the completion, -100 elsewhere). Each pair
    shares its prompt; rows are right-padded (as DataCollatorForPreference pads)."""
    g = torch.Generator().manual_seed(700 + seed)
    ids = torch.zeros(2 * P, T, dtype=torch.long)
    am = torch.zeros(2 * P, T, dtype=torch.long)
    cm = torch.zeros(2 * P, T, dtype=torch.long)
    for i in range(P):
        plen = 2 + int(torch.randint(0, 4, (1,), generator=g))
        prompt = torch.randint(0, vocab, (plen,), generator=g)
        for r in (i, P + i):
            clen = 1 + int(torch.randint(0, T - plen, (1,), generator=g))
            if r == 0:
                clen = T - plen  # one row fills the batch: the padding is real
            comp = torch.randint(0, vocab, (clen,), generator=g)
            n = plen + clen
            ids[r, :plen] = prompt
            ids[r, plen:n] = comp
            am[r, :n] = 1
            cm[r, plen:n] = 1
    labels = ids.masked_fill(cm == 0, -100)
    return ids, am, cm, labels


def dpo_trainer(model, ref_base, pref, tmp):
    """TRL's DPOTrainer around model (not trained: its compute_loss is the reference).
    ref_base: for a PEFT model, drop the "ref" adapter TRL copies from the starting one, so
    that the reference is the base with adapters disabled (TRL's fresh-adapter case)."""
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from trl import DPOConfig, DPOTrainer

    vocab = model.config.vocab_size
    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="t1", pad_token="t0")
    ds = Dataset.from_list([{"prompt": "t5", "chosen": "t6", "rejected": "t7"}])
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


def trl_step(tr, ids, am, cm):
    """TRL's loss (a graph) and its logged metrics for the batch."""
    for v in tr._metrics.values():
        v.clear()
    loss = tr.compute_loss(tr.model, dict(input_ids=ids, attention_mask=am, completion_mask=cm))
    mode = "train" if tr.model.training else "eval"
    return loss, torch.tensor([tr._metrics[mode][k][-1] for k in METRICS], dtype=torch.float64)


def trainable_params(tr, key):
    return [(key(n), p) for n, p in tr.model.named_parameters() if p.requires_grad]


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


class Case:
    pass


def _build(store, run, tmp, trl_model_dir=None):
    """The batch, the harness spec and TRL's trainer (on trl_model_dir when given: the
    dequantized weights of a QLoRA run)."""
    global P
    P = run.get("P", 3)
    shape = ftref.SHAPES[run["model"]]
    model_dir = store.model(run["model"])
    ref_dir = trl_model_dir or model_dir
    vocab = ftref.make_config(shape).vocab_size
    ids, am, cm, labels = pref_batch(vocab, shape.T, shape.seed)
    if run["adapter"]:
        adapter_dir = store.adapter(run["model"], run["adapter"], seed=run.get("adapter_seed", 4))
        m = ftref.lora_mode_model(ref_dir, adapter_dir)
        spec = dict(model_dir=model_dir, adapter_dir=adapter_dir, mode="lora")
        if run.get("quant"):
            spec["quant"] = run["quant"]
        key = ftref.peft_key
    else:
        m = ftref.full_mode_model(model_dir)
        spec = dict(model_dir=model_dir, mode="full")
        key = lambda n: n  # noqa: E731
    pref = dict(run["pref"])
    if run.get("ref") == "base":
        pref["ref"] = "base"
    spec.update(input_ids=ids, labels=labels, pref=pref, grad_accum=run.get("grad_accum", 1))
    tr = dpo_trainer(m, run.get("ref") == "base", run["pref"], tmp)
    return ids, am, cm, spec, tr, key


def dequantized_dir(store, run, ft, tmp):
    """The model with the weights the harness dequantizes from its quantized base."""
    shape = ftref.SHAPES[run["model"]]
    model_dir = store.model(run["model"])
    m = ftref.load_hf(model_dir)
    ids, labels = ftref.make_batch(m.config.vocab_size, 1, shape.T, shape.seed)
    out = ft(dict(model_dir=model_dir, mode="eval", input_ids=ids, labels=labels,
                  quant=run["quant"]), f"dpo-dequant-{run['id']}")
    deq = {k[len("dequant."):]: v for k, v in out.items() if k.startswith("dequant.")}
    assert deq
    sd = m.state_dict()
    for k, v in deq.items():
        sd[k] = v.to(sd[k].dtype)
    m.load_state_dict(sd)
    m.save_pretrained(tmp / "model", safe_serialization=True)
    return tmp / "model"


@pytest.fixture(scope="module", params=RUNS, ids=[r["id"] for r in RUNS])
def case(request, store, ft, tmp_path_factory):
    run = request.param
    c = Case()
    deq_dir = None
    if run.get("quant"):
        deq_dir = dequantized_dir(store, run, ft, tmp_path_factory.mktemp("dequant"))
    ids, am, cm, spec, tr, key = _build(store, run, tmp_path_factory.mktemp("trl"), deq_dir)
    c.loss, c.metrics = trl_step(tr, ids, am, cm)
    tr.model.zero_grad(set_to_none=True)
    c.loss.backward()
    c.grads = {n: p.grad.detach().clone() for n, p in trainable_params(tr, key)}
    c.out = ft(spec, f"dpo-{run['id']}")
    return c


def test_dpo_loss_and_metrics(case):
    ftref.assert_close("DPO loss", case.out["pref.loss"], case.loss.detach(), ftref.TOL_LOSSES)
    for i, k in enumerate(METRICS):
        ftref.assert_close(k, case.out["pref.metrics"][i], case.metrics[i], ftref.TOL_LOSSES)


def test_dpo_grads(case):
    assert case.grads
    ftref.assert_tensor_dict_close("grad.", case.out, case.grads, ftref.TOL_GRAD)


TRAIN = dict(steps=5, lr=1e-2, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01,
             warmup_steps=2, scheduler="cosine", max_grad_norm=1.0)


@pytest.mark.parametrize("run", [RUNS[0], RUNS[2], RUNS[4]], ids=lambda r: r["id"])
def test_dpo_five_steps(run, store, ft, tmp_path_factory):
    """Five AdamW steps on TRL's loss (lr 1e-3 for full fine-tuning, as test_train.py)."""
    from transformers import get_cosine_schedule_with_warmup

    ids, am, cm, spec, tr, key = _build(store, run, tmp_path_factory.mktemp("trl5"))
    train = dict(TRAIN, lr=1e-2 if run["adapter"] else 1e-3)
    named = trainable_params(tr, key)
    params = [p for _, p in named]
    opt = torch.optim.AdamW(params, lr=train["lr"], betas=tuple(train["betas"]),
                            eps=train["eps"], weight_decay=train["weight_decay"])
    sched = get_cosine_schedule_with_warmup(opt, train["warmup_steps"], train["steps"])
    losses = []
    for _ in range(train["steps"]):
        opt.zero_grad(set_to_none=True)
        loss, _ = trl_step(tr, ids, am, cm)
        losses.append(loss.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, train["max_grad_norm"])
        opt.step()
        sched.step()
    out = ft(dict(spec, train=train), f"dpo5-{run['id']}")
    ftref.assert_close("losses", out["losses"], torch.tensor(losses, dtype=torch.float64),
                       ftref.TOL_LOSSES)
    ref = {n: p.detach().clone() for n, p in named}
    ftref.assert_tensor_dict_close("weight.", out, ref, ftref.TOL_WEIGHT)
