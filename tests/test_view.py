"""The FUSE view (`sbx mount`): every sandbox's /workspace at MOUNT/<id>/,
live; the file semantics programs expect (the same answers as a native
directory); changes made inside seen through it and the other way round;
nothing in it leads a host process out of the sandbox; it survives what
happens to sandboxes, to itself and to the daemon; real workloads."""
import errno
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time

from sbxtest import SBX, Env, gone, inits_of, run_tests, wait_until

FSOPS = os.environ.get('FSOPS') or os.path.join(os.path.dirname(__file__), '..', 'build', 'tests', 'fsops')


class Ctx:
    def __init__(self):
        self.env = Env()
        self.mnt = os.path.join(self.env.root, 'view')
        os.makedirs(self.mnt)
        self.c = self.env.mcp(['--sandbox', 'v1'])
        self.c.initialize()
        self.c.sh('true')
        r = self.env.run(['mount', self.mnt])
        if r.returncode != 0:
            raise RuntimeError('sbx mount failed: %r' % r.stderr)
        self.mounted = True

    def umount(self):
        pid = view_pid(self.mnt)
        if subprocess.run(['umount', self.mnt], capture_output=True).returncode != 0:
            subprocess.run(['umount', '-l', self.mnt], capture_output=True)
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def close(self):
        self.umount()
        self.env.close()


def sh(cmd, **kw):
    return subprocess.run(['sh', '-c', cmd], capture_output=True, text=True, timeout=kw.pop('timeout', 120), **kw)


def view_pid(mnt):
    for p in os.listdir('/proc'):
        try:
            cmd = open('/proc/%s/cmdline' % p, 'rb').read().split(b'\0')
        except OSError:
            continue
        if len(cmd) > 2 and cmd[1] == b'mount' and cmd[-2] == mnt.encode():
            return int(p)
    return None


def test_listing(t, x):
    t.ok(os.path.isdir(os.path.join(x.mnt, 'v1')), 'a sandbox is a directory of the view')
    x.c.ok('createSandbox', {'sandboxId': 'v-new'})
    t.ok(wait_until(lambda: 'v-new' in os.listdir(x.mnt), 10, 'the new sandbox to appear'), 'a new sandbox appears')
    x.c.ok('destroySandbox', {'sandboxId': 'v-new'})
    t.ok(wait_until(lambda: 'v-new' not in os.listdir(x.mnt), 10, 'it to go'), 'a destroyed one goes')
    missed = []
    for i in range(60):  # the daemon's event may come after createSandbox's answer: the view asks it
        x.c.ok('createSandbox', {'sandboxId': 'v-at-once-%d' % i})
        if not os.path.isdir(os.path.join(x.mnt, 'v-at-once-%d' % i)):
            missed.append(i)
    t.eq(missed, [], 'a sandbox is in the view as soon as createSandbox has answered (60 creates)')
    for i in range(60):
        x.c.ok('destroySandbox', {'sandboxId': 'v-at-once-%d' % i})
    t.ok(not os.path.exists(os.path.join(x.mnt, 'no-such-sandbox')), 'a name no sandbox has is not there')
    shown = 0
    for _ in range(5):  # sbx mount returns once the view knows the daemon's list
        x.env.run(['umount', x.mnt])
        r = x.env.run(['mount', x.mnt])
        shown += r.returncode == 0 and os.path.isdir(os.path.join(x.mnt, 'v1'))
    t.eq(shown, 5, 'right after sbx mount returns, every sandbox is there (5 mounts)')
    st = os.stat(os.path.join(x.mnt, 'v1'))
    t.ok(stat.S_ISDIR(st.st_mode), 'MOUNT/<id> is a directory')
    r = sh('ls -a %s' % x.mnt)
    t.ok(r.stdout.split()[:2] == ['.', '..'] and 'v1' in r.stdout.split(), 'ls -a shows . and .. and the sandboxes',
         r.stdout)
    x.c.ok('writeFile', {'path': '/workspace/hello.txt', 'content': 'hi\n'})
    t.eq(open(os.path.join(x.mnt, 'v1', 'hello.txt')).read(), 'hi\n', 'MOUNT/<id>/ is its /workspace')
    x.c.sh('mkdir -p /workspace/src/deep')
    r = subprocess.run([SBX, 'exec', '--', 'pwd; hostname'], cwd=os.path.join(x.mnt, 'v1', 'src', 'deep'),
                       env=x.env.env, capture_output=True)
    t.eq(r.stdout, b'/workspace/src/deep\nv1\n', 'sbx exec in a sandbox\'s directory of the view runs there, in it')
    r = subprocess.run([SBX, 'exec', '--', 'pwd'], cwd=x.mnt, env=x.env.env, capture_output=True)
    t.ok(r.returncode == 2 and b'root of a view' in r.stderr and not r.stdout,
         'sbx exec at the view\'s own root makes no sandbox named after it: it says to pick one', (r.returncode, r.stderr))
    x.env.run(['daemon', 'stop'])  # v1 stopped: its directory in the view is not opened until used
    x.env.run(['ls'])
    other = os.path.join(x.env.root, 'not', 'made', 'yet')
    r = x.env.run(['mount', other])
    t.ok(r.returncode == 0 and os.path.isdir(os.path.join(other, 'v1')), 'sbx mount makes its directory, as mkdir -p',
         r.stderr)
    t.ok(os.lstat(os.path.join(other, 'v1')).st_mtime > 86400 * 365, 'a sandbox not yet entered is not dated 1970',
         os.lstat(os.path.join(other, 'v1')).st_mtime)
    x.env.run(['umount', other])
    r = x.env.run(['mount', '-o', 'bogus', other])
    t.ok(r.returncode == 2 and b'-o takes' in r.stderr, 'an unknown -o option says so', r.stderr)


def test_use_is_activity(t, x):
    """Work on a sandbox's files through the view keeps it from being reset
    for idleness, as tool calls do: a host editor appending to a file for
    longer than sleepAfter loses nothing."""
    x.c.ok('createSandbox', {'sandboxId': 'v-busy', 'sleepAfter': '2s'})
    x.c.sh('true', sandbox='v-busy')
    wait_until(lambda: os.path.isdir(os.path.join(x.mnt, 'v-busy')), 10, 'the new sandbox in the view')
    path = os.path.join(x.mnt, 'v-busy', 'notes.txt')
    with open(path, 'w') as f:
        f.write('line 0\n')
    # a call now takes any reset the setup itself may have let happen (on a
    # loaded machine more than 2 s can pass before the first write)
    x.c.sh('test -s /workspace/notes.txt', sandbox='v-busy')
    t0 = time.monotonic()
    lines = 1
    while time.monotonic() - t0 < 6:  # three times sleepAfter, a line every 0.2 s
        with open(path, 'a') as f:
            f.write('line %d\n' % lines)
        lines += 1
        time.sleep(0.2)
    t.eq(open(path).read().count('\n'), lines, 'every line written through the view over 6 s is there (%d)' % lines)
    res, _ = x.c.call('exec', {'sandboxId': 'v-busy', 'command': 'wc -l < /workspace/notes.txt'})
    r = res['structuredContent']
    t.ok(r['stdout'].strip() == str(lines) and not r.get('reset'), 'and inside: the sandbox was not reset', r)
    x.c.ok('destroySandbox', {'sandboxId': 'v-busy'})


