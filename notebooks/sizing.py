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
import dataclasses
import functools
import math
import os
import time
from dataclasses import dataclass, field

import torch

BUDGET_S = {'cpu': {'01': 60, '02': 60, '03': 60, '04': 60, '05': 90, '06': 90, '07': 90,
                    '08': 90},
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


class _threads:
    def __init__(self, n):
        self.n = n

    def __enter__(self):
        self.previous = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *args):
        torch.set_num_threads(self.previous)


class _no_tf32:
    """Measure plain fp32: TF32 would report a tensor-core rate no fp32 layer gets."""

    def __enter__(self):
        self.previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *args):
        torch.backends.cuda.matmul.allow_tf32 = self.previous


@functools.lru_cache(maxsize=None)
def probe(seconds=0.15):
    """Measure this machine (about 2.5 x `seconds`, plus about 0.65 s a GPU): the Machine every
    plan here takes. With several GPUs it is planned as k of the slowest."""
    host_flops = _matmul_flops(torch.device('cpu'), 512, seconds)
    with _threads(1):  # intra-op threads that wait for a core another program holds can run
        single = _matmul_flops(torch.device('cpu'), 512, seconds / 2)  # slower than one
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
    asked to run on its CPU is planned as a CPU."""
    if machine.on_gpu and device.type != 'cuda':
        return dataclasses.replace(machine, kind='cpu', flops=machine.host_flops,
                                   memory=machine.host_memory)
    return machine


# ---------------------------------------------------------------------- one plan per notebook
# Each plan_NN(machine, ...) returns a Plan whose values fill the notebook's None parameters.


# ------------------------------------------------------------------------- notebooks 01 to 03
LAUNCH_S = 10e-6                # issuing one operator from Python to a GPU (t1), about
HOST_COPY_BYTES_S = 5e9         # a slow host's single-core memory copy, bytes per second
GPU_BYTES_S = 250e9             # a T4-class GPU's memory bandwidth (faster GPUs: more)


def plan_01(machine, chain_length=16, repeats=7):
    """Notebook 01: the MLP batch sizes and the size of the elementwise chain.

    The notebook's time goes mostly to inductor's compilations (seven of them: about 1.5 s each
    with a warm cache and 5-10 s cold on a CPU; Triton's on a GPU take longer), which no size
    changes. The chain is the one sized workload: its eager run moves 3 x chain_length x 2
    passes over the tensor, timed `repeats` times in three modes, at the exercise's lengths too.
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
    queue = 4 * 8 * queue_numel * 13 * 4 / (GPU_BYTES_S if machine.on_gpu else HOST_COPY_BYTES_S)
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


# ------------------------------------------------------------------------------- notebook 04
# Matrix products are sized per precision from a short probe of each (a small product), because
# rates differ by up to 100x on one machine: a CPU without bf16 instructions emulates bf16
# matmul about a hundred times slower than fp32, so one size for all precisions fits no budget.
MATMUL_SIZES_04 = (8192, 6144, 4096, 3072, 2048, 1536, 1024, 768, 512, 384, 256, 128)
MATMUL_CALL_S_04 = {'cpu': 0.25, 'cuda': 1.0}   # longest single product per precision
MATMUL_BOOK_04 = {'cpu': 2048, 'cuda': 8192}    # the sizes the notebook used before it was sized
DEPENDENT_READS_04 = 2**20                      # pointer-chasing steps per working set
CPU_FIXED_S_04 = 14        # what no parameter sizes on a CPU: imports, vectorisation, latency
                           # table, storage, precision demo, plots (measured on 2 cores)


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
                 'thread_counts': threads}, seconds, device_bytes=device_bytes,
                host_bytes=host_bytes, why=why)


# ------------------------------------------------------------------------------- notebook 05
LENET_TRAIN_FLOPS = 3 * 4.5e6   # LeNet's forward pass is 4.5 MFLOP an example; backward twice that
LENET_PARAMS = 129_068
CPU_LENET_EFFICIENCY = 0.25     # LeNet's small convolutions run at about a quarter of matmul's rate
GPU_LENET_EFFICIENCY = 0.1      # tiny kernels: far from a GPU's matmul rate
GPU_REPLICA_STEP_S = 3e-3       # launches and Python per replica per step (about 80 kernels)
GPU_LOADER_S_PER_EXAMPLE = 1e-5  # DataLoader indexing and collating on a slow host, per example
BOOK_05 = {'num_epochs': 10, 'num_train': 60000, 'num_test': 10000}


