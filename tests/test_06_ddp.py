"""Notebook 06 and its workers: DDP on real gloo processes (in-process launcher and torchrun),
progress while training, the overlap of communication with backward, bad input, the sizing plan,
the default run's results, and a run with three processes."""
import dataclasses
import json
import re
import socket
import subprocess
import sys

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import ddp_train
import hardware
import helpers as d2l
import launch
import overlap
import parameters
import plan_06
import sizing
import stats
from conftest import NOTEBOOKS

TINY = {'batch_size': 8, 'num_train': 16, 'num_test': 8, 'data_source': 'synthetic', 'width': 8}
NB = '06_multi_gpu_concise'


# ----------------------------------------------------------------------------- the workers
def test_two_gloo_processes_report_progress_and_end_with_identical_parameters():
    train, test = d2l.fashion_mnist_datasets('synthetic', num_train=24, num_test=8)
    config = {**TINY, 'num_epochs': 2, 'data': ddp_train.arrays(train, test)}  # not TINY's 16
    reports = []
    results = launch.run_workers(ddp_train.train, 2, config, timeout=120,
                              on_progress=lambda rank, m: reports.append((rank, m)))
    assert [r['rank'] for r in results] == [0, 1]
    assert {r['backend'] for r in results} == {'gloo'}
    assert results[0]['param_digest'] == results[1]['param_digest']
    assert all(r['max_param_diff'] == 0 for r in results)
    # 12 of the 24 examples given per rank, in batches of 4: 3 steps an epoch
    assert all(r['steps'] == 6 and r['per_rank_batch'] == 4 for r in results)
    # rank 0 reported each epoch while training, over both ranks' examples
    assert [(rank, m['epoch']) for rank, m in reports] == [(0, 1), (0, 2)]
    assert all(0 <= m['train_acc'] <= 1 and m['train_loss'] > 0 for _, m in reports)
    assert results[0]['history'] == [m for _, m in reports]
    assert results[0]['test_accuracy'] == reports[-1][1]['test_acc'] and \
        results[1]['test_accuracy'] is None
    # DDP broadcasts rank 0's buffers at each forward: equal then, one update apart after it
    assert all(r['max_buffer_diff_at_last_forward'] == 0 for r in results)
    assert results[0]['max_buffer_diff'] > 0


def test_standalone_script_under_torchrun_prints_progress_lines_then_the_result():
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2',
           f'--master_port={launch.free_port()}', str(NOTEBOOKS / 'ddp_train.py'),
           '--batch-size', '8', '--num-train', '16', '--num-test', '8', '--width', '8',
           '--epochs', '2', '--data-source', 'synthetic']
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=NOTEBOOKS)
    assert done.returncode == 0, done.stderr[-3000:]
    progress = [json.loads(line)['progress'] for line in done.stdout.splitlines()
                if line.startswith('{"progress"')]
    assert [p['epoch'] for p in progress] == [1, 2]   # one line per epoch, from rank 0 only
    result = json.loads(done.stdout[done.stdout.index('{\n'):])
    assert result['world_size'] == 2 and result['max_param_diff'] == 0 and result['steps'] == 4
    assert result['width'] == 8 and result['history'] == progress


def test_standalone_script_refuses_to_run_without_torchrun():
    done = subprocess.run([sys.executable, str(NOTEBOOKS / 'ddp_train.py')], capture_output=True,
                          text=True, timeout=60, cwd=NOTEBOOKS)
    assert done.returncode == 2 and 'torchrun' in done.stderr


@pytest.mark.parametrize('config, world_size, message', [
    ({'batch_size': 7}, 2, 'batch_size=7 does not split evenly over 2 processes'),
    ({'num_train': 4, 'batch_size': 8}, 2, 'num_train=4 is smaller than one batch'),
    ({'num_epochs': 0}, 1, 'num_epochs must be'),
    ({'width': 0}, 1, 'width must be'),
    ({'lr': -1}, 1, 'lr must be a positive number'),
    ({'data': [1, 2]}, 1, 'data must be'),
    ({'lr_schedule': 'cosine'}, 1, 'unknown setting'),
    ({}, 0, 'world_size'),
])
def test_bad_configs_are_refused_before_any_process_starts(config, world_size, message):
    with pytest.raises(ValueError, match=message):
        ddp_train.check_config(config, world_size)


