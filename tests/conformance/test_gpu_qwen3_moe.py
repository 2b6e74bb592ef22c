"""Qwen3-MoE (test_qwen3_moe.py's shapes) on the GPU path, as test_gpu_moe.py does for
mixtral: fp32 and bf16, full fine-tuning, LoRA on attention and all-linear (router and
experts too), logits, loss and every gradient (router, experts, per-head q/k norms, their
LoRA pairs) against transformers + PEFT in fp32, fp32 against our CPU model too, and QLoRA against our CPU QLoRA. The batches are chosen clear
of routing ties (test_gpu_moe.py's margin). Runs where test_gpu_moe.py runs (a CUDA GPU,
or FT_EMU=1 with the emulated build's harness)."""

import pytest

import ftref
import moe_ref
from test_gpu_model import BF16_TOL_GRAD, BF16_TOL_LOGITS, BF16_TOL_LOSS
from test_qwen3_moe import SHAPES

ckpt_grads = moe_ref.qwen_ckpt_grads

pytestmark = moe_ref.gpu_only

# lora: attention; lora-x: all-linear (attention, the router and the experts)
CASES = [(s, mode, d) for s in ("qwen3_moe", "qwen3_moe_top3_norm")
         for mode in ("full", "lora", "lora-x") for d in ("fp32", "bf16")]


dirs = moe_ref.gpu_dirs_fixture(SHAPES, "gpu_qwen3_moe")


@pytest.fixture(scope="module", params=CASES, ids=[f"{s}-{m}-{d}" for s, m, d in CASES])
def case(request, dirs, ft):
    name, mode, dtype = request.param
    model_dirs, root = dirs
    shape, model_dir = SHAPES[name], model_dirs[name]
    adapter = None
    if mode != "full":
        targets = ["q_proj", "v_proj", "o_proj"] if mode == "lora" else "all-linear"
        adapter = ftref.build_adapter(model_dir, root / f"adapter-{name}-{mode}",
                                      target_modules=targets, seed=2)
    return moe_ref.gpu_case(shape, model_dir, adapter, dtype, ft, ckpt_grads,
                            f"gpu-qwen3-moe-cpu-{name}-{mode}-{dtype}",
                            f"gpu-qwen3-moe-{name}-{mode}-{dtype}")


def test_gpu_qwen3_moe_logits_loss_vs_hf(case):
    bf = case.dtype == "bf16"
    moe_ref.check_gpu_logits_loss(case, BF16_TOL_LOGITS if bf else ftref.TOL_LOGITS,
                                  BF16_TOL_LOSS if bf else ftref.TOL_LOGITS)


def test_gpu_qwen3_moe_grads_vs_hf(case):
    tol = BF16_TOL_GRAD if case.dtype == "bf16" else ftref.TOL_GRAD
    moe_ref.check_gpu_grads(case, tol)


def test_gpu_qwen3_moe_vs_cpu(case):
    moe_ref.check_gpu_vs_cpu(case)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gpu_qwen3_moe_qlora_vs_cpu(dirs, ft, dtype):
    """QLoRA (attention and experts nf4, LoRA on attention) on the GPU against our CPU
    QLoRA, which test_qwen3_moe.py holds against transformers + PEFT (bf16: logits and
    loss, test_gpu_moe.py's qcase says why)."""
    model_dirs, root = dirs
    model_dir = model_dirs["qwen3_moe"]
    adapter = ftref.build_adapter(model_dir, root / "adapter-qlora",
                                  target_modules=["q_proj", "v_proj", "o_proj"], seed=4)
    ids, labels = moe_ref.clear_batch(SHAPES["qwen3_moe"], model_dir, adapter)
    spec = dict(model_dir=model_dir, adapter_dir=adapter, mode="lora", input_ids=ids,
                labels=labels, quant=dict(type="nf4", blocksize=64, double_quant=True))
    cpu = ft(spec, "gpu-qwen3-moe-qlora-cpu")
    out = ft(dict(spec, device="cuda", dtype=dtype), f"gpu-qwen3-moe-qlora-{dtype}")
    bf = dtype == "bf16"
    assert any(".mlp.experts.0.gate_proj.weight" in k for k in out if k.startswith("dequant."))
    moe_ref.check_qlora_vs_cpu(out, cpu, dtype, BF16_TOL_LOGITS if bf else ftref.TOL_LOGITS,
                               BF16_TOL_LOSS if bf else ftref.TOL_LOGITS)


@pytest.mark.parametrize("name", ["qwen3_moe", "qwen3_moe_top3_norm"])
def test_gpu_qwen3_moe_padded_aux_mask(dirs, ft, name):
    """A right-padded batch on the GPU path in fp32: the load-balancing statistics and
    their gradient leave the padding out, as transformers given the attention_mask
    (moe_padding.py)."""
    import moe_padding

    shape = SHAPES[name]
    moe_padding.check_padded_aux(dirs[0][name], shape.T, shape.seed + 5, ft, ckpt_grads,
                                 f"gpu-{name}", device="cuda", dtype="fp32")
