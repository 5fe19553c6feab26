"""Notebook 02: its parameters, declared once, and its work sized for the machine that runs it.

The notebook's Markdown says why each size is what it is; the plan returns the numbers."""
import math
import warnings
from pathlib import Path

import torch

import helpers
import parameters
import report
from hardware import on_device, probe
from parameters import Param
from plan_01 import GPU_BYTES_S, HOST_COPY_BYTES_S, LAUNCH_S
from sizing import Plan, Setup

MIN_TORCH = ('2.9', 'the oldest torch make compat found this notebook passing on; 2.4 fails')
MECHANISMS_02_03 = ('auto', 'threads')  # how notebooks 02 and 03 run work on two threads
PARAMETERS = (
    Param('device', None, "'cpu', 'cuda', ...; None: the first GPU if any, else the CPU",
          kind='device', optional=True),
    Param('matrix_size', None, "n of PyTorch's n x n products; None: 1000 on a CPU, sized on a GPU",
          optional=True),
    Param('num_matmuls', 10, 'products in the frontend/backend loop (the book: 10)'),
    Param('queue_lengths', None, 'loop lengths of the cost model; None: 1, 2, 4, ..., 256',
          kind='list', optional=True),
    Param('small_size', None, "n of the cost model's products; None: chosen", optional=True),
    Param('queue_numel', None, 'elements per temporary, queue experiment; None: chosen',
          optional=True),
    Param('prep_ms', 15, 'milliseconds of data preparation per batch (pipeline)', kind='float',
          minimum=0.1),
    Param('num_batches', 12, 'pipeline batches', minimum=2),
    Param('profile_steps', 5, 'profiled steps'),
    Param('mechanism', 'auto', "two threads: 'auto' (threads, and TorchScript) or 'threads'",
          kind='str', choices=MECHANISMS_02_03),
    Param('trace_dir', None, 'None: build/traces', kind='str',
          optional=True),
    Param('results_dir', None, 'None: build/results (JSON)', kind='str',
          optional=True),
)

NUMPY_SIZE = 1000        # the book's n: NumPy's loop, and PyTorch's on a CPU
ISSUE_S = 50e-6          # Python issuing one operator to a GPU, slow host (H200's: 20 in 0.77 ms)
LOOP_OVER_ISSUE = 10     # a GPU loop's work is at least this many times its issue time
HOST_RNG_S = 1e-8        # one float32 normal from NumPy or torch on one CPU core, about
# The futures, the pipeline and the profiler: CPU work sized by their parameters, not by the
# plan; with the kernel's start and imports (a GPU's: CUDA's start too; the H200 reached the
# profiler in 30 s in all)
FIXED_S = {'cpu': 14.0, 'cuda': 25.0}


def gpu_matrix_size(flops, over=LOOP_OVER_ISSUE):
    """The smallest multiple of 1000 whose product takes `over` times issuing it and its
    random matrix on a GPU of `flops` (2 n^3 / flops >= over x 2 ISSUE_S)."""
    return 1000 * max(1, math.ceil((over * ISSUE_S * flops) ** (1 / 3) / 1000))


