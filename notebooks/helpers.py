"""Shared code for the Computational Performance notebooks.

Speaks the d2l API (same names and call signatures for what the chapter uses) without
depending on d2l, and fixes the chapter's defects: device discovery falls back to the CPU,
synchronisation works on every device, and data loading needs no torchvision.
Only code used by two or more notebooks, or by worker processes, lives here.
"""
import contextlib
import math
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

import stats

# ----------------------------------------------------------------- parameters
# The checks live in parameters.py, with the declared parameters they serve.
from parameters import check_choice, check_int, check_list, check_positive, with_defaults  # noqa: E402,F401
from paths import DATA_DIR, FIGURES_DIR, RESULTS_DIR, ROOT, TRACES_DIR  # noqa: F401


def check_device(name, value):
    """Turn a device parameter into a torch.device (None: try_gpu()), or raise a ValueError
    naming the parameter if it is malformed or absent from this machine."""
    if value is None:
        return try_gpu()
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f'{name}={value!r} is not a device name ({e})') from None
    if device.type == 'cuda' and (device.index or 0) >= num_gpus():
        raise ValueError(f'{name}={value!r}, but this machine has {num_gpus()} GPU(s)')
    if device.type not in ('cpu', 'cuda'):
        raise ValueError(f'{name}={value!r}: only cpu and cuda devices are supported')
    return device


# -------------------------------------------------------------------- devices
def cpu():
    """The CPU device (d2l)."""
    return torch.device('cpu')


def gpu(i=0):
    """The i-th GPU device (d2l); it may not exist: try_gpu(i) falls back to the CPU."""
    return torch.device(f'cuda:{i}')


def num_gpus():
    return torch.cuda.device_count()


def try_gpu(i=0):
    """Return gpu(i) if it exists, otherwise the CPU."""
    check_int('i', i, minimum=0)
    return torch.device(f'cuda:{i}') if num_gpus() > i else torch.device('cpu')


def try_all_gpus():
    """Return all GPUs, or [cpu] when there is none (d2l returns [], which crashes callers)."""
    return [torch.device(f'cuda:{i}') for i in range(num_gpus())] or [torch.device('cpu')]


def resolve_devices(num_devices, verbose=True):
    """Turn "k devices" into k real GPUs, or k replicas sharing what exists, and say which and why.

    With fewer GPUs than asked for, replicas are placed round-robin on the GPUs there are,
    or all on the CPU. Replicas on one device must hold their own copies of the parameters:
    use `x.to(device, copy=True)`, because `x.to('cpu')` returns `x` itself for a CPU tensor.
    """
    check_int('num_devices', num_devices)
    gpus = [torch.device(f'cuda:{i}') for i in range(num_gpus())]
    if len(gpus) >= num_devices:
        devices = gpus[:num_devices]
        why = f'using {num_devices} of {len(gpus)} GPUs: {", ".join(map(str, devices))}'
    elif gpus:
        devices = [gpus[i % len(gpus)] for i in range(num_devices)]
        why = (f'asked for {num_devices} GPUs, found {len(gpus)}: '
               f'emulating {num_devices} replicas on {", ".join(map(str, gpus))}')
    else:
        devices = [torch.device('cpu')] * num_devices
        why = (f'asked for {num_devices} GPU(s), found 0: ' + (
            f'emulating {num_devices} replicas on the CPU' if num_devices > 1 else 'using the CPU'))
    if verbose:
        print(why)
    return devices


def synchronize(device=None):
    """Wait until all work queued on `device` has finished (CPU ops are already synchronous)."""
    device = torch.device(device) if device is not None else try_gpu()
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    elif device.type == 'cpu':
        torch.cpu.synchronize()


def cpu_model():
    """The processor's model name (Linux), or what platform knows."""
    with contextlib.suppress(OSError):
        for line in Path('/proc/cpuinfo').read_text().splitlines():
            if line.startswith('model name'):
                return line.split(':', 1)[1].strip()
    return platform.processor() or platform.machine()


def environment(device=None):
    """What the measurements ran on; 'device' names `device` (default: try_gpu())."""
    device = torch.device(device) if device is not None else try_gpu()
    gpus = [torch.cuda.get_device_name(i) for i in range(num_gpus())]
    name = (torch.cuda.get_device_name(device) if device.type == 'cuda' else
            f'CPU ({platform.machine()})')
    return {'torch': torch.__version__, 'python': platform.python_version(),
            'cpu': cpu_model(), 'cpu_count': os.cpu_count(),
            'num_threads': torch.get_num_threads(), 'gpus': gpus, 'device': name}


