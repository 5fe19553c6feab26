"""Emulated hosts (network namespaces behind one switch, links shaped by tc): building, shaping and
removing them, gloo ranks and torchrun across hosts, a host killed mid-run, nothing left behind.

As root these tests run (nothing skipped); otherwise they skip saying why, except under CI=true,
where a missing cluster is a failure."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import cluster
import launch

NOTEBOOKS = Path(cluster.__file__).parent   # not conftest's: spawned workers import this file

TINY = ['--batch-size', '8', '--num-train', '16', '--num-test', '8', '--data-source', 'synthetic',
        '--width', '8']


# ------------------------------------------------------------------ what we own
def _namespaces_of_this_process():
    return [ns for ns in cluster._namespaces() if ns.startswith(f'd2l-{os.getpid()}-')]


def _root_links():
    """Interfaces in the machine's own namespace."""
    return sorted(json.loads(subprocess.run(['ip', '-j', 'link'], capture_output=True,
                                            text=True, check=True).stdout),
                  key=lambda link: link['ifindex'])


def _netns_id(name):
    return f'net:[{os.stat(f"/var/run/netns/{name}").st_ino}]'


def _processes_in(netns_ids):
    """Live processes (not zombies) whose network namespace is one of `netns_ids`, even if the
    namespace's name has been deleted."""
    found = []
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            if os.readlink(f'/proc/{pid}/ns/net') in netns_ids and not _zombie(pid):
                found.append(int(pid))
        except OSError:
            pass
    return found


def _zombie(pid):
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().rsplit(')', 1)[1].split()[0] == 'Z'
    except OSError:
        return True


def _children():
    """Our child processes, alive or zombie (a zombie means someone forgot to reap), except
    multiprocessing's resource tracker and fork server, which live until we exit."""
    kids = set()
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{pid}/stat') as f:
                parent = int(f.read().rsplit(')', 1)[1].split()[1])
            with open(f'/proc/{pid}/cmdline', 'rb') as f:
                cmdline = f.read()
        except OSError:
            continue
        if parent == os.getpid() and b'resource_tracker' not in cmdline and (
                b'forkserver' not in cmdline):
            kids.add(int(pid))
    return kids


def _eventually(condition, seconds=10):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def make_cluster():
    """Cluster(...) that remembers its namespaces; afterwards every test checks that no
    namespace, link or process of ours remains, whether the test passed or failed."""
    ok, why_not = cluster.available()
    if not ok:
        if os.environ.get('CI') == 'true':
            pytest.fail(f'CI runs the emulated-cluster tests, but: {why_not} (run CI as root)')
        pytest.skip(why_not)
    links, children, made = _root_links(), _children(), []
    handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)]

    def make(*args, **kwargs):
        c = cluster.Cluster(*args, **kwargs)
        made.append([_netns_id(n) for n in [c.switch, *(h.name for h in c.hosts)]])
        return c
    make.made = made
    yield make
    cluster._close_all()
    assert _namespaces_of_this_process() == []
    assert _root_links() == links
    assert _processes_in({i for ids in made for i in ids}) == []
    assert _children() <= children
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)] == handlers


