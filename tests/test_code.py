"""runCode and code contexts through MCP: state across runs, plots as PNG
images, DataFrames as HTML, exceptions that leave the context usable,
timeouts and cancellation that interrupt without losing state, independent
contexts, JavaScript with top-level await, and a driver channel that cannot
be made to lie its way into the daemon."""
import base64
import re
import sys
import time

from sbxtest import Ctx, run_tests


def run(x, code, **kw):
    return x.c.ok('runCode', dict(code=code, **kw), 120)


def cancel_once_printing(x, code, token):
    """Sends a runCode whose code prints first, waits for that output (the
    run is under way), then cancels the call."""
    c = x.c
    i = next(c.ids)
    c.send({'jsonrpc': '2.0', 'id': i, 'method': 'tools/call',
            'params': {'name': 'runCode', 'arguments': {'code': code}, '_meta': {'progressToken': token}}})
    c.next(lambda m: m.get('method') == 'notifications/progress' and m['params'].get('progressToken') == token, 60)
    c.notify('notifications/cancelled', {'requestId': i, 'reason': 'test'})


def test_state_and_results(t, x):
    r = run(x, 'x = 20\ny = x * 2\nprint("hello")\ny + 2')
    t.eq(r['logs']['stdout'], ['hello\n'], 'print goes to logs.stdout, a line an entry')
    t.eq([res.get('text') for res in r['results']], ['42'], 'the last expression is the result')
    t.eq(r['executionCount'], 1, 'executionCount counts runs')
    r = run(x, 'for i in range(3): print(i, end="")\nprint()\nprint("a\\nb")')
    t.eq(r['logs']['stdout'], ['012\n', 'a\nb\n'], 'a line written in parts is one entry')
    r = run(x, 'import math\ndef f(n): return math.factorial(n)\nf(5) + x')
    t.eq(r['results'][0]['text'], '140', 'variables, imports and functions persist in the context')
    r = run(x, 'display(1, "two")\nimport os\nos.system("echo from a child")\nNone')
    t.eq([res['text'] for res in r['results']], ['1', "'two'"], 'display() adds results in order; None is no result')
    t.eq(''.join(r['logs']['stdout']), 'from a child\n', 'what a subprocess prints is captured too')


def test_exception(t, x):
    res, _ = x.c.call('runCode', {'code': 'keep = 7\n1/0'}, 60)
    r = res['structuredContent']
    t.ok(not res['isError'], 'an exception in the code is a result, not a tool error', res)
    t.eq((r['error']['name'], r['error']['value']), ('ZeroDivisionError', 'division by zero'), 'error {name, value}')
    t.ok(any('1/0' in line or 'line 2' in line for line in r['error']['traceback']), 'with the traceback', r['error'])
    t.ok('ZeroDivisionError' in res['content'][0]['text'], 'and the text says it', res['content'])
    t.eq(run(x, 'keep + 1')['results'][0]['text'], '8', 'the context is still usable, with its state')
    e = run(x, 'ok = 1\nx = (1,').get('error', {})
    t.ok(e.get('name') == 'SyntaxError' and any('line 2' in l for l in e['traceback'])
         and not any('ast.py' in l or 'Traceback' in l for l in e['traceback']),
         'a cell that does not parse says where in it, without the parser\'s frames', e)


def test_plot_and_dataframe(t, x):
    res, _ = x.c.call('runCode', {'code': 'import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title("t")'}, 120)
    r = res['structuredContent']
    pngs = [b['png'] for b in r['results'] if 'png' in b]
    t.eq(len(pngs), 1, 'a matplotlib figure comes back as one png result without plt.show()', r['results'])
    raw = base64.b64decode(pngs[0]) if pngs else b''
    t.ok(raw.startswith(b'\x89PNG\r\n\x1a\n') and len(raw) > 1000, 'and it is a real PNG (%d bytes)' % len(raw))
    imgs = [b for b in res['content'] if b['type'] == 'image']
    t.ok(len(imgs) == 1 and imgs[0]['mimeType'] == 'image/png' and imgs[0]['data'] == pngs[0],
         'the PNG is also an MCP image content block', [b['type'] for b in res['content']])
    r = run(x, 'import pandas as pd\ndf = pd.DataFrame({"a": [1, 2], "b": [3, 4]})\ndf')
    main = r['results'][-1]
    t.ok('<table' in main.get('html', '') and 'a' in main.get('text', ''), 'a DataFrame comes back as html and text', main)
    r = run(x, 'class R:\n    def _repr_markdown_(self): return "**md**"\n    def _repr_svg_(self): return "<svg/>"\nR()')
    t.eq((r['results'][0].get('markdown'), r['results'][0].get('svg')), ('**md**', '<svg/>'),
         '_repr_markdown_ and _repr_svg_ come back under their keys')
    res, _ = x.c.call('runCode', {'code': 'class H:\n    def _repr_html_(self): return "<b>bold</b>"\n'
                                          '    def _repr_json_(self): return {"k": [1]}\nH()'}, 120)
    t.eq(res['content'][0]['text'], '[json]\n{"k":[1]}',
         'the text of an object whose repr says nothing but its type is its first textual form, named', res['content'])
    res, _ = x.c.call('runCode', {'code': 'df'}, 120)
    t.ok('<table' not in res['content'][0]['text'] and ' a ' in res['content'][0]['text'],
         'a DataFrame\'s text stays its table', res['content'])


def test_timeout_and_cancel(t, x):
    run(x, 'counter = 41')
    t0 = time.monotonic()
    r = run(x, 'while True: pass', timeout=1000)
    t.ok(r.get('error', {}).get('name') == 'TimeoutError' and 'interrupted after' in r['error']['value'],
         'timeout interrupts a busy loop and says so (TimeoutError, as JavaScript\'s)', r)
    t.ok(time.monotonic() - t0 < 30, 'and answers')
    t.eq(run(x, 'counter + 1')['results'][0]['text'], '42', 'the context keeps its earlier variables')
    # cancellation: notifications/cancelled interrupts like a timeout
    cancel_once_printing(x, 'import time\nstarted = True\nprint("go", flush=True)\ntime.sleep(1000)', 'pc')
    r = run(x, 'started, counter')
    t.eq(r['results'][0]['text'], '(True, 41)', 'a cancelled run is interrupted; the next one runs with the state kept')


