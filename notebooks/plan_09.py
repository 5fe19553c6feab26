"""Notebook 09: its parameters checked, and its work sized for the machine that runs it."""
import math
import os

import torch

import helpers
from hardware import on_device, probe
from plan_08 import ZERO_BATCH_PER_RANK, zero_parameters
from sizing import Plan, Setup, budget, largest_fitting

# ------------------------------------------------------------------------------- notebook 09
MP_HIDDEN_09 = {'cpu': 256, 'cuda': 4096}  # the width tensor parallelism splits (TP, mesh)
MP_TOKENS_09 = {'cpu': (4, 32), 'cuda': (8, 512)}  # (batch, sequence) of the TP lesson
MP_PP_WIDTHS_09 = (1024, 768, 512, 384, 256)  # pipeline layer widths for CPUs, widest first
MP_PP_GPU_WIDTH_09 = 2048      # every rank builds the whole stack, float32 and float64
MP_PP_ROWS_PER_MICROBATCH_09 = 64  # rows of the largest m's micro-batches
MP_LAYERS_PER_STAGE_09 = 4      # model_parallel.PP_DEFAULTS['layers_per_rank']
# A pipeline step on a CPU process, against its share of the probe's matmul rate: small
# micro-batches and the schedule's bookkeeping reach about 60% of it (fitted on 2 cores,
# width 1024, 64-row micro-batches).
MP_CPU_EFFICIENCY_09 = 0.6
MP_GPU_STEP_S_09 = 0.02         # launches, Python and messages per pipeline step on GPUs
MP_FIXED_S_09 = 12              # kernel, imports, the probe, the forkserver, plots
MP_RUN_S_09 = 1.0               # starting one run's processes from the forkserver, per core
MP_MESH_S_09 = 2.0              # the mesh lesson's training, per process on 2 cores


