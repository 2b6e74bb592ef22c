"""The text model inside a multimodal gemma3 checkpoint (Gemma3ForConditionalGeneration),
against transformers 5 + PEFT on a tiny random model made by Gemma3Config (a SigLIP
vision tower of one layer, the projector, a three-layer gemma3 text model):

  - logits and loss (1e-5) and every full-mode gradient (1e-4) of the text model, our
    checkpoint names (language_model.model.*, as save_pretrained writes them) against
    transformers' parameters (model.language_model.*), on text input (no pixel values);
  - a PEFT adapter on the language model (keys base_model.model.model.language_model.*,
    a target regex that leaves the vision tower's q/k/v_proj alone): LoRA logits and
    gradients (1e-4);
  - ft-lora-init's adapter loads in PEFT on Gemma3ForConditionalGeneration with every key
    found and no LoRA module outside the language model, with the base's logits;
  - ft-merge's output loads in transformers as Gemma3ForConditionalGeneration with PEFT's
    merged logits (1e-5), every vision and projector tensor byte-equal to the base's, the
    config's vision_config and top-level keys carried;
  - what is refused: a softcap transformers would not apply, a text_config of another
    family, ft-quantize (no block weights where a causal LM keeps them).

Run:  FT_CONFORM=... FT_LORA_INIT=... FT_MERGE=... FT_QUANTIZE=... .venv/bin/python -m pytest
      -q tests/conformance/test_gemma3_multimodal.py
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import ftref

TEXT = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=64, rms_norm_eps=1e-6, sliding_window=4,
            query_pre_attn_scalar=24, initializer_range=0.1,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                "rope_theta": 1000000.0},
                             "sliding_attention": {"rope_type": "default",
                                                   "rope_theta": 100.0}})
VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
              image_size=28, patch_size=14)
SEVEN_RE = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"
B, T, SEED = 2, 12, 300


def _mm_model(**top):
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    kw = dict(mm_tokens_per_image=4, image_token_index=TEXT["vocab_size"], boi_token_index=93,
              eoi_token_index=94)
    kw.update(top)
    return Gemma3ForConditionalGeneration(Gemma3Config(text_config=dict(TEXT),
                                                       vision_config=dict(VISION), **kw))


def make_mm_dir(root, name="model", **top):
    """The tiny multimodal checkpoint, written by save_pretrained into root/name; top:
    Gemma3Config keys (tie_word_embeddings, image_token_index ...)."""
    torch.manual_seed(SEED)
    m = _mm_model(**top).float()
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():  # Gemma's norms are offsets from 1; the vision tower's are not
        for n, p in m.named_parameters():
            if "language_model" in n and "norm" in n:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif "language_model" not in n:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    d = Path(root) / name
    m.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def mm_dir(tmp_path_factory):
    return make_mm_dir(tmp_path_factory.mktemp("gemma3mm"))


def load_mm(d):
    from transformers import Gemma3ForConditionalGeneration

    m = Gemma3ForConditionalGeneration.from_pretrained(str(d), dtype=torch.float32,
                                                       attn_implementation="eager").float()
    m.eval()
    return m


def ours_name(hf_name):
    """transformers' parameter name -> the checkpoint's (ours)."""
    assert hf_name.startswith("model.language_model."), hf_name
    return "language_model.model." + hf_name[len("model.language_model."):]


def batch():
    return ftref.make_batch(TEXT["vocab_size"], B, T, SEED)


def tool(var, name):
    exe = os.environ.get(var)
    if not exe:
        pytest.skip(f"{var} is not set (the path of bin/{name})")
    return exe


def test_logits_loss_and_full_grads(mm_dir, ft):
    m = load_mm(mm_dir)
    for n, p in m.named_parameters():  # the text model trains; the vision tower has no
        p.requires_grad_(n.startswith("model.language_model."))  # gradient from text
    ids, labels = batch()
    logits, loss, grads = ftref.hf_grads(m, ids, labels)
    ours = ft(dict(model_dir=mm_dir, input_ids=ids, labels=labels, mode="full"), "g3mm-full")
    ftref.assert_close("gemma3 multimodal logits", ours["logits"], logits, ftref.TOL_LOGITS)
    ftref.assert_close("gemma3 multimodal loss", ours["loss"], loss, ftref.TOL_LOGITS)
    text = {ours_name(k): v for k, v in grads.items() if k.startswith("model.language_model.")}
    assert len(text) == 1 + 3 * 13 + 1  # embed, 13 tensors a layer, final norm (tied head)
    ftref.assert_tensor_dict_close("grad.", ours, text, ftref.TOL_GRAD)


def peft_adapter(mm_dir, out, seed=5):
    from peft import LoraConfig, get_peft_model

    m = load_mm(mm_dir)
    pm = get_peft_model(m, LoraConfig(r=4, lora_alpha=8, target_modules=SEVEN_RE,
                                      lora_dropout=0.0, init_lora_weights=False))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if ".lora_" in n:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
    pm.save_pretrained(out)
    return out


def peft_model(mm_dir, adapter, trainable=False):
    from peft import PeftModel

    pm = PeftModel.from_pretrained(load_mm(mm_dir), str(adapter), is_trainable=trainable)
    pm.eval()
    return pm


def test_peft_adapter_lora_grads(mm_dir, ft, tmp_path):
    adapter = peft_adapter(mm_dir, tmp_path / "adapter")
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and all(k.startswith("base_model.model.model.language_model.layers.")
                        for k in keys), keys[:4]
    pm = peft_model(mm_dir, adapter, trainable=True)
    ids, labels = batch()
    logits, loss, grads = ftref.hf_grads(pm, ids, labels, key=ftref.peft_key)
    ours = ft(dict(model_dir=mm_dir, adapter_dir=adapter, input_ids=ids, labels=labels,
                   mode="lora"), "g3mm-lora")
    ftref.assert_close("gemma3 multimodal lora logits", ours["logits"], logits,
                       ftref.TOL_LOGITS)
    ftref.assert_close("gemma3 multimodal lora loss", ours["loss"], loss, ftref.TOL_LOGITS)
    assert len(grads) == 3 * 7 * 2
    ftref.assert_tensor_dict_close("grad.", ours, grads, ftref.TOL_GRAD)


def test_lora_init_loads_in_peft(mm_dir, tmp_path):
    exe = tool("FT_LORA_INIT", "ft-lora-init")
    out = tmp_path / "init"
    subprocess.run([exe, "--model", str(mm_dir), "--out", str(out), "--r", "4", "--alpha",
                    "8", "--target", "all-linear"], check=True, capture_output=True)
    cfg = json.loads((out / "adapter_config.json").read_text())
    # a regex over the language model's modules, which PEFT matches with re.fullmatch
    assert isinstance(cfg["target_modules"], str), cfg["target_modules"]
    pm = peft_model(mm_dir, out)
    wrapped = [n for n, mod in pm.named_modules() if hasattr(mod, "lora_A")]
    assert len(wrapped) == 3 * 7, wrapped
    assert all(".language_model.layers." in n for n in wrapped), wrapped
    # every saved key found (B = 0: the base's logits), nothing left at PEFT's own init
    with safe_open(str(out / "adapter_model.safetensors"), "pt") as f:
        saved = {k: f.get_tensor(k) for k in f.keys()}
    state = {ftref.peft_key(n): p for n, p in pm.named_parameters() if ".lora_" in n}
    assert set(saved) == set(state)
    for k, v in saved.items():
        assert torch.equal(state[k].detach(), v), k
    ids, _ = batch()
    base = load_mm(mm_dir)
    with torch.no_grad():
        ftref.assert_close("lora-init logits", pm(input_ids=ids).logits,
                           base(input_ids=ids).logits, ftref.TOL_LOGITS)


def test_merge_loads_with_vision_carried(mm_dir, tmp_path):
    exe = tool("FT_MERGE", "ft-merge")
    adapter = peft_adapter(mm_dir, tmp_path / "adapter", seed=6)
    out = tmp_path / "merged"
    subprocess.run([exe, "--model", str(mm_dir), "--adapter", str(adapter), "--out", str(out)],
                   check=True, capture_output=True)
    ids, _ = batch()
    pm = peft_model(mm_dir, adapter)
    with torch.no_grad():
        ref = pm.merge_and_unload()(input_ids=ids).logits
        merged = load_mm(out)(input_ids=ids).logits
    ftref.assert_close("merged multimodal logits", merged, ref, ftref.TOL_LOGITS)
    # the vision tower and projector: every tensor, byte for byte
    with safe_open(str(mm_dir / "model.safetensors"), "pt") as a, \
            safe_open(str(out / "model.safetensors"), "pt") as b:
        carried = [k for k in a.keys() if not k.startswith("language_model.")]
        assert carried and any(k.startswith("vision_tower.") for k in carried)
        assert any(k.startswith("multi_modal_projector.") for k in carried)
        assert set(b.keys()) == set(a.keys())
        for k in carried:
            x, y = a.get_tensor(k), b.get_tensor(k)
            assert x.dtype == y.dtype and torch.equal(x, y), k
    src = json.loads((mm_dir / "config.json").read_text())
    got = json.loads((out / "config.json").read_text())
    assert got["model_type"] == "gemma3" and got["vision_config"] == src["vision_config"]
    assert got["text_config"] == src["text_config"]


@pytest.mark.parametrize("patch,key", [
    ({"text_config": {"final_logit_softcapping": 30.0}}, "final_logit_softcapping"),
    ({"text_config": {"attn_logit_softcapping": 50.0}}, "attn_logit_softcapping"),
    ({"text_config": {"model_type": "gemma2"}}, "text_config.model_type"),
    ({"architectures": ["Gemma3ForCausalLM"]}, "architectures"),
])
def test_refused(mm_dir, tmp_path, ft_raw, patch, key):
    d = tmp_path / "bad"
    ftref.copy_model_dir(mm_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in patch.items():
        if isinstance(v, dict):
            cfg[k].update(v)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    ids, labels = batch()
    cp, _ = ft_raw(dict(model_dir=d, input_ids=ids, labels=labels, mode="eval"), "g3mm-bad")
    assert cp.returncode != 0
    assert key in cp.stderr and "config.json" in cp.stderr, cp.stderr


def test_quantize_tool_refuses(mm_dir, tmp_path):
    exe = tool("FT_QUANTIZE", "ft-quantize")
    cp = subprocess.run([exe, "--model", str(mm_dir), "--out", str(tmp_path / "q")],
                        capture_output=True, text=True)
    assert cp.returncode != 0
    assert "model.layers.N" in cp.stderr, cp.stderr


@pytest.mark.parametrize("mode", ["full", "qlora"])
def test_train_tool(mm_dir, tmp_path, mode):
    """ft-train on the multimodal checkpoint: QLoRA (NF4 on load) trains and writes an
    adapter PEFT loads on Gemma3ForConditionalGeneration; full fine-tuning is refused (its
    final model would lack the vision tower)."""
    exe = tool("FT_TRAIN", "ft-train")
    d = tmp_path / "model"
    ftref.copy_model_dir(mm_dir, d)
    demo = Path(__file__).resolve().parents[2] / "demo" / "model"
    for name in ("tokenizer.json", "tokenizer_config.json"):  # the data is pre-tokenized
        (d / name).write_bytes((demo / name).read_bytes())
    data = tmp_path / "ids.jsonl"
    ids, _ = batch()
    data.write_text("".join(json.dumps({"input_ids": row}) + "\n" for row in ids.tolist() * 4))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model:\n  name: {d}\n  max_seq_len: 16\ntuning:\n  mode: {mode}\n"
                   f"train:\n  batch_size: 2\n  max_steps: 2\n  output_dir: {tmp_path / 'run'}\n"
                   f"data:\n  train_path: {data}\n  eval_path: \"\"\n")
    cp = subprocess.run([exe, "--config", str(cfg)], capture_output=True, text=True)
    if mode == "full":
        assert cp.returncode != 0
        assert "tuning.mode full" in cp.stderr and "vision tower" in cp.stderr, cp.stderr
        return
    assert cp.returncode == 0, cp.stderr
    final = tmp_path / "run" / "final"
    pm = peft_model(mm_dir, final)
    wrapped = [n for n, mod in pm.named_modules() if hasattr(mod, "lora_A")]
    assert wrapped and all(".language_model.layers." in n for n in wrapped), wrapped
