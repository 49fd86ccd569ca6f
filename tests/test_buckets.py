"""Bucket mounts: a directory of the sandbox backed by a real S3 server on
loopback (npm s3rver), every request's SigV4 signature checked by botocore,
objects cross-checked with awscli; files that survive idle resets, daemon
and bucket-server crashes and an S3 outage; local buckets; credentials that
never reach the sandbox; errors that say what went wrong."""
import base64
import errno
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time

from sbxtest import Env, Fail, children, comm_of, gone, hostname_of, run_tests, wait_until
from s3server import AK, SK, S3

FSOPS = os.environ.get('FSOPS') or os.path.join(os.path.dirname(__file__), '..', 'build', 'tests', 'fsops')
SECRET = 'sbx-test-secret-d41d8cd98f00b204'  # inline credentials' secret: must never show up anywhere


class Ctx:
    def __init__(self):
        self.env = Env()
        self.s3 = S3(self.env.root, buckets=('test', 'other', 'big'))
        cfg = os.path.join(self.env.root, 'config.json')
        with open(cfg, 'w') as f:
            json.dump({'buckets': {
                'localMB': 16600,  # test_local_bucket's 8192 and test_local_bucket_quota's 64, then no more of 9000
                # 2130706433 is 127.0.0.1 in a spelling sbx does not take for this host
                'allowedEndpoints': ['http://127.0.0.1:', 'https://127.0.0.1:', 'http://sbx-test.invalid',
                                     'http://2130706433:'],
                'profiles': {'loopback': {'endpoint': self.s3.endpoint, 'accessKeyId': AK,
                                          'secretAccessKey': SK}}}}, f)
        self.env.env['SBX_CONFIG'] = cfg
        self.c = self.env.mcp(['--sandbox', 'b1'])
        self.c.initialize()
        self.c.request('logging/setLevel', {'level': 'notice'})

    def mount(self, mount_path, bucket='test', sandbox='b1', **kw):
        args = {'sandboxId': sandbox, 'bucket': bucket, 'mountPath': mount_path, 'endpoint': self.s3.endpoint,
                'credentials': {'accessKeyId': AK, 'secretAccessKey': SK}}
        args.update(kw)
        return self.c.ok('mountBucket', args)

    def notes(self):
        return self.s3.take_crashes()

    def close(self):
        try:
            self.env.close()
        finally:
            self.s3.close()


def sha(b):
    return hashlib.sha256(b).hexdigest()


def kill_daemon(x):
    """kill -9 of the daemon, and its sandboxes gone with it (their inits
    end with it): the client's next call meets a daemon that is gone."""
    pid = x.env.daemon_pid()
    inits = children(pid, 'sbx-init')
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: all(gone(p) for p in inits + [pid]), 30, 'the daemon and its sandboxes to end')


def run_py(x, sandbox, prog, wait=120):
    """A Python program run in the sandbox: exec's result."""
    x.c.ok('writeFile', {'sandboxId': sandbox, 'path': '/workspace/prog.py', 'content': prog})
    return x.c.sh('python3 /workspace/prog.py', sandbox=sandbox, wait=wait)


def hold_py(x, sandbox, pid, prog, line):
    """A Python program started in the background (it holds what it opened
    until killed): its output once it printed line."""
    x.c.ok('writeFile', {'sandboxId': sandbox, 'path': '/workspace/%s.py' % pid, 'content': prog})
    x.c.ok('startProcess', {'sandboxId': sandbox, 'processId': pid, 'command': 'exec python3 -u /workspace/%s.py' % pid})
    x.c.ok('waitForLog', {'sandboxId': sandbox, 'processId': pid, 'pattern': line, 'timeout': 120000}, 180)
    return x.c.ok('getProcessLogs', {'sandboxId': sandbox, 'processId': pid})['stdout']


def bucketfs_pids(x):
    """The bucket servers of this test's daemon (its children)."""
    return children(x.env.daemon_pid(), 'sbx-bucketfs')


def test_mount_write_read(t, x):
    r = x.mount('/data', prefix='p1')
    t.eq(r['mountPath'], '/data', 'mountBucket answers with the mount path')
    c = x.c
    c.sh('mkdir -p /data/dir/sub && printf hello > /data/dir/a.txt && head -c 3000000 /dev/urandom > /data/blob '
         '&& chmod 751 /data/dir/a.txt && sync')
    blob = c.sh('sha256sum /data/blob')['stdout'].split()[0]
    x.s3.wait_object('test', 'p1/dir/a.txt', b'hello')
    t.ok(True, 'a file written and closed in the sandbox is an object in the bucket (awscli reads it)')
    wait_until(lambda: x.s3.stored('test', 'p1/blob') is not None, 30, 'the blob to be uploaded')
    t.eq(sha(x.s3.get('test', 'p1/blob')), blob, 'the 3 MB file arrives byte for byte')
    h = x.s3.head('test', 'p1/dir/a.txt')
    t.eq(h.get('Metadata', {}).get('mode'), '0751', 'its mode is in the object\'s metadata', h)
    t.ok('p1/dir/sub/' in x.s3.keys('test', 'p1/'), 'an empty directory is a dir/ marker')
    x.s3.put('test', 'p1/from-aws.txt', b'written by awscli')
    out = c.sh('for i in $(seq 100); do [ -e /data/from-aws.txt ] && break; sleep 0.1; done; cat /data/from-aws.txt')
    t.eq(out['stdout'], 'written by awscli', 'an object put by another S3 client shows up in the mount')
    out = c.sh('stat -c "%a %s" /data/dir/a.txt; ls /data; ls /data/dir')
    t.eq(out['stdout'], '751 5\nblob\ndir\nfrom-aws.txt\na.txt\nsub\n', 'stat and listings read as written')
    # rename of a directory: copied, then deleted (documented as not atomic)
    c.sh('mv /data/dir /data/moved && echo more >> /data/moved/a.txt')
    x.s3.wait_object('test', 'p1/moved/a.txt', b'hellomore\n')
    t.ok('p1/dir/a.txt' not in x.s3.keys('test', 'p1/'), 'a renamed directory leaves no object behind')
    c.sh('rm /data/blob')
    wait_until(lambda: 'p1/blob' not in x.s3.stored_keys('test', 'p1/'), 30, 'the deletion to reach the bucket')
    t.ok(True, 'rm deletes the object')



def test_names_not_utf8(t, x):
    """S3 keys are UTF-8: a name that is not cannot be stored as itself
    (the server keeps another one), so the mount refuses it as a strict
    UTF-8 filesystem would, and says which error."""
    x.mount('/u8', prefix='u8')
    prog = ('import errno, os\n'
            'def e(f, *a):\n'
            '    try:\n        f(*a)\n        return "ok"\n'
            '    except OSError as x:\n        return errno.errorcode[x.errno]\n'
            'open("/u8/fine", "w").write("x")\n'
            'print(e(os.open, b"/u8/bad\\xff", os.O_CREAT | os.O_WRONLY), e(os.mkdir, b"/u8/d\\xfe"),\n'
            '      e(os.rename, "/u8/fine", b"/u8/r\\xff"), e(os.symlink, b"t\\xff", "/u8/ln"),\n'
            '      e(os.stat, b"/u8/bad\\xff"), sorted(os.listdir("/u8")))\n')
    x.c.ok('writeFile', {'sandboxId': 'b1', 'path': '/workspace/u8.py', 'content': prog})
    r = x.c.sh('python3 /workspace/u8.py')
    t.eq(r['stdout'], "EILSEQ EILSEQ EILSEQ EILSEQ ENOENT ['fine']\n",
         'a create, mkdir, rename or symlink target that is not UTF-8: EILSEQ; a lookup of one: ENOENT', r)
    x.c.ok('unmountBucket', {'sandboxId': 'b1', 'mountPath': '/u8'})


def test_object_grows_while_open(t, x):
    """An object that another S3 client replaces with a bigger one while a
    file of it is open: the open file reads what it had (here nothing: it
    was empty), and the bucket's server goes on serving (it used to index
    its map of cached chunks past its end, and died)."""
    x.s3.put('test', 'gw/e', b'')
    x.mount('/gw', prefix='gw')
    prog = ('import os, time\n'
            'deadline = time.monotonic() + 60\n'
            'while not os.path.exists("/gw/e") and time.monotonic() < deadline:  # another mount made it\n'
            '    time.sleep(0.1)\n'
            'fd = os.open("/gw/e", os.O_RDONLY)\n'
            'open("/workspace/opened", "w").close()\n'
            'while os.stat("/gw/e").st_size == 0 and time.monotonic() < deadline:\n'
            '    time.sleep(0.1)\n'
            'print(os.stat("/gw/e").st_size, len(os.pread(fd, 65536, 0)), len(os.pread(fd, 65536, 5 << 20)))\n')
    x.c.ok('writeFile', {'sandboxId': 'b1', 'path': '/workspace/grow.py', 'content': prog})
    x.c.ok('startProcess', {'sandboxId': 'b1', 'processId': 'grow', 'command': 'python3 /workspace/grow.py > /workspace/grow.out 2>&1'})
    wait_until(lambda: x.c.sh('test -e /workspace/opened && echo y')['stdout'] == 'y\n', 30, 'the file to be open')
    x.s3.put('test', 'gw/e', b'z' * (10 << 20))
    wait_until(lambda: x.c.sh('test -s /workspace/grow.out && echo y')['stdout'] == 'y\n', 90, 'the reader to finish')
    r = x.c.sh('cat /workspace/grow.out')
    t.eq(r['stdout'], '%d 0 0\n' % (10 << 20), 'the new size shows; the file opened before reads what it had', r)
    r = x.c.sh('echo still > /gw/after && cat /gw/after')
    t.eq(r['stdout'], 'still\n', 'the mount still works')
    # the sandbox alone can be the other client: a second mount of the same bucket
    x.mount('/gw2', prefix='gw')
    x.c.sh(': > /gw2/e2 && rm -f /workspace/opened /workspace/grow.out')
    x.c.ok('writeFile', {'sandboxId': 'b1', 'path': '/workspace/grow.py', 'content': prog.replace('/gw/e', '/gw/e2')})
    x.c.ok('startProcess', {'sandboxId': 'b1', 'processId': 'grow2', 'command': 'python3 /workspace/grow.py > /workspace/grow.out 2>&1'})
    wait_until(lambda: x.c.sh('test -e /workspace/opened && echo y')['stdout'] == 'y\n', 30, 'the file to be open')
    x.c.sh('head -c %d /dev/zero > /gw2/e2' % (10 << 20))
    wait_until(lambda: x.c.sh('test -s /workspace/grow.out && echo y')['stdout'] == 'y\n', 90, 'the reader to finish')
    r = x.c.sh('cat /workspace/grow.out; echo still > /gw/after2 && cat /gw/after2')
    t.eq(r['stdout'], '%d 0 0\nstill\n' % (10 << 20), 'the same when the sandbox grows it through a second mount', r)
    for mp in ('/gw', '/gw2'):
        x.c.ok('unmountBucket', {'sandboxId': 'b1', 'mountPath': mp})

def test_signatures(t, x):
    c = x.c
    # a multipart upload (a 16 MiB part and the rest), a listing past one page (1005
    # objects put by awscli), ranged reads
    many = os.path.join(x.env.root, 'many')
    os.makedirs(many)
    for i in range(1, 1006):
        open(os.path.join(many, str(i)), 'w').close()
    x.s3.sync(many, 's3://test/sig/many/')
    x.mount('/sig', prefix='sig')
    c.sh('head -c 20000000 /dev/urandom > /sig/multi && mkdir /sig/few && cd /sig/few && seq 40 | xargs touch', wait=300)
    big = c.sh('sha256sum /sig/multi')['stdout'].split()[0]
    few = lambda: [k for k in x.s3.stored_keys('test', 'sig/few/') if k != 'sig/few/']
    try:
        wait_until(lambda: len(few()) == 40, 60, '40 uploads')
    except Fail:
        raise Fail('the bucket has %s' % x.s3.stored_keys('test', 'sig/'))
    wait_until(lambda: x.s3.stored('test', 'sig/multi') is not None, 60, 'the multipart upload')
    t.eq(sha(x.s3.get('test', 'sig/multi')), big, 'a 20 MB file goes up in parts and arrives whole')
    x.c.ok('unmountBucket', {'mountPath': '/sig'})
    x.mount('/sig', prefix='sig')  # a fresh server: nothing cached
    out = c.sh('ls /sig/many | wc -l; sha256sum /sig/multi | cut -d" " -f1; dd if=/sig/multi bs=1 skip=15000000 count=4 '
               'status=none | od -An -tx1')
    lines = out['stdout'].split('\n')
    t.eq(lines[0], '1005', 'a listing of 1005 entries (two pages) is whole')
    t.eq(lines[1], big, 'read back through ranged GETs, byte for byte')
    checks = x.s3.checks()
    bad = [ch for ch in checks if not ch['ok']]
    kinds = {(ch['method'], 'uploadId' in ch['query'], 'continuation-token' in ch['query']) for ch in checks}
    t.ok(len(checks) > 40 and not bad, 'botocore verifies the SigV4 signature of every one of %d requests' % len(checks),
         bad[:3])
    t.ok(('PUT', True, False) in kinds and ('POST', True, False) in kinds, 'multipart parts and completion were signed')
    t.ok(('GET', False, True) in kinds, 'a listing continuation (token in the query) was signed')
    parts = [ch for ch in checks if ch['method'] == 'PUT' and 'uploadId' in ch['query']]
    t.ok(parts and all(ch['unsigned'] for ch in parts),
         'to this host the parts go UNSIGNED-PAYLOAD: loopback carries them as sent', parts[:3])
    # to another host over plain HTTP (here one sbx cannot tell is this one) a body is signed with its hash
    before = len(checks)
    x.mount('/sig2', prefix='sig2', endpoint='http://2130706433:%d' % x.s3.proxy_port)
    c.sh('head -c 17000000 /dev/urandom > /sig2/multi && sync /sig2/multi', wait=300)
    wait_until(lambda: x.s3.stored('test', 'sig2/multi') is not None, 60, 'the multipart upload')
    t.eq(sha(x.s3.get('test', 'sig2/multi')), c.sh('sha256sum /sig2/multi')['stdout'].split()[0],
         'a file sent to another host over plain HTTP arrives whole')
    parts = [ch for ch in x.s3.checks()[before:] if ch['method'] == 'PUT' and 'uploadId' in ch['query']]
    t.ok(len(parts) == 2 and all(ch['ok'] and not ch['unsigned'] for ch in parts),
         'its parts were signed with their SHA-256, which the proxy found to be the body\'s', parts)
    x.c.ok('unmountBucket', {'mountPath': '/sig2'})


