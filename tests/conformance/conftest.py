"""pytest fixtures for the ftkit conformance suite (ftkit's C harness vs HF + PEFT).

Run:  FT_CONFORM=$PWD/build/tests/ft-conform OMP_NUM_THREADS=2 \
          .venv/bin/python -m pytest -q tests/conformance

Models and adapters are built once per session (lazily, on first use) under pytest's
tmp_path_factory and shared by every test module.
"""

import json
import os
import sys
import zlib
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import ftref  # noqa: E402

torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "2") or 2)))


class Store:
    """Lazily built model dirs and adapter dirs, shared by the whole session."""

    def __init__(self, root):
        self.root = Path(root)
        self._models = {}
        self._adapters = {}

    def model(self, name):
        if name not in self._models:
            self._models[name] = ftref.build_model_dir(ftref.SHAPES[name], self.root / name)
        return self._models[name]

    def adapter(self, model_name, variant, seed=None):
        """seed: of the random A/B values; default derived from the names."""
        if seed is None:
            seed = zlib.crc32(f"{model_name}/{variant}".encode())
        key = (model_name, variant, seed)
        if key not in self._adapters:
            kw = dict(LORA_VARIANTS[variant])
            literal = kw.pop("_literal_target_modules", None)
            d = ftref.build_adapter(self.model(model_name),
                                    self.root / f"adapter-{model_name}-{variant}-{seed}",
                                    seed=seed, **kw)
            if literal is not None:
                p = d / "adapter_config.json"
                c = json.loads(p.read_text())
                c["target_modules"] = literal
                p.write_text(json.dumps(c, indent=2))
            self._adapters[key] = d
        return self._adapters[key]


