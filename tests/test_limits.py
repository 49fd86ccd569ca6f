"""Limits: a fork bomb stops at pids, a memory hog is killed in its cgroup,
dd stops at diskMB; the daemon and other sandboxes keep answering."""
import os
import sys
import threading
import time

from sbxtest import Env, forks, run_tests, wait_until


class Ctx:
    def __init__(self):
        self.env = Env()
        self.c = self.env.mcp(['--sandbox', 'calm'])
        self.c.initialize()
        self.c.sh('true')  # the bystander exists before the abuse starts
        self.other = self.env.mcp(['--sandbox', 'calm'])
        self.other.initialize()

    def close(self):
        self.env.close()


def while_abusing(x, tool_args, timeout=120):
    """Runs an abusive call on its own connection while the bystander keeps
    calling; returns (abuse result, bystander results)."""
    abuser = x.env.mcp(['--sandbox', 'calm'])
    abuser.initialize()
    out = {}
    th = threading.Thread(target=lambda: out.setdefault('r', abuser.call('exec', tool_args, timeout=timeout)[0]))
    th.start()
    answers = []
    while th.is_alive() and len(answers) < 50:
        r = x.other.ok('exec', {'command': 'echo pong'}, timeout=30)
        answers.append(r['stdout'])
        th.join(0.05)
    th.join(timeout)
    abuser.close()
    return out.get('r'), answers


