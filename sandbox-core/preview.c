#define _GNU_SOURCE
#include "preview.h"
#include "httpparse.h"
#include "config.h"
#include "record.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>

#define MAX_HEAD (16 * 1024)       /* a request head (431 past it) */
#define HEAD_TIMEOUT_MS 10000      /* to send it */
#define IDLE_TIMEOUT_MS (10 * 60000)
#define MAX_CONNS 4096             /* proxied connections at once */
#define MAX_CONNS_PER_SANDBOX 1024
#define HIGH_WATER (1024 * 1024)   /* bytes queued toward one side before its source pauses */
#define QUEUED_MAX (64 * 1024 * 1024) /* queued by all connections together: then the heavy ones pause */
#define LIGHT (64 * 1024) /* past QUEUED_MAX, a side with less than this queued toward it still gets more */
#define REVOKED_KEPT 1024          /* tokens that answer 410 instead of 404 */
#define RETRY_MS 5000              /* a port in use is tried again this often */

/* ---- exposures (the record) ------------------------------------------------------------ */

static struct {
  uv_loop_t *loop;
  uv_tcp_t *server;
  uv_timer_t retry;
  bool listening, stopping, retry_ready;
  int port;
  char problem[300];
  char revoked[REVOKED_KEPT][17];
  size_t nrevoked;
  char revoked_path[4096]; /* where they are kept; empty: nowhere */
  size_t appended;         /* lines appended since it was written whole */
  int conns;
  size_t queued; /* what all connections' queued writes hold */
  bool over;     /* it went past QUEUED_MAX: the heavy sources wait until it is half that */
} P = {.problem = "the preview proxy is off (previewPort 0)"};

static int try_listen(void);

const char *sbx_preview_problem(void) {
  if (!P.listening && P.port && P.loop && !P.stopping) try_listen();
  return P.listening ? NULL : P.problem;
}

static sbx_exposure *find_port(const sbx_sandbox *sb, int port) {
  for (sbx_exposure *e = sb->exposures; e; e = e->next)
    if (e->port == port) return e;
  return NULL;
}

void sbx_preview_url(const sbx_sandbox *sb, const sbx_exposure *e, char *out, size_t len) {
  snprintf(out, len, "http://%d-%s-%s.localhost:%d/", e->port, sb->id, e->token, P.port ? P.port : 8787);
}

/* The revoked tokens, last first out, also kept in the state dir (a line
 * each, appended; written anew from memory every REVOKED_KEPT) so that a
 * URL revoked before a daemon restart still answers 410 after it. */
static void remember_revoked(const char *token) {
  snprintf(P.revoked[P.nrevoked % REVOKED_KEPT], 17, "%.16s", token);
  P.nrevoked++;
}

static void save_revoked(void) {
  size_t n = P.nrevoked < REVOKED_KEPT ? P.nrevoked : REVOKED_KEPT;
  char *text = malloc(n * 17 + 1), *w = text;
  if (!text) return;
  for (size_t i = P.nrevoked - n; i < P.nrevoked; i++) w += sprintf(w, "%s\n", P.revoked[i % REVOKED_KEPT]);
  sbx_write_atomic(P.revoked_path, text, (size_t)(w - text));
  free(text);
}

