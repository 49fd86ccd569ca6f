#define _GNU_SOURCE
#include "mcp.h"
#include "offload.h"
#include "schema.h"
#include "tools_json.h"

#include <stdarg.h>
#include <string.h>

#include "../sandbox-core/files.h"

/* Protocol versions of the legacy (initialize) era, oldest first, and of
 * the modern (stateless, per-request) era. */
static const char *const versions[] = {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"};
#define MODERN_VERSION "2026-07-28"
#define META_VERSION "io.modelcontextprotocol/protocolVersion"
#define META_CAPS "io.modelcontextprotocol/clientCapabilities"
#define META_LOGLEVEL "io.modelcontextprotocol/logLevel"
#define META_SERVER_INFO "io.modelcontextprotocol/serverInfo"
#define LIST_TTL_MS 300000
#define MAX_CALLS 256 /* tools/call in progress on one connection; past it, RESOURCE_LIMIT at once */
#define RESOURCE_TEMPLATE "sbx://{sandboxId}/{+path}"

static const char *const log_levels[] = {"debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"};
static int log_level_index(const char *l) {
  for (size_t i = 0; l && i < SBX_ARRAY_SIZE(log_levels); i++)
    if (!strcmp(l, log_levels[i])) return (int)i;
  return -1;
}

static const char instructions[] =
    "sbx gives you isolated Linux sandboxes on this machine. Every tool but listSandboxes takes an optional "
    "sandboxId (1-63 of [a-z0-9-]); without it, this connection's own sandbox is used. Tools that do work "
    "(exec, writeFile, mkdir, createSession, ...) create the sandbox on first use; tools that only look "
    "answer SANDBOX_NOT_FOUND. Work in /workspace (relative paths land there). exec runs bash in a "
    "session that keeps cd, variables, functions and options; pass a progressToken to see output as it comes, and a "
    "timeout (ms) for anything that may hang. Output is capped per stream (maxOutputBytes) with the full "
    "text saved at outputPath. A sandbox idle for its sleepAfter is reset: its files are gone (bucket mounts "
    "keep theirs) and the next result says reset: true.";

struct mcp_tool {
  const char *name;
  bool read_only;
  json_t *def;          /* the tools/list entry */
  json_t *input_schema; /* borrowed from def */
  const mcp_handler *h;
  bool creates, global;
};

static struct {
  json_t *doc;
  json_t *list;
  mcp_tool *tools;
  size_t n;
} catalog;

struct mcp_conn {
  uv_loop_t *loop;
  mcp_send_fn send;
  void *ud;
  bool closed;
  int refs;
  char default_sandbox[64];
  int log_level;   /* legacy era: logging/setLevel; -1 = none asked */
  bool read_only;  /* `sbx mcp --read-only` */
  json_t *allowed; /* `sbx mcp --tools a,b`: names, or NULL for all */
  mcp_call *calls;
  int ncalls; /* in progress: at most MAX_CALLS */
  int stdin_fd; /* `sbx exec -i`: a socket for the next exec's stdin (sbx/stdin/open), or -1 */
  struct mcp_conn *next_live; /* all open connections, for broadcasts */
};

static mcp_conn *live;

/* ---- catalog ----------------------------------------------------------- */

static json_t *output_schema(json_t *t) {
  json_t *props = json_deep_copy(json_object_get(t, "output"));
  if (!props) props = json_object();
  json_t *req = json_object_get(t, "outputRequired");
  json_object_set_new(props, "reset", json_pack("{s:s, s:s}", "type", "boolean", "description",
                                                 "the sandbox had been reset for idleness: its files are gone (bucket mounts keep theirs)"));
  json_object_set_new(props, "restarted",
                      json_pack("{s:s, s:s}", "type", "boolean", "description",
                                "the sandbox's processes ended with an earlier daemon; its files and sessions are kept"));
  json_t *own = json_object_get(props, "error");
  if (own) { /* the tool's own error field (runCode's exception): a failure's fits it too */
    json_t *p = json_object_get(own, "properties");
    json_object_set_new(p, "code", json_pack("{s:s}", "type", "string"));
    json_object_set_new(p, "message", json_pack("{s:s}", "type", "string"));
  } else {
    json_object_set_new(props, "error",
                        json_pack("{s:s, s:{s:{s:s}, s:{s:s}}, s:[s,s]}", "type", "object", "properties", "code", "type",
                                  "string", "message", "type", "string", "required", "code", "message"));
  }
  /* either the success fields or an error */
  return json_pack("{s:s, s:o, s:[{s:O}, {s:[s]}]}", "type", "object", "properties", props, "anyOf", "required",
                   req ? req : json_array(), "required", "error");
}

int mcp_catalog_init(char *errbuf, size_t errlen) {
  if (catalog.list) return 0;
  json_error_t je;
  catalog.doc = json_loadb(mcp_tools_json, sizeof mcp_tools_json - 1, JSON_REJECT_DUPLICATES, &je);
  if (!catalog.doc) {
    snprintf(errbuf, errlen, "tools.json:%d: %s", je.line, je.text);
    return -1;
  }
  json_t *tools = json_object_get(catalog.doc, "tools");
  catalog.n = json_array_size(tools);
  catalog.tools = calloc(catalog.n, sizeof *catalog.tools);
  catalog.list = json_array();
  size_t i;
  json_t *t;
  json_array_foreach(tools, i, t) {
    mcp_tool *mt = &catalog.tools[i];
    mt->name = json_string_value(json_object_get(t, "name"));
    mt->creates = json_is_true(json_object_get(t, "creates"));
    mt->global = json_is_true(json_object_get(t, "global"));
    mt->read_only = json_is_true(json_object_get(json_object_get(t, "annotations"), "readOnlyHint"));
    for (size_t k = 0; k < mcp_handler_count; k++)
      if (!strcmp(mcp_handlers[k].name, mt->name)) mt->h = &mcp_handlers[k];
    if (!mt->h) {
      snprintf(errbuf, errlen, "tool %s has no handler", mt->name);
      return -1;
    }
    json_t *in = json_pack("{s:s, s:O, s:O, s:b}", "type", "object", "properties", json_object_get(t, "input"),
                           "required", json_object_get(t, "required"), "additionalProperties", 0);
    mt->def = json_pack("{s:s, s:O, s:O, s:o, s:o, s:O}", "name", mt->name, "title", json_object_get(t, "title"),
                        "description", json_object_get(t, "description"), "inputSchema", in, "outputSchema",
                        output_schema(t), "annotations", json_object_get(t, "annotations"));
    mt->input_schema = in;
    json_array_append(catalog.list, mt->def);
  }
  for (size_t k = 0; k < mcp_handler_count; k++) {
    bool found = false;
    for (size_t j = 0; j < catalog.n; j++) found |= catalog.tools[j].h == &mcp_handlers[k];
    if (!found) {
      snprintf(errbuf, errlen, "handler %s is not in the catalog", mcp_handlers[k].name);
      return -1;
    }
  }
  return 0;
}

json_t *mcp_catalog_tools(void) { return catalog.list; }

static const mcp_tool *find_tool(const char *name);

int mcp_catalog_check_names(const char *csv, char *err, size_t errlen) {
  char *copy = strdup(csv ? csv : ""), *save = NULL;
  int r = 0;
  for (char *n = strtok_r(copy, ",", &save); n && !r; n = strtok_r(NULL, ",", &save)) {
    while (*n == ' ') n++;
    if (*n && !find_tool(n)) {
      int k = snprintf(err, errlen, "unknown tool '%.60s'; the tools are:", n);
      for (size_t i = 0; i < catalog.n && k > 0 && (size_t)k < errlen; i++)
        k += snprintf(err + k, errlen - (size_t)k, "%s %s", i ? "," : "", catalog.tools[i].name);
      r = -1;
    }
  }
  free(copy);
  return r;
}

static const mcp_tool *find_tool(const char *name) {
  for (size_t i = 0; i < catalog.n; i++)
    if (!strcmp(catalog.tools[i].name, name)) return &catalog.tools[i];
  return NULL;
}

/* ---- sending ----------------------------------------------------------- */

static void send_json(mcp_conn *c, json_t *msg) {
  if (!c || c->closed) {
    json_decref(msg);
    return;
  }
  char *s = json_dumps(msg, JSON_COMPACT);
  size_t len = s ? strlen(s) : 0;
  if (s && len >= MCP_MAX_MESSAGE) {
    /* no transport carries it (the relay would drop it and the client wait
     * for ever): the request gets an error that says why */
    json_t *id = json_object_get(msg, "id");
    json_t *err = id ? json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", id, "error", "code", -32603, "message",
                                 "the answer is over the 64 MiB message limit; ask for less (a smaller maxOutputBytes, "
                                 "a file in parts)")
                     : NULL;
    char *e = err ? json_dumps(err, JSON_COMPACT) : NULL;
    json_decref(err);
    free(s);
    s = e;
    len = s ? strlen(s) : 0;
  }
  json_decref(msg);
  if (!s) return;
  c->send(c->ud, s, len);
  free(s);
}

