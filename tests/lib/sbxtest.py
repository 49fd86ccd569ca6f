"""Test harness for sbx: TAP output, a private daemon per test file, and a
real MCP client over stdio (`sbx mcp`) or the daemon's socket.

Every wait is bounded and waits on an event (a message, a process exit);
nothing sleeps to synchronise. Each test file gets its own SBX_RUNTIME_DIR
and SBX_STATE_DIR and stops its daemon (which removes its sandboxes, mounts
and cgroups) even when a test fails."""
import atexit
import itertools
import json
import os
import queue
import resource
import shutil
import signal
import stat
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

SBX = os.environ.get('SBX', os.path.join(os.path.dirname(__file__), '..', '..', 'build', 'sbx'))
SBX = os.path.abspath(SBX)
TIMEOUT = 30.0


class Fail(Exception):
    pass


# ---- TAP -----------------------------------------------------------------

class Tap:
    def __init__(self):
        self.n = 0
        self.failed = 0
        self.current = None

    def ok(self, cond, name, diag=None):
        self.n += 1
        if cond:
            print('ok %d - %s' % (self.n, name), flush=True)
        else:
            self.failed += 1
            print('not ok %d - %s' % (self.n, name), flush=True)
            if diag is not None:
                for line in str(diag).splitlines()[:40]:
                    print('#   ' + line, flush=True)
        return cond

    def eq(self, got, want, name, diag=None):
        return self.ok(got == want, name, 'got:  %r\nwant: %r%s' % (got, want, '\n%s' % diag if diag else ''))

    def skip(self, name, why):
        self.n += 1
        print('ok %d - %s # SKIP %s' % (self.n, name, why), flush=True)

    def done(self):
        print('1..%d' % self.n, flush=True)
        return 1 if self.failed else 0


def run_tests(tests, setup=None):
    """Runs test functions (each takes the Tap); an exception fails that
    test and the others still run. Returns the exit code."""
    tap = Tap()
    ctx = setup() if setup else None
    try:
        for t in tests:
            started = time.monotonic()
            try:
                t(tap, ctx) if ctx is not None else t(tap)
            except Exception:
                diag = traceback.format_exc()
                env = getattr(ctx, 'env', None)
                if env is not None and env.root:
                    try:  # what the daemon said, for a failure that is its doing
                        diag += '\ndaemon log:\n' + open(os.path.join(env.state, 'daemon.log')).read()[-1500:]
                    except OSError:
                        pass
                    for c in env.clients:
                        if getattr(c, 'stderr', None):
                            diag += '\nsbx mcp stderr: ' + repr(c.stderr[-5:])
                tap.ok(False, t.__name__ + ' raised', diag)
            for line in (ctx.notes() if hasattr(ctx, 'notes') else []):
                print('# ' + line.replace('\n', '\n# '), flush=True)  # what a test's helpers saw go wrong
            print('# %s: %.1fs' % (t.__name__, time.monotonic() - started), flush=True)
    finally:
        if ctx is not None and hasattr(ctx, 'close'):
            ctx.close()
    return tap.done()


# ---- environment -----------------------------------------------------------