static void revoke_token(const char *token) {
  remember_revoked(token);
  if (!P.revoked_path[0]) return;
  if (++P.appended >= REVOKED_KEPT) {
    P.appended = 0;
    return save_revoked();
  }
  char line[18];
  int len = snprintf(line, sizeof line, "%s\n", token);
  int fd = open(P.revoked_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  if (fd >= 0) {
    (void)!write(fd, line, (size_t)len);
    close(fd);
  }
}

static void load_revoked(const char *state_dir) {
  snprintf(P.revoked_path, sizeof P.revoked_path, "%s/preview-revoked", state_dir);
  FILE *f = fopen(P.revoked_path, "re");
  char line[64];
  while (f && fgets(line, sizeof line, f)) {
    size_t len = strcspn(line, "\n");
    if (len == 16) {
      line[len] = 0;
      remember_revoked(line);
    }
  }
  if (f) fclose(f);
  if (P.nrevoked > REVOKED_KEPT) save_revoked(); /* only the last ones count */
}

static void close_sandbox_conns(const char *id, int port);

int sbx_preview_expose(sbx_sandbox *sb, int port, const char *name, const sbx_exposure **out, sbx_error *err) {
  if (port < 1 || port > 65535) return sbx_err(err, "INVALID_PORT", "port must be 1-65535, got %d", port);
  if (find_port(sb, port))
    return sbx_err(err, "PORT_ALREADY_EXPOSED", "port %d of sandbox '%s' is exposed already (getExposedPorts)", port, sb->id);
  int n = 0;
  for (sbx_exposure *e = sb->exposures; e; e = e->next) n++;
  if (n >= SBX_MAX_EXPOSED) return sbx_err(err, "RESOURCE_LIMIT", "at most %d exposed ports per sandbox", SBX_MAX_EXPOSED);
  sbx_exposure *e = calloc(1, sizeof *e);
  unsigned char raw[16];
  if (!e || getrandom(raw, sizeof raw, 0) != sizeof raw) {
    free(e);
    return sbx_err(err, "INTERNAL", "no random token");
  }
  static const char abc[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  for (int i = 0; i < 16; i++) e->token[i] = abc[raw[i] % 36];
  e->port = port;
  snprintf(e->name, sizeof e->name, "%s", name ? name : "");
  sbx_exposure **pp = &sb->exposures;
  while (*pp) pp = &(*pp)->next;
  *pp = e;
  sbx_sandbox_save(sb);
  *out = e;
  return 0;
}

int sbx_preview_unexpose(sbx_sandbox *sb, int port, sbx_error *err) {
  for (sbx_exposure **pp = &sb->exposures; *pp; pp = &(*pp)->next)
    if ((*pp)->port == port) {
      sbx_exposure *e = *pp;
      *pp = e->next;
      revoke_token(e->token);
      free(e);
      sbx_sandbox_save(sb);
      close_sandbox_conns(sb->id, port);
      return 0;
    }
  return sbx_err(err, "PORT_NOT_EXPOSED", "port %d of sandbox '%s' is not exposed", port, sb->id);
}

typedef struct factory factory;
static void factory_kill(factory *f);
static factory *factory_of(const char *id);

void sbx_preview_revoke_sandbox(sbx_sandbox *sb) {
  factory *f = factory_of(sb->id);
  if (f) factory_kill(f); /* its old network namespace goes with it */
  while (sb->exposures) {
    sbx_exposure *e = sb->exposures;
    sb->exposures = e->next;
    revoke_token(e->token);
    free(e);
  }
  close_sandbox_conns(sb->id, 0);
}

void sbx_preview_free(sbx_sandbox *sb) {
  while (sb->exposures) {
    sbx_exposure *e = sb->exposures;
    sb->exposures = e->next;
    free(e);
  }
}

json_t *sbx_preview_to_json(const sbx_sandbox *sb) {
  json_t *a = json_array();
  for (const sbx_exposure *e = sb->exposures; e; e = e->next)
    json_array_append_new(a, json_pack("{s:i, s:s, s:s}", "port", e->port, "name", e->name, "token", e->token));
  return a;
}

int sbx_preview_from_json(sbx_sandbox *sb, json_t *a) {
  size_t i;
  json_t *o;
  json_array_foreach(a, i, o) {
    json_int_t port = json_integer_value(json_object_get(o, "port"));
    const char *tok = json_string_value(json_object_get(o, "token")), *name = json_string_value(json_object_get(o, "name"));
    if (port < 1 || port > 65535 || !tok || strlen(tok) != 16 || strspn(tok, "abcdefghijklmnopqrstuvwxyz0123456789") != 16)
      return -1;
    sbx_exposure *e = calloc(1, sizeof *e);
    if (!e) return -1;
    e->port = (int)port;
    snprintf(e->token, sizeof e->token, "%s", tok);
    snprintf(e->name, sizeof e->name, "%s", name ? name : "");
    sbx_exposure **pp = &sb->exposures;
    while (*pp) pp = &(*pp)->next;
    *pp = e;
  }
  return 0;
}

/* ---- a socket factory per sandbox ---------------------------------------------------- */

/* A child of the daemon in the sandbox's user and network namespaces (not
 * its pid namespace: nothing in the sandbox sees it) that connects to
 * 127.0.0.1:PORT there (or [::1]:PORT: a server on "localhost" may listen
 * on that alone, as Node and Vite do where localhost is ::1 first) and
 * hands the socket back. */
typedef void (*connected_cb)(void *ud, int fd, int error);
typedef struct want {
  connected_cb cb;
  void *ud;
  uint16_t port;
  bool v6;
  struct want *next;
} want;

/* Requests sent to a factory and not yet answered: fewer than a unix
 * socket's queue holds (net.unix.max_dgram_qlen, 10 by default), so that a
 * burst of connections waits its turn instead of failing on a full queue. */
#define FACTORY_INFLIGHT 8

struct factory {
  char sandbox[64];
  uint64_t incarnation;
  int sock, pidfd;
  uv_poll_t poll;
  want *wants, **tail; /* oldest first; the first `sent` were sent */
  want *unsent;
  int sent;
  bool dead;
  factory *next;
};

static factory *factories;

static void factory_child(int sock) {
  for (;;) {
    unsigned char m[3]; /* the port, and 1 for [::1] */
    ssize_t n = recv(sock, m, sizeof m, 0);
    if (n != sizeof m) _exit(0);
    uint16_t port = (uint16_t)(m[0] | m[1] << 8);
    /* the connect goes on in the daemon's loop (a dropped SYN waits a
     * second; the next connection must not wait behind it) */
    int s = sbx_loopback_connect(port, m[2]), err = s < 0 ? errno : 0;
    int32_t e = err;
    if (sbx_send_fds(sock, &e, sizeof e, &s, err ? 0 : 1, 0) < 0) _exit(0);
    if (s >= 0) close(s);
  }
}

static void factory_freed(uv_handle_t *h) { free(h->data); }

static void factory_kill(factory *f) {
  if (f->dead) return;
  f->dead = true;
  uv_poll_stop(&f->poll);
  for (want *w = f->wants, *next; w; w = next) {
    next = w->next;
    w->cb(w->ud, -1, ECONNABORTED);
    free(w);
  }
  f->wants = NULL;
  sbx_pidfd_send_signal(f->pidfd, SIGKILL);
  waitid(P_PIDFD, f->pidfd, &(siginfo_t){0}, WEXITED);
  close(f->pidfd);
  close(f->sock);
  for (factory **pp = &factories; *pp; pp = &(*pp)->next)
    if (*pp == f) {
      *pp = f->next;
      break;
    }
  uv_close((uv_handle_t *)&f->poll, factory_freed);
}

/* Sends what waits, as far as the factory takes it; false: it is gone. */
static bool factory_pump(factory *f) {
  while (!f->dead && f->unsent && f->sent < FACTORY_INFLIGHT) {
    unsigned char m[3] = {(unsigned char)f->unsent->port, (unsigned char)(f->unsent->port >> 8), f->unsent->v6};
    if (send(f->sock, m, sizeof m, MSG_NOSIGNAL | MSG_DONTWAIT) != sizeof m) {
      if (errno == EAGAIN) break; /* sent again with the next answer */
      factory_kill(f);
      return false;
    }
    f->unsent = f->unsent->next;
    f->sent++;
  }
  return !f->dead;
}

static void factory_readable(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  factory *f = h->data;
  int32_t e = 0;
  int fd = -1;
  ssize_t n = sbx_recv_fds(f->sock, &e, sizeof e, &fd, 1, NULL, MSG_DONTWAIT);
  if (n < 0 && errno == EAGAIN) return;
  if (n != sizeof e || !f->sent) {
    if (fd >= 0) close(fd);
    return factory_kill(f);
  }
  want *w = f->wants;
  f->wants = w->next;
  if (!f->wants) f->tail = &f->wants;
  f->sent--;
  w->cb(w->ud, e ? -1 : fd, e);
  free(w);
  factory_pump(f);
}

static factory *factory_of(const char *id) {
  for (factory *f = factories; f; f = f->next)
    if (!strcmp(f->sandbox, id)) return f;
  return NULL;
}

static factory *factory_for(sbx_sandbox *sb) {
  for (factory *f = factories; f; f = f->next)
    if (!strcmp(f->sandbox, sb->id)) {
      if (f->incarnation == sb->incarnation) return f;
      factory_kill(f); /* of an earlier start */
      break;
    }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0) return NULL;
  int pidfd = -1;
  pid_t pid = sbx_fork_child(0, &pidfd);
  if (pid < 0) {
    close(sv[0]);
    close(sv[1]);
    return NULL;
  }
  if (pid == 0) {
    sbx_child_unblock();
    if (setns(sb->init_pidfd, CLONE_NEWUSER | CLONE_NEWNET) < 0) _exit(2);
    int keep = fcntl(sv[1], F_DUPFD_CLOEXEC, 3);
    close_range(3, (unsigned)keep - 1, 0); /* none of the daemon's files in here */
    close_range((unsigned)keep + 1, ~0U, 0);
    factory_child(keep);
    _exit(0);
  }
  close(sv[1]);
  factory *f = calloc(1, sizeof *f);
  if (!f) {
    sbx_pidfd_send_signal(pidfd, SIGKILL);
    close(pidfd);
    close(sv[0]);
    return NULL;
  }
  snprintf(f->sandbox, sizeof f->sandbox, "%s", sb->id);
  f->incarnation = sb->incarnation;
  f->sock = sv[0];
  f->pidfd = pidfd;
  f->tail = &f->wants;
  uv_poll_init(P.loop, &f->poll, f->sock);
  f->poll.data = f;
  uv_poll_start(&f->poll, UV_READABLE, factory_readable);
  f->next = factories;
  factories = f;
  return f;
}

static int connect_in(sbx_sandbox *sb, int port, bool v6, connected_cb cb, void *ud) {
  factory *f = factory_for(sb);
  want *w = f ? calloc(1, sizeof *w) : NULL;
  if (!w) return -1;
  w->cb = cb;
  w->ud = ud;
  w->port = (uint16_t)port;
  w->v6 = v6;
  *f->tail = w;
  f->tail = &w->next;
  if (!f->unsent) f->unsent = w;
  factory_pump(f); /* a factory gone answers every want, this one too */
  return 0;
}

/* ---- the proxy ---------------------------------------------------------------------- */

/* what the client's bytes are: a head, a body, a tunnel (after a 101), the
 * wait for the server's answer to an upgrade, or nothing more */
enum { M_HEAD, M_BODY, M_TUNNEL, M_UPGRADING, M_DONE };

typedef struct pconn {
  uv_tcp_t client, upstream;
  uv_poll_t cpoll; /* the connect in progress to the port in the sandbox */
  int cfd;
  bool up_open, closing, client_eof, up_eof, waiting;
  bool v6; /* the connect in progress is to [::1] (127.0.0.1 refused it) */
  int handles;
  sbx_buf head;
  uv_timer_t timer;
  char sandbox[64];
  int port;
  size_t to_client, to_up; /* bytes queued toward each side */
  int mode;                 /* of the client's bytes: M_HEAD... */
  sbx_http_body body;       /* of the request being passed on */
  bool upgrade;             /* it switches to a tunnel once sent */
  char host[304];           /* the Host the connection was routed by */
  char ip[INET6_ADDRSTRLEN]; /* the client's, for X-Forwarded-For */
  char status[12];          /* the start of the answer to an upgrade */
  size_t status_len;
  struct pconn *next;
} pconn;

static pconn *conns;

typedef struct pchunk {
  uv_write_t req;
  pconn *c;
  bool to_client;
  size_t len;
  size_t cost; /* of the memory it holds: its buffer and itself */
  char *owned; /* a read buffer (of the pool) passed on as it is, or NULL (data follows) */
  char data[];
} pchunk;

/* A reference to c is let go: a handle closed, or a connect asked of the
 * sandbox's socket factory answered (its want holds c until then). */
static void conn_unref(pconn *c) {
  if (--c->handles) return;
  for (pconn **pp = &conns; *pp; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  sbx_buf_free(&c->head);
  P.conns--;
  free(c);
}

static void conn_freed(uv_handle_t *h) { conn_unref(h->data); }

static void cpoll_closed(uv_handle_t *h);

static void conn_close(pconn *c) {
  if (c->closing) return;
  c->closing = true;
  uv_timer_stop(&c->timer);
  uv_close((uv_handle_t *)&c->timer, conn_freed);
  uv_close((uv_handle_t *)&c->client, conn_freed);
  if (c->up_open) uv_close((uv_handle_t *)&c->upstream, conn_freed);
  if (c->cfd >= 0 && !uv_is_closing((uv_handle_t *)&c->cpoll)) {
    uv_poll_stop(&c->cpoll);
    uv_close((uv_handle_t *)&c->cpoll, cpoll_closed); /* closes the fd */
  }
}

static void close_sandbox_conns(const char *id, int port) {
  for (pconn *c = conns; c; c = c->next)
    if (!strcmp(c->sandbox, id) && (!port || c->port == port)) conn_close(c);
}

/* Read buffers, reused: fresh ones would cost a page fault per 4 KiB read
 * (malloc hands big blocks back to the system as they are freed). At most
 * POOL_KEPT idle ones are kept. */
#define READ_BUF (256 * 1024)
#define POOL_KEPT 16
static char *pool[POOL_KEPT];
static int npool;

static void buf_put(char *b) {
  if (!b) return;
  if (npool < POOL_KEPT) pool[npool++] = b;
  else free(b);
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  (void)h, (void)suggested;
  b->base = npool ? pool[--npool] : malloc(READ_BUF);
  b->len = b->base ? READ_BUF : 0;
}

static void on_idle(uv_timer_t *t) { conn_close(t->data); }

static void client_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b);
static void up_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b);
static void drain(pconn *c);
static void client_go_on(pconn *c);
static void refuse_more(pconn *c);
static void upgrade_answer(pconn *c, const char *data, size_t n);

