"""The roofline model (notebook 04): a kernel that performs I floating-point operations per
byte it moves runs no faster than min(peak, I x bandwidth).

The notebook measures the kernels and the bandwidths; this module holds the arithmetic of the
model and the figure.
"""
import numpy as np


def shared_roofs(roofs):
    """{peak: [names]}: precisions whose roofs are the same number, drawn as one line (a
    precision whose peak is None has no flat roof)."""
    grouped = {}
    for name, peak in roofs.items():
        if peak:
            grouped.setdefault(peak, []).append(name)
    return grouped


def draw(roofs, points, memory, cache, title, kernels=()):
    """The roofline figure. roofs: {precision: peak GFLOP/s}; points: {name: (FLOP/byte,
    GFLOP/s)}; memory and cache: (GB/s, label) of the two sloped roofs (cache None: no cache
    roof, where no cache read beat main memory); kernels: the names of the memory-bound points
    (drawn black). Equal roofs are one line, labelled with every
    precision that has it; a point named 'matmul <precision>' takes its roof's colour."""
    import matplotlib.pyplot as plt
    roofs = {name: peak for name, peak in roofs.items() if peak}  # None: no peak known
    groups = shared_roofs(roofs)
    colours = {name: f'C{i}' for i, names in enumerate(groups.values()) for name in names}
    intensity = np.logspace(-3, 4, 300)
    top = max(list(roofs.values()) + [p[1] for p in points.values()])
    highest = max(roofs.values(), default=top)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    slopes = [(memory, dict(ls='-', lw=1.5))] + [(cache, dict(ls='--', lw=0.8))] * bool(cache)
    for (gbs, label), style in slopes:
        under = intensity * gbs <= highest  # the flat part is the precisions' roofs
        ax.plot(intensity[under], intensity[under] * gbs, color='k', label=label, **style)
    for i, (peak, names) in enumerate(groups.items()):
        flat = intensity >= peak / (cache or memory)[0]  # from where the top slope meets it
        ax.plot(intensity[flat], np.full(flat.sum(), peak), ls=(i, (2, 3)),
                color=colours[names[0]], lw=1.5,
                label=f'{" = ".join(names)} peak {peak:,.0f} GFLOP/s')
    markers = iter('os^vD<>p*hHd' * 2)
    for name, (x, y) in points.items():
        precision = name.split()[-1]
        colour = 'k' if name in kernels else colours.get(precision, 'gray')
        ax.plot(x, y, next(markers), color=colour, ms=7, label=name)
    ax.set(xscale='log', yscale='log', xlabel='arithmetic intensity (FLOP/byte)',
           ylabel='GFLOP/s', ylim=(min(p[1] for p in points.values()) / 3, top * 2),
           title=title)
    ax.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


# ---- saved from 04_hardware.ipynb by make export: edit the notebook
def matmul_intensity(n, bytes_per_element):
    """FLOP per byte of an n x n product with ideal traffic: 2 n^3 operations over A and B read
    once and C written once (3 n^2 elements)."""
    return 2 * n / (3 * bytes_per_element)


def bound(intensity, peak, bandwidth_gbs):
    """What the roofline allows a kernel of that intensity, in GFLOP/s (peak in GFLOP/s;
    None: no flat roof known, only the slope)."""
    slope = intensity * bandwidth_gbs
    if peak is None:
        return slope
    return min(peak, slope)
# ---- end of what 04_hardware.ipynb saves
