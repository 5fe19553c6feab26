"""What notebook 09's workers measure with, shared by its tensor-parallel and pipeline lessons.

* `SavedActivations` counts the bytes autograd keeps for the backward pass (the activations),
  through torch.autograd.graph.saved_tensors_hooks; `Metered` wraps a module in it.
* `ChunkClock` times every forward and backward chunk a pipeline stage runs, and (on a CPU)
  the CPU time its thread got meanwhile.
* `relative_diff` and `max_over_ranks` turn two results into one number: how far apart they
  are, the largest over the ranks.
* `WireMeter` counts the bytes the process's TCP sockets sent meanwhile (gloo's traffic).
* `join` starts a worker's process group and returns the device its lesson runs on.
"""
import time

import torch
import torch.distributed as dist
from torch import nn

import helpers
import launch
from collectives import tcp_bytes_sent


def local(t):
    return t.to_local() if hasattr(t, 'to_local') else t  # a DTensor's part on this rank


def full(t):
    return t.full_tensor() if hasattr(t, 'full_tensor') else t  # a DTensor, gathered


def join(cfg):
    """Join the process group of a worker whose config says where it computes (`device`:
    'cpu' or 'cuda') and how its ranks talk (`backend`). Ranks that share one GPU talk through
    gloo, which copies each CUDA tensor through host memory; returns (rank, world size,
    device)."""
    rank, k, device = launch.init_distributed(timeout=cfg.collective_timeout,
                                              backend=cfg.backend)
    if cfg.device == 'cpu' or device.type != 'cuda':
        return rank, k, torch.device('cpu')
    torch.cuda.set_device(device)  # DeviceMesh and the schedules use the current device
    return rank, k, device


class WireMeter:
    """The bytes this process's TCP sockets sent while the meter was active (`with`): what gloo
    put on the wire. `bytes` stays None on nccl, which does not use them, or where the kernel
    does not say."""

    def __enter__(self):
        self.start, self.bytes = None, None
        if dist.get_backend() == 'gloo':
            self.start = tcp_bytes_sent()
        return self

    def __exit__(self, *exc):
        if self.start is not None:
            self.bytes = tcp_bytes_sent() - self.start
        return False

    def per(self, n):
        """The bytes per one of n steps (None where none were counted)."""
        return None if self.bytes is None else self.bytes / n


def max_over_ranks(value):
    """The largest of every rank's `value` (a number)."""
    t = torch.tensor([float(value)], dtype=torch.float64,
                     device='cuda' if dist.get_backend() == 'nccl' else 'cpu')
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def relative_diff(a, b):
    """max |a - b| over max |b|: how far a is from b, relative to b's largest value."""
    return ((a - b).abs().max() / b.abs().max().clamp_min(torch.finfo(b.dtype).tiny)).item()


# --------------------------------------------------------------- counting activations
class _Saved:
    """One tensor autograd saved for the backward pass, while the meter watches it."""
    __slots__ = ('meter', 'tensor', 'key')

    def __init__(self, meter, tensor, key):
        self.meter, self.tensor, self.key = meter, tensor, key

    def __del__(self):  # autograd frees what it saved once the backward pass has used it
        self.meter._release(self.key)