# ------------------------------------------------------------------- overlap with backward
def test_buckets_follow_reverse_parameter_order_and_respect_the_cap():
    params = [torch.zeros(n) for n in (10, 300, 20, 5, 400)]   # 40, 1200, 80, 20, 1600 bytes
    buckets = overlap.buckets_by_bytes(params, cap_bytes=1300)
    assert [[p.numel() for p in b] for b in buckets] == [[400], [5, 20, 300], [10]]


def test_bucketed_all_reduce_equals_one_all_reduce_after_backward_and_ddp():
    config = {'width': 8, 'batch': 2, 'bucket_mb': 0.05, 'repeats': 2, 'passes': 2,
              'allreduce_numels': {'a': 1000}}
    results = launch.run_workers(overlap.overlap_worker, 2, config, timeout=120)
    for r in results:
        assert r['buckets'] > 2 and r['bucketed_equals_after'] and r['ddp_max_diff'] == 0
        assert set(r['allreduce_s']) == {'a'}
        # every timing keeps its rounds; the reference is backward + all-reduce, round by round
        assert set(r['times']) == set(overlap.TIMINGS)
        assert all(len(t) == 2 and min(t) > 0 for t in r['times'].values())
        assert r['times']['sequential_s'] == [b + a for b, a in zip(
            r['times']['backward_s'], r['times']['allreduce_alone_s'])]
        assert all(r[k] == stats.median(t) for k, t in r['times'].items())
    assert results[0]['times'] == results[1]['times']   # each round is the slower rank's time


def test_bucket_sweep_times_each_cap_beside_the_reference():
    config = {'width': 8, 'batch': 2, 'caps_mb': [0.01, 0.1, 1024], 'repeats': 1,
              'passes': 1}
    r = launch.run_workers(overlap.bucket_sweep, 2, config, timeout=120)[0]
    counts = [r['buckets'][cap] for cap in config['caps_mb']]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[1] and counts[-1] == 1
    assert set(r['times']) == {*config['caps_mb'], 'backward_s', 'allreduce_alone_s',
                               'after_s', 'sequential_s'}
    assert all(len(t) == 1 and t[0] > 0 and r[k] == t[0] for k, t in r['times'].items())
    # a tiny all-reduce alone: the fixed cost that each extra bucket adds at least
    assert r['small_allreduce_bytes'] == overlap.SMALL_MESSAGE_BYTES
    assert r['small_allreduce_s'] > 0


def test_overlap_chart_draws_every_timing_and_both_references():
    times = {k: [0.010 * (i + 1), 0.012 * (i + 1)] for i, k in enumerate(overlap.TIMINGS)}
    times['sequential_s'] = [b + a for b, a in zip(times['backward_s'],
                                                   times['allreduce_alone_s'])]
    ov = {'times': times, **{k: stats.median(t) for k, t in times.items()}}
    fig = overlap.plot_overlap(ov)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [overlap.TIMINGS[k] for k in overlap.BAR_COLORS]
    assert 'backward + all-reduce, each alone' in labels
    assert len(ax.patches) == len(labels) + 1   # one bar stacks backward and the all-reduce
    lines = {line.get_linestyle(): round(line.get_xdata()[0], 6) for line in ax.get_lines()
             if line.get_linestyle() in (':', '-.', '--')}
    # no overlap without the copies, no overlap with them, and perfect overlap: the device
    # still runs backward and the copies, the link the all-reduce
    perfect = max(ov['backward_s'] + ov['copy_s'], ov['allreduce_alone_s'])
    assert lines == {':': round(1e3 * ov['sequential_s'], 6),
                     '-.': round(1e3 * ov['after_s'], 6), '--': round(1e3 * perfect, 6)}
    assert overlap.perfect_overlap_s(ov) == perfect