def test_other_users_files(t, x):
    """Files of a non-root user of a sandbox (mode 640, a directory 700) are
    the host's through the view as its root's are (the sandbox's root may
    read and change them), and cp -a from one sandbox to another keeps
    their owners, as inside."""
    x.c.sh('mkdir -p /workspace/ou/priv && echo u > /workspace/ou/u && echo s > /workspace/ou/priv/s && '
           'chown -R 1000:1000 /workspace/ou/u /workspace/ou/priv && chmod 640 /workspace/ou/u && chmod 700 /workspace/ou/priv',
           sandbox='v-ou1')
    x.c.sh('true', sandbox='v-ou2')
    wait_until(lambda: os.path.isdir(os.path.join(x.mnt, 'v-ou2')), 10, 'the sandboxes in the view')
    src, dst = os.path.join(x.mnt, 'v-ou1', 'ou'), os.path.join(x.mnt, 'v-ou2', 'ou')
    t.eq((open(os.path.join(src, 'u')).read(), open(os.path.join(src, 'priv', 's')).read()), ('u\n', 's\n'),
         'a 640 file and a file in a 700 directory of uid 1000 are read through the view')
    r = sh('cp -a %s %s' % (src, dst))
    t.eq((r.returncode, r.stderr), (0, ''), 'cp -a of them into another sandbox succeeds')
    r = x.c.sh('stat -c "%u:%g %a %n" /workspace/ou/u /workspace/ou/priv /workspace/ou/priv/s', sandbox='v-ou2')
    t.eq(r['stdout'], '1000:1000 640 /workspace/ou/u\n1000:1000 700 /workspace/ou/priv\n1000:1000 644 /workspace/ou/priv/s\n',
         'with their owners and modes inside the second sandbox')
    os.chmod(os.path.join(dst, 'u'), 0o600)
    t.eq(x.c.sh('stat -c %a /workspace/ou/u', sandbox='v-ou2')['stdout'], '600\n', 'chmod of it through the view')
    try:
        os.chown(os.path.join(dst, 'u'), 5, 5)
        err = 0
    except OSError as e:
        err = e.errno
    t.eq(err, 1, 'a chown to a host id that is no id of the sandbox is refused (EPERM)')
    for sid in ('v-ou1', 'v-ou2'):
        x.c.ok('destroySandbox', {'sandboxId': sid})



def test_no_acls(t, x):
    """The view (without allow_other) has no POSIX ACLs: the kernel checks
    no permission on it, so an ACL would grant or deny nothing there. Their
    attributes answer "not supported" as on a filesystem without ACLs
    (which `ls -l` remembers per filesystem, instead of asking each file);
    inside the sandbox the ACL is untouched, and user attributes go through
    both ways."""
    entries = ((1, 6, 0xffffffff), (2, 4, 1000), (4, 4, 0xffffffff), (0x10, 4, 0xffffffff), (0x20, 4, 0xffffffff))
    acl = struct.pack('<I', 2) + b''.join(struct.pack('<HHI', *e) for e in entries)
    r = x.c.sh("echo a > /workspace/acl.txt && python3 -c \"import os, sys; "
               "os.setxattr('/workspace/acl.txt', 'system.posix_acl_access', bytes.fromhex(sys.argv[1])); "
               "os.setxattr('/workspace/acl.txt', 'user.k', b'inside')\" " + acl.hex())
    t.eq(r['exitCode'], 0, 'an ACL is set inside the sandbox', r['stderr'])
    p = os.path.join(x.mnt, 'v1', 'acl.txt')

    def err(f, *a):
        try:
            f(*a)
            return 0
        except OSError as e:
            return e.errno
    t.eq(err(os.getxattr, p, 'system.posix_acl_access'), errno.EOPNOTSUPP, 'reading it through the view: EOPNOTSUPP')
    t.eq(err(os.setxattr, p, 'system.posix_acl_access', acl), errno.EOPNOTSUPP, 'setting one: EOPNOTSUPP')
    t.eq(err(os.removexattr, p, 'system.posix_acl_access'), errno.EOPNOTSUPP, 'removing it: EOPNOTSUPP')
    t.eq(sorted(os.listxattr(p)), ['user.k'], 'the list of attributes names the user attribute, not the ACL')
    t.eq(os.getxattr(p, 'user.k'), b'inside', 'a user attribute set inside is read through the view')
    os.setxattr(p, 'user.h', b'host')
    r = x.c.sh("python3 -c \"import os; p = '/workspace/acl.txt'; "
               "print(len(os.getxattr(p, 'system.posix_acl_access')), os.getxattr(p, 'user.h').decode())\"")
    t.eq(r['stdout'], '%d host\n' % len(acl), 'inside, the ACL is still there and the host\'s user attribute is seen')
    t.eq(sh('ls -l %s' % p).returncode, 0, 'ls -l of it through the view works')

CHOWN_RACE = r'''
import json, os, subprocess, sys, threading, time
sbx, root, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
fake, mnt = os.path.join(root, 'fake'), os.path.join(root, 'mnt')
os.makedirs(fake)
os.makedirs(mnt)
subprocess.run(['mount', '-t', 'tmpfs', 'tmpfs', fake], check=True)
os.mknod(os.path.join(fake, 'null'), 0o20666, os.makedev(1, 3))
os.chmod(os.path.join(fake, 'null'), 0o666)
subprocess.run(['mount', '--bind', os.path.join(fake, 'null'), '/dev/null'], check=True)
view = subprocess.Popen([sbx, 'mount', '-f', mnt], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
deadline = time.monotonic() + 20
while not os.path.ismount(mnt) and time.monotonic() < deadline:
    time.sleep(0.01)
owners = []
for i in range(n):
    sid = 'race%d' % i
    sh = lambda cmd: subprocess.run([sbx, 'exec', '-s', sid, '--', cmd], capture_output=True, text=True).stdout
    base = int(sh('touch /workspace/f; cat /proc/self/uid_map').split()[1])
    path = os.path.join(mnt, sid, 'f')
    os.stat(path)
    done, count = threading.Event(), [0]

    def racer():
        while not done.is_set():
            try:
                os.chown(path, base + 5, base + 5)
                count[0] += 1
            except OSError:
                break
    ths = [threading.Thread(target=racer) for _ in range(4)]
    for th in ths:
        th.start()
    while count[0] < 50 and any(th.is_alive() for th in ths):
        time.sleep(0.001)
    subprocess.run([sbx, 'destroy', sid], capture_output=True)
    done.set()
    for th in ths:
        th.join(30)
    st = os.stat('/dev/null')
    owners.append([st.st_uid, st.st_gid, count[0]])
view.kill()
view.wait()
subprocess.run(['umount', '-l', mnt])
print(json.dumps(owners))
'''


