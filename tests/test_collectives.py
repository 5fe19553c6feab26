"""collectives.py: the counter sees c10d and functional collectives alike, with the size of the
group each runs on, on real gloo processes."""
import torch
import torch.distributed as dist

import launch
from collectives import RING_BYTES, CollectiveCounter


def counting_worker(rank, world_size):
    """Collectives of every kind on 3 ranks: c10d ones on the world and on a 2-rank group,
    and the functional ones DTensor issues. Returns what the counter saw for each."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    launch.init_distributed(backend='gloo')
    pair = dist.new_group([0, 1])
    mesh = init_device_mesh('cpu', (world_size,))
    x = torch.ones(6)  # 24 bytes
    seen = {}
    with CollectiveCounter() as c:
        dist.all_reduce(x)
    seen['c10d world'] = c.calls, c.bytes
    with CollectiveCounter() as c:
        if rank < 2:
            dist.all_reduce(x, group=pair)
    seen['c10d pair'] = c.calls, c.bytes
    partial = DTensor.from_local(torch.ones(6), mesh, [Partial()])
    with CollectiveCounter() as c:
        partial.redistribute(mesh, [Replicate()]).to_local().sum()
    seen['functional all-reduce'] = c.calls, c.bytes
    sharded = distribute_tensor(torch.ones(6), mesh, [Shard(0)])
    with CollectiveCounter() as c:
        sharded.full_tensor().sum()
    seen['functional all-gather'] = c.calls, c.bytes
    with CollectiveCounter() as c:
        partial.redistribute(mesh, [Shard(0)]).to_local().sum()
    seen['functional reduce-scatter'] = c.calls, c.bytes
    dist.barrier()
    return seen


def test_counter_counts_c10d_and_functional_collectives_by_their_group():
    k, nbytes = 3, 24
    results = launch.run_workers(counting_worker, k, timeout=120)
    for rank, seen in enumerate(results):
        assert seen['c10d world'] == ({'c10d.allreduce_': 1}, 2 * (k - 1) / k * nbytes)
        # the pair's all-reduce is a 2-rank ring, whatever the world's size
        assert seen['c10d pair'] == (({'c10d.allreduce_': 1}, nbytes) if rank < 2 else ({}, 0))
        calls, sent = seen['functional all-reduce']
        assert calls == {'_c10d_functional.all_reduce': 1}  # wait_tensor is not counted
        assert sent == 2 * (k - 1) / k * nbytes
        calls, sent = seen['functional all-gather']
        assert calls == {'_c10d_functional.all_gather_into_tensor': 1}
        assert sent == (k - 1) * nbytes / k  # each rank sends its 2-value shard k-1 times
        calls, sent = seen['functional reduce-scatter']
        assert calls == {'_c10d_functional.reduce_scatter_tensor': 1}
        assert sent == (k - 1) / k * nbytes


def test_every_counted_collective_has_a_ring_formula_that_grows_with_k():
    t = [torch.ones(4)]
    for name, formula in RING_BYTES.items():
        args = (t[0], t[0]) if 'allgather' in name or 'reduce_scatter' in name else (t, t)
        if name.startswith('_c10d_functional.'):
            args = (t if name.endswith('coalesced') else t[0],)
        assert formula(args, 1) == 0 or name == 'c10d.send', name  # one rank sends nothing
        assert formula(args, 4) >= formula(args, 2) > 0, name