def test_timing_rows_set_each_timing_beside_the_reference_round_by_round():
    times = {'after_s': [0.040, 0.050, 0.040], 'fast': [0.030, 0.040, 0.020],
             'close': [0.041, 0.043, 0.045]}
    result = {'times': times, **{k: stats.median(t) for k, t in times.items()}}
    rows = overlap.timing_rows(result, {'fast': 'fast', 'close': 'close', 'after_s': 'ref'},
                               reference='after_s')
    assert rows['fast']['time / reference'] == pytest.approx(0.75)   # 0.75, 0.8, 0.5
    assert rows['fast']['range over rounds'] == '0.50\u20130.80'
    assert rows['ref']['time / reference'] == 1 and rows['ref']['range over rounds'] == \
        '1.00\u20131.00'
    assert set(rows['fast']) == {'time / reference', 'range over rounds'}   # one way to read
    alone = overlap.timing_rows(result, {'fast': 'fast'})['fast']
    assert alone == {'median': 0.030, 'fastest': 0.020, 'slowest': 0.040}
    ratios = overlap.round_ratios(result, 'fast', 'after_s')   # paired: judged by compare_paired
    assert ratios == pytest.approx([0.040 / 0.030, 0.050 / 0.040, 0.040 / 0.020])
    assert stats.compare_paired(ratios, 'fast', 'ref').a_is_better


def test_plain_module_and_one_process_ddp_are_timed_in_turns():
    times = launch.run_workers(ddp_train.plain_against_ddp, 1, ddp_train.Config(**TINY), 2, 2,
                               timeout=120)[0]
    assert set(times) == {'plain', 'ddp'}
    assert all(len(t) == 2 and min(t) > 0 for t in times.values())


@pytest.mark.parametrize('config, message', [
    ({'width': 0}, 'width must be'), ({'bucket_mb': 0}, 'bucket_mb must be'),
    ({'passes': 0}, 'passes must be'),
    ({'allreduce_numels': {'x': 0}}, "allreduce_numels\\['x'\\] must be"),
    ({'buckets': 3}, 'unknown setting'),
])
def test_overlap_refuses_bad_settings(config, message):
    with pytest.raises(ValueError, match=message):
        overlap.check_config(config)


@pytest.mark.parametrize('config, message', [
    ({'caps_mb': [1, 0]}, 'each of caps_mb must be'), ({'repeats': 0}, 'repeats must be'),
    ({'bucket_mb': 4}, 'unknown setting'),
])
def test_bucket_sweep_refuses_bad_settings(config, message):
    with pytest.raises(ValueError, match=message):
        overlap.check_config(config, overlap.SweepConfig)


# -------------------------------------------------------------------------------- sizing
@pytest.mark.parametrize('width', [8, 64])
def test_resnet18_cost_constants_match_a_flop_count(width):
    with torch.device('meta'):
        net = d2l.resnet18(10, width=width)
        X = torch.empty(1, 1, 28, 28)
    with FlopCounterMode(display=False) as counter:
        net(X).sum().backward()
    flops, params = plan_06.resnet18_size_06(width)
    assert counter.get_total_flops() == pytest.approx(flops, rel=0.02)
    assert sum(p.numel() for p in net.parameters()) == pytest.approx(params, rel=0.02)


@pytest.mark.parametrize('machine', ['colab-t4', 'h100'])
@pytest.mark.parametrize('counts', [(1, 2), (1, 3), (1, 8)])
def test_gpu_plans_keep_the_book_network_and_fit_the_budget(machine, counts):
    m = hardware.DESCRIBED[machine]
    plan = plan_06.plan_for(m, num_gpus=max(counts), device_counts=counts)
    assert plan['width'] == 64 and plan['batch_size'] == 256   # the book's network and batch
    assert plan.seconds <= sizing.budget('06', m)             # about 5 minutes
    assert plan.device_bytes <= m.memory and plan.host_bytes <= m.host_memory
    assert plan['num_train'] >= 3000 and plan['num_epochs'] >= 2   # a median after the first


