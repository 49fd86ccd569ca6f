# sbx's Python code context: one process per context, inside the sandbox.
# Requests come as JSON lines on fd 0 ({"id", "code", "timeout"} or
# {"interrupt": id}); everything goes back as JSON lines on fd 1:
# {"ready"}, then per run {"id", "stream", "text"}, {"id", "result"} and
# {"id", "done", "error"}. User code gets /dev/null as stdin, and its fd 1
# and 2 (subprocesses included) are pumped into stream messages.
import ast
import base64
import codecs
import io
import json
import os
import queue
import signal
import sys
import threading
import time
import traceback

os.environ.pop('SBX_DRIVER', None)
os.environ.setdefault('MPLBACKEND', 'Agg')
_ctl_fd = os.dup(1)
_in_fd = os.dup(0)
_lock = threading.Lock()
_main = threading.get_ident()  # the thread that runs the code: signal handlers run in it
_driver_pid = os.getpid()  # a child the code forks is another
_forked = [False]  # this is such a child, forked by os.fork (or multiprocessing, which uses it)


def _in_child():
    """A child the code forked (its own stdout state, fresh locks)."""
    _forked[0] = True
    for stream in _std:
        stream._child_lock._at_fork_reinit()


os.register_at_fork(after_in_child=_in_child)
_current = [None]  # the id of the run in progress


_writing = [0]  # the main thread is sending: a SIGINT then waits for it to end
_deferred = [False]  # one did


def _whole_begin():
    """What the main thread sends from here to _whole_end goes whole: a
    run's KeyboardInterrupt raised in the middle of a message would leave
    half a line (the daemon would never read the run's end), and raised
    between the messages of a flush would lose text that was printed. It
    is raised at the end, once all is sent. True on the main thread."""
    main = threading.get_ident() == _main
    _writing[0] += main
    return main


def _whole_end(main):
    _writing[0] -= main
    if main and _deferred[0] and not _writing[0] and sys.exc_info()[0] is None:
        _deferred[0] = False
        _on_sigint(signal.SIGINT, None)


def _write(msg):
    """One message on the control channel (_lock held)."""
    data = (json.dumps(msg, ensure_ascii=True, default=str) + '\n').encode()
    view = memoryview(data)
    while view:
        view = view[os.write(_ctl_fd, view):]


# Text printed and not sent yet: [run id, stream, pieces]. A print is two
# writes (its text, its newline) and a loop of prints many more: they go
# as one message every 50 ms, or every 64 KiB, instead of one each.
_pending = []
_pending_size = [0]
_kick = threading.Event()


_last_flush = [0.0]


def _flush_locked():
    if _pending:
        _last_flush[0] = time.monotonic()
    items = _pending[:]
    del _pending[:]
    _pending_size[0] = 0
    for run, name, pieces in items:
        for texts in _entries(pieces):
            _write({'id': run, 'stream': name, 'texts': texts})


def _entries(pieces):
    """Pieces of text as the log's entries (a piece not ending a line joins
    the next, up to 4 KiB), in messages of at most 512 KiB (the daemon
    takes up to 8 MiB a line)."""
    msgs, cur, size = [], [], 0
    for p in pieces:
        for i in range(0, len(p), 1 << 19):
            piece = p[i:i + (1 << 19)]
            if cur and not cur[-1].endswith('\n') and len(cur[-1]) + len(piece) <= 4096:
                cur[-1] += piece
            else:
                if cur and size + len(piece) > 1 << 19:
                    msgs.append(cur)
                    cur, size = [], 0
                cur.append(piece)
            size += len(piece)
    if cur:
        msgs.append(cur)
    return msgs


def _send(msg):
    """A message, after the text printed before it (never from a child the
    code forked: results and the run's end are the driver's to send)."""
    if _forked[0] or os.getpid() != _driver_pid:
        return
    _deliver(msg)


def _deliver(msg=None):
    """What is printed and not sent yet, then msg (if any), whole."""
    main = _whole_begin()
    try:
        with _lock:
            _flush_locked()
            if msg is not None:
                _write(msg)
    finally:
        _whole_end(main)


