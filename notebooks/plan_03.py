"""Notebook 03: its parameters, declared once, and its work sized for the machine that runs it.

The notebook's Markdown says why each size is what it is; the plan returns the numbers. Its two
lanes are sized from one timed call of the lane's work (`run`), not from the probe alone: a
CPU lane beside a GPU runs at a fraction of the all-core probe (larger products, 50 new results
a call, a thread beside the one that drives the GPU)."""
import time

import torch

import helpers
import parameters
import report
from hardware import probe
from parameters import Param
from plan_01 import HOST_COPY_BYTES_S
from plan_02 import MECHANISMS_02_03, parallel_mechanism
from sizing import Plan, Setup, budget, largest_fitting

MIN_TORCH = ('2.9', 'the oldest torch make compat found this notebook passing on; 2.4 fails')
PARAMETERS = (
    Param('matrix_size', None, 'n of the n x n products in `run`; None: sized (the book: 4000)',
          optional=True),
    Param('cpu_matrix_size', None, 'n on a CPU lane beside one GPU; None: as long as the GPU lane',
          optional=True),
    Param('num_matmuls', 50, "independent products in `run` (the book's count)"),
    Param('copy_size', None, 'n of the n x n results computed and copied; None: sized',
          optional=True),
    Param('copy_steps', None, "results computed and copied; None: the book's 50 if they fit",
          optional=True),
    Param('copy_inner_dim', None, 'k of those n x k times k x n products; None: chosen',
          optional=True),
    Param('mechanism', 'auto', "exercise 2: 'auto' (threads and TorchScript) or 'threads'",
          kind='str', choices=MECHANISMS_02_03),
    Param('results_dir', None, 'where the results go as JSON; None: build/results', kind='str',
          optional=True),
)

BOOK_03_SIZE = 4000
GPU_RUN_S = 5.0                 # at most this long, a GPU lane's `run`
CPU_COPY_SIZE_03 = 1024         # results of 4 MiB: copies run from memory, not from cache
LANE_RUNS_03 = 26               # runs of `run` per lane: alone, together, baselines, exercise 1
TIMED_RUNS_03 = 4               # runs of `run` that sizing the lanes may time
COPY_RUNS_03 = 40               # runs of the copy_steps loop: 4 variants x 6, book, exercises
HOST_SHARE_03 = 0.3             # at most this share of host RAM for the copies' host buffers
LANE_SHARE_03 = 1 / 8           # of the budget, for the lanes on a CPU-only machine
SIZE_STEP = 16                  # lane sizes are multiples of this
PCIE_BYTES_S = 10e9
SIZED = ('matrix_size', 'cpu_matrix_size', 'copy_size', 'copy_steps')
SCENARIOS = {2: 'two GPUs', 1: 'one GPU and the CPU', 0: 'two CPU threads'}


def run_flops(n, num_matmuls=50):
    """Floating-point operations of one `run`: num_matmuls products of n x n matrices."""
    return num_matmuls * 2 * n**3


def default_rates(machine):
    """FLOP/s of `run` on each kind of lane before any is timed: the probe's rates (a CPU lane
    on a CPU-only machine has one thread, so one core's share)."""
    cpu = machine.host_flops if machine.on_gpu else machine.host_flops / machine.host_cores
    return {'cuda': machine.flops, 'cpu': cpu}


def balanced_size(seconds, rate, num_matmuls):
    """The n whose `run` takes `seconds` at `rate` FLOP/s, a multiple of SIZE_STEP."""
    n = (seconds * rate / (2 * num_matmuls)) ** (1 / 3)
    return max(SIZE_STEP, round(n / SIZE_STEP) * SIZE_STEP)


def lane_kinds(machine):
    """The kinds of device of the two lanes: two GPUs, one GPU and the CPU, or two CPU threads."""
    return {0: ('cpu', 'cpu'), 1: ('cuda', 'cpu')}.get(machine.gpus, ('cuda', 'cuda'))