def test_fsync_means_in_bucket(t, x):
    c = x.c
    x.mount('/sync', prefix='sync')
    prog = ('import os\nfd = os.open("/sync/f", os.O_CREAT | os.O_WRONLY, 0o644)\nos.write(fd, b"durable")\n'
            'os.fsync(fd)\nprint("fsynced")\nos.close(fd)\n')
    c.ok('writeFile', {'path': '/workspace/sync.py', 'content': prog})
    r = c.sh('python3 /workspace/sync.py')
    t.eq(r['stdout'], 'fsynced\n', 'fsync returns')
    t.eq(x.s3.get('test', 'sync/f'), b'durable', 'and by then the object is in the bucket (no waiting)')


def test_secrets_never_shown(t, x):
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'sec'})
    r = c.ok('mountBucket', {'sandboxId': 'sec', 'bucket': 'other', 'mountPath': '/mnt/prof', 'profile': 'loopback'})
    t.ok(SK not in json.dumps(r), 'a profile mounts; its keys are not in the result')
    # s3rver checks the key id, not the secret: straight to it, any secret mounts
    cred = {'accessKeyId': AK, 'secretAccessKey': SECRET}
    r = c.ok('mountBucket', {'sandboxId': 'sec', 'bucket': 'other', 'mountPath': '/mnt/p', 'endpoint': x.s3.direct,
                             'credentials': cred})
    t.ok(SECRET not in json.dumps(r), 'inline credentials mount; the secret is not in the result')
    res, _ = c.call('mountBucket', {'sandboxId': 'sec', 'bucket': 'nosuch', 'mountPath': '/mnt/q',
                                    'endpoint': x.s3.direct, 'credentials': cred})
    t.ok(res['isError'] and SECRET not in json.dumps(res), 'an error does not echo the secret', res)
    # what the sandbox can see of itself: files, environment, processes, mounts
    c.sh('echo x > /mnt/p/file', sandbox='sec')
    r = c.sh('grep -rl %s /proc/*/environ /proc/*/cmdline /proc/self/mountinfo /etc /workspace /root 2>/dev/null | '
             'head -3; cat /proc/self/mountinfo | grep /mnt/p' % SECRET[:20], sandbox='sec')
    t.ok(SECRET[:20] not in r['stdout'], 'nothing inside the sandbox holds the secret', r)
    t.ok('sbx-bucket' in r['stdout'], 'the mount shows as sbx-bucket, nothing more', r['stdout'])
    # the daemon's side: records and logs have no secrets; the config file for the server is root's, 0600
    hits = subprocess.run(['grep', '-rl', SECRET, x.env.state], capture_output=True, text=True).stdout.split()
    t.eq([h for h in hits if not h.endswith('.json') or '/bucket-cache/' not in h], [],
         'the state dir holds the secret only in bucket-cache/<sandbox>/<id>.json')
    for h in hits:
        st = os.stat(h)
        t.ok(st.st_mode & 0o777 == 0o600 and st.st_uid == 0, '%s is root\'s, 0600' % os.path.basename(h))
    r = c.ok('listSandboxes')
    t.ok(SECRET not in json.dumps(r), 'listSandboxes shows no secret')
    out = x.env.run(['doctor']).stdout.decode()
    # (s3rver's key id and secret are the same word: the masked field is what tells)
    t.ok('"loopback"' in out and '"allowedEndpoints"' in out and '"secretAccessKey": "********"' in out,
         'sbx doctor prints the bucket configuration in force, the profile\'s secret masked', out[-800:])
    # the server: not root, not dumpable
    for pid in bucketfs_pids(x):
        st = open('/proc/%d/status' % pid).read()
        uid = int(st.split('\nUid:')[1].split()[0])
        t.ok(uid != 0, 'bucket server %d runs as an unprivileged user (%d), not root' % (pid, uid))
        break


def test_errors(t, x):
    c = x.c

    def code(args):
        res, _ = c.call('mountBucket', dict({'sandboxId': 'b1', 'mountPath': '/err'}, **args))
        return res['structuredContent'].get('error', {}).get('code'), res['structuredContent'].get('error', {}).get('message', '')

    cred = {'accessKeyId': AK, 'secretAccessKey': SK}
    caches = os.path.join(x.env.state, 'bucket-cache', 'b1')
    kept = lambda: set(os.listdir(caches)) if os.path.isdir(caches) else set()
    before = kept()
    t.eq(code({'bucket': 'Bad_Name', 'localBucket': True})[0], 'VALIDATION_FAILED', 'a bad bucket name is refused')
    t.eq(code({'bucket': 'test', 'mountPath': '/proc/x', 'localBucket': True})[0], 'VALIDATION_FAILED',
         'a mount over /proc is refused')
    for over in ('/tmp', '/var', '/var/lib'):
        got = code({'bucket': 'test', 'mountPath': over, 'localBucket': True})
        t.ok(got[0] == 'VALIDATION_FAILED' and 'would hide' in got[1],
             'a mount at %s, which would hide what the sandbox\'s system keeps under it, is refused' % over, got)
    t.eq(code({'bucket': 'test', 'mountPath': '/var/data', 'localBucket': True})[0], None, 'a mount at /var/data is not')
    c.ok('unmountBucket', {'sandboxId': 'b1', 'mountPath': '/var/data'})
    got = code({'bucket': 'test', 'endpoint': 'http://10.1.2.3:9000', 'credentials': cred})
    t.eq(got[0], 'PERMISSION_DENIED', 'an endpoint the configuration does not allow is refused', str(got))
    got = code({'bucket': 'nosuch', 'endpoint': x.s3.direct, 'credentials': cred})
    t.ok(got[0] == 'MOUNT_FAILED' and 'nosuch' in got[1], 'a missing bucket is MOUNT_FAILED saying so', got)
    got = code({'bucket': 'test', 'endpoint': 'http://127.0.0.1:1', 'credentials': cred})
    t.ok(got[0] == 'MOUNT_FAILED' and 'connect' in got[1].lower(), 'a dead endpoint: MOUNT_FAILED, connect', got)
    got = code({'bucket': 'test', 'endpoint': 'http://sbx-test.invalid', 'credentials': cred})
    t.ok(got[0] == 'MOUNT_FAILED' and 'DNS' in got[1], 'a name that does not resolve: MOUNT_FAILED, DNS', got)
    got = code({'bucket': 'test', 'endpoint': 'https://127.0.0.1:%d' % x.s3.port, 'credentials': cred})
    t.ok(got[0] == 'MOUNT_FAILED' and 'TLS' in got[1], 'an endpoint whose TLS fails (plain HTTP there): MOUNT_FAILED, TLS',
         got)
    got = code({'bucket': 'test', 'endpoint': x.s3.endpoint, 'credentials': {'accessKeyId': AK, 'secretAccessKey': 'wrong'}})
    t.ok(got[0] == 'MOUNT_FAILED' and '403' in got[1] and 'wrong' not in got[1],
         'a bad secret: MOUNT_FAILED with the 403, not the secret', got)
    got = code({'bucket': 'test', 'profile': 'nope'})
    t.eq(got[0], 'VALIDATION_FAILED', 'an unknown profile is refused')
    r = c.sh('ls -d /err 2>&1 || true')
    t.ok('No such file' in r['stdout'] or r['stdout'].strip() == '/err', 'failed mounts leave nothing mounted', r)
    # (a sandbox has at most 8 caches: those of failed mounts stayed, and 8 failures refused every mount after)
    wait_until(lambda: kept() <= before, 30, 'the caches of the failed mounts to go')
    t.ok(True, 'and no cache: the failed attempts do not count against the sandbox\'s mounts')
    r = c.ok('listSandboxes')
    # a symlinked mountPath cannot lead the mount elsewhere
    c.sh('mkdir -p /workspace/real && ln -sfn /etc /workspace/link')
    got = code({'bucket': 'test', 'mountPath': '/workspace/link/x', 'localBucket': True})
    t.ok(got[0] == 'MOUNT_FAILED' and 'symlink' in got[1], 'a mountPath through a symlink is refused', got)


def test_read_only(t, x):
    x.s3.put('test', 'ro/seen.txt', b'seen')
    x.mount('/ro', prefix='ro', readOnly=True)
    r = x.c.sh('cat /ro/seen.txt; echo x > /ro/new 2>&1; echo rc=$?')
    t.ok(r['stdout'].startswith('seen') and 'Read-only file system' in r['stdout'] + r['stderr'],
         'a readOnly mount reads, and refuses writes (EROFS)', r)


def test_server_cpu_bounded(t, x):
    """A bucket server's CPU is bounded as its sandbox's is: what a sandbox
    makes it do (listing a huge directory in a loop) is not free."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'cpu', 'limits': {'cpus': 0.5}})
    before = set(bucketfs_pids(x))
    x.mount('/data', sandbox='cpu', prefix='cpu')
    new = [p for p in bucketfs_pids(x) if p not in before]
    t.eq(len(new), 1, 'the mount has a server of its own')
    with open('/proc/%d/cgroup' % new[0]) as f:
        lines = [l.strip().split(':', 2) for l in f]
    v1 = [p for _, ctrl, p in lines if 'cpu' in ctrl.split(',')]
    if v1:
        path = '/sys/fs/cgroup/cpu%s' % v1[0]
        quota = open(path + '/cpu.cfs_quota_us').read().strip()
        period = open(path + '/cpu.cfs_period_us').read().strip()
    else:
        path = '/sys/fs/cgroup%s' % [p for h, _, p in lines if h == '0'][0]
        quota, period = open(path + '/cpu.max').read().split()
    t.eq(int(quota) / int(period), 0.5, 'its cgroup has the sandbox\'s 0.5 cpus (%s)' % path)
    c.ok('destroySandbox', {'sandboxId': 'cpu'})


def test_fsyncs_hold_no_thread(t, x):
    """fsyncs waiting for a slow bucket hold none of the server's threads:
    the daemon's file calls into the mount (and so every other sandbox's
    calls, which it serves on the same loop) go on meanwhile."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'slow'})
    x.mount('/data', sandbox='slow', prefix='slow')
    c.sh('mkdir -p /data/d && echo small > /data/d/small', sandbox='slow')
    x.s3.wait_object('test', 'slow/d/small', b'small\n', aws=False)
    script = '\n'.join([
        'import os, sys, threading',
        'fds = [os.open("/data/f%d" % i, os.O_CREAT | os.O_WRONLY) for i in range(96)]',
        'for fd in fds: os.write(fd, b"x")',
        'errors = []',
        'def sync(fd):',
        '    try: os.fsync(fd)',
        '    except OSError as e: errors.append(e)',
        'ts = [threading.Thread(target=sync, args=(fd,)) for fd in fds]',
        'print("syncing", flush=True)',
        'for th in ts: th.start()',
        'for th in ts: th.join()',
        'print("done", len(errors), flush=True)'])
    c.sh("cat > /root/syncs.py <<'EOF'\n" + script + "\nEOF", sandbox='slow')
    os.kill(x.s3.node.pid, signal.SIGSTOP)  # the bucket accepts and answers nothing
    try:
        c.ok('startProcess', {'sandboxId': 'slow', 'processId': 'syncs', 'command': 'python3 /root/syncs.py'})
        c.ok('waitForLog', {'sandboxId': 'slow', 'processId': 'syncs', 'pattern': 'syncing', 'timeout': 30000})

        def waiting_threads():
            n = 0
            for pid in [int(p) for p in os.listdir('/proc') if p.isdigit()]:
                if hostname_of(pid) != 'slow':  # the sandbox's processes
                    continue
                try:
                    tids = os.listdir('/proc/%d/task' % pid)
                except OSError:
                    continue
                for tid in tids:
                    try:
                        with open('/proc/%d/task/%s/syscall' % (pid, tid)) as f:
                            n += f.read().split(' ', 1)[0] == '74'  # in fsync(2) (x86_64)
                    except OSError:
                        pass
            return n
        wait_until(lambda: waiting_threads() >= 90, 30, 'the fsyncs to wait on the bucket')
        res, _ = c.call('exists', {'sandboxId': 'slow', 'path': '/data/d/none'}, 20)
        t.eq(res.get('structuredContent', {}).get('exists'), False,
             'a file call into the mount answers while 96 fsyncs wait on the bucket', res)
        t.eq(c.sh('echo fine', sandbox='b1', wait=20)['stdout'], 'fine\n', 'and so does another sandbox')
    finally:
        os.kill(x.s3.node.pid, signal.SIGCONT)
    r = c.ok('waitForExit', {'sandboxId': 'slow', 'processId': 'syncs', 'timeout': 120000})
    logs = c.ok('getProcessLogs', {'sandboxId': 'slow', 'processId': 'syncs'})
    t.ok('done 0' in logs.get('stdout', ''), 'once the bucket answers, every fsync succeeds', logs)
    c.ok('destroySandbox', {'sandboxId': 'slow'})


