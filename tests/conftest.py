"""Shared fixtures: helpers is importable, notebooks run with parameters, and the run of every
notebook at its defaults (nbmake's) is kept for the tests that check its recorded results and
for the rendered site, so that `make test` executes each notebook once, not twice."""
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / 'notebooks'
_spec = importlib.util.spec_from_file_location('execute', ROOT / 'scripts' / 'execute.py')
_execute_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_execute_script)
KERNELS = _execute_script.KERNELS  # kernels with encrypted sockets, as jupyter advises
EXECUTED = ROOT / 'build' / 'executed'   # where `make run` and nbmake leave executed notebooks
RESULTS = ROOT / 'build' / 'results'     # where notebooks record results by default
CHROMIUM = shutil.which('chromium') or '/usr/bin/chromium'
sys.path.insert(0, str(NOTEBOOKS))

_default_runs = {}  # notebook name -> executed notebook path, for runs made in this session


def _keep_nbmake_runs():
    """nbmake executes each notebook with its default parameters and keeps nothing. Save each
    successful run to build/executed/ (as `make run` does), and remember it for this session."""
    try:
        from nbmake import nb_run
    except ImportError:
        return
    run = nb_run.NotebookRun.execute
    if getattr(run, 'keeps_runs', False):
        return

    class Client(nb_run.NotebookClient):  # nbmake's client, its kernels started with KERNELS
        def __init__(self, *args, **kwargs):
            super().__init__(*args, config=KERNELS, **kwargs)

    def execute_and_keep(self):
        result = run(self)
        path = Path(self.filename).resolve()
        if result.error is None and path.parent == NOTEBOOKS:
            _default_runs[path.stem] = _save(result.nb, EXECUTED / path.name)
        return result
    execute_and_keep.keeps_runs = True
    nb_run.NotebookRun.execute = execute_and_keep
    nb_run.NotebookClient = Client


def keep_default_run(nb, name):
    """Keep a run of notebooks/<name> at its default parameters, made outside nbmake (in
    JupyterLab), as nbmake's runs are kept; its results are already in build/results/."""
    _default_runs[Path(name).stem] = _save(nb, EXECUTED / name)


def _save(nb, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix='.tmp')
    with os.fdopen(fd, 'w') as f:
        f.write(nbformat.writes(nb) + '\n')
    os.replace(tmp, path)
    return path


_keep_nbmake_runs()


