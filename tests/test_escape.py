"""The escape suite: each attempt first proves its target exists on the host,
then tries to reach it from inside a sandbox."""
import os
import secrets
import shutil
import signal
import socket
import sys
import threading

from sbxtest import Env, gone, inits_of, run_tests, wait_until

SECRET = 'sbx-secret-' + secrets.token_hex(8)
MARK = 'sbx-escape-' + secrets.token_hex(6)


class Ctx:
    def __init__(self):
        self.env = Env()
        self.env.env['SBX_ESCAPE_SECRET'] = SECRET  # the daemon inherits it
        self.c = self.env.mcp(['--sandbox', 'jail'])
        self.c.initialize()
        self.markers = []

    def mark(self, d):
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, MARK)
        with open(p, 'w') as f:
            f.write('host secret\n')
        self.markers.append(p)
        return p

    def close(self):
        for p in self.markers:
            try:
                os.unlink(p)
            except OSError:
                pass
        self.env.close()


def py(x, code, **kw):
    return x.c.sh("python3 - <<'EOF'\n" + code + "\nEOF", **kw)


def test_host_files(t, x):
    targets = [x.mark('/root'), x.mark('/home'), x.mark(x.env.state), x.mark('/tmp'), x.mark('/srv'),
               x.mark('/var/tmp'), x.mark('/mnt')]
    t.ok(all(os.path.exists(p) for p in targets), 'markers exist on the host')
    r = x.c.sh('find / -xdev -name %s 2>/dev/null; find /root /home /tmp /var /srv /mnt /run -name %s 2>/dev/null; true'
               % (MARK, MARK), timeout=60)
    t.eq(r['stdout'], '', 'no host marker is visible inside')
    t.ok(os.path.exists('/etc/shadow'), '/etc/shadow exists on the host')
    r = x.c.sh('cat /etc/shadow /etc/gshadow 2>&1; ls /etc/ssh /etc/ssl/private 2>&1')
    t.ok('root:' not in r['stdout'] and 'No such file' in r['stdout'], 'shadow, gshadow, ssh keys, ssl/private absent',
         r['stdout'])
    r = x.c.sh('ls -A /root /home /tmp; ls / ')
    t.ok(x.env.state not in r['stdout'] and 'sbxt-' not in r['stdout'], 'state and runtime dirs not visible')


def test_host_usr(t, x):
    t.ok(os.path.isdir('/usr/bin'), 'host /usr exists')
    r = x.c.sh('echo changed > /usr/%s && cat /usr/%s && rm -f /usr/bin/env.sbx-test; cp /bin/true /usr/bin/%s; echo ok'
               % (MARK, MARK, MARK))
    t.ok(r['stdout'].startswith('changed'), '/usr is writable inside (overlay)', r)
    t.ok(not os.path.exists('/usr/' + MARK) and not os.path.exists('/usr/bin/' + MARK), 'host /usr untouched')
    r = x.c.sh('pip3 --version >/dev/null 2>&1; ls /usr/lib/python3*/EXTERNALLY-MANAGED 2>&1 || echo removed')
    t.ok('removed' in r['stdout'], 'EXTERNALLY-MANAGED marker removed inside', r['stdout'])


def test_host_processes(t, x):
    t.ok(os.getpid() > 1, 'this test process runs on the host')
    r = x.c.sh('ps -e -o pid=,comm=')
    comms = [l.split(None, 1)[1] for l in r['stdout'].strip().splitlines() if len(l.split(None, 1)) > 1]
    t.ok('python3' not in comms and not any('pytest' in c for c in comms), 'host processes not visible', comms)
    t.ok(r['stdout'].split()[0] == '1', 'pid 1 is the sandbox init')
    r = x.c.sh('kill -9 1; echo $?')
    t.eq(x.c.sh('echo alive')['stdout'], 'alive\n', 'init survives kill -9 from inside')


def test_daemon_socket_and_env(t, x):
    sock = os.path.join(x.env.runtime, 'sbx.sock')
    t.ok(os.path.exists(sock), 'daemon socket exists on the host')
    r = py(x, 'import socket\ns=socket.socket(socket.AF_UNIX)\n'
              'try:\n s.connect(%r); print("connected")\nexcept OSError as e: print("refused", e.errno)' % sock)
    t.ok('refused' in r['stdout'], 'daemon socket unreachable', r)
    r = x.c.sh('find / -xdev -name sbx.sock 2>/dev/null | head -1')
    t.eq(r['stdout'], '', 'no sbx.sock inside')
    t.ok(os.environ.get('SBX_ESCAPE_SECRET') is None and x.env.env['SBX_ESCAPE_SECRET'] == SECRET,
         'the daemon was started with a secret in its environment')
    r = x.c.sh('env; cat /proc/*/environ 2>/dev/null | tr "\\0" "\\n"; true')
    t.ok(SECRET not in r['stdout'], "the daemon's environment is not visible inside")


