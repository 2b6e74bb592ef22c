"""ft-train end to end on a tiny Llama made by transformers, with a tokenizer trained by
`tokenizers` beside it:

- the loss printed on stderr falls, and TensorBoard's own reader finds the same values at
  the same steps (train/loss, learning rate, grad norm, tokens/s, memory, eval/loss,
  eval/perplexity) and the resolved config as text;
- the final adapter loads in PEFT with every key matched; a full run's final dir loads in
  transformers;
- resuming from a checkpoint gives bitwise the adapter and losses of the uninterrupted
  run; SIGTERM saves a checkpoint and exits 130; a checkpoint of another mode is refused;
- a bad config fails before any work, naming the key.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

FT_TRAIN = os.environ.get("FT_TRAIN")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    assert FT_TRAIN, "FT_TRAIN must be the path of bin/ft-train"
    d = tmp_path_factory.mktemp("train_tool")
    rows = [{"prompt": f"Q: colour of item {i}?", "completion": f" {['red', 'green', 'blue'][i % 3]}"}
            for i in range(60)]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator([r["prompt"] + r["completion"] for r in rows],
                           trainers.BpeTrainer(vocab_size=280, special_tokens=["<|endoftext|>"],
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                               show_progress=False))
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|endoftext|>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=tk.get_vocab_size(), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, eos_token_id=hf.eos_token_id)
    LlamaForCausalLM(cfg).save_pretrained(d / "model")
    hf.save_pretrained(d / "model")
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:50]))
    (d / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[50:]))
    return d


def write_config(d, name, **train):
    t = dict(batch_size=4, grad_accum=2, max_steps=6, learning_rate=1e-2, warmup_steps=1,
             logging_steps=1, eval_strategy="steps", eval_steps=3, save_steps=3,
             output_dir=str(d / name))
    t.update(train)
    text = (f"model:\n  name: {d / 'model'}\n  max_seq_len: 32\n"
            "tuning:\n  mode: lora\n  lora:\n    r: 4\n    alpha: 8\n    dropout: 0.1\n"
            "train:\n" + "".join(f"  {k}: {v}\n" for k, v in t.items()) +
            f"data:\n  train_path: {d / 'train.jsonl'}\n  eval_path: {d / 'eval.jsonl'}\n")
    p = d / f"{name}.yaml"
    p.write_text(text)
    return p


def train(cfg, *args, check=True):
    out = subprocess.run([FT_TRAIN, "--config", str(cfg), *args], capture_output=True,
                         text=True)
    if check:
        assert out.returncode == 0, out.stderr
    return out


def printed_losses(stderr):
    return {int(m.group(1)): float(m.group(2))
            for m in re.finditer(r"^step (\d+)/\d+ \| loss ([0-9.]+)", stderr, re.M)}


def tb_scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_trains_and_logs(workdir):
    out = train(write_config(workdir, "run_a"))
    final = Path(out.stdout.strip())
    assert final == workdir / "run_a" / "final"
    losses = printed_losses(out.stderr)
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert losses[6] < losses[1]
    acc = tb_scalars(workdir / "run_a")
    tags = set(acc.Tags()["scalars"])
    for tag in ["train/loss", "train/learning_rate", "train/grad_norm",
                "train/tokens_per_second", "eval/loss", "eval/perplexity",
                "memory/weights_peak_bytes"]:
        assert tag in tags, tag
    tb = {e.step: e.value for e in acc.Scalars("train/loss")}
    assert sorted(tb) == sorted(losses)
    for step, v in losses.items():
        assert abs(tb[step] - v) <= 5e-5, (step, tb[step], v)
    assert [e.step for e in acc.Scalars("eval/loss")] == [3, 6]
    assert "config" in " ".join(acc.Tags()["tensors"])
    assert (workdir / "run_a" / "config.yaml").read_text().startswith("model:")


def test_final_adapter_loads_in_peft(workdir):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM
    final = workdir / "run_a" / "final"
    base = LlamaForCausalLM.from_pretrained(workdir / "model")
    m = PeftModel.from_pretrained(base, final)
    ours = load_file(final / "adapter_model.safetensors")
    sd = {k.replace(".default", ""): v for k, v in m.state_dict().items() if "lora_" in k}
    assert set(ours) == set(sd)
    for k, v in ours.items():
        assert torch.equal(v, sd[k]), k


def test_resume_is_bitwise(workdir):
    """Run B stops after checkpoint-3 (copied from A) and resumes: same losses after, same
    final adapter, bit for bit (dropout masks included)."""
    b = workdir / "run_b"
    b.mkdir()
    shutil.copytree(workdir / "run_a" / "checkpoint-3", b / "checkpoint-3")
    out = train(write_config(workdir, "run_b"), "--resume", "auto")
    assert "resumed from" in out.stderr
    got = printed_losses(out.stderr)
    assert sorted(got) == [4, 5, 6]
    acc = tb_scalars(workdir / "run_a")
    want = {e.step: e.value for e in acc.Scalars("train/loss")}
    for step, v in got.items():
        assert abs(want[step] - v) <= 5e-5, (step, want[step], v)
    a = (workdir / "run_a" / "final" / "adapter_model.safetensors").read_bytes()
    assert (b / "final" / "adapter_model.safetensors").read_bytes() == a


def test_sigterm_saves_and_exits_130(workdir):
    cfg = write_config(workdir, "run_sig", max_steps=100000, save_steps=100000, eval_strategy="no")
    p = subprocess.Popen([FT_TRAIN, "--config", str(cfg)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    seen = ""
    while time.time() < deadline:
        line = p.stderr.readline()
        seen += line
        if re.match(r"step 5/", line):
            break
    p.send_signal(signal.SIGTERM)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 130, seen + stderr
    ckpt = Path(stdout.strip())
    assert ckpt.parent == workdir / "run_sig" and ckpt.name.startswith("checkpoint-")
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["format"] == "ftkit-trainer-state" and state["global_step"] >= 5


def test_resume_refuses_other_mode(workdir):
    c = workdir / "run_c"
    c.mkdir()
    shutil.copytree(workdir / "run_a" / "checkpoint-3", c / "checkpoint-3")
    out = train(write_config(workdir, "run_c"), "--resume", "auto", "--set", "tuning.mode=full",
                check=False)
    assert out.returncode == 1 and "refusing to resume" in out.stderr and "mode" in out.stderr


def test_full_mode_final_loads_in_transformers(workdir):
    from transformers import LlamaForCausalLM
    out = train(write_config(workdir, "run_full", max_steps=2, save_steps=10), "--set",
                "tuning.mode=full")
    final = Path(out.stdout.strip())
    m = LlamaForCausalLM.from_pretrained(final)
    base = LlamaForCausalLM.from_pretrained(workdir / "model")
    w0 = base.model.layers[0].mlp.up_proj.weight
    assert not torch.equal(m.model.layers[0].mlp.up_proj.weight, w0)


def test_bad_config_fails_before_work(workdir):
    cfg = write_config(workdir, "run_bad", learnig_rate=1)
    out = train(cfg, check=False)
    assert out.returncode == 1
    assert "did you mean 'train.learning_rate'" in out.stderr
    assert not (workdir / "run_bad").exists()


def test_predict_with_generate_logs_rouge(workdir):
    out = train(write_config(workdir, "run_gen", max_steps=3, eval_steps=3,
                             predict_with_generate="true", generation_max_new_tokens=4))
    assert re.search(r"^eval step 3 \| rougeL [0-9.]+ \| exact_match [0-9.]+ \| 10 generated",
                     out.stderr, re.M), out.stderr
    acc = tb_scalars(workdir / "run_gen")
    assert [e.step for e in acc.Scalars("eval/rougeL")] == [3]
    assert [e.step for e in acc.Scalars("eval/exact_match")] == [3]


def _ref_samples(tok, rows):
    """ids / labels of prompt/completion records as the data pipeline makes them:
    tok(prompt + completion) + [eos], the prompt's tokens -100 (test_eval.py's rule)."""
    out = []
    for r in rows:
        ids = tok(r["prompt"] + r["completion"]).input_ids
        if ids[-1] != tok.eos_token_id:
            ids = ids + [tok.eos_token_id]
        labels = list(ids)
        n = len(tok(r["prompt"]).input_ids)
        labels[:n] = [-100] * n
        out.append((ids, labels))
    return out


def _peft_eval_loss(model, samples):
    """The mean loss over every counted token of the set, as ft-train's evaluation."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ids, labels in samples:
            n = sum(1 for x in labels[1:] if x != -100)
            loss = model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss
            total += float(loss.double()) * n
            count += n
    return total / count


