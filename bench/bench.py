#!/usr/bin/env python3
"""sbx benchmarks, each printed beside a yardstick measured in the same run.

  create   createSandbox + destroySandbox over the socket, p50/p99 over N,
           against `bwrap --unshare-all ... true` (bubblewrap) started N times
  exec     `exec true` through `sbx mcp` (stdio relay), p50/p99 over N,
           against plain fork+exec of /bin/true (posix_spawn + wait)
  parallel calls per second of `exec true` with C clients on C sessions
  transports  `exec true` and `ping` over stdio (sbx mcp), the socket and
           HTTP; the ping difference stdio - socket is what the relay adds
  clients  `exec true` latency and throughput with 1, 8 and 64 socket clients

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


def lat(f, n):
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        xs.append((time.perf_counter() - t0) * 1000)
    return xs


def bench_transports(env, n):
    import http.client
    import json as _json
    import socket as _socket
    s = _socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    # a second daemon with HTTP, on its own dirs
    henv = Env()
    d = subprocess.Popen([os.environ.get('SBX', 'build/sbx'), 'daemon', '--http', '127.0.0.1:%d' % port], env=henv.env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not os.path.exists(os.path.join(henv.runtime, 'sbx.pid')):
            time.sleep(0.01)
        token = open(os.path.join(henv.state, 'http-token')).read().strip()
        stdio = henv.mcp(['--sandbox', 'tr'])
        stdio.initialize()
        stdio.sh('true')
        sock = henv.socket_client()
        sock.initialize()
        conn = http.client.HTTPConnection('127.0.0.1', port)
        hdr = {'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json'}

        def http_call(body):
            conn.request('POST', '/mcp', body=_json.dumps(body), headers=hdr)
            r = conn.getresponse()
            r.read()
        exec_args = {'sandboxId': 'tr', 'command': 'true'}
        print('== transports (n=%d) ==' % n)
        rows = [
            ('ping, stdio (sbx mcp relay)', lat(lambda: stdio.request('ping'), n)),
            ('ping, socket', lat(lambda: sock.request('ping'), n)),
            ('ping, HTTP', lat(lambda: http_call({'jsonrpc': '2.0', 'id': 1, 'method': 'ping'}), n)),
            ('exec true, stdio', lat(lambda: stdio.ok('exec', exec_args), n)),
            ('exec true, socket', lat(lambda: sock.ok('exec', exec_args), n)),
            ('exec true, HTTP', lat(lambda: http_call({'jsonrpc': '2.0', 'id': 1, 'method': 'tools/call',
                                                      'params': {'name': 'exec', 'arguments': exec_args}}), n)),
        ]
        for name, xs in rows:
            print('%-34s p50 %7.3f ms  p99 %7.3f ms' % (name, pct(xs, 50), pct(xs, 99)))
        print('%-34s p50 %7.3f ms' % ('relay overhead (stdio - socket ping)', pct(rows[0][1], 50) - pct(rows[1][1], 50)))
        print()
        conn.close()
    finally:
        d.terminate()
        d.wait()
        henv.close()


def bench_clients(env, seconds):
    print('== exec true with 1, 8, 64 socket clients (16 sessions per sandbox), %.0f s each ==' % seconds)
    for k in (1, 8, 64):
        cs = []
        for i in range(k):
            c = env.socket_client()
            c.initialize()
            c.ok('createSession', {'sandboxId': 'cl%d-%d' % (k, i // 16), 'id': 's%d' % i})
            cs.append(c)
        lats = [[] for _ in range(k)]
        stop = time.monotonic() + seconds

        def work(i):
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                cs[i].ok('exec', {'sandboxId': 'cl%d-%d' % (k, i // 16), 'command': 'true', 'sessionId': 's%d' % i},
                         timeout=60)
                lats[i].append((time.perf_counter() - t0) * 1000)
        ths = [threading.Thread(target=work, args=(i,)) for i in range(k)]
        t0 = time.monotonic()
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        el = time.monotonic() - t0
        allx = [v for l in lats for v in l]
        print('%2d clients: %6.0f calls/s   p50 %7.2f ms  p99 %7.2f ms' % (k, len(allx) / el, pct(allx, 50), pct(allx, 99)))
        for c in cs:
            c.close()
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
        if a.what in ('transports', 'all'):
            bench_transports(env, a.n or 500)
        if a.what in ('clients', 'all'):
            bench_clients(env, 4)
    finally:
        env.close()


if __name__ == '__main__':
    main()
