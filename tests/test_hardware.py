"""The machine probe the course cites: vector units and peaks, caches, what the cores are, and
the load other programs put on the machine."""
import dataclasses
import json
import subprocess
import sys
import time

import pytest

import hardware

EPYC_ZEN4 = hardware.CpuInfo('AMD EPYC 9R14 96-Core Processor', 'AuthenticAMD', 25, 17,
                             flags=frozenset({'avx2', 'fma', 'avx512f', 'avx512_bf16'}))
SKYLAKE_GOLD = hardware.CpuInfo('Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz', 'GenuineIntel', 6, 85,
                                flags=frozenset({'avx2', 'fma', 'avx512f'}))
SKYLAKE_SILVER = dataclasses.replace(SKYLAKE_GOLD, model='Intel(R) Xeon(R) Silver 4114 CPU')
SPR_VM = hardware.CpuInfo('Intel(R) Xeon(R) Processor', 'GenuineIntel', 6, 167,
                          flags=frozenset({'avx2', 'fma', 'avx512f', 'avx512_bf16', 'amx_bf16',
                                           'amx_tile', 'avx512_fp16', 'hypervisor'}))
HASWELL = hardware.CpuInfo('Intel(R) Xeon(R) CPU E5-2686 v4', 'GenuineIntel', 6, 79,
                           flags=frozenset({'avx', 'avx2', 'fma'}))
ZEN5_SERVER = hardware.CpuInfo('AMD EPYC 9655', 'AuthenticAMD', 26, 2,
                               flags=frozenset({'avx2', 'fma', 'avx512f'}))
ZEN5_MOBILE = dataclasses.replace(ZEN5_SERVER, model='AMD Ryzen AI 9 HX 370', model_number=36)
ZEN2 = hardware.CpuInfo('AMD EPYC 7B12', 'AuthenticAMD', 23, 49,
                        flags=frozenset({'avx', 'avx2', 'fma'}))


@pytest.mark.parametrize('info, name, per_cycle', [
    (EPYC_ZEN4, 'Zen 4', 32),          # 512-bit instructions as two 256-bit halves
    (SKYLAKE_GOLD, 'Skylake-SP / Cascade Lake', 64),
    (SKYLAKE_SILVER, 'Skylake-SP / Cascade Lake', 32),   # one FMA pipe
    (SPR_VM, 'Sapphire Rapids or newer', 64),            # AMX decides, not model 167
    (HASWELL, 'GenuineIntel AVX2 core', 32),
    (ZEN2, 'Zen 2', 32),
    (ZEN5_SERVER, 'Zen 5', 64),
    (ZEN5_MOBILE, 'Zen 5 (mobile)', 32),                 # Strix Point: 256-bit pipes
])
def test_fp32_flops_per_cycle_follow_the_vector_units(info, name, per_cycle):
    arch = hardware.microarchitecture(info)
    assert (arch.name, arch.fp32_flops_per_cycle) == (name, per_cycle), arch
    assert arch.evidence


def test_zen4_evidence_names_the_split_and_vm_evidence_names_the_model_number():
    assert 'two 256-bit halves' in hardware.microarchitecture(EPYC_ZEN4).evidence
    assert 'model number, 167, unknown' in hardware.microarchitecture(SPR_VM).evidence


def test_other_precisions_scale_from_fp32():
    assert hardware.flops_per_cycle('float64', EPYC_ZEN4) == 16
    assert hardware.flops_per_cycle('bfloat16', EPYC_ZEN4) == 64    # avx512_bf16 dot products
    assert hardware.flops_per_cycle('float16', EPYC_ZEN4) == 32     # no fp16 instructions
    assert hardware.flops_per_cycle('bfloat16', SPR_VM) == 1024     # AMX tiles
    info = dataclasses.replace(EPYC_ZEN4, physical_cores=2)
    assert hardware.peak_flops('float32', 3.0, info) == 32 * 2 * 3e9
    assert hardware.peak_flops('float32', None, info) is None


def test_unknown_vector_units_say_so():
    arch = hardware.microarchitecture(hardware.CpuInfo('mystery', flags=frozenset()))
    assert arch.fp32_flops_per_cycle is None and hardware.flops_per_cycle('float32',
                                                                          hardware.CpuInfo('m')) \
        is None


def test_sizes_as_linux_writes_them():
    assert hardware.parse_size('48K') == 48 * 2**10
    assert hardware.parse_size('480M') == 480 * 2**20
    assert hardware.parse_size('1G') == 2**30 and hardware.parse_size('32 MiB') == 32 * 2**20
    with pytest.raises(ValueError, match='not a size'):
        hardware.parse_size('big')


def test_cache_sizes_read_from_a_sysfs_tree(tmp_path):
    for i, (level, kind, size, shared) in enumerate([(1, 'Data', '48K', '0'),
                                                     (1, 'Instruction', '32K', '0'),
                                                     (2, 'Unified', '2048K', '0-1'),
                                                     (3, 'Unified', '32M', '0-3,8-11')]):
        d = tmp_path / 'cache' / f'index{i}'
        d.mkdir(parents=True)
        for name, value in (('level', level), ('type', kind), ('size', size),
                            ('shared_cpu_list', shared)):
            (d / name).write_text(f'{value}\n')
    sizes, shared = hardware.cache_sizes(tmp_path)
    assert sizes == {'L1': 48 * 2**10, 'L2': 2 * 2**20, 'L3': 32 * 2**20}
    assert shared == {'L1': 1, 'L2': 2, 'L3': 8}


