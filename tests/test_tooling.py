"""The course's own tooling: `make help`, `make compat`'s pieces and the README table it writes,
kernels started without jupyter's TCP warning, and requirements.txt saying truly which notebooks
need what."""
import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

from conftest import KERNELS, load_script

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / 'notebooks').glob('[0-9][0-9]_*.ipynb'))
TCP_WARNING = 'Kernel is running over TCP without encryption'


compat = load_script('compat')
colab = load_script('colab')


# ------------------------------------------------------------------------ make help
def test_make_help_lists_every_target_with_its_comment():
    makefile = (ROOT / 'Makefile').read_text()
    phony = re.search(r'^\.PHONY:(.*)$', makefile, re.M).group(1).split()
    documented = dict(re.findall(r'^([a-z][a-z-]*):[^#\n]*## (.+)$', makefile, re.M))
    assert set(phony) == set(documented), 'every target has a ## comment, and only targets'
    done = subprocess.run(['make', '--no-print-directory', 'help'], cwd=ROOT,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    listed = dict(re.findall(r'^  (\S+)\s+(.+)$', done.stdout, re.M))
    assert listed == {k: v.strip() for k, v in documented.items()}
    plain = subprocess.run(['make', '--no-print-directory'], cwd=ROOT, capture_output=True,
                           text=True, timeout=30)
    assert plain.stdout == done.stdout, '`make` alone prints the same list'


# --------------------------------------------------------------------------- compat
@pytest.mark.parametrize('text', ['', '2', 'latest', '2.15.0; rm -rf /', '2.15.0+cu121', None])
def test_compat_refuses_what_is_not_a_release_number(text):
    with pytest.raises(ValueError, match='TORCH must be a release number'):
        compat.check_version(text)


def test_compat_accepts_releases_and_orders_them_as_numbers():
    assert compat.check_version(' 2.15.0 ') == '2.15.0'
    assert compat.check_version('2.4') == '2.4'
    assert sorted(['2.15.0', '2.4.0', '2.13.0'], key=compat.version_key) == \
        ['2.4.0', '2.13.0', '2.15.0']


def test_compat_pins_everything_but_torch_and_loosens_only_its_dependencies():
    pins = (ROOT / 'constraints.txt').read_text()
    names = lambda text: {re.split(r'[=<>]', line)[0].lower() for line in text.splitlines()
                          if line and not line.startswith('#')}
    assert names(pins) - names(compat.constraints_without(pins, {'torch'})) == {'torch'}
    loose = compat.constraints_without(pins, {'torch'} | compat.TORCH_DEPENDENCIES)
    assert {'sympy', 'typing_extensions', 'jinja2'} & names(loose) == set()
    assert 'numpy' in names(loose) and 'pytest' in names(loose)


def test_compat_table_rows_are_replaced_per_version_and_ordered_newest_first():
    readme = f'# Course\n\n{compat.BEGIN}\n{compat.END}\n\n## Next\n'
    row = lambda v, result: f'| {v} | CPU build, 0.9 GB | 2026-11-23 | {result} | 5 min 00 s |'
    text = compat.update_table(readme, row('2.4.0', 'FAIL: 7/9 notebooks'))
    text = compat.update_table(text, row('2.15.0', 'pass: 9/9 notebooks'))
    text = compat.update_table(text, row('2.4.0', 'pass: 9/9 notebooks'))
    assert compat.table_rows(text) == {'2.15.0': 'pass: 9/9 notebooks',
                                       '2.4.0': 'pass: 9/9 notebooks'}
    assert list(compat.table_rows(text)) == ['2.15.0', '2.4.0']
    assert text.startswith('# Course\n\n') and text.endswith('\n\n## Next\n')
    with pytest.raises(ValueError, match='no compat table'):
        compat.update_table('# Course\n', row('2.4.0', 'pass'))


def test_compat_verdicts_name_each_notebook_its_tests_and_its_warnings(tmp_path):
    junit = tmp_path / 'junit.xml'
    junit.write_text(textwrap.dedent('''\
        <testsuites><testsuite>
        <testcase file="notebooks/01_a.ipynb" name="01_a.ipynb" time="31.2"/>
        <testcase file="tests/test_01_a.py" name="test_01_refuses" time="0.1"/>
        <testcase file="notebooks/02_b.ipynb" name="02_b.ipynb" time="12.0">
          <failure message="cell 4: ImportError: cannot import name fully_shard">...</failure>
        </testcase>
        <testcase file="tests/test_02_03_c.py" name="test_03_plan" time="0.1">
          <skipped message="needs a GPU"/></testcase>
        <testcase file="tests/test_02_03_c.py" name="test_shared_lanes" time="0.1"/>
        <testcase file="tests/test_learner_paths.py"
                  name="test_notebook_runs_to_the_end_in_jupyterlab[03_c.ipynb]" time="40"/>
        <testcase file="tests/test_stats.py" name="test_median" time="0.1"/>
        <testcase file="tests/test_hygiene.py" name="test_notebook_anatomy[01_a.ipynb]"
                  time="0.1"/>
        </testsuite></testsuites>'''))
    executed = tmp_path / 'executed'
    executed.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('x', outputs=[
        nbformat.v4.new_output('stream', name='stderr', text=(
            '/x/torch/jit/_script.py:1488: FutureWarning: `torch.jit.script` is deprecated.\n'
            '  warnings.warn(\n'
            "W1123 17:39:45.963000 8985 torch/utils/cpp_extension.py:183] [0/0] No CUDA runtime "
            "is found, using CUDA_HOME='/usr/local'\n")),
        nbformat.v4.new_output('stream', name='stdout', text='UserWarning: only printed\n')])])
    nbformat.write(nb, executed / '01_a.ipynb')
    notebooks = [Path(f'notebooks/{n}.ipynb') for n in ('01_a', '02_b', '03_c', '04_d')]
    rows = {r['notebook']: r for r in compat.verdicts(compat.test_cases(junit), notebooks,
                                                      executed)}
    assert rows['01_a']['line'] == (
        'pass: ran in 31 s; tests 2 passed; warnings printed (2): FutureWarning: '
        '`torch.jit.script` is deprecated. | torch log warning (torch/utils/cpp_extension.py): '
        "No CUDA runtime is found, using CUDA_HOME='/usr/local'")
    assert rows['02_b']['line'].startswith('FAIL: run failed; tests 1 passed; first failure: '
                                           '02_b.ipynb: cell 4: ImportError')
    assert rows['03_c']['line'] == 'pass: ran in 40 s; tests 1 passed, 1 skipped'
    assert rows['04_d']['line'] == 'not run: notebook not run; tests no tests'
    assert rows['other tests']['line'] == 'pass: 1 passed'
    assert [r['ok'] for r in rows.values()] == [True, False, True, False, True]


