"""The file tools, confined to the sandbox."""
import base64
import os
import sys

from sbxtest import Ctx, Env, run_tests


def test_write_read(t, x):
    r = x.c.ok('writeFile', {'path': 'dir/sub/hello.txt', 'content': 'h\u00e9llo\n'})
    t.eq(r, {'path': '/workspace/dir/sub/hello.txt', 'size': 7}, 'writeFile makes parents; relative is under /workspace')
    r = x.c.ok('readFile', {'path': '/workspace/dir/sub/hello.txt'})
    t.eq((r['content'], r['encoding'], r['isBinary'], r['mimeType'], r['size']),
         ('h\u00e9llo\n', 'utf-8', False, 'text/plain', 7), 'readFile text')
    own = x.c.sh('stat -c %U:%G /workspace/dir/sub/hello.txt /workspace/dir')['stdout'].split()
    t.eq(own, ['root:root', 'root:root'], 'created files are owned by sandbox root')
    t.eq(x.c.sh('cat dir/sub/hello.txt')['stdout'], 'h\u00e9llo\n', 'exec sees the file')


def test_binary(t, x):
    data = bytes(range(256)) * 10
    x.c.ok('writeFile', {'path': 'bin.dat', 'content': base64.b64encode(data).decode(), 'encoding': 'base64'})
    r = x.c.ok('readFile', {'path': '/etc/hostname'})
    t.eq((r['mimeType'], r['isBinary']), ('text/plain', False), 'a text file whose name says nothing is text/plain')
    r = x.c.ok('readFile', {'path': 'bin.dat'})
    t.ok(r['isBinary'] and r['encoding'] == 'base64' and base64.b64decode(r['content']) == data,
         'binary round trip is exact and detected')
    r = x.c.ok('readFile', {'path': 'bin.dat', 'encoding': 'utf-8'})
    t.ok(r['encoding'] == 'base64', 'binary asked as utf-8 still comes back lossless')
    t.eq(x.c.err('writeFile', {'path': 'x', 'content': '!!!', 'encoding': 'base64'}), 'VALIDATION_FAILED', 'bad base64')


def test_agent_sees_images(t, x):
    png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==')
    x.c.ok('writeFile', {'path': 'pixel.png', 'content': base64.b64encode(png).decode(), 'encoding': 'base64'})
    res, _ = x.c.call('readFile', {'path': 'pixel.png'})
    imgs = [b for b in res['content'] if b['type'] == 'image']
    t.ok(len(imgs) == 1 and imgs[0]['mimeType'] == 'image/png' and base64.b64decode(imgs[0]['data']) == png,
         'readFile of an image gives an MCP image block (the agent sees it)', [b['type'] for b in res['content']])
    x.c.ok('writeFile', {'path': 'blob.bin', 'content': base64.b64encode(b'\0\1\2\3').decode(), 'encoding': 'base64'})
    res, _ = x.c.call('readFile', {'path': 'blob.bin'})
    blobs = [b['resource'] for b in res['content'] if b['type'] == 'resource']
    t.ok(len(blobs) == 1 and base64.b64decode(blobs[0]['blob']) == b'\0\1\2\3' and
         blobs[0]['uri'].endswith('/workspace/blob.bin'), 'another binary file comes as an embedded resource blob', blobs)


def test_limits(t, x):
    x.c.sh('truncate -s 40M /workspace/big')
    t.eq(x.c.err('readFile', {'path': 'big'}), 'FILE_TOO_LARGE', 'readFile refuses past 32 MiB')
    x.c.sh('head -c 33554432 /dev/zero > /workspace/edge')
    r = x.c.ok('readFile', {'path': 'edge'}, timeout=60)
    t.eq(r['size'], 33554432, 'readFile returns exactly 32 MiB')
    x.c.sh('printf "\\x01" | dd of=/workspace/big bs=1 seek=41943039 conv=notrunc 2>/dev/null')
    r = x.c.ok('readFile', {'path': 'big', 'offset': 41943038, 'length': 1 << 20, 'encoding': 'base64'})
    t.ok(r['fileSize'] == 41943040 and r['offset'] == 41943038 and r['size'] == 2 and r['content'] == 'AAE=',
         'offset and length read a part of a file too big to read whole', r)


