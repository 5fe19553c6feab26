"""Notebook 06: its parameters, declared once and checked, and its work sized for the machine
that runs it. The plan returns numbers; the notebook's Markdown says why they are what they
are. The workers' settings are the dataclasses ddp_train.Config, overlap.OverlapConfig and
overlap.SweepConfig, built here from the parameters and the plan."""
import math
import os

import torch

import ddp_train
import helpers
import launch
import overlap
import parameters
import report
from hardware import probe
from parameters import Param
from sizing import Plan, Setup, budget, largest_fitting

MIN_TORCH = ('2.9', 'the oldest torch make compat found this notebook passing on; 2.4 fails')

PARAMETERS = (
    Param('num_gpus', 2, 'k: runs on 1 device are compared with runs on k devices'),
    Param('batch_size', None, 'global minibatch; None: 256 on GPUs (the book), 32 on a CPU',
          optional=True),
    Param('lr', 0.1, 'SGD learning rate', kind='float', positive=True),
    Param('num_epochs', None, 'None: chosen for this machine (book: 10)', optional=True),
    Param('num_train', None, 'training examples; None: chosen here (book: all 60,000)',
          optional=True),
    Param('num_test', None, 'test examples; None: chosen here (book: all 10,000)', optional=True),
    Param('width', None, "channels of ResNet-18's first stage; None: 64 on GPUs, less on a CPU",
          optional=True),
    Param('device_counts', None, 'DDP process counts to time; None: [1, num_gpus]', kind='list',
          optional=True),
    Param('master_port', None, 'None: a free port; an int must be free', optional=True),
    Param('worker_timeout', None, 'seconds before a run that hangs is stopped; None: planned',
          optional=True),
    Param('threads_per_rank', None, 'torch threads of each worker; None: cores // processes',
          optional=True),
    Param('data_source', 'auto', "'real' Fashion-MNIST, 'synthetic', or 'auto'", kind='str',
          choices=('real', 'synthetic', 'auto')),
    Param('results_dir', None, 'where the headline numbers go as JSON; None: build/results',
          kind='str', optional=True),
)
SIZES = ('batch_size', 'width', 'num_epochs', 'num_train', 'num_test')

RESNET18_TRAIN_FLOPS_06 = 2.734e9  # forward + backward of one 28x28 image at width 64; it grows
RESNET18_PARAMS_06 = 11_175_818    # with width**2, and so do the parameters (tests count both)
CPU_CONV_EFFICIENCY_06 = 0.35      # ResNet's convolutions against matmul's rate, on a CPU
CPU_STEP_FLOPS_06 = 2e9            # per step and process, in matmul-FLOP equivalents: BatchNorm,
                                   # ReLU, Python, the optimizer (16 ms on 2 cores at width 8)
GPU_CONV_EFFICIENCY_06 = 0.66      # a T4 took 8-10 min for 10 epochs of 60,000 at width 64
GPU_STEP_S_06 = 5e-3               # launches, Python and the DataLoader per step, on a slow host
GLOO_BYTES_S_06 = 0.5e9            # gloo all-reduce between processes of one host
NCCL_BYTES_S_06 = 20e9             # nccl between GPUs of one machine (PCIe or better)
CPU_FIXED_S_06 = 28                # kernel, data, FLOP counts, timings, plots (2 cores, here;
                                   # exercise 4 at overlap.SWEEP_PASSES timings a round)
GPU_FIXED_S_06 = 60                # the same on a GPU machine, CUDA start-up included
THROUGHPUT_STEPS_06 = 2            # exercise 2 times this many CPU steps (after one to warm
THROUGHPUT_ROUNDS_06 = 3           # up), all threads and one, in turns, this many rounds
MACHINERY_TIMING_S_06 = 0.25       # plain module against one-process DDP: each timing about
MACHINERY_STEPS_06 = (4, 32)       # this long, of this many steps at least and at most,
MACHINERY_REPEATS_06 = 5           # in this many rounds (after 2 steps each to warm up)
BOOK_06 = {'width': 64, 'batch_size': 256, 'num_epochs': 10, 'num_train': 60000,
           'num_test': 10000}