class Env:
    """Private runtime and state dirs and a daemon bound to them."""

    def __init__(self, user=None, nofile=None):
        self.nofile = nofile  # RLIMIT_NOFILE of its clients, and so of the daemon they start
        self.root = tempfile.mkdtemp(prefix='sbxt-', dir='/tmp')
        os.chmod(self.root, 0o755)
        self.runtime = os.path.join(self.root, 'run')
        self.state = os.path.join(self.root, 'state')
        self.user = user  # (uid, gid) to run as, or None
        self.env = dict(os.environ)
        self.env['SBX_RUNTIME_DIR'] = self.runtime
        self.env['SBX_STATE_DIR'] = self.state
        # a port of its own for the preview proxy: never the 8787 of a
        # daemon the machine's user runs, nor another test's
        self.env['SBX_PREVIEW_PORT'] = str(free_port())
        self.clients = []
        self.sbx = SBX
        if user:
            for d in (self.runtime, self.state):
                os.makedirs(d, mode=0o700)
                os.chown(d, *user)
            self.env['HOME'] = self.root
            # the user may not be able to reach the checkout (a clone under
            # /root or in a mode 0700 directory): it runs its own copy
            bindir = os.path.join(self.root, 'bin')
            os.makedirs(bindir)
            for name in ('sbx', 'sbx-init'):
                shutil.copy2(os.path.join(os.path.dirname(SBX), name), bindir)
            self.sbx = os.path.join(bindir, 'sbx')
        atexit.register(self.close)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, sig, frame):
        self.close()
        sys.exit(1)

    def preexec(self):
        if self.nofile:
            resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))
        if self.user:
            os.setgroups([])
            os.setgid(self.user[1])
            os.setuid(self.user[0])

    def run(self, args, timeout=TIMEOUT, input=None, cwd=None, env=None):
        e = dict(self.env)
        if env:
            e.update(env)
        return subprocess.run([self.sbx] + args, capture_output=True, timeout=timeout, input=input, env=e,
                              cwd=cwd or self.root, preexec_fn=self.preexec if self.user or self.nofile else None)

    def mcp(self, args=(), cwd=None):
        c = StdioClient(self, list(args), cwd)
        self.clients.append(c)
        return c

    def configure(self, text):
        """Writes text as this daemon's configuration file (SBX_CONFIG);
        returns its path."""
        path = os.path.join(self.root, 'config.json')
        with open(path, 'w') as f:
            f.write(text)
        self.env['SBX_CONFIG'] = path
        return path

    def socket_client(self):
        if not os.path.exists(os.path.join(self.runtime, 'sbx.sock')):
            self.run(['ls'])  # any client verb starts the daemon
        c = SocketClient(os.path.join(self.runtime, 'sbx.sock'))
        self.clients.append(c)
        return c

    def daemon_pid(self):
        try:
            with open(os.path.join(self.runtime, 'sbx.pid')) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def close(self):
        if self.root is None:
            return
        # a view (sbx mount) left inside the root by a test that failed goes
        # first: removing the root through it would start a daemon again.
        # Views only: the daemon's own mounts there are its to undo (a lazy
        # unmount of a shared one would reach its peers, other tests' too)
        with open('/proc/self/mountinfo') as f:
            views = [l.split()[4] for l in f
                     if l.split()[4].startswith(self.root + '/') and l.split(' - ')[1].split()[0] == 'fuse.sbx-view']
        for m in sorted(views, key=len, reverse=True):
            subprocess.run(['umount', '-l', m], capture_output=True)
        for c in self.clients:
            try:
                c.close()
            except Exception:
                pass
        pid = self.daemon_pid()
        try:
            self.run(['daemon', 'stop'], timeout=40)
        except Exception:
            pass
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
            remove_cgroups(pid)
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None


def remove_cgroups(daemon_pid):
    """Removes what a killed daemon left in the cgroup trees (its
    sbx-PID subtree), deepest first, after killing any process still in it."""
    import glob
    for top in glob.glob('/sys/fs/cgroup/*/**/sbx-%d' % daemon_pid, recursive=True) + \
            glob.glob('/sys/fs/cgroup/sbx-%d' % daemon_pid):
        dirs = sorted((d for d, _, _ in os.walk(top)), key=len, reverse=True)
        for d in dirs:
            try:
                for p in open(os.path.join(d, 'cgroup.procs')).read().split():
                    os.kill(int(p), signal.SIGKILL)
            except OSError:
                pass
        for d in dirs:
            try:
                wait_until(lambda: not open(os.path.join(d, 'cgroup.procs')).read().strip(), 5, 'cgroup to empty')
                os.rmdir(d)
            except Exception:
                pass


class Ctx:
    """A private daemon and one initialized `sbx mcp` client whose default
    sandbox is `sandbox`: what most test files start from."""

    def __init__(self, sandbox, user=None):
        self.env = Env(user)
        self.c = self.env.mcp(['--sandbox', sandbox])
        self.c.initialize()

    def close(self):
        self.env.close()