# LoRA adapter variants (peft LoraConfig keyword arguments; r=4, lora_alpha=8 unless set).
LORA_VARIANTS = {
    "qv": dict(target_modules=["q_proj", "v_proj"]),
    "all7": dict(target_modules=list(ftref.SEVEN)),
    # peft resolves "all-linear" to the list of linear layers (lm_head excluded) when it
    # saves; "all-linear-literal" leaves the string itself in adapter_config.json.
    "all-linear": dict(target_modules="all-linear"),
    "all-linear-literal": dict(target_modules="all-linear", _literal_target_modules="all-linear"),
    "rslora": dict(target_modules=["q_proj", "v_proj", "o_proj", "up_proj"], use_rslora=True),
    "o_down": dict(target_modules=["o_proj", "down_proj"]),
    # six of seven: for training runs (see test_train.py on k_proj)
    "no_k": dict(target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                 "down_proj"]),
    # a regex string: peft matches it with re.fullmatch against the module path
    "regex": dict(target_modules=r".*\.(q_proj|up_proj)"),
    # a regex that picks different projections in different layers
    "regex_layers": dict(target_modules=r"model\.layers\.1\.self_attn\.[qv]_proj|model\.layers\.0\.mlp\.down_proj"),
    # module paths, as recent peft writes "all-linear" out (and as a user may list them):
    # a name matches itself or as a dotted suffix, here of one layer's modules
    "paths": dict(target_modules=["model.layers.0.self_attn.q_proj", "layers.1.mlp.down_proj",
                                  "model.layers.1.self_attn.v_proj", "o_proj"]),
    # a module list restricted to some layers
    "layers_to_transform": dict(target_modules=["q_proj", "v_proj", "down_proj"], layers_to_transform=[1]),
    # per-module overrides: honour or reject
    "patterns": dict(target_modules=["q_proj", "v_proj", "down_proj"],
                     rank_pattern={"v_proj": 2}, alpha_pattern={"q_proj": 16}),
    # rank_pattern / alpha_pattern (test_lora_patterns.py): per layer and per module, the
    # first matching key (in the file's order, which PEFT writes sorted) winning over a
    # later one, a regex key; rsLoRA; DoRA; the embedding and the head (tied: one pair, of
    # the embedding's rank, the head's scaling its own keys' alpha / r, as PEFT has it);
    # Phi-3's fused modules. (*_no_k / *_no_qkv: for
    # the training runs, as test_train.py explains.)
    "pat_layers": dict(target_modules=list(ftref.SEVEN),
                       rank_pattern={"model.layers.0.self_attn.q_proj": 2, "q_proj": 6,
                                     "layers.1.mlp.down_proj": 3,
                                     r"model\.layers\.0\.mlp\.(gate|up)_proj": 5},
                       alpha_pattern={"v_proj": 3, "model.layers.1.self_attn.q_proj": 12,
                                      "k_proj": 20}),
    "pat_no_k": dict(target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                     "down_proj"],
                     rank_pattern={"model.layers.0.self_attn.q_proj": 2, "q_proj": 6,
                                   "layers.1.mlp.down_proj": 3, r"model\.layers\.0\.mlp\..*": 5},
                     alpha_pattern={"v_proj": 3, "model.layers.1.self_attn.q_proj": 12}),
    "pat_rslora": dict(target_modules=["q_proj", "v_proj", "o_proj", "up_proj"],
                       use_rslora=True, rank_pattern={"layers.1.self_attn.v_proj": 7, "o_proj": 1},
                       alpha_pattern={"up_proj": 3}),
    "pat_dora": dict(target_modules=["q_proj", "v_proj", "o_proj"], use_dora=True,
                     rank_pattern={"layers.0.self_attn.v_proj": 6}, alpha_pattern={"o_proj": 3}),
    "pat_outer": dict(target_modules=["q_proj", "v_proj", "embed_tokens", "lm_head"],
                      rank_pattern={"embed_tokens": 6, "lm_head": 2,
                                    "layers.1.self_attn.q_proj": 3},
                      alpha_pattern={"lm_head": 5, "embed_tokens": 3}),
    "pat_outer_no_k": dict(target_modules=["q_proj", "v_proj", "o_proj", "down_proj",
                                           "embed_tokens", "lm_head"],
                           rank_pattern={"embed_tokens": 6, "lm_head": 2, "o_proj": 3},
                           alpha_pattern={"lm_head": 5, "embed_tokens": 3}),
    "pat_outer_tie": dict(target_modules=["q_proj", "v_proj", "embed_tokens", "lm_head"],
                          ensure_weight_tying=True,
                          rank_pattern={"embed_tokens": 6, "lm_head": 2, "v_proj": 2},
                          alpha_pattern={"lm_head": 3}),
    "pat_phi": dict(target_modules=list(ftref.PHI3_FOUR),
                    rank_pattern={"qkv_proj": 6, "layers.1.mlp.gate_up_proj": 2},
                    alpha_pattern={"model.layers.0.self_attn.o_proj": 2}),
    "pat_phi_no_qkv": dict(target_modules=["o_proj", "gate_up_proj", "down_proj"],
                           rank_pattern={"layers.1.mlp.gate_up_proj": 2, "o_proj": 7},
                           alpha_pattern={"model.layers.0.mlp.down_proj": 2}),
    "dora": dict(target_modules=["q_proj", "v_proj"], use_dora=True),
    # DoRA on every linear layer of the block; with rsLoRA; without k_proj / qkv_proj for
    # training runs (see test_train.py)
    "dora_all": dict(target_modules="all-linear", use_dora=True),
    "dora_rslora": dict(target_modules=["q_proj", "o_proj", "up_proj", "down_proj"],
                        use_dora=True, use_rslora=True),
    "dora_no_k": dict(target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                      "down_proj"], use_dora=True),
    "dora_no_qkv": dict(target_modules=["o_proj", "gate_up_proj", "down_proj"], use_dora=True),
    # DoRA on the embedding (a magnitude per column) and on lm_head (per row)
    "dora_outer": dict(target_modules=["q_proj", "v_proj", "embed_tokens", "lm_head"],
                       use_dora=True),
    "dora_outer_phi": dict(target_modules=["qkv_proj", "o_proj", "embed_tokens", "lm_head"],
                           use_dora=True),
    "dora_head": dict(target_modules=["o_proj", "lm_head"], use_dora=True),
    "dora_embed": dict(target_modules=["embed_tokens", "up_proj"], use_dora=True),
    "dora_outer_no_k": dict(target_modules=["q_proj", "v_proj", "o_proj", "down_proj",
                                            "embed_tokens", "lm_head"], use_dora=True),
    "dora_outer_no_qkv": dict(target_modules=["o_proj", "gate_up_proj", "down_proj",
                                              "embed_tokens", "lm_head"], use_dora=True),
    # LoRA on the embedding (lora_embedding_A/B) and on lm_head, as a list and a regex
    "outer": dict(target_modules=["q_proj", "v_proj", "embed_tokens", "lm_head"]),
    "outer_head": dict(target_modules=["o_proj", "down_proj", "lm_head"]),
    "outer_embed": dict(target_modules=["embed_tokens", "up_proj"]),
    "outer_regex": dict(target_modules=r".*\.k_proj|lm_head|model\.embed_tokens"),
    "outer_no_k": dict(target_modules=["q_proj", "v_proj", "o_proj", "down_proj", "embed_tokens",
                                       "lm_head"]),
    "outer_no_qkv": dict(target_modules=["o_proj", "gate_up_proj", "down_proj", "embed_tokens",
                                         "lm_head"]),
    "outer_phi": dict(target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj",
                                      "embed_tokens", "lm_head"]),
    # tied models with ensure_weight_tying: the head's pair is the embedding's, transposed
    "outer_tie": dict(target_modules=["q_proj", "v_proj", "embed_tokens", "lm_head"],
                      ensure_weight_tying=True),
    "outer_tie_head": dict(target_modules=["o_proj", "lm_head"], ensure_weight_tying=True),
    "outer_tie_phi": dict(target_modules=["qkv_proj", "down_proj", "embed_tokens", "lm_head"],
                          ensure_weight_tying=True),
    "outer_tie_no_k": dict(target_modules=["q_proj", "v_proj", "o_proj", "down_proj",
                                           "embed_tokens", "lm_head"], ensure_weight_tying=True),
    # DoRA there too: the one pair, each module its own magnitude (the embedding's per
    # column, the head's per row)
    "dora_outer_tie": dict(target_modules=["q_proj", "v_proj", "embed_tokens", "lm_head"],
                           use_dora=True, ensure_weight_tying=True),
    "dora_tie_head": dict(target_modules=["o_proj", "lm_head"], use_dora=True,
                          ensure_weight_tying=True),
    "dora_outer_tie_phi": dict(target_modules=["qkv_proj", "o_proj", "embed_tokens", "lm_head"],
                               use_dora=True, ensure_weight_tying=True),
    "dora_outer_tie_no_k": dict(target_modules=["q_proj", "v_proj", "o_proj", "down_proj",
                                                "embed_tokens", "lm_head"], use_dora=True,
                                ensure_weight_tying=True),
    "dora_outer_tie_no_qkv": dict(target_modules=["o_proj", "gate_up_proj", "down_proj",
                                                  "embed_tokens", "lm_head"], use_dora=True,
                                  ensure_weight_tying=True),
    # the embedding and/or the head trained in full beside the pairs (modules_to_save)
    "mts_head": dict(target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"]),
    "mts_embed": dict(target_modules=["q_proj", "v_proj"], modules_to_save=["embed_tokens"]),
    "mts_both": dict(target_modules="all-linear", modules_to_save=["embed_tokens", "lm_head"]),
    "mts_head_all": dict(target_modules="all-linear", modules_to_save=["lm_head"]),
    # tied embeddings: PEFT's ensure_weight_tying, one copy shared by the embedding and head
    "mts_tie": dict(target_modules="all-linear", modules_to_save=["embed_tokens"],
                    ensure_weight_tying=True),
    "mts_tie_head": dict(target_modules="all-linear", modules_to_save=["lm_head"],
                         ensure_weight_tying=True),
    "mts_tie_no_k": dict(target_modules=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                         "down_proj"], modules_to_save=["embed_tokens"],
                         ensure_weight_tying=True),
    # LoRA on one of the embedding and head, the other in modules_to_save (tied models:
    # PEFT's default, no ensure_weight_tying, the two apart)
    "mts_head_lora_embed": dict(target_modules=["q_proj", "v_proj", "embed_tokens"],
                                modules_to_save=["lm_head"]),
    "mts_embed_lora_head": dict(target_modules=["q_proj", "v_proj", "lm_head"],
                                modules_to_save=["embed_tokens"]),
    "mts_head_lora_embed_no_k": dict(target_modules=["q_proj", "v_proj", "o_proj",
                                                     "embed_tokens"],
                                     modules_to_save=["lm_head"]),
    "mts_embed_lora_head_no_k": dict(target_modules=["q_proj", "v_proj", "o_proj", "lm_head"],
                                     modules_to_save=["embed_tokens"]),
    # (for training runs: without k_proj / qkv_proj, as test_train.py explains)
    "mts_both_no_k": dict(target_modules=["q_proj", "v_proj", "o_proj", "gate_proj",
                                          "up_proj", "down_proj"],
                          modules_to_save=["embed_tokens", "lm_head"]),
    "mts_head_no_k": dict(target_modules=["q_proj", "v_proj", "o_proj", "gate_proj",
                                          "up_proj", "down_proj"], modules_to_save=["lm_head"]),
    "mts_both_no_qkv": dict(target_modules=["o_proj", "gate_up_proj", "down_proj"],
                            modules_to_save=["embed_tokens", "lm_head"]),
    # Phi-3's fused modules (qkv_proj: one A, B over [q; k; v] rows; gate_up_proj likewise)
    "all4": dict(target_modules=list(ftref.PHI3_FOUR)),
    "qkv_down": dict(target_modules=["qkv_proj", "down_proj"]),
    # without qkv_proj: for training runs (k rows, as test_train.py says of k_proj)
    "no_qkv": dict(target_modules=["o_proj", "gate_up_proj", "down_proj"]),
    "phi_paths": dict(target_modules=["model.layers.0.self_attn.qkv_proj",
                                      "layers.1.mlp.gate_up_proj", "o_proj"]),
}


