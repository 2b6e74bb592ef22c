"""Planned beside measured, and the auto batch size, on real ft-train processes and
Open MPI ranks (CPU).

- `ft-train --measure` runs one real training step and prints the plan with every
  rank's allocator peaks beside it: in one process and on 2-4 ranks with zero3, fsdp,
  zero1 and zero2 (+ optimizer offload), model_parallel (+ GPipe chunks), LoRA and full
  fine-tuning, tied embeddings: measured == planned (the exact cpu rows) in every
  category on every rank, and the sharded categories are about 1/N of one process's;
  nothing is written to the run dir; uneven GPipe chunks train as one process does;
  `make memory-check` launches the ranks the way the train targets do;
- `train.batch_size: auto` picks the largest micro-batch whose planned peak fits
  `train.memory_budget` (exactly at the boundary: the budget = the plan of b bytes picks
  b, one byte less picks b - 1), grad_accum auto reaches train.global_batch_size, the
  chosen values are in the printed line, run_summary.json, config.yaml, the
  TensorBoard config text and --print-config; a budget nothing fits is an error.

Run:  FT_TRAIN=$PWD/bin/ft-train .venv/bin/python -m pytest -q tests/conformance/test_memcheck.py
"""

import json
import re

import pytest

import rankrun
from rankrun import make, FT_TRAIN, make_model, run, write_token_data

CATS = ["weights", "gradients", "optimizer", "activations", "workspace"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    assert FT_TRAIN, "FT_TRAIN must be the path of bin/ft-train"
    d = tmp_path_factory.mktemp("memcheck")
    make_model(d, "model")
    make_model(d, "tied", tied=True)
    write_token_data(d)
    return d


def write_config(d, name, model="model", mode="lora", **over):
    return rankrun.write_config(d, name, {"train.max_steps": 2}, model=model, mode=mode, **over)


def parse_measure(stdout):
    """{rank: {"planned"|"measured"|"diff": {category|"total"|"host": int}}} and the
    MiB table's rows by name."""
    ranks = {}
    pat = re.compile(r"^(\d+)\s+(planned|measured|diff)\s+([-+\d\s]+)$")
    for line in stdout.splitlines():
        m = pat.match(line)
        if m:
            vals = [int(v) for v in m.group(3).split()]
            assert len(vals) == 7, line
            ranks.setdefault(int(m.group(1)), {})[m.group(2)] = dict(
                zip(CATS + ["total", "host"], vals))
    table = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) >= 8 and re.match(r"^(cpu|gpu)-\S+|measured$", parts[0]):
            table[parts[0]] = line
    return ranks, table


def assert_exact(stdout, world):
    ranks, table = parse_measure(stdout)
    assert sorted(ranks) == list(range(world)), stdout
    for r, rows in ranks.items():
        assert rows["planned"] == rows["measured"], (r, rows)
        assert set(rows["diff"].values()) == {0}, (r, rows)
        assert rows["measured"]["total"] == sum(rows["measured"][c] for c in CATS)
        assert rows["measured"]["weights"] > 0 and rows["measured"]["activations"] > 0
    assert "measured == planned on every rank and category" in stdout
    assert "measured" in table
    return ranks


@pytest.mark.parametrize("mode,model", [("lora", "model"), ("full", "model"),
                                        ("full", "tied")])
def test_measure_one_process(work, mode, model):
    name = f"m1_{mode}_{model}"
    cfg = write_config(work, name, model=model, mode=mode)
    out = run(cfg, 1, "--measure")
    ranks = assert_exact(out.stdout, 1)
    assert "planned = cpu-fp32 (exact)" in out.stdout
    assert "cpu-fp32*" in out.stdout and "exact" in out.stdout and "predicted" in out.stdout
    assert "memory check: one step of none on 1 rank" in out.stderr
    # one step, nothing written: no run dir, no checkpoint, no events
    assert not (work / "runs" / name).exists()
    # --plan alone prints the same planned bytes (MiB table): the cpu-fp32 row
    plan = run(cfg, 1, "--plan").stdout
    mib = float(plan.split("cpu-fp32*")[1].split()[6])
    assert abs(mib - ranks[0]["planned"]["total"] / 2**20) < 0.06


