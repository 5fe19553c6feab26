"""Each notebook's headline numbers as JSON (`d2l.record`), for tests and sweeps to assert on
instead of scraping outputs."""
import json
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch

from paths import RESULTS_DIR


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, torch.Tensor):
        return _jsonable(x.tolist())
    if hasattr(x, 'item') and not isinstance(x, (str, bytes)):
        return x.item()  # numpy scalars
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


_RECORDED = {}  # (directory, name) -> what this process has recorded for that notebook


def record(name, results, results_dir=None):
    """Add a notebook's headline numbers to <results_dir>/<name>.json, with the environment.

    Each section records its own numbers where it measures them: the file holds everything
    this process (the notebook's kernel) has recorded under `name` so far, and a new kernel
    starts the file afresh, so a number from an earlier run never survives into this one.
    It prints and returns nothing: a section that records shows only its own numbers."""
    directory = Path(results_dir) if results_dir is not None else RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f'{name}.json'
    so_far = _RECORDED.setdefault((str(directory.resolve()), name), {})
    so_far.update(_jsonable(results))
    import helpers  # helpers offers record as d2l.record: import it only when recording
    payload = {'notebook': name, 'environment': helpers.environment(),
               'recorded_at': datetime.now(timezone.utc).isoformat(timespec='seconds'),
               'results': so_far}
    fd, tmp = tempfile.mkstemp(dir=directory, suffix='.tmp')
    with os.fdopen(fd, 'w') as f:
        json.dump(payload, f, indent=2)
    os.replace(tmp, path)  # readers never see a half-written file
