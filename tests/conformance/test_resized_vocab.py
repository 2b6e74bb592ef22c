"""Adapters for a grown vocabulary: tokens added to the tokenizer, the model resized with
resize_token_embeddings, then get_peft_model + save_pretrained. PEFT's adapter then holds
the embedding and the head of the new vocabulary in full: as modules_to_save (with the
wrapper's two copies, <module>.modules_to_save.weight and .original_module.weight), as the
base weights save_embedding_layers adds when the vocabulary changed (LoRA elsewhere), or as
the base_layer of LoRA on them. We load it on the unresized checkpoint: the model takes the
adapter's vocabulary (its embedding / head tensors' rows), the checkpoint gives the old
rows and the adapter all of them.

PEFT's adapter -> ours, every family (untied and tied): logits and loss (1e-5) and the
gradient of every trainable tensor (1e-4) against PeftModel.from_pretrained on the base
resized to the adapter's vocabulary (itself checked against the model that saved it), on
batches that use the new tokens. An adapter whose head PEFT does not save (LoRA on the
embedding alone, untied head: PEFT's reload keeps random rows) is refused, as is one whose
tensors disagree on the vocabulary."""

import json
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

import ftref

B = 2
ADDED = 3  # tokens added (the new ids V, V+1, V+2)

UNTIED = ["llama_gqa", "mistral_sw", "qwen2", "qwen3", "granite", "olmo2", "phi3"]
TIED = ["tied", "gemma", "gemma2", "smollm3"]

# variant -> LoraConfig keywords (untied, tied)
VARIANTS = {
    "mts": (dict(target_modules=["o_proj", "down_proj"],
                 modules_to_save=["embed_tokens", "lm_head"]),
            dict(target_modules=["o_proj", "down_proj"], modules_to_save=["embed_tokens"],
                 ensure_weight_tying=True)),
    "saved": (dict(target_modules=["o_proj", "down_proj"]),
              dict(target_modules=["o_proj", "down_proj"])),
    # (LoRA on a tied embedding is refused whatever the vocabulary)
    "lora_outer": (dict(target_modules=["o_proj", "embed_tokens", "lm_head"]), None),
}

CASES = ([(m, v) for m in UNTIED for v in VARIANTS] +
         [(m, v) for m in TIED for v in VARIANTS if VARIANTS[v][1]])


def resized_base(model_dir, V):
    base = ftref.load_hf(model_dir)
    torch.manual_seed(7)  # resize_token_embeddings samples the new rows
    base.resize_token_embeddings(V)
    return base


