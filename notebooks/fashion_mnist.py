"""Fashion-MNIST without torchvision: the real files (IDX, checked by SHA-256, cached), or an
explicit synthetic stand-in where they cannot be had (no network here, in CI or on the GPU
machine). helpers.py offers these by d2l's names (`d2l.load_data_fashion_mnist`)."""
import contextlib
import gzip
import hashlib
import inspect
import math
import os
import struct
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import torch
from torch.nn import functional as F

from parameters import check_choice, check_int
from paths import DATA_DIR

FASHION_MNIST_URL = 'http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/'
# SHA-256 of the published files, as listed in tensorflow/datasets' url_checksums/fashion_mnist.txt.
FASHION_MNIST_SHA256 = {
    'train-images-idx3-ubyte.gz':
        '3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84',
    'train-labels-idx1-ubyte.gz':
        'a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845',
    't10k-images-idx3-ubyte.gz':
        '346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073',
    't10k-labels-idx1-ubyte.gz':
        '67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5',
}


class DataUnavailableError(RuntimeError):
    """The real data set is neither on disk nor downloadable."""


def sha256(path):
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            digest.update(chunk)
    return digest.hexdigest()


def read_idx(path):
    """Read an IDX file of unsigned bytes (gzipped or not) into a uint8 tensor."""
    path = Path(path)
    try:
        with (gzip.open if path.suffix == '.gz' else open)(path, 'rb') as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise ValueError(f'{path}: cannot read IDX file ({e})') from e
    if len(data) < 4 or data[:3] != b'\x00\x00\x08':
        raise ValueError(f'{path}: not an IDX file of unsigned bytes (bad magic number)')
    header = 4 + 4 * data[3]
    if len(data) < header:
        raise ValueError(f'{path}: truncated IDX header')
    dims = struct.unpack(f'>{data[3]}I', data[4:header])
    if len(data) != header + math.prod(dims):
        raise ValueError(f'{path}: truncated or corrupted IDX file: dimensions {dims} need '
                         f'{header + math.prod(dims)} bytes, found {len(data)}')
    return torch.frombuffer(bytearray(data[header:]), dtype=torch.uint8).reshape(dims)


def _fetch(name, root, download, checksums):
    path = root / name
    expected = checksums[name] if checksums is not None else None
    if not path.exists():
        how = (f'Put the four files from https://github.com/zalandoresearch/fashion-mnist into '
               f'{root}, or pass source="synthetic" (or "auto") to use the synthetic stand-in.')
        if not download:
            raise DataUnavailableError(f'Fashion-MNIST file {path} is missing. {how}')
        root.mkdir(parents=True, exist_ok=True)
        fd, part = tempfile.mkstemp(dir=root, suffix='.part')
        try:
            with os.fdopen(fd, 'wb') as f, urllib.request.urlopen(FASHION_MNIST_URL + name,
                                                                  timeout=30) as r:
                f.write(r.read())
            if expected is not None and sha256(part) != expected:
                raise ValueError(f'{FASHION_MNIST_URL + name}: downloaded file fails its SHA-256 '
                                 f'check (expected {expected}, found {sha256(part)}); not saved')
            os.replace(part, path)  # only a complete, verified download gets the real name
        except (urllib.error.URLError, OSError) as e:
            raise DataUnavailableError(f'Fashion-MNIST file {path} is missing and could not be '
                                       f'downloaded ({e}). {how}') from e
        finally:
            Path(part).unlink(missing_ok=True)
    elif expected is not None and sha256(path) != expected:
        raise ValueError(f'{path}: SHA-256 mismatch (expected {expected}, found {sha256(path)}); '
                         'delete the file to fetch it again')
    return read_idx(path)


def read_fashion_mnist(root=None, download=True, checksums=FASHION_MNIST_SHA256):
    """Return uint8 tensors (train_images, train_labels, test_images, test_labels).

    Reads the IDX files in `root`, downloading missing ones (which are then cached there),
    and verifies every file's SHA-256 against `checksums`.
    """
    root = Path(root) if root is not None else DATA_DIR
    parts = [_fetch(f'{s}-{k}-idx{d}-ubyte.gz', root, download, checksums)
             for s in ('train', 't10k') for k, d in (('images', 3), ('labels', 1))]
    for images, labels in (parts[:2], parts[2:]):
        if len(images) != len(labels):
            raise ValueError(f'{root}: {len(images)} images but {len(labels)} labels')
    return tuple(parts)


