"""PEFT's rank_pattern / alpha_pattern: per-module rank and alpha overrides. A module takes
the first key (in the adapter_config.json's order) that matches its name as
re.match(rf"(.*\\.)?({key})$", name) (peft.utils.other.get_pattern_key): a regex over the
whole name or a dotted suffix of it; scaling alpha / r (alpha / sqrt(r) with rsLoRA) with
the module's own rank and alpha. Both directions, dense and MoE families:

  - PEFT's adapter -> ours (the harness): logits and loss (1e-5), every gradient (1e-4):
    per layer and per module, a regex key, rsLoRA, DoRA, the embedding and the head (tied
    under ensure_weight_tying: the embedding's pair, of its rank, the head's scaling that of
    the head's own keys, as PEFT has it), Phi-3's fused modules, a MoE's router and fused
    experts per layer (target_parameters; with PEFT's own pattern for w1 + w3 after the
    given ones);
  - five AdamW steps (1e-5), then our saved adapter -> PeftModel.from_pretrained with no
    missing or unexpected keys, our values and our logits;
  - ft-train with tuning.lora.rank_pattern / alpha_pattern (dense and MoE): the saved
    adapter_config.json carries them in the order given (which decides between keys
    matching one module; PEFT's own save sorts them), PEFT loads the adapter with every key
    used and our logits (ft-eval's loss: PEFT's); tuning.lora.init_adapter from a PEFT
    pattern adapter continues it, and one whose patterns give another rank or scaling is
    refused naming the module;
  - ft-lora-init --rank-pattern / --alpha-pattern: PEFT's init, loading in PEFT;
  - ft-merge of a MoE pattern adapter: merge_and_unload's weights and logits (the dense
    cases: test_tools_peft.py);
  - refusals naming the file and key: a rank that is not a positive int, an alpha that is
    not positive, a key that is no regex or matches no targeted module, PEFT's lora_bias.
ft-eval: test_eval.py; the strategies: test_dist_train.py; the memory plan:
tests/unit/test_memplan.c and test_memcheck.py; the GPU: test_gpu_model.py."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import ftref
import moe_ref
import rankrun
from adapter_ref import adapter_case, assert_saved_loads_in_peft, five_steps, \
    load_peft_checked, train_and_save


def _ranks(adapter_dir):
    """{module path: rank} of an adapter's pairs, from its lora_A tensors."""
    out = {}
    for k, t in load_file(str(adapter_dir / "adapter_model.safetensors")).items():
        if k.endswith(".lora_A.weight"):
            out[k[len("base_model.model."):-len(".lora_A.weight")]] = t.shape[0]
        elif k.endswith(".lora_embedding_A"):
            out[k[len("base_model.model."):-len(".lora_embedding_A")]] = t.shape[0]
    return out


# --- PEFT's adapter -> ours -------------------------------------------------------------