def test_read_part(t, x):
    """readFile's offset and length page through a long text file in whole
    characters: an agent reads the end of a long log without all of it."""
    x.c.ok('writeFile', {'path': 'log.txt', 'content': 'h\u00e9llo w\u00f6rld\n' * 1000})  # 14 bytes a line
    r = x.c.ok('readFile', {'path': 'log.txt', 'offset': 14 * 999, 'length': 100})
    t.eq((r['content'], r['offset'], r['fileSize'], r['encoding']), ('h\u00e9llo w\u00f6rld\n', 13986, 14000, 'utf-8'),
         'the last line, from its offset')
    r = x.c.ok('readFile', {'path': 'log.txt', 'offset': 2, 'length': 7})
    t.eq((r['content'], r['offset']), ('llo w', 3), 'a part starting inside a character starts at the next one, and '
         'one ending inside a character ends before it')
    r = x.c.ok('readFile', {'path': 'log.txt', 'offset': 20000})
    t.eq((r['content'], r['size'], r['offset']), ('', 0, 14000), 'past the end: nothing')
    t.ok('offset' not in x.c.ok('readFile', {'path': 'log.txt'}), 'a whole read says nothing of parts')
    import base64
    x.c.sh("printf 'h\\303\\251llo w\\303\\266rld \\360\\237\\230\\200 \\223q\\224 end\\303' > /workspace/page.txt")
    want = base64.b64decode(x.c.ok('readFile', {'path': 'page.txt', 'encoding': 'base64'})['content'])
    for length in (1, 2, 3, 5, 7):
        got, offset, parts = b'', 0, 0
        while offset < len(want) and parts < 100:
            r = x.c.ok('readFile', {'path': 'page.txt', 'offset': offset, 'length': length})
            data = base64.b64decode(r['content']) if r['encoding'] == 'base64' else r['content'].encode()
            if r['offset'] != offset or not data:
                break
            got, offset, parts = got + data, offset + len(data), parts + 1
        t.eq(got, want, 'paging by %d bytes from offset + size to the end gives the file, byte for byte' % length)


def test_list(t, x):
    x.c.sh('mkdir -p /workspace/l/a/b && touch /workspace/l/f /workspace/l/.hidden /workspace/l/a/b/deep')
    r = x.c.ok('listFiles', {'path': '/workspace/l'})
    t.eq(sorted(f['name'] for f in r['files']), ['a', 'f'], 'listFiles hides dotfiles')
    r = x.c.ok('listFiles', {'path': '/workspace/l', 'includeHidden': True, 'recursive': True})
    t.eq(sorted(f['path'] for f in r['files']),
         ['/workspace/l/.hidden', '/workspace/l/a', '/workspace/l/a/b', '/workspace/l/a/b/deep', '/workspace/l/f'],
         'recursive with hidden')
    f = [e for e in r['files'] if e['name'] == 'a'][0]
    t.ok(f['type'] == 'directory' and f['mode'] == '0755' and f['modifiedAt'].endswith('Z'), 'entry fields', f)
    t.eq(x.c.err('listFiles', {'path': '/workspace/l/f'}), 'NOT_DIRECTORY', 'listing a file')
    t.eq(x.c.err('listFiles', {'path': '/nope'}), 'FILE_NOT_FOUND', 'listing nothing')


def test_list_hostile_names(t, x):
    # what a sandbox names its files cannot hang a listing or forge entries in it
    x.c.sh('mkdir -p /workspace/hn && cd /workspace/hn && touch "$(printf \'evil\\nfake\')" plain '
           '"$(printf \'bad\\377name\')"')
    r, _ = x.c.call('listFiles', {'path': '/workspace/hn'}, timeout=30)
    t.ok(not r.get('isError'), 'a name that is not UTF-8 gets an answer, not silence', r)
    files = {f['name']: f for f in r['structuredContent']['files']}
    t.ok('evil\nfake' in files and 'plain' in files, 'a name with a newline is one entry, exact', sorted(files))
    bad = [f for n, f in files.items() if n.startswith('bad')]
    t.ok(len(bad) == 1 and bad[0]['name'] == 'bad\ufffdname' and bad[0].get('notUtf8'),
         'a name that is not UTF-8 is shown repaired and says so', bad)
    lines = r['content'][0]['text'].split('\n')
    t.ok('"/workspace/hn/evil\\nfake"' in lines and 'fake' not in lines and '/workspace/hn/plain' in lines,
         'in the text, a name with a newline is quoted: no line reads as an entry of its own', lines)


