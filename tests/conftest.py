"""Shared fixtures: helpers is importable, and notebooks can be run with parameters."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / 'notebooks'
sys.path.insert(0, str(NOTEBOOKS))


@pytest.fixture
def run_notebook(tmp_path):
    """Execute notebooks/<name>.ipynb with papermill and return its recorded results."""
    import papermill

    def run(name, **parameters):
        results_dir = tmp_path / 'results'
        papermill.execute_notebook(
            str(NOTEBOOKS / f'{name}.ipynb'), str(tmp_path / f'{name}.ipynb'),
            parameters={**parameters, 'results_dir': str(results_dir)},
            cwd=str(NOTEBOOKS), kernel_name='python3', progress_bar=False)
        return json.loads((results_dir / f'{name}.json').read_text())['results']
    return run
