"""Tensor and pipeline parallelism, measured on real processes (notebook 09).

Three ways to spread one model over k processes, each checked against the single-process model:

* Tensor parallelism (Shoeybi et al., 2019, "Megatron-LM"): the first linear layer of an MLP is
  split by columns and the second by rows, so that one all-reduce per pass joins the halves.
  `ShardedMLP` does it by hand with the operators f and g; `parallelize_module` with
  `ColwiseParallel` and `RowwiseParallel` does it with DTensor. `tp_worker` runs both.
* Pipeline parallelism with `torch.distributed.pipelining`: consecutive layers on consecutive
  processes, the batch cut into micro-batches, run by `ScheduleGPipe` (Huang et al., 2019) or
  `Schedule1F1B`, the synchronous 1F1B of PipeDream-Flush (Narayanan et al., 2021, "Memory-
  Efficient Pipeline-Parallel DNN Training"). `pp_worker` times each stage's work (`ChunkClock`)
  and counts the activations it keeps (`SavedActivations`).
* FSDP x TP on a 2-D `DeviceMesh`: `mesh_worker` trains notebook 08's MLP with FSDP on one
  dimension and tensor parallelism on the other, beside 08's DDP and FSDP (zero.run_strategy).

The workers are entry points for launch.run_workers; they live here because spawned processes
must import them.
"""
import logging
import math
import time
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.nn import functional as F

import helpers
import launch
import pipeline
import zero
from collectives import CollectiveCounter, tcp_bytes_sent
from stats import median

DTYPES = ('float32', 'float64')  # float64: the same computation, without float32's rounding


def _local(t):
    return t.to_local() if hasattr(t, 'to_local') else t  # a DTensor's part on this rank


def _full(t):
    return t.full_tensor() if hasattr(t, 'full_tensor') else t  # a DTensor, gathered


def _max_over_ranks(value):
    return zero._max_over_ranks(value)


# --------------------------------------------------------------- counting activations
class _Saved:
    """One tensor autograd saved for the backward pass, while the meter watches it."""
    __slots__ = ('meter', 'tensor', 'key')

    def __init__(self, meter, tensor, key):
        self.meter, self.tensor, self.key = meter, tensor, key

    def __del__(self):  # autograd frees what it saved once the backward pass has used it
        self.meter._release(self.key)


class SavedActivations:
    """Counts the bytes autograd keeps for the backward pass (the activations), now and at their
    peak. While the meter is active (`with meter:`), every tensor a forward pass saves passes
    through torch.autograd.graph.saved_tensors_hooks. Parameters are not activations and are
    skipped; memory saved by two operations (a layer's input is often the previous layer's
    output) counts once; a saved tensor stops counting when autograd frees it."""

    def __init__(self, parameters=()):
        self.skip = {_local(p).untyped_storage().data_ptr() for p in parameters}
        self.held = {}  # (round, address, bytes) of a saved tensor's memory -> how many saved it
        self.live = self.peak = self.base = self.round = 0

    def reset_peak(self):
        """Measure the peak from now on, above what is held now (`base`): a new round, whose
        saved tensors count even where an earlier round saved the same memory."""
        self.peak = self.base = self.live
        self.round += 1

    def _pack(self, t):
        with torch.no_grad():
            local = _local(t)  # a DTensor's part on this rank
        if local.untyped_storage().data_ptr() in self.skip:
            return t
        key = (self.round, local.data_ptr(), local.numel() * local.element_size())
        if key not in self.held:
            self.held[key] = 0
            self.live += key[2]
            self.peak = max(self.peak, self.live)
        self.held[key] += 1
        # Keep a detached alias: holding the saved tensor itself would tie it to its own graph
        # node (a ReLU saves its output) in a cycle that outlives the graph.
        return _Saved(self, t.detach(), key)

    def _release(self, key):
        self.held[key] -= 1
        if self.held[key] == 0:
            self.live -= key[2]
            del self.held[key]

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Saved) else packed

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


class Metered(nn.Module):
    """`module`, with the activations its forward passes save counted by `meter`."""

    def __init__(self, module, meter):
        super().__init__()
        self.inner, self.meter = module, meter

    def forward(self, x):
        with self.meter:
            return self.inner(x)


