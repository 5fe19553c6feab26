"""Defaults sized to the machine that runs a notebook (a parameter left at None).

Every notebook promises to finish within a time budget wherever it runs: about a minute on a
laptop CPU (60 s for notebooks 01-04, 90 s for 05-08) and about five minutes on a GPU, from a
Colab T4 to an H100. It keeps that promise by measuring the machine briefly (`probe`: a
matrix-multiply throughput test of each device and the memory there is) and asking its plan
function here what to run: `plan_06(machine, ...)` returns the sizes, an estimate of the time
and memory they need, and one sentence saying why they were chosen. The book's full scale is
always one parameter away.

The plans take a `Machine`, so tests can plan for machines that are not there:
`DESCRIBED['colab-t4']` and `DESCRIBED['h100']` describe the GPUs learners use, and the tests
check every plan against their time and memory budgets on a CPU-only machine.
"""
import contextlib
import dataclasses
import functools
import io
import math
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

import hardware
import helpers
import launch

BUDGET_S = {'cpu': {'01': 60, '02': 60, '03': 60, '04': 60, '05': 90, '06': 90, '07': 90,
                    '08': 90, '09': 90},
            'cuda': 300}


def budget(notebook, machine):
    """Seconds the notebook may take on `machine`."""
    return BUDGET_S['cuda'] if machine.kind == 'cuda' else BUDGET_S['cpu'][notebook]


@dataclass(frozen=True)
class Machine:
    """What a plan sizes its workload by: the device that computes and the host around it."""
    name: str
    kind: str                  # 'cpu' or 'cuda': where the notebook's main work runs
    flops: float               # fp32 matrix-multiply FLOP/s of that device (measured or stated)
    memory: int                # bytes that device can hold (GPU memory; host RAM for a CPU)
    host_flops: float          # the host CPU's fp32 matmul FLOP/s, for work kept on the CPU
    host_memory: int           # host RAM, bytes
    host_cores: int
    gpus: int = 0
    compute_capability: tuple = ()  # (major, minor) of the slowest GPU; () on a CPU
    gpu_flops: tuple = ()           # each GPU's rate; `flops` is the slowest, which paces a
                                    # synchronous step on several (an H100 beside a T4)

    @property
    def on_gpu(self):
        return self.kind == 'cuda'

    def __str__(self):
        gb = lambda b: f'{b / 1e9:.1f} GB'
        device = (f'{self.name}: {self.flops / 1e12:.1f} TFLOP/s fp32, {gb(self.memory)}'
                  if self.on_gpu else f'{self.name}: {self.flops / 1e9:.0f} GFLOP/s fp32')
        return (f'{device}; host {self.host_cores} cores, {self.host_flops / 1e9:.0f} GFLOP/s, '
                f'{gb(self.host_memory)} RAM')


# Machines described rather than measured, for planning and for tests without the hardware.
# The GPU rates are sustained fp32 matrix-multiply rates, not the data-sheet peaks: a T4 is
# rated 8.1 TFLOP/s but holds about 4.5 at its 70 W limit; an H100 SXM is rated 67.
DESCRIBED = {
    'colab-t4': Machine('Tesla T4 (Colab)', 'cuda', flops=4.5e12, memory=15 * 10**9,
                        host_flops=5e10, host_memory=int(12.7e9), host_cores=2, gpus=1,
                        compute_capability=(7, 5)),
    'h100': Machine('NVIDIA H100 80GB HBM3', 'cuda', flops=5e13, memory=80 * 10**9,
                    host_flops=1e12, host_memory=128 * 2**30, host_cores=16, gpus=1,
                    compute_capability=(9, 0)),
    'cpu-2core': Machine('2-core CPU', 'cpu', flops=1.3e11, memory=24 * 2**30,
                         host_flops=1.3e11, host_memory=24 * 2**30, host_cores=2),
}


def sustained_flops(gpu_name):
    """The sustained fp32 rate DESCRIBED gives for a GPU of that name (inf if none): a probe
    of a fraction of a second may still catch a boost clock the card cannot hold."""
    for machine in DESCRIBED.values():
        model = machine.name.split(' (')[0].replace('NVIDIA ', '').replace('Tesla ', '')
        if machine.on_gpu and model and model in gpu_name:
            return machine.flops
    return math.inf


def _host_memory():
    """Physical RAM, or the container's limit when that is lower."""
    total = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    try:
        limit = open('/sys/fs/cgroup/memory.max').read().strip()
        if limit.isdigit():
            total = min(total, int(limit))
    except OSError:
        pass
    return total


def _matmul_flops(device, n, seconds, windows=5, warmup_s=0.0):
    """fp32 n x n matrix products per second on `device`, times 2 n^3: the best of several
    short windows, so that a moment of other work on the machine does not size the notebook.
    warmup_s of products first: a GPU starts at its boost clock and slows to the clock it can
    sustain within its power limit (a T4 within about a second)."""
    a = torch.randn(n, n, device=device)
    a @ a  # warm-up: library initialisation, caches, clocks
    tik = time.perf_counter()
    while time.perf_counter() - tik < warmup_s:
        a @ a
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
    best = 0.0
    for _ in range(windows):
        if device.type == 'cuda':
            torch.cuda.synchronize(device)
        count, tik = 0, time.perf_counter()
        while True:
            a @ a
            count += 1
            if device.type == 'cuda':
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - tik
            if elapsed >= seconds / windows:
                best = max(best, 2 * n**3 * count / elapsed)
                break
    return best


class _no_tf32:
    """Measure plain fp32: TF32 would report a tensor-core rate no fp32 layer gets.
    set_float32_matmul_precision sets torch's old and new TF32 settings together (mixing
    them raises), and reading the old `allow_tf32` flag warns on torch 2.9."""

    def __enter__(self):
        self.previous = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision('highest')

    def __exit__(self, *args):
        torch.set_float32_matmul_precision(self.previous)


@functools.lru_cache(maxsize=None)
def probe(seconds=0.15):
    """Measure this machine (about 2.5 x `seconds`, plus about 0.65 s a GPU): the Machine every
    plan here takes. With several GPUs it is planned as k of the slowest."""
    host_flops = _matmul_flops(torch.device('cpu'), 512, seconds)
    # intra-op threads that wait for a core another program holds can run slower than one
    with helpers.num_threads(1):
        single = _matmul_flops(torch.device('cpu'), 512, seconds / 2)
    host_flops = max(host_flops, single)
    host = dict(host_flops=host_flops, host_memory=_host_memory(),
                host_cores=os.cpu_count() or 1)
    if torch.cuda.is_available():
        rates = []
        with _no_tf32():
            for i in range(torch.cuda.device_count()):
                props = torch.cuda.get_device_properties(i)
                rate = _matmul_flops(torch.device(f'cuda:{i}'), 4096, seconds, warmup_s=0.5)
                rates.append((min(rate, sustained_flops(props.name)), props))
        flops, props = min(rates, key=lambda r: r[0])
        return Machine(props.name, 'cuda', flops=flops,
                       memory=min(p.total_memory for _, p in rates), gpus=len(rates),
                       compute_capability=(props.major, props.minor),
                       gpu_flops=tuple(r for r, _ in rates), **host)
    return Machine(f'CPU ({os.cpu_count()} cores)', 'cpu', flops=host_flops,
                   memory=host['host_memory'], **host)


@dataclass
class Plan:
    """Defaults chosen for a machine, with the estimate that chose them."""
    values: dict
    seconds: float                 # estimated time of the notebook's sized work on that machine
    device_bytes: int = 0          # estimated peak memory on the computing device
    host_bytes: int = 0            # estimated peak host memory
    why: str = ''
    notes: list = field(default_factory=list)

    def __getitem__(self, name):
        return self.values[name]

    def __str__(self):
        chosen = ', '.join(f'{k}={v}' for k, v in self.values.items())
        return (f'chosen for this machine: {chosen} (about {self.seconds:.0f} s of work). '
                f'{self.why}').strip()


def largest_fitting(candidates, seconds, limit_s, bytes_needed=None, limit_bytes=math.inf):
    """The first of `candidates` (largest first) whose seconds(c) fits `limit_s` and whose
    bytes_needed(c) fits `limit_bytes`; the last one when none does."""
    for c in candidates:
        if seconds(c) <= limit_s and (bytes_needed is None or bytes_needed(c) <= limit_bytes):
            return c
    return candidates[-1]


class Setup:
    """What a notebook's setup cell resolved: every parameter's final value (as attributes:
    `cfg.chain_numel`), the machine, the plan, and `why`, the few lines it prints. Each
    notebook has one `setup_NN(...)` below, beside its plan: it checks every parameter first
    (a ValueError naming the culprit, before any work), then probes the machine, sizes the
    work and picks the devices."""

    def __init__(self, why, **values):
        self.__dict__.update(values)
        self.why = list(why)

    def __str__(self):
        return '\n'.join(self.why)


def on_device(machine, device):
    """`machine` as the plans should see it when the notebook runs on `device`: a GPU machine
    asked to run on its CPU is planned as a CPU; one that runs on one of several GPUs is
    planned as that GPU (probe() describes the slowest, which paces work on all of them)."""
    if machine.on_gpu and device.type != 'cuda':
        return dataclasses.replace(machine, kind='cpu', flops=machine.host_flops,
                                   memory=machine.host_memory, name=f'CPU ({machine.host_cores} '
                                   'cores)', gpus=0, compute_capability=(), gpu_flops=())
    if machine.on_gpu and machine.gpu_flops and device.type == 'cuda':
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return dataclasses.replace(machine, name=props.name, flops=machine.gpu_flops[index],
                                   memory=props.total_memory,
                                   compute_capability=(props.major, props.minor))
    return machine


# ---------------------------------------------------------------------- one plan per notebook
# Each plan_NN(machine, ...) returns a Plan whose values fill the notebook's None parameters.


# ------------------------------------------------------------------------- notebooks 01 to 03
LAUNCH_S = 10e-6                # issuing one operator from Python to a GPU (t1), about
HOST_COPY_BYTES_S = 5e9         # a slow host's single-core memory copy, bytes per second
GPU_BYTES_S = 250e9             # a T4-class GPU's memory bandwidth (faster GPUs: more)


def plan_01(machine, chain_length=16, repeats=7):
    """Notebook 01: the MLP batch sizes and the size of the elementwise chain.

    The notebook's time goes mostly to inductor's compilations (about seventeen; on a 2-core CPU
    the first about 10 s from scratch, each later one 1-2 s from scratch and under 0.1 s from a
    warm cache; Triton's on a GPU take longer), which no size changes: the estimate charges
    them together as one first compile and six later ones, about their cost from scratch.
    The chain is the one sized workload: its eager run moves 3 x chain_length x 2 passes over
    the tensor, timed `repeats` times in three modes, at the exercise's lengths too.
    On a GPU it is 2**26 elements (256 MB), large enough that launches do not hide fusion;
    on a CPU 2**22 (16 MB), a few milliseconds a pass."""
    first_compile_s, compile_s = (30.0, 15.0) if machine.on_gpu else (12.0, 3.0)  # cold caches
    bandwidth = GPU_BYTES_S if machine.on_gpu else HOST_COPY_BYTES_S

    def seconds(numel):
        eager_call = 3 * chain_length * 2 * 4 * numel / bandwidth
        timed = 3 * (2 + repeats) * 2 * eager_call          # three modes; measure() doubles up
        exercise = 3 * (2 + repeats) * 2 * 6 * 2 * 4 * min(numel, 2**20) / bandwidth
        return first_compile_s + 6 * compile_s + timed + exercise

    candidates = [2**26, 2**24, 2**22] if machine.on_gpu else [2**22, 2**20, 2**18]
    numel = largest_fitting(candidates, seconds, 0.8 * budget('01', machine),
                            lambda n: 4 * 4 * n, 0.25 * machine.memory)
    why = (f'The elementwise chain gets {numel:,} elements ({4 * numel / 2**20:.0f} MiB): '
           + ('large enough that kernel launches do not hide what fusion saves.'
              if machine.on_gpu else
              'a few milliseconds a pass on a CPU; chain_numel=67108864 is the GPU size.')
           + ' The MLP is timed at the book\'s batch 1 and at batch 256.')
    return Plan({'mlp_batch_sizes': [1, 256], 'chain_numel': numel}, seconds(numel),
                device_bytes=4 * 4 * numel, host_bytes=4 * 4 * numel if not machine.on_gpu
                else 0, why=why)


