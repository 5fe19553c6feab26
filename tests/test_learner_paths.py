"""Every way a learner starts the course, tested the way they start it: Colab's install cell,
`make lab` in a real browser, and the rendered site (`make html`)."""
import contextlib
import functools
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from urllib.parse import urljoin, urlparse

import nbformat
import psutil
import pytest

from conftest import CHROMIUM, browser_missing, keep_default_run, load_script

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / 'notebooks').glob('[0-9][0-9]_*.ipynb'))
# Debian's chromium as root in a closed network: no sandbox, no GPU, no background traffic.
CHROMIUM_FLAGS = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
                  '--disable-background-networking', '--disable-component-update',
                  '--disable-sync']
OFFLINE = {'http_proxy': 'http://127.0.0.1:9', 'https_proxy': 'http://127.0.0.1:9',
           'no_proxy': '127.0.0.1,localhost'}  # anything but loopback hits a closed port


colab = load_script('colab')


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def clean_env(**extra):
    """The environment of a fresh process: no course paths or directories inherited."""
    env = {k: v for k, v in os.environ.items()
           if k != 'PYTHONPATH' and not k.startswith('COURSE_')}
    return {**env, **extra}


@contextlib.contextmanager
def serve(directory):
    """An HTTP server for `directory` on 127.0.0.1; yields its base URL."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass
    handler = functools.partial(Quiet, directory=str(directory))
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f'http://127.0.0.1:{server.server_address[1]}/'
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def browser_or_skip():
    """Playwright with Debian's chromium; under CI=true a missing browser is a failure."""
    missing = browser_missing()
    if missing:
        if os.environ.get('CI') == 'true':
            pytest.fail(f'CI=true and the browser test cannot run: {missing}')
        pytest.skip(f'browser test did not run: {missing}')
    from playwright.sync_api import sync_playwright
    return sync_playwright


