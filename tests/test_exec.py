"""exec over MCP (stdio relay): results, sessions, stdin, env, timeouts,
cancellation, progress, output bounds, UTF-8."""
import json
import os
import sys
import time

from sbxtest import Ctx, Env, Fail, left_running, run_tests, wait_until


def test_basic(t, x):
    r = x.c.sh('echo out; echo err >&2; exit 7')
    t.eq((r['stdout'], r['stderr'], r['exitCode'], r['success']), ('out\n', 'err\n', 7, False), 'stdout, stderr, exit code')
    t.ok(isinstance(r['duration'], int) and r['duration'] >= 0, 'duration reported')
    r = x.c.sh('true')
    t.ok(r['success'] and r['exitCode'] == 0, 'success on exit 0')
    res, _ = x.c.call('exec', {'command': 'echo hi'})
    t.ok(res['content'][0]['type'] == 'text' and 'hi' in res['content'][0]['text'], 'text rendering has the output')


def test_default_sandbox(t, x):
    r = x.c.ok('listSandboxes')
    t.ok(any(s['sandboxId'] == 'ex' for s in r['sandboxes']), '--sandbox names the default sandbox')
    r = x.c.sh('hostname')
    t.eq(r['stdout'].strip(), 'ex', 'hostname is the sandbox id')


def test_session_state(t, x):
    x.c.sh('mkdir -p /workspace/d && cd /workspace/d && export FOO="a b\'c"')
    r = x.c.sh('pwd; printf %s "$FOO"')
    t.eq(r['stdout'], "/workspace/d\na b'c", 'cd and export persist in the default session')
    r = x.c.sh('pwd', cwd='/tmp')
    t.eq(r['stdout'].strip(), '/tmp', 'cwd argument applies to the call')
    r = x.c.sh('echo "$ONCE"', env={'ONCE': 'yes'})
    t.eq(r['stdout'].strip(), 'yes', 'env argument reaches the command')
    r = x.c.sh('echo "[$ONCE]"')
    t.eq(r['stdout'].strip(), '[]', 'env argument does not stick to the session')
    x.c.sh('unset FOO')
    t.eq(x.c.sh('echo "[$FOO]"')['stdout'].strip(), '[]', 'unset persists')
    s = x.c.ok('createSession', {'id': 'other', 'cwd': '/tmp', 'env': {'S': '1'}})
    t.eq(s, {'id': 'other', 'cwd': '/tmp'}, 'createSession')
    r = x.c.sh('pwd; echo $S', sessionId='other')
    t.eq(r['stdout'], '/tmp\n1\n', 'named session has its own cwd and env')
    t.eq(x.c.sh('pwd')['stdout'].strip(), '/workspace/d', 'default session untouched')
    t.eq(x.c.err('exec', {'command': 'true', 'sessionId': 'nope'}), 'SESSION_NOT_FOUND', 'unknown session')
    x.c.ok('setEnvVars', {'env': {'SET': 'v'}})
    t.eq(x.c.sh('echo $SET')['stdout'].strip(), 'v', 'setEnvVars')
    t.ok(any(s['id'] == 'other' for s in x.c.ok('listSessions')['sessions']), 'listSessions')
    x.c.ok('deleteSession', {'id': 'other'})
    t.eq(x.c.err('exec', {'command': 'true', 'sessionId': 'other'}), 'SESSION_NOT_FOUND', 'deleted session is gone')
    t.eq(x.c.ok('createSession', {'sessionId': 'named'})['id'], 'named',
         'createSession takes sessionId too (the name every other tool gives it)')
    t.eq(x.c.err('createSession', {'id': 'a', 'sessionId': 'b'}), 'VALIDATION_FAILED', 'two different names are refused')
    x.c.ok('deleteSession', {'sessionId': 'named'})
    t.eq(x.c.err('exec', {'command': 'true', 'sessionId': 'named'}), 'SESSION_NOT_FOUND', 'deleteSession takes sessionId too')
    t.eq(x.c.err('deleteSession', {}), 'VALIDATION_FAILED', 'and needs one of them')
    x.c.sh('cd /tmp && GONE=1')
    x.c.ok('deleteSession', {'id': 'default'})
    t.eq(x.c.sh('echo "$PWD [$GONE]"')['stdout'], '/workspace []\n',
         'deleting the default session starts it again, fresh (every call without a sessionId uses it)')


