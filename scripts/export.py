"""Write (or check) the taught code that notebooks save into modules, as d2l's `#@save` does,
and each notebook's `parameters` cell from its declared parameters.

    python scripts/export.py           # rewrite every saved block and parameters cell (make export)
    python scripts/export.py --check   # exit 1 if a module or a cell disagrees

Why this and not shipping notebook functions to the workers by value (cloudpickle): the code a
learner reads stands in the notebook's cells, and it must also be importable by name: worker
processes started with `spawn` and `torchrun` import it, and a later notebook builds on an
earlier one's code (chapter 10 imports the cost models of 04-09), as the book's later chapters
import what earlier ones `#@save`d. A module written from the cells gives both, and a reader of
the module sees the same code as a reader of the notebook.

A code cell whose first line is `#@save MODULE` is copied, without that line, into
`notebooks/MODULE.py`, between two marker lines that name the notebook; the cells saved to one
module from one notebook keep their order. Everything else in the module (its imports, meters,
clocks, launching) is written by hand. A module without the markers gets the block at its end.

The other direction: a notebook's parameters are declared once, in `plan_NN.PARAMETERS`
(notebooks/parameters.py), and its cell tagged `parameters` is written from them.
"""
import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / 'notebooks'
MARK = re.compile(r'^#@save (\w+)\s*$')
BEGIN = '# ---- saved from {nb} by make export: edit the notebook'
END = '# ---- end of what {nb} saves'


def saved_cells(path):
    """{module: [source, ...]} of the cells `path` saves, in notebook order."""
    blocks = {}
    for cell in json.loads(Path(path).read_text())['cells']:
        source = ''.join(cell['source'])
        first, _, rest = source.partition('\n')
        match = MARK.match(first)
        if cell['cell_type'] == 'code' and match:
            blocks.setdefault(match.group(1), []).append(rest.strip('\n'))
    return blocks


def block(nb_name, sources):
    return '\n'.join([BEGIN.format(nb=nb_name), '\n\n\n'.join(sources),
                      END.format(nb=nb_name)])


def exported(module_text, nb_name, sources):
    """`module_text` with the notebook's block replaced (or appended)."""
    new = block(nb_name, sources)
    begin, end = BEGIN.format(nb=nb_name), END.format(nb=nb_name)
    if begin in module_text:
        head, _, rest = module_text.partition(begin)
        if end not in rest:
            raise SystemExit(f'a module has "{begin}" but not "{end}"')
        return head + new + rest.partition(end)[2]
    return module_text.rstrip('\n') + '\n\n\n' + new + '\n'


def plan(notebooks_dir=NOTEBOOKS):
    """[(module path, its text now, its text as the notebooks say)] for every saved block."""
    changes = {}
    for nb in sorted(notebooks_dir.glob('[0-9][0-9]_*.ipynb')):
        for module, sources in saved_cells(nb).items():
            path = notebooks_dir / f'{module}.py'
            if not path.exists():
                raise SystemExit(f'{nb.name} saves to {module}.py, which does not exist: '
                                 'create it with its imports first')
            before, text = changes.get(path, (path.read_text(),) * 2)
            changes[path] = (before, exported(text, nb.name, sources))
    return [(path, before, after) for path, (before, after) in changes.items()]


def parameter_cells(notebooks_dir=NOTEBOOKS):
    """[(notebook path, its parameters cell now, the cell its PARAMETERS declare)]."""
    sys.path.insert(0, str(notebooks_dir))
    import importlib

    import parameters
    cells = []
    for nb in sorted(notebooks_dir.glob('[0-9][0-9]_*.ipynb')):
        if not (notebooks_dir / f'plan_{nb.name[:2]}.py').exists():
            continue
        declared = getattr(importlib.import_module(f'plan_{nb.name[:2]}'), 'PARAMETERS', None)
        if declared is None:
            continue
        tagged = [c for c in json.loads(nb.read_text())['cells']
                  if 'parameters' in c.get('metadata', {}).get('tags', [])]
        cells.append((nb, ''.join(tagged[0]['source']), parameters.cell(declared)))
    return cells


def write_parameter_cell(path, source):
    nb = json.loads(path.read_text())
    for c in nb['cells']:
        if 'parameters' in c.get('metadata', {}).get('tags', []):
            c['source'] = source.splitlines(True)
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + '\n')


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--check', action='store_true', help='exit 1 where a module disagrees')
    args = parser.parse_args(argv)
    stale = [(p, after) for p, before, after in plan() if before != after]
    for path, after in stale:
        if args.check:
            print(f'{path.relative_to(ROOT)} disagrees with its notebook: run `make export`',
                  file=sys.stderr)
        else:
            path.write_text(after)
            print(f'wrote {path.relative_to(ROOT)}')
    cells = [(nb, want) for nb, now, want in parameter_cells() if now != want]
    for nb, want in cells:
        if args.check:
            print(f'{nb.name}: its parameters cell disagrees with PARAMETERS in '
                  f'plan_{nb.name[:2]}.py: run `make export`', file=sys.stderr)
        else:
            write_parameter_cell(nb, want)
            print(f'wrote the parameters cell of {nb.name}')
    return 1 if args.check and (stale or cells) else 0


if __name__ == '__main__':
    sys.exit(main())
