"""Test 8: bad inputs make the harness exit non-zero with a message that says what and
where, not crash or produce numbers."""

import json
import os

import ftref


def _spec(model_dir, vocab=96):
    ids, labels = ftref.make_batch(vocab, 1, 8, 0)
    return dict(model_dir=model_dir, mode="eval", input_ids=ids, labels=labels)


def _expect_failure(ft_raw, spec, tag, must_name):
    cp, out_path = ft_raw(spec, tag)
    assert cp.returncode != 0, (
        f"expected a non-zero exit, got 0\nstderr:\n{cp.stderr}")
    assert cp.returncode > 0 and cp.returncode < 128, (
        f"exit status {cp.returncode}: killed by a signal, not a clean error\n{cp.stderr}")
    assert cp.stderr.strip(), "non-zero exit but nothing on stderr"
    for word in must_name:
        assert word in cp.stderr, f"stderr does not name {word!r}:\n{cp.stderr}"
    return cp


def test_truncated_weights(store, ft_raw, tmp_path):
    d = ftref.copy_model_dir(store.model("llama_gqa"), tmp_path / "truncated")
    f = d / "model.safetensors"
    os.truncate(f, f.stat().st_size // 2)
    _expect_failure(ft_raw, _spec(d), "truncated", ["model.safetensors"])


def test_weights_file_shorter_than_header_length(store, ft_raw, tmp_path):
    d = ftref.copy_model_dir(store.model("llama_gqa"), tmp_path / "tiny")
    f = d / "model.safetensors"
    os.truncate(f, 5)
    _expect_failure(ft_raw, _spec(d), "tiny-file", ["model.safetensors"])


def test_header_length_past_end(store, ft_raw, tmp_path):
    d = ftref.copy_model_dir(store.model("llama_gqa"), tmp_path / "badheader")
    f = d / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[0:8] = (len(data) + 100).to_bytes(8, "little")
    f.write_bytes(bytes(data))
    _expect_failure(ft_raw, _spec(d), "header-past-end", ["model.safetensors"])


def test_unsupported_rope_scaling(store, ft_raw, tmp_path):
    d = ftref.copy_model_dir(store.model("llama_gqa"), tmp_path / "dynamic")
    p = d / "config.json"
    c = json.loads(p.read_text())
    c["rope_scaling"] = {"rope_type": "dynamic", "factor": 4.0}
    p.write_text(json.dumps(c, indent=2))
    _expect_failure(ft_raw, _spec(d), "dynamic", ["rope_scaling", "dynamic"])


def test_missing_shard(store, ft_raw, tmp_path):
    d = ftref.copy_model_dir(store.model("sharded"), tmp_path / "missing-shard")
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    victim = sorted(set(idx["weight_map"].values()))[-1]
    (d / victim).unlink()
    _expect_failure(ft_raw, _spec(d), "missing-shard", [victim])


def test_missing_model_dir(ft_raw, tmp_path):
    _expect_failure(ft_raw, _spec(tmp_path / "no-such-model"), "no-model-dir", ["no-such-model"])


def test_gemma_activation_read_as_transformers_5_reads_it(store, ft_raw, tmp_path):
    """transformers 5's GemmaConfig applies hidden_act and ignores hidden_activation (which
    4.46 applied): a file whose hidden_act is not gelu_pytorch_tanh is refused even when
    its hidden_activation is; google/gemma-2b's pair (hidden_act "gelu", the legacy name
    5 reads as gelu_pytorch_tanh) loads."""
    from transformers import GemmaConfig
    d = ftref.copy_model_dir(store.model("gemma"), tmp_path / "act")
    p = d / "config.json"
    c = json.loads(p.read_text())
    c.update(hidden_activation="gelu_pytorch_tanh", hidden_act="silu")
    assert GemmaConfig(**c).hidden_act == "silu"  # what transformers 5 would apply
    p.write_text(json.dumps(c, indent=2))
    _expect_failure(ft_raw, _spec(d, vocab=c["vocab_size"]), "gemma-act", ["hidden_act", "silu"])
    c.update(hidden_act="gelu")
    assert GemmaConfig(**c).hidden_act == "gelu_pytorch_tanh"
    p.write_text(json.dumps(c, indent=2))
    cp, _ = ft_raw(_spec(d, vocab=c["vocab_size"]), "gemma-act-legacy")
    assert cp.returncode == 0, cp.stderr
