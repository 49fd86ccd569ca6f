"""MCP protocol over stdio and the socket: golden request/response files,
hostile input, and a daemon that keeps serving everyone else."""
import glob
import re
import json
import os
import socket
import sys
import threading

from sbxtest import Ctx, Env, Fail, run_tests, wait_until

GOLDEN = os.path.join(os.path.dirname(__file__), 'golden')
VOLATILE = {'duration', 'createdAt', 'lastActivity', 'modifiedAt'}


def normalize(v):
    """Ids and times are ignored; everything else compares exactly."""
    if isinstance(v, dict):
        return {k: ('<volatile>' if k in VOLATILE else normalize(x)) for k, x in v.items() if k != 'id'}
    if isinstance(v, list):
        return [normalize(x) for x in v]
    if isinstance(v, str):
        return re.sub(r'\b\d+ ms\b', 'N ms', v)
    return v


def test_golden(t, x):
    """Each tests/golden/NAME.jsonl holds lines {"send": ...} or {"sendRaw": "..."}
    followed by the {"expect": ...} replies, compared after normalising."""
    for path in sorted(glob.glob(os.path.join(GOLDEN, '*.jsonl'))):
        name = os.path.basename(path)[:-6]
        c = x.env.socket_client()
        c.send({'jsonrpc': '2.0', 'method': 'notifications/sbx/hello', 'params': {'defaultSandboxId': 'golden'}})
        ok, diag = True, ''
        for line in open(path):
            line = line.strip()
            if not line:
                continue
            step = json.loads(line)
            if 'send' in step:
                c.send(step['send'])
            elif 'sendRaw' in step:
                c.send_raw(step['sendRaw'].encode() + b'\n')
            else:
                try:
                    got = c.next(lambda m: 'method' not in m, 15)
                except Fail as e:
                    ok, diag = False, 'no reply for %s' % json.dumps(step['expect'])[:200]
                    break
                if normalize(got) != normalize(step['expect']):
                    ok = False
                    diag = 'got:  %s\nwant: %s' % (json.dumps(normalize(got))[:1500],
                                                 json.dumps(normalize(step['expect']))[:1500])
                    break
        c.close()
        t.ok(ok, 'golden ' + name, diag)


M = {'io.modelcontextprotocol/protocolVersion': '2026-07-28', 'io.modelcontextprotocol/clientCapabilities': {}}


def test_modern_era(t, x):
    c = x.env.socket_client()
    r = c.request('server/discover', {'_meta': M})['result']
    t.ok(r['resultType'] == 'complete' and '2026-07-28' in r['supportedVersions'] and '2025-11-25' in r['supportedVersions'],
         'server/discover lists both eras', r)
    t.ok('tools' in r['capabilities'] and 'resources' in r['capabilities'] and r['instructions'], 'discover: capabilities, instructions')
    r = c.request('tools/list', {'_meta': M})['result']
    t.ok(r['resultType'] == 'complete' and r['ttlMs'] > 0 and r['cacheScope'] in ('public', 'private') and len(r['tools']) > 10,
         'modern tools/list carries resultType, ttlMs, cacheScope')
    r = c.request('tools/call', {'_meta': M, 'name': 'exec', 'arguments': {'command': 'echo hi', 'sandboxId': 'proto'}})
    t.ok(r['result']['resultType'] == 'complete' and r['result']['structuredContent']['stdout'] == 'hi\n', 'modern tools/call')
    r = c.request('tools/list', {'_meta': {'io.modelcontextprotocol/protocolVersion': '2026-07-28'}})
    t.eq(r.get('error', {}).get('code'), -32602, 'missing clientCapabilities is -32602')
    r = c.request('tools/list', {'_meta': {'io.modelcontextprotocol/protocolVersion': '3000-01-01',
                                           'io.modelcontextprotocol/clientCapabilities': {}}})
    t.ok(r.get('error', {}).get('code') == -32022 and '2026-07-28' in r['error']['data']['supported'],
         'unsupported version is -32022 with data.supported', r)
    # a client that probes server/discover first, and a legacy one that then initializes, on one connection
    t.eq(c.initialize()['result']['protocolVersion'], '2025-06-18', 'legacy initialize still works after a probe')
    t.ok('resultType' not in c.request('tools/list')['result'], 'legacy results carry no resultType')
    c.close()