# On a CPU: 5 epochs of 960 examples at batch 32 (150 steps), about the fewest with which a
# narrow ResNet-18 learns the synthetic stand-in reliably (width 8, test accuracy over seeds:
# 0.84-0.91 with 1,024 examples, 0.85-0.92 with 960, 0.72-0.91 with 896; 0.61-0.88 after 4
# epochs of 1,024). The width is what the budget sizes.
CPU_RECIPE_06 = {'batch_size': 32, 'num_epochs': 5, 'num_train': 960, 'num_test': 300}
GPU_SCALES_06 = ((10, 60000), (5, 60000), (3, 60000), (2, 60000), (2, 30000), (2, 15000),
                 (2, 10000), (2, 6000), (2, 3000))   # (epochs, examples), largest first:
                 # at least 2 epochs, since a run's time is the median after the first
# Where DDP's processes run, as the notebook's titles and tables name it (sharing, below).
WHERE = {'gpus': 'a GPU per process (nccl)',
         'gpu': 'processes sharing one GPU (gloo; a single process: nccl)',
         'cpu': 'CPU processes sharing the cores (gloo)'}


def resnet18_size_06(width):
    """(training FLOPs per 28x28 image, parameters) of helpers.resnet18(10, width=width)."""
    scale = (width / 64) ** 2
    return RESNET18_TRAIN_FLOPS_06 * scale, RESNET18_PARAMS_06 * scale


def worker_start_s_06(k, machine):
    """Starting k processes that import torch and load the data: they share the host's cores
    (measured: 3 s for one process on 2 cores, 1.5 s more for each further pair)."""
    cuda = 3.0 if machine.on_gpu else 0.0   # a CUDA context per process
    return (2.0 + 1.5 * k / machine.host_cores) * (1.3e11 / machine.host_flops) ** 0.5 + cuda


def gpu_rate(machine, k):
    """fp32 rate of the slowest GPU that k ranks (or DataParallel replicas) use: ranks take
    GPUs 0, 1, ... in turn, so an H100 beside a T4 paces a 2-GPU run at the T4's rate."""
    return min(machine.gpu_flops[:min(k, machine.gpus)] or (machine.flops,))


def step_s(machine, sizes, k, dataparallel=False):
    """One training step of the global batch over k processes (or DataParallel devices)."""
    flops, params = resnet18_size_06(sizes['width'])
    batch = sizes['batch_size']
    exchange = 0 if dataparallel or k == 1 else 4 * params
    if not machine.on_gpu:   # k processes share the cores: the overhead is paid k times
        share = 1 if dataparallel else k
        return ((share * CPU_STEP_FLOPS_06 + batch * flops / CPU_CONV_EFFICIENCY_06)
                / machine.host_flops + exchange / GLOO_BYTES_S_06)
    devices = min(k, machine.gpus)
    compute = batch * flops / (GPU_CONV_EFFICIENCY_06 * gpu_rate(machine, k) * devices)
    shared = k > machine.gpus   # ranks share GPUs: gradients go through host memory and gloo
    link = GLOO_BYTES_S_06 if shared else NCCL_BYTES_S_06
    return compute + GPU_STEP_S_06 * (k if shared else 1) + exchange / link


def run_s(machine, sizes, k, dataparallel=False):
    """One training run: start-up, then each epoch's steps and its evaluation."""
    flops = resnet18_size_06(sizes['width'])[0]
    rate = (GPU_CONV_EFFICIENCY_06 * gpu_rate(machine, k) if machine.on_gpu
            else CPU_CONV_EFFICIENCY_06 * machine.host_flops)
    evaluate = sizes['num_test'] * flops / 3 / rate
    steps = sizes['num_train'] // sizes['batch_size']
    start = 0 if dataparallel else worker_start_s_06(k, machine)
    return start + sizes['num_epochs'] * (steps * step_s(machine, sizes, k, dataparallel)
                                          + evaluate)


def host_exercise_s(machine, width):
    """Exercise 2 on the host CPU of a GPU machine: training steps with all threads, then with
    one (on a CPU machine CPU_FIXED_S_06 counts it)."""
    batch = 64 if width <= 16 else 8
    steps = THROUGHPUT_ROUNDS_06 * (THROUGHPUT_STEPS_06 + 1)
    flops = steps * batch * resnet18_size_06(width)[0]
    rate = CPU_CONV_EFFICIENCY_06 * machine.host_flops
    return flops / rate * (1 + machine.host_cores)


