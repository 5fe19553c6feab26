"""Parameter servers over torch.distributed point-to-point messages (notebook 07): a key-value
store with push and pull, its shards spread over server processes by bytes, training through it
(and restarting that training from checkpoints after a server dies), synchronous against
asynchronous SGD, and hierarchical servers that add up each machine's gradients first.

The ring all-reduce and its benchmarks live in allreduce.py. Messages are CPU tensors over gloo
on every machine, so that one code path runs everywhere. The functions ending in `_worker` are
process entry points for launch.run_workers; they live here because spawned processes must
import them. Everything else is called inside them or in the notebook.
"""
import functools
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

import helpers
import launch
import stats


# ----------------------------------------------------------------- key-value store
def check_key(key, known):
    if key not in known:
        raise KeyError(f'unknown key {key!r}; known keys: {sorted(known)}')


def check_push(key, value, shape):
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f'push to {key!r}: shape {tuple(value.shape)} does not match '
                         f'{tuple(shape)}')


# ---------------------------------------------------------------- process groups
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


def grads_of(params, X, y):
    p = {k: v.clone().requires_grad_() for k, v in params.items()}
    loss = torch.nn.functional.cross_entropy(X @ p['w'] + p['b'], y, reduction='sum')
    loss.backward()
    return {k: v.grad for k, v in p.items()}


# ---- saved from 07_parameter_servers.ipynb by make export: edit the notebook
def canonical_sum(values):
    '''The sum of same-shaped tensors added in one canonical order, sorted by their bytes: the
    same bits whatever order they came in. KVStore.pull adds a key's pending pushes with it.'''
    total = torch.zeros_like(values[0])
    for v in sorted(values, key=lambda t: t.cpu().numpy().tobytes()):
        total += v
    return total


class KVStore:
    '''In-process key-value store: push(key, value) adds into the key's pending sum, pull(key)
    applies the pending sum through `updater` (default: replace) and returns the value.'''

    def __init__(self, updater=None):
        self.updater = updater or (lambda key, total, value: total)
        self._values, self._pending = {}, {}

    def init(self, key, value):
        if key in self._values:
            raise KeyError(f'key {key!r} is already initialised')
        self._values[key] = value.detach().clone()
        self._pending[key] = []

    def push(self, key, value):
        check_key(key, self._values)
        check_push(key, value, self._values[key].shape)
        self._pending[key].append(value.detach().clone())

    def pull(self, key):
        check_key(key, self._values)
        pending = self._pending[key]
        if pending:
            self._values[key] = self.updater(key, canonical_sum(pending), self._values[key])
            self._pending[key] = []
        return self._values[key].clone()


def shard_by_bytes(shapes, servers):
    '''Which server holds which elements: the keys (sorted) are laid end to end and that line
    is cut into one equal part per server, so every server holds the same number of elements
    (within one), whatever the keys' sizes; a key may be split between servers.
    Returns {key: [(server, start, stop), ...]} over each key's flattened elements.'''
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
    '''A worker's view of keys sharded over server ranks by bytes (`shard_by_bytes`):
    push(key, value) sends each server its slice of the value, and the server sums the pushes
    from all workers; pull(key) receives the updated slices. Pushes and pulls are asynchronous
    until wait().'''

    def __init__(self, shapes, servers):
        self.shapes = {key: tuple(shape) for key, shape in shapes.items()}
        self.servers = list(servers)
        self.slices = shard_by_bytes(self.shapes, self.servers)
        self._requests = []

    def held_by(self, server):
        '''The (key, start, stop) slices `server` holds, in the order messages travel.'''
        return sorted((key, a, b) for key, parts in self.slices.items()
                      for s, a, b in parts if s == server)

    def push(self, key, value):
        check_key(key, self.shapes)
        check_push(key, value, self.shapes[key])
        flat = value.detach().reshape(-1).contiguous()
        for server, a, b in self.slices[key]:
            self._requests.append((flat, dist.isend(flat[a:b], server)))

    def pull(self, key):
        check_key(key, self.shapes)
        out = torch.empty(self.shapes[key])
        for server, a, b in self.slices[key]:
            self._requests.append((out, dist.irecv(out.view(-1)[a:b], server)))
        return out  # valid after wait()

    def wait(self):
        for _, request in self._requests:
            request.wait()
        self._requests = []