@pytest.fixture(autouse=True)
def _record_context(request):
    ftref.CONTEXT[0] = request.node.nodeid.split("::", 1)[-1]
    yield
    ftref.CONTEXT[0] = ""


@pytest.fixture(scope="session")
def store(tmp_path_factory):
    return Store(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def harness_exe():
    exe, err = ftref.harness_path()
    if err:
        pytest.fail(err, pytrace=False)
    return exe


@pytest.fixture(scope="session")
def ft(harness_exe, tmp_path_factory):
    """ft(spec, tag) -> ftref.Output: runs the C harness; fails the test on a non-zero exit
    (with its stderr)."""
    runs = tmp_path_factory.mktemp("runs")
    counter = [0]

    def run(spec, tag):
        counter[0] += 1
        tag = f"{counter[0]:03d}-{tag}"
        try:
            return ftref.run_harness(harness_exe, spec, runs, tag)
        except ftref.HarnessError as e:
            pytest.fail(str(e), pytrace=False)

    return run


@pytest.fixture(scope="session")
def ft_raw(harness_exe, tmp_path_factory):
    """ft_raw(spec, tag) -> (CompletedProcess, out_path): for tests that expect failure."""
    runs = tmp_path_factory.mktemp("raw-runs")
    counter = [0]

    def run(spec, tag):
        counter[0] += 1
        return ftref.run_harness_raw(harness_exe, spec, runs, f"{counter[0]:03d}-{tag}")

    return run


def pytest_terminal_summary(terminalreporter):
    """How close to its tolerance each kind of comparison came (worst rel_err / tol)."""
    if not ftref.RECORD:
        return
    worst = {}
    for what, err, tol in ftref.RECORD:
        kind = "tol %g" % tol
        if kind not in worst or err / tol > worst[kind][0]:
            worst[kind] = (err / tol, err, what)
    tr = terminalreporter
    tr.section("conformance headroom (worst rel_err per tolerance)")
    tr.write_line(f"{len(ftref.RECORD)} tensor comparisons")
    for kind, (ratio, err, what) in sorted(worst.items()):
        tr.write_line(f"{kind}: worst {err:.2e} ({ratio:.1%} of tol) in {what}")