def test_local_bucket(t, x):
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'loc', 'sleepAfter': '2s'})
    r = c.ok('mountBucket', {'sandboxId': 'loc', 'bucket': 'keep', 'mountPath': '/workspace/keep'})
    t.eq(r['local'], True, 'without an endpoint the bucket is local')
    c.sh('echo kept > /workspace/keep/k && echo lost > /workspace/lost && chown 1000:1000 /workspace/keep/k', sandbox='loc')
    t.ok(os.path.isfile(os.path.join(x.env.state, 'buckets', 'keep.img')), 'its files are in $SBX_STATE_DIR/buckets/keep.img')
    ev = x.c.next(lambda m: m.get('method') == 'notifications/message' and m['params']['data'].get('sandboxId') == 'loc', 30)
    r = c.sh('cat /workspace/keep/k; stat -c %u:%g /workspace/keep/k; ls /workspace', sandbox='loc')
    t.eq(r.get('reset'), True, 'the sandbox was reset (%s)' % ev['params']['data'].get('message'))
    t.eq(r['stdout'], 'kept\n1000:1000\nkeep\n',
         'after the reset the local bucket is back with its files and their owner; the rest is gone')


def test_local_bucket_prefix(t, x):
    """prefix mounts part of a local bucket too (it was ignored: the whole
    bucket was mounted); the part is made if absent and reached through no
    symlink, which a sandbox that mounts the bucket whole could plant."""
    c = x.c
    c.ok('mountBucket', {'sandboxId': 'lp', 'bucket': 'keep', 'mountPath': 'whole'})
    c.ok('mountBucket', {'sandboxId': 'lp', 'bucket': 'keep', 'mountPath': 'part', 'prefix': 'sub/dir/'})
    r = c.sh('echo in > /workspace/part/p.txt; cat /workspace/whole/sub/dir/p.txt; ls /workspace/part; '
             'test -e /workspace/whole/p.txt || echo not-at-root', sandbox='lp')
    t.eq(r['stdout'], 'in\np.txt\nnot-at-root\n', 'a file written under the prefix is at sub/dir/ in the bucket, not at its root')
    c.sh('ln -s /etc /workspace/whole/evil && mkdir -p /workspace/whole/ok', sandbox='lp')
    res, _ = c.call('mountBucket', {'sandboxId': 'lp', 'bucket': 'keep', 'mountPath': 'e', 'prefix': 'evil'})
    t.ok(res.get('isError') and res['structuredContent']['error']['code'] == 'MOUNT_FAILED'
         and 'symlink' in res['structuredContent']['error']['message'],
         'a prefix through a symlink the bucket holds is refused', res['structuredContent'])
    res, _ = c.call('mountBucket', {'sandboxId': 'lp', 'bucket': 'keep', 'mountPath': 'u', 'prefix': 'ok/../..'})
    t.eq(res['structuredContent'].get('error', {}).get('code'), 'VALIDATION_FAILED', 'and one with a .. part')
    c.ok('destroySandbox', {'sandboxId': 'lp'})


def test_local_bucket_quota(t, x):
    """A local bucket is bounded (the diskMB of the sandbox that made it):
    a sandbox cannot fill the host's disk through it; every sandbox that
    mounts it shares its files."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'lq', 'limits': {'diskMB': 64}})
    c.ok('mountBucket', {'sandboxId': 'lq', 'bucket': 'small', 'mountPath': '/small', 'localBucket': True})
    r = c.sh('dd if=/dev/zero of=/small/big bs=1M count=200 2>&1; echo rc=$?; df -m /small | tail -1', sandbox='lq')
    t.ok('No space left on device' in r['stdout'] and 'rc=1' in r['stdout'], 'writes past its size get ENOSPC', r['stdout'])
    img = os.path.join(x.env.state, 'buckets', 'small.img')
    t.ok(os.stat(img).st_blocks * 512 <= 64 << 20, 'and the host holds no more than that for it', os.stat(img).st_blocks)
    t.ok(int(r['stdout'].split()[-5]) <= 64, 'df in the sandbox shows its size', r['stdout'])
    c.sh('rm /small/big; echo shared > /small/s', sandbox='lq')
    c.ok('mountBucket', {'sandboxId': 'lq2', 'bucket': 'small', 'mountPath': '/small', 'localBucket': True})
    t.eq(c.sh('cat /small/s; ls -a /small', sandbox='lq2')['stdout'], 'shared\n.\n..\ns\n',
         'another sandbox mounting it shares its files (and nothing of mkfs\'s)')
    c.ok('createSandbox', {'sandboxId': 'lq3', 'limits': {'diskMB': 9000}})
    res, _ = c.call('mountBucket', {'sandboxId': 'lq3', 'bucket': 'more', 'mountPath': '/more', 'localBucket': True})
    err = res['structuredContent'].get('error', {})
    t.ok(res.get('isError') and err.get('code') == 'RESOURCE_LIMIT' and 'buckets.localMB' in err.get('message', ''),
         'local buckets together stay within buckets.localMB: a new one past it is refused, saying so', err)
    t.ok(not os.path.exists(os.path.join(x.env.state, 'buckets', 'more.img')), 'and nothing is made for it')
    c.ok('mountBucket', {'sandboxId': 'lq3', 'bucket': 'small', 'mountPath': '/small', 'localBucket': True})
    t.eq(c.sh('cat /small/s', sandbox='lq3')['stdout'], 'shared\n', 'one that exists still mounts')
    for s in ('lq', 'lq2', 'lq3'):
        c.ok('destroySandbox', {'sandboxId': s})


def test_reset_keeps_bucket(t, x):
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'nap', 'sleepAfter': '2s'})
    x.mount('/workspace/b', sandbox='nap', prefix='nap')
    c.sh('head -c 1500000 /dev/urandom > /workspace/b/data; echo gone > /workspace/outside', sandbox='nap')
    # something left running that does not count as activity: a code context and a child of it
    c.ok('runCode', {'sandboxId': 'nap', 'code': 'import subprocess\nkept = subprocess.Popen(["sleep", "1000"])'})
    want = c.sh('sha256sum /workspace/b/data', sandbox='nap')['stdout'].split()[0]
    sleeper = [p for p in map(int, subprocess.run(['pgrep', '-x', 'sleep'], capture_output=True, text=True).stdout.split())
               if hostname_of(p) == 'nap']  # this sandbox's, not every sleep on the machine
    t.ok(sleeper, 'the sandbox runs a background process', sleeper)
    x.c.next(lambda m: m.get('method') == 'notifications/message' and m['params']['data'].get('sandboxId') == 'nap', 30)
    wait_until(lambda: not any(comm_of(p) == 'sleep' for p in sleeper), 10, 'the sandbox\'s processes to go')
    t.ok(True, 'reset: its processes are gone')
    r = c.sh('sha256sum /workspace/b/data | cut -d" " -f1; ls /workspace', sandbox='nap')
    t.eq(r.get('reset'), True, 'the next call wakes it with reset: true')
    t.eq(r['stdout'], want + '\nb\n', 'the bucket\'s file is intact byte for byte; the file outside it is gone')


def test_no_reset_while_checked(t, x):
    """A sandbox whose mountBucket is still waiting for the bucket is not
    idle: a reset then would leave the mount half made (attached by the
    wake, dropped from the record by the check's failure)."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'chk', 'sleepAfter': '1s'})
    c.sh('true', sandbox='chk')
    reset = lambda m: m.get('method') == 'notifications/message' and m['params']['data'].get('sandboxId') == 'chk'
    node = x.s3.node
    os.kill(node.pid, signal.SIGSTOP)  # the bucket answers nothing until it is continued
    try:
        c.send({'jsonrpc': '2.0', 'id': 'chk-mount', 'method': 'tools/call',
                'params': {'name': 'mountBucket', 'arguments': {
                    'sandboxId': 'chk', 'bucket': 'test', 'mountPath': '/workspace/bk', 'prefix': 'chk',
                    'endpoint': x.s3.endpoint, 'credentials': {'accessKeyId': AK, 'secretAccessKey': SK}}}})
        try:  # three sweeps past its sleepAfter: a reset would have been told by now
            got = c.next(reset, 4)
        except Fail:
            got = None
        t.eq(got, None, 'no idle reset while its mountBucket waits for the bucket')
    finally:
        os.kill(node.pid, signal.SIGCONT)
    r = c.next(lambda m: m.get('id') == 'chk-mount', 60)
    t.ok(not r['result'].get('isError'), 'the mount is made once the bucket answers', r)
    c.sh('echo kept > /workspace/bk/k', sandbox='chk')
    x.s3.wait_object('test', 'chk/k', b'kept\n')
    c.next(reset, 30)
    t.ok(True, 'and once it answered, the sandbox goes idle as usual')
    r = c.sh('cat /workspace/bk/k', sandbox='chk')
    t.eq((r.get('reset'), r['stdout']), (True, 'kept\n'), 'its bucket is there after the reset')


def test_restart_kill9(t, x):
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'rs'})
    x.mount('/data', sandbox='rs', prefix='rs')
    c.sh('echo before > /data/f && sync', sandbox='rs')
    x.s3.wait_object('test', 'rs/f', b'before\n')
    kill_daemon(x)
    r = c.sh('cat /data/f; echo after > /data/g', sandbox='rs', wait=60)
    t.eq(r.get('restarted'), True, 'after kill -9 of the daemon the next call restarts the sandbox')
    t.eq(r['stdout'], 'before\n', 'and its bucket is mounted again')
    x.s3.wait_object('test', 'rs/g', b'after\n')
    t.ok(True, 'writes go to the bucket again')


