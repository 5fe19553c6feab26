"""Notebook 01: what its default run recorded, its refusals of bad parameters, and its plan."""
import pytest

import hardware
import parameters
import plan_01
import sizing

NAME = '01_compilers_and_interpreters'
MODES = ('eager', 'scripted', 'compiled')


def test_01_default_run_compiles_and_every_mode_agrees(default_run):
    _, r = default_run(NAME)
    workloads = [f'MLP, batch {b}' for b in r['mlp_batch_sizes']] + ['elementwise chain']
    assert r['mlp_batch_sizes'] == [1, 256], 'the plan keeps the book\'s batch 1 and 256'
    modes = MODES if r['torchscript_available'] else ('eager', 'compiled')
    assert set(r['median_s']) == {f'{w} | {m}' for w in workloads for m in modes}
    assert all(t > 0 for t in r['median_s'].values())
    assert all(r['speedup_over_eager'][f'{w} | eager'] == 1.0 for w in workloads)
    assert len(r['max_abs_diff']) == (5 if r['torchscript_available'] else 3)
    assert all(d < 1e-4 for d in r['max_abs_diff'].values()), r['max_abs_diff']
    assert set(r['mlp_work_measurable']) == {f'MLP, batch {b}' for b in r['mlp_batch_sizes']}
    assert r['torchscript_can_fuse'] in (True, False)
    assert not any(c.startswith(('triton_helpers', 'triton_heuristics', 'triton_meta'))
                   for c in r['compiled_calls']), 'only kernels'
    assert r['recompiled']['batch 1'] and not r['recompiled']['batch 1 again']
    assert r['recompiled']['batch 16, no_grad'], 'a grad-mode change fails a guard'
    assert r['static_export_rejects_new_batch'] is True


def test_01_default_run_shows_fusion_and_its_price(default_run):
    _, r = default_run(NAME)
    # whether fusion won here is the run's verdict, recorded, not a test: a timing is no bound
    assert r['speedup_over_eager']['elementwise chain | compiled'] > 0
    assert r['compiled_call_overhead_s'] > 0, 'a compiled call has a fixed cost'
    assert set(r['fusion_speedup_by_length']) == {str(n) for n in (*range(1, 9), 16)}
    assert r['chain_eager_bandwidth'] > 0 and r['chain_copy_bandwidth'] > 0
    assert set(r['compile_from_cache']) == set(r['compile_s'])
    for w, b in r['break_even_calls'].items():  # only where the headline's verdict: faster
        faster = r['headline_compiled_faster'][w]
        assert (b is not None) == faster and (b is None or b > 0), (w, b)
        assert not faster or r['headline_speedup'][w] > 1.05, w
    assert set(r['compiled_measurably_faster']) >= {'elementwise chain'}
    assert r['fusion_crossover_length'] in (None, *range(1, 9), 16)
    assert r['predicted_crossover_length'] >= 1


def test_01_default_run_shows_what_eager_and_compiled_code_call(default_run):
    _, r = default_run(NAME)
    assert any('addmm' in op for op in r['eager_ops']), r['eager_ops']
    assert r['compiled_calls'], 'the generated code calls kernels'
    assert r['compiled_call_overhead_one_thread_s'] > 0
    assert r['export_refuses_data_dependent_branch'] is True


@pytest.mark.parametrize('params, message', [
    ({'mlp_batch_sizes': [1, 0]}, 'each of mlp_batch_sizes must be an integer >= 1'),
    ({'mlp_batch_sizes': 'one'}, 'pass lists to papermill with -y'),
    ({'mlp_batch_sizes': []}, 'mlp_batch_sizes must be a non-empty list'),
    ({'device': 'cuda:3'}, "device='cuda:3'"),
    ({'chain_length': -1}, 'chain_length must be an integer >= 1'),
    ({'chain_numel': 0}, 'chain_numel must be an integer >= 1'),
    ({'repeats': 0}, 'repeats must be an integer >= 1'),
])
def test_01_refuses_bad_parameters_by_name(refusal, params, message):
    error = refusal(NAME, **params)
    assert error is not None and message in error, error


def test_01_accepts_a_list_as_text(refusal):
    """papermill's `-p mlp_batch_sizes [1,4]` delivers the text '[1,4]'."""
    assert refusal(NAME, mlp_batch_sizes='[1,4]') is None


def test_01_refuses_an_older_torch_and_unknown_parameters_by_name():
    with pytest.raises(RuntimeError, match=r'needs torch>=2\.9'):
        parameters.check_torch(*plan_01.MIN_TORCH, installed='2.8.0')
    with pytest.raises(ValueError, match='unknown parameter'):
        plan_01.setup(chain_lenght=4)


@pytest.mark.parametrize('machine', sorted(hardware.DESCRIBED))
def test_plan_01_fits_time_and_memory(machine):
    m = hardware.DESCRIBED[machine]
    plan = plan_01.plan_for(m)
    assert plan.seconds <= sizing.budget('01', m), plan
    assert plan.device_bytes <= 0.25 * m.memory and plan.host_bytes <= 0.25 * m.host_memory
    assert plan['mlp_batch_sizes'] == [1, 256]
    # a GPU gets a tensor far beyond its caches; a CPU one that keeps the run short
    assert plan['chain_numel'] == (2**26 if m.on_gpu else 2**22), plan
