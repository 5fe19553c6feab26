"""Overlapping gradient communication with the backward pass, by hand (notebook 06).

DDP does not wait for the backward pass to end before it communicates. It groups the parameters
into buckets in the order in which backward produces their gradients (recorded during the first
backward pass; torch.nn.parallel.DistributedDataParallel rebuilds its buckets before the second),
and starts a bucket's all-reduce as soon as every gradient in it is ready, so that the exchange
of the last layers' gradients runs while backward is still computing the first layers'.
`BucketedAllReduce` does the same with one hook per parameter, in the reverse order of
`model.parameters()`, which is roughly that order.

`buckets_by_bytes`, `all_reduce_after_backward`, `write_back`, `BucketedAllReduce`, the timed
loop (`time_variant`, `timed_rounds`), `perfect_overlap_s` and the process entry points
`overlap_worker` (the experiment) and `bucket_sweep` (exercise 4) are written from notebook 06's
`#@save overlap` cells (make export). Here: their settings (OverlapConfig, SweepConfig), each
rank's setup (Rank), all-reduces timed alone, the tables' rows and the bar chart.
"""
import copy
import dataclasses
import functools
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import helpers
import launch
from stats import median


# ---- saved from 06_multi_gpu_concise.ipynb by make export: edit the notebook
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


def all_reduce_after_backward(params):
    """The plain way: one all-reduce of every gradient once backward has finished."""
    params = [p for p in params if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat)
    write_back(params, flat / dist.get_world_size())


def write_back(params, flat):
    """Copy the flat tensor's slices back into the parameters' gradients."""
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()


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
            write_back(bucket, flat / dist.get_world_size())
        self._inflight = []


def time_variant(me, model, how, bucketed=None):
    """Seconds of one way to finish a backward pass on this rank (`me`: its examples me.X,
    me.y, loss, parameters and a gradient-sized buffer me.flat), from a common start, the
    slowest rank's. how: 'backward' (alone), 'after' (then one all-reduce), 'bucketed' (with
    `bucketed`), 'alone' (an all-reduce of the gradient's size, no backward), 'copy' (flatten,
    average and copy back the gradients, no communication). The forward pass is not timed."""
    if how not in ('alone', 'copy'):
        model.zero_grad(set_to_none=True)
        out = me.loss(model(me.X), me.y)
    helpers.synchronize(me.device)
    dist.barrier()                     # every rank starts together
    tik = time.perf_counter()
    if how == 'alone':
        dist.all_reduce(me.flat)
    elif how == 'copy':
        write_back(me.params, torch.cat([p.grad.reshape(-1) for p in me.params])
                   / me.world_size)
    elif how == 'bucketed':
        with bucketed:
            out.backward()
            bucketed.wait()
    else:
        out.backward()
        if how == 'after':
            all_reduce_after_backward(model.parameters())
    helpers.synchronize(me.device)
    seconds = torch.tensor(time.perf_counter() - tik, device=me.device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)   # the slowest rank's time
    return seconds.item()


def timed_rounds(me, variants, repeats, passes):
    """{name: [seconds, one per round]} for variants {name: (model, how[, bucketed])}: after
    one pass of each to warm up, every round times each variant in turn, as the median of
    `passes` timings in a row."""
    for variant in variants.values():   # warm-up, not kept
        time_variant(me, *variant)
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, variant in variants.items():
            times[name].append(median([time_variant(me, *variant) for _ in range(passes)]))
    return times


def perfect_overlap_s(ov):
    """The best a bucketed backward could do: the device must still run backward and the
    copies (flatten, average, copy back), the link the all-reduce; at best the shorter of the
    two hides entirely under the longer. From the medians measured alone."""
    return max(ov['backward_s'] + ov['copy_s'], ov['allreduce_alone_s'])


