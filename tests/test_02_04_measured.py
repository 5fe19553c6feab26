"""Notebooks 02-04 with small parameters: structural assertions on what they recorded.

Timings are never compared with fixed numbers: the claims checked are the ones that hold on any
machine (results consistent, overlap below the sum of its parts on a GPU, cache levels visible,
throughput positive and below the stated peak)."""
from pathlib import Path

import papermill
import pytest
import torch

ON_GPU = torch.cuda.is_available()


def test_02_records_its_measurements_and_a_complete_trace(run_notebook, tmp_path):
    r = run_notebook('02_asynchronous_computation', matrix_size=256, num_matmuls=4,
                     queue_lengths=[1, 4, 16], num_batches=4, prep_ms=5, profile_steps=3,
                     trace_dir=str(tmp_path / 'traces'))
    assert r['trace_steps'] == 3 and Path(r['trace_path']).stat().st_size > 0
    assert all(0 < r['issue_s'][k] <= r['done_s'][k] for k in ('torch', 'numpy'))
    if not ON_GPU:  # CPU operators are synchronous: issuing takes as long as finishing
        assert r['asynchronous'] is False
        assert r['issue_s']['torch'] > 0.5 * r['done_s']['torch']
    assert len(r['blocker_s']) == 8 and all(t > 0 for t in r['blocker_s'].values())
    assert all(v['per_step_s'] > 0 for v in r['cost_model_fit'].values())
    assert r['cost_model_points']['n'] == [1, 4, 16]
    assert r['fork_speedup'] > 0 and r['pipeline_speedup'] > 0


def test_03_overlap_and_parallel_runs_are_consistent(run_notebook):
    r = run_notebook('03_automatic_parallelism', matrix_size=128, num_matmuls=10)
    expected = 'two GPUs' if torch.cuda.device_count() > 1 else (
        'the CPU and one GPU' if ON_GPU else 'two CPU threads')
    assert r['scenario'] == expected and len(r['alone_s']) == 2
    assert r['parallel_speedup'] > 0 and r['ideal_speedup'] >= 1
    parts = r['overlap_s']['compute'] + r['overlap_s']['copy']
    if ON_GPU:  # the chapter's claim, with pinned memory and a second stream
        assert r['overlap_s']['pinned, second stream'] < parts
    else:
        assert r['overlapped_variant'] == 'copy thread' and r['pinned_memory_available'] is False
    assert all(t > 0 for t in r['overlap_s'].values())
    assert r['diamond_s']['parallel'] > 0 and r['run_vs_sequential_products'] > 0


def test_04_throughput_is_below_the_stated_peak_and_caches_show(run_notebook):
    r = run_notebook('04_hardware', matmul_size=512, bandwidth_mb=64, max_working_set_mb=256,
                     repeats=2)
    for name, m in r['matmul'].items():
        assert m['gflops'] > 0, name
        if m['peak_gflops'] is not None:
            assert m['gflops'] < m['peak_gflops'], (name, m)
    for where, bw in r['memory'].items():
        assert bw['copy_gbs'] > 0 and bw['read_gbs'] > 0
        if bw['peak_gbs'] is not None:
            assert max(bw['copy_gbs'], bw['read_gbs']) < bw['peak_gbs'], (where, bw)
    assert r['cache_steps_seq'] or r['cache_steps_rand'], 'more than one memory level'
    v = r['vectorisation_gflops']
    assert v['one matmul'] > v['Python loops'] > 0
    assert set(r['latency_s']) >= {'L1 cache reference', 'Main memory reference'}


@pytest.mark.parametrize('name, params, culprit', [
    ('02_asynchronous_computation', {'queue_lengths': [8]}, 'queue_lengths'),
    ('03_automatic_parallelism', {'num_matmuls': 0}, 'num_matmuls'),
    ('04_hardware', {'repeats': 0}, 'repeats'),
])
def test_02_04_reject_bad_parameters_by_name(run_notebook, name, params, culprit):
    with pytest.raises(papermill.PapermillExecutionError, match=culprit):
        run_notebook(name, **params)
