"""ZeRO stages 1 and 2 by hand, beside DDP and FSDP, measured on real processes (notebook 08).

ZeRO (Rajbhandari et al., 2020) gives each rank a 1/k shard of every parameter, as each server
owned a shard of the keys in notebook 07, and every worker is the server of its own shard:
ZeRO-1 shards Adam's state (gradients are reduce-scattered, each owner takes the Adam step on
its shard, and the updated shards are all-gathered), ZeRO-2 the gradients too (each
reduce-scattered the moment backward has produced it), ZeRO-3 the parameters as well (here
PyTorch's `fully_shard`, FSDP).

The taught code (`Shard` to `regather_worker`) stands in notebook 08's cells, which `make
export` copies here (#@save zero); spawned worker processes import it. `train_worker` is the
entry point of the main runs. `start_rank` places a rank: on a GPU of its own with nccl, on a
GPU shared through gloo (gloo's collectives take GPU tensors, staging them in host memory; its
send and recv do not, so our ring passes host copies), or on the CPU.
"""
import contextlib
import math
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn import functional as F

import helpers
import launch
from collectives import CollectiveCounter, tcp_bytes_sent
from stats import median

STRATEGIES = ('ddp', 'zero1', 'zero2', 'fsdp')
# for the exercises: FSDP with bf16 parameters in flight, PyTorch's own ZeRO-1, and FSDP
# keeping each layer gathered from forward to backward (ZeRO-2's bytes, in FSDP's code)
EXTRA_STRATEGIES = ('fsdp_bf16', 'torch_zero1', 'fsdp_keep')
LABELS = {'ddp': 'DDP', 'zero1': 'ZeRO-1', 'zero2': 'ZeRO-2', 'fsdp': 'FSDP (ZeRO-3)',
          'fsdp_bf16': 'FSDP, bf16 in flight', 'torch_zero1': 'ZeroRedundancyOptimizer',
          'fsdp_keep': 'FSDP, kept for backward'}
PHASES = ('forward', 'backward', 'step')  # a training step's parts, timed with time_phases
DEFAULTS = {'strategies': STRATEGIES, 'in_features': 100, 'hidden': 512, 'num_hidden': 2,
            'classes': 10, 'batch_per_rank': 32, 'timed_steps': 5, 'lr': 1e-3, 'seed': 0,
            'backend': 'gloo', 'timeout': 60, 'probe_wire': False, 'fail_rank': None,
            'device': None,  # 'cuda': ranks on the GPUs (through gloo where they share one);
                             # 'cpu': CPU processes; None: cuda with nccl, cpu with gloo
            'dtype': 'float32',  # float64: the strategies' equivalence without rounding noise
            'time_phases': False}  # also time forward, backward and step (a sync between)
WARMUP_STEPS = 2  # DDP rebuilds its gradient buckets during its second step


def check_config(config, world_size):
    """The run's settings, completed and validated, before any process starts."""
    cfg = helpers.with_defaults(config, DEFAULTS)
    helpers.check_int('world_size', world_size)
    for s in cfg['strategies']:
        helpers.check_choice('each of strategies', s, STRATEGIES + EXTRA_STRATEGIES)
    if 'ddp' not in cfg['strategies']:
        raise ValueError('strategies must include ddp: every other strategy is checked against it')
    for name in ('in_features', 'hidden', 'classes', 'batch_per_rank', 'timed_steps', 'timeout'):
        helpers.check_int(name, cfg[name])
    helpers.check_int('num_hidden', cfg['num_hidden'], minimum=0)
    helpers.check_positive('lr', cfg['lr'])
    helpers.check_choice('backend', cfg['backend'], ('gloo', 'nccl'))
    helpers.check_choice('dtype', cfg['dtype'], ('float32', 'float64'))
    helpers.check_choice('device', cfg['device'], (None, 'cpu', 'cuda'))
    if cfg['backend'] == 'nccl' and cfg['device'] == 'cpu':
        raise ValueError("device='cpu' needs backend='gloo': nccl moves GPU memory only")
    helpers.check_int('fail_rank', cfg['fail_rank'], minimum=0, allow_none=True)
    helpers.check_choice('time_phases', cfg['time_phases'], (False, True))
    return cfg