/* Whether a side with `queued` bytes toward it may be sent more. Past
 * QUEUED_MAX only the light ones: connections whose clients read (and new
 * ones, whose heads are read and routed) go on while the ones whose
 * clients do not read wait; if all waited, a holder of one preview URL
 * could stop every sandbox's with some 64 connections that read nothing.
 * At twice QUEUED_MAX all of them wait: light sides that read nothing
 * (each takes one more read, up to READ_BUF) cannot hold more. */
static bool room(size_t queued) {
  return queued < HIGH_WATER && (!P.over || (queued < LIGHT && P.queued < 2 * QUEUED_MAX)); /* and a ceiling */
}

static void go_on(pconn *c, bool to_client);

static void written(uv_write_t *req, int status) {
  pchunk *w = (pchunk *)req;
  pconn *c = w->c;
  bool to_client = w->to_client;
  if (to_client) c->to_client -= w->cost;
  else c->to_up -= w->cost;
  P.queued -= w->cost;
  buf_put(w->owned);
  free(w);
  if (P.over && P.queued < QUEUED_MAX / 2) { /* every connection reads on */
    P.over = false;
    for (pconn *o = conns; o; o = o->next)
      if (o != c) go_on(o, true), go_on(o, false);
    if (status >= 0) go_on(c, !to_client); /* its own other side too */
  }
  if (status < 0) return conn_close(c);
  go_on(c, to_client);
}

