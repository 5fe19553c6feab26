"""Notebook 10's cost model: for a described job, layout and cluster, what one rank holds,
sends and spends per training step, assembled from the earlier chapters' formulas: 04's
roofline, 07's link model, 08's accounting of ZeRO and FSDP, 09's tensor-parallel all-reduces
and the 1F1B schedule's micro-batches in flight.

The code stands in notebook 10's cells (`#@save costs`), and `make export` copies it here,
between the marker lines; tests import it. The imports above the markers are written by hand.
"""
import math
from dataclasses import dataclass, field

import roofline
from allreduce import link_model
from collectives import ADAM_FP32, ADAM_MIXED, paper_bytes, paper_sent
from pipeline_parallel import in_flight, schedule


# ---- saved from 10_planning_a_training_run.ipynb by make export: edit the notebook
@dataclass(frozen=True)
class Job:
    """A model and one step's batch. Each of `layers` layers: an MLP of `matrices` width x
    hidden matrices (2: d -> 4d -> d; 3: SwiGLU), biases where `biases`, and `attention`
    parameters; `vocab` rows of embeddings in and out. `tokens` rows make the global batch, in
    sequences of `seq` (attention's own FLOPs). Values (activations, gradients, messages) take
    value_bytes each; per_parameter: bytes held per parameter, by kind (08's accounting)."""
    layers: int
    width: int
    hidden: int
    tokens: int
    matrices: int = 2
    biases: bool = True
    attention: int = 0
    vocab: int = 0
    seq: int = 0
    value_bytes: int = 4
    per_parameter: dict = field(default_factory=lambda: dict(ADAM_FP32))
    step_bytes: int = 4             # torch's Adam keeps a step count (a tensor) per tensor
    first_input_grad: bool = False  # whether the first layer's input needs a gradient


@dataclass(frozen=True)
class Layout:
    """dp data-parallel ranks at ZeRO stage `zero` (3: FSDP), tp ranks per layer, pp stages fed
    m micro-batches (with pp = 1, m steps of gradient accumulation); `overlap`: the compute its
    data-parallel messages hide behind ('none', 'backward' or 'all'); `reduce_scatter`: what
    its reduce-scatter of the gradients costs, in a ring's (2: an all-reduce's, as gloo's own)."""
    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    m: int = 1
    overlap: str = 'none'
    reduce_scatter: int = 1

    @property
    def ranks(self):
        return self.dp * self.tp * self.pp


@dataclass(frozen=True)
class Cluster:
    """Each rank's matmul FLOP/s and memory bytes/s (the roofline's roofs) and memory; the
    (alpha s, beta bytes/s) of its link between hosts, and of the link within a host of
    per_host ranks (None: the same link); `updates`: parameters per second Adam updates, where
    measured (None: 28 bytes each at the memory's bandwidth)."""
    flops: float
    bandwidth: float
    link: tuple
    memory: float = math.inf
    per_host: int = 1
    host_link: tuple = None
    updates: float = None


STAGES = ('ddp', 'zero1', 'zero2', 'fsdp')  # ZeRO stages 0 to 3, as notebook 08 names them


def layer_parameters(job, tp=1):
    """One layer's parameters on one of tp ranks: the matrices, attention and the first bias
    split by tp; the second bias whole (it is added once, after the all-reduce)."""
    split = job.matrices * job.width * job.hidden + job.attention + job.biases * job.hidden
    return split / tp + job.biases * job.width


def parameters_per_rank(job, layout):
    """Parameters the busiest rank computes with: its stage's layers, its tp share, and an
    embedding (both without a pipeline; a first or last stage's one with it), before ZeRO-3
    shards them over dp."""
    embeddings = job.vocab * job.width * (1 + (layout.pp == 1)) / layout.tp
    return job.layers / layout.pp * layer_parameters(job, layout.tp) + embeddings


def tensors_per_rank(job, layout):
    return job.layers / layout.pp * (job.matrices + 2 * job.biases)