def test_gpu_plan_shrinks_on_a_t4_and_scales_the_timeout_with_the_work():
    t4 = hardware.DESCRIBED['colab-t4']
    planned = plan_06.plan_for(t4)
    assert planned['num_epochs'] * planned['num_train'] < 10 * 60000   # not the book's scale
    book = plan_06.plan_for(t4, num_epochs=10, num_train=60000, num_test=10000)
    assert book.seconds > 5 * planned.seconds                          # 10 epochs take long
    assert book['worker_timeout'] - 300 > 5 * (planned['worker_timeout'] - 300)
    assert book.seconds > 0.8 * sizing.budget('06', t4) and book['num_epochs'] == 10
    assert planned['worker_timeout'] > planned.seconds / 3            # room for one run


def test_h100_plan_runs_more_of_the_book_than_a_t4():
    t4, h100 = (plan_06.plan_for(hardware.DESCRIBED[m]) for m in ('colab-t4', 'h100'))
    assert (h100['num_epochs'] * h100['num_train'] > t4['num_epochs'] * t4['num_train'])
    eight = dataclasses.replace(hardware.DESCRIBED['h100'], gpus=8)   # nccl, a GPU per process
    plan = plan_06.plan_for(eight, num_gpus=8, device_counts=(1, 8))
    assert plan['num_epochs'] * plan['num_train'] >= h100['num_epochs'] * h100['num_train']


def test_mixed_gpus_are_planned_by_the_slowest_gpu_each_run_uses():
    """An H100 beside a T4: a run on GPU 0 alone is planned at the H100's rate, a run on both
    at the T4's, and the timeout covers the T4-paced run (issue 19, 3.1)."""
    h100, t4 = hardware.DESCRIBED['h100'], hardware.DESCRIBED['colab-t4']
    mixed = dataclasses.replace(h100, name='H100 + T4', gpus=2, flops=t4.flops,
                                gpu_flops=(h100.flops, t4.flops))
    two_h100 = dataclasses.replace(mixed, flops=h100.flops, gpu_flops=(h100.flops,) * 2)
    two_t4 = dataclasses.replace(mixed, gpu_flops=(t4.flops,) * 2)
    alone = [plan_06.plan_for(m, num_gpus=2, device_counts=(1,)) for m in (mixed, two_h100)]
    assert alone[0].values == alone[1].values and alone[0].seconds == alone[1].seconds
    sizes = {'num_epochs': 1, 'num_train': 60000, 'num_test': 10000}
    both = plan_06.plan_for(mixed, num_gpus=2, device_counts=(1, 2), **sizes)
    assert both['worker_timeout'] > plan_06.plan_for(two_h100, num_gpus=2, device_counts=(1, 2),
                                                   **sizes)['worker_timeout']
    # k=1 runs on the H100; k=2 is paced by the T4, as on two T4s, and sets the timeout
    assert both['worker_timeout'] == plan_06.plan_for(two_t4, num_gpus=2, device_counts=(2,),
                                                    **sizes)['worker_timeout']
    planned = plan_06.plan_for(mixed, num_gpus=2, device_counts=(1, 2))
    assert planned.seconds <= sizing.budget('06', mixed)
    assert planned['num_epochs'] * planned['num_train'] < (
        lambda p: p['num_epochs'] * p['num_train'])(plan_06.plan_for(two_h100, num_gpus=2))


def test_setup_rounds_the_batch_for_every_process_count_and_says_where_ddp_runs():
    cfg = plan_06.setup(num_gpus=3, num_epochs=1, num_train=144, num_test=64)
    assert cfg.batch_size == 36 and cfg.process_counts == [1, 2, 3]   # 32 rounded up
    assert cfg.device_counts == [1, 3] and cfg.steps == 4
    # every worker's settings are the dataclass the plan built: no renamed keys, one default
    assert cfg.ddp_config == ddp_train.Config(batch_size=36, lr=0.1, num_epochs=1, num_train=144,
                                              num_test=64, width=cfg.width)
    assert cfg.overlap_config.repeats == cfg.sweep_config.repeats == overlap.REPEATS
    assert cfg.overlap_config.passes == overlap.PASSES
    assert cfg.sweep_config.passes == overlap.SWEEP_PASSES
    assert cfg.threads_per_rank is None and 'GPUs found' in str(cfg)