def test_interrupt_sent_again(t, x):
    # A SIGINT that lands just before a blocking call (between Python's last
    # look at signals and time.sleep) is seen only when the call returns. The
    # code here swallows the first one to stand for that: the interrupt must
    # come again until the run takes it, for a timeout as for a cancel.
    swallow = ('import signal, time\nprev = signal.getsignal(signal.SIGINT)\n'
               'signal.signal(signal.SIGINT, lambda *a: signal.signal(signal.SIGINT, prev))\n')
    run(x, 'kept = "yes"')
    r = run(x, swallow + 'time.sleep(1000)', timeout=500)
    t.eq(r.get('error', {}).get('name'), 'TimeoutError', 'a timeout whose first SIGINT is lost still interrupts', r)
    cancel_once_printing(x, swallow + 'print("go", flush=True)\ntime.sleep(1000)', 'pl')
    r = run(x, 'kept')
    t.eq((r['results'][0]['text'], r.get('contextRestarted')), ("'yes'", None),
         'so does a cancel, and the context keeps its state (not ended for a run that did not stop)')
    # a SIGINT handler an earlier run set is not the next run's: its cleanup
    # after one KeyboardInterrupt is not cut short by more
    run(x, 'signal.signal(signal.SIGINT, signal.default_int_handler)')
    cancel_once_printing(x, 'try:\n    print("go", flush=True)\n    time.sleep(1000)\n'
                            'finally:\n    time.sleep(0.3)\n    cleaned = True', 'ph')
    r = run(x, "globals().get('cleaned')")
    t.eq(r['results'][0]['text'] if r.get('results') else r, 'True', 'a cancelled run\'s finally runs whole')


def test_cancel_at_once(t, x):
    # a call cancelled as soon as it is sent (a client that gives up at
    # once): its line and the interrupt can reach the interpreter together,
    # before the run starts; the run must not go on (nor the context end)
    c = x.c
    run(x, 'import time\nkept = 7\nran = 0')
    for k in range(8):
        i = next(c.ids)
        c.send({'jsonrpc': '2.0', 'id': i, 'method': 'tools/call',
                'params': {'name': 'runCode', 'arguments': {'code': 'time.sleep(30)\nran += 1'}}})
        c.notify('notifications/cancelled', {'requestId': i, 'reason': 'test'})
    r = run(x, '(kept, ran)')
    t.eq((r['results'][0]['text'], r.get('contextRestarted')), ('(7, 0)', None),
         'eight runs cancelled at once: none ran on, and the context kept its state', r)


def test_contexts_independent(t, x):
    a = x.c.ok('createCodeContext', {'language': 'python'})
    b = x.c.ok('createCodeContext', {'language': 'python', 'cwd': '/tmp'})
    t.ok(a['id'] != b['id'] and a['cwd'] == '/workspace' and b['cwd'] == '/tmp', 'two contexts, each with its cwd', (a, b))
    run(x, 'v = "in a"', contextId=a['id'])
    r = run(x, 'import os\n(globals().get("v"), os.getcwd())', contextId=b['id'])
    t.eq(r['results'][0]['text'], "(None, '/tmp')", 'contexts do not share state')
    x.c.sh('mkdir -p /workspace/cdir')
    c = x.c.ok('createCodeContext', {'language': 'python', 'cwd': 'cdir'})
    r = run(x, 'import os\nos.getcwd()', contextId=c['id'])
    t.eq((c['cwd'], r['results'][0]['text']), ('/workspace/cdir', "'/workspace/cdir'"), 'a relative cwd is under /workspace')
    t.eq(x.c.err('runCode', {'code': '1', 'contextId': c['id'], 'language': 'javascript'}), 'VALIDATION_FAILED',
         'javascript asked of a python context is refused, not run as python')
    x.c.ok('deleteCodeContext', {'contextId': c['id']})
    ids = [ctx['id'] for ctx in x.c.ok('listCodeContexts')['contexts']]
    t.ok(a['id'] in ids and b['id'] in ids, 'listCodeContexts shows them', ids)
    x.c.ok('deleteCodeContext', {'contextId': b['id']})
    t.eq(x.c.err('runCode', {'code': '1', 'contextId': b['id']}), 'CONTEXT_NOT_FOUND', 'a deleted context is gone')
    t.eq(x.c.err('deleteCodeContext', {'contextId': 'nope'}), 'CONTEXT_NOT_FOUND', 'an unknown one is CONTEXT_NOT_FOUND')
    # a context whose interpreter died says so, and runCode's default one comes back fresh
    res, _ = x.c.call('runCode', {'code': 'import os, signal\nos.kill(os.getpid(), signal.SIGKILL)', 'contextId': a['id']}, 60)
    e = res['structuredContent'].get('error', {})
    t.ok(not res['isError'] and e.get('name') == 'InterpreterExited' and 'SIGKILL' in e.get('value', ''),
         'a run whose interpreter dies says so, as an error of its code', res['structuredContent'])
    res, _ = x.c.call('runCode', {'code': '1', 'contextId': a['id']}, 60)
    t.ok(res['isError'] and 'died' in res['structuredContent']['error']['message'], 'and the dead context says so', res)
    run(x, 'kept = 1')
    res, _ = x.c.call('runCode', {'code': 'import os\nos._exit(1)'}, 60)
    t.eq(res['structuredContent'].get('error', {}).get('name'), 'InterpreterExited',
         'the default context\'s interpreter exits', res['structuredContent'])
    r = run(x, "'kept' in globals()")
    t.eq((r['results'][0]['text'], r.get('contextRestarted')), ('False', True),
         'the next run is in a fresh default context, and says so')
    t.eq(run(x, '2').get('contextRestarted'), None, 'and the one after is in that context again')


