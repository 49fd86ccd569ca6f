"""createSandbox image: a sandbox runs on a root filesystem from
$SBX_STATE_DIR/images/NAME instead of the host's /usr and /etc. The test
builds a tiny image from the static busybox."""
import os
import shutil
import sys

from sbxtest import Env, run_tests

BUSYBOX = shutil.which('busybox')


class Ctx:
    def __init__(self):
        self.env = Env()
        self.c = self.env.mcp(['--sandbox', 'img'])
        self.c.initialize()
        self.c.sh('true')  # the daemon made its state dir
        img = os.path.join(self.env.state, 'images', 'tiny')
        if BUSYBOX:
            os.makedirs(os.path.join(img, 'usr', 'bin'))
            os.makedirs(os.path.join(img, 'etc'))
            shutil.copy(BUSYBOX, os.path.join(img, 'usr', 'bin', 'busybox'))
            for tool in ('sh', 'ls', 'cat', 'echo', 'id', 'touch', 'ps', 'printf', 'grep', 'wc', 'head'):
                os.symlink('busybox', os.path.join(img, 'usr', 'bin', tool))
            os.symlink('usr/bin', os.path.join(img, 'bin'))
            with open(os.path.join(img, 'etc', 'passwd'), 'w') as f:
                f.write('root:x:0:0:root:/root:/bin/sh\n')
            with open(os.path.join(img, 'etc', 'os-release'), 'w') as f:
                f.write('NAME="tiny image"\n')
        os.makedirs(os.path.join(self.env.state, 'images', 'empty'))
        os.symlink('/', os.path.join(self.env.state, 'images', 'host'))

    def close(self):
        self.env.close()


def test_image(t, x):
    if not BUSYBOX:
        t.skip('image', 'busybox is not installed (scripts/bootstrap installs busybox-static)')
        return
    r = x.c.ok('createSandbox', {'sandboxId': 'tiny', 'image': 'tiny'})
    t.eq(r['created'], True, 'createSandbox with an image')
    r = x.c.sh('cat /etc/os-release; ls /usr/bin | wc -l; ls /usr/bin/python3 2>&1 || true', sandbox='tiny')
    t.ok(r['stdout'].startswith('NAME="tiny image"'), "the image's /etc, not the host's", r)
    t.ok('No such file' in r['stdout'], "the host's /usr is not there", r['stdout'])
    r = x.c.sh('cd /tmp && export IMG=yes; echo hi > /usr/bin/new && cat /usr/bin/new', sandbox='tiny')
    t.eq(r['stdout'], 'hi\n', 'the image is writable through the overlay')
    t.ok(not os.path.exists(os.path.join(x.env.state, 'images', 'tiny', 'usr', 'bin', 'new')), 'the image stays as it was')
    t.eq(x.c.sh('pwd; echo $IMG', sandbox='tiny')['stdout'], '/tmp\nyes\n', 'sessions work with busybox sh too')
    x.c.ok('writeFile', {'sandboxId': 'tiny', 'path': 'f.txt', 'content': 'in the image'})
    t.eq(x.c.ok('readFile', {'sandboxId': 'tiny', 'path': 'f.txt'})['content'], 'in the image', 'files work')


def test_bad_images(t, x):
    t.eq(x.c.err('createSandbox', {'sandboxId': 'x1', 'image': 'missing'}), 'VALIDATION_FAILED', 'an unknown image')
    t.eq(x.c.err('createSandbox', {'sandboxId': 'x2', 'image': 'empty'}), 'VALIDATION_FAILED', 'an image without usr/')
    t.eq(x.c.err('createSandbox', {'sandboxId': 'x3', 'image': '../../etc'}), 'VALIDATION_FAILED',
         'an image name cannot leave the images directory')
    t.ok(os.path.exists('/etc/shadow'), 'the host has an /etc/shadow to protect')
    t.eq(x.c.err('createSandbox', {'sandboxId': 'x4', 'image': 'host'}), 'VALIDATION_FAILED',
         "an image that is a symlink (here to the host's /) is refused")
    t.ok(not any(s['sandboxId'] in ('x1', 'x2', 'x3', 'x4') for s in x.c.ok('listSandboxes')['sandboxes']),
         'failed creations leave nothing behind')


if __name__ == '__main__':
    sys.exit(run_tests([test_image, test_bad_images], Ctx))
