"""Notebook 07: its parameters, declared once and checked, and its work sized for the machine.

Every process of notebook 07 is a CPU process that talks gloo, on every machine, GPU or not, so
the plan sizes only messages, repeats and emulated links, to the CPU's budget; the notebook's
Markdown says why.
"""
import os

import torch

import parameters
from hardware import on_device, probe
from parameters import Param
from sizing import Plan, Setup, budget, largest_fitting

MIN_TORCH = ('2.9', 'the oldest torch make compat found this notebook passing on; 2.4 fails')

# What each parameter means, as its line of the notebook's parameters cell says it.
MEANING = dict(line.split(': ', 1) for line in """\
max_processes: rings are timed on 2..max_processes processes (and hosts)
message_mb: largest benchmark message, MB; None: from the plan
bench_repeats: timed repeats per benchmark point (median reported)
race_repeats: repeats of the ring-vs-gloo race; None: from the plan
segment_counts: ring segments per chunk raced
num_workers: workers in the parameter-server demos
num_servers: servers the parameters are sharded over
demo_servers: server counts in the bottleneck demo
gradient_mb: MB each worker pushes per step in the bottleneck demo
straggler_ms: the slow worker's extra time per batch (async SGD)
use_cluster: None: emulated hosts where allowed; False: loopback only
link_mbit: rate of every emulated link, Mbit/s; None: from the plan
link_delay_ms: one-way delay per link, ms; None: 1 where tc has netem
threads_per_rank: torch threads per process; None: cores // processes
worker_timeout: seconds before a run of processes is stopped
results_dir: where the headline numbers go as JSON; None: build/results""".splitlines())

PARAMETERS = tuple(Param(name, default, MEANING[name], **bounds) for name, default, bounds in [
    ('max_processes', 4, {'minimum': 2}),
    ('message_mb', None, {'optional': True}),
    ('bench_repeats', 3, {}),
    ('race_repeats', None, {'optional': True}),
    ('segment_counts', [1, 2, 4, 8, 16], {'kind': 'list'}),
    ('num_workers', 2, {}),
    ('num_servers', 2, {}),
    ('demo_servers', [1, 2, 4], {'kind': 'list'}),
    ('gradient_mb', None, {'optional': True}),
    ('straggler_ms', 20, {'minimum': 0}),
    ('use_cluster', None, {'kind': 'str', 'choices': (True, False), 'optional': True}),
    ('link_mbit', None, {'kind': 'float', 'optional': True}),
    ('link_delay_ms', None, {'kind': 'float', 'minimum': 0, 'optional': True}),
    ('threads_per_rank', None, {'optional': True}),
    ('worker_timeout', 180, {}),
    ('results_dir', None, {'kind': 'str', 'optional': True}),
])

# Rates measured on a 2-core machine:
LOOPBACK_BUSBW_07 = 0.8e9   # ring or dist.all_reduce bus bandwidth over loopback, a core each
FIXED_S_07 = 30             # kernel, imports, the first forked process, small runs, plots,
                            # the restart from a checkpoint
LINK_MBIT_07 = 2000         # emulated links: a 64 MB ring over 4 hosts in about half a second


def plan_for(machine, max_processes=4, cluster=False, num_workers=2, demo_servers=(1, 2, 4),
             bench_repeats=3, segment_counts=(1, 2, 4, 8, 16), message_mb=None,
             race_repeats=None, link_mbit=None, gradient_mb=None):
    """The largest message, the race's repeats, the emulated links' rate and the bottleneck
    demo's gradient: loopback collectives cost bytes over the cores the processes share (n
    processes on fewer cores get cores/n of one each), shaped links bytes over their rate.
    Candidates from the largest: 64 MB messages, then as many race repeats as fit."""
    groups, cores = sorted({2, max_processes}), machine.host_cores
    link = (link_mbit or LINK_MBIT_07) * 1e6 / 8  # bytes/s
    gradient, n = gradient_mb or 16, max_processes

    def loopback(n, mb, factor):  # seconds to move `factor` x mb MB over each of n links
        return factor * mb * 2**20 / (LOOPBACK_BUSBW_07 * min(1.0, cores / n))

    def sweep_s(mb):
        sizes = [4 * 16**k / 1024 for k in range(8) if 4 * 16**k / 1024 < mb] + [mb]
        one = sum(loopback(2, s, 1) + sum(loopback(n, s, 2 * (n - 1) / n) * 2 + loopback(n, s, 1)
                                           + loopback(n, s, 2 * (n - 1)) for n in groups)
                  for s in sizes[:-1])  # p2p; per n: ring, dist.all_reduce, shift, naive
        return (bench_repeats + 1) * (one + loopback(2, mb, 1) + sum(
            loopback(n, mb, 1) + loopback(n, mb, 2 * (n - 1)) for n in groups))

    def race_s(mb, repeats):
        return (repeats + 1) * sum((len(segment_counts) + 1) * loopback(n, mb, 2 * (n - 1) / n)
                                   for n in groups)

    def cluster_s(mb):  # shaped links: p2p, shift, ring, all_reduce at mb and 16 MB; the demos
        if not cluster:
            return 0.0
        shaped = (bench_repeats + 2) * (mb + 16) * 2**20 / link * (2 + 2 * 2 * (n - 1) / n)
        return shaped + sum(4 * 2 * max(num_workers / s, 1) * gradient * 2**20 / link
                            for s in demo_servers) + 4 * 2 * 2 * 4 * 2**20 / link

    def seconds_of(mb, repeats):
        return FIXED_S_07 + cluster_s(mb) + sweep_s(mb) + race_s(mb, repeats)

    # CPU processes on every machine, GPU or not: the CPU's budget, with headroom
    limit = budget('07', on_device(machine, torch.device('cpu'))) * 0.7
    candidates = [(mb, r) for mb in ([message_mb] if message_mb else [64, 32, 16])
                  for r in ([race_repeats] if race_repeats else [9, 7, 5, 3])]
    mb, repeats = largest_fitting(candidates, lambda c: seconds_of(*c), limit)
    values = {'message_mb': mb, 'race_repeats': repeats, 'link_mbit': link_mbit or LINK_MBIT_07,
              'gradient_mb': gradient}  # without a cluster, in-process emulation at that rate
    return Plan(values, seconds_of(mb, repeats),
                host_bytes=max_processes * (6 * mb * 2**20 + 400 * 2**20))


