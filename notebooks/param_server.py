"""Parameter servers and all-reduce over torch.distributed point-to-point messages (notebook 07).

Messages are CPU tensors over gloo on every machine, so that one code path runs everywhere.

The functions ending in `_worker` are process entry points for helpers.run_workers; they live
here because spawned processes must import them. Everything else is called inside them or
in the notebook.
"""
import time

import torch
import torch.distributed as dist

import helpers


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

    The sum is order-independent: pending values are added in a canonical order, so the
    result is bit-identical whatever order the pushes arrived in.
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


def ring_allreduce(tensor, ranks=None):
    """Sum `tensor` over the processes in `ranks` (default: all), in place, along a ring.

    The tensor is cut into n chunks (sizes may differ by one element). Reduce-scatter: in n-1
    steps each process sends one chunk to its right neighbour and adds the chunk arriving from
    its left, so each process ends owning one fully summed chunk. All-gather: n-1 more steps
    pass the summed chunks around. Every process sends 2(n-1)/n of the data in total.
    """
    ranks, i = _ring(ranks)
    n = len(ranks)
    right, left = ranks[(i + 1) % n], ranks[(i - 1) % n]
    flat = tensor.view(-1)  # contiguous tensors only: the result must land in `tensor`
    chunks = list(flat.tensor_split(n))
    incoming = torch.empty_like(chunks[0])

    def exchange(send_chunk, recv_chunk):
        buf = incoming[:recv_chunk.numel()]
        requests = [dist.isend(send_chunk, right), dist.irecv(buf, left)]  # both at once:
        for req in requests:                                                # no deadlock
            req.wait()
        return buf

    for step in range(n - 1):  # reduce-scatter
        send, recv = (i - step) % n, (i - step - 1) % n
        chunks[recv] += exchange(chunks[send], chunks[recv])
    for step in range(n - 1):  # all-gather
        send, recv = (i + 1 - step) % n, (i - step) % n
        chunks[recv].copy_(exchange(chunks[send], chunks[recv]))
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


def check_collectives_worker(rank, world_size, sizes, dtypes):
    """Compare ring and naive all-reduce with dist.all_reduce for n = 2..world_size, every
    size and dtype; returns the largest |difference| relative to the largest |sum| per case
    (rank 0's view). Sums taken in another order differ by float rounding, never more."""
    helpers.init_distributed(timeout=60, backend='gloo')
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
                    ring, naive = ring_allreduce(x.clone(), range(n)), naive_allreduce(
                        x.clone(), range(n))
                    scale = expected.abs().max().item() or 1
                    errors[f'n={n} {str(dtype)[6:]} size={size}'] = max(
                        (ring - expected).abs().max().item(),
                        (naive - expected).abs().max().item()) / scale
                dist.barrier()
    return errors


