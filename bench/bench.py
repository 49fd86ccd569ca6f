#!/usr/bin/env python3
"""sbx benchmarks, each printed beside a yardstick measured in the same run.

  create   createSandbox over the socket N times one after another, then
           destroySandbox of each, p50/p99, against `bwrap --unshare-all ...
           true` (bubblewrap) started N times
  wake     the first call to a sandbox after a daemon restart (starts it on
           its own disk), against the same call once it runs
  many     1,000 idle sandboxes: host memory each (MemAvailable, caches
           dropped), create and exec latency with them against none
  disk     1 GiB sequential write and tar -x of 2,000 small files in
           /workspace, against the same on the host's disk
  view     the FUSE view (sbx mount) against the same files reached
           directly: sequential, random 4 KiB, creates, stats, git status
  churn    what a sandbox making and removing one file in a loop costs a
           mounted view (whose host side has listed that directory): the
           view's CPU time against the sandbox's own, over the same seconds
  buckets  a bucket on a loopback S3 server (npm s3rver) mounted by
           sbx-bucketfs against Debian's s3fs on the same server: untar of
           2,000 source files and reading them back, 1 GiB sequential write
           and read; the wake of a sandbox with a bucket mount (--s3-tmpfs:
           s3rver keeps its objects on a tmpfs, off the host's disk)
  bucket-far  the same 2,000 files read back by tar from a bucket whose
           server is 10 ms away (s3rver behind bench/delayproxy.py, which
           holds every chunk 5 ms each way), sbx-bucketfs against s3fs:
           from a fresh mount, then again by the same mount
  bucket-files  small files written through a bucket mount until stored,
           against the same on the host's disk
  recover  a bucket server killed with 20,000 files journaled (written while
           its bucket was away), started again: until a stat answers,
           against the same with none
  code     runCode "1+1" in a warm context against `exec true`; the first
           run in a new Python/Node context against `python3 -c pass` and
           `node -e 0` run by exec; gitCheckout of a 1,000-commit repository
           against `git clone` of it on the host
  preview  wrk through a preview URL against wrk in the sandbox's own
           namespace, both at a small epoll server inside the sandbox
           (bench/staticd.c); a 1 GiB download both ways
  exec     `exec true` through `sbx mcp` (stdio relay), p50/p99 over N,
           against plain fork+exec of /bin/true (posix_spawn + wait)
  parallel calls per second of `exec true` with C clients on C sessions
  transports  `exec true` and `ping` over stdio (sbx mcp), the socket and
           HTTP; the ping difference stdio - socket is what the relay adds
  clients  `exec true` latency and throughput with 1, 8 and 64 socket clients

Usage: bench/bench.py [create|wake|many|disk|view|churn|buckets|bucket-far|bucket-files|recover|code|preview|exec|parallel|transports|clients|all] [--n N] [--s3-tmpfs]. Needs root, a built
build/sbx and bubblewrap (scripts/bootstrap installs it)."""
import argparse
import os
import shutil
import socket
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


BWRAP_ARGV = ['--unshare-all', '--proc', '/proc', '--dev', '/dev', '--ro-bind', '/usr', '/usr',
              '--symlink', 'usr/lib', '/lib', '--symlink', 'usr/lib64', '/lib64', '--symlink', 'usr/bin', '/bin',
              '--tmpfs', '/tmp', '/usr/bin/true']


def bwrap_times(n):
    argv = [shutil.which('bwrap')] + BWRAP_ARGV
    return [spawn_wait(argv) for _ in range(n)]


CREATE_GAP = 0.05


def bench_create(env, n):
    """Creates one every 50 ms, as an agent makes them (the daemon has made
    the next sandbox ahead meanwhile), and back to back (a burst: each
    create waits for the one being made ahead). The yardstick runs the same
    way."""
    c = env.socket_client()
    c.initialize()
    c.ok('createSandbox', {'sandboxId': 'warm'})  # daemon warm; not timed
    paced = lat_each(lambda i: c.ok('createSandbox', {'sandboxId': 'p%d' % i}), n, CREATE_GAP)
    argv = [shutil.which('bwrap')] + BWRAP_ARGV
    yard_paced = lat_each(lambda i: spawn_wait(argv), n, CREATE_GAP)
    for i in range(n):
        c.ok('destroySandbox', {'sandboxId': 'p%d' % i})
    m0, d0 = busy_ms(), proc_cpu_ms(env.daemon_pid())
    ours = lat_each(lambda i: c.ok('createSandbox', {'sandboxId': 'b%d' % i}), n)
    m1, d1 = busy_ms(), proc_cpu_ms(env.daemon_pid())
    destroy = lat_each(lambda i: c.ok('destroySandbox', {'sandboxId': 'b%d' % i}), n)
    y0 = busy_ms()
    yard = bwrap_times(n)
    y1 = busy_ms()
    print('== sandbox create (n=%d, one every %d ms) ==' % (n, CREATE_GAP * 1000))
    report('sbx createSandbox', paced, 'bwrap --unshare-all ... true', yard_paced)
    print('== sandbox create (n=%d, one after another), then destroy ==' % n)
    report('sbx createSandbox', ours, 'bwrap --unshare-all ... true', yard)
    report('sbx destroySandbox', destroy, 'bwrap --unshare-all ... true', yard)
    print('CPU a create, back to back: the machine %.1f ms (the daemon %.1f ms); a bwrap run: the machine %.1f ms'
          % ((m1 - m0) / n, (d1 - d0) / n, (y1 - y0) / n))
    print()


def busy_ms():
    """CPU time the whole machine has spent busy (all CPUs, not idle or
    waiting for I/O), in ms."""
    with open('/proc/stat') as f:
        a = [int(x) for x in f.readline().split()[1:]]
    return (sum(a) - a[3] - a[4]) * 1000 / os.sysconf('SC_CLK_TCK')


def proc_cpu_ms(pid):
    """A process's CPU time and its reaped children's, in ms."""
    with open('/proc/%d/stat' % pid) as f:
        fields = f.read().rsplit(')', 1)[1].split()
    return sum(int(x) for x in fields[11:15]) * 1000 / os.sysconf('SC_CLK_TCK')


def lat_each(f, n, gap=0):
    xs = []
    for i in range(n):
        time.sleep(gap)  # pacing, not timed
        t0 = time.perf_counter()
        f(i)
        xs.append((time.perf_counter() - t0) * 1000)
    return xs


def bench_wake(n):
    """A sandbox stopped by a daemon restart: its first call starts it on
    its own disk (restarted: true)."""
    env = Env()
    try:
        c = env.socket_client()
        c.initialize()
        for i in range(n):
            c.ok('writeFile', {'sandboxId': 'w%d' % i, 'path': 'f', 'content': 'x'})
        c.close()
        env.run(['daemon', 'stop'])
        c = env.socket_client()
        c.initialize()
        wake = lat_each(lambda i: c.ok('exists', {'sandboxId': 'w%d' % i, 'path': 'f'}), n)
        warm = lat_each(lambda i: c.ok('exists', {'sandboxId': 'w%d' % i, 'path': 'f'}), n)
        print('== wake after a daemon restart (n=%d) ==' % n)
        print('%-34s p50 %7.2f ms  p99 %7.2f ms' % ('first call (starts the sandbox)', pct(wake, 50), pct(wake, 99)))
        print('%-34s p50 %7.2f ms  p99 %7.2f ms' % ('the same call, running', pct(warm, 50), pct(warm, 99)))
        print()
    finally:
        env.close()