def test_eval_has_no_dropout(workdir):
    """Evaluation runs without LoRA dropout. The run starts from an adapter whose B is not
    zero (a fresh adapter has B = 0, where dropout on the LoRA input changes nothing) and
    trains at learning rate 0, so its logged eval loss must equal PEFT's loss of that
    adapter in eval mode (2e-5 relative: metrics.jsonl keeps 6 digits), at every
    evaluation. PEFT in train mode (lora_dropout 0.1 active) is checked to land far from
    it, so dropout left on in ft-train's evaluation cannot pass unseen."""
    import ftref
    from transformers import AutoTokenizer
    init = ftref.build_adapter(workdir / "model", workdir / "nodrop_init",
                               target_modules=list(ftref.SEVEN), r=4, lora_alpha=8, seed=5)
    acfg = json.loads((init / "adapter_config.json").read_text())
    acfg["lora_dropout"] = 0.1  # as the run's tuning.lora.dropout
    (init / "adapter_config.json").write_text(json.dumps(acfg))
    cfg = write_config(workdir, "run_nodrop", max_steps=2, eval_steps=1, learning_rate=0.0,
                       warmup_steps=0, save_steps=100)
    train(cfg, "--set", f"tuning.lora.init_adapter={init}")
    rows = [json.loads(l) for l in (workdir / "run_nodrop" / "metrics.jsonl").read_text().splitlines()]
    evals = [r["eval_loss"] for r in rows if "eval_loss" in r]
    assert len(evals) == 2, rows
    tok = AutoTokenizer.from_pretrained(workdir / "model")
    eval_rows = [json.loads(l) for l in (workdir / "eval.jsonl").read_text().splitlines()]
    samples = _ref_samples(tok, eval_rows)
    model = ftref.lora_mode_model(workdir / "model", init)
    want = _peft_eval_loss(model, samples)
    for got in evals:
        assert abs(got - want) <= 2e-5 * want, (evals, want)
    model.train()  # PEFT's lora_dropout (0.1) now active
    torch.manual_seed(0)
    with_dropout = _peft_eval_loss(model, samples)
    assert abs(with_dropout - want) > 100 * 2e-5 * want, (with_dropout, want)