_soon = [False]  # the flusher's next wait is short


def _queue_text(name, s):
    with _lock:
        if _pending and _pending[-1][0] == _current[0] and _pending[-1][1] == name:
            _pending[-1][2].append(s)
        else:
            _pending.append([_current[0], name, [s]])
        _pending_size[0] += len(s)
        # the first line after a quiet while goes at once (long work may
        # follow, which the flusher thread cannot interrupt); the rest in
        # batches. A text that does not end a line waits 2 ms for the rest
        # of it (a print is its text, then its newline: one message)
        quiet = time.monotonic() - _last_flush[0] >= 0.05
        if not (_pending_size[0] >= 65536 or (quiet and s.endswith('\n'))):
            _soon[0] = _soon[0] or quiet
            # (set() takes a lock and notifies: a print's biggest cost; a
            # notify an exception cut short is made up by the flusher's
            # own wake-up, once a second)
            if not _kick.is_set():
                _kick.set()
            return
    _deliver()


def _flusher():
    while True:
        if not _kick.wait(1) and not _pending:
            continue
        time.sleep(0.002 if _soon[0] else 0.05)  # what is printed meanwhile goes with it
        _soon[0] = False
        _kick.clear()
        with _lock:
            _flush_locked()


threading.Thread(target=_flusher, daemon=True).start()

_real_exit = os._exit


def _exit(status):
    """os._exit() from the code: what it printed goes out first, so that
    the run's answer has it; a forked child's copy of that text does not,
    its own lines do."""
    if os.getpid() != _driver_pid:
        for stream in _std:
            try:
                stream.flush()
            except Exception:
                pass
    elif _lock.acquire(timeout=1):
        try:
            _flush_locked()
        finally:
            _lock.release()
    _real_exit(status)


os._exit = _exit


_pipes = []  # (read fd, lock held while a chunk is read and sent)


def _pump(fd, name, plock):
    import select
    text = codecs.getincrementaldecoder('utf-8')('replace')  # a character cut by a chunk's end is whole in the next
    while True:
        select.select([fd], [], [])
        with plock:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            # a line an entry, as the logs go (a line cut by the chunk's end joins the next)
            lines = text.decode(chunk).splitlines(True)
            if lines:
                _send({'id': _current[0], 'stream': name, 'texts': lines})


def _drain():
    """What subprocesses wrote before the run ended goes out before its end."""
    import fcntl
    import termios
    deadline = time.monotonic() + 0.5
    for fd, plock in _pipes:
        while time.monotonic() < deadline:
            n = fcntl.ioctl(fd, termios.FIONREAD, b'\0\0\0\0')
            if int.from_bytes(n, sys.byteorder) == 0:
                break
            time.sleep(0.001)
        with plock:
            pass


class _Stream(io.TextIOBase):
    """sys.stdout and sys.stderr: text straight to the control channel, in
    order with results; a file as far as code can tell (writelines, buffer
    for bytes). In a child the code forked, fd 1 and 2 (the pipes this
    process pumps): the child has none of the driver's threads, and its
    copy of what the driver holds is not its to send."""

    encoding = 'utf-8'
    errors = 'replace'

    def __init__(self, name):
        super().__init__()
        self.name = name
        self.buffer = _Bytes(self)
        # a forked child's text not written yet: whole lines go, as a pipe's stdout does
        self._line, self._line_size, self._child_lock = [], 0, threading.Lock()

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError('write() argument must be str, not %s' % type(s).__name__)
        if s and _forked[0]:  # (a getpid at each write doubled a print's cost: children of libc's fork print as the driver)
            with self._child_lock:
                self._line.append(s)
                self._line_size += len(s)
                full = '\n' in s or self._line_size >= 8192
            if full:
                self.flush()
        elif s:
            _queue_text(self.name, s)
        return len(s)

    def flush(self):
        if not self._line or os.getpid() == _driver_pid:
            return
        with self._child_lock:
            data = ''.join(self._line).encode('utf-8', 'replace')
            self._line, self._line_size = [], 0
            while data:
                data = data[os.write(self.fileno(), data):]

    def close(self):
        pass  # the run's output goes on: closing it is nothing

    def isatty(self):
        return False

    def fileno(self):
        return 1 if self.name == 'stdout' else 2

    def writable(self):
        return True


