"""Every notebook planned for the machines learners have, without the hardware (issue "every
machine"): CI's 2-core VM, a 16-core CPU, a Colab T4 with 2 vCPUs and 12.7 GB, one H100 with 16
cores, and 8 H100s with 96 cores (hardware.DESCRIBED). For each, the plan's estimate fits the
notebook's budget, work kept on the CPU of a GPU machine fits the CPU's, the memory fits, and
the sizes chosen let each lesson show. Each notebook's own test file tests its plan in depth."""
import importlib

import pytest
import torch

import hardware
import sizing

NOTEBOOKS = [f'{n:02d}' for n in range(1, 10)]
MACHINES = ('cpu-2core', 'cpu-16core', 'colab-t4', 'h100', '8xh100')


def plan(notebook, name):
    return importlib.import_module(f'plan_{notebook}').plan_for(hardware.DESCRIBED[name])


def test_the_issue_s_five_machines_are_described():
    assert set(MACHINES) <= set(hardware.DESCRIBED)
    t4, h100, eight = (hardware.DESCRIBED[n] for n in ('colab-t4', 'h100', '8xh100'))
    assert (t4.host_cores, round(t4.host_memory / 1e9, 1), t4.gpus) == (2, 12.7, 1)
    assert (h100.host_cores, h100.gpus, eight.host_cores, eight.gpus) == (16, 1, 96, 8)


@pytest.mark.parametrize('name', MACHINES)
@pytest.mark.parametrize('notebook', NOTEBOOKS)
def test_every_plan_fits_its_budget_and_memory(notebook, name):
    machine = hardware.DESCRIBED[name]
    p = plan(notebook, name)
    assert 0 < p.seconds <= sizing.budget(notebook, machine), (notebook, name, p.seconds)
    assert p.host_bytes <= machine.host_memory, (notebook, name, p.host_bytes)
    assert p.device_bytes <= machine.memory, (notebook, name, p.device_bytes)


@pytest.mark.parametrize('name', MACHINES)
def test_work_kept_on_the_cpu_of_a_gpu_machine_fits_the_cpu_s_budget(name):
    """07 runs every process on the CPU, and 08's float64 check (and its runs without a GPU
    each) too: on a GPU machine that work still gets only the CPU's budget."""
    cpu = hardware.on_device(hardware.DESCRIBED[name], torch.device('cpu'))
    assert plan('07', name).seconds <= sizing.budget('07', cpu)
    assert plan('08', name)['cpu_seconds'] <= sizing.budget('08', cpu)


@pytest.mark.parametrize('name', [n for n in MACHINES if hardware.DESCRIBED[n].on_gpu])
def test_02_s_gpu_loop_is_ten_times_its_issue_time(name):
    """On an H200 the book's 1000 x 1000 products ran in less time than Python took to issue
    them, so nothing asynchronous showed: the GPU loop's work is sized to 10x its issue."""
    p = plan('02', name)
    assert p['loop_gpu_s'] >= 10 * p['loop_issue_s'], (name, p['loop_gpu_s'], p['loop_issue_s'])


@pytest.mark.parametrize('name', MACHINES)
def test_03_s_two_lanes_are_within_one_and_a_half_times_of_each_other(name):
    lanes = plan('03', name)['lane_s']
    assert max(lanes) <= 1.5 * min(lanes), (name, lanes)


@pytest.mark.parametrize('name', MACHINES)
def test_09_s_modelled_idle_share_falls_with_the_micro_batches(name):
    p = plan('09', name)
    if p['pp_stages'] < 2:
        pytest.skip(f'{name}: one pipeline stage, nothing to fill')
    idle = [p['idle_model'][m] for m in p['microbatches']]
    assert all(a > b for a, b in zip(idle, idle[1:])), (name, idle)
