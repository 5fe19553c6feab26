"""Notebook 01: its parameters, declared once, and its work sized for the machine that runs it.

The notebook's Markdown says why each size is what it is; the plan returns the numbers."""

import helpers
import parameters
import report
from hardware import on_device, probe
from parameters import Param
from sizing import Plan, Setup, budget, largest_fitting

MIN_TORCH = ('2.9', 'the oldest torch make compat found this notebook passing on; 2.4 fails')
PARAMETERS = (
    Param('device', None, "'cpu', 'cuda', 'cuda:1', ...; None: the first GPU if any, else the CPU",
          kind='device', optional=True),
    Param('mlp_batch_sizes', None, 'MLP batch sizes to benchmark (a list); None: [1, 256]',
          kind='list', optional=True),
    Param('chain_numel', None, 'elements in the elementwise chain; None: chosen for this machine',
          optional=True),
    Param('chain_length', 16, 'relu(0.9 x + 0.1) steps in that chain (three operators each)'),
    Param('repeats', 7, 'timing repeats per measurement; the median is reported'),
    Param('results_dir', None, 'None: build/results (JSON)', kind='str',
          optional=True),
)

# ------------------------------------------------------------------------- notebooks 01 to 03
LAUNCH_S = 10e-6                # issuing one operator from Python to a GPU (t1), about
HOST_COPY_BYTES_S = 5e9         # a slow host's single-core memory copy, bytes per second
GPU_BYTES_S = 250e9             # a T4-class GPU's memory bandwidth (faster GPUs: more)
CHAIN_BYTES_S = 20e9            # a 2-core host's elementwise passes, bytes per second

# Inductor compiles 18 times (the first pays inductor's setup; exercise 1's sweep compiles 9
# chains), and the exports, the scripted models and the kernel's start take a fixed time:
# seconds (first compile, each later one, fixed) with cold caches, set from runs: the H200's
# 47-51 s in all; on 2 busy cores a first compile of 64 s and later ones of 2.6-5.6 s, with
# other programs taking 83% of the CPU, which is about 11 s and 0.5-1 s idle.
COMPILES = 18
COMPILE_S = {'cpu': (12.0, 1.2, 8.0), 'cuda': (12.0, 1.5, 8.0)}


def plan_for(machine, chain_length=16, repeats=7):
    """Notebook 01's sizes for `machine`: the MLP's batch sizes and the elements of the chain,
    the largest that fits 80% of the budget (its eager run moves 3 x chain_length x 2 passes
    over the tensor, timed `repeats` times in three modes, at the exercise's lengths too)."""
    first_s, later_s, fixed_s = COMPILE_S[machine.kind]
    bandwidth = GPU_BYTES_S if machine.on_gpu else CHAIN_BYTES_S

    def seconds(numel):
        eager_call = 3 * chain_length * 2 * 4 * numel / bandwidth
        timed = 3 * (2 + repeats) * 2 * eager_call          # three modes; measure() doubles up
        exercise = 3 * (2 + repeats) * 2 * 6 * 2 * 4 * min(numel, 2**20) / bandwidth
        return first_s + (COMPILES - 1) * later_s + fixed_s + timed + exercise

    candidates = [2**26, 2**24, 2**22] if machine.on_gpu else [2**22, 2**20, 2**18]
    numel = largest_fitting(candidates, seconds, 0.8 * budget('01', machine),
                            lambda n: 4 * 4 * n, 0.25 * machine.memory)
    host_bytes = 0 if machine.on_gpu else 4 * 4 * numel
    return Plan({'mlp_batch_sizes': [1, 256], 'chain_numel': numel}, seconds(numel),
                device_bytes=4 * 4 * numel, host_bytes=host_bytes)


def setup(**given):
    """Notebook 01's setup: every parameter checked (a ValueError naming it) before any work,
    then the device and the sizes planned for this machine."""
    parameters.check_torch(*MIN_TORCH)
    v = parameters.check(PARAMETERS, given)
    dev = helpers.check_device('device', v['device'])
    machine = on_device(probe(), dev)
    plan = plan_for(machine, v['chain_length'], v['repeats'])
    env = helpers.environment(dev)
    sizes = {'mlp_batch_sizes': sorted(set(v['mlp_batch_sizes'] or plan['mlp_batch_sizes'])),
             'chain_numel': v['chain_numel'] or plan['chain_numel']}
    chosen = {'device': f'{dev} ({env["device"]})', 'torch': env['torch'],
              'CPU threads': env['num_threads'], **sizes, 'estimate': plan.seconds}
    why = [f'Measured: {machine}.', report.markdown_table([chosen], units={'estimate': 's'})]
    return Setup(why, **{**v, **sizes, 'device': dev}, env=env, machine=machine, plan=plan,
                 name='01_compilers_and_interpreters')