# --------------------------------------------------------------------- timing
class Timer:
    """Record multiple running times (d2l)."""

    def __init__(self):
        self.times = []
        self.start()

    def start(self):
        self.tik = time.perf_counter()

    def stop(self):
        self.times.append(time.perf_counter() - self.tik)
        return self.times[-1]

    def avg(self):
        return sum(self.times) / len(self.times)

    def sum(self):
        return sum(self.times)

    def cumsum(self):
        out, total = [], 0.0
        for t in self.times:
            total += t
            out.append(total)
        return out


@contextlib.contextmanager
def num_threads(n):
    """Run a block with `n` intra-op threads, then restore the previous count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(check_int('n', n))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def cores_per_process(world_size):
    """Intra-op threads for each of `world_size` processes sharing this machine's cores."""
    return max(1, (os.cpu_count() or 1) // world_size)


class Benchmark:
    """d2l's context manager for measuring run time, plus a device synchronisation at both ends."""

    def __init__(self, description='Done', device=None):
        self.description, self.device = description, device

    def __enter__(self):
        synchronize(self.device)
        self.timer = Timer()
        return self

    def __exit__(self, *args):
        synchronize(self.device)
        self.elapsed = self.timer.stop()
        print(f'{self.description}: {self.elapsed:.4f} sec')


@dataclass
class Measurement:
    label: str
    times: list = field(repr=False)  # seconds per call, one entry per repeat
    num_threads: int
    device: str

    @property
    def median(self):
        return stats.median(self.times)

    @property
    def spread(self):
        """(fastest, slowest) repeat, seconds per call."""
        return stats.spread(self.times)

    def __str__(self):
        return (f'{self.label}: median {format_seconds(self.median)} over {len(self.times)} '
                f'repeats (min {format_seconds(min(self.times))}, max '
                f'{format_seconds(max(self.times))}; {self.device}, {self.num_threads} threads)')


def format_seconds(s):
    """1.5e-05 -> '15 us' (three significant digits; 0.9999e-3 -> '1 ms', not '1e+03 us')."""
    return stats.format_value(s, 's')


def measure(fn, device=None, warmup=2, repeats=10, number=None, label=None, min_time=0.01):
    """Time fn(): warm up, synchronise, repeat, and report seconds per call (median of repeats).

    Each repeat runs fn `number` times; None picks a number that makes a repeat last at least
    `min_time` seconds, so that microsecond calls are not drowned by timer overhead.
    """
    check_int('warmup', warmup, minimum=0)
    check_int('repeats', repeats)
    check_int('number', number, allow_none=True)
    device = torch.device(device) if device is not None else torch.device('cpu')
    for _ in range(warmup):
        fn()
    synchronize(device)
    if number is None:
        tik = time.perf_counter()
        fn()
        synchronize(device)
        number = max(1, math.ceil(min_time / max(time.perf_counter() - tik, 1e-9)))
    times = []
    for _ in range(repeats):
        tik = time.perf_counter()
        for _ in range(number):
            fn()
        synchronize(device)
        times.append((time.perf_counter() - tik) / number)
    return Measurement(label or getattr(fn, '__name__', 'fn'), times,
                       torch.get_num_threads(), str(device))


def try_script(fn):
    """(torch.jit.script(fn), None), or (None, why) when this PyTorch cannot script it.
    TorchScript is deprecated since PyTorch 2.x; a notebook that teaches it still runs, and
    says why, the day it is gone. Its deprecation warning is left to the caller's filters."""
    try:
        return torch.jit.script(fn), None
    except Exception as e:  # removed, or unable to compile this function
        return None, f'torch.jit.script failed: {type(e).__name__}: {str(e).splitlines()[0]}'


# ---------------------------------------------------------------- GPU helpers
# What several notebooks do on a GPU, written once. Each also runs on a CPU, doing the CPU's
# equivalent or saying why it cannot, so that CI executes these lines too. The CUDA calls are
# those documented in torch.cuda: Event(enable_timing=True), Event.record(stream) and
# Event.elapsed_time (milliseconds), current_stream(device), reset_peak_memory_stats and
# max_memory_allocated(device); and torch.empty(..., pin_memory=True).
@contextlib.contextmanager
def device_timer(device=None):
    """Time the work a block queues on `device`. Yields a dict whose 'seconds' is set when the
    block ends, after that work has finished.

    On a GPU: two CUDA events recorded on the device's current stream around the block, so the
    time is the GPU's own, from the moment the stream reached the first event to the moment it
    reached the second (idle gaps included). Work on another stream counts only if the current
    stream waits for it (`torch.cuda.current_stream(device).wait_stream(other)`) before the
    block ends. On a CPU, whose operators finish before they return: the wall clock."""
    device = torch.device(device) if device is not None else try_gpu()
    timing = {}
    if device.type == 'cuda':
        stream = torch.cuda.current_stream(device)
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record(stream)
        yield timing
        end.record(stream)
        end.synchronize()
        timing['seconds'] = start.elapsed_time(end) / 1e3
    else:
        synchronize(device)
        tik = time.perf_counter()
        yield timing
        synchronize(device)
        timing['seconds'] = time.perf_counter() - tik


def pinned_buffers(count, shape, dtype=torch.float32):
    """`count` page-locked (pinned) host tensors and None, or None and the reason when pinning
    is impossible here: there is no CUDA device (pinned memory is allocated through the CUDA
    driver), or the driver refused (pinned pages cannot be swapped out, so a large request can
    fail where ordinary memory would not). After a failure the buffers made so far are freed
    to PyTorch's pinned-memory cache (torch.cuda.host_memory_stats), not to the system."""
    check_int('count', count)
    if not torch.cuda.is_available():
        return None, 'no CUDA device: page-locked host memory is allocated through CUDA'
    buffers = []
    try:
        for _ in range(count):
            buffers.append(torch.empty(shape, dtype=dtype, pin_memory=True))
    except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError too
        buffers.clear()
        return None, f'pin_memory failed: {str(e).splitlines()[0]}'
    return buffers, None


@contextlib.contextmanager
def peak_memory(device=None):
    """The most memory PyTorch had allocated on `device` during a block: yields a dict whose
    'bytes' is set when the block ends (CUDA's peak statistic, reset when the block starts).
    On a CPU PyTorch keeps no such statistic, and 'bytes' is None."""
    device = torch.device(device) if device is not None else try_gpu()
    usage = {}
    if device.type == 'cuda':
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        yield usage
        synchronize(device)
        usage['bytes'] = torch.cuda.max_memory_allocated(device)
    else:
        yield usage
        usage['bytes'] = None


# ------------------------------------------------------------------- plotting
def in_notebook():
    """Whether this code runs inside a Jupyter kernel (not merely beside an imported ipykernel,
    as in a test process that has started kernels of its own)."""
    ipython = sys.modules.get('IPython')
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, 'kernel', None) is not None


