"""The scaling model of `make bench-dist`: a training step's time and scaling efficiency on
1..64 GPUs, from its compute time and its communication. Pure Python (no numpy, no
torch), so tests/conformance/test_scaling_model.py checks it by hand-computed values.

Ring collectives (NCCL's ring algorithm; lib/dist counts its bytes the same way), N ranks,
payload b bytes (the whole buffer), link bandwidth bw per GPU and direction (bytes/s),
latency a per hop (s):

    allreduce                    2(N-1)/N * b / bw + 2(N-1) * a
    reduce-scatter, allgather      (N-1)/N * b / bw +  (N-1) * a
    broadcast (pipelined chain)              b / bw +  (N-1) * a
    send / recv                              b / bw +        a

The bandwidth term is the bytes one rank sends divided by bw. A step measured on N0 ranks
that sent S0 bytes per rank therefore sends S0 * ((N-1)/N) / ((N0-1)/N0) on N ranks: its
collectives keep their payloads, so a ring's per-rank volume changes only by the (N-1)/N
factor; its calls per kind give the latency term (StepComm.from_measured).

Topology (Fabric): gpus_per_node GPUs joined by the intra-node link (NVLink), nodes joined
by the inter-node link (InfiniBand, one NIC per GPU). A ring that spans nodes has hops on
the inter-node link and runs at its pace, so N <= gpus_per_node uses the intra-node link,
N > gpus_per_node the inter-node one. Not modelled: hierarchical / tree algorithms and
SHARP, congestion, stragglers.

Data parallel (ddp, zero1-3, fsdp, + offload), weak scaling (each rank keeps its batch):
    T(N) = compute + comm(N),  efficiency(N) = T(1) / T(N),  comm(1) = 0.
Communication is taken as not overlapped with compute (an upper bound on T(N); the CPU
runs overlap almost nothing either: MPI progresses a nonblocking collective inside the
wait).

Model parallel (layer-split stages, GPipe with k chunks per micro-batch, every stage on
the same batch; C = the whole model's compute on the batch, A = activation bytes of one
micro-batch, passed forward and its gradient back across each of the N-1 stage links):
    T(N) = C (k + N - 1) / (k N) + 2 * sum over the N-1 links of (a + (A / k) / bw)
    efficiency(N) = T(1) / (N T(N))      (the batch does not grow with N)
Efficiency is, in both cases, the throughput per GPU relative to one GPU.
"""

import math
from dataclasses import dataclass, field

WORLDS = (1, 2, 4, 8, 16, 32, 64)
KINDS = ("allreduce", "reduce_scatter", "allgather", "broadcast", "send", "recv", "barrier")


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth: float  # bytes/s per GPU and direction
    latency: float    # s per hop


@dataclass(frozen=True)
class Fabric:
    name: str
    intra: Link
    inter: Link
    gpus_per_node: int

    def link(self, n):
        """The link a ring over n ranks runs at (its slowest hop)."""
        return self.intra if n <= self.gpus_per_node else self.inter


# Assumed hardware (not measured): H100 SXM NVLink 4 is 900 GB/s bidirectional per GPU,
# 450 GB/s per direction; NDR InfiniBand is 400 Gb/s = 50 GB/s per GPU with one NIC per
# GPU (DGX H100); a few microseconds per hop.
NVLINK4 = Link("NVLink 4", 450e9, 3e-6)
IB_NDR = Link("InfiniBand NDR 400Gb/s", 50e9, 5e-6)
FABRICS = (
    Fabric("nvlink+ib", NVLINK4, IB_NDR, 8),  # 8 GPUs per node on NVLink, nodes on IB
    Fabric("ib", IB_NDR, IB_NDR, 1),           # every hop on IB (no NVLink)
)
PCIE5 = Link("PCIe 5 x16", 25e9, 5e-6)  # host <-> GPU, for the offloaded optimizer
H100_BF16_FLOPS = 989e12                # dense bf16 peak, H100 SXM
ASSUMED_MFU = 0.40


# ---- collectives ------------------------------------------------------------------------

def allreduce_time(b, n, link):
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * b / link.bandwidth + 2 * (n - 1) * link.latency


def reduce_scatter_time(b, n, link):
    if n <= 1:
        return 0.0
    return (n - 1) / n * b / link.bandwidth + (n - 1) * link.latency


allgather_time = reduce_scatter_time


def broadcast_time(b, n, link):
    if n <= 1:
        return 0.0
    return b / link.bandwidth + (n - 1) * link.latency