/* A result, shaped for its era: modern results carry resultType and the
 * server's identity in _meta. */
static void send_result(mcp_conn *c, json_t *id, bool modern, json_t *result) {
  if (modern) {
    json_object_set_new(result, "resultType", json_string("complete"));
    json_object_set_new(result, "_meta", json_pack("{s:{s:s, s:s}}", META_SERVER_INFO, "name", MCP_SERVER_NAME,
                                                   "version", MCP_SERVER_VERSION));
  }
  send_json(c, json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result", result));
}

static void send_list_result(mcp_conn *c, json_t *id, bool modern, json_t *result) {
  if (modern) {
    json_object_set_new(result, "ttlMs", json_integer(LIST_TTL_MS));
    json_object_set_new(result, "cacheScope", json_string("private"));
  }
  send_result(c, id, modern, result);
}

void mcp_conn_send_error(mcp_conn *c, json_t *id, int code, const char *message) {
  send_json(c, json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", id ? id : json_null(), "error", "code",
                         code, "message", message));
}

void mcp_conn_send_result(mcp_conn *c, json_t *id, json_t *result) {
  send_json(c, json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result", result));
}

static void send_error_data(mcp_conn *c, json_t *id, int code, const char *message, json_t *data) {
  send_json(c, json_pack("{s:s, s:O, s:{s:i, s:s, s:o}}", "jsonrpc", "2.0", "id", id, "error", "code", code, "message",
                         message, "data", data));
}

/* ---- calls ------------------------------------------------------------- */

static void conn_unref(mcp_conn *c) {
  if (--c->refs == 0) {
    mcp_conn **pp = &live;
    while (*pp && *pp != c) pp = &(*pp)->next_live;
    if (*pp) *pp = c->next_live;
    json_decref(c->allowed);
    if (c->stdin_fd >= 0) close(c->stdin_fd);
    free(c);
  }
}

static void call_free(mcp_call *call) {
  mcp_conn *c = call->conn;
  if (c) {
    mcp_call **pp = &c->calls;
    while (*pp && *pp != call) pp = &(*pp)->next;
    if (*pp) *pp = call->next, c->ncalls--;
    conn_unref(c);
  }
  json_decref(call->id);
  json_decref(call->progress_token);
  json_decref(call->extra_content);
  free(call);
}

uv_loop_t *mcp_call_loop(mcp_call *call) { return call->conn ? call->conn->loop : uv_default_loop(); }

/* The answer of a handler that runs in a child (offload.h): kept there,
 * and handed to the loop as JSON. */
typedef struct mcp_outcome {
  bool ok;
  json_t *structured;
  char *text;
  sbx_error err;
} mcp_outcome;

void mcp_call_ok(mcp_call *call, json_t *structured, const char *text) {
  if (call->outcome) {
    call->outcome->ok = true;
    call->outcome->structured = structured;
    call->outcome->text = text ? strdup(text) : NULL;
    return;
  }
  if (call->conn && !call->cancelled) {
    char *note = NULL;
    if (call->reset) {
      json_object_set_new(structured, "reset", json_true());
      note = sbx_strdup_printf("%s\n[sandbox %s had been reset after being idle: its earlier files and processes are gone, bucket mounts kept]",
                               text ? text : "", call->sandbox_id);
    } else if (call->restarted) {
      json_object_set_new(structured, "restarted", json_true());
      note = sbx_strdup_printf("%s\n[sandbox %s was restarted after the sbx daemon restarted: its files and sessions are "
                               "kept, its processes ended]",
                               text ? text : "", call->sandbox_id);
    }
    json_t *res = json_pack("{s:[{s:s, s:s}], s:O, s:b}", "content", "type", "text", "text", note ? note : text ? text : "",
                            "structuredContent", structured, "isError", call->result_is_error);
    free(note);
    if (!res) { /* text that is not UTF-8 got this far: an answer all the same */
      json_decref(structured);
      sbx_error err;
      sbx_err(&err, "INTERNAL", "the result could not be encoded as JSON (text that is not UTF-8?)");
      return mcp_call_fail(call, &err);
    }
    if (call->extra_content) json_array_extend(json_object_get(res, "content"), call->extra_content);
    send_result(call->conn, call->id, call->modern, res);
  }
  json_decref(structured);
  call_free(call);
}

void mcp_call_fail(mcp_call *call, const sbx_error *err) {
  if (call->outcome) {
    call->outcome->ok = false;
    call->outcome->err = *err;
    return;
  }
  if (call->conn && !call->cancelled) {
    char text[600];
    size_t mlen;
    char *message = sbx_utf8_repair(err->message, strlen(err->message), &mlen); /* it may quote a sandbox's names */
    snprintf(text, sizeof text, "%s: %s", err->code, message ? message : "");
    json_t *res = json_pack("{s:[{s:s, s:s}], s:{s:{s:s, s:s}}, s:b}", "content", "type", "text", "text", text,
                            "structuredContent", "error", "code", err->code, "message", message ? message : "",
                            "isError", 1);
    free(message);
    if (call->reset) json_object_set_new(json_object_get(res, "structuredContent"), "reset", json_true());
    if (call->restarted) json_object_set_new(json_object_get(res, "structuredContent"), "restarted", json_true());
    send_result(call->conn, call->id, call->modern, res);
  }
  call_free(call);
}

void mcp_call_progress(mcp_call *call, const char *stream, const char *text, size_t len) {
  if (!call->conn || call->cancelled || !call->progress_token) return;
  call->progress += len ? (double)len : 1; /* it must grow with each notification, a heartbeat's too */
  call->noted_us = sbx_now_us();
  if (call->raw) { /* the bytes as they came (sbx exec's output may be binary) */
    size_t n;
    char *b64 = sbx_base64_encode(text, len, &n);
    if (!b64) return;
    send_json(call->conn, json_pack("{s:s, s:s, s:{s:O, s:f, s:{s:s, s:s%}}}", "jsonrpc", "2.0", "method",
                                    "notifications/progress", "params", "progressToken", call->progress_token,
                                    "progress", call->progress, "_meta", "sbx/stream", stream, "sbx/data", b64, n));
    free(b64);
    return;
  }
  json_t *msg = json_pack("{s:s, s:s, s:{s:O, s:f, s:s%, s:{s:s}}}", "jsonrpc", "2.0", "method",
                          "notifications/progress", "params", "progressToken", call->progress_token, "progress",
                          call->progress, "message", text, len, "_meta", "sbx/stream", stream);
  send_json(call->conn, msg);
}

void mcp_heartbeat(void) {
  uint64_t now = sbx_now_us();
  for (mcp_conn *c = live; c; c = c->next_live)
    for (mcp_call *call = c->closed ? NULL : c->calls; call; call = call->next)
      /* sbx exec (raw) has no timeout to keep off: it wants output only */
      if (!call->raw && now - call->noted_us >= MCP_HEARTBEAT_MS * 1000ULL) mcp_call_progress(call, "heartbeat", "", 0);
}

void mcp_call_log(mcp_call *call, const char *level, const char *fmt, ...) {
  int want = log_level_index(level);
  if (!call->conn || call->cancelled || call->log_level < 0 || want < call->log_level) return;
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  send_json(call->conn, json_pack("{s:s, s:s, s:{s:s, s:s, s:{s:s, s:s}}}", "jsonrpc", "2.0", "method",
                                  "notifications/message", "params", "level", level, "logger", "sbx", "data",
                                  "sandboxId", call->sandbox_id, "message", msg));
}

void mcp_broadcast_log(const char *level, const char *sandbox_id, const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int want = log_level_index(level);
  for (mcp_conn *c = live; c; c = c->next_live)
    if (!c->closed && c->log_level >= 0 && want >= c->log_level)
      send_json(c, json_pack("{s:s, s:s, s:{s:s, s:s, s:{s:s, s:s}}}", "jsonrpc", "2.0", "method",
                             "notifications/message", "params", "level", level, "logger", "sbx", "data", "sandboxId",
                             sandbox_id, "message", msg));
}

/* ---- dispatch ---------------------------------------------------------- */

typedef struct request {
  mcp_conn *c;
  json_t *id;
  json_t *params; /* never NULL */
  bool modern;
  int log_level;
} request;

static json_t *capabilities(void) {
  return json_pack("{s:{s:b}, s:{s:b, s:b}, s:{}}", "tools", "listChanged", 0, "resources", "subscribe", 0,
                   "listChanged", 0, "logging");
}

static void do_initialize(request *r) {
  const char *asked = json_string_value(json_object_get(r->params, "protocolVersion"));
  const char *v = versions[SBX_ARRAY_SIZE(versions) - 1];
  for (size_t i = 0; asked && i < SBX_ARRAY_SIZE(versions); i++)
    if (!strcmp(asked, versions[i])) v = versions[i];
  send_result(r->c, r->id, false,
              json_pack("{s:s, s:o, s:{s:s, s:s, s:s}, s:s}", "protocolVersion", v, "capabilities", capabilities(),
                        "serverInfo", "name", MCP_SERVER_NAME, "title", "sbx sandboxes", "version", MCP_SERVER_VERSION,
                        "instructions", instructions));
}

static json_t *supported_versions(void) {
  json_t *a = json_array();
  json_array_append_new(a, json_string(MODERN_VERSION));
  for (size_t i = SBX_ARRAY_SIZE(versions); i-- > 0;) json_array_append_new(a, json_string(versions[i]));
  return a;
}

static void do_discover(request *r) {
  send_result(r->c, r->id, true,
              json_pack("{s:i, s:s, s:o, s:o, s:s}", "ttlMs", LIST_TTL_MS, "cacheScope", "private",
                        "supportedVersions", supported_versions(), "capabilities", capabilities(), "instructions",
                        instructions));
}

static bool tool_enabled(mcp_conn *c, const mcp_tool *t) {
  if (c->read_only && !t->read_only) return false;
  if (!c->allowed) return true;
  size_t i;
  json_t *n;
  json_array_foreach(c->allowed, i, n) if (!strcmp(json_string_value(n), t->name)) return true;
  return false;
}

static void do_tools_list(request *r) {
  json_t *list = json_array();
  for (size_t i = 0; i < catalog.n; i++)
    if (tool_enabled(r->c, &catalog.tools[i])) json_array_append(list, catalog.tools[i].def);
  send_list_result(r->c, r->id, r->modern, json_pack("{s:o}", "tools", list));
}

typedef struct offloaded {
  mcp_call *call;
  json_t *args;
  mcp_tool_fn fn;
} offloaded;

json_t *mcp_json_repaired(const char *s) {
  size_t len;
  char *fixed = sbx_utf8_repair(s ? s : "", s ? strlen(s) : 0, &len);
  json_t *j = fixed ? json_stringn(fixed, len) : json_string("");
  free(fixed);
  return j;
}

/* In the child: the handler, its answer as JSON. */
static json_t *call_work(void *ud, sbx_sandbox *sb) {
  offloaded *o = ud;
  mcp_outcome out = {0};
  o->call->outcome = &out;
  o->fn(o->call, o->args, sb);
  json_t *r = out.ok ? json_pack("{s:b, s:o?, s:s?, s:O?}", "ok", 1, "structured", out.structured, "text", out.text,
                                 "extra", o->call->extra_content)
                     : json_pack("{s:b, s:s, s:o}", "ok", 0, "code", out.err.code ? out.err.code : "INTERNAL", "message",
                                 mcp_json_repaired(out.err.message));
  if (!r) /* text that is not UTF-8 got this far: an answer all the same */
    r = json_pack("{s:b, s:s, s:s}", "ok", 0, "code", "INTERNAL", "message",
                  "the result could not be encoded as JSON (text that is not UTF-8?)");
  return r;
}

static void call_done(void *ud, json_t *r, const sbx_error *why) {
  offloaded *o = ud;
  mcp_call *call = o->call;
  json_t *structured = json_object_get(r, "structured");
  if (!r) {
    mcp_call_fail(call, why);
  } else if (json_is_true(json_object_get(r, "ok")) && structured) {
    json_t *extra = json_object_get(r, "extra");
    if (extra) call->extra_content = json_incref(extra);
    mcp_call_ok(call, json_incref(structured), json_string_value(json_object_get(r, "text")));
  } else {
    sbx_error err = {.code = json_string_value(json_object_get(r, "code"))};
    if (!err.code) err.code = "INTERNAL";
    snprintf(err.message, sizeof err.message, "%s", json_string_value(json_object_get(r, "message")) ?: "");
    mcp_call_fail(call, &err);
  }
  json_decref(o->args);
  free(o);
}

/* Takes args. */
static void call_go(mcp_call *call, json_t *args);

static void offload_call(mcp_call *call, json_t *args, sbx_sandbox *sb, mcp_tool_fn fn) {
  sbx_error err = {0};
  offloaded *o = calloc(1, sizeof *o);
  if (!o) {
    json_decref(args);
    return mcp_call_fail(call, &(sbx_error){.code = "INTERNAL", .message = "out of memory"});
  }
  *o = (offloaded){.call = call, .args = args, .fn = fn};
  size_t bytes = json_string_length(json_object_get(args, "content")); /* writeFile's: the rest is small */
  if (mcp_offload(mcp_call_loop(call), sb, bytes, call_work, call_done, o, &err) < 0) {
    json_decref(args);
    free(o);
    mcp_call_fail(call, &err);
  }
}

static void do_tools_call(request *r) {
  mcp_conn *c = r->c;
  const char *name = json_string_value(json_object_get(r->params, "name"));
  if (!name) return mcp_conn_send_error(c, r->id, -32602, "tools/call needs params.name");
  const mcp_tool *t = find_tool(name);
  if (!t || !tool_enabled(c, t)) {
    char msg[256];
    snprintf(msg, sizeof msg, t ? "tool '%.200s' is not enabled on this connection" : "unknown tool '%.200s'", name);
    return mcp_conn_send_error(c, r->id, -32602, msg);
  }
  json_t *args = json_object_get(r->params, "arguments");
  if (args && !json_is_object(args) && !json_is_null(args))
    return mcp_conn_send_error(c, r->id, -32602, "params.arguments must be an object");
  json_t *owned = args && json_is_object(args) ? json_incref(args) : json_object();

  mcp_call *call = calloc(1, sizeof *call);
  call->conn = c;
  c->refs++;
  call->id = json_incref(r->id);
  call->tool = t;
  call->modern = r->modern;
  call->log_level = r->log_level;
  json_t *tok = json_object_get(json_object_get(r->params, "_meta"), "progressToken");
  if (json_is_string(tok) || json_is_integer(tok)) call->progress_token = json_incref(tok);
  call->stdin_socket = json_is_true(json_object_get(json_object_get(r->params, "_meta"), "sbx/stdin"));
  call->raw = json_is_true(json_object_get(json_object_get(r->params, "_meta"), "sbx/raw"));
  call->noted_us = sbx_now_us();
  call->next = c->calls;
  c->calls = call;
  c->ncalls++;

  sbx_error err = {0};
  char msg[400];
  if (c->ncalls > MAX_CALLS) {
    sbx_err(&err, "RESOURCE_LIMIT", "%d calls are in progress on this connection already; wait for some to end", MAX_CALLS);
    mcp_call_fail(call, &err);
    json_decref(owned);
    return;
  }
  if (!mcp_schema_validate(t->input_schema, owned, msg, sizeof msg)) {
    sbx_err(&err, "VALIDATION_FAILED", "%s: %s", name, msg);
    mcp_call_fail(call, &err);
    json_decref(owned);
    return;
  }
  const char *sid = json_string_value(json_object_get(owned, "sandboxId"));
  snprintf(call->sandbox_id, sizeof call->sandbox_id, "%s", sid ? sid : c->default_sandbox);
  call_go(call, owned);
  json_decref(owned);
}

/* ---- a call whose sandbox is starting -----------------------------------
 * It waits on the loop (which serves every other call meanwhile) and then
 * goes on from its sandbox's lookup: the sandbox may have gone since. */
typedef struct parked {
  mcp_call *call;
  json_t *args;
} parked;

static void parked_go(void *ud, const sbx_error *err) {
  parked *p = ud;
  mcp_call *call = p->call;
  sbx_error gone = {0};
  if (!err && call->cancelled) { /* nobody hears the answer: the call just goes */
    sbx_err(&gone, "INTERNAL", "cancelled");
    err = &gone;
  }
  if (err) mcp_call_fail(call, err);
  else call_go(call, p->args);
  json_decref(p->args);
  free(p);
}

void mcp_call_wait_start(mcp_call *call, json_t *args, sbx_sandbox *sb) {
  parked *p = calloc(1, sizeof *p);
  sbx_error err = {0};
  if (!p || sbx_sandbox_when_started(sb, parked_go, p) < 0) {
    free(p);
    sbx_err(&err, "INTERNAL", "out of memory");
    return mcp_call_fail(call, &err);
  }
  p->call = call;
  p->args = json_incref(args);
}

/* The call from its sandbox's lookup on (args borrowed). */
static void call_go(mcp_call *call, json_t *args) {
  const mcp_tool *t = call->tool;
  sbx_error err = {0};
  sbx_sandbox *sb = NULL;
  if (!t->h->own_sandbox && !t->global) {
    sb = sbx_sandbox_find(call->sandbox_id);
    int r = sb && !t->h->no_wake ? sbx_sandbox_wake(sb, &err) : 0;
    if (r == 0 && !sb && t->creates) {
      sbx_sandbox_opts o;
      sbx_sandbox_default_opts(&o);
      bool created = false;
      r = sbx_sandbox_create(call->sandbox_id, &o, &sb, &created, &err);
      call->sandbox_created |= created;
    }
    if (r < 0) return mcp_call_fail(call, &err);
    if (r > 0) return mcp_call_wait_start(call, args, sb);
    if (sb && !t->h->no_wake) {
      call->reset = sbx_sandbox_take_reset(sb);
      call->restarted = sbx_sandbox_take_restart(sb);
    }
    if (!sb) {
      sbx_err(&err, "SANDBOX_NOT_FOUND", "no sandbox '%s' (tools that do work create it; call createSandbox)",
              call->sandbox_id);
      return mcp_call_fail(call, &err);
    }
    sbx_sandbox_touch(sb);
  }
  bool long_work = t->h->offload_when && json_is_true(json_object_get(args, t->h->offload_when));
  if (sb && t->h->offload && (long_work || mcp_offload_wanted(sb))) return offload_call(call, json_incref(args), sb, t->h->fn);
  t->h->fn(call, args, sb);
}

/* ---- resources: sbx://{sandboxId}/{+path} ------------------------------- */

static void do_resources_list(request *r) {
  json_t *list = json_array();
  for (sbx_sandbox *sb = sbx_sandbox_list(); sb; sb = sb->next) {
    char uri[128], name[128];
    snprintf(uri, sizeof uri, "sbx://%s/workspace", sb->id);
    snprintf(name, sizeof name, "%s:/workspace", sb->id);
    json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:s}", "uri", uri, "name", name, "description",
                                          "the sandbox's /workspace (read for a listing)", "mimeType",
                                          "application/json"));
  }
  send_list_result(r->c, r->id, r->modern, json_pack("{s:o}", "resources", list));
}

