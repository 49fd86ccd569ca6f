"""gitCheckout against real git servers running inside the sandbox (git
daemon, and smart HTTP through git http-backend behind basic auth): default
and explicit targets, a branch, a shallow clone, a target in the way, bad
URLs, a missing repository, and a password that never shows."""
import base64
import json
import os
import sys

import sbxtest
from sbxtest import run_tests

SECRET = 'pw-d3adbeef-sbx'

# smart HTTP: git http-backend as CGI behind HTTP basic auth (user u, SECRET)
HTTP_SERVER = r'''
import base64, os, subprocess, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
WANT = 'Basic ' + base64.b64encode(b'u:' + sys.argv[2].encode()).decode()
class H(BaseHTTPRequestHandler):
    def handle_one(self):
        if self.headers.get('Authorization') != WANT:
            self.send_response(401)
            self.send_header('WWW-Authenticate', 'Basic realm="git"')
            self.send_header('Content-Length', '0')
            self.end_headers()
            return
        path, _, query = self.path.partition('?')
        body = self.rfile.read(int(self.headers.get('Content-Length') or 0))
        env = dict(os.environ, GIT_PROJECT_ROOT='/srv', GIT_HTTP_EXPORT_ALL='1', PATH_INFO=path, QUERY_STRING=query,
                   REQUEST_METHOD=self.command, CONTENT_TYPE=self.headers.get('Content-Type', ''),
                   REMOTE_USER='u', CONTENT_LENGTH=str(len(body)))
        out = subprocess.run(['git', 'http-backend'], input=body, env=env, capture_output=True).stdout
        head, _, rest = out.partition(b'\r\n\r\n')
        status = 200
        headers = []
        for line in head.decode().split('\r\n'):
            k, _, v = line.partition(': ')
            if k.lower() == 'status':
                status = int(v.split()[0])
            elif k:
                headers.append((k, v))
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header('Content-Length', str(len(rest)))
        self.end_headers()
        self.wfile.write(rest)
    do_GET = do_POST = handle_one
    def log_message(self, *a):
        pass
print('listening', flush=True)
HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()
'''


class Ctx(sbxtest.Ctx):
    """The sandbox 'git' with a repository and two servers of it inside."""

    def __init__(self):
        super().__init__('git')
        c = self.c
        g = 'git -c user.email=t@t -c user.name=t -c init.defaultBranch=main'
        c.sh('set -e; mkdir -p /srv/src && cd /srv/src && %s init -q && echo one > f && git add f && '
             '%s commit -qm one && git checkout -qb feature && echo two >> f && %s commit -qam two && '
             'git checkout -q main && echo three > g && git add g && %s commit -qm three && '
             'git clone -q --bare /srv/src /srv/repo.git' % (g, g, g, g))
        self.main = c.sh('git -C /srv/repo.git rev-parse main')['stdout'].strip()
        self.feature = c.sh('git -C /srv/repo.git rev-parse feature')['stdout'].strip()
        c.ok('startProcess', {'processId': 'gitd', 'command': 'exec git daemon --reuseaddr --base-path=/srv --export-all '
                                                            '--listen=127.0.0.1 --port=9418 /srv'})
        c.ok('waitForPort', {'port': 9418, 'timeout': 20000}, 40)
        c.ok('writeFile', {'path': '/srv/gitweb.py', 'content': HTTP_SERVER})
        c.ok('startProcess', {'processId': 'http', 'command': 'exec python3 -u /srv/gitweb.py 8081 ' + SECRET})
        c.ok('waitForLog', {'processId': 'http', 'pattern': 'listening', 'timeout': 20000}, 40)


def test_clone_defaults(t, x):
    r = x.c.ok('gitCheckout', {'repoUrl': 'git://127.0.0.1:9418/repo.git'}, 120)
    t.eq((r['targetDir'], r['branch'], r['commit']), ('/workspace/repo', 'main', x.main),
         'a clone into /workspace/<repo name>, on the default branch, at its commit')
    t.eq(x.c.sh('cat /workspace/repo/g')['stdout'], 'three\n', 'with the files')


def test_branch_and_depth(t, x):
    r = x.c.ok('gitCheckout', {'repoUrl': 'git://127.0.0.1:9418/repo.git', 'branch': 'feature', 'depth': 1,
                               'targetDir': 'feat'}, 120)
    t.eq((r['targetDir'], r['branch'], r['commit']), ('/workspace/feat', 'feature', x.feature), 'a branch, a relative target')
    n = x.c.sh('git -C /workspace/feat rev-list --count HEAD')['stdout'].strip()
    t.eq(n, '1', 'depth 1 is a shallow clone')


