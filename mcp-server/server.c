/* `sbx daemon`: the engine on a libuv loop, speaking MCP on a unix socket
 * (mode 0600, peer uid checked), one newline-framed message per line. */
#define _GNU_SOURCE
#include "server.h"
#include "control.h"
#include "framing.h"
#include "http.h"
#include "mcp.h"
#include "offload.h"
#include "../sandbox-core/config.h"
#include "../sandbox-core/preview.h"
#include "../sandbox-core/process.h"
#include "../sandbox-core/files.h"
#include "../sandbox-core/exec.h"

#include <sys/prctl.h>
#include <sys/resource.h>
#include <poll.h>
#include <malloc.h>
#include <sys/wait.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>

#define MAX_WRITE_QUEUE (256u * 1024 * 1024) /* a client that stops reading */

typedef struct client {
  uv_pipe_t pipe;
  mcp_conn *conn;
  mcp_framer framer;
  bool closing;
  bool view; /* the FUSE view (sbx mount) or sbx cp: replies may carry fds */
  uint64_t serial;
  struct client *next;
} client;

static struct {
  uv_loop_t *loop;
  uv_pipe_t server;
  uv_signal_t sigterm, sigint;
  uv_timer_t idle;
  client *clients;
  sbx_paths paths;
  bool stopping;
} d;

static void stop_view(void);
static void log_warning(const char *msg) { fprintf(stderr, "sbx daemon: %s\n", msg); }

static void warn_sandbox(const char *id, const char *msg) {
  log_warning(msg);
  mcp_broadcast_log("warning", id, "%s", msg);
}

static void client_closed(uv_handle_t *h) {
  client *c = h->data;
  if (c->conn) mcp_conn_close(c->conn); /* here, not inside whatever was sending */
  c->conn = NULL;
  client **pp = &d.clients;
  while (*pp && *pp != c) pp = &(*pp)->next;
  if (*pp) *pp = c->next;
  mcp_framer_free(&c->framer);
  free(c);
}

static void client_close(client *c) {
  if (c->closing) return;
  c->closing = true;
  uv_close((uv_handle_t *)&c->pipe, client_closed);
}

static void write_done(uv_write_t *req, int status) {
  (void)status;
  free(req->data);
  free(req);
}

static void client_send(void *ud, const char *data, size_t len) {
  client *c = ud;
  if (c->closing) return;
  if (uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) > MAX_WRITE_QUEUE) {
    fprintf(stderr, "sbx daemon: dropping a client that does not read its replies\n");
    client_close(c);
    return;
  }
  char *buf = malloc(len + 1);
  uv_write_t *req = malloc(sizeof *req);
  if (!buf || !req) {
    free(buf);
    free(req);
    return;
  }
  memcpy(buf, data, len);
  buf[len] = '\n';
  req->data = buf;
  uv_buf_t b = uv_buf_init(buf, len + 1);
  if (uv_write(req, (uv_stream_t *)&c->pipe, &b, 1, write_done) < 0) {
    free(buf);
    free(req);
  }
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  (void)h;
  (void)suggested;
  b->base = malloc(65536);
  b->len = b->base ? 65536 : 0;
}

/* ---- the FUSE view's side channel --------------------------------------
 * `sbx mount` subscribes to the list of sandboxes and asks for the fd of a
 * sandbox's /workspace. Its messages are JSON-RPC too, but written with
 * sendmsg (an fd may ride along), never queued: the view reads at once,
 * and one that does not is dropped. */

static void client_close(client *c);

static void view_send(client *c, json_t *msg, int fd) {
  char *s = json_dumps(msg, JSON_COMPACT);
  json_decref(msg);
  if (!s) return;
  size_t n = strlen(s);
  s[n] = '\n'; /* the NUL goes: n + 1 bytes */
  uv_os_fd_t sock;
  ssize_t w = uv_fileno((uv_handle_t *)&c->pipe, &sock) == 0 ? sbx_send_fds(sock, s, n + 1, &fd, fd >= 0, MSG_DONTWAIT) : -1;
  free(s);
  if (w != (ssize_t)(n + 1)) {
    fprintf(stderr, "sbx daemon: dropping a view client that does not read\n");
    client_close(c);
  }
}

