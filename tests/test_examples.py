"""The examples run as a user would run them, and save a real PNG."""
import os
import struct
import subprocess
import sys

from sbxtest import SBX, Env, run_tests, wait_until

EX = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'examples')


class Ctx:
    def __init__(self):
        self.env = Env()

    def close(self):
        self.env.close()


def check_png(t, path, name):
    data = open(path, 'rb').read() if os.path.exists(path) else b''
    ok = data[:8] == b'\x89PNG\r\n\x1a\n' and data[12:16] == b'IHDR'
    w, h = struct.unpack('>II', data[16:24]) if ok else (0, 0)
    t.ok(ok and (w, h) == (320, 200), '%s saves a 320x200 PNG' % name, (len(data), w, h))


def test_python(t, x):
    out = os.path.join(x.env.root, 'py.png')
    p = subprocess.run([sys.executable, os.path.join(EX, 'python', 'client.py'), out], env=dict(x.env.env, SBX=SBX),
                       capture_output=True, timeout=120, cwd=x.env.root)
    t.ok(p.returncode == 0 and b'wrote /workspace/plot.png' in p.stdout, 'python example runs', p.stderr[-800:])
    check_png(t, out, 'python example')


def test_runcode(t, x):
    out = os.path.join(x.env.root, 'runcode.png')
    p = subprocess.run([sys.executable, os.path.join(EX, 'python', 'runcode.py'), out], env=dict(x.env.env, SBX=SBX),
                       capture_output=True, timeout=180, cwd=x.env.root)
    t.ok(p.returncode == 0 and b'rows: 12' in p.stdout and b'visits' in p.stdout,
         'runCode example: a CSV through pandas, described and plotted', (p.stdout[-400:], p.stderr[-800:]))
    data = open(out, 'rb').read() if os.path.exists(out) else b''
    w, h = struct.unpack('>II', data[16:24]) if data[:8] == b'\x89PNG\r\n\x1a\n' else (0, 0)
    t.ok(200 < w < 400 and 100 < h < 300, 'the plot comes back as an image block and saves as a PNG', (len(data), w, h))


def test_node(t, x):
    if not os.path.isdir(os.path.join(EX, 'node', 'node_modules')):
        t.skip('node example', 'run scripts/bootstrap first')
        return
    out = os.path.join(x.env.root, 'node.png')
    p = subprocess.run(['node', os.path.join(EX, 'node', 'client.mjs'), out], env=dict(x.env.env, SBX=SBX),
                       capture_output=True, timeout=120, cwd=x.env.root)
    t.ok(p.returncode == 0 and b'saved' in p.stdout, 'node example runs', p.stderr[-800:])
    check_png(t, out, 'node example')


def test_view_edit_build(t, x):
    if os.geteuid() != 0:
        t.skip('view example', 'the view example runs as root here')
        return
    mnt = os.path.join(x.env.root, 'view')
    try:
        p = subprocess.run([os.path.join(EX, 'view-edit-build.sh'), mnt, 'demo'], env=dict(x.env.env, SBX=SBX),
                           capture_output=True, timeout=120, cwd=x.env.root)
        out = p.stdout.decode()
        t.ok(p.returncode == 0 and 'hello from the sandbox' in out and "2:int main" in out,
             'the view example edits and greps through the mount and builds with sbx exec', out + p.stderr.decode())
        t.ok(os.path.exists(os.path.join(mnt, 'demo', 'hello', 'hello')), 'its binary shows in the view')
    finally:
        subprocess.run([SBX, 'umount', mnt], env=x.env.env, capture_output=True)
        subprocess.run(['umount', '-l', mnt], capture_output=True)
        # the view has ended before the environment goes
        wait_until(lambda: not view_pids(mnt), 30, 'the view of %s to end' % mnt)


def view_pids(mnt):
    """Processes serving a view mounted on mnt (`sbx mount MNT`)."""
    out = []
    for p in os.listdir('/proc'):
        try:
            argv = open('/proc/%s/cmdline' % p, 'rb').read().split(b'\0')
        except OSError:
            continue
        if b'mount' in argv and mnt.encode() in argv:
            out.append(int(p))
    return out


if __name__ == '__main__':
    sys.exit(run_tests([test_python, test_runcode, test_node, test_view_edit_build], Ctx))
