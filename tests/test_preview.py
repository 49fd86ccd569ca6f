"""exposePort through the daemon's preview proxy: a server inside the
sandbox reached by its preview URL (HTTP with X-Forwarded-*, a streamed
response whose first part arrives before the server finishes, a WebSocket
echo, a 1 GiB download with the daemon's memory bounded), and every
status: 404 for a wrong token or an unknown host, 410 once unexposed or
reset, 502 while nothing listens."""
import base64
import hashlib
import json
import os
import socket
import sys

from browser import Browser, chromium_path
from sbxtest import Env, free_port, run_tests, wait_until

SERVER = r'''
import base64, hashlib, os, socket, sys, threading
release = threading.Event()
def handle(conn):
    try:
        serve(conn)
    finally:
        conn.close()
def serve(conn):
    f = conn.makefile('rb')
    while True:
        line = f.readline()
        if not line:
            return
        method, path, _ = line.decode().split(' ', 2)
        headers = {}
        while True:
            h = f.readline().decode()
            if h in ('\r\n', ''):
                break
            k, v = h.split(':', 1)
            headers[k.strip().lower()] = v.strip()
        if path == '/ws':
            key = headers['sec-websocket-key']
            acc = base64.b64encode(hashlib.sha1((key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').encode()).digest()).decode()
            conn.sendall(('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n'
                          'Sec-WebSocket-Accept: %s\r\n\r\n' % acc).encode())
            while True:
                b = f.read(2)
                if len(b) < 2:
                    return
                n = b[1] & 127
                mask = f.read(4)
                data = bytes(c ^ mask[i % 4] for i, c in enumerate(f.read(n)))
                conn.sendall(bytes([0x81, len(data)]) + data)
        if method == 'POST':  # the body, by its length or chunked
            if headers.get('transfer-encoding') == 'chunked':
                data = b''
                while True:
                    size = int(f.readline().split(b';')[0], 16)
                    data += f.read(size)
                    if not size:
                        while f.readline() not in (b'\r\n', b''):
                            pass  # trailers
                        break
                    f.readline()
            else:
                data = f.read(int(headers.get('content-length', '0')))
            body = json.dumps({'path': path, 'headers': headers, 'body': hashlib.sha256(data).hexdigest()}).encode()
        elif path == '/app':
            conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: %d\r\n\r\n'
                         % len(PAGE) + PAGE)
            continue
        elif path == '/release':
            release.set()
            body = b'released'
        elif path == '/stream':
            conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n')
            conn.sendall(b'6\r\nfirst\n\r\n')
            release.wait(60)
            conn.sendall(b'7\r\nsecond\n\r\n0\r\n\r\n')
            continue
        elif path == '/big':
            size = 1 << 30
            conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n' % size)
            chunk = b'x' * (1 << 20)
            for _ in range(size // len(chunk)):
                conn.sendall(chunk)
            continue
        else:
            body = json.dumps({'path': path, 'headers': headers}).encode()
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n' % len(body) + body)
        if headers.get('connection') == 'close':
            conn.close()
            return
import json
PAGE = b"""<!doctype html><title>app</title><pre id="out"></pre><script>
const out = document.getElementById('out');
(async () => {
  const j = await (await fetch('/api?from=page')).json();
  const ws = new WebSocket('ws://' + location.host + '/ws');
  const echo = await new Promise((ok, bad) => {
    ws.onopen = () => ws.send('ping from the page');
    ws.onmessage = e => ok(e.data);
    ws.onerror = () => bad(new Error('websocket failed'));
  });
  out.textContent = JSON.stringify({fetched: j.path, forwardedHost: j.headers['x-forwarded-host'], echo});
})().catch(e => { out.textContent = 'error: ' + e; }).finally(() => { out.dataset.done = '1'; });
</script>"""
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', int(sys.argv[1])))
s.listen(64)
print('listening', flush=True)
while True:
    c, _ = s.accept()
    threading.Thread(target=handle, args=(c,), daemon=True).start()
'''


class Ctx:
    def __init__(self):
        self.env = Env()
        self.port = free_port()
        self.env.env['SBX_PREVIEW_PORT'] = str(self.port)
        self.c = self.env.mcp(['--sandbox', 'web'])
        self.c.initialize()
        self.c.ok('writeFile', {'path': '/srv/web.py', 'content': SERVER})
        self.c.ok('startProcess', {'processId': 'web', 'command': 'exec python3 -u /srv/web.py 8000'})
        self.c.ok('waitForLog', {'processId': 'web', 'pattern': 'listening', 'timeout': 20000}, 40)

    def close(self):
        self.env.close()


