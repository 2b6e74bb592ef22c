"""What the mixture-of-experts conformance files share: test_moe.py (mixtral),
test_qwen3_moe.py and test_qwen2_moe.py on the CPU, test_gpu_moe.py,
test_gpu_qwen3_moe.py and test_gpu_qwen2_moe.py on the GPU path.

Each family's file keeps its shapes (SHAPES), its checkpoint names (ckpt_grads, which it
passes in) and its own checks; the references built the same way for every family live
here: the per-module model store, the eval / full reference of a shape, a LoRA case against
PEFT, QLoRA against transformers on our dequantized weights, five AdamW steps, ft-merge
against merge_and_unload, the dist runs, and on the GPU path the batch kept clear of
routing ties and the comparisons with transformers and with our CPU model. The right-padding
checks are moe_padding.py's."""

import json
import os
import re

import pytest
import torch
from safetensors.torch import load_file

import ftref

B = 2

# --- the CPU suite ----------------------------------------------------------------------


def mixtral_ckpt_grads(grads, cfg):
    """Mixtral: HF 5 gradient names -> the checkpoint's (per-expert w1/w3/w2,
    block_sparse_moe)."""
    I = cfg.intermediate_size
    out = {}
    for n, g in grads.items():
        if ".mlp.experts.gate_up_proj" in n:
            pre = n.replace(".mlp.experts.gate_up_proj", ".block_sparse_moe.experts")
            for e in range(g.shape[0]):
                out[f"{pre}.{e}.w1.weight"] = g[e, :I]
                out[f"{pre}.{e}.w3.weight"] = g[e, I:]
        elif ".mlp.experts.down_proj" in n:
            pre = n.replace(".mlp.experts.down_proj", ".block_sparse_moe.experts")
            for e in range(g.shape[0]):
                out[f"{pre}.{e}.w2.weight"] = g[e]
        elif ".mlp.gate.weight" in n:
            out[n.replace(".mlp.gate.", ".block_sparse_moe.gate.")] = g
        else:
            out[n] = g
    return out


def qwen_ckpt_grads(grads, cfg):
    """Qwen2/3-MoE: HF 5 names (fused experts) -> the checkpoint's (per-expert
    gate/up/down_proj)."""
    I = cfg.moe_intermediate_size
    out = {}
    for n, g in grads.items():
        if n.endswith(".mlp.experts.gate_up_proj"):
            pre = n[: -len(".gate_up_proj")]
            for e in range(g.shape[0]):
                out[f"{pre}.{e}.gate_proj.weight"] = g[e, :I]
                out[f"{pre}.{e}.up_proj.weight"] = g[e, I:]
        elif n.endswith(".mlp.experts.down_proj"):
            pre = n[: -len(".down_proj")]
            for e in range(g.shape[0]):
                out[f"{pre}.{e}.down_proj.weight"] = g[e]
        else:
            out[n] = g
    return out