def p2p_time(b, link):
    return b / link.bandwidth + link.latency


@dataclass
class StepComm:
    """One rank's communication in one step of a data-parallel strategy, independent of N.

    ring_volume: bytes of the ring collectives such that a rank sends
        ring_volume * (N-1)/N at N ranks (an allreduce of b counts 2b, a reduce-scatter or
        allgather of b counts b);
    fixed_bytes: bytes sent whatever N > 1 (broadcasts, point to point);
    calls: per kind (KINDS), for the latency term."""
    ring_volume: float
    calls: dict = field(default_factory=dict)
    fixed_bytes: float = 0.0

    @classmethod
    def from_collectives(cls, colls):
        """colls: (kind, payload bytes, calls) per collective of the step."""
        vol, fixed, calls = 0.0, 0.0, {}
        for kind, b, k in colls:
            if kind == "allreduce":
                vol += 2 * b * k
            elif kind in ("reduce_scatter", "allgather"):
                vol += b * k
            elif kind in ("broadcast", "send"):
                fixed += b * k
            elif kind not in KINDS:
                raise ValueError(f"unknown collective {kind!r}")
            calls[kind] = calls.get(kind, 0) + k
        return cls(vol, calls, fixed)

    @classmethod
    def from_measured(cls, bytes_sent, n, calls, fixed_bytes=0.0):
        """A step that sent bytes_sent per rank on n > 1 ranks (fixed_bytes of them from
        broadcasts and sends), with these calls per kind."""
        if n < 2:
            raise ValueError("communication is measured on 2 or more ranks")
        return cls((bytes_sent - fixed_bytes) * n / (n - 1), dict(calls), fixed_bytes)

    def sent_bytes(self, n):
        """Bytes one rank sends per step at n ranks."""
        if n <= 1:
            return 0.0
        return self.ring_volume * (n - 1) / n + self.fixed_bytes

    def time(self, n, link):
        """Seconds of communication per step at n ranks over link."""
        if n <= 1:
            return 0.0
        c = self.calls
        hops = (2 * (n - 1) * c.get("allreduce", 0)
                + (n - 1) * (c.get("reduce_scatter", 0) + c.get("allgather", 0)
                             + c.get("broadcast", 0))
                + c.get("send", 0) + c.get("barrier", 0) * 2 * (n - 1))
        return self.sent_bytes(n) / link.bandwidth + hops * link.latency


def project_data_parallel(compute_s, comm, fabric, worlds=WORLDS, host_s=None):
    """Weak scaling of a data-parallel strategy: per world size, step_s, comm_s and
    efficiency = T(1) / T(N). host_s(n): extra seconds per step that are neither compute
    nor fabric (the offloaded optimizer's PCIe copies), or None; T(1) leaves them out (one
    GPU keeps its optimizer), so efficiency shows what offloading costs, already at N=1."""
    t1 = compute_s
    out = []
    for n in worlds:
        link = fabric.link(n)
        c = comm.time(n, link)
        t = compute_s + c + (host_s(n) if host_s else 0.0)
        out.append({"world": n, "link": link.name if n > 1 else "-", "step_s": t, "comm_s": c,
                    "comm_bytes": comm.sent_bytes(n), "efficiency": t1 / t})
    return out


def stage_links(n, fabric):
    """The links between n consecutive stages placed gpus_per_node to a node."""
    nodes = math.ceil(n / fabric.gpus_per_node)
    return [fabric.intra] * (n - nodes) + [fabric.inter] * (nodes - 1)


def project_pipeline(compute_s, act_bytes, chunks, fabric, worlds=WORLDS, max_stages=None):
    """Model parallel: compute_s is the whole model's compute on the batch (the sum over
    stages), act_bytes the activations of one micro-batch. A world size above max_stages
    (the model's units) gets None."""
    out = []
    for n in worlds:
        if max_stages is not None and n > max_stages:
            out.append(None)
            continue
        comm = 2 * sum(p2p_time(act_bytes / chunks, link) for link in stage_links(n, fabric))
        t = compute_s * (chunks + n - 1) / (chunks * n) + comm
        # an end stage sends one way (activations or their gradient), a middle one both
        sent = 0 if n == 1 else act_bytes if n == 2 else 2 * act_bytes
        out.append({"world": n, "link": fabric.link(n).name if n > 1 else "-", "step_s": t,
                    "comm_s": comm, "comm_bytes": sent, "efficiency": compute_s / (n * t)})
    return out


