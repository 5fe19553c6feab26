"""Tensor parallelism, alone and with FSDP on a 2-D mesh, on real processes (notebook 09).

* Megatron-style (Shoeybi et al., 2019): an MLP's first linear layer split by columns and its
  second by rows, so that one all-reduce per pass joins the halves. `ShardedMLP` does it by
  hand with the operators f and g; `parallelize_mlp` does it with DTensor. `tp_worker` runs both
  against the single-process MLP.
* FSDP x TP on a 2-D `DeviceMesh`: `mesh_worker` trains notebook 08's MLP with tensor
  parallelism on one dimension and FSDP on the other, beside 08's DDP and FSDP.

The taught code (f and g, ShardedMLP, parallelize_mlp, the checks one_pass and tp_check,
tp_plan, fsdp_x_tp, run_mesh's timed loop, sgd_equivalence, NormMLP, sequence_parallelize)
stands in the notebook's cells, and `make export` copies it here, between the marker lines;
spawned workers import this module. The rest is written by hand.
"""
import logging
import time
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
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
import zero
from collectives import CollectiveCounter
from meters import (
    SavedActivations,
    WireMeter,
    full,
    join,
    local,
    max_over_ranks,
    relative_diff,
)
from stats import median

DTYPES = ('float32', 'float64')  # float64: the same computation, without float32's rounding


@dataclass(frozen=True)
class TPConfig:
    """What tp_worker runs: an MLP of d_model -> hidden -> d_model on tp_batch sequences of
    tp_seq tokens, on `device` ('cpu' or 'cuda'), its ranks talking through `backend`."""
    hidden: int = 256
    d_model: int = 64
    tp_batch: int = 4
    tp_seq: int = 32
    seed: int = 0
    device: str = 'cpu'
    backend: str = 'gloo'
    collective_timeout: int = 60
    sequence_parallel: bool = False  # exercise 1: LayerNorm + MLP, with and without SP


@dataclass(frozen=True)
class MeshConfig:
    """What mesh_worker runs: notebook 08's MLP (`hidden` wide) on a (dp, tp) mesh, with 08's
    Adam settings, and SGD at sgd_lr for the equivalence check."""
    mesh_shape: tuple = (2, 2)
    hidden: int = 256
    batch_per_rank: int = zero.DEFAULTS['batch_per_rank']  # 08's, so 09's numbers stand beside
    timed_steps: int = 2
    lr: float = zero.DEFAULTS['lr']
    sgd_lr: float = 0.1
    seed: int = 0
    device: str = 'cpu'
    backend: str = 'gloo'
    collective_timeout: int = 60


# ---- saved from 09_tensor_and_pipeline_parallelism.ipynb by make export: edit the notebook
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
    """This rank's part of `mlp` split over t ranks: hidden units [r n, (r+1) n), n = hidden / t,
    of A (rows of `up.weight`) and of B (columns of `down.weight`)."""

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


def one_pass(model, X, params, sequence_shard=None):
    """Forward and backward of sum(model(X)), with the collectives, the wire and the activations
    counted. sequence_shard: (rank, t) when the model takes 1/t of the sequence (and returns it).
    Returns the output, the gradient of the part of the input this rank fed, and the counts."""
    x = X.detach().clone().requires_grad_()  # the input's gradient: f's all-reduce runs
    inputs = sequence_part(x, sequence_shard)
    counter, meter = CollectiveCounter(), SavedActivations(params)
    dist.barrier()
    with WireMeter() as wire:
        with counter:
            with meter:
                y = model(inputs)
            held = meter.live  # the activations kept for the backward pass
            local(y).sum().backward()
        dist.barrier()
    weights = sum(local(p).numel() * local(p).element_size() for p in params)
    return full(y).detach(), sequence_part(x.grad, sequence_shard), {
        'counted_bytes': counter.bytes, 'collectives': counter.calls, 'wire_bytes': wire.bytes,
        'weight_bytes': weights, 'activation_bytes': held}