static json_t *view_entry(sbx_sandbox *sb) {
  return json_pack("{s:s, s:s}", "sandboxId", sb->id, "status", sbx_sandbox_status(sb));
}

static void view_changed(const char *id, const char *event) {
  for (client *c = d.clients; c; c = c->next)
    if (c->view && !c->closing)
      view_send(c,
                json_pack("{s:s, s:s, s:{s:s, s:s}}", "jsonrpc", "2.0", "method", "sbx/view/changed", "params",
                          "sandboxId", id, "event", event),
                -1);
}

static void view_error(client *c, json_t *id, const char *code, const char *message) {
  view_send(c, json_pack("{s:s, s:O, s:{s:i, s:s, s:{s:s}}}", "jsonrpc", "2.0", "id", id, "error", "code", -32000,
                         "message", message, "data", "code", code),
            -1);
}

static client *client_by_serial(uint64_t serial) {
  for (client *c = d.clients; c; c = c->next)
    if (c->serial == serial && !c->closing) return c;
  return NULL;
}

/* A view's or cp's request whose sandbox is starting: handled again once
 * it runs (the loop serves everyone else meanwhile), or answered with why
 * it did not start; dropped if its client went. */
typedef struct view_wait {
  uint64_t client;
  json_t *msg;
  void (*again)(client *c, json_t *msg);
  void (*error)(client *c, json_t *id, const char *code, const char *message);
} view_wait;

static void view_started(void *ud, const sbx_error *err) {
  view_wait *w = ud;
  client *c = client_by_serial(w->client);
  if (c && err) w->error(c, json_object_get(w->msg, "id"), err->code, err->message);
  else if (c) w->again(c, w->msg);
  json_decref(w->msg);
  free(w);
}

static void view_wait_start(client *c, json_t *msg, sbx_sandbox *sb, void (*again)(client *, json_t *),
                            void (*error)(client *, json_t *, const char *, const char *)) {
  view_wait *w = calloc(1, sizeof *w);
  if (!w || sbx_sandbox_when_started(sb, view_started, w) < 0) {
    free(w);
    return error(c, json_object_get(msg, "id"), "INTERNAL", "out of memory");
  }
  *w = (view_wait){.client = c->serial, .msg = json_incref(msg), .again = again, .error = error};
}

static void view_message(client *c, json_t *msg) {
  c->view = true;
  json_t *id = json_object_get(msg, "id");
  const char *method = json_string_value(json_object_get(msg, "method"));
  if (!strcmp(method, "sbx/view/touch")) { /* its files in use through the view: activity (not a wake) */
    const char *sid = json_string_value(json_object_get(json_object_get(msg, "params"), "sandboxId"));
    sbx_sandbox *sb = sid ? sbx_sandbox_find(sid) : NULL;
    if (sb && sb->state != SBX_ASLEEP) sbx_sandbox_touch(sb);
    return;
  }
  if (!id) return;
  if (!strcmp(method, "sbx/view/subscribe")) {
    json_t *list = json_array();
    for (sbx_sandbox *sb = sbx_sandbox_list(); sb; sb = sb->next) json_array_append_new(list, view_entry(sb));
    view_send(c, json_pack("{s:s, s:O, s:{s:o}}", "jsonrpc", "2.0", "id", id, "result", "sandboxes", list), -1);
    return;
  }
  if (strcmp(method, "sbx/view/open")) return view_error(c, id, "VALIDATION_FAILED", "unknown view method");
  const char *sid = json_string_value(json_object_get(json_object_get(msg, "params"), "sandboxId"));
  sbx_sandbox *sb = sid ? sbx_sandbox_find(sid) : NULL;
  if (!sb) return view_error(c, id, "SANDBOX_NOT_FOUND", "no such sandbox");
  sbx_error err = {0};
  /* a view that enters a stopped or sleeping sandbox wakes it, as a call would */
  int woken = sbx_sandbox_wake(sb, &err);
  if (woken < 0) return view_error(c, id, err.code, err.message);
  if (woken > 0) return view_wait_start(c, msg, sb, view_message, view_error);
  int fd = sbx_fs_open_dir(sb, "/workspace", &err);
  if (fd < 0) return view_error(c, id, err.code, err.message);
  view_send(c,
            json_pack("{s:s, s:O, s:{s:s, s:I, s:I, s:I}}", "jsonrpc", "2.0", "id", id, "result", "sandboxId", sb->id,
                      "uid", (json_int_t)sb->uid_base, "gid", (json_int_t)sb->uid_base, "uids",
                      (json_int_t)sbx_sandbox_uids()),
            fd);
  close(fd);
}