def meminfo_kb():
    subprocess.run(['sync'])
    with open('/proc/sys/vm/drop_caches', 'w') as f:
        f.write('3\n')
    time.sleep(1)
    with open('/proc/meminfo') as f:
        return {l.split(':')[0]: int(l.split()[1]) for l in f}



def bench_many(n):
    """n idle sandboxes at once: host memory each, and create and exec
    latency with them alive against none. The latency with none is
    measured before the n are made and again after they are destroyed, and
    the ratio is against both together: this VM's speed drifts over the
    minutes between (a third, some runs), which one measure before would
    count as the n's doing."""
    env = Env()
    try:
        c = env.socket_client()
        c.initialize()
        c.ok('createSandbox', {'sandboxId': 'probe'})
        c.sh('true', sandbox='probe')

        def probe():
            """After the same warm-up each time (the memory figure drops
            the caches just before)."""
            def pair(i):
                c.ok('createSandbox', {'sandboxId': 'p%d' % i})
                c.ok('destroySandbox', {'sandboxId': 'p%d' % i})
            lat_each(pair, 5)
            cr = lat_each(pair, 100)
            # creates as an agent makes them (bench_create's pacing); each is
            # destroyed after it was timed, in the gap before the next
            paced = []
            for i in range(60):
                time.sleep(CREATE_GAP)
                t0 = time.perf_counter()
                c.ok('createSandbox', {'sandboxId': 'q%d' % i})
                paced.append((time.perf_counter() - t0) * 1000)
                c.ok('destroySandbox', {'sandboxId': 'q%d' % i})
            ex = lat_each(lambda i: c.ok('exec', {'sandboxId': 'probe', 'command': 'true'}), 500)
            return cr, paced, ex

        def pipelined(tool, prefix):
            """The tool for prefix-0..n-1, at most 200 in progress (a
            connection may have 256)."""
            def done(i):
                r = c.next(lambda m, i=i: m.get('id') == 'm%d' % i, 300)
                assert not r['result'].get('isError'), r
            window = 200
            for i in range(n):
                if i >= window:
                    done(i - window)
                c.send({'jsonrpc': '2.0', 'id': 'm%d' % i, 'method': 'tools/call',
                        'params': {'name': tool, 'arguments': {'sandboxId': '%s-%d' % (prefix, i)}}})
            for i in range(max(0, n - window), n):
                done(i)

        def settled():
            """MemAvailable once it holds still (the kernel's deferred frees
            and the daemon's settling of quiet sandboxes over; at most 60 s)."""
            m1, t0 = meminfo_kb(), time.monotonic()
            while time.monotonic() - t0 < 60:
                time.sleep(2)
                m = meminfo_kb()
                steady = abs(m['MemAvailable'] - m1['MemAvailable']) < 2048
                m1 = m
                if steady:
                    break
            return m1, time.monotonic() - t0
        m0 = meminfo_kb()
        before = m0['MemAvailable']
        cr0, pc0, ex0 = probe()
        pipelined('createSandbox', 'idle')
        m1, settle = settled()
        after = m1['MemAvailable']
        cr1, pc1, ex1 = probe()
        pipelined('destroySandbox', 'idle')
        settled()
        cr2, pc2, ex2 = probe()
        print('== %d idle sandboxes ==' % n)
        print('%-34s %8.0f KiB per sandbox (MemAvailable, caches dropped; steady after %.0f s)' %
              ('host memory', (before - after) / n, settle))
        print('%-34s %s' % ('  of which (KiB per sandbox)', ', '.join(
            '%s %.0f' % (k, (m1[k] - m0[k]) / n) for k in ('Slab', 'SUnreclaim', 'KernelStack', 'PageTables', 'Buffers',
                                                           'AnonPages', 'Shmem'))))
        for name, many, none0, none2 in (('create + destroy', cr1, cr0, cr2),
                                         ('create, one every %d ms' % (CREATE_GAP * 1000), pc1, pc0, pc2),
                                         ('exec true', ex1, ex0, ex2)):
            print('%-34s p50 %7.2f ms with %d alive, %7.2f ms with none (%.2f before, %.2f after) (%.2fx)' %
                  (name, pct(many, 50), n, pct(none0 + none2, 50), pct(none0, 50), pct(none2, 50),
                   pct(many, 50) / pct(none0 + none2, 50)))
        print()
    finally:
        env.close()


def bench_disk(size_mb=1024, files=2000):
    """Sequential write of size_mb and tar -x of a tree of small files in
    /workspace, against the same commands on the host's disk."""
    import tarfile
    env = Env()
    host = os.path.join(env.root, 'host')
    os.makedirs(host)
    try:
        tar = os.path.join(env.root, 'tree.tar')
        with tarfile.open(tar, 'w') as tf:
            import io
            for i in range(files):
                data = (b'%d\n' % i) * (1 + i % 200)
                ti = tarfile.TarInfo('src/d%d/f%d.txt' % (i % 50, i))
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
        c = env.socket_client()
        c.initialize()
        c.ok('createSandbox', {'sandboxId': 'disk'})
        with open(tar, 'rb') as f:
            import base64
            c.ok('writeFile', {'sandboxId': 'disk', 'path': '/tmp/tree.tar', 'content': base64.b64encode(f.read()).decode(),
                               'encoding': 'base64'})
        write_cmd = 'dd if=/dev/zero of=%s/big bs=1M count=%d conv=fsync status=none'
        untar_cmd = 'mkdir -p %s/x && tar -xf %s -C %s/x && sync'

        def ours(cmd):
            t0 = time.perf_counter()
            r = c.ok('exec', {'sandboxId': 'disk', 'command': cmd}, timeout=600)
            assert r['exitCode'] == 0, r
            return (time.perf_counter() - t0) * 1000

        def native(cmd):
            t0 = time.perf_counter()
            subprocess.run(['sh', '-c', cmd], check=True)
            return (time.perf_counter() - t0) * 1000
        rows = []
        for name, o, h in (('write %d MiB (fsync)' % size_mb, write_cmd % ('/workspace', size_mb), write_cmd % (host, size_mb)),
                           ('tar -x of %d small files' % files, untar_cmd % ('/workspace', '/tmp/tree.tar', '/workspace'),
                            untar_cmd % (host, tar, host))):
            a = min(ours(o) for _ in range(3))
            b = min(native(h) for _ in range(3))
            c.ok('exec', {'sandboxId': 'disk', 'command': 'rm -rf /workspace/big /workspace/x'})
            subprocess.run(['rm', '-rf', os.path.join(host, 'big'), os.path.join(host, 'x')])
            rows.append((name, a, b))
        print('== disk: /workspace against the host\'s own disk (best of 3) ==')
        for name, a, b in rows:
            print('%-34s sbx %8.1f ms  host %8.1f ms  (%.2fx)' % (name, a, b, a / b))
        print()
    finally:
        env.close()


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