static void do_resource_templates(request *r) {
  json_t *t = json_pack("[{s:s, s:s, s:s, s:s}]", "uriTemplate", RESOURCE_TEMPLATE, "name", "sandbox-file", "title",
                        "File in a sandbox", "description",
                        "Any file of a sandbox by absolute path, e.g. sbx://my-sandbox/workspace/README.md; "
                        "text comes back as text, binary as a base64 blob, a directory as a JSON listing");
  send_list_result(r->c, r->id, r->modern, json_pack("{s:o}", "resourceTemplates", t));
}

static void listing_cb(void *ud, const sbx_fs_entry *e) {
  json_array_append_new(ud, json_pack("{s:s, s:s, s:I}", "name", e->name, "type", e->type, "size", (json_int_t)e->size));
}

static int percent_decode(const char *in, char *out, size_t len) {
  size_t o = 0;
  for (const char *p = in; *p; p++) {
    if (o + 1 >= len) return -1;
    if (*p == '%' && p[1] && p[2]) {
      char hex[3] = {p[1], p[2], 0};
      char *end;
      long v = strtol(hex, &end, 16);
      if (*end || v == 0) return -1;
      out[o++] = (char)v;
      p += 2;
    } else {
      out[o++] = *p;
    }
  }
  out[o] = 0;
  return 0;
}