# ------------------------------------------------------------------ model and data
def num_parameters(cfg):
    return sum(a * b + b for a, b in _layer_sizes(cfg))


def make_batches(cfg, steps, rank, world_size, device):
    """This rank's share of each step's global batch: the same global data for every strategy."""
    g = torch.Generator().manual_seed(cfg['seed'] + 1)
    b = cfg['batch_per_rank']
    batches = []
    for _ in range(steps):
        X = torch.randn(world_size * b, cfg['in_features'], generator=g)
        y = torch.randint(0, cfg['classes'], (world_size * b,), generator=g)
        mine = slice(rank * b, (rank + 1) * b)
        batches.append((X[mine].to(device, getattr(torch, cfg['dtype'])), y[mine].to(device)))
    return batches


# ------------------------------------------------------------------ ZeRO by hand
# ---- saved from 08_sharded_data_parallelism.ipynb by make export: edit the notebook
class Shard:
    """Rank `rank`'s part of a parameter with `numel` elements, flattened: chunks of
    ceil(numel / k) elements (the last ones shorter or empty when k does not divide numel)."""

    def __init__(self, numel, rank, world_size):
        self.numel, self.world_size = numel, world_size
        self.chunk = math.ceil(numel / world_size)
        self.start = min(rank * self.chunk, numel)
        self.stop = min(self.start + self.chunk, numel)

    def padded(self, flat, chunks=None):
        """`flat` padded with zeros to `chunks` whole chunks (default k), as collectives need."""
        return F.pad(flat, (0, self.chunk * (chunks or self.world_size) - flat.numel()))


def reduce_scatter(output, input):
    """Sum `input` over the ranks; rank r receives chunk r of the sum in `output` (input holds
    k chunks of output's size): nccl's own, or on gloo the first half of notebook 07's ring."""
    k, r = dist.get_world_size(), dist.get_rank()
    if dist.get_backend() != 'gloo':
        native = getattr(dist, 'reduce_scatter_single', None) or dist.reduce_scatter_tensor
        return native(output, input)
    chunks = input.view(k, -1).cpu()  # gloo's send and recv take host memory only
    partial = chunks[(r - 1) % k].clone()
    for step in range(k - 1):
        incoming = torch.empty_like(partial)
        requests = [dist.isend(partial, (r + 1) % k), dist.irecv(incoming, (r - 1) % k)]
        for request in requests:
            request.wait()
        partial = incoming.add_(chunks[(r - 2 - step) % k])
    output.copy_(partial)


def all_gather(output, input):
    """Concatenate every rank's `input` into `output`, in rank order (each rank sends its
    chunk k-1 times)."""
    native = getattr(dist, 'all_gather_single', None) or dist.all_gather_into_tensor
    native(output, input)


class ZeroAdam:
    """Adam with its state sharded over the ranks: ZeRO-1 (stage=1) or ZeRO-2 (stage=2).

    Each rank's optimizer sees only views of its own shard of every parameter, so Adam's two
    moment buffers exist for 1/k of the model. After the step each rank all-gathers the
    updated shards, and every rank again holds the whole model, as in DDP."""

    def __init__(self, model, lr, stage):
        helpers.check_choice('stage', stage, (1, 2))
        self.stage, self.rank, self.k = stage, dist.get_rank(), dist.get_world_size()
        self.params = list(model.parameters())
        self.shards = [Shard(p.numel(), self.rank, self.k) for p in self.params]
        self.owned = [p.detach().view(-1)[s.start:s.stop] for p, s in zip(self.params,
                                                                           self.shards)]
        self.adam = torch.optim.Adam(self.owned, lr=lr)  # updates land in the parameters
        if stage == 2:
            for i, p in enumerate(self.params):
                p.register_post_accumulate_grad_hook(lambda p, i=i: self._push(i))

    def _summed_shard(self, i):
        """Push: reduce-scatter parameter i's gradient; returns this rank's shard of the mean."""
        p, s = self.params[i], self.shards[i]
        out = torch.empty(s.chunk, dtype=p.dtype, device=p.device)
        reduce_scatter(out, s.padded(p.grad.view(-1)))
        return out[:s.stop - s.start].div_(self.k)  # the mean over ranks, as DDP takes

    def _push(self, i):
        # ZeRO-2: called by autograd as soon as parameter i's gradient is complete
        self.owned[i].grad = self._summed_shard(i)
        self.params[i].grad = None  # the full gradient is freed at once

    def step(self):
        if self.stage == 1:  # the full gradients were kept: reduce-scatter them now
            for i, p in enumerate(self.params):
                grad = p.grad.view(-1)[self.shards[i].start:self.shards[i].stop]
                grad.copy_(self._summed_shard(i))  # the shard's mean, kept inside p.grad
                self.owned[i].grad = grad
        self.adam.step()
        for p, s, owned in zip(self.params, self.shards, self.owned):  # pull
            send = s.padded(owned, chunks=1)  # every rank sends one whole chunk
            full = torch.empty(s.chunk * self.k, dtype=p.dtype, device=p.device)
            all_gather(full, send)
            p.detach().view(-1).copy_(full[:s.numel])

    def zero_grad(self):
        for p, owned in zip(self.params, self.owned):
            p.grad = owned.grad = None


