"""The documentation cannot drift: docs/tools.md is what scripts/tools_md.py
makes from the tool catalog, and the README points nowhere outside the
repository."""
import os
import re
import subprocess
import sys

from sbxtest import run_tests

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')


def test_tools_md(t):
    made = subprocess.run([sys.executable, os.path.join(ROOT, 'scripts', 'tools_md.py')], capture_output=True,
                          text=True, check=True).stdout
    with open(os.path.join(ROOT, 'docs', 'tools.md')) as f:
        t.ok(f.read() == made, 'docs/tools.md is up to date with mcp-server/tools.json (scripts/tools_md.py docs/tools.md)')


def test_error_codes(t):
    sys.path.insert(0, os.path.join(ROOT, 'scripts'))
    import tools_md
    used = set()
    for d in ('mcp-server', 'sandbox-core', 'cli'):
        for name in os.listdir(os.path.join(ROOT, d)):
            if name.endswith('.c'):
                with open(os.path.join(ROOT, d, name)) as f:
                    used |= set(re.findall(r'sbx_err\([^,]+, "([A-Z_]+)"', f.read()))
    t.eq(sorted(used - set(tools_md.ERRORS)), [], 'every error code the daemon gives is in the tool reference\'s list')


def test_self_contained(t):
    for doc in ('README.md', 'BENCHMARKS.md', 'examples/README.md', 'docs/tools.md'):
        with open(os.path.join(ROOT, doc)) as f:
            text = f.read()
        outside = [m for m in re.findall(r'\]\(([^)#]+)\)|`(\.\./[^`]*)`', text) for m in m if m and
                   (m.startswith('../') or m.startswith('/work') or 'shared/' in m)]
        t.eq(outside, [], '%s points nowhere outside the repository' % doc)
        for link in re.findall(r'\]\(([^)#:]+)\)', text):
            t.ok(os.path.exists(os.path.join(ROOT, os.path.dirname(doc), link)), '%s: %s exists' % (doc, link))


if __name__ == '__main__':
    sys.exit(run_tests([test_tools_md, test_error_codes, test_self_contained]))
