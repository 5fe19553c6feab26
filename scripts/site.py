"""The executed course as a book: a static site built with Sphinx, myst-nb and sphinx-book-theme.

    python scripts/site.py [--executed build/executed] [--out build/site]   (or: make html)

The pages are the notebooks as `make run` (or `make test`) executed them, outputs and figures
included (myst-nb reads them and executes nothing). The site has what readers of course sites
built with the field's tools (jupyter-book, d2l.ai) expect: a sidebar of chapters, an in-page
table of contents, previous/next links, full-text search that works from a local folder served
over HTTP (`python -m http.server -d build/site`), and on every page where, with which torch and
when its notebook ran, from the results that run recorded. A notebook that is missing,
unfinished or failed stops the build with its name: run `make run`. A notebook whose results
were rewritten by a later run of it alone (papermill, JupyterLab) is stale: its executed copy no
longer matches the numbers on disk, so it is executed again (`rerun`) before the site is built.
"""
import argparse
import json
import re
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / 'notebooks'
TITLE = 'Computational Performance, executable'
RUN_INFO = 'Executed on'  # how each page starts saying where its notebook ran (the test reads it)


def check_complete(nb, path):
    """Raise a SystemExit naming `path` unless every code cell ran without an error."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != 'code':
            continue
        if cell.get('execution_count') is None and cell.source.strip():
            raise SystemExit(f'{path}: code cell {i} was not executed; run `make run`')
        if any(o.get('output_type') == 'error' for o in cell.outputs):
            raise SystemExit(f'{path}: code cell {i} raised an error; run `make run`')


def run_window(nb):
    """(start, end) of the notebook's execution, from the timestamps its executor recorded."""
    stamps = [v for c in nb.cells if c.cell_type == 'code'
              for k, v in c.metadata.get('execution', {}).items() if k.startswith('iopub.')]
    stamps = [datetime.fromisoformat(s.replace('Z', '+00:00')) for s in stamps]
    return (min(stamps), max(stamps)) if stamps else (None, None)


class Stale(Exception):
    """The results on disk do not come from this executed notebook's run."""


def rerun(name, executed):
    """Execute notebooks/<name>.ipynb again into <executed>/ (as make run does), so that it and
    the results it records come from one run."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import execute
    partial = executed.parent / 'partial' / f'{name}.ipynb'
    partial.parent.mkdir(parents=True, exist_ok=True)
    print(f'{name}: its results were recorded by another run; executing it again')
    execute.main([str(NOTEBOOKS / f'{name}.ipynb'), str(partial), '--cwd', str(NOTEBOOKS)])
    partial.replace(executed / f'{name}.ipynb')


def run_info(name, nb, results_dir):
    """One line saying where, with what and when the notebook ran: from the results JSON that
    the same run recorded (its time must fall inside the run)."""
    path = results_dir / f'{name}.json'
    if not path.exists():
        raise SystemExit(f'{path} is missing: the executed notebook\'s results are needed to '
                         'say where it ran; run `make run`')
    payload = json.loads(path.read_text())
    recorded = datetime.fromisoformat(payload['recorded_at'])
    start, end = run_window(nb)
    if start is not None and not start <= recorded <= end:
        raise Stale(f'{path} was recorded at {recorded}, outside the run of {name} '
                    f'({start} to {end})')
    env = payload['environment']
    gpus = ', '.join(env['gpus']) or 'no GPU'
    return (f'{env["cpu"]} ({env["cpu_count"]} cores), {gpus}; torch {env["torch"]}, Python '
            f'{env["python"]}; {recorded:%Y-%m-%d %H:%M} UTC')


def executed_page(path, results):
    """(the executed notebook at `path`, its run line), executing it again first if stale."""
    nb = nbformat.read(path, 4)
    check_complete(nb, path)
    try:
        return nb, run_info(path.stem, nb, results)
    except Stale:
        rerun(path.stem, path.parent)
    nb = nbformat.read(path, 4)
    check_complete(nb, path)
    return nb, run_info(path.stem, nb, results)


def chapters():
    """[(notebook file, title, what it covers)] in course order; what it covers comes from the
    README's table, so the site and the README cannot disagree."""
    readme = (ROOT / 'README.md').read_text()
    covers = dict(re.findall(r'^\| `(\d\d_\w+\.ipynb)` \| (.+?) \|$', readme, re.M))
    out = []
    for path in sorted(NOTEBOOKS.glob('[0-9][0-9]_*.ipynb')):
        nb = nbformat.read(path, 4)
        title = nb.cells[0].source.splitlines()[0].lstrip('# ').strip()
        if path.name not in covers:
            raise SystemExit(f'README.md\'s table has no row for {path.name}')
        out.append((path.name, title, covers[path.name]))
    return out


