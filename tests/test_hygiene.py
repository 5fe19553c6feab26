"""Every notebook follows the course anatomy (CONTRIBUTING.md) and is committed clean: its
parts in order, short cells, prose in Markdown rather than in code, and no outputs."""
import ast
import json
import re
from pathlib import Path

import nbformat
import pytest

from conftest import load_script

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / 'notebooks').glob('*.ipynb'))


def code(cell):
    return ''.join(cell['source']) if isinstance(cell['source'], list) else cell['source']


def test_notebooks_are_numbered_consecutively():
    assert NOTEBOOKS, 'no notebooks found'
    names = [p.name for p in NOTEBOOKS]
    assert all(re.fullmatch(r'\d\d_[a-z0-9_]+\.ipynb', n) for n in names), names
    assert [int(n[:2]) for n in names] == list(range(1, len(names) + 1)), names


@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_anatomy(path):
    nb = json.loads(path.read_text())
    cells = nb['cells']
    code_cells = [c for c in cells if c['cell_type'] == 'code']
    assert all(not c.get('outputs') and c.get('execution_count') is None for c in code_cells), \
        'notebooks are committed without outputs'
    params = [c for c in code_cells if 'parameters' in c.get('metadata', {}).get('tags', [])]
    assert len(params) == 1, 'exactly one cell tagged "parameters"'
    body = ast.parse(code(params[0])).body
    assert body and all(isinstance(s, ast.Assign) for s in body), 'parameters: assignments only'
    assert 'results_dir' in code(params[0]), 'results location must be a parameter'
    source = '\n'.join(code(c) for c in code_cells)
    assert re.search(r'^import helpers as d2l$|^from helpers import', source, re.M)
    assert "'google.colab' in sys.modules" in source, 'Colab install cell'
    assert 'colab-badge.svg' in ''.join(code(c) for c in cells if c['cell_type'] == 'markdown')
    assert 'd2l.record(' in source, 'headline numbers are recorded'
    headings = [code(c) for c in cells if c['cell_type'] == 'markdown']
    assert code(cells[0]).startswith(f'# {int(path.name[:2])}. ')
    assert any('## Exercises' in h for h in headings)
    assert any(re.search(r'### Solution', h) for h in headings), 'at least one worked solution'
    assert nb['metadata']['kernelspec']['name'] == 'python3'


@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.name)
def test_colab_badge_and_install_cell_agree_with_pyproject(path):
    """One source of truth for the address: [tool.course] in pyproject.toml (`make colab`)."""
    colab = load_script('colab')
    config = colab.course_config()
    nb = nbformat.read(path, 4)
    badge, install = colab.colab_cells(nb)
    assert (nb.cells[badge].source, nb.cells[install].source) == colab.expected(path, config), \
        f'{path.name}: Colab cells disagree with pyproject.toml; run `make colab`'
    repo = config['repository']
    assert f'colab.research.google.com/github/{repo}/blob/{config["branch"]}/notebooks/' \
        f'{path.name}' in nb.cells[badge].source
    assert f"REPO, BRANCH = '{repo}', '{config['branch']}'" in nb.cells[install].source
    assert not re.search(r'pip.*\btorch\b', nb.cells[install].source), "keep Colab's torch"


@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_reads_like_a_course(path):
    """scripts/anatomy.py's figures within its targets: median cell <= 12 lines, longest <= 60
    (a cell of taught code), at most 4 over 30, setup <= 12, English in one-line strings <= 5%
    of code lines, at most 10 inline conditionals, at least 4 Markdown words per line of code,
    at most 5,000 Markdown words and 250 a cell, and no module source displayed."""
    anatomy = load_script('anatomy')
    figures = anatomy.figures(path)
    assert not anatomy.failures(figures), (anatomy.failures(figures), figures)


def test_anatomy_counts_prose_in_strings_and_inline_conditionals():
    anatomy = load_script('anatomy')
    assert anatomy.scan("x = 'the cat sat'\ny = 'a_b'\n") == (1, 0)
    assert anatomy.scan('"""A docstring of many words."""\n') == (0, 0)
    assert anatomy.scan("z = 1 if a else 2\nif b:\n    pass\nw = [i for i in r if i]\n") \
        == (0, 2)
    assert anatomy.scan("f'{n} threads ran faster than one'\n") == (1, 0)


@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.name)
def test_parts_come_in_the_course_order(path):
    """Title and idea, the Colab cell, parameters, a setup cell, then lessons (each records
    its numbers where it measures them, with d2l.record)."""
    cells = json.loads(path.read_text())['cells']
    kinds = [c['cell_type'] for c in cells]
    tagged = next(i for i, c in enumerate(cells)
                  if 'parameters' in c.get('metadata', {}).get('tags', []))
    install = next(i for i, c in enumerate(cells) if "'google.colab' in sys.modules" in code(c))
    assert kinds[0] == 'markdown' and install < tagged, 'title, then Colab, then parameters'
    first_code = [i for i, k in enumerate(kinds) if k == 'code']
    assert first_code[:2] == [install, tagged], 'nothing runs before the parameters'


def test_saved_code_in_modules_matches_the_notebooks():
    """The taught code stands in the notebooks' `#@save` cells; the modules that worker
    processes import carry an exact copy (`make export` writes it)."""
    export = load_script('export')
    stale = [p.name for p, before, after in export.plan() if before != after]
    assert not stale, f'{stale} disagree with their notebooks: run `make export`'


def test_export_replaces_only_its_own_block(tmp_path):
    export = load_script('export')
    cell = lambda text: {'cell_type': 'code', 'source': text, 'metadata': {}, 'outputs': []}
    nb = {'cells': [cell('#@save lesson\ndef f():\n    return 1'), cell('x = 2'),
                    cell('#@save lesson\ndef g():\n    return f()')]}
    (tmp_path / '01_a.ipynb').write_text(json.dumps(nb))
    (tmp_path / 'lesson.py').write_text('import os\n')
    [(path, before, after)] = export.plan(tmp_path)
    assert after.startswith('import os\n') and 'def f():' in after and 'x = 2' not in after
    assert after.index('def f') < after.index('def g')
    path.write_text(after + '\nHAND = 1\n')
    [(_, before, again)] = export.plan(tmp_path)
    assert again == before, 'a second export changes nothing, and keeps the code by hand'


def test_parameters_cells_are_written_from_their_declarations():
    """A default lives once, in plan_NN.PARAMETERS; the notebook's cell is written from it."""
    export = load_script('export')
    stale = [nb.name for nb, now, want in export.parameter_cells() if now != want]
    assert not stale, f'{stale}: parameters cells disagree with PARAMETERS: run `make export`'


MODULES = sorted((ROOT / 'notebooks').glob('*.py'))


@pytest.mark.parametrize('path', MODULES, ids=lambda p: p.name)
def test_module_stays_readable(path):
    """scripts/anatomy.py's module figures within their targets: at most 600 lines, no function
    over 60 lines, English in one-line strings on at most 8% of the lines (prose belongs in the
    notebooks' Markdown; a verdict's wording in one table of templates)."""
    anatomy = load_script('anatomy')
    figures = anatomy.module_figures(path)
    assert not anatomy.module_failures(figures), (anatomy.module_failures(figures), figures)


def test_module_figures_count_lines_functions_and_prose(tmp_path):
    anatomy = load_script('anatomy')
    module = tmp_path / 'm.py'
    module.write_text("def f():\n    def g():\n        return 'the cat sat'\n    return g\n")
    figures = anatomy.module_figures(module)
    assert (figures['lines'], figures['longest_function'], figures['function']) == (4, 4, 'f')
    assert figures['prose'] == 0.25
