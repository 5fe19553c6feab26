"""Parameter servers and all-reduce over torch.distributed point-to-point messages (notebook 07).

Messages are CPU tensors over gloo on every machine, so that one code path runs everywhere.

The functions ending in `_worker` are process entry points for launch.run_workers; they live
here because spawned processes must import them. Everything else is called inside them or
in the notebook.
"""
import math
import os
import time

import torch
import torch.distributed as dist

import helpers
import launch


# ----------------------------------------------------------------- key-value store
def _check_key(key, known):
    if key not in known:
        raise KeyError(f'unknown key {key!r}; known keys: {sorted(known)}')


def _check_push(key, value, shape):
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f'push to {key!r}: shape {tuple(value.shape)} does not match '
                         f'{tuple(shape)}')


class KVStore:
    """In-process key-value store: push(key, value) adds into the key's pending sum, pull(key)
    applies the pending sum through `updater` (default: replace) and returns the value.

    The sum is deterministic: pending values are added in a canonical order (sorted by their
    bytes), so the result is bit-identical whatever order the pushes arrived in. That makes a
    run reproducible; it is not more accurate than any other fixed order of addition.
    """

    def __init__(self, updater=None):
        self.updater = updater or (lambda key, total, value: total)
        self._values, self._pending = {}, {}

    def init(self, key, value):
        if key in self._values:
            raise KeyError(f'key {key!r} is already initialised')
        self._values[key] = value.detach().clone()
        self._pending[key] = []

    def push(self, key, value):
        _check_key(key, self._values)
        _check_push(key, value, self._values[key].shape)
        self._pending[key].append(value.detach().clone())

    def pull(self, key):
        _check_key(key, self._values)
        pending = self._pending[key]
        if pending:
            ordered = sorted(pending, key=lambda t: t.cpu().numpy().tobytes())
            total = torch.zeros_like(ordered[0])
            for v in ordered:
                total += v
            self._values[key] = self.updater(key, total, self._values[key])
            self._pending[key] = []
        return self._values[key].clone()


# ------------------------------------------------------------ collectives from send/recv
def _ring(ranks):
    # explicit ranks are checked before the process group is touched
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


def ring_allreduce(tensor, ranks=None, segments=None, window=2):
    """Sum `tensor` over the processes in `ranks` (default: all), in place, along a ring.

    The tensor is cut into n chunks (sizes may differ by one element). Reduce-scatter: in n-1
    steps each process sends one chunk to its right neighbour and adds the chunk arriving from
    its left, so each process ends owning one fully summed chunk. All-gather: n-1 more steps
    pass the summed chunks around. Every process sends 2(n-1)/n of the data in total.

    Pipelining: each chunk is cut into `segments` pieces, and a piece moves on to the right as
    soon as it has arrived (and been added), while the next pieces are still on the wire, so
    sending, receiving and adding overlap. `window` receives are posted ahead of use.
    segments=1 is the plain ring: each step waits for a whole chunk before adding it;
    None picks `ring_segments` (pieces of about 4 MiB, more with more processes than cores).
    """
    ranks, i = _ring(ranks)
    if segments is None:
        segments = ring_segments(tensor.numel(), tensor.element_size(), len(ranks))
    helpers.check_int('segments', segments)
    helpers.check_int('window', window)
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
    """Sum over `ranks` by sending everything to the first rank and back: the root's link
    carries 2(n-1) full tensors while the others idle."""
    ranks, i = _ring(ranks)
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


def _groups(world_size):
    """Process groups over the first n ranks, for every n >= 2; created on every rank."""
    return {n: dist.new_group(list(range(n))) for n in range(2, world_size + 1)}


def _joined(timeout=120):
    """Join the process group unless an earlier experiment in this process already did."""
    if not dist.is_initialized():
        launch.init_distributed(timeout=timeout, backend='gloo')


def phases_worker(rank, world_size, phases):
    """Run several experiments in one launch of processes, where starting a process costs an
    import of torch: `phases` is a list of (name of a `*_worker` function here, its arguments).
    Returns the list of their results on this rank."""
    for name, _ in phases:
        if not name.endswith('_worker') or name == 'phases_worker' or name not in globals():
            raise ValueError(f'unknown phase {name!r}')
    _joined()
    results = []
    for name, args in phases:
        results.append(globals()[name](rank, world_size, *args))
        dist.barrier()
    return results


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


