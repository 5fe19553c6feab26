"""Notebook 01 run with overridden parameters; assertions on what it recorded."""
import math

import papermill
import pytest


def test_01_with_small_workloads_records_consistent_results(run_notebook):
    r = run_notebook('01_compilers_and_interpreters', mlp_batch_sizes=[1, 8],
                     chain_numel=2**16, chain_length=4, repeats=2)
    assert r['mlp_batch_sizes'] == [1, 8] and r['chain_numel'] == 2**16
    assert set(r['median_s']) == {f'{w} | {m}' for w in ('MLP, batch 1', 'MLP, batch 8',
                                                        'elementwise chain')
                                  for m in ('eager', 'scripted', 'compiled')}
    assert all(0 < t < 10 for t in r['median_s'].values())
    assert all(math.isclose(r['speedup_over_eager'][k], 1.0)
               for k in r['speedup_over_eager'] if k.endswith('| eager'))
    assert all(d < 1e-4 for d in r['max_abs_diff'].values()), r['max_abs_diff']
    assert len(r['max_abs_diff']) == 5
    assert r['recompiled']['batch 1'] and not r['recompiled']['batch 1 again']
    assert r['static_export_rejects_new_batch'] is True
    assert r['first_compile_s'] > 0 and set(r['fusion_speedup_by_length']) == {'1', '2', '8'}


@pytest.mark.parametrize('params, culprit', [({'mlp_batch_sizes': [1, 0]}, 'mlp_batch_sizes'),
                                             ({'device': 'cuda:3'}, 'device'),
                                             ({'chain_length': -1}, 'chain_length')])
def test_01_rejects_bad_parameters_by_name(run_notebook, params, culprit):
    with pytest.raises(papermill.PapermillExecutionError, match=culprit):
        run_notebook('01_compilers_and_interpreters', **params)
