"""An HTTP proxy in front of the test S3 server that checks every request's
AWS Signature Version 4 with botocore (an implementation independent of
curl's, which signs sbx's requests) before passing it on.

Run with Debian's python3 (python3-botocore):
    sigv4proxy.py LISTEN_PORT UPSTREAM_PORT ACCESS_KEY SECRET_KEY LOG
Each request adds a line to LOG: {"method", "path", "ok", "why"}. A request
whose signature does not verify gets 403 SignatureDoesNotMatch, as S3 would
answer."""
import hashlib
import http.client
import http.server
import json
import socketserver
import sys
import threading
import urllib.parse

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

LISTEN, UPSTREAM, AK, SK, LOG = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
log_lock = threading.Lock()


def verify(method, path, headers, body):
    auth = headers.get('Authorization', '')
    if not auth.startswith('AWS4-HMAC-SHA256 '):
        return False, 'no SigV4 Authorization header'
    fields = dict(p.strip().split('=', 1) for p in auth[len('AWS4-HMAC-SHA256 '):].split(','))
    cred = fields['Credential'].split('/')
    ak, date, region, service = cred[0], cred[1], cred[2], cred[3]
    if ak != AK:
        return False, 'unknown access key'
    signed = fields['SignedHeaders'].split(';')
    amz_date = headers.get('X-Amz-Date', '')
    if not amz_date.startswith(date):
        return False, 'credential date is not the request date'
    sha = headers.get('X-Amz-Content-SHA256')
    if sha is None or 'x-amz-content-sha256' not in signed:
        return False, 'x-amz-content-sha256 missing or not signed'
    if sha != 'UNSIGNED-PAYLOAD' and sha != hashlib.sha256(body).hexdigest():
        return False, 'x-amz-content-sha256 is not the body\'s hash'
    # the request as botocore sees it: only the headers that were signed
    lower = {k.lower(): v for k, v in headers.items()}
    missing = [h for h in signed if h not in lower]
    if missing:
        return False, 'signed headers %s are not in the request' % missing
    req = AWSRequest(method=method, url='http://%s%s' % (lower['host'], path), data=body,
                     headers={h: lower[h] for h in signed})
    req.context['timestamp'] = amz_date
    signer = S3SigV4Auth(Credentials(AK, SK), service, region)
    canonical = signer.canonical_request(req)
    string_to_sign = signer.string_to_sign(req, canonical)
    want = signer.signature(string_to_sign, req)
    if want != fields['Signature']:
        return False, 'signature does not match; canonical request was:\n' + canonical
    return True, ''


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, *a):
        pass

    def handle_any(self):
        n = int(self.headers.get('Content-Length') or 0)
        body = self.rfile.read(n) if n else b''
        try:
            ok, why = verify(self.command, self.path, self.headers, body)
        except Exception as e:  # a malformed request is a failed check
            ok, why = False, 'unparseable: %r' % e
        with log_lock, open(LOG, 'a') as f:
            f.write(json.dumps({'method': self.command, 'path': urllib.parse.unquote(self.path.split('?')[0]),
                                'query': self.path.partition('?')[2], 'ok': ok, 'why': why,
                                'unsigned': self.headers.get('X-Amz-Content-SHA256') == 'UNSIGNED-PAYLOAD'}) + '\n')
        if not ok:
            msg = b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SignatureDoesNotMatch</Code>' \
                  b'<Message>checked by the test proxy</Message></Error>'
            self.send_response(403)
            self.send_header('Content-Length', str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        up = http.client.HTTPConnection('127.0.0.1', UPSTREAM, timeout=120)
        hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ('connection', 'expect')}
        up.request(self.command, self.path, body=body if n else None, headers=hdrs)
        r = up.getresponse()
        data = r.read()
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ('connection', 'transfer-encoding', 'content-length'):
                self.send_header(k, v)
        # a HEAD answers with the object's length, and no body
        self.send_header('Content-Length', r.getheader('Content-Length', '0') if self.command == 'HEAD' else str(len(data)))
        self.end_headers()
        if self.command != 'HEAD':
            self.wfile.write(data)
        up.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


srv = Server(('127.0.0.1', LISTEN), Handler)
print('ready', flush=True)
srv.serve_forever()
