"""Background processes: startProcess, its logs and status, waitForPort,
waitForLog, waitForExit and streamProcessLogs, killProcess of a whole tree,
and their end with the sandbox."""
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
    logs = c.ok('getProcessLogs', {'processId': 'web'})
    t.ok('"GET / HTTP/1.0"' in logs['stderr'] and 'Traceback' not in logs['stderr'] and 'reset' not in logs['stderr'],
         'its probe is a whole request and answer: the server logs it as one, and no reset', logs['stderr'][-400:])
    r = c.sh('python3 -c "import urllib.request; print(urllib.request.urlopen(\'http://127.0.0.1:8000/index.html\').read().decode())"')
    t.eq(r['stdout'], 'index\n\n', 'the server answers inside the sandbox')
    p = status(x, 'web')
    t.ok(p['status'] == 'running' and p.get('pid', 0) > 1, 'getProcess: running, with its pid in the sandbox', p)
    logs = c.ok('getProcessLogs', {'processId': 'web'})
    t.ok('Serving HTTP' in logs['stdout'] and 'GET /index.html' in logs['stderr'], 'logs so far', logs)
    t.ok(any(q['id'] == 'web' for q in c.ok('listProcesses')['processes']), 'listProcesses')
    k = c.ok('killProcess', {'processId': 'web'})
    t.ok(k['killed'] is True and k.get('status') == 'killed', 'killProcess answers once the process has ended', k)
    p = status(x, 'web')
    t.ok(p['status'] == 'killed' and 'endTime' in p, 'getProcess right after says killed, with an end time', p)
    w = c.ok('waitForPort', {'port': 8000, 'timeout': 300})
    t.eq(w['ready'], False, 'waitForPort times out on a closed port')


def test_kill_waits(t, x):
    c = x.c
    got = [c.ok('startProcess', {'processId': 'p%d' % i, 'command': 'exec sleep 1000'}) for i in range(5)]
    t.ok(all(isinstance(g.get('pid'), int) and g['pid'] > 1 for g in got), 'startProcess gives the pid every time',
         [g.get('pid') for g in got])
    r = c.sh('kill -0 %s && echo all there' % ' '.join(str(g.get('pid')) for g in got))
    t.eq(r['stdout'], 'all there\n', 'the pids of the commands, as the sandbox sees them', r)
    c.ok('killAllProcesses', {'signal': 'SIGKILL'})
    c.ok('createSession', {'id': 'bg', 'env': {'WHO': 'bg'}})
    c.ok('startProcess', {'processId': 'insess', 'sessionId': 'bg', 'command': 'echo $WHO; exec sleep 1000'})
    c.ok('deleteSession', {'id': 'bg'})
    t.eq((status(x, 'insess')['status'], c.ok('waitForLog', {'processId': 'insess', 'pattern': '^bg$', 'timeout': 20000}, 40)['line']),
         ('running', 'bg'), 'a session a background process started from can be deleted; the process runs on, with its state')
    c.ok('killProcess', {'processId': 'insess', 'signal': 'SIGKILL'})
    c.ok('startProcess', {'processId': 'stubborn', 'command': 'trap "echo got it" TERM USR1; echo ready; '
                          'while :; do sleep 0.1; done'})
    c.ok('waitForLog', {'processId': 'stubborn', 'pattern': '^ready$', 'timeout': 20000}, 40)
    k = c.ok('killProcess', {'processId': 'stubborn'}, 30)
    t.ok(k['killed'] is True and k.get('status') == 'running', 'a process that catches SIGTERM is said to run on', k)
    t.eq(status(x, 'stubborn')['status'], 'running', 'and getProcess agrees')
    k = c.ok('killProcess', {'processId': 'stubborn', 'signal': 'SIGUSR1'})
    t.ok(k['killed'] is True and k.get('status') == 'running', 'a signal that does not ask it to stop is not waited on', k)
    k = c.ok('killProcess', {'processId': 'stubborn', 'signal': 'SIGKILL'}, 30)
    t.eq((k.get('status'), k.get('exitCode')), ('killed', 137), 'SIGKILL: ended, with its exit code')
    t.eq(status(x, 'stubborn')['status'], 'killed', 'getProcess says so too')
    k = c.ok('killProcess', {'processId': 'stubborn'})
    t.eq((k['killed'], k.get('status')), (False, 'killed'), 'killing it again says it had ended')


