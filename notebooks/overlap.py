"""Overlapping gradient communication with the backward pass, by hand (notebook 06).

DDP does not wait for the backward pass to end before it communicates. It groups the parameters
into buckets, in the reverse order of `model.parameters()` (roughly the order in which backward
produces their gradients), and starts a bucket's all-reduce as soon as every gradient in it is
ready, so that the exchange of the last layers' gradients runs while backward is still computing
the first layers'. `BucketedAllReduce` does the same with one hook per parameter.

`overlap_worker` is a process entry point for launch.run_workers; it lives here because
spawned processes must import it.
"""
import copy
import functools
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import helpers
import launch


def buckets_by_bytes(params, cap_bytes):
    """Split `params` into buckets of at most `cap_bytes` (a larger tensor gets its own), in
    reverse order: the last layers' gradients are ready first."""
    buckets, size = [[]], 0
    for p in reversed(list(params)):
        nbytes = p.numel() * p.element_size()
        if buckets[-1] and size + nbytes > cap_bytes:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    return buckets


class BucketedAllReduce:
    """Average gradients over the process group, bucket by bucket, during backward.

        with BucketedAllReduce(model.parameters(), cap_bytes) as sync:
            loss.backward()     # each full bucket starts its all-reduce at once (async)
            sync.wait()         # wait for the last ones; gradients are now averaged

    A hook on every parameter (register_post_accumulate_grad_hook) counts the gradients each
    bucket still lacks. Buckets are launched in order, as DDP does, so that every rank issues
    the same collectives in the same order even if their gradients arrive in another."""

    def __init__(self, params, cap_bytes):
        self.buckets = buckets_by_bytes([p for p in params if p.requires_grad], cap_bytes)

    def __enter__(self):
        self._missing = [len(b) for b in self.buckets]
        self._launched, self._inflight = 0, []
        self._handles = [p.register_post_accumulate_grad_hook(functools.partial(self._ready, i))
                         for i, bucket in enumerate(self.buckets) for p in bucket]
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()

    def _ready(self, i, param):
        self._missing[i] -= 1
        while self._launched < len(self.buckets) and not self._missing[self._launched]:
            bucket = self.buckets[self._launched]
            flat = torch.cat([p.grad.reshape(-1) for p in bucket])
            self._inflight.append((bucket, flat, dist.all_reduce(flat, async_op=True)))
            self._launched += 1

    def wait(self):
        if self._launched < len(self.buckets):
            raise RuntimeError(f'backward produced the gradients of {self._launched} of '
                               f'{len(self.buckets)} buckets: every parameter must get one')
        for bucket, flat, work in self._inflight:
            work.wait()
            _write_back(bucket, flat / dist.get_world_size())
        self._inflight = []


def all_reduce_after_backward(params):
    """The plain way: one all-reduce of every gradient once backward has finished."""
    params = [p for p in params if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    _write_back(params, flat / dist.get_world_size())


def _write_back(params, flat):
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()


OVERLAP_DEFAULTS = {'width': 64, 'batch': 2, 'bucket_mb': 4, 'repeats': 5, 'seed': 0,
                    'timeout': 60, 'allreduce_numels': {}}


def check_config(config):
    """The experiment's settings completed with OVERLAP_DEFAULTS; a ValueError names a bad one
    before any process starts."""
    cfg = helpers.with_defaults(config, OVERLAP_DEFAULTS)
    for name in ('width', 'batch', 'repeats', 'timeout'):
        helpers.check_int(name, cfg[name])
    helpers.check_positive('bucket_mb', cfg['bucket_mb'])
    for name, numel in cfg['allreduce_numels'].items():
        helpers.check_int(f'allreduce_numels[{name!r}]', numel)
    return cfg


def overlap_worker(rank, world_size, config):
    """One rank: time backward alone, backward then one all-reduce, backward with bucketed
    all-reduces started by hooks, and DDP's own bucketed backward, on ResNet-18 of `width`
    with `batch` examples per rank; check that all three give the same averaged gradients.
    Also time one all-reduce of each size in `allreduce_numels` (name -> float32 count).
    Times are medians over `repeats`, each the slowest rank's."""
    cfg = check_config(config)
    rank, world_size, device = launch.init_distributed(timeout=cfg['timeout'])
    torch.manual_seed(cfg['seed'])
    net = helpers.resnet18(10, width=cfg['width']).to(device)
    ddp = DistributedDataParallel(copy.deepcopy(net), bucket_cap_mb=cfg['bucket_mb'],
                                  device_ids=[device.index] if device.type == 'cuda' else None)
    g = torch.Generator().manual_seed(cfg['seed'] + 1 + rank)  # each rank its own examples
    X = torch.randn(cfg['batch'], 1, 28, 28, generator=g).to(device)
    y = torch.randint(0, 10, (cfg['batch'],), generator=g).to(device)
    loss = nn.CrossEntropyLoss()
    bucketed = BucketedAllReduce(net.parameters(), cfg['bucket_mb'] * 2**20)

    def backward(model, sync):
        model.zero_grad(set_to_none=True)
        out = loss(model(X), y)            # forward: not timed
        helpers.synchronize(device)
        dist.barrier()                     # every rank starts backward together
        tik = time.perf_counter()
        if sync == 'bucketed':
            with bucketed:
                out.backward()
                bucketed.wait()
        else:
            out.backward()
            if sync == 'after':
                all_reduce_after_backward(model.parameters())
        helpers.synchronize(device)
        return time.perf_counter() - tik

    variants = {'backward_s': (net, None), 'after_s': (net, 'after'),
                'bucketed_s': (net, 'bucketed'), 'ddp_s': (ddp, None)}
    times = {name: [] for name in variants}
    for repeat in range(cfg['repeats'] + 1):   # the first round warms up
        for name, (model, sync) in variants.items():
            seconds = torch.tensor(backward(model, sync), device=device)
            dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            if repeat:
                times[name].append(seconds.item())
            if name in ('after_s', 'bucketed_s'):
                grads = torch.cat([p.grad.reshape(-1) for p in net.parameters()])
                if name == 'after_s':
                    after = grads
    ddp_grads = torch.cat([p.grad.reshape(-1) for p in ddp.module.parameters()])
    result = {name: _median(t) for name, t in times.items()}
    result.update(
        buckets=len(bucketed.buckets), gradient_bytes=after.numel() * after.element_size(),
        bucketed_equals_after=torch.equal(grads, after),
        bucketed_max_diff=(grads - after).abs().max().item(),
        ddp_max_diff=(ddp_grads - after).abs().max().item(), backend=dist.get_backend(),
        device=str(device), allreduce_s={})
    for name, numel in cfg['allreduce_numels'].items():
        x = torch.ones(numel, device=device)
        result['allreduce_s'][name] = _median([_timed_all_reduce(x, device)
                                               for _ in range(2 + 1)][1:])
    return result


def _timed_all_reduce(x, device):
    helpers.synchronize(device)
    dist.barrier()
    tik = time.perf_counter()
    dist.all_reduce(x)
    helpers.synchronize(device)
    seconds = torch.tensor(time.perf_counter() - tik, device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return seconds.item()


def _median(values):
    s = sorted(values)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2
