"""Notebook 05's pipeline: LeNet cut into two stages that run in two worker processes, and the
time two processes take to all-reduce a gradient (the lecture's t2); also the small helpers the
notebook's cells call (precision settings, parameter distances, the pipeline's idle time).

The taught code (`gpu_precision`, `stage0`, `stage1`, `pipeline_step`, `time_allreduce`,
`idle_share`, `span`, `quickest_step`, `first_turn`) stands in the notebook's `#@save pipeline`
cells and is copied here by `make export`: spawned worker processes import the function they
run, so the code a learner reads is the code the workers run. Notebook 09 imports it too.
The notebook starts the workers with `launch.run_workers(pipeline.worker, 2, ...)`; each gets its
share of the cores, and they exchange activations and gradients through gloo.
"""
import contextlib
import math
import time

import torch
import torch.distributed as dist
from torch.nn import functional as F

import launch
import stats

STAGE0_PARAMS = 2  # params[:2] (conv1) belong to stage 0, params[2:] to stage 1
WARMUP_ROUNDS = 3  # untimed steps at every m, before any step is timed


# ---- saved from 05_multi_gpu_from_scratch.ipynb by make export: edit the notebook
@contextlib.contextmanager
def gpu_precision(tf32_convolutions):
    """cuDNN convolutions in TF32 (torch's default) or in full fp32, matrix products in fp32
    (torch's default); the previous settings come back afterwards. No effect on a CPU.
    set_float32_matmul_precision sets torch's old and new matmul settings together."""
    saved = torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()
    torch.backends.cudnn.allow_tf32 = tf32_convolutions
    torch.set_float32_matmul_precision('highest')
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32 = saved[0]
        torch.set_float32_matmul_precision(saved[1])


def stage0(X, params):
    """LeNet's first block: convolution, ReLU, pooling."""
    W1, b1 = params
    return F.avg_pool2d(F.relu(F.conv2d(X, W1, b1)), kernel_size=2)


def stage1(h, params):
    """The rest of LeNet: the second convolution block and the two dense layers (logits)."""
    W2, b2, W3, b3, W4, b4 = params
    h = F.avg_pool2d(F.relu(F.conv2d(h, W2, b2)), kernel_size=2)
    h = F.relu(h.flatten(1) @ W3 + b3)
    return h @ W4 + b4


def pipeline_step(rank, params, X, y, m, activation_shape):
    """Forward and backward passes of one minibatch cut into m micro-batches (GPipe's schedule).

    Stage 0 (rank 0) runs every micro-batch's forward pass, sending each activation on at once,
    then back-propagates each gradient that stage 1 returns. Stage 1 (rank 1) runs forward and
    backward for each micro-batch as soon as its activation arrives. Gradients accumulate in
    params[i].grad over the micro-batches. Returns this rank's compute intervals as
    (start, end, 'F' or 'B') on the machine's monotonic clock, and the bytes it sent."""
    events, sent, handles = [], 0, []
    tick = time.perf_counter  # CLOCK_MONOTONIC on Linux: comparable between processes
    if rank == 0:
        activations = []
        for Xj in X.tensor_split(m):
            start = tick()
            h = stage0(Xj, params)
            events.append((start, tick(), 'F'))
            activations.append(h)
            handles.append(dist.isend(h.detach(), dst=1))
            sent += h.numel() * h.element_size()
        for h in activations:
            grad = torch.empty_like(h)
            dist.recv(grad, src=1)
            start = tick()
            h.backward(grad)
            events.append((start, tick(), 'B'))
    else:
        for yj in y.tensor_split(m):
            h = torch.empty(len(yj), *activation_shape)
            dist.recv(h, src=0)
            start = tick()
            h.requires_grad_()
            logits = stage1(h, params)
            events.append((start, tick(), 'F'))
            start = tick()
            F.cross_entropy(logits, yj, reduction='sum').backward()
            events.append((start, tick(), 'B'))
            handles.append(dist.isend(h.grad, dst=0))
            sent += h.grad.numel() * h.grad.element_size()
    for handle in handles:
        handle.wait()
    return events, sent


