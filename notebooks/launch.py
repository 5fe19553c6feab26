"""Starting the processes of a distributed run, and what runs inside each of them.

`run_workers(fn, k, ...)` starts k fresh processes on this machine (or on emulated hosts, via
cluster.run_workers), each calling fn(rank, k, ...); inside, `init_distributed()` joins the
process group (gloo on CPUs, nccl when every process has a GPU of its own) and `report(...)`
sends progress back while the run goes on. Nothing hangs: a failed or dead rank, or a run past
its timeout, stops every process and raises here. Worker functions must live in an importable
module (workers start from a fresh interpreter): notebooks 05-09 write their taught code into
such modules from `#@save` cells (scripts/export.py), where the workers import it.
"""
import json
import os
import pickle
import socket
import time
import traceback
from datetime import timedelta
from queue import Empty

import torch

from helpers import check_choice, check_int, cores_per_process, num_gpus
from results import _jsonable


def port_is_free(port, host='127.0.0.1'):
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host='127.0.0.1'):
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def init_distributed(timeout=60, backend=None):
    """Join the process group described by the environment (torchrun or run_workers).
    backend None: nccl when every process on this host has a GPU of its own (LOCAL_WORLD_SIZE,
    so that 2 hosts x 8 GPUs still get nccl), else gloo: ranks sharing a GPU use it through
    gloo; without GPUs they use the CPU. Every collective times out after `timeout` seconds.
    Returns (rank, world_size, device)."""
    import torch.distributed as dist
    rank, world_size = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    local_rank = int(os.environ.get('LOCAL_RANK', rank))
    local_world_size = int(os.environ.get('LOCAL_WORLD_SIZE', world_size))
    gpus = num_gpus()
    device = torch.device(f'cuda:{local_rank % gpus}') if gpus else torch.device('cpu')
    if backend is None:
        backend = 'nccl' if gpus >= local_world_size and dist.is_nccl_available() else 'gloo'
    if backend == 'nccl':
        torch.cuda.set_device(device)  # nccl's communicator binds to the current device
    dist.init_process_group(backend, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout),
                            # nccl: bind the group to this GPU (barrier() warns otherwise);
                            # gloo serves CPU tensors and GPUs it shares: no device to bind
                            device_id=device if backend == 'nccl' else None)
    return rank, world_size, device


_progress = None  # the launcher's queue, inside a worker started by run_workers


def report(**metrics):
    """Send metrics (for example one epoch's loss and accuracy) from a worker to the process
    that started it: run_workers hands them to its on_progress callback while the workers are
    still running. Under torchrun, rank 0 prints them as one JSON line instead."""
    if _progress is not None:
        _progress.put((int(os.environ.get('RANK', 0)), 'progress', pickle.dumps(metrics)))
    elif os.environ.get('RANK', '0') == '0':
        print(json.dumps({'progress': _jsonable(metrics)}), flush=True)


def join_netns(name):
    """Move the calling thread into the network namespace `name` (made by `ip netns add`):
    the sockets it opens from then on live there. os.setns arrived only in Python 3.12."""
    fd = os.open(f'/var/run/netns/{name}', os.O_RDONLY)
    try:
        if hasattr(os, 'setns'):
            os.setns(fd, os.CLONE_NEWNET)
        else:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
                errno = ctypes.get_errno()
                raise OSError(errno, f'setns into {name}: {os.strerror(errno)}')
    finally:
        os.close(fd)


def _worker_main(fn, rank, world_size, port, args, queue, placement=None, threads=None):
    global _progress
    _progress = queue
    master, local_rank, local_world_size = '127.0.0.1', rank, world_size
    if placement:  # this rank's emulated host: join it before any socket is made
        netns, _, interface = placement[rank]
        join_netns(netns)
        master = placement[0][1]
        on_this_host = [r for r, (ns, _, _) in enumerate(placement) if ns == netns]
        local_rank, local_world_size = on_this_host.index(rank), len(on_this_host)
        os.environ.update(GLOO_SOCKET_IFNAME=interface, NCCL_SOCKET_IFNAME=interface)
    os.environ.update(MASTER_ADDR=master, MASTER_PORT=str(port), RANK=str(rank),
                      LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size),
                      LOCAL_WORLD_SIZE=str(local_world_size))
    torch.set_num_threads(threads or cores_per_process(world_size))
    try:
        queue.put((rank, 'ok', pickle.dumps(fn(rank, world_size, *args))))
    except BaseException:
        queue.put((rank, 'error', traceback.format_exc()))
        # Into the pipe now, before this rank's sockets close (below, or at exit): the ranks
        # that lose their connection to it report later, so the parent reads the cause first.
        queue.close()
        queue.join_thread()
    finally:
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()


