"""The shared parts of sizing.py and the probe in hardware.py: its GPU path (simulated here), its
load meter, and Setup."""
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


class _Meter:
    """A LoadMeter stand-in that reads each share in turn."""
    shares = []

    def __init__(self, min_ticks=None):
        pass

    def __enter__(self):
        self.others = _Meter.shares.pop(0)
        return self

    def __exit__(self, *exc):
        pass


def test_the_probe_measures_again_on_a_busy_machine_and_says_so(monkeypatch):
    """09 once planned from a probe taken while another notebook ran: the probe meters the
    load, measures again when others took over BUSY_SHARE, keeps the faster reading, and the
    Machine says how busy it was."""
    rates = iter([4e10, 4e10, 1.2e11, 1.2e11])  # busy first (all cores, one core), then idle
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(hardware, 'LoadMeter', _Meter)
    monkeypatch.setattr(hardware, '_matmul_flops', lambda *a, **k: next(rates))
    _Meter.shares = [0.6, 0.1]
    hardware.probe.cache_clear()
    try:
        machine = hardware.probe()
        assert machine.host_flops == 1.2e11 and machine.busy == 0.1
        hardware.probe.cache_clear()
        rates = iter([5e10] * 4)
        _Meter.shares = [0.7, 0.8]   # busy both times: the reading says so
        assert hardware.probe().busy == 0.7
    finally:
        hardware.probe.cache_clear()


def test_every_described_machine_is_complete():
    assert set(hardware.DESCRIBED) >= {'cpu-2core', 'cpu-16core', 'colab-t4', 'h100', '8xh100'}
    for name, m in hardware.DESCRIBED.items():
        assert m.host_cores >= 1 and m.flops > 0 and m.memory > 0, name
        assert (m.gpus > 0) == m.on_gpu and len(m.gpu_flops) in (0, m.gpus), name


def test_a_setup_planned_on_a_busy_machine_says_so():
    busy = dataclasses.replace(hardware.DESCRIBED['cpu-2core'], busy=0.6)
    quiet = dataclasses.replace(busy, busy=0.1)
    assert '60% of the CPU' in str(sizing.Setup(['chosen'], machine=busy))
    assert str(sizing.Setup(['chosen'], machine=quiet)) == 'chosen'