def host_of(url):
    return url.split('://', 1)[1].split('/', 1)[0]


def request(x, host, path='/', raw=None):
    """One HTTP/1.1 request to the proxy with this Host; (status, headers, body)."""
    s = socket.create_connection(('127.0.0.1', x.port), timeout=30)
    s.sendall(raw or ('GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' % (path, host)).encode())
    data = b''
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    head, _, body = data.partition(b'\r\n\r\n')
    return int(head.split()[1]), head.decode(errors='replace'), body


def test_expose_and_reach(t, x):
    r = x.c.ok('exposePort', {'port': 8000, 'name': 'web'})
    url = r['url']
    t.ok(url.startswith('http://8000-web-') and url.endswith('.localhost:%d/' % x.port) and len(host_of(url).split('-')[-1].split('.')[0]) == 16,
         'exposePort answers http://{port}-{sandbox}-{token}.localhost:{proxy}/', url)
    x.url = url
    code, _, body = request(x, host_of(url), '/hello?a=1')
    seen = json.loads(body) if code == 200 else {}
    t.eq((code, seen.get('path')), (200, '/hello?a=1'), 'the server inside the sandbox answers through the preview URL')
    h = seen.get('headers', {})
    t.ok(h.get('x-forwarded-host') == host_of(url) and h.get('x-forwarded-proto') == 'http' and
         h.get('x-forwarded-for') == '127.0.0.1', 'with X-Forwarded-Host, -Proto and -For', h)
    t.eq(x.c.ok('getExposedPorts'), {'ports': [{'url': url, 'port': 8000, 'name': 'web'}]},
         'getExposedPorts lists it (and no warning: none is due)')
    t.eq(x.c.err('exposePort', {'port': 8000}), 'PORT_ALREADY_EXPOSED', 'exposing it twice is PORT_ALREADY_EXPOSED')


def test_not_found_reveals_nothing(t, x):
    host = host_of(x.url)
    wrong = host[:-len('.localhost:%d' % x.port) - 16] + 'a' * 16 + '.localhost:%d' % x.port
    results = [request(x, h)[::2] for h in (wrong, 'localhost:%d' % x.port, '8000-nosuch-%s.localhost' % ('b' * 16),
                                            '127.0.0.1:%d' % x.port)]
    t.eq({r[0] for r in results}, {404}, 'a wrong token, the root, an unknown sandbox: 404')
    t.eq(len({r[1] for r in results}), 1, 'all with the same body: nothing tells which sandboxes exist')
    code, _, _ = request(x, None, raw=b'GET / HTTP/1.1\r\nHost: x\r\nX-Big: ' + b'a' * 20000 + b'\r\n\r\n')
    t.eq(code, 431, 'a request head past 16 KiB is 431')


def responses(s, n):
    """n responses (each with a Content-Length) read from one connection."""
    buf, out = b'', []
    while len(out) < n:
        while b'\r\n\r\n' not in buf:
            b = s.recv(65536)
            if not b:
                return out
            buf += b
        head, _, buf = buf.partition(b'\r\n\r\n')
        length = int([l.split(b':')[1] for l in head.split(b'\r\n') if l.lower().startswith(b'content-length:')][0])
        while len(buf) < length:
            b = s.recv(65536)
            if not b:
                return out
            buf += b
        try:
            out.append((int(head.split()[1]), json.loads(buf[:length])))
        except ValueError:
            raise ValueError(repr(head) + repr(buf[:length]))
        buf = buf[length:]
    return out


