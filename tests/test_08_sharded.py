"""ZeRO by hand on real gloo processes, the notebook's refusals, and its recorded default run."""
import dataclasses
import inspect
import math
import re
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import torch
import torch.distributed as dist

import hardware
import launch
import parameters
import plan_08
import sizing
import zero

NOTEBOOK = '08_sharded_data_parallelism'
NOTEBOOKS = Path(__file__).resolve().parent.parent / 'notebooks'
# Parameter sizes 3 does not divide (7 x 256, 256, 256 x 256, 256 x 2, 2), one of them smaller
# than 3; large enough (68,354 parameters) that gloo sends them as a ring does.
ODD = {'in_features': 7, 'hidden': 256, 'num_hidden': 1, 'classes': 2, 'timed_steps': 2,
       'strategies': ('ddp', 'zero1', 'zero2', 'fsdp')}


@pytest.mark.parametrize('numel', [1, 2, 5, 13, 91, 1003])
@pytest.mark.parametrize('k', [1, 2, 3, 4, 7, 8])
def test_shards_cover_a_parameter_once_in_order(numel, k):
    shards = [zero.Shard(numel, r, k) for r in range(k)]
    assert shards[0].start == 0 and shards[-1].stop == numel
    assert all(a.stop == b.start for a, b in zip(shards, shards[1:]))
    assert all(0 <= s.stop - s.start <= math.ceil(numel / k) for s in shards)
    padded = shards[0].padded(torch.arange(numel, dtype=torch.float32))
    assert padded.numel() == k * math.ceil(numel / k) and padded[numel:].eq(0).all()


def ring_and_zero_worker(rank, world_size, config, sizes):
    """The notebook's worker on odd sizes, then our ring reduce-scatter against all_reduce."""
    trained = zero.train_worker(rank, world_size, config)  # leaves the process group up
    errors = {}
    for numel in sizes:
        g = torch.Generator().manual_seed(rank * 1000 + numel)
        shard = zero.Shard(numel, rank, world_size)
        x = shard.padded(torch.randn(numel, generator=g))
        expected = x.clone()
        dist.all_reduce(expected)
        out = torch.empty(shard.chunk)
        zero.reduce_scatter(out, x)
        mine = expected.view(world_size, -1)[rank]
        # Each element sums k float32 terms, the ring and gloo's all-reduce in other orders.
        # Either order's rounding error is at most (k - 1) u times the sum of the terms'
        # magnitudes (u = 2**-24), so the two differ by at most 2 (k - 1) u of it: 2.4e-7 for
        # k = 3, whatever the values (a guarantee, not a seed's luck, even where terms cancel).
        magnitude = x.abs()
        dist.all_reduce(magnitude)
        scale = magnitude.view(world_size, -1)[rank]
        errors[numel] = ((out - mine).abs() / scale.clamp_min(1e-30)).max().item()
    return trained, errors