def test_chown_racing_destroy(t, x):
    """Chowns through the view racing a destroy of their sandbox: the view
    swaps the host's /dev/null in under a destroyed sandbox's nodes, and a
    chown to one of the sandbox's ids is done as root, so it must never
    reach /dev/null. Run against a stand-in /dev/null (same device) in a
    mount namespace of the test's own."""
    root = tempfile.mkdtemp(dir=x.env.root)
    r = subprocess.run(['unshare', '-m', '--propagation', 'private', sys.executable, '-c', CHOWN_RACE, SBX, root, '6'],
                       env=x.env.env, capture_output=True, text=True, timeout=300)
    owners = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else None
    t.ok(owners is not None and all(c > 0 for _, _, c in owners), 'chowns ran through the view in 6 destroys', (owners, r.stderr[-500:]))
    t.ok(owners is not None and all(o[:2] == [0, 0] for o in owners), '/dev/null stayed root\'s in every one', owners)


ENABLE_URING = '/sys/module/fuse/parameters/enable_uring'


def rings_of(pid):
    """How many io_uring instances a process holds."""
    n = 0
    for fd in os.listdir('/proc/%d/fd' % pid):
        try:
            n += os.readlink('/proc/%d/fd/%s' % (pid, fd)) == 'anon_inode:[io_uring]'
        except OSError:
            pass
    return n


def possible_cpus():
    last = 0
    for part in open('/sys/devices/system/cpu/possible').read().strip().split(','):
        last = max(last, int(part.split('-')[-1]))
    return last + 1


def rings_per_cpu(cpus):
    """How many rings the view makes for each possible CPU (uring.c's per_cpu)."""
    return 8 if cpus <= 4 else 4


def test_io_uring(t, x):
    """Where the kernel has FUSE over io_uring, the view (as root) turns it
    on while it mounts and takes its requests on rings, several per CPU;
    sbx doctor says so. The rest of these tests then run over it."""
    if not os.path.exists(ENABLE_URING):
        t.skip('FUSE over io_uring', 'this kernel has none (Linux 6.14+, CONFIG_FUSE_IO_URING)')
        return
    p = os.path.join(x.mnt, 'v1', 'ring.txt')  # the first request waits for the INIT that sets the rings up
    with open(p, 'w') as f:
        f.write('through the ring\n')
    t.eq(x.c.sh('cat /workspace/ring.txt')['stdout'], 'through the ring\n', 'the view serves')
    cpus = possible_cpus()
    per = rings_per_cpu(cpus)
    t.eq(rings_of(view_pid(x.mnt)), per * cpus, 'through %d rings per possible CPU' % per)
    line = [l for l in x.env.run(['doctor']).stdout.decode().splitlines() if 'FUSE over io_uring' in l]
    t.ok(line and line[0].startswith('ok') and 'rings' in line[0], 'sbx doctor says the view uses it', line)


def test_low_fd_limit(t, x):
    """A view started under a low fd limit serves its files: its rings, an
    fd each, take at most an eighth of them, spares included (16 rings
    under a limit of 24 left it answering EIO to every read, the rings it
    had made kept)."""
    with open(os.path.join(x.mnt, 'v1', 'lowfd.txt'), 'w') as f:
        f.write('served\n')
    cpus = possible_cpus()
    rings = rings_per_cpu(cpus) * cpus
    for limit in (24, 64, 8 * rings):
        mnt = os.path.join(x.env.root, 'lowfd%d' % limit)
        os.makedirs(mnt, exist_ok=True)
        p = subprocess.Popen(['prlimit', '--nofile=%d:%d' % (limit, limit), x.env.sbx, 'mount', '-f', mnt],
                             env=x.env.env, stderr=subprocess.DEVNULL)
        try:
            t.ok(wait_until(lambda: os.path.ismount(mnt), 20, 'the view mounted'), 'a view under %d fds mounts' % limit)
            try:
                got = open(os.path.join(mnt, 'v1', 'lowfd.txt')).read()
            except OSError as e:
                got = repr(e)
            t.eq(got, 'served\n', 'and serves a file under %d fds' % limit)
            if limit < 8 * rings:
                t.eq(rings_of(p.pid), 0, 'through /dev/fuse, holding no ring')
            elif os.path.exists(ENABLE_URING):
                t.eq(rings_of(p.pid), rings, 'over its %d rings where they are an eighth of its fds' % rings)
        finally:
            subprocess.run(['umount', '-l', mnt], capture_output=True)
            p.kill()
            p.wait()


def test_uring_setting_restored(t, x):
    """A view ended (SIGTERM) while it mounts, before its INIT is answered
    (here: waiting for a stopped daemon's list), still sets the host's
    enable_uring back off."""
    if not os.path.exists(ENABLE_URING):
        t.skip('FUSE over io_uring', 'this kernel has none')
        return
    # the view this test runs on sets it back once its INIT is answered
    t.ok(wait_until(lambda: open(ENABLE_URING).read().strip() == 'N', 10, 'enable_uring off'), 'enable_uring is off')
    dpid = x.env.daemon_pid()
    mnt = os.path.join(x.env.root, 'guarded')
    os.makedirs(mnt, exist_ok=True)
    os.kill(dpid, signal.SIGSTOP)
    p = None
    try:
        p = subprocess.Popen([x.env.sbx, 'mount', '-f', mnt], env=x.env.env, stderr=subprocess.DEVNULL)
        t.ok(wait_until(lambda: open(ENABLE_URING).read().strip() == 'Y', 10, 'the view to turn it on'),
             'the view turns enable_uring on while it mounts')
        p.send_signal(signal.SIGTERM)
        p.wait(20)
    finally:
        os.kill(dpid, signal.SIGCONT)
        if p and p.poll() is None:
            p.kill()
        subprocess.run(['umount', '-l', mnt], capture_output=True)
    after = open(ENABLE_URING).read().strip()
    if after != 'N':  # for the tests after this one
        with open(ENABLE_URING, 'w') as f:
            f.write('N')
    t.eq(after, 'N', 'and sets it back off when ended before its INIT is answered')