class _Bytes(io.RawIOBase):
    """sys.stdout.buffer: bytes as UTF-8 text (a character split between two
    writes is whole in the second)."""

    def __init__(self, text):
        super().__init__()
        self._text = text
        self._decoder = codecs.getincrementaldecoder('utf-8')('replace')

    def write(self, b):
        self._text.write(self._decoder.decode(bytes(b)))
        return len(b)

    def writable(self):
        return True

    def close(self):
        pass

    def fileno(self):
        return self._text.fileno()


for _fd, _name in ((1, 'stdout'), (2, 'stderr')):
    _r, _w = os.pipe()
    os.dup2(_w, _fd)
    os.close(_w)
    _plock = threading.Lock()
    _pipes.append((_r, _plock))
    threading.Thread(target=_pump, args=(_r, _name, _plock), daemon=True).start()
_null = os.open('/dev/null', os.O_RDONLY)
os.dup2(_null, 0)
os.close(_null)
sys.stdin = open(0, 'r', closefd=False)  # /dev/null: reads find its end


def _input(prompt=''):
    """input(): a run has no input, and says so (an EOFError, as at the end
    of any input)."""
    if prompt:
        sys.stdout.write(str(prompt))
    raise EOFError('runCode has no input to read: put the data in the code, or run the program with exec and its stdin')
sys.stdout = _Stream('stdout')
sys.stderr = _Stream('stderr')
_std = (sys.stdout, sys.stderr)

_MIME = (('_repr_html_', 'html'), ('_repr_markdown_', 'markdown'), ('_repr_svg_', 'svg'), ('_repr_png_', 'png'),
         ('_repr_jpeg_', 'jpeg'), ('_repr_latex_', 'latex'), ('_repr_json_', 'json'), ('_repr_javascript_', 'javascript'))


def _figure_png(fig):
    import io
    buf = io.BytesIO()
    fig.savefig(buf, format='png', bbox_inches='tight')
    return base64.b64encode(buf.getvalue()).decode()


def _bundle(value):
    out = {}
    mod = type(value).__module__ or ''
    if mod.startswith('matplotlib') and hasattr(value, 'savefig'):
        out['png'] = _figure_png(value)
        _shown.add(id(value))
    for meth, key in _MIME:
        f = getattr(value, meth, None)
        if not callable(f) or isinstance(value, type):
            continue
        try:
            r = f()
        except Exception:
            continue
        if isinstance(r, tuple):
            r = r[0]
        if r is None:
            continue
        if key in ('png', 'jpeg') and isinstance(r, (bytes, bytearray)):
            r = base64.b64encode(r).decode()
        out[key] = r
    try:
        out['text'] = repr(value)
    except Exception as e:
        out['text'] = '<repr failed: %s>' % e
    return out


_shown = set()


def display(*values, **kw):
    """Adds each value to the run's results, in order (as in Jupyter)."""
    for v in values:
        if kw.get('raw') and isinstance(v, dict):
            _send({'id': _current[0], 'result': v})
        else:
            _send({'id': _current[0], 'result': _bundle(v)})


def _flush_figures():
    plt = sys.modules.get('matplotlib.pyplot')
    if not plt:
        return
    for num in plt.get_fignums():
        fig = plt.figure(num)
        if id(fig) not in _shown:
            _send({'id': _current[0], 'result': {'png': _figure_png(fig), 'text': repr(fig)}})
    plt.close('all')
    _shown.clear()


def _patch_show():
    plt = sys.modules.get('matplotlib.pyplot')
    if plt and getattr(plt.show, '__module__', '') != __name__:
        plt.show = lambda *a, **k: _flush_figures()
        plt.show.__module__ = __name__