def test_host_caps(t, x):
    """What an agent may ask for stops at what the host has (or maxLimits
    says), and all sandboxes together leave the host a quarter of its
    tasks: each sandbox's own pids limit does not bound their sum."""
    c = x.c
    for lim, word in (({'memoryMB': 1048576}, 'memoryMB'), ({'pids': 4194304}, 'pids'), ({'diskMB': 1048576}, 'diskMB')):
        res, _ = c.call('createSandbox', {'sandboxId': 'greedy', 'limits': lim})
        e = res['structuredContent'].get('error', {})
        t.ok(e.get('code') == 'RESOURCE_LIMIT' and word in e.get('message', '') and 'maxLimits' in e.get('message', ''),
             'a create asking for more than the host has is refused: %s' % lim, e)
    tasks = [int(open('/proc/sys/kernel/%s' % k).read()) for k in ('pid_max', 'threads-max')]
    import glob
    caps = [open(p).read().strip() for p in glob.glob('/sys/fs/cgroup/**/sbx-%d/pids.max' % x.env.daemon_pid(), recursive=True)]
    t.eq(caps, [str(min(tasks) - min(tasks) // 4)], 'the sandboxes\' parent cgroup holds them to 3/4 of the host\'s tasks')
    env = Env()
    try:
        env.configure('{"maxLimits": {"memoryMB": 512, "pids": 100}}')
        c2 = env.socket_client()
        c2.initialize()
        res, _ = c2.call('createSandbox', {'sandboxId': 'big', 'limits': {'memoryMB': 1024, 'pids': 50}})
        e = res['structuredContent'].get('error', {})
        t.ok(e.get('code') == 'RESOURCE_LIMIT' and '512' in e.get('message', ''), 'maxLimits in the configuration caps it', e)
        r = c2.ok('createSandbox', {'sandboxId': 'fits', 'limits': {'memoryMB': 512, 'pids': 50}})
        t.eq((r['limits']['memoryMB'], r['limits']['pids']), (512, 50), 'and what fits is made')
        r = c2.ok('createSandbox', {'sandboxId': 'some', 'limits': {'pids': 50}})
        t.eq((r['limits']['memoryMB'], r['limits']['pids']), (2048, 50),
             'a limit the call leaves out is the default, which maxLimits does not refuse')
    finally:
        env.close()


def test_fork_bomb(t, x):
    x.c.ok('createSandbox', {'sandboxId': 'bomb', 'limits': {'pids': 64}})
    r, answers = while_abusing(x, {'sandboxId': 'bomb', 'timeout': 5000,
                                   'command': 'bomb() { bomb | bomb & }; bomb; sleep 3; ps -e --no-headers | wc -l'})
    t.ok(r is not None and 'structuredContent' in r, 'the fork bomb call returned a result')
    n = x.c.sh('ps -e --no-headers | wc -l', sandbox='bomb')['stdout'].strip()
    t.ok(int(n) < 64, 'nothing of the bomb survives the call (%s processes)' % n)
    t.ok(answers and all(a == 'pong\n' for a in answers), 'another sandbox answered throughout (%d calls)' % len(answers))
    r = x.c.sh(forks(200, 30), sandbox='bomb', timeout=20000)
    n = int(r['stdout'].strip() or 0)
    t.ok(0 < n < 64, 'forks stop at pids=64 (%d made)' % n)


def test_memory_hog(t, x):
    x.c.ok('createSandbox', {'sandboxId': 'hog', 'limits': {'memoryMB': 64}})
    r, answers = while_abusing(x, {'sandboxId': 'hog', 'command': 'python3 -c "a = bytearray(1024*1024*1024); print(len(a))"'})
    s = r['structuredContent']
    t.ok(s['exitCode'] == 137 and not s['success'], 'the hog is killed (exit %s)' % s['exitCode'])
    t.ok(s.get('oomKilled') is True, 'oomKilled reported')
    t.ok(answers and all(a == 'pong\n' for a in answers), 'daemon kept answering')
    t.eq(x.c.sh('echo still here', sandbox='hog')['stdout'], 'still here\n', 'the sandbox itself survives')


def test_disk(t, x):
    x.c.ok('createSandbox', {'sandboxId': 'disk', 'limits': {'diskMB': 32}})
    r = x.c.sh('dd if=/dev/zero of=/workspace/fill bs=1M count=100 2>&1; echo rc=$?; du -m /workspace/fill | cut -f1',
               sandbox='disk', timeout=60000)
    out = r['stdout']
    t.ok('No space left' in out, 'dd stops with ENOSPC', out)
    mb = int(out.strip().split()[-1])
    t.ok(mb <= 32, 'file bounded by diskMB (%d MB)' % mb)
    r = x.c.sh('touch /usr/bin/zzz 2>&1; echo rc=$?', sandbox='disk')
    res, _ = x.c.call('exec', {'sandboxId': 'disk', 'command': 'seq 1 3000000'}, 60)
    text = res['content'][0]['text']
    t.ok('did not fit' in text and "disk is full" in text and 'full output' not in text,
         'output spilled to a full disk is said to be short, not full', text[-300:])
    x.c.sh('rm -f /workspace/fill', sandbox='disk')
    t.eq(x.c.sh('echo ok > /workspace/after && cat /workspace/after', sandbox='disk')['stdout'], 'ok\n',
         'space is back after deleting')
    x.c.sh('head -c 20000000 /dev/zero > /workspace/half', sandbox='disk')
    t.eq(x.c.err('writeFile', {'sandboxId': 'disk', 'path': '/workspace/big', 'content': 'x' * (20 << 20)}, timeout=60),
         'RESOURCE_LIMIT', 'writeFile past diskMB is RESOURCE_LIMIT')


def test_running_cap(t, x):
    c = x.env.socket_client()
    c.initialize()
    c.ok('createSandbox', {'sandboxId': 'many'})
    for i in range(256):
        c.send({'jsonrpc': '2.0', 'id': 1000 + i, 'method': 'tools/call',
                'params': {'name': 'exec', 'arguments': {'sandboxId': 'many', 'command': 'sleep 300'}}})
    res, _ = c.call('exec', {'sandboxId': 'many', 'command': 'true'}, timeout=60)
    t.ok(res.get('isError') and res['structuredContent']['error']['code'] == 'RESOURCE_LIMIT',
         'the 257th concurrent command is refused with RESOURCE_LIMIT', res)
    t.eq(x.other.ok('exec', {'command': 'echo pong'})['stdout'], 'pong\n', 'other sandboxes are unaffected')
    for i in range(256):
        c.notify('notifications/cancelled', {'requestId': 1000 + i})
    c.close()
    x.c.ok('destroySandbox', {'sandboxId': 'many'})


def test_sessions_cap(t, x):
    # 1,000 sessions asked of one sandbox: a bounded number each with its
    # own shell, the rest refused with a clear error, a freed slot reusable
    c = x.env.socket_client()
    c.initialize()
    codes = {}
    made = []
    for i in range(1000):
        res, _ = c.call('createSession', {'sandboxId': 'sess', 'id': 's%d' % i})
        if res.get('isError'):
            err = res['structuredContent']['error']
            codes[err['code']] = err['message']
        else:
            made.append('s%d' % i)
    t.ok(0 < len(made) <= 64 and list(codes) == ['RESOURCE_LIMIT'],
         '1,000 sessions: at most 64 made, the rest RESOURCE_LIMIT', (len(made), codes))
    outs = set()
    for sid in made:
        c.ok('exec', {'sandboxId': 'sess', 'sessionId': sid, 'command': 'cd /tmp && X=%s' % sid})
    for sid in made[:5] + made[-5:]:
        outs.add(c.ok('exec', {'sandboxId': 'sess', 'sessionId': sid, 'command': 'echo $X $PWD'})['stdout'] == '%s /tmp\n' % sid)
    t.eq(outs, {True}, 'each made session keeps its own state, all shells alive at once')
    c.ok('deleteSession', {'sandboxId': 'sess', 'id': made[0]})
    t.ok(not c.call('createSession', {'sandboxId': 'sess', 'id': 'again'})[0].get('isError'), 'a deleted one frees its slot')
    t.eq(x.other.ok('exec', {'command': 'echo pong'})['stdout'], 'pong\n', 'other sandboxes are unaffected')
    c.ok('destroySandbox', {'sandboxId': 'sess'})
    c.close()


def test_flood(t, x):
    r = x.c.sh('yes flood | head -c 50000000; echo', timeout=60000)
    t.ok(r['truncated'] and len(r['stdout']) < 70000, 'a 50 MB flood is cut at the bound')


def test_sees_its_size(t, x):
    """nproc, /proc/meminfo, free and the cpu count programs read show the
    sandbox's limits, not the host's (as lxcfs does for containers)."""
    import os
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'sized', 'limits': {'memoryMB': 300, 'cpus': 1}})
    r = c.sh('nproc; python3 -c "import os; print(os.cpu_count())"; cat /sys/devices/system/cpu/online; '
             'grep MemTotal /proc/meminfo; free -m | awk \'/^Mem:/ {print $2}\'', sandbox='sized')
    t.eq(r['stdout'].split('\n')[:3], ['1', '1', '0'], 'nproc, os.cpu_count() and cpu/online say 1 cpu', r)
    t.ok('MemTotal:         307200 kB' in r['stdout'] and r['stdout'].split('\n')[4] == '300',
         '/proc/meminfo and free say 300 MB', r['stdout'])
    c.ok('startProcess', {'sandboxId': 'sized', 'processId': 'hold',
                          'command': 'python3 -c "import time; x = bytearray(120 << 20); print(1, flush=True); time.sleep(300)"'})
    c.ok('waitForLog', {'sandboxId': 'sized', 'processId': 'hold', 'pattern': '1', 'timeout': 30000})
    used = int(c.sh("free -m | awk '/^Mem:/ {print $3}'", sandbox='sized')['stdout'])
    t.ok(120 <= used < 300, 'free counts what the sandbox uses (%d MB with 120 MB held)' % used)
    r = c.sh('echo x > /proc/meminfo', sandbox='sized')
    t.ok(r['exitCode'] != 0, 'and the sandbox cannot write what it reads there')
    if os.cpu_count() > 1:
        c.ok('createSandbox', {'sandboxId': 'wide', 'limits': {'cpus': os.cpu_count()}})
        r = c.sh('nproc', sandbox='wide')
        t.eq(r['stdout'].strip(), str(os.cpu_count()), 'a sandbox with every cpu sees them all')
    c.ok('destroySandbox', {'sandboxId': 'sized'})


def test_meminfo_follows(t, x):
    """/dev/shm's files are memory the sandbox cannot get back, /dev is
    half its memory (ENOSPC before an OOM kill), and what a command reads
    in /proc/meminfo follows its memory while it runs."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'shm', 'limits': {'memoryMB': 256}})
    r = c.sh("df -m /dev/shm | awk 'NR == 2 {print $2}'", sandbox='shm')
    t.eq(r['stdout'].strip(), '128', '/dev and /dev/shm are half of memoryMB', r)
    c.sh('head -c 60M /dev/zero > /dev/shm/blob', sandbox='shm')
    r = c.sh("awk '/^(MemTotal|MemAvailable|Shmem):/ {print $2}' /proc/meminfo", sandbox='shm')
    total, avail, shmem = (int(v) for v in r['stdout'].split())
    t.ok(shmem >= 60 << 10 and avail <= total - (60 << 10), 'a file in /dev/shm is Shmem and not available '
         '(total %d, available %d, shmem %d kB)' % (total, avail, shmem))
    r = c.sh('head -c 200M /dev/zero > /dev/shm/big; echo rc=$?; rm -f /dev/shm/*', sandbox='shm')
    t.ok(r['exitCode'] == 0 and 'No space left' in r['stderr'] and 'rc=1' in r['stdout'],
         'filling /dev/shm is ENOSPC, not an OOM kill', r)
    grow = '\n'.join([
        "import time",
        "def avail():",
        "    with open('/proc/meminfo') as f:",
        "        return next(int(l.split()[1]) for l in f if l.startswith('MemAvailable:'))",
        "before = avail()",
        "held = bytearray(100 << 20)",
        "for i in range(0, len(held), 4096):",
        "    held[i] = 1",
        "deadline = time.monotonic() + 20",
        "while avail() > before - (90 << 10) and time.monotonic() < deadline:",
        "    time.sleep(0.1)",
        "print('followed' if avail() <= before - (90 << 10) else 'stale', before, avail())"])
    r = c.sh("python3 - <<'EOF'\n" + grow + "\nEOF", sandbox='shm', timeout=60000)
    t.ok(r['stdout'].startswith('followed'), 'a command sees its own memory in /proc/meminfo as it grows', r)
    c.ok('destroySandbox', {'sandboxId': 'shm'})


def test_limits_after_destroy(t, x):
    """A sandbox made after others were destroyed has its own limits, its
    own memory count and its own OOM record, whichever memory cgroup it gets
    (with cgroup v1 the daemon empties those of destroyed sandboxes and
    keeps a few for the next ones)."""
    import glob
    import re
    c = x.c
    v1 = os.path.isdir('/sys/fs/cgroup/memory')
    spares = '/sys/fs/cgroup/memory/**/sbx-%d/spare-*' % x.env.daemon_pid()

    def emptying(zombies=False):
        """Emptying children of the daemon still running (zombies are done,
        unless asked for)."""
        n = 0
        for st in glob.glob('/proc/[0-9]*/stat'):
            try:
                with open(st) as f:
                    f = f.read()
            except OSError:
                continue
            comm, rest = f[f.index('(') + 1:f.rindex(')')], f[f.rindex(')') + 2:].split()
            n += comm == 'sbx-cg-empty' and (zombies or rest[0] != 'Z') and int(rest[1]) == x.env.daemon_pid()
        return n

    def usage(d):
        try:
            with open(d + '/memory.usage_in_bytes') as f:
                return int(f.read())
        except OSError:
            return None

    seen = set()  # spares kept: the next sandboxes take them (a create, or one made ahead meanwhile)
    for i, mb in enumerate((64, 512, 64, 512)):
        sid = 'again%d' % i
        c.ok('createSandbox', {'sandboxId': sid, 'limits': {'memoryMB': mb}})
        r = c.sh('grep MemTotal /proc/meminfo; free -m | awk \'/^Mem:/ {print $3}\'', sandbox=sid)
        t.ok(re.search(r'MemTotal: +%d kB' % (mb * 1024), r['stdout']), '%s sees %d MB' % (sid, mb), r['stdout'])
        used = int(r['stdout'].split('\n')[1])
        t.ok(used < 48, '%s starts with little memory used (%d MB)' % (sid, used))
        r = c.call('exec', {'sandboxId': sid, 'command': 'python3 -c "a = bytearray(200 << 20); print(len(a))"'})[0]
        s = r['structuredContent']
        if mb == 64:
            t.ok(s['exitCode'] == 137 and s.get('oomKilled') is True, '200 MB is killed in %s (64 MB)' % sid, s)
        else:
            t.ok(s['exitCode'] == 0 and s.get('oomKilled') is not True, '200 MB fits in %s (512 MB)' % sid, s)
        r = c.sh('true', sandbox=sid)
        t.ok(r['exitCode'] == 0 and r.get('oomKilled') is not True, 'the next command of %s is not called OOM-killed' % sid)
        c.ok('destroySandbox', {'sandboxId': sid})
        if v1:
            wait_until(lambda: not emptying() and any((usage(d) or 1 << 30) < 1 << 20 for d in glob.glob(spares, recursive=True)),
                       what='the memory cgroup of %s emptied and kept' % sid)
            seen |= set(glob.glob(spares, recursive=True))
    if v1:
        taken = seen - set(glob.glob(spares, recursive=True))
        t.ok(taken, 'the emptied memory cgroups of destroyed sandboxes serve the next sandboxes (%d of %d kept were taken)'
             % (len(taken), len(seen)))
        wait_until(lambda: not emptying(zombies=True), what='the emptying children reaped (no zombie left)')
        t.ok(True, 'the children that emptied memory cgroups are reaped, none left a zombie')


if __name__ == '__main__':
    sys.exit(run_tests([test_host_caps, test_fork_bomb, test_memory_hog, test_disk, test_running_cap, test_sessions_cap, test_flood, test_sees_its_size,
                        test_meminfo_follows, test_limits_after_destroy], Ctx))