def setup_01(device=None, mlp_batch_sizes=None, chain_numel=None, chain_length=16, repeats=7):
    """Notebook 01's setup: every parameter checked (a ValueError naming it), then the device
    and the sizes chosen for this machine (plan_01)."""
    dev = helpers.check_device('device', device)
    if mlp_batch_sizes is not None:
        mlp_batch_sizes = sorted(set(helpers.check_list('mlp_batch_sizes', mlp_batch_sizes,
                                                        helpers.check_int)))
        if not mlp_batch_sizes:
            raise ValueError('mlp_batch_sizes is empty: give at least one batch size, e.g. '
                             '[1, 256]')
    helpers.check_int('chain_numel', chain_numel, allow_none=True)
    helpers.check_int('chain_length', chain_length)
    helpers.check_int('repeats', repeats)
    machine = on_device(probe(), dev)
    plan = plan_01(machine, chain_length, repeats)
    env = helpers.environment(dev)
    sized = mlp_batch_sizes is None or chain_numel is None
    why = [f'Device: {dev} ({env["device"]}); torch {env["torch"]}; '
           f'{env["num_threads"]} CPU threads.',
           f'Measured: {machine}.',
           str(plan) if sized else 'Every size was given as a parameter.']
    return Setup(why, device=dev, env=env, machine=machine, chain_length=chain_length,
                 repeats=repeats, mlp_batch_sizes=mlp_batch_sizes or plan['mlp_batch_sizes'],
                 chain_numel=chain_numel or plan['chain_numel'])


def plan_02(machine, matrix_size=1000, num_matmuls=10, queue_lengths=None):
    """Notebook 02: the size of the cost model's small products, and the temporaries of the
    queue experiment.

    The cost model separates issuing an operator (t1, about LAUNCH_S on a GPU) from running it
    (t2). On a GPU the product is sized so that t2 is at least four launches: then the backend
    is the slower side, as the chapter's model n t2 > (n - 1) t1 assumes, and what waiting at
    every step costs is visible. On a CPU operators are synchronous, so no size makes the
    frontend run ahead; 32 x 32 keeps the loop cheap. The queue experiment's temporaries are
    64 MB on a GPU (enough to show in peak memory) and 1 MB on a CPU, where nothing queues."""
    lengths = list(queue_lengths or [2**k for k in range(9)])
    if machine.on_gpu:
        small = next(n for n in (64, 128, 256, 512, 1024, 2048)
                     if 2 * n**3 / machine.flops >= 4 * LAUNCH_S or n == 2048)
        queue_numel, per_op = 2**24, lambda n: max(LAUNCH_S, 2 * n**3 / machine.flops)
    else:
        small, queue_numel = 32, 2**18
        per_op = lambda n: 5e-6 + 2 * n**3 / machine.flops
    host_rate = machine.host_flops
    loop = num_matmuls * 2 * matrix_size**3
    frontend = 4 * (loop / machine.flops + loop / host_rate) + 2 * 4 * matrix_size**2 / 1e8
    blockers = 8 * 12 * 0.01 + (8 * 3 * loop / machine.flops if machine.on_gpu else 0)
    cost_model = 2 * len(lengths) * 7 * max(0.01, 2 * sum(lengths) * per_op(small) / len(lengths))
    # 31 rounds of both modes, 8 steps each, about 13 passes over a temporary of 4-byte floats
    queue = 62 * 8 * queue_numel * 13 * 4 / (GPU_BYTES_S if machine.on_gpu else HOST_COPY_BYTES_S)
    exercise_2 = 2 * 3 * (num_matmuls + 1) * 2 * matrix_size**3 / machine.flops
    fixed = 6.0  # futures, the pipeline demo, the profiler: fixed work on the host CPU
    seconds = frontend + blockers + cost_model + queue + exercise_2 + fixed
    why = (f'{small}x{small} products for the cost model: '
           + (f'about {2 * small**3 / machine.flops * 1e6:.0f} us of GPU work each, several '
              'launches\' worth, so that the backend is the slower side.' if machine.on_gpu else
              'a CPU runs them synchronously, so their size changes nothing the model shows.')
           + f' Temporaries of {4 * queue_numel / 2**20:.0f} MiB in the queue experiment.')
    return Plan({'small_size': small, 'queue_numel': queue_numel}, seconds,
                device_bytes=4 * (3 * matrix_size**2 + 4 * queue_numel * 8 * 2),
                host_bytes=4 * 3 * matrix_size**2 * 2, why=why)

MECHANISMS_02_03 = ('auto', 'threads')  # how notebooks 02 and 03 run work on two threads


