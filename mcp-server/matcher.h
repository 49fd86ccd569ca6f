/* A waitForLog pattern matched against a process's lines, off the loop.
 *
 * What a pattern costs to match is up to whoever chose it and to the
 * lines the sandbox prints: glibc's regexec takes seconds on one 64 KiB
 * line for patterns as short as "(.*a){32}x", its regcomp minutes for
 * "((a*|b*){32})*", and no check of the pattern alone rules every such
 * case out. So the daemon neither compiles nor matches: a child of its
 * own does both, in the sandbox's cgroups (its CPU and memory are the
 * sandbox's), and answers line by line. The daemon only copies the lines
 * to it. A child that falls MCP_MATCH_BEHIND bytes behind ends the wait
 * with an error rather than hold more. */
#pragma once
#include "../sandbox-core/exec.h"

#include <stdbool.h>
#include <uv.h>

#define MCP_MATCH_BEHIND (4u << 20)

typedef struct mcp_matcher mcp_matcher;
/* A line matched (stream 1 stdout, 2 stderr; line borrowed); or, after
 * mcp_matcher_end, every line was matched and none did (line NULL, err
 * NULL); or the pattern does not compile (err VALIDATION_FAILED) or
 * matching failed (err). Called once, from the loop, never from within a
 * call to the matcher; it is done then and is let go with
 * mcp_matcher_free. */
typedef void (*mcp_match_cb)(void *ud, int stream, const char *line, size_t len, const sbx_error *err);

/* Starts the child with pattern (POSIX extended, compiled by the child).
 * NULL with err. */
mcp_matcher *mcp_matcher_start(uv_loop_t *loop, sbx_sandbox *sb, const char *pattern, mcp_match_cb cb, void *ud,
                               sbx_error *err);
/* Whether the child has compiled the pattern yet. */
bool mcp_matcher_compiled(const mcp_matcher *m);
/* Queues a line (its text up to a NUL is what is matched); flush sends
 * what is queued (after a chunk of output's lines). */
void mcp_matcher_feed(mcp_matcher *m, int stream, const char *line, size_t len);
void mcp_matcher_flush(mcp_matcher *m);
/* No more lines: the callback comes once those queued are matched. */
void mcp_matcher_end(mcp_matcher *m);
/* Stops the child; no callback comes after. */
void mcp_matcher_free(mcp_matcher *m);
