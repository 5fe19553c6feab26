"""Train the chapter's ResNet-18 with DistributedDataParallel, one process per device.

Standalone, with torchrun (one process per GPU; CPU processes with gloo when there is no GPU):

    torchrun --nproc_per_node=2 notebooks/ddp_train.py --epochs 1 --num-train 512 --batch-size 64

Rank 0 prints each epoch's progress as one JSON line ({"progress": {...}}) and, at the end, its
result as indented JSON. From Python, as notebook 06 does:
launch.run_workers(ddp_train.train, 2, ddp_train.Config(num_epochs=1), on_progress=callback),
where rank 0's launch.report(...) reaches callback(rank, metrics) while training runs.
`data_loaders`, `train_epoch`, `train`, `max_over_ranks`, `rank_result`,
`buffers_at_forward` and `plain_against_ddp` are written
from notebook 06's `#@save ddp_train` cells (make export): spawned processes import them from
here. The rest is plumbing: settings, data, summaries.
"""
import argparse
import contextlib
import copy
import dataclasses
import hashlib
import io
import itertools
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import helpers
import launch


@dataclasses.dataclass(frozen=True)
class Config:
    """One DDP run's settings: notebook 06's plan builds it, torchrun's flags fill it."""
    batch_size: int = 256           # global: split evenly over the processes
    lr: float = 0.1
    num_epochs: int = 1
    num_train: int = None           # None: every example of the data source
    num_test: int = None
    width: int = 64                 # channels of ResNet-18's first stage (the book's: 64)
    data_source: str = 'auto'       # 'real', 'synthetic' or 'auto'
    data: dict = None               # {'train': (X, y), 'test': (X, y)}: see arrays()
    seed: int = 0                   # of the initial weights and of the data order
    timeout: int = 60               # seconds a collective waits before it gives up
    fail_rank: int = None           # this rank raises at its second step (a crash drill)


def arrays(train_set, test_set):
    """The `data` setting: a caller's loaded TensorDatasets as NumPy arrays, which reach the
    workers as plain copies (no shared memory), so that every process trains on exactly these
    examples without loading them again."""
    return {name: tuple(t.numpy() for t in ds.tensors)
            for name, ds in (('train', train_set), ('test', test_set))}


def check_config(config, world_size):
    """A run's settings (a Config, or a dict of its fields), checked before any process
    starts: a ValueError names a bad one. Returns the Config."""
    if isinstance(config, dict):
        defaults = {f.name: f.default for f in dataclasses.fields(Config)}
        config = Config(**helpers.with_defaults(config, defaults))
    helpers.check_int('world_size', world_size)
    for name in ('batch_size', 'num_epochs', 'width', 'timeout'):
        helpers.check_int(name, getattr(config, name))
    helpers.check_int('seed', config.seed, minimum=0)
    helpers.check_positive('lr', config.lr)
    for name in ('num_train', 'num_test'):
        helpers.check_int(name, getattr(config, name), allow_none=True)
    if config.batch_size % world_size:
        raise ValueError(f'batch_size={config.batch_size} does not split evenly over '
                         f'{world_size} processes: use a multiple of {world_size}')
    if config.data is not None and (not isinstance(config.data, dict)
                                    or set(config.data) != {'train', 'test'}):
        raise ValueError("data must be {'train': (X, y), 'test': (X, y)} of NumPy arrays "
                         '(see arrays()), or None to load by data_source')
    num_train = len(config.data['train'][0]) if config.data is not None else config.num_train
    if num_train is not None and num_train < config.batch_size:
        raise ValueError(f'num_train={num_train} is smaller than one batch '
                         f'({config.batch_size})')
    helpers.check_choice('data_source', config.data_source, ('real', 'synthetic', 'auto'))
    return config


def float_buffers(module):
    """Every floating-point buffer (BatchNorm's running mean and variance), as one vector."""
    return torch.cat([b.detach().flatten() for b in module.buffers() if b.is_floating_point()])