def test_bash_session(t, x):
    """Commands run in bash, and a session keeps what a shell you type into
    keeps: cwd, variables exported or not, functions, aliases, options."""
    x.c.ok('createSession', {'id': 'bash'})
    sh = lambda cmd, **kw: x.c.sh(cmd, sessionId='bash', **kw)
    r = sh('[[ "ab" == a* ]] && echo glob; arr=(one two three); echo ${#arr[@]} ${arr[1]}; '
           'echo "${BASH_VERSION%%.*}"; set -o pipefail; false | true; echo "pipe=$?"')
    t.eq(r['stdout'].split('\n')[:2] + r['stdout'].split('\n')[3:4], ['glob', '3 two', 'pipe=1'],
         '[[ ]], arrays and pipefail work: the shell is bash', r)
    sh('plain="not exported"; multi=$\'line1\\nline2\'; declare -A map=([k]="v w"); declare -i n=41; '
       'greet() { echo "hello $1"; }; alias ll="echo aliased"; set -o pipefail; shopt -s extglob; '
       'mkdir -p /tmp/bs && cd /tmp/bs; export EXP=yes; echo "source_me=1" > /tmp/bs/rc; source /tmp/bs/rc')
    r = sh('pwd; echo "$plain|$EXP|${map[k]}|$((n+1))|$source_me"; printf "%s\\n" "$multi"; greet you; ll; '
           'false | true; echo "pipe=$?"; shopt -q extglob && echo extglob')
    t.eq(r['stdout'], '/tmp/bs\nnot exported|yes|v w|42|1\nline1\nline2\nhello you\naliased\npipe=1\nextglob\n',
         'cwd, plain and exported variables, arrays, functions, aliases and options carry to the next command', r)
    t.eq(r['stderr'], '', 'and restoring them prints nothing')
    r = x.c.sh('type greet >/dev/null 2>&1 && echo leaked; echo "[$plain]"')
    t.eq(r['stdout'], '[]\n', 'another session has none of it')
    sh('unset plain; unset -f greet; unalias ll; set +o pipefail')
    r = sh('echo "[$plain]"; type greet >/dev/null 2>&1 || echo nofn; false | true; echo "pipe=$?"')
    t.eq(r['stdout'], '[]\nnofn\npipe=0\n', 'unset, unset -f, unalias and set +o stick too', r)
    t.ok(sh('echo $RANDOM')['stdout'] != sh('echo $RANDOM')['stdout'] or
         sh('echo $RANDOM')['stdout'] != sh('echo $RANDOM')['stdout'], '$RANDOM is not replayed')
    # what a command cannot take from the next one
    r = sh('v=kept; exit 7')
    t.eq(r['exitCode'], 7, 'exit N is the exit code')
    t.eq(sh('echo $v')['stdout'], 'kept\n', 'and what the command set before exit stays')
    t.eq(sh('echo one; continue; echo two')['stdout'], 'one\n', 'continue at top level does not lose the answer')
    t.eq(sh('echo one; break; echo two')['stdout'], 'one\n', 'nor break')
    t.eq(sh('echo ok')['stdout'], 'ok\n', 'the session goes on after them')
    sh('exec >/tmp/bs/swallowed; echo hidden')
    t.eq(sh('echo shown')['stdout'], 'shown\n', 'exec >file in one command does not take the next one\'s output')
    r = sh('sleep 300 & echo $!')
    pid = r['stdout'].strip()
    # killed at the end: gone, or a zombie its shell has not reaped yet,
    # within the moment a SIGKILLed process waits for a CPU to die on
    # (under load; bounded: `sleep 300` itself would stay)
    r = sh('for i in $(seq 100); do grep -qs "^State:[[:space:]]*[^Z[:space:]]" /proc/%s/status || { echo gone; exit; }; '
           'sleep 0.05; done; echo alive' % pid)
    t.eq((r['stdout'], r['stderr']), ('gone\n', ''),
         'what a command leaves running is killed at its end, with no job notice in the next output', r)
    res, _ = x.c.call('exec', {'command': 'w=timedout; sleep 300', 'sessionId': 'bash', 'timeout': 300}, 60)
    t.ok(res['structuredContent'].get('timedOut'), 'a command times out')
    r = sh('echo "[$w] $v"; pwd')
    t.eq(r['stdout'], '[] kept\n/tmp/bs\n', 'and the session keeps its state from before it', r)
    r = sh('kill -9 $$')
    t.eq(r['exitCode'], 137, 'a command that kills its own shell gets its status')
    t.eq(sh('echo $v; pwd')['stdout'], 'kept\n/tmp/bs\n', 'and the session goes on with its state')
    x.c.ok('setEnvVars', {'sessionId': 'bash', 'env': {'LATE': 'set'}})
    t.eq(sh('echo $LATE $v')['stdout'], 'set kept\n', 'setEnvVars reaches the session at its next command')
    sh('later=1', cwd='/tmp')
    t.eq(sh('pwd; echo $later')['stdout'], '/tmp/bs\n1\n',
         'a command with its own cwd runs on its own: its variables stay, its cwd does not')
    # two at once in one session
    for i in range(2):
        x.c.send({'jsonrpc': '2.0', 'id': 7000 + i, 'method': 'tools/call',
                  'params': {'name': 'exec', 'arguments': {'command': 'sleep 0.3; echo %d' % i, 'sessionId': 'bash'}}})
    got = {}
    for i in range(2):
        m = x.c.next(lambda m: m.get('id') == 7000 + i and 'method' not in m, 30)
        got[m['id']] = m['result']['structuredContent']['stdout']
    t.eq(got, {7000: '0\n', 7001: '1\n'}, 'two commands at once in one session both answer')
    x.c.ok('deleteSession', {'id': 'bash'})