def test_restart_stop(t, x):
    """sbx daemon stop, then the next call: the mount is back (the stop
    ended its server cleanly, and that once deleted its cache and the
    configuration in it), and a mountBucket of a mount that is in the
    record but not mounted mounts it (it said 'already mounted')."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'st'})
    x.mount('/data', sandbox='st', prefix='st')
    c.sh('echo before > /data/f', sandbox='st')
    x.s3.wait_object('test', 'st/f', b'before\n')
    x.env.run(['daemon', 'stop'])
    r = c.sh('cat /data/f; echo after > /data/g', sandbox='st', wait=60)
    t.eq((r.get('restarted'), r['stdout']), (True, 'before\n'), 'after sbx daemon stop the next call restarts the sandbox '
         'with its bucket mounted again')
    x.s3.wait_object('test', 'st/g', b'after\n')
    t.ok(True, 'writes go to the bucket again')
    # its cache and configuration gone while no daemon ran: it cannot come back
    x.env.run(['daemon', 'stop'])
    shutil.rmtree(os.path.join(x.env.state, 'bucket-cache', 'st'))
    r = c.sh('grep -c " /data " /proc/self/mounts || true', sandbox='st', wait=60)
    t.eq(r['stdout'].strip(), '0', 'a mount whose configuration is gone does not come back')
    told = c.next(lambda m: m.get('method') == 'notifications/message' and
                  m['params']['data'].get('sandboxId') == 'st' and 'is not mounted' in m['params']['data'].get('message', ''), 30)
    t.ok('/data' in told['params']['data']['message'] and told['params']['level'] == 'warning',
         'and its clients are told, with the mount named', told)
    x.mount('/data', sandbox='st', prefix='st')
    t.eq(c.sh('cat /data/g', sandbox='st')['stdout'], 'after\n', 'and mountBucket mounts it again')


def test_crash_of_bucket_server(t, x):
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'cr'})
    x.mount('/data', sandbox='cr', prefix='cr')
    prog = ('import os, sys\nfor i in range(int(sys.argv[1]), int(sys.argv[2])):\n'
            '    fd = os.open("/data/f%d" % i, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)\n'
            '    os.write(fd, b"v%d" % i * 1000)\n    os.fsync(fd)\n    os.close(fd)\n'
            '    with open("/workspace/acked", "a") as a: a.write("%d\\n" % i)\n')
    c.ok('writeFile', {'sandboxId': 'cr', 'path': '/workspace/w.py', 'content': prog})
    c.sh('python3 /workspace/w.py 0 20', sandbox='cr')
    # closed but not fsync'd: only in the cache and its journal when the server dies
    c.sh('for i in 1 2 3; do echo late$i > /data/late$i; done', sandbox='cr')
    before = set(bucketfs_pids(x))
    for pid in before:
        os.kill(pid, signal.SIGKILL)
    acked = c.sh('cat /workspace/acked', sandbox='cr')['stdout'].split()
    missing = [i for i in acked if x.s3.stored('test', 'cr/f%s' % i) != (b'v%s' % i.encode()) * 1000]
    t.ok(len(acked) == 20 and not missing, 'every write fsync acknowledged is in the bucket after kill -9 of its server',
         missing)
    for i in (1, 2, 3):
        x.s3.wait_object('test', 'cr/late%d' % i, b'late%d\n' % i, 60, aws=i == 1)
    t.ok(True, 'what was closed but not uploaded yet is uploaded by the server that takes over (the journal)')
    r = c.sh('cat /data/late2 && echo again > /data/again && cat /data/again', sandbox='cr', wait=60)
    t.eq(r['stdout'], 'late2\nagain\n', 'the mount works again')


def test_daemon_killed_during_writes(t, x):
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'dk'})
    x.mount('/data', sandbox='dk', prefix='dk')
    prog = ('import os\ni = 0\nwhile True:\n'
            '    fd = os.open("/data/n%d" % i, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)\n'
            '    os.write(fd, b"%d" % i)\n    os.fsync(fd)\n    os.close(fd)\n'
            '    with open("/workspace/acked", "a") as a: a.write("%d\\n" % i)\n    i += 1\n')
    c.ok('writeFile', {'sandboxId': 'dk', 'path': '/workspace/w.py', 'content': prog})
    c.ok('startProcess', {'sandboxId': 'dk', 'command': 'python3 /workspace/w.py'})
    wait_until(lambda: len(x.s3.stored_keys('test', 'dk/')) >= 5, 60, 'some writes')
    kill_daemon(x)
    acked = c.sh('cat /workspace/acked', sandbox='dk', wait=60)['stdout'].split()
    missing = [i for i in acked if x.s3.stored('test', 'dk/n%s' % i) != i.encode()]
    t.ok(len(acked) >= 5 and not missing,
         'after kill -9 of the daemon mid-writes, all %d acknowledged writes are in the bucket' % len(acked), missing)


def mounted_then_away(x, sid, **create):
    """A sandbox with the bucket mounted at /data (prefix sid), shown to
    work, then the S3 server stopped."""
    x.c.ok('createSandbox', dict(sandboxId=sid, **create))
    x.mount('/data', sandbox=sid, prefix=sid)
    x.c.sh('echo up > /data/up', sandbox=sid)
    x.s3.wait_object('test', sid + '/up', b'up\n')
    x.s3.stop()


def test_outage(t, x):
    c = x.c
    mounted_then_away(x, 'out', limits={'diskMB': 256})
    try:
        r = c.sh('for i in $(seq 10); do echo w$i > /data/w$i || echo FAIL; done; cat /data/w7; '
                 'python3 -c "import os; fd = os.open(\'/data/w1\', os.O_WRONLY); os.fsync(fd)" 2>&1 | tail -1',
                 sandbox='out', wait=120)
        t.ok('FAIL' not in r['stdout'] and r['stdout'].startswith('w7\n'),
             'with the S3 server down, writes go on into the cache', r)
        t.ok('OSError' in r['stdout'] or 'Input/output error' in r['stdout'],
             'and fsync says the data is not in the bucket (EIO) instead of pretending', r)
        r = c.sh('head -c 300000000 /dev/zero > /data/huge; echo rc=$?', sandbox='out', wait=120)
        t.ok('No space left' in r['stderr'] and 'rc=1' in r['stdout'],
             'what waits for the bucket is bounded (the sandbox\'s diskMB): ENOSPC past it', r)
        c.sh('rm -f /data/huge', sandbox='out')
        r = c.sh('truncate -s 1G /data/sparse; echo rc=$?; python3 -c "import os; fd = os.open(\'/data/w3\', os.O_WRONLY); '
                 'os.posix_fallocate(fd, 0, 1 << 30)" 2>&1 | tail -1; du -k /data/w3 | cut -f1', sandbox='out')
        t.ok('No space left' in r['stderr'] and 'rc=1' in r['stdout'] and 'No space left' in r['stdout'],
             'growing a file by truncate or fallocate is bounded the same way', r)
    finally:
        x.s3.start()
    for i in range(1, 11):
        x.s3.wait_object('test', 'out/w%d' % i, b'w%d\n' % i, 60, aws=i == 1)
    t.ok(True, 'once the server is back every one of them is uploaded')


def test_outage_names_bounded(t, x):
    """With the bucket away, names with nothing in them (symlinks with long
    targets, empty files) are journaled on the host, each a block or, with
    bytes its JSON escapes (a target of control characters is six times
    as long there), what it takes: they count against the sandbox's diskMB
    as data does, so that making them ends in ENOSPC instead of filling the
    host's disk."""
    c = x.c
    mounted_then_away(x, 'names', limits={'diskMB': 64})
    try:
        r = c.sh('cd /data && python3 -c "\nimport os\nn = 0\ntry:\n    while n < 40000:\n'
                 '        os.symlink((chr(1) if n % 2 else \'t\') * 3000, \'l%d\' % n)\n        n += 1\n'
                 'except OSError as e:\n'
                 '    print(e.strerror)\nprint(n)"', sandbox='names', wait=600)
        out = r['stdout'].split('\n')
        t.eq(out[0], 'No space left on device', 'making symlinks with the bucket away ends in ENOSPC', r)
        cache = os.path.join(x.env.state, 'bucket-cache', 'names')
        used = int(subprocess.run(['du', '-sk', cache], capture_output=True, text=True).stdout.split()[0])
        t.ok(used <= 64 * 1024 * 1.1, 'when the host holds about the sandbox\'s 64 MB of them (%d KiB, %s symlinks)'
             % (used, out[1]))
        r = c.sh('rm -f /data/l*; : > /data/after; echo rc=$?', sandbox='names', wait=600)
        t.ok('rc=0' in r['stdout'], 'and removing them makes room again', r)
    finally:
        x.s3.start()


def test_removed_stays_removed(t, x):
    """A name removed, made again and removed again, or renamed over and
    removed, while the bucket is away: once the bucket is back, the object
    it had under that name is gone too."""
    c = x.c
    x.s3.put('test', 'rz/x', b'old x\n')
    x.s3.put('test', 'rz/a', b'old a\n')
    c.ok('createSandbox', {'sandboxId': 'rz'})
    x.mount('/data', sandbox='rz', prefix='rz')
    t.eq(c.sh('cat /data/x /data/a', sandbox='rz')['stdout'], 'old x\nold a\n', 'two objects read through the mount')
    x.s3.stop()
    try:
        r = c.sh('rm /data/x && touch /data/x && rm /data/x && echo new > /data/b && mv /data/b /data/a && rm /data/a && '
                 'ls -A /data', sandbox='rz')
        t.eq(r['stdout'], '', 'the mount shows the removals', r)
    finally:
        x.s3.start()
    t.ok(wait_until(lambda: not {'rz/x', 'rz/a'} & set(x.s3.stored_keys('test', 'rz/')), 60, 'the deletions'),
         'and once the bucket is back, neither old object is left in it')