# ---- saved from 06_multi_gpu_concise.ipynb by make export: edit the notebook
def data_loaders(cfg, rank, world_size):
    """(training loader of this rank's share, its sampler, test loader, the data notice)."""
    with contextlib.redirect_stdout(io.StringIO()) as notice:  # said once, by the caller
        if cfg.data is not None:
            train_set, test_set = (TensorDataset(*map(torch.from_numpy, cfg.data[name]))
                                   for name in ('train', 'test'))
        else:
            train_set, test_set = helpers.fashion_mnist_datasets(
                cfg.data_source, num_train=cfg.num_train, num_test=cfg.num_test)
    sampler = DistributedSampler(train_set, world_size, rank, shuffle=True, seed=cfg.seed,
                                 drop_last=True)  # each rank sees its own 1/world_size share
    loader = DataLoader(train_set, cfg.batch_size // world_size, sampler=sampler,
                        drop_last=True)
    return loader, sampler, DataLoader(test_set, 256), notice.getvalue().strip()


def train_epoch(model, loader, optimizer, device, crash_at=None):
    """One epoch of SGD on this rank's share of every batch; DDP averages the gradients over
    the ranks during backward. Returns this rank's (loss sum, correct, examples), left on the
    device (no wait for it). Raises at step `crash_at`: a crash drill."""
    loss = nn.CrossEntropyLoss()  # mean per rank; DDP averages over ranks: the global mean
    totals = torch.zeros(3, device=device)
    model.train()
    for step, (X, y) in enumerate(loader):
        if step == crash_at:
            raise RuntimeError(f'rank {dist.get_rank()}: simulated crash at step {step}')
        X, y = X.to(device), y.to(device)
        optimizer.zero_grad()
        y_hat = model(X)
        batch_loss = loss(y_hat, y)
        batch_loss.backward()  # DDP's hooks all-reduce the gradients, bucket by bucket
        optimizer.step()
        totals[0] += batch_loss.detach() * len(y)
        totals[1] += (y_hat.argmax(1) == y).sum()
        totals[2] += len(y)
    return totals


def train(rank, world_size, config):
    """One rank of a DDP run (launch.run_workers or torchrun starts one per process). Rank 0
    reports each epoch's training loss and accuracy (over all ranks) and its test accuracy
    with launch.report. Returns the rank's result (ddp_train.rank_result)."""
    cfg = check_config(config, world_size)
    rank, world_size, device = launch.init_distributed(timeout=cfg.timeout)
    torch.manual_seed(cfg.seed)  # every rank builds the same model
    net = helpers.resnet18(10, width=cfg.width).to(device)
    # DDP broadcasts rank 0's parameters and buffers now and all-reduces gradients later.
    model = DistributedDataParallel(net, device_ids=[device.index] if device.type == 'cuda'
                                    else None)
    at_forward = buffers_at_forward(net)  # as DDP's broadcast left them: checked below
    loader, sampler, test_loader, notice = data_loaders(cfg, rank, world_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    epoch_times, history = [], []
    for epoch in range(cfg.num_epochs):
        sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
        crash_at = 1 if cfg.fail_rank == rank and epoch == 0 else None
        helpers.synchronize(device)
        tik = time.perf_counter()
        totals = train_epoch(model, loader, optimizer, device, crash_at)
        helpers.synchronize(device)
        epoch_times.append(time.perf_counter() - tik)
        dist.all_reduce(totals)  # the epoch's loss and accuracy over every rank's examples
        if rank == 0:
            history.append({'epoch': epoch + 1, 'train_loss': (totals[0] / totals[2]).item(),
                            'train_acc': (totals[1] / totals[2]).item(),
                            'test_acc': helpers.evaluate_accuracy_gpu(net, test_loader, device),
                            'seconds': epoch_times[-1]})
            launch.report(**history[-1])
    result = rank_result(cfg, net, device, at_forward, history, epoch_times,
                         cfg.num_epochs * len(loader), notice)
    dist.barrier()  # every rank leaves together
    return result


def max_over_ranks(local):
    """Largest |local - rank 0's local| over all ranks (every rank calls it)."""
    reference = local.clone()
    dist.broadcast(reference, src=0)
    diff = (local - reference).abs().max()
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    return diff.item()


def rank_result(cfg, net, device, at_forward, history, epoch_times, steps, notice):
    """What a rank returns: its timings, a digest of its parameters, and how far the ranks'
    parameters and BatchNorm buffers are from rank 0's (collectives: every rank calls it)."""
    params = torch.cat([p.detach().flatten() for p in net.parameters()])
    world_size = dist.get_world_size()
    return {'rank': dist.get_rank(), 'world_size': world_size, 'backend': dist.get_backend(),
            'device': str(device), 'width': cfg.width,
            'per_rank_batch': cfg.batch_size // world_size, 'steps': steps,
            'epoch_times': epoch_times, 'history': history,
            'test_accuracy': history[-1]['test_acc'] if history else None,  # rank 0 evaluates
            'param_digest': hashlib.sha256(params.cpu().numpy().tobytes()).hexdigest(),
            'max_param_diff': max_over_ranks(params),
            'max_buffer_diff': max_over_ranks(float_buffers(net)),
            'max_buffer_diff_at_last_forward': max_over_ranks(at_forward['buffers']),
            'data_notice': notice}


def buffers_at_forward(net):
    """A dict that holds, under 'buffers', `net`'s float buffers as they were when its last
    training forward pass began: DDP has just broadcast rank 0's there."""
    kept = {}

    def keep(module, args):
        if module.training:
            kept['buffers'] = float_buffers(module)
    net.register_forward_pre_hook(keep)
    return kept


def plain_against_ddp(rank, world_size, config, steps, repeats):
    """Time `steps` training steps of the plain module and of the same module wrapped in DDP,
    in turns, on the same batches (loaded beforehand), `repeats` rounds after 2 steps each to
    warm up. Returns {'plain': [seconds per round], 'ddp': [...]}. Run it in one process."""
    cfg = check_config(config, world_size)
    rank, world_size, device = launch.init_distributed(timeout=cfg.timeout)
    torch.manual_seed(cfg.seed)
    plain = helpers.resnet18(10, width=cfg.width).to(device)
    wrapped = DistributedDataParallel(copy.deepcopy(plain), device_ids=[device.index]
                                      if device.type == 'cuda' else None)
    loader = data_loaders(cfg, rank, world_size)[0]
    batches = [batch for batch, _ in zip(itertools.cycle(loader), range(steps))]
    runs = {'plain': plain, 'ddp': wrapped}
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=cfg.lr) for name, m in runs.items()}
    for name, model in runs.items():   # warm-up: DDP rebuilds its buckets after step 1
        train_epoch(model, batches[:2], optimizers[name], device)
    times = {name: [] for name in runs}
    for repeat in range(repeats):
        for name in sorted(runs, reverse=repeat % 2 == 1):   # each goes first in turn
            helpers.synchronize(device)
            tik = time.perf_counter()
            train_epoch(runs[name], batches, optimizers[name], device)
            helpers.synchronize(device)
            times[name].append(time.perf_counter() - tik)
    return times
