"""Where the course writes its figures, results and traces, and keeps its data."""
import os
from pathlib import Path


def _course_root():
    """Where the course writes figures, results, traces and data. In the repository that is the
    folder above notebooks/; anywhere else (Colab fetches this file into /content) it is the
    working directory. COURSE_ROOT overrides both."""
    if os.environ.get('COURSE_ROOT'):
        return Path(os.environ['COURSE_ROOT']).resolve()
    here = Path(__file__).resolve().parent
    if here.name == 'notebooks' and (here.parent / 'pyproject.toml').is_file():
        return here.parent
    return Path.cwd()


ROOT = _course_root()
FIGURES_DIR = Path(os.environ.get('COURSE_FIGURES_DIR', ROOT / 'figures'))
RESULTS_DIR = Path(os.environ.get('COURSE_RESULTS_DIR', ROOT / 'build' / 'results'))
TRACES_DIR = Path(os.environ.get('COURSE_TRACES_DIR', ROOT / 'build' / 'traces'))
DATA_DIR = Path(os.environ.get('COURSE_DATA_DIR', ROOT / 'data' / 'fashion-mnist'))