def test_cpu_plan_narrows_the_network_to_fit_the_budget():
    cpu = hardware.DESCRIBED['cpu-2core']
    plan = plan_06.plan_for(cpu)
    assert plan['width'] < 64 and plan.seconds <= 0.8 * sizing.budget('06', cpu)
    assert plan['num_epochs'] * plan['num_train'] // plan['batch_size'] >= 96   # steps to learn
    faster = dataclasses.replace(cpu, flops=8 * cpu.flops, host_flops=8 * cpu.host_flops)
    assert plan_06.plan_for(faster)['width'] > plan['width']
    shorter = plan_06.plan_for(cpu, num_epochs=1)   # fewer steps given: the same network
    assert shorter['width'] == plan['width'] and shorter['num_epochs'] == 1
    assert shorter['worker_timeout'] < plan['worker_timeout']


@pytest.mark.parametrize('name', sorted(hardware.DESCRIBED))
def test_every_described_machine_is_planned_within_its_budget(name):
    """CI's 2 cores, a 16-core CPU, a Colab T4, one H100, 8 H100s: the whole notebook fits the
    budget (on a GPU machine, exercise 2's CPU steps included), its memory fits, a GPU keeps
    the book's network and a CPU takes the steps its network needs to learn."""
    m = hardware.DESCRIBED[name]
    plan = plan_06.plan_for(m)   # 0.8 of it: headroom, as estimates are rough
    assert plan.seconds <= 0.8 * sizing.budget('06', m)
    assert plan.device_bytes <= m.memory and plan.host_bytes <= m.host_memory
    if m.on_gpu:
        assert (plan['width'], plan['batch_size']) == (64, 256)
        assert plan_06.host_exercise_s(m, 64) < plan.seconds / 4
    else:
        assert plan['num_epochs'] * plan['num_train'] // plan['batch_size'] >= 150
    assert plan['num_epochs'] >= 2   # every epoch time is the median of those after the first
    assert plan['machinery_steps'] >= plan_06.MACHINERY_STEPS_06[0]
    # generous: a slow but correct run (a busy VM, nbmake, JupyterLab) must not be stopped
    longest = max(plan_06.run_s(m, plan.values, k) for k in (1, 2))
    assert plan['worker_timeout'] >= max(300, 10 * longest)


def test_an_older_torch_and_an_unknown_parameter_are_refused_by_name(monkeypatch):
    with pytest.raises(RuntimeError, match=r'torch>=2\.9 .*this Python has torch 2\.8\.0'):
        parameters.check_torch(*plan_06.MIN_TORCH, installed='2.8.0')
    monkeypatch.setattr(torch, '__version__', '2.8.0')
    with pytest.raises(RuntimeError, match='needs torch>=2.9'):
        plan_06.setup()
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['widht'\]"):
        plan_06.setup(widht=8)


# ------------------------------------------------------------------------------ notebook
@pytest.mark.parametrize('params, message', [
    ({'batch_size': 33}, 'batch_size=33 does not split evenly over 2 processes'),
    ({'num_gpus': 3, 'batch_size': 33}, r'over 2 processes \(runs here use \[1, 2, 3\]\)'),
    ({'num_gpus': 4, 'batch_size': 2}, r'batch_size=2 does not split evenly over 4 processes '
                                       r'\(runs here use \[1, 2, 4\]\)'),
    ({'num_gpus': 0}, 'num_gpus must be'),
    ({'device_counts': 'one'}, 'device_counts'),
    ({'device_counts': []}, 'device_counts must be a non-empty list'),
    ({'threads_per_rank': 0}, 'threads_per_rank must be'),
    ({'width': 0}, 'width must be'),
    ({'worker_timeout': 0}, 'worker_timeout must be'),
    ({'lr': 0}, 'lr must be'),
    ({'num_train': 8}, 'num_train=8 is smaller than one batch'),
    ({'data_source': 'imagenet'}, 'data_source must be one of'),
])
def test_06_refuses_bad_input_before_training(refusal, params, message):
    error = refusal(NB, **params)
    assert error is not None and re.search(message, error), error


