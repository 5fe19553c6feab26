"""Several emulated hosts on one Linux machine: network namespaces behind one switch, with links
that `tc` limits in bandwidth (and, where the kernel has netem, delays).

    with Cluster(4, rate_mbit=200) as c:        # 4 hosts, 10.12.0.1 ... 10.12.0.4
        results = run_workers(c, fn, 4)         # rank r runs on host r, talking over its link
        proc = c.run(1, ['python', 'train.py'])   # any command, on host 1
        c.measure_link(0, 1)                    # what the link really carries, and its latency

Each host is a network namespace with one interface, eth0, plugged into a port of a switch (a
Linux bridge in a namespace of its own). A host's link carries at most `rate_mbit` in each
direction: a token bucket (tc tbf) on the host's side shapes what it sends, another on the switch
port shapes what it receives, so many hosts sending to one share that one host's downlink, as on
a real switch. A link that rested passes its first `burst_bytes` (the bucket: 2 ms of traffic)
at full speed, so a fit of time = latency + bytes / rate over large transfers finds an intercept
about burst_bytes / rate too low: measure latency with small messages. `delay_ms` holds every
packet that long on its way into a host (tc netem on the switch port): host-to-host latency is
delay_ms one way, 2 * delay_ms round trip.

Addresses exist only on these links (10.12.0.0/24, no default route, nothing in the machine's own
namespace), so the emulated hosts reach each other and nothing else. Names carry the owner's
process id (d2l-<pid>-<n>-h0, ...), so two runs never collide, and everything is removed on
close(), at the end of a `with` block, at interpreter exit and on SIGTERM/SIGHUP; what a killed
owner left behind is removed by remove_leftovers(), which every new Cluster calls first.

Needs Linux and root (CAP_NET_ADMIN and CAP_SYS_ADMIN): available() says whether, and why not.
"""
import atexit
import functools
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import namedtuple

import helpers
import launch

Host = namedtuple('Host', 'name address interface')  # network namespace, IPv4 address, NIC

SUBNET = '10.12.0'      # host i is 10.12.0.<i+1>/24, on the emulated links only
INTERFACE = 'eth0'      # each host's one network interface (inside its own namespace)
MAX_HOSTS = 64
_NAME = re.compile(r'^d2l-(\d+)-(\d+)-(sw|h\d+)$')   # d2l-<owner pid>-<serial>-<host or switch>

_open = []               # clusters this process has open, closed at exit
_serial = iter(range(1, 1 << 30))
_lock = threading.RLock()   # also taken by close() when a signal interrupts _track


# ----------------------------------------------------------------- commands
def _run(argv, check=True, timeout=20):
    """Run an iproute2 command; on failure raise a RuntimeError that quotes it."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f'`{" ".join(argv)}` failed: {done.stderr.strip() or done.returncode}')
    return done


def _namespaces():
    """Names of every network namespace `ip netns` knows."""
    out = _run(['ip', 'netns', 'list'], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _pids_in(netns):
    """Process ids living in network namespace `netns`."""
    out = _run(['ip', 'netns', 'pids', netns], check=False).stdout
    return [int(p) for p in out.split()]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_everything_in(namespaces, grace=0.0):
    """SIGTERM (if grace > 0, then wait up to `grace` seconds) and SIGKILL every process in
    these namespaces, until none is left."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        if sig == signal.SIGTERM and grace <= 0:
            continue
        deadline = time.monotonic() + wait
        while True:
            pids = [p for ns in namespaces for p in _pids_in(ns)]
            if not pids or time.monotonic() > deadline:
                break
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
    left = [p for ns in namespaces for p in _pids_in(ns)]
    if left:
        raise RuntimeError(f'processes {left} survived SIGKILL in {namespaces}')


def _delete_namespaces(namespaces):
    """Kill what runs in them, then delete them: their links and qdiscs go with them."""
    existing = set(_namespaces())
    namespaces = [ns for ns in namespaces if ns in existing]
    _kill_everything_in(namespaces)
    for ns in namespaces:
        _run(['ip', 'netns', 'delete', ns], check=False)
    left = set(namespaces) & set(_namespaces())
    if left:
        raise RuntimeError(f'could not delete network namespaces {sorted(left)}')