def test_host_loopback(t, x):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(('127.0.0.1', 0))
    srv.listen(5)
    port = srv.getsockname()[1]
    hits = []
    srv.settimeout(10)  # accept returns as soon as the probe connects

    def accept():
        try:
            hits.append(srv.accept())
        except OSError:
            pass
    th = threading.Thread(target=accept)
    th.start()
    probe = socket.create_connection(('127.0.0.1', port), timeout=5)
    th.join()
    t.ok(len(hits) == 1, 'a host loopback service is listening')
    probe.close()
    r = py(x, 'import socket\ntry:\n socket.create_connection(("127.0.0.1", %d), timeout=3); print("reached")\n'
              'except OSError as e: print("refused")' % port)
    t.eq(r['stdout'].strip(), 'refused', 'host loopback unreachable from inside')
    r = x.c.sh('ip -o link 2>/dev/null | cut -d: -f2 || ls /sys/class/net')
    t.eq(r['stdout'].split(), ['lo'], 'only a loopback interface')
    srv.close()


def test_namespaces_and_mounts(t, x):
    r = x.c.sh('unshare -U true 2>&1; echo rc=$?; unshare -m true 2>&1; echo rc=$?; unshare -n true 2>&1; echo rc=$?')
    t.eq(r['stdout'].count('rc=1'), 3, 'no new user, mount or net namespace', r['stdout'])
    r = x.c.sh('mount -t tmpfs x /mnt 2>&1; echo rc=$?; mount --bind /usr /mnt 2>&1; echo rc=$?')
    t.eq(r['stdout'].count('rc=32') + r['stdout'].count('rc=1'), 2, 'mount refused', r['stdout'])
    r = py(x, 'import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n'
              'r = libc.syscall(175, None, 0, b"")\nprint(r, ctypes.get_errno())\n'
              'r = libc.syscall(313, -1, b"", 0)\nprint(r, ctypes.get_errno())')
    t.ok(all(l.startswith('-1 ') for l in r['stdout'].split('\n') if l), 'init_module/finit_module refused', r)
    r = py(x, 'import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n'
              'print(libc.ptrace(16, 1, None, None), ctypes.get_errno())')
    t.eq(r['stdout'].split()[0], '-1', 'ptrace of init refused')
    r = py(x, 'import ctypes, os, signal\nlibc = ctypes.CDLL(None, use_errno=True)\npid = os.fork()\n'
              'if pid == 0:\n  signal.pause()\n'
              'r = libc.ptrace(16, pid, None, None)\nos.waitpid(pid, 0)\nprint(r)\nos.kill(pid, 9)')
    t.eq(r['stdout'].strip(), '0', 'ptrace of its own child works (strace/gdb)')
    r = x.c.sh('grep CapEff /proc/self/status; cat /proc/sys/kernel/hostname; echo x > /proc/sys/kernel/hostname; echo rc=$?')
    capeff = int(r['stdout'].split()[1], 16)
    t.ok(not capeff & (1 << 21) and not capeff & (1 << 12) and not capeff & (1 << 19), 'no SYS_ADMIN, NET_ADMIN, SYS_PTRACE',
         hex(capeff))
    t.ok('rc=0' not in r['stdout'], '/proc/sys is read-only', r['stdout'])
    r = py(x, 'import fcntl, termios, os\nfd = os.open("/dev/tty", os.O_RDWR) if os.path.exists("/dev/tty") else 0\n'
              'try:\n fcntl.ioctl(0, termios.TIOCSTI, b"x"); print("injected")\nexcept OSError as e: print("refused", e.errno)')
    t.ok('injected' not in r['stdout'], 'TIOCSTI refused', r)


def test_masked_proc(t, x):
    with open('/proc/kallsyms') as f:
        t.ok(f.read(64), '/proc/kallsyms has content on the host')
    dirs = [d for d in ('/proc/acpi', '/proc/driver', '/proc/scsi') if os.path.isdir(d)]
    t.ok(dirs, 'the host has masked /proc directories: %s' % dirs)
    r = x.c.sh('wc -c < /proc/kallsyms; for d in %s; do ls -A $d; touch $d/x 2>&1; mkdir $d/y 2>&1; done; true'
               % ' '.join(dirs))
    lines = r['stdout'].split('\n')
    t.eq(lines[0].strip(), '0', '/proc/kallsyms reads empty inside', r)
    t.eq(r['stdout'].count('Read-only file system'), 2 * len(dirs), 'masked directories are empty and read-only', r)
    # /dev/shm shares /dev's tmpfs: POSIX shared memory works, and it is the sandbox's own
    r = py(x, 'from multiprocessing import shared_memory\nm = shared_memory.SharedMemory(create=True, size=1 << 20)\n'
              'm.buf[:5] = b"hello"\nn = shared_memory.SharedMemory(m.name)\nprint(bytes(n.buf[:5]).decode())\n'
              'n.close(); m.close(); m.unlink()\nimport os; print(oct(os.stat("/dev/shm").st_mode & 0o7777))')
    t.eq(r['stdout'].split(), ['hello', '0o1777'], 'POSIX shared memory in /dev/shm (mode 1777)', r)


