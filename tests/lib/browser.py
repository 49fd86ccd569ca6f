"""Headless Chromium (Debian's `chromium`) driven over the DevTools protocol
on a pipe (--remote-debugging-pipe): no npm package, no debugging port.
Every wait is bounded by a deadline."""
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time


def chromium_path():
    for name in ('chromium', 'chromium-browser', 'google-chrome'):
        p = shutil.which(name)
        if p:
            return p
    return None


class Browser:
    def __init__(self, timeout=60):
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix='sbx-chromium-')
        to_child_r, self.w = os.pipe()
        self.r, from_child_w = os.pipe()

        def fds():  # the protocol is on fd 3 (commands) and fd 4 (answers)
            a, b = os.dup(to_child_r), os.dup(from_child_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [chromium_path(), '--headless=new', '--disable-gpu', '--remote-debugging-pipe', '--no-first-run',
                '--no-default-browser-check', '--user-data-dir=' + self.profile, 'about:blank']
        if os.geteuid() == 0:
            args.insert(1, '--no-sandbox')  # Chromium refuses to run as root with its own sandbox
        # its temporary files in its profile, which close() removes (killed,
        # it leaves an org.chromium.Chromium.* directory in TMPDIR), and a
        # process group of its own, so that its helpers die with it
        tmp = os.path.join(self.profile, 'tmp')
        os.mkdir(tmp)
        self.proc = subprocess.Popen(args, preexec_fn=fds, close_fds=False, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env=dict(os.environ, TMPDIR=tmp), start_new_session=True)
        os.close(to_child_r)
        os.close(from_child_w)
        self.buf = b''
        self.n = 0
        self.events = []

    def close(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        for fd in (self.r, self.w):
            os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)

    def _recv(self, deadline):
        while b'\0' not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                raise TimeoutError('chromium did not answer in time')
            d = os.read(self.r, 1 << 16)
            if not d:
                raise EOFError('chromium exited: %s' % self.proc.stderr.read()[-2000:].decode(errors='replace'))
            self.buf += d
        m, _, self.buf = self.buf.partition(b'\0')
        return json.loads(m)

    def call(self, method, params=None, session=None):
        self.n += 1
        msg = {'id': self.n, 'method': method, 'params': params or {}}
        if session:
            msg['sessionId'] = session
        os.write(self.w, json.dumps(msg).encode() + b'\0')
        deadline = time.monotonic() + self.timeout
        while True:
            m = self._recv(deadline)
            if m.get('id') == self.n:
                if 'error' in m:
                    raise RuntimeError('%s: %s' % (method, m['error']))
                return m['result']
            self.events.append(m)

    def event(self, method, session=None):
        deadline = time.monotonic() + self.timeout
        while True:
            for i, m in enumerate(self.events):
                if m.get('method') == method and (not session or m.get('sessionId') == session):
                    return self.events.pop(i)
            self.events.append(self._recv(deadline))

    def open(self, url):
        """A new tab at url, once its load event fired; returns its session."""
        target = self.call('Target.createTarget', {'url': 'about:blank'})['targetId']
        s = self.call('Target.attachToTarget', {'targetId': target, 'flatten': True})['sessionId']
        self.call('Page.enable', session=s)
        self.call('Page.navigate', {'url': url}, session=s)
        self.event('Page.loadEventFired', s)
        return s

    def evaluate(self, session, expression):
        """The value of a JavaScript expression in the page (promises awaited)."""
        r = self.call('Runtime.evaluate', {'expression': expression, 'awaitPromise': True, 'returnByValue': True},
                      session=session)
        if 'exceptionDetails' in r:
            raise RuntimeError('in the page: %s' % r['exceptionDetails'])
        return r['result'].get('value')