def synthetic_fashion_mnist(num_train=60000, num_test=10000, seed=0):
    """A deterministic, learnable stand-in with Fashion-MNIST's shapes and 10 classes: each class
    is a smooth random 28x28 template sharing a common base; examples are scaled, noisy copies."""
    g = torch.Generator().manual_seed(seed)
    smooth = lambda n: F.interpolate(torch.rand(n, 1, 7, 7, generator=g), size=(28, 28),
                                     mode='bilinear', align_corners=False)[:, 0]
    templates = 0.6 * smooth(1) + 0.4 * smooth(10)

    def make(n):
        labels = torch.randint(0, 10, (n,), generator=g)
        scale = 0.5 + 0.5 * torch.rand(n, 1, 1, generator=g)
        images = templates[labels] * scale + 0.35 * torch.randn(n, 28, 28, generator=g)
        return (images.clamp(0, 1) * 255).to(torch.uint8), labels
    return (*make(num_train), *make(num_test))


def _synthetic_cached():
    """synthetic_fashion_mnist(), kept on disk beside the real data and keyed by the generator's
    source: a worker process loads it in milliseconds instead of drawing it again (~2 s)."""
    key = hashlib.sha256(inspect.getsource(synthetic_fashion_mnist).encode()).hexdigest()[:12]
    path = DATA_DIR.parent / f'synthetic-fashion-mnist-{key}.pt'
    try:
        return tuple(torch.load(path, weights_only=True))  # tensors only: no pickled code
    except Exception:  # missing or damaged: draw it again
        pass
    data = synthetic_fashion_mnist()
    with contextlib.suppress(OSError):  # a cache that cannot be written is only slower
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix='.tmp')
        try:
            with os.fdopen(fd, 'wb') as f:
                torch.save(data, f)
            os.replace(tmp, path)  # concurrent writers each replace it whole
        finally:
            Path(tmp).unlink(missing_ok=True)
    return data


_loaded = {}  # (source, root, download) -> uint8 tensors, so that a notebook reads data once


def fashion_mnist_datasets(source='real', root=None, num_train=None, num_test=None,
                           download=True):
    """Train and test TensorDatasets of (float image [1, 28, 28] in [0, 1], int64 label).

    source: 'real' (error if unavailable), 'synthetic', or 'auto' (real if available,
    otherwise synthetic). The synthetic stand-in is announced when first used.
    """
    check_choice('source', source, ('real', 'synthetic', 'auto'))
    check_int('num_train', num_train, allow_none=True)
    check_int('num_test', num_test, allow_none=True)
    key = (source, str(root), download)
    if key not in _loaded:
        data = None
        if source != 'synthetic':
            try:
                data = read_fashion_mnist(root, download, checksums=FASHION_MNIST_SHA256)
            except DataUnavailableError as e:
                if source == 'real':
                    raise
                print(f'Real Fashion-MNIST unavailable ({str(e).split(". ")[0]}).')
        if data is None:
            print('NOTICE: using the SYNTHETIC stand-in for Fashion-MNIST (deterministic, '
                  '10 classes, 28x28): accuracies are not comparable with the real data set.')
            data = _synthetic_cached()
        _loaded[key] = data
    Xtr, ytr, Xte, yte = _loaded[key]
    Xtr, ytr, Xte, yte = Xtr[:num_train], ytr[:num_train], Xte[:num_test], yte[:num_test]
    as_set = lambda X, y: torch.utils.data.TensorDataset(
        X.unsqueeze(1).float() / 255, y.long())
    return as_set(Xtr, ytr), as_set(Xte, yte)


def load_data_fashion_mnist(batch_size, resize=None, drop_last=False, **kwargs):
    """Return train and test DataLoaders (d2l's signature; keyword arguments go to
    fashion_mnist_datasets). Images are resized per batch, without torchvision.
    drop_last drops a final, smaller training batch."""
    check_int('batch_size', batch_size)
    check_int('resize', resize, allow_none=True)
    train, test = fashion_mnist_datasets(**kwargs)

    def collate(batch):
        X, y = torch.utils.data.default_collate(batch)
        if resize:
            X = F.interpolate(X, size=(resize, resize), mode='bilinear', align_corners=False)
        return X, y
    loader = lambda ds, shuffle, drop: torch.utils.data.DataLoader(
        ds, batch_size, shuffle=shuffle, collate_fn=collate, drop_last=drop)
    return loader(train, True, drop_last), loader(test, False, False)