def test_resources(t, x):
    x.c.ok('writeFile', {'path': 'res/hello.txt', 'content': 'resource text'})
    x.c.ok('writeFile', {'path': 'res/b.bin', 'content': 'AAEC/w==', 'encoding': 'base64'})
    r = x.c.request('resources/list')['result']['resources']
    t.ok(any(e['uri'] == 'sbx://proto/workspace' for e in r), 'resources/list shows each sandbox /workspace', r)
    r = x.c.request('resources/templates/list')['result']['resourceTemplates']
    t.eq(r[0]['uriTemplate'], 'sbx://{sandboxId}/{+path}', 'resource template')
    r = x.c.request('resources/read', {'uri': 'sbx://proto/workspace/res/hello.txt'})['result']['contents'][0]
    t.eq((r.get('text'), r['mimeType']), ('resource text', 'text/plain'), 'text resource')
    r = x.c.request('resources/read', {'uri': 'sbx://proto/workspace/res/b.bin'})['result']['contents'][0]
    t.eq(r.get('blob'), 'AAEC/w==', 'binary resource as a base64 blob')
    r = x.c.request('resources/read', {'uri': 'sbx://proto/workspace/res'})['result']['contents'][0]
    t.ok(r['mimeType'] == 'application/json' and 'hello.txt' in r['text'], 'a directory reads as a listing')
    r = x.c.request('resources/read', {'uri': 'sbx://proto/workspace/../../etc/shadow'})
    t.eq(r.get('error', {}).get('code'), -32002, 'resources stay inside the sandbox')
    r = x.c.request('resources/read', {'uri': 'sbx://nobody/workspace'})
    t.eq(r.get('error', {}).get('code'), -32002, 'unknown sandbox is resource-not-found')
    for uri in ('sbx://proto/workspace/%FF%FE', 'sbx://proto/workspace/a' + '\u00e9' * 300):
        r = x.c.request('resources/read', {'uri': uri})
        t.eq(r.get('error', {}).get('code'), -32002, 'a path that is not UTF-8, or a long one, is an error: %.40s' % uri, r)
    t.eq(x.c.sh('echo alive', sandbox='proto')['stdout'], 'alive\n', 'and the daemon goes on')


def test_logging(t, x):
    c = x.env.mcp(['--sandbox', 'proto'])
    c.initialize()
    c.request('logging/setLevel', {'level': 'info'})
    c.call('exec', {'command': 'sleep 5', 'timeout': 200})
    logs = [m for m in c.pending if m.get('method') == 'notifications/message']
    t.ok(logs and logs[0]['params']['level'] == 'warning' and 'timed out' in logs[0]['params']['data']['message'],
         'a command killed by its timeout is logged (legacy)', c.pending)
    c.request('logging/setLevel', {'level': 'error'})
    c.pending.clear()
    c.call('exec', {'command': 'sleep 5', 'timeout': 200})
    t.eq([m for m in c.pending if m.get('method') == 'notifications/message'], [], 'below the asked level: silent')
    s = x.env.socket_client()
    meta = dict(M, **{'io.modelcontextprotocol/logLevel': 'warning'})
    s.request('tools/call', {'_meta': meta, 'name': 'exec', 'arguments': {'sandboxId': 'proto', 'command': 'sleep 5', 'timeout': 200}})
    t.ok(any(m.get('method') == 'notifications/message' for m in s.pending), 'modern: logLevel in _meta opts in')
    s.close()
    c.close()


