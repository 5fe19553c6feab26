"""Showing what a run measured: small tables, and the one verdict sentence per result.

In a notebook both render as Markdown (a table a reader can scan, a sentence in prose type);
anywhere else (a test, a script, a worker) they print as plain text. Numbers are formatted by
stats.format_value, so every notebook writes "15 us", "46%" and "1.2e+03 GB/s" the same way.
"""
from helpers import in_notebook
from stats import format_value


def _cell(value, unit):
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return '' if value is None else str(value)
    if isinstance(value, (int, float)):
        return format_value(value, unit)
    return str(value)


def markdown_table(rows, columns=None, units=None):
    """rows: a list of dicts (one per row), or a dict of dicts (row label -> values). columns:
    the keys to show, in order (default: every key, in first-seen order). units: key -> unit
    for stats.format_value ('s', '%', 'GB/s', ...). Returns the table as Markdown text."""
    if isinstance(rows, dict):
        rows = [{'': label, **values} for label, values in rows.items()]
    if not rows:
        raise ValueError('a table needs at least one row')
    if columns is None:
        columns = list(dict.fromkeys(k for row in rows for k in row))
    units = units or {}
    lines = ['| ' + ' | '.join(str(c) for c in columns) + ' |',
             '|' + '|'.join('---' for _ in columns) + '|']
    for row in rows:
        lines.append('| ' + ' | '.join(_cell(row.get(c), units.get(c, '')) for c in columns)
                     + ' |')
    return '\n'.join(lines)


def table(rows, columns=None, units=None, title=None):
    """Show a small table of this run's numbers (Markdown in a notebook, text elsewhere)."""
    text = markdown_table(rows, columns, units)
    if title:
        text = f'**{title}**\n\n{text}'
    _show(text)


def say(verdict):
    """Show one result's verdict: a stats.Comparison's or stats.AgainstModel's sentence."""
    _show(getattr(verdict, 'verdict', verdict))


def _show(text):
    if in_notebook():
        from IPython.display import Markdown, display
        display(Markdown(text))
    else:
        print(text)


def bars(groups, ylabel, title=None, log=False, reference=None, figsize=(6, 3)):
    """A grouped bar chart of this run's numbers: groups maps a group label (x axis) to
    {series label: value}; each series gets a colour and a legend entry, each bar its value.
    reference: draw a horizontal line there (1 for "as fast as the baseline"). Returns the
    figure; save it with helpers.save_fig."""
    import matplotlib.pyplot as plt
    series = list(dict.fromkeys(s for values in groups.values() for s in values))
    fig, ax = plt.subplots(figsize=figsize)
    width = 0.8 / len(series)
    for j, name in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(groups))]
        heights = [values.get(name, float('nan')) for values in groups.values()]
        ax.bar_label(ax.bar(xs, heights, width, label=name), fmt='%.3g', fontsize=7)
    if reference is not None:
        ax.axhline(reference, color='k', lw=0.8)
    ax.set_xticks(range(len(groups)), list(groups))
    ax.set(ylabel=ylabel, yscale='log' if log else 'linear', title=title)
    ax.legend(fontsize=8)
    return fig
