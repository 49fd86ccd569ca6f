"""The sbx CLI: exec streams and exits with the command's code, ls,
destroy, cp both ways, doctor, daemon stop; `sbx mcp` autostarts the daemon
detached, and two starters race for one daemon."""
import hashlib
import os
import re
import subprocess
import sys
import threading

from sbxtest import SBX, Env, left_running, run_tests, wait_until


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
    r = x.env.run(['exec', '-s', 'cli', '--timeout', '0.3', '--', 'sleep 30'])
    t.ok(r.returncode == 124 and 250 <= int((re.search(rb'timed out after ([0-9]+) ms', r.stderr) or [0, b'0'])[1]) < 20000,
         'timeout: a bare number is seconds (as for timeout(1) and --sleep-after); said, and exit code 124',
         (r.returncode, r.stderr))
    r = x.env.run(['exec', '-s', 'cli', '--', 'head -c 300000 /dev/urandom > /tmp/r.bin; printf "a\\0b\\377" >> /tmp/r.bin; '
                   'sha256sum < /tmp/r.bin'])
    want = r.stdout.split()[0].decode()
    r = x.env.run(['exec', '-s', 'cli', '--', 'cat /tmp/r.bin'])
    t.eq((len(r.stdout), hashlib.sha256(r.stdout).hexdigest()), (300004, want),
         'exec output reaches stdout byte for byte (binary, NUL, bytes that are not UTF-8)')
    r = x.env.run(['exec', '-s', 'cli', '--timeout', '300ms', '--', 'sleep 30'])
    t.eq(r.returncode, 124, '--timeout takes a unit')
    for bad in ('abc', '-5', '0', '2x'):
        r = x.env.run(['exec', '-s', 'cli', '--timeout', bad, '--', 'true'])
        t.ok(r.returncode == 2 and b'--timeout takes a duration' in r.stderr, '--timeout %s is a usage error' % bad, r.stderr)
    p = subprocess.Popen([SBX, 'exec', '-s', 'cli', '--', 'echo ready; sleep 100'],
                         stdout=subprocess.PIPE, env=x.env.env, cwd=x.env.root)
    t.eq(p.stdout.readline(), b'ready\n', 'output streams before the command ends')
    p.send_signal(2)
    t.eq(p.wait(timeout=20), 130, 'Ctrl-C cancels and exits 130')
    r = x.env.run(['exec', '-s', 'cli', '--', left_running('sleep')])
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
    t.eq((r.returncode, r.stderr), (1, b"sbx: no sandbox 'gone' (`sbx ls` lists them)\n"),
         'destroy of a missing sandbox fails clearly, with advice for the command line')
    r = x.env.run(['ps', '-s', 'gone'])
    t.eq((r.returncode, r.stderr), (1, b"sbx: no sandbox 'gone' (`sbx ls` lists them)\n"), 'so does ps of one')


def test_create(t, x):
    r = x.env.run(['create', 'made', '--memory', '256', '--disk', '512', '--sleep-after', '5m', '-e', 'A=1', '--network', 'egress'])
    t.eq((r.returncode, r.stdout.splitlines()[0] if r.stdout else b''), (0, b'sandbox made created'), 'sbx create makes a sandbox', r.stderr)
    r = x.env.run(['exec', '-s', 'made', '--', 'echo $A; df -m /workspace | tail -1 | awk "{print \\$2}"; ip -o link | grep -vc " lo:"'])
    out = r.stdout.decode().split()
    t.ok(out[0] == '1' and int(out[1]) <= 512 and int(out[2]) >= 1, 'with its environment, disk and network', out)
    r = x.env.run(['create', 'made', '--network', 'none'])
    t.ok(r.returncode == 1 and b'NOT changed' in r.stdout and b'network' in r.stdout,
         'on one that exists it names what needs a new sandbox, and fails', (r.returncode, r.stdout))
    t.eq(x.env.run(['create', 'made', '--memory', 'lots']).returncode, 2, 'a bad value is a usage error')
    r = x.env.run(['create', 'huge', '--memory', '99999999'])
    t.eq((r.returncode, r.stderr), (1, b'sbx: createSandbox: VALIDATION_FAILED: --memory (MB): must be from 16 to 1048576\n'),
         'one the daemon refuses names the option, once', r.stderr)
    x.env.run(['destroy', 'made'])
    x.env.run(['create', 'tiny', '--disk', '32'])
    big = os.path.join(x.env.root, 'big.bin')
    with open(big, 'wb') as f:
        f.truncate(50 << 20)
    r = x.env.run(['cp', big, 'tiny:big.bin'])
    t.eq((r.returncode, r.stderr), (1, b"sbx cp: tiny:big.bin: no space left on the sandbox's disk (its diskMB)\n"),
         'sbx cp past a sandbox\'s disk says so')
    os.unlink(big)
    x.env.run(['destroy', 'tiny'])