@pytest.fixture(scope="module")
def one_process(work):
    """The whole model in one process (full fine-tuning, micro-batch 4)."""
    cfg = write_config(work, "m1_ref", mode="full")
    return parse_measure(run(cfg, 1, "--measure").stdout)[0][0]["measured"]


@pytest.mark.parametrize("strategy,mode", [("zero3", "full"), ("fsdp", "full"),
                                           ("zero3", "lora"), ("fsdp", "lora")])
def test_measure_two_ranks_sharded(work, one_process, strategy, mode):
    name = f"m2_{strategy}_{mode}"
    cfg = write_config(work, name, mode=mode, dist__strategy=strategy)
    out = run(cfg, 2, "--measure")
    ranks = assert_exact(out.stdout, 2)
    assert f"planned = cpu-{strategy} (exact)" in out.stdout
    assert f"one step of {strategy} on 2 ranks" in out.stderr
    assert f"cpu-{strategy}*" in out.stdout
    assert not (work / "runs" / name).exists()
    if mode == "full":
        # parameters, gradients and optimizer state: each rank keeps about half
        for r in (0, 1):
            m = ranks[r]["measured"]
            for c in ("weights", "gradients", "optimizer"):
                assert abs(m[c] - one_process[c] / 2) <= 0.01 * one_process[c], (r, c, m[c])
            assert m["activations"] == one_process["activations"]
        total = sum(ranks[r]["measured"]["weights"] for r in (0, 1))
        assert total == one_process["weights"]


def test_measure_zero1_zero2_offload_tied(work, one_process):
    for strategy, extra, world in [("zero1", {}, 2), ("zero2", {}, 3),
                                   ("zero2", {"dist__offload_optimizer": "cpu"}, 2)]:
        name = f"m_{strategy}_{world}_{len(extra)}"
        cfg = write_config(work, name, mode="full", model="tied", dist__strategy=strategy,
                           train__gradient_checkpointing="true", **extra)
        out = run(cfg, world, "--measure")
        ranks = assert_exact(out.stdout, world)
        if extra:
            # the AdamW state, master and gradient copy in host memory: none on the device
            for r in range(world):
                assert ranks[r]["measured"]["optimizer"] == 0
                assert ranks[r]["measured"]["host"] > 0
            assert "offload_optimizer cpu" in out.stdout


def test_measure_model_parallel(work):
    """model_parallel stages (cpu-mp), GPipe chunks of unequal rows included: batch 5 in
    3 chunks is 2 + 2 + 1 rows, each chunk's activations in its own slot, the backward
    scratch shared (it used to shrink to the last chunk's and overflow)."""
    for mode, model, np_, chunks, ckpt in [("lora", "model", 2, 1, "false"),
                                           ("full", "tied", 3, 3, "false"),
                                           ("lora", "model", 4, 3, "true")]:
        name = f"m_mp_{mode}_{model}_{np_}_{chunks}"
        cfg = write_config(work, name, model=model, mode=mode, train__batch_size=5,
                           dist__strategy="model_parallel",
                           dist__pipeline_micro_batches=chunks,
                           train__gradient_checkpointing=ckpt)
        out = run(cfg, np_, "--measure")
        ranks = assert_exact(out.stdout, np_)
        assert "planned = cpu-mp (exact)" in out.stdout and "cpu-mp*" in out.stdout
        # each stage holds its own layers only
        total = sum(r["measured"]["weights"] for r in ranks.values())
        assert all(0 < r["measured"]["weights"] < total for r in ranks.values())


@pytest.mark.parametrize("strategy,np_", [("none", 1), ("zero3", 2), ("fsdp", 2), ("ddp", 2),
                                          ("model_parallel", 2)])
