"""Notebook 09: its parameters, declared once and checked, and its work sized for the machine
that runs it. The plan builds each lesson's worker config (tensor_parallel.TPConfig,
pipeline_parallel.PPConfig, tensor_parallel.MeshConfig) and returns numbers: the time it
expects, and the idle share its pipeline model expects at each m. The notebook's Markdown says
why."""
import math

import torch

import parameters
import report
import zero
from hardware import probe
from parameters import Param
from pipeline_parallel import PPConfig
from sizing import Plan, Setup, budget, largest_fitting
from tensor_parallel import MeshConfig, TPConfig

MIN_TORCH = ('2.10', "torch.distributed.pipelining's schedules abort on gloo before 2.10")
PARAMETERS = (
    Param('num_gpus', 4, "processes; each lesson's layout comes from this number"),
    Param('tp_degree', None, 'ranks that split the MLP; None: num_gpus', optional=True),
    Param('pp_stages', None, 'pipeline stages; None: num_gpus, at most one per core on a CPU',
          optional=True),
    Param('mesh_shape', None, '(data-parallel, tensor-parallel) sizes of the 2-D mesh; None: '
          'planned', kind='list', optional=True),
    Param('microbatches', None, 'micro-batch counts m for the schedules; None: p, 2p and 4p',
          kind='list', optional=True),
    Param('hidden', None, 'the width tensor parallelism splits; None: sized for this machine',
          optional=True),
    Param('pp_width', None, "width of the pipeline's layers; None: sized for this machine",
          optional=True),
    Param('pp_steps', 3, 'timed steps per schedule and m (their median counts)'),
    Param('collective_timeout', 60, 'seconds before any collective gives up'),
    Param('worker_timeout', 180, 'seconds before a run of processes is stopped'),
    Param('threads_per_rank', None, 'torch threads in each process; None: cores // processes',
          optional=True),
    Param('results_dir', None, 'where the headline numbers go as JSON; None: build/results',
          kind='str', optional=True),
)

# ProcessGroupGloo takes CUDA tensors in all-reduce, all-gather and reduce-scatter (it copies
# them through pinned host memory), but its send and recv hand the tensor's address to TCP as
# host memory. So ranks sharing GPUs run tensor parallelism and the mesh on them through gloo;
# a pipeline's stages, which send and receive, run as CPU processes.
GLOO_ON_CUDA = {'tp': True, 'mesh': True, 'pp': False}
TP_HIDDEN = {'cpu': 256, 'gloo': 1024, 'nccl': 4096}   # by where the TP ranks run
TP_TOKENS = {'cpu': (4, 32), 'gloo': (8, 512), 'nccl': (8, 512)}  # (sequences, tokens each)
PP_WIDTHS = {'cpu': (4096, 3072, 2048, 1536, 1024, 768, 512, 384, 256),  # widest first
             'cuda': (4096, 3072, 2048, 1536, 1024)}
PP_ROWS = {'cpu': 64, 'cuda': 1024}  # rows of each micro-batch at the largest m
PP_REFERENCE_ROWS = {'cpu': 0, 'cuda': 4096}  # PPConfig.reference_rows (0: the whole batch)
# Per micro-batch and stage, besides its compute: the schedule's bookkeeping, two messages and
# (GPU) the launches. About 1 ms on 2-core CPUs (width 32, where compute is nil); the GPU
# figure is the same guess, not yet measured.
PP_OVERHEAD_S = {'cpu': 1.5e-3, 'cuda': 1.5e-3}
# A pipeline stage on CPU cores reaches about 60% of their share of the probe's matmul rate
# (2 cores, width 1024, 64-row micro-batches).
CPU_EFFICIENCY = 0.6
FLOAT64_COST = 2      # a float64 step against a float32 one
FIXED_S = 12          # kernel, imports, the probe, the forkserver, the plots
RUN_S = 1.0           # starting one run's processes from the forkserver, per core
MESH_S = 2.0          # the mesh lesson's training, per process on 2 cores
BUDGET_SHARE = 0.7    # of the budget the plan fills, leaving room for a slow machine