def test_open_unlinked_files(t, x):
    """Files written after their removal (tmpfile's way) give their space
    back when closed: 200 MB of them through a 64 MB sandbox's mount."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'tmpf', 'limits': {'diskMB': 64}})
    x.mount('/data', sandbox='tmpf', prefix='tmpf')
    r = c.sh('cd /data && python3 -c "\nimport os\nfor i in range(100):\n    f = open(\'t%d\' % i, \'wb\')\n'
             '    os.unlink(\'t%d\' % i)\n    f.write(os.urandom(2 << 20))\n    f.close()\nprint(\'ok\')" && '
             'head -c 20000000 /dev/zero > kept && echo kept', sandbox='tmpf', wait=120)
    t.eq(r['stdout'], 'ok\nkept\n', 'then a 20 MB file still fits', r)
    # a removed file reached again through an O_PATH descriptor: it is gone
    # (its data went with its name), and nothing is written for it
    prog = ('import os\nfor i in range(6):\n    n = "/data/p%d" % i\n    open(n, "w").close()\n'
            '    p = os.open(n, os.O_PATH)\n    os.unlink(n)\n    try:\n'
            '        fd = os.open("/proc/self/fd/%d" % p, os.O_RDWR)\n'
            '        os.write(fd, os.urandom(15 << 20))\n        os.close(fd)\n        print("written")\n'
            '    except FileNotFoundError:\n        print("gone")\n    os.close(p)\n')
    r = run_py(x, 'tmpf', prog)
    cache = os.path.join(x.env.state, 'bucket-cache', 'tmpf')
    used = int(subprocess.run(['du', '-sk', cache], capture_output=True, text=True).stdout.split()[0])
    t.ok(r['stdout'] == 'gone\n' * 6 and used <= 40 * 1024,
         'a removed file opened again through /proc is gone, and leaves nothing in the cache', (r, '%d KiB' % used))
    # ...nor does it touch the file that took its name since
    # (s3rver itself sometimes dies of this PUT after a DELETE of the same
    # key, and is started again: the fsync then fails, and the journal
    # uploads the file once the server is back)
    prog = ('import os\nv = "/data/victim"\nwith open(v, "wb") as f:\n    f.write(b"O" * 100000)\n'
            '    f.flush()\n    os.fsync(f.fileno())\np = os.open(v, os.O_PATH)\nos.unlink(v)\n'
            'new = os.urandom(100000)\nopen("/workspace/new.bin", "wb").write(new)\nf = open(v, "wb")\nf.write(new)\n'
            'f.flush()\ntry:\n    os.close(os.open("/proc/self/fd/%d" % p, os.O_RDONLY))\nexcept FileNotFoundError:\n    pass\n'
            'try:\n    os.fsync(f.fileno())\n    f.close()\nexcept OSError:\n    pass\n')
    run_py(x, 'tmpf', prog)
    new = base64.b64decode(c.ok('readFile', {'sandboxId': 'tmpf', 'path': '/workspace/new.bin', 'encoding': 'base64'})['content'])
    x.s3.wait_object('test', 'tmpf/victim', new)
    t.ok(True, 'the object of the name holds what was written last, not zeros of the removed file')
    c.ok('destroySandbox', {'sandboxId': 'tmpf'})


def test_crash_during_outage(t, x):
    """What waits for an unreachable bucket survives kill -9 of its server,
    including entries rewritten shorter than before (a file grown, then
    truncated and rewritten; a mode changed)."""
    c = x.c
    mounted_then_away(x, 'jo')
    try:
        r = c.sh('head -c 12345678 /dev/zero > /data/shrunk && echo ok > /data/shrunk && chmod 600 /data/shrunk && '
                 'echo small > /data/grown && head -c 2345678 /dev/urandom > /data/grown && '
                 'echo moved > /data/before && mv /data/before /data/after && mkdir /data/dd && ln -s after /data/ln && '
                 'sha256sum < /data/grown && stat -c "%s %a" /data/shrunk /data/grown', sandbox='jo', wait=120)
        t.eq(r['exitCode'], 0, 'writes go on with the S3 server down', r)
        digest, sizes = r['stdout'].split()[0], r['stdout'].split('\n')[1:3]
        for pid in bucketfs_pids(x):
            os.kill(pid, signal.SIGKILL)
    finally:
        x.s3.start()
    x.s3.wait_object('test', 'jo/shrunk', b'ok\n', 60)
    wait_until(lambda: len(x.s3.stored('test', 'jo/grown') or b'') == 2345678, 60, 'the grown file uploaded')
    t.eq(sha(x.s3.stored('test', 'jo/grown')), digest, 'a file grown while the bucket was away is uploaded whole '
         'by the server that takes over after kill -9')
    r = c.sh('stat -c "%s %a" /data/shrunk /data/grown', sandbox='jo', wait=60)
    t.eq(r['stdout'].split('\n')[:2], sizes, 'sizes and modes as they were before the crash', r)
    x.s3.wait_object('test', 'jo/after', b'moved\n', 60)
    wait_until(lambda: {'jo/dd/', 'jo/ln'} <= set(x.s3.stored_keys('test', 'jo/')), 60, 'the directory and the link uploaded')
    r = c.sh('ls /data; readlink /data/ln', sandbox='jo', wait=60)
    t.eq(r['stdout'], 'after\ndd\ngrown\nln\nshrunk\nup\nafter\n',
         'a file renamed, a directory and a link made while the bucket was away are there after the crash, '
         'the old name gone')


def test_syscall_suite(t, x):
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'fs', 'limits': {'diskMB': 1024}})
    x.mount('/data', sandbox='fs', prefix='fsops')
    with open(FSOPS, 'rb') as f:
        c.ok('writeFile', {'sandboxId': 'fs', 'path': '/workspace/fsops', 'encoding': 'base64',
                           'content': base64.b64encode(f.read()).decode()})
    r = c.sh('chmod +x /workspace/fsops && mkdir -p /data/t && /workspace/fsops --tap /data/t', sandbox='fs', wait=300)
    failing = [line.split(' - ', 1)[1].split(':')[0] for line in r['stdout'].splitlines() if line.startswith('not ok')]
    documented = {
        # an object store keeps no hard links, and cannot swap two names at once
        'link', 'nlink after link', 'RENAME_EXCHANGE', 'exchanged',
        # no extended attributes
        'setxattr user', 'getxattr', 'getxattr size', 'getxattr missing', 'listxattr has it',
        'setxattr XATTR_CREATE on existing', 'removexattr', 'removexattr missing',
        # atime is not kept (it is mtime)
        'nanosecond times',
        # a file is at most what the cache holds (the sandbox's diskMB, here 1024)
        'pwrite past 4 GiB', 'size past 4 GiB', 'pread past 4 GiB', 'SEEK_DATA past 4 GiB',
    }
    total = r['stdout'].count('\nok ') + len(failing)
    t.ok(total > 80, 'the syscall suite ran (%d calls)' % total, r['stdout'][-1500:] + r['stderr'][-500:])
    t.eq(sorted(set(failing) - documented), [], 'every call answers as on a native filesystem but the documented exceptions',
         '\n'.join(line for line in r['stdout'].splitlines() if line.startswith('not ok')))


def test_view_shows_bucket(t, x):
    mnt = os.path.join(x.env.root, 'view')
    os.makedirs(mnt)
    r = x.env.run(['mount', mnt])
    t.eq(r.returncode, 0, 'sbx mount', r.stderr)
    try:
        x.mount('/workspace/bk', prefix='view')
        x.c.sh('echo from-sandbox > /workspace/bk/v.txt')
        p = os.path.join(mnt, 'b1', 'bk', 'v.txt')
        wait_until(lambda: os.path.exists(p), 10, 'the view to show the bucket mount')
        t.eq(open(p).read(), 'from-sandbox\n', 'the FUSE view shows a bucket mounted under /workspace')
        x.c.sh('echo changed-in-the-sandbox-longer > /workspace/bk/v.txt')
        t.ok(wait_until(lambda: open(p).read() == 'changed-in-the-sandbox-longer\n', 10, 'the change through the view'),
             'a change inside to a bucket file is seen through the view, not its old pages (no pushed invalidations there)')
        with open(os.path.join(mnt, 'b1', 'bk', 'h.txt'), 'w') as f:
            f.write('from-host\n')
        x.s3.wait_object('test', 'view/h.txt', b'from-host\n')
        t.ok(True, 'a file written through the view goes to the bucket')
        d = os.path.join(mnt, 'b1', 'bk')
        t.ok('fresh.txt' not in os.listdir(d), 'a listing of the bucket directory through the view')
        x.c.sh('echo new > /workspace/bk/fresh.txt')
        t.ok(wait_until(lambda: 'fresh.txt' in os.listdir(d), 10, 'the new name in the listing'),
             'a file the sandbox adds to its bucket shows in the next listings through the view (the kernel keeps none '
             'for long)')
    finally:
        x.env.run(['umount', mnt])


def test_view_stalled_endpoint(t, x):
    """An endpoint that stops answering while host programs read a bucket
    through the view holds a few of the view's threads: the sandboxes' own
    files and their other buckets keep answering, reads past those few fail
    at once, and the reads that waited get their data once the endpoint
    answers again."""
    N = 140  # more readers than the view has threads
    mnt = os.path.join(x.env.root, 'view-stall')
    os.makedirs(mnt)
    # served by the view itself, not passed through to the sandbox's disk: what a stalled bucket could starve
    r = x.env.run(['mount', '-o', 'nopassthrough', mnt])
    t.eq(r.returncode, 0, 'sbx mount', r.stderr)
    node = x.s3.node
    readers, got = [], {}
    try:
        x.c.ok('createSandbox', {'sandboxId': 'st1'})
        x.mount('/workspace/st', sandbox='st1', prefix='stall')
        # past the size a listing fetches ahead: each read needs the bucket
        x.c.sh('for i in $(seq %d); do { echo $i; head -c 600000 /dev/zero; } > /workspace/st/f$i; done; '
               'head -c 4000000 /dev/urandom > /workspace/own.bin' % N, sandbox='st1', wait=300)
        x.s3.wait_object('test', 'stall/f%d' % N, b'%d\n' % N + bytes(600000), timeout=120, aws=False)
        x.c.ok('createSandbox', {'sandboxId': 'st2'})
        x.mount('/workspace/st', sandbox='st2', prefix='stall')  # a cache of its own, empty
        # a local bucket (its size the sandbox's diskMB, within buckets.localMB)
        x.c.ok('createSandbox', {'sandboxId': 'st3', 'limits': {'diskMB': 64}})
        x.c.ok('mountBucket', {'sandboxId': 'st3', 'bucket': 'stall-local', 'mountPath': '/workspace/loc', 'localBucket': True})
        x.c.sh('head -c 4000000 /dev/urandom > /workspace/loc/l.bin', sandbox='st3')
        d = os.path.join(mnt, 'st2', 'st')
        t.eq(len(os.listdir(d)), N, 'another sandbox sees the files through its own mount')

        def read(i):
            try:
                fd = os.open(os.path.join(d, 'f%d' % i), os.O_RDONLY)
                try:
                    got[i] = os.read(fd, 8).split(b'\n')[0]
                finally:
                    os.close(fd)
            except OSError as e:
                got[i] = e.errno
        os.kill(node.pid, signal.SIGSTOP)  # the endpoint answers nothing
        readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(1, N + 1)]
        for th in readers:
            th.start()
        failed = lambda: [v for v in got.values() if v in (errno.EAGAIN, errno.EIO)]
        t.ok(wait_until(lambda: len(failed()) >= N // 2, 30, 'reads past the few to fail'),
             'most reads of a stalled bucket fail at once', sorted(set(map(str, got.values()))))
        for what, path, sandbox, inside in (('a sandbox\'s own file', os.path.join(mnt, 'st1', 'own.bin'), 'st1', '/workspace/own.bin'),
                                            ('another bucket\'s file', os.path.join(mnt, 'st3', 'loc', 'l.bin'), 'st3', '/workspace/loc/l.bin')):
            want = x.c.sh('sha256sum < %s' % inside, sandbox=sandbox)['stdout'].split()[0]
            out = {}
            th = threading.Thread(target=lambda: out.setdefault('r', sha(open(path, 'rb').read())), daemon=True)
            th.start()
            th.join(20)
            t.eq(out.get('r'), want, 'meanwhile %s reads whole through the view' % what)
        waiting = [i for i in range(1, N + 1) if i not in got]
        t.ok(waiting, 'a few reads wait for the bucket (%d)' % len(waiting))
        os.kill(node.pid, signal.SIGCONT)
        deadline = time.monotonic() + 120
        for th in readers:
            th.join(max(0, deadline - time.monotonic()))
        t.ok(all(got.get(i) == b'%d' % i for i in waiting),
             'the endpoint back, the reads that waited get their data', [(i, got.get(i)) for i in waiting][:10])
        t.ok(all(got.get(i) in (b'%d' % i, errno.EAGAIN, errno.EIO) for i in range(1, N + 1)), 'no read got anything else',
             sorted(set(map(str, got.values())))[:10])
    finally:
        os.kill(node.pid, signal.SIGCONT)
        x.env.run(['umount', mnt])
        for sid in ('st1', 'st2', 'st3'):  # their caches count in later tests' (test_hostile_keys_and_bodies)
            x.c.call('destroySandbox', {'sandboxId': sid})


def test_unmount(t, x):
    c = x.c
    x.mount('/um', prefix='um')
    c.sh('head -c 2000000 /dev/urandom > /um/f')
    want = c.sh('sha256sum /um/f')['stdout'].split()[0]
    r, _ = c.call('unmountBucket', {'mountPath': '/um'})
    t.ok('every change is in the bucket' in r['content'][0]['text'], 'unmountBucket answers once uploads are done', r)
    t.eq(sha(x.s3.get('test', 'um/f') or b''), want, 'and the object is there, whole')
    t.eq(c.sh('ls -A /um')['stdout'], '', 'the directory is empty again')
    res, _ = c.call('unmountBucket', {'mountPath': '/um'})
    t.eq(res['structuredContent'].get('error', {}).get('code'), 'VALIDATION_FAILED', 'unmounting twice says nothing is there')


def test_cache_cap(t, x):
    """Reading more than the cache holds (the sandbox's diskMB) keeps the
    cache on the host's disk within it: the least recently used clean data
    goes, and comes back from the bucket, byte for byte, when read again."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'cap', 'limits': {'diskMB': 16}})
    blobs = {}
    src = os.path.join(x.env.root, 'cap-src')
    os.makedirs(src)
    for i in range(48):  # 24 MiB in the bucket, 16 MiB of cache
        blobs[i] = os.urandom(512 << 10)
        with open(os.path.join(src, 'f%02d' % i), 'wb') as f:
            f.write(blobs[i])
    x.s3.sync(src, 's3://test/cap')
    x.mount('/data', sandbox='cap', prefix='cap')
    want = '\n'.join(sha(blobs[i]) for i in range(48))
    r = c.sh('cd /data && for i in $(seq -w 0 47); do sha256sum < f$i | cut -d" " -f1; done', sandbox='cap', wait=120)
    t.eq(r['stdout'].strip(), want, 'every file reads whole while the cache is past its cap')
    cache = os.path.join(x.env.state, 'bucket-cache', 'cap')
    used = int(subprocess.run(['du', '-sk', cache], capture_output=True, text=True).stdout.split()[0])
    t.ok(used <= 18 * 1024, 'the cache on the host stays within diskMB (16 MiB)', '%d KiB' % used)
    subprocess.run(['sh', '-c', 'echo 3 > /proc/sys/vm/drop_caches'])  # what is read again comes from the server
    r = c.sh('cd /data && for i in $(seq -w 0 47); do sha256sum < f$i | cut -d" " -f1; done', sandbox='cap', wait=120)
    t.eq(r['stdout'].strip(), want, 'and read again (the first ones fetched again), they are the same')
    # files read while all of them stay open (48 MiB of them): what open files
    # fetched goes back too
    big = os.path.join(x.env.root, 'cap-big')
    os.makedirs(big)
    for i in range(6):
        blobs[100 + i] = os.urandom(8 << 20)
        with open(os.path.join(big, 'b%d' % i), 'wb') as f:
            f.write(blobs[100 + i])
    x.s3.sync(big, 's3://test/cap/big')
    want = '\n'.join(sha(blobs[100 + i]) for i in range(6))
    hold = ('import hashlib, os, sys, time\nfds = []\ndeadline = time.monotonic() + 60\n'
            'while not os.path.exists("/data/big/b5") and time.monotonic() < deadline:  # listed again after 5 s\n'
            '    time.sleep(0.2)\nfor i in range(6):\n'
            '    fds.append(os.open("/data/big/b%d" % i, os.O_RDONLY))\n    h = hashlib.sha256()\n'
            '    while True:\n        b = os.read(fds[-1], 100000)\n        if not b: break\n        h.update(b)\n'
            '    print(h.hexdigest())\nprint("held", flush=True)\n'
            'for fd in fds:\n    print(hashlib.sha256(os.pread(fd, 8 << 20, 0)).hexdigest())\n'
            'print("again", flush=True)\ntime.sleep(600)\n')
    out = hold_py(x, 'cap', 'hold', hold, 'again').split()
    used = int(subprocess.run(['du', '-sk', cache], capture_output=True, text=True).stdout.split()[0])
    t.ok(used <= 18 * 1024, 'with all six 8 MiB files open, the cache on the host stays within diskMB', '%d KiB' % used)
    t.eq((out[:6], out[7:13]), (want.split(), want.split()),
         'each reads whole, and again the same (past the cap, from the bucket, uncached)')
    c.ok('killProcess', {'sandboxId': 'cap', 'processId': 'hold'})
    c.ok('destroySandbox', {'sandboxId': 'cap'})


def test_forgotten_files_stay_cached(t, x):
    """Files written through a mount stay in its cache once uploaded, also
    when the kernel forgets them (its caches dropped): read again, they come
    from the cache, not the bucket (each object's ETag in the listing says
    it is still the one uploaded), and a directory looked up again needs no
    HEAD. One that another S3 client replaced meanwhile is read anew."""
    c = x.c
    x.mount('/fg', prefix='fg')
    # 40 small files, one that goes up in parts (its ETag is the parts') and a directory of 5
    c.sh('cd /fg && mkdir d && for i in $(seq 40); do head -c 10000 /dev/urandom > f$i; done && '
         'for i in $(seq 5); do echo $i > d/g$i; done && head -c 20000000 /dev/urandom > big && sync f* big d d/*',
         wait=300)
    want = c.sh('cd /fg && sha256sum f* big d/*')['stdout']
    t.eq(len(x.s3.stored_keys('test', 'fg/')), 47, 'the 46 files and the directory are in the bucket (fsync said so)')
    for _ in range(2):  # the second time, they were looked up anew after the first
        before = len(x.s3.checks())
        subprocess.run(['sh', '-c', 'echo 2 > /proc/sys/vm/drop_caches'], check=True)
        t.eq(c.sh('cd /fg && sha256sum f* big d/*')['stdout'], want, 'read again after the kernel forgot them, all the same')
        fetched = [ch['method'] + ' ' + ch['path'] for ch in x.s3.checks()[before:]
                   if ch['method'] in ('GET', 'HEAD') and ch['path'].startswith('/test/fg/')]
        t.eq(fetched, [], 'and none of them was asked of the bucket again: they came from the cache')
    new = os.urandom(10000)
    x.s3.put('test', 'fg/f7', new)  # the same size, other bytes
    subprocess.run(['sh', '-c', 'echo 2 > /proc/sys/vm/drop_caches'], check=True)
    wait_until(lambda: c.sh('sha256sum < /fg/f7')['stdout'].split()[0] == sha(new), 30,
               'the file another client replaced to read as replaced')
    t.ok(True, 'a cached file another client replaced (same size) reads anew once the listing shows its new ETag')
    h = {l.split()[1]: l.split()[0] for l in want.splitlines()}
    t.eq(c.sh('cd /fg && sha256sum f1 big')['stdout'], '%s  f1\n%s  big\n' % (h['f1'], h['big']),
         'the others still read as written')
    # a file held so that another client makes its name a directory
    c.sh('chmod 600 /fg/f9 && cat /fg/f9 > /dev/null && sync /fg/f9')
    subprocess.run(['sh', '-c', 'echo 2 > /proc/sys/vm/drop_caches'], check=True)
    x.s3.delete('test', 'fg/f9')
    x.s3.put('test', 'fg/f9/inside', b'now a directory')
    wait_until(lambda: c.sh('cat /fg/f9/inside 2>/dev/null')['stdout'] == 'now a directory', 30,
               'the name another client made a directory to read as one')
    t.eq(c.sh('stat -c "%F %a" /fg/f9')['stdout'], 'directory 755\n',
         'a held file whose name became a directory is a directory, none of the file\'s mode kept')
    x.c.ok('unmountBucket', {'mountPath': '/fg'})


def test_mounts_by_identity(t, x):
    """unmountBucket detaches the mount it made, wherever the sandbox has
    moved it, and never follows the sandbox's symlinks or renames into
    another mount; mountBucket never makes its path inside another mount,
    and refuses the system layers (/opt) at once."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'ident', 'limits': {'diskMB': 64}})
    mounts = lambda: c.sh("grep -c ' - fuse sbx-bucket' /proc/self/mountinfo || true", sandbox='ident')['stdout'].strip()
    x.mount('/workspace/pb/b', sandbox='ident', prefix='ident-b')
    c.sh('mv /workspace/pb /workspace/pb2 && mkdir /workspace/pb', sandbox='ident')
    c.ok('unmountBucket', {'sandboxId': 'ident', 'mountPath': '/workspace/pb/b'}, 60)
    t.eq(mounts(), '0', 'a bucket whose directory the sandbox renamed is unmounted where it went')
    c.ok('mountBucket', {'sandboxId': 'ident', 'bucket': 'identlocal', 'mountPath': '/workspace/lp/b', 'localBucket': True})
    deep = '/workspace/' + '/'.join(['d' * 250] * 24)  # past PATH_MAX, and past a line of /proc/self/mountinfo
    r = c.sh('python3 -c "import os; os.makedirs(\'%s\'[:4000]); os.chdir(\'%s\'[:4000]); os.makedirs(\'%s\'[4000:].lstrip(\'/\')); '
         'os.chdir(\'%s\'[4000:].lstrip(\'/\')); os.rename(\'/workspace/lp\', \'lp\')"' % (deep, deep, deep, deep), sandbox='ident')
    t.eq(r['exitCode'], 0, 'the sandbox moves a mounted bucket deeper than PATH_MAX', r)
    c.ok('unmountBucket', {'sandboxId': 'ident', 'mountPath': '/workspace/lp/b'}, 60)
    t.eq(c.sh("grep -c identlocal /proc/self/mountinfo || true; grep -c ' /workspace/d' /proc/self/mountinfo || true",
              sandbox='ident')['stdout'].split(), ['0', '0'], 'and one moved deeper than a path can name, too')
    c.sh('rm -rf /workspace/' + 'd' * 250, sandbox='ident')
    # a symlink where the mount's parent was leads into another bucket, whose server is stopped
    x.mount('/workspace/pa/a', sandbox='ident', prefix='ident-a')
    c.ok('mountBucket', {'sandboxId': 'ident', 'bucket': 'identlocal', 'mountPath': '/workspace/pb/b', 'localBucket': True})
    c.sh('mv /workspace/pb /workspace/pb3 && ln -s /workspace/pa/a /workspace/pb', sandbox='ident')
    os.kill(x.s3.node.pid, signal.SIGSTOP)
    try:
        c.ok('unmountBucket', {'sandboxId': 'ident', 'mountPath': '/workspace/pb/b'}, 20)
        t.eq(c.sh('echo fine', sandbox='b1', wait=20)['stdout'], 'fine\n', 'unmountBucket follows no symlink into a stopped bucket')
        r = c.sh('grep -c " /workspace/pb3/b " /proc/self/mountinfo || true; grep -c " /workspace/pa/a " /proc/self/mountinfo',
                 sandbox='ident', wait=20)
        t.eq(r['stdout'].split(), ['0', '1'], 'the local bucket is unmounted where it went; the other stays', r)
        c.sh('rm /workspace/pb && mv /workspace/pa /workspace/pc && ln -s /workspace/pc/a /workspace/pd', sandbox='ident', wait=20)
        for path in ('/workspace/pc/a/sub', '/workspace/pd/sub'):
            res, _ = c.call('mountBucket', {'sandboxId': 'ident', 'bucket': 'identlocal', 'mountPath': path,
                                            'localBucket': True}, 20)
            err = res['structuredContent'].get('error', {})
            t.ok(res.get('isError') and err.get('code') == 'MOUNT_FAILED',
                 'a mountPath that leads into another bucket is refused, at once (%s)' % path, err)
    finally:
        os.kill(x.s3.node.pid, signal.SIGCONT)
    res, _ = c.call('mountBucket', {'sandboxId': 'ident', 'bucket': 'identlocal', 'mountPath': '/opt/x', 'localBucket': True})
    t.eq(res['structuredContent'].get('error', {}).get('code'), 'VALIDATION_FAILED', 'a mountPath under /opt is refused at once')
    c.ok('destroySandbox', {'sandboxId': 'ident'})


def test_mounts_bounded(t, x):
    """What a sandbox's bucket mounts take of the host is bounded: at most
    8 mounts (each a server and a cache on the host's disk)."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'many', 'limits': {'diskMB': 256}})
    for i in range(1, 9):
        x.mount('/m%d' % i, sandbox='many', prefix='many%d' % i)
    res, _ = c.call('mountBucket', {'sandboxId': 'many', 'bucket': 'test', 'mountPath': '/m9', 'endpoint': x.s3.endpoint,
                                    'credentials': {'accessKeyId': AK, 'secretAccessKey': SK}})
    err = res['structuredContent'].get('error', {})
    t.ok(res.get('isError') and err.get('code') == 'RESOURCE_LIMIT' and 'at most 8' in err.get('message', ''),
         'a ninth bucket mount is refused with RESOURCE_LIMIT, saying the limit', err)
    t.eq(c.sh('ls -d /m[0-9]', sandbox='many')['stdout'].split(), ['/m%d' % i for i in range(1, 9)], 'the eight work on')
    c.ok('unmountBucket', {'sandboxId': 'many', 'mountPath': '/m1'})
    x.mount('/m9', sandbox='many', prefix='many9')
    t.ok(True, 'once one is unmounted, another mounts')
    # mounts gone whose changes their bucket has not taken count too (their caches wait on the host)
    c.sh('ls /m2 /m3 /m4 /m5 /m6 /m7 /m8 /m9', sandbox='many')  # listed: a new name needs no bucket
    x.s3.stop()
    try:
        r = c.sh('for i in 2 3 4 5 6 7 8 9; do echo kept > /m$i/k || exit 1; done', sandbox='many')
        t.eq(r['exitCode'], 0, 'with the bucket away, writes go into the caches', r)
        for i in range(2, 10):
            r, _ = c.call('unmountBucket', {'sandboxId': 'many', 'mountPath': '/m%d' % i}, 120)
            t.ok('kept' in r['content'][0]['text'], 'unmounted with its change kept (/m%d)' % i, r['content'][0]['text'])
    finally:
        x.s3.start()
    res, _ = c.call('mountBucket', {'sandboxId': 'many', 'bucket': 'test', 'mountPath': '/m10', 'endpoint': x.s3.endpoint,
                                    'prefix': 'many10', 'credentials': {'accessKeyId': AK, 'secretAccessKey': SK}})
    err = res['structuredContent'].get('error', {})
    t.ok(res.get('isError') and err.get('code') == 'RESOURCE_LIMIT' and 'not taken yet' in err.get('message', ''),
         'with 8 such caches, a new mount is refused: they bound what the host keeps for the sandbox', err)
    x.mount('/m2', sandbox='many', prefix='many2')
    x.s3.wait_object('test', 'many2/k', b'kept\n')
    t.ok(True, 'mounting one of those buckets again uploads its change')
    c.ok('destroySandbox', {'sandboxId': 'many'})
    # host-wide: caches of mounts gone (destroyed sandboxes' too) waiting for their bucket, as the daemon finds them
    ghosts = os.path.join(x.env.state, 'bucket-cache', 'ghost')
    for i in range(64):
        os.makedirs(os.path.join(ghosts, '%016x' % i, 'journal'))
    try:
        c.ok('createSandbox', {'sandboxId': 'after', 'limits': {'diskMB': 64}})
        res, _ = c.call('mountBucket', {'sandboxId': 'after', 'bucket': 'test', 'mountPath': '/a', 'endpoint': x.s3.endpoint,
                                        'prefix': 'after', 'credentials': {'accessKeyId': AK, 'secretAccessKey': SK}})
        err = res['structuredContent'].get('error', {})
        t.ok(res.get('isError') and err.get('code') == 'RESOURCE_LIMIT' and 'bucket-cache' in err.get('message', ''),
             'with 64 caches of mounts gone on the machine, a mount that needs a new cache is refused, saying where', err)
    finally:
        shutil.rmtree(ghosts)
    x.mount('/a', sandbox='after', prefix='after')
    t.ok(True, 'once they are gone, it mounts')
    c.ok('destroySandbox', {'sandboxId': 'after'})


def test_hung_bucket_stalls_nobody(t, x):
    """A file call that waits on a bucket whose server answers nothing (a
    read, a listing, a resources/read of files the cache does not have)
    holds no one else: other sandboxes' commands and file calls, and the
    same sandbox's commands, are answered meanwhile; once the bucket
    answers, so do the waiting calls, with the right bytes."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'hung'})
    x.s3.put('test', 'hung/cold.txt', b'from the bucket\n')
    x.s3.put('test', 'hung/cold2.txt', b'also from the bucket\n')
    x.s3.put('test', 'hung/sub/deep.txt', b'deeper\n')
    x.s3.put('test', 'hung/work/f', b'f\n')
    x.mount('/data', sandbox='hung', prefix='hung')  # a fresh mount: nothing cached
    os.kill(x.s3.node.pid, signal.SIGSTOP)  # the bucket accepts and answers nothing
    try:
        ids = [next(c.ids) for _ in range(3)]
        c.send({'jsonrpc': '2.0', 'id': ids[0], 'method': 'tools/call',
                'params': {'name': 'readFile', 'arguments': {'sandboxId': 'hung', 'path': '/data/cold.txt'}}})
        c.send({'jsonrpc': '2.0', 'id': ids[1], 'method': 'tools/call',
                'params': {'name': 'listFiles', 'arguments': {'sandboxId': 'hung', 'path': '/data'}}})
        c.send({'jsonrpc': '2.0', 'id': ids[2], 'method': 'resources/read',
                'params': {'uri': 'sbx://hung/data/cold.txt'}})
        cwds = [next(c.ids) for _ in range(2)]  # commands whose cwd the daemon cannot check without the bucket
        for i, d in zip(cwds, ('/data/work', '/data/nowhere')):
            c.send({'jsonrpc': '2.0', 'id': i, 'method': 'tools/call',
                    'params': {'name': 'exec', 'arguments': {'sandboxId': 'hung', 'command': 'pwd', 'cwd': d}}})
        more = [next(c.ids) for _ in range(70)]  # 2 wait already: 62 more may, 8 are refused at once
        for i in more:
            c.send({'jsonrpc': '2.0', 'id': i, 'method': 'tools/call',
                    'params': {'name': 'exists', 'arguments': {'sandboxId': 'hung', 'path': '/data/cold.txt'}}})
        refused = [c.next(lambda m: m.get('id') in more and 'method' not in m, 20) for _ in range(8)]
        t.eq(sorted(r['result']['structuredContent']['error']['code'] for r in refused), ['RESOURCE_LIMIT'] * 8,
             'past 64 file calls waiting on one sandbox, more are refused at once with RESOURCE_LIMIT', refused[:1])
        t.eq(c.sh('echo fine', sandbox='b1', wait=20)['stdout'], 'fine\n',
             'another sandbox\'s command is answered while file calls wait on the bucket')
        t.eq(c.ok('writeFile', {'sandboxId': 'b1', 'path': 'w.txt', 'content': 'w'}, 20)['size'], 1,
             'and so is its file call')
        t.eq(c.sh('echo here', sandbox='hung', wait=20)['stdout'], 'here\n', 'and the same sandbox\'s command')
        # where the daemon saves a command's long output, the sandbox points into the bucket
        c.sh('ln -s /data/spill /tmp/sbx-output', sandbox='hung', wait=20)
        r = c.sh('head -c 200000 /dev/zero | tr "\\0" a', sandbox='hung', wait=20)
        t.ok(r.get('truncated') is True and 'outputPath' not in r,
             'a long output is answered, not saved through the symlink into the stopped bucket', r.get('outputPath'))
        answered = [m.get('id') for m in c.pending if m.get('id') in ids + more + cwds]
        t.eq(answered, [], 'the calls on the bucket are still waiting (its server is stopped)')
    finally:
        os.kill(x.s3.node.pid, signal.SIGCONT)
    r = c.next(lambda m: m.get('id') == ids[0] and 'method' not in m, 240)['result']
    t.eq(r.get('structuredContent', {}).get('content'), 'from the bucket\n', 'the read answers once the bucket does', r)
    r = c.next(lambda m: m.get('id') == ids[1] and 'method' not in m, 240)['result']
    t.eq(sorted(f['name'] for f in r.get('structuredContent', {}).get('files', [])), ['cold.txt', 'cold2.txt', 'sub', 'work'],
         'so does the listing', r)
    r = c.next(lambda m: m.get('id') == ids[2] and 'method' not in m, 240)
    t.eq(r.get('result', {}).get('contents', [{}])[0].get('text'), 'from the bucket\n', 'and the resource read', r)
    r = c.next(lambda m: m.get('id') == cwds[0] and 'method' not in m, 240)['result']['structuredContent']
    t.eq(r.get('stdout'), '/data/work\n', 'a command in a directory of the bucket runs there once it answers', r)
    r = c.next(lambda m: m.get('id') == cwds[1] and 'method' not in m, 240)['result']['structuredContent']
    t.ok(r.get('exitCode') == 1 and 'cwd /data/nowhere' in r.get('stderr', ''),
         'one in a directory that is not there fails, saying so', r)
    waited = [c.next(lambda m: m.get('id') in more and 'method' not in m, 240) for _ in range(62)]
    t.eq({r['result']['structuredContent'].get('exists') for r in waited}, {True}, 'and the 62 calls that waited', waited[:1])
    # destroyed while a call waits on the bucket and more wait behind it
    os.kill(x.s3.node.pid, signal.SIGSTOP)
    try:
        ids = [next(c.ids) for _ in range(4)]
        c.send({'jsonrpc': '2.0', 'id': ids[0], 'method': 'tools/call',
                'params': {'name': 'readFile', 'arguments': {'sandboxId': 'hung', 'path': '/data/sub/deep.txt'}}})
        for i in ids[1:]:
            c.send({'jsonrpc': '2.0', 'id': i, 'method': 'tools/call',
                    'params': {'name': 'exists', 'arguments': {'sandboxId': 'hung', 'path': '/workspace'}}})
        c.sh('true', sandbox='b1', wait=20)  # the daemon has taken them all
        t.eq([m.get('id') for m in c.pending if m.get('id') in ids], [], 'a read waits on the stopped bucket again')
        c.ok('destroySandbox', {'sandboxId': 'hung'}, 20)
        t.ok(True, 'a sandbox whose file call waits on a stopped bucket is destroyed at once')
        gone_ = [c.next(lambda m: m.get('id') in ids[1:] and 'method' not in m, 20) for _ in range(3)]
        t.eq([r['result']['structuredContent']['error']['code'] for r in gone_], ['SANDBOX_NOT_FOUND'] * 3,
             'the calls that waited behind it are answered: the sandbox is gone', gone_[:1])
        r = c.next(lambda m: m.get('id') == ids[0] and 'method' not in m, 20)['result']
        t.eq(r['structuredContent'].get('error', {}).get('code'), 'SANDBOX_NOT_FOUND',
             'and so is the call that waited on the bucket, with the bucket still stopped', r)
    finally:
        os.kill(x.s3.node.pid, signal.SIGCONT)


def test_more_files_than_fds(t, x):
    """A daemon, and so a bucket server, that may hold 1,024 files open
    takes 2,000 files into a mount and reads each of them back: the cache
    files of files nothing uses are closed, and opened again when wanted."""
    env = Env(nofile=1024)
    try:
        env.env['SBX_CONFIG'] = x.env.env['SBX_CONFIG']
        c = env.mcp(['--sandbox', 'fds'])
        c.initialize()
        c.ok('mountBucket', {'bucket': 'test', 'mountPath': '/data', 'prefix': 'fds', 'profile': 'loopback'})
        r = c.sh('cd /data && for i in $(seq 2000); do echo file$i > f$i || exit 1; done; echo written; '
                 'cat $(seq -f f%g 2000) | md5sum', wait=300)
        want = hashlib.md5(''.join('file%d\n' % i for i in range(1, 2001)).encode()).hexdigest()
        t.eq(r['stdout'], 'written\n%s  -\n' % want, '2,000 files written and read back through a server with 1,024 fds',
             r)
        wait_until(lambda: len(x.s3.stored_keys('test', 'fds/')) >= 2000, 120, 'the 2,000 objects')
        t.eq(x.s3.get('test', 'fds/f1234'), b'file1234\n', 'and every one of them reaches the bucket')
    finally:
        env.close()


def test_big_directory(t, x):
    """One directory of 3,000 names made, removed and renamed in: every
    listing says what is there, as it is, and as a fresh mount reads it
    from the bucket."""
    c = x.c
    x.mount('/big', prefix='bigdir')
    c.sh('cd /big && for i in $(seq 3000); do : > f$i; done; mkdir d1 d2; '
         'for i in $(seq 3 3 3000); do rm f$i; done; for i in $(seq 1 10 3000); do [ -e f$i ] && mv f$i g$i; done; '
         'rm g11; mv g31 d1/; rmdir d2; : > f3; sync', wait=300)
    want = set('f%d' % i for i in range(1, 3001) if i % 3) - set('f%d' % i for i in range(1, 3001, 10))
    want |= set('g%d' % i for i in range(1, 3001, 10) if i % 3) | {'d1', 'f3'}
    want -= {'g11', 'g31'}
    got = set(c.sh('ls -A /big')['stdout'].split())
    t.eq(sorted(got ^ want), [], 'the listing has every name made, none removed or renamed away')
    t.eq(c.sh('ls /big/d1; [ -e /big/f6 ] || echo no-f6; [ -e /big/g41 ] && echo g41')['stdout'], 'g31\nno-f6\ng41\n',
         'lookups agree with it')
    c.ok('unmountBucket', {'mountPath': '/big'})
    x.mount('/big2', prefix='bigdir')
    got = set(c.sh('ls -A /big2')['stdout'].split())
    t.eq(sorted(got ^ want), [], 'and a fresh mount lists the same from the bucket')


def test_dir_handles_bounded(t, x):
    """A directory held open many times over: each open one holds a copy
    of the listing, so past a bound opendir is ENOMEM rather than the
    host's memory going (the server's RSS stays bounded), and once they
    are closed it opens again."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'dirh'})
    x.mount('/dh', sandbox='dirh', prefix='dirh')
    c.sh('mkdir /dh/d && cd /dh/d && for i in $(seq 2000); do : > "$(printf "%0200d" $i)"; done', sandbox='dirh', wait=300)
    prog = ('import errno, os, time\nfds = []\nerr = None\nfor i in range(400):\n    try:\n'
            '        fds.append(os.open("/dh/d", os.O_RDONLY | os.O_DIRECTORY))\n    except OSError as e:\n'
            '        err = e.errno\n        break\nprint("result %d %s" % (len(fds), err), flush=True)\n'
            'open("/workspace/held", "w").close()\ntime.sleep(600)\n')
    out = hold_py(x, 'dirh', 'dh', prog, 'result')
    n, err = (out.split('result', 1)[1].split() + ['', ''])[:2]
    rss = max(int(open('/proc/%d/status' % p).read().split('VmRSS:')[1].split()[0]) for p in bucketfs_pids(x))
    t.ok(err == str(errno.ENOMEM) and 100 < int(n) < 400 and rss < 256 * 1024,
         'opendir past the bound is ENOMEM, and the bucket server\'s memory stays bounded', (n, err, '%d KiB' % rss))
    c.ok('killProcess', {'sandboxId': 'dirh', 'processId': 'dh'})
    r = c.sh('ls /dh/d | wc -l; ls /dh/d | sed "s/^0*//" | sort -n | awk \'$1 != NR {print "missing", NR; exit}\'; ls -d /dh/d/$(printf "%0200d" 1) 2>&1 | tail -c 30', sandbox='dirh')
    t.eq(r['stdout'].split('\n')[0], '2000', 'closed, the directory lists again', r)
    c.ok('destroySandbox', {'sandboxId': 'dirh'})


def test_cold_directory(t, x):
    """A fresh mount (empty cache) going through a directory in order, as
    tar, cp -r and grep -r do: small files come ahead of their lookups,
    each with its data and metadata, big ones as before."""
    c = x.c
    x.mount('/cold', prefix='cold')
    c.sh('cd /cold && for i in $(seq 40); do head -c $((i * 997)) /dev/urandom > f$i; chmod 6$((i % 8))0 f$i; '
         'touch -d @$((1000000000 + i)) f$i; done && head -c 3000000 /dev/urandom > f20 && ln -s f1 link && '
         'chown 1000:1000 f7 && mkdir sub && echo in > sub/x && sync')
    listing = 'cd /cold && stat -c "%n %a %s %Y %u" f* sub/x && readlink link && sha256sum f* sub/x'
    want = c.sh(listing)['stdout']
    r, _ = c.call('unmountBucket', {'mountPath': '/cold'})
    t.ok('every change is in the bucket' in r['content'][0]['text'], 'written, then unmounted', r)
    x.mount('/cold', prefix='cold')
    got = c.sh(listing)['stdout']
    t.eq(got, want, 'mounted again, every file reads back with its content, mode, size, mtime and owner, '
         'and the symlink with its target')
    # fetched ahead, then deleted in the bucket by someone else: gone once the listing says so
    x.mount('/cold2', prefix='cold')
    c.sh('cat /cold2/f1 >/dev/null')
    x.s3.delete('test', 'cold/f3')
    t.ok(wait_until(lambda: c.sh('[ -e /cold2/f3 ] || echo gone')['stdout'] == 'gone\n', 30, 'f3 to go'),
         'a file fetched ahead and then deleted in the bucket goes from the mount')
    t.eq(c.sh('cat /cold2/f2 | sha256sum | cut -d" " -f1')['stdout'].strip(),
         [l.split()[0] for l in want.splitlines() if l.endswith(' f2')][0], 'its neighbours stay readable')


def listings(x, since, prefix):
    """The listings of the bucket under prefix sbx asked for since check
    number since: their queries."""
    return [ch['query'] for ch in x.s3.checks()[since:]
            if ch['method'] == 'GET' and 'list-type=2' in ch['query'] and 'prefix=' + prefix in ch['query']]


def test_tree_listing(t, x):
    """A walk of a tree whose directories' listings are gone (the kernel
    forgot them) gets every directory's listing from one listing of the
    whole tree: the names the bucket has, other clients' changes in it
    (a new file deep down, a file removed, a directory that is only a
    marker, a name that is both a file and a directory), in a handful of requests instead of one per directory. A tree
    with more directories than one such listing takes is walked the same,
    directory by directory."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'tree'})
    sh = lambda cmd, **kw: c.sh(cmd, sandbox='tree', **kw)
    x.mount('/tr', sandbox='tree', prefix='tree')
    sh('cd /tr && for d in $(seq 10); do for s in 1 2 3; do mkdir -p d$d/s$s && '
         'for f in 1 2 3; do echo $d$s$f > d$d/s$s/f$f; done; done; done && sync', wait=300)
    x.s3.put('test', 'tree/d3/s1/new', b'from another client')
    x.s3.delete('test', 'tree/d4/s2/f1')
    x.s3.aws('s3api', 'put-object', '--bucket', 'test', '--key', 'tree/d5/marker/')
    # (no marker for deep/ or deep/er/: s3rver's listing of d6/s1/ with a delimiter misses deep/, S3's has it)
    x.s3.put('test', 'tree/d6/s1/deep/er/x', b'deep')
    x.s3.put('test', 'tree/d7/both', b'a file')
    x.s3.put('test', 'tree/d7/both/inside', b'and a directory')
    want = set(['/tr'] + ['/tr/d%d' % d for d in range(1, 11)] + ['/tr/d%d/s%d' % (d, s) for d in range(1, 11) for s in (1, 2, 3)]
               + ['/tr/d%d/s%d/f%d' % (d, s, f) for d in range(1, 11) for s in (1, 2, 3) for f in (1, 2, 3)])
    want |= {'/tr/d3/s1/new', '/tr/d5/marker', '/tr/d6/s1/deep', '/tr/d6/s1/deep/er', '/tr/d6/s1/deep/er/x',
             '/tr/d7/both', '/tr/d7/both/inside'}
    want -= {'/tr/d4/s2/f1'}
    walk = 'find /tr | sort; cat /tr/d3/s1/new /tr/d6/s1/deep/er/x /tr/d7/both/inside; echo; [ -d /tr/d7/both ] && echo dir'
    last = {}

    def walked():  # until the others' changes show: a listing is trusted 5 s
        subprocess.run(['sh', '-c', 'echo 2 > /proc/sys/vm/drop_caches'], check=True)
        before = len(x.s3.checks())
        last['out'] = sh(walk)['stdout'].split('\n')
        last['asked'] = listings(x, before, 'tree%2F')
        return set(l for l in last['out'] if l.startswith('/tr')) == want
    wait_until(walked, 30, 'a walk to find the bucket\'s tree')
    t.ok(True, 'a walk after the kernel forgot the tree finds what the bucket has, others\' changes deep down included')
    t.eq([l for l in last['out'] if l and not l.startswith('/tr')], ['from another clientdeepand a directory', 'dir'],
         'their contents read, and a name that is a file and a directory is the directory')
    t.ok(len(last['asked']) <= 4, 'the 45 directories took at most 4 listings (one per directory before)', last['asked'])
    x.mount('/tr2', sandbox='tree', prefix='tree')
    got = set(l.replace('/tr2', '/tr', 1) for l in sh('find /tr2 | sort')['stdout'].split())
    t.eq(sorted(got ^ want), [], 'a fresh mount walks the same tree')
    # more directories than one listing of a tree takes (512): listed one by one, the same names
    sh('mkdir -p /tr/many && cd /tr/many && for i in $(seq 520); do mkdir d$i; done && sync . d*', wait=300)
    x.s3.put('test', 'tree/many/d77/late', b'late')
    subprocess.run(['sh', '-c', 'echo 2 > /proc/sys/vm/drop_caches'], check=True)
    t.eq(sh('find /tr/many -type d | wc -l')['stdout'], '521\n', 'a tree of 520 directories walks whole')
    wait_until(lambda: sh('find /tr/many -type f; cat /tr/many/d77/late')['stdout'] == '/tr/many/d77/late\nlate', 30,
               'another client\'s file in it to show')
    t.ok(True, 'and another client\'s file in it shows')
    c.ok('destroySandbox', {'sandboxId': 'tree'})


class Hostile:
    """An S3 endpoint on loopback that lies: listings that never end
    ('empty pages', 'same token'), a key that climbs out of its directory
    ('dotdot': p/A/ holds p/A/x/../../../victim/f, and p/A/ok), objects
    listed as 10 bytes that are 200 MB when read ('big body'), directories
    d0/ to d9/ of 200,000 names of 240 bytes each ('huge'). What it was
    asked is in .asked (method, path, copy source)."""

    def __init__(self, kind):
        import http.server
        import threading
        hostile = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = 'HTTP/1.1'
            disable_nagle_algorithm = True

            def answer(self, code, body=b'', length=None):
                self.send_response(code)
                self.send_header('Content-Length', str(len(body) if length is None else length))
                self.send_header('ETag', '"e10"')
                self.end_headers()
                if self.command != 'HEAD':
                    self.wfile.write(body)

            def listing(self, keys=(), prefixes=(), token=None):
                x = ''.join('<Contents><Key>%s</Key><Size>10</Size><LastModified>2024-01-01T00:00:00.000Z</LastModified>'
                            '<ETag>"e10"</ETag></Contents>' % k for k in keys)
                x += ''.join('<CommonPrefixes><Prefix>%s</Prefix></CommonPrefixes>' % p for p in prefixes)
                x += '<IsTruncated>%s</IsTruncated>' % ('true' if token else 'false')
                if token:
                    x += '<NextContinuationToken>%s</NextContinuationToken>' % token
                self.answer(200, ('<?xml version="1.0" encoding="UTF-8"?><ListBucketResult>%s</ListBucketResult>' % x).encode())

            def any(self):
                from urllib.parse import parse_qs, urlparse
                u = urlparse(self.path)
                q = parse_qs(u.query, keep_blank_values=True)
                hostile.asked.append((self.command, u.path, self.headers.get('x-amz-copy-source', '')))
                n = int(self.headers.get('Content-Length') or 0)
                if n:
                    self.rfile.read(n)
                pre, delim = q.get('prefix', [''])[0], 'delimiter' in q
                if 'list-type' in q:
                    hostile.pages += 1
                    if kind == 'empty pages':
                        return self.listing(token='p%d' % hostile.pages)
                    if kind == 'same token':
                        return self.listing(token='same')
                    if kind == 'dotdot':
                        if delim and pre == 'p/':
                            return self.listing(prefixes=['p/A/'])
                        if pre == 'p/A/':
                            return self.listing(keys=['p/A/ok'] + ([] if delim else ['p/A/x/../../../victim/f']),
                                                prefixes=['p/A/x/'] if delim else [])
                        return self.listing()
                    if kind == 'big body' and pre == '':
                        return self.listing(keys=['f%d' % i for i in range(1, 6)])
                    if kind == 'huge' and pre == '':
                        return self.listing(prefixes=['d%d/' % i for i in range(10)])
                    if kind == 'huge' and delim:
                        page = int(q.get('continuation-token', ['0'])[0])
                        names = ['%sn%06d%s' % (pre, page * 1000 + j, 'x' * 233) for j in range(1000)]
                        return self.listing(keys=names, token=str(page + 1) if page < 199 else None)
                    return self.listing()
                if kind == 'big body' and self.command == 'GET':
                    self.send_response(200)
                    self.send_header('Content-Length', str(200 << 20))
                    self.send_header('ETag', '"e10"')
                    self.end_headers()
                    try:
                        for _ in range(200):
                            self.wfile.write(b'\0' * (1 << 20))
                    except OSError:
                        pass
                    return
                if self.command == 'HEAD' and kind == 'big body':
                    return self.answer(200, length=10)
                if self.command == 'HEAD':
                    return self.answer(404 if u.path.rstrip('/').count('/') > 1 else 200)
                if self.command == 'GET':
                    return self.answer(404, b'<Error><Code>NoSuchKey</Code></Error>')
                if self.command == 'PUT' and self.headers.get('x-amz-copy-source'):
                    return self.answer(200, b'<CopyObjectResult><ETag>"e10"</ETag></CopyObjectResult>')
                return self.answer(204 if self.command == 'DELETE' else 200)

            do_GET = do_HEAD = do_PUT = do_DELETE = do_POST = any

            def log_message(self, *a):
                pass
        self.asked, self.pages = [], 0
        self.server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = 'http://127.0.0.1:%d' % self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_listing_that_never_ends(t, x):
    """A bucket server whose listings never end (every page says there is
    more, with nothing in it, or with the same token again): the listing
    fails with an error instead of asking for pages forever, and the
    sandbox goes on."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'endless'})
    for kind in ('empty pages', 'same token'):
        srv = Hostile(kind)
        try:
            res, _ = c.call('mountBucket', {'sandboxId': 'endless', 'bucket': 'test', 'mountPath': '/e',
                                            'endpoint': srv.endpoint,
                                            'credentials': {'accessKeyId': AK, 'secretAccessKey': SK}}, 120)
            err = res.get('structuredContent', {}).get('error')
            if not err:
                r = c.sh('ls /e; echo status $?', sandbox='endless', wait=120)
                t.ok('status 2' in r['stdout'] and 'Input/output error' in r['stderr'],
                     '%s: ls of the mount fails with EIO' % kind, r)
                c.ok('unmountBucket', {'sandboxId': 'endless', 'mountPath': '/e'}, 120)
            else:
                t.ok(err['code'] == 'MOUNT_FAILED', '%s: the mount fails, saying so' % kind, err)
            t.ok(srv.pages <= 1100, '%s: after a bounded number of pages' % kind, srv.pages)
            t.eq(c.sh('echo on', sandbox='endless')['stdout'], 'on\n', '%s: and the sandbox goes on' % kind)
        finally:
            srv.close()
    c.ok('destroySandbox', {'sandboxId': 'endless'})


def test_hostile_keys_and_bodies(t, x):
    """What a bucket's server (or another client of the bucket) says cannot
    make sbx reach past the mount: a key with dots that climbs out of its
    directory is not carried along by a rename (the request for it would
    have named another key once curl resolved the dots), and an object
    listed as 10 bytes that comes as 200 MB is refused, not written into
    the host's cache past the sandbox's disk."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'hostile', 'limits': {'diskMB': 64}})
    srv = Hostile('dotdot')
    try:
        x.mount('/h', sandbox='hostile', endpoint=srv.endpoint, prefix='p')
        r = c.sh('ls /h/A; mv /h/A /h/B; echo moved $?', sandbox='hostile', wait=60)
        t.ok('moved 0' in r['stdout'], 'the directory is renamed', r)
        wrote = [a for a in srv.asked if a[0] in ('PUT', 'DELETE', 'POST')]
        t.ok(wrote and all(p.startswith('/test/p/') and '..' not in p and (not src or src.startswith('/test/p/'))
                           for _, p, src in wrote),
             'every request that writes or deletes names a key under the mount\'s prefix, without dots', wrote)
        t.ok(not any('victim' in p or 'victim' in src for _, p, src in srv.asked), 'the climbing key is never asked for')
        c.ok('unmountBucket', {'sandboxId': 'hostile', 'mountPath': '/h'}, 60)
    finally:
        srv.close()
    srv = Hostile('big body')
    try:
        x.mount('/h', sandbox='hostile', endpoint=srv.endpoint)
        r = c.sh('cat /h/f1 | wc -c; ls /h | wc -l', sandbox='hostile', wait=120)
        t.eq(r['stdout'].split()[-1:], ['5'], 'the listing is read', r)
        t.ok('Input/output error' in r['stderr'], 'a read of an object bigger than listed fails with EIO', r)
        cache = os.path.join(x.env.state, 'bucket-cache')
        used = int(subprocess.run(['du', '-sbx', cache], capture_output=True, text=True).stdout.split()[0])
        t.ok(used < 64 << 20, 'and the host\'s cache holds less than the sandbox\'s 64 MB disk', used)
        c.ok('unmountBucket', {'sandboxId': 'hostile', 'mountPath': '/h'}, 60)
    finally:
        srv.close()
    c.ok('destroySandbox', {'sandboxId': 'hostile'})


def test_listings_bounded(t, x):
    """Directories of 200,000 names each, listed one after the other (a
    walk of a bucket of millions of keys, or a server that lists without
    end): the mount's listings take at most 128 MiB together, the least
    recently used going, so its server is not killed for its memory, and
    each directory still lists whole."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'huge'})
    srv = Hostile('huge')
    try:
        x.mount('/h', sandbox='huge', endpoint=srv.endpoint)
        counts, peak = [], 0
        for i in range(6):
            counts.append(c.sh('ls /h/d%d | wc -l' % i, sandbox='huge', wait=300)['stdout'].strip())
            for p in bucketfs_pids(x):
                peak = max(peak, int(open('/proc/%d/status' % p).read().split('VmRSS:')[1].split()[0]))
        t.eq(counts, ['200000'] * 6, 'each directory of 200,000 names lists whole')
        t.ok(peak < 300 * 1024, 'the bucket servers\' memory stays bounded (about 55 MB of listings a directory)',
             '%d KiB' % peak)
        t.eq(c.sh('ls /h/d0 | wc -l', sandbox='huge', wait=300)['stdout'], '200000\n', 'and the first lists again')
        c.ok('unmountBucket', {'sandboxId': 'huge', 'mountPath': '/h'}, 60)
    finally:
        srv.close()
    c.ok('destroySandbox', {'sandboxId': 'huge'})


def test_destroy_cleans_up(t, x):
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'gone'})
    x.mount('/data', sandbox='gone', prefix='gone')
    c.sh('echo last > /data/last', sandbox='gone')
    c.ok('destroySandbox', {'sandboxId': 'gone'})
    x.s3.wait_object('test', 'gone/last', b'last\n')
    t.ok(True, 'a destroyed sandbox\'s last writes still reach the bucket')
    wait_until(lambda: not os.path.exists(os.path.join(x.env.state, 'bucket-cache', 'gone')), 30,
               'its cache and credentials to be removed')
    t.ok(True, 'then its cache and its credentials are removed from the state dir')


if __name__ == '__main__':
    sys.exit(run_tests([test_mount_write_read, test_names_not_utf8, test_object_grows_while_open, test_signatures, test_fsync_means_in_bucket, test_secrets_never_shown,
                        test_errors, test_read_only, test_server_cpu_bounded, test_fsyncs_hold_no_thread, test_hung_bucket_stalls_nobody, test_local_bucket, test_local_bucket_prefix, test_local_bucket_quota, test_reset_keeps_bucket, test_no_reset_while_checked, test_restart_kill9, test_restart_stop,
                        test_crash_of_bucket_server, test_daemon_killed_during_writes, test_outage, test_outage_names_bounded, test_removed_stays_removed, test_open_unlinked_files, test_crash_during_outage, test_syscall_suite,
                        test_view_shows_bucket, test_view_stalled_endpoint, test_unmount, test_cache_cap, test_forgotten_files_stay_cached, test_mounts_by_identity, test_mounts_bounded, test_more_files_than_fds, test_big_directory, test_dir_handles_bounded, test_cold_directory, test_tree_listing, test_listing_that_never_ends,
                        test_hostile_keys_and_bodies, test_listings_bounded,
                        test_destroy_cleans_up], Ctx))