def all_reduce_seconds(x, device, repeats):
    """Median seconds of `repeats` all-reduces of x alone (the slower rank's), after one to
    warm up. A single one can take ten times its median, right after other work."""
    return median([timed_all_reduce(x, device) for _ in range(repeats + 1)][1:])


def timed_all_reduce(x, device):
    """Seconds of one all-reduce of x from a common start, the slowest rank's."""
    helpers.synchronize(device)
    dist.barrier()                     # every rank starts together
    tik = time.perf_counter()
    dist.all_reduce(x)
    helpers.synchronize(device)        # a GPU's all-reduce returns before it has finished
    seconds = torch.tensor(time.perf_counter() - tik, device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
    return seconds.item()


def overlap_worker(rank, world_size, config):
    """One rank of the overlap experiment (OverlapConfig): the six variants timed in turns,
    round after round; then, from the same parameters and examples, the three exchanges'
    averaged gradients compared; then one all-reduce timed alone for each size in
    `allreduce_numels`. 'times' keeps each variant's rounds, each name its median."""
    me = Rank(config, OverlapConfig)
    cfg = me.cfg
    ddp = DistributedDataParallel(copy.deepcopy(me.net), bucket_cap_mb=cfg.bucket_mb,
                                  device_ids=me.device_ids)
    bucketed = BucketedAllReduce(me.net.parameters(), cfg.bucket_mb * 2**20)
    variants = {'backward_s': (me.net, 'backward'), 'copy_s': (me.net, 'copy'),
                'allreduce_alone_s': (None, 'alone'), 'after_s': (me.net, 'after'),
                'bucketed_s': (me.net, 'bucketed', bucketed), 'ddp_s': (ddp, 'backward')}
    times = timed_rounds(me, variants, cfg.repeats, cfg.passes)
    times['sequential_s'] = [b + a for b, a in zip(times['backward_s'],
                                                   times['allreduce_alone_s'])]
    time_variant(me, me.net, 'after')    # one all-reduce after backward: the reference
    after = me.gradients(me.net)
    time_variant(me, me.net, 'bucketed', bucketed)
    ours, ddps = me.gradients(me.net), me.gradients(ddp.module)  # DDP's: its last round
    return {**{name: median(t) for name, t in times.items()}, 'times': times,
            'buckets': len(bucketed.buckets), 'backend': dist.get_backend(),
            'gradient_bytes': after.numel() * after.element_size(), 'device': str(me.device),
            'bucketed_equals_after': torch.equal(ours, after),
            'bucketed_max_diff': (ours - after).abs().max().item(),
            'ddp_max_diff': (ddps - after).abs().max().item(),
            'allreduce_s': {name: all_reduce_seconds(torch.ones(n, device=me.device), me.device,
                                                     ALLREDUCE_REPEATS)
                            for name, n in cfg.allreduce_numels.items()}}


def bucket_sweep(rank, world_size, config):
    """Exercise 4 (SweepConfig): backward with our buckets at each cap in `caps_mb` (MiB), in
    turns with backward alone, the all-reduce alone and backward then one all-reduce. Returns
    each cap's bucket count, every variant's rounds ('times') and median, and one all-reduce
    of SMALL_MESSAGE_BYTES timed alone: the fixed cost that every all-reduce pays."""
    me = Rank(config, SweepConfig)
    syncs = {cap: BucketedAllReduce(me.net.parameters(), cap * 2**20) for cap in me.cfg.caps_mb}
    variants = {cap: (me.net, 'bucketed', sync) for cap, sync in syncs.items()}
    variants.update({'backward_s': (me.net, 'backward'), 'allreduce_alone_s': (None, 'alone'),
                     'after_s': (me.net, 'after')})
    times = timed_rounds(me, variants, me.cfg.repeats, me.cfg.passes)
    times['sequential_s'] = [b + a for b, a in zip(times['backward_s'],
                                                   times['allreduce_alone_s'])]
    small = torch.ones(SMALL_MESSAGE_BYTES // 4, device=me.device)
    return {'buckets': {cap: len(s.buckets) for cap, s in syncs.items()}, 'times': times,
            **{name: median(t) for name, t in times.items()},
            'small_allreduce_bytes': small.numel() * small.element_size(),
            'small_allreduce_s': all_reduce_seconds(small, me.device, SMALL_REPEATS)}
# ---- end of what 06_multi_gpu_concise.ipynb saves


REPEATS, PASSES = 7, 5   # rounds (after one warm-up), and timings per variant in a round
SWEEP_PASSES = 3          # exercise 4 times more variants: fewer timings in a round
SMALL_MESSAGE_BYTES = 1024   # an all-reduce this small costs its fixed cost: latency, launch
ALLREDUCE_REPEATS, SMALL_REPEATS = 5, 9   # all-reduces timed alone: a median of this many


@dataclasses.dataclass(frozen=True)
class OverlapConfig:
    """The overlap experiment's settings: ResNet-18 of `width`, `batch` examples per rank,
    buckets of `bucket_mb` MiB, `repeats` rounds of `passes` timings, and one all-reduce
    timed alone for each entry of `allreduce_numels` (name -> float32 count)."""
    width: int = 64
    batch: int = 2
    bucket_mb: float = 4
    repeats: int = REPEATS
    passes: int = PASSES
    seed: int = 0
    timeout: int = 60            # seconds a collective waits before it gives up
    allreduce_numels: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """Exercise 4's settings: the overlap experiment's network and rounds, one bucketed
    backward per cap in `caps_mb` (MiB), from a fraction of a layer to everything."""
    width: int = 32
    batch: int = 2
    caps_mb: tuple = (0.05, 0.5, 4, 1024)
    repeats: int = REPEATS
    passes: int = SWEEP_PASSES
    seed: int = 0
    timeout: int = 60


def check_config(config, kind=OverlapConfig):
    """The settings as a `kind` (OverlapConfig or SweepConfig), from one or from a dict of its
    fields; a ValueError names a bad one before any process starts."""
    if isinstance(config, dict):
        defaults = {f.name: getattr(kind(), f.name) for f in dataclasses.fields(kind)}
        config = kind(**helpers.with_defaults(config, defaults))
    for name in ('width', 'batch', 'repeats', 'passes', 'timeout'):
        helpers.check_int(name, getattr(config, name))
    if hasattr(config, 'bucket_mb'):
        helpers.check_positive('bucket_mb', config.bucket_mb)
    for cap in getattr(config, 'caps_mb', ()):
        helpers.check_positive('each of caps_mb', cap)
    for name, numel in getattr(config, 'allreduce_numels', {}).items():
        helpers.check_int(f'allreduce_numels[{name!r}]', numel)
    return config


class Rank:
    """One rank's share of an experiment, its settings checked (`kind`: OverlapConfig or
    SweepConfig) as `cfg`: ResNet-18 of `width`, `batch` examples of its own, a buffer the size
    of the gradient, and the device_ids DDP takes (time_variant times one way to finish its
    backward)."""

    def __init__(self, config, kind):
        self.cfg = cfg = check_config(config, kind)
        self.rank, self.world_size, self.device = launch.init_distributed(timeout=cfg.timeout)
        self.device_ids = [self.device.index] if self.device.type == 'cuda' else None
        torch.manual_seed(cfg.seed)
        self.net = helpers.resnet18(10, width=cfg.width).to(self.device)
        self.params = list(self.net.parameters())
        g = torch.Generator().manual_seed(cfg.seed + 1 + self.rank)  # each its own examples
        self.X = torch.randn(cfg.batch, 1, 28, 28, generator=g).to(self.device)
        self.y = torch.randint(0, 10, (cfg.batch,), generator=g).to(self.device)
        self.flat = torch.zeros(sum(p.numel() for p in self.params), device=self.device)
        self.loss = nn.CrossEntropyLoss()

    def gradients(self, model):
        return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


# What the experiment's names mean, in the order a table lists them.
TIMINGS = {'backward_s': 'backward alone', 'allreduce_alone_s': 'all-reduce alone',
           'copy_s': 'flatten, average, copy back',
           'sequential_s': 'backward + all-reduce, each alone',
           'after_s': 'backward, then one all-reduce', 'bucketed_s': 'backward with our buckets',
           'ddp_s': 'DDP'}
BAR_COLORS = {'backward_s': 'gray', 'allreduce_alone_s': 'silver', 'copy_s': 'tan',
              'sequential_s': None, 'after_s': 'C1', 'bucketed_s': 'C0', 'ddp_s': 'C2'}


def round_ratios(result, key, reference):
    """The reference's time over `key`'s, round by round (above 1: `key` was faster in that
    round). The rounds time every variant in turn, so these are paired repeats, the ratios
    stats.compare_paired judges."""
    return [r / t for t, r in zip(result['times'][key], result['times'][reference])]


def timing_rows(result, names=None, reference=None):
    """Rows for report.table. names: {key: row label}; TIMINGS by default (the overlap
    experiment). Without a reference, each timing's median, fastest and slowest round
    (seconds). With one (a key), each row is read one way only, paired by round: its time over
    the reference's in the same round, the median of those ratios ('time / reference') and
    their smallest and largest ('range over rounds')."""
    names = names or TIMINGS
    if reference is None:
        return {label: {'median': result[key], 'fastest': min(result['times'][key]),
                        'slowest': max(result['times'][key])} for key, label in names.items()}
    rows = {}
    for key, label in names.items():
        ratios = [1 / r for r in round_ratios(result, key, reference)]
        rows[label] = {'time / reference': median(ratios),
                       'range over rounds': f'{min(ratios):.2f}\u2013{max(ratios):.2f}'}
    return rows


def plot_overlap(ov):
    """The overlap experiment as bars: each timing's median, with a line from its fastest to
    its slowest round. 'backward + all-reduce, each alone' stacks the two measured alone;
    three lines mark the references: no overlap without the copies (that sum, dotted), no
    overlap with them (backward, then one all-reduce, dash-dotted), and perfect overlap
    (perfect_overlap_s, dashed). Returns the figure."""
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for i, (key, color) in enumerate(BAR_COLORS.items()):
        ms, median_ms = [1e3 * t for t in ov['times'][key]], 1e3 * ov[key]
        error = [[median_ms - min(ms)], [max(ms) - median_ms]]
        if color is None:   # stacked: backward, then the all-reduce
            ax.barh(i, 1e3 * ov['backward_s'], color=BAR_COLORS['backward_s'])
            ax.barh(i, median_ms - 1e3 * ov['backward_s'], left=1e3 * ov['backward_s'],
                    color=BAR_COLORS['allreduce_alone_s'], xerr=error, capsize=3)
        else:
            ax.barh(i, median_ms, color=color, xerr=error, capsize=3)
    ax.set_yticks(range(len(BAR_COLORS)), [TIMINGS[key] for key in BAR_COLORS])
    ax.axvline(1e3 * ov['sequential_s'], color='k', ls=':',
               label='no overlap, without the copies: backward + all-reduce, each alone')
    ax.axvline(1e3 * ov['after_s'], color='C1', ls='-.',
               label='no overlap, with the copies: backward, then one all-reduce')
    ax.axvline(1e3 * perfect_overlap_s(ov), color='k', ls='--',
               label='perfect overlap: the longer of backward + copies and the all-reduce')
    ax.invert_yaxis()
    ax.set(xlabel='milliseconds per backward pass, gradients averaged')
    ax.legend(loc='lower left', bbox_to_anchor=(0, 1), frameon=False, fontsize=8)
    fig.tight_layout()
    return fig
