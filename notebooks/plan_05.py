"""Notebook 05: its parameters, declared once, and its work sized for the machine that runs it.

The plan returns numbers (sizes, and the seconds they should take); the notebook's Markdown says
why. `plan_for` takes a `hardware.Machine`, so tests plan for machines that are not there.
"""
import torch

import helpers
import parameters
from hardware import probe
from parameters import Param
from report import markdown_table
from sizing import Plan, Setup, budget, largest_fitting

MIN_TORCH = ('2.9', 'the oldest torch make compat found this notebook passing on; 2.4 fails')

PARAMETERS = (
    Param('num_gpus', 2, 'devices to train on; missing GPUs are emulated by replicas'),
    Param('batch_size', None, 'global minibatch; None: 256, rounded to a multiple of num_gpus',
          optional=True),
    Param('lr', 0.1, "SGD learning rate (the book's is 0.2: see Training)", kind='float',
          positive=True),
    Param('num_epochs', None, "None: for this machine (the book's is 10)", optional=True),
    Param('num_train', None, "training examples; None: for this machine (the book's 60,000)",
          optional=True),
    Param('num_test', None, "test examples; None: for this machine (the book's 10,000)",
          optional=True),
    Param('device_counts', None, 'k values of the scaling runs; None: [1, num_gpus]',
          kind='list', optional=True),
    Param('equivalence_steps', 5, 'SGD steps compared between k replicas and one device'),
    Param('microbatches', None, 'micro-batch counts m of the pipeline; None: [1, 2, 4, 8]',
          kind='list', optional=True),
    Param('sync_batches', None, 'per-device batches b timed for t1; None: 1, 2, 4 ... 1024',
          kind='list', optional=True),
    Param('data_source', 'auto', "'real' Fashion-MNIST, 'synthetic', or 'auto'", kind='str',
          choices=('real', 'synthetic', 'auto')),
    Param('threads_per_rank', None, 'torch threads per worker process; None: cores // ranks',
          optional=True),
    Param('results_dir', None, 'where the headline numbers go as JSON; None: build/results',
          kind='str', optional=True),
)

LENET_TRAIN_FLOPS = 3 * 4.5e6   # LeNet's forward pass is 4.5 MFLOP an example; backward twice that
LENET_PARAMS = 129_068
CPU_LENET_EFFICIENCY = 0.25     # LeNet's small convolutions run at about a quarter of matmul's rate
CPU_LENET_CORE_FLOPS = 1.5e10   # and at most this per core, loader and Python included: wide
                                # vector units (AVX-512, AMX) raise matmul's rate, not LeNet's
GPU_LENET_EFFICIENCY = 0.1      # tiny kernels: far from a GPU's matmul rate
GPU_REPLICA_STEP_S = 3e-3       # launches and Python per replica per step (about 80 kernels)
GPU_LOADER_S_PER_EXAMPLE = 1e-5  # DataLoader indexing and collating on a slow host, per example
BOOK_05 = {'num_epochs': 10, 'num_train': 60000, 'num_test': 10000}
LARGER_BATCH_EPOCHS_05 = 2       # epochs at the 4x larger batch, with and without a scaled lr
T1_LARGEST_05 = 1024             # the t1 sweep's largest per-device batch (4x the book's batch)
FIRST_STEPS_05 = 3 * 40          # three runs of 40 steps: the book's start and learning rate
PIPELINE_ROUNDS_05 = 3 + 4       # pipeline.WARMUP_ROUNDS untimed, then 4 timed, at every m
START_S = {'cpu': 15, 'cuda': 30}  # kernel, imports, probe, data, two worker processes started
ALLREDUCE_S = 3                  # the workers' all-reduce timings (12 rounds of 4 sizes)
HEADROOM = 0.8                   # of the budget: the rest for a machine busy with other work
HEADROOM_CPU = 0.65              # on a CPU, where 05 is the longest notebook of CI's 10 minutes


def _cpu_lenet_flops(flops, cores):
    """LeNet's training rate on a CPU whose matrix products reach `flops` on `cores` cores."""
    return min(flops * CPU_LENET_EFFICIENCY, cores * CPU_LENET_CORE_FLOPS)


def host_work_s(machine, batch_size=256, microbatches=4):
    """Seconds of the work that runs on the host CPU on every machine, a GPU one included: the
    pipeline's two processes (one stage each, half the cores each) and their all-reduces."""
    per_example = LENET_TRAIN_FLOPS / _cpu_lenet_flops(machine.host_flops, machine.host_cores)
    return PIPELINE_ROUNDS_05 * microbatches * batch_size * per_example + ALLREDUCE_S