def test_line_numbers(t, x):
    """A command's lines are its own: LINENO and bash's "line N:" count from
    its first line, in a session's shell, in a command of its own (a cwd for
    one call) and after the session's state changed (set -u)."""
    for args in ({}, {'cwd': '/tmp'}, {'sessionId': 'lines'}):
        if args.get('sessionId'):
            x.c.ok('createSession', {'id': 'lines'})
            x.c.ok('exec', dict(args, command='set -u; f() { :; }; alias ll=ls'))
        r = x.c.ok('exec', dict(args, command='echo $LINENO\n\nnosuch-cmd'))
        t.eq((r['stdout'], r['stderr']), ('1\n', 'bash: line 3: nosuch-cmd: command not found\n'),
             'LINENO and the line in bash\'s message are the command\'s own (%s)' % (args or 'the default session'))


def test_stdin(t, x):
    r = x.c.sh('tr a-z A-Z', stdin='hello\n')
    t.eq(r['stdout'], 'HELLO\n', 'stdin is fed to the command')
    r = x.c.sh('cat', timeout=5000)
    t.ok(r['stdout'] == '' and not r.get('timedOut'), 'no stdin means EOF, not a hang')


def test_timeout_kills_tree(t, x):
    t0 = time.monotonic()
    res, _ = x.c.call('exec', {'command': '(sleep 300 & echo $! > /tmp/bg.pid; wait) & echo started; sleep 300',
                               'timeout': 500}, 60)
    r = res['structuredContent']
    t.ok(r.get('timedOut') is True and not r['success'], 'timeout reported', r)
    t.ok(res['isError'] and r.get('error', {}).get('code') == 'COMMAND_TIMEOUT',
         'a timed-out exec is isError with COMMAND_TIMEOUT, so it is not taken for a result', res)
    t.eq(r.get('stdout'), 'started\n', 'and it carries the output so far')
    t.ok(time.monotonic() - t0 < 20, 'timeout returns promptly')
    r = x.c.sh('pid=$(cat /tmp/bg.pid); for i in $(seq 400); do kill -0 $pid 2>/dev/null || { echo gone; exit; }; '
               'sleep 0.05; done; echo alive')
    t.eq(r['stdout'].strip(), 'gone', 'the whole tree is killed, background children too')
    t.eq(x.c.sh(left_running('sleep'))['stdout'].strip(), '0', 'no sleep survives')


def test_background_does_not_block(t, x):
    t0 = time.monotonic()
    r = x.c.sh('sleep 300 & echo started')
    t.ok(r['stdout'] == 'started\n' and time.monotonic() - t0 < 10, 'a background child does not hold the call')
    t.ok('startProcess' in r.get('hint', '') and '1 process ' in r['hint'],
         'and the result says it was ended with the call, and what to use instead', r)
    r = x.c.ok('exec', {'command': 'sleep 300 & sleep 300 & echo two'})
    t.ok('2 processes' in r.get('hint', ''), 'counted', r.get('hint'))
    t.ok('hint' not in x.c.sh('echo plain'), 'a command that leaves nothing behind has no hint')


def test_cancel(t, x):
    i = 999
    x.c.send({'jsonrpc': '2.0', 'id': i, 'method': 'tools/call',
              'params': {'name': 'exec', 'arguments': {'command': 'echo begun; sleep 300'},
                         '_meta': {'progressToken': 'cancel-me'}}})
    x.c.next(lambda m: m.get('method') == 'notifications/progress' and m['params']['progressToken'] == 'cancel-me')
    x.c.notify('notifications/cancelled', {'requestId': i, 'reason': 'test'})
    # the command is gone: no sleep left in the sandbox
    def gone():
        return x.c.sh('ps -e -o comm= | grep -c "^sleep$" || true')['stdout'].strip() == '0'
    t.ok(wait_until(gone, 20, 'cancelled command to die'), 'notifications/cancelled kills the command')
    late = [m for m in x.c.pending if m.get('id') == i]
    t.eq(late, [], 'no response is sent for a cancelled request')