def course_config():
    """The repository's address and branch, from pyproject.toml (as the Colab cells use)."""
    text = (ROOT / 'pyproject.toml').read_text()
    table = re.search(r'^\[tool\.course\]\s*$(.*?)(?=^\[|\Z)', text, re.M | re.S).group(1)
    return dict(re.findall(r'^(\w+)\s*=\s*"([^"]*)"', table, re.M))


def prepare(nb, info):
    """The page's notebook: the run's line under the title; the Colab badge, a remote image,
    becomes a plain link (the site loads nothing from elsewhere)."""
    for cell in nb.cells:
        if cell.cell_type == 'markdown':
            cell.source = re.sub(r'\[!\[Open In Colab\]\([^)]*\)\]', '[Open in Colab]',
                                 cell.source)
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(f'*{RUN_INFO} {info}.*'))
    return nb


def index_page(rows):
    """The book's front page: what the course is, its chapters, and the table of contents."""
    table = '\n'.join(f'| [{title}]({name}) | {covers} | {info} |'
                      for name, title, covers, info in rows)
    toc = '\n'.join(Path(name).stem for name, *_ in rows)
    return f'''# {TITLE}

The "Computational Performance" chapter of *Dive into Deep Learning*, rebuilt as notebooks that
measure the machine they run on. Each chapter is a notebook as it ran, with its outputs and
figures; each page says where and when, and so does the last column below.

| chapter | what it covers | executed on |
| --- | --- | --- |
{table}

```{{toctree}}
:hidden:
:maxdepth: 1
:caption: Chapters

{toc}
```
'''


def conf(config):
    """Sphinx's conf.py for the book."""
    repository = f'https://github.com/{config["repository"]}'
    footer = ('Built by <code>make html</code> from the notebooks as <code>make run</code> '
              'executed them; each page says on what machine, and when.')
    return f'''# Written by scripts/site.py for each build.
project = {TITLE!r}
html_title = {TITLE!r}
extensions = ['myst_nb']
myst_enable_extensions = ['dollarmath']
nb_execution_mode = 'off'           # the notebooks ran already (make run): show their outputs
nb_merge_streams = True             # one output block per cell, not one per print
html_theme = 'sphinx_book_theme'
html_theme_options = {{
    'repository_url': {repository!r},
    'repository_branch': {config["branch"]!r},
    'path_to_docs': 'notebooks',
    'use_repository_button': True,
    'launch_buttons': {{'colab_url': 'https://colab.research.google.com'}},
    'home_page_in_toc': True,
    'show_toc_level': 2,
    'use_download_button': False,
    'navbar_persistent': [],        # one search box (the sidebar's), not two
    'footer_content_items': ['extra-footer'],
    'extra_footer': {footer!r},
}}
html_copy_source = False
html_show_sourcelink = False
html_permalinks = True
exclude_patterns = []
'''


def build(executed, results, out):
    """Stage the pages in build/site-source/, run Sphinx into <out>.partial, then put it in
    place of <out> (readers never see half a site). Returns the index page."""
    started = time.monotonic()
    source = out.parent / f'{out.name}-source'
    shutil.rmtree(source, ignore_errors=True)
    source.mkdir(parents=True)
    rows = []
    for name, title, covers in chapters():
        path = executed / name
        if not path.exists():
            raise SystemExit(f'{path} is missing; run `make run`')
        nb, info = executed_page(path, results)
        nbformat.write(prepare(nb, info), source / name)
        rows.append((name, title, covers, info))
    (source / 'index.md').write_text(index_page(rows))
    (source / 'conf.py').write_text(conf(course_config()))
    partial = out.with_name(out.name + '.partial')
    shutil.rmtree(partial, ignore_errors=True)
    from sphinx.cmd.build import build_main
    code = build_main(['-b', 'html', '-q', '-d', str(source / '.doctrees'), '-W',
                       '--keep-going', str(source), str(partial)])
    if code:
        raise SystemExit(f'sphinx failed (exit {code}): see its messages above')
    shutil.rmtree(partial / '.doctrees', ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    print(f'site: {len(rows)} chapters in {time.monotonic() - started:.1f} s')
    return out / 'index.html'


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--executed', type=Path, default=ROOT / 'build' / 'executed')
    parser.add_argument('--results', type=Path, default=ROOT / 'build' / 'results')
    parser.add_argument('--out', type=Path, default=ROOT / 'build' / 'site')
    args = parser.parse_args(argv)
    index = build(args.executed, args.results, args.out.resolve())
    print(f'site: {index}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
