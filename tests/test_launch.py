"""Unit tests for notebooks/launch.py: worker processes that start, report, fail and stop
cleanly, and the process group each of them joins."""
import multiprocessing
import socket
import time

import pytest
import torch

import launch


@pytest.mark.parametrize('gpus, world, backend, device', [
    (0, 2, 'gloo', 'cpu'), (2, 2, 'nccl', 'cuda:1'), (1, 2, 'gloo', 'cuda:0')])
def test_init_distributed_picks_backend_and_device(monkeypatch, gpus, world, backend, device):
    calls = {}
    monkeypatch.setattr(launch, 'num_gpus', lambda: gpus)
    monkeypatch.setattr(torch.cuda, 'set_device', lambda d: None)
    monkeypatch.setattr(torch.distributed, 'is_nccl_available', lambda: True)
    monkeypatch.setattr(torch.distributed, 'init_process_group',
                        lambda b, **kw: calls.update(backend=b, **kw))
    monkeypatch.setenv('RANK', '1')
    monkeypatch.setenv('WORLD_SIZE', str(world))
    monkeypatch.delenv('LOCAL_RANK', raising=False)
    rank, world_size, dev = launch.init_distributed(timeout=7)
    assert (rank, world_size, str(dev)) == (1, world, device)
    assert calls['backend'] == backend and calls['timeout'].total_seconds() == 7


def test_run_workers_runs_a_collective():
    import workers
    assert launch.run_workers(workers.all_reduce_rank, 2, timeout=60) == [3.0, 3.0]


def test_crashing_worker_becomes_an_error_and_nothing_survives():
    import workers
    tik = time.monotonic()
    with pytest.raises(RuntimeError, match='rank 1 of 2 failed:(.|\n)*rank 1 refuses'):
        launch.run_workers(workers.fail_on_rank_1, 2, timeout=60)
    assert time.monotonic() - tik < 60 and multiprocessing.active_children() == []


def test_dead_worker_is_reported_with_its_exit_code():
    import workers
    with pytest.raises(RuntimeError, match='died with exit code 3'):
        launch.run_workers(workers.exit_hard, 1, timeout=60)
    assert multiprocessing.active_children() == []


def test_hung_worker_times_out_and_is_killed():
    import workers
    tik = time.monotonic()
    with pytest.raises(RuntimeError, match='timed out after 4 s'):
        launch.run_workers(workers.sleep_forever, 2, timeout=4)
    assert time.monotonic() - tik < 20 and multiprocessing.active_children() == []


def test_busy_port_and_bad_world_size_are_refused_before_starting():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        s.listen()
        port = s.getsockname()[1]
        assert not launch.port_is_free(port)
        with pytest.raises(ValueError, match=f'port {port} on 127.0.0.1 is busy'):
            launch.run_workers(print, 2, port=port)
    with pytest.raises(ValueError, match='world_size'):
        launch.run_workers(print, 0)
    assert launch.port_is_free(launch.free_port())



def test_workers_report_progress_while_they_run():
    import workers
    seen = []
    results = launch.run_workers(workers.report_epochs, 2, 3, timeout=60,
                              on_progress=lambda rank, m: seen.append((rank, m['epoch'])))
    assert results == [3, 3] and seen == [(0, 0), (0, 1), (0, 2)]
