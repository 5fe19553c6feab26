"""Train the chapter's ResNet-18 with DistributedDataParallel, one process per device.

Standalone, with torchrun (one process per GPU; CPU processes with gloo when there is no GPU):

    torchrun --nproc_per_node=2 notebooks/ddp_train.py --epochs 1 --num-train 512 --batch-size 64

From Python, as notebook 06 does: helpers.run_workers(ddp_train.train, 2, {'epochs': 1}).
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
from torch.utils.data import DataLoader, DistributedSampler

import helpers

DEFAULTS = {'batch_size': 256, 'lr': 0.1, 'epochs': 1, 'num_train': None, 'num_test': None,
            'data_source': 'auto', 'seed': 0, 'timeout': 60, 'fail_rank': None}


def check_config(config, world_size):
    """Validate a run's settings before any process starts; returns the completed config."""
    cfg = helpers.with_defaults(config, DEFAULTS)
    helpers.check_int('world_size', world_size)
    for name in ('batch_size', 'epochs', 'timeout'):
        helpers.check_int(name, cfg[name])
    for name in ('num_train', 'num_test'):
        helpers.check_int(name, cfg[name], allow_none=True)
    if cfg['batch_size'] % world_size:
        raise ValueError(f'batch_size={cfg["batch_size"]} does not split evenly over '
                         f'{world_size} processes: use a multiple of {world_size}')
    if cfg['num_train'] is not None and cfg['num_train'] < cfg['batch_size']:
        raise ValueError(f'num_train={cfg["num_train"]} is smaller than one batch '
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
    """One rank of a DDP run. Returns its timings, a digest of its parameters, how far the
    ranks' parameters and buffers are apart, and (on rank 0) the test accuracy."""
    cfg = check_config(config, world_size)
    rank, world_size, device = helpers.init_distributed(timeout=cfg['timeout'])
    torch.manual_seed(cfg['seed'])
    net = helpers.resnet18(10).to(device)
    # DDP broadcasts rank 0's parameters and buffers now and all-reduces gradients later.
    model = DistributedDataParallel(net, device_ids=[device.index] if device.type == 'cuda'
                                    else None)
    with contextlib.redirect_stdout(io.StringIO()) as notice:  # said once, by the caller
        train_set, test_set = helpers.fashion_mnist_datasets(
            cfg['data_source'], num_train=cfg['num_train'], num_test=cfg['num_test'])
    sampler = DistributedSampler(train_set, world_size, rank, shuffle=True, seed=cfg['seed'],
                                 drop_last=True)  # each rank sees its own 1/world_size share
    loader = DataLoader(train_set, cfg['batch_size'] // world_size, sampler=sampler,
                        drop_last=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg['lr'])
    loss = nn.CrossEntropyLoss()  # mean per rank; DDP averages over ranks: the global mean
    epoch_times, steps = [], 0
    for epoch in range(cfg['epochs']):
        sampler.set_epoch(epoch)  # a new shuffle every epoch, the same on every rank
        model.train()
        helpers.synchronize(device)
        tik = time.perf_counter()
        for X, y in loader:
            if cfg['fail_rank'] == rank and steps == 1:
                raise RuntimeError(f'rank {rank}: simulated crash at step {steps}')
            optimizer.zero_grad()
            loss(model(X.to(device)), y.to(device)).backward()
            optimizer.step()
            steps += 1
        helpers.synchronize(device)
        epoch_times.append(time.perf_counter() - tik)
    params = torch.cat([p.detach().flatten() for p in net.parameters()])
    buffers = torch.cat([b.detach().float().flatten() for b in net.buffers()])
    result = {'rank': rank, 'world_size': world_size, 'backend': dist.get_backend(),
              'device': str(device), 'per_rank_batch': cfg['batch_size'] // world_size,
              'steps': steps, 'epoch_times': epoch_times,
              'param_digest': hashlib.sha256(params.cpu().numpy().tobytes()).hexdigest(),
              'max_param_diff': _max_over_ranks(params),
              'max_buffer_diff': _max_over_ranks(buffers), 'test_accuracy': None,
              'data_notice': notice.getvalue().strip()}
    if rank == 0:
        result['test_accuracy'] = helpers.evaluate_accuracy_gpu(
            net, DataLoader(test_set, 256), device)
    dist.barrier()  # every rank leaves together
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--batch-size', type=int, default=DEFAULTS['batch_size'],
                        help='global batch, split evenly over the processes')
    parser.add_argument('--lr', type=float, default=DEFAULTS['lr'])
    parser.add_argument('--epochs', type=int, default=DEFAULTS['epochs'])
    parser.add_argument('--num-train', type=int, default=None, help='training subset size')
    parser.add_argument('--num-test', type=int, default=None, help='test subset size')
    parser.add_argument('--data-source', default='auto', choices=['real', 'synthetic', 'auto'])
    parser.add_argument('--timeout', type=int, default=DEFAULTS['timeout'],
                        help='seconds before a collective gives up')
    args = parser.parse_args()
    if 'RANK' not in os.environ:
        parser.error('run me with torchrun --nproc_per_node=N (or from helpers.run_workers)')
    world_size = int(os.environ['WORLD_SIZE'])
    config = {k: v for k, v in vars(args).items() if v is not None}
    torch.set_num_threads(helpers.cores_per_process(world_size))
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