def plan_for(machine, num_matmuls=50, rates=None):
    """Notebook 03's sizes for `machine`, and 'lane_s': the seconds of one `run` on each lane.

    rates: FLOP/s of `run` on each kind of lane ({'cuda': ..., 'cpu': ...}), as timed at setup;
    None: the probe's (default_rates). A GPU lane keeps the book's n where its `run` fits
    GPU_RUN_S; a CPU lane beside it takes as long. On a CPU-only machine both lanes (one thread
    each) fit LANE_SHARE_03 of the budget in LANE_RUNS_03 runs."""
    rates = rates or default_rates(machine)
    kinds = lane_kinds(machine)
    run_s = lambda n, kind: run_flops(n, num_matmuls) / rates[kind]
    if machine.on_gpu:
        size = largest_fitting([BOOK_03_SIZE, 3072, 2048, 1024],
                               lambda n: run_s(n, 'cuda'), GPU_RUN_S)
        cpu_size = balanced_size(run_s(size, 'cuda'), rates['cpu'], num_matmuls)
        copy_size = size
        step_s = 2 * copy_size**3 / machine.flops + 4 * copy_size**2 / PCIE_BYTES_S
    else:
        size = largest_fitting([768, 640, 512, 448, 384, 320, 256, 192, 128],
                               lambda n: LANE_RUNS_03 * run_s(n, 'cpu'),
                               LANE_SHARE_03 * budget('03', machine))
        cpu_size, copy_size = size, CPU_COPY_SIZE_03
        step_s = 3 * 4 * copy_size**2 / HOST_COPY_BYTES_S  # copy plus a rank-k product
    lane_s = [run_s(cpu_size if kind == 'cpu' else size, kind) for kind in kinds]
    result_bytes = 4 * copy_size**2
    cpu_lane_bytes = num_matmuls * 4 * cpu_size**2
    host = lambda steps: 2 * steps * result_bytes + cpu_lane_bytes + 2**30  # + torch itself
    copy_steps = largest_fitting([50, 40, 30, 20, 10], lambda s: 0, 1, host,
                                 HOST_SHARE_03 * machine.host_memory)
    seconds = ((LANE_RUNS_03 + TIMED_RUNS_03) * max(lane_s)
               + COPY_RUNS_03 * copy_steps * step_s + 4.0)
    # a GPU lane holds two runs' results (exercise 1), and the copies' results twice (the
    # book's call allocates its own); the notebook refuses more than 80% of the GPU's memory
    device_bytes = (4 * (2 * num_matmuls * size**2 + 2 * copy_steps * copy_size**2)
                    if machine.on_gpu else 0)
    return Plan({'matrix_size': size, 'cpu_matrix_size': cpu_size, 'copy_size': copy_size,
                 'copy_steps': copy_steps, 'lane_s': lane_s}, seconds,
                device_bytes=device_bytes, host_bytes=host(copy_steps))


def time_run(n, kind, num_matmuls=50, threads=1):
    """Seconds of one `run` (num_matmuls products of n x n) on the first device of `kind`,
    with `threads` intra-op threads, after one product to warm up."""
    device = torch.device('cuda:0' if kind == 'cuda' else 'cpu')
    x = torch.randn(n, n, device=device) / n**0.5
    with helpers.num_threads(threads):
        x.mm(x)
        helpers.synchronize(device)
        tik = time.perf_counter()
        results = [x.mm(x) for _ in range(num_matmuls)]
        helpers.synchronize(device)
        seconds = time.perf_counter() - tik
    del results
    return seconds


def sized_lanes(machine, num_matmuls, given, timer=time_run, threads=1):
    """(plan, rates): plan_for at the rates of `run` timed on each lane whose size is not
    `given` ({'matrix_size': n or None, 'cpu_matrix_size': ...}). Timed at the probe's sizes,
    then, where the timed rates move a size, once more at the new sizes (TIMED_RUNS_03 in all).
    timer(n, kind, num_matmuls, threads) -> seconds: tests pass a described machine's."""
    kinds = lane_kinds(machine)
    rates = default_rates(machine)
    plan = plan_for(machine, num_matmuls, rates)
    lane_threads = {'cuda': threads, 'cpu': threads if machine.on_gpu else 1}
    timed_at = {}  # kind -> the n its rate was timed at
    timing = set(kinds) if len(set(kinds)) > 1 or not machine.on_gpu else set()
    for _ in range(2):
        sizes = {kind: given[name] or plan[name] for kind, name in
                 (('cuda', 'matrix_size'), ('cpu', 'cpu_matrix_size' if machine.on_gpu
                                            else 'matrix_size'))}
        for kind in sorted(k for k in timing if timed_at.get(k) != sizes[k]):
            seconds = timer(sizes[kind], kind, num_matmuls, lane_threads[kind])
            rates[kind], timed_at[kind] = run_flops(sizes[kind], num_matmuls) / seconds, sizes[kind]
        new = plan_for(machine, num_matmuls, rates)
        if all(new[k] == plan[k] for k in ('matrix_size', 'cpu_matrix_size')):
            return new, rates
        plan = new
    return plan, rates