def _cluster_here(cluster, use_cluster, link_delay_ms, hosts_needed):
    """(cluster_ok, why, delay_ok, delay_why): whether emulated hosts, and delayed links, can
    run here; a ValueError where a parameter asks for what cannot."""
    if use_cluster is False:
        cluster_ok, why = False, 'use_cluster=False'
    else:
        cluster_ok, why = cluster.available()
    if use_cluster and not cluster_ok:
        raise ValueError(f'use_cluster=True, but no emulated cluster can run here: {why}')
    if cluster_ok and hosts_needed > cluster.MAX_HOSTS:
        raise ValueError(f'max_processes, num_workers + max(demo_servers) need {hosts_needed} '
                         f'hosts; an emulated cluster has at most {cluster.MAX_HOSTS}')
    delay_ok, delay_why = cluster.delay_available() if cluster_ok else (False, why)
    if link_delay_ms and cluster_ok and not delay_ok:
        raise ValueError(f'link_delay_ms={link_delay_ms}, but {delay_why}: pass link_delay_ms=0')
    return cluster_ok, why, delay_ok, delay_why


def setup(cluster, **given):
    """Every parameter checked (a ValueError naming it, before any work), then whether
    emulated hosts can run here, the machine probed and the sizes planned. `cluster` is the
    notebook's cluster module, passed in so that this module imports it only there."""
    parameters.check_torch(*MIN_TORCH)
    v = parameters.check(PARAMETERS, given)
    if v['link_delay_ms'] is not None and v['link_delay_ms'] > 100:
        raise ValueError(f'link_delay_ms must be a number of milliseconds in [0, 100] or None, '
                         f'got {v["link_delay_ms"]!r}')
    v['demo_servers'] = sorted(set(v['demo_servers']))
    hosts_needed = max(v['max_processes'], v['num_workers'] + max(v['demo_servers']), 3)
    cluster_ok, cluster_why, delay_ok, delay_why = _cluster_here(
        cluster, v['use_cluster'], v['link_delay_ms'], hosts_needed)
    machine = probe()
    plan = plan_for(machine, v['max_processes'], cluster_ok, v['num_workers'], v['demo_servers'],
                    v['bench_repeats'], v['segment_counts'], v['message_mb'], v['race_repeats'],
                    v['link_mbit'], v['gradient_mb'])
    v.update(plan.values)
    if v['link_delay_ms'] is None:
        v['link_delay_ms'] = 1 if delay_ok else 0
    links = f'no emulated hosts: {cluster_why}'
    if cluster_ok:
        links = f'{hosts_needed} emulated hosts, {v["link_mbit"]} Mbit/s, {v["link_delay_ms"]} ms'
    chosen = ', '.join(f'{k}={value}' for k, value in plan.values.items())
    return Setup([f'Measured: {machine}.', f'chosen for this machine: {chosen}', links], **v,
                 machine=machine, plan=plan,
                 cores=os.cpu_count() or 1, group_sizes=sorted({2, v['max_processes']}),
                 cluster_ok=cluster_ok, cluster_why=cluster_why, hosts_needed=hosts_needed,
                 delay_ok=delay_ok, delay_why=delay_why)
