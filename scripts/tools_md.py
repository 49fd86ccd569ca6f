#!/usr/bin/env python3
"""Writes the tool reference (docs/tools.md) from the catalog
(mcp-server/tools.json): tools_md.py [OUT]. tests/test_docs.py fails when
the committed file differs from what this makes."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ERRORS = ('VALIDATION_FAILED', 'SANDBOX_NOT_FOUND', 'FILE_NOT_FOUND', 'FILE_EXISTS', 'IS_DIRECTORY', 'NOT_DIRECTORY',
          'FILE_TOO_LARGE', 'PERMISSION_DENIED', 'PROCESS_NOT_FOUND', 'PROCESS_EXITED', 'SESSION_NOT_FOUND',
          'CONTEXT_NOT_FOUND', 'INVALID_GIT_URL', 'GIT_CLONE_FAILED', 'COMMAND_TIMEOUT', 'INTERPRETER_NOT_AVAILABLE',
          'MOUNT_FAILED', 'INVALID_PORT', 'PORT_ALREADY_EXPOSED', 'PORT_NOT_EXPOSED', 'RESOURCE_LIMIT', 'INTERNAL')


def kind(schema):
    t = schema.get('type', 'any')
    if 'enum' in schema:
        return ' \\| '.join('`%s`' % json.dumps(v) for v in schema['enum'])
    if t == 'array':
        return 'array of ' + kind(schema.get('items', {}))
    lo, hi = schema.get('minimum'), schema.get('maximum')
    if lo is not None and hi is not None:
        return '%s, %s to %s' % (t, lo, hi)
    if lo is not None or hi is not None:
        return '%s, at %s %s' % (t, 'least' if lo is not None else 'most', lo if lo is not None else hi)
    return t


def table(props, required):
    rows = ['| name | type | |', '|---|---|---|']
    for name, s in props.items():
        note = s.get('description', '')
        if name in required:
            note = ('required. ' + note).strip()
        rows.append('| `%s` | %s | %s |' % (name, kind(s), note.replace('|', '\\|').replace('\n', ' ')))
    return '\n'.join(rows)


def render(catalog):
    out = ['# sbx tools', '',
           'Generated from `mcp-server/tools.json` by `scripts/tools_md.py`; do not edit. Every tool but',
           '`listSandboxes` also takes `sandboxId` (1-63 of `[a-z0-9-]`; default: the connection\'s sandbox). Tools marked *creates* make the',
           'sandbox when it does not exist; the others answer `SANDBOX_NOT_FOUND`. Errors are results with',
           '`isError: true` and `structuredContent.error = {code, message}`; the codes are ' +
           ', '.join('`%s`' % e for e in ERRORS) + '.', '',
           'A call that carries a `progressToken` and has sent no progress for 5 s (a command that prints',
           'nothing, a long clone) sends one without output every 5 s: `message` `""`, `_meta` `{"sbx/stream":',
           '"heartbeat"}`. A client that resets its timeout on progress (the SDKs\' `resetTimeoutOnProgress`)',
           'keeps waiting for it; a client that shows output skips these.', '']
    for t in catalog['tools']:
        out += ['## %s%s' % (t['name'], ' (creates)' if t.get('creates') else ''), '', t['description'], '']
        inp = {k: v for k, v in t.get('input', {}).items() if k != 'sandboxId'}
        if inp:
            out += ['Arguments:', '', table(inp, t.get('required', [])), '']
        if t.get('output'):
            out += ['Result (`structuredContent`):', '', table(t['output'], t.get('outputRequired', [])), '']
    return '\n'.join(out)


if __name__ == '__main__':
    with open(os.path.join(HERE, '..', 'mcp-server', 'tools.json')) as f:
        text = render(json.load(f))
    if len(sys.argv) > 1:
        with open(sys.argv[1], 'w') as f:
            f.write(text)
    else:
        sys.stdout.write(text)
