"""Durable sandboxes: the disk is on the host's disk with a hard quota
(not memory), and a daemon that stops or is killed loses no sandbox and no
file: the next one finds every sandbox, its files and sessions, and the
first call after says restarted: true. `sbx mcp` outlives the daemon. The
configuration file is read and checked."""
import json
import os
import shutil
import time
import signal
import subprocess
import sys
import threading

from sbxtest import SBX, Env, Fail, children, comm_of, forks, gone, hostname_of, inits_of, run_tests, wait_until


class Ctx:
    def __init__(self):
        self.env = Env()
        self.c = self.env.mcp(['--sandbox', 'dur'])
        self.c.initialize()

    def close(self):
        self.env.close()


def test_disk_is_disk(t, x):
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'big', 'limits': {'memoryMB': 512, 'diskMB': 4096}})
    r = c.sh('df -m /workspace | tail -1', sandbox='big')
    size_mb = int(r['stdout'].split()[1])
    t.ok(3900 <= size_mb <= 4096, 'df inside shows the 4096 MB quota (%d MB)' % size_mb, r)
    r = c.sh('dd if=/dev/zero of=/workspace/3g bs=1M count=3072 status=none; echo rc=$?; du -m /workspace/3g | cut -f1',
             sandbox='big', timeout=300000)
    out = r['stdout'].split()
    t.ok(out[0] == 'rc=0' and 3072 <= int(out[1]) < 3100, 'a 3 GiB file is written with memoryMB 512 (disk, not memory)', r)
    t.ok(not r.get('oomKilled'), 'no OOM kill')
    r = c.sh('dd if=/dev/zero of=/workspace/more bs=1M count=2048 2>&1; echo rc=$?', sandbox='big', timeout=300000)
    t.ok('No space left on device' in r['stdout'] and 'rc=1' in r['stdout'] and not r.get('oomKilled'),
         'past the quota: ENOSPC, never an OOM kill', r['stdout'][-300:])
    r = c.sh('rm -f /workspace/more /workspace/3g && echo still usable > /workspace/ok && cat /workspace/ok',
             sandbox='big')
    t.eq(r['stdout'], 'still usable\n', 'the sandbox stays usable at the quota')
    img = os.path.join(x.env.state, 'sandboxes', 'big', 'disk.img')
    t.ok(os.path.exists(img), 'the disk is an image in the state dir')
    c.ok('destroySandbox', {'sandboxId': 'big'})
    t.ok(not os.path.exists(os.path.dirname(img)), 'destroy removes the disk and the record')


def test_spills_on_disk(t, x):
    c = x.c
    for i in range(18):
        r = c.sh('head -c 100000 /dev/zero | tr "\\0" x', sandbox='spill', maxOutputBytes=1024)
    t.ok(r.get('outputPath', '').startswith('/tmp/sbx-output/'), 'the full output is saved in the sandbox', r)
    n = c.sh('ls /tmp/sbx-output | wc -l', sandbox='spill')['stdout'].strip()
    t.eq(n, '16', 'only the newest 16 spilled outputs are kept')
    t.eq(c.sh('wc -c < %s' % r['outputPath'], sandbox='spill')['stdout'].strip(), '100000', 'whole')


def restart_check(t, x, how):
    """Files synced before the daemon went away are there after, the
    session's cwd and environment too, and the first call says restarted."""
    c = x.c
    sid = 'keep-' + how
    c.ok('createSandbox', {'sandboxId': sid, 'env': {'OPT': 'kept'}})
    c.sh('mkdir -p /workspace/proj && cd /workspace/proj && export TOKEN=abc; plain=p; hi() { echo fn; }', sandbox=sid)
    c.sh('seq 1 100000 > data.txt && sync data.txt', sandbox=sid)
    p = c.ok('startProcess', {'sandboxId': sid, 'processId': 'writer',
                              'command': 'i=0; while :; do echo $i >> /workspace/log.txt; i=$((i+1)); done'})
    t.eq(p['status'], 'running', '%s: a writer runs while the daemon goes' % how)
    wait_until(lambda: c.sh('test -s /workspace/log.txt && echo y', sandbox=sid)['stdout'] == 'y\n', 30,
               'the writer to have written')
    old = x.env.daemon_pid()
    inits = children(old, 'sbx-init')
    t.ok(len(inits) >= 1, '%s: the sandbox has its init' % how)
    if how == 'kill':
        os.kill(old, signal.SIGKILL)
    else:
        r = x.env.run(['daemon', 'stop'])
        t.ok(r.returncode == 0 and b'stopped the sbx daemon' in r.stdout and b'kept' in r.stdout,
             'sbx daemon stop says what it did', r.stdout + r.stderr)
    wait_until(lambda: all(gone(p) for p in inits), 30, 'the old sandboxes to end')
    t.ok(True, '%s: nothing of the old sandboxes runs unowned' % how)
    res, _ = c.call('exec', {'sandboxId': sid, 'command': 'pwd; echo $TOKEN $OPT $plain; hi; wc -l < data.txt; '
                             'test -s /workspace/log.txt && echo log'}, timeout=60)
    s = res['structuredContent']
    t.ok(not res.get('isError'), '%s: the client\'s next call works (a new daemon started)' % how, res)
    t.eq(s.get('stdout'), '/workspace/proj\nabc kept p\nfn\n100000\nlog\n',
         '%s: files, cwd, environment and the shell\'s variables and functions are back' % how)
    t.eq((s.get('restarted'), s.get('reset')), (True, None), '%s: restarted: true, not reset' % how)
    t.ok('restarted' in res['content'][0]['text'], '%s: the text says so too' % how)
    new = x.env.daemon_pid()
    t.ok(new and new != old, '%s: it is another daemon' % how)
    # removed by the new daemon once the killed processes have left them:
    # a moment on a loaded host
    old_cgs = cgroup_dirs(old)
    t.ok(wait_until(lambda: not any(os.path.isdir(d) for d in old_cgs), 20, 'the old cgroups to go'),
         '%s: the old daemon\'s cgroups are gone' % how)
    r = c.sh('true', sandbox=sid)
    t.ok('restarted' not in r, '%s: only the first call says so' % how)