def bench_files(env, n):
    """writeFile, readFile and exists of 4 KiB through sbx mcp, against the
    same write and read done by a process on the host, in the sandbox's
    /workspace reached through /proc/<init>/root; then the same calls in a
    sandbox with a (local) bucket mount, whose file calls run in a child
    process of the daemon each."""
    c = env.mcp(['--sandbox', 'files'])
    c.initialize()
    data = 'x' * 4096
    c.ok('writeFile', {'path': 'f', 'content': data})  # sandbox exists; not timed
    c.ok('writeFile', {'sandboxId': 'files-b', 'path': 'f', 'content': data})
    c.ok('mountBucket', {'sandboxId': 'files-b', 'bucket': 'bench-files', 'mountPath': '/workspace/keep',
                         'localBucket': True})
    print('== file calls through sbx mcp (4 KiB, n=%d) ==' % n)
    path = '/proc/%d/root/workspace/f' % init_pid('files')  # root has no uid of its own there: an existing file

    def host_write():
        with open(path, 'w') as f:
            f.write(data)

    def host_read():
        with open(path) as f:
            f.read()
    hw, hr = lat(host_write, n), lat(host_read, n)
    for sid, what in (('files', ''), ('files-b', ', bucket mounted')):
        w = lat(lambda: c.ok('writeFile', {'sandboxId': sid, 'path': 'f', 'content': data}), n)
        r = lat(lambda: c.ok('readFile', {'sandboxId': sid, 'path': 'f'}), n)
        e = lat(lambda: c.ok('exists', {'sandboxId': sid, 'path': 'nothing'}), n)
        report('writeFile' + what, w, 'open+write+close on the host', hw)
        report('readFile' + what, r, 'open+read+close on the host', hr)
        report('exists' + what, e, 'open+read+close on the host', hr)


def run_threads(work, n):
    """work(0) .. work(n - 1) at once, each in a thread; the seconds they took."""
    ths = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    t0 = time.monotonic()
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    return time.monotonic() - t0


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
    el = run_threads(work, clients)
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


def proc_cpu_s(pid):
    with open('/proc/%d/stat' % pid) as f:
        v = f.read().rsplit(')', 1)[1].split()
    return (int(v[11]) + int(v[12])) / os.sysconf('SC_CLK_TCK')


def proc_rchar(pid):
    with open('/proc/%d/io' % pid) as f:
        return int(next(l for l in f if l.startswith('rchar:')).split()[1])


def bench_flood(env, n, floods=30, seconds=5):
    """exec latency while one sandbox runs `floods` background processes
    printing forever, against the same with none; the daemon's CPU and how
    much output it reads meanwhile."""
    c = env.socket_client()
    c.initialize()
    call = lambda sb: c.ok('exec', {'sandboxId': sb, 'command': 'true'})  # noqa: E731
    for sb in ('flood', 'neighbour'):
        call(sb)
    idle = {sb: lat(lambda: call(sb), n) for sb in ('flood', 'neighbour')}
    for i in range(floods):
        c.ok('startProcess', {'sandboxId': 'flood', 'processId': 'yes-%d' % i, 'command': 'yes'})
    pid = env.daemon_pid()
    time.sleep(1)  # past the start: the steady state is measured
    cpu0, rd0, t0 = proc_cpu_s(pid), proc_rchar(pid), time.monotonic()
    time.sleep(seconds)
    cpu1, rd1, t1 = proc_cpu_s(pid), proc_rchar(pid), time.monotonic()
    busy = {sb: lat(lambda: call(sb), n) for sb in ('flood', 'neighbour')}
    print('== exec true while %d background processes print forever in one sandbox (n=%d) ==' % (floods, n))
    for sb in ('neighbour', 'flood'):
        report('sbx exec in %s, flooding' % sb, busy[sb], 'sbx exec in %s, no flood' % sb, idle[sb])
    print('%-34s %8.0f %% of a core, reading %.0f MiB/s of their output' %
          ('daemon while they print', 100 * (cpu1 - cpu0) / (t1 - t0), (rd1 - rd0) / (t1 - t0) / 2**20))
    print()
    c.ok('destroySandbox', {'sandboxId': 'flood'})


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
        el = run_threads(work, k)
        allx = [v for l in lats for v in l]
        print('%2d clients: %6.0f calls/s   p50 %7.2f ms  p99 %7.2f ms' % (k, len(allx) / el, pct(allx, 50), pct(allx, 99)))
        for c in cs:
            c.close()
    print()


def init_pid(sandbox):
    """The host pid of a sandbox's init (its hostname is its id)."""
    for p in os.listdir('/proc'):
        try:
            if open('/proc/%s/comm' % p).read().strip() != 'sbx-init':
                continue
            if open('/proc/%s/root/etc/hostname' % p).read().strip() == sandbox:
                return int(p)
        except OSError:
            continue
    return None


def mounted_view(sandbox, opts=None):
    """A daemon of the bench's own with one sandbox, and a view of it
    mounted: (env, client, mount point)."""
    env = Env()
    mnt = os.path.join(env.root, 'view')
    os.makedirs(mnt)
    c = env.socket_client()
    c.initialize()
    c.ok('createSandbox', {'sandboxId': sandbox})
    r = env.run(['mount'] + (['-o', opts] if opts else []) + [mnt])
    assert r.returncode == 0, r.stderr
    return env, c, mnt


