"""Notebook 03 (automatic parallelism): what its default run recorded, its refusals of bad
parameters, its plans for the machines learners use, and its run without TorchScript.

Timings are never compared with fixed numbers. The claims checked are those that hold on any
machine: two lanes are timed alone and together, the overlap's account adds up, a copy worth
overlapping is chosen, and an overlapped copy takes between the larger of its parts and their
sum, as far as the noise rule can tell them apart."""
import pytest
import torch

import hardware
import parameters
import plan_03
import sizing
import stats

ON_GPU = torch.cuda.is_available()
NB03 = '03_automatic_parallelism'


def test_03_default_run_overlaps_a_copy_worth_overlapping(default_run):
    _, r = default_run(NB03)
    t = r['overlap_s']
    compute, copy, overlapped = t['compute'], t['copy'], t[r['overlapped_variant']]
    assert copy >= compute / 3, f'the copy must be at least a third of the compute: {t}'
    # Between the larger part and the sum, unless the rounds cannot tell them apart: the old
    # bounds on the medians alone would fail on noise (and the lanes may slow each other).
    rounds = r['overlap_rounds_s']
    parts = [a + b for a, b in zip(rounds['compute'], rounds['copy'])]
    larger = [max(a, b) for a, b in zip(rounds['compute'], rounds['copy'])]
    over = rounds[r['overlapped_variant']]
    assert stats.compare(over, parts, 'overlapped', 'sum').a_is_better is not False, rounds
    assert stats.compare(over, larger, 'overlapped', 'larger').a_is_better is not True, rounds
    assert r['overlap_within_bounds'] is (0.95 * max(compute, copy) <= overlapped
                                          <= compute + copy)
    expected = 'copy on a second stream' if ON_GPU else 'copy in a second thread'
    assert r['overlapped_variant'] == expected
    assert r['pinned_memory_available'] is ON_GPU
    assert (r['book_non_blocking'] != {}) is ON_GPU, 'the book\'s call is timed on a GPU only'
    assert 1 <= r['copy_inner_dim'] <= r['copy_size']
    assert 0 <= r['profiled_copy_overlap_share'] <= 1


def test_03_overlap_has_one_account_that_adds_up(default_run):
    """The time saved by overlapping is exactly what both lanes hid, less each lane's stretch
    and the gaps when neither worked (issue 19: lesson and exercise tell one story)."""
    _, r = default_run(NB03)
    terms = dict(r['overlap_account_s'])
    saved = terms.pop('time saved')
    assert set(terms) == {'both busy', 'compute stretch', 'copy stretch', 'neither busy'}
    assert sum(terms.values()) == pytest.approx(saved, abs=1e-9)
    busy = r['lane_busy_s'][r['overlapped_variant']]
    assert 0 <= busy['both'] <= min(busy['compute'], busy['copy']) <= busy['wall']
    assert 0 <= r['clock_copy_overlap_share'] <= 1 and r['copy_hidden_share'] <= 1
    for alone, idle_lane in (('compute', 'copy'), ('copy', 'compute')):
        assert r['lane_busy_s'][alone][idle_lane] == 0 and r['lane_busy_s'][alone]['both'] == 0


def test_03_default_run_measures_lanes_and_exercises(default_run):
    _, r = default_run(NB03)
    expected = 'two GPUs' if torch.cuda.device_count() > 1 else (
        'one GPU and the CPU' if ON_GPU else 'two CPU threads')
    assert r['scenario'] == expected and len(r['alone_s']) == 2
    assert r['parallel_speedup'] > 0 and r['ideal_speedup'] >= 1
    assert (r['all_cores_sequential_s'] is not None) is (expected == 'two CPU threads')
    assert set(r['two_thread_scaling']) == {'compute', 'latency'}, 'the probe is cited'
    assert len(r['per_product_s']) == 4 and r['run_vs_sequential_products'] > 0
    assert set(r['small_ops_s']) >= {'one thread', 'two threads', 'one thread, 256x256',
                                     'two threads, 256x256'}
    assert set(r['three_stages_s']) == {'one stage after the other', 'pipelined'}
    assert r['diamond_s']['parallel'] > 0 and r['diamond_s']['sequential'] > 0
    assert r['mechanism'] == 'auto'
    assert len(r['planned_lane_s']) == 2 and min(r['planned_lane_s']) > 0
    assert r['probe_above_two'] is hardware.above_two(r['two_thread_scaling'])
    assert len(r['three_stages_alone_s']) == 2 and 1 <= r['pipeline_ideal'] <= 2
    assert set(r['lane_slowed']) == {'compute', 'copy'}


def test_03_runs_without_torchscript(run_notebook):
    """mechanism='threads' is the branch a PyTorch without TorchScript takes: exercise 2 is
    answered by Python threads at two operator sizes. Small sizes keep it cheap."""
    r = run_notebook(NB03, mechanism='threads', matrix_size=128, num_matmuls=10,
                     copy_size=256, copy_steps=10)
    assert r['mechanism'] == 'threads'
    assert set(r['small_ops_s']) == {'one thread', 'two threads', 'one thread, 256x256',
                                     'two threads, 256x256'}
    assert r['copy_steps'] == 10 and r['copy_size'] == 256
    if not ON_GPU:
        assert r['lane_sizes'] == [128, 128]