/* ---- sbx cp ---------------------------------------------------------------
 * `sbx cp` asks for a tar stream of a sandbox path (create) or to unpack
 * one in it (extract: PATH becomes the archive's top entry NAME, or gets it
 * inside when PATH is a directory; into: PATH is the directory to unpack
 * in). tar runs in the sandbox, as any command (its limits, its seccomp),
 * on one end of a socketpair; the other end goes to sbx cp with the reply,
 * and "sbx/cp/done" tells how tar ended. */

static const char cp_create[] = "cd -- \"$(dirname -- \"$SBX_CP_PATH\")\" && "
                                "exec tar --format=gnu -cf - -- \"$(basename -- \"$SBX_CP_PATH\")\"";
static const char cp_extract[] =
    "P=$SBX_CP_PATH; case $P in */) mkdir -p -- \"$P\" || exit 1;; esac\n"
    "if [ -d \"$P\" ]; then cd -- \"$P\" && exec tar -xpf - --no-same-owner; fi\n"
    "D=$(dirname -- \"$P\"); mkdir -p -- \"$D\" && T=$(mktemp -d -- \"$D/.sbx-cp.XXXXXX\") || exit 1\n"
    "tar -C \"$T\" -xpf - --no-same-owner && mv -T -- \"$T/$SBX_CP_NAME\" \"$P\"; rc=$?; rm -rf -- \"$T\"; exit $rc";
static const char cp_into[] = "mkdir -p -- \"$SBX_CP_PATH\" && cd -- \"$SBX_CP_PATH\" && exec tar -xpf - --no-same-owner";

typedef struct cp_job {
  uint64_t client;
  json_t *id;
} cp_job;

static void cp_done(void *ud, const sbx_exec_result *res, const sbx_error *err) {
  cp_job *j = ud;
  for (client *c = d.clients; c; c = c->next)
    if (c->serial == j->client && !c->closing) {
      json_t *m = json_pack("{s:s, s:s, s:{s:O, s:i, s:s%}}", "jsonrpc", "2.0", "method", "sbx/cp/done", "params",
                            "requestId", j->id, "exitCode", err ? 1 : res->exit_code, "stderr",
                            err ? err->message : res->err, err ? strlen(err->message) : res->err_len);
      char *text = json_dumps(m, JSON_COMPACT);
      json_decref(m);
      if (text) client_send(c, text, strlen(text));
      free(text);
    }
  json_decref(j->id);
  free(j);
}

static void cp_error(client *c, json_t *id, const char *code, const char *message) {
  char text[700];
  snprintf(text, sizeof text, "%s: %s", code, message);
  view_error(c, id, code, text);
}