def time_allreduce(numels, repeats, min_s=0.004, at_least=4, warmup=5):
    """t2: {numel: seconds of one all-reduce of that many floats, one per repeat}, between this
    process and the others. A repeat is the mean of enough calls in a row to last min_s, and
    at least `at_least`: a barrier releases the ranks a moment apart, and a single call would
    count that moment as latency. Every rank must call it with the same arguments."""
    buffers = {numel: torch.ones(numel) for numel in numels}
    calls = {}
    for numel, buffer in buffers.items():
        for _ in range(warmup):  # untimed: the first calls set up connections and buffers
            dist.all_reduce(buffer)
        start = time.perf_counter()
        dist.all_reduce(buffer)
        wanted = torch.tensor([min_s / max(time.perf_counter() - start, 1e-6)])
        dist.all_reduce(wanted, op=dist.ReduceOp.MAX)  # every rank makes the same calls
        calls[numel] = max(at_least, math.ceil(wanted.item()))
    times = {numel: [] for numel in buffers}
    for _ in range(repeats):  # every size in turn: a busier moment slows every size alike
        for numel, buffer in buffers.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls[numel]):
                dist.all_reduce(buffer)
            times[numel].append((time.perf_counter() - start) / calls[numel])
    return times


def span(events):
    """Seconds from the first start on any rank to the last end on any rank."""
    return max(e[1] for ev in events for e in ev) - min(e[0] for ev in events for e in ev)


def idle_share(events):
    """(idle share of the step, busy seconds of each stage) from one step's compute intervals
    (start, end, kind) per rank: 1 - the stages' busy time / (p x the step's span)."""
    busy = [sum(e[1] - e[0] for e in ev) for ev in events]
    return 1 - sum(busy) / (len(busy) * span(events)), busy


def quickest_step(workers, m):
    """(idle share, busy seconds per stage, events per rank) of the timed step with m
    micro-batches that took least time from its first start to its last end."""
    steps = [[w['events'][m][s] for w in workers] for s in range(len(workers[0]['events'][m]))]
    quickest = min(steps, key=span)
    return idle_share(quickest) + (quickest,)


def first_turn(per_example):
    """(cheapest b, turn b) of a sweep of batch sizes. per_example: {b: [seconds per example,
    one per repeat]}. The cheapest b has the lowest median of all; the turn is the first
    larger b that was dearer per example than the cheapest by the noise rule (stats.compare),
    or None when none was (always None when the largest b is the cheapest)."""
    bs = sorted(per_example)
    cheapest = min(bs, key=lambda b: stats.median(per_example[b]))
    dearer = (b for b in bs if b > cheapest and stats.compare(
        per_example[b], per_example[cheapest], 'b', 'cheapest').a_is_better is False)
    return cheapest, next(dearer, None)
# ---- end of what 05_multi_gpu_from_scratch.ipynb saves


def worker(rank, world_size, params, X, y, microbatches, steps, allreduce_numels, repeats):
    """Rank 0 holds stage 0, rank 1 stage 1. First WARMUP_ROUNDS untimed rounds, each one step at
    every m in `microbatches` (a fresh process's first steps pay for touching memory and for
    choosing the kernels of each shape, which are not the schedule); then `steps` timed rounds,
    every m in turn, so that a machine growing busier or quieter slows every m alike. Then
    time_allreduce times all-reduces of each size in `allreduce_numels` (floats). Returns
    {'events': {m: [step's events, ...]}, 'grads': {m: this stage's gradients after one step},
    'bytes_sent': {m: bytes per step}, 'allreduce_times': {numel: [seconds of each repeat]}}."""
    launch.init_distributed(backend='gloo', timeout=60)
    with torch.no_grad():  # the shape stage 1 receives, from one example
        activation_shape = stage0(X[:1], params[:STAGE0_PARAMS]).shape[1:]
    mine = params[:STAGE0_PARAMS] if rank == 0 else params[STAGE0_PARAMS:]
    mine = [p.detach().clone().requires_grad_() for p in mine]
    out = {'events': {}, 'grads': {}, 'bytes_sent': {}, 'allreduce_times': {}}
    warmup = [(m, None) for _ in range(WARMUP_ROUNDS) for m in microbatches]  # not recorded
    timed = [(m, step) for step in range(steps) for m in microbatches]  # every m in turn
    for m, step in warmup + timed:
        dist.barrier()  # both stages start the step together
        events, sent = pipeline_step(rank, mine, X, y, m, activation_shape)
        if step == 0:
            out['grads'][m] = [p.grad.clone() for p in mine]
            out['bytes_sent'][m] = sent
        if step is not None:
            out['events'].setdefault(m, []).append(events)
        for p in mine:
            p.grad = None
    out['allreduce_times'] = time_allreduce(allreduce_numels, repeats)
    dist.barrier()
    return out


# ------------------------------------------------------------- used by the notebook's cells
def max_difference(a, b):
    """The largest |a_i - b_i| over two lists of tensors (parameters), wherever they live."""
    return max(((x.detach().cpu().double() - y.detach().cpu().double()).abs().max().item()
                for x, y in zip(a, b)), default=0.0)