def test_notices(t, x):
    """What the daemon tells an agent beside a result, the CLI tells on stderr."""
    x.env.run(['exec', '-s', 'note', '--', 'true'])
    x.env.run(['daemon', 'stop'])
    r = x.env.run(['exec', '-s', 'note', '--', 'echo on'])
    t.ok(r.stdout == b'on\n' and b'sandbox note was started again' in r.stderr, 'a restart is said', r.stderr)
    c = x.env.socket_client()
    c.initialize()
    c.ok('createSandbox', {'sandboxId': 'note', 'sleepAfter': '1s'})
    t.ok(wait_until(lambda: {s['sandboxId']: s['status'] for s in c.ok('listSandboxes')['sandboxes']}.get('note')
                    == 'sleeping', 30, 'the idle reset'), 'the sandbox sleeps')
    c.close()
    r = x.env.run(['exec', '-s', 'note', '--', 'true'])
    t.ok(r.returncode == 0 and b'had been reset after being idle' in r.stderr, 'an idle reset is said', r.stderr)
    r = x.env.run(['exec', '-s', 'note', '--', 'python3 -c "import socket; socket.getaddrinfo(\'example.com\', 80)"'])
    t.ok(r.returncode == 1 and b'sbx: hint: this sandbox has no network' in r.stderr, 'and so is a hint', r.stderr)


def tree_facts(root):
    """What a copy must keep: type, mode, mtime, content or link target."""
    facts = {}
    for d, dirs, files in os.walk(root):
        for n in dirs + files:
            p = os.path.join(d, n)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if os.path.islink(p):
                facts[rel] = ('link', os.readlink(p))
            elif os.path.isdir(p):
                facts[rel] = ('dir', oct(st.st_mode & 0o7777), int(st.st_mtime))
            else:
                facts[rel] = ('file', oct(st.st_mode & 0o7777), int(st.st_mtime), open(p, 'rb').read())
    return facts