def plan_05(machine, num_gpus=2, batch_size=256, device_counts=(1, 2), equivalence_steps=5):
    """Notebook 05: epochs and examples for LeNet trained by hand on k (emulated) devices.

    The notebook trains once per k in device_counts for num_epochs epochs, three more single
    epochs (a 4x smaller and a 4x larger global batch, and the larger one with a scaled learning
    rate), and a few dozen steps for the equivalence checks. On a GPU the book's scale (10 epochs
    of 60,000 examples) is kept where it fits the budget; on a CPU two epochs of the largest
    subset that fits are chosen, because that subset is what CI runs."""
    per_example = LENET_TRAIN_FLOPS / (machine.flops * (
        GPU_LENET_EFFICIENCY if machine.on_gpu else CPU_LENET_EFFICIENCY))

    def step_s(batch, k):  # one synchronous step of `batch` examples over k replicas
        if not machine.on_gpu:
            return batch * per_example * (1 + 0.1 * (k - 1))  # emulated: k small passes
        return (batch * (per_example + GPU_LOADER_S_PER_EXAMPLE)
                + k * GPU_REPLICA_STEP_S * (1 + batch / 4096))

    def seconds(sizes):
        epochs, n, n_test = sizes['num_epochs'], sizes['num_train'], sizes['num_test']
        train = sum(epochs * (n // batch_size) * step_s(batch_size, k) for k in device_counts)
        larger = [(max(1, batch_size // 4), 1), (4 * batch_size, 1), (4 * batch_size, 1)]
        train += sum((n // b) * step_s(b, k) for b, k in larger)
        # float64 (about 3x), float32 and TF32 checks, even and uneven, and exercise 2, each
        # of two runs on a batch of about 64
        equivalence = (2 * (3 + 1 + 1) * equivalence_steps + 3 * 3) * 2 * step_s(64, num_gpus)
        evaluations = (epochs * len(device_counts) + 5) * n_test * per_example / 3
        return train + equivalence + evaluations

    if machine.on_gpu:
        candidates = [BOOK_05, {**BOOK_05, 'num_epochs': 5}, {**BOOK_05, 'num_epochs': 2},
                      {'num_epochs': 2, 'num_train': 20000, 'num_test': 5000}]
        limit = budget('05', machine) * 0.5  # the rest: pipeline processes, timings, start-up
    else:
        candidates = [{'num_epochs': 2, 'num_train': n, 'num_test': 1000}
                      for n in (60000, 30000, 20000, 16000, 12000, 10000, 8000, 6000, 5000,
                                4000, 3000, 2000)]
        # the rest of the 90 s: kernel start, two worker processes, the timing sections, and
        # headroom for a machine that is busy with other work
        limit = budget('05', machine) * 0.27
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
    estimate and the timeout are those of the work actually run."""
    given = {k: v for k, v in dict(batch_size=batch_size, width=width, num_epochs=num_epochs,
                                   num_train=num_train, num_test=num_test).items()
             if v is not None}
    gpus = machine.gpus if machine.on_gpu else 0
    counts = sorted(set(device_counts))
    dp_counts = [k for k in counts if k <= gpus] or [1]

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
        compute = batch * flops / (GPU_CONV_EFFICIENCY_06 * machine.flops * devices)
        if dataparallel or k == 1:
            comm = 0
        elif k <= gpus:
            comm = 4 * params / NCCL_BYTES_S_06
        else:                    # ranks share GPUs: gradients go through host memory and gloo
            comm = 4 * params / GLOO_BYTES_S_06
        return compute + GPU_STEP_S_06 * (k if k > gpus else 1) + comm

    def run_s(sizes, k, dataparallel=False):
        flops = resnet18_size_06(sizes['width'])[0]
        rate = (GPU_CONV_EFFICIENCY_06 * machine.flops if machine.on_gpu
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


# ------------------------------------------------------------------------------- notebook 07
# Notebook 07 runs CPU processes that talk gloo on every machine, GPU or not, so its plan sizes
# only messages, repeats and demo lengths, to the CPU budget. Rates measured on a 2-core machine:
LOOPBACK_BUSBW_07 = 0.8e9   # ring or dist.all_reduce bus bandwidth over loopback, a core each
FIXED_S_07 = 28             # kernel, imports, the first forked process, small runs, plots
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
        one = sum(loopback(2, s, 1) + sum(loopback(n, s, 2 * (n - 1) / n) * 2
                                           + loopback(n, s, 2 * (n - 1)) for n in groups)
                  for s in sizes[:-1])
        return (bench_repeats + 1) * (one + loopback(2, mb, 1) + sum(
            loopback(n, mb, 2 * (n - 1)) for n in groups))

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

    limit = budget('07', machine) * 0.7  # headroom for a machine busy with other work
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


# ------------------------------------------------------------------------------- notebook 08
ZERO_STRATEGIES = 4             # ddp, zero1, zero2, fsdp: each trained in every run
ZERO_STEPS = 8                  # 2 warm-up, 5 timed and 1 counted step per strategy and run
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
    """A run's cost besides its training steps: k processes that import torch and FSDP and
    build the models, on `cores` cores (measured on 2 cores with a small model: 5.3, 7.3 and
    15.8 s for k = 1, 2 and 4)."""
    return 2.5 + 6.0 * k / cores


def plan_08(machine, max_processes=4, device_counts=None):
    """Notebook 08: the MLP's hidden width, and where the k processes run.

    With a GPU for every process they run on GPUs with nccl, at a width (ZERO_GPU_HIDDEN) whose
    parameters and Adam state dwarf everything else. Otherwise they are CPU processes over gloo
    on the host (also on a GPU machine with fewer GPUs than processes, so that every k runs the
    same way), and the width is the largest whose runs fit the CPU budget: the notebook trains
    the four strategies on every k, plus a crash run and a 2-process run for the exercises.
    cpu_hidden is the width for runs that go to CPU processes while the main runs use GPUs (the
    2-process runs on a machine with one GPU)."""
    counts = sorted(set(device_counts or [2**i for i in range(8) if 2**i < max_processes]
                        + [max_processes]))
    on_gpus = machine.on_gpu and machine.gpus >= max(counts)
    main_runs = [(k, ZERO_STRATEGIES) for k in counts]
    small_runs = [(2, 5), (2, 0)]  # the exercises' run and the crash
    cores = machine.host_cores

    def cpu_seconds(hidden, runs):
        psi = zero_parameters(hidden)
        work = sum(n * ZERO_STEPS * k * psi * ZERO_CPU_STEP_FLOPS_PER_PARAM / machine.host_flops
                   for k, n in runs)
        return sum(zero_run_overhead_s(k, cores) for k, _ in runs) + work

    def cpu_width(runs, limit):
        return largest_fitting([2048, 1536, 1024, 768, 512, 384, 256],
                               lambda h: 5 + cpu_seconds(h, runs), limit)

    limit = budget('08', machine) * 0.7  # headroom for a machine busy with other work
    if on_gpus:
        psi = zero_parameters(ZERO_GPU_HIDDEN)
        step = 6 * psi * ZERO_BATCH_PER_RANK / machine.flops + ZERO_GPU_STEP_S
        init = ZERO_INIT_S_PER_PARAM * psi  # each strategy builds the model on the host
        runs = main_runs + (small_runs if machine.gpus >= 2 else [])
        seconds = 5 + sum(zero_run_overhead_s(k, cores)
                          + n * (init * max(1, k / cores) + ZERO_STEPS * step) for k, n in runs)
        cpu_hidden = ZERO_GPU_HIDDEN
        if machine.gpus < 2:  # the 2-process runs go to CPU processes, at a CPU's width
            cpu_hidden = cpu_width(small_runs, limit - seconds)
            seconds += cpu_seconds(cpu_hidden, small_runs)
        # DDP's 16 bytes a parameter, twice over for transient copies, on each GPU
        return Plan({'hidden': ZERO_GPU_HIDDEN, 'backend': 'nccl', 'cpu_hidden': cpu_hidden},
                    seconds, device_bytes=2 * 16 * psi, host_bytes=max(counts) * 16 * psi,
                    why=f'{max(counts)} GPU(s) for {max(counts)} process(es): nccl, about '
                        f'{psi / 1e6:.0f} M parameters.' + (
                            f' The 2-process runs go to CPU processes at hidden={cpu_hidden}.'
                            if machine.gpus < 2 else ''))
    hidden = cpu_width(main_runs + small_runs, limit)
    seconds = 5 + cpu_seconds(hidden, main_runs + small_runs)
    psi = zero_parameters(hidden)
    over = (f' Even the narrowest takes about {seconds:.0f} s: starting {max(counts)} '
            'processes dominates.' if seconds > limit else '')
    where = (f'{machine.gpus} GPU(s) for {max(counts)} processes: CPU processes over gloo on the '
             f'host, so that every k runs the same way. ' if machine.on_gpu else '')
    return Plan({'hidden': hidden, 'backend': 'gloo', 'cpu_hidden': hidden}, seconds,
                host_bytes=max(counts) * (2 * 16 * psi + 400 * 2**20),  # + torch per process
                why=f'{where}hidden={hidden} ({psi / 1e6:.2f} M parameters) is the widest MLP '
                    f'whose runs fit {limit:.0f} s on {cores} cores; hidden={ZERO_GPU_HIDDEN} '
                    f'is the size GPUs run.{over}')
