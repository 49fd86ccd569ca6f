/* Streamable HTTP transport: `sbx daemon --http ADDR:PORT` serves MCP at
 * /mcp. A POST carries one JSON-RPC message; a request is answered with
 * application/json, or with text/event-stream when the client accepts it and
 * the call streams progress. Every request needs `Authorization: Bearer`
 * with the token from $SBX_STATE_DIR/http-token (mode 0600). Loopback only
 * unless told otherwise; a browser Origin that is not loopback is refused. */
#define _GNU_SOURCE
#include "http.h"
#include "../sandbox-core/httpparse.h"
#include "mcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>

#define MAX_HEADERS (64 * 1024)
#define MAX_BACKLOG (16u * 1024 * 1024) /* unread reply bytes per client */
/* Connections at once (each has at most one call in progress). A new one
 * past it takes the place of the oldest that has no call in progress,
 * one that never sent the token first. */
#define MAX_CONNS 256
/* A request's head must come whole within HEAD_MS of the connection or of
 * the answer before (an idle keep-alive connection goes then), its body
 * within BODY_MS of its head: nobody may hold a connection open without
 * using it. The head is checked (Host, Origin, token) before any of the
 * body is read: without the token, nothing is buffered but a head. */
#define HEAD_MS (30 * 1000)
#define BODY_MS (60 * 1000)

typedef struct hconn {
  uv_tcp_t tcp;
  uv_timer_t timer; /* HEAD_MS or BODY_MS */
  int handles;      /* still to close */
  sbx_buf in;
  bool closing;
  bool head_ok; /* the head of the request whose body is coming passed its checks */
  bool trusted; /* a head of it passed them once (it has the token) */
  /* the request being answered */
  bool busy, sse, keep_alive;
  json_t *want_id; /* the response that ends this request */
  mcp_conn *mcp;
  struct hconn *prev, *next; /* oldest first */
} hconn;

static struct {
  uv_tcp_t server;
  char token[65];
  bool listening;
  bool loopback; /* listening on loopback: Host and Origin must name it */
  int port;
  char host[128]; /* the listen address as a Host header writes it */
  int conns;
  hconn *first, *last; /* open connections, oldest first */
} h;

static void hconn_closed(uv_handle_t *hd) {
  hconn *c = hd->data;
  if (--c->handles > 0) return;
  if (c->mcp) mcp_conn_close(c->mcp); /* a client gone mid-call cancels its work (here, not inside a send) */
  c->mcp = NULL;
  sbx_buf_free(&c->in);
  json_decref(c->want_id);
  free(c);
}

static void hconn_close(hconn *c) {
  if (c->closing) return;
  c->closing = true;
  *(c->prev ? &c->prev->next : &h.first) = c->next;
  *(c->next ? &c->next->prev : &h.last) = c->prev;
  h.conns--;
  uv_close((uv_handle_t *)&c->timer, hconn_closed);
  uv_close((uv_handle_t *)&c->tcp, hconn_closed);
}

static void timed_out(uv_timer_t *t) { hconn_close(t->data); }

/* Waiting for a head (HEAD_MS) or for the rest of a body (BODY_MS); no
 * limit while a call is in progress. */
static void arm(hconn *c, uint64_t ms) {
  if (!c->closing) uv_timer_start(&c->timer, timed_out, ms, 0);
}

static void write_done(uv_write_t *req, int status) {
  (void)status;
  free(req->data);
  free(req);
}

static void send_bytes(hconn *c, const char *data, size_t len) {
  if (c->closing) return;
  /* a client that stops reading is dropped (its calls are cancelled)
   * rather than buffered for without end */
  if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) > MAX_BACKLOG) {
    fprintf(stderr, "sbx daemon: dropping an HTTP client that does not read its replies\n");
    hconn_close(c);
    return;
  }
  uv_write_t *req = malloc(sizeof *req);
  char *copy = malloc(len ? len : 1);
  if (!req || !copy) {
    free(req);
    free(copy);
    return;
  }
  memcpy(copy, data, len);
  req->data = copy;
  uv_buf_t b = uv_buf_init(copy, len);
  if (uv_write(req, (uv_stream_t *)&c->tcp, &b, 1, write_done) < 0) {
    free(copy);
    free(req);
  }
}