# ------------------------------------------------------------------ tensor parallelism
class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: the identity going forward (every rank needs the whole input); going
    backward, an all-reduce that sums the input gradients the ranks computed from their slices."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g, f's conjugate: an all-reduce going forward (the sum of the ranks' partial
    outputs); the identity going backward (every rank needs the whole output gradient)."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


f, g = CopyToTensorParallel.apply, ReduceFromTensorParallel.apply


class MLP(nn.Module):
    """A transformer's MLP block: d_model -> hidden, GeLU, hidden -> d_model."""

    def __init__(self, d_model, hidden):
        super().__init__()
        self.up, self.down = nn.Linear(d_model, hidden), nn.Linear(hidden, d_model)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class ShardedMLP(nn.Module):
    """This rank's part of `mlp` split over t ranks, Megatron-style. Its first weight matrix A
    (hidden columns) is split by columns and its second, B, by rows: rank r keeps hidden units
    [r n, (r+1) n) of both, n = hidden / t. nn.Linear stores A transposed, so A's columns are
    rows of `up.weight` and B's rows are columns of `down.weight`."""

    def __init__(self, mlp, rank, t):
        super().__init__()
        n = mlp.up.out_features // t
        mine = slice(rank * n, (rank + 1) * n)
        keep = lambda w: nn.Parameter(w.detach().clone())
        self.up_weight, self.up_bias = keep(mlp.up.weight[mine]), keep(mlp.up.bias[mine])
        self.down_weight = keep(mlp.down.weight[:, mine])
        self.down_bias = keep(mlp.down.bias)  # whole on every rank: added once, after the sum

    def forward(self, x):
        x = f(x)                                                  # all-reduce in backward
        h = F.gelu(F.linear(x, self.up_weight, self.up_bias))     # this rank's hidden units
        return g(F.linear(h, self.down_weight)) + self.down_bias  # all-reduce: sum the parts


def parallelize_mlp(mlp, mesh):
    """The same split with PyTorch's DTensor: `up` by columns, `down` by rows."""
    return parallelize_module(mlp, mesh, {'up': ColwiseParallel(), 'down': RowwiseParallel()})


class NormMLP(nn.Module):
    """LayerNorm, then the MLP: the region sequence parallelism (an exercise) splits."""

    def __init__(self, d_model, hidden):
        super().__init__()
        self.norm, self.mlp = nn.LayerNorm(d_model), MLP(d_model, hidden)

    def forward(self, x):
        return self.mlp(self.norm(x))


def sequence_parallelize(block, mesh, sequence_parallel):
    """Tensor parallelism on the MLP of a NormMLP; with sequence_parallel, the LayerNorm also
    works on 1/t of the sequence, and the all-reduces become all-gathers and reduce-scatters
    (Korthikanti et al., 2022, "Reducing Activation Recomputation in Large Transformer Models")."""
    if not sequence_parallel:
        return parallelize_module(block, mesh, {'mlp.up': ColwiseParallel(),
                                                'mlp.down': RowwiseParallel()})
    return parallelize_module(block, mesh, {
        'norm': SequenceParallel(),
        'mlp.up': ColwiseParallel(input_layouts=Shard(1)),
        'mlp.down': RowwiseParallel(output_layouts=Shard(1), use_local_output=False)})


TP_DEFAULTS = {'d_model': 64, 'hidden': 256, 'batch': 4, 'seq': 32, 'seed': 0,
               'backend': 'gloo', 'timeout': 60, 'sequence_parallel': False}


def _one_pass(model, X, params, sequence_shard=None):
    """Forward and backward of sum(model(X)) with the collectives, the wire and the activations
    counted. sequence_shard: (rank, t) when the model takes 1/t of the sequence (and returns it).
    Returns the output, the gradient of the part of the input this rank fed, and the
    measurements."""
    x = X.detach().clone().requires_grad_()
    inputs = _shard(x, sequence_shard)
    counter, meter = CollectiveCounter(), SavedActivations(params)
    dist.barrier()
    sent = tcp_bytes_sent() if dist.get_backend() == 'gloo' else None
    with counter:
        with meter:
            y = model(inputs)
        held = meter.live  # the activations kept for the backward pass
        _local(y).sum().backward()
    dist.barrier()
    wire = None if sent is None else tcp_bytes_sent() - sent
    weights = sum(_local(p).numel() * _local(p).element_size() for p in params)
    return _full(y).detach(), _shard(x.grad, sequence_shard), {
        'counted_bytes': counter.bytes, 'collectives': counter.calls, 'wire_bytes': wire,
        'weight_bytes': weights, 'activation_bytes': held}


