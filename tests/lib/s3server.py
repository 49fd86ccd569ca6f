"""A real S3 server on loopback for the bucket tests: npm s3rver with a
directory of its own, behind a proxy that checks every request's SigV4
signature with botocore, and Debian's awscli to look at what is stored."""
import atexit
import json
import os
import signal
import subprocess
import threading

from sbxtest import Fail, free_port, wait_until

HERE = os.path.join(os.path.dirname(__file__), '..', 's3')
S3RVER = os.path.join(HERE, 'node_modules', 's3rver', 'bin', 's3rver.js')
PROXY = os.path.join(HERE, 'sigv4proxy.py')
SYSTEM_PYTHON = '/usr/bin/python3'  # Debian's, with python3-botocore
AK, SK = 'S3RVER', 'S3RVER'


def wait_for_line(path, want, proc, timeout=30):
    """Waits (bounded) until the log file of a server we started has a line
    containing want; its output goes to a file, so it never blocks on a
    full pipe nobody reads."""
    def there():
        if proc.poll() is not None:
            raise Fail('%s ended: %s' % (proc.args[:3], open(path, errors='replace').read()[-800:]))
        with open(path, errors='replace') as f:
            return want in f.read()
    wait_until(there, timeout, '%r from %s' % (want, proc.args[:3]))


