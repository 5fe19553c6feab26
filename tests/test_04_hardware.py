"""Notebook 04 (hardware): what its default run recorded, its refusals, its sizing plan, and
its modules (caches, roofline, storage).

Timings are never compared with fixed numbers. The claims checked hold on any machine: the
machine probe is recorded with what the system and the per-cycle table say, every rate is
positive and below the stated peak where one is known (and needs a clock no CPU has where the
maximum clock is only assumed), the working sets reach past the last-level cache, a dependent
read from main memory is much slower than one from L1, loss scaling rescues fp16 gradients,
and the plan fits the budgets of the machines it describes."""
import math
import os
import shutil

import pytest
import torch

import caches
import hardware
import parameters
import plan_04
import roofline
import sizing
import stats
import storage

ON_GPU = torch.cuda.is_available()
NAME = '04_hardware'


@pytest.fixture(scope='module')
def results(default_run):
    return default_run(NAME)[1]


def test_04_records_the_machine_probe(results):
    machine = results['machine']
    assert machine['microarchitecture'] == hardware.microarchitecture().name
    assert machine['fp32_flops_per_cycle'] == hardware.flops_per_cycle('float32')
    info = hardware.cpu_info()
    assert machine['physical_cores'] == info.physical_cores
    assert machine['smt_siblings'] == info.smt_siblings >= 1
    scaling = machine['two_thread_scaling']
    assert set(scaling) >= {'compute', 'latency'}
    # two threads do at most twice the work of one (more only within timing noise)
    assert all(0 < v < 3 for v in scaling.values()), scaling
    kind, sentence = hardware.what_the_cores_are(scaling, machine['logical_cores'],
                                                 machine['others_share'] or 0.0)
    assert (machine['cores'], machine['cores_sentence']) == (kind, sentence)


def test_04_throughput_is_positive_and_below_the_stated_peaks(results):
    cpu, clock = results['cpu'], results['clock']
    reported_max = cpu['max_clock'] == 'reported by cpufreq'
    for name, m in results['matmul'].items():
        assert m['gflops'] > 0 and m['n'] >= 16, name
        if ON_GPU or reported_max:  # a stated peak, or a reported maximum clock, bounds it
            assert m['peak_gflops'] is None or m['gflops'] < m['peak_gflops'], (name, m)
        elif m['peak_nominal_gflops'] is not None:  # the peaks follow the per-cycle table
            cores = cpu['physical_cores'] or cpu['logical_cores']
            expected = hardware.flops_per_cycle(name) * cores * cpu['nominal_ghz']
            assert math.isclose(m['peak_nominal_gflops'], expected), (name, m)
            # the roofs are drawn at a clock no measured rate exceeds, and never below nominal
            assert m['gflops'] <= m['peak_gflops'] * (1 + 1e-9), (name, m)
            assert m['peak_gflops'] >= m['peak_nominal_gflops'] * (1 - 1e-9), (name, m)
    if not ON_GPU and clock['implied_ghz'] is not None:  # no CPU core runs at 6 GHz
        assert 0 < clock['implied_ghz'] < 6, clock
        assert clock['roof_ghz'] >= clock['nominal_ghz'] and clock['roof_clock'], clock
    for where, bw in results['memory'].items():
        assert bw['copy_gbs'] > 0 and bw['read_gbs'] > 0, where
        if bw['peak_gbs'] is not None:
            assert max(bw['copy_gbs'], bw['read_gbs']) < bw['peak_gbs'], (where, bw)
    threads = {int(k): v for k, v in results['threads_gflops'].items()}
    assert sorted(threads) == results['plan']['thread_counts'] and 1 in threads
    assert all(v > 0 for v in threads.values())
    # one statistic: the table's rate is the median of the repeats the verdict compared
    for k, rates in results['threads_repeats'].items():
        assert math.isclose(stats.median(rates), results['threads_gflops'][k]), k
    v = results['vectorisation_gflops']
    assert v['one matmul'] > v['Python loops'] > 0


def test_04_gpu_precisions_are_only_measured_where_they_exist(results):
    names = set(results['matmul'])
    if not ON_GPU:
        assert names == {'float32', 'float64', 'bfloat16', 'float16'}
    elif torch.cuda.get_device_capability(0) < (8, 0):
        assert 'tf32' not in names and 'bfloat16' not in names