def mesh_shape_for(num_gpus):
    """2 data-parallel groups of num_gpus / 2 tensor-parallel ranks where num_gpus is even and
    at least 4; otherwise (1, num_gpus): no mesh with both sides >= 2 has num_gpus ranks."""
    return (2, num_gpus // 2) if num_gpus >= 4 and num_gpus % 2 == 0 else (1, num_gpus)


def placement(lesson, ranks, gpus, nccl=True):
    """(device, backend) of a lesson's ranks: a GPU each, with nccl; ranks sharing fewer GPUs,
    through gloo where gloo takes CUDA tensors for what the lesson sends; else CPU processes."""
    if gpus >= ranks and nccl:
        return 'cuda', 'nccl'
    return ('cuda' if gpus and GLOO_ON_CUDA[lesson] else 'cpu'), 'gloo'


def idle_model(p, ms, compute_s, overhead_s):
    """The idle share at each m of p equal stages, each computing for compute_s on the whole
    batch and spending overhead_s on each micro-batch besides: a step spans m + p - 1 turns of
    compute_s / m + overhead_s, of which each stage computes m. overhead_s = 0: the bubble."""
    return {m: 1 - compute_s / ((m + p - 1) * (compute_s / m + overhead_s)) for m in ms}


def stage_flops(machine, where, p, threads_per_rank=None):
    """FLOP/s one pipeline stage computes at: a GPU's, or its cores' share of the CPU's."""
    if where == 'cuda':
        return machine.flops
    cores = machine.host_cores
    threads = threads_per_rank or max(1, cores // p)
    return CPU_EFFICIENCY * machine.host_flops * min(threads, cores / p) / cores


def pipeline_cost(machine, where, p, ms, pp_steps, threads_per_rank=None):
    """seconds(width), bytes(width) and compute(width) of the pipeline lesson and its exercise:
    the schedules at every m, the float64 steps, the schedule timed alone, the single-process
    references; bytes per rank: the whole stack twice, in float32 and float64, GPipe's
    float64 activations, and the float64 reference's."""
    rows, o, layers = PP_ROWS[where], PP_OVERHEAD_S[where], PPConfig.layers_per_rank * p
    batch, rate = max(ms) * rows, stage_flops(machine, where, p, threads_per_rank)
    compute = lambda w: 3 * 2 * batch * w**2 * PPConfig.layers_per_rank / rate  # a step, a stage
    turns = lambda w, m: (m + p - 1) * (compute(w) / m + o)

    def seconds(w):
        schedules = 2 * (pp_steps + 1) * (sum(turns(w, m) for m in ms) + turns(w, max(ms)))
        extras = 2 * FLOAT64_COST * turns(w, max(ms)) + 4 * len(ms) * compute(w)
        return schedules + extras + (2 + FLOAT64_COST) * p * compute(w)

    reference = PP_REFERENCE_ROWS[where] or batch
    held = lambda w: (layers * 48 * w**2 + 400 * 2**20  # two stacks, float32 and float64
                      + 2 * 8 * w * (PPConfig.layers_per_rank * batch + layers * reference))
    return seconds, held, compute


def _tp_sizes(where, t, mesh_tp, hidden=None):
    lcm = math.lcm(t, mesh_tp)
    hidden = hidden or math.ceil(TP_HIDDEN[where] / lcm) * lcm
    batch, seq = TP_TOKENS[where]
    return hidden, batch, math.ceil(seq / t) * t  # sequence parallelism: 1/t of the sequence


def plan_for(machine, num_gpus=4, tp_degree=None, pp_stages=None, mesh_shape=None,
             microbatches=None, pp_steps=3, hidden=None, pp_width=None, collective_timeout=60,
             threads_per_rank=None, nccl=True):
    """Notebook 09 on `machine`: each lesson's worker config, the seconds and bytes expected,
    and the pipeline's modelled idle share at each m (`idle_model`)."""
    gpus, cores = machine.gpus if machine.on_gpu else 0, machine.host_cores
    t, dp_tp = tp_degree or num_gpus, tuple(mesh_shape or mesh_shape_for(num_gpus))
    where = {lesson: placement(lesson, k, gpus, nccl) for lesson, k in
             (('tp', t), ('mesh', math.prod(dp_tp)))}
    pp_where = placement('pp', pp_stages or num_gpus, gpus, nccl)
    p = pp_stages or (num_gpus if pp_where[0] == 'cuda' else max(1, min(num_gpus, cores)))
    ms = tuple(sorted(set(microbatches or (p, 2 * p, 4 * p))))
    hidden, tp_batch, tp_seq = _tp_sizes(_kind(where['tp']), t, dp_tp[1], hidden)
    seconds, held, compute = pipeline_cost(machine, pp_where[0], p, ms, pp_steps,
                                           threads_per_rank)
    fixed = (FIXED_S + 4 * RUN_S * max(1, num_gpus / cores)
             + MESH_S * math.prod(dp_tp) * max(1, 2 / cores))
    limit = BUDGET_SHARE * budget('09', machine) - fixed
    memory = machine.memory if pp_where[0] == 'cuda' else machine.host_memory / p
    width = pp_width or largest_fitting(PP_WIDTHS[pp_where[0]], seconds, limit, held,
                                        memory / 2)
    pp_batch = math.lcm(*ms) * math.ceil(max(ms) * PP_ROWS[pp_where[0]] / math.lcm(*ms))
    common = {'collective_timeout': collective_timeout}
    configs = {
        'tp': TPConfig(hidden=hidden, d_model=max(1, hidden // 4), tp_batch=tp_batch,
                       tp_seq=tp_seq, device=where['tp'][0], backend=where['tp'][1], **common),
        'pp': PPConfig(pp_width=width, pp_batch=pp_batch, microbatches=ms, pp_steps=pp_steps,
                       device=pp_where[0], backend=pp_where[1],
                       reference_rows=PP_REFERENCE_ROWS[pp_where[0]], **common),
        'mesh': MeshConfig(mesh_shape=dp_tp, hidden=hidden, device=where['mesh'][0],
                           backend=where['mesh'][1], **common)}
    params = zero.num_parameters(zero.check_config({'hidden': hidden}, 1))
    on_device = pp_where[0] == 'cuda'
    return Plan({'tp_degree': t, 'pp_stages': p, 'mesh_shape': dp_tp, 'microbatches': ms,
                 'hidden': hidden, 'pp_width': width, 'pp_batch': pp_batch, **configs,
                 'idle_model': idle_model(p, ms, compute(width), PP_OVERHEAD_S[pp_where[0]]),
                 'bubble': idle_model(p, ms, 1.0, 0.0), 'limit_s': limit + fixed},
                fixed + seconds(width),
                device_bytes=int(held(width) + 2 * 16 * params) if on_device else 0,
                host_bytes=int(num_gpus * 16 * params + (0 if on_device else p * held(width))))


def _kind(where):
    """TP_HIDDEN's key for a (device, backend) placement."""
    return 'cpu' if where[0] == 'cpu' else where[1]


def _check_layout(v):
    """Refuse, by name, a layout that cannot work before anything is measured."""
    for name in ('tp_degree', 'pp_stages'):
        if v[name] is not None and v[name] > v['num_gpus']:
            raise ValueError(f'{name}={v[name]} needs {v[name]} processes, but '
                             f'num_gpus={v["num_gpus"]}')
    shape = v['mesh_shape']
    if shape is not None and len(shape) != 2:
        raise ValueError(f'mesh_shape must be two sizes (data-parallel, tensor-parallel), '
                         f'got {shape!r}')
    if shape is not None and math.prod(shape) > v['num_gpus']:
        raise ValueError(f'mesh_shape={tuple(shape)} needs {math.prod(shape)} processes, but '
                         f'num_gpus={v["num_gpus"]}')


def _check_planned(v, plan):
    """Refuse a given width that the planned degrees do not divide, and too few micro-batches."""
    for name, degree in (('tp_degree', plan['tp_degree']), ('mesh_shape', plan['mesh_shape'][1])):
        if v['hidden'] is not None and v['hidden'] % degree:
            raise ValueError(f'hidden={v["hidden"]} does not divide into {degree} equal parts: '
                             f'the tensor-parallel degree of {name} ({degree}) must divide it')
    if min(plan['microbatches']) < plan['pp_stages']:
        raise ValueError(f'each of microbatches must be at least pp_stages={plan["pp_stages"]}: '
                         f'1F1B fills the pipeline with p micro-batches first, got '
                         f'{list(plan["microbatches"])}')


PLANNED = ('num_gpus', 'tp_degree', 'pp_stages', 'mesh_shape', 'microbatches', 'pp_steps',
           'hidden', 'pp_width', 'collective_timeout', 'threads_per_rank')


def setup(**given):
    """Notebook 09's setup: torch and every parameter checked, a layout that cannot work refused
    by name (before any process starts), then the machine probed and each lesson planned.
    Shows one row per lesson: its ranks, where they run, how they talk, its sizes."""
    parameters.check_torch(*MIN_TORCH)
    v = parameters.check(PARAMETERS, given)
    _check_layout(v)
    machine = probe()
    plan = plan_for(machine, **{k: v[k] for k in PLANNED},
                    nccl=torch.distributed.is_nccl_available())
    _check_planned(v, plan)
    tp, pp, mesh = plan['tp'], plan['pp'], plan['mesh']
    report.table({
        'tensor parallelism': {'ranks': plan['tp_degree'], 'device': tp.device,
                               'backend': tp.backend, 'width': tp.hidden},
        'pipeline': {'ranks': plan['pp_stages'], 'device': pp.device, 'backend': pp.backend,
                     'width': pp.pp_width, 'm': list(pp.microbatches)},
        'mesh': {'ranks': 'x'.join(map(str, mesh.mesh_shape)), 'device': mesh.device,
                           'backend': mesh.backend, 'width': mesh.hidden}})
    report.table({'this machine': {
        'cores': machine.host_cores, 'GPUs': machine.gpus, 'busy': machine.busy,
        'planned': plan.seconds, 'budget': plan['limit_s'] / BUDGET_SHARE}},
        units={'busy': '%', 'planned': 's', 'budget': 's'})
    chosen = {k: plan[k] for k in ('tp_degree', 'pp_stages', 'mesh_shape', 'hidden', 'pp_width')}
    return Setup([], **{**v, **chosen, 'microbatches': list(pp.microbatches)}, machine=machine,
                 plan=plan, tp=tp, pp=pp, mesh=mesh, gpus_found=machine.gpus)