def qwen_v5_state(sd, ckpt, I):
    """Qwen2/3-MoE: writes checkpoint-named tensors into sd, a transformers 5 state dict,
    in place."""
    for k, v in ckpt.items():
        m = re.fullmatch(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(\w+_proj)\.weight", k)
        if not m:
            sd[k] = v
            continue
        l, e, p = int(m.group(1)), int(m.group(2)), m.group(3)
        if p == "down_proj":
            sd[f"model.layers.{l}.mlp.experts.down_proj"][e] = v
        else:
            rows = slice(0, I) if p == "gate_proj" else slice(I, 2 * I)
            sd[f"model.layers.{l}.mlp.experts.gate_up_proj"][e, rows] = v


class Case:
    """A shape's reference (transformers) and our eval / full outputs, as attributes."""


def store_fixture(shapes, root, name="store"):
    """A module-scoped fixture `name`: store(shape_name) builds that shape's checkpoint
    once per module (in a temporary folder named root, store.root) and returns its folder."""

    @pytest.fixture(scope="module", name=name)
    def store(tmp_path_factory):
        folder = tmp_path_factory.mktemp(root)
        built = {}

        def model(n):
            if n not in built:
                built[n] = ftref.build_model_dir(shapes[n], folder / n)
            return built[n]

        model.root = folder
        return model

    return store


def full_case(shape, model_dir, ft, ckpt_grads):
    """transformers' logits, loss, gradients (under the checkpoint's names) and aux loss on
    the shape's batch, and our eval and full outputs on it."""
    c = Case()
    c.shape = shape
    c.model_dir = model_dir
    model = ftref.full_mode_model(c.model_dir)
    c.cfg = model.config
    c.ids, c.labels = ftref.make_batch(model.config.vocab_size, B, shape.T, shape.seed)
    c.ref_logits, c.ref_loss, grads = ftref.hf_grads(model, c.ids, c.labels)
    c.ref_grads = ckpt_grads(grads, model.config)
    with torch.no_grad():
        c.ref_aux = model(input_ids=c.ids, labels=c.labels).aux_loss
    c.spec = dict(model_dir=c.model_dir, input_ids=c.ids, labels=c.labels)
    c.eval_out = ft(dict(c.spec, mode="eval"), f"{shape.name}-eval")
    c.full_out = ft(dict(c.spec, mode="full"), f"{shape.name}-full")
    return c


def check_aux_share(case):
    """With output_router_logits, the aux term is large enough to matter at the loss
    tolerance (a guard on the shapes)."""
    if case.shape.cfg["output_router_logits"]:
        assert case.ref_aux is not None
        share = case.shape.cfg["router_aux_loss_coef"] * float(case.ref_aux) / float(case.ref_loss)
        assert share > 100 * ftref.TOL_LOGITS


def check_logits_loss(case, mode):
    """Our eval or full (mode) logits and loss against transformers'."""
    name, out = case.shape.name, getattr(case, f"{mode}_out")
    ftref.assert_close(f"[{name}] {mode} logits", out["logits"], case.ref_logits,
                       ftref.TOL_LOGITS)
    ftref.assert_close(f"[{name}] {mode} loss", out["loss"], case.ref_loss, ftref.TOL_LOGITS)


def check_grad_ckpt_equal(case, ft):
    """Gradient checkpointing gives the full run's loss, logits and gradients bit for bit."""
    out = ft(dict(case.spec, mode="full", grad_ckpt=True), f"{case.shape.name}-full-ckpt")
    for k, v in case.full_out.items():
        if k.startswith("grad.") or k in ("loss", "logits"):
            assert torch.equal(out[k], v), k


def lora_case(shape, model_dir, adapter, ft, seed, tag):
    """PEFT's logits, loss and LoRA gradients (peft_key names) on the batch of seed, and
    our lora-mode outputs on it (spec: the harness's request)."""
    model = ftref.lora_mode_model(model_dir, adapter)
    ids, labels = ftref.make_batch(model.config.vocab_size, B, shape.T, seed)
    logits, loss, grads = ftref.hf_grads(model, ids, labels, key=ftref.peft_key)
    spec = dict(model_dir=model_dir, adapter_dir=adapter, mode="lora", input_ids=ids,
                labels=labels)
    out = ft(spec, tag)
    return dict(logits=logits, loss=loss, grads=grads, out=out, cfg=model.config, ids=ids,
                spec=spec)


def check_lora(c, label, same_keys=False):
    """Logits, loss and every LoRA gradient of a lora_case against PEFT's (label starts
    the comparisons' names); same_keys: ours are exactly PEFT's gradients, none more."""
    if same_keys:
        assert {k for k in c["out"] if k.startswith("grad.")} == \
            {f"grad.{k}" for k in c["grads"]}
    pre = f"{label} " if label else ""
    ftref.assert_close(f"{pre}logits", c["out"]["logits"], c["logits"], ftref.TOL_LOGITS)
    ftref.assert_close(f"{pre}loss", c["out"]["loss"], c["loss"], ftref.TOL_LOGITS)
    ftref.assert_tensor_dict_close("grad.", c["out"], c["grads"], ftref.TOL_GRAD)


def qlora_case(q, shape, model_dir, adapter, store, ft, v5_state, intermediate, tag, ref_dir):
    """QLoRA q (quantized on load, or from ft-quantize's checkpoint when q["ckpt"]):
    our outputs and dequantized weights, and transformers + PEFT on a model holding exactly
    those weights (v5_state writes them into its state dict; intermediate names the
    config's expert width)."""
    m = ftref.load_hf(model_dir)
    ids, labels = ftref.make_batch(m.config.vocab_size, B, shape.T, shape.seed + 4)
    spec = dict(adapter_dir=adapter, mode="lora", input_ids=ids, labels=labels)
    if q.get("ckpt"):
        qdir = store.root / "quantized"
        if not qdir.exists():
            ftref.run_tool([ftref.tool_exe("FT_QUANTIZE", "ft-quantize"), "--model", model_dir,
                            "--out", qdir, "--type", q["type"]])
        out = ft(dict(spec, model_dir=qdir), tag)
    else:
        out = ft(dict(spec, model_dir=model_dir, quant=q), tag)
    deq = {k[len("dequant."):]: v for k, v in out.items() if k.startswith("dequant.")}
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    v5_state(sd, deq, getattr(m.config, intermediate))
    m.load_state_dict(sd)
    m.save_pretrained(ref_dir, safe_serialization=True)
    ref = ftref.lora_mode_model(ref_dir, adapter)
    logits, loss, grads = ftref.hf_grads(ref, ids, labels, key=ftref.peft_key)
    ckpt = load_file(str(model_dir / "model.safetensors"))
    return dict(q=q, out=out, deq=deq, ckpt=ckpt, logits=logits, loss=loss, grads=grads,
                cfg=m.config)


def check_qlora_dequant(c, want):
    """Exactly the tensors of want are quantized, each within the type's bound of the
    checkpoint's and not equal to it."""
    from test_qlora import _bound

    assert set(c["deq"]) == want  # the router is not quantized
    for name, d in c["deq"].items():
        w = c["ckpt"][name].float().numpy()
        err = abs(d.numpy().reshape(-1) - w.reshape(-1))
        assert (err <= _bound(w, c["q"])).all(), name
        assert err.max() > 0, name


def train_hparams(lr):
    """Five AdamW steps with warmup, cosine decay, clipping and weight decay."""
    return dict(steps=5, lr=lr, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01,
                warmup_steps=2, scheduler="cosine", max_grad_norm=2.0)


def train_case(run, shapes, store, ft, ckpt_grads, tag):
    """A TRAIN_RUNS entry (full when run["targets"] is None, else LoRA on those targets and
    run["extra"]): torch's five AdamW steps and ours on the shape's batch."""
    shape = shapes[run["shape"]]
    model_dir = store(shape.name)
    ids, labels = ftref.make_batch(shape.cfg["vocab_size"], B, shape.T, shape.seed + 2)
    if run["targets"] is None:
        m = ftref.full_mode_model(model_dir)
        spec = dict(model_dir=model_dir, mode="full")
        key = lambda n: n  # noqa: E731
    else:
        adapter = ftref.build_adapter(model_dir, store.root / f"adapter-train-{run['id']}",
                                      target_modules=run["targets"], seed=11,
                                      **run.get("extra", {}))
        m = ftref.lora_mode_model(model_dir, adapter)
        spec = dict(model_dir=model_dir, adapter_dir=adapter, mode="lora")
        key = ftref.peft_key
    ref = ftref.reference_train(m, ids, labels, run["train"], key=key)
    ref["weights"] = ckpt_grads(ref["weights"], m.config)
    spec.update(input_ids=ids, labels=labels, train=run["train"])
    out = ft(spec, f"{tag}-{run['id']}")
    return dict(ref=ref, out=out, run=run)


def check_train(c):
    """The five steps' losses and the final weights of a train_case against torch's."""
    ref, out = c["ref"], c["out"]
    ftref.assert_close(f"losses (ref {[round(x, 6) for x in ref['losses'].tolist()]})",
                       out["losses"], ref["losses"], ftref.TOL_LOSSES)
    ftref.assert_tensor_dict_close("weight.", out, ref["weights"], ftref.TOL_WEIGHT)


def check_lora_init_loads(model_dir, out):
    """An adapter of ft-lora-init (in out) loads in PEFT holding exactly its tensors, and
    (B = 0) leaves the logits alone. Returns its tensor names."""
    from peft import PeftModel

    pm = PeftModel.from_pretrained(ftref.load_hf(model_dir), str(out))
    tensors = load_file(str(out / "adapter_model.safetensors"))
    mem = {ftref.peft_key(n): p for n, p in pm.named_parameters() if ".lora_" in n}
    assert set(mem) == set(tensors)
    for k, t in tensors.items():
        assert torch.equal(mem[k].detach(), t), k
    ids, _ = ftref.make_batch(96, 2, 12, 0)
    assert torch.equal(ftref.hf_forward(pm, ids)[0],
                       ftref.hf_forward(ftref.load_hf(model_dir), ids)[0])
    return set(tensors)


def merge(model_dir, adapter, out, seed, ckpt_grads):
    """ft-merge of the adapter into out, and PEFT's merge_and_unload under the checkpoint's
    names (lm_head left out when tied, as the checkpoint has it), the same tensors in
    both. Returns a Case: ours, ref_state, the PEFT model's ref_logits on the batch ids of
    seed, the model's cfg and the merged folder out."""
    from peft import PeftModel

    ftref.run_tool([ftref.tool_exe("FT_MERGE", "ft-merge"), "--model", model_dir, "--adapter",
                    adapter, "--out", out])
    pm = PeftModel.from_pretrained(ftref.load_hf(model_dir), str(adapter))
    pm.eval()
    ids, _ = ftref.make_batch(96, 2, 12, seed)
    ref_logits = ftref.hf_forward(pm, ids)[0]
    merged = pm.merge_and_unload()
    ref_state = ckpt_grads({k: v.detach() for k, v in merged.state_dict().items()},
                           merged.config)
    if merged.config.tie_word_embeddings:
        ref_state.pop("lm_head.weight", None)
    ours = load_file(str(out / "model.safetensors"))
    assert set(ours) == set(ref_state), sorted(set(ours) ^ set(ref_state))
    m = Case()
    m.ours, m.ref_state, m.ref_logits, m.ids = ours, ref_state, ref_logits, ids
    m.cfg, m.out = merged.config, out
    return m


def check_merged(m):
    """The merged weights (a merge's Case) equal merge_and_unload's, and the merged
    checkpoint loads in transformers with the PEFT model's logits."""
    for k, v in m.ref_state.items():
        ftref.assert_close(f"merged {k}", m.ours[k], v, ftref.TOL_WEIGHT)
    ftref.assert_close("merged logits", ftref.hf_forward(ftref.load_hf(m.out), m.ids)[0],
                       m.ref_logits, ftref.TOL_LOGITS)


def uneven_rows(rnd, n=48):
    """n token rows of 6 to 12 ids in [1, 63] (lengths at random), the first 4 labels
    -100, as JSON lines."""
    rows = []
    for _ in range(n):
        T = rnd.randint(6, 12)
        ids = [rnd.randint(1, 63) for _ in range(T)]
        rows.append({"input_ids": ids, "labels": [-100] * 4 + ids[4:]})
    return "".join(json.dumps(r) + "\n" for r in rows)


def dist_run(d, name, np_, mode, evaluate=True, **over):
    """ft-train of d's model and train.jsonl on np_ ranks, 4 steps (over: config keys with
    __ for .); evaluate: on d/eval.jsonl every 2 steps. Returns the run's folder."""
    import rankrun

    keys = {"train.max_steps": 4, "train.warmup_steps": 1, "train.learning_rate": 1e-2}
    if evaluate:
        keys.update({"data.eval_path": d / "eval.jsonl", "train.eval_strategy": "steps",
                     "train.eval_steps": 2})
    keys.update({k.replace("__", "."): v for k, v in over.items()})
    cfg = rankrun.write_config(d, name, keys, mode=mode)
    rankrun.run(cfg, np_)
    return d / "runs" / name


def same_run(a, b):
    """Two ft-train runs logged the same losses and gradient norms and saved the same
    weights (test_dist_train.py's)."""
    from test_dist_train import assert_same_run

    assert_same_run(a, b)


def check_dist_equals_one_process(d, mode, strategy, eval_rows):
    """d's run of mode (full; lora: q_proj, v_proj; moe-lora: all-linear, which reaches the
    router and the experts, dropout 0) on 2 ranks under strategy equals one process's
    (made once per mode, batches of 8): losses, gradient norms, final weights. Its
    evaluations (steps 2 and 4, every rank over the whole of eval_rows in batches of the
    rank's batch size) are the HF Trainer's, the MoE load-balancing term included
    (moe_padding.check_run_eval); under model_parallel (the one process's batches) they
    are the one process's too."""
    import moe_padding

    lora = {"tuning__lora__target_modules": "q_proj,v_proj"} if mode == "lora" else {}
    if mode == "moe-lora":
        lora = {"tuning__lora__target_modules": "all-linear", "tuning__lora__dropout": 0}
    tmode = "lora" if mode == "moe-lora" else mode
    single = d / "runs" / f"single_{mode}"
    if not single.exists():
        dist_run(d, f"single_{mode}", 1, tmode, train__batch_size=8, **lora)
    batch = 8 if strategy == "model_parallel" else 4
    run = dist_run(d, f"np2_{mode}_{strategy}", 2, tmode, train__batch_size=batch,
                   dist__strategy=strategy, **lora)
    same_run(single, run)
    moe_padding.check_run_eval(run, d / "model", tmode, eval_rows, batch, 4, d / "hf_eval")
    if strategy == "model_parallel":
        for tag in ("eval/loss", "eval/aux_loss"):
            a, b = (moe_padding.tb_scalars(r, tag) for r in (single, run))
            assert a.keys() == b.keys() == {2, 4}, (a, b)
            for s in a:
                ftref.assert_close(f"{tag} {s}", b[s], a[s], ftref.TOL_LOGITS)


# --- the GPU path (test_gpu_*moe.py) ----------------------------------------------------

EMU = os.environ.get("FT_EMU") == "1"
REF_DEVICE = "cpu" if EMU else "cuda"
T = 10
MARGIN = 2e-2

# the GPU files' skip: a CUDA GPU, or the emulated device
gpu_only = pytest.mark.skipif(not (EMU or torch.cuda.is_available()),
                              reason="no CUDA GPU (and not the emulated device: FT_EMU unset)")


def routing_margin(model, ids):
    """The smallest gap, over every token and layer, between the k-th and (k+1)-th router
    logit, relative to the token's largest |logit| (the top-k is decided in logit order;
    bf16 perturbs a logit by ~2^-9 of that scale and by the hidden state's error)."""
    with torch.no_grad():
        out = model(input_ids=ids, output_router_logits=True)
    k, m = model.config.num_experts_per_tok, float("inf")
    for g in out.router_logits:
        if k == g.shape[-1]:
            continue
        lg = g.float().sort(-1, descending=True).values
        m = min(m, float(((lg[:, k - 1] - lg[:, k]) / lg.abs().max(-1).values).min()))
    return m


def routing_model(model_dir, adapter):
    """The model whose routing the batch must keep clear of ties: with the adapter, which
    moves the router's input (attention LoRA) and the router itself (its LoRA pair)."""
    from peft import PeftModel

    m = ftref.load_hf(model_dir)
    if adapter is not None:
        m = PeftModel.from_pretrained(m, str(adapter))
    m.eval()
    return m


def gpu_dirs_fixture(shapes, root_name, name="dirs"):
    """A module-scoped fixture `name`: (every shape's checkpoint folder by name, the root
    folder, a temporary one named root_name)."""

    @pytest.fixture(scope="module", name=name)
    def dirs(tmp_path_factory):
        root = tmp_path_factory.mktemp(root_name)
        return {n: ftref.build_model_dir(s, root / n) for n, s in shapes.items()}, root

    return dirs


def clear_batch(shape, model_dir, adapter=None):
    """The first batch (B x T) of seeds seed+3, seed+4, ... whose routing margin under the
    adapter (a router LoRA pair moves it) is at least MARGIN."""
    base = routing_model(model_dir, adapter)
    for seed in range(shape.seed + 3, shape.seed + 400):
        ids, labels = ftref.make_batch(shape.cfg["vocab_size"], B, T, seed)
        if routing_margin(base, ids) >= MARGIN:
            return ids, labels
    pytest.fail(f"no batch whose routing margin is >= {MARGIN}")


def gpu_hf(model_dir, adapter, ids, labels, ckpt_grads):
    """transformers (+ PEFT with an adapter) in fp32 on REF_DEVICE: logits, loss and
    gradients (the checkpoint's names in full mode), on the CPU."""
    from peft import PeftModel

    m = ftref.load_hf(model_dir).to(device=REF_DEVICE, dtype=torch.float32)
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


def gpu_case(shape, model_dir, adapter, dtype, ft, ckpt_grads, cpu_tag, tag):
    """A Case on a batch clear of routing ties: transformers' fp32 reference (ref: logits,
    loss, gradients), our CPU run (cpu) and our GPU run in dtype (out), full mode or LoRA
    with the adapter."""
    c = Case()
    c.dtype = dtype
    ids, labels = clear_batch(shape, model_dir, adapter)
    c.ref = gpu_hf(model_dir, adapter, ids, labels, ckpt_grads)
    spec = dict(model_dir=model_dir, mode="full" if adapter is None else "lora", input_ids=ids,
                labels=labels)
    if adapter is not None:
        spec["adapter_dir"] = adapter
    c.cpu = ft(spec, cpu_tag)
    c.out = ft(dict(spec, device="cuda", dtype=dtype), tag)
    return c


def check_gpu_logits_loss(case, tol_logits, tol_loss):
    """The GPU run's logits and loss against transformers' fp32 ones."""
    ftref.assert_close(f"{case.dtype} logits", case.out["logits"], case.ref[0], tol_logits)
    ftref.assert_close(f"{case.dtype} loss", case.out["loss"], case.ref[1], tol_loss)


def check_gpu_grads(case, tol):
    """Every gradient of the GPU run against transformers' fp32 ones (all errors listed)."""
    grads = case.ref[2]
    assert grads and set(f"grad.{k}" for k in grads) == {k for k in case.out
                                                          if k.startswith("grad.")}
    errors = [m for k, ref in grads.items()
              if (m := ftref.check_close(f"grad.{k}", case.out[f"grad.{k}"], ref, tol))]
    assert not errors, "\n".join(errors)


def check_gpu_vs_cpu(case):
    """fp32: our GPU model equals our CPU model to the CPU suite's tolerances."""
    if case.dtype != "fp32":
        pytest.skip("bf16 is held to transformers above")
    ftref.assert_close("fp32 logits vs CPU", case.out["logits"], case.cpu["logits"],
                       ftref.TOL_LOGITS)
    grads = {k[len("grad."):]: v for k, v in case.cpu.items() if k.startswith("grad.")}
    ftref.assert_tensor_dict_close("grad.", case.out, grads, ftref.TOL_GRAD)


def check_qlora_vs_cpu(out, cpu, dtype, tol_logits, tol_loss):
    """GPU QLoRA against our CPU QLoRA: logits and loss; in fp32 every LoRA gradient too
    (test_gpu_moe.py's test_gpu_moe_qlora_vs_cpu says why not in bf16)."""
    ftref.assert_close(f"{dtype} qlora logits", out["logits"], cpu["logits"], tol_logits)
    ftref.assert_close(f"{dtype} qlora loss", out["loss"], cpu["loss"], tol_loss)
    if dtype != "bf16":
        grads = {k[len("grad."):]: v for k, v in cpu.items() if k.startswith("grad.")}
        ftref.assert_tensor_dict_close("grad.", out, grads, ftref.TOL_GRAD)
