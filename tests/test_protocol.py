"""MCP protocol over stdio and the socket: golden request/response files,
hostile input, and a daemon that keeps serving everyone else."""
import glob
import json
import os
import socket
import sys
import threading

from sbxtest import Env, Fail, run_tests

GOLDEN = os.path.join(os.path.dirname(__file__), 'golden')
VOLATILE = {'duration', 'createdAt', 'lastActivity', 'modifiedAt'}


def normalize(v):
    """Ids and times are ignored; everything else compares exactly."""
    if isinstance(v, dict):
        return {k: ('<volatile>' if k in VOLATILE else normalize(x)) for k, x in v.items() if k != 'id'}
    if isinstance(v, list):
        return [normalize(x) for x in v]
    return v


class Ctx:
    def __init__(self):
        self.env = Env()
        self.c = self.env.mcp(['--sandbox', 'proto'])
        self.c.initialize()

    def close(self):
        self.env.close()


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
    t.ok(r.get('error', {}).get('code') == -32700 and '64 MiB' in r['error']['message'], 'oversized message refused', r)
    r = c.request('ping')
    t.eq(r.get('result'), {}, 'the connection still works after an oversized message')
    c.close()


def test_half_message_and_vanish(t, x):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.path.join(x.env.runtime, 'sbx.sock'))
    s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exec","argu')
    s.close()
    t.eq(x.c.request('ping')['result'], {}, 'daemon serves others after a client vanished mid-message')


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
    sys.exit(run_tests([test_golden, test_initialize_versions, test_tools_list, test_validation, test_hostile_bytes,
                        test_half_message_and_vanish, test_many_clients, test_peer_uid_checked,
                        test_stdout_is_mcp_only], Ctx))
