"""Notebook 04: its parameters, checked, and its work sized for the machine that runs it.

The plan returns numbers; why they are what they are is said in the notebook's Markdown.
"""
import math
import shutil
import tempfile
import time

import torch

import hardware
import helpers
import parameters
from hardware import _host_memory, on_device, probe
from parameters import Param
from sizing import Plan, Setup, largest_fitting

PARAMETERS = (
    Param('matmul_size', None, 'n of the n x n products; None: sized per precision',
          minimum=16, optional=True),
    Param('bandwidth_mb', None, 'bandwidth buffers, MiB; None: 4x the LLC or more',
          optional=True),
    Param('max_working_set_mb', None, 'largest working set of the cache curves, MiB; None: 4x LLC',
          optional=True),
    Param('storage_mb', 64, 'size of the temporary file read in the storage test, MiB'),
    Param('repeats', 3, 'timing repeats (median reported)'),
    Param('results_dir', None, 'where the headline numbers go as JSON; None: build/results',
          kind='str', optional=True),
)
MIN_TORCH = ('2.9', 'the oldest torch make compat found this notebook passing on; 2.4 fails')

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
CACHE_CALL_S_04 = 1e-3     # a timed call of cache reads lasts at least this long
# Read rates no cache reaches, so that CACHE_CALL_S_04 holds: per CPU core (64 bytes a cycle at
# 4 GHz), and for a whole GPU's L2.
CACHE_GBS_BOUND_04 = {'cpu': 256e9, 'cuda': 2e13}
DTYPES_04 = {'float64': torch.float64, 'float32': torch.float32, 'tf32': torch.float32,
             'bfloat16': torch.bfloat16, 'float16': torch.float16}
ELEMENT_BYTES_04 = {'float64': 8, 'float32': 4, 'tf32': 4, 'bfloat16': 2, 'float16': 2}


def precisions_04(machine):
    """(the precisions notebook 04 measures on `machine`, those it skips). Below compute
    capability 8.0 (a T4 is 7.5) a GPU has no TF32 and no bf16 tensor cores."""
    if not machine.on_gpu:
        return ['float32', 'float64', 'bfloat16', 'float16'], []
    if tuple(machine.compute_capability) >= (8, 0):
        return ['float64', 'float32', 'tf32', 'bfloat16', 'float16'], []
    return ['float64', 'float32', 'float16'], ['tf32', 'bfloat16']