def tp_check(cfg, device, dtype, rank, t):
    """The MLP on one process, split by hand (f and g), and split by parallelize_module: the
    same input, forward and backward. Returns the largest differences from the single-process
    model (forward, gradients) and what each pass counted."""
    torch.manual_seed(cfg.seed)
    dt = getattr(torch, dtype)
    single = MLP(cfg.d_model, cfg.hidden).to(device, dt)
    X = make_tokens(cfg, device, dt)
    y0, dx0, measured = one_pass(single, X, list(single.parameters()))
    grads0 = {n: p.grad for n, p in single.named_parameters()}
    out = {'single': measured}

    by_hand = ShardedMLP(single, rank, t)
    y, dx, out['by_hand'] = one_pass(by_hand, X, list(by_hand.parameters()))
    n = cfg.hidden // t
    mine = slice(rank * n, (rank + 1) * n)  # this rank's slice of the single model's gradients
    expected = {'up_weight': grads0['up.weight'][mine], 'up_bias': grads0['up.bias'][mine],
                'down_weight': grads0['down.weight'][:, mine], 'down_bias': grads0['down.bias']}
    out['by_hand'].update(diffs_over_ranks(y, y0, dx, dx0, [
        (p.grad, expected[name]) for name, p in by_hand.named_parameters()]))

    mesh = init_device_mesh(device.type, (t,))
    library = parallelize_mlp(copy_of(single, cfg, dt, device), mesh)
    y, dx, out['library'] = one_pass(library, X, list(library.parameters()))
    out['library'].update(diffs_over_ranks(y, y0, dx, dx0, [
        (full(p.grad), grads0[name]) for name, p in library.named_parameters()]))
    return out


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


def timed_step(module, optimizer, X, y, device):
    """One Adam step; its seconds, once the device has finished it."""
    helpers.synchronize(device)
    tik = time.perf_counter()
    optimizer.zero_grad()
    nn.CrossEntropyLoss()(module(X), y).backward()
    optimizer.step()
    helpers.synchronize(device)
    return time.perf_counter() - tik


def run_mesh(cfg, zero_cfg, device, reference):
    """Notebook 08's measurement (zero.run_strategy) for FSDP x TP: warm-up steps, timed steps,
    then a step whose collectives are counted. Bytes held per rank, sent per step, the timed
    steps' seconds, and the distance from DDP's parameters (`reference`)."""
    mesh = make_mesh(device, cfg.mesh_shape)
    module = fsdp_x_tp(zero.make_model(zero_cfg).to(device), mesh)
    optimizer = torch.optim.Adam(module.parameters(), lr=cfg.lr)
    batches = group_batches(cfg, zero_cfg, zero.WARMUP_STEPS + cfg.timed_steps + 1, mesh, device)
    for X, y in batches[:zero.WARMUP_STEPS]:
        timed_step(module, optimizer, X, y, device)
    with WireMeter() as wire:
        times = [timed_step(module, optimizer, X, y, device)
                 for X, y in batches[zero.WARMUP_STEPS:-1]]
    with CollectiveCounter() as counter:
        timed_step(module, optimizer, *batches[-1], device)
    params = list(module.parameters())
    held = zero.held_bytes(params, [p.grad for p in params], zero.optimizer_tensors(optimizer)[0])
    apart = (zero.full_parameters(module) - reference).abs().max().item()
    return {'held_bytes': held, 'bytes_per_rank': max_over_ranks(sum(held.values())),
            'local_parameters': sum(local(p).numel() for p in params),
            'seconds_per_step': max_over_ranks(median(times)), 'step_times': times,
            'counted_bytes_per_step': counter.bytes, 'collectives_per_step': counter.calls,
            'tcp_bytes_per_step': wire.per(len(times)), 'max_diff_vs_ddp': max_over_ranks(apart)}