CASES = [("llama_gqa", "pat_layers"), ("qwen2", "pat_layers"), ("llama_gqa", "pat_rslora"),
         ("llama_gqa", "pat_dora"), ("llama_gqa", "pat_outer"), ("gemma", "pat_outer"),
         ("tied", "pat_outer_tie"), ("phi3", "pat_phi"), ("gemma2", "pat_no_k")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-{v}" for m, v in CASES])
def case(request, store, ft):
    model_name, variant = request.param
    return adapter_case(store, ft, model_name, variant, f"pat-{model_name}-{variant}",
                        pad=False)


def test_patterns_give_modules_their_ranks(case):
    """(A guard on the fixtures: PEFT gave the pairs several ranks.)"""
    assert len(set(_ranks(case.adapter_dir).values())) >= 2, _ranks(case.adapter_dir)


def test_patterns_logits_loss(case):
    ftref.assert_close("logits", case.out["logits"], case.ref_logits, ftref.TOL_LOGITS)
    ftref.assert_close("loss", case.out["loss"], case.ref_loss, ftref.TOL_LOGITS)


def test_patterns_grads(case):
    assert {k for k in case.out if k.startswith("grad.")} == {f"grad.{k}" for k in case.ref_grads}
    ftref.assert_tensor_dict_close("grad.", case.out, case.ref_grads, ftref.TOL_GRAD)


def test_first_key_wins(store):
    """pat_layers names layer 0's q_proj before q_proj: its rank is the first key's (2),
    the other layer's q_proj the second's (6); a regex key reaches gate and up of layer 0."""
    r = _ranks(store.adapter("llama_gqa", "pat_layers"))
    assert r["model.layers.0.self_attn.q_proj"] == 2 and r["model.layers.1.self_attn.q_proj"] == 6
    assert r["model.layers.0.mlp.gate_proj"] == r["model.layers.0.mlp.up_proj"] == 5
    assert r["model.layers.1.mlp.down_proj"] == 3 and r["model.layers.0.mlp.down_proj"] == 4


TRAIN_RUNS = [("llama_gqa", "pat_no_k", 4), ("phi3", "pat_phi_no_qkv", 1),
              ("llama_gqa", "pat_outer_no_k", 2), ("tied", "pat_outer_tie", 1)]


@pytest.mark.parametrize("model_name,variant,seed", TRAIN_RUNS,
                         ids=[f"{m}-{v}" for m, v, _ in TRAIN_RUNS])
def test_patterns_train_and_save_loads_in_peft(store, ft, tmp_path, model_name, variant, seed):
    r = train_and_save(store, ft, tmp_path, model_name, variant, seed, five_steps(1.0),
                       f"pat-train-{model_name}")
    ftref.assert_tensor_dict_close("weight.", r.out, r.ref["weights"], ftref.TOL_WEIGHT)
    ours = json.loads((r.saved / "adapter_config.json").read_text())
    given = json.loads((r.adapter_dir / "adapter_config.json").read_text())
    for k in ("rank_pattern", "alpha_pattern"):
        assert ours[k] == given[k] and list(ours[k]) == list(given[k]), k
    assert_saved_loads_in_peft(ft, r, f"pat-saved-{model_name}")


# --- MoE: the router and the fused experts per layer ------------------------------------

_MOE = ftref.Shape("mixtral_pat", "mixtral",
                   dict(ftref._BASE, intermediate_size=24, num_local_experts=4,
                        num_experts_per_tok=2, output_router_logits=True,
                        router_aux_loss_coef=0.3, sliding_window=None), seed=340)
moe_store = moe_ref.store_fixture({_MOE.name: _MOE}, "moe_pat", name="moe_store")

# explicit target_parameters (no pattern of PEFT's own): each pair's rank per layer; and
# the v4 names w1 / w3, which PEFT converts adding ".*\.gate_up_proj" (2 r, 2 alpha) after
# the keys given (PEFT's save sorts the keys: these give each module one key either way)
MOE_VARIANTS = {
    "params": dict(target_modules=["q_proj", "v_proj"],
                   target_parameters=["mlp.gate.weight", "mlp.experts.gate_up_proj",
                                      "mlp.experts.down_proj"],
                   rank_pattern={"layers.1.mlp.experts.gate_up_proj": 3, "down_proj": 2,
                                 "layers.0.mlp.gate.weight": 5, "v_proj": 6},
                   alpha_pattern={"layers.0.mlp.experts.down_proj": 3, "gate.weight": 5}),
    "converted": dict(target_modules=["q_proj", "gate", "w1", "w2", "w3"],
                      rank_pattern={"down_proj": 2, "layers.1.mlp.gate.weight": 6},
                      alpha_pattern={"layers.0.mlp.experts.down_proj": 3}),
}


@pytest.fixture(scope="module", params=list(MOE_VARIANTS))
def moe_case(request, moe_store, ft):
    name = request.param
    model_dir = moe_store(_MOE.name)
    adapter = ftref.build_adapter(model_dir, moe_store.root / f"adapter-{name}", seed=29,
                                  **MOE_VARIANTS[name])
    model = ftref.lora_mode_model(model_dir, adapter)
    ids, labels = ftref.make_batch(model.config.vocab_size, moe_ref.B, _MOE.T, _MOE.seed + 1)
    logits, loss, grads = ftref.hf_grads(model, ids, labels, key=ftref.peft_key)
    out = ft(dict(model_dir=model_dir, adapter_dir=adapter, mode="lora", input_ids=ids,
                  labels=labels), f"pat-moe-{name}")
    return dict(name=name, model_dir=model_dir, adapter=adapter, ids=ids, labels=labels,
                logits=logits, loss=loss, grads=grads, out=out)


def test_moe_patterns_logits_loss_grads(moe_case):
    c = moe_case
    shapes = {k: v.shape for k, v in load_file(str(c["adapter"] /
                                                   "adapter_model.safetensors")).items()}
    if c["name"] == "params":  # (the guard: layer 1's gate_up pair has rank 3, layer 0's 4)
        E = _MOE.cfg["num_local_experts"]
        key = "base_model.model.model.layers.{}.mlp.experts.base_layer.lora_A.weight"
        assert shapes[key.format(0)][0] == 4 * E and shapes[key.format(1)][0] == 3 * E
    assert {k for k in c["out"] if k.startswith("grad.")} == {f"grad.{k}" for k in c["grads"]}
    ftref.assert_close(f"[{c['name']}] logits", c["out"]["logits"], c["logits"],
                       ftref.TOL_LOGITS)
    ftref.assert_close(f"[{c['name']}] loss", c["out"]["loss"], c["loss"], ftref.TOL_LOGITS)
    ftref.assert_tensor_dict_close("grad.", c["out"], c["grads"], ftref.TOL_GRAD)


def test_moe_patterns_train_and_save(moe_case, ft, tmp_path):
    """Five AdamW steps (aux loss in) against torch; the saved adapter loads in PEFT with
    our tensors, the patterns as given."""
    c = moe_case
    train = moe_ref.train_hparams(1e-2)
    ref = ftref.reference_train(ftref.lora_mode_model(c["model_dir"], c["adapter"]), c["ids"],
                                c["labels"], train, key=ftref.peft_key)
    saved = tmp_path / "saved"
    out = ft(dict(model_dir=c["model_dir"], adapter_dir=c["adapter"], mode="lora",
                  input_ids=c["ids"], labels=c["labels"], train=train,
                  save_adapter=str(saved)), f"pat-moe-train-{c['name']}")
    ftref.assert_close("losses", out["losses"], ref["losses"], ftref.TOL_LOSSES)
    ftref.assert_tensor_dict_close("weight.", out, ref["weights"], ftref.TOL_WEIGHT)
    ours = json.loads((saved / "adapter_config.json").read_text())
    given = json.loads((c["adapter"] / "adapter_config.json").read_text())
    for k in ("rank_pattern", "alpha_pattern"):
        assert ours[k] == given[k], k
    tensors = load_file(str(saved / "adapter_model.safetensors"))
    pm = load_peft_checked(c["model_dir"], saved)
    mem = {ftref.peft_key(n): p for n, p in pm.named_parameters() if ".lora_" in n}
    assert set(mem) == set(tensors), sorted(set(mem) ^ set(tensors))
    for k, t in tensors.items():
        assert torch.equal(mem[k].detach(), t), k


def test_moe_patterns_merge(moe_case, tmp_path):
    """ft-merge folds each layer's router and expert pairs with their own scalings."""
    c = moe_case
    m = moe_ref.merge(c["model_dir"], c["adapter"], tmp_path / "merged", 5,
                      moe_ref.mixtral_ckpt_grads)
    moe_ref.check_merged(m)


# --- ft-train, ft-lora-init --------------------------------------------------------------

@pytest.fixture(scope="module")
def work(tmp_path_factory):
    assert rankrun.FT_TRAIN, "FT_TRAIN must be the path of bin/ft-train"
    d = tmp_path_factory.mktemp("patterns_train")
    rankrun.make_model(d, "model")
    rankrun.write_token_data(d)
    return d


def _config(d, name, **over):
    return rankrun.write_config(d, name, {"train.max_steps": 3, "train.warmup_steps": 1},
                                **over)


def _patterns(rank, alpha):
    return dict(tuning__lora__rank_pattern=json.dumps(rank),
                tuning__lora__alpha_pattern=json.dumps(alpha))


# q_proj's key comes before layer 0's own: the first match, q_proj's 6, is layer 0's too,
# which the saved order must keep (sorted, as PEFT saves, layer 0's key would come first)
TRAIN_RANK = {"q_proj": 6, "model.layers.0.self_attn.q_proj": 2, "layers.1.mlp.down_proj": 3,
              "lm_head": 5}
TRAIN_ALPHA = {"v_proj": 3, "layers.0.mlp.down_proj": 12}


def _check_loads_in_peft(model_dir, final, vocab=64):
    """The adapter loads in PEFT with every key used, holding the file's values; PEFT's
    logits are ours (the harness on the same adapter)."""
    tensors = load_file(str(final / "adapter_model.safetensors"))
    pm = load_peft_checked(model_dir, final)
    mem = {ftref.peft_key(n): p for n, p in pm.named_parameters() if ".lora_" in n}
    assert set(mem) == set(tensors), sorted(set(mem) ^ set(tensors))
    for k, t in tensors.items():
        assert torch.equal(mem[k].detach(), t), k
    return pm


def test_ft_train_patterns_saved_and_load_in_peft(work, ft):
    cfg = _config(work, "pat", tuning__lora__target_modules="q_proj,v_proj,down_proj,lm_head",
                  **_patterns(TRAIN_RANK, TRAIN_ALPHA))
    rankrun.run(cfg)
    final = work / "runs" / "pat" / "final"
    saved = json.loads((final / "adapter_config.json").read_text())
    assert list(saved["rank_pattern"].items()) == list(TRAIN_RANK.items())
    assert list(saved["alpha_pattern"].items()) == list(TRAIN_ALPHA.items())
    r = _ranks(final)
    assert r["model.layers.0.self_attn.q_proj"] == 6 and r["model.layers.1.mlp.down_proj"] == 3
    assert r["lm_head"] == 5 and r["model.layers.0.self_attn.v_proj"] == 4
    pm = _check_loads_in_peft(work / "model", final)
    ids, _ = ftref.make_batch(64, 2, 10, 7)
    ours = ft(dict(model_dir=work / "model", adapter_dir=final, mode="lora", input_ids=ids),
              "pat-ft-train-logits")
    ftref.assert_close("ft-train adapter logits (PEFT vs ours)", ours["logits"],
                       ftref.hf_forward(pm, ids)[0], ftref.TOL_LOGITS)


def test_ft_train_moe_patterns_saved_and_load_in_peft(moe_store, tmp_path, ft):
    """On a MoE: the user's keys first, PEFT's own for w1 + w3 after them (layer 1's
    gate_up pair rank 3 by the user's key, layer 0's 2 r by PEFT's)."""
    d = tmp_path
    shutil.copytree(moe_store(_MOE.name), d / "model")
    rankrun.write_token_data(d)
    rank = {"layers.1.mlp.experts.gate_up_proj": 3, "layers.0.mlp.gate.weight": 2}
    cfg = _config(d, "moe_pat", tuning__lora__target_modules="q_proj,gate,w1,w2,w3",
                  tuning__lora__dropout=0, **_patterns(rank, {"down_proj": 5}))
    rankrun.run(cfg)
    final = d / "runs" / "moe_pat" / "final"
    saved = json.loads((final / "adapter_config.json").read_text())
    pat = r".*\.gate_up_proj"
    assert list(saved["rank_pattern"].items()) == list(rank.items()) + [(pat, 8)]
    assert list(saved["alpha_pattern"].items()) == [("down_proj", 5), (pat, 16)]
    E = _MOE.cfg["num_local_experts"]
    r = _ranks(final)
    assert r["model.layers.1.mlp.experts.base_layer"] == 3 * E
    assert r["model.layers.0.mlp.experts.base_layer"] == 8 * E
    assert r["model.layers.0.mlp.gate"] == 2 and r["model.layers.1.mlp.gate"] == 4
    pm = _check_loads_in_peft(d / "model", final)
    ids, _ = ftref.make_batch(_MOE.cfg["vocab_size"], 2, 10, 7)
    ours = ft(dict(model_dir=d / "model", adapter_dir=final, mode="lora", input_ids=ids),
              "pat-ft-train-moe-logits")
    ftref.assert_close("ft-train MoE adapter logits (PEFT vs ours)", ours["logits"],
                       ftref.hf_forward(pm, ids)[0], ftref.TOL_LOGITS)


def test_ft_train_init_adapter_with_patterns(work):
    """tuning.lora.init_adapter from a PEFT adapter with patterns: a run config with the
    same patterns trains it on (every tensor moves; PEFT loads the result); one whose
    alpha_pattern gives a module another scaling is refused naming the module."""
    rank = {"model.layers.0.self_attn.q_proj": 2, "down_proj": 5}
    alpha = {"v_proj": 3}
    init = ftref.build_adapter(work / "model", work / "pat-init", seed=31,
                               target_modules=["q_proj", "v_proj", "down_proj"],
                               rank_pattern=rank, alpha_pattern=alpha)
    over = dict(tuning__lora__target_modules="q_proj,v_proj,down_proj",
                tuning__lora__init_adapter=str(init))
    rankrun.run(_config(work, "pat_init", **over, **_patterns(rank, alpha)))
    final = work / "runs" / "pat_init" / "final"
    ours = load_file(str(final / "adapter_model.safetensors"))
    given = load_file(str(init / "adapter_model.safetensors"))
    assert set(ours) == set(given)
    for k in ours:
        assert ours[k].shape == given[k].shape and not torch.equal(ours[k], given[k]), k
    _check_loads_in_peft(work / "model", final)
    out = rankrun.run(_config(work, "pat_init_bad", **over,
                              **_patterns(rank, {"v_proj": 4})), check=False)
    assert out.returncode != 0 and "init_adapter" in out.stderr and \
        "self_attn.v_proj" in out.stderr and "scaling" in out.stderr, out.stderr[-2000:]
    out = rankrun.run(_config(work, "pat_init_none", **over), check=False)
    assert out.returncode != 0 and "init_adapter" in out.stderr and \
        "rank" in out.stderr, out.stderr[-2000:]


def test_ft_lora_init_patterns(work, tmp_path):
    exe = ftref.tool_exe("FT_LORA_INIT", "ft-lora-init")
    out = tmp_path / "adapter"
    rank = {"q_proj": 3, "layers.1.mlp.up_proj": 7}
    ftref.run_tool([exe, "--model", work / "model", "--out", out, "--r", 4,
                    "--target", "q_proj,up_proj", "--rank-pattern", json.dumps(rank),
                    "--alpha-pattern", json.dumps({"up_proj": 2})])
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["rank_pattern"] == rank and cfg["alpha_pattern"] == {"up_proj": 2}
    r = _ranks(out)
    assert r["model.layers.1.mlp.up_proj"] == 7 and r["model.layers.0.mlp.up_proj"] == 4
    assert r["model.layers.0.self_attn.q_proj"] == 3
    pm = _check_loads_in_peft(work / "model", out)
    ids, _ = ftref.make_batch(64, 2, 10, 3)
    ftref.assert_close("lora-init logits", ftref.hf_forward(pm, ids)[0],
                       ftref.hf_forward(ftref.load_hf(work / "model"), ids)[0],
                       ftref.TOL_LOGITS)
    for bad, needle in [('{"q_proj": 0}', "--rank-pattern"), ('{"v_proj": 2}', "v_proj"),
                        ('{"q_proj": 2.5}', "--rank-pattern")]:
        cp = ftref.run_tool([exe, "--model", work / "model", "--out", tmp_path / "bad",
                             "--target", "q_proj", "--rank-pattern", bad], expect_rc=None)
        assert cp.returncode != 0 and needle in cp.stderr, cp.stderr
    cp = ftref.run_tool([exe, "--help"])
    assert "--rank-pattern" in cp.stdout and "--alpha-pattern" in cp.stdout


# --- refusals ---------------------------------------------------------------------------

def test_ft_train_refuses_bad_patterns(work):
    """Each refusal names the config key, the pattern key and what is wrong."""
    for name, rank, alpha, needles in [
            ("rank_float", {"q_proj": 2.5}, {}, ("tuning.lora.rank_pattern", "positive integer")),
            ("rank_zero", {"q_proj": 0}, {}, ("tuning.lora.rank_pattern", "positive integer")),
            ("alpha_neg", {}, {"q_proj": -1}, ("tuning.lora.alpha_pattern", "positive number")),
            ("regex", {"q_(proj": 2}, {}, ("tuning.lora.rank_pattern", "regular expression")),
            ("none", {"k_proj": 2}, {}, ("tuning.lora.rank_pattern", "matches none")),
            ("none_alpha", {}, {"layers.5.self_attn.q_proj": 2},
             ("tuning.lora.alpha_pattern", "matches none"))]:
        cfg = _config(work, f"pat_bad_{name}", tuning__lora__target_modules="q_proj,v_proj",
                      **_patterns(rank, alpha))
        out = rankrun.run(cfg, check=False)
        key = next(iter(rank or alpha))
        for needle in needles + (f"'{key}'",):
            assert out.returncode != 0 and needle in out.stderr, (name, out.stderr[-2000:])


def _edited(src, dst, **edit):
    shutil.copytree(src, dst)
    p = dst / "adapter_config.json"
    cfg = json.loads(p.read_text())
    cfg.update(edit)
    p.write_text(json.dumps(cfg))
    return dst


def test_adapter_bad_patterns_refused(store, ft_raw, tmp_path):
    src = store.adapter("llama_gqa", "pat_layers")
    ids, labels = ftref.make_batch(96, 1, 6, 0)
    rank = json.loads((src / "adapter_config.json").read_text())["rank_pattern"]
    for name, edit, needle in [
            ("rank_float", dict(rank_pattern=dict(rank, q_proj=6.0)), "'rank_pattern'"),
            ("alpha_zero", dict(alpha_pattern={"v_proj": 0}), "'alpha_pattern'"),
            ("regex", dict(alpha_pattern={"v_(proj": 3}), "'alpha_pattern'"),
            ("no_module", dict(alpha_pattern={"lm_head": 3}), "'alpha_pattern'"),
            ("wrong_rank", dict(rank_pattern=dict(rank, q_proj=5)), "shape")]:
        d = _edited(src, tmp_path / name, **edit)
        cp, _ = ft_raw(dict(model_dir=store.model("llama_gqa"), adapter_dir=d, mode="lora",
                            input_ids=ids, labels=labels), f"pat-bad-{name}")
        assert cp.returncode != 0 and needle in cp.stderr, (name, cp.stderr)
        assert "adapter_config.json" in cp.stderr or needle == "shape", (name, cp.stderr)


def test_lora_bias_refused(store, ft_raw, tmp_path):
    """PEFT's lora_bias (a bias on lora_B): refused naming the key, not as an unexpected
    tensor."""
    model_dir = store.model("llama_bias")
    adapter = ftref.build_adapter(model_dir, tmp_path / "adapter", seed=3,
                                  target_modules=["q_proj", "o_proj"], lora_bias=True)
    assert any(k.endswith("lora_B.bias") for k in
               load_file(str(adapter / "adapter_model.safetensors")))
    ids, labels = ftref.make_batch(96, 1, 6, 0)
    cp, _ = ft_raw(dict(model_dir=model_dir, adapter_dir=adapter, mode="lora", input_ids=ids,
                        labels=labels), "pat-lora-bias")
    assert cp.returncode != 0 and "'lora_bias'" in cp.stderr and \
        "adapter_config.json" in cp.stderr, cp.stderr