def test_measure_qlora(work, strategy, np_):
    """A quantized base (NF4 + double quantization on load) in every strategy: the packed
    weights and their state whole on every rank, one layer's dequantization window in
    the workspace; measured == planned, and the base's weights far below LoRA's fp32."""
    name = f"m_qlora_{strategy}_{np_}"
    over = {} if strategy == "none" else {"dist__strategy": strategy}
    cfg = write_config(work, name, mode="qlora", **over)
    out = run(cfg, np_, "--measure")
    ranks = assert_exact(out.stdout, np_)
    lora = parse_measure(run(write_config(work, name + "_lora", mode="lora", **over), np_,
                             "--measure").stdout)[0]
    # (a model_parallel stage of the head alone has no quantized layer)
    for r in range(np_):
        assert ranks[r]["measured"]["weights"] <= lora[r]["measured"]["weights"]
    assert sum(ranks[r]["measured"]["weights"] for r in range(np_)) < \
        sum(lora[r]["measured"]["weights"] for r in range(np_))


@pytest.mark.parametrize("strategy,np_,ckpt", [("zero3", 2, "false"), ("fsdp", 3, "true")])
def test_measure_qlora_offload_params(work, strategy, np_, ckpt):
    """dist.offload_params cpu: the frozen base's shard (dense weights and quantized
    blocks) in host memory, the rest as without it; measured == planned, host included."""
    name = f"m_qoff_{strategy}_{np_}"
    cfg = write_config(work, name, mode="qlora", dist__strategy=strategy,
                       dist__offload_params="cpu", train__gradient_checkpointing=ckpt)
    ranks = assert_exact(run(cfg, np_, "--measure").stdout, np_)
    plain = assert_exact(run(write_config(work, name + "_dev", mode="qlora",
                                          dist__strategy=strategy,
                                          train__gradient_checkpointing=ckpt),
                             np_, "--measure").stdout, np_)
    for r in range(np_):
        moved = ranks[r]["measured"]["host"]
        assert moved > 0 and plain[r]["measured"]["host"] == 0
        assert ranks[r]["measured"]["weights"] + moved == plain[r]["measured"]["weights"]


def test_uneven_gpipe_chunks_train_as_one_process(work):
    ref = write_config(work, "mp_ref5", mode="full", train__batch_size=5, train__max_steps=3)
    run(ref)
    cfg = write_config(work, "mp_uneven", mode="full", train__batch_size=5, train__max_steps=3,
                       dist__strategy="model_parallel", dist__pipeline_micro_batches=3)
    run(cfg, 2)

    def losses(name):
        rows = [json.loads(l) for l in (work / "runs" / name / "metrics.jsonl").read_text()
                .splitlines()]
        return {r["step"]: r["loss"] for r in rows if "loss" in r}
    a, b = losses("mp_ref5"), losses("mp_uneven")
    assert a.keys() == b.keys() and a
    for k in a:
        assert abs(a[k] - b[k]) <= 2e-5 * abs(a[k]), (k, a[k], b[k])


def test_measure_wrong_world_and_resume(work):
    cfg = write_config(work, "m_bad")
    out = run(cfg, 1, "--plan", "2", "--measure", check=False)
    assert out.returncode == 2 and "mpirun -np 2" in out.stderr
    out = run(cfg, 1, "--measure", "--resume", "auto", check=False)
    assert out.returncode == 2 and "--resume" in out.stderr


