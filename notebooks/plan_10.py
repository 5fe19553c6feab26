"""Notebook 10: its parameters, declared once and checked, and the job it measures, sized for
the machine that runs it (the notebook's Markdown says why).

The sizes. The width d and the layers are multiples of the ranks, the batch's rows of the ranks
and of the micro-batches, so that every layout splits every tensor, stage and batch evenly. On
a CPU they keep the notebook within its 90 s; on GPUs (nccl, a GPU per rank) the products are
large enough to keep each GPU busy for a while.

The estimate: the cost model the notebook teaches (costs.py), at the machine's probed rate and
the links' rate, plus the fixed costs around the layouts' steps.
"""
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
    Param('layers', None, 'blocks in the stack; None: the least multiple of num_gpus, 8 or more',
          optional=True),
    Param('tokens', None, "rows of a step's global batch; None: sized for this machine",
          optional=True),
    Param('microbatches', None, "the pipeline's micro-batches m; None: 2 x num_gpus",
          optional=True),
    Param('rate_mbit', 250, 'Mbit/s per link', kind='float'),
    Param('delay_ms', None, 'added one-way delay of each link, ms; None: none', kind='float',
          minimum=0, optional=True),
    Param('links', 'auto', 'auto: emulated hosts where possible, else loopback', kind='str',
          choices=('auto', 'cluster', 'loopback')),
    Param('timed_steps', 3, 'timed steps per layout (their median counts), after a warm-up'),
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
# The notebook's work besides the layouts' steps: the kernel and imports, the probe and the
# block's rate, the emulated hosts, the figures (about 15 s on 2 cores); a guess on a GPU.
FIXED_S = {'cpu': 15, 'cuda': 30}
START_S = 2.0      # one rank's process and process group, per core it shares; twice
CALIBRATE_S = 2.0  # layouts.cluster_worker: three rates of 0.25 s, round trips, all-reduces
BUILD_S = 0.5      # building a layout on a rank (wrapping, sharding, the pipeline's stages)
COMPUTE_REPEATS = 3  # layouts.compute_alone: a warm-up and two timed repeats
PROCESS_BYTES = 400 * 2**20  # torch in each process, on the host
COPY_BYTES_S = 30e9  # a host's memory, read and written (a GPU's is faster: a floor)
LINK_BYTES_S = {'cpu': 1e9, 'cuda': 50e9}  # loopback between processes; GPUs in one host


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
             timed_steps=3, nccl=True, rate_mbit=None):
    """Notebook 10 on `machine`: the worker's config and the layouts it runs over links of
    `rate_mbit` (None: loopback, or a GPU's own)."""
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
                    timed_steps=timed_steps, device=device, backend=backend)
    seconds, held = estimate(machine, job, rate_mbit)
    on_gpu = device == 'cuda'
    return Plan({'job': job, 'mesh_shape': mesh, 'budget_s': BUDGET_S[machine.kind]},
                seconds=seconds, device_bytes=int(held) * on_gpu,
                host_bytes=int(k * PROCESS_BYTES + held * k * (not on_gpu)))


def estimate(machine, job, rate_mbit=None):
    """(seconds, bytes per rank) the notebook needs, by its own cost model: each layout's
    steps and its compute alone at the machine's rates, its messages at the memory's speed
    (loopback), the largest memory any layout holds; and the fixed costs around them. The
    model leaves out what the notebook measures it missing, so this is a floor."""
    import costs  # imports torch.distributed's pipelining: only when planning
    k = job.ranks
    cores = max(1.0, k / machine.host_cores) if job.device == 'cpu' else 1.0
    flops = (machine.flops if job.device == 'cuda' else machine.host_flops / k)
    link = LINK_BYTES_S[job.device] if rate_mbit is None else rate_mbit * 1e6 / 8
    here = costs.Cluster(flops=flops, bandwidth=COPY_BYTES_S / cores, link=(1e-4, link))
    model, steps = costs.job_of(job), job.warmup_steps + job.timed_steps + 1
    starts = 2 * START_S * k / min(k, machine.host_cores)
    seconds, held = FIXED_S[job.device] + starts + CALIBRATE_S, 0.0
    for plan in costs.measured_layouts(job).values():
        t = costs.step_seconds(model, plan, here)
        seconds += steps * t['step'] + COMPUTE_REPEATS * (t['compute'] + t['optimizer'])
        seconds += BUILD_S * cores
        held = max(held, sum(costs.memory(model, plan).values()))
    return seconds, held


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


def _check_delay(delay_ms, links):
    """Refuse, by name, a delay no link would carry (loopback, or a kernel without netem)."""
    if not delay_ms:
        return
    ok, why = cluster.delay_available() if links == 'cluster' else (False, f'links={links}')
    if not ok:
        raise ValueError(f'delay_ms={delay_ms} needs links that can be delayed, but {why}')


def _check_memory(plan, machine):
    """Refuse, by the sizes' names, a job whose largest layout would not fit: on a GPU, its
    memory; on a CPU, half the host's (the other half for everything else running)."""
    job = plan['job']
    limit = machine.memory if job.device == 'cuda' else machine.host_memory / 2
    needed = plan.device_bytes if job.device == 'cuda' else plan.host_bytes
    if needed > limit:
        raise ValueError(f'width={job.width}, layers={job.layers}, tokens={job.tokens}: '
                         f'{needed / 1e9:.1f} GB/device > {limit / 1e9:.1f} GB')


def setup(**given):
    """Notebook 10's setup: torch and every parameter checked, a size that cannot split refused
    by name, then the machine probed and the job planned. Shows what it chose."""
    parameters.check_torch(*MIN_TORCH)
    v = parameters.check(PARAMETERS, given)
    _check(v)
    machine = probe()
    nccl = torch.distributed.is_nccl_available()
    links, why_not = links_for(v['links'], placement(machine, v['num_gpus'], nccl)[0])
    _check_delay(v['delay_ms'], links)
    planned = ('num_gpus', 'width', 'layers', 'tokens', 'microbatches', 'timed_steps')
    plan = plan_for(machine, **{k: v[k] for k in planned}, nccl=nccl,
                    rate_mbit=v['rate_mbit'] if links == 'cluster' else None)
    _check_memory(plan, machine)
    job = plan['job']
    report.table({'job': {'ranks': v['num_gpus'], 'device': job.device, 'backend': job.backend,
                          'links': links, 'width': job.width, 'layers': job.layers,
                          'tokens': job.tokens, 'm': job.microbatches}})
    report.table({'this machine': {'cores': machine.host_cores, 'GPUs': machine.gpus,
                                   'busy': machine.busy, 'planned': plan.seconds,
                                   'budget': plan['budget_s']}},
                 units={'busy': '%', 'planned': 's', 'budget': 's'})
    return Setup([why_not] if why_not else [], **{**v, 'links': links}, machine=machine,
                 plan=plan, job=job, mesh_shape=plan['mesh_shape'])