def test_zero_by_hand_matches_ddp_on_sizes_no_k_divides():
    """The notebook's equivalence checks, in float64 and with 4 threads per rank (more than
    one thread per rank, as on a 16-core machine, also on CI's 2 cores)."""
    k, b = 3, 8  # divides none of the sizes; b: bytes per float64 value
    config = {**ODD, 'probe_wire': True, 'dtype': 'float64'}
    results = launch.run_workers(ring_and_zero_worker, k, config, [1, 3, 91, 1003], timeout=120,
                                 threads_per_rank=4)
    cfg = zero.check_config(config, k)
    psi, params = zero.num_parameters(cfg), list(zero.make_model(cfg).parameters())
    shards = [[zero.Shard(p.numel(), r, k) for p in params] for r in range(k)]
    owned = [sum(s.stop - s.start for s in mine) for mine in shards]
    assert sum(owned) == psi and owned[-1] < owned[0]  # uneven: the last rank owns less
    assert any(s.stop == s.start for s in shards[-1])  # and one of its shards is empty
    for r, (trained, errors) in enumerate(results):
        bound = 2 * (k - 1) * 2**-24 * 1.01  # relative to the terms' magnitudes (above)
        assert all(e <= bound for e in errors.values()), errors  # ring reduce-scatter
        runs = trained['strategies']
        assert runs['ddp']['ranks_apart'] <= 1e-10
        for s in ('zero1', 'zero2', 'fsdp'):  # the same training; one owner per element
            assert runs[s]['max_diff_vs_ddp'] <= 1e-10 and runs[s]['ranks_apart'] == 0, s
        # Adam's state covers exactly this rank's shards: two moments a value, and a 4-byte
        # step counter a parameter (also for an empty shard)
        assert runs['zero1']['held_bytes']['optimizer state'] == 2 * b * owned[r] + 4 * len(
            params)
        assert runs['zero1']['held_bytes']['gradients'] == b * psi
        # ZeRO-2 keeps only its gradient shards, each in a padded chunk of the reduce-scatter
        assert runs['zero2']['held_bytes']['gradients'] == b * sum(s.chunk for s in shards[r])
        assert runs['ddp']['held_bytes'] == {'parameters': b * psi, 'gradients': b * psi,
                                             'optimizer state': 2 * b * psi + 4 * len(params)}
        for s in ('ddp', 'zero1', 'zero2'):  # every rank sends 2(k-1)/k of the model a step ...
            run = runs[s]
            assert run['counted_bytes_per_step'] == pytest.approx(
                2 * (k - 1) / k * b * psi, rel=0.05), s
            # ... and that is what went over its TCP sockets
            assert run['tcp_bytes_per_step'] == pytest.approx(
                run['counted_bytes_per_step'], rel=0.05), s
        assert runs['fsdp']['counted_bytes_per_step'] == pytest.approx(
            3 * (k - 1) / k * b * psi, rel=0.05)
        probe, tensor = trained['wire_probe'], 4 * k * math.ceil(psi / k)  # float32 tensors
        assert probe['ring reduce-scatter (ours)'] == pytest.approx((k - 1) / k * tensor,
                                                                    rel=0.05)
        assert probe['all-gather'] == pytest.approx((k - 1) / k * tensor, rel=0.05)
        assert probe['all-reduce'] == pytest.approx(2 * (k - 1) / k * tensor, rel=0.05)


@pytest.mark.parametrize('config, message', [
    ({'strategies': ('ddp', 'zero4')}, "each of strategies must be one of"),
    ({'strategies': ('zero1',)}, 'must include ddp'),
    ({'hidden': 0}, 'hidden must be'),
    ({'lr': -1}, 'lr must be a positive number'),
    ({'backend': 'mpi'}, 'backend must be one of'),
    ({'device': 'tpu'}, 'device must be one of'),
    ({'backend': 'nccl', 'device': 'cpu'}, "device='cpu' needs backend='gloo'"),
    ({'batch_size': 8}, 'unknown setting'),
])
def test_bad_worker_configs_are_refused_by_name(config, message):
    with pytest.raises(ValueError, match=message):
        zero.check_config(config, 2)


@pytest.mark.parametrize('params, message', [
    ({'num_gpus': 0}, 'num_gpus must be an integer >= 1'),
    ({'num_gpus': '4'}, 'num_gpus must be an integer'),
    ({'device_counts': [0, 2]}, 'each of device_counts must be an integer >= 1'),
    ({'device_counts': []}, 'device_counts must be a non-empty list'),
    ({'device_counts': 'two'}, 'device_counts=.* is not a list'),
    ({'hidden': -8}, 'hidden must be an integer >= 1'),
    ({'batch_per_rank': 0}, 'batch_per_rank must be'),
    ({'timed_steps': 0}, 'timed_steps must be'),
    ({'lr': 0}, 'lr must be a positive number'),
    ({'memory_limit_gb': 0}, 'memory_limit_gb must be a positive number'),
    ({'collective_timeout': 0}, 'collective_timeout must be an integer >= 1'),
    ({'worker_timeout': 1.5}, 'worker_timeout must be an integer'),
    ({'threads_per_rank': 0}, 'threads_per_rank must be an integer >= 1'),
])
def test_notebook_refuses_bad_parameters_before_any_process(refusal, params, message):
    error = refusal(NOTEBOOK, **params)
    assert error is not None and re.search(message, error), error