def test_javascript(t, x):
    r = run(x, 'let a = 40;\nconsole.log("hi", {b: 1});\na + 2', language='javascript')
    t.eq((r['results'][0]['text'], r['logs']['stdout']), ('42', ['hi { b: 1 }\n']), 'JS: console.log and the last value')
    r = run(x, 'const got = await new Promise((res) => setTimeout(() => res(a), 10));\ngot + 1', language='javascript')
    t.eq(r['results'][0]['text'], '41', 'top-level await')
    r = run(x, 'got * 2 + a', language='javascript')
    t.eq(r['results'][0]['text'], '120', 'let/const survive between runs, awaited ones too')
    r = run(x, "const fs = require('fs'), util = require('util')\nlet current = 7, out = [], err = 0, vm = 1, send = 2\n"
               "fs.existsSync('/workspace') + ':' + current", language='javascript')
    t.eq((r['results'][0]['text'] if r['results'] else None, r.get('error')), ('true:7', None),
         'a cell may declare the names the interpreter\'s driver uses for itself (fs, current, out...)', r.get('error'))
    r = run(x, 'console.log("still"); current + out.length', language='javascript')
    t.eq((r['results'][0]['text'] if r['results'] else None, r['logs']['stdout']), ('7', ['still\n']),
         'and the context goes on, its output captured')
    for code, want in (('const v = await Promise.resolve(5); v', '5'), ("let s = 'I await you'\ns", 'I await you'),
                       ('// a comment\nawait 1', '1'), ('async function f() { return 3 }; await f()', '3'),
                       ('const {p, r} = await Promise.resolve({p: 1, r: 2})\np + r', '3'),
                       ('class K { m() { return 9 } }\nawait null\nnew K().m()', '9'),
                       ('const t = `x${await 1};${"z"}`\nt', 'x1;z'), ('const o = await {a: 1}\no.a\n+ 1', '2'),
                       ('p * 10 + r + new K().m()', '21')):
        r = run(x, code, language='javascript')
        t.eq((r['results'][0]['text'] if r['results'] else None, r.get('error')), (want, None),
             'JS with await: %r is %s' % (code, want))
    for code, want in (('let again = 1; again', '1'), ('let again = 2; again', '2'), ('class C { v() { return 1 } }\nnew C().v()', '1'),
                       ('class C { v() { return 2 } }\nnew C().v()', '2')):
        r = run(x, code, language='javascript')
        t.eq((r['results'][0]['text'] if r['results'] else None, r.get('error')), (want, None),
             'a cell run again declares its let and class again, as in a notebook: %r' % code)
    r = run(x, "for (;;) console.log('x')", language='javascript', timeout=300)
    t.eq(r.get('error', {}).get('name'), 'TimeoutError', 'a loop of console.log stopped by its timeout')
    r = run(x, "process.stdout.write('b'); console.log('c'); 8", language='javascript')
    t.eq(''.join(r['logs']['stdout']), 'bc\n', 'and what the next run prints is still captured (a write cut short wedged it)')
    r = run(x, 'new Promise(() => {})', language='javascript')
    t.eq(r['results'][0]['text'], 'Promise { <pending> }', 'a promise as the last value is the result, not awaited')
    r = run(x, '({x: [1, 2]})', language='javascript')
    t.eq(r['results'][0].get('json'), {'x': [1, 2]}, 'an object also comes back as json')
    r = run(x, 'null.x', language='javascript')
    t.eq(r.get('error', {}).get('name'), 'TypeError', 'JS errors with their name', r)
    t.ok(any('<code>' in line for line in r['error']['traceback']), 'and the stack', r['error'])
    t.ok(not any('[eval]' in line for line in r['error']['traceback']), 'without the driver\'s own frames', r['error'])
    for code, line in (('throw new Error("boom")', 1), ('let q1 = 1,\n  q2 = 2;\nfunction g() { return 1 }\nnull.y', 4),
                       ('let z = 1\nz.foo.bar', 2), ('class Q {}\nasync function h() {}\nawait h()\nundefined.w', 4)):
        r = run(x, code, language='javascript')
        tb = r.get('error', {}).get('traceback', [])
        t.ok(any('<code>:%d:' % line in l for l in tb) and not any('characters cut' in l for l in tb),
             'a JS error\'s stack names the line of the cell, lines whole: %r' % code, tb)
    for code, frames in (('let z2 = 1\nz2.foo.bar', ['2:8']), ('[1,2].map(v => v.q.r)', ['1:20', '1:7']),
                         ('let k = 2; // k\n  k.y.z + 1', ['2:7']), ('"s"\n/* c */ null.t', ['2:14'])):
        tb = run(x, code, language='javascript').get('error', {}).get('traceback', [])
        t.eq(re.findall(r'<code>:(\d+:\d+)', '\n'.join(tb)), frames,
             'a JS error\'s frames are at the lines and columns node gives for the same file, none of sbx\'s own: %r' % code)
    run(x, 'globalThis.later = () => Promise.resolve().then(() => {\n  nope()\n})', language='javascript')
    tb = run(x, 'await later()', language='javascript').get('error', {}).get('traceback', [])
    t.eq(re.findall(r'<code>:(\d+:\d+)', '\n'.join(tb)), ['2:3', '1:1'], 'a frame of an earlier cell stays in the stack', tb)
    for code, out, value in (("if (false)\n  console.log('ran')", '', None), ('let w = 0\nwhile (w < 3)\n  w++\nw', '', '3'),
                             ('for (const v of [1, 2])\n  console.log(v)', '1\n2\n', None)):
        r = run(x, code, language='javascript')
        t.eq((''.join(r['logs']['stdout']), r['results'][0]['text'] if r['results'] else None, r.get('error')),
             (out, value, None), 'an if or a loop whose body is on the next line keeps its body: %r' % code)
    r = run(x, 'let q = ;', language='javascript')
    t.ok(r.get('error', {}).get('name') == 'SyntaxError' and not any('characters cut' in l for l in r['error']['traceback']),
         'a syntax error comes back readable', r.get('error'))
    r = run(x, 'while (true) {}', language='javascript', timeout=1000)
    t.eq(r.get('error', {}).get('name'), 'TimeoutError', 'timeout stops a JS busy loop', r)
    r = run(x, 'await new Promise(() => {})', language='javascript', timeout=1000)
    t.ok(r.get('error', {}).get('name') == 'TimeoutError' and 'abandoned' in r['error']['value'],
         'a never-ending await is abandoned and the context says so', r)
    t.eq(run(x, 'a', language='javascript')['results'][0]['text'], '40', 'and the context keeps its state')
    c = x.c
    i = next(c.ids)
    c.send({'jsonrpc': '2.0', 'id': i, 'method': 'tools/call',
            'params': {'name': 'runCode', 'arguments': {'code': 'console.log("go");\nwhile (true) {}', 'language': 'javascript'},
                       '_meta': {'progressToken': 'js'}}})
    c.next(lambda m: m.get('method') == 'notifications/progress' and m['params'].get('progressToken') == 'js', 60)
    c.notify('notifications/cancelled', {'requestId': i, 'reason': 'test'})
    t.eq(run(x, 'a + 2', language='javascript')['results'][0]['text'], '42',
         'cancelling a JS busy loop interrupts it (SIGINT) and the context goes on')


