"""The daemon as an unprivileged user: exec, files and namespaces work;
limits it cannot enforce fail with RESOURCE_LIMIT; nothing of the host
leaks."""
import json
import os
import shutil
import subprocess
import sys

from dnsserver import Dns
from sbxtest import Env, left_running, run_tests

UID = GID = 4242  # an unprivileged uid with no other business on the machine


class Ctx:
    def __init__(self):
        # fusermount3 wants the user to have a name: a passwd entry for the
        # test's uid while the tests run (removed after, when we made it)
        import pwd
        try:
            pwd.getpwuid(UID)
            self.made_user = False
        except KeyError:
            r = subprocess.run(['useradd', '--system', '--no-create-home', '--uid', str(UID), '--user-group',
                                '--shell', '/usr/sbin/nologin', 'sbx-rootless-test'], capture_output=True)
            self.made_user = r.returncode == 0
        self.env = Env(user=(UID, GID))
        self.dns = Dns({'ok.test': '100.63.0.9'})  # what allowedHosts names are asked of
        conf = os.path.join(self.env.root, 'config.json')
        with open(conf, 'w') as f:
            json.dump({'dnsServer': '127.0.0.1:%d' % self.dns.port}, f)
        self.env.env['SBX_CONFIG'] = conf
        self.c = self.env.mcp(['--sandbox', 'rl'])
        self.c.initialize()

    def close(self):
        self.env.close()
        self.dns.close()
        if self.made_user:
            subprocess.run(['userdel', 'sbx-rootless-test'], capture_output=True)


def test_exec_and_identity(t, x):
    pid = None
    r = x.c.sh('id -u; cat /proc/self/uid_map')
    lines = r['stdout'].split('\n')
    t.eq(lines[0], '0', 'commands run as root of the sandbox')
    t.eq(lines[1].split(), ['0', str(UID), '1'], 'sandbox root is the invoking user')
    pid = x.env.daemon_pid()
    st = os.stat('/proc/%d' % pid)
    t.eq(st.st_uid, UID, 'the daemon runs unprivileged')


def test_files(t, x):
    x.c.ok('writeFile', {'path': 'note.txt', 'content': 'rootless\n'})
    t.eq(x.c.sh('cat /workspace/note.txt')['stdout'], 'rootless\n', 'files work')
    t.eq(x.c.ok('readFile', {'path': '/etc/hostname'})['content'], 'rl\n', 'readFile works')
    r = x.c.sh('head -c 100000 /dev/zero | tr "\\0" a')
    p = r.get('outputPath', '')
    t.ok(r.get('truncated') and p.startswith('/tmp/sbx-output/'), 'a long output is saved in the sandbox', p)
    t.eq(x.c.sh('wc -c < %s' % p)['stdout'], '100000\n', 'all of it')


def test_system_dirs_read_only(t, x):
    r = x.c.sh('touch /usr/bin/x 2>&1; echo rc=$?')
    t.ok('rc=1' in r['stdout'] and 'Read-only' in r['stdout'], '/usr is read-only without idmapped mounts', r['stdout'])
    r = x.c.sh('echo 1.2.3.4 h >> /etc/hosts && echo ok')
    t.eq(r['stdout'], 'ok\n', '/etc stays writable (overlay over our own template)')


FORKS = """python3 - <<'EOF'
import os
r, w = os.pipe()
n = 0
for i in range(1100):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:  # lives until the parent is gone (its pipe closes)
        os.close(w)
        os.read(r, 1)
        os._exit(0)
    n += 1
print(n)
EOF"""