def _check_memory(machine, sizes, num_matmuls):
    n, steps = sizes['copy_size'], sizes['copy_steps']
    host_gb = 2 * steps * 4 * n**2 / 1e9  # host buffers, the book's pinned copies
    gpu_gb = 4 * (2 * num_matmuls * sizes['matrix_size']**2 + 2 * steps * n**2) / 1e9
    if host_gb > 0.6 * machine.host_memory / 1e9:
        raise ValueError(f'copy_steps={steps} results of copy_size={n} need {host_gb:.1f} GB of '
                         f'host memory, over 60% of {machine.host_memory / 1e9:.1f} GB: use less')
    if machine.on_gpu and gpu_gb > 0.8 * machine.memory / 1e9:
        raise ValueError(f'matrix_size, num_matmuls, copy_size and copy_steps need {gpu_gb:.1f} '
                         f'GB on the GPU, over 80% of its {machine.memory / 1e9:.1f} GB: use less')


def _check_inner_dim(inner_dim, size):
    if inner_dim is not None and inner_dim > size:
        raise ValueError(f'copy_inner_dim={inner_dim} is larger than copy_size={size}: '
                         'the inner dimension of an n x k times k x n product is at most n')


def setup(**given):
    """Notebook 03's setup: every parameter checked (a ValueError naming it) before any work,
    then the machine probed, each lane's `run` timed and sized, and the lanes chosen: two
    GPUs, one GPU and the CPU, or two CPU threads."""
    parameters.check_torch(*MIN_TORCH)
    v = parameters.check(PARAMETERS, given)
    if v['copy_size'] is not None:
        _check_inner_dim(v['copy_inner_dim'], v['copy_size'])
    threads = torch.get_num_threads()
    machine = probe()
    probed = plan_for(machine, v['num_matmuls'])  # refuse what cannot fit before timing runs
    _check_memory(machine, {k: v[k] or probed[k] for k in SIZED}, v['num_matmuls'])
    plan, rates = sized_lanes(machine, v['num_matmuls'], v, threads=threads)
    sizes = {k: v[k] or plan[k] for k in SIZED}
    _check_inner_dim(v['copy_inner_dim'], sizes['copy_size'])
    _check_memory(machine, sizes, v['num_matmuls'])
    gpus = [d for d in helpers.try_all_gpus() if d.type == 'cuda']
    cpu = torch.device('cpu')
    lanes = gpus[:2] if len(gpus) >= 2 else [gpus[0], cpu] if gpus else [cpu, cpu]
    scenario = SCENARIOS[len(gpus[:2])]
    lane_sizes = [sizes['cpu_matrix_size'] if d.type == 'cpu' and gpus else
                  sizes['matrix_size'] for d in lanes]
    lane_s = [run_flops(n, v['num_matmuls']) / rates[d.type] for n, d in zip(lane_sizes, lanes)]
    use_script, how = parallel_mechanism(v['mechanism'])
    lane_rows = {f'lane {i + 1}': {'device': str(d), 'n': n, 'one run': s}
                 for i, (d, n, s) in enumerate(zip(lanes, lane_sizes, lane_s))}
    chosen = {'CPU threads': threads, 'copies': sizes['copy_steps'],
              'copy n': sizes['copy_size'], 'estimate': plan.seconds, 'exercise 2 uses': how}
    why = [f'Measured: {machine}.', '', report.markdown_table(lane_rows, units={'one run': 's'}),
           '', report.markdown_table([chosen], units={'estimate': 's'}), '']
    return Setup(why, **{**v, **sizes}, machine=machine, plan=plan, use_script=use_script,
                 gpus=gpus, scenario=scenario, lanes=lanes, lane_sizes=lane_sizes,
                 planned_lane_s=lane_s, threads=threads, env=helpers.environment())