/* Below the high water again (its own and everyone's): the side that
 * sends toward `to_client`'s side reads on. */
static void go_on(pconn *c, bool to_client) {
  if (c->closing) return;
  if (to_client && room(c->to_client) && c->up_open && !c->up_eof)
    uv_read_start((uv_stream_t *)&c->upstream, alloc_cb, up_read);
  if (!to_client && room(c->to_up)) client_go_on(c); /* pipelined requests left waiting first */
}

/* Queues data toward one side; owned (malloc'd, taken) or copied. */
static void send_buf(pconn *c, bool to_client, char *owned, const char *data, size_t len) {
  pchunk *w = malloc(sizeof *w + (owned ? 0 : len));
  if (!w) {
    buf_put(owned);
    return conn_close(c);
  }
  w->c = c;
  w->to_client = to_client;
  w->len = len;
  w->cost = (owned ? READ_BUF : len) + sizeof *w; /* a buffer passed on holds all of it */
  w->owned = owned;
  if (!owned) memcpy(w->data, data, len);
  uv_buf_t b = uv_buf_init(owned ? owned : w->data, (unsigned)len);
  uv_stream_t *s = to_client ? (uv_stream_t *)&c->client : (uv_stream_t *)&c->upstream;
  if (uv_write(&w->req, s, &b, 1, written) < 0) {
    buf_put(w->owned);
    free(w);
    return conn_close(c);
  }
  if (to_client) c->to_client += w->cost; /* what a queued write costs, not only its bytes */
  else c->to_up += w->cost;
  if ((P.queued += w->cost) >= QUEUED_MAX) P.over = true;
  if (to_client && !room(c->to_client)) uv_read_stop((uv_stream_t *)&c->upstream);
  if (!to_client && !room(c->to_up)) uv_read_stop((uv_stream_t *)&c->client);
}

static void send_to(pconn *c, bool to_client, const char *data, size_t len) { send_buf(c, to_client, NULL, data, len); }

/* A read buffer passed on: as it is when mostly full, else copied, so that
 * what is queued costs about what it holds (the high water counts bytes). */
