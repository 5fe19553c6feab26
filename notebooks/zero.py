"""ZeRO stages 1 and 2 by hand, beside DDP and FSDP, measured on real processes (notebook 08).

ZeRO (Rajbhandari et al., 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models") removes the copies data parallelism keeps on every rank. Each rank owns a 1/k shard
of every parameter, as each server owned a shard of the keys in notebook 07, except that every
worker is now also the server of its own shard:

* ZeRO-1: the Adam state lives only with the shard's owner. Gradients are reduce-scattered
  (the push: each owner receives the sum of its shard), the owner takes the Adam step, and the
  updated shards are all-gathered (the pull). Every rank still holds all gradients.
* ZeRO-2: as ZeRO-1, but each parameter's gradient is reduce-scattered the moment backward has
  produced it, and the full gradient is freed: a rank holds only its shard of the gradients.
* ZeRO-3 (FSDP): the parameters are sharded too and all-gathered layer by layer when needed;
  here that is PyTorch's own `fully_shard`.

`train_worker` is the process entry point for launch.run_workers; it lives here because
spawned processes must import it.
"""
import contextlib
import gc
import math
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

import helpers
import launch
from collectives import CollectiveCounter, tcp_bytes_sent

STRATEGIES = ('ddp', 'zero1', 'zero2', 'fsdp')
# for the exercises: FSDP with bf16 parameters in flight, and PyTorch's own ZeRO-1
EXTRA_STRATEGIES = ('fsdp_bf16', 'torch_zero1')
DEFAULTS = {'strategies': STRATEGIES, 'in_features': 100, 'hidden': 512, 'num_hidden': 2,
            'classes': 10, 'batch_per_rank': 32, 'timed_steps': 5, 'lr': 1e-3, 'seed': 0,
            'backend': 'gloo', 'timeout': 60, 'probe_wire': False, 'fail_rank': None,
            'dtype': 'float32'}  # float64: the strategies' equivalence without rounding noise
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
    helpers.check_int('fail_rank', cfg['fail_rank'], minimum=0, allow_none=True)
    return cfg


# ------------------------------------------------------------------ model and data
def _layer_sizes(cfg):
    widths = [cfg['in_features']] + [cfg['hidden']] * (cfg['num_hidden'] + 1) + [cfg['classes']]
    return list(zip(widths[:-1], widths[1:]))


def make_model(cfg):
    """An MLP: in_features -> hidden (x num_hidden + 1) -> classes, the same on every rank."""
    torch.manual_seed(cfg['seed'])
    layers = []
    for a, b in _layer_sizes(cfg):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1]).to(getattr(torch, cfg['dtype']))


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


# ------------------------------------------------------------------------ collectives
def reduce_scatter(output, input):
    """Sum `input` over the ranks; rank r receives chunk r of the sum in `output` (input holds
    k chunks of output's size). nccl has a bandwidth-optimal reduce-scatter. gloo has one too,
    but it sends as many bytes as an all-reduce (the notebook measures that), so on gloo we
    build it from send/recv: the first half of notebook 07's ring. In k-1 steps each rank sends
    one partly summed chunk to its right and adds the chunk arriving from its left."""
    k, r = dist.get_world_size(), dist.get_rank()
    if dist.get_backend() != 'gloo':
        native = getattr(dist, 'reduce_scatter_single', None) or dist.reduce_scatter_tensor
        return native(output, input)
    chunks = input.view(k, -1)
    partial = chunks[(r - 1) % k].clone()
    for step in range(k - 1):
        incoming = torch.empty_like(partial)
        requests = [dist.isend(partial, (r + 1) % k), dist.irecv(incoming, (r - 1) % k)]
        for request in requests:
            request.wait()
        partial = incoming.add_(chunks[(r - 2 - step) % k])
    output.copy_(partial)


def all_gather(output, input):
    """Concatenate every rank's `input` into `output`, in rank order (gloo and nccl both have a
    bandwidth-optimal one: each rank sends its chunk k-1 times)."""
    native = getattr(dist, 'all_gather_single', None) or dist.all_gather_into_tensor
    native(output, input)


# ------------------------------------------------------------------------- ZeRO by hand
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


# ------------------------------------------------------------------------- measuring
def _local(t):
    return t.to_local() if hasattr(t, 'to_local') else t  # a DTensor's shard on this rank


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
            storage = _local(t).untyped_storage()
            if storage.data_ptr() not in seen or storage.nbytes() == 0:
                seen.add(storage.data_ptr())
                held[kind] += storage.nbytes()
    return held


