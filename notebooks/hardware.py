"""What this machine is, read from the operating system and measured once; notebooks cite it.

The course explains speeds by this probe, not by guesses:
- `cpu_info()`: the processor as Linux describes it (model, flags, cores, caches, clocks);
- `microarchitecture(info)`: its vector units, and from them the peak FLOP per cycle and core,
  decided by the instruction-set flags first and the family/model number second (a hypervisor
  may report a model number that does not match the flags it passes through);
- `two_thread_scaling()`: whether two hardware threads behave as two cores, measured with
  work that needs the arithmetic units (matrix products) and work that waits on latency (a
  comparison sort's mispredicted branches). SMT siblings share one core's units: the first barely
  scales, the second nearly doubles. A virtual machine's OS cannot see which it has;
- `LoadMeter`: how much CPU other programs (and other virtual machines) took during a block;
- `diagnose()`: all of it, as notebook 04 records it under `machine`, kept on disk for the
  other notebooks until the machine reboots.
"""
import contextlib
import dataclasses
import functools
import json
import math
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import helpers
from datasheets import (  # noqa: F401  (notebooks read them as hardware.X)
    GPU_PRECISIONS,
    GPU_SPECS,
    Microarchitecture,
    flops_per_cycle,
    gpu_memory_gbs,
    gpu_peak_flops,
    gpu_spec,
    microarchitecture,
    peak_flops,
    roof_clock,
)
from stats import NOISE_FLOOR, median

SYS_CPU = Path('/sys/devices/system/cpu')


# ----------------------------------------------------------------- what the OS says
def parse_size(text):
    """A cache or memory size as Linux writes it ('48K', '2048K', '480M', '1G', '32 MiB')
    in bytes."""
    m = re.fullmatch(r'\s*(\d+)\s*([KMG]?)(?:i?B)?\s*', str(text), re.I)
    if not m:
        raise ValueError(f'not a size: {text!r}')
    return int(m.group(1)) * {'': 1, 'K': 2**10, 'M': 2**20, 'G': 2**30}[m.group(2).upper()]


def _cpu_count_in(cpu_list):
    """'0-3,8' -> 5 (a sysfs cpu list)."""
    total = 0
    for part in cpu_list.strip().split(','):
        if part:
            lo, _, hi = part.partition('-')
            total += int(hi or lo) - int(lo) + 1
    return total


def cache_sizes(cpu_dir=SYS_CPU / 'cpu0'):
    """{'L1': bytes, 'L2': ..., 'L3': ...} of the data and unified caches, and
    {'L1': logical cores sharing it, ...}; empty where the system does not say."""
    sizes, shared = {}, {}
    for index in sorted(Path(cpu_dir, 'cache').glob('index*')):
        with contextlib.suppress(OSError, ValueError):
            if (index / 'type').read_text().strip() == 'Instruction':
                continue
            level = f'L{(index / "level").read_text().strip()}'
            sizes[level] = parse_size((index / 'size').read_text())
            shared[level] = _cpu_count_in((index / 'shared_cpu_list').read_text())
    return sizes, shared


def last_level_cache(device=None):
    """(name, bytes) of the last cache before memory: the CPU's largest level, or on a CUDA
    `device` the GPU's L2 (the cache GPU work runs through); (None, None) where unknown."""
    if device is not None and torch.device(device).type == 'cuda':
        return 'GPU L2', torch.cuda.get_device_properties(torch.device(device)).L2_cache_size
    sizes, _ = cache_sizes()
    if not sizes:
        return None, None
    name = max(sizes)
    return name, sizes[name]


@dataclass(frozen=True)
class CpuInfo:
    model: str
    vendor: str = ''
    family: int = None
    model_number: int = None
    logical_cores: int = 1
    physical_cores: int = None      # distinct (package, core) pairs the OS sees
    smt_siblings: int = 1           # hardware threads per core the OS sees
    flags: frozenset = frozenset()
    caches: dict = field(default_factory=dict)
    cache_shared_by: dict = field(default_factory=dict)
    nominal_ghz: float = None
    nominal_from: str = 'unknown'
    max_ghz: float = None
    virtual: bool = False           # the 'hypervisor' flag: a virtual machine


