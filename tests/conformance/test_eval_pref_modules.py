"""ft-eval --preference with the adapter off as DPO's reference (no --reference) when the
adapter trains the embedding or the head in full or puts LoRA on them, against TRL 1.16's
DPOTrainer.evaluate() on PEFT's model loaded from the same adapter dir, its "ref" adapter
copy removed so that the reference is model.disable_adapter(): the LoRA layers compute
with their base_layer, PEFT's ModulesToSaveWrapper with its original_module.

For an adapter read from disk the original modules are the base checkpoint's embedding and
head; with tokens added (tokenizer.add_special_tokens + resize_token_embeddings before
get_peft_model) the resized base's: PEFT's save_embedding_layers saves a trained module's
original_module.weight beside its copy when the vocabulary grew (its loading puts it back
in the wrapper), and ft-eval uses it; where the adapter holds none (ft-train's adapters
with model.add_special_tokens, LoRA on the embedding beside a trained head) PEFT keeps the
user's resized base, whose new rows are taken as the mean of the old ones (ftkit's
resize, README "Added tokens, trained"; transformers' mean_resizing without its 1e-9
noise), here set so on TRL's side.

Cases: modules_to_save of the embedding and the head (untied), of a tied embedding
(ensure_weight_tying), of the head beside LoRA on the embedding, LoRA on the embedding, on
the embedding and the head (untied and tied; TRL refuses LoRA on lm_head, so the reference
is computed in torch on PEFT's model over TRL's own eval batches, itself checked against
TRL's evaluate where TRL computes); PEFT's adapters after a resize with
mean_resizing=False (the new rows of the originals are then random, saved), untied, tied,
and LoRA on the embedding beside the trained head (the head's originals not saved: the
mean); ft-train's adapters with model.add_special_tokens (untied and tied, after five DPO
steps). Figures as test_dpo_train.py holds them: the loss and logps 1e-5 relative, the
accuracy exactly, the rewards and margins to 1e-5 of beta max|logps|."""

import json
import os
import subprocess
import warnings

import pytest
import torch

import ftref
import rankrun
from test_added_tokens import ADD, family_dir
from test_dpo_tokens import config as dpo_tokens_config
from test_dpo_tokens import pairs as token_pairs

BETA = 0.1
MAXLEN = 32
METRICS = ["rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins",
           "logps/chosen", "logps/rejected"]

# id -> (family, how the adapter is made, LoraConfig keywords). "peft": get_peft_model on
# the checkpoint; "peft-resized": after adding ADD and resize_token_embeddings
# (mean_resizing=False); "ours": ft-train's DPO with model.add_special_tokens.
QV = ["q_proj", "v_proj"]
CASES = {
    "mts": ("llama", "peft", dict(target_modules=QV, modules_to_save=["embed_tokens", "lm_head"])),
    "mts-tied": ("tied", "peft", dict(target_modules=QV, modules_to_save=["embed_tokens"],
                                      ensure_weight_tying=True)),
    "mts-head-lora-embed": ("llama", "peft", dict(target_modules=QV + ["embed_tokens"],
                                                  modules_to_save=["lm_head"])),
    "lora-embed": ("llama", "peft", dict(target_modules=QV + ["embed_tokens"])),
    "lora-embed-head": ("llama", "peft", dict(target_modules=QV + ["embed_tokens", "lm_head"])),
    "lora-tied": ("tied", "peft", dict(target_modules=QV + ["embed_tokens", "lm_head"],
                                       ensure_weight_tying=True)),
    "tokens-peft": ("llama", "peft-resized",
                    dict(target_modules=QV, modules_to_save=["embed_tokens", "lm_head"])),
    "tokens-peft-tied": ("tied", "peft-resized", dict(target_modules=QV,
                                                      modules_to_save=["embed_tokens"],
                                                      ensure_weight_tying=True)),
    "tokens-peft-lora-embed": ("llama", "peft-resized",
                               dict(target_modules=QV + ["embed_tokens"],
                                    modules_to_save=["lm_head"])),
    "tokens-ours": ("llama", "ours", None),
    "tokens-ours-tied": ("tied", "ours", None),
}


def plain_pairs(n):
    """n string pairs of the model's own tokens (single letters)."""
    words = ["abc", "de", "fgh", "ij", "klm", "nop", "qr", "stu", "vw", "xyz"]
    out = []
    for i in range(n):
        w = [words[(i + k) % len(words)] for k in range(4)]
        out.append({"prompt": f"{w[0]} {w[1]}", "chosen": f" {w[2]} {w[0]}",
                    "rejected": f" {w[3]}" + (f" {w[1]}" if i % 2 else "")})
    return out


def lora_on_head(kw):
    return kw is not None and "lm_head" in kw["target_modules"]


