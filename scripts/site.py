"""The executed course as a static site: one HTML page per chapter and an index.

    python scripts/site.py [--executed build/executed] [--out build/site]   (or: make html)

Pages are rendered by nbconvert from notebooks that `make run` (or `make test`) executed; each
page states where, with which torch and when it ran, from the results that run recorded.
A notebook that is missing, unfinished or failed stops the build with its name: run `make run`.
"""
import argparse
import concurrent.futures
import json
import re
import shutil
import sys
from datetime import datetime
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / 'notebooks'
TITLE = 'Computational Performance, executable'


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
        raise SystemExit(f'{path} was recorded at {recorded}, outside the run of {name} '
                         f'({start} to {end}); run `make run`')
    env = payload['environment']
    gpus = ', '.join(env['gpus']) or 'no GPU'
    return (f'{env["cpu"]} ({env["cpu_count"]} cores), {gpus}; torch {env["torch"]}, Python '
            f'{env["python"]}; {recorded:%Y-%m-%d %H:%M} UTC')


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


def render(nb):
    body, _ = HTMLExporter(template_name='lab').from_notebook_node(nb)
    return body


def page_notebook(title, markdown):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(markdown)]
    nb.metadata['title'] = title
    return nb


def build(executed, results, out):
    rows, pages = [], {}
    for name, title, covers in chapters():
        path = executed / name
        if not path.exists():
            raise SystemExit(f'{path} is missing; run `make run`')
        nb = nbformat.read(path, 4)
        check_complete(nb, path)
        info = run_info(path.stem, nb, results)
        html_name = name.replace('.ipynb', '.html')
        for cell in nb.cells:
            if cell.cell_type == 'markdown':  # links between notebooks link the pages, and
                cell.source = re.sub(r'\((\d\d_\w+)\.ipynb\)', r'(\1.html)', cell.source)
                cell.source = re.sub(r'\[!\[Open In Colab\]\([^)]*\)\]', '[Open in Colab]',
                                     cell.source)  # the badge is a link: no remote image
        nb.cells.insert(0, nbformat.v4.new_markdown_cell(
            f'[{TITLE}](index.html) · executed on {info}'))
        nb.metadata['title'] = title
        pages[html_name] = nb
        rows.append(f'| [{title}]({html_name}) | {covers} | {info} |')
    index = page_notebook(TITLE, '\n'.join([
        f'# {TITLE}',
        '',
        'The "Computational Performance" chapter of *Dive into Deep Learning*, rebuilt as '
        'notebooks that measure the machine they run on. Each page below is a notebook as it '
        'ran, with its outputs and figures; the last column says where and when.',
        '',
        '| chapter | what it covers | executed on |',
        '| --- | --- | --- |',
        *rows]))
    pages['index.html'] = index
    with concurrent.futures.ProcessPoolExecutor() as pool:  # a page takes seconds: one a core
        pages = dict(zip(pages, pool.map(render, pages.values())))
    partial = out.with_name(out.name + '.partial')
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for html_name, html in pages.items():
        (partial / html_name).write_text(html)
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)  # readers never see half a site
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
