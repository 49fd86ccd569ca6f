"""Background processes: startProcess, its logs and status, waitForPort,
killProcess of a whole tree, and their end with the sandbox."""
import sys

from sbxtest import Ctx, Env, run_tests, wait_until


def status(x, pid):
    return x.c.ok('getProcess', {'processId': pid})


def test_server(t, x):
    c = x.c
    r = c.ok('startProcess', {'processId': 'web', 'command': 'cd /tmp && echo index > index.html && '
                                                             'exec python3 -u -m http.server 8000 --bind 127.0.0.1'})
    t.ok(r['id'] == 'web' and r['status'] == 'running', 'startProcess returns at once, running', r)
    w = c.ok('waitForPort', {'port': 8000, 'mode': 'http', 'timeout': 20000}, timeout=40)
    t.eq(w['ready'], True, 'waitForPort (http) sees the server')
    r = c.sh('python3 -c "import urllib.request; print(urllib.request.urlopen(\'http://127.0.0.1:8000/index.html\').read().decode())"')
    t.eq(r['stdout'], 'index\n\n', 'the server answers inside the sandbox')
    p = status(x, 'web')
    t.ok(p['status'] == 'running' and p.get('pid', 0) > 1, 'getProcess: running, with its pid in the sandbox', p)
    logs = c.ok('getProcessLogs', {'processId': 'web'})
    t.ok('Serving HTTP' in logs['stdout'] and 'GET /index.html' in logs['stderr'], 'logs so far', logs)
    t.ok(any(q['id'] == 'web' for q in c.ok('listProcesses')['processes']), 'listProcesses')
    k = c.ok('killProcess', {'processId': 'web'})
    t.eq(k['killed'], True, 'killProcess')
    t.ok(wait_until(lambda: status(x, 'web')['status'] != 'running', 20, 'the server to stop'), 'it stops')
    p = status(x, 'web')
    t.ok(p['status'] == 'killed' and 'endTime' in p, 'status killed with an end time', p)
    w = c.ok('waitForPort', {'port': 8000, 'timeout': 300})
    t.eq(w['ready'], False, 'waitForPort times out on a closed port')


def test_exit_and_logs(t, x):
    c = x.c
    c.ok('startProcess', {'processId': 'job', 'command': 'for i in 1 2 3 4 5; do echo line$i; done; echo oops >&2; exit 3'})
    t.ok(wait_until(lambda: status(x, 'job')['status'] != 'running', 20, 'the job to end'), 'the job ends')
    p = status(x, 'job')
    t.eq((p['status'], p['exitCode']), ('failed', 3), 'a non-zero exit is failed, with its code')
    logs = c.ok('getProcessLogs', {'processId': 'job', 'tail': 2})
    t.eq((logs['stdout'], logs['stderr']), ('line4\nline5\n', 'oops\n'), 'tail gives the last lines')
    t.eq(c.err('getProcess', {'processId': 'nope'}), 'PROCESS_NOT_FOUND', 'unknown process')
    c.ok('startProcess', {'processId': 'job', 'command': 'true'})
    t.ok(True, 'a finished id can be reused')


def test_tree_and_kill_all(t, x):
    c = x.c
    c.ok('startProcess', {'processId': 'tree', 'command': 'sleep 1000 & sleep 1000 & wait'})
    c.ok('startProcess', {'processId': 'tree2', 'command': 'sleep 1000'})
    wait_until(lambda: c.sh('ps -e -o comm= | grep -c "^sleep$" || true')['stdout'].strip() == '3', 20, 'sleeps')
    r = c.ok('killAllProcesses', {'signal': 'SIGKILL'})
    t.eq(r['count'], 2, 'killAllProcesses signals every running one')
    t.ok(wait_until(lambda: c.sh('ps -e -o comm= | grep -c "^sleep$" || true')['stdout'].strip() == '0', 20,
                    'the trees to die'), 'whole trees die, background children too')


def test_with_sandbox(t, x):
    c = x.c
    c.ok('startProcess', {'sandboxId': 'doomed', 'processId': 'p', 'command': 'sleep 1000'})
    c.ok('destroySandbox', {'sandboxId': 'doomed'})
    c.ok('createSandbox', {'sandboxId': 'doomed'})
    t.eq(c.ok('listProcesses', {'sandboxId': 'doomed'})['processes'], [], 'processes end with their sandbox')
    t.eq(c.err('listProcesses', {'sandboxId': 'never'}), 'SANDBOX_NOT_FOUND', 'listProcesses does not create')


def test_early_signals(t, x):
    """A command cancelled or destroyed the moment it starts: the signal must
    reach the command's supervisor, never a handler it inherited from the
    daemon (which would tell the daemon itself to shut down)."""
    c = x.env.socket_client()
    c.initialize()
    c.ok('createSandbox', {'sandboxId': 'race'})
    for i in range(100):
        c.send({'jsonrpc': '2.0', 'id': 5000 + i, 'method': 'tools/call',
                'params': {'name': 'exec', 'arguments': {'sandboxId': 'race', 'command': 'sleep 30'}}})
        c.notify('notifications/cancelled', {'requestId': 5000 + i})
    for i in range(20):
        c.send({'jsonrpc': '2.0', 'id': 6000 + i, 'method': 'tools/call',
                'params': {'name': 'startProcess', 'arguments': {'sandboxId': 'race%d' % i, 'command': 'sleep 30'}}})
        c.send({'jsonrpc': '2.0', 'id': 7000 + i, 'method': 'tools/call',
                'params': {'name': 'destroySandbox', 'arguments': {'sandboxId': 'race%d' % i}}})
    for i in range(20):
        c.next(lambda m: m.get('id') == 7000 + i, 60)
    t.eq(c.request('ping').get('result'), {}, 'the daemon is still serving')
    log = open(x.env.state + '/daemon.log').read()
    t.ok('shutting down' not in log, 'and never began to shut down', log[-500:])
    gone = lambda: x.c.sh('ps -e -o comm= | grep -c "^sleep$" || true', sandbox='race')['stdout'].strip() == '0'
    t.ok(wait_until(gone, 20, 'cancelled commands to die'), 'every cancelled command is gone')
    c.close()


if __name__ == '__main__':
    sys.exit(run_tests([test_server, test_exit_and_logs, test_tree_and_kill_all, test_with_sandbox, test_early_signals], lambda: Ctx('procs')))