FT_LORA_INIT = os.environ.get("FT_LORA_INIT")
FT_EVAL = os.environ.get("FT_EVAL")
FT_MERGE = os.environ.get("FT_MERGE")


def tool(args, stdin=None):
    out = subprocess.run(args, input=stdin, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out


def test_user_chain_lora_init_train_eval_merge_with_stdin(workdir):
    """lora-init -> train (starting from that adapter, data piped in) -> eval (data piped
    in) -> merge, as a user chains the tools; the merged model loads in transformers."""
    from transformers import LlamaForCausalLM
    assert FT_LORA_INIT and FT_EVAL and FT_MERGE, "FT_LORA_INIT, FT_EVAL and FT_MERGE must be set"
    init = workdir / "chain_init"
    tool([FT_LORA_INIT, "--model", str(workdir / "model"), "--out", str(init), "--r", "4",
          "--alpha", "8", "--dropout", "0.1", "--target", "all-linear", "--seed", "3"])
    cfg = write_config(workdir, "chain", max_steps=8, eval_strategy="no")
    train_data = (workdir / "train.jsonl").read_text()
    out = tool([FT_TRAIN, "--config", str(cfg), "--set", f"tuning.lora.init_adapter={init}",
                "--set", "data.train_path=-", "--set", "data.eval_path="], stdin=train_data)
    final = Path(out.stdout.strip())
    eval_data = (workdir / "eval.jsonl").read_text()
    before = json.loads(tool([FT_EVAL, "--model", str(workdir / "model"), "--adapter", str(init),
                              "--data", "-", "--json"], stdin=eval_data).stdout)
    after = json.loads(tool([FT_EVAL, "--model", str(workdir / "model"), "--adapter", str(final),
                             "--data", "-", "--json"], stdin=eval_data).stdout)
    assert after["loss"] < before["loss"] and after["tokens"] == before["tokens"] > 0
    merged = workdir / "chain_merged"
    tool([FT_MERGE, "--model", str(workdir / "model"), "--adapter", str(final), "--out",
          str(merged), "--dtype", "f32"])
    merged_eval = json.loads(tool([FT_EVAL, "--model", str(merged), "--data", "-", "--json"],
                                  stdin=eval_data).stdout)
    assert abs(merged_eval["loss"] - after["loss"]) <= 1e-5 * after["loss"]
    LlamaForCausalLM.from_pretrained(merged)


def kill_after(cfg, marker, timeout=60):
    """Starts ft-train on cfg and kills it with SIGKILL as soon as stderr shows marker
    (e.g. "checkpoint-4", the line of a saved checkpoint); returns what it printed."""
    p = subprocess.Popen([FT_TRAIN, "--config", str(cfg)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    seen = ""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = p.stderr.readline()
        seen += line
        if marker in line or not line:
            break
    p.kill()
    p.wait()
    assert marker in seen, seen
    return seen


def test_resume_after_kill_9_gives_equal_losses(workdir):
    """A run killed with SIGKILL right after a checkpoint resumes with --resume auto and
    ends with the losses and the adapter of the uninterrupted run, bit for bit."""
    ref = train(write_config(workdir, "k9_ref", max_steps=40, save_steps=2, eval_strategy="no"))
    cfg = write_config(workdir, "k9", max_steps=40, save_steps=2, eval_strategy="no")
    kill_after(cfg, "checkpoint-4")
    out = train(cfg, "--resume", "auto")
    assert "resumed from" in out.stderr
    want = printed_losses(ref.stderr)
    got = printed_losses(out.stderr)
    assert got and all(got[s] == want[s] for s in got), (got, want)
    acc_ref = {e.step: e.value for e in tb_scalars(workdir / "k9_ref").Scalars("train/loss")}
    for s, v in got.items():
        assert abs(acc_ref[s] - v) <= 5e-5
    assert (workdir / "k9" / "final" / "adapter_model.safetensors").read_bytes() == \
        (workdir / "k9_ref" / "final" / "adapter_model.safetensors").read_bytes()


def test_out_of_memory_prints_the_plan_and_an_override_that_fits(workdir):
    """With the tracked allocator capped (FT_MEM_LIMIT) below what the run needs, ft-train
    fails naming the allocation, after the memory plan and the overrides that fit; the
    first override it offers then trains under the same cap (the cpu plan is exact, and
    packed rows are max_seq_len long, so the run allocates what the plan says)."""
    cfg = write_config(workdir, "oom", max_steps=2, eval_strategy="no", batch_size=8,
                       grad_accum=1)
    base = [FT_TRAIN, "--config", str(cfg), "--set", "data.packing=true"]
    plan = subprocess.run(base + ["--plan"], capture_output=True, text=True)
    assert plan.returncode == 0, plan.stderr
    m = re.search(r"^cpu-fp32\*\s+1(?:\s+[\d.]+){5}\s+([\d.]+)", plan.stdout, re.M)
    assert m, plan.stdout
    limit = str(int(float(m.group(1)) * 0.9 * 2**20))
    env = dict(os.environ, FT_MEM_LIMIT=limit)
    out = subprocess.run(base, capture_output=True, text=True, env=env)
    assert out.returncode == 1, out.stderr[-2000:]
    err = out.stderr
    assert "ft-train: out of memory on rank 0. The plan of this run, per rank:" in err
    assert "(FT_MEM_LIMIT); this run plans" in err
    assert re.search(r"error: .*out of memory allocating .* did not fit beside .* live "
                     r"\(limit [\d.]+ MiB\)", err), err[-2000:]
    offers = err.split("overrides that fit by the plan")[1].splitlines()[1:]
    first = offers[0].split("plans")[0]
    sets = [tok for tok in first.split() if re.fullmatch(r"[A-Z_]+=\S+", tok)]
    assert sets and sets[0].startswith("TRAIN_BATCH_SIZE="), offers
    args = [a for s in sets for a in ("--set-var", s)]
    ok = subprocess.run(base + args, capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr[-2000:]