def serve(rank, shard, workers, cfg):
    '''A server's loop over its shard {(key, start, stop): values}. Returns the seconds it
    waited to emulate a link of cfg['bandwidth'] bytes/s. With cfg['checkpoint_every'] it saves
    the shard every that many steps; with cfg['start_step'] > 0 it first loads that step's
    checkpoint and sends it to the workers.'''
    busy, total_batch = 0.0, cfg['batch'] * cfg['workers']
    start, every = cfg['start_step'], cfg['checkpoint_every']
    if start:
        shard.update(torch.load(checkpoint_path(cfg['checkpoint_dir'], rank, start)))
        send_shard(shard, workers)
    for step in range(start, cfg['steps']):
        if step == cfg['fail_server_step']:
            raise RuntimeError(f'server rank {rank}: simulated failure at step {step}')
        for part in sorted(shard):
            total, buf = torch.zeros_like(shard[part]), torch.empty_like(shard[part])
            for w in workers:
                dist.recv(buf, w)
                total += buf
                busy += link_delay(buf, cfg['bandwidth'])
            shard[part] -= cfg['lr'] * total / total_batch
        if every and (step + 1) % every == 0:
            save_atomically(shard, checkpoint_path(cfg['checkpoint_dir'], rank, step + 1))
        busy += send_shard(shard, workers, cfg['bandwidth'])
    return busy


def push_pull(store, params, X, y, steps):
    '''A worker's training over `steps` (step numbers into its batches X, y) through `store`.
    Returns the parameters, each step's seconds and the part spent computing gradients.'''
    step_times, compute_times = [], []
    for step in steps:
        tik = time.perf_counter()
        grads = grads_of({k: params[k] for k in ('w', 'b')}, X[step], y[step])
        grads.update({k: torch.zeros_like(v) for k, v in params.items() if k not in grads})
        compute_times.append(time.perf_counter() - tik)  # padding keys above push zeros
        for key in sorted(params):
            store.push(key, grads[key])
        params = {key: store.pull(key) for key in sorted(params)}
        store.wait()
        step_times.append(time.perf_counter() - tik)
    return params, step_times, compute_times


def allreduce_steps(params, X, y, steps, lr, batch):
    '''The same training without servers: dist.all_reduce sums each key's gradient on every
    worker, and each takes the same SGD step (lr over all the workers' examples).'''
    for step in steps:
        grads = grads_of(params, X[step], y[step])
        for key in sorted(grads):
            dist.all_reduce(grads[key])
            params[key] = params[key] - lr * grads[key] / (batch * dist.get_world_size())
    return params


def sgd_server(mode, flat, cfg, loss, message):
    '''sgd_worker's server: it sends a worker the weights `flat` and the id of its next batch
    in `message` (-1: stop) and receives the gradient. 'sync' steps once per round of every
    worker's gradient; 'async' steps on each gradient as it arrives and hands that worker its
    next batch at once. Returns the loss() curve [(seconds, loss)], the updates and each
    gradient's staleness: the updates applied since its worker got the weights.'''
    workers, size, batches = cfg['workers'], flat.numel(), cfg['workers'] * cfg['steps']
    updates, version, staleness = 0, {}, []  # version: updates applied when a worker got weights

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
    return curve, updates, staleness