def test_notebook_accepts_any_process_counts_from_papermill_text(refusal):
    assert refusal(NOTEBOOK, device_counts='[1, 3, 8]') is None
    assert refusal(NOTEBOOK, num_gpus=8) is None


def test_setup_refuses_an_unknown_parameter_by_name():
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['num_workers'\]"):
        plan_08.setup(num_workers=2)


def test_an_older_torch_is_refused_by_name():
    with pytest.raises(RuntimeError, match=r'needs torch>=2\.9 \(FSDP2.*torch 2\.8\.0'):
        parameters.check_torch(*plan_08.MIN_TORCH, installed='2.8.0')
    assert parameters.check_torch(*plan_08.MIN_TORCH, installed='2.11.0+cu130')


@pytest.mark.parametrize('name', sorted(hardware.DESCRIBED))
def test_plan_fits_every_described_machine(name):
    """Issue 24: the runs fit the machine's budget, and the CPU processes (the float64 check,
    and every run without a GPU) the CPU's, also on a GPU machine; with fewer GPUs than
    ranks, the ranks share the GPUs through gloo."""
    machine = hardware.DESCRIBED[name]
    host = hardware.on_device(machine, torch.device('cpu'))
    assert sizing.budget('08', host) == sizing.BUDGET_S['cpu']['08']
    for k in (1, 2, 3, 4, 8):
        plan = plan_08.plan_for(machine, k)
        assert plan.seconds <= sizing.budget('08', machine), k
        assert plan['cpu_seconds'] <= plan_08.ZERO_CPU_SHARE * sizing.budget('08', host), k
        assert plan.host_bytes <= machine.host_memory / 2, k
        assert plan['placement'] == plan_08.placement(machine, k)
        if not machine.on_gpu:
            assert plan['backend'] == 'gloo' and plan['placement'] == 'cpu'
            assert plan['hidden'] in plan_08.ZERO_CPU_WIDTHS and plan.seconds == plan['cpu_seconds']
            continue
        assert plan['placement'] == ('nccl' if machine.gpus >= k else 'gloo-gpu')
        assert plan['backend'] == ('nccl' if machine.gpus >= k else 'gloo')
        assert plan['hidden'] in plan_08.ZERO_GPU_WIDTHS and plan.device_bytes <= machine.memory / 2
    if machine.on_gpu:  # a GPU's width: millions of parameters, far above a CPU's
        assert plan_08.plan_for(machine, 1)['hidden'] == plan_08.ZERO_GPU_WIDTHS[0]


def test_plan_sizes_the_model_for_its_machine():
    cpu = hardware.DESCRIBED['cpu-2core']
    assert zero.num_parameters(zero.check_config({'hidden': plan_08.plan_for(cpu, 4)['hidden']},
                                                 4)) > 1e5
    for hidden in (13, 512, plan_08.ZERO_GPU_WIDTHS[0]):  # the plan counts the notebook's model
        assert plan_08.zero_parameters(hidden) == zero.num_parameters(
            zero.check_config({'hidden': hidden}, 1))
    for k in range(1, 9):  # any k plans, even when the process starts alone overrun the budget
        assert plan_08.plan_for(cpu, k)['backend'] == 'gloo'
    widths = [plan_08.plan_for(dataclasses.replace(cpu, host_flops=f), 4)['hidden']
              for f in (2e10, 1.3e11, 1e12)]
    assert widths == sorted(widths) and widths[0] < widths[-1]  # faster hosts, wider models
    t4 = hardware.DESCRIBED['colab-t4']
    narrow = [plan_08.plan_for(t4, k)['hidden'] for k in (1, 2, 4, 8)]
    assert narrow == sorted(narrow, reverse=True)  # more ranks through the host: narrower


