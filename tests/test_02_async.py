"""Notebook 02 (asynchronous computation): what its default run recorded, its refusals of bad
parameters, its plan for the machines learners use, and its run without TorchScript.

Timings are never compared with fixed numbers. The claims checked are those that hold on any
machine: CPU operators are synchronous, every profiled step is counted once, the futures are
compared with the work they replace, and the notebook runs without TorchScript."""
import os
from pathlib import Path

import pytest
import torch

import hardware
import parameters
import plan_01
import plan_02
import sizing

ON_GPU = torch.cuda.is_available()
NB02 = '02_asynchronous_computation'


def test_02_default_run_measures_the_frontend_and_the_cost_model(default_run):
    _, r = default_run(NB02)
    assert all(0 < r['issue_s'][k] <= r['done_s'][k] for k in ('torch', 'numpy'))
    if not ON_GPU:  # CPU operators are synchronous: issuing takes as long as finishing
        assert r['asynchronous'] is False and r['issue_s']['torch'] > 0.5 * r['done_s']['torch']
        assert r['cpu_returns_same_tensor'] is True, 'b.cpu() is b on a CPU'
        assert r['blocker_pending_s'] == {}
    else:  # the plan sized the loop so that its GPU work is ten times its issue time
        assert r['asynchronous'] is True and r['matrix_size'] >= 1000
    assert len(r['blocker_own_s']) == 8 and all(t > 0 for t in r['blocker_own_s'].values())
    assert r['cost_model_points']['n'] == [2**k for k in range(9)]
    # each loop is timed for at least 10 ms a repeat, so the slopes are well above the noise
    assert all(v['per_step_s'] > 0 for v in r['cost_model_fit'].values()), r['cost_model_fit']
    # t2 is None where a CPU's t1 alone took the whole step: nothing left to estimate
    assert r['t1_s'] > 0 and (r['t2_s'] is None or r['t2_s'] > 0) and r['sync_call_s'] > 0
    # the modes are compared round by round, in turns (the noise rule needs the repeats)
    assert all(len(v) == 5 for v in r['cost_model_rounds_s'].values())
    assert {k: len(v) for k, v in r['queue_rounds_s'].items()} == {'no sync': 30,
                                                                    'sync every step': 30}


def test_02_default_run_finds_the_cpus_asynchrony_and_counts_each_step_once(default_run):
    _, r = default_run(NB02)
    assert 'thread-pool futures' in r['fork_speedup'] and r['pipeline_speedup'] > 0
    assert r['blur_passes'] >= 1 and r['pipeline_ideal_speedup'] >= 1
    assert set(r['pipeline_model_s']) == {'serial', 'prefetched'}
    assert set(r['wait_s']) == {'wait for an event', 'synchronize()'}
    assert all(len(v) == 5 for v in r['wait_rounds_s'].values())
    assert r['trace_steps'] == 5 and Path(r['trace_path']).stat().st_size > 0
    assert len(r['step_ms']) == len(r['step_outside_operators_ms']) == 5


def test_02_futures_are_set_against_the_work_they_replace(default_run):
    """TorchScript's futures against the scripted chain run twice, never against the Python
    loop; the ceiling is the number of chains or cores; pure Python shows the GIL."""
    _, r = default_run(NB02)
    assert r['mechanism'] == 'auto' and r['gil_speedup'] > 0
    assert r['parallel_ceiling'] == min(2, os.cpu_count())
    if 'TorchScript futures' in r['fork_speedup']:
        assert {'scripted, sequential', 'TorchScript futures'} <= set(r['future_s'])
        expected = r['future_s']['scripted, sequential'] / r['future_s']['TorchScript futures']
        assert r['fork_speedup']['TorchScript futures'] == pytest.approx(expected)
    baseline = r['future_s']['one after another'] / r['future_s']['thread-pool futures']
    assert r['fork_speedup']['thread-pool futures'] == pytest.approx(baseline)


def test_02_runs_without_torchscript(run_notebook):
    """mechanism='threads' is the branch a PyTorch without TorchScript takes: Python threads
    only. Small sizes keep it cheap."""
    r = run_notebook(NB02, mechanism='threads', matrix_size=128, num_matmuls=2,
                     queue_lengths=[1, 8], num_batches=2, prep_ms=2, profile_steps=2)
    assert r['mechanism'] == 'threads'
    assert set(r['fork_speedup']) == {'thread-pool futures'}
    assert not {'TorchScript futures', 'scripted, sequential'} & set(r['future_s'])
    assert r['gil_speedup'] > 0 and r['trace_steps'] == 2


@pytest.mark.parametrize('params, message', [
    ({'queue_lengths': [8]}, 'at least 2 distinct lengths'),
    ({'queue_lengths': 'eight'}, 'pass lists to papermill with -y'),
    ({'queue_lengths': [1, 0]}, 'each of queue_lengths must be an integer >= 1'),
    ({'prep_ms': 0}, 'prep_ms must be a number >= 0.1'),
    ({'num_batches': 1}, 'num_batches must be an integer >= 2'),
    ({'matrix_size': 0}, 'matrix_size must be an integer >= 1'),
    ({'small_size': 0}, 'small_size must be an integer >= 1'),
    ({'device': 'cuda:7'}, "device='cuda:7'"),
    ({'mechanism': 'fibers'}, "mechanism must be one of ['auto', 'threads']"),
])
def test_02_refuses_bad_parameters_by_name(refusal, params, message):
    error = refusal(NB02, **params)
    assert error is not None and message in error, error


def test_02_accepts_a_list_as_text(refusal):
    """papermill's `-p queue_lengths [1,4]` delivers the text '[1,4]'."""
    assert refusal(NB02, queue_lengths='[1,4]') is None


def test_setup_02_checks_before_it_probes(monkeypatch):
    monkeypatch.setattr(plan_02, 'probe', lambda: pytest.fail('probed before checking'))
    with pytest.raises(ValueError, match='mechanism'):
        plan_02.setup(mechanism='processes')
    with pytest.raises(ValueError, match='num_batches'):
        plan_02.setup(num_batches=0)
    with pytest.raises(ValueError, match='queue_lengths'):
        plan_02.setup(queue_lengths=[4, 4])
    with pytest.raises(ValueError, match='unknown parameter'):
        plan_02.setup(colour='red')
    assert plan_02.parallel_mechanism('threads')[0] is False


def test_02_refuses_an_older_torch_by_name():
    with pytest.raises(RuntimeError, match=r'needs torch>=2\.9'):
        parameters.check_torch(*plan_02.MIN_TORCH, installed='2.8.0')
    assert plan_02.MIN_TORCH[0] == '2.9'


@pytest.mark.parametrize('machine', sorted(hardware.DESCRIBED))
def test_plan_02_fits_and_lets_the_backend_dominate_on_a_gpu(machine):
    m = hardware.DESCRIBED[machine]
    plan = plan_02.plan_for(m)
    assert plan.seconds <= 0.5 * sizing.budget('02', m), plan
    assert plan.device_bytes <= 0.5 * m.memory and plan.host_bytes <= 0.1 * m.host_memory
    if m.on_gpu:  # the loop's GPU work is ten times its issue time; t2 is four launches
        assert plan['loop_gpu_s'] >= 10 * plan['loop_issue_s'], plan
        assert 2 * plan['small_size']**3 / m.flops >= 4 * plan_01.LAUNCH_S, plan
    else:  # NumPy's and PyTorch's loop keep the book's 1000 on a CPU
        assert plan['matrix_size'] == plan_02.NUMPY_SIZE == 1000
        assert plan['small_size'] == 32
