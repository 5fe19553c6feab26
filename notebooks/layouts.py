"""Six layouts of one model on real processes, measured as notebook 10's cost model predicts
them: bytes sent per rank and step, memory held per rank, and the step time.

The model is a stack of `layers` transformer-MLP blocks (width -> 4 width -> width, GELU), the
shape tensor parallelism splits Megatron-style and a pipeline splits by blocks. `layout_worker`
runs every layout of `JobConfig.layouts` in turn on the same ranks, each with Adam in float32:

* 'ddp'      DistributedDataParallel (notebook 06), the batch split over the k ranks;
* 'zero2'    notebook 08's ZeroAdam at stage 2 (zero.ZeroAdam), the batch split;
* 'fsdp'     PyTorch's fully_shard on every linear layer (notebook 08), the batch split;
* 'tp'       every block split over the k ranks by columns, then rows (notebook 09), each
             rank seeing the whole batch;
* '1f1b'     k pipeline stages of layers / k blocks, run by torch.distributed.pipelining's
             Schedule1F1B over `microbatches` micro-batches (notebook 09);
* 'fsdp_tp'  tensor parallelism on one axis of a (dp, tp) mesh and FSDP on the other
             (tensor_parallel.fsdp_x_tp, notebook 09).

Each layout's last step is counted: collectives.CollectiveCounter adds up the bytes each
collective sends by the ring's accounting (a pipeline's sends as they are), meters'
SavedActivations counts what autograd keeps for the backward pass, and zero.held_bytes reads
the bytes behind the parameters, gradients and optimizer state. Besides the layouts, every
rank measures terms of the model alone: its layout's local compute (the same matmuls, no
message), one all-reduce of the gradients, and one all-gather and one reduce-scatter's bytes.

`cluster_worker` measures, before any layout runs, what the model's Cluster describes, with
every rank at once: the functions notebook 10 saves at the end of this module.
"""
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._functional_collectives import AsyncCollectiveTensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module
from torch.nn import functional as F

import helpers as d2l
import pipeline_parallel
import tensor_parallel
import zero
from collectives import CollectiveCounter, tcp_bytes_sent
from meters import SavedActivations, join, local
from pipeline_parallel import message_seconds

LAYOUTS = ('ddp', 'zero2', 'fsdp', 'tp', '1f1b', 'fsdp_tp')
LABELS = {'ddp': 'DDP', 'zero2': 'ZeRO-2', 'fsdp': 'FSDP', 'tp': 'TP', '1f1b': '1F1B pipeline',
          'fsdp_tp': 'FSDP x TP'}


@dataclass(frozen=True)
class JobConfig:
    """What layout_worker runs: the model (layers blocks, width wide), the global batch
    (tokens rows), the layouts and their degrees, and how many steps each."""
    ranks: int = 4
    width: int = 192
    layers: int = 8
    tokens: int = 384
    microbatches: int = 8
    mesh_shape: tuple = (2, 2)
    layouts: tuple = LAYOUTS
    warmup_steps: int = 1
    timed_steps: int = 3
    lr: float = 1e-3
    seed: int = 0
    link_sizes: tuple = (4, 2**19, 2**22)  # bytes of the messages the link is fitted on
    device: str = 'cpu'
    backend: str = 'gloo'
    collective_timeout: int = 60


def make_model(cfg):
    """The stack, flat: Linear(w, 4w), GELU, Linear(4w, w), ... the same on every rank."""
    torch.manual_seed(cfg.seed)
    return nn.Sequential(*[m for _ in range(cfg.layers) for m in block(cfg.width)])


def blocks_of(flat):
    """The flat stack as a stack of blocks, for a pipeline to split."""
    return nn.Sequential(*[nn.Sequential(*flat[i:i + 3]) for i in range(0, len(flat), 3)])


def make_batch(cfg, step, device):
    """Step `step`'s global batch: tokens rows and a class in [0, width) for each."""
    g = torch.Generator().manual_seed(cfg.seed + 1 + step)
    X = torch.randn(cfg.tokens, cfg.width, generator=g)
    y = torch.randint(0, cfg.width, (cfg.tokens,), generator=g)
    return X.to(device), y.to(device)