def _shard(x, sequence_shard):
    return x if sequence_shard is None else x.tensor_split(sequence_shard[1], 1)[sequence_shard[0]]


def tp_check(cfg, device, dtype, rank, t):
    """The MLP on one process, split by hand (f and g), and split by parallelize_module: the
    same input, forward and backward. Returns the largest differences from the single-process
    model (forward, gradients) and what each pass counted."""
    torch.manual_seed(cfg['seed'])
    dt = getattr(torch, dtype)
    single = MLP(cfg['d_model'], cfg['hidden']).to(device, dt)
    g_cpu = torch.Generator().manual_seed(cfg['seed'] + 1)
    X = torch.randn(cfg['batch'], cfg['seq'], cfg['d_model'], generator=g_cpu).to(device, dt)
    y0, dx0, measured = _one_pass(single, X, list(single.parameters()))
    grads0 = {n: p.grad for n, p in single.named_parameters()}
    out = {'single': measured}

    by_hand = ShardedMLP(single, rank, t)
    y, dx, out['by_hand'] = _one_pass(by_hand, X, list(by_hand.parameters()))
    n = cfg['hidden'] // t
    mine = slice(rank * n, (rank + 1) * n)
    expected = {'up_weight': grads0['up.weight'][mine], 'up_bias': grads0['up.bias'][mine],
                'down_weight': grads0['down.weight'][:, mine], 'down_bias': grads0['down.bias']}
    out['by_hand'].update(_diffs(y, y0, dx, dx0, [(p.grad, expected[name])
                                                  for name, p in by_hand.named_parameters()]))

    mesh = init_device_mesh(device.type, (t,))
    library = parallelize_mlp(_copy(single, cfg, dt, device), mesh)
    y, dx, out['library'] = _one_pass(library, X, list(library.parameters()))
    out['library'].update(_diffs(y, y0, dx, dx0, [(_full(p.grad), grads0[name])
                                                  for name, p in library.named_parameters()]))
    return out


def _copy(module, cfg, dtype, device):
    clone = type(module)(cfg['d_model'], cfg['hidden']).to(device, dtype)
    clone.load_state_dict(module.state_dict())
    return clone


def relative_diff(a, b):
    """max |a - b| over max |b|: how far a is from b, relative to b's largest value."""
    return ((a - b).abs().max() / b.abs().max().clamp_min(torch.finfo(b.dtype).tiny)).item()


def _diffs(y, y0, dx, dx0, grads):
    """The largest relative differences over the ranks: of the outputs, and of every gradient
    (the parameters' and the input's)."""
    grad = max([relative_diff(a, b) for a, b in grads] + [relative_diff(dx, dx0)])
    return {'forward_diff': _max_over_ranks(relative_diff(y, y0)),
            'gradient_diff': _max_over_ranks(grad)}


def sp_check(cfg, device, rank, t):
    """LayerNorm + MLP, split by tensor parallelism alone and with sequence parallelism:
    differences from the single-process block, collectives, and activations per rank."""
    torch.manual_seed(cfg['seed'])
    single = NormMLP(cfg['d_model'], cfg['hidden']).to(device)
    g_cpu = torch.Generator().manual_seed(cfg['seed'] + 1)
    X = torch.randn(cfg['batch'], cfg['seq'], cfg['d_model'], generator=g_cpu).to(device)
    out = {}
    y0, dx0, out['single'] = _one_pass(single, X, list(single.parameters()))
    grads0 = {n: p.grad for n, p in single.named_parameters()}
    mesh = init_device_mesh(device.type, (t,))
    for name, sp in (('tensor parallel', False), ('sequence parallel', True)):
        block = NormMLP(cfg['d_model'], cfg['hidden']).to(device)
        block.load_state_dict(single.state_dict())
        block = sequence_parallelize(block, mesh, sp)
        shard = (rank, t) if sp else None
        y, dx, out[name] = _one_pass(block, X, list(block.parameters()), shard)
        out[name].update(_diffs(y, y0, dx, _shard(dx0, shard), [(_full(p.grad), grads0[n])
                                                 for n, p in block.named_parameters()]))
    return out