static void cp_message(client *c, json_t *msg) {
  c->view = true; /* its reply carries an fd */
  json_t *id = json_object_get(msg, "id"), *params = json_object_get(msg, "params");
  if (!id) return;
  const char *sid = json_string_value(json_object_get(params, "sandboxId"));
  const char *op = json_string_value(json_object_get(params, "op"));
  const char *path = json_string_value(json_object_get(params, "path"));
  const char *name = json_string_value(json_object_get(params, "name"));
  const char *script = !op ? NULL : !strcmp(op, "create") ? cp_create : !strcmp(op, "extract") ? cp_extract
                                  : !strcmp(op, "into")     ? cp_into : NULL;
  if (!script || !path || !*path || strlen(path) > 4000 || (script == cp_extract && (!name || !*name || strchr(name, '/'))))
    return cp_error(c, id, "VALIDATION_FAILED", "sbx/cp/open takes sandboxId, op (create, extract, into), path, name");
  sbx_sandbox *sb = sid ? sbx_sandbox_find(sid) : NULL;
  sbx_error err = {0};
  if (!sb) {
    sbx_err(&err, "SANDBOX_NOT_FOUND", "no sandbox '%s'", sid ? sid : "");
    return cp_error(c, id, err.code, err.message);
  }
  int woken = sbx_sandbox_wake(sb, &err);
  if (woken < 0) return cp_error(c, id, err.code, err.message);
  if (woken > 0) return view_wait_start(c, msg, sb, cp_message, cp_error);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    return cp_error(c, id, "INTERNAL", strerror(errno));
  char abs[4200];
  snprintf(abs, sizeof abs, "%s%s", path[0] == '/' ? "" : "/workspace/", path);
  sbx_env env = {0};
  sbx_env_set(&env, "SBX_CP_PATH", abs);
  if (name) sbx_env_set(&env, "SBX_CP_NAME", name);
  cp_job *j = calloc(1, sizeof *j);
  sbx_exec_opts o = {.command = script, .env = &env, .stdio = true, .stdio_out = script == cp_create,
                     .stdio_fd = sv[0]};
  int r = j ? sbx_exec_start(d.loop, sb, &o, NULL, cp_done, j, NULL, &err) : sbx_err(&err, "INTERNAL", "out of memory");
  sbx_env_clear(&env);
  close(sv[0]);
  if (r < 0) {
    free(j);
    close(sv[1]);
    return cp_error(c, id, err.code, err.message);
  }
  j->client = c->serial;
  j->id = json_incref(id);
  view_send(c, json_pack("{s:s, s:O, s:{s:s}}", "jsonrpc", "2.0", "id", id, "result", "sandboxId", sb->id), sv[1]);
  close(sv[1]);
}

/* `sbx exec -i`: a socket whose other end is the stdin of this client's
 * next exec with _meta "sbx/stdin" (the kernel's socket buffer is the only
 * buffer: a command that does not read holds sbx exec up, not our memory). */
static void stdin_message(client *c, json_t *id) {
  c->view = true;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) return cp_error(c, id, "INTERNAL", strerror(errno));
  shutdown(sv[0], SHUT_WR); /* the command only reads */
  mcp_conn_set_stdin(c->conn, sv[0]);
  view_send(c, json_pack("{s:s, s:O, s:{}}", "jsonrpc", "2.0", "id", id, "result"), sv[1]);
  close(sv[1]);
}

/* `sbx daemon --http ADDR` while this daemon runs: serve HTTP from now on
 * (the socket is its owner's alone, as the command line is). */
static void daemon_message(client *c, json_t *msg) {
  json_t *id = json_object_get(msg, "id"), *params = json_object_get(msg, "params");
  const char *method = json_string_value(json_object_get(msg, "method"));
  const char *addr = json_string_value(json_object_get(params, "address"));
  if (!id) return;
  if (!strcmp(method, "sbx/daemon/status")) { /* for sbx doctor: what this daemon cannot do now */
    const char *problem = sbx_preview_problem();
    mcp_conn_send_result(c->conn, id, json_pack("{s:s?}", "previewProblem", problem));
    return;
  }
  if (strcmp(method, "sbx/daemon/http") || !addr) {
    mcp_conn_send_error(c->conn, id, -32601, "unknown daemon method");
    return;
  }
  char err[512], now[160];
  if (sbx_http_address(now, sizeof now)) {
    snprintf(err, sizeof err, "it serves HTTP at %s already", now);
    mcp_conn_send_error(c->conn, id, -32000, err);
    return;
  }
  if (sbx_http_start(addr, json_is_true(json_object_get(params, "allowRemote")), d.paths.state, err, sizeof err) < 0) {
    mcp_conn_send_error(c->conn, id, -32000, err);
    return;
  }
  fprintf(stderr, "sbx daemon: serving MCP over HTTP at http://%s/mcp too, as asked\n", addr);
  char url[300], token[1200];
  snprintf(url, sizeof url, "http://%s/mcp", addr);
  snprintf(token, sizeof token, "%s/http-token", d.paths.state);
  mcp_conn_send_result(c->conn, id, json_pack("{s:s, s:s}", "url", url, "tokenFile", token));
}

