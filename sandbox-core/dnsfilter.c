/* The filtering resolver of a sandbox whose allowedHosts names hosts.
 *
 * A UDP socket bound to 127.0.0.1:53 inside the sandbox's network namespace
 * (made there, held by the daemon: nothing in the sandbox can take the
 * port or see the host's resolver) takes its queries. A name no pattern
 * allows is answered NXDOMAIN at once and never asked further. An allowed
 * one is asked of the host's resolver (or the configuration's dnsServer)
 * from the host's side; the A and AAAA addresses of the answer are added
 * to the sandbox's nftables allowlist, and only then does the sandbox hear
 * the answer, so its first connect is let through. Addresses in a
 * special-purpose range (private, loopback, link-local...) are not opened
 * by an answer: a name cannot lead into the host's networks (DNS
 * rebinding) unless a CIDR in allowedHosts lists them too. The egress filter
 * refuses every other DNS server, so this is the only way names resolve.
 *
 * Bounds: 2,000 queries a second per sandbox (the rest wait in, and are
 * dropped by, the socket's buffer), 64 in flight and 64 answers waiting for
 * nft (SERVFAIL past them), one nft run at a time adding what answers wait, 4,096 addresses opened by names per sandbox incarnation.
 * Addresses stay allowed until the sandbox stops (TTLs are not followed:
 * a connection must not break when a record expires). Only UDP: an answer
 * too big for it comes truncated and the TCP retry finds nothing. */
#define _GNU_SOURCE
#include "config.h"
#include "netpolicy.h"
#include "network.h"

#include <arpa/inet.h>
#include <sys/random.h>
#include <sys/wait.h>

#define PENDING_MAX 64
#define QUERY_TIMEOUT_MS 5000
#define BATCH_ADDRS 256 /* addresses one nft run adds */
#define KNOWN_MAX 4096
#define ANSWER_ADDRS 32 /* addresses taken from one answer */
#define RATE_WINDOW_MS 100
#define RATE_MAX 200 /* queries read per window (2,000/s): past it the socket is not read until the next */

typedef struct pending {
  bool used;
  uint16_t up_id, client_id, qtype;
  uint64_t at;
  struct sockaddr_in client;
  char name[256];
} pending;

struct sbx_dns;

/* An answer held back until nft has opened its addresses. */
typedef struct held {
  struct held *next;
  sbx_dns_addr addrs[ANSWER_ADDRS];
  int naddrs;
  struct sockaddr_in to;
  size_t len;
  uint8_t data[SBX_DNS_MAX];
} held;

/* The one nft run of a sandbox at a time, for a batch of answers. */
typedef struct nft_job {
  struct sbx_dns *f;
  uv_poll_t poll;
  int pidfd;
  held *batch;
} nft_job;

typedef struct sbx_dns {
  sbx_sandbox *sb; /* NULL once stopped */
  uv_udp_t in, up;
  uv_timer_t rate; /* a flood waits in the kernel's buffer, which drops the excess, not in the daemon */
  uint64_t window;
  int in_window;
  int handles;
  struct sockaddr_storage server;
  pending p[PENDING_MAX];
  sbx_dns_addr *known;
  int nknown;
  nft_job *job;             /* running, or NULL */
  held *waiting, **wait_tail; /* answers for the next run */
  int nheld;
} sbx_dns;

bool sbx_dns_filter_wanted(const sbx_sandbox *sb) {
  for (size_t i = 0; i < sb->opts.allowed_hosts.n; i++)
    if (sbx_dns_name_valid(sb->opts.allowed_hosts.v[i])) return true;
  return false;
}

static bool name_allowed(const sbx_sandbox *sb, const char *name) {
  for (size_t i = 0; i < sb->opts.allowed_hosts.n; i++) {
    const char *pat = sb->opts.allowed_hosts.v[i];
    if (sbx_dns_name_valid(pat) && sbx_dns_name_match(pat, name)) return true;
  }
  return false;
}

/* The resolver to ask: the configuration's dnsServer, else the first
 * nameserver of the host's /etc/resolv.conf. */
static int upstream(struct sockaddr_storage *ss, socklen_t *len) {
  const sbx_config *c = sbx_config_get();
  if (c && c->dns_server) return sbx_dns_server_parse(c->dns_server, ss, len);
  _cleanup_fclose_ FILE *f = fopen("/etc/resolv.conf", "re");
  char line[256], addr[128];
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, " nameserver %127s", addr) == 1 && sbx_dns_server_parse(addr, ss, len) == 0) {
      if (ss->ss_family == AF_INET6 && strchr(addr, '%')) continue; /* a scoped address: not for us */
      return 0;
    }
  return -1;
}

