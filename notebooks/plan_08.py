"""Notebook 08: its parameters, declared once and checked, and its work sized for the machine
that runs it. The plan returns numbers; the notebook's Markdown says why."""
import math

import torch

import helpers
import parameters
from hardware import on_device, probe
from parameters import Param
from sizing import Plan, Setup, budget, largest_fitting

MIN_TORCH = ('2.9', "FSDP2's fully_shard on CPU processes: before 2.7 it asks for CUDA streams, "
             'and 2.7-2.8 train differently from DDP in float32')
PARAMETERS = (
    Param('num_gpus', 4, 'the largest k: runs on 1, 2, 4 (powers of two) and num_gpus processes'),
    Param('device_counts', None, 'the process counts k; None: the powers of two below num_gpus, '
          'num_gpus', kind='list', optional=True),
    Param('hidden', None, "width of the MLP's hidden layers; None: sized for this machine",
          optional=True),
    Param('batch_per_rank', 32, 'examples each process trains on per step'),
    Param('timed_steps', 5, 'steps timed per strategy and k (median reported), after 2 warm-up '
          'steps'),
    Param('lr', 1e-3, "Adam's learning rate", kind='float', positive=True),
    Param('memory_limit_gb', 80, 'memory per rank in the worked solution (an 80 GB GPU)',
          kind='float', positive=True),
    Param('collective_timeout', 60, 'seconds before any collective gives up'),
    Param('worker_timeout', 180, 'seconds before a run of processes is stopped'),
    Param('threads_per_rank', None, 'torch threads in each process; None: cores // k',
          optional=True),
    Param('results_dir', None, 'where the headline numbers go as JSON; None: build/results',
          kind='str', optional=True),
)

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
ZERO_SMALL_RUNS = ((2, 5), (2, 0))  # (k, strategies): the exercises' run, and the crash
ZERO_BATCH_PER_RANK = 32
# One process's training step on a CPU, per parameter, in matmul-FLOP equivalents: forward and
# backward are 6 x 32 = 192 FLOPs; Adam, the shard copies and loopback communication through
# gloo cost far more than that. Fitted to runs on a 2-core machine (4 strategies, k = 1, 2, 4,
# 0.16 to 2.2 M parameters).
ZERO_CPU_STEP_FLOPS_PER_PARAM = 5000
ZERO_GPU_STEP_S = 5e-3          # launches, Python and collective latency per strategy-step
ZERO_GPU_WIDTHS = (4096, 2048, 1024, 512)  # 4096: about 34 M parameters, 0.5 GB a rank (DDP)
ZERO_INIT_S_PER_PARAM = 2e-8    # random initialisation of a parameter on the host
ZERO_CUDA_CONTEXT_S = 2.0       # a process's first CUDA call (its context), on one core
# gloo moves GPU tensors through host memory and loopback TCP: bytes a second for the whole
# host (a 16 MB all-reduce took 16-35 ms on 2 cores), shared by the ranks of a run
ZERO_LOOPBACK_BYTES_PER_S = 1e9
ZERO_PROCESS_BYTES = 400 * 2**20  # torch in each process, on the host
ZERO_CUDA_CONTEXT_BYTES = 500 * 2**20  # each process's CUDA context, on its GPU
# The main runs' strategies take turns, so all are alive at once: DDP's 16 bytes a parameter
# for each, and as much again for what a step allocates and frees
ZERO_ALIVE = len(ZERO_MAIN_STRATEGIES) + 1


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
ZERO_CPU_SHARE = 0.7            # of the budget: headroom for a machine busy with other work


def zero_cpu_seconds(machine, runs, hidden, cost=1):
    """Seconds that CPU processes over gloo take on `machine`'s host for `runs`, a list of
    (k, strategies) pairs of the MLP at `hidden`: starting each run's k processes, and every
    strategy's ZERO_STEPS steps on k processes that share the host's cores. `cost`: a step's
    work against float32's (ZERO_FLOAT64_COST for float64)."""
    psi = zero_parameters(hidden)
    return sum(zero_run_overhead_s(k, machine.host_cores)
               + n * ZERO_STEPS * k * psi * cost * ZERO_CPU_STEP_FLOPS_PER_PARAM
               / machine.host_flops for k, n in runs)


def zero_gpu_seconds(machine, runs, hidden):
    """Seconds that processes on `machine`'s GPUs take for `runs` ((k, strategies) pairs): a
    GPU each with nccl where k <= gpus; otherwise ceil(k / gpus) ranks share each GPU (their
    steps take turns) and gloo moves up to 3 model sizes a rank and step through the host."""
    psi, cores = zero_parameters(hidden), machine.host_cores
    step = 6 * psi * ZERO_BATCH_PER_RANK / machine.flops + ZERO_GPU_STEP_S
    seconds = 0.0
    for k, n in runs:
        share = math.ceil(k / machine.gpus)
        wire = 0 if share == 1 or k == 1 else 3 * 4 * psi * k / ZERO_LOOPBACK_BYTES_PER_S
        seconds += (zero_run_overhead_s(k, cores) + ZERO_CUDA_CONTEXT_S * k / min(k, cores)
                    + n * (ZERO_INIT_S_PER_PARAM * psi * max(1, k / cores)
                           + ZERO_STEPS * (share * step + wire)))
    return seconds


def placement(machine, k_max):
    """Where the ranks run: 'nccl' (a GPU each), 'gloo-gpu' (sharing the GPUs through gloo)
    or 'cpu' (CPU processes over gloo)."""
    if not machine.on_gpu:
        return 'cpu'
    return 'nccl' if machine.gpus >= k_max else 'gloo-gpu'


