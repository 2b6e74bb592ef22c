"""ft-train end to end, one process, on the tiny random Llama of rankrun.py (vocab 64,
hidden 32, 2 layers) and pre-tokenized records: training details that a C unit test
checks inside the library, checked here through the tool, against transformers + PEFT.

- packing: --dump-data's packed rows equal transformers' DataCollatorWithFlattening of
  each row's samples (the first label of every sample -100, positions restarting at 0),
  then pad (label -100); the first step's loss equals HF's over the samples run alone
  (sum of per-sample mean losses x counted tokens / all counted tokens; 2e-5 relative:
  metrics.jsonl keeps 6 digits);
- clipping: torch's coefficient max_norm / (norm + 1e-6), on a gradient whose norm
  (~2e-6) makes the 1e-6 a third of the denominator; weights after 3 steps and the
  logged norms equal PEFT + torch.optim.AdamW + clip_grad_norm_ (1e-4 relative);
- shuffling: at learning rate 0 and batch 1 each step's loss is one sample's (HF, 2e-5),
  so the logged losses spell the order of every epoch: the order of (train.seed, epoch)
  that lib/data/loader.c's Fisher-Yates gives (ported here), different in each epoch;
- LoRA dropout: 2 steps with dropout 0.25 equal PEFT's with the same masks (our
  counter-based generator, ported here from kernels/dropout_mask.h) in place of its
  nn.Dropout and torch's 1 / (1 - p) scale: losses, norms (2e-5) and weights (1e-4).
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import ftref
import rankrun
from rankrun import FT_TRAIN

SEED = 7  # train.seed of every run here (not the default 42)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    assert FT_TRAIN, "FT_TRAIN must be the path of bin/ft-train"
    d = tmp_path_factory.mktemp("train_semantics")
    rankrun.make_model(d, "model")
    g = torch.Generator().manual_seed(11)
    rows = []
    for _ in range(8):
        n = 6 + int(torch.randint(0, 8, (1,), generator=g))
        ids = torch.randint(1, 64, (n,), generator=g).tolist()
        rows.append({"input_ids": ids, "labels": [-100] * (n // 3) + ids[n // 3:]})
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def records(work):
    return [json.loads(l) for l in (work / "train.jsonl").read_text().splitlines()]


def config(work, name, **over):
    """A run of rankrun's common config (LoRA r 4 all-linear, tokens data) at seed SEED,
    the data in file order unless over says otherwise."""
    base = {"train.seed": SEED, "train.max_steps": 3, "train.warmup_steps": 0,
            "train.lr_scheduler": "constant", "data.shuffle": "false"}
    return rankrun.write_config(work, name, base, **over)


def logged(work, name, key):
    rows = [json.loads(l) for l in
            (work / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r[key] for r in rows if key in r}


def padded_batch(recs):
    """All records as one right-padded batch (labels -100 on the padding), as ft-train's
    loader lays out a batch without packing."""
    T = max(len(r["input_ids"]) for r in recs)
    ids = torch.zeros(len(recs), T, dtype=torch.long)
    labels = torch.full((len(recs), T), -100, dtype=torch.long)
    for i, r in enumerate(recs):
        n = len(r["input_ids"])
        ids[i, :n] = torch.tensor(r["input_ids"])
        labels[i, :n] = torch.tensor(r["labels"])
    return ids, labels


def sample_losses(model, recs):
    """HF's mean loss of each record alone and its counted tokens."""
    out = []
    with torch.no_grad():
        for r in recs:
            ids, labels = torch.tensor([r["input_ids"]]), torch.tensor([r["labels"]])
            n = int((labels[0, 1:] != -100).sum())
            out.append((float(model(input_ids=ids, labels=labels).loss.double()), n))
    return out


def close(got, want, rtol):
    return abs(got - want) <= rtol * abs(want)


# ---- packing ----------------------------------------------------------------------------

T_PACK = 32