/* A resources/read, worked on in a child of its own (offload.h). */
typedef struct resource_read {
  mcp_conn *c;
  json_t *id;
  bool modern;
  char *uri;
  char path[4096];
} resource_read;

/* In the child: {"content": ...} or {"message": ..., "data": ...}. */
static json_t *resource_work(void *ud, sbx_sandbox *sb) {
  resource_read *rr = ud;
  sbx_error err = {0};
  _cleanup_free_ char *data = NULL;
  size_t len = 0;
  const char *uri = rr->uri, *path = rr->path;
  char msg[700];
  json_t *content;
  if (sbx_fs_check_dir(sb, path, NULL) == 0) {
    json_t *entries = json_array();
    if (sbx_fs_list(sb, path, false, true, listing_cb, entries, NULL, &err) < 0) {
      json_decref(entries);
      snprintf(msg, sizeof msg, "%s: %s", err.code, err.message);
      return json_pack("{s:o, s:{s:s}}", "message", mcp_json_repaired(msg), "data", "uri", uri);
    }
    char *text = json_dumps(entries, JSON_COMPACT);
    json_decref(entries);
    content = json_pack("{s:s, s:s, s:s}", "uri", uri, "mimeType", "application/json", "text", text);
    free(text);
  } else if (sbx_fs_read(sb, path, SBX_MAX_READ, &data, &len, &err) < 0) {
    snprintf(msg, sizeof msg, "%s: %s", err.code, err.message);
    return json_pack("{s:o, s:{s:s, s:s}}", "message", mcp_json_repaired(msg), "data", "uri", uri, "code", err.code);
  } else if (memchr(data, 0, len) || !sbx_utf8_valid(data, len)) {
    _cleanup_free_ char *b = sbx_base64_encode(data, len, NULL);
    content = json_pack("{s:s, s:s, s:s}", "uri", uri, "mimeType", sbx_fs_mime(path, false), "blob", b);
  } else {
    content = json_pack("{s:s, s:s, s:s%}", "uri", uri, "mimeType", sbx_fs_mime(path, true), "text", data, len);
  }
  return json_pack("{s:o}", "content", content);
}

