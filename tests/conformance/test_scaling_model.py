"""The scaling model of make bench-dist (tests/bench/scaling_model.py) against
hand-computed values, and the per-step profile it reads (FT_DIST_PROFILE) from ft-train on
real Open MPI ranks: the bytes ftkit's engine sends are those the model predicts from the
parameter counts."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import scaling_model as sm  # noqa: E402

IB = sm.Link("ib", 50e9, 5e-6)
NV = sm.Link("nv", 450e9, 3e-6)


def test_ring_formulas_by_hand():
    b = 1e9
    # N=2: 2*(1/2)*1e9/50e9 + 2*1*5e-6
    assert sm.allreduce_time(b, 2, IB) == pytest.approx(0.02 + 1e-5, rel=1e-12)
    # N=8: 2*(7/8)*1e9/50e9 + 14*5e-6
    assert sm.allreduce_time(b, 8, IB) == pytest.approx(0.035 + 7e-5, rel=1e-12)
    # reduce-scatter and allgather: half the allreduce's bytes and hops
    assert sm.reduce_scatter_time(b, 8, NV) == pytest.approx(7 / 8 * b / 450e9 + 7 * 3e-6)
    assert sm.allgather_time(b, 2, IB) == pytest.approx(0.01 + 5e-6)
    assert sm.broadcast_time(b, 4, IB) == pytest.approx(0.02 + 3 * 5e-6)
    for f in (sm.allreduce_time, sm.reduce_scatter_time, sm.broadcast_time):
        assert f(b, 1, IB) == 0.0


def test_step_comm_is_the_sum_of_its_collectives():
    b = 3e8
    colls = [("allreduce", b, 2), ("reduce_scatter", b, 1), ("allgather", 2 * b, 3)]
    sc = sm.StepComm.from_collectives(colls)
    for n in sm.WORLDS:
        want = (2 * sm.allreduce_time(b, n, IB) + sm.reduce_scatter_time(b, n, IB)
                + 3 * sm.allgather_time(2 * b, n, IB))
        assert sc.time(n, IB) == pytest.approx(want, rel=1e-12, abs=1e-15)
    # what a 2-rank run measures gives the same model back (bytes scale by (N-1)/N)
    calls = {"allreduce": 2, "reduce_scatter": 1, "allgather": 3}
    measured = sm.StepComm.from_measured(sc.sent_bytes(2), 2, calls)
    for n in sm.WORLDS:
        assert measured.time(n, IB) == pytest.approx(sc.time(n, IB), rel=1e-12, abs=1e-15)
        assert measured.sent_bytes(n) == pytest.approx(sc.sent_bytes(n), rel=1e-12, abs=1e-9)
    assert measured.sent_bytes(8) == pytest.approx(measured.sent_bytes(2) * (7 / 8) / (1 / 2))
    with pytest.raises(ValueError):
        sm.StepComm.from_measured(1.0, 1, {})


def test_fabric_topology():
    nvib, ib = sm.FABRICS
    assert nvib.link(2) is sm.NVLINK4 and nvib.link(8) is sm.NVLINK4
    assert nvib.link(16) is sm.IB_NDR and nvib.link(64) is sm.IB_NDR
    assert ib.link(2) is sm.IB_NDR
    # 20 stages at 8 a node: 17 NVLink links and 2 IB links
    links = sm.stage_links(20, nvib)
    assert links.count(sm.NVLINK4) == 17 and links.count(sm.IB_NDR) == 2


@pytest.mark.parametrize("fabric", sm.FABRICS, ids=lambda f: f.name)
def test_efficiency(fabric):
    comm = sm.StepComm.from_collectives([("allreduce", 1e9, 4), ("allgather", 1e8, 30)])
    pts = sm.project_data_parallel(0.5, comm, fabric)
    assert [p["world"] for p in pts] == list(sm.WORLDS)
    assert pts[0]["efficiency"] == 1.0 and pts[0]["comm_s"] == 0.0
    effs = [p["efficiency"] for p in pts]
    assert all(a > b for a, b in zip(effs, effs[1:])), effs
    for p in pts:
        assert p["step_s"] == pytest.approx(0.5 + p["comm_s"])
        assert p["efficiency"] == pytest.approx(0.5 / p["step_s"])
    # nothing to send: perfect scaling
    none = sm.project_data_parallel(0.5, sm.StepComm(0.0), fabric)
    assert all(p["efficiency"] == 1.0 for p in none)
    # offload: its PCIe time counts against one GPU as well, and shrinks as 1/N
    off = sm.project_data_parallel(0.5, comm, fabric, host_s=lambda n: 0.5 / n)
    assert off[0]["efficiency"] == pytest.approx(0.5)


def test_nvlink_node_then_infiniband():
    nvib, ib = sm.FABRICS
    comm = sm.StepComm.from_collectives([("allreduce", 1e9, 1)])
    a = {p["world"]: p for p in sm.project_data_parallel(0.1, comm, nvib)}
    b = {p["world"]: p for p in sm.project_data_parallel(0.1, comm, ib)}
    assert a[8]["comm_s"] == pytest.approx(sm.allreduce_time(1e9, 8, sm.NVLINK4))
    assert a[16]["comm_s"] == pytest.approx(sm.allreduce_time(1e9, 16, sm.IB_NDR))
    assert a[8]["efficiency"] > b[8]["efficiency"]
    assert a[16]["efficiency"] == pytest.approx(b[16]["efficiency"])


def test_pipeline():
    fab = sm.FABRICS[0]
    pts = sm.project_pipeline(1.0, 1e6, 1, fab, max_stages=6)
    assert pts[0]["efficiency"] == 1.0
    # naive pipeline: one stage busy at a time, so the per-GPU throughput is ~1/N
    two = pts[1]
    assert two["comm_s"] == pytest.approx(2 * (3e-6 + 1e6 / 450e9))
    assert two["efficiency"] == pytest.approx(1.0 / (2 * (1.0 + two["comm_s"])))
    assert pts[3:] == [None] * 4
    # GPipe: k chunks shrink the bubble to (N-1)/(k+N-1)
    g = sm.project_pipeline(1.0, 0.0, 4, fab)
    assert g[2]["comm_s"] == pytest.approx(2 * 3 * 3e-6)  # 3 links, latency only
    assert g[2]["step_s"] - g[2]["comm_s"] == pytest.approx((4 + 4 - 1) / (4 * 4))


def test_llama_7b_counts():
    full = sm.unit_params(sm.LLAMA2_7B, "full")
    assert len(full) == 34
    assert sum(t for t, _ in full) == 6_738_415_616  # Llama-2-7b-hf
    assert all(f == 0 for _, f in full)
    lora = sm.unit_params(sm.LLAMA2_7B, "lora", 16)
    assert sum(t for t, _ in lora) == 39_976_960     # PEFT: r=16 on all-linear
    assert sum(f for _, f in lora) == 6_738_415_616
    # ddp full: every unit exceeds a 25 MiB bucket: one allreduce each, plus 2 small
    colls = sm.engine_collectives("ddp", full)
    assert sum(1 for c in colls if c[0] == "allreduce") == 34 + 2
    sc = sm.StepComm.from_collectives(colls)
    assert sc.sent_bytes(2) == pytest.approx(6_738_415_616 * 4 + 24)
    assert sm.step_flops(1e9, 1000, "full") == 6e12
    assert sm.step_flops(1e9, 1000, "lora") == 4e12


FT_TRAIN = os.environ.get("FT_TRAIN")


def test_profile_bytes_match_the_model(tmp_path):
    """ft-train on 2 real ranks with FT_DIST_PROFILE: one line per step and rank, whose
    bytes equal run_summary.json's and the engine schedule the 7B projection uses."""
    assert FT_TRAIN, "FT_TRAIN must be the path of bin/ft-train"
    mpirun = shutil.which("mpirun")
    assert mpirun, "mpirun not found: scripts/install-deps.sh installs openmpi-bin"
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    shape = sm.LlamaShape("t", vocab=64, hidden=32, intermediate=64, layers=2, heads=4,
                          kv_heads=2)
    torch.manual_seed(1)
    LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=64)
                     ).save_pretrained(tmp_path / "model", safe_serialization=True)
    rows = [{"input_ids": list(range(1 + i, 17 + i)), "labels": list(range(1 + i, 17 + i))}
            for i in range(16)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model:\n  name: {tmp_path / 'model'}\n  max_seq_len: 16\n"
                   "tuning:\n  lora:\n    r: 4\n"
                   "train:\n  batch_size: 2\n  max_steps: 3\n"
                   f"data:\n  train_path: {tmp_path / 'train.jsonl'}\n  format: tokens\n")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    for strategy, mode in [("zero3", "lora"), ("ddp", "full"), ("zero2", "full")]:
        run = tmp_path / f"{strategy}-{mode}"
        cmd = [mpirun, *root, "--oversubscribe", "--bind-to", "none", "-np", "2",
               "-x", "FT_DIST_PROFILE", FT_TRAIN, "--config", str(cfg),
               "--set", f"tuning.mode={mode}", "--set", f"train.output_dir={run}",
               "--set", f"dist.strategy={strategy}"]
        env = dict(os.environ, OMP_NUM_THREADS="1", FT_DIST_PROFILE=str(run / "profile"))
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        want = sm.StepComm.from_collectives(
            sm.engine_collectives(strategy, sm.unit_params(shape, mode, 4))).sent_bytes(2)
        summary = json.loads((run / "run_summary.json").read_text())
        assert summary["comm_bytes_per_step"] == pytest.approx(want, rel=1e-5)
        for r in (0, 1):
            lines = [json.loads(x) for x in
                     (run / "profile" / f"rank-{r}.jsonl").read_text().splitlines()]
            assert [x["step"] for x in lines] == [1, 2, 3]
            for x in lines:
                assert x["rank"] == r and x["world"] == 2 and x["strategy"] == strategy
                assert x["tokens"] == 2 * 16 and x["micro_batches"] == 1
                assert x["comm_bytes"] == pytest.approx(want, rel=1e-12)
                assert 0 <= x["comm_wait_s"] <= x["step_s"]
                assert x["calls"]["allreduce"] >= 2 and x["calls"]["send"] == 0
