#!/usr/bin/env python3
"""A minimal MCP client with nothing but the standard library: starts
`sbx mcp`, creates a sandbox, runs Python code in it that draws a plot, and
copies the PNG out. Usage: client.py OUT.png  (SBX names the sbx binary)."""
import base64
import os
import sys

from mcp_stdio import Client

HERE = os.path.dirname(os.path.abspath(__file__))
c = Client('example-py')
c.call('createSandbox')
c.call('writeFile', path='plot.py', content=open(os.path.join(HERE, '..', 'plot.py')).read())
r = c.call('exec', command='python3 plot.py')
print(r['stdout'], end='')
png = c.call('readFile', path='/workspace/plot.png')
open(sys.argv[1], 'wb').write(base64.b64decode(png['content']))
print('saved %s (%s, %d bytes)' % (sys.argv[1], png['mimeType'], png['size']))
c.close()