static void shutdown_done(uv_shutdown_t *req, int status) {
  (void)status;
  hconn *c = req->data;
  free(req);
  hconn_close(c);
}

/* Ends the connection after what was written has gone out. */
static void finish_close(hconn *c) {
  uv_shutdown_t *req = malloc(sizeof *req);
  req->data = c;
  if (!req || uv_shutdown(req, (uv_stream_t *)&c->tcp, shutdown_done) < 0) {
    free(req);
    hconn_close(c);
  }
}

static void respond(hconn *c, int status, const char *reason, const char *ctype, const char *extra, const char *body,
                    size_t len) {
  char head[1024];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 %d %s\r\nContent-Length: %zu\r\n%s%s%s%sCache-Control: no-store\r\nConnection: %s\r\n\r\n",
                   status, reason, len, ctype ? "Content-Type: " : "", ctype ? ctype : "", ctype ? "\r\n" : "",
                   extra ? extra : "", c->keep_alive ? "keep-alive" : "close");
  sbx_buf out = {0};
  sbx_buf_append(&out, head, n);
  sbx_buf_append(&out, body, len);
  send_bytes(c, out.data, out.len);
  sbx_buf_free(&out);
  c->busy = false;
  if (!c->keep_alive) finish_close(c);
  else arm(c, HEAD_MS);
}

static void respond_text(hconn *c, int status, const char *reason, const char *text) {
  respond(c, status, reason, "text/plain; charset=utf-8", status == 401 ? "WWW-Authenticate: Bearer\r\n" : NULL, text,
          strlen(text));
}

/* What the MCP layer sends for the request in flight. */
static void on_mcp_send(void *ud, const char *data, size_t len) {
  hconn *c = ud;
  if (c->closing || !c->busy) return;
  json_t *m = json_loadb(data, len, 0, NULL);
  bool final = m && !json_object_get(m, "method") && c->want_id && json_equal(json_object_get(m, "id"), c->want_id);
  bool parse_error = m && !json_object_get(m, "method") && json_is_null(json_object_get(m, "id"));
  json_decref(m);
  if (c->sse) {
    sbx_buf ev = {0};
    sbx_buf_append(&ev, "event: message\ndata: ", 21);
    sbx_buf_append(&ev, data, len);
    sbx_buf_append(&ev, "\n\n", 2);
    char size[32];
    int k = snprintf(size, sizeof size, "%zx\r\n", ev.len);
    send_bytes(c, size, k);
    sbx_buf_append(&ev, "\r\n", 2);
    send_bytes(c, ev.data, ev.len);
    sbx_buf_free(&ev);
    if (final) {
      send_bytes(c, "0\r\n\r\n", 5);
      c->busy = false;
      mcp_conn_close(c->mcp);
      c->mcp = NULL;
      if (!c->keep_alive) finish_close(c);
      else arm(c, HEAD_MS);
    }
    return;
  }
  if (final || parse_error) {
    mcp_conn *mc = c->mcp;
    c->mcp = NULL;
    respond(c, parse_error ? 400 : 200, parse_error ? "Bad Request" : "OK", "application/json", NULL, data, len);
    mcp_conn_close(mc);
  }
  /* JSON mode: notifications (progress, logs) have nowhere to go */
}

static const char *header(const char *headers, const char *name, size_t *len) {
  return sbx_http_header(headers, NULL, name, len);
}

static bool header_has(const char *headers, const char *name, const char *word) {
  size_t len;
  const char *v = header(headers, name, &len);
  return v && memmem(v, len, word, strlen(word));
}

