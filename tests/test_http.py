"""The Streamable HTTP transport: bearer token, loopback only, Origin check,
JSON and SSE replies, both eras, cancellation on disconnect, and the official
conformance suite's scenarios that need no test tools of their own."""
import http.client
import json
import os
import re
import socket
import subprocess
import sys

from sbxtest import SBX, Env, Fail, free_port, run_tests, wait_until

HERE = os.path.dirname(os.path.abspath(__file__))
SDK = os.path.join(HERE, 'sdk')
# scenarios that exercise the server itself rather than fixtures (test tools,
# prompts, resources) that the suite expects a server to define for it
CONFORMANCE = ['server-initialize', 'ping', 'logging-set-level', 'tools-list', 'resources-list']
M = {'io.modelcontextprotocol/protocolVersion': '2026-07-28', 'io.modelcontextprotocol/clientCapabilities': {}}


class Ctx:
    def __init__(self):
        self.env = Env()
        self.port = free_port()
        self.daemon = subprocess.Popen([SBX, 'daemon', '--http', '127.0.0.1:%d' % self.port], env=self.env.env,
                                       cwd='/', stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        tok = os.path.join(self.env.state, 'http-token')
        # the pid file is written once both the socket and HTTP listen
        wait_until(lambda: os.path.exists(os.path.join(self.env.runtime, 'sbx.pid')), 20, 'the daemon to listen')
        self.token = open(tok).read().strip()

    def post(self, body, headers=None, token=True, raw=None):
        c = http.client.HTTPConnection('127.0.0.1', self.port, timeout=30)
        h = {'Content-Type': 'application/json', 'Accept': 'application/json, text/event-stream'}
        if token:
            h['Authorization'] = 'Bearer ' + (token if isinstance(token, str) else self.token)
        h.update(headers or {})
        c.request('POST', '/mcp', body=raw if raw is not None else json.dumps(body), headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r, data

    def close(self):
        self.daemon.terminate()
        try:
            self.daemon.wait(20)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
        self.env.close()


def test_auth(t, x):
    r, _ = x.post({'jsonrpc': '2.0', 'id': 1, 'method': 'ping'}, token=False)
    t.ok(r.status == 401 and r.getheader('WWW-Authenticate') == 'Bearer', 'no token: 401 with WWW-Authenticate')
    r, _ = x.post({'jsonrpc': '2.0', 'id': 1, 'method': 'ping'}, token='x' * 48)
    t.eq(r.status, 401, 'wrong token: 401')
    st = os.stat(os.path.join(x.env.state, 'http-token'))
    t.eq(oct(st.st_mode & 0o777), oct(0o600), 'the token file is mode 0600')
    ping = {'jsonrpc': '2.0', 'id': 1, 'method': 'ping'}
    for origin in ('http://evil.example', 'http://localhost.evil.example', 'http://127.0.0.1.evil.example:%d' % x.port,
                   'http://localhost:3000', 'https://localhost:%d' % x.port, 'http://localhost:%d.evil' % x.port, 'null'):
        r, _ = x.post(ping, headers={'Origin': origin})
        t.eq(r.status, 403, 'Origin %s is refused' % origin)
    for origin in ('http://localhost:%d' % x.port, 'http://127.0.0.1:%d' % x.port):
        r, body = x.post(ping, headers={'Origin': origin})
        t.eq((r.status, json.loads(body)['result']), (200, {}), 'our own origin %s is fine' % origin)
    for host in ('attacker.example', 'attacker.example:%d' % x.port, 'localhost.evil:%d' % x.port, ''):
        r, _ = x.post(ping, headers={'Host': host})
        t.eq(r.status, 403, 'Host %r is refused (DNS rebinding)' % host)
    r, body = x.post(ping, headers={'Host': 'localhost:%d' % x.port})
    t.eq(r.status, 200, 'Host localhost:PORT is fine')


def test_loopback_only(t, x):
    p = subprocess.run([SBX, 'daemon', '--http', '0.0.0.0:%d' % free_port()], env=dict(x.env.env, SBX_RUNTIME_DIR=x.env.root + '/rt2',
                       SBX_STATE_DIR=x.env.root + '/st2'), capture_output=True, timeout=30)
    t.ok(p.returncode != 0 and b'loopback' in p.stderr, 'a non-loopback address is refused', p.stderr)


def test_json_and_sse(t, x):
    r, body = x.post({'jsonrpc': '2.0', 'id': 7, 'method': 'tools/call',
                      'params': {'name': 'exec', 'arguments': {'command': 'echo over http', 'sandboxId': 'web'}}})
    msg = json.loads(body)
    t.ok(r.status == 200 and r.getheader('Content-Type') == 'application/json' and
         msg['result']['structuredContent']['stdout'] == 'over http\n', 'a call without progress answers JSON')
    r, body = x.post({'jsonrpc': '2.0', 'id': 8, 'method': 'tools/call',
                      'params': {'name': 'exec', 'arguments': {'command': 'echo a; sleep 0.1; echo b', 'sandboxId': 'web'},
                                 '_meta': {'progressToken': 'tok'}}})
    events = [json.loads(l[6:]) for l in body.decode().split('\n') if l.startswith('data: ')]
    t.ok(r.getheader('Content-Type') == 'text/event-stream' and len(events) >= 3, 'progress streams as SSE', body[:500])
    t.ok(events[-1]['id'] == 8 and events[-1]['result']['structuredContent']['stdout'] == 'a\nb\n',
         'the SSE stream ends with the response')
    t.ok(all(e.get('method') == 'notifications/progress' for e in events[:-1]), 'progress events come first')
    r, body = x.post({'jsonrpc': '2.0', 'method': 'notifications/initialized'})
    t.eq((r.status, body), (202, b''), 'a notification is accepted with 202')
    r, body = x.post(None, raw='{not json')
    t.eq((r.status, json.loads(body)['error']['code']), (400, -32700), 'malformed JSON: 400 with -32700')
    r, body = x.post({'jsonrpc': '2.0', 'id': 3, 'method': 'tools/list', 'params': {'_meta': M}})
    res = json.loads(body)['result']
    t.ok(res['resultType'] == 'complete' and res['ttlMs'] > 0, 'the modern era over HTTP')
    r, body = x.post({'jsonrpc': '2.0', 'id': 4, 'method': 'server/discover', 'params': {'_meta': M}})
    t.ok('2026-07-28' in json.loads(body)['result']['supportedVersions'], 'server/discover over HTTP')
    c = http.client.HTTPConnection('127.0.0.1', x.port, timeout=10)
    c.request('GET', '/mcp', headers={'Authorization': 'Bearer ' + x.token})
    t.eq(c.getresponse().status, 405, 'GET /mcp (no server-initiated stream) is 405')
    c.close()


def test_hostile_http(t, x):
    s = socket.create_connection(('127.0.0.1', x.port))
    s.sendall(b'POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n'
              % (x.port, x.token.encode(), 65 << 20))
    t.ok(s.recv(100).startswith(b'HTTP/1.1 413'), 'a body over 64 MiB is refused with 413 before it is read')
    s.close()
    s = socket.create_connection(('127.0.0.1', x.port))
    s.sendall(b'POST /mcp HTTP/1.1\r\nX-Junk: ' + b'a' * 70000 + b'\r\n')
    t.ok(s.recv(100).startswith(b'HTTP/1.1 431'), 'endless headers are refused with 431')
    s.close()
    s = socket.create_connection(('127.0.0.1', x.port))
    s.sendall(b'GARBAGE\r\n\r\n')
    t.ok(s.recv(100).startswith(b'HTTP/1.1 400'), 'a malformed request line is 400')
    s.close()
    r, body = x.post({'jsonrpc': '2.0', 'id': 1, 'method': 'ping'})
    t.eq(json.loads(body)['result'], {}, 'the daemon serves others afterwards')
    # without the token, nothing is buffered but a head: the answer comes
    # before the body, which would have been 64 MiB
    s = socket.create_connection(('127.0.0.1', x.port))
    s.settimeout(20)
    s.sendall(b'POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: %d\r\n\r\n' % (x.port, 64 << 20) + b'{' * 65536)
    t.ok(s.recv(100).startswith(b'HTTP/1.1 401'), 'a head without the token is answered 401 before its body is read')
    s.close()
    kept = http.client.HTTPConnection('127.0.0.1', x.port, timeout=30)  # a client with the token, kept alive
    hdr = {'Content-Type': 'application/json', 'Authorization': 'Bearer ' + x.token}
    kept.request('POST', '/mcp', body=json.dumps({'jsonrpc': '2.0', 'id': 3, 'method': 'ping'}), headers=hdr)
    kept.getresponse().read()
    idle = [socket.create_connection(('127.0.0.1', x.port)) for _ in range(256)]  # connections that say nothing
    try:
        for s in idle:
            s.settimeout(20)
        t.eq(json.loads(x.post({'jsonrpc': '2.0', 'id': 2, 'method': 'ping'})[1])['result'], {},
             'past 256 connections at once, a client that sends a request is served')
        t.eq(idle[0].recv(100), b'', 'and the oldest connection that had no call in progress made room')
        kept.request('POST', '/mcp', body=json.dumps({'jsonrpc': '2.0', 'id': 4, 'method': 'ping'}), headers=hdr)
        t.eq(json.loads(kept.getresponse().read())['result'], {},
             'a kept-alive connection that sent the token is not the one that goes')
    finally:
        kept.close()
        for s in idle:
            s.close()
    pool = []  # 256 clients with the token, kept alive and idle
    try:
        for i in range(256):
            k = http.client.HTTPConnection('127.0.0.1', x.port, timeout=30)
            k.request('POST', '/mcp', body=json.dumps({'jsonrpc': '2.0', 'id': 10 + i, 'method': 'ping'}), headers=hdr)
            k.getresponse().read()
            pool.append(k)
        t.eq(json.loads(x.post({'jsonrpc': '2.0', 'id': 5, 'method': 'ping'})[1])['result'], {},
             'past 256 kept-alive clients with the token, one more is served (the oldest idle one makes room)')
    finally:
        for k in pool:
            k.close()


def test_disconnect_cancels(t, x):
    s = socket.create_connection(('127.0.0.1', x.port))
    body = json.dumps({'jsonrpc': '2.0', 'id': 9, 'method': 'tools/call',
                       'params': {'name': 'exec', 'arguments': {'command': 'echo go; sleep 300', 'sandboxId': 'web'},
                                  '_meta': {'progressToken': 1}}}).encode()
    s.sendall(b'POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\n'
              b'Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' % (x.port, x.token.encode(), len(body), body))
    got = b''
    while b'go' not in got:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    s.close()

    def gone():
        r, b = x.post({'jsonrpc': '2.0', 'id': 1, 'method': 'tools/call', 'params': {'name': 'exec', 'arguments': {
            'sandboxId': 'web', 'command': 'ps -e -o comm= | grep -c "^sleep$" || true'}}})
        return json.loads(b)['result']['structuredContent']['stdout'].strip() == '0'
    t.ok(b'go' in got and wait_until(gone, 20, 'the call to be cancelled'), 'a client that hangs up has its call cancelled')


def test_slow_reader(t, x):
    """A client that asks for SSE progress and stops reading is dropped; the
    daemon does not buffer for it without end."""
    pid = x.daemon.pid

    def rss():
        with open('/proc/%d/status' % pid) as f:
            return next(int(l.split()[1]) for l in f if l.startswith('VmRSS:'))
    before = rss()
    s = socket.create_connection(('127.0.0.1', x.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    body = json.dumps({'jsonrpc': '2.0', 'id': 9, 'method': 'tools/call',
                       'params': {'name': 'exec', 'arguments': {'command': 'yes flood | head -c 400000000', 'sandboxId': 'web',
                                                                'timeout': 60000},
                                  '_meta': {'progressToken': 1}}}).encode()
    s.sendall(b'POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\n'
              b'Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' % (x.port, x.token.encode(), len(body), body))
    s.recv(100)  # then never read again

    import time
    peak = before
    deadline = time.monotonic() + 60
    closed = False
    while time.monotonic() < deadline:
        peak = max(peak, rss())
        try:
            r, body = x.post({'jsonrpc': '2.0', 'id': 1, 'method': 'tools/call', 'params': {'name': 'exec', 'arguments': {
                'sandboxId': 'web', 'command': 'pgrep -c yes || true'}}})
            if json.loads(body)['result']['structuredContent']['stdout'].strip() == '0':
                closed = True
                break
        except OSError:
            pass
    s.close()
    t.ok(closed, 'the flood was cancelled once its reader stopped reading')
    t.ok(peak - before < 100 * 1024, 'the daemon did not buffer it (RSS grew %d KiB)' % (peak - before))


def test_conformance(t, x):
    bin = os.path.join(SDK, 'node_modules', '.bin', 'conformance')
    if not os.path.exists(bin):
        for s in CONFORMANCE:
            t.skip('conformance ' + s, 'the suite is not installed (scripts/bootstrap)')
        return
    env = dict(os.environ, SBX_HTTP_TOKEN=x.token,
               NODE_OPTIONS='--require ' + os.path.join(SDK, 'conformance-auth.cjs'))
    for s in CONFORMANCE:
        p = subprocess.run([bin, 'server', '--url', 'http://127.0.0.1:%d/mcp' % x.port, '--scenario', s],
                           capture_output=True, timeout=120, env=env, cwd=x.env.root)
        out = p.stdout.decode() + p.stderr.decode()
        m = re.search(r'Passed: (\d+)/(\d+), (\d+) failed', out)
        t.ok(p.returncode == 0 and m and m.group(1) == m.group(2) and int(m.group(2)) > 0 and m.group(3) == '0',
             'conformance ' + s, out[-1500:])


if __name__ == '__main__':
    sys.exit(run_tests([test_auth, test_loopback_only, test_json_and_sse, test_hostile_http, test_disconnect_cancels,
                        test_slow_reader, test_conformance], Ctx))