static void resource_done(void *ud, json_t *r, const sbx_error *why) {
  resource_read *rr = ud;
  json_t *content = json_object_get(r, "content");
  if (content) {
    json_t *res = json_pack("{s:[O]}", "contents", content);
    if (rr->modern) send_list_result(rr->c, rr->id, true, res); /* modern reads carry cache fields too */
    else send_result(rr->c, rr->id, false, res);
  } else {
    char msg[700];
    snprintf(msg, sizeof msg, "%s",
             r ? json_string_value(json_object_get(r, "message")) ?: "" : why ? why->message : "the read failed");
    json_t *data = json_object_get(r, "data");
    send_error_data(rr->c, rr->id, -32002, msg, data ? json_incref(data) : json_pack("{s:s}", "uri", rr->uri));
  }
  conn_unref(rr->c);
  json_decref(rr->id);
  free(rr->uri);
  free(rr);
}

static void do_resources_read(request *r) {
  const char *uri = json_string_value(json_object_get(r->params, "uri"));
  if (!uri) return mcp_conn_send_error(r->c, r->id, -32602, "resources/read needs params.uri");
  char id[64], path[4096];
  const char *rest = strncmp(uri, "sbx://", 6) ? NULL : uri + 6, *slash = rest ? strchr(rest, '/') : NULL;
  if (!slash || (size_t)(slash - rest) >= sizeof id) return mcp_conn_send_error(r->c, r->id, -32602, "not an sbx:// URI");
  memcpy(id, rest, slash - rest);
  id[slash - rest] = 0;
  if (!sbx_valid_id(id) || percent_decode(slash, path, sizeof path) < 0)
    return mcp_conn_send_error(r->c, r->id, -32602, "malformed sbx:// URI");
  sbx_sandbox *sb = sbx_sandbox_find(id);
  sbx_error err = {0};
  char msg[700];
  if (!sb) {
    snprintf(msg, sizeof msg, "no sandbox '%s'", id);
    return send_error_data(r->c, r->id, -32002, msg, json_pack("{s:s}", "uri", uri));
  }
  sbx_sandbox_touch(sb);
  resource_read *rr = calloc(1, sizeof *rr);
  if (!rr || !(rr->uri = strdup(uri))) {
    free(rr);
    return mcp_conn_send_error(r->c, r->id, -32603, "out of memory");
  }
  rr->c = r->c;
  rr->id = json_incref(r->id);
  rr->modern = r->modern;
  snprintf(rr->path, sizeof rr->path, "%s", path);
  r->c->refs++;
  if (!mcp_offload_wanted(sb)) {
    json_t *res = resource_work(rr, sb);
    resource_done(rr, res, NULL);
    json_decref(res);
  } else if (mcp_offload(r->c->loop, sb, 0, resource_work, resource_done, rr, &err) < 0) {
    resource_done(rr, NULL, &err);
  }
}