def test_compat_reads_the_warnings_pytest_summarised():
    log = textwrap.dedent('''\
        tests/test_a.py ..                                                      [100%]
        =============================== warnings summary ===============================
        tests/test_a.py::test_one
        tests/test_a.py::test_two
          /v/torch/jit/_script.py:1491: FutureWarning: `torch.jit.script` is deprecated.
            warnings.warn(

        -- Docs: https://docs.pytest.org/en/stable/how-to/capture-warnings.html
        UserWarning: printed after the summary
        ''')
    assert compat.pytest_warnings(log) == ['FutureWarning: `torch.jit.script` is deprecated.']
    assert compat.pytest_warnings('== 3 passed in 1.0s ==') == []


def test_readme_table_shows_the_stated_lower_bound_passing():
    """requirements.txt's torch bound is one that `make compat` ran, and it passed."""
    bound = re.search(r'^torch>=([\d.]+)', (ROOT / 'requirements.txt').read_text(), re.M)[1]
    rows = compat.table_rows((ROOT / 'README.md').read_text())
    release = lambda version: (compat.version_key(version) + (0, 0))[:3]  # 2.4 is 2.4.0
    ran = [v for v in rows if release(v) == release(bound)]
    assert ran, f'README.md\'s compat table has no row for torch {bound}: make compat TORCH={bound}'
    assert all(rows[v].startswith('pass') for v in ran), {v: rows[v] for v in ran}
    for version, result in rows.items():
        assert re.fullmatch(r'(pass|FAIL): \d+/\d+ notebooks, .+', result), (version, result)


# -------------------------------------------------------------------------- kernels
@pytest.fixture
def tiny_notebook(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('print(6 * 7)')])
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3',
                                 'language': 'python'}
    path = tmp_path / 'tiny.ipynb'
    nbformat.write(nb, path)
    return path


