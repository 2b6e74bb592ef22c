"""Our quantization against bitsandbytes' own code, run on the CPU.

bitsandbytes (scripts/python-requirements.in) is installed in the conformance venv.
create_dynamic_map, get_4bit_type and QuantState come from bitsandbytes.functional as
they are; the quantize / dequantize kernels are those of its reference ("default")
backend, backends/default/ops.py, executed from the installed package's source with its
op registration replaced by a plain decorator (on the CPU, torch.ops.bitsandbytes would
dispatch to the C library instead) and without its torch.compile wrapper (an optimization
with an eager fallback: eager is the definition, and compiling costs minutes on 2 cores).
functional.quantize_4bit's double quantization (offset = mean(absmax),
quantize_blockwise(absmax - offset, dynamic map, 256)) is two lines, reproduced here.

Checked, through the conformance harness (tests/conformance/harness.c, "quantize" spec):
our packed bytes, absmax, nested codes, nested absmax and offset, int8 rows and scales
equal theirs for the same input, and their dequantization of our bytes equals ours.

The default backend picks codes with argmin |x - code| where the CUDA kernel (which we
follow) walks midpoint trees; the two agree except within fp32 rounding of a midpoint,
which random data does not hit: any difference fails the test.
"""

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="module")
def bnb():
    import bitsandbytes
    from bitsandbytes import functional
    from bitsandbytes.backends import utils as backend_utils
    src = Path(bitsandbytes.__file__).parent / "backends" / "default" / "ops.py"
    ops = src.read_text()
    for old, new in [("from ..._ops import register_kernel", ""),
                     ("from ..utils import _get_4bit_code", ""),
                     ("@_try_torch_compile(dynamic=False)\n", ""),
                     ("@_try_torch_compile\n", "")]:
        assert old in ops, f"{src} no longer has {old!r}"
        ops = ops.replace(old, new)
    kernels = {}

    def register_kernel(name, backend):
        def deco(f):
            kernels[name] = f
            return f
        return deco

    ns = {"__name__": "bnb_reference", "register_kernel": register_kernel,
          "_get_4bit_code": backend_utils._get_4bit_code}
    exec(compile(ops, str(src), "exec"), ns)
    k = {n.split("::")[1]: f for n, f in kernels.items()}
    for name in ("create_dynamic_map", "get_4bit_type", "QuantState"):
        k[name] = getattr(functional, name)
    return k