def test_list_100000(t, x):
    x.c.sh('mkdir -p /workspace/many && cd /workspace/many && seq 1 100000 | xargs touch', wait=120)
    r = x.c.ok('listFiles', {'path': '/workspace/many'}, timeout=60)
    t.ok(r.get('truncated') and r['count'] == 10000 and len(r['files']) == 10000,
         'a listing of 100,000 entries stops at 10,000 and says it was cut', {k: r[k] for k in r if k != 'files'})
    res, _ = x.c.call('listFiles', {'path': '/workspace/many'}, timeout=60)
    t.ok('use exec with find for the rest]' in res['content'][0]['text'][-200:], 'its text says how to see the rest',
         res['content'][0]['text'][-200:])
    x.c.sh('mkdir -p /workspace/hidden && cd /workspace/hidden && seq -f .h%g 1 50000 | xargs touch && touch seen', wait=120)
    r = x.c.ok('listFiles', {'path': '/workspace/hidden'}, timeout=60)
    t.ok(r.get('truncated') is True and len(r['files']) <= 1,
         'a directory of 50,000 hidden names is not read to its end for the one name shown: the listing says it was cut',
         {k: r[k] for k in r if k != 'files'})
    # a recursive delete of a tree the sandbox built takes as long as the
    # tree: other sandboxes' calls are answered meanwhile
    x.c.ok('exec', {'sandboxId': 'fs-other', 'command': 'true'})
    c = x.c
    d, e = next(c.ids), next(c.ids)
    c.send({'jsonrpc': '2.0', 'id': d, 'method': 'tools/call',
            'params': {'name': 'deleteFile', 'arguments': {'path': '/workspace/many', 'recursive': True}}})
    c.send({'jsonrpc': '2.0', 'id': e, 'method': 'tools/call',
            'params': {'name': 'exec', 'arguments': {'sandboxId': 'fs-other', 'command': 'echo meanwhile'}}})
    first = c.next(lambda m: m.get('id') in (d, e), 120)
    t.eq(first.get('id'), e, 'an exec in another sandbox is answered while 100,000 entries are deleted', first)
    done = first if first.get('id') == d else c.next(lambda m: m.get('id') == d, 120)
    t.ok(done['result']['structuredContent'].get('deleted') is True, 'and the delete ends', done)
    t.eq(x.c.sh('ls -d /workspace/many 2>&1 | grep -c "No such"')['stdout'], '1\n', 'with the tree gone')