# -------------------------------------------------------------- availability
def _probe():
    """Try, in a throwaway namespace, what a cluster needs: veth links and tbf; and netem."""
    ns = f'd2l-{os.getpid()}-0-sw'
    try:
        _run(['ip', 'netns', 'add', ns])
        _run(['ip', '-n', ns, 'link', 'add', 'name', 'v0', 'type', 'veth', 'peer', 'name', 'v1'])
        _run(['tc', '-n', ns, 'qdisc', 'add', 'dev', 'v0', 'root', 'tbf', 'rate', '100mbit',
              'burst', '32kb', 'limit', '64kb'])
        netem = _run(['tc', '-n', ns, 'qdisc', 'add', 'dev', 'v1', 'root', 'netem', 'delay',
                      '1ms'], check=False)
        return None, (netem.returncode == 0, netem.stderr.strip())
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        return str(e), (False, 'no cluster')
    finally:
        _delete_namespaces([ns])


@functools.cache
def _capabilities():
    if not sys.platform.startswith('linux'):
        return f'needs Linux network namespaces; this is {sys.platform}', (False, '')
    if os.geteuid() != 0:
        return (f'needs root to create network namespaces (running as uid {os.geteuid()})',
                (False, ''))
    missing = [tool for tool in ('ip', 'tc') if shutil.which(tool) is None]
    if missing:
        return f'needs iproute2 ({" and ".join(missing)} not found)', (False, '')
    return _probe()


def available():
    """(True, what works) if this process can build an emulated cluster, else (False, why not)."""
    error, (netem, _) = _capabilities()
    if error:
        return False, error
    return True, ('network namespaces, veth links and tc rate limits work here; link delay '
                  + ('works (netem)' if netem else 'does not: this kernel has no netem qdisc'))


def delay_available():
    """(True, '') if links can be delayed (the kernel has tc's netem qdisc), else (False, why)."""
    ok, reason = available()
    if not ok:
        return False, reason
    netem, error = _capabilities()[1]
    return (True, '') if netem else (
        False, f'this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM): `tc` says "{error}"')


# ------------------------------------------------------------------ leftovers
def leftovers():
    """Namespaces this module made whose owner process is gone (killed before it could clean)."""
    return [ns for ns in _namespaces()
            if (m := _NAME.match(ns)) and not _alive(int(m.group(1)))]


def remove_leftovers():
    """Remove what dead owners left: their processes, namespaces, links and qdiscs. Returns the
    names of the namespaces removed. Clusters of live owners are left alone."""
    found = leftovers()
    _delete_namespaces(found)
    return found


def _close_all():
    for cluster in list(_open):
        cluster.close()


def _exit_on_signal(signum, frame):
    raise SystemExit(128 + signum)  # unwinds `with` blocks; atexit closes the rest


def _track(cluster):
    """Close `cluster` at exit, and while any cluster is open, turn SIGTERM and SIGHUP (where
    nobody else handles them) into a clean exit instead of sudden death."""
    with _lock:
        if not _open:
            _register_atexit()
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGTERM, signal.SIGHUP):
                    if signal.getsignal(sig) == signal.SIG_DFL:
                        signal.signal(sig, _exit_on_signal)
        _open.append(cluster)


def _untrack(cluster):
    with _lock:
        if cluster in _open:
            _open.remove(cluster)
        if not _open and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                if signal.getsignal(sig) is _exit_on_signal:
                    signal.signal(sig, signal.SIG_DFL)


@functools.cache
def _register_atexit():
    atexit.register(_close_all)