# ---- end of what 06_multi_gpu_concise.ipynb saves


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    defaults = Config()
    parser.add_argument('--batch-size', type=int, default=defaults.batch_size,
                        help='global batch, split evenly over the processes')
    parser.add_argument('--lr', type=float, default=defaults.lr)
    parser.add_argument('--num-epochs', '--epochs', type=int, dest='num_epochs',
                        default=defaults.num_epochs)
    parser.add_argument('--num-train', type=int, default=None, help='training subset size')
    parser.add_argument('--num-test', type=int, default=None, help='test subset size')
    parser.add_argument('--width', type=int, default=defaults.width,
                        help="channels of ResNet-18's first stage (the book's: 64)")
    parser.add_argument('--seed', type=int, default=defaults.seed,
                        help='seed of the initial weights and of the data order')
    parser.add_argument('--data-source', default='auto', choices=['real', 'synthetic', 'auto'])
    parser.add_argument('--timeout', type=int, default=defaults.timeout,
                        help='seconds before a collective gives up')
    args = parser.parse_args()
    if 'RANK' not in os.environ:
        parser.error('run me with torchrun --nproc_per_node=N (or from launch.run_workers)')
    world_size = int(os.environ['WORLD_SIZE'])
    config = Config(**vars(args))
    # the processes on this host share its cores (LOCAL_WORLD_SIZE: torchrun's count per host)
    torch.set_num_threads(helpers.cores_per_process(int(os.environ.get('LOCAL_WORLD_SIZE',
                                                                       world_size))))
    try:
        result = train(int(os.environ['RANK']), world_size, config)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if result['rank'] == 0:
        print(result.pop('data_notice'))
        print(json.dumps(result, indent=2))


if __name__ == '__main__':
    main()