def cgroup_dirs(pid):
    import glob
    return glob.glob('/sys/fs/cgroup/*/**/sbx-%d' % pid, recursive=True)


def test_kill_9(t, x):
    restart_check(t, x, 'kill')


def test_daemon_stop(t, x):
    restart_check(t, x, 'stop')


def test_init_killed(t, x):
    """A sandbox whose init is killed from the host (or by the kernel)
    starts again on its next call, as after a daemon restart: files and
    session state kept, restarted: true; before, every call failed."""
    c = x.c
    c.sh('echo kept > /workspace/k.txt; cd /tmp; export KEPT=yes', sandbox='ik')
    inits = inits_of(x.env.daemon_pid(), 'ik')
    t.eq(len(inits), 1, 'the sandbox\'s init runs on the host')
    os.kill(inits[0], signal.SIGKILL)
    t.ok(wait_until(lambda: gone(inits[0]), 10, 'the init to go'), 'killed from the host')
    res, _ = c.call('exec', {'sandboxId': 'ik', 'command': 'cat /workspace/k.txt; pwd; echo $KEPT'})
    s = res.get('structuredContent', {})
    t.eq((s.get('stdout'), s.get('exitCode')), ('kept\n/tmp\nyes\n', 0),
         'the next call runs, with its files, cwd and environment', s)
    t.eq((s.get('restarted'), s.get('reset')), (True, None), 'and says restarted: true')
    t.eq(c.sh('echo again', sandbox='ik')['stdout'], 'again\n', 'the calls after it run as usual')


def spawner_of(d, killed=()):
    """The daemon's one spawner: a new one, not in killed."""
    def new():
        return [p for p in children(d, 'sbx-spawner') if p not in killed and not gone(p)]
    wait_until(new, 30, 'a new spawner')
    return new()[0]


def test_spawner_killed(t, x):
    """The daemon's spawner (the small process that forks the sandboxes'
    inits for it) killed from the host, each time at the worst moment
    (right after it cloned an init, before any answer of its own: strace
    kills it as it enters its next system call), while creates run: every
    create and exec works, with one init each that is the daemon's own
    child; nothing is left unreaped; a new spawner takes over each time.
    Before, the daemon cloned the init a second time on the same socket and
    the create failed."""
    c = x.c
    d = x.env.daemon_pid()
    sp = spawner_of(d)
    c.ok('createSandbox', {'sandboxId': 'sp-before'})
    t.eq(len(inits_of(d, 'sp-before')), 1, "a sandbox's init is the daemon's child")
    killed = []
    for i in range(3):
        name = 'sp-%d' % i
        # the spawner's next system call after its clone is a close (of the
        # descriptors it was sent)
        st = subprocess.Popen(['strace', '-qq', '-o', '/dev/null', '-e', 'trace=close', '-e', 'inject=close:signal=KILL',
                               '-p', str(sp)], stderr=subprocess.PIPE)
        try:
            wait_until(lambda: open('/proc/%d/status' % sp).read().find('TracerPid:\t%d' % st.pid) >= 0, 30,
                       'strace to attach')
            # not the kind made ahead: cloned during the call
            res, _ = c.call('createSandbox', {'sandboxId': name, 'limits': {'memoryMB': 256 + i}})
        finally:
            st.wait(30)
        t.ok(gone(sp), 'the spawner was killed during the create (%d)' % i)
        killed.append(sp)
        t.ok(not res.get('isError'), 'the create worked (%d)' % i, res)
        t.eq(c.sh('hostname', sandbox=name)['stdout'], name + '\n', 'its commands run (%d)' % i)
        t.eq(len(inits_of(d, name)), 1, "it has one init, the daemon's child (%d)" % i)
        sp = spawner_of(d, killed)
        c.ok('destroySandbox', {'sandboxId': name})
    t.eq(c.sh('echo still', sandbox='sp-before')['stdout'], 'still\n', 'the sandbox made before still runs')

    def unreaped():
        return [p for p in os.listdir('/proc') if p.isdigit() and gone(int(p)) and int(p) in children(d, 'sbx-spawner')]
    t.ok(wait_until(lambda: not unreaped(), 30, 'no zombie'), 'no child of the daemon is left unreaped')
    t.eq(children(d, 'sbx-spawner'), [sp], 'one spawner serves, a new one')
    c.ok('createSandbox', {'sandboxId': 'sp-last', 'limits': {'memoryMB': 300}})
    t.eq(len(inits_of(d, 'sp-last')), 1, "and its inits are the daemon's children")
    for name in ('sp-before', 'sp-last'):
        c.ok('destroySandbox', {'sandboxId': name})