def test_progress_streams(t, x):
    # the first chunk arrives while the command is still running
    i = 4242
    x.c.sh('rm -f /workspace/fifo; mkfifo /workspace/fifo')
    x.c.send({'jsonrpc': '2.0', 'id': i, 'method': 'tools/call',
              'params': {'name': 'exec', 'arguments': {'command': 'echo first; read x < /workspace/fifo; echo second'},
                         '_meta': {'progressToken': 77}}})
    p = x.c.next(lambda m: m.get('method') == 'notifications/progress' and m['params']['progressToken'] == 77)
    t.eq(p['params']['message'], 'first\n', 'progress carries the chunk as it is produced')
    t.eq(p['params'].get('_meta', {}).get('sbx/stream'), 'stdout', 'progress names the stream')
    x.c.sh('echo go > /workspace/fifo')
    r = x.c.next(lambda m: m.get('id') == i and 'method' not in m)
    t.eq(r['result']['structuredContent']['stdout'], 'first\nsecond\n', 'result has the whole output')


def test_output_bound(t, x):
    r = x.c.sh('head -c 3000000 /dev/zero | tr "\\0" a; echo; echo END', maxOutputBytes=4096)
    t.ok(r.get('truncated') is True, 'flood is marked truncated')
    t.ok(len(r['stdout'].encode()) < 4096 + 200, 'stdout is bounded (%d bytes)' % len(r['stdout']))
    t.ok(r['stdout'].startswith('aaaa') and r['stdout'].endswith('END\n'), 'head and tail kept')
    p = r.get('outputPath')
    t.ok(p and p.startswith('/tmp/sbx-output/'), 'outputPath given', r.get('outputPath'))
    s = x.c.sh('wc -c < %s' % p)
    t.eq(s['stdout'].strip(), '3000005', 'full output saved inside the sandbox')
    # the sandbox puts a symlink where the daemon saves output: it is not followed
    x.c.sh('mv /tmp/sbx-output /tmp/saved-output && mkdir /workspace/elsewhere && '
           'ln -s /workspace/elsewhere /tmp/sbx-output')
    r = x.c.sh('head -c 200000 /dev/zero | tr "\\0" c')
    t.ok(r.get('truncated') is True and 'outputPath' not in r, 'with a symlink in its place, no output is saved', r.get('outputPath'))
    t.eq(x.c.sh('ls -A /workspace/elsewhere')['stdout'], '', 'and nothing is written where the symlink points')
    x.c.sh('rm /tmp/sbx-output && mv /tmp/saved-output /tmp/sbx-output && rmdir /workspace/elsewhere')
    r = x.c.sh('head -c 200000 /dev/zero | tr "\\0" b')
    t.ok(r.get('truncated') and len(r['stdout']) <= 65536 + 200, 'default bound is 64 KiB')
    # 16 MiB of control characters is over 64 MiB once JSON-escaped (twice: structured and text)
    r = x.c.request('tools/call', {'name': 'exec', 'arguments': {
        'command': 'head -c 16000000 /dev/zero | tr "\\0" "\\1"', 'maxOutputBytes': 16777216}}, 120)
    t.ok(r.get('error', {}).get('code') == -32603 and '64 MiB' in r['error'].get('message', ''),
         'an answer over the message limit comes back as an error, not silence', str(r)[:300])
    t.eq(x.c.sh('echo still')['stdout'], 'still\n', 'and the connection goes on')
    # 100 MB of stdin is over the limit on the way in: the request is answered by its id
    r = x.c.request('tools/call', {'name': 'exec', 'arguments': {'command': 'wc -c', 'stdin': 'y' * 100_000_000}}, 120)
    t.ok(r.get('error', {}).get('code') == -32600 and '64 MiB' in r['error'].get('message', ''),
         'a request over the message limit gets an error that says so', str(r)[:300])
    r = x.c.sh('wc -c', stdin='y' * 16_000_000)
    t.eq(r.get('stdout'), '16000000\n', 'and 16 MB of stdin (the stdin limit) reaches the command whole')


def test_utf8(t, x):
    r = x.c.sh("printf 'ok \\303\\251 bad \\377\\376 end'")
    t.eq(r['stdout'], 'ok \u00e9 bad \ufffd\ufffd end', 'invalid UTF-8 becomes U+FFFD')
    res, notes = x.c.call('exec', {'command': "printf '\\342'; sleep 0.2; printf '\\202\\254 done'"}, progress=True)
    text = ''.join(n['params']['message'] for n in notes)
    t.eq(text, '\u20ac done', 'progress chunks end on code-point boundaries')