# ---------------------------------------------------------- without root too
@pytest.mark.parametrize('kwargs, message', [
    ({'num_hosts': 0}, 'num_hosts must be an integer >= 1'),
    ({'num_hosts': 65}, 'num_hosts must be at most 64'),
    ({'num_hosts': 2, 'rate_mbit': 0}, 'rate_mbit must be a positive number'),
    ({'num_hosts': 2, 'rate_mbit': '100'}, 'rate_mbit must be a positive number'),
    ({'num_hosts': 2, 'delay_ms': -1}, 'delay_ms must be a number of milliseconds'),
])
def test_bad_input_is_refused_before_anything_is_made(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cluster.Cluster(**kwargs)
    assert _namespaces_of_this_process() == []  # (a notebook beside us may make its own)


def test_available_says_why_not(monkeypatch):
    try:
        monkeypatch.setattr(os, 'geteuid', lambda: 1000)
        cluster._capabilities.cache_clear()
        assert cluster.available() == (
            False, 'needs root to create network namespaces (running as uid 1000)')
        monkeypatch.setattr(sys, 'platform', 'darwin')
        cluster._capabilities.cache_clear()
        assert cluster.available() == (False, 'needs Linux network namespaces; this is darwin')
        with pytest.raises(RuntimeError, match='cannot build an emulated cluster: needs Linux'):
            cluster.Cluster(2)
    finally:
        monkeypatch.undo()
        cluster._capabilities.cache_clear()


# --------------------------------------------------------------- as root
def test_hosts_reach_each_other_and_nothing_else(make_cluster):
    c = make_cluster(3)
    pid = str(os.getpid())
    assert all(pid in name.split('-') for name in [c.switch, *(h.name for h in c.hosts)])
    assert sorted(_namespaces_of_this_process()) == sorted([c.switch, *(h.name for h in c.hosts)])
    assert [h.address for h in c.hosts] == ['10.12.0.1', '10.12.0.2', '10.12.0.3']
    for h in c.hosts:
        addrs = json.loads(subprocess.check_output(['ip', '-n', h.name, '-j', '-4', 'addr']))
        assert {(a['ifname'], i['local']) for a in addrs for i in a['addr_info']} == {
            ('lo', '127.0.0.1'), ('eth0', h.address)}
        routes = json.loads(subprocess.check_output(['ip', '-n', h.name, '-j', 'route']))
        assert [r['dst'] for r in routes] == ['10.12.0.0/24']  # no default route
    root_addrs = subprocess.check_output(['ip', '-4', 'addr'], text=True)
    assert '10.12.0.' not in root_addrs
    assert c.measure_link(0, 2, nbytes=1 << 20)['mbit_per_s'] > 0   # the switch connects them
    # ... and nothing else: the machine's own addresses are unreachable from a host.
    own = [i['local'] for a in json.loads(subprocess.check_output(['ip', '-j', '-4', 'addr']))
           for i in a['addr_info'] if i['local'] != '127.0.0.1']
    probe = c.run(1, [sys.executable, '-c', 'import socket, sys\nfor a in sys.argv[1:]:\n'
                      '    try:\n        socket.create_connection((a, 22), timeout=1)\n'
                      '    except OSError as e:\n        print(e.errno)', *own],
                  stdout=subprocess.PIPE, text=True)
    out, _ = probe.communicate(timeout=30)
    assert out.split() == ['101'] * len(own)  # ENETUNREACH: no route out of the cluster


def test_a_shaped_link_carries_the_rate_tc_was_told(make_cluster):
    rate = 200
    c = make_cluster(3, rate_mbit=rate)
    # TCP carries 1448 payload bytes in each 1514-byte frame that tbf counts.
    expected = rate * 1448 / 1514
    forward, backward = c.measure_link(0, 1), c.measure_link(1, 0)
    for m in (forward, backward):   # (a busy CPU can cost a few percent, never add any)
        assert 0.85 * expected < m['mbit_per_s'] < 1.03 * expected, m
        assert m['rtt_s'] < 0.005, m   # no delay asked for: a fraction of a millisecond
    # Two hosts sending to the third at once share its downlink, as on a real switch: without
    # the downlink's limit each would get the full rate of its own uplink, 2x in total.
    both = []
    senders = [threading.Thread(target=lambda s=s: both.append(c.measure_link(s, 2)))
               for s in (0, 1)]
    for t in senders:
        t.start()
    for t in senders:
        t.join()
    assert sum(m['mbit_per_s'] for m in both) < 1.3 * expected, both
    qdiscs = subprocess.check_output(['tc', '-n', c.switch, 'qdisc'], text=True)
    assert qdiscs.count('tbf') == 3 and f'rate {rate}Mbit' in qdiscs


def test_link_delay_is_netem_or_a_clear_refusal(make_cluster):
    delay_ok, why = cluster.delay_available()
    if not delay_ok:  # this kernel has no netem: say so, and build nothing
        with pytest.raises(RuntimeError, match='delay_ms=5 asked for, but this kernel has no'):
            make_cluster(2, delay_ms=5)
        assert _namespaces_of_this_process() == []
        return
    c = make_cluster(2, rate_mbit=200, delay_ms=5)
    m = c.measure_link(0, 1)
    assert 0.009 < m['rtt_s'] < 0.013, m   # 5 ms each way
    assert m['mbit_per_s'] > 0.8 * 200 * 1448 / 1514, m


def test_an_error_or_interrupt_inside_removes_everything(make_cluster):
    handled_by_default = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    for exc in (ValueError('boom'), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with make_cluster(2) as c:
                c.run(1, ['sleep', '600'])
                assert _eventually(lambda: len(c.pids(1)) == 1)
                # while a cluster is open, SIGTERM unwinds this block instead of killing us
                assert (signal.getsignal(signal.SIGTERM) is cluster._exit_on_signal) == (
                    handled_by_default)
                raise exc
        assert _namespaces_of_this_process() == []
    assert _processes_in({i for ids in make_cluster.made for i in ids}) == []


def test_a_failed_build_removes_what_it_made(make_cluster, monkeypatch):
    built = []

    def fail_on_second_host(self, netns, dev, tbf, delay=False):
        built.append(netns)
        if len(built) == 3:
            raise RuntimeError('tc refused')
    monkeypatch.setattr(cluster.Cluster, '_shape', fail_on_second_host)
    with pytest.raises(RuntimeError, match='tc refused'):
        make_cluster(2)
    assert _namespaces_of_this_process() == []


OWNER = """
import sys, time
sys.path.insert(0, sys.argv[1])
import cluster
c = cluster.Cluster(2)
c.run(1, ['sleep', '600'])
print(' '.join([c.switch, *(h.name for h in c.hosts)]), flush=True)
time.sleep(600)
"""


def test_a_terminated_owner_cleans_up_and_a_killed_ones_leftovers_are_removed(make_cluster):
    owners = [subprocess.Popen([sys.executable, '-c', OWNER, str(NOTEBOOKS)],
                               stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        names = [o.stdout.readline().split() for o in owners]
        ids = [[_netns_id(n) for n in ns] for ns in names]
        assert all(_eventually(lambda i=i: len(_processes_in(i)) == 1) for i in ids)  # sleep
        terminated, killed = owners
        terminated.send_signal(signal.SIGTERM)
        killed.kill()
        assert terminated.wait(30) == 128 + signal.SIGTERM and killed.wait(30) == -9
        left = set(cluster._namespaces())
        assert not left & set(names[0]) and _processes_in(ids[0]) == []   # cleaned at exit
        assert set(names[1]) <= left and len(_processes_in(ids[1])) == 1   # nobody cleaned
        assert set(names[1]) <= set(cluster.leftovers())
        assert set(names[1]) <= set(cluster.remove_leftovers())
        assert not set(names[1]) & set(cluster._namespaces()) and _processes_in(ids[1]) == []
    finally:
        for o in owners:
            o.kill()
            o.wait()
        cluster.remove_leftovers()


def where_am_i(rank, world_size):
    """A worker for run_workers: the namespace and settings it ran with, and an all_reduce."""
    launch.init_distributed(timeout=30)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return {'netns': os.readlink('/proc/self/ns/net'), 'sum': t.item(),
            **{k: os.environ[k] for k in ('MASTER_ADDR', 'GLOO_SOCKET_IFNAME', 'LOCAL_RANK',
                                          'LOCAL_WORLD_SIZE')}}


def _rx_bytes(netns, dev):
    link, = json.loads(subprocess.check_output(['ip', '-n', netns, '-j', '-s', 'link', 'show',
                                                dev]))
    return link['stats64']['rx']['bytes']


def test_gloo_ranks_run_on_their_hosts_and_talk_over_the_links(make_cluster):
    c = make_cluster(2, rate_mbit=1000)
    before = _rx_bytes(c.switch, 'p1')   # what host 1 sent into the switch
    results = cluster.run_workers(c, where_am_i, 3, ranks_per_host=2, timeout=60,
                                  start_method='forkserver')   # a second or two faster
    host = [_netns_id(h.name) for h in c.hosts]
    assert [r['netns'] for r in results] == [host[0], host[0], host[1]]
    assert [(r['LOCAL_RANK'], r['LOCAL_WORLD_SIZE']) for r in results] == [
        ('0', '2'), ('1', '2'), ('0', '1')]
    assert {r['MASTER_ADDR'] for r in results} == {'10.12.0.1'}
    assert {r['GLOO_SOCKET_IFNAME'] for r in results} == {'eth0'}
    assert [r['sum'] for r in results] == [6.0] * 3
    assert _rx_bytes(c.switch, 'p1') > before   # rank 2 reached the others through its link
    with pytest.raises(ValueError, match='needs 3 hosts; the cluster has 2'):
        cluster.run_workers(c, where_am_i, 5, ranks_per_host=2)


def _collect(proc, lines):
    for line in proc.stdout:
        lines.append(line)


def test_torchrun_across_two_hosts_ends_with_identical_parameters(make_cluster):
    c = make_cluster(2, rate_mbit=1000)
    tik = time.perf_counter()
    procs = c.torchrun(NOTEBOOKS / 'ddp_train.py', *TINY, '--timeout', '30', nproc_per_node=2,
                       cwd=NOTEBOOKS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outs = [p.communicate(timeout=120) for p in procs]
    print(f'torchrun on 2 hosts x 2 processes: {time.perf_counter() - tik:.1f} s')
    assert [p.returncode for p in procs] == [0, 0], [err[-3000:] for _, err in outs]
    result = json.loads(outs[0][0][outs[0][0].index('{\n'):])   # rank 0's, on host 0
    assert result['world_size'] == 4 and result['steps'] == 2
    assert result['max_param_diff'] == 0   # all four ranks hold rank 0's parameters exactly
    assert '"rank"' not in outs[1][0]      # ranks 2 and 3 ran on host 1 and print nothing


def test_a_host_killed_mid_run_stops_the_other_with_an_error(make_cluster):
    timeout = 10   # seconds a collective waits before it gives up
    c = make_cluster(2, rate_mbit=1000)
    procs = c.torchrun(NOTEBOOKS / 'ddp_train.py', *TINY, '--epochs', '1000', '--timeout',
                       str(timeout), nproc_per_node=1, cwd=NOTEBOOKS, stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)   # one process a host: faster
    lines = []
    reader = threading.Thread(target=_collect, args=(procs[0], lines), daemon=True)
    reader.start()
    deadline = time.monotonic() + 90
    while not any('"progress"' in line for line in lines):   # rank 0 finished an epoch
        assert procs[0].poll() is None and time.monotonic() < deadline, lines[-5:]
        time.sleep(0.1)
    assert len(c.pids(1)) == 2   # host 1 runs its torchrun and its worker
    tik = time.monotonic()
    c.kill_host(1)
    returncode = procs[0].wait(timeout=timeout + 30)
    took = time.monotonic() - tik
    print(f'host 0 gave up {took:.1f} s after host 1 died')
    assert returncode != 0 and took < timeout + 10
    assert c.pids(0) == [] and c.pids(1) == []   # nothing left running on either host
    reader.join(5)