class ModuleActivations(SavedActivations):
    """SavedActivations that also skips the parameters a module holds at the moment a tensor
    is saved: FSDP swaps each layer's gathered (unsharded) weights in for its forward pass, and
    those are parameters, not activations."""

    def __init__(self, module):
        super().__init__(module.parameters())
        self.module = module

    def _mine(self, t):
        with torch.no_grad():
            mine = local(t)
            if isinstance(mine, AsyncCollectiveTensor):  # TP's all-reduced output, not waited
                mine = mine.trigger_wait()
        return mine

    def _skipped(self, mine):
        return _address(mine) in self.skip | {_address(p) for p in self.module.parameters()}


def _address(t):
    """Where a tensor's memory starts; None for one whose memory was freed (a resharded
    FSDP parameter)."""
    try:
        return local(t).untyped_storage().data_ptr()
    except RuntimeError:
        return None


# ------------------------------------------------------------------ one layout per rank
def _split(X, y, r, k):
    return X.chunk(k)[r], y.chunk(k)[r]


def build(layout, cfg, rank, k, device):
    """(module holding this rank's parameters, optimizer, meter, step(X, y)) for a layout."""
    flat = make_model(cfg).to(device)
    adam = lambda params: torch.optim.Adam(params, lr=cfg.lr)
    if layout == '1f1b':
        return _pipeline(flat, cfg, rank, k, device, adam)
    if layout in ('ddp', 'zero2', 'fsdp'):  # notebook 08's strategies, on this stack
        module, _, optimizer = zero.build(layout, {'lr': cfg.lr}, device, module=flat)
        share = lambda X, y: _split(X, y, rank, k)
    elif layout == 'tp':
        mesh = init_device_mesh(device.type, (k,))
        module = parallelize_module(flat, mesh, tensor_parallel.tp_plan(flat))
        optimizer, share = adam(flat.parameters()), lambda X, y: (X, y)
    elif layout == 'fsdp_tp':
        mesh = init_device_mesh(device.type, tuple(cfg.mesh_shape), mesh_dim_names=('dp', 'tp'))
        module = tensor_parallel.fsdp_x_tp(flat, mesh)
        d = mesh.get_coordinate()[0]
        optimizer = adam(flat.parameters())
        share = lambda X, y: _split(X, y, d, cfg.mesh_shape[0])
    meter = ModuleActivations(flat)

    def step(X, y):
        X, y = share(X, y)
        optimizer.zero_grad()
        with meter:
            out = module(X)
        F.cross_entropy(out, y).backward()
        optimizer.step()
    return flat, optimizer, meter, step


def _pipeline(flat, cfg, rank, p, device, adam):
    blocks = blocks_of(flat)
    meter = SavedActivations(blocks.parameters())
    stages, schedule = pipeline_parallel.build_pipeline(blocks, rank, p, 1, cfg.microbatches,
                                                        '1f1b', device, meter)
    mine = nn.ModuleList([s.submod for s in stages])
    optimizer = adam(mine.parameters())

    def step(X, y):
        optimizer.zero_grad()
        pipeline_parallel.pipeline_step(schedule, stages, X, y)
        optimizer.step()
    return mine, optimizer, meter, step