def test_python_unbuffered(t, x):
    c = x.c
    c.ok('startProcess', {'processId': 'py', 'command': 'exec python3 -c "print(\'ready\'); import time; time.sleep(1000)"'})
    r = c.ok('waitForLog', {'processId': 'py', 'pattern': '^ready$', 'timeout': 20000}, 40)
    t.eq(r['line'], 'ready', 'a Python server\'s line reaches its logs as printed (no -u needed)')
    c.ok('killProcess', {'processId': 'py', 'signal': 'SIGKILL'})
    res, _ = c.call('startProcess', {'processId': 'py', 'command': 'exit 0'})
    t.ok('in place of the finished process' in res['content'][0]['text'],
         'a new process under a finished one\'s name says it replaces it', res['content'][0]['text'])


def test_calls_bounded(t, x):
    """A client's calls in progress are bounded (256 on a connection): more
    are refused at once, and the daemon serves the rest."""
    c = x.c
    c.ok('startProcess', {'processId': 'quiet', 'command': 'exec sleep 1000'})
    ids = [next(c.ids) for _ in range(300)]
    for i in ids:
        c.send({'jsonrpc': '2.0', 'id': i, 'method': 'tools/call',
                'params': {'name': 'waitForLog', 'arguments': {'processId': 'quiet', 'pattern': 'never', 'timeout': 60000}}})
    refused = [c.next(lambda m: m.get('id') in ids and 'method' not in m, 20) for _ in range(44)]
    t.eq({r['result']['structuredContent']['error']['code'] for r in refused}, {'RESOURCE_LIMIT'},
         'past 256 calls in progress on a connection, more are refused at once', refused[0])
    other = x.env.mcp(['--sandbox', 'procs'])  # another connection has calls of its own
    other.initialize()
    other.ok('killProcess', {'processId': 'quiet', 'signal': 'SIGKILL'}, 20)
    other.close()
    ended = [c.next(lambda m: m.get('id') in ids and 'method' not in m, 20) for _ in range(256)]
    t.eq({r['result']['structuredContent']['error']['code'] for r in ended}, {'PROCESS_EXITED'},
         'the calls that waited are answered when the process ends')


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
    c.sh('mkdir -p /workspace/pdir')
    c.ok('startProcess', {'processId': 'where', 'command': 'pwd', 'cwd': 'pdir'})
    t.ok(wait_until(lambda: status(x, 'where')['status'] != 'running', 20, 'pwd to end'), 'pwd ends')
    t.eq(c.ok('getProcessLogs', {'processId': 'where'})['stdout'], '/workspace/pdir\n', 'a relative cwd is under /workspace')


def test_tree_and_kill_all(t, x):
    c = x.c
    c.ok('startProcess', {'processId': 'tree', 'command': 'sleep 1000 & sleep 1000 & wait'})
    c.ok('startProcess', {'processId': 'tree2', 'command': 'sleep 1000'})
    wait_until(lambda: c.sh('ps -e -o comm= | grep -c "^sleep$" || true')['stdout'].strip() == '3', 20, 'sleeps')
    r = c.ok('killAllProcesses', {'signal': 'SIGKILL'})
    t.eq((r['count'], r.get('running')), (2, 0), 'killAllProcesses signals every running one and answers once they ended')
    t.eq({q['id']: q['status'] for q in c.ok('listProcesses')['processes'] if q['id'] in ('tree', 'tree2')},
         {'tree': 'killed', 'tree2': 'killed'}, 'listProcesses right after says so')
    t.ok(wait_until(lambda: c.sh('ps -e -o comm= | grep -c "^sleep$" || true')['stdout'].strip() == '0', 20,
                    'the trees to die'), 'whole trees die, background children too')