def _weights(rows, cols, seed, zero_block=None, blocksize=64, bf16=False):
    """Random weights; bf16: rounded to bf16 values first, as real checkpoints' are, which
    puts many scaled values exactly on the codes' decision boundaries (ties)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.02
    w[:, ::13] *= 8  # outlier columns
    if bf16:
        w = w.bfloat16().float()
    if zero_block is not None:
        flat = w.view(-1)
        flat[zero_block * blocksize:(zero_block + 1) * blocksize] = 0
    return w


def _theirs_4bit(bnb, w, qtype, bs, dq):
    packed, absmax = bnb["quantize_4bit"](w, bs, qtype, torch.uint8)
    out = {"packed": packed.view(-1), "absmax": absmax}
    if dq:
        code = bnb["create_dynamic_map"]()
        offset = absmax.mean()
        q2, a2 = bnb["quantize_blockwise"](absmax - offset, code, 256)
        out.update(absmax_q=q2, nested_absmax=a2, offset=offset, map=code)
    return out


def _nibbles(packed):
    return torch.stack([packed >> 4, packed & 15], dim=1).view(-1)


CASES = [("nf4", 64, True, (48, 77), False), ("nf4", 64, False, (33, 65), False),
         ("fp4", 128, True, (64, 64), False), ("fp4", 32, False, (7, 9), False),
         ("nf4", 32, True, (300, 200), False), ("nf4", 4096, False, (40, 130), False),
         ("nf4", 64, False, (256, 344), True), ("fp4", 64, False, (256, 344), True),
         ("nf4", 64, True, (128, 1376), True), ("fp4", 128, True, (96, 200), True)]


def test_dynamic_map_is_bitsandbytes(bnb, ft):
    theirs = bnb["create_dynamic_map"]().float()
    out = ft(dict(quantize=[dict(rows=1, cols=1, values=[0.0], type="nf4", blocksize=64,
                                 double_quant=True)]), "bnb-map")
    assert torch.equal(out["q0.nested_map"], theirs)


@pytest.mark.parametrize("qtype,bs,dq,shape,bf16", CASES,
                         ids=[f"{q}-bs{b}-{'dq' if d else 'nodq'}-{s[0]}x{s[1]}{'-bf16' if h else ''}"
                              for q, b, d, s, h in CASES])
def test_4bit_bytes_equal_bitsandbytes(bnb, ft, qtype, bs, dq, shape, bf16):
    w = _weights(*shape, seed=shape[0] * 7 + bs, zero_block=1, blocksize=bs, bf16=bf16)
    out = ft(dict(quantize=[dict(rows=shape[0], cols=shape[1], values=w.view(-1).tolist(),
                                 type=qtype, blocksize=bs, double_quant=dq)]),
             f"bnb-{qtype}-{bs}-{dq}-{shape[0]}")
    theirs = _theirs_4bit(bnb, w, qtype, bs, dq)
    ours_n, theirs_n = _nibbles(out["q0.packed"]), _nibbles(theirs["packed"])
    if qtype == "fp4":
        # FP4 has +0 (code 0) and -0 (code 8), both decoding to 0. For inputs that round
        # to zero the CUDA kernel (and we) keep the input's sign; their reference backend
        # takes the order argsort gives the two equal codes. Compared as one code.
        ours_n = torch.where(ours_n == 8, torch.zeros((), dtype=torch.uint8), ours_n)
        theirs_n = torch.where(theirs_n == 8, torch.zeros((), dtype=torch.uint8), theirs_n)
    bad = (ours_n != theirs_n).nonzero().view(-1)[:6]
    assert torch.equal(ours_n, theirs_n), [(int(i), w.view(-1)[i].item(), int(ours_n[i]), int(theirs_n[i])) for i in bad]
    if not dq:
        # their reference backend clamps the absmax of an all-zero partial last block to
        # 1e-38 (the full blocks' stay 0, as do ours and the CUDA kernel's)
        want = torch.where(theirs["absmax"] < 1e-37, torch.zeros(()), theirs["absmax"])
        assert torch.equal(out["q0.absmax"], want)
        absmax = out["q0.absmax"]
    else:
        # offset = mean(absmax): their torch reduction and ours round differently, by an
        # ulp or two; everything downstream follows from it
        off_ours, off_theirs = out["q0.nested_offset"].item(), theirs["offset"].item()
        assert abs(off_ours - off_theirs) <= 4e-7 * abs(off_theirs)
        assert torch.allclose(out["q0.nested_absmax"], theirs["nested_absmax"], rtol=1e-6, atol=0)
        same = (out["q0.absmax_q"] == theirs["absmax_q"]).float().mean().item()
        assert same >= 0.995, same
        absmax = bnb["dequantize_blockwise"](out["q0.absmax_q"], out["q0.nested_absmax"],
                                             out["q0.nested_map"], 256, torch.float32) + \
            out["q0.nested_offset"]
    # their dequantization of our bytes and state is ours, bit for bit
    deq = bnb["dequantize_4bit"](out["q0.packed"], absmax, bs, qtype, shape, torch.float32)
    assert torch.equal(out["q0.dequant"].view(shape), deq)


@pytest.mark.parametrize("shape,bf16", [((16, 40), False), ((5, 3), False), ((64, 257), False),
                                        ((256, 344), True), ((96, 1376), True)])
def test_int8_equals_bitsandbytes(bnb, ft, shape, bf16):
    w = _weights(*shape, seed=shape[1], bf16=bf16)
    w[2] = 0  # a zero row
    out = ft(dict(quantize=[dict(rows=shape[0], cols=shape[1], values=w.view(-1).tolist(),
                                 type="int8")]), f"bnb-int8-{shape[0]}")
    q, scb, _ = bnb["int8_vectorwise_quant"](w.clone(), 0.0)
    ours_q = out["q0.q"].view(shape)
    nz = scb != 0  # bitsandbytes divides by a zero scale (NaN -> undefined int8); we write 0
    assert torch.equal(ours_q[nz], q[nz]) and torch.all(ours_q[~nz] == 0)
    assert torch.equal(out["q0.scb"], scb)


READ_CASES = [("nf4", 64, True, (48, 77)), ("fp4", 128, False, (33, 65)), ("nf4", 256, True, (300, 200))]


@pytest.mark.parametrize("qtype,bs,dq,shape", READ_CASES,
                         ids=[f"{q}-bs{b}-{'dq' if d else 'nodq'}" for q, b, d, _ in READ_CASES])
def test_reads_a_bitsandbytes_state_dict(bnb, ft, tmp_path, qtype, bs, dq, shape):
    """A Linear4bit state dict as bitsandbytes serializes it (QuantState.as_dict(packed=True)
    under "<prefix>.weight."), read by our loader: the weight dequantizes to theirs, bit
    for bit."""
    from safetensors.torch import save_file
    w = _weights(*shape, seed=11 + bs)
    t = _theirs_4bit(bnb, w, qtype, bs, dq)
    QS = bnb["QuantState"]
    code = bnb["get_4bit_type"](qtype, device="cpu")
    if dq:
        qs = QS(absmax=t["absmax_q"], shape=torch.Size(shape), code=code, blocksize=bs,
                quant_type=qtype, dtype=torch.float32, offset=t["offset"],
                state2=QS(absmax=t["nested_absmax"], code=t["map"], blocksize=256,
                          dtype=torch.float32))
        absmax = bnb["dequantize_blockwise"](t["absmax_q"], t["nested_absmax"], t["map"], 256,
                                             torch.float32) + t["offset"]
    else:
        qs = QS(absmax=t["absmax"], shape=torch.Size(shape), code=code, blocksize=bs,
                quant_type=qtype, dtype=torch.float32)
        absmax = t["absmax"]
    prefix = "model.layers.0.mlp.up_proj"
    sd = {f"{prefix}.weight": t["packed"].view(-1, 1).contiguous()}
    sd.update({f"{prefix}.weight.{k}": v.contiguous() for k, v in qs.as_dict(packed=True).items()})
    save_file(sd, tmp_path / "model.safetensors")
    out = ft(dict(dequantize=dict(dir=str(tmp_path), prefix=prefix, rows=shape[0], cols=shape[1])),
             f"bnb-read-{qtype}-{bs}")
    want = bnb["dequantize_4bit"](t["packed"], absmax, bs, qtype, shape, torch.float32)
    assert torch.equal(out["dequant"].view(shape), want)


def test_reads_a_bitsandbytes_int8_state_dict(bnb, ft, tmp_path):
    """Linear8bitLt's state dict (weight int8, SCB, weight_format 0 = row-major)."""
    from safetensors.torch import save_file
    w = _weights(24, 40, seed=3)
    q, scb, _ = bnb["int8_vectorwise_quant"](w.clone(), 0.0)
    prefix = "model.layers.1.self_attn.o_proj"
    save_file({f"{prefix}.weight": q.contiguous(), f"{prefix}.SCB": scb.contiguous(),
               f"{prefix}.weight_format": torch.tensor(0, dtype=torch.uint8)},
              tmp_path / "model.safetensors")
    out = ft(dict(dequantize=dict(dir=str(tmp_path), prefix=prefix, rows=24, cols=40)), "bnb-read-int8")
    # int8_vectorwise_dequant: q * SCB * (1/127) in fp32
    want = (q.float() * scb.view(-1, 1)) * 7.874015718698502e-3
    assert torch.equal(out["dequant"].view(24, 40), want)