def mesh_shape_09(num_gpus):
    """The 2-D mesh for num_gpus processes: 2 data-parallel groups of num_gpus / 2 tensor-
    parallel ranks where num_gpus is even and at least 4; otherwise (1, num_gpus), tensor
    parallelism alone, since no mesh with both sides of 2 or more has num_gpus ranks."""
    return (2, num_gpus // 2) if num_gpus >= 4 and num_gpus % 2 == 0 else (1, num_gpus)


def plan_for(machine, num_gpus=4, tp_degree=None, pp_stages=None, mesh_shape=None,
            microbatches=None, pp_steps=3):
    """Notebook 09: how many processes each lesson runs on, the width tensor parallelism splits,
    the pipeline's width and batch, and the backend.

    With a GPU for every process the lessons run on GPUs with nccl; otherwise on CPU processes
    over gloo, sized to the CPU's budget. The tensor-parallel lesson and the mesh are small on
    every machine: what they teach (equal results, bytes counted against the papers) does not
    grow with the width. The pipeline's idle share does: each micro-batch must compute long
    enough that the schedule's bookkeeping and messages do not swamp it, so its layers are the
    widest that fit. On a CPU every stage needs a core of its own to compute while the others
    do, so the pipeline has at most as many stages as the CPU has cores."""
    cores = machine.host_cores
    on_gpus = machine.on_gpu and machine.gpus >= num_gpus
    where = 'cuda' if on_gpus else 'cpu'
    t = tp_degree or num_gpus
    p = pp_stages or (num_gpus if on_gpus else max(1, min(num_gpus, cores)))
    dp_tp = tuple(mesh_shape or mesh_shape_09(num_gpus))
    ms = sorted(set(microbatches or (p, 2 * p, 4 * p)))
    lcm_tp = math.lcm(t, dp_tp[1])
    hidden = math.ceil(MP_HIDDEN_09[where] / lcm_tp) * lcm_tp
    batch, seq = MP_TOKENS_09[where]
    seq = math.ceil(seq / t) * t  # sequence parallelism gives each rank 1/t of the sequence
    pp_batch = max(ms) * MP_PP_ROWS_PER_MICROBATCH_09
    runs = 3 + (p >= 2)  # sections' runs of processes, and the exercises'
    fixed = MP_FIXED_S_09 + runs * MP_RUN_S_09 * max(1, num_gpus / cores)
    mesh = MP_MESH_S_09 * math.prod(dp_tp) * max(1, 2 / cores)
    steps = (2 * len(ms) + 1) * (pp_steps + 1) + (2 if p >= 2 else 0)  # + 05's reference

    def seconds(width):
        flops = 3 * 2 * pp_batch * width**2 * MP_LAYERS_PER_STAGE_09
        if on_gpus:
            step = flops / machine.flops + MP_GPU_STEP_S_09 * max(ms)
        else:
            step = flops / (MP_CPU_EFFICIENCY_09 * machine.host_flops / cores) * max(1, p / cores)
        return fixed + mesh + steps * step

    # CPU processes on a GPU machine keep the CPU's budget
    limit = budget('09', machine if on_gpus else on_device(machine, torch.device('cpu'))) * 0.7
    width = (MP_PP_GPU_WIDTH_09 if on_gpus else
             largest_fitting(MP_PP_WIDTHS_09, seconds, limit))
    values = {'tp_degree': t, 'pp_stages': p, 'mesh_shape': dp_tp, 'microbatches': ms,
              'hidden': hidden, 'pp_width': width, 'pp_batch': pp_batch, 'tp_batch': batch,
              'tp_seq': seq, 'backend': 'nccl' if on_gpus else 'gloo'}
    over = (f' Even that takes about {seconds(width):.0f} s here, beyond the {limit:.0f} s '
            'planned: this machine is slow or busy.' if seconds(width) > limit else '')
    why = (f'Pipeline layers {width} wide, micro-batches of {MP_PP_ROWS_PER_MICROBATCH_09} '
           f'rows at m={max(ms)}: the widest whose runs fit {limit:.0f} s here (about '
           f'{seconds(width):.0f} s planned); hidden={hidden} for tensor parallelism (it must '
           f'divide by {lcm_tp}).{over}')
    params = 2 * hidden * (hidden // 4) + zero_parameters(hidden)
    # each rank builds the whole stack of 4p layers twice (its copy and the single-process
    # reference), in float32 and float64: 2 x 12 bytes a weight
    stack = 2 * 12 * MP_LAYERS_PER_STAGE_09 * p * width**2
    return Plan(values, seconds(width), why=why,
                device_bytes=int(2 * 16 * params + stack) if on_gpus else 0,
                host_bytes=int(num_gpus * (400 * 2**20 + 16 * params + stack)))


def setup(*, num_gpus=4, tp_degree=None, pp_stages=None, mesh_shape=None,
             microbatches=None, hidden=None, pp_width=None, pp_steps=3, collective_timeout=60,
             worker_timeout=180):
    """Notebook 09's setup: every parameter checked (a ValueError naming it, before any process
    starts), a layout that cannot work refused by name (a tensor-parallel degree that does not
    divide `hidden`, a mesh or a pipeline with more ranks than num_gpus, fewer micro-batches
    than stages), then the sizes planned for this machine (plan_09) and each lesson's worker
    settings: `tp_config`, `pp_config`, `mesh_config`."""

    helpers.check_int('num_gpus', num_gpus)
    for name, value in (('tp_degree', tp_degree), ('pp_stages', pp_stages)):
        helpers.check_int(name, value, allow_none=True)
        if value is not None and value > num_gpus:
            raise ValueError(f'{name}={value} needs {value} processes, but num_gpus={num_gpus}')
    if mesh_shape is not None:
        mesh_shape = helpers.check_list('mesh_shape', mesh_shape, helpers.check_int)
        if len(mesh_shape) != 2:
            raise ValueError(f'mesh_shape must be two sizes (data-parallel, tensor-parallel), '
                             f'got {mesh_shape!r}')
        if math.prod(mesh_shape) > num_gpus:
            raise ValueError(f'mesh_shape={tuple(mesh_shape)} needs {math.prod(mesh_shape)} '
                             f'processes, but num_gpus={num_gpus}')
    if microbatches is not None:
        microbatches = helpers.check_list('microbatches', microbatches, helpers.check_int)
        if not microbatches:
            raise ValueError('microbatches is empty: give at least one count m, or None')
    helpers.check_int('hidden', hidden, allow_none=True)
    helpers.check_int('pp_width', pp_width, allow_none=True)
    helpers.check_int('pp_steps', pp_steps)
    helpers.check_int('collective_timeout', collective_timeout)
    helpers.check_int('worker_timeout', worker_timeout)
    machine = probe()
    plan = plan_for(machine, num_gpus, tp_degree, pp_stages, mesh_shape, microbatches, pp_steps)
    t, p, (dp, mesh_tp) = plan['tp_degree'], plan['pp_stages'], plan['mesh_shape']
    for name, degree in (('tp_degree', t), ('mesh_shape', mesh_tp)):
        if hidden is not None and hidden % degree:
            raise ValueError(f'hidden={hidden} does not divide into {degree} equal parts: '
                             f'the tensor-parallel degree of {name} ({degree}) must divide it')
    if min(plan['microbatches']) < p:
        raise ValueError(f'each of microbatches must be at least pp_stages={p}: 1F1B fills the '
                         f'pipeline with p micro-batches first, got {plan["microbatches"]}')
    ms = plan['microbatches']
    pp_batch = math.lcm(*ms) * math.ceil(plan['pp_batch'] / math.lcm(*ms))  # every m divides it
    gpus = helpers.num_gpus()
    backend = plan['backend'] if torch.distributed.is_nccl_available() else 'gloo'
    given = [f'{name}={value}' for name, value in (('hidden', hidden), ('pp_width', pp_width))
             if value is not None]
    hidden = hidden or plan['hidden']
    common = {'backend': backend, 'timeout': collective_timeout}
    tp_config = {**common, 'hidden': hidden, 'd_model': max(1, hidden // 4),
                 'batch': plan['tp_batch'], 'seq': plan['tp_seq']}
    pp_config = {**common, 'width': pp_width or plan['pp_width'], 'batch': pp_batch,
                 'microbatches': tuple(ms), 'steps': pp_steps}
    mesh_config = {**common, 'hidden': hidden, 'mesh_shape': (dp, mesh_tp),
                   'batch_per_rank': ZERO_BATCH_PER_RANK}
    cores = os.cpu_count() or 1
    where = {'nccl': 'each process drives its own GPU, with nccl.',
             'gloo': f'CPU processes talk through gloo over loopback TCP and share {cores} '
                     'cores; they stand in for GPUs.'}[backend]
    why = [f'{num_gpus} process(es); {gpus} GPU(s) found: {where}',
           f'Tensor parallelism over {t} rank(s), a pipeline of {p} stage(s) at m = {ms}, a '
           f'{dp} x {mesh_tp} mesh (data-parallel x tensor-parallel).',
           plan.why if not given else f'{", ".join(given)} as given; the rest as planned.']
    if pp_stages is None and p < num_gpus:
        why.append(f'The pipeline has {p} stages, not {num_gpus}: a stage computes while the '
                   f'others do only on a core of its own, and this CPU has {cores}; pass '
                   f'pp_stages={num_gpus} to run more stages on shared cores.')
    if mesh_shape is None and dp == 1:
        why.append(f'{num_gpus} process(es) make no mesh with two or more ranks on both sides: '
                   f'the mesh lesson runs tensor parallelism alone on a 1 x {mesh_tp} mesh.')
    if gpus and backend == 'gloo':
        why.append(f'{gpus} GPU(s) are fewer than {num_gpus} processes: num_gpus={gpus} runs '
                   'on the GPUs, with nccl.')
    return Setup(why, machine=machine, plan=plan, num_gpus=num_gpus, gpus_found=gpus,
                 backend=backend, cores=cores, tp_degree=t, pp_stages=p, dp=dp, mesh_tp=mesh_tp,
                 microbatches=ms, hidden=hidden, tp_config=tp_config, pp_config=pp_config,
                 mesh_config=mesh_config, pp_steps=pp_steps,
                 collective_timeout=collective_timeout, worker_timeout=worker_timeout)