def test_with_sandbox(t, x):
    c = x.c
    c.ok('startProcess', {'sandboxId': 'doomed', 'processId': 'p', 'command': 'sleep 1000'})
    c.ok('destroySandbox', {'sandboxId': 'doomed'})
    c.ok('createSandbox', {'sandboxId': 'doomed'})
    t.eq(c.ok('listProcesses', {'sandboxId': 'doomed'})['processes'], [], 'processes end with their sandbox')
    t.eq(c.err('listProcesses', {'sandboxId': 'never'}), 'SANDBOX_NOT_FOUND', 'listProcesses does not create')


def test_signals_reach_command(t, x):
    """A signal that does not ask a process to stop (HUP to reload, USR1,
    USR2) reaches the command, which handles it and runs on: the shell sbx
    runs it in does not die of it (and take the command with it)."""
    c = x.c
    prog = ('import signal, time\n'
            'for s in (signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):\n'
            '    signal.signal(s, lambda n, f: print("got", signal.Signals(n).name, flush=True))\n'
            'print("ready", flush=True)\n'
            'time.sleep(600)\n')
    c.ok('writeFile', {'path': '/workspace/handler.py', 'content': prog})
    c.ok('startProcess', {'processId': 'reload', 'command': 'cd /workspace && python3 -u handler.py; echo after'})
    c.ok('waitForLog', {'processId': 'reload', 'pattern': '^ready$', 'timeout': 20000}, 40)
    for sig in ('SIGHUP', 'SIGUSR1', 'SIGUSR2'):
        k = c.ok('killProcess', {'processId': 'reload', 'signal': sig})
        t.ok(k['killed'] is True and k.get('status') == 'running', sig + ' is sent, and the process is said to run on', k)
        w = c.ok('waitForLog', {'processId': 'reload', 'pattern': '^got %s$' % sig, 'timeout': 20000}, 40)
        t.ok(w.get('line', '').strip() == 'got ' + sig or 'got ' + sig in str(w), 'the command handled ' + sig, w)
    t.eq(status(x, 'reload')['status'], 'running', 'and it still runs')
    k = c.ok('killProcess', {'processId': 'reload'}, 30)
    t.eq(k.get('status'), 'killed', 'SIGTERM ends it')
    t.ok('after' not in c.ok('getProcessLogs', {'processId': 'reload'})['stdout'], 'the whole command, not the python alone')


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


def test_wait_for_log_and_exit(t, x):
    c = x.c
    c.ok('startProcess', {'processId': 'srv', 'command': 'echo booting; sleep 0.3; echo "db ready" >&2; sleep 0.3; '
                                                         'echo "listening on :8080"; exec sleep 1000'})
    r = c.ok('waitForLog', {'processId': 'srv', 'pattern': 'listening on :[0-9]+', 'timeout': 20000}, 40)
    t.eq((r['line'], r['stream']), ('listening on :8080', 'stdout'), 'waitForLog answers with the matching line')
    r = c.ok('waitForLog', {'processId': 'srv', 'pattern': '^db', 'timeout': 20000}, 40)
    t.eq((r['line'], r['stream']), ('db ready', 'stderr'), 'output printed before the call counts, stderr too')
    t.eq(c.err('waitForLog', {'processId': 'srv', 'pattern': 'never', 'timeout': 500}), 'COMMAND_TIMEOUT',
         'no match within the timeout is COMMAND_TIMEOUT')
    t.eq(c.err('waitForLog', {'processId': 'srv', 'pattern': '(unclosed'}), 'VALIDATION_FAILED', 'a bad pattern is refused')
    for bomb in ('(((a{1,100}){1,100}){1,100}){1,100}', '(a*)*\\1b'):
        t.eq(c.err('waitForLog', {'processId': 'srv', 'pattern': bomb}, 10), 'VALIDATION_FAILED',
             'a pattern that would make matching explode is refused at once: %s' % bomb)
    t.eq(c.err('waitForExit', {'processId': 'srv', 'timeout': 300}), 'COMMAND_TIMEOUT', 'waitForExit times out while it runs')
    c.ok('startProcess', {'processId': 'quit', 'command': 'sleep 0.5; exit 7'})
    r = c.ok('waitForExit', {'processId': 'quit', 'timeout': 20000}, 40)
    t.eq((r['exitCode'], r['status']), (7, 'failed'), 'waitForExit answers with the exit code once it ends')
    t.eq(c.ok('waitForExit', {'processId': 'quit'})['exitCode'], 7, 'and at once for one that has ended')
    t.eq(c.err('waitForLog', {'processId': 'quit', 'pattern': 'x'}), 'PROCESS_EXITED',
         'waitForLog on an ended process without the line: PROCESS_EXITED')
    c.ok('startProcess', {'processId': 'ask', 'command': 'printf "Password: "; exec sleep 1000'})
    r = c.ok('waitForLog', {'processId': 'ask', 'pattern': 'Password: $', 'timeout': 20000}, 40)
    t.eq(r['line'], 'Password: ', 'a prompt not ended by a newline can be waited for')
    c.ok('killProcess', {'processId': 'ask'})
    c.ok('killProcess', {'processId': 'srv'})


