"""The shared parts of sizing.py: the probe, its GPU path (simulated here), and Setup."""
import contextlib
import dataclasses
from types import SimpleNamespace

import torch

import hardware
import plan_04
import sizing


def test_probe_plans_several_gpus_as_the_slowest_and_caps_a_boosting_t4(monkeypatch):
    cards = [SimpleNamespace(name='NVIDIA H100 80GB HBM3', total_memory=80 * 10**9, major=9,
                             minor=0),
             SimpleNamespace(name='Tesla T4', total_memory=15 * 10**9, major=7, minor=5)]
    measured = {'cuda:0': 5.5e13, 'cuda:1': 6.0e12}   # the T4 caught at its boost clock
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    monkeypatch.setattr(torch.cuda, 'get_device_properties', lambda i: cards[i])
    monkeypatch.setattr(hardware, '_no_tf32', contextlib.nullcontext)
    monkeypatch.setattr(hardware, '_matmul_flops', lambda device, n, seconds, windows=5,
                        warmup_s=0.0: measured.get(str(device), 1e11))
    hardware.probe.cache_clear()
    try:
        machine = hardware.probe()
    finally:
        hardware.probe.cache_clear()
    assert machine.gpus == 2 and machine.name == 'Tesla T4'
    assert machine.flops == hardware.DESCRIBED['colab-t4'].flops       # capped, and the slowest
    assert machine.gpu_flops == (hardware.DESCRIBED['h100'].flops, 4.5e12)
    assert machine.memory == 15 * 10**9 and machine.compute_capability == (7, 5)


def test_setup_prints_why_and_exposes_values():
    cfg = sizing.Setup(['first line', 'second line'], chain_numel=4, device='cpu')
    assert (cfg.chain_numel, cfg.device) == (4, 'cpu') and str(cfg) == 'first line\nsecond line'


def test_a_gpu_machine_run_on_its_cpu_is_planned_as_a_cpu():
    h100 = hardware.DESCRIBED['h100']
    cpu = hardware.on_device(h100, torch.device('cpu'))
    assert not cpu.on_gpu and cpu.flops == h100.host_flops
    assert hardware.on_device(h100, torch.device('cuda:0')) is h100


def test_a_machine_of_several_gpus_is_planned_as_the_one_a_notebook_runs_on(monkeypatch):
    mixed = dataclasses.replace(hardware.DESCRIBED['colab-t4'], gpus=2,
                                gpu_flops=(5e13, 4.5e12))   # probe(): the slowest, a T4
    h100 = SimpleNamespace(name='NVIDIA H100 80GB HBM3', total_memory=80 * 10**9, major=9,
                           minor=0)
    monkeypatch.setattr(torch.cuda, 'get_device_properties', lambda i: [h100, None][i])
    on_h100 = hardware.on_device(mixed, torch.device('cuda:0'))
    assert (on_h100.name, on_h100.flops, on_h100.compute_capability) == (h100.name, 5e13, (9, 0))
    assert plan_04.precisions_04(on_h100)[0] == ['float64', 'float32', 'tf32', 'bfloat16',
                                                 'float16']
    on_cpu = hardware.on_device(mixed, torch.device('cpu'))
    assert not on_cpu.on_gpu and on_cpu.gpus == 0 and 'CPU' in on_cpu.name