/* Cancels a call's work. A wait answers now: the call is gone after it. */
static void call_cancel(mcp_call *call) {
  sbx_exec *x = call->exec;
  sbx_code_run *run = call->code_run;
  void *wait = call->wait;
  call->cancelled = true;
  if (x) sbx_exec_cancel(x);
  if (run) sbx_code_cancel(run);
  if (wait) mcp_wait_cancel(wait);
}

static void do_cancelled(mcp_conn *c, json_t *params) {
  json_t *rid = json_object_get(params, "requestId");
  for (mcp_call *call = c->calls, *next; call; call = next) {
    next = call->next; /* taken first: a wait's call goes as it is cancelled */
    if (rid && json_equal(call->id, rid)) call_cancel(call);
  }
}

static void do_hello(mcp_conn *c, json_t *params) {
  const char *d = json_string_value(json_object_get(params, "defaultSandboxId"));
  if (d && sbx_valid_id(d)) mcp_conn_set_default_sandbox(c, d);
  if (json_is_true(json_object_get(params, "readOnly"))) c->read_only = true;
  json_t *tools = json_object_get(params, "tools");
  if (json_is_array(tools)) {
    json_decref(c->allowed);
    c->allowed = json_deep_copy(tools);
  }
}

/* The modern era's per-request envelope: checked, or answered with the
 * error it deserves. Returns false when an error was sent. */
