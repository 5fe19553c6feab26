"""Counting what collectives send: by the bandwidth-optimal (ring) accounting the ZeRO and
Megatron papers use, and on the wire.

`CollectiveCounter` is a dispatch mode: while it is active, every torch.distributed operation
this process calls passes through it (DDP's gradient all-reduce, FSDP's gathers, DTensor's
collectives alike), and it adds up the calls and the bytes a ring would send for each
(RING_BYTES). `tcp_bytes_sent` reads what the process really put on its TCP sockets, which is
what gloo uses. Notebooks 08 and 09 count with both.
"""
import contextlib
import os
import socket
import struct

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

# The operators' names as a person reads them, for tables
READABLE = {
    'c10d.allreduce_': 'all-reduce', 'c10d._allgather_base_': 'all-gather',
    'c10d.allgather_': 'all-gather (list)', 'c10d._reduce_scatter_base_': 'reduce-scatter',
    'c10d.reduce_scatter_': 'reduce-scatter (list)', 'c10d.broadcast_': 'broadcast',
    'c10d.send': 'send', 'c10d.barrier': 'barrier',
    '_c10d_functional.all_reduce': 'all-reduce', '_c10d_functional.broadcast': 'broadcast',
    '_c10d_functional.all_gather_into_tensor': 'all-gather',
    '_c10d_functional.reduce_scatter_tensor': 'reduce-scatter',
    '_c10d_functional.all_to_all_single': 'all-to-all',
}
# Operators of those namespaces that move nothing: receiving (the sender counts the bytes),
# waiting for a functional collective to finish, and wrapping its result for autograd.
NOT_COUNTED = {'c10d.recv_', '_c10d_functional.wait_tensor',
               '_c10d_functional._wrap_tensor_autograd'}


def group_size(name, args):
    """k, the ranks of the group a collective runs on: a c10d operator carries its process
    group (boxed), a functional one names it in its last argument. The world's size where the
    group cannot be read."""
    with contextlib.suppress(Exception):
        if name.startswith('_c10d_functional.'):
            from torch.distributed.distributed_c10d import _resolve_process_group
            return _resolve_process_group(args[-1]).size()
        for a in args:
            if isinstance(a, torch.ScriptObject):
                return dist.ProcessGroup.unbox(a).size()
    return dist.get_world_size()


# ---- saved from 08_sharded_data_parallelism.ipynb by make export: edit the notebook
ADAM_FP32 = {'parameters': 4, 'gradients': 4, 'optimizer state': 8}  # bytes per parameter
ADAM_MIXED = {'parameters': 2, 'gradients': 2, 'optimizer state': 12}  # the paper's count
SHARDED = {'ddp': (), 'zero1': ('optimizer state',),
           'zero2': ('optimizer state', 'gradients'),
           'fsdp': ('optimizer state', 'gradients', 'parameters')}


def paper_bytes(strategy, k, per_parameter=ADAM_FP32):
    """Bytes per parameter that one of k ranks holds, by kind (Rajbhandari et al., 2020)."""
    return {kind: b / k if kind in SHARDED[strategy] else b for kind, b in per_parameter.items()}


def paper_sent(strategy, k):
    """Values one of k ranks sends per step, per parameter (the paper rounds to 2 and 3)."""
    return (3 if strategy == 'fsdp' else 2) * (k - 1) / k


def nbytes(tensors):
    """Bytes of a tensor, or of a list or tuple of them."""
    tensors = tensors if isinstance(tensors, (list, tuple)) else [tensors]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


# Bytes one rank sends when a collective runs as a ring (bandwidth-optimal) on k ranks, from
# the arguments of the c10d operator: the accounting of the ZeRO paper, per rank.
RING_BYTES = {
    'c10d.allreduce_': lambda args, k: 2 * (k - 1) / k * nbytes(args[0]),
    'c10d._allgather_base_': lambda args, k: (k - 1) * nbytes(args[1]),
    'c10d.allgather_': lambda args, k: (k - 1) * nbytes(args[1]),
    'c10d._reduce_scatter_base_': lambda args, k: (k - 1) * nbytes(args[0]),
    'c10d.reduce_scatter_': lambda args, k: (k - 1) * nbytes(args[0]),
    # a pipelined broadcast: the k-1 receivers get S bytes, (k-1) S sent in all, shared
    'c10d.broadcast_': lambda args, k: (k - 1) / k * nbytes(args[0]),
    'c10d.send': lambda args, k: nbytes(args[0]),
    # The functional collectives that DTensor, parallelize_module and torch.compile issue
    # (namespace _c10d_functional): each returns a new tensor instead of filling one in.
    '_c10d_functional.all_reduce': lambda args, k: 2 * (k - 1) / k * nbytes(args[0]),
    '_c10d_functional.all_reduce_coalesced': lambda args, k: 2 * (k - 1) / k * nbytes(args[0]),
    '_c10d_functional.all_gather_into_tensor': lambda args, k: (k - 1) * nbytes(args[0]),
    '_c10d_functional.all_gather_into_tensor_coalesced':
        lambda args, k: (k - 1) * nbytes(args[0]),
    '_c10d_functional.reduce_scatter_tensor': lambda args, k: (k - 1) / k * nbytes(args[0]),
    '_c10d_functional.reduce_scatter_tensor_coalesced':
        lambda args, k: (k - 1) / k * nbytes(args[0]),
    '_c10d_functional.broadcast': lambda args, k: (k - 1) / k * nbytes(args[0]),
    # every rank keeps its own chunk and sends the others (even splits)
    '_c10d_functional.all_to_all_single': lambda args, k: (k - 1) / k * nbytes(args[0]),
}


class CollectiveCounter(TorchDispatchMode):
    """While active, counts the collectives this process calls and the bytes each sends
    (RING_BYTES). Every torch.distributed operation passes the dispatcher, so this sees
    DDP's gradient all-reduce (made through a comm hook), FSDP's internals and the functional
    collectives of DTensor alike. k is the size of the group each collective runs on (a
    2-D mesh runs FSDP's collectives on one of its dimensions, not the whole world)."""

    def __init__(self):
        super().__init__()
        self.bytes, self.calls = 0.0, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)  # for example 'c10d.allreduce_'
        if func.namespace in ('c10d', '_c10d_functional') and name not in NOT_COUNTED:
            self.calls[name] = self.calls.get(name, 0) + 1
            if name in RING_BYTES:
                self.bytes += RING_BYTES[name](args, group_size(name, args))
        return func(*args, **(kwargs or {}))
# ---- end of what 08_sharded_data_parallelism.ipynb saves


def tcp_bytes_sent():
    """Bytes this process has sent over all its TCP sockets, each byte once (Linux, kernel
    4.19+: TCP_INFO's tcpi_bytes_sent less tcpi_bytes_retrans, the bytes a busy machine made
    it send again), or None where that cannot be read. gloo talks over TCP, so the difference
    across a training step is what the step put on the wire."""
    total = 0
    try:
        fds = os.listdir('/proc/self/fd')
    except OSError:
        return None
    if not hasattr(socket, 'TCP_INFO'):
        return None
    for fd in fds:
        with contextlib.suppress(OSError, ValueError):
            if not os.readlink(f'/proc/self/fd/{fd}').startswith('socket:'):
                continue
            sock = socket.socket(fileno=int(fd))  # wraps our own descriptor; detached below
            try:
                if sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET,
                                                                       socket.AF_INET6):
                    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
                    if len(info) < 216:
                        return None
                    sent, resent = struct.unpack_from('QQ', info, 200)  # bytes_sent, _retrans
                    total += sent - resent
            finally:
                sock.detach()
    return total