@pytest.fixture(scope="module")
def packed(work):
    """(records, config) of a packed run: rows of T_PACK tokens, every other record
    counting its first token too (a text sample's labels), so that the boundary rule has
    something to mask where packing puts such a record after another one."""
    recs = [dict(r, labels=r["input_ids"]) if i % 2 == 0 else r
            for i, r in enumerate(records(work))]
    data = work / "packed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in recs))
    cfg = config(work, "packed", data__packing="true", data__train_path=data,
                 model__max_seq_len=T_PACK, train__batch_size=8, train__max_steps=1)
    return recs, cfg


def test_packed_rows_equal_data_collator_with_flattening(packed):
    import warnings
    from transformers import DataCollatorWithFlattening

    recs, cfg = packed
    out = rankrun.run(cfg, 1, "--dump-data", "-")
    rows = [json.loads(l) for l in out.stdout.splitlines()]
    # the loader's greedy layout (data.h): a sample joins the current row when it fits
    layout, fill = [], T_PACK
    for r in recs:
        if fill + len(r["input_ids"]) > T_PACK:
            layout.append([])
            fill = 0
        layout[-1].append(r)
        fill += len(r["input_ids"])
    assert len(rows) == len(layout) > 1
    assert any(r["labels"][0] != -100 for row in layout for r in row[1:])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collate = DataCollatorWithFlattening(return_tensors="pt")
    for got, row in zip(rows, layout):
        want = collate([{"input_ids": r["input_ids"], "labels": r["labels"]} for r in row])
        n, pad = want["input_ids"].shape[1], T_PACK - want["input_ids"].shape[1]
        assert got["input_ids"][:n] == want["input_ids"][0].tolist()
        assert got["labels"] == want["labels"][0].tolist() + [-100] * pad, got
        # the padding is a sequence of its own: positions 0, 1, ...
        assert got["position_ids"] == want["position_ids"][0].tolist() + list(range(pad))


def test_packed_loss_equals_samples_alone(work, packed):
    """One step over every packed row: the loss of the samples run alone through HF,
    where no sample's first token is predicted (nothing precedes it)."""
    recs, cfg = packed
    rankrun.run(cfg)
    per = sample_losses(ftref.load_hf(work / "model"), recs)
    want = sum(l * n for l, n in per) / sum(n for _, n in per)
    got = logged(work, "packed", "loss")[1]
    assert close(got, want, 2e-5), (got, want)


# ---- clipping's epsilon -----------------------------------------------------------------

def test_clip_coefficient_epsilon(work, tmp_path):
    """A fresh-style adapter (B = 0) whose A is scaled so that the first gradient's norm
    is ~2e-6: torch clips by max_norm / (norm + 1e-6), a coefficient a third smaller than
    max_norm / norm. adam_epsilon 1 makes AdamW's update ~lr x its first moment (linear in
    the clipped gradient, not normalised away), and B, which starts at zero, holds nothing
    but those updates."""
    recs = records(work)
    ids, labels = padded_batch(recs)
    adapter = ftref.build_adapter(work / "model", tmp_path / "adapter",
                                  target_modules=list(ftref.SEVEN), r=4, lora_alpha=8, seed=2)
    f = adapter / "adapter_model.safetensors"
    w = load_file(f)
    w = {k: torch.zeros_like(v) if ".lora_B." in k else v for k, v in w.items()}
    save_file(w, f)
    # B = 0: the first gradient is d/dB only, linear in A: scale A to the norm wanted
    m = ftref.lora_mode_model(work / "model", adapter)
    _, _, grads = ftref.hf_grads(m, ids, labels)
    norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values())))
    scale = 2e-6 / norm
    save_file({k: v * scale if ".lora_A." in k else v for k, v in w.items()}, f)

    train = dict(steps=3, lr=1e-2, betas=[0.9, 0.999], eps=1.0, weight_decay=0.0,
                 warmup_steps=0, scheduler="constant", max_grad_norm=1e-7)
    ref = ftref.reference_train(ftref.lora_mode_model(work / "model", adapter), ids, labels,
                                train, key=ftref.peft_key)
    assert min(ref["norms"]) > 10 * train["max_grad_norm"]  # every step clips
    assert 1e-6 / max(ref["norms"]) > 0.2  # the epsilon is a fifth of the norm or more

    cfg = config(work, "clip_eps", train__batch_size=len(recs), train__learning_rate=1e-2,
                 train__adam_epsilon=1.0, train__max_grad_norm=1e-7,
                 tuning__lora__init_adapter=adapter)
    rankrun.run(cfg)
    norms = logged(work, "clip_eps", "grad_norm")
    assert sorted(norms) == [1, 2, 3]
    for s, want in enumerate(ref["norms"], 1):
        assert close(norms[s], want, 2e-5), (s, norms[s], want)
    got = load_file(work / "runs" / "clip_eps" / "final" / "adapter_model.safetensors")
    assert got.keys() == ref["weights"].keys()
    for k, want in ref["weights"].items():
        if ".lora_B." in k:
            assert want.abs().max() > 0, k
        err = ftref.rel_err(got[k], want)
        assert err <= 1e-4, (k, ftref.describe(got[k], want))


