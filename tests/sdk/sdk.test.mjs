// The official MCP TypeScript SDK client (1.x, legacy era) driving `sbx mcp`
// over stdio, with its output-schema validation on. Prints TAP.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { SBX, setup, sleepsGone } from './harness.mjs';

const { root, env, ok, finish } = setup('sbxt-sdk-');


const transport = new StdioClientTransport({ command: SBX, args: ['mcp', '--sandbox', 'sdk'], env, cwd: root, stderr: 'pipe' });
const client = new Client({ name: 'sbx-sdk-test', version: '1.0.0' });

try {
  await client.connect(transport);
  ok(client.getServerVersion()?.name === 'sbx', 'initialize through the SDK');
  ok(typeof client.getInstructions() === 'string' && client.getInstructions().includes('sandbox'), 'instructions received');

  const { tools } = await client.listTools();
  const names = tools.map((t) => t.name);
  for (const t of ['exec', 'writeFile', 'readFile', 'listFiles', 'mkdir', 'deleteFile', 'renameFile', 'moveFile', 'exists'])
    ok(names.includes(t), `tools/list has ${t}`);
  ok(tools.every((t) => t.outputSchema && t.inputSchema.additionalProperties === false), 'every tool declares strict schemas');

  // exec with progress; the SDK validates structuredContent against outputSchema
  const chunks = [];
  const r = await client.callTool({ name: 'exec', arguments: { command: 'for i in 1 2 3; do echo line$i; sleep 0.1; done' } },
    undefined, { onprogress: (p) => chunks.push(p), resetTimeoutOnProgress: true, timeout: 30000 });
  ok(r.structuredContent.stdout === 'line1\nline2\nline3\n' && r.structuredContent.exitCode === 0, 'exec result validated', r);
  ok(chunks.length >= 2 && chunks.map((c) => c.message).join('') === 'line1\nline2\nline3\n', 'progress streamed as it came', chunks);
  ok(chunks.every((c, i) => i === 0 || c.progress > chunks[i - 1].progress), 'progress increases');

  // a long command survives past the request timeout because progress resets it
  const slow = await client.callTool({ name: 'exec', arguments: { command: 'for i in 1 2 3 4 5 6; do echo tick; sleep 0.5; done' } },
    undefined, { onprogress: () => {}, resetTimeoutOnProgress: true, timeout: 1500 });
  ok(slow.structuredContent.stdout.split('\n').length === 7, 'resetTimeoutOnProgress keeps a 3 s command alive with a 1.5 s timeout');

  // a command that prints nothing for longer than the timeout: the heartbeats keep it alive, and carry no output
  const beats = [];
  const quiet = await client.callTool({ name: 'exec', arguments: { command: 'sleep 11; echo done' } },
    undefined, { onprogress: (p) => beats.push(p), resetTimeoutOnProgress: true, timeout: 8000 });
  ok(quiet.structuredContent.stdout === 'done\n', 'resetTimeoutOnProgress keeps a silent 11 s command alive with an 8 s timeout',
    quiet);
  ok(beats.length >= 2 && beats.slice(0, -1).every((p) => p.message === '') &&
     beats.every((p, i) => i === 0 || p.progress > beats[i - 1].progress), 'through heartbeats: no text, progress growing', beats);

  // cancel through an AbortSignal: the command is gone afterwards
  const ac = new AbortController();
  const started = new Promise((resolve) => {
    client.callTool({ name: 'exec', arguments: { command: 'echo begun; sleep 300' } }, undefined,
      { signal: ac.signal, onprogress: () => resolve() }).catch(() => {});
  });
  await started;
  ac.abort('test');
  ok(await sleepsGone(client), 'AbortSignal cancels the command; nothing keeps running');

  // files
  const w = await client.callTool({ name: 'writeFile', arguments: { path: 'sdk/hello.txt', content: 'from the sdk\n' } });
  ok(w.structuredContent.path === '/workspace/sdk/hello.txt', 'writeFile', w);
  const rd = await client.callTool({ name: 'readFile', arguments: { path: '/workspace/sdk/hello.txt' } });
  ok(rd.structuredContent.content === 'from the sdk\n' && rd.structuredContent.isBinary === false, 'readFile', rd);
  const ls = await client.callTool({ name: 'listFiles', arguments: { path: '/workspace/sdk' } });
  ok(ls.structuredContent.files.length === 1 && ls.structuredContent.files[0].name === 'hello.txt', 'listFiles', ls);
  await client.callTool({ name: 'mkdir', arguments: { path: '/workspace/sdk/d', recursive: true } });
  await client.callTool({ name: 'moveFile', arguments: { sourcePath: '/workspace/sdk/hello.txt', destinationPath: '/workspace/sdk/d' } });
  const ex = await client.callTool({ name: 'exists', arguments: { path: '/workspace/sdk/d/hello.txt' } });
  ok(ex.structuredContent.exists === true, 'mkdir + moveFile + exists');
  const del = await client.callTool({ name: 'deleteFile', arguments: { path: '/workspace/sdk/d' } });
  ok(del.isError === true && del.structuredContent.error.code === 'IS_DIRECTORY', 'error results validate too', del);
  const res = await client.readResource({ uri: 'sbx://sdk/workspace/sdk/d/hello.txt' });
  ok(res.contents[0].text === 'from the sdk\n', 'resources/read through the SDK', res);
  const nf = await client.callTool({ name: 'readFile', arguments: { sandboxId: 'nobody-made-this', path: '/x' } });
  ok(nf.isError === true && nf.structuredContent.error.code === 'SANDBOX_NOT_FOUND', 'SANDBOX_NOT_FOUND', nf);
} catch (e) {
  ok(false, 'SDK session raised', String(e && e.stack || e));
} finally {
  await client.close().catch(() => {});
}
finish();