static bool on_message(void *ud, const char *msg, size_t len) {
  client *c = ud;
  if (c->closing) return false;
  /* the daemon's own methods (sbx/...: the view, sbx cp, sbx exec -i, sbx
   * daemon --http) are small; anything else is MCP */
  if (msg && len < 8192 && memmem(msg, len, "\"sbx/", 5)) {
    json_t *m = json_loadb(msg, len, JSON_REJECT_DUPLICATES, NULL);
    const char *method = json_string_value(json_object_get(m, "method"));
    json_t *id = json_object_get(m, "id");
    bool ours = method && !strncmp(method, "sbx/", 4);
    if (!ours) {
    } else if (!strncmp(method, "sbx/view/", 9)) {
      view_message(c, m);
    } else if (!strncmp(method, "sbx/daemon/", 11)) {
      daemon_message(c, m);
    } else if (!strcmp(method, "sbx/cp/open")) {
      cp_message(c, m);
    } else if (!strcmp(method, "sbx/stdin/open") && id) {
      stdin_message(c, id);
    } else if (id) {
      mcp_conn_send_error(c->conn, id, -32601, "unknown method");
    }
    json_decref(m);
    if (ours) return !c->closing;
  }
  if (!msg) {
    json_t *id = mcp_peek_id(c->framer.head, c->framer.head_len);
    mcp_conn_send_error(c->conn, id, MCP_OVERSIZE_CODE, MCP_OVERSIZE_MESSAGE);
    json_decref(id);
  } else mcp_conn_handle(c->conn, msg, len);
  return !c->closing;
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  client *c = s->data;
  if (n < 0) client_close(c);
  else mcp_framer_feed(&c->framer, b->base, n, on_message, c);
  free(b->base);
}

static void on_connection(uv_stream_t *server, int status) {
  if (status < 0) return;
  static uint64_t serials;
  client *c = calloc(1, sizeof *c);
  if (!c) return;
  c->serial = ++serials;
  uv_pipe_init(d.loop, &c->pipe, 0);
  c->pipe.data = c;
  if (uv_accept(server, (uv_stream_t *)&c->pipe) < 0) {
    uv_close((uv_handle_t *)&c->pipe, (uv_close_cb)free);
    return;
  }
  uv_os_fd_t fd;
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (uv_fileno((uv_handle_t *)&c->pipe, &fd) < 0 || getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 ||
      cred.uid != geteuid()) {
    uv_close((uv_handle_t *)&c->pipe, (uv_close_cb)free);
    return;
  }
  c->conn = mcp_conn_new(d.loop, client_send, c);
  mcp_framer_init(&c->framer, MCP_MAX_MESSAGE);
  c->next = d.clients;
  d.clients = c;
  uv_read_start((uv_stream_t *)&c->pipe, alloc_cb, read_cb);
}

/* The idle lifecycle: once a second, sandboxes idle past their sleepAfter
 * are reset, and clients that asked for notices are told. */
