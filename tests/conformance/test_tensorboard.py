"""TensorBoard event files from lib/formats/tb_writer.c (through `ft-tb`), read back by
TensorBoard's own readers:

  LegacyEventFileLoader        the Event protos as written, in order; the first is
                               file_version "brain.Event:2", every wall_time is now-ish.
  EventFileLoader              the same events after TensorBoard's migrations (scalars
                               become "scalars"-plugin tensors, data classes filled in).
  event_accumulator            Scalars(tag): each step and value (the float32 of what was
                               written); Tensors(tag) for text: the text plugin's rank-0
                               DT_STRING tensor; SummaryMetadata: plugin "text".
  plugin_event_accumulator     what the TensorBoard server itself loads: scalars migrated
                               to the "scalars" plugin, text under the "text" plugin.

Run:  FT_TB=$PWD/build/tests/ft-tb .venv/bin/python -m pytest -q \
          tests/conformance/test_tensorboard.py
"""

import math
import os
import subprocess
import time

import numpy as np
import pytest

FT_TB = os.environ.get("FT_TB")


@pytest.fixture(scope="module")
def ft_tb():
    if not FT_TB:
        pytest.fail("FT_TB is not set: it must be the path of the ft-tb harness "
                    "(build/tests/ft-tb)", pytrace=False)
    if not os.access(FT_TB, os.X_OK):
        pytest.fail(f"FT_TB={FT_TB} is not an executable", pytrace=False)
    return FT_TB


def run_tb(exe, logdir, lines, check=True):
    p = subprocess.run([exe, str(logdir)], input="".join(l + "\n" for l in lines),
                       capture_output=True, text=True, timeout=60)
    if check and p.returncode != 0:
        pytest.fail(f"ft-tb exited {p.returncode}: {p.stderr}", pytrace=False)
    return p