def activation_values(job, tp):
    """Values one layer keeps per row for the backward pass. MLP blocks: the input, and the
    hidden values before and after GELU, split by tp. A transformer layer with sequence
    parallelism and no stored attention scores: 34 bytes at 2 bytes a value, per unit of width,
    over tp (Korthikanti et al., 2022)."""
    if job.attention == 0:
        return job.width + 2 * job.hidden / tp
    return 17 * job.width / tp


def memory(job, layout):
    """Bytes one rank holds, by kind: ZeRO's stage shards the optimizer state, the gradients
    and the parameters over dp ranks (08's paper_bytes), with Adam's step counts; and the
    activations at their peak, one micro-batch's, or the micro-batches a pipeline's first
    stage keeps in flight under 1F1B (09's in_flight)."""
    psi = parameters_per_rank(job, layout)
    held = {kind: b * psi for kind, b in
            paper_bytes(STAGES[layout.zero], layout.dp, job.per_parameter).items()}
    held['optimizer state'] += job.step_bytes * tensors_per_rank(job, layout)
    rows = job.tokens / layout.dp / layout.m
    if layout.pp > 1:
        rows *= in_flight(schedule('1f1b', layout.pp, layout.m, 0))
    held['activations'] = (job.value_bytes * rows * job.layers / layout.pp
                           * activation_values(job, layout.tp))
    return held


def tp_allreduces(job, layout):
    """All-reduces per step on a tp rank: g forward and f backward for each MLP block (and
    attention), less f at the first layer where its input needs no gradient."""
    if layout.tp == 1:
        return 0
    first = not (job.first_input_grad or layout.pp > 1)  # f there, unless its input needs it
    return job.layers / layout.pp * 2 * (1 + (job.attention > 0)) - first


def bytes_sent(job, layout):
    """Bytes one rank sends per step, by kind of parallelism: the data-parallel exchange (08's
    paper_sent values per parameter, the reduce-scatter's share at its cost; FSDP gathers and
    reduces again for each of m micro-batches), tensor parallelism's all-reduces of
    (rows x width) values, and a middle pipeline stage's activations forward and their
    gradients back."""
    rows, ring = job.tokens / layout.dp, (layout.tp - 1) / layout.tp
    value, again = job.value_bytes, layout.m ** (layout.zero == 3)  # FSDP: per micro-batch
    scatter = (layout.reduce_scatter - 1) * (layout.dp - 1) / layout.dp * (layout.zero > 0)
    return {'data parallel': (paper_sent(STAGES[layout.zero], layout.dp) + scatter) * value
            * again * parameters_per_rank(job, layout),
            'tensor parallel': tp_allreduces(job, layout) * 2 * ring * rows * job.width * value,
            'pipeline': min(2, layout.pp - 1) * rows * job.width * value}


def hidden_seconds(layout, messages, compute):
    """Data-parallel seconds hidden behind compute. DDP: every bucket but the last (ready only
    when the backward pass ends), behind the last micro-batch's backward pass (2/3 of its
    compute). FSDP: its messages behind the compute. ZeRO by hand: nothing."""
    if layout.overlap == 'backward':
        return min(sum(messages[:-1]), 2 / 3 * compute / layout.m)
    if layout.overlap == 'all':
        return min(sum(messages), compute)
    return 0.0


def gemm_rate(cluster, rows, width, hidden, value_bytes):
    """FLOP/s the roofline (04's bound) allows a (rows x width) by (width x hidden) product:
    2 rows width hidden operations over the bytes of its three matrices."""
    intensity = 2 * rows * width * hidden / (
        value_bytes * (rows * width + width * hidden + rows * hidden))
    return roofline.bound(intensity, cluster.flops, cluster.bandwidth)