def _siblings():
    """Hardware threads per core, from each CPU's topology/thread_siblings_list."""
    counts = []
    for path in SYS_CPU.glob('cpu[0-9]*/topology/thread_siblings_list'):
        with contextlib.suppress(OSError, ValueError):
            counts.append(_cpu_count_in(path.read_text()))
    return max(counts, default=1)


@functools.lru_cache(maxsize=None)
def cpu_info():
    """The processor as the operating system describes it (Linux; elsewhere mostly unknown)."""
    fields = dict(model=helpers.cpu_model(), logical_cores=os.cpu_count() or 1)
    cpuinfo = Path('/proc/cpuinfo')
    if cpuinfo.exists():
        blocks = [dict(re.findall(r'^([^\t:]+?)\s*:\s*(.*)$', b, re.M))
                  for b in cpuinfo.read_text().split('\n\n') if b.strip()]
        first = blocks[0] if blocks else {}
        cores = {(b.get('physical id'), b.get('core id')) for b in blocks if 'core id' in b}
        flags = frozenset(first.get('flags', first.get('Features', '')).split())
        mhz = [float(b['cpu MHz']) for b in blocks if 'cpu MHz' in b]
        named = re.search(r'@\s*([\d.]+)\s*GHz', fields['model'])
        fields.update(vendor=first.get('vendor_id', ''), flags=flags, virtual='hypervisor' in flags,
                      physical_cores=len(cores) or None)
        with contextlib.suppress(ValueError):
            fields.update(family=int(first['cpu family']), model_number=int(first['model']))
        if named:
            fields.update(nominal_ghz=float(named.group(1)), nominal_from='the model name')
        elif mhz:  # a virtual machine's nominal clock; elsewhere the clock of the moment
            fields.update(nominal_ghz=max(mhz) / 1e3, nominal_from='"cpu MHz" in /proc/cpuinfo')
    freq = SYS_CPU / 'cpu0' / 'cpufreq'
    with contextlib.suppress(OSError, ValueError):
        fields.update(nominal_ghz=int((freq / 'base_frequency').read_text()) / 1e6,
                      nominal_from='cpufreq base_frequency')
    with contextlib.suppress(OSError, ValueError):
        fields['max_ghz'] = int((freq / 'cpuinfo_max_freq').read_text()) / 1e6
    caches, shared = cache_sizes()
    return CpuInfo(**fields, smt_siblings=_siblings(), caches=caches, cache_shared_by=shared)


# ------------------------------------------------------------- are they two cores?
# ---- saved from 04_hardware.ipynb by make export: edit the notebook
def _cpus_in(cpu_list):
    """'0-3,8' -> {0, 1, 2, 3, 8} (a sysfs cpu list)."""
    cpus = set()
    for part in filter(None, cpu_list.strip().split(',')):
        lo, _, hi = part.partition('-')
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def smt_pair():
    """Two logical CPUs that the OS lists as SMT siblings of one core and this process may run
    on; None where it lists none, or cannot pin a thread (no os.sched_setaffinity)."""
    if not hasattr(os, 'sched_setaffinity'):
        return None
    allowed = os.sched_getaffinity(0)
    for cpu in sorted(allowed):
        with contextlib.suppress(OSError, ValueError):
            listed = (SYS_CPU / f'cpu{cpu}' / 'topology' / 'thread_siblings_list').read_text()
            siblings = sorted(_cpus_in(listed) & allowed)
            if len(siblings) >= 2:
                return siblings[:2]
    return None


