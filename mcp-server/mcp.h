/* MCP over JSON-RPC 2.0, independent of the transport: a connection takes
 * whole messages in and hands whole messages out through `send`. */
#pragma once
#include <jansson.h>
#include <stdbool.h>
#include <uv.h>

#include "../sandbox-core/code.h"

#define MCP_MAX_MESSAGE (64u * 1024 * 1024) /* one message, any transport */
#define MCP_SERVER_NAME "sbx"
#define MCP_SERVER_VERSION "0.1.0"

typedef struct mcp_conn mcp_conn;
/* Sends one JSON-RPC message (no trailing newline; the transport frames it). */
typedef void (*mcp_send_fn)(void *ud, const char *data, size_t len);

/* Loads the tool catalog; call once before serving. */
int mcp_catalog_init(char *errbuf, size_t errlen);
/* The tools/list array (borrowed). */
json_t *mcp_catalog_tools(void);

mcp_conn *mcp_conn_new(uv_loop_t *loop, mcp_send_fn send, void *ud);
void mcp_conn_set_default_sandbox(mcp_conn *c, const char *id);
/* One message as received: parsed, dispatched, answered. */
void mcp_conn_handle(mcp_conn *c, const char *msg, size_t len);
/* The transport is gone: in-flight work is cancelled; the connection is
 * freed once its last call ends. `send` is never called again. */
void mcp_conn_close(mcp_conn *c);
/* A notifications/message to every legacy-era connection that asked for
 * `level` or lower (events no call is waiting for: idle resets). */
void mcp_broadcast_log(const char *level, const char *sandbox_id, const char *fmt, ...) SBX_PRINTF(3, 4);
/* Each call with a progressToken that has sent nothing for MCP_HEARTBEAT_MS
 * sends a progress notification without output: a client that resets its
 * timeout on progress keeps waiting for a command that prints nothing
 * (a quiet build). Often, from the loop. */
#define MCP_HEARTBEAT_MS 5000
void mcp_heartbeat(void);
/* Sends a JSON-RPC error for a message that could not be framed (e.g. too
 * large). */
void mcp_conn_send_error(mcp_conn *c, json_t *id, int code, const char *message);
/* `sbx exec -i`: the socket (ours) the next exec on this connection with
 * _meta "sbx/stdin": true takes as its stdin. */
void mcp_conn_set_stdin(mcp_conn *c, int fd);
int mcp_conn_take_stdin(mcp_conn *c);
/* A JSON-RPC result (stolen) for a message outside MCP (the daemon's own). */
void mcp_conn_send_result(mcp_conn *c, json_t *id, json_t *result);

/* ---- for tool handlers (tools.c) --------------------------------------- */

typedef struct mcp_tool mcp_tool;
typedef struct mcp_call {
  mcp_conn *conn; /* NULL once the client went away */
  json_t *id;
  json_t *progress_token;
  double progress;
  uint64_t noted_us; /* when it began, or sent its last progress (mcp_heartbeat) */
  bool cancelled;
  const mcp_tool *tool;
  char sandbox_id[64];
  sbx_exec *exec;
  sbx_code_run *code_run; /* runCode in progress: cancellation interrupts it */
  void *wait;             /* waitForLog and friends in progress: cancellation ends it */
  json_t *extra_content;  /* content blocks after the text (runCode's images) */
  bool sandbox_created; /* this call created the sandbox */
  bool result_is_error; /* mcp_call_ok with isError: true (a timed-out exec: output and an error) */
  bool modern;          /* protocol 2026-07-28: results carry resultType */
  bool raw;             /* _meta "sbx/raw": exec's progress carries its bytes (base64), not text */
  bool stdin_socket;    /* _meta "sbx/stdin": stdin from the connection's stdin socket */
  bool reset;           /* the sandbox was woken after an idle reset */
  bool restarted;       /* ...after a daemon restart, its files intact */
  bool fresh_context;   /* runCode: the default context had died, this runs in a new one */
  int log_level;        /* notifications/message at or above this; -1 none */
  struct mcp_outcome *outcome; /* its handler runs in a child: the answer is kept here (offload.h) */
  struct mcp_call *next;
} mcp_call;

uv_loop_t *mcp_call_loop(mcp_call *call);
/* sb is starting (sbx_sandbox_create or _wake said 1): the call goes on
 * once it runs, from its sandbox's lookup (its handler runs again), or
 * fails with why it did not start. */
void mcp_call_wait_start(mcp_call *call, json_t *args, sbx_sandbox *sb);
/* Every name of a comma-separated list is a tool (sbx mcp --tools): -1
 * with the valid names in err otherwise. The catalog must be loaded. */
int mcp_catalog_check_names(const char *csv, char *err, size_t errlen);
/* A sandbox was destroyed or reset: what the tools keep for it goes (tools.c). */
void mcp_sandbox_ended(sbx_sandbox *sb);
/* Ends a waitForLog/waitForExit/streamProcessLogs call (tools.c). */
void mcp_wait_cancel(void *wait);
/* A string as JSON can carry it: bytes that are not UTF-8 become U+FFFD
 * (a sandbox's names, a message cut inside a character). */
json_t *mcp_json_repaired(const char *s);
/* Finishes the call with structured content (stolen) and a short text. */
void mcp_call_ok(mcp_call *call, json_t *structured, const char *text);
void mcp_call_fail(mcp_call *call, const sbx_error *err);
/* A progress notification carrying a chunk of output. */
void mcp_call_progress(mcp_call *call, const char *stream, const char *text, size_t len);
/* A notifications/message about this call's work (a kill by a limit...),
 * sent when the client asked for that level. */
void mcp_call_log(mcp_call *call, const char *level, const char *fmt, ...) SBX_PRINTF(3, 4);

typedef void (*mcp_tool_fn)(mcp_call *call, json_t *args, sbx_sandbox *sb);
/* The C side of the catalog: name → handler (tools.c). */
typedef struct mcp_handler {
  const char *name;
  mcp_tool_fn fn;
  bool own_sandbox; /* handles the sandbox lookup itself (create, list) */
  bool no_wake;     /* works on a sleeping sandbox as it is (destroy) */
  bool offload;     /* may run in a child (offload.h): it only works on the sandbox's files */
  /* and runs in one whenever this boolean argument is true: work that
   * takes as long as the sandbox makes it (a recursive delete of a tree
   * it built) would stop the loop, every sandbox's calls, meanwhile */
  const char *offload_when;
} mcp_handler;
extern const mcp_handler mcp_handlers[];
extern const size_t mcp_handler_count;
