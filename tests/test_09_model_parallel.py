"""Notebook 09: its workers on real processes (small, 4 threads a rank), the activation meter,
the refusals, the plan for described machines, the recorded default run, and a run on three
processes."""
import dataclasses
import math
import re

import pytest
import torch

import hardware
import launch
import meters
import parameters
import pipeline_parallel
import plan_09
import sizing
import tensor_parallel
import zero
from pipeline_parallel import PPConfig
from tensor_parallel import MeshConfig, TPConfig

THREADS = 4  # threads per rank: the equivalence checks, tried with more than one thread

NOTEBOOK = '09_tensor_and_pipeline_parallelism'


def test_saved_activations_counts_what_autograd_keeps_and_frees():
    torch.manual_seed(0)
    tokens, d_model, hidden = 6, 8, 32
    mlp = tensor_parallel.MLP(d_model, hidden)
    meter = meters.SavedActivations(mlp.parameters())
    x = torch.randn(tokens, d_model, requires_grad=True)
    with meter:
        y = mlp(x)
    # X (for A's gradient), GeLU's input and GeLU's output (for B's): never the weights
    assert meter.live == meter.peak == 4 * tokens * (d_model + 2 * hidden)
    y.sum().backward()
    assert meter.live == 0 and meter.peak == 4 * tokens * (d_model + 2 * hidden)
    net = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(d_model, 1))
    meter = meters.SavedActivations(net.parameters())
    with meter:  # a tensor saved twice (ReLU's output, then the next layer's input) counts once
        z = net(x)
    assert meter.live == 4 * tokens * d_model
    del z  # the graph, and what it saved, goes with its output
    assert meter.live == 0


def test_tensor_parallel_worker_matches_one_process_and_megatron_on_three_ranks():
    cfg = TPConfig(d_model=8, hidden=24, tp_batch=2, tp_seq=6)
    t = 3
    results = launch.run_workers(tensor_parallel.tp_worker, t, cfg, timeout=120,
                                 threads_per_rank=THREADS)
    tokens = cfg.tp_batch * cfg.tp_seq
    megatron = 2 * 2 * (t - 1) / t * 4 * tokens * cfg.d_model
    for r in results:
        for dtype, tolerance in (('float32', 1e-5), ('float64', 1e-12)):
            for way in ('by_hand', 'library'):
                run = r[dtype][way]
                assert run['forward_diff'] <= tolerance and run['gradient_diff'] <= tolerance
        for way in ('by_hand', 'library'):
            run = r['float32'][way]
            assert run['counted_bytes'] == pytest.approx(megatron)
            assert sum(run['collectives'].values()) == 2  # g forward, f backward
            assert run['activation_bytes'] == 4 * tokens * (cfg.d_model + 2 * cfg.hidden / t)
            assert run['wire_bytes'] >= run['counted_bytes']
    sp = launch.run_workers(tensor_parallel.tp_worker, t,
                            dataclasses.replace(cfg, sequence_parallel=True), timeout=120,
                            threads_per_rank=THREADS)[0]
    assert sp['sequence parallel']['gradient_diff'] <= 1e-5
    assert sp['sequence parallel']['counted_bytes'] == pytest.approx(megatron)
    assert sp['sequence parallel']['activation_bytes'] < sp['tensor parallel']['activation_bytes']