def test_cp(t, x):
    src = os.path.join(x.env.root, 'src')
    os.makedirs(os.path.join(src, 'sub', 'deep'))
    with open(os.path.join(src, 'a.txt'), 'w') as f:
        f.write('alpha\n')
    with open(os.path.join(src, 'run.sh'), 'w') as f:
        f.write('#!/bin/sh\necho ran\n')
    os.chmod(os.path.join(src, 'run.sh'), 0o755)
    with open(os.path.join(src, 'sub', 'b.bin'), 'wb') as f:
        f.write(bytes(range(256)) * 1000)
    os.chmod(os.path.join(src, 'sub', 'b.bin'), 0o640)
    os.symlink('a.txt', os.path.join(src, 'rel-link'))
    os.symlink('/etc/hostname', os.path.join(src, 'abs-link'))
    with open(os.path.join(src, 'sub', 'deep', ('long-name-' * 12) + '.txt'), 'w') as f:
        f.write('deep\n')
    for p in ['a.txt', 'sub/b.bin', 'sub/deep', 'sub']:
        os.utime(os.path.join(src, p), (1600000000, 1600000000))
    x.env.run(['exec', '-s', 'cp1', '--', 'true'])
    r = x.env.run(['cp', src, 'cp1:proj'])
    t.eq((r.returncode, r.stdout, r.stderr), (0, b'', b''), 'cp of a host tree into a sandbox says nothing on success')
    r = x.env.run(['exec', '-s', 'cp1', '--', 'cd /workspace/proj && ./run.sh && stat -c "%a %Y" sub/b.bin a.txt && '
                   'readlink rel-link abs-link'])
    t.eq(r.stdout, b'ran\n640 1600000000\n644 1600000000\na.txt\n/etc/hostname\n',
         'relative paths are under /workspace; modes (a script stays executable), mtimes and symlinks arrive', r.stderr)
    r = x.env.run(['cp', os.path.join(src, 'a.txt'), 'cp1:/workspace/newdir/'])
    t.eq((r.returncode, r.stderr), (0, b''), 'cp into a directory named with a trailing slash that is not there yet')
    t.eq(x.env.run(['exec', '-s', 'cp1', '--', 'ls /workspace/newdir']).stdout, b'a.txt\n', 'makes it and copies into it')
    dst = os.path.join(x.env.root, 'back')
    r = x.env.run(['cp', 'cp1:/workspace/proj', dst])
    t.eq(r.returncode, 0, 'cp of a sandbox tree to the host', r.stderr)
    t.eq(tree_facts(dst), tree_facts(src), 'the round trip keeps every file, mode, mtime and symlink')
    d = subprocess.run(['diff', '-r', '--no-dereference', src, dst], capture_output=True)
    t.eq(d.returncode, 0, 'diff -r finds no difference', d.stdout)
    x.env.run(['exec', '-s', 'cp1', '--', 'truncate -s 300M /workspace/sparse.bin && printf end >> /workspace/sparse.bin'])
    r = x.env.run(['cp', 'cp1:sparse.bin', os.path.join(x.env.root, 'sparse.bin')])
    st = os.stat(os.path.join(x.env.root, 'sparse.bin'))
    t.ok(r.returncode == 0 and st.st_size == (300 << 20) + 3 and st.st_blocks * 512 < (1 << 20),
         'a sparse file stays sparse on the host (%d bytes, %d allocated)' % (st.st_size, st.st_blocks * 512), r.stderr)
    with open(os.path.join(x.env.root, 'sparse.bin'), 'rb') as f:
        f.seek(300 << 20)
        t.eq(f.read(), b'end', 'with its data where it was')
    os.unlink(os.path.join(x.env.root, 'sparse.bin'))
    fifo = os.path.join(x.env.root, 'fifo')  # not /dev/null itself: a failure must not change the real one
    os.mkfifo(fifo, 0o600)
    heard = {}
    th = threading.Thread(target=lambda: heard.setdefault('r', open(fifo, 'rb').read()), daemon=True)
    th.start()
    r = x.env.run(['cp', 'cp1:proj/a.txt', fifo])
    th.join(20)
    t.eq((r.returncode, r.stderr, heard.get('r'), oct(os.stat(fifo).st_mode & 0o7777)), (0, b'', b'alpha\n', '0o600'),
         'cp onto what is not a regular file (a FIFO, /dev/null) writes the data to it and changes nothing of it')
    into = os.path.join(x.env.root, 'into')
    os.makedirs(into)
    x.env.run(['cp', 'cp1:proj/sub', into])
    t.ok(os.path.isfile(os.path.join(into, 'sub', 'b.bin')), 'into an existing directory, the source keeps its name')
    r = x.env.run(['cp', 'cp1:proj/a.txt', os.path.join(x.env.root, 'one.txt')])
    t.eq(open(os.path.join(x.env.root, 'one.txt')).read(), 'alpha\n', 'a single file, as a new name')
    r = x.env.run(['cp', os.path.join(src, 'a.txt'), 'cp1:proj/renamed.txt'])
    t.eq(x.env.run(['exec', '-s', 'cp1', '--', 'cat /workspace/proj/renamed.txt']).stdout, b'alpha\n', 'and into a sandbox')
    # tar streams
    r = subprocess.run([SBX, 'cp', 'cp1:proj', '-'], capture_output=True, env=x.env.env, cwd=x.env.root)
    names = subprocess.run(['tar', '-tf', '-'], input=r.stdout, capture_output=True).stdout.decode().split()
    t.ok(r.returncode == 0 and 'proj/sub/b.bin' in names and 'proj/rel-link' in names, '`sbx cp ID:PATH -` writes a tar',
         names[:5])
    tarball = subprocess.run(['tar', '-C', src, '-cf', '-', 'sub'], capture_output=True).stdout
    r = subprocess.run([SBX, 'cp', '-', 'cp1:/tmp/unpacked'], input=tarball, capture_output=True, env=x.env.env)
    t.eq(r.returncode, 0, '`sbx cp - ID:DIR` unpacks one', r.stderr)
    t.eq(x.env.run(['exec', '-s', 'cp1', '--', 'stat -c %a /tmp/unpacked/sub/b.bin']).stdout, b'640\n', 'with its modes')
    # what fails
    r = x.env.run(['cp', 'nosuch:/etc/hostname', os.path.join(x.env.root, 'n')])
    t.ok(r.returncode == 1 and b'SANDBOX_NOT_FOUND' in r.stderr, 'a missing sandbox is SANDBOX_NOT_FOUND', r.stderr)
    listed = x.env.run(['ls']).stdout
    t.ok(b'cp1' in listed and b'nosuch' not in listed, 'and it is not created', listed)
    r = x.env.run(['cp', 'cp1:proj/missing', os.path.join(x.env.root, 'm')])
    t.ok(r.returncode == 1 and r.stderr == b'sbx cp: cp1:proj/missing: No such file or directory\n'
         and not os.path.exists(os.path.join(x.env.root, 'm')),
         'a missing sandbox path says so in one line and makes nothing', r.stderr)
    r = x.env.run(['cp', 'cp1:proj', os.path.join(x.env.root, 'nodir', 'p')])
    t.ok(r.returncode == 1 and r.stderr.count(b'\n') == 1 and b'nodir/p: No such file or directory' in r.stderr,
         'a missing host directory is one error, not one per file', r.stderr)


