"""Notebooks 02 and 03: what their default runs recorded, their refusals of bad parameters,
their plans for the machines learners use, and the GPU helpers they share.

Timings are never compared with fixed numbers. The claims checked are those that hold on any
machine: CPU operators are synchronous, every profiled step is counted once, and an overlapped
copy takes between the larger of its parts and their sum, with a copy worth overlapping."""
from pathlib import Path

import pytest
import torch

import helpers as d2l
import sizing

ON_GPU = torch.cuda.is_available()
NB02, NB03 = '02_asynchronous_computation', '03_automatic_parallelism'


# ------------------------------------------------------------------------------ notebook 02
def test_02_default_run_measures_the_frontend_and_the_cost_model(default_run):
    _, r = default_run(NB02)
    assert all(0 < r['issue_s'][k] <= r['done_s'][k] for k in ('torch', 'numpy'))
    if not ON_GPU:  # CPU operators are synchronous: issuing takes as long as finishing
        assert r['asynchronous'] is False and r['issue_s']['torch'] > 0.5 * r['done_s']['torch']
        assert r['cpu_returns_same_tensor'] is True, 'b.cpu() is b on a CPU'
        assert r['blocker_pending_s'] == {}
    assert len(r['blocker_own_s']) == 8 and all(t > 0 for t in r['blocker_own_s'].values())
    assert r['cost_model_points']['n'] == [2**k for k in range(9)]
    # each loop is timed for at least 10 ms a repeat, so the slopes are well above the noise
    assert all(v['per_step_s'] > 0 for v in r['cost_model_fit'].values()), r['cost_model_fit']
    assert r['t1_s'] > 0 and r['t2_s'] >= 0


def test_02_default_run_finds_the_cpus_asynchrony_and_counts_each_step_once(default_run):
    _, r = default_run(NB02)
    assert 'thread-pool futures' in r['fork_speedup'] and r['pipeline_speedup'] > 0
    assert r['blur_passes'] >= 1 and r['pipeline_ideal_speedup'] >= 1
    assert set(r['wait_s']) == {'wait for an event', 'synchronize()'}
    assert r['trace_steps'] == 5 and Path(r['trace_path']).stat().st_size > 0


@pytest.mark.parametrize('params, message', [
    ({'queue_lengths': [8]}, 'needs at least two different loop lengths'),
    ({'queue_lengths': 'eight'}, 'pass lists to papermill with -y'),
    ({'queue_lengths': [1, 0]}, 'each of queue_lengths must be an integer >= 1'),
    ({'prep_ms': 0}, 'prep_ms must be a positive number'),
    ({'small_size': 0}, 'small_size must be an integer >= 1'),
    ({'device': 'cuda:7'}, "device='cuda:7'"),
])
def test_02_refuses_bad_parameters_by_name(refusal, params, message):
    error = refusal(NB02, **params)
    assert error is not None and message in error, error


def test_02_accepts_a_list_as_text(refusal):
    """papermill's `-p queue_lengths [1,4]` delivers the text '[1,4]'."""
    assert refusal(NB02, queue_lengths='[1,4]') is None


@pytest.mark.parametrize('machine', ['colab-t4', 'h100', 'cpu-2core'])
def test_plan_02_fits_and_lets_the_backend_dominate_on_a_gpu(machine):
    m = sizing.DESCRIBED[machine]
    plan = sizing.plan_02(m)
    assert plan.seconds <= 0.5 * sizing.budget('02', m), plan
    assert plan.device_bytes <= 0.5 * m.memory and plan.host_bytes <= 0.1 * m.host_memory
    if m.on_gpu:  # the product takes at least four launches' time, so t2 > t1
        assert 2 * plan['small_size']**3 / m.flops >= 4 * sizing.LAUNCH_S, plan
    else:
        assert plan['small_size'] == 32


# ------------------------------------------------------------------------------ notebook 03
def test_03_default_run_overlaps_a_copy_worth_overlapping(default_run):
    _, r = default_run(NB03)
    t = r['overlap_s']
    compute, copy, overlapped = t['compute'], t['copy'], t[r['overlapped_variant']]
    assert copy >= compute / 3, f'the copy must be at least a third of the compute: {t}'
    assert 0.95 * max(compute, copy) <= overlapped <= compute + copy, t
    assert r['overlap_within_bounds'] is True
    expected = 'copy on a second stream' if ON_GPU else 'copy in a second thread'
    assert r['overlapped_variant'] == expected
    assert r['pinned_memory_available'] is ON_GPU
    assert (r['book_non_blocking'] != {}) is ON_GPU, 'the book\'s call is timed on a GPU only'
    assert 1 <= r['copy_inner_dim'] <= r['copy_size']
    assert 0 <= r['profiled_copy_overlap_share'] <= 1


