"""The sbx CLI: exec streams and exits with the command's code, ls,
destroy, cp both ways, doctor, daemon stop; `sbx mcp` autostarts the daemon
detached, and two starters race for one daemon."""
import os
import subprocess
import sys
import threading

from sbxtest import SBX, Env, run_tests, wait_until


class Ctx:
    def __init__(self):
        self.env = Env()

    def close(self):
        self.env.close()


def test_exec(t, x):
    r = x.env.run(['exec', '-s', 'cli', '--', 'echo out; echo err >&2; exit 5'])
    t.eq((r.returncode, r.stdout, r.stderr), (5, b'out\n', b'err\n'), 'exec streams stdout/stderr and exits with the code')
    r = x.env.run(['exec', '-s', 'cli', '-e', 'A=1', '--cwd', '/tmp', '--', 'sh', '-c', 'echo "$A $PWD"'])
    t.eq(r.stdout, b'1 /tmp\n', 'words after -- are quoted; -e and --cwd apply')
    r = x.env.run(['exec', '-s', 'cli', '--timeout', '300', '--', 'sleep 30'])
    t.ok(r.returncode == 124 and b'timed out' in r.stderr, 'timeout: said, and exit code 124 as timeout(1)', (r.returncode, r.stderr))
    p = subprocess.Popen([SBX, 'exec', '-s', 'cli', '--', 'echo ready; sleep 100'],
                         stdout=subprocess.PIPE, env=x.env.env, cwd=x.env.root)
    t.eq(p.stdout.readline(), b'ready\n', 'output streams before the command ends')
    p.send_signal(2)
    t.eq(p.wait(timeout=20), 130, 'Ctrl-C cancels and exits 130')
    r = x.env.run(['exec', '-s', 'cli', '--', 'ps -e -o comm= | grep -c ^sleep'])
    t.eq(r.stdout.strip(), b'0', 'the interrupted command is gone')


def test_default_id(t, x):
    d = os.path.join(x.env.root, 'My Project')
    os.makedirs(d)
    r = x.env.run(['exec', '--', 'hostname'], cwd=d)
    t.ok(r.stdout.decode().startswith('my-project-'), 'default sandbox is a slug of the cwd plus a hash', r.stdout)


def test_ls_destroy(t, x):
    x.env.run(['exec', '-s', 'gone', '--', 'true'])
    r = x.env.run(['ls'])
    t.ok(b'gone' in r.stdout and r.returncode == 0, 'ls lists sandboxes')
    r = x.env.run(['destroy', 'gone'])
    t.eq((r.returncode, r.stdout), (0, b'destroyed gone\n'), 'destroy says what it did')
    t.ok(b'gone' not in x.env.run(['ls']).stdout, 'destroyed sandbox is not listed')
    r = x.env.run(['destroy', 'gone'])
    t.ok(r.returncode == 1 and b'SANDBOX_NOT_FOUND' in r.stderr, 'destroy of a missing sandbox fails clearly')


def test_cp(t, x):
    src = os.path.join(x.env.root, 'src')
    os.makedirs(os.path.join(src, 'sub'))
    with open(os.path.join(src, 'a.txt'), 'w') as f:
        f.write('alpha\n')
    with open(os.path.join(src, 'sub', 'b.bin'), 'wb') as f:
        f.write(bytes(range(256)))
    r = x.env.run(['cp', src, 'cp1:/workspace/proj'])
    t.eq(r.returncode, 0, 'cp host dir -> sandbox', r.stderr)
    r = x.env.run(['exec', '-s', 'cp1', '--', 'cat /workspace/proj/a.txt; wc -c < /workspace/proj/sub/b.bin'])
    t.eq(r.stdout, b'alpha\n256\n', 'files arrived')
    dst = os.path.join(x.env.root, 'back')
    r = x.env.run(['cp', 'cp1:/workspace/proj', dst])
    t.eq(r.returncode, 0, 'cp sandbox dir -> host', r.stderr)
    t.eq(open(os.path.join(dst, 'sub', 'b.bin'), 'rb').read(), bytes(range(256)), 'binary file came back exact')
    r = x.env.run(['cp', 'cp1:/workspace/proj/a.txt', os.path.join(x.env.root, 'one.txt')])
    t.eq(open(os.path.join(x.env.root, 'one.txt')).read(), 'alpha\n', 'cp of a single file')


