"""A MoE router's load-balancing loss on a right-padded batch (issue 22), shared by
test_moe.py (mixtral) and test_qwen3_moe.py: rows of uneven lengths padded on the right,
their attention_mask 0 on the padding, against transformers called with that mask
(MixtralForCausalLM / Qwen3MoeForCausalLM pass it to load_balancing_loss_func, which
leaves the padded rows out of tokens_per_expert and router_prob_per_expert). The padding's
logits differ (transformers masks the padding's own attention too; ours never reaches a
real token: attention is causal), so the logits are compared on the real tokens only.
Also ft-eval's and ft-train's evaluation of a MoE model against transformers' (the
Trainer's eval_loss: each batch's aux term with that batch's mask)."""

import math

import torch

import ftref

# rows of T, T - 4 and T - 7 real tokens (one full row, two padded)
PAD_SHORT = (0, 4, 7)


def padded_batch(vocab, T, seed, pad_id=0):
    """input_ids, labels and attention_mask [3, T]: make_batch's rows cut short on the
    right, the padding pad_id with label -100 and mask 0."""
    ids, labels = ftref.make_batch(vocab, len(PAD_SHORT), T, seed)
    mask = torch.ones_like(ids)
    for r, short in enumerate(PAD_SHORT):
        if short:
            ids[r, T - short:] = pad_id
            labels[r, T - short:] = -100
            mask[r, T - short:] = 0
    return ids, labels, mask


def check_padded_aux(model_dir, T, seed, ft, ckpt_grads, tag, **spec):
    """Loss, real tokens' logits and every full-mode gradient against transformers given
    the attention_mask; and a guard that the mask matters: the unmasked reference loss is
    far outside the tolerance (what ftkit computed before it took the mask). spec: more
    of the harness's keys (device="cuda" for the GPU path, in fp32: the same tolerances)."""
    model = ftref.full_mode_model(model_dir)
    cfg = model.config
    assert cfg.output_router_logits
    ids, labels, mask = padded_batch(cfg.vocab_size, T, seed)
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=labels, attention_mask=mask)
    out.loss.backward()
    ref_grads = ckpt_grads({n: p.grad.detach().clone() for n, p in ftref.trainable(model)},
                           cfg)
    model.zero_grad(set_to_none=True)
    with torch.no_grad():
        unmasked = model(input_ids=ids, labels=labels).loss
    assert ftref.rel_err(unmasked, out.loss.detach()) > 100 * ftref.TOL_LOGITS, \
        "the padding does not move the load-balancing loss: the test would not fail"

    got = ft(dict(model_dir=model_dir, mode="full", input_ids=ids, labels=labels,
                  attention_mask=mask, **spec), f"{tag}-padded")
    ftref.assert_close(f"[{tag} padded] loss", got["loss"], out.loss.detach(),
                       ftref.TOL_LOGITS)
    real = mask.bool()
    ftref.assert_close(f"[{tag} padded] real tokens' logits", got["logits"][real],
                       out.logits.detach()[real], ftref.TOL_LOGITS)
    ftref.assert_tensor_dict_close("grad.", got, ref_grads, ftref.TOL_GRAD)
    return got


def check_mask_refused(model_dir, T, ft_raw, tag):
    """A mask that is not right padding (a real token after a 0), or not 0 / 1, is refused
    with a message naming the entry."""
    ids, labels, mask = padded_batch(64, T, 0)
    left = mask.flip(1)
    r, _ = ft_raw(dict(model_dir=model_dir, mode="eval", input_ids=ids, labels=labels,
                       attention_mask=left), f"{tag}-left-padded")
    assert r.returncode != 0 and "attention_mask[1][4] = 1 follows a 0" in r.stderr, r.stderr
    bad = mask.clone()
    bad[0, 2] = 2
    r, _ = ft_raw(dict(model_dir=model_dir, mode="eval", input_ids=ids, labels=labels,
                       attention_mask=bad), f"{tag}-mask-2")
    assert r.returncode != 0 and "attention_mask[0][2] = 2 is neither 0 nor 1" in r.stderr, \
        r.stderr