def test_env_is_clean(t, x):
    r = x.c.sh('env | sort')
    keys = sorted(l.split('=', 1)[0] for l in r['stdout'].splitlines() if '=' in l)
    t.ok('SBX_RUNTIME_DIR' not in keys and 'SBX_STATE_DIR' not in keys, 'daemon environment absent', keys)
    t.ok({'PATH', 'HOME', 'LANG', 'TERM', 'HOSTNAME'} <= set(keys), 'fixed environment present', keys)


def test_nonexistent_cwd(t, x):
    t.eq(x.c.err('exec', {'command': 'true', 'cwd': '/nope'}), 'FILE_NOT_FOUND', 'missing cwd is an error')


def test_relative_cwd(t, x):
    x.c.sh('mkdir -p /workspace/rel/sub')
    t.eq(x.c.ok('exec', {'command': 'pwd', 'cwd': 'rel/sub'})['stdout'], '/workspace/rel/sub\n',
         'a relative cwd is under /workspace, not /')
    t.eq(x.c.sh('pwd')['stdout'], '/workspace\n', 'and it is for that call only')
    t.eq(x.c.err('exec', {'command': 'true', 'cwd': 'nope'}), 'FILE_NOT_FOUND', 'a missing relative cwd is an error')


def test_sandbox_creation_rules(t, x):
    t.eq(x.c.err('readFile', {'sandboxId': 'never-made', 'path': '/etc/hostname'}), 'SANDBOX_NOT_FOUND',
         'a looking tool does not create')
    t.ok(not any(s['sandboxId'] == 'never-made' for s in x.c.ok('listSandboxes')['sandboxes']), 'still absent')
    for bad in ('-lead', 'end-'):
        t.eq(x.c.err('exec', {'sandboxId': bad, 'command': 'true'}), 'VALIDATION_FAILED',
             'a new sandbox\'s id does not start or end with - (%s)' % bad)
    r = x.c.ok('createSandbox', {'sandboxId': 'made', 'env': {'GREETING': 'hi'}})
    t.eq({k: r[k] for k in ('sandboxId', 'status', 'created')}, {'sandboxId': 'made', 'status': 'running', 'created': True},
         'createSandbox')
    t.eq(r['limits'], {'memoryMB': 2048, 'cpus': 1.0, 'pids': 1024, 'diskMB': 8192}, 'it says the limits in force')
    t.eq(r['limitsEnforced'], {'memory': True, 'cpus': True, 'pids': True, 'disk': True}, 'and that root enforces them')
    r = x.c.ok('createSandbox', {'sandboxId': 'made'})
    t.eq(r['created'], False, 'createSandbox is idempotent')
    t.eq(x.c.sh('echo $GREETING', sandbox='made')['stdout'].strip(), 'hi', 'sandbox env reaches commands')
    t.eq(x.c.ok('destroySandbox', {'sandboxId': 'made'}), {'sandboxId': 'made', 'destroyed': True}, 'destroySandbox')
    t.eq(x.c.err('destroySandbox', {'sandboxId': 'made'}), 'SANDBOX_NOT_FOUND', 'destroy twice')
    t.eq(x.c.err('createSandbox', {'sandboxId': 'x', 'sleepAfter': 'soon'}), 'VALIDATION_FAILED', 'bad sleepAfter')
    t.eq(x.c.err('createSandbox', {'sandboxId': 'x', 'sleepAfter': '100ms'}), 'VALIDATION_FAILED',
         'a sleepAfter under a second (an idle reset discards files) is refused')
    x.c.ok('createSandbox', {'sandboxId': 'x5', 'sleepAfter': '5'})
    rec = json.load(open(os.path.join(x.env.state, 'sandboxes', 'x5', 'record.json')))
    t.eq(rec['options']['sleepAfterMs'], 5000, 'a bare number is seconds, as Cloudflare takes it')
    x.c.ok('destroySandbox', {'sandboxId': 'x5'})


if __name__ == '__main__':
    sys.exit(run_tests([test_basic, test_default_sandbox, test_session_state, test_bash_session, test_line_numbers, test_stdin, test_timeout_kills_tree,
                        test_background_does_not_block, test_cancel, test_progress_streams, test_output_bound,
                        test_utf8, test_env_is_clean, test_nonexistent_cwd, test_sandbox_creation_rules], lambda: Ctx('ex')))
