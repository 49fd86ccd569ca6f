#!/usr/bin/env python3
"""A minimal MCP client with nothing but the standard library: starts
`sbx mcp`, creates a sandbox, runs Python code in it that draws a plot, and
copies the PNG out. Usage: client.py OUT.png  (SBX names the sbx binary)."""
import base64
import itertools
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SBX = os.environ.get('SBX', 'sbx')
ids = itertools.count(1)
proc = subprocess.Popen([SBX, 'mcp', '--sandbox', 'example-py'], stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def request(method, params):
    i = next(ids)
    proc.stdin.write((json.dumps({'jsonrpc': '2.0', 'id': i, 'method': method, 'params': params}) + '\n').encode())
    proc.stdin.flush()
    while True:  # skip notifications until our answer comes
        msg = json.loads(proc.stdout.readline())
        if msg.get('id') == i:
            if 'error' in msg:
                sys.exit('%s: %s' % (method, msg['error']['message']))
            return msg['result']


def call(tool, **args):
    r = request('tools/call', {'name': tool, 'arguments': args})
    if r.get('isError'):
        sys.exit('%s: %s' % (tool, r['structuredContent']['error']))
    return r['structuredContent']


request('initialize', {'protocolVersion': '2025-06-18', 'capabilities': {},
                       'clientInfo': {'name': 'sbx-example-py', 'version': '1'}})
proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
call('createSandbox')
call('writeFile', path='plot.py', content=open(os.path.join(HERE, '..', 'plot.py')).read())
r = call('exec', command='python3 plot.py')
print(r['stdout'], end='')
png = call('readFile', path='/workspace/plot.png')
open(sys.argv[1], 'wb').write(base64.b64decode(png['content']))
print('saved %s (%s, %d bytes)' % (sys.argv[1], png['mimeType'], png['size']))
proc.stdin.close()
proc.wait()