static void send_read(pconn *c, bool to_client, char *buf, size_t len) {
  if (len >= 128 * 1024) return send_buf(c, to_client, buf, NULL, len);
  send_buf(c, to_client, NULL, buf, len);
  buf_put(buf);
}

static void answer(pconn *c, int code, const char *reason, const char *body) {
  char msg[1024];
  int n = snprintf(msg, sizeof msg,
                   "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %zu\r\n"
                   "Connection: close\r\nCache-Control: no-store\r\n\r\n%s",
                   code, reason, strlen(body), body);
  send_to(c, true, msg, (size_t)n);
  c->waiting = true; /* nothing more is read; the connection closes once it is written */
  uv_read_stop((uv_stream_t *)&c->client);
  uv_shutdown_t *sd = malloc(sizeof *sd);
  if (!sd || uv_shutdown(sd, (uv_stream_t *)&c->client, (uv_shutdown_cb)(void (*)(void))free) < 0) free(sd);
  uv_timer_start(&c->timer, on_idle, 2000, 0);
}

static void activity(pconn *c) {
  uv_timer_start(&c->timer, on_idle, IDLE_TIMEOUT_MS, 0);
  sbx_sandbox *sb = sbx_sandbox_find(c->sandbox);
  if (sb) sbx_sandbox_touch(sb); /* preview traffic keeps its sandbox awake */
}

static void half_close(pconn *c, bool client_side) {
  if (client_side) c->client_eof = true;
  else c->up_eof = true;
  if (c->client_eof && c->up_eof) return conn_close(c);
  uv_shutdown_t *sd = malloc(sizeof *sd);
  uv_stream_t *other = client_side ? (uv_stream_t *)&c->upstream : (uv_stream_t *)&c->client;
  if (!sd || uv_shutdown(sd, other, (uv_shutdown_cb)(void (*)(void))free) < 0) {
    free(sd);
    conn_close(c);
  }
}

static void up_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  pconn *c = s->data;
  if (n > 0 && !c->closing) {
    activity(c);
    char peek[12]; /* the answer passes on first, then says what comes next */
    size_t pn = c->mode == M_UPGRADING ? ((size_t)n < sizeof peek ? (size_t)n : sizeof peek) : 0;
    memcpy(peek, b->base, pn);
    send_read(c, true, b->base, (size_t)n);
    if (pn && !c->closing) upgrade_answer(c, peek, pn);
  } else {
    buf_put(b->base);
  }
  if (n < 0 && !c->closing) {
    uv_read_stop(s);
    half_close(c, false);
  }
}

/* Headers that say who a client is or how it came: only the proxy says
 * that, so a client's own are dropped (servers and their middleware trust
 * them to name the client). */
static bool client_ip_header(const char *line) {
  static const char *const names[] = {"X-Forwarded-", "Forwarded:", "X-Real-IP:", "True-Client-IP:", "X-Client-IP:"};
  for (size_t i = 0; i < SBX_ARRAY_SIZE(names); i++) {
    size_t k = 0;
    /* '_' as '-': CGI-style servers (and their HTTP_X_FORWARDED_FOR) make
     * X_Forwarded_For the same header */
    while (names[i][k] && (tolower((unsigned char)line[k]) == tolower((unsigned char)names[i][k]) ||
                           (line[k] == '_' && names[i][k] == '-')))
      k++;
    if (!names[i][k]) return true;
  }
  return false;
}

/* One Host, and an absolute-form target (GET http://host/...) naming that
 * same host: a server would route by the target, the proxy routed by Host
 * (RFC 9112, 3.2.2). *host: its value (NULL when there is none). */
static bool one_host(const sbx_http_head *h, const char *end, const char **host, size_t *hlen) {
  size_t n = 0;
  *host = NULL;
  *hlen = 0;
  sbx_http_field f;
  for (const char *l = h->headers; sbx_http_next_field(&l, end, &f);)
    if (f.name_len == 4 && !strncasecmp(f.name, "Host", 4)) {
      *host = f.value, *hlen = f.value_len;
      n++;
    }
  if (n > 1) return false;
  const char *t = h->path;
  size_t skip = !strncasecmp(t, "http://", 7) ? 7 : !strncasecmp(t, "https://", 8) ? 8 : 0;
  if (!skip) return true;
  size_t alen = strcspn(t + skip, "/?#"), vlen = *hlen;
  while (vlen && ((*host)[vlen - 1] == ' ' || (*host)[vlen - 1] == '\t')) vlen--;
  return *host && alen == vlen && !strncasecmp(t + skip, *host, vlen);
}

/* The request head passed on with who asked: the client's own
 * X-Forwarded-* lines are dropped and the proxy's set, on every request of
 * a kept-alive connection. */
static void forward_head(pconn *c, const char *p, size_t hl, const char *headers, const char *host, size_t hlen) {
  const char *end = p + hl - 2; /* the blank line */
  char out[MAX_HEAD + 640]; /* the head (at most MAX_HEAD) with the proxy's lines instead of the client's */
  size_t o = (size_t)(headers - p);
  memcpy(out, p, o);
  o += (size_t)snprintf(out + o, sizeof out - o, "X-Forwarded-Host: %.*s\r\nX-Forwarded-Proto: http\r\nX-Forwarded-For: %s\r\n",
                        hlen > 300 ? 300 : (int)hlen, host ? host : "", c->ip);
  sbx_http_field f;
  for (const char *l = headers; sbx_http_next_field(&l, end, &f);)
    if (!client_ip_header(f.line)) {
      memcpy(out + o, f.line, f.line_len);
      o += f.line_len;
    }
  memcpy(out + o, "\r\n", 2);
  send_to(c, false, out, o + 2);
}