def cache_read_04(machine, l2_bytes=None, l2_shared_by=1, gpu_l2_bytes=None):
    """(bytes, reads): the buffer the cache roof reads, well inside the cache (on a CPU half of
    each core's L2, one share per L2; on a GPU a quarter of its L2), and how many reads of it
    one timed call makes, so that the call lasts CACHE_CALL_S_04 even at CACHE_GBS_BOUND_04."""
    if machine.on_gpu:
        size, bound = (gpu_l2_bytes or 4 * 2**20) // 4, CACHE_GBS_BOUND_04['cuda']
    else:
        caches = max(1, machine.host_cores // max(1, l2_shared_by))
        size = caches * ((l2_bytes or 2**20) // 2)
        bound = caches * CACHE_GBS_BOUND_04['cpu']
    size -= size % 4096
    return size, math.ceil(CACHE_CALL_S_04 * bound / size)


def matmul_sizes_04(machine, rates):
    """{precision: n}: the largest n whose one product takes at most MATMUL_CALL_S_04."""
    kind = 'cuda' if machine.on_gpu else 'cpu'
    fits = [n for n in MATMUL_SIZES_04 if n <= MATMUL_BOOK_04[kind]]
    return {p: largest_fitting(fits, lambda n, r=rate: 2 * n**3 / r, MATMUL_CALL_S_04[kind])
            for p, rate in rates.items()}


def plan_for(machine, matmul_flops=None, llc_bytes=None, gpu_l2_bytes=None, repeats=3,
             l2_bytes=None, l2_shared_by=1):
    """Notebook 04: matrix sizes per precision, the buffers of the memory measurements, the
    thread counts of the scaling sweep, and the cache roof's buffer and reads.

    matmul_flops: {precision: FLOP/s} from a short probe of each precision; None assumes the
      fp32 rate of `machine` for every precision (fp64 at 1/32 of it on a GPU, as on a T4).
    llc_bytes: the host's last-level cache (None: 32 MiB). Bandwidth buffers and the largest
      working set of the cache curves are at least 4 times it, so that they measure DRAM.
    gpu_l2_bytes: the GPU's L2 cache; its bandwidth buffer is at least 4 times that too.
    l2_bytes, l2_shared_by: the host's L2 and the logical cores that share one."""
    names, _ = precisions_04(machine)
    rates = {p: machine.flops / (32 if machine.on_gpu and p == 'float64' else 1) for p in names}
    rates.update({p: r for p, r in (matmul_flops or {}).items() if p in rates})
    if min(rates.values()) <= 0:
        raise ValueError(f'matmul_flops must be positive, got {matmul_flops}')
    calls, sizes = 1 + repeats, matmul_sizes_04(machine, rates)
    product_s = lambda n, rate: 2 * n**3 / rate
    # the thread sweep runs fp32 on the host CPU, from one core (its rate: 1/cores of all)
    one_core = machine.host_flops / machine.host_cores
    sweep_n = largest_fitting([n for n in MATMUL_SIZES_04 if n <= MATMUL_BOOK_04['cpu']],
                              lambda n: product_s(n, one_core), MATMUL_CALL_S_04['cpu'])
    threads = sorted({2**k for k in range(8) if 2**k < machine.host_cores} | {machine.host_cores})
    pow2_mib = lambda b: 2 ** math.ceil(math.log2(max(b, 2**20) / 2**20))
    working_set_mb = pow2_mib(4 * (llc_bytes or 32 * 2**20))
    bandwidth_mb = max(working_set_mb, 64)
    if machine.on_gpu:
        bandwidth_mb = max(bandwidth_mb, pow2_mib(4 * (gpu_l2_bytes or 50 * 2**20)), 1024)
    while _host_bytes(machine, bandwidth_mb, working_set_mb) > 0.75 * machine.host_memory \
            and bandwidth_mb > 64:  # the host cannot hold them: the largest it can
        bandwidth_mb //= 2
        working_set_mb = min(working_set_mb, bandwidth_mb)
    cache_bytes, cache_reads = cache_read_04(machine, l2_bytes, l2_shared_by, gpu_l2_bytes)
    bw, ws = bandwidth_mb * 2**20, working_set_mb * 2**20
    seconds = (sum(calls * product_s(n, rates[p]) for p, n in sizes.items())
               + sum(calls * product_s(sweep_n, one_core * t) for t in threads)
               + _memory_s(machine, bw, ws, llc_bytes or 32 * 2**20, repeats)
               + (4 + repeats) * 0.01 * 2   # the cache roof: a few timed calls of 10 ms
               + CPU_FIXED_S_04 * (1.3e11 / machine.host_flops) ** 0.5)
    device_bytes = (max(3 * n * n * ELEMENT_BYTES_04[p] for p, n in sizes.items())
                    + (2 * bw if machine.on_gpu else 0))
    return Plan({'matmul_sizes': sizes, 'bandwidth_mb': bandwidth_mb,
                 'max_working_set_mb': working_set_mb, 'thread_sweep_size': sweep_n,
                 'thread_counts': threads, 'exercise_mb': min(bandwidth_mb, EXERCISE_MB_04),
                 'cache_read_bytes': cache_bytes, 'cache_reads': cache_reads}, seconds,
                device_bytes=device_bytes,
                host_bytes=_host_bytes(machine, bandwidth_mb, working_set_mb))


def _host_bytes(machine, bandwidth_mb, working_set_mb):
    """Host memory the buffers, their copies and index tensors take, and torch itself."""
    bw, ws = bandwidth_mb * 2**20, working_set_mb * 2**20
    return 4 * bw + 2 * ws + (bw if machine.on_gpu else 0) + 2**30


def _memory_s(machine, bw, ws, llc, repeats):
    """Seconds of the memory sections: filling and reading the buffers (a slow host's DRAM,
    10 GB/s; random numbers at 1 GB/s), the dependent reads past the LLC, and the bus."""
    host_gbs = 10e9
    memory = (bw + ws) / 1e9 + (30 * bw + 40 * ws) / host_gbs
    dependent = DEPENDENT_READS_04 * 150e-9 * math.log2(max(ws / llc, 1)) + 0.5
    bus = 8 * repeats * bw / 3e9 if machine.on_gpu else 0   # pageable copies: about 3 GB/s
    return memory + dependent + bus


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
                    helpers.synchronize(device)
                    tik = time.perf_counter()
                    a @ a
                    helpers.synchronize(device)
                    times.append(time.perf_counter() - tik)
                best = min(times[1:])
                if best >= 0.01 or 2 * n > largest:
                    probed[name] = (n, 2 * n**3 / best)
                    break
                n *= 2
    finally:
        torch.set_float32_matmul_precision(previous)
    return probed


def _check_room(values):
    """Refuse, by name, buffers the host cannot hold and a file the disk cannot take."""
    host_memory = _host_memory()
    for name in ('bandwidth_mb', 'max_working_set_mb'):
        mb = values[name]
        if mb and 4 * mb * 2**20 > host_memory:  # buffers, copies and index tensors
            raise ValueError(f'{name}={mb} needs about {4 * mb} MiB of host memory; this '
                             f'machine has {host_memory / 2**20:,.0f} MiB')
    if shutil.disk_usage(tempfile.gettempdir()).free < 2 * values['storage_mb'] * 2**20:
        raise ValueError(f'storage_mb={values["storage_mb"]}: not enough free space in '
                         f'{tempfile.gettempdir()} for the temporary file')


def setup(**given):
    """Notebook 04's setup: every parameter checked (a ValueError naming it, before any
    work), then the device, a short probe of each precision's matrix products, and the plan
    sized from those rates and the caches. Where a parameter is given, it wins over the plan."""
    parameters.check_torch(*MIN_TORCH)
    values = parameters.check(PARAMETERS, given)
    _check_room(values)
    device = helpers.try_gpu()
    on_gpu = device.type == 'cuda'
    machine = on_device(probe(), device)
    names, skipped = precisions_04(machine)
    probed = probe_precisions_04(names, device)
    info = hardware.cpu_info()
    llc_name, llc_bytes = hardware.last_level_cache()
    gpu_l2 = torch.cuda.get_device_properties(device).L2_cache_size if on_gpu else None
    plan = plan_for(machine, {p: rate for p, (_, rate) in probed.items()}, llc_bytes=llc_bytes,
                    gpu_l2_bytes=gpu_l2, repeats=values['repeats'],
                    l2_bytes=info.caches.get('L2'), l2_shared_by=info.cache_shared_by.get('L2', 1))
    n = values['matmul_size']
    chosen = {k: values[k] or plan[k] for k in ('bandwidth_mb', 'max_working_set_mb')}
    chosen |= {'matmul_sizes': {p: n for p in names} if n else plan['matmul_sizes'],
               'thread_sweep_size': n or plan['thread_sweep_size'],
               'thread_counts': plan['thread_counts'], 'cache_read_bytes': plan['cache_read_bytes'],
               'cache_reads': plan['cache_reads'],
               'exercise_mb': min(chosen['bandwidth_mb'], EXERCISE_MB_04)}
    env = helpers.environment(device)
    lines = [str(machine), f'about {plan.seconds:.0f} s of work',
             *(f'{k} = {v}' for k, v in chosen.items())]
    return Setup(lines, device=device, on_gpu=on_gpu, env=env, machine=machine, plan=plan,
                 info=info, precisions=names, skipped=skipped,
                 probe=probed, probe_gflops={p: r / 1e9 for p, (_, r) in probed.items()},
                 storage_mb=values['storage_mb'], repeats=values['repeats'],
                 results_dir=values['results_dir'], llc_name=llc_name, llc_bytes=llc_bytes,
                 gpu_l2_bytes=gpu_l2, nominal_ghz=info.nominal_ghz, max_ghz=info.max_ghz,
                 max_clock='reported by cpufreq' if info.max_ghz else 'not reported', **chosen)