def plot(X, Y=None, xlabel=None, ylabel=None, legend=(), xlim=None, ylim=None,
         xscale='linear', yscale='linear', fmts=('-', 'm--', 'g-.', 'r:'),
         figsize=(3.5, 2.5), axes=None):
    """Plot data points (d2l's signature); returns the axes."""
    import matplotlib.pyplot as plt
    if axes is None:
        axes = plt.figure(figsize=figsize).gca()
    if Y is None:
        X, Y = [[]] * len(X), X
    elif not hasattr(Y[0], '__len__'):
        X, Y = [X], [Y]
    elif not hasattr(X[0], '__len__'):
        X = [X] * len(Y)
    for x, y, fmt in zip(X, Y, fmts * len(Y)):
        axes.plot(x, y, fmt) if len(x) else axes.plot(y, fmt)
    axes.set(xlabel=xlabel, ylabel=ylabel, xscale=xscale, yscale=yscale, xlim=xlim, ylim=ylim)
    if legend:
        axes.legend(legend)
    axes.grid(True, alpha=0.3)
    return axes


def save_fig(name, fig=None, dpi=120):
    """Save a figure as figures/<name>.png (directory overridable by COURSE_FIGURES_DIR)."""
    import matplotlib.pyplot as plt
    fig = fig or plt.gcf()
    FIGURES_DIR.mkdir(parents=True, exist_ok=True)
    path = FIGURES_DIR / f'{name}.png'
    fig.savefig(path, dpi=dpi, bbox_inches='tight')
    return path


