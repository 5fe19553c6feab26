"""Reading the cache hierarchy from measured curves (notebook 04).

The measurements stay in the notebook: sequential sums, `index_select` gathers and the pointer
chase, whose C source the notebook shows. This module turns them into a reading: it compiles
the chase, finds the steps of a per-read cost curve, names each step after the reported cache
whose size it matches, finds where the last step ends, and draws the curves.
"""
import ctypes
import math
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Chase:
    """A pointer chase: run(chain, i, steps) follows `steps` links of the int64 tensor `chain`
    from index i and returns where it stopped."""
    run: object
    method: str     # how it runs, for the reader and the recorded results
    steps: int      # links followed per timed call: many for C, fewer for Python's slow loop


def compile_chase(source, steps=2**18, python_steps=2**14):
    """The C function `chase` in `source`, compiled with the system's C compiler (-O2, the
    compiler torch.compile also needs) and called through ctypes on a tensor's memory; a
    Python loop where no compiler works (its numbers then include the interpreter's cost)."""
    compiler = shutil.which('cc') or shutil.which('gcc') or shutil.which('clang')
    if compiler:
        with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as tmp:
            c_file, library = Path(tmp, 'chase.c'), Path(tmp, 'chase.so')
            c_file.write_text(source)
            try:
                subprocess.run([compiler, '-O2', '-shared', '-fPIC', '-o', str(library),
                                str(c_file)], check=True, capture_output=True, timeout=60)
                chase = ctypes.CDLL(str(library)).chase
            except (OSError, subprocess.SubprocessError):
                chase = None
        if chase is not None:
            chase.restype = ctypes.c_int64
            chase.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
            return Chase(lambda chain, i, n: chase(chain.data_ptr(), i, n),
                         'a C loop compiled with -O2, called through ctypes', steps)
    return Chase(_chase_in_python, 'a Python loop, for want of a C compiler', python_steps)


def borrow(buffer, nbytes, dtype):
    """The first `nbytes` of `buffer`, seen as `dtype` (a buffer the notebook already filled,
    so that no new memory is touched page by page); a new zeroed tensor when it is smaller."""
    import torch
    count = nbytes // torch.empty((), dtype=dtype).element_size()
    if buffer.numel() * buffer.element_size() >= nbytes:
        return buffer.view(torch.uint8)[:nbytes].view(dtype)
    return torch.zeros(count, dtype=dtype)


def _chase_in_python(chain, i, steps):
    view = memoryview(chain.numpy())
    for _ in range(steps):
        i = view[i]
    return i


def at(sizes, curve, size):
    """The curve's value at the measured working set nearest `size` (on a log scale)."""
    return curve[min(range(len(sizes)), key=lambda i: abs(math.log(sizes[i] / size)))]


def size_text(b):
    """16384 -> '16 KiB'."""
    for unit, scale in (('GiB', 2**30), ('MiB', 2**20), ('KiB', 2**10)):
        if b >= scale:
            return f'{b / scale:.3g} {unit}'
    return f'{b} B'


def plot_curves(sizes, seq_gbs, dependent_s, independent_s, caches):
    """The figure of the three curves: sequential GB/s on the left; dependent and independent
    nanoseconds per read on the right; the reported cache sizes as dashed lines."""
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
    ax1.plot(sizes, seq_gbs, 'o-', ms=3)
    ax1.set(ylabel='GB/s', title='sequential reads, one core')
    ax2.plot(sizes, [t * 1e9 for t in dependent_s], 'o-', ms=3, color='C3',
             label='dependent (pointer chase): latency')
    ax2.plot(sizes, [t * 1e9 for t in independent_s], 's-', ms=3, color='C1',
             label='independent (index_select): time per read')
    ax2.set(yscale='log', ylabel='ns per read', title='random reads, one core')
    ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.set(xscale='log', xlabel='working set (bytes)')
        for name, size in caches.items():
            ax.axvline(size, ls='--', color='gray', lw=0.8)
            ax.text(size, ax.get_ylim()[1], f' {name}', fontsize=7, ha='left', va='top')
    fig.tight_layout()
    return fig


# ---- saved from 04_hardware.ipynb by make export: edit the notebook
def steps(sizes, per_read, jump=1.5):
    """(last size before, first size after) of each step of a per-read cost curve: a rise of
    more than `jump` times from one working set to the next, a run of rises counting as one."""
    found = []
    for i in range(1, len(per_read)):
        if per_read[i] / per_read[i - 1] > jump:
            if found and found[-1][1] == sizes[i - 1]:
                found[-1] = (found[-1][0], sizes[i])
            else:
                found.append((sizes[i - 1], sizes[i]))
    return found


def nearest_cache(before, after, caches):
    """(level, factor): the reported cache whose size is nearest the step's middle (the
    geometric mean of its two sizes), and how many times apart they are; (None, inf) when no
    cache size is known."""
    middle = math.sqrt(before * after)
    return min(((name, max(size, middle) / min(size, middle)) for name, size in caches.items()),
               key=lambda x: x[1], default=(None, math.inf))


def name_steps(sizes, per_read, caches, within=2.0):
    """Each step as {'before', 'after', 'level', 'meaning', 'cost_before', 'cost_after'}:
    `level` is the reported cache within `within` times of the step, or None."""
    named = []
    for before, after in steps(sizes, per_read):
        level, off = nearest_cache(before, after, caches)
        matched = None
        if off <= within:
            matched = level
        named.append({'before': before, 'after': after, 'level': matched,
                      'meaning': matched or 'no reported cache within 2x',
                      'cost_before': per_read[sizes.index(before)],
                      'cost_after': per_read[sizes.index(after)]})
    return named


def past_last_step(sizes, steps_found):
    """The first working set past the curve's last step (`steps_found`, from name_steps);
    the largest working set when the curve has no step at all."""
    if not steps_found:
        return sizes[-1]
    return steps_found[-1]['after']
# ---- end of what 04_hardware.ipynb saves
