"""ft-train with train.objective orpo against TRL 1.16's experimental ORPOTrainer.train() on
test_dpo_train.py's tiny Llama and tokenizer: string pairs (the answer truncated to
max_length less the prompt) and chat pairs (rendered to text by the chat template first,
as TRL does), LoRA from a PEFT adapter and full fine-tuning: every step's loss and the
metrics TRL logs (rewards/*, logps/*, nll_loss, log_odds_ratio, log_odds_chosen; the
margins and the log odds, differences of two mean log-probabilities, to 1e-5 of their
operands' scale, as test_dpo_train.py holds the DPO rewards) and the weights after five
steps; the metrics in TensorBoard; the refusals of what ORPO does not take."""

import json
import os
import subprocess

import pytest
import torch

import ftref
from test_dpo_train import MAXLEN, STEPS, metrics, string_pairs, train, workdir, write_config  # noqa: F401

METRICS = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
           "logps/chosen", "logps/rejected", "nll_loss", "log_odds_ratio", "log_odds_chosen"]


def trl_orpo_run(d, data, mode, lr, beta):
    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    losses = []

    class Recording(ORPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            losses.append(loss.item())
            return loss

    tok = AutoTokenizer.from_pretrained(d / "model")
    model = AutoModelForCausalLM.from_pretrained(d / "model", dtype=torch.float32,
                                                 attn_implementation="eager")
    if mode == "lora":
        model = PeftModel.from_pretrained(model, str(d / "adapter"), is_trainable=True)
    rows = [json.loads(x) for x in (d / f"{data}.jsonl").read_text().splitlines()]
    args = ORPOConfig(output_dir=str(d / f"trl-orpo-{data}-{mode}"), report_to=[], use_cpu=True,
                      bf16=False, gradient_checkpointing=False, per_device_train_batch_size=4,
                      max_steps=STEPS, learning_rate=lr, lr_scheduler_type="cosine",
                      warmup_steps=1, weight_decay=0.0, max_grad_norm=1.0, logging_steps=1,
                      save_strategy="no", max_length=MAXLEN, seed=0, beta=beta)
    tr = Recording(model=model, args=args, processing_class=tok,
                   train_dataset=Dataset.from_list(rows))
    tr.train()
    logs = [h for h in tr.state.log_history if "rewards/chosen" in h]
    key = ftref.peft_key if mode == "lora" else (lambda n: n)
    weights = {key(n): p.detach().clone() for n, p in tr.model.named_parameters()
               if p.requires_grad}
    return losses, logs, weights


@pytest.fixture(scope="module")
def orpo_data(workdir):  # noqa: F811
    """The string pairs without the one whose prompt fills max_length (TRL would average
    its empty answer to NaN; ft-train drops it, test_orpo_refusals checks that)."""
    rows = [r for r in string_pairs() if len(r["prompt"]) < 100]
    (workdir / "orpo_strings.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return workdir


# (strings-lora at lr 1e-3: at 1e-2 its weights after five steps differ by 3e-5 in
# layer 1's down_proj LoRA while every step's loss and metrics agree to 1e-5, and the
# difference falls tenfold with the learning rate: AdamW moving elements whose gradient is
# near zero by ~lr whatever their float32 noise, test_train.py's conditioning note)
RUNS = [
    dict(id="strings-lora", data="orpo_strings", mode="lora", lr=1e-3, beta=0.1),
    dict(id="chat-lora", data="chat", mode="lora", lr=1e-2, beta=0.3),
    dict(id="strings-full", data="orpo_strings", mode="full", lr=1e-3, beta=0.1),
]


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_orpo_train_matches_trl(orpo_data, run):
    from safetensors.torch import load_file

    d = orpo_data
    name = f"run-orpo-{run['id']}"
    out = train(write_config(d, name, run["data"], run["mode"], objective="orpo",
                             learning_rate=run["lr"], pref=dict(beta=run["beta"])))
    ours = metrics(d / name)
    losses, logs, weights = trl_orpo_run(d, run["data"], run["mode"], run["lr"], run["beta"])
    assert len(ours) == STEPS and len(logs) == STEPS and len(losses) == STEPS, out.stderr
    ftref.assert_close("losses", torch.tensor([m["loss"] for m in ours], dtype=torch.float64),
                       torch.tensor(losses, dtype=torch.float64), ftref.TOL_LOSSES)
    scale = run["beta"] * max(abs(h[k]) for h in logs for k in ("logps/chosen", "logps/rejected"))
    for k in METRICS:
        a = torch.tensor([m[k] for m in ours], dtype=torch.float64)
        b = torch.tensor([h[k] for h in logs], dtype=torch.float64)
        if k == "rewards/accuracies":
            assert torch.equal(a, b), (k, a, b)
        elif k in ("rewards/margins", "log_odds_chosen"):
            # differences of two mean log-probabilities: held to 1e-5 of their scale
            # (beta max|logps|, max|logps|), as test_dpo_train.py holds the DPO rewards
            err = float((a - b).abs().max()) / (scale if k.startswith("rewards") else
                                                scale / run["beta"])
            assert err <= ftref.TOL_LOSSES, (k, err, a.tolist(), b.tolist())
        else:
            ftref.assert_close(k, a, b, ftref.TOL_LOSSES)
    final = d / name / "final"
    got = load_file(final / ("adapter_model.safetensors" if run["mode"] == "lora"
                             else "model.safetensors"))
    got = {"weight." + k: v for k, v in got.items()}
    ftref.assert_tensor_dict_close("weight.", got, weights, ftref.TOL_WEIGHT)


def test_orpo_metrics_in_tensorboard(orpo_data):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    name = "run-orpo-tb"
    train(write_config(orpo_data, name, "orpo_strings", objective="orpo"))
    acc = EventAccumulator(str(orpo_data / name), size_guidance={"scalars": 0})
    acc.Reload()
    ours = metrics(orpo_data / name)
    for k in METRICS:
        tb = {e.step: e.value for e in acc.Scalars(f"train/{k}")}
        for m in ours:
            assert abs(tb[m["step"]] - m[k]) <= 1e-6 * max(1.0, abs(m[k])), (k, m, tb)


@pytest.mark.parametrize("sets,needle", [
    (["train.pref.loss_type=ipo"], "train.pref.loss_type"),
    (["train.pref.label_smoothing=0.1"], "label_smoothing"),
])
def test_orpo_refusals(orpo_data, sets, needle):
    cfg = write_config(orpo_data, "run-orpo-refused", "orpo_strings", objective="orpo")
    out = train(cfg, *[x for s in sets for x in ("--set", s)], check=False)
    assert out.returncode != 0 and needle in out.stderr, out.stderr


def test_orpo_drops_a_pair_without_answer(orpo_data):
    """The pair whose prompt fills max_length (TRL: an empty answer, a NaN loss) is dropped
    and counted."""
    out = train(write_config(orpo_data, "run-orpo-drop", "strings", objective="orpo"))
    assert "4 preference pairs" in out.stderr and "1 whose prompt fills" in out.stderr


@pytest.mark.parametrize("data", ["orpo_strings", "chat"])
def test_ft_eval_orpo_matches_trl_evaluate(orpo_data, data):
    """ft-eval --preference --objective orpo on a trained adapter against TRL's
    ORPOTrainer.evaluate() with the same adapter (batches of 2 pairs, all full: TRL
    averages each batch's metrics, ft-eval weights them by their pairs)."""
    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.orpo import ORPOConfig, ORPOTrainer

    d = orpo_data
    name = f"run-orpo-eval-{data}"
    out = train(write_config(d, name, data, "lora", objective="orpo", learning_rate=1e-2,
                             pref=dict(beta=0.2)))
    final = d / name / "final"
    rows = [json.loads(x) for x in (d / f"{data}.jsonl").read_text().splitlines()]
    rows = rows[:len(rows) // 2 * 2]
    (d / f"{data}-even.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = subprocess.run([os.environ["FT_EVAL"], "--model", str(d / "model"), "--adapter",
                          str(final), "--data", str(d / f"{data}-even.jsonl"), "--preference",
                          "--objective", "orpo", "--json", "--beta", "0.2", "--max-seq-len",
                          str(MAXLEN), "--batch-size", "2"], capture_output=True, text=True)
    assert res.returncode == 0, out.stderr + res.stderr
    ours = json.loads(res.stdout)
    tok = AutoTokenizer.from_pretrained(d / "model")
    base = AutoModelForCausalLM.from_pretrained(d / "model", dtype=torch.float32,
                                                attn_implementation="eager")
    model = PeftModel.from_pretrained(base, str(final))
    args = ORPOConfig(output_dir=str(d / f"trl-orpo-eval-{data}"), report_to=[], use_cpu=True,
                      bf16=False, gradient_checkpointing=False, per_device_eval_batch_size=2,
                      max_length=MAXLEN, beta=0.2)
    tr = ORPOTrainer(model=model, args=args, processing_class=tok,
                     train_dataset=Dataset.from_list(rows), eval_dataset=Dataset.from_list(rows))
    ref = tr.evaluate()
    assert ours["pairs"] == len(rows) and ours["objective"] == "orpo"
    assert ours["reference"] == "none (orpo)"
    assert ours["accuracy"] == ref["eval_rewards/accuracies"]
    ftref.assert_close("eval loss", torch.tensor(ours["loss"]), torch.tensor(ref["eval_loss"]),
                       ftref.TOL_LOSSES)
    scale = 0.2 * max(abs(ref["eval_logps/chosen"]), abs(ref["eval_logps/rejected"]))
    for k in METRICS:
        a, b = ours[k], ref["eval_" + k]
        if k == "rewards/accuracies":
            assert a == b
        elif k in ("rewards/margins", "log_odds_chosen"):
            err = abs(a - b) / (scale if k.startswith("rewards") else scale / 0.2)
            assert err <= ftref.TOL_LOSSES, (k, a, b)
        else:
            ftref.assert_close(k, torch.tensor(a), torch.tensor(b), ftref.TOL_LOSSES)


def test_ft_eval_objective_refusals(orpo_data):
    d = orpo_data
    base = [os.environ["FT_EVAL"], "--model", str(d / "model"), "--data",
            str(d / "orpo_strings.jsonl")]
    for extra, needle in [(["--objective", "orpo"], "--objective needs --preference"),
                          (["--preference", "--objective", "kto"], "not dpo or orpo"),
                          (["--preference", "--objective", "orpo", "--reference",
                            str(d / "model")], "ORPO has no reference")]:
        res = subprocess.run(base + extra, capture_output=True, text=True)
        assert res.returncode == 2 and needle in res.stderr, (extra, res.stderr)