def bench_view(size_mb=1024, opts=None):
    """The FUSE view against the same files reached directly (through
    /proc/<init>/root/workspace), in one run."""
    env, c, mnt = mounted_view('vb', opts)
    try:
        pid = init_pid('vb')
        view = os.path.join(mnt, 'vb')
        rows = []

        def timed(where, cmd, cold=True):
            """cmd in /workspace, caches dropped first (cold): directly in the
            sandbox's user and mount namespaces (as its root, which is what
            the view acts as), or through the view."""
            if cold:
                subprocess.run(['sh', '-c', 'sync; echo 3 > /proc/sys/vm/drop_caches'])
            if where == 'direct':
                argv = ['nsenter', '-t', str(pid), '-U', '-m', '--', 'sh', '-c', 'cd /workspace && ' + cmd]
            else:
                argv = ['sh', '-c', 'cd %s && %s' % (view, cmd)]
            t0 = time.perf_counter()
            p = subprocess.run(argv, capture_output=True, text=True)
            assert p.returncode == 0, (cmd, p.stderr)
            return time.perf_counter() - t0, p.stdout

        def both(name, cmd, unit, amount, cold=True):
            a, _ = timed('direct', cmd % {'n': 'd'}, cold)
            b, _ = timed('view', cmd % {'n': 'v'}, cold)
            rows.append((name, amount / b, amount / a, unit))
        both('sequential write %d MiB' % size_mb, 'dd if=/dev/zero of=seq-%%(n)s bs=1M count=%d conv=fsync status=none'
             % size_mb, 'MiB/s', size_mb)
        # each file read cold once each way, crossed, after one untimed read
        # of both: where a file lies on the disk, and whether its blocks have
        # been read back from the host under this machine since they were
        # written, moved one side's figure by half between runs
        read = 'dd if=seq-%s of=/dev/null bs=1M status=none'
        timed('direct', 'cat seq-d seq-v >/dev/null')
        d1, _ = timed('direct', read % 'd')
        v1, _ = timed('view', read % 'v')
        d2, _ = timed('direct', read % 'v')
        v2, _ = timed('view', read % 'd')
        rows.append(('sequential read %d MiB (twice)' % size_mb, 2 * size_mb / (v1 + v2), 2 * size_mb / (d1 + d2), 'MiB/s'))
        # and one file in the page cache, four times: what the view adds to a read
        both('sequential read %d MiB (cached, 4x)' % size_mb, 'for i in 1 2 3 4; do %s; done' % read % 'd', 'MiB/s',
             4 * size_mb, cold=False)
        timed('direct', 'rm -f seq-*')
        fio = ('fio --name=r --directory=. --filename=rand-%%(n)s --size=256M --bs=4k --rw=%s --ioengine=psync '
               '--runtime=5 --time_based --direct=0 --output-format=terse --terse-version=3 | cut -d";" -f%s')
        for w, n in (('direct', 'd'), ('view', 'v')):
            timed(w, 'fio --name=p --directory=. --filename=rand-%s --size=256M --rw=write --bs=1M --output-format=terse '
                  '>/dev/null' % n)

        def fio_iops(mode, field):
            out = {}
            for w, n in (('direct', 'd'), ('view', 'v')):
                _, o = timed(w, fio % (mode, field) % {'n': n})
                out[n] = float(o.strip() or 0)
            rows.append(('4 KiB random %s' % mode.replace('rand', ''), out['v'], out['d'], 'IOPS'))
        fio_iops('randread', 8)
        fio_iops('randwrite', 49)
        both('create 5,000 files', 'mkdir cr-%(n)s && cd cr-%(n)s && for i in $(seq 5000); do : > f$i; done', 'files/s', 5000)
        both('look up 20,000 new names', 'python3 -c "import os; [os.path.lexists(\'nx-%(n)s-%%d\' %% i) '
             'for i in range(20000)]"', 'names/s', 20000)
        both('stat 5,000 files (ls -l, twice)', 'cd cr-%(n)s && ls -l >/dev/null && ls -l > /dev/null', 'stat/s', 10000)
        timed('direct', 'mkdir tree && cd tree && git init -q && for d in $(seq 100); do mkdir d$d; for f in $(seq 100); '
              'do echo $d$f > d$d/f$f; done; done && git add -A && git -c gc.autoDetach=false -c user.email=b@b '
              '-c user.name=b commit -qm x')  # its auto gc (10,000 objects) ends before the clones
        timed('direct', 'git clone -q tree repo-d')
        timed('direct', 'git clone -q tree repo-v')
        for w, n in (('direct', 'd'), ('view', 'v')):  # the index takes the stat data each side shows
            timed(w, 'cd repo-%s && git -c safe.directory=* status --porcelain >/dev/null' % n)
        status = 'git -c safe.directory=* status --porcelain >/dev/null'
        both('git status, 10,000 files (cold)', 'cd repo-%(n)s && ' + status, 'runs/s', 1)
        both('git status, 10,000 files (warm)', 'cd repo-%(n)s && ' + ' && '.join([status] * 5), 'runs/s', 5,
             cold=False)
        print('== the FUSE view against the same files reached directly ==')
        for name, v, d, unit in rows:
            print('%-34s view %10.1f %-8s direct %10.1f %-8s (%.0f%%)' % (name, v, unit, d, unit, 100 * v / d))
        print()
    finally:
        env.run(['umount', mnt])
        env.close()


def bench_churn(seconds=4):
    """A sandbox makes and removes one file in a loop while a view is
    mounted and the host has listed the directory: the view's CPU time
    (/proc/PID/stat) against the sandbox's own (its python process's), in
    the same seconds."""
    env, c, mnt = mounted_view('ch')
    try:
        c.ok('exec', {'sandboxId': 'ch', 'command': 'mkdir -p /workspace/d && touch /workspace/d/k1 /workspace/d/k2'})
        os.listdir(os.path.join(mnt, 'ch', 'd'))
        view = next(int(p) for p in os.listdir('/proc') if p.isdigit() and
                    open('/proc/%s/cmdline' % p, 'rb').read().split(b'\0')[-2:-1] == [mnt.encode()])
        loop = ('import os, time\nend = time.time() + %d\nn = 0\nwhile time.time() < end:\n'
                '    open("f", "w").close()\n    os.unlink("f")\n    n += 1\nprint(n)' % (seconds + 2))
        c.ok('writeFile', {'sandboxId': 'ch', 'path': '/workspace/d/churn.py', 'content': loop})
        c.ok('startProcess', {'sandboxId': 'ch', 'processId': 'churn', 'command': 'cd /workspace/d && python3 churn.py'})
        time.sleep(1)

        def ticks(pid):
            f = open('/proc/%d/stat' % pid).read().rsplit(')', 1)[1].split()
            return int(f[11]) + int(f[12])
        box = next(int(p) for p in os.listdir('/proc') if p.isdigit() and
                   b'churn.py' in open('/proc/%s/cmdline' % p, 'rb').read() and
                   open('/proc/%s/comm' % p).read().startswith('python'))
        v0, s0 = ticks(view), ticks(box)
        time.sleep(seconds)
        v1, s1 = ticks(view), ticks(box)
        n = c.ok('waitForExit', {'sandboxId': 'ch', 'processId': 'churn', 'timeout': 30000}, 60)
        made = c.ok('getProcessLogs', {'sandboxId': 'ch', 'processId': 'churn'})['stdout'].strip()
        hz = os.sysconf('SC_CLK_TCK')
        view_s, box_s = (v1 - v0) / hz, (s1 - s0) / hz
        print('== a sandbox making and removing a file in a loop, a view mounted (%d s) ==' % seconds)
        print('sandbox: %s files made and removed in %d s, %.2f s of CPU' % (made, seconds + 2, box_s))
        print('view:    %.2f s of CPU (%.0f%% of the sandbox\'s)' % (view_s, 100 * view_s / box_s if box_s else 0))
        print()
        del n
    finally:
        env.run(['umount', mnt])
        env.close()


