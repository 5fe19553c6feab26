"""Pipeline parallelism with `torch.distributed.pipelining`, on real processes (notebook 09).

Consecutive layers on consecutive processes, the batch cut into micro-batches, run by
`ScheduleGPipe` (Huang et al., 2019) or `Schedule1F1B`, the synchronous 1F1B of
PipeDream-Flush (Narayanan et al., 2021, "Memory-Efficient Pipeline-Parallel DNN Training").
`pp_worker` checks every schedule against the single-process model, times each stage's work
(meters.ChunkClock) and counts the activations it keeps (meters.SavedActivations).

The taught code (schedule, in_flight, build_pipeline, pipeline_step, make_stack, run_schedule,
and the wait's model: message_seconds, schedule_seconds) stands in the
notebook's cells, and `make export` copies it here, between the marker lines; spawned workers
import this module.
"""
import math
import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import pipelining

import helpers
import pipeline
from meters import ChunkClock, Metered, SavedActivations, join, max_over_ranks, relative_diff


@dataclass(frozen=True)
class PPConfig:
    """What pp_worker runs: a stack of layers_per_rank x p equal blocks, pp_width wide, on a
    batch of pp_batch rows, with each schedule at each m in microbatches: one checked step,
    then pp_steps timed steps. extras: also float64, message and schedule timings, and 05's
    pipeline by hand. device, backend: where the stages compute, and how they talk.
    reference_rows: the single-process reference's gradient is accumulated over chunks of at
    most this many rows (0: the whole batch at once), so that a GPU holds one chunk's
    activations of the whole stack."""
    pp_width: int = 256
    layers_per_rank: int = 4
    pp_batch: int = 64
    microbatches: tuple = (2, 4, 8)
    schedules: tuple = ('gpipe', '1f1b')
    pp_steps: int = 3
    virtual_stages: int = 1
    seed: int = 0
    device: str = 'cpu'
    backend: str = 'gloo'
    collective_timeout: int = 60
    extras: bool = True
    reference_rows: int = 0


# Largest relative difference from the single-process model that rounding explains, per
# layer of the stack: rounding errors add up layer by layer in the backward pass (float32
# reached 5.0e-06 with 16 blocks), while a wrong gradient is off by far more.
ROUNDING_PER_LAYER = {'float32': 2e-6, 'float64': 1e-14}
LEAST_TOLERANCE = {'float32': 1e-5, 'float64': 1e-12}


def tolerance(dtype, layers):
    """The largest relative difference a `layers`-deep stack may show in `dtype`."""
    return max(LEAST_TOLERANCE[dtype], ROUNDING_PER_LAYER[dtype] * layers)


LENET_SHAPES = [(20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,), (800, 128), (128,), (128, 10),
                (10,)]  # notebook 05's LeNet, which its by-hand pipeline (pipeline.py) runs


# ---- saved from 09_tensor_and_pipeline_parallelism.ipynb by make export: edit the notebook
def schedule(kind, p, m, s):
    """Stage s's order of work: ('F', i) forward and ('B', i) backward of micro-batch i."""
    if kind == 'gpipe':
        return [('F', i) for i in range(m)] + [('B', i) for i in range(m)]
    warmup = min(m, p - s)  # 1F1B: fill the pipeline, then one forward, one backward
    order = [('F', i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [('B', i), ('F', warmup + i)]
    return order + [('B', i) for i in range(m - warmup, m)]


def in_flight(order):
    """The most micro-batches whose activations a stage keeps at once."""
    held = peak = 0
    for kind, _ in order:
        held += {'F': 1, 'B': -1}[kind]
        peak = max(peak, held)
    return peak


SCHEDULE_CLASSES = {'gpipe': pipelining.ScheduleGPipe, '1f1b': pipelining.Schedule1F1B,
                    'interleaved': pipelining.ScheduleInterleaved1F1B}


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
    loss_fn = nn.CrossEntropyLoss()  # mean over a micro-batch; the schedule averages over m
    return stages, SCHEDULE_CLASSES[kind](stages if v > 1 else stages[0], m, loss_fn=loss_fn)


def pipeline_step(schedule, stages, X, y):
    """One training step through the pipeline: the first stage feeds the batch, the last
    computes the loss of each micro-batch; the schedule decides the order of the rest."""
    losses = []
    first, last = any(s.is_first for s in stages), any(s.is_last for s in stages)
    schedule.step(*([X] if first else []), **({'target': y, 'losses': losses} if last else {}))
    return losses


def make_stack(width, layers, seed=0):
    """`layers` equal blocks (Linear, GELU) of `width` units: every stage gets the same layers.
    GELU, not ReLU: at ReLU's kink float32's rounding can switch a unit off in one computation
    and on in the other, a real difference in the gradients, not a rounding one."""
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU())
                           for _ in range(layers)])


