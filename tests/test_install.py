"""meson install: sbx and sbx-init on the PATH, the man page sbx(1), bash
completion and systemd units, and the installed sbx works on its own (no
file of the source tree or the build directory needed)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile

from sbxtest import SBX, run_tests

BUILD = os.path.dirname(SBX)


class Ctx:
    def __init__(self):
        self.root = tempfile.mkdtemp(prefix='sbxt-install-', dir='/tmp')
        self.dest = os.path.join(self.root, 'dest')
        r = subprocess.run(['meson', 'install', '-C', BUILD, '--no-rebuild', '--quiet', '--destdir', self.dest],
                           capture_output=True, text=True)
        self.install = r
        prefix = subprocess.run(['meson', 'introspect', BUILD, '--buildoptions'], capture_output=True, text=True)
        import json
        opts = {o['name']: o['value'] for o in json.loads(prefix.stdout)}
        self.prefix = self.dest + opts['prefix']
        self.bindir = os.path.join(self.prefix, opts['bindir'])
        self.env = dict(os.environ, SBX_RUNTIME_DIR=os.path.join(self.root, 'run'),
                        SBX_STATE_DIR=os.path.join(self.root, 'state'),
                        PATH=self.bindir + ':/usr/sbin:/usr/bin:/sbin:/bin')

    def sbx(self, *args, **kw):
        return subprocess.run(['sbx'] + list(args), env=self.env, capture_output=True, cwd=self.root, timeout=120, **kw)

    def close(self):
        self.sbx('daemon', 'stop')
        shutil.rmtree(self.root, ignore_errors=True)


def test_files(t, x):
    t.eq(x.install.returncode, 0, 'meson install succeeds', x.install.stderr)
    for rel in ['bin/sbx', 'bin/sbx-init', 'share/man/man1/sbx.1', 'share/bash-completion/completions/sbx',
                'lib/systemd/system/sbx.service', 'lib/systemd/user/sbx.service']:
        t.ok(os.path.isfile(os.path.join(x.prefix, rel)), 'installs %s' % rel)
    for unit in ['system', 'user']:
        text = open(os.path.join(x.prefix, 'lib/systemd', unit, 'sbx.service')).read()
        exe = re.search(r'^ExecStart=(\S+) daemon$', text, re.M)
        t.ok(exe and exe.group(1) == os.path.join(x.bindir, 'sbx')[len(x.dest):],
             'the %s unit starts the installed sbx' % unit, text)


def test_installed_sbx_works(t, x):
    r = x.sbx('--version')
    t.ok(r.returncode == 0 and r.stdout.startswith(b'sbx '), 'sbx --version from the PATH', r.stdout + r.stderr)
    r = x.sbx('exec', '-s', 'installed', '--', 'echo "$0 works"; f() { echo kept; }')
    t.eq((r.returncode, r.stdout), (0, b'bash works\n'), 'the installed sbx runs a sandbox (its sbx-init beside it)',
         r.stderr)
    t.eq(x.sbx('exec', '-s', 'installed', '--', 'f').stdout, b'kept\n', 'with its sessions')


def test_man_page_and_completion(t, x):
    man = open(os.path.join(x.prefix, 'share/man/man1/sbx.1')).read()
    usage = x.sbx('-h').stdout.decode()
    cmds = re.findall(r'^  sbx (\S+)', usage, re.M)
    t.ok(len(cmds) >= 12, 'sbx -h lists the commands', usage)
    missing = [c for c in cmds if '.B %s' % c.replace('-', '\\-') not in man and c != '--version']
    t.eq(missing, [], 'the man page covers every command sbx -h lists')
    t.ok('.SH EXIT STATUS' in man and '124' in man, 'and the exit codes')
    comp = os.path.join(x.prefix, 'share/bash-completion/completions/sbx')
    r = subprocess.run(['bash', '-c', 'source "$1"; COMP_WORDS=(sbx se); COMP_CWORD=1; _sbx; echo "${COMPREPLY[@]}"; '
                        'COMP_WORDS=(sbx session ""); COMP_CWORD=2; _sbx; echo "${COMPREPLY[@]}"', 'bash', comp],
                       capture_output=True, text=True, env=x.env)
    t.eq(r.stdout, 'session\nls create rm\n', 'bash completes commands and their words', r.stderr)


if __name__ == '__main__':
    sys.exit(run_tests([test_files, test_installed_sbx_works, test_man_page_and_completion], Ctx))
