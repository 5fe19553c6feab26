"""The course on another PyTorch: its notebooks and tests, in an environment of their own.

    python scripts/compat.py --torch 2.15.0 [--all] [--install-only]
    make compat TORCH=2.15.0 [ALL=1]

1. `.venv-torch-<version>/` gets that torch and everything else the course installs, at the
   versions constraints.txt pins for CI (only torch differs; where that torch asks for other
   versions of its own dependencies, those follow it, and the run says so). `.venv` is never
   touched. On Linux x86_64 the registry's torch is a CUDA build of several GB; it runs on the
   CPU all the same, and a CPU wheel in a find-links folder (PIP_FIND_LINKS, pip.conf) is used
   where one is there.
2. The course (what a clone has, plus uncommitted work) is copied to
   `build/compat/torch-<version>/course/`, so that its runs, results and figures replace
   nothing of `.venv`'s.
3. There, pytest runs every notebook (nbmake) and every test but the browser and cluster ones
   (`--all` runs those too). Its output goes to the console and to `build/compat/torch-<version>/
   pytest.log`.
4. One verdict line per notebook: its run, its tests, and the warnings its cells printed. The
   README's table of tested versions gets this version's row (between its compat markers).

Exit status: 0 when everything passed, 1 otherwise.
"""
import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN = '<!-- compat: begin (rows written by `make compat`; do not edit by hand) -->'
END = '<!-- compat: end -->'
HEADER = ['| torch | what the registry gave | tested | result | time |',
          '| --- | --- | --- | --- | --- |']
# torch's own dependencies: when the torch asked for needs other versions of these than CI's
# pins, they follow torch (torch 2.5 pins sympy 1.13.1, CI pins a newer one).
TORCH_DEPENDENCIES = {'filelock', 'typing-extensions', 'sympy', 'mpmath', 'networkx', 'jinja2',
                      'markupsafe', 'fsspec', 'setuptools', 'triton'}
# The test of the README's table of tested versions: not run by make compat, which writes it.
README_TEST = 'tests/test_tooling.py::test_readme_table_shows_the_stated_lower_bound_passing'
LAB_RUN = 'test_notebook_runs_to_the_end_in_jupyterlab'  # the browser test's run of a notebook
WARNING = re.compile(r'^\s*(?:\S+:\d+: )?(\w*Warning): (.+)$', re.M)
# torch's own log lines at level W: 'W1123 17:39:45.963000 8985 torch/x.py:183] [0/0] message'
TORCH_LOG = re.compile(r'^W\d{4} \S+ \d+ (\S+?):\d+\] (?:\[[^\]]*\] )?(.+)$', re.M)


# ----------------------------------------------------------------------- input
def check_version(text):
    """The torch version asked for, as X.Y or X.Y.Z; anything else is refused by name."""
    if not isinstance(text, str) or not re.fullmatch(r'\d+\.\d+(\.\d+)?', text.strip()):
        raise ValueError(f'TORCH must be a release number such as 2.15.0, got {text!r}')
    return text.strip()


def version_key(version):
    return tuple(int(part) for part in re.findall(r'\d+', version.split('+')[0])[:3])


# ------------------------------------------------------------------- the venv
def constraints_without(text, names):
    """constraints.txt's text less the lines pinning any of `names` (normalised names)."""
    norm = lambda name: re.sub(r'[-_.]+', '-', name).lower()
    drop = {norm(n) for n in names}
    keep = []
    for line in text.splitlines():
        match = re.match(r'\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*[=<>!~]', line)
        if match and norm(match.group(1)) in drop:
            continue
        keep.append(line)
    return '\n'.join(keep) + '\n'


def find_links():
    """The wheel folders pip is told about (PIP_FIND_LINKS or pip.conf), which uv does not read."""
    links = os.environ.get('PIP_FIND_LINKS', '')
    if not links:
        done = subprocess.run([sys.executable, '-m', 'pip', 'config', 'get', 'global.find-links'],
                              capture_output=True, text=True)
        links = done.stdout.strip() if done.returncode == 0 else ''
    return [arg for link in links.split() for arg in ('--find-links', link)]