def test_cp_hostile_sandbox(t, x):
    """A sandbox controls what its tar writes: the host side makes nothing
    outside the destination, follows no link, makes no device and no set-id
    file."""
    outside = os.path.join(x.env.root, 'outside')
    os.makedirs(outside)
    x.env.run(['exec', '-s', 'evil', '--', 'true'])
    maker = r"""
import io, sys, tarfile
b = io.BytesIO()
with tarfile.open(fileobj=b, mode='w', format=tarfile.GNU_FORMAT) as t:
    def add(name, data=b'x', **kw):
        i = tarfile.TarInfo(name); i.size = len(data)
        for k, v in kw.items(): setattr(i, k, v)
        t.addfile(i, io.BytesIO(data) if i.isreg() else None)
    add('loot', type=tarfile.DIRTYPE, mode=0o755)
    add('loot/ok.txt', b'fine')
    add('loot/../../outside/dotdot.txt', b'escaped')
    add('/%(outside)s/absolute.txt', b'escaped')
    add('loot/door', type=tarfile.SYMTYPE, linkname='%(outside)s')
    add('loot/door/through.txt', b'escaped')
    add('loot/suid', b'#!/bin/sh\n', mode=0o4755)
    add('loot/dev', type=tarfile.BLKTYPE, devmajor=8, devminor=0)
    add('loot/hard', type=tarfile.LNKTYPE, linkname='%(outside)s/../outside-victim')
sys.stdout.buffer.write(b.getvalue())
""" % {'outside': outside}
    x.env.run(['exec', '-s', 'evil', '-i', '--', 'cat > /tmp/maker.py'], input=maker.encode())
    x.env.run(['exec', '-s', 'evil', '--', 'mkdir -p /workspace/loot && printf \'#!/bin/sh\\nexec python3 /tmp/maker.py\\n\' '
               '> /usr/local/bin/tar && chmod +x /usr/local/bin/tar'])
    dest = os.path.join(x.env.root, 'got')
    r = x.env.run(['cp', 'evil:loot', dest])
    t.eq(os.listdir(outside), [], 'nothing lands outside the destination (.., absolute paths, a symlinked dir)', r.stderr)
    t.eq(open(os.path.join(dest, 'ok.txt')).read(), 'fine', 'what is fine is copied')
    t.ok(os.path.islink(os.path.join(dest, 'door')) and not os.path.exists(os.path.join(dest, 'door', 'through.txt')),
         'a symlink stays a symlink and is not followed')
    t.eq(os.stat(os.path.join(dest, 'suid')).st_mode & 0o7777, 0o755, 'set-id bits are dropped')
    t.ok(not os.path.exists(os.path.join(dest, 'dev')), 'no device node is made')
    t.ok(not os.path.exists(os.path.join(dest, 'hard')), 'no hard link to a file outside')
    # a directory of the host's that is there already keeps its mode
    kept = os.path.join(x.env.root, 'kept')
    os.makedirs(os.path.join(kept, 'loot'), mode=0o700)
    os.chmod(os.path.join(kept, 'loot'), 0o700)
    x.env.run(['exec', '-s', 'evil', '--', 'rm /usr/local/bin/tar; chmod 1777 /workspace/loot'])
    r = x.env.run(['cp', 'evil:loot', kept])
    t.eq((r.returncode, oct(os.stat(os.path.join(kept, 'loot')).st_mode & 0o7777)), (0, '0o700'),
         'a host directory that was there keeps its mode (the sandbox\'s 1777 does not open it)', r.stderr)
    # what the sandbox's tar says reaches the terminal with its control characters shown, not obeyed
    x.env.run(['exec', '-s', 'evil', '--', 'printf \'#!/bin/sh\\nprintf "\\\\033[2J\\\\033]0;owned\\\\007fake" >&2; exit 1\\n\' '
               '> /usr/local/bin/tar && chmod +x /usr/local/bin/tar'])
    r = x.env.run(['cp', 'evil:loot', os.path.join(x.env.root, 'esc')])
    t.ok(r.returncode == 1 and b'\x1b' not in r.stderr and b'\x07' not in r.stderr and b'\\x1b[2J' in r.stderr,
         'the sandbox\'s tar cannot write escape sequences to the terminal', r.stderr)


