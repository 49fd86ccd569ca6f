/* A blocking MCP client of the daemon's socket, for the CLI verbs. */
#pragma once
#include <jansson.h>
#include <signal.h>

#include "../mcp-server/control.h"
#include "../sandbox-core/util.h"

typedef struct sbx_client {
  int fd;
  int next_id;
  sbx_buf in;
  char default_sandbox[64];
  int passed_fd; /* the last fd a message of the daemon carried (sbx cp), or -1 */
  bool stdin_stream; /* the next tools/call takes its stdin from the stream of sbx/stdin/open */
} sbx_client;

typedef void (*sbx_progress_fn)(void *ud, json_t *params);

/* Connects (starting the daemon if needed) and initializes. */
int sbx_client_open(sbx_client *c, const char *default_sandbox, char *err, size_t errlen);
/* A JSON-RPC request; returns its result (new reference) or NULL + err. */
json_t *sbx_client_request(sbx_client *c, const char *method, json_t *params, char *err, size_t errlen);
/* tools/call with args (stolen); progress, when given, gets every
 * notifications/progress; a set *interrupted cancels the call. */
json_t *sbx_client_call(sbx_client *c, const char *tool, json_t *args, sbx_progress_fn progress, void *ud,
                        volatile sig_atomic_t *interrupted, char *err, size_t errlen);
void sbx_client_close(sbx_client *c);
/* The next message (a new reference), NULL when the daemon closed. */
json_t *sbx_client_next(sbx_client *c);