def plan_for(machine, max_processes=4, device_counts=None):
    """Notebook 08: the MLP's hidden width, where the k processes run, and the estimated
    seconds of the GPU runs and of the CPU processes (the float64 check, and every run on a
    machine without a GPU), each within its own budget."""
    counts = sorted(set(device_counts or [2**i for i in range(8) if 2**i < max_processes]
                        + [max_processes]))
    where = placement(machine, max(counts))
    runs = [(k, len(ZERO_MAIN_STRATEGIES)) for k in counts] + [
        (max(counts), ZERO_REGATHER_RUNS)] + list(ZERO_SMALL_RUNS)
    host = on_device(machine, torch.device('cpu'))  # where CPU processes run
    cpu_limit = budget('08', host) * ZERO_CPU_SHARE
    exact_s = zero_cpu_seconds(host, [(ZERO_EXACT_PROCESSES, ZERO_STRATEGIES)],
                               ZERO_EXACT_HIDDEN, cost=ZERO_FLOAT64_COST)
    if where == 'cpu':
        run_s = lambda h: ZERO_FIXED_S + exact_s + zero_cpu_seconds(host, runs, h)
        hidden = largest_fitting(ZERO_CPU_WIDTHS, run_s, cpu_limit)
        psi = zero_parameters(hidden)
        return Plan({'hidden': hidden, 'backend': 'gloo', 'placement': where,
                     'cpu_seconds': run_s(hidden)}, run_s(hidden),
                    host_bytes=max(counts) * (ZERO_ALIVE * 16 * psi + ZERO_PROCESS_BYTES))
    gpu_limit = budget('08', machine) * ZERO_CPU_SHARE - ZERO_FIXED_S - exact_s
    per_gpu = math.ceil(max(counts) / machine.gpus)  # ranks on each GPU
    gpu_bytes = lambda h: per_gpu * (ZERO_ALIVE * 16 * zero_parameters(h)
                                     + ZERO_CUDA_CONTEXT_BYTES)
    hidden = largest_fitting(ZERO_GPU_WIDTHS, lambda h: zero_gpu_seconds(machine, runs, h),
                             gpu_limit, gpu_bytes, machine.memory / 2)
    psi = zero_parameters(hidden)
    seconds = ZERO_FIXED_S + exact_s + zero_gpu_seconds(machine, runs, hidden)
    return Plan({'hidden': hidden, 'backend': 'nccl' if where == 'nccl' else 'gloo',
                 'placement': where, 'cpu_seconds': exact_s}, seconds,
                device_bytes=gpu_bytes(hidden),
                host_bytes=max(counts) * (ZERO_PROCESS_BYTES + 2 * 4 * psi))


def default_counts(num_gpus):
    """k = 1, 2, 4, ... below num_gpus, and num_gpus."""
    return [2**i for i in range(num_gpus.bit_length()) if 2**i < num_gpus] + [num_gpus]


def setup(**given):
    """Notebook 08's setup: torch's version and every parameter checked (an error naming it,
    before any process starts), then the process counts k, the width and where the ranks run
    planned for this machine (plan_for), and the workers' settings: `config` for the main
    runs, `small_config` for the 2-process runs (the crash, the exercises) and `exact_config`
    for the float64 check, which always runs on ZERO_EXACT_PROCESSES CPU processes."""
    parameters.check_torch(*MIN_TORCH)
    v = parameters.check(PARAMETERS, given)
    ks = sorted(set(v['device_counts'] or default_counts(v['num_gpus'])))
    machine = probe()
    plan = plan_for(machine, max(ks), ks)
    where, gpus = plan['placement'], machine.gpus if machine.on_gpu else 0
    if where == 'nccl' and not torch.distributed.is_nccl_available():
        where = 'gloo-gpu'  # a GPU build without nccl: the same GPUs, through gloo
    backend, device = 'nccl' if where == 'nccl' else 'gloo', 'cpu' if where == 'cpu' else 'cuda'
    config = {'hidden': v['hidden'] or plan['hidden'], 'batch_per_rank': v['batch_per_rank'],
              'timed_steps': v['timed_steps'], 'lr': v['lr'], 'backend': backend,
              'device': device, 'timeout': v['collective_timeout'],
              'strategies': ZERO_MAIN_STRATEGIES, 'time_phases': True}
    small_config = {**config, 'backend': 'nccl' if backend == 'nccl' and gpus >= 2 else 'gloo'}
    exact_config = {**config, 'backend': 'gloo', 'device': 'cpu', 'hidden': ZERO_EXACT_HIDDEN,
                    'dtype': 'float64', 'strategies': ZERO_MAIN_STRATEGIES[:ZERO_STRATEGIES]}
    threads = v['threads_per_rank'] or [helpers.cores_per_process(k) for k in ks]  # each k's
    chosen = {'k': ks, 'ranks on': f'{gpus} GPU(s)' if device == 'cuda' else 'the CPU',
              'backend': backend, 'hidden': config['hidden'],
              'parameters': zero_parameters(config['hidden']),
              'threads per rank': threads,
              'estimate (s)': round(plan.seconds), 'budget (s)': budget('08', machine)}
    return Setup([], **{**v, 'hidden': config['hidden']}, machine=machine, plan=plan, ks=ks,
                 k_max=max(ks), gpus_found=gpus, backend=backend, on_gpu=device == 'cuda',
                 placement=where, cores=machine.host_cores, config=config,
                 small_config=small_config, exact_config=exact_config, chosen=chosen)
