"""Train the chapter's ResNet-18 with DistributedDataParallel, one process per device.

Standalone, with torchrun (one process per GPU; CPU processes with gloo when there is no GPU):

    torchrun --nproc_per_node=2 notebooks/ddp_train.py --epochs 1 --num-train 512 --batch-size 64

Rank 0 prints each epoch's progress as one JSON line ({"progress": {...}}) and, at the end, its
result as indented JSON. From Python, as notebook 06 does:
launch.run_workers(ddp_train.train, 2, {'epochs': 1}, on_progress=callback), where rank 0's
launch.report(...) reaches callback(rank, metrics) while training runs.
The worker lives in this module, not in the notebook, because spawned processes import it.
"""
import argparse
import contextlib
import hashlib
import io
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

DEFAULTS = {'batch_size': 256, 'lr': 0.1, 'epochs': 1, 'num_train': None, 'num_test': None,
            'width': 64, 'data_source': 'auto', 'data': None, 'seed': 0, 'timeout': 60,
            'fail_rank': None}


def arrays(train_set, test_set):
    """The `data` setting: a caller's loaded TensorDatasets as NumPy arrays, which reach the
    workers as plain copies (no shared memory), so that every process trains on exactly these
    examples without loading them again."""
    return {name: tuple(t.numpy() for t in ds.tensors)
            for name, ds in (('train', train_set), ('test', test_set))}


def check_config(config, world_size):
    """Validate a run's settings before any process starts; returns the completed config."""
    cfg = helpers.with_defaults(config, DEFAULTS)
    helpers.check_int('world_size', world_size)
    for name in ('batch_size', 'epochs', 'width', 'timeout'):
        helpers.check_int(name, cfg[name])
    helpers.check_int('seed', cfg['seed'], minimum=0)
    helpers.check_positive('lr', cfg['lr'])
    for name in ('num_train', 'num_test'):
        helpers.check_int(name, cfg[name], allow_none=True)
    if cfg['batch_size'] % world_size:
        raise ValueError(f'batch_size={cfg["batch_size"]} does not split evenly over '
                         f'{world_size} processes: use a multiple of {world_size}')
    if cfg['data'] is not None and (not isinstance(cfg['data'], dict)
                                    or set(cfg['data']) != {'train', 'test'}):
        raise ValueError("data must be {'train': (X, y), 'test': (X, y)} of NumPy arrays "
                         '(see arrays()), or None to load by data_source')
    num_train = len(cfg['data']['train'][0]) if cfg['data'] is not None else cfg['num_train']
    if num_train is not None and num_train < cfg['batch_size']:
        raise ValueError(f'num_train={num_train} is smaller than one batch '
                         f'({cfg["batch_size"]})')
    helpers.check_choice('data_source', cfg['data_source'], ('real', 'synthetic', 'auto'))
    return cfg


def _max_over_ranks(local):
    """Largest |local - rank 0's local| over all ranks."""
    reference = local.clone()
    dist.broadcast(reference, src=0)
    diff = (local - reference).abs().max()
    dist.all_reduce(diff, op=dist.ReduceOp.MAX)
    return diff.item()