def install(version, venv, python):
    """Make `venv` hold torch==version and the course's pinned requirements; returns a note
    when torch's own dependencies had to follow it instead of CI's pins, else ''."""
    inputs = [ROOT / n for n in ('requirements.txt', 'requirements-dev.txt', 'constraints.txt')]
    # --seed: pip (and, before Python 3.12, setuptools) as `python -m venv` gives a learner;
    # torch 2.4's inductor imports setuptools on Python 3.11 without declaring it
    make_venv = ['venv', '--quiet', '--seed', '--python', python, str(venv)]
    digest = hashlib.sha256(b''.join(p.read_bytes() for p in inputs) + version.encode()
                            + ' '.join(make_venv).encode())
    stamp = venv / '.installed'
    if stamp.exists() and stamp.read_text().split('\n')[0] == digest.hexdigest():
        return stamp.read_text().split('\n', 1)[1].strip()
    uv = Path(sys.executable).parent / 'uv'
    shutil.rmtree(venv, ignore_errors=True)  # made anew: nothing left from another recipe
    subprocess.run([str(uv), *make_venv], check=True)
    # an override, not a requirement: versions below requirements.txt's bound are tested too,
    # which is how the bound is found
    override = venv / 'torch-override.txt'
    override.write_text(f'torch=={version}\n')
    base = [str(uv), 'pip', 'install', '--compile-bytecode',
            '--python', str(venv / 'bin' / 'python'), '-r', str(ROOT / 'requirements-dev.txt'),
            '--override', str(override), *find_links()]
    constraints = (ROOT / 'constraints.txt').read_text()
    note = ''
    for drop in ({'torch'}, {'torch'} | TORCH_DEPENDENCIES):
        pins = venv / 'constraints.txt'
        pins.write_text(constraints_without(constraints, drop))
        done = subprocess.run([*base, '-c', str(pins)], text=True, stderr=subprocess.PIPE)
        if done.returncode == 0:
            break
        print(done.stderr[-3000:], file=sys.stderr)
        note = 'follow'
        print(f'compat: torch {version} needs other versions of its own dependencies than '
              "constraints.txt's: trying again with those following torch", file=sys.stderr)
    else:
        raise SystemExit(f'compat: torch=={version} could not be installed with the course '
                         'requirements (uv\'s message above)')
    if note:
        python_ = str(venv / 'bin' / 'python')
        frozen = subprocess.run([str(uv), 'pip', 'freeze', '--python', python_],
                                capture_output=True, text=True, check=True).stdout
        norm = lambda name: re.sub(r'[-_.]+', '-', name).lower()
        pins = lambda text: {norm(name): got for name, got in (
            line.split('==', 1) for line in text.splitlines()
            if '==' in line and not line.startswith('#'))}
        ci, here = pins(constraints), pins(frozen)
        moved = [f'{name} {got} (CI: {ci[name]})' for name, got in sorted(here.items())
                 if name in ci and ci[name] != got and name != 'torch']
        note = f'torch {version} brings its own ' + ', '.join(moved)
    stamp.write_text(f'{digest.hexdigest()}\n{note}\n')
    return note


def describe(venv):
    """{'torch', 'cuda', 'gpu', 'python', 'gigabytes'} of the environment's torch."""
    probe = ('import json, sys, torch; print(json.dumps({"torch": torch.__version__, '
             '"cuda": torch.version.cuda, "python": sys.version.split()[0], "gpu": '
             'torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))')
    done = subprocess.run([str(venv / 'bin' / 'python'), '-c', probe], capture_output=True,
                          text=True, check=True)
    info = json.loads(done.stdout.strip().splitlines()[-1])
    size = sum(f.stat().st_size for f in (venv / 'lib').rglob('*') if f.is_file()
               and not f.is_symlink())
    return {**info, 'gigabytes': round(size / 1e9, 1)}