class Animator:
    """Plot data in animation (d2l's signature). Redraws one output in place instead of
    appending a new image per point, so headless runs (nbmake, papermill) stay small."""

    def __init__(self, xlabel=None, ylabel=None, legend=(), xlim=None, ylim=None,
                 xscale='linear', yscale='linear', fmts=('-', 'm--', 'g-.', 'r:'),
                 nrows=1, ncols=1, figsize=(3.5, 2.5)):
        import matplotlib.pyplot as plt
        self.fig, axes = plt.subplots(nrows, ncols, figsize=figsize)
        self.axes = axes if nrows * ncols > 1 else [axes]
        self.config = dict(xlabel=xlabel, ylabel=ylabel, legend=legend, xlim=xlim, ylim=ylim,
                           xscale=xscale, yscale=yscale, fmts=fmts, axes=self.axes[0])
        self.X = self.Y = None
        self.handle = None
        plt.close(self.fig)  # shown through the display handle only

    def add(self, x, y):
        y = list(y) if hasattr(y, '__len__') else [y]
        x = list(x) if hasattr(x, '__len__') else [x] * len(y)
        if self.X is None:
            self.X, self.Y = [[] for _ in y], [[] for _ in y]
        for i, (a, b) in enumerate(zip(x, y)):
            if a is not None and b is not None:
                self.X[i].append(a)
                self.Y[i].append(b)
        self.axes[0].cla()
        plot(self.X, self.Y, **self.config)
        if in_notebook():
            from IPython import display
            if self.handle is None:
                self.handle = display.display(self.fig, display_id=True)
            else:
                self.handle.update(self.fig)

# ---------------------------------------------------------------------- data
# Fashion-MNIST lives in fashion_mnist.py; learners call it here, by d2l's names.
from fashion_mnist import (  # noqa: E402,F401
    DataUnavailableError,
    fashion_mnist_datasets,
    load_data_fashion_mnist,
    read_fashion_mnist,
    read_idx,
    synthetic_fashion_mnist,
)


# --------------------------------------------------------------- training
def sgd(params, lr, batch_size):
    """Minibatch stochastic gradient descent (d2l): update in place, zero the gradients."""
    with torch.no_grad():
        for param in params:
            param -= lr * param.grad / batch_size
            param.grad.zero_()


def evaluate_accuracy_gpu(net, data_iter, device=None):
    """Accuracy of `net` (a Module or any callable) on `data_iter`, computed on `device`."""
    if isinstance(net, nn.Module):
        net.eval()
        if device is None:
            device = next(iter(net.parameters())).device
    device = device if device is not None else torch.device('cpu')
    correct = total = 0
    with torch.no_grad():
        for X, y in data_iter:
            X, y = X.to(device), y.to(device)
            correct += (net(X).argmax(dim=1) == y).sum().item()
            total += y.numel()
    return correct / total


class Accumulator:
    """Sum n running totals (d2l)."""

    def __init__(self, n):
        self.data = [0.0] * n

    def add(self, *args):
        self.data = [a + float(b) for a, b in zip(self.data, args)]

    def reset(self):
        self.data = [0.0] * len(self.data)

    def __getitem__(self, idx):
        return self.data[idx]


def accuracy(y_hat, y):
    """The number of correct predictions (d2l: a count, not a fraction)."""
    if y_hat.dim() > 1 and y_hat.shape[1] > 1:
        y_hat = y_hat.argmax(dim=1)
    return float((y_hat.type(y.dtype) == y).sum())


def split_batch(X, y, devices):
    """Split X and y into len(devices) shards, one on each device (d2l 12.5, saved there).

    The book uses nn.parallel.scatter, which refuses CPU devices; tensor_split works on every
    device, and a batch that does not divide evenly gives shards that differ by at most one."""
    if X.shape[0] != y.shape[0]:
        raise ValueError(f'X has {X.shape[0]} examples but y has {y.shape[0]}')
    if X.shape[0] < len(devices):
        raise ValueError(f'a batch of {X.shape[0]} cannot feed {len(devices)} devices')
    n = len(devices)
    return ([x.to(d) for x, d in zip(X.tensor_split(n), devices)],
            [t.to(d) for t, d in zip(y.tensor_split(n), devices)])