@pytest.mark.parametrize('params, message', [
    ({'num_matmuls': 0}, 'num_matmuls must be an integer >= 1'),
    ({'matrix_size': -4}, 'matrix_size must be an integer >= 1'),
    ({'copy_size': 64, 'copy_inner_dim': 128}, 'copy_inner_dim=128 is larger than copy_size=64'),
    ({'copy_size': 60000, 'copy_steps': 50}, 'copy_steps=50 results of copy_size=60000 need'),
    ({'mechanism': 'torchscript'}, "mechanism must be one of ['auto', 'threads']"),
])
def test_03_refuses_bad_parameters_by_name(refusal, params, message):
    error = refusal(NB03, **params)
    assert error is not None and message in error, error


def test_setup_03_checks_before_it_probes(monkeypatch):
    monkeypatch.setattr(plan_03, 'probe', lambda: pytest.fail('probed before checking'))
    with pytest.raises(ValueError, match='copy_inner_dim=9 is larger than copy_size=8'):
        plan_03.setup(copy_size=8, copy_inner_dim=9)
    with pytest.raises(ValueError, match='mechanism'):
        plan_03.setup(mechanism='fork')


def test_plan_03_on_a_t4_fits_colabs_host_and_balances_the_lanes():
    """At the book's 4000 a CPU lane would take 20-30 minutes on Colab's two cores, and 50
    pinned results of 64 MB, twice, would crowd its 12.7 GB of host memory."""
    m = hardware.DESCRIBED['colab-t4']
    plan = plan_03.plan_for(m)
    assert plan['matrix_size'] == plan_03.BOOK_03_SIZE, 'the GPU lane keeps the book\'s size'
    gpu_run = 50 * 2 * plan['matrix_size']**3 / m.flops
    cpu_run = 50 * 2 * plan['cpu_matrix_size']**3 / m.host_flops
    assert 0.5 < cpu_run / gpu_run < 2, (cpu_run, gpu_run)
    assert plan['copy_steps'] < 50 and plan.host_bytes <= 0.35 * m.host_memory, plan
    assert plan.device_bytes <= 0.8 * m.memory and plan.seconds <= 0.5 * sizing.budget('03', m)


def test_plan_03_keeps_the_books_scale_on_an_h100_and_fits_a_cpu():
    h100 = hardware.DESCRIBED['h100']
    plan = plan_03.plan_for(h100)
    assert plan['matrix_size'] == 4000 and plan['copy_steps'] == 50, plan
    assert plan.host_bytes <= 0.35 * h100.host_memory and plan.device_bytes <= h100.memory
    cpu = hardware.DESCRIBED['cpu-2core']
    plan = plan_03.plan_for(cpu)
    assert plan.seconds <= 0.5 * sizing.budget('03', cpu), plan
    assert plan['matrix_size'] <= 768 and plan['copy_steps'] == 50
    slow = hardware.Machine('slow CPU', 'cpu', flops=2e10, memory=cpu.memory, host_flops=2e10,
                          host_memory=cpu.host_memory, host_cores=2)
    assert plan_03.plan_for(slow)['matrix_size'] < plan['matrix_size'], 'a slower CPU gets less'


def test_03_refuses_an_older_torch_by_name(monkeypatch):
    with pytest.raises(RuntimeError, match=r'torch>=2\.9 .*torch 2\.8\.0'):
        parameters.check_torch(*plan_03.MIN_TORCH, installed='2.8.0')
    monkeypatch.setattr(plan_03, 'probe', lambda: pytest.fail('probed before checking torch'))
    monkeypatch.setattr(torch, '__version__', '2.8.0+cpu')
    with pytest.raises(RuntimeError, match='torch>=2.9'):
        plan_03.setup()


def described_timer(machine, cpu_share=0.3):
    """One `run` on a described machine: a GPU at its rate from n = 2048 up; a CPU lane at
    `cpu_share` of the all-core probe beside a GPU (the H200 run gave its lane 94 of 331
    GFLOP/s), or of one core's share on a CPU-only machine. Smaller products run slower."""
    def timer(n, kind, num_matmuls, threads):
        rate = (machine.flops if kind == 'cuda' else cpu_share * (
            machine.host_flops if machine.on_gpu else machine.host_flops / machine.host_cores))
        rate *= min(1.0, (n / (2048 if kind == 'cuda' else 512)) ** 0.5)
        return plan_03.run_flops(n, num_matmuls) / rate
    return timer


@pytest.mark.parametrize('name', sorted(hardware.DESCRIBED))
def test_plan_03_balances_the_lanes_and_fits_the_budget_on_every_described_machine(name):
    """Issue 24: the CPU lane was sized from the all-core probe and ran at a fraction of it,
    3.5x the GPU lane. Sized from one timed `run`, the planned lanes, and the lanes as the
    timer would run them, are within 1.5x of each other, and the plan fits the budget."""
    m = hardware.DESCRIBED[name]
    timer = described_timer(m)
    given = dict.fromkeys(('matrix_size', 'cpu_matrix_size'))
    plan, rates = plan_03.sized_lanes(m, 50, given, timer=timer, threads=m.host_cores)
    lanes = plan['lane_s']
    assert max(lanes) <= 1.5 * min(lanes), (name, lanes)
    sizes = [plan['cpu_matrix_size'] if kind == 'cpu' else plan['matrix_size']
             for kind in plan_03.lane_kinds(m)]
    ran = [timer(n, kind, 50, 1) for n, kind in zip(sizes, plan_03.lane_kinds(m))]
    assert max(ran) <= 1.5 * min(ran), (name, sizes, ran)
    assert plan.seconds <= sizing.budget('03', m), (name, plan)
    assert plan.host_bytes <= 0.35 * m.host_memory and plan.device_bytes <= 0.8 * m.memory
    probed = plan_03.plan_for(m)['lane_s']  # before any run is timed, too
    assert max(probed) <= 1.5 * min(probed), (name, probed)
