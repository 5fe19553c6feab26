"""Notebook 07: its parameters checked, and its work sized for the machine that runs it."""
import os

import torch

import helpers
from hardware import on_device, probe
from sizing import Plan, Setup, budget, largest_fitting

# ------------------------------------------------------------------------------- notebook 07
# Notebook 07 runs CPU processes that talk gloo on every machine, GPU or not, so its plan sizes
# only messages, repeats and demo lengths, to the CPU budget. Rates measured on a 2-core machine:
LOOPBACK_BUSBW_07 = 0.8e9   # ring or dist.all_reduce bus bandwidth over loopback, a core each
FIXED_S_07 = 30             # kernel, imports, the first forked process, small runs, plots,
                            # the restart from a checkpoint
LINK_MBIT_07 = 2000         # emulated links: a 64 MB ring over 4 hosts in about half a second,
                            # slow enough to stay network-bound when 2 cores serve every host


def plan_for(machine, max_processes=4, cluster=False, num_workers=2, demo_servers=(1, 2, 4),
            bench_repeats=3, segment_counts=(1, 2, 4, 8, 16), message_mb=None,
            race_repeats=None, link_mbit=None, gradient_mb=None):
    """Notebook 07: the largest message, the repeats of the ring-against-dist.all_reduce race,
    and, where an emulated cluster runs, the link rate and the bottleneck demo's gradient size.

    Loopback collectives cost bytes over the processes' shared cores (each of n processes gets
    cores/n of one core when n exceeds the cores); shaped links cost bytes over the link rate
    tc is told. The largest message is the issue's 64 MB wherever it fits; the race gets as
    many repeats as fit (at least 3), since its median decides the recorded ratio."""
    groups = sorted({2, max_processes})
    cores = machine.host_cores

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

    rate = link_mbit or LINK_MBIT_07
    link = rate * 1e6 / 8  # bytes/s
    gradient = gradient_mb or 16
    n = max_processes

    def cluster_s(mb):  # shaped links: p2p, shift, ring, all_reduce at mb and 16 MB; the demos
        if not cluster:
            return 0.0
        shaped = (bench_repeats + 2) * (mb + 16) * 2**20 / link * (2 + 2 * 2 * (n - 1) / n)
        return shaped + sum(4 * 2 * max(num_workers / s, 1) * gradient * 2**20 / link
                            for s in demo_servers) + 4 * 2 * 2 * 4 * 2**20 / link

    def seconds_of(mb, repeats):
        return FIXED_S_07 + cluster_s(mb) + sweep_s(mb) + race_s(mb, repeats)

    # CPU processes on every machine, GPU or not: the CPU's budget (and headroom)
    limit = budget('07', on_device(machine, torch.device('cpu'))) * 0.7
    candidates = [(mb, r) for mb in ([message_mb] if message_mb else [64, 32, 16])
                  for r in ([race_repeats] if race_repeats else [9, 7, 5, 3])]
    mb, repeats = largest_fitting(candidates, lambda c: seconds_of(*c), limit)
    seconds = seconds_of(mb, repeats)
    why = (f'{mb} MB messages and {repeats} race repeats fit {limit:.0f} s on {cores} '
           f'core{"s" if cores != 1 else ""} '
           f'(loopback collectives at about {LOOPBACK_BUSBW_07 / 1e9:.1f} GB/s of bus bandwidth '
           f'per core)' if seconds <= limit else
           f'even {mb} MB messages and {repeats} race repeats need about {seconds:.0f} s here, '
           f'more than the {limit:.0f} s planned: this machine is slow or busy')
    if cluster:
        why += (f'; emulated links of {rate} Mbit/s (a {mb} MB ring over {n} hosts in about '
                f'{2 * (n - 1) / n * mb * 2**20 / link:.1f} s) '
                f'and {gradient} MB gradients in the bottleneck demo')
    if mb < 64:
        why += '; message_mb=64 measures at the issue\'s full 64 MB'
    why += '. Processes talk gloo on CPUs on every machine, GPUs or not: the same plan for all.'
    values = {'message_mb': mb, 'race_repeats': repeats, 'link_mbit': rate,
              'gradient_mb': gradient}  # without a cluster, in-process emulation at that rate
    return Plan(values, seconds, host_bytes=max_processes * (6 * mb * 2**20 + 400 * 2**20),
                why=why)