def load_script(name):
    """scripts/<name>.py as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / 'scripts' / f'{name}.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def browser_missing():
    """Why the browser tests cannot run here, or None when Chromium and Playwright are there."""
    if not Path(CHROMIUM).exists():
        return 'Chromium is not installed (Debian: apt-get install -y chromium)'
    if importlib.util.find_spec('playwright') is None:
        return 'Playwright is not installed (make setup installs it)'
    return None


MARKERS = {  # marker -> what makes a test carry it (registered in pyproject.toml)
    'notebook': lambda item, fixtures: item.path.suffix == '.ipynb'
    or bool({'run_notebook', 'default_run'} & fixtures),
    'browser': lambda item, fixtures: bool({'lab', 'chromium'} & fixtures),
    'cluster': lambda item, fixtures: item.path.name == 'test_cluster.py',
}


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """First, mark each test by what it runs, so that `-m` selects a subset by name: `notebook`
    (nbmake's runs of the notebooks, papermill runs, the tests that read a default run),
    `browser` (JupyterLab and the site in Chromium), `cluster` (emulated hosts).

    Then (after `-m` and `-k` have deselected what was not asked for): tests that read a
    notebook's default run go after the notebooks, so that they read the run nbmake just made
    instead of starting their own. A notebook that the browser test runs in JupyterLab (at its
    defaults, as a learner does) is not run a second time by nbmake: the JupyterLab run is kept
    as its default run (keep_default_run)."""
    for item in items:
        fixtures = set(getattr(item, 'fixturenames', ()))
        for name, applies in MARKERS.items():
            if applies(item, fixtures):
                item.add_marker(name)
    result = yield
    browser = browser_missing() is None
    in_lab = {i.callspec.params['name'] for i in items if browser
              and getattr(i, 'originalname', '') == 'test_notebook_runs_to_the_end_in_jupyterlab'}
    twice = [i for i in items if i.path.suffix == '.ipynb' and i.path.name in in_lab]
    if twice:
        config.hook.pytest_deselected(items=twice)
    late = [i for i in items if 'default_run' in getattr(i, 'fixturenames', ())]
    items[:] = [i for i in items if i not in late and i not in twice] + late
    return result


def _execute(name, out_dir, parameters):
    """Run a notebook with papermill; its figures and traces go to out_dir, not the course's."""
    import papermill
    results_dir = out_dir / 'results'
    isolated = {'COURSE_FIGURES_DIR': str(out_dir / 'figures'),
                'COURSE_TRACES_DIR': str(out_dir / 'traces')}
    saved = {k: os.environ.get(k) for k in isolated}
    os.environ.update(isolated)  # the kernel inherits this process's environment
    try:
        papermill.execute_notebook(
            str(NOTEBOOKS / f'{name}.ipynb'), str(out_dir / f'{name}.ipynb'),
            parameters={**parameters, 'results_dir': str(results_dir)},
            cwd=str(NOTEBOOKS), kernel_name='python3', progress_bar=False, config=KERNELS)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return json.loads((results_dir / f'{name}.json').read_text())['results']


@pytest.fixture
def run_notebook(tmp_path):
    """Execute notebooks/<name>.ipynb with papermill and return its recorded results."""
    return lambda name, **parameters: _execute(name, tmp_path, parameters)


@pytest.fixture(scope='session')
def default_run(tmp_path_factory):
    """default_run(name) -> (executed notebook path, recorded results) of the notebook run with
    its default parameters: nbmake's run in this session, or a papermill run made now."""
    made = {}

    def get(name):
        if name in _default_runs:
            payload = json.loads((RESULTS / f'{name}.json').read_text())
            return _default_runs[name], payload['results']
        if name not in made:
            out = tmp_path_factory.mktemp(name)
            made[name] = out / f'{name}.ipynb', _execute(name, out, {})
        return made[name]
    return get


@pytest.fixture(scope='session')
def refusal():
    """refusal(name, **parameters) -> the error a notebook raises for bad parameters, or None.

    Runs, in one kernel shared by the session, what papermill would run up to the notebook's
    setup cell (the first code cell after its parameters, where every parameter is checked
    before any work starts): a refusal costs a fraction of a second instead of a kernel start."""
    from jupyter_client.manager import start_new_kernel
    km, kc = start_new_kernel(kernel_name='python3', cwd=str(NOTEBOOKS),
                              **KERNELS.KernelManager)  # transport_encryption
    last = [None]

    def run(name, **parameters):
        nb = nbformat.read(NOTEBOOKS / f'{name}.ipynb', 4)
        code = [c for c in nb.cells if c.cell_type == 'code']
        at = next(i for i, c in enumerate(code) if 'parameters' in c.metadata.get('tags', []))
        injected = '\n'.join(f'{k} = {v!r}' for k, v in parameters.items())
        # A fresh namespace for each notebook (%reset costs 0.3 s: it collects garbage); within
        # one notebook the cells re-run from its imports and parameters define every name anew.
        reset = ['%reset -f'] if last[0] != name else []
        last[0], errors = name, []
        for source in [*reset, *[c.source for c in code[:at + 1]], injected,
                       code[at + 1].source]:
            reply = kc.execute_interactive(source, timeout=120, output_hook=lambda m: (
                errors.append(f'{m["content"]["ename"]}: {m["content"]["evalue"]}')
                if m['msg_type'] == 'error' else None))
            if reply['content']['status'] != 'ok':
                return errors[-1] if errors else reply['content'].get('evalue', 'error')
        return None
    yield run
    kc.stop_channels()
    km.shutdown_kernel(now=True)