def test_costly_pattern(t, x):
    """A pattern that is slow to match on the lines a process prints
    ("(((a|b){32}){32}){32}c" takes glibc minutes on a 64 KiB line) slows
    its own wait, never the daemon: it is matched by a child in the
    sandbox's cgroups. One that cannot keep up with the output ends with
    RESOURCE_LIMIT rather than hold more of it."""
    c = x.c
    c.ok('startProcess', {'processId': 'long', 'command': 'python3 -c "print((\'ab\' * 32767 + \'\\n\') * 3, end=\'\', '
                                                          'flush=True)"; exec sleep 1000'})
    c.ok('waitForLog', {'processId': 'long', 'pattern': '^(ab){16}', 'timeout': 20000}, 40)
    other = x.env.socket_client()
    other.initialize()
    # one connection, in order: the wait is under way before the list is read
    other.send({'jsonrpc': '2.0', 'id': 'w', 'method': 'tools/call', 'params': {'name': 'waitForLog', 'arguments': {
        'sandboxId': 'procs', 'processId': 'long', 'pattern': '(((a|b){32}){32}){32}c', 'timeout': 3000}}})
    other.send({'jsonrpc': '2.0', 'id': 'l', 'method': 'tools/call', 'params': {'name': 'listSandboxes'}})
    r = other.next(lambda m: m.get('id') in ('l', 'w'))
    t.eq(r['id'], 'l', 'a call after it answers while the costly match goes on (the daemon is not matching)')
    t.eq(c.sh('echo quick')['stdout'], 'quick\n', 'commands too, in the same sandbox')
    r = other.next(lambda m: m.get('id') == 'w')
    t.eq(r['result']['structuredContent'].get('error', {}).get('code'), 'COMMAND_TIMEOUT', 'the wait ends at its timeout',
         r)
    # slow to compile: glibc's regcomp takes seconds on "((a*|b*){24})*",
    # twice as long for each count more
    other.send({'jsonrpc': '2.0', 'id': 'cw', 'method': 'tools/call', 'params': {'name': 'waitForLog', 'arguments': {
        'sandboxId': 'procs', 'processId': 'long', 'pattern': '((a*|b*){24})*', 'timeout': 1500}}})
    other.send({'jsonrpc': '2.0', 'id': 'l2', 'method': 'tools/call', 'params': {'name': 'listSandboxes'}})
    r = other.next(lambda m: m.get('id') in ('l2', 'cw'))
    t.eq(r['id'], 'l2', 'a call after a pattern slow to compile answers first (the daemon does not compile it)')
    e = other.next(lambda m: m.get('id') == 'cw', 30)['result']['structuredContent'].get('error', {})
    t.ok(e.get('code') == 'COMMAND_TIMEOUT' and 'compiled' in e.get('message', ''),
         'and that wait ends at its own timeout, saying the pattern was still being compiled', e)
    c.ok('startProcess', {'processId': 'ended', 'command': 'echo hello'})
    c.ok('waitForExit', {'processId': 'ended', 'timeout': 10000})
    e = c.call('waitForLog', {'processId': 'ended', 'pattern': '((a*|b*){32})*'}, 120)[0]['structuredContent']
    t.ok(e.get('error', {}).get('code') == 'RESOURCE_LIMIT' and 'compiling' in e['error'].get('message', ''),
         'a pattern that would take hours to compile ends its wait (no timeout, on an ended process) after 10 s of CPU', e)
    c.ok('startProcess', {'processId': 'silent', 'command': 'true'})
    c.ok('waitForExit', {'processId': 'silent', 'timeout': 10000})
    t.eq(c.err('waitForLog', {'processId': 'silent', 'pattern': 'a('}), 'VALIDATION_FAILED',
         'a bad pattern on a process that ended without a line is VALIDATION_FAILED, not PROCESS_EXITED')
    e = c.call('waitForLog', {'processId': 'long', 'pattern': 'a(b', 'timeout': 5000}, 30)[0]['structuredContent']
    t.ok(e.get('error', {}).get('code') == 'VALIDATION_FAILED' and 'Unmatched (' in e['error'].get('message', ''),
         'a pattern that does not compile is VALIDATION_FAILED, in regcomp\'s words', e)
    c.ok('startProcess', {'processId': 'flood', 'command': 'python3 -c "print((\'a\' * 65535 + \'\\n\') * 100, end=\'\', '
                                                           'flush=True)"; exec sleep 1000'})
    r = c.call('waitForLog', {'processId': 'flood', 'pattern': '(.*a){32}x', 'timeout': 30000}, 60)[0]
    t.ok(r['structuredContent'].get('error', {}).get('code') == 'RESOURCE_LIMIT'
         and 'behind' in r['structuredContent']['error']['message'],
         'a match that falls 4 MiB behind the output ends with RESOURCE_LIMIT, not by holding more', r)
    c.ok('killProcess', {'processId': 'flood'})
    c.ok('killProcess', {'processId': 'long'})
    # nearly 4 MiB behind when the process ends on a long line without a
    # newline: the last feed is the one that fails (the daemon crashed)
    prog = ("import sys\nw = sys.stdout.write\nw('ab' * 32767 + '\\n')\nfor i in range(68): w('x' * 60000 + '\\n')\n"
            "w('x' * 8770 + '\\n')\nw('y' * 65536)\nsys.stdout.flush()\n")
    c.ok('writeFile', {'path': '/workspace/prog.py', 'content': prog})
    c.ok('startProcess', {'processId': 'edge', 'command': 'python3 /workspace/prog.py'})
    r = c.call('waitForLog', {'processId': 'edge', 'pattern': '(((a|b){32}){32}){32}c', 'timeout': 20000}, 60)[0]
    t.eq(r['structuredContent'].get('error', {}).get('code'), 'RESOURCE_LIMIT',
         'one that falls behind on the last line of a process that ended answers so', r)
    # the process's record replaced while its last lines are still matched
    c.ok('startProcess', {'processId': 'gone', 'command': "python3 -c \"print('ab' * 7000)\""})
    other.send({'jsonrpc': '2.0', 'id': 'g', 'method': 'tools/call', 'params': {'name': 'waitForLog', 'arguments': {
        'sandboxId': 'procs', 'processId': 'gone', 'pattern': '(((a|b){32}){32}){32}c', 'timeout': 60000}}})
    c.ok('waitForExit', {'processId': 'gone', 'timeout': 20000}, 40)
    c.ok('startProcess', {'processId': 'gone', 'command': 'true'})
    r = other.next(lambda m: m.get('id') == 'g', 60)
    t.ok('ended (completed, exit code 0)' in r['result']['structuredContent'].get('error', {}).get('message', ''),
         'a wait whose process record was replaced meanwhile still says how the process it waited on ended', r)
    t.ok(c.ok('listSandboxes')['sandboxes'], 'and the daemon is there')
    # empty lines cost the daemon too: counted toward the 4 MiB
    c.ok('startProcess', {'processId': 'empty', 'command': "python3 -c \"print('ab' * 32767)\"; exec yes ''"})
    r = c.call('waitForLog', {'processId': 'empty', 'pattern': '(((a|b){32}){32}){32}c', 'timeout': 30000}, 60)[0]
    with open('/proc/%d/status' % x.env.daemon_pid()) as f:
        rss = next(int(l.split()[1]) for l in f if l.startswith('VmRSS:')) // 1024
    t.ok(r['structuredContent'].get('error', {}).get('code') == 'RESOURCE_LIMIT' and rss < 200,
         'endless empty lines behind a slow match end the wait too, the daemon at %d MB' % rss, r)
    c.ok('killProcess', {'processId': 'empty', 'signal': 'SIGKILL'})

