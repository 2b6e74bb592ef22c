"""ft-train with train.objective dpo against TRL 1.16's DPOTrainer.train() on a tiny Llama
with a BPE tokenizer (as test_train_tool.py makes them): the same JSONL preference pairs,
as strings (EOS appended, truncation at max_length and a pair whose prompt fills it
dropped) and as conversations (the tokenizer's chat template), LoRA from a PEFT adapter
(the reference: that adapter as it starts) and full fine-tuning (a frozen base):

- every step's loss and the metrics TRL logs (rewards/chosen, rewards/rejected,
  rewards/accuracies, rewards/margins, logps/chosen, logps/rejected) from metrics.jsonl:
  1e-5 relative (accuracies exactly). A reward is beta (logp - logp_ref), the difference
  of two float32 sums of ~|logp|: its float32 resolution is ~beta |logp| 1e-7 whatever
  its own size (TRL's float32 and float64 rewards differ by that much), so the rewards
  and margins are held to 1e-5 of that scale, beta max|logps|, rather than of their own
  value, which a few steps from the reference is ~1e-3 of it;
- the trained weights after five steps: 1e-5;
- the same metrics as TensorBoard scalars (train/rewards/chosen, ...);
- resuming from a checkpoint continues with bitwise the same adapter;
- the unsupported combinations are refused naming the key.

The batch holds the whole data set (5 steps = 5 epochs), so the order TRL's sampler and
ours draw does not matter."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import ftref

FT_TRAIN = os.environ.get("FT_TRAIN")
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
MAXLEN = 24
STEPS = 5
METRICS = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
           "logps/chosen", "logps/rejected"]


def string_pairs():
    colours = ["red", "green", "blue", "grey"]
    rows = [{"prompt": f"Q: colour of item {i}?\nA:", "chosen": f" It is {colours[i % 4]}.",
             "rejected": f" It is {colours[(i + 1) % 4]}, I think, or maybe not at all."}
            for i in range(4)]
    # the prompt alone fills max_length: TRL drops the pair, and so must we
    rows.insert(2, {"prompt": "Q: " + "a very long question " * 8 + "?",
                    "chosen": " yes", "rejected": " no"})
    return rows


def chat_pairs():
    return [{"prompt": [{"role": "user", "content": f"colour of item {i}?"}],
             "chosen": [{"role": "assistant", "content": f"red {i}"}],
             "rejected": [{"role": "assistant", "content": f"blue, green or grey {i}"}]}
            for i in range(4)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    assert FT_TRAIN, "FT_TRAIN must be the path of bin/ft-train"
    d = tmp_path_factory.mktemp("dpo_train")
    text = [r["prompt"] + r["chosen"] + r["rejected"] for r in string_pairs()]
    text += [json.dumps(r) for r in chat_pairs()]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>",
                                 pad_token="<|endoftext|>")
    hf.chat_template = CHATML
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=tk.get_vocab_size(), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, eos_token_id=hf.eos_token_id)
    LlamaForCausalLM(cfg).save_pretrained(d / "model")
    hf.save_pretrained(d / "model")
    ftref.build_adapter(d / "model", d / "adapter", target_modules=["q_proj", "v_proj", "o_proj",
                                                                     "up_proj", "down_proj"],
                        seed=3)
    for name, rows in (("strings", string_pairs()), ("chat", chat_pairs())):
        (d / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def write_config(d, name, data, mode="lora", **train):
    t = dict(objective="dpo", batch_size=4, grad_accum=1, max_steps=STEPS, learning_rate=1e-2,
             lr_scheduler="cosine", warmup_steps=1, weight_decay=0.0, max_grad_norm=1.0,
             logging_steps=1, save_steps=3, output_dir=str(d / name))
    t.update(train)
    pref = t.pop("pref", dict(beta=0.1))
    tuning = (f"tuning:\n  mode: lora\n  lora:\n    r: 4\n    alpha: 8\n    dropout: 0.0\n"
              f"    target_modules: q_proj,v_proj,o_proj,up_proj,down_proj\n"
              f"    init_adapter: {d / 'adapter'}\n" if mode == "lora" else
              "tuning:\n  mode: full\n")
    text = (f"model:\n  name: {d / 'model'}\n  max_seq_len: {MAXLEN}\n" + tuning +
            "train:\n" + "".join(f"  {k}: {v}\n" for k, v in t.items()) +
            "  pref:\n" + "".join(f"    {k}: {v}\n" for k, v in pref.items()) +
            f"data:\n  train_path: {d / (data + '.jsonl')}\n")
    p = d / f"{name}.yaml"
    p.write_text(text)
    return p


def train(cfg, *args, check=True):
    out = subprocess.run([FT_TRAIN, "--config", str(cfg), *args], capture_output=True, text=True)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in line]


def trl_run(d, data, mode, lr, pref):
    """TRL's DPOTrainer on the same data: per step the loss (recorded in compute_loss) and
    the metrics TRL logs; the trained weights."""
    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    losses = []

    class Recording(DPOTrainer):
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
    args = DPOConfig(output_dir=str(d / f"trl-{data}-{mode}"), report_to=[], use_cpu=True,
                     bf16=False, gradient_checkpointing=False, per_device_train_batch_size=4,
                     max_steps=STEPS, learning_rate=lr, lr_scheduler_type="cosine",
                     warmup_steps=1, weight_decay=0.0, max_grad_norm=1.0, logging_steps=1,
                     save_strategy="no", max_length=MAXLEN, seed=0, dataloader_drop_last=False,
                     **pref)
    tr = Recording(model=model, args=args, processing_class=tok,
                   train_dataset=Dataset.from_list(rows))
    tr.train()
    logs = [h for h in tr.state.log_history if "rewards/chosen" in h]
    key = ftref.peft_key if mode == "lora" else (lambda n: n)
    weights = {key(n): p.detach().clone() for n, p in tr.model.named_parameters()
               if p.requires_grad}
    return losses, logs, weights


RUNS = [
    dict(id="strings-lora", data="strings", mode="lora", lr=1e-2, pref=dict(beta=0.1)),
    dict(id="chat-lora-ipo", data="chat", mode="lora", lr=1e-2,
         pref=dict(beta=0.2, loss_type="ipo")),
    dict(id="strings-full", data="strings", mode="full", lr=1e-3, pref=dict(beta=0.1)),
]


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_dpo_train_matches_trl(workdir, run):
    from safetensors.torch import load_file

    name = f"run-{run['id']}"
    out = train(write_config(workdir, name, run["data"], run["mode"], learning_rate=run["lr"],
                             pref=run["pref"]))
    ours = metrics(workdir / name)
    if run["data"] == "strings":
        # the data exercise truncation (a sequence longer than max_length) and the drop
        assert "4 preference pairs" in out.stderr and "1 whose prompt fills" in out.stderr, \
            out.stderr
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(workdir / "model")
        assert max(len(tok(r["prompt"] + r["rejected"])["input_ids"])
                   for r in string_pairs()) > MAXLEN
    trl_pref = {("loss_type" if k == "loss_type" else k): ([v] if k == "loss_type" else v)
                for k, v in run["pref"].items()}
    losses, logs, weights = trl_run(workdir, run["data"], run["mode"], run["lr"], trl_pref)
    assert len(ours) == STEPS and len(logs) == STEPS and len(losses) == STEPS, out.stderr
    ftref.assert_close("losses", torch.tensor([m["loss"] for m in ours], dtype=torch.float64),
                       torch.tensor(losses, dtype=torch.float64), ftref.TOL_LOSSES)
    scale = run["pref"]["beta"] * max(abs(h[k]) for h in logs
                                      for k in ("logps/chosen", "logps/rejected"))
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
    final = workdir / name / "final"
    if run["mode"] == "lora":
        got = load_file(final / "adapter_model.safetensors")
    else:
        got = load_file(final / "model.safetensors")
    got = {"weight." + k: v for k, v in got.items()}
    ftref.assert_tensor_dict_close("weight.", got, weights, ftref.TOL_WEIGHT)


def test_dpo_metrics_in_tensorboard(workdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    name = "run-tb"
    train(write_config(workdir, name, "strings"))
    acc = EventAccumulator(str(workdir / name), size_guidance={"scalars": 0})
    acc.Reload()
    ours = metrics(workdir / name)
    for k in METRICS:
        tb = {e.step: e.value for e in acc.Scalars(f"train/{k}")}
        assert sorted(tb) == [m["step"] for m in ours], k
        for m in ours:
            assert abs(tb[m["step"]] - m[k]) <= 1e-6 * max(1.0, abs(m[k])), (k, m, tb)


def test_dpo_resume_is_bitwise(workdir):
    """A run resumed from checkpoint-3 of another: the same final adapter, bit for bit
    (the reference, the starting adapter, comes from tuning.lora.init_adapter again, not
    from the checkpoint)."""
    a = workdir / "run-resume-a"
    train(write_config(workdir, a.name, "strings"))
    b = workdir / "run-resume-b"
    b.mkdir()
    shutil.copytree(a / "checkpoint-3", b / "checkpoint-3")
    out = train(write_config(workdir, b.name, "strings"), "--resume", "auto")
    assert "resumed from" in out.stderr
    assert ((b / "final" / "adapter_model.safetensors").read_bytes() ==
            (a / "final" / "adapter_model.safetensors").read_bytes())
    # the resumed steps log the same metrics
    want = {m["step"]: m for m in metrics(a)}
    for m in metrics(b):
        for k in ["loss"] + METRICS:
            assert m[k] == want[m["step"]][k], (k, m, want[m["step"]])


@pytest.mark.parametrize("sets,needle", [
    (["train.objective=orpo", "train.pref.loss_type=ipo"], "train.pref.loss_type"),
    (["data.packing=true"], "data.packing"),
    (["train.pref.label_smoothing=0.1"], "train.pref.label_smoothing"),
    (["train.pref.loss_type=robust", "train.pref.label_smoothing=0.5"],
     "train.pref.label_smoothing"),
    (["train.pref.beta=0"], "train.pref.beta"),
    (["data.format=prompt_completion"], "data.format"),
    (["train.objective=sft", "train.pref.beta=0.3"], "train.pref"),
])
def test_dpo_refusals(workdir, sets, needle):
    cfg = write_config(workdir, "run-refused", "strings")
    args = [x for s in sets for x in ("--set", s)]
    out = train(cfg, *args, check=False)
    assert out.returncode != 0 and needle in out.stderr, out.stderr
    assert not (workdir / "run-refused" / "metrics.jsonl").exists()


def test_dpo_bad_record_names_line(workdir):
    bad = workdir / "bad.jsonl"
    bad.write_text(json.dumps(string_pairs()[0]) + "\n" +
                   json.dumps({"prompt": "x", "chosen": " y"}) + "\n")
    cfg = write_config(workdir, "run-bad", "strings")
    out = train(cfg, "--set", f"data.train_path={bad}", check=False)
    assert out.returncode != 0
    assert f"{bad}:2: missing \"rejected\"" in out.stderr, out.stderr


@pytest.mark.parametrize("data", ["strings", "chat"])
def test_ft_eval_preference_matches_trl_evaluate(workdir, data):
    """ft-eval --preference on a trained adapter (its reference: the base, the adapter
    off) against TRL's DPOTrainer.evaluate() with the same adapter and the base as
    reference (TRL's fresh-adapter case: its "ref" adapter copy removed)."""
    from datasets import Dataset
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    name = f"run-eval-{data}"
    out = train(write_config(workdir, name, data))
    final = Path(out.stdout.strip())
    ft_eval = os.environ.get("FT_EVAL")
    assert ft_eval, "FT_EVAL must be the path of bin/ft-eval"
    res = subprocess.run([ft_eval, "--model", str(workdir / "model"), "--adapter", str(final),
                          "--data", str(workdir / f"{data}.jsonl"), "--preference", "--json",
                          "--beta", "0.1", "--max-seq-len", str(MAXLEN), "--batch-size", "3"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    ours = json.loads(res.stdout)
    tok = AutoTokenizer.from_pretrained(workdir / "model")
    base = AutoModelForCausalLM.from_pretrained(workdir / "model", dtype=torch.float32,
                                                attn_implementation="eager")
    model = PeftModel.from_pretrained(base, str(final))
    rows = [json.loads(x) for x in (workdir / f"{data}.jsonl").read_text().splitlines()]
    ds = Dataset.from_list(rows)
    args = DPOConfig(output_dir=str(workdir / f"trl-eval-{data}"), report_to=[], use_cpu=True,
                     bf16=False, gradient_checkpointing=False, per_device_eval_batch_size=2,
                     max_length=MAXLEN, beta=0.1)
    tr = DPOTrainer(model=model, args=args, processing_class=tok, train_dataset=ds,
                    eval_dataset=ds)
    tr.model.delete_adapter("ref")
    tr.model.set_adapter("default")
    ref = tr.evaluate()
    assert ours["pairs"] == (4 if data == "strings" else len(rows))
    assert ours["reference"] == "base"
    assert ours["accuracy"] == ref["eval_rewards/accuracies"] != 0
    ftref.assert_close("eval loss", torch.tensor(ours["loss"]), torch.tensor(ref["eval_loss"]),
                       ftref.TOL_LOSSES)
    scale = 0.1 * max(abs(ref["eval_logps/chosen"]), abs(ref["eval_logps/rejected"]))
    for k in METRICS:
        if k.startswith("logps/"):
            ftref.assert_close(k, torch.tensor(ours[k]), torch.tensor(ref["eval_" + k]),
                               ftref.TOL_LOSSES)
        else:
            assert abs(ours[k] - ref["eval_" + k]) <= ftref.TOL_LOSSES * scale, (k, ours, ref)