def test_pipeline_worker_keeps_the_schedules_activations_and_the_single_process_gradients():
    p, ms = 2, (2, 4)
    cfg = PPConfig(pp_width=32, pp_batch=16, microbatches=ms, pp_steps=1)
    results = launch.run_workers(pipeline_parallel.pp_worker, p, cfg, timeout=120,
                                 threads_per_rank=THREADS)
    layers = results[0]['layers']
    assert layers == cfg.layers_per_rank * p
    bound = {dtype: pipeline_parallel.tolerance(dtype, layers) for dtype in ('float32', 'float64')}
    for kind in ('gpipe', '1f1b'):
        for m in ms:
            peaks = [r[kind][m]['peak_bytes'] / r[kind][m]['microbatch_bytes'] for r in results]
            # GPipe keeps every micro-batch; 1F1B p - s at stage s, however large m is
            assert peaks == ([m] * p if kind == 'gpipe' else [p - s for s in range(p)])
            assert results[0][kind][m]['loss_diff'] <= bound['float32']
            assert results[0][kind][m]['gradient_diff'] <= bound['float32']
            assert sum(r[kind][m]['stages_with_gradients'] for r in results) == 2 * 4 * p
            owners = sorted(i for r in results for i in r[kind][m]['parameters_with_gradients'])
            assert owners == list(range(2 * 4 * p))  # each parameter on exactly one rank
            assert len(results[0][kind][m]['events']) == cfg.pp_steps
            for rank, r in enumerate(results):  # (start, end, pass, stage): rank r runs stage r
                for e in r[kind][m]['events'][0]:
                    assert e[0] <= e[1] and e[2] in 'FB' and e[3] == rank
                # each chunk's CPU time on its thread: at least 0, at most the chunk's span
                cpu = r[kind][m]['cpu'][0]
                assert len(cpu) == len(r[kind][m]['events'][0])
                assert all(0 <= c <= e[1] - e[0] + 1e-3
                           for c, e in zip(cpu, r[kind][m]['events'][0]))
        assert results[0]['float64'][kind]['gradient_diff'] <= bound['float64']
    assert set(results[0]['by_hand']) == set(ms) and results[1]['by_hand'][ms[0]]
    assert all(results[0]['message_s'][m] > 0 and results[0]['schedule_s'][m] > 0 for m in ms)
    inter = launch.run_workers(pipeline_parallel.pp_worker, p, dataclasses.replace(
        cfg, schedules=('interleaved',), virtual_stages=2, microbatches=(4,), extras=False),
        timeout=120, threads_per_rank=THREADS)
    assert inter[0]['interleaved'][4]['gradient_diff'] <= bound['float32']
    for rank, r in enumerate(inter):  # v = 2 stages a rank: r and r + p, each run m times
        stages = [e[3] for e in r['interleaved'][4]['events'][0]]
        assert {s: stages.count(s) for s in stages} == {rank: 2 * 4, rank + p: 2 * 4}


def test_mesh_worker_matches_one_process_and_the_papers_counts():
    dp, tp, hidden, batch = 2, 2, 32, 8
    results = launch.run_workers(tensor_parallel.mesh_worker, dp * tp, MeshConfig(
        mesh_shape=(dp, tp), hidden=hidden, batch_per_rank=batch, timed_steps=1), timeout=180,
        threads_per_rank=THREADS)
    k, psi = dp * tp, results[0]['parameters']
    psi_tp = sum(results[d * tp]['layouts']['fsdp_tp']['local_parameters'] for d in range(dp))
    assert psi / tp < psi_tp < psi / tp + 2 * hidden + zero.DEFAULTS['classes']
    sent = {'ddp': 2 * (k - 1) / k * 4 * psi, 'fsdp': 3 * (k - 1) / k * 4 * psi,
            'fsdp_tp': 3 * (dp - 1) / dp * 4 * psi_tp
            + 2 * (tp - 1) / tp * 4 * batch * tp * (2 * hidden + zero.DEFAULTS['classes'])}
    for r in results:
        layouts = r['layouts']
        for s, expected in sent.items():
            assert layouts[s]['counted_bytes_per_step'] == pytest.approx(expected, rel=0.03), s
        assert layouts['fsdp_tp']['bytes_per_rank'] == pytest.approx(16 * psi_tp / dp, rel=0.03)
        times = layouts['fsdp_tp']['step_times']  # one timed step
        assert len(times) == 1 and times[0] > 0
        wire = layouts['fsdp_tp']['tcp_bytes_per_step']  # gloo's sockets: at least what it counted
        assert wire is None or wire >= 0.9 * layouts['fsdp_tp']['counted_bytes_per_step']
        assert r['equivalence']['float32']['max_diff'] <= 1e-5
        assert r['equivalence']['float64']['max_diff'] <= 1e-12
        assert r['equivalence']['float32']['moved'] > 0