def spawn_bucketfs(env, s3, mnt, cache, prefix):
    """`sbx bucketfs MNT` (the server a mountBucket runs) on s3's bucket
    "bench" under prefix, its cache in cache; not waited for."""
    import json
    from s3server import AK, SK
    cfg = json.dumps({'endpoint': s3.direct, 'bucket': 'bench', 'region': 'us-east-1', 'prefix': prefix,
                      'accessKeyId': AK, 'secretAccessKey': SK, 'pathStyle': True, 'cacheDir': cache,
                      'cacheMaxMB': 8192, 'uidBase': 0})
    p = subprocess.Popen([env.sbx, 'bucketfs', mnt], stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
    p.stdin.write(cfg.encode())
    p.stdin.close()
    return p


def wait_mounted(mnt, p=None, timeout=60):
    """Until mnt is a mount point (p: its server, which must not end)."""
    deadline = time.monotonic() + timeout
    while not os.path.ismount(mnt):
        assert time.monotonic() < deadline and (p is None or p.poll() is None), 'no mount at %s' % mnt
        time.sleep(0.01)


def drop_caches():
    subprocess.run(['sh', '-c', 'sync; echo 3 > /proc/sys/vm/drop_caches'])


def timed_sh(cmd, until=None):
    """Seconds sh -c cmd takes, and then until() to hold."""
    t0 = time.perf_counter()
    subprocess.run(['sh', '-c', cmd], check=True)
    if until:  # each look walks the server's files: often enough, not so often it slows the server
        while not until():
            time.sleep(0.2)
    return time.perf_counter() - t0


def include_names(files, regular=False):
    """The first files of /usr/include (regular: no symlinks), relative."""
    names = []
    for d, _, fs in sorted(os.walk('/usr/include')):
        for f in sorted(fs):
            p = os.path.join(d, f)
            if len(names) < files and os.path.isfile(p) and not (regular and os.path.islink(p)):
                names.append(os.path.relpath(p, '/usr/include'))
    return names


class BucketMounts:
    """Mounts of the bench's bucket by sbx-bucketfs or s3fs, unmade at the end."""

    def __init__(self, env):
        self.env, self.procs, self.mounts = env, [], []

    def mount(self, kind, where, server, prefix):
        from s3server import AK, SK
        mnt = os.path.join(self.env.root, where)
        os.makedirs(mnt, exist_ok=True)
        if kind == 'sbx':
            cache = os.path.join(self.env.root, where + '-cache')
            os.makedirs(cache, exist_ok=True)
            self.procs.append(spawn_bucketfs(self.env, server, mnt, cache, prefix))
        else:
            pw = os.path.join(self.env.root, 's3fs.passwd')
            with open(pw, 'w') as f:
                f.write('%s:%s\n' % (AK, SK))
            os.chmod(pw, 0o600)
            subprocess.run(['s3fs', 'bench:/' + prefix, mnt, '-o', 'url=%s,use_path_request_style,passwd_file=%s' %
                            (server.direct, pw)], check=True)
        wait_mounted(mnt, timeout=30)
        self.mounts.append(mnt)
        return mnt

    def umount(self, mnt):
        subprocess.run(['umount', mnt], capture_output=True)
        self.mounts.remove(mnt)
        for p in self.procs:
            if p.poll() is None:
                p.wait(timeout=600)  # its uploads finish first

    def close(self):
        for m in list(self.mounts):
            subprocess.run(['umount', '-l', m], capture_output=True)
        for p in self.procs:
            if p.poll() is None:
                p.kill()


def bench_buckets(size_mb=1024, files=2000, s3_tmpfs=False):
    """sbx-bucketfs (the server a mountBucket runs, here mounted on the
    host by `sbx bucketfs MOUNTPOINT`) against s3fs, both on one s3rver:
    each number is the time until the data is in the bucket (untar: every
    object stored; writes: dd's fsync), and reads start from an empty cache
    (a fresh mount, caches dropped). s3_tmpfs: s3rver keeps its objects on
    a tmpfs, so that the host's disk (where each new file can cost most of a
    millisecond, three per object stored) does not bound both clients."""
    from s3server import S3
    env = Env()
    if s3_tmpfs:
        os.makedirs(os.path.join(env.root, 's3data'))
        subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=8g', 'sbx-bench-s3', os.path.join(env.root, 's3data')],
                       check=True)
    s3 = S3(env.root, buckets=('bench',))
    bm = BucketMounts(env)
    drop = drop_caches
    umount = bm.umount

    def mount(kind, where, prefix):
        return bm.mount(kind, where, s3, prefix)

    timed = timed_sh

    try:
        names = include_names(files)  # a real source tree
        tarball = os.path.join(env.root, 'src.tar')
        subprocess.run(['tar', 'cf', tarball, '-C', '/usr/include'] + names, check=True)
        tar_mb = os.path.getsize(tarball) / 1e6
        rows = []
        for kind in ('sbx', 's3fs'):
            # s3fs needs the source's parent directories as objects it can see
            pre = kind + '-tree'
            m = mount(kind, kind + '-w', pre)
            up = timed('tar xf %s -C %s' % (tarball, m),
                       lambda: len([k for k in s3.stored_keys('bench', pre + '/') if not k.endswith('/')]) >= files)
            # read back by the mount that wrote it, the kernel's caches dropped: what the client keeps
            drop()
            back = timed('cd %s && tar cf - . | wc -c >/dev/null' % m)
            umount(m)
            drop()
            m = mount(kind, kind + '-r', pre)
            rd = timed('cd %s && tar cf - . | wc -c >/dev/null' % m)
            umount(m)
            pre = kind + '-seq'
            m = mount(kind, kind + '-sw', pre)
            sw = timed('dd if=/dev/zero of=%s/big bs=1M count=%d conv=fsync status=none' % (m, size_mb))
            umount(m)
            rows.append([kind, up, back, rd, sw])
        # 1 GiB cold reads, the two clients taking turns three times: one read swings by a fifth
        reads = {'sbx': [], 's3fs': []}
        for _ in range(3):
            for kind in ('sbx', 's3fs'):
                drop()
                m = mount(kind, kind + '-sr', kind + '-seq')
                reads[kind].append(timed('dd if=%s/big of=/dev/null bs=1M status=none' % m))
                umount(m)
        for r in rows:
            r.append(sorted(reads[r[0]])[1])
        # the server's own ceiling: awscli putting the same tree, 10 requests at a time
        src = os.path.join(env.root, 'src')
        os.makedirs(src)
        subprocess.run(['tar', 'xf', tarball, '-C', src], check=True)
        def aws_sync(frm, to):
            t0 = time.perf_counter()
            s3.aws('s3', 'sync', '--only-show-errors', frm, to, check=False)
            return time.perf_counter() - t0
        ceiling = aws_sync(src, 's3://bench/aws-tree/')
        ceiling_read = aws_sync('s3://bench/aws-tree/', os.path.join(env.root, 'back'))  # and getting it back
        print('== bucket mounts: sbx-bucketfs against s3fs, same s3rver on loopback (its objects on %s) =='
              % ('a tmpfs' if s3_tmpfs else 'the host\'s disk'))
        print('(%d files of /usr/include, %.1f MB; %d MiB sequential)' % (files, tar_mb, size_mb))
        print('%-6s %19s %12s %15s %17s %17s' % ('', 'untar until stored', 'read back', 'both', 'read back (cold)',
                                                  'write 1 GiB+fsync') + ' %17s' % 'read 1 GiB (cold)')
        for kind, up, back, rd, sw, sr in rows:
            print('%-6s %17.2f s %10.2f s %13.2f s %15.2f s %11.0f MiB/s %11.0f MiB/s' %
                  (kind, up, back, up + back, rd, size_mb / sw, size_mb / sr))
        (_, a, b, c, d, e), (_, a2, b2, c2, d2, e2) = rows
        print('%-6s %18.1fx %11.1fx %14.1fx %16.1fx %16.2fx %16.2fx' %
              ('ratio', a2 / a, b2 / b, (a2 + b2) / (a + b), c2 / c, d2 / d, e2 / e))
        print('(ratio: how many times faster sbx is than s3fs; read back: by the mount that wrote the tree, the '
              'kernel\'s caches dropped; cold: a fresh mount; read 1 GiB: the median of 3 each, taking turns)')
        print('1 GiB cold reads: sbx %s MiB/s, s3fs %s MiB/s' %
              tuple(' '.join('%.0f' % (size_mb / t) for t in reads[k]) for k in ('sbx', 's3fs')))
        print('the server\'s ceiling: aws s3 sync of the same tree, 10 at a time: %.2f s up, %.2f s back' %
              (ceiling, ceiling_read))
        print()
        bench_bucket_wake(env, s3)
    finally:
        bm.close()
        s3.close()
        if s3_tmpfs:
            subprocess.run(['umount', '-l', os.path.join(env.root, 's3data')], capture_output=True)
        env.close()


