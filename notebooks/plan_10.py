"""Notebook 10: its parameters, declared once and checked, and the job it measures, sized for
the machine that runs it. The plan builds the worker's config (layouts.JobConfig) and returns
numbers; the notebook's Markdown says why."""
import math

import torch

import cluster
import parameters
import report
from hardware import probe
from layouts import LAYOUTS, JobConfig
from parameters import Param
from sizing import Plan, Setup

MIN_TORCH = ('2.10', "torch.distributed.pipelining's schedules abort on gloo before 2.10")
PARAMETERS = (
    Param('num_gpus', 4, 'processes (ranks) every layout runs on', minimum=2),
    Param('width', None, "the blocks' width d (d -> 4d -> d); None: sized for this machine",
          optional=True),
    Param('layers', None, 'blocks in the stack; None: the smallest multiple of num_gpus >= 8',
          optional=True),
    Param('tokens', None, "rows of a step's global batch; None: sized for this machine",
          optional=True),
    Param('microbatches', None, "the pipeline's micro-batches m; None: 2 x num_gpus",
          optional=True),
    Param('rate_mbit', 1000, "each emulated host's link, Mbit/s", kind='float'),
    Param('delay_ms', None, 'added one-way delay of each link, ms; None: none', kind='float',
          minimum=0, optional=True),
    Param('links', 'auto', 'auto: emulated hosts where possible, else loopback', kind='str',
          choices=('auto', 'cluster', 'loopback')),
    Param('timed_steps', 3, 'timed steps per layout (their median counts), after 2 warm-up'),
    Param('collective_timeout', 60, 'seconds before any collective gives up'),
    Param('worker_timeout', 180, 'seconds before a run of processes is stopped'),
    Param('threads_per_rank', None, 'torch threads in each process; None: cores // processes',
          optional=True),
    Param('results_dir', None, 'where the headline numbers go as JSON; None: build/results',
          kind='str', optional=True),
)

WIDTH = {'cpu': 192, 'cuda': 1536}     # d: 4d and d divide by 2, 3, 4 and 6
TOKENS = {'cpu': 384, 'cuda': 8192}    # rows of the global batch
MIN_LAYERS = 8
BUDGET_S = {'cpu': 90, 'cuda': 300}   # the notebook's promise on this kind of machine


def mesh_shape_for(k):
    """(dp, tp) of the 2-D mesh: 2 data-parallel groups of k / 2 tensor-parallel ranks where k
    is even and at least 4; None where no mesh with both sides >= 2 has k ranks."""
    return (2, k // 2) if k >= 4 and k % 2 == 0 else None


def layouts_for(k, mesh):
    """The layouts that run on k ranks: every one, less the mesh where k has none."""
    return tuple(x for x in LAYOUTS if x != 'fsdp_tp' or mesh is not None)


def placement(machine, k, nccl=True):
    """(device, backend): a GPU per rank with nccl where there are k GPUs, else CPU processes
    over gloo (a pipeline's sends take CPU tensors only on gloo)."""
    if machine.on_gpu and machine.gpus >= k and nccl:
        return 'cuda', 'nccl'
    return 'cpu', 'gloo'


def links_for(choice, device):
    """(links used, why not the emulated cluster or None): emulated hosts need root and
    iproute2, and carry CPU ranks; GPUs talk over their own links."""
    if choice == 'loopback' or device == 'cuda':
        return 'loopback', None
    ok, why = cluster.available()
    if not ok and choice == 'cluster':
        raise ValueError(f'links=cluster, but {why}')
    return ('cluster', None) if ok else ('loopback', why)


def plan_for(machine, num_gpus=4, width=None, layers=None, tokens=None, microbatches=None,
             timed_steps=3, collective_timeout=60, nccl=True):
    """Notebook 10 on `machine`: the worker's config and the layouts it runs."""
    k = num_gpus
    device, backend = placement(machine, k, nccl)
    mesh = mesh_shape_for(k)
    lcm = math.lcm(k, 2)
    width = width or math.ceil(WIDTH[device] / lcm) * lcm
    layers = layers or k * math.ceil(MIN_LAYERS / k)
    m = microbatches or 2 * k
    tokens = tokens or math.lcm(k, m) * math.ceil(TOKENS[device] / math.lcm(k, m))
    job = JobConfig(ranks=k, width=width, layers=layers, tokens=tokens, microbatches=m,
                    mesh_shape=mesh or (1, k), layouts=layouts_for(k, mesh),
                    timed_steps=timed_steps, device=device, backend=backend,
                    collective_timeout=collective_timeout)
    params = layers * (8 * width**2 + 5 * width)
    return Plan({'job': job, 'mesh_shape': mesh, 'budget_s': BUDGET_S[machine.kind]},
                seconds=0.0, host_bytes=int(k * 20 * params))


def _check(v):
    """Refuse, by name, sizes that the layouts cannot split evenly, before anything runs:
    FSDP, ZeRO and tensor parallelism split the width, the pipeline the layers, DDP and the
    pipeline the batch."""
    k = v['num_gpus']
    m = v['microbatches'] or 2 * k
    if m < k:  # 1F1B fills the pipeline with p micro-batches first
        raise ValueError(f'microbatches={m} must be at least num_gpus={k}')
    for name, by in (('width', k), ('layers', k), ('tokens', math.lcm(k, m))):
        if v[name] is not None and v[name] % by:
            raise ValueError(f'{name}={v[name]} must divide by {by} (num_gpus={k}, m={m})')


def setup(**given):
    """Notebook 10's setup: torch and every parameter checked, a size that cannot split refused
    by name, then the machine probed and the job planned. Shows what it chose."""
    parameters.check_torch(*MIN_TORCH)
    v = parameters.check(PARAMETERS, given)
    _check(v)
    machine = probe()
    plan = plan_for(machine, **{k: v[k] for k in ('num_gpus', 'width', 'layers', 'tokens',
                                                  'microbatches', 'timed_steps',
                                                  'collective_timeout')},
                    nccl=torch.distributed.is_nccl_available())
    job = plan['job']
    links, why_not = links_for(v['links'], job.device)
    report.table({'job': {'ranks': v['num_gpus'], 'device': job.device, 'backend': job.backend,
                          'links': links, 'width': job.width, 'layers': job.layers,
                          'tokens': job.tokens, 'm': job.microbatches}})
    report.table({'this machine': {'cores': machine.host_cores, 'GPUs': machine.gpus,
                                   'busy': machine.busy, 'budget': plan['budget_s']}},
                 units={'busy': '%', 'budget': 's'})
    sharing = v['num_gpus'] if job.device == 'cpu' else 1  # ranks computing on one device
    return Setup([why_not] if why_not else [], **{**v, 'links': links}, machine=machine,
                 plan=plan, job=job, mesh_shape=plan['mesh_shape'], sharing=sharing)
