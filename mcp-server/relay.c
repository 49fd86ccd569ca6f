/* `sbx mcp`: what an agent starts. It connects to the daemon (starting it
 * when needed), names this connection's default sandbox, and relays MCP
 * messages both ways, one per line. Nothing but MCP goes to stdout.
 *
 * It outlives the daemon: when the daemon goes away (stopped, upgraded,
 * crashed), every request in flight gets a clear error at once, and the
 * next message from the agent connects again (starting a daemon if none
 * runs) after replaying the agent's initialize and log level, so the agent
 * keeps its tools. When stdin closes, requests in flight are still
 * answered before it exits. */
#define _GNU_SOURCE
#include "control.h"
#include "framing.h"
#include "mcp.h"
#include "server.h"
#include "../sandbox-core/util.h"

#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>

#define REPLAY_ID "sbx-relay-replay"

typedef struct inflight {
  json_t *id;
  char method[64];
  bool modern;
  struct inflight *next;
} inflight;

static struct {
  sbx_paths paths;
  const char *sandbox, *tools;
  bool read_only;
  int fd; /* the daemon, or -1 */
  mcp_framer from_agent, from_daemon;
  inflight *pending;
  json_t *initialize; /* the agent's initialize request, replayed on reconnect */
  json_t *set_level;  /* its last logging/setLevel */
  bool stdin_open;
} r;

static int write_line(int fd, const char *s, size_t n) {
  int e = sbx_write_all(fd, s, n);
  return e < 0 ? e : sbx_write_all(fd, "\n", 1);
}

static void send_agent(json_t *msg) {
  char *s = json_dumps(msg, JSON_COMPACT);
  json_decref(msg);
  if (s && write_line(1, s, strlen(s)) < 0) exit(0); /* the agent is gone */
  free(s);
}

static void forget(json_t *id) {
  for (inflight **pp = &r.pending; *pp; pp = &(*pp)->next)
    if (json_equal((*pp)->id, id)) {
      inflight *f = *pp;
      *pp = f->next;
      json_decref(f->id);
      free(f);
      return;
    }
}

/* The answer to a request the daemon can no longer give: a tool error for
 * tools/call (agents read those), a JSON-RPC error for anything else. */
static void fail_request(inflight *f, const char *why) {
  if (!strcmp(f->method, "tools/call")) {
    json_t *res = json_pack("{s:[{s:s, s:s}], s:{s:{s:s, s:s}}, s:b}", "content", "type", "text", "text", why,
                            "structuredContent", "error", "code", "INTERNAL", "message", why, "isError", 1);
    if (f->modern) json_object_set_new(res, "resultType", json_string("complete"));
    send_agent(json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", f->id, "result", res));
  } else {
    send_agent(json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", f->id, "error", "code", -32603, "message",
                         why));
  }
}

static void fail_all(const char *why) {
  while (r.pending) {
    inflight *f = r.pending;
    r.pending = f->next;
    fail_request(f, why);
    json_decref(f->id);
    free(f);
  }
}

static void disconnect(void) {
  if (r.fd >= 0) close(r.fd);
  r.fd = -1;
  mcp_framer_free(&r.from_daemon);
  mcp_framer_init(&r.from_daemon, MCP_MAX_MESSAGE);
}

static int send_daemon_json(json_t *msg) {
  char *s = json_dumps(msg, JSON_COMPACT);
  json_decref(msg);
  int e = s ? write_line(r.fd, s, strlen(s)) : -ENOMEM;
  free(s);
  return e;
}

static int connect_daemon(char *err, size_t errlen) {
  r.fd = sbx_connect(&r.paths, true, err, errlen);
  if (r.fd < 0) return -1;
  char id[64];
  int e = send_daemon_json(sbx_hello(r.sandbox, r.tools, r.read_only, id));
  /* what this agent told the daemon before: said again, answers dropped */
  if (e == 0 && r.initialize) {
    json_t *m = json_deep_copy(r.initialize);
    json_object_set_new(m, "id", json_string(REPLAY_ID));
    e = send_daemon_json(m);
    if (e == 0) e = send_daemon_json(json_pack("{s:s, s:s}", "jsonrpc", "2.0", "method", "notifications/initialized"));
  }
  if (e == 0 && r.set_level) {
    json_t *m = json_deep_copy(r.set_level);
    json_object_set_new(m, "id", json_string(REPLAY_ID));
    e = send_daemon_json(m);
  }
  if (e < 0) {
    snprintf(err, errlen, "writing to the daemon: %s", strerror(-e));
    disconnect();
    return -1;
  }
  return 0;
}