def tp_worker(rank, world_size, config):
    """One of t ranks: the tensor-parallel checks in float32 and float64 (with
    config['sequence_parallel'], the sequence-parallel exercise instead, in float32)."""
    cfg = helpers.with_defaults(config, TP_DEFAULTS)
    rank, t, device = launch.init_distributed(timeout=cfg['timeout'], backend=cfg['backend'])
    device = device if cfg['backend'] == 'nccl' else torch.device('cpu')
    if cfg['sequence_parallel']:
        return sp_check(cfg, device, rank, t)
    return {dtype: tp_check(cfg, device, dtype, rank, t) for dtype in DTYPES}


# ---------------------------------------------------------------- pipeline parallelism
PP_DEFAULTS = {'width': 256, 'layers_per_rank': 4, 'batch': 64, 'microbatches': (2, 4, 8),
               'schedules': ('gpipe', '1f1b'), 'steps': 3, 'virtual_stages': 1, 'seed': 0,
               'backend': 'gloo', 'timeout': 60, 'extras': True}
LENET_SHAPES = [(20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,), (800, 128), (128,), (128, 10),
                (10,)]  # notebook 05's LeNet, which its by-hand pipeline (pipeline.py) runs


def make_stack(width, layers, seed=0):
    """`layers` equal blocks (Linear, GELU) of `width` units: every stage gets the same layers.
    GELU, not ReLU: at ReLU's kink float32's rounding can switch a unit off in one computation
    and on in the other, a real difference in the gradients, not a rounding one."""
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU())
                           for _ in range(layers)])


def _schedule_classes():
    return {'gpipe': pipelining.ScheduleGPipe, '1f1b': pipelining.Schedule1F1B,
            'interleaved': getattr(pipelining, 'ScheduleInterleaved1F1B', None)}


def build_pipeline(blocks, rank, p, v, m, kind, device, meter):
    """This rank's stages of the stack and the schedule that runs them over m micro-batches.
    With v stages per rank (interleaved), rank r holds stages r, r+p, r+2p, ... `meter`
    counts the activations the rank's stages keep."""
    per_stage = len(blocks) // (p * v)
    stages = []
    for i in range(v):
        s = rank + i * p
        module = Metered(nn.Sequential(*blocks[s * per_stage:(s + 1) * per_stage]), meter)
        stages.append(pipelining.PipelineStage(module, s, p * v, device))
    schedule = _schedule_classes()[kind]
    loss_fn = nn.CrossEntropyLoss()  # mean over a micro-batch; the schedule averages over m
    return stages, schedule(stages if v > 1 else stages[0], m, loss_fn=loss_fn)


def pipeline_step(schedule, stages, X, y):
    """One training step through the pipeline: the first stage feeds the batch, the last
    computes the loss of each micro-batch; the schedule decides the order of the rest."""
    losses = []
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    schedule.step(*([X] if first else []), **({'target': y, 'losses': losses} if last else {}))
    return losses


class ChunkClock:
    """Times every forward and backward chunk a rank's stages run, as (start, end, 'F' or 'B',
    stage) in seconds on the host's monotonic clock (time.perf_counter, CLOCK_MONOTONIC on
    Linux), one clock for all the processes of a machine.

    On a CPU the host clock times the chunk itself: CPU operations are synchronous. On a GPU a
    chunk's kernels run after Python queues them, so two CUDA events, recorded on the current
    stream before and after the chunk, time its kernels. (torch.cuda.synchronize around each
    chunk would also wait for the messages in flight on NCCL's own streams, and so hold the
    schedule back.) The events are placed on the host clock through an anchor event recorded
    at the start of the step, while the GPU was idle."""

    def __init__(self, device):
        self.device, self.cuda, self.events = device, device.type == 'cuda', []

    def start_step(self):
        self.events.clear()
        if self.cuda:
            helpers.synchronize(self.device)  # nothing queued: the anchor runs when recorded
            self.anchor = torch.cuda.Event(enable_timing=True)
            self.anchor.record()
            self.anchor_s = time.perf_counter()

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()  # on torch.cuda.current_stream(), where the stage computes
        return event

    def wrap(self, method, kind, stage):
        """`method` (a stage's forward_one_chunk or backward_one_chunk), timed."""
        def run(*args, **kwargs):
            start = self._now()
            result = method(*args, **kwargs)
            self.events.append((start, self._now(), kind, stage))
            return result
        return run

    def intervals(self):
        """This step's chunks as (start, end, kind, stage), in seconds on the host clock."""
        if not self.cuda:
            return list(self.events)
        helpers.synchronize(self.device)  # every event has run: elapsed_time needs it
        at = lambda e: self.anchor_s + self.anchor.elapsed_time(e) / 1e3  # ms -> s
        return [(at(start), at(end), kind, stage) for start, end, kind, stage in self.events]

    def time(self, stage):
        """Time every chunk `stage` (a PipelineStage) runs from now on."""
        stage.forward_one_chunk = self.wrap(stage.forward_one_chunk, 'F', stage.stage_index)
        stage.backward_one_chunk = self.wrap(stage.backward_one_chunk, 'B', stage.stage_index)