def test_limits(t, x):
    t.eq(x.c.err('createSandbox', {'sandboxId': 'lim', 'limits': {'memoryMB': 128}}), 'RESOURCE_LIMIT',
         'an explicit limit that cannot be enforced is RESOURCE_LIMIT')
    r = x.c.ok('createSandbox', {'sandboxId': 'rl'})
    t.eq(r['limitsEnforced'], {'memory': False, 'cpus': False, 'pids': True, 'disk': False},
         'createSandbox says which default limits hold rootless (never silently)')
    res, _ = x.c.call('createSandbox', {'sandboxId': 'rl'})
    t.ok('NOT enforced' in res['content'][0]['text'], 'and its text says so', res['content'][0]['text'])
    r = x.env.run(['doctor'])
    t.ok(b'NOT enforced' in r.stdout, 'doctor says which limits are not enforced', r.stdout[-800:])
    if os.cpu_count() > 1:
        t.eq(x.c.sh('nproc', sandbox='rl')['stdout'], '1\n', 'nproc says the cpus limit rootless too')
    r = x.c.sh('sleep 300 & sleep 300', timeout=500)
    t.ok(r.get('timedOut'), 'timeout still works')
    t.eq(x.c.sh(left_running('sleep'))['stdout'].strip(), '0', 'and kills the tree')
    r = x.c.sh(FORKS, sandbox='rl-forks', timeout=60000)
    t.ok(0 < int(r['stdout']) < 1024, 'the default pids limit holds rootless (%s forks of 1100)' % r['stdout'].strip())


def test_durable(t, x):
    x.c.sh('echo kept > /workspace/kept.txt && cd /tmp && export R=1')
    r = x.env.run(['daemon', 'stop'])
    t.ok(r.returncode == 0 and b'stopped' in r.stdout, 'the rootless daemon stops', r.stdout + r.stderr)
    res, _ = x.c.call('exec', {'command': 'cat /workspace/kept.txt; pwd; echo $R'}, timeout=60)
    s = res['structuredContent']
    t.eq((s.get('stdout'), s.get('restarted')), ('kept\n/tmp\n1\n', True),
         'rootless sandboxes keep their files and sessions across a restart too')
    disk = os.path.join(x.env.state, 'sandboxes', 'rl', 'disk')
    t.ok(os.path.isdir(disk) and os.stat(disk).st_uid == UID, 'as a directory of the user\'s state dir')
    r = x.c.ok('createSandbox', {'sandboxId': 'rl'})
    t.eq(r['limitsEnforced']['disk'], False, 'createSandbox says the disk quota is not enforced')
    t.eq(x.c.err('createSandbox', {'sandboxId': 'rl-disk', 'limits': {'diskMB': 100}}), 'RESOURCE_LIMIT',
         'an explicit diskMB is RESOURCE_LIMIT rootless')


def test_view(t, x):
    """The FUSE view rootless: mounted through fusermount3 by the user."""
    mnt = os.path.join(x.env.root, 'rlview')
    os.makedirs(mnt)
    os.chown(mnt, UID, GID)
    x.c.ok('writeFile', {'path': '/workspace/v.txt', 'content': 'rootless view\n'})
    # Debian's udev rule makes /dev/fuse 0666; a machine that keeps it 0600
    # (as root's only) gets the standard mode for this test, and back after
    mode = os.stat('/dev/fuse').st_mode & 0o777
    if mode != 0o666:
        os.chmod('/dev/fuse', 0o666)
    r = x.env.run(['mount', mnt])
    try:
        t.eq(r.returncode, 0, 'sbx mount works for an unprivileged user', r.stderr)

        def as_user(cmd):
            return subprocess.run(['sh', '-c', cmd], preexec_fn=x.env.preexec, capture_output=True, text=True,
                                  timeout=60)
        r = as_user('cat %s/rl/v.txt; stat -c %%u:%%g %s/rl/v.txt' % (mnt, mnt))
        t.eq(r.stdout, 'rootless view\n65534:65534\n', 'it shows the sandbox\'s files, owned by nobody (foreign to '
             'git), not by the user', r.stderr)
        as_user('echo from-host > %s/rl/h.txt' % mnt)
        t.eq(x.c.sh('cat /workspace/h.txt')['stdout'], 'from-host\n', 'the user writes through it')
        r = subprocess.run(['ls', mnt], capture_output=True)
        t.ok(r.returncode != 0, 'root is not let in either (no allow_other)', r.stderr)
    finally:
        x.env.run(['umount', mnt])
        subprocess.run(['umount', '-l', mnt], capture_output=True)
        os.chmod('/dev/fuse', mode)


