"""Worker functions for the process tests: they must live in an importable module."""
import os
import time

import torch
import torch.distributed as dist

import launch


def all_reduce_rank(rank, world_size):
    launch.init_distributed(timeout=30)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item()


def fail_on_rank_1(rank, world_size):
    if rank == 1:
        raise ValueError('rank 1 refuses')
    launch.init_distributed(timeout=30)
    dist.barrier()  # would wait for rank 1 forever without the launcher's clean-up
    return rank


def exit_hard(rank, world_size):
    os._exit(3)


def sleep_forever(rank, world_size):
    time.sleep(3600)


def report_epochs(rank, world_size, epochs):
    for epoch in range(epochs):
        if rank == 0:
            launch.report(epoch=epoch, loss=1.0 / (epoch + 1))
    return epochs