def test_03_default_run_measures_lanes_and_exercises(default_run):
    _, r = default_run(NB03)
    expected = 'two GPUs' if torch.cuda.device_count() > 1 else (
        'one GPU and the CPU' if ON_GPU else 'two CPU threads')
    assert r['scenario'] == expected and len(r['alone_s']) == 2
    assert r['parallel_speedup'] > 0 and r['ideal_speedup'] >= 1
    assert (r['all_cores_sequential_s'] is not None) is (expected == 'two CPU threads')
    assert len(r['per_product_s']) == 4 and r['run_vs_sequential_products'] > 0
    assert set(r['small_ops_s']) >= {'one thread', 'two threads'}
    assert set(r['three_stages_s']) == {'one stage after the other', 'pipelined'}
    assert r['diamond_s']['parallel'] > 0 and r['diamond_s']['sequential'] > 0


@pytest.mark.parametrize('params, message', [
    ({'num_matmuls': 0}, 'num_matmuls must be an integer >= 1'),
    ({'matrix_size': -4}, 'matrix_size must be an integer >= 1'),
    ({'copy_size': 64, 'copy_inner_dim': 128}, 'copy_inner_dim=128 is larger than copy_size=64'),
    ({'copy_size': 60000, 'copy_steps': 50}, 'copy_steps=50 results of copy_size=60000 need'),
])
def test_03_refuses_bad_parameters_by_name(refusal, params, message):
    error = refusal(NB03, **params)
    assert error is not None and message in error, error


def test_plan_03_on_a_t4_fits_colabs_host_and_balances_the_lanes():
    """At the book's 4000 a CPU lane would take 20-30 minutes on Colab's two cores, and 50
    pinned results of 64 MB, twice, would crowd its 12.7 GB of host memory."""
    m = sizing.DESCRIBED['colab-t4']
    plan = sizing.plan_03(m)
    assert plan['matrix_size'] == sizing.BOOK_03_SIZE, 'the GPU lane keeps the book\'s size'
    gpu_run = 50 * 2 * plan['matrix_size']**3 / m.flops
    cpu_run = 50 * 2 * plan['cpu_matrix_size']**3 / m.host_flops
    assert 0.5 < cpu_run / gpu_run < 2, (cpu_run, gpu_run)
    assert plan['copy_steps'] < 50 and plan.host_bytes <= 0.35 * m.host_memory, plan
    assert plan.device_bytes <= 0.8 * m.memory and plan.seconds <= 0.5 * sizing.budget('03', m)


def test_plan_03_keeps_the_books_scale_on_an_h100_and_fits_a_cpu():
    h100 = sizing.DESCRIBED['h100']
    plan = sizing.plan_03(h100)
    assert plan['matrix_size'] == 4000 and plan['copy_steps'] == 50, plan
    assert plan.host_bytes <= 0.35 * h100.host_memory and plan.device_bytes <= h100.memory
    cpu = sizing.DESCRIBED['cpu-2core']
    plan = sizing.plan_03(cpu)
    assert plan.seconds <= 0.5 * sizing.budget('03', cpu), plan
    assert plan['matrix_size'] <= 768 and plan['copy_steps'] == 50
    slow = sizing.Machine('slow CPU', 'cpu', flops=2e10, memory=cpu.memory, host_flops=2e10,
                          host_memory=cpu.host_memory, host_cores=2)
    assert sizing.plan_03(slow)['matrix_size'] < plan['matrix_size'], 'a slower CPU gets less'


# ------------------------------------------------------------------- the shared GPU helpers
def test_device_timer_times_the_block_on_a_cpu():
    with d2l.device_timer('cpu') as t:
        torch.randn(256, 256) @ torch.randn(256, 256)
    assert 0 < t['seconds'] < 5


def test_pinned_buffers_say_why_not_and_leave_nothing(monkeypatch):
    if not ON_GPU:
        buffers, why = d2l.pinned_buffers(2, (4, 4))
        assert buffers is None and 'no CUDA device' in why
    made = []

    def refuse_the_third(*args, **kwargs):
        if len(made) == 2:
            raise RuntimeError('CUDA error: out of memory\nmore detail')
        made.append(torch.zeros(*args[:1]))
        return made[-1]
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch, 'empty', refuse_the_third)
    buffers, why = d2l.pinned_buffers(4, (4, 4))
    assert buffers is None and why == 'pin_memory failed: CUDA error: out of memory'
    with pytest.raises(ValueError, match='count'):
        d2l.pinned_buffers(0, (4, 4))


def test_peak_memory_is_none_on_a_cpu_and_try_script_gives_reasons():
    with d2l.peak_memory('cpu') as peak:
        torch.zeros(1000)
    assert peak['bytes'] is None

    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2
    scripted, why = d2l.try_script(double)
    assert why is None and torch.equal(scripted(torch.ones(2)), torch.full((2,), 2.0))

    def unscriptable(x):
        return {frozenset([1]): x}  # TorchScript has no frozenset
    scripted, why = d2l.try_script(unscriptable)
    assert scripted is None and why.startswith('torch.jit.script failed')