def test_04_dependent_reads_are_latency_and_grow_past_the_caches(results):
    dependent = {int(k): v for k, v in results['dependent_read_s'].items()}
    smallest, largest = min(dependent), max(dependent)
    llc = max(results['cpu']['caches'].values(), default=32 * 2**20)
    assert largest >= 4 * llc, 'the largest working set must reach far past the LLC'
    assert smallest <= 32 * 2**10, 'the smallest working set must fit an L1 cache'
    assert dependent[largest] >= 3 * dependent[smallest], dependent
    curve = results['cache_curve']
    assert curve['bytes'] == sorted(dependent)
    assert len(curve['seq_gbs']) == len(curve['rand_s']) == len(dependent)
    # independent reads overlap, dependent ones cannot
    assert curve['rand_s'][-1] < dependent[largest]
    chapter = results['chapter_memory']
    assert chapter['first_read_s'] == dependent[largest] and chapter['ratio'] > 1


def test_04_loss_scaling_rescues_fp16_gradients(results):
    u = results['fp16_underflow']
    assert 0 < u['plain_zero_fraction'] <= 1
    assert 0 <= u['scaled_zero_fraction'] < u['plain_zero_fraction']
    assert u['scaled_relative_error'] < 1e-2
    r = results['precision_ranges']
    assert r['float16']['max'] < r['bfloat16']['max'] <= r['float32']['max']
    assert r['bfloat16']['eps'] > r['float16']['eps'] > r['float32']['eps']


def test_04_storage_and_latency_numbers_are_positive(results):
    s = results['storage']
    assert s['seq_mb_s'] > 0 and s['rand_4k_iops'] > 0 and s['random_reads'] > 0
    # one request at a time: IOPS is one over the latency
    assert math.isclose(s['rand_4k_iops'] * s['rand_4k_latency_s'], 1)
    assert s['rand_4k_iops_in_flight'] > 0 and s['in_flight'] > 1
    assert isinstance(s['bypassed_page_cache'], bool) and s['method']
    assert all(t > 0 for t in results['latency_s'].values())
    assert all(t > 0 for t in results['dispatch_s'].values())
    if results['false_sharing_s']:  # two cores or more
        assert all(t > 0 for t in results['false_sharing_s'].values())


@pytest.mark.parametrize('params, culprit', [
    ({'repeats': 0}, 'repeats'),
    ({'matmul_size': 8}, 'matmul_size'),
    ({'bandwidth_mb': 'large'}, 'bandwidth_mb'),
    ({'max_working_set_mb': 10**9}, 'max_working_set_mb'),
    ({'storage_mb': 0}, 'storage_mb'),
])
def test_04_rejects_bad_parameters_by_name(refusal, params, culprit):
    error = refusal(NAME, **params)
    assert error is not None and error.startswith('ValueError') and culprit in error, error


def test_04_default_parameters_pass_the_setup(refusal):
    assert refusal(NAME) is None


# ------------------------------------------------------------------ the plan, without hardware
# A CPU like this course's: AVX2 and no bf16 instructions, so bf16 and fp16 products run
# about a hundred times slower than fp32 (probed rates of 256 x 256 products).
SLOW_HALF_CPU = {'float32': 7e10, 'float64': 3e10, 'bfloat16': 1.2e9, 'float16': 1.2e9}
GPU_RATES = {'colab-t4': {'float64': 2.5e11, 'float32': 4.5e12, 'float16': 2.5e13},
             'h100': {'float64': 5e13, 'float32': 5e13, 'tf32': 3e14, 'bfloat16': 6e14,
                      'float16': 6e14}}


GPU_RATES['8xh100'] = GPU_RATES['h100']
L2_BYTES = {'colab-t4': 4 * 2**20, 'h100': 50 * 2**20, '8xh100': 50 * 2**20}


