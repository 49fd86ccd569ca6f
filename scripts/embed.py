#!/usr/bin/env python3
"""Embeds a file in C as `static const char NAME[]` (used for the tool catalog)."""
import sys

src, dst, name = sys.argv[1:4]
data = open(src, 'rb').read()
with open(dst, 'w') as f:
    f.write('/* generated from %s: do not edit */\n#pragma once\n' % src.split('/')[-1])
    f.write('static const char %s[] = {\n' % name)
    for i in range(0, len(data), 16):
        f.write('  ' + ', '.join(str(b) for b in data[i:i + 16]) + ',\n')
    f.write('  0};\n')
