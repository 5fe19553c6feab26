"""Worker processes for notebook 05: LeNet cut into a two-stage pipeline, and the time that two
processes take to all-reduce a gradient (the lecture's t2).

The notebook starts them with `launch.run_workers(pipeline.worker, 2, ...)`. Spawned processes
import the function they run, so it lives in this module, not in the notebook. run_workers gives
each process its share of the cores (one each on a 2-core machine), so the two stages really
compute at the same time, and they exchange activations and gradients through gloo, as two
devices would through their link.
"""
import time

import torch
import torch.distributed as dist
from torch.nn import functional as F

import launch

STAGE0_PARAMS = 2  # params[:2] (conv1) belong to stage 0, params[2:] to stage 1


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


def worker(rank, world_size, params, X, y, microbatches, steps, allreduce_numels, repeats):
    """Rank 0 holds stage 0, rank 1 stage 1. One warm-up step, then `steps` timed steps for each
    m in `microbatches`. Then all-reduce tensors of each size in `allreduce_numels` (floats),
    `repeats` times. Returns {'events': {m: [step's events, ...]}, 'grads': {m: this stage's
    gradients after one step}, 'bytes_sent': {m: bytes per step}, 'allreduce_s': {numel:
    median seconds}}."""
    launch.init_distributed(backend='gloo', timeout=60)
    with torch.no_grad():  # the shape stage 1 receives, from one example
        activation_shape = stage0(X[:1], params[:STAGE0_PARAMS]).shape[1:]
    mine = params[:STAGE0_PARAMS] if rank == 0 else params[STAGE0_PARAMS:]
    mine = [p.detach().clone().requires_grad_() for p in mine]
    out = {'events': {}, 'grads': {}, 'bytes_sent': {}, 'allreduce_s': {}}
    runs = [(microbatches[0], None)] + [(m, step) for m in microbatches for step in range(steps)]
    for m, step in runs:  # step None: warm-up (allocations, connections), not recorded
        dist.barrier()  # both stages start the step together
        events, sent = pipeline_step(rank, mine, X, y, m, activation_shape)
        if step == 0:
            out['grads'][m] = [p.grad.clone() for p in mine]
            out['bytes_sent'][m] = sent
        if step is not None:
            out['events'].setdefault(m, []).append(events)
        for p in mine:
            p.grad = None
    for numel in allreduce_numels:
        buffer = torch.ones(numel)
        dist.all_reduce(buffer)  # warm-up: connections, buffers
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            times.append(time.perf_counter() - start)
        out['allreduce_s'][numel] = sorted(times)[len(times) // 2]
    dist.barrier()
    return out
