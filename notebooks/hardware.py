"""What this machine is, read from the operating system and measured once; notebooks cite it.

The course explains speeds by this probe, not by guesses:
- `cpu_info()`: the processor as Linux describes it (model, flags, cores, caches, clocks);
- `microarchitecture(info)`: its vector units, and from them the peak FLOP per cycle and core,
  decided by the instruction-set flags first and the family/model number second (a hypervisor
  may report a model number that does not match the flags it passes through);
- `two_thread_scaling()`: whether two hardware threads behave as two cores, measured with
  work that needs the arithmetic units (matrix products) and work that waits on latency (a
  chain of dependent additions). SMT siblings share one core's units: the first barely
  scales, the second nearly doubles. A virtual machine's OS cannot see which it has;
- `LoadMeter`: how much CPU other programs (and other virtual machines) took during a block;
- `diagnose()`: all of it, as notebook 04 records it under `machine`, kept on disk for the
  other notebooks until the machine reboots.
"""
import contextlib
import functools
import json
import os
import platform
import re
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

import helpers
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


# ---------------------------------------------------------- vector units and peaks
@dataclass(frozen=True)
class Microarchitecture:
    name: str
    vector: str                     # 'AVX-512', 'AVX2', 'AVX', 'NEON', or 'unknown'
    fma_units: int                  # vector FMA pipes per core (0: no FMA)
    fp32_flops_per_cycle: int       # per core: FMA pipes x fp32 lanes x 2 (None: unknown)
    evidence: str                   # how it was decided, for the reader


# Intel family-6 model numbers whose AVX-512 cores have one 512-bit FMA pipe (client parts)
# and two (server parts); Skylake-SP's 1-pipe Silver, Bronze and Gold 5 parts go by name.
INTEL_ONE_FMA = {125: 'Ice Lake (client)', 126: 'Ice Lake (client)',
                 140: 'Tiger Lake', 141: 'Tiger Lake', 167: 'Rocket Lake'}
INTEL_TWO_FMA = {85: 'Skylake-SP / Cascade Lake', 106: 'Ice Lake-SP', 108: 'Ice Lake-SP',
                 143: 'Sapphire Rapids', 207: 'Emerald Rapids', 173: 'Granite Rapids',
                 174: 'Granite Rapids'}


# AMD families: (name, FMA pipes, fp32 lanes a pipe). Zen 4 (family 25 with AVX-512) runs
# each 512-bit instruction as two 256-bit halves, so its pipes have 8 fp32 lanes, not 16.
def _amd(family, model_number, avx512):
    if family == 23:
        return ('Zen / Zen+', 2, 4) if model_number < 0x30 else ('Zen 2', 2, 8)
    if family == 25:
        return ('Zen 4', 2, 8) if avx512 else ('Zen 3', 2, 8)
    if family == 26:  # mobile Zen 5 (Strix Point, Krackan Point) has 256-bit pipes
        if 0x20 <= model_number < 0x30 or 0x60 <= model_number < 0x70:
            return 'Zen 5 (mobile)', 2, 8
        return 'Zen 5', 2, 16 if avx512 else 8
    return f'AMD family {family}', 2, 8


def microarchitecture(info=None):
    """The vector units of `info`'s cores (default: this machine's), and their fp32 FLOP per
    cycle, with the evidence. A 512-bit FMA on Zen 4 runs as two 256-bit halves, so Zen 4
    retires 32 fp32 FLOP per cycle, not AVX-512's nominal 64."""
    info = info or cpu_info()
    f, fam, num = info.flags, info.family, info.model_number
    vector = ('AVX-512' if 'avx512f' in f else 'AVX2' if 'avx2' in f else 'AVX' if 'avx' in f
              else 'NEON' if {'asimd', 'neon'} & f else 'unknown')
    fma = 'fma' in f or 'asimd' in f
    lanes = {'AVX-512': 16, 'AVX2': 8, 'AVX': 8, 'NEON': 4}.get(vector)
    said = f'flags {vector}' + (' with FMA' if fma else '')
    if info.vendor == 'AuthenticAMD' and fam:
        name, units, width = _amd(fam, num or 0, vector == 'AVX-512')
        evidence = (f'{said}; AMD family {fam}, model {num}: {name}'
                    + (', whose 512-bit instructions run as two 256-bit halves'
                       if name in ('Zen 4', 'Zen 5 (mobile)') else ''))
        return Microarchitecture(name, vector, units, units * width * 2, evidence)
    if info.vendor == 'GenuineIntel' and vector == 'AVX-512':
        if 'amx_tile' in f:
            known = INTEL_TWO_FMA.get(num) if num in (143, 207, 173, 174) else None
            name = known or 'Sapphire Rapids or newer'
            evidence = (f'{said} and AMX; AMX exists only on Sapphire Rapids and newer server '
                        'cores, which have two 512-bit FMA pipes'
                        + ('' if known else f' (the reported model number, {num}, is not one '
                           'of them: a virtual machine may report another; the flags decide)'))
            return Microarchitecture(name, vector, 2, 64, evidence)
        if num in INTEL_ONE_FMA:
            return Microarchitecture(INTEL_ONE_FMA[num], vector, 1, 32,
                                     f'{said}; Intel model {num}: one 512-bit FMA pipe a core')
        if num in INTEL_TWO_FMA:
            one = num == 85 and re.search(r'Silver|Bronze|Gold 5', info.model)
            return Microarchitecture(INTEL_TWO_FMA[num], vector, 1 if one else 2,
                                     32 if one else 64,
                                     f'{said}; Intel model {num}' + (
                                         f', {info.model}: one FMA pipe' if one else
                                         ': two 512-bit FMA pipes a core'))
        return Microarchitecture('unknown AVX-512 core', vector, 2, 64,
                                 f'{said}; model {num} is not in the table, so two FMA pipes '
                                 'are assumed (an upper bound: some parts have one)')
    if lanes is None:
        return Microarchitecture('unknown', vector, 0, None,
                                 f'no known vector flags on {platform.machine()}')
    units = 2 if fma else 1
    per_cycle = units * lanes * 2 if fma else 2 * lanes  # without FMA: one add and one mul pipe
    return Microarchitecture(f'{info.vendor or platform.machine()} {vector} core', vector,
                             units if fma else 0, per_cycle,
                             f'{said}: {units} pipe(s) of {lanes} fp32 lanes assumed')