class S3:
    def __init__(self, root, buckets=('test',)):
        self.dir = os.path.join(root, 's3data')
        os.makedirs(self.dir, exist_ok=True)
        self.buckets = buckets
        self.port = free_port()
        self.proxy_port = free_port()
        self.log = os.path.join(root, 'sigv4.log')
        self.node = None
        self.lock = threading.RLock()
        self.starts = 0
        self.crashes = []  # what s3rver said when it ended on its own
        self.proxy = None
        # also at a SIGTERM or SIGINT (a test's time running out): Env's
        # handler exits through atexit
        atexit.register(self.close)
        self.start()
        out = os.path.join(root, 'sigv4proxy.out')
        with open(out, 'w') as f:
            self.proxy = subprocess.Popen([SYSTEM_PYTHON, PROXY, str(self.proxy_port), str(self.port), AK, SK, self.log],
                                          stdout=f, stderr=subprocess.STDOUT)
        wait_for_line(out, 'ready', self.proxy)

    @property
    def endpoint(self):
        """Where sbx goes: through the signature check."""
        return 'http://127.0.0.1:%d' % self.proxy_port

    @property
    def direct(self):
        return 'http://127.0.0.1:%d' % self.port

    def start(self):
        """Starts s3rver on its port, and a thread that waits for it to end:
        if it ends on its own (it has crashed under load, an unhandled
        error of its store), what it said is kept for the test's log and
        it is started again, as an outage that ends: sbx's retries carry
        on, and one crash of the test's server does not fail every test
        after it."""
        args = ['node', '--openssl-legacy-provider', S3RVER, '-d', self.dir, '-a', '127.0.0.1', '-p', str(self.port),
                '--silent']
        for b in self.buckets:
            args += ['--configure-bucket', b]
        with self.lock:
            self.starts += 1
            out = '%s.out.%d' % (self.dir, self.starts)
            with open(out, 'w') as f:
                node = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            self.node = node
            wait_for_line(out, 'listening', node)
        threading.Thread(target=self._watch, args=(node, out), daemon=True).start()

    def _watch(self, node, out):
        node.wait()
        with self.lock:
            if self.node is not node:
                return  # stopped on purpose
            with open(out, errors='replace') as f:
                said = f.read()[-1500:]
            self.crashes.append('s3rver ended by itself (exit status %s); it said: %s' % (node.returncode, said))
            self.node = None
            try:
                self.start()
            except Exception as e:  # the next request fails and says so
                self.crashes.append('and could not be started again: %s' % e)

    def take_crashes(self):
        with self.lock:
            out, self.crashes = self.crashes, []
        return out

    def stop(self):
        with self.lock:
            node, self.node = self.node, None
        if node:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()

    def close(self):
        self.stop()
        if self.proxy:
            self.proxy.kill()
            self.proxy.wait()
            self.proxy = None

    def aws(self, *args, input=None, check=True):
        """Debian's awscli, straight to the server."""
        env = dict(os.environ, AWS_ACCESS_KEY_ID=AK, AWS_SECRET_ACCESS_KEY=SK, AWS_DEFAULT_REGION='us-east-1',
                   AWS_EC2_METADATA_DISABLED='true', HOME=self.dir + '-home')
        env.pop('PYTHONPATH', None)
        r = subprocess.run(['/usr/bin/aws', '--endpoint-url', self.direct] + list(args), capture_output=True,
                           input=input, env=env, timeout=120)
        if check and r.returncode != 0:
            raise Fail('aws %s: %s' % (' '.join(args), r.stderr.decode(errors='replace')[-800:]))
        return r

    def _path(self, bucket, key, resource):
        parts = key.split('/')
        return os.path.join(self.dir, bucket, *parts[:-1], '%s._S3rver_%s' % (parts[-1], resource))

    def stored(self, bucket, key):
        """An object's bytes as s3rver keeps them on disk (metadata written
        last, so an object half stored reads as none), or None: cheap
        enough to poll, where awscli costs a second an invocation here."""
        if not os.path.exists(self._path(bucket, key, 'metadata.json')):
            return None
        try:
            with open(self._path(bucket, key, 'object'), 'rb') as f:
                return f.read()
        except OSError:
            return None

    def stored_keys(self, bucket, prefix=''):
        out = []
        top = os.path.join(self.dir, bucket)
        for d, _, files in os.walk(top):
            for f in files:
                if f.endswith('._S3rver_object') and os.path.exists(os.path.join(d, f[:-6] + 'metadata.json')):
                    key = os.path.relpath(os.path.join(d, f[:-len('._S3rver_object')]), top)
                    if f == '._S3rver_object':
                        key = os.path.relpath(d, top) + '/'
                    if key.startswith(prefix):
                        out.append(key)
        return sorted(out)

    def get(self, bucket, key):
        """An object's bytes through awscli, or None when there is none."""
        r = self.aws('s3', 'cp', 's3://%s/%s' % (bucket, key), '-', check=False)
        return r.stdout if r.returncode == 0 else None

    def head(self, bucket, key):
        r = self.aws('s3api', 'head-object', '--bucket', bucket, '--key', key, check=False)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def keys(self, bucket, prefix=''):
        r = self.aws('s3api', 'list-objects-v2', '--bucket', bucket, '--prefix', prefix)
        out = json.loads(r.stdout or b'{}')
        return sorted(o['Key'] for o in out.get('Contents', []))

    def sync(self, local, url):
        self.aws('s3', 'sync', '--only-show-errors', local, url)

    def put(self, bucket, key, data):
        self.aws('s3', 'cp', '-', 's3://%s/%s' % (bucket, key), input=data)

    def delete(self, bucket, key):
        self.aws('s3', 'rm', 's3://%s/%s' % (bucket, key))

    def checks(self):
        """The proxy's verdicts, one per request sbx sent."""
        try:
            with open(self.log) as f:
                return [json.loads(line) for line in f if line.strip()]
        except OSError:
            return []

    def wait_object(self, bucket, key, data, timeout=30, aws=True):
        """Waits (bounded, on the store) for the object to hold data, then
        reads it once more through awscli: what another S3 client sees."""
        try:
            wait_until(lambda: self.stored(bucket, key) == data, timeout, 's3://%s/%s' % (bucket, key))
        except Fail:
            got = self.stored(bucket, key)
            raise Fail('s3://%s/%s does not hold %r after %ds: it holds %r; the bucket has %s' % (
                bucket, key, data[:40], timeout, got[:40] if got is not None else None,
                self.stored_keys(bucket, key.rsplit('/', 1)[0] + '/' if '/' in key else '')[:30]))
        got = self.get(bucket, key) if aws else data
        if got != data:
            raise Fail('s3://%s/%s: the store holds it but awscli reads %r' % (bucket, key, (got or b'')[:40]))
