"""Diagrams the notebooks draw with matplotlib: boxes, arrows, and the topologies built from
them (parameter servers in 07 and 08, ZeRO's shards in 08, meshes and pipelines in 09).
Each function draws onto an `ax` it is given, so a notebook composes them into one figure.
"""


SHARD_COLORS = ('tab:orange', 'tab:green', 'tab:purple', 'tab:brown')  # shard j: colour j % 4


def draw_box(ax, x, y, w, h, text, color):
    """A rounded w x h box centred on (x, y), labelled in white (for drawn topologies)."""
    from matplotlib.patches import FancyBboxPatch
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle='round,pad=0.04',
                                color=color, alpha=0.9))
    ax.text(x, y, text, ha='center', va='center', fontsize=8, color='white')


def draw_arrow(ax, start, end, color, rad=0.0):
    """An arrow from `start` to `end`, bent by `rad` (matplotlib's arc3 connection)."""
    from matplotlib.patches import FancyArrowPatch
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle='-|>', mutation_scale=9, color=color,
                                 alpha=0.75, shrinkA=2, shrinkB=2,
                                 connectionstyle=f'arc3,rad={rad}'))


def draw_parameter_servers(ax, workers=4, servers=2,
                           title='push gradients (gray), pull parameters (blue):\n'
                                 'each server owns a shard of the bytes'):
    """Notebook 07's topology: workers push gradients to servers that each own one shard of
    the parameters, and pull the updated shard back (08 sets it beside ZeRO). Spans x in
    [-2, 2] and y in [-1, 1.25]."""
    xs = [(w + 0.5) / workers * 4 - 2 for w in range(workers)]
    for j in range(servers):
        sx = (j + 0.5) / servers * 4 - 2
        draw_box(ax, sx, 1.0, 1.2, 0.45, f'server {j}\nshard {j}',
                 SHARD_COLORS[j % len(SHARD_COLORS)])
        for wx in xs:
            draw_arrow(ax, (wx - 0.06, -0.5), (sx - 0.06, 0.75), 'gray')      # push gradients
            draw_arrow(ax, (sx + 0.06, 0.75), (wx + 0.06, -0.5), 'tab:blue')  # pull parameters
    for w, wx in enumerate(xs):
        draw_box(ax, wx, -0.75, 0.8, 0.45, f'worker {w}', 'tab:blue')
    ax.set_title(title, fontsize=9)
