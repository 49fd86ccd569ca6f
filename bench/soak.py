#!/usr/bin/env python3
"""Soak run (not in CI): C clients for S seconds mixing every kind of tool
(exec in bash sessions, files, processes, code contexts, exposed ports,
sandboxes created and destroyed), while one sandbox runs a fork bomb and
another floods output. Afterwards: every call got an answer, and the
daemon's RSS and open fds, mounts and cgroups are back to where they were.

Usage: bench/soak.py [--seconds 600] [--clients 8]   (as root, after scripts/build)"""
import argparse
import glob
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'tests', 'lib'))
from sbxtest import Env  # noqa: E402


def rss_kb(pid):
    for line in open('/proc/%d/status' % pid):
        if line.startswith('VmRSS:'):
            return int(line.split()[1])
    return 0


def fds(pid):
    return len(os.listdir('/proc/%d/fd' % pid))


def mounts():
    return sum(1 for _ in open('/proc/self/mountinfo'))


def cgroups(pid):
    return len(glob.glob('/sys/fs/cgroup/*/**/sbx-%d/**/' % pid, recursive=True))


def worker(env, n, stop, stats, lock):
    c = env.socket_client()
    c.initialize()
    rnd = random.Random(n)
    own = 'soak-%d' % n
    c.ok('createSandbox', {'sandboxId': own})
    c.ok('createSession', {'sandboxId': own, 'id': 's'})
    ops = 0
    errors = []

    def step():
        k = rnd.randrange(12)
        if k == 0:
            c.sh('x=$((${x:-0}+1)); f() { echo $x; }; f', sandbox=own, sessionId='s')
        elif k == 1:
            c.ok('writeFile', {'sandboxId': own, 'path': 'f%d.txt' % rnd.randrange(20), 'content': 'x' * 4096})
        elif k == 2:
            c.ok('listFiles', {'sandboxId': own, 'path': '/workspace'})
        elif k == 3:
            c.call('readFile', {'sandboxId': own, 'path': 'f%d.txt' % rnd.randrange(20)})
        elif k == 4:
            p = c.ok('startProcess', {'sandboxId': own, 'command': 'echo hi; sleep 0.2'})
            c.ok('waitForExit', {'sandboxId': own, 'processId': p['id'], 'timeout': 10000})
        elif k == 5:
            c.sh('seq 1 20000 | sort -r | head -1', sandbox=own, timeout=20000)
        elif k == 6:
            tmp = 'soak-t%d' % n
            c.ok('createSandbox', {'sandboxId': tmp})
            c.sh('echo made > /workspace/m', sandbox=tmp)
            c.ok('destroySandbox', {'sandboxId': tmp})
        elif k == 7:
            r = c.ok('exposePort', {'sandboxId': own, 'port': 8000 + n})
            assert r['url']
            c.ok('unexposePort', {'sandboxId': own, 'port': 8000 + n})
        elif k == 8:
            c.call('runCode', {'sandboxId': own, 'code': '21 * 2', 'language': 'python'}, 60)
        elif k == 9:
            c.sh('cat /proc/meminfo | head -1; nproc', sandbox=own)
        elif k == 10:
            c.ok('listSandboxes')
        else:
            c.call('exec', {'sandboxId': own, 'command': 'sleep 5', 'timeout': 50})

    while not stop.is_set():
        try:
            step()
            ops += 1
        except Exception as e:  # an unanswered or failed call is what the soak looks for
            errors.append(repr(e)[:200])
    c.ok('destroySandbox', {'sandboxId': own})
    c.close()
    with lock:
        stats['ops'] += ops
        stats['errors'] += errors


def abuser(env, stop, cmd, name):
    c = env.socket_client()
    c.initialize()
    c.ok('createSandbox', {'sandboxId': name, 'limits': {'pids': 256, 'memoryMB': 256}})
    while not stop.is_set():
        c.call('exec', {'sandboxId': name, 'command': cmd, 'timeout': 15000, 'maxOutputBytes': 65536}, 120)
    c.ok('destroySandbox', {'sandboxId': name})
    c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--seconds', type=int, default=600)
    ap.add_argument('--clients', type=int, default=8)
    a = ap.parse_args()
    env = Env()
    import socket
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    env.env['SBX_PREVIEW_PORT'] = str(s.getsockname()[1])  # not a preview port someone else holds
    s.close()
    try:
        probe = env.socket_client()
        probe.initialize()
        probe.ok('createSandbox', {'sandboxId': 'warm'})
        probe.sh('true', sandbox='warm')
        probe.ok('destroySandbox', {'sandboxId': 'warm'})
        probe.close()
        pid = env.daemon_pid()
        time.sleep(12)
        before = dict(rss=rss_kb(pid), fds=fds(pid), mounts=mounts(), cgroups=cgroups(pid))
        stop = threading.Event()
        stats = {'ops': 0, 'errors': []}
        lock = threading.Lock()
        threads = [threading.Thread(target=worker, args=(env, i, stop, stats, lock)) for i in range(a.clients)]
        threads += [threading.Thread(target=abuser, args=(env, stop, ':(){ :|:& };:', 'soak-bomb')),
                    threading.Thread(target=abuser, args=(env, stop, 'yes flood | head -c 300M', 'soak-flood'))]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        peak = 0
        while time.monotonic() - t0 < a.seconds:
            time.sleep(5)
            peak = max(peak, rss_kb(pid))
        stop.set()
        for t in threads:
            t.join(300)
        hung = sum(t.is_alive() for t in threads)
        # what the daemon holds settles once sandboxes are torn down
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (mounts() > before['mounts'] or cgroups(pid) > before['cgroups']):
            time.sleep(1)
        time.sleep(12)  # the daemon hands freed memory back every 10 s
        after = dict(rss=rss_kb(pid), fds=fds(pid), mounts=mounts(), cgroups=cgroups(pid))
        print('== soak: %d clients, %d s, a fork bomb and an output flood beside them ==' % (a.clients, a.seconds))
        print('%-28s %d (%d failed or unanswered, %d clients stuck)' % ('calls', stats['ops'], len(stats['errors']), hung))
        for e in stats['errors'][:5]:
            print('  ', e)
        for k in ('rss', 'fds', 'mounts', 'cgroups'):
            unit = ' KiB' if k == 'rss' else ''
            print('%-28s before %8d%s  after %8d%s' % ('daemon ' + k if k in ('rss', 'fds') else k, before[k], unit,
                                                        after[k], unit))
        print('%-28s %8d KiB' % ('daemon peak rss', peak))
        ok = not stats['errors'] and not hung and after['fds'] <= before['fds'] and \
            after['mounts'] <= before['mounts'] and after['cgroups'] <= before['cgroups']
        print('result: %s' % ('nothing lost, nothing leaked' if ok else 'SEE ABOVE'))
        return 0 if ok else 1
    finally:
        env.close()


if __name__ == '__main__':
    sys.exit(main())
