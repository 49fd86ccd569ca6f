"""Network: "none" has only loopback; "egress" reaches public addresses
through pasta but never special-purpose ones (private, link-local,
benchmarking...), nor the host's loopback; allowedHosts narrows it to what
it lists. The "internet" is a network namespace this test makes, with a web
server at a 198.18.0.0/15 (benchmarking) address and another at a private
one: never a real public address, so the tests reach only what they made."""
import json
import os
import shutil
import socket
import subprocess
import sys

from dnsserver import Dns
from sbxtest import Env, run_tests, wait_until

K = os.getpid() % 250 + 1
NS = 'sbxt-inet-%d' % os.getpid()
HOST_IF, NS_IF = 'sbxh%d' % K, 'sbxn%d' % K
PUBLIC, PRIVATE = '198.18.%d.2' % K, '10.213.%d.2' % K
# a public address, routed to the test's own namespace while it runs: what
# a listed name resolves to (answers open only public addresses)
NAMED = '100.63.%d.2' % K

PROBE = '''python3 - <<'PY'
import socket
for host, port in [("%s", 8080), ("%s", 8080), ("169.254.169.254", 80), ("127.0.0.1", %d)]:
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect((host, port)); print(host, "open")
    except OSError as e:
        print(host, "refused")
PY'''


def ip(*args):
    subprocess.run(['ip'] + list(args), check=True, capture_output=True)


