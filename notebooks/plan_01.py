"""Notebook 01: its parameters checked, and its work sized for the machine that runs it."""


import helpers
from hardware import on_device, probe
from sizing import Plan, Setup, budget, largest_fitting

# ------------------------------------------------------------------------- notebooks 01 to 03
LAUNCH_S = 10e-6                # issuing one operator from Python to a GPU (t1), about
HOST_COPY_BYTES_S = 5e9         # a slow host's single-core memory copy, bytes per second
GPU_BYTES_S = 250e9             # a T4-class GPU's memory bandwidth (faster GPUs: more)


def plan_for(machine, chain_length=16, repeats=7):
    """Notebook 01: the MLP batch sizes and the size of the elementwise chain.

    The notebook's time goes mostly to inductor's compilations (about seventeen; on a 2-core CPU
    the first about 10 s from scratch, each later one 1-2 s from scratch and under 0.1 s from a
    warm cache; Triton's on a GPU take longer), which no size changes: the estimate charges
    them together as one first compile and six later ones, about their cost from scratch.
    The chain is the one sized workload: its eager run moves 3 x chain_length x 2 passes over
    the tensor, timed `repeats` times in three modes, at the exercise's lengths too.
    On a GPU it is 2**26 elements (256 MB), large enough that launches do not hide fusion;
    on a CPU 2**22 (16 MB), a few milliseconds a pass."""
    first_compile_s, compile_s = (30.0, 15.0) if machine.on_gpu else (12.0, 3.0)  # cold caches
    bandwidth = GPU_BYTES_S if machine.on_gpu else HOST_COPY_BYTES_S

    def seconds(numel):
        eager_call = 3 * chain_length * 2 * 4 * numel / bandwidth
        timed = 3 * (2 + repeats) * 2 * eager_call          # three modes; measure() doubles up
        exercise = 3 * (2 + repeats) * 2 * 6 * 2 * 4 * min(numel, 2**20) / bandwidth
        return first_compile_s + 6 * compile_s + timed + exercise

    candidates = [2**26, 2**24, 2**22] if machine.on_gpu else [2**22, 2**20, 2**18]
    numel = largest_fitting(candidates, seconds, 0.8 * budget('01', machine),
                            lambda n: 4 * 4 * n, 0.25 * machine.memory)
    why = (f'The elementwise chain gets {numel:,} elements ({4 * numel / 2**20:.0f} MiB): '
           + ('large enough that kernel launches do not hide what fusion saves.'
              if machine.on_gpu else
              'a few milliseconds a pass on a CPU; chain_numel=67108864 is the GPU size.')
           + ' The MLP is timed at the book\'s batch 1 and at batch 256.')
    return Plan({'mlp_batch_sizes': [1, 256], 'chain_numel': numel}, seconds(numel),
                device_bytes=4 * 4 * numel, host_bytes=4 * 4 * numel if not machine.on_gpu
                else 0, why=why)


def setup(device=None, mlp_batch_sizes=None, chain_numel=None, chain_length=16, repeats=7):
    """Notebook 01's setup: every parameter checked (a ValueError naming it), then the device
    and the sizes chosen for this machine (plan_01)."""
    dev = helpers.check_device('device', device)
    if mlp_batch_sizes is not None:
        mlp_batch_sizes = sorted(set(helpers.check_list('mlp_batch_sizes', mlp_batch_sizes,
                                                        helpers.check_int)))
        if not mlp_batch_sizes:
            raise ValueError('mlp_batch_sizes is empty: give at least one batch size, e.g. '
                             '[1, 256]')
    helpers.check_int('chain_numel', chain_numel, allow_none=True)
    helpers.check_int('chain_length', chain_length)
    helpers.check_int('repeats', repeats)
    machine = on_device(probe(), dev)
    plan = plan_for(machine, chain_length, repeats)
    env = helpers.environment(dev)
    sized = mlp_batch_sizes is None or chain_numel is None
    why = [f'Device: {dev} ({env["device"]}); torch {env["torch"]}; '
           f'{env["num_threads"]} CPU threads.',
           f'Measured: {machine}.',
           str(plan) if sized else 'Every size was given as a parameter.']
    return Setup(why, device=dev, env=env, machine=machine, chain_length=chain_length,
                 repeats=repeats, mlp_batch_sizes=mlp_batch_sizes or plan['mlp_batch_sizes'],
                 chain_numel=chain_numel or plan['chain_numel'])
