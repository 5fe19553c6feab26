"""Key-value store semantics, ring all-reduce and parameter-server training on real processes."""
import multiprocessing
import random

import pytest
import torch

import helpers as d2l
import param_server as ps


def test_kvstore_sum_is_independent_of_push_order():
    g = torch.Generator().manual_seed(0)
    values = [torch.randn(50, generator=g) * 10.0 ** torch.randint(-6, 7, (50,), generator=g)
              for _ in range(6)]
    results = []
    for seed in range(5):
        store = ps.KVStore()
        store.init('k', torch.zeros(50))
        order = list(range(6))
        random.Random(seed).shuffle(order)
        for i in order:
            store.push('k', values[i])
        results.append(store.pull('k'))
    assert all(torch.equal(r, results[0]) for r in results)
    torch.testing.assert_close(results[0], torch.stack(values).double().sum(0).float())


def test_kvstore_updater_applies_once_per_round_and_pull_is_a_copy():
    store = ps.KVStore(updater=lambda key, total, value: value - total)
    store.init('w', torch.ones(2))
    store.push('w', torch.tensor([0.25, 0.5]))
    store.push('w', torch.tensor([0.25, 0.5]))
    first = store.pull('w')
    assert first.tolist() == [0.5, 0.0] and store.pull('w').tolist() == [0.5, 0.0]
    first += 100
    assert store.pull('w').tolist() == [0.5, 0.0]


def test_kvstore_rejects_bad_input():
    store = ps.KVStore()
    store.init('w', torch.zeros(3))
    with pytest.raises(KeyError, match="unknown key 'v'"):
        store.pull('v')
    with pytest.raises(KeyError, match="unknown key 'v'"):
        store.push('v', torch.zeros(3))
    with pytest.raises(ValueError, match=r"push to 'w': shape \(2, 2\) does not match \(3,\)"):
        store.push('w', torch.zeros(2, 2))
    with pytest.raises(KeyError, match='already initialised'):
        store.init('w', torch.zeros(3))


def test_remote_store_rejects_bad_input_before_sending():
    store = ps.RemoteKVStore({'w': (3,), 'b': (1,)}, servers=[2, 3])
    assert store.owner == {'b': 2, 'w': 3}
    with pytest.raises(KeyError, match="unknown key 'v'"):
        store.pull('v')
    with pytest.raises(ValueError, match="shape"):
        store.push('w', torch.zeros(4))


def test_ring_needs_two_processes():
    with pytest.raises(ValueError, match='at least 2 processes, got 1'):
        ps.ring_allreduce(torch.ones(3), ranks=[0])


def test_ring_and_naive_match_all_reduce_for_2_3_4_processes():
    sizes = [1, 2, 5, 1000, 1003, 4099]
    errors = d2l.run_workers(ps.check_collectives_worker, 4, sizes,
                             ['float32', 'float64', 'int64'], timeout=120)[0]
    assert {k.split()[0] for k in errors} == {'n=2', 'n=3', 'n=4'}
    assert len(errors) == 3 * 3 * len(sizes)
    for case, err in errors.items():
        limit = {'int64': 0, 'float64': 1e-12, 'float32': 1e-6}[case.split()[1]]
        assert err <= limit, (case, err)


@pytest.mark.parametrize('workers, servers, tolerance', [(2, 1, 0.0), (3, 2, 1e-6)])
def test_parameter_server_training_matches_all_reduce(workers, servers, tolerance):
    config = {'workers': workers, 'servers': servers, 'steps': 4}
    via_servers = d2l.run_workers(ps.ps_train_worker, workers + servers, config, timeout=120)
    via_allreduce = d2l.run_workers(ps.allreduce_train_worker, workers, config, timeout=120)
    for k in ('w', 'b'):
        assert all(torch.equal(via_servers[0][k], via_servers[w][k]) for w in range(workers))
        assert (via_servers[0][k] - via_allreduce[0][k]).abs().max() <= tolerance
    owned = sorted(key for r in via_servers[workers:] for key in r['keys'])
    assert owned == ['b', 'w']


def test_dead_server_is_an_error_and_nothing_survives():
    with pytest.raises(RuntimeError, match='simulated failure at step 1'):
        d2l.run_workers(ps.ps_train_worker, 3, {'workers': 2, 'servers': 1,
                                                'fail_server_step': 1}, timeout=60)
    assert multiprocessing.active_children() == []


def test_bad_parameter_server_configs_are_refused():
    with pytest.raises(ValueError, match='unknown setting'):
        ps.ps_train_worker(0, 3, {'severs': 2})
    with pytest.raises(RuntimeError, match='world_size 4 != workers 2 \\+ servers 1'):
        d2l.run_workers(ps.ps_train_worker, 4, {'workers': 2, 'servers': 1}, timeout=60)