def run_schedule(kind, m, cfg, blocks, X, y, reference, device):
    """cfg.pp_steps + 1 steps with one schedule and m micro-batches: the first is checked
    against the single-process model (`reference`), the others are timed. Returns each timed
    step's chunks (intervals and CPU seconds), this rank's peak activation bytes, and the
    first step's differences."""
    rank, p = dist.get_rank(), dist.get_world_size()
    v = cfg.virtual_stages if kind == 'interleaved' else 1  # stages per rank
    meter = SavedActivations(blocks.parameters())
    stages, schedule = build_pipeline(blocks, rank, p, v, m, kind, device, meter)
    clock = ChunkClock(device)
    for stage in stages:
        clock.time(stage)
    out = {'events': [], 'cpu': [], 'peak_bytes': 0}
    for step in range(cfg.pp_steps + 1):
        blocks.zero_grad(set_to_none=True)
        dist.barrier()  # every stage starts the step together
        clock.start_step()
        meter.reset_peak()
        losses = pipeline_step(schedule, stages, X, y)
        if step == 0:
            out.update(pipeline_diffs(losses, reference, blocks))
        else:
            out['events'].append(clock.intervals())
            out['cpu'].append(clock.cpu_seconds())
            out['peak_bytes'] = max(out['peak_bytes'], meter.peak - meter.base)
    blocks.zero_grad(set_to_none=True)
    out['microbatch_bytes'] = microbatch_bytes(blocks, rank, p, v, X[:len(X) // m])
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
# ---- end of what 09_tensor_and_pipeline_parallelism.ipynb saves


def microbatch_bytes(blocks, rank, p, v, X):
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


def _pipeline_inputs(cfg, layers, device, dtype):
    """The whole stack (every rank builds it alike, then keeps its stages), a batch, and the
    single-process model's loss and gradients on that batch (the mean loss over every row)."""
    blocks = make_stack(cfg.pp_width, layers, cfg.seed).to(device, dtype)
    g = torch.Generator().manual_seed(cfg.seed + 1)
    X = torch.randn(cfg.pp_batch, cfg.pp_width, generator=g).to(device, dtype)
    y = torch.randint(0, cfg.pp_width, (cfg.pp_batch,), generator=g).to(device)
    model = make_stack(cfg.pp_width, layers, cfg.seed).to(device, dtype)
    rows, loss = cfg.reference_rows or len(X), 0.0
    for part_X, part_y in zip(X.split(rows), y.split(rows)):
        part = nn.CrossEntropyLoss()(model(part_X), part_y) * (len(part_X) / len(X))
        part.backward()
        loss = loss + part.detach()
    return blocks, X, y, (loss, model)


def pipeline_diffs(losses, reference, blocks):
    """Relative differences of the loss (the mean over the micro-batches, on the last stage)
    and of this rank's gradients from the single-process model's, the largest over the ranks;
    and which of the stack's parameters (by position) got a gradient on this rank."""
    loss0, model = reference
    pairs = list(zip(blocks.parameters(), model.parameters()))
    grads = [(a.grad, b.grad) for a, b in pairs if a.grad is not None]
    loss_diff = relative_diff(torch.stack(losses).mean(), loss0) if losses else 0.0
    return {'loss_diff': max_over_ranks(loss_diff),
            'gradient_diff': max_over_ranks(max(relative_diff(a, b) for a, b in grads)),
            'stages_with_gradients': len(grads),
            'parameters_with_gradients': [i for i, (a, _) in enumerate(pairs)
                                          if a.grad is not None]}


def lenet_reference(cfg):
    """Notebook 05's by-hand pipeline (pipeline.pipeline_step, GPipe's order) on its LeNet, run
    by ranks 0 and 1 at the same m: the reference point for the idle fraction. Returns each
    timed step's compute intervals on this rank as (start, end, kind, stage), stage 0 on rank 0
    and stage 1 on rank 1 (empty on ranks beyond 1)."""
    g = torch.Generator().manual_seed(cfg.seed)
    params = [torch.randn(s, generator=g) / math.sqrt(math.prod(s[1:]) or s[0])
              for s in LENET_SHAPES]
    X = torch.randn(cfg.pp_batch, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (cfg.pp_batch,), generator=g)
    rank = dist.get_rank()
    mine = params[:pipeline.STAGE0_PARAMS] if rank == 0 else params[pipeline.STAGE0_PARAMS:]
    mine = [t.clone().requires_grad_() for t in mine]
    with torch.no_grad():
        shape = pipeline.stage0(X[:1], params[:pipeline.STAGE0_PARAMS]).shape[1:]
    out = {}
    for m in cfg.microbatches:
        out[m] = []
        for step in range(cfg.pp_steps + 1):
            dist.barrier()
            if rank < 2:
                events, _ = pipeline.pipeline_step(rank, mine, X, y, m, shape)
                out[m] += [[(*e, rank) for e in events]] if step else []
            for t in mine:
                t.grad = None
    return out


def _extras(cfg, inputs, layers, device):
    """One float64 step of each schedule at the largest m; at each m the time one activation
    takes from stage to stage and 1F1B's own time per micro-batch; and notebook 05's pipeline
    by hand (at p >= 2, on CPU processes)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    blocks, X, y, reference = _pipeline_inputs(cfg, layers, device, torch.float64)
    m = max(cfg.microbatches)
    once = replace(cfg, pp_steps=0)  # float64: one step of each schedule, the differences only
    out = {'float64': {kind: run_schedule(kind, m, once, blocks, X, y, reference, device)
                       for kind in cfg.schedules}}
    if p >= 2:
        out['message_s'] = {m: message_seconds(len(X) // m, cfg.pp_width, device)
                            for m in cfg.microbatches}
    alone = [dist.new_group([r]) for r in range(p)][rank]  # every rank makes every group
    blocks, X, y, _ = inputs
    out['schedule_s'] = {m: schedule_seconds(m, blocks, X, y, device, alone)
                         for m in cfg.microbatches}
    if p >= 2 and device.type == 'cpu':  # 05's pipeline sends CPU tensors
        out['by_hand'] = lenet_reference(cfg)
    return out


def pp_worker(rank, world_size, cfg):
    """One of p ranks: every schedule at every m (cfg.extras: and _extras)."""
    rank, p, device = join(cfg)
    layers = cfg.layers_per_rank * p  # the same stack for every schedule
    inputs = _pipeline_inputs(cfg, layers, device, torch.float32)
    out = {kind: {m: run_schedule(kind, m, cfg, *inputs, device) for m in cfg.microbatches}
           for kind in cfg.schedules}
    out['layers'] = layers
    if cfg.extras:
        out.update(_extras(cfg, inputs, layers, device))
    dist.barrier()
    return out