def test_logs_bounded_in_all(t, x):
    """Background processes' logs are held in the daemon's memory (1 MiB of
    each stream), up to 256 MiB for all of them and a quarter of that for
    one sandbox's: a process started past it keeps 16 KiB of each in
    memory, its whole output in its file; one sandbox cannot take it all
    from the others; a destroyed sandbox's records give theirs back."""
    c = x.c

    def kept(sid, pid, ch):
        c.ok('startProcess', {'sandboxId': sid, 'processId': pid,
                              'command': 'head -c 300000 /dev/zero | tr "\\0" %s' % ch})
        c.ok('waitForExit', {'sandboxId': sid, 'processId': pid, 'timeout': 30000}, 60)
        r = c.ok('getProcessLogs', {'sandboxId': sid, 'processId': pid})
        return r['stdout'].count(ch), r

    def fill(sid, n):
        """n records of processes that have ended (a destroy orphans the
        ones still running, which hold their logs until they end)"""
        for i in range(n):
            c.ok('startProcess', {'sandboxId': sid, 'processId': 'p%d' % i, 'command': 'true'})
        for i in range(n):
            c.ok('waitForExit', {'sandboxId': sid, 'processId': 'p%d' % i, 'timeout': 30000}, 60)
    fill('lg0', 32)
    n, r = kept('lg0', 'big', 'a')
    t.ok(n <= 16 * 1024 and 'omitted' in r['stdout'] and r.get('outputPath'),
         'past 64 MiB of logs held for one sandbox, its next process keeps 16 KiB of a stream in memory (%d bytes)' % n)
    t.eq(c.sh('wc -c < %s' % r['outputPath'], sandbox='lg0')['stdout'].strip(), '300000', 'its file has all of it')
    t.eq(kept('lg1', 'big', 'b')[0], 300000, 'another sandbox\'s process keeps its MiB: one sandbox took its share only')
    fill('lg1', 31)
    fill('lg2', 32)
    fill('lg3', 32)
    t.ok(kept('lg4', 'big', 'c')[0] <= 16 * 1024, 'past 256 MiB held for all, every new process keeps 16 KiB')
    c.ok('destroySandbox', {'sandboxId': 'lg3'})
    t.eq(kept('lg4', 'big2', 'd')[0], 300000, 'once a sandbox with 32 records is destroyed, a new process keeps its MiB again')
    for sid in ('lg0', 'lg1', 'lg2', 'lg4'):
        c.ok('destroySandbox', {'sandboxId': sid})

