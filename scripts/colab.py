"""Write (or check) every notebook's Colab badge and install cell from one source of truth.

    python scripts/colab.py [NOTEBOOK ...]   # rewrite the cells (make colab: all notebooks)
    python scripts/colab.py --check          # exit 1 if any notebook disagrees

The repository address lives once, in pyproject.toml under [tool.course]. Each notebook's
install cell fetches exactly the course modules it needs: the first-party modules it imports,
and the ones those import in turn.
"""
import argparse
import ast
import re
import sys
import textwrap
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / 'notebooks'
RAW = 'https://raw.githubusercontent.com/'


def course_config(pyproject=ROOT / 'pyproject.toml'):
    """{'repository': 'owner/name', 'branch': ...} from pyproject.toml's [tool.course] table."""
    text = Path(pyproject).read_text()
    table = re.search(r'^\[tool\.course\]\s*$(.*?)(?=^\[|\Z)', text, re.M | re.S)
    if not table:
        raise SystemExit(f'{pyproject}: no [tool.course] table')
    config = dict(re.findall(r'^(\w+)\s*=\s*"([^"]*)"', table.group(1), re.M))
    for key in ('repository', 'branch'):
        if not config.get(key):
            raise SystemExit(f'{pyproject}: [tool.course] needs {key} = "..."')
    return config


def first_party_modules():
    return {p.stem for p in NOTEBOOKS.glob('*.py')}


def imported_modules(source):
    """Top-level names of every module imported anywhere in `source`."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(a.name.split('.')[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split('.')[0])
    return names


def code_of(nb):
    """The notebook's code, with IPython magics and shell escapes left out."""
    lines = [line for c in nb.cells if c.cell_type == 'code' for line in c.source.splitlines()
             if not line.lstrip().startswith(('%', '!'))]
    return '\n'.join(lines)


def modules_needed(nb):
    """First-party modules the notebook imports, closed over what those modules import."""
    ours = first_party_modules()
    todo, needed = list(imported_modules(code_of(nb)) & ours), set()
    while todo:
        name = todo.pop()
        if name not in needed:
            needed.add(name)
            todo += imported_modules((NOTEBOOKS / f'{name}.py').read_text()) & ours - needed
    return sorted(needed, key=lambda n: (n != 'helpers', n))


def badge_cell(name, config, modules):
    url = (f'https://colab.research.google.com/github/{config["repository"]}/blob/'
           f'{config["branch"]}/notebooks/{name}')
    files = ', '.join(f'`{m}.py`' for m in modules)
    return (
        '## Run it anywhere\n\n'
        f'[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({url})\n\n'
        'Locally, `make lab` opens this notebook with everything installed. On Colab, the next '
        f'cell fetches the course modules this notebook imports ({files}) into the working '
        'directory, where figures and results are written too. Colab already has PyTorch, '
        'NumPy and Matplotlib, so nothing is installed and Colab\'s own PyTorch stays. '
        'Elsewhere the cell does nothing.')


def install_cell(config, modules):
    names = textwrap.fill(', '.join(f"'{m}.py'" for m in modules), width=96,
                          initial_indent=' ' * 19, subsequent_indent=' ' * 19).lstrip()
    names += ',' if len(modules) == 1 else ''
    return (
        'import sys\n\n'
        "if 'google.colab' in sys.modules:  # Colab only: fetch the course modules, "
        "keep its torch\n"
        '    import urllib.request\n'
        f"    REPO, BRANCH = '{config['repository']}', '{config['branch']}'\n"
        f"    COURSE = f'{RAW}{{REPO}}/{{BRANCH}}/notebooks/'\n"
        f'    for module in ({names}):\n'
        '        urllib.request.urlretrieve(COURSE + module, module)')


def colab_cells(nb):
    """Indices of the badge cell and of the install cell."""
    badge = [i for i, c in enumerate(nb.cells)
             if c.cell_type == 'markdown' and c.source.startswith('## Run it anywhere')]
    install = [i for i, c in enumerate(nb.cells)
               if c.cell_type == 'code' and "'google.colab' in sys.modules" in c.source]
    if len(badge) != 1 or len(install) != 1:
        raise ValueError('a notebook needs exactly one "## Run it anywhere" cell and one install '
                         f'cell; found {len(badge)} and {len(install)}')
    return badge[0], install[0]


def expected(path, config=None):
    """(badge cell source, install cell source) that `path` must carry."""
    config = config or course_config()
    nb = nbformat.read(path, 4)
    modules = modules_needed(nb)
    return badge_cell(Path(path).name, config, modules), install_cell(config, modules)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('notebooks', nargs='*', type=Path, help='default: every notebook')
    parser.add_argument('--check', action='store_true', help='only report disagreements')
    args = parser.parse_args(argv)
    config, stale = course_config(), []
    for path in args.notebooks or sorted(NOTEBOOKS.glob('[0-9][0-9]_*.ipynb')):
        nb = nbformat.read(path, 4)
        badge, install = colab_cells(nb)
        want = expected(path, config)
        if (nb.cells[badge].source, nb.cells[install].source) != want:
            stale.append(path.name)
            if not args.check:
                nb.cells[badge].source, nb.cells[install].source = want
                path.write_text(nbformat.writes(nb) + '\n')
    if args.check and stale:
        print(f'out of date: {", ".join(stale)}; run `make colab`', file=sys.stderr)
        return 1
    print(f'{"checked" if args.check else "wrote"} Colab cells; '
          f'{len(stale)} notebook(s) {"disagree" if args.check else "updated"}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