def plan_for(machine, matrix_size=None, num_matmuls=10, queue_lengths=None):
    """Notebook 02's sizes for `machine`: PyTorch's loop, the cost model's small products, the
    queue experiment's temporaries, and what the GPU loop costs to issue and to run."""
    lengths = list(queue_lengths or [2**k for k in range(9)])
    n = matrix_size or (gpu_matrix_size(machine.flops) if machine.on_gpu else NUMPY_SIZE)
    product_s = 2 * n**3 / machine.flops
    if machine.on_gpu:
        small = next(s for s in (64, 128, 256, 512, 1024, 2048)
                     if 2 * s**3 / machine.flops >= 4 * LAUNCH_S or s == 2048)
        queue_numel, per_op = 2**24, lambda s: max(LAUNCH_S, 2 * s**3 / machine.flops)
        issue_s, loop_gpu_s = 2 * num_matmuls * ISSUE_S, num_matmuls * product_s
    else:
        small, queue_numel = 32, 2**18
        per_op = lambda s: 5e-6 + 2 * s**3 / machine.flops
        issue_s = loop_gpu_s = num_matmuls * (product_s + n**2 * HOST_RNG_S)
    numpy_loop = num_matmuls * (2 * NUMPY_SIZE**3 / machine.host_flops
                                + NUMPY_SIZE**2 * HOST_RNG_S)
    torch_loop = max(issue_s, loop_gpu_s)
    frontend = 5 * (torch_loop + numpy_loop) + 2 * 16 * max(0.02, torch_loop / num_matmuls)
    blockers = 8 * 12 * 0.01 + (8 * 3 * torch_loop if machine.on_gpu else 0)
    cost_model = 2 * len(lengths) * 6 * max(0.01, 2 * sum(lengths) * per_op(small) / len(lengths))
    # 31 rounds of both modes, 8 steps each, about 13 passes over a temporary of 4-byte floats
    queue = 62 * 8 * queue_numel * 13 * 4 / (GPU_BYTES_S if machine.on_gpu else HOST_COPY_BYTES_S)
    exercise_2 = 2 * 5 * (num_matmuls + 1) * product_s
    seconds = frontend + blockers + cost_model + queue + exercise_2 + FIXED_S[machine.kind]
    return Plan({'matrix_size': n, 'small_size': small, 'queue_numel': queue_numel,
                 'loop_issue_s': issue_s, 'loop_gpu_s': loop_gpu_s}, seconds,
                device_bytes=4 * (3 * n**2 + 4 * queue_numel * 8 * 2),
                host_bytes=4 * 3 * NUMPY_SIZE**2 * 2)


def _scriptable(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def parallel_mechanism(mechanism):
    """(whether to use TorchScript's futures, how two threads run) for mechanism 'auto'
    (TorchScript's futures beside Python threads, where this PyTorch still scripts without a
    warning Python shows by default; it warns with a FutureWarning from 2.15) or 'threads'."""
    if mechanism == 'threads':
        return False, 'threads (asked)'
    present = all(hasattr(torch.jit, name) for name in ('script', 'fork', 'wait'))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        scripts = present and helpers.try_script(_scriptable)[0] is not None
    loud = [w.category.__name__ for w in caught
            if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))]
    if not scripts or loud:  # TorchScript warns (a FutureWarning from 2.15) or cannot script
        return False, f'threads ({loud[0] if loud else "unscriptable"})'
    return True, 'threads, TorchScript'


def setup(**given):
    """Notebook 02's setup: every parameter checked (a ValueError naming it) before any work,
    then the device, the sizes planned for this machine, and how the futures run."""
    parameters.check_torch(*MIN_TORCH)
    v = parameters.check(PARAMETERS, given)
    dev = helpers.check_device('device', v['device'])
    lengths = sorted(set(v['queue_lengths'] or [2**k for k in range(9)]))
    if len(lengths) < 2:
        raise ValueError(f'queue_lengths={lengths}: at least 2 distinct lengths')
    machine = on_device(probe(), dev)
    plan = plan_for(machine, v['matrix_size'], v['num_matmuls'], lengths)
    env = helpers.environment(dev)
    use_script, how = parallel_mechanism(v['mechanism'])
    sizes = {k: v[k] or plan[k] for k in ('matrix_size', 'small_size', 'queue_numel')}
    chosen = {'device': f'{dev} ({env["device"]})', 'torch': env['torch'],
              'CPU threads': env['num_threads'], **sizes, 'NumPy size': NUMPY_SIZE,
              'two threads': how, 'estimate': plan.seconds}
    why = [f'Measured: {machine}.', report.markdown_table(
        [chosen], units={'estimate': 's'})]
    return Setup(why, **{**v, **sizes, 'device': dev, 'queue_lengths': lengths,
                         'trace_dir': Path(v['trace_dir'] or helpers.TRACES_DIR)},
                 on_cuda=dev.type == 'cuda', env=env, machine=machine, plan=plan,
                 numpy_size=NUMPY_SIZE, use_script=use_script,
                 name='02_asynchronous_computation')