static bool token_ok(const char *headers) {
  size_t len;
  const char *v = header(headers, "Authorization", &len);
  if (!v || len < 7 || strncasecmp(v, "Bearer ", 7)) return false;
  v += 7;
  len -= 7;
  size_t tl = strlen(h.token);
  unsigned char diff = len != tl;
  for (size_t i = 0; i < tl; i++) diff |= (unsigned char)(i < len ? v[i] : 0) ^ (unsigned char)h.token[i];
  return diff == 0;
}

/* Whether `v` (len bytes) is exactly one of the names this server answers
 * to, with its port: the listen address, or localhost. */
static bool names_us(const char *v, size_t len) {
  char want[200];
  const char *names[] = {h.host, "localhost"};
  for (size_t i = 0; i < SBX_ARRAY_SIZE(names); i++) {
    int n = snprintf(want, sizeof want, "%s:%d", names[i], h.port);
    if ((size_t)n == len && !strncasecmp(v, want, len)) return true;
  }
  return false;
}

/* A page from elsewhere must not drive the daemon: its Origin must be
 * exactly ours (scheme, host and port), and on loopback the Host header
 * must name us too, or a DNS name rebound to 127.0.0.1 would pass. */
static bool origin_ok(const char *headers) {
  size_t len;
  const char *v = header(headers, "Origin", &len);
  if (v) {
    if (len < 7 || strncasecmp(v, "http://", 7) || !names_us(v + 7, len - 7)) return false;
  }
  if (!h.loopback) return true;
  v = header(headers, "Host", &len);
  return v && names_us(v, len);
}

/* A head's checks, before any of its body is read; false: answered (and
 * the connection ends after the answer). */
static bool head_allowed(hconn *c, const char *path, const char *headers) {
  c->keep_alive = false;
  if (strcmp(path, "/mcp") && strncmp(path, "/mcp?", 5)) respond_text(c, 404, "Not Found", "not found\n");
  else if (!origin_ok(headers)) respond_text(c, 403, "Forbidden", "Origin or Host not allowed\n");
  else if (!token_ok(headers)) respond_text(c, 401, "Unauthorized", "a bearer token is required\n");
  else c->keep_alive = true;
  return c->keep_alive;
}

static void handle_request(hconn *c, const char *method, const char *headers, const char *body, size_t blen) {
  c->keep_alive = !header_has(headers, "Connection", "close");
  if (!strcmp(method, "GET") || !strcmp(method, "DELETE"))
    return respond(c, 405, "Method Not Allowed", NULL, "Allow: POST\r\n", "", 0);
  if (strcmp(method, "POST")) return respond(c, 405, "Method Not Allowed", NULL, "Allow: POST\r\n", "", 0);
  uv_timer_stop(&c->timer); /* a call may take as long as it takes */
  json_t *msg = json_loadb(body, blen, 0, NULL);
  json_t *id = json_object_get(msg, "id");
  bool request = json_is_object(msg) && json_object_get(msg, "method") && id;
  c->busy = true;
  c->mcp = mcp_conn_new(uv_default_loop(), on_mcp_send, c);
  size_t hl;
  const char *sb = header(headers, "Mcp-Sandbox-Id", &hl);
  if (sb && hl < 64) {
    char idb[64];
    snprintf(idb, sizeof idb, "%.*s", (int)hl, sb);
    if (sbx_valid_id(idb)) mcp_conn_set_default_sandbox(c->mcp, idb);
  }
  if (!request && msg) { /* a notification or a response: accepted, nothing to say */
    mcp_conn_handle(c->mcp, body, blen);
    json_decref(msg);
    mcp_conn *mc = c->mcp;
    c->mcp = NULL;
    mcp_conn_close(mc);
    if (c->busy) respond(c, 202, "Accepted", NULL, NULL, "", 0);
    return;
  }
  json_decref(c->want_id);
  c->want_id = request ? json_incref(id) : NULL;
  bool progress = json_object_get(json_object_get(json_object_get(msg, "params"), "_meta"), "progressToken") != NULL;
  c->sse = request && progress && header_has(headers, "Accept", "text/event-stream");
  if (c->sse) {
    const char *head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-store\r\n"
                       "Transfer-Encoding: chunked\r\n";
    send_bytes(c, head, strlen(head));
    send_bytes(c, c->keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n",
               c->keep_alive ? 26 : 19);
  }
  json_decref(msg);
  mcp_conn_handle(c->mcp, body, blen);
}

