#!/usr/bin/env python3
"""runCode as a notebook: writes a CSV into the sandbox, loads it with
pandas, plots it with matplotlib and gets the plot back as an MCP image
content block, which it saves. Usage: runcode.py OUT.png  (SBX names sbx)."""
import base64
import sys

from mcp_stdio import Client

CSV = 'month,visits\n' + ''.join('2026-%02d,%d\n' % (m, 1000 + 150 * m - 9 * m * m) for m in range(1, 13))
c = Client('example-runcode')
c.call('writeFile', path='visits.csv', content=CSV)
r = c.call('runCode', code='import pandas as pd\ndf = pd.read_csv("visits.csv")\ndf.describe()')
print(r['results'][0]['text'])  # a DataFrame: text (and html) results
r = c.call_raw('runCode', code='df.plot(x="month", y="visits", figsize=(3.2, 2), legend=False)\n'
                               'print("rows:", len(df))')
if 'error' in r['structuredContent']:
    sys.exit('the code failed: %s' % r['structuredContent']['error']['value'])
print(''.join(r['structuredContent']['logs']['stdout']), end='')
images = [b for b in r['content'] if b['type'] == 'image']
if not images:
    sys.exit('no image came back: %s' % r['content'])
open(sys.argv[1], 'wb').write(base64.b64decode(images[0]['data']))
print('saved %s (%s)' % (sys.argv[1], images[0]['mimeType']))
c.close()