static void unref(sbx_dns *f) {
  if (--f->handles == 0) {
    free(f->known);
    free(f);
  }
}

static void handle_closed(uv_handle_t *h) { unref(h->data); }

static void reply_to(sbx_dns *f, const struct sockaddr_in *to, const uint8_t *m, size_t len) {
  if (!f->sb) return;
  uv_buf_t b = uv_buf_init((char *)m, (unsigned)len);
  uv_udp_try_send(&f->in, &b, 1, (const struct sockaddr *)to); /* a full buffer drops it: the client asks again */
}

static void refuse(sbx_dns *f, const struct sockaddr_in *to, const uint8_t *q, size_t len, int rcode) {
  uint8_t out[SBX_DNS_MAX];
  size_t n = sbx_dns_reply(q, len, rcode, out, sizeof out);
  if (n) reply_to(f, to, out, n);
}

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  (void)h, (void)suggested;
  static char buf[SBX_DNS_MAX]; /* one loop: a datagram is handled before the next is read */
  *b = uv_buf_init(buf, sizeof buf);
}

static void on_query(uv_udp_t *h, ssize_t n, const uv_buf_t *b, const struct sockaddr *from, unsigned flags);

static void rate_resume(uv_timer_t *t) {
  sbx_dns *f = t->data;
  if (f->sb) uv_udp_recv_start(&f->in, alloc_cb, on_query);
}

static void on_query(uv_udp_t *h, ssize_t n, const uv_buf_t *b, const struct sockaddr *from, unsigned flags) {
  sbx_dns *f = h->data;
  if (n <= 0 || !from || from->sa_family != AF_INET || (flags & UV_UDP_PARTIAL) || !f->sb) return;
  uint64_t now = uv_now(h->loop);
  if (now / RATE_WINDOW_MS != f->window) f->window = now / RATE_WINDOW_MS, f->in_window = 0;
  if (++f->in_window >= RATE_MAX) { /* this one is answered; the next wait for the next window */
    uv_udp_recv_stop(&f->in);
    uv_timer_start(&f->rate, rate_resume, RATE_WINDOW_MS - now % RATE_WINDOW_MS, 0);
  }
  const uint8_t *q = (const uint8_t *)b->base;
  const struct sockaddr_in *client = (const struct sockaddr_in *)from;
  char name[256];
  uint16_t qtype;
  if (sbx_dns_question(q, (size_t)n, name, &qtype) < 0) return refuse(f, client, q, (size_t)n, 1); /* FORMERR */
  if (!name_allowed(f->sb, name)) return refuse(f, client, q, (size_t)n, 3);                    /* NXDOMAIN */
  pending *p = NULL;
  for (int i = 0; i < PENDING_MAX && !p; i++)
    if (!f->p[i].used || now - f->p[i].at > QUERY_TIMEOUT_MS) p = &f->p[i];
  if (!p) return refuse(f, client, q, (size_t)n, 2); /* SERVFAIL: too many at once */
  uint16_t id;
  for (;;) { /* an id no other query in flight has: answers are matched by it */
    if (getrandom(&id, sizeof id, 0) != sizeof id) return refuse(f, client, q, (size_t)n, 2);
    bool taken = false;
    for (int i = 0; i < PENDING_MAX; i++) taken |= f->p[i].used && &f->p[i] != p && f->p[i].up_id == id;
    if (!taken) break;
  }
  *p = (pending){.used = true, .up_id = id, .client_id = (uint16_t)(q[0] << 8 | q[1]), .qtype = qtype, .at = now,
                 .client = *client};
  snprintf(p->name, sizeof p->name, "%s", name);
  uint8_t out[SBX_DNS_MAX];
  memcpy(out, q, (size_t)n);
  out[0] = (uint8_t)(id >> 8), out[1] = (uint8_t)id;
  uv_buf_t ob = uv_buf_init((char *)out, (unsigned)n);
  if (uv_udp_try_send(&f->up, &ob, 1, (const struct sockaddr *)&f->server) < 0) {
    p->used = false;
    refuse(f, client, q, (size_t)n, 2);
  }
}

