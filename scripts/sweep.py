"""Run notebooks 05 and 06 through papermill over GPU counts; write a CSV table and figures.

    python scripts/sweep.py --counts 1 2 4        (or: make sweep COUNTS="1 2 4")

Each run gets num_gpus=N. Where the machine has fewer than N GPUs, CPU replicas (05) or CPU
processes (06) stand in for them; the table's `stand_in` column and the printed lines say so.
Executed notebooks go to build/sweep/, the table to build/sweep/results.csv, figures to figures/.
"""
import argparse
import csv
import json
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import papermill  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / 'notebooks'))
import helpers  # noqa: E402

NOTEBOOKS = ('05_multi_gpu_from_scratch', '06_multi_gpu_concise')
COLUMNS = ['notebook', 'num_gpus', 'gpus_found', 'stand_in', 'seconds_per_epoch', 'speedup',
           'ideal_speedup', 'test_accuracy', 'equivalence_max_diff', 'run_seconds']


def run_one(name, n, out):
    results_dir = out / 'results' / f'{name}-gpus{n}'
    tik = time.perf_counter()
    papermill.execute_notebook(
        str(ROOT / 'notebooks' / f'{name}.ipynb'), str(out / f'{name}-gpus{n}.ipynb'),
        parameters={'num_gpus': n, 'device_counts': [n], 'results_dir': str(results_dir)},
        cwd=str(ROOT / 'notebooks'), progress_bar=False)
    r = json.loads((results_dir / f'{name}.json').read_text())['results']
    per_k = r['ddp'][str(n)] if name.startswith('06') else {
        'seconds_per_epoch': r['seconds_per_epoch'][str(n)],
        'test_accuracy': r['test_accuracy'][str(n)]}
    return {'notebook': name, 'num_gpus': n, 'gpus_found': r['gpus_found'],
            'stand_in': r['gpus_found'] < n, 'seconds_per_epoch': per_k['seconds_per_epoch'],
            'test_accuracy': per_k['test_accuracy'],
            'equivalence_max_diff': r.get('equivalence_max_diff', ''),
            'run_seconds': time.perf_counter() - tik}


def plot(rows, counts):
    fig, axes = plt.subplots(1, 4, figsize=(13, 2.8))
    for name in NOTEBOOKS:
        mine = [r for r in rows if r['notebook'] == name]
        ns = [r['num_gpus'] for r in mine]
        label = name[:2] + (' (stand-ins)' if any(r['stand_in'] for r in mine) else '')
        axes[0].plot(ns, [r['seconds_per_epoch'] for r in mine], 'o-', label=label)
        axes[1].plot(ns, [r['speedup'] for r in mine], 'o-', label=label)
        axes[2].plot(ns, [r['test_accuracy'] for r in mine], 'o-', label=label)
        if name.startswith('05'):
            axes[3].plot(ns, [r['equivalence_max_diff'] for r in mine], 'o-', label=label)
    axes[1].plot(counts, [n / counts[0] for n in counts], 'k--', label='ideal')
    axes[3].axhline(1e-5, color='r', ls=':', label='test threshold')
    titles = ['seconds per epoch', f'speedup over {counts[0]}', 'test accuracy',
              '05: max |k replicas - 1 device|']
    for ax, title in zip(axes, titles):
        ax.set(xlabel='num_gpus', title=title, xticks=counts)
        ax.legend(fontsize=7)
    axes[3].set_yscale('log')
    fig.tight_layout()
    return helpers.save_fig('sweep_scaling', fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--counts', nargs='+', type=int, default=[1, 2, 4])
    parser.add_argument('--notebooks', nargs='+', default=list(NOTEBOOKS), choices=NOTEBOOKS)
    parser.add_argument('--out', type=Path, default=ROOT / 'build' / 'sweep')
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.counts):
        parser.error(f'--counts must be positive integers, got {args.counts}')
    counts = sorted(set(args.counts))
    args.out.mkdir(parents=True, exist_ok=True)
    gpus = helpers.num_gpus()
    print(f'{gpus} GPU(s) here; counts above that run on stand-ins '
          '(CPU replicas in 05, CPU processes in 06)')
    rows = []
    for name in args.notebooks:
        for n in counts:
            row = run_one(name, n, args.out)
            rows.append(row)
            print(f'{name} num_gpus={n}{" (stand-ins)" if row["stand_in"] else ""}: '
                  f'{row["seconds_per_epoch"]:.2f} s/epoch, accuracy {row["test_accuracy"]:.3f}, '
                  f'run {row["run_seconds"]:.0f} s')
    for row in rows:
        base = next(r for r in rows if r['notebook'] == row['notebook'])
        row['speedup'] = base['seconds_per_epoch'] / row['seconds_per_epoch']
        row['ideal_speedup'] = row['num_gpus'] / base['num_gpus']
    table = args.out / 'results.csv'
    with open(table, 'w', newline='') as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    figure = plot(rows, counts)
    print(f'table: {table}\nfigure: {figure}\nexecuted notebooks: {args.out}/')


if __name__ == '__main__':
    main()