def test_make_memory_check(work):
    """make memory-check measures on NUM_GPUS ranks through the train targets' launcher
    (the config's strategy, overridable), then runs gpu-info; one process by default."""
    cfg = write_config(work, "mk_mem")
    out = make("memory-check", f"CONFIG={cfg}", "NUM_GPUS=2", "DIST_STRATEGY=fsdp")
    assert out.returncode == 0, out.stderr[-3000:]
    assert_exact(out.stdout, 2)
    assert "planned = cpu-fsdp (exact)" in out.stdout
    assert "-np 2" in out.stdout and "--measure" in out.stdout
    assert "CPU backend" in out.stdout  # gpu-info
    # full vs lora vs qlora for the same model, the quantized base at its bytes per weight
    table = out.stdout.split("by tuning mode")[1]
    rows = {l.split()[0]: l.split() for l in table.splitlines()[2:5]}
    assert set(rows) == {"full", "lora", "qlora"} and "cpu-fsdp" in table.splitlines()[1]
    assert float(rows["qlora"][3]) < float(rows["lora"][3]) < float(rows["full"][3])
    assert "nf4+dq" in " ".join(rows["qlora"]) and rows["lora"][-1] == "-"
    out = make("memory-check", f"CONFIG={cfg}")
    assert out.returncode == 0, out.stderr[-3000:]
    assert_exact(out.stdout, 1)
    assert not (work / "runs" / "mk_mem").exists()
    out = make("memory-check", f"CONFIG={cfg}", "TRAIN_BACH_SIZE=2")
    assert out.returncode != 0 and "TRAIN_BATCH_SIZE" in out.stderr


# ---- train.batch_size auto ------------------------------------------------------------

def planned_bytes(work, name, np_, **over):
    """The exact planned per-rank peak (largest rank, + host) of a fixed batch: what the
    auto batch compares with the budget."""
    cfg = write_config(work, name, **over)
    ranks = assert_exact(run(cfg, np_, "--measure").stdout, np_)
    return max(r["planned"]["total"] + r["planned"]["host"] for r in ranks.values())


AUTO_LINE = re.compile(r"batch_size auto = (\d+)")


def test_auto_batch_one_process(work):
    need3 = planned_bytes(work, "ab_p3", 1, train__batch_size=3)
    for budget, want in [(need3, 3), (need3 - 1, 2)]:
        name = f"ab1_{want}"
        cfg = write_config(work, name, train__batch_size="auto", train__grad_accum="auto",
                           train__memory_budget=budget)
        out = run(cfg)
        lines = [l for l in out.stderr.splitlines() if "batch_size auto" in l]
        assert len(lines) == 1, out.stderr
        assert int(AUTO_LINE.search(lines[0]).group(1)) == want, lines[0]
        assert "grad_accum auto = 1" in lines[0]
        assert f"train.memory_budget = {budget}" in lines[0]
        assert f"{want + 1} would need" in lines[0]
        d = work / "runs" / name
        s = json.loads((d / "run_summary.json").read_text())
        assert s["batch_size"] == want and s["grad_accum"] == 1
        assert s["global_batch_size"] == want
        assert f"  batch_size: {want}\n" in (d / "config.yaml").read_text()
        events = b"".join(p.read_bytes() for p in d.glob("events.out.tfevents.*"))
        assert f"batch_size: {want}\n".encode() in events  # the config text
    # --print-config and --plan show the resolved values
    cfg = write_config(work, "ab1_pc", train__batch_size="auto", train__memory_budget=need3)
    out = run(cfg, 1, "--print-config")
    assert "  batch_size: 3\n" in out.stdout and out.stdout.startswith("# ft-train: batch_size")
    out = run(cfg, 1, "--plan")
    assert "3 x 32 tokens per rank" in out.stdout and "batch_size auto = 3" in out.stderr
    # --get keeps the configured value
    assert run(cfg, 1, "--get", "train.batch_size").stdout == "auto\n"


