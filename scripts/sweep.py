"""Run the multi-device notebooks (05, 06, 08, 09, 10) through papermill over device counts;
write a CSV table and a figure.

    python scripts/sweep.py --counts 1 2 3 4        (or: make sweep COUNTS="1 2 3 4")

Each run gets num_gpus=N (and device_counts=[N] where the notebook takes it; 10 runs from N=2),
every other parameter at its default (sized for this machine). Where the machine has fewer than
N GPUs, CPU replicas (05) or CPU processes (06, 08, 09, 10) stand in for them; the table's
`stand_in` column and the printed lines say so.
Executed notebooks go to build/sweep/, the table to build/sweep/results.csv, the figure to
figures/sweep_scaling.png.
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
from execute import KERNELS  # noqa: E402  (this script's folder is on sys.path)

import helpers  # noqa: E402

NOTEBOOKS = ('05_multi_gpu_from_scratch', '06_multi_gpu_concise', '08_sharded_data_parallelism',
             '09_tensor_and_pipeline_parallelism', '10_planning_a_training_run')
MIN_GPUS = {'10_planning_a_training_run': 2}  # 10 compares layouts: one rank has none
COLUMNS = ['notebook', 'num_gpus', 'gpus_found', 'stand_in', 'seconds_per_epoch',
           'seconds_per_step', 'speedup', 'ideal_speedup', 'test_accuracy',
           'equivalence_max_diff', 'bytes_per_rank', 'bytes_per_rank_vs_ddp', 'run_seconds']


def measured(name, r, n):
    """The row's numbers from a notebook's recorded results for n devices."""
    k = str(n)
    if name.startswith('05'):
        return {'seconds_per_epoch': r['seconds_per_epoch'][k],
                'test_accuracy': r['test_accuracy'][k],
                'equivalence_max_diff': r['equivalence_max_diff']}
    if name.startswith('06'):
        return {'seconds_per_epoch': r['ddp'][k]['seconds_per_epoch'],
                'test_accuracy': r['ddp'][k]['test_accuracy']}
    if name.startswith('09'):  # FSDP x TP on the 2-D mesh, beside DDP at the same model
        held, mesh = r['mesh_bytes_per_rank'], 'fsdp_tp'
        return {'seconds_per_step': r['mesh_seconds_per_step'][mesh],
                'equivalence_max_diff': r['mesh_max_diff'], 'bytes_per_rank': held[mesh],
                'bytes_per_rank_vs_ddp': held[mesh] / held['ddp']}
    if name.startswith('10'):  # the fastest layout measured, beside DDP
        held, fastest = r['held_bytes_per_rank'], min(r['step_seconds'], key=r['step_seconds'].get)
        return {'seconds_per_step': r['step_seconds'][fastest], 'bytes_per_rank': held[fastest],
                'bytes_per_rank_vs_ddp': held[fastest] / held['ddp']}
    best = min(r['bytes_per_rank'], key=lambda s: r['bytes_per_rank'][s][k])  # 08: ZeRO
    return {'seconds_per_step': r['seconds_per_step'][best][k],
            'bytes_per_rank': r['bytes_per_rank'][best][k],
            'bytes_per_rank_vs_ddp': r['bytes_per_rank'][best][k] / r['bytes_per_rank']['ddp'][k]}


def run_one(name, n, out):
    results_dir = out / 'results' / f'{name}-gpus{n}'
    tik = time.perf_counter()
    papermill.execute_notebook(
        str(ROOT / 'notebooks' / f'{name}.ipynb'), str(out / f'{name}-gpus{n}.ipynb'),
        parameters={'num_gpus': n, 'results_dir': str(results_dir),
                    **({} if name.startswith(('09', '10')) else {'device_counts': [n]})},
        cwd=str(ROOT / 'notebooks'), progress_bar=False, config=KERNELS)
    r = json.loads((results_dir / f'{name}.json').read_text())['results']
    return {'notebook': name, 'num_gpus': n, 'gpus_found': r['gpus_found'],
            'stand_in': r['gpus_found'] < n, **measured(name, r, n),
            'run_seconds': time.perf_counter() - tik}


def plot(rows, counts):
    fig, axes = plt.subplots(1, 4, figsize=(14, 2.8))
    for name in NOTEBOOKS:
        mine = [r for r in rows if r['notebook'] == name]
        if not mine:
            continue
        ns = [r['num_gpus'] for r in mine]
        label = name[:2] + (' (stand-ins)' if any(r['stand_in'] for r in mine) else '')
        if name.startswith(('08', '09', '10')):
            axes[3].plot(ns, [r['bytes_per_rank'] / 1e6 for r in mine], 'o-', label=label)
            continue
        axes[0].plot(ns, [r['seconds_per_epoch'] for r in mine], 'o-', label=label)
        axes[1].plot(ns, [r['speedup'] for r in mine], 'o-', label=label)
        axes[2].plot(ns, [r['test_accuracy'] for r in mine], 'o-', label=label)
    if not all(r['stand_in'] for r in rows):  # an ideal line only where devices are real
        axes[1].plot(counts, [n / counts[0] for n in counts], 'k--', label='ideal')
    titles = ['seconds per epoch', f'speedup over {counts[0]}', 'test accuracy',
              '08-10: MB per rank, best sharded layout']
    for ax, title in zip(axes, titles):
        ax.set(xlabel='num_gpus', title=title, xticks=counts)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return helpers.save_fig('sweep_scaling', fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--counts', nargs='+', type=int, default=[1, 2, 4])
    parser.add_argument('--notebooks', nargs='+', default=list(NOTEBOOKS), choices=NOTEBOOKS)
    parser.add_argument('--out', type=Path, default=ROOT / 'build' / 'sweep')
    args = parser.parse_args(argv)
    if any(n < 1 or n > 64 for n in args.counts):
        parser.error(f'--counts must be integers from 1 to 64, got {args.counts}')
    counts = sorted(set(args.counts))
    args.out.mkdir(parents=True, exist_ok=True)
    gpus = helpers.num_gpus()
    print(f'{gpus} GPU(s) here; counts above that run on stand-ins '
          '(CPU replicas in 05, CPU processes in 06, 08, 09 and 10)')
    rows = []
    for name in args.notebooks:
        for n in (n for n in counts if n >= MIN_GPUS.get(name, 1)):
            row = run_one(name, n, args.out)
            rows.append(row)
            what = (f'{row["seconds_per_epoch"]:.2f} s/epoch, accuracy {row["test_accuracy"]:.3f}'
                    if 'seconds_per_epoch' in row else
                    f'{row["seconds_per_step"] * 1e3:.1f} ms/step, best sharded strategy holds '
                    f'{row["bytes_per_rank_vs_ddp"]:.2f}x DDP\'s bytes per rank')
            print(f'{name} num_gpus={n}{" (stand-ins)" if row["stand_in"] else ""}: {what}, '
                  f'run {row["run_seconds"]:.0f} s')
    for row in (r for r in rows if 'seconds_per_epoch' in r):  # 05, 06: the same global batch
        base = next(r for r in rows if r['notebook'] == row['notebook'])
        row['speedup'] = base['seconds_per_epoch'] / row['seconds_per_epoch']
        row['ideal_speedup'] = row['num_gpus'] / base['num_gpus']
    table = args.out / 'results.csv'
    with open(table, 'w', newline='') as f:
        writer = csv.DictWriter(f, COLUMNS, restval='')
        writer.writeheader()
        writer.writerows(rows)
    figure = plot(rows, counts)
    print(f'table: {table}\nfigure: {figure}\nexecuted notebooks: {args.out}/')


if __name__ == '__main__':
    main()