def test_javascript_modules(t, x):
    """import statements and import() work in a JavaScript cell (a cell is
    a script: `import` was a SyntaxError, import() had no loader), resolved
    from the context's directory, and what they name persists like a
    declaration; `export` declares what it exports."""
    c = x.c
    c.ok('writeFile', {'path': 'lib.mjs', 'content': 'export const k = 42; export default function hi() { return "hi"; }\n'})
    c.ok('writeFile', {'path': 'node_modules/cj/index.js', 'content': 'module.exports = { v: 7 };\n'})

    def js(code):
        return run(x, code, language='javascript')
    t.eq(js('import os from "node:os";\ntypeof os.cpus')['results'][0]['text'], 'function', 'a default import of a builtin')
    t.eq(js('import { join as j } from "node:path"\nimport * as P from "node:path";\nj("a", "b") + P.sep')['results'][0]['text'],
         'a/b/', 'named (renamed) and namespace imports')
    t.eq(js('import hi, { k } from "./lib.mjs";\nhi() + k')['results'][0]['text'], 'hi42', 'a module of the cwd, by a relative path')
    t.eq(js('hi() + k + j("x", "y")')['results'][0]['text'], 'hi42x/y', 'imported names persist into the next cell')
    t.eq(js('import cj from "cj";\ncj.v')['results'][0]['text'], '7', 'a package from the cwd\'s node_modules')
    t.eq(js('const m = await import("node:util"); typeof m.format')['results'][0]['text'], 'function', 'import() as well')
    e = js('import {\n  basename,\n  dirname\n} from "node:path";\nthrow new Error("five")')['error']
    t.ok(e['value'] == 'five' and any('<code>:5:' in l for l in e['traceback']),
         'an import over several lines keeps the lines after it where they were', e)
    e = js('import x from "no-such-package";')['error']
    t.ok('no-such-package' in e['value'], 'a missing module is the cell\'s error, named', e)
    t.eq(js('import fs from "fs";\nconst o = await import("os");\ntypeof fs.readFileSync + typeof o.platform')['results'][0]['text'],
         'functionfunction', 'builtins by their bare names too')
    t.eq(js('class A { import(m) { return m * 2 } }\nconst b = { import(m) { return m } };\nnew A().import(5) + b.import(1)')
         ['results'][0]['text'], '11', 'a method named import is a method, not an import')
    t.eq(js('const q = await import("./lib.mjs")\n{ let z = 5 }\nq.k')['results'][0]['text'], '42',
         'import() followed by a block on its next line is an import')
    js('Promise.reject(new Error("later")); 1')
    r2 = js('await new Promise(r => setTimeout(r, 50)); setTimeout(() => { throw new Error("in a timer") }, 0); 2')
    r = js('await new Promise(r => setTimeout(r, 50)); 3')
    err = ''.join(r2['logs']['stderr'] + r['logs']['stderr'])
    t.ok(r['results'][0]['text'] == '3' and 'later' in err and 'in a timer' in err,
         'a promise rejected with nobody to hear it, or a throw in a timer, after its run: the context goes on, and '
         'a later run\'s stderr says so', (r2, r))
    r = run(x, 'await new Promise(res => setTimeout(() => { JSON.parse("{"); res() }, 10))', language='javascript',
            timeout=2000)
    t.ok(r['error']['name'] == 'TimeoutError' and 'SyntaxError' in ''.join(r['logs']['stderr']),
         'a throw in a timer while a run awaits is on its stderr, and the run waits for its timeout as in Node\'s REPL', r)
    e = run(x, 'throw { get message() { throw new Error("x") } }', language='javascript', timeout=20000)['error']
    t.ok('cannot be shown' in e['value'], 'an error that throws as it is read still ends its run', e)
    t.eq(js('4')['results'][0]['text'], '4', 'and the context goes on')
    t.eq(js('export const ea = 1\nexport function ef() { return ea + 1 }\nexport { ea }\nexport * from "node:path"\n'
            'export default ef() * 10')['results'][0]['text'], '20',
         'a module\'s exports in a cell: what they declare is declared, export default is the result')
    t.eq(js('ef() + ea')['results'][0]['text'], '3', 'and an exported declaration persists like any other')
    r = js('class P { constructor() { this.x = 1 } }\n[new Map([[1, 2]]), new Set([1]), new P(), [1, {a: 2}], new Uint8Array(2)]'
           '.map((v) => { display(v); return 0 })')
    t.eq([d.get('json', '-') for d in r['results'][:5]], ['-', '-', {'x': 1}, [1, {'a': 2}], '-'],
         'a result\'s json is what it holds: none for a Map, a Set or a typed array (JSON says {} of them)')
    forms = {'export default function () { return 1 }': '[Function (anonymous)]', 'export default class {}':
             '[class (anonymous)]', 'export default { a: 1, b: 2 }': '{ a: 1, b: 2 }',
             'export default function named() { return 7 }\nnamed()': '7',
             'export default async function an() { return 8 }\nawait an()': '8'}
    got = {code: (js(code).get('results') or [{}])[0].get('text') for code in forms}
    t.eq(got, forms, 'export default of a value, an anonymous function or class, and of a named one (declared)')