def test_target_in_the_way(t, x):
    x.c.sh('mkdir -p /workspace/busy && echo mine > /workspace/busy/keep')
    args = {'repoUrl': 'git://127.0.0.1:9418/repo.git', 'targetDir': '/workspace/busy'}
    res, _ = x.c.call('gitCheckout', args, 120)
    t.eq(res['structuredContent'].get('error', {}).get('code'), 'FILE_EXISTS', 'a non-empty target is refused', res)
    t.eq(x.c.sh('cat /workspace/busy/keep')['stdout'], 'mine\n', 'and left as it was')
    for bad in ({'repoUrl': 'git://127.0.0.1:9418/nope.git'}, {'branch': 'no-such-branch'}):
        res, _ = x.c.call('gitCheckout', dict(args, force=True, **bad), 120)
        t.eq(res['structuredContent'].get('error', {}).get('code'), 'GIT_CLONE_FAILED', 'force: true, failing: %s' % bad)
        t.eq(x.c.sh('cat /workspace/busy/keep; ls -A /workspace | grep -c busy')['stdout'], 'mine\n1\n',
             'the target is kept as it was, and no partial clone is left beside it')
    res, _ = x.c.call('gitCheckout', {'repoUrl': 'git://127.0.0.1:9419/repo.git', 'targetDir': 'none'}, 120)
    err = res['structuredContent'].get('error', {})
    t.ok(err.get('code') == 'GIT_CLONE_FAILED' and 'own loopback' in err.get('message', ''),
         'nothing on the sandbox\'s loopback: the error says its 127.0.0.1 is not the host\'s', err)
    res, _ = x.c.call('gitCheckout', {'repoUrl': 'http://127.0.0.1:9419/repo.git', 'targetDir': 'none'}, 120)
    err = res['structuredContent'].get('error', {})
    t.ok(err.get('code') == 'GIT_CLONE_FAILED' and 'own loopback' in err.get('message', ''),
         'so does one over http (curl\'s words)', err)
    r = x.c.ok('gitCheckout', dict(args, force=True), 120)
    t.eq(r['commit'], x.main, 'force: true replaces it')
    t.eq(x.c.sh('ls -A /workspace/busy; ls -A /workspace | grep -c busy')['stdout'], '.git\nf\ng\n1\n',
         'with the clone alone')


def test_force_spares_mounts(t, x):
    """force: true over a target that holds a mount point (a bucket mount,
    a system directory) is refused before anything is deleted."""
    c = x.c
    c.sh("mkdir -p '/workspace/with space' && ln -sfn '/workspace/with space' /workspace/link")
    for target, real in (('/workspace/held',) * 2, ('/workspace/with space',) * 2, ('/workspace/link', '/workspace/with space')):
        c.ok('mountBucket', {'bucket': 'gitkeep', 'mountPath': real + '/data', 'localBucket': True}, 60)
        c.ok('writeFile', {'path': real + '/data/keep.txt', 'content': 'bucket\n'})
        c.ok('writeFile', {'path': real + '/mine.txt', 'content': 'mine\n'})
        res, _ = c.call('gitCheckout', {'repoUrl': 'git://127.0.0.1:9418/repo.git', 'targetDir': target, 'force': True}, 120)
        err = res['structuredContent'].get('error', {})
        t.ok(err.get('code') == 'VALIDATION_FAILED' and real + '/data' in err.get('message', ''),
             'force: true over %r, which holds a bucket mount, is refused and says where' % target, err)
        t.eq(c.sh("cat '%s/data/keep.txt' '%s/mine.txt'" % (real, real))['stdout'], 'bucket\nmine\n',
             'the bucket\'s files and the target\'s own are all there')
        c.ok('unmountBucket', {'mountPath': real + '/data'}, 60)
    c.ok('mountBucket', {'bucket': 'gitkeep', 'mountPath': '/workspace/.sib.sbx-clone', 'localBucket': True}, 60)
    c.ok('writeFile', {'path': '/workspace/.sib.sbx-clone/keep.txt', 'content': 'bucket\n'})
    c.ok('writeFile', {'path': '/workspace/sib/mine.txt', 'content': 'mine\n'})
    res, _ = c.call('gitCheckout', {'repoUrl': 'git://127.0.0.1:9418/repo.git', 'targetDir': 'sib', 'force': True}, 120)
    t.eq(res['structuredContent'].get('error', {}).get('code'), 'VALIDATION_FAILED',
         'a bucket mounted where the clone goes first (the target\'s hidden sibling) is refused too', res)
    t.eq(c.sh('cat /workspace/.sib.sbx-clone/keep.txt')['stdout'], 'bucket\n', 'and its files are there')
    c.ok('unmountBucket', {'mountPath': '/workspace/.sib.sbx-clone'}, 60)
    res, _ = c.call('gitCheckout', {'repoUrl': 'git://127.0.0.1:9418/repo.git', 'targetDir': '/etc', 'force': True}, 120)
    t.eq(res['structuredContent'].get('error', {}).get('code'), 'VALIDATION_FAILED', 'force: true over /etc is refused', res)
    t.eq(c.sh('head -1 /etc/passwd | cut -d: -f1')['stdout'], 'root\n', 'and /etc is as it was')