def _throughput(work, threads, seconds, cpus=None):
    """Calls of work() per second, summed over `threads` Python threads running it at once,
    thread i pinned to logical CPU cpus[i] when `cpus` is given (on Linux, pid 0 names the
    calling thread). Each thread asks for one intra-op thread itself: OpenMP's thread count
    is per thread. The work releases the interpreter lock."""
    counts, stop = [0] * threads, threading.Event()

    def loop(i):
        torch.set_num_threads(1)
        if cpus:
            with contextlib.suppress(OSError):  # a CPU taken away meanwhile: run unpinned
                os.sched_setaffinity(0, {cpus[i]})
        while not stop.is_set():
            work()
            counts[i] += 1
    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    tik = time.perf_counter()
    for t in pool:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in pool:
        t.join()
    return sum(counts) / (time.perf_counter() - tik)


def two_thread_scaling(seconds=0.15, repeats=3):
    """{'compute': x, 'latency': y}: how much more two threads got done than one, on work that
    keeps the FMA units busy (256 x 256 fp32 products) and on work that waits on mispredicted
    branches (a comparison sort of 2**14 keys), on one core's SMT siblings where the OS lists them.
    Medians of `repeats` alternating runs; about 2 x kinds x repeats x `seconds` in all."""
    a = torch.randn(256, 256)
    keys = torch.randint(0, 2**31 - 1, (2**14,), dtype=torch.int32)  # < 2**15: no radix sort
    kinds = {'compute': lambda: a @ a, 'latency': lambda: torch.sort(keys)}
    ratios, cpus = {k: [] for k in kinds}, smt_pair()
    with helpers.num_threads(1):  # restored afterwards, for every library, by this thread
        for work in kinds.values():
            work()
        for _ in range(repeats):
            for kind, work in kinds.items():
                one = _throughput(work, 1, seconds, cpus)
                ratios[kind].append(_throughput(work, 2, seconds, cpus) / one)
    return {k: median(v) for k, v in ratios.items()}


# What the probe says the logical cores are: one sentence per kind
CORES_TEMPLATES = {
    'separate': """{n} logical cores that behave as separate cores: two threads did
        {compute:.2f}x the FMA-bound work of one (matrix products) and {latency:.2f}x the
        branch-bound work (sorting).""",
    'siblings': """{n} logical cores that behave as SMT siblings sharing one core's FMA
        units: two threads did only {compute:.2f}x the FMA-bound work of one (matrix
        products), but {latency:.2f}x the branch-bound work (sorting).""",
    'unclear': """{n} logical cores whose sharing the probe could not settle: two threads
        did {compute:.2f}x the FMA-bound work of one (matrix products) and {latency:.2f}x
        the branch-bound work (sorting), while other programs took {others:.0%} of the CPU.""",
    'one': 'one logical core: nothing to share.',
    'noise': """{n} logical cores, but this probe is noise: two threads did {compute:.2f}x the
        FMA-bound work of one and {latency:.2f}x the branch-bound work, and two threads
        cannot do more than twice what one does (something slowed the one-thread runs).""",
}


TWO_THREADS_MAX = 2.0  # two threads can at most double one thread's work
SCALES = 1.6  # two threads / one from which a kind of work counts as doubling
SHARED = 1.3  # two threads / one below which the FMA units count as shared


def above_two(scaling):
    """Whether a two-thread reading exceeds 2 beyond the noise floor: not a property of the
    cores to model, but a sign that the one-thread runs were slowed (a busy machine, a clock)."""
    return any(v > TWO_THREADS_MAX * (1 + NOISE_FLOOR) for v in scaling.values())


def what_the_cores_are(scaling, logical_cores, others_share=0.0):
    """('separate' | 'siblings' | 'unclear' | 'noise' | 'one', the sentence that says so)."""
    if logical_cores < 2:
        return 'one', CORES_TEMPLATES['one']
    compute, latency = scaling['compute'], scaling['latency']
    kind = 'unclear'
    if above_two(scaling):
        kind = 'noise'
    elif compute >= SCALES and latency >= SCALES:
        kind = 'separate'
    elif compute < SHARED and latency >= SCALES:
        kind = 'siblings'
    sentence = CORES_TEMPLATES[kind].format(n=logical_cores, compute=compute, latency=latency,
                                            others=others_share)
    return kind, ' '.join(sentence.split())