@pytest.mark.parametrize('name', ['h100', '8xh100', 'cpu-2core'])
def test_setup_places_the_ranks_where_the_plan_says(monkeypatch, name):
    """With fewer GPUs than ranks, every run but the float64 check puts its ranks on the
    GPU through gloo (issue 24); the float64 check stays on CPU processes everywhere."""
    machine = hardware.DESCRIBED[name]
    monkeypatch.setattr(plan_08, 'probe', lambda: machine)
    cfg = plan_08.setup(num_gpus=4, threads_per_rank=4)
    nccl = machine.gpus >= 4 and torch.distributed.is_nccl_available()
    assert cfg.backend == cfg.config['backend'] == ('nccl' if nccl else 'gloo')
    assert cfg.on_gpu == machine.on_gpu and cfg.threads_per_rank == 4
    for config in (cfg.config, cfg.small_config):
        assert config['device'] == ('cuda' if machine.on_gpu else 'cpu')
        zero.check_config(config, 2)
    assert cfg.small_config['backend'] == ('nccl' if nccl and machine.gpus >= 2 else 'gloo')
    assert (cfg.exact_config['device'], cfg.exact_config['backend']) == ('cpu', 'gloo')
    assert cfg.chosen['ranks on'] == (f'{machine.gpus} GPU(s)' if machine.on_gpu else 'the CPU')


def test_every_worker_run_gets_threads_per_rank():
    """Issue 24: threads_per_rank reaches every run of workers the notebook starts."""
    nb = nbformat.read(NOTEBOOKS / f'{NOTEBOOK}.ipynb', 4)
    source = '\n'.join(c.source for c in nb.cells if c.cell_type == 'code')
    calls = source.split('launch.run_workers(')[1:]
    assert len(calls) == 5  # each k, the float64 check, the crash, exercise 1, exercises 2-3
    assert all('threads_per_rank=cfg.threads_per_rank' in c.split('\n\n')[0] for c in calls)


def test_default_run_meets_the_issue(default_run):
    _, r = default_run(NOTEBOOK)
    ks = r['device_counts']
    assert 4 in ks
    assert set(r['bytes_per_rank']) == set(zero.STRATEGIES)
    for key in ('bytes_per_rank', 'bytes_sent_per_step', 'seconds_per_step'):
        assert all(set(r[key][s]) == {str(k) for k in ks} for s in zero.STRATEGIES), key
    ddp = r['bytes_per_rank']['ddp']['4']
    best = min(r['bytes_per_rank'][s]['4'] for s in ('zero1', 'zero2', 'fsdp'))
    assert best <= 0.35 * ddp
    for s in zero.STRATEGIES[1:]:  # one owner per element: the ranks end identical
        assert r['ranks_apart_by_strategy'][s] == 0, s
    assert 0 <= r['max_diff_vs_ddp'] and r['ranks_apart'] == max(r['ranks_apart_by_strategy']
                                                                 .values())
    assert r['max_diff_float64'] <= 1e-10 and 0 < r['moved_by_training']
    psi = r['parameters']
    assert ddp == pytest.approx(16 * psi, rel=0.01)  # Adam in fp32: the paper's 16 bytes
    for s, factor in (('ddp', 2), ('zero1', 2), ('zero2', 2), ('fsdp', 3)):
        for k in ks:
            assert r['bytes_sent_per_step'][s][str(k)] == pytest.approx(
                factor * (k - 1) / k * 4 * psi, rel=0.03, abs=1)
            assert r['seconds_per_step'][s][str(k)] > 0
    assert r['processes_left_after_crash'] == 0 and r['crash_reported_s'] < 60
    assert r['ranks_apart_float64'] <= 1e-10  # float64 ranks agree to its rounding
    blocks = r['regather_seconds_per_step']  # exercise 1: the two FSDPs took turns
    assert len(blocks['fsdp']) == len(blocks['fsdp_keep']) == plan_08.ZERO_REGATHER_REPEATS
    assert r['regather_ratios'] == pytest.approx(
        [a / b for a, b in zip(blocks['fsdp'], blocks['fsdp_keep'])])
    for k in ks:  # FSDP kept for backward sends ZeRO-2's bytes: only the backward gather differs
        assert r['fsdp_kept_bytes_sent_per_step'][str(k)] == pytest.approx(
            2 * (k - 1) / k * 4 * psi, rel=0.03, abs=1)
        assert r['fsdp_kept_seconds_per_step'][str(k)] > 0
        for s in zero.STRATEGIES:  # every timed step, split into its phases (seconds)
            assert set(r['phase_seconds'][s][str(k)]) == set(zero.PHASES)
            assert all(t > 0 for t in r['phase_seconds'][s][str(k)].values())