def test_big_output(t, x):
    r = run(x, "'z' * (9 * 1024 * 1024)")
    t.ok(r['results'] == [] and r.get('truncated') is True, 'a result too big to carry is left out and the run says truncated',
         {k: v for k, v in r.items() if k != 'logs'})
    r = run(x, "import sys\nsys.stdout.write('a' * (10 * 1024 * 1024))\n7")
    marks = [e for e in r['logs']['stdout'] if 'cut here' in e]
    out = ''.join(e for e in r['logs']['stdout'] if 'cut here' not in e)
    t.ok(1000 * 1024 + 255 * 1024 < len(out) <= 1024 * 1024 + 256 * 1024 and set(out) == {'a'} and len(marks) == 1
         and r.get('truncated') is True,
         'one huge write keeps its first MiB (less 64 bytes an entry) and its last 256 KiB, a line saying what was cut '
         'between them, truncated', (len(out), marks))
    t.eq(r['results'][0]['text'], '7', 'and the run goes on to its result')
    r = run(x, "'z'.repeat(9 * 1024 * 1024)", language='javascript')
    t.ok(r['results'] == [] and r.get('truncated') is True, 'JS: the same', {k: v for k, v in r.items() if k != 'logs'})
    r = run(x, "process.stdout.write('b'.repeat(10 * 1024 * 1024)); 8", language='javascript')
    out = ''.join(e for e in r['logs']['stdout'] if 'cut here' not in e)
    t.ok(1000 * 1024 < len(out) <= 1024 * 1024 + 256 * 1024 and r.get('truncated') is True and
         [e.get('text') for e in r['results']] == ['8'],
         'JS: one huge write keeps its first MiB and its last 256 KiB, truncated',
         (len(out), set(out), r.get('truncated'), r['results'], r['logs']['stderr'][:3]))
    r = run(x, 'for i in range(6353): print("a" * 100)\nprint("z")\nprint("\\u00e9" * 3000)\nprint("b")\nprint("LAST")')
    out = ''.join(r['logs']['stdout'])
    t.ok(out.endswith('z\n' + '\u00e9' * 3000 + '\nb\nLAST\n'),
         'what is printed once the first MiB is full comes in order (a short line did not go back into it)', out[-40:])
    for lang, code in (('python', 'for i in range(200000): print("line %d" % i)'),
                       ('javascript', 'for (let i = 0; i < 200000; i++) console.log("line " + i)')):
        res, _ = x.c.call('runCode', {'code': code, 'language': lang}, 120)
        logs, text = res['structuredContent']['logs']['stdout'], res['content'][0]['text']
        t.ok(logs[0] == 'line 0\n' and logs[-1] == 'line 199999\n' and sum('cut here' in e for e in logs) == 1,
             '%s: 200,000 lines printed: the logs keep the first ones and the last ones, whole' % lang, (logs[:2], logs[-2:]))
        t.ok(len(text) < 70000 and 'line 199999' in text and 'omitted' in text and 'truncated' in text,
             '%s: the text is the start and the end of it (64 KiB), and says it was cut' % lang, len(text))


def test_lying_driver(t, x):
    # code that writes fake protocol lines and garbage straight to the channel
    code = ('import os\n'
            'os.write(1, b\'{"id": 999, "done": true}\\n{"ready": true}\\nnot json at all\\n\')\n'
            'os.write(1, b\'{"id": 1, "result": {"png": 5, "evil": "x"}}\\n\')\n'
            'os.write(1, b"x" * 3000000 + b"\\n")\n'
            '"still fine"')
    r = run(x, code)
    t.eq(r['results'][-1]['text'], "'still fine'", 'forged and oversized lines do not end or corrupt the run', r['results'][-1])
    t.ok(all(set(res) <= {'text', 'html', 'png', 'jpeg', 'svg', 'json', 'markdown', 'latex', 'javascript', 'isMain'}
             for res in r['results']), 'results carry only known keys')
    t.eq(run(x, '1 + 1')['results'][0]['text'], '2', 'the context goes on')
    t0 = time.monotonic()
    r = run(x, 'import os\nfor i in range(3):\n    os.write(1, b"[" * 4000000 + b"\\n")\n'
               'os.write(1, b\'{"result": {"json": [\' + b"{}," * 2000000 + b\'{}]}}\\n\')\n"ok"')
    t.ok(r['results'][-1]['text'] == "'ok'" and len(r['results']) == 1,
         'deeply nested and huge JSON lines are not parsed (the daemon would need gigabytes)', r['results'][:2])
    t.ok(time.monotonic() - t0 < 30, 'and take no long parse')
    t.eq(x.c.ok('listSandboxes', {})['sandboxes'][0]['sandboxId'], 'code', 'the daemon answers others meanwhile')


def test_results_bounded(t, x):
    """What the daemon holds of a run's results and logs is counted as what
    it costs it, not as the text the driver sent: "{}" is two bytes of text
    and some 230 of parsed JSON, a two-byte log line some 60 more. Code
    that writes such results or lines itself (or a driver it replaced) got
    the daemon to hold gigabytes that no sandbox was charged for."""
    def peak():
        with open('/proc/%d/status' % x.env.daemon_pid()) as f:
            return next(int(l.split()[1]) for l in f if l.startswith('VmHWM:')) // 1024
    before = peak()
    r = run(x, 'import os\nd = display.__globals__  # the driver\'s own\nfd, rid = d["_ctl_fd"], d["_current"][0]\n'
               'line = (\'{"id":%d,"result":{"json":[\' % rid + ",".join(["{}"] * 49000) + "]}}\\n").encode()\n'
               'for i in range(30): os.write(fd, line)\n'
               'logs = (\'{"id":%d,"stream":"stdout","texts":[\' % rid + ",".join([\'"a\\\\n"\'] * 49000) + "]}\\n").encode()\n'
               'for i in range(20): os.write(fd, logs)\n"end"', timeout=120000)
    grew = peak() - before
    t.ok(r.get('truncated') is True and r['results'][-1]['text'] == "'end'", 'the run ends, its results and logs cut',
         {k: (v if k != 'logs' else len(v['stdout'])) for k, v in r.items() if k != 'results'})
    t.ok(len(r['logs']['stdout']) < 20000, 'the logs keep fewer entries of two bytes than a MiB of them would be',
         len(r['logs']['stdout']))
    t.ok(grew < 150, 'the daemon\'s peak memory grew by %d MB (30 results of 49,000 objects each and a million log '
         'lines asked for some 400 MB)' % grew)
    t.eq(run(x, '6 * 7')['results'][0]['text'], '42', 'the context goes on')
    r = run(x, '",".join(str(i) for i in range(70000))')
    t.ok(len(r['results']) == 1 and not r.get('truncated') and r['results'][0]['text'].count(',') == 69999,
         'a long text result full of commas is text, not structure: kept whole', {k: v for k, v in r.items() if k != 'results'})