/* A later request on the connection that cannot be passed on (another
 * Host, a broken or ambiguous head): nothing more is read from the client,
 * what the server still sends reaches it, then the connection closes. */
static void refuse_more(pconn *c) {
  c->mode = M_DONE;
  c->head.len = 0;
  uv_read_stop((uv_stream_t *)&c->client);
  half_close(c, true);
}

static void relay_start(pconn *c, int fd);
static void bad_gateway(pconn *c, int error);
static void started(void *ud, const sbx_error *err);
static void connected(void *ud, int fd, int error);

static void cpoll_closed(uv_handle_t *h) {
  pconn *c = h->data;
  int fd = c->cfd;
  c->cfd = -1;
  int err = 0;
  socklen_t l = sizeof err;
  if (c->closing || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0 || err) {
    close(fd);
    sbx_sandbox *sb = c->closing || err != ECONNREFUSED || c->v6 ? NULL : sbx_sandbox_find(c->sandbox);
    if (sb && sbx_sandbox_alive(sb)) { /* nothing on 127.0.0.1: perhaps on [::1] */
      c->v6 = true;
      c->handles++; /* held by the want, as the first */
      if (connect_in(sb, c->port, true, connected, c) == 0) return conn_freed(h);
      c->handles--;
    }
    if (!c->closing) bad_gateway(c, err ? err : errno);
  } else {
    relay_start(c, fd);
  }
  conn_freed(h); /* the poll was one of its handles */
}

static void cpoll_ready(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  uv_poll_stop(h);
  uv_close((uv_handle_t *)h, cpoll_closed);
}

static void connected(void *ud, int fd, int error) {
  pconn *c = ud;
  if (c->closing) { /* closed while it waited (its port unexposed): this was the last use of it */
    if (fd >= 0) close(fd);
    c->waiting = false;
    return conn_unref(c);
  }
  conn_unref(c); /* its handles are open: it stays */
  if (fd >= 0) { /* connecting: the loop says when it is done */
    c->cfd = fd;
    uv_poll_init(P.loop, &c->cpoll, fd);
    c->cpoll.data = c;
    c->handles++;
    uv_poll_start(&c->cpoll, UV_WRITABLE, cpoll_ready);
    uv_timer_start(&c->timer, on_idle, 5000, 0); /* a connect that does not complete: given up */
    return;
  }
  bad_gateway(c, error);
}

static void bad_gateway(pconn *c, int error) {
  c->waiting = false;
  char body[300];
  snprintf(body, sizeof body, "502: nothing answers on port %d in sandbox %s (%s); is the server running and "
                              "listening on 0.0.0.0, 127.0.0.1 or ::1?\n", c->port, c->sandbox, strerror(error));
  answer(c, 502, "Bad Gateway", body);
}

static void relay_start(pconn *c, int fd) {
  c->waiting = false;
  uv_tcp_init(P.loop, &c->upstream);
  c->upstream.data = c;
  c->handles++;
  c->up_open = true;
  if (uv_tcp_open(&c->upstream, fd) < 0) {
    close(fd);
    return conn_close(c);
  }
  activity(c);
  uv_read_start((uv_stream_t *)&c->upstream, alloc_cb, up_read);
  client_go_on(c); /* the first head, and whatever followed it */
}

static bool revoked(const char *token) {
  for (size_t i = 0; i < REVOKED_KEPT && i < P.nrevoked; i++)
    if (!strcmp(P.revoked[i], token)) return true;
  return false;
}

static bool same_token(const char *a, const char *b) {
  unsigned char d = 0; /* constant time: both are 16 characters here */
  for (int i = 0; i < 16; i++) d |= (unsigned char)(a[i] ^ b[i]);
  return d == 0;
}

/* Host: {port}-{sandbox}-{token}.localhost[:port] */
static void route(pconn *c, const char *hv, size_t hlen) {
  static const char nf[] = "404: no such preview\n";
  int port;
  char id[64], token[17];
  if (!hv || !sbx_preview_host_parse(hv, hlen, &port, id, token)) return answer(c, 404, "Not Found", nf);
  sbx_sandbox *sb = sbx_sandbox_find(id);
  sbx_exposure *e = sb ? find_port(sb, port) : NULL;
  if (!e || !same_token(e->token, token)) {
    if (revoked(token)) return answer(c, 410, "Gone", "410: this preview URL was revoked (its port unexposed, or its "
                                                           "sandbox reset or destroyed); expose the port again\n");
    return answer(c, 404, "Not Found", nf);
  }
  int here = 0;
  for (pconn *o = conns; o; o = o->next)
    if (!o->closing && !strcmp(o->sandbox, sb->id)) here++;
  if (here >= MAX_CONNS_PER_SANDBOX) return answer(c, 503, "Service Unavailable", "503: too many connections\n");
  snprintf(c->sandbox, sizeof c->sandbox, "%s", sb->id);
  snprintf(c->host, sizeof c->host, "%.*s", (int)hlen, hv);
  c->port = port;
  sbx_error err = {0};
  int woken = sbx_sandbox_wake(sb, &err);
  if (woken < 0) return answer(c, 503, "Service Unavailable", "503: the sandbox could not be started\n");
  activity(c);
  c->waiting = true;
  uv_read_stop((uv_stream_t *)&c->client); /* the rest waits for the upstream */
  c->handles++; /* held by the want until connected() (and by the wait for a start before it) */
  if (woken > 0 ? sbx_sandbox_when_started(sb, started, c) : connect_in(sb, port, false, connected, c)) {
    c->handles--;
    c->waiting = false;
    answer(c, 502, "Bad Gateway", "502: cannot reach into the sandbox\n");
  }
}