def sgd_equivalence(cfg, zero_cfg, device, dtype, steps=2):
    """`steps` SGD steps of FSDP x TP against the single-process model on the global batch:
    the largest parameter difference, relative to the largest parameter, and how far the
    steps moved the parameters, in the same unit."""
    zero_cfg = {**zero_cfg, 'dtype': dtype}
    mesh = make_mesh(device, cfg.mesh_shape)
    single, module = smooth(zero.make_model(zero_cfg)).to(device), smooth(zero.make_model(zero_cfg))
    module = fsdp_x_tp(module.to(device), mesh)
    k = cfg.mesh_shape[0] * cfg.mesh_shape[1]
    everything = zero.make_batches({**zero_cfg, 'batch_per_rank': cfg.batch_per_rank * k},
                                   steps, 0, 1, device)  # the global batch, on one process
    for model, batches in ((single, everything),
                           (module, group_batches(cfg, zero_cfg, steps, mesh, device))):
        sgd = torch.optim.SGD(model.parameters(), lr=cfg.sgd_lr)
        for X, y in batches:
            sgd.zero_grad()
            nn.CrossEntropyLoss()(model(X), y).backward()
            sgd.step()
    trained = zero.full_parameters(single)
    initial = zero.full_parameters(zero.make_model(zero_cfg)).to(device)
    return {'max_diff': max_over_ranks(relative_diff(zero.full_parameters(module), trained)),
            'moved': relative_diff(trained, initial)}


class NormMLP(nn.Module):
    """LayerNorm, then the MLP: the region sequence parallelism splits."""

    def __init__(self, d_model, hidden):
        super().__init__()
        self.norm, self.mlp = nn.LayerNorm(d_model), MLP(d_model, hidden)

    def forward(self, x):
        return self.mlp(self.norm(x))


def sequence_parallelize(block, mesh, sequence_parallel):
    """Tensor parallelism on the MLP of a NormMLP; with sequence_parallel, the LayerNorm also
    works on 1/t of the sequence, and the all-reduces become all-gathers and reduce-scatters
    (Korthikanti et al., 2022)."""
    if not sequence_parallel:
        return parallelize_module(block, mesh, {'mlp.up': ColwiseParallel(),
                                                'mlp.down': RowwiseParallel()})
    return parallelize_module(block, mesh, {
        'norm': SequenceParallel(),  # its input and output: Shard(1), split along the sequence
        'mlp.up': ColwiseParallel(input_layouts=Shard(1)),  # all-gathers the sequence: f
        'mlp.down': RowwiseParallel(output_layouts=Shard(1), use_local_output=False)})  # g
# ---- end of what 09_tensor_and_pipeline_parallelism.ipynb saves


# ------------------------------------------------------------ the tensor-parallel checks
def sequence_part(x, sequence_shard):
    """This rank's 1/t of x along the sequence, for sequence_shard = (rank, t); None: all of x."""
    return x if sequence_shard is None else x.tensor_split(sequence_shard[1], 1)[sequence_shard[0]]


def make_tokens(cfg, device, dtype):
    g_cpu = torch.Generator().manual_seed(cfg.seed + 1)
    return torch.randn(cfg.tp_batch, cfg.tp_seq, cfg.d_model, generator=g_cpu).to(device, dtype)


def copy_of(module, cfg, dtype, device):
    clone = type(module)(cfg.d_model, cfg.hidden).to(device, dtype)
    clone.load_state_dict(module.state_dict())
    return clone


def diffs_over_ranks(y, y0, dx, dx0, grads):
    """The largest relative differences over the ranks: of the outputs, and of every gradient
    (the parameters' and the input's)."""
    grad = max([relative_diff(a, b) for a, b in grads] + [relative_diff(dx, dx0)])
    return {'forward_diff': max_over_ranks(relative_diff(y, y0)),
            'gradient_diff': max_over_ranks(grad)}