@pytest.mark.parametrize('rates_given', [True, False])
@pytest.mark.parametrize('llc_mib', [32, 480])
@pytest.mark.parametrize('machine_name', sorted(hardware.DESCRIBED))
def test_plan_04_fits_the_budgets_of_described_machines(machine_name, llc_mib, rates_given):
    machine = hardware.DESCRIBED[machine_name]
    rates = (GPU_RATES.get(machine_name, SLOW_HALF_CPU) if rates_given else None)
    llc = llc_mib * 2**20
    plan = plan_04.plan_for(machine, rates, llc_bytes=llc, gpu_l2_bytes=L2_BYTES.get(machine_name),
                            l2_bytes=2**21)
    limit = sizing.budget('04', machine)
    # a CPU run leaves room for the kernel start and the sections no parameter sizes
    assert plan.seconds <= (0.75 if not machine.on_gpu else 1) * limit, (plan.seconds, plan)
    assert plan.host_bytes <= machine.host_memory
    if machine.on_gpu:
        assert plan.device_bytes <= machine.memory
    kind = 'cuda' if machine.on_gpu else 'cpu'
    measured = {**{p: machine.flops for p in plan['matmul_sizes']}, **(rates or {})}
    for p, n in plan['matmul_sizes'].items():  # each product short, or the smallest size
        short = 2 * n**3 / measured[p] <= plan_04.MATMUL_CALL_S_04[kind]
        assert short or n == plan_04.MATMUL_SIZES_04[-1], (p, n)
        assert n <= plan_04.MATMUL_BOOK_04[kind]
    # past the last-level cache, unless the host cannot hold such buffers (then the largest)
    twice = plan_04._host_bytes(machine, 2 * plan['bandwidth_mb'], plan['max_working_set_mb'])
    for key in ('max_working_set_mb', 'bandwidth_mb'):
        assert plan[key] * 2**20 >= 4 * llc or twice > 0.75 * machine.host_memory, (key, plan)
    assert plan['thread_counts'][0] == 1 and plan['thread_counts'][-1] == machine.host_cores
    assert plan['exercise_mb'] <= plan['bandwidth_mb']
    # the cache roof reads a buffer well inside the cache, for at least CACHE_CALL_S_04 a call
    cache, reads = plan['cache_read_bytes'], plan['cache_reads']
    inside = L2_BYTES[machine_name] / 2 if machine.on_gpu else machine.host_cores * 2**21 / 2
    assert 0 < cache <= inside, (cache, inside)
    bound = plan_04.CACHE_GBS_BOUND_04[kind] * (1 if machine.on_gpu else machine.host_cores)
    assert reads * cache / bound >= plan_04.CACHE_CALL_S_04


def test_plan_04_sizes_each_precision_by_its_own_rate():
    plan = plan_04.plan_for(hardware.DESCRIBED['cpu-2core'], SLOW_HALF_CPU)
    sizes = plan['matmul_sizes']
    assert sizes['bfloat16'] < sizes['float32'] and sizes['float16'] < sizes['float32']
    assert sizes['float32'] == plan_04.MATMUL_BOOK_04['cpu']
    h100 = plan_04.plan_for(hardware.DESCRIBED['h100'], GPU_RATES['h100'])
    assert set(h100['matmul_sizes'].values()) == {plan_04.MATMUL_BOOK_04['cuda']}  # book scale


def test_plan_04_skips_tf32_and_bf16_below_compute_capability_8():
    t4 = hardware.DESCRIBED['colab-t4']
    names, skipped = plan_04.precisions_04(t4)
    assert 'tf32' not in names and 'bfloat16' not in names
    assert skipped == ['tf32', 'bfloat16']
    assert set(plan_04.plan_for(t4)['matmul_sizes']) == set(names)
    names, skipped = plan_04.precisions_04(hardware.DESCRIBED['h100'])
    assert {'tf32', 'bfloat16'} <= set(names) and not skipped


def test_plan_04_sizes_memory_from_the_last_level_cache():
    cpu = hardware.DESCRIBED['cpu-2core']
    big_llc = plan_04.plan_for(cpu, SLOW_HALF_CPU, llc_bytes=480 * 2**20)
    assert big_llc['max_working_set_mb'] >= 4 * 480 and big_llc['bandwidth_mb'] >= 4 * 480
    small_llc = plan_04.plan_for(cpu, SLOW_HALF_CPU, llc_bytes=8 * 2**20)
    assert small_llc['max_working_set_mb'] == 32 and small_llc['bandwidth_mb'] == 64
    t4 = plan_04.plan_for(hardware.DESCRIBED['colab-t4'], GPU_RATES['colab-t4'])
    assert t4['bandwidth_mb'] >= 1024  # far past a GPU's L2, and long enough to time


