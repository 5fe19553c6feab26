"""Notebook 05: the chapter's equivalence claim, the book's stale allreduce, rounding against k,
the three ways to split the work, the cost of a synchronous step, the learning-rate scaling,
refusals of bad parameters, a device count (k=3) that does not divide 256, and the plan and
setup that size the defaults."""
import os

import pytest

import hardware
import plan_05
import sizing

NAME = '05_multi_gpu_from_scratch'


def test_05_default_run_checks_the_claim_at_each_precision(default_run):
    _, r = default_run(NAME)
    assert r['num_gpus'] == 2 and len(r['devices']) == 2
    assert r['emulated'] == (r['gpus_found'] < 2)
    assert r['equivalence_precision'] == 'float64'
    assert r['equivalence_max_diff'] < 1e-10 and r['equivalence_uneven_max_diff'] < 1e-10
    for precision in ('equivalence_fp32', 'equivalence_tf32'):
        worst = max(r[precision]['max_diff'], r[precision]['uneven_max_diff'])
        assert 0 < r[precision]['moved'] and worst < 0.1 * r[precision]['moved'], precision
    assert set(r['seconds_per_epoch']) == set(r['test_accuracy']) == {'1', '2'}
    assert all(0 <= a <= 1 for a in r['test_accuracy'].values())
    assert r['fixed_batch_loss_gap'] < 1e-10
    assert r['replica_spread'] == 0, 'allreduce keeps the replicas bit-identical'
    assert r['sharded_allreduce_max_share'] <= 0.5 + 1e-3, 'shards must balance the bytes'
    # the split and the one-device evaluation differ only by predictions flipped at near-ties
    gap = abs(r['multi_device_accuracy'] - r['single_device_accuracy'])
    assert gap <= r['flipped_predictions_share'] + 1e-12


def test_05_default_run_splits_the_work_three_ways(default_run):
    _, r = default_run(NAME)
    idle, model = r['pipeline_idle_fraction'], r['pipeline_bubble_model']
    ms = sorted(idle, key=int)
    assert ms == ['1', '2', '4', '8'] and set(model) == set(idle)
    steps = r['pipeline_idle_steps']  # every timed step's idle share: recorded, not asserted
    assert set(steps) == set(idle) and all(0 < v < 1 for m in ms for v in steps[m])
    assert min(steps['1']) >= 0.5 - 1e-9, 'with one micro-batch the stages take turns'
    assert r['pipeline_best_m'] in map(int, ms[1:])
    assert all(abs(model[m] - 1 / (int(m) + 1)) < 1e-12 for m in ms)  # (p-1)/(m+p-1), p=2
    assert all(0 < idle[m] < 1 for m in ms)
    assert r['channel_split_max_diff'] < 1e-4, 'the channel split must equal the whole'
    moved = r['bytes_per_step']
    assert moved['data_parallel'] == 2 * 4 * plan_05.LENET_PARAMS  # the gradient, there and back
    # activations forward and their gradients back: 2 x 20x13x13 floats an example
    assert moved['pipeline'] == 2 * 4 * 20 * 13 * 13 * r['batch_size']


def test_05_default_run_measures_the_cost_of_a_step(default_run):
    _, r = default_run(NAME)
    sync = r['sync_step']
    t1 = {int(b): s for b, s in sync['t1_s_by_batch'].items()}
    assert min(t1) == 1 and max(t1) == max(plan_05.T1_LARGEST_05, r['batch_size'])  # 1 ... 1024
    assert all(s > 0 for s in t1.values())
    assert sync['t2_s'] > 0 and sync['t2_bytes'] == 4 * plan_05.LENET_PARAMS
    hidden = sync['smallest_hidden_batch']
    assert hidden is None or t1[hidden] >= sync['t2_s']
    assert 0 < sync['latency_s'] and sync['latency_share'] == sync['latency_s'] / sync['t2_s']
    ring = {int(k): s for k, s in sync['t2_ring_model_s'].items()}
    assert ring[2] == pytest.approx(max(sync['t2_s'], sync['latency_s']))
    assert ring[2] <= ring[4] <= ring[8], 't2 grows with the number of devices'
    # autograd keeps the input and every activation: more than conv1's output (20x26x26 floats)
    assert sync['working_set_bytes_per_example'] > 4 * 20 * 26 * 26
    cheapest, turn = sync['cheapest_b'], sync['turn_b']
    assert cheapest in t1 and (turn is None or turn > cheapest)
    assert sync['t1_t2_same_hardware'] == (r['gpus_found'] >= 2 or r['gpus_found'] == 0)
    if not sync['t1_t2_same_hardware']:  # one GPU: t1 and t2 are never set against each other
        assert hidden is None
    assert set(map(int, r['accuracy_by_global_batch'])) == {64, 256, 1024}