@pytest.mark.parametrize('params, message', [
    ({'num_gpus': 0}, 'num_gpus must be an integer >= 1'),
    ({'num_gpus': 3, 'tp_degree': 4}, 'tp_degree=4 needs 4 processes, but num_gpus=3'),
    ({'num_gpus': 3, 'pp_stages': 4}, 'pp_stages=4 needs 4 processes'),
    ({'num_gpus': 3, 'mesh_shape': [2, 2]}, r'mesh_shape=\(2, 2\) needs 4 processes'),
    ({'mesh_shape': [4]}, 'mesh_shape must be two sizes'),
    ({'mesh_shape': 'two'}, 'mesh_shape=.* is not a list'),
    ({'hidden': 30}, r'hidden=30 does not divide into 4 equal parts: .* tp_degree'),
    ({'num_gpus': 4, 'tp_degree': 2, 'mesh_shape': [1, 3], 'hidden': 64},
     r'hidden=64 does not divide into 3 equal parts: .* mesh_shape'),
    ({'pp_stages': 2, 'microbatches': [1, 4]}, 'each of microbatches must be at least pp_stages=2'),
    ({'microbatches': []}, 'microbatches must be a non-empty list'),
    ({'threads_per_rank': 0}, 'threads_per_rank must be an integer >= 1'),
    ({'microbatches': [0]}, 'each of microbatches must be an integer >= 1'),
    ({'pp_width': 0}, 'pp_width must be an integer >= 1'),
    ({'pp_steps': 0}, 'pp_steps must be an integer >= 1'),
    ({'worker_timeout': 1.5}, 'worker_timeout must be an integer'),
])
def test_notebook_refuses_bad_parameters_and_layouts_by_name(refusal, params, message):
    error = refusal(NOTEBOOK, **params)
    assert error is not None and re.search(message, error), error


def test_notebook_accepts_any_process_count_and_lists_as_text(refusal):
    for k in (1, 2, 3, 5, 8):
        assert refusal(NOTEBOOK, num_gpus=k) is None
    assert refusal(NOTEBOOK, num_gpus=4, mesh_shape='[2, 2]', microbatches='[2, 6]') is None