def test_results_share(t, x):
    """What runs hold is bounded for one sandbox at a quarter of the
    daemon's whole budget: its runs cannot leave every other sandbox's
    results cut."""
    c = x.c
    emit = ('import os, time\nd = display.__globals__  # the driver\'s own\nfd, rid = d["_ctl_fd"], d["_current"][0]\n'
            'os.write(fd, (\'{"id":%d,"result":{"json":[\' % rid + ",".join(["{}"] * 30000) + "]}}\\n").encode())\n'
            'while not os.path.exists("/tmp/go"): time.sleep(0.05)\n"held"')
    ids = []
    for i in range(5):
        ctx = c.ok('createCodeContext', {'sandboxId': 'hog'})['id']
        i = next(c.ids)
        c.send({'jsonrpc': '2.0', 'id': i, 'method': 'tools/call',
                'params': {'name': 'runCode', 'arguments': {'sandboxId': 'hog', 'contextId': ctx, 'code': emit}}})
        ids.append(i)
    other = c.ok('runCode', {'sandboxId': 'fair', 'code': emit.replace('/tmp/go', '/')}, 120)
    t.ok(len(other['results']) == 2 and not other.get('truncated'), 'another sandbox\'s run keeps its results', 
         {k: v for k, v in other.items() if k != 'results'})
    c.sh('touch /tmp/go', sandbox='hog')
    cut = sum(1 for i in ids if c.next(lambda m, i=i: m.get('id') == i, 120)['result']['structuredContent'].get('truncated'))
    t.ok(cut >= 1, 'while one sandbox\'s runs past its share are cut (%d of 5)' % cut)


def test_floods_bounded(t, x):
    """What ordinary code does a lot of (a print loop, a huge exception)
    and what hostile code does to its channels cost the daemon a bounded
    share: the calls answer, their progress comes in batches."""
    c = x.c
    for lang, code in (('python', 'for i in range(1000000): print(i)\n"done"'),
                       ('javascript', 'for (let i = 0; i < 1000000; i++) console.log(i);\n"done"')):
        res, notes = c.call('runCode', {'code': code, 'language': lang}, 300, progress=True)
        sc = res.get('structuredContent', {})
        t.ok(not res.get('isError') and 'done' in sc['results'][0]['text'] and sc.get('truncated') is True and
             0 < len(notes) < 2000, '%s: a million prints with a progress token answer, their output in %d progress '
             'notifications (one a batch, not one a write), the logs cut at 1 MiB' % (lang, len(notes)),
             {k: v for k, v in sc.items() if k != 'logs'})
    for lang, code in (('python', 'raise ValueError("x" * 5000000)'), ('javascript', 'throw new Error("x".repeat(5000000))')):
        r = run(x, code, language=lang, timeout=60000)
        e = r.get('error', {})
        t.ok(e.get('name') in ('ValueError', 'Error') and 'characters cut' in e.get('value', '') and len(e['value']) < 70000,
             '%s: an exception of 5 MB answers, its text cut' % lang, {k: v[:100] if isinstance(v, str) else v for k, v in e.items()})
    # a context that stops reading its input (its driver reads another
    # pipe) and says every run is done: what waits for it is bounded
    ctx = c.ok('createCodeContext', {})['id']
    run(x, 'import os, sys, threading, time, types\nm = types.SimpleNamespace(**display.__globals__)\nkeep = os.dup(m._in_fd)\n'
           'r, w = os.pipe()\nos.dup2(r, m._in_fd)\ndef liar():\n    while True:\n'
           '        os.write(m._ctl_fd, b\'{"done": true}\\n\')\n        time.sleep(0.01)\n'
           'threading.Thread(target=liar, daemon=True).start()', contextId=ctx)
    big = '#' + '\x01' * (1024 * 1024 - 2)  # 6 MiB a run once escaped
    err = None
    for _ in range(40):
        res, _ = c.call('runCode', {'code': big, 'contextId': ctx}, 60)
        if res.get('isError'):
            err = res['structuredContent']['error']['message']
            break
    t.ok(err and 'stopped reading' in err, 'a context that does not read its input is ended once 32 MiB wait for it', err)
    t.eq(run(x, '6 * 7')['results'][0]['text'], '42', 'and the other contexts go on')


def test_queued_run_cancelled(t, x):
    c = x.c
    ctx = c.ok('createCodeContext', {})['id']
    ids = []
    for code in ('import time\ntime.sleep(1.5)\n"first"', '"second"'):
        i = next(c.ids)
        ids.append(i)
        c.send({'jsonrpc': '2.0', 'id': i, 'method': 'tools/call',
                'params': {'name': 'runCode', 'arguments': {'code': code, 'contextId': ctx}}})
    c.notify('notifications/cancelled', {'requestId': ids[1]})  # still queued behind the first
    first = c.next(lambda m: m.get('id') == ids[0], 60)
    t.eq(first['result']['structuredContent']['results'][0]['text'], "'first'", 'cancelling a queued run leaves the one running')
    # a client that goes away with a run in flight and one queued
    other = x.env.mcp(['--sandbox', 'code'])
    other.initialize()
    for code in ('import time\ntime.sleep(1)', '2'):
        other.send({'jsonrpc': '2.0', 'id': next(other.ids), 'method': 'tools/call',
                    'params': {'name': 'runCode', 'arguments': {'code': code, 'contextId': ctx}}})
    other.close()
    t.eq(run(x, '40 + 2', contextId=ctx)['results'][0]['text'], '42', 'after a client left mid-run, the daemon and the context go on')


