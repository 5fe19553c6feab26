"""Unit tests for notebooks/helpers.py, bad input included."""
import gzip
import hashlib
import io
import json
import struct
import time
import urllib.error

import pytest
import torch
from torch import nn

import fashion_mnist
import helpers as d2l
import results

CPU = torch.device('cpu')
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')


@pytest.fixture
def cpu_only(monkeypatch):
    """This machine as a CPU-only one, whatever it has: the fallbacks are tested everywhere."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 0)


# -------------------------------------------------------------- parameters, devices
@pytest.mark.parametrize('bad', [0, -1, 1.5, '2', True, None])
def test_check_int_names_the_parameter(bad):
    with pytest.raises(ValueError, match='num_gpus'):
        d2l.check_int('num_gpus', bad)


def test_check_int_and_choice_accept_good_values():
    assert d2l.check_int('n', 3) == 3
    assert d2l.check_int('n', None, allow_none=True) is None
    assert d2l.check_int('n', 0, minimum=0) == 0
    assert d2l.check_choice('s', 'a', ('a', 'b')) == 'a'
    with pytest.raises(ValueError, match="source must be one of"):
        d2l.check_choice('source', 'c', ('a', 'b'))


@pytest.mark.parametrize('bad', [0, -0.1, '1', True, None])
def test_check_positive_names_the_parameter(bad):
    with pytest.raises(ValueError, match='lr must be a positive number'):
        d2l.check_positive('lr', bad)


def test_check_device(cpu_only):
    assert d2l.check_device('device', None) == CPU
    assert d2l.check_device('device', 'cpu') == CPU
    for bad, message in (('cuda:2', 'has 0 GPU'), ('gpu0', 'not a device name'),
                         ('meta', 'only cpu and cuda')):
        with pytest.raises(ValueError, match=f"device='{bad}'.*{message}"):
            d2l.check_device('device', bad)


def test_try_gpu_falls_back_to_cpu_and_rejects_negative_index(cpu_only):
    assert d2l.try_gpu() == CPU  # no GPU (made so by cpu_only)
    assert d2l.try_gpu(5) == CPU
    with pytest.raises(ValueError, match='i must be'):
        d2l.try_gpu(-1)


def test_try_all_gpus_is_never_empty(cpu_only):
    assert d2l.try_all_gpus() == [CPU]


@needs_gpu
def test_the_gpus_there_are_are_found():
    assert d2l.try_gpu() == torch.device('cuda:0')
    assert d2l.try_all_gpus() == [torch.device(f'cuda:{i}')
                                  for i in range(torch.cuda.device_count())]
    assert d2l.check_device('device', None).type == 'cuda'
    assert d2l.environment()['gpus'] and d2l.environment()['device'] != 'CPU'
    d2l.synchronize()


def test_resolve_devices_emulates_on_cpu(capsys, cpu_only):
    assert d2l.resolve_devices(3) == [CPU] * 3
    assert d2l.resolve_devices(1) == [CPU]
    out = capsys.readouterr().out
    assert 'asked for 3 GPU(s), found 0: emulating 3 replicas on the CPU' in out
    assert 'asked for 1 GPU(s), found 0: using the CPU' in out


def test_resolve_devices_shares_the_gpus_there_are(monkeypatch, capsys):
    monkeypatch.setattr(d2l, 'num_gpus', lambda: 2)
    assert d2l.resolve_devices(2) == [torch.device('cuda:0'), torch.device('cuda:1')]
    assert d2l.resolve_devices(3) == [torch.device(f'cuda:{i}') for i in (0, 1, 0)]
    assert 'asked for 3 GPUs, found 2' in capsys.readouterr().out


@pytest.mark.parametrize('bad', [0, -2, 2.0, 'two'])
def test_resolve_devices_rejects_bad_counts(bad):
    with pytest.raises(ValueError, match='num_devices'):
        d2l.resolve_devices(bad)


def test_synchronize_works_on_cpu():
    d2l.synchronize(CPU)
    d2l.synchronize('cpu')
    d2l.synchronize()


def test_environment_describes_the_machine(cpu_only):
    env = d2l.environment()
    assert env['torch'] == torch.__version__ and env['num_threads'] >= 1 and env['gpus'] == []


# ----------------------------------------------------------------------- timing
def test_timer_accumulates():
    timer = d2l.Timer()
    time.sleep(0.01)
    timer.stop()
    timer.start()
    timer.stop()
    assert len(timer.times) == 2 and timer.sum() >= 0.01
    assert timer.cumsum()[-1] == pytest.approx(timer.sum())
    assert timer.avg() == pytest.approx(timer.sum() / 2)


def test_benchmark_context_manager_prints_and_keeps_elapsed(capsys):
    with d2l.Benchmark('sleeping', device='cpu') as b:
        time.sleep(0.02)
    assert b.elapsed >= 0.02
    assert capsys.readouterr().out.startswith('sleeping: 0.0')


def test_measure_warms_up_repeats_and_reports_median():
    calls = []
    m = d2l.measure(lambda: calls.append(time.sleep(0.002)), warmup=2, repeats=5, number=1)
    assert len(calls) == 2 + 5 and len(m.times) == 5
    assert 0.002 <= m.median < 1 and m.num_threads == torch.get_num_threads()
    assert 'median' in str(m) and 'threads' in str(m)


def test_measure_picks_a_number_for_fast_functions():
    calls = []
    m = d2l.measure(lambda: calls.append(1), warmup=0, repeats=3, min_time=0.005)
    assert len(calls) > 100 and m.median < 1e-4


@pytest.mark.parametrize('kwargs', [{'repeats': 0}, {'warmup': -1}, {'number': 0}])
def test_measure_rejects_bad_counts(kwargs):
    with pytest.raises(ValueError):
        d2l.measure(lambda: None, **kwargs)


def test_num_threads_restores_the_previous_count_even_on_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError, match='inside'):
        with d2l.num_threads(1):
            assert torch.get_num_threads() == 1
            raise RuntimeError('inside')
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match='n must be'):
        with d2l.num_threads(0):
            pass
    assert torch.get_num_threads() == before and d2l.cores_per_process(10**6) == 1


def test_with_defaults_merges_and_names_unknown_settings():
    assert d2l.with_defaults({'a': 2}, {'a': 1, 'b': 3}) == {'a': 2, 'b': 3}
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['c'\]"):
        d2l.with_defaults({'c': 1}, {'a': 1})


def test_format_seconds():
    assert d2l.format_seconds(2.5) == '2.5 s'
    assert d2l.format_seconds(1.5e-5) == '15 us'
    assert d2l.format_seconds(3e-8) == '30 ns'
    assert d2l.format_seconds(0.0009996) == '1 ms'  # rounds up into the next unit


# ---------------------------------------------------------------------- plotting
def test_plot_save_fig_and_animator(tmp_path, monkeypatch):
    import matplotlib
    matplotlib.use('Agg')
    monkeypatch.setattr(d2l, 'FIGURES_DIR', tmp_path / 'figs')
    ax = d2l.plot([1, 2, 3], [[1, 4, 9], [1, 2, 3]], 'x', 'y', legend=['sq', 'id'])
    assert len(ax.lines) == 2
    path = d2l.save_fig('test_plot')
    assert path == tmp_path / 'figs' / 'test_plot.png' and path.stat().st_size > 1000
    animator = d2l.Animator(xlabel='epoch', legend=['loss', 'acc'])
    for epoch in range(3):
        animator.add(epoch, (1.0 / (epoch + 1), None if epoch == 0 else 0.5))
    assert animator.X == [[0, 1, 2], [1, 2]] and animator.Y[0] == [1.0, 0.5, 1 / 3]
    assert animator.handle is None  # not in a notebook: nothing displayed


# -------------------------------------------------------------------------- data
def write_idx(path, array, gz=True, truncate=0):
    header = struct.pack('>BBBB', 0, 0, 8, array.dim()) + struct.pack(
        f'>{array.dim()}I', *array.shape)
    data = header + bytes(array.flatten().tolist())
    data = data[:len(data) - truncate]
    path.write_bytes(gzip.compress(data) if gz else data)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def idx_root(tmp_path):
    """Small Fashion-MNIST-shaped IDX files (12 train, 5 test) and their checksums."""
    g = torch.Generator().manual_seed(0)
    sums = {}
    for split, n in (('train', 12), ('t10k', 5)):
        images = torch.randint(0, 256, (n, 28, 28), generator=g, dtype=torch.uint8)
        labels = torch.arange(n, dtype=torch.uint8) % 10
        sums[f'{split}-images-idx3-ubyte.gz'] = write_idx(
            tmp_path / f'{split}-images-idx3-ubyte.gz', images)
        sums[f'{split}-labels-idx1-ubyte.gz'] = write_idx(
            tmp_path / f'{split}-labels-idx1-ubyte.gz', labels)
    return tmp_path, sums


def test_read_fashion_mnist_reads_verified_idx_files(idx_root):
    root, sums = idx_root
    Xtr, ytr, Xte, yte = d2l.read_fashion_mnist(root, download=False, checksums=sums)
    assert Xtr.shape == (12, 28, 28) and Xtr.dtype == torch.uint8
    assert ytr.tolist() == [i % 10 for i in range(12)] and Xte.shape == (5, 28, 28)


def test_datasets_and_loaders_from_real_files(idx_root, monkeypatch):
    root, sums = idx_root
    monkeypatch.setattr(fashion_mnist, 'FASHION_MNIST_SHA256', sums)
    train, test = d2l.fashion_mnist_datasets('real', root=root, download=False, num_train=10)
    X, y = train[0]
    assert len(train) == 10 and len(test) == 5 and X.shape == (1, 28, 28)
    assert 0 <= X.min() and X.max() <= 1 and y.dtype == torch.int64
    train_iter, test_iter = d2l.load_data_fashion_mnist(4, resize=32, root=root, download=False)
    X, y = next(iter(train_iter))
    assert X.shape == (4, 1, 32, 32) and y.shape == (4,)
    assert sum(len(b[1]) for b in test_iter) == 5


def test_checksum_mismatch_names_the_file(idx_root):
    root, sums = idx_root
    sums['t10k-labels-idx1-ubyte.gz'] = '0' * 64
    with pytest.raises(ValueError, match='t10k-labels-idx1-ubyte.gz: SHA-256 mismatch'):
        d2l.read_fashion_mnist(root, download=False, checksums=sums)


def test_corrupted_gzip_names_the_file(idx_root):
    root, sums = idx_root
    path = root / 'train-images-idx3-ubyte.gz'
    path.write_bytes(path.read_bytes()[:200])  # cut mid-stream
    with pytest.raises(ValueError, match='train-images-idx3-ubyte.gz: cannot read IDX'):
        d2l.read_fashion_mnist(root, download=False, checksums=None)


def test_truncated_idx_names_the_file(tmp_path):
    path = tmp_path / 'images.idx'
    write_idx(path, torch.zeros(3, 28, 28, dtype=torch.uint8), gz=False, truncate=10)
    with pytest.raises(ValueError, match='images.idx: truncated or corrupted'):
        d2l.read_idx(path)


def test_wrong_magic_names_the_file(tmp_path):
    path = tmp_path / 'junk.idx'
    path.write_bytes(b'not an idx file at all')
    with pytest.raises(ValueError, match='junk.idx: not an IDX file'):
        d2l.read_idx(path)


def test_missing_data_without_fallback_says_how_to_proceed(tmp_path):
    with pytest.raises(d2l.DataUnavailableError, match='source="synthetic"'):
        d2l.fashion_mnist_datasets('real', root=tmp_path, download=False)


def test_failed_download_leaves_nothing_behind(tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError('no network')
    monkeypatch.setattr(fashion_mnist.urllib.request, 'urlopen', offline)
    with pytest.raises(d2l.DataUnavailableError, match='could not be downloaded'):
        d2l.read_fashion_mnist(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_download_with_bad_checksum_is_not_saved(tmp_path, monkeypatch):
    monkeypatch.setattr(fashion_mnist.urllib.request, 'urlopen',
                        lambda *a, **k: io.BytesIO(b'tampered bytes'))
    with pytest.raises(ValueError, match='fails its SHA-256 check'):
        d2l.read_fashion_mnist(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_download_is_verified_and_cached(idx_root, tmp_path_factory, monkeypatch):
    source, sums = idx_root
    served = []

    def serve(url, timeout):
        served.append(url)
        return io.BytesIO((source / url.rsplit('/', 1)[1]).read_bytes())
    monkeypatch.setattr(fashion_mnist.urllib.request, 'urlopen', serve)
    cache = tmp_path_factory.mktemp('cache')
    first = d2l.read_fashion_mnist(cache, checksums=sums)
    second = d2l.read_fashion_mnist(cache, checksums=sums)
    assert len(served) == 4 and all(torch.equal(a, b) for a, b in zip(first, second))
    assert sorted(p.name for p in cache.iterdir()) == sorted(sums)


def test_auto_falls_back_to_announced_synthetic_data(tmp_path, capsys):
    train, test = d2l.fashion_mnist_datasets('auto', root=tmp_path, download=False,
                                             num_train=100, num_test=50)
    assert 'SYNTHETIC' in capsys.readouterr().out
    assert len(train) == 100 and len(test) == 50 and train[0][0].shape == (1, 28, 28)


def test_synthetic_data_is_deterministic_and_learnable():
    a = d2l.synthetic_fashion_mnist(2000, 500)
    b = d2l.synthetic_fashion_mnist(2000, 500)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    Xtr, ytr, Xte, yte = (t.float() for t in a)
    assert set(ytr.long().tolist()) == set(range(10))
    means = torch.stack([Xtr[ytr == c].mean(0) for c in range(10)])  # nearest class mean
    pred = torch.cdist(Xte.flatten(1), means.flatten(1)).argmin(1)
    assert (pred == yte).float().mean() > 0.6


@pytest.mark.parametrize('kwargs', [{'source': 'internet'}, {'num_train': 0}])
def test_dataset_arguments_are_validated(kwargs):
    with pytest.raises(ValueError):
        d2l.fashion_mnist_datasets(**kwargs)


def test_loader_rejects_bad_batch_size():
    with pytest.raises(ValueError, match='batch_size'):
        d2l.load_data_fashion_mnist(0, source='synthetic')


# ---------------------------------------------------------------------- training
def test_sgd_updates_in_place_and_zeroes_gradients():
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    (w * torch.tensor([3.0, 4.0])).sum().backward()
    d2l.sgd([w], lr=0.5, batch_size=2)
    assert torch.allclose(w.detach(), torch.tensor([0.25, 1.0])) and w.grad.abs().sum() == 0


def test_evaluate_accuracy_gpu_on_module_and_callable():
    X = torch.eye(10)
    y = torch.arange(10)
    y_wrong = y.clone()
    y_wrong[:3] = 9 - y_wrong[:3]
    data = [(X[:5], y_wrong[:5]), (X[5:], y_wrong[5:])]
    net = nn.Linear(10, 10, bias=False)
    nn.init.eye_(net.weight)
    assert d2l.evaluate_accuracy_gpu(net, data) == pytest.approx(0.7)
    assert d2l.evaluate_accuracy_gpu(lambda x: x, data, CPU) == pytest.approx(0.7)


def test_resnet18_shapes():
    net = d2l.resnet18(10)
    assert net(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert sum(p.numel() for p in net.parameters()) > 11_000_000


# ----------------------------------------------------------------------- record
def test_record_writes_json_atomically(tmp_path):
    assert d2l.record('99_test', {'speedup': torch.tensor(2.0), 'sizes': (1, 2),
                                  'nested': {3: [torch.tensor([1, 2])]}}, tmp_path) is None
    path = tmp_path / '99_test.json'  # a cell ending in record() displays nothing
    payload = json.loads(path.read_text())
    assert payload['results'] == {'speedup': 2.0, 'sizes': [1, 2], 'nested': {'3': [[1, 2]]}}
    assert payload['environment']['torch'] == torch.__version__
    assert [p.name for p in tmp_path.iterdir()] == ['99_test.json']


def test_record_adds_each_sections_numbers_in_one_run(tmp_path, monkeypatch):
    """Sections record where they measure: the file gathers this process's numbers, and a new
    process (a new kernel) starts it afresh, so no number survives from an earlier run."""
    monkeypatch.setattr(results, '_RECORDED', {})
    d2l.record('98_test', {'first': 1}, tmp_path)
    d2l.record('98_test', {'second': 2, 'first': 3}, tmp_path)
    path = tmp_path / '98_test.json'
    assert json.loads(path.read_text())['results'] == {'first': 3, 'second': 2}
    monkeypatch.setattr(results, '_RECORDED', {})  # as a new kernel would
    d2l.record('98_test', {'third': 4}, tmp_path)
    assert json.loads(path.read_text())['results'] == {'third': 4}


# ------------------------------------------------------------------ d2l's names
def test_d2l_names_the_chapter_uses_exist_with_d2l_signatures():
    import inspect
    sig = lambda f: list(inspect.signature(f).parameters)
    assert sig(d2l.Residual)[:3] == ['num_channels', 'use_1x1conv', 'strides']
    assert inspect.signature(d2l.Residual).parameters['use_1x1conv'].default is False
    assert sig(d2l.resnet18)[:2] == ['num_classes', 'in_channels']
    assert sig(d2l.split_batch) == ['X', 'y', 'devices']
    assert sig(d2l.evaluate_accuracy_gpu) == ['net', 'data_iter', 'device']
    assert sig(d2l.load_data_fashion_mnist)[:2] == ['batch_size', 'resize']
    assert sig(d2l.sgd) == ['params', 'lr', 'batch_size'] and sig(d2l.try_gpu) == ['i']
    assert sig(d2l.Benchmark)[0] == 'description' and sig(d2l.Accumulator) == ['n']
    assert d2l.cpu() == CPU and d2l.gpu(1) == torch.device('cuda:1')


def test_book_style_residual_is_lazy_and_resnet18_is_complete():
    block = d2l.Residual(8, use_1x1conv=True, strides=2)  # d2l 1.0: input size learnt lazily
    assert block(torch.randn(2, 3, 8, 8)).shape == (2, 8, 4, 4)
    net = d2l.resnet18(10)
    assert not any(isinstance(p, nn.parameter.UninitializedParameter) for p in net.parameters())
    assert [n for n, _ in net.named_children()][3:] == [
        'resnet_block1', 'resnet_block2', 'resnet_block3', 'resnet_block4', 'global_avg_pool',
        'fc']
    narrow = d2l.resnet18(10, width=8)
    assert narrow(torch.randn(2, 1, 28, 28)).shape == (2, 10)
    assert narrow.fc[1].in_features == 64 and net.fc[1].in_features == 512
    with pytest.raises(ValueError, match='width'):
        d2l.resnet18(10, width=0)


def test_split_batch_works_on_cpu_and_uneven_batches():
    X, y = torch.arange(14.).reshape(7, 2), torch.arange(7)
    Xs, ys = d2l.split_batch(X, y, [CPU] * 3)
    assert [len(s) for s in Xs] == [3, 2, 2] and torch.equal(torch.cat(ys), y)
    with pytest.raises(ValueError, match='X has 7 examples but y has 6'):
        d2l.split_batch(X, y[:6], [CPU])
    with pytest.raises(ValueError, match='cannot feed 8 devices'):
        d2l.split_batch(X, y, [CPU] * 8)


def test_accumulator_and_accuracy_count_like_d2l():
    metric = d2l.Accumulator(2)
    y_hat, y = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]]), torch.tensor([1, 1, 1])
    metric.add(d2l.accuracy(y_hat, y), y.numel())
    metric.add(1, 1)
    assert metric[0] == 3.0 and metric[1] == 4.0
    metric.reset()
    assert metric.data == [0.0, 0.0]


def test_book_style_training_runs_on_a_cpu_only_machine(idx_root, monkeypatch, cpu_only):
    """The chapter's call pattern (12.6) under `import helpers as d2l`: a ResNet built from
    lazy Residual blocks, weights re-initialised with apply, DataParallel over
    [d2l.try_gpu(i) ...], the default data loader, an Animator and a Timer."""
    root, sums = idx_root
    monkeypatch.setattr(fashion_mnist, 'DATA_DIR', root)
    monkeypatch.setattr(fashion_mnist, 'FASHION_MNIST_SHA256', sums)
    fashion_mnist._loaded.clear()
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        d2l.Residual(8), d2l.Residual(16, use_1x1conv=True, strides=2),
                        nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(), nn.Linear(16, 10))
    net(torch.zeros(1, 1, 28, 28))  # materialise the lazy layers, as a first batch would

    def init_weights(module):
        if type(module) in [nn.Linear, nn.Conv2d]:
            nn.init.normal_(module.weight, std=0.01)
    net.apply(init_weights)
    devices = [d2l.try_gpu(i) for i in range(2)]
    model = nn.DataParallel(net, device_ids=devices)
    train_iter, test_iter = d2l.load_data_fashion_mnist(4)
    trainer, loss = torch.optim.SGD(model.parameters(), 0.1), nn.CrossEntropyLoss()
    timer, animator = d2l.Timer(), d2l.Animator('epoch', 'test acc', xlim=[1, 2])
    for epoch in range(2):
        model.train()
        timer.start()
        for X, y in train_iter:
            trainer.zero_grad()
            loss(model(X.to(devices[0])), y.to(devices[0])).backward()
            trainer.step()
        timer.stop()
        animator.add(epoch + 1, (d2l.evaluate_accuracy_gpu(model, test_iter),))
    assert len(animator.Y[0]) == 2 and 0 <= animator.Y[0][-1] <= 1 and timer.avg() > 0
    fashion_mnist._loaded.clear()


# ------------------------------------------------------- list parameters, root, progress
@pytest.mark.parametrize('value, expected', [([1, 4], [1, 4]), ((2,), [2]), ('[1,4]', [1, 4]),
                                             ('1, 4', [1, 4]), (3, [3]), ('8', [8])])
def test_check_list_accepts_lists_and_their_text(value, expected):
    assert d2l.check_list('queue_lengths', value, d2l.check_int) == expected


@pytest.mark.parametrize('value, message', [('[1,', 'pass lists to papermill with -y'),
                                            ('abc', 'is not a list'),
                                            ({'a': 1}, 'must be a list'),
                                            ([1, 0], 'each of queue_lengths')])
def test_check_list_refuses_by_name(value, message):
    with pytest.raises(ValueError, match=message):
        d2l.check_list('queue_lengths', value, d2l.check_int)


def test_course_root_is_the_repository_here_and_the_working_directory_elsewhere(tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    assert d2l.ROOT == Path(d2l.__file__).resolve().parent.parent
    for module in ('helpers.py', 'stats.py', 'paths.py', 'parameters.py', 'fashion_mnist.py',
                   'results.py'):  # helpers and what it imports
        (tmp_path / module).write_text((Path(d2l.__file__).parent / module).read_text())
    probe = 'import helpers, pathlib; print(helpers.ROOT == pathlib.Path.cwd().resolve())'
    out = subprocess.run([sys.executable, '-c', probe], cwd=tmp_path, capture_output=True,
                         text=True, env={'PATH': '/usr/bin:/bin'}, timeout=60)
    assert out.stdout.strip() == 'True', out.stderr[-1000:]


def test_synthetic_data_is_cached_on_disk_and_a_bad_cache_is_redrawn(tmp_path, monkeypatch):
    monkeypatch.setattr(fashion_mnist, 'DATA_DIR', tmp_path / 'fashion-mnist')
    calls = []
    draw = fashion_mnist.synthetic_fashion_mnist
    monkeypatch.setattr(fashion_mnist, 'synthetic_fashion_mnist',
                        lambda: calls.append(1) or draw(50, 20))
    first = fashion_mnist._synthetic_cached()
    (cache,) = tmp_path.glob('synthetic-fashion-mnist-*.pt')
    second = fashion_mnist._synthetic_cached()
    assert len(calls) == 1 and all(torch.equal(a, b) for a, b in zip(first, second))
    cache.write_bytes(b'truncated')
    third = fashion_mnist._synthetic_cached()
    assert len(calls) == 2 and all(torch.equal(a, b) for a, b in zip(first, third))
    assert [p.name for p in tmp_path.iterdir()] == [cache.name]  # no temporary files left


# ------------------------------------------------ GPU helpers (notebooks 02 and 03 use them)
def test_device_timer_times_the_block_on_a_cpu():
    with d2l.device_timer('cpu') as t:
        torch.randn(256, 256) @ torch.randn(256, 256)
    assert 0 < t['seconds'] < 5


def test_pinned_buffers_say_why_not_and_leave_nothing(monkeypatch):
    if not torch.cuda.is_available():
        buffers, why = d2l.pinned_buffers(2, (4, 4))
        assert buffers is None and 'no CUDA device' in why
    made = []

    def refuse_the_third(*args, **kwargs):
        if len(made) == 2:
            raise RuntimeError('CUDA error: out of memory\nmore detail')
        made.append(torch.zeros(*args[:1]))
        return made[-1]
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch, 'empty', refuse_the_third)
    buffers, why = d2l.pinned_buffers(4, (4, 4))
    assert buffers is None and why == 'pin_memory failed: CUDA error: out of memory'
    with pytest.raises(ValueError, match='count'):
        d2l.pinned_buffers(0, (4, 4))


def test_peak_memory_is_none_on_a_cpu_and_try_script_gives_reasons():
    with d2l.peak_memory('cpu') as peak:
        torch.zeros(1000)
    assert peak['bytes'] is None

    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2
    scripted, why = d2l.try_script(double)
    assert why is None and torch.equal(scripted(torch.ones(2)), torch.full((2,), 2.0))

    def unscriptable(x):
        return {frozenset([1]): x}  # TorchScript has no frozenset
    scripted, why = d2l.try_script(unscriptable)
    assert scripted is None and why.startswith('torch.jit.script failed')


def test_measure_in_turns_alternates_and_keeps_every_round():
    calls = []
    fns = {'a': lambda: calls.append('a'), 'b': lambda: calls.append('b')}
    m = d2l.measure_in_turns(fns, warmup=1, repeats=3)
    assert calls == ['a', 'b'] + ['a', 'b'] * 3, 'warm-up, then one call of each per round'
    assert set(m) == {'a', 'b'} and all(len(x.times) == 3 and x.label == k for k, x in m.items())
    calls.clear()
    m = d2l.measure_in_turns({'a': fns['a']}, warmup=0, repeats=2, min_time=0.005)
    assert len(calls) > 3, 'min_time calls a fast function several times per timing'
    assert all(t > 0 for t in m['a'].times)
    for bad in ({'warmup': -1}, {'repeats': 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            d2l.measure_in_turns(fns, **bad)
    with pytest.raises(ValueError, match='at least one function'):
        d2l.measure_in_turns({})


def test_cores_busy_counts_this_processs_cpu_time_over_the_wall_time():
    assert d2l.cores_busy(lambda: time.sleep(0.01), seconds=0.05) < 0.5, 'sleeping is not busy'
    assert d2l.cores_busy(lambda: sum(range(10_000)), seconds=0.05) > 0.2, 'a Python loop is'
    with pytest.raises(ValueError, match='seconds'):
        d2l.cores_busy(lambda: None, seconds=0)


def test_environment_names_the_device_in_use():
    assert d2l.environment('cpu')['device'].startswith('CPU (')
    assert d2l.environment()['device'] == d2l.environment(d2l.try_gpu())['device']


# ------------------------------------------------------------ declared parameters
def test_a_declared_parameter_is_checked_by_its_declaration():
    import parameters
    lr = parameters.Param('lr', 0.1, 'learning rate', kind='float', positive=True)
    steps = parameters.Param('steps', 3, 'steps')
    assert parameters.check((lr, steps), {'lr': 1e-9}) == {'lr': 1e-9, 'steps': 3}
    for bad in (0, -1.0, True, '0.1'):
        with pytest.raises(ValueError, match='lr must be a positive number'):
            parameters.check((lr, steps), {'lr': bad})
    with pytest.raises(ValueError, match='steps must be an integer >= 1'):
        parameters.check((lr, steps), {'steps': 0})
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['stpes'\]"):
        parameters.check((lr, steps), {'stpes': 3})
