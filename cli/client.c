/* A small blocking MCP client of the daemon's socket, for the CLI verbs. */
#define _GNU_SOURCE
#include "client.h"

#include <poll.h>
#include <signal.h>

static int send_msg(sbx_client *c, json_t *msg) {
  char *s = json_dumps(msg, JSON_COMPACT);
  json_decref(msg);
  if (!s) return -ENOMEM;
  size_t n = strlen(s);
  s[n] = '\n';
  int r = sbx_write_all(c->fd, s, n + 1);
  free(s);
  return r;
}

/* Next message from the daemon; NULL at EOF or on error. */
static json_t *recv_msg(sbx_client *c, volatile sig_atomic_t *interrupted, bool *was_interrupted) {
  for (;;) {
    char *nl = c->in.data ? memchr(c->in.data, '\n', c->in.len) : NULL;
    if (nl) {
      size_t len = nl - c->in.data;
      json_t *m = json_loadb(c->in.data, len, 0, NULL);
      memmove(c->in.data, nl + 1, c->in.len - len - 1);
      c->in.len -= len + 1;
      if (m) return m;
      continue;
    }
    if (interrupted && *interrupted) {
      *was_interrupted = true;
      return NULL;
    }
    /* SIGINT and SIGTERM are blocked except while waiting here, so one that
     * arrives between the check above and the wait is not lost */
    sigset_t wait_mask;
    sigprocmask(SIG_SETMASK, NULL, &wait_mask);
    sigdelset(&wait_mask, SIGINT);
    sigdelset(&wait_mask, SIGTERM);
    struct pollfd pf = {.fd = c->fd, .events = POLLIN};
    int r = ppoll(&pf, 1, NULL, &wait_mask);
    if (r < 0 && errno == EINTR) {
      if (interrupted && *interrupted) {
        *was_interrupted = true;
        return NULL;
      }
      continue;
    }
    char buf[65536];
    int fd = -1, nfd = 0;
    ssize_t n = sbx_recv_fds(c->fd, buf, sizeof buf, &fd, 1, &nfd, 0);
    if (n < 0 && errno == EINTR) continue;
    if (nfd == 1) { /* a reply that carries an fd (sbx cp) */
      if (c->passed_fd >= 0) close(c->passed_fd);
      c->passed_fd = fd;
    }
    if (n <= 0) return NULL;
    sbx_buf_append(&c->in, buf, n);
  }
}

int sbx_client_open(sbx_client *c, const char *default_sandbox, char *err, size_t errlen) {
  *c = (sbx_client){.fd = -1, .next_id = 1, .passed_fd = -1};
  sbx_paths p;
  if (sbx_paths_init(&p, err, errlen) < 0) return -1;
  c->fd = sbx_connect(&p, true, err, errlen);
  if (c->fd < 0) return -1;
  send_msg(c, sbx_hello(default_sandbox, NULL, false, c->default_sandbox));
  json_t *r = sbx_client_request(c, "initialize",
                                 json_pack("{s:s, s:{}, s:{s:s, s:s}}", "protocolVersion", "2025-11-25",
                                           "capabilities", "clientInfo", "name", "sbx-cli", "version", "0.1.0"),
                                 err, errlen);
  if (!r) return -1;
  json_decref(r);
  send_msg(c, json_pack("{s:s, s:s}", "jsonrpc", "2.0", "method", "notifications/initialized"));
  return 0;
}

/* Sends a request and waits for its response, handing progress
 * notifications to `progress` meanwhile; a set *interrupted cancels it. */
static json_t *roundtrip(sbx_client *c, const char *method, json_t *params, sbx_progress_fn progress, void *ud,
                         volatile sig_atomic_t *interrupted, char *err, size_t errlen) {
  int id = c->next_id++;
  if (c->stdin_stream) {
    json_t *meta = json_object_get(params, "_meta");
    if (!meta) json_object_set_new(params, "_meta", meta = json_object());
    json_object_set_new(meta, "sbx/stdin", json_true());
    c->stdin_stream = false;
  }
  if (progress) {
    json_t *meta = json_object_get(params, "_meta");
    if (!meta) json_object_set_new(params, "_meta", meta = json_object());
    json_object_set_new(meta, "progressToken", json_integer(id));
    json_object_set_new(meta, "sbx/raw", json_true()); /* output as bytes: a terminal or a file gets them as they are */
  }
  if (send_msg(c, json_pack("{s:s, s:i, s:s, s:o}", "jsonrpc", "2.0", "id", id, "method", method, "params",
                            params)) < 0) {
    snprintf(err, errlen, "the daemon went away");
    return NULL;
  }
  for (;;) {
    bool intr = false;
    json_t *m = recv_msg(c, interrupted, &intr);
    if (intr) {
      send_msg(c, json_pack("{s:s, s:s, s:{s:i, s:s}}", "jsonrpc", "2.0", "method", "notifications/cancelled",
                            "params", "requestId", id, "reason", "interrupted"));
      snprintf(err, errlen, "interrupted");
      return NULL;
    }
    if (!m) {
      snprintf(err, errlen, "the daemon closed the connection");
      return NULL;
    }
    const char *mth = json_string_value(json_object_get(m, "method"));
    if (mth && !strcmp(mth, "notifications/progress") && progress) {
      progress(ud, json_object_get(m, "params"));
    } else if (!mth && json_integer_value(json_object_get(m, "id")) == id) {
      json_t *e = json_object_get(m, "error");
      json_t *res = e ? NULL : json_incref(json_object_get(m, "result"));
      const char *msg = e ? json_string_value(json_object_get(e, "message")) : NULL;
      if (e && msg && *msg) snprintf(err, errlen, "%s", msg);
      else if (e) snprintf(err, errlen, "error %lld", (long long)json_integer_value(json_object_get(e, "code")));
      json_decref(m);
      return res;
    }
    json_decref(m);
  }
}

json_t *sbx_client_request(sbx_client *c, const char *method, json_t *params, char *err, size_t errlen) {
  return roundtrip(c, method, params ? params : json_object(), NULL, NULL, NULL, err, errlen);
}

json_t *sbx_client_call(sbx_client *c, const char *tool, json_t *args, sbx_progress_fn progress, void *ud,
                        volatile sig_atomic_t *interrupted, char *err, size_t errlen) {
  return roundtrip(c, "tools/call", json_pack("{s:s, s:o}", "name", tool, "arguments", args), progress, ud,
                   interrupted, err, errlen);
}

json_t *sbx_client_next(sbx_client *c) {
  bool intr = false;
  return recv_msg(c, NULL, &intr);
}

void sbx_client_close(sbx_client *c) {
  if (c->fd >= 0) close(c->fd);
  if (c->passed_fd >= 0) close(c->passed_fd);
  c->passed_fd = -1;
  sbx_buf_free(&c->in);
  c->fd = -1;
}