def test_reset_ends_contexts(t, x):
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'nap', 'sleepAfter': '2s'})
    ctx = c.ok('createCodeContext', {'sandboxId': 'nap'})
    c.ok('runCode', {'sandboxId': 'nap', 'code': 'z = 1', 'contextId': ctx['id']})
    c.ok('runCode', {'sandboxId': 'nap', 'code': 'y = 1'})
    c.request('logging/setLevel', {'level': 'notice'})
    c.next(lambda m: m.get('method') == 'notifications/message' and m['params']['data'].get('sandboxId') == 'nap', 30)
    t.ok(True, 'a sandbox with a code context still goes idle and is reset')
    t.eq(c.sh('echo fine', sandbox='nap')['stdout'], 'fine\n', 'the woken sandbox runs commands')
    res, _ = c.call('runCode', {'sandboxId': 'nap', 'code': 'z', 'contextId': ctx['id']}, 60)
    e = res['structuredContent'].get('error', {})
    t.ok(e.get('code') == 'CONTEXT_NOT_FOUND' and 'reset' in e.get('message', ''),
         'the reset ended its code contexts, and a run in one says so', e)
    r = c.ok('runCode', {'sandboxId': 'nap', 'code': "'y' in globals()"}, 120)
    t.eq((r['results'][0]['text'], r.get('contextRestarted')), ('False', True),
         'the default context\'s next run, after another call woke the sandbox, says it is a new one')
    # a run in flight is activity: a sandbox is not reset under it
    r = c.ok('runCode', {'sandboxId': 'nap', 'code': 'import time\ntime.sleep(4)\n"survived"'}, 60)
    t.eq((r['results'][0]['text'], r.get('reset')), ("'survived'", None), 'a 4 s run in a 2 s sleepAfter sandbox is not reset')


def test_contexts_across_restart(t, x):
    """Contexts are processes: they end with the daemon, and what comes
    after says so, even when another call woke the sandbox first."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'rs'})
    c.ok('runCode', {'sandboxId': 'rs', 'code': 'qq = 1'}, 120)
    c.ok('runCode', {'sandboxId': 'rs', 'code': 'let jj = 1', 'language': 'javascript'}, 120)
    ctx = c.ok('createCodeContext', {'sandboxId': 'rs'})['id']
    c.ok('runCode', {'sandboxId': 'rs', 'code': 'w = 2', 'contextId': ctx}, 120)
    x.env.run(['daemon', 'stop'])
    t.eq(c.ok('exec', {'sandboxId': 'rs', 'command': 'true'}).get('restarted'), True, 'the first call after says restarted')
    r = c.ok('runCode', {'sandboxId': 'rs', 'code': "'qq' in globals()"}, 120)
    t.eq((r['results'][0]['text'], r.get('contextRestarted')), ('False', True),
         'a later run in the default context is in a fresh one, and says so')
    t.eq(c.ok('runCode', {'sandboxId': 'rs', 'code': '1'}, 120).get('contextRestarted'), None, 'once')
    r = c.ok('runCode', {'sandboxId': 'rs', 'code': 'typeof jj', 'language': 'javascript'}, 120)
    t.eq((r['results'][0]['text'], r.get('contextRestarted')), ('undefined', True), 'JavaScript\'s as well')
    listed = {k['id']: k for k in c.ok('listCodeContexts', {'sandboxId': 'rs'})['contexts']}
    t.ok(listed.get(ctx, {}).get('status') == 'dead' and 'restarted' in listed[ctx].get('error', ''),
         'listCodeContexts shows a created context as dead, ended with the daemon', listed)
    res, _ = c.call('runCode', {'sandboxId': 'rs', 'code': 'w', 'contextId': ctx}, 60)
    err = res['structuredContent'].get('error', {})
    t.ok(err.get('code') == 'CONTEXT_NOT_FOUND' and 'restarted' in err.get('message', ''),
         'a run in it is CONTEXT_NOT_FOUND, saying why', err)
    t.eq(c.ok('deleteCodeContext', {'sandboxId': 'rs', 'contextId': ctx}).get('deleted'), True, 'it can be deleted')
    t.ok(ctx not in [k['id'] for k in c.ok('listCodeContexts', {'sandboxId': 'rs'})['contexts']], 'and is gone then')


def test_code_that_exits(t, x):
    """Code that exits: sys.exit() and process.exit() end the cell, not the
    context; os._exit() ends the interpreter, and the run's answer still
    has what it printed and says why; a forked child's os._exit() is the
    child's alone."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'ex'})
    r = c.ok('runCode', {'sandboxId': 'ex', 'code': 'keep = 5\nprint("before")\nimport sys\nsys.exit(3)'}, 120)
    t.eq((r['logs']['stdout'], r['error']['name'], r['error']['value']), (['before\n'], 'SystemExit', '3'),
         'sys.exit(3) is a SystemExit error, after the output')
    r = c.ok('runCode', {'sandboxId': 'ex', 'code': 'import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\n'
                         'os.waitpid(pid, 0)\nprint("parent")\nkeep'}, 120)
    t.eq((r['logs']['stdout'], r['results'][0]['text'], r.get('error')), (['parent\n'], '5', None),
         'a forked child that calls os._exit leaves the context and its output alone')
    res, _ = c.call('runCode', {'sandboxId': 'ex', 'code': 'print("last words")\nos._exit(7)'}, 120)
    r = res['structuredContent']
    t.ok(not res['isError'] and r.get('logs', {}).get('stdout') == ['last words\n']
         and r.get('error', {}).get('name') == 'InterpreterExited' and 'exit code 7' in r['error'].get('value', ''),
         'os._exit(7): what was printed, and an error saying the interpreter ended with 7', res)
    r = c.ok('runCode', {'sandboxId': 'ex', 'code': "'keep' in globals()"}, 120)
    t.eq((r['results'][0]['text'], r.get('contextRestarted')), ('False', True), 'the next run is in a new context, and says so')
    js = {'sandboxId': 'ex', 'language': 'javascript'}
    c.ok('runCode', dict(js, code='let kept = 9'), 120)
    r = c.ok('runCode', dict(js, code='console.log("bye"); process.exit(2); console.log("not reached")'), 120)
    t.eq((r['logs']['stdout'], r['error']['name'], r['error']['value']), (['bye\n'], 'ProcessExit', '2'),
         'process.exit(2) ends the cell with a ProcessExit error, after the output')
    r = c.ok('runCode', dict(js, code='kept'), 120)
    t.eq((r['results'][0]['text'], r.get('contextRestarted')), ('9', None), 'and the JavaScript context keeps its state')