# ---- end of what 04_hardware.ipynb saves


# ---------------------------------------------------------------- background load
def _machine_ticks():
    """(busy, steal) clock ticks of the whole machine since boot, from /proc/stat."""
    with open('/proc/stat') as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return v[0] + v[1] + v[2] + (v[5] if len(v) > 5 else 0) + (v[6] if len(v) > 6 else 0), \
        (v[7] if len(v) > 7 else 0)


def _own_ticks():
    """Clock ticks this process and every live descendant have run (with the reaped children
    each of them waited for): the CPU time that is ours, workers included."""
    pids, parents = {os.getpid()}, {}
    for stat in Path('/proc').glob('[0-9]*/stat'):
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = stat.read_text()
            rest = text[text.rindex(')') + 2:].split()
            parents[int(stat.parent.name)] = (int(rest[1]), sum(int(x) for x in rest[11:15]))
    grew = True
    while grew:
        new = {p for p, (ppid, _) in parents.items() if ppid in pids} - pids
        grew = bool(new)
        pids |= new
    return sum(parents[p][1] for p in pids if p in parents)


class LoadMeter:
    """`with LoadMeter() as load: ...` then load.others: the share of the machine's CPU time
    (all logical cores over the block's wall time) that other programs took, and load.steal:
    the share the hypervisor gave to other virtual machines. Our own process and its workers
    are not counted. /proc/stat counts in ticks of 10 ms, so a block shorter than
    MIN_TICKS ticks of all cores' time (0.5 s on 2 cores) is too short to meter. Both are None
    where /proc is missing (not Linux) or the block was too short."""

    MIN_TICKS = 100

    def __init__(self, min_ticks=MIN_TICKS):
        self.min_ticks = min_ticks

    def __enter__(self):
        self.others = self.steal = None
        try:
            self._start = _machine_ticks(), _own_ticks(), time.perf_counter()
        except OSError:
            self._start = None
        return self

    def __exit__(self, *exc):
        if self._start is None:
            return
        (busy0, steal0), own0, tik = self._start
        with contextlib.suppress(OSError):
            (busy1, steal1), own1 = _machine_ticks(), _own_ticks()
            capacity = (time.perf_counter() - tik) * os.sysconf('SC_CLK_TCK') * (
                os.cpu_count() or 1)
            if capacity >= self.min_ticks:
                self.others = min(1.0, max(0.0, (busy1 - busy0) - (own1 - own0)) / capacity)
                self.steal = min(1.0, (steal1 - steal0) / capacity)

    def __str__(self):
        if self.others is None:
            return 'other programs\' load: not metered (no /proc, or a block under 0.5 s)'
        return (f'other programs took {self.others:.0%} of the CPU'
                + (f', other virtual machines {self.steal:.0%}' if self.steal else ''))


# ---------------------------------------------------------------- the diagnosis
DIAGNOSIS_FILE = helpers.RESULTS_DIR.parent / 'machine.json'


def _boot_id():
    with contextlib.suppress(OSError):
        return Path('/proc/sys/kernel/random/boot_id').read_text().strip()
    return None