def machinery_steps(machine, sizes):
    """Training steps per timing of the plain module and of one-process DDP."""
    fewest, most = MACHINERY_STEPS_06
    return min(most, max(fewest, math.ceil(MACHINERY_TIMING_S_06 / step_s(machine, sizes, 1))))


def machinery_s(machine, sizes):
    """One process timing the plain module and one-process DDP in turns."""
    steps = 2 * (MACHINERY_REPEATS_06 * machinery_steps(machine, sizes) + 2)
    return worker_start_s_06(1, machine) + steps * step_s(machine, sizes, 1)


def seconds(machine, sizes, counts):
    """The notebook's estimated time: DataParallel once per device count with a GPU each (else
    once), DDP once per k in counts, the machinery timing, the crash and the overlap jobs of 2
    processes, the rest."""
    if machine.on_gpu:
        fixed = GPU_FIXED_S_06 + host_exercise_s(machine, sizes['width'])
    else:
        fixed = CPU_FIXED_S_06 * (1.3e11 / machine.host_flops) ** 0.5
    dp_counts = [k for k in counts if k <= machine.gpus] or [1]
    return (fixed + sum(run_s(machine, sizes, k, dataparallel=True) for k in dp_counts)
            + sum(run_s(machine, sizes, k) for k in counts) + machinery_s(machine, sizes)
            + 2 * worker_start_s_06(2, machine))


def memory_bytes(machine, sizes, counts):
    """(device bytes, host bytes) at the peak: each process on a GPU holds a CUDA context,
    weights, gradients and SGD copies, and the processes sharing it split the activations."""
    params = resnet18_size_06(sizes['width'])[1]
    activations = 14e6 * (sizes['width'] / 64) * sizes['batch_size']   # kept for backward
    data = 4 * 784 * (sizes['num_train'] + sizes['num_test'])
    processes = 1 + max(counts)
    if not machine.on_gpu:
        return 0, int(processes * (data + 16 * params + 400 * 2**20) + activations)
    per_gpu = math.ceil(max(counts) / max(machine.gpus, 1))
    return (int(per_gpu * (500e6 + 16 * params) + activations),
            int(processes * (data + 16 * params + 400 * 2**20)))