def bench_bucket_far(files=2000, delay_ms=5):
    """tar cf of a 2,000-file tree from a bucket whose server is a network
    away: s3rver (objects on a tmpfs) behind a relay that holds every chunk
    delay_ms each way, read by sbx-bucketfs and by s3fs, each from a fresh
    mount and then again by the same mount (the kernel's caches dropped
    before each). The tree is put there by sbx straight to the server."""
    from s3server import S3
    env = Env()
    os.makedirs(os.path.join(env.root, 's3data'))
    subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=2g', 'sbx-bench-s3', os.path.join(env.root, 's3data')],
                   check=True)
    s3 = S3(env.root, buckets=('bench',))
    sk = socket.socket()
    sk.bind(('127.0.0.1', 0))
    port = sk.getsockname()[1]
    sk.close()
    relay = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), 'delayproxy.py'), str(port),
                              '127.0.0.1', str(s3.port), str(delay_ms)], stdout=subprocess.PIPE)
    relay.stdout.readline()  # ready
    far = type('Far', (), {'direct': 'http://127.0.0.1:%d' % port})()
    bm = BucketMounts(env)
    drop = drop_caches
    umount = bm.umount

    def mount(kind, where, server):
        return bm.mount(kind, where, server, 'tree')

    timed = timed_sh

    try:
        names = include_names(files, regular=True)  # s3fs cannot read sbx's symlinks
        tarball = os.path.join(env.root, 'src.tar')
        subprocess.run(['tar', 'cf', tarball, '-C', '/usr/include'] + names, check=True)
        m = mount('sbx', 'put', s3)  # straight to the server, directory markers included
        subprocess.run(['tar', 'xf', tarball, '-C', m], check=True)
        umount(m)  # its uploads end first
        rows = []
        for kind in ('sbx', 's3fs'):
            drop()
            m = mount(kind, kind + '-far', far)
            cold = timed('cd %s && tar cf - . | wc -c >/dev/null' % m)
            drop()
            again = timed('cd %s && tar cf - . | wc -c >/dev/null' % m)
            umount(m)
            rows.append((kind, cold, again))
        print('== a bucket %d ms away: tar cf of %d files (s3rver behind bench/delayproxy.py) ==' % (2 * delay_ms, files))
        print('%-6s %22s %24s' % ('', 'from a fresh mount', 'again, the same mount'))
        for kind, cold, again in rows:
            print('%-6s %20.2f s %22.2f s' % (kind, cold, again))
        (_, a, b), (_, a2, b2) = rows
        print('%-6s %21.1fx %23.1fx' % ('ratio', a2 / a, b2 / b))
        print('(ratio: how many times faster sbx is than s3fs; the kernel\'s caches dropped before each)')
        print()
    finally:
        bm.close()
        relay.kill()
        s3.close()
        subprocess.run(['umount', '-l', os.path.join(env.root, 's3data')], capture_output=True)
        env.close()


def bench_bucket_recover(files=20000):
    """A bucket server killed (-9) with files written while its bucket was
    away, then started again on the same cache: the time until a stat
    through the mount answers (what an earlier run journaled is taken up
    first), against the same start with nothing journaled."""
    import signal
    from s3server import S3
    env = Env()
    s3 = S3(env.root, buckets=('bench',))
    try:
        def start(mnt, cache):
            p = spawn_bucketfs(env, s3, mnt, cache, 'rec')
            t0 = time.perf_counter()
            wait_mounted(mnt, p, 600)
            return p, t0

        def stop(p, mnt):
            p.send_signal(signal.SIGKILL)
            p.wait()
            subprocess.run(['umount', '-l', mnt])

        times = {}
        for n in (0, files):
            mnt, cache = os.path.join(env.root, 'm%d' % n), os.path.join(env.root, 'c%d' % n)
            os.makedirs(mnt)
            os.makedirs(cache)
            if not s3.node or s3.node.poll() is not None:
                s3.start()
            p, _ = start(mnt, cache)
            os.mkdir(os.path.join(mnt, 'd'))
            s3.stop()  # the bucket is away: what follows is journaled, not sent
            subprocess.run(['sh', '-c', 'cd %s/d && i=0; while [ $i -lt %d ]; do echo $i > f$i; i=$((i+1)); done'
                            % (mnt, n)], check=True)
            stop(p, mnt)
            p, t0 = start(mnt, cache)
            subprocess.run(['stat', os.path.join(mnt, 'd')], capture_output=True)
            times[n] = time.perf_counter() - t0
            stop(p, mnt)
        print('== a bucket server started again after kill -9, until a stat through it answers ==')
        print('%6d files journaled            %8.2f s' % (files, times[files]))
        print('%6d files journaled            %8.2f s' % (0, times[0]))
        print()
    finally:
        s3.close()
        env.close()


def bench_bucket_wake(env, s3, n=20):
    """The first call to a sandbox reset for idleness, with one bucket
    mount it gets back, against the same without a mount: at once after
    the reset, and once the reset is over (the mount's last server gone:
    a sandbox asleep, as one is when an agent comes back to it)."""
    import json
    from s3server import AK, SK
    cfg = os.path.join(env.root, 'config.json')
    with open(cfg, 'w') as f:
        json.dump({'buckets': {'allowedEndpoints': ['http://127.0.0.1:']}}, f)
    env.run(['daemon', 'stop'])
    env.env['SBX_CONFIG'] = cfg
    c = env.socket_client()
    c.initialize()
    c.request('logging/setLevel', {'level': 'notice'})

    def servers(sid):
        """The bucket servers of sandbox sid (their cwd is its cache)."""
        mark = '/bucket-cache/%s/' % sid
        found = []
        for pid in os.listdir('/proc'):
            try:
                if pid.isdigit() and mark in os.readlink('/proc/%s/cwd' % pid) + '/':
                    found.append(pid)
            except OSError:
                pass
        return found

    res = {}
    for kind in ('plain', 'bucket', 'asleep'):
        xs = []
        for i in range(n):
            sid = '%s%d' % (kind[0], i)
            c.ok('createSandbox', {'sandboxId': sid, 'sleepAfter': '1s'})
            if kind != 'plain':
                c.ok('mountBucket', {'sandboxId': sid, 'bucket': 'bench', 'mountPath': '/data', 'prefix': 'wake',
                                     'endpoint': s3.direct, 'credentials': {'accessKeyId': AK, 'secretAccessKey': SK}})
            c.next(lambda m: m.get('method') == 'notifications/message' and
                   m['params']['data'].get('sandboxId') == sid, 30)
            if kind == 'asleep':
                t0 = time.monotonic()
                while servers(sid):
                    assert time.monotonic() - t0 < 30, 'the bucket server outlived the reset by 30 s'
                    time.sleep(0.01)
            t0 = time.perf_counter()
            r = c.ok('exists', {'sandboxId': sid, 'path': '/workspace' if kind == 'plain' else '/data'})
            xs.append((time.perf_counter() - t0) * 1000)
            assert r.get('exists'), r
            c.ok('destroySandbox', {'sandboxId': sid})
        res[kind] = xs
    print('== wake after an idle reset (n=%d) ==' % n)
    print('%-34s p50 %7.2f ms  p99 %7.2f ms' % ('with one bucket mount, asleep', pct(res['asleep'], 50),
                                                 pct(res['asleep'], 99)))
    print('%-34s p50 %7.2f ms  p99 %7.2f ms' % ('  the same at once after the reset', pct(res['bucket'], 50),
                                                 pct(res['bucket'], 99)))
    print('%-34s p50 %7.2f ms  p99 %7.2f ms' % ('without', pct(res['plain'], 50), pct(res['plain'], 99)))
    print()