def measured_example_s(batch=256, repeats=3):
    """Seconds per example of LeNet's forward and backward pass on this CPU, at `batch` and
    torch's current threads: the median of `repeats` timed passes after one untimed one."""
    import time
    g = torch.Generator().manual_seed(0)
    shapes = [(20, 1, 3, 3), (20,), (50, 20, 5, 5), (50,), (800, 128), (128,), (128, 10), (10,)]
    W1, b1, W2, b2, W3, b3, W4, b4 = [(0.1 * torch.randn(s, generator=g)).requires_grad_()
                                      for s in shapes]
    X, times = torch.randn(batch, 1, 28, 28, generator=g), []
    pool = torch.nn.functional.avg_pool2d
    for _ in range(repeats + 1):
        start = time.perf_counter()
        h = pool(torch.relu(torch.nn.functional.conv2d(X, W1, b1)), 2)
        h = pool(torch.relu(torch.nn.functional.conv2d(h, W2, b2)), 2)
        (torch.relu(h.flatten(1) @ W3 + b3) @ W4 + b4).square().sum().backward()
        times.append((time.perf_counter() - start) / batch)
    return sorted(times[1:])[repeats // 2]


def _step_s(machine, batch, k, example_s=None):
    """Seconds of one synchronous step of `batch` examples over k replicas on the device;
    example_s: a CPU's measured seconds per example, used where it is below the FLOP model's
    (a busy machine measures slow: the model then bounds the plan, as before)."""
    if not machine.on_gpu:
        modelled = LENET_TRAIN_FLOPS / _cpu_lenet_flops(machine.flops, machine.host_cores)
        per_example = min(example_s or modelled, modelled)
        return batch * per_example * (1 + 0.1 * (k - 1))  # emulated: k small passes
    per_example = LENET_TRAIN_FLOPS / (machine.flops * GPU_LENET_EFFICIENCY)
    return (batch * (per_example + GPU_LOADER_S_PER_EXAMPLE)
            + k * GPU_REPLICA_STEP_S * (1 + batch / 4096))


def seconds(machine, sizes, num_gpus=2, batch_size=256, device_counts=(1, 2),
            equivalence_steps=5, microbatches=4, example_s=None):
    """The notebook's estimated seconds on `machine` at `sizes` (num_epochs, num_train,
    num_test): the training runs, the checks, the t1 sweep, start-up and the host's work."""
    epochs, n, n_test = sizes['num_epochs'], sizes['num_train'], sizes['num_test']
    step = lambda b, k: _step_s(machine, b, k, example_s)
    runs = [*device_counts, 1]  # the nudged run is one more on one device
    train = sum(epochs * (n // batch_size) * step(batch_size, k) for k in runs)
    larger_epochs = min(LARGER_BATCH_EPOCHS_05, epochs)
    larger = [(max(1, batch_size // 4), 1)] + [(4 * batch_size, larger_epochs)] * 3
    train += sum(e * (n // b) * step(b, 1) for b, e in larger)
    # float64 (about 3x), float32 and TF32, even and uneven, the stale allreduce, exercise 2
    checks = (2 * (3 + 1 + 1) * equivalence_steps + 3 * 3) * 2 * step(64, num_gpus)
    checks += FIRST_STEPS_05 * step(batch_size, 1)
    sweep = 4 * step(2 * T1_LARGEST_05, 1)  # 1 + 2 + ... + 1024 examples, warm-up and 3 repeats
    evaluations = (epochs * len(runs) + 1 + 3 * larger_epochs + 2) * step(n_test, 1) / 3
    return (train + checks + sweep + evaluations + START_S[machine.kind]
            + host_work_s(machine, batch_size, microbatches))


def plan_for(machine, num_gpus=2, batch_size=256, device_counts=(1, 2), equivalence_steps=5,
             microbatches=4, example_s=None):
    """Epochs and examples for LeNet trained by hand on k (emulated) devices: the book's scale
    where it fits HEADROOM of the budget (a CPU: HEADROOM_CPU), else the largest candidate that
    does (on a CPU, two epochs of a subset); the smallest when none does. example_s: a CPU's
    measured seconds per training example, in place of the FLOP model."""
    if machine.on_gpu:
        candidates = [BOOK_05, {**BOOK_05, 'num_epochs': 5}, {**BOOK_05, 'num_epochs': 2},
                      {'num_epochs': 2, 'num_train': 20000, 'num_test': 5000}]
    else:
        # at most half the data: LeNet's small kernels scale poorly past a few cores
        candidates = [{'num_epochs': 2, 'num_train': n, 'num_test': 1000}
                      for n in (30000, 20000, 16000, 12000, 10000, 8000, 6000, 5000, 4000,
                                3000, 2000)]
    estimate = lambda sizes: seconds(machine, sizes, num_gpus, batch_size, device_counts,
                                     equivalence_steps, microbatches, example_s)
    headroom = HEADROOM if machine.on_gpu else HEADROOM_CPU
    chosen = largest_fitting(candidates, estimate, headroom * budget('05', machine))
    images = chosen['num_train'] + chosen['num_test']
    activations = 4 * batch_size * 4 * (20 * 26 * 26 + 50 * 9 * 9) * 3  # largest batch, fwd+bwd
    return Plan(dict(chosen), estimate(chosen),
                device_bytes=activations + 4 * LENET_PARAMS * 4 * max(device_counts),
                host_bytes=images * 28 * 28 * 5)


def _check_sizes(v):
    """Cross-parameter checks, before any work; fills batch_size, device_counts, microbatches.
    Returns (per-device batch, replicas of the exercises, global batches of the larger-batch
    experiment)."""
    k = v['num_gpus']
    if v['batch_size'] is None:  # the book's 256, rounded so that every device gets the same
        v['batch_size'] = max(k, round(256 / k) * k)
    batch = v['batch_size']
    if batch < k:
        raise ValueError(f'batch_size={batch} < num_gpus={k}')
    v['device_counts'] = sorted(set(v['device_counts'] or [1, k]))
    for count in v['device_counts']:
        if batch < count:
            raise ValueError(f'device_counts has {count} but batch_size={batch} < {count}')
    k_exercise = max(2, k)  # the exercises compare at least 2 replicas with one device
    if batch < k_exercise:
        raise ValueError(f'batch_size={batch}: exercises need {k_exercise} replicas')
    micro = v['microbatches'] = sorted(set(v['microbatches'] or [1, 2, 4, 8]))
    if len(micro) < 2 or micro[-1] > batch:
        raise ValueError(f'microbatches={micro}: two or more, each <= batch_size={batch}')
    per_device = batch // k
    if v['sync_batches'] is not None and not set(v['sync_batches']) - {per_device}:
        raise ValueError(f'sync_batches={v["sync_batches"]}: give one b besides b={per_device}')
    return per_device, k_exercise, sorted({max(1, batch // 4), batch, 4 * batch})


def _check_num_train(v, n, largest_global_batch):
    if n < largest_global_batch:
        raise ValueError(f'num_train={n} < {largest_global_batch}, 4 x batch_size')
    if v['sync_batches'] is not None and max(v['sync_batches']) > n:
        raise ValueError(f'sync_batches has {max(v["sync_batches"])}, above num_train={n}')


def _precision_and_links(devices, threads_per_rank):
    """Where TF32 is measured, and what t1 and t2 run on: a dict of setup's values."""
    on_gpu, gpus = devices[0].type == 'cuda', helpers.num_gpus()
    used = sorted(set(devices), key=str)
    tf32 = on_gpu and all(torch.cuda.get_device_capability(d) >= (8, 0) for d in used)
    names = ', '.join(sorted({torch.cuda.get_device_name(d) for d in used})) if tf32 else ''
    processes = threads_per_rank or helpers.cores_per_process(2)
    return dict(on_gpu=on_gpu, gpus=gpus, tf32_hardware=tf32,
                tf32_how=f'measured ({names})' if tf32 else 'emulated',
                t1_threads=torch.get_num_threads() if on_gpu else processes,
                t2_between_gpus=gpus >= 2, t1_t2_same_hardware=gpus >= 2 or not on_gpu,
                t2_link='allreduce, 2 GPUs' if gpus >= 2 else 'gloo, 2 CPU processes')


def setup(**given):
    """Notebook 05's setup: every parameter checked (a ValueError naming it, before any work),
    the sizes planned for this machine, the devices (real GPUs, or replicas that emulate the
    missing ones), and where TF32, t1 and t2 are measured. Prints a table of what it chose."""
    parameters.check_torch(*MIN_TORCH)
    v = parameters.check(PARAMETERS, given)
    per_device, k_exercise, global_batches = _check_sizes(v)
    if v['num_train'] is not None:
        _check_num_train(v, v['num_train'], global_batches[-1])
    machine = probe()
    example_s = None if machine.on_gpu else measured_example_s()  # a CPU: timed, not modelled
    plan = plan_for(machine, v['num_gpus'], v['batch_size'], v['device_counts'],
                    v['equivalence_steps'], len(v['microbatches']), example_s)
    for name in ('num_epochs', 'num_train', 'num_test'):
        v[name] = v[name] or plan[name]
    _check_num_train(v, v['num_train'], global_batches[-1])
    top = min(T1_LARGEST_05, v['num_train'])  # 1, 2, 4, ... up to 4 x the book's batch
    v['sync_batches'] = sorted(set(v['sync_batches'] or [2**i for i in range(top.bit_length())])
                               | {per_device, v['batch_size']})  # batch_size: exercise 1
    devices = helpers.resolve_devices(v['num_gpus'], verbose=False)
    where = _precision_and_links(devices, v['threads_per_rank'])
    chosen = {'batch': v['batch_size'], 'epochs': v['num_epochs'], 'train': v['num_train'],
              'test': v['num_test'], 'devices': ', '.join(map(str, devices)),
              'TF32': where['tf32_how'], 't1': f'{devices[0]}, threads={where["t1_threads"]}',
              't2': where['t2_link'], 'plan (s)': round(plan.seconds),
              'CPU work (s)': round(host_work_s(machine, v['batch_size'],
                                                  len(v['microbatches'])))}
    return Setup([str(machine), markdown_table([chosen])], machine=machine, plan=plan,
                 devices=devices, emulated=len(set(devices)) < len(devices),
                 per_device=per_device, k_exercise=k_exercise, global_batches=global_batches,
                 claim_per_device=max(1, min(per_device, 64 // v['num_gpus'])),
                 extra=min(1, v['num_gpus'] - 1),  # one example more than k*b: uneven shards
                 larger_batch_epochs=min(LARGER_BATCH_EPOCHS_05, v['num_epochs']),
                 chosen=chosen, **where, **v)