static bool from_agent(void *ud, const char *msg, size_t len) {
  (void)ud;
  if (!msg) { /* too large to frame: answered here, by its id when it has one */
    json_t *id = mcp_peek_id(r.from_agent.head, r.from_agent.head_len);
    send_agent(json_pack("{s:s, s:o, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", id ? id : json_null(), "error", "code",
                         MCP_OVERSIZE_CODE, "message", MCP_OVERSIZE_MESSAGE));
    return true;
  }
  json_t *m = json_loadb(msg, len, 0, NULL);
  json_t *id = json_object_get(m, "id");
  const char *method = json_string_value(json_object_get(m, "method"));
  inflight *f = NULL;
  if (method && id && (json_is_string(id) || json_is_integer(id))) {
    f = calloc(1, sizeof *f);
    f->id = json_incref(id);
    snprintf(f->method, sizeof f->method, "%s", method);
    json_t *meta = json_object_get(json_object_get(m, "params"), "_meta");
    f->modern = json_object_get(meta, "io.modelcontextprotocol/protocolVersion") != NULL;
    f->next = r.pending;
    r.pending = f;
    if (!strcmp(method, "initialize")) {
      json_decref(r.initialize);
      r.initialize = json_incref(m);
    } else if (!strcmp(method, "logging/setLevel")) {
      json_decref(r.set_level);
      r.set_level = json_incref(m);
    }
  }
  json_decref(m);
  char err[700] = "";
  if (r.fd < 0 && connect_daemon(err, sizeof err) < 0) {
    char why[900];
    snprintf(why, sizeof why, "the sbx daemon is not running and could not be started: %s", err);
    fail_all(why);
    return true;
  }
  if (write_line(r.fd, msg, len) < 0) {
    disconnect();
    fail_all("the sbx daemon went away before it took this request; send it again");
  }
  return true;
}

static bool from_daemon(void *ud, const char *msg, size_t len) {
  (void)ud;
  if (!msg) return true; /* the daemon never sends more than a message may hold */
  json_t *m = json_loadb(msg, len, 0, NULL);
  json_t *id = json_object_get(m, "id");
  bool response = m && id && !json_object_get(m, "method");
  if (response && json_is_string(id) && !strcmp(json_string_value(id), REPLAY_ID)) {
    json_decref(m);
    return true;
  }
  if (response) forget(id);
  json_decref(m);
  if (write_line(1, msg, len) < 0) exit(0);
  return true;
}

int sbx_relay_main(const char *default_sandbox, const char *tools_csv, bool read_only) {
  signal(SIGPIPE, SIG_IGN);
  char err[700];
  if (sbx_paths_init(&r.paths, err, sizeof err) < 0) {
    fprintf(stderr, "sbx mcp: %s\n", err);
    return 1;
  }
  if (tools_csv && (mcp_catalog_init(err, sizeof err) < 0 || mcp_catalog_check_names(tools_csv, err, sizeof err) < 0)) {
    fprintf(stderr, "sbx mcp: --tools: %s\n", err);
    return 2;
  }
  r.sandbox = default_sandbox;
  r.tools = tools_csv;
  r.read_only = read_only;
  r.fd = -1;
  r.stdin_open = true;
  mcp_framer_init(&r.from_agent, MCP_MAX_MESSAGE);
  mcp_framer_init(&r.from_daemon, MCP_MAX_MESSAGE);
  /* connect at once: a daemon that cannot start is reported before the
   * agent's first message */
  if (connect_daemon(err, sizeof err) < 0) {
    fprintf(stderr, "sbx mcp: %s\n", err);
    return 1;
  }
  static char buf[1 << 16];
  for (;;) {
    if (!r.stdin_open && !r.pending) return 0;
    struct pollfd pf[2] = {{.fd = r.stdin_open ? 0 : -1, .events = POLLIN}, {.fd = r.fd, .events = POLLIN}};
    if (poll(pf, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (pf[1].revents) {
      ssize_t k = read(r.fd, buf, sizeof buf);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        disconnect();
        /* a daemon that still listens dropped this connection: it does
         * that to a client that leaves 256 MiB of replies unread (here:
         * an agent that does not read this process's stdout) */
        bool dropped = sbx_daemon_listening(&r.paths);
        fprintf(stderr, "sbx mcp: %s\n",
                dropped ? "the daemon dropped this connection (256 MiB of replies were waiting for the agent to read "
                          "them); the next request reconnects"
                        : "the daemon closed the connection; the next request starts it again");
        fail_all(dropped ? "the sbx daemon dropped this connection while this request was running, because 256 MiB of "
                           "replies were waiting for the agent to read them (its effect is unknown); the next request "
                           "reconnects: check the state and send it again"
                         : "the sbx daemon stopped while this request was running (its effect is unknown); "
                           "the next request reconnects: check the state and send it again");
      } else {
        mcp_framer_feed(&r.from_daemon, buf, k, from_daemon, NULL);
      }
    }
    if (pf[0].revents) {
      ssize_t k = read(0, buf, sizeof buf);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) { /* the agent closed stdin: answer what is in flight, then go */
        r.stdin_open = false;
        if (r.fd < 0) fail_all("the sbx daemon is gone");
      } else {
        mcp_framer_feed(&r.from_agent, buf, k, from_agent, NULL);
      }
    }
  }
}