def compute_flops(job, layout):
    """FLOPs of one rank's forward and backward passes per step: 6 per matrix parameter and
    row, attention's scores (12 seq width per row and layer), and the output layer."""
    rows = job.tokens / layout.dp
    matrices = job.matrices * job.width * job.hidden + job.attention
    per_row = job.layers / layout.pp * (6 * matrices + 12 * job.seq * job.width)
    return rows * (per_row + 6 * job.vocab * job.width) / layout.tp


def link_of(cluster, group, apart):
    """(alpha, beta) of the slowest link a group of ranks `apart` ranks apart crosses: the
    host's own while the group fits within a host, else the link between hosts."""
    inside = group * apart <= cluster.per_host
    return (cluster.link, cluster.host_link or cluster.link)[inside]


def ddp_buckets(job, layout):
    """Bytes of each gradient bucket DDP all-reduces, in the order they are ready: a first
    bucket of 1 MiB (DDP's first_bucket_cap), then buckets of up to 25 MiB."""
    grads = job.value_bytes * parameters_per_rank(job, layout)
    first = min(grads, 2**20)
    n = math.ceil((grads - first) / (25 * 2**20))
    return [first] + [(grads - first) / max(n, 1)] * n


def dp_messages(job, layout):
    """(count, bytes) of the ring all-reduces the data-parallel exchange costs as much as: DDP
    one per bucket; ZeRO-1/2 a reduce-scatter and an all-gather per tensor; FSDP two gathers
    and a reduce-scatter per matrix, per micro-batch; a ring's reduce-scatter or gather being
    half an all-reduce."""
    if layout.zero == 0:
        return [(1, b) for b in ddp_buckets(job, layout)]
    grads, scatter = job.value_bytes * parameters_per_rank(job, layout), layout.reduce_scatter
    if layout.zero < 3:
        tensors = tensors_per_rank(job, layout)
        return [((1 + scatter) / 2 * tensors, grads / tensors)]
    units = job.matrices * job.layers / layout.pp
    return [((2 + scatter) / 2 * units * layout.m, grads / units)]


def step_seconds(job, layout, cluster):
    """One step's seconds by term, and the step: compute, Adam's update, the messages of each
    kind of parallelism (07's link_model: alpha + n beta), the pipeline's bubble, less what
    overlap hides."""
    rows = job.tokens / layout.dp / layout.m
    rate = gemm_rate(cluster, rows, job.width, job.hidden / layout.tp, job.value_bytes)
    t = {'compute': compute_flops(job, layout) / rate}
    updated = parameters_per_rank(job, layout) / (layout.dp if layout.zero else 1)
    t['optimizer'] = updated / (cluster.updates or cluster.bandwidth / 28)
    (a, b), (ta, tb) = link_of(cluster, layout.dp, layout.tp), link_of(cluster, layout.tp, 1)
    messages = [c * link_model(a, b)['ring'](layout.dp, s) for c, s in dp_messages(job, layout)]
    t['data parallel'] = sum(messages)
    t['tensor parallel'] = tp_allreduces(job, layout) * layout.m * link_model(ta, tb)['ring'](
        layout.tp, rows * job.width * job.value_bytes)  # per micro-batch
    pa, pb = link_of(cluster, layout.pp, layout.dp * layout.tp)
    turns, message = layout.m + layout.pp - 1, pa + rows * job.width * job.value_bytes / pb
    t['pipeline'] = ((layout.pp - 1) / layout.m * t['compute'] + 2 * turns * message) * (
        layout.pp > 1)  # nothing without a pipeline
    hidden = hidden_seconds(layout, messages, t['compute'])
    t['step'] = (t['compute'] + t['optimizer'] + t['tensor parallel'] + t['pipeline']
                 + t['data parallel'] - hidden)
    return t


def mfu(job, layout, cluster, seconds):
    """Model FLOPs utilisation: the whole model's FLOPs per step over the ranks' peak."""
    return compute_flops(job, Layout()) / (seconds * layout.ranks * cluster.flops)