def test_this_machine_is_described():
    info = hardware.cpu_info()
    assert info.logical_cores >= 1 and info.smt_siblings >= 1
    assert hardware.microarchitecture(info).evidence


@pytest.mark.parametrize('scaling, kind', [
    ({'compute': 1.95, 'latency': 1.97}, 'separate'),
    ({'compute': 1.08, 'latency': 1.85}, 'siblings'),
    ({'compute': 1.45, 'latency': 1.5}, 'unclear'),
    ({'compute': 2.41, 'latency': 2.13}, 'noise'),  # seen on 16 cores: not a model
])
def test_what_the_cores_are_follows_the_two_measurements(scaling, kind):
    got, sentence = hardware.what_the_cores_are(scaling, 2)
    assert got == kind and f'{scaling["compute"]:.2f}x' in sentence
    assert hardware.what_the_cores_are(scaling, 1)[0] == 'one'


def test_two_thread_scaling_measures_both_kinds():
    scaling = hardware.two_thread_scaling(seconds=0.05, repeats=1)
    assert set(scaling) == {'compute', 'latency'} and all(v > 0 for v in scaling.values())


BUSY = 'import time\nend = time.time() + {s}\nwhile time.time() < end: pass\n'


def test_load_meter_counts_other_programs_but_not_our_own_workers():
    with hardware.LoadMeter() as ours:
        child = subprocess.Popen([sys.executable, '-c', BUSY.format(s=1.0)])
        child.wait()
    # a grandchild whose parent exits at once is re-parented away from us: another program
    with hardware.LoadMeter() as theirs:
        subprocess.run(['sh', '-c', f'{sys.executable} -c "{BUSY.format(s=1.0)}" &'],
                       check=True)
        time.sleep(1.2)
    # one busy process is about 1/cores of the machine: counted only when it is not ours
    # (compared with each other, so that other work on a busy machine cancels out)
    assert theirs.others > ours.others + 0.3 / hardware.cpu_info().logical_cores, (
        theirs.others, ours.others)
    assert 'other programs took' in str(theirs)


def test_diagnose_is_kept_per_boot_and_measured_again_when_asked(tmp_path):
    path = tmp_path / 'machine.json'
    first = hardware.diagnose(path=path)
    assert set(first['two_thread_scaling']) == {'compute', 'latency'}
    assert first['fp32_flops_per_cycle'] == hardware.microarchitecture().fp32_flops_per_cycle
    assert first['cores'] in ('separate', 'siblings', 'unclear', 'noise', 'one')
    if json.loads(path.read_text())['key']['boot_id']:
        assert hardware.diagnose(path=path) == first
    again = hardware.diagnose(fresh=True, path=path)
    assert again['measured_at'] >= first['measured_at']


def test_load_meter_refuses_to_meter_a_block_shorter_than_its_ticks():
    with hardware.LoadMeter() as load:
        sum(range(1000))
    assert load.others is None and 'not metered' in str(load)


def test_gpu_specs_match_whole_model_names_only():
    assert hardware.gpu_spec('NVIDIA L4')[0] == 'L4'
    assert hardware.gpu_spec('NVIDIA L40S')[0] == 'L40S'
    assert hardware.gpu_spec('NVIDIA H100 NVL')[0] == 'H100 NVL'
    assert hardware.gpu_spec('NVIDIA H100 80GB HBM3')[0] == 'H100 80GB HBM3'
    assert hardware.gpu_spec('Tesla T4')[0] == 'T4'
    assert hardware.gpu_spec('NVIDIA GeForce RTX 4090') == (None, None)


def test_gpu_peaks_per_precision_and_memory():
    assert hardware.gpu_peak_flops('Tesla T4', 'float32') == 8.1e12
    assert hardware.gpu_peak_flops('Tesla T4', 'bfloat16') is None      # not on the sheet
    assert hardware.gpu_peak_flops('NVIDIA GeForce RTX 4090', 'float32') is None
    # an H100's fp64 tensor cores match its fp32 rate: equal roofs, for another reason than
    # a missing instruction (notebook 04 says so only on a CPU)
    h100 = 'NVIDIA H100 80GB HBM3'
    assert hardware.gpu_peak_flops(h100, 'float64') == hardware.gpu_peak_flops(h100, 'float32')
    assert hardware.gpu_memory_gbs(h100) == 3350 and hardware.gpu_memory_gbs('mystery') is None
    for model, (peaks, memory) in hardware.GPU_SPECS.items():
        assert len(peaks) == len(hardware.GPU_PRECISIONS) and memory > 0, model


def test_gpu_work_is_set_beside_the_gpu_l2_not_the_host_cache(monkeypatch):
    import types

    import torch
    props = types.SimpleNamespace(L2_cache_size=50 * 2**20)
    monkeypatch.setattr(torch.cuda, 'get_device_properties', lambda d: props)
    assert hardware.last_level_cache('cuda:0') == ('GPU L2', 50 * 2**20)
    assert hardware.last_level_cache('cpu') == hardware.last_level_cache()


def test_roofs_are_drawn_at_a_clock_the_run_can_defend():
    assert hardware.roof_clock(2.6, 3.9, 2.8)[0] == 3.9            # a reported maximum wins
    ghz, why = hardware.roof_clock(2.6, None, 2.61)               # within noise of nominal
    assert ghz == 2.61 and why.startswith('about the nominal')
    ghz, why = hardware.roof_clock(2.6, None, 3.1)                  # measured above nominal
    assert ghz == 3.1 and 'imply' in why
    assert hardware.roof_clock(2.6, None, None)[0] == 2.6
    assert hardware.roof_clock(None, None, None) == (None, 'no clock known')