/* The sandbox a request woke runs (or did not start): on to its port. */
static void started(void *ud, const sbx_error *err) {
  pconn *c = ud;
  sbx_sandbox *sb = err || c->closing ? NULL : sbx_sandbox_find(c->sandbox);
  if (sb && connect_in(sb, c->port, false, connected, c) == 0) return; /* the want holds c now */
  c->waiting = false;
  if (c->closing) return conn_unref(c);
  conn_unref(c); /* its handles are open: it stays */
  answer(c, 503, "Service Unavailable", "503: the sandbox could not be started\n");
}

/* What the client's next bytes are once a request's head or some of its
 * body went on: more body, the wait for a 101, or the next head. */
static void next_mode(pconn *c) {
  c->mode = !sbx_http_body_done(&c->body) ? M_BODY : c->upgrade ? M_UPGRADING : M_HEAD;
}

/* The client's bytes are read request by request: each head is checked
 * (the first one routes the connection) and passed on with X-Forwarded-*,
 * each body counted through to where the next head starts. A request
 * that asks to switch protocols (WebSocket) turns the rest into a tunnel. */
static void drain(pconn *c) {
  size_t off = 0;
  while (!c->closing && !c->waiting && c->mode != M_DONE && c->mode != M_UPGRADING && room(c->to_up) &&
         off < c->head.len) {
    char *p = c->head.data + off;
    size_t len = c->head.len - off;
    if (c->mode == M_TUNNEL) {
      send_to(c, false, p, len);
      off += len;
      break;
    }
    if (c->mode == M_BODY) {
      long k = sbx_http_body_feed(&c->body, p, len);
      if (k < 0) return conn_close(c); /* the server has part of it: nothing sensible to answer */
      send_to(c, false, p, (size_t)k);
      off += (size_t)k;
      next_mode(c);
      continue;
    }
    sbx_http_head h;
    long hl = sbx_http_parse_head(p, len, &h);
    if (hl == 0 && len <= MAX_HEAD) break;
    bool later = c->up_open; /* a request after the first, on a kept-alive connection */
    if (hl == 0 || hl > MAX_HEAD) {
      if (later) return refuse_more(c);
      return answer(c, 431, "Request Header Fields Too Large", "431: the request head is over 16 KiB\n");
    }
    const char *end = p + hl - 2;
    if (hl < 0 || sbx_http_request_body(h.headers, end, &c->body, &c->upgrade) < 0) {
      if (later) return refuse_more(c);
      return answer(c, 400, "Bad Request", "400: malformed request, or its length is ambiguous\n");
    }
    const char *host;
    size_t hlen;
    if (!one_host(&h, end, &host, &hlen)) {
      if (later) return refuse_more(c);
      return answer(c, 400, "Bad Request", "400: two Host headers, or a request target naming another host\n");
    }
    if (!strcmp(h.method, "CONNECT")) { /* a preview URL is a web server, not a forward proxy */
      if (later) return refuse_more(c);
      return answer(c, 405, "Method Not Allowed", "405: CONNECT is not served here\n");
    }
    if (!later) { /* routed once; the head stays until the sandbox answers */
      route(c, host, hlen);
      break;
    }
    if (!host || hlen != strlen(c->host) || strncasecmp(host, c->host, hlen)) return refuse_more(c);
    forward_head(c, p, (size_t)hl, h.headers, host, hlen);
    off += (size_t)hl;
    next_mode(c);
  }
  if (off) {
    memmove(c->head.data, c->head.data + off, c->head.len - off);
    c->head.len -= off;
  }
  /* an upgrade asked: nothing more is read until the server says 101 */
  if (c->mode == M_UPGRADING && !c->closing) uv_read_stop((uv_stream_t *)&c->client);
}

/* The client's side goes on: what waits in c->head first, then reading
 * more while the server keeps up and nothing is awaited. */
static void client_go_on(pconn *c) {
  if (c->closing || c->client_eof) return;
  drain(c);
  if (!c->closing && !c->waiting && c->mode != M_DONE && c->mode != M_UPGRADING && room(c->to_up))
    uv_read_start((uv_stream_t *)&c->client, alloc_cb, client_read);
}

/* The start of the server's answer to an upgrade request: a 101 turns the
 * connection into a tunnel; anything else ends it once that answer is
 * through (what the client sent after would otherwise pass unchecked). */
static void upgrade_answer(pconn *c, const char *data, size_t n) {
  size_t take = sizeof c->status - c->status_len < n ? sizeof c->status - c->status_len : n;
  memcpy(c->status + c->status_len, data, take);
  c->status_len += take;
  if (c->status_len < sizeof c->status) return;
  c->status_len = 0;
  if (!memcmp(c->status, "HTTP/1.1 101", 12) || !memcmp(c->status, "HTTP/1.0 101", 12)) {
    c->mode = M_TUNNEL;
    client_go_on(c);
  } else {
    refuse_more(c);
  }
}