static bool check_modern(request *r, const char *method) {
  json_t *meta = json_object_get(r->params, "_meta");
  json_t *v = json_object_get(meta, META_VERSION);
  if (!json_is_string(v)) {
    mcp_conn_send_error(r->c, r->id, -32602, method[0] == 's' ? "server/discover needs params._meta[\"" META_VERSION "\"]"
                                                              : "params._meta[\"" META_VERSION "\"] must be a string");
    return false;
  }
  if (strcmp(json_string_value(v), MODERN_VERSION)) {
    char msg[200];
    snprintf(msg, sizeof msg, "unsupported protocol version '%.50s'", json_string_value(v));
    send_error_data(r->c, r->id, -32022, msg, json_pack("{s:o, s:O}", "supported", supported_versions(), "requested", v));
    return false;
  }
  if (!json_is_object(json_object_get(meta, META_CAPS))) {
    mcp_conn_send_error(r->c, r->id, -32602, "params._meta[\"" META_CAPS "\"] is required in protocol " MODERN_VERSION);
    return false;
  }
  const char *lvl = json_string_value(json_object_get(meta, META_LOGLEVEL));
  r->log_level = lvl ? log_level_index(lvl) : -1;
  return true;
}

void mcp_conn_handle(mcp_conn *c, const char *data, size_t len) {
  json_error_t je;
  json_t *msg = json_loadb(data, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
  if (!msg) {
    char m[256];
    snprintf(m, sizeof m, "parse error: %s", je.text);
    return mcp_conn_send_error(c, NULL, -32700, m);
  }
  json_t *id = json_object_get(msg, "id");
  const char *method = json_string_value(json_object_get(msg, "method"));
  const char *ver = json_string_value(json_object_get(msg, "jsonrpc"));
  bool id_ok = !id || json_is_string(id) || json_is_integer(id);
  if (!json_is_object(msg) || !ver || strcmp(ver, "2.0") || !id_ok) {
    mcp_conn_send_error(c, id_ok ? id : NULL, -32600,
                        json_is_array(msg) ? "batches are not supported" : "invalid JSON-RPC 2.0 request");
    json_decref(msg);
    return;
  }
  if (!method) { /* a response to us: we send no requests, ignore */
    if (!json_object_get(msg, "result") && !json_object_get(msg, "error"))
      mcp_conn_send_error(c, id, -32600, "a request needs a method");
    json_decref(msg);
    return;
  }
  json_t *params = json_object_get(msg, "params");
  if (params && !json_is_object(params)) {
    if (id) mcp_conn_send_error(c, id, -32602, "params must be an object");
    json_decref(msg);
    return;
  }
  json_t *empty = json_object();
  request r = {.c = c, .id = id, .params = params ? params : empty, .log_level = c->log_level};
  c->refs++;
  if (!id) { /* notifications */
    if (!strcmp(method, "notifications/cancelled")) do_cancelled(c, params);
    else if (!strcmp(method, "notifications/sbx/hello")) do_hello(c, r.params);
    /* notifications/initialized and unknown notifications need nothing */
    goto out;
  }
  r.modern = json_object_get(json_object_get(r.params, "_meta"), META_VERSION) || !strcmp(method, "server/discover");
  if (r.modern && !check_modern(&r, method)) goto out;
  if (!strcmp(method, "initialize")) {
    if (r.modern) mcp_conn_send_error(c, id, -32601, "initialize is not part of protocol " MODERN_VERSION);
    else do_initialize(&r);
  } else if (!strcmp(method, "server/discover")) {
    do_discover(&r);
  } else if (!strcmp(method, "ping")) {
    send_result(c, id, r.modern, json_object());
  } else if (!strcmp(method, "tools/list")) {
    do_tools_list(&r);
  } else if (!strcmp(method, "tools/call")) {
    do_tools_call(&r);
  } else if (!strcmp(method, "resources/list")) {
    do_resources_list(&r);
  } else if (!strcmp(method, "resources/templates/list")) {
    do_resource_templates(&r);
  } else if (!strcmp(method, "resources/read")) {
    do_resources_read(&r);
  } else if (!strcmp(method, "logging/setLevel") && !r.modern) {
    int l = log_level_index(json_string_value(json_object_get(r.params, "level")));
    if (l < 0) mcp_conn_send_error(c, id, -32602, "level must be one of debug, info, notice, warning, error, ...");
    else {
      c->log_level = l;
      send_result(c, id, false, json_object());
    }
  } else {
    char m[256];
    snprintf(m, sizeof m, "method not found: %.200s", method);
    mcp_conn_send_error(c, id, -32601, m);
  }
out:
  json_decref(empty);
  json_decref(msg);
  conn_unref(c);
}

mcp_conn *mcp_conn_new(uv_loop_t *loop, mcp_send_fn send, void *ud) {
  mcp_conn *c = calloc(1, sizeof *c);
  c->loop = loop;
  c->send = send;
  c->ud = ud;
  c->refs = 1;
  c->stdin_fd = -1;
  c->log_level = log_level_index("warning"); /* until the client says otherwise */
  c->next_live = live;
  live = c;
  snprintf(c->default_sandbox, sizeof c->default_sandbox, "default");
  return c;
}

void mcp_conn_set_default_sandbox(mcp_conn *c, const char *id) {
  snprintf(c->default_sandbox, sizeof c->default_sandbox, "%s", id);
}

void mcp_conn_set_stdin(mcp_conn *c, int fd) {
  if (c->stdin_fd >= 0) close(c->stdin_fd);
  c->stdin_fd = fd;
}

int mcp_conn_take_stdin(mcp_conn *c) {
  int fd = c->stdin_fd;
  c->stdin_fd = -1;
  return fd;
}

void mcp_conn_close(mcp_conn *c) {
  c->closed = true;
  /* a client that disconnects mid-call has its work cancelled */
  for (mcp_call *call = c->calls, *next; call; call = next) {
    next = call->next;
    call_cancel(call);
  }
  conn_unref(c);
}