def test_stream_logs(t, x):
    c = x.c
    c.ok('startProcess', {'processId': 'ticker', 'command': 'echo first; for i in 1 2 3; do sleep 0.2; echo tick$i; done'})
    r, notes = c.call('streamProcessLogs', {'processId': 'ticker', 'timeout': 20000}, 40, progress=True)
    text = ''.join(n['params'].get('message', '') for n in notes)
    t.ok(not r['isError'] and r['structuredContent']['exitCode'] == 0, 'streamProcessLogs answers when the process ends', r)
    t.ok('first' in text and 'tick3' in text, 'after sending its output as progress, buffered then live', text)
    # cancelling the stream ends the call, not the process
    c.ok('startProcess', {'processId': 'long', 'command': 'while :; do echo alive; sleep 0.2; done'})
    i = next(c.ids)
    c.send({'jsonrpc': '2.0', 'id': i, 'method': 'tools/call',
            'params': {'name': 'streamProcessLogs', 'arguments': {'processId': 'long'}, '_meta': {'progressToken': 'sl'}}})
    c.next(lambda m: m.get('method') == 'notifications/progress' and m['params'].get('progressToken') == 'sl', 20)
    c.notify('notifications/cancelled', {'requestId': i})
    t.eq(status(x, 'long')['status'], 'running', 'a cancelled stream leaves the process running')
    c.ok('killProcess', {'processId': 'long'})