def test_socket_families(t, x):
    try:
        socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM).close()
        host_vsock = True
    except OSError:
        host_vsock = False
    t.ok(True, 'vsock on the host: %s (it ignores network namespaces)' % ('present' if host_vsock else 'absent'))
    r = py(x, """import socket
for name, fam, typ, proto in [('vsock', 40, socket.SOCK_STREAM, 0), ('packet', 17, socket.SOCK_RAW, 0),
                              ('netlink-audit', 16, socket.SOCK_RAW, 9), ('netlink-uevent', 16, socket.SOCK_RAW, 15),
                              ('bluetooth', 31, socket.SOCK_STREAM, 0), ('unknown', 60, socket.SOCK_STREAM, 0),
                              ('unix', 1, socket.SOCK_STREAM, 0), ('inet', 2, socket.SOCK_STREAM, 0),
                              ('inet6', 10, socket.SOCK_STREAM, 0), ('netlink-route', 16, socket.SOCK_RAW, 0)]:
    try:
        socket.socket(fam, typ, proto).close()
        print(name, 'ok')
    except OSError as e:
        print(name, e.errno)""")
    got = dict(l.split() for l in r['stdout'].splitlines())
    t.eq({k: got.get(k) for k in ('vsock', 'packet', 'netlink-audit', 'netlink-uevent', 'bluetooth', 'unknown')},
         {k: '97' for k in ('vsock', 'packet', 'netlink-audit', 'netlink-uevent', 'bluetooth', 'unknown')},
         'vsock, packet, bluetooth, unknown families and netlink other than route: EAFNOSUPPORT')
    t.eq({k: got.get(k) for k in ('unix', 'inet', 'inet6', 'netlink-route')},
         {k: 'ok' for k in ('unix', 'inet', 'inet6', 'netlink-route')}, 'unix, inet, inet6 and netlink route work')


INOTIFY_HOG = """import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while n < 1000:
    if libc.inotify_init1(0) < 0:
        break
    n += 1
rt = ctypes.CDLL('librt.so.1', use_errno=True)
rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
q = 0
while q < 100:
    if rt.mq_open(b'/q%d' % q, os.O_CREAT | os.O_RDWR, 0o600, None) < 0:
        break
    q += 1
print(n, q, flush=True)
time.sleep(60)
"""