def f32(x):
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def same_float(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


# (tag, step, value as written on the command line)
SCALARS = [
    ("train/loss", 1, "2.3456789"),
    ("train/lr", 1, "0.0001"),
    ("train/loss", 2, "1.0000001"),
    ("train/lr", 2, "3e-05"),
    ("train/loss", 3, "0.1"),
    ("train/grad_norm", 3, "1e39"),        # overflows float32: +inf
    ("train/grad_norm", 4, "-inf"),
    ("train/grad_norm", 5, "nan"),
    ("train/tiny", 10, "1e-45"),           # float32 denormal
    ("train/tiny", 2**40, "-123456789.125"),
    ("eval/loss", 0, "0"),
]

TEXTS = [
    ("config", 0, "# run\n| key | value |\n|---|---|\n| lr | 1e-4 |\n\ncaf\u00e9 \u2713 \U0001F642"),
    ("samples", 5, "plain text, with \\ a backslash and\ttab"),
    ("samples", 6, ""),
]


def escape(s):
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


@pytest.fixture(scope="module")
def written(ft_tb, tmp_path_factory):
    logdir = tmp_path_factory.mktemp("tb") / "run"
    lines = []
    for i, (tag, step, value) in enumerate(SCALARS):
        lines.append(f"scalar {tag} {step} {value}")
        if i == 4:
            lines.append("flush")
    for tag, step, text in TEXTS:
        lines.append(f"text {tag} {step} {escape(text)}")
    t0 = time.time()
    p = run_tb(ft_tb, logdir, lines)
    t1 = time.time()
    path = p.stdout.strip()
    return logdir, path, t0, t1


def test_file_name(written):
    import socket
    logdir, path, t0, t1 = written
    assert os.path.dirname(path) == str(logdir)
    files = os.listdir(logdir)
    assert files == [os.path.basename(path)]
    parts = os.path.basename(path).split(".")
    assert parts[:3] == ["events", "out", "tfevents"]
    assert len(parts[3]) == 10 and parts[3].isdigit()
    assert int(t0) - 1 <= int(parts[3]) <= t1 + 1
    host = socket.gethostname()
    assert ".".join(parts[4:-2]) == host
    assert parts[-2].isdigit() and parts[-1] == "0"


def test_raw_events(written):
    """The protos as written (LegacyEventFileLoader: records parsed, nothing migrated)."""
    from tensorboard.backend.event_processing.event_file_loader import LegacyEventFileLoader
    _, path, t0, t1 = written
    events = list(LegacyEventFileLoader(path).Load())
    assert len(events) == 1 + len(SCALARS) + len(TEXTS)
    first = events[0]
    assert first.file_version == "brain.Event:2"
    assert not first.HasField("summary")
    for e in events:
        assert t0 - 1 <= e.wall_time <= t1 + 1
    for e, (tag, step, value) in zip(events[1:], SCALARS):
        assert e.step == step
        (v,) = e.summary.value
        assert v.tag == tag
        assert v.WhichOneof("value") == "simple_value"
        assert same_float(v.simple_value, f32(float(value))), (tag, step, v.simple_value)
    for e, (tag, step, text) in zip(events[1 + len(SCALARS):], TEXTS):
        assert e.step == step
        (v,) = e.summary.value
        assert v.tag == tag
        assert v.metadata.plugin_data.plugin_name == "text"
        assert v.metadata.plugin_data.content == b""
        assert v.WhichOneof("value") == "tensor"
        assert v.tensor.dtype == 7  # DT_STRING
        assert v.tensor.HasField("tensor_shape") and len(v.tensor.tensor_shape.dim) == 0
        assert list(v.tensor.string_val) == [text.encode()]


def test_event_file_loader(written):
    """EventFileLoader, which TensorBoard iterates: the events after its migrations
    (simple_value -> scalars-plugin tensor, data classes filled in)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.util import tensor_util
    _, path, t0, t1 = written
    events = list(EventFileLoader(path).Load())
    assert len(events) == 1 + len(SCALARS) + len(TEXTS)
    assert events[0].file_version == "brain.Event:2"
    for e, (tag, step, value) in zip(events[1:], SCALARS):
        assert e.step == step
        (v,) = e.summary.value
        assert v.tag == tag
        assert v.metadata.plugin_data.plugin_name == "scalars"
        assert v.metadata.data_class == summary_pb2.DATA_CLASS_SCALAR
        got = tensor_util.make_ndarray(v.tensor)
        assert got.shape == ()
        assert same_float(float(got), f32(float(value))), (tag, step, float(got))
    for e, (tag, step, text) in zip(events[1 + len(SCALARS):], TEXTS):
        assert e.step == step
        (v,) = e.summary.value
        assert v.tag == tag
        assert v.metadata.plugin_data.plugin_name == "text"
        assert v.metadata.data_class == summary_pb2.DATA_CLASS_TENSOR
        assert tensor_util.make_ndarray(v.tensor).item() == text.encode()


def test_event_accumulator(written):
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util
    logdir, _, _, _ = written
    guidance = {k: 0 for k in event_accumulator.DEFAULT_SIZE_GUIDANCE}
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance=guidance)
    acc.Reload()
    tags = acc.Tags()
    want_scalar_tags = sorted({t for t, _, _ in SCALARS})
    assert sorted(tags["scalars"]) == want_scalar_tags
    for tag in want_scalar_tags:
        want = [(s, f32(float(v))) for t, s, v in SCALARS if t == tag]
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert len(got) == len(want), tag
        for (gs, gv), (ws, wv) in zip(got, want):
            assert gs == ws, tag
            assert same_float(gv, wv), (tag, gs, gv, wv)

    assert sorted(acc.PluginTagToContent("text")) == ["config", "samples"]
    for tag in ("config", "samples"):
        assert acc.SummaryMetadata(tag).plugin_data.plugin_name == "text"
        want = [(s, t) for g, s, t in TEXTS if g == tag]
        got = acc.Tensors(tag)
        assert [e.step for e in got] == [s for s, _ in want]
        for e, (_, text) in zip(got, want):
            arr = tensor_util.make_ndarray(e.tensor_proto)
            assert arr.shape == ()
            assert arr.item().decode("utf-8") == text


def test_plugin_event_accumulator(written):
    """The server's loader: simple_value scalars become rank-0 float tensors of the
    scalars plugin; the text summaries stay with the text plugin."""
    from tensorboard.backend.event_processing import plugin_event_accumulator as pea
    from tensorboard.util import tensor_util
    logdir, _, _, _ = written
    guidance = {k: 0 for k in pea.DEFAULT_SIZE_GUIDANCE}
    acc = pea.EventAccumulator(str(logdir), size_guidance=guidance)
    acc.Reload()
    assert sorted(acc.PluginTagToContent("scalars")) == sorted({t for t, _, _ in SCALARS})
    for tag in {t for t, _, _ in SCALARS}:
        want = [(s, f32(float(v))) for t, s, v in SCALARS if t == tag]
        got = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
               for e in acc.Tensors(tag)]
        assert len(got) == len(want)
        for (gs, gv), (ws, wv) in zip(got, want):
            assert gs == ws and same_float(gv, wv), (tag, gs, gv, wv)
    assert sorted(acc.PluginTagToContent("text")) == ["config", "samples"]
    got = [tensor_util.make_ndarray(e.tensor_proto).item().decode("utf-8")
           for e in acc.Tensors("samples")]
    assert got == [t for g, _, t in TEXTS if g == "samples"]


def test_bad_logdir_is_reported(ft_tb, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    p = run_tb(ft_tb, blocker / "logs", ["scalar x 1 1"], check=False)
    assert p.returncode == 1
    assert str(blocker) in p.stderr and "ft-tb: error:" in p.stderr


def test_bad_line_is_reported(ft_tb, tmp_path):
    p = run_tb(ft_tb, tmp_path / "logs", ["scalar x 1 1", "scalar x notastep 1"], check=False)
    assert p.returncode == 1
    assert "stdin:2" in p.stderr
