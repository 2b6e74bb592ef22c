"""ft-train with tuning.mode qlora: LoRA on a base quantized on load (NF4 with double
quantization by default; FP4 and int8 too), end to end:

- it trains (the loss falls) and the adapter loads in PEFT like any LoRA adapter;
- the base really is quantized: the losses differ from LoRA on the dense base, a little;
  the weights category in TensorBoard's memory tags is smaller than LoRA's;
- the checkpoint's stamp says nf4, a resume is bitwise, and a resume under another
  quantization is refused;
- a bad tuning.quant value fails before any work.
"""

import json
import shutil

import pytest
import torch

import ftref

from test_train_tool import printed_losses, tb_scalars, train, workdir, write_config  # noqa: F401


def _run(workdir, name, *sets, **train_keys):
    args = [a for s in sets for a in ("--set", s)]
    return train(write_config(workdir, name, **train_keys), *args)


@pytest.fixture(scope="module")
def runs(workdir):
    lora = _run(workdir, "q_lora")
    qlora = _run(workdir, "q_nf4", "tuning.mode=qlora")
    return dict(lora=lora, qlora=qlora)


def test_qlora_trains_and_adapter_loads_in_peft(workdir, runs):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM
    losses = printed_losses(runs["qlora"].stderr)
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    assert losses[6] < losses[1]
    final = workdir / "q_nf4" / "final"
    m = PeftModel.from_pretrained(LlamaForCausalLM.from_pretrained(workdir / "model"), final)
    ours = load_file(final / "adapter_model.safetensors")
    sd = {k.replace(".default", ""): v for k, v in m.state_dict().items() if "lora_" in k}
    assert set(ours) == set(sd)


def test_qlora_is_quantized(workdir, runs):
    lo, q = printed_losses(runs["lora"].stderr), printed_losses(runs["qlora"].stderr)
    assert lo[1] != q[1]  # the base differs ...
    assert abs(lo[1] - q[1]) < 0.05 * lo[1]  # ... by the quantization error only
    w = {}
    for name in ["q_lora", "q_nf4"]:
        acc = tb_scalars(workdir / name)
        w[name] = acc.Scalars("memory/weights_peak_bytes")[-1].value
    assert w["q_nf4"] < w["q_lora"]


def test_qlora_checkpoint_stamp_and_bitwise_resume(workdir, runs):
    state = json.loads((workdir / "q_nf4" / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["stamp"]["quant"] == "nf4" and state["stamp"]["mode"] == "qlora"
    b = workdir / "q_nf4_b"
    b.mkdir()
    shutil.copytree(workdir / "q_nf4" / "checkpoint-3", b / "checkpoint-3")
    out = train(write_config(workdir, "q_nf4_b"), "--set", "tuning.mode=qlora", "--resume",
                "auto")
    got = printed_losses(out.stderr)
    want = printed_losses(runs["qlora"].stderr)
    assert sorted(got) == [4, 5, 6]
    for step, v in got.items():
        assert v == want[step], (step, v, want[step])
    a = (workdir / "q_nf4" / "final" / "adapter_model.safetensors").read_bytes()
    assert (b / "final" / "adapter_model.safetensors").read_bytes() == a


def test_resume_refuses_other_quantization(workdir, runs):
    c = workdir / "q_fp4_c"
    c.mkdir()
    shutil.copytree(workdir / "q_nf4" / "checkpoint-3", c / "checkpoint-3")
    out = train(write_config(workdir, "q_fp4_c"), "--set", "tuning.mode=qlora", "--set",
                "tuning.quant.type=fp4", "--resume", "auto", check=False)
    assert out.returncode == 1 and "refusing to resume" in out.stderr and "quant" in out.stderr


@pytest.mark.parametrize("sets", [["tuning.quant.type=fp4", "tuning.quant.double_quant=false"],
                                  ["tuning.quant.type=int8"],
                                  ["tuning.quant.blocksize=32", "train.gradient_checkpointing=true"]],
                         ids=["fp4", "int8", "nf4-bs32-ckpt"])
def test_other_formats_train(workdir, sets):
    name = "q_" + sets[0].split("=")[1]
    out = _run(workdir, name, "tuning.mode=qlora", *sets, max_steps=3, eval_strategy="no",
               save_steps=100)
    losses = printed_losses(out.stderr)
    assert sorted(losses) == [1, 2, 3] and all(v == v and v > 0 for v in losses.values())
    assert (workdir / name / "final" / "adapter_model.safetensors").exists()


@pytest.mark.parametrize("sets,want", [
    (["tuning.quant.blocksize=48"], "tuning.quant.blocksize"),
    (["tuning.quant.type=int4"], "tuning.quant.type"),
    (["tuning.quant.blocksize=8192"], "tuning.quant.blocksize"),
])
def test_bad_quant_config_fails_before_work(workdir, sets, want):
    name = "q_bad"
    args = ["--set", "tuning.mode=qlora"] + [a for s in sets for a in ("--set", s)]
    out = train(write_config(workdir, name), *args, check=False)
    assert out.returncode != 0 and want in out.stderr, out.stderr
    assert not (workdir / name / "final").exists()


def _tool(var, *args):
    name = {"FT_QUANTIZE": "ft-quantize", "FT_EVAL": "ft-eval", "FT_MERGE": "ft-merge"}[var]
    return ftref.run_tool([ftref.tool_exe(var, name), *args])


@pytest.fixture(scope="module")
def chain(workdir, runs):
    """The user's QLoRA chain: ft-quantize -> ft-train (on the quantized dir) -> ft-eval
    and ft-merge on the quantized base."""
    q = workdir / "model-nf4"
    _tool("FT_QUANTIZE", "--model", workdir / "model", "--out", q)
    cfg = write_config(workdir, "q_prequant")
    cfg.write_text(cfg.read_text().replace(str(workdir / "model"), str(q)))
    trained = train(cfg, "--set", "tuning.mode=qlora")
    return dict(q=q, trained=trained, adapter=workdir / "q_prequant" / "final")


def test_training_on_ft_quantize_output_equals_quantizing_on_load(chain, runs):
    """The same NF4 base either way: the same losses, bit for bit, and the same adapter."""
    assert printed_losses(chain["trained"].stderr) == printed_losses(runs["qlora"].stderr)


def test_eval_and_merge_on_the_quantized_base(workdir, chain):
    """ft-eval of quantized base + adapter equals ft-eval of the merged dense model (fp32
    merge); the default merge is bf16 without quantization_config and loads in
    transformers."""
    from transformers import LlamaForCausalLM
    data = workdir / "eval.jsonl"
    ev = json.loads(_tool("FT_EVAL", "--model", chain["q"], "--adapter", chain["adapter"],
                          "--data", data, "--max-seq-len", 32, "--json").stdout)
    merged = workdir / "q_merged_f32"
    _tool("FT_MERGE", "--model", chain["q"], "--adapter", chain["adapter"], "--out", merged,
          "--dtype", "f32")
    ev_m = json.loads(_tool("FT_EVAL", "--model", merged, "--data", data, "--max-seq-len", 32,
                            "--json").stdout)
    assert ev["tokens"] == ev_m["tokens"] > 0
    assert abs(ev["loss"] - ev_m["loss"]) <= 1e-5 * abs(ev_m["loss"]), (ev, ev_m)
    bf = workdir / "q_merged"
    _tool("FT_MERGE", "--model", chain["q"], "--adapter", chain["adapter"], "--out", bf)
    cfg = json.loads((bf / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["torch_dtype"] == cfg["dtype"] == "bfloat16"
    m = LlamaForCausalLM.from_pretrained(bf, dtype="auto")
    assert m.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16