def test_keep_alive_every_request(t, x):
    host = host_of(x.url)
    big = os.urandom(3 << 20)
    chunked = b''.join(b'%x;ext=1\r\n%s\r\n' % (len(p), p) for p in (b'abc', big[:70000], b'z')) + b'0\r\nX-Trailer: 1\r\n\r\n'
    spoof = 'X-Forwarded-For: 6.6.6.6\r\nx-forwarded-host: evil.example\r\nX-Forwarded-Proto: https\r\n'
    s = socket.create_connection(('127.0.0.1', x.port), timeout=60)
    # pipelined: a GET, a POST by length, a chunked POST, a GET; then a big POST sent in pieces
    s.sendall(('GET /one HTTP/1.1\r\nHost: %s\r\n%s\r\n' % (host, spoof)).encode() +
              ('POST /two HTTP/1.1\r\nHost: %s\r\n%sContent-Length: 5\r\n\r\n' % (host, spoof)).encode() + b'hello' +
              ('POST /three HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n%s\r\n' % (host, spoof)).encode() +
              chunked + ('GET /four HTTP/1.1\r\nHost: %s\r\n%s\r\n' % (host, spoof)).encode())
    got = responses(s, 4)
    s.sendall(('POST /five HTTP/1.1\r\nHost: %s\r\n%sContent-Length: %d\r\n\r\n' % (host, spoof, len(big))).encode())
    for i in range(0, len(big), 1 << 20):
        s.sendall(big[i:i + (1 << 20)])
    got += responses(s, 1)
    t.eq([g[1].get('path') for g in got], ['/one', '/two', '/three', '/four', '/five'],
         'five requests on one kept-alive connection, pipelined and with bodies, each reach the server once')
    fwd = [(g[1]['headers'].get('x-forwarded-for'), g[1]['headers'].get('x-forwarded-host'),
            g[1]['headers'].get('x-forwarded-proto')) for g in got]
    t.eq(fwd, [('127.0.0.1', host, 'http')] * 5,
         'every one of them carries the proxy\'s X-Forwarded-*, never the client\'s own')
    import hashlib as h
    t.eq([g[1].get('body') for g in got[1:3]] + [got[4][1].get('body')],
         [h.sha256(b'hello').hexdigest(), h.sha256(b'abc' + big[:70000] + b'z').hexdigest(), h.sha256(big).hexdigest()],
         'request bodies arrive whole: by length, chunked with extensions and trailers, 3 MiB in pieces')
    # another Host on the same connection is not passed on: the connection ends
    other = '8000-web-%s.localhost:%d' % ('c' * 16, x.port)
    s.sendall(('GET /six HTTP/1.1\r\nHost: %s\r\n\r\n' % other).encode())
    s.settimeout(30)
    t.eq(s.recv(100), b'', 'a request naming another Host on a routed connection is refused: the connection closes')
    s.close()
    # ambiguous framing is refused before anything reaches the server
    code, _, body = request(x, None, raw=('POST /smuggle HTTP/1.1\r\nHost: %s\r\nContent-Length: 4\r\n'
                                          'Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n' % host).encode())
    code2, _, _ = request(x, None, raw=('POST /smuggle HTTP/1.1\r\nHost: %s\r\nContent-Length: 4\r\n'
                                        'Content-Length: 5\r\n\r\nhello' % host).encode())
    t.eq((code, code2), (400, 400), 'a request with both Content-Length and chunked, or two lengths, is 400')