def test_spawner_child_late(t, x):
    """A child of the spawner that tells the daemon it exists only after its
    request was given up (strace holds its first system call 9 s; the
    daemon gives up after 5 s, kills the spawner and waits 2 s more for the
    hang-up its child prevents): the call fails saying so, the daemon does
    not clone a second init for it, the late child is killed when it tells
    and nothing is left unreaped; the next calls work."""
    c = x.c
    d = x.env.daemon_pid()
    sp = spawner_of(d)
    st = subprocess.Popen(['strace', '-f', '-qq', '-o', '/dev/null', '-e', 'trace=sendto',
                           '-e', 'inject=sendto:delay_enter=9000000', '-p', str(sp)], stderr=subprocess.PIPE)
    try:
        wait_until(lambda: open('/proc/%d/status' % sp).read().find('TracerPid:\t%d' % st.pid) >= 0, 30,
                   'strace to attach')
        t0 = time.monotonic()
        res, _ = c.call('createSandbox', {'sandboxId': 'late', 'limits': {'memoryMB': 260}})
        took = time.monotonic() - t0
    finally:
        st.wait(60)
    msg = res.get('structuredContent', {}).get('error', {}).get('message', '')
    t.ok(res.get('isError') and 'temporarily unavailable' in msg, 'the create fails, saying why', res)
    t.ok(took < 30, 'within the time the daemon gives the spawner', took)
    new = spawner_of(d, [sp])
    t.ok(gone(sp), 'the spawner that did not answer was killed')

    def unreaped():
        return [p for p in os.listdir('/proc') if p.isdigit() and int(p) in children(d, 'sbx-init') + children(d, 'sbx-spawner')
                and gone(int(p))]
    t.ok(wait_until(lambda: not unreaped() and not inits_of(d, 'late'), 30, 'the late child to be gone'),
         'the late child was killed when it told, and reaped')
    t.eq(c.sh('hostname', sandbox='late2')['stdout'], 'late2\n', 'the next calls work')
    t.eq(children(d, 'sbx-spawner'), [new], 'with a new spawner')
    c.ok('destroySandbox', {'sandboxId': 'late2'})


def test_listed_after_restart(t, x):
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'listed'})
    x.env.run(['daemon', 'stop'])
    r = x.env.run(['ls'])
    t.ok(b'listed' in r.stdout and b'stopped' in r.stdout, 'a new daemon lists every sandbox (stopped)', r.stdout)
    c.sh('true', sandbox='listed')
    used = {s['sandboxId']: s['lastActivity'] for s in c.ok('listSandboxes')['sandboxes']}['listed']
    x.env.run(['daemon', 'stop'])
    deadline = time.monotonic() + 5
    while time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime()) <= used[:19] and time.monotonic() < deadline:
        time.sleep(0.05)  # the clock past the second of that use: a restart time would differ from it
    after = {s['sandboxId']: s['lastActivity'] for s in c.ok('listSandboxes')['sandboxes']}['listed']
    t.eq(after, used, 'and says when each was last used, not when the new daemon started')


def test_processes_listed_after_restart(t, x):
    """The next daemon lists the processes of the one before: those that
    ended as they ended, those that ran as killed with it; new ones are
    not named after old ones."""
    c = x.c
    c.ok('startProcess', {'sandboxId': 'pr', 'processId': 'srv', 'command': 'exec sleep 1000'})
    first = c.ok('startProcess', {'sandboxId': 'pr', 'command': 'exit 3'})['id']
    c.ok('waitForExit', {'sandboxId': 'pr', 'processId': first, 'timeout': 20000}, 40)
    c.ok('startProcess', {'sandboxId': 'pr', 'processId': 'proc-18446744073709551615', 'command': 'true'})
    x.env.run(['daemon', 'stop'])
    # what a hand (or a bug) may have put in the record: more than 64, an
    # older duplicate of srv, times and codes out of range, a path elsewhere
    path = os.path.join(x.env.state, 'sandboxes', 'pr', 'record.json')
    rec = json.load(open(path))
    rec['processes'] += [{'id': 'srv', 'command': 'fake', 'status': 'completed', 'exitCode': 0, 'startTime': 1,
                          'endTime': 2},
                         {'id': 'odd', 'command': 'x', 'status': 'completed', 'exitCode': 1 << 40, 'startTime': 5,
                          'endTime': 6, 'outputPath': '/etc/shadow'},
                         {'id': 'when', 'command': 'x', 'status': 'failed', 'exitCode': 1, 'startTime': -1}] + \
        [{'id': 'f%d' % i, 'command': 'x', 'status': 'completed', 'exitCode': 0, 'startTime': 7, 'endTime': 8}
         for i in range(70)]
    with open(path, 'w') as f:
        json.dump(rec, f)
    listed = {p['id']: p for p in c.ok('listProcesses', {'sandboxId': 'pr'})['processes']}
    t.ok(len(listed) <= 64 and 'when' not in listed and listed.get('odd', {}).get('status') == 'killed'
         and listed['odd'].get('exitCode') == 137, 'a record past 64 processes, with times or codes out of range, '
         'is read within bounds', sorted(listed)[:8])
    t.ok('outputPath' not in c.ok('getProcessLogs', {'sandboxId': 'pr', 'processId': 'odd'}),
         'an output path outside where sbx spills is not taken from a record')
    t.ok(listed.get('srv', {}).get('status') == 'killed' and listed['srv'].get('exitCode') == 137,
         'a process that ran when the daemon stopped is listed as killed with it', listed)
    t.ok(listed.get(first, {}).get('status') == 'failed' and listed[first].get('exitCode') == 3 and listed[first].get('endTime'),
         'one that had ended, as it ended', listed)
    again = c.ok('startProcess', {'sandboxId': 'pr', 'command': 'true'})['id']
    t.ok(again != first and again not in listed and again.startswith('proc-'),
         'a new process is not named after an old one, a huge proc-N number neither: %s, %s' % (first, again))
    c.ok('destroySandbox', {'sandboxId': 'pr'})