class Ctx:
    def __init__(self):
        self.env = Env()
        records = {'ok.test': NAMED, 'a.wild.test': NAMED, 'priv.test': PRIVATE}
        records.update(('r%d.wild.test' % i, '100.62.%d.%d' % (K, i + 1)) for i in range(48))  # neighbours
        self.dns = Dns(records)
        conf = os.path.join(self.env.root, 'config.json')
        with open(conf, 'w') as f:
            json.dump({'dnsServer': '127.0.0.1:%d' % self.dns.port}, f)
        self.env.env['SBX_CONFIG'] = conf
        self.server = None
        self.ready = False
        self.host_srv = socket.socket()
        self.host_srv.bind(('127.0.0.1', 0))
        self.host_srv.listen(5)
        self.host_port = self.host_srv.getsockname()[1]
        if not (shutil.which('pasta') and shutil.which('nft')):
            return
        try:
            ip('netns', 'add', NS)
            ip('link', 'add', HOST_IF, 'type', 'veth', 'peer', 'name', NS_IF)
            ip('link', 'set', NS_IF, 'netns', NS)
            ip('addr', 'add', '198.18.%d.1/30' % K, 'dev', HOST_IF)
            ip('addr', 'add', '10.213.%d.1/30' % K, 'dev', HOST_IF)
            ip('addr', 'add', '100.63.%d.1/30' % K, 'dev', HOST_IF)
            ip('link', 'set', HOST_IF, 'up')
            for a in (PUBLIC + '/30', PRIVATE + '/30', NAMED + '/30'):
                ip('netns', 'exec', NS, 'ip', 'addr', 'add', a, 'dev', NS_IF)
            ip('netns', 'exec', NS, 'ip', 'link', 'set', NS_IF, 'up')
            ip('netns', 'exec', NS, 'ip', 'link', 'set', 'lo', 'up')
            self.server = subprocess.Popen(['ip', 'netns', 'exec', NS, sys.executable, '-m', 'http.server', '8080',
                                            '--bind', '0.0.0.0'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

            def listening():
                try:
                    socket.create_connection((PUBLIC, 8080), timeout=1).close()
                    return True
                except OSError:
                    return False
            self.ready = wait_until(listening, 20, 'the test web server')
        except Exception:
            self.close_net()
            raise

    def close_net(self):
        if self.server:
            self.server.kill()
            self.server.wait()
        subprocess.run(['ip', 'link', 'del', HOST_IF], capture_output=True)
        subprocess.run(['ip', 'netns', 'del', NS], capture_output=True)

    def close(self):
        self.env.close()
        self.close_net()
        self.dns.close()
        self.host_srv.close()


def egress_client(t, x, what, sandbox):
    """An MCP client for a test that needs egress; None (the test skipped)
    when pasta or nft is missing."""
    if not x.ready:
        t.skip(what, 'pasta (passt) or nft (nftables) missing: scripts/bootstrap installs them')
        return None
    c = x.env.mcp(['--sandbox', sandbox])
    c.initialize()
    return c


def results(out):
    return dict(l.split() for l in out.strip().splitlines())


def test_none(t, x):
    c = x.env.mcp(['--sandbox', 'net-none'])
    c.initialize()
    r = c.sh('ip -br link | cut -d" " -f1')
    t.eq(r['stdout'].split(), ['lo'], 'network none: only loopback')
    r = c.sh('pip download --no-deps -d /tmp/p requests 2>&1 | grep -c "Retrying (Retry(" || true; '
             'python3 -c "import urllib.request; urllib.request.urlopen(\'https://example.com\')"', wait=60)
    t.eq(r['stdout'], '0\n', 'network tools fail at once without a network: pip does not retry')
    t.ok('egress' in r.get('hint', '') and 'network' in r.get('hint', ''),
         'and the result says how to get one (createSandbox {network: "egress"})', r)
    if not x.ready:
        t.skip('network none reaches nothing', 'pasta or nft missing')
        return
    got = results(c.sh(PROBE % (PUBLIC, PRIVATE, x.host_port), wait=60)['stdout'])
    t.eq(set(got.values()), {'refused'}, 'network none reaches nothing, not even the test internet', got)


def test_egress(t, x):
    c = egress_client(t, x, 'egress', 'net-egress')
    if not c:
        return
    t.ok(socket.create_connection((PRIVATE, 8080), timeout=5) is not None, 'the host itself reaches the private server')
    r = c.ok('createSandbox', {'sandboxId': 'net-egress', 'network': 'egress'})
    t.eq(r['created'], True, 'createSandbox with network egress')
    got = results(c.sh(PROBE % (PUBLIC, PRIVATE, x.host_port), wait=60)['stdout'])
    t.eq(got.get(PUBLIC), 'refused', 'egress refuses benchmarking (198.18.0.0/15) destinations', got)
    t.eq(got.get(PRIVATE), 'refused', 'egress refuses private destinations', got)
    t.eq(got.get('169.254.169.254'), 'refused', 'egress refuses link-local (metadata) destinations', got)
    t.eq(got.get('127.0.0.1'), 'refused', "egress does not reach the host's loopback", got)
    r = c.sh('nft flush ruleset 2>&1; echo rc=$?; ip link set eth0 down 2>&1; echo rc=$?')
    t.ok(r['stdout'].count('rc=0') == 0, 'sandbox root cannot change the filter or the interface', r['stdout'])
    t.ok(c.sh('cat /etc/resolv.conf')['stdout'].startswith('nameserver '), 'a resolver is configured')
    daemon = x.env.daemon_pid()
    t.eq(len(pastas(daemon)), 1, 'one pasta serves the sandbox')
    c.ok('destroySandbox', {'sandboxId': 'net-egress'})
    t.ok(wait_until(lambda: not pastas(daemon), 10, 'pasta to exit'), 'pasta ends with the sandbox')


def test_allowed_hosts(t, x):
    c = egress_client(t, x, 'allowedHosts', 'net-allow')
    if not c:
        return
    other = '198.18.%d.1' % K  # the test internet's other end: up, and not listed
    t.ok(socket.create_connection((PUBLIC, 8080), timeout=5) is not None, 'the host reaches the listed server')
    r = c.ok('createSandbox', {'sandboxId': 'net-allow', 'allowedHosts': [PUBLIC + '/32']})
    t.eq(r['created'], True, 'allowedHosts implies egress')
    got = results(c.sh(PROBE % (PUBLIC, PRIVATE, x.host_port), wait=60)['stdout'])
    t.eq(got.get(PUBLIC), 'open', 'a listed address is reached, even in a special-purpose range', got)
    t.eq((got.get(PRIVATE), got.get('169.254.169.254'), got.get('127.0.0.1')), ('refused', 'refused', 'refused'),
         'what is not listed is not reached, nor the host loopback', got)
    srv = socket.socket()
    srv.bind(('198.18.%d.1' % K, 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    r = c.sh('python3 -c "import socket; s = socket.socket(); s.settimeout(5)\ntry: s.connect((\'%s\', %d)); print(\'open\')\n'
             'except OSError: print(\'refused\')"' % (other, port))
    srv.close()
    t.eq(r['stdout'].strip(), 'refused', 'another address of the same network is not reached')
    r = c.sh('getent hosts example.com >/dev/null 2>&1 || echo no-dns; timeout 5 python3 -c "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2); s.sendto(b\'x\', (\'8.8.8.8\', 53)); s.recv(10)" 2>/dev/null || echo no-udp', wait=60)
    t.eq(r['stdout'].split(), ['no-dns', 'no-udp'], 'with no names listed, no DNS and no UDP elsewhere', r)
    s = {s['sandboxId']: s for s in c.ok('listSandboxes')['sandboxes']}['net-allow']
    t.eq((s['network'], s['allowedHosts']), ('egress', [PUBLIC + '/32']), 'listSandboxes shows the policy')
    t.eq(c.err('createSandbox', {'sandboxId': 'net-bad', 'allowedHosts': ['not a host!']}), 'VALIDATION_FAILED',
         'a malformed entry is refused')
    t.eq(c.err('createSandbox', {'sandboxId': 'net-bad', 'network': 'none', 'allowedHosts': [PUBLIC]}),
         'VALIDATION_FAILED', 'allowedHosts with network none is refused')
    c.ok('destroySandbox', {'sandboxId': 'net-allow'})


def connects(c, *hosts):
    """Whether the sandbox reaches port 8080 of each host."""
    r = c.sh('python3 - <<\'PY\'\nimport socket\nfor h in %r:\n    s = socket.socket(); s.settimeout(5)\n'
             '    try:\n        s.connect((h, 8080)); print(h, "open")\n    except OSError:\n        print(h, "refused")\nPY'
             % (list(hosts),), wait=60)
    return results(r['stdout'])


def test_allowed_names(t, x):
    c = egress_client(t, x, 'allowedHosts names', 'net-names')
    if not c:
        return
    t.ok(socket.create_connection((NAMED, 8080), timeout=5) is not None, 'the host reaches the named server')
    hosts = ['ok.test', '*.wild.test', 'priv.test']
    c.ok('createSandbox', {'sandboxId': 'net-names', 'allowedHosts': hosts})
    t.eq(connects(c, NAMED), {NAMED: 'refused'}, 'a listed name\'s address is refused before the name is resolved')
    r = c.sh('getent ahostsv4 ok.test | head -1; getent ahostsv4 a.wild.test | head -1')
    t.eq([l.split()[0] for l in r['stdout'].splitlines()], [NAMED, NAMED],
         'a listed name and a name under a listed *.domain resolve', r)
    t.eq(connects(c, NAMED), {NAMED: 'open'}, 'and the address of the answer is reached, at once')
    x.dns.asked.clear()
    r = c.sh('for n in other.test wild.test ok.test.evil.test; do getent hosts $n >/dev/null && echo $n resolves; '
             'done; echo end', wait=60)
    t.eq(r['stdout'].split(), ['end'], 'names not listed do not resolve (another name, the bare *.domain, a suffix)', r)
    t.eq([n for n in x.dns.asked if n != 'ok.test'], [], 'and the host\'s resolver is never asked for them', x.dns.asked)
    r = c.sh('for i in $(seq 0 47); do (getent ahostsv4 r$i.wild.test >/dev/null || echo FAIL r$i) & done; wait',
             wait=60)
    t.eq(r['stdout'].split(), [], '48 lookups at once of neighbouring addresses all resolve', r)
    r = c.sh('getent ahostsv4 r47.wild.test | head -1; getent ahostsv4 priv.test | head -1')
    t.eq(r['stdout'].split()[:1], ['100.62.%d.48' % K], 'and the names that follow still do', r)
    r = c.sh('getent ahostsv4 priv.test | head -1')
    t.eq(r['stdout'].split()[:1], [PRIVATE], 'a listed name answering a private address resolves', r)
    t.eq(connects(c, PRIVATE, PUBLIC), {PRIVATE: 'refused', PUBLIC: 'refused'},
         'but an answer opens no private or special-purpose address (no DNS rebinding into the host\'s networks)')
    r = c.sh('cat /etc/resolv.conf; timeout 5 python3 -c "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); '
             's.settimeout(2); s.sendto(b\'x\', (\'%s\', 53)); s.recv(10)" 2>/dev/null || echo no-udp' % PUBLIC, wait=30)
    t.ok('nameserver 127.0.0.1' in r['stdout'] and 'no-udp' in r['stdout'],
         'the sandbox\'s resolver is the filter on its own loopback; other DNS servers are not reached', r['stdout'])
    s = {s['sandboxId']: s for s in c.ok('listSandboxes')['sandboxes']}['net-names']
    t.eq(s.get('allowedHosts'), hosts, 'listSandboxes shows the names')
    c.ok('destroySandbox', {'sandboxId': 'net-names'})
    c.ok('createSandbox', {'sandboxId': 'net-names', 'allowedHosts': hosts})
    r = c.sh('getent ahostsv4 ok.test | head -1; getent hosts other.test || echo other-none')
    t.eq(r['stdout'].split()[:1] + r['stdout'].split()[-1:], [NAMED, 'other-none'], 'a new incarnation filters the same way', r)
    t.eq(c.err('createSandbox', {'sandboxId': 'net-bad2', 'allowedHosts': ['exa mple.com']}), 'VALIDATION_FAILED',
         'a malformed name is refused')
    c.ok('destroySandbox', {'sandboxId': 'net-names'})


def pastas(daemon):
    """pasta processes the daemon started."""
    found = []
    for p in os.listdir('/proc'):
        try:
            stat = open('/proc/%s/stat' % p).read()
        except OSError:
            continue
        comm, rest = stat[stat.index('(') + 1:stat.rindex(')')], stat[stat.rindex(')') + 2:].split()
        if comm.startswith('pas') and int(rest[1]) == daemon and rest[0] != 'Z':
            found.append(p)
    return found


if __name__ == '__main__':
    if os.geteuid() != 0:
        print('1..0 # SKIP needs root to make a network namespace')
        sys.exit(77)
    sys.exit(run_tests([test_none, test_egress, test_allowed_hosts, test_allowed_names], Ctx))