def test_cp_symlink_race(t, x):
    """A sandbox swapping a symlink in the path while `sbx cp` runs, both
    ways: tar runs inside the sandbox, so the swap only moves it around the
    sandbox's own files; the host's files at the same absolute path are
    neither read nor written."""
    outside = os.path.join(x.env.root, 'race-outside')
    os.makedirs(outside)
    with open(os.path.join(outside, 'f.txt'), 'w') as f:
        f.write('host-secret')
    t.eq(open(os.path.join(outside, 'f.txt')).read(), 'host-secret', 'the host target exists')
    c = x.env.socket_client()
    c.initialize()
    c.sh('mkdir -p /workspace/real %s && echo inside > /workspace/real/f.txt && echo own > %s/f.txt'
         % (outside, outside), sandbox='race')
    swapper = ('while :; do ln -sfn %s /workspace/swap; ln -sfn / /workspace/swap; ln -sfn /etc /workspace/swap; '
               'ln -sfn /workspace/real /workspace/swap; ln -sfn ../../proc/1/root /workspace/swap; done' % outside)
    c.ok('startProcess', {'sandboxId': 'race', 'processId': 'swapper', 'command': swapper})
    up = os.path.join(x.env.root, 'race-up.txt')
    with open(up, 'w') as f:
        f.write('uploaded\n')
    got, failed = set(), []
    # 15 rounds at least; more (100 at most) until a download has landed on
    # one of the two targets that have an f.txt (2 of the 5 the link takes)
    for i in range(100):
        if i >= 15 and got:
            break
        dest = os.path.join(x.env.root, 'race-down-%d' % i)
        x.env.run(['cp', 'race:swap/f.txt', dest])
        if os.path.isfile(dest) and not os.path.islink(dest):
            got.add(open(dest).read())
        r = x.env.run(['cp', up, 'race:swap/up-%d.txt' % i])
        if r.returncode:
            failed.append(r.stderr.decode(errors='replace'))
    c.ok('killProcess', {'sandboxId': 'race', 'processId': 'swapper'})
    t.ok(got and got <= {'inside\n', 'own\n'}, "downloads give the sandbox's own files, never the host's", got)
    t.eq(sorted(os.listdir(outside)), ['f.txt'], 'uploads land nowhere on the host')
    t.eq(open(os.path.join(outside, 'f.txt')).read(), 'host-secret', 'and the host file is untouched')
    t.ok(all(f.startswith('sbx cp: race:swap/') for f in failed), 'an upload the swap broke says why', failed[:3])
    # every directory the link could name then (/proc/1/root is / itself),
    # not a walk of the whole root (200,000 entries: seconds cold, more on a busy host)
    r = c.sh("{ find / /etc -maxdepth 1; find /workspace %s; } | grep '/up-[0-9]*\\.txt$' | xargs -r cat | sort -u"
             % outside, sandbox='race')
    t.ok(r['stdout'] in ('', 'uploaded\n'), 'the others land inside the sandbox, wherever the link pointed then', r)
    c.sh('ln -sfn /workspace/real /workspace/swap', sandbox='race')
    r = x.env.run(['cp', up, 'race:swap/after.txt'])
    t.eq((r.returncode, c.sh('cat /workspace/real/after.txt', sandbox='race')['stdout']), (0, 'uploaded\n'),
         'once the link holds still, cp through it works', r.stderr)
    t.eq(c.sh('echo alive', sandbox='race')['stdout'], 'alive\n', 'and the sandbox still answers')