def test_no_tricks(t, x):
    host = host_of(x.url)
    # an upgrade the server does not take: what follows is not passed on unchecked
    s = socket.create_connection(('127.0.0.1', x.port), timeout=30)
    s.sendall(('GET /a HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n'
               'GET /smuggled HTTP/1.1\r\nHost: evil.example\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n' % host).encode())
    got = responses(s, 2)
    s.close()
    t.eq([g[1].get('path') for g in got], ['/a'],
         'after an upgrade the server refused (200, not 101), the connection ends: nothing more reaches the server')
    # heads a lenient server would split differently are refused
    codes = [request(x, None, raw=raw % host.encode())[0] for raw in (
        b'GET /lf HTTP/1.1\r\nHost: %s\r\nX-A: 1\nX-Forwarded-For: 6.6.6.6\r\n\r\n',
        b'GET /lf HTTP/1.1\r\nHost: %s\r\nX-A: 1\n\nGET /smuggled HTTP/1.1\r\nHost: evil.example\r\n\r\n',
        b'GET /sp HTTP/1.1\r\nHost: %s\r\nX-Forwarded-For : 6.6.6.6\r\n\r\n',
        b'GET /fold HTTP/1.1\r\nHost: %s\r\nX-A: 1\r\n  folded\r\n\r\n')]
    t.eq(codes, [400] * 4, 'a bare LF, a space before the colon, a folded line: 400')
    code, _, body = request(x, None, raw=('GET /ip HTTP/1.1\r\nHost: %s\r\nForwarded: for=6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\n'
                                          'True-Client-IP: 6.6.6.6\r\nX-Forwarded-Port: 1\r\nConnection: close\r\n\r\n'
                                          % host).encode())
    h = json.loads(body)['headers'] if code == 200 else {}
    t.ok(code == 200 and not ({'forwarded', 'x-real-ip', 'true-client-ip', 'x-forwarded-port'} & set(h)),
         'a client\'s Forwarded, X-Real-IP, True-Client-IP and X-Forwarded-* never reach the server', h)
    t.eq(request(x, None, raw=('CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: %s\r\n\r\n' % host).encode())[0], 405,
         'CONNECT is 405: a preview URL is not a forward proxy')
    # a chunked body whose trailers start with a bare LF: a lenient server
    # (h11) ends the body there and reads what follows as a request of its own
    s = socket.create_connection(('127.0.0.1', x.port), timeout=30)
    s.sendall(('POST /first HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\n'
               'GET /smuggled HTTP/1.1\r\nHost: evil.example\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n' % host).encode())
    got = responses(s, 2)
    s.close()
    t.ok('/smuggled' not in [g[1].get('path') for g in got], 'a trailer line starting with a bare LF ends the '
         'connection: nothing after it reaches the server', got)
    code, _, body = request(x, None, raw=('GET /ip HTTP/1.1\r\nHost: %s\r\nX_Forwarded_For: 6.6.6.6\r\n'
                                          'x_real_ip: 6.6.6.6\r\nConnection: close\r\n\r\n' % host).encode())
    h = json.loads(body)['headers'] if code == 200 else {}
    t.ok(code == 200 and not ({'x_forwarded_for', 'x_real_ip'} & set(h)) and h.get('x-forwarded-for') == '127.0.0.1',
         'nor do they spelled with underscores (CGI servers read X_Forwarded_For as X-Forwarded-For)', h)
    codes = [request(x, None, raw=raw)[0] for raw in (
        ('GET /two HTTP/1.1\r\nHost: %s\r\nHost: evil.example\r\n\r\n' % host).encode(),
        ('GET http://evil.example/x HTTP/1.1\r\nHost: %s\r\n\r\n' % host).encode(),
        ('POST /len HTTP/1.1\r\nHost: %s\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello' % host).encode())]
    t.eq(codes, [400] * 3, 'two Host headers, a target naming another host, two (equal) lengths: 400')
    long_path = '/long?' + 'q' * 3000
    code, _, body = request(x, None, raw=('GET http://%s%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n'
                                          % (host, long_path, host)).encode())
    t.ok(code == 200 and json.loads(body).get('path') == 'http://%s%s' % (host, long_path),
         'a request target of 3,000 bytes (absolute, naming its own host) reaches the server', (code, body[:200]))


def test_500_connections(t, x):
    host = host_of(x.url)
    socks = []
    try:
        for i in range(500):
            s = socket.create_connection(('127.0.0.1', x.port), timeout=60)
            s.sendall(('GET /c%d HTTP/1.1\r\nHost: %s\r\n\r\n' % (i, host)).encode())
            socks.append(s)
        paths = []
        for s in socks:
            r = responses(s, 1)
            paths.append(r[0][1]['path'] if r and r[0][0] == 200 else None)
        t.eq(paths, ['/c%d' % i for i in range(500)], '500 concurrent kept-alive connections are all answered')
        for s in socks[:50]:  # and each stays usable
            s.sendall(('GET /again HTTP/1.1\r\nHost: %s\r\n\r\n' % host).encode())
        again = [responses(s, 1) for s in socks[:50]]
        t.ok(all(r and r[0][0] == 200 for r in again), 'and stay open for the next request')
    finally:
        for s in socks:
            s.close()


def test_unexpose_while_connecting(t, x):
    """Connections still waiting for their connect inside the sandbox when
    the port is unexposed: they end, and the daemon goes on serving (with
    an ASan build, SBX_TEST_WAITING=1000 made a use after free show here)."""
    host = host_of(x.url)
    socks = []
    try:
        for i in range(int(os.environ.get("SBX_TEST_WAITING", "600"))):
            s = socket.create_connection(('127.0.0.1', x.port), timeout=60)
            s.sendall(('GET /w%d HTTP/1.1\r\nHost: %s\r\n\r\n' % (i, host)).encode())
            socks.append(s)
        x.c.ok('unexposePort', {'port': 8000})
        ended = 0
        for s in socks:
            try:
                while s.recv(65536):
                    pass
                ended += 1
            except OSError:
                ended += 1
        t.eq(ended, len(socks), 'every connection to the port ends once it is unexposed')
    finally:
        for s in socks:
            s.close()
    x.url = x.c.ok('exposePort', {'port': 8000, 'name': 'web'})['url']
    t.eq(request(x, host_of(x.url), '/after')[0], 200, 'and the daemon serves on: the port exposed again answers')