def run_layout(layout, cfg, rank, k, device):
    """Warm-up steps, timed steps (each from a barrier: the time every rank took) and one
    counted step. Returns this rank's times, bytes sent, bytes held and activations."""
    module, optimizer, meter, step = build(layout, cfg, rank, k, device)
    times, cpu, counter, wire = [], [], CollectiveCounter(), None
    for i in range(cfg.warmup_steps + cfg.timed_steps + 1):
        X, y = make_batch(cfg, i, device)
        counted = i == cfg.warmup_steps + cfg.timed_steps
        dist.barrier()
        d2l.synchronize(device)
        meter.reset_peak()
        tik, cpu_tik = time.perf_counter(), time.process_time()
        if counted:
            sent = tcp_bytes_sent() if dist.get_backend() == 'gloo' else None
            before = zero.memory_mark(device)  # on a GPU: the peak counter, restarted
            with counter:
                step(X, y)
            wire = None if sent is None else tcp_bytes_sent() - sent
            added = zero.memory_added(device, before)  # 0 on a CPU
        else:
            step(X, y)
        d2l.synchronize(device)
        if i >= cfg.warmup_steps and not counted:
            times.append(time.perf_counter() - tik)
            cpu.append(time.process_time() - cpu_tik)  # this process's threads, gloo's too
    params = list(module.parameters())
    state, grad_shards = zero.optimizer_tensors(optimizer)
    held = zero.held_bytes(params, [p.grad for p in params] + grad_shards, state)
    return {'step_times': times, 'cpu_times': cpu, 'bytes_sent': counter.bytes,
            'collectives': counter.calls, 'wire_bytes': wire, 'step_added_bytes': added,
            'step_peak_bytes': None if before is None else before + added,  # a GPU's peak
            'held_bytes': held, 'activation_bytes': meter.peak - meter.base,
            'parameters': sum(local(p).numel() for p in params), 'tensors': len(params)}


