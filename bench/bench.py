#!/usr/bin/env python3
"""sbx benchmarks, each printed beside a yardstick measured in the same run.

  create   createSandbox + destroySandbox over the socket, p50/p99 over N,
           against `bwrap --unshare-all ... true` (bubblewrap) started N times
  exec     `exec true` through `sbx mcp` (stdio relay), p50/p99 over N,
           against plain fork+exec of /bin/true (posix_spawn + wait)
  parallel calls per second of `exec true` with C clients on C sessions

Usage: bench/bench.py [create|exec|parallel|all] [--n N]. Needs root, a built
build/sbx and bubblewrap (scripts/bootstrap installs it)."""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'tests', 'lib'))
from sbxtest import Env  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def report(name, ours, yard_name, yard):
    o50, o99, y50, y99 = pct(ours, 50), pct(ours, 99), pct(yard, 50), pct(yard, 99)
    print('%-34s p50 %7.2f ms  p99 %7.2f ms' % (name, o50, o99))
    print('%-34s p50 %7.2f ms  p99 %7.2f ms' % (yard_name, y50, y99))
    print('%-34s p50 %7.2fx    p99 %7.2fx' % ('ratio (sbx / yardstick)', o50 / y50, o99 / y99))
    print()


def spawn_wait(argv):
    t0 = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, os.environ)
    os.waitpid(pid, 0)
    return (time.perf_counter() - t0) * 1000


def bench_create(env, n):
    c = env.socket_client()
    c.initialize()
    c.ok('createSandbox', {'sandboxId': 'warm'})  # daemon warm; not timed
    ours, destroy = [], []
    for i in range(n):
        t0 = time.perf_counter()
        c.ok('createSandbox', {'sandboxId': 'b%d' % i})
        t1 = time.perf_counter()
        c.ok('destroySandbox', {'sandboxId': 'b%d' % i})
        t2 = time.perf_counter()
        ours.append((t1 - t0) * 1000)
        destroy.append((t2 - t0) * 1000)
    bwrap = shutil.which('bwrap')
    argv = [bwrap, '--unshare-all', '--proc', '/proc', '--dev', '/dev', '--ro-bind', '/usr', '/usr',
            '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64', '--symlink', 'usr/bin', '/bin',
            '--tmpfs', '/tmp', '/usr/bin/true']
    yard = [spawn_wait(argv) for _ in range(n)]
    print('== sandbox create (n=%d) ==' % n)
    report('sbx createSandbox', ours, 'bwrap --unshare-all ... true', yard)
    report('sbx createSandbox + destroySandbox', destroy, 'bwrap --unshare-all ... true', yard)


def bench_exec(env, n):
    c = env.mcp(['--sandbox', 'bench'])
    c.initialize()
    c.sh('true')  # sandbox exists; not timed
    ours = []
    for _ in range(n):
        t0 = time.perf_counter()
        c.sh('true')
        ours.append((time.perf_counter() - t0) * 1000)
    yard = [spawn_wait(['/bin/true']) for _ in range(n)]
    print('== exec true round trip through sbx mcp (n=%d) ==' % n)
    report('sbx mcp: tools/call exec true', ours, 'fork+exec /bin/true', yard)


def bench_parallel(env, clients, seconds):
    cs = []
    for i in range(clients):
        c = env.socket_client()
        c.initialize()
        c.ok('createSession', {'sandboxId': 'par', 'id': 's%d' % i})
        cs.append(c)
    counts = [0] * clients
    stop = time.monotonic() + seconds

    def work(i):
        while time.monotonic() < stop:
            cs[i].ok('exec', {'sandboxId': 'par', 'command': 'true', 'sessionId': 's%d' % i})
            counts[i] += 1
    ths = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
    t0 = time.monotonic()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    el = time.monotonic() - t0
    total = sum(counts)
    t1 = time.monotonic()
    k = 0
    while time.monotonic() - t1 < seconds:
        spawn_wait(['/bin/true'])
        k += 1
    print('== %d clients on %d sessions, %.0f s ==' % (clients, clients, seconds))
    print('%-34s %8.0f calls/s' % ('sbx exec true', total / el))
    print('%-34s %8.0f /s' % ('fork+exec /bin/true, one at a time', k / (time.monotonic() - t1)))
    print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('what', nargs='?', default='all')
    ap.add_argument('--n', type=int, default=0)
    a = ap.parse_args()
    env = Env()
    try:
        print('sbx benchmarks on %d cores, kernel %s' % (os.cpu_count(), os.uname().release))
        print()
        if a.what in ('create', 'all'):
            bench_create(env, a.n or 200)
        if a.what in ('exec', 'all'):
            bench_exec(env, a.n or 1000)
        if a.what in ('parallel', 'all'):
            bench_parallel(env, 8, 5)
    finally:
        env.close()


if __name__ == '__main__':
    main()