def _hf_batch_loss(model, rows):
    """transformers' loss and aux_loss of rows (ids, labels) as one right-padded batch,
    given its attention_mask."""
    T = max(len(ids) for ids, _ in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    labels = torch.full((len(rows), T), -100, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for r, (i, lab) in enumerate(rows):
        ids[r, :len(i)] = torch.tensor(i)
        labels[r, :len(i)] = torch.tensor(lab)
        mask[r, :len(i)] = 1
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels, attention_mask=mask)
    return float(out.loss), float(out.aux_loss)


def check_ft_eval_aux(model_dir, tmp_path, tag):
    """ft-eval on token rows of uneven lengths: loss_with_aux is transformers'
    model(...).loss when the rows are one batch, aux_loss its aux_loss (with --batch-size 2
    each batch's, averaged as the HF Trainer averages its eval losses: weighted by the
    batch's rows; the last batch holds one), loss the cross-entropy alone (the same
    whatever the batching)."""
    import json
    import random

    model = ftref.load_hf(model_dir)
    cfg = model.config
    rnd = random.Random(11)
    rows = []
    for T in (9, 5, 12, 7, 10):
        ids = [rnd.randrange(1, cfg.vocab_size) for _ in range(T)]
        rows.append((ids, [-100] * 2 + ids[2:]))
    data = tmp_path / f"{tag}-eval.jsonl"
    data.write_text("".join(json.dumps({"input_ids": i, "labels": lab}) + "\n"
                            for i, lab in rows))
    exe = ftref.tool_exe("FT_EVAL", "ft-eval")
    got = {}
    for bs in (8, 2):
        cp = ftref.run_tool([exe, "--model", model_dir, "--data", data, "--format", "tokens",
                             "--batch-size", bs, "--device", "cpu", "--json"])
        got[bs] = json.loads(cp.stdout)
    loss, aux = _hf_batch_loss(model, rows)
    coef = cfg.router_aux_loss_coef
    one = got[8]
    ftref.assert_close(f"[{tag}] ft-eval loss_with_aux", one["loss_with_aux"], loss,
                       ftref.TOL_LOGITS)
    ftref.assert_close(f"[{tag}] ft-eval aux_loss", one["aux_loss"], aux, ftref.TOL_LOGITS)
    ftref.assert_close(f"[{tag}] ft-eval loss", one["loss"], loss - coef * aux,
                       ftref.TOL_LOGITS)
    assert coef * aux > 100 * ftref.TOL_LOGITS * loss  # the term shows at the tolerance
    # three batches (2, 2, 1 rows): each one's aux_loss, weighted by its rows; the
    # cross-entropy unchanged
    auxes = [_hf_batch_loss(model, rows[i:i + 2])[1] for i in range(0, len(rows), 2)]
    two = got[2]
    ftref.assert_close(f"[{tag}] ft-eval aux_loss, batches of 2", two["aux_loss"],
                       (2 * auxes[0] + 2 * auxes[1] + auxes[2]) / 5, ftref.TOL_LOGITS)
    plain = sum(auxes) / len(auxes)  # (the batches' plain mean: far off, so this can fail)
    assert ftref.rel_err(torch.tensor(plain), torch.tensor(two["aux_loss"])) > \
        100 * ftref.TOL_LOGITS
    ftref.assert_close(f"[{tag}] ft-eval loss, batches of 2", two["loss"], one["loss"],
                       ftref.TOL_LOGITS)
    ftref.assert_close(f"[{tag}] ft-eval loss_with_aux, batches of 2", two["loss_with_aux"],
                       two["loss"] + coef * two["aux_loss"], 1e-12)
    return got


# --- ft-train's evaluation against the HF Trainer's ------------------------------------

EVAL_COUNTED = 6  # counted tokens of each eval row (see eval_rows)


def eval_rows(rnd, vocab, n=10):
    """n token rows (ids, labels) of 8 to 13 ids in [1, vocab), of uneven lengths (so that
    the eval batches hold padding the load-balancing loss must leave out) but each with
    EVAL_COUNTED counted tokens: the first len - EVAL_COUNTED labels -100. With every
    sample counting as many tokens, the HF Trainer's eval_loss (the samples' mean of each
    batch's token mean) and ftkit's cross-entropy (the token mean of the set) are the same
    number, so the two evaluations compare exactly whatever the batching."""
    rows = []
    for _ in range(n):
        T = rnd.randint(EVAL_COUNTED + 2, EVAL_COUNTED + 7)
        ids = [rnd.randrange(1, vocab) for _ in range(T)]
        rows.append((ids, [-100] * (T - EVAL_COUNTED) + ids[T - EVAL_COUNTED:]))
    return rows


def write_rows(path, rows):
    import json

    path.write_text("".join(json.dumps({"input_ids": i, "labels": lab}) + "\n"
                            for i, lab in rows))


def _collate(batch):
    """Rows {input_ids, labels} right-padded into one batch (attention_mask 0, labels
    -100 and id 0 on the padding), as ft-train pads them."""
    T = max(len(r["input_ids"]) for r in batch)
    out = {"input_ids": torch.zeros(len(batch), T, dtype=torch.long),
           "labels": torch.full((len(batch), T), -100, dtype=torch.long),
           "attention_mask": torch.zeros(len(batch), T, dtype=torch.long)}
    for k, r in enumerate(batch):
        n = len(r["input_ids"])
        out["input_ids"][k, :n] = torch.tensor(r["input_ids"])
        out["labels"][k, :n] = torch.tensor(r["labels"])
        out["attention_mask"][k, :n] = 1
    return out


def trainer_eval(model, rows, batch_size, tmp):
    """transformers' Trainer.evaluate() over rows in order, per_device_eval_batch_size
    batch_size, each batch right-padded (attention_mask 0, labels -100 on the padding):
    its eval_loss, and the same aggregation (each batch's value repeated by its size, the
    mean) of each batch's aux_loss."""
    from transformers import Trainer, TrainingArguments

    data = [{"input_ids": i, "labels": lab} for i, lab in rows]
    args = TrainingArguments(output_dir=str(tmp), per_device_eval_batch_size=batch_size,
                             report_to=[], use_cpu=True, remove_unused_columns=False)
    got = Trainer(model=model, args=args, data_collator=_collate,
                  eval_dataset=data).evaluate()
    auxes = []
    model.eval()
    with torch.no_grad():
        for s in range(0, len(data), batch_size):
            b = _collate(data[s:s + batch_size])
            auxes += [float(model(**b).aux_loss)] * len(data[s:s + batch_size])
    return got["eval_loss"], sum(auxes) / len(auxes)


def trainer_train_losses(model, rows, batch_size, accum, steps, tmp):
    """The loss the HF Trainer logs at each of steps optimizer steps (logging_steps 1) at
    learning rate 0 (the weights stay, as ft-train's at 0), the rows taken in order
    (ft-train's data.shuffle false): per micro-batch the model's loss given
    num_items_in_batch (the step's counted tokens) plus router_aux_loss_coef x that
    micro-batch's aux_loss, summed over the step's micro-batches."""
    from torch.utils.data import SequentialSampler
    from transformers import Trainer, TrainingArguments

    class InOrder(Trainer):
        def _get_train_sampler(self, train_dataset=None):
            return SequentialSampler(train_dataset or self.train_dataset)

    data = [{"input_ids": i, "labels": lab} for i, lab in rows]
    args = TrainingArguments(output_dir=str(tmp), per_device_train_batch_size=batch_size,
                             gradient_accumulation_steps=accum, max_steps=steps,
                             learning_rate=0.0, logging_steps=1, report_to=[], use_cpu=True,
                             remove_unused_columns=False, save_strategy="no",
                             dataloader_drop_last=False, seed=0)
    t = InOrder(model=model, args=args, data_collator=_collate, train_dataset=data)
    t.train()
    return {h["step"]: h["loss"] for h in t.state.log_history if "loss" in h}


def tb_scalars(run_dir, tag):
    """{step: value} of a scalar in the run dir's TensorBoard events, by TensorBoard's own
    reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {e.step: e.value for e in acc.Scalars(tag)}


def check_run_eval(run, model_dir, mode, rows, batch_size, step, tmp):
    """ft-train's evaluation at step (the run's last, so the final weights are the
    evaluated ones) = the HF Trainer's on those weights: eval/loss its eval_loss (the
    load-balancing term of each eval batch of batch_size rows included), eval/aux_loss
    the per-batch aux_loss averaged as it averages, eval/perplexity exp of the
    cross-entropy; a guard that the term shows at the tolerance."""
    from peft import PeftModel

    model = ftref.load_hf(run / "final" if mode == "full" else model_dir)
    if mode != "full":
        model = PeftModel.from_pretrained(model, str(run / "final"))
    want, aux = trainer_eval(model, rows, batch_size, tmp)
    coef = model.config.router_aux_loss_coef
    got = tb_scalars(run, "eval/loss")
    assert step in got, got
    ftref.assert_close(f"[{run.name}] eval/loss", got[step], want, ftref.TOL_LOGITS)
    ftref.assert_close(f"[{run.name}] eval/aux_loss", tb_scalars(run, "eval/aux_loss")[step],
                       aux, ftref.TOL_LOGITS)
    ppl = tb_scalars(run, "eval/perplexity")[step]
    ftref.assert_close(f"[{run.name}] eval/perplexity", ppl, math.exp(want - coef * aux),
                       ftref.TOL_LOGITS)
    assert coef * aux > 100 * ftref.TOL_LOGITS * want, (coef, aux, want)