def _layer_sizes(cfg):
    widths = [cfg['in_features']] + [cfg['hidden']] * (cfg['num_hidden'] + 1) + [cfg['classes']]
    return list(zip(widths[:-1], widths[1:]))  # (inputs, outputs) of each Linear layer


def make_model(cfg):
    """An MLP: in_features -> hidden (x num_hidden + 1) -> classes, the same on every rank."""
    torch.manual_seed(cfg['seed'])
    layers = [m for a, b in _layer_sizes(cfg) for m in (nn.Linear(a, b), nn.ReLU())]
    return nn.Sequential(*layers[:-1]).to(getattr(torch, cfg['dtype']))


def build(strategy, cfg, device, module=None):
    """(model to call, module holding the parameters, optimizer) for one strategy, of `module`
    (None: this notebook's model, from cfg; chapter 10 passes its own)."""
    if module is None:
        module = make_model(cfg).to(device)
    adam = lambda params: torch.optim.Adam(params, lr=cfg['lr'])
    if strategy in ('ddp', 'torch_zero1'):
        ddp = nn.parallel.DistributedDataParallel(
            module, device_ids=[device.index] if device.type == 'cuda' else None,
            gradient_as_bucket_view=True)  # the gradients live in the all-reduce buckets
        # DDP's own all-reduce of each bucket, issued from Python so that the counter sees it
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        if strategy == 'ddp':
            return ddp, module, adam(module.parameters())
        return ddp, module, ZeroRedundancyOptimizer(module.parameters(), torch.optim.Adam,
                                                    lr=cfg['lr'])
    if strategy in ('zero1', 'zero2'):
        return module, module, ZeroAdam(module, cfg['lr'], stage=int(strategy[-1]))
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))  # all k ranks, in a row
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if strategy == 'fsdp_bf16' else MixedPrecisionPolicy())  # exercise 2
    reshard = strategy != 'fsdp_keep'  # False: keep each layer gathered until its backward
    for layer in module:
        if isinstance(layer, nn.Linear):  # each layer is all-gathered on its own, when needed
            fully_shard(layer, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(module, mesh=mesh, reshard_after_forward=True, mp_policy=policy)
    return module, module, adam(module.parameters())


def train_step(model, optimizer, X, y, device, time_phases=False):
    """One training step. Returns the times it started and ended, and with `time_phases` the
    ends of its forward pass (with zero_grad) and its backward pass between them."""
    def mark():  # the time now, once the device has finished what was queued
        helpers.synchronize(device)
        marks.append(time.perf_counter())

    marks = []
    mark()
    optimizer.zero_grad()
    loss = F.cross_entropy(model(X), y)  # the mean over this rank's examples
    if time_phases:
        mark()
    loss.backward()
    if time_phases:
        mark()
    optimizer.step()
    mark()
    return marks


def held_bytes(params, grads, state):
    """Bytes of memory behind the tensors a rank holds, by kind: each storage counted once
    (views of one buffer, such as DDP's gradient buckets or our shards, share their storage)."""
    seen, held = set(), {}
    for kind, tensors in (('parameters', params), ('gradients', grads),
                          ('optimizer state', state)):
        held[kind] = 0
        for t in tensors:
            if t is None:
                continue
            storage = local(t).untyped_storage()
            if storage.data_ptr() not in seen or storage.nbytes() == 0:
                seen.add(storage.data_ptr())
                held[kind] += storage.nbytes()
    return held


class StrategyRun:
    """One strategy's training on this rank, a step at a time: WARMUP_STEPS warm-up steps,
    timed steps (wall time, phases, the bytes its TCP sockets sent and, on a GPU, the most
    memory a step added), and a last step whose collectives CollectiveCounter counts."""

    def __init__(self, strategy, cfg, device, steps):
        self.strategy, self.cfg, self.device, self.steps = strategy, cfg, device, steps
        self.model, self.module, self.optimizer = build(strategy, cfg, device)
        self.times, self.wire, self.added = [], [], 0
        self.phases, self.counter = {p: [] for p in PHASES}, CollectiveCounter()
        self.on_tcp = dist.get_backend() == 'gloo' and tcp_bytes_sent() is not None

    def step(self, i, X, y):
        cfg, counted = self.cfg, i == self.steps - 1
        if cfg['fail_rank'] == dist.get_rank() and i == 1 and self.strategy == cfg[
                'strategies'][-1]:  # the crash of "Failures end cleanly"
            raise RuntimeError(f'rank {dist.get_rank()}: simulated crash in {self.strategy}')
        before, sent = memory_mark(self.device), tcp_bytes_sent()
        with self.counter if counted else contextlib.nullcontext():
            marks = train_step(self.model, self.optimizer, X, y, self.device,
                               cfg['time_phases'])
        if i >= WARMUP_STEPS:  # the most memory a step added to what was allocated before
            self.added = max(self.added, memory_added(self.device, before))
        if WARMUP_STEPS <= i and not counted:
            self.times.append(marks[-1] - marks[0])
            if self.on_tcp:
                self.wire.append(tcp_bytes_sent() - sent)
            if cfg['time_phases']:  # marks: the start, forward's end, backward's end, the end
                for p, start, end in zip(PHASES, marks, marks[1:]):
                    self.phases[p].append(end - start)

    def results(self, initial, reference=None):
        """This rank's measurements, and its final parameters, flat (`initial`: before
        training; `reference`: DDP's final parameters, None for DDP itself)."""
        params = list(self.module.parameters())
        state, grad_shards = optimizer_tensors(self.optimizer)
        held = held_bytes(params, [p.grad for p in params] + grad_shards, state)
        out = {'held_bytes': held, 'bytes_per_rank': sum(held.values()),
               'local_parameters': sum(local(p).numel() for p in params),
               'seconds_per_step': median(self.times), 'step_times': self.times,
               'phase_times': self.phases, 'counted_bytes_per_step': self.counter.bytes,
               'collectives_per_step': self.counter.calls, 'tcp_bytes_per_step': None,
               'peak_bytes': None}
        if self.wire:  # gloo: what its sockets sent in a timed step, on average
            out['tcp_bytes_per_step'] = sum(self.wire) / len(self.wire)
        if self.device.type == 'cuda':  # what it holds, and the most a step added on top
            out['peak_bytes'] = out['bytes_per_rank'] + self.added
        flat = full_parameters(self.module)  # a copy made to measure, after the peak
        if reference is None:
            reference = flat
        out.update(ranks_apart=spread_over_ranks(flat),
                   moved=max_over_ranks((flat - initial.to(flat.device)).abs().max().item()),
                   max_diff_vs_ddp=max_over_ranks((flat - reference).abs().max().item()))
        return out, flat


def take_turns(runs, batches):
    """Train every StrategyRun in `runs` ({strategy: run}) on the same batches, a step of each
    in turn; the strategy that goes first moves on by one at every step."""
    order = list(runs)
    for i, (X, y) in enumerate(batches):
        for s in order[i % len(order):] + order[:i % len(order)]:
            runs[s].step(i, X, y)


def run_strategy(strategy, cfg, batches, device, initial, reference=None):
    """Train one strategy alone (notebook 09 sets its FSDP x TP beside these). Returns this
    rank's measurements and its final parameters."""
    run = StrategyRun(strategy, cfg, device, len(batches))
    take_turns({strategy: run}, batches)
    return run.results(initial, reference)


def train_worker(rank, world_size, config):
    """One rank: every strategy from the same initial model on the same data, the strategies
    taking turns a step at a time (take_turns), so that whatever else the machine does falls
    on all of them alike. DDP's parameters are the reference. Returns this rank's
    measurements."""
    cfg = check_config(config, world_size)
    rank, world_size, device = start_rank(cfg)
    batches = make_batches(cfg, WARMUP_STEPS + cfg['timed_steps'] + 1, rank, world_size, device)
    order = ('ddp',) + tuple(s for s in cfg['strategies'] if s != 'ddp')
    runs = {s: StrategyRun(s, cfg, device, len(batches)) for s in order}
    take_turns(runs, batches)
    results, reference = {}, None
    initial = full_parameters(make_model(cfg))
    for strategy in order:
        results[strategy], flat = runs.pop(strategy).results(initial, reference)
        if strategy == 'ddp':  # the reference for the others
            reference = flat
        if rank == 0:
            launch.report(strategy=strategy,
                          seconds_per_step=results[strategy]['seconds_per_step'])
    probe = (wire_probe(math.ceil(num_parameters(cfg) / world_size))
             if cfg['probe_wire'] and cfg['backend'] == 'gloo' else None)
    dist.barrier()  # every rank leaves together
    return {'rank': rank, 'world_size': world_size, 'backend': dist.get_backend(),
            'device': str(device), 'parameters': num_parameters(cfg), 'strategies': results,
            'wire_probe': probe}


def regather_worker(rank, world_size, config, repeats=5, block_steps=8):
    """Exercise 1's timing: FSDP as usual ('fsdp') against FSDP keeping each layer gathered
    from forward to backward ('fsdp_keep'), which differ only in the backward pass's
    all-gather. The two take turns in blocks of `block_steps` steps, a warm-up block and then
    `repeats` blocks each, so that whatever else the machine does falls on both alike.
    Returns this rank's seconds per step, one per block, for each."""
    cfg = check_config(config, world_size)
    rank, world_size, device = start_rank(cfg)
    X, y = make_batches(cfg, 1, rank, world_size, device)[0]
    built = {s: build(s, cfg, device) for s in ('fsdp', 'fsdp_keep')}
    times = {s: [] for s in built}
    for block in range(1 + repeats):
        for s, (model, _, optimizer) in built.items():
            helpers.synchronize(device)
            tik = time.perf_counter()
            for _ in range(block_steps):
                optimizer.zero_grad()
                F.cross_entropy(model(X), y).backward()
                optimizer.step()
            helpers.synchronize(device)
            if block:  # the first block warms up
                times[s].append((time.perf_counter() - tik) / block_steps)
    dist.barrier()
    return times
# ---- end of what 08_sharded_data_parallelism.ipynb saves


# ------------------------------------------------------------------------- measuring
def local(t):
    return t.to_local() if hasattr(t, 'to_local') else t  # a DTensor's shard on this rank


def optimizer_tensors(optimizer):
    """The tensors an optimizer keeps (Adam: step, exp_avg, exp_avg_sq), and the gradient
    shards our ZeroAdam keeps."""
    inner = getattr(optimizer, 'adam', None) or getattr(optimizer, 'optim', None) or optimizer
    state = [t for s in inner.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    return state, [o.grad for o in getattr(optimizer, 'owned', [])]


def full_parameters(module):
    """All parameters as one flat tensor on every rank (FSDP's shards are all-gathered)."""
    return torch.cat([(p.full_tensor() if hasattr(p, 'full_tensor') else p).detach().reshape(-1)
                      for p in module.parameters()])


def max_over_ranks(value):
    t = torch.tensor([float(value)], dtype=torch.float64,
                     device='cuda' if dist.get_backend() == 'nccl' else 'cpu')
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def spread_over_ranks(flat):
    """Largest |parameter - rank 0's parameter| over all ranks: 0 when all ranks agree."""
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    return max_over_ranks((flat - reference).abs().max().item())


def memory_mark(device):
    """On a GPU: restart the peak counter and return the bytes allocated now. None on a CPU."""
    if device.type != 'cuda':
        return None
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def memory_added(device, before):
    """On a GPU, the most bytes allocated since memory_mark returned `before`, above it; 0 on
    a CPU, which has no such counter."""
    return 0 if before is None else torch.cuda.max_memory_allocated(device) - before


def wire_probe(numel):
    """Bytes this rank puts on the wire (TCP) for one call of each collective on `numel`
    float32 values; None where TCP cannot be read."""
    k = dist.get_world_size()
    x, shard = torch.ones(numel * k), torch.empty(numel)
    native_rs = getattr(dist, 'reduce_scatter_single', None) or dist.reduce_scatter_tensor
    collectives = {'all-reduce': lambda: dist.all_reduce(x),
                   "gloo's reduce-scatter": lambda: native_rs(shard, x),
                   'ring reduce-scatter (ours)': lambda: reduce_scatter(shard, x),
                   'all-gather': lambda: all_gather(x, shard)}
    if tcp_bytes_sent() is None:
        return None
    sent = {}
    for name, run in collectives.items():
        dist.barrier()
        start = tcp_bytes_sent()
        run()
        dist.barrier()  # the last bytes have left every socket (a barrier adds a few bytes)
        sent[name] = tcp_bytes_sent() - start
    return sent


def start_rank(cfg):
    """Join the process group, and place this rank: on its GPU (launch.init_distributed's, with
    nccl or through gloo) when cfg['device'] says so, or on the CPU. Returns (rank, k, device)."""
    rank, world_size, device = launch.init_distributed(timeout=cfg['timeout'],
                                                        backend=cfg['backend'])
    wanted = cfg['device'] or ('cuda' if cfg['backend'] == 'nccl' else 'cpu')
    if wanted == 'cpu' or device.type != 'cuda':
        return rank, world_size, torch.device('cpu')
    torch.cuda.set_device(device)  # FSDP's device mesh and DDP use the current device
    return rank, world_size, device


# ------------------------------------------------------------- what the notebook reads and draws
def show_progress(rank, metrics):
    """run_workers' on_progress: a line as each strategy finishes on rank 0."""
    print(f'    {LABELS[metrics["strategy"]]}: {metrics["seconds_per_step"] * 1e3:.1f} ms a step '
          f'on rank {rank}')


def over_ranks(rank_results, strategy, key, reduce=max):
    """`key` of `strategy` reduced over the ranks of one run (None where a rank has None)."""
    values = [r['strategies'][strategy][key] for r in rank_results]
    return None if None in values else reduce(values)


def slowest_steps(rank_results, strategy):
    """Each timed step's time on its slowest rank: every rank waits for that one in the
    collectives, so it is the step's time."""
    per_rank = [r['strategies'][strategy]['step_times'] for r in rank_results]
    return [max(step) for step in zip(*per_rank)]


def slowest_phases(rank_results, strategy):
    """{phase: each timed step's time of that phase on the rank that was slowest in that
    step}: a step's phases add up to its time (slowest_steps). None where the phases were not
    timed (time_phases)."""
    per_rank = [r['strategies'][strategy].get('phase_times') for r in rank_results]
    if None in per_rank or not all(all(r.values()) for r in per_rank):
        return None
    steps = [r['strategies'][strategy]['step_times'] for r in rank_results]
    slowest = [max(range(len(steps)), key=lambda r: steps[r][i]) for i in range(len(steps[0]))]
    return {p: [per_rank[r][p][i] for i, r in enumerate(slowest)] for p in per_rank[0]}


def median_step_phases(phases):
    """{phase: seconds} of the median step (the lower middle one for an even count), from
    slowest_phases: its three phases add up to that step's time."""
    totals = [sum(parts) for parts in zip(*phases.values())]
    middle = sorted(range(len(totals)), key=totals.__getitem__)[(len(totals) - 1) // 2]
    return {p: v[middle] for p, v in phases.items()}


def call_counts(calls, names=None):
    """A counted step's collectives as text: {'c10d.allreduce_': 2} -> '2 x allreduce', or
    with `names` ({operator: name}, as collectives.READABLE) '2 x all-reduce'."""
    def name(op):
        return (names or {}).get(op) or op.split('.')[1].strip('_')
    return ', '.join(f'{n} x {name(op)}' for op, n in calls.items()) or '-'


def summarize(runs, strategies=STRATEGIES):
    """What the notebook reads from `runs`, {k: run_workers' list of rank results}: for each
    strategy and k, the fullest rank's bytes (shards can be uneven), the most bytes a rank
    sent, each timed step's time on its slowest rank and their median (and each phase's, where
    timed), rank 0's bytes by kind
    and counted collectives; over every run, the largest difference to DDP and between
    ranks."""
    def per_k(key, reduce=max):
        return {s: {k: over_ranks(rs, s, key, reduce) for k, rs in runs.items()}
                for s in strategies}

    def rank0(key):
        return {s: {k: rs[0]['strategies'][s][key] for k, rs in runs.items()}
                for s in strategies}
    return SimpleNamespace(
        parameters=next(iter(runs.values()))[0]['parameters'],
        bytes_per_rank=per_k('bytes_per_rank'),
        bytes_sent_per_step=per_k('counted_bytes_per_step'),
        wire_bytes_sent_per_step=per_k('tcp_bytes_per_step'),
        seconds_per_step={s: {k: median(slowest_steps(rs, s)) for k, rs in runs.items()}
                          for s in strategies},
        peak_bytes_per_rank=per_k('peak_bytes'),
        step_times={s: {k: slowest_steps(rs, s) for k, rs in runs.items()} for s in strategies},
        phase_times={s: {k: slowest_phases(rs, s) for k, rs in runs.items()} for s in strategies},
        held_bytes_by_kind=rank0('held_bytes'),
        calls=rank0('collectives_per_step'),
        optimizer_state_by_rank={s: {k: [r['strategies'][s]['held_bytes']['optimizer state']
                                         for r in rs] for k, rs in runs.items()}
                                 for s in strategies},
        max_diff_vs_ddp_by_strategy={s: max(over_ranks(rs, s, 'max_diff_vs_ddp')
                                            for rs in runs.values())
                                     for s in strategies if s != 'ddp'},
        ranks_apart=max(over_ranks(rs, s, 'ranks_apart') for s in strategies
                        for rs in runs.values()),
        ranks_apart_by_strategy={s: max(over_ranks(rs, s, 'ranks_apart') for rs in runs.values())
                                 for s in strategies},
        moved_by_training=max(over_ranks(rs, 'ddp', 'moved') for rs in runs.values()),
        wire_probe=runs[max(runs)][0]['wire_probe'])


# Markers shrink from one strategy to the next, so that lines drawn on top of each other (DDP,
# ZeRO-1 and ZeRO-2 send the same bytes) all stay visible.
STYLES = {'ddp': dict(marker='o', markersize=12, markerfacecolor='none', linestyle='-'),
          'zero1': dict(marker='s', markersize=8, markerfacecolor='none', linestyle='--'),
          'zero2': dict(marker='^', markersize=5, linestyle=':'),
          'fsdp': dict(marker='D', markersize=5, linestyle='-')}


def plot_memory_time_traffic(ks, m, paper_held, where):
    """Three panels over the process counts `ks`, a line per strategy, from summarize()'s `m`:
    MiB held per rank (dotted: the paper's count, `paper_held`, {strategy: {k: bytes}}), ms per
    step on the slowest rank, and MiB sent per rank and step; `where` the ranks ran, in the
    title. Returns the figure."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    panels = ((m.bytes_per_rank, 2**-20, 'MiB held per rank'),
              (m.seconds_per_step, 1e3, 'ms per step (slowest rank)'),
              (m.bytes_sent_per_step, 2**-20, 'MiB sent per rank and step'))
    for ax, (values, scale, label) in zip(axes, panels):
        for s in STRATEGIES:
            ax.plot(ks, [values[s][k] * scale for k in ks], label=LABELS[s], **STYLES[s])
        ax.set(xlabel='processes k', ylabel=label)
        ax.set_xscale('log', base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    for s in STRATEGIES:
        axes[0].plot(ks, [paper_held[s][k] * 2**-20 for k in ks], 'k:', lw=1,
                     label="paper's count" if s == 'ddp' else None)
    axes[2].text(0.03, 0.97, 'DDP, ZeRO-1 and ZeRO-2 send the same\nbytes: their lines '
                 'coincide', transform=axes[2].transAxes, va='top', fontsize=8)
    fig.legend(*axes[0].get_legend_handles_labels(), loc='upper center', ncol=5, fontsize=8,
               frameon=False, bbox_to_anchor=(0.5, 0.93))
    fig.suptitle(f'{m.parameters / 1e6:.2f} M parameters, Adam, {where}')
    fig.tight_layout(rect=(0, 0, 1, 0.88))
    return fig
