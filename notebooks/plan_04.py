"""Notebook 04: its parameters checked, and its work sized for the machine that runs it."""
import math
import shutil
import tempfile
import time

import torch

import hardware
import helpers
from hardware import _host_memory, on_device, probe
from sizing import Plan, Setup, largest_fitting

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


def plan_for(machine, matmul_flops=None, llc_bytes=None, gpu_l2_bytes=None, repeats=3):
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


def setup(*, matmul_size=None, bandwidth_mb=None, max_working_set_mb=None, storage_mb=64,
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
    plan = plan_for(machine, {p: rate for p, (_, rate) in probed.items()}, llc_bytes=llc_bytes,
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