def test_doctor(t, x):
    r = x.env.run(['doctor'])
    out = r.stdout.decode()
    for word in ('user namespaces', 'idmapped mounts', 'overlayfs', 'cgroups', 'seccomp', 'FUSE', 'disk quota', 'configuration', 'pidfd', 'clone3'):
        t.ok(word in out, 'doctor reports ' + word)


def test_autostart_and_stop(t, x):
    env = Env()
    try:
        c = env.mcp(['--sandbox', 'auto'])
        c.initialize()
        c.sh('true')
        pid = env.daemon_pid()
        t.ok(pid is not None, 'sbx mcp started a daemon')
        st = open('/proc/%d/stat' % pid).read().split(')')[1].split()
        t.ok(st[3] == str(pid) or int(st[3]) == pid, 'daemon runs in its own session (setsid)', st[:4])
        t.eq(os.readlink('/proc/%d/cwd' % pid), '/', 'daemon cwd is /')
        fds = {os.readlink('/proc/%d/fd/%s' % (pid, fd)) for fd in ('1', '2')}
        t.eq(fds, {os.path.join(env.state, 'daemon.log')}, 'daemon stdio is its log file, not the agent pipes')
        c.close()
        t.eq(c.p.returncode, 0, 'sbx mcp exits on stdin EOF while the daemon stays')
        t.ok(os.path.exists('/proc/%d' % pid), 'daemon outlives the agent')
        c2 = env.mcp(['--sandbox', 'auto'])
        c2.initialize()
        t.ok(any(s['sandboxId'] == 'auto' for s in c2.ok('listSandboxes')['sandboxes']), 'sandbox outlives the agent')
        c2.close()
        r = env.run(['daemon', 'stop'])
        t.eq(r.returncode, 0, 'daemon stop')
        t.ok(not os.path.exists('/proc/%d' % pid) or 'Z' in open('/proc/%d/stat' % pid).read().split(')')[1][:3],
             'daemon is gone')
    finally:
        env.close()