/* Parses as many whole requests as the buffer holds. */
static void process(hconn *c) {
  while (!c->closing && !c->busy && c->in.len) {
    char *end = memmem(c->in.data, c->in.len, "\r\n\r\n", 4);
    if (!end) {
      if (c->in.len > MAX_HEADERS) {
        c->keep_alive = false;
        respond_text(c, 431, "Request Header Fields Too Large", "headers too large\n");
      }
      return;
    }
    sbx_http_head hd;
    if (sbx_http_parse_head(c->in.data, c->in.len, &hd) < 0) {
      c->keep_alive = false;
      return respond_text(c, 400, "Bad Request", "malformed request line\n");
    }
    size_t head_len = hd.len;
    char *headers = strndup(c->in.data, head_len);
    const char *method = hd.method, *path = hd.path;
    char *hdrs = headers + (hd.headers - c->in.data);
    size_t cl_len;
    const char *cl = header(hdrs, "Content-Length", &cl_len);
    if (header(hdrs, "Transfer-Encoding", &cl_len)) {
      free(headers);
      c->keep_alive = false;
      return respond_text(c, 501, "Not Implemented", "send a Content-Length body\n");
    }
    if (!c->head_ok && !head_allowed(c, path, hdrs)) {
      free(headers);
      c->in.len = 0; /* nothing more of it is read */
      uv_read_stop((uv_stream_t *)&c->tcp);
      return;
    }
    if (!c->head_ok) arm(c, BODY_MS); /* the body has its own time from here */
    c->head_ok = c->trusted = true;
    unsigned long long blen = cl ? strtoull(cl, NULL, 10) : 0;
    if (blen > MCP_MAX_MESSAGE) {
      free(headers);
      c->keep_alive = false;
      return respond_text(c, 413, "Content Too Large", "a message may be at most 64 MiB\n");
    }
    if (c->in.len < head_len + blen) {
      free(headers);
      return; /* the rest of the body is on its way */
    }
    char *body = c->in.data + head_len;
    c->head_ok = false;
    handle_request(c, method, hdrs, body, blen);
    free(headers);
    size_t used = head_len + blen;
    memmove(c->in.data, c->in.data + used, c->in.len - used);
    c->in.len -= used;
  }
}

static void alloc_cb(uv_handle_t *hd, size_t suggested, uv_buf_t *b) {
  (void)hd;
  (void)suggested;
  b->base = malloc(65536);
  b->len = b->base ? 65536 : 0;
}

static void read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  hconn *c = s->data;
  if (n < 0) {
    free(b->base);
    hconn_close(c);
    return;
  }
  if (c->in.len + n > MCP_MAX_MESSAGE + MAX_HEADERS) {
    free(b->base);
    c->keep_alive = false;
    respond_text(c, 413, "Content Too Large", "too large\n");
    return;
  }
  sbx_buf_append(&c->in, b->base, n);
  free(b->base);
  process(c);
}

static void on_connection(uv_stream_t *server, int status) {
  if (status < 0) return;
  hconn *c = calloc(1, sizeof *c);
  if (!c) return;
  uv_tcp_init(uv_default_loop(), &c->tcp);
  uv_timer_init(uv_default_loop(), &c->timer);
  c->tcp.data = c->timer.data = c;
  c->handles = 2;
  c->prev = h.last;
  *(h.last ? &h.last->next : &h.first) = c;
  h.last = c;
  h.conns++;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0) {
    hconn_close(c);
    return;
  }
  if (h.conns > MAX_CONNS) { /* the oldest with no call in progress goes, one without the token first */
    hconn *old = h.first;
    while (old != c && (old->busy || old->trusted)) old = old->next;
    if (old == c)
      for (old = h.first; old != c && old->busy; old = old->next) {
      }
    hconn_close(old); /* this one only if all others have a call in progress */
    if (c->closing) return;
  }
  uv_tcp_nodelay(&c->tcp, 1);
  arm(c, HEAD_MS);
  uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
}