# ---- Llama parameter counts and ftkit's engine schedule -----------------------------------

@dataclass(frozen=True)
class LlamaShape:
    name: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    tied: bool = False

    @property
    def head_dim(self):
        return self.hidden // self.heads


LLAMA2_7B = LlamaShape("Llama-2-7B", 32000, 4096, 11008, 32, 32, 32)


def unit_params(shape, mode, lora_r=16):
    """(trainable, frozen) elements of each unit as lib/model/model.h lays them out: unit 0 the
    embedding, units 1..L the layers, unit L+1 the final norm and lm_head. LoRA: rank
    lora_r on every linear layer of the blocks (all-linear, not lm_head)."""
    h, i, hd = shape.hidden, shape.intermediate, shape.head_dim
    q_out, kv_out = shape.heads * hd, shape.kv_heads * hd
    linears = [(h, q_out), (h, kv_out), (h, kv_out), (q_out, h), (h, i), (h, i), (i, h)]
    base_layer = sum(a * b for a, b in linears) + 2 * h
    lora_layer = sum(lora_r * (a + b) for a, b in linears)
    embed = shape.vocab * h
    head = h + (0 if shape.tied else shape.vocab * h)
    base = [embed] + [base_layer] * shape.layers + [head]
    if mode == "full":
        return [(p, 0) for p in base]
    lora = [0] + [lora_layer] * shape.layers + [0]
    return list(zip(lora, base))


def engine_collectives(strategy, units, bucket_bytes=25 << 20, elem_bytes=4):
    """The collectives of one optimizer step (one micro-batch) of lib/dist/dist_engine.c on one
    rank, from the units' (trainable, frozen) element counts; every buffer is fp32.
    Every data-parallel step also all-reduces its token count (1 double) and the
    gradient norm, the loss and the count of ranks that saw a non-finite one (3 doubles:
    every rank skips or stops on a diverged step alike)."""
    small = [("allreduce", 8, 1), ("allreduce", 24, 1)]
    train = [t for t, _ in units]
    total = sum(train) * elem_bytes
    if strategy in ("ddp", "zero1"):
        # buckets of consecutive units, filled from the last unit (lib/dist/dist_dp.c)
        cap, buckets, cur = bucket_bytes // elem_bytes, [], None
        for t in reversed(train):
            if cur is None or (cur > 0 and cur + t > cap):
                buckets.append(0)
                cur = 0
            cur += t
            buckets[-1] = cur
        kind = "allreduce" if strategy == "ddp" else "reduce_scatter"
        colls = [(kind, b * elem_bytes, 1) for b in buckets if b]
        if strategy == "zero1":
            colls.append(("allgather", total, 1))
        return colls + small
    if strategy == "zero2":
        return ([("reduce_scatter", t * elem_bytes, 1) for t in train if t]
                + [("allgather", total, 1)] + small)
    if strategy in ("zero3", "fsdp"):
        # forward gathers every unit (trainable and frozen parts apart); the engine keeps
        # two windows, so backward reuses the last two units and gathers L-1..0, unit 0
        # only when it has something to train
        colls = []
        last = len(units) - 1
        for u, (t, f) in enumerate(units):
            colls += [("allgather", x * elem_bytes, 1) for x in (t, f) if x]
        for u in range(last - 2, -1, -1):
            t, f = units[u]
            if u == 0 and not t:
                continue
            colls += [("allgather", x * elem_bytes, 1) for x in (t, f) if x]
        colls += [("reduce_scatter", t * elem_bytes, 1) for t in train if t]
        return colls + small
    raise ValueError(f"no data-parallel schedule for {strategy!r}")


def pipeline_act_bytes(shape, rows, seq, elem_bytes=4):
    """The residual stream of one micro-batch, sent forward (and its gradient back)."""
    return rows * seq * shape.hidden * elem_bytes


def step_flops(params, tokens, mode):
    """6 P per token for full fine-tuning (forward 2P, backward 4P); LoRA skips the frozen
    weights' gradients: 4 P (forward 2P, input gradients 2P), the adapters' own share is
    under 1%. Attention's T^2 terms are left out."""
    return (6 if mode == "full" else 4) * params * tokens


def offload_host_s(trainable, elem_bytes=4, link=PCIE5):
    """ZeRO-Offload's copies per step at n ranks: the rank's gradient shard to the host
    and its updated parameters back over PCIe (the host AdamW itself is not modelled)."""
    return lambda n: 2 * trainable * elem_bytes / n / link.bandwidth