static void on_idle_tick(uv_timer_t *t) {
  (void)t;
  char ids[16][64];
  int n = sbx_sandbox_sweep_idle(ids, 16);
  for (int i = 0; i < n && i < 16; i++) {
    fprintf(stderr, "sbx daemon: sandbox %s reset after being idle\n", ids[i]);
    sbx_sandbox *sb = sbx_sandbox_find(ids[i]);
    if (sb) {
      sbx_code_reset_sandbox(sb); /* its code contexts are told as ended by it, not as unknown */
      mcp_sandbox_ended(sb);
      sbx_sandbox_save(sb); /* without its exposed ports */
    }
    mcp_broadcast_log("notice", ids[i], "sandbox %s was reset after being idle; its files are gone (bucket mounts keep theirs)", ids[i]);
  }
  /* what busy moments allocated and freed goes back to the system: the
   * daemon's RSS returns to its idle size instead of keeping its peak */
  static unsigned ticks;
  if (++ticks % 10 == 0) malloc_trim(0);
  mcp_heartbeat();
}

static void on_signal(uv_signal_t *s, int sig) {
  (void)s;
  if (d.stopping) return;
  d.stopping = true;
  fprintf(stderr, "sbx daemon: signal %d, shutting down\n", sig);
  uv_close((uv_handle_t *)&d.server, NULL);
  uv_close((uv_handle_t *)&d.idle, NULL);
  sbx_http_stop();
  sbx_preview_stop();
  stop_view();
  for (client *c = d.clients; c; c = c->next) client_close(c);
  for (sbx_sandbox *sb = sbx_sandbox_list(); sb; sb = sb->next) sbx_exec_cancel_sandbox(sb);
  mcp_offload_stop();
  uv_signal_stop(&d.sigterm);
  uv_signal_stop(&d.sigint);
  uv_close((uv_handle_t *)&d.sigterm, NULL);
  uv_close((uv_handle_t *)&d.sigint, NULL);
  sbx_engine_shutdown();
  unlink(d.paths.sock);
  unlink(d.paths.pidfile);
}

/* The FUSE view the daemon runs for the user (`--mount DIR`, or "mount"
 * in the configuration): `sbx mount -f DIR` as a child of its own. */
static pid_t view_pid;

static void start_view(const char *dir) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return;
  exe[n] = 0;
  pid_t pid = sbx_fork_child(0, NULL);
  if (pid == 0) {
    sbx_child_unblock();
    close_range(3, ~0U, 0);
    char *argv[] = {"sbx", "mount", "-f", (char *)dir, NULL};
    execv(exe, argv);
    _exit(127);
  }
  if (pid > 0) {
    view_pid = pid;
    fprintf(stderr, "sbx daemon: the FUSE view of every sandbox is at %s (pid %d)\n", dir, pid);
  }
}

static void stop_view(void) {
  if (view_pid <= 0) return;
  kill(view_pid, SIGTERM); /* it unmounts */
  int pidfd = sbx_pidfd_open(view_pid);
  struct pollfd pf = {.fd = pidfd, .events = POLLIN};
  if (pidfd >= 0 && poll(&pf, 1, 10000) <= 0) kill(view_pid, SIGKILL);
  if (pidfd >= 0) close(pidfd);
  waitpid(view_pid, NULL, 0);
  view_pid = 0;
}