def _scriptable(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def parallel_mechanism(mechanism):
    """(use TorchScript's fork, the sentence saying how work runs on two threads) for
    mechanism 'auto' (TorchScript's futures beside Python threads, where this PyTorch still
    scripts without a warning Python shows by default; deprecated since 2.x, it warns with a
    FutureWarning from 2.15) or 'threads' (Python threads only)."""

    if mechanism == 'threads':
        return False, ("Two threads: Python threads only (mechanism='threads'); TorchScript is "
                       'not used.')
    present = all(hasattr(torch.jit, name) for name in ('script', 'fork', 'wait'))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        scripts = present and helpers.try_script(_scriptable)[0] is not None
    loud = [w for w in caught if not issubclass(w.category, (DeprecationWarning,
                                                             PendingDeprecationWarning))]
    if not scripts:
        return False, ('Two threads: Python threads only; this PyTorch cannot script '
                       '(mechanism=\'auto\' falls back to threads).')
    if loud:
        return False, ('Two threads: Python threads only; this PyTorch warns that TorchScript '
                       f'is deprecated ({loud[0].category.__name__}), so mechanism=\'auto\' '
                       'falls back to threads.')
    return True, ("Two threads: Python threads, and TorchScript's futures beside them where "
                  "this PyTorch can still script the functions (mechanism='auto'; TorchScript "
                  "is deprecated: mechanism='threads' leaves it out).")


def setup_02(*, device=None, matrix_size=1000, num_matmuls=10, queue_lengths=None,
             small_size=None, queue_numel=None, prep_ms=15, num_batches=12, profile_steps=5,
             mechanism='auto', trace_dir=None):
    """Notebook 02's setup: every parameter checked (a ValueError naming it), then the device,
    the sizes chosen for this machine (plan_02), and how the futures run (mechanism)."""

    dev = helpers.check_device('device', device)
    for name, value in (('matrix_size', matrix_size), ('num_matmuls', num_matmuls),
                        ('num_batches', num_batches), ('profile_steps', profile_steps)):
        helpers.check_int(name, value)
    if num_batches < 2:
        raise ValueError(f'num_batches={num_batches} must be at least 2: one batch leaves the '
                         'pipeline nothing to overlap')
    helpers.check_int('small_size', small_size, allow_none=True)
    helpers.check_int('queue_numel', queue_numel, allow_none=True)
    helpers.check_positive('prep_ms', prep_ms)
    helpers.check_choice('mechanism', mechanism, MECHANISMS_02_03)
    lengths = sorted(set(helpers.check_list(
        'queue_lengths', [2**k for k in range(9)] if queue_lengths is None else queue_lengths,
        helpers.check_int)))
    if len(lengths) < 2:
        raise ValueError(f'queue_lengths={lengths} needs at least two different loop lengths '
                         'to fit a line, for example [1, 16, 256]')
    machine = on_device(probe(), dev)
    plan = plan_02(machine, matrix_size, num_matmuls, lengths)
    env = helpers.environment(dev)
    use_script, how = parallel_mechanism(mechanism)
    why = [f'Device: {dev} ({env["device"]}); torch {env["torch"]}; '
           f'{env["num_threads"]} CPU threads.',
           f'Measured: {machine}.',
           str(plan) if small_size is None or queue_numel is None else
           'Every size was given as a parameter.', how]
    if dev.type != 'cuda':
        why.append('No GPU in use: each CUDA experiment runs its CPU branch, which measures '
                   'what a CPU does instead.')
    return Setup(why, device=dev, on_cuda=dev.type == 'cuda', env=env, machine=machine,
                 plan=plan, matrix_size=matrix_size, num_matmuls=num_matmuls,
                 queue_lengths=lengths, small_size=small_size or plan['small_size'],
                 queue_numel=queue_numel or plan['queue_numel'], prep_ms=prep_ms,
                 num_batches=num_batches, profile_steps=profile_steps, mechanism=mechanism,
                 use_script=use_script,
                 trace_dir=Path(trace_dir) if trace_dir is not None else helpers.TRACES_DIR)


BOOK_03_SIZE = 4000
CPU_COPY_SIZE_03 = 1024         # results of 4 MiB: copies run from memory, not from cache
LANE_RUNS_03 = 26               # runs of `run` per lane: alone, together, baselines, exercise 1
COPY_RUNS_03 = 40               # runs of the copy_steps loop: 4 variants x 6, book, exercises
HOST_SHARE_03 = 0.3             # at most this share of host RAM for the copies' host buffers


def plan_03(machine, num_matmuls=50):
    """Notebook 03: the products' sizes on each lane, and the overlap experiment's copies.

    matrix_size: n of the products on a GPU lane, the book's 4000 where a run of `run` (50
      products) takes at most 5 s; on a CPU-only machine the largest n whose lanes (one
      thread each, LANE_RUNS_03 runs) fit an eighth of the notebook's budget.
    cpu_matrix_size: on a machine with one GPU the CPU is the second lane: sized so that it
      takes about as long as the GPU lane (at 4000 a CPU lane would take 20-30 minutes on
      Colab's two cores), which makes the ideal speedup of running both about 2x.
    copy_size, copy_steps: the n x n results computed and copied in the overlap experiment,
      and how many. Pinned destinations for all of them, and the pinned memory the book's
      `y.to('cpu', non_blocking=True)` allocates (which PyTorch's host allocator keeps cached),
      must fit HOST_SHARE_03 of host RAM (Colab: 12.7 GB)."""
    product = lambda n, rate: 2 * n**3 / rate
    core = machine.host_flops / machine.host_cores
    if machine.on_gpu:
        size = largest_fitting([BOOK_03_SIZE, 3072, 2048, 1024],
                               lambda n: num_matmuls * product(n, machine.flops), 5.0)
        gpu_run = num_matmuls * product(size, machine.flops)
        cpu_size = max(64, round((gpu_run * machine.host_flops / (num_matmuls * 2)) ** (1 / 3)
                                 / 64) * 64)
        copy_size = size
        lane_s = LANE_RUNS_03 * gpu_run
        step_s = product(copy_size, machine.flops) + 4 * copy_size**2 / 10e9  # PCIe: 10 GB/s
    else:
        lane_s = lambda n: LANE_RUNS_03 * num_matmuls * product(n, core)
        size = largest_fitting([768, 640, 512, 448, 384, 320, 256, 192, 128], lane_s,
                               budget('03', machine) / 8)
        cpu_size, copy_size, lane_s = size, CPU_COPY_SIZE_03, lane_s(size)
        step_s = 3 * 4 * copy_size**2 / HOST_COPY_BYTES_S  # copy plus a rank-k product
    result_bytes = 4 * copy_size**2
    cpu_lane_bytes = num_matmuls * 4 * cpu_size**2
    host = lambda steps: 2 * steps * result_bytes + cpu_lane_bytes + 2**30  # + torch itself
    copy_steps = largest_fitting([50, 40, 30, 20, 10], lambda s: 0, 1, host,
                                 HOST_SHARE_03 * machine.host_memory)
    seconds = lane_s + COPY_RUNS_03 * copy_steps * step_s + 4.0
    # a GPU lane holds two runs' results (exercise 1), and the copies' results twice (the
    # book's call allocates its own); the notebook refuses more than 80% of the GPU's memory
    device_bytes = (4 * (2 * num_matmuls * size**2 + 2 * copy_steps * copy_size**2)
                    if machine.on_gpu else 0)
    why = ((f'GPU lanes at n={size}' + (' (the book\'s size)' if size == BOOK_03_SIZE else '')
            + f', a CPU lane at n={cpu_size}, sized to take about as long as a GPU lane; '
            f'{copy_steps} results of {result_bytes / 2**20:.0f} MiB computed and copied, so '
            f'that their host buffers fit {HOST_SHARE_03:.0%} of host RAM. copy_steps=50 copies '
            'the book\'s 50 results; cpu_matrix_size=4000 gives the CPU lane the book\'s size '
            '(minutes per run on a few cores).') if machine.on_gpu else
           (f'Lanes of n={size}, one thread each, fit an eighth of the notebook\'s budget at this '
            f'CPU\'s measured rate; matrix_size=4000 is the book\'s (a GPU\'s) size. '
            f'{copy_steps} results of {result_bytes / 2**20:.0f} MiB are copied.'))
    return Plan({'matrix_size': size, 'cpu_matrix_size': cpu_size, 'copy_size': copy_size,
                 'copy_steps': copy_steps}, seconds, device_bytes=device_bytes,
                host_bytes=host(copy_steps), why=why)

def setup_03(*, matrix_size=None, cpu_matrix_size=None, num_matmuls=50, copy_size=None,
             copy_steps=None, copy_inner_dim=None, mechanism='auto'):
    """Notebook 03's setup: every parameter checked (a ValueError naming it), then the sizes
    planned for this machine (plan_03), checked against its host and GPU memory, and the two
    lanes independent work runs on: two GPUs, one GPU and the CPU, or two CPU threads."""
    for name, value in (('matrix_size', matrix_size), ('cpu_matrix_size', cpu_matrix_size),
                        ('copy_size', copy_size), ('copy_steps', copy_steps),
                        ('copy_inner_dim', copy_inner_dim)):
        helpers.check_int(name, value, allow_none=True)
    helpers.check_int('num_matmuls', num_matmuls)
    helpers.check_choice('mechanism', mechanism, MECHANISMS_02_03)

    def check_inner_dim(size):
        if copy_inner_dim is not None and copy_inner_dim > size:
            raise ValueError(f'copy_inner_dim={copy_inner_dim} is larger than copy_size={size}: '
                             'the inner dimension of an n x k times k x n product is at most n')
    if copy_size is not None:
        check_inner_dim(copy_size)
    machine = probe()
    plan = plan_03(machine, num_matmuls)
    sizes = {name: given or plan[name] for name, given in (
        ('matrix_size', matrix_size), ('cpu_matrix_size', cpu_matrix_size),
        ('copy_size', copy_size), ('copy_steps', copy_steps))}
    check_inner_dim(sizes['copy_size'])
    n, steps = sizes['copy_size'], sizes['copy_steps']
    host_bytes = 2 * steps * 4 * n**2  # host buffers, and the pinned memory the book's call makes
    if host_bytes > 0.6 * machine.host_memory:
        raise ValueError(f'copy_steps={steps} results of copy_size={n} need '
                         f'{host_bytes / 1e9:.1f} GB of host memory, more than 60% of the '
                         f'{machine.host_memory / 1e9:.1f} GB here: use fewer or smaller results')
    if machine.on_gpu:  # a GPU lane holds two runs' results (exercise 1), and two sets of copies
        gpu_bytes = 4 * (2 * num_matmuls * sizes['matrix_size']**2 + 2 * steps * n**2)
        if gpu_bytes > 0.8 * machine.memory:
            raise ValueError(f'matrix_size={sizes["matrix_size"]}, num_matmuls={num_matmuls}, '
                             f'copy_size={n} and copy_steps={steps} need {gpu_bytes / 1e9:.1f} '
                             f'GB on the GPU, more than 80% of its {machine.memory / 1e9:.1f} '
                             'GB: use smaller or fewer products')
    gpus = [d for d in helpers.try_all_gpus() if d.type == 'cuda']
    cpu = torch.device('cpu')
    scenario, lanes = (('two GPUs', gpus[:2]) if len(gpus) >= 2 else
                       ('one GPU and the CPU', [gpus[0], cpu]) if gpus else
                       ('two CPU threads', [cpu, cpu]))
    lane_sizes = [sizes['cpu_matrix_size'] if d.type == 'cpu' and gpus else
                  sizes['matrix_size'] for d in lanes]
    env = helpers.environment()
    use_script, how = parallel_mechanism(mechanism)
    why = [f'Measured: {machine}.',
           str(plan) if None in (matrix_size, cpu_matrix_size, copy_size, copy_steps) else
           'Every size was given as a parameter.',
           f'{len(gpus)} GPU(s), {env["cpu_count"]} CPU cores: independent work runs on '
           f'{scenario} (products of n = {" and ".join(map(str, lane_sizes))}).', how]
    return Setup(why, machine=machine, plan=plan, num_matmuls=num_matmuls,
                 copy_inner_dim=copy_inner_dim, mechanism=mechanism, use_script=use_script,
                 gpus=gpus, scenario=scenario, lanes=lanes, lane_sizes=lane_sizes,
                 threads=torch.get_num_threads(), env=env, **sizes)


# ------------------------------------------------------------------------------- notebook 04
# Matrix products are sized per precision from a short probe of each (a small product), because
# rates differ by up to 100x on one machine: a CPU without bf16 instructions emulates bf16
# matmul about a hundred times slower than fp32, so one size for all precisions fits no budget.
MATMUL_SIZES_04 = (8192, 6144, 4096, 3072, 2048, 1536, 1024, 768, 512, 384, 256, 128)
MATMUL_CALL_S_04 = {'cpu': 0.25, 'cuda': 1.0}   # longest single product per precision
MATMUL_BOOK_04 = {'cpu': 2048, 'cuda': 8192}    # the sizes the notebook used before it was sized
DEPENDENT_READS_04 = 2**20                      # pointer-chasing steps per working set
EXERCISE_MB_04 = 256       # the exercises' slice of the bandwidth buffer (strides, direction)
CPU_FIXED_S_04 = 14        # what no parameter sizes on a CPU: imports, the machine probe,
                           # vectorisation, latency table, storage, precision demo, the
                           # exercises' slices, plots (measured on 2 cores: about 10 s)
DTYPES_04 = {'float64': torch.float64, 'float32': torch.float32, 'tf32': torch.float32,
             'bfloat16': torch.bfloat16, 'float16': torch.float16}


def precisions_04(machine):
    """The matrix-multiply precisions notebook 04 measures on `machine`, and why any are left
    out: below compute capability 8.0 (a T4 is 7.5) a GPU has no TF32, so a 'tf32' row would be
    fp32 measured twice, and no bf16 tensor cores, so bf16 would not be what the row claims."""
    if not machine.on_gpu:
        return ['float32', 'float64', 'bfloat16', 'float16'], ''
    if tuple(machine.compute_capability) >= (8, 0):
        return ['float64', 'float32', 'tf32', 'bfloat16', 'float16'], ''
    cc = '.'.join(map(str, machine.compute_capability)) or 'unknown'
    return ['float64', 'float32', 'float16'], (
        f'tf32 and bfloat16 are skipped: both need tensor cores of compute capability 8.0 or '
        f'newer, and this GPU has {cc} (tf32 would run as fp32, bf16 without tensor cores).')


def plan_04(machine, matmul_flops=None, llc_bytes=None, gpu_l2_bytes=None, repeats=3):
    """Notebook 04: matrix sizes per precision, the buffers of the memory measurements, and the
    thread counts of the scaling sweep.

    matmul_flops: {precision: FLOP/s} from a short probe of each precision; None assumes the
      fp32 rate of `machine` for every precision (fp64 at 1/32 of it on a GPU, as on a T4).
    llc_bytes: the host's last-level cache (None: 32 MiB). Bandwidth buffers and the largest
      working set of the cache curves are at least 4 times it, so that they measure DRAM.
    gpu_l2_bytes: the GPU's L2 cache; its bandwidth buffer is at least 4 times that too."""
    kind = 'cuda' if machine.on_gpu else 'cpu'
    names, skipped = precisions_04(machine)
    rates = {p: machine.flops / (32 if machine.on_gpu and p == 'float64' else 1) for p in names}
    rates.update({p: r for p, r in (matmul_flops or {}).items() if p in rates})
    if min(rates.values()) <= 0:
        raise ValueError(f'matmul_flops must be positive, got {matmul_flops}')
    call_s, calls = MATMUL_CALL_S_04[kind], 1 + repeats
    largest = MATMUL_BOOK_04[kind]
    product_s = lambda n, rate: 2 * n**3 / rate
    sizes = {p: largest_fitting([n for n in MATMUL_SIZES_04 if n <= largest],
                                lambda n, r=rate: product_s(n, r), call_s)
             for p, rate in rates.items()}
    # the thread sweep runs fp32 on the host CPU, from one core (its rate: 1/cores of all)
    one_core = machine.host_flops / machine.host_cores
    sweep_n = largest_fitting([n for n in MATMUL_SIZES_04 if n <= MATMUL_BOOK_04['cpu']],
                              lambda n: product_s(n, one_core), MATMUL_CALL_S_04['cpu'])
    threads = sorted({2**k for k in range(8) if 2**k < machine.host_cores} | {machine.host_cores})
    llc = llc_bytes or 32 * 2**20
    pow2_mib = lambda b: 2 ** math.ceil(math.log2(max(b, 2**20) / 2**20))
    working_set_mb = pow2_mib(4 * llc)
    bandwidth_mb = max(pow2_mib(4 * llc), 64)
    if machine.on_gpu:
        bandwidth_mb = max(bandwidth_mb, pow2_mib(4 * (gpu_l2_bytes or 50 * 2**20)), 1024)

    bw, ws = bandwidth_mb * 2**20, working_set_mb * 2**20
    host_gbs = 10e9        # a slow host's DRAM; filling buffers with random numbers: 1 GB/s
    matmul = sum(calls * product_s(n, rates[p]) for p, n in sizes.items())
    sweep = sum(calls * product_s(sweep_n, one_core * t) for t in threads)
    memory = (bw + ws) / 1e9 + (30 * bw + 40 * ws) / host_gbs
    dependent = DEPENDENT_READS_04 * 150e-9 * math.log2(ws / llc) + 0.5  # beyond the LLC
    bus = 8 * repeats * bw / 3e9 if machine.on_gpu else 0   # pageable copies: about 3 GB/s
    fixed = CPU_FIXED_S_04 * (1.3e11 / machine.host_flops) ** 0.5
    seconds = matmul + sweep + memory + dependent + bus + fixed
    element = {'float64': 8, 'float32': 4, 'tf32': 4, 'bfloat16': 2, 'float16': 2}
    device_bytes = (max(3 * n * n * element[p] for p, n in sizes.items())
                    + (2 * bw if machine.on_gpu else 0))
    host_bytes = 4 * bw + 2 * ws + (bw if machine.on_gpu else 0) + 2**30  # + torch itself
    chosen = ', '.join(f'{p} {n}' for p, n in sizes.items())
    why = (f'Matrix products sized so that one takes at most {call_s:g} s at the rate a small '
           f'probe measured ({chosen}); buffers and working sets of {bandwidth_mb} and '
           f'{working_set_mb} MiB, at least 4x the {llc / 2**20:.0f} MiB last-level cache. '
           f'matmul_size={largest} measures every precision at the size this notebook used '
           'before it was sized to the machine.' + (f' {skipped}' if skipped else ''))
    return Plan({'matmul_sizes': sizes, 'bandwidth_mb': bandwidth_mb,
                 'max_working_set_mb': working_set_mb, 'thread_sweep_size': sweep_n,
                 'thread_counts': threads,
                 'exercise_mb': min(bandwidth_mb, EXERCISE_MB_04)}, seconds,
                device_bytes=device_bytes, host_bytes=host_bytes, why=why)


def probe_precisions_04(names, device):
    """{precision: (n, FLOP/s)}: the fastest of three n x n products in each precision, n
    doubled from 256 (2048 on a GPU) until one product takes 10 ms or n reaches 1024 (8192):
    shorter products are timed poorly when other programs share the processor. 'tf32' is
    float32 with torch.set_float32_matmul_precision('high'), which lets CUDA use TF32."""
    on_gpu = device.type == 'cuda'
    previous = torch.get_float32_matmul_precision()
    probed = {}
    try:
        for name in names:
            n, largest = (2048, 8192) if on_gpu else (256, 1024)
            torch.set_float32_matmul_precision('high' if name == 'tf32' else 'highest')
            while True:
                a = torch.randn(n, n, device=device).to(DTYPES_04[name])
                times = []
                for _ in range(4):  # the first warms up
                    if on_gpu:
                        torch.cuda.synchronize(device)
                    tik = time.perf_counter()
                    a @ a
                    if on_gpu:
                        torch.cuda.synchronize(device)
                    times.append(time.perf_counter() - tik)
                best = min(times[1:])
                if best >= 0.01 or 2 * n > largest:
                    probed[name] = (n, 2 * n**3 / best)
                    break
                n *= 2
    finally:
        torch.set_float32_matmul_precision(previous)
    return probed


def setup_04(*, matmul_size=None, bandwidth_mb=None, max_working_set_mb=None, storage_mb=64,
             repeats=3):
    """Notebook 04's setup: every parameter checked (a ValueError naming it, before any
    work), then the device, a short probe of each precision's matrix products, the plan
    (plan_04) sized from those rates and the last-level cache, and the clocks the CPU peaks
    are computed at (the nominal clock, and the maximum where the system reports one)."""

    helpers.check_int('matmul_size', matmul_size, minimum=16, allow_none=True)
    helpers.check_int('bandwidth_mb', bandwidth_mb, allow_none=True)
    helpers.check_int('max_working_set_mb', max_working_set_mb, allow_none=True)
    helpers.check_int('storage_mb', storage_mb)
    helpers.check_int('repeats', repeats)
    host_memory = _host_memory()
    for name, mb in (('bandwidth_mb', bandwidth_mb), ('max_working_set_mb', max_working_set_mb)):
        if mb and 4 * mb * 2**20 > host_memory:  # buffers, copies and index tensors
            raise ValueError(f'{name}={mb} needs about {4 * mb} MiB of host memory; this '
                             f'machine has {host_memory / 2**20:,.0f} MiB')
    if shutil.disk_usage(tempfile.gettempdir()).free < 2 * storage_mb * 2**20:
        raise ValueError(f'storage_mb={storage_mb}: not enough free space in '
                         f'{tempfile.gettempdir()} for the temporary file')
    device = helpers.try_gpu()
    on_gpu = device.type == 'cuda'
    machine = on_device(probe(), device)
    names, skipped = precisions_04(machine)
    probed = probe_precisions_04(names, device)
    info = hardware.cpu_info()
    llc_name, llc_bytes = hardware.last_level_cache()
    gpu_l2 = torch.cuda.get_device_properties(device).L2_cache_size if on_gpu else None
    plan = plan_04(machine, {p: rate for p, (_, rate) in probed.items()}, llc_bytes=llc_bytes,
                   gpu_l2_bytes=gpu_l2, repeats=repeats)
    max_ghz = info.max_ghz
    max_clock = 'reported by cpufreq' if max_ghz else 'the system does not report it'
    env = helpers.environment(device)
    slowest = min(probed, key=lambda p: probed[p][1])
    book_n = MATMUL_BOOK_04[device.type]
    llc = f'{llc_name} {llc_bytes / 2**20:,.3g} MiB' if llc_name else 'unknown'
    ghz = lambda g: f'{g:.2f} GHz' if g else 'not known'
    why = [f'Device: {env["device"]}. CPU: {info.model}, {info.logical_cores} logical cores, '
           f'last-level cache {llc}; nominal clock {ghz(info.nominal_ghz)} (from '
           f'{info.nominal_from}), maximum {ghz(max_ghz)} ({max_clock}).',
           'Probe, the fastest of three small products: ' + ', '.join(
               f'{p} {r / 1e9:,.1f} GFLOP/s (n={n})' for p, (n, r) in probed.items()) + '.',
           str(plan)]
    given = {k: v for k, v in (('matmul_size', matmul_size), ('bandwidth_mb', bandwidth_mb),
                               ('max_working_set_mb', max_working_set_mb)) if v is not None}
    if given:
        why.append('Given as parameters, and used instead of the plan: '
                   + ', '.join(f'{k}={v}' for k, v in given.items()) + '.')
    if probed[slowest][1] < 0.25 * probed['float32'][1]:  # sized apart for a reason
        why.append(f'The slowest precision here, {slowest}, runs at '
                   f'{probed[slowest][1] / probed["float32"][1]:.2g}x float32\'s rate: one '
                   f'{book_n} x {book_n} product in it would take about '
                   f'{2 * book_n**3 / probed[slowest][1]:,.1f} s, so each precision gets its '
                   'own size.')
    return Setup(why, device=device, on_gpu=on_gpu, env=env, machine=machine, plan=plan,
                 info=info, precisions=names, skipped=skipped,
                 probe_gflops={p: r / 1e9 for p, (_, r) in probed.items()},
                 matmul_sizes={p: matmul_size for p in names} if matmul_size
                 else plan['matmul_sizes'],
                 thread_sweep_size=matmul_size or plan['thread_sweep_size'],
                 thread_counts=plan['thread_counts'],
                 bandwidth_mb=bandwidth_mb or plan['bandwidth_mb'],
                 max_working_set_mb=max_working_set_mb or plan['max_working_set_mb'],
                 exercise_mb=min(bandwidth_mb or plan['bandwidth_mb'], EXERCISE_MB_04),
                 storage_mb=storage_mb, repeats=repeats, llc_name=llc_name,
                 llc_bytes=llc_bytes, gpu_l2_bytes=gpu_l2, nominal_ghz=info.nominal_ghz,
                 max_ghz=max_ghz, max_clock=max_clock)


# ------------------------------------------------------------------------------- notebook 05
LENET_TRAIN_FLOPS = 3 * 4.5e6   # LeNet's forward pass is 4.5 MFLOP an example; backward twice that
LENET_PARAMS = 129_068
CPU_LENET_EFFICIENCY = 0.25     # LeNet's small convolutions run at about a quarter of matmul's rate
GPU_LENET_EFFICIENCY = 0.1      # tiny kernels: far from a GPU's matmul rate
GPU_REPLICA_STEP_S = 3e-3       # launches and Python per replica per step (about 80 kernels)
GPU_LOADER_S_PER_EXAMPLE = 1e-5  # DataLoader indexing and collating on a slow host, per example
BOOK_05 = {'num_epochs': 10, 'num_train': 60000, 'num_test': 10000}
LARGER_BATCH_EPOCHS_05 = 2       # epochs at the 4x larger batch, with and without a scaled lr
T1_LARGEST_05 = 1024             # the t1 sweep's largest per-device batch (4x the book's batch)
CPU_TRAINING_SHARE_05 = 0.33     # of the CPU budget, for the training runs the plan sizes


def plan_05(machine, num_gpus=2, batch_size=256, device_counts=(1, 2), equivalence_steps=5):
    """Notebook 05: epochs and examples for LeNet trained by hand on k (emulated) devices.

    The notebook trains once per k in device_counts for num_epochs epochs, once more on one
    device from weights nudged by one float32 step (the rounding experiment), one epoch at a 4x
    smaller global batch, LARGER_BATCH_EPOCHS_05 epochs at a 4x larger one three times (the
    learning rate as given, and scaled by 4 from two starts), and a few dozen steps for the
    equivalence checks. On a GPU
    the book's scale (10 epochs of 60,000 examples) is kept where it fits the budget; on a CPU
    two epochs of the largest subset that fits are chosen, because that subset is what CI
    runs. The estimate leaves out what no size changes (the t1 sweep up to T1_LARGEST_05
    examples, the pipeline's processes, the 3 x 40 first steps that measure the book's start
    and learning rate), which the rest of the budget covers."""
    per_example = LENET_TRAIN_FLOPS / (machine.flops * (
        GPU_LENET_EFFICIENCY if machine.on_gpu else CPU_LENET_EFFICIENCY))

    def step_s(batch, k):  # one synchronous step of `batch` examples over k replicas
        if not machine.on_gpu:
            return batch * per_example * (1 + 0.1 * (k - 1))  # emulated: k small passes
        return (batch * (per_example + GPU_LOADER_S_PER_EXAMPLE)
                + k * GPU_REPLICA_STEP_S * (1 + batch / 4096))

    def seconds(sizes):
        epochs, n, n_test = sizes['num_epochs'], sizes['num_train'], sizes['num_test']
        runs = [*device_counts, 1]  # the nudged run is one more on one device
        train = sum(epochs * (n // batch_size) * step_s(batch_size, k) for k in runs)
        larger_epochs = min(LARGER_BATCH_EPOCHS_05, epochs)
        larger = [(max(1, batch_size // 4), 1), (4 * batch_size, larger_epochs),
                  (4 * batch_size, larger_epochs), (4 * batch_size, larger_epochs)]
        train += sum(e * (n // b) * step_s(b, 1) for b, e in larger)
        # float64 (about 3x), float32 and TF32 checks, even and uneven, and exercise 2, each
        # of two runs on a batch of about 64
        equivalence = (2 * (3 + 1 + 1) * equivalence_steps + 3 * 3) * 2 * step_s(64, num_gpus)
        evaluations = (epochs * len(runs) + 1 + 3 * larger_epochs + 2) * n_test * per_example / 3
        return train + equivalence + evaluations

    if machine.on_gpu:
        candidates = [BOOK_05, {**BOOK_05, 'num_epochs': 5}, {**BOOK_05, 'num_epochs': 2},
                      {'num_epochs': 2, 'num_train': 20000, 'num_test': 5000}]
        limit = budget('05', machine) * 0.5  # the rest: pipeline processes, timings, start-up
    else:
        candidates = [{'num_epochs': 2, 'num_train': n, 'num_test': 1000}
                      for n in (60000, 30000, 20000, 16000, 12000, 10000, 8000, 6000, 5000,
                                4000, 3000, 2000)]
        # the rest of the 90 s: kernel start, two worker processes, the timing sections (about
        # 30 s on 2 cores), and headroom for a machine that is busy with other work
        limit = budget('05', machine) * CPU_TRAINING_SHARE_05
    chosen = largest_fitting(candidates, seconds, limit)
    book = chosen == BOOK_05
    images = chosen['num_train'] + chosen['num_test']
    activations = 4 * batch_size * 4 * (20 * 26 * 26 + 50 * 9 * 9) * 3  # largest batch, fwd+bwd
    fits = seconds(chosen) <= limit
    why = ('The book\'s scale (10 epochs of all 60,000 examples) fits the budget here.' if book
           else (f'{chosen["num_epochs"]} epoch(s) of {chosen["num_train"]:,} examples fit '
                 f'{limit:.0f} s of training here' if fits else
                 f'Even the smallest choice, {chosen["num_epochs"]} epoch(s) of '
                 f'{chosen["num_train"]:,} examples, needs more than the {limit:.0f} s planned '
                 'for training: this machine is slow or busy, and the notebook will take longer')
           + '; num_epochs=10, num_train=60000, num_test=10000 run the book\'s scale.')
    return Plan(dict(chosen), seconds(chosen),
                device_bytes=activations + 4 * LENET_PARAMS * 4 * max(device_counts),
                host_bytes=images * 28 * 28 * 5, why=why)


def setup_05(*, num_gpus=2, batch_size=None, lr=0.1, num_epochs=None, num_train=None,
             num_test=None, device_counts=None, equivalence_steps=5, microbatches=None,
             sync_batches=None, data_source='auto'):
    """Notebook 05's setup: every parameter checked (a ValueError naming it, before any work),
    then the sizes planned for this machine (plan_05), the devices (real GPUs, or replicas
    that emulate the missing ones), whether TF32 is measured (every GPU used has TF32 tensor
    cores) or emulated, and what t1 and t2 are measured on."""

    helpers.check_int('num_gpus', num_gpus)
    why = []
    if batch_size is None:  # the book's 256, rounded so that every device gets the same share
        batch_size = max(num_gpus, round(256 / num_gpus) * num_gpus)
        if batch_size != 256:
            why.append(f"batch_size=None: the book's 256 rounded to {batch_size}, a multiple of "
                       f'num_gpus={num_gpus}, so that each device gets {batch_size // num_gpus} '
                       'examples.')
    helpers.check_int('batch_size', batch_size)
    if batch_size < num_gpus:
        raise ValueError(f'batch_size={batch_size} is smaller than num_gpus={num_gpus}: '
                         'every device needs at least one example')
    helpers.check_positive('lr', lr)
    for name, value in (('num_epochs', num_epochs), ('num_train', num_train),
                        ('num_test', num_test)):
        helpers.check_int(name, value, allow_none=True)
    counts = sorted(set(helpers.check_list(
        'device_counts', [1, num_gpus] if device_counts is None else device_counts,
        helpers.check_int)))
    if not counts:
        raise ValueError('device_counts is empty: give at least one k, for example [1, 2]')
    for k in counts:
        if batch_size < k:
            raise ValueError(f'device_counts has {k} but batch_size={batch_size} < {k}')
    k_exercise = max(2, num_gpus)  # the exercises compare at least 2 replicas with one device
    if batch_size < k_exercise:
        raise ValueError(f'batch_size={batch_size}: the exercises split each batch over '
                         f'{k_exercise} replicas and need at least {k_exercise} examples')
    helpers.check_int('equivalence_steps', equivalence_steps)
    micro = sorted(set(helpers.check_list(
        'microbatches', [1, 2, 4, 8] if microbatches is None else microbatches,
        helpers.check_int)))
    if len(micro) < 2 or micro[-1] > batch_size:
        raise ValueError(f'microbatches={micro}: give at least two micro-batch counts, each '
                         f'at most batch_size={batch_size} (the pipeline cuts one minibatch)')
    per_device = batch_size // num_gpus
    given_sync = sync_batches is not None
    if given_sync:
        sync_batches = helpers.check_list('sync_batches', sync_batches, helpers.check_int)
        if not set(sync_batches) - {per_device}:
            raise ValueError(f'sync_batches={sync_batches}: give at least one per-device batch '
                             f'besides b={per_device}, to compare t1 across batches')
    helpers.check_choice('data_source', data_source, ('real', 'synthetic', 'auto'))
    global_batches = sorted({max(1, batch_size // 4), batch_size, 4 * batch_size})

    def check_num_train(n):
        if n < global_batches[-1]:
            raise ValueError(f'num_train={n} is smaller than {global_batches[-1]}, the largest '
                             f'global batch (4 x batch_size) of the larger-batch experiment: '
                             f'use num_train >= {global_batches[-1]} or a smaller batch_size')
        if given_sync and max(sync_batches) > n:
            raise ValueError(f'sync_batches has {max(sync_batches)}, more than num_train={n}')
    if num_train is not None:
        check_num_train(num_train)

    machine = probe()
    plan = plan_05(machine, num_gpus, batch_size, counts, equivalence_steps)
    why.insert(0, f'Measured: {machine}.')
    why.insert(1, str(plan) if None in (num_epochs, num_train, num_test) else
               'num_epochs, num_train and num_test were given.')
    num_train = num_train or plan['num_train']
    check_num_train(num_train)
    num_epochs = num_epochs or plan['num_epochs']
    if not given_sync:  # 1, 2, 4, ... up to 4 x the book's batch, as far as the data reaches
        top = min(T1_LARGEST_05, num_train)
        sync_batches = [2**i for i in range(top.bit_length())]
    sync_batches = sorted(set(sync_batches) | {per_device})

    with contextlib.redirect_stdout(io.StringIO()) as said:  # its sentence, for `why`
        devices = helpers.resolve_devices(num_gpus)
    why.append(f'Devices: {said.getvalue().strip()}.')
    gpus = helpers.num_gpus()
    on_gpu = devices[0].type == 'cuda'
    used = sorted(set(devices), key=str)
    tf32_hardware = on_gpu and all(torch.cuda.get_device_capability(d) >= (8, 0) for d in used)
    if tf32_hardware:
        names = ', '.join(sorted({torch.cuda.get_device_name(d) for d in used}))
        tf32_how = f"measured on {names} with torch's default TF32 convolutions"
    elif on_gpu:
        tf32_how = ('emulated, because not every GPU used has TF32 tensor cores (compute '
                    'capability 8.0 or newer): convolution operands rounded to TF32 in the '
                    'forward pass')
    else:
        tf32_how = ('emulated, because a CPU has no TF32: convolution operands rounded to '
                    'TF32 in the forward pass')
    why.append(f'TF32: {tf32_how}.')
    cores = os.cpu_count() or 1
    t1_threads = torch.get_num_threads() if on_gpu else helpers.cores_per_process(2)
    if gpus >= 2:
        t2_link = "between two GPUs, with this notebook's allreduce"
    elif on_gpu:
        t2_link = ('between two CPU processes over loopback: one GPU has no second GPU to '
                   'exchange with, so t1 (on the GPU) and t2 (on the CPU) describe different '
                   'hardware')
    else:
        t2_link = (f'between two CPU processes over loopback, each with '
                   f'{helpers.cores_per_process(2)} of the {cores} cores')
    why.append(f't1 is timed on {devices[0]} with {t1_threads} thread(s); t2 is measured '
               f'{t2_link}.')
    return Setup(why, machine=machine, plan=plan, num_gpus=num_gpus, batch_size=batch_size,
                 lr=lr, num_epochs=num_epochs, num_train=num_train,
                 num_test=num_test or plan['num_test'], device_counts=counts,
                 equivalence_steps=equivalence_steps, microbatches=micro,
                 sync_batches=sync_batches, data_source=data_source, devices=devices,
                 emulated=len(set(devices)) < len(devices), on_gpu=on_gpu, gpus=gpus,
                 per_device=per_device, k_exercise=k_exercise, global_batches=global_batches,
                 claim_per_device=max(1, min(per_device, 64 // num_gpus)),
                 extra=min(1, num_gpus - 1),  # one example more than k*b: uneven shards
                 larger_batch_epochs=min(LARGER_BATCH_EPOCHS_05, num_epochs),
                 tf32_hardware=tf32_hardware, tf32_how=tf32_how, t1_threads=t1_threads,
                 t2_link=t2_link, t2_between_gpus=gpus >= 2,
                 t1_t2_same_hardware=gpus >= 2 or not on_gpu)


# ------------------------------------------------------------------------------- notebook 06
RESNET18_TRAIN_FLOPS_06 = 2.734e9  # forward + backward of one 28x28 image at width 64; it grows
RESNET18_PARAMS_06 = 11_175_818    # with width**2, and so do the parameters (tests count both)
CPU_CONV_EFFICIENCY_06 = 0.35      # ResNet's convolutions against matmul's rate, on a CPU
CPU_STEP_FLOPS_06 = 2e9            # per step and process, in matmul-FLOP equivalents: BatchNorm,
                                   # ReLU, Python, the optimizer (16 ms on 2 cores at width 8)
GPU_CONV_EFFICIENCY_06 = 0.66      # a T4 took 8-10 min for 10 epochs of 60,000 at width 64
GPU_STEP_S_06 = 5e-3               # launches, Python and the DataLoader per step, on a slow host
GLOO_BYTES_S_06 = 0.5e9            # gloo all-reduce between processes of one host
NCCL_BYTES_S_06 = 20e9             # nccl between GPUs of one machine (PCIe or better)
CPU_FIXED_S_06 = 32                # kernel, data, FLOP counts, timings, plots (2 cores, here)
GPU_FIXED_S_06 = 60                # the same on a GPU machine, CUDA start-up included
BOOK_06 = {'width': 64, 'batch_size': 256, 'num_epochs': 10, 'num_train': 60000,
           'num_test': 10000}
# On a CPU: enough steps (5 epochs of 1,024 examples at batch 32) for a narrow ResNet-18 to
# learn the synthetic stand-in reliably: at width 8, over 8 seeds, test accuracy 0.84-0.91 after
# 5 epochs, but 0.61-0.88 after 4 (it still swings from epoch to epoch). The width is what the
# budget sizes.
CPU_RECIPE_06 = {'batch_size': 32, 'num_epochs': 5, 'num_train': 1024, 'num_test': 300}


def resnet18_size_06(width):
    """(training FLOPs per 28x28 image, parameters) of helpers.resnet18(10, width=width)."""
    scale = (width / 64) ** 2
    return RESNET18_TRAIN_FLOPS_06 * scale, RESNET18_PARAMS_06 * scale


def worker_start_s_06(k, machine):
    """Starting k processes that import torch and load the data: they share the host's cores
    (measured: 3 s for one process on 2 cores, 1.5 s more for each further pair)."""
    return (2.0 + 1.5 * k / machine.host_cores) * (1.3e11 / machine.host_flops) ** 0.5 + (
        3.0 if machine.on_gpu else 0.0)   # a CUDA context per process


def plan_06(machine, num_gpus=2, device_counts=(1, 2), batch_size=None, width=None,
            num_epochs=None, num_train=None, num_test=None):
    """Notebook 06: ResNet-18's width, the batch, epochs and examples, and the DDP timeout.

    The notebook trains with DataParallel (once per device count that has a GPU each, else
    once) and with DDP once per k in device_counts, then runs a crashing 2-process job and a
    2-process timing job (the overlap experiment). On a GPU the book's network and batch stay,
    and the epochs and examples are the largest that fit the budget (ranks that share a GPU
    exchange gradients through gloo and host memory, which the estimate counts). On a CPU the
    steps are fixed (enough for a narrow network to learn) and the width is the largest that
    fits, because that run is what CI executes. Values given (not None) are kept, and the
    estimate and the timeout are those of the work actually run.

    With GPUs of different speeds (an H100 beside a T4), a run on k of them is paced by the
    slowest of the GPUs it uses (machine.gpu_flops: ranks and replicas take GPUs 0, 1, ... in
    turn), so a run on GPU 0 alone is planned at GPU 0's rate and a 2-GPU run at the slower
    card's; the timeout follows the slowest run."""
    given = {k: v for k, v in dict(batch_size=batch_size, width=width, num_epochs=num_epochs,
                                   num_train=num_train, num_test=num_test).items()
             if v is not None}
    gpus = machine.gpus if machine.on_gpu else 0
    counts = sorted(set(device_counts))
    dp_counts = [k for k in counts if k <= gpus] or [1]

    def gpu_rate(k):
        """fp32 rate of the slowest GPU that k ranks (or DataParallel replicas) use."""
        return min(machine.gpu_flops[:min(k, gpus)] or (machine.flops,))

    def step_s(sizes, k, dataparallel=False):
        """One training step of the global batch over k processes (or DataParallel devices)."""
        flops, params = resnet18_size_06(sizes['width'])
        batch = sizes['batch_size']
        if not machine.on_gpu:   # k processes share the cores: the overhead is paid k times
            share = 1 if dataparallel else k
            comm = 0 if dataparallel or k == 1 else 4 * params / GLOO_BYTES_S_06
            return (share * CPU_STEP_FLOPS_06 + batch * flops / CPU_CONV_EFFICIENCY_06
                    ) / machine.host_flops + comm
        devices = min(k, gpus)
        compute = batch * flops / (GPU_CONV_EFFICIENCY_06 * gpu_rate(k) * devices)
        if dataparallel or k == 1:
            comm = 0
        elif k <= gpus:
            comm = 4 * params / NCCL_BYTES_S_06
        else:                    # ranks share GPUs: gradients go through host memory and gloo
            comm = 4 * params / GLOO_BYTES_S_06
        return compute + GPU_STEP_S_06 * (k if k > gpus else 1) + comm

    def run_s(sizes, k, dataparallel=False):
        flops = resnet18_size_06(sizes['width'])[0]
        rate = (GPU_CONV_EFFICIENCY_06 * gpu_rate(k) if machine.on_gpu
                else CPU_CONV_EFFICIENCY_06 * machine.host_flops)
        evaluate = sizes['num_test'] * flops / 3 / rate
        steps = sizes['num_train'] // sizes['batch_size']
        start = 0 if dataparallel else worker_start_s_06(k, machine)
        return start + sizes['num_epochs'] * (steps * step_s(sizes, k, dataparallel) + evaluate)

    def seconds(sizes):
        fixed = (GPU_FIXED_S_06 if machine.on_gpu else
                 CPU_FIXED_S_06 * (1.3e11 / machine.host_flops) ** 0.5)
        return (fixed + sum(run_s(sizes, k, dataparallel=True) for k in dp_counts)
                + sum(run_s(sizes, k) for k in counts) + 2 * worker_start_s_06(2, machine))

    if machine.on_gpu:
        candidates = [{**BOOK_06, 'num_epochs': e, 'num_train': n, 'num_test': t, **given}
                      for e, n, t in ((10, 60000, 10000), (5, 60000, 10000), (3, 60000, 10000),
                                      (2, 60000, 10000), (1, 60000, 10000), (1, 30000, 10000),
                                      (1, 15000, 5000), (1, 6000, 2000))]
    limit = budget('06', machine) * 0.8   # headroom: estimates are rough, machines are busy
    if machine.on_gpu:
        chosen = largest_fitting(candidates, seconds, limit)
    else:   # the widest network that can take the recipe's steps; then the values given
        recipe = {**CPU_RECIPE_06, **({'batch_size': batch_size} if batch_size else {})}
        chosen = {**largest_fitting([{**recipe, 'width': w} for w in (64, 32, 16, 8)],
                                    seconds, limit), **given}
    longest = max(run_s(chosen, k) for k in counts)
    values = {**chosen, 'worker_timeout': int(60 + 3 * longest),
              # the overlap experiment: a network whose gradient exchange takes about as long
              # as its backward pass, so that there is something to hide
              'overlap_width': 64 if machine.on_gpu else 32,
              'overlap_batch': 32 if machine.on_gpu else 2,
              'compute_batch': 64 if machine.on_gpu else 2}  # per device, compute per byte
    flops, params = resnet18_size_06(chosen['width'])
    activations = 14e6 * (chosen['width'] / 64) * chosen['batch_size']  # bytes kept for backward
    data_bytes = 4 * 784 * (chosen['num_train'] + chosen['num_test'])
    steps = chosen['num_epochs'] * (chosen['num_train'] // chosen['batch_size'])
    book_scale = ("width=64, batch_size=256, num_epochs=10, num_train=60000, num_test=10000 "
                  "run the book's scale.")
    if seconds(chosen) > limit:
        why = (f'The values given ({", ".join(f"{k}={v}" for k, v in given.items())}) take '
               f'about {seconds(chosen):.0f} s here, beyond the {limit:.0f} s this notebook aims '
               'for; the others are as planned.' if given else
               f'Even the smallest plan takes about {seconds(chosen):.0f} s on this machine, '
               f'beyond the {limit:.0f} s this notebook aims for.')
    elif machine.on_gpu:
        why = ("The book's scale (width 64, batch 256, 10 epochs of 60,000) fits the budget."
               if all(chosen[k] == v for k, v in BOOK_06.items()) else
               f'{chosen["num_epochs"]} epoch(s) of {chosen["num_train"]:,} examples at width '
               f'{chosen["width"]} fit about {limit:.0f} s for every run here. {book_scale}')
    else:
        needed = (CPU_RECIPE_06['num_epochs'] * CPU_RECIPE_06['num_train']
                  // CPU_RECIPE_06['batch_size'])
        why = (f'On a CPU ResNet-18 runs at width {chosen["width"]} instead of 64 '
               f'({flops / 1e6:.0f} MFLOP an image instead of '
               f'{RESNET18_TRAIN_FLOPS_06 / 1e9:.1f} GFLOP), so that each run can take the '
               f'{needed} steps it needs to learn within the budget'
               if chosen['width'] < 64 else f'The book\'s width fits {needed} steps per run here')
        why += (f' (the values given make it {steps} steps). ' if steps != needed else '. ')
        why += book_scale
    return Plan(values, seconds(chosen),
                # each process on a GPU: a CUDA context, weights, gradients and SGD copies;
                # the processes sharing it split the batch's activations
                device_bytes=int(math.ceil(max(counts) / max(gpus, 1)) * (500e6 + 4 * params * 4)
                                 + activations) if machine.on_gpu else 0,
                host_bytes=int((1 + max(counts)) * (data_bytes + 4 * params * 4 + 400 * 2**20)
                               + (0 if machine.on_gpu else activations)),
                why=why)


OVERLAP_REPEATS_06 = 7           # rounds of the overlap experiment (after one warm-up)
OVERLAP_PASSES_06 = 5            # timings per variant and round; a round keeps their median


def setup_06(*, num_gpus=2, batch_size=None, lr=0.1, num_epochs=None, num_train=None,
             num_test=None, width=None, device_counts=None, master_port=None,
             worker_timeout=None, data_source='auto'):
    """Notebook 06's setup: every parameter checked (a ValueError naming it, before any work),
    then the sizes planned for this machine (plan_06), the global batch rounded up so that it
    splits evenly over every process count the notebook uses (the DDP runs, and the
    two-process jobs: the crash and the overlap experiment), the devices, and the settings of
    the DDP workers (`ddp_config`, without the data) and of the overlap experiment."""

    helpers.check_int('num_gpus', num_gpus)
    counts = sorted(set(helpers.check_list(
        'device_counts', [1, num_gpus] if device_counts is None else device_counts,
        helpers.check_int)))
    if not counts:
        raise ValueError('device_counts is empty: give at least one k, for example [1, 2]')
    for name, value in (('batch_size', batch_size), ('num_epochs', num_epochs),
                        ('num_train', num_train), ('num_test', num_test), ('width', width),
                        ('worker_timeout', worker_timeout)):
        helpers.check_int(name, value, allow_none=True)
    helpers.check_positive('lr', lr)
    helpers.check_choice('data_source', data_source, ('real', 'synthetic', 'auto'))
    if master_port is not None:
        helpers.check_int('master_port', master_port)
        if not launch.port_is_free(master_port):
            raise ValueError(f'master_port={master_port} is busy on 127.0.0.1: choose '
                             'another or None')
    process_counts = sorted(set(counts) | {2})  # the crash and the overlap jobs use 2
    multiple = math.lcm(*process_counts)
    for k in process_counts if batch_size is not None else ():
        if batch_size % k:
            used_by = 'a DDP run' if k in counts else 'the two-process jobs'
            raise ValueError(f'batch_size={batch_size} does not split evenly over {k} '
                             f'processes ({used_by}): use a multiple of {multiple}, or None')

    machine = probe()
    plan = plan_06(machine, num_gpus, counts, batch_size, width, num_epochs, num_train,
                   num_test)
    why = []
    if None in (batch_size, num_epochs, num_train, num_test, width, worker_timeout):
        why += [f'Measured: {machine}.', str(plan)]
    if batch_size is None:
        batch_size = -(-plan['batch_size'] // multiple) * multiple
        if batch_size != plan['batch_size']:
            why.append(f'batch_size=None: {plan["batch_size"]} rounded up to {batch_size}, a '
                       f'multiple of every process count used here ({process_counts}).')
    num_train = num_train or plan['num_train']
    if num_train < batch_size:
        raise ValueError(f'num_train={num_train} is smaller than one batch ({batch_size})')
    sizes = dict(batch_size=batch_size, num_epochs=num_epochs or plan['num_epochs'],
                 num_train=num_train, num_test=num_test or plan['num_test'],
                 width=width or plan['width'],
                 worker_timeout=worker_timeout or plan['worker_timeout'])

    gpus = [d for d in helpers.try_all_gpus() if d.type == 'cuda']
    own_devices = bool(gpus) and max(counts) <= len(gpus)
    cores = os.cpu_count() or 1
    if own_devices:
        where, devices = 'GPUs', 'DDP runs one process per GPU, with nccl.'
        compared = ('compute: one GPU; all-reduce: two processes, each on its own GPU, '
                    'with nccl.')
    elif gpus:
        where = 'processes sharing the GPU(s)'
        devices = (f'DDP runs with more than {len(gpus)} process(es) share the GPU(s) through '
                   'gloo and host memory; with a GPU per process they use nccl.')
        compared = ('compute: the whole of GPU 0, one process; all-reduce: two processes '
                    'sharing GPU 0, with gloo through host memory.')
        if len(gpus) >= 2:
            compared = ('compute: the whole of GPU 0, one process; all-reduce: two processes '
                        'on GPUs 0 and 1, with nccl.')
    else:
        where = 'CPU processes sharing the cores'
        devices = f'DDP runs CPU processes that talk through gloo, sharing {cores} cores.'
        compared = (f'compute: one process with {helpers.cores_per_process(2)} of the {cores} '
                    'cores (what each of two processes gets); all-reduce: two CPU processes, '
                    'with gloo.')
    why.append(f'GPUs found: {len(gpus)}. {devices}')
    why.append(f'{sizes["num_train"]} training and {sizes["num_test"]} test examples, global '
               f'batch {batch_size}, {sizes["num_epochs"]} epoch(s), ResNet-18 of width '
               f'{sizes["width"]}; DDP with {counts} process(es); a run that hangs is stopped '
               f'after {sizes["worker_timeout"]} s.')
    ddp_config = {'batch_size': batch_size, 'lr': lr, 'epochs': sizes['num_epochs'],
                  'num_train': sizes['num_train'], 'num_test': sizes['num_test'],
                  'width': sizes['width'], 'data_source': data_source, 'timeout': 60}
    overlap_config = {'width': plan['overlap_width'], 'batch': plan['overlap_batch'],
                      'bucket_mb': 4, 'repeats': OVERLAP_REPEATS_06,
                      'passes': OVERLAP_PASSES_06}
    return Setup(why, machine=machine, plan=plan, num_gpus=num_gpus, lr=lr,
                 device_counts=counts, process_counts=process_counts, master_port=master_port,
                 data_source=data_source, gpus=gpus, on_gpu=bool(gpus), own_devices=own_devices,
                 device=gpus[0] if gpus else torch.device('cpu'),
                 dp_counts=[k for k in counts if k <= len(gpus)] or [1], cores=cores,
                 where=where, compared=compared, ddp_config=ddp_config,
                 overlap_config=overlap_config, compute_batch=plan['compute_batch'],
                 steps=sizes['num_epochs'] * (sizes['num_train'] // batch_size), **sizes)


# ------------------------------------------------------------------------------- notebook 07
# Notebook 07 runs CPU processes that talk gloo on every machine, GPU or not, so its plan sizes
# only messages, repeats and demo lengths, to the CPU budget. Rates measured on a 2-core machine:
LOOPBACK_BUSBW_07 = 0.8e9   # ring or dist.all_reduce bus bandwidth over loopback, a core each
FIXED_S_07 = 30             # kernel, imports, the first forked process, small runs, plots,
                            # the restart from a checkpoint
LINK_MBIT_07 = 2000         # emulated links: a 64 MB ring over 4 hosts in about half a second,
                            # slow enough to stay network-bound when 2 cores serve every host


def plan_07(machine, max_processes=4, cluster=False, num_workers=2, demo_servers=(1, 2, 4),
            bench_repeats=3, segment_counts=(1, 2, 4, 8, 16), message_mb=None,
            race_repeats=None, link_mbit=None, gradient_mb=None):
    """Notebook 07: the largest message, the repeats of the ring-against-dist.all_reduce race,
    and, where an emulated cluster runs, the link rate and the bottleneck demo's gradient size.

    Loopback collectives cost bytes over the processes' shared cores (each of n processes gets
    cores/n of one core when n exceeds the cores); shaped links cost bytes over the link rate
    tc is told. The largest message is the issue's 64 MB wherever it fits; the race gets as
    many repeats as fit (at least 3), since its median decides the recorded ratio."""
    groups = sorted({2, max_processes})
    cores = machine.host_cores

    def loopback(n, mb, factor):  # seconds to move `factor` x mb MB over each of n links
        return factor * mb * 2**20 / (LOOPBACK_BUSBW_07 * min(1.0, cores / n))

    def sweep_s(mb):
        sizes = [4 * 16**k / 1024 for k in range(8) if 4 * 16**k / 1024 < mb] + [mb]
        one = sum(loopback(2, s, 1) + sum(loopback(n, s, 2 * (n - 1) / n) * 2 + loopback(n, s, 1)
                                           + loopback(n, s, 2 * (n - 1)) for n in groups)
                  for s in sizes[:-1])  # p2p; per n: ring, dist.all_reduce, shift, naive
        return (bench_repeats + 1) * (one + loopback(2, mb, 1) + sum(
            loopback(n, mb, 1) + loopback(n, mb, 2 * (n - 1)) for n in groups))

    def race_s(mb, repeats):
        return (repeats + 1) * sum((len(segment_counts) + 1) * loopback(n, mb, 2 * (n - 1) / n)
                                   for n in groups)

    rate = link_mbit or LINK_MBIT_07
    link = rate * 1e6 / 8  # bytes/s
    gradient = gradient_mb or 16
    n = max_processes

    def cluster_s(mb):  # shaped links: p2p, shift, ring, all_reduce at mb and 16 MB; the demos
        if not cluster:
            return 0.0
        shaped = (bench_repeats + 2) * (mb + 16) * 2**20 / link * (2 + 2 * 2 * (n - 1) / n)
        return shaped + sum(4 * 2 * max(num_workers / s, 1) * gradient * 2**20 / link
                            for s in demo_servers) + 4 * 2 * 2 * 4 * 2**20 / link

    def seconds_of(mb, repeats):
        return FIXED_S_07 + cluster_s(mb) + sweep_s(mb) + race_s(mb, repeats)

    # CPU processes on every machine, GPU or not: the CPU's budget (and headroom)
    limit = budget('07', on_device(machine, torch.device('cpu'))) * 0.7
    candidates = [(mb, r) for mb in ([message_mb] if message_mb else [64, 32, 16])
                  for r in ([race_repeats] if race_repeats else [9, 7, 5, 3])]
    mb, repeats = largest_fitting(candidates, lambda c: seconds_of(*c), limit)
    seconds = seconds_of(mb, repeats)
    why = (f'{mb} MB messages and {repeats} race repeats fit {limit:.0f} s on {cores} '
           f'core{"s" if cores != 1 else ""} '
           f'(loopback collectives at about {LOOPBACK_BUSBW_07 / 1e9:.1f} GB/s of bus bandwidth '
           f'per core)' if seconds <= limit else
           f'even {mb} MB messages and {repeats} race repeats need about {seconds:.0f} s here, '
           f'more than the {limit:.0f} s planned: this machine is slow or busy')
    if cluster:
        why += (f'; emulated links of {rate} Mbit/s (a {mb} MB ring over {n} hosts in about '
                f'{2 * (n - 1) / n * mb * 2**20 / link:.1f} s) '
                f'and {gradient} MB gradients in the bottleneck demo')
    if mb < 64:
        why += '; message_mb=64 measures at the issue\'s full 64 MB'
    why += '. Processes talk gloo on CPUs on every machine, GPUs or not: the same plan for all.'
    values = {'message_mb': mb, 'race_repeats': repeats, 'link_mbit': rate,
              'gradient_mb': gradient}  # without a cluster, in-process emulation at that rate
    return Plan(values, seconds, host_bytes=max_processes * (6 * mb * 2**20 + 400 * 2**20),
                why=why)


def setup_07(*, max_processes=4, message_mb=None, bench_repeats=3, race_repeats=None,
             segment_counts=(1, 2, 4, 8, 16), num_workers=2, num_servers=2,
             demo_servers=(1, 2, 4), gradient_mb=None, straggler_ms=20, use_cluster=None,
             link_mbit=None, link_delay_ms=None, worker_timeout=180, results_dir=None,
             cluster=None):
    """Notebook 07's setup: every parameter checked (a ValueError naming it, before any work),
    then whether emulated hosts can run here, the machine probed and the sizes planned
    (plan_07). `cluster` is the notebook's cluster module (emulated hosts), passed in so that
    this module imports no course module only notebook 07 needs."""
    helpers.check_int('max_processes', max_processes, minimum=2)
    helpers.check_int('message_mb', message_mb, allow_none=True)
    helpers.check_int('bench_repeats', bench_repeats)
    helpers.check_int('race_repeats', race_repeats, allow_none=True)
    segment_counts = helpers.check_list('segment_counts', segment_counts, helpers.check_int)
    helpers.check_int('num_workers', num_workers)
    helpers.check_int('num_servers', num_servers)
    demo_servers = sorted(set(helpers.check_list('demo_servers', demo_servers,
                                                 helpers.check_int)))
    if not demo_servers:
        raise ValueError('demo_servers is empty: give at least one server count, e.g. [1, 2, 4]')
    helpers.check_int('gradient_mb', gradient_mb, allow_none=True)
    helpers.check_int('straggler_ms', straggler_ms, minimum=0)
    helpers.check_choice('use_cluster', use_cluster, (None, True, False))
    if link_mbit is not None:
        helpers.check_positive('link_mbit', link_mbit)
    if link_delay_ms is not None and (isinstance(link_delay_ms, bool) or not isinstance(
            link_delay_ms, (int, float)) or not 0 <= link_delay_ms <= 100):
        raise ValueError(f'link_delay_ms must be a number of milliseconds in [0, 100] or None, '
                         f'got {link_delay_ms!r}')
    helpers.check_int('worker_timeout', worker_timeout)
    if cluster is None:
        raise ValueError('cluster must be the cluster module (import cluster)')
    # Emulated hosts need Linux and root; otherwise the demos emulate slow links in-process.
    if use_cluster is False:
        cluster_ok, cluster_why = False, 'use_cluster=False'
    else:
        cluster_ok, cluster_why = cluster.available()
    if use_cluster and not cluster_ok:
        raise ValueError(f'use_cluster=True, but no emulated cluster can run here: {cluster_why}')
    hosts_needed = max(max_processes, num_workers + max(demo_servers), 3)
    if cluster_ok and hosts_needed > cluster.MAX_HOSTS:
        raise ValueError(f'max_processes, num_workers + max(demo_servers) need {hosts_needed} '
                         f'hosts; an emulated cluster has at most {cluster.MAX_HOSTS}')
    delay_ok, delay_why = cluster.delay_available() if cluster_ok else (False, cluster_why)
    if link_delay_ms and cluster_ok and not delay_ok:
        raise ValueError(f'link_delay_ms={link_delay_ms}, but {delay_why}: pass link_delay_ms=0')
    machine = probe()
    plan = plan_07(machine, max_processes, cluster_ok, num_workers, demo_servers, bench_repeats,
                   segment_counts, message_mb, race_repeats, link_mbit, gradient_mb)
    if link_delay_ms is None:
        link_delay_ms = 1 if delay_ok else 0
    cores = os.cpu_count() or 1
    why = [f'Measured: {machine}.', str(plan)]
    if cluster_ok:
        why.append(f'Emulated cluster: up to {hosts_needed} hosts, links of {plan["link_mbit"]} '
                   f'Mbit/s and {link_delay_ms} ms added delay'
                   + (f' ({delay_why}).' if not delay_ok else '.'))
    else:
        why.append(f'No emulated cluster ({cluster_why}): slow links are emulated inside the '
                   'processes.')
    return Setup(why, machine=machine, plan=plan, cores=cores, max_processes=max_processes,
                 group_sizes=sorted({2, max_processes}), message_mb=plan['message_mb'],
                 bench_repeats=bench_repeats, race_repeats=plan['race_repeats'],
                 segment_counts=segment_counts, num_workers=num_workers,
                 num_servers=num_servers, demo_servers=demo_servers,
                 gradient_mb=plan['gradient_mb'], straggler_ms=straggler_ms,
                 cluster_ok=cluster_ok, cluster_why=cluster_why, hosts_needed=hosts_needed,
                 link_mbit=plan['link_mbit'], link_delay_ms=link_delay_ms, delay_ok=delay_ok,
                 delay_why=delay_why, worker_timeout=worker_timeout, results_dir=results_dir)


# ------------------------------------------------------------------------------- notebook 08
ZERO_STRATEGIES = 4             # ddp, zero1, zero2, fsdp: each trained in every run
# The main runs' strategies: those four, and FSDP keeping the gathered layers for backward
# (zero.py's 'fsdp_keep'), the reference that isolates ZeRO-3's extra all-gather
ZERO_MAIN_STRATEGIES = ('ddp', 'zero1', 'zero2', 'fsdp', 'fsdp_keep')
# Exercise 1's timing at the largest k (zero.regather_worker's defaults): FSDP and FSDP kept for
# backward take turns in blocks of ZERO_REGATHER_BLOCK steps, a warm-up block and
# ZERO_REGATHER_REPEATS more each; counted as strategy-runs of ZERO_STEPS steps
ZERO_STEPS = 8                  # 2 warm-up, 5 timed and 1 counted step per strategy and run
ZERO_REGATHER_REPEATS, ZERO_REGATHER_BLOCK = 5, 8
ZERO_REGATHER_RUNS = 2 * (1 + ZERO_REGATHER_REPEATS) * ZERO_REGATHER_BLOCK / ZERO_STEPS
ZERO_BATCH_PER_RANK = 32
# One process's training step on a CPU, per parameter, in matmul-FLOP equivalents: forward and
# backward are 6 x 32 = 192 FLOPs; Adam, the shard copies and loopback communication through
# gloo cost far more than that. Fitted to runs on a 2-core machine (4 strategies, k = 1, 2, 4,
# 0.16 to 2.2 M parameters).
ZERO_CPU_STEP_FLOPS_PER_PARAM = 5000
ZERO_GPU_STEP_S = 5e-3          # launches, Python and collective latency per strategy-step
ZERO_GPU_HIDDEN = 4096          # about 34 M parameters: 0.5 GB per rank under DDP
ZERO_INIT_S_PER_PARAM = 2e-8    # random initialisation of a parameter on the host


def zero_parameters(hidden, in_features=100, num_hidden=2, classes=10):
    """Parameters of notebook 08's MLP (zero.make_model): in -> hidden x (num_hidden+1) -> out."""
    widths = [in_features] + [hidden] * (num_hidden + 1) + [classes]
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))


def zero_run_overhead_s(k, cores):
    """A run's cost besides its training steps: k processes forked from the forkserver (which
    imported torch once), each building its models and counting its collectives, on `cores`
    cores. Measured on 2 cores (seconds outside the steps, 08's `seconds_outside_steps_by_k`):
    0.4-1.2 s at k = 2 and 0.9-3.4 s at k = 4, the larger figures while other programs ran."""
    return 1.0 + 0.5 * k / cores


ZERO_FIXED_S = 8                # kernel, imports, the probe, starting the forkserver, plots
ZERO_CPU_WIDTHS = (512, 384, 256, 192, 128)  # widths for CPU processes, widest first
ZERO_EXACT_HIDDEN = 256         # the float64 check: every strategy on 4 CPU processes
ZERO_EXACT_PROCESSES = 4        # more than two terms per sum, so the orders of summation differ
ZERO_FLOAT64_COST = 2           # a float64 step's work against a float32 one's on a CPU


def zero_cpu_seconds(machine, runs, hidden, cost=1):
    """Seconds that CPU processes over gloo take on `machine`'s host for `runs`, a list of
    (k, strategies) pairs of the MLP at `hidden`: starting each run's k processes, and every
    strategy's ZERO_STEPS steps on k processes that share the host's cores. `cost`: a step's
    work against float32's (ZERO_FLOAT64_COST for float64)."""
    psi = zero_parameters(hidden)
    return sum(zero_run_overhead_s(k, machine.host_cores)
               + n * ZERO_STEPS * k * psi * cost * ZERO_CPU_STEP_FLOPS_PER_PARAM
               / machine.host_flops for k, n in runs)


def plan_08(machine, max_processes=4, device_counts=None):
    """Notebook 08: the MLP's hidden width, and where the k processes run.

    With a GPU for every process they run on GPUs with nccl, at a width (ZERO_GPU_HIDDEN) whose
    parameters and Adam state dwarf everything else. Otherwise every run is a CPU process over
    gloo (also on a GPU machine with fewer GPUs than processes, so that every k runs the same
    way), and the plan is the CPU's: its budget, its cores, its FLOP rate. The work planned:
    the four strategies on every k, the exercises' 2-process run of five strategies, the crash
    run, and the float64 check (ZERO_EXACT_PROCESSES CPU processes at ZERO_EXACT_HIDDEN, on
    every machine). cpu_hidden is the width of the 2-process runs when they go to CPU
    processes while the main runs use GPUs (a machine with one GPU).

    On CPU processes nothing the notebook teaches grows with the width: bytes are counted per
    parameter and memory is never short, while the time per step and float32's rounding
    differences to DDP grow. So a CPU runs at most ZERO_CPU_WIDTHS[0] (zero.py's default),
    and narrower where a slow host needs it to fit its budget."""
    counts = sorted(set(device_counts or [2**i for i in range(8) if 2**i < max_processes]
                        + [max_processes]))
    on_gpus = machine.on_gpu and machine.gpus >= max(counts)
    main_runs = [(k, len(ZERO_MAIN_STRATEGIES)) for k in counts] + [
        (max(counts), ZERO_REGATHER_RUNS)]  # exercise 1's blocks, at the largest k
    small_runs = [(2, 5), (2, 0)]  # the exercises' run and the crash
    cores = machine.host_cores
    host = on_device(machine, torch.device('cpu'))  # where the CPU processes run
    cpu_limit = budget('08', host) * 0.7  # headroom for a machine busy with other work
    exact_s = zero_cpu_seconds(host, [(ZERO_EXACT_PROCESSES, ZERO_STRATEGIES)],
                               ZERO_EXACT_HIDDEN, cost=ZERO_FLOAT64_COST)

    def cpu_width(runs, fixed_s):
        return largest_fitting(ZERO_CPU_WIDTHS,
                               lambda h: fixed_s + zero_cpu_seconds(host, runs, h), cpu_limit)

    if on_gpus:
        psi = zero_parameters(ZERO_GPU_HIDDEN)
        step = 6 * psi * ZERO_BATCH_PER_RANK / machine.flops + ZERO_GPU_STEP_S
        init = ZERO_INIT_S_PER_PARAM * psi  # each strategy builds the model on the host
        runs = main_runs + (small_runs if machine.gpus >= 2 else [])
        seconds = ZERO_FIXED_S + exact_s + sum(
            zero_run_overhead_s(k, cores) + n * (init * max(1, k / cores) + ZERO_STEPS * step)
            for k, n in runs)
        cpu_hidden = ZERO_GPU_HIDDEN
        if machine.gpus < 2:  # the 2-process runs go to CPU processes, sized as on a CPU
            cpu_hidden = cpu_width(small_runs, ZERO_FIXED_S + exact_s)
            seconds += zero_cpu_seconds(host, small_runs, cpu_hidden)
        # DDP's 16 bytes a parameter, twice over for transient copies, on each GPU
        return Plan({'hidden': ZERO_GPU_HIDDEN, 'backend': 'nccl', 'cpu_hidden': cpu_hidden},
                    seconds, device_bytes=2 * 16 * psi, host_bytes=max(counts) * 16 * psi,
                    why=f'{max(counts)} GPU(s) for {max(counts)} process(es): nccl, '
                        f'hidden={ZERO_GPU_HIDDEN} (about {psi / 1e6:.0f} M parameters); the '
                        f'runs should take about {seconds:.0f} s here, within a '
                        f'{budget("08", machine):.0f} s budget.' + (
                            f' The 2-process runs go to CPU processes at hidden={cpu_hidden}.'
                            if machine.gpus < 2 else ''))
    hidden = cpu_width(main_runs + small_runs, ZERO_FIXED_S + exact_s)
    seconds = ZERO_FIXED_S + exact_s + zero_cpu_seconds(host, main_runs + small_runs, hidden)
    psi = zero_parameters(hidden)
    over = (f' Even the narrowest takes about {seconds:.0f} s: starting {max(counts)} '
            'processes dominates.' if seconds > cpu_limit else '')
    where = (f'{machine.gpus} GPU(s) for {max(counts)} processes, so every k runs on the host '
             f'and is sized to the CPU\'s budget: ' if machine.on_gpu else '')
    widest = ('the widest a CPU runs (no lesson here needs more)'
              if hidden == ZERO_CPU_WIDTHS[0] else 'the widest that fits')
    return Plan({'hidden': hidden, 'backend': 'gloo', 'cpu_hidden': hidden}, seconds,
                host_bytes=max(counts) * (2 * 16 * psi + 400 * 2**20),  # + torch per process
                why=f'{where}gloo between CPU processes, and hidden={hidden} ({psi / 1e6:.2f} M '
                    f'parameters), {widest}. The runs should take about {seconds:.0f} s here on '
                    f'{cores} cores, within a {cpu_limit:.0f} s budget (70% of the notebook\'s); '
                    f'the float64 check runs at hidden={ZERO_EXACT_HIDDEN}, and GPUs run '
                    f'hidden={ZERO_GPU_HIDDEN}.{over}')


def setup_08(*, num_gpus=4, device_counts=None, hidden=None, batch_per_rank=32, timed_steps=5,
             lr=1e-3, memory_limit_gb=80, collective_timeout=60, worker_timeout=180):
    """Notebook 08's setup: every parameter checked (a ValueError naming it, before any
    process starts), then the process counts k, the width and the backend planned for this
    machine (plan_08), and the workers' settings: `config` for the main runs, `small_config`
    for the 2-process runs (the crash, the exercises) and `exact_config` for the float64
    check, which always runs on ZERO_EXACT_PROCESSES CPU processes."""

    helpers.check_int('num_gpus', num_gpus)
    if device_counts is None:
        ks = [2**i for i in range(num_gpus.bit_length()) if 2**i < num_gpus] + [num_gpus]
    else:
        ks = helpers.check_list('device_counts', device_counts, helpers.check_int)
    if not ks:
        raise ValueError('device_counts is empty: give at least one process count, or None')
    helpers.check_int('hidden', hidden, allow_none=True)
    helpers.check_int('batch_per_rank', batch_per_rank)
    helpers.check_int('timed_steps', timed_steps)
    helpers.check_positive('lr', lr)
    helpers.check_positive('memory_limit_gb', memory_limit_gb)
    helpers.check_int('collective_timeout', collective_timeout)
    helpers.check_int('worker_timeout', worker_timeout)
    ks = sorted(set(ks))
    machine = probe()
    plan = plan_08(machine, max(ks), ks)
    gpus = helpers.num_gpus()
    backend = plan['backend'] if torch.distributed.is_nccl_available() else 'gloo'
    config = {'hidden': hidden or plan['hidden'], 'batch_per_rank': batch_per_rank,
              'timed_steps': timed_steps, 'lr': lr, 'backend': backend,
              'timeout': collective_timeout, 'strategies': ZERO_MAIN_STRATEGIES,
              'time_phases': True}
    small_backend = backend if gpus >= 2 else 'gloo'  # the crash and the exercises: 2 ranks
    small_config = {**config, 'backend': small_backend}
    if small_backend != backend:
        small_config['hidden'] = plan['cpu_hidden']
    exact_config = {**config, 'backend': 'gloo', 'hidden': ZERO_EXACT_HIDDEN,
                    'dtype': 'float64', 'strategies': ZERO_MAIN_STRATEGIES[:ZERO_STRATEGIES]}
    cores = os.cpu_count() or 1
    where = {'nccl': 'each process drives its own GPU, with nccl.',
             'gloo': f'CPU processes talk through gloo over loopback TCP and share {cores} '
                     'cores; they stand in for GPUs.'}[backend]
    chosen = f'Chosen for this machine: {plan.why}'
    why = [chosen if hidden is None else f'hidden={hidden}, as given.',
           f'k = {ks} processes; {gpus} GPU(s) found: {where}']
    if gpus and backend == 'gloo':
        why.append(f'{gpus} GPU(s) are fewer than {max(ks)} processes: num_gpus={gpus} runs '
                   'on the GPUs, with nccl.')
    if small_backend != backend:
        why.append(f'The 2-process runs (a crash, the exercises) use CPU processes over gloo, '
                   f'at hidden={small_config["hidden"]}: there is one GPU.')
    return Setup(why, machine=machine, plan=plan, ks=ks, k_max=max(ks), gpus_found=gpus,
                 backend=backend, cores=cores, hidden=config['hidden'], config=config,
                 small_config=small_config, exact_config=exact_config, num_gpus=num_gpus,
                 batch_per_rank=batch_per_rank, timed_steps=timed_steps, lr=lr,
                 memory_limit_gb=memory_limit_gb, collective_timeout=collective_timeout,
                 worker_timeout=worker_timeout)


# ------------------------------------------------------------------------------- notebook 09
MP_HIDDEN_09 = {'cpu': 256, 'cuda': 4096}  # the width tensor parallelism splits (TP, mesh)
MP_TOKENS_09 = {'cpu': (4, 32), 'cuda': (8, 512)}  # (batch, sequence) of the TP lesson
MP_PP_WIDTHS_09 = (1024, 768, 512, 384, 256)  # pipeline layer widths for CPUs, widest first
MP_PP_GPU_WIDTH_09 = 2048      # every rank builds the whole stack, float32 and float64
MP_PP_ROWS_PER_MICROBATCH_09 = 64  # rows of the largest m's micro-batches
MP_LAYERS_PER_STAGE_09 = 4      # model_parallel.PP_DEFAULTS['layers_per_rank']
# A pipeline step on a CPU process, against its share of the probe's matmul rate: small
# micro-batches and the schedule's bookkeeping reach about 60% of it (fitted on 2 cores,
# width 1024, 64-row micro-batches).
MP_CPU_EFFICIENCY_09 = 0.6
MP_GPU_STEP_S_09 = 0.02         # launches, Python and messages per pipeline step on GPUs
MP_FIXED_S_09 = 12              # kernel, imports, the probe, the forkserver, plots
MP_RUN_S_09 = 1.0               # starting one run's processes from the forkserver, per core
MP_MESH_S_09 = 2.0              # the mesh lesson's training, per process on 2 cores


def mesh_shape_09(num_gpus):
    """The 2-D mesh for num_gpus processes: 2 data-parallel groups of num_gpus / 2 tensor-
    parallel ranks where num_gpus is even and at least 4; otherwise (1, num_gpus), tensor
    parallelism alone, since no mesh with both sides of 2 or more has num_gpus ranks."""
    return (2, num_gpus // 2) if num_gpus >= 4 and num_gpus % 2 == 0 else (1, num_gpus)


def plan_09(machine, num_gpus=4, tp_degree=None, pp_stages=None, mesh_shape=None,
            microbatches=None, pp_steps=3):
    """Notebook 09: how many processes each lesson runs on, the width tensor parallelism splits,
    the pipeline's width and batch, and the backend.

    With a GPU for every process the lessons run on GPUs with nccl; otherwise on CPU processes
    over gloo, sized to the CPU's budget. The tensor-parallel lesson and the mesh are small on
    every machine: what they teach (equal results, bytes counted against the papers) does not
    grow with the width. The pipeline's idle share does: each micro-batch must compute long
    enough that the schedule's bookkeeping and messages do not swamp it, so its layers are the
    widest that fit. On a CPU every stage needs a core of its own to compute while the others
    do, so the pipeline has at most as many stages as the CPU has cores."""
    cores = machine.host_cores
    on_gpus = machine.on_gpu and machine.gpus >= num_gpus
    where = 'cuda' if on_gpus else 'cpu'
    t = tp_degree or num_gpus
    p = pp_stages or (num_gpus if on_gpus else max(1, min(num_gpus, cores)))
    dp_tp = tuple(mesh_shape or mesh_shape_09(num_gpus))
    ms = sorted(set(microbatches or (p, 2 * p, 4 * p)))
    lcm_tp = math.lcm(t, dp_tp[1])
    hidden = math.ceil(MP_HIDDEN_09[where] / lcm_tp) * lcm_tp
    batch, seq = MP_TOKENS_09[where]
    seq = math.ceil(seq / t) * t  # sequence parallelism gives each rank 1/t of the sequence
    pp_batch = max(ms) * MP_PP_ROWS_PER_MICROBATCH_09
    runs = 3 + (p >= 2)  # sections' runs of processes, and the exercises'
    fixed = MP_FIXED_S_09 + runs * MP_RUN_S_09 * max(1, num_gpus / cores)
    mesh = MP_MESH_S_09 * math.prod(dp_tp) * max(1, 2 / cores)
    steps = (2 * len(ms) + 1) * (pp_steps + 1) + (2 if p >= 2 else 0)  # + 05's reference

    def seconds(width):
        flops = 3 * 2 * pp_batch * width**2 * MP_LAYERS_PER_STAGE_09
        if on_gpus:
            step = flops / machine.flops + MP_GPU_STEP_S_09 * max(ms)
        else:
            step = flops / (MP_CPU_EFFICIENCY_09 * machine.host_flops / cores) * max(1, p / cores)
        return fixed + mesh + steps * step

    # CPU processes on a GPU machine keep the CPU's budget
    limit = budget('09', machine if on_gpus else on_device(machine, torch.device('cpu'))) * 0.7
    width = (MP_PP_GPU_WIDTH_09 if on_gpus else
             largest_fitting(MP_PP_WIDTHS_09, seconds, limit))
    values = {'tp_degree': t, 'pp_stages': p, 'mesh_shape': dp_tp, 'microbatches': ms,
              'hidden': hidden, 'pp_width': width, 'pp_batch': pp_batch, 'tp_batch': batch,
              'tp_seq': seq, 'backend': 'nccl' if on_gpus else 'gloo'}
    over = (f' Even that takes about {seconds(width):.0f} s here, beyond the {limit:.0f} s '
            'planned: this machine is slow or busy.' if seconds(width) > limit else '')
    why = (f'Pipeline layers {width} wide, micro-batches of {MP_PP_ROWS_PER_MICROBATCH_09} '
           f'rows at m={max(ms)}: the widest whose runs fit {limit:.0f} s here (about '
           f'{seconds(width):.0f} s planned); hidden={hidden} for tensor parallelism (it must '
           f'divide by {lcm_tp}).{over}')
    params = 2 * hidden * (hidden // 4) + zero_parameters(hidden)
    # each rank builds the whole stack of 4p layers twice (its copy and the single-process
    # reference), in float32 and float64: 2 x 12 bytes a weight
    stack = 2 * 12 * MP_LAYERS_PER_STAGE_09 * p * width**2
    return Plan(values, seconds(width), why=why,
                device_bytes=int(2 * 16 * params + stack) if on_gpus else 0,
                host_bytes=int(num_gpus * (400 * 2**20 + 16 * params + stack)))


def setup_09(*, num_gpus=4, tp_degree=None, pp_stages=None, mesh_shape=None,
             microbatches=None, hidden=None, pp_width=None, pp_steps=3, collective_timeout=60,
             worker_timeout=180):
    """Notebook 09's setup: every parameter checked (a ValueError naming it, before any process
    starts), a layout that cannot work refused by name (a tensor-parallel degree that does not
    divide `hidden`, a mesh or a pipeline with more ranks than num_gpus, fewer micro-batches
    than stages), then the sizes planned for this machine (plan_09) and each lesson's worker
    settings: `tp_config`, `pp_config`, `mesh_config`."""

    helpers.check_int('num_gpus', num_gpus)
    for name, value in (('tp_degree', tp_degree), ('pp_stages', pp_stages)):
        helpers.check_int(name, value, allow_none=True)
        if value is not None and value > num_gpus:
            raise ValueError(f'{name}={value} needs {value} processes, but num_gpus={num_gpus}')
    if mesh_shape is not None:
        mesh_shape = helpers.check_list('mesh_shape', mesh_shape, helpers.check_int)
        if len(mesh_shape) != 2:
            raise ValueError(f'mesh_shape must be two sizes (data-parallel, tensor-parallel), '
                             f'got {mesh_shape!r}')
        if math.prod(mesh_shape) > num_gpus:
            raise ValueError(f'mesh_shape={tuple(mesh_shape)} needs {math.prod(mesh_shape)} '
                             f'processes, but num_gpus={num_gpus}')
    if microbatches is not None:
        microbatches = helpers.check_list('microbatches', microbatches, helpers.check_int)
        if not microbatches:
            raise ValueError('microbatches is empty: give at least one count m, or None')
    helpers.check_int('hidden', hidden, allow_none=True)
    helpers.check_int('pp_width', pp_width, allow_none=True)
    helpers.check_int('pp_steps', pp_steps)
    helpers.check_int('collective_timeout', collective_timeout)
    helpers.check_int('worker_timeout', worker_timeout)
    machine = probe()
    plan = plan_09(machine, num_gpus, tp_degree, pp_stages, mesh_shape, microbatches, pp_steps)
    t, p, (dp, mesh_tp) = plan['tp_degree'], plan['pp_stages'], plan['mesh_shape']
    for name, degree in (('tp_degree', t), ('mesh_shape', mesh_tp)):
        if hidden is not None and hidden % degree:
            raise ValueError(f'hidden={hidden} does not divide into {degree} equal parts: '
                             f'the tensor-parallel degree of {name} ({degree}) must divide it')
    if min(plan['microbatches']) < p:
        raise ValueError(f'each of microbatches must be at least pp_stages={p}: 1F1B fills the '
                         f'pipeline with p micro-batches first, got {plan["microbatches"]}')
    ms = plan['microbatches']
    pp_batch = math.lcm(*ms) * math.ceil(plan['pp_batch'] / math.lcm(*ms))  # every m divides it
    gpus = helpers.num_gpus()
    backend = plan['backend'] if torch.distributed.is_nccl_available() else 'gloo'
    given = [f'{name}={value}' for name, value in (('hidden', hidden), ('pp_width', pp_width))
             if value is not None]
    hidden = hidden or plan['hidden']
    common = {'backend': backend, 'timeout': collective_timeout}
    tp_config = {**common, 'hidden': hidden, 'd_model': max(1, hidden // 4),
                 'batch': plan['tp_batch'], 'seq': plan['tp_seq']}
    pp_config = {**common, 'width': pp_width or plan['pp_width'], 'batch': pp_batch,
                 'microbatches': tuple(ms), 'steps': pp_steps}
    mesh_config = {**common, 'hidden': hidden, 'mesh_shape': (dp, mesh_tp),
                   'batch_per_rank': ZERO_BATCH_PER_RANK}
    cores = os.cpu_count() or 1
    where = {'nccl': 'each process drives its own GPU, with nccl.',
             'gloo': f'CPU processes talk through gloo over loopback TCP and share {cores} '
                     'cores; they stand in for GPUs.'}[backend]
    why = [f'{num_gpus} process(es); {gpus} GPU(s) found: {where}',
           f'Tensor parallelism over {t} rank(s), a pipeline of {p} stage(s) at m = {ms}, a '
           f'{dp} x {mesh_tp} mesh (data-parallel x tensor-parallel).',
           plan.why if not given else f'{", ".join(given)} as given; the rest as planned.']
    if pp_stages is None and p < num_gpus:
        why.append(f'The pipeline has {p} stages, not {num_gpus}: a stage computes while the '
                   f'others do only on a core of its own, and this CPU has {cores}; pass '
                   f'pp_stages={num_gpus} to run more stages on shared cores.')
    if mesh_shape is None and dp == 1:
        why.append(f'{num_gpus} process(es) make no mesh with two or more ranks on both sides: '
                   f'the mesh lesson runs tensor parallelism alone on a 1 x {mesh_tp} mesh.')
    if gpus and backend == 'gloo':
        why.append(f'{gpus} GPU(s) are fewer than {num_gpus} processes: num_gpus={gpus} runs '
                   'on the GPUs, with nccl.')
    return Setup(why, machine=machine, plan=plan, num_gpus=num_gpus, gpus_found=gpus,
                 backend=backend, cores=cores, tp_degree=t, pp_stages=p, dp=dp, mesh_tp=mesh_tp,
                 microbatches=ms, hidden=hidden, tp_config=tp_config, pp_config=pp_config,
                 mesh_config=mesh_config, pp_steps=pp_steps,
                 collective_timeout=collective_timeout, worker_timeout=worker_timeout)
