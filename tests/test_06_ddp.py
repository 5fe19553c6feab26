"""The DDP worker on real gloo processes: in-process launcher, torchrun, and bad input."""
import json
import subprocess
import sys

import papermill
import pytest
from conftest import NOTEBOOKS

import ddp_train
import helpers as d2l

TINY = {'batch_size': 8, 'num_train': 16, 'num_test': 8, 'data_source': 'synthetic'}


def test_two_gloo_processes_end_with_identical_parameters():
    results = d2l.run_workers(ddp_train.train, 2, TINY, timeout=120)
    assert [r['rank'] for r in results] == [0, 1]
    assert {r['backend'] for r in results} == {'gloo'}
    assert results[0]['param_digest'] == results[1]['param_digest']
    assert all(r['max_param_diff'] == 0 for r in results)
    assert all(r['steps'] == 2 and r['per_rank_batch'] == 4 for r in results)
    assert 0 <= results[0]['test_accuracy'] <= 1 and results[1]['test_accuracy'] is None


def test_standalone_script_under_torchrun():
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--nproc_per_node=2',
           f'--master_port={d2l.free_port()}', str(NOTEBOOKS / 'ddp_train.py'),
           '--batch-size', '8', '--num-train', '16', '--num-test', '8',
           '--data-source', 'synthetic']
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=NOTEBOOKS)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout[done.stdout.index('{'):])
    assert result['world_size'] == 2 and result['max_param_diff'] == 0 and result['steps'] == 2


def test_standalone_script_refuses_to_run_without_torchrun():
    done = subprocess.run([sys.executable, str(NOTEBOOKS / 'ddp_train.py')], capture_output=True,
                          text=True, timeout=60, cwd=NOTEBOOKS)
    assert done.returncode == 2 and 'torchrun' in done.stderr


@pytest.mark.parametrize('config, world_size, message', [
    ({'batch_size': 7}, 2, 'batch_size=7 does not split evenly over 2 processes'),
    ({'num_train': 4, 'batch_size': 8}, 2, 'num_train=4 is smaller than one batch'),
    ({'epochs': 0}, 1, 'epochs must be'),
    ({'lr_schedule': 'cosine'}, 1, 'unknown setting'),
    ({}, 0, 'world_size'),
])
def test_bad_configs_are_refused_before_any_process_starts(config, world_size, message):
    with pytest.raises(ValueError, match=message):
        ddp_train.check_config(config, world_size)


@pytest.mark.parametrize('params, message', [
    ({'batch_size': 33}, 'batch_size=33 does not split evenly over 2 processes'),
    ({'num_gpus': 0}, 'num_gpus must be'),
    ({'num_gpus': 4, 'batch_size': 2}, 'batch_size=2 is smaller than 4 devices'),
])
def test_06_refuses_bad_input_before_training(run_notebook, params, message):
    with pytest.raises(papermill.PapermillExecutionError, match=message):
        run_notebook('06_multi_gpu_concise', **params)


def test_06_refuses_a_busy_port(run_notebook):
    import socket
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(papermill.PapermillExecutionError, match=f'master_port={port} is busy'):
            run_notebook('06_multi_gpu_concise', master_port=port)