static void client_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  pconn *c = s->data;
  if (n > 0 && !c->closing && c->mode != M_DONE) {
    if (c->up_open) activity(c);
    if (c->up_open && !c->head.len && c->mode == M_TUNNEL) {
      send_read(c, false, b->base, (size_t)n); /* as it came: an upload or a WebSocket */
      b = NULL;
    } else if (c->up_open && !c->head.len && c->mode == M_BODY) {
      long k = sbx_http_body_feed(&c->body, b->base, (size_t)n);
      if (k < 0) {
        buf_put(b->base);
        return conn_close(c);
      }
      next_mode(c);
      sbx_buf_append(&c->head, b->base + k, (size_t)n - (size_t)k); /* the next request's */
      send_read(c, false, b->base, (size_t)k);
      b = NULL;
      drain(c);
    } else if (!c->waiting) {
      sbx_buf_append(&c->head, b->base, (size_t)n);
      drain(c);
      /* no room toward the server: nothing more is read until there is */
      if (!c->closing && !room(c->to_up)) uv_read_stop((uv_stream_t *)&c->client);
    }
  }
  if (b) buf_put(b->base);
  if (n < 0 && !c->closing) {
    uv_read_stop(s);
    if (c->up_open) half_close(c, true);
    else if (!c->waiting) conn_close(c);
  }
}

/* At the limit of connections, the oldest that has sent no request yet
 * makes room for c (an idle one holds nothing up): local programs that
 * open connections and send nothing cannot keep everyone else out. */
static bool evict_idle(pconn *c) {
  pconn *oldest = NULL;
  for (pconn *o = conns; o; o = o->next) /* newest first */
    if (o != c && !o->closing && !o->up_open && !o->waiting && o->mode == M_HEAD && !o->sandbox[0]) oldest = o;
  if (!oldest) return false;
  conn_close(oldest);
  return true;
}

static void on_conn(uv_stream_t *server, int status) {
  if (status < 0) return;
  pconn *c = calloc(1, sizeof *c);
  if (!c) return;
  c->cfd = -1;
  uv_tcp_init(P.loop, &c->client);
  c->client.data = c;
  uv_timer_init(P.loop, &c->timer);
  c->timer.data = c;
  c->handles = 2;
  P.conns++;
  c->next = conns;
  conns = c;
  if (uv_accept(server, (uv_stream_t *)&c->client) < 0) return conn_close(c);
  if (P.conns > MAX_CONNS && !evict_idle(c)) {
    snprintf(c->ip, sizeof c->ip, "127.0.0.1");
    return answer(c, 503, "Service Unavailable", "503: too many connections\n");
  }
  struct sockaddr_storage ss;
  int sl = sizeof ss;
  snprintf(c->ip, sizeof c->ip, "127.0.0.1");
  if (uv_tcp_getpeername(&c->client, (struct sockaddr *)&ss, &sl) == 0 && ss.ss_family == AF_INET)
    inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, c->ip, sizeof c->ip);
  uv_timer_start(&c->timer, on_idle, HEAD_TIMEOUT_MS, 0); /* a head that does not come in time: closed */
  uv_read_start((uv_stream_t *)&c->client, alloc_cb, client_read);
}

/* One try at listening; a failure says why in P.problem. The handle of a
 * failed try is closed and freed on its own (a new one each try). */
static int try_listen(void) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)P.port), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  uv_tcp_t *t = malloc(sizeof *t);
  int r = t ? uv_tcp_init(P.loop, t) : UV_ENOMEM;
  if (!t || r < 0) {
    free(t);
    t = NULL;
  }
  if (t && (r = uv_tcp_bind(t, (struct sockaddr *)&a, 0)) == 0) r = uv_listen((uv_stream_t *)t, 511, on_conn);
  if (r < 0) {
    snprintf(P.problem, sizeof P.problem, "the preview proxy cannot listen on 127.0.0.1:%d: %s (set previewPort or "
                                          "SBX_PREVIEW_PORT)", P.port, uv_strerror(r));
    if (t) uv_close((uv_handle_t *)t, (uv_close_cb)free);
    return -1;
  }
  P.server = t;
  P.listening = true;
  return 0;
}

/* While the port is taken (another program, another sbx daemon), it is
 * tried again now and then, and on demand (exposePort, doctor): the
 * proxy starts once the port is free, without a daemon restart. */
static void retry_tick(uv_timer_t *t) {
  if (P.listening || P.stopping || try_listen() == 0) uv_timer_stop(t);
}

int sbx_preview_start(uv_loop_t *loop, int port, const char *state_dir, char *err, size_t errlen) {
  P.loop = loop;
  P.port = port;
  if (state_dir) load_revoked(state_dir);
  if (!port) return 0;
  if (try_listen() == 0) return 0;
  snprintf(err, errlen, "%s", P.problem);
  uv_timer_init(loop, &P.retry);
  uv_unref((uv_handle_t *)&P.retry);
  P.retry_ready = true;
  uv_timer_start(&P.retry, retry_tick, RETRY_MS, RETRY_MS);
  return -1;
}

void sbx_preview_stop(void) {
  if (P.listening) uv_close((uv_handle_t *)P.server, (uv_close_cb)free);
  P.listening = false;
  P.stopping = true;
  if (P.retry_ready) uv_close((uv_handle_t *)&P.retry, NULL);
  P.retry_ready = false;
  snprintf(P.problem, sizeof P.problem, "the daemon is stopping");
  for (pconn *c = conns; c; c = c->next) conn_close(c);
  while (factories) factory_kill(factories);
}