def sp_check(cfg, device, rank, t):
    """LayerNorm + MLP, split by tensor parallelism alone and with sequence parallelism:
    differences from the single-process block, collectives, and activations per rank."""
    torch.manual_seed(cfg.seed)
    single = NormMLP(cfg.d_model, cfg.hidden).to(device)
    X = make_tokens(cfg, device, torch.float32)
    out = {}
    y0, dx0, out['single'] = one_pass(single, X, list(single.parameters()))
    grads0 = {n: p.grad for n, p in single.named_parameters()}
    mesh = init_device_mesh(device.type, (t,))
    for name, sp in (('tensor parallel', False), ('sequence parallel', True)):
        block = NormMLP(cfg.d_model, cfg.hidden).to(device)
        block.load_state_dict(single.state_dict())
        block = sequence_parallelize(block, mesh, sp)
        shard = (rank, t) if sp else None
        y, dx, out[name] = one_pass(block, X, list(block.parameters()), shard)
        out[name].update(diffs_over_ranks(y, y0, dx, sequence_part(dx0, shard), [
            (full(p.grad), grads0[n]) for n, p in block.named_parameters()]))
    return out


def tp_worker(rank, world_size, cfg):
    """One of t ranks: the tensor-parallel checks in float32 and float64 (with
    cfg.sequence_parallel, the sequence-parallel exercise instead, in float32)."""
    rank, t, device = join(cfg)
    if cfg.sequence_parallel:
        return sp_check(cfg, device, rank, t)
    return {dtype: tp_check(cfg, device, dtype, rank, t) for dtype in DTYPES}


# ------------------------------------------------------------------ FSDP x TP, 2-D mesh
def make_mesh(device, shape):
    return init_device_mesh(device.type, tuple(shape), mesh_dim_names=('dp', 'tp'))


def group_batches(cfg, zero_cfg, steps, mesh, device):
    """The examples of this rank's data-parallel group: the DDP shares of its tp ranks, joined,
    so that the global batch is the one DDP trains on."""
    dp, tp = cfg.mesh_shape
    d = mesh.get_coordinate()[0]
    shares = [zero.make_batches(zero_cfg, steps, r, dp * tp, device)
              for r in range(d * tp, (d + 1) * tp)]
    return [(torch.cat([s[i][0] for s in shares]), torch.cat([s[i][1] for s in shares]))
            for i in range(steps)]


def smooth(model):
    """08's MLP with GELU in place of ReLU (see pipeline_parallel.make_stack): the same layers
    and parameters."""
    for i, layer in enumerate(model):
        if isinstance(layer, nn.ReLU):
            model[i] = nn.GELU()
    return model


def mesh_worker(rank, world_size, cfg):
    """One of dp x tp ranks: 08's DDP and FSDP over all of them, then FSDP x TP on the 2-D mesh
    (Adam, measured as 08 measures), then its SGD equivalence in float32 and float64."""
    zero_cfg = zero.check_config({'hidden': cfg.hidden, 'batch_per_rank': cfg.batch_per_rank,
                                  'timed_steps': cfg.timed_steps, 'lr': cfg.lr,
                                  'seed': cfg.seed, 'backend': cfg.backend,
                                  'timeout': cfg.collective_timeout}, world_size)  # 08's keys
    rank, k, device = join(cfg)
    batches = zero.make_batches(zero_cfg, zero.WARMUP_STEPS + cfg.timed_steps + 1, rank, k,
                                device)
    initial = zero.full_parameters(zero.make_model(zero_cfg))
    layouts = {}
    layouts['ddp'], reference = zero.run_strategy('ddp', zero_cfg, batches, device, initial)
    layouts['fsdp'], _ = zero.run_strategy('fsdp', zero_cfg, batches, device, initial, reference)
    layouts['fsdp_tp'] = run_mesh(cfg, zero_cfg, device, reference)
    equivalence = {dtype: sgd_equivalence(cfg, zero_cfg, device, dtype) for dtype in DTYPES}
    dist.barrier()
    return {'layouts': layouts, 'equivalence': equivalence,
            'parameters': zero.num_parameters(zero_cfg)}