def train(rank, world_size, config):
    """One rank of a DDP run. Rank 0 reports each epoch's training loss and accuracy (over all
    ranks) and test accuracy with launch.report. Returns the rank's timings, a digest of its
    parameters, and how far the ranks' parameters and BatchNorm buffers are apart."""
    cfg = check_config(config, world_size)
    rank, world_size, device = launch.init_distributed(timeout=cfg['timeout'])
    torch.manual_seed(cfg['seed'])
    net = helpers.resnet18(10, width=cfg['width']).to(device)
    # DDP broadcasts rank 0's parameters and buffers now and all-reduces gradients later.
    model = DistributedDataParallel(net, device_ids=[device.index] if device.type == 'cuda'
                                    else None)
    # At the start of every forward pass DDP broadcasts rank 0's buffers (BatchNorm's running
    # statistics) to all ranks; keep what the module held then, to check it below.
    at_forward = {}
    net.register_forward_pre_hook(lambda module, args: at_forward.update(
        buffers=_float_buffers(module)) if module.training else None)
    with contextlib.redirect_stdout(io.StringIO()) as notice:  # said once, by the caller
        if cfg['data'] is not None:
            train_set, test_set = (TensorDataset(*map(torch.from_numpy, cfg['data'][name]))
                                   for name in ('train', 'test'))
        else:
            train_set, test_set = helpers.fashion_mnist_datasets(
                cfg['data_source'], num_train=cfg['num_train'], num_test=cfg['num_test'])
    sampler = DistributedSampler(train_set, world_size, rank, shuffle=True, seed=cfg['seed'],
                                 drop_last=True)  # each rank sees its own 1/world_size share
    loader = DataLoader(train_set, cfg['batch_size'] // world_size, sampler=sampler,
                        drop_last=True)
    test_loader = DataLoader(test_set, 256)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg['lr'])
    loss = nn.CrossEntropyLoss()  # mean per rank; DDP averages over ranks: the global mean
    epoch_times, history, steps = [], [], 0
    for epoch in range(cfg['epochs']):
        sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
        model.train()
        totals = torch.zeros(3, device=device)  # loss sum, correct, examples (this rank)
        helpers.synchronize(device)
        tik = time.perf_counter()
        for X, y in loader:
            if cfg['fail_rank'] == rank and steps == 1:
                raise RuntimeError(f'rank {rank}: simulated crash at step {steps}')
            X, y = X.to(device), y.to(device)
            optimizer.zero_grad()
            y_hat = model(X)
            batch_loss = loss(y_hat, y)
            batch_loss.backward()
            optimizer.step()
            totals[0] += batch_loss.detach() * len(y)  # stays on the device: no sync
            totals[1] += (y_hat.argmax(1) == y).sum()
            totals[2] += len(y)
            steps += 1
        helpers.synchronize(device)
        epoch_times.append(time.perf_counter() - tik)
        dist.all_reduce(totals)  # the epoch's loss and accuracy over every rank's examples
        if rank == 0:
            history.append({'epoch': epoch + 1, 'train_loss': (totals[0] / totals[2]).item(),
                            'train_acc': (totals[1] / totals[2]).item(),
                            'test_acc': helpers.evaluate_accuracy_gpu(net, test_loader, device),
                            'seconds': epoch_times[-1]})
            launch.report(**history[-1])
    params = torch.cat([p.detach().flatten() for p in net.parameters()])
    result = {'rank': rank, 'world_size': world_size, 'backend': dist.get_backend(),
              'device': str(device), 'width': cfg['width'],
              'per_rank_batch': cfg['batch_size'] // world_size, 'steps': steps,
              'epoch_times': epoch_times, 'history': history,
              'test_accuracy': history[-1]['test_acc'] if history else None,
              'param_digest': hashlib.sha256(params.cpu().numpy().tobytes()).hexdigest(),
              'max_param_diff': _max_over_ranks(params),
              'max_buffer_diff': _max_over_ranks(_float_buffers(net)),
              'max_buffer_diff_at_last_forward': _max_over_ranks(at_forward['buffers'])
              if at_forward else None,
              'data_notice': notice.getvalue().strip()}
    dist.barrier()  # every rank leaves together
    return result


def _float_buffers(module):
    """Every floating-point buffer (BatchNorm's running mean and variance), as one vector."""
    return torch.cat([b.detach().flatten() for b in module.buffers() if b.is_floating_point()])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--batch-size', type=int, default=DEFAULTS['batch_size'],
                        help='global batch, split evenly over the processes')
    parser.add_argument('--lr', type=float, default=DEFAULTS['lr'])
    parser.add_argument('--epochs', type=int, default=DEFAULTS['epochs'])
    parser.add_argument('--num-train', type=int, default=None, help='training subset size')
    parser.add_argument('--num-test', type=int, default=None, help='test subset size')
    parser.add_argument('--width', type=int, default=DEFAULTS['width'],
                        help="channels of ResNet-18's first stage (the book's: 64)")
    parser.add_argument('--seed', type=int, default=DEFAULTS['seed'],
                        help='seed of the initial weights and of the data order')
    parser.add_argument('--data-source', default='auto', choices=['real', 'synthetic', 'auto'])
    parser.add_argument('--timeout', type=int, default=DEFAULTS['timeout'],
                        help='seconds before a collective gives up')
    args = parser.parse_args()
    if 'RANK' not in os.environ:
        parser.error('run me with torchrun --nproc_per_node=N (or from launch.run_workers)')
    world_size = int(os.environ['WORLD_SIZE'])
    config = {k: v for k, v in vars(args).items() if v is not None}
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