# Cells run in a module of their own that is sys.modules['__main__'], as in
# Jupyter: what they define is __main__'s (pickle and multiprocessing find
# it there), and the driver's own names are not theirs to overwrite.
import builtins  # noqa: E402
import types  # noqa: E402
_driver_module = sys.modules['__main__']
_cells = types.ModuleType('__main__')
_cells.__dict__.update({'__builtins__': __builtins__, 'display': display})
sys.modules['__main__'] = _cells
_ns = _cells.__dict__
builtins.display = display
builtins.input = _input

# Top-level await, as in Jupyter: a cell that awaits runs on one event loop
# kept from cell to cell (what a cell leaves scheduled runs in the next).
_AWAIT = getattr(ast, 'PyCF_ALLOW_TOP_LEVEL_AWAIT', 0)
_loop = [None]


def _eval(code):
    value = eval(code, _ns)
    if _AWAIT and code.co_flags & 0x80:  # CO_COROUTINE: it awaits
        import asyncio
        if _loop[0] is None or _loop[0].is_closed():  # (code may close it: loop.close())
            _loop[0] = asyncio.new_event_loop()
        loop = _loop[0]
        asyncio.set_event_loop(loop)  # (asyncio.run() in a cell leaves none)
        task = loop.create_task(value)
        try:
            value = loop.run_until_complete(task)
        except BaseException:
            # interrupted, timed out: the cell's task ends here, not in a
            # later cell's turn of the loop
            task.cancel()
            try:
                loop.run_until_complete(asyncio.wait({task}, timeout=1))
            except BaseException:
                pass
            raise
    return value


def _run(code):
    tree = ast.parse(code, '<code>', 'exec')
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    _eval(compile(tree, '<code>', 'exec', flags=_AWAIT))
    _patch_show()
    if last is not None:
        value = _eval(compile(last, '<code>', 'eval', flags=_AWAIT))
        _patch_show()
        if value is not None:
            _ns['_'] = value
            _send({'id': _current[0], 'result': dict(_bundle(value), isMain=True)})


_requests = queue.Queue()
_live = [None]  # the id of the run whose code is executing (KeyboardInterrupt is for it)
_took = [None]  # the id of the run that has raised its KeyboardInterrupt
_started = [0]  # the id of the last run started (ids grow)
_early = [None]  # a run interrupted before it started: it does not run
_ilock = threading.Lock()  # a run starts, or SIGINT is sent for one, under it


def _on_sigint(signum, frame):
    """SIGINT while a run's code executes is its KeyboardInterrupt; between
    runs it is nothing (the driver's own code is not cut short)."""
    run = _live[0]
    if run is not None and _writing[0]:
        _deferred[0] = True
    elif run is not None:
        _took[0] = run
        raise KeyboardInterrupt


def _interrupt_once(run):
    """SIGINT to the main thread for a run (its id), if it is running and has
    not raised it yet; a run not started yet is marked not to run. True
    while it should be sent again."""
    if not isinstance(run, int):
        return False
    with _ilock:
        if run > _started[0]:  # its line came before it started (a cancel at once)
            _early[0] = run
            return False
        if _live[0] != run or _took[0] == run:
            return False
        signal.pthread_kill(_main, signal.SIGINT)
        return True


def _interrupt(run):
    """Interrupts a run. SIGINT goes to the main thread itself, not to the
    process (which may hand it to any thread), and again every 50 ms until
    the run has raised it or ended: a signal that lands between Python's
    last look at signals and a blocking call (time.sleep, a read) is only
    seen when that call returns, which may be never."""
    while _interrupt_once(run):
        time.sleep(0.05)


def _own_sigint():
    """SIGINT is the driver's again: a handler a run set lasts for that run
    (as Jupyter runs each cell with Python's default one)."""
    if signal.getsignal(signal.SIGINT) is not _on_sigint:
        signal.signal(signal.SIGINT, _on_sigint)


