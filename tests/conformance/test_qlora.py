"""QLoRA: LoRA on a base whose layer weights are quantized (NF4, FP4, int8) on load.

- the dequantized weights lie within the format's error bound of the originals
  (4-bit: half the largest gap between neighbouring codes times the block's absmax, plus
  the double-quantized absmax's error; int8: scb / 254);
- logits, loss and every LoRA gradient on the quantized base equal transformers + PEFT
  on a model holding exactly those dequantized weights (bitsandbytes' Linear4bit
  computes dequantize(W) x; the math is the same) at the usual tolerances;
- embeddings, norms and lm_head stay dense (bit for bit the checkpoint's).
"""

import numpy as np
import pytest
import torch

import ftref

B = 2

NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
       -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
       0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
       0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]
FP4 = [v / 12 for v in [0, 0.0625, 8, 12, 4, 6, 2, 3, -0, -0.0625, -8, -12, -4, -6, -2, -3]]

CASES = [
    ("llama_gqa", "all7", dict(type="nf4", blocksize=64, double_quant=True)),
    ("llama_gqa", "all7", dict(type="nf4", blocksize=32, double_quant=False)),
    ("llama_gqa", "qv", dict(type="fp4", blocksize=64, double_quant=True)),
    ("llama_gqa", "all-linear", dict(type="int8")),
    ("qwen2", "all7", dict(type="nf4", blocksize=128, double_quant=True)),
    ("tied", "qv", dict(type="nf4", blocksize=64, double_quant=True)),
    ("granite", "all7", dict(type="nf4", blocksize=64, double_quant=True)),
    ("gemma", "all7", dict(type="nf4", blocksize=64, double_quant=True)),
    ("phi3", "all4", dict(type="nf4", blocksize=64, double_quant=True)),
    ("phi4_mini", "qkv_down", dict(type="int8")),
    ("smollm3", "all7", dict(type="nf4", blocksize=64, double_quant=True)),
    ("gemma2", "all7", dict(type="nf4", blocksize=64, double_quant=True)),
    ("gemma3", "all7", dict(type="nf4", blocksize=64, double_quant=True)),
    ("gemma3_legacy", "qv", dict(type="int8")),
    ("olmo2", "all7", dict(type="nf4", blocksize=64, double_quant=True)),
    ("qwen3", "all7", dict(type="nf4", blocksize=64, double_quant=True)),
    ("qwen3_tied", "all-linear", dict(type="int8")),
    # modules_to_save on a quantized base: the embedding and the head (dense) trained in full
    ("llama_gqa", "mts_both", dict(type="nf4", blocksize=64, double_quant=True)),
    ("olmo2", "mts_both", dict(type="int8")),
    # DoRA on a quantized base: the row norms of the dequantized W + s B A
    ("llama_gqa", "dora_all", dict(type="nf4", blocksize=64, double_quant=True)),
    ("phi3", "dora_all", dict(type="nf4", blocksize=64, double_quant=True)),
    ("qwen3", "dora_all", dict(type="int8")),
]


def _bound(w, q):
    """Per-element error bound of quantizing w (numpy [rows, cols]) as q says."""
    flat = w.reshape(-1).astype(np.float64)
    if q["type"] == "int8":
        scb = np.abs(w).max(axis=1, keepdims=True)
        return np.broadcast_to(scb / 254 * (1 + 1e-5) + 1e-7, w.shape).reshape(-1)
    code = np.sort(np.array(NF4 if q["type"] == "nf4" else FP4))
    half_gap = np.max(np.diff(code)) / 2
    bs = q["blocksize"]
    n = flat.size
    nb = (n + bs - 1) // bs
    absmax = np.array([np.abs(flat[i * bs:(i + 1) * bs]).max() for i in range(nb)])
    # double quantization: the 8-bit absmax is off by at most a few percent of its range
    slack = 1.0 + (0.02 if q.get("double_quant") else 1e-6)
    per_block = absmax * half_gap * slack + absmax * (0.02 if q.get("double_quant") else 0) + 1e-7
    return np.repeat(per_block, bs)[:n]


@pytest.fixture(scope="module", params=CASES,
                ids=[f"{m}-{v}-{q['type']}{q.get('blocksize', '')}" for m, v, q in CASES])
def case(request, store, ft, tmp_path_factory):
    model_name, variant, q = request.param
    shape = ftref.SHAPES[model_name]
    model_dir = store.model(model_name)
    adapter_dir = store.adapter(model_name, variant)
    m = ftref.load_hf(model_dir)
    ids, labels = ftref.make_batch(m.config.vocab_size, B, shape.T, shape.seed + 1)
    out = ft(dict(model_dir=model_dir, adapter_dir=adapter_dir, mode="lora", input_ids=ids,
                  labels=labels, quant=q), f"qlora-{model_name}-{variant}-{q['type']}")
    # the reference: the same model with our dequantized weights, PEFT on top
    deq = {k[len("dequant."):]: v for k, v in out.items() if k.startswith("dequant.")}
    ref_dir = tmp_path_factory.mktemp("dequant") / "model"
    sd = m.state_dict()
    for k, v in deq.items():
        sd[k] = v.to(sd[k].dtype)
    m.load_state_dict(sd)
    m.save_pretrained(ref_dir, safe_serialization=True)
    ref = ftref.lora_mode_model(ref_dir, adapter_dir)
    logits, loss, grads = ftref.hf_grads(ref, ids, labels, key=ftref.ours_key)
    return dict(q=q, out=out, deq=deq, orig=ftref.load_hf(model_dir).state_dict(),
                logits=logits, loss=loss, grads=grads, layers=m.config.num_hidden_layers,
                modules=ftref.linear_modules(shape))


def test_every_layer_linear_is_quantized(case):
    paths = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
             "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp",
             "qkv_proj": "self_attn", "gate_up_proj": "mlp"}
    want = {f"model.layers.{l}.{paths[p]}.{p}.weight" for l in range(case["layers"])
            for p in case["modules"]}
    assert set(case["deq"]) == want


def test_dequantized_within_bound(case):
    for name, d in case["deq"].items():
        w = case["orig"][name].float().numpy()
        err = np.abs(d.numpy().reshape(-1) - w.reshape(-1))
        bound = _bound(w, case["q"])
        worst = np.max(err - bound)
        assert worst <= 0, (name, float(np.max(err)), float(np.max(bound)))
        assert np.max(err) > 0  # it was quantized, not copied


def test_qlora_logits_loss(case):
    ftref.assert_close("qlora logits", case["out"]["logits"], case["logits"], ftref.TOL_LOGITS)
    ftref.assert_close("qlora loss", case["out"]["loss"], case["loss"], ftref.TOL_LOGITS)


def test_qlora_grads(case):
    ftref.assert_tensor_dict_close("grad.", case["out"], case["grads"], ftref.TOL_GRAD)
