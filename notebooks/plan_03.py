"""Notebook 03: its parameters checked, and its work sized for the machine that runs it."""

import torch

import helpers
from hardware import probe
from plan_01 import HOST_COPY_BYTES_S
from plan_02 import MECHANISMS_02_03, parallel_mechanism
from sizing import Plan, Setup, budget, largest_fitting

BOOK_03_SIZE = 4000
CPU_COPY_SIZE_03 = 1024         # results of 4 MiB: copies run from memory, not from cache
LANE_RUNS_03 = 26               # runs of `run` per lane: alone, together, baselines, exercise 1
COPY_RUNS_03 = 40               # runs of the copy_steps loop: 4 variants x 6, book, exercises
HOST_SHARE_03 = 0.3             # at most this share of host RAM for the copies' host buffers


def plan_for(machine, num_matmuls=50):
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

def setup(*, matrix_size=None, cpu_matrix_size=None, num_matmuls=50, copy_size=None,
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
    plan = plan_for(machine, num_matmuls)
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