def test_plan_04_cache_read_is_half_of_each_cores_l2_on_a_cpu():
    cpu = hardware.DESCRIBED['cpu-16core']
    shared = plan_04.plan_for(cpu, l2_bytes=2**21, l2_shared_by=2)  # SMT siblings share an L2
    alone = plan_04.plan_for(cpu, l2_bytes=2**21, l2_shared_by=1)
    assert shared['cache_read_bytes'] == 8 * 2**20 and alone['cache_read_bytes'] == 16 * 2**20


def test_04_refuses_an_older_torch_and_unknown_parameters():
    with pytest.raises(RuntimeError, match='2.9'):
        parameters.check_torch(*plan_04.MIN_TORCH, installed='2.8.0')
    assert parameters.check_torch(*plan_04.MIN_TORCH, installed='2.13.0')
    with pytest.raises(ValueError, match='matmul_sise'):
        plan_04.setup(matmul_sise=1024)
    with pytest.raises(ValueError, match='repeats'):
        plan_04.setup(repeats=0)


def test_plan_04_refuses_rates_that_are_not_positive():
    with pytest.raises(ValueError, match='matmul_flops'):
        plan_04.plan_for(hardware.DESCRIBED['cpu-2core'], {'float32': 0})


def test_04_cache_steps_and_the_roofline_are_read_as_measured(results):
    steps = results['cache_steps']
    sizes = results['cache_curve']['bytes']
    assert all(s['before'] < s['after'] and s['before'] in sizes for s in steps)
    caches_reported = results['cpu']['caches']
    assert all(s['level'] is None or s['level'] in caches_reported for s in steps)
    reading = results['past_last_step']
    assert reading['bytes'] in sizes and isinstance(reading['streams_faster'], bool)
    if steps:
        assert reading['bytes'] == steps[-1]['after']
    # notebook 04 says float32's roof is borrowed only on a CPU, and only where it is
    roof = results['roofline']
    assert isinstance(roof['cache_roof'], bool) and roof['cache_gbs'] > 0
    assert roof['cache_reads'] >= 1
    assert roof['dram_gbs'] == max(roof['streams_gbs'].values())
    threads = results['threads_gflops']
    assert threads[str(results['threads_best'])] == max(threads.values())
    borrowed = results['roofline']['borrowed_roof']
    if ON_GPU:
        assert borrowed == []
    for p in borrowed:
        assert hardware.flops_per_cycle(p) == hardware.flops_per_cycle('float32')
    # the fastest count ties with itself; the false-sharing slowdown exists only where the two
    # threads ran at once, and no stream is compared past a last step at the largest size
    assert results['threads_best'] in results['threads_tied']
    assert isinstance(results['false_sharing_at_once'], bool)
    if not results['false_sharing_at_once']:
        assert 'slowdown' not in results['false_sharing_s']
    if reading['bytes'] == sizes[-1]:
        assert reading['streams_faster'] is False


# ------------------------------------------------------------------ notebook 04's modules
def test_cache_steps_are_named_after_the_reported_size_they_match():
    sizes = [2**k for k in range(14, 25)]               # 16 KiB to 16 MiB
    latency = [1, 1, 4, 4, 4, 4, 4, 12, 30, 31, 31]       # jumps after 32 KiB and 1-4 MiB
    assert caches.steps(sizes, latency) == [(2**15, 2**16), (2**20, 2**22)]
    named = caches.name_steps(sizes, latency, {'L1': 48 * 2**10, 'L2': 2**21})
    assert [s['level'] for s in named] == ['L1', 'L2']
    far = caches.name_steps(sizes, latency, {'L1': 48 * 2**10, 'L3': 480 * 2**20})
    assert far[1]['level'] is None and far[1]['meaning'] == 'no reported cache within 2x'
    assert caches.name_steps(sizes, latency, {})[0]['level'] is None  # caches unknown
    assert caches.past_last_step(sizes, named) == 2**22
    assert caches.past_last_step(sizes, []) == sizes[-1]


def test_borrow_reuses_a_large_enough_buffer_and_copies_nothing():
    buffer = torch.ones(1024)
    chain = caches.borrow(buffer, 2048, torch.int64)
    assert chain.dtype == torch.int64 and chain.numel() == 256
    assert chain.data_ptr() == buffer.data_ptr()
    fresh = caches.borrow(buffer, 2**20, torch.int64)
    assert fresh.numel() == 2**17 and fresh.data_ptr() != buffer.data_ptr()