def test_plan_counts_the_float64_check_the_notebook_runs():
    """Issue 19, 3.6: the float64 check (4 CPU processes, every strategy) is in the estimate
    on every machine, and it is the run the notebook's setup configures."""
    exact = [(plan_08.ZERO_EXACT_PROCESSES, plan_08.ZERO_STRATEGIES)]
    for name in ('cpu-2core', 'colab-t4', 'h100'):
        machine = hardware.DESCRIBED[name]
        host = hardware.on_device(machine, torch.device('cpu'))
        exact_s = plan_08.zero_cpu_seconds(host, exact, plan_08.ZERO_EXACT_HIDDEN,
                                          cost=plan_08.ZERO_FLOAT64_COST)
        assert exact_s > plan_08.zero_cpu_seconds(host, exact, plan_08.ZERO_EXACT_HIDDEN)
        plan = plan_08.plan_for(machine, 1)
        if not machine.on_gpu:  # one process: the main run, the 2-process runs, the check
            main = (1, len(plan_08.ZERO_MAIN_STRATEGIES))  # the four, and FSDP kept for backward
            blocks = (1, plan_08.ZERO_REGATHER_RUNS)  # exercise 1's alternating blocks
            others = plan_08.zero_cpu_seconds(host, [main, blocks, (2, 5), (2, 0)],
                                             plan['hidden'])
            assert plan.seconds == pytest.approx(plan_08.ZERO_FIXED_S + others + exact_s)
        assert plan.seconds > exact_s + plan_08.ZERO_FIXED_S
    cfg = plan_08.setup()
    assert cfg.exact_config['dtype'] == 'float64' and cfg.exact_config['backend'] == 'gloo'
    assert cfg.exact_config['device'] == 'cpu'
    assert cfg.exact_config['hidden'] == plan_08.ZERO_EXACT_HIDDEN
    zero.check_config(cfg.exact_config, plan_08.ZERO_EXACT_PROCESSES)
    assert cfg.ks == [1, 2, 4] and cfg.k_max == 4 and cfg.hidden == cfg.config['hidden']
    assert tuple(cfg.exact_config['strategies']) == zero.STRATEGIES  # float64: the four
    assert cfg.config['strategies'] == zero.STRATEGIES + ('fsdp_keep',)
    assert cfg.config['time_phases']
    zero.check_config(cfg.config, 4)
    defaults = inspect.signature(zero.regather_worker).parameters  # the blocks the plan counts
    assert (defaults['repeats'].default, defaults['block_steps'].default) == (
        plan_08.ZERO_REGATHER_REPEATS, plan_08.ZERO_REGATHER_BLOCK)


