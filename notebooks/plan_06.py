"""Notebook 06: its parameters checked, and its work sized for the machine that runs it."""
import math
import os

import torch

import helpers
import launch
from hardware import probe
from sizing import Plan, Setup, budget, largest_fitting

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


def plan_for(machine, num_gpus=2, device_counts=(1, 2), batch_size=None, width=None,
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


def setup(*, num_gpus=2, batch_size=None, lr=0.1, num_epochs=None, num_train=None,
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
    plan = plan_for(machine, num_gpus, counts, batch_size, width, num_epochs, num_train,
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