def _median(samples):
    return sorted(samples)[len(samples) // 2]


def benchmark_worker(rank, world_size, sizes_bytes, repeats, group_sizes, segment_counts=(),
                     race_repeats=0, bytes_per_sample=2**22, naive_up_to=None):
    """Time ring, naive and dist.all_reduce over float32 messages on the first n ranks for each
    n in `group_sizes`; a message from rank 0 to rank 1 and back (an empty reply: 'p2p'), to fit
    latency and bandwidth; and a 'shift' on the largest group, every rank sending a message to
    its right neighbour while receiving one from its left: all links busy at once, as in a
    ring's step. The naive algorithm runs up to `naive_up_to` bytes (None: all).

    With `segment_counts`, the largest size becomes a race: dist.all_reduce against the ring
    with each of those segment counts, interleaved, `race_repeats` times; 'ring' there is the
    race's entry for the ring's default segments. A sample repeats small messages until it has
    moved `bytes_per_sample` (at most 32 times).

    Every rank returns {'cpu_s': the CPU seconds this process used}; rank 0 adds 'seconds', the
    medians as {'name|n|bytes': seconds}: the race's as 'race:dist.all_reduce|n|bytes' and
    'race:<s>|...', rank 0's CPU seconds per race entry as 'cpu:dist.all_reduce|...' and
    'cpu:<s>|...', and the median over repeats of dist.all_reduce's time over the ring's as
    'paired:<s>|...' (each repeat runs both, one right after the other: a busy moment slows
    both alike).
    """
    start_cpu = time.process_time()
    big = sizes_bytes[-1]
    missing = {n: ring_segments(big // 4, 4, n) for n in group_sizes} if segment_counts else {}
    missing = {n: s for n, s in missing.items() if s not in segment_counts}
    if missing:
        raise ValueError(f'segment_counts {list(segment_counts)} must include the ring\'s '
                         f'default segments for the largest size (n: segments): {missing}')
    _joined()
    groups = _groups(world_size)
    algorithms = {'ring': lambda x, n: ring_allreduce(x, range(n)),
                  'naive': lambda x, n: naive_allreduce(x, range(n)),
                  'dist.all_reduce': lambda x, n: dist.all_reduce(x, group=groups[n])}
    samples = {}
    empty = torch.empty(0)

    def ping(x, n):  # rank 0 times the round trip itself: no barrier inside the sample
        if rank == 0:
            dist.send(x, 1)
            dist.recv(empty, 1)
        elif rank == 1:
            dist.recv(x, 0)
            dist.send(empty, 0)

    def shift(x, n):  # every rank sends to its right and receives from its left at once
        if rank < n:
            requests = [dist.isend(x, (rank + 1) % n), dist.irecv(inbox, (rank - 1) % n)]
            for request in requests:
                request.wait()

    def sample(key, fn, x, n, number):
        dist.barrier()
        tik, cpu = time.perf_counter(), time.process_time()
        for _ in range(number):
            if rank < n:
                fn(x, n)
        cpu = time.process_time() - cpu  # this process's CPU time, all its threads
        if key[0] != 'p2p':
            dist.barrier()  # everyone waits for the slowest: the collective's time
        samples.setdefault(key, []).append((time.perf_counter() - tik) / number)
        if key[0].startswith('race:'):
            samples.setdefault(('cpu:' + key[0][5:], *key[1:]), []).append(cpu)

    for size in sizes_bytes:
        x, inbox = torch.ones(size // 4), torch.empty(size // 4)
        number = max(1, min(32, bytes_per_sample // size))  # small messages: many per sample
        raced = segment_counts and size == big
        cases = [('p2p', 2, ping), ('shift', max(group_sizes), shift)] + [
            (name, n, fn) for n in group_sizes for name, fn in algorithms.items()
            if not (raced and name != 'naive')
            and not (name == 'naive' and naive_up_to is not None and size > naive_up_to)]
        for name, n, fn in cases:
            for _ in range(repeats + 1):  # the first sample warms up
                sample((name, n, size), fn, x, n, number)
            samples[name, n, size].pop(0)
    if segment_counts:
        x = torch.ones(big // 4)
        for n in group_sizes:
            race = {'race:dist.all_reduce': algorithms['dist.all_reduce']}
            race.update({f'race:{s}': lambda x, n, s=s: ring_allreduce(x, range(n), segments=s)
                         for s in segment_counts})
            for r in range(race_repeats + 1):
                for name, fn in race.items():
                    sample((name, n, big), fn, x, n, 1)
                    if r == 0:  # warm-up
                        samples[name, n, big].pop(0)
                        samples['cpu:' + name[5:], n, big].pop(0)
            for s in segment_counts:  # gloo's time over the ring's, repeat by repeat
                samples[f'paired:{s}', n, big] = [
                    a / b for a, b in zip(samples['race:dist.all_reduce', n, big],
                                          samples[f'race:{s}', n, big])]
            default = ring_segments(big // 4, 4, n)
            samples['ring', n, big] = samples[f'race:{default}', n, big]
            samples['dist.all_reduce', n, big] = samples['race:dist.all_reduce', n, big]
    cpu = {'cpu_s': time.process_time() - start_cpu}
    if rank != 0:
        return cpu
    return {**cpu, 'seconds': {'|'.join(map(str, k)): _median(v) for k, v in samples.items()}}


def machine_cpu_seconds():
    """(busy, stolen): CPU seconds this whole machine has spent on programs (user and system
    time of every process) and lost to other virtual machines (steal) since it booted, from
    /proc/stat; None where there is no /proc/stat (not Linux)."""
    try:
        with open('/proc/stat') as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return None
    user, nice, system = fields[:3]
    steal = fields[7] if len(fields) > 7 else 0
    ticks = os.sysconf('SC_CLK_TCK')
    return (user + nice + system) / ticks, steal / ticks


# ---------------------------------------------------------- parameter-server training
def _model_and_data(config, worker):
    """Logistic regression on a fixed synthetic problem; each worker gets its own shard of
    `steps` batches (all shards when worker is None)."""
    g = torch.Generator().manual_seed(config['seed'])
    params = {'w': torch.randn(config['features'], 10, generator=g) * 0.01,
              'b': torch.zeros(10)}
    true_w = torch.randn(config['features'], 10, generator=g)
    shards = []
    for _ in range(config['workers']):
        X = torch.randn(config['steps'], config['batch'], config['features'], generator=g)
        shards.append((X, (X @ true_w).argmax(-1)))
    return params, shards[worker] if worker is not None else shards


def _grads(params, X, y):
    p = {k: v.clone().requires_grad_() for k, v in params.items()}
    loss = torch.nn.functional.cross_entropy(X @ p['w'] + p['b'], y, reduction='sum')
    loss.backward()
    return {k: v.grad for k, v in p.items()}


def shard_by_bytes(shapes, servers):
    """Which server holds which elements: the keys (sorted) are laid end to end and that line
    is cut into one equal part per server, so every server holds the same number of elements
    (within one), whatever the keys' sizes; a key may be split between servers.
    Returns {key: [(server, start, stop), ...]} over each key's flattened elements."""
    servers = list(servers)
    if not servers:
        raise ValueError('servers must name at least one server rank')
    sizes = {key: math.prod(shape) for key, shape in sorted(shapes.items())}
    total = sum(sizes.values())
    cuts = [total * j // len(servers) for j in range(len(servers) + 1)]
    plan, offset = {}, 0
    for key, size in sizes.items():
        plan[key] = [(server, max(cuts[j], offset) - offset, min(cuts[j + 1], offset + size)
                      - offset) for j, server in enumerate(servers)
                     if max(cuts[j], offset) < min(cuts[j + 1], offset + size)]
        offset += size
    return plan


class RemoteKVStore:
    """A worker's view of keys sharded over server ranks by bytes (`shard_by_bytes`):
    push(key, value) sends each server its slice of the value, and the server sums the pushes
    from all workers; pull(key) receives the updated slices. Pushes and pulls are asynchronous
    until wait()."""

    def __init__(self, shapes, servers):
        self.shapes = {key: tuple(shape) for key, shape in shapes.items()}
        self.servers = list(servers)
        self.slices = shard_by_bytes(self.shapes, self.servers)
        self._requests = []

    def held_by(self, server):
        """The (key, start, stop) slices `server` holds, in the order messages travel."""
        return sorted((key, a, b) for key, parts in self.slices.items()
                      for s, a, b in parts if s == server)

    def push(self, key, value):
        _check_key(key, self.shapes)
        _check_push(key, value, self.shapes[key])
        flat = value.detach().reshape(-1).contiguous()
        for server, a, b in self.slices[key]:
            self._requests.append((flat, dist.isend(flat[a:b], server)))

    def pull(self, key):
        _check_key(key, self.shapes)
        out = torch.empty(self.shapes[key])
        for server, a, b in self.slices[key]:
            self._requests.append((out, dist.irecv(out.view(-1)[a:b], server)))
        return out  # valid after wait()

    def wait(self):
        for _, request in self._requests:
            request.wait()
        self._requests = []


def _serve(rank, shard, workers, lr, total_batch, steps, bandwidth, fail_step=None):
    """A server's loop: per step, receive every worker's push for each of its slices, sum them
    in worker order, take an SGD step, send the new values back. With `bandwidth` (bytes/s),
    the server's network link is emulated by waiting size/bandwidth per message (used only
    where no emulated cluster is available: there, tc limits the real link instead)."""
    busy = 0.0
    for step in range(steps):
        if step == fail_step:
            raise RuntimeError(f'server rank {rank}: simulated failure at step {step}')
        for part in sorted(shard):
            total = torch.zeros_like(shard[part])
            buf = torch.empty_like(shard[part])
            for w in workers:
                dist.recv(buf, w)
                total += buf
                busy += _link_delay(buf, bandwidth)
            shard[part] -= lr * total / total_batch
        for part in sorted(shard):
            for w in workers:
                busy += _link_delay(shard[part], bandwidth)
                dist.send(shard[part], w)
    return busy


def _link_delay(tensor, bandwidth):
    if not bandwidth:
        return 0.0
    seconds = tensor.numel() * tensor.element_size() / bandwidth
    time.sleep(seconds)
    return seconds


PS_DEFAULTS = {'workers': 2, 'servers': 1, 'features': 64, 'batch': 32, 'steps': 5, 'lr': 0.5,
               'seed': 0, 'bandwidth': None, 'extra_keys': 0, 'extra_size': 0,
               'fail_server_step': None}


def ps_train_worker(rank, world_size, config):
    """Ranks [0, workers) are workers, the next `servers` ranks servers; ranks beyond those
    (only inside phases_worker, for runs of several sizes in one launch) wait. Workers push
    gradients and pull parameters through RemoteKVStore; returns each worker's final
    parameters, step times and the part of each step spent computing gradients, and each
    server's slices, their bytes and its emulated link time."""
    cfg = helpers.with_defaults(config, PS_DEFAULTS)
    used = cfg['workers'] + cfg['servers']
    if world_size != used and not (dist.is_initialized() and world_size > used):
        raise ValueError(f'world_size {world_size} != workers {cfg["workers"]} + '
                         f'servers {cfg["servers"]}')
    _joined()
    workers, servers = list(range(cfg['workers'])), list(range(cfg['workers'], used))
    params, data = _model_and_data(cfg, rank if rank in workers else None)
    for j in range(cfg['extra_keys']):  # padding to make messages bigger, for the bottleneck demo
        params[f'pad{j:02d}'] = torch.zeros(cfg['extra_size'])
    store = RemoteKVStore({k: v.shape for k, v in params.items()}, servers)
    total_batch = cfg['batch'] * cfg['workers']
    result = None
    if rank in servers:
        shard = {(key, a, b): params[key].reshape(-1)[a:b].clone()
                 for key, a, b in store.held_by(rank)}
        busy = _serve(rank, shard, workers, cfg['lr'], total_batch, cfg['steps'],
                      cfg['bandwidth'], cfg['fail_server_step'])
        result = {'emulated_link_s': busy, 'slices': sorted(shard),
                  'bytes': sum(t.numel() * t.element_size() for t in shard.values())}
    elif rank in workers:
        X, y = data
        step_times, compute_times = [], []
        for step in range(cfg['steps']):
            tik = time.perf_counter()
            grads = _grads({k: params[k] for k in ('w', 'b')}, X[step], y[step])
            grads.update({k: torch.zeros_like(v) for k, v in params.items() if k not in grads})
            compute_times.append(time.perf_counter() - tik)
            for key in sorted(params):
                store.push(key, grads[key])
            params = {key: store.pull(key) for key in sorted(params)}
            store.wait()
            step_times.append(time.perf_counter() - tik)
        result = {'w': params['w'], 'b': params['b'], 'step_times': step_times,
                  'compute_times': compute_times}
    dist.barrier()
    return result


def allreduce_train_worker(rank, world_size, config):
    """The same training with dist.all_reduce of the gradients and an SGD step on every worker."""
    cfg = {**PS_DEFAULTS, **config, 'workers': world_size}
    _joined()
    params, (X, y) = _model_and_data(cfg, rank)
    for step in range(cfg['steps']):
        grads = _grads(params, X[step], y[step])
        for key in sorted(grads):
            dist.all_reduce(grads[key])
            params[key] = params[key] - cfg['lr'] * grads[key] / (cfg['batch'] * world_size)
    return params


# ------------------------------------------------ synchronous against asynchronous SGD
SGD_DEFAULTS = {'workers': 2, 'features': 64, 'batch': 32, 'steps': 20, 'lr': 0.5, 'seed': 0,
                'straggler_s': 0.02, 'modes': ('sync', 'async')}


def _flat(params):
    return torch.cat([params['w'].reshape(-1), params['b']])


def _unflat(flat, features):
    return {'w': flat[:features * 10].view(features, 10), 'b': flat[features * 10:]}


def sgd_worker(rank, world_size, config):
    """Rank 0 is a parameter server, ranks 1..workers compute gradients on batches the server
    hands out: every run uses the same workers x steps batches, each exactly once.

    'sync': the server waits for a gradient from every worker, adds them, takes one step
    (learning rate over workers x batch examples) and hands out the next round of batches.
    'async': the server applies each gradient the moment it arrives (learning rate / workers,
    so the same examples move the weights as far) and gives that worker its next batch at
    once, so nobody waits for a slow worker, but gradients may be computed on stale weights.
    The last worker plays a slower machine: it sleeps `straggler_s` per batch.
    Returns, on the server, per mode: wall seconds, seconds per step (per workers batches),
    the loss on all the data over time, and how many batches each worker computed."""
    cfg = helpers.with_defaults(config, SGD_DEFAULTS)
    if world_size != cfg['workers'] + 1:
        raise ValueError(f'world_size {world_size} != 1 server + workers {cfg["workers"]}')
    for mode in cfg['modes']:
        helpers.check_choice('mode', mode, ('sync', 'async'))
    _joined()
    params, shards = _model_and_data(cfg, None)
    workers, features = cfg['workers'], cfg['features']
    batches = workers * cfg['steps']  # batch id k: shard k % workers, its step k // workers
    size = _flat(params).numel()
    message = torch.empty(size + 1)  # parameters, then the id of the batch to compute (-1: stop)
    results = {}
    for mode in cfg['modes']:
        if rank == 0:
            results[mode] = _sgd_server(mode, _flat(params), shards, cfg, batches, message)
        else:
            done = 0
            dist.recv(message, 0)
            while message[size] >= 0:
                k = int(message[size])
                X, y = shards[k % workers][0][k // workers], shards[k % workers][1][k // workers]
                grad = _flat(_grads(_unflat(message[:size], features), X, y))
                if rank == workers:
                    time.sleep(cfg['straggler_s'])
                dist.send(grad, 0)
                dist.recv(message, 0)
                done += 1
            results[mode] = done
        dist.barrier()
    if rank != 0:
        return {'batches_done': results}
    return results


def _sgd_server(mode, flat, shards, cfg, batches, message):
    workers, size = cfg['workers'], flat.numel()
    X = torch.cat([x.reshape(-1, cfg['features']) for x, _ in shards])
    y = torch.cat([labels.reshape(-1) for _, labels in shards])
    updates, version, staleness = 0, {}, []  # version: updates applied when a worker got weights

    def loss():
        p = _unflat(flat, cfg['features'])
        return torch.nn.functional.cross_entropy(X @ p['w'] + p['b'], y).item()

    def hand_out(worker, k):
        message[:size], message[size] = flat, k if k < batches else -1
        version[worker] = updates
        dist.send(message, worker)

    grad, tik = torch.empty(size), time.perf_counter()
    curve = [(0.0, loss())]
    for w in range(workers):
        hand_out(1 + w, w)
    if mode == 'sync':
        for step in range(cfg['steps']):
            total = torch.zeros(size)
            for w in range(workers):
                dist.recv(grad, 1 + w)
                total += grad
                staleness.append(updates - version[1 + w])
            flat -= cfg['lr'] * total / (workers * cfg['batch'])
            updates += 1
            curve.append((time.perf_counter() - tik, loss()))
            for w in range(workers):
                hand_out(1 + w, (step + 1) * workers + w)
    else:
        for k in range(workers, batches + workers):
            source = dist.recv(grad)  # from whichever worker finishes first
            staleness.append(updates - version[source])
            flat -= cfg['lr'] / workers * grad / cfg['batch']
            updates += 1
            if updates % workers == 0:
                curve.append((time.perf_counter() - tik, loss()))
            hand_out(source, k)
    seconds = time.perf_counter() - tik
    return {'seconds': seconds, 's_per_step': seconds / cfg['steps'], 'loss_curve': curve,
            'final_loss': curve[-1][1], 'updates': updates,
            'mean_staleness': sum(staleness) / len(staleness), 'max_staleness': max(staleness)}


# ----------------------------------------------------------------- hierarchical servers
HIERARCHY_DEFAULTS = {'machines': 2, 'per_machine': 2, 'numel': 2**20, 'repeats': 3, 'seed': 0}


def hierarchical_worker(rank, world_size, config):
    """Ranks [0, machines x per_machine) are workers, machine m holding the per_machine ranks
    from m x per_machine (its first is the machine's leader); the last rank is a server.
    Flat: every worker pushes its gradient to the server, which adds them up and sends the sum
    back to every worker. Hierarchical: a machine's workers first add their gradients on the
    leader, only leaders push to the server, and each leader hands the result to its machine.
    Returns, on workers, the largest |flat - hierarchical| and |flat - exact sum|; on the
    server, the bytes it received and the median seconds per reduction, per way."""
    cfg = helpers.with_defaults(config, HIERARCHY_DEFAULTS)
    workers = cfg['machines'] * cfg['per_machine']
    if world_size != workers + 1:
        raise ValueError(f'world_size {world_size} != machines {cfg["machines"]} x '
                         f'per_machine {cfg["per_machine"]} + 1 server')
    _joined()
    server, per = workers, cfg['per_machine']
    leaders = list(range(0, workers, per))

    def gradient(r):
        return torch.randn(cfg['numel'], generator=torch.Generator().manual_seed(cfg['seed'] + r))
    mine = gradient(rank)

    def reduce_at_server(senders, buf):
        total = torch.zeros(cfg['numel'])
        for r in senders:
            dist.recv(buf, r)
            total += buf
        for r in senders:
            dist.send(total, r)
        return len(senders) * buf.numel() * buf.element_size()

    def flat():
        if rank == server:
            return reduce_at_server(range(workers), torch.empty(cfg['numel']))
        out = mine.clone()
        dist.send(out, server)
        dist.recv(out, server)
        return out

    def hierarchical():
        if rank == server:
            return reduce_at_server(leaders, torch.empty(cfg['numel']))
        out, leader = mine.clone(), rank - rank % per
        if rank == leader:
            buf = torch.empty_like(out)
            for r in range(leader + 1, leader + per):  # add up this machine's gradients
                dist.recv(buf, r)
                out += buf
            dist.send(out, server)
            dist.recv(out, server)
            for r in range(leader + 1, leader + per):  # and hand the result back
                dist.send(out, r)
        else:
            dist.send(out, leader)
            dist.recv(out, leader)
        return out

    outcome, seconds = {}, {}
    for name, reduce in (('flat', flat), ('hierarchical', hierarchical)):
        samples = []
        for _ in range(cfg['repeats'] + 1):
            dist.barrier()
            tik = time.perf_counter()
            outcome[name] = reduce()
            dist.barrier()
            samples.append(time.perf_counter() - tik)
        seconds[name] = _median(samples[1:])
    if rank == server:
        return {'server_bytes_received': outcome, 'seconds': seconds}
    exact = sum(gradient(r).double() for r in range(workers))
    return {'max_diff': (outcome['flat'] - outcome['hierarchical']).abs().max().item(),
            'flat_vs_exact': (outcome['flat'].double() - exact).abs().max().item()}
