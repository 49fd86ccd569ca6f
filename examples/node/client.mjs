// The same with the official MCP TypeScript SDK: start `sbx mcp`, create a
// sandbox, run Python code in it that draws a plot, copy the PNG out.
// Usage: node client.mjs OUT.png   (SBX names the sbx binary)
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { readFileSync, writeFileSync } from 'node:fs';

const transport = new StdioClientTransport({
  command: process.env.SBX || 'sbx',
  args: ['mcp', '--sandbox', 'example-node'],
  env: process.env,
});
const client = new Client({ name: 'sbx-example-node', version: '1.0.0' });
await client.connect(transport);

async function call(name, args = {}) {
  const r = await client.callTool({ name, arguments: args });
  if (r.isError) throw new Error(`${name}: ${JSON.stringify(r.structuredContent.error)}`);
  return r.structuredContent;
}

await call('createSandbox');
await call('writeFile', { path: 'plot.py', content: readFileSync(new URL('../plot.py', import.meta.url), 'utf8') });
const run = await client.callTool({ name: 'exec', arguments: { command: 'python3 plot.py' } },
  undefined, { onprogress: (p) => process.stdout.write(p.message ?? '') });
if (run.structuredContent.exitCode !== 0) throw new Error(run.structuredContent.stderr);
const png = await call('readFile', { path: '/workspace/plot.png' });
writeFileSync(process.argv[2], Buffer.from(png.content, 'base64'));
console.log(`saved ${process.argv[2]} (${png.mimeType}, ${png.size} bytes)`);
await client.close();