static bool known(const sbx_dns *f, const sbx_dns_addr *a) {
  for (int i = 0; i < f->nknown; i++)
    if (f->known[i].family == a->family && !memcmp(f->known[i].addr, a->addr, a->family == AF_INET ? 4 : 16))
      return true;
  return false;
}

static void job_closed(uv_handle_t *h) {
  nft_job *j = h->data;
  sbx_dns *f = j->f;
  free(j);
  unref(f); /* the job held the filter too */
}

static void start_job(sbx_dns *f);

/* The answers of a batch go out (their addresses now reachable) or are
 * SERVFAIL (they could not be opened: no answer to use). */
static void finish_batch(sbx_dns *f, held *batch, bool ok) {
  for (held *h = batch, *next; h; h = next) {
    next = h->next;
    if (ok && f->sb) {
      for (int i = 0; i < h->naddrs && f->nknown < KNOWN_MAX; i++)
        if (!known(f, &h->addrs[i])) f->known[f->nknown++] = h->addrs[i];
      reply_to(f, &h->to, h->data, h->len);
    } else {
      refuse(f, &h->to, h->data, h->len, 2);
    }
    f->nheld--;
    free(h);
  }
}

static void job_end(nft_job *j, bool ok) {
  sbx_dns *f = j->f;
  f->job = NULL;
  finish_batch(f, j->batch, ok);
  uv_poll_stop(&j->poll);
  close(j->pidfd);
  uv_close((uv_handle_t *)&j->poll, job_closed);
  if (f->sb && f->waiting) start_job(f);
}

static void job_exited(uv_poll_t *h, int status, int events) {
  (void)status, (void)events;
  nft_job *j = h->data;
  siginfo_t si = {0};
  if (waitid(P_PIDFD, j->pidfd, &si, WEXITED | WNOHANG) < 0 || !si.si_pid) return;
  job_end(j, si.si_code == CLD_EXITED && si.si_status == 0);
}

/* One nft run adds the addresses of every answer waiting (runs at once
 * on the same set would race); their answers go out when it is done. */
static void start_job(sbx_dns *f) {
  static sbx_dns_addr addrs[BATCH_ADDRS];
  held *batch = NULL, **tail = &batch;
  int n = 0;
  while (f->waiting && n + f->waiting->naddrs <= BATCH_ADDRS) {
    held *h = f->waiting;
    f->waiting = h->next;
    h->next = NULL;
    *tail = h;
    tail = &h->next;
    memcpy(addrs + n, h->addrs, (size_t)h->naddrs * sizeof *addrs);
    n += h->naddrs;
  }
  if (!f->waiting) f->wait_tail = &f->waiting;
  nft_job *j = calloc(1, sizeof *j);
  if (j) j->pidfd = -1;
  if (!j || sbx_net_open_named(f->sb, addrs, n, &j->pidfd) < 0 || j->pidfd < 0) {
    free(j);
    return finish_batch(f, batch, false);
  }
  j->f = f;
  j->batch = batch;
  uv_poll_init(f->in.loop, &j->poll, j->pidfd);
  j->poll.data = j;
  uv_poll_start(&j->poll, UV_READABLE, job_exited);
  f->handles++;
  f->job = j;
}

static void open_then_reply(sbx_dns *f, const sbx_dns_addr *addrs, int n, const struct sockaddr_in *to,
                            const uint8_t *m, size_t len) {
  held *h = f->nheld < PENDING_MAX ? calloc(1, sizeof *h) : NULL;
  if (!h) return refuse(f, to, m, len, 2);
  memcpy(h->addrs, addrs, (size_t)n * sizeof *addrs);
  h->naddrs = n;
  h->to = *to;
  h->len = len;
  memcpy(h->data, m, len);
  f->nheld++;
  *f->wait_tail = h;
  f->wait_tail = &h->next;
  if (!f->job) start_job(f);
}

static bool same_server(const sbx_dns *f, const struct sockaddr *from) {
  if (!from || from->sa_family != f->server.ss_family) return false;
  if (from->sa_family == AF_INET) {
    const struct sockaddr_in *a = (const void *)from, *b = (const void *)&f->server;
    return a->sin_port == b->sin_port && a->sin_addr.s_addr == b->sin_addr.s_addr;
  }
  const struct sockaddr_in6 *a = (const void *)from, *b = (const void *)&f->server;
  return a->sin6_port == b->sin6_port && !memcmp(&a->sin6_addr, &b->sin6_addr, 16);
}