def test_make_run_starts_kernels_that_do_not_warn_about_tcp(tiny_notebook, tmp_path):
    """scripts/execute.py (make run) has the kernel manager provision CurveZMQ keys; the same
    kernel without them prints jupyter's warning, so the check below can see it."""
    out = tmp_path / 'out.ipynb'
    done = subprocess.run([sys.executable, str(ROOT / 'scripts' / 'execute.py'),
                           str(tiny_notebook), str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert TCP_WARNING not in done.stdout + done.stderr
    assert nbformat.read(out, 4).cells[0].outputs[0]['text'] == '42\n'
    plain = subprocess.run([sys.executable, '-m', 'papermill', '--no-progress-bar',
                            str(tiny_notebook), str(out)], capture_output=True, text=True,
                           timeout=120)
    assert plain.returncode == 0 and TCP_WARNING in plain.stderr


def test_nbmake_kernels_do_not_warn_about_tcp(tiny_notebook, capfd):
    """nbmake's runs (patched in conftest.py) start their kernels with KERNELS too."""
    from nbmake.nb_run import NotebookRun
    assert KERNELS.KernelManager.transport_encryption == 'auto'
    result = NotebookRun(tiny_notebook, 120).execute()
    assert result.error is None
    assert result.nb.cells[0].outputs[0]['text'] == '42\n'
    captured = capfd.readouterr()
    assert TCP_WARNING not in captured.out + captured.err


def test_make_lab_passes_the_same_kernel_setting():
    makefile = (ROOT / 'Makefile').read_text()
    setting = re.search(r'^LAB_KERNELS := --KernelManager\.(\w+)=(\w+)$', makefile, re.M)
    assert setting and KERNELS.KernelManager[setting[1]] == setting[2]
    assert re.search(r'jupyter lab .*\$\(LAB_KERNELS\)', makefile)


# --------------------------------------------------------------------- requirements
def top_level_imports(source):
    """Modules imported by a module's own top-level code (not inside functions)."""
    found = set()

    def visit(statements):
        for node in statements:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, 'handlers', ()):
                    visit(handler.body)
    visit(ast.parse(source).body)
    return found


def numbers(text):
    """'05-09' -> {5, ..., 9}; '02, 03 and 07' -> {2, 3, 7}."""
    out = set()
    for first, last in re.findall(r'\b(\d\d)(?:-(\d\d))?\b', text):
        out.update(range(int(first), int(last or first) + 1))
    return out


def test_requirements_say_which_notebooks_need_numpy_distributed_and_diagrams():
    lines = {re.split(r'[>=<\s]', line)[0]: line.split('#', 1)[1]
             for line in (ROOT / 'requirements.txt').read_text().splitlines()
             if line and not line.startswith('#')}
    uses = {'numpy': set(), 'torch.distributed': set(), 'diagrams': set()}
    for path in NOTEBOOKS:
        nb = nbformat.read(path, 4)
        own = colab.code_of(nb)
        imported = top_level_imports(own).union(*(
            top_level_imports((ROOT / 'notebooks' / f'{m}.py').read_text())
            for m in colab.modules_needed(nb)))
        if 'numpy' in imported:
            uses['numpy'].add(int(path.name[:2]))
        if any(m.startswith('torch.distributed') for m in imported):
            uses['torch.distributed'].add(int(path.name[:2]))
        if re.search(r'\bdiagrams\.draw_', own):
            uses['diagrams'].add(int(path.name[:2]))
    distributed = next(part for part in lines['torch'].split(',') if 'torch.distributed' in part)
    diagrams = re.search(r'diagrams \(([^)]*)\)', lines['matplotlib'])[1]
    said = {'numpy': numbers(lines['numpy']), 'torch.distributed': numbers(distributed),
            'diagrams': numbers(diagrams)}
    assert said == uses, f'requirements.txt says {said}; the notebooks\' imports say {uses}'


def test_make_html_executes_a_stale_notebook_again(tmp_path, monkeypatch):
    """A learner reruns one notebook after `make run`: its results now come from that run, not
    from the executed copy. The site executes that notebook again instead of refusing."""
    site = load_script('site')
    (tmp_path / 'results').mkdir()

    def executed(at):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('1', execution_count=1)])
        nb.cells[0].metadata['execution'] = {'iopub.execute_input': f'{at}:00Z',
                                             'iopub.status.idle': f'{at}:30Z'}
        nbformat.write(nb, tmp_path / '01_x.ipynb')
        env = {'cpu': 'cpu', 'cpu_count': 2, 'gpus': [], 'torch': '2.13', 'python': '3.11'}
        (tmp_path / 'results' / '01_x.json').write_text(json.dumps(
            {'recorded_at': f'{at}:10+00:00', 'environment': env}))

    executed('2026-11-26T10:00')
    results = tmp_path / 'results' / '01_x.json'
    payload = json.loads(results.read_text())
    payload['recorded_at'] = '2026-11-26T11:00:00+00:00'  # a later run rewrote the results
    results.write_text(json.dumps(payload))
    reruns = []
    monkeypatch.setattr(site, 'rerun', lambda name, where: (reruns.append(name),
                                                            executed('2026-11-26T12:00')))
    nb, info = site.executed_page(tmp_path / '01_x.ipynb', tmp_path / 'results')
    assert reruns == ['01_x'] and '2026-11-26 12:00' in info
    assert site.executed_page(tmp_path / '01_x.ipynb', tmp_path / 'results')[1] == info
    assert reruns == ['01_x'], 'a notebook whose results match its run is not executed again'