CHASE_C = """
#include <stdint.h>
int64_t chase(const int64_t *next, int64_t i, int64_t steps) {
    while (steps-- > 0)
        i = next[i];
    return i;
}"""


def test_the_chase_follows_a_cycle_compiled_or_not():
    chain = torch.tensor([2, 0, 3, 1], dtype=torch.int64)  # 0 -> 2 -> 3 -> 1 -> 0
    compiled = caches.compile_chase(CHASE_C)
    python = caches.compile_chase('not C at all')  # no compiler can build it: Python's loop
    assert 'Python' in python.method
    if any(shutil.which(c) for c in ('cc', 'gcc', 'clang')):
        assert 'C loop' in compiled.method and compiled.steps > python.steps
    for chase in (compiled, python):
        assert chase.run(chain, 0, 4) == 0 and chase.run(chain, 0, 2) == 3


def test_roofline_bound_and_equal_roofs():
    assert roofline.matmul_intensity(2048, 4) == pytest.approx(2 * 2048 / 12)
    assert roofline.bound(0.25, 100.0, 40.0) == 10.0      # left of the knee: the slope
    assert roofline.bound(1000, 100.0, 40.0) == 100.0     # right of it: the peak
    assert roofline.bound(0.25, None, 40.0) == 10.0       # no peak known: the slope alone
    grouped = roofline.shared_roofs({'float64': 67e3, 'float32': 67e3, 'bfloat16': 989e3,
                                     'float16': None})
    assert grouped == {67e3: ['float64', 'float32'], 989e3: ['bfloat16']}


@pytest.mark.parametrize('cache', [(400.0, 'cache'), None])
def test_roofline_is_drawn_with_or_without_a_cache_roof(cache):
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig = roofline.draw({'float32': 100.0, 'bfloat16': None}, {'dot product': (0.25, 5.0),
                        'matmul float32': (300.0, 80.0)}, (40.0, 'memory'), cache, 'test',
                        kernels=['dot product'])
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert ('cache' in labels) == (cache is not None) and 'memory' in labels
    plt.close(fig)


def test_scratch_file_is_read_and_removed():
    scratch = storage.ScratchFile(1)
    assert scratch.path.stat().st_size == 2**20
    fd, how, why = storage.open_uncached(scratch.path)
    try:
        buffer = storage.aligned_buffer(storage.BLOCK)
        assert storage.read_at(fd, buffer, 5 * storage.BLOCK) == storage.BLOCK
        assert bytes(buffer) == scratch.path.read_bytes()[5 * storage.BLOCK:6 * storage.BLOCK]
        assert storage.describe(how, why)
    finally:
        os.close(fd)
    scratch.close()
    assert not scratch.path.exists()


# ------------------------------------------------------------- the two-thread probe's pinning
def test_cpu_lists_are_read_as_sysfs_writes_them():
    assert hardware._cpus_in('0-3,8\n') == {0, 1, 2, 3, 8}
    assert hardware._cpus_in('5') == {5} and hardware._cpus_in('') == set()


def test_smt_pair_is_two_siblings_this_process_may_use(monkeypatch, tmp_path):
    pair = hardware.smt_pair()
    assert pair is None or (len(pair) == 2 and set(pair) <= os.sched_getaffinity(0))
    if not hasattr(os, 'sched_setaffinity'):
        return
    for cpu, listed in ((0, '0,8'), (1, '1,9'), (8, '0,8'), (9, '1,9')):  # 2 cores, SMT
        topology = tmp_path / f'cpu{cpu}' / 'topology'
        topology.mkdir(parents=True)
        (topology / 'thread_siblings_list').write_text(listed + '\n')
    monkeypatch.setattr(hardware, 'SYS_CPU', tmp_path)
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1, 8, 9})
    assert hardware.smt_pair() == [0, 8]
    monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1})  # no sibling allowed
    assert hardware.smt_pair() is None


def test_throughput_pins_each_thread_to_its_cpu():
    if not hasattr(os, 'sched_setaffinity'):
        pytest.skip('no os.sched_setaffinity here')
    cpu = min(os.sched_getaffinity(0))
    seen = set()
    assert hardware._throughput(lambda: seen.add(frozenset(os.sched_getaffinity(0))), 1, 0.02,
                                [cpu]) > 0
    assert seen == {frozenset({cpu})}
    assert hardware._throughput(lambda: None, 2, 0.02) > 0  # unpinned