def test_06_refuses_a_busy_port(refusal):
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        s.listen()
        port = s.getsockname()[1]
        assert f'master_port={port} is busy' in refusal(NB, master_port=port)


def test_06_default_run_learns_and_records_its_measurements(default_run):
    _, results = default_run(NB)
    on_cpu = results['gpus_found'] == 0
    assert results['width'] == results['plan']['width']   # what the plan chose for this machine
    if on_cpu:   # the network learns on the synthetic stand-in (chance: 0.1)
        assert results['dataparallel']['1']['test_accuracy'] >= 0.6
        assert results['ddp']['1']['test_accuracy'] >= 0.6
        assert results['ddp']['2']['test_accuracy'] >= 0.6
    for run in results['ddp'].values():
        assert run['max_param_diff'] == 0 and run['max_buffer_diff_at_last_forward'] == 0
        assert [h['epoch'] for h in run['history']] == list(range(1, results['num_epochs'] + 1))
    assert results['ddp']['2']['max_buffer_diff'] > 0   # one step's update apart
    assert results['processes_left_after_crash'] == 0
    ob = results['overlap_backward']
    assert ob['bucketed_equals_after'] and ob['buckets'] > 1
    assert min(ob['backward_s'], ob['after_s'], ob['bucketed_s'], ob['ddp_s']) > 0
    # the reference: backward and the all-reduce, each measured alone, added round by round
    rounds = zip(ob['times']['backward_s'], ob['times']['allreduce_alone_s'],
                 ob['times']['sequential_s'])
    assert all(s == pytest.approx(b + a) for b, a, s in rounds)
    # perfect overlap: backward and the copies on the device, the all-reduce on the link
    assert ob['perfect_overlap_s'] == pytest.approx(max(ob['backward_s'] + ob['copy_s'],
                                                        ob['allreduce_alone_s']))
    assert ob['perfect_overlap_s'] < ob['sequential_s'] + ob['copy_s']
    # exercise 1: one step is linear in the learning rate (k times it, k times as far)
    steps_b, one_step, scaled = results['lr_scaling'].values()
    assert scaled['moved'] == pytest.approx(4 * one_step['moved'], rel=1e-3)
    assert steps_b['loss before'] == one_step['loss before'] == scaled['loss before']
    # exercise 3: fewer examples per rank, local BatchNorm means further from the batch's
    per_rank = sorted(results['sync_batchnorm'].values(), key=lambda r: -r['per rank'])
    assert per_rank[-1]['local mean off (std)'] > per_rank[0]['local mean off (std)']
    # exercise 4: larger caps, fewer buckets, down to one
    counts = list(results['bucket_sweep']['buckets'].values())
    assert counts == sorted(counts, reverse=True) and counts[-1] == 1
    per_byte = results['flops_per_gradient_byte']
    assert per_byte['Inception-style'] > per_byte['ResNet-18'] > per_byte['AlexNet-style'] > 0


def test_three_gloo_processes_split_the_batch_the_plan_rounded_for_them():
    """What the notebook runs at num_gpus=3, without the notebook: the plan rounds the batch
    to 36 for 1, 2 and 3 processes, and DDP on three processes splits it into 12 a rank and
    ends with identical parameters."""
    cfg = plan_06.setup(num_gpus=3, num_epochs=1, num_train=144, num_test=64)
    train, test = d2l.fashion_mnist_datasets('synthetic', num_train=144, num_test=64)
    config = dataclasses.replace(cfg.ddp_config, data=ddp_train.arrays(train, test))
    results = launch.run_workers(ddp_train.train, 3, config, timeout=180)
    assert [r['rank'] for r in results] == [0, 1, 2]
    assert all(r['per_rank_batch'] == 12 and r['steps'] == 4 for r in results)
    assert len({r['param_digest'] for r in results}) == 1
    assert all(r['max_param_diff'] == 0 for r in results)