static void on_answer(uv_udp_t *h, ssize_t n, const uv_buf_t *b, const struct sockaddr *from, unsigned flags) {
  sbx_dns *f = h->data;
  if (n < 12 || (flags & UV_UDP_PARTIAL) || !f->sb || !same_server(f, from)) return;
  uint8_t *m = (uint8_t *)b->base;
  uint16_t id = (uint16_t)(m[0] << 8 | m[1]);
  pending *p = NULL;
  for (int i = 0; i < PENDING_MAX && !p; i++)
    if (f->p[i].used && f->p[i].up_id == id) p = &f->p[i];
  char name[256];
  uint16_t qtype;
  /* the answer to the question asked, or nothing */
  if (!p || !(m[2] & 0x80) || sbx_dns_question_of(m, (size_t)n, name, &qtype) < 0 || qtype != p->qtype ||
      strcmp(name, p->name))
    return;
  p->used = false;
  m[0] = (uint8_t)(p->client_id >> 8), m[1] = (uint8_t)p->client_id;
  sbx_dns_addr addrs[ANSWER_ADDRS], fresh[ANSWER_ADDRS];
  int k = sbx_dns_addresses(m, (size_t)n, addrs, ANSWER_ADDRS), nf = 0;
  if (k < 0) return refuse(f, &p->client, m, (size_t)n, 2);
  for (int i = 0; i < k; i++) /* a special-purpose address stays refused unless a CIDR lists it */
    if (!sbx_addr_special(addrs[i].family, addrs[i].addr) && !known(f, &addrs[i]) && f->nknown + nf < KNOWN_MAX)
      fresh[nf++] = addrs[i];
  if (!nf) return reply_to(f, &p->client, m, (size_t)n);
  open_then_reply(f, fresh, nf, &p->client, m, (size_t)n);
}

int sbx_dns_filter_start(sbx_sandbox *sb, sbx_error *err) {
  uv_loop_t *loop = sbx_engine_cfg()->loop;
  if (!loop) return sbx_err(err, "INTERNAL", "allowedHosts names need the daemon's loop");
  sbx_dns *f = calloc(1, sizeof *f);
  if (f) f->known = calloc(KNOWN_MAX, sizeof *f->known);
  if (!f || !f->known) {
    if (f) free(f);
    return sbx_err(err, "INTERNAL", "out of memory");
  }
  socklen_t server_len;
  if (upstream(&f->server, &server_len) < 0) {
    free(f->known);
    free(f);
    return sbx_err(err, "VALIDATION_FAILED", "allowedHosts names hosts, but the host has no resolver to ask (no "
                                             "nameserver in /etc/resolv.conf; set dnsServer in the configuration)");
  }
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(53), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  int in = sbx_netns_socket(sb, SOCK_DGRAM, (struct sockaddr *)&a, sizeof a);
  int up = socket(f->server.ss_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (in < 0 || up < 0) {
    int e = in < 0 ? -in : errno;
    if (in >= 0) close(in);
    if (up >= 0) close(up);
    free(f->known);
    free(f);
    return sbx_err_errno(err, "INTERNAL", e, "starting the resolver of sandbox '%s'", sb->id);
  }
  uv_udp_init(loop, &f->in);
  uv_udp_init(loop, &f->up);
  uv_timer_init(loop, &f->rate);
  f->in.data = f->up.data = f->rate.data = f;
  f->handles = 3;
  f->sb = sb;
  f->wait_tail = &f->waiting;
  uv_udp_open(&f->in, in);
  uv_udp_open(&f->up, up);
  uv_udp_recv_start(&f->in, alloc_cb, on_query);
  uv_udp_recv_start(&f->up, alloc_cb, on_answer);
  sb->dns = f;
  return 0;
}

void sbx_dns_filter_stop(sbx_sandbox *sb) {
  sbx_dns *f = sb->dns;
  if (!f) return;
  sb->dns = NULL;
  f->sb = NULL;
  if (f->job) sbx_pidfd_send_signal(f->job->pidfd, SIGKILL); /* it ends as usual, answering nothing */
  for (held *h = f->waiting, *next; h; h = next) {
    next = h->next;
    free(h);
  }
  f->waiting = NULL;
  f->wait_tail = &f->waiting;
  uv_close((uv_handle_t *)&f->in, handle_closed);
  uv_close((uv_handle_t *)&f->up, handle_closed);
  uv_close((uv_handle_t *)&f->rate, handle_closed);
}