# ---- shuffling per epoch ----------------------------------------------------------------

M64 = (1 << 64) - 1


def mix64(z):
    """lib/core/rng.h's ft_mix64 (splitmix64)."""
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def shuffled(n, seed, epoch):
    """lib/data/loader.c's ft_shuffle_indices(idx, n, seed, stream = epoch)."""
    idx = list(range(n))
    key = mix64(seed ^ mix64(epoch ^ 0xA5A5A5A5DA7A5EED))
    for i in range(n, 1, -1):
        j = (mix64((key + mix64(i)) & M64) * i) >> 64
        idx[i - 1], idx[j] = idx[j], idx[i - 1]
    return idx


def test_shuffle_order_per_epoch(work):
    recs = records(work)
    per = [l for l, _ in sample_losses(ftref.load_hf(work / "model"), recs)]
    # each sample's loss names it: they must be told apart well beyond the tolerance
    gaps = [abs(a - b) / a for i, a in enumerate(per) for b in per[i + 1:]]
    assert min(gaps) > 1e-3, sorted(per)
    cfg = config(work, "shuffled", data__shuffle="true", train__batch_size=1,
                 train__learning_rate=0.0, train__max_steps=-1, train__epochs=3)
    rankrun.run(cfg)
    loss, epoch = logged(work, "shuffled", "loss"), logged(work, "shuffled", "epoch")
    n = len(recs)
    assert sorted(loss) == list(range(1, 3 * n + 1))
    orders = []
    for e in range(3):
        steps = range(e * n + 1, (e + 1) * n + 1)
        # the fractional epoch as the HF Trainer logs it: step s ends at s / n epochs
        assert [epoch[s] for s in steps] == pytest.approx([s / n for s in steps])
        want = shuffled(n, SEED, e)
        got = [min(range(n), key=lambda i: abs(per[i] - loss[s])) for s in steps]
        assert got == want, (e, got, want)
        for s, i in zip(steps, want):
            assert close(loss[s], per[i], 2e-5), (s, loss[s], per[i])
        orders.append(got)
    assert len({tuple(o) for o in orders}) == 3 and orders[0] != list(range(n)), orders


# ---- LoRA dropout -----------------------------------------------------------------------

G = np.uint64(0x9E3779B97F4A7C15)


