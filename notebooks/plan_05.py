"""Notebook 05: its parameters checked, and its work sized for the machine that runs it."""
import contextlib
import io
import os

import torch

import helpers
from hardware import probe
from sizing import Plan, Setup, budget, largest_fitting

# ------------------------------------------------------------------------------- notebook 05
LENET_TRAIN_FLOPS = 3 * 4.5e6   # LeNet's forward pass is 4.5 MFLOP an example; backward twice that
LENET_PARAMS = 129_068
CPU_LENET_EFFICIENCY = 0.25     # LeNet's small convolutions run at about a quarter of matmul's rate
GPU_LENET_EFFICIENCY = 0.1      # tiny kernels: far from a GPU's matmul rate
GPU_REPLICA_STEP_S = 3e-3       # launches and Python per replica per step (about 80 kernels)
GPU_LOADER_S_PER_EXAMPLE = 1e-5  # DataLoader indexing and collating on a slow host, per example
BOOK_05 = {'num_epochs': 10, 'num_train': 60000, 'num_test': 10000}
LARGER_BATCH_EPOCHS_05 = 2       # epochs at the 4x larger batch, with and without a scaled lr
T1_LARGEST_05 = 1024             # the t1 sweep's largest per-device batch (4x the book's batch)
CPU_TRAINING_SHARE_05 = 0.33     # of the CPU budget, for the training runs the plan sizes