def make_adapter(model_dir, out_dir, kw, seed):
    """PEFT's adapter after adding ADDED tokens; returns (dir, the saving model)."""
    from peft import LoraConfig, get_peft_model

    V = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    base = resized_base(model_dir, V + ADDED)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none",
                                         task_type="CAUSAL_LM", **kw))
    ftref.perturb_adapter_(pm, torch.Generator().manual_seed(600 + seed))
    out_dir.mkdir(parents=True)
    (out_dir / "README.md").write_text("---\nlibrary_name: peft\n---\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm.save_pretrained(str(out_dir), safe_serialization=True)
    pm.eval()
    return out_dir, pm


def batch(V, T, seed, pad):
    ids, labels = ftref.make_batch(V + ADDED, B, T, seed, pad=pad)
    ids[0, 2], ids[1, 3], ids[1, T - 2] = V, V + 1, V + 2  # the new tokens, as input
    labels[0, 2], labels[1, 3], labels[1, T - 2] = V, V + 1, V + 2
    labels[0, 4] = V + 2  # and as a label only
    return ids, labels


@pytest.fixture(scope="module", params=CASES, ids=[f"{m}-{v}" for m, v in CASES])
def case(request, store, ft, tmp_path_factory):
    from peft import PeftModel

    model_name, variant = request.param
    shape = ftref.SHAPES[model_name]
    tied = shape.cfg["tie_word_embeddings"]
    model_dir = store.model(model_name)
    V = shape.cfg["vocab_size"]
    adapter_dir, saver = make_adapter(model_dir, tmp_path_factory.mktemp("rv") / "adapter",
                                      VARIANTS[variant][tied], len(model_name))
    ref = PeftModel.from_pretrained(resized_base(model_dir, V + ADDED), str(adapter_dir),
                                    is_trainable=True)
    ref.eval()
    ids, labels = batch(V, shape.T, shape.seed + 5, shape.cfg.get("pad_token_id"))
    saved_logits, _ = ftref.hf_forward(saver, ids, labels)
    c = type("Case", (), {})()
    c.V, c.tied, c.variant = V, tied, variant
    c.ref_logits, c.ref_loss, c.ref_grads = ftref.hf_grads(ref, ids, labels, key=ftref.ours_key)
    # PEFT's own reload restores the saving model (the new rows come from the adapter)
    ftref.assert_close("reloaded logits", c.ref_logits, saved_logits, ftref.TOL_LOGITS)
    c.out = ft(dict(model_dir=model_dir, adapter_dir=adapter_dir, mode="lora", input_ids=ids,
                    labels=labels), f"rv-{model_name}-{variant}")
    return c


def test_resized_logits_loss(case):
    assert case.out["logits"].shape[-1] == case.V + ADDED
    ftref.assert_close("logits", case.out["logits"], case.ref_logits, ftref.TOL_LOGITS)
    ftref.assert_close("loss", case.out["loss"], case.ref_loss, ftref.TOL_LOGITS)


def test_resized_grads(case):
    if case.variant == "mts":
        assert "model.embed_tokens.weight" in case.ref_grads
    ftref.assert_tensor_dict_close("grad.", case.out, case.ref_grads, ftref.TOL_GRAD)


def test_resized_head_missing_refused(store, ft_raw, tmp_path):
    """LoRA on the embedding alone of an untied model: PEFT saves the embedding's base
    (base_layer) but not the resized head, whose new rows it has nowhere."""
    model_dir = store.model("llama_gqa")
    V = ftref.SHAPES["llama_gqa"].cfg["vocab_size"]
    d, _ = make_adapter(model_dir, tmp_path / "a",
                        dict(target_modules=["o_proj", "embed_tokens"]), 1)
    assert not any("lm_head" in k for k in load_file(d / "adapter_model.safetensors"))
    ids, _ = ftref.make_batch(V, 1, 4, 0)
    cp, _ = ft_raw(dict(model_dir=model_dir, adapter_dir=d, mode="lora", input_ids=ids),
                   "rv-no-head")
    assert cp.returncode != 0
    assert "lm_head.weight" in cp.stderr and str(V + ADDED) in cp.stderr, cp.stderr


def test_resized_vocab_disagrees_refused(store, ft_raw, tmp_path):
    """The adapter's embedding and head of two vocabulary sizes: refused naming both."""
    model_dir = store.model("llama_gqa")
    V = ftref.SHAPES["llama_gqa"].cfg["vocab_size"]
    d, _ = make_adapter(model_dir, tmp_path / "a", VARIANTS["saved"][0], 2)
    f = d / "adapter_model.safetensors"
    sd = load_file(f)
    key = "base_model.model.lm_head.weight"
    sd[key] = torch.cat([sd[key], sd[key][:1]]).contiguous()
    save_file(sd, f, metadata={"format": "pt"})
    ids, _ = ftref.make_batch(V, 1, 4, 0)
    cp, _ = ft_raw(dict(model_dir=model_dir, adapter_dir=d, mode="lora", input_ids=ids),
                   "rv-disagree")
    assert cp.returncode != 0
    assert "vocabulary" in cp.stderr and str(V + ADDED + 1) in cp.stderr, cp.stderr


def test_resized_smaller_refused(store, ft_raw, tmp_path):
    """An adapter for a smaller vocabulary than the checkpoint's: refused."""
    from peft import LoraConfig, get_peft_model

    model_dir = store.model("llama_gqa")
    V = ftref.SHAPES["llama_gqa"].cfg["vocab_size"]
    base = resized_base(model_dir, V - 2)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, task_type="CAUSAL_LM",
                                         target_modules=["q_proj"]))
    d = tmp_path / "a"
    d.mkdir()
    (d / "README.md").write_text("---\nlibrary_name: peft\n---\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm.save_pretrained(str(d), safe_serialization=True)
    ids, _ = ftref.make_batch(V - 2, 1, 4, 0)
    cp, _ = ft_raw(dict(model_dir=model_dir, adapter_dir=d, mode="lora", input_ids=ids),
                   "rv-smaller")
    assert cp.returncode != 0
    assert "shrunk vocabulary" in cp.stderr and str(V - 2) in cp.stderr, cp.stderr


MERGE_CASES = [("llama_gqa", "mts"), ("llama_gqa", "saved"), ("llama_gqa", "lora_outer"),
               ("phi3", "saved"), ("tied", "mts"), ("gemma", "saved")]


@pytest.mark.parametrize("model_name,variant", MERGE_CASES,
                         ids=[f"{m}-{v}" for m, v in MERGE_CASES])
def test_resized_merge(store, tmp_path, model_name, variant):
    """ft-merge of PEFT's adapter for the grown vocabulary: config.json's vocab_size is the
    new one, every tensor is PEFT's merge_and_unload's (1e-4 relative: fp32 in, fp32 out),
    transformers loads it with no missing or unexpected keys to PEFT's logits, and the
    tokenizer files saved beside the adapter replace the base's."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    shape = ftref.SHAPES[model_name]
    tied = shape.cfg["tie_word_embeddings"]
    model_dir = ftref.copy_model_dir(store.model(model_name), tmp_path / "base")
    (model_dir / "tokenizer_config.json").write_text('{"base": true}\n')
    (model_dir / "tokenizer.json").write_text('{"base": true}\n')
    V = shape.cfg["vocab_size"]
    adapter, _ = make_adapter(model_dir, tmp_path / "adapter", VARIANTS[variant][tied], 4)
    (adapter / "tokenizer_config.json").write_text('{"added": 3}\n')
    (adapter / "tokenizer.json").write_text('{"added": 3}\n')
    out = tmp_path / "merged"
    ftref.run_tool([ftref.tool_exe("FT_MERGE", "ft-merge"), "--model", model_dir, "--adapter",
                    adapter, "--out", out, "--dtype", "f32"])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["vocab_size"] == V + ADDED
    for name in ("tokenizer_config.json", "tokenizer.json"):
        assert (out / name).read_text() == (adapter / name).read_text(), name

    pm = PeftModel.from_pretrained(resized_base(model_dir, V + ADDED), str(adapter))
    pm.eval()
    ids, _ = batch(V, shape.T, 3, None)
    ref_logits, _ = ftref.hf_forward(pm, ids)
    ref_state = {k: v.detach().clone() for k, v in pm.merge_and_unload().state_dict().items()}
    if tied:
        ref_state.pop("lm_head.weight", None)
    ours = load_file(str(out / "model.safetensors"))
    assert set(ours) == set(ref_state), sorted(set(ours) ^ set(ref_state))
    for k, ref in ref_state.items():
        ftref.assert_close(f"merged {k}", ours[k], ref.float(), ftref.TOL_WEIGHT)
    merged, info = AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    merged.eval()
    assert merged.get_input_embeddings().weight.shape[0] == V + ADDED
    ftref.assert_close("merged logits", ftref.hf_forward(merged, ids)[0], ref_logits,
                       ftref.TOL_LOGITS)


def test_resized_init_adapter_refused(tmp_path):
    """Training from such an adapter (tuning.lora.init_adapter: the model is built from the
    run config's LoRA settings) is refused naming the two vocabularies, before any step."""
    import rankrun

    model_dir = rankrun.make_model(tmp_path, "model")
    rankrun.write_token_data(tmp_path)
    d, _ = make_adapter(model_dir, tmp_path / "adapter",
                        dict(target_modules=["q_proj", "v_proj"],
                             modules_to_save=["embed_tokens", "lm_head"]), 5)
    cfg = rankrun.write_config(tmp_path, "run", {"train.max_steps": 2},
                               tuning__lora__target_modules="q_proj,v_proj",
                               tuning__lora__modules_to_save="embed_tokens,lm_head",
                               tuning__lora__init_adapter=str(d))
    out = rankrun.run(cfg, check=False)
    assert out.returncode != 0
    assert "init_adapter" in out.stderr and "67" in out.stderr and "64" in out.stderr, \
        out.stderr[-2000:]
    assert not (tmp_path / "runs" / "run" / "metrics.jsonl").exists()


def test_resized_preference_reference_refused(tmp_path):
    """ft-eval --preference with such an adapter and its unresized base as --reference:
    refused naming both vocabularies (the new tokens would index past the reference's
    embedding)."""
    import os
    import subprocess

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    import rankrun

    model_dir = rankrun.make_model(tmp_path, "model")

    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,"
    tk = Tokenizer(models.BPE({c: i for i, c in enumerate(chars)}, []))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, eos_token=".",
                            pad_token=",").save_pretrained(model_dir)
    d, _ = make_adapter(model_dir, tmp_path / "adapter", VARIANTS["saved"][0], 6)
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": "abc d", "chosen": " ef", "rejected": " gh"}) + "\n")
    out = subprocess.run([ftref.tool_exe("FT_EVAL", "ft-eval"), "--model", str(model_dir),
                          "--adapter", str(d), "--reference", str(model_dir), "--data",
                          str(data), "--preference"], capture_output=True, text=True,
                         env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=300)
    assert out.returncode != 0
    assert "--reference" in out.stderr and "64" in out.stderr and "67" in out.stderr, out.stderr


TRAIN_CASES = [("llama_gqa", "mts"), ("llama_gqa", "saved"), ("llama_gqa", "lora_outer"),
               ("phi3", "saved"), ("tied", "mts"), ("tied", "saved")]
TRAIN = dict(steps=5, lr=1e-2, betas=[0.9, 0.999], eps=1e-8, weight_decay=0.01,
             warmup_steps=2, scheduler="cosine", max_grad_norm=1.0)


@pytest.mark.parametrize("model_name,variant", TRAIN_CASES,
                         ids=[f"{m}-{v}" for m, v in TRAIN_CASES])
def test_resized_train_and_save_loads_in_peft(store, ft, tmp_path, model_name, variant):
    """Five AdamW steps from PEFT's grown-vocabulary adapter (the library's training, as
    ft-train runs it) against torch's on PEFT's model; our saved adapter then loads with
    PeftModel.from_pretrained on the base resized to its vocabulary with no missing or
    unexpected keys, every tensor PEFT holds ours, and the same logits as ours. The
    embedding and head PEFT saves for the vocabulary (save_embedding_layers) are saved
    again."""
    from peft import PeftModel

    shape = ftref.SHAPES[model_name]
    tied = shape.cfg["tie_word_embeddings"]
    V = shape.cfg["vocab_size"]
    model_dir = store.model(model_name)
    adapter, _ = make_adapter(model_dir, tmp_path / "adapter", VARIANTS[variant][tied], 8)
    ids, labels = batch(V, shape.T, shape.seed + 9, shape.cfg.get("pad_token_id"))
    ref_model = PeftModel.from_pretrained(resized_base(model_dir, V + ADDED), str(adapter),
                                          is_trainable=True)
    ref_model.eval()
    ref = ftref.reference_train(ref_model, ids, labels, TRAIN, key=ftref.ours_key)
    saved = tmp_path / "saved"
    out = ft(dict(model_dir=model_dir, adapter_dir=adapter, mode="lora", input_ids=ids,
                  labels=labels, train=TRAIN, save_adapter=saved), f"rv-train-{model_name}")
    ftref.assert_close("losses", out["losses"], ref["losses"], ftref.TOL_LOSSES)
    ftref.assert_tensor_dict_close("weight.", out, ref["weights"], ftref.TOL_WEIGHT)

    tensors = load_file(str(saved / "adapter_model.safetensors"))
    if variant == "saved":
        assert tensors["base_model.model.model.embed_tokens.weight"].shape[0] == V + ADDED
        assert tensors["base_model.model.lm_head.weight"].shape[0] == V + ADDED
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm = PeftModel.from_pretrained(resized_base(model_dir, V + ADDED), str(saved))
    pm.eval()
    bad = [str(w.message) for w in caught
           if "missing" in str(w.message).lower() or "unexpected" in str(w.message).lower()]
    assert not bad, bad
    state = pm.state_dict()
    for k, t in tensors.items():
        name = k.removeprefix("base_model.model.")
        held = [v for n, v in state.items()
                if ftref.peft_key(n) == k or n.removeprefix("base_model.model.") in (
                    name.replace(".weight", ".modules_to_save.default.weight"),
                    name.replace(".weight", ".base_layer.weight"), name)]
        assert held and all(torch.equal(h, t) for h in held), k
    ours = ft(dict(model_dir=model_dir, adapter_dir=saved, mode="lora", input_ids=ids),
              f"rv-saved-{model_name}")
    ftref.assert_close("saved adapter logits (PEFT vs ours)", ours["logits"],
                       ftref.hf_forward(pm, ids)[0], ftref.TOL_LOGITS)