def build_text(info):
    """What the registry gave, in words: 'CUDA 12.1 build, 6.1 GB, run on the CPU'."""
    where = f'run on {info["gpu"]}' if info.get('gpu') else 'run on the CPU'
    if info['cuda']:
        return f'CUDA {info["cuda"]} build, {info["gigabytes"]} GB, {where}'
    return f'CPU build, {info["gigabytes"]} GB'


# ----------------------------------------------------------------- the course
def copy_course(dest):
    """The files a clone has plus uncommitted work (git's view), .git itself (tests list the
    course's files with git) and the real data set if it is here; nothing built."""
    listed = subprocess.run(['git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'],
                            cwd=ROOT, capture_output=True, text=True, check=True).stdout
    shutil.rmtree(dest, ignore_errors=True)
    for name in filter(None, listed.split('\0')):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(ROOT / '.git', dest / '.git', symlinks=True)
    data = ROOT / 'data' / 'fashion-mnist'
    if data.is_dir():
        shutil.copytree(data, dest / 'data' / 'fashion-mnist')
    return dest


def run_tests(course, venv, log, junit, run_all, extra):
    """pytest in the copy with the venv's interpreter; its output to the console and `log`."""
    env = {k: v for k, v in os.environ.items()
           if k not in ('PYTHONPATH', 'VIRTUAL_ENV') and not k.startswith('COURSE_')}
    env.update(VIRTUAL_ENV=str(venv), VENV=str(venv),  # the Makefile's targets use it too
               PATH=f'{venv / "bin"}{os.pathsep}{env.get("PATH", "")}')
    markers = [] if run_all else ['-m', 'not browser and not cluster']
    cmd = [str(venv / 'bin' / 'python'), '-m', 'pytest', '-p', 'no:cacheprovider',
           '-o', 'junit_family=xunit1', f'--junitxml={junit}', *markers,
           '--deselect', README_TEST, *extra]
    with open(log, 'w') as out:
        process = subprocess.Popen(cmd, cwd=course, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        for line in process.stdout:
            sys.stdout.write(line)
            out.write(line)
        return process.wait()


# -------------------------------------------------------------------- verdicts
def test_cases(junit):
    """[(file, name, outcome, seconds, message)] from pytest's junit XML (xunit1)."""
    cases = []
    for case in ET.parse(junit).getroot().iter('testcase'):
        outcome, message = 'passed', ''
        for tag in ('failure', 'error', 'skipped'):
            found = case.find(tag)
            if found is not None:
                outcome = {'failure': 'failed', 'error': 'error'}.get(tag, 'skipped')
                message = re.sub(r'(?:\x1b|#x1B)\[[0-9;]*m', '',  # colours, as junit keeps them
                                 found.get('message') or found.text or '').strip()
                break
        cases.append((case.get('file', ''), case.get('name', ''), outcome,
                      float(case.get('time', 0)), message))
    return cases


def notebook_warnings(path):
    """['Category: message', ...] that the executed notebook's cells printed, each once."""
    if not path.exists():
        return []
    nb = json.loads(path.read_text())
    seen = []
    for cell in nb['cells']:
        for out in cell.get('outputs', []):
            if out.get('output_type') == 'stream' and out.get('name') == 'stderr':
                text = ''.join(out['text']) if isinstance(out['text'], list) else out['text']
                found = WARNING.findall(text) + [(f'torch log warning ({where})', message)
                                                 for where, message in TORCH_LOG.findall(text)]
                for category, message in found:
                    item = f'{category}: {message.strip()[:160]}'
                    if item not in seen:
                        seen.append(item)
    return seen


def pytest_warnings(log_text):
    """['Category: message', ...] from the warnings summary of pytest's output, each once."""
    section = log_text.split('warnings summary', 1)[-1].split('-- Docs:', 1)[0] \
        if 'warnings summary' in log_text else ''
    found = []
    for category, message in WARNING.findall(section):
        item = f'{category}: {message.strip()[:160]}'
        if item not in found:
            found.append(item)
    return found


def count(outcomes):
    parts = [f'{outcomes.count(o)} {o}' for o in ('passed', 'failed', 'error', 'skipped')
             if outcomes.count(o)]
    return ', '.join(parts) or 'no tests'


def notebook_numbers(test_file, test_name=''):
    """The notebooks a test serves: the one its name starts with (test_03_...), else those of
    its per-notebook file (tests/test_02_03_measured.py -> 02, 03)."""
    named = re.match(r'test_(\d\d)_', test_name)
    if named:
        return [named.group(1)]
    name = Path(test_file).name
    return re.findall(r'(?<=_)(\d\d)(?=_)', name) if name.startswith('test_') else []


def verdicts(cases, notebooks, executed):
    """One row per notebook: {'notebook', 'ok', 'line'}; then one for the other tests."""
    rows, claimed = [], set()
    for path in notebooks:
        number = path.name[:2]
        own = [c for c in cases if c[0].endswith(path.name) or c[1].endswith(f'[{path.name}]')
               or number in notebook_numbers(c[0], c[1])]
        claimed.update(id(c) for c in own)
        runs = [c for c in own if c[0].endswith(path.name) or c[1] == f'{LAB_RUN}[{path.name}]']
        tests = [c for c in own if c not in runs]
        failed = [c for c in runs + tests if c[2] in ('failed', 'error')]  # the run's first
        status = 'FAIL' if failed else 'pass' if runs else 'not run'
        run = f'ran in {runs[0][3]:.0f} s' if runs and runs[0][2] == 'passed' else (
            f'run {runs[0][2]}' if runs else 'notebook not run')
        line = f'{status}: {run}; tests {count([c[2] for c in tests])}'
        if failed:
            line += f'; first failure: {failed[0][1]}: {failed[0][4].splitlines()[0][:200]}' \
                if failed[0][4] else f'; first failure: {failed[0][1]}'
        found = notebook_warnings(executed / path.name)
        if found:
            line += f'; warnings printed ({len(found)}): ' + ' | '.join(found)
        rows.append({'notebook': path.stem, 'ok': status == 'pass', 'ran': bool(runs),
                     'failed': bool(failed), 'line': line, 'warnings': found})
    rest = [c for c in cases if id(c) not in claimed]
    bad = [c for c in rest if c[2] in ('failed', 'error')]
    line = f'{"pass" if not bad else "FAIL"}: {count([c[2] for c in rest])}'
    if bad:
        line += '; failed: ' + ', '.join(f'{Path(c[0]).name}::{c[1]}' for c in bad[:5])
    rows.append({'notebook': 'other tests', 'ok': not bad, 'ran': bool(rest),
                 'failed': bool(bad), 'line': line, 'warnings': []})
    return rows


def minutes(seconds):
    return f'{int(seconds // 60)} min {int(seconds % 60):02d} s' if seconds >= 60 \
        else f'{seconds:.0f} s'


# ------------------------------------------------------------------ the README
def render_row(summary):
    """The README row of one `make compat` run."""
    notebooks = [r for r in summary['rows'] if r['notebook'] != 'other tests']
    passed = sum(r['ok'] for r in notebooks)
    warned = sum(bool(r['warnings']) for r in notebooks)
    result = 'pass' if summary['ok'] else 'FAIL'
    result += f': {passed}/{len(notebooks)} notebooks, {summary["tests"]}'
    if warned:
        result += f'; warnings printed in {warned}'
    if not summary['all']:
        result += '; browser and cluster tests not run'
    return (f'| {summary["asked"]} | {build_text(summary["info"])} | {summary["date"]} | '
            f'{result} | {minutes(summary["seconds"])} |')


def update_table(text, row):
    """The README text with `row` in the compat table (replacing the row for the same torch),
    rows ordered newest torch first. Raises ValueError when the markers are missing."""
    if BEGIN not in text or END not in text:
        raise ValueError(f'README.md has no compat table: add the lines {BEGIN!r} and {END!r}')
    head, rest = text.split(BEGIN, 1)
    body, tail = rest.split(END, 1)
    version = lambda line: line.split('|')[1].strip()
    rows = [line for line in body.strip().splitlines()
            if line.startswith('|') and line not in HEADER and version(line) != version(row)]
    rows = sorted(rows + [row], key=lambda line: version_key(version(line)), reverse=True)
    return head + BEGIN + '\n' + '\n'.join(HEADER + rows) + '\n' + END + tail


def table_rows(text):
    """{torch version: result} of the README's compat table."""
    if BEGIN not in text or END not in text:
        return {}
    body = text.split(BEGIN, 1)[1].split(END, 1)[0]
    return {line.split('|')[1].strip(): line.split('|')[4].strip()
            for line in body.strip().splitlines() if line.startswith('|') and line not in HEADER}


# ------------------------------------------------------------------------ main
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--torch', required=True, help='the torch release, e.g. 2.15.0')
    parser.add_argument('--python', default='python3', help='the interpreter the venv is made from')
    parser.add_argument('--all', action='store_true', help='the browser and cluster tests too')
    parser.add_argument('--install-only', action='store_true', help='make the venv, run nothing')
    args, pytest_args = parser.parse_known_args(argv)
    args.pytest_args = pytest_args  # anything else goes to pytest (and the README is not
    # written then: the run did not cover everything)
    try:
        version = check_version(args.torch)
    except ValueError as e:
        raise SystemExit(f'compat: {e}') from None
    venv = ROOT / f'.venv-torch-{version}'
    work = ROOT / 'build' / 'compat' / f'torch-{version}'
    work.mkdir(parents=True, exist_ok=True)
    tik = time.monotonic()
    note = install(version, venv, args.python)
    info = describe(venv)
    print(f'compat: {venv.name}: torch {info["torch"]} ({build_text(info)}), Python '
          f'{info["python"]}, ready in {minutes(time.monotonic() - tik)}'
          + (f'; {note}' if note else ''), flush=True)
    if args.install_only:
        return 0
    course = copy_course(work / 'course')
    junit, log = work / 'junit.xml', work / 'pytest.log'
    junit.unlink(missing_ok=True)
    tik = time.monotonic()
    code = run_tests(course, venv, log, junit, args.all, args.pytest_args)
    seconds = time.monotonic() - tik
    if not junit.exists():
        raise SystemExit(f'compat: pytest wrote no report (exit {code}); see {log}')
    cases = test_cases(junit)
    notebooks = sorted((course / 'notebooks').glob('[0-9][0-9]_*.ipynb'))
    rows = verdicts(cases, notebooks, course / 'build' / 'executed')
    ok = code == 0 and not any(r['failed'] for r in rows) and (
        bool(args.pytest_args) or all(r['ran'] for r in rows))  # a full run runs everything
    outcomes = [c[2] for c in cases]
    warned = pytest_warnings(log.read_text())
    summary = {'asked': version, 'info': info, 'note': note, 'rows': rows, 'ok': ok,
               'pytest_warnings': warned,
               'all': args.all, 'tests': count(outcomes), 'seconds': round(seconds),
               'date': datetime.now(timezone.utc).date().isoformat(), 'pytest_exit': code}
    (work / 'summary.json').write_text(json.dumps(summary, indent=2) + '\n')
    width = max(len(r['notebook']) for r in rows)
    print(f'\ncompat: torch {info["torch"]} ({build_text(info)}), Python {info["python"]}: '
          f'tests {minutes(seconds)}')
    for r in rows:
        print(f'  {r["notebook"]:<{width}}  {r["line"]}')
    for item in warned:
        print(f'  {"warned in tests":<{width}}  {item}')
    print(f'compat: torch {version}: {"pass" if ok else "FAIL"} ({count(outcomes)}); '
          f'log {log.relative_to(ROOT)}')
    if args.pytest_args:
        print('compat: the README is not updated: pytest was given arguments')
    else:
        readme = ROOT / 'README.md'
        readme.write_text(update_table(readme.read_text(), render_row(summary)))
        print('compat: README.md\'s table of tested torch versions updated')
    return 0 if ok else 1


if __name__ == '__main__':
    sys.exit(main())