class SavedActivations:
    """Counts the bytes autograd keeps for the backward pass (the activations), now and at their
    peak. While the meter is active (`with meter:`), every tensor a forward pass saves passes
    through torch.autograd.graph.saved_tensors_hooks. Parameters are not activations and are
    skipped; memory saved by two operations (a layer's input is often the previous layer's
    output) counts once; a saved tensor stops counting when autograd frees it."""

    def __init__(self, parameters=()):
        self.skip = {local(p).untyped_storage().data_ptr() for p in parameters}
        self.held = {}  # (round, address, bytes) of a saved tensor's memory -> how many saved it
        self.live = self.peak = self.base = self.round = 0

    def reset_peak(self):
        """Measure the peak from now on, above what is held now (`base`): a new round, whose
        saved tensors count even where an earlier round saved the same memory."""
        self.peak = self.base = self.live
        self.round += 1

    def _mine(self, t):
        """The part of a saved tensor this rank holds (a DTensor's local shard)."""
        with torch.no_grad():
            return local(t)

    def _skipped(self, mine):
        """Whether a saved tensor is not an activation (a parameter)."""
        return mine.untyped_storage().data_ptr() in self.skip

    def _pack(self, t):
        mine = self._mine(t)
        if self._skipped(mine):
            return t
        key = (self.round, mine.data_ptr(), mine.numel() * mine.element_size())
        if key not in self.held:
            self.held[key] = 0
            self.live += key[2]
            self.peak = max(self.peak, self.live)
        self.held[key] += 1
        # Keep a detached alias: holding the saved tensor itself would tie it to its own graph
        # node (a ReLU saves its output) in a cycle that outlives the graph.
        return _Saved(self, t.detach(), key)

    def _release(self, key):
        self.held[key] -= 1
        if self.held[key] == 0:
            self.live -= key[2]
            del self.held[key]

    @staticmethod
    def _unpack(packed):
        return packed.tensor if isinstance(packed, _Saved) else packed

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


class Metered(nn.Module):
    """`module`, with the activations its forward passes save counted by `meter`."""

    def __init__(self, module, meter):
        super().__init__()
        self.inner, self.meter = module, meter

    def forward(self, x):
        with self.meter:
            return self.inner(x)


# ------------------------------------------------------------- timing a pipeline's chunks
class ChunkClock:
    """Times every forward and backward chunk a rank's stages run, as (start, end, 'F' or 'B',
    stage) in seconds on the host's monotonic clock (time.perf_counter, CLOCK_MONOTONIC on
    Linux), one clock for all the processes of a machine.

    On a CPU the host clock times the chunk itself: CPU operations are synchronous. On a GPU a
    chunk's kernels run after Python queues them, so two CUDA events, recorded on the current
    stream before and after the chunk, time its kernels. (torch.cuda.synchronize around each
    chunk would also wait for the messages in flight on NCCL's own streams, and so hold the
    schedule back.) The events are placed on the host clock through an anchor event recorded
    at the start of the step, while the GPU was idle.

    Beside each chunk's span, the CPU time the calling thread got during it (time.thread_time):
    on a CPU, the span less that time is time the chunk waited for a core (with several torch
    threads, the calling thread's share of the work stands for the rest)."""

    def __init__(self, device):
        self.device, self.cuda, self.events, self.cpu = device, device.type == 'cuda', [], []

    def start_step(self):
        self.events.clear()
        self.cpu.clear()
        if self.cuda:
            helpers.synchronize(self.device)  # nothing queued: the anchor runs when recorded
            self.anchor = torch.cuda.Event(enable_timing=True)
            self.anchor.record()
            self.anchor_s = time.perf_counter()

    def _now(self):
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()  # on torch.cuda.current_stream(), where the stage computes
        return event

    def wrap(self, method, kind, stage):
        """`method` (a stage's forward_one_chunk or backward_one_chunk), timed."""
        def run(*args, **kwargs):
            start, cpu = self._now(), time.thread_time()
            result = method(*args, **kwargs)
            self.events.append((start, self._now(), kind, stage))
            self.cpu.append(time.thread_time() - cpu)
            return result
        return run

    def intervals(self):
        """This step's chunks as (start, end, kind, stage), in seconds on the host clock."""
        if not self.cuda:
            return list(self.events)
        helpers.synchronize(self.device)  # every event has run: elapsed_time needs it
        at = lambda e: self.anchor_s + self.anchor.elapsed_time(e) / 1e3  # ms -> s
        return [(at(start), at(end), kind, stage) for start, end, kind, stage in self.events]

    def cpu_seconds(self):
        """This step's chunks' CPU time on the calling thread, in the order of intervals();
        None on a GPU, where a chunk's host time only queues its kernels."""
        return None if self.cuda else list(self.cpu)

    def time(self, stage):
        """Time every chunk `stage` (a PipelineStage) runs from now on."""
        stage.forward_one_chunk = self.wrap(stage.forward_one_chunk, 'F', stage.stage_index)
        stage.backward_one_chunk = self.wrap(stage.backward_one_chunk, 'B', stage.stage_index)