def _fsdp_api():
    """fully_shard and MixedPrecisionPolicy: public since torch 2.6, before that (2.4, 2.5)
    under torch.distributed._composable.fsdp."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
    return fully_shard, MixedPrecisionPolicy


def build(strategy, cfg, device):
    """(model to call, module holding the parameters, optimizer) for one strategy."""
    module = make_model(cfg).to(device)
    adam = lambda params: torch.optim.Adam(params, lr=cfg['lr'])
    if strategy in ('ddp', 'torch_zero1'):
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp = nn.parallel.DistributedDataParallel(
            module, device_ids=[device.index] if device.type == 'cuda' else None,
            gradient_as_bucket_view=True)  # the gradients live in the all-reduce buckets
        # the all-reduce DDP makes by default, issued from Python so that it is counted
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        if strategy == 'ddp':
            return ddp, module, adam(module.parameters())
        from torch.distributed.optim import ZeroRedundancyOptimizer
        return ddp, module, ZeroRedundancyOptimizer(module.parameters(), torch.optim.Adam,
                                                    lr=cfg['lr'])
    if strategy in ('zero1', 'zero2'):
        return module, module, ZeroAdam(module, cfg['lr'], stage=int(strategy[-1]))
    from torch.distributed.device_mesh import init_device_mesh
    fully_shard, MixedPrecisionPolicy = _fsdp_api()
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if strategy == 'fsdp_bf16' else MixedPrecisionPolicy())
    for layer in module:
        if isinstance(layer, nn.Linear):  # each layer is all-gathered on its own, when needed
            fully_shard(layer, mesh=mesh, reshard_after_forward=True, mp_policy=policy)
    fully_shard(module, mesh=mesh, reshard_after_forward=True, mp_policy=policy)
    return module, module, adam(module.parameters())


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


def _max_over_ranks(value):
    t = torch.tensor([float(value)], dtype=torch.float64,
                     device='cuda' if dist.get_backend() == 'nccl' else 'cpu')
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def _spread_over_ranks(flat):
    """Largest |parameter - rank 0's parameter| over all ranks: 0 when all ranks agree."""
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    return _max_over_ranks((flat - reference).abs().max().item())


def run_strategy(strategy, cfg, batches, device, initial, reference=None):
    """Train `strategy` on `batches`: WARMUP_STEPS, then timed steps (wall time and TCP bytes),
    then one step whose collectives CollectiveCounter counts. Returns this rank's measurements
    and the final parameters (`initial`: the parameters before training, flat)."""
    rank = dist.get_rank()
    if device.type == 'cuda':
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)  # this run's data, DDP's reference
    model, module, optimizer = build(strategy, cfg, device)
    loss_fn = nn.CrossEntropyLoss()  # the mean over this rank's examples; ranks average grads
    times, counter, tcp = [], None, {}
    on_tcp = dist.get_backend() == 'gloo'  # nccl moves data over NVLink or shared memory
    for step, (X, y) in enumerate(batches):
        if step == WARMUP_STEPS:
            tcp['start'] = tcp_bytes_sent() if on_tcp else None
        if step == len(batches) - 1:  # the last step is counted, not timed
            tcp['end'] = tcp_bytes_sent() if on_tcp else None
            counter = CollectiveCounter()
        if cfg['fail_rank'] == rank and strategy == cfg['strategies'][-1] and step == 1:
            raise RuntimeError(f'rank {rank}: simulated crash in {strategy} at step {step}')
        helpers.synchronize(device)
        tik = time.perf_counter()
        with counter if counter is not None else contextlib.nullcontext():
            optimizer.zero_grad()
            loss_fn(model(X), y).backward()
            optimizer.step()
        helpers.synchronize(device)
        if WARMUP_STEPS <= step < len(batches) - 1:
            times.append(time.perf_counter() - tik)
    params = list(module.parameters())
    state, grad_shards = optimizer_tensors(optimizer)
    held = held_bytes(params, [p.grad for p in params] + grad_shards, state)
    flat = full_parameters(module)
    wire = (None if None in (tcp['start'], tcp['end'])
            else (tcp['end'] - tcp['start']) / len(times))
    return {
        'held_bytes': held,
        'bytes_per_rank': sum(held.values()),
        'local_parameters': sum(_local(p).numel() for p in params),
        'seconds_per_step': sorted(times)[len(times) // 2],  # the median
        'counted_bytes_per_step': counter.bytes,
        'collectives_per_step': counter.calls,
        'tcp_bytes_per_step': wire,
        'peak_bytes': (torch.cuda.max_memory_allocated(device) - baseline
                       if device.type == 'cuda' else None),
        'ranks_apart': _spread_over_ranks(flat),
        'moved': _max_over_ranks((flat - initial.to(flat.device)).abs().max().item()),
        'max_diff_vs_ddp': _max_over_ranks(0.0 if reference is None else
                                           (flat - reference).abs().max().item()),
    }, flat


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


def train_worker(rank, world_size, config):
    """One rank: train every strategy in turn on the same data, from the same initial model,
    and measure each (DDP first: it is the reference). Returns this rank's measurements."""
    cfg = check_config(config, world_size)
    rank, world_size, device = launch.init_distributed(timeout=cfg['timeout'],
                                                        backend=cfg['backend'])
    if cfg['backend'] == 'gloo':
        device = torch.device('cpu')  # gloo runs on CPU processes, also on a GPU machine
    batches = make_batches(cfg, WARMUP_STEPS + cfg['timed_steps'] + 1, rank, world_size, device)
    results, reference = {}, None
    initial = full_parameters(make_model(cfg))
    for strategy in ('ddp',) + tuple(s for s in cfg['strategies'] if s != 'ddp'):
        results[strategy], flat = run_strategy(strategy, cfg, batches, device, initial,
                                               reference)
        reference = flat if strategy == 'ddp' else reference
        if rank == 0:
            launch.report(strategy=strategy,
                           seconds_per_step=results[strategy]['seconds_per_step'])
    probe = (wire_probe(math.ceil(num_parameters(cfg) / world_size))
             if cfg['probe_wire'] and cfg['backend'] == 'gloo' else None)
    dist.barrier()  # every rank leaves together
    return {'rank': rank, 'world_size': world_size, 'backend': dist.get_backend(),
            'device': str(device), 'parameters': num_parameters(cfg), 'strategies': results,
            'wire_probe': probe}