static int load_token(const char *state_dir, char *err, size_t errlen) {
  char path[1200];
  snprintf(path, sizeof path, "%s/http-token", state_dir);
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd >= 0) {
    struct stat st;
    ssize_t n = fstat(fd, &st) == 0 && (st.st_mode & 077) == 0 && st.st_uid == geteuid()
                    ? read(fd, h.token, sizeof h.token - 1)
                    : -1;
    close(fd);
    while (n > 0 && (h.token[n - 1] == '\n' || h.token[n - 1] == ' ')) n--;
    if (n < 16) {
      snprintf(err, errlen, "%s must hold a token of at least 16 characters, owned by us, mode 0600", path);
      return -1;
    }
    h.token[n] = 0;
    return 0;
  }
  unsigned char raw[24];
  if (getrandom(raw, sizeof raw, 0) != sizeof raw) {
    snprintf(err, errlen, "getrandom: %s", strerror(errno));
    return -1;
  }
  for (size_t i = 0; i < sizeof raw; i++) snprintf(h.token + 2 * i, 3, "%02x", raw[i]);
  fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 || sbx_write_all(fd, h.token, strlen(h.token)) < 0 || sbx_write_all(fd, "\n", 1) < 0) {
    snprintf(err, errlen, "writing %s: %s", path, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  close(fd);
  return 0;
}

int sbx_http_start(const char *addr, bool allow_remote, const char *state_dir, char *err, size_t errlen) {
  char host[128];
  const char *colon = strrchr(addr, ':');
  if (!colon || colon == addr || (size_t)(colon - addr) >= sizeof host) {
    snprintf(err, errlen, "--http takes ADDRESS:PORT, e.g. 127.0.0.1:8788");
    return -1;
  }
  memcpy(host, addr, colon - addr);
  host[colon - addr] = 0;
  int port = atoi(colon + 1);
  struct sockaddr_storage ss;
  bool loopback;
  if (host[0] == '[') { /* [::1]:port */
    size_t l = strlen(host);
    if (host[l - 1] == ']') host[l - 1] = 0;
    memmove(host, host + 1, strlen(host));
    if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) < 0) goto bad;
    loopback = !strcmp(host, "::1");
  } else {
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) < 0) goto bad;
    loopback = !strncmp(host, "127.", 4);
  }
  if (!loopback && !allow_remote) {
    snprintf(err, errlen, "%s is not a loopback address (pass --http-allow-remote to serve it anyway)", host);
    return -1;
  }
  if (load_token(state_dir, err, errlen) < 0) return -1;
  h.loopback = loopback;
  h.port = port;
  snprintf(h.host, sizeof h.host, ss.ss_family == AF_INET6 ? "[%s]" : "%s", host);
  uv_tcp_init(uv_default_loop(), &h.server);
  int r = uv_tcp_bind(&h.server, (struct sockaddr *)&ss, 0);
  if (r == 0) r = uv_listen((uv_stream_t *)&h.server, 512, on_connection);
  if (r < 0) {
    snprintf(err, errlen, "listening on %s: %s", addr, uv_strerror(r));
    uv_close((uv_handle_t *)&h.server, NULL);
    return -1;
  }
  h.listening = true;
  return 0;
bad:
  snprintf(err, errlen, "bad address '%s'", addr);
  return -1;
}

bool sbx_http_address(char *out, size_t len) {
  if (!h.listening) return false;
  snprintf(out, len, "%s:%d", h.host, h.port);
  return true;
}

void sbx_http_stop(void) {
  if (h.listening) uv_close((uv_handle_t *)&h.server, NULL);
  h.listening = false;
}