def diagnose(fresh=False, path=None):
    """The machine as the course cites it: {'cpu', 'microarchitecture', 'vector',
    'fp32_flops_per_cycle', 'evidence', 'logical_cores', 'physical_cores', 'smt_siblings',
    'two_thread_scaling': {'compute', 'latency'}, 'cores': kind, 'cores_sentence',
    'others_share', 'measured_at'}. Measured once per boot (about 2 s) and kept in
    build/machine.json; fresh=True measures again (notebook 04 does)."""
    path = Path(path) if path is not None else DIAGNOSIS_FILE
    info, arch = cpu_info(), microarchitecture()
    key = {'boot_id': _boot_id(), 'cpu': info.model, 'logical_cores': info.logical_cores,
           'torch': torch.__version__}
    if not fresh:
        with contextlib.suppress(OSError, ValueError, KeyError):
            cached = json.loads(path.read_text())
            if cached['key'] == key and key['boot_id']:
                return cached['diagnosis']
    with LoadMeter() as load:
        scaling = two_thread_scaling() if info.logical_cores > 1 else {'compute': 1.0,
                                                                        'latency': 1.0}
    kind, sentence = what_the_cores_are(scaling, info.logical_cores, load.others or 0.0)
    diagnosis = {'cpu': info.model, 'microarchitecture': arch.name, 'vector': arch.vector,
                 'fma_units': arch.fma_units, 'fp32_flops_per_cycle': arch.fp32_flops_per_cycle,
                 'evidence': arch.evidence, 'virtual': info.virtual,
                 'logical_cores': info.logical_cores, 'physical_cores': info.physical_cores,
                 'smt_siblings': info.smt_siblings, 'two_thread_scaling': scaling,
                 'cores': kind, 'cores_sentence': sentence, 'others_share': load.others,
                 'steal_share': load.steal,
                 'measured_at': time.strftime('%Y-%m-%d %H:%M:%S')}
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix='.tmp')
        with os.fdopen(fd, 'w') as f:
            json.dump({'key': key, 'diagnosis': diagnosis}, f, indent=2)
        os.replace(tmp, path)
    return diagnosis


def summary(diagnosis=None):
    """The diagnosis as the one sentence notebooks 03-06 cite when they explain a speed."""
    d = diagnosis or diagnose()
    per_cycle = d['fp32_flops_per_cycle']
    return (f'This machine, as the course\'s probe (hardware.py) measured it at '
            f'{d["measured_at"]}: '
            f'{d["microarchitecture"]} ({d["vector"]}, '
            + (f'{per_cycle} fp32 FLOP per cycle and core), ' if per_cycle else
               'FLOP per cycle unknown), ')
            + d['cores_sentence'])


# ------------------------------------------------- the probe every plan sizes by
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
    busy: float = None              # share of the CPU other programs took while it was
                                    # measured (None: not metered, or described)

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
    'cpu-16core': Machine('16-core CPU', 'cpu', flops=1.0e12, memory=64 * 2**30,
                          host_flops=1.0e12, host_memory=64 * 2**30, host_cores=16),
    '8xh100': Machine('NVIDIA H100 80GB HBM3', 'cuda', flops=5e13, memory=80 * 10**9,
                      host_flops=4e12, host_memory=1024 * 2**30, host_cores=96, gpus=8,
                      compute_capability=(9, 0), gpu_flops=(5e13,) * 8),
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


BUSY_SHARE = 0.25  # other programs' share of the CPU above which a probe is taken again


@functools.lru_cache(maxsize=None)
def probe(seconds=0.15):
    """Measure this machine (about 2.5 x `seconds`, plus about 0.65 s a GPU): the Machine every
    plan takes. With several GPUs it is planned as k of the slowest. The probe meters what
    other programs take meanwhile; above BUSY_SHARE it measures once more and keeps the faster
    reading, and the Machine says how busy the machine was (`busy`), so a setup can say that
    its sizes came from a busy machine instead of planning from it silently."""
    readings = []  # the host again when busy; the GPUs, which others do not share, once
    for _ in range(2):
        with LoadMeter(min_ticks=40) as load:
            host_flops = _host_flops(seconds)
        readings.append((host_flops, load.others))
        if load.others is None or load.others <= BUSY_SHARE:
            break
    host_flops, busy = max(readings, key=lambda r: r[0])  # the first of equal readings
    host = dict(host_flops=host_flops, host_memory=_host_memory(),
                host_cores=os.cpu_count() or 1, busy=busy)
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


def _host_flops(seconds):
    """The host's fp32 matmul rate: all intra-op threads, or one where that is faster (threads
    that wait for a core another program holds can run slower than one)."""
    with helpers.num_threads(1):
        single = _matmul_flops(torch.device('cpu'), 512, seconds / 2)
    return max(_matmul_flops(torch.device('cpu'), 512, seconds), single)


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
