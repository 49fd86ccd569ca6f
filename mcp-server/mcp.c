#define _GNU_SOURCE
#include "mcp.h"
#include "schema.h"
#include "tools_json.h"

#include <string.h>

/* Protocol versions of the legacy (initialize) era, oldest first. */
static const char *const versions[] = {"2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"};

static const char instructions[] =
    "sbx gives you isolated Linux sandboxes on this machine. Every tool takes an optional sandboxId "
    "(1-63 of [a-z0-9-]); without it, this connection's own sandbox is used. Tools that do work "
    "(exec, writeFile, mkdir, createSession, ...) create the sandbox on first use; tools that only look "
    "answer SANDBOX_NOT_FOUND. Work in /workspace (relative paths land there). exec runs /bin/sh -c in a "
    "session that keeps cd and exported variables; pass a progressToken to see output as it comes, and a "
    "timeout (ms) for anything that may hang. Output is capped per stream (maxOutputBytes) with the full "
    "text saved at outputPath. A sandbox idle for its sleepAfter is reset: its files are gone and the next "
    "result says reset: true.";

struct mcp_tool {
  const char *name;
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
  mcp_call *calls;
};

/* ---- catalog ----------------------------------------------------------- */

static json_t *output_schema(json_t *t) {
  json_t *props = json_deep_copy(json_object_get(t, "output"));
  if (!props) props = json_object();
  json_t *req = json_object_get(t, "outputRequired");
  json_object_set_new(props, "error",
                      json_pack("{s:s, s:{s:{s:s}, s:{s:s}}, s:[s,s]}", "type", "object", "properties", "code", "type",
                                "string", "message", "type", "string", "required", "code", "message"));
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
  char *s = json_dumps(msg, JSON_COMPACT | JSON_ENSURE_ASCII * 0);
  json_decref(msg);
  if (!s) return;
  c->send(c->ud, s, strlen(s));
  free(s);
}

static void send_result(mcp_conn *c, json_t *id, json_t *result) {
  send_json(c, json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result", result));
}

void mcp_conn_send_error(mcp_conn *c, json_t *id, int code, const char *message) {
  send_json(c, json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", id ? id : json_null(), "error", "code",
                         code, "message", message));
}

/* ---- calls ------------------------------------------------------------- */

static void conn_unref(mcp_conn *c) {
  if (--c->refs == 0) free(c);
}

static void call_free(mcp_call *call) {
  mcp_conn *c = call->conn;
  if (c) {
    mcp_call **pp = &c->calls;
    while (*pp && *pp != call) pp = &(*pp)->next;
    if (*pp) *pp = call->next;
    conn_unref(c);
  }
  json_decref(call->id);
  json_decref(call->progress_token);
  free(call);
}

uv_loop_t *mcp_call_loop(mcp_call *call) { return call->conn ? call->conn->loop : uv_default_loop(); }

void mcp_call_ok(mcp_call *call, json_t *structured, const char *text) {
  if (call->conn && !call->cancelled) {
    json_t *res = json_pack("{s:[{s:s, s:s}], s:O, s:b}", "content", "type", "text", "text", text ? text : "",
                            "structuredContent", structured, "isError", 0);
    send_result(call->conn, call->id, res);
  }
  json_decref(structured);
  call_free(call);
}

void mcp_call_fail(mcp_call *call, const sbx_error *err) {
  if (call->conn && !call->cancelled) {
    char text[600];
    snprintf(text, sizeof text, "%s: %s", err->code, err->message);
    json_t *res = json_pack("{s:[{s:s, s:s}], s:{s:{s:s, s:s}}, s:b}", "content", "type", "text", "text", text,
                            "structuredContent", "error", "code", err->code, "message", err->message, "isError", 1);
    send_result(call->conn, call->id, res);
  }
  call_free(call);
}

void mcp_call_progress(mcp_call *call, const char *stream, const char *text, size_t len) {
  if (!call->conn || call->cancelled || !call->progress_token) return;
  call->progress += (double)len;
  json_t *msg = json_pack("{s:s, s:s, s:{s:O, s:f, s:s%, s:{s:s}}}", "jsonrpc", "2.0", "method",
                          "notifications/progress", "params", "progressToken", call->progress_token, "progress",
                          call->progress, "message", text, len, "_meta", "sbx/stream", stream);
  send_json(call->conn, msg);
}

/* ---- dispatch ---------------------------------------------------------- */

static void do_initialize(mcp_conn *c, json_t *id, json_t *params) {
  const char *asked = json_string_value(json_object_get(params, "protocolVersion"));
  const char *v = versions[SBX_ARRAY_SIZE(versions) - 1];
  for (size_t i = 0; asked && i < SBX_ARRAY_SIZE(versions); i++)
    if (!strcmp(asked, versions[i])) v = versions[i];
  send_result(c, id,
              json_pack("{s:s, s:{s:{s:b}, s:{}}, s:{s:s, s:s, s:s}, s:s}", "protocolVersion", v, "capabilities",
                        "tools", "listChanged", 0, "logging", "serverInfo", "name", MCP_SERVER_NAME, "title",
                        "sbx sandboxes", "version", MCP_SERVER_VERSION, "instructions", instructions));
}