def test_tool_filters(t, x):
    c = x.env.mcp(['--sandbox', 'proto', '--tools', 'exec,readFile'])
    c.initialize()
    t.eq(sorted(tl['name'] for tl in c.request('tools/list')['result']['tools']), ['exec', 'readFile'], '--tools lists only those')
    t.eq(c.request('tools/call', {'name': 'writeFile', 'arguments': {'path': 'x', 'content': ''}}).get('error', {}).get('code'),
         -32602, '--tools: others are not callable')
    c.close()
    r = x.env.run(['mcp', '--tools', 'exec,nosuchtool'])
    t.ok(r.returncode == 2 and b"unknown tool 'nosuchtool'" in r.stderr and b'readFile' in r.stderr,
         '--tools with an unknown name is an error that lists the valid ones', r.stderr[-300:])
    c = x.env.mcp(['--sandbox', 'proto', '--read-only'])
    c.initialize()
    names = [tl['name'] for tl in c.request('tools/list')['result']['tools']]
    t.ok('readFile' in names and 'listFiles' in names and 'exec' not in names and 'writeFile' not in names,
         '--read-only lists only read-only tools', names)
    t.eq(c.request('tools/call', {'name': 'exec', 'arguments': {'command': 'rm -rf /workspace'}}).get('error', {}).get('code'),
         -32602, '--read-only: exec refused')
    c.close()


def test_initialize_versions(t, x):
    for v in ('2024-11-05', '2025-03-26', '2025-06-18', '2025-11-25'):
        r = x.c.request('initialize', {'protocolVersion': v, 'capabilities': {}, 'clientInfo': {'name': 't', 'version': '1'}})
        t.eq(r['result']['protocolVersion'], v, 'initialize answers with the client version %s' % v)
    r = x.c.request('initialize', {'protocolVersion': '1999-01-01', 'capabilities': {}, 'clientInfo': {'name': 't', 'version': '1'}})
    t.eq(r['result']['protocolVersion'], '2025-11-25', 'unknown version gets the newest')
    t.ok('instructions' in r['result'] and 'sandboxId' in r['result']['instructions'], 'instructions teach the model')


def test_tools_list(t, x):
    tools = x.c.request('tools/list')['result']['tools']
    names = [tl['name'] for tl in tools]
    for want in ('createSandbox', 'listSandboxes', 'destroySandbox', 'exec', 'writeFile', 'readFile', 'listFiles',
                 'mkdir', 'deleteFile', 'renameFile', 'moveFile', 'exists', 'createSession', 'setEnvVars'):
        t.ok(want in names, 'tools/list has ' + want)
    good = all(tl.get('title') and tl.get('description') and tl['inputSchema'].get('additionalProperties') is False
               and tl['outputSchema'].get('type') == 'object' and 'readOnlyHint' in tl.get('annotations', {})
               for tl in tools)
    t.ok(good, 'every tool has title, description, strict inputSchema, outputSchema and annotations')
    t.eq(names, [tl['name'] for tl in x.c.request('tools/list')['result']['tools']], 'stable order')


def test_validation(t, x):
    t.eq(x.c.err('exec', {}), 'VALIDATION_FAILED', 'missing required argument')
    t.eq(x.c.err('exec', {'command': 5}), 'VALIDATION_FAILED', 'wrong type')
    t.eq(x.c.err('exec', {'command': 'true', 'bogus': 1}), 'VALIDATION_FAILED', 'unknown argument')
    t.eq(x.c.err('exec', {'command': 'true', 'sandboxId': '../etc'}), 'VALIDATION_FAILED', 'hostile sandbox id')
    t.eq(x.c.err('writeFile', {'path': 'a\u0000b', 'content': ''}), 'VALIDATION_FAILED', 'NUL in a path')
    r = x.c.request('tools/call', {'name': 'noSuchTool', 'arguments': {}})
    t.eq(r.get('error', {}).get('code'), -32602, 'unknown tool is -32602')


