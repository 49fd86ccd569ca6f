// The official MCP TypeScript SDK client 2.x in the modern era (2026-07-28):
// it probes server/discover, negotiates, and attaches the per-request _meta
// envelope. Drives `sbx mcp` over stdio. Prints TAP.
import { SBX, setup, sleepsGone } from './harness.mjs';

if (Number(process.versions.node.split('.')[0]) < 20) {
  console.log(`1..0 # SKIP the 2.x SDK client needs Node.js 20 or later (this is ${process.versions.node})`);
  process.exit(77);
}
const { Client } = await import('@modelcontextprotocol/client');
const { StdioClientTransport } = await import('@modelcontextprotocol/client/stdio');

const { root, env, ok, finish } = setup('sbxt-sdk2-');

async function connect(mode) {
  const transport = new StdioClientTransport({ command: SBX, args: ['mcp', '--sandbox', 'modern'], env, cwd: root, stderr: 'pipe' });
  const client = new Client({ name: 'sbx-sdk2-test', version: '1.0.0' }, { versionNegotiation: { mode } });
  await client.connect(transport);
  return client;
}

let client;
try {
  client = await connect('auto');
  ok(client.getNegotiatedProtocolVersion() === '2026-07-28', 'auto negotiation picks 2026-07-28', client.getNegotiatedProtocolVersion());
  const { tools } = await client.listTools();
  ok(tools.length > 10 && tools.every((t) => t.outputSchema && t.title), 'tools/list in the modern era');

  const chunks = [];
  const r = await client.callTool({ name: 'exec', arguments: { command: 'for i in 1 2 3; do echo m$i; sleep 0.1; done' } },
    { onprogress: (p) => chunks.push(p), resetTimeoutOnProgress: true, timeout: 30000 });
  ok(r.structuredContent.stdout === 'm1\nm2\nm3\n', 'exec result validated against its outputSchema', r);
  ok(chunks.length >= 2 && chunks.map((c) => c.message).join('') === 'm1\nm2\nm3\n', 'progress streamed', chunks);

  const slow = await client.callTool({ name: 'exec', arguments: { command: 'for i in 1 2 3 4 5 6; do echo t; sleep 0.5; done' } },
    { onprogress: () => {}, resetTimeoutOnProgress: true, timeout: 1500 });
  ok(slow.structuredContent.stdout === 't\n'.repeat(6), 'resetTimeoutOnProgress keeps a long command alive');

  const ac = new AbortController();
  const started = new Promise((resolve) => {
    client.callTool({ name: 'exec', arguments: { command: 'echo begun; sleep 300' } },
      { signal: ac.signal, onprogress: () => resolve() }).catch(() => {});
  });
  await started;
  ac.abort('test');
  ok(await sleepsGone(client), 'AbortSignal cancels the command');

  await client.callTool({ name: 'writeFile', arguments: { path: 'note.md', content: '# modern\n' } });
  const res = await client.readResource({ uri: 'sbx://modern/workspace/note.md' });
  ok(res.contents[0].text === '# modern\n' && res.contents[0].mimeType === 'text/markdown', 'resources/read', res);
  const list = await client.listResources();
  ok(list.resources.some((x) => x.uri === 'sbx://modern/workspace'), 'resources/list', list);
  await client.close();

  client = await connect({ pin: '2026-07-28' });
  ok(client.getNegotiatedProtocolVersion() === '2026-07-28', 'pinned 2026-07-28 connects');
  await client.close();
  client = await connect('legacy');
  const legacy = await client.callTool({ name: 'exec', arguments: { command: 'echo legacy' } });
  ok(legacy.structuredContent.stdout === 'legacy\n', 'the same client in legacy mode');
} catch (e) {
  ok(false, 'SDK 2.x session raised', String(e && e.stack || e));
} finally {
  await client?.close().catch(() => {});
}
finish();