def _fin(z):
    """The splitmix64 finaliser, on uint64 arrays (arithmetic mod 2^64)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def dropout_factor(shape, p, seed, forward, layer, proj):
    """ft-train's LoRA dropout of one projection's input (lib/model/model_pass.c,
    kernels/dropout_mask.h): the forward's seed mix(seed ^ mix(forward)) (forward counts
    the model's forward passes from 1), the projection's mix(that ^ (layer x 7 + proj +
    1)), element c of the row-major [tokens, in] input kept when the top 24 bits of
    fin(key + (c + 1) G) are >= ceil(p 2^24), key = fin(seed + G); kept elements are
    scaled as torch does: 1 / float32(1 - p)."""
    s = mix64(seed ^ mix64(forward))
    s = mix64(s ^ (layer * 7 + proj + 1))
    with np.errstate(over="ignore"):
        key = _fin(np.array([s], dtype=np.uint64) + G)[0]
        c = np.arange(1, int(np.prod(shape)) + 1, dtype=np.uint64)
        bits = _fin(key + c * G) >> np.uint64(40)
    thr = int(np.ceil(np.float32(p) * np.float32(1 << 24)))
    k = np.float32(1.0) / np.float32(1.0 - float(np.float32(p)))
    return torch.from_numpy(np.where(bits >= thr, k, np.float32(0)).astype(np.float32)
                            .reshape(shape))


PROJ = {n: i for i, n in enumerate(ftref.SEVEN)}


class CounterDropout(torch.nn.Module):
    """PEFT's lora_dropout replaced by ft-train's mask for (layer, proj) at the forward
    the shared counter names."""

    def __init__(self, counter, p, layer, proj):
        super().__init__()
        self.counter, self.p, self.layer, self.proj = counter, p, layer, proj

    def forward(self, x):
        return x * dropout_factor(tuple(x.shape), self.p, SEED, self.counter[0], self.layer,
                                  self.proj)


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
def test_lora_dropout_equals_peft_with_the_same_masks(work, tmp_path, dora):
    """(DoRA: PEFT then recomputes the base result on the dropped input, y = x W^T + b +
    (g - 1) xd W^T + g s xd A^T B^T, which ours must do too.)"""
    p = 0.25
    recs = records(work)
    ids, labels = padded_batch(recs)
    adapter = ftref.build_adapter(work / "model", tmp_path / "adapter",
                                  target_modules=list(ftref.SEVEN), r=4, lora_alpha=8, seed=1,
                                  use_dora=dora)
    c = json.loads((adapter / "adapter_config.json").read_text())
    c["lora_dropout"] = p
    (adapter / "adapter_config.json").write_text(json.dumps(c))
    m = ftref.lora_mode_model(work / "model", adapter)
    counter = [0]
    swapped = 0
    for name, mod in m.named_modules():
        if hasattr(mod, "lora_dropout") and "default" in mod.lora_dropout:
            parts = name.split(".")
            layer = int(parts[parts.index("layers") + 1])
            mod.lora_dropout["default"] = CounterDropout(counter, p, layer, PROJ[parts[-1]])
            swapped += 1
    assert swapped == 2 * 7
    m.register_forward_pre_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
    if dora:  # PEFT's DoRA drops its input only in training mode (the model's dropouts are 0)
        m.train()
    train = dict(steps=2, lr=1e-3, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.0,
                 warmup_steps=0, scheduler="constant", max_grad_norm=0.0)
    ref = ftref.reference_train(m, ids, labels, train, key=ftref.peft_key)
    assert counter[0] == 2

    # the masks matter: without them (dropout off) the first loss is another
    base = ftref.hf_forward(ftref.lora_mode_model(work / "model", adapter), ids, labels)[1]
    assert abs(float(base) - float(ref["losses"][0])) > 1e-3 * float(base)

    name = "dropout_dora" if dora else "dropout"
    cfg = config(work, name, train__batch_size=len(recs), train__learning_rate=1e-3,
                 train__max_steps=2, train__max_grad_norm=0.0, tuning__lora__dropout=p,
                 tuning__lora__init_adapter=adapter,
                 tuning__lora__use_dora="true" if dora else "false")
    rankrun.run(cfg)
    loss, norms = logged(work, name, "loss"), logged(work, name, "grad_norm")
    for s in (1, 2):
        assert close(loss[s], float(ref["losses"][s - 1]), 2e-5), (s, loss[s], ref["losses"])
        assert close(norms[s], ref["norms"][s - 1], 2e-5), (s, norms[s], ref["norms"])
    got = load_file(work / "runs" / name / "final" / "adapter_model.safetensors")
    assert dora == any(k.endswith(".lora_magnitude_vector") for k in got)
    for k, want in ref["weights"].items():
        assert ftref.rel_err(got[k], want) <= 1e-4, (k, ftref.describe(got[k], want))


class SaltDropout(torch.nn.Module):
    """CounterDropout with ft-train's mask of another salt: lm_head's LoRA input drops
    with mix(forward seed ^ 2^41) (model_pass.c's head_dropout_seed) over [tokens, hidden]."""

    def __init__(self, counter, p, salt):
        super().__init__()
        self.counter, self.p, self.salt = counter, p, salt

    def forward(self, x):
        s = mix64(SEED ^ mix64(self.counter[0]))
        s = mix64(s ^ self.salt)
        with np.errstate(over="ignore"):
            key = _fin(np.array([s], dtype=np.uint64) + G)[0]
            c = np.arange(1, x.numel() + 1, dtype=np.uint64)
            bits = _fin(key + c * G) >> np.uint64(40)
        thr = int(np.ceil(np.float32(self.p) * np.float32(1 << 24)))
        k = np.float32(1.0) / np.float32(1.0 - float(np.float32(self.p)))
        mask = np.where(bits >= thr, k, np.float32(0)).astype(np.float32)
        return x * torch.from_numpy(mask.reshape(tuple(x.shape)))


@pytest.mark.parametrize("dora", [False, True], ids=["lora", "dora"])
def test_head_dropout_equals_peft_with_the_same_masks(work, tmp_path, dora):
    """LoRA and DoRA on lm_head (and the embedding, which PEFT never drops) with LoRA
    dropout: the head's pair takes dropout(lnf) with its own mask; DoRA there recomputes
    the base result on the dropped input as on a layer's (dora_outer.c)."""
    p = 0.25
    recs = records(work)
    ids, labels = padded_batch(recs)
    targets = ["q_proj", "o_proj", "down_proj", "embed_tokens", "lm_head"]
    adapter = ftref.build_adapter(work / "model", tmp_path / "adapter", target_modules=targets,
                                  r=4, lora_alpha=8, seed=2, use_dora=dora)
    c = json.loads((adapter / "adapter_config.json").read_text())
    c["lora_dropout"] = p
    (adapter / "adapter_config.json").write_text(json.dumps(c))
    m = ftref.lora_mode_model(work / "model", adapter)
    counter = [0]
    swapped = 0
    for name, mod in m.named_modules():
        if not (hasattr(mod, "lora_dropout") and "default" in mod.lora_dropout):
            continue
        parts = name.split(".")
        if parts[-1] == "lm_head":
            mod.lora_dropout["default"] = SaltDropout(counter, p, 1 << 41)
        elif "layers" in parts:
            layer = int(parts[parts.index("layers") + 1])
            mod.lora_dropout["default"] = CounterDropout(counter, p, layer, PROJ[parts[-1]])
        else:
            continue
        swapped += 1
    assert swapped == 2 * 3 + 1
    m.register_forward_pre_hook(lambda *_: counter.__setitem__(0, counter[0] + 1))
    m.train()  # (PEFT's DoRA drops its input only in training mode; the model's dropouts are 0)
    train = dict(steps=2, lr=1e-3, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.0,
                 warmup_steps=0, scheduler="constant", max_grad_norm=0.0)
    ref = ftref.reference_train(m, ids, labels, train, key=ftref.peft_key)
    assert counter[0] == 2
    base = ftref.hf_forward(ftref.lora_mode_model(work / "model", adapter), ids, labels)[1]
    assert abs(float(base) - float(ref["losses"][0])) > 1e-3 * float(base)

    name = "head_dropout_dora" if dora else "head_dropout"
    cfg = config(work, name, train__batch_size=len(recs), train__learning_rate=1e-3,
                 train__max_steps=2, train__max_grad_norm=0.0, tuning__lora__dropout=p,
                 tuning__lora__init_adapter=adapter,
                 tuning__lora__target_modules=",".join(targets),
                 tuning__lora__use_dora="true" if dora else "false")
    rankrun.run(cfg)
    loss, norms = logged(work, name, "loss"), logged(work, name, "grad_norm")
    for s in (1, 2):
        assert close(loss[s], float(ref["losses"][s - 1]), 2e-5), (s, loss[s], ref["losses"])
        assert close(norms[s], ref["norms"][s - 1], 2e-5), (s, norms[s], ref["norms"])
    got = load_file(work / "runs" / name / "final" / "adapter_model.safetensors")
    for k, want in ref["weights"].items():
        assert ftref.rel_err(got[k], want) <= 1e-4, (k, ftref.describe(got[k], want))