def test_background(t, x):
    """sbx exec -d: a server that outlives the call (what an exec leaves
    running ends with it); sbx ps, logs and kill."""
    x.env.run(['exec', '-s', 'bg', '--', 'sleep 300 & echo $! > /tmp/left'])
    # killed: gone, or a zombie, within the moment a SIGKILLed process
    # waits for a CPU on a loaded host (as test_exec's test of the same)
    r = x.env.run(['exec', '-s', 'bg', '--', 'for i in $(seq 100); do grep -qs "^State:[[:space:]]*[^Z[:space:]]" '
                   '/proc/$(cat /tmp/left)/status || { echo ended; exit; }; sleep 0.05; done; echo alive'])
    t.eq(r.stdout, b'ended\n', 'what a plain exec leaves running ends with it')
    # (the server's own "Serving" line, unbuffered in a background process, is not what this checks)
    r = x.env.run(['exec', '-s', 'bg', '-d', '--', 'echo up; echo oops >&2; exec python3 -m http.server 8123 >/dev/null'])
    pid = r.stdout.decode().strip()
    t.ok(r.returncode == 0 and pid, 'sbx exec -d prints the background process\'s id', r.stderr)
    r = x.env.run(['exec', '-s', 'bg', '--', 'for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/8123) 2>/dev/null '
                   '&& echo listening && break; sleep 0.05; done'])
    t.eq(r.stdout, b'listening\n', 'and it runs on after the call, serving')
    r = x.env.run(['ps', '-s', 'bg'])
    rows = [l.split() for l in r.stdout.decode().splitlines()[1:]]
    t.ok(any(row[0] == pid and row[2] == 'running' for row in rows), 'sbx ps lists it as running', r.stdout)
    r = x.env.run(['logs', '-s', 'bg', pid])
    t.eq((r.returncode, r.stdout, r.stderr), (0, b'up\n', b'oops\n'), 'sbx logs prints its stdout and its stderr')
    r = x.env.run(['exec', '-s', 'bg', '-d', '--', 'echo one; sleep 0.5; echo two; echo err >&2'])
    r = x.env.run(['logs', '-s', 'bg', '-f', r.stdout.decode().strip()], timeout=60)
    t.eq((r.returncode, r.stdout, r.stderr), (0, b'one\ntwo\n', b'err\n'), 'sbx logs -f follows it until it ends')
    r = x.env.run(['exec', '-s', 'bg', '-d', '--', 'seq 1 400000'])
    big = r.stdout.decode().strip()
    x.env.run(['logs', '-s', 'bg', '-f', big], timeout=60)  # until it ends
    r = x.env.run(['logs', '-s', 'bg', big])
    t.ok(b'bytes omitted' in r.stdout and b'`sbx logs -f` prints all of it' in r.stderr and b'/tmp/sbx-output/' in r.stderr,
         'logs longer than what is kept say where the whole output is', r.stderr)
    t.eq(x.env.run(['kill', '-s', 'bg', pid]).returncode, 0, 'sbx kill stops it')
    r = x.env.run(['ps', '-s', 'bg'])
    t.ok(any(l.split()[0] == pid and l.split()[2] == 'killed' for l in r.stdout.decode().splitlines()[1:]),
         'and ps says so', r.stdout)
    r = x.env.run(['exec', '-s', 'bg', '-d', '--', 'sleep 300'])
    sl = r.stdout.decode().strip()
    t.eq(x.env.run(['kill', '-s', 'bg', '--signal', 'term', sl]).returncode, 0, 'sbx kill takes a signal as kill(1) does')
    def ended():
        rows = [l.split() for l in x.env.run(['ps', '-s', 'bg']).stdout.decode().splitlines()[1:]]
        return any(row[0] == sl and row[2] != 'running' for row in rows)
    try:
        wait_until(ended, 20, 'sleep to end')
    except Exception:
        print('# ' + x.env.run(['ps', '-s', 'bg']).stdout.decode().replace('\n', '\n# '))
        raise
    t.ok(True, 'and the process ends')
    r = x.env.run(['logs', '-s', 'bg', sl])
    # (bash may still say "Terminated" of the command it ran, as a shell
    # does, when the signal reached the command before bash: rarely, and
    # only on a loaded host)
    t.ok(r.stdout == b'' and b'Bad file descriptor' not in r.stderr and b'sbx' not in r.stderr,
         'a process killed by SIGTERM has nothing of sbx\'s own in its logs', r.stderr)
    t.eq(x.env.run(['kill', '-s', 'bg', '--signal', 'STOP', sl]).returncode, 2, 'a signal it does not send is a usage error')
    r = x.env.run(['logs', '-s', 'bg', 'nosuch'])
    t.ok(r.returncode == 1 and b'PROCESS_NOT_FOUND' in r.stderr and b'(sbx ps lists them)' in r.stderr, 'a process that is not there is an error, with advice for the command line', r.stderr)
    t.eq(x.env.run(['exec', '-d', '-i', '--', 'true']).returncode, 2, '-d with -i is a usage error')