def plan_for(machine, num_gpus=2, batch_size=256, device_counts=(1, 2), equivalence_steps=5):
    """Notebook 05: epochs and examples for LeNet trained by hand on k (emulated) devices.

    The notebook trains once per k in device_counts for num_epochs epochs, once more on one
    device from weights nudged by one float32 step (the rounding experiment), one epoch at a 4x
    smaller global batch, LARGER_BATCH_EPOCHS_05 epochs at a 4x larger one three times (the
    learning rate as given, and scaled by 4 from two starts), and a few dozen steps for the
    equivalence checks. On a GPU
    the book's scale (10 epochs of 60,000 examples) is kept where it fits the budget; on a CPU
    two epochs of the largest subset that fits are chosen, because that subset is what CI
    runs. The estimate leaves out what no size changes (the t1 sweep up to T1_LARGEST_05
    examples, the pipeline's processes, the 3 x 40 first steps that measure the book's start
    and learning rate), which the rest of the budget covers."""
    per_example = LENET_TRAIN_FLOPS / (machine.flops * (
        GPU_LENET_EFFICIENCY if machine.on_gpu else CPU_LENET_EFFICIENCY))

    def step_s(batch, k):  # one synchronous step of `batch` examples over k replicas
        if not machine.on_gpu:
            return batch * per_example * (1 + 0.1 * (k - 1))  # emulated: k small passes
        return (batch * (per_example + GPU_LOADER_S_PER_EXAMPLE)
                + k * GPU_REPLICA_STEP_S * (1 + batch / 4096))

    def seconds(sizes):
        epochs, n, n_test = sizes['num_epochs'], sizes['num_train'], sizes['num_test']
        runs = [*device_counts, 1]  # the nudged run is one more on one device
        train = sum(epochs * (n // batch_size) * step_s(batch_size, k) for k in runs)
        larger_epochs = min(LARGER_BATCH_EPOCHS_05, epochs)
        larger = [(max(1, batch_size // 4), 1), (4 * batch_size, larger_epochs),
                  (4 * batch_size, larger_epochs), (4 * batch_size, larger_epochs)]
        train += sum(e * (n // b) * step_s(b, 1) for b, e in larger)
        # float64 (about 3x), float32 and TF32 checks, even and uneven, and exercise 2, each
        # of two runs on a batch of about 64
        equivalence = (2 * (3 + 1 + 1) * equivalence_steps + 3 * 3) * 2 * step_s(64, num_gpus)
        evaluations = (epochs * len(runs) + 1 + 3 * larger_epochs + 2) * n_test * per_example / 3
        return train + equivalence + evaluations

    if machine.on_gpu:
        candidates = [BOOK_05, {**BOOK_05, 'num_epochs': 5}, {**BOOK_05, 'num_epochs': 2},
                      {'num_epochs': 2, 'num_train': 20000, 'num_test': 5000}]
        limit = budget('05', machine) * 0.5  # the rest: pipeline processes, timings, start-up
    else:
        candidates = [{'num_epochs': 2, 'num_train': n, 'num_test': 1000}
                      for n in (60000, 30000, 20000, 16000, 12000, 10000, 8000, 6000, 5000,
                                4000, 3000, 2000)]
        # the rest of the 90 s: kernel start, two worker processes, the timing sections (about
        # 30 s on 2 cores), and headroom for a machine that is busy with other work
        limit = budget('05', machine) * CPU_TRAINING_SHARE_05
    chosen = largest_fitting(candidates, seconds, limit)
    book = chosen == BOOK_05
    images = chosen['num_train'] + chosen['num_test']
    activations = 4 * batch_size * 4 * (20 * 26 * 26 + 50 * 9 * 9) * 3  # largest batch, fwd+bwd
    fits = seconds(chosen) <= limit
    why = ('The book\'s scale (10 epochs of all 60,000 examples) fits the budget here.' if book
           else (f'{chosen["num_epochs"]} epoch(s) of {chosen["num_train"]:,} examples fit '
                 f'{limit:.0f} s of training here' if fits else
                 f'Even the smallest choice, {chosen["num_epochs"]} epoch(s) of '
                 f'{chosen["num_train"]:,} examples, needs more than the {limit:.0f} s planned '
                 'for training: this machine is slow or busy, and the notebook will take longer')
           + '; num_epochs=10, num_train=60000, num_test=10000 run the book\'s scale.')
    return Plan(dict(chosen), seconds(chosen),
                device_bytes=activations + 4 * LENET_PARAMS * 4 * max(device_counts),
                host_bytes=images * 28 * 28 * 5, why=why)


def setup(*, num_gpus=2, batch_size=None, lr=0.1, num_epochs=None, num_train=None,
             num_test=None, device_counts=None, equivalence_steps=5, microbatches=None,
             sync_batches=None, data_source='auto'):
    """Notebook 05's setup: every parameter checked (a ValueError naming it, before any work),
    then the sizes planned for this machine (plan_05), the devices (real GPUs, or replicas
    that emulate the missing ones), whether TF32 is measured (every GPU used has TF32 tensor
    cores) or emulated, and what t1 and t2 are measured on."""

    helpers.check_int('num_gpus', num_gpus)
    why = []
    if batch_size is None:  # the book's 256, rounded so that every device gets the same share
        batch_size = max(num_gpus, round(256 / num_gpus) * num_gpus)
        if batch_size != 256:
            why.append(f"batch_size=None: the book's 256 rounded to {batch_size}, a multiple of "
                       f'num_gpus={num_gpus}, so that each device gets {batch_size // num_gpus} '
                       'examples.')
    helpers.check_int('batch_size', batch_size)
    if batch_size < num_gpus:
        raise ValueError(f'batch_size={batch_size} is smaller than num_gpus={num_gpus}: '
                         'every device needs at least one example')
    helpers.check_positive('lr', lr)
    for name, value in (('num_epochs', num_epochs), ('num_train', num_train),
                        ('num_test', num_test)):
        helpers.check_int(name, value, allow_none=True)
    counts = sorted(set(helpers.check_list(
        'device_counts', [1, num_gpus] if device_counts is None else device_counts,
        helpers.check_int)))
    if not counts:
        raise ValueError('device_counts is empty: give at least one k, for example [1, 2]')
    for k in counts:
        if batch_size < k:
            raise ValueError(f'device_counts has {k} but batch_size={batch_size} < {k}')
    k_exercise = max(2, num_gpus)  # the exercises compare at least 2 replicas with one device
    if batch_size < k_exercise:
        raise ValueError(f'batch_size={batch_size}: the exercises split each batch over '
                         f'{k_exercise} replicas and need at least {k_exercise} examples')
    helpers.check_int('equivalence_steps', equivalence_steps)
    micro = sorted(set(helpers.check_list(
        'microbatches', [1, 2, 4, 8] if microbatches is None else microbatches,
        helpers.check_int)))
    if len(micro) < 2 or micro[-1] > batch_size:
        raise ValueError(f'microbatches={micro}: give at least two micro-batch counts, each '
                         f'at most batch_size={batch_size} (the pipeline cuts one minibatch)')
    per_device = batch_size // num_gpus
    given_sync = sync_batches is not None
    if given_sync:
        sync_batches = helpers.check_list('sync_batches', sync_batches, helpers.check_int)
        if not set(sync_batches) - {per_device}:
            raise ValueError(f'sync_batches={sync_batches}: give at least one per-device batch '
                             f'besides b={per_device}, to compare t1 across batches')
    helpers.check_choice('data_source', data_source, ('real', 'synthetic', 'auto'))
    global_batches = sorted({max(1, batch_size // 4), batch_size, 4 * batch_size})

    def check_num_train(n):
        if n < global_batches[-1]:
            raise ValueError(f'num_train={n} is smaller than {global_batches[-1]}, the largest '
                             f'global batch (4 x batch_size) of the larger-batch experiment: '
                             f'use num_train >= {global_batches[-1]} or a smaller batch_size')
        if given_sync and max(sync_batches) > n:
            raise ValueError(f'sync_batches has {max(sync_batches)}, more than num_train={n}')
    if num_train is not None:
        check_num_train(num_train)

    machine = probe()
    plan = plan_for(machine, num_gpus, batch_size, counts, equivalence_steps)
    why.insert(0, f'Measured: {machine}.')
    why.insert(1, str(plan) if None in (num_epochs, num_train, num_test) else
               'num_epochs, num_train and num_test were given.')
    num_train = num_train or plan['num_train']
    check_num_train(num_train)
    num_epochs = num_epochs or plan['num_epochs']
    if not given_sync:  # 1, 2, 4, ... up to 4 x the book's batch, as far as the data reaches
        top = min(T1_LARGEST_05, num_train)
        sync_batches = [2**i for i in range(top.bit_length())]
    sync_batches = sorted(set(sync_batches) | {per_device})

    with contextlib.redirect_stdout(io.StringIO()) as said:  # its sentence, for `why`
        devices = helpers.resolve_devices(num_gpus)
    why.append(f'Devices: {said.getvalue().strip()}.')
    gpus = helpers.num_gpus()
    on_gpu = devices[0].type == 'cuda'
    used = sorted(set(devices), key=str)
    tf32_hardware = on_gpu and all(torch.cuda.get_device_capability(d) >= (8, 0) for d in used)
    if tf32_hardware:
        names = ', '.join(sorted({torch.cuda.get_device_name(d) for d in used}))
        tf32_how = f"measured on {names} with torch's default TF32 convolutions"
    elif on_gpu:
        tf32_how = ('emulated, because not every GPU used has TF32 tensor cores (compute '
                    'capability 8.0 or newer): convolution operands rounded to TF32 in the '
                    'forward pass')
    else:
        tf32_how = ('emulated, because a CPU has no TF32: convolution operands rounded to '
                    'TF32 in the forward pass')
    why.append(f'TF32: {tf32_how}.')
    cores = os.cpu_count() or 1
    t1_threads = torch.get_num_threads() if on_gpu else helpers.cores_per_process(2)
    if gpus >= 2:
        t2_link = "between two GPUs, with this notebook's allreduce"
    elif on_gpu:
        t2_link = ('between two CPU processes over loopback: one GPU has no second GPU to '
                   'exchange with, so t1 (on the GPU) and t2 (on the CPU) describe different '
                   'hardware')
    else:
        t2_link = (f'between two CPU processes over loopback, each with '
                   f'{helpers.cores_per_process(2)} of the {cores} cores')
    why.append(f't1 is timed on {devices[0]} with {t1_threads} thread(s); t2 is measured '
               f'{t2_link}.')
    return Setup(why, machine=machine, plan=plan, num_gpus=num_gpus, batch_size=batch_size,
                 lr=lr, num_epochs=num_epochs, num_train=num_train,
                 num_test=num_test or plan['num_test'], device_counts=counts,
                 equivalence_steps=equivalence_steps, microbatches=micro,
                 sync_batches=sync_batches, data_source=data_source, devices=devices,
                 emulated=len(set(devices)) < len(devices), on_gpu=on_gpu, gpus=gpus,
                 per_device=per_device, k_exercise=k_exercise, global_batches=global_batches,
                 claim_per_device=max(1, min(per_device, 64 // num_gpus)),
                 extra=min(1, num_gpus - 1),  # one example more than k*b: uneven shards
                 larger_batch_epochs=min(LARGER_BATCH_EPOCHS_05, num_epochs),
                 tf32_hardware=tf32_hardware, tf32_how=tf32_how, t1_threads=t1_threads,
                 t2_link=t2_link, t2_between_gpus=gpus >= 2,
                 t1_t2_same_hardware=gpus >= 2 or not on_gpu)
