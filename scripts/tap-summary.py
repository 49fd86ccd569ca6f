#!/usr/bin/env python3
"""Counts TAP results across meson's testlog.json and prints the closing
line 'N passed, N failed, N skipped'. A test that failed without a TAP
failure line of its own (crash, timeout, bad exit) counts as one failure."""
import json
import re
import sys

passed = failed = skipped = 0
for line in open(sys.argv[1]):
    t = json.loads(line)
    out = t.get('stdout') or ''
    ok = bad = skip = 0
    for l in out.splitlines():
        m = re.match(r'^(not ok|ok)\b(.*)$', l)
        if not m:
            continue
        if re.search(r'#\s*skip', m.group(2), re.I):
            skip += 1
        elif m.group(1) == 'ok':
            ok += 1
        else:
            bad += 1
    if t.get('result') not in ('OK', 'EXPECTEDFAIL', 'SKIP') and bad == 0:
        bad = 1
        print('failed without a TAP failure line: %s (%s)' % (t.get('name'), t.get('result')))
    if t.get('result') == 'SKIP' and ok + bad + skip == 0:
        skip = 1
    passed += ok
    failed += bad
    skipped += skip
print('%d passed, %d failed, %d skipped' % (passed, failed, skipped))
sys.exit(1 if failed else 0)
