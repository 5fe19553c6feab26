"""How a notebook reads: the figures the course's anatomy targets are stated in.

    python scripts/anatomy.py notebooks/[0-9]*.ipynb          # a table, one row per notebook
    python scripts/anatomy.py --check notebooks/[0-9]*.ipynb  # exit 1 past any target

Per notebook: its code cells and their lines; the longest and the median code cell; how many
cells run over 30 and over 40 lines; the setup cell (the first code cell after the one tagged
`parameters`); `prose`: the share of code lines holding English in a one-line string literal
(three or more words; docstrings and other triple-quoted text do not count), which is how
prose assembled in code shows; `conditionals`: inline conditional expressions (x if c else y),
how branching prose is built; and Markdown words per line of code.
"""
import argparse
import io
import json
import re
import statistics
import sys
import tokenize

# Three words in a row: prose, not a format spec, a path or a key.
ENGLISH = re.compile(r"[A-Za-z]{2,}\s+[A-Za-z,.;:'()-]+\s+[A-Za-z,.;:'()-]+")
# Tokens after which `if` starts a statement rather than an expression.
STATEMENT_START = {'NEWLINE', 'NL', 'INDENT', 'DEDENT', None, 'else'}

TARGETS = {  # figure: (limit, True when the figure must stay at or below it)
    'median': (12, True),
    'longest': (60, True),
    'over_30': (4, True),
    'setup': (12, True),
    'prose': (0.05, True),
    'conditionals': (10, True),
    'words_per_line': (4, False),
    'markdown_words': (5000, True),
    'markdown_cell': (250, True),   # the longest Markdown cell, in words
    'shown': (0, True),             # module source displayed instead of standing in a cell
}
# A call that displays a module's source (show(...), inspect.getsource(...)).
SHOWN = re.compile(r'(^|[^\w.])show\(|getsource\(')


def scan(source):
    """(code lines holding English in a one-line string, inline conditional expressions)."""
    prose_lines, conditionals, previous = set(), 0, None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            kind = tokenize.tok_name[tok.type]
            if kind in ('STRING', 'FSTRING_MIDDLE'):
                quoted = tok.string.lstrip('rbfuRBFU')
                if not quoted.startswith(('"""', "'''")) and ENGLISH.search(tok.string):
                    prose_lines.add(tok.start[0])
            if kind == 'NAME' and tok.string == 'if' and previous not in STATEMENT_START:
                conditionals += 1
            if kind not in ('COMMENT', 'NL'):
                previous = tok.string if tok.string in ('else', 'elif') else (
                    'NAME' if kind == 'NAME' else kind)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return len(prose_lines), conditionals


def figures(path):
    cells = json.load(open(path))['cells']
    source = lambda c: ''.join(c['source']) if isinstance(c['source'], list) else c['source']
    code = [source(c) for c in cells if c['cell_type'] == 'code']
    sizes = [len(s.splitlines()) for s in code]
    setup = 0
    for i, c in enumerate(cells):
        if 'parameters' in c.get('metadata', {}).get('tags', []):
            after = [source(d) for d in cells[i + 1:] if d['cell_type'] == 'code']
            setup = len(after[0].splitlines()) if after else 0
    scanned = [scan(s) for s in code]
    lines = sum(sizes)
    md = [len(source(c).split()) for c in cells if c['cell_type'] == 'markdown']
    words = sum(md)
    return {'cells': len(code), 'lines': lines, 'longest': max(sizes, default=0),
            'median': statistics.median(sizes) if sizes else 0,
            'over_40': sum(s > 40 for s in sizes), 'over_30': sum(s > 30 for s in sizes),
            'setup': setup, 'prose': sum(p for p, _ in scanned) / max(lines, 1),
            'conditionals': sum(c for _, c in scanned), 'markdown_words': words,
            'words_per_line': words / max(lines, 1), 'markdown_cell': max(md, default=0),
            'shown': sum(len(SHOWN.findall(s)) for s in code)}


MODULE_TARGETS = {  # a module's figures, each at most its limit
    'lines': 600,
    'longest_function': 60,
    'prose': 0.08,          # share of lines holding English in a one-line string
}


def module_figures(path):
    """A module's lines, its longest function (nested ones count alone), and its prose share."""
    import ast
    text = open(path).read()
    lengths = [(n.end_lineno - n.lineno + 1, n.name) for n in ast.walk(ast.parse(text))
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    lines = len(text.splitlines())
    longest, name = max(lengths, default=(0, '-'))
    return {'lines': lines, 'longest_function': longest, 'function': name,
            'prose': scan(text)[0] / max(lines, 1)}


def module_failures(fig):
    return [f'{k}={fig[k]:.3g} (at most {limit})' + (f' ({fig["function"]})'
                                                    if k == 'longest_function' else '')
            for k, limit in MODULE_TARGETS.items() if fig[k] > limit]


def failures(fig):
    """The targets a notebook's figures miss, as 'figure=value (target)' strings."""
    out = []
    for name, (limit, at_most) in TARGETS.items():
        value = fig[name]
        if (value > limit) if at_most else (value < limit):
            out.append(f'{name}={value:.3g} ({"at most" if at_most else "at least"} {limit})')
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('notebooks', nargs='*')
    ap.add_argument('--modules', nargs='*', help='modules: lines, longest function, prose')
    ap.add_argument('--check', action='store_true', help='exit 1 when a target is missed')
    args = ap.parse_args(argv)
    header = ('notebook', 'cells', 'lines', 'longest', 'median', '>30', '>40', 'setup', 'prose',
              'cond', 'words/line')
    print(f'{header[0]:<40}' + ''.join(f'{h:>11}' for h in header[1:]))
    missed = []
    for path in args.notebooks:
        f = figures(path)
        name = path.rsplit('/', 1)[-1]
        print(f'{name[:39]:<40}' + ''.join(f'{v:>11}' for v in (
            f['cells'], f['lines'], f['longest'], f'{f["median"]:g}', f['over_30'],
            f['over_40'], f['setup'], f'{f["prose"]:.0%}', f['conditionals'],
            f'{f["words_per_line"]:.1f}')))
        missed += [f'{name}: {m}' for m in failures(f)]
    for path in sorted(p for p in args.modules or ()):
        f = module_figures(path)
        print(f'{path.rsplit("/", 1)[-1]:<40}{f["lines"]:>11}{f["longest_function"]:>11}'
              f'{f["prose"]:>11.0%}  {f["function"]}')
        missed += [f'{path}: {m}' for m in module_failures(f)]
    if missed:
        print('\n'.join(['missed targets:'] + missed))
    return 1 if args.check and missed else 0


if __name__ == '__main__':
    sys.exit(main())