def _collect(queue, procs, results, deadline, timeout, on_progress):
    """Fill `results` (rank -> result) from the workers' queue; raise a RuntimeError when a
    worker fails or dies, or when the deadline passes."""
    world_size = len(procs)
    while len(results) < world_size:
        try:
            rank, status, payload = queue.get(timeout=0.2)
        except Empty:
            pass
        else:
            if status == 'error':
                raise RuntimeError(f'rank {rank} of {world_size} failed:\n{payload}')
            if status == 'progress':
                if on_progress is not None:
                    on_progress(rank, pickle.loads(payload))
            else:
                results[rank] = pickle.loads(payload)
            continue
        dead = [(r, p.exitcode) for r, p in enumerate(procs)
                if p.exitcode not in (None, 0) and r not in results]
        if dead and queue.empty():
            raise RuntimeError(f'rank {dead[0][0]} of {world_size} died with exit code '
                               f'{dead[0][1]}')
        if time.monotonic() > deadline:
            raise RuntimeError(f'workers timed out after {timeout} s '
                               f'(finished: {sorted(results)})')


def _stop(procs, finished):
    """Join the workers that started; terminate, then kill, any that do not end."""
    for p in (p for p in procs if p.pid is not None):
        p.join(timeout=5 if finished else 0)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()


def run_workers(fn, world_size, *args, timeout=120, port=None, on_progress=None,
                placement=None, start_method=None, threads_per_rank=None):
    """Run fn(rank, world_size, *args) in `world_size` fresh processes; return their results.

    `fn` must live in an importable module (workers start from a fresh interpreter, never a
    fork of this one, so a notebook's state and threads do not leak into them). The workers
    find each other through MASTER_ADDR=127.0.0.1 and a free port; call init_distributed()
    inside fn. A worker that fails or dies, or a run that exceeds `timeout` seconds, raises
    a RuntimeError here after every worker has been stopped: nothing hangs, nothing outlives it.
    Metrics a worker sends with report(...) reach on_progress(rank, metrics) as they arrive.
    placement: one (network namespace, address, interface) per rank, to run each rank on an
    emulated host (cluster.run_workers makes it); MASTER_ADDR is then rank 0's address.
    start_method: None picks 'forkserver' where it exists (Linux, macOS): workers fork from one
    fresh server process that imported torch once, instead of each importing it (about 1.5 s
    of CPU per worker); they see os.environ as it was when that server started. 'spawn' starts
    each worker from scratch.
    threads_per_rank: torch's intra-op threads in each worker; None: this machine's cores
    shared out (helpers.cores_per_process), at least one each. More threads than cores per
    rank is allowed: it is how a 2-core machine tries code written for a 16-core one.
    """
    import multiprocessing as mp
    check_int('world_size', world_size)
    methods = mp.get_all_start_methods()
    if start_method is None:
        start_method = 'forkserver' if 'forkserver' in methods else 'spawn'
    check_choice('start_method', start_method, methods)
    if threads_per_rank is not None:
        check_int('threads_per_rank', threads_per_rank)
    if placement is not None and (len(placement) != world_size
                                  or any(len(p) != 3 for p in placement)):
        raise ValueError(f'placement must give (netns, address, interface) for each of the '
                         f'{world_size} ranks, got {placement!r}')
    if port is None:
        port = free_port()
    elif placement is None and not port_is_free(check_int('port', port)):
        raise ValueError(f'port {port} on 127.0.0.1 is busy: pass another port or port=None')
    ctx = mp.get_context(start_method)
    if start_method == 'forkserver':
        # what every worker imports, once: DDP imports dynamo
        ctx.set_forkserver_preload(['torch', 'torch._dynamo', 'helpers', 'launch'])
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker_main, daemon=True,
                         args=(fn, r, world_size, port, args, queue, placement,
                               threads_per_rank))
             for r in range(world_size)]
    results = {}
    try:
        for p in procs:
            p.start()
        _collect(queue, procs, results, time.monotonic() + timeout, timeout, on_progress)
    finally:
        _stop(procs, finished=len(results) == world_size)
        queue.close()
    return [results[r] for r in range(world_size)]
