// sbx's JavaScript code context: one Node process per context, inside the
// sandbox. Requests come as JSON lines on fd 0 ({"id", "code", "timeout"});
// an interrupt is SIGINT; everything goes back as JSON lines on fd 1. Code runs in this
// realm (runInThisContext), rewritten as a cell (see cellWrap): top-level
// await, declarations that persist between runs as globals, the last
// expression as the result. The driver's own names live in the function
// below, not in the global scope user code shares: a cell may declare fs,
// current or out as its own.
(() => {
'use strict';
const fs = require('fs');
const util = require('util');
const vm = require('vm');
const { EventEmitter } = require('events');

delete process.env.SBX_DRIVER;
let current = null;

function send(m) {
  flush();
  write(m);
}

function write(m) {
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

// stdout and stderr: text straight to the control channel, in order with
// results. Sinks with no state of their own (a Writable stream's was left
// "writing" for good when a timeout or an interrupt stopped the code inside
// a write, and the context's output vanished from then on).
// Text printed and not sent yet ({id, stream, pieces}): a loop of
// console.log goes as one message every 50 ms or 64 KiB, not one a line.
const pending = [];
let pendingSize = 0, lastFlush = 0, flushTimer = null;
function flush() {
  const items = pending.splice(0);
  pendingSize = 0;
  if (items.length) lastFlush = Date.now();
  for (const { id, stream, pieces } of items) for (const texts of entries(pieces)) write({ id, stream, texts });
}

// Pieces of text as the log's entries (a piece not ending a line joins the
// next, up to 4 KiB), in messages of at most 512 KiB (the daemon takes up
// to 8 MiB a line).
function entries(pieces) {
  const msgs = [];
  let cur = [], size = 0;
  for (const p of pieces) {
    for (let i = 0; i < p.length; i += 1 << 19) {
      const piece = p.slice(i, i + (1 << 19));
      const last = cur.length ? cur[cur.length - 1] : null;
      if (last !== null && !last.endsWith('\n') && last.length + piece.length <= 4096) cur[cur.length - 1] = last + piece;
      else {
        if (size + piece.length > 1 << 19 && cur.length) msgs.push(cur), cur = [], size = 0;
        cur.push(piece);
      }
      size += piece.length;
    }
  }
  if (cur.length) msgs.push(cur);
  return msgs;
}
function queueText(stream, text) {
  const last = pending[pending.length - 1];
  if (last && last.id === current && last.stream === stream) last.pieces.push(text);
  else pending.push({ id: current, stream, pieces: [text] });
  pendingSize += text.length;
  // the first line after a quiet while goes at once; a busy loop never
  // lets a timer run, so it flushes as it prints
  if (pendingSize >= 65536 || Date.now() - lastFlush >= 50) flush();
  else if (!flushTimer) flushTimer = setTimeout(() => { flushTimer = null; flush(); }, 50);
}

function sink(name) {
  const s = new EventEmitter(); // console listens for 'error' on it
  s.write = (chunk, enc, cb) => {
    const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString();
    if (text) queueText(name, text);
    if (typeof enc === 'function') enc();
    else if (typeof cb === 'function') cb();
    return true;
  };
  return s;
}
const out = sink('stdout'), err = sink('stderr');
// What a cell left behind that fails later (a promise nobody awaits, a
// throw in a timer) is not the end of the context and all it holds: as in
// Node's REPL it is printed (on the stderr of the run in progress, else of
// the next one) and the context goes on; a run awaiting what it broke
// waits, as there, for its timeout or a cancel.
let late = [];
function uncaught(e, how) {
  let text;
  try {
    const err = errorOf(e);
    text = err.traceback.length ? err.traceback.join('\n') : `${err.name}: ${err.value}`;
  } catch (x) {
    text = 'an error that cannot be shown';
  }
  if (current !== null) queueText('stderr', `${how} ${text}\n`);
  else if (late.length < 16) late.push(`${how} (after an earlier run) ${text}\n`);
}
process.on('unhandledRejection', (e) => uncaught(e, 'Uncaught (in promise)'));
process.on('uncaughtException', (e) => uncaught(e, 'Uncaught'));
// ignoreErrors: false, or each log adds and removes an error listener (10 us a line)
globalThis.console = new console.Console({ stdout: out, stderr: err, ignoreErrors: false });
process.stdout.write = out.write;
process.stderr.write = err.write;
globalThis.require = require;
globalThis.module = module;
// process.exit() in a cell ends the cell, not the context, as sys.exit()
// does in Python's: a ProcessExit error with its code; the driver keeps
// the real one for the end of its input
const exit = process.exit.bind(process);
process.exit = (code) => {
  throw Object.assign(new Error(String(code === undefined ? (process.exitCode ?? 0) : code)), { name: 'ProcessExit' });
};

function bundle(v) {
  const b = { text: typeof v === 'string' ? v : util.inspect(v, { depth: 4 }) };
  // json: what JSON says of it, where that is what it holds (a Map, a Set,
  // a Promise, a typed array are not: {} or its bytes as keys)
  const proto = v !== null && typeof v === 'object' ? Object.getPrototypeOf(v) : undefined;
  const opaque = [Error, Map, Set, WeakMap, WeakSet, Promise, RegExp, ArrayBuffer].some((t) => v instanceof t) ||
    ArrayBuffer.isView(v);
  if (proto !== undefined && !opaque) {
    try {
      const j = JSON.stringify(v);
      // an instance whose JSON is {} says nothing of it (its state is private, or not enumerable)
      if (j !== undefined && !(j === '{}' && proto !== Object.prototype && proto !== null)) b.json = JSON.parse(j);
    } catch (e) { /* not JSON: text only */ }
  }
  return b;
}

globalThis.display = (...vs) => { for (const v of vs) send({ id: current, result: bundle(v) }); };

// ---- cells --------------------------------------------------------------
// A cell runs in an async function (top-level await): its top-level
// declarations are made globals (so they persist, and can be declared
// again by a later cell) and its last statement, when it is an expression,
// is the result. Statements are found by a small tokenizer (strings,
// templates, comments, regular expressions, brackets) with the rules of
// automatic semicolon insertion at newlines; V8 checks the rewrite.

const WORD = /[A-Za-z0-9_$\u0080-\uffff]/;
// after these a `/` starts a regular expression; after other words, a division
const BEFORE_EXPR = new Set(['return', 'typeof', 'instanceof', 'in', 'of', 'new', 'delete', 'void', 'throw', 'case',
  'do', 'else', 'await', 'yield']);
// a newline after these ends the statement (restricted productions)
const ENDS_AT_NEWLINE = new Set(['return', 'break', 'continue', 'yield', 'debugger']);
// a statement that ends with the block that closes it
const BLOCK_STATEMENT = /^(?:function|async\s+function|class|if|for|while|try|switch|do|with)\b|^\{/;
// tokens that, first on a line, continue the statement before
const CONTINUES = new Set(['(', '[', '.', '?.', ',', '?', ':', '=', '+', '-', '*', '/', '%', '&', '|', '^', '<', '>',
  '`', '=>', 'in', 'instanceof', 'of']);
const CONTINUED_BY = new Set(['else', 'catch', 'finally', 'while']);

// Tokens of code: {t: text, at: index, nl: a newline before it, type}.
function tokens(code) {
  const out = [];
  const templates = []; // bracket depth at each open template's `${`
  let i = 0, nl = false, depth = 0;
  const push = (type, start, end) => { out.push({ type, t: code.slice(start, end), at: start, end, nl, depth }); nl = false; };
  const template = (start) => { // from after a backquote or a `}` closing `${`: to the next `${` or the end
    let j = start;
    while (j < code.length && code[j] !== '`') {
      if (code[j] === '\\') j += 2;
      else if (code[j] === '$' && code[j + 1] === '{') { templates.push(depth); depth++; return j + 2; }
      else j++;
    }
    return j + 1;
  };
  while (i < code.length) {
    const c = code[i];
    if (c === '\n' || c === '\u2028' || c === '\u2029') { nl = true; i++; continue; }
    if (/\s/.test(c)) { i++; continue; }
    if (c === '/' && code[i + 1] === '/') { while (i < code.length && code[i] !== '\n') i++; continue; }
    if (c === '/' && code[i + 1] === '*') {
      const e = code.indexOf('*/', i + 2), end = e < 0 ? code.length : e + 2;
      if (code.slice(i, end).includes('\n')) nl = true;
      i = end;
      continue;
    }
    const start = i;
    if (c === '"' || c === "'") {
      i++;
      while (i < code.length && code[i] !== c && code[i] !== '\n') i += code[i] === '\\' ? 2 : 1;
      push('str', start, ++i);
    } else if (c === '`') {
      i = template(i + 1);
      push('str', start, i);
    } else if (c === '}' && templates.length && templates[templates.length - 1] === depth - 1) {
      templates.pop();
      depth--;
      i = template(i + 1);
      push('str', start, i);
    } else if (WORD.test(c)) {
      while (i < code.length && WORD.test(code[i])) i++;
      if (/^[0-9]/.test(code.slice(start, i)) && code[i] === '.') { i++; while (i < code.length && WORD.test(code[i])) i++; }
      push('word', start, i);
    } else if (c === '/') {
      const p = out[out.length - 1];
      const regex = !p || (p.type === 'punct' && !/^[)\]]$/.test(p.t)) || (p.type === 'word' && BEFORE_EXPR.has(p.t));
      if (regex) {
        i++;
        let cls = false;
        while (i < code.length && code[i] !== '\n' && (cls || code[i] !== '/')) {
          if (code[i] === '\\') i++;
          else if (code[i] === '[') cls = true;
          else if (code[i] === ']') cls = false;
          i++;
        }
        i++;
        while (i < code.length && WORD.test(code[i])) i++;
        push('regex', start, i);
      } else {
        i++;
        push('punct', start, i);
      }
    } else {
      const two = code.slice(i, i + 2);
      if (two === '++' || two === '--' || two === '=>' || two === '?.') i += 2;
      else i++;
      if ('([{'.includes(c)) depth++;
      push('punct', start, i);
      if (')]}'.includes(c)) { depth--; out[out.length - 1].depth = depth; }
    }
  }
  return out;
}

// Whether the top-level `)` toks[k] closes the head of an if, for, while
// or with (whose body may be on the next line), not a do's while.
function closesHead(toks, k, first) {
  let open = k - 1;
  while (open >= first && !(toks[open].t === '(' && toks[open].depth === 1)) open--;
  let kw = open - 1 >= first ? toks[open - 1] : null;
  if (kw && kw.t === 'await' && open - 2 >= first) kw = toks[open - 2]; // for await (...)
  if (!kw || kw.type !== 'word' || !/^(?:if|for|while|with)$/.test(kw.t)) return false;
  return !(kw.t === 'while' && toks[first].t === 'do');
}

// The top-level statements of code (toks: its tokens), as [start, end) spans of it.
function statements(code, toks) {
  const spans = [];
  let first = 0; // index of the statement's first token
  const end = (k) => { // the statement ends after token k
    spans.push([toks[first].at, toks[k].end]);
    first = k + 1;
  };
  for (let k = 0; k < toks.length; k++) {
    const tk = toks[k], next = toks[k + 1];
    if (tk.depth !== 0) continue;
    if (tk.t === ';') { end(k); continue; }
    if (!next) break;
    if (tk.t === '}' && !CONTINUED_BY.has(next.t) && BLOCK_STATEMENT.test(code.slice(toks[first].at, tk.end))) {
      end(k);
      continue;
    }
    if (!next.nl) continue;
    if (next.t === '++' || next.t === '--' || (tk.type === 'word' && ENDS_AT_NEWLINE.has(tk.t))) { end(k); continue; }
    const ends = tk.type === 'str' || tk.type === 'regex' || tk.t === ')' || tk.t === ']' || tk.t === '}' ||
      tk.t === '++' || tk.t === '--' || (tk.type === 'word' && !BEFORE_EXPR.has(tk.t) &&
      !/^(?:let|const|var|async|function|class|extends|if|for|while|with|switch|import|export)$/.test(tk.t));
    const continues = CONTINUES.has(next.t) || (next.t === '!' && code[next.at + 1] === '=') ||
      (tk.t === ')' && closesHead(toks, k, first));
    if (ends && !continues) end(k);
  }
  if (first < toks.length) spans.push([toks[first].at, toks[toks.length - 1].end]);
  return spans;
}

const DECL = /^(let|const|var)(?=[\s{[])/;
const NAMED = /^(?:async\s+)?(?:function\s*\*?|class)\s*([A-Za-z_$][\w$]*)/;
const NOT_EXPR = /^(?:let|const|var|function|async\s+function|class|if|for|while|do|return|try|switch|throw|import|export|break|continue|debugger|with)\b|^[{;]/;

// `let a = 1, {b} = f(), c` as assignments to globals:
// `void ((a = 1), ({b} = f()), (c = undefined))` (`var c` keeps c's value).
function assignments(text) {
  const kind = DECL.exec(text)[1];
  const body = text.replace(DECL, '').replace(/;\s*$/, '');
  const parts = [];
  let from = 0;
  for (const tk of tokens(body)) {
    if (tk.t === ',' && tk.depth === 0) {
      parts.push(body.slice(from, tk.at));
      from = tk.end;
    }
  }
  parts.push(body.slice(from));
  const set = parts.map((d) => d.trim()).filter(Boolean).map((d) => {
    if (d.includes('=')) return `(${d})`;
    return kind === 'var' ? `(globalThis.${d} = globalThis.${d})` : `(${d} = undefined)`;
  });
  return set.length ? `void (${set.join(', ')});` : ';';
}

// ES modules from a cell: a cell is a script (in an async function), where
// `import x from "m"` is a syntax error and import() has no loader. Each
// import statement becomes a declaration from a dynamic import, so its
// names persist between runs like any declaration, and every import() goes
// through the driver's own, which resolves as code in the context's
// directory would: `./x.mjs` from its cwd, packages from its node_modules.
const IMPORT = 'globalThis[Symbol.for("sbx.import")]';
const DEFAULT = 'globalThis[Symbol.for("sbx.default")]'; // what `export default` gives: the cell's value
Object.defineProperty(globalThis, Symbol.for('sbx.import'), {
  value: (spec) => {
    const path = require('path'), { pathToFileURL } = require('url');
    let target = String(spec);
    if (/^\.{0,2}\//.test(target)) target = pathToFileURL(path.resolve(process.cwd(), target)).href;
    else if (!/^[A-Za-z][\w+.-]*:/.test(target) && !require('module').builtinModules.includes(target)) {
      try {
        target = pathToFileURL(require('module').createRequire(path.join(process.cwd(), '[cell]')).resolve(target)).href;
      } catch (e) {
        // an ES-only package (exports without require): import() finds it, or says why not
      }
    }
    return import(target);
  },
});

// `import X, {a as b} from "m"` as `const { default: X, a: b } = await
// import("m")` (on as many lines as it took); null when the clause is not
// one this reads.
function importDecl(clause, call) {
  const m = /^(?:([A-Za-z_$][\w$]*)\s*(?:,\s*)?)?(?:\*\s*as\s+([A-Za-z_$][\w$]*)|\{([^}]*)\})?$/.exec(clause);
  if (!m || (!m[1] && !m[2] && m[3] === undefined)) return null;
  if (m[2]) return `const ${m[2]} = ${call}${m[1] ? `, ${m[1]} = ${m[2]}.default` : ''};`;
  const parts = (m[3] || '').split(',').map((p) => p.trim()).filter(Boolean)
    .map((p) => p.replace(/^(\S+)\s+as\s+([A-Za-z_$][\w$]*)$/, '$1: $2'));
  if (m[1]) parts.unshift(`default: ${m[1]}`);
  return `const { ${parts.join(', ')} } = ${call};`;
}

function rewriteImports(code) {
  const toks = tokens(code);
  let out = '', at = 0;
  for (let k = 0; k < toks.length; k++) {
    const tk = toks[k], next = toks[k + 1], prev = toks[k - 1];
    if (tk.type === 'word' && tk.t === 'export' && next && tk.depth === 0 && (!prev || prev.t === ';' || prev.t === '}' || tk.nl)) {
      // a module's export in a cell: `export const x`, `export function
      // f` and `export default v` are what they declare or say (a cell has
      // no exports); `export {a}` and `export * from "m"` are nothing
      if (/^(?:const|let|var|function|async|class)$/.test(next.t)) {
        out += code.slice(at, tk.at);
        at = next.at;
        continue;
      }
      if (next.t === 'default') { // a named function or class is declared; anything else is a value
        const a = toks[k + 2], b = toks[k + 3], c = toks[k + 4];
        const named = a && ((a.t === 'class' && b && b.type === 'word' && b.t !== 'extends') ||
          (a.t === 'function' && b && (b.type === 'word' || (b.t === '*' && c && c.type === 'word'))) ||
          (a.t === 'async' && b && b.t === 'function' && c && (c.type === 'word' || c.t === '*')));
        out += code.slice(at, tk.at) + (named ? '' : `${DEFAULT} =`);
        at = named ? a.at : next.end;
        continue;
      }
      if (next.t === '{' || next.t === '*') {
        let e = k + 1;
        while (e + 1 < toks.length && toks[e].t !== ';' && !(toks[e + 1].nl && toks[e].depth === 0 && (toks[e].type === 'str' || toks[e].t === '}'))) e++;
        const end = toks[e].end;
        out += code.slice(at, tk.at) + '\n'.repeat(code.slice(tk.at, end).split('\n').length - 1);
        at = end;
        k = e;
        continue;
      }
    }
    if (tk.type !== 'word' || tk.t !== 'import' || !next || (prev && (prev.t === '.' || prev.t === '?.'))) continue;
    if (next.t === '(') { // import(x), not a method of that name (`import(m) {...}`)
      let close = k + 1;
      while (close < toks.length && !(toks[close].t === ')' && toks[close].depth === tk.depth)) close++;
      const after = toks[close + 1];
      if (after && after.t === '{' && !after.nl && (!prev || /^(?:[{,;}*]|static|async|get|set)$/.test(prev.t))) continue;
      out += code.slice(at, tk.at) + IMPORT;
      at = tk.end;
      continue;
    }
    // a statement of its own (import.meta and the like stay as written)
    if (next.t === '.' || tk.depth !== 0 || (prev && prev.t !== ';' && prev.t !== '}' && !tk.nl)) continue;
    let s = k + 1, clause = '';
    if (next.type !== 'str') { // import CLAUSE from "m"
      let f = k + 1;
      while (f < toks.length && !(toks[f].t === 'from' && toks[f].depth === 0)) f++;
      if (f + 1 >= toks.length || toks[f + 1].type !== 'str') continue;
      clause = code.slice(next.at, toks[f].at).trim();
      s = f + 1;
    }
    const after = toks[s + 1];
    if (after && !after.nl && after.t !== ';') continue; // import attributes (with {...}): left as written
    const end = after && after.t === ';' ? after.end : toks[s].end;
    const call = `await ${IMPORT}(${toks[s].t})`;
    const decl = clause ? importDecl(clause, call) : `${call};`;
    if (!decl) continue;
    out += code.slice(at, tk.at) + decl + '\n'.repeat(code.slice(tk.at, end).split('\n').length - 1);
    at = end;
    k = after && after.t === ';' ? s + 1 : s;
  }
  return out + code.slice(at);
}

const RETURN = 'return { value: (';
// A cell's script makes its async function; this one calls it (under the
// same timeout and interrupt), so that its frame, by its name, is left out
// of a stack.
const callCell = new vm.Script('globalThis[Symbol.for("sbx.cell")]()', { filename: '<sbx-call>' });
function runCell(script, opts) {
  globalThis[Symbol.for('sbx.cell')] = script.runInThisContext(opts);
  try {
    return callCell.runInThisContext(opts);
  } finally {
    delete globalThis[Symbol.for('sbx.cell')];
  }
}

// Code as an async function whose top-level declarations become globals
// and whose last expression is returned as {value} (a promise it names is
// a result, not awaited): {script, isAsync}; script null when the code
// cannot be rewritten (V8 refuses the rewrite, or it is strict mode code,
// where assignments do not make globals).
function cellWrap(code) {
  const toks = tokens(code);
  const isAsync = toks.some((tk) => tk.type === 'word' && tk.t === 'await');
  if (toks[0] && toks[0].type === 'str' && /^['"]use strict['"]$/.test(toks[0].t)) return { script: null, isAsync };
  const spans = statements(code, toks);
  // each statement stays on its lines, so that an error's line is the
  // cell's (the wrapper's first line is taken off by lineOffset)
  const lines = (text) => text.split('\n').length - 1;
  const wrap = (early) => {
    let out = '', at = 0, head = '(async () => {';
    spans.forEach(([s, e], n) => {
      const text = code.slice(s, e), gap = code.slice(at, s);
      at = e;
      if (DECL.test(text)) {
        const set = assignments(text);
        out += gap + set + '\n'.repeat(Math.max(0, lines(text) - lines(set)));
      } else if (n === spans.length - 1 && !NOT_EXPR.test(text)) {
        // early: the return goes before the blanks and comments that lead
        // to the expression (on the line before it), so that its columns
        // stay the cell's
        if (early && !out) head += RETURN;
        else if (early) out += `;${RETURN}`;
        out += `${gap}${early ? '' : RETURN}${text.replace(/;\s*$/, '')}\n) };`;
      } else {
        out += gap + text;
        const m = NAMED.exec(text);
        if (m) out += `;globalThis.${m[1]} = ${m[1]};`;
      }
    });
    out += code.slice(at);
    return `${head}\n${out}\n})`;
  };
  // early when that leaves the expression's line as it is: it is the
  // first statement, or a line ends before it
  const n = spans.length, ahead = n === 1 || (n > 1 && code.slice(spans[n - 2][1], spans[n - 1][0]).includes('\n'));
  for (const early of ahead ? [true, false] : [false]) {
    const wrapped = wrap(early);
    try {
      return { script: new vm.Script(wrapped, { filename: '<code>', lineOffset: -1 }), isAsync };
    } catch (e) {
      // (early: something in the way, tried again as before)
    }
  }
  return { script: null, isAsync };
}

let abandon = null; // rejects the awaited run when interrupted or timed out
process.on('SIGINT', () => { if (abandon) abandon(Object.assign(new Error('interrupted'), { name: 'KeyboardInterrupt' })); });

// Every cell runs rewritten (cellWrap), so that a cell run again, its
// let, const and class declared again, works as in a notebook or Node's
// REPL; code that cannot be rewritten runs as written (with await: in an
// async function, without a result).
async function run(req) {
  const timeout = req.timeout > 0 ? Math.min(req.timeout, 2147483647) : undefined; // setTimeout's limit
  const code = rewriteImports(String(req.code || ''));
  const opts = { filename: '<code>', breakOnSigint: true, timeout };
  const cell = cellWrap(code);
  let value;
  if (cell.script || cell.isAsync) {
    let timer;
    const started = runCell(cell.script || new vm.Script(`(async () => {\n${code}\n})`, { filename: '<code>', lineOffset: -1 }),
      opts);
    const done = await Promise.race([started,
      new Promise((_, reject) => {
        abandon = reject;
        if (timeout) {
          timer = setTimeout(() => reject(Object.assign(new Error(
            `the run was abandoned after ${timeout} ms (what it awaits may still finish); the context keeps its state`),
          { name: 'TimeoutError' })), timeout);
        }
      })]).finally(() => { clearTimeout(timer); abandon = null; });
    value = cell.script && done ? done.value : undefined;
  } else {
    value = vm.runInThisContext(code, opts);
  }
  if (value !== undefined) {
    globalThis._ = value;
    send({ id: current, result: Object.assign(bundle(value), { isMain: true }) });
  }
}

function errorOf(e) {
  if (!(e instanceof Object) || !('message' in e)) return { name: 'Error', value: cut(String(e)), traceback: [] };
  let name = e.name || 'Error', value = e.message;
  if (e.code === 'ERR_SCRIPT_EXECUTION_TIMEOUT') name = 'TimeoutError';
  if (e.code === 'ERR_SCRIPT_EXECUTION_INTERRUPTED') name = 'KeyboardInterrupt';
  const stack = String(e.stack || '').split('\n').filter((l) => !/\(node:|node:internal|\[worker eval\]|\(\[eval\]:|<sbx-call>/.test(l)); // the driver's own frames
  // an error of megabytes would be a line too long for the daemon to take
  return { name: cut(String(name)), value: cut(String(value)), traceback: stack.slice(-100).map((line) => cut(line)) };
}

// At most `keep` characters of a text: its start and its end.
function cut(text, keep = 65536) {
  if (text.length <= keep) return text;
  return `${text.slice(0, keep / 2)}\n[... ${text.length - keep} characters cut ...]\n${text.slice(-keep / 2)}`;
}

const queue = [];
let busy = false;
async function next() {
  if (busy || !queue.length) return;
  busy = true;
  const req = queue.shift();
  current = req.id;
  for (const text of late.splice(0)) queueText('stderr', text);
  let error = null;
  try {
    await run(req);
  } catch (e) {
    try {
      error = errorOf(e);
    } catch (x) { // a thrown object whose message or stack throws
      error = { name: 'Error', value: '(an error that cannot be shown: reading it threw)', traceback: [] };
    }
  } finally {
    send({ id: current, done: true, error });
    current = null;
    busy = false;
    setImmediate(next);
  }
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
process.stdin.on('end', () => exit(0));
send({ ready: true, pid: process.pid, version: process.version });
})();