def plan_for(machine, num_gpus=2, device_counts=(1, 2), batch_size=None, width=None,
             num_epochs=None, num_train=None, num_test=None):
    """Notebook 06's sizes on `machine`: on a GPU the book's network and batch, and the most
    epochs and examples that fit the budget; on a CPU the recipe's steps, at the widest
    network that fits. Values given (not None) are kept, and the estimate and the timeout are
    those of the work actually run. Also the overlap experiment's network and batch (a
    gradient exchange about as long as backward) and the batch of the compute timings."""
    given = {k: v for k, v in dict(batch_size=batch_size, width=width, num_epochs=num_epochs,
                                   num_train=num_train, num_test=num_test).items()
             if v is not None}
    counts = sorted(set(device_counts))
    cost = lambda sizes: seconds(machine, sizes, counts)
    limit = budget('06', machine) * 0.8   # headroom: estimates are rough, machines are busy
    if machine.on_gpu:
        candidates = [{**BOOK_06, 'num_epochs': e, 'num_train': n,
                       'num_test': min(10000, n // 3), **given} for e, n in GPU_SCALES_06]
        chosen = largest_fitting(candidates, cost, limit)
    else:
        recipe = {**CPU_RECIPE_06, **{k: v for k, v in given.items() if k == 'batch_size'}}
        chosen = {**largest_fitting([{**recipe, 'width': w} for w in (64, 32, 16, 8)],
                                    cost, limit), **given}
    longest = max(run_s(machine, chosen, k) for k in counts)
    device_bytes, host_bytes = memory_bytes(machine, chosen, counts)
    # generous: a slow but correct run (a busy 2-core VM, JupyterLab beside it) must not fail
    values = {**chosen, 'worker_timeout': int(300 + 10 * longest),
              'overlap_width': 64 if machine.on_gpu else 32,
              'overlap_batch': 32 if machine.on_gpu else 2,
              'compute_batch': 64 if machine.on_gpu else 2,   # per device
              'machinery_steps': machinery_steps(machine, chosen)}
    return Plan(values, cost(chosen), device_bytes=device_bytes, host_bytes=host_bytes)


def check_batch(batch_size, process_counts):
    """Every process takes an equal share of the global batch."""
    multiple = math.lcm(*process_counts)
    for k in process_counts if batch_size is not None else ():
        if batch_size % k:
            raise ValueError(f'batch_size={batch_size} does not split evenly over {k} '
                             f'processes (runs here use {process_counts}): use a multiple '
                             f'of {multiple}, or None')
    return multiple


def sizes_for(values, plan, multiple):
    """The sizes run: each parameter given, else the plan's (the batch rounded up so that it
    splits evenly over every process count)."""
    batch = values['batch_size'] or -(-plan['batch_size'] // multiple) * multiple
    sizes = {k: values[k] or plan[k] for k in SIZES[1:] + ('worker_timeout',)}
    if sizes['num_train'] < batch:
        raise ValueError(f'num_train={sizes["num_train"]} is smaller than one batch ({batch})')
    return {**sizes, 'batch_size': batch}


def worker_configs(values, sizes, plan):
    """The settings of the DDP runs (without the data), of the overlap experiment and of
    exercise 4's sweep: one dataclass each, their defaults the only ones."""
    ddp = ddp_train.Config(**{k: sizes[k] for k in SIZES}, lr=values['lr'],
                           data_source=values['data_source'])
    network = {'width': plan['overlap_width'], 'batch': plan['overlap_batch']}
    return ddp, overlap.OverlapConfig(**network), overlap.SweepConfig(**network)


def setup(**given):
    """Notebook 06's setup: torch's version and every parameter checked (a ValueError naming
    it, before any work), then the machine probed, the sizes planned, the devices found and
    the workers' settings built. Prints the machine and a table of what it chose."""
    parameters.check_torch(*MIN_TORCH)
    values = parameters.check(PARAMETERS, given)
    counts = sorted(set(values['device_counts'] or [1, values['num_gpus']]))
    process_counts = sorted(set(counts) | {2})  # the crash and the overlap jobs use 2
    multiple = check_batch(values['batch_size'], process_counts)
    port = values['master_port']
    if port is not None and not launch.port_is_free(port):
        raise ValueError(f'master_port={port} is busy on 127.0.0.1: choose another or None')
    machine = probe()
    plan = plan_for(machine, values['num_gpus'], counts, *(values[k] for k in SIZES))
    sizes = sizes_for(values, plan, multiple)
    gpus = [d for d in helpers.try_all_gpus() if d.type == 'cuda']
    own = bool(gpus) and max(counts) <= len(gpus)
    sharing = 'gpus' if own else 'gpu' if gpus else 'cpu'
    steps = sizes['num_epochs'] * (sizes['num_train'] // sizes['batch_size'])
    ddp_config, overlap_config, sweep_config = worker_configs(values, sizes, plan)
    chosen = {**{k: sizes[k] for k in SIZES}, 'steps': steps, 'device_counts': counts,
              'GPUs found': len(gpus), 'DDP runs': WHERE[sharing],
              'worker_timeout': sizes['worker_timeout'], 'estimate (s)': plan.seconds,
              'budget (s)': budget('06', machine)}
    return Setup([str(machine), report.markdown_table([chosen])], machine=machine, plan=plan,
                 **{k: v for k, v in values.items() if k not in sizes and k != 'device_counts'},
                 **sizes,
                 device_counts=counts, process_counts=process_counts, gpus=gpus,
                 on_gpu=bool(gpus), own_devices=own, sharing=sharing, where=WHERE[sharing],
                 device=gpus[0] if gpus else torch.device('cpu'), cores=os.cpu_count() or 1,
                 dp_counts=[k for k in counts if k <= len(gpus)] or [1], steps=steps,
                 ddp_config=ddp_config, overlap_config=overlap_config,
                 sweep_config=sweep_config, compute_batch=plan['compute_batch'],
                 machinery=(plan['machinery_steps'], MACHINERY_REPEATS_06),
                 throughput_rounds=THROUGHPUT_ROUNDS_06)

