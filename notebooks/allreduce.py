"""All-reduce from torch.distributed point-to-point messages (notebook 07): the pipelined ring, the
naive gather-and-broadcast, the workers that check them against dist.all_reduce and time them,
and the small pieces the notebook uses to read those timings.

Messages are CPU tensors over gloo on every machine, so that one code path runs everywhere. The
functions ending in `_worker` are process entry points for launch.run_workers; they live here
because spawned processes must import them.
"""
import os
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist

import launch
import stats


# ------------------------------------------------------------ collectives from send/recv
def ring_position(ranks):
    """(the ranks of a ring, this process's place in it): all processes where ranks is None.
    Explicit ranks are checked before the process group is touched."""
    ranks = list(range(dist.get_world_size()) if ranks is None else ranks)
    if len(ranks) < 2:
        raise ValueError(f'a ring needs at least 2 processes, got {len(ranks)}')
    if dist.get_rank() not in ranks:
        raise ValueError(f'rank {dist.get_rank()} is not in the ring {ranks}')
    return ranks, ranks.index(dist.get_rank())


SEGMENT_BYTES = 4 * 2**20  # ring_allreduce's default piece size, with a core per process


def ring_segments(numel, element_size, n, cores=None):
    """The segments per chunk ring_allreduce uses by default: pieces of about 4 MiB, larger by
    n / cores when n processes share fewer cores (each message then costs a context switch),
    and at most 16. Measured on 2 cores at 64 MB: 8 segments best for n=2, 2 to 3 for n=4."""
    cores = cores or os.cpu_count() or 1
    chunk_bytes = -(-numel // n) * element_size
    return max(1, min(16, round(chunk_bytes / (SEGMENT_BYTES * max(1.0, n / cores)))))


# ---- saved from 07_parameter_servers.ipynb by make export: edit the notebook
def ring_allreduce(tensor, ranks=None, segments=None, window=2):
    '''Sum `tensor` over the processes in `ranks` (default: all), in place, along a ring of n:
    reduce-scatter in n-1 steps, then all-gather in n-1 more; every process sends 2(n-1)/n of
    the data. Each chunk moves in `segments` pieces (1: the plain ring; None: ring_segments),
    with `window` receives posted ahead of use.'''
    ranks, i = ring_position(ranks)
    if segments is None:
        segments = ring_segments(tensor.numel(), tensor.element_size(), len(ranks))
    if segments < 1 or window < 1:
        raise ValueError(f'segments and window must be at least 1, got {segments}, {window}')
    n = len(ranks)
    right, left = ranks[(i + 1) % n], ranks[(i - 1) % n]
    flat = tensor.view(-1)  # contiguous tensors only: the result must land in `tensor`
    pieces = [chunk.tensor_split(segments) for chunk in flat.tensor_split(n)]
    steps = 2 * (n - 1)
    # step t < n-1 (reduce-scatter) receives chunk i-t-1 and adds it; step t >= n-1
    # (all-gather) receives summed chunk i-(t-n+1) in place. Step t+1 sends what t received.
    arriving = [(i - t - 1) % n if t < n - 1 else (i - t + n - 1) % n for t in range(steps)]
    order = [(t, j) for t in range(steps) for j in range(segments)]
    buffers = [torch.empty_like(pieces[0][0]) for _ in range(window)]
    sending, posted = {}, []  # (chunk, segment) -> its isend; receives in order of use

    def send(t, chunk, j):
        sending[chunk, j] = dist.isend(pieces[chunk][j], right, tag=t * segments + j)

    def post(k):
        t, j = order[k]
        chunk = arriving[t]
        if t < n - 1:
            into = buffers[k % window][:pieces[chunk][j].numel()]
        else:  # overwrite the piece, once our own earlier send of it has left
            if (chunk, j) in sending:
                sending.pop((chunk, j)).wait()
            into = pieces[chunk][j]
        posted.append((into, dist.irecv(into, left, tag=t * segments + j)))

    for j in range(segments):
        send(0, i, j)
    for k in range(min(window, len(order))):
        post(k)
    for k, (t, j) in enumerate(order):
        into, request = posted[k]
        request.wait()
        if t < n - 1:
            pieces[arriving[t]][j].add_(into)
        if t + 1 < steps:
            send(t + 1, arriving[t], j)
        if k + window < len(order):
            post(k + window)
    for request in sending.values():
        request.wait()
    return tensor


def naive_allreduce(tensor, ranks=None):
    '''Sum over `ranks` by sending everything to the first rank and back: the root's link
    carries 2(n-1) full tensors while the others idle.'''
    ranks, i = ring_position(ranks)
    root = ranks[0]
    if i == 0:
        buf = torch.empty_like(tensor)
        for src in ranks[1:]:
            dist.recv(buf, src)
            tensor += buf
        for dst in ranks[1:]:
            dist.send(tensor, dst)
    else:
        dist.send(tensor, root)
        dist.recv(tensor, root)
    return tensor


def ping(x, empty, rank):
    '''A round trip: rank 0 sends x to rank 1, which replies with an empty message.'''
    if rank == 0:
        dist.send(x, 1)
        dist.recv(empty, 1)
    elif rank == 1:
        dist.recv(x, 0)
        dist.send(empty, 0)


def shift(x, inbox, rank, n):
    '''One ring step with every link busy: each of the first n ranks sends x to its right
    neighbour while it receives into inbox from its left.'''
    if rank < n:
        requests = [dist.isend(x, (rank + 1) % n), dist.irecv(inbox, (rank - 1) % n)]
        for request in requests:
            request.wait()


def fit_link(round_trip):
    '''alpha (s) and beta (bytes/s) of t = 2 alpha + S / beta, from {S: seconds}.'''
    (s0, t0), (s1, t1), (s2, t2) = [(s, round_trip[s]) for s in sorted(round_trip)[:1]
                                    + sorted(round_trip)[-2:]]
    beta = (s2 - s1) / (t2 - t1)  # the slope between the two largest messages
    return max(0.0, (t0 - s0 / beta) / 2), beta


def link_model(alpha, beta):
    return {'ring': lambda n, s: 2 * (n - 1) * (alpha + s / (n * beta)),
            'naive': lambda n, s: 2 * (n - 1) * (alpha + s / beta)}


def ring_both_ways(tensor, ranks=None):
    '''Sum `tensor` over `ranks` as two rings at once: its first half clockwise, its second
    half counter-clockwise (the ranks reversed), the second in a thread of its own. With three
    or more processes each ring has its own ordered pairs of neighbours, so a process sends
    to both of them, and receives from both, at the same time.'''
    ranks = list(range(dist.get_world_size()) if ranks is None else ranks)
    if len(ranks) < 3:
        raise ValueError(f'two opposite rings need at least 3 processes (with 2, both '
                         f'directions are the same ring), got {len(ranks)}')
    forward, backward = tensor.view(-1).tensor_split(2)
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(ring_allreduce, backward, ranks[::-1])
        ring_allreduce(forward, ranks)
        other.result()  # raises here what the other ring raised
    return tensor
# ---- end of what 07_parameter_servers.ipynb saves


# ------------------------------------------------------------------- the workers
def _groups(world_size):
    """Process groups over the first n ranks, for every n >= 2; created on every rank."""
    return {n: dist.new_group(list(range(n))) for n in range(2, world_size + 1)}


def _joined(timeout=120):
    """Join the process group unless an earlier experiment in this process already did."""
    if not dist.is_initialized():
        launch.init_distributed(timeout=timeout, backend='gloo')


def check_collectives_worker(rank, world_size, sizes, dtypes, segment_counts=(None, 1, 3)):
    """Compare the ring (with each of `segment_counts`) and the naive all-reduce with
    dist.all_reduce for n = 2..world_size, every size and dtype; returns the largest
    |difference| relative to the largest |sum| per case (rank 0's view). Sums taken in another
    order differ by float rounding, never more."""
    _joined(timeout=60)
    groups, errors = _groups(world_size), {}
    for n, group in groups.items():
        for dtype in dtypes:
            dtype = getattr(torch, dtype)
            for size in sizes:
                if rank < n:
                    g = torch.Generator().manual_seed(100 * rank + size)
                    x = (torch.randn(size, generator=g) * 100).to(dtype)
                    expected = x.clone()
                    dist.all_reduce(expected, group=group)
                    results = [naive_allreduce(x.clone(), range(n))] + [
                        ring_allreduce(x.clone(), range(n), segments=s) for s in segment_counts]
                    scale = expected.abs().max().item() or 1
                    errors[f'n={n} {str(dtype)[6:]} size={size}'] = max(
                        (r - expected).abs().max().item() for r in results) / scale
                dist.barrier()
    return errors


def benchmark_worker(rank, world_size, sizes_bytes, repeats, group_sizes, segment_counts=(),
                     race_repeats=0, bytes_per_sample=2**22, naive_up_to=None):
    """Time ring, naive and dist.all_reduce over float32 messages on the first n ranks for each
    n in `group_sizes`; a message from rank 0 to rank 1 and back (an empty reply: 'p2p'), to fit
    latency and bandwidth; and, for each n, a 'shift': every rank sending a message to its right
    neighbour while receiving one from its left, all links busy at once, as in a ring's step.
    The naive algorithm runs up to `naive_up_to` bytes (None: all).

    With `segment_counts`, the largest size becomes a race: dist.all_reduce against the ring
    with each of those segment counts, interleaved, `race_repeats` times; 'ring' there is the
    race's entry for the ring's default segments. A sample repeats small messages until it has
    moved `bytes_per_sample` (at most 32 times).

    Rank 0 returns every repeat, {(name, n, bytes): [seconds, ...]}: the race's entries as
    'race:dist.all_reduce' and 'race:<segments>', rank 0's CPU seconds per race entry as
    'cpu:dist.all_reduce' and 'cpu:<segments>', and dist.all_reduce's time over the ring's,
    repeat by repeat, as 'paired:<segments>' (each repeat runs both, one right after the
    other), and as 'paired' for the ring's default segments.
    At the largest size, 'cpus:p2p' and 'cpus:shift' hold the CPU seconds of every process
    together per message or shift (the sender's and the receiver's work). The other ranks
    return None.
    """
    big = sizes_bytes[-1]
    missing = {n: ring_segments(big // 4, 4, n) for n in group_sizes} if segment_counts else {}
    missing = {n: s for n, s in missing.items() if s not in segment_counts}
    if missing:
        raise ValueError(f'segment_counts {list(segment_counts)} must include the ring\'s '
                         f'default segments for the largest size (n: segments): {missing}')
    _joined()
    bench = _Bench(rank, _groups(world_size), big)
    for size in sizes_bytes:
        bench.sweep(size, repeats, group_sizes, bool(segment_counts) and size == big,
                    naive_up_to, bytes_per_sample)
    if segment_counts:
        for n in group_sizes:
            bench.race(n, segment_counts, race_repeats)
    return bench.samples if rank == 0 else None


class _Bench:
    """benchmark_worker's clock and its samples, {(name, n, bytes): [seconds, ...]}."""

    def __init__(self, rank, groups, big):
        self.rank, self.groups, self.big, self.samples = rank, groups, big, {}
        self.empty, self.inbox = torch.empty(0), None
        self.algorithms = {'ring': lambda x, n: ring_allreduce(x, range(n)),
                           'naive': lambda x, n: naive_allreduce(x, range(n)),
                           'dist.all_reduce': lambda x, n: dist.all_reduce(x, group=groups[n])}

    def ping(self, x, n):  # rank 0 times the round trip itself: no barrier inside the sample
        ping(x, self.empty, self.rank)

    def shift(self, x, n):
        shift(x, self.inbox, self.rank, n)

    def sample(self, key, fn, x, n, number):
        """Time `number` calls of fn on the first n ranks, ending when the slowest ends."""
        dist.barrier()
        tik, cpu = time.perf_counter(), time.process_time()
        for _ in range(number):
            if self.rank < n:
                fn(x, n)
        cpu = time.process_time() - cpu  # this process's CPU time, all its threads
        if key[0] != 'p2p':
            dist.barrier()  # everyone waits for the slowest: the collective's time
        self.samples.setdefault(key, []).append((time.perf_counter() - tik) / number)
        if key[0].startswith('race:'):
            self.samples.setdefault(('cpu:' + key[0][5:], *key[1:]), []).append(cpu)
        elif key[0] in ('p2p', 'shift') and key[2] == self.big:  # every process's CPU, summed
            total = torch.tensor([cpu / number], dtype=torch.float64)
            dist.all_reduce(total)
            self.samples.setdefault(('cpus:' + key[0], *key[1:]), []).append(total.item())

    def sweep(self, size, repeats, group_sizes, raced, naive_up_to, bytes_per_sample):
        """p2p, shift and the all-reduces at one size (at a raced size, only the naive one)."""
        x, self.inbox = torch.ones(size // 4), torch.empty(size // 4)
        number = max(1, min(32, bytes_per_sample // size))  # small messages: many per sample
        cases = [('p2p', 2, self.ping)] + [('shift', n, self.shift) for n in group_sizes] + [
            (name, n, fn) for n in group_sizes for name, fn in self.algorithms.items()
            if not (raced and name != 'naive')
            and not (name == 'naive' and naive_up_to is not None and size > naive_up_to)]
        for name, n, fn in cases:
            for _ in range(repeats + 1):  # the first sample warms up
                self.sample((name, n, size), fn, x, n, number)
            for key in [(name, n, size), ('cpus:' + name, n, size)]:
                if key in self.samples:
                    self.samples[key].pop(0)

    def race(self, n, segment_counts, race_repeats):
        """dist.all_reduce against the ring at each segment count, interleaved, at the largest
        size; then the paired ratios and the default ring's entries."""
        big, samples, x = self.big, self.samples, torch.ones(self.big // 4)
        race = {'race:dist.all_reduce': self.algorithms['dist.all_reduce']}
        race.update({f'race:{s}': lambda x, n, s=s: ring_allreduce(x, range(n), segments=s)
                     for s in segment_counts})
        for r in range(race_repeats + 1):
            for name, fn in race.items():
                self.sample((name, n, big), fn, x, n, 1)
                if r == 0:  # warm-up
                    samples[name, n, big].pop(0)
                    samples['cpu:' + name[5:], n, big].pop(0)
        for s in segment_counts:  # gloo's time over the ring's, repeat by repeat
            samples[f'paired:{s}', n, big] = [
                a / b for a, b in zip(samples['race:dist.all_reduce', n, big],
                                      samples[f'race:{s}', n, big])]
        default = ring_segments(big // 4, 4, n)
        samples['ring', n, big] = samples[f'race:{default}', n, big]
        samples['paired', n, big] = samples[f'paired:{default}', n, big]
        samples['dist.all_reduce', n, big] = samples['race:dist.all_reduce', n, big]


def both_directions_worker(rank, world_size, numel, repeats):
    """Time ring_allreduce (one direction) against ring_both_ways over all ranks on the same
    float32 data, interleaved, `repeats` times after a warm-up. Rank 0 returns
    {'one direction': [seconds, ...], 'both directions': [...], 'max_rel_diff': the largest
    |difference| of either result from dist.all_reduce's, relative to its largest |sum|}."""
    _joined()
    data = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    expected = data.clone()
    dist.all_reduce(expected)
    ways = {'one direction': ring_allreduce, 'both directions': ring_both_ways}
    times, worst = {way: [] for way in ways}, 0.0
    for _ in range(repeats + 1):  # the first round warms up
        for way, reduce in ways.items():
            x = data.clone()
            dist.barrier()
            tik = time.perf_counter()
            reduce(x)
            dist.barrier()
            times[way].append(time.perf_counter() - tik)
            worst = max(worst, ((x - expected).abs().max() / expected.abs().max()).item())
    if rank != 0:
        return None
    return {**{way: t[1:] for way, t in times.items()}, 'max_rel_diff': worst}


# ------------------------------------------------------- reading what the workers timed
ALGORITHMS = ('ring', 'dist.all_reduce', 'naive')


def message_sizes(largest_mb):
    """4 KB, 64 KB, 1 MB, ... (16 times larger each) below `largest_mb` MB, then that size, in
    bytes."""
    largest = largest_mb * 2**20
    return [4 * 16**k * 1024 for k in range(8) if 4 * 16**k * 1024 < largest] + [largest]


def race_segments(segment_counts, largest_bytes, group_sizes):
    """The segment counts to race at the largest size: those asked for, the plain ring (1),
    and each ring's default there (ring_segments), so that the race includes what 'ring'
    means."""
    defaults = {ring_segments(largest_bytes // 4, 4, n) for n in group_sizes}
    return sorted(set(segment_counts) | defaults | {1})


def size_name(nbytes):
    """4096 -> '4 KB', 2**26 -> '64 MB'; None (no such size) -> 'none measured'."""
    if nbytes is None:
        return 'none measured'
    return f'{nbytes / 2**20:g} MB' if nbytes >= 2**20 else f'{nbytes / 1024:g} KB'


def beats(samples, n, size, a, b):
    """Whether `a` beat `b` on n processes at `size` bytes (None: no difference measured):
    the ring against dist.all_reduce by the race's paired repeats where the race ran
    (stats.compare_paired on samples['paired', n, size]), anything else by stats.compare."""
    if {a, b} == {'ring', 'dist.all_reduce'} and ('paired', n, size) in samples:
        ring_better = stats.compare_paired(samples['paired', n, size], 'ring', 'gloo').a_is_better
        return ring_better if a == 'ring' or ring_better is None else not ring_better
    return stats.compare(samples[a, n, size], samples[b, n, size], a, b).a_is_better


def fastest(samples, n, size, names=ALGORITHMS):
    """The name among `names` that beat every other under the noise rule (`beats`) on n
    processes at `size` bytes, or 'no single one' where none did."""
    timed = [a for a in names if (a, n, size) in samples]
    for a in timed:
        if all(beats(samples, n, size, a, b) for b in timed if b != a):
            return a
    return 'no single one'


def crossover(samples, n, sizes, a='ring', b='naive'):
    """The smallest of `sizes` from which `a` beats `b` (noise rule) at that size and at every
    larger one, or None where it does not at the largest."""
    found = None
    for size in reversed(sizes):
        if not beats(samples, n, size, a, b):
            break
        found = size
    return found


# A verdict's a_is_better as one word for a table: 'faster' means the first-named was faster.
VERDICT_WORDS = {True: 'faster', False: 'slower', None: 'no difference'}


def span(values):
    """The smallest and largest of some repeats, as a table shows them: '0.95 to 1.13'."""
    return f'{min(values):.2f} to {max(values):.2f}'


def ratio_range(before, after):
    """The smallest and largest before / after that two sets of repeats allow: the fastest
    `before` over the slowest `after`, and the slowest over the fastest."""
    return min(before) / max(after), max(before) / min(after)


def range_word(value, lo, hi):
    """Where `value` (a model's ratio) lies against the range [lo, hi] the repeats allow:
    'within', 'above' or 'below'."""
    if value < lo:
        return 'below'
    if value > hi:
        return 'above'
    return 'within'


def model_word(check):
    """A stats.against_model result as one word for a table: 'agrees' (within its tolerance),
    'above' or 'below' the model."""
    if check.agrees:
        return 'agrees'
    return 'above' if check.off > 0 else 'below'


def benchmark_record(timing, busbw, group_sizes, sizes):
    """What notebook 07 records of the loopback benchmark: the median seconds and bus
    bandwidth (GB/s) of every algorithm, n and size, keyed 'name|n=N|bytes', and for each n the
    sizes at which dist.all_reduce's median beat the ring's."""
    keys = [(a, n, s) for a in ALGORITHMS for n in group_sizes for s in sizes]
    return {'seconds': {f'{a}|n={n}|{s}': timing[a, n, s] for a, n, s in keys},
            'busbw_gb_per_s': {f'{a}|n={n}|{s}': busbw[a, n, s] / 1e9 for a, n, s in keys},
            'all_reduce_faster_at_bytes': {
                n: [s for s in sizes if timing['dist.all_reduce', n, s] < timing['ring', n, s]]
                for n in group_sizes}}


def shaped_link_record(timing, n, size, alpha, beta, stream, ring_model_s, rate_mbit,
                       delay_ms):
    """What notebook 07 records of the emulated cluster's links: what tc was told, what one
    TCP stream carried (stream: Cluster.measure_link's result), the gloo fit (alpha seconds,
    beta bytes/s), the ring at `size` on n hosts against its model, the loaded link (the
    shift), and every median (`timing`, keyed 'name|n|bytes')."""
    return {'rate_mbit': rate_mbit, 'delay_ms': delay_ms, 'hosts': n,
            'fitted_gbs': beta / 1e9, 'fitted_latency_s': alpha,
            'told_gbs': rate_mbit * 1e6 / 8 / 1e9, 'tcp_stream_gbs': stream['mbit_per_s'] / 8e3,
            'tcp_round_trip_s': stream['rtt_s'], 'ring_measured_s': timing['ring', n, size],
            'ring_model_s': ring_model_s,
            'ring_measured_over_model': timing['ring', n, size] / ring_model_s,
            'loaded_link_gbs': size / timing['shift', n, size] / 1e9,
            'seconds': {'|'.join(map(str, k)): v for k, v in timing.items()}}


def plot_timings(timing, sizes, n_values, model=None, busbw=None, title='all-reduce on {n} '
                 'processes'):
    """Seconds against message bytes (log-log), one panel per n in `n_values`, each algorithm
    in its colour, with the cost model's lines dashed (model[algorithm](n, size)); and where
    `busbw` is given ({(algorithm, n, size): bytes/s}), a last panel of bus bandwidth, n=2
    solid and larger n dotted. Returns the figure."""
    import matplotlib.pyplot as plt
    colors = {'ring': 'C0', 'dist.all_reduce': 'C1', 'naive': 'C2'}
    panels = len(n_values) + (busbw is not None)
    fig, axes = plt.subplots(1, panels, figsize=(4 * panels, 3), squeeze=False)
    axes = axes[0]
    for ax, n in zip(axes, n_values):
        for a, marker in zip(ALGORITHMS, 'os^'):
            xs = [s for s in sizes if (a, n, s) in timing]
            ax.plot(xs, [timing[a, n, s] for s in xs], marker + '-', color=colors[a], ms=3,
                    label=a)
        for a in model or {}:
            ax.plot(sizes, [model[a](n, s) for s in sizes], '--', color=colors[a], lw=1,
                    label=f'{a}, model')
        ax.set(xscale='log', yscale='log', xlabel='message bytes', ylabel='seconds',
               title=title.format(n=n))
        ax.legend(fontsize=7)
    if busbw is not None:
        for a, marker in zip(ALGORITHMS, 'os^'):
            for n, style in zip(n_values, ('-', ':')):
                axes[-1].plot(sizes, [busbw[a, n, s] / 1e9 for s in sizes], style,
                              marker=marker, color=colors[a], ms=3, label=f'{a}, n={n}')
        axes[-1].set(xscale='log', xlabel='message bytes', ylabel='busbw (GB/s)',
                     title='bus bandwidth (same colours)')
        axes[-1].legend(fontsize=6)
    fig.tight_layout()
    return fig


def plot_race(paired, title):
    """The race: dist.all_reduce's time over the ring's against segments per chunk, judged as
    stats.compare_paired judges it. paired: {n: {segments: [ratio per repeat, ...]}}. One line
    per n through the medians, a bar from each point's smallest to its largest repeat, and
    the band around 1 that counts as no difference: a filled marker where every repeat lies
    beyond the band on one side (a difference), an open one where not. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    fig, ax = plt.subplots(figsize=(5, 3))
    segments = sorted({s for ratios in paired.values() for s in ratios})
    band = (1 - stats.NOISE_FLOOR, 1 + stats.NOISE_FLOOR)
    for k, (n, by_segments) in enumerate(paired.items()):
        judged = [stats.compare_paired(by_segments[s], 'ring', 'gloo') for s in segments]
        xs = [s * 1.06 ** k for s in segments]  # side by side, not on top of each other
        bars = [[c.ratio - min(c.ratios) for c in judged], [max(c.ratios) - c.ratio
                                                            for c in judged]]
        line = ax.errorbar(xs, [c.ratio for c in judged], yerr=bars, fmt='-', capsize=2,
                           label=f'n={n}')
        color = line[0].get_color()
        for x, c in zip(xs, judged):
            ax.plot(x, c.ratio, 'o', color=color, mfc=color if c.differs else 'white')
    ax.axhspan(*band, color='gray', alpha=0.2, label=f'within {stats.NOISE_FLOOR:.0%} of 1')
    ax.axhline(1, color='k', lw=0.8)
    handles, _ = ax.get_legend_handles_labels()
    handles += [Line2D([], [], marker='o', ls='', color='k', label='every repeat outside'),
                Line2D([], [], marker='o', ls='', color='k', mfc='white',
                       label='some repeat inside')]
    ax.set(xscale='log', xlabel='segments per chunk', xticks=segments, xticklabels=segments,
           ylabel='all_reduce time / ring time', title=title)
    ax.legend(handles=handles, fontsize=7)
    return fig
