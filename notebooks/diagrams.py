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


def draw_zero(ax, workers=4, pushed=1, pulled=2):
    """ZeRO (notebook 08): every worker is also the server of its own shard. Arcs above the
    boxes show the push, a reduce-scatter (every worker sends its gradient of shard `pushed`
    to that shard's owner); arcs below show the pull, an all-gather (the owner of shard
    `pulled` sends it to every other worker). Spans x in [-2, 2] and y in [-1.8, 1.1]."""
    xs = [(w + 0.5) / workers * 4 - 2 for w in range(workers)]
    for w, wx in enumerate(xs):
        draw_box(ax, wx, -0.75, 0.8, 0.45, f'worker {w}', 'tab:blue')
        draw_box(ax, wx, -0.15, 0.8, 0.4, f'server of\nshard {w}',
                 SHARD_COLORS[w % len(SHARD_COLORS)])
    for w, wx in enumerate(xs):
        if w != pushed:  # the push: bend away from the boxes, towards the owner
            draw_arrow(ax, (wx, 0.08), (xs[pushed], 0.08), 'gray',
                       rad=-0.5 if w < pushed else 0.5)
        if w != pulled:  # the pull: from the owner to every other worker
            draw_arrow(ax, (xs[pulled], -1.0), (wx, -1.0),
                       SHARD_COLORS[pulled % len(SHARD_COLORS)],
                       rad=-0.5 if w < pulled else 0.5)
    ax.text(0, 1.05, f'push = reduce-scatter (gray, shown for shard {pushed})', ha='center',
            fontsize=8)
    ax.text(0, -1.75, f'pull = all-gather (shown for shard {pulled})', ha='center', fontsize=8)
    ax.set_title('ZeRO: every worker is the server of its own shard', fontsize=9)


