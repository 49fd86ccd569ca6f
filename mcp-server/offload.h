/* Work on a sandbox's files, off the daemon's loop.
 *
 * A file call can block in the kernel for as long as a filesystem takes to
 * answer: a bucket mount whose endpoint hangs holds a read or a lookup for
 * minutes (its server retries). Such work runs on a thread of its own, so
 * the loop keeps serving every other client and sandbox. Jobs of one
 * sandbox run one at a time, in the order they came; at most
 * MCP_OFFLOAD_QUEUED wait behind the one running. A job counts as a
 * command running in its sandbox, so it is never reset for idleness
 * under it. */
#pragma once
#include "../sandbox-core/sandbox.h"

#include <stdbool.h>
#include <uv.h>

#define MCP_OFFLOAD_QUEUED 64

/* Sets up the completions on the loop and malloc for threads: call before
 * the daemon makes any thread (mcp_offload does it otherwise). */
int mcp_offload_init(uv_loop_t *loop);

/* Runs on the worker thread. `view` holds only what the files API reads
 * (files.h: id, rootfd, uid_base), with a rootfd of its own. Work frees
 * nothing the loop allocated (see mcp_offload_init) and touches none of
 * the loop's state. */
typedef void (*mcp_work_fn)(void *ud, sbx_sandbox *view);
/* Runs on the loop once the work is done, or without it having run when
 * the sandbox was destroyed or reset while the job waited (`ran` false). */
typedef void (*mcp_done_fn)(void *ud, bool ran);

/* Queues work for sb; -1 + err (RESOURCE_LIMIT) when too many wait, in
 * which case neither callback is called. */
int mcp_offload(uv_loop_t *loop, sbx_sandbox *sb, mcp_work_fn work, mcp_done_fn done, void *ud, sbx_error *err);
/* sb is going (destroyed or reset): jobs waiting for it end now with
 * ran=false; the one running finishes on its own root fd. */
void mcp_offload_forget(sbx_sandbox *sb);
/* The daemon is stopping: what is still running is never answered. */
void mcp_offload_stop(void);