@pytest.mark.parametrize('params, message', [
    ({'num_gpus': 0}, 'num_gpus must be an integer >= 1'),
    ({'num_gpus': -2}, 'num_gpus must be an integer >= 1'),
    ({'num_gpus': 4, 'batch_size': 3}, 'batch_size=3 < num_gpus=4'),
    ({'num_gpus': 1, 'batch_size': 1}, 'exercises need 2 replicas'),
    ({'device_counts': [1, 300]}, 'device_counts has 300 but batch_size=256'),
    ({'device_counts': [0, 2]}, 'each of device_counts must be an integer >= 1'),
    ({'device_counts': 'one, two'}, 'pass lists to papermill with -y'),
    ({'microbatches': [4]}, 'two or more'),
    ({'microbatches': '[1, 512]'}, 'each <= batch_size=256'),
    ({'sync_batches': [0]}, 'each of sync_batches must be an integer >= 1'),
    ({'num_train': 1000}, 'num_train=1000 < 1024'),
    ({'threads_per_rank': 0}, 'threads_per_rank must be an integer >= 1'),
    ({'lr': -1}, 'lr must be a positive number'),
    ({'data_source': 'web'}, 'data_source must be one of'),
])
def test_05_refuses_bad_input_before_any_work(refusal, params, message):
    error = refusal(NAME, **params)
    assert error is not None and message in error, error


def test_05_accepts_lists_as_text_and_rounds_the_batch_to_k(refusal):
    """papermill's `-p device_counts [1,3]` delivers text; the default batch adapts to k."""
    assert refusal(NAME, num_gpus=3, device_counts='[1,3]', microbatches='[1, 4]') is None
    assert refusal(NAME, num_gpus=8, sync_batches='[1, 16]') is None


def test_05_runs_three_devices_on_the_default_batch(run_notebook):
    r = run_notebook(NAME, num_gpus=3, num_train=1024, num_test=256, num_epochs=1,
                     microbatches=[1, 4], sync_batches=[1, 85])
    assert r['num_gpus'] == 3 and len(r['devices']) == 3
    assert r['batch_size'] == 255, 'the default 256 rounds to a multiple of 3'
    assert r['equivalence_max_diff'] < 1e-10 and r['equivalence_uneven_max_diff'] < 1e-10
    assert set(r['seconds_per_epoch']) == {'1', '3'}
    assert set(r['pipeline_idle_fraction']) == {'1', '4'}
    assert r['sharded_allreduce_max_share'] <= 1 / 3 + 1e-3


@pytest.mark.parametrize('k', [1, 2, 3, 8])
@pytest.mark.parametrize('machine', sorted(hardware.DESCRIBED))
def test_plan_05_fits_every_described_machine(machine, k):
    """Every machine a learner has, planned without it: the estimate, which counts the work
    that runs in CPU processes on a GPU machine too (the pipeline and its all-reduces), fits
    the budget; GPUs keep the book's scale, CPUs two epochs of a subset."""
    m = hardware.DESCRIBED[machine]
    plan = plan_05.plan_for(m, num_gpus=k, device_counts=sorted({1, k}))
    assert plan.seconds <= plan_05.HEADROOM * sizing.budget('05', m), plan
    assert 0 < plan_05.host_work_s(m) < plan.seconds
    assert plan.device_bytes < m.memory and plan.host_bytes < m.host_memory
    assert plan['num_train'] >= 4 * 256, 'the larger-batch experiment needs 4 batches'
    if m.on_gpu:
        assert plan.values == plan_05.BOOK_05, plan
    else:
        assert plan['num_epochs'] == 2 and 2000 <= plan['num_train'] < 60000, plan


def test_plan_05_shrinks_the_work_for_a_slower_machine():
    slow = hardware.DESCRIBED['cpu-2core']
    fast = hardware.DESCRIBED['cpu-16core']
    assert plan_05.plan_for(fast)['num_train'] >= plan_05.plan_for(slow)['num_train']
    t4 = hardware.DESCRIBED['colab-t4']  # 2 slow vCPUs: the CPU processes take longer there
    assert plan_05.host_work_s(t4) > plan_05.host_work_s(hardware.DESCRIBED['h100'])
    assert plan_05.plan_for(t4, num_gpus=8, device_counts=[1, 8]).seconds > \
        plan_05.plan_for(t4).seconds, 'eight emulated replicas launch eight times the kernels'