def peft_adapter(model_dir, out, kw, seed, tok=None):
    """PEFT's adapter on the checkpoint (tok: after adding its tokens and resizing to it,
    mean_resizing=False), LoRA pairs and trained copies moved off their start; saved with
    the tokenizer when it grew."""
    from peft import LoraConfig, get_peft_model

    base = ftref.load_hf(model_dir)
    if tok is not None:
        torch.manual_seed(9)
        base.resize_token_embeddings(len(tok), mean_resizing=False)
    pm = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none",
                                         task_type="CAUSAL_LM", **kw))
    ftref.perturb_adapter_(pm, torch.Generator().manual_seed(800 + seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm.save_pretrained(str(out), safe_serialization=True)
    if tok is not None:
        tok.save_pretrained(str(out))
    return out


def mean_resized_base(model_dir, V):
    """transformers' base resized to V, its new rows exactly the mean of the old ones (the
    resized base ft-train's adapters were made for)."""
    base = ftref.load_hf(model_dir)
    V0 = base.config.vocab_size
    base.resize_token_embeddings(V, mean_resizing=False)
    with torch.no_grad():
        for w in {id(x): x for x in (base.get_input_embeddings().weight,
                                      base.get_output_embeddings().weight)}.values():
            w[V0:] = w[:V0].double().mean(0).float()
    return base


class Case:
    pass


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    d = tmp_path_factory.mktemp("eval_pref_models")
    out = {}
    for fam in ("llama", "tied"):
        model, V = family_dir(None, d, fam)
        out[fam] = (model, V)
    plain = d / "plain.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in plain_pairs(6)))
    tokens = d / "tokens.jsonl"
    tokens.write_text("".join(json.dumps(r) + "\n" for r in token_pairs(6)))
    return d, out, plain, tokens


@pytest.fixture(scope="module", params=list(CASES))
def case(request, families, tmp_path_factory):
    """The case's adapter dir, its data, and the torch model TRL evaluates (PEFT's model
    from the adapter dir on the base, resized where the vocabulary grew)."""
    from peft import PeftModel
    from transformers import AutoTokenizer

    _, fams, plain, tokens = families
    c = Case()
    c.id = request.param
    fam, how, kw = CASES[c.id]
    c.model, _ = fams[fam]
    c.d = tmp_path_factory.mktemp(f"eval_pref_{c.id}")
    c.data = plain if how == "peft" else tokens
    c.torch_ref = lora_on_head(kw)
    seed = list(CASES).index(c.id)
    if how == "peft":
        c.adapter = peft_adapter(c.model, c.d / "adapter", kw, seed)
    elif how == "peft-resized":
        tok = AutoTokenizer.from_pretrained(str(c.model))
        tok.add_special_tokens({"additional_special_tokens": ADD})
        c.adapter = peft_adapter(c.model, c.d / "adapter", kw, seed, tok)
    else:
        rankrun.run(dpo_tokens_config(c.d, "five", c.model, tokens, train__learning_rate=1e-2))
        c.adapter = c.d / "runs" / "five" / "final"
    c.tok = AutoTokenizer.from_pretrained(str(c.adapter if how != "peft" else c.model))
    base = ftref.load_hf(c.model) if how == "peft" else mean_resized_base(c.model, len(c.tok))
    c.peft = PeftModel.from_pretrained(base, str(c.adapter))
    c.peft.eval()
    return c


def ft_eval(c, *device):
    """ft-eval --preference --json on the case (on the CPU unless device gives --device
    and --fp32)."""
    res = subprocess.run([ftref.tool_exe("FT_EVAL", "ft-eval"), "--model", str(c.model),
                          "--adapter", str(c.adapter), "--data", str(c.data), "--preference",
                          "--json", "--beta", str(BETA), "--max-seq-len", str(MAXLEN),
                          "--batch-size", "4", *(device or ("--device", "cpu"))],
                         capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def trainer(c, model):
    """TRL's DPOTrainer for evaluation on the case's pairs (batches of 2: 3 full ones)."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    rows = [json.loads(x) for x in c.data.read_text().splitlines()]
    ds = Dataset.from_list(rows)
    args = DPOConfig(output_dir=str(c.d / "trl"), report_to=[], use_cpu=True, bf16=False,
                     gradient_checkpointing=False, per_device_eval_batch_size=2,
                     max_length=MAXLEN, beta=BETA)
    return DPOTrainer(model=model, args=args, processing_class=c.tok, train_dataset=ds,
                      eval_dataset=ds)


def trl_evaluate(c):
    """DPOTrainer.evaluate() with the adapter off as the reference: {metric: value}."""
    tr = trainer(c, c.peft)
    assert "ref" in tr.model.peft_config
    tr.model.delete_adapter("ref")
    tr.model.set_adapter("default")
    out = tr.evaluate()
    return {k: out["eval_" + k] for k in ["loss"] + METRICS}


def torch_evaluate(c):
    """TRL's sigmoid DPO figures computed in torch on PEFT's model over TRL's own eval
    batches (a trainer on the plain base prepares them): each row's summed log-probability
    of its completion, the policy's with the adapter on, the reference's under
    disable_adapter(); means over the pairs."""
    import torch.nn.functional as F

    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(str(c.model), dtype=torch.float32)
    if len(c.tok) != plain.config.vocab_size:
        plain.resize_token_embeddings(len(c.tok), mean_resizing=False)
    pol, ref = [], []
    with torch.no_grad():
        for b in trainer(c, plain).get_eval_dataloader():
            def logps():
                logits = c.peft(input_ids=b["input_ids"],
                                attention_mask=b["attention_mask"]).logits[:, :-1].double()
                lp = torch.log_softmax(logits, -1).gather(-1, b["input_ids"][:, 1:, None])
                return (lp[..., 0] * b["completion_mask"][:, 1:]).sum(-1)

            P = b["input_ids"].shape[0] // 2
            lp = logps()
            with c.peft.disable_adapter():
                lr = logps()
            pol.append(lp.view(2, P))
            ref.append(lr.view(2, P))
    pol, ref = torch.cat(pol, 1), torch.cat(ref, 1)
    wc, wr = BETA * (pol[0] - ref[0]), BETA * (pol[1] - ref[1])
    return {"loss": float(-F.logsigmoid(wc - wr).mean()), "rewards/chosen": float(wc.mean()),
            "rewards/rejected": float(wr.mean()),
            "rewards/accuracies": float((wc > wr).double().mean()),
            "rewards/margins": float((wc - wr).mean()), "logps/chosen": float(pol[0].mean()),
            "logps/rejected": float(pol[1].mean())}


def assert_figures(ours, ref):
    assert ours["accuracy"] == ref["rewards/accuracies"], (ours, ref)
    ftref.assert_close("eval loss", torch.tensor(ours["loss"]), torch.tensor(ref["loss"]),
                       ftref.TOL_LOSSES)
    scale = BETA * max(abs(ref["logps/chosen"]), abs(ref["logps/rejected"]))
    for k in METRICS:
        if k.startswith("logps/"):
            ftref.assert_close(k, torch.tensor(ours[k]), torch.tensor(ref[k]), ftref.TOL_LOSSES)
        else:
            assert abs(ours[k] - ref[k]) <= ftref.TOL_LOSSES * scale, (k, ours, ref)


def test_adapter_off_reference_matches_trl(case):
    ours = ft_eval(case)
    assert ours["pairs"] == 6 and ours["reference"] == "base", ours
    ref = torch_evaluate(case) if case.torch_ref else trl_evaluate(case)
    assert_figures(ours, ref)
    # the reference is not the policy (its rewards would be 0)
    assert abs(ref["rewards/margins"]) > 1e-3, ref


def test_torch_reference_is_trls(case):
    """The torch reference (for LoRA on lm_head, which TRL refuses) = TRL's evaluate()
    wherever TRL computes."""
    if case.torch_ref:
        pytest.skip("TRL refuses LoRA on lm_head")
    a, b = torch_evaluate(case), trl_evaluate(case)
    assert a["rewards/accuracies"] == b["rewards/accuracies"], (a, b)
    for k in ["loss", "logps/chosen", "logps/rejected"]:
        ftref.assert_close(k, torch.tensor(a[k]), torch.tensor(b[k]), ftref.TOL_LOSSES)


@pytest.mark.skipif(not (os.environ.get("FT_EMU") == "1" or torch.cuda.is_available()),
                    reason="no CUDA GPU (and not the emulated device: FT_EMU unset)")
def test_gpu_equals_cpu(case):
    """On the GPU (or the emulated device: FT_EVAL its build's) the originals are kept in
    the compute dtype on the device: fp32 gives the CPU's figures (1e-5), bf16 the CPU's
    log-probabilities to bf16 rounding (2e-3; the emulated device: < 4e-4)."""
    cpu, fp32 = ft_eval(case, "--device", "cpu"), ft_eval(case, "--device", "cuda", "--fp32")
    bf16 = ft_eval(case, "--device", "cuda")
    print(f"\n{case.id}: loss CPU {cpu['loss']:.6f} GPU fp32 {fp32['loss']:.6f} bf16 "
          f"{bf16['loss']:.6f}; logps/chosen CPU {cpu['logps/chosen']:.5f} bf16 "
          f"{bf16['logps/chosen']:.5f}")
    for k, v in cpu.items():
        if isinstance(v, float):
            assert abs(fp32[k] - v) <= 1e-5 * max(1.0, abs(v)), (k, v, fp32[k])
        else:
            assert fp32[k] == v, k
    for k in ("logps/chosen", "logps/rejected"):
        assert abs(bf16[k] - cpu[k]) <= 2e-3 * abs(cpu[k]), (k, cpu[k], bf16[k])