def test_auto_batch_ranks_and_global_batch(work):
    """2 zero3 ranks, global batch 12: the largest b dividing 6 that fits, accumulated to
    12; the plan of b = 3 on 2 ranks as the budget picks 3 (accum 2)."""
    need3 = planned_bytes(work, "ab_p3_z3", 2, train__batch_size=3, dist__strategy="zero3")
    need4 = planned_bytes(work, "ab_p4_z3", 2, train__batch_size=4, dist__strategy="zero3")
    assert need4 > need3
    cfg = write_config(work, "ab2", train__batch_size="auto", train__grad_accum="auto",
                       train__global_batch_size=12, train__memory_budget=need4,
                       dist__strategy="zero3")
    out = run(cfg, 2)
    line = [l for l in out.stderr.splitlines() if "batch_size auto" in l]
    assert len(line) == 1, out.stderr  # rank 0 only
    assert "batch_size auto = 3" in line[0] and "grad_accum auto = 2" in line[0], line[0]
    assert "cpu-zero3, 2 ranks" in line[0] and "global batch 12 = 3 x 2 x 2 ranks" in line[0]
    s = json.loads((work / "runs" / "ab2" / "run_summary.json").read_text())
    assert (s["batch_size"], s["grad_accum"], s["global_batch_size"]) == (3, 2, 12)
    assert max(s["peak_memory_bytes"]) <= need4


def test_auto_batch_nothing_fits(work):
    cfg = write_config(work, "ab_none", train__batch_size="auto", train__memory_budget="64KiB")
    out = run(cfg, 1, check=False)
    assert out.returncode != 0
    assert "ft-train: error: train.batch_size auto: even a micro-batch of 1 needs" in out.stderr
    assert "train.memory_budget = 64KiB" in out.stderr
    assert "gradient_checkpointing" in out.stderr and "max_seq_len" in out.stderr
    assert not (work / "runs" / "ab_none").exists()
    # --plan still shows the plan, for a micro-batch of 1, with the reason as a note
    out = run(cfg, 1, "--plan")
    assert "note: train.batch_size auto: even a micro-batch of 1" in out.stderr
    assert "1 x 32 tokens per rank (batch_size auto: planned for 1)" in out.stdout
    bad = write_config(work, "ab_bad", train__memory_budget="lots")
    out = run(bad, 1, check=False)
    assert out.returncode != 0 and "train.memory_budget" in out.stderr and "lots" in out.stderr


@pytest.mark.parametrize("strategy,world", [("none", 1), ("zero3", 2), ("fsdp", 2),
                                            ("model_parallel", 2), ("zero2", 2)])
def test_measure_rank_patterns(work, strategy, world):
    """rank_pattern: pairs of their own ranks per layer and module (units of other sizes;
    the shared activation set of gradient checkpointing sized by its layers' largest
    ranks): measured == planned on every rank."""
    name = f"m_pat_{strategy}_{world}"
    cfg = write_config(work, name, dist__strategy=strategy,
                       train__gradient_checkpointing="true" if world == 1 else "false",
                       tuning__lora__target_modules="q_proj,v_proj,down_proj,lm_head",
                       tuning__lora__rank_pattern=json.dumps(
                           {"model.layers.0.self_attn.q_proj": 9, "layers.1.mlp.down_proj": 2,
                            "lm_head": 6}))
    out = run(cfg, world, "--measure")
    assert_exact(out.stdout, world)


@pytest.mark.parametrize("strategy,world,extra", [
    ("zero1", 2, {}), ("zero2", 2, {}), ("zero3", 2, {}), ("fsdp", 2, {}),
    ("model_parallel", 2, {}), ("zero2", 2, {"dist__offload_optimizer": "cpu"}),
    ("ddp", 2, {"dist__offload_optimizer": "cpu"})])
def test_measure_tied_lora_weight_tying(work, strategy, world, extra):
    """LoRA on the tied model's embedding and head under ensure_weight_tying (the head's
    pair the embedding's: both pairs held, their exchange after each step a moment's
    buffer beside the counted ones, lib/dist/dist_tied.c): measured == planned on every
    rank under every strategy."""
    name = f"m_tie_{strategy}_{world}_{len(extra)}"
    cfg = write_config(work, name, model="tied", dist__strategy=strategy,
                       tuning__lora__target_modules="q_proj,v_proj,embed_tokens,lm_head",
                       tuning__lora__ensure_weight_tying="true", **extra)
    out = run(cfg, world, "--measure")
    assert_exact(out.stdout, world)
