"""Notebook 08: its parameters checked, and its work sized for the machine that runs it."""
import os

import torch

import helpers
from hardware import on_device, probe
from sizing import Plan, Setup, budget, largest_fitting

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


def plan_for(machine, max_processes=4, device_counts=None):
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


def setup(*, num_gpus=4, device_counts=None, hidden=None, batch_per_rank=32, timed_steps=5,
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
    plan = plan_for(machine, max(ks), ks)
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