# ---- MCP clients -----------------------------------------------------------

class Client:
    """JSON-RPC over newline-framed messages; a reader thread queues them."""

    def __init__(self):
        self.ids = itertools.count(1)
        self.msgs = queue.Queue()
        self.pending = []  # messages read but not yet consumed
        self.closed = threading.Event()

    def _reader(self, readline):
        try:
            while True:
                line = readline()
                if not line:
                    break
                try:
                    self.msgs.put(json.loads(line))
                except ValueError:
                    self.msgs.put({'_unparsable': line})
        finally:
            self.closed.set()
            self.msgs.put(None)

    def next(self, pred, timeout=TIMEOUT):
        """The next message satisfying pred (others stay pending)."""
        for i, m in enumerate(self.pending):
            if pred(m):
                return self.pending.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Fail('no matching message within %.0f s' % timeout)
            try:
                m = self.msgs.get(timeout=left)
            except queue.Empty:
                continue
            if m is None:
                self.msgs.put(None)
                raise Fail('connection closed')
            if pred(m):
                return m
            self.pending.append(m)

    def send(self, obj):
        self.send_raw((json.dumps(obj) + '\n').encode())

    def request(self, method, params=None, timeout=TIMEOUT):
        i = next(self.ids)
        msg = {'jsonrpc': '2.0', 'id': i, 'method': method}
        if params is not None:
            msg['params'] = params
        self.send(msg)
        return self.next(lambda m: m.get('id') == i and 'method' not in m, timeout)

    def notify(self, method, params=None):
        msg = {'jsonrpc': '2.0', 'method': method}
        if params is not None:
            msg['params'] = params
        self.send(msg)

    def initialize(self, version='2025-06-18'):
        r = self.request('initialize', {'protocolVersion': version, 'capabilities': {},
                                        'clientInfo': {'name': 'sbx-tests', 'version': '1'}})
        self.notify('notifications/initialized')
        return r

    def call(self, tool, args=None, timeout=TIMEOUT, progress=False):
        """tools/call; returns (result, progress notifications)."""
        i = next(self.ids)
        params = {'name': tool, 'arguments': args or {}}
        if progress:
            params['_meta'] = {'progressToken': 'p%d' % i}
        self.send({'jsonrpc': '2.0', 'id': i, 'method': 'tools/call', 'params': params})
        r = self.next(lambda m: m.get('id') == i and 'method' not in m, timeout)
        if 'result' not in r:
            raise Fail('tools/call %s: %r' % (tool, r))
        notes = []
        if progress:
            tok = 'p%d' % i
            keep = []
            for m in self.pending:
                if m.get('method') == 'notifications/progress' and m['params'].get('progressToken') == tok:
                    notes.append(m)
                else:
                    keep.append(m)
            self.pending = keep
        return r['result'], notes

    def ok(self, tool, args=None, timeout=TIMEOUT):
        """structuredContent of a successful call; raises on a tool error."""
        res, _ = self.call(tool, args, timeout)
        if res.get('isError'):
            raise Fail('%s failed: %s' % (tool, res['structuredContent']))
        return res['structuredContent']

    def err(self, tool, args=None, timeout=TIMEOUT):
        """The error code of a call expected to fail (None if it did not)."""
        res, _ = self.call(tool, args, timeout)
        if not res.get('isError'):
            return None
        return res['structuredContent']['error']['code']

    def sh(self, command, sandbox=None, wait=TIMEOUT, **kw):
        """exec; keyword arguments are exec's own (timeout is in ms). A
        timed-out command (isError, COMMAND_TIMEOUT) still gives its result."""
        args = dict(command=command, **kw)
        if sandbox:
            args['sandboxId'] = sandbox
        if 'timeout' in kw:
            wait = max(wait, kw['timeout'] / 1000 + 30)
        res, _ = self.call('exec', args, wait)
        sc = res.get('structuredContent', {})
        if res.get('isError') and not sc.get('timedOut'):
            raise Fail('exec failed: %s' % sc)
        return sc