def test_doctor(t, x):
    r = x.env.run(['doctor'])
    out = r.stdout.decode()
    for word in ('user namespaces', 'idmapped mounts', 'overlayfs', 'cgroups', 'seccomp', 'FUSE', 'disk quota', 'configuration', 'pidfd', 'clone3', 'daemon'):
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
        # a daemon's own children look the same for a moment after their fork
        # (a sandbox made ahead, before it executes sbx-init): not daemons
        daemons = [p for p in daemons if _ppid(p) not in daemons]
        t.eq(len(daemons), 1, 'exactly one daemon won the lock')
    finally:
        env.close()


def _ppid(pid):
    try:
        return next(l.split()[1] for l in open('/proc/%s/status' % pid) if l.startswith('PPid:'))
    except (OSError, StopIteration):
        return None


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
    r = subprocess.run([SBX, 'exec', '-s', 'cli', '-i', '--', 'wc -c'], input=b'z' * (40 << 20), capture_output=True,
                       env=x.env.env, cwd=x.env.root, timeout=120)
    t.eq(r.stdout.strip(), str(40 << 20).encode(), 'stdin is streamed: 40 MiB (past any message bound) arrives whole')
    p = subprocess.Popen([SBX, 'exec', '-s', 'cli', '-i', '--', 'while read l; do echo "got $l"; done'],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=x.env.env, cwd=x.env.root)
    p.stdin.write(b'one\n')
    p.stdin.flush()
    t.eq(p.stdout.readline(), b'got one\n', 'and as it comes: the command answers a line before stdin ends')
    p.stdin.write(b'two\n')
    p.stdin.close()
    t.eq((p.stdout.read(), p.wait(timeout=30)), (b'got two\n', 0), 'EOF on our stdin is EOF on the command\'s')
    y = subprocess.Popen(['yes'], stdout=subprocess.PIPE)
    r = subprocess.run([SBX, 'exec', '-s', 'cli', '-i', '--', 'head -c 4'], stdin=y.stdout, capture_output=True,
                       env=x.env.env, cwd=x.env.root, timeout=60)
    y.kill()
    y.wait()
    t.eq((r.returncode, r.stdout), (0, b'y\ny\n'), 'an endless stdin ends with the command')
    r = x.env.run(['exec', '-s', 'cli', '-it', '--', 'true'])
    t.ok(r.returncode == 2 and b'no terminal' in r.stderr, '-t says there is no terminal to give', r.stderr)


