// What the SDK tests share: TAP output, private runtime and state dirs, and
// stopping the daemon (with its sandboxes) at the end.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const SBX = process.env.SBX;

export function setup(prefix) {
  const root = mkdtempSync(join(tmpdir(), prefix));
  const env = { ...process.env, SBX_RUNTIME_DIR: join(root, 'run'), SBX_STATE_DIR: join(root, 'state') };
  let n = 0, failed = 0;
  function ok(cond, name, diag) {
    n++;
    console.log(`${cond ? 'ok' : 'not ok'} ${n} - ${name}`);
    if (!cond) {
      failed++;
      if (diag !== undefined) for (const l of String(JSON.stringify(diag)).slice(0, 2000).split('\n')) console.log('#   ' + l);
    }
  }
  function finish() {
    try { execFileSync(SBX, ['daemon', 'stop'], { env, timeout: 40000 }); } catch {}
    rmSync(root, { recursive: true, force: true });
    console.log(`1..${n}`);
    process.exit(failed ? 1 : 0);
  }
  return { root, env, ok, finish };
}

// Polls, bounded, until no `sleep` runs in the client's default sandbox.
export async function sleepsGone(client) {
  for (let i = 0; i < 200; i++) {
    const ps = await client.callTool({ name: 'exec', arguments: { command: 'ps -e -o comm= | grep -c "^sleep$" || true' } });
    if (ps.structuredContent.stdout.trim() === '0') return true;
  }
  return false;
}