def test_made_ahead(t, x):
    """A create with the default options takes the sandbox the daemon made
    ahead: it has its own name everywhere; the one made ahead is never
    listed and does not outlive its daemon."""
    c = x.c
    sandboxes = os.path.join(x.env.state, 'sandboxes')

    def ahead():
        return sorted(d for d in os.listdir(sandboxes) if d.startswith('_ahead-'))
    old = x.env.daemon_pid()

    def all_running():  # a made-ahead sandbox's directory is there a moment before its init
        running = sum(s['status'] == 'running' for s in c.ok('listSandboxes')['sandboxes'])
        return ahead() and len(children(old, 'sbx-init')) >= running + len(ahead())
    wait_until(all_running, 30, 'a sandbox made ahead, running')
    before = ahead()
    inits = children(old, 'sbx-init')
    c.ok('createSandbox', {'sandboxId': 'took'})
    t.eq(len(set(before) - set(ahead())), 1, 'the create took a sandbox made ahead', repr((before, ahead())))


    took = inits_of(old, 'took')
    t.ok(len(took) == 1 and took[0] in inits, 'its init was running before the create', (took, inits))
    r = c.sh('hostname; cat /etc/hostname; grep -c "127.0.1.1.took$" /etc/hosts; domainname', sandbox='took')
    t.eq(r['stdout'], 'took\ntook\n1\nsbx\n', 'it has its own name: hostname, /etc/hostname, /etc/hosts')
    ids = [s['sandboxId'] for s in c.ok('listSandboxes')['sandboxes']]
    t.ok('took' in ids and not any(i.startswith('_') for i in ids), 'only real sandboxes are listed', ids)
    t.ok(b'_ahead' not in x.env.run(['ls']).stdout, 'sbx ls does not show it either')
    wait_until(ahead, 30, 'the next sandbox made ahead')
    left = ahead()
    inits = children(old, 'sbx-init')
    # stopped, the spawner cannot see its socket's hang-up: it must die
    # with the daemon all the same (its parent-death signal, which a change
    # of its effective uid clears, is set again after each)
    spawners = children(old, 'sbx-spawner')
    for p in spawners:
        os.kill(p, signal.SIGSTOP)
    os.kill(old, signal.SIGKILL)
    wait_until(lambda: all(gone(p) for p in inits), 30, 'the old sandboxes to end')
    t.ok(True, 'the sandbox made ahead ends with its daemon')
    t.ok(wait_until(lambda: all(gone(p) for p in spawners), 30, 'the spawner to end'),
         'the spawner too, even stopped', spawners)
    c.sh('true', sandbox='took', wait=60)
    t.ok(not set(left) & set(ahead()), "the next daemon removes the dead one's directory", (left, ahead()))
    c.ok('destroySandbox', {'sandboxId': 'took'})