class StdioClient(Client):
    def __init__(self, env, args, cwd=None):
        super().__init__()
        self.p = subprocess.Popen([env.sbx, 'mcp'] + args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env.env, cwd=cwd or env.root,
                                  preexec_fn=env.preexec if env.user or env.nofile else None)
        threading.Thread(target=self._reader, args=(self.p.stdout.readline,), daemon=True).start()
        self.stderr = []
        threading.Thread(target=lambda: self.stderr.extend(self.p.stderr.readlines()), daemon=True).start()

    def send_raw(self, data):
        self.p.stdin.write(data)
        self.p.stdin.flush()

    def close(self):
        if self.p.poll() is None:
            try:
                self.p.stdin.close()
            except OSError:
                pass
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


class SocketClient(Client):
    def __init__(self, path):
        super().__init__()
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.f = self.s.makefile('rb')
        threading.Thread(target=self._reader, args=(self.f.readline,), daemon=True).start()

    def send_raw(self, data):
        self.s.sendall(data)

    def close(self):
        try:
            self.s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.s.close()


def forks(n, seconds):
    """A shell command that forks up to n children that each sleep for
    seconds, and prints how many it made (it stops at the first refusal)."""
    return """python3 - <<'EOF'
import os, time
n = 0
for i in range(%d):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(%d)
        os._exit(0)
    n += 1
print(n)
EOF""" % (n, seconds)


def free_port():
    """A TCP port on loopback nothing listens on right now."""
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    p = s.getsockname()[1]
    s.close()
    return p


def children(parent, comm):
    """Host pids of parent's children whose command name is comm."""
    pids = []
    for p in os.listdir('/proc'):
        if not p.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % p) as f:
                st = f.read()
        except OSError:
            continue
        if st[st.index('(') + 1:st.rindex(')')] == comm and int(st[st.rindex(')') + 2:].split()[1]) == parent:
            pids.append(int(p))
    return pids


def inits_of(daemon_pid, sandbox):
    """Host pids of the daemon's sandbox inits named sandbox (an init's
    hostname is its sandbox's id)."""
    return [pid for pid in children(daemon_pid, 'sbx-init') if hostname_of(pid) == sandbox]


def gone(pid):
    """The process has ended (a zombie nobody reaps is gone too)."""
    try:
        with open('/proc/%d/stat' % pid) as f:
            return f.read().split(') ')[1][0] == 'Z'
    except OSError:
        return True


def comm_of(pid):
    """A process's command name, or None once it is gone."""
    try:
        with open('/proc/%d/comm' % int(pid)) as f:
            return f.read().strip()
    except OSError:
        return None


def hostname_of(pid):
    """The hostname a process's sandbox gave it (its id), or None."""
    try:  # what a sandbox left there may be a FIFO: never waited for
        fd = os.open('/proc/%d/root/etc/hostname' % int(pid), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        try:
            return os.read(fd, 128).decode(errors='replace').strip() if stat.S_ISREG(os.fstat(fd).st_mode) else None
        finally:
            os.close(fd)
    except OSError:
        return None


def left_running(name, seconds=20):
    """Shell text that prints how many processes named name are left in
    the sandbox, once there are none or after seconds: a tree a call
    killed (a timeout, a cancel) has SIGKILL pending when the call answers,
    and the sandbox's init reaps it just after."""
    return ('for i in $(seq %d); do n=$(ps -e -o comm= | grep -c "^%s$"); [ "$n" = 0 ] && break; sleep 0.05; done; echo $n'
            % (seconds * 20, name))


def wait_until(pred, timeout=TIMEOUT, what='condition'):
    """Polls a condition that has no event to wait on (a process leaving
    /proc, a cgroup emptying), bounded. Not a sleep: it returns as soon as
    the condition holds."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    raise Fail('timed out waiting for ' + what)