def draw_data_parallel_mlp(ax):
    """Notebook 03's figure (the chapter's): a two-layer MLP trained data parallel on two GPUs.
    The CPU splits a minibatch; each GPU runs forward and backward on its half; the gradients
    are summed across the GPUs, and each applies the same update. Red arrows cross lanes: they
    are the communication."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    lanes_y = {'CPU': 2.0, 'GPU 1': 1.0, 'GPU 2': 0.0}
    steps = ['load X', 'X1 / X2', 'relu(W1 X)', 'W2 H', 'loss', 'grads', 'sum grads', 'update W']
    boxes = {}

    def box(name, col, lane, color):
        x, y = col * 1.25, lanes_y[lane]
        ax.add_patch(FancyBboxPatch((x - 0.5, y - 0.22), 1.0, 0.44, boxstyle='round,pad=0.03',
                                    color=color, alpha=0.8))
        ax.text(x, y, name, ha='center', va='center', fontsize=7)
        boxes[name, lane] = (x, y)

    def arrow(a, b, color='k'):
        (x1, y1), (x2, y2) = boxes[a], boxes[b]
        dy = 0 if y1 == y2 else (0.22 if y2 > y1 else -0.22)
        start, end = ((x1 + 0.5, y1), (x2 - 0.5, y2)) if y1 == y2 else ((x1, y1 + dy),
                                                                          (x2, y2 - dy))
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle='-|>', mutation_scale=9,
                                     color=color))
    for lane, y in lanes_y.items():
        ax.text(-0.9, y, lane, ha='right', va='center', fontsize=9, weight='bold')
    box(steps[0], 0, 'CPU', 'lightgray')
    box(steps[1], 1, 'CPU', 'lightgray')
    arrow((steps[0], 'CPU'), (steps[1], 'CPU'))
    for lane in ('GPU 1', 'GPU 2'):
        for col, name in enumerate(steps[2:], start=2):
            box(name, col, lane, 'tab:orange' if name == 'sum grads' else 'lightsteelblue')
        arrow((steps[1], 'CPU'), (steps[2], lane), 'tab:red')
        for a, b in zip(steps[2:], steps[3:]):
            arrow((a, lane), (b, lane))
    arrow(('grads', 'GPU 1'), ('sum grads', 'GPU 2'), 'tab:red')
    arrow(('grads', 'GPU 2'), ('sum grads', 'GPU 1'), 'tab:red')
    ax.set(xlim=(-1.9, 9.5), ylim=(-0.6, 2.6))
    ax.axis('off')
    ax.set_title('two-layer MLP, data parallel over two GPUs (red: communication)', fontsize=9)


def draw_timeline(ax, lanes, marks=(), unit='ms'):
    """A timeline: one row per lane (a thread, a stream, a profiler category), a bar for each
    span it was busy. lanes: {row label: [(start, duration), ...]} in `unit`; marks: times to
    draw as dotted vertical lines (the start of each step). Rows are drawn top to bottom in the
    order given."""
    for row, spans in enumerate(reversed(list(lanes.values()))):
        ax.broken_barh(list(spans), (row - 0.4, 0.8), alpha=0.6,
                       color=f'C{(len(lanes) - 1 - row) % 10}')
    for x in marks:
        ax.axvline(x, color='k', lw=0.5, ls=':')
    ax.set_yticks(range(len(lanes)), list(reversed(list(lanes))), fontsize=7)
    ax.set_xlabel(unit)


def draw_ring(ax, n=4):
    """Notebook 07's ring all-reduce: n processes on a circle, each sending to its right
    neighbour (clockwise arrows). Spans x and y in about [-1.3, 1.3]; the axes are left on."""
    import math

    from matplotlib.patches import Circle, FancyArrowPatch
    angles = [math.pi / 2 - 2 * math.pi * i / n for i in range(n)]
    pts = [(math.cos(a), math.sin(a)) for a in angles]
    for i, (x, y) in enumerate(pts):
        ax.add_patch(Circle((x, y), 0.22, color='tab:blue', alpha=0.85))
        ax.text(x, y, f'{i}', ha='center', va='center', color='white', fontsize=12)
        ax.add_patch(FancyArrowPatch((x, y), pts[(i + 1) % n], arrowstyle='-|>',
                                     mutation_scale=15, shrinkA=18, shrinkB=18,
                                     connectionstyle='arc3,rad=-0.25'))
    ax.set_title(f'ring all-reduce, n={n}: each chunk travels\n'
                 'n-1 steps summing, n-1 steps sharing', fontsize=9)


def draw_pipeline_schedule(ax, events, title=''):
    """Notebook 09's pipeline timeline: one row per stage (stage 0 on top), a blue bar for each
    forward and an orange bar for each backward of a micro-batch. events: per stage, a list of
    (start, end, 'F' or 'B') in seconds on one clock; drawn in ms from the earliest start."""
    t0 = min(e[0] for stage in events for e in stage)
    for s, stage in enumerate(events):
        for kind, color, name in (('F', 'tab:blue', 'forward'), ('B', 'tab:orange', 'backward')):
            ax.broken_barh([((e[0] - t0) * 1e3, (e[1] - e[0]) * 1e3) for e in stage
                            if e[2] == kind], (s - 0.35, 0.7), color=color,
                           label=name if s == 0 else None)
    ax.set_yticks(range(len(events)), [f'stage {s}' for s in range(len(events))], fontsize=7)
    ax.set(xlabel='ms', title=title)
    ax.set_ylim(len(events) - 0.5, -0.5)  # stage 0 on top


def draw_mesh(ax, dp, tp):
    """Notebook 09's 2-D mesh of dp x tp ranks, rank = d * tp + t: each row is a tensor-parallel
    group (its ranks all-reduce activations, gray links), each column a data-parallel group
    (FSDP all-gathers parameters and reduce-scatters gradients along it, green links)."""
    for d in range(dp):
        for t in range(tp):
            draw_box(ax, t, -d, 0.6, 0.45, f'rank {d * tp + t}\ndp {d}, tp {t}', 'tab:blue')
            if t + 1 < tp:
                ax.plot([t + 0.3, t + 0.7], [-d, -d], color='gray', lw=3)
            if d + 1 < dp:
                ax.plot([t, t], [-d - 0.23, -d - 0.77], color='tab:green', lw=3)
    ax.text((tp - 1) / 2, 0.55, 'rows: tensor parallelism (activations, fast links)',
            ha='center', fontsize=8, color='dimgray')
    ax.text((tp - 1) / 2, -dp + 0.35, 'columns: FSDP (parameters and gradients)',
            ha='center', fontsize=8, color='tab:green')
    ax.set(xlim=(-0.6, tp - 0.4), ylim=(-dp + 0.2, 0.8), aspect='equal')
    ax.axis('off')