def rss_kib(pid):
    with open('/proc/%d/status' % pid) as f:
        return int(next(l for l in f if l.startswith('VmRSS:')).split()[1])


def test_output_flood(t, x):
    # sixteen processes printing forever: the daemon reads a sandbox's output
    # at a bounded rate (the writers wait on full pipes), so it keeps serving
    # that sandbox and its neighbours, and loses none of what it reads
    c = x.c
    n = 16
    for i in range(n):
        c.ok('startProcess', {'sandboxId': 'flood', 'processId': 'yes-%d' % i, 'command': 'yes flood'})
    pid = x.env.daemon_pid()
    t.ok(wait_until(lambda: all(len(c.ok('getProcessLogs', {'sandboxId': 'flood', 'processId': 'yes-%d' % i})
                                    ['stdout']) > 0 for i in range(n)), 20, 'every flood to print'),
         'sixteen background processes print forever')
    rss0 = rss_kib(pid)
    for i in range(5):
        t.eq(c.sh('echo neighbour %d' % i, sandbox='flood-neighbour')['stdout'], 'neighbour %d\n' % i,
             'a neighbour sandbox answers meanwhile (%d)' % i)
        t.eq(c.sh('echo same %d' % i, sandbox='flood')['stdout'], 'same %d\n' % i,
             'the flooding sandbox answers too (%d)' % i)
    r = c.sh("head -c 8388608 /dev/zero | tr '\\0' a", sandbox='flood')
    t.ok(r['truncated'] and r.get('outputPath'), 'a command printing 8 MiB there meanwhile spills its output', r.keys())
    w = c.sh('wc -c < %s && tr -d a < %s | wc -c' % (r['outputPath'], r['outputPath']), sandbox='flood')
    t.eq(w['stdout'], '8388608\n0\n', 'every byte of it, in order of arrival, none lost while output waited')
    c.ok('writeFile', {'sandboxId': 'flood', 'path': '/workspace/f.txt', 'content': 'kept'})
    t.eq(c.ok('readFile', {'sandboxId': 'flood', 'path': '/workspace/f.txt'})['content'], 'kept', 'files API too')
    logs = c.ok('getProcessLogs', {'sandboxId': 'flood', 'processId': 'yes-7', 'tail': 2})
    t.eq(logs['stdout'], 'flood\nflood\n', "a flood's log tail is whole lines of what it prints")
    grown = rss_kib(pid) - rss0
    t.ok(grown < 64 * 1024, "the daemon's memory stays bounded while they print", '%d KiB more' % grown)
    for i in range(n):
        c.ok('killProcess', {'sandboxId': 'flood', 'processId': 'yes-%d' % i})
    t.ok(wait_until(lambda: all(q['status'] == 'killed' for q in
                                c.ok('listProcesses', {'sandboxId': 'flood'})['processes']), 20, 'the floods to end'),
         'and they are killed')


if __name__ == '__main__':
    sys.exit(run_tests([test_server, test_kill_waits, test_python_unbuffered, test_calls_bounded, test_exit_and_logs, test_tree_and_kill_all, test_with_sandbox, test_signals_reach_command, test_early_signals,
                        test_wait_for_log_and_exit, test_costly_pattern, test_logs_bounded_in_all, test_stream_logs, test_output_flood], lambda: Ctx('procs')))
