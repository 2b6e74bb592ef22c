"""What test_dpo.py and test_orpo.py share: the batch of preference pairs, the tokenizer
TRL's trainers are built with, the model and harness spec of a run (LoRA, QLoRA or full),
and the five-AdamW-steps reference loop on a trainer's loss."""

import torch

import ftref

# Five steps, as test_train.py's reference loop (lr 1e-3 for full fine-tuning)
TRAIN = dict(steps=5, lr=1e-2, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01,
             warmup_steps=2, scheduler="cosine", max_grad_norm=1.0)


def pref_batch(vocab, T, seed, P):
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


def trainer_inputs(vocab):
    """The tokenizer (one word t<i> per id) and the one-pair dataset a TRL trainer is built
    with; the tests feed their own batches, so neither is used for the data."""
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="t1", pad_token="t0")
    ds = Dataset.from_list([{"prompt": "t5", "chosen": "t6", "rejected": "t7"}])
    return tok, ds


def trainable_params(tr, key):
    return [(key(n), p) for n, p in tr.model.named_parameters() if p.requires_grad]


class Run:
    """A run's batch, the torch model TRL trains and the harness spec of the same run."""

    def __init__(self, store, run, trl_model_dir=None):
        """trl_model_dir: the model TRL loads instead of the run's (the dequantized weights
        of a QLoRA run, see dequantized_dir)."""
        self.P = run.get("P", 3)
        shape = ftref.SHAPES[run["model"]]
        model_dir = store.model(run["model"])
        vocab = ftref.make_config(shape).vocab_size
        self.ids, self.am, self.cm, self.labels = pref_batch(vocab, shape.T, shape.seed, self.P)
        if run["adapter"]:
            adapter_dir = store.adapter(run["model"], run["adapter"],
                                        seed=run.get("adapter_seed", 4))
            self.model = ftref.lora_mode_model(trl_model_dir or model_dir, adapter_dir)
            self.spec = dict(model_dir=model_dir, adapter_dir=adapter_dir, mode="lora")
            if run.get("quant"):
                self.spec["quant"] = run["quant"]
            self.key = ftref.peft_key
        else:
            self.model = ftref.full_mode_model(model_dir)
            self.spec = dict(model_dir=model_dir, mode="full")
            self.key = lambda n: n  # noqa: E731
        self.spec.update(input_ids=self.ids, labels=self.labels,
                         grad_accum=run.get("grad_accum", 1))


def dequantized_dir(store, run, ft, tmp):
    """The model with the weights the harness dequantizes from its quantized base."""
    shape = ftref.SHAPES[run["model"]]
    model_dir = store.model(run["model"])
    m = ftref.load_hf(model_dir)
    ids, labels = ftref.make_batch(m.config.vocab_size, 1, shape.T, shape.seed)
    out = ft(dict(model_dir=model_dir, mode="eval", input_ids=ids, labels=labels,
                  quant=run["quant"]), f"pref-dequant-{run['id']}")
    deq = {k[len("dequant."):]: v for k, v in out.items() if k.startswith("dequant.")}
    assert deq
    sd = m.state_dict()
    for k, v in deq.items():
        sd[k] = v.to(sd[k].dtype)
    m.load_state_dict(sd)
    m.save_pretrained(tmp / "model", safe_serialization=True)
    return tmp / "model"


def five_steps(named, loss_fn, train):
    """torch.optim.AdamW with the cosine schedule and gradient clipping on loss_fn() (a
    graph over the parameters of named); the losses of the five steps."""
    from transformers import get_cosine_schedule_with_warmup

    params = [p for _, p in named]
    opt = torch.optim.AdamW(params, lr=train["lr"], betas=tuple(train["betas"]),
                            eps=train["eps"], weight_decay=train["weight_decay"])
    sched = get_cosine_schedule_with_warmup(opt, train["warmup_steps"], train["steps"])
    losses = []
    for _ in range(train["steps"]):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn()
        losses.append(loss.item())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, train["max_grad_norm"])
        opt.step()
        sched.step()
    return losses


def assert_five_steps(out, losses, named):
    """The harness's losses and weights after its five steps against five_steps'."""
    ftref.assert_close("losses", out["losses"], torch.tensor(losses, dtype=torch.float64),
                       ftref.TOL_LOSSES)
    ftref.assert_tensor_dict_close("weight.", out, {n: p.detach().clone() for n, p in named},
                                   ftref.TOL_WEIGHT)