def test_made_ahead_other_limits(t, x):
    """A create with other limits than the defaults takes a sandbox made
    ahead too, and has its own limits: its cgroup's, what nproc,
    /proc/meminfo and cpu/online say in it, and its record's."""
    c = x.c
    sandboxes = os.path.join(x.env.state, 'sandboxes')

    def ahead():
        return sorted(d for d in os.listdir(sandboxes) if d.startswith('_ahead-'))

    def cgroup_limits(pid):
        """memory (bytes), pids and cpu quota (us a 100 ms period) of its
        cgroup, v1 or v2"""
        paths = {}
        with open('/proc/%d/cgroup' % pid) as f:
            for line in f:
                _, ctrls, path = line.rstrip('\n').split(':', 2)
                for ctrl in ctrls.split(',') if ctrls else ['']:
                    paths[ctrl] = path

        def read(ctrl, name):
            base = '/sys/fs/cgroup/%s%s' % (ctrl + '/' if ctrl else '', paths[ctrl])
            with open(os.path.join(base, name)) as g:
                return g.read().strip()
        if 'memory' not in paths:  # v2
            return read('', 'memory.max'), read('', 'pids.max'), read('', 'cpu.max').split()[0]
        return (read('memory', 'memory.limit_in_bytes'), read('pids', 'pids.max'),
                read('cpu', 'cpu.cfs_quota_us'))

    ncpu = len(os.sched_getaffinity(x.env.daemon_pid()))
    for sid, lim in (('big', {'memoryMB': 1024, 'cpus': 2, 'pids': 300}),
                     ('small', {'memoryMB': 512, 'cpus': 0.5, 'pids': 64})):
        wait_until(ahead, 30, 'a sandbox made ahead')
        before = ahead()
        c.ok('createSandbox', {'sandboxId': sid, 'limits': lim})
        t.eq(len(set(before) - set(ahead())), 1, '%s took a sandbox made ahead' % sid, repr((before, ahead())))
        init = inits_of(x.env.daemon_pid(), sid)[0]
        t.eq(cgroup_limits(init), (str(lim['memoryMB'] << 20), str(lim['pids']), str(int(lim['cpus'] * 100000))),
             '%s: its cgroup has its memory, pids and cpu limits' % sid)
        n = min(-(-lim['cpus'] // 1), ncpu)
        r = c.sh('nproc; grep MemTotal /proc/meminfo; cat /sys/devices/system/cpu/online', sandbox=sid)
        t.eq([l.split() for l in r['stdout'].split('\n')[:3]],
             [[str(int(n))], ['MemTotal:', str(lim['memoryMB'] << 10), 'kB'], ['0' if n == 1 else '0-%d' % (n - 1)]],
             '%s: nproc, /proc/meminfo and cpu/online say its size' % sid)
        with open(os.path.join(sandboxes, sid, 'record.json')) as f:
            kept = json.load(f)['options']['limits']
        t.eq((kept['memoryMB'], kept['cpus'], kept['pids']), (lim['memoryMB'], lim['cpus'], lim['pids']),
             '%s: its record keeps them' % sid)
        c.ok('destroySandbox', {'sandboxId': sid})


def test_relay_survives(t, x):
    c = x.env.mcp(['--sandbox', 'relay'])
    c.initialize()
    c.request('logging/setLevel', {'level': 'info'})
    c.sh('echo one > /workspace/f')
    out = {}
    th = threading.Thread(target=lambda: out.setdefault('r', c.call('exec', {'command': 'sleep 60'}, timeout=90)[0]))
    th.start()
    wait_until(lambda: any(comm_of(p) == 'sleep' and hostname_of(p) == 'relay' for p in os.listdir('/proc') if p.isdigit()),
               30, 'the sleep to run')
    stop = subprocess.Popen([SBX, 'daemon', 'stop'], env=x.env.env, stdout=subprocess.DEVNULL)
    th.join(30)
    r = out.get('r')
    t.ok(r and r.get('isError') and 'daemon' in r['structuredContent']['error']['message'],
         'a call in flight gets a clear error, not silence', r)
    # sent at once, while the old daemon may still be stopping: the new one
    # waits for it
    r = c.sh('cat /workspace/f')
    stop.wait(60)
    t.eq(r['stdout'], 'one\n', 'the same sbx mcp client keeps working across the restart, at once')
    t.ok(c.p.poll() is None, 'sbx mcp did not exit')
    t.ok(c.request('ping').get('result') == {}, 'and answers pings')


def test_relay_survives_upgrade(t, x):
    """sbx replaced on disk while an agent's sbx mcp runs (an upgrade: a new
    file renamed over it), then the daemon gone: the relay starts the sbx
    now at that path (it used to exec its own deleted binary's path, fail
    without a word, and leave the agent with no daemon)."""
    bindir = os.path.join(x.env.root, 'upgrade')
    os.makedirs(bindir)
    for name in ('sbx', 'sbx-init'):
        shutil.copy2(os.path.join(os.path.dirname(SBX), name), bindir)
    old_sbx, x.env.sbx = x.env.sbx, os.path.join(bindir, 'sbx')
    try:
        x.env.run(['daemon', 'stop'])
        c = x.env.mcp(['--sandbox', 'upg'])
        c.initialize()
        c.sh('echo kept > /workspace/f')
        shutil.copy2(SBX, x.env.sbx + '.new')
        os.rename(x.env.sbx + '.new', x.env.sbx)
        pid = x.env.daemon_pid()
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: gone(pid), 30, 'the daemon to end')
        res, _ = c.call('exec', {'command': 'cat /workspace/f'})
        if res.get('isError') and 'send it again' in res['structuredContent']['error']['message']:
            res, _ = c.call('exec', {'command': 'cat /workspace/f'})  # sent as the relay saw the daemon go
        r = res['structuredContent']
        t.eq((r['stdout'], r.get('restarted')), ('kept\n', True), 'the next call starts a daemon, and the sandbox with its files')
        t.eq(os.readlink('/proc/%d/exe' % x.env.daemon_pid()), x.env.sbx, 'the sbx now at that path')
    finally:
        x.env.sbx = old_sbx


def test_agent_not_reading(t, x):
    """An agent that stops reading sbx mcp's stdout while big replies pile
    up: past 256 MiB waiting, the daemon drops the connection (its memory
    stays bounded); the calls in flight fail saying why, not that the daemon
    stopped, and the next call works."""
    x.c.sh('head -c 12000000 /dev/zero | tr "\\0" a > /workspace/big', sandbox='nr')
    p = subprocess.Popen([SBX, 'mcp', '--sandbox', 'nr'], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=x.env.env)
    try:
        msgs = [{'jsonrpc': '2.0', 'id': 1, 'method': 'initialize',
                 'params': {'protocolVersion': '2025-06-18', 'capabilities': {}, 'clientInfo': {'name': 't', 'version': '1'}}},
                {'jsonrpc': '2.0', 'method': 'notifications/initialized'}]
        reads = list(range(10, 40))  # 30 replies of 12 MB and more: past the daemon's 256 MiB
        msgs += [{'jsonrpc': '2.0', 'id': i, 'method': 'tools/call', 'params': {'name': 'readFile', 'arguments': {'path': 'big'}}}
                 for i in reads]
        p.stdin.write(''.join(json.dumps(m) + '\n' for m in msgs).encode())
        p.stdin.flush()
        log = os.path.join(x.env.state, 'daemon.log')
        t.ok(wait_until(lambda: 'dropping a client that does not read' in open(log).read(), 120, 'the drop'),
             'the daemon drops a client that leaves its replies unread')
        answers = {}

        def read_answers():
            for line in p.stdout:
                m = json.loads(line)
                if 'id' in m:
                    answers[m['id']] = m
                if all(i in answers for i in reads):
                    return
        th = threading.Thread(target=read_answers, daemon=True)
        th.start()
        th.join(120)
        t.ok(all(i in answers for i in reads), 'every call in flight is answered once the agent reads again',
             sorted(answers))
        errs = [a['result']['structuredContent']['error']['message'] for a in answers.values()
                if a.get('result', {}).get('isError')]
        t.ok(errs and all('dropped this connection' in e and 'read' in e and 'stopped' not in e for e in errs),
             'those the daemon did not answer fail saying it dropped a connection whose replies were not read', errs[:2])
        p.stdin.write((json.dumps({'jsonrpc': '2.0', 'id': 50, 'method': 'tools/call',
                                   'params': {'name': 'exec', 'arguments': {'command': 'echo again'}}}) + '\n').encode())
        p.stdin.flush()
        line = p.stdout.readline()
        t.ok(json.loads(line)['result']['structuredContent']['stdout'] == 'again\n', 'and the next call works',
             line[:300])
    finally:
        p.kill()
        p.wait()


def test_stdin_closed_early(t, x):
    """Requests written before stdin closes are all answered."""
    reqs = [{'jsonrpc': '2.0', 'id': 1, 'method': 'initialize',
             'params': {'protocolVersion': '2025-06-18', 'capabilities': {}, 'clientInfo': {'name': 't', 'version': '1'}}},
            {'jsonrpc': '2.0', 'method': 'notifications/initialized'},
            {'jsonrpc': '2.0', 'id': 2, 'method': 'tools/call',
             'params': {'name': 'exec', 'arguments': {'sandboxId': 'early', 'command': 'sleep 0.3; echo late'}}}]
    data = ''.join(json.dumps(m) + '\n' for m in reqs).encode()
    p = subprocess.run([SBX, 'mcp'], input=data, capture_output=True, env=x.env.env, timeout=60)
    msgs = [json.loads(line) for line in p.stdout.decode().splitlines()]
    ids = [m.get('id') for m in msgs]
    t.ok(1 in ids and 2 in ids, 'both requests answered before sbx mcp exits', p.stdout[-500:])
    last = [m for m in msgs if m.get('id') == 2]
    t.ok(last and last[0]['result']['structuredContent']['stdout'] == 'late\n', 'with the real result')


FORKS = forks(150, 5)


def test_config(t, x):
    env = Env()
    try:
        cfg = env.configure('{"maxSandboxes": 2, "limits": {"memoryMB": "lots"}}')
        r = env.run(['daemon'], timeout=30)
        err = r.stderr.decode()
        t.ok(r.returncode != 0 and cfg in err and 'limits.memoryMB' in err, 'an invalid config: the daemon refuses '
             'and says where', err)
        with open(cfg, 'w') as f:
            f.write('{"maxSandboxes": 2,\n "nonsense": 1}')
        r = env.run(['daemon'], timeout=30)
        t.ok(r.returncode != 0 and "'nonsense' is not a known key" in r.stderr.decode(), 'unknown keys are refused',
             r.stderr)
        with open(cfg, 'w') as f:
            f.write('{"maxSandboxes": 2,\n "limits": {"pids": 100}')
        r = env.run(['daemon'], timeout=30)
        t.ok(r.returncode != 0 and 'line 2' in r.stderr.decode(), 'a syntax error names its line', r.stderr)
        r = env.run(['exec', '-s', 'x', '--', 'true'], timeout=60)
        t.ok(r.returncode == 1 and b'the daemon did not start: invalid configuration' in r.stderr and b'line 2' in r.stderr,
             'a command that starts the daemon says why it could not', r.stderr)
        with open(cfg, 'w') as f:
            json.dump({'maxSandboxes': 2, 'limits': {'pids': 100}}, f)
        c = env.mcp(['--sandbox', 'one'])
        c.initialize()
        c.ok('createSandbox', {'sandboxId': 'one'})
        c.ok('createSandbox', {'sandboxId': 'two'})
        t.eq(c.err('createSandbox', {'sandboxId': 'three'}), 'RESOURCE_LIMIT', 'maxSandboxes from the config holds')
        r = c.sh(FORKS, sandbox='one', timeout=30000)
        t.ok(0 < int(r['stdout']) < 100, 'default limits from the config apply (pids 100: %s forks)' % r['stdout'].strip())
        r = env.run(['doctor'])
        out = r.stdout.decode()
        t.ok(cfg in out and '"maxSandboxes": 2' in out, 'doctor prints the configuration in force', out[-600:])
    finally:
        env.close()


def test_thousand(t, x):
    c = x.env.socket_client()
    c.initialize()
    n, window = 1000, 200  # pipelined, at most 200 in progress (a connection may have 256)
    bad = []

    def answer(i):
        r = c.next(lambda m, i=i: m.get('id') == 'm-%d' % i, 120)
        if r['result'].get('isError'):
            bad.append(r['result']['structuredContent'])
    for i in range(n):
        if i >= window:
            answer(i - window)
        c.send({'jsonrpc': '2.0', 'id': 'm-%d' % i, 'method': 'tools/call',
                'params': {'name': 'createSandbox', 'arguments': {'sandboxId': 'm-%d' % i}}})
    for i in range(n - window, n):
        answer(i)
    t.eq(bad[:3], [], '1,000 sandboxes created')
    listed = c.ok('listSandboxes')['sandboxes']
    t.eq(sum(1 for s in listed if s['sandboxId'].startswith('m-') and s['status'] == 'running'), n,
         'all 1,000 are running at once')
    r = c.ok('exec', {'sandboxId': 'm-999', 'command': 'echo alive; ls /workspace | wc -l'})
    t.eq(r['stdout'], 'alive\n0\n', 'and each works')
    for i in range(n):
        c.send({'jsonrpc': '2.0', 'id': 'd%d' % i, 'method': 'tools/call',
                'params': {'name': 'destroySandbox', 'arguments': {'sandboxId': 'm-%d' % i}}})
    for i in range(n):
        c.next(lambda m, i=i: m.get('id') == 'd%d' % i, 120)
    left = os.listdir(os.path.join(x.env.state, 'sandboxes'))
    t.ok(not any(d.startswith('m-') for d in left), 'and all go again', left[:5])


def test_start_that_hangs(t, x):
    """A sandbox whose start hangs (its init frozen here: a slow disk, a
    stuck mount) keeps no one else waiting: the daemon serves every other
    sandbox meanwhile, calls for the starting one wait for it, and after
    15 s its start fails and nothing of it is left. A destroy while it
    starts answers the create at once."""
    import glob
    import threading
    c, env = x.c, x.env
    pid = env.daemon_pid()
    if not glob.glob('/sys/fs/cgroup/freezer/**/sbx-%d' % pid, recursive=True):
        return t.skip('a start that hangs', 'no cgroup v1 freezer here')
    sandboxes = os.path.join(env.state, 'sandboxes')

    def ahead():
        return glob.glob('/sys/fs/cgroup/freezer/**/sbx-%d/_ahead-*' % pid, recursive=True)

    def freezer_dirs():
        return glob.glob('/sys/fs/cgroup/freezer/**/sbx-%d/*/' % pid, recursive=True)

    def freeze_ahead():
        """Freezes the sandboxes made ahead now (the next create takes the
        oldest)."""
        wait_until(lambda: len(ahead()) >= 2, 30, 'two sandboxes made ahead')
        for d in ahead():
            with open(os.path.join(d, 'freezer.state'), 'w') as f:
                f.write('FROZEN')

    def procs_of(sid):
        return [int(p) for d in glob.glob('/sys/fs/cgroup/freezer/**/sbx-%d/%s.*/' % (pid, sid), recursive=True)
                for p in open(os.path.join(d, 'cgroup.procs')).read().split()]

    def status():
        return {s['sandboxId']: s['status'] for s in c.ok('listSandboxes')['sandboxes']}

    def thawed():
        for d in freezer_dirs():  # where they are now (a create renames its sandbox's cgroups)
            try:
                with open(os.path.join(d, 'freezer.state'), 'w') as f:
                    f.write('THAWED')
            except OSError:
                pass

    stuck = []
    try:
        c.sh('true', sandbox='calm')
        freeze_ahead()
        other = env.socket_client()
        other.initialize()
        waiter = env.socket_client()
        waiter.initialize()
        got = {}
        calls = [threading.Thread(target=lambda: got.update(create=other.call('createSandbox', {'sandboxId': 'slow'}))),
                 threading.Thread(target=lambda: got.update(
                     exec=waiter.call('exec', {'sandboxId': 'slow', 'command': 'echo ran'})))]
        calls[0].start()
        wait_until(lambda: status().get('slow') == 'starting', 10, 'the create to be under way')
        stuck += procs_of('slow')
        calls[1].start()
        r = c.sh('echo still here', sandbox='calm')
        t.eq(r['stdout'], 'still here\n', 'another sandbox\'s call answers while one start hangs')
        t.eq(status().get('slow'), 'starting', 'listSandboxes answers too, and says the slow one is starting')
        # a destroy while a create starts: the create hears of it at once
        freeze_ahead()
        third = env.socket_client()
        third.initialize()
        late = {}
        th = threading.Thread(target=lambda: late.update(r=third.call('createSandbox', {'sandboxId': 'gone'})))
        th.start()
        wait_until(lambda: status().get('gone') == 'starting', 10, 'the second create to be under way')
        stuck += procs_of('gone')
        c.ok('destroySandbox', {'sandboxId': 'gone'})
        th.join(30)
        res = late['r'][0]
        t.ok(res.get('isError') and res['structuredContent']['error']['code'] == 'SANDBOX_NOT_FOUND'
             and 'destroyed' in res['structuredContent']['error']['message'],
             'a create whose sandbox is destroyed while it starts answers so', res)
        for th in calls:
            th.join(40)
        res = got['create'][0]
        t.ok(res.get('isError') and 'timed out' in res['structuredContent']['error']['message'],
             'the hung start fails after 15 s, with a reason', res)
        t.eq(got['exec'][0].get('structuredContent', {}).get('error'), res['structuredContent']['error'],
             'a call that waited for it hears the same')
        t.ok('slow' not in status() and not os.path.exists(os.path.join(sandboxes, 'slow')),
             'nothing of the failed create is left: not listed, no directory')
    finally:
        thawed()
    t.ok(len(stuck) == 2 and wait_until(lambda: all(gone(p) for p in stuck), 30, 'the frozen inits to end'),
         'their inits end once they can', stuck)
    t.eq(c.sh('echo fine', sandbox='slow')['stdout'], 'fine\n', 'the same id starts afresh after it')


def data_has(path, needle):
    """Whether a sparse file's data (its holes skipped) holds needle."""
    with open(path, 'rb') as f:
        fd, off, end = f.fileno(), 0, os.fstat(f.fileno()).st_size
        while off < end:
            try:
                data = os.lseek(fd, off, os.SEEK_DATA)
            except OSError:
                break  # only a hole is left
            hole = os.lseek(fd, data, os.SEEK_HOLE)
            f.seek(max(0, data - len(needle)))
            while f.tell() < hole:
                chunk = f.read(min(1 << 20, hole - f.tell()) + len(needle))
                if needle in chunk:
                    return True
                if len(chunk) <= len(needle):
                    break
                f.seek(f.tell() - len(needle))
            off = hole
    return False


def test_destroyed_disk_serves_again(t, x):
    """A destroyed sandbox's directory and image serve later sandboxes made
    ahead (no new inode on the host), its space is given back at the
    destroy, an image its old filesystem still holds (a host process with
    one of its files open) is never used again, and nothing of a destroyed
    sandbox (files, record) is in any later sandbox's disk or record."""
    c = x.c
    state = x.env.state

    def state_files():
        for sub in ('sandboxes', 'recycle', 'pool'):
            for root, _, files in os.walk(os.path.join(state, sub)):
                for f in files:
                    p = os.path.join(root, f)
                    try:
                        yield p, os.stat(p)
                    except OSError:
                        pass  # renamed by the helper meanwhile

    def images(key):
        return [(p, st) for p, st in state_files() if (st.st_dev, st.st_ino) == key]

    def leaks(marker):
        return [p for p, _ in state_files() if os.path.exists(p) and data_has(p, marker.encode())]

    def make(sid, marker):
        c.ok('createSandbox', {'sandboxId': sid, 'env': {'GONE_SECRET': marker}})
        c.sh('for i in $(seq 20000); do echo %s-data; done > /workspace/f; sync' % marker, sandbox=sid)
        st = os.stat(os.path.join(state, 'sandboxes', sid, 'disk.img'))
        return (st.st_dev, st.st_ino)

    marker = os.urandom(8).hex()
    key = make('gone', marker)
    t.ok(data_has(os.path.join(state, 'sandboxes', 'gone', 'disk.img'), (marker + '-data').encode()),
         'the file is in its image (so the searches below can fail)')
    c.ok('destroySandbox', {'sandboxId': 'gone'})
    for i in range(2):  # at once, before the helper is idle
        c.ok('createSandbox', {'sandboxId': 'next%d' % i})
    t.eq(leaks(marker), [], 'creates right after the destroy: nothing of it in any disk or record')
    wait_until(lambda: all(st.st_blocks * 512 < (1 << 20) for _, st in images(key)), 30,
               "the destroyed disk's space given back")
    t.ok(True, "the destroyed disk's space is given back")

    def unheld(key):
        for p, _ in images(key):
            if '/sandboxes/' in p or '/pool/' in p:
                return True  # serving again already: the lock is its new loop device's
            try:
                with open(p, 'rb+') as f:
                    import fcntl
                    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a loop device's lock conflicts
                    return True
            except OSError:
                return False
        return True

    def serves_again(key, first):
        """Whether the destroyed image serves a later sandbox (None: not
        to be seen this time: its old loop device held it past 10 s, the
        kernel's teardown and not sbx's, or its directory served a disk
        made ahead while it was held, and a new image was made)."""
        try:
            wait_until(lambda: unheld(key), 10, 'the old loop device to let go of the image')
        except Fail:
            return None
        if not images(key):
            return None
        kept = len(os.listdir(os.path.join(state, 'recycle')))
        for i in range(first, first + min(kept + 2, 12)):
            c.ok('createSandbox', {'sandboxId': 'next%d' % i})
            if any('/sandboxes/' in p or '/pool/' in p for p, _ in images(key)):
                break
        try:  # looked for until seen: a walk of the state dir can miss a directory being renamed
            return wait_until(lambda: any('/sandboxes/' in p or '/pool/' in p for p, _ in images(key)), 5)
        except Fail:
            return False

    # a few times, until seen: what it depends on is timing (the kernel's
    # teardown, when the helper is asked for a disk)
    seen = [serves_again(key, 2)]
    for attempt in range(2):
        if True in seen:
            break
        okey = make('again%d' % attempt, os.urandom(8).hex())
        c.ok('destroySandbox', {'sandboxId': 'again%d' % attempt})
        seen.append(serves_again(okey, 20 + 12 * attempt))
    if True in seen or False in seen:
        t.ok(True in seen, 'the old image serves a later sandbox', seen)
    else:
        print('# the old images were held when their directories served again: their use again is not checked')
    t.eq(leaks(marker), [], 'nothing of the destroyed sandbox is in any disk or record of the state dir')
    made = sorted(d for d in os.listdir(os.path.join(state, 'sandboxes')) if d.startswith('next'))
    for sid in made:
        r = c.sh('ls -A /workspace; echo "[$GONE_SECRET]"', sandbox=sid)
        t.eq(r['stdout'], '[]\n', '%s starts empty' % sid)

    # a filesystem kept alive from the host: its image is never used again
    marker2 = os.urandom(8).hex()
    key2 = make('held', marker2)
    init = inits_of(x.env.daemon_pid(), 'held')[0]
    held = os.open('/proc/%d/root/workspace/f' % init, os.O_RDONLY)
    try:
        c.ok('destroySandbox', {'sandboxId': 'held'})
        def eio():
            try:
                os.pread(held, 10, 0)
                return False
            except OSError:
                return True
        wait_until(eio, 30, 'the destroyed filesystem to be shut down')
        t.ok(True, 'a file of the destroyed disk held from the host gives an error (its filesystem shut down)')
        for i in range(4):
            c.ok('createSandbox', {'sandboxId': 'after%d' % i})
            made.append('after%d' % i)
        t.ok(not any('/sandboxes/' in p or '/pool/' in p for p, _ in images(key2)),
             'an image its old filesystem still holds serves no sandbox', images(key2))
        wait_until(lambda: not leaks(marker2), 30, 'the held image emptied')
        t.ok(True, 'nothing of the held disk is left in any file of the state dir')
    finally:
        os.close(held)
    for sid in made:
        c.ok('destroySandbox', {'sandboxId': sid})


if __name__ == '__main__':
    sys.exit(run_tests([test_disk_is_disk, test_spills_on_disk, test_kill_9, test_daemon_stop, test_init_killed, test_spawner_killed, test_spawner_child_late,
                        test_made_ahead, test_made_ahead_other_limits, test_start_that_hangs, test_destroyed_disk_serves_again,
                        test_listed_after_restart, test_processes_listed_after_restart, test_relay_survives, test_relay_survives_upgrade, test_agent_not_reading, test_stdin_closed_early, test_config,
                        test_thousand], Ctx))