def test_python_as_in_jupyter(t, x):
    """Python cells as Jupyter runs them: in __main__ (pickle and
    multiprocessing find what a cell defines), with top-level await, a
    sys.stdout that is a file, children the code forks that stay children,
    and an interrupt that lands while the driver writes a long line."""
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'jup'})

    def py(code, **kw):
        return c.ok('runCode', dict({'sandboxId': 'jup', 'code': code}, **kw), 120)
    py('keep = 1')
    t.eq(py('import __main__\n__main__.__dict__ is globals()')['results'][0]['text'], 'True', 'cells run in __main__')
    r = py('import multiprocessing as mp, pickle\ndef sq(v): return v * v\nclass K: pass\n'
           'with mp.get_context("fork").Pool(2) as pool: out = pool.map(sq, [1, 2, 3])\n(out, len(pickle.dumps(K())) > 0)')
    t.eq(r['results'][0]['text'] if r['results'] else r, '([1, 4, 9], True)',
         'a function and a class defined in a cell pickle, and a multiprocessing pool maps one')
    r = py('import asyncio\nawait asyncio.sleep(0.01)\nv = await asyncio.sleep(0, result=41)\nv + 1')
    t.eq(r['results'][0]['text'] if r['results'] else r, '42', 'top-level await, as in Jupyter')
    r = py('import io, sys\nsys.stdout.buffer.write("\u00e9".encode()[:1])\nsys.stdout.buffer.write("\u00e9".encode()[1:] + b"\\n")\n'
           'sys.stdout.writelines(["a\\n", "b\\n"])\nisinstance(sys.stdout, io.TextIOBase)')
    t.eq((''.join(r['logs']['stdout']), r['results'][0]['text']), ('\u00e9\na\nb\n', 'True'),
         'sys.stdout is a text file: writelines, and bytes through its buffer (a character split between writes)')
    r = py('import os, sys\npid = os.fork()\nif pid == 0:\n    print("from the child")\n    sys.exit(0)\n'
           'os.waitpid(pid, 0)\n"parent done"', timeout=20000)
    t.eq((r['results'][0]['text'] if r['results'] else None, r['logs']['stdout'], r.get('error')),
         ("'parent done'", ['from the child\n'], None),
         'a forked child that calls sys.exit() ends there: its print is the run\'s output, the answer the parent\'s')
    r = py('import os\npid = os.fork()\nif pid == 0:\n    print("c1"); print("c2")\nelse:\n    os.waitpid(pid, 0)\n"end"',
           timeout=20000)
    t.eq(([x['text'] for x in r['results']], ''.join(r['logs']['stdout'])), (["'end'"], 'c1\nc2\n'),
         'one that runs off the end of the cell ends there too: one result, all it printed')
    t.eq(py('keep', timeout=20000)['results'][0]['text'], '1', 'and the context is the parent\'s, with its state')
    r = py('from concurrent.futures import ProcessPoolExecutor\ndef sq(v):\n    print("in worker", v)\n    return v * v\n'
           'with ProcessPoolExecutor(2) as ex: out = list(ex.map(sq, range(6)))\nout', timeout=60000)
    t.eq((r['results'][0]['text'] if r['results'] else r, sorted(r['logs']['stdout'])),
         ('[0, 1, 4, 9, 16, 25]', ['in worker %d\n' % i for i in range(6)]),
         'a process pool maps a cell\'s function, its workers\' prints whole lines')
    r = py("s = 'x' * 10000\nwhile True: print(s)", timeout=2000)
    t.eq(r.get('error', {}).get('name'), 'TimeoutError',
         'a loop printing long lines is interrupted at its timeout (the interrupt waits for a message to be written whole)')
    t.eq(py('keep')['results'][0]['text'], '1', 'and the context keeps its state')
    r = py('async def f():\n    await asyncio.sleep(2)\n    print("resumed")\n    global leaked\n    leaked = 1\nawait f()',
           timeout=700)
    t.eq(r.get('error', {}).get('name'), 'TimeoutError', 'an awaiting cell times out')
    r = py('await asyncio.sleep(3)\n"leaked" in globals()')
    t.eq((r['logs']['stdout'], r['results'][0]['text']), ([], 'False'),
         'and what it awaited is cancelled, not resumed in a later cell\'s turn of the loop')
    r = py('loop = asyncio.get_event_loop()\nloop.run_until_complete(asyncio.sleep(0))\nloop.close()\n'
           'async def g(): return 4\nasyncio.run(g())')
    t.eq(r['results'][0]['text'] if r['results'] else r, '4', 'asyncio.run() in a cell works')
    t.eq(py('await asyncio.sleep(0, result=5)')['results'][0]['text'], '5',
         'and awaiting cells go on after code closed the loop or ran asyncio.run()')
    t.eq(py('import sys\n(sys.stdin.read(), hasattr(sys.stdin, "buffer"))')['results'][0]['text'], "('', True)",
         'sys.stdin is at its end (a file, with a buffer)')
    e = py('input("name? ")').get('error', {})
    t.ok(e.get('name') == 'EOFError' and 'no input' in e.get('value', ''), 'input() is an EOFError that says why', e)
    res, notes = c.call('runCode', {'sandboxId': 'jup', 'code': 'print(0)'}, 60, progress=True)
    t.eq([n['params'].get('message') for n in notes], ['0\n'], 'a print is one progress notification, not its text and '
         'then its newline')


def test_missing_interpreter(t, x):
    c = x.c
    c.ok('createSandbox', {'sandboxId': 'nopy'})
    # an interpreter the sandbox does not have: PATH without it
    res, _ = c.call('createCodeContext', {'sandboxId': 'nopy', 'language': 'python', 'env': {'PATH': '/nonexistent'}}, 60)
    t.eq(res['structuredContent'].get('error', {}).get('code'), 'INTERPRETER_NOT_AVAILABLE',
         'no python3 is INTERPRETER_NOT_AVAILABLE', res['structuredContent'])
    t.ok('python3' in res['structuredContent']['error']['message'], 'naming the binary', res['structuredContent'])


if __name__ == '__main__':
    sys.exit(run_tests([test_state_and_results, test_exception, test_plot_and_dataframe, test_timeout_and_cancel, test_interrupt_sent_again, test_cancel_at_once,
                        test_contexts_independent, test_javascript, test_javascript_modules, test_big_output, test_lying_driver, test_results_bounded, test_results_share, test_floods_bounded, test_queued_run_cancelled, test_reset_ends_contexts,
                        test_contexts_across_restart, test_code_that_exits, test_python_as_in_jupyter, test_missing_interpreter], setup=lambda: Ctx('code')))