def test_per_user_counts(t, x):
    """A sandbox that uses up the kernel's per-user counts uses up its own,
    not host root's nor another sandbox's."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    rt = ctypes.CDLL('librt.so.1', use_errno=True)
    rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    x.c.ok('startProcess', {'processId': 'hog', 'command': "python3 - <<'EOF'\n" + INOTIFY_HOG + "EOF"})
    out = ''

    def printed():
        nonlocal out
        out = x.c.ok('getProcessLogs', {'processId': 'hog'})['stdout']
        return out.strip()
    wait_until(printed, 30, 'the hog to report')
    n, q = (int(v) for v in out.split())
    t.ok(n >= 100 and q >= 1, 'the sandbox used up its inotify instances (%d) and message queue bytes (%d queues)' % (n, q))
    fd = libc.inotify_init1(0)
    t.ok(fd >= 0, 'host root can still make an inotify instance')
    if fd >= 0:
        os.close(fd)
    name = ('/sbx-test-%d' % os.getpid()).encode()
    mq = rt.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None)
    t.ok(mq >= 0, 'host root can still open a message queue')
    if mq >= 0:
        os.close(mq)
        rt.mq_unlink(name)
    r = py(x, 'import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(sum(1 for _ in range(20) if libc.inotify_init1(0) >= 0))',
           sandbox='other-counts')
    t.eq(r['stdout'].strip(), '20', 'and so can another sandbox')
    x.c.ok('killProcess', {'processId': 'hog', 'signal': 'SIGKILL'})


def test_symlinks_at_start(t, x):
    """Symlinks a sandbox leaves where its init lays out and mounts its /
    (/var, a Python's directory in /usr) lead into the host's / before the
    root is the sandbox's: the next start must not follow them there."""
    victim = '/var/tmp/%s-dir' % MARK
    os.makedirs(victim)
    os.chmod(victim, 0o777)  # writable by the sandbox's host uid, as /var/tmp is
    x.markers.append(victim)
    with open(victim + '/EXTERNALLY-MANAGED', 'w') as f:
        f.write('host file\n')
    os.chmod(victim + '/EXTERNALLY-MANAGED', 0o666)
    try:
        py = x.c.sh('ls -d /usr/lib/python3*/ | head -1', sandbox='symlinks')['stdout'].strip().rstrip('/')
        r = x.c.sh('mv /var /var.real && ln -s %s /var && rm -rf %s && ln -s %s %s && echo planted'
                   % (victim, py, victim, py), sandbox='symlinks')
        t.eq(r['stdout'], 'planted\n', 'the sandbox replaced /var and %s with symlinks to a host directory' % py, r)
        inits = inits_of(x.env.daemon_pid(), 'symlinks')
        os.kill(inits[0], signal.SIGKILL)
        t.ok(wait_until(lambda: gone(inits[0]), 10, 'its init to go'), 'its init killed: the next call starts it again')
        r = x.c.sh('test -d /var/lib/dpkg -a ! -L /var && ls -d /var.sbx-1 && echo started', sandbox='symlinks')
        t.eq(r['stdout'], '/var.sbx-1\nstarted\n', 'it starts, with a real /var (the symlink moved aside)', r)
        t.eq(sorted(os.listdir(victim)), ['EXTERNALLY-MANAGED'], 'nothing was made or removed in the host directory')
    finally:
        shutil.rmtree(victim, ignore_errors=True)


def test_named_files_at_start(t, x):
    """What a sandbox leaves at /etc/hostname and /etc/hosts, which its init
    writes at every start: a FIFO (which blocked init, and the daemon
    waiting for it, 15 s each start) or a symlink (which failed every
    start) is moved aside, and the sandbox starts."""
    c = x.c
    c.sh('true', sandbox='named')
    inits = inits_of(x.env.daemon_pid(), 'named')
    r = c.sh('rm -f /etc/hostname /etc/hosts && mkfifo /etc/hostname && ln -s /proc/1/fd/3 /etc/hosts && echo planted',
             sandbox='named')
    t.eq(r['stdout'], 'planted\n', 'the sandbox put a FIFO at /etc/hostname and a symlink at /etc/hosts', r)
    os.kill(inits[0], signal.SIGKILL)
    t.ok(wait_until(lambda: gone(inits[0]), 10, 'its init to go'), 'its init killed: the next call starts it again')
    res, _ = c.call('exec', {'sandboxId': 'named', 'command': 'hostname; cat /etc/hostname; grep -c named /etc/hosts; '
                                                            'test -p /etc/hostname.sbx-1 -a -L /etc/hosts.sbx-1 && echo aside'})
    s = res.get('structuredContent', {})
    t.eq((s.get('stdout'), s.get('restarted')), ('named\nnamed\n1\naside\n', True),
         'it starts, named, with what was there moved aside', s)


def test_other_sandbox(t, x):
    x.c.ok('writeFile', {'sandboxId': 'other', 'path': '/workspace/' + MARK, 'content': 'other'})
    x.c.ok('exec', {'sandboxId': 'other', 'command': 'sleep 1000 > /dev/null 2>&1 &'})
    r = x.c.sh('find / -xdev -name %s 2>/dev/null; ps -e -o comm= | grep -c ^sleep; true' % MARK)
    t.eq(r['stdout'].split(), ['0'], "another sandbox's files and processes are invisible")
    ids = x.c.sh('cat /proc/self/uid_map', sandbox='other')['stdout'].split()
    mine = x.c.sh('cat /proc/self/uid_map')['stdout'].split()
    if os.geteuid() == 0:
        t.ok(ids[1] != mine[1] and int(ids[1]) > 65535 and int(mine[1]) > 65535,
             'each sandbox maps root to its own unprivileged host range', (ids, mine))
        # a second daemon (another state directory) on the same host: its
        # sandboxes' ranges are none of the first one's
        env2 = Env()
        try:
            c2 = env2.mcp(['--sandbox', 'second'])
            c2.initialize()
            theirs = c2.sh('cat /proc/self/uid_map')['stdout'].split()
            ranges = lambda m: set(range(int(m[1]) // 65536, (int(m[1]) + int(m[2])) // 65536))
            t.ok(not ranges(theirs) & (ranges(ids) | ranges(mine)),
                 "another daemon's sandbox gets another host range", (theirs, ids, mine))
        finally:
            env2.close()


if __name__ == '__main__':
    sys.exit(run_tests([test_host_files, test_host_usr, test_host_processes, test_daemon_socket_and_env,
                        test_host_loopback, test_namespaces_and_mounts, test_masked_proc, test_socket_families, test_per_user_counts,
                        test_symlinks_at_start, test_named_files_at_start, test_other_sandbox], Ctx))