int sbx_daemon_main(const char *http_addr, bool http_allow_remote, const char *mount_dir) {
  char err[512];
  prctl(PR_SET_NAME, "sbx"); /* started through /proc/self/exe (sbx removed since), it would be "exe" */
  if (sbx_paths_init(&d.paths, err, sizeof err) < 0) {
    fprintf(stderr, "sbx daemon: %s\n", err);
    return 1;
  }
  int lock = open(d.paths.lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  /* a daemon that is stopping (no longer listening, its lock held while it
   * puts its sandboxes away) is waited for, up to 30 s: a client that
   * starts one the moment the other stops must not fail */
  for (int waited = 0; lock < 0 || flock(lock, LOCK_EX | LOCK_NB) < 0; waited += 20) {
    if (lock < 0 || errno != EWOULDBLOCK || waited >= 30000 || sbx_daemon_listening(&d.paths)) {
      fprintf(stderr, "sbx daemon: another daemon holds %s\n", d.paths.lock);
      return 3;
    }
    usleep(20 * 1000);
  }
  /* whatever started us, we hear signals */
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  signal(SIGPIPE, SIG_IGN);
  static sbx_config conf;
  if (sbx_config_load(&conf, err, sizeof err) < 0) {
    fprintf(stderr, "sbx daemon: invalid configuration, not starting: %s\n", err);
    return 1;
  }
  sbx_config_set(&conf);
  if (!http_addr) http_addr = conf.http;
  if (!mount_dir) mount_dir = conf.mount;
  /* every sandbox holds a few descriptors: allow what the hard limit allows */
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  sbx_engine_config cfg = {.state_dir = d.paths.state, .runtime_dir = d.paths.runtime, .rootless = geteuid() != 0,
                           .max_sandboxes = conf.max_sandboxes, .default_limits = conf.limits, .warn = log_warning, .warn_sandbox = warn_sandbox,
                           .loop = uv_default_loop(), .on_change = view_changed};
  sbx_error e = {0};
  if (sbx_engine_init(&cfg, &e) < 0) {
    fprintf(stderr, "sbx daemon: %s\n", e.message);
    sbx_engine_shutdown();
    return 1;
  }
  if (mcp_catalog_init(err, sizeof err) < 0) {
    fprintf(stderr, "sbx daemon: tool catalog: %s\n", err);
    sbx_engine_shutdown();
    return 1;
  }
  d.loop = uv_default_loop();
  uv_pipe_init(d.loop, &d.server, 0);
  unlink(d.paths.sock); /* stale: we hold the lock */
  mode_t old = umask(077);
  int r = uv_pipe_bind(&d.server, d.paths.sock);
  umask(old);
  if (r == 0) r = uv_listen((uv_stream_t *)&d.server, 512, on_connection);
  if (r < 0) {
    fprintf(stderr, "sbx daemon: listening on %s: %s\n", d.paths.sock, uv_strerror(r));
    sbx_engine_shutdown();
    return 1;
  }
  chmod(d.paths.sock, 0600);
  if (http_addr && sbx_http_start(http_addr, http_allow_remote, d.paths.state, err, sizeof err) < 0) {
    fprintf(stderr, "sbx daemon: --http: %s\n", err);
    sbx_engine_shutdown();
    unlink(d.paths.sock);
    return 1;
  }
  if (sbx_preview_start(d.loop, conf.preview_port, d.paths.state, err, sizeof err) < 0)
    fprintf(stderr, "sbx daemon: %s; everything else works, exposePort says so\n", err); /* not fatal */
  char pid[32];
  snprintf(pid, sizeof pid, "%d\n", getpid());
  sbx_write_string_create(d.paths.pidfile, pid);
  uv_timer_init(d.loop, &d.idle);
  uv_timer_start(&d.idle, on_idle_tick, 1000, 1000);
  uv_signal_init(d.loop, &d.sigterm);
  uv_signal_init(d.loop, &d.sigint);
  uv_signal_start(&d.sigterm, on_signal, SIGTERM);
  uv_signal_start(&d.sigint, on_signal, SIGINT);
  fprintf(stderr, "sbx daemon: pid %d listening on %s%s%s (%s, cgroups %s, config %s%s, %d sandboxes on record)\n",
          getpid(), d.paths.sock, http_addr ? " and http://" : "", http_addr ? http_addr : "",
          cfg.rootless ? "rootless" : "root", sbx_cg_describe(), conf.path, conf.found ? "" : " (absent: defaults)",
          sbx_sandbox_count());
  const char *ready = getenv("SBX_READY_FD");
  if (ready) {
    int fd = atoi(ready);
    (void)!write(fd, "1", 1);
    close(fd);
    unsetenv("SBX_READY_FD");
  }
  if (mount_dir) start_view(mount_dir);
  uv_run(d.loop, UV_RUN_DEFAULT);
  uv_loop_close(d.loop);
  return 0;
}
