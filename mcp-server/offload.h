/* Work on a sandbox's files, off the daemon's loop.
 *
 * A file call can block in the kernel for as long as a file system takes
 * to answer: a bucket mount whose endpoint hangs holds a read or a lookup
 * for minutes (its server retries), and a recursive delete takes as long
 * as the tree the sandbox built. For a sandbox with a bucket mount, and
 * for a recursive delete, such work runs in a child process of its own
 * (the daemon stays single-threaded: its children are raw clones,
 * util.h), which hands its result back as JSON on a pipe, so the loop
 * keeps serving every other client and sandbox; a destroy kills it. Jobs of one sandbox run one at a
 * time, in the order they came; at most MCP_OFFLOAD_QUEUED wait behind the
 * one running. A job counts as a command running in its sandbox, so it is
 * never reset for idleness under it. */
#pragma once
#include "../sandbox-core/sandbox.h"

#include <jansson.h>
#include <stdbool.h>
#include <uv.h>

#define MCP_OFFLOAD_QUEUED 64
/* what jobs hold (writeFile's content) while they wait: one sandbox's,
 * and all sandboxes' together */
#define MCP_OFFLOAD_SANDBOX_BYTES (128u * 1024 * 1024)
#define MCP_OFFLOAD_BYTES (512u * 1024 * 1024)
#define MCP_OFFLOAD_RESULT_MAX (96u * 1024 * 1024) /* a result as JSON: a 32 MiB readFile, base64 */

/* Runs in the child, with the sandbox as the daemon has it; returns the
 * result to hand back (stolen), NULL for none. */
typedef json_t *(*mcp_work_fn)(void *ud, sbx_sandbox *sb);
/* Runs on the loop with the result (borrowed); NULL with why when there is
 * none: the child failed (INTERNAL), or the sandbox was destroyed first
 * (SANDBOX_NOT_FOUND). */
typedef void (*mcp_done_fn)(void *ud, json_t *result, const sbx_error *why);

/* Whether sb's file work goes to a child: it has a bucket mount (the only
 * file system in a sandbox that can keep a call waiting: sandboxes mount
 * nothing themselves), or work of its own waits already. Otherwise the
 * work runs on the loop at once, a fork cheaper. */
bool mcp_offload_wanted(sbx_sandbox *sb);
/* Queues work for sb, which holds `bytes` while it waits; -1 + err
 * (RESOURCE_LIMIT) when too many wait, or too much, in which case done is
 * not called. */
int mcp_offload(uv_loop_t *loop, sbx_sandbox *sb, size_t bytes, mcp_work_fn work, mcp_done_fn done, void *ud,
                sbx_error *err);
/* sb is going (destroyed): jobs waiting for it end now, the one running is
 * killed and ends with its child. */
void mcp_offload_forget(sbx_sandbox *sb);
/* The daemon is stopping: running jobs are killed and never answered. */
void mcp_offload_stop(void);