def test_hostile_bytes(t, x):
    c = x.env.socket_client()
    c.send_raw(b'{"jsonrpc":"2.0","id":1,"method":"ping"\n')
    r = c.next(lambda m: True)
    t.eq(r.get('error', {}).get('code'), -32700, 'truncated JSON is a parse error')
    c.send_raw(b'{"jsonrpc":"2.0","id":2,"id":3,"method":"ping"}\n')
    r = c.next(lambda m: True)
    t.eq(r.get('error', {}).get('code'), -32700, 'duplicate keys are refused')
    c.send_raw(b'[' * 100000 + b'\n')
    r = c.next(lambda m: True)
    t.eq(r.get('error', {}).get('code'), -32700, 'deep nesting is refused, not a crash')
    c.send_raw(b'\xff\xfe\n')
    r = c.next(lambda m: True)
    t.eq(r.get('error', {}).get('code'), -32700, 'invalid UTF-8 is a parse error')
    c.send_raw(b'[{"jsonrpc":"2.0","id":4,"method":"ping"}]\n')
    r = c.next(lambda m: True)
    t.eq(r.get('error', {}).get('code'), -32600, 'batches are refused')
    c.send_raw(b'{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}\n')
    r = c.next(lambda m: True)
    t.eq(r.get('error', {}).get('code'), -32600, 'object ids are invalid')
    # a 65 MiB line: refused with a clear error, connection still usable
    chunk = b'x' * (1 << 20)
    c.send_raw(b'{"jsonrpc":"2.0","id":5,"method":"ping","params":{"pad":"')
    for _ in range(65):
        c.send_raw(chunk)
    c.send_raw(b'"}}\n')
    r = c.next(lambda m: True, 60)
    t.ok(r.get('error', {}).get('code') == -32600 and '64 MiB' in r['error']['message'], 'oversized message refused', r)
    t.eq(r.get('id'), 5, 'and the refusal answers the request by its id, so the client is not left waiting')
    r = c.request('ping')
    t.eq(r.get('result'), {}, 'the connection still works after an oversized message')
    c.close()


def test_half_message_and_vanish(t, x):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.path.join(x.env.runtime, 'sbx.sock'))
    s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exec","argu')
    s.close()
    t.eq(x.c.request('ping')['result'], {}, 'daemon serves others after a client vanished mid-message')


def test_disconnect_cancels(t, x):
    c = x.env.socket_client()
    c.send({'jsonrpc': '2.0', 'id': 1, 'method': 'tools/call',
            'params': {'name': 'exec', 'arguments': {'sandboxId': 'proto', 'command': 'echo up; sleep 300'},
                       '_meta': {'progressToken': 1}}})
    c.next(lambda m: m.get('method') == 'notifications/progress')
    c.close()
    gone = lambda: x.c.sh('ps -e -o comm= | grep -c "^sleep$" || true')['stdout'].strip() == '0'
    t.ok(wait_until(gone, 20, 'the call to be cancelled'), 'a client that disconnects mid-call has its work cancelled')


def test_many_clients(t, x):
    clients = [x.env.socket_client() for _ in range(200)]
    errors = []

    def work(i, c):
        try:
            r = c.request('ping', timeout=60)
            if r.get('result') != {}:
                errors.append(r)
        except Exception as e:
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i, c)) for i, c in enumerate(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(90)
    t.eq(errors, [], '200 clients at once all get answers')
    for c in clients:
        c.close()


def test_peer_uid_checked(t, x):
    pid = os.fork()
    if pid == 0:
        try:
            os.setgid(65534)
            os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(os.path.join(x.env.runtime, 'sbx.sock'))
            os._exit(3)
        except PermissionError:
            os._exit(0)
        except Exception:
            os._exit(1)
    _, st = os.waitpid(pid, 0)
    t.eq(os.waitstatus_to_exitcode(st), 0, 'another user cannot reach the socket')
    mode = os.stat(os.path.join(x.env.runtime, 'sbx.sock')).st_mode & 0o777
    t.eq(oct(mode), oct(0o600), 'socket is mode 0600')


def test_stdout_is_mcp_only(t, x):
    c = x.env.mcp(['--sandbox', 'proto'])
    c.initialize()
    c.call('exec', {'command': 'echo noise; echo more >&2'}, progress=True)
    c.close()
    bad = [m for m in c.pending if '_unparsable' in m]
    t.eq(bad, [], 'nothing but JSON-RPC lines on stdout')
    t.ok(c.p.returncode == 0, 'sbx mcp exits 0 on stdin EOF')


if __name__ == '__main__':
    sys.exit(run_tests([test_golden, test_modern_era, test_resources, test_logging, test_tool_filters, test_initialize_versions, test_tools_list, test_validation, test_hostile_bytes,
                        test_half_message_and_vanish, test_disconnect_cancels, test_many_clients, test_peer_uid_checked,
                        test_stdout_is_mcp_only], lambda: Ctx('proto')))