# ---------------------------------------------------------------------------- Colab
@pytest.fixture(scope='module')
def raw_github(tmp_path_factory):
    """The course's files laid out as raw.githubusercontent.com serves them, on 127.0.0.1.
    Only files git knows (tracked, or new and not ignored) are served, as a clone would have."""
    config = colab.course_config()
    root = tmp_path_factory.mktemp('raw')
    dest = root / config['repository'] / config['branch']
    listed = subprocess.run(['git', 'ls-files', '--cached', '--others', '--exclude-standard'],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in listed:
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    with serve(root) as url:
        yield url


@pytest.fixture(scope='module')
def colab_runs(raw_github, tmp_path_factory):
    """Each notebook's install cell run as Colab runs it: google.colab imported, an empty
    working directory, the course fetched over HTTP, no network beyond loopback. Then, in one
    fresh interpreter (torch is imported once), every course module each notebook imports is
    imported from that notebook's directory. Returns {notebook: (directory, problems)}."""
    stand_in = ('import sys, types\n'
                "sys.modules['google.colab'] = types.ModuleType('google.colab')\n")
    dirs, runs = {}, {}
    for path in NOTEBOOKS:
        nb = nbformat.read(path, 4)
        install = nb.cells[colab.colab_cells(nb)[1]].source
        local = install.replace(colab.RAW, raw_github)
        content = dirs[path.name] = tmp_path_factory.mktemp(path.stem[:2]) / 'content'
        content.mkdir()
        if local == install:
            runs[path.name] = f'the install cell does not fetch from {colab.RAW}'
            continue
        done = subprocess.run([sys.executable, '-c', stand_in + local], cwd=content,
                              env=clean_env(**OFFLINE), capture_output=True, text=True,
                              timeout=60)
        runs[path.name] = done.stderr[-2000:] if done.returncode else ''
    imports = {name: sorted(colab.imported_modules(colab.code_of(nbformat.read(
        ROOT / 'notebooks' / name, 4))) & colab.first_party_modules()) for name in dirs}
    check = f'''
import importlib, json, os, pathlib, sys, traceback
ours, report = {sorted(colab.first_party_modules())!r}, {{}}
for name, (directory, modules) in {({k: (str(v), imports[k]) for k, v in dirs.items()})!r}.items():
    for m in ours:
        sys.modules.pop(m, None)
    os.chdir(directory)
    sys.path[0] = directory
    here = pathlib.Path(directory).resolve()
    try:
        for m in modules:
            module = importlib.import_module(m)
            assert pathlib.Path(module.__file__).resolve().parent == here, module.__file__
        import helpers
        assert helpers.ROOT == here, f'ROOT is {{helpers.ROOT}}'
        for d in (helpers.FIGURES_DIR, helpers.RESULTS_DIR, helpers.TRACES_DIR, helpers.DATA_DIR):
            assert d.resolve().is_relative_to(here), d
        helpers.record('colab_check', {{'ok': True}})
        report[name] = ''
    except Exception:
        report[name] = traceback.format_exc()[-2000:]
print(json.dumps(report))
'''
    done = subprocess.run([sys.executable, '-c', check], cwd=tmp_path_factory.getbasetemp(),
                          env=clean_env(**OFFLINE), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: (dirs[name], runs[name] or imported[name], imports[name]) for name in dirs}


@pytest.mark.parametrize('path', NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_colab_install_cell_brings_every_course_module(path, colab_runs):
    """What a notebook imports from the course works in a fresh Colab runtime, and what the
    course writes (figures, results, traces, data) lands in Colab's working directory."""
    content, problem, imported = colab_runs[path.name]
    assert not problem, problem
    assert 'helpers' in imported
    assert (content / 'build' / 'results' / 'colab_check.json').exists()
    fetched = {p.stem for p in content.glob('*.py')}
    assert fetched == set(colab.modules_needed(nbformat.read(path, 4))), \
        'the cell fetches exactly the modules the notebook needs'


# ------------------------------------------------------------------------ JupyterLab
@pytest.fixture(scope='module')
def lab(tmp_path_factory):
    """`make lab` as a learner starts it (as root here, on 127.0.0.1), on a copy of the
    notebooks so that nothing JupyterLab saves touches the repository; results, figures and
    data go where the course's own runs put them. Yields (base, token, copy)."""
    browser_or_skip()   # no server without a browser to drive it
    work = tmp_path_factory.mktemp('lab')
    course = work / 'notebooks'
    shutil.copytree(ROOT / 'notebooks', course, ignore=shutil.ignore_patterns('__pycache__'))
    settings = work / 'settings' / '@jupyterlab' / 'notebook-extension'
    settings.mkdir(parents=True)
    # Render every cell, not only those on screen, so the test sees every output; record when
    # each cell ran, as nbmake and papermill do (the site checks its results against that).
    (settings / 'tracker.jupyterlab-settings').write_text(
        json.dumps({'windowingMode': 'none', 'recordTiming': True}))
    env = clean_env(JUPYTERLAB_SETTINGS_DIR=str(work / 'settings'),
                    JUPYTERLAB_WORKSPACES_DIR=str(work / 'workspaces'),
                    JUPYTER_RUNTIME_DIR=str(work / 'runtime'), COURSE_ROOT=str(ROOT), **OFFLINE)
    server = subprocess.Popen(
        ['make', '--no-print-directory', 'lab', f'LAB_DIR={course}', f'LAB_PORT={free_port()}',
         'LAB_ARGS=--no-browser'], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    log, url = [], None
    reader = threading.Thread(target=lambda: log.extend(server.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 90
        while url is None and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.2)
            found = re.search(r'http://127\.0\.0\.1:(\d+)/lab\?token=(\w+)', ''.join(log))
            url = found and found.group(0)
        assert url, f'make lab printed no URL with a token:\n{"".join(log)[-3000:]}'
        base, token = url.split('/lab?token=')
        yield base, token, course
    finally:
        family = [server.pid] + [p.pid for p in psutil.Process(server.pid).children(
            recursive=True)] if server.poll() is None else [server.pid]
        if url:  # the server's own shutdown also stops its kernels
            with contextlib.suppress(OSError):
                urllib.request.urlopen(urllib.request.Request(
                    f'{base}/api/shutdown', method='POST',
                    headers={'Authorization': f'token {token}'}), timeout=30)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        alive = [p for p in family if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        for pid in alive:
            os.kill(pid, signal.SIGKILL)
        assert not alive, f'processes outlived the JupyterLab server: {alive}'
        # make lab has the kernel manager provision keys (LAB_KERNELS): no kernel warns
        assert 'Kernel is running over TCP without encryption' not in ''.join(log), \
            ''.join(log)[-3000:]


@pytest.fixture(scope='module')
def chromium():
    """One headless Chromium for this module's browser tests (a launch takes seconds on 2
    cores); each test opens a page of its own. Closed when the module's tests are done."""
    sync_playwright = browser_or_skip()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def run_all_in_lab(page, base, token, name, timeout=300):
    """Open a notebook (in a workspace of its own: no other tab open), run every cell through
    JupyterLab's menu, wait for the last one. Returns the notebook's panel and its prompts."""
    page.goto(f'{base}/lab/workspaces/{Path(name).stem}/tree/{name}?token={token}')
    panel = page.locator('.jp-NotebookPanel:visible')
    panel.locator('.jp-CodeCell').first.wait_for(timeout=90_000)
    # the kernel is connected once the status bar reads "Python 3 (ipykernel) | Idle"
    page.locator('.jp-StatusBar-Widget', has_text='| Idle').first.wait_for(timeout=90_000)
    page.get_by_role('menuitem', name='Run', exact=True).click()
    page.locator('.lm-Menu-item', has_text='Run All Cells').first.click()
    prompts = panel.locator('.jp-CodeCell .jp-InputPrompt')
    started = time.monotonic() + 60
    while not any(re.search(r'[*\d]', t) for t in prompts.all_inner_texts()):
        assert time.monotonic() < started, f'{name}: Run All Cells did not start the cells'
        time.sleep(0.2)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        texts = prompts.all_inner_texts()
        if not any('*' in t for t in texts):
            return panel, texts
        time.sleep(1)
    raise AssertionError(f'{name}: cells still running after {timeout} s')


def save_in_lab(page, path, code_cells, timeout=60):
    """File > Save Notebook; returns the notebook as written to disk, outputs included."""
    page.get_by_role('menuitem', name='File', exact=True).click()
    page.locator('.lm-Menu-item', has_text=re.compile(r'^Save Notebook(?!\s*As)')).first.click()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:  # JupyterLab may be writing the file this moment: read it again shortly
            nb = nbformat.read(path, 4)
        except (nbformat.reader.NotJSONError, json.JSONDecodeError):
            nb = None
        if nb is not None and code_cells == sum(bool(c.get('execution_count'))
                                                for c in nb.cells if c.cell_type == 'code'):
            return nb
        time.sleep(0.5)
    raise AssertionError(f'{path.name}: JupyterLab did not save the executed notebook')


# One notebook that starts worker processes and trains with an Animator proves the JupyterLab
# path (05 ran here too until its 83 s were needed elsewhere; its own tests run it under nbmake).
@pytest.mark.parametrize('name', ['06_multi_gpu_concise.ipynb'])
def test_notebook_runs_to_the_end_in_jupyterlab(lab, chromium, name):
    """Run All Cells in JupyterLab in headless Chromium: the kernel finishes every cell, no
    error appears, figures render as images, and each training run's Animator is one display
    redrawn in place (not one image per epoch). Saved from JupyterLab, this run is the
    notebook's default run for the tests that read its results (nbmake does not repeat it)."""
    base, token, course = lab
    code_cells = sum(c.cell_type == 'code' for c in
                     nbformat.read(ROOT / 'notebooks' / name, 4).cells)
    page = chromium.new_page(viewport={'width': 1400, 'height': 1000})
    try:
        panel, prompts = run_all_in_lab(page, base, token, name)
        errors = panel.locator('[data-mime-type="application/vnd.jupyter.error"]')
        assert errors.count() == 0, errors.first.inner_text()[-2000:]
        assert len(prompts) == code_cells and all(re.fullmatch(r'\[\d+\]:', t)
                                                 for t in prompts), prompts
        images = panel.locator('.jp-OutputArea-output img')
        assert images.count() > 0, 'no figure rendered'
        sizes = images.evaluate_all('imgs => imgs.map(i => [i.complete, i.naturalWidth])')
        assert all(done and width > 0 for done, width in sizes), sizes
        per_cell = panel.locator('.jp-CodeCell').evaluate_all('''cells => cells.map(c => [
            c.querySelectorAll('.jp-OutputArea-output img').length,
            (c.querySelector('.jp-OutputArea')?.innerText.match(/test acc/g) || []).length])''')
        training = [(imgs, runs) for imgs, runs in per_cell if runs]
        assert training, 'no training run reported its test accuracy'
        assert all(imgs <= runs for imgs, runs in training), \
            f'more images than training runs (images, runs) per cell: {training}'
        keep_default_run(save_in_lab(page, course / name, code_cells), name)
    finally:
        page.close()


# ------------------------------------------------------------------------------ site
@pytest.fixture(scope='module')
def site(default_run, tmp_path_factory):
    """`make html` on the runs of this session (nbmake's, reused when fresh)."""
    for path in NOTEBOOKS:
        default_run(path.stem)  # after the notebooks have run (or run them now)
    out = tmp_path_factory.mktemp('site') / 'site'
    done = subprocess.run(['make', '--no-print-directory', 'html', f'SITE_DIR={out}'],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def chapter_pages():
    return [p.stem + '.html' for p in NOTEBOOKS]


@contextlib.contextmanager
def site_page(site, chromium):
    """(page, base URL) of a browser page on the site served over HTTP from its folder, as a
    reader serves it; requests anywhere but that server are refused (the site is offline)."""
    with serve(site) as url:
        page = chromium.new_page(viewport={'width': 1280, 'height': 900})
        local = urlparse(url).netloc
        page.route('**/*', lambda route: route.continue_() if urlparse(
            route.request.url).netloc == local else route.abort())
        try:
            yield page, url
        finally:
            page.close()


def test_site_pages_images_and_links_all_resolve(site, chromium):
    """From the front page, every local link leads somewhere: each page loads with every image,
    and every other file it links answers. Each chapter page has the sidebar of all chapters,
    its own table of contents, a figure, and says where and when its notebook ran."""
    pages = sorted(p.name for p in site.glob('*.html'))
    assert set(pages) >= {'index.html', 'search.html', *chapter_pages()}, pages
    with site_page(site, chromium) as (page, url):
        local = urlparse(url).netloc
        seen, files, todo = set(), set(), [urljoin(url, 'index.html')]
        while todo:
            target = todo.pop()
            if target in seen:
                continue
            seen.add(target)
            response = page.goto(target, wait_until='load')
            assert response and response.ok, f'{target}: {response and response.status}'
            images = page.locator('img').evaluate_all(
                'imgs => imgs.map(i => [i.src.slice(0, 80), i.complete && i.naturalWidth > 0])')
            broken = [src for src, ok in images if not ok]
            assert not broken, f'{target}: images that did not load: {broken}'
            for link in page.locator('a[href]').evaluate_all('as => as.map(a => a.href)'):
                link = link.split('#')[0].split('?')[0]
                if urlparse(link).netloc != local:
                    continue
                if link.endswith(('.html', '/')):
                    todo.append(link)
                else:
                    files.add(link)
            name = urlparse(target).path.lstrip('/')
            if name in chapter_pages():
                text = page.locator('article').inner_text()
                assert re.search(r'Executed on .+torch \d.+UTC', text), f'{name}: no run info'
                assert images, f'{name}: a chapter page with no figure'
                sidebar = page.locator('nav.bd-docs-nav a').evaluate_all(
                    'as => as.map(a => a.getAttribute("href"))')
                assert set(sidebar) >= set(chapter_pages()) - {name}, sidebar
                toc = page.locator('nav.page-toc a')
                assert toc.count() >= 3, f'{name}: no table of contents of its sections'
        for link in sorted(files):
            response = page.request.get(link)
            assert response.ok, f'{link}: {response.status}'
        assert {urlparse(s).path.lstrip('/') for s in seen} >= {'index.html',
                                                               *chapter_pages()}


def test_site_previous_and_next_chain_through_every_chapter_in_order(site, chromium):
    """Next from the front page walks every chapter in course order, the last has no next,
    and previous walks back: in the page's links (rel=next/prev) and its buttons."""
    with site_page(site, chromium) as (page, url):
        order, target = [], 'index.html'
        while target:
            assert target not in order, f'the chain loops: {order + [target]}'
            order.append(target)
            page.goto(urljoin(url, target))
            rel = page.locator('link[rel="next"]')
            target = rel.get_attribute('href') if rel.count() else None
            if order[-1] != 'index.html':
                button = page.locator('a.right-next')
                assert (button.get_attribute('href') if button.count() else None) == target
                back = page.locator('a.left-prev').get_attribute('href')
                assert back == order[-2], f'{order[-1]}: previous is {back}'
        assert order == ['index.html', *chapter_pages()]


def test_site_search_finds_a_word_in_the_one_chapter_that_has_it(site, chromium):
    """Search works from a folder served over HTTP: for each chapter, a word that appears in
    its prose and nowhere else on the site finds that chapter and no other page."""
    import snowballstemmer  # Sphinx's; only this test needs it, so only it imports it

    stem = snowballstemmer.stemmer('porter').stemWord  # the stemmer of Sphinx's English search
    vocabulary = lambda text: set(re.findall(r'[a-z]+', text))
    texts = {}
    for name in ['index.html', *chapter_pages()]:
        html = (site / name).read_text()
        body = html.split('<article', 1)[-1].split('</article>', 1)[0]
        texts[name] = re.sub(r'<[^>]+>', ' ', body).lower()
    searched = 0
    with site_page(site, chromium) as (page, url):
        for path in NOTEBOOKS:
            name = path.stem + '.html'
            prose = ' '.join(c.source for c in nbformat.read(path, 4).cells
                             if c.cell_type == 'markdown').lower()
            # Sphinx indexes stems of words, and a search also finds terms that contain the
            # searched stem: the word's stem must be no part of any other page's word or stem
            others = vocabulary(' '.join(t for n, t in texts.items() if n != name))
            others = '\n'.join(others | {stem(w) for w in others})
            word = next((w for w in sorted(vocabulary(prose) & vocabulary(texts[name]))
                         if len(w) >= 8 and len(stem(w)) >= 5 and stem(w) not in others), None)
            if word is None:
                continue
            page.goto(urljoin(url, f'search.html?q={word}'))
            page.wait_for_function(
                '() => /Search finished/.test(document.getElementById("search-results")'
                '?.innerText || "")', timeout=30_000)
            found = page.locator('#search-results a').evaluate_all(
                'as => as.map(a => a.getAttribute("href"))')
            pages = {h.split('#')[0].split('?')[0] for h in found}
            assert pages == {name}, f'searching {word!r}: {found}'
            searched += 1
    assert searched >= len(NOTEBOOKS) // 2, 'too few chapters have a word of their own'


def test_site_refuses_an_unfinished_notebook(tmp_path):
    """A notebook that did not run to the end stops the build, naming itself."""
    site = load_script('site')
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell('1 + 1')])
    with pytest.raises(SystemExit, match='cell 0 was not executed'):
        site.check_complete(nb, tmp_path / 'x.ipynb')
    nb.cells[0].execution_count = 1
    nb.cells[0].outputs = [nbformat.v4.new_output('error', ename='E', evalue='v', traceback=[])]
    with pytest.raises(SystemExit, match='cell 0 raised an error'):
        site.check_complete(nb, tmp_path / 'x.ipynb')


def test_site_pages_say_where_they_ran_and_load_nothing_remote():
    """Each page gets its run's line under its title; the Colab badge (a remote image) becomes
    a plain link; the front page's table of contents lists the chapters in course order."""
    site = load_script('site')
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell('# 1. Title\n\nThe idea.'),
        nbformat.v4.new_markdown_cell('[![Open In Colab](https://colab.research.google.com/'
                                      'assets/colab-badge.svg)](https://colab.research.google.'
                                      'com/github/o/r/blob/main/notebooks/01_x.ipynb)')])
    page = site.prepare(nb, 'a CPU (2 cores), no GPU; torch 2.13.0, Python 3.11.7; 2026-11-23')
    assert page.cells[1].source == ('*Executed on a CPU (2 cores), no GPU; torch 2.13.0, '
                                    'Python 3.11.7; 2026-11-23.*')
    assert page.cells[2].source.startswith('[Open in Colab](https://colab.research.google.com/')
    assert 'colab-badge.svg' not in page.cells[2].source
    rows = [(p.name, f'{i}. T', 'covers', 'info') for i, p in enumerate(NOTEBOOKS, 1)]
    toc = site.index_page(rows).split('```{toctree}')[1].split('```')[0]
    assert re.findall(r'^\d\d_\w+$', toc, re.M) == [p.stem for p in NOTEBOOKS]