def test_racing_starters(t, x):
    env = Env()
    try:
        results = []
        def go():
            results.append(env.run(['exec', '-s', 'race', '--', 'echo hi']))
        threads = [threading.Thread(target=go) for _ in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        t.ok(len(results) == 6 and all(r.returncode == 0 and r.stdout == b'hi\n' for r in results),
             'six racing starters all get served', [(r.returncode, r.stderr[-200:]) for r in results])
        daemons = [p for p in os.listdir('/proc') if p.isdigit() and _is_daemon_of(p, env)]
        t.eq(len(daemons), 1, 'exactly one daemon won the lock')
    finally:
        env.close()


def _is_daemon_of(pid, env):
    try:
        if open('/proc/%s/comm' % pid).read().strip() != 'sbx':
            return False  # sandbox inits share the daemon's command line
        cmd = open('/proc/%s/cmdline' % pid, 'rb').read().split(b'\0')
        e = open('/proc/%s/environ' % pid, 'rb').read().split(b'\0')
    except OSError:
        return False
    return len(cmd) > 1 and cmd[1] == b'daemon' and ('SBX_RUNTIME_DIR=' + env.runtime).encode() in e


def test_stdin(t, x):
    r = subprocess.run([SBX, 'exec', '-s', 'cli', '-i', '--', 'tr a-z A-Z; echo rc=$?'], input=b'hi there\n',
                       capture_output=True, env=x.env.env, cwd=x.env.root, timeout=60)
    t.eq(r.stdout, b'HI THERE\nrc=0\n', 'sbx exec -i forwards stdin to the command')
    r = subprocess.run([SBX, 'exec', '-s', 'cli', '--', 'cat; echo end'], input=b'not read', capture_output=True,
                       env=x.env.env, cwd=x.env.root, timeout=60)
    t.eq(r.stdout, b'end\n', 'without -i the command\'s stdin is empty, as docker exec')


def test_never_guesses(t, x):
    before = x.env.run(['ls']).stdout
    for bad in ('BAD_ID', 'Has Space', '../../etc', '', 'a' * 100):
        r = x.env.run(['exec', '-s', bad, '--', 'true'])
        t.ok(r.returncode != 0 and b'invalid sandbox id' in r.stderr, 'exec -s %r is refused with the rule' % bad[:20],
             (r.returncode, r.stderr[-200:]))
        r = x.env.run(['destroy', bad or "''"]) if bad else x.env.run(['destroy', ''])
        t.ok(r.returncode != 0 and b'invalid sandbox id' in r.stderr, 'destroy %r too' % bad[:20], r.stderr[-200:])
    r = x.env.run(['cp', 'Bad_Id:/etc/passwd', os.path.join(x.env.root, 'p')])
    t.ok(r.returncode == 2 and b'invalid sandbox id' in r.stderr, 'cp with a bad id says so', r.stderr)
    t.eq(x.env.run(['ls']).stdout, before, 'and no sandbox was made or touched')
    r = x.env.run(['--version'])
    t.ok(r.returncode == 0 and r.stdout.startswith(b'sbx 0.'), 'sbx --version', r.stdout)
    r = x.env.run(['-h'])
    t.ok(r.returncode == 0 and b'usage: sbx' in r.stdout, 'sbx -h', r.stdout[:100])


def test_help(t, x):
    names = ['mcp', 'daemon', 'exec', 'session', 'ls', 'destroy', 'cp', 'expose', 'doctor', 'mount', 'umount', 'help']
    for n in names:
        a, b = x.env.run(['help', n]), x.env.run([n, '--help'])
        t.ok(a.returncode == 0 and a.stdout.startswith(b'usage: sbx ' + n.encode()) and b'Exit codes' in a.stdout,
             'sbx help %s' % n, a.stdout[:80] + a.stderr)
        t.eq((b.returncode, b.stdout), (0, a.stdout), 'sbx %s --help says the same' % n)
    r = x.env.run(['exec', '-s', 'helpme', '--', 'echo', '--help'])
    t.eq(r.stdout, b'--help\n', 'after --, --help belongs to the command')
    r = x.env.run(['help', 'nope'])
    t.ok(r.returncode == 2 and b"no command 'nope'" in r.stderr, 'help for an unknown command is an error')


def test_session(t, x):
    r = x.env.run(['session', '-s', 'ses', 'create', 'build', '--cwd', '/tmp', '-e', 'K=v'])
    t.eq((r.returncode, r.stdout), (0, b'created session build (cwd /tmp)\n'), 'sbx session create', r.stderr)
    r = x.env.run(['exec', '-s', 'ses', '--session', 'build', '--', 'pwd; echo $K; f() { echo fn; }'])
    t.eq(r.stdout, b'/tmp\nv\n', 'exec --session runs in it')
    t.eq(x.env.run(['exec', '-s', 'ses', '--session', 'build', '--', 'f']).stdout, b'fn\n', 'and it keeps its shell state')
    r = x.env.run(['session', '-s', 'ses', 'ls'])
    t.ok(r.returncode == 0 and b'build' in r.stdout and b'default' in r.stdout, 'sbx session ls', r.stdout)
    r = x.env.run(['session', '-s', 'ses', 'rm', 'build'])
    t.eq((r.returncode, r.stdout), (0, b'deleted session build\n'), 'sbx session rm')
    r = x.env.run(['session', '-s', 'ses', 'rm', 'build'])
    t.ok(r.returncode == 1 and b'SESSION_NOT_FOUND' in r.stderr, 'a missing session is an error', r.stderr)
    r = x.env.run(['session', '-s', 'ses', 'create', 'Bad Name'])
    t.ok(r.returncode == 2 and b'invalid session id' in r.stderr, 'a bad session id is refused', r.stderr)


def test_daemon_http_while_running(t, x):
    x.env.run(['ls'])  # a daemon runs
    import socket
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
    s.close()
    r = x.env.run(['daemon', '--http', '127.0.0.1:%d' % port])
    t.ok(r.returncode == 0 and b'now serves MCP over HTTP at http://127.0.0.1:%d/mcp' % port in r.stdout,
         'sbx daemon --http while one runs: that daemon serves HTTP, and says how to keep it', r.stdout + r.stderr)
    import urllib.request
    token = open(os.path.join(x.env.state, 'http-token')).read().strip()
    req = urllib.request.Request('http://127.0.0.1:%d/mcp' % port, data=b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
                                 headers={'Authorization': 'Bearer ' + token, 'Content-Type': 'application/json',
                                          'Accept': 'application/json, text/event-stream'})
    with urllib.request.urlopen(req, timeout=10) as resp:
        t.eq(resp.status, 200, 'and it answers there')
    r = x.env.run(['daemon'])
    t.ok(r.returncode == 3 and b'runs already' in r.stderr, 'a second plain daemon says one runs', r.stderr)


if __name__ == '__main__':
    sys.exit(run_tests([test_exec, test_stdin, test_never_guesses, test_default_id, test_ls_destroy, test_cp, test_doctor, test_autostart_and_stop,
                        test_racing_starters, test_help, test_session, test_daemon_http_while_running], Ctx))
