"""Notebook 02: its parameters checked, and its work sized for the machine that runs it."""
import warnings
from pathlib import Path

import torch

import helpers
from hardware import on_device, probe
from plan_01 import GPU_BYTES_S, HOST_COPY_BYTES_S, LAUNCH_S
from sizing import Plan, Setup


def plan_for(machine, matrix_size=1000, num_matmuls=10, queue_lengths=None):
    """Notebook 02: the size of the cost model's small products, and the temporaries of the
    queue experiment.

    The cost model separates issuing an operator (t1, about LAUNCH_S on a GPU) from running it
    (t2). On a GPU the product is sized so that t2 is at least four launches: then the backend
    is the slower side, as the chapter's model n t2 > (n - 1) t1 assumes, and what waiting at
    every step costs is visible. On a CPU operators are synchronous, so no size makes the
    frontend run ahead; 32 x 32 keeps the loop cheap. The queue experiment's temporaries are
    64 MB on a GPU (enough to show in peak memory) and 1 MB on a CPU, where nothing queues."""
    lengths = list(queue_lengths or [2**k for k in range(9)])
    if machine.on_gpu:
        small = next(n for n in (64, 128, 256, 512, 1024, 2048)
                     if 2 * n**3 / machine.flops >= 4 * LAUNCH_S or n == 2048)
        queue_numel, per_op = 2**24, lambda n: max(LAUNCH_S, 2 * n**3 / machine.flops)
    else:
        small, queue_numel = 32, 2**18
        per_op = lambda n: 5e-6 + 2 * n**3 / machine.flops
    host_rate = machine.host_flops
    loop = num_matmuls * 2 * matrix_size**3
    frontend = 4 * (loop / machine.flops + loop / host_rate) + 2 * 4 * matrix_size**2 / 1e8
    blockers = 8 * 12 * 0.01 + (8 * 3 * loop / machine.flops if machine.on_gpu else 0)
    cost_model = 2 * len(lengths) * 7 * max(0.01, 2 * sum(lengths) * per_op(small) / len(lengths))
    # 31 rounds of both modes, 8 steps each, about 13 passes over a temporary of 4-byte floats
    queue = 62 * 8 * queue_numel * 13 * 4 / (GPU_BYTES_S if machine.on_gpu else HOST_COPY_BYTES_S)
    exercise_2 = 2 * 3 * (num_matmuls + 1) * 2 * matrix_size**3 / machine.flops
    fixed = 6.0  # futures, the pipeline demo, the profiler: fixed work on the host CPU
    seconds = frontend + blockers + cost_model + queue + exercise_2 + fixed
    why = (f'{small}x{small} products for the cost model: '
           + (f'about {2 * small**3 / machine.flops * 1e6:.0f} us of GPU work each, several '
              'launches\' worth, so that the backend is the slower side.' if machine.on_gpu else
              'a CPU runs them synchronously, so their size changes nothing the model shows.')
           + f' Temporaries of {4 * queue_numel / 2**20:.0f} MiB in the queue experiment.')
    return Plan({'small_size': small, 'queue_numel': queue_numel}, seconds,
                device_bytes=4 * (3 * matrix_size**2 + 4 * queue_numel * 8 * 2),
                host_bytes=4 * 3 * matrix_size**2 * 2, why=why)

MECHANISMS_02_03 = ('auto', 'threads')  # how notebooks 02 and 03 run work on two threads


def _scriptable(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def parallel_mechanism(mechanism):
    """(use TorchScript's fork, the sentence saying how work runs on two threads) for
    mechanism 'auto' (TorchScript's futures beside Python threads, where this PyTorch still
    scripts without a warning Python shows by default; deprecated since 2.x, it warns with a
    FutureWarning from 2.15) or 'threads' (Python threads only)."""

    if mechanism == 'threads':
        return False, ("Two threads: Python threads only (mechanism='threads'); TorchScript is "
                       'not used.')
    present = all(hasattr(torch.jit, name) for name in ('script', 'fork', 'wait'))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        scripts = present and helpers.try_script(_scriptable)[0] is not None
    loud = [w for w in caught if not issubclass(w.category, (DeprecationWarning,
                                                             PendingDeprecationWarning))]
    if not scripts:
        return False, ('Two threads: Python threads only; this PyTorch cannot script '
                       '(mechanism=\'auto\' falls back to threads).')
    if loud:
        return False, ('Two threads: Python threads only; this PyTorch warns that TorchScript '
                       f'is deprecated ({loud[0].category.__name__}), so mechanism=\'auto\' '
                       'falls back to threads.')
    return True, ("Two threads: Python threads, and TorchScript's futures beside them where "
                  "this PyTorch can still script the functions (mechanism='auto'; TorchScript "
                  "is deprecated: mechanism='threads' leaves it out).")


def setup(*, device=None, matrix_size=1000, num_matmuls=10, queue_lengths=None,
             small_size=None, queue_numel=None, prep_ms=15, num_batches=12, profile_steps=5,
             mechanism='auto', trace_dir=None):
    """Notebook 02's setup: every parameter checked (a ValueError naming it), then the device,
    the sizes chosen for this machine (plan_02), and how the futures run (mechanism)."""

    dev = helpers.check_device('device', device)
    for name, value in (('matrix_size', matrix_size), ('num_matmuls', num_matmuls),
                        ('num_batches', num_batches), ('profile_steps', profile_steps)):
        helpers.check_int(name, value)
    if num_batches < 2:
        raise ValueError(f'num_batches={num_batches} must be at least 2: one batch leaves the '
                         'pipeline nothing to overlap')
    helpers.check_int('small_size', small_size, allow_none=True)
    helpers.check_int('queue_numel', queue_numel, allow_none=True)
    helpers.check_positive('prep_ms', prep_ms)
    helpers.check_choice('mechanism', mechanism, MECHANISMS_02_03)
    lengths = sorted(set(helpers.check_list(
        'queue_lengths', [2**k for k in range(9)] if queue_lengths is None else queue_lengths,
        helpers.check_int)))
    if len(lengths) < 2:
        raise ValueError(f'queue_lengths={lengths} needs at least two different loop lengths '
                         'to fit a line, for example [1, 16, 256]')
    machine = on_device(probe(), dev)
    plan = plan_for(machine, matrix_size, num_matmuls, lengths)
    env = helpers.environment(dev)
    use_script, how = parallel_mechanism(mechanism)
    why = [f'Device: {dev} ({env["device"]}); torch {env["torch"]}; '
           f'{env["num_threads"]} CPU threads.',
           f'Measured: {machine}.',
           str(plan) if small_size is None or queue_numel is None else
           'Every size was given as a parameter.', how]
    if dev.type != 'cuda':
        why.append('No GPU in use: each CUDA experiment runs its CPU branch, which measures '
                   'what a CPU does instead.')
    return Setup(why, device=dev, on_cuda=dev.type == 'cuda', env=env, machine=machine,
                 plan=plan, matrix_size=matrix_size, num_matmuls=num_matmuls,
                 queue_lengths=lengths, small_size=small_size or plan['small_size'],
                 queue_numel=queue_numel or plan['queue_numel'], prep_ms=prep_ms,
                 num_batches=num_batches, profile_steps=profile_steps, mechanism=mechanism,
                 use_script=use_script,
                 trace_dir=Path(trace_dir) if trace_dir is not None else helpers.TRACES_DIR)
