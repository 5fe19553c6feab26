"""Notebook 05 through papermill: the chapter's equivalence claim, recorded and asserted."""
import papermill
import pytest


def test_05_two_replicas_match_one_device_at_double_batch(run_notebook):
    r = run_notebook('05_multi_gpu_from_scratch', num_gpus=2, batch_size=64, num_epochs=1,
                     num_train=1024, num_test=256, equivalence_steps=4)
    assert r['num_gpus'] == 2 and len(r['devices']) == 2
    assert r['emulated'] == (r['gpus_found'] < 2)
    assert r['equivalence_max_diff'] < 1e-5, r['equivalence_max_diff']
    assert r['equivalence_uneven_max_diff'] < 1e-5, r['equivalence_uneven_max_diff']
    assert r['replica_spread'] == 0
    assert set(r['seconds_per_epoch']) == set(r['test_accuracy']) == {'1', '2'}
    assert all(0 <= a <= 1 for a in r['test_accuracy'].values())
    assert all(t > 0 for t in r['seconds_per_epoch'].values())


@pytest.mark.parametrize('params, message', [
    ({'num_gpus': 0}, 'num_gpus must be an integer >= 1'),
    ({'num_gpus': -2}, 'num_gpus must be an integer >= 1'),
    ({'num_gpus': 4, 'batch_size': 3}, 'batch_size=3 is smaller than num_gpus=4'),
    ({'data_source': 'web'}, 'data_source must be one of'),
])
def test_05_refuses_bad_input_before_training(run_notebook, params, message):
    with pytest.raises(papermill.PapermillExecutionError, match=message):
        run_notebook('05_multi_gpu_from_scratch', **params)