# ------------------------------------------------------------------ terms measured alone
def local_shape(layout, cfg, k):
    """(blocks, hidden width, rows, micro-batches) this rank computes in a layout."""
    dp, tp = cfg.mesh_shape
    return {'ddp': (cfg.layers, 4 * cfg.width, cfg.tokens // k, 1),
            'zero2': (cfg.layers, 4 * cfg.width, cfg.tokens // k, 1),
            'fsdp': (cfg.layers, 4 * cfg.width, cfg.tokens // k, 1),
            'tp': (cfg.layers, 4 * cfg.width // k, cfg.tokens, 1),
            '1f1b': (cfg.layers // k, 4 * cfg.width, cfg.tokens, cfg.microbatches),
            'fsdp_tp': (cfg.layers, 4 * cfg.width // tp, cfg.tokens // dp, 1)}[layout]


def compute_alone(layout, cfg, k, device, repeats=2):
    """Seconds of this rank's compute in a layout with no message sent: its local blocks on its
    rows (in its micro-batches), forward, backward and Adam; every rank at once, as in the
    layout. The median of `repeats` after a warm-up."""
    blocks, hidden, rows, m = local_shape(layout, cfg, k)
    torch.manual_seed(cfg.seed)
    model = nn.Sequential(*[m for _ in range(blocks) for m in block(cfg.width, hidden)])
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    X, y = make_batch(cfg, 0, device)
    X, y = X[:rows], y[:rows]
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        d2l.synchronize(device)
        tik = time.perf_counter()
        optimizer.zero_grad()
        for part_X, part_y in zip(X.chunk(m), y.chunk(m)):
            F.cross_entropy(model(part_X), part_y).backward()
        optimizer.step()
        d2l.synchronize(device)
        times.append(time.perf_counter() - tik)
    return times[1:]


def round_trips(sizes, device, repeats=5):
    """{bytes: seconds}: the median round trip of a message of each size between ranks 0 and 1
    (the others wait), as notebook 07 measures its links: 09's one-way time, doubled."""
    return {size: 2 * message_seconds(1, max(1, size // 4), device, repeats) for size in sizes}


def wire_alone(numel, device):
    """{collective: (bytes this rank put on its TCP sockets, bytes a ring sends)} for one
    all-gather and one reduce-scatter of numel float32 values per rank, as FSDP calls them,
    alone; None off gloo or where TCP cannot be read."""
    k = dist.get_world_size()
    shard, whole = torch.ones(numel, device=device), torch.ones(numel * k, device=device)
    if dist.get_backend() != 'gloo' or tcp_bytes_sent() is None:
        return None
    gather = getattr(dist, 'all_gather_single', None) or dist.all_gather_into_tensor
    scatter = getattr(dist, 'reduce_scatter_single', None) or dist.reduce_scatter_tensor
    out = {}
    for name, run in (('all-gather', lambda: gather(whole, shard)),
                      ('reduce-scatter', lambda: scatter(shard, whole))):
        dist.barrier()
        start = tcp_bytes_sent()
        run()
        dist.barrier()  # the last bytes have left (a barrier adds a few bytes)
        out[name] = (tcp_bytes_sent() - start, (k - 1) * numel * 4)
    return out


def cluster_worker(rank, world_size, cfg):
    """One of k ranks measuring, with every rank at once, what the cost model's Cluster
    describes: a block's FLOP/s, Adam's parameters per second, a copy's bytes per second,
    all-reduces of each of `link_sizes` bytes on every rank, and round trips between ranks 0
    and 1."""
    rank, k, device = join(cfg)
    out = {'block_flops': block_flops(cfg.width, cfg.tokens // k, device),
           'adam_updates': adam_updates(cfg.width, device),
           'copy_bandwidth': copy_bandwidth(device),
           'allreduces': {s: allreduce_seconds(s, device) for s in cfg.link_sizes},
           'round_trips': round_trips(cfg.link_sizes, device)}
    dist.barrier()
    return out


def layout_worker(rank, world_size, cfg):
    """One of k ranks: every layout, then each term alone."""
    rank, k, device = join(cfg)
    out = {'layouts': {layout: run_layout(layout, cfg, rank, k, device)
                       for layout in cfg.layouts}}
    out['compute_alone'] = {layout: compute_alone(layout, cfg, k, device)
                            for layout in cfg.layouts}
    psi = sum(p.numel() for p in make_model(cfg).parameters())
    out['allreduce_s'] = allreduce_seconds(4 * psi, device)
    out['wire_alone'] = wire_alone(4 * cfg.width * cfg.width // k, device)
    dist.barrier()
    return out


# ---- saved from 10_planning_a_training_run.ipynb by make export: edit the notebook
def runs_per_second(work, device, seconds=0.25):
    """How often `work` runs per second on this rank while every rank runs its own: back to
    back from a barrier for `seconds`, after a warm-up run."""
    work()
    dist.barrier()
    d2l.synchronize(device)
    runs, tik = 0, time.perf_counter()
    while time.perf_counter() - tik < seconds:
        work()
        d2l.synchronize(device)
        runs += 1
    return runs / (time.perf_counter() - tik)


def block(width, hidden=None):
    """width -> hidden (4 width unless given) -> width, a GELU between: the stack's block."""
    hidden = hidden or 4 * width
    return nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))


def block_flops(width, rows, device):
    """FLOP/s of one block's forward and backward pass on `rows` rows, every rank at once."""
    layer = block(width).to(device)
    X = torch.randn(rows, width, device=device, requires_grad=True)
    return 6 * rows * 8 * width**2 * runs_per_second(lambda: layer(X).sum().backward(), device)


def adam_updates(width, device):
    """Parameters per second Adam updates, on one block's four tensors, every rank at once."""
    layer = block(width).to(device)
    for p in layer.parameters():
        p.grad = torch.ones_like(p)
    adam = torch.optim.Adam(layer.parameters())
    return sum(p.numel() for p in layer.parameters()) * runs_per_second(adam.step, device)


def copy_bandwidth(device):
    """Bytes/s of a large copy, read once and written once, every rank at once: 64 MiB, or on
    a GPU 256 MiB, long enough that synchronizing after each copy costs little."""
    nbytes = {'cuda': 2**28}.get(device.type, 2**26)
    a = torch.empty(nbytes // 4, device=device)
    b = torch.empty_like(a)
    return 2 * nbytes * runs_per_second(lambda: b.copy_(a), device)


def allreduce_seconds(nbytes, device, seconds=0.2):
    """Seconds of an all-reduce of nbytes on every rank, the mean of a run back to back from a
    barrier, as long as the slowest rank's; as many as a first one says fit in `seconds`."""
    x = torch.zeros(max(1, nbytes // 4), device=device)

    def mean_of(runs):
        dist.barrier()
        tik = time.perf_counter()
        for _ in range(runs):
            dist.all_reduce(x)
        d2l.synchronize(device)
        took = torch.tensor([time.perf_counter() - tik], device=device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        return took.item() / runs
    return mean_of(max(3, int(seconds / mean_of(1))))
# ---- end of what 10_planning_a_training_run.ipynb saves
