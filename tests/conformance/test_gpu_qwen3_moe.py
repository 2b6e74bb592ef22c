"""Qwen3-MoE (test_qwen3_moe.py's shapes) on the GPU path, as test_gpu_moe.py does for
mixtral: fp32 and bf16, full fine-tuning, LoRA on attention and all-linear (router and
experts too), logits, loss and every gradient (router, experts, per-head q/k norms, their
LoRA pairs) against transformers + PEFT in fp32, fp32 against our CPU model too, and QLoRA against our CPU QLoRA. The batches are chosen clear
of routing ties (test_gpu_moe.py's margin). Runs where test_gpu_moe.py runs (a CUDA GPU,
or FT_EMU=1 with the emulated build's harness)."""

import pytest
import torch

import ftref
from test_gpu_model import BF16_TOL_GRAD, BF16_TOL_LOGITS, BF16_TOL_LOSS
from test_gpu_moe import B, EMU, MARGIN, REF_DEVICE, T, _margin, _routing_model
from test_qwen3_moe import SHAPES, ckpt_grads

pytestmark = pytest.mark.skipif(not (EMU or torch.cuda.is_available()),
                                reason="no CUDA GPU (and not the emulated device: FT_EMU unset)")

# lora: attention; lora-x: all-linear (attention, the router and the experts)
CASES = [(s, mode, d) for s in ("qwen3_moe", "qwen3_moe_top3_norm")
         for mode in ("full", "lora", "lora-x") for d in ("fp32", "bf16")]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_qwen3_moe")
    return {n: ftref.build_model_dir(s, root / n) for n, s in SHAPES.items()}, root


def _batch(shape, model_dir, adapter=None):
    """A batch clear of routing ties under the adapter (a router LoRA pair moves them)."""
    base = _routing_model(model_dir, adapter)
    for seed in range(shape.seed + 3, shape.seed + 400):
        ids, labels = ftref.make_batch(shape.cfg["vocab_size"], B, T, seed)
        if _margin(base, ids) >= MARGIN:
            return ids, labels
    pytest.fail(f"no batch whose routing margin is >= {MARGIN}")


def _hf(model_dir, adapter, ids, labels):
    from peft import PeftModel

    m = ftref.load_hf(model_dir).to(device=REF_DEVICE)
    if adapter is not None:
        m = PeftModel.from_pretrained(m, str(adapter), is_trainable=True)
        m.eval()
    else:
        for p in m.parameters():
            p.requires_grad_(True)
    key = ftref.peft_key if adapter is not None else (lambda n: n)
    logits, loss, grads = ftref.hf_grads(m, ids.to(REF_DEVICE), labels.to(REF_DEVICE), key=key)
    grads = {k: v.float().cpu() for k, v in grads.items()}
    if adapter is None:
        grads = ckpt_grads(grads, m.config)
    return logits.float().cpu(), loss.float().cpu(), grads


@pytest.fixture(scope="module", params=CASES, ids=[f"{s}-{m}-{d}" for s, m, d in CASES])
def case(request, dirs, ft):
    name, mode, dtype = request.param
    model_dirs, root = dirs
    shape, model_dir = SHAPES[name], model_dirs[name]
    c = type("Case", (), {})()
    c.dtype = dtype
    adapter = None
    if mode != "full":
        targets = ["q_proj", "v_proj", "o_proj"] if mode == "lora" else "all-linear"
        adapter = ftref.build_adapter(model_dir, root / f"adapter-{name}-{mode}",
                                      target_modules=targets, seed=2)
    ids, labels = _batch(shape, model_dir, adapter)
    c.ref = _hf(model_dir, adapter, ids, labels)
    spec = dict(model_dir=model_dir, mode="full" if mode == "full" else "lora", input_ids=ids,
                labels=labels)
    if adapter is not None:
        spec["adapter_dir"] = adapter
    c.cpu = ft(spec, f"gpu-qwen3-moe-cpu-{name}-{mode}-{dtype}")
    c.out = ft(dict(spec, device="cuda", dtype=dtype), f"gpu-qwen3-moe-{name}-{mode}-{dtype}")
    return c