def test_bad_urls(t, x):
    for url in ('file:///srv/repo.git', '/srv/repo.git', '--upload-pack=touch /tmp/pwned', 'ext::sh -c touch% /tmp/p',
                'http://-oProxyCommand=x/repo', 'fd::3', 'ftp://127.0.0.1/repo.git', 'git://u:pw@127.0.0.1/repo.git',
                'EXT::sh', 'x::y', 'https::/x', 'FILE:///srv/repo.git'):
        t.eq(x.c.err('gitCheckout', {'repoUrl': url}), 'INVALID_GIT_URL', 'refused: %s' % url)
    res, _ = x.c.call('gitCheckout', {'repoUrl': 'git://u:pw@127.0.0.1/repo.git'})
    t.ok('no credentials' in res['structuredContent']['error']['message'] and 'pw' not in json.dumps(res),
         'a git:// URL with credentials says they have no place there, without echoing them', res)
    t.eq(x.c.sh('ls /tmp/pwned /tmp/p 2>&1 | grep -c "No such"')['stdout'].strip(), '2', 'and nothing ran')
    res, _ = x.c.call('gitCheckout', {'repoUrl': 'http://u:pa/ss@127.0.0.1:8081/repo.git'})
    e = res['structuredContent'].get('error', {})
    t.ok(e.get('code') == 'INVALID_GIT_URL' and 'percent-encoded' in e.get('message', '') and 'pa/ss' not in json.dumps(res),
         'a password with a "/" not percent-encoded is refused, and not echoed (where the host starts is ambiguous)', e)


def test_missing_repo(t, x):
    res, _ = x.c.call('gitCheckout', {'repoUrl': 'git://127.0.0.1:9418/nope.git', 'targetDir': 'nope'}, 120)
    e = res['structuredContent'].get('error', {})
    t.ok(e.get('code') == 'GIT_CLONE_FAILED' and 'fatal' in e.get('message', ''),
         'a missing repository is GIT_CLONE_FAILED with git\'s own message', e)


def test_password_never_shows(t, x):
    url = 'http://u:%s@127.0.0.1:8081/repo.git' % SECRET
    res, notes = x.c.call('gitCheckout', {'repoUrl': url, 'targetDir': 'private'}, 120, progress=True)
    r = res['structuredContent']
    t.ok(not res['isError'] and r['commit'] == x.main, 'a clone over smart HTTP with a password in the URL', r)
    t.eq(r['repoUrl'], 'http://u:***@127.0.0.1:8081/repo.git', 'the URL comes back with the password hidden')
    t.ok(len(notes) > 0, 'clone progress streams as progress notifications (%d)' % len(notes))
    seen = json.dumps(res) + json.dumps(notes)
    t.ok(SECRET not in seen, 'the password is in no result and no progress message')
    cfg = x.c.sh('cat /workspace/private/.git/config; git -C /workspace/private remote get-url origin')['stdout']
    t.ok(SECRET not in cfg and 'http://u@127.0.0.1:8081/repo.git' not in cfg and
         'http://127.0.0.1:8081/repo.git' in cfg, 'nor in the clone\'s .git/config (its origin has no credentials)', cfg)
    res, notes = x.c.call('gitCheckout', {'repoUrl': url.replace(SECRET, SECRET + 'x'), 'targetDir': 'denied'}, 120,
                          progress=True)
    e = res['structuredContent'].get('error', {})
    t.eq(e.get('code'), 'GIT_CLONE_FAILED', 'a wrong password is GIT_CLONE_FAILED (no prompt, no hang)')
    t.ok(SECRET not in json.dumps(res) + json.dumps(notes), 'and its error hides the password too', e)
    # a session that traces git's HTTP (the Authorization header), a
    # password in an scp-like URL, a token in the query
    x.c.sh('export GIT_TRACE_CURL=1 GIT_TRACE_REDACT=0')
    res, notes = x.c.call('gitCheckout', {'repoUrl': url, 'targetDir': 'traced'}, 120, progress=True)
    b64 = base64.b64encode(('u:' + SECRET).encode()).decode()
    seen = json.dumps(res) + json.dumps(notes)
    t.ok(not res['isError'] and SECRET not in seen and b64 not in seen,
         'a session with GIT_TRACE_CURL set shows neither the password nor its base64 in the progress', res)
    x.c.sh('unset GIT_TRACE_CURL GIT_TRACE_REDACT')
    for other in ('u:%s@127.0.0.1:repo.git' % SECRET, 'http://127.0.0.1:1/repo.git?access_token=%s' % SECRET):
        res, notes = x.c.call('gitCheckout', {'repoUrl': other, 'targetDir': 'other'}, 120, progress=True)
        t.ok(res['isError'] and SECRET not in json.dumps(res) + json.dumps(notes),
             'hidden too in %s' % other.replace(SECRET, '***'), res['structuredContent'])
    log = open(os.path.join(x.env.state, 'daemon.log')).read()
    t.ok(SECRET not in log, 'the daemon\'s log never has it')


if __name__ == '__main__':
    sys.exit(run_tests([test_clone_defaults, test_branch_and_depth, test_target_in_the_way, test_force_spares_mounts, test_bad_urls,
                        test_missing_repo, test_password_never_shows], setup=Ctx))
