// sbx's JavaScript code context: one Node process per context, inside the
// sandbox. Requests come as JSON lines on fd 0 ({"id", "code", "timeout"});
// an interrupt is SIGINT; everything goes back as JSON lines on fd 1. Code runs in this
// realm (runInThisContext), so top-level let/const/class persist between
// runs like consecutive <script>s; code with `await` runs in an async
// function whose top-level declarations become globals.
'use strict';
const fs = require('fs');
const util = require('util');
const vm = require('vm');
const { Writable } = require('stream');

delete process.env.SBX_DRIVER;
let current = null;

function send(m) {
  // a leading newline ends whatever half line a child wrote to fd 1
  const b = Buffer.from('\n' + JSON.stringify(m) + '\n');
  for (let o = 0; o < b.length;) {
    try {
      o += fs.writeSync(1, b, o);
    } catch (e) {
      if (e.code !== 'EAGAIN') throw e;
    }
  }
}

function stream(name) {
  return new Writable({
    write(chunk, enc, cb) {
      const text = chunk.toString(); // in pieces a message can carry (the daemon takes up to 8 MiB a line)
      for (let i = 0; i < text.length; i += 1 << 19) send({ id: current, stream: name, text: text.slice(i, i + (1 << 19)) });
      cb();
    },
  });
}
const out = stream('stdout'), err = stream('stderr');
globalThis.console = new console.Console({ stdout: out, stderr: err });
for (const [s, w] of [[process.stdout, out], [process.stderr, err]]) {
  s.write = (chunk, enc, cb) => {
    w.write(typeof chunk === 'string' ? chunk : Buffer.from(chunk));
    if (typeof enc === 'function') enc();
    else if (typeof cb === 'function') cb();
    return true;
  };
}
globalThis.require = require;
globalThis.module = module;

function bundle(v) {
  const b = { text: typeof v === 'string' ? v : util.inspect(v, { depth: 4 }) };
  if (v !== null && typeof v === 'object' && !(v instanceof Error)) {
    try {
      const j = JSON.stringify(v);
      if (j !== undefined) b.json = JSON.parse(j);
    } catch (e) { /* not JSON: text only */ }
  }
  return b;
}

globalThis.display = (...vs) => { for (const v of vs) send({ id: current, result: bundle(v) }); };

const NOT_EXPR = /^(let|const|var|function|async\s+function|class|if|for|while|do|return|try|catch|finally|switch|throw|import|export|break|continue|\}|\)|\]|\/\/|\/\*|\*)/;

// code with top-level await: an async function whose top-level declarations
// (at the start of a line) become globals and whose last line, when it is an
// expression, is the result
function asyncWrap(code) {
  const lines = code.split('\n');
  const exported = [];
  for (let i = 0; i < lines.length; i++) {
    let m = /^(let|const|var)\s+([A-Za-z_$][\w$]*)\s*=/.exec(lines[i]);
    if (m) {
      lines[i] = lines[i].replace(/^(let|const|var)\s+/, '');
      continue;
    }
    m = /^(?:async\s+)?(function\*?|class)\s+([A-Za-z_$][\w$]*)/.exec(lines[i]);
    if (m) exported.push(m[2]);
  }
  let last = lines.length - 1;
  while (last >= 0 && !lines[last].trim()) last--;
  let ret = '';
  if (last >= 0 && !/^\s/.test(lines[last]) && !NOT_EXPR.test(lines[last]) && !/[{,(\[]\s*$/.test(lines[last]) &&
      (last === 0 || /[;})\]]\s*$/.test(lines[last - 1]) || !lines[last - 1].trim())) {
    ret = lines[last].replace(/;\s*$/, '');
    lines[last] = '';
  }
  const tail = exported.map((n) => `globalThis.${n} = ${n};`).join(' ');
  return `(async () => {\n${lines.join('\n')}\n${tail}\n${ret ? `return (${ret}\n);` : ''}\n})()`;
}

let abandon = null; // rejects the awaited run when interrupted or timed out
process.on('SIGINT', () => { if (abandon) abandon(Object.assign(new Error('interrupted'), { name: 'KeyboardInterrupt' })); });

async function run(req) {
  const timeout = req.timeout > 0 ? req.timeout : undefined;
  const code = String(req.code || '');
  const isAsync = /\bawait\b/.test(code);
  const opts = { filename: '<code>', breakOnSigint: true, timeout };
  let value = vm.runInThisContext(isAsync ? asyncWrap(code) : code, opts);
  if (isAsync || (value && typeof value.then === 'function' && isAsync)) {
    let timer;
    value = await Promise.race([value, new Promise((_, reject) => {
      abandon = reject;
      if (timeout) {
        timer = setTimeout(() => reject(Object.assign(new Error(
          `the run was abandoned after ${timeout} ms (what it awaits may still finish); the context keeps its state`),
        { name: 'TimeoutError' })), timeout);
      }
    })]).finally(() => { clearTimeout(timer); abandon = null; });
  }
  if (value !== undefined) {
    globalThis._ = value;
    send({ id: current, result: Object.assign(bundle(value), { isMain: true }) });
  }
}

function errorOf(e) {
  if (!(e instanceof Object) || !('message' in e)) return { name: 'Error', value: String(e), traceback: [] };
  let name = e.name || 'Error', value = e.message;
  if (e.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT') name = 'TimeoutError';
  if (e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') name = 'KeyboardInterrupt';
  const stack = String(e.stack || '').split('\n').filter((l) => !/\(node:|node:internal|\[worker eval\]|\(\[eval\]:/.test(l)); // the driver's own frames
  return { name, value, traceback: stack };
}

const queue = [];
let busy = false;
async function next() {
  if (busy || !queue.length) return;
  busy = true;
  const req = queue.shift();
  current = req.id;
  let error = null;
  try {
    await run(req);
  } catch (e) {
    error = errorOf(e);
  }
  send({ id: current, done: true, error });
  current = null;
  busy = false;
  setImmediate(next);
}

// requests: lines on stdin, read when the loop is idle; an interrupt is
// SIGINT from the daemon (it stops a busy loop through breakOnSigint)
let rest = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => {
  rest += chunk;
  let i;
  while ((i = rest.indexOf('\n')) >= 0) {
    const line = rest.slice(0, i);
    rest = rest.slice(i + 1);
    let req;
    try { req = JSON.parse(line); } catch (e) { continue; }
    if (req && typeof req === 'object' && !req.interrupt) {
      queue.push(req);
      next();
    }
  }
});
process.stdin.on('end', () => process.exit(0));
send({ ready: true, pid: process.pid, version: process.version });