def _reader():
    buf = b''
    while True:
        try:
            chunk = os.read(_in_fd, 1 << 20)
        except OSError:
            chunk = b''
        if not chunk:
            _requests.put(None)
            return
        buf += chunk
        while b'\n' in buf:
            line, buf = buf.split(b'\n', 1)
            try:
                req = json.loads(line)
            except ValueError:
                continue
            if 'interrupt' in req:
                try:
                    threading.Thread(target=_interrupt, args=(req['interrupt'],), daemon=True).start()
                except RuntimeError:  # no thread to be had (the code used them up): one try, from here
                    _interrupt_once(req['interrupt'])
            else:
                _requests.put(req)


threading.Thread(target=_reader, daemon=True).start()
signal.signal(signal.SIGINT, _on_sigint)
_send({'ready': True, 'pid': os.getpid(), 'version': sys.version.split()[0]})

def _child_done(e):
    """A child the code forked has come back to the driver at the end of
    the cell (it returned, raised or called sys.exit): it ends there, as a
    script's child would, and never answers for the run (that is the
    parent's). Nothing in the driver's own process."""
    if os.getpid() == _driver_pid:
        return
    code = 0  # (what it printed goes out in _exit)
    if isinstance(e, SystemExit):
        if isinstance(e.code, int):
            code = e.code
        elif e.code is not None:
            sys.stderr.write('%s\n' % e.code)
            code = 1
    elif e is not None:
        sys.stderr.write(''.join(traceback.format_exception(type(e), e, e.__traceback__)))
        code = 1
    _exit(code & 0xff)


def _cut(text, keep=65536):
    """At most keep characters of text: its start and its end."""
    if len(text) <= keep:
        return text
    return text[:keep // 2] + '\n[... %d characters cut ...]\n' % (len(text) - keep) + text[-keep // 2:]


while True:
    req = _requests.get()
    if req is None:
        break
    _current[0] = req.get('id')
    error = None
    timer = None
    timed_out = []
    timeout = req.get('timeout') or 0

    def _expire(run=_current[0], timed_out=timed_out):  # (this run's, should the timer fire late)
        timed_out.append(True)
        _interrupt(run)
    try:
        _own_sigint()  # (should an interrupt have cut the last run's finally short)
        with _ilock:
            run = _current[0]
            early = isinstance(run, int) and _early[0] == run
            if isinstance(run, int):
                _started[0] = run
            _live[0] = run
            _took[0] = None
        if early:  # cancelled before it started: it does not run
            raise KeyboardInterrupt
        if timeout > 0:
            timer = threading.Timer(timeout / 1000.0, _expire)
            timer.daemon = True
            timer.start()
        try:
            _run(req.get('code', ''))
            _child_done(None)
            _flush_figures()
        finally:
            _own_sigint()  # before an interrupt sent for the run is seen
            _live[0] = None
            if timer:
                timer.cancel()
    except BaseException as e:  # noqa: B902 (KeyboardInterrupt too: the context lives on)
        _child_done(e)
        _live[0] = None  # (an interrupt may have landed in the finally above)
        if timer:
            timer.cancel()
        if isinstance(e, SystemExit):
            error = {'name': 'SystemExit', 'value': str(e.code), 'traceback': []}
        else:
            if isinstance(e, SyntaxError) and e.filename == '<code>':
                # the cell did not parse: where in it, without the parser's frames
                tb = traceback.format_exception_only(type(e), e)
            else:
                tb = traceback.format_exception(type(e), e, e.__traceback__)
                # the driver's own frames are not the user's business
                tb = [t for t in tb if 'File "<string>"' not in t]
            error = {'name': type(e).__name__, 'value': str(e), 'traceback': tb}
            if timed_out and isinstance(e, KeyboardInterrupt):  # said as JavaScript's driver says it
                msg = 'the run was interrupted after %d ms; the context keeps its state' % timeout
                error = {'name': 'TimeoutError', 'value': msg, 'traceback': tb[:-1] + ['TimeoutError: %s\n' % msg]}
        try:
            _flush_figures()
        except Exception:
            pass
    _drain()
    if error:  # an error of megabytes would be a line too long for the daemon to take
        error['value'] = _cut(error['value'])
        error['traceback'] = [_cut(t) for t in error['traceback'][-100:]]
    _send({'id': _current[0], 'done': True, 'error': error})
    _current[0] = None