@pytest.mark.parametrize('machine', sorted(hardware.DESCRIBED))
def test_setup_05_plans_each_described_machine(monkeypatch, machine):
    """setup with the probe replaced by a described machine: its table, sizes and budget."""
    m = hardware.DESCRIBED[machine]
    monkeypatch.setattr(plan_05, 'probe', lambda: m)
    cfg = plan_05.setup()
    assert cfg.machine is m and cfg.plan.seconds <= sizing.budget('05', m)
    assert (cfg.num_epochs, cfg.num_train, cfg.num_test) == tuple(cfg.plan.values.values())
    assert cfg.chosen['epochs'] == cfg.num_epochs and len(str(cfg).splitlines()) == 4


def test_setup_05_refuses_an_older_torch(monkeypatch):
    import torch
    monkeypatch.setattr(torch, '__version__', '2.8.0')
    with pytest.raises(RuntimeError, match=r'needs torch>=2\.9.*torch 2\.8\.0'):
        plan_05.setup()


def test_05_default_run_shows_the_stale_allreduce_and_rounding(default_run):
    _, r = default_run(NAME)
    stale, right = r['stale_allreduce_one_step']['stale_allreduce'], \
        r['stale_allreduce_one_step']['allreduce']
    assert len(stale) == len(right) == r['num_gpus']
    step = r['stale_allreduce_step']  # how far one step moved the weights
    assert max(right) < 0.01 * step and stale[0] < 0.01 * step, 'device 0 holds the sum in both'
    assert all(d > 0.1 * step for d in stale[1:]), 'the other replicas step with their own shard'
    nudged = r['nudged_start']
    assert 0 <= nudged['accuracy'] <= 1 and nudged['drift'] > 0, 'a nudge of 1e-7 must grow'
    assert r['final_parameter_drift'] > 0, 'k devices sum in another order: rounding differs'
    scaling = r['lr_scaling']  # accuracies of every run at each (batch, learning rate)
    assert set(scaling) == {'batch 256, lr 0.1', 'batch 1024, lr 0.1', 'batch 1024, lr 0.4'}
    assert len(scaling['batch 256, lr 0.1']) == 3, 'k=1, k=2 and the nudged run: same work'
    assert len(scaling['batch 1024, lr 0.4']) == 2, 'two starts: repeats for the noise rule'
    assert r['scaled_lr_accuracy'] in scaling['batch 1024, lr 0.4']
    first = r['first_steps_loss']  # the two departures from the book, measured
    assert set(first) == {'book, lr 0.2', 'He, lr 0.2', 'He, lr 0.1'}
    assert all(len(curve) == 5 and all(v > 0 for v in curve) for curve in first.values())
    assert set(r['exercise_allreduce_s']) == {'allreduce', 'sharded_allreduce'}