def _one_microbatch_bytes(blocks, rank, p, v, X):
    """Activation bytes one micro-batch, X, leaves on this rank's stages."""
    per_stage = len(blocks) // (p * v)
    total = 0
    for i in range(v):
        s = rank + i * p
        meter = SavedActivations(blocks.parameters())
        with meter:
            out = nn.Sequential(*blocks[s * per_stage:(s + 1) * per_stage])(X.clone())
        total += meter.live
        del out
    return total


def _pipeline_inputs(cfg, device, dtype):
    """The whole stack (every rank builds it alike, then keeps its stages), a batch, and the
    single-process model's loss and gradients on that batch."""
    blocks = make_stack(cfg['width'], cfg['layers'], cfg['seed']).to(device, dtype)
    g = torch.Generator().manual_seed(cfg['seed'] + 1)
    X = torch.randn(cfg['batch'], cfg['width'], generator=g).to(device, dtype)
    y = torch.randint(0, cfg['width'], (cfg['batch'],), generator=g).to(device)
    model = make_stack(cfg['width'], cfg['layers'], cfg['seed']).to(device, dtype)
    loss = nn.CrossEntropyLoss()(model(X), y)
    loss.backward()
    return blocks, X, y, (loss.detach(), model)


def run_schedule(kind, m, cfg, blocks, X, y, reference, device):
    """Train `steps` + 1 steps (the first is a warm-up) with one schedule and m micro-batches.
    Returns each timed step's compute intervals, this rank's peak activation bytes, and the
    differences of the first step's loss and gradients from the single-process model's."""
    rank, p = dist.get_rank(), dist.get_world_size()
    v = cfg['virtual_stages'] if kind == 'interleaved' else 1  # stages per rank
    meter = SavedActivations(blocks.parameters())
    for block in blocks:
        block.zero_grad(set_to_none=True)
    stages, schedule = build_pipeline(blocks, rank, p, v, m, kind, device, meter)
    clock = ChunkClock(device)
    for stage in stages:
        clock.time(stage)
    out = {'events': [], 'peak_bytes': 0}
    for step in range(cfg['steps'] + 1):
        dist.barrier()
        clock.start_step()
        meter.reset_peak()
        losses = pipeline_step(schedule, stages, X, y)
        if step == 0:
            out.update(_pipeline_diffs(stages, losses, reference, blocks))
        else:
            out['events'].append(clock.intervals())
            out['peak_bytes'] = max(out['peak_bytes'], meter.peak - meter.base)
        for block in blocks:
            block.zero_grad(set_to_none=True)
    out['microbatch_bytes'] = _one_microbatch_bytes(blocks, rank, p, v, X[:len(X) // m])
    return out


def _pipeline_diffs(stages, losses, reference, blocks):
    """Relative differences of the loss (the mean over the micro-batches, on the last stage)
    and of this rank's gradients from the single-process model's, the largest over the ranks;
    and which of the stack's parameters (by position) got a gradient on this rank."""
    loss0, model = reference
    pairs = list(zip(blocks.parameters(), model.parameters()))
    grads = [(a.grad, b.grad) for a, b in pairs if a.grad is not None]
    loss_diff = relative_diff(torch.stack(losses).mean(), loss0) if losses else 0.0
    return {'loss_diff': _max_over_ranks(loss_diff),
            'gradient_diff': _max_over_ranks(max(relative_diff(a, b) for a, b in grads)),
            'stages_with_gradients': len(grads),
            'parameters_with_gradients': [i for i, (a, _) in enumerate(pairs)
                                          if a.grad is not None]}


def lenet_reference(cfg):
    """Notebook 05's by-hand pipeline (pipeline.pipeline_step, GPipe's order) on its LeNet, run
    by ranks 0 and 1 at the same m: the reference point for the idle fraction. Returns each
    timed step's compute intervals on this rank as (start, end, kind, stage), stage 0 on rank 0
    and stage 1 on rank 1 (empty on ranks beyond 1)."""
    g = torch.Generator().manual_seed(cfg['seed'])
    params = [torch.randn(s, generator=g) / math.sqrt(math.prod(s[1:]) or s[0])
              for s in LENET_SHAPES]
    X = torch.randn(cfg['batch'], 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (cfg['batch'],), generator=g)
    rank = dist.get_rank()
    mine = params[:pipeline.STAGE0_PARAMS] if rank == 0 else params[pipeline.STAGE0_PARAMS:]
    mine = [t.clone().requires_grad_() for t in mine]
    with torch.no_grad():
        shape = pipeline.stage0(X[:1], params[:pipeline.STAGE0_PARAMS]).shape[1:]
    out = {}
    for m in cfg['microbatches']:
        out[m] = []
        for step in range(cfg['steps'] + 1):
            dist.barrier()
            if rank < 2:
                events, _ = pipeline.pipeline_step(rank, mine, X, y, m, shape)
                out[m] += [[(*e, rank) for e in events]] if step else []
            for t in mine:
                t.grad = None
    return out


def message_seconds(rows, width, device, repeats=21):
    """One-way time of one micro-batch's activation (rows x width floats) from rank 0 to rank
    1: the median of `repeats` round trips, halved. Ranks beyond 1 only wait."""
    x, times = torch.zeros(rows, width, device=device), []
    for _ in range(repeats + 1):  # the first round trip sets up the connection
        dist.barrier()
        helpers.synchronize(device)
        tik = time.perf_counter()
        if dist.get_rank() == 0:
            dist.send(x, 1)
            dist.recv(x, 1)
        elif dist.get_rank() == 1:
            dist.recv(x, 0)
            dist.send(x, 0)
        helpers.synchronize(device)
        times.append((time.perf_counter() - tik) / 2)
    return sorted(times[1:])[repeats // 2]


def schedule_seconds(m, blocks, X, y, device, group, steps=3):
    """Seconds 1F1B's schedule spends per micro-batch outside the layers' compute when there is
    nothing to wait for: this rank's layers as a one-stage pipeline of their own (`group` holds
    only this rank), so no message is sent and no stage waits for another. The least of
    `steps` steps, after a warm-up step."""
    rank, p = dist.get_rank(), dist.get_world_size()
    per_stage = len(blocks) // p
    module = nn.Sequential(*blocks[rank * per_stage:(rank + 1) * per_stage])
    stage = pipelining.PipelineStage(module, 0, 1, device, group=group)
    schedule = pipelining.Schedule1F1B(stage, m, loss_fn=nn.CrossEntropyLoss())
    clock, outside = ChunkClock(device), []
    clock.time(stage)
    for _ in range(steps + 1):
        clock.start_step()
        tik = time.perf_counter()
        schedule.step(X, target=y)
        helpers.synchronize(device)
        outside.append(time.perf_counter() - tik - sum(e[1] - e[0] for e in clock.intervals()))
        blocks.zero_grad(set_to_none=True)
    return min(outside[1:]) / m


def pp_worker(rank, world_size, config):
    """One of p ranks: every schedule at every m. With config['extras'], also one float64 step
    of each schedule, and at each m the time one activation takes from stage to stage, 1F1B's
    own time per micro-batch, and notebook 05's pipeline by hand (at p >= 2)."""
    cfg = helpers.with_defaults(config, PP_DEFAULTS)
    rank, p, device = launch.init_distributed(timeout=cfg['timeout'], backend=cfg['backend'])
    device = device if cfg['backend'] == 'nccl' else torch.device('cpu')
    cfg['layers'] = cfg['layers_per_rank'] * p  # the same stack for every schedule
    inputs = _pipeline_inputs(cfg, device, torch.float32)
    out = {kind: {m: run_schedule(kind, m, cfg, *inputs, device)
                  for m in cfg['microbatches']} for kind in cfg['schedules']}
    if not cfg['extras']:
        return out
    blocks, X, y, reference = _pipeline_inputs(cfg, device, torch.float64)
    m = max(cfg['microbatches'])  # float64: one step of each schedule, the differences only
    out['float64'] = {kind: run_schedule(kind, m, {**cfg, 'steps': 0}, blocks, X, y, reference,
                                         device) for kind in cfg['schedules']}
    if p >= 2:
        out['message_s'] = {m: message_seconds(len(X) // m, cfg['width'], device)
                            for m in cfg['microbatches']}
    alone = [dist.new_group([r]) for r in range(p)][rank]  # every rank makes every group
    blocks, X, y, _ = inputs
    out['schedule_s'] = {m: schedule_seconds(m, blocks, X, y, device, alone)
                         for m in cfg['microbatches']}
    if p >= 2 and cfg['backend'] == 'gloo':  # 05's pipeline sends CPU tensors
        out['by_hand'] = lenet_reference(cfg)
    dist.barrier()
    return out


# ------------------------------------------------------------------ FSDP x TP, 2-D mesh
MESH_DEFAULTS = {'mesh_shape': (2, 2), 'hidden': 256, 'batch_per_rank': 32, 'timed_steps': 2,
                 'lr': 1e-3, 'sgd_lr': 0.1, 'seed': 0, 'backend': 'gloo', 'timeout': 60}


def tp_plan(module):
    """Pairs of consecutive linear layers, the first by columns and the second by rows, as in
    the MLP above (an odd last layer stays whole on every rank)."""
    linears = [name for name, m in module.named_children() if isinstance(m, nn.Linear)]
    return {name: (ColwiseParallel() if i % 2 == 0 else RowwiseParallel())
            for i, name in enumerate(linears[:len(linears) // 2 * 2])}


def fsdp_x_tp(module, mesh):
    """Tensor parallelism on the mesh's 'tp' dimension, then FSDP on its 'dp' dimension: every
    tensor-parallel shard is sharded again over the data-parallel ranks."""
    # FSDP warns that a layer returns a view, which an in-place change would detach from its
    # backward hook; nothing here changes a layer's output in place.
    warnings.filterwarnings('ignore', message='FSDP2-wrapped module .* returned a view')
    # Gathering a parameter sharded on both dimensions (zero.full_parameters, after training)
    # takes two all-gathers, which DTensor logs as slow; it is not part of any step.
    logging.getLogger('torch.distributed.tensor._redistribute').setLevel(logging.ERROR)
    parallelize_module(module, mesh['tp'], tp_plan(module))
    for layer in module:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh['dp'])
    fully_shard(module, mesh=mesh['dp'])
    return module


def _mesh(device, shape):
    return init_device_mesh(device.type, tuple(shape), mesh_dim_names=('dp', 'tp'))


def _group_batches(cfg, steps, mesh, device):
    """The examples of this rank's data-parallel group: the DDP shares of its tp ranks, joined,
    so that the global batch is the one DDP trains on."""
    dp, tp = cfg['mesh_shape']
    d = mesh.get_coordinate()[0]
    shares = [zero.make_batches(cfg, steps, r, dp * tp, device)
              for r in range(d * tp, (d + 1) * tp)]
    return [(torch.cat([s[i][0] for s in shares]), torch.cat([s[i][1] for s in shares]))
            for i in range(steps)]


def run_mesh(cfg, device, reference):
    """Notebook 08's measurement (zero.run_strategy) for FSDP x TP: Adam steps, the last one
    counted; bytes held per rank, sent per step, and the distance from DDP's parameters."""
    mesh = _mesh(device, cfg['mesh_shape'])
    module = fsdp_x_tp(zero.make_model(cfg).to(device), mesh)
    optimizer = torch.optim.Adam(module.parameters(), lr=cfg['lr'])
    batches = _group_batches(cfg, zero.WARMUP_STEPS + cfg['timed_steps'] + 1, mesh, device)
    loss_fn, times, counter, on_tcp = nn.CrossEntropyLoss(), [], None, device.type == 'cpu'
    for step, (X, y) in enumerate(batches):
        if step == zero.WARMUP_STEPS:
            start = tcp_bytes_sent() if on_tcp else None
        if step == len(batches) - 1:
            end, counter = (tcp_bytes_sent() if on_tcp else None), CollectiveCounter()
        helpers.synchronize(device)
        tik = time.perf_counter()
        with counter or _nothing():
            optimizer.zero_grad()
            loss_fn(module(X), y).backward()
            optimizer.step()
        helpers.synchronize(device)
        times.append(time.perf_counter() - tik)
    params = list(module.parameters())
    held = zero.held_bytes(params, [p.grad for p in params], zero.optimizer_tensors(optimizer)[0])
    flat = zero.full_parameters(module)
    timed = times[zero.WARMUP_STEPS:-1]
    return {'held_bytes': held, 'bytes_per_rank': _max_over_ranks(sum(held.values())),
            'local_parameters': sum(_local(p).numel() for p in params),
            'seconds_per_step': _max_over_ranks(median(timed)),
            'counted_bytes_per_step': counter.bytes, 'collectives_per_step': counter.calls,
            'tcp_bytes_per_step': None if start is None else (end - start) / len(timed),
            'max_diff_vs_ddp': _max_over_ranks((flat - reference).abs().max().item())}


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def smooth(model):
    """08's MLP with GELU in place of ReLU (see make_stack): the same layers and parameters."""
    for i, layer in enumerate(model):
        if isinstance(layer, nn.ReLU):
            model[i] = nn.GELU()
    return model


def sgd_equivalence(cfg, device, dtype, steps=2):
    """`steps` SGD steps of FSDP x TP against the single-process model on the global batch:
    the largest parameter difference, relative to the largest parameter, and how far the
    steps moved the parameters, in the same unit."""
    cfg = {**cfg, 'dtype': dtype}
    mesh = _mesh(device, cfg['mesh_shape'])
    single, module = smooth(zero.make_model(cfg)).to(device), smooth(zero.make_model(cfg))
    module = fsdp_x_tp(module.to(device), mesh)
    dp, tp = cfg['mesh_shape']
    everything = zero.make_batches({**cfg, 'batch_per_rank': cfg['batch_per_rank'] * dp * tp},
                                   steps, 0, 1, device)
    for model, batches in ((single, everything), (module, _group_batches(cfg, steps, mesh,
                                                                          device))):
        sgd = torch.optim.SGD(model.parameters(), lr=cfg['sgd_lr'])
        for X, y in batches:
            sgd.zero_grad()
            nn.CrossEntropyLoss()(model(X), y).backward()
            sgd.step()
    trained = zero.full_parameters(single)
    initial = zero.full_parameters(zero.make_model(cfg)).to(device)
    return {'max_diff': _max_over_ranks(relative_diff(zero.full_parameters(module), trained)),
            'moved': relative_diff(trained, initial)}


def mesh_worker(rank, world_size, config):
    """One of dp x tp ranks: 08's DDP and FSDP over all of them, then FSDP x TP on the 2-D mesh
    (Adam, measured as 08 measures), then its SGD equivalence in float32 and float64."""
    cfg = helpers.with_defaults(config, MESH_DEFAULTS)
    zero_cfg = zero.check_config({k: cfg[k] for k in ('hidden', 'batch_per_rank', 'timed_steps',
                                                      'lr', 'seed', 'backend', 'timeout')},
                                 world_size)
    cfg = {**zero_cfg, **cfg}
    rank, k, device = launch.init_distributed(timeout=cfg['timeout'], backend=cfg['backend'])
    device = device if cfg['backend'] == 'nccl' else torch.device('cpu')
    batches = zero.make_batches(cfg, zero.WARMUP_STEPS + cfg['timed_steps'] + 1, rank, k, device)
    initial = zero.full_parameters(zero.make_model(cfg))
    layouts = {}
    layouts['ddp'], reference = zero.run_strategy('ddp', zero_cfg, batches, device, initial)
    layouts['fsdp'], _ = zero.run_strategy('fsdp', zero_cfg, batches, device, initial, reference)
    layouts['fsdp_tp'] = run_mesh(cfg, device, reference)
    equivalence = {dtype: sgd_equivalence(cfg, device, dtype) for dtype in DTYPES}
    dist.barrier()
    return {'layouts': layouts, 'equivalence': equivalence,
            'parameters': zero.num_parameters(cfg)}