def sgd_client(rank, cfg, shards, message):
    '''sgd_worker's worker: answers each message (weights, then batch id k) with the gradient
    of batch k (shard k % workers, its step k // workers) until k is -1; the last worker
    sleeps cfg['straggler_s'] per batch. Returns how many batches it computed.'''
    size, workers, done = message.numel() - 1, cfg['workers'], 0
    dist.recv(message, 0)
    while message[size] >= 0:
        k = int(message[size])
        X, y = shards[k % workers][0][k // workers], shards[k % workers][1][k // workers]
        grad = flat_params(grads_of(unflat_params(message[:size], cfg['features']), X, y))
        if rank == workers:
            time.sleep(cfg['straggler_s'])
        dist.send(grad, 0)
        dist.recv(message, 0)
        done += 1
    return done


def reduce_at_server(senders, like):
    '''The server's side: add what `senders` push, send each the sum; returns bytes received.'''
    total, buf = torch.zeros_like(like), torch.empty_like(like)
    for r in senders:
        dist.recv(buf, r)
        total += buf
    for r in senders:
        dist.send(total, r)
    return len(senders) * buf.numel() * buf.element_size()


def flat_reduction(rank, workers, per, mine):
    '''Every worker pushes to the server (rank `workers`) and pulls the sum back.'''
    if rank == workers:
        return reduce_at_server(range(workers), mine)
    out = mine.clone()
    dist.send(out, workers)
    dist.recv(out, workers)
    return out


def hierarchical_reduction(rank, workers, per, mine):
    '''Each machine's `per` workers add up on its leader, which pushes to the server.'''
    if rank == workers:
        return reduce_at_server(range(0, workers, per), mine)
    out, leader = mine.clone(), rank - rank % per
    if rank != leader:
        dist.send(out, leader)
        dist.recv(out, leader)
        return out
    buf = torch.empty_like(out)
    for r in range(leader + 1, leader + per):  # add up this machine's gradients
        dist.recv(buf, r)
        out += buf
    dist.send(out, workers)
    dist.recv(out, workers)
    for r in range(leader + 1, leader + per):  # and hand the result back
        dist.send(out, r)
    return out
# ---- end of what 07_parameter_servers.ipynb saves


def send_shard(shard, workers, bandwidth=None):
    busy = 0.0
    for part in sorted(shard):
        for w in workers:
            busy += link_delay(shard[part], bandwidth)
            dist.send(shard[part], w)
    return busy


def link_delay(tensor, bandwidth):
    if not bandwidth:
        return 0.0
    seconds = tensor.numel() * tensor.element_size() / bandwidth
    time.sleep(seconds)
    return seconds


# ------------------------------------------------------------------------ checkpoints
def checkpoint_path(directory, server, step):
    """Where server rank `server` keeps its shard as it was after `step` steps."""
    return Path(directory) / f'server{server}-step{step}.pt'


def save_atomically(shard, path):
    """Write the shard so that a reader never sees half of it: to a temporary name, then
    renamed (a server that dies while saving leaves the previous checkpoint intact)."""
    tmp = path.with_suffix('.tmp')
    torch.save(shard, tmp)
    tmp.replace(path)


def latest_checkpoint(directory, servers):
    """The last step after which every one of `servers` saved its shard in `directory` (0
    when some server saved nothing: a restart then starts from scratch)."""
    steps = [{int(p.stem.split('step')[1]) for p in Path(directory).glob(f'server{s}-step*.pt')}
             for s in servers]
    common = set.intersection(*steps) if steps else set()
    return max(common, default=0)


PS_DEFAULTS = {'workers': 2, 'servers': 1, 'features': 64, 'batch': 32, 'steps': 5, 'lr': 0.5,
               'seed': 0, 'bandwidth': None, 'extra_keys': 0, 'extra_size': 0,
               'fail_server_step': None, 'checkpoint_every': None, 'checkpoint_dir': None,
               'start_step': 0}


def ps_train_worker(rank, world_size, config):
    """Ranks [0, workers) are workers, the next `servers` ranks servers; ranks beyond those
    (only inside phases_worker, for runs of several sizes in one launch) wait. Workers push
    gradients and pull parameters through RemoteKVStore; returns each worker's final
    parameters, step times and the part of each step spent computing gradients, and each
    server's slices, their bytes and its emulated link time. With start_step > 0 the run
    resumes from the servers' checkpoints of that step (see serve): the workers pull the
    parameters first and go on from that place in their data."""
    cfg = helpers.with_defaults(config, PS_DEFAULTS)
    used = cfg['workers'] + cfg['servers']
    if world_size != used and not (dist.is_initialized() and world_size > used):
        raise ValueError(f'world_size {world_size} != workers {cfg["workers"]} + '
                         f'servers {cfg["servers"]}')
    if (cfg['checkpoint_every'] or cfg['start_step']) and cfg['checkpoint_dir'] is None:
        raise ValueError('checkpoint_every and start_step need a checkpoint_dir')
    _joined()
    workers, servers = list(range(cfg['workers'])), list(range(cfg['workers'], used))
    params, data = _model_and_data(cfg, rank if rank in workers else None)
    for j in range(cfg['extra_keys']):  # padding to make messages bigger, for the bottleneck demo
        params[f'pad{j:02d}'] = torch.zeros(cfg['extra_size'])
    store = RemoteKVStore({k: v.shape for k, v in params.items()}, servers)
    result = None
    if rank in servers:
        shard = {(key, a, b): params[key].reshape(-1)[a:b].clone()
                 for key, a, b in store.held_by(rank)}
        busy = serve(rank, shard, workers, cfg)
        result = {'emulated_link_s': busy, 'slices': sorted(shard),
                  'bytes': sum(t.numel() * t.element_size() for t in shard.values())}
    elif rank in workers:
        X, y = data
        if cfg['start_step']:  # resuming: the servers hold the parameters
            params = {key: store.pull(key) for key in sorted(params)}
            store.wait()
        params, step_times, compute_times = push_pull(store, params, X, y,
                                                      range(cfg['start_step'], cfg['steps']))
        result = {'w': params['w'], 'b': params['b'], 'step_times': step_times,
                  'compute_times': compute_times}
    dist.barrier()
    return result


def allreduce_train_worker(rank, world_size, config):
    """The same training with dist.all_reduce of the gradients and an SGD step on every worker."""
    cfg = {**PS_DEFAULTS, **config, 'workers': world_size}
    _joined()
    params, (X, y) = _model_and_data(cfg, rank)
    return allreduce_steps(params, X, y, range(cfg['steps']), cfg['lr'], cfg['batch'])


# ------------------------------------------------ synchronous against asynchronous SGD
SGD_DEFAULTS = {'workers': 2, 'features': 64, 'batch': 32, 'steps': 20, 'lr': 0.5, 'seed': 0,
                'straggler_s': 0.02, 'modes': ('sync', 'async')}


def flat_params(params):
    return torch.cat([params['w'].reshape(-1), params['b']])


def unflat_params(flat, features):
    return {'w': flat[:features * 10].view(features, 10), 'b': flat[features * 10:]}


@dataclass
class Problem:
    """The asynchronous-SGD demo's problem, in one process: the starting weights (flat), the
    batches in the order sgd_worker's server hands them out (batch k is worker k % workers'
    step k // workers), and the loss and summed gradient of flat weights."""
    start: torch.Tensor
    batches: list
    X: torch.Tensor
    y: torch.Tensor
    features: int

    def loss(self, flat):
        """Mean cross-entropy on all the data."""
        p = unflat_params(flat, self.features)
        return torch.nn.functional.cross_entropy(self.X @ p['w'] + p['b'], self.y).item()

    def grad(self, flat, X, y):
        """The gradient of the loss summed over the batch (X, y), at the weights `flat`."""
        return flat_params(grads_of(unflat_params(flat, self.features), X, y))


def sgd_problem(config=None):
    """sgd_worker's problem (with its SGD_DEFAULTS and `config`), as a Problem."""
    cfg = helpers.with_defaults(config or {}, SGD_DEFAULTS)
    params, shards = _model_and_data(cfg, None)
    w = cfg['workers']
    batches = [(shards[k % w][0][k // w], shards[k % w][1][k // w])
               for k in range(w * cfg['steps'])]
    X = torch.cat([x.reshape(-1, cfg['features']) for x, _ in shards])
    y = torch.cat([labels.reshape(-1) for _, labels in shards])
    return Problem(flat_params(params), batches, X, y, cfg['features'])


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
    size = flat_params(params).numel()
    message = torch.empty(size + 1)  # parameters, then the id of the batch to compute (-1: stop)
    results, problem = {}, sgd_problem(cfg)
    for mode in cfg['modes']:
        if rank == 0:
            flat, tik = flat_params(params), time.perf_counter()
            loss = functools.partial(problem.loss, flat)  # the loss at flat as the server steps
            curve, updates, staleness = sgd_server(mode, flat, cfg, loss, message)
            results[mode] = _sgd_summary(curve, updates, staleness, time.perf_counter() - tik,
                                         cfg['steps'])
        else:
            results[mode] = sgd_client(rank, cfg, shards, message)
        dist.barrier()
    if rank != 0:
        return {'batches_done': results}
    return results


def _sgd_summary(curve, updates, staleness, seconds, steps):
    """What sgd_worker's server returns of one run of sgd_server."""
    return {'seconds': seconds, 's_per_step': seconds / steps, 'loss_curve': curve,
            'final_loss': curve[-1][1], 'updates': updates,
            'mean_staleness': sum(staleness) / len(staleness), 'max_staleness': max(staleness),
            'staleness_counts': {k: staleness.count(k) for k in sorted(set(staleness))}}


def async_record(runs, batches_done, straggler_ms):
    """What notebook 07 records of sgd_worker's two runs (runs: the server's result)."""
    return {'sync_s_per_step': runs['sync']['s_per_step'],
            'async_s_per_step': runs['async']['s_per_step'],
            'sync_final_loss': runs['sync']['final_loss'],
            'async_final_loss': runs['async']['final_loss'],
            'async_mean_staleness': runs['async']['mean_staleness'],
            'async_max_staleness': runs['async']['max_staleness'],
            'async_staleness_counts': runs['async']['staleness_counts'],
            'batches_done': batches_done, 'straggler_ms': straggler_ms}


# ----------------------------------------------------------------- hierarchical servers
HIERARCHY_DEFAULTS = {'machines': 2, 'per_machine': 2, 'numel': 2**20, 'repeats': 3, 'seed': 0}


def hierarchical_worker(rank, world_size, config):
    """Ranks [0, machines x per_machine) are workers, machine m holding the per_machine ranks
    from m x per_machine (its first is the machine's leader); the last rank is a server.
    Flat: every worker pushes its gradient to the server, which adds them up and sends the sum
    back to every worker. Hierarchical: a machine's workers first add their gradients on the
    leader, only leaders push to the server, and each leader hands the result to its machine.
    Returns, on workers, the largest |flat - hierarchical| and |flat - exact sum|; on the
    server, the bytes it received, and per way the seconds of every timed reduction
    ('samples') and their median ('seconds')."""
    cfg = helpers.with_defaults(config, HIERARCHY_DEFAULTS)
    workers = cfg['machines'] * cfg['per_machine']
    if world_size != workers + 1:
        raise ValueError(f'world_size {world_size} != machines {cfg["machines"]} x '
                         f'per_machine {cfg["per_machine"]} + 1 server')
    _joined()
    gradient = lambda r: torch.randn(cfg['numel'],
                                     generator=torch.Generator().manual_seed(cfg['seed'] + r))
    ways = {'flat': flat_reduction, 'hierarchical': hierarchical_reduction}
    mine, outcome, seconds = gradient(rank), {}, {}
    for name, reduce in ways.items():
        samples = []
        for _ in range(cfg['repeats'] + 1):
            dist.barrier()
            tik = time.perf_counter()
            outcome[name] = reduce(rank, workers, cfg['per_machine'], mine)
            dist.barrier()
            samples.append(time.perf_counter() - tik)
        seconds[name] = samples[1:]  # the first warms up
    if rank == workers:
        return {'server_bytes_received': outcome, 'samples': seconds,
                'seconds': {name: stats.median(v) for name, v in seconds.items()}}
    exact = sum(gradient(r).double() for r in range(workers))
    return {'max_diff': (outcome['flat'] - outcome['hierarchical']).abs().max().item(),
            'flat_vs_exact': (outcome['flat'].double() - exact).abs().max().item()}