def bench_code(n=200):
    """runCode through sbx mcp against exec, and gitCheckout against a
    clone on the host, in one run."""
    env = Env()
    try:
        c = env.mcp(['--sandbox', 'codebench'])
        c.initialize()
        c.ok('runCode', {'code': '1+1'})
        c.sh('true')
        warm = lat_each(lambda i: c.ok('runCode', {'code': '1+1'}), n)
        ex = lat_each(lambda i: c.sh('true'), n)
        print('== runCode (n=%d) ==' % n)
        print('%-34s p50 %7.2f ms  p99 %7.2f ms' % ('runCode "1+1", warm context', pct(warm, 50), pct(warm, 99)))
        print('%-34s p50 %7.2f ms  p99 %7.2f ms' % ('exec true (yardstick)', pct(ex, 50), pct(ex, 99)))
        print('%-34s p50 %7.2fx' % ('ratio', pct(warm, 50) / pct(ex, 50)))
        for lang, cmd in (('python', 'python3 -c pass'), ('javascript', 'node -e 0')):
            m = 20
            c.ok('runCode', {'code': '1', 'language': lang})  # the interpreter in the page cache
            xs = []
            for i in range(m):
                t0 = time.perf_counter()
                ctx = c.ok('createCodeContext', {'language': lang})
                c.ok('runCode', {'code': '1', 'contextId': ctx['id']})
                xs.append((time.perf_counter() - t0) * 1000)
                c.ok('deleteCodeContext', {'contextId': ctx['id']})
            ys = lat_each(lambda i: c.sh(cmd), m)
            print('%-34s p50 %7.2f ms  p99 %7.2f ms' % ('first run, new %s context' % lang, pct(xs, 50), pct(xs, 99)))
            print('%-34s p50 %7.2f ms  p99 %7.2f ms' % ('exec ' + cmd, pct(ys, 50), pct(ys, 99)))
            print('%-34s p50 %7.2fx' % ('ratio', pct(xs, 50) / pct(ys, 50)))
        # a loop of 300,000 prints, against the same program run by exec
        for lang, code, cmd in (('python', 'for i in range(300000): print(i)',
                                 "python3 -c 'for i in range(300000): print(i)'"),
                                ('javascript', 'for (let i = 0; i < 300000; i++) console.log(i)',
                                 "node -e 'for (let i = 0; i < 300000; i++) console.log(i)'")):
            xs = lat_each(lambda i: c.ok('runCode', {'code': code, 'language': lang}, 300), 3)
            ys = lat_each(lambda i: c.sh(cmd, wait=300), 3)
            print('%-34s p50 %7.0f ms' % ('300,000 prints, %s runCode' % lang, pct(xs, 50)))
            print('%-34s p50 %7.0f ms  ratio %.2fx' % ('the same by exec', pct(ys, 50), pct(xs, 50) / pct(ys, 50)))
        # a 1,000-commit repository, served by git daemon inside the sandbox
        c.sh('set -e; mkdir -p /srv/r && cd /srv/r && git init -q -b main && for i in $(seq 1000); do echo $i > f; '
             'git add f; git -c user.email=b@b -c user.name=b commit -qm c$i; done && git clone -q --bare . /srv/r.git',
             wait=600)
        c.ok('startProcess', {'processId': 'gitd', 'command': 'exec git daemon --reuseaddr --base-path=/srv '
                                                            '--export-all --listen=127.0.0.1 --port=9418 /srv'})
        c.ok('waitForPort', {'port': 9418, 'timeout': 20000}, 40)
        gx = []
        for i in range(5):
            t0 = time.perf_counter()
            c.ok('gitCheckout', {'repoUrl': 'git://127.0.0.1:9418/r.git', 'targetDir': '/workspace/r%d' % i}, 120)
            gx.append((time.perf_counter() - t0) * 1000)
        host = os.path.join(env.root, 'hostrepo')
        subprocess.run(['sh', '-c', 'mkdir -p %s && cd %s && git init -q -b main && for i in $(seq 1000); do echo $i > f; '
                        'git add f; git -c user.email=b@b -c user.name=b commit -qm c$i; done' % (host, host)],
                       check=True)
        subprocess.run(['git', 'daemon', '--detach', '--reuseaddr', '--base-path=' + env.root, '--export-all',
                        '--listen=127.0.0.1', '--port=9419', '--pid-file=' + host + '.pid', env.root], check=True)
        import socket
        deadline = time.monotonic() + 20
        while True:  # until git daemon accepts connections
            try:
                socket.create_connection(('127.0.0.1', 9419), 1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, 'git daemon on 9419'
                time.sleep(0.02)
        subprocess.run(['git', 'clone', '-q', 'git://127.0.0.1:9419/hostrepo', host + '-warm'], check=True)
        hx = []
        for i in range(5):
            t0 = time.perf_counter()
            subprocess.run(['git', 'clone', '-q', 'git://127.0.0.1:9419/hostrepo', '%s-c%d' % (host, i)], check=True)
            hx.append((time.perf_counter() - t0) * 1000)
        os.kill(int(open(host + '.pid').read()), 15)
        print('%-34s p50 %7.2f ms' % ('gitCheckout, 1,000 commits', pct(gx, 50)))
        print('%-34s p50 %7.2f ms' % ('git clone on the host', pct(hx, 50)))
        print('%-34s p50 %7.2fx' % ('ratio', pct(gx, 50) / pct(hx, 50)))
        print()
    finally:
        env.close()


def netns_of(comm, arg):
    """The network namespace path of the process named comm started with arg
    (a server inside a sandbox), for running the yardstick there."""
    mine = os.readlink('/proc/self/ns/net')
    for p in os.listdir('/proc'):
        try:
            if open('/proc/%s/comm' % p).read().strip() != comm or arg not in open('/proc/%s/cmdline' % p).read():
                continue
            ns = '/proc/%s/ns/net' % p
            if os.readlink(ns) != mine:
                return ns
        except OSError:
            continue
    raise RuntimeError('no %s %s in a sandbox' % (comm, arg))


DOWNLOAD = r"""import socket, sys, time
t0 = time.perf_counter()
s = socket.create_connection(('127.0.0.1', int(sys.argv[1])))
s.sendall(('GET /big HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' % sys.argv[2]).encode())
head = b''
while b'\r\n\r\n' not in head:
    head += s.recv(4096)
head, _, body = head.partition(b'\r\n\r\n')
want = int([l.split(b':')[1] for l in head.split(b'\r\n') if l.lower().startswith(b'content-length:')][0])
n = len(body)
while n < want:
    b = s.recv(1 << 20)
    if not b:
        break
    n += len(b)
print(n, n / (time.perf_counter() - t0) / 1e6)
"""


def bench_preview():
    """The preview proxy against the same server reached directly in the
    sandbox's network namespace, in one run: the same wrk and the same
    download client on the host, once through the preview URL and once
    joined to the sandbox's namespace (nsenter --net)."""
    import re
    from sbxtest import free_port
    env = Env()
    port = free_port()
    env.env['SBX_PREVIEW_PORT'] = str(port)
    try:
        c = env.mcp(['--sandbox', 'pv'])
        c.initialize()
        src = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'staticd.c')).read()
        c.ok('writeFile', {'path': '/srv/staticd.c', 'content': src})
        r = c.sh('gcc -O2 -o /srv/staticd /srv/staticd.c', wait=120)
        assert r['exitCode'] == 0, r
        c.ok('startProcess', {'processId': 'httpd', 'command': 'exec /srv/staticd 8000'})
        c.ok('waitForLog', {'processId': 'httpd', 'pattern': 'listening', 'timeout': 20000}, 40)
        url = c.ok('exposePort', {'port': 8000})['url']
        host = url.split('://')[1].split('/')[0]
        ns = netns_of('staticd', '8000')
        enter = ['nsenter', '--net=' + ns]

        def wrk_stats(out):
            rps = float(re.search(r'Requests/sec:\s+([\d.]+)', out).group(1))
            p50 = re.search(r'50%\s+([\d.]+)(us|ms|s)', out)
            p99 = re.search(r'99%\s+([\d.]+)(us|ms|s)', out)
            ms = lambda m: float(m.group(1)) * {'us': 0.001, 'ms': 1, 's': 1000}[m.group(2)]
            return rps, ms(p50), ms(p99)

        def wrk(conns, prefix, target, hdr):
            return wrk_stats(subprocess.run(prefix + ['wrk', '-t1', '-c%d' % conns, '-d5s', '--latency'] + hdr + [target],
                                            capture_output=True, text=True).stdout)
        rows = []
        for conns in (1, 16):
            d = wrk(conns, enter, 'http://127.0.0.1:8000/', [])
            p = wrk(conns, [], 'http://127.0.0.1:%d/' % port, ['-H', 'Host: ' + host])
            rows.append((conns, p, d))

        def download(prefix, p, h):
            out = subprocess.run(prefix + [sys.executable, '-c', DOWNLOAD, str(p), h], capture_output=True,
                                 text=True).stdout.split()
            assert int(out[0]) >= 1 << 30, out
            return float(out[1])
        via = [download([], port, host) for _ in range(3)]
        inside = [download(enter, 8000, 'x') for _ in range(3)]
        # the daemon's memory with 400 clients of /big that read nothing:
        # what the proxy queues for them, sampled for 10 s
        pid = env.daemon_pid()
        rss = lambda: int([l for l in open('/proc/%d/status' % pid) if l.startswith('VmRSS')][0].split()[1]) // 1024
        base, peak, socks = rss(), 0, []
        for _ in range(400):
            s = socket.create_connection(('127.0.0.1', port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall(('GET /big HTTP/1.1\r\nHost: %s\r\n\r\n' % host).encode())
            socks.append(s)
        for _ in range(20):
            time.sleep(0.5)  # sampling, not waiting for anything
            peak = max(peak, rss())
        for s in socks:
            s.close()
        print('== preview proxy against direct (a static epoll server in the sandbox, bench/staticd.c;')
        print('   wrk -t1 5 s and a 1 GiB download from the host, direct = the same joined to the sandbox\'s netns) ==')
        for conns, p, d in rows:
            print('%2d connection(s)  through the preview URL %8.0f req/s  p50 %5.2f ms  p99 %5.2f ms'
                  % (conns, p[0], p[1], p[2]))
            print('%2d connection(s)  in the sandbox\'s netns   %8.0f req/s  p50 %5.2f ms  p99 %5.2f ms'
                  % (conns, d[0], d[1], d[2]))
            print('%2d connection(s)  ratio                   %8.0f %%      p99 added %+.2f ms'
                  % (conns, 100 * p[0] / d[0], p[2] - d[2]))
        print('1 GiB through the preview URL      %6.0f MB/s (best of 3)' % max(via))
        print('1 GiB in the sandbox\'s netns       %6.0f MB/s (best of 3)  ratio %.0f %%'
              % (max(inside), 100 * max(via) / max(inside)))
        print('the daemon\'s RSS: %d MB, at most %d MB with 400 clients of /big that read nothing' % (base, peak))
        print()
    finally:
        env.close()


def bench_bucket_files(files=2000, rounds=3):
    """Small files written through a bucket mount (a shell loop of `echo >
    f$i`, then until every object is stored; s3rver's objects on a tmpfs),
    against the same loop on the host's disk (where the mount's cache is),
    rounds alternating."""
    from s3server import S3
    env = Env()
    os.makedirs(os.path.join(env.root, 's3data'))
    subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=2g', 'sbx-bench-s3', os.path.join(env.root, 's3data')],
                   check=True)
    s3 = S3(env.root, buckets=('bench',))
    loop = 'cd %s && i=0; while [ $i -lt %d ]; do echo $i > f$i; i=$((i+1)); done'
    try:
        got = {'bucket': [], 'disk': []}
        for r in range(rounds):
            mnt, cache = os.path.join(env.root, 'm%d' % r), os.path.join(env.root, 'c%d' % r)
            os.makedirs(mnt)
            os.makedirs(cache)
            p = spawn_bucketfs(env, s3, mnt, cache, 'r%d' % r)
            wait_mounted(mnt, p)
            t0 = time.perf_counter()
            subprocess.run(['sh', '-c', loop % (mnt, files)], check=True)
            while len(s3.stored_keys('bench', 'r%d/' % r)) < files:
                time.sleep(0.2)  # each look walks the server's files
            got['bucket'].append(files / (time.perf_counter() - t0))
            subprocess.run(['umount', mnt])
            p.wait()
            native = os.path.join(env.root, 'n%d' % r)
            os.makedirs(native)
            subprocess.run(['sync'])
            t0 = time.perf_counter()
            subprocess.run(['sh', '-c', loop % (native, files)], check=True)
            got['disk'].append(files / (time.perf_counter() - t0))
        b, d = statistics.median(got['bucket']), statistics.median(got['disk'])
        print('== %d small files written, until stored (median of %d rounds) ==' % (files, rounds))
        print('through a bucket mount          %8.0f files/s  (%s)' % (b, ', '.join('%.0f' % x for x in got['bucket'])))
        print('on the host\'s disk             %8.0f files/s  (%s)' % (d, ', '.join('%.0f' % x for x in got['disk'])))
        print('ratio (bucket / disk)           %8.2fx' % (b / d))
        print()
    finally:
        s3.close()
        subprocess.run(['umount', '-l', os.path.join(env.root, 's3data')], capture_output=True)
        env.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('what', nargs='?', default='all')
    ap.add_argument('--n', type=int, default=0)
    ap.add_argument('--view-opts', help='view: sbx mount -o OPTS (e.g. nopassthrough)')
    ap.add_argument('--s3-tmpfs', action='store_true', help='buckets: s3rver keeps its objects on a tmpfs')
    a = ap.parse_args()
    env = Env()
    try:
        print('sbx benchmarks on %d cores, kernel %s' % (os.cpu_count(), os.uname().release))
        print()
        if a.what in ('create', 'all'):
            bench_create(env, a.n or 200)
        if a.what in ('wake', 'all'):
            bench_wake(a.n or 50)
        if a.what in ('many', 'all'):
            bench_many(a.n or 1000)
        if a.what in ('disk', 'all'):
            bench_disk()
        if a.what in ('view', 'all'):
            bench_view(opts=a.view_opts)
        if a.what in ('churn', 'all'):
            bench_churn()
        if a.what in ('buckets', 'all'):
            bench_buckets(s3_tmpfs=a.s3_tmpfs)
        if a.what in ('recover', 'all'):
            bench_bucket_recover(a.n or 20000)
        if a.what in ('bucket-far', 'all'):
            bench_bucket_far()
        if a.what in ('bucket-files', 'all'):
            bench_bucket_files(a.n or 2000)
        if a.what in ('code', 'all'):
            bench_code()
        if a.what in ('preview', 'all'):
            bench_preview()
        if a.what in ('exec', 'all'):
            bench_exec(env, a.n or 1000)
        if a.what in ('files', 'all'):
            bench_files(env, a.n or 1000)
        if a.what in ('flood', 'all'):
            bench_flood(env, a.n or 200)
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