# -------------------------------------------------------------------- cluster
class Cluster:
    """`num_hosts` emulated hosts behind one switch; each link shaped to `rate_mbit` (None: as
    fast as the machine goes) and `delay_ms` one way (None or 0: no added delay).

    Use it as a context manager, or call close(): either way everything it made is removed."""

    def __init__(self, num_hosts, rate_mbit=None, delay_ms=None):
        helpers.check_int('num_hosts', num_hosts)
        if num_hosts > MAX_HOSTS:
            raise ValueError(f'num_hosts must be at most {MAX_HOSTS}, got {num_hosts}')
        if rate_mbit is not None:
            helpers.check_positive('rate_mbit', rate_mbit)
        if delay_ms is not None and not (
                isinstance(delay_ms, (int, float)) and not isinstance(delay_ms, bool)
                and 0 <= delay_ms <= 10_000):
            raise ValueError(f'delay_ms must be a number of milliseconds in [0, 10000] or None, '
                             f'got {delay_ms!r}')
        ok, reason = available()
        if not ok:
            raise RuntimeError(f'cannot build an emulated cluster: {reason}')
        if delay_ms:
            delay_ok, why = delay_available()
            if not delay_ok:
                raise RuntimeError(f'delay_ms={delay_ms} asked for, but {why}; links can still '
                                   f'be rate-limited: pass delay_ms=None')
        self.rate_mbit, self.delay_ms = rate_mbit, delay_ms or None
        # The token bucket: 2 ms of traffic (at least 32 KiB), so that a late timer in a busy
        # (virtual) machine costs no throughput. A link that rested passes its first
        # burst_bytes at full speed: a transfer of n > burst_bytes bytes takes
        # (n - burst_bytes) / rate, plus the latency.
        self.burst_bytes = (max(32 * 1024, int(rate_mbit * 1e6 / 8 * 0.002))
                            if rate_mbit else None)
        self.owner = os.getpid()
        with _lock:
            serial = next(_serial)
        prefix = f'd2l-{self.owner}-{serial}'
        self.switch = f'{prefix}-sw'
        self.hosts = [Host(f'{prefix}-h{i}', f'{SUBNET}.{i + 1}', INTERFACE)
                      for i in range(num_hosts)]
        self._procs = []
        self._closed = False
        remove_leftovers()
        _track(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------- build
    def _build(self):
        sw = self.switch
        _run(['ip', 'netns', 'add', sw])
        _run(['ip', '-n', sw, 'link', 'add', 'br0', 'type', 'bridge'])
        _run(['ip', '-n', sw, 'link', 'set', 'br0', 'up'])
        for i, host in enumerate(self.hosts):
            port = f'p{i}'   # the switch's port for host i
            _run(['ip', 'netns', 'add', host.name])
            # Both ends are made inside their namespaces: nothing appears in the machine's own.
            _run(['ip', 'link', 'add', 'name', host.interface, 'netns', host.name, 'type', 'veth',
                  'peer', 'name', port, 'netns', sw])
            _run(['ip', '-n', sw, 'link', 'set', port, 'master', 'br0', 'up'])
            _run(['ip', '-n', host.name, 'addr', 'add', f'{host.address}/24', 'dev',
                  host.interface])
            _run(['ip', '-n', host.name, 'link', 'set', host.interface, 'up'])
            _run(['ip', '-n', host.name, 'link', 'set', 'lo', 'up'])
            self._shape(host.name, host.interface, self._tbf())           # what it sends
            self._shape(sw, port, self._tbf(), delay=True)                  # what it receives

    def _tbf(self):
        """tbf arguments for rate_mbit: a bucket of burst_bytes and a queue of 20 ms plus two
        delays (what TCP needs to keep the link busy; beyond it tbf drops, as a switch would)."""
        if self.rate_mbit is None:
            return None
        bytes_per_s = self.rate_mbit * 1e6 / 8
        limit = self.burst_bytes + int(bytes_per_s * (0.02 + 2 * (self.delay_ms or 0) / 1000))
        return ['tbf', 'rate', f'{self.rate_mbit * 1000:.0f}kbit', 'burst',
                str(self.burst_bytes), 'limit', str(limit)]

    def _shape(self, netns, dev, tbf, delay=False):
        tc = ['tc', '-n', netns, 'qdisc', 'add', 'dev', dev]
        if delay and self.delay_ms:
            # netem holds each packet delay_ms, then hands it to the rate limiter below it.
            in_flight = math.ceil((self.rate_mbit or 10_000) * 1e6 / 8 * self.delay_ms / 1e3
                                  / 1500)
            _run([*tc, 'root', 'handle', '1:', 'netem', 'delay', f'{self.delay_ms}ms', 'limit',
                  str(max(1000, 2 * in_flight))])
            if tbf:
                _run([*tc, 'parent', '1:1', 'handle', '10:', *tbf])
        elif tbf:
            _run([*tc, 'root', *tbf])

    # ------------------------------------------------------------------- use
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f'<Cluster {self.describe()}>'

    def describe(self):
        """One line: the hosts, their addresses and what their links were told."""
        rate = f'{self.rate_mbit:g} Mbit/s' if self.rate_mbit else 'unlimited bandwidth'
        delay = f', {self.delay_ms:g} ms one way' if self.delay_ms else ', no added delay'
        first, last = self.hosts[0].address, self.hosts[-1].address
        span = first if len(self.hosts) == 1 else f'{first}-{last.rsplit(".", 1)[1]}'
        return f'{len(self.hosts)} emulated hosts ({span}) behind one switch; links {rate}{delay}'

    def _check_open(self, host_index=None):
        if self._closed:
            raise RuntimeError('this cluster is closed')
        if host_index is not None:
            helpers.check_int('host_index', host_index, minimum=0)
            if host_index >= len(self.hosts):
                raise ValueError(f'host_index must be below {len(self.hosts)}, got {host_index}')

    def run(self, host_index, argv, env=None, **popen_kwargs):
        """Start `argv` on host `host_index` (`ip netns exec`); returns its subprocess.Popen.
        `env`: variables added to this process's environment. close() stops whatever is left."""
        self._check_open(host_index)
        env = {**os.environ, **{k: str(v) for k, v in (env or {}).items()}}
        proc = subprocess.Popen(['ip', 'netns', 'exec', self.hosts[host_index].name, *argv],
                                env=env, **popen_kwargs)
        self._procs.append(proc)
        return proc

    def pids(self, host_index):
        """Process ids running on host `host_index` (also those that joined it by setns)."""
        self._check_open(host_index)
        return _pids_in(self.hosts[host_index].name)

    def kill_host(self, host_index):
        """Crash host `host_index`: SIGKILL every process on it (the host stays, empty)."""
        self._check_open(host_index)
        _kill_everything_in([self.hosts[host_index].name])

    def torchrun(self, script, *script_args, nproc_per_node=1, port=29400, env=None,
                 **popen_kwargs):
        """Start one `torchrun --nnodes=<hosts>` per host, as on that many machines; returns
        their Popen objects. Host 0 serves the c10d rendezvous at its address:port."""
        self._check_open()
        helpers.check_int('nproc_per_node', nproc_per_node)
        helpers.check_int('port', port)
        return [self.run(i, self.torchrun_argv(i, script, *script_args,
                                               nproc_per_node=nproc_per_node, port=port),
                         env={'GLOO_SOCKET_IFNAME': host.interface,
                              'NCCL_SOCKET_IFNAME': host.interface, **(env or {})},
                         **popen_kwargs)
                for i, host in enumerate(self.hosts)]

    def torchrun_argv(self, host_index, script, *script_args, nproc_per_node=1, port=29400):
        """The torchrun command line for host `host_index` (what each of N machines would run).
        --local-addr: the host's own address, not what its hostname resolves to (the emulated
        hosts share the machine's hostname). Host 0 says it serves the rendezvous store
        (is_host=1), since its hostname does not resolve to the endpoint's address."""
        self._check_open(host_index)
        argv = [sys.executable, '-m', 'torch.distributed.run', f'--nnodes={len(self.hosts)}',
                f'--nproc-per-node={nproc_per_node}', '--rdzv-backend=c10d',
                f'--rdzv-endpoint={self.hosts[0].address}:{port}', f'--rdzv-id={self.switch}',
                f'--local-addr={self.hosts[host_index].address}']
        if host_index == 0:
            argv.append('--rdzv-conf=is_host=1')
        return [*argv, str(script), *map(str, script_args)]

    def measure_link(self, src=0, dst=1, nbytes=None, pings=21):
        """Measure the path from host `src` to host `dst`: the median round trip of a one-byte
        message and the throughput of one TCP stream sending `nbytes` (None: about 0.5 s at
        the rate tc was told). Returns {'rtt_s', 'latency_s' (one way), 'mbit_per_s', ...}."""
        self._check_open(src)
        self._check_open(dst)
        if src == dst:
            raise ValueError(f'src and dst must differ, got {src} and {dst}')
        if nbytes is None:
            nbytes = int((self.rate_mbit or 2000) * 1e6 / 8 * 0.5)
        helpers.check_int('nbytes', nbytes)
        return _measure_path(self.hosts[src], self.hosts[dst], nbytes, pings)

    # ----------------------------------------------------------------- close
    def close(self, grace=3.0):
        """Stop every process on the hosts (SIGTERM, then SIGKILL after `grace` seconds) and
        delete the namespaces, links and qdiscs. Safe to call more than once."""
        if self._closed or os.getpid() != self.owner:  # a forked child owns nothing
            return
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + grace
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        _delete_namespaces([h.name for h in self.hosts] + [self.switch])
        for proc in self._procs:
            proc.wait()  # reap: no zombies either
        self._closed = True
        _untrack(self)


def _measure_path(src, dst, nbytes, pings):
    """Ping-pong and stream between two hosts, from two threads of this process, each in its
    host's namespace (a thread may join a network namespace on its own)."""
    ready, result, errors = threading.Event(), {}, []

    def in_netns(name, body, *args):
        def target():
            try:
                launch.join_netns(name)
                body(*args)
            except BaseException as e:  # reported by the caller
                errors.append(e)
                ready.set()
        return threading.Thread(target=target, daemon=True)

    server = in_netns(dst.name, _serve_path, dst, nbytes, pings, result, ready)
    server.start()
    ready.wait(30)
    if not errors:
        client = in_netns(src.name, _send_path, dst, nbytes, pings, result)
        client.start()
        client.join(60)
    server.join(60)
    if errors:
        raise RuntimeError(f'measuring {src.address} -> {dst.address} failed: {errors[0]!r}')
    return {k: result[k] for k in ('rtt_s', 'latency_s', 'mbit_per_s', 'bytes', 'seconds')}


def _serve_path(dst, nbytes, pings, result, ready):
    """_measure_path's receiving end: echo `pings` bytes, take in nbytes, acknowledge."""
    with socket.create_server((dst.address, 0)) as server:
        server.settimeout(30)
        result['port'] = server.getsockname()[1]
        ready.set()
        conn, _ = server.accept()
    with conn:
        conn.settimeout(30)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(pings):
            conn.sendall(conn.recv(1))
        buf, got = bytearray(1 << 20), 0
        while got < nbytes:
            n = conn.recv_into(buf)
            if not n:
                raise ConnectionError('sender closed early')
            got += n
        conn.sendall(b'k')


def _send_path(dst, nbytes, pings, result):
    """_measure_path's sending end: time the pings' round trips, then the stream."""
    with socket.create_connection((dst.address, result['port']), timeout=30) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(pings):
            tik = time.perf_counter()
            conn.sendall(b'p')
            conn.recv(1)
            rtts.append(time.perf_counter() - tik)
        block, sent = b'\0' * (1 << 20), 0
        tik = time.perf_counter()
        while sent < nbytes:
            chunk = block[:nbytes - sent]
            conn.sendall(chunk)
            sent += len(chunk)
        conn.recv(1)  # the receiver has everything
        seconds = time.perf_counter() - tik
    rtt = sorted(rtts)[len(rtts) // 2]
    result.update(rtt_s=rtt, latency_s=rtt / 2, bytes=nbytes, seconds=seconds,
                  mbit_per_s=nbytes * 8 / seconds / 1e6)


def run_workers(cluster, fn, world_size, *args, timeout=120, ranks_per_host=1, on_progress=None,
                start_method=None, threads_per_rank=None):
    """launch.run_workers with rank r on host r // ranks_per_host: the ranks talk over the
    cluster's links (MASTER_ADDR is host 0's address, GLOO_SOCKET_IFNAME each rank's interface).
    Same results, errors, timeout, threads per rank and clean-up as launch.run_workers."""
    helpers.check_int('world_size', world_size)
    helpers.check_int('ranks_per_host', ranks_per_host)
    cluster._check_open()
    hosts_needed = -(-world_size // ranks_per_host)
    if hosts_needed > len(cluster.hosts):
        raise ValueError(f'world_size={world_size} at ranks_per_host={ranks_per_host} needs '
                         f'{hosts_needed} hosts; the cluster has {len(cluster.hosts)}')
    placement = [tuple(cluster.hosts[r // ranks_per_host]) for r in range(world_size)]
    return launch.run_workers(fn, world_size, *args, timeout=timeout, on_progress=on_progress,
                              placement=placement, start_method=start_method,
                              threads_per_rank=threads_per_rank)