def setup(*, max_processes=4, message_mb=None, bench_repeats=3, race_repeats=None,
             segment_counts=(1, 2, 4, 8, 16), num_workers=2, num_servers=2,
             demo_servers=(1, 2, 4), gradient_mb=None, straggler_ms=20, use_cluster=None,
             link_mbit=None, link_delay_ms=None, worker_timeout=180, results_dir=None,
             cluster=None):
    """Notebook 07's setup: every parameter checked (a ValueError naming it, before any work),
    then whether emulated hosts can run here, the machine probed and the sizes planned
    (plan_07). `cluster` is the notebook's cluster module (emulated hosts), passed in so that
    this module imports no course module only notebook 07 needs."""
    helpers.check_int('max_processes', max_processes, minimum=2)
    helpers.check_int('message_mb', message_mb, allow_none=True)
    helpers.check_int('bench_repeats', bench_repeats)
    helpers.check_int('race_repeats', race_repeats, allow_none=True)
    segment_counts = helpers.check_list('segment_counts', segment_counts, helpers.check_int)
    helpers.check_int('num_workers', num_workers)
    helpers.check_int('num_servers', num_servers)
    demo_servers = sorted(set(helpers.check_list('demo_servers', demo_servers,
                                                 helpers.check_int)))
    if not demo_servers:
        raise ValueError('demo_servers is empty: give at least one server count, e.g. [1, 2, 4]')
    helpers.check_int('gradient_mb', gradient_mb, allow_none=True)
    helpers.check_int('straggler_ms', straggler_ms, minimum=0)
    helpers.check_choice('use_cluster', use_cluster, (None, True, False))
    if link_mbit is not None:
        helpers.check_positive('link_mbit', link_mbit)
    if link_delay_ms is not None and (isinstance(link_delay_ms, bool) or not isinstance(
            link_delay_ms, (int, float)) or not 0 <= link_delay_ms <= 100):
        raise ValueError(f'link_delay_ms must be a number of milliseconds in [0, 100] or None, '
                         f'got {link_delay_ms!r}')
    helpers.check_int('worker_timeout', worker_timeout)
    if cluster is None:
        raise ValueError('cluster must be the cluster module (import cluster)')
    # Emulated hosts need Linux and root; otherwise the demos emulate slow links in-process.
    if use_cluster is False:
        cluster_ok, cluster_why = False, 'use_cluster=False'
    else:
        cluster_ok, cluster_why = cluster.available()
    if use_cluster and not cluster_ok:
        raise ValueError(f'use_cluster=True, but no emulated cluster can run here: {cluster_why}')
    hosts_needed = max(max_processes, num_workers + max(demo_servers), 3)
    if cluster_ok and hosts_needed > cluster.MAX_HOSTS:
        raise ValueError(f'max_processes, num_workers + max(demo_servers) need {hosts_needed} '
                         f'hosts; an emulated cluster has at most {cluster.MAX_HOSTS}')
    delay_ok, delay_why = cluster.delay_available() if cluster_ok else (False, cluster_why)
    if link_delay_ms and cluster_ok and not delay_ok:
        raise ValueError(f'link_delay_ms={link_delay_ms}, but {delay_why}: pass link_delay_ms=0')
    machine = probe()
    plan = plan_for(machine, max_processes, cluster_ok, num_workers, demo_servers, bench_repeats,
                   segment_counts, message_mb, race_repeats, link_mbit, gradient_mb)
    if link_delay_ms is None:
        link_delay_ms = 1 if delay_ok else 0
    cores = os.cpu_count() or 1
    why = [f'Measured: {machine}.', str(plan)]
    if cluster_ok:
        why.append(f'Emulated cluster: up to {hosts_needed} hosts, links of {plan["link_mbit"]} '
                   f'Mbit/s and {link_delay_ms} ms added delay'
                   + (f' ({delay_why}).' if not delay_ok else '.'))
    else:
        why.append(f'No emulated cluster ({cluster_why}): slow links are emulated inside the '
                   'processes.')
    return Setup(why, machine=machine, plan=plan, cores=cores, max_processes=max_processes,
                 group_sizes=sorted({2, max_processes}), message_mb=plan['message_mb'],
                 bench_repeats=bench_repeats, race_repeats=plan['race_repeats'],
                 segment_counts=segment_counts, num_workers=num_workers,
                 num_servers=num_servers, demo_servers=demo_servers,
                 gradient_mb=plan['gradient_mb'], straggler_ms=straggler_ms,
                 cluster_ok=cluster_ok, cluster_why=cluster_why, hosts_needed=hosts_needed,
                 link_mbit=plan['link_mbit'], link_delay_ms=link_delay_ms, delay_ok=delay_ok,
                 delay_why=delay_why, worker_timeout=worker_timeout, results_dir=results_dir)