def rank_order(values):
    """Each value's rank, 1 for the smallest; tied values share the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks, i = [0.0] * len(values), 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for x in order[i:j + 1]:
            ranks[x] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a, b):
    """Spearman's rank correlation of two lists: Pearson's correlation of their ranks."""
    ra, rb = rank_order(a), rank_order(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))


def job_of(config):
    """The model's description of the job layouts.JobConfig describes."""
    return Job(layers=config.layers, width=config.width, hidden=4 * config.width,
               tokens=config.tokens)


def measured_layouts(config):
    """The model's description of each layout layouts.layout_worker runs. FSDP calls the
    backend's reduce-scatter: gloo's costs an all-reduce (08)."""
    k, (dp, tp) = config.ranks, config.mesh_shape
    scatter = 2 if config.backend == 'gloo' else 1
    plans = {'ddp': Layout(dp=k, overlap='backward'), 'zero2': Layout(dp=k, zero=2),
             'fsdp': Layout(dp=k, zero=3, overlap='all', reduce_scatter=scatter),
             'tp': Layout(tp=k), '1f1b': Layout(pp=k, m=config.microbatches),
             'fsdp_tp': Layout(dp=dp, tp=tp, zero=3, overlap='all', reduce_scatter=scatter)}
    return {x: plans[x] for x in config.layouts}


H100_NODES = Cluster(flops=989e12, bandwidth=3.35e12, link=(10e-6, 50e9), memory=80e9,
                     per_host=8, host_link=(5e-6, 450e9))
MATMUL_SHARE = 783 / 989  # bf16 matmul measured on an H200 (DESIGN.md), of the same peak
H100_MEASURED = Cluster(flops=989e12 * MATMUL_SHARE, bandwidth=3.35e12, link=(10e-6, 50e9),
                        memory=80e9, per_host=8, host_link=(5e-6, 450e9))


def llama(layers, width, hidden, heads, kv_heads, tokens=512 * 8192, seq=8192, vocab=128256):
    """A Llama-shaped transformer in bf16 mixed precision: attention's q and o (width x width)
    and k and v (width x width kv_heads / heads), a SwiGLU MLP, no biases."""
    attention = 2 * width * width + 2 * width * width * kv_heads // heads
    return Job(layers=layers, width=width, hidden=hidden, tokens=tokens, matrices=3,
               biases=False, attention=attention, vocab=vocab, seq=seq, value_bytes=2,
               per_parameter=dict(ADAM_MIXED), step_bytes=0, first_input_grad=True)


LLAMA_8B, LLAMA_70B = llama(32, 4096, 14336, 32, 8), llama(80, 8192, 28672, 64, 8)
LLAMA_405B = llama(126, 16384, 53248, 128, 8, tokens=2048 * 8192)  # 16M tokens a step


def candidate_layouts(ranks, per_host, sequences):
    """Every (dp, tp, pp) with dp tp pp = ranks, tp within a host, at ZeRO stages 0 to 3; one
    sequence per micro-batch (m = sequences / dp, at least pp)."""
    out = []
    for tp in (t for t in range(1, per_host + 1) if per_host % t == 0 and ranks % t == 0):
        for pp in (p for p in range(1, ranks // tp + 1) if ranks // tp % p == 0):
            dp = ranks // (tp * pp)
            m = max(pp, sequences // dp)
            out += [Layout(dp=dp, tp=tp, pp=pp, zero=z, m=m,
                           overlap=('backward', 'none', 'none', 'all')[z]) for z in range(4)]
    return out


def best_layout(job, cluster, ranks, sequences):
    """(layout, its step's terms, its memory) of the fastest layout that fits, or None."""
    fitting = [(step_seconds(job, x, cluster), memory(job, x), x)
               for x in candidate_layouts(ranks, cluster.per_host, sequences)
               if sum(memory(job, x).values()) <= cluster.memory]
    return min(fitting, key=lambda f: f[0]['step'], default=None)
# ---- end of what 10_planning_a_training_run.ipynb saves