class Residual(nn.Module):
    """The residual block of ResNet, with d2l 1.0's signature.

    Without input_channels its layers are lazy and learn their input size at the first forward
    pass, as in d2l. Give input_channels (our addition) for a module that is complete when it
    is built: DistributedDataParallel and FSDP need every parameter to exist up front."""

    def __init__(self, num_channels, use_1x1conv=False, strides=1, input_channels=None):
        super().__init__()
        lazy = input_channels is None
        conv = (lambda out, **kw: nn.LazyConv2d(out, **kw)) if lazy else (
            lambda out, i=input_channels, **kw: nn.Conv2d(i, out, **kw))
        self.conv1 = conv(num_channels, kernel_size=3, padding=1, stride=strides)
        self.conv2 = (nn.LazyConv2d(num_channels, kernel_size=3, padding=1) if lazy else
                      nn.Conv2d(num_channels, num_channels, kernel_size=3, padding=1))
        self.conv3 = conv(num_channels, kernel_size=1, stride=strides) if use_1x1conv else None
        norm = (lambda: nn.LazyBatchNorm2d()) if lazy else (lambda: nn.BatchNorm2d(num_channels))
        self.bn1, self.bn2 = norm(), norm()

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        return F.relu(Y + (self.conv3(X) if self.conv3 is not None else X))


def resnet18(num_classes, in_channels=1, width=64):
    """The chapter's slightly modified ResNet-18 (3x3 stem, no max-pool: for 28x28 images), with
    d2l's module names. `width` (our addition) is the channels of the first stage; the stages
    have width, 2 width, 4 width and 8 width channels, so compute grows with width squared.
    Every layer is built complete (no lazy modules), as DistributedDataParallel needs."""
    check_int('width', width)

    def resnet_block(in_c, out_c, num_residuals, first_block=False):
        blocks = []
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blocks.append(Residual(out_c, use_1x1conv=True, strides=2, input_channels=in_c))
            else:
                blocks.append(Residual(out_c, input_channels=out_c if i or first_block
                                       else in_c))
        return nn.Sequential(*blocks)

    net = nn.Sequential(nn.Conv2d(in_channels, width, kernel_size=3, stride=1, padding=1),
                        nn.BatchNorm2d(width), nn.ReLU())
    net.add_module('resnet_block1', resnet_block(width, width, 2, first_block=True))
    net.add_module('resnet_block2', resnet_block(width, 2 * width, 2))
    net.add_module('resnet_block3', resnet_block(2 * width, 4 * width, 2))
    net.add_module('resnet_block4', resnet_block(4 * width, 8 * width, 2))
    net.add_module('global_avg_pool', nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module('fc', nn.Sequential(nn.Flatten(), nn.Linear(8 * width, num_classes)))
    return net


# ------------------------------------------------------------------ results
from results import _jsonable, record  # noqa: E402,F401  (d2l.record, as notebooks call it)


# ------------------------------------------------------------- timing in turns
def measure_in_turns(functions, device=None, warmup=1, repeats=5, min_time=0.0):
    """{name: Measurement} of each function in `functions` (a dict name -> fn), timed in turns:
    every round times each function once, so that a machine that grows busier or quieter
    during the measurement slows them all alike, and the noise rule (stats.compare) sets like
    beside like. A timing synchronises `device` at both ends, as `measure` does, and runs its
    function `number` times, chosen per function so that a timing lasts at least `min_time`
    seconds (0: once). Each Measurement's times are seconds per call, one per round."""
    check_int('warmup', warmup, minimum=0)
    check_int('repeats', repeats)
    if not functions:
        raise ValueError('measure_in_turns needs at least one function to time')
    device = torch.device(device) if device is not None else torch.device('cpu')

    def timed(fn, number):
        synchronize(device)
        tik = time.perf_counter()
        for _ in range(number):
            fn()
        synchronize(device)
        return (time.perf_counter() - tik) / number

    numbers = {}
    for name, fn in functions.items():
        for _ in range(warmup):
            fn()
        numbers[name] = max(1, math.ceil(min_time / max(timed(fn, 1), 1e-9))) if min_time else 1
    times = {name: [] for name in functions}
    for _ in range(repeats):
        for name, fn in functions.items():
            times[name].append(timed(fn, numbers[name]))
    return {name: Measurement(name, ts, torch.get_num_threads(), str(device))
            for name, ts in times.items()}


def cores_busy(fn, seconds=0.1):
    """How many cores this process kept busy, on average, while it called fn() over and over
    for about `seconds`: its CPU time (all its threads) over the wall time. About 1 for work
    on one thread, and for threads that take turns (Python's GIL); about k for k threads that
    really run at once; below 1 for work that waits (a sleep, I/O, another device)."""
    check_positive('seconds', seconds)
    cpu, tik = time.process_time(), time.perf_counter()
    while True:
        fn()
        wall = time.perf_counter() - tik
        if wall >= seconds:
            return (time.process_time() - cpu) / wall