def test_setup_05_resolves_every_parameter_for_this_machine():
    cfg = plan_05.setup()
    assert cfg.batch_size == 256 and cfg.per_device == 128 and cfg.device_counts == [1, 2]
    assert cfg.global_batches == [64, 256, 1024] and cfg.num_train >= 1024
    assert cfg.sync_batches == [2**i for i in range(11)], 'the t1 sweep reaches 1024'
    assert cfg.larger_batch_epochs == min(plan_05.LARGER_BATCH_EPOCHS_05, cfg.num_epochs)
    assert cfg.extra == 1 and cfg.k_exercise == 2
    if not cfg.on_gpu:
        assert not cfg.tf32_hardware and 'emulated' in cfg.tf32_how
        assert cfg.t1_t2_same_hardware and not cfg.t2_between_gpus
        assert cfg.t1_threads == max(1, (os.cpu_count() or 1) // 2)
    assert cfg.threads_per_rank is None and cfg.results_dir is None
    assert len(str(cfg).splitlines()) <= 7, 'the setup prints a few lines'
    three = plan_05.setup(num_gpus=3, num_train=2048, num_epochs=1, num_test=100,
                          sync_batches=[1, 4], threads_per_rank=4)
    assert three.batch_size == 255 and three.sync_batches == [1, 4, 85, 255]
    assert three.chosen['batch'] == 255, 'the book\'s 256, rounded to a multiple of 3'
    if not three.on_gpu:
        assert three.t1_threads == 4, 't1 uses the threads of one worker process'


@pytest.mark.parametrize('params, message', [
    ({'sync_batches': [128]}, 'besides b=128'),
    ({'sync_batches': [1, 5000], 'num_train': 4096}, 'sync_batches has 5000'),
    ({'num_epochs': 0}, 'num_epochs must be an integer >= 1'),
    ({'equivalence_steps': 0}, 'equivalence_steps must be an integer >= 1'),
    ({'num_gpu': 2}, r"unknown parameter\(s\) \['num_gpu'\]"),
])
def test_setup_05_refuses_by_name(params, message):
    with pytest.raises(ValueError, match=message):
        plan_05.setup(**params)


def test_pipeline_relay_idles_half_whatever_the_stage_durations():
    """With one micro-batch the stages take turns, so together they idle half the step for any
    durations: 05's m=1 agreement with (p-1)/(m+p-1) holds by construction."""
    import pipeline
    for f0, f1, b1, b0 in ((1.0, 3.0, 5.0, 2.0), (2.0, 2.0, 2.0, 2.0), (0.5, 7.0, 0.1, 9.0)):
        t = [0.0, f0, f0 + f1, f0 + f1 + b1, f0 + f1 + b1 + b0]
        events = [[(t[0], t[1], 'F'), (t[3], t[4], 'B')], [(t[1], t[2], 'F'), (t[2], t[3], 'B')]]
        idle, busy = pipeline.idle_share(events)
        assert abs(idle - 0.5) < 1e-12
        assert busy == pytest.approx([f0 + b0, f1 + b1])
    quiet = [[(0, 1, 'F')], [(0, 1, 'F')]]
    disturbed = [[(0, 1, 'F')], [(1, 2, 'F')]]
    workers = [{'events': {1: [disturbed[r], quiet[r]]}} for r in range(2)]
    idle, _, events = pipeline.quickest_step(workers, 1)
    assert idle == 0 and events == quiet


def test_pipeline_keeps_the_quickest_step_not_the_least_idle():
    """Slowing the faster stage makes a step look more balanced: it idles less, yet it is the
    disturbed one. The quickest step is the undisturbed one."""
    import pipeline
    quiet = [[(0, 1, 'F'), (1, 2, 'F')], [(1, 4, 'F'), (4, 7, 'F')]]      # span 7, busy 2 and 6
    slowed = [[(0, 2, 'F'), (2, 4, 'F')], [(2, 5, 'F'), (5, 8, 'F')]]     # span 8, busy 4 and 6
    assert pipeline.idle_share(slowed)[0] < pipeline.idle_share(quiet)[0]
    workers = [{'events': {2: [slowed[r], quiet[r]]}} for r in range(2)]
    idle, busy, events = pipeline.quickest_step(workers, 2)
    assert events == quiet and busy == [2, 6] and idle == pytest.approx(1 - 8 / 14)


def test_first_turn_is_the_first_batch_dearer_than_the_cheapest_by_the_noise_rule():
    import pipeline
    sweep = {1: [3.0, 3.1, 3.2], 2: [2.0, 2.1, 2.05], 4: [2.05, 2.1, 2.2],  # 4: within noise
             8: [2.5, 2.6, 2.7], 16: [3.0, 3.0, 3.1]}
    assert pipeline.first_turn(sweep) == (2, 8)
    assert pipeline.first_turn({1: [3.0, 3.1], 2: [2.0, 2.1], 4: [1.9, 2.0]}) == (4, None), \
        'the largest b is a candidate for the cheapest too'


def test_pipeline_helpers_measure_and_restore():
    import torch

    import pipeline
    a = [torch.zeros(3), torch.ones(2, dtype=torch.float64)]
    b = [torch.tensor([0.0, 0.5, -0.25]), torch.ones(2)]
    assert pipeline.max_difference(a, b) == 0.5 and pipeline.max_difference([], []) == 0.0
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    with pipeline.gpu_precision(tf32_convolutions=not saved[0]):
        assert torch.backends.cudnn.allow_tf32 is (not saved[0])
        assert torch.backends.cuda.matmul.allow_tf32 is False
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == saved


def test_plan_05_uses_a_measured_step_only_to_grow_the_work():
    """A quiet CPU that measures faster than the FLOP model gets more examples, still within
    the headroom; a busy one that measures slower keeps the model's plan."""
    m = hardware.DESCRIBED['cpu-2core']
    modelled, fast = plan_05.plan_for(m), plan_05.plan_for(m, example_s=0.145e-3)
    assert fast.seconds <= plan_05.HEADROOM * sizing.budget('05', m)
    assert fast['num_train'] > modelled['num_train']
    assert plan_05.plan_for(m, example_s=1.0).values == modelled.values