@pytest.mark.parametrize('name', sorted(hardware.DESCRIBED))
@pytest.mark.parametrize('k', [1, 2, 3, 4, 8])
def test_plan_09_fits_the_described_machines(name, k):
    machine = hardware.DESCRIBED[name]
    plan = plan_09.plan_for(machine, k)
    dp, mesh_tp = plan['mesh_shape']
    t, p, ms = plan['tp_degree'], plan['pp_stages'], plan['microbatches']
    assert t == k and dp * mesh_tp == k and plan['hidden'] % math.lcm(t, mesh_tp) == 0
    assert min(ms) >= p and plan['tp'].tp_seq % t == 0
    assert plan['pp'].pp_batch % math.lcm(*ms) == 0 and plan['pp'].pp_steps == 3
    gpus = machine.gpus if machine.on_gpu else 0
    for lesson, ranks in (('tp', t), ('pp', p), ('mesh', k)):
        cfg = plan[lesson]
        if gpus >= ranks:  # a GPU each: nccl
            assert (cfg.device, cfg.backend) == ('cuda', 'nccl'), lesson
        else:  # ranks share GPUs through gloo, except the pipeline's (gloo's send takes CPU)
            shared = gpus > 0 and lesson != 'pp'
            assert (cfg.device, cfg.backend) == (('cuda' if shared else 'cpu'), 'gloo'), lesson
    if plan['pp'].device == 'cpu':  # a stage computes beside the others only on a core of its own
        assert p == min(k, machine.host_cores)
    assert plan.seconds <= sizing.budget('09', machine) and plan.host_bytes < machine.host_memory
    assert plan.device_bytes <= machine.memory / 2
    idle = [plan['idle_model'][m] for m in ms]
    bubble = [plan['bubble'][m] for m in ms]
    assert all(0 <= b <= i < 1 for b, i in zip(bubble, idle))
    if p >= 2:  # the lesson: the modelled idle share falls as m grows, at the sizes chosen
        assert all(a - b >= 0.01 for a, b in zip(idle, idle[1:])), idle
    if k >= 4 and k % 2 == 0:
        assert (dp, mesh_tp) == (2, k // 2)  # FSDP and TP both at least 2


def test_plan_09_uses_the_gpu_budget_for_cpu_stages_on_a_gpu_machine():
    h100, cpu = hardware.DESCRIBED['h100'], hardware.DESCRIBED['cpu-16core']
    on_gpu, on_cpu = plan_09.plan_for(h100, 4), plan_09.plan_for(cpu, 4)
    assert on_gpu['pp'].device == 'cpu' and on_gpu['limit_s'] > on_cpu['limit_s']
    assert on_gpu['pp_width'] >= on_cpu['pp_width']


def test_plan_09_builds_each_worker_config_from_the_parameters():
    plan = plan_09.plan_for(hardware.DESCRIBED['cpu-2core'], 2, pp_steps=5, pp_width=96,
                            collective_timeout=30, microbatches=[2, 6])
    assert plan['pp'].pp_steps == 5 and plan['pp'].pp_width == 96
    assert plan['pp'].microbatches == (2, 6) and plan['pp'].pp_batch % 6 == 0
    assert {plan[x].collective_timeout for x in ('tp', 'pp', 'mesh')} == {30}
    assert plan['pp'].layers_per_rank == PPConfig.layers_per_rank


def test_pipeline_tolerance_grows_with_depth():
    assert pipeline_parallel.tolerance('float32', 4) == 1e-5  # the floor
    assert pipeline_parallel.tolerance('float32', 16) > 5.0e-6 * 4  # 16 blocks reached 5.0e-6
    assert pipeline_parallel.tolerance('float32', 32) == pytest.approx(
        2 * pipeline_parallel.tolerance('float32', 16))
    assert pipeline_parallel.tolerance('float64', 16) == 1e-12


def test_an_older_torch_is_refused_by_name():
    with pytest.raises(RuntimeError, match=r'torch>=2\.10 .*pipelining.*torch 2\.9\.0'):
        parameters.check_torch(*plan_09.MIN_TORCH, installed='2.9.0')
    assert parameters.check_torch(*plan_09.MIN_TORCH, installed='2.10.1+cu128')


def test_default_run_meets_the_issue(default_run):
    _, r = default_run(NOTEBOOK)
    p, ms = r['pp_stages'], [str(m) for m in r['microbatches']]
    assert r['mesh_shape'] == [2, 2] and r['tp_degree'] == 4
    bound = {'tp_max_diff': (1e-5, 1e-12), 'mesh_max_diff': (1e-5, 1e-12),
             'pp_max_diff': (r['pp_tolerance']['float32'], r['pp_tolerance']['float64'])}
    for key, (float32, float64) in bound.items():
        assert r[key] <= float32 and r[f'{key}_float64'] <= float64, key
    assert set(r['placement']) == {'tp', 'pp', 'mesh'}
    tp = r['tp_bytes_per_step']
    assert tp['model'] > 0 and abs(tp['measured'] - tp['model']) <= 0.03 * tp['model']
    peaks = r['pp_peak_activations']
    for m in ms:
        assert peaks['1f1b'][m] <= peaks['gpipe'][m] and peaks['1f1b'][m] <= p
        assert peaks['gpipe'][m] == int(m)  # GPipe keeps all m; 1F1B does not grow with m
        for kind in ('gpipe', '1f1b'):
            assert 0 <= r['pp_idle_fraction'][kind][m] < 1
    assert len({peaks['1f1b'][m] for m in ms}) == 1
    held = r['mesh_bytes_per_rank']
    assert set(held) == {'ddp', 'fsdp', 'fsdp_tp'}
    assert held['fsdp_tp'] <= 0.3 * held['ddp']  # 16/4 bytes a parameter against 16
    for s, model in r['mesh_bytes_model']['per_step'].items():
        assert abs(r['mesh_bytes_per_step'][s] - model) <= 0.03 * model, s
    assert r['mesh_bytes_per_step']['fsdp_tp'] < r['mesh_bytes_per_step']['fsdp']


def test_notebook_runs_on_three_processes(run_notebook):
    r = run_notebook(NOTEBOOK, num_gpus=3, hidden=48, pp_width=128, pp_steps=1)
    assert r['tp_degree'] == 3 and r['mesh_shape'] == [1, 3]  # no 2-D mesh has 3 ranks
    if r['placement']['pp'][0] == 'cpu':
        assert r['pp_stages'] == min(3, hardware.probe().host_cores)
    assert r['pp_max_diff'] <= r['pp_tolerance']['float32']
    for key in ('tp_max_diff', 'mesh_max_diff'):
        assert r[key] <= 1e-5 and r[f'{key}_float64'] <= 1e-12, key
    assert r['tp_bytes_per_step']['measured'] == pytest.approx(r['tp_bytes_per_step']['model'])