def test_mkdir_delete_rename(t, x):
    t.eq(x.c.err('mkdir', {'path': '/workspace/m/n'}), 'FILE_NOT_FOUND', 'mkdir without recursive needs the parent')
    t.eq(x.c.ok('mkdir', {'path': '/workspace/m/n', 'recursive': True})['created'], True, 'mkdir recursive makes it')
    t.eq(x.c.ok('mkdir', {'path': '/workspace/m/n', 'recursive': True})['created'], False,
         'and again: an existing directory is accepted, created false')
    t.eq(x.c.ok('writeFile', {'path': './m//./n/../n/f.txt', 'content': 'x'})['path'], '/workspace/m/n/f.txt',
         'paths come back clean (".", "..", "//")')
    t.eq([f['path'] for f in x.c.ok('listFiles', {'path': 'm/./n'})['files']], ['/workspace/m/n/f.txt'],
         'listFiles of "m/./n" names its entries cleanly')
    t.eq(x.c.err('mkdir', {'path': '/workspace/m'}), 'FILE_EXISTS', 'mkdir of an existing dir')
    x.c.ok('writeFile', {'path': '/workspace/m/n/f', 'content': 'x'})
    t.eq(x.c.err('mkdir', {'path': '/workspace/m/n/f', 'recursive': True}), 'FILE_EXISTS',
         'mkdir recursive of a file is FILE_EXISTS (as mkdir -p says), not NOT_DIRECTORY')
    e = x.c.call('writeFile', {'path': '/workspace/m/n/f/sub', 'content': 'x'})[0]['structuredContent']['error']
    t.eq((e['code'], e['message']), ('NOT_DIRECTORY', '/workspace/m/n/f is a file, not a directory'),
         'writeFile under a file: NOT_DIRECTORY, naming the file in the way')
    e = x.c.call('moveFile', {'sourcePath': '/workspace/m', 'destinationPath': '/workspace/m/n'})[0]['structuredContent']['error']
    t.eq((e['code'], e['message']), ('VALIDATION_FAILED', '/workspace/m cannot be moved into itself (/workspace/m/n/m)'),
         'moving a directory into itself says so')
    t.eq(x.c.err('deleteFile', {'path': '/workspace/m'}), 'IS_DIRECTORY', 'deleteFile refuses a directory')
    x.c.ok('renameFile', {'oldPath': '/workspace/m/n/f', 'newPath': '/workspace/m/g'})
    t.eq(x.c.ok('exists', {'path': '/workspace/m/g'})['exists'], True, 'renamed file exists')
    t.eq(x.c.ok('exists', {'path': '/workspace/m/n/f'})['exists'], False, 'old name gone')
    r = x.c.ok('moveFile', {'sourcePath': '/workspace/m/g', 'destinationPath': '/workspace/m/n'})
    t.eq(r['destinationPath'], '/workspace/m/n/g', 'moveFile into a directory answers the path it has now')
    t.eq(x.c.ok('exists', {'path': '/workspace/m/n/g'})['exists'], True, 'moveFile into a directory')
    x.c.sh('ln -s /etc /workspace/m/n/link')
    x.c.ok('deleteFile', {'path': '/workspace/m', 'recursive': True})
    t.eq(x.c.ok('exists', {'path': '/workspace/m'})['exists'], False, 'recursive delete')
    t.eq(x.c.sh('test -f /etc/hostname && echo kept')['stdout'].strip(), 'kept', 'symlink target untouched')
    t.eq(x.c.err('deleteFile', {'path': '/workspace/none'}), 'FILE_NOT_FOUND', 'delete missing')
    for tool, args in (('deleteFile', {'path': '/workspace', 'recursive': True}), ('deleteFile', {'path': '.', 'recursive': True}),
                       ('renameFile', {'oldPath': '/workspace/', 'newPath': '/tmp/ws'})):
        t.eq(x.c.err(tool, args), 'VALIDATION_FAILED', '%s of the workspace itself is refused (%s)' % (tool, args))
    t.eq(x.c.sh('test -d /workspace && echo there')['stdout'], 'there\n', 'and it is still there')


def test_confinement(t, x):
    x.c.sh('ln -sf / /workspace/rootlink; ln -sf ../../../../etc/hostname /workspace/rel; mkfifo /workspace/fifo')
    for path in ('/workspace/../../../../etc/hostname', '/workspace/rootlink/etc/hostname', '/workspace/rel'):
        r = x.c.ok('readFile', {'path': path})
        t.eq(r['content'].strip(), 'fs', '%s resolves inside the sandbox' % path)
    t.eq(x.c.err('readFile', {'path': '/workspace/fifo'}, timeout=10), 'PERMISSION_DENIED', 'a FIFO is refused, not hung on')
    t.eq(x.c.err('readFile', {'path': '/proc/self/root/etc/shadow'}), 'PERMISSION_DENIED',
         '/proc/self/root does not lead out (a kernel filesystem: use exec)')
    res, _ = x.c.call('readFile', {'path': '/proc/self/status'})
    t.ok('use exec' in res['structuredContent']['error']['message'], '/proc/self/status says to use exec, as /proc/1 does',
         res['structuredContent'])
    t.eq(x.c.err('readFile', {'path': '/proc/1/environ'}), 'PERMISSION_DENIED', 'kernel files are refused')
    t.eq(x.c.err('readFile', {'path': '/dev/zero'}), 'PERMISSION_DENIED', 'devices are refused')
    x.c.ok('writeFile', {'path': '/workspace/rootlink/tmp/via-link', 'content': 'x'})
    t.ok(not os.path.exists('/tmp/via-link'), 'writing through an absolute symlink stays inside')
    t.eq(x.c.sh('cat /tmp/via-link')['stdout'], 'x', 'the write landed in the sandbox')


if __name__ == '__main__':
    sys.exit(run_tests([test_write_read, test_binary, test_agent_sees_images, test_limits, test_read_part, test_list, test_list_hostile_names, test_list_100000, test_mkdir_delete_rename,
                        test_confinement], lambda: Ctx('fs')))