def benchmark_worker(rank, world_size, sizes_bytes, repeats, group_sizes):
    """Time ring, naive and dist.all_reduce over float32 messages, and one-way send/recv
    between ranks 0 and 1 (for fitting latency and bandwidth). Rank 0 reports medians."""
    helpers.init_distributed(timeout=120, backend='gloo')
    groups = _groups(world_size)
    algorithms = {'ring': lambda x, n: ring_allreduce(x, range(n)),
                  'naive': lambda x, n: naive_allreduce(x, range(n)),
                  'dist.all_reduce': lambda x, n: dist.all_reduce(x, group=groups[n])}
    times = {}

    def timed(key, fn, x, member):
        number = max(1, min(32, 2**22 // (4 * x.numel())))  # small messages: many per sample
        samples = []
        for _ in range(repeats + 1):  # the first sample warms up
            dist.barrier()
            tik = time.perf_counter()
            for _ in range(number):
                if member:
                    fn(x)
            dist.barrier()  # everyone waits for the slowest: the collective's time
            samples.append((time.perf_counter() - tik) / number)
        times[key] = sorted(samples[1:])[len(samples[1:]) // 2]

    barrier = torch.empty(0)
    for size in sizes_bytes:
        x = torch.ones(size // 4)
        # one-way point-to-point, timed as half a round trip between ranks 0 and 1
        def ping(x=x):
            if rank == 0:
                dist.send(x, 1)
                dist.recv(barrier, 1)
            elif rank == 1:
                dist.recv(x, 0)
                dist.send(barrier, 0)
        timed(('p2p', 2, size), ping, x, rank < 2)
        for n in group_sizes:
            for name, fn in algorithms.items():
                timed((name, n, size), lambda x, fn=fn, n=n: fn(x, n), x, rank < n)
    return {'|'.join(map(str, k)): v for k, v in times.items()} if rank == 0 else None


# ---------------------------------------------------------- parameter-server training
def _model_and_data(config, worker):
    """Logistic regression on a fixed synthetic problem; each worker gets its own shard."""
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


class RemoteKVStore:
    """A worker's view of keys sharded over server ranks: push(key, value) sends the value to
    the key's server, which sums the pushes from all workers; pull(key) receives the updated
    value. Pushes and pulls are asynchronous until wait()."""

    def __init__(self, shapes, servers):
        self.shapes, self.servers = dict(shapes), list(servers)
        self.owner = {key: self.servers[j % len(self.servers)]
                      for j, key in enumerate(sorted(self.shapes))}
        self._requests = []

    def push(self, key, value):
        _check_key(key, self.shapes)
        _check_push(key, value, self.shapes[key])
        self._requests.append(dist.isend(value.contiguous(), self.owner[key]))

    def pull(self, key):
        _check_key(key, self.shapes)
        out = torch.empty(self.shapes[key])
        self._requests.append(dist.irecv(out, self.owner[key]))
        return out  # valid after wait()

    def wait(self):
        for req in self._requests:
            req.wait()
        self._requests = []


def _serve(rank, shard, workers, lr, total_batch, steps, bandwidth, fail_step=None):
    """A server's loop: per step, receive every worker's push for each of its keys, sum them
    in worker order, take an SGD step, send the new values back. With `bandwidth` (bytes/s),
    the server's network link is emulated by waiting size/bandwidth per message."""
    busy = 0.0
    for step in range(steps):
        if step == fail_step:
            raise RuntimeError(f'server rank {rank}: simulated failure at step {step}')
        for key in sorted(shard):
            total = torch.zeros_like(shard[key])
            buf = torch.empty_like(shard[key])
            for w in workers:
                dist.recv(buf, w)
                total += buf
                busy += _link_delay(buf, bandwidth)
            shard[key] -= lr * total / total_batch
        for key in sorted(shard):
            for w in workers:
                busy += _link_delay(shard[key], bandwidth)
                dist.send(shard[key], w)
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
    """Ranks [0, workers) are workers, the rest servers. Workers push gradients and pull
    parameters through RemoteKVStore; returns worker 0's final parameters and step times."""
    cfg = helpers.with_defaults(config, PS_DEFAULTS)
    if world_size != cfg['workers'] + cfg['servers']:
        raise ValueError(f'world_size {world_size} != workers {cfg["workers"]} + '
                         f'servers {cfg["servers"]}')
    helpers.init_distributed(timeout=120, backend='gloo')
    workers = list(range(cfg['workers']))
    servers = list(range(cfg['workers'], world_size))
    params, data = _model_and_data(cfg, rank if rank in workers else None)
    for j in range(cfg['extra_keys']):  # padding to make messages bigger, for the bottleneck demo
        params[f'pad{j:02d}'] = torch.zeros(cfg['extra_size'])
    store = RemoteKVStore({k: v.shape for k, v in params.items()}, servers)
    total_batch = cfg['batch'] * cfg['workers']
    if rank in servers:
        shard = {k: v.clone() for k, v in params.items() if store.owner[k] == rank}
        busy = _serve(rank, shard, workers, cfg['lr'], total_batch, cfg['steps'],
                      cfg['bandwidth'], cfg['fail_server_step'])
        dist.barrier()
        return {'server_busy_s': busy, 'keys': sorted(shard)}
    X, y = data
    step_times = []
    for step in range(cfg['steps']):
        tik = time.perf_counter()
        grads = _grads({k: params[k] for k in ('w', 'b')}, X[step], y[step])
        grads.update({k: torch.zeros_like(v) for k, v in params.items() if k not in grads})
        for key in sorted(params):
            store.push(key, grads[key])
        params = {key: store.pull(key) for key in sorted(params)}
        store.wait()
        step_times.append(time.perf_counter() - tik)
    dist.barrier()
    return {'w': params['w'], 'b': params['b'], 'step_times': step_times}


def allreduce_train_worker(rank, world_size, config):
    """The same training with dist.all_reduce of the gradients and an SGD step on every worker."""
    cfg = {**PS_DEFAULTS, **config, 'workers': world_size}
    helpers.init_distributed(timeout=120, backend='gloo')
    params, (X, y) = _model_and_data(cfg, rank)
    for step in range(cfg['steps']):
        grads = _grads(params, X[step], y[step])
        for key in sorted(grads):
            dist.all_reduce(grads[key])
            params[key] = params[key] - cfg['lr'] * grads[key] / (cfg['batch'] * world_size)
    return params
