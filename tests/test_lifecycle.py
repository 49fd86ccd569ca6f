"""The idle lifecycle: a sandbox idle past sleepAfter is reset (processes
killed, files discarded, record kept), the next call wakes it fresh with
reset: true; keepAlive and running commands keep it awake."""
import sys
import threading

from sbxtest import Env, run_tests


class Ctx:
    def __init__(self):
        self.env = Env()
        self.c = self.env.mcp(['--sandbox', 'life'])
        self.c.initialize()
        self.c.request('logging/setLevel', {'level': 'notice'})

    def close(self):
        self.env.close()


def reset_event(c, sid, timeout=30):
    return c.next(lambda m: m.get('method') == 'notifications/message' and m['params']['data'].get('sandboxId') == sid,
                  timeout)


def status(c, sid):
    return {s['sandboxId']: s['status'] for s in c.ok('listSandboxes')['sandboxes']}.get(sid)


def test_idle_reset(t, x):
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'nap', 'sleepAfter': '1s', 'env': {'KEEP': 'me'}})
    c.ok('writeFile', {'sandboxId': 'nap', 'path': 'precious.txt', 'content': 'x'})
    c.sh('cd /tmp && export LOST=1', sandbox='nap')
    c.sh('sleep 1000 >/dev/null 2>&1 &', sandbox='nap')
    ev = reset_event(c, 'nap')
    t.ok('reset' in ev['params']['data']['message'], 'clients that asked for notices hear of the reset', ev)
    t.eq(status(c, 'nap'), 'sleeping', 'listSandboxes says sleeping; the record is kept')
    r = c.sh('ls /workspace; pwd; echo "[$LOST] [$KEEP]"; ps -e -o comm= | grep -c "^sleep$" || true', sandbox='nap')
    t.eq(r.get('reset'), True, 'the next call carries reset: true')
    t.eq(r['stdout'], '/workspace\n[] [me]\n0\n', 'files, session state and processes are gone; sandbox options stay')
    r = c.sh('true', sandbox='nap')
    t.ok('reset' not in r, 'only the first call after a reset says so')
    t.eq(status(c, 'nap'), 'running', 'awake again')


def test_error_after_reset(t, x):
    c = x.c
    c.ok('writeFile', {'sandboxId': 'nap2', 'path': 'f.txt', 'content': 'x'})
    c.ok('createSandbox', {'sandboxId': 'nap2', 'sleepAfter': '1s'})  # options of an existing sandbox stay as made
    c.ok('destroySandbox', {'sandboxId': 'nap2'})
    c.ok('createSandbox', {'sandboxId': 'nap2', 'sleepAfter': '1s'})
    c.ok('writeFile', {'sandboxId': 'nap2', 'path': 'f.txt', 'content': 'x'})
    reset_event(c, 'nap2')
    res, _ = c.call('readFile', {'sandboxId': 'nap2', 'path': 'f.txt'})
    t.ok(res['isError'] and res['structuredContent']['error']['code'] == 'FILE_NOT_FOUND'
         and res['structuredContent'].get('reset') is True, 'an error after a reset says reset too', res)


def test_awake_when_kept_or_busy(t, x):
    c = x.c
    busy = x.env.mcp(['--sandbox', 'busy'])  # ready first: its command starts right after busy is made
    busy.initialize()
    c.ok('createSandbox', {'sandboxId': 'busy', 'sleepAfter': '1s'})
    out = {}
    th = threading.Thread(target=lambda: out.setdefault('r', busy.sh('sleep 4; echo done', timeout=20000)))
    th.start()
    c.ok('createSandbox', {'sandboxId': 'kept', 'sleepAfter': '1s', 'keepAlive': True})
    c.ok('createSandbox', {'sandboxId': 'probe', 'sleepAfter': '1s'})
    reset_event(c, 'probe')  # a sandbox made alongside them has been reset by now
    t.eq(status(c, 'kept'), 'running', 'keepAlive never sleeps')
    t.eq(status(c, 'busy'), 'running', 'a running command keeps its sandbox awake')
    th.join(30)
    t.eq(out.get('r', {}).get('stdout'), 'done\n', 'and the command finished undisturbed')
    busy.close()


def test_update_existing(t, x):
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'upd', 'sleepAfter': '10m'})
    c.sh('echo before', sandbox='upd')
    res, _ = c.call('createSandbox', {'sandboxId': 'upd', 'sleepAfter': '1h', 'keepAlive': True, 'env': {'STAGE': 'two'},
                                      'limits': {'memoryMB': 999}})
    r = res['structuredContent']
    t.eq((r['created'], r.get('updated'), r.get('notApplied')), (False, ['sleepAfter', 'keepAlive', 'env'], ['limits']),
         'createSandbox on an existing id changes what can change live and names what cannot')
    t.ok('need a new sandbox' in res['content'][0]['text'], 'and its text says so', res['content'][0]['text'])
    t.eq(c.sh('echo $STAGE', sandbox='upd')['stdout'], 'two\n', 'the new env reaches commands at once')
    t.ok(c.ok('createSandbox', {'sandboxId': 'upd'}).get('updated') is None, 'asking nothing changes nothing')
    c.ok('createSandbox', {'sandboxId': 'lim', 'limits': {'memoryMB': 512, 'pids': 200}})
    r = c.ok('createSandbox', {'sandboxId': 'lim', 'limits': {'memoryMB': 512}})
    t.eq(r.get('notApplied'), None, 'the limits it has, asked again (some of them), are no change')
    c.ok('destroySandbox', {'sandboxId': 'lim'})
    c.ok('destroySandbox', {'sandboxId': 'upd'})


if __name__ == '__main__':
    sys.exit(run_tests([test_idle_reset, test_error_after_reset, test_awake_when_kept_or_busy, test_update_existing], Ctx))