def test_gpu_qwen3_moe_logits_loss_vs_hf(case):
    bf = case.dtype == "bf16"
    ftref.assert_close(f"{case.dtype} logits", case.out["logits"], case.ref[0],
                       BF16_TOL_LOGITS if bf else ftref.TOL_LOGITS)
    ftref.assert_close(f"{case.dtype} loss", case.out["loss"], case.ref[1],
                       BF16_TOL_LOSS if bf else ftref.TOL_LOGITS)


def test_gpu_qwen3_moe_grads_vs_hf(case):
    grads = case.ref[2]
    assert grads and set(f"grad.{k}" for k in grads) == {k for k in case.out
                                                          if k.startswith("grad.")}
    tol = BF16_TOL_GRAD if case.dtype == "bf16" else ftref.TOL_GRAD
    errors = [m for k, ref in grads.items()
              if (m := ftref.check_close(f"grad.{k}", case.out[f"grad.{k}"], ref, tol))]
    assert not errors, "\n".join(errors)


def test_gpu_qwen3_moe_vs_cpu(case):
    if case.dtype != "fp32":
        pytest.skip("bf16 is held to transformers above")
    ftref.assert_close("fp32 logits vs CPU", case.out["logits"], case.cpu["logits"],
                       ftref.TOL_LOGITS)
    grads = {k[len("grad."):]: v for k, v in case.cpu.items() if k.startswith("grad.")}
    ftref.assert_tensor_dict_close("grad.", case.out, grads, ftref.TOL_GRAD)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gpu_qwen3_moe_qlora_vs_cpu(dirs, ft, dtype):
    """QLoRA (attention and experts nf4, LoRA on attention) on the GPU against our CPU
    QLoRA, which test_qwen3_moe.py holds against transformers + PEFT (bf16: logits and
    loss, test_gpu_moe.py's qcase says why)."""
    model_dirs, root = dirs
    model_dir = model_dirs["qwen3_moe"]
    adapter = ftref.build_adapter(model_dir, root / "adapter-qlora",
                                  target_modules=["q_proj", "v_proj", "o_proj"], seed=4)
    ids, labels = _batch(SHAPES["qwen3_moe"], model_dir, adapter)
    spec = dict(model_dir=model_dir, adapter_dir=adapter, mode="lora", input_ids=ids,
                labels=labels, quant=dict(type="nf4", blocksize=64, double_quant=True))
    cpu = ft(spec, "gpu-qwen3-moe-qlora-cpu")
    out = ft(dict(spec, device="cuda", dtype=dtype), f"gpu-qwen3-moe-qlora-{dtype}")
    bf = dtype == "bf16"
    assert any(".mlp.experts.0.gate_proj.weight" in k for k in out if k.startswith("dequant."))
    ftref.assert_close(f"{dtype} qlora logits", out["logits"], cpu["logits"],
                       BF16_TOL_LOGITS if bf else ftref.TOL_LOGITS)
    ftref.assert_close(f"{dtype} qlora loss", out["loss"], cpu["loss"],
                       BF16_TOL_LOSS if bf else ftref.TOL_LOGITS)
    if not bf:
        grads = {k[len("grad."):]: v for k, v in cpu.items() if k.startswith("grad.")}
        ftref.assert_tensor_dict_close("grad.", out, grads, ftref.TOL_GRAD)


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen3_moe_top3_norm"])
def test_gpu_qwen3_moe_padded_aux_mask(dirs, ft, name):
    """A right-padded batch on the GPU path in fp32: the load-balancing statistics and
    their gradient leave the padding out, as transformers given the attention_mask
    (moe_padding.py)."""
    import moe_padding

    shape = SHAPES[name]
    moe_padding.check_padded_aux(dirs[0][name], shape.T, shape.seed + 5, ft, ckpt_grads,
                                 f"gpu-{name}", device="cuda", dtype="fp32")
