"""A minimal MCP client over stdio with nothing but the standard library:
starts `sbx mcp` (SBX names the binary) and calls tools."""
import itertools
import json
import os
import subprocess
import sys


class Client:
    def __init__(self, sandbox):
        self.ids = itertools.count(1)
        self.proc = subprocess.Popen([os.environ.get('SBX', 'sbx'), 'mcp', '--sandbox', sandbox],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.request('initialize', {'protocolVersion': '2025-06-18', 'capabilities': {},
                                    'clientInfo': {'name': 'sbx-example-py', 'version': '1'}})
        self.send({'jsonrpc': '2.0', 'method': 'notifications/initialized'})

    def send(self, msg):
        self.proc.stdin.write((json.dumps(msg) + '\n').encode())
        self.proc.stdin.flush()

    def request(self, method, params):
        i = next(self.ids)
        self.send({'jsonrpc': '2.0', 'id': i, 'method': method, 'params': params})
        while True:  # skip notifications until our answer comes
            msg = json.loads(self.proc.stdout.readline())
            if msg.get('id') == i:
                if 'error' in msg:
                    sys.exit('%s: %s' % (method, msg['error']['message']))
                return msg['result']

    def call_raw(self, tool, **args):
        """The whole tool result: content blocks and structuredContent."""
        r = self.request('tools/call', {'name': tool, 'arguments': args})
        if r.get('isError'):
            sys.exit('%s: %s' % (tool, r['structuredContent']['error']))
        return r

    def call(self, tool, **args):
        return self.call_raw(tool, **args)['structuredContent']

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()