static void do_tools_call(mcp_conn *c, json_t *id, json_t *params) {
  const char *name = json_string_value(json_object_get(params, "name"));
  if (!name) return mcp_conn_send_error(c, id, -32602, "tools/call needs params.name");
  const mcp_tool *t = find_tool(name);
  if (!t) {
    char msg[256];
    snprintf(msg, sizeof msg, "unknown tool '%.200s'", name);
    return mcp_conn_send_error(c, id, -32602, msg);
  }
  json_t *args = json_object_get(params, "arguments");
  if (args && !json_is_object(args) && !json_is_null(args))
    return mcp_conn_send_error(c, id, -32602, "params.arguments must be an object");
  json_t *owned = args && json_is_object(args) ? json_incref(args) : json_object();

  mcp_call *call = calloc(1, sizeof *call);
  call->conn = c;
  c->refs++;
  call->id = json_incref(id);
  call->tool = t;
  json_t *tok = json_object_get(json_object_get(params, "_meta"), "progressToken");
  if (json_is_string(tok) || json_is_integer(tok)) call->progress_token = json_incref(tok);
  call->next = c->calls;
  c->calls = call;

  sbx_error err = {0};
  char msg[400];
  if (!mcp_schema_validate(t->input_schema, owned, msg, sizeof msg)) {
    sbx_err(&err, "VALIDATION_FAILED", "%s: %s", name, msg);
    mcp_call_fail(call, &err);
    json_decref(owned);
    return;
  }
  const char *sid = json_string_value(json_object_get(owned, "sandboxId"));
  snprintf(call->sandbox_id, sizeof call->sandbox_id, "%s", sid ? sid : c->default_sandbox);
  sbx_sandbox *sb = NULL;
  if (!t->h->own_sandbox && !t->global) {
    sb = sbx_sandbox_find(call->sandbox_id);
    if (!sb && t->creates) {
      sbx_sandbox_opts o;
      sbx_sandbox_default_opts(&o);
      if (sbx_sandbox_create(call->sandbox_id, &o, &sb, &call->sandbox_created, &err) < 0) {
        mcp_call_fail(call, &err);
        json_decref(owned);
        return;
      }
    }
    if (!sb) {
      sbx_err(&err, "SANDBOX_NOT_FOUND", "no sandbox '%s' (tools that do work create it; call createSandbox)",
              call->sandbox_id);
      mcp_call_fail(call, &err);
      json_decref(owned);
      return;
    }
    sbx_sandbox_touch(sb);
  }
  t->h->fn(call, owned, sb);
  json_decref(owned);
}

static void do_cancelled(mcp_conn *c, json_t *params) {
  json_t *rid = json_object_get(params, "requestId");
  for (mcp_call *call = c->calls; call; call = call->next)
    if (rid && json_equal(call->id, rid)) {
      call->cancelled = true;
      if (call->exec) sbx_exec_cancel(call->exec);
    }
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
  c->refs++;
  if (!id) { /* notifications */
    if (!strcmp(method, "notifications/cancelled")) do_cancelled(c, params);
    else if (!strcmp(method, "notifications/sbx/hello")) {
      const char *d = json_string_value(json_object_get(params, "defaultSandboxId"));
      if (d && sbx_valid_id(d)) mcp_conn_set_default_sandbox(c, d);
    }
    /* notifications/initialized and unknown notifications need nothing */
  } else if (!strcmp(method, "initialize")) {
    do_initialize(c, id, params);
  } else if (!strcmp(method, "ping")) {
    send_result(c, id, json_object());
  } else if (!strcmp(method, "tools/list")) {
    send_result(c, id, json_pack("{s:O}", "tools", catalog.list));
  } else if (!strcmp(method, "tools/call")) {
    do_tools_call(c, id, params ? params : json_object());
  } else if (!strcmp(method, "logging/setLevel")) {
    send_result(c, id, json_object());
  } else {
    char m[256];
    snprintf(m, sizeof m, "method not found: %.200s", method);
    mcp_conn_send_error(c, id, -32601, m);
  }
  json_decref(msg);
  conn_unref(c);
}

mcp_conn *mcp_conn_new(uv_loop_t *loop, mcp_send_fn send, void *ud) {
  mcp_conn *c = calloc(1, sizeof *c);
  c->loop = loop;
  c->send = send;
  c->ud = ud;
  c->refs = 1;
  snprintf(c->default_sandbox, sizeof c->default_sandbox, "default");
  return c;
}

void mcp_conn_set_default_sandbox(mcp_conn *c, const char *id) {
  snprintf(c->default_sandbox, sizeof c->default_sandbox, "%s", id);
}

void mcp_conn_close(mcp_conn *c) {
  c->closed = true;
  /* a client that disconnects mid-call has its work cancelled */
  for (mcp_call *call = c->calls; call; call = call->next) {
    call->cancelled = true;
    if (call->exec) sbx_exec_cancel(call->exec);
  }
  conn_unref(c);
}
