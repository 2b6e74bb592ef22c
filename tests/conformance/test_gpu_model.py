"""The whole model on the GPU (ft_model_options.device = cuda) against transformers + PEFT
on the same GPU, and against our own CPU reference: logits, loss and LoRA gradients, in
fp32 and in bf16 (bf16 weights and activations; LoRA weights keep an fp32 master and their
gradients are fp32, as PEFT keeps adapters in fp32 on a bf16 base).

Runs where torch sees a CUDA GPU and the harness was built with CUDA (the GPU machine);
skipped elsewhere. fp32 is held to the CPU suite's tolerances. bf16 differs from PEFT by
the rounding of two bf16 implementations (ours computes the LoRA path in bf16, PEFT
upcasts it to fp32), so it is held to bf16-level tolerances; every comparison's figure is
printed in the headroom summary."""

import pytest
import torch

import ftref

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")

B = 2
CASES = [("llama_gqa", "all7"), ("qwen2", "qv"), ("llama_mqa_odd", "all7"), ("tied", "qv")]

BF16_TOL_LOGITS = 2e-2
BF16_TOL_LOSS = 1e-2
BF16_TOL_GRAD = 5e-2


def _hf_on_gpu(model_dir, adapter_dir, dtype):
    from peft import PeftModel

    torch.backends.cuda.matmul.allow_tf32 = False
    base = ftref.load_hf(model_dir).to(device="cuda", dtype=dtype)
    m = PeftModel.from_pretrained(base, str(adapter_dir), is_trainable=True)
    m.eval()
    return m


@pytest.fixture(scope="module", params=[(m, v, d) for m, v in CASES for d in ("fp32", "bf16")],
                ids=[f"{m}-{v}-{d}" for m, v in CASES for d in ("fp32", "bf16")])
def case(request, store, ft):
    model_name, variant, dtype = request.param
    c = type("Case", (), {})()
    c.dtype = dtype
    shape = ftref.SHAPES[model_name]
    model_dir = store.model(model_name)
    adapter_dir = store.adapter(model_name, variant)
    tdtype = torch.float32 if dtype == "fp32" else torch.bfloat16
    m = _hf_on_gpu(model_dir, adapter_dir, tdtype)
    ids, labels = ftref.make_batch(m.config.vocab_size, B, shape.T, shape.seed + 1)
    logits, loss, grads = ftref.hf_grads(m, ids.cuda(), labels.cuda(), key=ftref.peft_key)
    c.ref_logits = logits.float().cpu()
    c.ref_loss = loss.float().cpu()
    c.ref_grads = {k: v.float().cpu() for k, v in grads.items()}
    del m
    torch.cuda.empty_cache()
    spec = dict(model_dir=model_dir, adapter_dir=adapter_dir, mode="lora", input_ids=ids,
                labels=labels)
    c.cpu = ft(spec, f"gpu-model-cpu-{model_name}-{variant}")
    c.out = ft(dict(spec, device="cuda", dtype=dtype), f"gpu-model-{model_name}-{variant}-{dtype}")
    return c


def test_gpu_logits_loss_vs_hf(case):
    tl, ts = (ftref.TOL_LOGITS, ftref.TOL_LOGITS) if case.dtype == "fp32" else (
        BF16_TOL_LOGITS, BF16_TOL_LOSS)
    ftref.assert_close(f"{case.dtype} logits", case.out["logits"], case.ref_logits, tl)
    ftref.assert_close(f"{case.dtype} loss", case.out["loss"], case.ref_loss, ts)


def test_gpu_lora_grads_vs_hf(case):
    tol = ftref.TOL_GRAD if case.dtype == "fp32" else BF16_TOL_GRAD
    ftref.assert_tensor_dict_close("grad.", case.out, case.ref_grads, tol)


def test_gpu_vs_cpu_reference(case):
    """Our GPU model against our CPU model on the same inputs."""
    if case.dtype == "fp32":
        ftref.assert_close("fp32 logits vs CPU", case.out["logits"], case.cpu["logits"],
                           ftref.TOL_LOGITS)
        grads = {k[len("grad."):]: v for k, v in case.cpu.items() if k.startswith("grad.")}
        ftref.assert_tensor_dict_close("grad.", case.out, grads, ftref.TOL_GRAD)
    else:
        ftref.assert_close("bf16 logits vs CPU", case.out["logits"], case.cpu["logits"],
                           BF16_TOL_LOGITS)