def test_waiters_hold_no_cpu(t, x):
    """Requests waiting on a stopped daemon (8 host processes on one CPU,
    each entering a sandbox the view has not opened, as many as that CPU's
    rings have threads) do not hold up the other requests made on that
    CPU: a thread more is started while all are busy."""
    if not os.path.exists(ENABLE_URING):
        t.skip('FUSE over io_uring', 'this kernel has none')
        return
    ids = ['v-w%d' % i for i in range(9)]
    for i in ids:
        x.c.ok('createSandbox', {'sandboxId': i})
    t.ok(wait_until(lambda: all(os.path.isdir(os.path.join(x.mnt, i)) for i in ids), 20, 'the sandboxes in the view'),
         'nine sandboxes')
    os.listdir(os.path.join(x.mnt, ids[0]))  # this one is open in the view
    dpid = x.env.daemon_pid()
    os.kill(dpid, signal.SIGSTOP)
    waiters = []
    try:
        waiters = [subprocess.Popen(['taskset', '-c', '0', 'stat', os.path.join(x.mnt, i, 'x')],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in ids[1:]]

        def waiting():
            try:
                return all(p.poll() is None and open('/proc/%d/stat' % p.pid).read().rsplit(')', 1)[1].split()[0] in 'SD'
                           and open('/proc/%d/wchan' % p.pid).read() in ('request_wait_answer', 'fuse_uring_cmd') for p in waiters)
            except OSError:
                return False
        t.ok(wait_until(waiting, 20, 'the 8 to wait in the view'), '8 processes on CPU 0 wait on the stopped daemon')
        try:
            r = subprocess.run(['taskset', '-c', '0', 'stat', os.path.join(x.mnt, ids[0], 'nothing')],
                               capture_output=True, timeout=20)
            done = r.returncode == 1 and b'No such file' in r.stderr
        except subprocess.TimeoutExpired:
            done = False
        t.ok(done, 'a lookup in the open sandbox from that CPU is answered meanwhile')
    finally:
        os.kill(dpid, signal.SIGCONT)
        for p in waiters:
            try:
                p.wait(90)
            except subprocess.TimeoutExpired:
                p.kill()
    for i in ids:
        x.c.ok('destroySandbox', {'sandboxId': i})


def test_killed_mid_request(t, x):
    """The view killed while a host process keeps it busy (requests on its
    rings at that moment): the process gets errors, never hangs, and a new
    sbx mount serves the place again."""
    d = os.path.join(x.mnt, 'v1', 'busy')
    os.makedirs(d, exist_ok=True)
    out = {}

    def busy():
        i = 0
        try:
            while True:
                with open(os.path.join(d, 'f%d' % (i % 500)), 'w') as f:
                    f.write('x')
                os.stat(d)
                i += 1
                if i == 200:
                    out['going'] = True
        except OSError as e:
            out['e'] = e.errno
    th = threading.Thread(target=busy, daemon=True)
    th.start()
    wait_until(lambda: 'going' in out or 'e' in out, 30, 'the host process to get going')
    pid = view_pid(x.mnt)
    os.kill(pid, signal.SIGKILL)
    th.join(20)
    t.ok(not th.is_alive(), 'the busy process does not hang when the view is killed')
    t.ok(out.get('e') in (errno.ENOTCONN, errno.ECONNABORTED, errno.ECANCELED), 'it gets an error (ENOTCONN, '
         'ECONNABORTED, or ECANCELED for a request on a ring)', out)
    wait_until(lambda: gone(pid), 10, 'the view to die')
    r = x.env.run(['mount', x.mnt])
    t.ok(r.returncode == 0 and os.path.isdir(os.path.join(x.mnt, 'v1', 'busy')), 'a new sbx mount serves the place',
         r.stderr)


BUSY = r"""
import os, sys, time
os.chdir(sys.argv[1])
n = 0
end = time.monotonic() + 30
while time.monotonic() < end:
    try:
        fd = os.open('c%d' % (n % 50), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        os.write(fd, b'x')
        os.close(fd)
        os.unlink('c%d' % (n % 50))
        n += 1
        if n == 100:
            print('going', flush=True)
    except OSError as e:
        print('error', e.errno, flush=True)
        break
"""


def test_terminated_mid_request(t, x):
    """SIGTERM to a view that processes working inside it keep busy (their
    cwd there, so the mount cannot go at once): it ends cleanly, and the
    processes get errors, never hang."""
    mnt = os.path.join(x.env.root, 'view-term')
    os.makedirs(mnt)
    v = subprocess.Popen([x.env.sbx, 'mount', '-f', mnt], env=x.env.env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    busy = []
    try:
        wait_until(lambda: os.path.isdir(os.path.join(mnt, 'v1')), 20, 'the view to serve')
        for i in range(4):
            d = os.path.join(mnt, 'v1', 'term%d' % i)
            os.makedirs(d, exist_ok=True)
            busy.append(subprocess.Popen([sys.executable, '-c', BUSY, d], stdout=subprocess.PIPE, text=True))
        for b in busy:
            t.eq(b.stdout.readline().strip(), 'going', 'a process works in the view')
        v.send_signal(signal.SIGTERM)
        try:
            rc = v.wait(30)
        except subprocess.TimeoutExpired:
            rc = 'still running'
        t.eq(rc, 0, 'the view ends cleanly on SIGTERM while requests come', v.stderr.read()[-500:] if rc != 0 else '')
        for b in busy:
            try:
                out = b.communicate(timeout=20)[0]
            except subprocess.TimeoutExpired:
                out = 'hung'
            t.ok(out.startswith('error'), 'a process working in it gets an error, and does not hang', out)
    finally:
        for b in busy:
            b.kill()
        if v.poll() is None:
            v.kill()
        subprocess.run(['umount', '-l', mnt], capture_output=True)


def test_late_answer(t, x):
    """The daemon answers an open of a sandbox's files after the view gave
    up waiting for it (a minute): the fd that late answer brings is not
    taken for the next sandbox opened (which then showed the first one's
    files, and took what was written for it)."""
    x.c.sh('echo from-A > /workspace/who', sandbox='late-a')
    x.c.sh('echo from-B > /workspace/who', sandbox='late-b')
    mnt = os.path.join(x.env.root, 'view-late')  # a view of its own: neither sandbox is open in it yet
    os.makedirs(mnt)
    r = x.env.run(['mount', mnt])
    t.eq(r.returncode, 0, 'a second view', r.stderr)
    try:
        wait_until(lambda: os.path.isdir(os.path.join(mnt, 'late-b')), 20, 'the listing')
        d = x.env.daemon_pid()
        os.kill(d, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            try:
                got = open(os.path.join(mnt, 'late-a', 'who')).read()
            except OSError as e:
                got = e.errno
            t.ok(got in (errno.ETIMEDOUT, errno.EIO), 'with the daemon stopped, a sandbox\'s files cannot be '
                 'opened through the view: it fails after the view\'s wait (%.0f s)' % (time.monotonic() - t0), got)
        finally:
            os.kill(d, signal.SIGCONT)
        t.eq(open(os.path.join(mnt, 'late-b', 'who')).read(), 'from-B\n',
             'once the daemon goes on, the next sandbox opened shows its own files, not those of the late answer')
        t.eq(open(os.path.join(mnt, 'late-a', 'who')).read(), 'from-A\n', 'and the first one its own')
    finally:
        x.env.run(['umount', mnt])


def test_syscall_suite(t, x):
    native = tempfile.mkdtemp(prefix='sbxt-native-', dir=x.env.root)
    a = subprocess.run([FSOPS, '--tap', native], capture_output=True, text=True, timeout=120)
    t.eq(a.returncode, 0, 'the syscall suite passes on a native directory (the control)', a.stdout[-2000:])
    na = a.stdout.count('\nok ')
    # as root, open files are in passthrough mode and requests come on
    # io_uring where the kernel has it; -o nopassthrough,nouring serves every
    # read and write through sbx, with requests read from /dev/fuse: both
    # must answer as native
    plain = os.path.join(x.env.root, 'view-plain')
    os.makedirs(plain)
    r = x.env.run(['mount', '-o', 'nopassthrough,nouring', plain])
    t.eq(r.returncode, 0, 'a second view, -o nopassthrough,nouring', r.stderr)
    try:
        t.eq(rings_of(view_pid(plain)), 0, '-o nouring: no ring, requests come through /dev/fuse')
        import mmap
        for mnt, how in ((x.mnt, 'the view'), (plain, 'the view without passthrough')):
            buf = mmap.mmap(-1, 65536)  # aligned, as O_DIRECT wants
            buf.write(b'd' * 65536)
            p = os.path.join(mnt, 'v1', 'direct-%d.bin' % len(how))
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
            try:
                n = os.write(fd, buf)
            except OSError as e:
                n = e
            os.close(fd)
            t.eq(n, 65536, how + ': an O_DIRECT write of aligned memory')
            r = x.c.sh('wc -c < /workspace/direct-%d.bin' % len(how))
            t.eq(r['stdout'].strip(), '65536', 'and the sandbox has it')
        for mnt, how in ((x.mnt, 'the view'), (plain, 'the view without passthrough nor io_uring')):
            inview = os.path.join(mnt, 'v1', 'fsops-%d' % len(how))
            os.makedirs(inview)
            b = subprocess.run([FSOPS, '--tap', inview], capture_output=True, text=True, timeout=120)
            t.eq(b.returncode, 0, 'the syscall suite passes on ' + how, b.stdout[-2000:])
            t.ok(na > 80 and na == b.stdout.count('\nok '), 'the same answers to every one of the %d calls' % na)
            for line in b.stdout.splitlines():
                if line.startswith('not ok'):
                    t.ok(False, how + ': ' + line)
    finally:
        x.env.run(['umount', plain])


def test_passthrough(t, x):
    """As root, a file opened through the view is read and written by the
    kernel straight from the sandbox's disk: what either side writes, the
    other sees at once, even through a shared mapping."""
    import mmap
    x.c.sh('head -c 65536 /dev/zero > /workspace/pt.bin && printf "#!/bin/sh\\n" > /workspace/suid && chmod 4755 /workspace/suid')
    p = os.path.join(x.mnt, 'v1', 'pt.bin')
    with open(p, 'r+b') as f:
        m = mmap.mmap(f.fileno(), 65536)
        x.c.sh('printf inside | dd of=/workspace/pt.bin bs=1 seek=40000 conv=notrunc status=none')
        t.eq(m[40000:40006], b'inside', 'a write inside is in a shared mapping made through the view at once')
        m[100:104] = b'host'
        f.seek(60000)
        f.write(b'pwrite')
        f.flush()
        r = x.c.sh('dd if=/workspace/pt.bin bs=1 skip=100 count=4 status=none; dd if=/workspace/pt.bin bs=1 '
                   'skip=60000 count=6 status=none')
        t.eq(r['stdout'], 'hostpwrite', 'and the host\'s stores and writes are inside at once')
        m.close()
    with open(os.path.join(x.mnt, 'v1', 'suid'), 'r+b') as f:
        f.seek(0, 2)
        f.write(b'true\n')
    r = x.c.sh('stat -c %a /workspace/suid')
    t.eq(r['stdout'].strip(), '755', 'a write through the view drops the set-uid bit, as a write anywhere does')


def test_coherence(t, x):
    p = os.path.join(x.mnt, 'v1', 'co.txt')
    x.c.sh('echo one > /workspace/co.txt')
    t.eq(open(p).read(), 'one\n', 'a file made inside is read through the view')
    x.c.sh('echo two > /workspace/co.txt')
    t.ok(wait_until(lambda: open(p).read() == 'two\n', 10, 'the change'), 'a change inside is seen through the view')
    x.c.sh('chmod 600 /workspace/co.txt')
    t.ok(wait_until(lambda: os.stat(p).st_mode & 0o777 == 0o600, 10, 'the mode'), 'so is a change of mode')
    x.c.sh('mkdir -p /workspace/cod && touch /workspace/cod/a')
    d = os.path.join(x.mnt, 'v1', 'cod')
    t.ok(wait_until(lambda: os.path.isdir(d) and os.listdir(d) == ['a'], 10, 'the listing'), 'and a new entry')
    x.c.sh('rm /workspace/cod/a')
    t.ok(wait_until(lambda: os.listdir(d) == [], 10, 'the removal'), 'and a removal')
    with open(p, 'w') as f:
        f.write('from the host\n')
    t.eq(x.c.sh('cat /workspace/co.txt')['stdout'], 'from the host\n', 'a write through the view is seen inside at once')
    with open(p, 'a') as f:
        f.write('appended\n')
    t.eq(x.c.sh('cat /workspace/co.txt')['stdout'], 'from the host\nappended\n', 'appends too')
    r = x.c.sh('stat -c %u /workspace/co.txt; echo x > /workspace/made-inside')
    st = os.stat(os.path.join(x.mnt, 'v1', 'made-inside'))
    open(os.path.join(x.mnt, 'v1', 'made-by-host'), 'w').close()
    r = x.c.sh('stat -c %u:%g /workspace/made-by-host')
    t.eq(r['stdout'].strip(), '0:0', 'what the host creates belongs to sandbox root inside')
    t.ok(st.st_uid not in (0, os.getuid()) and st.st_uid > 65535, 'through the view files show the sandbox\'s own host '
         'owner (%d), not the mounting user' % st.st_uid)


def test_git_dubious_ownership(t, x):
    """A repository made inside, with a planted core.fsmonitor: git in the
    view refuses it, so the planted command never runs on the host."""
    marker = os.path.join(x.env.root, 'fsmonitor-ran')
    x.c.sh('cd /workspace && git init -q evil && cd evil && git config core.fsmonitor "touch %s; false" && '
           'echo x > f && git add f' % marker)
    repo = os.path.join(x.mnt, 'v1', 'evil')
    r = sh('cd %s && git status' % repo)
    t.ok(r.returncode != 0 and 'dubious ownership' in r.stderr, 'git refuses the view\'s repository', r.stderr)
    t.ok(not os.path.exists(marker), 'the planted fsmonitor did not run on the host')
    r = sh('cd %s && git -c safe.directory=%s -c core.fsmonitor= status --short' % (repo, repo))
    t.eq((r.returncode, r.stdout), (0, 'A  f\n'), 'a user who opts in (safe.directory) can use git there')


def test_escapes(t, x):
    secret = os.path.join(x.env.root, 'host-secret')
    with open(secret, 'w') as f:
        f.write('host secret\n')
    t.ok(os.path.exists(secret) and os.path.exists('/etc/shadow'), 'the host targets exist')
    rel = os.path.relpath(secret, os.path.join(x.mnt, 'v1', 'e'))
    x.c.sh('mkdir -p /workspace/e && cd /workspace/e && ln -sf %s abs && ln -sf %s rel && ln -sf /etc/shadow shadow && '
           'ln -sf .. up && ln -sf up/../../../../../../.. deep && ln -sf ../in-ws inws && echo in > ../in-ws'
           % (secret, rel))
    e = os.path.join(x.mnt, 'v1', 'e')
    for name in ('abs', 'rel', 'shadow', 'deep'):
        target = os.readlink(os.path.join(e, name))
        t.ok(target.startswith(os.path.join(x.mnt, 'v1') + '/'), 'symlink %s is rewritten into the view (%s)' % (name, target))
        try:
            data = open(os.path.join(e, name)).read()
        except OSError:
            data = None
        t.ok(data is None or 'host secret' not in data and 'root:' not in data, 'and reaches nothing of the host')
    t.eq(open(os.path.join(e, 'inws')).read(), 'in\n', 'a symlink inside the workspace still works')
    r = sh('find -L %s -maxdepth 6 2>/dev/null | grep -c host-secret' % e)
    t.eq(r.stdout.strip(), '0', 'find -L through every symlink stays in the view')
    # FIFOs and sockets made inside connect to nothing on the host
    x.c.sh('mkfifo /workspace/e/fifo; python3 -c "import socket; s = socket.socket(socket.AF_UNIX); s.bind(\'/workspace/e/sock\')"')
    fd = os.open(os.path.join(e, 'fifo'), os.O_RDONLY | os.O_NONBLOCK)
    t.eq(os.read(fd, 10), b'', 'a FIFO made inside is a local pipe with no writer on the host')
    os.close(fd)
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(os.path.join(e, 'sock'))
        got = 'connected'
    except OSError:
        got = 'refused'
    s.close()
    t.eq(got, 'refused', 'a socket made inside accepts nothing from the host')
    r = x.c.sh('mknod /workspace/e/null c 1 3 2>&1; echo rc=$?')
    t.ok('rc=0' not in r['stdout'], 'no device node can be made inside', r['stdout'])
    try:
        os.mknod(os.path.join(e, 'dev'), 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        made = True
    except OSError:
        made = False
    t.ok(not made, 'nor through the view')
    # a rename race inside while the host reads through the view
    x.c.ok('startProcess', {'processId': 'racer', 'command': 'cd /workspace/e && mkdir -p real && echo inside > real/f; '
                                                           'while :; do mv real tmp; ln -s %s real; rm real; mv tmp real; done'
                                                           % os.path.dirname(secret)})
    leaked = 0
    for _ in range(2000):
        try:
            if 'host secret' in open(os.path.join(e, 'real', 'host-secret')).read():
                leaked += 1
        except OSError:
            pass
    x.c.ok('killProcess', {'processId': 'racer', 'signal': 'SIGKILL'})
    t.eq(leaked, 0, 'a symlink swap race inside never leads a host read out (2,000 reads)')
    # only the mounting user (and root) enter
    r = subprocess.run(['ls', x.mnt], capture_output=True, preexec_fn=lambda: (os.setgid(4242), os.setuid(4242)))
    t.ok(r.returncode != 0, 'another host user cannot enter the view', r.stderr)


def test_workloads(t, x):
    src = os.path.join(x.env.root, 'src')
    os.makedirs(src)
    sh('cd %s && git init -q && for i in $(seq 200); do mkdir -p d$((i %% 10)); echo $i > d$((i %% 10))/f$i; done && '
       'ln -s d1/f1 link && git add -A && git -c user.email=t@t -c user.name=t commit -qm one' % src)
    ws = os.path.join(x.mnt, 'v1')
    native = os.path.join(x.env.root, 'native')
    os.makedirs(native)
    for where in (native, ws):
        r = sh('cd %s && git clone -q %s clone && cd clone && echo changed >> d1/f1 && touch new && '
               'git -c safe.directory=* status --porcelain' % (where, src))
        if where == native:
            want = r.stdout
        got = r.stdout
    t.eq(got, want, 'git clone + git status in the view answer as natively', got)
    r = x.c.sh('cd /workspace/clone && git -c safe.directory=* log --oneline | wc -l')
    t.eq(r['stdout'].strip(), '1', 'and the clone is a repository inside the sandbox too')
    os.makedirs(os.path.join(ws, 'tarred'))
    r = sh('tar -C %s -cf - . | tar -C %s/tarred -xf - 2>&1; diff -r %s %s/tarred && echo same' % (src, ws, src, ws))
    t.ok(r.stdout.strip().endswith('same'), 'tar of a source tree into the view', r.stdout[-500:])
    r = sh('mkdir %s/untar && tar -C %s/tarred -cf - . | tar -C %s/untar -xf - && diff -r %s %s/untar && echo same'
           % (native, ws, native, src, native))
    t.ok(r.stdout.strip().endswith('same'), 'and out of it', r.stdout[-500:])
    r = sh('rsync -a %s/ %s/rs/ && rsync -a %s/rs/ %s/rs-back/ && diff -r %s %s/rs-back && echo same'
           % (src, ws, ws, native, src, native))
    t.ok(r.stdout.strip().endswith('same'), 'rsync -a round trip', r.stdout[-500:] + r.stderr[-500:])
    # times are checked on cp -a's copy: rsync -a (3.5) itself leaves some
    # directories' and symlinks' times unset now and then, on the host's own
    # disk too (4 runs of 30 here)
    r = sh('cp -a %s %s/cpa && find %s/cpa -printf "%%P %%m %%T@ %%s\\n" | sort > %s/a && '
           'find %s -printf "%%P %%m %%T@ %%s\\n" | sort > %s/b && diff %s/a %s/b && echo same'
           % (src, ws, ws, native, src, native, native, native))
    t.ok(r.stdout.strip().endswith('same'), 'cp -a into the view keeps modes and mtimes', r.stdout[-500:])
    job = ('fio --name=verify --directory=%s --size=32M --bs=4k --rw=randwrite --ioengine=psync --verify=crc32c '
           '--do_verify=1 --verify_fatal=1 --numjobs=2 --group_reporting')
    os.makedirs(os.path.join(ws, 'fio'))
    a = sh(job % os.path.join(native), timeout=300)
    b = sh(job % os.path.join(ws, 'fio'), timeout=300)
    t.eq(a.returncode, 0, 'fio verify passes natively', a.stderr[-500:])
    t.eq(b.returncode, 0, 'and on the view', b.stdout[-800:] + b.stderr[-500:])


def test_many_creates(t, x):
    """More files made through the view, one after another as tar makes
    them, than it may hold nodes for (seven eighths of its fds): the names
    nothing uses are dropped from the kernel's cache before a create needs
    their fds, so none gets ENFILE."""
    limit = int([l.split()[3] for l in open('/proc/%d/limits' % view_pid(x.mnt)) if l.startswith('Max open files')][0])
    many = min(limit * 7 // 8 + 2500, 60000)
    pid = view_pid(x.mnt)
    before = len(os.listdir('/proc/%d/fd' % pid))
    x.c.ok('createSandbox', {'sandboxId': 'v-many'})
    t.ok(wait_until(lambda: os.path.isdir(os.path.join(x.mnt, 'v-many')), 20, 'the sandbox in the view'), 'a sandbox')
    d = os.path.join(x.mnt, 'v-many', 'm')
    os.mkdir(d)
    made, err = 0, None
    for i in range(many):
        try:
            os.close(os.open(os.path.join(d, 'f%d' % i), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            made += 1
        except OSError as e:
            err = e
            break
    t.eq(made, many, '%d files made through the view in a loop (its fd limit %d)' % (many, limit), err)
    t.eq(x.c.sh('ls /workspace/m | wc -l', sandbox='v-many')['stdout'].strip(), str(many), 'all of them there inside')
    x.c.ok('destroySandbox', {'sandboxId': 'v-many'})
    t.ok(wait_until(lambda: len(os.listdir('/proc/%d/fd' % pid)) < before + 500, 60, 'the view to let go of its nodes'),
         'and the view lets go of their fds once the sandbox is destroyed')


def test_robustness(t, x):
    x.c.sh('echo keep > /workspace/held.txt', sandbox='v-gone')
    p = os.path.join(x.mnt, 'v-gone', 'held.txt')
    wait_until(lambda: os.path.exists(p), 10, 'the file in the view')
    f = open(p)
    t.eq(f.readline(), 'keep\n', 'a file of a sandbox held open through the view')
    x.c.ok('destroySandbox', {'sandboxId': 'v-gone'})
    # the view learns of the destroy from the daemon's event stream, a moment
    # after destroySandbox answered: reads may succeed until then, must never
    # hang, and must fail (EIO/ENOENT) or end once the view has heard
    out = {}

    def read_again():
        try:
            f.seek(0)
            out['r'] = f.read()
        except OSError as e:
            out['e'] = e.errno
    deadline = time.monotonic() + 10
    hung = False
    while True:
        out.clear()
        th = threading.Thread(target=read_again)
        th.start()
        th.join(10)
        if th.is_alive():
            hung = True
            break
        if out.get('e') in (5, 2) or out.get('r') == '' or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    t.ok(not hung, 'a read after the sandbox was destroyed does not hang')
    t.ok(out.get('e') in (5, 2) or out.get('r') == '', 'it fails (EIO/ENOENT) or ends', out)
    f.close()
    t.ok(wait_until(lambda: not os.path.exists(os.path.join(x.mnt, 'v-gone')), 10, 'the listing'),
         'and the sandbox is gone from the view')
    # a server killed with -9: a second sbx mount takes over
    pid = view_pid(x.mnt)
    t.ok(pid is not None, 'the view runs as its own process')
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not os.path.exists('/proc/%d' % pid), 10, 'the view to die')
    try:
        os.listdir(x.mnt)
        dead = False
    except OSError:
        dead = True
    t.ok(dead, 'a killed view leaves a dead mount')
    r = x.env.run(['mount', x.mnt])
    t.ok(r.returncode == 0 and os.path.isdir(os.path.join(x.mnt, 'v1')), 'a second sbx mount recovers the place', r.stderr)
    r = x.env.run(['mount', x.mnt])
    t.ok(r.returncode != 0 and b'already' in r.stderr, 'a third is refused: one view per mount point', r.stderr)
    r = x.env.run(['umount', x.env.root])
    t.ok(r.returncode == 1 and b'not an sbx mount' in r.stderr, 'sbx umount leaves what is not its own', r.stderr)
    # the daemon restarts: the view keeps serving (sandboxes wake on use)
    r = x.env.run(['daemon', 'stop'])
    t.ok(r.returncode == 0 and not os.path.exists(os.path.join(x.env.runtime, 'sbx.sock')), 'the daemon stopped')
    x.env.run(['ls'])  # a new daemon

    def back():
        try:
            return open(os.path.join(x.mnt, 'v1', 'hello.txt')).read() == 'hi\n'
        except OSError:
            return False
    t.ok(wait_until(back, 30, 'the view to serve again'), 'after a daemon restart the view serves the files again')
    # SIGTERM unmounts
    pid = view_pid(x.mnt)
    os.kill(pid, signal.SIGTERM)
    t.ok(wait_until(lambda: not os.path.exists('/proc/%d' % pid), 10, 'the view to end'), 'SIGTERM ends the view')
    t.ok(not os.path.ismount(x.mnt), 'and unmounts it')
    r = x.env.run(['mount', x.mnt])
    t.eq(r.returncode, 0, 'mounted again')


LEASER = r"""
import fcntl, os, signal, sys, time
signal.signal(signal.SIGIO, signal.SIG_IGN)
os.makedirs('/workspace/l', exist_ok=True)
fds = []
for i in range(70):
    fd = os.open('/workspace/l/f%d' % i, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.fcntl(fd, 1024, fcntl.F_WRLCK)  # F_SETLEASE: its root owns the file
    fds.append(fd)
print('leased', flush=True)
time.sleep(600)
"""


def test_sandbox_cannot_stall_the_view(t, x):
    """What a sandbox does to its own files never holds the view's threads:
    a lease on each of 70 files (more than the view has threads) while the
    host opens them all at once, and more files than the view could once
    hold open."""
    c = x.c
    c.ok('writeFile', {'sandboxId': 'v-lease', 'path': '/tmp/leaser.py', 'content': LEASER})
    c.ok('startProcess', {'sandboxId': 'v-lease', 'processId': 'leaser', 'command': 'python3 /tmp/leaser.py'})
    c.ok('waitForLog', {'sandboxId': 'v-lease', 'processId': 'leaser', 'pattern': 'leased', 'timeout': 60000}, timeout=70)
    d = os.path.join(x.mnt, 'v-lease', 'l')
    errs = {}

    def open_one(i):
        try:
            open(os.path.join(d, 'f%d' % i)).close()
            errs[i] = 0
        except OSError as e:
            errs[i] = e.errno
    ths = [threading.Thread(target=open_one, args=(i,)) for i in range(70)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(40)
    t.ok(not any(th.is_alive() for th in ths), 'opens of 70 leased files through the view all return')
    t.ok(set(errs.values()) == {11}, 'each with EAGAIN (the lease is the sandbox\'s; the host does not wait on it)',
         sorted(set(errs.values())))
    try:
        os.truncate(os.path.join(d, 'f0'), 0)
        terr = 0
    except OSError as e:
        terr = e.errno
    t.eq(terr, 11, 'a truncate by path of a leased file: EAGAIN too')
    t.eq(open(os.path.join(x.mnt, 'v1', 'hello.txt')).read(), 'hi\n', 'and the view serves the others meanwhile')
    c.ok('killProcess', {'sandboxId': 'v-lease', 'processId': 'leaser', 'signal': 'SIGKILL'})
    # more files than the view may hold open (each node the kernel knows
    # holds an fd): as many as the kernel lets it, a sandbox half of them
    # (its cached tree is dropped past that), so the others are still served
    limit = int([l.split()[3] for l in open('/proc/%d/limits' % view_pid(x.mnt)) if l.startswith('Max open files')][0])
    many = min(limit + 1000, 300000)
    c.sh('mkdir /workspace/many && cd /workspace/many && python3 -c '
         '"[open(\'f%%d\' %% i, \'w\').close() for i in range(%d)]"' % many, sandbox='v-lease', wait=300)
    # the walk runs in the sandbox's directory (its cwd there), as a host
    # `cd VIEW/ID && ls -lR` does: the kernel keeps that directory's
    # dentries when the sandbox's top entry is dropped; walked three times
    r = subprocess.run([sys.executable, '-c', 'import os\nfor k in range(3):\n    try:\n        print(sum(1 for e in '
                        'os.scandir(".") if e.stat(follow_symlinks=False)), 0)\n    except OSError as e:\n'
                        '        print(-1, e.errno)'],
                       cwd=os.path.join(x.mnt, 'v-lease', 'many'), capture_output=True, text=True, timeout=300)
    n, err = (int(w) for w in r.stdout.split('\n')[0].split())
    t.ok(n == many or err == 23, 'ls -l of %d files through the view (fd limit %d): all, or ENFILE for that sandbox'
         % (many, limit), (n, err))
    names = iter(range(1000))

    def creates_elsewhere():
        return sh('echo x > %s/v1/after-many-%d && cat %s/v1/after-many-*' % (x.mnt, next(names), x.mnt)).returncode == 0
    t.ok(wait_until(creates_elsewhere, 10, 'a create in another sandbox'),
         'and the view soon opens and creates files everywhere again')
    c.sh('touch /workspace/many/late', sandbox='v-lease')
    t.ok(wait_until(lambda: os.path.exists(os.path.join(x.mnt, 'v-lease', 'many', 'late')), 20, 'the sandbox to recover'),
         'and the sandbox that had too many is served again, its cached tree dropped')
    c.ok('destroySandbox', {'sandboxId': 'v-lease'})


def test_daemon_runs_the_view(t, x):
    env = Env()
    d = None
    try:
        mnt = os.path.join(env.root, 'dv')
        os.makedirs(mnt)
        d = subprocess.Popen([x.env.sbx, 'daemon', '--mount', mnt], env=env.env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        wait_until(lambda: env.daemon_pid() is not None, 20, 'the daemon to listen')
        c = env.mcp(['--sandbox', 'dv1'])
        c.initialize()
        c.ok('writeFile', {'path': 'x.txt', 'content': 'via daemon\n'})
        t.ok(wait_until(lambda: os.path.exists(os.path.join(mnt, 'dv1', 'x.txt')), 20, 'the daemon\'s view'),
             'sbx daemon --mount runs the view')
        env.run(['daemon', 'stop'])
        d.wait(30)
        t.ok(not os.path.ismount(mnt), 'and takes it down when it stops')
    finally:
        if d and d.poll() is None:
            d.kill()
        subprocess.run(['umount', '-l', os.path.join(env.root, 'dv')], capture_output=True)
        env.close()


def test_held_across_restart(t, x):
    """A file held open through the view (passthrough) while the daemon
    restarts: the woken sandbox shares the filesystem the held file is on
    (never a second one on the same disk), at once."""
    x.c.sh('echo before > /workspace/held-rw.txt', sandbox='v-held')
    hp = os.path.join(x.mnt, 'v-held', 'held-rw.txt')
    t.ok(wait_until(lambda: os.path.exists(hp), 10, 'the file in the view'), 'a file of a sandbox in the view')
    fd = os.open(hp, os.O_RDWR)
    try:
        t.eq(os.pread(fd, 100, 0), b'before\n', 'held open through the view')
        r = x.env.run(['daemon', 'stop'])
        t.eq(r.returncode, 0, 'the daemon stops', r.stderr)
        os.pwrite(fd, b'between\n', 7)
        c = x.env.socket_client()
        c.initialize()
        t0 = time.monotonic()
        r = c.sh('cat /workspace/held-rw.txt; echo inside >> /workspace/held-rw.txt', sandbox='v-held')
        took = time.monotonic() - t0
        t.eq(r['stdout'], 'before\nbetween\n', 'the sandbox wakes with what the held file wrote meanwhile')
        t.ok(took < 8, 'without waiting for the held file to be closed (%.1f s)' % took)
        t.eq(os.pread(fd, 100, 0), b'before\nbetween\ninside\n', 'the held file reads what the woken sandbox wrote')
        os.pwrite(fd, b'after\n', 22)
        t.eq(c.sh('cat /workspace/held-rw.txt', sandbox='v-held')['stdout'], 'before\nbetween\ninside\nafter\n',
             'one file on one disk, written from both sides')
        # the same daemon starts the sandbox again after its init is killed
        # from the host: the disk the held file keeps is in use, and shared
        inits = inits_of(x.env.daemon_pid(), 'v-held')
        t.eq(len(inits), 1, 'the sandbox\'s init')
        os.kill(inits[0], signal.SIGKILL)
        wait_until(lambda: gone(inits[0]), 10, 'the init to die')
        os.pwrite(fd, b'killed\n', 28)
        r = c.sh('cat /workspace/held-rw.txt; echo again >> /workspace/held-rw.txt', sandbox='v-held')
        t.eq(r['stdout'], 'before\nbetween\ninside\nafter\nkilled\n', 'a sandbox started again by the same daemon '
             'reads what the held file wrote')
        t.eq(os.pread(fd, 100, 35), b'again\n', 'and the held file what it wrote: one filesystem, never two')
        c.close()
        # destroyed while the daemon that mounted it is gone: the next
        # daemon finds the held disk and shuts it down all the same
        t.eq(x.env.run(['daemon', 'stop']).returncode, 0, 'the daemon stops again')
        t.eq(x.env.run(['destroy', 'v-held']).returncode, 0, 'the next one destroys the sandbox, not running')

        def eio():  # the disk is shut down in the background, a moment after the destroy answers
            try:
                return os.pread(fd, 100, 0) is None
            except OSError as err:
                return err.errno == 5
        t.ok(wait_until(eio, 10, 'EIO'), 'and the held file gives EIO, never the discarded disk\'s contents')
    finally:
        os.close(fd)


def test_doctor(t, x):
    r = x.env.run(['doctor'])
    t.ok(b'FUSE' in r.stdout and b'usable' in r.stdout, 'doctor says FUSE is usable', r.stdout[-500:])
    line = [l for l in r.stdout.decode().splitlines() if 'FUSE passthrough' in l]
    t.ok(line and ('offered' in line[0] or 'not offered' in line[0]), 'and whether the kernel offers passthrough', line)
    t.ok('sbx-probe' not in open('/proc/self/mountinfo').read(), 'its probe leaves no mount behind')


if __name__ == '__main__':
    if os.geteuid() != 0:
        print('1..0 # SKIP the view tests run as root (the rootless view is tested in test_rootless.py)')
        sys.exit(77)
    sys.exit(run_tests([test_listing, test_use_is_activity, test_other_users_files, test_no_acls, test_chown_racing_destroy,
                        test_io_uring, test_syscall_suite, test_passthrough, test_coherence, test_git_dubious_ownership,
                        test_escapes,
                        test_workloads, test_many_creates, test_low_fd_limit, test_uring_setting_restored, test_waiters_hold_no_cpu, test_sandbox_cannot_stall_the_view, test_killed_mid_request, test_terminated_mid_request, test_late_answer, test_robustness, test_daemon_runs_the_view, test_held_across_restart,
                        test_doctor], Ctx))