def test_idle_connections_evicted(t, x):
    """Connections that send nothing cannot keep everyone out: at the
    limit (4,096) the oldest of them makes room."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    idle = []
    try:
        for _ in range(4200):
            idle.append(socket.create_connection(('127.0.0.1', x.port), timeout=60))
        code, _, body = request(x, host_of(x.url), '/through')
        t.eq(code, 200, '4,200 connections that send nothing, and a request still gets through')
        gone = 0
        for s in idle[:100]:
            s.settimeout(30)
            try:
                gone += s.recv(1) == b''
            except OSError:
                gone += 1
        t.eq(gone, 100, 'the oldest idle ones were closed to make room')
    finally:
        for s in idle:
            s.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_chromium(t, x):
    if not chromium_path():
        t.ok(False, 'headless Chromium is installed (scripts/bootstrap installs Debian\'s chromium)')
        return
    b = Browser()
    try:
        page = b.open(x.url + 'app')
        # the page's fetch and WebSocket run after load: wait for it to say it is done
        text = b.evaluate(page, """new Promise(ok => { const f = () => { const e = document.getElementById('out');
            if (e.dataset.done) ok(e.textContent); else new MutationObserver(f).observe(e, {attributes: true}); }; f(); })""")
    finally:
        b.close()
    got = json.loads(text) if text and text.startswith('{') else {'error': text}
    t.eq(got, {'fetched': '/api?from=page', 'forwardedHost': host_of(x.url), 'echo': 'ping from the page'},
         'headless Chromium opens the preview URL; the page\'s fetch() and WebSocket echo reach the same sandbox')


def test_streaming(t, x):
    s = socket.create_connection(('127.0.0.1', x.port), timeout=30)
    s.sendall(('GET /stream HTTP/1.1\r\nHost: %s\r\n\r\n' % host_of(x.url)).encode())
    got = b''
    while b'first' not in got:
        b = s.recv(4096)
        if not b:
            break
        got += b
    t.ok(b'first' in got and b'second' not in got, 'a streamed response\'s first part arrives before the server finishes',
         got[-200:])
    code, _, _ = request(x, host_of(x.url), '/release')
    while b'0\r\n\r\n' not in got:
        b = s.recv(4096)
        if not b:
            break
        got += b
    s.close()
    t.ok(b'second' in got, 'and the rest once it does')


def test_websocket(t, x):
    s = socket.create_connection(('127.0.0.1', x.port), timeout=30)
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall(('GET /ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: %s\r\n'
               'Sec-WebSocket-Version: 13\r\n\r\n' % (host_of(x.url), key)).encode())
    head = b''
    while b'\r\n\r\n' not in head:
        head += s.recv(1)
    want = base64.b64encode(hashlib.sha1((key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').encode()).digest())
    t.ok(head.startswith(b'HTTP/1.1 101') and want in head, 'the WebSocket upgrade goes through', head)
    for msg in (b'hello', b'again'):
        mask = os.urandom(4)
        s.sendall(bytes([0x81, 0x80 | len(msg)]) + mask + bytes(c ^ mask[i % 4] for i, c in enumerate(msg)))
        frame = s.recv(2)
        data = s.recv(frame[1])
        t.eq(data, msg, 'a frame is echoed both ways: %s' % msg.decode())
    s.close()


def rss_kb(pid):
    with open('/proc/%d/status' % pid) as f:
        return int(f.read().split('VmRSS:')[1].split()[0])


def test_big_download_bounded(t, x):
    daemon = x.env.daemon_pid()
    before = rss_kb(daemon)
    s = socket.create_connection(('127.0.0.1', x.port), timeout=60)
    s.sendall(('GET /big HTTP/1.1\r\nHost: %s\r\n\r\n' % host_of(x.url)).encode())
    total, peak = 0, before
    while total < (1 << 30) + 40:  # the head, then the body of a known length
        b = s.recv(1 << 20)
        if not b:
            break
        total += len(b)
        if total % (16 << 20) < len(b):
            peak = max(peak, rss_kb(daemon))
    s.close()
    t.ok(total >= 1 << 30, 'a 1 GiB download goes through whole (%d bytes)' % total)
    t.ok(peak - before < 32 * 1024, 'with the daemon\'s memory bounded (+%d KiB)' % (peak - before))


def test_readers_go_on(t, x):
    """Clients that read nothing of answers that never end fill the proxy's
    budget for all connections (64 MiB): those wait, and the others (a new
    request, a download that is read) go on."""
    hogs = []
    try:
        for _ in range(80):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(('127.0.0.1', x.port))
            s.sendall(('GET /big HTTP/1.1\r\nHost: %s\r\n\r\n' % host_of(x.url)).encode())
            hogs.append(s)
        daemon = x.env.daemon_pid()
        t.ok(wait_until(lambda: rss_kb(daemon) > 48 * 1024, 60, 'the proxy to hold the hogs\' answers'),
             'the answers the hogs do not read fill the proxy\'s budget (RSS %d KiB)' % rss_kb(daemon))
        status, _, body = request(x, host_of(x.url), '/meanwhile')
        t.eq((status, json.loads(body)['path']), (200, '/meanwhile'), 'a request that is read is answered meanwhile')
    finally:
        for s in hogs:
            s.close()


def test_502_410(t, x):
    r = x.c.ok('exposePort', {'port': 9999})
    code, _, body = request(x, host_of(r['url']))
    t.ok(code == 502 and b'9999' in body, 'nothing listening: 502 with a page that says so', body)
    x.c.ok('unexposePort', {'port': 9999})
    t.eq(request(x, host_of(r['url']))[0], 410, 'an unexposed port\'s URL answers 410')
    x.revoked = [r['url']]
    t.eq(x.c.err('unexposePort', {'port': 9999}), 'PORT_NOT_EXPOSED', 'unexposing it again is PORT_NOT_EXPOSED')
    # a reset revokes every URL of the sandbox
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'nap', 'sleepAfter': '2s'})
    r = c.ok('exposePort', {'sandboxId': 'nap', 'port': 8000})
    c.request('logging/setLevel', {'level': 'notice'})
    c.next(lambda m: m.get('method') == 'notifications/message' and m['params']['data'].get('sandboxId') == 'nap', 30)
    t.eq(request(x, host_of(r['url']))[0], 410, 'after an idle reset the sandbox\'s URLs answer 410')
    x.revoked.append(r['url'])
    t.eq(c.ok('getExposedPorts', {'sandboxId': 'nap'})['ports'], [], 'and it has no exposed ports')


def test_localhost_is_ipv6(t, x):
    """A server that listens on "localhost" where that is ::1 first (Node's
    and Vite's default) listens on [::1] alone: waitForPort sees it and its
    preview URL reaches it."""
    c = x.c
    c.ok('startProcess', {'processId': 'six', 'command': 'exec python3 -m http.server --bind ::1 8006'})
    r = c.ok('waitForPort', {'port': 8006, 'mode': 'http', 'timeout': 20000}, 40)
    t.eq(r['ready'], True, 'waitForPort sees a server on [::1] only', r)
    url = c.ok('exposePort', {'port': 8006})['url']
    code, _, body = request(x, host_of(url))
    t.ok(code == 200 and b'Directory listing' in body, 'its preview URL reaches it', (code, body[:200]))
    c.ok('unexposePort', {'port': 8006})
    c.ok('killProcess', {'processId': 'six'})


def test_never_the_hosts_loopback(t, x):
    # a server on the host's loopback, on a port the sandbox then exposes
    srv = socket.socket()
    srv.bind(('127.0.0.1', 0))
    srv.listen(8)
    port = srv.getsockname()[1]
    try:
        r = x.c.ok('exposePort', {'port': port})
        srv.settimeout(0.5)
        code, _, body = request(x, host_of(r['url']))
        try:
            srv.accept()
            reached = True
        except OSError:
            reached = False
        t.ok(code == 502 and not reached, 'a preview URL reaches the port inside the sandbox, never the host\'s', (code, body))
        x.c.ok('unexposePort', {'port': port})
    finally:
        srv.close()


def test_cli_expose(t, x):
    r = x.env.run(['expose', 'web', '8001'])
    url = r.stdout.decode().strip()
    t.ok(r.returncode == 0 and url.startswith('http://8001-web-') and url.endswith('.localhost:%d/' % x.port),
         'sbx expose ID PORT prints the URL', (r.returncode, r.stdout, r.stderr))
    r = x.env.run(['expose', 'web', '8001'])
    t.eq((r.returncode, r.stdout.decode().strip()), (0, url), 'and the same URL again for a port exposed already')
    r = x.env.run(['unexpose', 'web', '8001'])
    t.eq((r.returncode, request(x, host_of(url))[0]), (0, 410), 'sbx unexpose ID PORT takes it away: the URL answers 410')
    r = x.env.run(['unexpose', 'web', '8001'])
    t.ok(r.returncode == 1 and b'PORT_NOT_EXPOSED' in r.stderr, 'a second time fails and says why', (r.returncode, r.stderr))
    r = x.env.run(['expose', 'wbe', '8001'])
    t.eq((r.returncode, r.stdout, r.stderr), (1, b'', b"sbx: no sandbox 'wbe' (`sbx ls` lists them)\n"),
         'sbx expose of a sandbox that is not there says so')
    t.ok(b'wbe' not in x.env.run(['ls']).stdout, 'and does not make it')


def test_kept_across_restart(t, x):
    x.env.run(['daemon', 'stop'])
    c = x.env.mcp(['--sandbox', 'web'])
    c.initialize()
    x.c = c
    ports = c.ok('getExposedPorts')['ports']
    t.eq([p['url'] for p in ports], [x.url], 'exposed ports are part of the record: the same URL after a daemon restart')
    code, _, body = request(x, host_of(x.url))
    t.ok(code == 502, 'its server ended with the old daemon: 502 until it runs again', (code, body))
    c.ok('startProcess', {'processId': 'web', 'command': 'exec python3 -u /srv/web.py 8000'})
    c.ok('waitForLog', {'processId': 'web', 'pattern': 'listening', 'timeout': 20000}, 40)
    t.eq(request(x, host_of(x.url), '/again')[0], 200, 'and the same URL reaches it again')
    t.eq([request(x, host_of(u))[0] for u in getattr(x, 'revoked', [])], [410, 410],
         'URLs revoked before the restart (unexposed, reset) still answer 410')


def test_port_taken(t, x):
    """A daemon whose proxy cannot listen (its port taken by another
    program) hands out no URL that answers nothing, and says why; once the
    port is free, the proxy listens without a restart of the daemon."""
    x.env.run(['daemon', 'stop'])
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(('127.0.0.1', x.port))
    squatter.listen()
    try:
        c = x.env.mcp(['--sandbox', 'web'])
        c.initialize()
        x.c = c
        r = c.ok('getExposedPorts')
        t.ok(r['ports'] and 'cannot listen' in r.get('warning', ''), 'getExposedPorts lists the ports with a warning', r)
        r = x.env.run(['expose', 'web', '8000'])
        t.ok(r.returncode == 1 and not r.stdout and b'cannot listen' in r.stderr,
             'sbx expose of a port exposed already prints no URL and says why', (r.returncode, r.stdout, r.stderr))
        t.ok('cannot listen' in c.call('exposePort', {'port': 8002})[0]['content'][0]['text'], 'exposePort says why')
        r = x.env.run(['doctor'])
        t.ok(r.returncode == 1 and b'preview URLs' in r.stdout and b'cannot listen' in r.stdout, 'sbx doctor says it',
             r.stdout[-400:])
        squatter.close()
        c.ok('startProcess', {'processId': 'web2', 'command': 'exec python3 -u /srv/web.py 8000'})
        c.ok('waitForLog', {'processId': 'web2', 'pattern': 'listening', 'timeout': 20000}, 40)
        r = c.ok('getExposedPorts')  # the first call after the port is free tries it again
        url = r['ports'][0]['url'] if r.get('ports') else ''
        status, _, body = request(x, host_of(url), '/again') if url else (None, None, b'')
        t.ok('warning' not in r and status == 200 and b'/again' in body,
             'once the port is free, the proxy listens without a daemon restart and the URL answers', (r, status))
    finally:
        squatter.close()


if __name__ == '__main__':
    sys.exit(run_tests([test_expose_and_reach, test_localhost_is_ipv6, test_not_found_reveals_nothing, test_keep_alive_every_request,
                        test_no_tricks, test_500_connections, test_unexpose_while_connecting,
                        test_idle_connections_evicted, test_chromium, test_streaming, test_websocket,
                        test_big_download_bounded, test_readers_go_on, test_502_410, test_never_the_hosts_loopback, test_cli_expose, test_kept_across_restart,
                        test_port_taken], setup=Ctx))