def test_summary_takes_each_step_on_its_slowest_rank():
    def rank(times, sent):  # phases: a tenth, three tenths and the rest of each step
        parts = {'forward': [0.1 * t for t in times], 'backward': [0.3 * t for t in times],
                 'step': [0.6 * t for t in times]}
        return {'parameters': 10, 'wire_probe': None, 'strategies': {s: {
            'bytes_per_rank': 160, 'counted_bytes_per_step': sent, 'tcp_bytes_per_step': None,
            'seconds_per_step': sorted(times)[1], 'step_times': times, 'peak_bytes': None,
            'held_bytes': {'optimizer state': 8}, 'collectives_per_step': {},
            'max_diff_vs_ddp': 0.0, 'ranks_apart': 0.0, 'moved': 1.0, 'phase_times': parts}
            for s in zero.STRATEGIES}}
    m = zero.summarize({2: [rank([1.0, 5.0, 2.0], 4), rank([3.0, 1.0, 1.0], 6)]})
    # phases: each step's slowest rank's own, so that they add up to the step's time
    assert m.phase_times['zero2'][2]['backward'] == pytest.approx([0.9, 1.5, 0.6])
    for i, total in enumerate(m.step_times['zero2'][2]):
        assert sum(v[i] for v in m.phase_times['zero2'][2].values()) == pytest.approx(total)
    median_step = zero.median_step_phases(m.phase_times['zero2'][2])  # the 3.0 s step
    assert sum(median_step.values()) == pytest.approx(m.seconds_per_step['zero2'][2])
    assert m.step_times['ddp'][2] == [3.0, 5.0, 2.0]  # each step waits for its slowest rank
    assert m.seconds_per_step['fsdp'][2] == 3.0 and m.bytes_sent_per_step['zero1'][2] == 6
    assert m.wire_bytes_sent_per_step['ddp'][2] is None  # no rank could read its sockets
    assert m.optimizer_state_by_rank['zero2'][2] == [8, 8]
    assert m.ranks_apart_by_strategy == {s: 0.0 for s in zero.STRATEGIES}


def test_traffic_panel_shows_and_labels_every_strategy():
    """Issue 19, 2.19: DDP, ZeRO-1 and ZeRO-2 send the same bytes; each must still show."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    ks, same = [1, 2, 4], {k: 2 * (k - 1) / k for k in [1, 2, 4]}
    per = {s: same for s in zero.STRATEGIES}
    m = SimpleNamespace(parameters=10, bytes_per_rank=per, seconds_per_step=per,
                        bytes_sent_per_step={**per, 'fsdp': {k: 1.5 * v for k, v in same.items()}})
    fig = zero.plot_memory_time_traffic(ks, m, per, 'ranks on the CPU, gloo')
    traffic = fig.axes[2]
    lines = [line for line in traffic.get_lines() if line.get_label() in zero.LABELS.values()]
    assert [line.get_label() for line in lines] == [zero.LABELS[s] for s in zero.STRATEGIES]
    looks = {(line.get_marker(), line.get_markersize(), line.get_linestyle()) for line in lines}
    assert len(looks) == len(lines)  # no two strategies drawn alike
    sizes = [line.get_markersize() for line in lines[:3]]
    assert sizes == sorted(sizes, reverse=True)  # the coinciding ones shrink: all visible
    assert any('coincide' in t.get_text() for t in traffic.texts)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert all(zero.LABELS[s] in legend for s in zero.STRATEGIES)
    plt.close(fig)


def test_strategies_take_turns_with_a_different_one_first_at_every_step():
    """Run order is taken out of the comparison: every step runs every strategy once, and
    each strategy goes first equally often."""
    calls = []

    class Fake:
        def __init__(self, name):
            self.name = name

        def step(self, i, X, y):
            calls.append((i, self.name))

    names = ('ddp', 'zero1', 'zero2', 'fsdp', 'fsdp_keep')
    zero.take_turns({n: Fake(n) for n in names}, [(None, None)] * 10)
    steps = [[n for i, n in calls if i == step] for step in range(10)]
    assert all(sorted(s) == sorted(names) for s in steps)
    firsts = [s[0] for s in steps]
    assert all(firsts.count(n) == 2 for n in names)
    assert zero.memory_mark(torch.device('cpu')) is None  # CPU processes: no peak counter
    assert zero.memory_added(torch.device('cpu'), None) == 0