def listed_but_status(env):
    """`sbx ls` without its STATUS column, which an idle sandbox's sleep may change at any moment."""
    return [l.split()[:1] + l.split()[2:] for l in env.run(['ls']).stdout.splitlines()]


def test_never_guesses(t, x):
    before = listed_but_status(x.env)
    for bad in ('BAD_ID', 'Has Space', '../../etc', '', 'a' * 100):
        r = x.env.run(['exec', '-s', bad, '--', 'true'])
        t.ok(r.returncode == 2 and b'invalid sandbox id' in r.stderr, 'exec -s %r is refused with the rule, a usage error' % bad[:20],
             (r.returncode, r.stderr[-200:]))
        r = x.env.run(['destroy', bad or "''"]) if bad else x.env.run(['destroy', ''])
        t.ok(r.returncode != 0 and b'invalid sandbox id' in r.stderr, 'destroy %r too' % bad[:20], r.stderr[-200:])
    r = x.env.run(['cp', 'Bad_Id:/etc/passwd', os.path.join(x.env.root, 'p')])
    t.ok(r.returncode == 2 and b'invalid sandbox id' in r.stderr, 'cp with a bad id says so', r.stderr)
    t.eq(listed_but_status(x.env), before, 'and no sandbox was made or touched')
    r = x.env.run(['--version'])
    t.ok(r.returncode == 0 and r.stdout.startswith(b'sbx 0.'), 'sbx --version', r.stdout)
    r = x.env.run(['-h'])
    t.ok(r.returncode == 0 and b'usage: sbx' in r.stdout, 'sbx -h', r.stdout[:100])
    for args in (['ls', 'extra'], ['doctor', 'x'], ['--version', 'x']):
        r = x.env.run(args)
        t.ok(r.returncode == 2 and b'takes no arguments' in r.stderr and not r.stdout,
             'sbx %s: an argument it does not take is an error, not ignored' % ' '.join(args), r)


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
    sys.exit(run_tests([test_exec, test_stdin, test_never_guesses, test_default_id, test_ls_destroy, test_create, test_notices, test_cp, test_cp_hostile_sandbox, test_cp_symlink_race, test_background, test_doctor,
                        test_autostart_and_stop,
                        test_racing_starters, test_help, test_session, test_daemon_http_while_running], Ctx))