def flops_per_cycle(precision, info=None):
    """Peak FLOP per cycle and core in `precision`: float64 has half float32's lanes; bf16
    doubles float32's rate with its dot-product instruction (avx512_bf16), fp16 with its own
    arithmetic on 32 lanes (avx512_fp16), and both reach 1024 with AMX tiles; without such
    instructions they convert to float32 and float32's rate is their ceiling."""
    info = info or cpu_info()
    fp32 = microarchitecture(info).fp32_flops_per_cycle
    if fp32 is None:
        return None
    half = lambda dot, amx: 1024 if amx in info.flags else 2 * fp32 if dot in info.flags else fp32
    return {'float32': fp32, 'float64': fp32 // 2, 'tf32': fp32,
            'bfloat16': half('avx512_bf16', 'amx_bf16'),
            'float16': half('avx512_fp16', 'amx_fp16')}[precision]


def peak_flops(precision, ghz, info=None):
    """Peak FLOP/s of all physical cores at `ghz` (None where unknown)."""
    info = info or cpu_info()
    per_cycle = flops_per_cycle(precision, info)
    cores = info.physical_cores or info.logical_cores
    return None if per_cycle is None or ghz is None else per_cycle * cores * ghz * 1e9


# ------------------------------------------------------------- are they two cores?
def _throughput(work, threads, seconds):
    """Calls of work() per second, summed over `threads` Python threads running it at once.
    Each thread asks for one intra-op thread itself: OpenMP's thread count is per thread, so
    the caller's setting would not bind it. The work releases the interpreter lock."""
    counts, stop = [0] * threads, threading.Event()

    def loop(i):
        torch.set_num_threads(1)
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
    keeps the FMA units busy (256 x 256 fp32 products) and on work that leaves them idle and
    waits on branches and loads instead (sorting 65,536 integers, about a millisecond a call).
    Two cores give about 2 for both; two SMT siblings of one core give about 1 for the first
    (they share its FMA units) and well above 1 for the second. Medians of `repeats`
    alternating runs; about 2 x kinds x repeats x `seconds` in all."""
    a = torch.randn(256, 256)
    keys = torch.randint(0, 2**31 - 1, (2**16,), dtype=torch.int32)
    kinds = {'compute': lambda: a @ a, 'latency': lambda: torch.sort(keys)}
    ratios = {k: [] for k in kinds}
    with helpers.num_threads(1):  # restored afterwards, for every library, by this thread
        for work in kinds.values():
            work()
        for _ in range(repeats):
            for kind, work in kinds.items():
                one = _throughput(work, 1, seconds)
                ratios[kind].append(_throughput(work, 2, seconds) / one)
    return {k: median(v) for k, v in ratios.items()}


# What the measurement says the logical cores are. Decided by thresholds on the medians:
# 1.6 or more is "scales", below 1.3 is "does not".
CORES_TEMPLATES = {
    'separate': '{n} logical cores that behave as separate cores: two threads did {compute:.2f}x '
                'the FMA-bound work of one (matrix products) and {latency:.2f}x the '
                'latency-bound work (sorting).',
    'siblings': '{n} logical cores that behave as SMT siblings sharing one core\'s FMA units: '
                'two threads did only {compute:.2f}x the FMA-bound work of one (matrix '
                'products), but {latency:.2f}x the latency-bound work (sorting).',
    'unclear': '{n} logical cores whose sharing the probe could not settle: two threads did '
               '{compute:.2f}x the FMA-bound work of one (matrix products) and {latency:.2f}x '
               'the latency-bound work (sorting), while other programs took {others:.0%} of '
               'the CPU.',
    'one': 'one logical core: nothing to share.',
}


def what_the_cores_are(scaling, logical_cores, others_share=0.0):
    """('separate' | 'siblings' | 'unclear' | 'one', the sentence that says so)."""
    if logical_cores < 2:
        return 'one', CORES_TEMPLATES['one']
    compute, latency = scaling['compute'], scaling['latency']
    kind = ('separate' if compute >= 1.6 and latency >= 1.6 else
            'siblings' if compute < 1.3 and latency >= 1.6 else 'unclear')
    return kind, CORES_TEMPLATES[kind].format(n=logical_cores, compute=compute,
                                              latency=latency, others=others_share)


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
            if capacity >= self.MIN_TICKS:
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


def as_dict(info=None):
    """cpu_info() as plain JSON-ready values (flags left out: there are hundreds)."""
    d = asdict(info or cpu_info())
    d.pop('flags')
    return d


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


# ------------------------------------------------------- GPUs, from their data sheets
# Dense peak TFLOP/s from NVIDIA's data sheets, per precision (None where the sheet gives
# none), and memory GB/s. The fp64 figure is the fastest fp64 path the sheet states: on
# A100, H100 and H200 that is the fp64 tensor cores, whose rate happens to equal the fp32
# one, so equal roofs there do not mean a missing instruction.
# Keys are whole model names as CUDA reports them, less the vendor prefix: 'L4' must not
# match an L40S, nor 'H100 80GB HBM3' (SXM) an H100 NVL. (Added for notebook 04.)
GPU_PRECISIONS = ('float64', 'float32', 'tf32', 'bfloat16', 'float16')
GPU_SPECS = {
    'T4': ((None, 8.1, None, None, 65), 320),
    'L4': ((None, 30.3, 60, 121, 121), 300),
    'L40S': ((None, 91.6, 183, 362, 362), 864),
    'V100-SXM2-16GB': ((7.8, 15.7, None, None, 125), 900),
    'V100-SXM2-32GB': ((7.8, 15.7, None, None, 125), 900),
    'V100-PCIE-16GB': ((7, 14, None, None, 112), 900),
    'V100-PCIE-32GB': ((7, 14, None, None, 112), 900),
    'A100-SXM4-40GB': ((19.5, 19.5, 156, 312, 312), 1555),
    'A100-SXM4-80GB': ((19.5, 19.5, 156, 312, 312), 2039),
    'A100-PCIE-40GB': ((19.5, 19.5, 156, 312, 312), 1555),
    'A100 80GB PCIe': ((19.5, 19.5, 156, 312, 312), 1935),
    'H100 80GB HBM3': ((67, 67, 494.7, 989.4, 989.4), 3350),
    'H100 PCIe': ((51, 51, 378, 756, 756), 2000),
    'H100 NVL': ((60, 60, 417.5, 835.5, 835.5), 3900),
    'H200': ((67, 67, 494.7, 989.4, 989.4), 4800),
}


def gpu_spec(device_name):
    """(model, (peak TFLOP/s per GPU_PRECISIONS, memory GB/s)) for a name as CUDA reports it
    ('NVIDIA H100 NVL', 'Tesla T4'), or (None, None) for a GPU not in GPU_SPECS."""
    model = re.sub(r'^(NVIDIA|Tesla)\s+', '', device_name.strip())
    return (model, GPU_SPECS[model]) if model in GPU_SPECS else (None, None)


def gpu_peak_flops(device_name, precision):
    """The data sheet's dense peak FLOP/s of that GPU in `precision`, or None (not stated, or
    a GPU not in GPU_SPECS)."""
    _, spec = gpu_spec(device_name)
    tflops = spec and spec[0][GPU_PRECISIONS.index(precision)]
    return tflops * 1e12 if tflops else None


def gpu_memory_gbs(device_name):
    """The data sheet's memory bandwidth of that GPU in GB/s, or None."""
    _, spec = gpu_spec(device_name)
    return spec[1] if spec else None


def roof_clock(nominal_ghz, reported_max_ghz=None, implied_ghz=None):
    """(GHz, why) at which notebook 04 draws a CPU's flat roofs: the maximum clock where the
    system reports one; otherwise the higher of the nominal clock and the clock the measured
    products imply, so that no measurement sits above its roof. An implied clock within the
    noise floor of nominal is called nominal. (None, why) when no clock is known."""
    if reported_max_ghz:
        return reported_max_ghz, 'the maximum clock the system reports'
    known = [g for g in (nominal_ghz, implied_ghz) if g]
    if not known:
        return None, 'no clock known'
    if nominal_ghz and implied_ghz and implied_ghz > (1 + NOISE_FLOOR) * nominal_ghz:
        return implied_ghz, 'the clock the products imply (above nominal)'
    return max(known), 'about the nominal clock (no maximum reported)'