def test_escape(t, x):
    r = x.c.sh('ls -A /root /home; cat /etc/shadow 2>&1 | head -1; unshare -U true 2>&1; echo rc=$?')
    t.ok('rc=1' in r['stdout'] and 'shadow: No such file' in r['stdout'], 'no shadow, no nested user namespace',
         r['stdout'])
    t.eq(x.c.sh('ps -e -o comm= | grep -c python3 || true')['stdout'].strip(), '0', 'host processes invisible')


def test_local_bucket(t, x):
    """A local bucket rootless: served by the user's own FUSE server, it keeps
    its files across an idle reset while the rest of /workspace goes."""
    mode = os.stat('/dev/fuse').st_mode & 0o777
    if mode != 0o666:  # as in test_view: Debian's mode, for this test
        os.chmod('/dev/fuse', 0o666)
    try:
        c = x.c
        c.ok('createSandbox', {'sandboxId': 'rl-keep', 'sleepAfter': '2s'})
        c.ok('mountBucket', {'sandboxId': 'rl-keep', 'bucket': 'rlkeep', 'mountPath': '/workspace/keep'})
        c.sh('echo kept > /workspace/keep/k && echo lost > /workspace/lost', sandbox='rl-keep')
        t.ok(os.path.exists(os.path.join(x.env.state, 'buckets', 'rlkeep', 'k')),
             'rootless, a local bucket\'s files are in the user\'s $SBX_STATE_DIR/buckets')
        c.request('logging/setLevel', {'level': 'notice'})
        c.next(lambda m: m.get('method') == 'notifications/message' and
               m['params']['data'].get('sandboxId') == 'rl-keep', 30)
        r = c.sh('cat /workspace/keep/k; ls /workspace', sandbox='rl-keep')
        t.eq((r.get('reset'), r['stdout']), (True, 'kept\nkeep\n'),
             'after an idle reset the bucket is back with its file; the rest of /workspace is gone', r)
        c.ok('destroySandbox', {'sandboxId': 'rl-keep'})
    finally:
        os.chmod('/dev/fuse', mode)


def test_egress_names(t, x):
    if not (shutil.which('pasta') and shutil.which('nft')):
        t.skip('allowedHosts names rootless', 'pasta (passt) or nft (nftables) missing: scripts/bootstrap installs them')
        return
    # Debian's udev rule makes /dev/net/tun 0666 (pasta needs it); a machine
    # that keeps it 0600 gets the standard mode for this test, and back after
    mode = os.stat('/dev/net/tun').st_mode & 0o777
    if mode != 0o666:
        os.chmod('/dev/net/tun', 0o666)
    try:
        c = x.c
        c.ok('createSandbox', {'sandboxId': 'rl-net', 'allowedHosts': ['ok.test']})
        r = c.sh('cat /etc/resolv.conf; getent ahostsv4 ok.test | head -1; getent hosts other.test || echo other-none',
                 sandbox='rl-net', wait=60)
        out = r['stdout'].split()
        t.ok('127.0.0.1' in out and '100.63.0.9' in out and out[-1] == 'other-none',
             'rootless, allowedHosts names resolve through the filter and others do not', r)
    finally:
        os.chmod('/dev/net/tun', mode)
    c.ok('destroySandbox', {'sandboxId': 'rl-net'})


if __name__ == '__main__':
    if os.geteuid() != 0:
        print('1..0 # SKIP needs root to drop to an unprivileged user')
        sys.exit(77)
    sys.exit(run_tests([test_exec_and_identity, test_files, test_system_dirs_read_only, test_limits, test_durable, test_view, test_escape, test_local_bucket, test_egress_names], Ctx))
